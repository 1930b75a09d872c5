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
        let p = memchr::memchr2(first, alt, &hay[from..=hay.len() - needle.len()])?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search() {
        assert_eq!(find_ci(b"xxSeLeCt", b"select"), Some(2));
        assert_eq!(find_ci(b"sel", b"select"), None);
        assert!(contains_ci(b"a/ETC/passwd", b"etc/passwd"));
        assert!(starts_with_ci(b"JavaScript:", b"javascript:"));
    }
}
