//! Downstream connections: moat's own HTTP/1.1 server loop, and the hand-off to
//! hyper's HTTP/2 server for connections that negotiated `h2` or open with the
//! HTTP/2 preface.
//!
//! HTTP/1.1 is served by moat itself because the request path is the product: each
//! request is parsed with `httparse` into `http` types that share the read buffer,
//! handled in the connection's own task (no task and no channel per request, the
//! request body is read straight from the connection), and the response head leaves
//! with a small body in one write. Against hyper's server this cut the user-space
//! instructions per proxied request substantially (see docs/perf.md).
//!
//! One request is handled at a time; pipelined requests wait in the read buffer.
//! A connection is closed after a response when the client asks for it, when the
//! request body was not read to its end (its framing is then unknown), after a
//! malformed head (answered 400, 431, 501 or 505), or when the gateway drains.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use http::{Method, StatusCode, Version};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::watch;

use crate::body::{BoxError, ProxyBody, RequestBody};
use crate::connection::ConnInfo;
use crate::downstream_conn::{BodyHome, ConnIo, DownstreamIo, H1Body};
use crate::h1::server::{
    encode_response_head, parse_request_head, request_head_end, RequestError, ResponseFraming,
    CONTINUE,
};
use crate::h1::{self, take_bytes, Decoder, READ_CHUNK};
use crate::metrics::Decision;
use crate::proxy::{self, AfterBody};
use crate::state::{CachedSnapshot, Shared};
use crate::upstream::UpstreamStream;

/// The first bytes of an HTTP/2 connection without TLS (prior knowledge, RFC 9113 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Response body bytes gathered into one write with the head (and with each other).
const COALESCE: usize = 16 << 10;
/// How long, and how many bytes, a connection closed with unread input is still read
/// (and discarded) so that the client gets the response before the close resets it.
const LINGER_TIME: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 256 << 10;

/// A response body that runs what is left of the request once it is dropped (after the
/// last frame was written, or when the client went away): its access record, the
/// after-response phases' deferred work.
pub(crate) struct GuardedBody {
    body: ProxyBody,
    after: Option<Box<AfterBody>>,
}

impl GuardedBody {
    fn new(body: ProxyBody, after: Option<Box<AfterBody>>) -> Self {
        GuardedBody { body, after }
    }

    /// The upstream connection of a `101 Switching Protocols` response.
    fn take_upgrade(&mut self) -> Option<(UpstreamStream, Bytes)> {
        match std::mem::replace(&mut self.body, ProxyBody::Empty) {
            ProxyBody::Upstream(up) => up.into_upgraded(),
            _ => None,
        }
    }
}

impl Drop for GuardedBody {
    fn drop(&mut self) {
        if let Some(after) = self.after.take() {
            after.run();
        }
    }
}

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = BoxError;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if let (Some(after), Poll::Ready(Some(Ok(frame)))) = (&mut this.after, &polled) {
            if let Some(data) = frame.data_ref() {
                after.sent(data.len());
            }
        }
        polled
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    #[inline]
    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// True once the gateway drains (or is gone). Reads two atomics; borrowing the watch
/// value would take its lock on every request.
fn draining(shared: &Shared, drain: &watch::Receiver<bool>) -> bool {
    shared.is_draining() || drain.has_changed().is_err()
}

/// HTTP/2 server settings, built once from the configuration.
pub(crate) fn h2_builder(
    max_header_bytes: usize,
) -> hyper::server::conn::http2::Builder<TokioExecutor> {
    let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    b.timer(TokioTimer::new())
        .max_header_list_size((max_header_bytes * 2).max(16 << 10).min(u32::MAX as usize) as u32)
        .max_concurrent_streams(256);
    b
}

/// Serves one downstream connection until it ends (or the gateway drains).
pub(crate) async fn serve(
    shared: Arc<Shared>,
    h2: Arc<hyper::server::conn::http2::Builder<TokioExecutor>>,
    drain: watch::Receiver<bool>,
    ci: Arc<ConnInfo>,
    io: DownstreamIo,
) {
    let alpn_h2 = ci
        .conn
        .tls
        .as_ref()
        .is_some_and(|t| t.alpn.as_deref() == Some("h2"));
    if alpn_h2 {
        return serve_h2(shared, &h2, drain, ci, io).await;
    }
    let mut conn = Box::new(ConnIo {
        io,
        rbuf: BytesMut::with_capacity(READ_CHUNK),
        watch: ci.watch().clone(),
    });
    if matches!(conn.io, DownstreamIo::Plain(_)) {
        // HTTP/2 with prior knowledge: decided on the first bytes.
        match read_some(&mut conn).await {
            Ok(true) => {}
            _ => return,
        }
        if H2_PREFACE.starts_with(&conn.rbuf[..conn.rbuf.len().min(H2_PREFACE.len())]) {
            while conn.rbuf.len() < H2_PREFACE.len() {
                match read_some(&mut conn).await {
                    Ok(true) => {}
                    _ => return,
                }
            }
            if conn.rbuf.starts_with(H2_PREFACE) {
                let ConnIo { io, rbuf, .. } = *conn;
                let rewound = Rewind {
                    pre: rbuf.freeze(),
                    io,
                };
                return serve_h2(shared, &h2, drain, ci, rewound).await;
            }
        }
    }
    serve_h1(&shared, &ci, conn, &drain).await;
}

/// Reads more into the read buffer. `Ok(false)`: end of file. (An idle connection
/// is closed on drain by its watchdog, see `gateway::watchdog`.)
async fn read_some(conn: &mut ConnIo) -> io::Result<bool> {
    if conn.rbuf.capacity() - conn.rbuf.len() < 1024 {
        conn.rbuf.reserve(READ_CHUNK);
    }
    Ok(conn.io.read_buf(&mut conn.rbuf).await? > 0)
}

/// The HTTP/1.1 loop: a request head, the exchange, the response; again while the
/// connection may be kept.
async fn serve_h1(
    shared: &Arc<Shared>,
    ci: &Arc<ConnInfo>,
    mut conn: Box<ConnIo>,
    drain: &watch::Receiver<bool>,
) {
    let mut wbuf: Vec<u8> = Vec::with_capacity(1024);
    // Allocated with the first request body that is streamed.
    let mut home: Option<Arc<BodyHome>> = None;
    let mut snapshot = CachedSnapshot::new(shared);
    loop {
        // The request head.
        // Hard caps on the raw head, as twice the configured limits (checked exactly
        // on the parsed head): beyond them the head is not parsed at all.
        let (head_cap, max_fields) = {
            let snap = snapshot.current(shared);
            (
                (snap.max_header_bytes * 2).max(16 << 10),
                (snap.max_headers * 2).max(128),
            )
        };
        let mut scanned = 0;
        let end = loop {
            // RFC 9112 2.2: empty lines before a request line are ignored.
            let blank = conn
                .rbuf
                .iter()
                .take_while(|&&b| b == b'\r' || b == b'\n')
                .count();
            if blank > 0 {
                conn.rbuf.advance(blank);
                scanned = 0;
            }
            if let Some(n) = request_head_end(&conn.rbuf, &mut scanned) {
                break Some(n);
            }
            if conn.rbuf.len() > head_cap {
                break None;
            }
            match read_some(&mut conn).await {
                Ok(true) => {}
                _ => return,
            }
        };
        let parsed = match end {
            Some(n) if n <= head_cap => {
                let head = parse_request_head(&conn.rbuf[..n], max_fields);
                conn.rbuf.advance(n);
                head
            }
            _ => Err(RequestError::TOO_LARGE),
        };
        let mut head = match parsed {
            Ok(h) => h,
            Err(e) => {
                let _ = refuse(shared, &mut conn, &mut wbuf, e).await;
                return linger(conn).await;
            }
        };
        let head_only = head.parts.method == Method::HEAD;
        let version = head.parts.version;
        let mut keep_alive = head.keep_alive;

        // The request body: taken whole when it arrived with the head, else read from
        // the connection as the exchange polls it (the body holds the connection).
        let (body, kept) = match head.decoder {
            Decoder::Length(0) => (RequestBody::Empty, Some(conn)),
            Decoder::Length(n) if conn.rbuf.len() as u64 >= n => {
                let data = take_bytes(&mut conn.rbuf, n as usize);
                (RequestBody::Full(Some(data)), Some(conn))
            }
            decoder => {
                let home = home.get_or_insert_with(Default::default).clone();
                let continue_left = if head.expect_continue {
                    CONTINUE.len()
                } else {
                    0
                };
                let body = H1Body {
                    conn: Some(conn),
                    decoder,
                    continue_left,
                    continue_flush: false,
                    home,
                };
                (RequestBody::H1(body), None)
            }
        };
        ci.h1_exchange_started();
        let snap = snapshot.current(shared);
        let (resp, after) = proxy::handle(shared, ci, snap, &mut head.parts, body).await;
        conn = match kept {
            Some(conn) => conn,
            None => {
                // The body was dropped with the exchange: the connection is back home.
                let returned = home.as_ref().and_then(|h| h.take());
                let Some((conn, clean)) = returned else {
                    return;
                };
                keep_alive &= clean;
                conn
            }
        };
        keep_alive &= !draining(shared, drain);

        let (parts, body) = resp.into_parts();
        let body = GuardedBody::new(body, after);
        if parts.status == StatusCode::SWITCHING_PROTOCOLS {
            return tunnel(conn, &mut wbuf, &parts, body).await;
        }
        let written = write_response(
            &mut conn,
            &mut wbuf,
            &parts,
            body,
            head_only,
            version,
            &mut keep_alive,
        )
        .await;
        ci.h1_exchange_ended();
        if written.is_err() {
            return;
        }
        if !keep_alive {
            // With input left unread, `linger` shuts the connection down itself.
            if conn.rbuf.is_empty() {
                let _ = conn.io.shutdown().await;
            } else {
                linger(conn).await;
            }
            return;
        }
    }
}

/// Writes a response head and its body; `keep_alive` is cleared when the body's end
/// can only be told by closing the connection.
async fn write_response(
    conn: &mut ConnIo,
    wbuf: &mut Vec<u8>,
    parts: &http::response::Parts,
    mut body: GuardedBody,
    head_only: bool,
    version: Version,
    keep_alive: &mut bool,
) -> io::Result<()> {
    let status = parts.status;
    let framing = if head_only
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        ResponseFraming::NoBody
    } else if let Some(n) = body.size_hint().exact() {
        ResponseFraming::Length(n)
    } else if version == Version::HTTP_11 {
        ResponseFraming::Chunked
    } else {
        *keep_alive = false;
        ResponseFraming::Close
    };
    let connection: Option<&'static [u8]> = if !*keep_alive {
        Some(b"close")
    } else if version == Version::HTTP_10 {
        Some(b"keep-alive")
    } else {
        None
    };
    wbuf.clear();
    encode_response_head(wbuf, status, &parts.headers, framing, connection);
    let result = async {
        if framing != ResponseFraming::NoBody {
            write_body(conn, wbuf, &mut body, framing).await?;
        }
        if !wbuf.is_empty() {
            conn.send(wbuf).await?;
        }
        conn.flush().await
    }
    .await;
    // The exchange ends here: its record and deferred work run now.
    drop(body);
    result
}

/// Writes the body frames after the head in `wbuf`, coalescing small frames and
/// writing once nothing more is ready. Leaves the last bytes in `wbuf`.
async fn write_body(
    conn: &mut ConnIo,
    wbuf: &mut Vec<u8>,
    body: &mut GuardedBody,
    framing: ResponseFraming,
) -> io::Result<()> {
    let chunked = framing == ResponseFraming::Chunked;
    let mut sent: u64 = 0;
    let mut trailers = None;
    loop {
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await;
        let frame = match polled {
            Poll::Ready(f) => f,
            Poll::Pending => {
                // Nothing ready: what is gathered leaves before waiting.
                if !wbuf.is_empty() {
                    conn.send(wbuf).await?;
                    wbuf.clear();
                }
                conn.flush().await?;
                std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
            }
        };
        let Some(frame) = frame else { break };
        let frame = frame.map_err(io::Error::other)?;
        let data = match frame.into_data() {
            Ok(d) => d,
            Err(frame) => {
                trailers = frame.into_trailers().ok();
                continue;
            }
        };
        if data.is_empty() {
            continue;
        }
        sent += data.len() as u64;
        if let ResponseFraming::Length(n) = framing {
            if sent > n {
                return Err(io::Error::other("response body longer than its length"));
            }
        }
        if chunked {
            h1::encode_chunk_head(wbuf, data.len());
        }
        if wbuf.len() + data.len() <= COALESCE {
            wbuf.extend_from_slice(&data);
        } else {
            conn.send(wbuf).await?;
            wbuf.clear();
            conn.send(&data).await?;
        }
        if chunked {
            wbuf.extend_from_slice(b"\r\n");
        }
    }
    match framing {
        ResponseFraming::Chunked => h1::encode_chunked_end(wbuf, trailers.as_ref()),
        ResponseFraming::Length(n) if sent != n => {
            return Err(io::Error::other("response body shorter than its length"))
        }
        _ => {}
    }
    Ok(())
}

/// Answers a request head moat refuses; the connection is closed after.
async fn refuse(
    shared: &Shared,
    conn: &mut ConnIo,
    wbuf: &mut Vec<u8>,
    e: RequestError,
) -> io::Result<()> {
    let decision = if e.status == StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE {
        Decision::Limit
    } else {
        Decision::Error
    };
    shared
        .snapshot
        .load()
        .no_route
        .record(decision, e.status.as_u16());
    let request_id = proxy::new_request_id();
    let reply = proxy::error_page(e.status, None, e.reason, &request_id);
    let (parts, body) = proxy::reply_response(reply, &request_id).into_parts();
    let body = GuardedBody::new(body, None);
    let mut keep_alive = false;
    write_response(
        conn,
        wbuf,
        &parts,
        body,
        false,
        Version::HTTP_11,
        &mut keep_alive,
    )
    .await
}

/// After a close with input left unread: reads and discards what the client still
/// sends for a while, so that the response is not lost to a connection reset.
async fn linger(mut conn: Box<ConnIo>) {
    let _ = conn.io.shutdown().await;
    let discard = async {
        let mut total = 0;
        let mut buf = [0u8; 4096];
        while total < LINGER_BYTES {
            match conn.io.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER_TIME, discard).await;
}

/// Completes a protocol switch: the `101` head, then bytes both ways until either
/// side closes.
async fn tunnel(
    mut conn: Box<ConnIo>,
    wbuf: &mut Vec<u8>,
    parts: &http::response::Parts,
    mut body: GuardedBody,
) {
    let Some((mut up, early)) = body.take_upgrade() else {
        return;
    };
    drop(body);
    wbuf.clear();
    encode_response_head(
        wbuf,
        parts.status,
        &parts.headers,
        ResponseFraming::NoBody,
        None,
    );
    // Bytes the upstream sent right after its 101 head.
    wbuf.extend_from_slice(&early);
    if conn.send(wbuf).await.is_err() || conn.flush().await.is_err() {
        return;
    }
    // Bytes the client sent right after its request head.
    if !conn.rbuf.is_empty() {
        if up.write_all(&conn.rbuf).await.is_err() {
            return;
        }
        conn.rbuf.clear();
    }
    let _ = tokio::io::copy_bidirectional(&mut conn.io, &mut up).await;
}

/// Serves an HTTP/2 connection with hyper; on drain, hyper sends GOAWAY and lets the
/// streams in flight finish.
async fn serve_h2<I: AsyncRead + AsyncWrite + Send + Unpin + 'static>(
    shared: Arc<Shared>,
    builder: &hyper::server::conn::http2::Builder<TokioExecutor>,
    mut drain: watch::Receiver<bool>,
    ci: Arc<ConnInfo>,
    io: I,
) {
    let svc = service_fn(move |req: http::Request<Incoming>| {
        ci.h2_exchange();
        let (shared, ci) = (shared.clone(), ci.clone());
        async move {
            let snap = shared.snapshot.load_full();
            let (mut parts, body) = req.into_parts();
            let body = RequestBody::H2(body);
            let (mut resp, after) = proxy::handle(&shared, &ci, &snap, &mut parts, body).await;
            // A 304's `content-length` is the representation's (RFC 9110 8.6 lets a
            // server leave it out); Go's HTTP/2 client reads it as a body that never
            // came, though RFC 9113 8.1.1 allows it.
            if resp.status() == StatusCode::NOT_MODIFIED {
                resp.headers_mut().remove(http::header::CONTENT_LENGTH);
            }
            Ok::<_, std::convert::Infallible>(resp.map(|body| GuardedBody::new(body, after)))
        }
    });
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::trace!(error = %e, "HTTP/2 connection ended with an error");
            }
            return;
        }
        _ = drain.wait_for(|d| *d) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

/// A stream whose first bytes were already read (the HTTP/2 preface).
struct Rewind {
    pre: Bytes,
    io: DownstreamIo,
}

impl AsyncRead for Rewind {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pre.is_empty() {
            let n = this.pre.len().min(buf.remaining());
            buf.put_slice(&this.pre.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, b: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, b)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
