//! Detectors. Each takes one decoded value and returns at most one [`Hit`].

pub mod cmdi;
pub mod code;
pub mod crlf;
pub mod deser;
pub mod jndi;
pub mod ldap;
mod matcher;
pub mod nosql;
pub mod scanner;
pub mod sqli;
pub mod ssrf;
pub mod traversal;
pub mod upload;
pub mod xpath;
pub mod xss;
pub mod xxe;

use serde::Serialize;

/// Attack families (the detector names used in findings, events and exclusions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attack {
    /// SQL injection.
    Sqli,
    /// Cross-site scripting.
    Xss,
    /// OS command injection.
    Cmdi,
    /// Path traversal / local file inclusion.
    PathTraversal,
    /// Server-side request forgery / remote file inclusion.
    Ssrf,
    /// XML external entities.
    Xxe,
    /// CRLF / header injection.
    Crlf,
    /// Code injection (PHP, Java EL/OGNL, Python, JS, server-side includes).
    CodeInjection,
    /// Server-side template injection.
    Ssti,
    /// JNDI lookups (Log4Shell).
    Jndi,
    /// LDAP filter injection.
    Ldap,
    /// NoSQL operator injection.
    Nosql,
    /// XPath injection.
    Xpath,
    /// Upload of an executable file.
    Upload,
    /// Java deserialization payloads (serialized-object markers, XStream/XMLDecoder graphs).
    Deserialization,
    /// A virtual patch (a rule for a known exploit endpoint; the finding names the rule).
    VirtualPatch,
    /// A scanner or exploit tool (User-Agent).
    Scanner,
    /// An inspection limit was hit.
    Limit,
}

impl Attack {
    /// Detector name, e.g. `sqli`, `path-traversal`.
    pub fn name(self) -> &'static str {
        match self {
            Attack::Sqli => "sqli",
            Attack::Xss => "xss",
            Attack::Cmdi => "cmdi",
            Attack::PathTraversal => "path-traversal",
            Attack::Ssrf => "ssrf",
            Attack::Xxe => "xxe",
            Attack::Crlf => "crlf",
            Attack::CodeInjection => "code-injection",
            Attack::Ssti => "ssti",
            Attack::Jndi => "jndi",
            Attack::Ldap => "ldap",
            Attack::Nosql => "nosql",
            Attack::Xpath => "xpath",
            Attack::Upload => "upload",
            Attack::Deserialization => "deserialization",
            Attack::VirtualPatch => "virtual-patch",
            Attack::Scanner => "scanner",
            Attack::Limit => "limit",
        }
    }

    /// True for detectors whose evidence is a syntax shape that legitimate rich
    /// content (source code, analytics payloads) also has; context lowers these.
    pub fn shape_based(self) -> bool {
        matches!(
            self,
            Attack::Sqli
                | Attack::Xss
                | Attack::Cmdi
                | Attack::PathTraversal
                | Attack::Ssrf
                | Attack::Crlf
                | Attack::CodeInjection
                | Attack::Ssti
                | Attack::Ldap
                | Attack::Nosql
                | Attack::Xpath
        )
    }

    /// Every detector, for docs and validation of exclusions.
    pub const ALL: [Attack; 18] = [
        Attack::Sqli,
        Attack::Xss,
        Attack::Cmdi,
        Attack::PathTraversal,
        Attack::Ssrf,
        Attack::Xxe,
        Attack::Crlf,
        Attack::CodeInjection,
        Attack::Ssti,
        Attack::Jndi,
        Attack::Ldap,
        Attack::Nosql,
        Attack::Xpath,
        Attack::Upload,
        Attack::Deserialization,
        Attack::VirtualPatch,
        Attack::Scanner,
        Attack::Limit,
    ];
}

impl std::fmt::Display for Attack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One detector result on one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// Attack family.
    pub attack: Attack,
    /// Confidence, 0-100.
    pub confidence: u8,
    /// The matched fragment (at most [`MAX_FRAGMENT`] bytes).
    pub fragment: String,
}

/// Longest fragment kept in a finding.
pub const MAX_FRAGMENT: usize = 120;

impl Hit {
    /// A hit whose fragment is `s[start..end]` (clamped to char boundaries and length).
    pub fn new(attack: Attack, confidence: u8, s: &str, start: usize, end: usize) -> Hit {
        let mut a = start.min(s.len());
        while a > 0 && !s.is_char_boundary(a) {
            a -= 1;
        }
        let mut e = end.clamp(a, s.len()).min(a + MAX_FRAGMENT);
        while e < s.len() && !s.is_char_boundary(e) {
            e -= 1;
        }
        if e < a {
            e = a;
        }
        Hit {
            attack,
            confidence,
            fragment: s[a..e].to_string(),
        }
    }
}

/// Byte classes present in a value, computed in one pass; detectors run only
/// when their trigger characters are present.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Classes(pub u32);

impl Classes {
    /// `'` or `"` or `` ` ``.
    pub const QUOTE: u32 = 1;
    /// `<` or `>`.
    pub const ANGLE: u32 = 1 << 1;
    /// `(` or `)`.
    pub const PAREN: u32 = 1 << 2;
    /// `;` `|` `&` or a newline.
    pub const SEP: u32 = 1 << 3;
    /// `$` or `` ` ``.
    pub const DOLLAR: u32 = 1 << 4;
    /// `{` or `}`.
    pub const BRACE: u32 = 1 << 5;
    /// `%`.
    pub const PERCENT: u32 = 1 << 6;
    /// `\`.
    pub const BACKSLASH: u32 = 1 << 7;
    /// `/`.
    pub const SLASH: u32 = 1 << 8;
    /// `:`.
    pub const COLON: u32 = 1 << 9;
    /// `=`.
    pub const EQ: u32 = 1 << 10;
    /// `-` `#` `*`.
    pub const COMMENT: u32 = 1 << 11;
    /// `[` `]`.
    pub const BRACKET: u32 = 1 << 12;
    /// `.`.
    pub const DOT: u32 = 1 << 13;
    /// Control characters (CR, LF, NUL, ...).
    pub const CTRL: u32 = 1 << 14;
    /// `+`.
    pub const PLUS: u32 = 1 << 15;
    /// `@` `!` `^` `~` `,` `?`.
    pub const MISC: u32 = 1 << 16;
    /// Non-ASCII bytes.
    pub const HIGH: u32 = 1 << 17;

    /// Scans `s` once.
    #[inline]
    pub fn of(s: &[u8]) -> Classes {
        #[cfg(target_arch = "x86_64")]
        if s.len() >= 8 {
            // SAFETY: SSE2 is part of the x86-64 baseline: every CPU this
            // code runs on has it.
            #[allow(unsafe_code)]
            return Classes(unsafe { sse2::classes(s) });
        }
        Classes(classes_bytewise(s))
    }

    /// True if any of `bits` is present.
    pub fn any(self, bits: u32) -> bool {
        self.0 & bits != 0
    }
}

/// Each byte's [`Classes`] bits. ASCII letters, digits, space and `_` have none,
/// which is what lets the SIMD scan skip them.
static CLASS_OF_BYTE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        t[i] = match c {
            b'\'' | b'"' => Classes::QUOTE,
            b'`' => Classes::QUOTE | Classes::DOLLAR,
            b'<' | b'>' => Classes::ANGLE,
            b'(' | b')' => Classes::PAREN,
            b';' | b'|' | b'&' => Classes::SEP,
            b'\n' | b'\r' => Classes::SEP | Classes::CTRL,
            b'$' => Classes::DOLLAR,
            b'{' | b'}' => Classes::BRACE,
            b'%' => Classes::PERCENT,
            b'\\' => Classes::BACKSLASH,
            b'/' => Classes::SLASH,
            b':' => Classes::COLON,
            b'=' => Classes::EQ,
            b'-' | b'#' | b'*' => Classes::COMMENT,
            b'[' | b']' => Classes::BRACKET,
            b'.' => Classes::DOT,
            b'+' => Classes::PLUS,
            b'@' | b'!' | b'^' | b'~' | b',' | b'?' => Classes::MISC,
            0..=8 | 11 | 12 | 14..=31 | 127 => Classes::CTRL,
            128..=255 => Classes::HIGH,
            _ => 0,
        };
        i += 1;
    }
    t
};

/// [`Classes::of`] one byte at a time: short values, and other architectures.
#[inline(always)]
fn classes_bytewise(s: &[u8]) -> u32 {
    let mut m = 0u32;
    for &b in s {
        m |= CLASS_OF_BYTE[usize::from(b)];
    }
    m
}

/// [`Classes::of`] of 8 bytes or more, 16 bytes at a time with SSE2 (every
/// x86-64 CPU has it).
///
/// Values are mostly letters, digits and spaces, which have no class: a block
/// of 16 bytes is tested for any other byte with a few compares, and only those
/// bytes are looked up in the table. On prose this is about a third of the
/// instructions of the byte loop (callgrind, `examples/hotpath`).
#[cfg(target_arch = "x86_64")]
mod sse2 {
    use std::arch::x86_64::*;

    use super::CLASS_OF_BYTE;

    /// The classes of `s` (at least 8 bytes).
    #[target_feature(enable = "sse2")]
    pub(super) fn classes(s: &[u8]) -> u32 {
        if let (Some(first), Some(last), true) =
            (s.first_chunk::<8>(), s.last_chunk::<8>(), s.len() < 16)
        {
            // one block of the first and the last 8 bytes, overlapping
            let other = others(crate::util::sse2::load_words(first, last));
            return classes_at(other, |k| if k < 8 { s[k] } else { s[s.len() + k - 16] });
        }
        let mut m = 0;
        let mut blocks = s.chunks_exact(16);
        for b in &mut blocks {
            m |= block(b);
        }
        if !blocks.remainder().is_empty() {
            // the last 16 bytes, overlapping the block before: OR-ing a byte's
            // classes twice changes nothing
            m |= block(&s[s.len() - 16..]);
        }
        m
    }

    /// The classes of a block of 16 bytes.
    #[inline]
    #[target_feature(enable = "sse2")]
    fn block(b: &[u8]) -> u32 {
        let Ok(b) = <&[u8; 16]>::try_from(b) else {
            return super::classes_bytewise(b);
        };
        classes_at(others(crate::util::sse2::load(b)), |k| b[k])
    }

    /// The classes of the bytes marked in `other` (bit `k`: the block's byte
    /// `k`, read by `byte`).
    #[inline]
    fn classes_at(mut other: u32, byte: impl Fn(usize) -> u8) -> u32 {
        let mut m = 0;
        while other != 0 {
            m |= CLASS_OF_BYTE[usize::from(byte(other.trailing_zeros() as usize))];
            other &= other - 1;
        }
        m
    }

    /// Bit `k` set when byte `k` of `v` has a class (is not an ASCII letter,
    /// digit, space or `_`).
    #[inline]
    #[target_feature(enable = "sse2")]
    fn others(v: __m128i) -> u32 {
        // `x` is in `from..=from + span` (unsigned) when min(x - from, span) == x - from
        let within = |x: __m128i, from: u8, span: u8| {
            let d = _mm_sub_epi8(x, _mm_set1_epi8(from as i8));
            _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(span as i8)), d)
        };
        // OR 0x20 maps upper- to lowercase letters and no other byte into a..=z
        let letter = within(_mm_or_si128(v, _mm_set1_epi8(0x20)), b'a', 25);
        let digit = within(v, b'0', 9);
        let space = _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8));
        let underscore = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'_' as i8));
        let plain = _mm_or_si128(_mm_or_si128(letter, digit), _mm_or_si128(space, underscore));
        !(_mm_movemask_epi8(plain) as u32) & 0xffff
    }
}

/// Which detectors apply to a location.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A parameter value (query, form, JSON, XML, cookie, multipart field): all detectors.
    Value,
    /// The URL path: traversal, sensitive files, CRLF, plus per-segment injections.
    Path,
    /// A header value: injections, no SSRF (URLs are normal there).
    Header,
    /// A body value (form, JSON, XML, multipart): like `Value` but line breaks are
    /// content, not header injection.
    Body,
    /// A parameter or JSON key name.
    Name,
}

/// Runs every applicable detector on one decoded value; calls `out` per hit.
pub fn run_all(s: &str, scope: Scope, out: &mut dyn FnMut(Hit)) {
    run_all_classified(s, Classes::of(s.as_bytes()), scope, out);
}

/// [`run_all`] for a value whose classes the caller has computed already (`c`
/// must be `Classes::of(s)`): a value that no decoder changed is not scanned for
/// its classes a second time.
pub fn run_all_classified(s: &str, c: Classes, scope: Scope, out: &mut dyn FnMut(Hit)) {
    debug_assert_eq!(c, Classes::of(s.as_bytes()));
    let b = s.as_bytes();
    let q = Classes::QUOTE;
    let p = Classes::PAREN;
    if scope == Scope::Name {
        if let Some(h) = nosql::nosql_name(s) {
            out(h);
        }
        if c.any(Classes::COMMENT) {
            if let Some(h) = code::render_array(s) {
                out(h);
            }
        }
        if c.any(Classes::SLASH | Classes::BACKSLASH) {
            if let Some(h) = traversal::traversal(s) {
                out(h);
            }
        }
        if c.any(Classes::ANGLE | q | p | Classes::SEP | Classes::DOLLAR | Classes::BRACE) {
            if let Some(h) = xss::detect(s, c) {
                out(h);
            }
            if let Some(h) = sqli::detect(s) {
                out(h);
            }
        }
        return;
    }
    if c.any(q | p | Classes::COMMENT | Classes::EQ | Classes::SEP | Classes::MISC)
        || has_sql_word(b)
    {
        if let Some(mut h) = sqli::detect(s) {
            if scope == Scope::Header && h.confidence < 90 {
                // whole statements in headers (searches about SQL in a Referer) are weaker evidence
                h.confidence = h.confidence.saturating_sub(20);
            }
            out(h);
        }
    }
    if c.any(
        Classes::ANGLE | p | Classes::COLON | Classes::BRACKET | Classes::QUOTE | Classes::PLUS,
    ) {
        if let Some(h) = xss::detect(s, c) {
            out(h);
        }
    }
    // a command with a flag or path argument needs no separator (`cat /etc/passwd`)
    let cmd_line = c.any(Classes::SLASH | Classes::COMMENT | Classes::BACKSLASH)
        && memchr::memchr(b' ', b).is_some();
    // brace expansion (`{cat,/etc/passwd}`, `{,ifconfig}`) needs a brace and a comma
    let brace_list = c.any(Classes::BRACE) && c.any(Classes::MISC);
    // a command word split by quoting is one short word (`w'h'o'am'i`, `w\ho\am\i`)
    // (a quote inside it, not just around it: an ETag's `"abc123"` is not one)
    let split_word = c.any(Classes::QUOTE | Classes::BACKSLASH)
        && (3..=64).contains(&b.len())
        && memchr::memchr(b' ', b).is_none()
        && (memchr::memchr3(b'\'', b'"', b'\\', &b[1..b.len() - 1]).is_some()
            || memchr::memchr(b'`', b).is_some());
    if c.any(Classes::SEP | Classes::DOLLAR | Classes::CTRL | Classes::ANGLE)
        || cmd_line
        || brace_list
        || split_word
    {
        if let Some(h) = cmdi::detect(s, scope == Scope::Body) {
            out(h);
        }
    }
    if c.any(Classes::SLASH | Classes::BACKSLASH | Classes::DOT | Classes::COLON) {
        if let Some(h) = traversal::traversal(s) {
            out(h);
        }
        if matches!(scope, Scope::Value | Scope::Body) {
            if let Some(h) = ssrf::ssrf(s) {
                out(h);
            }
            if let Some(h) = traversal::server_file(s) {
                out(h);
            }
        }
    }
    if c.any(Classes::ANGLE) {
        if let Some(h) = xxe::xxe(s) {
            out(h);
        }
        if let Some(h) = deser::java_xml(s) {
            out(h);
        }
    }
    if b.len() >= 16 {
        if let Some(h) = deser::deser_marker(s) {
            out(h);
        }
    }
    if c.any(Classes::CTRL | Classes::HIGH) && scope != Scope::Body {
        if let Some(h) = crlf::crlf(s) {
            out(h);
        }
    }
    if c.any(Classes::CTRL) {
        if let Some(h) = crlf::mail(s) {
            out(h);
        }
    }
    if c.any(Classes::DOLLAR | Classes::BRACE | p | Classes::ANGLE | Classes::MISC | Classes::DOT) {
        if let Some(h) = code::code(s, c) {
            out(h);
        }
    }
    if c.any(Classes::DOLLAR) && c.any(Classes::BRACE) {
        if let Some(h) = jndi::jndi(s) {
            out(h);
        }
    }
    if c.any(p) || (c.any(Classes::COLON) && c.any(Classes::EQ)) {
        if let Some(h) = ldap::ldap(s) {
            out(h);
        }
        if let Some(h) = xpath::xpath(s) {
            out(h);
        }
    }
    if c.any(Classes::DOLLAR) {
        if let Some(h) = nosql::nosql_value(s) {
            out(h);
        }
    }
    if c.any(p) {
        if let Some(h) = nosql::nosql_js(s) {
            out(h);
        }
    }
    // a `$where` breakout starts with the string or number it leaves
    if c.any(Classes::SEP) && (c.any(Classes::QUOTE) || b.first().is_some_and(u8::is_ascii_digit)) {
        if let Some(h) = nosql::js_breakout(s) {
            out(h);
        }
    }
}

fn has_sql_word(b: &[u8]) -> bool {
    b.len() >= 6 && crate::util::contains_ci(b, b"select")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SIMD scan agrees with the byte loop on every byte value at every
    /// position of a block, at every length around the block size, and on the
    /// overlapping tail.
    #[test]
    fn classes_simd_agrees_with_bytewise() {
        for len in [8usize, 9, 12, 15, 16, 17, 31, 32, 33, 47, 64, 100] {
            for pos in 0..len {
                for b in 0..=255u8 {
                    let mut s = vec![b'a'; len];
                    s[pos] = b;
                    assert_eq!(
                        Classes::of(&s).0,
                        classes_bytewise(&s),
                        "byte {b:#04x} at {pos} of {len}"
                    );
                }
            }
        }
        // every pair of bytes from a mixed sample (letters' neighbours in ASCII,
        // non-ASCII, controls) in text of plain bytes
        let sample = b"@[`{AZaz09 _/:;<>\x00\x1f\x7f\x80\xc1\xdf\xe0\xff-.";
        for &x in sample {
            for &y in sample {
                let s = [b"The quick brown fox ".as_slice(), &[x, b' ', y]].concat();
                assert_eq!(Classes::of(&s).0, classes_bytewise(&s));
            }
        }
        // short values take the byte loop
        assert_eq!(Classes::of(b"a'b").0, Classes::QUOTE);
        assert_eq!(Classes::of(b"").0, 0);
    }
}
