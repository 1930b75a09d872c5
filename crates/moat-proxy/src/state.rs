//! The gateway's shared state: the configuration snapshot a request runs against
//! (routes, clusters, the phase pipeline), swapped atomically on reload, and the state
//! shared by listeners, the admin API and the request path.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use moat_config::ConfigError;
use moat_core::fields::CgiTwins;

use crate::body::BodyPace;
use crate::config::{self, ConfigSource, GatewayConfig};
use crate::events::EventSink;
use crate::h1::client::{X_FORWARDED_FOR, X_FORWARDED_PROTO, X_REQUEST_ID};
use crate::metrics::{Metrics, RouteMetrics, TcpMetrics};
use crate::pipeline::{Pipeline, PipelineFactory};
use crate::reloads::{ReloadHistory, ReloadRecord};
use crate::routing::{HostMatch, Route};
use crate::tls_audit::TlsAudit;
use crate::upstream::Cluster;

/// A listener as a snapshot configures it (its socket is bound once, at start).
pub(crate) struct ListenerRt {
    pub(crate) name: String,
    pub(crate) tls: Option<moat_tls::TlsAcceptor>,
    pub(crate) xff_hops: u32,
    pub(crate) underscores: config::UnderscoreHeaders,
    /// Set for a `protocol: tcp` listener.
    pub(crate) tcp: Option<Arc<TcpListenerRt>>,
    /// Set for a `protocol: decision` listener.
    pub(crate) decision: Option<Arc<DecisionRt>>,
}

/// A `protocol: decision` listener as a snapshot configures it: the workload its
/// decisions are for (as a route's, for the policies' selectors) and its limits.
pub(crate) struct DecisionRt {
    /// The listener's name: the `route` of its requests in records and metrics.
    pub(crate) name: Arc<str>,
    pub(crate) labels: Arc<BTreeMap<String, String>>,
    pub(crate) namespace: Arc<str>,
    /// Peers whose forwarding headers are believed.
    pub(crate) trusted_proxies: Vec<ipnet::IpNet>,
    pub(crate) max_body: u64,
    pub(crate) monitor_only: bool,
    pub(crate) metrics: Arc<RouteMetrics>,
}

/// Where a tcp listener sends a connection: a cluster and its workload (the labels and
/// namespace AuthorizationPolicies select, as for HTTP routes).
pub(crate) struct TcpTarget {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) labels: Arc<BTreeMap<String, String>>,
    pub(crate) namespace: Arc<str>,
    pub(crate) connect_timeout: Duration,
}

/// A `protocol: tcp` listener as a snapshot configures it.
pub(crate) struct TcpListenerRt {
    /// `listeners[].cluster`: every connection, or with `sni_routes` the ones whose SNI
    /// matched no entry (or had none).
    pub(crate) default: Option<TcpTarget>,
    /// `listeners[].sni_routes`, most specific first: exact names, then `*.suffix` by
    /// decreasing length, then `*`.
    pub(crate) sni: Vec<(HostMatch, TcpTarget)>,
    /// `None` = never.
    pub(crate) idle_timeout: Option<Duration>,
    /// `None` = never.
    pub(crate) max_duration: Option<Duration>,
    pub(crate) metrics: Arc<TcpMetrics>,
}

impl TcpListenerRt {
    /// True for TLS passthrough (routing by the ClientHello's SNI).
    pub(crate) fn passthrough(&self) -> bool {
        !self.sni.is_empty()
    }

    /// The target for a connection with this SNI.
    pub(crate) fn target(&self, sni: Option<&str>) -> Option<&TcpTarget> {
        sni.and_then(|h| self.sni.iter().find(|(m, _)| m.matches(h)).map(|(_, t)| t))
            .or(self.default.as_ref())
    }
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
    /// The fields moat writes and the phases decide on: their CGI twins are removed
    /// from each request before the phases read it.
    pub(crate) cgi_twins: CgiTwins,
    pub(crate) no_route: Arc<RouteMetrics>,
    /// The span exporter for requests on this snapshot (a reload may change it).
    pub(crate) tracer: Option<Arc<moat_sinks::Tracer>>,
}

impl Snapshot {
    /// The `protocol: decision` listener named `name`, if this snapshot has it.
    pub(crate) fn decision_listener(&self, name: &str) -> Option<&DecisionRt> {
        self.listeners
            .iter()
            .find(|l| l.name == name)
            .and_then(|l| l.decision.as_deref())
    }

    /// First route matching host and path.
    #[inline]
    pub fn match_route(&self, host: &str, path: &str) -> Option<&Route> {
        crate::routing::match_route(&self.routes, host, path)
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
    /// The event sinks and span exporter, reconfigured by each reload.
    pub telemetry: Option<Arc<moat_sinks::Telemetry>>,
    pub(crate) pipeline_factory: PipelineFactory,
    pub(crate) ready: std::sync::atomic::AtomicBool,
    pub(crate) draining: std::sync::atomic::AtomicBool,
    /// Incremented after each new snapshot is installed (see [`CachedSnapshot`]).
    pub(crate) generation: AtomicU64,
    /// The last reloads, applied or refused.
    pub reloads: ReloadHistory,
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

impl Shared {
    /// Builds a snapshot from a validated configuration.
    fn build(
        &self,
        cfg: GatewayConfig,
        src: ConfigSource,
        tracer: Option<Arc<moat_sinks::Tracer>>,
    ) -> Result<Snapshot, ConfigError> {
        build_snapshot(
            cfg,
            src,
            &self.metrics,
            self.events.as_ref(),
            &self.pipeline_factory,
            tracer,
        )
    }

    /// Starts the sinks and tracer `cfg` adds or changes (committed with the snapshot).
    fn prepare_telemetry(
        &self,
        cfg: &GatewayConfig,
        src: &ConfigSource,
    ) -> Result<Option<moat_sinks::Change<'_>>, ConfigError> {
        let Some(t) = &self.telemetry else {
            return Ok(None);
        };
        if self.events.is_none() && !cfg.telemetry.sinks.is_empty() {
            // No event queue was started: nothing would feed the sinks.
            tracing::warn!(
                "moat started without any event output: restart it to start event sinks"
            );
        }
        t.prepare(&cfg.telemetry, &src.base_dir)
            .map(Some)
            .map_err(|e| {
                // Locate the sink that could not start (else it was the tracer).
                let sink = match &e {
                    moat_sinks::SinkError::Sink { name, .. } => cfg
                        .telemetry
                        .sinks
                        .iter()
                        .enumerate()
                        .find(|(_, s)| &s.name.value == name),
                    _ => None,
                };
                match sink {
                    Some((i, s)) => ConfigError::semantic(
                        &src.file,
                        s.name.referenced.line() as u32,
                        s.name.referenced.column() as u32,
                        format!("telemetry.sinks[{i}]"),
                        e.to_string(),
                    ),
                    None => {
                        ConfigError::semantic(&src.file, 0, 0, "telemetry.tracing", e.to_string())
                    }
                }
            })
    }

    /// Validates and installs a new configuration. Listener addresses are not
    /// changed by a reload (a restart is needed); everything else is.
    pub fn apply(&self, cfg: GatewayConfig, src: ConfigSource) -> Result<(), ConfigError> {
        self.apply_recorded(cfg, src, "api", None)
    }

    /// [`apply`](Self::apply), recorded in [`reloads`](Self::reloads) with its origin
    /// and, when the caller computed it, the change as a diff.
    pub fn apply_recorded(
        &self,
        cfg: GatewayConfig,
        src: ConfigSource,
        origin: &str,
        diff: Option<String>,
    ) -> Result<(), ConfigError> {
        let result = self.install(cfg, src);
        self.record(origin, diff, &result);
        result
    }

    fn record(&self, origin: &str, diff: Option<String>, result: &Result<(), ConfigError>) {
        self.reloads.push(ReloadRecord {
            at_ms: moat_core::clock::unix_millis(),
            origin: origin.to_string(),
            ok: result.is_ok(),
            error: result.as_ref().err().map(|e| e.to_string()),
            diff,
        });
    }

    fn install(&self, cfg: GatewayConfig, src: ConfigSource) -> Result<(), ConfigError> {
        let result = config::validate(&src, &cfg).and_then(|_| {
            let change = self.prepare_telemetry(&cfg, &src)?;
            let tracer = match &change {
                Some(c) => c.tracer(),
                None => None,
            };
            Ok((self.build(cfg, src, tracer)?, change))
        });
        match result {
            Ok((snap, change)) => {
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
                if let Some(change) = change {
                    let (added, removed) = change.commit();
                    if !added.is_empty() || !removed.is_empty() {
                        tracing::info!(?added, ?removed, "event sinks started and stopped");
                    }
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
        self.reload_from_file_recorded("file", None)
    }

    /// [`reload_from_file`](Self::reload_from_file), recorded in
    /// [`reloads`](Self::reloads) with its origin and diff.
    pub fn reload_from_file_recorded(
        &self,
        origin: &str,
        diff: Option<String>,
    ) -> Result<(), ConfigError> {
        let file = self.snapshot.load().source.file.clone();
        let result = match config::load_file(&file) {
            Ok((cfg, src)) => self.install(cfg, src),
            Err(e) => {
                self.metrics.reloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "configuration refused; the previous one keeps serving");
                Err(e)
            }
        };
        self.record(origin, diff, &result);
        result
    }

    /// True once listeners are bound and until shutdown starts.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed)
    }
}

/// Labels and namespace of a cluster's workload.
type WorkloadMeta = (Arc<BTreeMap<String, String>>, Arc<str>);

/// Resolves a tcp listener's clusters (validated to exist: a missing one is skipped).
fn tcp_listener(
    l: &config::ListenerConfig,
    cfg: &GatewayConfig,
    clusters: &HashMap<&str, Arc<Cluster>>,
    meta: &HashMap<&str, WorkloadMeta>,
    metrics: &Metrics,
) -> TcpListenerRt {
    let target = |name: &str| {
        let cluster = clusters.get(name)?.clone();
        let (labels, namespace) = meta.get(name)?.clone();
        let connect_timeout = cfg
            .clusters
            .iter()
            .find(|c| c.name.value == name)?
            .connect_timeout;
        Some(TcpTarget {
            cluster,
            labels,
            namespace,
            connect_timeout,
        })
    };
    let mut sni: Vec<(&String, TcpTarget)> = l
        .sni_routes
        .iter()
        .filter_map(|(h, c)| Some((h, target(&c.value)?)))
        .collect();
    // Exact names first, then longer suffixes before shorter ones, `*` last.
    sni.sort_by_key(|(h, _)| match h.strip_prefix('*') {
        None => (0, 0),
        Some(rest) => (1, usize::MAX - rest.len()),
    });
    let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
    TcpListenerRt {
        default: l.cluster.as_ref().and_then(|c| target(&c.value)),
        sni: sni
            .into_iter()
            .map(|(h, t)| (HostMatch::parse(h), t))
            .collect(),
        idle_timeout: nonzero(l.idle_timeout.unwrap_or(config::DEFAULT_TCP_IDLE_TIMEOUT)),
        max_duration: l.max_duration.and_then(nonzero),
        metrics: metrics.tcp_listener(&l.name.value),
    }
}

/// Builds a snapshot (clusters, routes, listeners' TLS, the phase pipeline) from a
/// validated configuration.
pub(crate) fn build_snapshot(
    cfg: GatewayConfig,
    src: ConfigSource,
    metrics: &Arc<Metrics>,
    events: Option<&Arc<dyn EventSink>>,
    factory: &PipelineFactory,
    tracer: Option<Arc<moat_sinks::Tracer>>,
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
        crate::upstream::report_health(&cluster);
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
        if let Some((j, http)) = r.upgrades.iter().enumerate().find(|(_, p)| {
            let name = p.value.split('/').next().unwrap_or_default().trim();
            ["h2c", "h2", "http"]
                .iter()
                .any(|h| name.eq_ignore_ascii_case(h))
        }) {
            return Err(ConfigError::semantic(
                &src.file,
                http.referenced.line() as u32,
                http.referenced.column() as u32,
                format!("routes[{i}].upgrades[{j}]"),
                format!(
                    "`{}` cannot be allowed: after an upgrade to HTTP the connection would \
                     carry requests to the upstream that moat never inspects",
                    http.value
                ),
            ));
        }
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
            upgrades: r.upgrades.iter().map(|p| p.value.trim().into()).collect(),
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
        let (mut tcp, mut decision) = (None, None);
        match l.protocol {
            config::ListenerProtocol::Http => {}
            config::ListenerProtocol::Tcp => {
                tcp = Some(Arc::new(tcp_listener(l, &cfg, &clusters, &meta, metrics)));
            }
            config::ListenerProtocol::Decision => {
                let d = l.decision.clone().unwrap_or_default();
                decision = Some(Arc::new(DecisionRt {
                    name: l.name.value.as_str().into(),
                    labels: Arc::new(d.labels),
                    namespace: d.namespace.into(),
                    // Validated by `config::validate`.
                    trusted_proxies: d
                        .trusted_proxies
                        .iter()
                        .filter_map(|p| config::parse_net(&p.value))
                        .collect(),
                    max_body: d.max_body,
                    monitor_only: d.monitor_only,
                    metrics: metrics.route(&l.name.value),
                }));
            }
        }
        listeners.push(ListenerRt {
            name: l.name.value.clone(),
            tls,
            xff_hops: l.xff_trusted_hops,
            underscores: l.headers_with_underscores,
            tcp,
            decision,
        });
    }
    let mut pipeline = factory(&cfg, &src)?;
    if cfg.tls_audit.enabled {
        pipeline
            .connection
            .push(Arc::new(TlsAudit::new(metrics.clone(), events.cloned())));
    }
    let written = [&X_FORWARDED_FOR, &X_FORWARDED_PROTO, &X_REQUEST_ID];
    let cgi_twins = CgiTwins::new(
        written.into_iter().cloned().chain(
            pipeline
                .request_headers
                .iter()
                .flat_map(|p| p.fields_decided_on()),
        ),
    );
    Ok(Snapshot {
        max_headers: cfg.limits.max_headers,
        cgi_twins,
        max_header_bytes: cfg.limits.max_header_bytes.min(usize::MAX as u64) as usize,
        no_route: metrics.route("_none_"),
        config: Arc::new(cfg),
        source: src,
        routes,
        pipeline,
        listeners,
        tracer,
    })
}
