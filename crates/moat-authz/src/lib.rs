//! Istio security policies enforced by moat, without a mesh.
//!
//! moat reads AuthorizationPolicy, RequestAuthentication and PeerAuthentication
//! (`security.istio.io/v1` and `v1beta1`) as platform teams already write them and
//! enforces them with Istio's semantics. Policies are compiled into an index
//! ([`compiled`]) so a decision costs hash and trie lookups, not a walk over every rule;
//! a plain linear evaluator ([`ir::LinearSet`]) is kept as the test oracle.
//!
//! Wiring: [`AuthzConfig`] (the `authz:` config section), [`AuthzEngine::build`], the
//! [`moat_core::RequestHeadersPhase`] implementation on [`AuthzEngine`] (which also
//! enforces PeerAuthentication per request: STRICT without a verified client certificate
//! is a 403), and [`AuthzEngine::peer_auth_mode`] to ask which mode applies.
//!
//! The engine is pure: remote JWKS (`jwksUri: http(s)://`, OpenID discovery) are fetched
//! through a [`JwksFetcher`] the caller provides (moat-proxy's HTTP(S) client in the
//! gateway and the CLI; [`NoFetch`] where nothing is fetched).

#![warn(missing_docs)]

pub mod check;
pub mod compiled;
pub mod engine;
pub mod explain;
pub mod fetch;
pub mod ir;
pub mod jwt;
pub mod loader;
mod percent;
pub mod providers;
pub mod request;

pub use engine::{AuthzConfig, AuthzEngine, ConnectionInput, DecidedBy, Decision, RequestInput};
pub use fetch::{JwksFetcher, NoFetch, MAX_DOCUMENT_BYTES};
pub use loader::{Action, MtlsMode, PolicySet};
pub use providers::ExtensionProvider;
pub use request::{HostPort, MethodOverrides, PathNormalization, PathParameters};

/// Errors building the engine.
#[derive(Debug, thiserror::Error)]
pub enum AuthzError {
    /// A policy file is invalid (`file:line:column: field: message`).
    #[error("{0}")]
    Config(#[from] moat_config::ConfigError),
    /// A JWKS could not be used.
    #[error("{policy}: JWKS: {message}")]
    Jwks {
        /// RequestAuthentication `namespace/name`.
        policy: String,
        /// What went wrong.
        message: String,
    },
    /// An `extension_providers` entry is invalid.
    #[error("{0}")]
    Provider(String),
}
