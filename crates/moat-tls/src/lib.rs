//! TLS for moat: termination with SNI and client identity, upstream TLS, and
//! handshake audit records.
//!
//! Identity and TLS live in their own crate (as in linkerd2-proxy): the proxy
//! hands a [`tokio::net::TcpStream`] to [`TlsAcceptor::accept`] and gets back
//! either a TLS stream with its [`moat_core::TlsSession`] and
//! [`moat_core::HandshakeRecord`], or (in `PERMISSIVE` mode only) the untouched
//! plaintext socket.
//!
//! * [`ServerTlsConfig`] / [`TlsAcceptor`]: certificates selected by SNI,
//!   ALPN, minimum version, Istio-style client authentication modes
//!   (`STRICT`, `PERMISSIVE`, `DISABLE`) and a handshake timeout.
//! * [`UpstreamTlsConfig`] / [`UpstreamConnector`]: TLS (and mTLS) to upstreams.
//! * [`handshake_record`], [`audit_labels`]: crypto parameters of a handshake in
//!   the crypto-auditing vocabulary (IANA code points), reusable for any rustls
//!   connection.
//! * `testing` (cargo feature `testing`): certificate generation for tests.
//!
//! Only the `ring` crypto provider is used.

#![deny(missing_docs)]

mod acceptor;
mod audit;
mod config;
mod error;
mod identity;
mod pem;
mod stream;
mod upstream;

#[cfg(feature = "testing")]
pub mod testing;

pub use acceptor::{Accepted, TlsAcceptor};
pub use audit::{
    audit_labels, capture_signature_scheme, cipher_suite_name, group_code, group_name,
    handshake_record, signature_scheme_code, signature_scheme_name, version_name,
    CaptureSignatureScheme, Role,
};
pub use config::{
    CertificateConfig, ClientAuthConfig, ClientAuthMode, ServerTlsConfig, TlsVersion,
    UpstreamTlsConfig, DEFAULT_HANDSHAKE_TIMEOUT,
};
pub use error::TlsError;
pub use identity::{peer_identity, peer_summary};
pub use pem::{load_client_identity, MAX_PEM_FILE_BYTES};
pub use stream::MaybeTls;
pub use upstream::UpstreamConnector;

/// Re-exported so users name the same rustls and tokio-rustls versions as this crate.
pub use rustls;
/// Re-exported so users name the same tokio-rustls version as this crate.
pub use tokio_rustls;

/// The crypto provider used everywhere in this crate (ring).
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::ring::default_provider())
}
