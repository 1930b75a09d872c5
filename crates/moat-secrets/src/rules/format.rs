//! The gitleaks TOML format as read (gitleaks' `ViperConfig`): the `Raw*`
//! types, the checks gitleaks makes on an allowlist, and its compilation.

use aho_corasick::AhoCorasick;
use regex_automata::meta::Regex;
use serde::Deserialize;

use crate::rules::go_regex::compile_go_alternatives;
use crate::rules::model::{Allowlist, Condition, RegexTarget};

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawConfig {
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) title: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) description: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) min_version: Option<String>,
    #[serde(default)]
    pub(super) extend: Option<RawExtend>,
    #[serde(default)]
    pub(super) rules: Vec<RawRule>,
    #[serde(default)]
    pub(super) allowlist: Option<RawAllowlist>,
    #[serde(default)]
    pub(super) allowlists: Vec<RawAllowlist>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawExtend {
    #[serde(default)]
    pub(super) use_default: bool,
    #[serde(default)]
    pub(super) path: Option<String>,
    #[serde(default)]
    pub(super) disabled_rules: Vec<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawRule {
    #[serde(default)]
    pub(super) id: String,
    #[serde(default)]
    pub(super) description: String,
    #[serde(default)]
    pub(super) regex: String,
    #[serde(default)]
    pub(super) path: String,
    #[serde(default)]
    pub(super) secret_group: i64,
    #[serde(default)]
    pub(super) entropy: f64,
    #[serde(default)]
    pub(super) keywords: Vec<String>,
    #[serde(default)]
    pub(super) tags: Vec<String>,
    #[serde(default)]
    pub(super) allowlist: Option<RawAllowlist>,
    #[serde(default)]
    pub(super) allowlists: Vec<RawAllowlist>,
    #[serde(default)]
    pub(super) required: Vec<RawRequired>,
    #[serde(default)]
    pub(super) skip_report: bool,
}

#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawRequired {
    #[serde(default)]
    pub(super) id: String,
    #[serde(default)]
    pub(super) within_lines: Option<i64>,
    #[serde(default)]
    pub(super) within_columns: Option<i64>,
}

#[derive(Debug, Deserialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawAllowlist {
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) description: String,
    #[serde(default)]
    pub(super) condition: String,
    #[serde(default)]
    pub(super) commits: Vec<String>,
    #[serde(default)]
    pub(super) paths: Vec<String>,
    #[serde(default)]
    pub(super) regex_target: String,
    #[serde(default)]
    pub(super) regexes: Vec<String>,
    #[serde(default)]
    pub(super) stopwords: Vec<String>,
    #[serde(default)]
    pub(super) target_rules: Vec<String>,
}

/// Checks what gitleaks refuses outright in an allowlist (the whole file is invalid).
pub(super) fn validate_allowlist(a: &RawAllowlist) -> Result<(), String> {
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
pub(super) fn compile_allowlist(a: &RawAllowlist) -> Result<Allowlist, String> {
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
        let pats: Vec<&str> = pats.iter().map(String::as_str).collect();
        compile_go_alternatives(what, &pats).map(Some)
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
