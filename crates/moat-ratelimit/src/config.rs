//! The `ratelimit:` section of the gateway configuration.
//!
//! Values that can be checked on their own (a positive rate, a header name, a method,
//! an IP list entry) are checked while they are read, so an error names the file, the
//! line and the field; checks across fields (unique rule names, known routes) run in
//! [`crate::RateLimitEngine::build`] and locate themselves with [`Spanned`].

use std::time::Duration;

use moat_config::duration;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_saphyr::Spanned;

/// `ratelimit:`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitConfig {
    /// Where counters live: `local` (this process), or shared by every instance using
    /// the same Redis: `{ redis: URL }`, `{ redis_cluster: [URL, ...] }` or
    /// `{ redis_sentinel: { urls: [URL, ...], master_name: NAME } }`.
    #[serde(default)]
    pub store: StoreConfig,
    /// What a request gets when the shared store cannot be reached.
    #[serde(default)]
    pub on_store_error: OnStoreError,
    /// Longest wait for one store operation; beyond it the operation counts as an error.
    /// Store operations never run on the request path, so this bounds staleness, not
    /// latency.
    #[serde(default = "default_store_timeout", with = "duration")]
    pub store_timeout: Duration,
    /// With a shared store: how much traffic, in time at the limit's rate, an instance
    /// reserves from the store in one batch (at least one token). Larger batches mean
    /// fewer store round trips and a larger possible overshoot (see `docs/ratelimit.md`).
    #[serde(default = "default_lease", with = "duration")]
    pub lease: Duration,
    /// Most keys tracked per rule; beyond it idle keys are evicted, and while none is
    /// idle new keys share one overflow bucket (so a flood of distinct keys cannot grow
    /// memory without bound, nor escape the limit).
    #[serde(default = "default_max_keys", deserialize_with = "positive_usize")]
    pub max_keys: usize,
    /// The limits, checked in order; a request is refused by the first rule it exceeds.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
    /// Automatic bans and allow/deny lists.
    #[serde(default)]
    pub bans: Option<BanConfig>,
    /// The proof-of-work bot challenge.
    #[serde(default)]
    pub challenge: Option<ChallengeConfig>,
}

fn default_store_timeout() -> Duration {
    Duration::from_millis(50)
}
fn default_lease() -> Duration {
    Duration::from_millis(100)
}
fn default_max_keys() -> usize {
    100_000
}

/// `ratelimit.store`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum StoreConfig {
    /// Counters in this process only.
    #[default]
    Local,
    /// Counters and bans in one Redis server (`redis://[:password@]host:port[/db]`).
    Redis(RedisUrl),
    /// Counters and bans in a Redis Cluster: the URLs of some of its nodes (the rest of
    /// the cluster is discovered from them). Each key lives on the node owning its slot.
    RedisCluster(#[serde(deserialize_with = "redis_urls")] Vec<RedisUrl>),
    /// Counters and bans in the master that Redis Sentinel names, followed across
    /// failovers.
    RedisSentinel(SentinelConfig),
}

/// `ratelimit.store.redis_sentinel`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// The sentinels' URLs (`redis://host:26379`), asked in order for the master.
    #[serde(deserialize_with = "redis_urls")]
    pub urls: Vec<RedisUrl>,
    /// The name the sentinels monitor the master under (`sentinel monitor NAME ...`).
    #[serde(deserialize_with = "master_name")]
    pub master_name: String,
    /// The password of the master (and its replicas), when they require one; the
    /// sentinels' own passwords go in their URLs.
    #[serde(default)]
    pub password: Option<String>,
}

/// Most URLs in a cluster or sentinel list: a handful of seeds is what clients use.
pub const MAX_STORE_URLS: usize = 64;

/// A Redis URL, checked when read: `redis://host[:port][/db]`, with an optional
/// `[user][:password]@` before the host. Written out (the admin API's and the console's
/// view of the config) with the password masked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisUrl(pub String);

impl Serialize for RedisUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let url = &self.0;
        let authority_end = url
            .get("redis://".len()..)
            .and_then(|r| r.find(['/', '?']))
            .map_or(url.len(), |i| i + "redis://".len());
        let password = url[..authority_end]
            .rfind('@')
            .and_then(|at| Some((url[..at].rfind(':')? + 1, at)))
            .filter(|(colon, _)| *colon > "redis://".len());
        match password {
            Some((from, to)) => {
                s.serialize_str(&format!("{}<redacted>{}", &url[..from], &url[to..]))
            }
            None => s.serialize_str(url),
        }
    }
}

impl<'de> Deserialize<'de> for RedisUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        // The host, after any credentials, up to a port or a database number.
        let host = s
            .strip_prefix("redis://")
            .map(|rest| rest.rsplit_once('@').map_or(rest, |(_, h)| h))
            .map(|h| h.split(['/', '?']).next().unwrap_or(""));
        match host {
            Some(h) if !h.is_empty() && !h.starts_with(':') => Ok(RedisUrl(s)),
            Some(_) => Err(serde::de::Error::custom(format!(
                "`{s}`: a Redis URL needs a host (`redis://host:6379`)"
            ))),
            None => Err(serde::de::Error::custom(format!(
                "`{s}`: a Redis URL starts with `redis://` (TLS to Redis is not built in)"
            ))),
        }
    }
}

fn redis_urls<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<RedisUrl>, D::Error> {
    let v = Vec::<RedisUrl>::deserialize(d)?;
    if v.is_empty() || v.len() > MAX_STORE_URLS {
        return Err(serde::de::Error::custom(format!(
            "1 to {MAX_STORE_URLS} URLs, got {}",
            v.len()
        )));
    }
    Ok(v)
}

fn master_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() || s.len() > 128 || !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(serde::de::Error::custom(format!(
            "`{s}`: a master name is 1 to 128 printable ASCII characters"
        )));
    }
    Ok(s)
}

/// `ratelimit.on_store_error`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStoreError {
    /// Keep serving: each instance enforces the limits on its own (so a fleet of N
    /// admits up to N times the limit while the store is down).
    #[default]
    Allow,
    /// Refuse requests that need the store (503) until it is back.
    Deny,
}

/// `ratelimit.rules[].action`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Answer 429.
    #[default]
    Block,
    /// Let the request through and raise a `ratelimit` event.
    Monitor,
}

/// `ratelimit.rules[].algorithm`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// `rate` tokens per `per`, up to `burst` at once (GCRA: one timestamp per key).
    #[default]
    TokenBucket,
    /// At most `rate` requests in any window of length `per` (two-window estimate).
    SlidingWindow,
}

/// One `ratelimit.rules[]` entry.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// Rule name (unique): metrics, events and the `RateLimit` headers name it.
    pub name: Spanned<String>,
    /// Routes the rule applies to; empty = every route.
    #[serde(default)]
    pub routes: Vec<Spanned<String>>,
    /// Host: exact, `*.suffix` or `*` (default).
    #[serde(default = "any_host")]
    pub host: Spanned<String>,
    /// Path: `{ prefix: /api/ }` or `{ template: /users/{id}/orders }`; default every path.
    #[serde(default)]
    pub path: Option<PathConfig>,
    /// Methods; empty = every method.
    #[serde(default)]
    pub methods: Vec<MethodName>,
    /// What a request is counted against: any combination of `ip`, `route`, `path`,
    /// `template`, `{ header: NAME }`, `{ claim: NAME }`. Default `[ip]`.
    #[serde(default = "ip_key")]
    pub key: Vec<KeyPart>,
    /// Token bucket (default) or sliding window.
    #[serde(default)]
    pub algorithm: Algorithm,
    /// Requests allowed per `per`.
    #[serde(deserialize_with = "positive_u32")]
    pub rate: u32,
    /// The period `rate` is counted over.
    #[serde(with = "positive_duration")]
    pub per: Duration,
    /// Token bucket: requests allowed at once (default `rate`).
    #[serde(default, deserialize_with = "opt_positive_u32")]
    pub burst: Option<u32>,
    /// `block` (429, default) or `monitor` (event only).
    #[serde(default)]
    pub action: Action,
}

fn any_host() -> Spanned<String> {
    let unknown = serde_saphyr::Location::UNKNOWN;
    Spanned::new("*".into(), unknown, unknown)
}
fn ip_key() -> Vec<KeyPart> {
    vec![KeyPart::Ip]
}

/// `ratelimit.rules[].path`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum PathConfig {
    /// Paths starting with this.
    Prefix(#[serde(deserialize_with = "absolute_path")] String),
    /// Paths of this shape: `{name}` stands for one non-empty segment.
    Template(#[serde(deserialize_with = "absolute_path")] String),
}

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum KeyPart {
    /// The client IP (after the listener's trusted `X-Forwarded-For` hops).
    Ip,
    /// The matched route.
    Route,
    /// The rule's path template, or the request path for other rules.
    Path,
    /// The request path's template as API discovery writes it (`/users/42` and
    /// `/users/7` are both `/users/{id}`): a bucket per endpoint without listing them.
    Template,
    /// A request header's value (absent = empty).
    Header(HeaderName),
    /// A claim of the JWT verified by request authentication (absent = empty).
    Claim(String),
}

/// A header name, checked when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderName(pub http::HeaderName);

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::HeaderName::from_bytes(s.as_bytes())
            .map(HeaderName)
            .map_err(|_| serde::de::Error::custom(format!("`{s}` is not a header name")))
    }
}

impl Serialize for HeaderName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

/// An HTTP method, checked when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MethodName(pub http::Method);

impl<'de> Deserialize<'de> for MethodName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        http::Method::from_bytes(s.to_ascii_uppercase().as_bytes())
            .map(MethodName)
            .map_err(|_| serde::de::Error::custom(format!("`{s}` is not an HTTP method")))
    }
}

impl Serialize for MethodName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.0.as_str())
    }
}

/// `ratelimit.bans`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BanConfig {
    /// Blocks (by any engine) within `within` that ban an IP; 0 = no automatic bans.
    #[serde(default = "default_after_blocks")]
    pub after_blocks: u32,
    /// The window blocks are counted over.
    #[serde(default = "default_within", with = "positive_duration")]
    pub within: Duration,
    /// How long an automatic ban lasts.
    #[serde(default = "default_ban_for", with = "positive_duration")]
    pub ban_for: Duration,
    /// A file of IPs and CIDRs (one a line, `#` comments) that are never banned,
    /// limited or challenged. Re-read when it changes.
    #[serde(default)]
    pub allow_file: Option<String>,
    /// A file of IPs and CIDRs refused with 403. Re-read when it changes.
    #[serde(default)]
    pub deny_file: Option<String>,
}

fn default_after_blocks() -> u32 {
    20
}
fn default_within() -> Duration {
    Duration::from_secs(60)
}
fn default_ban_for() -> Duration {
    Duration::from_secs(600)
}

/// `ratelimit.challenge`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeConfig {
    /// Routes whose clients must solve the challenge.
    pub routes: Vec<Spanned<String>>,
    /// Leading zero bits the proof of work needs (each bit doubles the work; 16 takes
    /// a browser well under a second). 1 to 32.
    #[serde(default = "default_difficulty", deserialize_with = "difficulty")]
    pub difficulty: u8,
    /// How long a clearance cookie is valid.
    #[serde(default = "default_cookie_ttl", with = "positive_duration")]
    pub ttl: Duration,
    /// What a cookie is bound to: the client `ip` (default) or its `user_agent`.
    #[serde(default)]
    pub bind: Binding,
    /// HMAC keys: the first signs, all verify (rotation: add the new key first, drop
    /// the old one after `ttl`). Without keys each process draws a random key at start,
    /// which only suits a single instance.
    #[serde(default)]
    pub keys: Vec<ChallengeKey>,
    /// Requests that skip the challenge.
    #[serde(default)]
    pub exempt: Exemptions,
}

fn default_difficulty() -> u8 {
    16
}
fn default_cookie_ttl() -> Duration {
    Duration::from_secs(3600)
}

/// `ratelimit.challenge.bind`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Binding {
    /// The client IP.
    #[default]
    Ip,
    /// The `User-Agent` header.
    UserAgent,
}

/// One `ratelimit.challenge.keys[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChallengeKey {
    /// Key id, written in the cookie (letters, digits, `-`, `_`).
    #[serde(deserialize_with = "key_id")]
    pub id: String,
    /// The secret (at least 32 bytes; use `${env:...}` or `${file:...}` substitution).
    #[serde(deserialize_with = "key_secret")]
    pub secret: String,
}

/// `ratelimit.challenge.exempt`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Exemptions {
    /// Requests carrying any of these headers (any value).
    #[serde(default)]
    pub headers: Vec<HeaderName>,
    /// Requests whose `Authorization: Bearer` token is one of these.
    #[serde(default)]
    pub tokens: Vec<String>,
    /// Requests whose path starts with one of these.
    #[serde(default)]
    pub paths: Vec<String>,
}

fn positive_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = u32::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("must be at least 1"));
    }
    Ok(n)
}

fn opt_positive_u32<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    positive_u32(d).map(Some)
}

fn positive_usize<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let n = usize::deserialize(d)?;
    if n == 0 {
        return Err(serde::de::Error::custom("must be at least 1"));
    }
    Ok(n)
}

fn difficulty<'de, D: Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let n = u8::deserialize(d)?;
    if !(1..=32).contains(&n) {
        return Err(serde::de::Error::custom(format!(
            "difficulty must be 1 to 32 bits, got {n}"
        )));
    }
    Ok(n)
}

fn absolute_path<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if !s.starts_with('/') {
        return Err(serde::de::Error::custom(format!(
            "`{s}`: a path must start with `/`"
        )));
    }
    Ok(s)
}

fn key_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty()
        || s.len() > 32
        || !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(serde::de::Error::custom(format!(
            "`{s}`: a key id is 1 to 32 letters, digits, `-` or `_`"
        )));
    }
    Ok(s)
}

fn key_secret<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.len() < 32 {
        return Err(serde::de::Error::custom(format!(
            "a challenge secret needs at least 32 bytes, got {}",
            s.len()
        )));
    }
    Ok(s)
}

/// A duration that must not be zero.
mod positive_duration {
    use std::time::Duration;

    use serde::{Deserializer, Serializer};

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = moat_config::duration::deserialize(d)?;
        if v.is_zero() {
            return Err(serde::de::Error::custom("must be longer than 0s"));
        }
        Ok(v)
    }

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        moat_config::duration::serialize(d, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_urls_are_written_without_their_password() {
        for (url, shown) in [
            (
                "redis://:s3cret@cache:6379/0",
                "redis://:<redacted>@cache:6379/0",
            ),
            ("redis://moat:s3cret@cache", "redis://moat:<redacted>@cache"),
            ("redis://moat@cache:6379", "redis://moat@cache:6379"),
            (
                "redis://cache:6379/0?x=a:b@c",
                "redis://cache:6379/0?x=a:b@c",
            ),
        ] {
            let v = serde_json::to_value(RedisUrl(url.into())).unwrap();
            assert_eq!(v, shown, "{url}");
        }
    }
}
