//! How remote JWKS and OpenID discovery documents reach the engine.
//!
//! The engine does no I/O of its own: fetching over HTTP(S) needs sockets, a runtime
//! and TLS, which belong to the proxy. The engine asks a [`JwksFetcher`] instead, given
//! to [`crate::AuthzEngine::build`]; moat-proxy provides the HTTP(S) implementation.
//! Inline (`jwks:`) and `file:` JWKS never call the fetcher.

use std::time::Duration;

/// Largest JWKS / discovery document accepted, in bytes.
///
/// Part of the [`JwksFetcher`] contract: a fetcher stops reading a body after this many
/// bytes and fails. The engine checks it again on what a fetcher returns.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// Fetches a JWKS or an OpenID discovery document by URL.
///
/// Called at build time and from the engine's JWKS refresh thread, so it blocks: it must
/// work from any thread, including one that runs inside an async runtime (the proxy's
/// implementation runs its I/O on a helper thread of its own).
///
/// The contract:
/// * `url` is an `http://` or `https://` URL (the loader refuses other schemes for
///   remote JWKS); a fetcher may refuse schemes it does not support, with an error.
/// * One `GET`; only status 200 is a success, any other status is an error.
/// * The whole fetch (connect, TLS, request, body) ends within `timeout`, else it fails.
/// * The body is at most [`MAX_DOCUMENT_BYTES`]: a longer body is an error, and the
///   fetcher stops reading at that size.
/// * The body is returned as UTF-8 text; the engine parses it.
/// * Errors are one line of text naming the URL; the engine logs and reports them, and
///   keeps the keys it had.
pub trait JwksFetcher: Send + Sync {
    /// Fetches `url` with a `GET` within `timeout` and returns the body.
    fn fetch(&self, url: &str, timeout: Duration) -> Result<String, String>;
}

/// A [`JwksFetcher`] that fetches nothing: for engines built where remote JWKS are never
/// fetched (inline and `file:` JWKS still work). Every fetch fails with
/// "remote JWKS are not fetched here", so tokens of a remote issuer are refused (401).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFetch;

impl JwksFetcher for NoFetch {
    fn fetch(&self, url: &str, _timeout: Duration) -> Result<String, String> {
        Err(format!("GET {url}: remote JWKS are not fetched here"))
    }
}
