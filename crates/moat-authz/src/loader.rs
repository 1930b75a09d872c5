//! Loading Istio security policies from YAML (multi-document files or directories).
//!
//! Every field Istio defines for `security.istio.io/v1` and `v1beta1` AuthorizationPolicy,
//! RequestAuthentication and PeerAuthentication is either implemented or refused with
//! `file:line:column: field `...`: reason`; unknown fields are errors.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use moat_config::ConfigError;
use serde::de::{Error as _, IgnoredAny};
use serde::{Deserialize, Deserializer};

use crate::ir::{Clause, NsPat, PathPat, Pred, ReqPrinPat, Rule, SaPat, StrPat};
use crate::jwt::{JwksOrigin, Location};

/// Maximum rules per AuthorizationPolicy (Istio CRD limit).
pub const MAX_RULES: usize = 512;
/// Maximum `from` / `to` / `when` entries per rule (Istio CRD limit for `from`).
pub const MAX_ENTRIES: usize = 512;
/// Maximum values in one field.
pub const MAX_VALUES: usize = 65_536;
/// Maximum JWT rules per RequestAuthentication (Istio CRD limit).
pub const MAX_JWT_RULES: usize = 4096;
/// Maximum size of one policy file.
pub const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// Maximum `jwksUri` length (Istio limit).
pub const MAX_JWKS_URI: usize = 2048;

/// AuthorizationPolicy action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Action {
    /// Allow matching requests.
    Allow,
    /// Deny matching requests.
    Deny,
    /// Log matching requests (never changes the decision).
    Audit,
    /// Ask the external authorizer named by the policy's `provider.name`.
    Custom,
}

/// PeerAuthentication mTLS mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum MtlsMode {
    /// Inherit from the parent level.
    #[default]
    Unset,
    /// Plaintext only: client certificates are not used.
    Disable,
    /// mTLS or plaintext.
    Permissive,
    /// mTLS with a verified client certificate required.
    Strict,
}

/// Where and how a policy applies.
#[derive(Debug, Clone)]
pub struct Meta {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.namespace` (`default` when absent, as `kubectl apply` would do).
    pub namespace: String,
    /// `selector.matchLabels` (`None` = no selector).
    pub selector: Option<BTreeMap<String, String>>,
    /// `istio.io/dry-run: "true"` annotation.
    pub dry_run: bool,
    /// `metadata.creationTimestamp` as written (PeerAuthentication precedence).
    pub created: Option<String>,
    /// Source file and line of the document.
    pub file: PathBuf,
    /// Line of the document's `kind:`.
    pub line: u32,
}

impl Meta {
    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// Whether the selector (if any) matches the workload labels.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        match &self.selector {
            None => true,
            Some(sel) => sel.iter().all(|(k, v)| labels.get(k) == Some(v)),
        }
    }

    /// Istio scoping: policies of the root namespace apply everywhere, others only in
    /// their namespace; a selector narrows to matching workloads.
    pub fn applies(&self, root_ns: &str, ns: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.namespace == root_ns || self.namespace == ns) && self.selects(labels)
    }
}

/// A loaded AuthorizationPolicy.
#[derive(Debug, Clone)]
pub struct AuthzPolicy {
    /// Metadata.
    pub meta: Meta,
    /// Action.
    pub action: Action,
    /// `provider.name` of a CUSTOM policy (an `extension_providers` entry).
    pub provider: Option<String>,
    /// Rules (empty = matches nothing).
    pub rules: Vec<Rule>,
}

/// A loaded JWT rule.
#[derive(Debug, Clone)]
pub struct JwtRuleSpec {
    /// `issuer`.
    pub issuer: String,
    /// `audiences`.
    pub audiences: Vec<String>,
    /// Where the JWKS comes from.
    pub origin: JwksOrigin,
    /// Inline JWKS text.
    pub inline: Option<String>,
    /// Token locations (defaults applied).
    pub locations: Vec<Location>,
    /// `outputPayloadToHeader`.
    pub output_payload_to_header: Option<http::HeaderName>,
    /// `outputClaimToHeaders`.
    pub output_claims: Vec<(http::HeaderName, Vec<String>)>,
    /// `forwardOriginalToken`.
    pub forward: bool,
    /// `timeout` (default 5s).
    pub timeout: Duration,
    /// Space-delimited claims (`scope`, `permission` + `spaceDelimitedClaims`).
    pub space_delimited: Vec<String>,
}

/// A loaded RequestAuthentication.
#[derive(Debug, Clone)]
pub struct RequestAuthn {
    /// Metadata.
    pub meta: Meta,
    /// JWT rules.
    pub rules: Vec<JwtRuleSpec>,
}

/// A loaded PeerAuthentication.
#[derive(Debug, Clone)]
pub struct PeerAuthn {
    /// Metadata.
    pub meta: Meta,
    /// `mtls.mode`.
    pub mode: MtlsMode,
    /// `portLevelMtls`.
    pub ports: BTreeMap<u16, MtlsMode>,
}

/// Everything loaded from the policy paths.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    /// AuthorizationPolicies.
    pub authz: Vec<AuthzPolicy>,
    /// RequestAuthentications.
    pub request_authn: Vec<RequestAuthn>,
    /// PeerAuthentications.
    pub peer_authn: Vec<PeerAuthn>,
}

// ---------------------------------------------------------------------------------------
// YAML shapes

fn refuse<'de, D: Deserializer<'de>, T>(d: D, msg: &str) -> Result<T, D::Error> {
    let _ = IgnoredAny::deserialize(d)?;
    Err(D::Error::custom(msg))
}

fn refuse_target_ref<'de, D: Deserializer<'de>>(d: D) -> Result<Option<()>, D::Error> {
    refuse(
        d,
        "targetRef/targetRefs (waypoint and gateway attachment) is not supported by moat: \
         use `selector` with the labels of the moat route or cluster",
    )
}

/// `spec.provider` of a CUSTOM policy.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProviderY {
    name: NonEmpty,
}

/// A non-empty string.
#[derive(Debug, Clone)]
struct NonEmpty(String);

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() {
            return Err(D::Error::custom("empty value is not allowed"));
        }
        Ok(NonEmpty(s))
    }
}

fn parse_ip_block(s: &str) -> Result<IpNet, String> {
    if s.contains('/') {
        s.parse::<IpNet>()
            .map_err(|_| format!("invalid CIDR `{s}`"))
    } else {
        s.parse::<IpAddr>()
            .map(IpNet::from)
            .map_err(|_| format!("invalid IP address `{s}`"))
    }
}

#[derive(Debug, Clone)]
struct IpBlock(IpNet);

impl<'de> Deserialize<'de> for IpBlock {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_ip_block(&s).map(IpBlock).map_err(D::Error::custom)
    }
}

fn parse_port(s: &str) -> Result<u16, String> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid port `{s}`: expected a number 0-65535"));
    }
    s.parse::<u16>()
        .map_err(|_| format!("invalid port `{s}`: expected a number 0-65535"))
}

#[derive(Debug, Clone)]
struct PortStr(u16);

impl<'de> Deserialize<'de> for PortStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_port(&s).map(PortStr).map_err(D::Error::custom)
    }
}

/// A `paths` (`NOT = false`) or `notPaths` (`NOT = true`) value; the field name is part
/// of Istio's template errors (`found in Paths` / `found in NotPaths`).
#[derive(Debug, Clone)]
struct PathY<const NOT: bool>(PathPat);

impl<'de, const NOT: bool> Deserialize<'de> for PathY<NOT> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        if s.is_empty() {
            return Err(D::Error::custom("empty value is not allowed"));
        }
        let key = if NOT { "NotPaths" } else { "Paths" };
        PathPat::parse_for(&s, key)
            .map(PathY)
            .map_err(D::Error::custom)
    }
}

#[derive(Debug, Clone)]
struct HeaderNameY(http::HeaderName);

impl<'de> Deserialize<'de> for HeaderNameY {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderName::from_bytes(s.as_bytes())
            .map(HeaderNameY)
            .map_err(|_| D::Error::custom(format!("invalid header name `{s}`")))
    }
}

#[derive(Debug, Clone, Copy)]
struct ActionY(Action);

impl<'de> Deserialize<'de> for ActionY {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "ALLOW" => Ok(ActionY(Action::Allow)),
            "DENY" => Ok(ActionY(Action::Deny)),
            "AUDIT" => Ok(ActionY(Action::Audit)),
            "CUSTOM" => Ok(ActionY(Action::Custom)),
            other => Err(D::Error::custom(format!(
                "unknown action `{other}`, expected ALLOW, DENY, AUDIT or CUSTOM"
            ))),
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct ModeY(MtlsMode);

impl<'de> Deserialize<'de> for ModeY {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(ModeY(match s.as_str() {
            "UNSET" => MtlsMode::Unset,
            "DISABLE" => MtlsMode::Disable,
            "PERMISSIVE" => MtlsMode::Permissive,
            "STRICT" => MtlsMode::Strict,
            other => {
                return Err(D::Error::custom(format!(
                    "unknown mode `{other}`, expected UNSET, DISABLE, PERMISSIVE or STRICT"
                )))
            }
        }))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct PortKey(u16);

impl<'de> Deserialize<'de> for PortKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        let n: u64 = match Raw::deserialize(d)? {
            Raw::N(n) => n,
            Raw::S(s) => s
                .parse()
                .map_err(|_| D::Error::custom(format!("invalid port `{s}`")))?,
        };
        if n == 0 || n > 65535 {
            return Err(D::Error::custom(format!("port {n} out of range 1-65535")));
        }
        Ok(PortKey(n as u16))
    }
}

#[derive(Deserialize)]
struct Probe {
    #[serde(rename = "apiVersion")]
    api_version: Option<String>,
    kind: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // accepted Kubernetes metadata that does not affect enforcement
struct MetaY {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    creation_timestamp: Option<String>,
    #[serde(default)]
    uid: Option<IgnoredAny>,
    #[serde(default)]
    resource_version: Option<IgnoredAny>,
    #[serde(default)]
    generation: Option<IgnoredAny>,
    #[serde(default)]
    managed_fields: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SelectorY {
    #[serde(default)]
    match_labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Doc<S> {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: MetaY,
    #[serde(default = "Option::default")]
    spec: Option<S>,
    #[serde(default)]
    #[allow(dead_code)]
    status: Option<IgnoredAny>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ApSpecY {
    #[serde(default)]
    selector: Option<SelectorY>,
    #[serde(default, deserialize_with = "refuse_target_ref")]
    #[allow(dead_code)]
    target_ref: Option<()>,
    #[serde(default, deserialize_with = "refuse_target_ref")]
    #[allow(dead_code)]
    target_refs: Option<()>,
    #[serde(default)]
    action: Option<ActionY>,
    #[serde(default)]
    provider: Option<ProviderY>,
    #[serde(default)]
    rules: Option<Vec<RuleY>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RuleY {
    #[serde(default)]
    from: Option<Vec<FromY>>,
    #[serde(default)]
    to: Option<Vec<ToY>>,
    #[serde(default)]
    when: Option<Vec<ConditionY>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, try_from = "FromRaw")]
struct FromY {
    source: SourceY,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FromRaw {
    #[serde(default)]
    source: Option<SourceY>,
}

impl TryFrom<FromRaw> for FromY {
    type Error = String;
    fn try_from(r: FromRaw) -> Result<Self, String> {
        match r.source {
            Some(s) if !s.is_empty() => Ok(FromY { source: s }),
            _ => Err("`from.source` must not be empty".into()),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SourceY {
    #[serde(default)]
    principals: Option<Vec<NonEmpty>>,
    #[serde(default)]
    not_principals: Option<Vec<NonEmpty>>,
    #[serde(default)]
    request_principals: Option<Vec<NonEmpty>>,
    #[serde(default)]
    not_request_principals: Option<Vec<NonEmpty>>,
    #[serde(default)]
    namespaces: Option<Vec<NonEmpty>>,
    #[serde(default)]
    not_namespaces: Option<Vec<NonEmpty>>,
    #[serde(default)]
    service_accounts: Option<Vec<NonEmpty>>,
    #[serde(default)]
    not_service_accounts: Option<Vec<NonEmpty>>,
    #[serde(default)]
    ip_blocks: Option<Vec<IpBlock>>,
    #[serde(default)]
    not_ip_blocks: Option<Vec<IpBlock>>,
    #[serde(default)]
    remote_ip_blocks: Option<Vec<IpBlock>>,
    #[serde(default)]
    not_remote_ip_blocks: Option<Vec<IpBlock>>,
}

fn set<T>(v: &Option<Vec<T>>) -> bool {
    v.as_ref().is_some_and(|v| !v.is_empty())
}

impl SourceY {
    fn is_empty(&self) -> bool {
        !(set(&self.principals)
            || set(&self.not_principals)
            || set(&self.request_principals)
            || set(&self.not_request_principals)
            || set(&self.namespaces)
            || set(&self.not_namespaces)
            || set(&self.service_accounts)
            || set(&self.not_service_accounts)
            || set(&self.ip_blocks)
            || set(&self.not_ip_blocks)
            || set(&self.remote_ip_blocks)
            || set(&self.not_remote_ip_blocks))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, try_from = "ToRaw")]
struct ToY {
    operation: OperationY,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToRaw {
    #[serde(default)]
    operation: Option<OperationY>,
}

impl TryFrom<ToRaw> for ToY {
    type Error = String;
    fn try_from(r: ToRaw) -> Result<Self, String> {
        match r.operation {
            Some(o) if !o.is_empty() => Ok(ToY { operation: o }),
            _ => Err("`to.operation` must not be empty".into()),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OperationY {
    #[serde(default)]
    hosts: Option<Vec<NonEmpty>>,
    #[serde(default)]
    not_hosts: Option<Vec<NonEmpty>>,
    #[serde(default)]
    ports: Option<Vec<PortStr>>,
    #[serde(default)]
    not_ports: Option<Vec<PortStr>>,
    #[serde(default)]
    methods: Option<Vec<NonEmpty>>,
    #[serde(default)]
    not_methods: Option<Vec<NonEmpty>>,
    #[serde(default)]
    paths: Option<Vec<PathY<false>>>,
    #[serde(default)]
    not_paths: Option<Vec<PathY<true>>>,
}

impl OperationY {
    fn is_empty(&self) -> bool {
        !(set(&self.hosts)
            || set(&self.not_hosts)
            || set(&self.ports)
            || set(&self.not_ports)
            || set(&self.methods)
            || set(&self.not_methods)
            || set(&self.paths)
            || set(&self.not_paths))
    }
}

/// A parsed `when` key.
#[derive(Debug, Clone, PartialEq)]
enum Key {
    Header(String),
    SourceIp,
    RemoteIp,
    SourceNamespace,
    SourcePrincipal,
    SourceServiceAccount,
    AuthPrincipal,
    AuthAudiences,
    AuthPresenter,
    AuthClaims(Vec<String>),
    DestIp,
    DestPort,
    Sni,
}

/// `[a][b]` -> `["a", "b"]`.
fn bracket_names(s: &str) -> Option<Vec<String>> {
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    let names: Vec<String> = inner.split("][").map(str::to_string).collect();
    if names
        .iter()
        .any(|n| n.is_empty() || n.contains('[') || n.contains(']'))
    {
        return None;
    }
    Some(names)
}

fn parse_key(k: &str) -> Result<Key, String> {
    Ok(match k {
        "source.ip" => Key::SourceIp,
        "remote.ip" => Key::RemoteIp,
        "source.namespace" => Key::SourceNamespace,
        "source.principal" => Key::SourcePrincipal,
        "source.serviceAccount" => Key::SourceServiceAccount,
        "request.auth.principal" => Key::AuthPrincipal,
        "request.auth.audiences" => Key::AuthAudiences,
        "request.auth.presenter" => Key::AuthPresenter,
        "destination.ip" => Key::DestIp,
        "destination.port" => Key::DestPort,
        "connection.sni" => Key::Sni,
        k if k.starts_with("request.headers[") => {
            let names = bracket_names(&k["request.headers".len()..])
                .filter(|n| n.len() == 1)
                .ok_or_else(|| format!("invalid key `{k}`: expected request.headers[<name>]"))?;
            Key::Header(names[0].to_ascii_lowercase())
        }
        k if k.starts_with("request.auth.claims[") => {
            let names = bracket_names(&k["request.auth.claims".len()..]).ok_or_else(|| {
                format!("invalid key `{k}`: expected request.auth.claims[<name>][<nested>]...")
            })?;
            Key::AuthClaims(names)
        }
        "destination.namespace"
        | "destination.labels"
        | "destination.name"
        | "destination.user" => {
            return Err(format!("key `{k}` is not supported by Istio"));
        }
        k if k.starts_with("experimental.") || k.starts_with("request.experimental.") => {
            return Err(format!(
                "experimental key `{k}` is not supported by moat (no compatibility guarantee)"
            ));
        }
        k => return Err(format!("unknown key `{k}`")),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, try_from = "ConditionRaw")]
struct ConditionY {
    key: Key,
    values: Vec<String>,
    not_values: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ConditionRaw {
    key: String,
    #[serde(default)]
    values: Option<Vec<NonEmpty>>,
    #[serde(default)]
    not_values: Option<Vec<NonEmpty>>,
}

impl TryFrom<ConditionRaw> for ConditionY {
    type Error = String;
    fn try_from(r: ConditionRaw) -> Result<Self, String> {
        let key = parse_key(&r.key)?;
        let values: Vec<String> = r
            .values
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.0)
            .collect();
        let not_values: Vec<String> = r
            .not_values
            .unwrap_or_default()
            .into_iter()
            .map(|v| v.0)
            .collect();
        if values.is_empty() && not_values.is_empty() {
            return Err(format!(
                "condition `{}` needs at least one of values or notValues",
                r.key
            ));
        }
        for v in values.iter().chain(&not_values) {
            match key {
                Key::SourceIp | Key::RemoteIp | Key::DestIp => {
                    parse_ip_block(v).map_err(|e| format!("{}: {e}", r.key))?;
                }
                Key::DestPort => {
                    parse_port(v).map_err(|e| format!("{}: {e}", r.key))?;
                }
                Key::SourceServiceAccount => {
                    SaPat::new(v, "ns").map_err(|e| format!("{}: {e}", r.key))?;
                }
                _ => {}
            }
        }
        Ok(ConditionY {
            key,
            values,
            not_values,
        })
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RaSpecY {
    #[serde(default)]
    selector: Option<SelectorY>,
    #[serde(default, deserialize_with = "refuse_target_ref")]
    #[allow(dead_code)]
    target_ref: Option<()>,
    #[serde(default, deserialize_with = "refuse_target_ref")]
    #[allow(dead_code)]
    target_refs: Option<()>,
    #[serde(default)]
    jwt_rules: Vec<JwtRuleY>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct JwtRuleY {
    issuer: NonEmpty,
    #[serde(default)]
    audiences: Vec<NonEmpty>,
    #[serde(default)]
    jwks_uri: Option<NonEmpty>,
    #[serde(default)]
    jwks: Option<NonEmpty>,
    #[serde(default)]
    from_headers: Vec<FromHeaderY>,
    #[serde(default)]
    from_params: Vec<NonEmpty>,
    #[serde(default)]
    from_cookies: Vec<NonEmpty>,
    #[serde(default)]
    output_payload_to_header: Option<HeaderNameY>,
    #[serde(default)]
    forward_original_token: bool,
    #[serde(default)]
    output_claim_to_headers: Vec<ClaimToHeaderY>,
    #[serde(default)]
    timeout: Option<DurationY>,
    #[serde(default)]
    space_delimited_claims: Vec<NonEmpty>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FromHeaderY {
    name: HeaderNameY,
    #[serde(default)]
    prefix: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimToHeaderY {
    header: HeaderNameY,
    claim: NonEmpty,
}

#[derive(Debug, Clone, Copy)]
struct DurationY(Duration);

impl<'de> Deserialize<'de> for DurationY {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        moat_config::parse_duration(&s)
            .map(DurationY)
            .map_err(D::Error::custom)
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PaSpecY {
    #[serde(default)]
    selector: Option<SelectorY>,
    #[serde(default, deserialize_with = "refuse_target_ref")]
    #[allow(dead_code)]
    target_ref: Option<()>,
    #[serde(default, deserialize_with = "refuse_target_ref")]
    #[allow(dead_code)]
    target_refs: Option<()>,
    #[serde(default)]
    mtls: Option<MtlsY>,
    #[serde(default)]
    port_level_mtls: BTreeMap<PortKey, MtlsY>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct MtlsY {
    #[serde(default)]
    mode: ModeY,
}

// ---------------------------------------------------------------------------------------
// Conversion

fn strs(v: &Option<Vec<NonEmpty>>) -> Vec<&str> {
    v.as_ref()
        .map(|v| v.iter().map(|s| s.0.as_str()).collect())
        .unwrap_or_default()
}

fn push(out: &mut Vec<Clause>, pred: Pred, negated: bool, empty: bool) {
    if !empty {
        out.push(Clause { pred, negated });
    }
}

fn too_many(n: usize, what: &str) -> Result<(), String> {
    if n > MAX_VALUES {
        Err(format!("{what}: {n} values, at most {MAX_VALUES} allowed"))
    } else {
        Ok(())
    }
}

fn convert_source(s: &SourceY, ns: &str) -> Result<Vec<Clause>, String> {
    if (set(&s.service_accounts) || set(&s.not_service_accounts))
        && (set(&s.principals)
            || set(&s.not_principals)
            || set(&s.namespaces)
            || set(&s.not_namespaces))
    {
        return Err("serviceAccounts cannot be combined with principals or namespaces".into());
    }
    let mut out = Vec::new();
    let principal = |v: &Option<Vec<NonEmpty>>| {
        Pred::Principal(strs(v).into_iter().map(StrPat::parse).collect())
    };
    push(
        &mut out,
        principal(&s.principals),
        false,
        !set(&s.principals),
    );
    push(
        &mut out,
        principal(&s.not_principals),
        true,
        !set(&s.not_principals),
    );
    let rp = |v: &Option<Vec<NonEmpty>>| {
        Pred::RequestPrincipal(strs(v).into_iter().map(ReqPrinPat::parse).collect())
    };
    push(
        &mut out,
        rp(&s.request_principals),
        false,
        !set(&s.request_principals),
    );
    push(
        &mut out,
        rp(&s.not_request_principals),
        true,
        !set(&s.not_request_principals),
    );
    let nsp = |v: &Option<Vec<NonEmpty>>| -> Result<Pred, String> {
        Ok(Pred::Namespace(
            strs(v)
                .into_iter()
                .map(NsPat::new)
                .collect::<Result<_, _>>()?,
        ))
    };
    push(&mut out, nsp(&s.namespaces)?, false, !set(&s.namespaces));
    push(
        &mut out,
        nsp(&s.not_namespaces)?,
        true,
        !set(&s.not_namespaces),
    );
    let sa = |v: &Option<Vec<NonEmpty>>| -> Result<Pred, String> {
        Ok(Pred::ServiceAccount(
            strs(v)
                .into_iter()
                .map(|x| SaPat::new(x, ns))
                .collect::<Result<_, _>>()?,
        ))
    };
    push(
        &mut out,
        sa(&s.service_accounts)?,
        false,
        !set(&s.service_accounts),
    );
    push(
        &mut out,
        sa(&s.not_service_accounts)?,
        true,
        !set(&s.not_service_accounts),
    );
    let ips = |v: &Option<Vec<IpBlock>>| -> Vec<IpNet> {
        v.as_ref()
            .map(|v| v.iter().map(|b| b.0).collect())
            .unwrap_or_default()
    };
    push(
        &mut out,
        Pred::SourceIp(ips(&s.ip_blocks)),
        false,
        !set(&s.ip_blocks),
    );
    push(
        &mut out,
        Pred::SourceIp(ips(&s.not_ip_blocks)),
        true,
        !set(&s.not_ip_blocks),
    );
    push(
        &mut out,
        Pred::RemoteIp(ips(&s.remote_ip_blocks)),
        false,
        !set(&s.remote_ip_blocks),
    );
    push(
        &mut out,
        Pred::RemoteIp(ips(&s.not_remote_ip_blocks)),
        true,
        !set(&s.not_remote_ip_blocks),
    );
    for c in &out {
        too_many(pred_len(&c.pred), "from.source")?;
    }
    Ok(out)
}

fn pred_len(p: &Pred) -> usize {
    match p {
        Pred::Principal(v)
        | Pred::Host(v)
        | Pred::Method(v)
        | Pred::Audience(v)
        | Pred::Presenter(v)
        | Pred::Sni(v)
        | Pred::Header(_, v)
        | Pred::Claim(_, v) => v.len(),
        Pred::RequestPrincipal(v) => v.len(),
        Pred::Namespace(v) => v.len(),
        Pred::ServiceAccount(v) => v.len(),
        Pred::SourceIp(v) | Pred::RemoteIp(v) | Pred::DestIp(v) => v.len(),
        Pred::Port(v) => v.len(),
        Pred::Path(v) => v.len(),
    }
}

fn convert_operation(o: &OperationY) -> Result<Vec<Clause>, String> {
    let mut out = Vec::new();
    let host = |v: &Option<Vec<NonEmpty>>| {
        Pred::Host(strs(v).into_iter().map(StrPat::parse_lower).collect())
    };
    push(&mut out, host(&o.hosts), false, !set(&o.hosts));
    push(&mut out, host(&o.not_hosts), true, !set(&o.not_hosts));
    let ports = |v: &Option<Vec<PortStr>>| {
        Pred::Port(
            v.as_ref()
                .map(|v| v.iter().map(|p| p.0).collect())
                .unwrap_or_default(),
        )
    };
    push(&mut out, ports(&o.ports), false, !set(&o.ports));
    push(&mut out, ports(&o.not_ports), true, !set(&o.not_ports));
    let methods =
        |v: &Option<Vec<NonEmpty>>| Pred::Method(strs(v).into_iter().map(StrPat::parse).collect());
    push(&mut out, methods(&o.methods), false, !set(&o.methods));
    push(
        &mut out,
        methods(&o.not_methods),
        true,
        !set(&o.not_methods),
    );
    fn paths<const NOT: bool>(v: &Option<Vec<PathY<NOT>>>) -> Pred {
        Pred::Path(
            v.as_ref()
                .map(|v| v.iter().map(|p| p.0.clone()).collect())
                .unwrap_or_default(),
        )
    }
    push(&mut out, paths(&o.paths), false, !set(&o.paths));
    push(&mut out, paths(&o.not_paths), true, !set(&o.not_paths));
    for c in &out {
        too_many(pred_len(&c.pred), "to.operation")?;
    }
    Ok(out)
}

fn condition_pred(key: &Key, values: &[String], ns: &str) -> Result<Pred, String> {
    let sp = || values.iter().map(|v| StrPat::parse(v)).collect::<Vec<_>>();
    let ips = || {
        values
            .iter()
            .map(|v| parse_ip_block(v))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(match key {
        Key::Header(n) => Pred::Header(n.clone(), sp()),
        Key::SourceIp => Pred::SourceIp(ips()?),
        Key::RemoteIp => Pred::RemoteIp(ips()?),
        Key::DestIp => Pred::DestIp(ips()?),
        Key::SourceNamespace => Pred::Namespace(
            values
                .iter()
                .map(|v| NsPat::new(v))
                .collect::<Result<_, _>>()?,
        ),
        Key::SourcePrincipal => Pred::Principal(sp()),
        Key::SourceServiceAccount => Pred::ServiceAccount(
            values
                .iter()
                .map(|v| SaPat::new(v, ns))
                .collect::<Result<_, _>>()?,
        ),
        Key::AuthPrincipal => {
            Pred::RequestPrincipal(values.iter().map(|v| ReqPrinPat::parse(v)).collect())
        }
        Key::AuthAudiences => Pred::Audience(sp()),
        Key::AuthPresenter => Pred::Presenter(sp()),
        Key::AuthClaims(path) => Pred::Claim(path.clone(), sp()),
        Key::DestPort => Pred::Port(
            values
                .iter()
                .map(|v| parse_port(v))
                .collect::<Result<_, _>>()?,
        ),
        Key::Sni => Pred::Sni(sp()),
    })
}

fn convert_rule(r: &RuleY, ns: &str) -> Result<Rule, String> {
    let from = r.from.as_deref().unwrap_or_default();
    let to = r.to.as_deref().unwrap_or_default();
    let when = r.when.as_deref().unwrap_or_default();
    if from.len() > MAX_ENTRIES || to.len() > MAX_ENTRIES || when.len() > MAX_ENTRIES {
        return Err(format!(
            "a rule has more than {MAX_ENTRIES} from/to/when entries"
        ));
    }
    let mut rule = Rule::default();
    for f in from {
        rule.from.push(convert_source(&f.source, ns)?);
    }
    for t in to {
        rule.to.push(convert_operation(&t.operation)?);
    }
    for c in when {
        too_many(c.values.len() + c.not_values.len(), "when")?;
        if !c.values.is_empty() {
            rule.when.push(Clause {
                pred: condition_pred(&c.key, &c.values, ns)?,
                negated: false,
            });
        }
        if !c.not_values.is_empty() {
            rule.when.push(Clause {
                pred: condition_pred(&c.key, &c.not_values, ns)?,
                negated: true,
            });
        }
    }
    Ok(rule)
}

// ---------------------------------------------------------------------------------------
// Loading

/// Splits a YAML stream at `---` / `...` lines: `(lines before the document, text)`.
fn split_documents(text: &str) -> Vec<(u32, &str)> {
    let mut docs = Vec::new();
    let mut start_byte = 0;
    let mut start_line = 0u32;
    // YAML's line breaks (a bare CR too), so that the lines counted here are the
    // ones the parser counts inside each document.
    let mut starts = moat_config::subst::line_starts(text).peekable();
    let mut idx = 0u32;
    while let Some(offset) = starts.next() {
        let end = starts.peek().copied().unwrap_or(text.len());
        let t = text[offset..end].trim_end();
        if t == "---" || t.starts_with("--- ") || t == "..." {
            docs.push((start_line, &text[start_byte..offset]));
            start_byte = end;
            start_line = idx + 1;
        }
        idx += 1;
    }
    docs.push((start_line, &text[start_byte..]));
    docs
}

/// 1-based line (within `doc`) of the first line starting with `key:`, else 1.
fn key_line(doc: &str, key: &str) -> u32 {
    doc.lines()
        .position(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))
        .map(|i| i as u32 + 1)
        .unwrap_or(1)
}

fn shift(mut e: ConfigError, by: u32) -> ConfigError {
    if e.line > 0 {
        e.line += by;
    }
    e
}

fn parse_doc<T: serde::de::DeserializeOwned>(
    file: &Path,
    doc: &str,
    start: u32,
) -> Result<T, ConfigError> {
    moat_config::from_str_verbatim::<T>(file, doc).map_err(|e| shift(e, start))
}

fn meta_of(m: MetaY, selector: Option<SelectorY>, file: &Path, line: u32) -> Meta {
    let dry_run = m
        .annotations
        .get("istio.io/dry-run")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    Meta {
        name: m.name,
        namespace: m.namespace.unwrap_or_else(|| "default".into()),
        selector: selector.map(|s| s.match_labels),
        dry_run,
        created: m.creation_timestamp,
        file: file.to_path_buf(),
        line,
    }
}

/// Parses the policies of one YAML text (`file` names it in errors).
pub fn parse_text(file: &Path, text: &str, set: &mut PolicySet) -> Result<(), ConfigError> {
    for (start, doc) in split_documents(text) {
        if doc.lines().all(|l| {
            let t = l.trim();
            t.is_empty() || t.starts_with('#')
        }) {
            continue;
        }
        let probe: Probe = parse_doc(file, doc, start)?;
        let kind_line = start + key_line(doc, "kind");
        let err =
            |line: u32, field: &str, msg: String| ConfigError::semantic(file, line, 1, field, msg);
        let api = probe.api_version.unwrap_or_default();
        let kind = probe
            .kind
            .ok_or_else(|| err(start + 1, "kind", "document has no `kind`".into()))?;
        let supported = matches!(
            kind.as_str(),
            "AuthorizationPolicy" | "RequestAuthentication" | "PeerAuthentication"
        );
        if !supported {
            return Err(err(
                kind_line,
                "kind",
                format!(
                    "unsupported kind `{kind}`: expected AuthorizationPolicy, \
                     RequestAuthentication or PeerAuthentication"
                ),
            ));
        }
        if api != "security.istio.io/v1" && api != "security.istio.io/v1beta1" {
            return Err(err(
                start + key_line(doc, "apiVersion"),
                "apiVersion",
                format!("unsupported apiVersion `{api}`: expected security.istio.io/v1 or v1beta1"),
            ));
        }
        let spec_line = start + key_line(doc, "spec");
        match kind.as_str() {
            "AuthorizationPolicy" => {
                let d: Doc<ApSpecY> = parse_doc(file, doc, start)?;
                let spec = d.spec.unwrap_or_default();
                let meta = meta_of(d.metadata, spec.selector, file, kind_line);
                let rules_y = spec.rules.unwrap_or_default();
                if rules_y.len() > MAX_RULES {
                    return Err(err(
                        spec_line,
                        "spec.rules",
                        format!("{} rules, at most {MAX_RULES} allowed", rules_y.len()),
                    ));
                }
                let mut rules = Vec::with_capacity(rules_y.len());
                for (i, r) in rules_y.iter().enumerate() {
                    rules.push(
                        convert_rule(r, &meta.namespace)
                            .map_err(|m| err(spec_line, &format!("spec.rules[{i}]"), m))?,
                    );
                }
                let action = spec.action.map(|a| a.0).unwrap_or(Action::Allow);
                let provider = spec.provider.map(|p| p.name.0);
                match (action, &provider) {
                    (Action::Custom, None) => {
                        return Err(err(
                            spec_line,
                            "spec.provider",
                            "action CUSTOM needs `provider.name` (an extension provider)".into(),
                        ))
                    }
                    (Action::Custom, Some(_)) | (_, None) => {}
                    (_, Some(_)) => {
                        return Err(err(
                            spec_line,
                            "spec.provider",
                            "`provider` is only for action CUSTOM".into(),
                        ))
                    }
                }
                set.authz.push(AuthzPolicy {
                    meta,
                    action,
                    provider,
                    rules,
                });
            }
            "RequestAuthentication" => {
                let d: Doc<RaSpecY> = parse_doc(file, doc, start)?;
                let spec = d.spec.unwrap_or_default();
                let meta = meta_of(d.metadata, spec.selector, file, kind_line);
                if spec.jwt_rules.len() > MAX_JWT_RULES {
                    return Err(err(
                        spec_line,
                        "spec.jwtRules",
                        format!("at most {MAX_JWT_RULES} jwtRules allowed"),
                    ));
                }
                let mut rules = Vec::new();
                for (i, r) in spec.jwt_rules.into_iter().enumerate() {
                    let field = format!("spec.jwtRules[{i}]");
                    rules.push(convert_jwt_rule(r, file).map_err(|m| err(spec_line, &field, m))?);
                }
                set.request_authn.push(RequestAuthn { meta, rules });
            }
            _ => {
                let d: Doc<PaSpecY> = parse_doc(file, doc, start)?;
                let spec = d.spec.unwrap_or_default();
                if !spec.port_level_mtls.is_empty() && spec.selector.is_none() {
                    return Err(err(
                        spec_line,
                        "spec.portLevelMtls",
                        "portLevelMtls requires a workload selector".into(),
                    ));
                }
                let meta = meta_of(d.metadata, spec.selector, file, kind_line);
                set.peer_authn.push(PeerAuthn {
                    meta,
                    mode: spec.mtls.map(|m| m.mode.0).unwrap_or_default(),
                    ports: spec
                        .port_level_mtls
                        .into_iter()
                        .map(|(k, v)| (k.0, v.mode.0))
                        .collect(),
                });
            }
        }
    }
    Ok(())
}

fn convert_jwt_rule(r: JwtRuleY, file: &Path) -> Result<JwtRuleSpec, String> {
    let (origin, inline) = match (r.jwks, r.jwks_uri) {
        (Some(_), Some(_)) => return Err("only one of jwks and jwksUri may be set".into()),
        (Some(j), None) => {
            crate::jwt::KeySet::parse(&j.0).map_err(|e| format!("jwks: {e}"))?;
            (JwksOrigin::Inline, Some(j.0))
        }
        (None, Some(u)) => {
            let u = u.0;
            if u.len() > MAX_JWKS_URI {
                return Err(format!("jwksUri longer than {MAX_JWKS_URI} characters"));
            }
            if let Some(p) = u.strip_prefix("file://") {
                (JwksOrigin::File(resolve(file, p)), None)
            } else if let Some(p) = u.strip_prefix("file:") {
                (JwksOrigin::File(resolve(file, p)), None)
            } else if u.starts_with("http://") || u.starts_with("https://") {
                u.parse::<http::Uri>()
                    .map_err(|e| format!("invalid jwksUri `{u}`: {e}"))?;
                (JwksOrigin::Uri(u), None)
            } else {
                return Err(format!(
                    "jwksUri `{u}` must be an http://, https:// or file: URI"
                ));
            }
        }
        (None, None) => {
            if !(r.issuer.0.starts_with("http://") || r.issuer.0.starts_with("https://")) {
                return Err(format!(
                    "no jwks or jwksUri, and issuer `{}` is not a URL for OpenID discovery",
                    r.issuer.0
                ));
            }
            (JwksOrigin::Discovery(r.issuer.0.clone()), None)
        }
    };
    let mut locations = Vec::new();
    for h in r.from_headers {
        locations.push(Location::Header {
            name: h.name.0,
            prefix: h.prefix,
        });
    }
    for p in r.from_params {
        locations.push(Location::Param(p.0));
    }
    for c in r.from_cookies {
        locations.push(Location::Cookie(c.0));
    }
    if locations.is_empty() {
        locations = crate::jwt::default_locations();
    }
    let mut space_delimited = vec!["scope".to_string(), "permission".to_string()];
    for c in r.space_delimited_claims {
        if !space_delimited.contains(&c.0) {
            space_delimited.push(c.0);
        }
    }
    Ok(JwtRuleSpec {
        issuer: r.issuer.0,
        audiences: r.audiences.into_iter().map(|a| a.0).collect(),
        origin,
        inline,
        locations,
        output_payload_to_header: r.output_payload_to_header.map(|h| h.0),
        output_claims: r
            .output_claim_to_headers
            .into_iter()
            .map(|c| (c.header.0, c.claim.0.split('.').map(String::from).collect()))
            .collect(),
        forward: r.forward_original_token,
        timeout: r.timeout.map(|t| t.0).unwrap_or(Duration::from_secs(5)),
        space_delimited,
    })
}

fn resolve(file: &Path, p: &str) -> PathBuf {
    let p = Path::new(p);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        file.parent().unwrap_or(Path::new(".")).join(p)
    }
}

fn io_err(path: &Path, msg: String) -> ConfigError {
    ConfigError::semantic(path, 0, 0, "", msg)
}

/// Loads files and directories (`*.yaml` / `*.yml`, recursively, in name order).
/// Relative paths are resolved against `base_dir`.
pub fn load_paths(paths: &[PathBuf], base_dir: &Path) -> Result<PolicySet, ConfigError> {
    let mut set = PolicySet::default();
    for p in paths {
        let p = if p.is_absolute() {
            p.clone()
        } else {
            base_dir.join(p)
        };
        let meta = std::fs::metadata(&p).map_err(|e| io_err(&p, format!("cannot read: {e}")))?;
        let files = if meta.is_dir() {
            let mut files = Vec::new();
            collect_yaml(&p, &mut files, 0)?;
            files.sort();
            files
        } else {
            vec![p.clone()]
        };
        for f in files {
            let len = std::fs::metadata(&f)
                .map_err(|e| io_err(&f, format!("cannot read: {e}")))?
                .len();
            if len > MAX_FILE_BYTES {
                return Err(io_err(
                    &f,
                    format!("file is {len} bytes, at most {MAX_FILE_BYTES} allowed"),
                ));
            }
            let text =
                std::fs::read_to_string(&f).map_err(|e| io_err(&f, format!("cannot read: {e}")))?;
            parse_text(&f, &text, &mut set)?;
        }
    }
    check_duplicates(&set)?;
    Ok(set)
}

fn collect_yaml(dir: &Path, out: &mut Vec<PathBuf>, depth: u32) -> Result<(), ConfigError> {
    if depth > 16 {
        return Err(io_err(dir, "directory nesting deeper than 16".into()));
    }
    let rd = std::fs::read_dir(dir).map_err(|e| io_err(dir, format!("cannot read: {e}")))?;
    for entry in rd {
        let entry = entry.map_err(|e| io_err(dir, format!("cannot read: {e}")))?;
        let path = entry.path();
        let ft = entry
            .file_type()
            .map_err(|e| io_err(&path, format!("cannot read: {e}")))?;
        if ft.is_dir() {
            collect_yaml(&path, out, depth + 1)?;
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml")
        {
            out.push(path);
        }
    }
    Ok(())
}

fn check_duplicates(set: &PolicySet) -> Result<(), ConfigError> {
    let mut seen: BTreeMap<(&str, String), &Meta> = BTreeMap::new();
    let all = set
        .authz
        .iter()
        .map(|p| ("AuthorizationPolicy", &p.meta))
        .chain(
            set.request_authn
                .iter()
                .map(|p| ("RequestAuthentication", &p.meta)),
        )
        .chain(
            set.peer_authn
                .iter()
                .map(|p| ("PeerAuthentication", &p.meta)),
        );
    for (kind, m) in all {
        if let Some(prev) = seen.insert((kind, m.id()), m) {
            return Err(ConfigError::semantic(
                &m.file,
                m.line,
                1,
                "metadata.name",
                format!(
                    "duplicate {kind} {} (first defined at {}:{})",
                    m.id(),
                    prev.file.display(),
                    prev.line
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PolicySet, ConfigError> {
        let mut set = PolicySet::default();
        parse_text(Path::new("p.yaml"), text, &mut set)?;
        check_duplicates(&set)?;
        Ok(set)
    }

    #[test]
    fn error_lines_count_a_bare_cr_in_a_document_separator() {
        // Found by the `config` fuzz target: the separator line held a bare CR (a line
        // break in YAML), which the document split did not count, so the next document
        // began a line late and its error (the `\u{2}` of line 3) was placed on line 2,
        // column 5, past the end of that line. The document is line 2 on.
        let text = "--- {5!$\r&\u{17}2\n+` #\u{2} \r [";
        let e = parse(text).unwrap_err();
        assert_eq!((e.line, e.column), (2, 1), "the anchor of line 2: {e}");
        // A third document after CR LF and bare CR lines (the first two are comments).
        let e = parse("# a\r\n---\r# b\r---\r\n\u{2}").unwrap_err();
        assert_eq!(e.line, 5, "{e}");
    }

    #[test]
    fn keys() {
        assert_eq!(
            parse_key("request.headers[X-Foo]").unwrap(),
            Key::Header("x-foo".into())
        );
        assert_eq!(
            parse_key("request.auth.claims[a][b.c]").unwrap(),
            Key::AuthClaims(vec!["a".into(), "b.c".into()])
        );
        assert!(parse_key("request.headers[]").is_err());
        assert!(parse_key("request.headers[a][b]").is_err());
        assert!(parse_key("request.auth.claims[]").is_err());
        assert!(parse_key("destination.labels[app]").is_err());
        assert!(parse_key("destination.namespace").is_err());
        assert!(parse_key("experimental.envoy.filters.a[b]").is_err());
        assert!(parse_key("request.regex.headers[x]").is_err());
    }

    #[test]
    fn empty_source_and_operation_are_errors() {
        let e = parse(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: a}\n\
             spec:\n  rules:\n  - from:\n    - source: {}\n",
        )
        .unwrap_err();
        assert!(e.message.contains("from.source"), "{e}");
        let e = parse(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: a}\n\
             spec:\n  rules:\n  - to:\n    - operation: {}\n",
        )
        .unwrap_err();
        assert!(e.message.contains("to.operation"), "{e}");
    }

    #[test]
    fn duplicates_are_errors() {
        let doc = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: a, namespace: x}\n";
        let e = parse(&format!("{doc}---\n{doc}")).unwrap_err();
        assert!(e.message.contains("duplicate"), "{e}");
        assert_eq!(e.line, 6);
    }
}
