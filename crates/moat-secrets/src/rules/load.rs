//! Loading a ruleset: TOML text or a file, through its `[extend]` chain, to a
//! compiled [`RuleSet`] (gitleaks' top-level validation, then each rule's
//! regexes, allowlists, keyword prefilter and required rules).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use crate::rules::extend::{invalid_at, translate, Layer};
use crate::rules::format::{compile_allowlist, RawAllowlist, RawRequired};
use crate::rules::go_regex::{compile_go, parse_hir};
use crate::rules::model::{Required, Rule, RuleSet, RulesError, SkippedRule};
use crate::rules::prefilter::{
    bounded_prefix, keyword_case, keyword_window, prefix_filter, starts_with_keyword,
};

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
            let lead = match (&hir, window) {
                (Some(h), None) => bounded_prefix(h),
                _ => None,
            };
            let prefix = lead.as_ref().and_then(|p| prefix_filter(p, &keywords));
            // The case is of the part of a match the rule's region holds: the
            // bounded prefix for a prefix-filtered rule, the whole match otherwise.
            let cased = if prefix.is_some() { &lead } else { &hir };
            let keyword_case = cased.as_ref().and_then(|h| keyword_case(h, &keywords));
            let starts_at_keyword = window.is_some()
                && hir
                    .as_ref()
                    .is_some_and(|h| starts_with_keyword(h, &keywords, keyword_case));
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
                keyword_case,
                starts_at_keyword,
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
