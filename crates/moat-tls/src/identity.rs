//! Client (or server) certificate identity: SPIFFE principal, SANs, subject, fingerprint.

use moat_core::{PeerIdentity, PeerIdentitySummary};
use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};
use x509_parser::x509::X509Name;

/// What moat keeps from a certificate.
#[derive(Debug, Default)]
pub(crate) struct CertInfo {
    pub subject: String,
    pub uri_sans: Vec<String>,
    pub dns_sans: Vec<String>,
    pub fingerprint_sha256: String,
    /// `notAfter`, unix seconds.
    pub not_after: Option<i64>,
}

impl CertInfo {
    /// Parses a DER certificate. The fingerprint is always set; subject and
    /// SANs stay empty when the certificate cannot be parsed.
    pub fn parse(der: &[u8]) -> Self {
        let fingerprint_sha256 = hex::encode(Sha256::digest(der));
        let Ok((_, cert)) = X509Certificate::from_der(der) else {
            return CertInfo {
                fingerprint_sha256,
                ..CertInfo::default()
            };
        };
        let mut info = CertInfo {
            subject: rfc4514(cert.subject()),
            fingerprint_sha256,
            not_after: Some(cert.validity().not_after.timestamp()),
            ..CertInfo::default()
        };
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                match name {
                    GeneralName::URI(u) => info.uri_sans.push((*u).to_string()),
                    GeneralName::DNSName(d) => info.dns_sans.push((*d).to_string()),
                    _ => {}
                }
            }
        }
        info
    }

    pub fn to_identity(&self) -> PeerIdentity {
        let (principal, namespace) = self
            .uri_sans
            .iter()
            .find(|u| u.starts_with("spiffe://"))
            .map(|u| PeerIdentity::from_spiffe_uri(u))
            .unwrap_or((None, None));
        PeerIdentity {
            principal,
            namespace,
            uri_sans: self.uri_sans.clone(),
            subject: self.subject.clone(),
            fingerprint_sha256: self.fingerprint_sha256.clone(),
        }
    }

    pub fn to_summary(&self) -> PeerIdentitySummary {
        let mut sans = Vec::with_capacity(self.uri_sans.len() + self.dns_sans.len());
        sans.extend(self.uri_sans.iter().cloned());
        sans.extend(self.dns_sans.iter().cloned());
        PeerIdentitySummary {
            subject: self.subject.clone(),
            sans,
            fingerprint_sha256: self.fingerprint_sha256.clone(),
            not_after: self.not_after,
        }
    }
}

/// Identity of a peer certificate (DER): principal and namespace from the
/// first `spiffe://` URI SAN, every URI SAN, RFC 4514 subject, SHA-256 fingerprint.
///
/// Never fails: an unparsable certificate yields only its fingerprint.
pub fn peer_identity(der: &[u8]) -> PeerIdentity {
    CertInfo::parse(der).to_identity()
}

/// Audit summary of a certificate (DER): subject, URI then DNS SANs, SHA-256
/// fingerprint, `notAfter`.
pub fn peer_summary(der: &[u8]) -> PeerIdentitySummary {
    CertInfo::parse(der).to_summary()
}

/// DNS SANs of a DER certificate (used for the default `server_names`).
pub(crate) fn dns_sans(der: &[u8]) -> Vec<String> {
    CertInfo::parse(der).dns_sans
}

/// Formats a distinguished name per RFC 4514: last RDN first, `,` between
/// RDNs, `+` inside multi-valued RDNs, special characters escaped, and
/// non-string values as `#hex` of their DER encoding.
fn rfc4514(name: &X509Name<'_>) -> String {
    let registry = x509_parser::objects::oid_registry();
    let mut out = String::new();
    let rdns: Vec<_> = name.iter().collect();
    for (i, rdn) in rdns.iter().rev().enumerate() {
        if i > 0 {
            out.push(',');
        }
        for (j, attr) in rdn.iter().enumerate() {
            if j > 0 {
                out.push('+');
            }
            match x509_parser::objects::oid2abbrev(attr.attr_type(), registry) {
                Ok(abbrev) => out.push_str(abbrev),
                Err(_) => out.push_str(&attr.attr_type().to_id_string()),
            }
            out.push('=');
            match attr.as_str() {
                Ok(s) => escape_value(s, &mut out),
                Err(_) => {
                    out.push('#');
                    out.push_str(&hex::encode(attr.attr_value().data));
                }
            }
        }
    }
    out
}

fn escape_value(v: &str, out: &mut String) {
    let last = v.chars().count().saturating_sub(1);
    for (i, c) in v.chars().enumerate() {
        let special = matches!(c, '"' | '+' | ',' | ';' | '<' | '>' | '\\')
            || (i == 0 && (c == ' ' || c == '#'))
            || (i == last && c == ' ');
        if c == '\0' {
            out.push_str("\\00");
            continue;
        }
        if special {
            out.push('\\');
        }
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_rfc4514_specials() {
        let mut s = String::new();
        escape_value(" a,b+c\"d\\ ", &mut s);
        assert_eq!(s, "\\ a\\,b\\+c\\\"d\\\\\\ ");
        let mut s = String::new();
        escape_value("#x", &mut s);
        assert_eq!(s, "\\#x");
    }

    #[test]
    fn garbage_der_keeps_fingerprint_only() {
        let id = peer_identity(b"not a certificate");
        assert_eq!(id.fingerprint_sha256.len(), 64);
        assert!(id.subject.is_empty() && id.principal.is_none() && id.uri_sans.is_empty());
    }
}
