//! `[extend]` layering: one file's rules after gitleaks' `Translate`, with the
//! base ruleset it extends (moat's default or another file) merged in as
//! gitleaks' `Config.extend` does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::rules::format::{validate_allowlist, RawAllowlist, RawConfig, RawRule};
use crate::rules::model::RulesError;
use crate::rules::{DEFAULT_RULES, DEFAULT_RULES_ORIGIN};

/// Deepest `[extend]` chain gitleaks follows (config.go `maxExtendDepth`): the
/// loaded file may extend a base, and that base one more. gitleaks silently
/// ignores an `[extend]` below that; moat refuses the file instead.
pub const MAX_EXTEND_DEPTH: usize = 2;

/// One file's rules after gitleaks' `Translate` and its `[extend]` merge.
pub(super) struct Layer {
    /// Rule ids in first-seen order (the extending file's, then new base rules).
    pub(super) order: Vec<String>,
    /// Rules by id (a later rule with the same id replaces an earlier one).
    pub(super) rules: HashMap<String, RawRule>,
    /// Global allowlists without `targetRules`.
    pub(super) global: Vec<RawAllowlist>,
    /// Global allowlists with `targetRules`, as (rule id, allowlist). gitleaks
    /// applies them for the loaded file only: an extended file's are dropped.
    pub(super) targeted: Vec<(String, RawAllowlist)>,
}

pub(super) fn invalid_at(origin: &str, message: String) -> RulesError {
    RulesError::Invalid {
        origin: origin.to_string(),
        message,
    }
}

/// gitleaks' `ViperConfig.Translate` for one file at extend depth `depth`,
/// followed by its `extendDefault` / `extendPath`. `dir` resolves a relative
/// `[extend] path`; `chain` holds the files being loaded, to refuse cycles.
pub(super) fn translate(
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
        None => translate(DEFAULT_RULES, DEFAULT_RULES_ORIGIN, None, depth + 1, chain)?,
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
