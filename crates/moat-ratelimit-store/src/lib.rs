//! The I/O of moat's rate limits, on a thread of its own so that nothing on the request
//! path ever waits for it.
//!
//! [`Background`] runs once a second: it re-reads the allow/deny list files that
//! changed and forgets expired bans. With a Redis store (`redis`, `redis_cluster` or
//! `redis_sentinel`) it also is the [`LeaseStore`]: lease reservations queued by the
//! engine ([`moat_ratelimit::lease`]) are sent to Redis as one atomic script per key
//! (GCRA on Redis's own clock, so instances' clocks need not agree), concurrently on one
//! multiplexed connection; bans are written to a sorted set (`moat:bans`, score = end
//! of the ban) and the set is read back every second, so every instance refuses the
//! IPs any of them banned.
//!
//! Every operation touches a single key, which is what lets the same code run on a
//! Redis Cluster (each script goes to the node owning its key's slot; the bans are one
//! key, so on one node) and behind Sentinel (the master is asked of the sentinels at
//! each connection, so a reconnection after a failover finds the new one).
//!
//! Failure handling: every Redis call has a deadline (`ratelimit.store_timeout`); a
//! failure marks the store unhealthy (the engine then follows `on_store_error`),
//! fails the queued reservations, and reconnects with exponential backoff (100 ms to
//! 5 s). The queue is bounded: when it is full a reservation fails at once.

#![warn(missing_docs)]

use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use moat_ratelimit::{bans::unix_ms, Ban, Bans, LeaseRequest, LeaseStore, StoreConfig};
use parking_lot::Mutex;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use tokio::sync::mpsc;

/// Reservations and ban updates waiting for the worker.
pub const QUEUE: usize = 8192;

/// Most operations sent to Redis in one batch.
const BATCH: usize = 512;

/// Consecutive timed-out batches after which the store counts as down.
const MAX_SLOW_BATCHES: u32 = 3;

/// A failed batch.
struct Failure {
    /// The connection is gone (not merely slow).
    lost: bool,
    message: String,
}

impl Failure {
    fn timeout(after: Duration) -> Self {
        Failure {
            lost: false,
            message: format!("timed out after {after:?}"),
        }
    }
}

impl From<redis::RedisError> for Failure {
    fn from(e: redis::RedisError) -> Self {
        Failure {
            // A master demoted by a failover answers READONLY: find the new one.
            lost: e.is_io_error()
                || e.is_connection_dropped()
                || e.is_connection_refusal()
                || e.kind() == redis::ErrorKind::ReadOnly,
            message: e.to_string(),
        }
    }
}

/// How the worker reaches Redis.
enum Client {
    /// One server.
    Single(redis::Client),
    /// A Redis Cluster, from seed nodes.
    Cluster(redis::cluster::ClusterClient),
    /// The master Sentinel names (asked again at each connection).
    Sentinel(Box<SentinelClient>),
}

impl Client {
    /// The client for `store`; `None` for the local store.
    fn open(store: &StoreConfig) -> Result<Option<Client>, String> {
        let urls = |v: &[moat_ratelimit::config::RedisUrl]| -> Vec<String> {
            v.iter().map(|u| u.0.clone()).collect()
        };
        Ok(Some(match store {
            StoreConfig::Local => return Ok(None),
            StoreConfig::Redis(url) => Client::Single(
                redis::Client::open(url.0.as_str())
                    .map_err(|e| format!("redis URL `{}`: {e}", url.0))?,
            ),
            StoreConfig::RedisCluster(seeds) => Client::Cluster(
                redis::cluster::ClusterClient::new(urls(seeds))
                    .map_err(|e| format!("redis_cluster: {e}"))?,
            ),
            StoreConfig::RedisSentinel(s) => {
                let node = SentinelNodeConnectionInfo {
                    tls_mode: None,
                    redis_connection_info: Some(redis::RedisConnectionInfo {
                        password: s.password.clone(),
                        ..Default::default()
                    }),
                };
                Client::Sentinel(Box::new(
                    SentinelClient::build(
                        urls(&s.urls),
                        s.master_name.clone(),
                        Some(node),
                        SentinelServerType::Master,
                    )
                    .map_err(|e| format!("redis_sentinel: {e}"))?,
                ))
            }
        }))
    }

    async fn connect(&mut self) -> redis::RedisResult<Conn> {
        Ok(match self {
            Client::Single(c) => Conn::Single(c.get_multiplexed_async_connection().await?),
            Client::Cluster(c) => Conn::Cluster(c.get_async_connection().await?),
            Client::Sentinel(c) => Conn::Single(c.get_async_connection().await?),
        })
    }
}

/// A connection to one server (or the master) or to a cluster; both multiplex, so
/// clones share it.
#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The Redis key of the shared bans.
pub const BANS_KEY: &str = "moat:bans";

/// GCRA for `want` tokens at once: KEYS[1] holds the theoretical arrival time in
/// microseconds of Redis's clock; ARGV = interval (µs), burst, want. Returns
/// `{granted, retry_us}` where `retry_us` is the wait for the next token when fewer
/// than `want` were granted.
const TAKE: &str = r"
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local want = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local capacity = interval * burst
local avail = math.floor((capacity - (tat - now)) / interval)
if avail < 0 then avail = 0 end
local got = math.min(want, avail)
tat = tat + got * interval
if got > 0 then
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
end
local retry = 0
if got < want then
  retry = (tat - now) - (capacity - interval)
  if retry < 1 then retry = 1 end
end
return {got, retry}
";

/// Store counters and latency, for metrics.
#[derive(Debug, Default)]
pub struct StoreMetrics {
    /// Lease reservations answered.
    pub reservations: AtomicU64,
    /// Failed Redis operations (errors and timeouts).
    pub errors: AtomicU64,
    /// Reservations dropped because the queue was full.
    pub queue_full: AtomicU64,
    /// Reconnections.
    pub reconnects: AtomicU64,
    /// Latency of reservation batches: counts at or under each bound of [`LATENCY_BOUNDS_US`].
    latency: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    latency_sum_us: AtomicU64,
}

/// Bounds (µs) of the store latency histogram.
pub const LATENCY_BOUNDS_US: [u64; 8] = [100, 250, 500, 1000, 2500, 5000, 10_000, 50_000];

impl StoreMetrics {
    fn observe(&self, d: Duration) {
        let us = d.as_micros() as u64;
        let i = LATENCY_BOUNDS_US.partition_point(|b| *b < us);
        self.latency[i].fetch_add(1, Relaxed);
        self.latency_sum_us.fetch_add(us, Relaxed);
    }
}

enum Op {
    Reserve(LeaseRequest),
    Ban(Ban),
    Unban(IpAddr),
    /// Read the shared bans back.
    SyncBans,
}

/// The background worker: list reloads, ban expiry, and the Redis store when configured.
pub struct Background {
    tx: Option<mpsc::Sender<Op>>,
    healthy: AtomicBool,
    bans: Mutex<Weak<Bans>>,
    /// Counters and latency.
    pub metrics: StoreMetrics,
    stop: AtomicBool,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// What the thread needs, until it starts.
    not_started: Mutex<Option<Worker>>,
}

/// The Redis client, the queue's receiving end and the operation deadline.
type Worker = (Option<Client>, Option<mpsc::Receiver<Op>>, Duration);

impl std::fmt::Debug for Background {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Background")
            .field("redis", &self.tx.is_some())
            .field("healthy", &self.healthy.load(Relaxed))
            .finish()
    }
}

impl Background {
    /// Starts the worker (at once with a Redis store, else when bans need it).
    pub fn start(store: &StoreConfig, timeout: Duration) -> Result<Arc<Self>, String> {
        let client = Client::open(store)?;
        let (tx, rx) = match client {
            Some(_) => {
                let (tx, rx) = mpsc::channel(QUEUE);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let shared = client.is_some();
        let bg = Arc::new(Background {
            tx,
            healthy: AtomicBool::new(false),
            bans: Mutex::new(Weak::new()),
            metrics: StoreMetrics::default(),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
            not_started: Mutex::new(Some((client, rx, timeout))),
        });
        if shared {
            bg.ensure_running()?;
        }
        Ok(bg)
    }

    /// Starts the thread if it has not started yet. A local store without bans has
    /// nothing to do: it never starts one (an extra thread makes every socket call of a
    /// one-worker gateway a little dearer, see docs/perf.md).
    fn ensure_running(self: &Arc<Self>) -> Result<(), String> {
        let Some((client, rx, timeout)) = self.not_started.lock().take() else {
            return Ok(());
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("rate limit store runtime: {e}"))?;
        let weak = Arc::downgrade(self);
        let thread = std::thread::Builder::new()
            .name("moat-ratelimit".into())
            .spawn(move || rt.block_on(run(weak, client, rx, timeout)))
            .map_err(|e| format!("rate limit store thread: {e}"))?;
        *self.thread.lock() = Some(thread);
        Ok(())
    }

    /// The bans (of the engine now serving) the worker keeps in sync (list reloads,
    /// expiry, and with Redis the shared set).
    pub fn attach(self: &Arc<Self>, bans: Option<&Arc<Bans>>) -> Result<(), String> {
        *self.bans.lock() = bans.map_or_else(Weak::new, Arc::downgrade);
        if bans.is_some() {
            self.ensure_running()?;
        }
        Ok(())
    }

    /// Stops the worker (when `ratelimit:` is removed or changes store).
    pub fn shutdown(&self) {
        self.stop.store(true, Relaxed);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }

    fn send(&self, op: Op) {
        let Some(tx) = &self.tx else {
            if let Op::Reserve(r) = op {
                r.leases.failed(r.hash);
            }
            return;
        };
        if let Err(e) = tx.try_send(op) {
            self.metrics.queue_full.fetch_add(1, Relaxed);
            let op = match e {
                mpsc::error::TrySendError::Full(op) | mpsc::error::TrySendError::Closed(op) => op,
            };
            if let Op::Reserve(r) = op {
                r.leases.failed(r.hash);
            }
        }
    }

    /// Writes the store's metrics in the Prometheus text format.
    pub fn render_metrics(&self, out: &mut String) {
        use std::fmt::Write as _;
        let m = &self.metrics;
        out.push_str("# TYPE moat_ratelimit_store_total counter\n");
        for (what, n) in [
            ("reservations", &m.reservations),
            ("errors", &m.errors),
            ("queue_full", &m.queue_full),
            ("reconnects", &m.reconnects),
        ] {
            let _ = writeln!(
                out,
                "moat_ratelimit_store_total{{what=\"{what}\"}} {}",
                n.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# TYPE moat_ratelimit_store_up gauge\nmoat_ratelimit_store_up {}",
            u8::from(self.healthy())
        );
        out.push_str("# TYPE moat_ratelimit_store_latency_seconds histogram\n");
        let mut cum = 0;
        for (i, b) in LATENCY_BOUNDS_US.iter().enumerate() {
            cum += m.latency[i].load(Relaxed);
            let _ = writeln!(
                out,
                "moat_ratelimit_store_latency_seconds_bucket{{le=\"{}\"}} {cum}",
                *b as f64 / 1e6
            );
        }
        cum += m.latency[LATENCY_BOUNDS_US.len()].load(Relaxed);
        let _ = writeln!(
            out,
            "moat_ratelimit_store_latency_seconds_bucket{{le=\"+Inf\"}} {cum}"
        );
        let _ = writeln!(
            out,
            "moat_ratelimit_store_latency_seconds_sum {}",
            m.latency_sum_us.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "moat_ratelimit_store_latency_seconds_count {cum}");
    }
}

impl LeaseStore for Background {
    fn reserve(&self, req: LeaseRequest) {
        self.send(Op::Reserve(req));
    }

    fn healthy(&self) -> bool {
        self.healthy.load(Relaxed)
    }

    fn ban(&self, ban: &Ban) {
        self.send(Op::Ban(ban.clone()));
    }

    fn unban(&self, ip: IpAddr) {
        self.send(Op::Unban(ip));
    }
}

/// The worker's loop: housekeeping every second, Redis operations as they come.
async fn run(
    bg: Weak<Background>,
    mut client: Option<Client>,
    mut rx: Option<mpsc::Receiver<Op>>,
    timeout: Duration,
) {
    let script = redis::Script::new(TAKE);
    let mut con: Option<Conn> = None;
    let mut backoff = Duration::from_millis(100);
    let mut next_connect = Instant::now();
    let mut next_tick = Instant::now();
    // Ban writes not yet in Redis (sent again once it is back).
    let mut pending: Vec<Op> = Vec::new();
    // Consecutive batches that timed out.
    let mut slow = 0;
    loop {
        let Some(me) = bg.upgrade() else { return };
        if me.stop.load(Relaxed) {
            return;
        }
        if Instant::now() >= next_tick {
            next_tick = Instant::now() + Duration::from_secs(1);
            housekeeping(&me);
        }
        if let (Some(client), None) = (&mut client, &con) {
            if Instant::now() >= next_connect {
                match tokio::time::timeout(
                    timeout.max(Duration::from_millis(200)),
                    client.connect(),
                )
                .await
                {
                    Ok(Ok(c)) => {
                        con = Some(c);
                        backoff = Duration::from_millis(100);
                        me.metrics.reconnects.fetch_add(1, Relaxed);
                        me.healthy.store(true, Relaxed);
                        tracing::info!("rate limit store connected");
                        next_tick = Instant::now();
                    }
                    Ok(Err(e)) => {
                        me.metrics.errors.fetch_add(1, Relaxed);
                        tracing::warn!(error = %e, retry_in = ?backoff, "rate limit store unreachable");
                        next_connect = Instant::now() + backoff;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                    Err(_) => {
                        me.metrics.errors.fetch_add(1, Relaxed);
                        tracing::warn!(retry_in = ?backoff, "rate limit store connection timed out");
                        next_connect = Instant::now() + backoff;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
        // Wait for work, at most until the next tick (or reconnection attempt).
        let mut ops: Vec<Op> = Vec::new();
        if let Some(rx) = rx.as_mut() {
            let wake = next_tick.min(if con.is_none() {
                next_connect
            } else {
                next_tick
            });
            drop(me);
            match tokio::time::timeout_at(wake.into(), rx.recv()).await {
                Ok(Some(op)) => ops.push(op),
                Ok(None) => return,
                Err(_) => {}
            }
            while ops.len() < BATCH {
                match rx.try_recv() {
                    Ok(op) => ops.push(op),
                    Err(_) => break,
                }
            }
        } else {
            drop(me);
            tokio::time::sleep_until(next_tick.into()).await;
            continue;
        }
        let Some(me) = bg.upgrade() else { return };
        let Some(c) = con.as_mut() else {
            // Not connected: reservations fail at once, ban writes wait.
            for op in ops {
                match op {
                    Op::Reserve(r) => r.leases.failed(r.hash),
                    other => pending.push(other),
                }
            }
            pending.truncate(moat_ratelimit::bans::MAX_BANS);
            continue;
        };
        ops.append(&mut pending);
        match execute(&me, c, &script, ops, timeout, &mut pending).await {
            Ok(()) => slow = 0,
            Err(e) => {
                me.metrics.errors.fetch_add(1, Relaxed);
                // A lost connection fails over at once; a slow answer only when it
                // keeps happening (one late batch on a busy machine is no outage).
                slow += 1;
                if e.lost || slow >= MAX_SLOW_BATCHES {
                    me.healthy.store(false, Relaxed);
                    tracing::warn!(error = %e.message, "rate limit store failed; reconnecting");
                    con = None;
                    slow = 0;
                    next_connect = Instant::now() + backoff;
                }
            }
        }
    }
}

/// List reloads, expired bans, and a sync of the shared bans (see [`execute`]).
fn housekeeping(bg: &Background) {
    if let Some(bans) = bg.bans.lock().upgrade() {
        for e in bans.reload_lists() {
            tracing::error!(error = %e, "ban list refused; the previous list stays in force");
        }
        bans.sweep(moat_ratelimit::now_ns(), unix_ms());
    }
    // Also the health check: a store that went away while every lease had tokens in
    // hand is noticed within a second.
    if let Some(tx) = &bg.tx {
        let _ = tx.try_send(Op::SyncBans);
    }
}

/// Runs one batch on the connection: reservations concurrently (the multiplexed
/// connection pipelines them), then ban writes and the ban sync.
async fn execute(
    bg: &Background,
    con: &mut Conn,
    script: &redis::Script,
    ops: Vec<Op>,
    timeout: Duration,
    pending: &mut Vec<Op>,
) -> Result<(), Failure> {
    let mut reserves = Vec::new();
    let mut bans = Vec::new();
    let mut sync = false;
    for op in ops {
        match op {
            Op::Reserve(r) => reserves.push(r),
            Op::SyncBans => sync = true,
            other => bans.push(other),
        }
    }
    if !reserves.is_empty() {
        let t = Instant::now();
        let calls =
            reserves.iter().map(|r| {
                let mut c = con.clone();
                let limit = r.leases.limit;
                let interval_us = (limit.interval_ns / 1000).max(1);
                let mut inv = script.key(&*r.key);
                inv.arg(interval_us).arg(limit.burst).arg(r.want);
                async move {
                    tokio::time::timeout(timeout, inv.invoke_async::<(u32, u64)>(&mut c)).await
                }
            });
        let results = futures_util::future::join_all(calls).await;
        bg.metrics.observe(t.elapsed());
        let now = moat_ratelimit::now_ns();
        let mut failed = None;
        for (r, res) in reserves.iter().zip(results) {
            match res {
                Ok(Ok((got, retry_us))) => {
                    bg.metrics.reservations.fetch_add(1, Relaxed);
                    r.leases
                        .granted(r.hash, r.want, got, retry_us.saturating_mul(1000), now);
                }
                Ok(Err(e)) => {
                    r.leases.failed(r.hash);
                    failed = Some(Failure::from(e));
                }
                Err(_) => {
                    r.leases.failed(r.hash);
                    failed.get_or_insert_with(|| Failure::timeout(timeout));
                }
            }
        }
        if let Some(e) = failed {
            pending.extend(bans);
            return Err(e);
        }
    }
    if bans.is_empty() && !sync {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for op in &bans {
        match op {
            Op::Ban(b) => {
                pipe.zadd(BANS_KEY, b.ip.to_string(), b.until_ms).ignore();
            }
            Op::Unban(ip) => {
                pipe.zrem(BANS_KEY, ip.to_string()).ignore();
            }
            Op::Reserve(_) | Op::SyncBans => {}
        }
    }
    let now_ms = unix_ms();
    pipe.cmd("ZREMRANGEBYSCORE")
        .arg(BANS_KEY)
        .arg("-inf")
        .arg(now_ms)
        .ignore();
    pipe.cmd("ZRANGE")
        .arg(BANS_KEY)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES");
    let res = tokio::time::timeout(timeout, pipe.query_async::<(Vec<(String, u64)>,)>(con)).await;
    match res {
        Ok(Ok((list,))) => {
            if let Some(local) = bg.bans.lock().upgrade() {
                local.replace(list.into_iter().filter_map(|(ip, until_ms)| {
                    Some(Ban {
                        ip: ip.parse().ok()?,
                        until_ms,
                    })
                }));
            }
            Ok(())
        }
        Ok(Err(e)) => {
            pending.extend(bans);
            Err(e.into())
        }
        Err(_) => {
            pending.extend(bans);
            Err(Failure::timeout(timeout))
        }
    }
}
