//! The keyword prefilter: finds every occurrence of every rule keyword, ASCII
//! case-insensitively, overlapping, in one pass over the payload.
//!
//! An Aho-Corasick DFA over gitleaks' 244 keywords costs one dependent state
//! transition per byte (about 20 instructions per byte through the overlapping
//! iterator), and SIMD Teddy cannot tell that many literals apart (its nibble
//! masks accept most positions of ordinary text). This finder instead gives each
//! keyword one *anchor*: a two-byte pair inside it chosen to be rare in text.
//! A 64 KiB table indexed by the two bytes at each payload position says whether
//! that pair (in any ASCII case) anchors some keyword; the test is one table load
//! per byte with no dependency between positions, so eight positions are tested
//! per branch (64 per step with AVX-512 VBMI, in the `avx512` module; 32 per
//! step with AVX2, in the `avx2` module). A position that
//! passes is then tested on the byte after the pair (a 256-bit set per anchor
//! group), and only then are the keywords of that anchor compared with the
//! payload, exactly. A keyword occurs at `p` if and only if its anchor pair
//! occurs at `p + offset`, followed by the keyword's next byte, and the
//! comparison succeeds, so the finder reports exactly the occurrences a plain
//! search reports.
//!
//! The SIMD paths are chosen at run time from what the CPU has; the environment
//! variable `MOAT_SECRETS_SIMD` (`avx2` or `portable`), read when a ruleset is
//! compiled, caps the choice, so that the slower paths can be measured on a
//! machine that has the faster ones. All paths report the same occurrences.

// AVX-512 and AVX2 intrinsics of the keyword filter, behind runtime feature checks.
#![allow(unsafe_code)]

/// One keyword anchored at a table slot, with what is needed to compare it.
#[derive(Debug)]
struct Anchor {
    /// Keyword index.
    kw: u32,
    /// Offset of the anchor pair in the keyword.
    off: u32,
    /// Keyword length.
    len: u32,
    /// The keyword's first (up to) 8 bytes, lowercase, little-endian.
    head: u64,
    /// 0x20 at the letters of `head`: OR-ing it into payload bytes lowercases them.
    fold: u64,
    /// 0xff at the bytes of `head` (keywords shorter than 8 bytes).
    keep: u64,
}

impl Anchor {
    fn new(kw: usize, off: usize, k: &[u8]) -> Anchor {
        let mut b = [0u8; 8];
        let mut fold = [0u8; 8];
        let mut keep = [0u8; 8];
        for (i, &c) in k.iter().take(8).enumerate() {
            b[i] = c;
            fold[i] = if c.is_ascii_lowercase() { 0x20 } else { 0 };
            keep[i] = 0xff;
        }
        Anchor {
            kw: kw as u32,
            off: off as u32,
            len: k.len() as u32,
            head: u64::from_le_bytes(b),
            fold: u64::from_le_bytes(fold),
            keep: u64::from_le_bytes(keep),
        }
    }
}

/// Finds every keyword occurrence (see the module documentation).
#[derive(Debug)]
pub(crate) struct KeywordFinder {
    /// Indexed by `first byte | second byte << 8`: the group of the keywords
    /// anchored at that pair, 0 for none.
    table: Box<[u8; 1 << 16]>,
    /// Group -> its range in `anchors` (group 0 is empty). Beyond 255 pairs,
    /// pairs share groups.
    groups: Box<[(u32, u32); 256]>,
    /// Group -> the bytes that may follow its pairs in its keywords (a 256-bit
    /// set; all bytes when a keyword ends with the pair): most pairs found in
    /// text are not followed by one, and this test is cheaper than the keywords.
    third: Box<[[u64; 4]; 256]>,
    /// Anchors, by group.
    anchors: Vec<Anchor>,
    /// The keywords, lowercase.
    keywords: Vec<Box<[u8]>>,
    /// The SIMD pair filter, when the CPU has one.
    #[cfg(target_arch = "x86_64")]
    simd: Option<Filter>,
}

/// A keyword finder code path, from the narrowest to the widest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Path {
    /// 8 positions per branch, any CPU.
    Portable,
    /// 32 positions per step (x86-64 with AVX2).
    Avx2,
    /// 64 positions per step (x86-64 with AVX-512 VBMI).
    Avx512,
}

impl Path {
    /// The widest path allowed by `MOAT_SECRETS_SIMD` (`avx2` or
    /// `portable`; unset or any other value allows every path).
    fn allowed() -> Path {
        match std::env::var("MOAT_SECRETS_SIMD").as_deref() {
            Ok("portable") => Path::Portable,
            Ok("avx2") => Path::Avx2,
            _ => Path::Avx512,
        }
    }

    /// The name reported by `Scanner::keyword_path`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Path::Portable => "portable",
            Path::Avx2 => "avx2",
            Path::Avx512 => "avx512",
        }
    }
}

/// The SIMD pair filter in use.
#[cfg(target_arch = "x86_64")]
#[derive(Debug)]
enum Filter {
    Avx512(avx512::PairFilter),
    Avx2(avx2::PairFilter),
}

/// Heuristic frequency of a (lowercase) byte in text, code, logs and JSON, in
/// arbitrary units; only the order matters. Letters follow English letter
/// frequencies; bytes not listed are rare.
fn byte_weight(b: u8) -> u32 {
    match b {
        b' ' => 150,
        b'e' => 127,
        b't' => 91,
        b'a' => 82,
        b'o' => 75,
        b'i' => 70,
        b'n' => 67,
        b's' => 63,
        b'h' => 61,
        b'r' => 60,
        b'd' => 43,
        b'l' => 40,
        b'c' | b'u' => 28,
        b'm' | b'w' => 24,
        b'f' => 22,
        b'g' | b'y' | b'_' | b'.' | b'"' => 20,
        b'p' => 19,
        b'b' | b'-' => 15,
        b'v' | b'0'..=b'9' | b'/' | b'=' | b':' | b',' | b'\n' => 10,
        b'k' => 8,
        b'j' | b'x' => 2,
        b'q' | b'z' => 1,
        _ => 5,
    }
}

/// The most frequent English letter pairs, whose frequency the product of the
/// letters' frequencies underestimates.
const COMMON_PAIRS: &[&[u8; 2]] = &[
    b"th", b"he", b"in", b"er", b"an", b"re", b"on", b"at", b"en", b"nd", b"ti", b"es", b"or",
    b"te", b"of", b"ed", b"is", b"it", b"al", b"ar", b"st", b"to", b"nt", b"ng", b"se", b"ha",
    b"as", b"ou", b"io", b"le", b"ve", b"co", b"me", b"de", b"hi", b"ri", b"ro", b"ic", b"ne",
    b"ea", b"ra", b"ce", b"li", b"ch", b"ll", b"be", b"ma", b"si", b"om", b"ur",
];

/// Estimated frequency of the pair `(a, b)` (lowercase): lower is rarer.
fn pair_weight(a: u8, b: u8) -> u32 {
    let w = byte_weight(a) * byte_weight(b);
    if COMMON_PAIRS.contains(&&[a, b]) {
        w * 4
    } else {
        w
    }
}

/// Both ASCII cases of `b` (one value for non-letters).
fn cases(b: u8) -> impl Iterator<Item = u8> {
    let (l, u) = (b.to_ascii_lowercase(), b.to_ascii_uppercase());
    std::iter::once(l).chain((u != l).then_some(u))
}

impl KeywordFinder {
    /// Builds the finder for non-empty, distinct keywords (compared ASCII
    /// case-insensitively), with the widest path that the CPU and
    /// `MOAT_SECRETS_SIMD` allow.
    pub(crate) fn new(keywords: &[String]) -> KeywordFinder {
        KeywordFinder::with_path(keywords, Path::allowed())
    }

    /// Builds the finder with the widest path up to `widest` that the CPU has.
    fn with_path(keywords: &[String], widest: Path) -> KeywordFinder {
        let keywords: Vec<Box<[u8]>> = keywords
            .iter()
            .map(|k| k.as_bytes().to_ascii_lowercase().into_boxed_slice())
            .collect();
        // Lowercase pair -> anchors. A one-byte keyword is anchored at every
        // pair starting with its byte (the last payload byte is tested with a
        // following 0 byte, see `for_each`).
        let mut by_pair: std::collections::BTreeMap<(u8, u8), Vec<(usize, usize)>> =
            Default::default();
        for (i, k) in keywords.iter().enumerate() {
            match k.len() {
                0 => {}
                1 => {
                    for second in 0..=255u8 {
                        by_pair
                            .entry((k[0], second.to_ascii_lowercase()))
                            .or_default()
                            .push((i, 0));
                    }
                }
                _ => {
                    // A pair followed by a keyword byte is preferred: that byte
                    // is checked before the keyword (see `third`).
                    let j = (0..k.len() - 1)
                        .min_by_key(|&j| {
                            pair_weight(k[j], k[j + 1]) * if j + 2 < k.len() { 1 } else { 2 }
                        })
                        .unwrap_or(0);
                    by_pair.entry((k[j], k[j + 1])).or_default().push((i, j));
                }
            }
        }
        let mut table = Box::new([0u8; 1 << 16]);
        let mut by_group: Vec<Vec<(usize, usize)>> = Vec::new();
        for (n, ((a, b), anchors)) in by_pair.into_iter().enumerate() {
            // Beyond 255 pairs, groups are shared: their anchors are still
            // compared exactly, so sharing only costs comparisons.
            let g = n % 255;
            if g == by_group.len() {
                by_group.push(Vec::new());
            }
            for x in anchors {
                if !by_group[g].contains(&x) {
                    by_group[g].push(x);
                }
            }
            for ca in cases(a) {
                for cb in cases(b) {
                    table[usize::from(u16::from_le_bytes([ca, cb]))] = g as u8 + 1;
                }
            }
        }
        let mut groups = Box::new([(0u32, 0u32); 256]);
        let mut third = Box::new([[0u64; 4]; 256]);
        let mut anchors = Vec::new();
        for (g, members) in by_group.into_iter().enumerate() {
            for &(k, off) in &members {
                match keywords[k].get(off + 2) {
                    Some(&c) => {
                        for c in cases(c) {
                            third[g + 1][usize::from(c >> 6)] |= 1 << (c & 63);
                        }
                    }
                    None => third[g + 1] = [u64::MAX; 4],
                }
            }
            let start = anchors.len() as u32;
            anchors.extend(
                members
                    .into_iter()
                    .map(|(k, off)| Anchor::new(k, off, &keywords[k])),
            );
            groups[g + 1] = (start, anchors.len() as u32);
        }
        #[cfg(target_arch = "x86_64")]
        let simd = None
            .or_else(|| {
                (widest >= Path::Avx512)
                    .then(|| avx512::PairFilter::new(&table, &third))
                    .flatten()
                    .map(Filter::Avx512)
            })
            .or_else(|| {
                (widest >= Path::Avx2)
                    .then(|| avx2::PairFilter::new(&table, &third))
                    .flatten()
                    .map(Filter::Avx2)
            });
        #[cfg(not(target_arch = "x86_64"))]
        let _ = widest;
        KeywordFinder {
            #[cfg(target_arch = "x86_64")]
            simd,
            table,
            groups,
            third,
            anchors,
            keywords,
        }
    }

    /// The code path in use.
    pub(crate) fn path(&self) -> Path {
        #[cfg(target_arch = "x86_64")]
        match self.simd {
            Some(Filter::Avx512(_)) => return Path::Avx512,
            Some(Filter::Avx2(_)) => return Path::Avx2,
            None => {}
        }
        Path::Portable
    }

    /// Calls `f(keyword index, start, end)` for every keyword occurrence.
    pub(crate) fn for_each(&self, data: &[u8], mut f: impl FnMut(usize, usize, usize)) {
        let t = &*self.table;
        let mut i = 0;
        #[cfg(target_arch = "x86_64")]
        {
            let candidate = |at: usize| {
                let g = t[usize::from(u16::from_le_bytes([data[at], data[at + 1]]))];
                if g != 0 {
                    self.verify(g, at, data, &mut f);
                }
            };
            match &self.simd {
                Some(Filter::Avx512(simd)) => i = simd.candidates(data, candidate),
                Some(Filter::Avx2(simd)) => i = simd.candidates(data, candidate),
                None => {}
            }
        }
        // Eight positions per step and one branch: most steps find nothing. The
        // pairs are cut from two overlapping 8-byte loads, and their groups are
        // packed into one word (byte k: the group at position i + k) that the
        // rare steps with candidates walk through out of line.
        while let Some(w) = data.get(i..i + 9) {
            let (Ok(x), Ok(y)) = (<[u8; 8]>::try_from(&w[..8]), <[u8; 8]>::try_from(&w[1..]))
            else {
                break;
            };
            let (x, y) = (u64::from_le_bytes(x), u64::from_le_bytes(y));
            let g = |v: u64, shift: u32| u64::from(t[usize::from((v >> shift) as u16)]);
            let groups = g(x, 0)
                | g(y, 0) << 8
                | g(x, 16) << 16
                | g(y, 16) << 24
                | g(x, 32) << 32
                | g(y, 32) << 40
                | g(x, 48) << 48
                | g(y, 48) << 56;
            if groups != 0 {
                self.verify_step(groups, i, data, &mut f);
            }
            i += 8;
        }
        // The last bytes, the very last one paired with a 0 byte.
        for at in i..data.len() {
            let next = data.get(at + 1).copied().unwrap_or(0);
            let g = t[usize::from(u16::from_le_bytes([data[at], next]))];
            if g != 0 {
                self.verify(g, at, data, &mut f);
            }
        }
    }

    /// The candidates of a step: byte k of `groups` is the group anchored at
    /// position `i + k`.
    #[inline(never)]
    fn verify_step(
        &self,
        mut groups: u64,
        i: usize,
        data: &[u8],
        f: &mut impl FnMut(usize, usize, usize),
    ) {
        while groups != 0 {
            let k = groups.trailing_zeros() / 8;
            self.verify((groups >> (8 * k)) as u8, i + k as usize, data, f);
            groups &= !(0xff << (8 * k));
        }
    }

    /// Compares the keywords anchored in group `g` at position `at`.
    #[inline(always)]
    fn verify(&self, g: u8, at: usize, data: &[u8], f: &mut impl FnMut(usize, usize, usize)) {
        if let Some(&c) = data.get(at + 2) {
            if self.third[usize::from(g)][usize::from(c >> 6)] >> (c & 63) & 1 == 0 {
                return;
            }
        }
        let (lo, hi) = self.groups[usize::from(g)];
        let Some(anchors) = self.anchors.get(lo as usize..hi as usize) else {
            return;
        };
        for a in anchors {
            let start = at.wrapping_sub(a.off as usize);
            if start > at {
                continue;
            }
            // Most candidates fail on the first 8 bytes, compared as one word.
            match data
                .get(start..start.wrapping_add(8))
                .map(<[u8; 8]>::try_from)
            {
                Some(Ok(w)) => {
                    if (u64::from_le_bytes(w) & a.keep | a.fold) == a.head {
                        self.found(a, start, data, f);
                    }
                }
                _ => self.found(a, start, data, f),
            }
        }
    }

    /// Reports keyword `a.kw` at `start` if it is there (the caller has checked
    /// its first 8 bytes, or there are fewer than 8 bytes left).
    #[cold]
    #[inline(never)]
    fn found(
        &self,
        a: &Anchor,
        start: usize,
        data: &[u8],
        f: &mut impl FnMut(usize, usize, usize),
    ) {
        let end = start + a.len as usize;
        if data
            .get(start..end)
            .is_some_and(|s| s.eq_ignore_ascii_case(&self.keywords[a.kw as usize]))
        {
            f(a.kw as usize, start, end);
        }
    }
}

/// The pair test of 64 positions at once with AVX-512 VBMI byte permutes.
///
/// The anchor pairs are split into buckets by their first byte (one bucket per
/// distinct first byte, the two cases of a letter together; beyond 64 first
/// bytes, buckets are shared). Three 128-entry tables per 8 buckets map a byte
/// to the buckets it may start (first byte), continue (second byte) or follow
/// (the group's `third` bytes); a position is a candidate when some bucket
/// accepts its three bytes. With at most 64 distinct first bytes the first two
/// are exactly "the pair is anchored"; shared buckets and the union of third
/// bytes only add candidates, and every candidate is checked exactly.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// The tables: for each group of 8 buckets, the first-, second- and
    /// third-byte maps, each 128 bytes (ASCII only: pairs with other bytes
    /// disable the filter, and any third byte >= 128 passes).
    #[derive(Debug)]
    pub(super) struct PairFilter {
        tables: Vec<[[u8; 128]; 3]>,
    }

    impl PairFilter {
        /// The filter for the pairs set in `table`, if the CPU supports it and
        /// every anchored pair is ASCII.
        pub(super) fn new(table: &[u8; 1 << 16], third: &[[u64; 4]; 256]) -> Option<PairFilter> {
            if !(is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vbmi"))
            {
                return None;
            }
            let pairs: Vec<(u8, u8)> = (0..=u16::MAX)
                .filter(|&i| table[usize::from(i)] != 0)
                .map(|i| (i as u8, (i >> 8) as u8))
                .collect();
            if pairs.is_empty() || pairs.iter().any(|&(a, b)| a >= 128 || b >= 128) {
                return None;
            }
            // Pairs that any byte may follow get buckets of their own, so
            // that they do not open the third-byte test of the others.
            let next =
                |a: u8, b: u8| &third[usize::from(table[usize::from(u16::from_le_bytes([a, b]))])];
            let key = |a: u8, b: u8| (a.to_ascii_lowercase(), next(a, b) == &[u64::MAX; 4]);
            let mut keys: Vec<(u8, bool)> = pairs.iter().map(|&(a, b)| key(a, b)).collect();
            keys.sort_unstable();
            keys.dedup();
            let buckets = keys.len().min(64);
            let mut tables = vec![[[0u8; 128]; 3]; buckets.div_ceil(8)];
            for (a, b) in pairs {
                let rank = keys.iter().position(|&x| x == key(a, b)).unwrap_or(0);
                let bucket = rank % 64;
                let bit = 1 << (bucket % 8);
                let t = &mut tables[bucket / 8];
                t[0][usize::from(a)] |= bit;
                t[1][usize::from(b)] |= bit;
                let next = next(a, b);
                for c in 0..128 {
                    if next[c >> 6] >> (c & 63) & 1 == 1 {
                        t[2][c] |= bit;
                    }
                }
            }
            Some(PairFilter { tables })
        }

        /// Calls `f(position)` for every candidate position `p` with `p + 66 <=
        /// data.len()` in 64-byte blocks; returns where the blocks stopped.
        pub(super) fn candidates(&self, data: &[u8], f: impl FnMut(usize)) -> usize {
            // SAFETY: `new` only builds a filter when the CPU has these features.
            unsafe { self.candidates_avx512(data, f) }
        }

        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        fn candidates_avx512(&self, data: &[u8], mut f: impl FnMut(usize)) -> usize {
            let load = |b: &[u8; 64]| {
                // SAFETY: reads exactly the 64 bytes of `b`.
                unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
            };
            let mut i = 0;
            while let Some(w) = data.get(i..i + 66) {
                let (Ok(w0), Ok(w1), Ok(w2)) = (
                    <&[u8; 64]>::try_from(&w[..64]),
                    <&[u8; 64]>::try_from(&w[1..65]),
                    <&[u8; 64]>::try_from(&w[2..]),
                ) else {
                    break;
                };
                let (v0, v1, v2) = (load(w0), load(w1), load(w2));
                // Bytes >= 128 start and continue no pair (the tables are
                // ASCII); as third bytes they pass.
                let (a0, a1) = (!_mm512_movepi8_mask(v0), !_mm512_movepi8_mask(v1));
                let high2 = _mm512_movepi8_mask(v2);
                let mut acc = _mm512_setzero_si512();
                for t in &self.tables {
                    let map = |m: &[u8; 128], v| {
                        _mm512_permutex2var_epi8(load(first_half(m)), v, load(second_half(m)))
                    };
                    let starts = _mm512_maskz_mov_epi8(a0, map(&t[0], v0));
                    let seconds = _mm512_maskz_mov_epi8(a1, map(&t[1], v1));
                    let thirds = _mm512_mask_mov_epi8(map(&t[2], v2), high2, _mm512_set1_epi8(-1));
                    // acc | (starts & seconds & thirds)
                    acc = _mm512_or_si512(
                        acc,
                        _mm512_ternarylogic_epi64::<0x80>(starts, seconds, thirds),
                    );
                }
                let mut m = _mm512_test_epi8_mask(acc, acc);
                while m != 0 {
                    f(i + m.trailing_zeros() as usize);
                    m &= m - 1;
                }
                i += 64;
            }
            i
        }
    }

    fn first_half(t: &[u8; 128]) -> &[u8; 64] {
        t.first_chunk().unwrap_or(&[0; 64])
    }

    fn second_half(t: &[u8; 128]) -> &[u8; 64] {
        t.last_chunk().unwrap_or(&[0; 64])
    }
}

/// The pair test of 32 positions at once with AVX2 nibble lookups.
///
/// AVX2 has no 128-entry byte permute, only `vpshufb`, a 16-entry lookup per
/// 128-bit lane, so each byte is looked up by its low and its high nibble and
/// the two results are AND-ed (as Teddy does). Buckets start as those of the
/// AVX-512 filter (one per distinct first byte and "any third byte" flag), 8
/// per table: for each of the first, second and third byte, a bucket accepts
/// a byte when it accepts both its nibbles, so it accepts the products of the
/// nibbles of its bytes. That is exact for a lone first byte (the two cases of
/// a letter differ in one high-nibble bit) and only adds candidates
/// otherwise: every candidate is checked on the pair table, then exactly.
/// Each table costs 6 lookups per step, so buckets are merged down to
/// `MAX_BUCKETS`, the pairs of buckets whose union adds the fewest estimated
/// candidates first. Non-ASCII bytes are looked up like any other, so unlike
/// the AVX-512 filter this one has no ASCII restriction.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// At most this many buckets (5 tables). Measured on the bench's clean
    /// payloads with gitleaks' rules (55 keys): 16 buckets let 10.0 k of the
    /// 50 k positions through, 24 let 5.5 k, 40 let 3.0 k and 64 (7 tables)
    /// 2.5 k; the whole scan took fewest cycles with 24 to 40 (`perf stat`:
    /// 91 k cycles at 16, 73-76 k at 24-40, 83 k at 64), and 40 keeps the
    /// candidates low on text with more keyword-like letters.
    const MAX_BUCKETS: usize = 40;

    /// Per 8 buckets: the low- and high-nibble tables of the first, second and
    /// third bytes, each 16 entries repeated for both lanes of `vpshufb`.
    #[derive(Debug)]
    pub(super) struct PairFilter {
        tables: Vec<[[u8; 32]; 6]>,
    }

    impl PairFilter {
        /// The filter for the pairs set in `table`, if the CPU has AVX2.
        pub(super) fn new(table: &[u8; 1 << 16], third: &[[u64; 4]; 256]) -> Option<PairFilter> {
            if !is_x86_feature_detected!("avx2") {
                return None;
            }
            // One bucket per key, as in the AVX-512 filter: pairs that any
            // byte may follow get buckets of their own, so that they do not
            // open the third-byte test of the others.
            let mut by_key: std::collections::BTreeMap<(u8, bool), Bucket> = Default::default();
            for i in 0..=u16::MAX {
                let g = table[usize::from(i)];
                if g == 0 {
                    continue;
                }
                let (a, b) = (i as u8, (i >> 8) as u8);
                let next = &third[usize::from(g)];
                let any = next == &[u64::MAX; 4];
                let bucket = by_key.entry((a.to_ascii_lowercase(), any)).or_default();
                bucket.add(0, a);
                bucket.add(2, b);
                for c in 0..=255u8 {
                    if next[usize::from(c >> 6)] >> (c & 63) & 1 == 1 {
                        bucket.add(4, c);
                    }
                }
            }
            let mut buckets: Vec<Bucket> = by_key.into_values().collect();
            if buckets.is_empty() {
                return None;
            }
            merge(&mut buckets, MAX_BUCKETS);
            let mut tables = vec![[[0u8; 32]; 6]; buckets.len().div_ceil(8)];
            for (i, bucket) in buckets.iter().enumerate() {
                let t = &mut tables[i / 8];
                for (k, &mask) in bucket.0.iter().enumerate() {
                    for n in 0..16 {
                        if mask >> n & 1 == 1 {
                            t[k][n] |= 1 << (i % 8);
                            t[k][16 + n] |= 1 << (i % 8);
                        }
                    }
                }
            }
            Some(PairFilter { tables })
        }

        /// Calls `f(position)` for every candidate position `p` with `p + 34 <=
        /// data.len()` in 32-byte blocks; returns where the blocks stopped.
        pub(super) fn candidates(&self, data: &[u8], f: impl FnMut(usize)) -> usize {
            // SAFETY: `new` only builds a filter when the CPU has AVX2.
            unsafe { self.candidates_avx2(data, f) }
        }

        #[target_feature(enable = "avx2")]
        fn candidates_avx2(&self, data: &[u8], mut f: impl FnMut(usize)) -> usize {
            let load = |b: &[u8; 32]| {
                // SAFETY: reads exactly the 32 bytes of `b`.
                unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
            };
            let low = _mm256_set1_epi8(0x0f);
            // The nibbles of 32 bytes: `vpshufb` indices.
            let nibbles = |v| {
                (
                    _mm256_and_si256(v, low),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
                )
            };
            let mut i = 0;
            while let Some(w) = data.get(i..i + 34) {
                let (Ok(w0), Ok(w1), Ok(w2)) = (
                    <&[u8; 32]>::try_from(&w[..32]),
                    <&[u8; 32]>::try_from(&w[1..33]),
                    <&[u8; 32]>::try_from(&w[2..]),
                ) else {
                    break;
                };
                let (l0, h0) = nibbles(load(w0));
                let (l1, h1) = nibbles(load(w1));
                let (l2, h2) = nibbles(load(w2));
                let mut acc = _mm256_setzero_si256();
                for t in &self.tables {
                    let map = |k: usize, l, h| {
                        _mm256_and_si256(
                            _mm256_shuffle_epi8(load(&t[k]), l),
                            _mm256_shuffle_epi8(load(&t[k + 1]), h),
                        )
                    };
                    let hit = _mm256_and_si256(
                        _mm256_and_si256(map(0, l0, h0), map(2, l1, h1)),
                        map(4, l2, h2),
                    );
                    acc = _mm256_or_si256(acc, hit);
                }
                let zero = _mm256_cmpeq_epi8(acc, _mm256_setzero_si256());
                let mut m = !(_mm256_movemask_epi8(zero) as u32);
                while m != 0 {
                    f(i + m.trailing_zeros() as usize);
                    m &= m - 1;
                }
                i += 32;
            }
            i
        }
    }

    /// A bucket as its nibble sets: bit `n` of `.0[2 * k]` (`.0[2 * k + 1]`)
    /// is set when the bucket accepts low (high) nibble `n` as byte `k` of a
    /// pair and its next byte (k = 0, 1, 2). The bucket accepts a byte at `k`
    /// when it accepts both its nibbles.
    #[derive(Clone, Copy, Debug, Default)]
    struct Bucket([u16; 6]);

    impl Bucket {
        fn add(&mut self, k: usize, byte: u8) {
            self.0[k] |= 1 << (byte & 15);
            self.0[k + 1] |= 1 << (byte >> 4);
        }

        fn union(&self, other: &Bucket) -> Bucket {
            Bucket(std::array::from_fn(|k| self.0[k] | other.0[k]))
        }

        /// Estimated share of text positions the bucket accepts.
        fn cost(&self, share: &[f64; 256]) -> f64 {
            (0..3)
                .map(|k| {
                    let (lo, hi) = (self.0[2 * k], self.0[2 * k + 1]);
                    let bits = |m: u16| (0..16).filter(move |&n| m >> n & 1 == 1);
                    bits(hi)
                        .flat_map(|h| bits(lo).map(move |l| share[h << 4 | l]))
                        .sum::<f64>()
                })
                .product()
        }
    }

    /// Merges buckets until at most `max` are left, each time the two whose
    /// union adds the fewest estimated candidates (byte frequencies from
    /// `byte_weight`, capitals rarer): each table of 8 buckets costs 6
    /// lookups per 32 positions, a false candidate costs a pair-table load.
    fn merge(buckets: &mut Vec<Bucket>, max: usize) {
        let weight = |x: u8| {
            let w = super::byte_weight(x.to_ascii_lowercase()) as f64;
            if x.is_ascii_uppercase() {
                w / 8.0
            } else {
                w
            }
        };
        let total: f64 = (0..=255u8).map(weight).sum();
        let share: [f64; 256] = std::array::from_fn(|x| weight(x as u8) / total);
        let cost = |b: &Bucket| b.cost(&share);
        let n = buckets.len();
        let mut costs: Vec<f64> = buckets.iter().map(cost).collect();
        // united[i][j], i < j: the cost of the union of buckets i and j.
        let mut united = vec![vec![0.0; n]; n];
        for i in 0..n {
            for j in i + 1..n {
                united[i][j] = cost(&buckets[i].union(&buckets[j]));
            }
        }
        let mut alive = vec![true; n];
        let mut left = n;
        while left > max {
            let mut best = (f64::INFINITY, 0, 0);
            for i in (0..n).filter(|&i| alive[i]) {
                for j in (i + 1..n).filter(|&j| alive[j]) {
                    let added = united[i][j] - costs[i] - costs[j];
                    if added < best.0 {
                        best = (added, i, j);
                    }
                }
            }
            let (_, i, j) = best;
            buckets[i] = buckets[i].union(&buckets[j]);
            costs[i] = united[i][j];
            alive[j] = false;
            left -= 1;
            for k in (0..n).filter(|&k| alive[k] && k != i) {
                united[i.min(k)][i.max(k)] = cost(&buckets[i].union(&buckets[k]));
            }
        }
        let mut k = 0;
        buckets.retain(|_| {
            k += 1;
            alive[k - 1]
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every occurrence of every keyword, by a plain search over a lowercased copy.
    fn plain(keywords: &[String], data: &[u8]) -> Vec<(usize, usize)> {
        let lower = data.to_ascii_lowercase();
        let mut out = Vec::new();
        for (i, k) in keywords.iter().enumerate() {
            let k = k.as_bytes().to_ascii_lowercase();
            for p in 0..lower.len() {
                if lower[p..].starts_with(&k) {
                    out.push((i, p));
                }
            }
        }
        out.sort_unstable();
        out
    }

    /// Whether this CPU can run `path`.
    fn cpu_has(path: Path) -> bool {
        match path {
            Path::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vbmi")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// One finder per code path this CPU has, each forced. A path may fall
    /// back to a narrower one for some keyword sets (the AVX-512 filter needs
    /// ASCII pairs, so not with one-byte or non-ASCII keywords).
    fn every_path(kws: &[String]) -> Vec<KeywordFinder> {
        [Path::Portable, Path::Avx2, Path::Avx512]
            .into_iter()
            .filter(|&p| cpu_has(p))
            .map(|p| {
                let f = KeywordFinder::with_path(kws, p);
                assert!(f.path() <= p);
                f
            })
            .collect()
    }

    fn found(f: &KeywordFinder, data: &[u8]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        f.for_each(data, |k, s, e| {
            assert_eq!(e - s, f.keywords[k].len());
            out.push((k, s));
        });
        out.sort_unstable();
        out
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Random keyword sets (1 to 12 bytes, including one-byte keywords, shared
    /// anchors, keywords inside keywords and, sometimes, a non-ASCII keyword)
    /// over random payloads built from a small alphabet, in random case, at
    /// every length up to 40 and at lengths around the SIMD block (so
    /// occurrences sit at the start, at the end and across the 8-byte steps and
    /// 32- and 64-byte blocks): every code path the CPU has (portable, AVX2,
    /// AVX-512) reports exactly what a plain search reports.
    #[test]
    fn random_keywords_and_payloads_agree_with_plain_search() {
        let mut r = Rng(0x2545f4914f6cdd1d);
        let alphabet = b"abkeyT_.-0\xc3\xa9";
        for round in 0..300 {
            let nk = 1 + r.below(12);
            let mut kws: Vec<String> = Vec::new();
            while kws.len() < nk {
                let len = 1 + if r.next() & 1 == 0 {
                    r.below(4)
                } else {
                    r.below(12)
                };
                let k: Vec<u8> = (0..len)
                    .map(|_| alphabet[r.below(alphabet.len() - 2)].to_ascii_lowercase())
                    .collect();
                let k = String::from_utf8(k).unwrap_or_default();
                if !kws.contains(&k) {
                    kws.push(k);
                }
            }
            if round % 10 == 0 {
                kws.push("\u{e9}t".to_string());
            }
            let finders = every_path(&kws);
            for len in (0..40).chain(60..75).chain([128, 129, 200, 301]) {
                let mut data: Vec<u8> = (0..len)
                    .map(|_| alphabet[r.below(alphabet.len())])
                    .collect();
                // Plant keywords in random case.
                for _ in 0..1 + len / 16 {
                    let k = kws[r.below(kws.len())].as_bytes();
                    if len > k.len() {
                        let at = r.below(len - k.len());
                        for (d, &c) in data[at..].iter_mut().zip(k) {
                            *d = if r.next() & 1 == 0 {
                                c.to_ascii_uppercase()
                            } else {
                                c
                            };
                        }
                    }
                }
                let want = plain(&kws, &data);
                for f in &finders {
                    assert_eq!(found(f, &data), want, "{kws:?} {data:?}");
                }
            }
        }
    }

    /// More than 255 anchor pairs share table groups, more than 64 distinct
    /// first bytes share SIMD buckets; nothing is lost or doubled.
    #[test]
    fn many_keywords_share_groups_and_buckets() {
        let mut kws: Vec<String> = (0..600u32)
            .map(|i| format!("{}{}q", (b'a' + (i % 26) as u8) as char, i))
            .collect();
        kws.extend((0x21u8..0x7f).map(|c| format!("{}\x7f", c as char)));
        kws.sort();
        kws.dedup();
        let mut text: String = kws.iter().rev().map(|k| k.to_uppercase() + " ").collect();
        text.push_str(&kws.concat());
        let want = plain(&kws, text.as_bytes());
        assert!(want.len() > kws.len());
        let finders = every_path(&kws);
        for f in &finders {
            assert_eq!(found(f, text.as_bytes()), want, "{:?}", f.path());
        }
        let widest = finders.iter().map(KeywordFinder::path).max();
        assert_eq!(
            KeywordFinder::new(&kws).path(),
            widest.unwrap_or(Path::Portable).min(Path::allowed()),
            "the widest path the CPU (and MOAT_SECRETS_SIMD) allows is used"
        );
    }

    /// gitleaks' own keywords over its samples (upper-cased, as is and
    /// concatenated, in payloads longer than the SIMD blocks): every code path
    /// the CPU has agrees with a plain search.
    #[test]
    fn gitleaks_keywords_over_gitleaks_samples() {
        let dir = std::env::var_os("MOAT_SHARED_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared")
            })
            .join("datasets/gitleaks/");
        let (Ok(toml), Ok(samples)) = (
            std::fs::read_to_string(dir.join("gitleaks.toml")),
            std::fs::read_to_string(dir.join("samples-dev.jsonl")),
        ) else {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "skipped: the gitleaks corpus is not at {} (put shared/ beside the checkout or set MOAT_SHARED_DIR)",
                dir.display());
            return;
        };
        let set = crate::RuleSet::from_toml(&toml, "gitleaks.toml").expect("rules");
        let mut kws: Vec<String> = set.rules.iter().flat_map(|r| r.keywords.clone()).collect();
        kws.sort();
        kws.dedup();
        let lines: Vec<&str> = samples.lines().collect();
        let finders = every_path(&kws);
        for (f, p) in finders
            .iter()
            .zip([Path::Portable, Path::Avx2, Path::Avx512])
        {
            assert_eq!(f.path(), p, "each path runs on gitleaks' keywords");
        }
        let mut hits = 0;
        for chunk in lines.chunks(25) {
            let payload = chunk.join("\n").to_uppercase() + &chunk.concat();
            let want = plain(&kws, payload.as_bytes());
            hits += want.len();
            for f in &finders {
                assert_eq!(found(f, payload.as_bytes()), want);
            }
        }
        assert!(hits > 1000, "{hits}");
    }

    /// Anchors avoid common English pairs when the keyword has a rarer one.
    #[test]
    fn anchors_prefer_rare_pairs() {
        let f = KeywordFinder::new(&["token".to_string(), "password".to_string()]);
        let anchored = |a: &[u8; 2]| f.table[usize::from(u16::from_le_bytes(*a))] != 0;
        assert!(!anchored(b"to") && !anchored(b"en") && !anchored(b"pa"));
        assert!(anchored(b"ok") || anchored(b"ke"));
        assert!(anchored(b"sw") || anchored(b"wo"));
        assert!(anchored(b"OK") || anchored(b"KE"));
    }
}
