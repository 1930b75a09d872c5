//! Scenario files: one YAML file per experiment (`bench/scenarios/*.yaml`),
//! loaded through moat-config so every mistake is reported as
//! `file:line:column: field `x.y`: message`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_config::ConfigError;
use serde::{Deserialize, Deserializer, Serialize};

use crate::loadgen::Protocol;

/// Most loads, variants or requests a scenario may list.
pub const MAX_ITEMS: usize = 256;
/// Most repetitions.
pub const MAX_REPETITIONS: u32 = 100;
/// Most connections of one load.
pub const MAX_CONNECTIONS: usize = 10_000;
/// Most generated authorization rules per variant.
pub const MAX_RULES: u32 = 100_000;
/// Largest body file.
pub const MAX_BODY_FILE: u64 = 64 * 1024 * 1024;

/// One experiment.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name (used for output file names).
    pub name: String,
    /// What the experiment reproduces and why.
    #[serde(default)]
    pub description: String,
    /// Repetitions of every (variant, load) cell; confidence intervals need at least 2.
    #[serde(default = "default_reps", deserialize_with = "repetitions")]
    pub repetitions: u32,
    /// Confidence level of the intervals, e.g. 0.99.
    #[serde(default = "default_confidence", deserialize_with = "confidence")]
    pub confidence: f64,
    /// CPUs to pin each process to.
    #[serde(default)]
    pub cpus: Cpus,
    /// The built-in upstream's response.
    #[serde(default)]
    pub upstream: UpstreamDef,
    /// How moat is run.
    #[serde(default)]
    pub moat: MoatDef,
    /// Default requests of loads that list none.
    #[serde(default, deserialize_with = "bounded_vec")]
    pub requests: Vec<RequestDef>,
    /// Loads (each is run against every variant).
    #[serde(deserialize_with = "nonempty_vec")]
    pub loads: Vec<LoadDef>,
    /// Variants (what receives the load).
    #[serde(deserialize_with = "nonempty_vec")]
    pub variants: Vec<VariantDef>,
}

fn default_reps() -> u32 {
    3
}
fn default_confidence() -> f64 {
    0.99
}

fn repetitions<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if v == 0 || v > MAX_REPETITIONS {
        return Err(serde::de::Error::custom(format!(
            "must be within 1..={MAX_REPETITIONS}, got {v}"
        )));
    }
    Ok(v)
}

fn confidence<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let v = f64::deserialize(d)?;
    if !(v > 0.5 && v < 1.0) {
        return Err(serde::de::Error::custom(format!(
            "must be within (0.5, 1), e.g. 0.99, got {v}"
        )));
    }
    Ok(v)
}

fn bounded_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    let v = Vec::<T>::deserialize(d)?;
    if v.len() > MAX_ITEMS {
        return Err(serde::de::Error::custom(format!(
            "at most {MAX_ITEMS} entries, got {}",
            v.len()
        )));
    }
    Ok(v)
}

fn nonempty_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    let v = bounded_vec::<D, T>(d)?;
    if v.is_empty() {
        return Err(serde::de::Error::custom("must list at least one entry"));
    }
    Ok(v)
}

fn connections<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let v = usize::deserialize(d)?;
    if v == 0 || v > MAX_CONNECTIONS {
        return Err(serde::de::Error::custom(format!(
            "must be within 1..={MAX_CONNECTIONS}, got {v}"
        )));
    }
    Ok(v)
}

fn rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = f64::deserialize(d)?;
    if !(v > 0.0 && v <= 10_000_000.0) {
        return Err(serde::de::Error::custom(format!(
            "must be within (0, 10000000] requests/s, got {v}"
        )));
    }
    Ok(Some(v))
}

fn positive_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v = moat_config::duration::deserialize(d)?;
    if v.is_zero() || v > Duration::from_secs(24 * 3600) {
        return Err(serde::de::Error::custom("must be within (0s, 24h]"));
    }
    Ok(v)
}

fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v = moat_config::duration::deserialize(d)?;
    if v > Duration::from_secs(3600) {
        return Err(serde::de::Error::custom("must be at most 1h"));
    }
    Ok(v)
}

fn rules<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if v > MAX_RULES {
        return Err(serde::de::Error::custom(format!(
            "at most {MAX_RULES} rules, got {v}"
        )));
    }
    Ok(v)
}

fn name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = String::deserialize(d)?;
    let ok = !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !ok {
        return Err(serde::de::Error::custom(format!(
            "`{v}`: use 1 to 64 characters among letters, digits, `-`, `_`, `.`"
        )));
    }
    Ok(v)
}

/// CPU pinning.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Cpus {
    /// CPU of the load generator thread.
    #[serde(default)]
    pub load: usize,
    /// CPU of the built-in upstream thread.
    #[serde(default)]
    pub upstream: usize,
    /// CPU of the moat process.
    #[serde(default = "one")]
    pub moat: usize,
}

fn one() -> usize {
    1
}

impl Default for Cpus {
    fn default() -> Self {
        Cpus {
            load: 0,
            upstream: 0,
            moat: 1,
        }
    }
}

/// The built-in upstream's response.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields)]
pub struct UpstreamDef {
    /// Status code (default 200).
    #[serde(default)]
    pub status: Option<u16>,
    /// Content-Type (default `text/plain`, or `application/json` for `.json` body files).
    #[serde(default)]
    pub content_type: Option<String>,
    /// Inline body.
    #[serde(default)]
    pub body: Option<String>,
    /// Body read from a file (relative to the scenario file).
    #[serde(default)]
    pub body_file: Option<PathBuf>,
    /// Gzip the response body.
    #[serde(default)]
    pub gzip: bool,
}

/// How moat is run for each variant.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MoatDef {
    /// `--threads` passed to `moat serve`.
    #[serde(default = "one")]
    pub threads: usize,
    /// Listen with TLS (a generated self-signed certificate).
    #[serde(default)]
    pub tls: bool,
    /// Extra config merged (deep) into every generated moat config.
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    /// How long to wait for `moat serve` to accept connections.
    #[serde(default = "default_startup", deserialize_with = "positive_duration")]
    pub startup_timeout: Duration,
}

fn default_startup() -> Duration {
    Duration::from_secs(20)
}

impl Default for MoatDef {
    fn default() -> Self {
        MoatDef {
            threads: 1,
            tls: false,
            config: None,
            startup_timeout: default_startup(),
        }
    }
}

/// One request template.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RequestDef {
    /// Method (default GET).
    #[serde(default = "get")]
    pub method: String,
    /// Path and query.
    #[serde(default = "slash")]
    pub path: String,
    /// Headers.
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// Inline body.
    #[serde(default)]
    pub body: Option<String>,
    /// Body from a file (relative to the scenario file).
    #[serde(default)]
    pub body_file: Option<PathBuf>,
    /// Gzip the body and send `Content-Encoding: gzip`.
    #[serde(default)]
    pub gzip: bool,
    /// Add `Authorization: Bearer <generated JWT>` (the token the authz generator signs).
    #[serde(default)]
    pub jwt: bool,
}

fn get() -> String {
    "GET".into()
}
fn slash() -> String {
    "/".into()
}

/// One load.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LoadDef {
    /// Name in reports.
    #[serde(deserialize_with = "name")]
    pub name: String,
    /// Requests per second over all connections (open loop). Absent: closed loop.
    #[serde(default, deserialize_with = "rate")]
    pub rate: Option<f64>,
    /// Connections.
    #[serde(deserialize_with = "connections")]
    pub connections: usize,
    /// Concurrent h2 streams per connection.
    #[serde(default = "one", deserialize_with = "connections")]
    pub streams: usize,
    /// `http1` or `h2`.
    #[serde(default)]
    pub protocol: Protocol,
    /// Measured duration.
    #[serde(default = "default_duration", deserialize_with = "positive_duration")]
    pub duration: Duration,
    /// Warm-up before measuring.
    #[serde(default = "default_warmup", deserialize_with = "opt_duration")]
    pub warmup: Duration,
    /// Stop after this many measured requests (duration stays an upper bound).
    #[serde(default)]
    pub requests_limit: Option<u64>,
    /// A new connection (and TLS handshake) per request.
    #[serde(default)]
    pub new_connection_per_request: bool,
    /// Requests (default: the scenario's `requests`).
    #[serde(default, deserialize_with = "bounded_vec")]
    pub requests: Vec<RequestDef>,
}

fn default_duration() -> Duration {
    Duration::from_secs(10)
}
fn default_warmup() -> Duration {
    Duration::from_secs(2)
}

/// Engines a variant turns on.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum Engine {
    /// Access control (Istio policies).
    Authz,
    /// Attack detection.
    Waf,
    /// Secret detection.
    Secrets,
    /// API discovery.
    Discovery,
    /// TLS audit.
    TlsAudit,
}

impl Engine {
    /// Every engine.
    pub const ALL: [Engine; 5] = [
        Engine::Authz,
        Engine::Waf,
        Engine::Secrets,
        Engine::Discovery,
        Engine::TlsAudit,
    ];
    /// Config key.
    pub fn key(self) -> &'static str {
        match self {
            Engine::Authz => "authz",
            Engine::Waf => "waf",
            Engine::Secrets => "secrets",
            Engine::Discovery => "discovery",
            Engine::TlsAudit => "tls_audit",
        }
    }
    /// Engine for a builtin variant name (`authz`, `waf`, ...).
    pub fn from_name(s: &str) -> Option<Engine> {
        Engine::ALL.into_iter().find(|e| e.key() == s)
    }
}

/// Kinds of generated authorization rules.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RuleKind {
    /// `to.operation.paths`.
    Paths,
    /// `from.source.ipBlocks`.
    IpBlocks,
    /// `from.source.principals`.
    Principals,
    /// `from.source.requestPrincipals` (JWT).
    RequestPrincipals,
}

/// Generated Istio policies for a variant.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthzGen {
    /// Rules of each listed kind.
    #[serde(deserialize_with = "rules")]
    pub rules: u32,
    /// Kinds of rules (each gets `rules` rules).
    #[serde(deserialize_with = "nonempty_vec")]
    pub kinds: Vec<RuleKind>,
    /// JWT rules in the RequestAuthentication (the request's token matches the last one).
    #[serde(default, deserialize_with = "rules")]
    pub jwt_rules: u32,
    /// `deny` (default: no rule matches, the request is allowed after evaluating all)
    /// or `allow_last` (only the last rule matches).
    #[serde(default)]
    pub layout: RuleLayout,
}

/// Where the matching rule is.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum RuleLayout {
    /// DENY policies none of which matches.
    #[default]
    Deny,
    /// ALLOW policies where only the last rule matches.
    AllowLast,
}

/// What receives the load.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VariantDef {
    /// Name. `direct`, `proxy`, `all` and engine names (`authz`, `waf`, `secrets`,
    /// `discovery`, `tls_audit`) have built-in meanings when `engines` is absent.
    #[serde(deserialize_with = "name")]
    pub name: String,
    /// Engines to turn on (default from the name).
    #[serde(default)]
    pub engines: Option<Vec<Engine>>,
    /// Send load to this URL instead (another gateway); nothing is spawned.
    #[serde(default)]
    pub url: Option<String>,
    /// Generated policies.
    #[serde(default)]
    pub authz: Option<AuthzGen>,
    /// Extra config merged into this variant's moat config.
    #[serde(default)]
    pub config: Option<serde_json::Value>,
    /// Mutual TLS: moat's listener requires a client certificate (Istio
    /// `PeerAuthentication` STRICT) from a generated CA, and the load generator
    /// presents one with a SPIFFE identity. Needs `moat.tls`.
    #[serde(default)]
    pub mtls: bool,
}

/// How a variant is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VariantKind {
    /// Straight to the built-in upstream.
    Direct,
    /// A spawned `moat serve` with these engines.
    Moat(Vec<Engine>),
    /// An external URL.
    External(String),
}

impl VariantDef {
    /// How this variant is reached.
    pub fn kind(&self) -> VariantKind {
        if let Some(u) = &self.url {
            return VariantKind::External(u.clone());
        }
        if let Some(e) = &self.engines {
            let mut e = e.clone();
            e.sort();
            e.dedup();
            return VariantKind::Moat(e);
        }
        match self.name.as_str() {
            "direct" => VariantKind::Direct,
            "all" => VariantKind::Moat(Engine::ALL.to_vec()),
            n => VariantKind::Moat(Engine::from_name(n).into_iter().collect()),
        }
    }
}

impl Scenario {
    /// Loads and checks a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::semantic(path, 0, 0, "", format!("cannot read: {e}")))?;
        Scenario::parse(path, &text)
    }

    /// Parses and checks scenario text read from `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Scenario, ConfigError> {
        let s: Scenario = moat_config::from_str(path, text)?;
        s.check(path, text)?;
        Ok(s)
    }

    fn check(&self, path: &Path, text: &str) -> Result<(), ConfigError> {
        let locate = |needle: &str| -> (u32, u32) {
            text.lines()
                .enumerate()
                .find_map(|(i, l)| l.find(needle).map(|c| (i as u32 + 1, c as u32 + 1)))
                .unwrap_or((0, 0))
        };
        let err = |field: String, needle: &str, msg: String| {
            let (l, c) = locate(needle);
            ConfigError::semantic(path, l, c, field, msg)
        };
        let mut seen = std::collections::HashSet::new();
        for (i, v) in self.variants.iter().enumerate() {
            if !seen.insert(v.name.as_str()) {
                return Err(err(
                    format!("variants[{i}].name"),
                    &v.name,
                    format!("duplicate variant `{}`", v.name),
                ));
            }
            if let Some(u) = &v.url {
                crate::loadgen::Target::parse(u)
                    .map_err(|m| err(format!("variants[{i}].url"), u, m))?;
            }
            if v.authz.is_some()
                && !matches!(v.kind(), VariantKind::Moat(ref e) if e.contains(&Engine::Authz))
            {
                return Err(err(
                    format!("variants[{i}].authz"),
                    &v.name,
                    "generated policies need a moat variant with the authz engine".into(),
                ));
            }
            if v.mtls && !(self.moat.tls && matches!(v.kind(), VariantKind::Moat(_))) {
                return Err(err(
                    format!("variants[{i}].mtls"),
                    "mtls:",
                    "mtls needs a moat variant (not `direct` or `url`) and `moat.tls: true`".into(),
                ));
            }
        }
        let mut seen = std::collections::HashSet::new();
        for (i, l) in self.loads.iter().enumerate() {
            if !seen.insert(l.name.as_str()) {
                return Err(err(
                    format!("loads[{i}].name"),
                    &l.name,
                    format!("duplicate load `{}`", l.name),
                ));
            }
            if l.requests.is_empty() && self.requests.is_empty() {
                return Err(err(
                    format!("loads[{i}].requests"),
                    &l.name,
                    "no requests: list them here or at the top level".into(),
                ));
            }
            if l.streams > 1 && l.protocol != Protocol::H2 {
                return Err(err(
                    format!("loads[{i}].streams"),
                    "streams:",
                    "streams > 1 needs `protocol: h2`".into(),
                ));
            }
        }
        for c in [self.cpus.load, self.cpus.upstream, self.cpus.moat] {
            if c >= libc::CPU_SETSIZE as usize {
                return Err(err("cpus".into(), "cpus:", format!("cpu {c} out of range")));
            }
        }
        Ok(())
    }

    /// Resolves a path written in the scenario file (relative to its directory).
    pub fn resolve(scenario_path: &Path, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            scenario_path
                .parent()
                .unwrap_or_else(|| Path::new("."))
                .join(p)
        }
    }
}

/// Reads a body file with a size limit.
pub fn read_body_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)
        .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))?;
    anyhow::ensure!(
        meta.len() <= MAX_BODY_FILE,
        "{}: larger than {MAX_BODY_FILE} bytes",
        path.display()
    );
    std::fs::read(path).map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const OK: &str = "name: t\nloads:\n  - name: a\n    connections: 2\n    rate: 100\nrequests:\n  - path: /x\nvariants:\n  - name: direct\n  - name: proxy\n  - name: all\n  - name: nginx\n    url: http://127.0.0.1:9\n";

    #[test]
    fn parses_and_derives_kinds() {
        let s = Scenario::parse(Path::new("s.yaml"), OK).unwrap();
        assert_eq!(s.repetitions, 3);
        assert_eq!(s.loads[0].rate, Some(100.0));
        assert_eq!(s.variants[0].kind(), VariantKind::Direct);
        assert_eq!(s.variants[1].kind(), VariantKind::Moat(vec![]));
        assert_eq!(
            s.variants[2].kind(),
            VariantKind::Moat(Engine::ALL.to_vec())
        );
        assert!(matches!(s.variants[3].kind(), VariantKind::External(_)));
    }

    #[test]
    fn errors_are_located() {
        let bad = OK.replace("connections: 2", "connections: 0");
        let e = Scenario::parse(Path::new("s.yaml"), &bad).unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        assert_eq!(e.field, "loads[0].connections", "{e}");
        let bad = OK.replace("rate: 100", "rte: 100");
        let e = Scenario::parse(Path::new("s.yaml"), &bad).unwrap_err();
        assert_eq!(e.line, 5, "{e}");
        assert!(e.to_string().starts_with("s.yaml:5:"), "{e}");
        let bad = OK.replace("name: proxy", "name: direct");
        let e = Scenario::parse(Path::new("s.yaml"), &bad).unwrap_err();
        assert_eq!(e.field, "variants[1].name", "{e}");
        assert!(e.line >= 9, "{e}");
    }

    #[test]
    fn mtls_needs_a_tls_listener_and_a_moat_variant() {
        let mtls = OK.replace("  - name: proxy\n", "  - name: proxy\n    mtls: true\n");
        let e = Scenario::parse(Path::new("s.yaml"), &mtls).unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (11, "variants[1].mtls"), "{e}");
        let with_tls = format!("moat: {{tls: true}}\n{mtls}");
        let s = Scenario::parse(Path::new("s.yaml"), &with_tls).unwrap();
        assert!(s.variants[1].mtls && !s.variants[0].mtls);
        let direct = with_tls.replace("name: direct\n", "name: direct\n    mtls: true\n");
        let e = Scenario::parse(Path::new("s.yaml"), &direct).unwrap_err();
        assert_eq!(e.field, "variants[0].mtls", "{e}");
    }
}
