//! XPath injection.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::matcher::{first_match, matcher};
use super::{Attack, Hit};
use crate::util::starts_with_ci;

static XPATH_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(XPATH_MARKERS.iter().copied()));

/// XPath injection.
pub fn xpath(s: &str) -> Option<Hit> {
    first_match(&XPATH_AC, XPATH_MARKERS, s.as_bytes())
        .map(|(_, p, _)| Hit::new(Attack::Xpath, 80, s, p, p + 30))
        .or_else(|| breakout_call(s))
}

/// XPath's string functions, the blind probe's tools.
const FUNCTIONS: &[&[u8]] = &[
    b"starts-with(",
    b"contains(",
    b"substring(",
    b"string-length(",
    b"normalize-space(",
    b"translate(",
];

/// A quote closed, then `and` / `or` and one of XPath's string functions: the
/// blind probe that reads a node a character at a time
/// (`') and starts-with(../password,'c`, `' or contains(name,'a`).
fn breakout_call(s: &str) -> Option<Hit> {
    let b = s.as_bytes();
    // the index past a run of whitespace at `i`, or None when there is none
    let blanks = |i: usize| {
        let n = b[i..]
            .iter()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
        (n > 0).then_some(i + n)
    };
    for q in memchr::memchr2_iter(b'\'', b'"', b).take(16) {
        let closed = q + 1 + usize::from(b.get(q + 1) == Some(&b')'));
        let Some(op) = blanks(closed) else { continue };
        let word = if starts_with_ci(&b[op..], b"and") {
            3
        } else if starts_with_ci(&b[op..], b"or") {
            2
        } else {
            continue;
        };
        let Some(call) = blanks(op + word) else {
            continue;
        };
        if FUNCTIONS.iter().any(|f| starts_with_ci(&b[call..], f)) {
            return Some(Hit::new(Attack::Xpath, 80, s, q, call + 16));
        }
    }
    None
}

const XPATH_MARKERS: &[&str] = &[
    "::node()",
    "child::",
    "descendant::",
    "ancestor::",
    "following-sibling::",
    "name(/",
    "count(/",
    "string-length(name(",
    "substring(name(",
    "]|//",
    "] | //",
    "or name()=",
    "position()=",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakouts() {
        for probe in [
            "') and starts-with(../password,'c",
            "' and starts-with(password,'a')",
            "') or contains(name,'a",
            "\" and substring(//user[1]/pass,1,1)=\"a",
        ] {
            assert!(xpath(probe).is_some(), "{probe}");
        }
        for benign in [
            "the 'and contains(' text",
            "don't and contains",
            "'Rock' and Roll",
            "\"Tom\" or contains the answer",
        ] {
            assert!(xpath(benign).is_none(), "{benign}");
        }
    }
}
