//! Rules compiled from the configuration: what a rule matches, and the key a request
//! is counted against.

use std::fmt::Write as _;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};

use http::HeaderValue;
use moat_core::RequestCtx;
use moat_schema::template::template_bytes;

use crate::bucket::{Limit, State};
use crate::config::{KeyPart, PathConfig, RuleConfig};
use crate::lease::Leases;
use crate::table::Table;

/// A host pattern: exact, `*.suffix` or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// Every host.
    Any,
    /// This host (lowercase).
    Exact(String),
    /// Hosts ending with `.suffix` (stored with the dot, lowercase).
    Suffix(String),
}

impl HostPattern {
    /// Parses a pattern; `None` when it is neither exact, `*.suffix` nor `*`.
    pub fn parse(p: &str) -> Option<Self> {
        let p = p.to_ascii_lowercase();
        if p == "*" {
            return Some(HostPattern::Any);
        }
        if let Some(rest) = p.strip_prefix("*.") {
            return (!rest.is_empty() && !rest.contains('*'))
                .then(|| HostPattern::Suffix(format!(".{rest}")));
        }
        (!p.is_empty() && !p.contains('*')).then_some(HostPattern::Exact(p))
    }

    /// True when `host` (without port) matches.
    #[inline]
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Any => true,
            HostPattern::Exact(h) => host.eq_ignore_ascii_case(h),
            HostPattern::Suffix(s) => {
                host.len() > s.len()
                    && host.is_char_boundary(host.len() - s.len())
                    && host[host.len() - s.len()..].eq_ignore_ascii_case(s)
            }
        }
    }
}

/// A path template compiled into segments: `{name}` stands for one non-empty segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    raw: String,
    /// The segments after the leading `/`; `None` for a variable.
    segments: Vec<Option<Box<[u8]>>>,
}

impl Template {
    /// Compiles `/users/{id}/orders`.
    pub fn new(raw: &str) -> Self {
        let segments = raw
            .split('/')
            .skip(1)
            .map(|s| {
                let var = s.len() >= 2 && s.starts_with('{') && s.ends_with('}');
                (!var).then(|| s.as_bytes().into())
            })
            .collect();
        Template {
            raw: raw.to_string(),
            segments,
        }
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// True when `path` has the template's shape (bytes, one pass, no allocation).
    #[inline]
    pub fn matches(&self, path: &str) -> bool {
        let mut rest = path.as_bytes();
        for seg in &self.segments {
            let Some(r) = rest.strip_prefix(b"/") else {
                return false;
            };
            let end = r.iter().position(|b| *b == b'/').unwrap_or(r.len());
            let (s, tail) = r.split_at(end);
            let ok = match seg {
                Some(lit) => s == &**lit,
                None => !s.is_empty(),
            };
            if !ok {
                return false;
            }
            rest = tail;
        }
        rest.is_empty()
    }
}

/// What part of the path a rule matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathMatch {
    /// Paths starting with this.
    Prefix(String),
    /// Paths of this shape.
    Template(Template),
}

impl From<&PathConfig> for PathMatch {
    fn from(p: &PathConfig) -> Self {
        match p {
            PathConfig::Prefix(p) => PathMatch::Prefix(p.clone()),
            PathConfig::Template(t) => PathMatch::Template(Template::new(t)),
        }
    }
}

/// Counts of one rule, for metrics.
#[derive(Debug, Default)]
pub struct RuleCounters {
    /// Requests within the limit.
    pub passed: AtomicU64,
    /// Requests refused with 429.
    pub limited: AtomicU64,
    /// Requests over the limit let through (monitor mode).
    pub monitored: AtomicU64,
    /// Requests decided while the shared store was unreachable.
    pub store_fallback: AtomicU64,
}

/// A rule's state, kept across reloads that leave the rule unchanged.
pub struct RuleState {
    /// The configuration it was built from (with the store settings that shape it).
    pub(crate) signature: serde_json::Value,
    /// Per-key buckets in this process.
    pub local: Table<State>,
    /// Per-key leases from the shared store, when there is one.
    pub leases: Option<Arc<Leases>>,
    /// Counts for metrics.
    pub counters: RuleCounters,
}

/// A compiled rule.
pub struct Rule {
    /// The rule's name.
    pub name: Arc<str>,
    pub(crate) routes: Vec<Arc<str>>,
    pub(crate) host: HostPattern,
    pub(crate) path: Option<PathMatch>,
    pub(crate) methods: Vec<http::Method>,
    pub(crate) key: Vec<KeyPart>,
    /// Block or monitor.
    pub action: crate::config::Action,
    /// The limit.
    pub limit: Limit,
    /// `RateLimit-Policy` value.
    pub(crate) policy: HeaderValue,
    /// Buckets, leases and counters.
    pub state: Arc<RuleState>,
}

impl Rule {
    /// The limit a rule's configuration describes.
    pub fn limit_of(cfg: &RuleConfig) -> Limit {
        let window = u64::try_from(cfg.per.as_nanos()).unwrap_or(u64::MAX);
        Limit::new(
            cfg.algorithm,
            cfg.rate,
            window,
            cfg.burst.unwrap_or(cfg.rate),
        )
    }

    /// True when the request is one the rule counts.
    #[inline]
    pub fn matches(&self, ctx: &RequestCtx, parts: &http::request::Parts, host: &str) -> bool {
        (self.routes.is_empty() || self.routes.iter().any(|r| **r == *ctx.route))
            && (self.methods.is_empty() || self.methods.contains(&parts.method))
            && self.host.matches(host)
            && match &self.path {
                None => true,
                Some(PathMatch::Prefix(p)) => parts.uri.path().starts_with(p.as_str()),
                Some(PathMatch::Template(t)) => t.matches(parts.uri.path()),
            }
    }

    /// Walks the parts of the request's key, each as bytes, in order.
    fn key_parts(
        &self,
        ctx: &RequestCtx,
        parts: &http::request::Parts,
        mut out: impl FnMut(&[u8]),
    ) {
        for k in &self.key {
            match k {
                KeyPart::Ip => match ctx.client_ip {
                    IpAddr::V4(a) => out(&a.octets()),
                    IpAddr::V6(a) => out(&a.octets()),
                },
                KeyPart::Route => out(ctx.route.as_bytes()),
                KeyPart::Path => match &self.path {
                    Some(PathMatch::Template(t)) => out(t.as_str().as_bytes()),
                    _ => out(parts.uri.path().as_bytes()),
                },
                KeyPart::Template => template_bytes(parts.uri.path(), &mut out),
                KeyPart::Header(h) => {
                    out(parts.headers.get(&h.0).map_or(&[][..], |v| v.as_bytes()))
                }
                KeyPart::Claim(c) => match ctx.auth.as_ref().and_then(|a| a.claims.get(c)) {
                    None => out(b""),
                    Some(serde_json::Value::String(s)) => out(s.as_bytes()),
                    Some(v) => out(v.to_string().as_bytes()),
                },
            }
            // A separator no header value or octet string ends in unambiguously.
            out(&[0xff, 0x00]);
        }
    }

    /// The request's key, hashed with this process's random key (no allocation).
    #[inline]
    pub fn key_hash(&self, ctx: &RequestCtx, parts: &http::request::Parts) -> u64 {
        let mut h = key_hasher().build_hasher();
        self.key_parts(ctx, parts, |b| h.write(b));
        h.finish()
    }

    /// The key as the shared store names it: the rule and a SHA-256 of the key's parts
    /// (the same on every instance, bounded in length whatever the headers hold).
    pub fn store_key(&self, ctx: &RequestCtx, parts: &http::request::Parts) -> Arc<str> {
        let mut d = ring::digest::Context::new(&ring::digest::SHA256);
        self.key_parts(ctx, parts, |b| d.update(b));
        let digest = d.finish();
        let mut s = format!("moat:rl:{}:", self.name);
        for b in &digest.as_ref()[..16] {
            let _ = write!(s, "{b:02x}");
        }
        s.into()
    }
}

/// The process's key hasher: random, so clients cannot aim hash collisions, and the
/// same across reloads, so kept tables stay valid.
fn key_hasher() -> &'static std::collections::hash_map::RandomState {
    static H: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
    H.get_or_init(Default::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_and_templates() {
        let h = HostPattern::parse("*.Example.com").unwrap();
        assert!(h.matches("api.example.COM"));
        assert!(!h.matches("example.com"));
        assert!(HostPattern::parse("a*b").is_none());
        assert!(HostPattern::parse("*.").is_none());
        let t = Template::new("/users/{id}/orders");
        assert!(t.matches("/users/42/orders"));
        assert!(!t.matches("/users//orders"));
        assert!(!t.matches("/users/42/orders/"));
        assert!(!t.matches("users/42/orders"));
        let t = Template::new("/users/{id}");
        assert!(!t.matches("/users/42/orders"));
        assert!(!t.matches("/users"));
        assert!(!t.matches("/users/"));
        assert!(Template::new("/").matches("/"));
        assert!(!Template::new("/").matches("/a"));
        assert!(
            Template::new("/{}/x").matches("/{}/x"),
            "an empty name is a literal"
        );
    }
}
