//! Errors of this crate.

use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while loading TLS material or running a handshake.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA file could not be used; the message says why.
    #[error("{}: {message}", path.display())]
    File {
        /// The offending file (as resolved against the base directory).
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The configuration is inconsistent (e.g. no certificates, `STRICT` without a CA).
    #[error("TLS configuration: {0}")]
    Config(String),
    /// The handshake (including the plaintext/TLS detection) did not finish in time.
    #[error("TLS handshake timed out after {0:?}")]
    Timeout(Duration),
    /// The peer closed the connection before sending a single byte.
    #[error("connection closed before the TLS handshake started")]
    Closed,
    /// The TLS handshake failed: protocol error, rejected or missing certificate, etc.
    #[error("TLS handshake failed: {0}")]
    Handshake(#[source] std::io::Error),
    /// The upstream server name is neither a DNS name nor an IP address.
    #[error("invalid upstream server name `{0}`")]
    ServerName(String),
    /// A socket error outside the handshake proper (e.g. while peeking the first byte).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl TlsError {
    pub(crate) fn file(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        TlsError::File {
            path: path.into(),
            message: message.into(),
        }
    }
}
