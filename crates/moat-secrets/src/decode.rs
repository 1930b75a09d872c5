//! gitleaks' recursive decoding (detect/codec in gitleaks v8.30.1): encoded
//! segments (percent, unicode escapes, hex, base64) are found in a text,
//! decoded in place, and the result is scanned again; positions found in a
//! decoded text are mapped back to the original encoded segment.
//!
//! Every decoder shrinks its input (three hex or percent characters, two hex
//! digits, four base64 characters or a six-character `\uXXXX` escape make at
//! most three bytes), so each pass is shorter than the one before and the work
//! is bounded by the number of passes; [`DecodeLimits::max_decoded_bytes`]
//! bounds the decoded text kept in total besides.

#[cfg(any(test, feature = "fuzzing"))]
use regex_automata::meta::Regex;
#[cfg(any(test, feature = "fuzzing"))]
use regex_automata::util::syntax;
#[cfg(any(test, feature = "fuzzing"))]
use std::sync::OnceLock;

/// gitleaks' default `--max-decode-depth` (v8.30.1).
pub const GITLEAKS_DEFAULT_DECODE_DEPTH: usize = 5;

/// Largest decode depth accepted anywhere (the scanner caps larger values).
/// Each pass shrinks the text, so deeper passes rarely find anything new.
pub const MAX_DECODE_DEPTH: usize = 64;

/// Bounds of the decoding passes of one scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Decoding passes after the scan of the original text (0: no decoding).
    pub max_depth: usize,
    /// Total bytes of decoded text one scan may produce over all passes; the
    /// pass that would go past it is not scanned and decoding stops there.
    pub max_decoded_bytes: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_depth: 0,
            max_decoded_bytes: 16 << 20,
        }
    }
}

/// A half-open range as gitleaks' `startEnd` (its overlap test is inclusive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub start: i64,
    pub end: i64,
}

impl Span {
    fn new(start: usize, end: usize) -> Span {
        Span {
            start: start as i64,
            end: end as i64,
        }
    }

    /// gitleaks `overlaps`: touching ranges overlap.
    pub fn overlaps(self, o: Span) -> bool {
        o.start <= self.end && o.end >= self.start
    }

    fn contains(self, o: Span) -> bool {
        self.start <= o.start && o.end <= self.end
    }

    fn merge(self, o: Span) -> Span {
        Span {
            start: self.start.min(o.start),
            end: self.end.max(o.end),
        }
    }

    /// `p.encoded.add(p.decoded.overflow(o))`.
    fn shift_overflow(self, decoded: Span, o: Span) -> Span {
        let m = decoded.merge(o);
        Span {
            start: self.start + (m.start - decoded.start),
            end: self.end + (m.end - decoded.end),
        }
    }
}

/// Encoding bits, in gitleaks' order (its tag order too).
pub(crate) const PERCENT: u8 = 1;
pub(crate) const UNICODE: u8 = 2;
pub(crate) const HEX: u8 = 4;
pub(crate) const BASE64: u8 = 8;

/// Names of the encodings in `bits`, in gitleaks' order.
pub(crate) fn encoding_names(bits: u8) -> Vec<&'static str> {
    [
        (PERCENT, "percent"),
        (UNICODE, "unicode"),
        (HEX, "hex"),
        (BASE64, "base64"),
    ]
    .iter()
    .filter(|(b, _)| bits & b != 0)
    .map(|&(_, n)| n)
    .collect()
}

/// A decoded segment of one pass (gitleaks `EncodedSegment`).
#[derive(Debug, Clone)]
pub(crate) struct Segment {
    /// Where it is in the original text.
    pub original: Span,
    /// Where it is in the previous pass's text.
    pub encoded: Span,
    /// Where its decoded value is in this pass's text.
    pub decoded: Span,
    /// The encodings it went through (its own and those of the segments it
    /// was decoded from).
    pub encodings: u8,
    /// The pass that decoded it (1 for the first).
    pub depth: usize,
}

/// The decoding passes of one scan: `levels[k]` holds the segments of pass `k + 1`.
#[derive(Debug, Default)]
pub(crate) struct Passes {
    pub levels: Vec<Vec<Segment>>,
}

impl Passes {
    /// gitleaks `toOriginal`: maps `span`, a range of the text of pass `level + 1`
    /// overlapping `segs` (segments of that pass), to the original text.
    pub fn to_original(&self, level: usize, segs: &[&Segment], span: Span) -> Span {
        let mut span = span;
        let mut level = Some(level);
        let mut current: Vec<&Segment> = segs.to_vec();
        loop {
            if current.is_empty() {
                return span;
            }
            let mut enc: Option<Span> = None;
            for p in &current {
                if !p.decoded.overlaps(span) {
                    continue;
                }
                if p.decoded.contains(span) {
                    return p.original;
                }
                let m = p.encoded.shift_overflow(p.decoded, span);
                enc = Some(match enc {
                    // gitleaks tests `encoded.end == 0` for "not set yet".
                    Some(e) if e.end != 0 => e.merge(m),
                    _ => m,
                });
            }
            let Some(e) = enc.filter(|e| e.end != 0) else {
                return span;
            };
            span = e;
            // Every segment of a pass has all of the previous pass's as predecessors.
            current = match level {
                Some(l) if l > 0 => self.levels[l - 1].iter().collect(),
                _ => Vec::new(),
            };
            level = level.and_then(|l| l.checked_sub(1));
        }
    }

    /// Runs one decoding pass over `text` (the text of pass `self.levels.len()`,
    /// 0 being the original). Returns the decoded text and pushes its segments;
    /// returns `None` (and pushes nothing) when no segment decodes.
    pub fn decode(&mut self, text: &[u8]) -> Option<Vec<u8>> {
        let prev = self.levels.last();
        let level = self.levels.len();
        let mut out: Vec<u8> = Vec::new();
        let mut segs: Vec<Segment> = Vec::new();
        let mut shift: i64 = 0;
        let mut copied = 0usize;
        for m in find_encoding_matches(text) {
            if m.untried {
                continue;
            }
            let (kind, s, e) = (KINDS[m.pattern], m.start, m.end);
            let value = decode_value(kind, &text[s..e]);
            if value.is_empty() {
                continue;
            }
            let encoded = Span::new(s, e);
            let original = match prev {
                Some(p) => self.to_original(level - 1, &p.iter().collect::<Vec<_>>(), encoded),
                None => encoded,
            };
            let dstart = s as i64 + shift;
            let decoded = Span {
                start: dstart,
                end: dstart + value.len() as i64,
            };
            shift += value.len() as i64 - (e - s) as i64;
            let mut encodings = kind;
            let mut depth = 1;
            if let Some(p) = prev {
                if let Some(first) = p.first() {
                    depth = 1 + first.depth;
                }
                for q in p {
                    if encoded.overlaps(q.decoded) {
                        encodings |= q.encodings;
                    }
                }
            }
            if out.capacity() == 0 {
                out.reserve(text.len());
            }
            out.extend_from_slice(&text[copied..s]);
            out.extend_from_slice(&value);
            copied = e;
            segs.push(Segment {
                original,
                encoded,
                decoded,
                encodings,
                depth,
            });
        }
        if segs.is_empty() {
            return None;
        }
        out.extend_from_slice(&text[copied..]);
        self.levels.push(segs);
        Some(out)
    }
}

/// The four encodings as one leftmost-first multi-pattern regex, in gitleaks'
/// precedence order (a pattern's id is its place in that order). The scanner
/// uses [`match_at`], a hand-written equivalent; tests check one against the
/// other.
#[cfg(any(test, feature = "fuzzing"))]
fn encodings_regex() -> Option<&'static Regex> {
    static RE: OnceLock<Option<Regex>> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::builder()
            .syntax(syntax::Config::new().unicode(false).utf8(false))
            .configure(Regex::config().utf8_empty(false))
            .build_many(&[
                // percent
                r"%[0-9A-Fa-f]{2}(?:.*%[0-9A-Fa-f]{2})?",
                // unicode: Go's `\s` is [\t\n\f\r ]; `$` is the end of the text
                r"(?:(?:U\+[a-fA-F0-9]{4}(?:[\t\n\x0C\r ]|$))+|(?i)(?:\\{1,2}u[a-fA-F0-9]{4})+)",
                // hex
                r"[0-9A-Fa-f]{32,}",
                // base64
                r"[\w/+-]{16,}={0,2}",
            ])
            .ok()
    })
    .as_ref()
}

/// The encodings regex's matches as (pattern id, start, end), by the regex.
#[cfg(any(test, feature = "fuzzing"))]
fn regex_matches(data: &[u8]) -> Vec<(usize, usize, usize)> {
    encodings_regex()
        .map(|re| {
            re.find_iter(data)
                .map(|m| (m.pattern().as_usize(), m.start(), m.end()))
                .collect()
        })
        .unwrap_or_default()
}

const KINDS: [u8; 4] = [PERCENT, UNICODE, HEX, BASE64];

/// Byte class: `[\w/+-]`, the base64 pattern's class.
const C_B64: u8 = 1;
/// Byte class: `[0-9A-Fa-f]`, the hex pattern's (a subset of [`C_B64`]).
const C_HEX: u8 = 2;
/// Byte class: a digit or one of `+/-_` (a subset of [`C_B64`]): gitleaks tries
/// to decode a base64 value only when it has one.
const C_TRIED: u8 = 4;

/// The classes of a byte. A table: the run search tests every byte of every
/// scanned body, and one load is cheaper than the range comparisons; one walk
/// over a run learns all three classes.
fn class(b: u8) -> u8 {
    static TABLE: [u8; 256] = {
        let mut t = [0u8; 256];
        let mut i = 0;
        while i < 256 {
            let c = i as u8;
            let tried = c.is_ascii_digit() || matches!(c, b'_' | b'/' | b'+' | b'-');
            if c.is_ascii_alphanumeric() || tried {
                t[i] |= C_B64;
            }
            if c.is_ascii_hexdigit() {
                t[i] |= C_HEX;
            }
            if tried {
                t[i] |= C_TRIED;
            }
            i += 1;
        }
        t
    };
    TABLE[b as usize]
}

fn b64_class(b: u8) -> bool {
    class(b) & C_B64 != 0
}

/// One match of the encodings regex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Found {
    /// The pattern, in gitleaks' precedence order: 0 percent, 1 unicode, 2 hex, 3 base64.
    pattern: usize,
    start: usize,
    end: usize,
    /// A base64 match without a digit or one of `+/-_`, which gitleaks does not
    /// try to decode ([`decode_base64`] refuses it); known from the walk that
    /// measured the run, so the value is not walked again.
    untried: bool,
}

/// Go's `\s`.
fn go_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0C | b'\r' | b' ')
}

fn hex4_at(data: &[u8], i: usize) -> bool {
    data.get(i..i + 4)
        .is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit))
}

/// The match of the encodings regex anchored at `p`: percent, then unicode,
/// hex and base64, as the alternation prefers them.
fn match_at(data: &[u8], p: usize) -> Option<Found> {
    let found = |pattern, end| Found {
        pattern,
        start: p,
        end,
        untried: false,
    };
    let n = data.len();
    let at = |i: usize| data.get(i).copied();
    match at(p)? {
        b'%' => {
            if !(at(p + 1).is_some_and(|b| b.is_ascii_hexdigit())
                && at(p + 2).is_some_and(|b| b.is_ascii_hexdigit()))
            {
                return None;
            }
            // `(?:.*%XX)?`, greedy: the last `%XX` before the end of the line.
            let from = p + 3;
            let line_end = memchr::memchr(b'\n', &data[from..]).map_or(n, |i| from + i);
            let mut hi = line_end;
            while let Some(q) = memchr::memrchr(b'%', &data[from..hi]).map(|i| from + i) {
                if q + 2 < line_end
                    && data[q + 1].is_ascii_hexdigit()
                    && data[q + 2].is_ascii_hexdigit()
                {
                    return Some(found(0, q + 3));
                }
                hi = q;
            }
            return Some(found(0, from));
        }
        b'U' if at(p + 1) == Some(b'+') => {
            let mut i = p;
            while at(i) == Some(b'U') && at(i + 1) == Some(b'+') && hex4_at(data, i + 2) {
                match at(i + 6) {
                    None => {
                        i += 6;
                        break;
                    }
                    Some(b) if go_space(b) => i += 7,
                    Some(_) => break,
                }
            }
            if i > p {
                return Some(found(1, i));
            }
        }
        b'\\' => {
            let mut i = p;
            loop {
                let j = if at(i) == Some(b'\\') && at(i + 1) == Some(b'\\') {
                    i + 2
                } else if at(i) == Some(b'\\') {
                    i + 1
                } else {
                    break;
                };
                // With one backslash, `u` would have to be where the second one is.
                if matches!(at(j), Some(b'u' | b'U')) && hex4_at(data, j + 1) {
                    i = j + 5;
                } else {
                    break;
                }
            }
            return (i > p).then_some(found(1, i));
        }
        _ => {}
    }
    // Hex digits are base64 characters: the base64 run goes on from where the
    // hex run stops, and the classes seen on the way say whether gitleaks would
    // try to decode it (the byte that ends a run is seen too, harmlessly:
    // `C_TRIED` bytes are all inside the base64 class).
    let rest = &data[p..];
    let mut seen = 0u8;
    let hex = run_of(rest, C_HEX, &mut seen);
    if hex >= 32 {
        return Some(found(2, p + hex));
    }
    let run = hex + run_of(&rest[hex..], C_B64, &mut seen);
    if run >= 16 {
        let e = p + run;
        let pads = data[e..].iter().take(2).take_while(|&&b| b == b'=').count();
        return Some(Found {
            untried: seen & C_TRIED == 0,
            ..found(3, e + pads)
        });
    }
    None
}

/// The length of the run of `class` bytes that starts `data`; ORs the classes
/// of its bytes (and of the byte after it) into `seen`.
fn run_of(data: &[u8], want: u8, seen: &mut u8) -> usize {
    data.iter()
        .take_while(|&&b| {
            let c = class(b);
            *seen |= c;
            c & want != 0
        })
        .count()
}

/// The first `p >= from` where 16 bytes of the base64 class start (every hex or
/// base64 match starts at such a place). Skips ahead by the window on a miss.
fn next_run16(data: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    // Last byte of the window first: a miss there skips the whole window.
    while let Some(w) = data.get(i..i + 16) {
        match w.iter().rposition(|&b| !b64_class(b)) {
            Some(k) => i += k + 1,
            None => return Some(i),
        }
    }
    None
}

/// The first place `>= from` where a percent or unicode match may start: `%`,
/// `\\` or the `U` of `U+`.
fn next_special(data: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = memchr::memchr3(b'%', b'\\', b'+', &data[at..]).map(|i| at + i) {
        if data[i] != b'+' {
            return Some(i);
        }
        if i > from && data[i - 1] == b'U' {
            return Some(i - 1);
        }
        at = i + 1;
    }
    None
}

/// The next candidate at or after `pos`: the cached one while it is still ahead
/// (or when there is none left), else `find(pos)`, cached.
fn next_cached(
    cache: &mut Option<Option<usize>>,
    pos: usize,
    find: impl FnOnce(usize) -> Option<usize>,
) -> Option<usize> {
    match *cache {
        Some(Some(c)) if c >= pos => Some(c),
        Some(None) => None,
        _ => {
            let c = find(pos);
            *cache = Some(c);
            c
        }
    }
}

/// The encodings regex's matches, leftmost-first, as `find_iter` reports them,
/// found as they are asked for (a decoding pass allocates nothing until a
/// segment decodes).
struct Matches<'d> {
    data: &'d [u8],
    pos: usize,
    /// Cached "next candidate at or after the position it was computed from".
    special: Option<Option<usize>>,
    run: Option<Option<usize>>,
}

impl<'d> Matches<'d> {
    fn new(data: &'d [u8]) -> Self {
        Matches {
            data,
            pos: 0,
            special: None,
            run: None,
        }
    }
}

impl Iterator for Matches<'_> {
    type Item = Found;

    fn next(&mut self) -> Option<Found> {
        let data = self.data;
        while self.pos < data.len() {
            let pos = self.pos;
            let sp = next_cached(&mut self.special, pos, |p| next_special(data, p));
            let rn = next_cached(&mut self.run, pos, |p| next_run16(data, p));
            let cand = match (sp, rn) {
                (Some(a), Some(b)) => a.min(b),
                (Some(a), None) => a,
                (None, Some(b)) => b,
                (None, None) => break,
            };
            match match_at(data, cand) {
                Some(m) => {
                    self.pos = m.end.max(cand + 1);
                    return Some(m);
                }
                None => self.pos = cand + 1,
            }
        }
        self.pos = data.len();
        None
    }
}

/// The encodings regex's matches as (pattern id, start, end).
#[cfg(any(test, feature = "fuzzing"))]
fn encoding_matches(data: &[u8]) -> Vec<(usize, usize, usize)> {
    Matches::new(data)
        .map(|m| (m.pattern, m.start, m.end))
        .collect()
}

/// gitleaks `findEncodingMatches`: the matches of the combined regex; a match
/// touching a neighbour of higher precedence (a lower pattern id) is left for
/// the next pass. A match's neighbours are the regex's matches before and after
/// it, whether or not they are kept themselves.
struct Kept<'d> {
    matches: Matches<'d>,
    prev: Option<Found>,
    cur: Option<Found>,
}

impl Iterator for Kept<'_> {
    type Item = Found;

    fn next(&mut self) -> Option<Found> {
        loop {
            let m = self.cur.take()?;
            let next = self.matches.next();
            let prev = self.prev.replace(m);
            self.cur = next;
            let yields_to = |o: Option<Found>| {
                o.is_some_and(|o| o.start <= m.end && o.end >= m.start && o.pattern < m.pattern)
            };
            if !(yields_to(prev) || yields_to(next)) {
                return Some(m);
            }
        }
    }
}

fn find_encoding_matches(data: &[u8]) -> Kept<'_> {
    let mut matches = Matches::new(data);
    let cur = matches.next();
    Kept {
        matches,
        prev: None,
        cur,
    }
}

fn decode_value(kind: u8, v: &[u8]) -> Vec<u8> {
    match kind {
        PERCENT => decode_percent(v),
        UNICODE => decode_unicode(v),
        HEX => decode_hex(v),
        _ => decode_base64(v),
    }
}

/// gitleaks' printable ASCII: 0x09..=0x7e.
fn printable(b: u8) -> bool {
    b > 0x08 && b < 0x7f
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn decode_percent(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        if v[i] == b'%' && i + 2 < v.len() {
            if let (Some(h), Some(l)) = (hex_val(v[i + 1]), hex_val(v[i + 2])) {
                let b = h << 4 | l;
                if !printable(b) {
                    return Vec::new();
                }
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(v[i]);
        i += 1;
    }
    out
}

fn decode_hex(v: &[u8]) -> Vec<u8> {
    if !v.len().is_multiple_of(2) || !v.iter().any(u8::is_ascii_digit) {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(v.len() / 2);
    for pair in v.chunks_exact(2) {
        let (Some(h), Some(l)) = (hex_val(pair[0]), hex_val(pair[1])) else {
            return Vec::new();
        };
        let b = h << 4 | l;
        if !printable(b) {
            return Vec::new();
        }
        out.push(b);
    }
    out
}

fn push_code_point(out: &mut Vec<u8>, cp: u32) {
    // Go's string(rune) turns a surrogate into U+FFFD.
    let c = char::from_u32(cp).unwrap_or('\u{FFFD}');
    let mut buf = [0u8; 4];
    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
}

fn hex4(v: &[u8]) -> Option<u32> {
    if v.len() < 4 {
        return None;
    }
    let mut n = 0u32;
    for &b in &v[..4] {
        n = n << 4 | u32::from(hex_val(b)?);
    }
    Some(n)
}

/// A segment matched by the unicode pattern is one run of `U+XXXX` code points
/// (each followed by one whitespace character or the end) or one run of
/// `\uXXXX` / `\\uXXXX` escapes (`u` in any case); gitleaks decodes the whole
/// run to the code points' UTF-8 and drops the separators.
fn decode_unicode(v: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len());
    if v.starts_with(b"U+") {
        let mut i = 0;
        while i + 6 <= v.len() {
            if &v[i..i + 2] == b"U+" {
                if let Some(cp) = hex4(&v[i + 2..]) {
                    push_code_point(&mut out, cp);
                    i += 6;
                    continue;
                }
            }
            i += 1;
        }
    } else {
        let mut i = 0;
        while i < v.len() {
            if v[i] == b'\\' {
                let j = if v.get(i + 1) == Some(&b'\\') {
                    i + 2
                } else {
                    i + 1
                };
                if matches!(v.get(j), Some(b'u' | b'U')) {
                    if let Some(cp) = v.get(j + 1..).and_then(hex4) {
                        push_code_point(&mut out, cp);
                        i = j + 5;
                        continue;
                    }
                }
            }
            i += 1;
        }
    }
    out
}

fn b64_std(b: u8) -> Option<u8> {
    match b {
        b'A'..=b'Z' => Some(b - b'A'),
        b'a'..=b'z' => Some(b - b'a' + 26),
        b'0'..=b'9' => Some(b - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

fn b64_url(b: u8) -> Option<u8> {
    match b {
        b'-' => Some(62),
        b'_' => Some(63),
        b'+' | b'/' => None,
        _ => b64_std(b),
    }
}

/// Decodes base64 body characters (no padding) with Go's lenient handling of
/// the unused low bits; a final group of one character is an error.
fn b64_body(body: &[u8], alpha: fn(u8) -> Option<u8>) -> Option<Vec<u8>> {
    if body.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(body.len() / 4 * 3 + 2);
    for chunk in body.chunks(4) {
        let mut n = 0u32;
        for (k, &c) in chunk.iter().enumerate() {
            n |= u32::from(alpha(c)?) << (18 - 6 * k);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    Some(out)
}

/// gitleaks `decodeBase64`: standard padded base64, else unpadded base64url;
/// the result must be printable ASCII. Values without a digit or one of
/// `+/-_` are not tried.
fn decode_base64(v: &[u8]) -> Vec<u8> {
    if !v.iter().any(|&b| class(b) & C_TRIED != 0) {
        return Vec::new();
    }
    let pads = v.iter().rev().take_while(|&&b| b == b'=').count();
    let body = &v[..v.len() - pads];
    if v.len().is_multiple_of(4) && !body.contains(&b'=') {
        if let Some(d) = b64_body(body, b64_std) {
            // "xx==" and "xxx=" only: Go refuses other padding.
            let ok = match pads {
                0 => body.len().is_multiple_of(4),
                1 => body.len() % 4 == 3,
                _ => body.len() % 4 == 2,
            };
            if ok && d.iter().all(|&b| printable(b)) {
                return d;
            }
        }
    }
    if pads == 0 {
        if let Some(d) = b64_body(v, b64_url) {
            if d.iter().all(|&b| printable(b)) {
                return d;
            }
        }
    }
    Vec::new()
}

/// Entry points for the fuzz targets in `fuzz/` (feature `fuzzing`; not a stable API):
/// the decoders, the hand-written segment finder and the regex it must equal, and the
/// decoding passes with their segments.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    /// The percent decoder on one matched segment (empty: refused).
    pub fn decode_percent(v: &[u8]) -> Vec<u8> {
        super::decode_percent(v)
    }

    /// The hex decoder on one matched segment (empty: refused).
    pub fn decode_hex(v: &[u8]) -> Vec<u8> {
        super::decode_hex(v)
    }

    /// The base64 decoder on one matched segment (empty: refused).
    pub fn decode_base64(v: &[u8]) -> Vec<u8> {
        super::decode_base64(v)
    }

    /// The unicode-escape decoder on one matched segment (empty: refused).
    pub fn decode_unicode(v: &[u8]) -> Vec<u8> {
        super::decode_unicode(v)
    }

    /// The encoded segments of `data` as (pattern, start, end): by the hand-written
    /// finder the scanner uses, and by gitleaks' regex (`regex-automata`).
    pub fn encoding_matches(data: &[u8]) -> [Vec<(usize, usize, usize)>; 2] {
        [super::encoding_matches(data), super::regex_matches(data)]
    }

    /// One decoded segment: where it is in the original text, in the text it was
    /// decoded from, and in the decoded text (half-open byte ranges).
    #[derive(Debug, Clone, Copy)]
    pub struct Segment {
        /// In the original text.
        pub original: (i64, i64),
        /// In the previous pass's text.
        pub encoded: (i64, i64),
        /// In this pass's text.
        pub decoded: (i64, i64),
    }

    /// Up to `depth` decoding passes over `text`: each pass's text and segments.
    pub fn passes(text: &[u8], depth: usize) -> Vec<(Vec<u8>, Vec<Segment>)> {
        let mut p = super::Passes::default();
        let mut out = Vec::new();
        let mut current = text.to_vec();
        for _ in 0..depth {
            let Some(next) = p.decode(&current) else {
                break;
            };
            let segs = p.levels.last().map_or_else(Vec::new, |l| {
                l.iter()
                    .map(|s| Segment {
                        original: (s.original.start, s.original.end),
                        encoded: (s.encoded.start, s.encoded.end),
                        decoded: (s.decoded.start, s.decoded.end),
                    })
                    .collect()
            });
            out.push((next.clone(), segs));
            current = next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoders() {
        assert_eq!(
            decode_base64(b"c2VjcmV0LXZhbHVlLTEyMw=="),
            b"secret-value-123"
        );
        assert_eq!(
            decode_base64(b"c2VjcmV0LXZhbHVlLTEyMw"),
            b"secret-value-123"
        );
        assert!(decode_base64(b"c2VjcmV0LXZhbHVlLTEyMw=").is_empty());
        assert!(decode_base64(b"abcdefghijklmnop").is_empty(), "no digit");
        assert_eq!(
            decode_hex(b"7365637265742d76616c75652d313233"),
            b"secret-value-123"
        );
        assert!(
            decode_hex(b"7365637265742d76616c75652d31323").is_empty(),
            "odd"
        );
        assert!(decode_hex(b"0001020304050607080910111213141516").is_empty());
        assert_eq!(decode_percent(b"%41bc%2Fd"), b"Abc/d");
        assert_eq!(decode_percent(b"%41%0"), b"A%0");
        assert!(decode_percent(b"%00%41").is_empty());
        assert_eq!(decode_unicode(b"\\u0041\\\\u0062\\U0063"), b"Abc");
        assert_eq!(decode_unicode(b"U+0041 U+0062\n"), b"Ab");
        assert_eq!(decode_unicode(b"\\ud800"), "\u{FFFD}".as_bytes());
    }

    #[test]
    fn touching_matches_yield_to_higher_precedence() {
        // base64 run directly followed by a percent run: the base64 one waits.
        let m: Vec<Found> = find_encoding_matches(b"QUJDREVGR0hJSktMTU5PUA1%41%42").collect();
        assert_eq!(m.len(), 1);
        assert_eq!(KINDS[m[0].pattern], PERCENT);
    }

    #[test]
    fn hand_written_finder_equals_the_regex() {
        let pieces: &[&[u8]] = &[
            b"%",
            b"%4",
            b"%41",
            b"%zz",
            b"\\",
            b"\\\\",
            b"u",
            b"U",
            b"U+",
            b"+",
            b"0041",
            b"00e9",
            b"dead",
            b"BEEF",
            b"abcdefgh",
            b"0123456789abcdef",
            b"00112233445566778899aAbBcCdDeEfF",
            b"QUJD",
            b"/",
            b"-",
            b"_",
            b"=",
            b"==",
            b" ",
            b"\n",
            b"\t",
            b"\x0c",
            b"\r",
            b"\x0b",
            b".",
            b"\xff",
            b"\xc3\xa9",
            b"x",
            b"ZZ",
            b"12345678",
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut kinds = [0usize; 4];
        for round in 0..20_000 {
            let mut v = Vec::new();
            for _ in 0..(round % 40) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.extend_from_slice(pieces[(x % pieces.len() as u64) as usize]);
            }
            let want = regex_matches(&v);
            for m in &want {
                kinds[m.0] += 1;
            }
            // A base64 match is marked untried exactly when gitleaks' test
            // (a digit or one of `+/-_`) fails on it.
            for m in Matches::new(&v) {
                let tried = v[m.start..m.end]
                    .iter()
                    .any(|b| b.is_ascii_digit() || matches!(b, b'+' | b'/' | b'-' | b'_'));
                assert_eq!(m.untried, m.pattern == 3 && !tried, "{m:?} in {v:?}");
            }
            assert_eq!(
                encoding_matches(&v),
                want,
                "{:?}",
                String::from_utf8_lossy(&v)
            );
        }
        assert!(
            kinds.iter().all(|&k| k > 100),
            "every pattern exercised: {kinds:?}"
        );
        for long in [
            "a".repeat(100),
            "0123456789abcdef".repeat(8) + "ghij",
            "%41 ".repeat(50),
            "U+0041 ".repeat(30),
            "\\u0041".repeat(30),
        ] {
            assert_eq!(
                encoding_matches(long.as_bytes()),
                regex_matches(long.as_bytes())
            );
        }
    }
}
