//! The compiled ruleset: what the scanner runs, and the errors of loading one.

use std::sync::Arc;

use aho_corasick::AhoCorasick;
use regex_automata::meta::Regex;

/// A ruleset file that cannot be used at all.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// The TOML is malformed or has fields of the wrong type.
    #[error("{origin}: invalid rules TOML: {message}")]
    Toml {
        /// Where the text came from.
        origin: String,
        /// The parser's message (with line and column).
        message: String,
    },
    /// The file is well-formed but violates the format's rules (gitleaks refuses it too).
    #[error("{origin}: {message}")]
    Invalid {
        /// Where the text came from.
        origin: String,
        /// What is wrong, naming the rule.
        message: String,
    },
    /// The rules file could not be read.
    #[error("{origin}: cannot read rules: {message}")]
    Io {
        /// The path.
        origin: String,
        /// The OS error.
        message: String,
    },
}

/// A rule (or part of one) that moat loaded but cannot run, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SkippedRule {
    /// The rule id (`<global allowlist>` for the global allowlist).
    pub rule_id: String,
    /// Why it cannot be run, e.g. `regex: lookaround (?= is not supported`.
    pub reason: String,
}

/// What an allowlist's regexes are tested against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegexTarget {
    /// The extracted secret (default).
    Secret,
    /// The whole regex match.
    Match,
    /// The line(s) holding the match.
    Line,
}

/// How an allowlist's criteria combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Any criterion allows the finding (default).
    Or,
    /// Every defined criterion must hold.
    And,
}

/// A compiled allowlist.
#[derive(Debug, Clone)]
pub struct Allowlist {
    /// OR or AND.
    pub condition: Condition,
    /// secret, match or line.
    pub target: RegexTarget,
    /// Commits listed (lowercased): they match only in history scans
    /// ([`Scanner::scan_in_commit`](crate::Scanner::scan_in_commit)).
    pub commits: Vec<String>,
    /// All path regexes joined as gitleaks does, `(?:a|b)`.
    pub paths: Option<Regex>,
    /// All content regexes joined as gitleaks does.
    pub regexes: Option<Regex>,
    /// Lowercased stopwords.
    pub stopwords: Option<AhoCorasick>,
}

impl Allowlist {
    /// True when `commit` (a SHA, any case) is listed.
    fn commit_allows(&self, commit: Option<&str>) -> bool {
        commit
            .filter(|c| !c.is_empty())
            .is_some_and(|c| self.commits.iter().any(|x| x.eq_ignore_ascii_case(c)))
    }

    /// gitleaks `checkCommitOrPathAllowed` for one allowlist.
    pub(crate) fn path_allows(&self, path: Option<&str>, commit: Option<&str>) -> bool {
        let path = path.filter(|p| !p.is_empty());
        let commit = commit.filter(|c| !c.is_empty());
        if path.is_none() && commit.is_none() {
            return false;
        }
        let path_ok = path.is_some_and(|p| {
            self.paths
                .as_ref()
                .is_some_and(|re| re.is_match(p.as_bytes()))
        });
        let commit_ok = self.commit_allows(commit);
        match self.condition {
            Condition::Or => path_ok || commit_ok,
            Condition::And => {
                if self.regexes.is_some() || self.stopwords.is_some() {
                    return false;
                }
                let mut all = true;
                if !self.commits.is_empty() {
                    all &= commit_ok;
                }
                if self.paths.is_some() {
                    all &= path_ok;
                }
                all
            }
        }
    }

    /// gitleaks `checkFindingAllowed` for one allowlist.
    pub(crate) fn finding_allows(
        &self,
        secret: &[u8],
        matched: &[u8],
        line: &[u8],
        path: Option<&str>,
        commit: Option<&str>,
    ) -> bool {
        let target = match self.target {
            RegexTarget::Secret => secret,
            RegexTarget::Match => matched,
            RegexTarget::Line => line,
        };
        let regex_ok =
            !target.is_empty() && self.regexes.as_ref().is_some_and(|re| re.is_match(target));
        let stop_ok = !secret.is_empty()
            && self.stopwords.as_ref().is_some_and(|ac| {
                let lower = String::from_utf8_lossy(secret).to_lowercase();
                ac.is_match(lower.as_bytes())
            });
        match self.condition {
            Condition::Or => regex_ok || stop_ok,
            Condition::And => {
                let mut all = true;
                if !self.commits.is_empty() {
                    all &= self.commit_allows(commit);
                }
                if self.paths.is_some() {
                    let p = path.filter(|p| !p.is_empty());
                    all &= p.is_some_and(|p| {
                        self.paths
                            .as_ref()
                            .is_some_and(|re| re.is_match(p.as_bytes()))
                    });
                }
                if self.regexes.is_some() {
                    all &= regex_ok;
                }
                if self.stopwords.is_some() {
                    all &= stop_ok;
                }
                all
            }
        }
    }
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Rule id.
    pub id: Arc<str>,
    /// Description.
    pub description: Arc<str>,
    /// The content regex (absent for path-only rules).
    pub regex: Option<Regex>,
    /// The file-path regex.
    pub path: Option<Regex>,
    /// `secretGroup` (0: first non-empty group).
    pub secret_group: usize,
    /// Minimum entropy (0: none).
    pub entropy: f64,
    /// Lowercased keywords.
    pub keywords: Vec<String>,
    /// Tags.
    pub tags: Vec<String>,
    /// Rule allowlists (including global ones with `targetRules` naming this rule).
    pub allowlists: Vec<Allowlist>,
    /// True for rules whose id contains "generic" (gitleaks' post-filter).
    pub generic: bool,
    /// When every match contains one of the rule's keywords and matches are at most
    /// this many bytes long, the regex only runs in windows around keyword hits.
    pub window: Option<usize>,
    /// For rules with unbounded matches: a bounded leading part of the regex
    /// (top-level concatenation up to the first unbounded element) whose matches
    /// contain a keyword, with its maximum length. Every match of the rule starts
    /// where this prefix matches, so the rule runs anchored at those starts only.
    pub prefix: Option<(Regex, usize)>,
    /// The case of the keyword in every match, when the regex fixes it (the
    /// region the rule runs over with `window` or `prefix` contains it): keyword
    /// hits in another case start no region.
    pub keyword_case: Option<KeywordCase>,
    /// For a rule with a `window`: every match starts with one of the keywords (in
    /// `keyword_case` when set), so the regex runs anchored at the start of each
    /// keyword hit rather than over the hit's window.
    pub starts_at_keyword: bool,
    /// `[[rules.required]]`: auxiliary rules that must match near a finding of
    /// this rule for it to be reported (empty: an ordinary rule).
    pub required: Vec<Required>,
    /// `skipReport`: the rule only runs as another rule's required rule.
    pub skip_report: bool,
}

/// The letter case a rule's regex requires of its keyword (see [`Rule::keyword_case`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeywordCase {
    /// Every letter upper case (`SK` of `\b(SK[0-9a-f]{32})\b`).
    Upper,
    /// Every letter lower case (`ghp_` of `ghp_[0-9a-zA-Z]{36}`).
    Lower,
}

impl KeywordCase {
    /// True when the keyword occurrence `hit` has this case.
    pub fn admits(self, hit: &[u8]) -> bool {
        match self {
            KeywordCase::Upper => !hit.iter().any(u8::is_ascii_lowercase),
            KeywordCase::Lower => !hit.iter().any(u8::is_ascii_uppercase),
        }
    }
}

/// One `[[rules.required]]` entry of a composite rule.
#[derive(Debug, Clone)]
pub struct Required {
    /// Index of the required rule in [`RuleSet::rules`].
    pub rule: usize,
    /// Its id.
    pub rule_id: Arc<str>,
    /// `withinLines`: largest distance between the start lines of the two findings.
    pub within_lines: Option<i64>,
    /// `withinColumns`: largest distance between their start columns.
    pub within_columns: Option<i64>,
}

/// A parsed and compiled ruleset.
#[derive(Debug, Clone)]
pub struct RuleSet {
    /// Rules in file order.
    pub rules: Vec<Rule>,
    /// Global allowlists.
    pub global: Vec<Allowlist>,
    /// Rules (or parts) that cannot run, with reasons.
    pub skipped: Vec<SkippedRule>,
}
