//! Small byte-string helpers (ASCII case-insensitive search without allocation).

/// Position of the first ASCII case-insensitive occurrence of `needle` (lowercase) in `hay`.
pub fn find_ci(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    let first = needle[0];
    let alt = first.to_ascii_uppercase();
    let mut from = 0;
    while from + needle.len() <= hay.len() {
        let p = find2(&hay[from..=hay.len() - needle.len()], first, alt)?;
        let at = from + p;
        if hay[at..at + needle.len()].eq_ignore_ascii_case(needle) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// True when `hay` contains `needle` (lowercase), ASCII case-insensitively.
pub fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    find_ci(hay, needle).is_some()
}

/// True when `hay` starts with `prefix`, ASCII case-insensitively.
pub fn starts_with_ci(hay: &[u8], prefix: &[u8]) -> bool {
    hay.len() >= prefix.len() && hay[..prefix.len()].eq_ignore_ascii_case(prefix)
}

/// The first `a` or `b` in `h` (pass the same byte twice for one).
///
/// Most strings a request is cut into (JSON strings, form pairs, parameter values)
/// are short: eight bytes at a time in a general-purpose register costs less than
/// the set-up of `memchr2`'s vector search on every call, which dominated the walk
/// of a 1 KiB JSON document; the vector search takes over past the first 64 bytes.
#[inline]
pub fn find2(h: &[u8], a: u8, b: u8) -> Option<usize> {
    const SHORT: usize = 64;
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // The lowest flagged byte of `(x - ONES) & !x & HIGHS` is always the first zero
    // byte of `x` (a borrow only flags bytes above a true zero), so the first match
    // found this way is exact.
    let zero_bytes = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let (wa, wb) = (ONES * u64::from(a), ONES * u64::from(b));
    let head = &h[..h.len().min(SHORT)];
    let mut words = head.chunks_exact(8);
    let mut at = 0;
    for w in words.by_ref() {
        let x = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        let hits = zero_bytes(x ^ wa) | zero_bytes(x ^ wb);
        if hits != 0 {
            return Some(at + (hits.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    if let Some(k) = words.remainder().iter().position(|&c| c == a || c == b) {
        return Some(at + k);
    }
    memchr::memchr2(a, b, &h[head.len()..]).map(|k| k + head.len())
}

/// `b` as text: borrowed when it is valid UTF-8 (the common case), lossy otherwise.
///
/// Cheaper than `String::from_utf8_lossy` on valid input: `str::from_utf8`
/// validates ASCII a word at a time, where the lossy chunk iterator goes byte by byte
/// (about 1.1k instructions a browser GET's headers, measured with callgrind).
pub fn lossy(b: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(b) {
        Ok(s) => std::borrow::Cow::Borrowed(s),
        Err(_) => std::borrow::Cow::Owned(String::from_utf8_lossy(b).into_owned()),
    }
}

/// `b` as a `String`, without a copy when it is valid UTF-8; invalid sequences
/// become U+FFFD as with [`lossy`].
pub fn lossy_owned(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The word-at-a-time search agrees with a byte-by-byte one on every length
    /// around the word and vector boundaries, every position of the first match, and
    /// bytes one bit away from the searched ones or next to them (the borrow of the
    /// zero-byte test).
    #[test]
    fn find2_matches_naive() {
        for (a, b) in [(b'"', b'\\'), (b'&', b'&'), (b'%', b'+'), (0x00, 0xff)] {
            let fill = [
                b'a',
                b'!',
                b'#',
                b'[',
                b']',
                0x00,
                0x01,
                0x7f,
                0x80,
                0xff,
                a ^ 1,
                b ^ 1,
                a.wrapping_add(1),
                b.wrapping_sub(1),
            ];
            for len in 0..150 {
                for &f in &fill {
                    for pos in 0..=len {
                        for m in [a, b] {
                            let mut h = vec![f; len];
                            if pos < len {
                                h[pos] = m;
                            }
                            // a later match must not win
                            if pos + 3 < len {
                                h[pos + 3] = a;
                            }
                            let naive = h.iter().position(|&c| c == a || c == b);
                            assert_eq!(
                                find2(&h, a, b),
                                naive,
                                "{a} {b} len {len} fill {f} pos {pos}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn search() {
        assert_eq!(find_ci(b"xxSeLeCt", b"select"), Some(2));
        assert_eq!(find_ci(b"sel", b"select"), None);
        assert!(contains_ci(b"a/ETC/passwd", b"etc/passwd"));
        assert!(starts_with_ci(b"JavaScript:", b"javascript:"));
    }
}
