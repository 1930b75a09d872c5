//! Secret detection for moat: gitleaks-compatible rules, run inline on request
//! and response bodies, through a scan API and by `moat scan`.
//!
//! * [`Scanner`] compiles a gitleaks-format TOML ruleset ([`DEFAULT_RULES`] is
//!   moat's own, embedded) and scans bytes: one pass of a rare-pair keyword
//!   finder over every rule's keywords decides which rules run; a rule whose
//!   matches always contain one of its keywords and have a bounded length only
//!   runs in windows around the keyword hits, with the same results as a
//!   whole-payload search; then gitleaks' post-processing (secret group,
//!   entropy, allowlists, generic filter), composite rules (`[[rules.required]]`)
//!   and, when asked ([`Scanner::set_max_decode_depth`]), gitleaks' recursive
//!   decoding of base64, hex, percent and unicode-escaped segments ([`decode`]).
//!   `[extend]` files are merged at load ([`RuleSet::from_file`]).
//! * [`SecretsEngine`] is the gateway phase (request and response bodies):
//!   block, redact or monitor, with size and time limits, knowing direction
//!   and context ([`context`]): a provider-specific secret pasted into a
//!   request counts, a credential in its designated place (a login form's
//!   password field, an OAuth token request, an API's own key parameter) does
//!   not, generic rules only monitor requests unless a route opts in, and
//!   responses are scanned for leaks and redacted.
//! * [`scan_api`] serves `POST /v1/scan`.
//! * [`report`] writes gitleaks' report formats (JSON, CSV, JUnit, SARIF) and
//!   reads its baselines and `.gitleaksignore`; [`gitlog`] parses `git log -p`
//!   into the hunks `moat scan git` scans.

#![warn(missing_docs)]

pub mod api;
pub mod config;
pub mod context;
pub mod decode;
pub mod engine;
pub mod gitlog;
mod keywords;
pub mod report;
pub mod rules;
pub mod scanner;

pub use api::{scan_api, ApiLimits};
pub use config::{LimitOutcome, RoutePolicy, RouteSecrets, SecretsAction, SecretsConfig};
pub use context::{classify, BodyKind, Classification, Confidence, Direction};
pub use decode::{DecodeLimits, GITLEAKS_DEFAULT_DECODE_DEPTH, MAX_DECODE_DEPTH};
pub use engine::{EngineError, SecretsEngine};
pub use rules::{RuleSet, RulesError, SkippedRule};
pub use scanner::{
    redact, redact_with, shannon_entropy, Decoded, Finding, RequiredFinding, ScanOutcome, Scanner,
    DEFAULT_RULES,
};
