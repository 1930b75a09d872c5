//! Percent-decoding, once for the crate: the selective decoding of path normalization
//! (Envoy's `normalize_path` and slash options) and the full decoding of query
//! parameters that carry tokens. (moat-waf has its own decoder on purpose: it undoes
//! evasions, `%uXXXX` and overlong UTF-8, that a policy must not see decoded.)

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Decodes the `%XX` escapes of `s` whose byte `keep` accepts; every other byte,
/// and escapes that are not two hex digits, stay as written. Bytes that do not form
/// UTF-8 are replaced (U+FFFD), as `percent-encoding`'s `decode_utf8_lossy` does.
pub(crate) fn decode_where(s: &str, keep: impl Fn(u8) -> bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                let c = h * 16 + l;
                if keep(c) {
                    out.push(c);
                    i += 3;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Decodes every `%XX` escape of `s`.
pub(crate) fn decode_all(s: &str) -> String {
    decode_where(s, |_| true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_selective_decoding() {
        assert_eq!(decode_all("a%20b%2Fc"), "a b/c");
        assert_eq!(decode_all("%zz%4"), "%zz%4");
        assert_eq!(decode_all("caf%C3%A9"), "café");
        assert_eq!(decode_all("%FF"), "\u{FFFD}");
        assert_eq!(decode_where("%2F%41", |c| c == b'/'), "/%41");
    }
}
