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
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::body::{BoxError, ProxyBody};
use crate::config::ClusterConfig;
use crate::metrics::{ClusterMetrics, Metrics};

/// The HTTP client type used for upstreams.
pub type UpstreamClient = Client<UpstreamConnector, ProxyBody>;

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

/// One upstream endpoint with its health state.
#[derive(Debug)]
pub struct Endpoint {
    /// `host:port`.
    pub authority: Authority,
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
    /// Pooled client.
    pub client: UpstreamClient,
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
                authority,
                consecutive_failures: AtomicU32::new(0),
                ejected_until_ms: AtomicU64::new(0),
            });
        }
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        conn.set_connect_timeout(Some(cfg.connect_timeout));
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
        let conn = UpstreamConnector { http: conn, tls };
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(cfg.idle_timeout)
            .pool_max_idle_per_host(cfg.max_idle_per_endpoint)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .retry_canceled_requests(true)
            .set_host(false)
            .build(conn);
        Ok(Cluster {
            name: cfg.name.value.as_str().into(),
            endpoints,
            next: AtomicUsize::new(0),
            scheme,
            client,
            request_timeout: cfg.request_timeout,
            eject_after: cfg.ejection.consecutive_failures,
            eject_for: cfg.ejection.duration,
            metrics: metrics.cluster(&cfg.name.value),
        })
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
