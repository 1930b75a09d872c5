//! An upstream connection as an exchange and a response body share it: the byte
//! stream (TCP or TLS), its buffers, the response head read from it, the keep-alive
//! pool of one endpoint, and a response body decoded from the connection as it is
//! polled (the connection goes back to the pool at the body's end).

use moat_core::clock::CoarseInstant;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use http::Method;
use http_body::{Frame, SizeHint};
use moat_tls::MaybeTls;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

use crate::h1::client::{self as h1, ProtocolError};
use crate::h1::{BoxError, Decoded, Decoder, ReadError, READ_CHUNK};

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
pub(crate) struct Failure {
    pub(crate) error: UpstreamError,
    /// True when the upstream cannot have seen (or answered) the request: the pooled
    /// connection was closed under us before any response byte arrived.
    pub(crate) replayable: bool,
}

impl Failure {
    pub(crate) fn io(e: io::Error, replayable: bool) -> Failure {
        Failure {
            error: UpstreamError::Io(e),
            replayable,
        }
    }

    pub(crate) fn fatal(error: UpstreamError) -> Failure {
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
    pub(crate) io: UpstreamStream,
    /// Bytes read and not yet consumed (empty whenever the connection is idle).
    pub(crate) rbuf: BytesMut,
    /// The request head (and small body) being written; reused across requests.
    pub(crate) wbuf: Vec<u8>,
    /// The request deadline timer, kept with the connection and reset for each request
    /// (pushing a registered timer later is a compare-and-swap; creating and dropping
    /// one per request takes the timer driver's lock twice).
    pub(crate) timer: Option<Pin<Box<Sleep>>>,
    /// True once the connection carried an exchange (it came from the pool).
    pub(crate) reused: bool,
}

impl Conn {
    /// Boxed: the connection moves with every exchange (pool, body, pool again), and
    /// a pointer is cheaper to move than its buffers and timer.
    pub(crate) fn new(io: UpstreamStream) -> Box<Conn> {
        Box::new(Conn {
            io,
            rbuf: BytesMut::new(),
            wbuf: Vec::new(),
            timer: None,
            reused: false,
        })
    }

    /// Frees the read and write buffers of an idle connection (its read buffer is
    /// empty: see [`EndpointPool::put`]).
    fn release_buffers(&mut self) {
        if self.rbuf.is_empty() {
            self.rbuf = BytesMut::new();
        }
        self.wbuf = Vec::new();
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

    /// Reads the final response head (interim 1xx responses are skipped; `101` only
    /// when the request asked for an upgrade).
    pub(crate) async fn read_head(
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
///
/// Two bounds keep a burst from pinning connections and their buffers: at most
/// `max_idle` connections (nginx's `keepalive N`: a connection returned to a full
/// pool is closed), and the purge (`clusters[].idle_purge`, HAProxy's
/// `pool-purge-delay`): every purge interval, half of the connections that stayed
/// idle the whole interval are closed, the least recently used first, and the
/// others give their buffers back. Under steady load the pool keeps what the load
/// reuses; after a burst it shrinks by half every interval.
#[derive(Debug)]
pub struct EndpointPool {
    idle: Mutex<Idle>,
    max_idle: usize,
    /// The cluster's `read_timeout`: how long a response body may stall (zero: forever).
    read_timeout: Duration,
    /// The cluster's counters (a stalled body counts as a timeout).
    metrics: Arc<crate::metrics::ClusterMetrics>,
}

#[derive(Debug, Default)]
struct Idle {
    /// Oldest first: `put` pushes and `checkout` pops at the end. Idle since when, on
    /// the coarse clock: idle timeouts are seconds long, and a pooled exchange would
    /// otherwise read the TSC twice (see moat_core::clock).
    conns: Vec<(Box<Conn>, CoarseInstant)>,
    /// The fewest connections the pool held since the last purge: the first
    /// `unused` of `conns` were not taken once in that interval.
    unused: usize,
}

impl EndpointPool {
    /// A pool that keeps at most `max_idle` idle connections, for a cluster whose
    /// response bodies may stall for `read_timeout` (zero: forever).
    pub(crate) fn new(
        max_idle: usize,
        read_timeout: Duration,
        metrics: Arc<crate::metrics::ClusterMetrics>,
    ) -> EndpointPool {
        EndpointPool {
            idle: Mutex::new(Idle::default()),
            max_idle,
            read_timeout,
            metrics,
        }
    }

    pub(crate) fn checkout(&self, idle_timeout: Duration) -> Option<Box<Conn>> {
        let mut idle = self.idle.lock();
        while let Some((mut conn, since)) = idle.conns.pop() {
            idle.unused = idle.unused.min(idle.conns.len());
            if since.elapsed() < idle_timeout && conn.is_open() {
                conn.reused = true;
                return Some(conn);
            }
        }
        None
    }

    /// Returns a connection whose exchange is complete (its read buffer is empty);
    /// a full pool closes it.
    pub(crate) fn put(&self, conn: Box<Conn>) {
        let mut idle = self.idle.lock();
        if idle.conns.len() < self.max_idle {
            idle.conns.push((conn, CoarseInstant::now()));
        }
    }

    /// Closes the connections idle longer than `idle_timeout` or closed by the upstream.
    pub(crate) fn prune(&self, idle_timeout: Duration) {
        let mut idle = self.idle.lock();
        let Idle { conns, unused } = &mut *idle;
        // Those closed among the first `unused` shorten the untouched prefix.
        let (mut i, mut closed_unused) = (0, 0);
        conns.retain_mut(|(conn, since)| {
            let keep = since.elapsed() < idle_timeout && conn.is_open();
            if !keep && i < *unused {
                closed_unused += 1;
            }
            i += 1;
            keep
        });
        *unused = (*unused).min(i) - closed_unused;
    }

    /// Ends a purge interval: closes half (rounded up) of the connections not taken
    /// since the previous call, oldest first, and frees the buffers of the rest of
    /// them (a connection taken again allocates them anew). Returns how many were
    /// closed.
    pub(crate) fn purge(&self) -> usize {
        let mut idle = self.idle.lock();
        let unused = idle.unused.min(idle.conns.len());
        let close = unused.div_ceil(2);
        // Dropped outside the lock: closing a TLS connection sends its close_notify.
        let closed: Vec<_> = idle.conns.drain(..close).collect();
        for (conn, _) in &mut idle.conns[..unused - close] {
            conn.release_buffers();
        }
        idle.unused = idle.conns.len();
        drop(idle);
        closed.len()
    }

    /// Idle connections held now.
    pub fn idle_count(&self) -> usize {
        self.idle.lock().conns.len()
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
    /// True while the body waits for the upstream with the read timeout armed; a
    /// body that never waits never touches the timer.
    stalled: bool,
}

impl UpstreamBody {
    pub(crate) fn new(
        conn: Box<Conn>,
        decoder: Decoder,
        keep_alive: bool,
        pool: Arc<EndpointPool>,
    ) -> Self {
        let mut body = UpstreamBody {
            conn: Some(conn),
            decoder,
            keep_alive,
            pool,
            stalled: false,
        };
        if body.decoder.is_done() {
            body.finish();
        }
        body
    }

    /// The body of a `101 Switching Protocols` response: the connection now carries
    /// the new protocol and is never pooled (see [`UpstreamBody::into_upgraded`]).
    pub(crate) fn switching(conn: Box<Conn>, decoder: Decoder, pool: Arc<EndpointPool>) -> Self {
        UpstreamBody {
            conn: Some(conn),
            decoder,
            keep_alive: false,
            pool,
            stalled: false,
        }
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

    /// The body waits for the upstream: pending until the cluster's `read_timeout` has
    /// passed since it began to wait or bytes last `arrived` (bytes that decode to
    /// nothing yet, part of a chunk-size line, count), then an error that ends the body
    /// (the client's response is cut: its connection closed, or its HTTP/2 stream
    /// reset) and closes the connection. The timer is the connection's request timer,
    /// reset.
    fn poll_stalled(
        &mut self,
        cx: &mut Context<'_>,
        arrived: bool,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let limit = self.pool.read_timeout;
        let Some(conn) = self.conn.as_mut() else {
            return Poll::Pending;
        };
        if limit.is_zero() {
            return Poll::Pending;
        }
        let timer = conn
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if !self.stalled || arrived {
            timer.as_mut().reset(tokio::time::Instant::now() + limit);
            self.stalled = true;
        }
        ready!(std::future::Future::poll(timer.as_mut(), cx));
        self.conn = None;
        self.pool
            .metrics
            .timeouts
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(
            ?limit,
            "upstream response body stalled past the read timeout"
        );
        Poll::Ready(Some(Err(Box::new(io::Error::new(
            io::ErrorKind::TimedOut,
            "the upstream sent nothing of the response body within the read timeout",
        )))))
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
        let mut arrived = false;
        let io = &mut conn.io;
        let step =
            match crate::h1::poll_body(&mut this.decoder, &mut conn.rbuf, io, cx, &mut arrived) {
                Poll::Ready(step) => step,
                Poll::Pending => return this.poll_stalled(cx, arrived),
            };
        this.stalled = false;
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
