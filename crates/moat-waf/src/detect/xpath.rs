//! XPath injection.

use std::sync::LazyLock;

use aho_corasick::AhoCorasick;

use super::matcher::{first_match, matcher};
use super::{Attack, Hit};

static XPATH_AC: LazyLock<Option<AhoCorasick>> =
    LazyLock::new(|| matcher(XPATH_MARKERS.iter().copied()));

/// XPath injection.
pub fn xpath(s: &str) -> Option<Hit> {
    first_match(&XPATH_AC, XPATH_MARKERS, s.as_bytes())
        .map(|(_, p, _)| Hit::new(Attack::Xpath, 80, s, p, p + 30))
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
