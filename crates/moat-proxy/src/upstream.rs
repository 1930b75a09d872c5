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
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use bytes::{Buf as _, Bytes, BytesMut};
use http::uri::{Authority, Scheme};
use http::{HeaderMap, Method, Response};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

pub use crate::h1::client::ProtocolError;
use crate::h1::client::{self as h1, RequestFraming};
pub(crate) use crate::h1::client::{X_FORWARDED_FOR, X_REQUEST_ID};
use crate::h1::{Decoded, Decoder, ReadError, READ_CHUNK};

use crate::body::{BoxError, ProxyBody};
use crate::config::ClusterConfig;
use crate::metrics::{ClusterMetrics, Metrics};
use moat_tls::MaybeTls;

/// Request bodies up to this size that are in memory go out in the same write as the
/// request head (and can be replayed on a fresh connection, see [`Cluster::send`]).
const INLINE_BODY: usize = 64 << 10;
/// Interim (1xx) responses skipped before the final one; more is refused.
const MAX_INTERIM: usize = 16;

/// Why an upstream exchange failed.
#[derive(Debug)]
pub enum UpstreamError {
    /// The connection could not be established (refused, unreachable, TLS failure).
    Connect(BoxError),
    /// The TCP connect (and TLS handshake) timed out.
    ConnectTimeout,
    /// No response head within the cluster's `request_timeout`.
    Timeout,
    /// The request body could not be read from the client, or exceeded the route limit.
    RequestBody(BoxError),
    /// Reading from or writing to the upstream failed after connecting.
    Io(io::Error),
    /// The upstream answered with something moat refuses to forward.
    Protocol(ProtocolError),
}

impl std::fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UpstreamError::Connect(e) => write!(f, "connect: {e}"),
            UpstreamError::ConnectTimeout => f.write_str("connect timeout"),
            UpstreamError::Timeout => f.write_str("no response head before the request timeout"),
            UpstreamError::RequestBody(e) => write!(f, "request body: {e}"),
            UpstreamError::Io(e) => write!(f, "{e}"),
            UpstreamError::Protocol(e) => write!(f, "{e}"),
        }
    }
}

/// An exchange failure and whether the request may be sent again on a new connection.
struct Failure {
    error: UpstreamError,
    /// True when the upstream cannot have seen (or answered) the request: the pooled
    /// connection was closed under us before any response byte arrived.
    replayable: bool,
}

impl Failure {
    fn io(e: io::Error, replayable: bool) -> Failure {
        Failure {
            error: UpstreamError::Io(e),
            replayable,
        }
    }

    fn fatal(error: UpstreamError) -> Failure {
        Failure {
            error,
            replayable: false,
        }
    }
}

impl From<ProtocolError> for Failure {
    fn from(e: ProtocolError) -> Failure {
        Failure::fatal(UpstreamError::Protocol(e))
    }
}

/// A connection to an upstream: plain TCP or TLS over TCP (moat-tls upstream connector).
pub type UpstreamStream = MaybeTls<moat_tls::tokio_rustls::client::TlsStream<TcpStream>>;

/// An upstream connection with its buffers, owned by one exchange at a time.
#[derive(Debug)]
pub(crate) struct Conn {
    io: UpstreamStream,
    /// Bytes read and not yet consumed (empty whenever the connection is idle).
    rbuf: BytesMut,
    /// The request head (and small body) being written; reused across requests.
    wbuf: Vec<u8>,
    /// The request deadline timer, kept with the connection and reset for each request
    /// (pushing a registered timer later is a compare-and-swap; creating and dropping
    /// one per request takes the timer driver's lock twice).
    timer: Option<Pin<Box<Sleep>>>,
    /// True once the connection carried an exchange (it came from the pool).
    reused: bool,
}

impl Conn {
    /// Boxed: the connection moves with every exchange (pool, body, pool again), and
    /// a pointer is cheaper to move than its buffers and timer.
    fn new(io: UpstreamStream) -> Box<Conn> {
        Box::new(Conn {
            io,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
            timer: None,
            reused: false,
        })
    }

    /// True when the idle connection is still open: a read that does not wait finds
    /// neither end of file nor unexpected bytes.
    fn is_open(&mut self) -> bool {
        let mut byte = [0u8; 1];
        match &mut self.io {
            // `try_read` answers from the readiness the runtime has cached (no system
            // call unless the socket became readable) and, unlike a poll, registers no
            // waker: this runs on every checkout.
            MaybeTls::Plain(tcp) => {
                matches!(tcp.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
            // A TLS connection may hold a buffered record (a close_notify): read through it.
            MaybeTls::Tls(_) => {
                let mut cx = Context::from_waker(Waker::noop());
                let mut rb = ReadBuf::new(&mut byte);
                Pin::new(&mut self.io)
                    .poll_read(&mut cx, &mut rb)
                    .is_pending()
            }
        }
    }

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

    /// Reads the final response head (interim 1xx responses are skipped; `101` only
    /// when the request asked for an upgrade).
    async fn read_head(
        &mut self,
        method: &Method,
        upgrade: bool,
    ) -> Result<h1::ResponseHead, Failure> {
        let mut received = false;
        let mut interim = 0;
        // Where the search for the end of the head resumes (see `crate::h1::head_end`).
        let mut scanned = 0;
        loop {
            if let Some(n) = crate::h1::head_end(&self.rbuf, &mut scanned) {
                let head = h1::parse_response_head(&self.rbuf[..n], method);
                self.rbuf.advance(n);
                let head = head?;
                scanned = 0;
                if head.status.is_informational() {
                    if head.status == http::StatusCode::SWITCHING_PROTOCOLS {
                        if upgrade && h1::is_upgrade_response(&head) {
                            return Ok(head);
                        }
                        return Err(ProtocolError::UnexpectedInterim.into());
                    }
                    interim += 1;
                    if interim > MAX_INTERIM {
                        return Err(ProtocolError::UnexpectedInterim.into());
                    }
                    continue;
                }
                return Ok(head);
            } else if self.rbuf.len() >= h1::MAX_HEAD {
                return Err(ProtocolError::HeadTooLarge.into());
            }
            if self.rbuf.capacity() - self.rbuf.len() < 1024 {
                self.rbuf.reserve(READ_CHUNK);
            }
            // A pooled connection the upstream closed just before our request arrived
            // fails here with nothing received: the request can be sent again, unless
            // the upstream may have acted on it (like nginx, POST and PATCH are not
            // repeated once written).
            let replayable = self.reused && !received && method.is_idempotent();
            match self.io.read_buf(&mut self.rbuf).await {
                Ok(0) => {
                    return Err(Failure {
                        error: UpstreamError::Protocol(ProtocolError::UnexpectedEof),
                        replayable,
                    })
                }
                Ok(_) => received = true,
                Err(e) => return Err(Failure::io(e, replayable)),
            }
        }
    }
}

/// Idle keep-alive connections of one endpoint (most recently used last).
#[derive(Debug, Default)]
pub struct EndpointPool {
    idle: Mutex<Vec<(Box<Conn>, Instant)>>,
    max_idle: usize,
}

impl EndpointPool {
    fn checkout(&self, idle_timeout: Duration) -> Option<Box<Conn>> {
        let mut idle = self.idle.lock();
        while let Some((mut conn, since)) = idle.pop() {
            if since.elapsed() < idle_timeout && conn.is_open() {
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    /// Returns a connection whose exchange is complete (its read buffer is empty).
    fn put(&self, conn: Box<Conn>) {
        let mut idle = self.idle.lock();
        if idle.len() < self.max_idle {
            idle.push((conn, Instant::now()));
        }
    }

    fn prune(&self, idle_timeout: Duration) {
        self.idle
            .lock()
            .retain_mut(|(conn, since)| since.elapsed() < idle_timeout && conn.is_open());
    }

    /// Idle connections held now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().len()
    }
}

/// The body of an upstream response, decoded from its connection as it is polled. The
/// connection goes back to the pool once the body has been read to its end (when the
/// upstream allows keep-alive); dropping the body earlier closes it.
#[derive(Debug)]
pub struct UpstreamBody {
    /// `None` once the body ended (or failed).
    conn: Option<Box<Conn>>,
    decoder: Decoder,
    keep_alive: bool,
    pool: Arc<EndpointPool>,
}

impl UpstreamBody {
    fn new(conn: Box<Conn>, decoder: Decoder, keep_alive: bool, pool: Arc<EndpointPool>) -> Self {
        let mut body = UpstreamBody {
            conn: Some(conn),
            decoder,
            keep_alive,
            pool,
        };
        if body.decoder.is_done() {
            body.finish();
        }
        body
    }

    /// Ends the body: the connection is pooled when reusable, else closed.
    fn finish(&mut self) {
        if let Some(conn) = self.conn.take() {
            // Bytes after the end of the response mean the upstream does not frame its
            // messages the way we read them: never reuse such a connection.
            if self.keep_alive && conn.rbuf.is_empty() {
                self.pool.put(conn);
            }
        }
    }

    /// The upgraded connection of a `101 Switching Protocols` response, with the bytes
    /// the upstream already sent past the head.
    pub fn into_upgraded(mut self) -> Option<(UpstreamStream, Bytes)> {
        self.conn.take().map(|c| (c.io, c.rbuf.freeze()))
    }
}

impl http_body::Body for UpstreamBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        let step = ready!(crate::h1::poll_body(
            &mut this.decoder,
            &mut conn.rbuf,
            &mut conn.io,
            cx
        ));
        match step {
            Ok(Decoded::Data(data)) => {
                if this.decoder.is_done() {
                    // Hyper stops polling once `is_end_stream` is true: release now.
                    this.finish();
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Ok(Decoded::Trailers(t)) => {
                this.finish();
                Poll::Ready(Some(Ok(Frame::trailers(t))))
            }
            Ok(Decoded::End | Decoded::NeedMore) => {
                // (A body delimited by the close is never pooled: see `keep_alive`.)
                this.finish();
                Poll::Ready(None)
            }
            Err(ReadError::Framing(e)) => {
                this.conn = None;
                Poll::Ready(Some(Err(Box::new(ProtocolError::from(e)))))
            }
            Err(ReadError::Io(e)) => {
                this.conn = None;
                Poll::Ready(Some(Err(Box::new(e))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        if self.conn.is_none() {
            return SizeHint::with_exact(0);
        }
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// A request to send upstream. Its head is rewritten as it is written out (hop-by-hop
/// fields dropped, `Host` and `X-Forwarded-*` set), without copying the header map.
#[derive(Debug)]
pub struct UpstreamRequest<'a> {
    /// Method.
    pub method: &'a Method,
    /// Origin-form request target (path and query).
    pub target: &'a str,
    /// The request's header fields, as the client sent them (after request phases).
    pub headers: &'a HeaderMap,
    /// The body.
    pub body: ProxyBody,
    /// True when the request asks for a protocol upgrade (a `101` is then accepted).
    pub upgrade: bool,
    /// True when `default_host` replaces the request's `Host` (an absolute-form
    /// target, or HTTP/2's `:authority`).
    pub replace_host: bool,
    /// `Host` to send when the request carries none (HTTP/2, HTTP/1.0).
    pub default_host: &'a str,
    /// The client address appended to `X-Forwarded-For`.
    pub forwarded_for: &'a http::HeaderValue,
    /// `X-Forwarded-Proto`: `http` or `https`.
    pub forwarded_proto: &'static str,
    /// `X-Request-Id`: the client's, or the one moat made (it replaces the field).
    pub request_id: &'a str,
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
        UpstreamBody {
            conn: Some(conn),
            decoder: head.decoder,
            keep_alive: false,
            pool: ep.pool.clone(),
        }
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
        return if matches!(*req.method, Method::POST | Method::PUT | Method::PATCH) {
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
        let mut endpoints = Vec::with_capacity(cfg.endpoints.len());
        for e in &cfg.endpoints {
            let authority: Authority = e
                .value
                .parse()
                .map_err(|_| format!("`{}` is not a host:port endpoint", e.value))?;
            endpoints.push(Endpoint {
                authority,
                pool: Arc::new(EndpointPool {
                    idle: Mutex::new(Vec::new()),
                    max_idle: cfg.max_idle_per_endpoint,
                }),
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
            request_timeout: cfg.request_timeout,
            eject_after: cfg.ejection.consecutive_failures,
            eject_after_5xx: cfg.ejection.consecutive_5xx,
            eject_for: cfg.ejection.duration,
            metrics: metrics.cluster(&cfg.name.value),
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
        h1::encode_request_head(&mut conn.wbuf, &req, framing);
        let (method, upgrade) = (req.method, req.upgrade);
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
