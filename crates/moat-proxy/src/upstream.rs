//! Upstream clusters: endpoints, round-robin balancing, passive ejection and the
//! keep-alive connection pool.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::uri::{Authority, Scheme};
use http::Uri;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::body::{BoxError, ProxyBody};
use crate::config::ClusterConfig;
use crate::metrics::{ClusterMetrics, Metrics};

/// Why an upstream exchange failed.
#[derive(Debug)]
pub enum UpstreamError {
    /// The connection could not be established (refused, unreachable, TLS failure).
    Connect(BoxError),
    /// The TCP connect timed out.
    ConnectTimeout,
    /// The exchange failed after connecting (reset, protocol error, request body error).
    Exchange(hyper::Error),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "connect: {e}"),
            UpstreamError::ConnectTimeout => f.write_str("connect timeout"),
            UpstreamError::Exchange(e) => write!(f, "{e}"),
        }
    }
}

/// Idle keep-alive connections of one endpoint (most recently used last).
#[derive(Debug, Default)]
pub struct EndpointPool {
    idle: Mutex<Vec<(SendRequest<ProxyBody>, Instant)>>,
    max_idle: usize,
}

impl EndpointPool {
    fn checkout(&self, idle_timeout: Duration) -> Option<SendRequest<ProxyBody>> {
        let mut idle = self.idle.lock();
        while let Some((tx, since)) = idle.pop() {
            if !tx.is_closed() && since.elapsed() < idle_timeout {
                return Some(tx);
            }
        }
        None
    }

    /// Returns a connection whose exchange is complete.
    pub fn put(&self, tx: SendRequest<ProxyBody>) {
        if tx.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < self.max_idle {
            idle.push((tx, Instant::now()));
        }
    }

    fn prune(&self, idle_timeout: Duration) {
        self.idle
            .lock()
            .retain(|(tx, since)| !tx.is_closed() && since.elapsed() < idle_timeout);
    }

    /// Idle connections held now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }
}

/// A connection to hand back to its pool once the response body has been read.
#[derive(Debug)]
pub struct PoolReturn {
    pool: Arc<EndpointPool>,
    tx: SendRequest<ProxyBody>,
}

impl PoolReturn {
    /// Puts the connection back.
    pub fn release(self) {
        self.pool.put(self.tx);
    }
}

/// A connection to an upstream: plain TCP or TLS over TCP.
#[derive(Debug)]
pub enum UpstreamStream {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS (moat-tls upstream connector).
    Tls(Box<moat_tls::tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Connection for UpstreamStream {
    fn connected(&self) -> Connected {
        match self {
            UpstreamStream::Plain(t) => t.connected(),
            UpstreamStream::Tls(t) => t.get_ref().0.connected(),
        }
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(t) => Pin::new(t).poll_read(cx, buf),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(t) => Pin::new(t).poll_write(cx, buf),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(t) => Pin::new(t).poll_flush(cx),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(t) => Pin::new(t).poll_shutdown(cx),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(t) => Pin::new(t).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Plain(t) => t.is_write_vectored(),
            UpstreamStream::Tls(t) => t.is_write_vectored(),
        }
    }
}

/// Opens upstream connections: TCP (with connect timeout), then TLS when configured.
#[derive(Clone, Debug)]
pub struct UpstreamConnector {
    http: HttpConnector,
    tls: Option<Arc<moat_tls::UpstreamConnector>>,
}

impl tower_service::Service<Uri> for UpstreamConnector {
    type Response = TokioIo<UpstreamStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        tower_service::Service::<Uri>::poll_ready(&mut self.http, cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut http = self.http.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let tcp = tower_service::Service::call(&mut http, uri.clone())
                .await?
                .into_inner();
            match tls {
                None => Ok(TokioIo::new(UpstreamStream::Plain(tcp))),
                Some(t) => {
                    let host = uri
                        .host()
                        .unwrap_or("")
                        .trim_matches(|c| c == '[' || c == ']');
                    let (s, _handshake) = t.connect(tcp, host).await?;
                    Ok(TokioIo::new(UpstreamStream::Tls(Box::new(s))))
                }
            }
        })
    }
}

/// One upstream endpoint with its health state and connection pool.
#[derive(Debug)]
pub struct Endpoint {
    /// `host:port`.
    pub authority: Authority,
    /// `scheme://host:port/` given to the connector.
    uri: Uri,
    /// Idle keep-alive connections.
    pub pool: Arc<EndpointPool>,
    consecutive_failures: AtomicU32,
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
    connector: UpstreamConnector,
    connect_timeout: Duration,
    idle_timeout: Duration,
    /// Time allowed for the response head.
    pub request_timeout: Duration,
    eject_after: u32,
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
        let mut endpoints = Vec::with_capacity(cfg.endpoints.len());
        for e in &cfg.endpoints {
            let authority: Authority = e
                .value
                .parse()
                .map_err(|_| format!("`{}` is not a host:port endpoint", e.value))?;
            endpoints.push(Endpoint {
                uri: Uri::builder()
                    .scheme(if cfg.tls.is_some() { "https" } else { "http" })
                    .authority(authority.clone())
                    .path_and_query("/")
                    .build()
                    .map_err(|e| format!("`{}`: {e}", authority.as_str()))?,
                authority,
                pool: Arc::new(EndpointPool {
                    idle: Mutex::new(Vec::new()),
                    max_idle: cfg.max_idle_per_endpoint,
                }),
                consecutive_failures: AtomicU32::new(0),
                ejected_until_ms: AtomicU64::new(0),
            });
        }
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.enforce_http(false);
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
        let connector = UpstreamConnector { http: conn, tls };
        Ok(Cluster {
            name: cfg.name.value.as_str().into(),
            endpoints,
            next: AtomicUsize::new(0),
            scheme,
            connector,
            connect_timeout: cfg.connect_timeout,
            idle_timeout: cfg.idle_timeout,
            request_timeout: cfg.request_timeout,
            eject_after: cfg.ejection.consecutive_failures,
            eject_for: cfg.ejection.duration,
            metrics: metrics.cluster(&cfg.name.value),
        })
    }

    /// Sends a request to endpoint `i` on a pooled keep-alive connection (or a new one).
    /// Returns the response and, unless the connection was upgraded or closed, the
    /// handle to return it to the pool once the response body is read.
    pub async fn send(
        &self,
        i: usize,
        mut req: http::Request<ProxyBody>,
    ) -> Result<(http::Response<Incoming>, Option<PoolReturn>), UpstreamError> {
        let ep = &self.endpoints[i];
        while let Some(mut tx) = ep.pool.checkout(self.idle_timeout) {
            if tx.ready().await.is_err() {
                continue;
            }
            match tx.try_send_request(req).await {
                Ok(resp) => {
                    return Ok((
                        resp,
                        Some(PoolReturn {
                            pool: ep.pool.clone(),
                            tx,
                        }),
                    ))
                }
                Err(mut e) => match e.take_message() {
                    // The connection closed before the request was sent: try another.
                    Some(r) => req = r,
                    None => return Err(UpstreamError::Exchange(e.into_error())),
                },
            }
        }
        let mut connector = self.connector.clone();
        let io = match tokio::time::timeout(
            self.connect_timeout,
            tower_service::Service::call(&mut connector, ep.uri.clone()),
        )
        .await
        {
            Err(_) => return Err(UpstreamError::ConnectTimeout),
            Ok(Err(e)) => return Err(UpstreamError::Connect(e)),
            Ok(Ok(io)) => io,
        };
        let (mut tx, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(io)
            .await
            .map_err(|e| UpstreamError::Connect(Box::new(e)))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::trace!(error = %e, "upstream connection ended with an error");
            }
        });
        let resp = tx
            .send_request(req)
            .await
            .map_err(UpstreamError::Exchange)?;
        Ok((
            resp,
            Some(PoolReturn {
                pool: ep.pool.clone(),
                tx,
            }),
        ))
    }

    /// Closes idle connections older than the idle timeout (run periodically).
    pub fn prune_idle(&self) {
        for e in &self.endpoints {
            e.pool.prune(self.idle_timeout);
        }
    }

    /// The idle timeout of pooled connections.
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout
    }

    /// Picks the next endpoint round-robin, skipping ejected ones (when every endpoint
    /// is ejected, the round-robin choice is used anyway).
    pub fn pick(&self) -> usize {
        let n = self.endpoints.len();
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

    /// Records a successful exchange with an endpoint.
    #[inline]
    pub fn success(&self, i: usize) {
        let e = &self.endpoints[i];
        if e.consecutive_failures.load(Ordering::Relaxed) != 0 {
            e.consecutive_failures.store(0, Ordering::Relaxed);
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
            e.consecutive_failures.store(0, Ordering::Relaxed);
            e.ejected_until_ms.store(
                now_ms() + self.eject_for.as_millis() as u64,
                Ordering::Relaxed,
            );
            self.metrics.ejections.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(cluster = %self.name, endpoint = %e.authority, "endpoint ejected after {n} consecutive failures");
        }
    }

    /// True when endpoint `i` is currently ejected.
    pub fn is_ejected(&self, i: usize) -> bool {
        let until = self.endpoints[i].ejected_until_ms.load(Ordering::Relaxed);
        until != 0 && until > now_ms()
    }
}

/// Prunes the cluster's idle connections periodically while it is in use (needs a runtime;
/// does nothing outside one, e.g. in `moat check-config`).
pub fn spawn_reaper(cluster: &Arc<Cluster>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let weak = Arc::downgrade(cluster);
    let every =
        (cluster.idle_timeout / 2).clamp(Duration::from_millis(100), Duration::from_secs(30));
    handle.spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            match weak.upgrade() {
                Some(c) => c.prune_idle(),
                None => break,
            }
        }
    });
}
