//! Certificate generation and in-memory handshakes for tests and benchmarks
//! (cargo feature `testing`).
//!
//! These helpers panic on generation failures: they are for tests only.

// Test support (the `testing` feature): a certificate that cannot be generated is a
// failed test, so panicking with the reason is what a caller wants.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConnection, SignatureScheme};

use crate::{capture_signature_scheme, crypto_provider, ClientAuthConfig, ClientAuthMode};
use crate::{CertificateConfig, ServerTlsConfig, TlsVersion, DEFAULT_HANDSHAKE_TIMEOUT};

/// DNS names of the server certificate made by [`TestPki::generate`].
pub const SERVER_NAMES: [&str; 2] = ["localhost", "api.moat.test"];
/// SPIFFE URI SAN of the client certificate made by [`TestPki::generate`].
pub const CLIENT_SPIFFE_URI: &str = "spiffe://cluster.local/ns/shop/sa/frontend";

/// Key algorithm of a generated leaf certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyAlg {
    /// ECDSA P-256 with SHA-256 (the default).
    EcdsaP256,
    /// ECDSA P-384 with SHA-384.
    EcdsaP384,
    /// Ed25519.
    Ed25519,
}

impl KeyAlg {
    fn rcgen(self) -> &'static rcgen::SignatureAlgorithm {
        match self {
            KeyAlg::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyAlg::EcdsaP384 => &rcgen::PKCS_ECDSA_P384_SHA384,
            KeyAlg::Ed25519 => &rcgen::PKCS_ED25519,
        }
    }
}

/// A certificate authority (ECDSA P-256) that issues server and client certificates.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    cert: rcgen::Certificate,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl TestCa {
    /// A new self-signed CA with this common name.
    pub fn new(common_name: &str) -> Self {
        let key = KeyPair::generate().expect("generate CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).expect("self-sign CA");
        TestCa {
            issuer: Issuer::new(params, key),
            cert,
        }
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA certificate, DER.
    pub fn cert_der(&self) -> CertificateDer<'static> {
        self.cert.der().clone()
    }

    /// A root store trusting only this CA.
    pub fn root_store(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.cert_der())
            .expect("CA is a valid trust anchor");
        roots
    }

    /// A server certificate (EKU serverAuth, ECDSA P-256) for these DNS names (or IP addresses).
    pub fn server_cert(&self, dns_names: &[&str]) -> TestCert {
        self.server_cert_with(dns_names, KeyAlg::EcdsaP256)
    }

    /// A server certificate like [`server_cert`](Self::server_cert) with a key of algorithm `alg`.
    pub fn server_cert_with(&self, dns_names: &[&str], alg: KeyAlg) -> TestCert {
        self.issue(server_params(dns_names), alg)
    }

    /// A server certificate like [`server_cert`](Self::server_cert) valid until
    /// `not_after` (unix seconds): a certificate about to expire.
    pub fn server_cert_until(&self, dns_names: &[&str], not_after: i64) -> TestCert {
        let mut params = server_params(dns_names);
        params.not_after = x509_parser::time::ASN1Time::from_timestamp(not_after)
            .expect("not_after in range")
            .to_datetime();
        self.issue(params, KeyAlg::EcdsaP256)
    }

    /// A client certificate (EKU clientAuth) with this common name and, when
    /// given, a URI SAN such as `spiffe://td/ns/N/sa/S`.
    pub fn client_cert(&self, common_name: &str, uri_san: Option<&str>) -> TestCert {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "moat tests");
        if let Some(uri) = uri_san {
            params.subject_alt_names = vec![SanType::URI(uri.try_into().expect("ASCII URI"))];
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        self.issue(params, KeyAlg::EcdsaP256)
    }

    fn issue(&self, params: CertificateParams, alg: KeyAlg) -> TestCert {
        let key = KeyPair::generate_for(alg.rcgen()).expect("generate key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign cert");
        TestCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().clone(),
            key_der: key.serialize_der(),
        }
    }
}

/// A certificate and its private key.
#[derive(Debug, Clone)]
pub struct TestCert {
    /// Certificate, PEM.
    pub cert_pem: String,
    /// Private key, PKCS#8 PEM.
    pub key_pem: String,
    /// Certificate, DER.
    pub cert_der: CertificateDer<'static>,
    key_der: Vec<u8>,
}

impl TestCert {
    /// The private key, DER.
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()))
    }

    /// Writes `<stem>.crt` and `<stem>.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, stem: &str) -> io::Result<(PathBuf, PathBuf)> {
        let cert = dir.join(format!("{stem}.crt"));
        let key = dir.join(format!("{stem}.key"));
        std::fs::write(&cert, &self.cert_pem)?;
        std::fs::write(&key, &self.key_pem)?;
        Ok((cert, key))
    }
}

/// A rustls client configuration trusting `ca`, presenting `client_cert` when
/// given, offering `alpn`, limited to `versions` (empty = TLS 1.3 and 1.2).
pub fn client_config(
    ca: &TestCa,
    client_cert: Option<&TestCert>,
    alpn: &[&str],
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let versions = if versions.is_empty() {
        TlsVersion::V1_2.rustls_versions()
    } else {
        versions
    };
    let builder = ClientConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .with_root_certificates(ca.root_store());
    let mut config = match client_cert {
        Some(c) => builder
            .with_client_auth_cert(vec![c.cert_der.clone()], c.key_der())
            .expect("client cert"),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    Arc::new(config)
}

/// A ready-made PKI written to a directory: `ca.crt`, `server.crt`/`.key`
/// (for [`SERVER_NAMES`]) and `client.crt`/`.key` (URI SAN [`CLIENT_SPIFFE_URI`]).
#[derive(Debug)]
pub struct TestPki {
    /// The directory holding the files (use it as `base_dir`).
    pub dir: PathBuf,
    /// The CA.
    pub ca: TestCa,
    /// The server certificate.
    pub server: TestCert,
    /// The client certificate.
    pub client: TestCert,
}

impl TestPki {
    /// Generates the PKI and writes its files into `dir`.
    pub fn generate(dir: &Path) -> io::Result<Self> {
        let ca = TestCa::new("moat test CA");
        let server = ca.server_cert(&SERVER_NAMES);
        let client = ca.client_cert("frontend", Some(CLIENT_SPIFFE_URI));
        std::fs::write(dir.join("ca.crt"), ca.cert_pem())?;
        server.write(dir, "server")?;
        client.write(dir, "client")?;
        Ok(TestPki {
            dir: dir.to_path_buf(),
            ca,
            server,
            client,
        })
    }

    /// A [`ServerTlsConfig`] using the server certificate, with relative paths
    /// (resolve them with `base_dir = self.dir`) and the given client auth mode.
    pub fn server_tls_config(&self, mode: ClientAuthMode) -> ServerTlsConfig {
        ServerTlsConfig {
            certificates: vec![CertificateConfig {
                cert: "server.crt".into(),
                key: "server.key".into(),
                server_names: None,
            }],
            alpn: vec!["h2".into(), "http/1.1".into()],
            min_version: TlsVersion::V1_2,
            client_auth: ClientAuthConfig {
                mode,
                ca: (mode != ClientAuthMode::Disable).then(|| "ca.crt".into()),
            },
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }

    /// A client configuration trusting the CA, with or without the client certificate.
    pub fn client_config(&self, with_cert: bool, alpn: &[&str]) -> Arc<ClientConfig> {
        client_config(&self.ca, with_cert.then_some(&self.client), alpn, &[])
    }
}

/// Runs a complete handshake between two in-memory connections (no sockets),
/// returning the server's handshake signature scheme (see
/// [`capture_signature_scheme`]). `buf` is reused between calls.
pub fn handshake_in_memory(
    client: &mut ClientConnection,
    server: &mut ServerConnection,
    buf: &mut Vec<u8>,
) -> Result<Option<SignatureScheme>, rustls::Error> {
    let mut scheme = None;
    // A TLS 1.2 or 1.3 handshake needs at most a handful of flights.
    for _ in 0..16 {
        if !client.is_handshaking() && !server.is_handshaking() {
            return Ok(scheme);
        }
        transfer(
            &mut |w| client.write_tls(w),
            &mut |r| server.read_tls(r),
            buf,
        )?;
        let (res, s) = capture_signature_scheme(|| server.process_new_packets().map(|_| ()));
        res?;
        scheme = scheme.or(s);
        transfer(
            &mut |w| server.write_tls(w),
            &mut |r| client.read_tls(r),
            buf,
        )?;
        client.process_new_packets()?;
    }
    Err(rustls::Error::General("handshake did not finish".into()))
}

fn transfer(
    write: &mut dyn FnMut(&mut dyn io::Write) -> io::Result<usize>,
    read: &mut dyn FnMut(&mut dyn io::Read) -> io::Result<usize>,
    buf: &mut Vec<u8>,
) -> Result<(), rustls::Error> {
    buf.clear();
    while write(buf).map_err(|e| rustls::Error::General(e.to_string()))? > 0 {}
    let mut rd: &[u8] = buf;
    while !rd.is_empty() {
        if read(&mut rd).map_err(|e| rustls::Error::General(e.to_string()))? == 0 {
            break;
        }
    }
    Ok(())
}

/// Parameters of a server certificate (EKU serverAuth) for `dns_names`, the first
/// one as common name.
fn server_params(dns_names: &[&str]) -> CertificateParams {
    let names: Vec<String> = dns_names.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("server params");
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(
        DnType::CommonName,
        dns_names.first().copied().unwrap_or("server"),
    );
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params
}
