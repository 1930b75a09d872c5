//! API discovery: an [`AfterResponsePhase`] that samples exchanges, extracts
//! their schemas on a background thread and keeps the API inventory.
//!
//! Request thread cost:
//! - [`wants_bodies`](AfterResponsePhase::wants_bodies): a non-allocating hash of the
//!   path template, one atomic load, and for sampled candidates one short lock of a
//!   sharded map. Bodies are asked for at most once per `sample_interval` per
//!   (method, template) and at most `max_samples_per_sec` times per second overall.
//! - [`after_response`](AfterResponsePhase::after_response): one `try_send` of the
//!   `Arc<Exchange>` into a bounded queue; when full the exchange is dropped and counted.
//!   It does not wake the worker per exchange (a futex call and two context
//!   switches on the core the proxy shares with the worker): only the first
//!   exchange after the worker went idle wakes it; it then takes the queue every
//!   [`DRAIN_INTERVAL`] until the queue stays empty, and a push that finds the
//!   queue half full wakes it early.
//!
//! The worker counts every exchange it receives in the inventory and extracts
//! schemas when the (method, template, status) window has expired (at most once
//! per `sample_interval`, or again when this exchange brings bodies and the last
//! bodies for that key are older than the window), under the same global cap.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use moat_core::{AfterResponsePhase, BodyNeed, DecodeLimits, Exchange, RequestCtx};
use serde::{Deserialize, Serialize};

use crate::inventory::{flush_dirty, load_into, Inventory, InventoryStore, Observation, Sample};
use crate::scanner::Scanners;
use crate::schema::{from_json, from_multimap, from_string_map, Node};
use crate::template::{template, template_hash};
use crate::DiscoveryError;

/// How long the busy worker lets exchanges pile up in the queue before taking them all.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(50);

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
    /// Exchanges waiting for the worker; more are dropped and counted (default 1024).
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
    epoch: Instant,
    tat_ns: AtomicU64,
    period_ns: u64,
    burst_ns: u64,
}

impl RateLimiter {
    fn new(rate: u32) -> Self {
        let period_ns = 1_000_000_000 / rate.max(1) as u64;
        RateLimiter {
            epoch: Instant::now(),
            tat_ns: AtomicU64::new(0),
            period_ns,
            burst_ns: period_ns * rate.max(1) as u64,
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn available(&self) -> bool {
        let now = self.now();
        let tat = self.tat_ns.load(Ordering::Relaxed).max(now);
        tat + self.period_ns <= now + self.burst_ns
    }

    fn try_acquire(&self) -> bool {
        let now = self.now();
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
    /// Exchanges handed to `after_response`.
    pub received: u64,
    /// Exchanges dropped because the queue was full.
    pub dropped: u64,
    /// Exchanges the worker has processed.
    pub processed: u64,
    /// Exchanges whose schemas were extracted.
    pub sampled: u64,
    /// Requests whose bodies were asked for.
    pub body_requests: u64,
    /// Extractions skipped by the global cap.
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
    dropped: AtomicU64,
    processed: AtomicU64,
    sampled: AtomicU64,
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
            dropped: l(&self.dropped),
            processed: l(&self.processed),
            sampled: l(&self.sampled),
            body_requests: l(&self.body_requests),
            rate_limited: l(&self.rate_limited),
            endpoints_dropped: l(&self.endpoints_dropped),
            store_errors: l(&self.store_errors),
            schemas_dropped: l(&self.schemas_dropped),
        }
    }
}

/// API discovery. Create with [`Discovery::start`], register as the proxy's
/// `Arc<dyn AfterResponsePhase>`, serve [`apis_endpoint`] on `GET /v1/apis`.
pub struct Discovery {
    cfg: DiscoveryConfig,
    tx: Sender<Arc<Exchange>>,
    /// Wakes the napping worker early (a token channel of capacity 1).
    wake: Sender<()>,
    /// Queue depth at which `after_response` wakes the worker early.
    wake_depth: usize,
    stop: Mutex<Option<Sender<()>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
    counters: Arc<Counters>,
    inventory: Arc<Mutex<Inventory>>,
    body_limiter: RateLimiter,
    body_windows: Vec<Mutex<HashMap<u64, Instant>>>,
    inventory_path: PathBuf,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("inventory_path", &self.inventory_path)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Discovery {
    /// Validates `cfg`, loads the inventory (relative path resolved against
    /// `base_dir`) and starts the worker thread.
    pub fn start(cfg: &DiscoveryConfig, base_dir: &Path) -> Result<Arc<Discovery>, DiscoveryError> {
        cfg.validate()?;
        let inventory_path = base_dir.join(&cfg.inventory);
        let store = InventoryStore::open(&inventory_path)?;
        let mut inv = Inventory::new(cfg.max_endpoints, cfg.max_schema_weight);
        load_into(&mut inv, &store)?;
        let inventory = Arc::new(Mutex::new(inv));
        let counters = Arc::new(Counters::default());
        let (tx, rx) = bounded(cfg.queue_capacity);
        let (stop_tx, stop_rx) = bounded(1);
        let (wake_tx, wake_rx) = bounded(1);
        let worker = Worker {
            rx,
            stop: stop_rx,
            wake: wake_rx,
            counters: counters.clone(),
            inventory: inventory.clone(),
            store,
            scanners: Scanners::builtin(),
            windows: HashMap::new(),
            limiter: RateLimiter::new(cfg.max_samples_per_sec),
            cfg: cfg.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("moat-discovery".into())
            .spawn(move || worker.run())
            .map_err(DiscoveryError::Thread)?;
        Ok(Arc::new(Discovery {
            cfg: cfg.clone(),
            tx,
            wake: wake_tx,
            wake_depth: (cfg.queue_capacity / 2).max(1),
            stop: Mutex::new(Some(stop_tx)),
            worker: Mutex::new(Some(handle)),
            counters,
            inventory,
            body_limiter: RateLimiter::new(cfg.max_samples_per_sec),
            body_windows: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            inventory_path,
        }))
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &DiscoveryConfig {
        &self.cfg
    }

    /// The inventory database file.
    pub fn inventory_path(&self) -> &Path {
        &self.inventory_path
    }

    /// Counters.
    pub fn stats(&self) -> DiscoveryStats {
        self.counters.snapshot()
    }

    /// Exchanges waiting for the worker.
    pub fn queue_depth(&self) -> usize {
        self.tx.len()
    }

    /// Total weight of the inventory's schemas (see `max_schema_weight`).
    pub fn schema_weight(&self) -> usize {
        self.inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .weight()
    }

    /// A copy of every endpoint, sorted by path then method.
    pub fn endpoints(&self) -> Vec<crate::inventory::Endpoint> {
        self.inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .endpoints()
    }

    /// Stops the worker after it has processed everything queued and written
    /// the inventory. Later exchanges are dropped and counted. Idempotent.
    pub fn shutdown(&self) {
        drop(self.stop.lock().unwrap_or_else(|p| p.into_inner()).take());
        let handle = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("the discovery worker panicked");
            }
        }
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl AfterResponsePhase for Discovery {
    fn name(&self) -> &'static str {
        "discovery"
    }

    fn wants_bodies(&self, _ctx: &RequestCtx, req: &http::request::Parts) -> BodyNeed {
        if !self.body_limiter.available() {
            return BodyNeed::None;
        }
        let h = template_hash(req.method.as_str(), req.uri.path());
        let now = Instant::now();
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
        if !self.body_limiter.try_acquire() {
            return BodyNeed::None;
        }
        map.insert(h, now);
        self.counters.body_requests.fetch_add(1, Ordering::Relaxed);
        BodyNeed::Buffer(self.cfg.max_body_bytes as usize)
    }

    fn after_response(&self, exchange: Arc<Exchange>) {
        self.counters.received.fetch_add(1, Ordering::Relaxed);
        if self.tx.try_send(exchange).is_err() {
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
        } else if self.tx.len() >= self.wake_depth {
            // Full token channel: a wake-up is already pending.
            let _ = self.wake.try_send(());
        }
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

#[derive(Debug, Default, Clone, Copy)]
struct Window {
    last_any: Option<Instant>,
    last_body: Option<Instant>,
}

struct Worker {
    rx: Receiver<Arc<Exchange>>,
    stop: Receiver<()>,
    wake: Receiver<()>,
    counters: Arc<Counters>,
    inventory: Arc<Mutex<Inventory>>,
    store: InventoryStore,
    scanners: Scanners,
    windows: HashMap<(String, String, u16), Window>,
    limiter: RateLimiter,
    cfg: DiscoveryConfig,
}

impl Worker {
    fn run(mut self) {
        let mut last_flush = Instant::now();
        // Exchanges arrived since the worker last found the queue empty.
        let mut busy = false;
        loop {
            let flush_in = self.cfg.flush_interval.saturating_sub(last_flush.elapsed());
            let mut stopping = false;
            if busy {
                // Nap: nobody waits on the queue, so pushes do not wake the worker.
                select! {
                    recv(self.stop) -> _ => stopping = true,
                    recv(self.wake) -> _ => {}
                    default(DRAIN_INTERVAL.min(flush_in)) => {}
                }
                // At most one queue's worth, so a flood cannot hold off the flush.
                let mut taken = 0;
                while taken < self.cfg.queue_capacity {
                    let Ok(ex) = self.rx.try_recv() else { break };
                    self.process(&ex);
                    taken += 1;
                }
                busy = taken > 0;
            } else {
                // Idle: the first exchange wakes the worker.
                select! {
                    recv(self.rx) -> msg => match msg {
                        Ok(ex) => {
                            self.process(&ex);
                            busy = true;
                        }
                        Err(_) => stopping = true,
                    },
                    recv(self.stop) -> _ => stopping = true,
                    default(flush_in) => {}
                }
            }
            if stopping {
                while let Ok(ex) = self.rx.try_recv() {
                    self.process(&ex);
                }
                self.flush();
                return;
            }
            if last_flush.elapsed() >= self.cfg.flush_interval {
                self.flush();
                last_flush = Instant::now();
            }
        }
    }

    fn flush(&mut self) {
        if let Err(e) = flush_dirty(&self.inventory, &mut self.store) {
            self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("API inventory: {e}");
        }
    }

    /// Whether this exchange is sampled; updates the window.
    fn due(&mut self, method: &str, path: &str, status: u16, has_body: bool) -> bool {
        let now = Instant::now();
        let window = self.cfg.sample_interval;
        let expired = |t: Option<Instant>| t.is_none_or(|t| now.duration_since(t) >= window);
        let key = (method.to_string(), path.to_string(), status);
        if !self.windows.contains_key(&key) && self.windows.len() >= self.cfg.max_sampler_keys {
            self.windows
                .retain(|_, w| !(expired(w.last_any) && expired(w.last_body)));
            if self.windows.len() >= self.cfg.max_sampler_keys {
                return false;
            }
        }
        let w = self.windows.entry(key).or_default();
        let take = expired(w.last_any) || (has_body && expired(w.last_body));
        if take {
            w.last_any = Some(now);
            if has_body {
                w.last_body = Some(now);
            }
        }
        take
    }

    fn process(&mut self, ex: &Exchange) {
        self.counters.processed.fetch_add(1, Ordering::Relaxed);
        let method = ex.request.method.as_str();
        let path = template(ex.request.uri.path());
        let status = ex.status.as_u16();
        let has_body = ex.request_body.is_some() || ex.response_body.is_some();
        let mut sample = None;
        if self.due(method, &path, status, has_body) {
            if self.limiter.try_acquire() {
                sample = Some(extract(
                    ex,
                    &self.scanners,
                    self.cfg.max_body_bytes as usize,
                ));
                self.counters.sampled.fetch_add(1, Ordering::Relaxed);
            } else {
                self.counters.rate_limited.fetch_add(1, Ordering::Relaxed);
            }
        }
        let auth = auth_kinds(ex);
        let n = auth.iter().flatten().count();
        let mut kinds: [&'static str; 2] = ["", ""];
        for (slot, k) in kinds.iter_mut().zip(auth.iter().flatten()) {
            *slot = k;
        }
        let obs = Observation {
            method,
            path: &path,
            route: &ex.ctx.route,
            status,
            now_ms: now_ms(),
            auth: &kinds[..n],
        };
        let res = self
            .inventory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(obs, sample);
        match res {
            None => {
                self.counters
                    .endpoints_dropped
                    .fetch_add(1, Ordering::Relaxed);
            }
            Some(refused) => {
                self.counters
                    .schemas_dropped
                    .fetch_add(refused as u64, Ordering::Relaxed);
            }
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Authentication seen on an exchange: `jwt` (verified token, or an
/// `Authorization: Bearer` header) and `mtls` (client certificate).
pub fn auth_kinds(ex: &Exchange) -> [Option<&'static str>; 2] {
    let bearer = ex
        .request
        .headers
        .get_all(http::header::AUTHORIZATION)
        .iter()
        .any(|v| {
            v.as_bytes()
                .get(..7)
                .is_some_and(|p| p.eq_ignore_ascii_case(b"bearer "))
        });
    let jwt = ex.ctx.auth.is_some() || bearer;
    let mtls = ex.ctx.conn.tls.as_ref().is_some_and(|t| t.peer.is_some());
    [jwt.then_some("jwt"), mtls.then_some("mtls")]
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
