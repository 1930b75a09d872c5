//! NoSQL (MongoDB) operator and server-side JavaScript injection.

use super::{Attack, Hit};
use crate::util::{contains_ci, find_ci, starts_with_ci};

const NOSQL_OPS: &[&str] = &[
    "ne",
    "gt",
    "gte",
    "lt",
    "lte",
    "in",
    "nin",
    "regex",
    "where",
    "exists",
    "expr",
    "function",
    "accumulator",
    "elemmatch",
    "eq",
    "not",
    "nor",
    "or",
    "and",
    "type",
    "size",
    "mod",
    "all",
    "text",
    "jsonschema",
    "lookup",
];

/// A parameter or JSON key naming a MongoDB query operator (`$ne`, `user[$regex]`).
pub fn nosql_name(name: &str) -> Option<Hit> {
    let p = memchr::memchr(b'$', name.as_bytes())?;
    let rest = &name[p + 1..];
    let op: String = rest
        .bytes()
        .take_while(|c| c.is_ascii_alphabetic())
        .map(|c| c.to_ascii_lowercase() as char)
        .collect();
    let before_ok = p == 0 || name.as_bytes()[p - 1] == b'[';
    if before_ok && NOSQL_OPS.contains(&op.as_str()) {
        let conf = if matches!(
            op.as_str(),
            "or" | "and" | "not" | "eq" | "in" | "type" | "size" | "text" | "all"
        ) {
            50
        } else {
            85
        };
        return Some(Hit::new(Attack::Nosql, conf, name, p, p + 1 + op.len()));
    }
    None
}

/// MongoDB shell calls (`db.users.find(`) and server-side JS sleep loops.
pub fn nosql_js(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(p) = memchr::memmem::find(&b[from..], b"db.") {
        let at = from + p;
        from = at + 3;
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'.') {
            continue;
        }
        let rest = &s[at + 3..];
        let coll_end = rest.find('.').unwrap_or(0);
        if coll_end == 0
            || !rest[..coll_end]
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_')
        {
            continue;
        }
        let m = &rest[coll_end + 1..];
        for op in [
            "insert",
            "find",
            "drop",
            "remove",
            "update",
            "delete",
            "aggregate",
            "mapreduce",
            "getcollection",
            "dropdatabase",
            "save",
            "replace",
        ] {
            if starts_with_ci(m.as_bytes(), op.as_bytes())
                && m[op.len()..]
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .starts_with('(')
            {
                return Some(Hit::new(
                    Attack::Nosql,
                    85,
                    s,
                    at,
                    at + 3 + coll_end + 1 + op.len() + 1,
                ));
            }
        }
    }
    if contains_ci(b, b"new date") && (contains_ci(b, b"while(") || contains_ci(b, b"while (")) {
        return Some(Hit::new(Attack::Nosql, 80, s, 0, 60));
    }
    None
}

/// A break out of a string or a number in a MongoDB `$where` clause into the
/// JavaScript around it: `';return 'a'=='a' && ''=='`, `0;return true`,
/// `' && this.password.match(/.*/)//`.
///
/// The value must start with what it breaks out of (quotes or digits), then either a
/// `;` and a `return` of a value, or `&&` / `||` and a field of the document
/// (`this.`). Prose that starts with a number (`1; return within 30 days`) returns
/// words, not a value.
pub fn js_breakout(s: &str) -> Option<Hit> {
    let t = s.trim_start();
    let b = t.as_bytes();
    let lead = b
        .iter()
        .take_while(|&&c| matches!(c, b'\'' | b'"') || c.is_ascii_digit())
        .count();
    if lead == 0 || lead > 8 {
        return None;
    }
    let rest = t[lead..].trim_start();
    let found = if let Some(r) = rest.strip_prefix(';') {
        let r = r.trim_start().as_bytes();
        starts_with_ci(r, b"return") && {
            let e = &r[6..];
            let value = e.trim_ascii_start();
            let boundary = matches!(e.first(), Some(b' ' | b'\t' | b'(' | b'\'' | b'"' | b'!'));
            boundary
                && (matches!(
                    value.first(),
                    Some(b'\'' | b'"' | b'(' | b'!' | b'0'..=b'9')
                ) || [&b"true"[..], b"false", b"this."]
                    .iter()
                    .any(|k| starts_with_ci(value, k)))
        }
    } else if let Some(r) = rest.strip_prefix("&&").or_else(|| rest.strip_prefix("||")) {
        // a number then `&& this.` is arithmetic prose as often as code
        matches!(b[0], b'\'' | b'"') && r.trim_start().starts_with("this.")
    } else {
        false
    };
    found.then(|| Hit::new(Attack::Nosql, 80, s, 0, s.len()))
}

/// NoSQL operators or `$where` JavaScript inside a value.
pub fn nosql_value(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    if let Some(p) = find_ci(b, b"$where") {
        return Some(Hit::new(Attack::Nosql, 85, s, p, p + 40));
    }
    let mut from = 0;
    while let Some(p) = memchr::memchr(b'$', &b[from..]) {
        let at = from + p;
        from = at + 1;
        let before = if at == 0 { b' ' } else { b[at - 1] };
        if !matches!(before, b'{' | b'"' | b'\'' | b'[' | b' ' | b',') {
            continue;
        }
        if let Some(h) = nosql_name(&s[at..]) {
            let after_name = &s[at + 1..];
            let shaped = after_name
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .trim_start_matches(['"', '\'', ']'])
                .trim_start()
                .starts_with(':')
                || before == b'[';
            let logic_array = after_name
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .trim_start_matches(['"', '\''])
                .trim_start()
                .strip_prefix(':')
                .is_some_and(|r| r.trim_start().starts_with('['));
            if shaped && (h.confidence >= 85 || logic_array) {
                return Some(Hit::new(Attack::Nosql, 80, s, at, at + 20));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nosql_cases() {
        assert!(nosql_name("user[$ne]").is_some());
        assert!(nosql_name("price$").is_none());
        assert!(nosql_value("{\"$where\": \"sleep(100)\"}").is_some());
        for probe in [
            "';return 'a'=='a' && ''=='",
            "0;return true",
            "\";return(true);var x=\"",
            "' && this.password.match(/.*/)//",
            "'||this.role=='admin",
        ] {
            assert!(js_breakout(probe).is_some(), "{probe}");
        }
        for benign in [
            "1; return within 30 days",
            "'quoted'; returns are free",
            "2023 && this.year",
            "it's; return true",
            "42",
        ] {
            assert!(js_breakout(benign).is_none(), "{benign}");
        }
    }
}
