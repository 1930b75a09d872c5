//! moat's rate limits, IP bans and bot challenge.
//!
//! Pure: rules compiled from the configuration into matchers ([`rule`]), the bucket
//! arithmetic ([`bucket`]), bounded per-key tables ([`table`]), the accounting of
//! leases reserved from a shared store ([`lease`], the store itself is behind
//! [`LeaseStore`]), bans and IP lists ([`bans`]), and the challenge's signing and
//! proof-of-work check ([`challenge`]). No socket, no runtime: the proxy calls
//! [`RateLimitEngine`] as a request-headers phase (bans, challenge, limits) and an
//! after-response phase (counting blocks toward bans).

#![warn(missing_docs)]

pub mod bans;
pub mod bucket;
pub mod challenge;
pub mod config;
pub mod lease;
pub mod rule;
pub mod table;

use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::header::{
    HeaderName, HeaderValue, AUTHORIZATION, COOKIE, LOCATION, RETRY_AFTER, USER_AGENT,
};
use http::StatusCode;
use moat_config::ConfigError;
use moat_core::{
    AfterResponsePhase, BodyNeed, EventAction, Finished, Reply, ReplyFormat, RequestCtx,
    RequestHeadersPhase, SecurityEvent, Verdict,
};

pub use bans::{Ban, Bans, IpSet, Refusal};
pub use bucket::{Limit, Outcome, State};
pub use challenge::Challenger;
pub use config::{OnStoreError, RateLimitConfig, StoreConfig};
pub use lease::{LeaseOutcome, LeaseRequest, LeaseStore, Leases};
pub use rule::{Rule, RuleState};

use config::{Action, Binding};

/// The IETF `RateLimit-Policy` header (draft-ietf-httpapi-ratelimit-headers).
pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The IETF `RateLimit` header.
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Nanoseconds on a monotonic clock shared by every engine of the process (kept
/// tables stay valid across reloads).
#[inline]
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Counts of the bans and the challenge, for metrics.
#[derive(Debug, Default)]
pub struct Counters {
    /// Requests refused because the client IP is banned.
    pub banned: AtomicU64,
    /// Requests refused by the deny list.
    pub denied: AtomicU64,
    /// Bans the engine imposed.
    pub bans_imposed: AtomicU64,
    /// Challenge pages served.
    pub challenged: AtomicU64,
    /// Solutions accepted (a cookie was set).
    pub challenge_solved: AtomicU64,
    /// Solutions refused.
    pub challenge_failed: AtomicU64,
    /// Requests let through by a valid cookie.
    pub challenge_passed: AtomicU64,
    /// Requests refused because the shared store was unreachable (`on_store_error: deny`).
    pub store_denied: AtomicU64,
}

/// What the challenge applies to.
struct ChallengeRt {
    routes: Vec<String>,
    exempt: config::Exemptions,
    challenger: Challenger,
}

/// The engine: bans, lists, challenge and limits, built from `ratelimit:`.
pub struct RateLimitEngine {
    config: RateLimitConfig,
    rules: Vec<Rule>,
    /// Some rule names a host.
    needs_host: bool,
    store: Option<Arc<dyn LeaseStore>>,
    bans: Option<Arc<Bans>>,
    challenge: Option<ChallengeRt>,
    counters: Arc<Counters>,
}

impl std::fmt::Debug for RateLimitEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitEngine")
            .field("rules", &self.rules.len())
            .field("shared", &self.store.is_some())
            .finish()
    }
}

fn at<T>(file: &Path, s: &serde_saphyr::Spanned<T>, field: String, msg: String) -> ConfigError {
    ConfigError::semantic(
        file,
        s.referenced.line() as u32,
        s.referenced.column() as u32,
        field,
        msg,
    )
}

impl RateLimitEngine {
    /// Builds the engine. `routes` are the configured route names (rules and the
    /// challenge may only name those); `store` is the shared store when
    /// `ratelimit.store` names one; `previous` is the engine this one replaces on a
    /// reload: rules whose configuration did not change keep their buckets, and bans
    /// are kept when `bans` did not change.
    pub fn build(
        cfg: &RateLimitConfig,
        file: &Path,
        base_dir: &Path,
        routes: &[&str],
        store: Option<Arc<dyn LeaseStore>>,
        previous: Option<&RateLimitEngine>,
    ) -> Result<Arc<Self>, ConfigError> {
        let mut rules: Vec<Rule> = Vec::with_capacity(cfg.rules.len());
        for (i, r) in cfg.rules.iter().enumerate() {
            let name = &r.name.value;
            if name.is_empty() || name.contains(['"', '\\', ':']) || !name.is_ascii() {
                return Err(at(
                    file,
                    &r.name,
                    format!("ratelimit.rules[{i}].name"),
                    format!("`{name}`: a rule name is printable ASCII without `\"`, `\\` or `:`"),
                ));
            }
            if rules.iter().any(|o| *o.name == **name) {
                return Err(at(
                    file,
                    &r.name,
                    format!("ratelimit.rules[{i}].name"),
                    format!("duplicate rule name `{name}`"),
                ));
            }
            for (j, route) in r.routes.iter().enumerate() {
                if !routes.contains(&route.value.as_str()) {
                    return Err(at(
                        file,
                        route,
                        format!("ratelimit.rules[{i}].routes[{j}]"),
                        format!("unknown route `{}`", route.value),
                    ));
                }
            }
            let host = rule::HostPattern::parse(&r.host.value).ok_or_else(|| {
                at(
                    file,
                    &r.host,
                    format!("ratelimit.rules[{i}].host"),
                    format!("`{}`: use an exact host, `*.suffix` or `*`", r.host.value),
                )
            })?;
            if r.key.is_empty() {
                return Err(at(
                    file,
                    &r.name,
                    format!("ratelimit.rules[{i}].key"),
                    "a key needs at least one part (e.g. `[ip]`)".into(),
                ));
            }
            let limit = Rule::limit_of(r);
            // What shapes the rule's state: the rule itself and the store it counts in.
            let signature = serde_json::json!({
                "rule": r, "store": cfg.store, "lease": cfg.lease.as_nanos() as u64,
                "max_keys": cfg.max_keys,
            });
            let kept = previous
                .and_then(|p| p.rules.iter().find(|o| o.state.signature == signature))
                .map(|o| o.state.clone());
            let state = kept.unwrap_or_else(|| {
                let batch = (u128::from(limit.rate) * cfg.lease.as_nanos())
                    .div_ceil(u128::from(limit.window_ns).max(1))
                    .clamp(1, u128::from(u32::MAX)) as u32;
                Arc::new(RuleState {
                    signature,
                    local: table::Table::new(cfg.max_keys),
                    leases: store
                        .as_ref()
                        .map(|_| Arc::new(Leases::new(limit, batch, cfg.max_keys))),
                    counters: Default::default(),
                })
            });
            let policy = format!("\"{name}\";q={};w={}", limit.quota(), limit.window_secs());
            rules.push(Rule {
                name: name.as_str().into(),
                routes: r.routes.iter().map(|s| s.value.as_str().into()).collect(),
                host,
                path: r.path.as_ref().map(rule::PathMatch::from),
                methods: r.methods.iter().map(|m| m.0.clone()).collect(),
                key: r.key.clone(),
                action: r.action,
                limit,
                policy: HeaderValue::from_str(&policy).map_err(|_| {
                    at(
                        file,
                        &r.name,
                        format!("ratelimit.rules[{i}].name"),
                        "not a valid header value".into(),
                    )
                })?,
                state,
            });
        }
        let bans = match &cfg.bans {
            None => None,
            Some(b) => match previous
                .and_then(|p| p.bans.clone())
                .filter(|o| o.config == *b)
            {
                Some(kept) => {
                    kept.reload_lists();
                    Some(kept)
                }
                None => Some(Arc::new(Bans::new(b, base_dir).map_err(|m| {
                    ConfigError::semantic(file, 0, 0, "ratelimit.bans", m)
                })?)),
            },
        };
        let challenge = match &cfg.challenge {
            None => None,
            Some(c) => {
                for (j, route) in c.routes.iter().enumerate() {
                    if !routes.contains(&route.value.as_str()) {
                        return Err(at(
                            file,
                            route,
                            format!("ratelimit.challenge.routes[{j}]"),
                            format!("unknown route `{}`", route.value),
                        ));
                    }
                }
                // A random key must survive reloads, or every client would be
                // challenged again after each one.
                let challenger = match previous.and_then(|p| p.challenge.as_ref()) {
                    Some(old) if c.keys.is_empty() && p_keys_empty(previous) => {
                        old.challenger.clone_with(c)
                    }
                    _ => Challenger::new(c),
                };
                Some(ChallengeRt {
                    routes: c.routes.iter().map(|r| r.value.clone()).collect(),
                    exempt: c.exempt.clone(),
                    challenger,
                })
            }
        };
        Ok(Arc::new(RateLimitEngine {
            config: cfg.clone(),
            needs_host: rules.iter().any(|r| r.host != rule::HostPattern::Any),
            rules,
            store,
            bans,
            challenge,
            counters: previous.map(|p| p.counters.clone()).unwrap_or_default(),
        }))
    }

    /// The configuration this engine was built from.
    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    /// The compiled rules.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Bans and lists, when `ratelimit.bans` is configured.
    pub fn bans(&self) -> Option<&Arc<Bans>> {
        self.bans.as_ref()
    }

    /// True when blocks earn bans (the engine then needs to see finished requests as an
    /// [`AfterResponsePhase`]).
    pub fn counts_blocks(&self) -> bool {
        self.bans
            .as_ref()
            .is_some_and(|b| b.config.after_blocks > 0)
    }

    /// The shared store, when there is one.
    pub fn store(&self) -> Option<&Arc<dyn LeaseStore>> {
        self.store.as_ref()
    }

    /// Counts of bans and the challenge.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Decides one request against one rule: the outcome, or `None` when the shared
    /// store is down and `on_store_error: deny` refuses the request.
    #[inline]
    pub fn decide(
        &self,
        rule: &Rule,
        ctx: &RequestCtx,
        parts: &http::request::Parts,
        now: u64,
    ) -> Option<Outcome> {
        let hash = rule.key_hash(ctx, parts);
        let st = &rule.state;
        if let (Some(store), Some(leases)) = (&self.store, &st.leases) {
            if store.healthy() {
                let o = leases.take(hash, || rule.store_key(ctx, parts), now, store.as_ref());
                return Some(match o {
                    LeaseOutcome::Allowed(left) => Outcome {
                        allowed: true,
                        remaining: left,
                        reset_ns: rule
                            .limit
                            .interval_ns
                            .saturating_mul(u64::from(rule.limit.quota().saturating_sub(left))),
                        retry_after_ns: 0,
                    },
                    LeaseOutcome::Refused(retry) => Outcome {
                        allowed: false,
                        remaining: 0,
                        reset_ns: retry,
                        retry_after_ns: retry,
                    },
                });
            }
            st.counters.store_fallback.fetch_add(1, Relaxed);
            if self.config.on_store_error == OnStoreError::Deny {
                return None;
            }
        }
        let limit = &rule.limit;
        Some(st.local.with(
            hash,
            || State::new(limit, now),
            |s| s.idle(limit, now),
            |s| s.take(limit, now, 1),
        ))
    }

    /// The 429 reply of a refused request.
    fn limited(
        &self,
        rule: &Rule,
        o: &Outcome,
        ctx: &RequestCtx,
        parts: &http::request::Parts,
        ev: &str,
    ) -> Reply {
        let retry = o.retry_after_ns.div_ceil(1_000_000_000).max(1);
        let reset = o.reset_ns.div_ceil(1_000_000_000);
        let mut state = String::with_capacity(48);
        let _ = write!(state, "\"{}\";r={};t={}", rule.name, o.remaining, reset);
        let mut reply = Reply::page(
            StatusCode::TOO_MANY_REQUESTS,
            ReplyFormat::from_accept(parts.headers.get(http::header::ACCEPT)),
            "too many requests",
            &ctx.request_id,
            Some(ev),
        )
        .with_header(RETRY_AFTER, HeaderValue::from(retry))
        .with_header(RATELIMIT_POLICY.clone(), rule.policy.clone());
        if let Ok(v) = HeaderValue::from_str(&state) {
            reply = reply.with_header(RATELIMIT.clone(), v);
        }
        reply
    }

    /// The binding of a clearance: the client IP or its User-Agent.
    fn binding<'a>(
        bind: Binding,
        ctx: &RequestCtx,
        parts: &'a http::request::Parts,
        buf: &'a mut [u8; 16],
    ) -> &'a [u8] {
        match bind {
            Binding::Ip => {
                let v6 = match ctx.client_ip {
                    IpAddr::V4(a) => a.to_ipv6_mapped(),
                    IpAddr::V6(a) => a,
                };
                *buf = v6.octets();
                &buf[..]
            }
            Binding::UserAgent => parts
                .headers
                .get(USER_AGENT)
                .map_or(&[][..], |v| v.as_bytes()),
        }
    }

    /// The challenge step: `None` to go on, or the reply (a page, a redirect with the
    /// cookie, or a refusal).
    fn challenge(
        &self,
        c: &ChallengeRt,
        ctx: &mut RequestCtx,
        parts: &http::request::Parts,
    ) -> Option<Reply> {
        if !c.routes.iter().any(|r| **r == *ctx.route) || exempt(&c.exempt, parts) {
            return None;
        }
        let now = bans::unix_ms() / 1000;
        let mut buf = [0u8; 16];
        let binding = Self::binding(c.challenger.bind, ctx, parts, &mut buf);
        if let Some(cookie) = cookie_value(&parts.headers, challenge::COOKIE) {
            if c.challenger.cookie_valid(cookie, binding, now) {
                self.counters.challenge_passed.fetch_add(1, Relaxed);
                return None;
            }
        }
        let query = parts.uri.query().unwrap_or("");
        if let Some(solution) = query_param(query, challenge::SOLUTION_PARAM) {
            return Some(match c.challenger.check_solution(solution, binding, now) {
                Ok(()) => {
                    self.counters.challenge_solved.fetch_add(1, Relaxed);
                    let secure = if ctx.conn.tls.is_some() {
                        "; Secure"
                    } else {
                        ""
                    };
                    let cookie = format!(
                        "{}={}; Path=/; Max-Age={}; HttpOnly; SameSite=Lax{secure}",
                        challenge::COOKIE,
                        c.challenger.cookie(binding, now),
                        c.challenger.ttl_secs()
                    );
                    let back = without_param(parts.uri.path(), query, challenge::SOLUTION_PARAM);
                    let mut r = Reply::text(StatusCode::SEE_OTHER, "");
                    for (name, value) in [(LOCATION, back), (http::header::SET_COOKIE, cookie)] {
                        if let Ok(v) = HeaderValue::from_str(&value) {
                            r = r.with_header(name, v);
                        }
                    }
                    r.with_header(
                        http::header::CACHE_CONTROL,
                        HeaderValue::from_static("no-store"),
                    )
                }
                Err(why) => {
                    self.counters.challenge_failed.fetch_add(1, Relaxed);
                    let ev = SecurityEvent::new(
                        "ratelimit",
                        "challenge",
                        EventAction::Block,
                        format!("challenge solution refused: {why:?}"),
                    );
                    let reply = Reply::page(
                        StatusCode::FORBIDDEN,
                        ReplyFormat::from_accept(parts.headers.get(http::header::ACCEPT)),
                        "challenge failed",
                        &ctx.request_id,
                        Some(&ev.id),
                    );
                    ctx.events.push(ev);
                    reply
                }
            });
        }
        self.counters.challenged.fetch_add(1, Relaxed);
        let page = c.challenger.page(&c.challenger.challenge(binding, now));
        let mut r = Reply::text(StatusCode::FORBIDDEN, page).with_header(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-store"),
        );
        r.headers.retain(|(n, _)| n != http::header::CONTENT_TYPE);
        Some(r.with_header(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        ))
    }

    /// Writes the engine's metrics in the Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        out.push_str("# TYPE moat_ratelimit_requests_total counter\n");
        for r in &self.rules {
            let c = &r.state.counters;
            for (outcome, n) in [
                ("passed", &c.passed),
                ("limited", &c.limited),
                ("monitored", &c.monitored),
                ("store_fallback", &c.store_fallback),
            ] {
                let _ = writeln!(
                    out,
                    "moat_ratelimit_requests_total{{rule=\"{}\",outcome=\"{outcome}\"}} {}",
                    r.name,
                    n.load(Relaxed)
                );
            }
        }
        let c = &self.counters;
        out.push_str("# TYPE moat_ratelimit_bans_total counter\n");
        for (what, n) in [
            ("banned", &c.banned),
            ("denied_list", &c.denied),
            ("imposed", &c.bans_imposed),
            ("store_denied", &c.store_denied),
        ] {
            let _ = writeln!(
                out,
                "moat_ratelimit_bans_total{{outcome=\"{what}\"}} {}",
                n.load(Relaxed)
            );
        }
        out.push_str("# TYPE moat_ratelimit_challenge_total counter\n");
        for (what, n) in [
            ("challenged", &c.challenged),
            ("solved", &c.challenge_solved),
            ("failed", &c.challenge_failed),
            ("passed", &c.challenge_passed),
        ] {
            let _ = writeln!(
                out,
                "moat_ratelimit_challenge_total{{outcome=\"{what}\"}} {}",
                n.load(Relaxed)
            );
        }
    }
}

fn p_keys_empty(previous: Option<&RateLimitEngine>) -> bool {
    previous
        .and_then(|p| p.config.challenge.as_ref())
        .is_some_and(|c| c.keys.is_empty())
}

/// True when the request is exempt from the challenge.
fn exempt(e: &config::Exemptions, parts: &http::request::Parts) -> bool {
    e.headers.iter().any(|h| parts.headers.contains_key(&h.0))
        || e.paths
            .iter()
            .any(|p| parts.uri.path().starts_with(p.as_str()))
        || (!e.tokens.is_empty()
            && parts
                .headers
                .get(AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .is_some_and(|t| e.tokens.iter().any(|x| x == t.trim())))
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie_value<'a>(h: &'a http::HeaderMap, name: &str) -> Option<&'a str> {
    h.get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(name)?.strip_prefix('='))
}

/// The value of query parameter `name` (not percent-decoded: the values moat writes
/// need no encoding).
fn query_param<'a>(q: &'a str, name: &str) -> Option<&'a str> {
    q.split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// `path?query` without parameter `name`.
fn without_param(path: &str, q: &str, name: &str) -> String {
    let rest: Vec<&str> = q
        .split('&')
        .filter(|kv| !kv.is_empty() && kv.split('=').next() != Some(name))
        .collect();
    if rest.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", rest.join("&"))
    }
}

impl RequestHeadersPhase for RateLimitEngine {
    fn name(&self) -> &'static str {
        "ratelimit"
    }

    /// The fields rules count requests by (`key: [{header: NAME}]`): a client's
    /// `x_api_key` would reach a CGI-style backend as the key while its requests were
    /// counted as keyless.
    fn fields_decided_on(&self) -> Vec<http::HeaderName> {
        self.config
            .rules
            .iter()
            .flat_map(|r| &r.key)
            .filter_map(|k| match k {
                config::KeyPart::Header(name) => Some(name.0.clone()),
                _ => None,
            })
            .collect()
    }

    fn on_request_headers(
        &self,
        ctx: &mut RequestCtx,
        parts: &mut http::request::Parts,
    ) -> Verdict {
        let ip = ctx.client_ip;
        if let Some(b) = &self.bans {
            if b.allowed(ip) {
                return Verdict::Continue;
            }
            if let Some(why) = b.refused(ip, bans::unix_ms()) {
                let (rule, msg) = match why {
                    Refusal::DenyList => {
                        self.counters.denied.fetch_add(1, Relaxed);
                        ("deny_list", "client IP is on the deny list".to_string())
                    }
                    Refusal::Banned(until) => {
                        self.counters.banned.fetch_add(1, Relaxed);
                        (
                            "ban",
                            format!("client IP is banned until {until} (Unix ms)"),
                        )
                    }
                };
                let ev = SecurityEvent::new("ratelimit", rule, EventAction::Block, msg);
                let reply = Reply::page(
                    StatusCode::FORBIDDEN,
                    ReplyFormat::from_accept(parts.headers.get(http::header::ACCEPT)),
                    "forbidden",
                    &ctx.request_id,
                    Some(&ev.id),
                );
                ctx.events.push(ev);
                return Verdict::Respond(reply);
            }
        }
        if let Some(c) = &self.challenge {
            if let Some(r) = self.challenge(c, ctx, parts) {
                return Verdict::Respond(r);
            }
        }
        if self.rules.is_empty() {
            return Verdict::Continue;
        }
        // The host is looked up only when a rule names one (most do not).
        let host = if self.needs_host {
            moat_core::request_host(parts)
        } else {
            ""
        };
        let now = now_ns();
        for rule in &self.rules {
            if !rule.matches(ctx, parts, host) {
                continue;
            }
            let counters = &rule.state.counters;
            let Some(o) = self.decide(rule, ctx, parts, now) else {
                self.counters.store_denied.fetch_add(1, Relaxed);
                let ev = SecurityEvent::new(
                    "ratelimit",
                    &*rule.name,
                    EventAction::Block,
                    "the shared rate limit store is unreachable (on_store_error: deny)",
                );
                let reply = Reply::page(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ReplyFormat::from_accept(parts.headers.get(http::header::ACCEPT)),
                    "rate limit store unavailable",
                    &ctx.request_id,
                    Some(&ev.id),
                );
                ctx.events.push(ev);
                return Verdict::Respond(reply);
            };
            if o.allowed {
                counters.passed.fetch_add(1, Relaxed);
                continue;
            }
            let monitor = rule.action == Action::Monitor || ctx.monitor_only;
            let action = if monitor {
                EventAction::Monitor
            } else {
                EventAction::Block
            };
            let ev = SecurityEvent::new(
                "ratelimit",
                &*rule.name,
                action,
                format!(
                    "over {} requests per {}s",
                    rule.limit.rate,
                    rule.limit.window_secs()
                ),
            );
            if monitor {
                counters.monitored.fetch_add(1, Relaxed);
                ctx.events.push(ev);
                continue;
            }
            counters.limited.fetch_add(1, Relaxed);
            let reply = self.limited(rule, &o, ctx, parts, &ev.id);
            ctx.events.push(ev);
            return Verdict::Respond(reply);
        }
        Verdict::Continue
    }
}

/// Counts blocks toward bans: a request refused by any engine (a security event with
/// action `block`) counts once for its client IP; refusals of bans and lists do not.
impl AfterResponsePhase for RateLimitEngine {
    fn name(&self) -> &'static str {
        "bans"
    }

    fn wants_bodies(&self, _: &mut RequestCtx, _: &http::request::Parts) -> BodyNeed {
        BodyNeed::None
    }

    fn after_response(&self, done: &Finished<'_>) {
        let Some(b) = &self.bans else { return };
        let blocked = done.ctx.events.iter().any(|e| {
            e.action == EventAction::Block
                && !(e.engine == "ratelimit" && matches!(e.rule.as_str(), "ban" | "deny_list"))
        });
        if !blocked {
            return;
        }
        if let Some(ban) = b.count_block(done.ctx.client_ip, now_ns(), bans::unix_ms()) {
            self.counters.bans_imposed.fetch_add(1, Relaxed);
            if let Some(s) = &self.store {
                s.ban(&ban);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_and_cookie_helpers() {
        assert_eq!(
            query_param("a=1&__moat_pow=x.1&b", "__moat_pow"),
            Some("x.1")
        );
        assert_eq!(
            without_param("/p", "a=1&__moat_pow=x.1", "__moat_pow"),
            "/p?a=1"
        );
        assert_eq!(without_param("/p", "__moat_pow=x", "__moat_pow"), "/p");
        let mut h = http::HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("a=1; moat_clearance=v"));
        assert_eq!(cookie_value(&h, "moat_clearance"), Some("v"));
        assert_eq!(cookie_value(&h, "moat"), None);
    }
}
