//! API discovery: an [`AfterResponsePhase`] that samples exchanges, and the
//! pure work done on them afterwards: schema extraction ([`Discovery::process`])
//! and the in-memory inventory ([`Discovery::flush`] hands its changes to an
//! [`InventorySink`]). Sampled exchanges leave the request path through a
//! [`SampleQueue`]; the thread that drains it and the SQLite file behind the
//! inventory are moat-inventory's.
//!
//! Request thread cost:
//! - [`wants_bodies`](AfterResponsePhase::wants_bodies): a keyed, non-allocating hash
//!   of the path template, one atomic load, and one short lock of a sharded map.
//!   Bodies are asked for at most once per `sample_interval` per (method, template)
//!   and at most `max_samples_per_sec` times per second overall.
//! - [`after_response`](AfterResponsePhase::after_response): the key of (method,
//!   template, status), derived from the hash `wants_bodies` left in the request's
//!   slot (no second walk of the path), one short lock of a sharded map, and the request
//!   counted in its slot. When the slot's window has expired (at most once per
//!   `sample_interval`, or again when this request brings bodies and the slot's
//!   last bodies are older than the window) and the global cap allows, the
//!   exchange is copied and, once the response has been sent
//!   ([`Finished::after_sent`]), pushed with one non-blocking
//!   [`SampleQueue::try_push`] into a bounded queue; when full the sample is
//!   dropped and counted. (moat-inventory's queue wakes its worker on the first
//!   sample after the worker went idle; the worker then takes the queue at a
//!   fixed interval until it stays empty, and a push that finds the queue half
//!   full wakes it early.)
//!
//! The worker calls [`Discovery::process`] for each sample (schemas extracted
//! and merged into the inventory) and [`Discovery::flush`] every
//! `flush_interval`: the counts kept in the slots are folded into the
//! inventory (as whenever it is read) and the changed endpoints handed to the
//! [`InventorySink`].

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
// Sampling windows and rates are seconds long: the coarse clock is precise enough
// and costs no TSC read per request (see moat_core::clock).
use moat_core::clock::{unix_millis, CoarseInstant};
use std::time::Duration;

use moat_core::{AfterResponsePhase, BodyNeed, DecodeLimits, Exchange, Finished, RequestCtx};
use serde::{Deserialize, Serialize};

use crate::inventory::{Endpoint, Inventory, Observation, Sample};
use crate::scanner::Scanners;
use crate::schema::{from_json, from_multimap, from_string_map, Node};
use crate::template::{hash_template, template};
use crate::DiscoveryError;

/// Where the sampler hands a sampled exchange once its response has been sent:
/// a bounded queue drained off the request path (moat-inventory's worker).
pub trait SampleQueue: Send + Sync {
    /// Queues one sample without blocking. False when it is refused (the queue
    /// is full, or its worker has stopped): the sample is dropped and counted.
    fn try_push(&self, sample: Arc<Exchange>) -> bool;
    /// Samples waiting.
    fn depth(&self) -> usize;
}

/// Where [`Discovery::flush`] writes the endpoints changed since the last flush
/// (moat-inventory's SQLite store).
pub trait InventorySink {
    /// Why a write failed.
    type Error: std::fmt::Display;
    /// Stores (inserts or replaces) these endpoints, all or none.
    fn save(&mut self, endpoints: &[Endpoint]) -> Result<(), Self::Error>;
}

/// The `discovery:` section of moat.yaml.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiscoveryConfig {
    /// Whether the proxy runs discovery (default false; the quickstart turns it on).
    pub enabled: bool,
    /// Window per (method, template, status): at most one extraction per window (default 30s).
    #[serde(with = "moat_config::duration")]
    pub sample_interval: Duration,
    /// Global cap on extractions (and on requests whose bodies are kept) per second (default 50).
    pub max_samples_per_sec: u32,
    /// Samples waiting for the worker; more are dropped and counted (default 1024).
    pub queue_capacity: usize,
    /// Largest request or response body kept for a sample, after decoding (default 64KiB).
    #[serde(with = "moat_config::byte_size")]
    pub max_body_bytes: u64,
    /// Inventory database, relative to the config file's directory (default `moat-apis.db`).
    pub inventory: PathBuf,
    /// Maximum endpoints in the inventory; requests to new endpoints past it are counted only (default 10000).
    pub max_endpoints: usize,
    /// Maximum keys of each sampler map (default 4096).
    pub max_sampler_keys: usize,
    /// Total weight of the inventory's schemas (one per node plus one per 64 bytes
    /// of keys, about 100 bytes of memory each); merges past it are refused and
    /// counted (default 1000000; one schema is further capped at 10000).
    pub max_schema_weight: usize,
    /// How often changed endpoints are written to the inventory database (default 5s).
    #[serde(with = "moat_config::duration")]
    pub flush_interval: Duration,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            enabled: false,
            sample_interval: Duration::from_secs(30),
            max_samples_per_sec: 50,
            queue_capacity: 1024,
            max_body_bytes: 64 << 10,
            inventory: PathBuf::from("moat-apis.db"),
            max_endpoints: 10_000,
            max_sampler_keys: 4096,
            max_schema_weight: 1_000_000,
            flush_interval: Duration::from_secs(5),
        }
    }
}

impl DiscoveryConfig {
    /// The quickstart's configuration: enabled with defaults.
    pub fn quickstart() -> Self {
        DiscoveryConfig {
            enabled: true,
            ..DiscoveryConfig::default()
        }
    }

    /// Checks every limit.
    pub fn validate(&self) -> Result<(), DiscoveryError> {
        let err = |m: &str| Err(DiscoveryError::Config(m.to_string()));
        if self.sample_interval > Duration::from_secs(86_400) {
            return err("sample_interval must be at most 1d (0 samples every request)");
        }
        if self.max_samples_per_sec == 0 || self.max_samples_per_sec > 100_000 {
            return err("max_samples_per_sec must be between 1 and 100000");
        }
        if self.queue_capacity == 0 || self.queue_capacity > 1 << 20 {
            return err("queue_capacity must be between 1 and 1048576");
        }
        if self.max_body_bytes > 16 << 20 {
            return err("max_body_bytes must be at most 16MiB");
        }
        if self.max_endpoints == 0 || self.max_endpoints > 1_000_000 {
            return err("max_endpoints must be between 1 and 1000000");
        }
        if self.max_sampler_keys < 16 || self.max_sampler_keys > 1 << 20 {
            return err("max_sampler_keys must be between 16 and 1048576");
        }
        if self.max_schema_weight == 0 || self.max_schema_weight > 100_000_000 {
            return err("max_schema_weight must be between 1 and 100000000");
        }
        if self.flush_interval < Duration::from_millis(10)
            || self.flush_interval > Duration::from_secs(3600)
        {
            return err("flush_interval must be between 10ms and 1h");
        }
        if self.inventory.as_os_str().is_empty() {
            return err("inventory must not be empty");
        }
        Ok(())
    }
}

/// GCRA rate limiter on one atomic: at most `rate` per second, bursts of `rate`.
#[derive(Debug)]
struct RateLimiter {
    epoch: CoarseInstant,
    tat_ns: AtomicU64,
    period_ns: u64,
    burst_ns: u64,
}

impl RateLimiter {
    fn new(rate: u32) -> Self {
        let period_ns = 1_000_000_000 / rate.max(1) as u64;
        RateLimiter {
            epoch: CoarseInstant::now(),
            tat_ns: AtomicU64::new(0),
            period_ns,
            burst_ns: period_ns * rate.max(1) as u64,
        }
    }

    /// `now` in nanoseconds since the limiter's epoch (the caller's clock
    /// reading, shared with its other uses of the time).
    fn nanos(&self, now: CoarseInstant) -> u64 {
        now.duration_since(self.epoch).as_nanos() as u64
    }

    fn available(&self, now: CoarseInstant) -> bool {
        let now = self.nanos(now);
        let tat = self.tat_ns.load(Ordering::Relaxed).max(now);
        tat + self.period_ns <= now + self.burst_ns
    }

    fn try_acquire(&self, now: CoarseInstant) -> bool {
        let now = self.nanos(now);
        let mut cur = self.tat_ns.load(Ordering::Relaxed);
        loop {
            let new = cur.max(now) + self.period_ns;
            if new > now + self.burst_ns {
                return false;
            }
            match self
                .tat_ns
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }
}

const SHARDS: usize = 16;

/// Counters exposed by [`Discovery::stats`].
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DiscoveryStats {
    /// Requests seen by `after_response`.
    pub received: u64,
    /// Requests not counted because every sampler slot was in use (see `max_sampler_keys`).
    pub untracked: u64,
    /// Samples dropped because the queue was full (the requests are still counted).
    pub dropped: u64,
    /// Samples queued for the worker.
    pub sampled: u64,
    /// Samples whose schemas the worker has extracted.
    pub processed: u64,
    /// Requests whose bodies were asked for.
    pub body_requests: u64,
    /// Samples skipped by the global cap.
    pub rate_limited: u64,
    /// Requests to new endpoints not recorded because the inventory was full.
    pub endpoints_dropped: u64,
    /// Inventory write failures.
    pub store_errors: u64,
    /// Schemas not merged because of the weight limits.
    pub schemas_dropped: u64,
}

#[derive(Debug, Default)]
struct Counters {
    received: AtomicU64,
    untracked: AtomicU64,
    dropped: AtomicU64,
    sampled: AtomicU64,
    processed: AtomicU64,
    body_requests: AtomicU64,
    rate_limited: AtomicU64,
    endpoints_dropped: AtomicU64,
    store_errors: AtomicU64,
    schemas_dropped: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> DiscoveryStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        DiscoveryStats {
            received: l(&self.received),
            untracked: l(&self.untracked),
            dropped: l(&self.dropped),
            sampled: l(&self.sampled),
            processed: l(&self.processed),
            body_requests: l(&self.body_requests),
            rate_limited: l(&self.rate_limited),
            endpoints_dropped: l(&self.endpoints_dropped),
            store_errors: l(&self.store_errors),
            schemas_dropped: l(&self.schemas_dropped),
        }
    }
}

/// Map keys that are already random hashes: used as they are.
#[derive(Default, Clone, Copy)]
struct PreHashed(u64);

impl Hasher for PreHashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed; fold anything else in for completeness.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type KeyMap<V> = HashMap<u64, V, BuildHasherDefault<PreHashed>>;

/// Authentication kinds, in the order of [`Tally::auth`].
const AUTH_KINDS: [&str; 3] = ["none", "jwt", "mtls"];

/// Requests to one (method, template, status) counted on the request thread
/// since the worker last folded them into the inventory.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    count: u64,
    /// Per [`AUTH_KINDS`].
    auth: [u64; 3],
    first: Option<CoarseInstant>,
    last: Option<CoarseInstant>,
}

/// One (method, template, status) key of the request-side sampler: its
/// sampling windows and its uncounted requests.
#[derive(Debug)]
struct Slot {
    method: http::Method,
    template: Box<str>,
    status: u16,
    route: Arc<str>,
    last_any: Option<CoarseInstant>,
    last_body: Option<CoarseInstant>,
    tally: Tally,
}

impl Slot {
    /// Whether a request with (or without) bodies is to be sampled now.
    fn due(&self, now: CoarseInstant, has_body: bool, window: Duration) -> bool {
        let expired = |t: Option<CoarseInstant>| t.is_none_or(|t| now.duration_since(t) >= window);
        expired(self.last_any) || (has_body && expired(self.last_body))
    }

    /// Whether the slot holds nothing the sampler or the inventory still needs.
    fn idle(&self, now: CoarseInstant, window: Duration) -> bool {
        let expired = |t: Option<CoarseInstant>| t.is_none_or(|t| now.duration_since(t) >= window);
        self.tally.count == 0 && expired(self.last_any) && expired(self.last_body)
    }
}

/// API discovery. Create with [`Discovery::new`] (moat-inventory's
/// `DiscoveryWorker::start` does, with its queue and its stored inventory),
/// register as the proxy's `Arc<dyn AfterResponsePhase>`, serve
/// [`apis_endpoint`] on `GET /v1/apis`.
pub struct Discovery {
    cfg: DiscoveryConfig,
    /// Where sampled exchanges go once their response has been sent.
    queue: Arc<dyn SampleQueue>,
    shared: Arc<Shared>,
    /// The sensitive-data scanners run on sampled values.
    scanners: Scanners,
    /// Randomly keyed: clients cannot aim paths at another endpoint's key.
    keys: RandomState,
    sample_limiter: RateLimiter,
    body_limiter: RateLimiter,
    body_windows: Vec<Mutex<KeyMap<CoarseInstant>>>,
}

/// What the request threads, the worker and the admin readers share.
struct Shared {
    counters: Counters,
    inventory: Mutex<Inventory>,
    slots: Vec<Mutex<KeyMap<Slot>>>,
}

impl Shared {
    /// Moves the requests counted in the sampler's slots into the inventory.
    fn fold(&self) {
        // Unix time of each slot's Instants, from one reading of both clocks.
        let (now, now_unix) = (CoarseInstant::now(), unix_millis());
        let unix = |t: Option<CoarseInstant>| {
            t.map_or(now_unix, |t| {
                now_unix.saturating_sub(now.duration_since(t).as_millis() as u64)
            })
        };
        let mut batch = Vec::new();
        for shard in &self.slots {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            for slot in map.values_mut().filter(|s| s.tally.count > 0) {
                let t = std::mem::take(&mut slot.tally);
                batch.push((
                    slot.method.clone(),
                    slot.template.clone(),
                    slot.status,
                    slot.route.clone(),
                    t,
                ));
            }
        }
        if batch.is_empty() {
            return;
        }
        let mut inv = self.inventory.lock().unwrap_or_else(|p| p.into_inner());
        for (method, template, status, route, t) in &batch {
            let auth: [(&'static str, u64); 3] =
                std::array::from_fn(|i| (AUTH_KINDS[i], t.auth[i]));
            let obs = Observation {
                method: method.as_str(),
                path: template,
                route,
                status: *status,
                count: t.count,
                auth: &auth,
                first_ms: unix(t.first),
                last_ms: unix(t.last),
            };
            if inv.observe(obs, None).is_none() {
                self.counters
                    .endpoints_dropped
                    .fetch_add(t.count, Ordering::Relaxed);
            }
        }
    }
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("inventory", &self.cfg.inventory)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Discovery {
    /// Validates `cfg` and builds the engine over the endpoints of a stored
    /// inventory (`loaded`, as many as `max_endpoints` allows); sampled
    /// exchanges go to `queue`.
    pub fn new(
        cfg: &DiscoveryConfig,
        loaded: Vec<Endpoint>,
        queue: Arc<dyn SampleQueue>,
    ) -> Result<Discovery, DiscoveryError> {
        cfg.validate()?;
        let mut inv = Inventory::new(cfg.max_endpoints, cfg.max_schema_weight);
        for ep in loaded {
            inv.insert_loaded(ep);
        }
        let shared = Arc::new(Shared {
            counters: Counters::default(),
            inventory: Mutex::new(inv),
            slots: (0..SHARDS).map(|_| Mutex::new(KeyMap::default())).collect(),
        });
        Ok(Discovery {
            cfg: cfg.clone(),
            queue,
            shared,
            scanners: Scanners::builtin(),
            keys: RandomState::new(),
            sample_limiter: RateLimiter::new(cfg.max_samples_per_sec),
            body_limiter: RateLimiter::new(cfg.max_samples_per_sec),
            body_windows: (0..SHARDS).map(|_| Mutex::new(KeyMap::default())).collect(),
        })
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &DiscoveryConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> DiscoveryStats {
        self.shared.counters.snapshot()
    }

    /// Samples waiting for the worker.
    pub fn queue_depth(&self) -> usize {
        self.queue.depth()
    }

    /// Total weight of the inventory's schemas (see `max_schema_weight`).
    pub fn schema_weight(&self) -> usize {
        self.shared
            .inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .weight()
    }

    /// A copy of every endpoint, sorted by path then method, counting every
    /// request seen so far.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.shared.fold();
        self.shared
            .inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .endpoints()
    }

    /// Folds the counted requests into the inventory and writes what changed
    /// to `sink`: the number of endpoints written. When the write fails, the
    /// endpoints stay changed (written again at the next flush) and the
    /// failure is counted in [`DiscoveryStats::store_errors`].
    pub fn flush<S: InventorySink>(&self, sink: &mut S) -> Result<usize, S::Error> {
        self.shared.fold();
        let inv = &self.shared.inventory;
        let dirty = inv.lock().unwrap_or_else(|p| p.into_inner()).take_dirty();
        if dirty.is_empty() {
            return Ok(0);
        }
        if let Err(e) = sink.save(&dirty) {
            // Written again at the next flush.
            inv.lock()
                .unwrap_or_else(|p| p.into_inner())
                .mark_dirty(&dirty);
            self.shared
                .counters
                .store_errors
                .fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        Ok(dirty.len())
    }

    /// Extracts a sample's schemas and merges them (the request itself was
    /// counted by the request thread).
    pub fn process(&self, ex: &Exchange) {
        let counters = &self.shared.counters;
        counters.processed.fetch_add(1, Ordering::Relaxed);
        let sample = extract(ex, &self.scanners, self.cfg.max_body_bytes as usize);
        let path = template(ex.request.uri.path());
        let now = unix_millis();
        let obs = Observation {
            method: ex.request.method.as_str(),
            path: &path,
            route: &ex.ctx.route,
            status: ex.status.as_u16(),
            count: 0,
            auth: &[],
            first_ms: now,
            last_ms: now,
        };
        let res = self
            .shared
            .inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(obs, Some(sample));
        // `None` (the inventory is full) is counted with the requests, at the fold.
        if let Some(refused) = res {
            counters
                .schemas_dropped
                .fetch_add(refused as u64, Ordering::Relaxed);
        }
    }

    /// The keyed hash of (method, template of path): the body window's key.
    fn template_key(&self, method: &str, path: &str) -> u64 {
        let mut h = self.keys.build_hasher();
        hash_template(&mut h, method, path);
        h.finish()
    }
}

/// The slot key of (method, template, status) from the template's keyed hash.
///
/// Not a second keyed hash (the path walk and SipHash were half of discovery's
/// request-thread work): `template` is already a keyed hash a client cannot predict,
/// so two templates' keys collide only by chance whatever the statuses; one
/// template's statuses never collide, because the multiplication by an odd constant
/// is injective on `u64`.
fn slot_key(template: u64, status: u16) -> u64 {
    template ^ u64::from(status).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

impl AfterResponsePhase for Discovery {
    fn name(&self) -> &'static str {
        "discovery"
    }

    fn wants_bodies(&self, ctx: &mut RequestCtx, req: &http::request::Parts) -> BodyNeed {
        let h = self.template_key(req.method.as_str(), req.uri.path());
        // After the response, the slot key is derived from it (`slot_key`).
        ctx.slots.discovery = Some(h);
        let now = CoarseInstant::now();
        if !self.body_limiter.available(now) {
            return BodyNeed::None;
        }
        let mut map = self.body_windows[(h as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(t) = map.get(&h) {
            if now.duration_since(*t) < self.cfg.sample_interval {
                return BodyNeed::None;
            }
        } else if map.len() >= self.cfg.max_sampler_keys / SHARDS {
            let window = self.cfg.sample_interval;
            map.retain(|_, t| now.duration_since(*t) < window);
            if map.len() >= self.cfg.max_sampler_keys / SHARDS {
                return BodyNeed::None;
            }
        }
        if !self.body_limiter.try_acquire(now) {
            return BodyNeed::None;
        }
        map.insert(h, now);
        self.shared
            .counters
            .body_requests
            .fetch_add(1, Ordering::Relaxed);
        BodyNeed::Buffer(self.cfg.max_body_bytes as usize)
    }

    /// Counts the request in its (method, template, status) slot; when the
    /// slot's window has expired (and the global cap allows), copies the
    /// exchange and queues it for the worker once the response has been sent.
    fn after_response(&self, done: &Finished<'_>) {
        let counters = &self.shared.counters;
        counters.received.fetch_add(1, Ordering::Relaxed);
        let req = done.request;
        let status = done.status.as_u16();
        let template_key = match done.ctx.slots.discovery {
            Some(h) => h,
            None => self.template_key(req.method.as_str(), req.uri.path()),
        };
        let key = slot_key(template_key, status);
        let has_body = done.request_body.is_some() || done.response_body.is_some();
        let auth = auth_kinds(done.ctx, &req.headers);
        let now = CoarseInstant::now();
        let window = self.cfg.sample_interval;
        let mut map = self.shared.slots[(key as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let cap = (self.cfg.max_sampler_keys / SHARDS).max(1);
        if map.len() >= cap && !map.contains_key(&key) {
            map.retain(|_, s| !s.idle(now, window));
            if map.len() >= cap {
                counters.untracked.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let slot = map.entry(key).or_insert_with(|| Slot {
            method: req.method.clone(),
            template: template(req.uri.path()).into(),
            status,
            route: done.ctx.route.clone(),
            last_any: None,
            last_body: None,
            tally: Tally::default(),
        });
        if *slot.route != *done.ctx.route {
            slot.route = done.ctx.route.clone();
        }
        let t = &mut slot.tally;
        t.count += 1;
        t.auth[0] += u64::from(auth == [false, false]);
        t.auth[1] += u64::from(auth[0]);
        t.auth[2] += u64::from(auth[1]);
        t.first.get_or_insert(now);
        t.last = Some(now);
        if !slot.due(now, has_body, window) {
            return;
        }
        if !self.sample_limiter.try_acquire(now) {
            counters.rate_limited.fetch_add(1, Ordering::Relaxed);
            return;
        }
        slot.last_any = Some(now);
        if has_body {
            slot.last_body = Some(now);
        }
        drop(map);
        // Queued once the response has been sent, so the worker never works on
        // an exchange whose response is still on its way.
        let sample = done.exchange();
        let queue = self.queue.clone();
        let shared = self.shared.clone();
        done.after_sent(move || {
            let counters = &shared.counters;
            if !queue.try_push(sample) {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
                return;
            }
            counters.sampled.fetch_add(1, Ordering::Relaxed);
        });
    }
}

/// `GET /v1/apis`: `{"endpoints":[...], "stats":{...}}` (endpoints with their `sensitive` fields).
pub fn apis_endpoint(discovery: &Discovery) -> String {
    let endpoints: Vec<serde_json::Value> =
        discovery.endpoints().iter().map(|e| e.to_json()).collect();
    serde_json::json!({
        "count": endpoints.len(),
        "endpoints": endpoints,
        "stats": discovery.stats(),
    })
    .to_string()
}

/// Authentication seen on a request: `[jwt, mtls]`. JWT is a verified token or
/// an `Authorization: Bearer` header; mTLS is a client certificate.
pub fn auth_kinds(ctx: &RequestCtx, headers: &http::HeaderMap) -> [bool; 2] {
    let bearer = headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .any(|v| {
            v.as_bytes()
                .get(..7)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"bearer "))
        });
    let jwt = ctx.auth.is_some() || bearer;
    let mtls = ctx.conn.tls.as_ref().is_some_and(|t| t.peer.is_some());
    [jwt, mtls]
}

/// Media type of a `Content-Type` header, lowercased, without parameters.
fn media_type(headers: &http::HeaderMap) -> Option<String> {
    let v = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let t = v.split(';').next()?.trim().to_ascii_lowercase();
    (!t.is_empty() && t.len() <= 128).then_some(t)
}

fn is_json(t: &str) -> bool {
    t == "application/json" || t.ends_with("+json") || t == "text/json"
}

fn body_schema(
    headers: &http::HeaderMap,
    body: Option<&bytes::Bytes>,
    media: Option<&str>,
    scanners: &Scanners,
    max: usize,
) -> Option<Node> {
    let body = body?;
    if body.is_empty() {
        return None;
    }
    let media = media?;
    let decoded;
    let bytes: &[u8] = match headers
        .get(http::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"))
    {
        Some(enc) => {
            let limits = DecodeLimits {
                max_output: max.max(1),
                max_ratio: 100,
            };
            decoded = moat_core::body::decode(enc, body, limits).ok()?;
            &decoded
        }
        None => body,
    };
    if bytes.len() > max {
        return None;
    }
    if is_json(media) {
        from_json(bytes, scanners)
    } else if media == "application/x-www-form-urlencoded" {
        let text = std::str::from_utf8(bytes).ok()?;
        Some(form_schema(text, scanners))
    } else {
        None
    }
}

fn decode_component(s: &str) -> String {
    let plus = s.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8_lossy()
        .into_owned()
}

/// Schema of a query string or form body: `{key: [values]}`.
pub fn form_schema(text: &str, scanners: &Scanners) -> Node {
    let pairs: Vec<(String, String)> = text
        .split('&')
        .filter(|p| !p.is_empty())
        .take(4 * crate::schema::MAX_RECORD_NODES)
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode_component(k), decode_component(v))
        })
        .collect();
    from_multimap(
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        scanners,
    )
}

fn header_schema(headers: &http::HeaderMap, skip: &http::HeaderName, scanners: &Scanners) -> Node {
    from_string_map(
        headers
            .iter()
            .filter(|(k, _)| *k != skip)
            .map(|(k, v)| (k.as_str(), v.to_str().unwrap_or(""))),
        scanners,
    )
}

/// Extracts every schema of one exchange. Values are only scanned, never kept.
pub fn extract(ex: &Exchange, scanners: &Scanners, max_body_bytes: usize) -> Sample {
    let query = ex
        .request
        .uri
        .query()
        .filter(|q| !q.is_empty())
        .map(|q| form_schema(q, scanners));
    let req_media = media_type(&ex.request.headers);
    let resp_media = media_type(&ex.response_headers);
    Sample {
        query,
        request_headers: Some(header_schema(
            &ex.request.headers,
            &http::header::COOKIE,
            scanners,
        )),
        request_body: body_schema(
            &ex.request.headers,
            ex.request_body.as_ref(),
            req_media.as_deref(),
            scanners,
            max_body_bytes,
        ),
        request_content_type: req_media
            .clone()
            .filter(|_| ex.request_body.as_ref().is_some_and(|b| !b.is_empty())),
        response_headers: Some(header_schema(
            &ex.response_headers,
            &http::header::SET_COOKIE,
            scanners,
        )),
        response_body: body_schema(
            &ex.response_headers,
            ex.response_body.as_ref(),
            resp_media.as_deref(),
            scanners,
            max_body_bytes,
        ),
        response_content_type: resp_media,
    }
}
