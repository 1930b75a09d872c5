//! Routes: which cluster a request goes to, and with which per-route policy (body limits
//! and pace, response inspection limit, monitor-only), matched by host and path prefix.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::body::BodyPace;
use crate::config::OnLimit;
use crate::metrics::RouteMetrics;
use crate::upstream::Cluster;

/// How a route matches the request host.
#[derive(Debug, Clone)]
pub enum HostMatch {
    /// `*`.
    Any,
    /// An exact host (compared case-insensitively).
    Exact(String),
    /// `*.suffix`: stored as `.suffix`.
    Suffix(String),
}

impl HostMatch {
    pub(crate) fn parse(h: &str) -> HostMatch {
        if h == "*" {
            HostMatch::Any
        } else if let Some(s) = h.strip_prefix('*') {
            HostMatch::Suffix(s.to_ascii_lowercase())
        } else {
            HostMatch::Exact(h.to_ascii_lowercase())
        }
    }

    /// True when `host` (without port) is matched.
    #[inline]
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostMatch::Any => true,
            HostMatch::Exact(h) => h.eq_ignore_ascii_case(host),
            HostMatch::Suffix(s) => {
                host.len() > s.len()
                    && host.as_bytes()[host.len() - s.len()..].eq_ignore_ascii_case(s.as_bytes())
            }
        }
    }
}

/// A resolved route.
#[derive(Debug)]
pub struct Route {
    /// Route name.
    pub name: Arc<str>,
    /// Host matcher.
    pub host: HostMatch,
    /// Path prefix.
    pub prefix: String,
    /// Target cluster.
    pub cluster: Arc<Cluster>,
    /// Labels of the cluster's workload.
    pub labels: Arc<BTreeMap<String, String>>,
    /// Namespace of the cluster's workload.
    pub namespace: Arc<str>,
    /// Request body limit.
    pub body_max: u64,
    /// Request body limit policy.
    pub on_limit: OnLimit,
    /// How fast a streamed request body must arrive.
    pub body_pace: BodyPace,
    /// Response body inspection limit.
    pub response_max: u64,
    /// Monitor-only flag passed to engines.
    pub monitor_only: bool,
    /// Protocols a client may switch to (`routes[].upgrades`), matched without case.
    pub upgrades: Box<[Box<str>]>,
    /// Pre-resolved counters.
    pub metrics: Arc<RouteMetrics>,
}

/// First route of `routes` matching host and path.
#[inline]
pub fn match_route<'a>(routes: &'a [Route], host: &str, path: &str) -> Option<&'a Route> {
    routes
        .iter()
        .find(|r| path.starts_with(r.prefix.as_str()) && r.host.matches(host))
}

impl Route {
    /// True when every protocol `upgrade` (an `Upgrade` field value) offers is one this
    /// route lets a connection switch to. The upstream picks among the offers, so one
    /// protocol outside the list makes the whole request a plain one.
    pub fn allows_upgrade(&self, upgrade: &[u8]) -> bool {
        let mut offers = upgrade
            .split(|&b| b == b',')
            .map(|offer| offer.trim_ascii())
            .filter(|offer| !offer.is_empty())
            .peekable();
        offers.peek().is_some()
            && offers.all(|offer| {
                // protocol-name ["/" protocol-version]
                let name = offer.split(|&b| b == b'/').next().unwrap_or_default();
                self.upgrades
                    .iter()
                    .any(|p| p.as_bytes().eq_ignore_ascii_case(name.trim_ascii()))
            })
    }
}
