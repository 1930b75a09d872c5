//! `moat policy explain`: every policy that applies to a workload, in evaluation order,
//! modelled on `istioctl x authz check`.
//!
//! Order (Istio's filter chain): PeerAuthentication (the connection), RequestAuthentication
//! (the JWT filter), then the authorization stages CUSTOM, AUDIT, DENY, ALLOW
//! (`builder.go`: CUSTOM, then LOG, DENY, ALLOW RBAC filters). CUSTOM policies
//! name their provider. Within a stage, policies are in
//! Envoy's order (namespace, then name) and rules by index; the first match decides.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::engine::{compose_peer, AuthzEngine};
use crate::ir::{Clause, PathPat, Pred, ReqPrinPat, Rule, StrPat, TcpRule};
use crate::loader::{Action, MtlsMode};

/// Everything that applies to one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// Workload namespace.
    pub namespace: String,
    /// Workload labels.
    pub labels: BTreeMap<String, String>,
    /// Istio root namespace used for scoping.
    pub root_namespace: String,
    /// The effective PeerAuthentication.
    pub peer_authentication: PeerAuthnView,
    /// RequestAuthentications that apply (their JWT rules are merged).
    pub request_authentication: Vec<RequestAuthnView>,
    /// Authorization stages in evaluation order: CUSTOM, AUDIT, DENY, ALLOW.
    pub authorization: Vec<Stage>,
}

/// The resolved PeerAuthentication of the workload.
#[derive(Debug, Clone, Serialize)]
pub struct PeerAuthnView {
    /// Workload-wide mode (PERMISSIVE when nothing applies).
    pub mode: MtlsMode,
    /// The policy that set it, if any.
    pub policy: Option<String>,
    /// `portLevelMtls` overrides.
    pub ports: Vec<PortMode>,
}

/// One `portLevelMtls` override.
#[derive(Debug, Clone, Serialize)]
pub struct PortMode {
    /// Listener port.
    pub port: u16,
    /// Mode on that port.
    pub mode: MtlsMode,
    /// The policy that set it.
    pub policy: String,
}

/// One RequestAuthentication that applies.
#[derive(Debug, Clone, Serialize)]
pub struct RequestAuthnView {
    /// `namespace/name`.
    pub policy: String,
    /// Issuers of its JWT rules.
    pub issuers: Vec<String>,
}

/// One authorization stage.
#[derive(Debug, Clone, Serialize)]
pub struct Stage {
    /// `CUSTOM`, `AUDIT`, `DENY` or `ALLOW`.
    pub action: &'static str,
    /// What the stage does.
    pub effect: &'static str,
    /// Policies of the stage, in evaluation order.
    pub policies: Vec<PolicyView>,
}

/// One AuthorizationPolicy.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyView {
    /// `namespace/name`.
    pub policy: String,
    /// `istio.io/dry-run`: evaluated and reported, never enforced.
    pub dry_run: bool,
    /// Source file and line of the document.
    pub source: String,
    /// Rules in order (empty: the policy matches nothing).
    pub rules: Vec<RuleView>,
}

/// One rule.
#[derive(Debug, Clone, Serialize)]
pub struct RuleView {
    /// Index in the policy.
    pub index: usize,
    /// The rule as text (`from: ...; to: ...; when: ...`).
    pub conditions: String,
    /// What the rule becomes on a TCP connection.
    pub tcp: String,
}

/// Renders a string value back to Istio's form.
fn str_pat(p: &StrPat) -> String {
    match p {
        StrPat::Any => "*".into(),
        StrPat::Exact(v) => v.clone(),
        StrPat::Prefix(v) => format!("{v}*"),
        StrPat::Suffix(v) => format!("*{v}"),
    }
}

fn req_prin(p: &ReqPrinPat) -> String {
    match p {
        ReqPrinPat::Any => "*".into(),
        ReqPrinPat::SubSuffix(x) => format!("*{x}"),
        ReqPrinPat::IssSuffixSubExact(x, s) => format!("*{x}/{s}"),
        ReqPrinPat::IssExactSubAny(i) => format!("{i}/*"),
        ReqPrinPat::IssExactSubPrefix(i, p) => format!("{i}/{p}*"),
        ReqPrinPat::IssPrefix(p) => format!("{p}*"),
        ReqPrinPat::Exact(i, s) if s.is_empty() => i.clone(),
        ReqPrinPat::Exact(i, s) => format!("{i}/{s}"),
    }
}

/// The values of a predicate, as written in the policy.
fn values(p: &Pred) -> Vec<String> {
    let strs = |v: &[StrPat]| v.iter().map(str_pat).collect();
    match p {
        Pred::Principal(v)
        | Pred::Host(v)
        | Pred::Method(v)
        | Pred::Header(_, v)
        | Pred::Audience(v)
        | Pred::Presenter(v)
        | Pred::Claim(_, v)
        | Pred::Sni(v) => strs(v),
        Pred::RequestPrincipal(v) => v.iter().map(req_prin).collect(),
        Pred::Namespace(v) => v.iter().map(|n| n.raw.clone()).collect(),
        Pred::ServiceAccount(v) => v.iter().map(|s| s.raw.clone()).collect(),
        Pred::SourceIp(v) | Pred::RemoteIp(v) | Pred::DestIp(v) => {
            v.iter().map(|n| n.to_string()).collect()
        }
        Pred::Port(v) => v.iter().map(|p| p.to_string()).collect(),
        Pred::Path(v) => v
            .iter()
            .map(|p| match p {
                PathPat::Str(s) => str_pat(s),
                PathPat::Template(t) => t.raw.clone(),
            })
            .collect(),
    }
}

/// `from.source` / `to.operation` field name (`notX` when negated).
fn field(c: &Clause) -> String {
    let name = c.pred.field_name();
    if !c.negated {
        return name.to_string();
    }
    let mut chars = name.chars();
    match chars.next() {
        Some(first) => format!("not{}{}", first.to_ascii_uppercase(), chars.as_str()),
        None => String::new(),
    }
}

/// `when` key of a predicate.
fn when_key(p: &Pred) -> String {
    match p {
        Pred::Principal(_) => "source.principal".into(),
        Pred::RequestPrincipal(_) => "request.auth.principal".into(),
        Pred::Namespace(_) => "source.namespace".into(),
        Pred::ServiceAccount(_) => "source.serviceAccount".into(),
        Pred::SourceIp(_) => "source.ip".into(),
        Pred::RemoteIp(_) => "remote.ip".into(),
        Pred::DestIp(_) => "destination.ip".into(),
        Pred::Port(_) => "destination.port".into(),
        Pred::Header(n, _) => format!("request.headers[{n}]"),
        Pred::Audience(_) => "request.auth.audiences".into(),
        Pred::Presenter(_) => "request.auth.presenter".into(),
        Pred::Claim(path, _) => format!("request.auth.claims[{}]", path.join("][")),
        Pred::Sni(_) => "connection.sni".into(),
        Pred::Host(_) => "hosts".into(),
        Pred::Method(_) => "methods".into(),
        Pred::Path(_) => "paths".into(),
    }
}

fn entries(list: &[Vec<Clause>]) -> String {
    list.iter()
        .map(|e| {
            let fields: Vec<String> = e
                .iter()
                .map(|c| format!("{}={}", field(c), values(&c.pred).join(",")))
                .collect();
            format!("{{{}}}", fields.join(" "))
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

/// A rule as one line: `from: {...} or {...}; to: {...}; when: k in [..] and k notIn [..]`.
pub fn rule_text(r: &Rule) -> String {
    let mut parts = Vec::new();
    if !r.from.is_empty() {
        parts.push(format!("from: {}", entries(&r.from)));
    }
    if !r.to.is_empty() {
        parts.push(format!("to: {}", entries(&r.to)));
    }
    if !r.when.is_empty() {
        let conds: Vec<String> = r
            .when
            .iter()
            .map(|c| {
                let op = if c.negated { "notIn" } else { "in" };
                format!("{} {op} [{}]", when_key(&c.pred), values(&c.pred).join(","))
            })
            .collect();
        parts.push(format!("when: {}", conds.join(" and ")));
    }
    if parts.is_empty() {
        "(empty rule: matches everything)".into()
    } else {
        parts.join("; ")
    }
}

/// What a rule becomes on a TCP connection, as text.
fn tcp_text(r: &Rule, action: Action) -> String {
    let http_fields = || {
        let mut names: Vec<String> = r
            .from
            .iter()
            .chain(&r.to)
            .flatten()
            .filter(|c| c.pred.is_http_only())
            .map(field)
            .chain(
                r.when
                    .iter()
                    .filter(|c| c.pred.is_http_only())
                    .map(|c| when_key(&c.pred)),
            )
            .collect();
        let mut unique: Vec<String> = Vec::with_capacity(names.len());
        for n in names.drain(..) {
            if !unique.contains(&n) {
                unique.push(n);
            }
        }
        unique.join(",")
    };
    match r.for_tcp(action == Action::Allow) {
        TcpRule::AsWritten(_) => "as written".into(),
        TcpRule::Skipped => format!("never matches (HTTP-only: {})", http_fields()),
        TcpRule::Broadened(mut b) => {
            // A side with an entry left empty matches anything: show it as absent.
            if b.from.iter().any(Vec::is_empty) {
                b.from.clear();
            }
            if b.to.iter().any(Vec::is_empty) {
                b.to.clear();
            }
            if b.from.is_empty() && b.to.is_empty() && b.when.is_empty() {
                format!("drops {}: matches every connection", http_fields())
            } else {
                format!("drops {}: {}", http_fields(), rule_text(&b))
            }
        }
    }
}

/// Builds the explanation for a workload.
pub fn explain(
    engine: &AuthzEngine,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Explanation {
    let set = engine.policies();
    let root = engine.config().root_namespace.clone();
    let peer = compose_peer(&set.peer_authn, &root, namespace, labels);
    let mut ras: Vec<RequestAuthnView> = set
        .request_authn
        .iter()
        .filter(|r| r.meta.applies(&root, namespace, labels))
        .map(|r| RequestAuthnView {
            policy: r.meta.id(),
            issuers: r.rules.iter().map(|j| j.issuer.clone()).collect(),
        })
        .collect();
    ras.sort_by(|a, b| a.policy.cmp(&b.policy));
    let applicable = engine.applicable_policies(namespace, labels);
    let stage = |action: Option<Action>, name: &'static str, effect: &'static str| Stage {
        action: name,
        effect,
        policies: applicable
            .iter()
            .map(|&i| &set.authz[i])
            .filter(|p| Some(p.action) == action)
            .map(|p| PolicyView {
                policy: p.meta.id(),
                dry_run: p.meta.dry_run,
                source: format!("{}:{}", p.meta.file.display(), p.meta.line),
                rules: p
                    .rules
                    .iter()
                    .enumerate()
                    .map(|(index, r)| RuleView {
                        index,
                        conditions: rule_text(r),
                        tcp: tcp_text(r, p.action),
                    })
                    .collect(),
            })
            .collect(),
    };
    Explanation {
        namespace: namespace.to_string(),
        labels: labels.clone(),
        root_namespace: root.clone(),
        peer_authentication: PeerAuthnView {
            mode: peer.mode,
            policy: peer.policy.clone(),
            ports: peer
                .ports
                .iter()
                .map(|(port, mode, policy)| PortMode {
                    port: *port,
                    mode: *mode,
                    policy: policy.clone(),
                })
                .collect(),
        },
        request_authentication: ras,
        authorization: vec![
            stage(
                Some(Action::Custom),
                "CUSTOM",
                "a matching rule sends the request to the policy's provider first",
            ),
            stage(
                Some(Action::Audit),
                "AUDIT",
                "a matching rule is reported; the decision is unchanged",
            ),
            stage(
                Some(Action::Deny),
                "DENY",
                "a matching rule denies (403 / connection closed)",
            ),
            stage(
                Some(Action::Allow),
                "ALLOW",
                "with ALLOW policies, only a matching rule allows",
            ),
        ],
    }
}

fn mode_word(m: MtlsMode) -> &'static str {
    match m {
        MtlsMode::Unset => "UNSET",
        MtlsMode::Disable => "DISABLE",
        MtlsMode::Permissive => "PERMISSIVE",
        MtlsMode::Strict => "STRICT",
    }
}

/// The human output: the workload, authentication, then one table of every
/// authorization rule in evaluation order.
pub fn to_text(x: &Explanation) -> String {
    let mut s = String::new();
    let labels: Vec<String> = x.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(
        s,
        "workload: namespace {}, labels {{{}}} (root namespace {})",
        x.namespace,
        labels.join(","),
        x.root_namespace
    );
    let pa = &x.peer_authentication;
    let _ = write!(
        s,
        "1. PeerAuthentication: {} ({})",
        mode_word(pa.mode),
        pa.policy.as_deref().unwrap_or("default: no policy applies")
    );
    for p in &pa.ports {
        let _ = write!(s, "; port {}: {} ({})", p.port, mode_word(p.mode), p.policy);
    }
    s.push('\n');
    if x.request_authentication.is_empty() {
        s.push_str("2. RequestAuthentication: none (tokens are not verified)\n");
    } else {
        let ras: Vec<String> = x
            .request_authentication
            .iter()
            .map(|r| format!("{} (issuers {})", r.policy, r.issuers.join(", ")))
            .collect();
        let _ = writeln!(s, "2. RequestAuthentication: {}", ras.join("; "));
    }
    s.push_str("3. AuthorizationPolicy, in evaluation order (the first matching rule decides):\n");
    let header = ["ACTION", "POLICY", "RULE", "CONDITIONS", "ON TCP"];
    let mut rows: Vec<[String; 5]> = Vec::new();
    for st in &x.authorization {
        if st.policies.is_empty() {
            let what = "(none)";
            rows.push([
                st.action.into(),
                "-".into(),
                "-".into(),
                what.into(),
                "-".into(),
            ]);
            continue;
        }
        for p in &st.policies {
            let name = if p.dry_run {
                format!("{} (dry-run)", p.policy)
            } else {
                p.policy.clone()
            };
            if p.rules.is_empty() {
                rows.push([
                    st.action.into(),
                    name,
                    "-".into(),
                    "(no rules: matches nothing)".into(),
                    "as written".into(),
                ]);
                continue;
            }
            for r in &p.rules {
                rows.push([
                    st.action.into(),
                    name.clone(),
                    r.index.to_string(),
                    r.conditions.clone(),
                    r.tcp.clone(),
                ]);
            }
        }
    }
    let mut widths = header.map(|h| h.chars().count());
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &[String]| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        s.push_str(l.trim_end());
        s.push('\n');
    };
    line(&header.map(String::from));
    for row in &rows {
        line(row);
    }
    s
}

/// The `--json` output.
pub fn to_json(x: &Explanation) -> serde_json::Value {
    serde_json::to_value(x).unwrap_or(serde_json::Value::Null)
}
