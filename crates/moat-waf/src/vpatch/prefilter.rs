//! Request-level prefilter of the virtual patches.
//!
//! At build time every condition's required literals (its `equals`, `prefix`,
//! `suffix` and `contains` strings, lowercased as the matcher compares them) and
//! every rule's path anchor (its longest literal path segment) are collected per
//! place: the decoded path, the raw path, the decoded query, the decoded body and
//! each header name a condition names (`any` conditions and header conditions with
//! a name prefix go to an automaton run over every header). Each place gets one
//! ASCII case-insensitive Aho-Corasick automaton; a request runs it once over the
//! place (every match, overlapping ones included) and records which conditions
//! have at least one of their literals there. A condition none of whose literals
//! occurs cannot hold (`equals`, `prefix` and `suffix` imply `contains`), so a rule
//! is evaluated only when its conditions can still hold per its `when`/`when_any`
//! logic; the exact evaluation afterwards is unchanged. Conditions without a
//! literal (presence tests) count as possible; parameter conditions are decided
//! by the parameter facts the inspector already computed.
//!
//! Each automaton also has gate bytes when its needles allow it: at most three
//! bytes such that every needle contains one of them (`{` for `${`/`%{`, `$` for
//! the Log4Shell lookups), so a value without them (most User-Agents, queries and
//! paths) costs one `memchr` instead of an automaton walk.

use aho_corasick::automaton::Automaton;
use aho_corasick::dfa::DFA;
use aho_corasick::{Anchored, MatchKind};

use super::{Cond, Place};

/// Collects the needles of every place.
#[derive(Debug, Default)]
pub(super) struct PrefilterBuilder {
    /// Decoded path (path conditions and path anchors).
    pub(super) path: ScannerBuilder,
    raw_path: ScannerBuilder,
    query: ScannerBuilder,
    body: ScannerBuilder,
    headers: Vec<(String, ScannerBuilder)>,
    every_header: ScannerBuilder,
}

impl PrefilterBuilder {
    /// Adds a test string of condition `c` (not a parameter condition) as prefilter bit `bit`.
    pub(super) fn add(&mut self, c: &Cond, needle: &str, bit: u32) {
        match c.place {
            Place::Path => self.path.add(needle, bit),
            Place::RawPath => self.raw_path.add(needle, bit),
            Place::Query => self.query.add(needle, bit),
            Place::Body => self.body.add(needle, bit),
            Place::Header => match &c.name {
                Some((n, false)) => match self.headers.iter_mut().find(|(k, _)| k == n) {
                    Some((_, b)) => b.add(needle, bit),
                    None => {
                        let mut b = ScannerBuilder::default();
                        b.add(needle, bit);
                        self.headers.push((n.clone(), b));
                    }
                },
                // a name prefix (`*`: every header)
                _ => self.every_header.add(needle, bit),
            },
            Place::Any => {
                self.path.add(needle, bit);
                self.query.add(needle, bit);
                self.every_header.add(needle, bit);
                self.body.add(needle, bit);
            }
            // decided by the parameter facts
            Place::Param | Place::ParamName => {}
        }
    }

    /// Builds every automaton.
    pub(super) fn build(self) -> Result<Prefilter, String> {
        let mut headers = Vec::new();
        for (n, b) in self.headers {
            if let Some(s) = b.build()? {
                headers.push((n, s));
            }
        }
        headers.sort_by_key(|(n, _)| n.len().min(63));
        let mut header_by_len = vec![(0u16, 0u16); 64];
        for (i, (n, _)) in headers.iter().enumerate() {
            let i = u16::try_from(i).map_err(|_| "too many header names".to_string())?;
            if let Some(r) = header_by_len.get_mut(n.len().min(63)) {
                if r.0 == r.1 {
                    *r = (i, i + 1);
                } else {
                    r.1 = i + 1;
                }
            }
        }
        // the path and the raw path are the same bytes unless the path has an
        // escape (most requests): one automaton sets the bits of both
        let path_raw = if self.raw_path.pats.is_empty() {
            None
        } else {
            let mut both = ScannerBuilder::default();
            for b in [&self.path, &self.raw_path] {
                for (pat, bits) in b.pats.iter().zip(&b.sets) {
                    for &bit in bits {
                        both.add(pat, bit);
                    }
                }
            }
            both.build()?
        };
        Ok(Prefilter {
            path_raw,
            path_ascii: self.path.pats.iter().all(|p| p.is_ascii()),
            path: self.path.build()?,
            raw_path: self.raw_path.build()?,
            query: self.query.build()?,
            body: self.body.build()?,
            headers,
            header_by_len,
            every_header: self.every_header.build()?,
        })
    }
}

/// Collects the needles of one place before its automaton is built.
#[derive(Debug, Default)]
pub(super) struct ScannerBuilder {
    /// Distinct needles (lowercase).
    pats: Vec<String>,
    /// Per needle: the condition bits it sets.
    sets: Vec<Vec<u32>>,
}

impl ScannerBuilder {
    /// Adds `needle` (lowercase, non-empty) as a literal of condition `bit`.
    pub(super) fn add(&mut self, needle: &str, bit: u32) {
        match self.pats.iter().position(|p| p == needle) {
            Some(i) => {
                if let Some(s) = self.sets.get_mut(i) {
                    if !s.contains(&bit) {
                        s.push(bit);
                    }
                }
            }
            None => {
                self.pats.push(needle.to_string());
                self.sets.push(vec![bit]);
            }
        }
    }

    /// Builds the automaton (`None` without needles).
    pub(super) fn build(self) -> Result<Option<Scanner>, String> {
        if self.pats.is_empty() {
            return Ok(None);
        }
        // standard semantics: every state lists every needle ending there
        // (overlapping ones included); no prefilter: the gate bytes do that job
        let dfa = DFA::builder()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .prefilter(false)
            .build(&self.pats)
            .map_err(|e| format!("virtual-patch prefilter: {e}"))?;
        let gate = gate_bytes(&self.pats);
        Ok(Some(Scanner {
            gate: match *gate.as_slice() {
                [a] => Some([a, a, a]),
                [a, b] => Some([a, b, b]),
                [a, b, c] => Some([a, b, c]),
                _ => None,
            },
            dfa,
            sets: self.sets,
        }))
    }
}

/// One place's automaton.
#[derive(Debug, Clone)]
pub(super) struct Scanner {
    dfa: DFA,
    /// Up to three bytes (both cases of letters, repeated to fill) one of which
    /// every needle contains; `None` when no such small set exists.
    gate: Option<[u8; 3]>,
    /// Per pattern id: the condition bits it sets.
    sets: Vec<Vec<u32>>,
}

impl Scanner {
    /// Runs the automaton once over `hay` and sets the bits of every needle found.
    pub(super) fn scan(&self, hay: &[u8], seen: &mut Bits) {
        if !self.gated(hay, None) {
            return;
        }
        // one DFA transition per byte; a match state lists every needle that
        // ends at this byte (the overlapping search, without its per-call set-up)
        let Ok(mut sid) = self.dfa.start_state(Anchored::No) else {
            // cannot happen for an unanchored automaton; if it did, every
            // condition of this place stays possible (exact evaluation decides)
            for &b in self.sets.iter().flatten() {
                seen.set(b);
            }
            return;
        };
        for &byte in hay {
            sid = self.dfa.next_state(Anchored::No, sid, byte);
            if self.dfa.is_special(sid) && self.dfa.is_match(sid) {
                for i in 0..self.dfa.match_len(sid) {
                    let p = self.dfa.match_pattern(sid, i).as_usize();
                    for &b in self.sets.get(p).map(Vec::as_slice).unwrap_or(&[]) {
                        seen.set(b);
                    }
                }
            }
        }
    }
}

impl Scanner {
    /// False when `hay` holds no gate byte (nor `extra`): no needle can occur
    /// in it. Short values use a byte loop (the SIMD search's set-up costs more).
    pub(super) fn gated(&self, hay: &[u8], extra: Option<u8>) -> bool {
        let Some([a, b, c]) = self.gate else {
            return true;
        };
        let d = extra.unwrap_or(a);
        if hay.len() < 16 {
            return hay.iter().any(|&x| x == a || x == b || x == c || x == d);
        }
        if d == a || d == b || d == c {
            memchr::memchr3(a, b, c, hay).is_some()
        } else if a == b && b == c {
            memchr::memchr2(a, d, hay).is_some()
        } else if b == c {
            memchr::memchr3(a, b, d, hay).is_some()
        } else {
            memchr::memchr3(a, b, c, hay).is_some() || memchr::memchr(d, hay).is_some()
        }
    }
}

/// Bytes every needle contains one of, at most three (letters in both cases), or
/// empty. Greedy: rare bytes first (punctuation other than `/ . - _` and space,
/// then those, then letters and digits), among them the one most needles share;
/// when that needs more than three bytes, the byte most needles share first.
fn gate_bytes(needles: &[String]) -> Vec<u8> {
    let rare_first = greedy_gate(needles, false);
    if rare_first.is_empty() {
        greedy_gate(needles, true)
    } else {
        rare_first
    }
}

fn greedy_gate(needles: &[String], count_first: bool) -> Vec<u8> {
    let rank = |b: u8| {
        if b.is_ascii_alphanumeric() {
            2u8
        } else if matches!(b, b'/' | b'.' | b'-' | b'_' | b' ') {
            1
        } else {
            0
        }
    };
    let mut left: Vec<&[u8]> = needles.iter().map(|n| n.as_bytes()).collect();
    let mut out: Vec<u8> = Vec::new();
    while !left.is_empty() {
        // (key, byte): the smallest key wins
        let mut best: Option<((usize, usize), u8)> = None;
        for n in &left {
            for &b in n.iter() {
                let count = left.iter().filter(|m| m.contains(&b)).count();
                let (r, c) = (usize::from(rank(b)), usize::MAX - count);
                let key = if count_first { (c, r) } else { (r, c) };
                if best.is_none_or(|(k, _)| key < k) {
                    best = Some((key, b));
                }
            }
        }
        let Some((_, b)) = best else {
            return Vec::new();
        };
        left.retain(|n| !n.contains(&b));
        out.push(b);
        if b.is_ascii_lowercase() {
            out.push(b.to_ascii_uppercase());
        }
        if out.len() > 3 {
            return Vec::new();
        }
    }
    out
}

/// A set of condition bits, on the stack for up to 256 conditions.
#[derive(Debug, Default)]
pub(super) struct Bits {
    small: [u64; 4],
    more: Vec<u64>,
}

impl Bits {
    /// Sets bit `b`.
    pub(super) fn set(&mut self, b: u32) {
        let (w, m) = ((b / 64) as usize, 1u64 << (b % 64));
        match self.small.get_mut(w) {
            Some(x) => *x |= m,
            None => {
                let i = w - self.small.len();
                if self.more.len() <= i {
                    self.more.resize(i + 1, 0);
                }
                if let Some(x) = self.more.get_mut(i) {
                    *x |= m;
                }
            }
        }
    }

    /// Calls `f` with every set bit, in increasing order.
    pub(super) fn for_each(&self, mut f: impl FnMut(u32)) {
        for (w, &word) in self.small.iter().chain(&self.more).enumerate() {
            let mut x = word;
            while x != 0 {
                let t = x.trailing_zeros();
                f((w as u32) * 64 + t);
                x &= x - 1;
            }
        }
    }

    /// True when bit `b` is set.
    pub(super) fn get(&self, b: u32) -> bool {
        let (w, m) = ((b / 64) as usize, 1u64 << (b % 64));
        let word = match self.small.get(w) {
            Some(x) => *x,
            None => self.more.get(w - self.small.len()).copied().unwrap_or(0),
        };
        word & m != 0
    }
}

/// The automata of a rule set, one per place.
#[derive(Debug, Clone, Default)]
pub(super) struct Prefilter {
    /// Decoded path: path conditions and path anchors.
    pub(super) path: Option<Scanner>,
    /// Path as received.
    pub(super) raw_path: Option<Scanner>,
    /// The needles of `path` and `raw_path` in one automaton, for a path that
    /// needs no decoding (`None` without raw-path needles).
    pub(super) path_raw: Option<Scanner>,
    /// Every `path` needle is ASCII: in a path without escapes, the needles
    /// occur in the bytes as received exactly where they occur decoded.
    pub(super) path_ascii: bool,
    /// Decoded query string.
    pub(super) query: Option<Scanner>,
    /// Decoded body.
    pub(super) body: Option<Scanner>,
    /// Header conditions by exact (lowercase) header name, sorted by name length.
    pub(super) headers: Vec<(String, Scanner)>,
    /// Per name length n (longer names: 63): the range of `headers` with that length.
    pub(super) header_by_len: Vec<(u16, u16)>,
    /// `any` conditions and header conditions with a name prefix: every header.
    pub(super) every_header: Option<Scanner>,
}

impl Prefilter {
    /// Scans every header value the header automata concern.
    pub(super) fn scan_headers(&self, headers: &[(&str, &[u8])], seen: &mut Bits) {
        for (n, v) in headers {
            if let Some(s) = &self.every_header {
                s.scan(v, seen);
            }
            let Some(&(from, to)) = self.header_by_len.get(n.len().min(63)) else {
                continue;
            };
            for (name, s) in self
                .headers
                .get(usize::from(from)..usize::from(to))
                .unwrap_or(&[])
            {
                // header names usually arrive lowercase (`http` normalises them)
                if name.len() == n.len()
                    && (name.as_bytes() == n.as_bytes()
                        || name.as_bytes().eq_ignore_ascii_case(n.as_bytes()))
                {
                    s.scan(v, seen);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: &[&str]) -> Vec<u8> {
        gate_bytes(&n.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn gates() {
        assert_eq!(g(&["%{", "${"]), b"{".to_vec());
        assert_eq!(g(&["${jndi:", "${${", "${::-j}"]), b"$".to_vec());
        assert_eq!(g(&["x-f5-auth-token"]), b"-".to_vec());
        assert_eq!(g(&["folder_add_by_path", "session_setvars"]), b"_".to_vec());
        // rare bytes need four (`$ ? f F`): the shared `e` instead
        assert_eq!(g(&["${", "freemarker", "?new("]), b"eE$".to_vec());
        assert_eq!(g(&["abcd", "efgh", "ijkl"]), Vec::<u8>::new());
    }

    #[test]
    fn bits() {
        let mut b = Bits::default();
        for i in [0u32, 63, 64, 255, 256, 1000] {
            assert!(!b.get(i));
            b.set(i);
            assert!(b.get(i));
        }
        assert!(!b.get(1));
        assert!(!b.get(999));
        let mut all = Vec::new();
        b.for_each(|x| all.push(x));
        assert_eq!(all, [0, 63, 64, 255, 256, 1000]);
    }

    #[test]
    fn overlapping_needles_all_found() {
        let mut sb = ScannerBuilder::default();
        sb.add("${", 0);
        sb.add("${jndi:", 1);
        sb.add("jndi", 2);
        sb.add("absent", 3);
        let s = match sb.build() {
            Ok(Some(s)) => s,
            other => panic!("{other:?}"),
        };
        let mut seen = Bits::default();
        s.scan(b"x=${JNDI:ldap://a}", &mut seen);
        assert!(seen.get(0) && seen.get(1) && seen.get(2));
        assert!(!seen.get(3));
        let mut none = Bits::default();
        s.scan(b"jnd i", &mut none);
        assert!(!none.get(0) && !none.get(1) && !none.get(2));
    }
}
