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
/// Errors name what Go's RE2 syntax or moat cannot run (lookarounds, backreferences).
pub fn translate_go_regex(pat: &str) -> Result<String, String> {
    let chars: Vec<char> = pat.chars().collect();
    let mut out = String::with_capacity(pat.len() + 8);
    let mut i = 0;
    let mut in_class = false;
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
                'S' if !in_class => out.push_str(r"[^\t\n\x0C\r ]"),
                'C' => return Err("\\C (any byte) is not supported".into()),
                'Z' => return Err("\\Z is not supported".into()),
                _ => {
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
                }
                '[' => {
                    if chars.get(i + 1) == Some(&':') {
                        // POSIX class [:name:]
                        let mut j = i + 2;
                        while j + 1 < chars.len() && !(chars[j] == ':' && chars[j + 1] == ']') {
                            j += 1;
                        }
                        if j + 1 < chars.len() {
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
                _ => out.push(c),
            }
            i += 1;
            continue;
        }
        match c {
            '[' => {
                in_class = true;
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
                out.push(c);
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
    let build = |unicode: bool| {
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
    };
    match build(false) {
        Ok(re) => Ok(re),
        Err(e) => build(true).map_err(|_| e),
    }
}

pub(super) fn compile_go(pat: &str) -> Result<Regex, String> {
    let t = translate_go_regex(pat)?;
    compile(&t)
}

pub(super) fn parse_hir(pat: &str) -> Option<regex_syntax::hir::Hir> {
    let t = translate_go_regex(pat).ok()?;
    regex_syntax::ParserBuilder::new()
        .unicode(false)
        .utf8(false)
        .build()
        .parse(&t)
        .ok()
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
