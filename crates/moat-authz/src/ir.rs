//! The validated form of AuthorizationPolicy rules and the plain linear evaluator.
//!
//! Every `from.source` field, `to.operation` field and `when` condition becomes a
//! [`Clause`]: a predicate over one request attribute ([`Pred`]) that is ORed over its
//! values, possibly negated (`notX` fields, `notValues`). A source or operation is the
//! AND of its clauses; a rule is `(any from) AND (any to) AND (all when)`.
//!
//! The linear evaluator here is deliberately naive (it walks every value of every rule)
//! and serves as the test oracle for the compiled index in [`crate::compiled`].

use std::net::IpAddr;

use ipnet::IpNet;
use regex::Regex;

use crate::request::Attrs;

/// An Istio string value: `abc` exact, `abc*` prefix, `*abc` suffix, `*` presence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StrPat {
    /// `*`: the attribute is present (non-empty; for headers: present at all).
    Any,
    /// Exact value.
    Exact(String),
    /// `abc*`.
    Prefix(String),
    /// `*abc`.
    Suffix(String),
}

impl StrPat {
    /// Parses a value as Istio's `matcher/string.go` does: `*` first, then a leading
    /// `*` (suffix), then a trailing `*` (prefix), else exact (an infix `*` is literal).
    pub fn parse(v: &str) -> StrPat {
        if v == "*" {
            StrPat::Any
        } else if let Some(s) = v.strip_prefix('*') {
            StrPat::Suffix(s.to_string())
        } else if let Some(p) = v.strip_suffix('*') {
            StrPat::Prefix(p.to_string())
        } else {
            StrPat::Exact(v.to_string())
        }
    }

    /// Same as [`StrPat::parse`] with the value lowercased (hosts ignore case).
    pub fn parse_lower(v: &str) -> StrPat {
        StrPat::parse(&v.to_ascii_lowercase())
    }

    /// Whether a non-absent value matches (`Any` needs a non-empty value).
    pub fn matches(&self, s: &str) -> bool {
        match self {
            StrPat::Any => !s.is_empty(),
            StrPat::Exact(e) => s == e,
            StrPat::Prefix(p) => s.starts_with(p.as_str()),
            StrPat::Suffix(x) => s.ends_with(x.as_str()),
        }
    }
}

/// A `requestPrincipals` / `request.auth.principal` value, split at its last `/` into
/// issuer and subject as Istio's generator does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReqPrinPat {
    /// `*`: issuer and subject non-empty.
    Any,
    /// `*x` (no `/`): subject ends with `x`.
    SubSuffix(String),
    /// `*x/s`: issuer ends with `x`, subject is `s`.
    IssSuffixSubExact(String, String),
    /// `i/*`: issuer is `i`, subject non-empty.
    IssExactSubAny(String),
    /// `i/p*`: issuer is `i`, subject starts with `p`.
    IssExactSubPrefix(String, String),
    /// `p*` (no `/`): issuer starts with `p`.
    IssPrefix(String),
    /// `i/s`: both exact (a value without `/` never matches).
    Exact(String, String),
}

impl ReqPrinPat {
    /// Parses a request principal value.
    pub fn parse(v: &str) -> ReqPrinPat {
        if v == "*" {
            return ReqPrinPat::Any;
        }
        if let Some(rest) = v.strip_prefix('*') {
            return match rest.rfind('/') {
                Some(i) => ReqPrinPat::IssSuffixSubExact(rest[..i].into(), rest[i + 1..].into()),
                None => ReqPrinPat::SubSuffix(rest.into()),
            };
        }
        if let Some(rest) = v.strip_suffix('*') {
            return match rest.rfind('/') {
                Some(i) if i + 1 == rest.len() => ReqPrinPat::IssExactSubAny(rest[..i].into()),
                Some(i) => ReqPrinPat::IssExactSubPrefix(rest[..i].into(), rest[i + 1..].into()),
                None => ReqPrinPat::IssPrefix(rest.into()),
            };
        }
        match v.rfind('/') {
            Some(i) => ReqPrinPat::Exact(v[..i].into(), v[i + 1..].into()),
            None => ReqPrinPat::Exact(v.into(), String::new()),
        }
    }

    /// Whether the verified token's `iss` and `sub` match.
    pub fn matches(&self, iss: &str, sub: &str) -> bool {
        match self {
            ReqPrinPat::Any => !iss.is_empty() && !sub.is_empty(),
            ReqPrinPat::SubSuffix(x) => !sub.is_empty() && sub.ends_with(x.as_str()),
            ReqPrinPat::IssSuffixSubExact(x, s) => {
                !iss.is_empty() && iss.ends_with(x.as_str()) && sub == s
            }
            ReqPrinPat::IssExactSubAny(i) => iss == i && !sub.is_empty(),
            ReqPrinPat::IssExactSubPrefix(i, p) => iss == i && sub.starts_with(p.as_str()),
            ReqPrinPat::IssPrefix(p) => !iss.is_empty() && iss.starts_with(p.as_str()),
            ReqPrinPat::Exact(i, s) => !s.is_empty() && iss == i && sub == s,
        }
    }
}

/// A `namespaces` / `source.namespace` value: Istio matches the regex
/// `.*/ns/<v>/.*` (with `*` in `v` turned into `.*`) against the peer's URI SAN.
#[derive(Debug, Clone)]
pub struct NsPat {
    /// The value as written.
    pub raw: String,
    /// Anchored regex over the full URI SAN.
    pub re: Regex,
}

impl NsPat {
    /// Compiles a namespace value.
    pub fn new(v: &str) -> Result<NsPat, String> {
        let body: Vec<String> = v.split('*').map(regex::escape).collect();
        let re = Regex::new(&format!("^(?s:.*/ns/{}/.*)$", body.join(".*")))
            .map_err(|e| format!("invalid namespace `{v}`: {e}"))?;
        Ok(NsPat { raw: v.into(), re })
    }
}

impl PartialEq for NsPat {
    fn eq(&self, o: &Self) -> bool {
        self.raw == o.raw
    }
}

/// A `serviceAccounts` value (`ns/sa` or `sa` in the policy's namespace): Istio matches
/// `spiffe://.+/ns/<ns>/(.+/|)sa/<sa>(/.+)?` against the URI SAN.
#[derive(Debug, Clone)]
pub struct SaPat {
    /// The value as written.
    pub raw: String,
    /// Anchored regex over the full URI SAN.
    pub re: Regex,
}

impl SaPat {
    /// Compiles a service account value; `policy_ns` applies when it has no `/`.
    pub fn new(v: &str, policy_ns: &str) -> Result<SaPat, String> {
        let (ns, sa) = match v.split_once('/') {
            Some((n, s)) => (n, s),
            None => (policy_ns, v),
        };
        if ns.is_empty() || sa.is_empty() || sa.contains('/') || v.contains('*') {
            return Err(format!(
                "invalid service account `{v}`: expected `namespace/name` or `name`, no wildcards"
            ));
        }
        let re = Regex::new(&format!(
            "^(?s:spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?)$",
            regex::escape(ns),
            regex::escape(sa)
        ))
        .map_err(|e| format!("invalid service account `{v}`: {e}"))?;
        Ok(SaPat { raw: v.into(), re })
    }
}

impl PartialEq for SaPat {
    fn eq(&self, o: &Self) -> bool {
        self.raw == o.raw
    }
}

/// One segment of a path template (the part of the template before `{**}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// Literal segment text (empty only for a trailing `/`).
    Lit(String),
    /// `{*}`: exactly one non-empty segment.
    One,
}

/// Istio's `{*}` operator.
pub const MATCH_ONE: &str = "{*}";
/// Istio's `{**}` operator.
pub const MATCH_ANY: &str = "{**}";

/// Whether a byte may appear in a literal template segment or in the text matched by
/// `{*}`: RFC 3986 `pchar` without `*` and `=` (Envoy's `kLiteral` in
/// `uri_template_internal.cc`: unreserved, `%`, `!$&'()+,;`, `:@`).
#[inline]
pub fn is_template_char(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'-' | b'.'
                | b'_'
                | b'~'
                | b'%'
                | b'!'
                | b'$'
                | b'&'
                | b'\''
                | b'('
                | b')'
                | b'+'
                | b','
                | b';'
                | b':'
                | b'@'
        )
}

/// Istio's `validLiteral` (`pkg/config/security/security.go`): one or more of
/// `[a-zA-Z0-9-._~%!$&'()+,;:@=]`. Envoy's set is the same without `=`.
fn is_istio_literal(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b == b'=' || is_template_char(b))
}

/// A `paths` / `notPaths` value containing `{*}` or `{**}`: an Envoy `uri_template`
/// (Istio replaces `{*}` by `*` and `{**}` by `**`), matched as Envoy's generated regex
/// `"/" + join(segments, "/")`, anchored at both ends, where `*` is
/// `[pchar-without-*=]+` and `**` is `[pchar-without-*= or /]*`.
///
/// Compiled once: matching walks the path without allocating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    /// The template as written.
    pub raw: String,
    /// Segments before `{**}` (all of them when there is no `{**}`); each matches one
    /// path segment.
    pub head: Vec<Seg>,
    /// Whether the template has `{**}`.
    pub any: bool,
    /// With `{**}`: the literal segments after it, each preceded by `/`
    /// (`/{**}/a/b` -> `/a/b`; a trailing `/` -> `/`); empty when `{**}` ends the template.
    pub tail: String,
}

impl PathTemplate {
    /// Parses a path value that contains `{*}` or `{**}`; `key` (`Paths` or `NotPaths`)
    /// names the field in errors.
    ///
    /// Validation is Istio's `CheckValidPathTemplate`, with its error text, followed by
    /// the rules of Envoy's `uri_template` parser that Istio does not check (a template
    /// Istio accepts but Envoy refuses makes the proxy reject its whole configuration, so
    /// moat refuses it at load).
    pub fn parse(raw: &str, key: &str) -> Result<PathTemplate, String> {
        check_istio_path(raw, key)?;
        let refuse = |why: &str| {
            Err(format!(
                "invalid path template {raw}, found in {key}: Istio accepts it but Envoy's \
                 uri_template matcher refuses it ({why}), so the proxy would reject the configuration"
            ))
        };
        let Some(body) = raw.strip_prefix('/') else {
            return refuse("it must start with `/`");
        };
        let parts: Vec<&str> = body.split('/').collect();
        let mut head = Vec::new();
        let mut any = false;
        let mut tail = String::new();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            if part.is_empty() && !(last && i > 0) {
                return refuse("an empty segment is only allowed as one trailing `/`");
            }
            if part.contains('=') {
                return refuse("`=` is not allowed in a literal segment");
            }
            match *part {
                MATCH_ANY => any = true,
                MATCH_ONE => head.push(Seg::One),
                lit if any => {
                    tail.push('/');
                    tail.push_str(lit);
                }
                lit => head.push(Seg::Lit(lit.to_string())),
            }
        }
        Ok(PathTemplate {
            raw: raw.to_string(),
            head,
            any,
            tail,
        })
    }

    /// Whether the (normalized, query-less) path matches.
    pub fn matches(&self, path: &str) -> bool {
        let Some(mut rest) = path.strip_prefix('/') else {
            return false;
        };
        let n = self.head.len();
        for (i, seg) in self.head.iter().enumerate() {
            // Every head segment is followed by `/`, except the last one of a template
            // without `{**}`, which must take the rest of the path.
            let (part, after) = if i + 1 == n && !self.any {
                (rest, "")
            } else {
                match rest.find('/') {
                    Some(j) => (&rest[..j], &rest[j + 1..]),
                    None => return false,
                }
            };
            let ok = match seg {
                Seg::Lit(l) => part == l,
                Seg::One => !part.is_empty() && part.bytes().all(is_template_char),
            };
            if !ok {
                return false;
            }
            rest = after;
        }
        if !self.any {
            return true;
        }
        match rest.strip_suffix(self.tail.as_str()) {
            Some(middle) => middle.bytes().all(|b| b == b'/' || is_template_char(b)),
            None => false,
        }
    }

    /// The literal text every matching path starts with (`/a/b/{*}` -> `/a/b/`).
    pub fn literal_prefix(&self) -> String {
        let mut s = String::from("/");
        let n = self.head.len();
        for (i, seg) in self.head.iter().enumerate() {
            match seg {
                Seg::Lit(l) if i + 1 < n || self.any => {
                    s.push_str(l);
                    s.push('/');
                }
                _ => break,
            }
        }
        s
    }
}

/// Istio's `CheckValidPathTemplate` for one `paths`/`notPaths` value, with its messages
/// (the path is printed with its leading and trailing `/` removed, as Istio does).
fn check_istio_path(path: &str, key: &str) -> Result<(), String> {
    let has_template = path.contains(MATCH_ONE) || path.contains(MATCH_ANY);
    let trimmed = path.trim_matches('/');
    let mut found_any = false;
    for glob in trimmed.split('/') {
        let op = glob == MATCH_ONE || glob == MATCH_ANY;
        if op && found_any {
            return Err(format!(
                "invalid or unsupported path {trimmed}, found in {key}. {{**}} is not the last operator"
            ));
        }
        if op {
            found_any = glob == MATCH_ANY;
            continue;
        }
        if glob.contains(['{', '}']) {
            return Err(format!(
                "invalid or unsupported path {trimmed}, found in {key}. \
                 Contains '{{' or '}}' beyond a supported path template"
            ));
        }
        if has_template && !is_istio_literal(glob) {
            return Err(format!(
                "invalid or unsupported path {trimmed}, found in {key}. \
                 Contains segment {glob} with invalid string literal"
            ));
        }
    }
    Ok(())
}

/// A `paths` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathPat {
    /// A plain string value.
    Str(StrPat),
    /// A path template using `{*}` / `{**}`.
    Template(PathTemplate),
}

impl PathPat {
    /// Parses and validates a `paths` value (`key` = `Paths`; see [`PathPat::parse_for`]).
    pub fn parse(v: &str) -> Result<PathPat, String> {
        Self::parse_for(v, "Paths")
    }

    /// Parses and validates a path value of field `key` (`Paths` or `NotPaths`, the
    /// names Istio's errors use): a value with `{*}`/`{**}` is a [`PathTemplate`], any
    /// other `{` or `}` is refused, everything else is an Istio string value.
    pub fn parse_for(v: &str, key: &str) -> Result<PathPat, String> {
        if v.contains(MATCH_ONE) || v.contains(MATCH_ANY) {
            return PathTemplate::parse(v, key).map(PathPat::Template);
        }
        check_istio_path(v, key)?;
        Ok(PathPat::Str(StrPat::parse(v)))
    }

    /// Whether the (normalized, query-less) path matches.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            PathPat::Str(p) => p.matches(path),
            PathPat::Template(t) => t.matches(path),
        }
    }
}

/// A predicate over one request attribute, true when ANY of its values matches.
/// An absent attribute never matches (so a negated clause on it is true).
#[derive(Debug, Clone, PartialEq)]
pub enum Pred {
    /// `principals` / `source.principal` (peer URI SAN without `spiffe://`).
    Principal(Vec<StrPat>),
    /// `requestPrincipals` / `request.auth.principal`.
    RequestPrincipal(Vec<ReqPrinPat>),
    /// `namespaces` / `source.namespace`.
    Namespace(Vec<NsPat>),
    /// `serviceAccounts` / `source.serviceAccount`.
    ServiceAccount(Vec<SaPat>),
    /// `ipBlocks` / `source.ip` (the TCP peer).
    SourceIp(Vec<IpNet>),
    /// `remoteIpBlocks` / `remote.ip` (original client from X-Forwarded-For).
    RemoteIp(Vec<IpNet>),
    /// `destination.ip`.
    DestIp(Vec<IpNet>),
    /// `hosts` (lowercased, compared case-insensitively).
    Host(Vec<StrPat>),
    /// `ports` / `destination.port`.
    Port(Vec<u16>),
    /// `methods`.
    Method(Vec<StrPat>),
    /// `paths`.
    Path(Vec<PathPat>),
    /// `request.headers[name]` (name lowercased).
    Header(String, Vec<StrPat>),
    /// `request.auth.audiences`.
    Audience(Vec<StrPat>),
    /// `request.auth.presenter`.
    Presenter(Vec<StrPat>),
    /// `request.auth.claims[a][b]...`.
    Claim(Vec<String>, Vec<StrPat>),
    /// `connection.sni`.
    Sni(Vec<StrPat>),
}

/// A predicate, possibly negated (`notX`, `notValues`).
#[derive(Debug, Clone, PartialEq)]
pub struct Clause {
    /// The predicate.
    pub pred: Pred,
    /// True for `notX` / `notValues`: the clause holds when no value matches.
    pub negated: bool,
}

/// One AuthorizationPolicy rule.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rule {
    /// `from`: each source is an AND of clauses; the list is ORed (empty = any).
    pub from: Vec<Vec<Clause>>,
    /// `to`: each operation is an AND of clauses; the list is ORed (empty = any).
    pub to: Vec<Vec<Clause>>,
    /// `when`: all must hold.
    pub when: Vec<Clause>,
}

fn any_str(pats: &[StrPat], v: Option<&str>) -> bool {
    match v {
        Some(v) => pats.iter().any(|p| p.matches(v)),
        None => false,
    }
}

fn any_ip(nets: &[IpNet], ip: Option<IpAddr>) -> bool {
    match ip {
        Some(ip) => nets.iter().any(|n| n.contains(&ip)),
        None => false,
    }
}

impl Pred {
    /// Naive evaluation (the oracle).
    pub fn eval(&self, a: &Attrs<'_>) -> bool {
        match self {
            // `*` matches any authenticated peer; others are matched against `spiffe://<v>`.
            Pred::Principal(pats) => a.peer.is_some_and(|peer| {
                pats.iter().any(|p| match p {
                    StrPat::Any => true,
                    _ => peer
                        .uris
                        .iter()
                        .any(|u| u.strip_prefix("spiffe://").is_some_and(|r| p.matches(r))),
                })
            }),
            Pred::RequestPrincipal(pats) => match a.jwt {
                Some(j) => pats.iter().any(|p| p.matches(&j.iss, &j.sub)),
                None => false,
            },
            Pred::Namespace(pats) => a
                .peer_uris()
                .any(|uri| pats.iter().any(|p| p.re.is_match(uri))),
            Pred::ServiceAccount(pats) => a
                .peer_uris()
                .any(|uri| pats.iter().any(|p| p.re.is_match(uri))),
            Pred::SourceIp(n) => any_ip(n, a.source_ip),
            Pred::RemoteIp(n) => any_ip(n, a.remote_ip),
            Pred::DestIp(n) => any_ip(n, a.dest_ip),
            Pred::Host(pats) => {
                let h = a.host.to_ascii_lowercase();
                pats.iter().any(|p| match p {
                    StrPat::Any => true,
                    p => p.matches(&h),
                })
            }
            Pred::Port(ports) => a.port.is_some_and(|p| ports.contains(&p)),
            Pred::Method(pats) => any_str(pats, Some(a.method)),
            Pred::Path(pats) => pats.iter().any(|p| p.matches(a.path)),
            Pred::Header(name, pats) => match a.header(name) {
                Some(v) => pats.iter().any(|p| match p {
                    StrPat::Any => true,
                    p => p.matches(&v),
                }),
                None => false,
            },
            Pred::Audience(pats) => match a.jwt {
                Some(j) => j.audiences.iter().any(|aud| any_str(pats, Some(aud))),
                None => false,
            },
            Pred::Presenter(pats) => any_str(pats, a.jwt.and_then(|j| j.presenter.as_deref())),
            Pred::Claim(path, pats) => match a.jwt {
                Some(j) => claim_values(&j.claims_for_match, path)
                    .iter()
                    .any(|v| any_str(pats, Some(v))),
                None => false,
            },
            Pred::Sni(pats) => any_str(pats, a.sni),
        }
    }
}

impl Pred {
    /// Whether the attribute exists only in HTTP: `hosts`, `methods`, `paths`,
    /// `requestPrincipals`, `request.headers[..]` and `request.auth.*` (Istio's generators
    /// return "is HTTP only" for these when building a TCP filter chain).
    pub fn is_http_only(&self) -> bool {
        matches!(
            self,
            Pred::RequestPrincipal(_)
                | Pred::Host(_)
                | Pred::Method(_)
                | Pred::Path(_)
                | Pred::Header(..)
                | Pred::Audience(_)
                | Pred::Presenter(_)
                | Pred::Claim(..)
        )
    }

    /// The policy field or `when` key of the predicate, for explanations.
    pub fn field_name(&self) -> &'static str {
        match self {
            Pred::Principal(_) => "principals",
            Pred::RequestPrincipal(_) => "requestPrincipals",
            Pred::Namespace(_) => "namespaces",
            Pred::ServiceAccount(_) => "serviceAccounts",
            Pred::SourceIp(_) => "ipBlocks",
            Pred::RemoteIp(_) => "remoteIpBlocks",
            Pred::DestIp(_) => "destination.ip",
            Pred::Host(_) => "hosts",
            Pred::Port(_) => "ports",
            Pred::Method(_) => "methods",
            Pred::Path(_) => "paths",
            Pred::Header(..) => "request.headers",
            Pred::Audience(_) => "request.auth.audiences",
            Pred::Presenter(_) => "request.auth.presenter",
            Pred::Claim(..) => "request.auth.claims",
            Pred::Sni(_) => "connection.sni",
        }
    }
}

/// What a rule becomes on a TCP (L4) connection, Istio's generator behaviour
/// (`pilot/pkg/security/authz/model/model.go`, `rule.checkError`, and
/// `builder.go`: "skipped rule ... on TCP filter chain").
#[derive(Debug, Clone, PartialEq)]
pub enum TcpRule {
    /// The rule uses no HTTP-only attribute: evaluated as written.
    AsWritten(Rule),
    /// DENY/AUDIT rule with HTTP-only conditions: those conditions (values and
    /// notValues alike) are dropped and the rest kept, so the rule is broader; a
    /// source, operation or the rule left with no condition matches every connection.
    Broadened(Rule),
    /// ALLOW rule with an HTTP-only condition anywhere: the rule is skipped (never
    /// matches a connection); the policy still counts as an ALLOW policy of the workload.
    Skipped,
}

/// Which of the attributes access control reads a request more than one way (the
/// method, the path, the host) a rule looks at: a second reading that changes only
/// attributes no rule looks at cannot change a decision, so it is skipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reads {
    /// `methods`, or a condition on `request.headers[:method]`.
    pub method: bool,
    /// `paths` (a condition on `request.headers[:path]` reads the path as sent).
    pub path: bool,
    /// `hosts`, or a condition on `request.headers[:authority]` or `[host]`.
    pub host: bool,
    /// A negated one of those: `notHosts`, or `notValues` on `:authority` or `host`.
    pub not_host: bool,
}

impl std::ops::BitOr for Reads {
    type Output = Reads;
    fn bitor(self, other: Reads) -> Reads {
        Reads {
            method: self.method || other.method,
            path: self.path || other.path,
            host: self.host || other.host,
            not_host: self.not_host || other.not_host,
        }
    }
}

impl Rule {
    /// The attributes with more than one reading that the rule looks at.
    pub fn reads(&self) -> Reads {
        let mut reads = Reads::default();
        for clause in self.from.iter().chain(&self.to).flatten().chain(&self.when) {
            match &clause.pred {
                Pred::Method(_) => reads.method = true,
                Pred::Path(_) => reads.path = true,
                Pred::Header(name, _) if name == ":method" => reads.method = true,
                _ if clause.reads_host() => {
                    reads.host = true;
                    reads.not_host |= clause.negated;
                }
                _ => {}
            }
        }
        reads
    }

    /// The names of the request header fields the rule's conditions read
    /// (`request.headers[name]`, pseudo-header fields left out).
    pub fn header_names(&self) -> impl Iterator<Item = &str> {
        self.from
            .iter()
            .chain(&self.to)
            .flatten()
            .chain(&self.when)
            .filter_map(|c| match &c.pred {
                Pred::Header(name, _) if !name.starts_with(':') => Some(name.as_str()),
                _ => None,
            })
    }

    /// Whether any `from`, `to` or `when` condition is HTTP-only.
    pub fn uses_http_only(&self) -> bool {
        self.from
            .iter()
            .chain(&self.to)
            .flatten()
            .chain(&self.when)
            .any(|c| c.pred.is_http_only())
    }

    /// The rule on a TCP filter chain for a policy with `allow` (ALLOW) or not
    /// (DENY/AUDIT) semantics; see [`TcpRule`].
    pub fn for_tcp(&self, allow: bool) -> TcpRule {
        if !self.uses_http_only() {
            return TcpRule::AsWritten(self.clone());
        }
        if allow {
            return TcpRule::Skipped;
        }
        let keep = |cs: &[Clause]| -> Vec<Clause> {
            cs.iter()
                .filter(|c| !c.pred.is_http_only())
                .cloned()
                .collect()
        };
        TcpRule::Broadened(Rule {
            from: self.from.iter().map(|s| keep(s)).collect(),
            to: self.to.iter().map(|o| keep(o)).collect(),
            when: keep(&self.when),
        })
    }
}

/// The string values of a claim at `path`: a string, or the strings of a list.
/// Numbers, booleans and objects yield nothing (they never string-match).
pub fn claim_values<'v>(claims: &'v serde_json::Value, path: &[String]) -> Vec<&'v str> {
    let mut cur = claims;
    for k in path {
        match cur.get(k.as_str()) {
            Some(v) => cur = v,
            None => return Vec::new(),
        }
    }
    match cur {
        serde_json::Value::String(s) => vec![s.as_str()],
        serde_json::Value::Array(items) => items.iter().filter_map(|i| i.as_str()).collect(),
        _ => Vec::new(),
    }
}

impl Clause {
    /// Naive evaluation. A negated host condition fails on the bare host too when
    /// [`Attrs::bare_host`] is set.
    pub fn eval(&self, a: &Attrs<'_>) -> bool {
        if let Some(host) = a.bare_host.filter(|_| self.negated && self.reads_host()) {
            return !self.pred.eval(a) && !self.pred.eval(&Attrs { host, ..*a });
        }
        self.pred.eval(a) != self.negated
    }

    /// Whether the clause is on the host: `hosts`, or a condition on
    /// `request.headers[:authority]` or `[host]`.
    pub fn reads_host(&self) -> bool {
        match &self.pred {
            Pred::Host(_) => true,
            Pred::Header(name, _) => matches!(name.as_str(), ":authority" | "host"),
            _ => false,
        }
    }
}

impl Rule {
    /// Naive evaluation of the rule algebra.
    pub fn eval(&self, a: &Attrs<'_>) -> bool {
        (self.from.is_empty() || self.from.iter().any(|s| s.iter().all(|c| c.eval(a))))
            && (self.to.is_empty() || self.to.iter().any(|o| o.iter().all(|c| c.eval(a))))
            && self.when.iter().all(|c| c.eval(a))
    }
}

/// Something that finds the first matching rule (in rule-id order) of a rule set.
pub trait RuleMatcher {
    /// Id of the first rule (lowest id) that matches, if any.
    fn first_match(&self, a: &Attrs<'_>) -> Option<u32>;
}

/// The linear evaluator: walks every rule in order.
#[derive(Debug, Clone, Default)]
pub struct LinearSet {
    /// Rules in id order.
    pub rules: Vec<Rule>,
}

impl RuleMatcher for LinearSet {
    fn first_match(&self, a: &Attrs<'_>) -> Option<u32> {
        self.rules.iter().position(|r| r.eval(a)).map(|i| i as u32)
    }
}
