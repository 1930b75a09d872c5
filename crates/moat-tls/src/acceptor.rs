//! Downstream TLS termination.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moat_core::{HandshakeRecord, TlsSession};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::audit::{record_with_peer, CaptureSignatureScheme, RecordingKey, Role};
use crate::config::{alpn_bytes, resolve, ClientAuthMode, ServerTlsConfig};
use crate::identity::{dns_sans, CertInfo};
use crate::pem::{load_certified_key, load_roots};
use crate::{crypto_provider, version_name, TlsError};

/// First byte of a TLS record carrying a handshake message (a ClientHello).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Result of [`TlsAcceptor::accept`].
///
/// Returned once per connection and destructured at once, so the size
/// difference between the variants costs one move, not an allocation.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Accepted {
    /// A completed TLS handshake.
    Tls {
        /// The decrypted stream.
        stream: TlsStream<TcpStream>,
        /// What the handshake established (SNI, ALPN, version, cipher, verified client identity).
        session: TlsSession,
        /// Audit record of the handshake (`role = "server"`).
        handshake: HandshakeRecord,
    },
    /// A plaintext connection (`PERMISSIVE` mode only); no byte has been consumed.
    Plain(TcpStream),
}

/// Terminates TLS on accepted sockets; cheap to share (`Arc` inside the rustls config).
#[derive(Clone)]
pub struct TlsAcceptor {
    inner: tokio_rustls::TlsAcceptor,
    config: Arc<ServerConfig>,
    /// The certificates by SNI, also read after a handshake for the one it served.
    resolver: Arc<SniResolver>,
    mode: ClientAuthMode,
    timeout: Duration,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor")
            .field("mode", &self.mode)
            .field("timeout", &self.timeout)
            .field("alpn", &self.config.alpn_protocols)
            .finish()
    }
}

impl TlsAcceptor {
    /// Loads certificates, keys and the client CA (paths relative to `base_dir`).
    pub fn new(config: &ServerTlsConfig, base_dir: &Path) -> Result<Self, TlsError> {
        let (server_config, resolver) = build_server_config(config, base_dir)?;
        let server_config = Arc::new(server_config);
        Ok(TlsAcceptor {
            inner: tokio_rustls::TlsAcceptor::from(server_config.clone()),
            config: server_config,
            resolver,
            mode: config.client_auth.mode,
            timeout: config.handshake_timeout,
        })
    }

    /// The rustls configuration (e.g. for in-memory handshakes in benchmarks).
    pub fn server_config(&self) -> &Arc<ServerConfig> {
        &self.config
    }

    /// The client authentication mode.
    pub fn mode(&self) -> ClientAuthMode {
        self.mode
    }

    /// Runs the handshake on `tcp`, bounded by the handshake timeout.
    ///
    /// In `PERMISSIVE` mode the first byte is peeked (not consumed): anything
    /// but a TLS handshake record (0x16) returns [`Accepted::Plain`]. In
    /// `STRICT` and `DISABLE` modes a plaintext client fails the handshake.
    pub async fn accept(&self, tcp: TcpStream) -> Result<Accepted, TlsError> {
        let started = Instant::now();
        match tokio::time::timeout(self.timeout, self.accept_inner(tcp, started)).await {
            Ok(result) => result,
            Err(_) => Err(TlsError::Timeout(self.timeout)),
        }
    }

    async fn accept_inner(&self, tcp: TcpStream, started: Instant) -> Result<Accepted, TlsError> {
        let peer_addr = tcp.peer_addr().ok();
        if self.mode == ClientAuthMode::Permissive {
            let mut first = [0u8; 1];
            if tcp.peek(&mut first).await? == 0 {
                return Err(TlsError::Closed);
            }
            if first[0] != TLS_HANDSHAKE_RECORD {
                return Ok(Accepted::Plain(tcp));
            }
        }
        let (result, signature) = CaptureSignatureScheme::new(self.inner.accept(tcp)).await;
        let stream = result.map_err(TlsError::Handshake)?;
        let (session, mut handshake) = describe(&stream, signature, started.elapsed(), peer_addr);
        if !handshake.resumed {
            // The resolver picks by SNI alone, so asking it again names the
            // certificate it served.
            handshake.certificate = self
                .resolver
                .pick(handshake.sni.as_deref())
                .map(|served| served.summary.clone());
        }
        Ok(Accepted::Tls {
            stream,
            session,
            handshake,
        })
    }
}

fn describe(
    stream: &TlsStream<TcpStream>,
    signature: Option<rustls::SignatureScheme>,
    elapsed: Duration,
    peer_addr: Option<SocketAddr>,
) -> (TlsSession, HandshakeRecord) {
    let (_, conn) = stream.get_ref();
    let info = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|der| CertInfo::parse(der));
    let sni = conn.server_name();
    let record = record_with_peer(
        conn,
        Role::Server,
        sni,
        signature,
        elapsed,
        peer_addr,
        info.as_ref().map(CertInfo::to_summary),
    );
    let session = TlsSession {
        sni: record.sni.clone(),
        alpn: record.alpn.clone(),
        version: version_name(record.protocol_version).to_string(),
        cipher_suite: record.ciphersuite_name.clone(),
        peer: info.as_ref().map(CertInfo::to_identity),
    };
    (session, record)
}

/// Builds the rustls server configuration described by `config`, and its certificate
/// resolver.
fn build_server_config(
    config: &ServerTlsConfig,
    base_dir: &Path,
) -> Result<(ServerConfig, Arc<SniResolver>), TlsError> {
    if config.certificates.is_empty() {
        return Err(TlsError::Config(
            "`certificates` must list at least one certificate".into(),
        ));
    }
    let provider = crypto_provider();
    let mut resolver = SniResolver::default();
    for (i, c) in config.certificates.iter().enumerate() {
        let cert_path = resolve(base_dir, &c.cert);
        let key_path = resolve(base_dir, &c.key);
        let ck = load_certified_key(&provider, &cert_path, &key_path, |k| {
            Arc::new(RecordingKey(k))
        })?;
        let names = match &c.server_names {
            Some(names) => names.clone(),
            None => ck.cert.first().map(|d| dns_sans(d)).unwrap_or_default(),
        };
        let summary = ck
            .cert
            .first()
            .map(|d| CertInfo::parse(d).to_summary())
            .unwrap_or_default();
        let ck = Arc::new(Served {
            key: Arc::new(ck),
            summary,
        });
        if i == 0 {
            resolver.default = Some(ck.clone());
        }
        for name in names {
            let name = normalize_name(&name);
            if name.is_empty() {
                return Err(TlsError::Config(format!(
                    "certificates[{i}]: empty server name"
                )));
            }
            // The first certificate listing a name serves it.
            resolver.by_name.entry(name).or_insert_with(|| ck.clone());
        }
    }

    let verifier = match config.client_auth.mode {
        ClientAuthMode::Disable => WebPkiClientVerifier::no_client_auth(),
        mode => {
            let Some(ca) = &config.client_auth.ca else {
                return Err(TlsError::Config(format!(
                    "client_auth.ca is required with mode {}",
                    if mode == ClientAuthMode::Strict {
                        "STRICT"
                    } else {
                        "PERMISSIVE"
                    }
                )));
            };
            let ca_path = resolve(base_dir, ca);
            let roots = Arc::new(load_roots(&ca_path)?);
            let builder = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            let builder = if mode == ClientAuthMode::Permissive {
                builder.allow_unauthenticated()
            } else {
                builder
            };
            builder
                .build()
                .map_err(|e| TlsError::file(&ca_path, format!("unusable client CA bundle: {e}")))?
        }
    };

    let resolver = Arc::new(resolver);
    let mut server = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(config.min_version.rustls_versions())
        .map_err(|e| TlsError::Config(format!("protocol versions: {e}")))?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(resolver.clone());
    server.alpn_protocols = alpn_bytes(&config.alpn)?;
    Ok((server, resolver))
}

fn normalize_name(name: &str) -> String {
    name.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// A listener certificate and its audit summary (made once, at load).
#[derive(Debug)]
struct Served {
    key: Arc<CertifiedKey>,
    summary: moat_core::PeerIdentitySummary,
}

/// Picks the certificate by SNI: exact name, then `*.parent` wildcard, then the default.
#[derive(Debug, Default)]
struct SniResolver {
    by_name: HashMap<String, Arc<Served>>,
    default: Option<Arc<Served>>,
}

impl SniResolver {
    /// The certificate for a (lowercase) SNI, or for none.
    fn pick(&self, sni: Option<&str>) -> Option<&Arc<Served>> {
        sni.and_then(|sni| self.lookup(sni.trim_end_matches('.')))
            .or(self.default.as_ref())
    }

    fn lookup(&self, sni: &str) -> Option<&Arc<Served>> {
        if let Some(ck) = self.by_name.get(sni) {
            return Some(ck);
        }
        let dot = sni.find('.')?;
        let mut wildcard = String::with_capacity(sni.len() - dot + 1);
        wildcard.push('*');
        wildcard.push_str(&sni[dot..]);
        self.by_name.get(&wildcard)
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // rustls hands over the SNI lowercased.
        self.pick(hello.server_name()).map(|s| s.key.clone())
    }
}
