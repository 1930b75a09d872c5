//! Small byte-string helpers (ASCII case-insensitive search without allocation).

/// Position of the first ASCII case-insensitive occurrence of `needle` (lowercase) in `hay`.
pub fn find_ci(hay: &[u8], needle: &[u8]) -> Option<usize> {
    find_ci_with(hay, needle, None)
}

/// [`find_ci`] with the vector searcher of a needle searched for in many values
/// built once (`folded` searches for `needle`): building memchr's `memmem`
/// searcher cost more than searching a 700-byte value with it (callgrind, the
/// peer's JSON POST).
#[inline]
pub fn find_ci_with(
    hay: &[u8],
    needle: &[u8],
    folded: Option<&memchr::memmem::Finder<'_>>,
) -> Option<usize> {
    let n = needle.len();
    if n == 0 || hay.len() < n {
        return None;
    }
    debug_assert!(
        !needle.iter().any(u8::is_ascii_uppercase),
        "needle not lowercase"
    );
    if hay.len() >= FOLDED_MIN && n <= FOLDED_MAX_NEEDLE {
        return match folded {
            Some(f) => {
                debug_assert_eq!(f.needle(), needle);
                find_folded(hay, f)
            }
            None => find_folded(hay, &memchr::memmem::Finder::new(needle)),
        };
    }
    let first = needle[0];
    let alt = first.to_ascii_uppercase();
    let mut from = 0;
    while from + n <= hay.len() {
        let p = find2(&hay[from..=hay.len() - n], first, alt)?;
        let at = from + p;
        if hay[at..at + n].eq_ignore_ascii_case(needle) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Haystacks at least this long are searched by [`find_folded`]. The first-byte
/// search restarts at every occurrence of the needle's first letter, frequent in
/// prose (`s` of `select`: a long free-text value cost 2.6k instructions of a
/// 1 KiB JSON POST's 28k in the WAF, callgrind); lowercasing and a vector
/// substring search cost well under one instruction a byte. Below this length
/// the first-byte search is cheaper (no set-up; measured on the WAF benchmarks).
const FOLDED_MIN: usize = 128;
/// Longest needle [`find_folded`] takes (chunks overlap by one byte less).
const FOLDED_MAX_NEEDLE: usize = 64;
/// Bytes lowercased at a time, on the stack.
const FOLDED_CHUNK: usize = 1024;

/// [`find_ci`] for a long haystack and a lowercase needle: each chunk of the
/// haystack is lowercased into a stack buffer and searched with memchr's
/// vector `memmem`; consecutive chunks overlap by `needle.len() - 1` bytes, so an
/// occurrence across a chunk boundary is found whole in the next chunk.
// Not inlined: its 1 KiB frame and set-up would make every short search pay.
#[inline(never)]
fn find_folded(hay: &[u8], finder: &memchr::memmem::Finder<'_>) -> Option<usize> {
    let needle = finder.needle();
    let mut buf = [0u8; FOLDED_CHUNK];
    let mut start = 0;
    loop {
        let end = (start + FOLDED_CHUNK).min(hay.len());
        let folded = &mut buf[..end - start];
        for (d, &c) in folded.iter_mut().zip(&hay[start..end]) {
            *d = c.to_ascii_lowercase();
        }
        if let Some(p) = finder.find(folded) {
            return Some(start + p);
        }
        if end == hay.len() {
            return None;
        }
        start = end - (needle.len() - 1);
    }
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
/// are short: a 16-byte SSE2 compare costs less than the set-up of `memchr2`'s
/// vector search on every call, which dominated the walk of a 1 KiB JSON
/// document; the vector search takes over past the first 64 bytes.
#[inline]
pub fn find2(h: &[u8], a: u8, b: u8) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of the x86-64 baseline: every CPU this code
        // runs on has it.
        #[allow(unsafe_code)]
        unsafe {
            sse2::find2(h, a, b)
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    memchr::memchr2(a, b, h)
}

/// SSE2 helpers (SSE2 is part of the x86-64 baseline, so nothing is dispatched
/// at run time).
#[cfg(target_arch = "x86_64")]
pub(crate) mod sse2 {
    use std::arch::x86_64::*;

    /// The 16 bytes of `b` as a vector: two 8-byte words, which the compiler
    /// folds into one unaligned load.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(crate) fn load(b: &[u8; 16]) -> __m128i {
        let (lo, hi) = b.split_at(8);
        let word = |w: &[u8]| w.try_into().unwrap_or([0; 8]);
        load_words(&word(lo), &word(hi))
    }

    /// `lo` then `hi` as one vector (bytes 0-7 and 8-15).
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(crate) fn load_words(lo: &[u8; 8], hi: &[u8; 8]) -> __m128i {
        _mm_set_epi64x(i64::from_le_bytes(*hi), i64::from_le_bytes(*lo))
    }

    /// [`super::find2`]: 16 bytes per compare over the first 64, then `memchr2`.
    #[inline]
    #[target_feature(enable = "sse2")]
    pub(super) fn find2(h: &[u8], a: u8, b: u8) -> Option<usize> {
        const SHORT: usize = 64;
        let (va, vb) = (_mm_set1_epi8(a as i8), _mm_set1_epi8(b as i8));
        let hits = |block: &[u8; 16]| {
            let v = load(block);
            _mm_movemask_epi8(_mm_or_si128(_mm_cmpeq_epi8(v, va), _mm_cmpeq_epi8(v, vb))) as u32
        };
        let head = &h[..h.len().min(SHORT)];
        let mut blocks = head.chunks_exact(16);
        let mut at = 0;
        for block in blocks.by_ref() {
            let m = block.try_into().map_or(0, hits);
            if m != 0 {
                return Some(at + m.trailing_zeros() as usize);
            }
            at += 16;
        }
        if !blocks.remainder().is_empty() {
            match head.last_chunk::<16>() {
                // the last 16 bytes, overlapping blocks without a match: its
                // first match is the first one after them
                Some(last) => {
                    let m = hits(last);
                    if m != 0 {
                        return Some(head.len() - 16 + m.trailing_zeros() as usize);
                    }
                }
                None => {
                    return head.iter().position(|&c| c == a || c == b);
                }
            }
        }
        memchr::memchr2(a, b, &h[head.len()..]).map(|k| k + head.len())
    }
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

    /// The block search agrees with a byte-by-byte one on every length around
    /// the block boundaries and the hand-over to `memchr2` (the overlapping last
    /// block included), every position of the first match, and bytes one bit
    /// away from the searched ones or next to them.
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

    /// `find_ci` the obvious way: every position compared in full.
    fn naive(h: &[u8], n: &[u8]) -> Option<usize> {
        (h.len() >= n.len())
            .then(|| (0..=h.len() - n.len()).find(|&p| h[p..p + n.len()].eq_ignore_ascii_case(n)))
            .flatten()
    }

    /// The short-haystack search (with and without a prebuilt searcher) agrees
    /// with a naive one: needles with letters and non-letters at both ends,
    /// planted in either case at every position of haystacks around the word
    /// boundaries, among decoys that share only the first or only the last byte.
    #[test]
    fn find_ci_matches_naive() {
        let needles: [&[u8]; 7] = [
            b"s",
            b"se",
            b"select",
            b"<script",
            b"../",
            b"${jndi:",
            b"union all",
        ];
        for needle in needles {
            let finder = memchr::memmem::Finder::new(needle);
            let upper = needle.to_ascii_uppercase();
            let mut decoy_first = needle.to_vec();
            *decoy_first.last_mut().unwrap_or(&mut 0) ^= 0x40;
            let mut decoy_last = needle.to_vec();
            decoy_last[0] ^= 0x40;
            for len in 0..40 {
                for pos in 0..=len {
                    for (k, plant) in [needle, &upper[..], &decoy_first[..], &decoy_last[..]]
                        .into_iter()
                        .enumerate()
                    {
                        let mut h: Vec<u8> =
                            (0..len).map(|i| b"ab S-x\x00\x7f\xe9"[i % 8]).collect();
                        if pos + plant.len() <= len {
                            h[pos..pos + plant.len()].copy_from_slice(plant);
                        }
                        assert_eq!(
                            find_ci(&h, needle),
                            naive(&h, needle),
                            "{needle:?} len {len} pos {pos} plant {k}"
                        );
                        assert_eq!(
                            find_ci_with(&h, needle, Some(&finder)),
                            naive(&h, needle),
                            "prebuilt {needle:?} len {len} pos {pos} plant {k}"
                        );
                    }
                }
            }
        }
    }

    /// Long haystacks (the chunked, lowercased search, with and without a
    /// prebuilt searcher): occurrences planted on either side of and across
    /// every chunk boundary, in either case, and the first of two occurrences
    /// wins.
    #[test]
    fn find_ci_long_haystacks() {
        for needle in [&b"select"[..], b"<script", b"x", &[b'q'; 64][..]] {
            let n = needle.len();
            let finder = memchr::memmem::Finder::new(needle);
            for len in [
                FOLDED_MIN,
                1000,
                FOLDED_CHUNK,
                FOLDED_CHUNK + 1,
                2 * FOLDED_CHUNK + 7,
            ] {
                let boundaries = [0, FOLDED_CHUNK - n + 1, 2 * FOLDED_CHUNK - 2 * (n - 1)];
                let mut positions: Vec<usize> = vec![0, len / 2, len - n];
                for b in boundaries {
                    for d in 0..=n + 1 {
                        positions.push(b.saturating_sub(d));
                        positions.push(b + d);
                    }
                }
                for &pos in positions.iter().filter(|&&p| p + n <= len) {
                    for upper in [false, true] {
                        let mut h: Vec<u8> = (0..len).map(|i| b"Sa ELeCtb\xe9"[i % 10]).collect();
                        let plant = if upper {
                            needle.to_ascii_uppercase()
                        } else {
                            needle.to_vec()
                        };
                        h[pos..pos + n].copy_from_slice(&plant);
                        if pos + 3 * n < len {
                            h[pos + 2 * n..pos + 3 * n].copy_from_slice(needle);
                        }
                        assert_eq!(
                            find_ci(&h, needle),
                            naive(&h, needle),
                            "{needle:?} len {len} pos {pos}"
                        );
                        assert_eq!(
                            find_ci_with(&h, needle, Some(&finder)),
                            naive(&h, needle),
                            "prebuilt {needle:?} len {len} pos {pos}"
                        );
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
