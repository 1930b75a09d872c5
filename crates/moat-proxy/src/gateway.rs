//! The running gateway: configuration snapshots, listeners, reload and shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hyper_util::rt::TokioExecutor;
use moat_config::ConfigError;
use moat_core::{Connection, HandshakeRecord};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, AdminRouter};
use crate::config::{self, ConfigSource, GatewayConfig};
use crate::connection::{conn_info, watchdog, ConnWatch, Drain, OnOwnWake};
use crate::decision;
use crate::downstream_conn::DownstreamIo;
use crate::events::EventSink;
use crate::metrics::{Metrics, Phase};
use crate::pipeline::{default_factory, PipelineFactory};
use crate::server;
use crate::state::{build_snapshot, Shared};

/// Options for [`Gateway::new`].
pub struct GatewayOptions {
    /// Builds the phase pipeline from the config (default: [`crate::pipeline::build_pipeline`]).
    pub pipeline_factory: PipelineFactory,
    /// Where access, security and TLS records go.
    pub events: Option<Arc<dyn EventSink>>,
    /// Admin routes added to the built-in ones.
    pub admin: AdminRouter,
    /// The event sinks and span exporter (`telemetry:`), reconfigured by reloads;
    /// none: no tracing, and a reload does not start sinks.
    pub telemetry: Option<Arc<moat_sinks::Telemetry>>,
}

impl Default for GatewayOptions {
    fn default() -> Self {
        GatewayOptions {
            pipeline_factory: default_factory(),
            events: None,
            admin: AdminRouter::new(),
            telemetry: None,
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
        let tracer = opts.telemetry.as_ref().and_then(|t| t.tracer());
        let snap = build_snapshot(
            cfg,
            src,
            &metrics,
            opts.events.as_ref(),
            &opts.pipeline_factory,
            tracer,
        )?;
        let shared = Arc::new(Shared {
            snapshot: ArcSwap::from_pointee(snap),
            metrics,
            events: opts.events,
            telemetry: opts.telemetry,
            pipeline_factory: opts.pipeline_factory,
            ready: false.into(),
            draining: false.into(),
            generation: AtomicU64::new(0),
            reloads: Default::default(),
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
        let listener = snap.listeners.iter().find(|l| l.name == name);
        if let Some(rt) = listener.and_then(|l| l.tcp.clone()) {
            // A tcp listener: the snapshot of this moment decides the connection.
            tokio::spawn(crate::tcp::serve(crate::tcp::TcpConn {
                shared: shared.clone(),
                listener: name.as_str().into(),
                rt,
                tls: listener.and_then(|l| l.tls.clone()),
                authz: snap.pipeline.engines.authz.clone(),
                tcp,
                peer,
                local,
                drain: drain.clone(),
            }));
            continue;
        }
        if listener.is_some_and(|l| l.decision.is_some()) {
            let tls = listener.and_then(|l| l.tls.clone());
            drop(snap);
            tokio::spawn(serve_decision(
                shared.clone(),
                name.as_str().into(),
                tls,
                tcp,
                peer,
                local,
                drain.clone(),
            ));
            continue;
        }
        let (tls, http_opts) = listener
            .map(|l| (l.tls.clone(), (l.xff_hops, l.underscores)))
            .unwrap_or_default();
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
                    let ci = conn_info(peer, local, None, http_opts, watch);
                    server::serve(shared, h2, drain, ci, DownstreamIo::Plain(tcp)).await;
                }
                Some(t) => match t.accept(tcp).await {
                    Ok(moat_tls::Accepted::Plain(tcp)) => {
                        let ci = conn_info(peer, local, None, http_opts, watch);
                        server::serve(shared, h2, drain, ci, DownstreamIo::Plain(tcp)).await;
                    }
                    Ok(moat_tls::Accepted::Tls {
                        stream,
                        session,
                        handshake,
                    }) => {
                        let ci = conn_info(peer, local, Some(session), http_opts, watch);
                        on_connection(&shared, &ci.conn, &handshake);
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
                },
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

/// A decision listener's connection, after its TLS handshake when it has TLS.
async fn serve_decision(
    shared: Arc<Shared>,
    name: Arc<str>,
    tls: Option<moat_tls::TlsAcceptor>,
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    drain: watch::Receiver<bool>,
) {
    let Some(t) = tls else {
        return decision::serve(shared, name, tcp, peer, local, drain).await;
    };
    match t.accept(tcp).await {
        Ok(moat_tls::Accepted::Plain(tcp)) => {
            decision::serve(shared, name, tcp, peer, local, drain).await
        }
        Ok(moat_tls::Accepted::Tls { stream, .. }) => {
            decision::serve(shared, name, stream, peer, local, drain).await
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

/// Runs the connection phases (TLS audit among them) on a completed handshake.
fn on_connection(shared: &Shared, conn: &Connection, hs: &HandshakeRecord) {
    let snap = shared.snapshot.load();
    if snap.pipeline.connection.is_empty() {
        return;
    }
    let t = Instant::now();
    for p in &snap.pipeline.connection {
        p.on_connection(conn, hs);
    }
    shared.metrics.phase(Phase::Connection).observe(t.elapsed());
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

/// The files a reload re-reads: the config file, and the files it names whose change
/// should reload it (access control policy files and directories, the WAF's virtual
/// patch files, the secret rules), resolved against the config file's directory.
fn watched_files(snap: &crate::state::Snapshot) -> Vec<PathBuf> {
    let cfg = &snap.config;
    let base = &snap.source.base_dir;
    let mut files = vec![snap.source.file.clone()];
    if cfg.authz.enabled {
        files.extend(cfg.authz.policies.iter().map(|p| base.join(p)));
    }
    if cfg.waf.enabled {
        files.extend(cfg.waf.virtual_patches.files.iter().map(|p| base.join(p)));
    }
    if cfg.secrets.enabled {
        files.extend(cfg.secrets.rules.iter().map(|p| base.join(p)));
    }
    files
}

/// The stamps of `files`, in order.
fn stamps(files: &[PathBuf]) -> Vec<FileStamp> {
    files.iter().map(|f| FileStamp::of(f)).collect()
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
            let mut watched = watched_files(&shared.snapshot.load());
            let mut seen = stamps(&watched);
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
                        if stamps(&watched) == seen {
                            continue;
                        }
                        // Editors and deploy tools write in several steps: wait until the
                        // files have stopped changing (bounded) before reading them.
                        let mut last = stamps(&watched);
                        for _ in 0..20 {
                            tokio::time::sleep(Duration::from_millis(150)).await;
                            let now = stamps(&watched);
                            if now == last {
                                break;
                            }
                            last = now;
                        }
                        tracing::info!(file = %file.display(), "configuration or a file it names changed: reloading");
                    }
                }
                // Building a new snapshot compiles every engine (up to ~100 ms): off the
                // request threads.
                let s = shared.clone();
                let _ = tokio::task::spawn_blocking(move || s.reload_from_file()).await;
                // The new config may name other files.
                watched = watched_files(&shared.snapshot.load());
                seen = stamps(&watched);
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
