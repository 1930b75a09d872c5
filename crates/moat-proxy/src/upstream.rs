//! Upstream clusters: endpoints, round-robin balancing, passive ejection, the keep-alive
//! connection pool and the HTTP/1.1 client that drives each exchange.
//!
//! The exchange runs in the task that serves the downstream connection: the request is
//! written and the response head read on the pooled connection directly, and the
//! response body ([`UpstreamBody`]) is decoded from it while hyper's server writes it
//! downstream. There is no client connection task and no channel between tasks.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::task::Poll;

use http::uri::{Authority, Scheme};
use http::{Method, Response};
use http_body_util::BodyExt;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Sleep;

pub use crate::h1::client::ProtocolError;
pub use crate::h1::client::UpstreamHead;
use crate::h1::client::{self as h1, RequestFraming};
pub(crate) use crate::h1::client::{X_FORWARDED_FOR, X_REQUEST_ID};
use crate::upstream_conn::{Conn, Failure};
pub use crate::upstream_conn::{EndpointPool, UpstreamBody, UpstreamError, UpstreamStream};

use crate::body::ProxyBody;
use crate::config::ClusterConfig;
use crate::metrics::{ClusterMetrics, Metrics};

/// Request bodies up to this size that are in memory go out in the same write as the
/// request head (and can be replayed on a fresh connection, see [`Cluster::send`]).
const INLINE_BODY: usize = 64 << 10;

impl Conn {
    /// Writes the request: `wbuf` (head, and the body when it was inlined), then the
    /// streamed body when there is one.
    async fn write_request(
        &mut self,
        body: Option<ProxyBody>,
        framing: RequestFraming,
        progress: &Progress,
    ) -> Result<(), Failure> {
        // Nothing of a request whose body is inlined reached a closed pooled connection.
        let replayable = body.is_none() && self.reused;
        self.io
            .write_all(&self.wbuf)
            .await
            .map_err(|e| Failure::io(e, replayable))?;
        if let Some(mut body) = body {
            let chunked = framing == RequestFraming::Chunked;
            let mut trailers = None;
            loop {
                // Waiting for the client is not the upstream's delay.
                progress.client_turn(true);
                let frame = body.frame().await;
                progress.client_turn(false);
                progress.mark();
                let Some(frame) = frame else { break };
                let frame = frame.map_err(|e| Failure::fatal(UpstreamError::RequestBody(e)))?;
                match frame.into_data() {
                    Ok(data) if chunked => {
                        self.wbuf.clear();
                        crate::h1::encode_chunk(&mut self.wbuf, &data);
                        self.io.write_all(&self.wbuf).await
                    }
                    Ok(data) => self.io.write_all(&data).await,
                    Err(frame) => {
                        trailers = frame.into_trailers().ok();
                        Ok(())
                    }
                }
                .map_err(|e| Failure::io(e, false))?;
            }
            if chunked {
                self.wbuf.clear();
                crate::h1::encode_chunked_end(&mut self.wbuf, trailers.as_ref());
                self.io
                    .write_all(&self.wbuf)
                    .await
                    .map_err(|e| Failure::io(e, false))?;
            }
        }
        // TLS buffers records until flushed.
        self.io.flush().await.map_err(|e| Failure::io(e, false))
    }
}

/// A request to send upstream: its head (rewritten as it is written out: hop-by-hop
/// fields dropped, `Host` and `X-Forwarded-*` set, without copying the header map)
/// and its body.
#[derive(Debug)]
pub struct UpstreamRequest<'a> {
    /// The head.
    pub head: UpstreamHead<'a>,
    /// The body.
    pub body: ProxyBody,
}

/// When a request last made progress towards the upstream (see [`Cluster::send`]).
#[derive(Debug)]
struct Progress {
    start: tokio::time::Instant,
    /// Milliseconds after `start` of the last piece of body read from the client.
    last_ms: AtomicU64,
    /// True while the request waits for the client's body.
    client_turn: AtomicBool,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            start: tokio::time::Instant::now(),
            last_ms: AtomicU64::new(0),
            client_turn: AtomicBool::new(false),
        }
    }

    fn client_turn(&self, waiting: bool) {
        self.client_turn.store(waiting, Ordering::Relaxed);
    }

    fn mark(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> tokio::time::Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// Runs `fut` until `limit` passes without progress while it waits for the upstream
/// (`timer` is the deadline's timer, moved only when it fires).
async fn within<T>(
    timer: &mut Pin<Box<Sleep>>,
    progress: &Progress,
    limit: Duration,
    fut: impl Future<Output = Result<T, UpstreamError>>,
) -> Result<T, UpstreamError> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = fut.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        loop {
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let now = tokio::time::Instant::now();
            let deadline = if progress.client_turn.load(Ordering::Relaxed) {
                now + limit
            } else {
                progress.last() + limit
            };
            if deadline <= now {
                return Poll::Ready(Err(UpstreamError::Timeout));
            }
            timer.as_mut().reset(deadline);
        }
    })
    .await
}

/// The response to hand downstream: the head, and the body still on `conn`.
fn response(ep: &Endpoint, head: h1::ResponseHead, conn: Box<Conn>) -> Response<UpstreamBody> {
    let body = if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
        // The connection now carries the new protocol: see `into_upgraded`.
        UpstreamBody::switching(conn, head.decoder, ep.pool.clone())
    } else {
        UpstreamBody::new(conn, head.decoder, head.keep_alive, ep.pool.clone())
    };
    let mut resp = Response::new(body);
    *resp.status_mut() = head.status;
    *resp.version_mut() = head.version;
    *resp.headers_mut() = head.headers;
    resp
}

/// How the body of `req` goes on the wire: from the body moat forwards (its exact
/// length when known, else chunked), never from the client's framing fields.
pub(crate) fn request_framing(req: &UpstreamRequest<'_>) -> RequestFraming {
    if http_body::Body::is_end_stream(&req.body) {
        // RFC 9110 8.6: a request whose method expects content says it has none.
        return if matches!(*req.head.method, Method::POST | Method::PUT | Method::PATCH) {
            RequestFraming::Length(0)
        } else {
            RequestFraming::None
        };
    }
    match http_body::Body::size_hint(&req.body).exact() {
        Some(n) => RequestFraming::Length(n),
        None => RequestFraming::Chunked,
    }
}

/// One upstream endpoint with its health state and connection pool.
#[derive(Debug)]
pub struct Endpoint {
    /// `host:port`.
    pub authority: Authority,
    /// Idle keep-alive connections.
    pub pool: Arc<EndpointPool>,
    consecutive_failures: AtomicU32,
    consecutive_5xx: AtomicU32,
    ejected_until_ms: AtomicU64,
}

/// A named group of endpoints with its connection pool.
#[derive(Debug)]
pub struct Cluster {
    /// Cluster name.
    pub name: Arc<str>,
    /// Endpoints, balanced round-robin.
    pub endpoints: Vec<Endpoint>,
    next: AtomicUsize,
    /// Scheme used towards the endpoints.
    pub scheme: Scheme,
    tls: Option<Arc<moat_tls::UpstreamConnector>>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle_purge: Duration,
    /// Time allowed for the response head.
    pub request_timeout: Duration,
    eject_after: u32,
    eject_after_5xx: u32,
    eject_for: Duration,
    /// Counters.
    pub metrics: Arc<ClusterMetrics>,
}

fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

impl Cluster {
    /// Builds a cluster (and its pool) from config. Endpoints were validated at load.
    pub fn build(
        cfg: &ClusterConfig,
        base_dir: &Path,
        metrics: &Metrics,
    ) -> Result<Cluster, String> {
        if cfg.endpoints.is_empty() {
            return Err("a cluster needs at least one endpoint".into());
        }
        let cluster_metrics = metrics.cluster(&cfg.name.value);
        let mut endpoints = Vec::with_capacity(cfg.endpoints.len());
        for e in &cfg.endpoints {
            let authority: Authority = e
                .value
                .parse()
                .map_err(|_| format!("`{}` is not a host:port endpoint", e.value))?;
            endpoints.push(Endpoint {
                authority,
                pool: Arc::new(EndpointPool::new(
                    cfg.max_idle_per_endpoint,
                    cfg.read_timeout,
                    cluster_metrics.clone(),
                )),
                consecutive_failures: AtomicU32::new(0),
                consecutive_5xx: AtomicU32::new(0),
                ejected_until_ms: AtomicU64::new(0),
            });
        }
        let tls = match &cfg.tls {
            None => None,
            Some(t) => Some(Arc::new(
                moat_tls::UpstreamConnector::new(t, base_dir).map_err(|e| format!("tls: {e}"))?,
            )),
        };
        let scheme = if tls.is_some() {
            Scheme::HTTPS
        } else {
            Scheme::HTTP
        };
        Ok(Cluster {
            name: cfg.name.value.as_str().into(),
            endpoints,
            next: AtomicUsize::new(0),
            scheme,
            tls,
            connect_timeout: cfg.connect_timeout,
            idle_timeout: cfg.idle_timeout,
            idle_purge: cfg.idle_purge,
            request_timeout: cfg.request_timeout,
            eject_after: cfg.ejection.consecutive_failures,
            eject_after_5xx: cfg.ejection.consecutive_5xx,
            eject_for: cfg.ejection.duration,
            metrics: cluster_metrics,
        })
    }

    /// Sends a request to endpoint `i` on a pooled keep-alive connection (or a new one)
    /// and reads the response head; the body is read from the returned
    /// [`UpstreamBody`], which pools the connection at its end.
    ///
    /// The call is bounded by the cluster's `request_timeout` ([`UpstreamError::Timeout`])
    /// counted from the last progress of the request: from the start, or from the last
    /// piece of a streamed request body the upstream took. A body that arrives slowly
    /// from the client is the client's delay, bounded by the route's body pace
    /// ([`crate::body::BodyPace`]), not the upstream's. When a pooled connection turns
    /// out to have been closed by the upstream (the usual keep-alive race) before the
    /// request could be written, or, for idempotent methods, before any response byte
    /// arrived, a request whose body is in memory is sent again once on a new
    /// connection.
    pub async fn send(
        &self,
        i: usize,
        req: UpstreamRequest<'_>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        let progress = Progress::new();
        let deadline = progress.start + self.request_timeout;
        let ep = &self.endpoints[i];
        let Some(mut conn) = ep.pool.checkout(self.idle_timeout) else {
            // Boxed: this cold path would otherwise size every request's future
            // (which is moved several times per request) to hold a connect.
            let fresh = Box::pin(async {
                let conn = self.connect(ep).await?;
                self.exchange(ep, conn, req, &progress).await
            });
            let mut timer = Box::pin(tokio::time::sleep_until(deadline));
            let (head, mut conn) =
                within(&mut timer, &progress, self.request_timeout, fresh).await?;
            conn.timer = Some(timer);
            return Ok(response(ep, head, conn));
        };
        let mut timer = match conn.timer.take() {
            Some(mut t) => {
                t.as_mut().reset(deadline);
                t
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        let exchange = self.exchange(ep, conn, req, &progress);
        let (head, mut conn) =
            within(&mut timer, &progress, self.request_timeout, exchange).await?;
        conn.timer = Some(timer);
        Ok(response(ep, head, conn))
    }

    /// One exchange on `conn` (plus, when it fails in a replayable way, one on a new
    /// connection).
    async fn exchange(
        &self,
        ep: &Endpoint,
        mut conn: Box<Conn>,
        req: UpstreamRequest<'_>,
        progress: &Progress,
    ) -> Result<(h1::ResponseHead, Box<Conn>), UpstreamError> {
        let framing = request_framing(&req);
        conn.wbuf.clear();
        h1::encode_request_head(&mut conn.wbuf, &req.head, framing);
        let (method, upgrade) = (req.head.method, req.head.upgrade);
        // Small bodies in memory leave in the same write as the head.
        let streamed = match req.body {
            ProxyBody::Empty | ProxyBody::Full(None) => None,
            ProxyBody::Full(Some(b)) if b.len() <= INLINE_BODY => {
                conn.wbuf.extend_from_slice(&b);
                None
            }
            body => Some(body),
        };
        let inline = streamed.is_none();
        let mut result =
            Self::round_trip(&mut conn, streamed, framing, method, upgrade, progress).await;
        if let Err(f) = &result {
            if inline && f.replayable {
                tracing::debug!(endpoint = %ep.authority, "pooled upstream connection was closed; sending again on a new one");
                let mut fresh = Box::pin(self.connect(ep)).await?;
                std::mem::swap(&mut fresh.wbuf, &mut conn.wbuf);
                conn = fresh;
                result =
                    Self::round_trip(&mut conn, None, framing, method, upgrade, progress).await;
            }
        }
        let head = result.map_err(|f| f.error)?;
        Ok((head, conn))
    }

    async fn round_trip(
        conn: &mut Conn,
        body: Option<ProxyBody>,
        framing: RequestFraming,
        method: &Method,
        upgrade: bool,
        progress: &Progress,
    ) -> Result<h1::ResponseHead, Failure> {
        conn.write_request(body, framing, progress).await?;
        conn.read_head(method, upgrade).await
    }

    /// Opens a connection to `ep`: TCP, then TLS when configured, within the connect
    /// timeout.
    async fn connect(&self, ep: &Endpoint) -> Result<Box<Conn>, UpstreamError> {
        let open = async {
            // An IP literal is connected to directly; a name is resolved on tokio's
            // blocking pool (a thread hop), so only names pay for it.
            let tcp = match ep.authority.as_str().parse::<std::net::SocketAddr>() {
                Ok(addr) => TcpStream::connect(addr).await,
                Err(_) => TcpStream::connect(ep.authority.as_str()).await,
            }
            .map_err(|e| UpstreamError::Connect(Box::new(e)))?;
            let _ = tcp.set_nodelay(true);
            let io = match &self.tls {
                None => UpstreamStream::Plain(tcp),
                Some(t) => {
                    let host = ep.authority.host().trim_matches(['[', ']']);
                    let (s, _handshake) = t
                        .connect(tcp, host)
                        .await
                        .map_err(|e| UpstreamError::Connect(Box::new(e)))?;
                    UpstreamStream::Tls(Box::new(s))
                }
            };
            Ok(Conn::new(io))
        };
        tokio::time::timeout(self.connect_timeout, open)
            .await
            .unwrap_or(Err(UpstreamError::ConnectTimeout))
    }

    /// Closes idle connections older than the idle timeout (run periodically).
    pub fn prune_idle(&self) {
        for e in &self.endpoints {
            e.pool.prune(self.idle_timeout);
        }
    }

    /// Ends a purge interval of every endpoint's pool (see [`EndpointPool`]): half
    /// of the connections left idle since the previous call are closed. Returns how
    /// many were closed. The reaper calls it every `idle_purge`.
    pub fn purge_idle(&self) -> usize {
        self.endpoints.iter().map(|e| e.pool.purge()).sum()
    }

    /// The idle timeout of pooled connections.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// Picks the next endpoint round-robin, skipping ejected ones (when every endpoint
    /// is ejected, the round-robin choice is used anyway).
    pub fn pick(&self) -> usize {
        let n = self.endpoints.len();
        if n == 1 {
            // Nothing to balance (an ejected only endpoint is used anyway).
            return 0;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        if self.eject_after == 0 {
            return start;
        }
        let mut now = 0;
        for k in 0..n {
            let i = (start + k) % n;
            let until = self.endpoints[i].ejected_until_ms.load(Ordering::Relaxed);
            if until == 0 {
                return i;
            }
            if now == 0 {
                now = now_ms();
            }
            if until <= now {
                return i;
            }
        }
        start
    }

    /// Records a response from an endpoint: a 5xx counts towards ejection when
    /// `consecutive_5xx` is set; any other status is a success.
    #[inline]
    pub fn responded(&self, i: usize, status: http::StatusCode) {
        if status.is_server_error() {
            if self.eject_after_5xx != 0 {
                let e = &self.endpoints[i];
                let n = e.consecutive_5xx.fetch_add(1, Ordering::Relaxed) + 1;
                if n >= self.eject_after_5xx {
                    self.eject(e, n, "5xx responses");
                }
            }
            return;
        }
        let e = &self.endpoints[i];
        for counter in [&e.consecutive_failures, &e.consecutive_5xx] {
            if counter.load(Ordering::Relaxed) != 0 {
                counter.store(0, Ordering::Relaxed);
            }
        }
        if e.ejected_until_ms.load(Ordering::Relaxed) != 0 {
            e.ejected_until_ms.store(0, Ordering::Relaxed);
        }
    }

    /// Records a failure (connect error or timeout); ejects after enough in a row.
    pub fn failure(&self, i: usize) {
        if self.eject_after == 0 {
            return;
        }
        let e = &self.endpoints[i];
        let n = e.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= self.eject_after {
            self.eject(e, n, "failures");
        }
    }

    /// Skips `e` for the ejection time; its counters start again from zero.
    fn eject(&self, e: &Endpoint, n: u32, what: &str) {
        e.consecutive_failures.store(0, Ordering::Relaxed);
        e.consecutive_5xx.store(0, Ordering::Relaxed);
        e.ejected_until_ms.store(
            now_ms() + self.eject_for.as_millis() as u64,
            Ordering::Relaxed,
        );
        self.metrics.ejections.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(cluster = %self.name, endpoint = %e.authority, "endpoint ejected after {n} consecutive {what}");
    }

    /// True when endpoint `i` is currently ejected.
    pub fn is_ejected(&self, i: usize) -> bool {
        let until = self.endpoints[i].ejected_until_ms.load(Ordering::Relaxed);
        until != 0 && until > now_ms()
    }
}

/// Reports the cluster's endpoints on `/metrics` (`moat_upstream_endpoints`) for as
/// long as the cluster lives; a reload's new cluster takes over the series.
pub fn report_health(cluster: &Arc<Cluster>) {
    let weak = Arc::downgrade(cluster);
    cluster.metrics.set_health(Arc::new(move || {
        let c = weak.upgrade()?;
        let ejected = (0..c.endpoints.len()).filter(|&i| c.is_ejected(i)).count() as u64;
        Some(crate::metrics::EndpointHealth {
            healthy: c.endpoints.len() as u64 - ejected,
            ejected,
        })
    }));
}

/// Prunes the cluster's idle connections periodically while it is in use (needs a runtime;
/// does nothing outside one, e.g. in `moat check-config`).
pub fn spawn_reaper(cluster: &Arc<Cluster>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(cluster);
    let purge = cluster.idle_purge;
    let mut every =
        (cluster.idle_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
    if !purge.is_zero() {
        every = every.min(purge);
    }
    handle.spawn(async move {
        let mut last_purge = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(every).await;
            let Some(c) = weak.upgrade() else { break };
            c.prune_idle();
            if !purge.is_zero() && last_purge.elapsed() >= purge {
                last_purge = tokio::time::Instant::now();
                c.purge_idle();
            }
        }
    });
}
