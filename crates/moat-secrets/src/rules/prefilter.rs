//! Keyword coverage analysis: which rules may run only around their keyword
//! hits. A rule whose every match contains one of its keywords and has a
//! bounded length gets a window; a rule with unbounded matches whose bounded
//! leading part contains a keyword gets a prefix filter.

use regex_automata::meta::Regex;

use crate::rules::model::KeywordCase;

use crate::rules::go_regex::{DFA_CACHE_LIMIT, REGEX_SIZE_LIMIT};

// ---- keyword coverage analysis --------------------------------------------

const MAX_SET: usize = 128;
const MAX_STR: usize = 64;

/// When every match of `hir` contains one of `keywords` (ASCII case-insensitively)
/// and matches have a bounded length, returns that maximum length.
pub(super) fn keyword_window(hir: &regex_syntax::hir::Hir, keywords: &[String]) -> Option<usize> {
    let max = hir.properties().maximum_len()?;
    if keywords.iter().any(|k| k.is_empty() || !k.is_ascii()) {
        return None;
    }
    let kws: Vec<&[u8]> = keywords.iter().map(|k| k.as_bytes()).collect();
    if covers(hir, &kws, true) {
        Some(max)
    } else {
        None
    }
}

/// The elements of the top-level concatenation of `h`, with capture groups and
/// nested concatenations spliced in: where a match starts does not depend on
/// groups (`\b(ey[a-z]{17,}...)` starts with `\b`, `e`, `y`).
fn flat_concat(h: &regex_syntax::hir::Hir, out: &mut Vec<regex_syntax::hir::Hir>) {
    use regex_syntax::hir::HirKind;
    match h.kind() {
        HirKind::Concat(hs) => {
            for c in hs {
                flat_concat(c, out);
            }
        }
        HirKind::Capture(c) => flat_concat(&c.sub, out),
        _ => out.push(h.clone()),
    }
}

/// The bounded leading part of a top-level concatenation (see [`flat_concat`]):
/// its elements up to the first unbounded one; `None` when every element or none
/// is bounded.
pub(super) fn bounded_prefix(hir: &regex_syntax::hir::Hir) -> Option<regex_syntax::hir::Hir> {
    let mut children = Vec::new();
    flat_concat(hir, &mut children);
    let n = children
        .iter()
        .take_while(|c| c.properties().maximum_len().is_some())
        .count();
    if n == 0 || n == children.len() {
        return None;
    }
    children.truncate(n);
    Some(regex_syntax::hir::Hir::concat(children))
}

/// A rule's [`bounded_prefix`], when its matches contain one of `keywords`,
/// compiled, with its maximum length.
pub(super) fn prefix_filter(
    prefix: &regex_syntax::hir::Hir,
    keywords: &[String],
) -> Option<(Regex, usize)> {
    let max = prefix.properties().maximum_len()?;
    keyword_window(prefix, keywords)?;
    let re = Regex::builder()
        .configure(
            Regex::config()
                .utf8_empty(false)
                .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
                .hybrid_cache_capacity(DFA_CACHE_LIMIT),
        )
        .build_from_hir(prefix)
        .ok()?;
    Some((re, max))
}

/// The letter case of the keyword that every match of `hir` contains, when the
/// regex fixes it: `\b(SK[0-9a-f]{32})\b` with keyword `sk` contains `SK`, so a
/// keyword hit on `desk` cannot be part of a match and the rule need not run
/// around it. `None` when matches may hold a keyword in mixed or either case
/// (`(?i)`), or when the keywords have no letters.
pub(super) fn keyword_case(
    hir: &regex_syntax::hir::Hir,
    keywords: &[String],
) -> Option<KeywordCase> {
    if !keywords
        .iter()
        .any(|k| k.bytes().any(|b| b.is_ascii_alphabetic()))
    {
        return None;
    }
    [KeywordCase::Upper, KeywordCase::Lower]
        .into_iter()
        .find(|case| {
            let cased: Vec<Vec<u8>> = keywords
                .iter()
                .map(|k| match case {
                    KeywordCase::Upper => k.to_ascii_uppercase().into_bytes(),
                    KeywordCase::Lower => k.to_ascii_lowercase().into_bytes(),
                })
                .collect();
            let kws: Vec<&[u8]> = cased.iter().map(Vec::as_slice).collect();
            covers(hir, &kws, false)
        })
}

/// Whether every match of `hir` starts with one of `keywords`: in `case` when the
/// regex fixes the keyword's case (see [`keyword_case`]), ASCII case-insensitively
/// otherwise. `\b(SK[0-9a-f]{32})\b` with keyword `sk` and case `Upper` does, so
/// its matches can start only where a keyword hit in that case starts, and the
/// rule needs one anchored attempt per hit instead of a search of a window.
pub(super) fn starts_with_keyword(
    hir: &regex_syntax::hir::Hir,
    keywords: &[String],
    case: Option<KeywordCase>,
) -> bool {
    let kws: Vec<Vec<u8>> = keywords
        .iter()
        .map(|k| match case {
            Some(KeywordCase::Upper) => k.to_ascii_uppercase().into_bytes(),
            _ => k.to_ascii_lowercase().into_bytes(),
        })
        .collect();
    if kws.iter().any(Vec::is_empty) {
        return false;
    }
    let starts = affix(hir, true, case.is_none());
    !starts.is_empty() && starts.iter().all(|s| kws.iter().any(|k| s.starts_with(k)))
}

fn contains_kw(s: &[u8], kws: &[&[u8]]) -> bool {
    kws.iter().any(|k| memchr::memmem::find(s, k).is_some())
}

fn all_contain(set: &[Vec<u8>], kws: &[&[u8]]) -> bool {
    !set.is_empty() && set.iter().all(|s| contains_kw(s, kws))
}

fn product(a: &[Vec<u8>], b: &[Vec<u8>]) -> Option<Vec<Vec<u8>>> {
    if a.len().saturating_mul(b.len()) > MAX_SET {
        return None;
    }
    let mut out = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            if x.len() + y.len() > MAX_STR {
                return None;
            }
            let mut s = x.clone();
            s.extend_from_slice(y);
            out.push(s);
        }
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// The finite language of `h` when small, lowercased when `fold`.
fn exact(h: &regex_syntax::hir::Hir, fold: bool) -> Option<Vec<Vec<u8>>> {
    use regex_syntax::hir::{Class, HirKind};
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => Some(vec![Vec::new()]),
        HirKind::Literal(l) if fold => Some(vec![l.0.to_ascii_lowercase()]),
        HirKind::Literal(l) => Some(vec![l.0.to_vec()]),
        HirKind::Class(Class::Bytes(c)) => {
            let mut set: Vec<Vec<u8>> = Vec::new();
            for r in c.iter() {
                if (r.end() - r.start()) as usize + set.len() >= 8 {
                    return None;
                }
                for b in r.start()..=r.end() {
                    set.push(vec![if fold { b.to_ascii_lowercase() } else { b }]);
                }
            }
            set.sort();
            set.dedup();
            Some(set)
        }
        HirKind::Class(Class::Unicode(c)) => {
            let mut set: Vec<Vec<u8>> = Vec::new();
            for r in c.iter() {
                let (s, e) = (r.start() as u32, r.end() as u32);
                if e > 0x7f || (e - s) as usize + set.len() >= 8 {
                    return None;
                }
                for b in s..=e {
                    set.push(vec![if fold {
                        (b as u8).to_ascii_lowercase()
                    } else {
                        b as u8
                    }]);
                }
            }
            set.sort();
            set.dedup();
            Some(set)
        }
        HirKind::Capture(c) => exact(&c.sub, fold),
        HirKind::Repetition(r) => {
            let sub = exact(&r.sub, fold)?;
            if r.max == Some(r.min) && r.min <= 4 {
                let mut acc = vec![Vec::new()];
                for _ in 0..r.min {
                    acc = product(&acc, &sub)?;
                }
                Some(acc)
            } else if r.min == 0 && r.max == Some(1) {
                let mut s = sub;
                s.push(Vec::new());
                s.sort();
                s.dedup();
                Some(s)
            } else {
                None
            }
        }
        HirKind::Concat(hs) => {
            let mut acc = vec![Vec::new()];
            for h in hs {
                acc = product(&acc, &exact(h, fold)?)?;
            }
            Some(acc)
        }
        HirKind::Alternation(hs) => {
            let mut acc = Vec::new();
            for h in hs {
                acc.extend(exact(h, fold)?);
                if acc.len() > MAX_SET {
                    return None;
                }
            }
            acc.sort();
            acc.dedup();
            Some(acc)
        }
    }
}

/// A set of strings one of which starts (`prefix`) or ends (`!prefix`) every
/// match of `h`, lowercased when `fold`; `[""]` when nothing useful is known.
fn affix(h: &regex_syntax::hir::Hir, prefix: bool, fold: bool) -> Vec<Vec<u8>> {
    use regex_syntax::hir::HirKind;
    if let Some(e) = exact(h, fold) {
        return e;
    }
    let unknown = || vec![Vec::new()];
    match h.kind() {
        HirKind::Capture(c) => affix(&c.sub, prefix, fold),
        HirKind::Repetition(r) if r.min >= 1 => affix(&r.sub, prefix, fold),
        HirKind::Alternation(hs) => {
            let mut acc = Vec::new();
            for h in hs {
                acc.extend(affix(h, prefix, fold));
                if acc.len() > MAX_SET {
                    return unknown();
                }
            }
            acc.sort();
            acc.dedup();
            acc
        }
        HirKind::Concat(hs) => {
            let mut acc: Vec<Vec<u8>> = vec![Vec::new()];
            let ordered: Vec<&regex_syntax::hir::Hir> = if prefix {
                hs.iter().collect()
            } else {
                hs.iter().rev().collect()
            };
            for h in ordered {
                match exact(h, fold) {
                    Some(e) => {
                        let next = if prefix {
                            product(&acc, &e)
                        } else {
                            product(&e, &acc)
                        };
                        match next {
                            Some(n) => acc = n,
                            None => return acc,
                        }
                    }
                    None => {
                        let a = affix(h, prefix, fold);
                        let next = if prefix {
                            product(&acc, &a)
                        } else {
                            product(&a, &acc)
                        };
                        return next.unwrap_or(acc);
                    }
                }
            }
            acc
        }
        _ => unknown(),
    }
}

/// True when every match of `h` contains one of `kws` (lowercase when `fold`;
/// exactly as written otherwise).
fn covers(h: &regex_syntax::hir::Hir, kws: &[&[u8]], fold: bool) -> bool {
    use regex_syntax::hir::HirKind;
    if let Some(set) = exact(h, fold) {
        if all_contain(&set, kws) {
            return true;
        }
    }
    match h.kind() {
        HirKind::Capture(c) => covers(&c.sub, kws, fold),
        HirKind::Repetition(r) if r.min >= 1 => covers(&r.sub, kws, fold),
        HirKind::Alternation(hs) => hs.iter().all(|h| covers(h, kws, fold)),
        HirKind::Concat(hs) => {
            if hs.iter().any(|h| covers(h, kws, fold)) {
                return true;
            }
            // `run`: one of these strings ends the text matched so far.
            let mut run: Vec<Vec<u8>> = vec![Vec::new()];
            for h in hs {
                if let Some(c) = product(&run, &affix(h, true, fold)) {
                    if all_contain(&c, kws) {
                        return true;
                    }
                }
                run = match exact(h, fold) {
                    Some(e) => product(&run, &e).unwrap_or_else(|| affix(h, false, fold)),
                    None => affix(h, false, fold),
                };
                if all_contain(&run, kws) {
                    return true;
                }
            }
            false
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::go_regex::parse_hir;

    #[test]
    fn coverage_analysis() {
        let kw = |ks: &[&str]| ks.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let h = parse_hir(r"(?i)\b((?:A3T[A-Z0-9]|AKIA|ASIA)[A-Z0-9]{16})\b").unwrap();
        assert_eq!(keyword_window(&h, &kw(&["a3t", "akia", "asia"])), Some(20));
        assert_eq!(keyword_window(&h, &kw(&["akia"])), None);
        let h = parse_hir(r"(?i)(?:key|passw(?:or)?d)\s{0,3}=\s{0,3}([a-z0-9]{8,40})").unwrap();
        assert!(keyword_window(&h, &kw(&["key", "passwd", "password"])).is_some());
        let h = parse_hir(r"token[a-z]+").unwrap();
        assert_eq!(keyword_window(&h, &kw(&["token"])), None, "unbounded");
    }

    #[test]
    fn keyword_case_analysis() {
        let kw = |ks: &[&str]| ks.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let case = |re: &str, ks: &[&str]| keyword_case(&parse_hir(re).unwrap(), &kw(ks));
        assert_eq!(
            case(r"\b(SK[0-9a-f]{32})\b", &["sk"]),
            Some(KeywordCase::Upper)
        );
        assert_eq!(
            case(r"ghp_[0-9a-zA-Z]{36}", &["ghp_"]),
            Some(KeywordCase::Lower)
        );
        assert_eq!(
            case(r"(?:AKIA|ASIA)[A-Z0-9]{16}", &["akia", "asia"]),
            Some(KeywordCase::Upper)
        );
        // either case, mixed case, or no letters: every hit may start a match
        assert_eq!(case(r"(?i)\b(SK[0-9a-f]{32})\b", &["sk"]), None);
        assert_eq!(case(r"(?:sk|SK)_[0-9a-f]{8}", &["sk"]), None);
        assert_eq!(case(r"Bearer [a-z]{8}", &["bearer"]), None);
        assert_eq!(case(r"-----[A-Z]{4}", &["-----"]), None);
        // the keyword in the right case must be in every match, not in some
        assert_eq!(case(r"(?:SK|[0-9]{2})_[0-9a-f]{8}", &["sk"]), None);
    }

    #[test]
    fn matches_that_start_with_a_keyword() {
        let kw = |ks: &[&str]| ks.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let starts = |re: &str, ks: &[&str]| {
            let h = parse_hir(re).unwrap();
            starts_with_keyword(&h, &kw(ks), keyword_case(&h, &kw(ks)))
        };
        assert!(starts(r"\b(SK[0-9a-f]{32})\b", &["sk"]));
        assert!(starts(r"ghp_[0-9a-zA-Z]{36}", &["ghp_"]));
        assert!(starts(
            r"(?i)\b((?:A3T[A-Z0-9]|AKIA|ASIA)[A-Z0-9]{16})\b",
            &["a3t", "akia", "asia"]
        ));
        assert!(starts(r"(?:xoxb|xoxp)-[0-9]{10}", &["xox"]));
        // the keyword inside the match, not at its start
        assert!(!starts(r"[a-z]{2}SK[0-9a-f]{8}", &["sk"]));
        assert!(!starts(
            r"(?:key|passw(?:or)?d)\s{0,3}=\s{0,3}([a-z0-9]{8,40})",
            &["passwd", "password"]
        ));
        // some alternatives start without one
        assert!(!starts(r"(?:SK|AB)[0-9a-f]{8}", &["sk"]));
        // lower-case starts for an upper-case keyword case: `Upper` drops their hits
        assert!(!starts(r"sk[0-9a-f]{4}SK", &["sk"]));
        // nothing known about the start
        assert!(!starts(r"[a-z]+SK", &["sk"]));
    }
}
