//! The `secrets:` section of moat's configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What to do with a body that carries a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SecretsAction {
    /// Refuse it with [`SecretsConfig::status`] and a body listing rule ids and locations.
    #[default]
    Block,
    /// Forward it with each secret replaced by `[REDACTED:rule-id]`.
    Redact,
    /// Forward it unchanged; only raise events.
    Monitor,
}

/// What to do with a body that could not be fully inspected (too large, not
/// decodable, or the scan ran out of time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LimitOutcome {
    /// Forward it uninspected (a `bypass` event is raised).
    #[default]
    Allow,
    /// Refuse it with status 413 (request) or 502 (response).
    Block,
}

/// Per-route overrides; unset fields inherit the top-level values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteSecrets {
    /// Turns scanning on or off for this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// Action for this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<SecretsAction>,
    /// Whether this route's responses are scanned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scan_responses: Option<bool>,
    /// Action on findings in this route's responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_action: Option<SecretsAction>,
    /// Action for generic (low-confidence) rules on this route's requests;
    /// `block` here is how a route opts in to blocking them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generic_action: Option<SecretsAction>,
    /// Whether credentials in their designated places are exempt on this route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<bool>,
}

/// Configuration of inline secret detection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// Scan bodies at all (default false).
    pub enabled: bool,
    /// A gitleaks-format TOML ruleset, relative to the config file's directory;
    /// absent: moat's embedded default ruleset.
    pub rules: Option<PathBuf>,
    /// Action on a finding of a provider-specific rule in a request body
    /// (default `block`).
    pub action: SecretsAction,
    /// Action on a finding in a response body (data-leak prevention). Unset:
    /// `redact`, or `monitor` when `action` is `monitor`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_action: Option<SecretsAction>,
    /// Action on a finding of a generic (low-confidence) rule in a request body
    /// (default `monitor`: generic rules cannot tell a credential used from one
    /// leaked; see docs/secrets.md, "Direction and context").
    pub generic_action: SecretsAction,
    /// Exempt credentials in their designated places on requests (password
    /// fields, OAuth token requests, `Authorization` fields, API keys as the
    /// API's own parameter) and credentials issued by login and token
    /// endpoints on responses (default true).
    pub context: bool,
    /// Raise a `monitor` event (details `decision: exempt` and the reason) for
    /// each exempt finding (default true).
    pub report_exempt: bool,
    /// Rule ids to treat as generic whatever their metadata says.
    pub generic_rules: Vec<String>,
    /// Rule ids to treat as provider-specific whatever their metadata says.
    pub specific_rules: Vec<String>,
    /// HTTP status of the block reply (default 403).
    pub status: u16,
    /// Also scan response bodies, to stop data leaks (default false).
    pub scan_responses: bool,
    /// Per-route overrides, keyed by route name.
    pub routes: BTreeMap<String, RouteSecrets>,
    /// Largest body scanned (default 1 MiB); larger bodies get `on_limit`.
    #[serde(with = "moat_config::byte_size")]
    pub max_body_bytes: u64,
    /// Time budget of one body scan (default 50ms); past it, `on_limit`.
    #[serde(with = "moat_config::duration")]
    pub scan_timeout: Duration,
    /// Outcome for bodies over a limit (default `allow`).
    pub on_limit: LimitOutcome,
    /// Recursive decoding passes (gitleaks' `--max-decode-depth`): base64, hex,
    /// percent and unicode-escaped segments are decoded and scanned again, up
    /// to this many times (default [`DEFAULT_INLINE_DECODE_DEPTH`]; 0 turns it
    /// off; at most [`crate::MAX_DECODE_DEPTH`]).
    pub max_decode_depth: usize,
}

/// Default decode depth of the inline engine and the scan API: gitleaks'
/// default. Decoding costs one extra regex pass over a body in which nothing
/// decodes (measured in docs/perf.md), well inside the latency targets.
pub const DEFAULT_INLINE_DECODE_DEPTH: usize = crate::GITLEAKS_DEFAULT_DECODE_DEPTH;

impl Default for SecretsConfig {
    fn default() -> Self {
        SecretsConfig {
            enabled: false,
            rules: None,
            action: SecretsAction::Block,
            response_action: None,
            generic_action: SecretsAction::Monitor,
            context: true,
            report_exempt: true,
            generic_rules: Vec::new(),
            specific_rules: Vec::new(),
            status: 403,
            scan_responses: false,
            routes: BTreeMap::new(),
            max_body_bytes: 1 << 20,
            scan_timeout: Duration::from_millis(50),
            on_limit: LimitOutcome::Allow,
            max_decode_depth: DEFAULT_INLINE_DECODE_DEPTH,
        }
    }
}

/// The effective secrets policy of one route: the top-level values with the
/// route's overrides applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoutePolicy {
    /// Scanning is on.
    pub enabled: bool,
    /// Action on provider-specific findings in request bodies.
    pub action: SecretsAction,
    /// Action on generic findings in request bodies.
    pub generic_action: SecretsAction,
    /// Response bodies are scanned.
    pub scan_responses: bool,
    /// Action on findings in response bodies.
    pub response_action: SecretsAction,
    /// Designated-place exemptions apply.
    pub context: bool,
}

impl SecretsConfig {
    /// The effective policy of a route.
    pub fn policy(&self, route: &str) -> RoutePolicy {
        let o = self.routes.get(route);
        let action = o.and_then(|o| o.action).unwrap_or(self.action);
        let response_action = o
            .and_then(|o| o.response_action)
            .or(self.response_action)
            .unwrap_or(match action {
                SecretsAction::Monitor => SecretsAction::Monitor,
                SecretsAction::Block | SecretsAction::Redact => SecretsAction::Redact,
            });
        RoutePolicy {
            enabled: o.and_then(|o| o.enabled).unwrap_or(self.enabled),
            action,
            generic_action: o
                .and_then(|o| o.generic_action)
                .unwrap_or(self.generic_action),
            scan_responses: o
                .and_then(|o| o.scan_responses)
                .unwrap_or(self.scan_responses),
            response_action,
            context: o.and_then(|o| o.context).unwrap_or(self.context),
        }
    }

    /// The effective (enabled, action, scan_responses) for a route.
    pub fn for_route(&self, route: &str) -> (bool, SecretsAction, bool) {
        let o = self.routes.get(route);
        (
            o.and_then(|o| o.enabled).unwrap_or(self.enabled),
            o.and_then(|o| o.action).unwrap_or(self.action),
            o.and_then(|o| o.scan_responses)
                .unwrap_or(self.scan_responses),
        )
    }
}
