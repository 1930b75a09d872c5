//! The running gateway: configuration snapshots, listeners, reload and shutdown.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hyper_util::rt::TokioExecutor;
use moat_config::ConfigError;
use moat_core::{Connection, HandshakeRecord, TlsSession};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminRouter};
use crate::body::BodyPace;
use crate::config::{self, ConfigSource, GatewayConfig, OnLimit};
use crate::events::EventSink;
use crate::metrics::{Metrics, Phase, RouteMetrics};
use crate::pipeline::{default_factory, Pipeline, PipelineFactory};
use crate::server::{self, DownstreamIo, Drain};
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
    fn parse(h: &str) -> HostMatch {
        if h == "*" {
            HostMatch::Any
        } else if let Some(s) = h.strip_prefix('*') {
            HostMatch::Suffix(s.to_ascii_lowercase())
        } else {
            HostMatch::Exact(h.to_ascii_lowercase())
        }
    }

    #[inline]
    fn matches(&self, host: &str) -> bool {
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
    /// Pre-resolved counters.
    pub metrics: Arc<RouteMetrics>,
}

pub(crate) struct ListenerRt {
    name: String,
    tls: Option<moat_tls::TlsAcceptor>,
    xff_hops: u32,
}

/// Everything a request needs, swapped atomically on reload.
pub struct Snapshot {
    /// The effective configuration.
    pub config: Arc<GatewayConfig>,
    /// Where it came from.
    pub source: ConfigSource,
    /// Routes in match order.
    pub routes: Vec<Route>,
    /// The phase pipeline.
    pub pipeline: Pipeline,
    pub(crate) listeners: Vec<ListenerRt>,
    pub(crate) max_headers: usize,
    pub(crate) max_header_bytes: usize,
    pub(crate) no_route: Arc<RouteMetrics>,
}

impl Snapshot {
    /// First route matching host and path.
    #[inline]
    pub fn match_route(&self, host: &str, path: &str) -> Option<&Route> {
        self.routes
            .iter()
            .find(|r| path.starts_with(r.prefix.as_str()) && r.host.matches(host))
    }
}

/// State shared by listeners, the admin API and the request path.
pub struct Shared {
    /// Current configuration snapshot; replaced only by [`Shared::apply`], which also
    /// advances `generation`.
    pub(crate) snapshot: ArcSwap<Snapshot>,
    /// Metrics (kept across reloads).
    pub metrics: Arc<Metrics>,
    /// Event sink, if any.
    pub events: Option<Arc<dyn EventSink>>,
    pipeline_factory: PipelineFactory,
    ready: std::sync::atomic::AtomicBool,
    draining: std::sync::atomic::AtomicBool,
    /// Incremented after each new snapshot is installed (see [`CachedSnapshot`]).
    generation: AtomicU64,
}

/// A connection's reference to the current snapshot, refreshed when a reload has
/// installed a new one.
///
/// Loading from the `ArcSwap` for every request costs several atomic read-modify-write
/// instructions (a debt slot, the reference count); checking a generation number is a
/// plain load. A connection holds its snapshot while idle, so an old snapshot lives until
/// the last connection that used it sends another request or closes.
pub(crate) struct CachedSnapshot {
    snap: Arc<Snapshot>,
    generation: u64,
}

impl CachedSnapshot {
    pub(crate) fn new(shared: &Shared) -> Self {
        // The generation is read first: a reload racing with this is seen next time.
        let generation = shared.generation.load(Ordering::Acquire);
        CachedSnapshot {
            snap: shared.snapshot.load_full(),
            generation,
        }
    }

    /// The current snapshot.
    pub(crate) fn current(&mut self, shared: &Shared) -> &Arc<Snapshot> {
        let generation = shared.generation.load(Ordering::Acquire);
        if generation != self.generation {
            *self = CachedSnapshot::new(shared);
        }
        &self.snap
    }
}

/// Per-connection data shared by its requests.
pub(crate) struct ConnInfo {
    pub(crate) conn: Arc<Connection>,
    pub(crate) xff_hops: u32,
    /// The peer IP formatted once, for `X-Forwarded-For`.
    pub(crate) xff: http::HeaderValue,
    /// Progress counters read by the connection's [`watchdog`].
    watch: Arc<ConnWatch>,
}

/// Progress of one downstream connection, read by its [`watchdog`].
#[derive(Debug, Default)]
pub(crate) struct ConnWatch {
    /// Requests whose head was read.
    heads: AtomicU64,
    /// An exchange is in progress: from the request head until the response body is
    /// written.
    active: AtomicBool,
    /// Set on the first HTTP/2 request: the watchdog is for HTTP/1 only.
    h2: AtomicBool,
    /// A write to the client is waiting for it to read.
    sending: AtomicBool,
    /// Writes to the client that made progress.
    sends: AtomicU64,
}

impl ConnWatch {
    /// Marks the start and the end of a write to the client. Like the other counters,
    /// written only by the connection's own task: plain stores.
    pub(crate) fn set_sending(&self, on: bool) {
        self.sending.store(on, Ordering::Relaxed);
    }

    /// Counts a write to the client that made progress.
    pub(crate) fn sent(&self) {
        self.sends
            .store(self.sends.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// Check period of the connection watchdog that replaces hyper's per-request
/// header-read timer (which allocates and arms a timer for every request).
const WATCH_TICK: Duration = Duration::from_secs(10);
/// An HTTP/1 connection with nothing in flight that completes no request head for this
/// many ticks in a row (30 to 40 s) is closed: idle keep-alive and slow-head clients.
/// So is one whose write to the client makes no progress for as many ticks: a client
/// that stopped reading its response.
const WATCH_IDLE_TICKS: u32 = 3;
/// While the gateway drains, how often a connection with an exchange in flight is
/// checked again.
const DRAIN_CHECK: Duration = Duration::from_millis(50);

impl ConnInfo {
    /// Marks the start of an HTTP/1 exchange (its request head was read).
    ///
    /// Only the connection's own task writes these counters, one exchange at a time, so
    /// a plain load and store is enough: no atomic read-modify-write per request.
    pub(crate) fn h1_exchange_started(&self) {
        let w = &self.watch;
        w.heads
            .store(w.heads.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        w.active.store(true, Ordering::Relaxed);
    }

    /// Marks the end of an HTTP/1 exchange (its response was written, or failed).
    pub(crate) fn h1_exchange_ended(&self) {
        self.watch.active.store(false, Ordering::Relaxed);
    }

    /// What the connection's watchdog reads.
    pub(crate) fn watch(&self) -> &Arc<ConnWatch> {
        &self.watch
    }

    /// Marks the connection as HTTP/2, which the watchdog leaves to hyper.
    pub(crate) fn h2_exchange(&self) {
        if !self.watch.h2.load(Ordering::Relaxed) {
            self.watch.h2.store(true, Ordering::Relaxed);
        }
    }
}

/// Returns when an HTTP/1 connection has completed no request head for
/// [`WATCH_IDLE_TICKS`] ticks in a row while nothing was in flight (idle keep-alive
/// connections, clients that send their head or their TLS handshake too slowly), when a
/// write to the client made no progress for as many ticks (a client that stopped
/// reading; waiting for the upstream's next bytes does not count), or once the gateway
/// drains and nothing is in flight; the caller then drops the
/// connection (an exchange in flight finishes first and its response says
/// `connection: close`). Never returns for HTTP/2 connections, which hyper's keep-alive
/// pings watch and which drain with a GOAWAY.
///
/// It is polled inside the connection's own task, so its one timer goes away with the
/// connection: as a task of its own it outlived every connection by up to a tick and
/// held the finished connection's task memory (several KiB) through its abort handle,
/// which grew RSS by gigabytes under a load of short connections. Watching the drain
/// signal here, once per tick, keeps that off the per-request path.
async fn watchdog(watch: Arc<ConnWatch>, mut drain: watch::Receiver<bool>) {
    let mut last_heads = 0;
    let mut idle_ticks = 0;
    let mut last_sends = 0;
    let mut stalled_ticks = 0;
    let mut draining = false;
    loop {
        if draining {
            tokio::time::sleep(DRAIN_CHECK).await;
        } else {
            tokio::select! {
                () = tokio::time::sleep(WATCH_TICK) => {}
                _ = drain.wait_for(|d| *d) => draining = true,
            }
        }
        if watch.h2.load(Ordering::Relaxed) {
            return std::future::pending().await;
        }
        let idle = !watch.active.load(Ordering::Relaxed);
        if draining {
            if idle {
                return;
            }
            continue;
        }
        let sends = watch.sends.load(Ordering::Relaxed);
        if watch.sending.load(Ordering::Relaxed) && sends == last_sends {
            stalled_ticks += 1;
            if stalled_ticks >= WATCH_IDLE_TICKS {
                tracing::debug!("closing a connection whose client stopped reading");
                return;
            }
        } else {
            stalled_ticks = 0;
            last_sends = sends;
        }
        let heads = watch.heads.load(Ordering::Relaxed);
        if heads == last_heads && idle {
            idle_ticks += 1;
            if idle_ticks >= WATCH_IDLE_TICKS {
                return;
            }
        } else {
            idle_ticks = 0;
            last_heads = heads;
        }
    }
}

/// A future polled only when its own waker fired (and on its first poll).
///
/// The connection's watchdog shares its task with the connection, which is woken
/// several times per request (reads, writes, the upstream); polling the watchdog each
/// time re-registers its timer and takes the lock of the drain signal's waiter list.
/// Wrapped, it costs a flag check on those polls.
struct OnOwnWake<F> {
    inner: std::pin::Pin<Box<F>>,
    wake: Arc<OwnWake>,
    /// The task waker last registered in `wake.task` (compared, not re-registered).
    registered: Option<std::task::Waker>,
}

#[derive(Default)]
struct OwnWake {
    woken: AtomicBool,
    task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for OwnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: std::future::Future> OnOwnWake<F> {
    fn new(inner: F) -> Self {
        let wake = Arc::new(OwnWake::default());
        wake.woken.store(true, Ordering::Relaxed);
        OnOwnWake {
            inner: Box::pin(inner),
            wake,
            registered: None,
        }
    }
}

impl<F: std::future::Future> std::future::Future for OnOwnWake<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.get_mut();
        if !this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            this.wake.task.register(cx.waker());
            this.registered = Some(cx.waker().clone());
        }
        if !this.wake.woken.swap(false, Ordering::AcqRel) {
            return std::task::Poll::Pending;
        }
        // The wake-up that set the flag took the task's waker out of `wake.task`: put it
        // back before the inner future arms anything that wakes it again, or that
        // wake-up would be lost (an idle connection's watchdog never fired twice).
        this.wake.task.register(cx.waker());
        let waker = std::task::Waker::from(this.wake.clone());
        this.inner
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
    }
}

impl Shared {
    /// Builds a snapshot from a validated configuration.
    fn build(&self, cfg: GatewayConfig, src: ConfigSource) -> Result<Snapshot, ConfigError> {
        build_snapshot(cfg, src, &self.metrics, &self.pipeline_factory)
    }

    /// Validates and installs a new configuration. Listener addresses are not
    /// changed by a reload (a restart is needed); everything else is.
    pub fn apply(&self, cfg: GatewayConfig, src: ConfigSource) -> Result<(), ConfigError> {
        let result = config::validate(&src, &cfg).and_then(|_| self.build(cfg, src));
        match result {
            Ok(snap) => {
                let old = self.snapshot.load();
                for l in &snap.config.listeners {
                    let before = old
                        .config
                        .listeners
                        .iter()
                        .find(|o| o.name.value == l.name.value);
                    if before.map(|b| &b.address.value) != Some(&l.address.value) {
                        tracing::warn!(listener = %l.name.value, "listener added or address changed: restart moat to apply it");
                    }
                }
                if old.config.admin.address.value != snap.config.admin.address.value {
                    tracing::warn!("admin address changed: restart moat to apply it");
                }
                self.snapshot.store(Arc::new(snap));
                self.generation.fetch_add(1, Ordering::Release);
                self.metrics.reloads_ok.fetch_add(1, Ordering::Relaxed);
                tracing::info!("configuration reloaded");
                Ok(())
            }
            Err(e) => {
                self.metrics.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "configuration refused; the previous one keeps serving");
                Err(e)
            }
        }
    }

    /// The current configuration snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// True once shutdown started.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Re-reads the configuration file and applies it (see [`apply`](Self::apply)).
    pub fn reload_from_file(&self) -> Result<(), ConfigError> {
        let file = self.snapshot.load().source.file.clone();
        match config::load_file(&file) {
            Ok((cfg, src)) => self.apply(cfg, src),
            Err(e) => {
                self.metrics.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "configuration refused; the previous one keeps serving");
                Err(e)
            }
        }
    }

    /// True once listeners are bound and until shutdown starts.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }
}

/// Labels and namespace of a cluster's workload.
type WorkloadMeta = (Arc<BTreeMap<String, String>>, Arc<str>);

fn build_snapshot(
    cfg: GatewayConfig,
    src: ConfigSource,
    metrics: &Metrics,
    factory: &PipelineFactory,
) -> Result<Snapshot, ConfigError> {
    let mut clusters: HashMap<&str, Arc<Cluster>> = HashMap::new();
    let mut meta: HashMap<&str, WorkloadMeta> = HashMap::new();
    for (i, c) in cfg.clusters.iter().enumerate() {
        let cluster = Cluster::build(c, &src.base_dir, metrics).map_err(|m| {
            ConfigError::semantic(
                &src.file,
                c.name.referenced.line() as u32,
                c.name.referenced.column() as u32,
                format!("clusters[{i}]"),
                m,
            )
        })?;
        let cluster = Arc::new(cluster);
        crate::upstream::spawn_reaper(&cluster);
        clusters.insert(&c.name.value, cluster);
        meta.insert(
            &c.name.value,
            (Arc::new(c.labels.clone()), c.namespace.as_str().into()),
        );
    }
    let mut routes = Vec::with_capacity(cfg.routes.len());
    for (i, r) in cfg.routes.iter().enumerate() {
        let (Some(cluster), Some((labels, ns))) = (
            clusters.get(r.cluster.value.as_str()),
            meta.get(r.cluster.value.as_str()),
        ) else {
            return Err(ConfigError::semantic(
                &src.file,
                r.cluster.referenced.line() as u32,
                r.cluster.referenced.column() as u32,
                format!("routes[{i}].cluster"),
                format!("unknown cluster `{}`", r.cluster.value),
            ));
        };
        routes.push(Route {
            name: r.name.value.as_str().into(),
            host: HostMatch::parse(&r.host.value),
            prefix: r.path_prefix.value.clone(),
            cluster: cluster.clone(),
            labels: labels.clone(),
            namespace: ns.clone(),
            body_max: r.body.max_bytes,
            on_limit: r.body.on_limit,
            body_pace: BodyPace {
                timeout: r.body.read_timeout,
                min_rate: r.body.min_rate,
            },
            response_max: r.response_body.max_bytes,
            monitor_only: r.monitor_only,
            metrics: metrics.route(&r.name.value),
        });
    }
    let mut listeners = Vec::with_capacity(cfg.listeners.len());
    for (i, l) in cfg.listeners.iter().enumerate() {
        let tls = match &l.tls {
            None => None,
            Some(t) => Some(moat_tls::TlsAcceptor::new(t, &src.base_dir).map_err(|e| {
                ConfigError::semantic(
                    &src.file,
                    l.name.referenced.line() as u32,
                    l.name.referenced.column() as u32,
                    format!("listeners[{i}].tls"),
                    e.to_string(),
                )
            })?),
        };
        listeners.push(ListenerRt {
            name: l.name.value.clone(),
            tls,
            xff_hops: l.xff_trusted_hops,
        });
    }
    let pipeline = factory(&cfg, &src)?;
    Ok(Snapshot {
        max_headers: cfg.limits.max_headers,
        max_header_bytes: cfg.limits.max_header_bytes.min(usize::MAX as u64) as usize,
        no_route: metrics.route("_none_"),
        config: Arc::new(cfg),
        source: src,
        routes,
        pipeline,
        listeners,
    })
}

/// Options for [`Gateway::new`].
pub struct GatewayOptions {
    /// Builds the phase pipeline from the config (default: [`crate::pipeline::build_pipeline`]).
    pub pipeline_factory: PipelineFactory,
    /// Where access, security and TLS records go.
    pub events: Option<Arc<dyn EventSink>>,
    /// Admin routes added to the built-in ones.
    pub admin: AdminRouter,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            pipeline_factory: default_factory(),
            events: None,
            admin: AdminRouter::new(),
        }
    }
}

/// A configured gateway, not yet listening.
pub struct Gateway {
    shared: Arc<Shared>,
    admin: AdminRouter,
}

impl Gateway {
    /// Builds the gateway from a configuration (validated here as well).
    pub fn new(
        cfg: GatewayConfig,
        src: ConfigSource,
        opts: GatewayOptions,
    ) -> Result<Gateway, ConfigError> {
        config::validate(&src, &cfg)?;
        let metrics = Arc::new(Metrics::default());
        if let Some(sink) = &opts.events {
            let sink = sink.clone();
            metrics.set_queue_gauge(Arc::new(move || sink.gauge()));
        }
        let snap = build_snapshot(cfg, src, &metrics, &opts.pipeline_factory)?;
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snap),
            metrics,
            events: opts.events,
            pipeline_factory: opts.pipeline_factory,
            ready: false.into(),
            draining: false.into(),
            generation: AtomicU64::new(0),
        });
        Ok(Gateway {
            shared,
            admin: opts.admin,
        })
    }

    /// Shared state (metrics, current snapshot, reload).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Binds the listeners and the admin listener and starts serving.
    pub async fn start(self) -> std::io::Result<RunningGateway> {
        let snap = self.shared.snapshot.load_full();
        let (stop_tx, stop_rx) = watch::channel(false);
        let drain = Drain::new();
        let mut tasks = Vec::new();
        let mut addrs = Vec::new();
        let h2 = Arc::new(server::h2_builder(
            snap.config.limits.max_header_bytes.min(16 << 20) as usize,
        ));
        for l in &snap.config.listeners {
            let addr: SocketAddr = l.address.value.parse().map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad listener address")
            })?;
            let listener = TcpListener::bind(addr).await.map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("listener `{}` on {addr}: {e}", l.name.value),
                )
            })?;
            let local = listener.local_addr()?;
            tracing::info!(listener = %l.name.value, address = %local, tls = l.tls.is_some(), "listening");
            addrs.push((l.name.value.clone(), local));
            tasks.push(tokio::spawn(accept_loop(
                self.shared.clone(),
                l.name.value.clone(),
                listener,
                h2.clone(),
                drain.watcher(),
                stop_rx.clone(),
            )));
        }
        let admin_addr: SocketAddr = snap.config.admin.address.value.parse().map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad admin address")
        })?;
        let admin_listener = TcpListener::bind(admin_addr).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("admin listener on {admin_addr}: {e}"))
        })?;
        let admin_local = admin_listener.local_addr()?;
        tracing::info!(address = %admin_local, "admin listening");
        let router = Arc::new(self.admin.with_builtins());
        tasks.push(tokio::spawn(admin::serve(
            self.shared.clone(),
            router,
            admin_listener,
            stop_rx.clone(),
        )));
        self.shared.ready.store(true, Ordering::Relaxed);
        Ok(RunningGateway {
            shared: self.shared,
            addrs,
            admin_addr: admin_local,
            stop: stop_tx,
            drain,
            tasks,
        })
    }
}

async fn accept_loop(
    shared: Arc<Shared>,
    name: String,
    listener: TcpListener,
    h2: Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
    drain: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.changed() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        shared.metrics.connections.fetch_add(1, Ordering::Relaxed);
        let _ = tcp.set_nodelay(true);
        let local = tcp.local_addr().unwrap_or(peer);
        let snap = shared.snapshot.load();
        let (tls, xff_hops) = snap
            .listeners
            .iter()
            .find(|l| l.name == name)
            .map(|l| (l.tls.clone(), l.xff_hops))
            .unwrap_or((None, 0));
        drop(snap);
        let shared = shared.clone();
        let h2 = h2.clone();
        let drain = drain.clone();
        let watchdog_drain = drain.clone();
        let watch = Arc::new(ConnWatch::default());
        let conn_watch = watch.clone();
        let conn = async move {
            let watch = conn_watch;
            match tls {
                None => {
                    let ci = conn_info(peer, local, None, xff_hops, watch);
                    server::serve(shared, h2, drain, ci, DownstreamIo::Plain(tcp)).await;
                }
                Some(t) => {
                    let t0 = Instant::now();
                    match t.accept(tcp).await {
                        Ok(moat_tls::Accepted::Plain(tcp)) => {
                            let ci = conn_info(peer, local, None, xff_hops, watch);
                            server::serve(shared, h2, drain, ci, DownstreamIo::Plain(tcp)).await;
                        }
                        Ok(moat_tls::Accepted::Tls {
                            stream,
                            session,
                            handshake,
                        }) => {
                            let ci = conn_info(peer, local, Some(session), xff_hops, watch);
                            on_connection(&shared, &ci.conn, &handshake, t0);
                            let io = DownstreamIo::Tls(Box::new(stream));
                            server::serve(shared, h2, drain, ci, io).await;
                        }
                        Err(e) => {
                            shared
                                .metrics
                                .tls_handshake_errors
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
                        }
                    }
                }
            }
        };
        tokio::spawn(async move {
            tokio::select! {
                biased;
                () = conn => {}
                () = OnOwnWake::new(watchdog(watch, watchdog_drain)) => {
                    tracing::trace!("closing an idle connection (no request head in time, or draining)");
                }
            }
        });
    }
}

fn on_connection(shared: &Shared, conn: &Connection, hs: &HandshakeRecord, _t0: Instant) {
    let snap = shared.snapshot.load();
    let t = Instant::now();
    for p in &snap.pipeline.connection {
        p.on_connection(conn, hs);
    }
    if snap.config.tls_audit.enabled {
        shared.metrics.record_tls_handshake(hs);
        if let Some(sink) = &shared.events {
            if !sink.tls(conn, hs) {
                shared.metrics.count_dropped_events(1);
            }
        }
    }
    shared.metrics.phase(Phase::Connection).observe(t.elapsed());
}

fn conn_info(
    peer: SocketAddr,
    local: SocketAddr,
    tls: Option<TlsSession>,
    xff_hops: u32,
    watch: Arc<ConnWatch>,
) -> Arc<ConnInfo> {
    let xff = http::HeaderValue::from_maybe_shared(bytes::Bytes::from(peer.ip().to_string()))
        .unwrap_or_else(|_| http::HeaderValue::from_static("unknown"));
    Arc::new(ConnInfo {
        xff,
        watch,
        conn: Arc::new(Connection {
            remote_addr: peer,
            local_addr: local,
            tls,
        }),
        xff_hops,
    })
}

/// How often the config file is checked for changes (see
/// [`RunningGateway::spawn_reload_triggers`]).
pub const CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What identifies a version of the config file: a change of any field means the file was
/// rewritten, replaced (rename, symlink swap) or appeared. `None` while it cannot be read.
#[derive(PartialEq, Eq)]
struct FileStamp(Option<StatFields>);

/// `(device, inode, ctime s, ctime ns)` on unix; length and mtime everywhere.
#[derive(PartialEq, Eq)]
struct StatFields {
    #[cfg(unix)]
    identity: (u64, u64, i64, i64),
    len: u64,
    modified: Option<std::time::SystemTime>,
}

impl FileStamp {
    /// Stats `path` (following symlinks). A blocking call on the runtime thread, but a
    /// `stat` of a local file takes microseconds, once a second; `tokio::fs` would start
    /// a blocking-pool thread for it.
    fn of(path: &std::path::Path) -> FileStamp {
        FileStamp(std::fs::metadata(path).ok().map(|m| StatFields {
            #[cfg(unix)]
            identity: {
                use std::os::unix::fs::MetadataExt as _;
                (m.dev(), m.ino(), m.ctime(), m.ctime_nsec())
            },
            len: m.len(),
            modified: m.modified().ok(),
        }))
    }
}

/// A gateway that is serving.
pub struct RunningGateway {
    shared: Arc<Shared>,
    addrs: Vec<(String, SocketAddr)>,
    admin_addr: SocketAddr,
    stop: watch::Sender<bool>,
    drain: Drain,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl RunningGateway {
    /// The bound address of a listener (useful with port 0).
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.addrs.iter().find(|(n, _)| n == name).map(|(_, a)| *a)
    }

    /// The bound admin address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Shared state (metrics, snapshot, reload).
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Reloads on SIGHUP and whenever the config file changes on disk.
    /// Does nothing for configurations that do not come from a file.
    ///
    /// The file is polled (`stat`, every [`CONFIG_POLL_INTERVAL`]) from the runtime rather
    /// than watched with inotify: a watcher needs a thread of its own, and a second thread
    /// makes every socket call of a one-worker gateway pay for glibc's cancellation
    /// bookkeeping and the kernel's shared file-table reference counts (1.3% of req/s,
    /// docs/perf.md). Polling the path also follows symlink swaps, which is how
    /// Kubernetes updates a mounted ConfigMap.
    pub fn spawn_reload_triggers(&self) {
        let file: PathBuf = self.shared.snapshot.load().source.file.clone();
        if !file.is_file() {
            return;
        }
        let shared = self.shared.clone();
        let mut stop = self.stop.subscribe();
        tokio::spawn(async move {
            #[cfg(unix)]
            let mut hup = match tokio::signal::unix::signal(
                tokio::signal::unix::SignalKind::hangup(),
            ) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot install the SIGHUP handler; file changes still reload");
                    None
                }
            };
            let mut poll = tokio::time::interval(CONFIG_POLL_INTERVAL);
            poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut seen = FileStamp::of(&file);
            loop {
                // Resolves on a SIGHUP; never once the signal stream has ended.
                #[cfg(unix)]
                let hangup = async {
                    if let Some(s) = hup.as_mut() {
                        if s.recv().await.is_some() {
                            return;
                        }
                    }
                    std::future::pending::<()>().await
                };
                #[cfg(not(unix))]
                let hangup = std::future::pending::<()>();
                tokio::select! {
                    _ = stop.changed() => break,
                    _ = hangup => tracing::info!("SIGHUP: reloading configuration"),
                    _ = poll.tick() => {
                        if FileStamp::of(&file) == seen {
                            continue;
                        }
                        // Editors and deploy tools write in several steps: wait until the
                        // file has stopped changing (bounded) before reading it.
                        let mut last = FileStamp::of(&file);
                        for _ in 0..20 {
                            tokio::time::sleep(Duration::from_millis(150)).await;
                            let now = FileStamp::of(&file);
                            if now == last {
                                break;
                            }
                            last = now;
                        }
                        tracing::info!(file = %file.display(), "configuration file changed: reloading");
                    }
                }
                seen = FileStamp::of(&file);
                // Building a new snapshot compiles every engine (up to ~100 ms): off the
                // request threads.
                let s = shared.clone();
                let _ = tokio::task::spawn_blocking(move || s.reload_from_file()).await;
            }
        });
    }

    /// Stops accepting, lets in-flight requests finish (up to `deadline`), then returns.
    /// Returns true when everything drained in time.
    pub async fn shutdown(mut self, deadline: Duration) -> bool {
        self.shared.draining.store(true, Ordering::Relaxed);
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        tokio::time::timeout(deadline, self.drain.wait())
            .await
            .is_ok()
    }
}
