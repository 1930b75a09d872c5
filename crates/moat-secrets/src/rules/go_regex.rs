//! Go RE2 patterns in the Rust `regex` dialect: translation and compilation
//! with the byte semantics gitleaks' patterns expect.

use regex_automata::meta::Regex;
use regex_automata::util::syntax;

/// Limit on the compiled NFA of one regex (bytes). gitleaks' largest rule needs
/// well under this in byte mode.
pub const REGEX_SIZE_LIMIT: usize = 16 << 20;
/// Limit on the lazy-DFA cache of one regex (bytes).
pub const DFA_CACHE_LIMIT: usize = 2 << 20;

/// Translates a Go RE2 pattern into the Rust `regex` dialect.
///
/// * a `{` that does not start `{n}`, `{n,}` or `{n,m}` is a literal in Go: escaped;
/// * Go `\s` is `[\t\n\f\r ]` (no `\v`): spelled out;
/// * `\Q...\E` literal text is escaped;
/// * inside classes, `[` (not `[:name:]`), `&` and `~` are literal in Go: escaped
///   (Rust would read nested classes and set operations).
///
/// * with `runes` (for byte-mode compilation), what matches any character in Go
///   matches one whole UTF-8 character here, as Go reads text rune by rune: `.`,
///   `\S`, `\W`, `\D` and classes such as `[^"]` or `[\S]` take a valid
///   multi-byte sequence whole, or one invalid byte (Go's U+FFFD), so `.{0,200}`
///   counts characters and a match followed by `é` ends after it, not inside it.
///   Two differences remain (docs/secrets.md): the engine may still read a valid
///   character's bytes one by one when only that lets a minimum count be met
///   (`bad_.{2}!` matches `bad_é!`; Go's decoder never splits `é`, but a lone
///   lead byte must stay readable as one character, as Latin-1 text has them),
///   and Go's `(?i)` also folds `s` and `k` into U+017F and U+212A.
///
/// Errors name what Go's RE2 syntax or moat cannot run (lookarounds, backreferences).
pub fn translate_go_regex(pat: &str) -> Result<String, String> {
    translate(pat, true)
}

/// One non-ASCII character as Go's decoder reads it: a valid UTF-8 sequence of
/// two to four bytes, else one byte (which Go reads as U+FFFD). Byte-mode syntax.
const NON_ASCII_RUNE: &str = r"(?:[\xC2-\xDF][\x80-\xBF]|\xE0[\xA0-\xBF][\x80-\xBF]|[\xE1-\xEC\xEE\xEF][\x80-\xBF]{2}|\xED[\x80-\x9F][\x80-\xBF]|\xF0[\x90-\xBF][\x80-\xBF]{2}|[\xF1-\xF3][\x80-\xBF]{3}|\xF4[\x80-\x8F][\x80-\xBF]{2}|[\x80-\xFF])";

/// `ascii` (a byte-mode class that matches no byte above 0x7F), or any non-ASCII
/// character.
fn ascii_or_rune(ascii: &str) -> String {
    format!("(?:{ascii}|{NON_ASCII_RUNE})")
}

/// The class being translated: where it starts in the output, and what decides
/// whether it matches every non-ASCII character.
struct Class {
    start: usize,
    negated: bool,
    /// A member that matches every non-ASCII character (`\S`, `\W`, `\D`, `[:^x:]`).
    any_non_ascii_member: bool,
    /// A member that names some non-ASCII characters only (a literal, `\x{...}`,
    /// `\p`): such a class keeps byte semantics.
    some_non_ascii_member: bool,
}

fn translate(pat: &str, runes: bool) -> Result<String, String> {
    let chars: Vec<char> = pat.chars().collect();
    let mut out = String::with_capacity(pat.len() + 8);
    let mut i = 0;
    let mut in_class = false;
    let mut class = Class {
        start: 0,
        negated: false,
        any_non_ascii_member: false,
        some_non_ascii_member: false,
    };
    // Go's `s` flag (`.` matches `\n`) per open group, the current one last.
    let mut dot_nl = vec![false];
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            let Some(&n) = chars.get(i + 1) else {
                return Err("trailing backslash".into());
            };
            match n {
                '1'..='9' => return Err(format!("backreference \\{n} is not supported")),
                'k' | 'g' => return Err(format!("backreference \\{n} is not supported")),
                'Q' => {
                    let mut j = i + 2;
                    while j < chars.len() && !(chars[j] == '\\' && chars.get(j + 1) == Some(&'E')) {
                        let ch = chars[j];
                        if ch.is_ascii_punctuation() {
                            out.push('\\');
                        }
                        out.push(ch);
                        j += 1;
                    }
                    i = (j + 2).min(chars.len());
                    continue;
                }
                's' => {
                    out.push_str(if in_class {
                        r"\t\n\x0C\r "
                    } else {
                        r"[\t\n\x0C\r ]"
                    });
                }
                'S' if !in_class && runes => {
                    out.push_str(&ascii_or_rune(r"[^\t\n\x0C\r \x80-\xFF]"))
                }
                'S' if !in_class => out.push_str(r"[^\t\n\x0C\r ]"),
                'W' if !in_class && runes => {
                    out.push_str(&ascii_or_rune(r"[^0-9A-Za-z_\x80-\xFF]"))
                }
                'D' if !in_class && runes => out.push_str(&ascii_or_rune(r"[^0-9\x80-\xFF]")),
                'C' => return Err("\\C (any byte) is not supported".into()),
                'Z' => return Err("\\Z is not supported".into()),
                _ => {
                    if in_class {
                        match n {
                            'S' | 'W' | 'D' => class.any_non_ascii_member = true,
                            'x' | 'p' | 'P' => class.some_non_ascii_member = true,
                            _ => {}
                        }
                    }
                    out.push('\\');
                    out.push(n);
                }
            }
            i += 2;
            continue;
        }
        if in_class {
            match c {
                ']' => {
                    in_class = false;
                    out.push(']');
                    let all_non_ascii =
                        !class.some_non_ascii_member && class.any_non_ascii_member != class.negated;
                    if runes && all_non_ascii {
                        // Its ASCII part, then any non-ASCII character whole.
                        let ascii = format!(r"[{}&&[\x00-\x7F]]", &out[class.start..]);
                        out.truncate(class.start);
                        out.push_str(&ascii_or_rune(&ascii));
                    }
                }
                '[' => {
                    if chars.get(i + 1) == Some(&':') {
                        // POSIX class [:name:]
                        let mut j = i + 2;
                        while j + 1 < chars.len() && !(chars[j] == ':' && chars[j + 1] == ']') {
                            j += 1;
                        }
                        if j + 1 < chars.len() {
                            if chars.get(i + 2) == Some(&'^') {
                                class.any_non_ascii_member = true;
                            }
                            out.extend(&chars[i..j + 2]);
                            i = j + 2;
                            continue;
                        }
                    }
                    out.push_str("\\[");
                }
                '&' | '~' => {
                    out.push('\\');
                    out.push(c);
                }
                _ => {
                    if !c.is_ascii() {
                        class.some_non_ascii_member = true;
                    }
                    out.push(c);
                }
            }
            i += 1;
            continue;
        }
        match c {
            '[' => {
                in_class = true;
                class = Class {
                    start: out.len(),
                    negated: chars.get(i + 1) == Some(&'^'),
                    any_non_ascii_member: false,
                    some_non_ascii_member: false,
                };
                out.push('[');
                i += 1;
                if chars.get(i) == Some(&'^') {
                    out.push('^');
                    i += 1;
                }
                // A `]` right after `[` or `[^` is a literal.
                if chars.get(i) == Some(&']') {
                    out.push_str("\\]");
                    i += 1;
                }
                continue;
            }
            '(' if chars.get(i + 1) == Some(&'?') => {
                let rest: String = chars[i + 2..chars.len().min(i + 5)].iter().collect();
                if rest.starts_with('=') || rest.starts_with('!') {
                    return Err(format!("lookahead (?{} is not supported", &rest[..1]));
                }
                if rest.starts_with("<=") || rest.starts_with("<!") {
                    return Err(format!("lookbehind (?{} is not supported", &rest[..2]));
                }
                if rest.starts_with('>') {
                    return Err("atomic group (?> is not supported".into());
                }
                // Flags: `(?flags)` sets them for the rest of the group, `(?flags:`
                // opens a group with them; names and `(?:` open a plain group.
                let mut j = i + 2;
                while j < chars.len() && matches!(chars[j], 'i' | 'm' | 's' | 'U' | '-') {
                    j += 1;
                }
                let current = *dot_nl.last().unwrap_or(&false);
                let with_flags = || {
                    let flags: String = chars[i + 2..j].iter().collect();
                    let (on, off) = flags.split_once('-').unwrap_or((&flags, ""));
                    (current || on.contains('s')) && !off.contains('s')
                };
                match chars.get(j) {
                    Some(')') => {
                        let set = with_flags();
                        if let Some(last) = dot_nl.last_mut() {
                            *last = set;
                        }
                    }
                    Some(':') => dot_nl.push(with_flags()),
                    _ => dot_nl.push(current),
                }
                out.push(c);
            }
            '(' => {
                dot_nl.push(*dot_nl.last().unwrap_or(&false));
                out.push(c);
            }
            ')' => {
                if dot_nl.len() > 1 {
                    dot_nl.pop();
                }
                out.push(c);
            }
            '.' if runes => {
                out.push_str(&ascii_or_rune(if *dot_nl.last().unwrap_or(&false) {
                    r"[\x00-\x7F]"
                } else {
                    r"[^\n\x80-\xFF]"
                }));
            }
            '{' => {
                let mut j = i + 1;
                let mut digits1 = 0;
                while j < chars.len() && chars[j].is_ascii_digit() {
                    j += 1;
                    digits1 += 1;
                }
                let mut valid = false;
                if digits1 > 0 && j < chars.len() {
                    if chars[j] == '}' {
                        valid = true;
                    } else if chars[j] == ',' {
                        j += 1;
                        while j < chars.len() && chars[j].is_ascii_digit() {
                            j += 1;
                        }
                        valid = j < chars.len() && chars[j] == '}';
                    }
                }
                if valid {
                    out.push('{');
                } else {
                    out.push_str("\\{");
                }
            }
            _ => out.push(c),
        }
        i += 1;
    }
    if in_class {
        return Err("missing closing ]".into());
    }
    Ok(out)
}

/// Compiles a (translated) pattern with byte semantics: ASCII `\w \d \b`, `.`
/// matching any byte but `\n`, as gitleaks' patterns expect. Patterns that need
/// Unicode classes (`\pL`) are compiled in Unicode mode instead.
pub fn compile(pat: &str) -> Result<Regex, String> {
    match build(pat, false) {
        Ok(re) => Ok(re),
        Err(e) => build(pat, true).map_err(|_| e),
    }
}

fn build(pat: &str, unicode: bool) -> Result<Regex, String> {
    Regex::builder()
        .syntax(syntax::Config::new().unicode(unicode).utf8(false))
        .configure(
            Regex::config()
                .utf8_empty(false)
                .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
                .onepass_size_limit(Some(1 << 20))
                .dfa_size_limit(Some(1 << 20))
                .hybrid_cache_capacity(DFA_CACHE_LIMIT),
        )
        .build(pat)
        .map_err(|e| e.to_string().replace('\n', " "))
}

/// Compiles Go patterns, joined as alternatives as gitleaks joins an allowlist's
/// (`(?:a|b|c)`; flags set inside one carry over to the following ones, in Go as
/// in Rust): in byte mode with Go's rune reading of `.` and negated classes, or,
/// for patterns byte mode cannot hold (`\pL`), as [`compile`] does. Errors start
/// with `what` (the allowlist field).
pub(super) fn compile_go_alternatives(what: &str, pats: &[&str]) -> Result<Regex, String> {
    let join = |runes: bool| -> Result<String, String> {
        let mut parts = Vec::with_capacity(pats.len());
        for p in pats {
            parts.push(translate(p, runes).map_err(|e| format!("{what} `{p}`: {e}"))?);
        }
        Ok(format!("(?:{})", parts.join("|")))
    };
    build(&join(true)?, false)
        .or_else(|_| compile(&join(false)?).map_err(|e| format!("{what}: {e}")))
}

/// Compiles a Go pattern: in byte mode with Go's rune reading of `.` and negated
/// classes, or, for patterns byte mode cannot hold (`\pL`), as [`compile`] does.
pub(super) fn compile_go(pat: &str) -> Result<Regex, String> {
    build(&translate(pat, true)?, false).or_else(|_| compile(&translate(pat, false)?))
}

/// The pattern's syntax tree as [`compile_go`] compiles it (byte mode).
pub(super) fn parse_hir(pat: &str) -> Option<regex_syntax::hir::Hir> {
    let parse = |t: &str| {
        regex_syntax::ParserBuilder::new()
            .unicode(false)
            .utf8(false)
            .build()
            .parse(t)
            .ok()
    };
    parse(&translate(pat, true).ok()?).or_else(|| parse(&translate(pat, false).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn translate_braces_and_classes() {
        assert_eq!(
            translate_go_regex(r"^\$(?:\d+|{\d+})$").unwrap(),
            r"^\$(?:\d+|\{\d+})$"
        );
        assert_eq!(
            translate_go_regex(r"a{2,3}b{4}c{5,}").unwrap(),
            r"a{2,3}b{4}c{5,}"
        );
        assert_eq!(translate_go_regex(r"[[]x").unwrap(), r"[\[]x");
        assert_eq!(translate_go_regex(r"[]a]").unwrap(), r"[\]a]");
        assert_eq!(
            translate_go_regex(r"[[:alnum:]&]").unwrap(),
            r"[[:alnum:]\&]"
        );
        assert_eq!(translate_go_regex(r"\Qa.b\E+").unwrap(), r"a\.b+");
        assert_eq!(
            translate_go_regex(r"\s[\s]").unwrap(),
            r"[\t\n\x0C\r ][\t\n\x0C\r ]"
        );
        assert!(translate_go_regex(r"a(?=b)")
            .unwrap_err()
            .contains("lookahead"));
        assert!(translate_go_regex(r"(?<!a)b")
            .unwrap_err()
            .contains("lookbehind"));
        assert!(translate_go_regex(r"(a)\1")
            .unwrap_err()
            .contains("backreference"));
        assert!(translate_go_regex(r"(?P<n>a)(?<m>b)").is_ok());
    }
}
