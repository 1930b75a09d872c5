//! The HTTP(S) client that fetches remote JWKS and OpenID discovery documents for the
//! authorization engine ([`moat_authz::JwksFetcher`]): one HTTP/1.1 `GET`, rustls with
//! the webpki roots (or the roots given), a timeout and [`MAX_DOCUMENT_BYTES`].
//!
//! Uses no other module of this crate.

use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use moat_authz::{JwksFetcher, MAX_DOCUMENT_BYTES};

/// Fetches JWKS over `http://` and `https://` (certificates verified against the webpki
/// roots by default). Blocking, from any thread: each fetch runs on a helper thread with
/// its own single-threaded tokio runtime, so it also works inside the gateway's runtime.
#[derive(Debug, Clone)]
pub struct HttpJwksFetcher {
    roots: Arc<rustls::RootCertStore>,
}

impl Default for HttpJwksFetcher {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpJwksFetcher {
    /// A fetcher that trusts the webpki (Mozilla) roots for `https://`.
    pub fn new() -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        Self::with_roots(roots)
    }

    /// A fetcher that trusts only `roots` for `https://` (a private CA).
    pub fn with_roots(roots: rustls::RootCertStore) -> Self {
        HttpJwksFetcher {
            roots: Arc::new(roots),
        }
    }

    /// The fetcher as the engine takes it.
    pub fn shared() -> Arc<dyn JwksFetcher> {
        Arc::new(Self::new())
    }

    /// Fetches `url` with a GET and returns the body (status must be 200).
    async fn fetch_async(&self, url: &str, timeout: Duration) -> Result<String, String> {
        tokio::time::timeout(timeout, self.fetch_inner(url))
            .await
            .map_err(|_| format!("GET {url}: timed out after {timeout:?}"))?
    }

    async fn fetch_inner(&self, url: &str) -> Result<String, String> {
        let uri: http::Uri = url
            .parse()
            .map_err(|e| format!("invalid URL `{url}`: {e}"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => return Err(format!("unsupported URL scheme in `{url}` (http or https)")),
        };
        let host = uri
            .host()
            .ok_or_else(|| format!("URL `{url}` has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| format!("GET {url}: connect: {e}"))?;
        let authority = uri
            .authority()
            .map(|a| a.as_str().to_string())
            .unwrap_or_else(|| host.clone());
        let path = uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        let req = http::Request::get(path)
            .header(http::header::HOST, authority)
            .header(http::header::USER_AGENT, "moat")
            .header(http::header::ACCEPT, "application/json")
            .body(Empty::<bytes::Bytes>::new())
            .map_err(|e| format!("GET {url}: {e}"))?;
        if https {
            let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?
            .with_root_certificates(self.roots.clone())
            .with_no_client_auth();
            let name = rustls_pki_types::ServerName::try_from(host.clone())
                .map_err(|e| format!("GET {url}: bad server name: {e}"))?;
            let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
                .connect(name, tcp)
                .await
                .map_err(|e| format!("GET {url}: TLS: {e}"))?;
            send(url, TokioIo::new(tls), req).await
        } else {
            send(url, TokioIo::new(tcp), req).await
        }
    }
}

async fn send<IO>(
    url: &str,
    io: IO,
    req: http::Request<Empty<bytes::Bytes>>,
) -> Result<String, String>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if resp.status() != http::StatusCode::OK {
        return Err(format!("GET {url}: status {}", resp.status()));
    }
    let body = Limited::new(resp.into_body(), MAX_DOCUMENT_BYTES)
        .collect()
        .await
        .map_err(|e| format!("GET {url}: body: {e}"))?
        .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| format!("GET {url}: body is not UTF-8"))
}

impl JwksFetcher for HttpJwksFetcher {
    /// Runs on a helper thread with its own single-threaded runtime, so it works from
    /// any context (inside or outside a tokio runtime).
    fn fetch(&self, url: &str, timeout: Duration) -> Result<String, String> {
        std::thread::scope(|s| {
            s.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("runtime: {e}"))?;
                rt.block_on(self.fetch_async(url, timeout))
            })
            .join()
            .unwrap_or_else(|_| Err("JWKS fetch thread panicked".into()))
        })
    }
}
