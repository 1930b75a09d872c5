//! Handshake audit records in the crypto-auditing vocabulary.
//!
//! The record carries IANA code points where crypto-auditing uses them
//! (`tls::protocol_version`, `tls::ciphersuite`) and names for the group and
//! signature scheme (the [`HandshakeRecord`] fields are strings there);
//! [`group_code`] and [`signature_scheme_code`] map those names back to the
//! IANA code points of `tls::group` and `tls::signature_algorithm`.

use std::cell::Cell;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use moat_core::HandshakeRecord;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::sign::{Signer, SigningKey};
use rustls::{
    CommonState, DigitallySignedStruct, HandshakeKind, SignatureAlgorithm, SignatureScheme,
};

use crate::identity::CertInfo;

/// Our side of a handshake: crypto-auditing `tls::role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// We accepted the connection (downstream; crypto-auditing `tls::handshake_server`).
    Server,
    /// We opened the connection (upstream; `tls::handshake_client`).
    Client,
}

impl Role {
    /// `"server"` or `"client"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Client => "client",
        }
    }
}

/// Builds the audit record of a completed handshake from any rustls
/// connection (`ServerConnection` and `ClientConnection` deref to [`CommonState`]).
///
/// * `sni`: the server name (from `ServerConnection::server_name()` or the name we connected to);
/// * `signature`: the scheme of the handshake signature that authenticated the
///   server, as captured by [`capture_signature_scheme`] (`None` on resumption);
/// * `peer` is the summary of the certificate the other side presented
///   (client certificate when we are the server, server certificate when we are the client).
pub fn handshake_record(
    conn: &CommonState,
    role: Role,
    sni: Option<&str>,
    signature: Option<SignatureScheme>,
    elapsed: Duration,
    peer_addr: Option<SocketAddr>,
) -> HandshakeRecord {
    let peer = conn
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|der| CertInfo::parse(der).to_summary());
    record_with_peer(conn, role, sni, signature, elapsed, peer_addr, peer)
}

pub(crate) fn record_with_peer(
    conn: &CommonState,
    role: Role,
    sni: Option<&str>,
    signature: Option<SignatureScheme>,
    elapsed: Duration,
    peer_addr: Option<SocketAddr>,
    peer: Option<moat_core::PeerIdentitySummary>,
) -> HandshakeRecord {
    let suite = conn.negotiated_cipher_suite().map(|s| s.suite());
    HandshakeRecord {
        role: role.as_str(),
        protocol_version: conn.protocol_version().map(u16::from).unwrap_or(0),
        ciphersuite: suite.map(u16::from).unwrap_or(0),
        ciphersuite_name: suite
            .map(|s| cipher_suite_name(u16::from(s)).to_string())
            .unwrap_or_default(),
        key_exchange_group: conn
            .negotiated_key_exchange_group()
            .map(|g| group_name(u16::from(g.name())).to_string()),
        signature_algorithm: signature.map(|s| signature_scheme_name(u16::from(s)).to_string()),
        alpn: conn
            .alpn_protocol()
            .map(|p| String::from_utf8_lossy(p).into_owned()),
        sni: sni.map(str::to_string),
        resumed: matches!(conn.handshake_kind(), Some(HandshakeKind::Resumed)),
        peer,
        // The acceptor knows which certificate it served; a bare connection does not.
        certificate: None,
        handshake_us: u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
        peer_addr,
    }
}

/// Bounded-cardinality metric labels: `(version, cipher suite, key exchange group)`,
/// e.g. `("TLSv1.3", "TLS_AES_256_GCM_SHA384", "X25519")`. Unknown values give
/// `"other"`, a missing group gives `"none"`.
pub fn audit_labels(record: &HandshakeRecord) -> (&'static str, &'static str, &'static str) {
    let group = match record.key_exchange_group.as_deref() {
        None => "none",
        Some(name) => group_code(name).map(group_name).unwrap_or("other"),
    };
    (
        version_name(record.protocol_version),
        cipher_suite_name(record.ciphersuite),
        group,
    )
}

/// `TLSv1.2`, `TLSv1.3` (also 1.0/1.1 for completeness), else `"other"`.
pub fn version_name(code: u16) -> &'static str {
    match code {
        0x0304 => "TLSv1.3",
        0x0303 => "TLSv1.2",
        0x0302 => "TLSv1.1",
        0x0301 => "TLSv1.0",
        _ => "other",
    }
}

/// IANA name of a cipher suite code point (the suites rustls implements), else `"other"`.
pub fn cipher_suite_name(code: u16) -> &'static str {
    match code {
        0x1301 => "TLS_AES_128_GCM_SHA256",
        0x1302 => "TLS_AES_256_GCM_SHA384",
        0x1303 => "TLS_CHACHA20_POLY1305_SHA256",
        0xC02B => "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        0xC02C => "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        0xC02F => "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        0xC030 => "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        0xCCA8 => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        0xCCA9 => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        _ => "other",
    }
}

const GROUPS: &[(u16, &str)] = &[
    (0x0017, "secp256r1"),
    (0x0018, "secp384r1"),
    (0x0019, "secp521r1"),
    (0x001D, "X25519"),
    (0x001E, "X448"),
    (0x0100, "ffdhe2048"),
    (0x0101, "ffdhe3072"),
    (0x0102, "ffdhe4096"),
    (0x0200, "MLKEM512"),
    (0x0201, "MLKEM768"),
    (0x0202, "MLKEM1024"),
    (0x11EB, "secp256r1MLKEM768"),
    (0x11EC, "X25519MLKEM768"),
    (0x11ED, "secp384r1MLKEM1024"),
];

/// Name of a `tls::group` code point (`X25519`, `secp256r1`, `X25519MLKEM768`, ...), else `"other"`.
pub fn group_name(code: u16) -> &'static str {
    GROUPS
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| *n)
        .unwrap_or("other")
}

/// IANA code point (`tls::group`) of a group name produced by [`group_name`].
pub fn group_code(name: &str) -> Option<u16> {
    GROUPS.iter().find(|(_, n)| *n == name).map(|(c, _)| *c)
}

const SIGNATURE_SCHEMES: &[(u16, &str)] = &[
    (0x0201, "rsa_pkcs1_sha1"),
    (0x0203, "ecdsa_sha1"),
    (0x0401, "rsa_pkcs1_sha256"),
    (0x0403, "ecdsa_secp256r1_sha256"),
    (0x0501, "rsa_pkcs1_sha384"),
    (0x0503, "ecdsa_secp384r1_sha384"),
    (0x0601, "rsa_pkcs1_sha512"),
    (0x0603, "ecdsa_secp521r1_sha512"),
    (0x0804, "rsa_pss_rsae_sha256"),
    (0x0805, "rsa_pss_rsae_sha384"),
    (0x0806, "rsa_pss_rsae_sha512"),
    (0x0807, "ed25519"),
    (0x0808, "ed448"),
    (0x0809, "rsa_pss_pss_sha256"),
    (0x080A, "rsa_pss_pss_sha384"),
    (0x080B, "rsa_pss_pss_sha512"),
    (0x0904, "mldsa44"),
    (0x0905, "mldsa65"),
    (0x0906, "mldsa87"),
];

/// IANA name of a `tls::signature_algorithm` (SignatureScheme) code point, else `"other"`.
pub fn signature_scheme_name(code: u16) -> &'static str {
    SIGNATURE_SCHEMES
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, n)| *n)
        .unwrap_or("other")
}

/// IANA code point of a signature scheme name produced by [`signature_scheme_name`].
pub fn signature_scheme_code(name: &str) -> Option<u16> {
    SIGNATURE_SCHEMES
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(c, _)| *c)
}

thread_local! {
    static CAPTURED: Cell<Option<SignatureScheme>> = const { Cell::new(None) };
}

fn record_scheme(scheme: SignatureScheme) {
    CAPTURED.with(|c| c.set(Some(scheme)));
}

/// Runs `f` (a call that advances a rustls handshake, e.g.
/// `process_new_packets`) and returns the handshake signature scheme used
/// during it, if any: the scheme our server key signed with (keys loaded by
/// this crate are wrapped to report it) or the scheme of the server signature
/// our upstream verifier checked.
///
/// rustls signs and verifies synchronously inside the call, on this thread,
/// so a thread-local slot scoped to the call attributes it to the right connection.
pub fn capture_signature_scheme<R>(f: impl FnOnce() -> R) -> (R, Option<SignatureScheme>) {
    let outer = CAPTURED.with(|c| c.replace(None));
    let out = f();
    let got = CAPTURED.with(|c| c.replace(outer));
    (out, got)
}

/// Future adapter applying [`capture_signature_scheme`] to every poll of a
/// handshake future (e.g. `tokio_rustls::Accept`), yielding its output and
/// the last captured scheme.
#[derive(Debug)]
pub struct CaptureSignatureScheme<F> {
    inner: F,
    scheme: Option<SignatureScheme>,
}

impl<F> CaptureSignatureScheme<F> {
    /// Wraps a handshake future.
    pub fn new(inner: F) -> Self {
        CaptureSignatureScheme {
            inner,
            scheme: None,
        }
    }
}

impl<F: Future + Unpin> Future for CaptureSignatureScheme<F> {
    type Output = (F::Output, Option<SignatureScheme>);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (poll, scheme) = capture_signature_scheme(|| Pin::new(&mut this.inner).poll(cx));
        if scheme.is_some() {
            this.scheme = scheme;
        }
        poll.map(|out| (out, this.scheme))
    }
}

/// A server signing key that reports the scheme of each signature it makes.
#[derive(Debug)]
pub(crate) struct RecordingKey(pub Arc<dyn SigningKey>);

impl SigningKey for RecordingKey {
    fn choose_scheme(&self, offered: &[SignatureScheme]) -> Option<Box<dyn Signer>> {
        self.0
            .choose_scheme(offered)
            .map(|s| Box::new(RecordingSigner(s)) as Box<dyn Signer>)
    }

    fn public_key(&self) -> Option<SubjectPublicKeyInfoDer<'_>> {
        self.0.public_key()
    }

    fn algorithm(&self) -> SignatureAlgorithm {
        self.0.algorithm()
    }
}

#[derive(Debug)]
struct RecordingSigner(Box<dyn Signer>);

impl Signer for RecordingSigner {
    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, rustls::Error> {
        let sig = self.0.sign(message)?;
        record_scheme(self.0.scheme());
        Ok(sig)
    }

    fn scheme(&self) -> SignatureScheme {
        self.0.scheme()
    }
}

/// A server certificate verifier that reports the scheme of the handshake
/// signature it verified; everything else is delegated.
#[derive(Debug)]
pub(crate) struct RecordingVerifier(pub Arc<dyn ServerCertVerifier>);

impl ServerCertVerifier for RecordingVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let ok = self.0.verify_tls12_signature(message, cert, dss)?;
        record_scheme(dss.scheme);
        Ok(ok)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let ok = self.0.verify_tls13_signature(message, cert, dss)?;
        record_scheme(dss.scheme);
        Ok(ok)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        self.0.requires_raw_public_keys()
    }

    fn root_hint_subjects(&self) -> Option<&[rustls::DistinguishedName]> {
        self.0.root_hint_subjects()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for (code, name) in GROUPS {
            assert_eq!(group_name(*code), *name);
            assert_eq!(group_code(name), Some(*code));
        }
        for (code, name) in SIGNATURE_SCHEMES {
            assert_eq!(signature_scheme_name(*code), *name);
            assert_eq!(signature_scheme_code(name), Some(*code));
        }
        assert_eq!(group_name(0xFFFF), "other");
        assert_eq!(cipher_suite_name(0x1302), "TLS_AES_256_GCM_SHA384");
        assert_eq!(version_name(0x0304), "TLSv1.3");
        assert_eq!(version_name(7), "other");
    }

    #[test]
    fn labels_are_bounded() {
        let mut r = HandshakeRecord {
            protocol_version: 0x0303,
            ciphersuite: 0xC02F,
            key_exchange_group: Some("X25519".into()),
            ..HandshakeRecord::default()
        };
        assert_eq!(
            audit_labels(&r),
            ("TLSv1.2", "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "X25519")
        );
        r.key_exchange_group = Some("made-up".into());
        r.ciphersuite = 0x0001;
        assert_eq!(audit_labels(&r), ("TLSv1.2", "other", "other"));
        r.key_exchange_group = None;
        assert_eq!(audit_labels(&r).2, "none");
    }

    #[test]
    fn capture_is_scoped_and_nests() {
        let ((), outer) = capture_signature_scheme(|| {
            record_scheme(SignatureScheme::ED25519);
            let ((), inner) =
                capture_signature_scheme(|| record_scheme(SignatureScheme::ECDSA_NISTP256_SHA256));
            assert_eq!(inner, Some(SignatureScheme::ECDSA_NISTP256_SHA256));
        });
        assert_eq!(outer, Some(SignatureScheme::ED25519));
        let ((), none) = capture_signature_scheme(|| ());
        assert_eq!(none, None);
    }
}
