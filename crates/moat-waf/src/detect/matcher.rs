//! Case-insensitive multi-pattern matchers shared by the structural detectors.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use crate::util::find_ci;

/// A case-insensitive multi-pattern matcher built once; `None` only if the
/// automaton could not be built (then callers fall back to per-pattern search).
pub(super) fn matcher<'a>(pats: impl IntoIterator<Item = &'a str>) -> Option<AhoCorasick> {
    AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::LeftmostFirst)
        .build(pats)
        .ok()
}

/// First match of any pattern: (pattern index, start, end).
pub(super) fn first_match(
    ac: &Option<AhoCorasick>,
    pats: &[&str],
    b: &[u8],
) -> Option<(usize, usize, usize)> {
    match ac {
        Some(ac) => ac
            .find(b)
            .map(|m| (m.pattern().as_usize(), m.start(), m.end())),
        None => pats
            .iter()
            .enumerate()
            .find_map(|(i, t)| find_ci(b, t.as_bytes()).map(|p| (i, p, p + t.len()))),
    }
}
