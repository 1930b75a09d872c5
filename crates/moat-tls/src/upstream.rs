//! TLS from the proxy to upstreams.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moat_core::HandshakeRecord;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::ServerName;
use rustls::ClientConfig;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use crate::audit::{handshake_record, CaptureSignatureScheme, RecordingVerifier, Role};
use crate::config::{alpn_bytes, resolve, UpstreamTlsConfig};
use crate::pem::{load_client_identity, load_roots};
use crate::{crypto_provider, TlsError};

/// Opens TLS connections to upstreams and verifies their certificates.
#[derive(Clone)]
pub struct UpstreamConnector {
    inner: tokio_rustls::TlsConnector,
    config: Arc<ClientConfig>,
    sni: Option<ServerName<'static>>,
    timeout: Duration,
}

impl std::fmt::Debug for UpstreamConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamConnector")
            .field("sni", &self.sni)
            .field("timeout", &self.timeout)
            .field("alpn", &self.config.alpn_protocols)
            .finish()
    }
}

impl UpstreamConnector {
    /// Loads the CA bundle (or the webpki roots) and the optional client
    /// certificate (paths relative to `base_dir`).
    pub fn new(config: &UpstreamTlsConfig, base_dir: &Path) -> Result<Self, TlsError> {
        let provider = crypto_provider();
        let roots = match &config.ca {
            Some(ca) => load_roots(&resolve(base_dir, ca))?,
            None => rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        };
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| TlsError::Config(format!("upstream CA: {e}")))?;
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(config.min_version.rustls_versions())
            .map_err(|e| TlsError::Config(format!("protocol versions: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(RecordingVerifier(webpki)));
        let mut client = match (&config.client_cert, &config.client_key) {
            (None, None) => builder.with_no_client_auth(),
            (Some(cert), Some(key)) => {
                let key_path = resolve(base_dir, key);
                let (certs, key) =
                    load_client_identity(&provider, &resolve(base_dir, cert), &key_path)?;
                builder
                    .with_client_auth_cert(certs, key)
                    .map_err(|e| TlsError::file(&key_path, format!("unusable client key: {e}")))?
            }
            _ => {
                return Err(TlsError::Config(
                    "upstream `client_cert` and `client_key` must be given together".into(),
                ))
            }
        };
        client.alpn_protocols = alpn_bytes(&config.alpn)?;
        let sni = match &config.sni {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| TlsError::ServerName(name.clone()))?,
            ),
            None => None,
        };
        let client = Arc::new(client);
        Ok(UpstreamConnector {
            inner: tokio_rustls::TlsConnector::from(client.clone()),
            config: client,
            sni,
            timeout: config.handshake_timeout,
        })
    }

    /// The rustls configuration.
    pub fn client_config(&self) -> &Arc<ClientConfig> {
        &self.config
    }

    /// Runs the handshake on `tcp`, sending and verifying `server_name`
    /// (or the configured `sni`), bounded by the handshake timeout.
    pub async fn connect(
        &self,
        tcp: TcpStream,
        server_name: &str,
    ) -> Result<(TlsStream<TcpStream>, HandshakeRecord), TlsError> {
        let name = match &self.sni {
            Some(n) => n.clone(),
            None => ServerName::try_from(server_name.to_string())
                .map_err(|_| TlsError::ServerName(server_name.to_string()))?,
        };
        let sni = name.to_str().into_owned();
        let peer_addr = tcp.peer_addr().ok();
        let started = Instant::now();
        let handshake = CaptureSignatureScheme::new(self.inner.connect(name, tcp));
        let (result, signature) = tokio::time::timeout(self.timeout, handshake)
            .await
            .map_err(|_| TlsError::Timeout(self.timeout))?;
        let stream = result.map_err(TlsError::Handshake)?;
        let record = {
            let (_, conn) = stream.get_ref();
            handshake_record(
                conn,
                Role::Client,
                Some(&sni),
                signature,
                started.elapsed(),
                peer_addr,
            )
        };
        Ok((stream, record))
    }
}
