//! The gateway configuration (`moat serve --config FILE`): types, loading and semantic checks.
//!
//! Parsing goes through [`moat_config`], so syntax and type errors name
//! `file:line:column: field`. The checks in [`validate`] (unknown cluster,
//! duplicate names, bad endpoint addresses) report the same way, using the
//! positions recorded by [`Spanned`].

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_config::{byte_size, duration, ConfigError};
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

/// The whole gateway configuration.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// Worker runtime.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// Downstream listeners.
    #[serde(default)]
    pub listeners: Vec<ListenerConfig>,
    /// Admin listener.
    #[serde(default)]
    pub admin: AdminConfig,
    /// Upstream clusters.
    #[serde(default)]
    pub clusters: Vec<ClusterConfig>,
    /// Routes, matched in order (first match wins).
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Request head limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Event (access, security and TLS records) pipeline.
    #[serde(default)]
    pub events: moat_events::EventsConfig,
    /// TLS handshake audit records.
    #[serde(default)]
    pub tls_audit: TlsAuditConfig,
    /// Distributed event sinks (Kafka, syslog, HTTP); read at start, not on reload.
    #[serde(default)]
    pub telemetry: moat_sinks::TelemetryConfig,
    /// Access control: Istio AuthorizationPolicy / RequestAuthentication / PeerAuthentication.
    #[serde(default)]
    pub authz: moat_authz::AuthzConfig,
    /// Attack detection. Off when the section is absent; a `waf:` section turns it on
    /// unless it says `enabled: false`.
    #[serde(default = "waf_off")]
    pub waf: moat_waf::WafConfig,
    /// Secret detection in request (and response) bodies.
    #[serde(default)]
    pub secrets: moat_secrets::SecretsConfig,
    /// API discovery (schemas computed after the response).
    #[serde(default)]
    pub discovery: moat_schema::DiscoveryConfig,
    /// Rate limits, IP bans and the bot challenge (`docs/ratelimit.md`).
    #[serde(default)]
    pub ratelimit: Option<moat_ratelimit::RateLimitConfig>,
}

/// `runtime:`.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// Worker threads; 0 = one per core. `--threads` overrides.
    #[serde(default)]
    pub threads: usize,
    /// Deadline for draining in-flight requests on SIGTERM.
    #[serde(default = "default_drain", with = "duration")]
    pub shutdown_timeout: Duration,
}

fn default_drain() -> Duration {
    Duration::from_secs(30)
}

/// One `listeners[]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ListenerConfig {
    /// Listener name (unique).
    pub name: Spanned<String>,
    /// Address to bind, `ip:port`.
    pub address: Spanned<String>,
    /// TLS termination (PEM certificates, SNI, ALPN, client-certificate mode).
    #[serde(default)]
    pub tls: Option<moat_tls::ServerTlsConfig>,
    /// How many trusted proxies in front of moat append to `X-Forwarded-For`;
    /// 0 = the client IP is the TCP peer.
    #[serde(default)]
    pub xff_trusted_hops: u32,
    /// What the listener carries: HTTP (default) or raw TCP to a cluster.
    #[serde(default)]
    pub protocol: ListenerProtocol,
    /// HTTP listeners: what becomes of request header fields whose names contain `_`
    /// (Envoy's `headers_with_underscores_action`).
    #[serde(default)]
    pub headers_with_underscores: UnderscoreHeaders,
    /// `protocol: tcp`: the cluster receiving the connections; with `sni_routes`, the
    /// cluster for a ClientHello without SNI or with an SNI no entry matches.
    #[serde(default)]
    pub cluster: Option<Spanned<String>>,
    /// `protocol: tcp`, TLS passthrough: SNI pattern (exact, `*.suffix` or `*`) to
    /// cluster. The ClientHello is read, not terminated, and forwarded as received.
    #[serde(default)]
    pub sni_routes: BTreeMap<String, Spanned<String>>,
    /// `protocol: tcp`: a connection with no byte in either direction for this long is
    /// closed; `0s` = never. Default [`DEFAULT_TCP_IDLE_TIMEOUT`].
    #[serde(default, with = "opt_duration")]
    pub idle_timeout: Option<Duration>,
    /// `protocol: tcp`: a connection is closed this long after it was accepted, busy or
    /// not; `0s` (the default) = never.
    #[serde(default, with = "opt_duration")]
    pub max_duration: Option<Duration>,
    /// `protocol: decision`: the workload the decisions are for and who may say where a
    /// request came from (docs/integrations.md).
    #[serde(default)]
    pub decision: Option<DecisionConfig>,
}

/// `listeners[].decision`: a decision listener answers Envoy's ext_authz (gRPC `Check`
/// and the HTTP service mode) and forward-auth requests (nginx `auth_request`, Traefik
/// ForwardAuth, Caddy `forward_auth`) with the decision of the pipeline.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionConfig {
    /// Labels of the protected workload (Istio `selector.matchLabels` match these).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Namespace of the protected workload (Istio `metadata.namespace`).
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// Addresses (IPs or CIDRs) of the proxies whose `X-Forwarded-*` / `X-Original-*`
    /// headers say where a forward-auth request came from; from any other peer those
    /// headers are ignored and the peer itself is the client.
    #[serde(default)]
    pub trusted_proxies: Vec<Spanned<String>>,
    /// Largest request body inspected (gRPC `raw_body`/`body`, or the body of an HTTP
    /// check); a larger one is refused with 413.
    #[serde(default = "default_body_max", with = "byte_size")]
    pub max_body: u64,
    /// Engines only report (events, `x-moat-event-id`) and every request is allowed.
    #[serde(default)]
    pub monitor_only: bool,
}

impl Default for DecisionConfig {
    fn default() -> Self {
        DecisionConfig {
            labels: BTreeMap::new(),
            namespace: default_namespace(),
            trusted_proxies: Vec::new(),
            max_body: default_body_max(),
            monitor_only: false,
        }
    }
}

/// `listeners[].protocol`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ListenerProtocol {
    /// HTTP/1.1 and HTTP/2 through routes.
    #[default]
    Http,
    /// Raw TCP to one cluster, or per SNI (TLS passthrough); see `docs/access-control.md`.
    Tcp,
    /// Decisions only: Envoy ext_authz (gRPC and HTTP) and forward-auth; see
    /// `docs/integrations.md`.
    Decision,
}

/// `listeners[].headers_with_underscores`. CGI, WSGI, PHP and Rack backends read `-` and
/// `_` in a field name as one character (`X_User` is `X-User` to them), so a policy or
/// detector that reads `x-user` does not see a client's `x_user` that the backend
/// reads as it. moat always drops the underscore spellings of the fields it writes or
/// vouches for; this setting covers every other field.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum UnderscoreHeaders {
    /// Forwarded as sent (Envoy's default).
    #[default]
    Allow,
    /// Removed before any engine sees the request (nginx's default).
    Drop,
    /// The request is answered 400.
    Reject,
}

/// Default `listeners[].idle_timeout` of a tcp listener (Envoy's `tcp_proxy` default).
pub const DEFAULT_TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(3600);

/// An optional duration written like `250ms`, `5s`, `1h`.
mod opt_duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        moat_config::duration::deserialize(d).map(Some)
    }

    pub(super) fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => moat_config::duration::serialize(d, s),
            None => s.serialize_none(),
        }
    }
}

/// `admin:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// Address of the admin listener (loopback by default).
    #[serde(default = "default_admin_addr")]
    pub address: Spanned<String>,
    /// Optional bearer token required on every admin path except /healthz and /readyz.
    #[serde(default)]
    pub token: Option<String>,
    /// The web console served under `/console` (docs/console.md).
    #[serde(default)]
    pub console: ConsoleConfig,
}

/// `admin.console:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    /// Serve the console (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Answer console requests from non-loopback peers (default false: even on an admin
    /// address reachable from the network, the console answers only local browsers).
    #[serde(default)]
    pub allow_remote: bool,
    /// How long a login lasts (default 8h, at most 7d).
    #[serde(default = "default_session_ttl", with = "duration")]
    pub session_ttl: Duration,
}

fn default_session_ttl() -> Duration {
    Duration::from_secs(8 * 3600)
}

/// Longest `admin.console.session_ttl`.
pub const MAX_CONSOLE_SESSION_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            allow_remote: false,
            session_ttl: default_session_ttl(),
        }
    }
}

fn default_admin_addr() -> Spanned<String> {
    unlocated("127.0.0.1:9901".to_string())
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            address: default_admin_addr(),
            token: None,
            console: ConsoleConfig::default(),
        }
    }
}

/// One `clusters[]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Cluster name (unique), referenced by routes.
    pub name: Spanned<String>,
    /// Endpoints, `host:port`, balanced round-robin.
    pub endpoints: Vec<Spanned<String>>,
    /// Workload labels (matched by authorization policies).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Workload namespace.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// TCP connect timeout; a timeout answers 504.
    #[serde(default = "default_connect_timeout", with = "duration")]
    pub connect_timeout: Duration,
    /// Time allowed from sending the request to receiving the response head; 504 after.
    #[serde(default = "default_request_timeout", with = "duration")]
    pub request_timeout: Duration,
    /// Time the upstream may go without sending any of a response body it has begun;
    /// past it the response is cut and the connection closed (nginx's
    /// `proxy_read_timeout`). `0s`: never.
    #[serde(default = "default_read_timeout", with = "duration")]
    pub read_timeout: Duration,
    /// Idle keep-alive connections to the upstream are closed after this.
    #[serde(default = "default_idle_timeout", with = "duration")]
    pub idle_timeout: Duration,
    /// Maximum idle pooled connections per endpoint (a connection returned to a
    /// full pool is closed).
    #[serde(default = "default_max_idle")]
    pub max_idle_per_endpoint: usize,
    /// Every `idle_purge`, half of the pooled connections that stayed idle the whole
    /// interval are closed and the rest free their buffers, so the pool a burst
    /// opened shrinks by half each interval; `0s` turns it off.
    #[serde(default = "default_idle_purge", with = "duration")]
    pub idle_purge: Duration,
    /// Passive ejection of failing endpoints.
    #[serde(default)]
    pub ejection: EjectionConfig,
    /// TLS to the upstream.
    #[serde(default)]
    pub tls: Option<moat_tls::UpstreamTlsConfig>,
}

fn default_namespace() -> String {
    "default".into()
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(1)
}
fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}
/// nginx's `proxy_read_timeout` default.
fn default_read_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_idle_timeout() -> Duration {
    Duration::from_secs(90)
}
fn default_max_idle() -> usize {
    256
}
/// HAProxy's `pool-purge-delay` default.
fn default_idle_purge() -> Duration {
    Duration::from_secs(5)
}
/// Bounds of a nonzero `clusters[].idle_purge`: the reaper wakes that often.
const MIN_IDLE_PURGE: Duration = Duration::from_millis(100);
const MAX_IDLE_PURGE: Duration = Duration::from_secs(3600);

/// `clusters[].ejection`: passive health checking.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct EjectionConfig {
    /// Consecutive failed exchanges (connect failure, timeout, reset or malformed
    /// response before the head) that eject an endpoint; 0 disables ejection.
    #[serde(default = "default_consecutive")]
    pub consecutive_failures: u32,
    /// Consecutive 5xx responses that eject an endpoint; 0 (the default) disables it,
    /// since an application may answer 5xx for one kind of request while healthy.
    #[serde(default)]
    pub consecutive_5xx: u32,
    /// How long an ejected endpoint is skipped.
    #[serde(default = "default_eject_time", with = "duration")]
    pub duration: Duration,
}

fn default_consecutive() -> u32 {
    5
}
fn default_eject_time() -> Duration {
    Duration::from_secs(30)
}

impl Default for EjectionConfig {
    fn default() -> Self {
        EjectionConfig {
            consecutive_failures: default_consecutive(),
            consecutive_5xx: 0,
            duration: default_eject_time(),
        }
    }
}

/// One `routes[]` entry.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Route name (unique), used in metrics and events.
    pub name: Spanned<String>,
    /// Host to match: exact (`api.example.com`), suffix (`*.example.com`) or `*`.
    #[serde(default = "default_host")]
    pub host: Spanned<String>,
    /// Path prefix to match.
    #[serde(default = "default_prefix")]
    pub path_prefix: Spanned<String>,
    /// Cluster receiving the traffic.
    pub cluster: Spanned<String>,
    /// Request body limit and policy.
    #[serde(default)]
    pub body: BodyConfig,
    /// Response body buffering limit (only used when a phase inspects responses).
    #[serde(default)]
    pub response_body: ResponseBodyConfig,
    /// Run engines in monitor-only mode on this route (events, no blocking).
    #[serde(default)]
    pub monitor_only: bool,
    /// Protocols an HTTP/1.1 client may switch its connection to on this route
    /// (`Upgrade`, RFC 9110 7.8), matched by name without case or version. Such a request
    /// is forwarded with its upgrade, and after the upstream's `101` the connection is a
    /// tunnel whose bytes moat no longer inspects. A request offering any other protocol
    /// is forwarded as a plain request, without `Upgrade` (as nginx does). `h2c`, `h2`
    /// and `HTTP` are refused: the tunnel would carry HTTP requests past every check
    /// ("h2c smuggling").
    #[serde(default = "default_upgrades")]
    pub upgrades: Vec<Spanned<String>>,
}

fn default_upgrades() -> Vec<Spanned<String>> {
    vec![unlocated("websocket".into())]
}

fn default_host() -> Spanned<String> {
    unlocated("*".into())
}
fn default_prefix() -> Spanned<String> {
    unlocated("/".into())
}

/// `routes[].body`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BodyConfig {
    /// Largest request body moat accepts (reject) or inspects (forward).
    #[serde(default = "default_body_max", with = "byte_size")]
    pub max_bytes: u64,
    /// What happens beyond `max_bytes`.
    #[serde(default)]
    pub on_limit: OnLimit,
    /// Time allowed to receive a request body that did not arrive with its head,
    /// extended by one second for every `min_rate` bytes received (Apache
    /// `mod_reqtimeout`'s `body=` with `MinRate`); beyond it moat answers 408 and
    /// closes the connection.
    #[serde(default = "default_body_read_timeout", with = "duration")]
    pub read_timeout: Duration,
    /// Bytes per second that earn a body one more second; 0 = `read_timeout` bounds
    /// the whole body.
    #[serde(default = "default_body_min_rate", with = "byte_size")]
    pub min_rate: u64,
}

fn default_body_max() -> u64 {
    1 << 20
}
fn default_body_read_timeout() -> Duration {
    Duration::from_secs(20)
}
fn default_body_min_rate() -> u64 {
    500
}

impl Default for BodyConfig {
    fn default() -> Self {
        BodyConfig {
            max_bytes: default_body_max(),
            on_limit: OnLimit::Reject,
            read_timeout: default_body_read_timeout(),
            min_rate: default_body_min_rate(),
        }
    }
}

/// `routes[].response_body`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseBodyConfig {
    /// At most this many response bytes are buffered for inspection; the rest streams
    /// through uninspected and a `limits` event is raised.
    #[serde(default = "default_body_max", with = "byte_size")]
    pub max_bytes: u64,
}

impl Default for ResponseBodyConfig {
    fn default() -> Self {
        ResponseBodyConfig {
            max_bytes: default_body_max(),
        }
    }
}

/// Policy for request bodies larger than `max_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnLimit {
    /// Answer 413.
    #[default]
    Reject,
    /// Inspect the first `max_bytes`, forward everything, raise a `limits` event.
    Forward,
}

/// `limits:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Total size of the request head (names + values); larger answers 431. At least 1KiB.
    #[serde(
        default = "default_header_bytes",
        deserialize_with = "head_bytes",
        serialize_with = "byte_size::serialize"
    )]
    pub max_header_bytes: u64,
    /// Number of request headers; more answers 431. 1 to 512 (the HTTP/1.1 parser's
    /// hard cap).
    #[serde(default = "default_max_headers", deserialize_with = "header_count")]
    pub max_headers: usize,
}

/// `limits.max_header_bytes`, checked while it is read (so an error has its position).
fn head_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = byte_size::deserialize(d)?;
    if n < 1024 {
        return Err(serde::de::Error::custom(format!(
            "max_header_bytes must be at least 1KiB, got {n}"
        )));
    }
    Ok(n)
}

/// `limits.max_headers`, checked while it is read (so an error has its position).
fn header_count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    let max = crate::h1::server::MAX_HEADER_SLOTS;
    if n == 0 || n > max {
        return Err(serde::de::Error::custom(format!(
            "max_headers must be 1 to {max}, got {n}"
        )));
    }
    Ok(n)
}

fn default_header_bytes() -> u64 {
    64 << 10
}
fn default_max_headers() -> usize {
    100
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_header_bytes: default_header_bytes(),
            max_headers: default_max_headers(),
        }
    }
}

/// `tls_audit:`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsAuditConfig {
    /// Record every downstream TLS handshake as a TLS event.
    #[serde(default = "yes")]
    pub enabled: bool,
}

fn waf_off() -> moat_waf::WafConfig {
    moat_waf::WafConfig {
        enabled: false,
        ..moat_waf::WafConfig::default()
    }
}

fn yes() -> bool {
    true
}

impl Default for TlsAuditConfig {
    fn default() -> Self {
        TlsAuditConfig { enabled: true }
    }
}

/// A [`Spanned`] value with no known position (defaults).
pub fn unlocated<T>(value: T) -> Spanned<T> {
    let unknown = serde_saphyr::Location::UNKNOWN;
    Spanned::new(value, unknown, unknown)
}

/// Where a configuration came from; relative paths in it resolve against `base_dir`.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// The file (or a label such as `<quickstart>`).
    pub file: PathBuf,
    /// Directory relative paths are resolved against.
    pub base_dir: PathBuf,
}

impl ConfigSource {
    /// The source for a config file on disk.
    pub fn from_file(file: &Path) -> Self {
        let base_dir = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        ConfigSource {
            file: file.to_path_buf(),
            base_dir,
        }
    }
}

fn err_at<T>(src: &ConfigSource, s: &Spanned<T>, field: String, msg: String) -> ConfigError {
    ConfigError::semantic(
        &src.file,
        s.referenced.line() as u32,
        s.referenced.column() as u32,
        field,
        msg,
    )
}

/// Parses YAML text and runs the semantic checks.
pub fn parse(src: &ConfigSource, text: &str) -> Result<GatewayConfig, ConfigError> {
    let cfg: GatewayConfig = moat_config::from_str(&src.file, text)?;
    validate(src, &cfg)?;
    Ok(cfg)
}

/// Reads, parses and checks a config file.
pub fn load_file(file: &Path) -> Result<(GatewayConfig, ConfigSource), ConfigError> {
    let src = ConfigSource::from_file(file);
    let text = std::fs::read_to_string(file).map_err(|e| {
        ConfigError::semantic(file, 0, 0, "", format!("cannot read config file: {e}"))
    })?;
    Ok((parse(&src, &text)?, src))
}

/// Semantic checks: unique names, known clusters, parseable addresses, sane limits.
pub fn validate(src: &ConfigSource, cfg: &GatewayConfig) -> Result<(), ConfigError> {
    cfg.telemetry.validate(&src.file)?;
    let mut names = HashSet::new();
    for (i, l) in cfg.listeners.iter().enumerate() {
        if !names.insert(l.name.value.as_str()) {
            return Err(err_at(
                src,
                &l.name,
                format!("listeners[{i}].name"),
                format!("duplicate listener name `{}`", l.name.value),
            ));
        }
        if l.address.value.parse::<SocketAddr>().is_err() {
            return Err(err_at(
                src,
                &l.address,
                format!("listeners[{i}].address"),
                format!("`{}` is not an ip:port address", l.address.value),
            ));
        }
        check_listener_protocol(src, i, l)?;
    }
    if cfg.admin.address.value.parse::<SocketAddr>().is_err() {
        return Err(err_at(
            src,
            &cfg.admin.address,
            "admin.address".into(),
            format!("`{}` is not an ip:port address", cfg.admin.address.value),
        ));
    }
    let ttl = cfg.admin.console.session_ttl;
    if ttl.is_zero() || ttl > MAX_CONSOLE_SESSION_TTL {
        // The section's own position is not recorded: the admin address's line is the
        // nearest one that is.
        return Err(err_at(
            src,
            &cfg.admin.address,
            "admin.console.session_ttl".into(),
            format!("{ttl:?} is out of range (1s..=7d)"),
        ));
    }
    let mut clusters = HashSet::new();
    for (i, c) in cfg.clusters.iter().enumerate() {
        if !clusters.insert(c.name.value.as_str()) {
            return Err(err_at(
                src,
                &c.name,
                format!("clusters[{i}].name"),
                format!("duplicate cluster name `{}`", c.name.value),
            ));
        }
        if c.endpoints.is_empty() {
            return Err(err_at(
                src,
                &c.name,
                format!("clusters[{i}].endpoints"),
                "a cluster needs at least one endpoint".into(),
            ));
        }
        for (j, e) in c.endpoints.iter().enumerate() {
            if let Err(m) = check_endpoint(&e.value) {
                return Err(err_at(src, e, format!("clusters[{i}].endpoints[{j}]"), m));
            }
        }
        if !c.idle_purge.is_zero() && !(MIN_IDLE_PURGE..=MAX_IDLE_PURGE).contains(&c.idle_purge) {
            return Err(err_at(
                src,
                &c.name,
                format!("clusters[{i}].idle_purge"),
                format!(
                    "must be 0s (off) or between 100ms and 1h, got {:?}",
                    c.idle_purge
                ),
            ));
        }
    }
    for (i, l) in cfg.listeners.iter().enumerate() {
        check_tcp_clusters(src, i, l, cfg)?;
    }
    let mut routes = HashSet::new();
    for (i, r) in cfg.routes.iter().enumerate() {
        if !routes.insert(r.name.value.as_str()) {
            return Err(err_at(
                src,
                &r.name,
                format!("routes[{i}].name"),
                format!("duplicate route name `{}`", r.name.value),
            ));
        }
        if !clusters.contains(r.cluster.value.as_str()) {
            return Err(err_at(
                src,
                &r.cluster,
                format!("routes[{i}].cluster"),
                format!("unknown cluster `{}`", r.cluster.value),
            ));
        }
        if !r.path_prefix.value.starts_with('/') {
            return Err(err_at(
                src,
                &r.path_prefix,
                format!("routes[{i}].path_prefix"),
                "must start with `/`".into(),
            ));
        }
        let h = &r.host.value;
        if !host_pattern_ok(h) {
            return Err(err_at(
                src,
                &r.host,
                format!("routes[{i}].host"),
                format!("`{h}`: use an exact host, `*.suffix` or `*`"),
            ));
        }
    }
    Ok(())
}

/// An exact host, `*.suffix` or `*`.
fn host_pattern_ok(h: &str) -> bool {
    let wildcard_ok = h == "*"
        || h.strip_prefix("*.")
            .is_some_and(|rest| !rest.is_empty() && !rest.contains('*'));
    !(h.is_empty() || (h.contains('*') && !wildcard_ok))
}

/// Keys of one protocol refused on a listener of the other.
fn check_listener_protocol(
    src: &ConfigSource,
    i: usize,
    l: &ListenerConfig,
) -> Result<(), ConfigError> {
    let refuse =
        |what: &str, msg: String| Err(err_at(src, &l.name, format!("listeners[{i}].{what}"), msg));
    if l.decision.is_some() && l.protocol != ListenerProtocol::Decision {
        return refuse(
            "decision",
            "`decision` is only for `protocol: decision` listeners".into(),
        );
    }
    match l.protocol {
        ListenerProtocol::Decision => {
            for (set, key) in [
                (l.cluster.is_some(), "cluster"),
                (!l.sni_routes.is_empty(), "sni_routes"),
                (l.idle_timeout.is_some(), "idle_timeout"),
                (l.max_duration.is_some(), "max_duration"),
                (l.xff_trusted_hops != 0, "xff_trusted_hops"),
                (
                    l.headers_with_underscores != UnderscoreHeaders::Allow,
                    "headers_with_underscores",
                ),
            ] {
                if set {
                    return refuse(key, format!("`{key}` is not for `protocol: decision` listeners (use `decision.trusted_proxies`)"));
                }
            }
            for (j, p) in l
                .decision
                .iter()
                .flat_map(|d| d.trusted_proxies.iter())
                .enumerate()
            {
                if parse_net(&p.value).is_none() {
                    return Err(err_at(
                        src,
                        p,
                        format!("listeners[{i}].decision.trusted_proxies[{j}]"),
                        format!("`{}` is not an IP address or CIDR", p.value),
                    ));
                }
            }
        }
        ListenerProtocol::Http => {
            for (set, key) in [
                (l.cluster.is_some(), "cluster"),
                (!l.sni_routes.is_empty(), "sni_routes"),
                (l.idle_timeout.is_some(), "idle_timeout"),
                (l.max_duration.is_some(), "max_duration"),
            ] {
                if set {
                    return refuse(key, format!("`{key}` is only for `protocol: tcp` listeners (HTTP listeners use routes)"));
                }
            }
        }
        ListenerProtocol::Tcp => {
            for (set, key) in [
                (l.xff_trusted_hops != 0, "xff_trusted_hops"),
                (
                    l.headers_with_underscores != UnderscoreHeaders::Allow,
                    "headers_with_underscores",
                ),
            ] {
                if set {
                    return refuse(key, format!("`{key}` is only for HTTP listeners"));
                }
            }
            if l.cluster.is_none() && l.sni_routes.is_empty() {
                return refuse(
                    "cluster",
                    "a `protocol: tcp` listener needs `cluster` or `sni_routes`".into(),
                );
            }
            if l.tls.is_some() && !l.sni_routes.is_empty() {
                return refuse(
                    "sni_routes",
                    "`sni_routes` (TLS passthrough) and `tls` (TLS termination) exclude each other"
                        .into(),
                );
            }
            if let Some((h, _)) = l.sni_routes.iter().find(|(h, _)| !host_pattern_ok(h)) {
                return refuse(
                    "sni_routes",
                    format!("`{h}`: use an exact host, `*.suffix` or `*`"),
                );
            }
        }
    }
    Ok(())
}

/// An IP address (a /32 or /128) or a CIDR.
pub fn parse_net(s: &str) -> Option<ipnet::IpNet> {
    s.parse()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(ipnet::IpNet::from))
}

/// The clusters a tcp listener names exist and do not originate TLS.
fn check_tcp_clusters(
    src: &ConfigSource,
    i: usize,
    l: &ListenerConfig,
    cfg: &GatewayConfig,
) -> Result<(), ConfigError> {
    let named = l
        .cluster
        .iter()
        .map(|c| (c, format!("listeners[{i}].cluster")))
        .chain(
            l.sni_routes
                .iter()
                .map(|(h, c)| (c, format!("listeners[{i}].sni_routes.{h}"))),
        );
    for (c, field) in named {
        match cfg.clusters.iter().find(|k| k.name.value == c.value) {
            None => return Err(err_at(src, c, field, format!("unknown cluster `{}`", c.value))),
            Some(k) if k.tls.is_some() => {
                return Err(err_at(
                    src,
                    c,
                    field,
                    format!(
                        "cluster `{}` has `tls`: a tcp listener forwards bytes as received and does not originate TLS",
                        c.value
                    ),
                ))
            }
            Some(_) => {}
        }
    }
    Ok(())
}

fn check_endpoint(e: &str) -> Result<(), String> {
    match e.parse::<http::uri::Authority>() {
        Ok(a) if a.port_u16().is_some() && !a.host().is_empty() && !e.contains('@') => Ok(()),
        _ => Err(format!("`{e}` is not a host:port endpoint")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src() -> ConfigSource {
        ConfigSource {
            file: "moat.yaml".into(),
            base_dir: ".".into(),
        }
    }

    #[test]
    fn unknown_cluster_names_line_and_field() {
        let text = "clusters:\n  - name: app\n    endpoints: [\"127.0.0.1:1\"]\nroutes:\n  - name: r\n    cluster: nope\n";
        let e = parse(&src(), text).unwrap_err();
        assert_eq!(e.field, "routes[0].cluster");
        assert_eq!(e.line, 6, "{e}");
        assert!(e.to_string().starts_with("moat.yaml:6:"), "{e}");
    }

    #[test]
    fn bad_endpoint_and_defaults() {
        let text = "clusters:\n  - name: app\n    endpoints: [\"nope\"]\n";
        let e = parse(&src(), text).unwrap_err();
        assert_eq!(e.field, "clusters[0].endpoints[0]");
        assert_eq!(e.line, 3);
        let ok = parse(&src(), "clusters:\n  - name: app\n    endpoints: [\"a:1\"]\nroutes:\n  - name: r\n    cluster: app\n    body: {max_bytes: 1KiB, on_limit: forward}\n").unwrap();
        assert_eq!(ok.routes[0].body.max_bytes, 1024);
        assert_eq!(ok.routes[0].body.on_limit, OnLimit::Forward);
        assert_eq!(ok.routes[0].host.value, "*");
        assert_eq!(ok.clusters[0].connect_timeout, Duration::from_secs(1));
    }

    #[test]
    fn header_limits_out_of_range_name_line_and_field() {
        for (limits, field, what) in [
            (
                "limits:\n  max_headers: 0\n",
                "limits.max_headers",
                "1 to 512",
            ),
            (
                "limits:\n  max_headers: 513\n",
                "limits.max_headers",
                "1 to 512",
            ),
            (
                "limits:\n  max_header_bytes: 100\n",
                "limits.max_header_bytes",
                "at least 1KiB",
            ),
        ] {
            let text = format!("clusters:\n  - name: app\n    endpoints: [\"a:1\"]\n{limits}");
            let e = parse(&src(), &text).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert_eq!(e.line, 5, "{e}");
            assert!(e.to_string().contains(what), "{e}");
        }
        let ok = parse(
            &src(),
            "limits: {max_headers: 512, max_header_bytes: 1KiB}\n",
        )
        .unwrap();
        assert_eq!(
            (ok.limits.max_headers, ok.limits.max_header_bytes),
            (512, 1024)
        );
    }

    #[test]
    fn idle_purge_is_bounded() {
        for bad in ["10ms", "2h"] {
            let text = format!(
                "clusters:\n  - name: app\n    endpoints: [\"a:1\"]\n    idle_purge: {bad}\n"
            );
            let e = parse(&src(), &text).unwrap_err();
            assert_eq!(e.field, "clusters[0].idle_purge", "{e}");
            assert_eq!(e.line, 2, "{e}");
            assert!(e.to_string().contains("between 100ms and 1h"), "{e}");
        }
        for (ok, want) in [("0s", 0), ("100ms", 100), ("", 5000)] {
            let text = format!(
                "clusters:\n  - name: app\n    endpoints: [\"a:1\"]\n{}",
                if ok.is_empty() {
                    String::new()
                } else {
                    format!("    idle_purge: {ok}\n")
                }
            );
            let cfg = parse(&src(), &text).unwrap();
            assert_eq!(cfg.clusters[0].idle_purge, Duration::from_millis(want));
        }
    }
}
