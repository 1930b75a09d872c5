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

/// How readily the WAF blocks (like CRS paranoia levels or SafeLine's modes).
///
/// Each level sets the confidence a finding needs to block and how much the
/// request context (code-submission fields, large JSON beacons) lowers the
/// confidence of detectors whose evidence is a syntax shape. Measured
/// detection and false-positive rates per level are in docs/waf.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sensitivity {
    /// Fewest false positives: blocks at confidence >= 75, context lowers shape
    /// findings by 50 in code fields and 25 in beacons.
    Low,
    /// The default: blocks at >= 60, context lowers by 35 (code) and 15 (beacons).
    #[default]
    Balanced,
    /// Most detection: blocks at >= 50, context lowers by 15 (code), 0 (beacons).
    Strict,
}

impl Sensitivity {
    /// Confidence a finding needs to block at this level.
    pub fn block_confidence(self) -> u8 {
        match self {
            Sensitivity::Low => 75,
            Sensitivity::Balanced => 60,
            Sensitivity::Strict => 50,
        }
    }

    /// Confidence subtracted from shape findings in a code-submission field.
    pub fn code_penalty(self) -> u8 {
        match self {
            Sensitivity::Low => 50,
            Sensitivity::Balanced => 35,
            Sensitivity::Strict => 15,
        }
    }

    /// Confidence subtracted from shape findings inside a large JSON beacon.
    pub fn beacon_penalty(self) -> u8 {
        match self {
            Sensitivity::Low => 25,
            Sensitivity::Balanced => 15,
            Sensitivity::Strict => 0,
        }
    }

    /// Name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Sensitivity::Low => "low",
            Sensitivity::Balanced => "balanced",
            Sensitivity::Strict => "strict",
        }
    }
}

/// Virtual patches: rules for known exploit endpoints and parameters
/// (see [`crate::vpatch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VirtualPatches {
    /// Load the starter pack shipped with moat (`crates/moat-waf/rules/virtual-patches.yaml`).
    pub builtin: bool,
    /// More rule files (YAML, same format); relative paths resolve against the
    /// directory given to [`crate::WafEngine::build_with_base`] (the current directory
    /// for [`crate::WafEngine::build`]).
    pub files: Vec<String>,
    /// Rule ids to switch off (built-in or from files).
    pub disabled: Vec<String>,
}

impl Default for VirtualPatches {
    fn default() -> Self {
        VirtualPatches {
            builtin: true,
            files: Vec::new(),
            disabled: Vec::new(),
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

/// An exclusion: findings matching every given key are ignored (an absent key
/// matches anything). `moat waf exclude` renders one from a block event.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WafExclusion {
    /// Route name (`*` or absent: every route).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// Request path prefix (the path as received, before `?`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// Location glob, e.g. `query:q`, `json:/comment/*`, `header:*` (`*` matches anything;
    /// absent: every location). A pattern without `*` also matches as a prefix.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Field name: the name part of the location (`comment` for `form:comment`,
    /// `/a/b` for `json:/a/b`), matched exactly.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Detector name (`sqli`, `xss`, `virtual-patch`, ...; absent: every detector).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detector: Option<String>,
    /// Virtual-patch rule id (e.g. `CVE-2022-22965`); only virtual-patch findings match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
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
    /// How readily findings block (`low`, `balanced`, `strict`).
    pub sensitivity: Sensitivity,
    /// Minimum confidence (0-100) of a finding that blocks; weaker findings are
    /// monitored. Absent: the sensitivity's threshold (75 / 60 / 50).
    pub block_confidence: Option<u8>,
    /// Virtual patches for known exploit endpoints.
    pub virtual_patches: VirtualPatches,
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
            sensitivity: Sensitivity::Balanced,
            block_confidence: None,
            virtual_patches: VirtualPatches::default(),
            routes: BTreeMap::new(),
            exclusions: Vec::new(),
            allowed_ips: Vec::new(),
            inspect_all_headers: true,
            extra_headers: Vec::new(),
            limits: WafLimits::default(),
        }
    }
}
