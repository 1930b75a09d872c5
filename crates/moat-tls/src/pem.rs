//! Reading PEM certificates and keys with errors that name the file.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::sign::{CertifiedKey, SigningKey};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// Largest certificate, key or CA bundle file accepted (1 MiB).
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;

/// Reads a whole PEM file, refusing anything larger than [`MAX_PEM_FILE_BYTES`].
pub(crate) fn read_pem_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    let file =
        std::fs::File::open(path).map_err(|e| TlsError::file(path, format!("cannot read: {e}")))?;
    let mut data = Vec::new();
    file.take(MAX_PEM_FILE_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| TlsError::file(path, format!("cannot read: {e}")))?;
    if data.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(TlsError::file(
            path,
            format!("file is larger than {MAX_PEM_FILE_BYTES} bytes"),
        ));
    }
    Ok(data)
}

/// Loads every `CERTIFICATE` block of a PEM file (leaf first for a chain).
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let data = read_pem_file(path)?;
    let mut certs = Vec::new();
    for item in rustls_pemfile::certs(&mut data.as_slice()) {
        let cert = item.map_err(|e| TlsError::file(path, format!("bad PEM: {e}")))?;
        certs.push(cert);
    }
    if certs.is_empty() {
        return Err(TlsError::file(
            path,
            "no certificate found (expected a PEM `BEGIN CERTIFICATE` block)",
        ));
    }
    Ok(certs)
}

/// Loads the first private key (PKCS#8, PKCS#1 or SEC1) of a PEM file.
pub(crate) fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let data = read_pem_file(path)?;
    match rustls_pemfile::private_key(&mut data.as_slice()) {
        Ok(Some(key)) => Ok(key),
        Ok(None) => Err(TlsError::file(
            path,
            "no private key found (expected a PEM `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY` block)",
        )),
        Err(e) => Err(TlsError::file(path, format!("bad PEM: {e}"))),
    }
}

/// Loads a certificate chain and its key, checks that they belong together,
/// and wraps the key with `wrap` (used to record the signature scheme).
pub(crate) fn load_certified_key(
    provider: &CryptoProvider,
    cert_path: &Path,
    key_path: &Path,
    wrap: impl FnOnce(Arc<dyn SigningKey>) -> Arc<dyn SigningKey>,
) -> Result<CertifiedKey, TlsError> {
    let certs = load_certs(cert_path)?;
    let key_der = load_key(key_path)?;
    certified_key(provider, certs, key_der, cert_path, key_path, wrap)
}

/// Loads the certificate chain and private key a TLS client presents (mTLS)
/// and checks that they belong together; errors name the file.
pub fn load_client_identity(
    provider: &CryptoProvider,
    cert_path: &Path,
    key_path: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let certs = load_certs(cert_path)?;
    let key = load_key(key_path)?;
    certified_key(
        provider,
        certs.clone(),
        key.clone_key(),
        cert_path,
        key_path,
        |k| k,
    )?;
    Ok((certs, key))
}

/// Makes the signing key of `key_der` (read from `key_path`) and checks that it
/// matches the leaf of `certs` (read from `cert_path`).
fn certified_key(
    provider: &CryptoProvider,
    certs: Vec<CertificateDer<'static>>,
    key_der: PrivateKeyDer<'static>,
    cert_path: &Path,
    key_path: &Path,
    wrap: impl FnOnce(Arc<dyn SigningKey>) -> Arc<dyn SigningKey>,
) -> Result<CertifiedKey, TlsError> {
    let key = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| TlsError::file(key_path, format!("unsupported private key: {e}")))?;
    let ck = CertifiedKey::new(certs, wrap(key));
    ck.keys_match().map_err(|e| {
        TlsError::file(
            key_path,
            format!(
                "private key does not match the certificate in {} ({e})",
                cert_path.display()
            ),
        )
    })?;
    Ok(ck)
}

/// Loads a CA bundle into a root store; every certificate must be usable as a trust anchor.
pub(crate) fn load_roots(path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for (i, cert) in load_certs(path)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            TlsError::file(
                path,
                format!("certificate #{} is not a usable CA: {e}", i + 1),
            )
        })?;
    }
    Ok(roots)
}
