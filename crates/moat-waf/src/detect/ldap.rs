//! LDAP filter injection.

use super::{Attack, Hit};

/// LDAP filter injection.
pub fn ldap(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(p) = memchr::memmem::find(&b[from..], b")(") {
        let at = from + p;
        let rest = &b[at + 2..];
        let op = matches!(rest.first(), Some(b'|' | b'&' | b'!'));
        let mut k = 0;
        while k < rest.len()
            && (rest[k].is_ascii_alphanumeric() || rest[k] == b'-' || rest[k] == b'_')
        {
            k += 1;
        }
        let attr = k > 0
            && (rest.get(k) == Some(&b'=')
                || (matches!(rest.get(k), Some(b'~' | b'<' | b'>'))
                    && rest.get(k + 1) == Some(&b'=')));
        if op || attr {
            return Some(Hit::new(Attack::Ldap, 80, s, at.saturating_sub(8), at + 16));
        }
        from = at + 2;
    }
    // extensible match: attr:1.2.3.4:=value / attr:dn:1.2.3:=value
    if let Some(p) = memchr::memmem::find(b, b":=") {
        let before = &s[..p];
        if let Some(c) = before.rfind(':') {
            let oid = &before[c + 1..];
            let attr = &before[..c];
            let attr_ok = !attr.is_empty()
                && attr.rsplit(['(', ' ']).next().is_some_and(|a| {
                    !a.is_empty()
                        && a.bytes()
                            .all(|x| x.is_ascii_alphanumeric() || x == b':' || x == b'-')
                });
            if attr_ok && oid.contains('.') && oid.bytes().all(|x| x.is_ascii_digit() || x == b'.')
            {
                return Some(Hit::new(Attack::Ldap, 80, s, 0, p + 2));
            }
        }
    }
    let t = s.trim_start();
    if (t.starts_with("*)") || t.starts_with("(|(") || t.starts_with("(&(") || t.starts_with("*(|"))
        && t.contains('=')
    {
        return Some(Hit::new(Attack::Ldap, 80, s, 0, 24));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldap_cases() {
        assert!(ldap("*)(uid=*))(|(uid=*").is_some());
        assert!(ldap("(a)(b)").is_none());
    }
}
