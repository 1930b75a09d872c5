//! The gitleaks rule format: TOML model, Go-regex translation and compilation.
//!
//! The TOML model mirrors gitleaks' `ViperConfig` (config/config.go): `[[rules]]`
//! with `id`, `description`, `regex`, `secretGroup`, `entropy`, `keywords`, `path`,
//! `tags`, `[[rules.allowlists]]` (or the legacy `[rules.allowlist]`), the global
//! `[[allowlists]]` (or legacy `[allowlist]`) with `targetRules`, composite rules
//! (`[[rules.required]]` with `withinLines` / `withinColumns`, `skipReport`) and
//! `[extend]` (`useDefault`, `path`, `disabledRules`) merged as gitleaks'
//! `Config.extend` does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use aho_corasick::AhoCorasick;
use regex_automata::meta::Regex;
use regex_automata::util::syntax;
use serde::Deserialize;

/// Limit on the compiled NFA of one regex (bytes). gitleaks' largest rule needs
/// well under this in byte mode.
pub const REGEX_SIZE_LIMIT: usize = 16 << 20;
/// Limit on the lazy-DFA cache of one regex (bytes).
pub const DFA_CACHE_LIMIT: usize = 2 << 20;

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

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    #[allow(dead_code)]
    title: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    min_version: Option<String>,
    #[serde(default)]
    extend: Option<RawExtend>,
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default)]
    allowlist: Option<RawAllowlist>,
    #[serde(default)]
    allowlists: Vec<RawAllowlist>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawExtend {
    #[serde(default)]
    use_default: bool,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    disabled_rules: Vec<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawRule {
    #[serde(default)]
    id: String,
    #[serde(default)]
    description: String,
    #[serde(default)]
    regex: String,
    #[serde(default)]
    path: String,
    #[serde(default)]
    secret_group: i64,
    #[serde(default)]
    entropy: f64,
    #[serde(default)]
    keywords: Vec<String>,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    allowlist: Option<RawAllowlist>,
    #[serde(default)]
    allowlists: Vec<RawAllowlist>,
    #[serde(default)]
    required: Vec<RawRequired>,
    #[serde(default)]
    skip_report: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawRequired {
    #[serde(default)]
    id: String,
    #[serde(default)]
    within_lines: Option<i64>,
    #[serde(default)]
    within_columns: Option<i64>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
struct RawAllowlist {
    #[serde(default)]
    #[allow(dead_code)]
    description: String,
    #[serde(default)]
    condition: String,
    #[serde(default)]
    commits: Vec<String>,
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    regex_target: String,
    #[serde(default)]
    regexes: Vec<String>,
    #[serde(default)]
    stopwords: Vec<String>,
    #[serde(default)]
    target_rules: Vec<String>,
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
    /// `[[rules.required]]`: auxiliary rules that must match near a finding of
    /// this rule for it to be reported (empty: an ordinary rule).
    pub required: Vec<Required>,
    /// `skipReport`: the rule only runs as another rule's required rule.
    pub skip_report: bool,
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

fn compile_go(pat: &str) -> Result<Regex, String> {
    let t = translate_go_regex(pat)?;
    compile(&t)
}

fn parse_hir(pat: &str) -> Option<regex_syntax::hir::Hir> {
    let t = translate_go_regex(pat).ok()?;
    regex_syntax::ParserBuilder::new()
        .unicode(false)
        .utf8(false)
        .build()
        .parse(&t)
        .ok()
}

/// Checks what gitleaks refuses outright in an allowlist (the whole file is invalid).
fn validate_allowlist(a: &RawAllowlist) -> Result<(), String> {
    match a.condition.trim().to_ascii_uppercase().as_str() {
        "" | "OR" | "||" | "AND" | "&&" => {}
        other => return Err(format!("unknown allowlist condition `{other}`")),
    }
    match a.regex_target.as_str() {
        "" | "secret" | "match" | "line" => {}
        other => return Err(format!("unknown allowlist regexTarget `{other}`")),
    }
    if a.commits.is_empty() && a.paths.is_empty() && a.regexes.is_empty() && a.stopwords.is_empty()
    {
        return Err(
            "allowlist must contain at least one check for: commits, paths, regexes, or stopwords"
                .into(),
        );
    }
    Ok(())
}

/// Compiles a validated allowlist; errors are regexes moat cannot run.
fn compile_allowlist(a: &RawAllowlist) -> Result<Allowlist, String> {
    let condition = match a.condition.trim().to_ascii_uppercase().as_str() {
        "AND" | "&&" => Condition::And,
        _ => Condition::Or,
    };
    let target = match a.regex_target.as_str() {
        "match" => RegexTarget::Match,
        "line" => RegexTarget::Line,
        _ => RegexTarget::Secret,
    };
    let join = |pats: &[String], what: &str| -> Result<Option<Regex>, String> {
        if pats.is_empty() {
            return Ok(None);
        }
        let mut translated = Vec::with_capacity(pats.len());
        for p in pats {
            translated.push(translate_go_regex(p).map_err(|e| format!("{what} `{p}`: {e}"))?);
        }
        // gitleaks joins the patterns' text as `(?:a|b|c)`; flags set inside one
        // pattern carry over to the following alternatives, in Go as in Rust.
        let joined = format!("(?:{})", translated.join("|"));
        compile(&joined)
            .map(Some)
            .map_err(|e| format!("{what}: {e}"))
    };
    let stopwords = if a.stopwords.is_empty() {
        None
    } else {
        let mut words: Vec<String> = a.stopwords.iter().map(|w| w.to_lowercase()).collect();
        words.sort();
        words.dedup();
        Some(AhoCorasick::new(&words).map_err(|e| format!("stopwords: {e}"))?)
    };
    Ok(Allowlist {
        condition,
        target,
        commits: a.commits.iter().map(|c| c.to_lowercase()).collect(),
        paths: join(&a.paths, "paths")?,
        regexes: join(&a.regexes, "regexes")?,
        stopwords,
    })
}

/// Deepest `[extend]` chain gitleaks follows (config.go `maxExtendDepth`): the
/// loaded file may extend a base, and that base one more. gitleaks silently
/// ignores an `[extend]` below that; moat refuses the file instead.
pub const MAX_EXTEND_DEPTH: usize = 2;

/// Origin name of moat's embedded default ruleset in errors.
pub const DEFAULT_RULES_ORIGIN: &str = "<moat default rules>";

/// One file's rules after gitleaks' `Translate` and its `[extend]` merge.
struct Layer {
    /// Rule ids in first-seen order (the extending file's, then new base rules).
    order: Vec<String>,
    /// Rules by id (a later rule with the same id replaces an earlier one).
    rules: HashMap<String, RawRule>,
    /// Global allowlists without `targetRules`.
    global: Vec<RawAllowlist>,
    /// Global allowlists with `targetRules`, as (rule id, allowlist). gitleaks
    /// applies them for the loaded file only: an extended file's are dropped.
    targeted: Vec<(String, RawAllowlist)>,
}

fn invalid_at(origin: &str, message: String) -> RulesError {
    RulesError::Invalid {
        origin: origin.to_string(),
        message,
    }
}

/// gitleaks' `ViperConfig.Translate` for one file at extend depth `depth`,
/// followed by its `extendDefault` / `extendPath`. `dir` resolves a relative
/// `[extend] path`; `chain` holds the files being loaded, to refuse cycles.
fn translate(
    text: &str,
    origin: &str,
    dir: Option<&Path>,
    depth: usize,
    chain: &mut Vec<PathBuf>,
) -> Result<Layer, RulesError> {
    let raw: RawConfig = toml::from_str(text).map_err(|e| RulesError::Toml {
        origin: origin.to_string(),
        message: e.to_string().trim().replace('\n', " "),
    })?;
    let invalid = |m: String| invalid_at(origin, m);
    let mut order: Vec<String> = Vec::new();
    let mut rules: HashMap<String, RawRule> = HashMap::new();
    for mut r in raw.rules {
        if r.id.trim().is_empty() {
            return Err(invalid(format!(
                "rule |id| is missing or empty (description: {})",
                r.description
            )));
        }
        if let Some(a) = r.allowlist.take() {
            if !r.allowlists.is_empty() {
                return Err(invalid(format!(
                    "{}: [rules.allowlist] is deprecated, it cannot be used alongside [[rules.allowlist]]",
                    r.id
                )));
            }
            r.allowlists.push(a);
        }
        for a in &r.allowlists {
            validate_allowlist(a)
                .map_err(|e| invalid(format!("{}: [[rules.allowlists]] {e}", r.id)))?;
        }
        for q in &r.required {
            if q.id.is_empty() {
                return Err(invalid(format!(
                    "{}: [[rules.required]] rule ID is empty",
                    r.id
                )));
            }
        }
        for k in r.keywords.iter_mut() {
            *k = k.to_lowercase();
        }
        if !rules.contains_key(&r.id) {
            order.push(r.id.clone());
        }
        rules.insert(r.id.clone(), r);
    }
    // Checked per file, before any merge: a required rule must be in the same file.
    for id in &order {
        if let Some(r) = rules.get(id) {
            for q in &r.required {
                if !rules.contains_key(&q.id) {
                    return Err(invalid(format!(
                        "{id}: [[rules.required]] rule ID '{}' does not exist",
                        q.id
                    )));
                }
            }
        }
    }
    if raw.allowlist.is_some() && !raw.allowlists.is_empty() {
        return Err(invalid(
            "[allowlist] is deprecated, it cannot be used alongside [[allowlists]]".into(),
        ));
    }
    let mut global_raw: Vec<RawAllowlist> = raw.allowlists;
    if let Some(a) = raw.allowlist {
        global_raw.push(a);
    }
    let mut global = Vec::new();
    let mut targeted = Vec::new();
    for a in global_raw {
        validate_allowlist(&a).map_err(|e| invalid(format!("[[allowlists]] {e}")))?;
        if a.target_rules.is_empty() {
            global.push(a);
        } else {
            for id in &a.target_rules {
                targeted.push((id.clone(), a.clone()));
            }
        }
    }
    let mut layer = Layer {
        order,
        rules,
        global,
        targeted,
    };
    let Some(ext) = raw.extend else {
        return Ok(layer);
    };
    let path = ext.path.as_deref().filter(|p| !p.is_empty());
    if path.is_none() && !ext.use_default {
        return Ok(layer);
    }
    if path.is_some() && ext.use_default {
        return Err(invalid(
            "unable to load config due to extend.path and extend.useDefault being set".into(),
        ));
    }
    if depth >= MAX_EXTEND_DEPTH {
        return Err(invalid(format!(
            "[extend] chain deeper than {MAX_EXTEND_DEPTH} levels (the loaded file, \
             the file it extends, and one more); gitleaks ignores this [extend], moat refuses it"
        )));
    }
    let base = match path {
        None => translate(
            crate::scanner::DEFAULT_RULES,
            DEFAULT_RULES_ORIGIN,
            None,
            depth + 1,
            chain,
        )?,
        Some(p) => {
            let resolved = match dir {
                Some(d) => d.join(p),
                None => PathBuf::from(p),
            };
            let shown = resolved.display().to_string();
            let io = |e: std::io::Error| RulesError::Io {
                origin: shown.clone(),
                message: format!("{e} (extended by {origin})"),
            };
            let canonical = std::fs::canonicalize(&resolved).map_err(io)?;
            if chain.contains(&canonical) {
                return Err(invalid(format!(
                    "[extend] cycle: {shown} is already being loaded ({})",
                    chain
                        .iter()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" -> ")
                )));
            }
            let text = std::fs::read_to_string(&canonical).map_err(io)?;
            chain.push(canonical.clone());
            let base = translate(&text, &shown, canonical.parent(), depth + 1, chain);
            chain.pop();
            base?
        }
    };
    extend(&mut layer, base, &ext.disabled_rules);
    Ok(layer)
}

/// gitleaks' `Config.extend`: rules of `base` not disabled and not in `layer`
/// are added; for a rule in both, the extending file's non-empty description,
/// entropy, secretGroup, regex and path override the base's, and its tags,
/// keywords and allowlists are appended to the base's (every other field, such
/// as `required` and `skipReport`, is the base's). Global allowlists of both
/// apply.
fn extend(layer: &mut Layer, base: Layer, disabled: &[String]) {
    let mut base_rules = base.rules;
    for id in base.order {
        if disabled.contains(&id) {
            continue;
        }
        let Some(mut b) = base_rules.remove(&id) else {
            continue;
        };
        match layer.rules.remove(&id) {
            None => {
                layer.order.push(id.clone());
                layer.rules.insert(id, b);
            }
            Some(cur) => {
                if !cur.description.is_empty() {
                    b.description = cur.description;
                }
                if cur.entropy != 0.0 {
                    b.entropy = cur.entropy;
                }
                if cur.secret_group != 0 {
                    b.secret_group = cur.secret_group;
                }
                if !cur.regex.is_empty() {
                    b.regex = cur.regex;
                }
                if !cur.path.is_empty() {
                    b.path = cur.path;
                }
                b.tags.extend(cur.tags);
                b.keywords.extend(cur.keywords);
                b.allowlists.extend(cur.allowlists);
                layer.rules.insert(id, b);
            }
        }
    }
    layer.global.extend(base.global);
}

impl RuleSet {
    /// Parses and compiles a gitleaks-format TOML ruleset. `origin` names the
    /// source in errors. Rules that cannot run are listed in [`RuleSet::skipped`].
    /// A relative `[extend] path` is resolved from the working directory, as
    /// gitleaks does; [`RuleSet::from_file`] resolves it from the file's directory.
    pub fn from_toml(text: &str, origin: &str) -> Result<RuleSet, RulesError> {
        Self::from_toml_in(text, origin, None)
    }

    /// Reads, parses and compiles a gitleaks-format TOML file; a relative
    /// `[extend] path` is resolved from this file's directory.
    pub fn from_file(path: &Path) -> Result<RuleSet, RulesError> {
        let shown = path.display().to_string();
        let io = |e: std::io::Error| RulesError::Io {
            origin: shown.clone(),
            message: e.to_string(),
        };
        let canonical = std::fs::canonicalize(path).map_err(io)?;
        let text = std::fs::read_to_string(&canonical).map_err(io)?;
        let mut chain = vec![canonical.clone()];
        let layer = translate(&text, &shown, canonical.parent(), 0, &mut chain)?;
        Self::compile_layer(layer, &shown)
    }

    /// [`RuleSet::from_toml`] with the directory a relative `[extend] path` is
    /// resolved from (`None`: the working directory).
    pub fn from_toml_in(
        text: &str,
        origin: &str,
        dir: Option<&Path>,
    ) -> Result<RuleSet, RulesError> {
        let layer = translate(text, origin, dir, 0, &mut Vec::new())?;
        Self::compile_layer(layer, origin)
    }

    /// gitleaks' top-level validation (rules, targeted allowlists) and compilation.
    fn compile_layer(layer: Layer, origin: &str) -> Result<RuleSet, RulesError> {
        let invalid = |m: String| invalid_at(origin, m);
        let Layer {
            order,
            rules: mut by_id,
            global: global_raw,
            targeted: targeted_raw,
        } = layer;
        let mut skipped = Vec::new();
        let mut global = Vec::new();
        for a in &global_raw {
            match compile_allowlist(a) {
                Ok(al) => global.push(al),
                Err(e) => skipped.push(SkippedRule {
                    rule_id: "<global allowlist>".into(),
                    reason: format!("{e}; this allowlist is not applied"),
                }),
            }
        }
        for id in &order {
            if let Some(r) = by_id.get(id) {
                if r.regex.is_empty() && r.path.is_empty() {
                    return Err(invalid(format!(
                        "{id}: both |regex| and |path| are empty, this rule will have no effect"
                    )));
                }
            }
        }
        let mut targeted: HashMap<String, Vec<RawAllowlist>> = HashMap::new();
        for (id, a) in targeted_raw {
            if !by_id.contains_key(&id) {
                return Err(invalid(format!(
                    "[[allowlists]] target rule ID '{id}' does not exist"
                )));
            }
            targeted.entry(id).or_default().push(a);
        }

        let mut compiled: Vec<Option<Rule>> = Vec::with_capacity(order.len());
        let mut required_ids: Vec<Vec<RawRequired>> = Vec::with_capacity(order.len());
        let mut index: HashMap<String, usize> = HashMap::new();
        'rules: for id in order {
            let Some(mut r) = by_id.remove(&id) else {
                continue;
            };
            let slot = compiled.len();
            index.insert(id.clone(), slot);
            compiled.push(None);
            required_ids.push(std::mem::take(&mut r.required));
            let skip = |skipped: &mut Vec<SkippedRule>, reason: String| {
                skipped.push(SkippedRule {
                    rule_id: id.clone(),
                    reason,
                });
            };
            let regex = if r.regex.is_empty() {
                None
            } else {
                match compile_go(&r.regex) {
                    Ok(re) => Some(re),
                    Err(e) => {
                        skip(&mut skipped, format!("regex: {e}"));
                        continue;
                    }
                }
            };
            let groups = regex
                .as_ref()
                .map(|re| re.group_info().group_len(regex_automata::PatternID::ZERO))
                .unwrap_or(1)
                .saturating_sub(1);
            if r.secret_group < 0 || r.secret_group as usize > groups && regex.is_some() {
                return Err(invalid(format!(
                    "{id}: invalid regex secret group {}, max regex secret group {groups}",
                    r.secret_group
                )));
            }
            let path = if r.path.is_empty() {
                None
            } else {
                match compile_go(&r.path) {
                    Ok(re) => Some(re),
                    Err(e) => {
                        skip(&mut skipped, format!("path: {e}"));
                        continue;
                    }
                }
            };
            let mut raw_allow: Vec<RawAllowlist> = r.allowlists.drain(..).collect();
            if let Some(extra) = targeted.remove(&id) {
                raw_allow.extend(extra);
            }
            let mut allowlists = Vec::with_capacity(raw_allow.len());
            for a in &raw_allow {
                match compile_allowlist(a) {
                    Ok(al) => allowlists.push(al),
                    Err(e) => {
                        skip(&mut skipped, format!("allowlist: {e}"));
                        continue 'rules;
                    }
                }
            }
            let keywords: Vec<String> = r.keywords.iter().map(|k| k.to_lowercase()).collect();
            let hir = if regex.is_some() && !keywords.is_empty() {
                parse_hir(&r.regex)
            } else {
                None
            };
            let window = hir.as_ref().and_then(|h| keyword_window(h, &keywords));
            let prefix = match (&hir, window) {
                (Some(h), None) => prefix_filter(h, &keywords),
                _ => None,
            };
            compiled[slot] = Some(Rule {
                generic: id.to_lowercase().contains("generic"),
                id: Arc::from(id.as_str()),
                description: Arc::from(r.description.as_str()),
                regex,
                path,
                secret_group: r.secret_group as usize,
                entropy: r.entropy,
                keywords,
                tags: r.tags,
                allowlists,
                window,
                prefix,
                required: Vec::new(),
                skip_report: r.skip_report,
            });
        }
        // A composite rule whose required rule cannot run cannot run either.
        loop {
            let mut changed = false;
            for slot in 0..compiled.len() {
                if compiled[slot].is_none() {
                    continue;
                }
                let missing = required_ids[slot]
                    .iter()
                    .find(|q| index.get(&q.id).is_none_or(|&i| compiled[i].is_none()));
                if let Some(q) = missing {
                    let reason = format!(
                        "[[rules.required]] rule '{}' cannot run, so this composite rule cannot either",
                        q.id
                    );
                    if let Some(r) = compiled[slot].take() {
                        skipped.push(SkippedRule {
                            rule_id: r.id.to_string(),
                            reason,
                        });
                    }
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
        let mut remap = vec![usize::MAX; compiled.len()];
        let mut n = 0;
        for (slot, r) in compiled.iter().enumerate() {
            if r.is_some() {
                remap[slot] = n;
                n += 1;
            }
        }
        let mut rules = Vec::with_capacity(n);
        for (slot, r) in compiled.into_iter().enumerate() {
            let Some(mut r) = r else {
                continue;
            };
            for q in &required_ids[slot] {
                if let Some(&i) = index.get(&q.id) {
                    r.required.push(Required {
                        rule: remap[i],
                        rule_id: Arc::from(q.id.as_str()),
                        within_lines: q.within_lines,
                        within_columns: q.within_columns,
                    });
                }
            }
            rules.push(r);
        }
        Ok(RuleSet {
            rules,
            global,
            skipped,
        })
    }
}

// ---- keyword coverage analysis --------------------------------------------

const MAX_SET: usize = 128;
const MAX_STR: usize = 64;

/// When every match of `hir` contains one of `keywords` (ASCII case-insensitively)
/// and matches have a bounded length, returns that maximum length.
fn keyword_window(hir: &regex_syntax::hir::Hir, keywords: &[String]) -> Option<usize> {
    let max = hir.properties().maximum_len()?;
    if keywords.iter().any(|k| k.is_empty() || !k.is_ascii()) {
        return None;
    }
    let kws: Vec<&[u8]> = keywords.iter().map(|k| k.as_bytes()).collect();
    if covers(hir, &kws) {
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

/// The bounded leading part of a top-level concatenation (see [`flat_concat`]),
/// when its matches contain one of `keywords`, compiled, with its maximum length.
fn prefix_filter(hir: &regex_syntax::hir::Hir, keywords: &[String]) -> Option<(Regex, usize)> {
    use regex_syntax::hir::Hir;
    let mut children = Vec::new();
    flat_concat(hir, &mut children);
    let n = children
        .iter()
        .take_while(|c| c.properties().maximum_len().is_some())
        .count();
    if n == 0 || n == children.len() {
        return None;
    }
    let prefix = Hir::concat(children[..n].to_vec());
    let max = prefix.properties().maximum_len()?;
    keyword_window(&prefix, keywords)?;
    let re = Regex::builder()
        .configure(
            Regex::config()
                .utf8_empty(false)
                .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
                .hybrid_cache_capacity(DFA_CACHE_LIMIT),
        )
        .build_from_hir(&prefix)
        .ok()?;
    Some((re, max))
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

/// The finite language of `h`, lowercased, when small.
fn exact(h: &regex_syntax::hir::Hir) -> Option<Vec<Vec<u8>>> {
    use regex_syntax::hir::{Class, HirKind};
    match h.kind() {
        HirKind::Empty | HirKind::Look(_) => Some(vec![Vec::new()]),
        HirKind::Literal(l) => Some(vec![l.0.to_ascii_lowercase()]),
        HirKind::Class(Class::Bytes(c)) => {
            let mut set: Vec<Vec<u8>> = Vec::new();
            for r in c.iter() {
                if (r.end() - r.start()) as usize + set.len() >= 8 {
                    return None;
                }
                for b in r.start()..=r.end() {
                    set.push(vec![b.to_ascii_lowercase()]);
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
                    set.push(vec![(b as u8).to_ascii_lowercase()]);
                }
            }
            set.sort();
            set.dedup();
            Some(set)
        }
        HirKind::Capture(c) => exact(&c.sub),
        HirKind::Repetition(r) => {
            let sub = exact(&r.sub)?;
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
                acc = product(&acc, &exact(h)?)?;
            }
            Some(acc)
        }
        HirKind::Alternation(hs) => {
            let mut acc = Vec::new();
            for h in hs {
                acc.extend(exact(h)?);
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
/// match of `h`, lowercased; `[""]` when nothing useful is known.
fn affix(h: &regex_syntax::hir::Hir, prefix: bool) -> Vec<Vec<u8>> {
    use regex_syntax::hir::HirKind;
    if let Some(e) = exact(h) {
        return e;
    }
    let unknown = || vec![Vec::new()];
    match h.kind() {
        HirKind::Capture(c) => affix(&c.sub, prefix),
        HirKind::Repetition(r) if r.min >= 1 => affix(&r.sub, prefix),
        HirKind::Alternation(hs) => {
            let mut acc = Vec::new();
            for h in hs {
                acc.extend(affix(h, prefix));
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
                match exact(h) {
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
                        let a = affix(h, prefix);
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

/// True when every match of `h` contains one of `kws`.
fn covers(h: &regex_syntax::hir::Hir, kws: &[&[u8]]) -> bool {
    use regex_syntax::hir::HirKind;
    if let Some(set) = exact(h) {
        if all_contain(&set, kws) {
            return true;
        }
    }
    match h.kind() {
        HirKind::Capture(c) => covers(&c.sub, kws),
        HirKind::Repetition(r) if r.min >= 1 => covers(&r.sub, kws),
        HirKind::Alternation(hs) => hs.iter().all(|h| covers(h, kws)),
        HirKind::Concat(hs) => {
            if hs.iter().any(|h| covers(h, kws)) {
                return true;
            }
            // `run`: one of these strings ends the text matched so far.
            let mut run: Vec<Vec<u8>> = vec![Vec::new()];
            for h in hs {
                if let Some(c) = product(&run, &affix(h, true)) {
                    if all_contain(&c, kws) {
                        return true;
                    }
                }
                run = match exact(h) {
                    Some(e) => product(&run, &e).unwrap_or_else(|| affix(h, false)),
                    None => affix(h, false),
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
}
