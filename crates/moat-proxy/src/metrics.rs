//! Lock-free counters and histograms rendered in the Prometheus text format.
//!
//! Every series the request path touches is resolved when the configuration is
//! built (one [`RouteMetrics`] per route, one [`ClusterMetrics`] per cluster), so
//! a request only does relaxed atomic adds: no label formatting, no map lookups.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

/// The pipeline stages that are timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// TLS handshake observers.
    Connection = 0,
    /// Request header phases.
    RequestHeaders = 1,
    /// Request body phases (buffering excluded).
    RequestBody = 2,
    /// Upstream: from sending the request to receiving the response head.
    Upstream = 3,
    /// Response body phases (buffering excluded).
    ResponseBody = 4,
    /// After-response phases and event enqueueing.
    AfterResponse = 5,
}

/// The phases in [`Phase`] order.
pub const PHASES: [Phase; 6] = [
    Phase::Connection,
    Phase::RequestHeaders,
    Phase::RequestBody,
    Phase::Upstream,
    Phase::ResponseBody,
    Phase::AfterResponse,
];

impl Phase {
    /// The phase's label value (`request_headers`, `upstream`, ...).
    pub fn name(self) -> &'static str {
        let span = self.span_name();
        span.strip_prefix(SPAN_PREFIX).unwrap_or(span)
    }

    /// The name of the phase's trace span (`moat.request_headers`, ...).
    pub fn span_name(self) -> &'static str {
        SPAN_NAMES[self as usize]
    }
}

/// What a span name adds to the phase's label.
const SPAN_PREFIX: &str = "moat.";

// Spelled out rather than formatted: a sampled request names a span per phase, and the
// label is the name without its prefix.
const SPAN_NAMES: [&str; 6] = [
    "moat.connection",
    "moat.request_headers",
    "moat.request_body",
    "moat.upstream",
    "moat.response_body",
    "moat.after_response",
];

/// Histogram bucket upper bounds in microseconds.
const BUCKETS_US: [u64; 18] = [
    5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000,
    1_000_000, 5_000_000, 30_000_000,
];

/// A fixed-bucket latency histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    #[inline]
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let idx = BUCKETS_US.partition_point(|&b| b < us);
        if let Some(b) = self.buckets.get(idx) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The upper bound of the bucket holding quantile `q` (0..=1) of the observations,
    /// as Prometheus' `histogram_quantile` would bound it; `None` before any
    /// observation. Past the last bucket, the last bound.
    pub fn quantile_upper_bound(&self, q: f64) -> Option<Duration> {
        let count = self.count();
        if count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * count as f64).ceil() as u64).max(1);
        let mut cumulative = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            if cumulative >= rank {
                return Some(Duration::from_micros(*b));
            }
        }
        BUCKETS_US.last().map(|b| Duration::from_micros(*b))
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, b) in BUCKETS_US.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let le = *b as f64 / 1e6;
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Forwarded to the upstream.
    Allow = 0,
    /// Answered by a phase (an engine blocked it).
    Block = 1,
    /// Refused by a limit (413, 431).
    Limit = 2,
    /// Answered by moat because of an error (no route, 502, 504).
    Error = 3,
}

const DECISIONS: [&str; 4] = ["allow", "block", "limit", "error"];

impl Decision {
    /// The decision's label value (`allow`, `block`, `limit`, `error`).
    pub fn name(self) -> &'static str {
        DECISIONS[self as usize]
    }
}
const STATUS_MIN: u16 = 100;
const STATUS_SLOTS: usize = 500;

/// Request counters of one route, by decision and status code.
#[derive(Debug)]
pub struct RouteMetrics {
    counts: Box<[AtomicU64]>,
    /// Time from the request head to the response head (`moat_request_duration_seconds`).
    pub duration: Histogram,
}

impl RouteMetrics {
    fn new() -> Self {
        RouteMetrics {
            counts: (0..DECISIONS.len() * STATUS_SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
            duration: Histogram::default(),
        }
    }

    /// Counts one request.
    #[inline]
    pub fn record(&self, decision: Decision, status: u16) {
        let s =
            (status.clamp(STATUS_MIN, STATUS_MIN + STATUS_SLOTS as u16 - 1) - STATUS_MIN) as usize;
        if let Some(c) = self.counts.get(decision as usize * STATUS_SLOTS + s) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests counted with this decision, all statuses.
    pub fn total(&self, decision: Decision) -> u64 {
        let start = decision as usize * STATUS_SLOTS;
        self.counts
            .get(start..start + STATUS_SLOTS)
            .map_or(0, |c| c.iter().map(|c| c.load(Ordering::Relaxed)).sum())
    }

    /// Requests counted with this decision and status.
    pub fn get(&self, decision: Decision, status: u16) -> u64 {
        let s =
            (status.clamp(STATUS_MIN, STATUS_MIN + STATUS_SLOTS as u16 - 1) - STATUS_MIN) as usize;
        self.counts
            .get(decision as usize * STATUS_SLOTS + s)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }
}

/// A cluster's endpoints by state, as `moat_upstream_endpoints` shows them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EndpointHealth {
    /// Endpoints in rotation.
    pub healthy: u64,
    /// Endpoints skipped by passive health checking.
    pub ejected: u64,
}

/// Reports a cluster's [`EndpointHealth`]; `None` once the cluster is gone.
pub type HealthSource = Arc<dyn Fn() -> Option<EndpointHealth> + Send + Sync>;

/// Upstream counters of one cluster.
#[derive(Default)]
pub struct ClusterMetrics {
    /// Time from sending the request to the response head, successful exchanges
    /// (`moat_upstream_latency_seconds`).
    pub latency: Histogram,
    /// The endpoints' state, installed by the cluster (replaced on reload).
    health: Mutex<Option<HealthSource>>,
    /// Connection failures (refused, unreachable, connect timeout).
    pub connect_errors: AtomicU64,
    /// Request timeouts (no response head within `request_timeout`) and read timeouts
    /// (a response body stalled past `read_timeout`).
    pub timeouts: AtomicU64,
    /// Other upstream failures (reset, protocol errors).
    pub other_errors: AtomicU64,
    /// Endpoint ejections.
    pub ejections: AtomicU64,
}

impl std::fmt::Debug for ClusterMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterMetrics")
            .field("connect_errors", &self.connect_errors)
            .field("ejections", &self.ejections)
            .finish_non_exhaustive()
    }
}

impl ClusterMetrics {
    /// Installs the source of `moat_upstream_endpoints` (the cluster built last wins).
    pub fn set_health(&self, h: HealthSource) {
        *self.health.lock() = Some(h);
    }
}

/// Counters of one `protocol: tcp` listener.
#[derive(Debug, Default)]
pub struct TcpMetrics {
    /// Connections allowed and forwarded to an upstream.
    pub allowed: AtomicU64,
    /// Connections closed by access control before any upstream connect.
    pub denied: AtomicU64,
    /// Connections that failed: TLS handshake or ClientHello refused, no cluster for the
    /// SNI, upstream unreachable.
    pub errors: AtomicU64,
    /// Bytes from clients delivered to upstreams (added when a connection closes).
    pub bytes_in: AtomicU64,
    /// Bytes from upstreams delivered to clients (added when a connection closes).
    pub bytes_out: AtomicU64,
}

/// Process-wide heap allocation totals since start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocTotals {
    /// Allocation calls (`alloc`, `alloc_zeroed`, `realloc`).
    pub calls: u64,
    /// Bytes requested.
    pub bytes: u64,
}

/// Reads the process-wide [`AllocTotals`].
pub type AllocationCounter = fn() -> AllocTotals;

/// Set once by a binary whose global allocator counts (moat's `alloc-stats`
/// feature). Process-wide rather than per [`Metrics`]: the allocator is global.
static ALLOCATION_COUNTER: OnceLock<AllocationCounter> = OnceLock::new();

/// Installs the allocation counter rendered as `moat_allocations_total` and
/// `moat_allocated_bytes_total`. Returns false if one was already installed
/// (the first one stays). Without it those series are absent from `/metrics`,
/// which tells `moat bench` that allocations are not measured.
pub fn set_allocation_counter(f: AllocationCounter) -> bool {
    ALLOCATION_COUNTER.set(f).is_ok()
}

/// The installed allocation counter's totals, `None` when allocations are not counted.
pub fn allocation_totals() -> Option<AllocTotals> {
    ALLOCATION_COUNTER.get().map(|f| f())
}

/// The event queue's state as `/metrics` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// Records waiting in the queue.
    pub depth: u64,
    /// The queue's capacity.
    pub capacity: u64,
    /// Records refused because the queue was full, since start.
    pub dropped: u64,
    /// Repeated events counted into an aggregate instead of queued, since start.
    pub aggregated: u64,
    /// Events over their client's cap, counted instead of queued, since start.
    pub capped: u64,
}

/// Source of the event queue's [`QueueStats`], set by whoever runs the queue.
pub type QueueGauge = Arc<dyn Fn() -> Option<QueueStats> + Send + Sync>;

/// Appends series of another component (the event sinks) to `/metrics`.
pub type Renderer = Arc<dyn Fn(&mut String) + Send + Sync>;

/// Most `(route, engine, action, rule)` series of `moat_security_events_total`.
/// Past it, events of a new combination are counted with `rule="_other"`, so a
/// stream of distinct rule names cannot grow `/metrics` without bound.
pub const MAX_SECURITY_SERIES: usize = 4096;

/// `moat_security_events_total` counts: route -> (engine, action) -> rule -> count.
/// Nested so that a lookup borrows the request's strings and allocates nothing.
type SecurityCounts =
    HashMap<Box<str>, HashMap<(&'static str, &'static str), HashMap<Box<str>, u64>>>;

/// All gateway metrics. Survives config reloads: series are keyed by route / cluster name.
pub struct Metrics {
    routes: Mutex<BTreeMap<String, Arc<RouteMetrics>>>,
    clusters: Mutex<BTreeMap<String, Arc<ClusterMetrics>>>,
    tcp: Mutex<BTreeMap<String, Arc<TcpMetrics>>>,
    phases: [Histogram; 6],
    /// Successful reloads.
    pub reloads_ok: AtomicU64,
    /// Refused reloads (invalid config).
    pub reloads_failed: AtomicU64,
    /// Accepted downstream connections.
    pub connections: AtomicU64,
    /// Failed downstream TLS handshakes.
    pub tls_handshake_errors: AtomicU64,
    /// Events the sink refused, counted by the proxy; exposed for sinks that do not
    /// report a queue of their own (a queue counts its refusals itself).
    pub events_dropped: AtomicU64,
    queue: Mutex<Option<QueueGauge>>,
    renderers: Mutex<Vec<Renderer>>,
    security: Mutex<(SecurityCounts, usize)>,
    /// Audited downstream TLS handshakes by (version, cipher suite, group). The
    /// label values come from moat-tls's fixed tables, so the map stays small.
    tls_handshakes: Mutex<BTreeMap<(&'static str, &'static str, &'static str), u64>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            routes: Mutex::new(BTreeMap::new()),
            clusters: Mutex::new(BTreeMap::new()),
            tcp: Mutex::new(BTreeMap::new()),
            phases: Default::default(),
            tls_handshakes: Mutex::new(BTreeMap::new()),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            tls_handshake_errors: AtomicU64::new(0),
            events_dropped: AtomicU64::new(0),
            queue: Mutex::new(None),
            renderers: Mutex::new(Vec::new()),
            security: Mutex::new((HashMap::new(), 0)),
        }
    }
}

impl Metrics {
    /// Counts events the proxy could not enqueue (the queue was full).
    #[inline]
    pub fn count_dropped_events(&self, n: u64) {
        if n > 0 {
            self.events_dropped.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counts one security event in `moat_security_events_total{route,engine,rule,action}`.
    pub fn count_security_event(
        &self,
        route: &str,
        engine: &'static str,
        rule: &str,
        action: &'static str,
    ) {
        let mut guard = self.security.lock();
        let (map, series) = &mut *guard;
        let by_kind = match map.get_mut(route) {
            Some(m) => m,
            None => map.entry(route.into()).or_default(),
        };
        let rules = by_kind.entry((engine, action)).or_default();
        if let Some(n) = rules.get_mut(rule) {
            *n += 1;
            return;
        }
        let rule = if *series < MAX_SECURITY_SERIES {
            rule
        } else {
            "_other"
        };
        let n = rules.entry(rule.into()).or_insert_with(|| {
            *series += 1;
            0
        });
        *n += 1;
    }

    /// Adds series rendered by another component at the end of `/metrics`.
    pub fn add_renderer(&self, r: Renderer) {
        self.renderers.lock().push(r);
    }

    /// The counters of a route (created on first use, kept across reloads).
    pub fn route(&self, name: &str) -> Arc<RouteMetrics> {
        self.routes
            .lock()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(RouteMetrics::new()))
            .clone()
    }

    /// The counters of a cluster (created on first use, kept across reloads).
    pub fn cluster(&self, name: &str) -> Arc<ClusterMetrics> {
        self.clusters
            .lock()
            .entry(name.to_string())
            .or_default()
            .clone()
    }

    /// The counters of a tcp listener (created on first use, kept across reloads).
    pub fn tcp_listener(&self, name: &str) -> Arc<TcpMetrics> {
        self.tcp.lock().entry(name.to_string()).or_default().clone()
    }

    /// The latency histogram of a phase.
    #[inline]
    pub fn phase(&self, p: Phase) -> &Histogram {
        &self.phases[p as usize]
    }

    /// Installs the event queue gauge source.
    pub fn set_queue_gauge(&self, g: QueueGauge) {
        *self.queue.lock() = Some(g);
    }

    /// Counts an audited TLS handshake under its version, cipher suite and group,
    /// so legacy crypto shows up in `/metrics`.
    pub fn record_tls_handshake(&self, hs: &moat_core::HandshakeRecord) {
        *self
            .tls_handshakes
            .lock()
            .entry(moat_tls::audit_labels(hs))
            .or_insert(0) += 1;
    }

    /// Renders everything in the Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8192);
        out.push_str("# HELP moat_requests_total Requests by route, status and decision.\n# TYPE moat_requests_total counter\n");
        for (name, m) in self.routes.lock().iter() {
            for (d, dname) in DECISIONS.iter().enumerate() {
                for s in 0..STATUS_SLOTS {
                    let v = m.counts[d * STATUS_SLOTS + s].load(Ordering::Relaxed);
                    if v > 0 {
                        let _ = writeln!(
                            out,
                            "moat_requests_total{{route=\"{}\",status=\"{}\",decision=\"{dname}\"}} {v}",
                            escape(name),
                            s as u16 + STATUS_MIN
                        );
                    }
                }
            }
        }
        out.push_str("# HELP moat_request_duration_seconds Time from the request head to the response head, by route.\n# TYPE moat_request_duration_seconds histogram\n");
        for (name, m) in self.routes.lock().iter() {
            m.duration.render(
                &mut out,
                "moat_request_duration_seconds",
                &format!("route=\"{}\"", escape(name)),
            );
        }
        self.render_security(&mut out);
        out.push_str("# HELP moat_phase_duration_seconds Time spent in each pipeline phase.\n# TYPE moat_phase_duration_seconds histogram\n");
        for (p, h) in PHASES.iter().zip(&self.phases) {
            h.render(
                &mut out,
                "moat_phase_duration_seconds",
                &format!("phase=\"{}\"", p.name()),
            );
        }
        out.push_str("# HELP moat_upstream_errors_total Upstream failures by cluster and kind.\n# TYPE moat_upstream_errors_total counter\n");
        let clusters = self.clusters.lock();
        for (name, c) in clusters.iter() {
            for (kind, v) in [
                ("connect", &c.connect_errors),
                ("timeout", &c.timeouts),
                ("other", &c.other_errors),
            ] {
                let _ = writeln!(
                    out,
                    "moat_upstream_errors_total{{cluster=\"{}\",kind=\"{kind}\"}} {}",
                    escape(name),
                    v.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# HELP moat_upstream_ejections_total Endpoints ejected by passive health checking.\n# TYPE moat_upstream_ejections_total counter\n");
        for (name, c) in clusters.iter() {
            let _ = writeln!(
                out,
                "moat_upstream_ejections_total{{cluster=\"{}\"}} {}",
                escape(name),
                c.ejections.load(Ordering::Relaxed)
            );
        }
        out.push_str("# HELP moat_upstream_latency_seconds Time from sending a request upstream to its response head, by cluster.\n# TYPE moat_upstream_latency_seconds histogram\n");
        for (name, c) in clusters.iter() {
            c.latency.render(
                &mut out,
                "moat_upstream_latency_seconds",
                &format!("cluster=\"{}\"", escape(name)),
            );
        }
        out.push_str("# HELP moat_upstream_endpoints Endpoints of each cluster by state (ejected: skipped by passive health checking).\n# TYPE moat_upstream_endpoints gauge\n");
        for (name, c) in clusters.iter() {
            let health = c.health.lock().clone();
            if let Some(EndpointHealth { healthy, ejected }) = health.and_then(|h| h()) {
                let name = escape(name);
                let _ = writeln!(
                    out,
                    "moat_upstream_endpoints{{cluster=\"{name}\",state=\"healthy\"}} {healthy}\nmoat_upstream_endpoints{{cluster=\"{name}\",state=\"ejected\"}} {ejected}"
                );
            }
        }
        drop(clusters);
        // A queue that reports its own drops counts every refused push already;
        // the proxy's counter stands in only for sinks that do not report them.
        let gauge = self.queue.lock().as_ref().and_then(|g| g());
        let q = gauge.unwrap_or(QueueStats {
            dropped: self.events_dropped.load(Ordering::Relaxed),
            ..QueueStats::default()
        });
        let _ = write!(
            out,
            "# HELP moat_event_queue_depth Records waiting in the event queue.\n# TYPE moat_event_queue_depth gauge\nmoat_event_queue_depth {}\n\
             # HELP moat_event_queue_capacity Capacity of the event queue.\n# TYPE moat_event_queue_capacity gauge\nmoat_event_queue_capacity {}\n\
             # HELP moat_event_queue_dropped_total Records dropped because the queue was full.\n# TYPE moat_event_queue_dropped_total counter\nmoat_event_queue_dropped_total {}\n\
             # HELP moat_events_aggregated_total Repeated events counted into an aggregate record instead of queued.\n# TYPE moat_events_aggregated_total counter\nmoat_events_aggregated_total {}\n\
             # HELP moat_events_client_capped_total Events over their client's cap, counted in one record instead of queued.\n# TYPE moat_events_client_capped_total counter\nmoat_events_client_capped_total {}\n",
            q.depth, q.capacity, q.dropped, q.aggregated, q.capped
        );
        let _ = write!(
            out,
            "# HELP moat_config_reloads_total Configuration reloads by result.\n# TYPE moat_config_reloads_total counter\n\
             moat_config_reloads_total{{result=\"ok\"}} {}\nmoat_config_reloads_total{{result=\"failed\"}} {}\n",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_failed.load(Ordering::Relaxed)
        );
        let _ = write!(
            out,
            "# HELP moat_connections_total Accepted downstream connections.\n# TYPE moat_connections_total counter\nmoat_connections_total {}\n\
             # HELP moat_tls_handshake_errors_total Failed downstream TLS handshakes.\n# TYPE moat_tls_handshake_errors_total counter\nmoat_tls_handshake_errors_total {}\n",
            self.connections.load(Ordering::Relaxed),
            self.tls_handshake_errors.load(Ordering::Relaxed)
        );
        self.render_tcp(&mut out);
        out.push_str("# HELP moat_tls_handshakes_total Audited downstream TLS handshakes by protocol version, cipher suite and key exchange group.\n# TYPE moat_tls_handshakes_total counter\n");
        for ((version, cipher, group), n) in self.tls_handshakes.lock().iter() {
            let _ = writeln!(
                out,
                "moat_tls_handshakes_total{{version=\"{version}\",cipher=\"{cipher}\",group=\"{group}\"}} {n}"
            );
        }
        let _ = write!(
            out,
            "# HELP moat_build_info moat's version; the value is always 1.\n# TYPE moat_build_info gauge\nmoat_build_info{{version=\"{}\"}} 1\n",
            env!("CARGO_PKG_VERSION")
        );
        crate::process_metrics::render(&mut out);
        for r in self.renderers.lock().iter() {
            r(&mut out);
        }
        if let Some(counter) = ALLOCATION_COUNTER.get() {
            let AllocTotals {
                calls: allocs,
                bytes,
            } = counter();
            let _ = write!(
                out,
                "# HELP moat_allocations_total Heap allocation calls (alloc, alloc_zeroed, realloc) since start.\n# TYPE moat_allocations_total counter\nmoat_allocations_total {allocs}\n\
                 # HELP moat_allocated_bytes_total Bytes requested from the heap allocator since start.\n# TYPE moat_allocated_bytes_total counter\nmoat_allocated_bytes_total {bytes}\n"
            );
        }
        out
    }
}

impl Metrics {
    fn render_security(&self, out: &mut String) {
        out.push_str("# HELP moat_security_events_total Security events by route, engine, rule and action (at most 4096 series; later ones under rule=\"_other\").\n# TYPE moat_security_events_total counter\n");
        let guard = self.security.lock();
        let mut rows: Vec<(&str, &str, &str, &str, u64)> = Vec::new();
        for (route, kinds) in guard.0.iter() {
            for ((engine, action), rules) in kinds {
                for (rule, n) in rules {
                    rows.push((route, engine, rule, action, *n));
                }
            }
        }
        rows.sort_unstable();
        for (route, engine, rule, action, n) in rows {
            let _ = writeln!(
                out,
                "moat_security_events_total{{route=\"{}\",engine=\"{engine}\",rule=\"{}\",action=\"{action}\"}} {n}",
                escape(route),
                escape(rule)
            );
        }
    }

    fn render_tcp(&self, out: &mut String) {
        let tcp = self.tcp.lock();
        if tcp.is_empty() {
            return;
        }
        out.push_str("# HELP moat_tcp_connections_total Connections of tcp listeners by result.\n# TYPE moat_tcp_connections_total counter\n");
        for (name, m) in tcp.iter() {
            for (result, v) in [
                ("allow", &m.allowed),
                ("deny", &m.denied),
                ("error", &m.errors),
            ] {
                let _ = writeln!(
                    out,
                    "moat_tcp_connections_total{{listener=\"{}\",result=\"{result}\"}} {}",
                    escape(name),
                    v.load(Ordering::Relaxed)
                );
            }
        }
        out.push_str("# HELP moat_tcp_bytes_total Bytes proxied by tcp listeners (in: client to upstream, out: upstream to client), counted when a connection closes.\n# TYPE moat_tcp_bytes_total counter\n");
        for (name, m) in tcp.iter() {
            for (direction, v) in [("in", &m.bytes_in), ("out", &m.bytes_out)] {
                let _ = writeln!(
                    out,
                    "moat_tcp_bytes_total{{listener=\"{}\",direction=\"{direction}\"}} {}",
                    escape(name),
                    v.load(Ordering::Relaxed)
                );
            }
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_drops_are_counted_once() {
        // A queue that counts its own refusals: the proxy's count of the same
        // refusals is not added again.
        let m = Metrics::default();
        m.set_queue_gauge(Arc::new(|| {
            Some(QueueStats {
                depth: 3,
                capacity: 64,
                dropped: 7,
                aggregated: 11,
                capped: 5,
            })
        }));
        m.count_dropped_events(7);
        let text = m.render();
        assert!(
            text.contains("moat_event_queue_dropped_total 7\n"),
            "{text}"
        );
        assert!(text.contains("moat_event_queue_depth 3\n"), "{text}");
        assert!(text.contains("moat_events_aggregated_total 11\n"), "{text}");
        assert!(
            text.contains("moat_events_client_capped_total 5\n"),
            "{text}"
        );
        // A sink without a queue of its own: the proxy's count is the figure.
        let m = Metrics::default();
        m.set_queue_gauge(Arc::new(|| None));
        m.count_dropped_events(2);
        assert!(m.render().contains("moat_event_queue_dropped_total 2\n"));
    }

    #[test]
    fn security_events_are_counted_with_bounded_series() {
        let m = Metrics::default();
        m.count_security_event("api", "waf", "sqli", "block");
        m.count_security_event("api", "waf", "sqli", "block");
        m.count_security_event("api", "secrets", "aws-key\"x", "redact");
        let text = m.render();
        assert!(text.contains("moat_security_events_total{route=\"api\",engine=\"waf\",rule=\"sqli\",action=\"block\"} 2\n"), "{text}");
        assert!(
            text.contains("rule=\"aws-key\\\"x\",action=\"redact\"} 1\n"),
            "{text}"
        );
        // A flood of distinct rule names stops at the bound.
        for i in 0..MAX_SECURITY_SERIES + 100 {
            m.count_security_event("api", "waf", &format!("r{i}"), "monitor");
        }
        let text = m.render();
        let series = text
            .lines()
            .filter(|l| l.starts_with("moat_security_events_total{"))
            .count();
        assert_eq!(series, MAX_SECURITY_SERIES + 1, "the bound plus _other");
        assert!(
            text.contains("rule=\"_other\",action=\"monitor\"} 102\n"),
            "{text}"
        );
    }

    #[test]
    fn process_and_build_info_render() {
        let text = Metrics::default().render();
        assert!(text.contains("moat_build_info{version=\""), "{text}");
        #[cfg(target_os = "linux")]
        for name in [
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_cpu_seconds_total ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            let line = text
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_else(|| panic!("{name} missing"));
            let v: f64 = line[name.len()..].parse().unwrap();
            // A young test process may not have used a whole CPU tick yet.
            assert!(v > 0.0 || name.starts_with("process_cpu"), "{line}");
        }
    }

    #[test]
    fn counters_and_histograms_render() {
        let m = Metrics::default();
        let r = m.route("api");
        r.record(Decision::Allow, 200);
        r.record(Decision::Allow, 200);
        r.record(Decision::Error, 502);
        r.record(Decision::Error, 9999);
        m.phase(Phase::Upstream).observe(Duration::from_micros(300));
        let text = m.render();
        assert!(
            text.contains("moat_requests_total{route=\"api\",status=\"200\",decision=\"allow\"} 2")
        );
        assert!(text.contains("status=\"502\",decision=\"error\"} 1"));
        assert!(text.contains("status=\"599\",decision=\"error\"} 1"));
        assert!(
            text.contains("moat_phase_duration_seconds_bucket{phase=\"upstream\",le=\"0.0005\"} 1")
        );
        assert!(text
            .contains("moat_phase_duration_seconds_bucket{phase=\"upstream\",le=\"0.00025\"} 0"));
        assert!(Arc::ptr_eq(&r, &m.route("api")));
    }
}
