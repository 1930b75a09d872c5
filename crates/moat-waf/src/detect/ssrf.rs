//! SSRF / RFI: dangerous schemes and URLs to internal or metadata hosts.

use super::{Attack, Hit};

fn host_of(url_rest: &str) -> &str {
    let end = url_rest
        .find(['/', '?', '#', '\\'])
        .unwrap_or(url_rest.len());
    let auth = &url_rest[..end];
    let host = auth.rsplit('@').next().unwrap_or(auth);
    if let Some(h) = host.strip_prefix('[') {
        return h.split(']').next().unwrap_or(h);
    }
    host.split(':').next().unwrap_or(host)
}

fn internal_host(h: &str) -> Option<u8> {
    let l = h.to_ascii_lowercase();
    let l = l.trim_end_matches('.');
    if matches!(
        l,
        "169.254.169.254"
            | "metadata.google.internal"
            | "metadata"
            | "100.100.100.200"
            | "fd00:ec2::254"
            | "169.254.170.2"
            | "instance-data"
    ) {
        return Some(90);
    }
    if l == "localhost" || l.ends_with(".localhost") || l == "::1" || l == "::" || l == "0.0.0.0" {
        return Some(55);
    }
    if l == "0" {
        return Some(80);
    }
    if l.starts_with("0x") || (l.len() >= 8 && l.bytes().all(|c| c.is_ascii_digit())) {
        // hex / decimal encodings of an address
        return Some(80);
    }
    if let Ok(ip) = l.parse::<std::net::Ipv4Addr>() {
        let o = ip.octets();
        if o[0] == 127 {
            return Some(if o == [127, 0, 0, 1] { 55 } else { 75 });
        }
        if o[0] == 169 && o[1] == 254 {
            return Some(85);
        }
        if ip.is_private() {
            return Some(40);
        }
    }
    if l.starts_with("0177.") || l.starts_with("017700") {
        return Some(80);
    }
    None
}

/// SSRF / RFI: dangerous schemes and URLs to internal or metadata hosts.
pub fn ssrf(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let p = memchr::memmem::find(b, b"://")?;
    let scheme_start = b[..p]
        .iter()
        .rposition(|c| !(c.is_ascii_alphanumeric() || *c == b'+' || *c == b'.' || *c == b'-'))
        .map(|x| x + 1)
        .unwrap_or(0);
    let scheme = s[scheme_start..p].to_ascii_lowercase();
    match scheme.as_str() {
        "gopher" | "dict" | "tftp" | "jar" | "netdoc" | "ldap" | "ldaps" | "rmi" | "sftp" => {
            return Some(Hit::new(Attack::Ssrf, 85, s, scheme_start, p + 30));
        }
        "http" | "https" | "ftp" | "ws" | "wss" => {}
        _ => return None,
    }
    let host = host_of(&s[p + 3..]);
    let conf = internal_host(host)?;
    Some(Hit::new(
        Attack::Ssrf,
        conf,
        s,
        scheme_start,
        p + 3 + host.len(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssrf_cases() {
        assert!(
            ssrf("http://169.254.169.254/latest/meta-data/").is_some_and(|h| h.confidence >= 85)
        );
        assert!(ssrf("http://127.0.0.1:8080/admin").is_some());
        assert!(ssrf("gopher://x:25/_HELO").is_some());
        assert!(ssrf("url=http://www.example.com/tan?usp=4#8").is_none());
        assert!(ssrf("http://user@localhost/").is_some());
    }
}
