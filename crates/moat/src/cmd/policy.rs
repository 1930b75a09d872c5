//! `moat policy`: Istio security policy tools.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use moat_authz::check::{self, CheckArgs};
use moat_authz::explain;
use moat_authz::{HostPort, MethodOverrides, PathNormalization, PathParameters};
use moat_proxy::jwks_fetch::HttpJwksFetcher;

/// Arguments of `moat policy`.
#[derive(Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    command: PolicyCommand,
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Evaluate one request against Istio policies, as the gateway would.
    ///
    /// Prints the HTTP status the gateway would return (200 forwarded, 401 refused
    /// token, 403 denied), ALLOW/DENY and the policy and rule that decided. With --tcp,
    /// evaluates a TCP connection instead (Istio's TCP filter-chain semantics).
    /// Exit status: 0 forwarded, 1 rejected, 2 input error.
    Check(Box<Check>),
    /// List every policy that applies to a workload, in evaluation order.
    ///
    /// Like `istioctl x authz check`: PeerAuthentication, RequestAuthentication, then the
    /// CUSTOM, AUDIT, DENY and ALLOW AuthorizationPolicies with their rules, and what
    /// each rule becomes on a TCP connection.
    Explain(Explain),
    /// Load and validate policy files (exit 0 valid, 2 invalid).
    Validate(Validate),
}

#[derive(Args)]
struct Check {
    /// Policy file or directory (repeatable; multi-document YAML).
    #[arg(long, required = true)]
    policies: Vec<PathBuf>,
    /// Evaluate a TCP connection (no HTTP attributes; needs --port) instead of a request.
    #[arg(long, conflicts_with_all = ["url", "method", "headers", "body", "jwt"], requires = "port")]
    tcp: bool,
    /// Request URL: host, path and query (and the default port).
    #[arg(long, required_unless_present = "tcp")]
    url: Option<String>,
    /// Request method (default GET).
    #[arg(long)]
    method: Option<String>,
    /// Request header `Name: value` (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// Request body: a `_method` field of a POST form, JSON or multipart body (by its
    /// Content-Type header) is read as a method override, as the gateway reads it.
    #[arg(long)]
    body: Option<String>,
    /// TCP peer address (source.ip / ipBlocks). Absent: unknown, so positive IP
    /// matches fail and negative ones hold.
    #[arg(long)]
    source_ip: Option<String>,
    /// Original client address (remote.ip / remoteIpBlocks). Absent: taken from
    /// X-Forwarded-For with --trusted-proxies, else the source IP.
    #[arg(long)]
    remote_ip: Option<String>,
    /// Local address the request arrived on (destination.ip). Absent: unknown.
    #[arg(long)]
    destination_ip: Option<String>,
    /// URI SAN of the client certificate (spiffe://td/ns/N/sa/S). Absent: plaintext.
    #[arg(long)]
    peer_uri: Option<String>,
    /// Peer principal (td/ns/N/sa/S), the same as `--peer-uri spiffe://PRINCIPAL`.
    #[arg(long, conflicts_with = "peer_uri")]
    principal: Option<String>,
    /// Destination port (ports / destination.port). Default: the URL's.
    #[arg(long)]
    port: Option<u16>,
    /// TLS SNI (connection.sni). Absent: none.
    #[arg(long)]
    sni: Option<String>,
    /// JWT sent as `Authorization: Bearer <token>`.
    #[arg(long)]
    jwt: Option<String>,
    /// Namespace of the workload receiving the request.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Workload label `key=value` (repeatable), matched by selector.matchLabels.
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Istio root namespace (its policies apply to every workload).
    #[arg(long, default_value = "istio-system")]
    root_namespace: String,
    /// Trusted proxies in front of the gateway, for X-Forwarded-For.
    #[arg(long, default_value_t = 0)]
    trusted_proxies: u32,
    /// Path normalization: none, base, merge_slashes, decode_and_merge_slashes.
    #[arg(long, default_value = "base", value_parser = config_value::<PathNormalization>)]
    path_normalization: PathNormalization,
    /// `;` path parameters: both (the path must be allowed with and without them, as
    /// servlet containers read it) or as_received (Istio's reading).
    #[arg(long, default_value = "both", value_parser = config_value::<PathParameters>)]
    path_parameters: PathParameters,
    /// Methods named in X-HTTP-Method-Override (and the like) or `_method`: both (the
    /// request must be allowed as each) or as_received (Istio's reading).
    #[arg(long, default_value = "both", value_parser = config_value::<MethodOverrides>)]
    method_overrides: MethodOverrides,
    /// The host without its port and trailing dot: both (DENY policies read it too) or
    /// as_received (Istio's reading).
    #[arg(long, default_value = "both", value_parser = config_value::<HostPort>)]
    host_port: HostPort,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct Explain {
    /// Policy file or directory (repeatable; multi-document YAML).
    #[arg(long, required = true)]
    policies: Vec<PathBuf>,
    /// Namespace of the workload.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Workload label `key=value` (repeatable), matched by selector.matchLabels.
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Istio root namespace (its policies apply to every workload).
    #[arg(long, default_value = "istio-system")]
    root_namespace: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct Validate {
    /// Policy files or directories.
    #[arg(required = true)]
    policies: Vec<PathBuf>,
}

/// A flag value spelled as the same setting is in the config file (`authz.*`): the
/// setting's own deserializer reads it, so the two accept the same values and the error
/// lists them (clap exits with 2).
fn config_value<T: serde::de::DeserializeOwned>(value: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(value.to_ascii_lowercase()))
        .map_err(|e| e.to_string())
}

/// Runs `moat policy`.
pub fn run(args: PolicyArgs) -> ExitCode {
    match args.command {
        PolicyCommand::Check(c) => run_check(*c),
        PolicyCommand::Explain(x) => run_explain(x),
        PolicyCommand::Validate(v) => {
            let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
            match moat_authz::loader::load_paths(&v.policies, &cwd) {
                Ok(set) => {
                    outln!(
                        "ok: {} AuthorizationPolicy, {} RequestAuthentication, {} PeerAuthentication",
                        set.authz.len(),
                        set.request_authn.len(),
                        set.peer_authn.len()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("moat policy validate: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

fn run_check(c: Check) -> ExitCode {
    let args = CheckArgs {
        policies: c.policies,
        url: c.url.unwrap_or_default(),
        method: c.method.unwrap_or_else(|| "GET".into()),
        headers: c.headers,
        body: c.body,
        source_ip: c.source_ip,
        remote_ip: c.remote_ip,
        dest_ip: c.destination_ip,
        peer_uri: c.peer_uri.or(c.principal.map(|p| format!("spiffe://{p}"))),
        port: c.port,
        sni: c.sni,
        jwt: c.jwt,
        namespace: c.namespace,
        labels: c.labels,
        root_namespace: c.root_namespace,
        trusted_proxies: c.trusted_proxies,
        path_normalization: c.path_normalization,
        path_parameters: c.path_parameters,
        method_overrides: c.method_overrides,
        host_port: c.host_port,
    };
    let result = if c.tcp {
        check::build_engine(&args, HttpJwksFetcher::shared())
            .and_then(|e| check::check_connection_with(&e, &args))
    } else {
        check::run(&args, HttpJwksFetcher::shared())
    };
    match result {
        Ok(d) => {
            match (c.tcp, c.json) {
                (false, false) => out!("{}", check::to_text(&d)),
                (false, true) => outln!("{}", check::to_json(&d)),
                (true, false) => out!("{}", check::connection_to_text(&d)),
                (true, true) => outln!("{}", check::connection_to_json(&d)),
            }
            if d.allowed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("moat policy check: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_explain(x: Explain) -> ExitCode {
    let args = CheckArgs {
        policies: x.policies,
        namespace: x.namespace,
        labels: x.labels,
        root_namespace: x.root_namespace,
        ..CheckArgs::default()
    };
    let labels = match check::parse_labels(&args) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("moat policy explain: {e}");
            return ExitCode::from(2);
        }
    };
    match check::build_engine(&args, HttpJwksFetcher::shared()) {
        Ok(engine) => {
            let e = explain::explain(&engine, &args.namespace, &labels);
            if x.json {
                outln!("{}", explain::to_json(&e));
            } else {
                out!("{}", explain::to_text(&e));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("moat policy explain: {e}");
            ExitCode::from(2)
        }
    }
}
