//! Value decoders run before detection.
//!
//! Every decoder here produces output no longer than its input (escapes only
//! shrink), returns a borrowed [`Cow`] when there is nothing to decode, and
//! never fails: malformed escapes are kept verbatim. Repeated URL decoding is
//! capped at [`MAX_URL_ROUNDS`].

use std::borrow::Cow;

use base64::Engine as _;

/// Most rounds of URL decoding applied to one value (`%2527` -> `%27` -> `'`).
pub const MAX_URL_ROUNDS: usize = 3;

fn hex(b: u8) -> Option<u32> {
    match b {
        b'0'..=b'9' => Some((b - b'0') as u32),
        b'a'..=b'f' => Some((b - b'a' + 10) as u32),
        b'A'..=b'F' => Some((b - b'A' + 10) as u32),
        _ => None,
    }
}

fn push_char(out: &mut Vec<u8>, c: u32) {
    let ch = char::from_u32(c).unwrap_or('\u{FFFD}');
    let mut buf = [0u8; 4];
    out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
}

/// The ASCII character an overlong UTF-8 sequence of `%XX` escapes hides, and the
/// escapes' length: `%C0%AE`, `%E0%80%AE`, `%F0%80%80%AE` and the 5- and 6-byte forms
/// are all `.` to a lenient UTF-8 decoder (IIS, old Tomcat), so they are to the WAF.
/// `s` starts at the first escape, whose byte is `lead`.
fn overlong_ascii(s: &[u8], lead: u8) -> Option<(u8, usize)> {
    let continuations = match lead {
        0xC0 | 0xC1 => 1,
        0xE0 => 2,
        0xF0 => 3,
        0xF8 => 4,
        0xFC => 5,
        _ => return None,
    };
    // the lead byte's payload bits: 110xxxxx, 1110xxxx, ... 1111110x
    let mut v = u32::from(lead & (0xFF >> (continuations + 2)));
    // IIS's decoder read the low six bits of the second byte without checking that it
    // was a continuation byte: `%C0%2F` and `%C1%1C` were `/` and `\` to it (the
    // Unicode directory traversal). Read that way only where it gives a path
    // character, so Latin-1 text that happens to hold À or Á keeps its bytes.
    if continuations == 1 && s.get(3) == Some(&b'%') {
        if let (Some(h), Some(l)) = (
            s.get(4).and_then(|&x| hex(x)),
            s.get(5).and_then(|&x| hex(x)),
        ) {
            let lenient = (v << 6) | ((h * 16 + l) & 0x3F);
            if matches!(lenient, 0x2E | 0x2F | 0x5C) {
                return Some((lenient as u8, 6));
            }
        }
    }
    for k in 0..continuations {
        let at = 3 + 3 * k;
        if s.get(at) != Some(&b'%') {
            return None;
        }
        let c = hex(*s.get(at + 1)?)? * 16 + hex(*s.get(at + 2)?)?;
        if !(0x80..0xC0).contains(&c) {
            return None;
        }
        v = (v << 6) | (c & 0x3F);
    }
    (v < 0x80).then_some((v as u8, 3 + 3 * continuations))
}

/// What a server that maps a `%u` escape to its ANSI code page makes of a look-alike
/// (IIS's best fit; ModSecurity's `urlDecodeUni` folds the full-width forms the same
/// way): `%uFF0F` and `%u2215` are `/`, `%uFF1C` is `<`. Only `%u` escapes are folded:
/// no browser sends them, while full-width punctuation typed as text is ordinary CJK.
fn best_fit(c: u32) -> u32 {
    match c {
        0xFF01..=0xFF5E => c - 0xFEE0,
        0x2044 | 0x2215 => u32::from(b'/'),
        0x2216 => u32::from(b'\\'),
        _ => c,
    }
}

/// One round of URL decoding: `%XX`, `%uXXXX`, and `+` as space when `plus`.
pub fn url_decode_once(s: &[u8], plus: bool) -> Cow<'_, [u8]> {
    let needs = if plus {
        memchr::memchr2(b'%', b'+', s).is_some()
    } else {
        memchr::memchr(b'%', s).is_some()
    };
    if !needs {
        return Cow::Borrowed(s);
    }
    let mut out = Vec::with_capacity(s.len());
    url_decode_into(s, plus, &mut out);
    Cow::Owned(out)
}

/// [`url_decode_once`] into a caller-owned buffer (cleared first), so a loop over
/// many parameters reuses one allocation.
pub fn url_decode_into(s: &[u8], plus: bool, out: &mut Vec<u8>) {
    out.clear();
    // decoding never lengthens: one allocation of the input's size, not a few
    // growing ones
    out.reserve(s.len());
    let mut i = 0;
    while i < s.len() {
        // copy the run up to the next escape in one go
        let next = crate::util::find2(&s[i..], b'%', if plus { b'+' } else { b'%' });
        match next {
            Some(0) => {}
            Some(n) => {
                out.extend_from_slice(&s[i..i + n]);
                i += n;
            }
            None => {
                out.extend_from_slice(&s[i..]);
                break;
            }
        }
        let b = s[i];
        if b == b'%' {
            if i + 2 < s.len() {
                if let (Some(h), Some(l)) = (hex(s[i + 1]), hex(s[i + 2])) {
                    let v = (h * 16 + l) as u8;
                    if v >= 0xC0 {
                        if let Some((c, used)) = overlong_ascii(&s[i..], v) {
                            out.push(c);
                            i += used;
                            continue;
                        }
                    }
                    out.push(v);
                    i += 3;
                    continue;
                }
            }
            if i + 5 < s.len() && (s[i + 1] == b'u' || s[i + 1] == b'U') {
                let mut v = 0u32;
                let mut ok = true;
                for &d in &s[i + 2..i + 6] {
                    match hex(d) {
                        Some(x) => v = v * 16 + x,
                        None => ok = false,
                    }
                }
                if ok {
                    push_char(out, best_fit(v));
                    i += 6;
                    continue;
                }
            }
            out.push(b);
        } else if plus && b == b'+' {
            out.push(b' ');
        } else {
            out.push(b);
        }
        i += 1;
    }
}

/// URL-decodes until the value stops changing, at most [`MAX_URL_ROUNDS`] times.
pub fn url_decode_repeated(s: &[u8]) -> Cow<'_, [u8]> {
    let mut cur: Cow<'_, [u8]> = Cow::Borrowed(s);
    for _ in 0..MAX_URL_ROUNDS {
        if memchr::memchr(b'%', &cur).is_none() {
            break;
        }
        let next = match url_decode_once(&cur, false) {
            Cow::Borrowed(_) => break,
            Cow::Owned(v) => v,
        };
        if next.len() == cur.len() {
            break;
        }
        cur = Cow::Owned(next);
    }
    cur
}

const NAMED: &[(&str, char)] = &[
    ("lt", '<'),
    ("gt", '>'),
    ("quot", '"'),
    ("apos", '\''),
    ("amp", '&'),
    ("colon", ':'),
    ("lpar", '('),
    ("rpar", ')'),
    ("semi", ';'),
    ("equals", '='),
    ("newline", '\n'),
    ("tab", '\t'),
    ("sol", '/'),
    ("bsol", '\\'),
    ("comma", ','),
    ("period", '.'),
    ("excl", '!'),
    ("num", '#'),
    ("dollar", '$'),
    ("percnt", '%'),
    ("plus", '+'),
    ("lsqb", '['),
    ("rsqb", ']'),
    ("lbrack", '['),
    ("rbrack", ']'),
    ("lcub", '{'),
    ("rcub", '}'),
    ("lbrace", '{'),
    ("rbrace", '}'),
    ("grave", '`'),
    ("hat", '^'),
    ("ast", '*'),
    ("quest", '?'),
    ("vert", '|'),
    ("nbsp", ' '),
];

/// Decodes HTML character references: numeric (`&#97;`, `&#x61;`, with or
/// without `;`, leading zeros allowed) and the named ones attackers use.
pub fn html_decode(s: &str) -> Cow<'_, str> {
    if memchr::memchr(b'&', s.as_bytes()).is_none() {
        return Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut changed = false;
    while i < b.len() {
        if b[i] != b'&' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        // numeric
        if i + 2 < b.len() && b[i + 1] == b'#' {
            let (radix_hex, start) = if b[i + 2] == b'x' || b[i + 2] == b'X' {
                (true, i + 3)
            } else {
                (false, i + 2)
            };
            let mut j = start;
            let mut v: u32 = 0;
            while j < b.len() && j - start < 12 {
                let d = if radix_hex {
                    hex(b[j])
                } else if b[j].is_ascii_digit() {
                    Some((b[j] - b'0') as u32)
                } else {
                    None
                };
                match d {
                    Some(d) => {
                        v = v
                            .saturating_mul(if radix_hex { 16 } else { 10 })
                            .saturating_add(d);
                        j += 1
                    }
                    None => break,
                }
            }
            if j > start {
                if j < b.len() && b[j] == b';' {
                    j += 1;
                }
                push_char(&mut out, v.min(0x10FFFF));
                i = j;
                changed = true;
                continue;
            }
        }
        // named
        let rest = &b[i + 1..];
        let mut matched = false;
        for (name, ch) in NAMED {
            let n = name.len();
            if rest.len() >= n && rest[..n].eq_ignore_ascii_case(name.as_bytes()) {
                let mut j = i + 1 + n;
                let has_semi = j < b.len() && b[j] == b';';
                if has_semi {
                    j += 1;
                } else if !matches!(*name, "lt" | "gt" | "quot" | "amp") {
                    continue;
                }
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                i = j;
                matched = true;
                changed = true;
                break;
            }
        }
        if !matched {
            out.push(b'&');
            i += 1;
        }
    }
    if !changed {
        return Cow::Borrowed(s);
    }
    Cow::Owned(crate::util::lossy_owned(out))
}

/// Decodes JavaScript / JSON / C-style escapes: `\xHH`, `\uHHHH`, `\u{H..}`,
/// octal `\NNN`, and drops a backslash before other characters.
pub fn js_unescape(s: &str) -> Cow<'_, str> {
    if memchr::memchr(b'\\', s.as_bytes()).is_none() {
        return Cow::Borrowed(s);
    }
    let b = s.as_bytes();
    let mut out: Vec<u8> = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 >= b.len() {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        match c {
            b'x' | b'X' => {
                if let (Some(h), Some(l)) = (
                    b.get(i + 2).and_then(|&x| hex(x)),
                    b.get(i + 3).and_then(|&x| hex(x)),
                ) {
                    push_char(&mut out, h * 16 + l);
                    i += 4;
                    continue;
                }
                out.push(c);
                i += 2;
            }
            b'u' | b'U' => {
                if b.get(i + 2) == Some(&b'{') {
                    let mut j = i + 3;
                    let mut v: u32 = 0;
                    while j < b.len() && j - i < 16 {
                        match hex(b[j]) {
                            Some(d) => v = v.saturating_mul(16).saturating_add(d),
                            None => break,
                        }
                        j += 1;
                    }
                    if j < b.len() && b[j] == b'}' && j > i + 3 {
                        push_char(&mut out, v.min(0x10FFFF));
                        i = j + 1;
                        continue;
                    }
                } else if i + 5 < b.len() {
                    let mut v = 0u32;
                    let mut ok = true;
                    for &d in &b[i + 2..i + 6] {
                        match hex(d) {
                            Some(x) => v = v * 16 + x,
                            None => ok = false,
                        }
                    }
                    if ok {
                        push_char(&mut out, v);
                        i += 6;
                        continue;
                    }
                }
                out.push(c);
                i += 2;
            }
            b'0'..=b'7' => {
                let mut j = i + 1;
                let mut v = 0u32;
                while j < b.len() && j < i + 4 && (b'0'..=b'7').contains(&b[j]) {
                    v = v * 8 + (b[j] - b'0') as u32;
                    j += 1;
                }
                push_char(&mut out, v);
                i = j;
            }
            b'n' => {
                out.push(b'\n');
                i += 2;
            }
            b'r' => {
                out.push(b'\r');
                i += 2;
            }
            b't' => {
                out.push(b'\t');
                i += 2;
            }
            _ => {
                out.push(c);
                i += 2;
            }
        }
    }
    Cow::Owned(crate::util::lossy_owned(out))
}

/// Decodes `value` as base64 (standard or URL-safe alphabet) when it looks like
/// base64 and decodes to mostly printable text; `None` otherwise.
pub fn base64_text(value: &str) -> Option<String> {
    let v = value.trim();
    if v.len() < 12 || v.len() > 1 << 16 {
        return None;
    }
    let body = v.trim_end_matches('=');
    if v.len() - body.len() > 2 {
        return None;
    }
    let mut has_upper = false;
    let mut has_lower = false;
    for &b in body.as_bytes() {
        match b {
            b'A'..=b'Z' => has_upper = true,
            b'a'..=b'z' => has_lower = true,
            b'0'..=b'9' | b'+' | b'/' | b'-' | b'_' => {}
            _ => return None,
        }
    }
    if !(has_upper && has_lower) {
        return None;
    }
    let engine = if body.contains(['-', '_']) {
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
    } else {
        &base64::engine::general_purpose::STANDARD_NO_PAD
    };
    let bytes = engine.decode(body).ok()?;
    let printable = bytes
        .iter()
        .filter(|&&b| (0x20..0x7f).contains(&b) || b == b'\n' || b == b'\r' || b == b'\t')
        .count();
    if bytes.len() < 6 || printable * 100 < bytes.len() * 95 {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// Decodes UTF-7 `+...-` runs (`+ADw-script+AD4-`) when the value contains them.
pub fn utf7_decode(s: &str) -> Option<String> {
    // One pass over the `+`s instead of two substring searches: on prose with no `+`
    // (most long values) this is a single memchr.
    let b = s.as_bytes();
    let shifted = memchr::memchr_iter(b'+', b)
        .any(|p| b.get(p + 1) == Some(&b'A') && matches!(b.get(p + 2), Some(b'D' | b'C')));
    if !shifted {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut changed = false;
    while i < b.len() {
        if b[i] == b'+' {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'+' || b[j] == b'/') {
                j += 1;
            }
            if j > start {
                let chunk = &s[start..j];
                let bits: Vec<u8> = chunk.bytes().collect();
                let mut acc: u32 = 0;
                let mut nbits = 0;
                let mut units: Vec<u16> = Vec::new();
                for c in bits {
                    let v = match c {
                        b'A'..=b'Z' => c - b'A',
                        b'a'..=b'z' => c - b'a' + 26,
                        b'0'..=b'9' => c - b'0' + 52,
                        b'+' => 62,
                        _ => 63,
                    } as u32;
                    acc = (acc << 6) | v;
                    nbits += 6;
                    if nbits >= 16 {
                        nbits -= 16;
                        units.push(((acc >> nbits) & 0xffff) as u16);
                    }
                }
                out.push_str(&String::from_utf16_lossy(&units));
                changed = true;
                i = if j < b.len() && b[j] == b'-' {
                    j + 1
                } else {
                    j
                };
                continue;
            }
        }
        let ch_len = s[i..].chars().next().map(|c| c.len_utf8()).unwrap_or(1);
        out.push_str(&s[i..i + ch_len]);
        i += ch_len;
    }
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url() {
        assert_eq!(&*url_decode_once(b"a%27b+c", true), b"a'b c");
        assert_eq!(&*url_decode_repeated(b"%2527"), b"'");
        assert_eq!(&*url_decode_once(b"%u003c", false), b"<");
        // overlong UTF-8 of every length hides the same ASCII
        assert_eq!(&*url_decode_once(b"%c0%ae%c0%af", false), b"./");
        assert_eq!(&*url_decode_once(b"%e0%80%ae%f0%80%80%af", false), b"./");
        assert_eq!(
            &*url_decode_once(b"%f8%80%80%80%ae%fc%80%80%80%80%af", false),
            b"./"
        );
        // a real 3-byte character and truncated or broken sequences stay as they are
        assert_eq!(
            &*url_decode_once(b"%e2%82%ac", false),
            "\u{20ac}".as_bytes()
        );
        assert_eq!(&*url_decode_once(b"%e0%80", false), b"\xe0\x80");
        // IIS's lenient reading of a 2-byte sequence, for path characters only
        assert_eq!(&*url_decode_once(b"%c0%2f%c1%1c%c1%9c", false), b"/\\\\");
        assert_eq!(&*url_decode_once(b"%c0%20", false), b"\xc0 ");
        // IIS's best fit of %u look-alikes; the same character as UTF-8 is left alone
        assert_eq!(
            &*url_decode_once(b"%uff0e%u2215%u2216%uFF1C", false),
            b"./\\<"
        );
        assert_eq!(
            &*url_decode_once(b"%ef%bc%8f", false),
            "\u{ff0f}".as_bytes()
        );
        assert_eq!(&*url_decode_once(b"100%", false), b"100%");
        assert_eq!(&*url_decode_once(b"%zz%4", false), b"%zz%4");
        assert!(matches!(url_decode_once(b"plain", true), Cow::Borrowed(_)));
    }

    #[test]
    fn html() {
        assert_eq!(html_decode("j&#x61vascript&colon;"), "javascript:");
        assert_eq!(html_decode("&lt;a&gt;&#0000097;"), "<a>a");
        assert_eq!(html_decode("AT&T"), "AT&T");
        assert!(matches!(html_decode("x"), Cow::Borrowed(_)));
    }

    #[test]
    fn js() {
        assert_eq!(js_unescape(r"\x61\u006c\u{65}\162t"), "alert");
        assert_eq!(js_unescape(r#"a\"b\"#), "a\"b\\");
        assert_eq!(js_unescape(r"\x"), "x");
        assert_eq!(js_unescape(r"\u{110000000000}"), "\u{10ffff}");
    }

    #[test]
    fn b64_and_utf7() {
        assert_eq!(
            base64_text("MSBhbmQgMT0yIHNlbGVjdA==").as_deref(),
            Some("1 and 1=2 select")
        );
        assert_eq!(base64_text("helloworldfoo"), None);
        assert_eq!(utf7_decode("+ADw-script+AD4-").as_deref(), Some("<script>"));
        // the gate looks past `+`s that start no shifted run to one that does
        let decoded = utf7_decode("1+1 a+b +ACI-x");
        assert!(
            decoded.as_deref().is_some_and(|d| d.ends_with(" \"x")),
            "{decoded:?}"
        );
        assert_eq!(utf7_decode("a+b+A"), None);
        assert_eq!(utf7_decode("plain prose, no plus"), None);
    }
}
