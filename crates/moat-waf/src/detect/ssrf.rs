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

/// An IPv4 host as `inet_aton` reads it, which is how the C library, curl and many
/// URL fetchers read one: `127.1`, `0x7f.0.0.1`, `0177.0.0.1`, `2130706433`. The
/// flag says whether it was written any other way than four decimal octets, which
/// only a request that slips past a filter of addresses does.
fn inet_aton(h: &str) -> Option<(std::net::Ipv4Addr, bool)> {
    let mut parts = [0u32; 4];
    let mut n = 0;
    let mut odd = false;
    for part in h.split('.') {
        if n == 4 || part.is_empty() {
            return None;
        }
        let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            Some(hex) => (hex, 16),
            None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
            None => (part, 10),
        };
        if digits.is_empty() || digits.len() > 10 {
            return None;
        }
        parts[n] = u32::from_str_radix(digits, radix).ok()?;
        odd |= radix != 10;
        n += 1;
    }
    // the last part fills the bytes the earlier ones leave: `127.1` is 127.0.0.1
    let last_bits = 8 * (5 - n as u32);
    let mut v: u32 = 0;
    for (i, &p) in parts[..n].iter().enumerate() {
        if i + 1 < n {
            if p > 255 {
                return None;
            }
            v |= p << (24 - 8 * i as u32);
        } else {
            if last_bits < 32 && p >> last_bits != 0 {
                return None;
            }
            v |= p;
        }
    }
    Some((std::net::Ipv4Addr::from(v), odd || n != 4))
}

/// The ASCII a URL parser's IDNA mapping (NFKC) makes of the look-alikes used to
/// write an internal host past a filter: circled and full-width letters and digits,
/// ideographic and full-width full stops (`①②⑦.⓪.⓪.①`, `ⓛⓞⓒⓐⓛⓗⓞⓢⓣ`). Other
/// characters are kept.
fn idna_fold(host: &str) -> String {
    host.chars()
        .map(|c| {
            let u = c as u32;
            let ascii = match u {
                0x2460..=0x2468 => u - 0x2460 + u32::from(b'1'),
                0x24EA => u32::from(b'0'),
                0x24B6..=0x24CF => u - 0x24B6 + u32::from(b'a'),
                0x24D0..=0x24E9 => u - 0x24D0 + u32::from(b'a'),
                0xFF10..=0xFF19 => u - 0xFF10 + u32::from(b'0'),
                0xFF21..=0xFF3A => u - 0xFF21 + u32::from(b'a'),
                0xFF41..=0xFF5A => u - 0xFF41 + u32::from(b'a'),
                0x3002 | 0xFF0E | 0xFF61 => u32::from(b'.'),
                _ => return c,
            };
            char::from_u32(ascii).unwrap_or(c)
        })
        .collect()
}

/// The IPv4 address a host name starts with when more labels follow it, dotted or
/// dashed (`10.0.0.1.nip.io`, `127-0-0-1.sslip.io`): how wildcard DNS services name
/// an address.
/// The flag says whether it was dashed.
fn embedded_address(host: &str) -> Option<(std::net::Ipv4Addr, bool)> {
    let mut labels = host.split('.');
    let first = labels.next()?;
    if first.contains('-') {
        // `127-0-0-1.nip.io`
        let ip = first.replace('-', ".").parse().ok()?;
        return labels.next().is_some().then_some((ip, true));
    }
    let mut octets = [0u8; 4];
    octets[0] = first.parse().ok()?;
    for o in &mut octets[1..] {
        *o = labels.next()?.parse().ok()?;
    }
    // a domain must follow: the bare address is judged as an address
    labels
        .next()
        .is_some_and(|l| l.bytes().any(|c| c.is_ascii_alphabetic()))
        .then_some((std::net::Ipv4Addr::from(octets), false))
}

/// The confidence for an internal address reached through a form that hides it (a
/// short form, a wildcard-DNS name): the metadata address 90; loopback, `0/8` and
/// link-local 80, and private ranges 80 when `private` counts.
fn disguised_internal(ip: std::net::Ipv4Addr, private: bool) -> Option<u8> {
    let o = ip.octets();
    if ip == std::net::Ipv4Addr::new(169, 254, 169, 254) {
        Some(90)
    } else if o[0] == 127 || o[0] == 0 || ip.is_link_local() || (private && ip.is_private()) {
        Some(80)
    } else {
        None
    }
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
            | "192.0.0.192"
    ) {
        return Some(90);
    }
    if l == "localhost" || l.ends_with(".localhost") || l == "::1" || l == "::" || l == "0.0.0.0" {
        return Some(55);
    }
    if l == "0" {
        return Some(80);
    }
    // names that resolve to loopback by design (`lvh.me`, `*.localtest.me`), and a
    // wildcard DNS service answering with the address a name starts with
    // (`169.254.169.254.nip.io`, `127.0.0.1.sslip.io`)
    if ["localtest.me", "lvh.me", "vcap.me"]
        .iter()
        .any(|d| l == *d || l.strip_suffix(d).is_some_and(|p| p.ends_with('.')))
    {
        return Some(80);
    }
    if let Some((ip, dashed)) = embedded_address(l) {
        // an intranet's own names may spell a private address with dashes
        // (`10-1-2-3.corp.example`); loopback never needs one
        if let Some(c) = disguised_internal(ip, !dashed) {
            return Some(c);
        }
    }
    if l.starts_with("0x") || (l.len() >= 8 && l.bytes().all(|c| c.is_ascii_digit())) {
        // hex / decimal encodings of an address
        return Some(80);
    }
    // an internal address written the way no one writes one: `127.1`, `0177.0.0.1`,
    // `169.254.43518`, `::ffff:127.0.0.1`
    let odd_form = inet_aton(l)
        .filter(|&(_, odd)| odd)
        .map(|(ip, _)| ip)
        .or_else(|| {
            l.parse::<std::net::Ipv6Addr>()
                .ok()
                .and_then(|v6| v6.to_ipv4_mapped())
        });
    if let Some(c) = odd_form.and_then(|ip| disguised_internal(ip, true)) {
        return Some(c);
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
    let conf = if host.is_ascii() {
        internal_host(host)?
    } else {
        // an internal host in look-alikes is written to pass a filter
        internal_host(&idna_fold(host))?.max(80)
    };
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
        for odd in [
            "http://127.1/",
            "http://127.0.1/admin",
            "http://0177.1/",
            "http://169.254.43518/latest/meta-data/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:a9fe:a9fe]/latest",
            "http://10.1/",
            "http://192.0.0.192/latest/",
        ] {
            assert!(ssrf(odd).is_some_and(|h| h.confidence >= 80), "{odd}");
        }
        // wildcard DNS names for an internal address, and names that are loopback
        assert!(ssrf("http://169.254.169.254.nip.io/latest").is_some_and(|h| h.confidence >= 85));
        assert!(ssrf("http://127-0-0-1.sslip.io:8080/").is_some());
        assert!(ssrf("http://app.localtest.me/admin").is_some());
        assert!(ssrf("http://8.8.8.8.nip.io/").is_none());
        assert!(ssrf("https://v1-2-3-4.example.com/").is_none());
        assert!(ssrf("http://10-1-2-3.corp.example/").is_none());
        assert!(ssrf("http://10.0.0.1.nip.io/").is_some());
        // the look-alikes IDNA maps to ASCII
        assert!(ssrf("http://①②⑦.⓪.⓪.①/").is_some());
        assert!(ssrf("http://①⑥⑨。②⑤④。①⑥⑨。②⑤④/latest").is_some_and(|h| h.confidence >= 85));
        assert!(ssrf("http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ/").is_some_and(|h| h.confidence >= 80));
        assert!(ssrf("https://例え.jp/").is_none());
        // short forms of public addresses, and versions in a URL, are not internal
        assert!(ssrf("http://1.2/").is_none());
        assert!(ssrf("http://8.8/").is_none());
        assert!(ssrf("https://v1.2.example.com/").is_none());
        assert_eq!(inet_aton("127.1"), Some(([127, 0, 0, 1].into(), true)));
        assert_eq!(inet_aton("10.0.0.1"), Some(([10, 0, 0, 1].into(), false)));
        assert_eq!(inet_aton("1.2.3.4.5"), None);
        assert_eq!(inet_aton("1.256.1"), None);
        assert_eq!(inet_aton("1.2.3.256"), None);
        assert_eq!(inet_aton("0x"), None);
        assert_eq!(inet_aton("99999999999"), None);
    }
}
