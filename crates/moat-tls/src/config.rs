//! Configuration of downstream (server) and upstream (client) TLS.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Default handshake timeout (10 s), covering plaintext detection and the TLS handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn default_alpn() -> Vec<String> {
    vec!["h2".to_string(), "http/1.1".to_string()]
}

fn default_timeout() -> Duration {
    DEFAULT_HANDSHAKE_TIMEOUT
}

/// TLS termination settings of a listener.
///
/// ```yaml
/// certificates:
///   - cert: certs/api.crt
///     key: certs/api.key
///     server_names: [api.example.com]   # optional; default: the cert's DNS SANs
/// alpn: [h2, http/1.1]
/// min_version: "1.2"
/// client_auth: { mode: STRICT, ca: certs/mesh-ca.crt }
/// handshake_timeout: 10s
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsConfig {
    /// Certificates, selected by SNI; the first one is the default.
    pub certificates: Vec<CertificateConfig>,
    /// ALPN protocols offered, in preference order.
    #[serde(default = "default_alpn")]
    pub alpn: Vec<String>,
    /// Lowest accepted protocol version.
    #[serde(default)]
    pub min_version: TlsVersion,
    /// Client certificate authentication.
    #[serde(default)]
    pub client_auth: ClientAuthConfig,
    /// Maximum time from accepting the socket to a completed handshake.
    #[serde(default = "default_timeout", with = "moat_config::duration")]
    pub handshake_timeout: Duration,
}

/// One certificate chain and its private key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CertificateConfig {
    /// PEM file: leaf certificate first, then intermediates.
    pub cert: PathBuf,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// SNI names served with this certificate (`*.example.com` allowed).
    /// Default: the certificate's DNS subject alternative names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_names: Option<Vec<String>>,
}

/// Client certificate authentication (Istio `PeerAuthentication` modes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientAuthConfig {
    /// The mode; default `DISABLE`.
    #[serde(default)]
    pub mode: ClientAuthMode,
    /// PEM bundle of CAs that client certificates must chain to
    /// (required for `STRICT` and `PERMISSIVE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
}

/// Istio `PeerAuthentication` mTLS modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ClientAuthMode {
    /// TLS only; a client certificate signed by the CA is required.
    #[serde(rename = "STRICT")]
    Strict,
    /// TLS with an optional client certificate (verified when presented),
    /// and plaintext connections on the same port.
    #[serde(rename = "PERMISSIVE")]
    Permissive,
    /// TLS only; no client certificate is requested.
    #[default]
    #[serde(rename = "DISABLE")]
    Disable,
}

/// A TLS protocol version; written `"1.2"` or `"1.3"` (also `TLSv1.2`, or an unquoted `1.2`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    #[default]
    V1_2,
    /// TLS 1.3.
    V1_3,
}

impl TlsVersion {
    /// `"1.2"` or `"1.3"`.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsVersion::V1_2 => "1.2",
            TlsVersion::V1_3 => "1.3",
        }
    }

    /// rustls protocol versions at or above this one.
    pub(crate) fn rustls_versions(self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static BOTH: [&rustls::SupportedProtocolVersion; 2] =
            [&rustls::version::TLS13, &rustls::version::TLS12];
        static ONLY13: [&rustls::SupportedProtocolVersion; 1] = [&rustls::version::TLS13];
        match self {
            TlsVersion::V1_2 => &BOTH,
            TlsVersion::V1_3 => &ONLY13,
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s.trim() {
            "1.2" | "TLSv1.2" | "TLS1.2" | "tls1.2" => Some(TlsVersion::V1_2),
            "1.3" | "TLSv1.3" | "TLS1.3" | "tls1.3" => Some(TlsVersion::V1_3),
            _ => None,
        }
    }
}

impl fmt::Display for TlsVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TlsVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TlsVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = TlsVersion;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a TLS version: \"1.2\" or \"1.3\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TlsVersion, E> {
                TlsVersion::parse(v).ok_or_else(|| {
                    E::custom(format!(
                        "unsupported TLS version `{v}` (expected \"1.2\" or \"1.3\")"
                    ))
                })
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<TlsVersion, E> {
                if v == 1.2 {
                    Ok(TlsVersion::V1_2)
                } else if v == 1.3 {
                    Ok(TlsVersion::V1_3)
                } else {
                    Err(E::custom(format!(
                        "unsupported TLS version `{v}` (expected \"1.2\" or \"1.3\")"
                    )))
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// TLS from the proxy to an upstream.
///
/// ```yaml
/// ca: certs/upstream-ca.crt      # optional; default: the webpki (Mozilla) roots
/// sni: backend.internal          # optional; default: the name passed to connect()
/// client_cert: certs/proxy.crt   # optional, with client_key: mTLS to the upstream
/// client_key: certs/proxy.key
/// alpn: [http/1.1]               # default: none offered
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsConfig {
    /// PEM bundle of trusted CAs; default: the webpki (Mozilla) root set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<PathBuf>,
    /// Server name sent and verified instead of the one given to `connect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Client certificate chain for mTLS to the upstream (needs `client_key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert: Option<PathBuf>,
    /// Private key of `client_cert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_key: Option<PathBuf>,
    /// ALPN protocols offered to the upstream; default none.
    #[serde(default)]
    pub alpn: Vec<String>,
    /// Lowest accepted protocol version.
    #[serde(default)]
    pub min_version: TlsVersion,
    /// Maximum duration of the upstream handshake.
    #[serde(default = "default_timeout", with = "moat_config::duration")]
    pub handshake_timeout: Duration,
}

impl Default for UpstreamTlsConfig {
    fn default() -> Self {
        UpstreamTlsConfig {
            ca: None,
            sni: None,
            client_cert: None,
            client_key: None,
            alpn: Vec::new(),
            min_version: TlsVersion::V1_2,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// Resolves `p` against `base` unless it is absolute.
pub(crate) fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}

pub(crate) fn alpn_bytes(alpn: &[String]) -> Result<Vec<Vec<u8>>, crate::TlsError> {
    alpn.iter()
        .map(|p| {
            if p.is_empty() || p.len() > 255 {
                Err(crate::TlsError::Config(format!(
                    "ALPN protocol `{p}` must be 1 to 255 bytes long"
                )))
            } else {
                Ok(p.as_bytes().to_vec())
            }
        })
        .collect()
}
