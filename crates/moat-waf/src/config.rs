//! WAF configuration (the `waf:` section of moat's config).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What the WAF does with a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WafMode {
    /// Answer the request with the block page.
    #[default]
    Block,
    /// Record an event and forward the request.
    Monitor,
}

/// What happens when a request exceeds an inspection limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    /// Refuse the request (a `limit` finding, blocked in block mode).
    #[default]
    Block,
    /// Forward it with the uninspected part skipped, and record a `bypass` event.
    Forward,
}

/// Inspection limits; every one is enforced and tested.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WafLimits {
    /// Largest body inspected (bytes, e.g. `1MiB`); longer bodies hit the limit.
    #[serde(with = "moat_config::byte_size")]
    pub max_body_bytes: u64,
    /// Most parameters (query, form, JSON values, cookies, headers) inspected per request.
    pub max_params: usize,
    /// Deepest JSON / XML nesting inspected.
    pub max_json_depth: usize,
    /// Largest decoded (decompressed) body, bytes.
    #[serde(with = "moat_config::byte_size")]
    pub max_decode_output: u64,
    /// Outcome when a limit is hit.
    pub on_limit: OnLimit,
}

impl Default for WafLimits {
    fn default() -> Self {
        WafLimits {
            max_body_bytes: 1 << 20,
            max_params: 10_000,
            max_json_depth: 64,
            max_decode_output: 8 << 20,
            on_limit: OnLimit::Block,
        }
    }
}

/// Per-route overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WafRoute {
    /// Mode for this route (default: the site mode).
    pub mode: Option<WafMode>,
    /// Set to `false` to skip the WAF on this route.
    pub enabled: Option<bool>,
    /// Block status for this route (default: the site status).
    pub status: Option<u16>,
}

/// An exclusion: findings matching route, location and detector are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WafExclusion {
    /// Route name (`*` or absent: every route).
    pub route: Option<String>,
    /// Location glob, e.g. `query:q`, `json:/comment/*`, `header:*` (`*` matches anything;
    /// absent: every location). A pattern without `*` also matches as a prefix.
    pub location: Option<String>,
    /// Detector name (`sqli`, `xss`, ...; absent: every detector).
    pub detector: Option<String>,
}

/// The `waf:` configuration section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WafConfig {
    /// Master switch.
    pub enabled: bool,
    /// Site-wide mode.
    pub mode: WafMode,
    /// Block status code (default 403).
    pub status: u16,
    /// Minimum confidence (0-100) of a finding that blocks; weaker findings are monitored.
    pub block_confidence: u8,
    /// Per-route overrides keyed by route name.
    pub routes: BTreeMap<String, WafRoute>,
    /// Ignored findings.
    pub exclusions: Vec<WafExclusion>,
    /// Client networks (CIDR or single IPs) that are never inspected.
    pub allowed_ips: Vec<String>,
    /// Inspect every request header (default true). When false only User-Agent,
    /// Referer, X-Forwarded-For and `extra_headers` are inspected.
    pub inspect_all_headers: bool,
    /// More headers to inspect (lowercase names).
    pub extra_headers: Vec<String>,
    /// Inspection limits.
    pub limits: WafLimits,
}

impl Default for WafConfig {
    fn default() -> Self {
        WafConfig {
            enabled: true,
            mode: WafMode::Block,
            status: 403,
            block_confidence: 60,
            routes: BTreeMap::new(),
            exclusions: Vec::new(),
            allowed_ips: Vec::new(),
            inspect_all_headers: true,
            extra_headers: Vec::new(),
            limits: WafLimits::default(),
        }
    }
}
