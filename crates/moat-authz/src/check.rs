//! `moat policy check`: evaluates one request (or, with `--tcp`, one connection) with the
//! same engine as the gateway.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use http::{HeaderMap, HeaderName, HeaderValue};
use moat_core::PeerIdentity;

use crate::engine::{AuthzConfig, AuthzEngine, ConnectionInput, Decision, RequestInput};
use crate::fetch::JwksFetcher;
use crate::request::{
    canonical_ip, remote_ip_from_xff, HostPort, MethodOverrides, PathNormalization, PathParameters,
};

/// Inputs of `moat policy check`.
#[derive(Debug, Clone)]
pub struct CheckArgs {
    /// Policy files or directories.
    pub policies: Vec<PathBuf>,
    /// Request URL (`http(s)://host[:port]/path?query`).
    pub url: String,
    /// Method (default `GET`).
    pub method: String,
    /// Extra headers, `Name: value`.
    pub headers: Vec<String>,
    /// The request body (read for a `_method` field of a POST form, JSON or multipart
    /// body, as the gateway reads it); absent = decided on the head.
    pub body: Option<String>,
    /// TCP peer address (`source.ip`); absent = unknown (positive IP matches fail).
    pub source_ip: Option<String>,
    /// Original client address (`remote.ip`); absent = from X-Forwarded-For with
    /// `trusted_proxies`, else the source IP.
    pub remote_ip: Option<String>,
    /// Local address (`destination.ip`); absent = unknown.
    pub dest_ip: Option<String>,
    /// Client certificate URI SAN; absent = plaintext.
    pub peer_uri: Option<String>,
    /// Destination port; absent = the URL's.
    pub port: Option<u16>,
    /// TLS SNI; absent = none.
    pub sni: Option<String>,
    /// Sent as `Authorization: Bearer <jwt>`.
    pub jwt: Option<String>,
    /// Workload namespace (default `default`).
    pub namespace: String,
    /// Workload labels, `key=value`.
    pub labels: Vec<String>,
    /// Istio root namespace (default `istio-system`).
    pub root_namespace: String,
    /// Trusted proxies for X-Forwarded-For (default 0).
    pub trusted_proxies: u32,
    /// Path normalization (default `base`).
    pub path_normalization: PathNormalization,
    /// How `;` path parameters are read (default `both`).
    pub path_parameters: PathParameters,
    /// How method overrides are read (default `both`).
    pub method_overrides: MethodOverrides,
    /// Whether DENY policies read the host without its port (default `both`).
    pub host_port: HostPort,
}

impl Default for CheckArgs {
    fn default() -> Self {
        CheckArgs {
            policies: Vec::new(),
            url: String::new(),
            method: "GET".into(),
            headers: Vec::new(),
            body: None,
            source_ip: None,
            remote_ip: None,
            dest_ip: None,
            peer_uri: None,
            port: None,
            sni: None,
            jwt: None,
            namespace: "default".into(),
            labels: Vec::new(),
            root_namespace: "istio-system".into(),
            trusted_proxies: 0,
            path_normalization: PathNormalization::Base,
            path_parameters: PathParameters::Both,
            method_overrides: MethodOverrides::Both,
            host_port: HostPort::Both,
        }
    }
}

fn parse_ip(s: &str, flag: &str) -> Result<IpAddr, String> {
    s.trim()
        .parse::<IpAddr>()
        .map(canonical_ip)
        .map_err(|_| format!("{flag}: invalid IP address `{s}`"))
}

/// Evaluates the request; `Err` is an input error (bad flag, URL or policy file).
/// Remote JWKS are fetched once through `fetcher`.
pub fn run(args: &CheckArgs, fetcher: std::sync::Arc<dyn JwksFetcher>) -> Result<Decision, String> {
    let engine = build_engine(args, fetcher)?;
    check_with(&engine, args)
}

/// Evaluates the request against an already built engine.
pub fn check_with(engine: &AuthzEngine, args: &CheckArgs) -> Result<Decision, String> {
    let uri: http::Uri = args
        .url
        .parse()
        .map_err(|e| format!("--url: invalid URL `{}`: {e}", args.url))?;
    let scheme = match uri.scheme_str() {
        Some("http") => "http",
        Some("https") => "https",
        _ => {
            return Err(format!(
                "--url: `{}` must start with http:// or https://",
                args.url
            ))
        }
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("--url: `{}` has no host", args.url))?;
    let port = args
        .port
        .or(authority.port_u16())
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let mut headers = HeaderMap::new();
    for h in &args.headers {
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| format!("--header: expected `Name: value`, got `{h}`"))?;
        let name = HeaderName::from_bytes(k.trim().as_bytes())
            .map_err(|_| format!("--header: invalid header name `{}`", k.trim()))?;
        let value = HeaderValue::from_str(v.trim())
            .map_err(|_| format!("--header: invalid value for `{name}`"))?;
        headers.append(name, value);
    }
    if let Some(t) = &args.jwt {
        let v = HeaderValue::from_str(&format!("Bearer {}", t.trim()))
            .map_err(|_| "--jwt: token is not a valid header value".to_string())?;
        headers.append(http::header::AUTHORIZATION, v);
    }
    let host: String = match headers.get(http::header::HOST) {
        Some(h) => String::from_utf8_lossy(h.as_bytes()).into_owned(),
        None => authority.as_str().to_string(),
    };
    let method = args.method.trim();
    if method.is_empty() || http::Method::from_bytes(method.as_bytes()).is_err() {
        return Err(format!("--method: invalid method `{method}`"));
    }
    let source_ip = args
        .source_ip
        .as_deref()
        .map(|s| parse_ip(s, "--source-ip"))
        .transpose()?;
    let remote_ip = match args.remote_ip.as_deref() {
        Some(s) => Some(parse_ip(s, "--remote-ip")?),
        None => remote_ip_from_xff(&headers, args.trusted_proxies, source_ip),
    };
    let dest_ip = args
        .dest_ip
        .as_deref()
        .map(|s| parse_ip(s, "--destination-ip"))
        .transpose()?;
    let peer = peer_identity(args)?;
    let labels = parse_labels(args)?;
    let pq = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let pq = if pq.is_empty() { "/" } else { pq };
    let input = RequestInput {
        namespace: &args.namespace,
        labels: &labels,
        scheme,
        method,
        host: &host,
        path_and_query: pq,
        port: Some(port),
        source_ip,
        remote_ip,
        dest_ip,
        sni: args.sni.as_deref(),
        peer: peer.as_ref(),
        body: args.body.as_deref().map(str::as_bytes),
    };
    Ok(engine.evaluate(&input, &mut headers))
}

/// The verified client certificate of `--peer-uri` (absent: plaintext).
fn peer_identity(args: &CheckArgs) -> Result<Option<PeerIdentity>, String> {
    let Some(u) = &args.peer_uri else {
        return Ok(None);
    };
    if !u.contains("://") {
        return Err(format!(
            "--peer-uri: `{u}` is not a URI (e.g. spiffe://cluster.local/ns/foo/sa/bar)"
        ));
    }
    let (principal, namespace) = PeerIdentity::from_spiffe_uri(u);
    Ok(Some(PeerIdentity {
        principal,
        namespace,
        uri_sans: vec![u.clone()],
        subject: String::new(),
        fingerprint_sha256: String::new(),
    }))
}

/// The workload labels of `--label key=value` flags.
pub fn parse_labels(args: &CheckArgs) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    for l in &args.labels {
        let (k, v) = l
            .split_once('=')
            .ok_or_else(|| format!("--label: expected `key=value`, got `{l}`"))?;
        labels.insert(k.trim().to_string(), v.trim().to_string());
    }
    Ok(labels)
}

/// Builds the engine for `args` (policies, root namespace, trusted proxies, path
/// normalization); remote JWKS are fetched once through `fetcher`, never refreshed.
pub fn build_engine(
    args: &CheckArgs,
    fetcher: std::sync::Arc<dyn JwksFetcher>,
) -> Result<std::sync::Arc<AuthzEngine>, String> {
    let cfg = AuthzConfig {
        enabled: true,
        policies: args.policies.clone(),
        root_namespace: args.root_namespace.clone(),
        trusted_proxies: Some(args.trusted_proxies),
        path_normalization: args.path_normalization,
        path_parameters: args.path_parameters,
        method_overrides: args.method_overrides,
        host_port: args.host_port,
        ..AuthzConfig::default()
    };
    let base = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
    AuthzEngine::build_with(&cfg, &base, fetcher, false).map_err(|e| e.to_string())
}

/// Evaluates a TCP connection (`moat policy check --tcp`): the workload, `--port`
/// (required), `--source-ip`, `--remote-ip` (default: the source IP),
/// `--destination-ip`, `--sni` and `--peer-uri` of `args`; the URL, method, headers and
/// JWT are not part of a connection and are ignored.
pub fn check_connection_with(engine: &AuthzEngine, args: &CheckArgs) -> Result<Decision, String> {
    let port = args
        .port
        .ok_or_else(|| "--port is required with --tcp (the destination port)".to_string())?;
    let ip = |v: &Option<String>, flag: &str| v.as_deref().map(|s| parse_ip(s, flag)).transpose();
    let source_ip = ip(&args.source_ip, "--source-ip")?;
    let remote_ip = ip(&args.remote_ip, "--remote-ip")?;
    let dest_ip = ip(&args.dest_ip, "--destination-ip")?;
    let peer = peer_identity(args)?;
    let labels = parse_labels(args)?;
    Ok(engine.evaluate_connection(&ConnectionInput {
        namespace: &args.namespace,
        labels: &labels,
        port: Some(port),
        source_ip,
        remote_ip,
        dest_ip,
        sni: args.sni.as_deref(),
        peer: peer.as_ref(),
    }))
}

/// `--tcp` human output: `ALLOW` (connection accepted) or `DENY` (connection closed),
/// the deciding policy and rule, the reason.
pub fn connection_to_text(d: &Decision) -> String {
    let what = if d.allowed {
        "connection accepted"
    } else {
        "connection closed"
    };
    let mut s = format!("{} ({what})\n", decision_word(d));
    match (&d.policy, d.rule) {
        (Some(p), Some(r)) => s.push_str(&format!("policy: {p} rule {r}\n")),
        (Some(p), None) => s.push_str(&format!("policy: {p}\n")),
        _ => {}
    }
    s.push_str(&format!("reason: {}\n", d.reason));
    for a in &d.audit {
        s.push_str(&format!("audit: {a}\n"));
    }
    if let Some(dr) = &d.dry_run {
        s.push_str(&format!("dry-run: {dr}\n"));
    }
    s
}

/// `--tcp --json` output.
pub fn connection_to_json(d: &Decision) -> serde_json::Value {
    serde_json::json!({
        "protocol": "tcp",
        "decision": decision_word(d),
        "connection": if d.allowed { "accepted" } else { "closed" },
        "policy": d.policy,
        "rule": d.rule,
        "audit": !d.audit.is_empty(),
        "audit_policies": d.audit,
        "reason": d.reason,
        "dry_run": d.dry_run,
        "mtls_mode": d.mtls_mode,
    })
}

/// `ALLOW` or `DENY`.
pub fn decision_word(d: &Decision) -> &'static str {
    if d.allowed {
        "ALLOW"
    } else {
        "DENY"
    }
}

/// The `--json` output.
pub fn to_json(d: &Decision) -> serde_json::Value {
    serde_json::json!({
        "status": d.status,
        "decision": decision_word(d),
        "policy": d.policy,
        "rule": d.rule,
        "audit": !d.audit.is_empty(),
        "audit_policies": d.audit,
        "reason": d.reason,
        "dry_run": d.dry_run,
        "request_principal": d.request_principal,
        "mtls_mode": d.mtls_mode,
    })
}

/// The human output.
pub fn to_text(d: &Decision) -> String {
    let mut s = format!("{} {}\n", d.status, decision_word(d));
    match (&d.policy, d.rule) {
        (Some(p), Some(r)) => s.push_str(&format!("policy: {p} rule {r}\n")),
        (Some(p), None) => s.push_str(&format!("policy: {p}\n")),
        _ => {}
    }
    s.push_str(&format!("reason: {}\n", d.reason));
    if let Some(p) = &d.request_principal {
        s.push_str(&format!("request principal: {p}\n"));
    }
    for a in &d.audit {
        s.push_str(&format!("audit: {a}\n"));
    }
    if let Some(dr) = &d.dry_run {
        s.push_str(&format!("dry-run: {dr}\n"));
    }
    s
}
