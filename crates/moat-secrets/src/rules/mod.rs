//! The gitleaks rule format: TOML model, Go-regex translation and compilation.
//!
//! The TOML model mirrors gitleaks' `ViperConfig` (config/config.go): `[[rules]]`
//! with `id`, `description`, `regex`, `secretGroup`, `entropy`, `keywords`, `path`,
//! `tags`, `[[rules.allowlists]]` (or the legacy `[rules.allowlist]`), the global
//! `[[allowlists]]` (or legacy `[allowlist]`) with `targetRules`, composite rules
//! (`[[rules.required]]` with `withinLines` / `withinColumns`, `skipReport`) and
//! `[extend]` (`useDefault`, `path`, `disabledRules`) merged as gitleaks'
//! `Config.extend` does.
//!
//! A ruleset goes from text to [`RuleSet`] in this order, one file each:
//!
//! * `format`: the TOML as gitleaks reads it (the `Raw*` types), the checks
//!   gitleaks makes on it and the compilation of an allowlist;
//! * `extend`: one file's rules, validated, with the `[extend]` chain it names
//!   merged in (`Layer`, [`MAX_EXTEND_DEPTH`]);
//! * `load`: [`RuleSet::from_toml`] / [`RuleSet::from_file`], which compile a
//!   merged layer rule by rule;
//! * `go_regex`: Go RE2 patterns translated to the Rust dialect and compiled
//!   ([`translate_go_regex`], [`compile`]);
//! * `prefilter`: which rules may only run around their keyword hits (the
//!   window and prefix of a [`Rule`]);
//! * `model`: the compiled, public types ([`Rule`], [`RuleSet`], [`Allowlist`],
//!   [`RulesError`], ...).
//!
//! The embedded default ruleset, [`DEFAULT_RULES`], lives here too: `[extend]
//! useDefault = true` loads it.

mod extend;
mod format;
mod go_regex;
mod load;
mod model;
mod prefilter;

pub use extend::MAX_EXTEND_DEPTH;
pub use go_regex::{compile, translate_go_regex, DFA_CACHE_LIMIT, REGEX_SIZE_LIMIT};
pub use model::{
    Allowlist, Condition, KeywordCase, RegexTarget, Required, Rule, RuleSet, RulesError,
    SkippedRule,
};

/// The default ruleset shipped with moat (gitleaks format).
pub const DEFAULT_RULES: &str = include_str!("../../rules/default.toml");

/// Origin name of moat's embedded default ruleset in errors.
pub const DEFAULT_RULES_ORIGIN: &str = "<moat default rules>";
