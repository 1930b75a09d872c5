//! TLS helpers: a client that accepts any certificate (the benchmark measures, it
//! does not authenticate), self-signed certificates for generated configs, and a
//! client identity (a CA and a SPIFFE client certificate) for mTLS variants.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

#[derive(Debug)]
struct AcceptAny(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAny {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A client config that accepts any server certificate, offering `alpn` and
/// presenting `identity` when the server asks for a client certificate.
/// With `resume` false every connection does a full handshake (what a
/// handshakes-per-second measurement wants).
pub fn client_config(
    alpn: &[&[u8]],
    resume: bool,
    identity: Option<&ClientIdentity>,
) -> anyhow::Result<rustls::ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAny(provider)));
    let mut cfg = match identity {
        Some(id) => builder.with_client_auth_cert(id.chain.clone(), id.key.clone_key())?,
        None => builder.with_no_client_auth(),
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    if !resume {
        cfg.resumption = rustls::client::Resumption::disabled();
    }
    Ok(cfg)
}

/// A self-signed certificate and its private key, PEM encoded.
pub struct SelfSigned {
    /// Certificate PEM.
    pub cert_pem: String,
    /// PKCS#8 private key PEM.
    pub key_pem: String,
}

/// Generates a self-signed ECDSA P-256 certificate for `names` (DNS names or IPs).
pub fn self_signed(names: &[&str]) -> anyhow::Result<SelfSigned> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let ck = rcgen::generate_simple_self_signed(names)?;
    Ok(SelfSigned {
        cert_pem: ck.cert.pem(),
        key_pem: ck.signing_key.serialize_pem(),
    })
}

/// A rustls server config from a self-signed certificate (for tests and the upstream).
pub fn server_config(cert: &SelfSigned) -> anyhow::Result<rustls::ServerConfig> {
    let certs = vec![CertificateDer::from_pem_slice(cert.cert_pem.as_bytes())?];
    let key = PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes())?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// SPIFFE identity of the generated client certificate ([`client_pki`]): moat
/// maps it to the principal `cluster.local/ns/bench/sa/loadgen`.
pub const CLIENT_SPIFFE_URI: &str = "spiffe://cluster.local/ns/bench/sa/loadgen";

/// A client certificate chain and its private key, presented when a server asks
/// for a client certificate (mTLS).
pub struct ClientIdentity {
    /// The certificate chain, leaf first.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key.
    pub key: PrivateKeyDer<'static>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

impl ClientIdentity {
    /// Reads a PEM certificate chain (leaf first) and its PEM private key
    /// (PKCS#8, PKCS#1 or SEC1) the way moat reads an upstream client
    /// certificate ([`moat_tls::load_client_identity`]: size-limited, the key
    /// checked against the certificate, errors naming the file).
    pub fn from_pem_files(cert: &Path, key: &Path) -> anyhow::Result<ClientIdentity> {
        let (chain, key) = moat_tls::load_client_identity(&moat_tls::crypto_provider(), cert, key)?;
        Ok(ClientIdentity { chain, key })
    }
}

/// What an mTLS benchmark needs, generated: the CA moat trusts for client
/// certificates and the identity the load generator presents.
#[derive(Debug)]
pub struct ClientPki {
    /// The issuing CA's certificate, PEM (moat's `client_auth.ca`).
    pub ca_pem: String,
    /// The client certificate (ECDSA P-256, EKU clientAuth, URI SAN
    /// [`CLIENT_SPIFFE_URI`]), PEM.
    pub cert_pem: String,
    /// Its PKCS#8 private key, PEM.
    pub key_pem: String,
    /// The same certificate and key, ready for a client config.
    pub identity: Arc<ClientIdentity>,
}

/// Generates a CA (ECDSA P-256) and a client certificate it signs for
/// [`CLIENT_SPIFFE_URI`], the shape of an Istio workload certificate.
pub fn client_pki() -> anyhow::Result<ClientPki> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "moat bench client CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(Vec::<String>::new())?;
    leaf.distinguished_name.push(DnType::CommonName, "loadgen");
    leaf.subject_alt_names = vec![SanType::URI(CLIENT_SPIFFE_URI.try_into()?)];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = leaf.signed_by(&key, &issuer)?;
    Ok(ClientPki {
        ca_pem: ca_cert.pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        identity: Arc::new(ClientIdentity {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        }),
    })
}
