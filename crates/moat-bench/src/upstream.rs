//! The built-in upstream: a small, fast HTTP/1.1 (and h2c) server on one thread,
//! pinned to a CPU, answering every request with one configured response (and
//! every gRPC call over h2 with OK and an empty message: the floor of a gRPC
//! benchmark).
//!
//! It counts requests (tests use that to check the load generator's rate) and
//! can stall once, blocking its thread for a while at the K-th request, the way
//! a garbage-collection pause or a slow disk stalls a real server.

// gettid, to pin the upstream thread.
#![allow(unsafe_code)]

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Largest request (head and body) the upstream reads; larger ones get 413 and a close.
pub const MAX_REQUEST: usize = 16 * 1024 * 1024;

/// What the upstream answers.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Address to bind (port 0 picks one).
    pub bind: SocketAddr,
    /// Status code.
    pub status: u16,
    /// Content-Type of the response.
    pub content_type: String,
    /// Response body.
    pub body: Bytes,
    /// Send the body gzip-compressed with `Content-Encoding: gzip`.
    pub gzip: bool,
    /// Block the server thread for `.1` when the `.0`-th request (1-based) arrives.
    pub stall: Option<(u64, Duration)>,
    /// CPU to pin the server thread to.
    pub cpu: Option<usize>,
    /// Terminate TLS with this config (ALPN `h2` or `http/1.1` picks the
    /// protocol): the `direct` baseline of a TLS scenario, where the upstream
    /// does the handshakes a gateway would otherwise do.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            status: 200,
            content_type: "text/plain".into(),
            body: Bytes::from_static(b"hello\n"),
            gzip: false,
            stall: None,
            cpu: None,
            tls: None,
        }
    }
}

/// A running upstream; stopped when dropped.
pub struct Upstream {
    addr: SocketAddr,
    tid: i32,
    requests: Arc<AtomicU64>,
    stop: watch::Sender<bool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Upstream {
    /// Starts the server thread and returns once it listens.
    pub fn start(cfg: UpstreamConfig) -> anyhow::Result<Upstream> {
        let std_listener = std::net::TcpListener::bind(cfg.bind)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let (stop, stop_rx) = watch::channel(false);
        let body = if cfg.gzip {
            use std::io::Write;
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(&cfg.body)?;
            Bytes::from(enc.finish()?)
        } else {
            cfg.body.clone()
        };
        let state = Arc::new(State {
            response_h1: h1_response(&cfg, &body, false),
            response_h1_close: h1_response(&cfg, &body, true),
            body,
            status: cfg.status,
            content_type: cfg.content_type.clone(),
            gzip: cfg.gzip,
            stall: cfg.stall,
            requests: requests.clone(),
        });
        let cpu = cfg.cpu;
        let tls = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<i32, String>>();
        let thread = std::thread::Builder::new()
            .name("moat-bench-upstream".into())
            .spawn(move || {
                if let Some(c) = cpu {
                    if let Err(e) = crate::sys::pin_current_thread(c) {
                        let _ = ready_tx.send(Err(format!("pinning upstream to cpu {c}: {e}")));
                        return;
                    }
                }
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    let listener = match TcpListener::from_std(std_listener) {
                        Ok(l) => l,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e.to_string()));
                            return;
                        }
                    };
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() };
                    let _ = ready_tx.send(Ok(tid));
                    serve(listener, state, tls, stop_rx).await;
                });
            })?;
        let tid = match ready_rx.recv() {
            Ok(Ok(tid)) => tid,
            Ok(Err(e)) => anyhow::bail!("upstream failed to start: {e}"),
            Err(_) => anyhow::bail!("upstream thread exited during start"),
        };
        Ok(Upstream {
            addr,
            tid,
            requests,
            stop,
            thread: Some(thread),
        })
    }

    /// Listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Requests received so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Scheduler statistics of the server thread so far (the whole upstream runs
    /// on it): time on the CPU, and time runnable but waiting for the CPU.
    pub fn thread_sched(&self) -> io::Result<crate::sys::SchedStat> {
        crate::sys::thread_schedstat(std::process::id(), self.tid)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct State {
    response_h1: Bytes,
    /// The same response with `Connection: close`, for a request that asked for it.
    response_h1_close: Bytes,
    body: Bytes,
    status: u16,
    content_type: String,
    gzip: bool,
    stall: Option<(u64, Duration)>,
    requests: Arc<AtomicU64>,
}

impl State {
    fn on_request(&self) {
        let n = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some((at, d)) = self.stall {
            if n == at {
                // Deliberately blocks the whole server thread: every connection stalls.
                std::thread::sleep(d);
            }
        }
    }
}

fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Unknown")
}

fn h1_response(cfg: &UpstreamConfig, body: &Bytes, close: bool) -> Bytes {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}{}\r\n",
        cfg.status,
        reason(cfg.status),
        cfg.content_type,
        body.len(),
        if cfg.gzip {
            "Content-Encoding: gzip\r\n"
        } else {
            ""
        },
        if close { "Connection: close\r\n" } else { "" }
    )
    .into_bytes();
    out.extend_from_slice(body);
    Bytes::from(out)
}

async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else {
                    // Out of file descriptors or similar: back off briefly.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let mut stop = stop.clone();
                let tls = tls.clone();
                tokio::task::spawn_local(async move {
                    tokio::select! {
                        _ = stop.changed() => {}
                        _ = async move {
                            match tls {
                                Some(acceptor) => tls_connection(stream, acceptor, state).await,
                                None => connection(stream, state).await,
                            }
                        } => {}
                    }
                });
            }
        }
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

async fn connection(stream: TcpStream, state: Arc<State>) {
    let mut peek = [0u8; 24];
    let is_h2 = loop {
        match stream.peek(&mut peek).await {
            Ok(0) | Err(_) => return,
            Ok(n) if n >= H2_PREFACE.len() => break peek[..] == *H2_PREFACE,
            Ok(n) if peek[..n] != H2_PREFACE[..n] => break false,
            Ok(_) => tokio::task::yield_now().await,
        }
    };
    if is_h2 {
        let _ = serve_h2(stream, state).await;
    } else {
        let _ = serve_h1(stream, state).await;
    }
}

/// A TLS connection: the handshake, then h2 or HTTP/1.1 as negotiated by ALPN.
async fn tls_connection(stream: TcpStream, acceptor: tokio_rustls::TlsAcceptor, state: Arc<State>) {
    let Ok(tls) = acceptor.accept(stream).await else {
        return;
    };
    if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
        let _ = serve_h2(tls, state).await;
    } else {
        let _ = serve_h1(tls, state).await;
    }
}

/// An h2 response body: the configured body, and trailers for a gRPC answer.
type H2Body = http_body_util::combinators::WithTrailers<
    Full<Bytes>,
    std::future::Ready<Option<Result<http::HeaderMap, std::convert::Infallible>>>,
>;

async fn serve_h2<S>(stream: S, state: Arc<State>) -> Result<(), hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let state = state.clone();
        async move {
            use http_body_util::BodyExt;
            let grpc = req
                .headers()
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
            // Read the request body fully, like a real application would.
            let _ = req.into_body().collect().await;
            state.on_request();
            if grpc {
                return Ok(grpc_ok());
            }
            let mut b = http::Response::builder()
                .status(state.status)
                .header("content-type", state.content_type.as_str());
            if state.gzip {
                b = b.header("content-encoding", "gzip");
            }
            b.body(Full::new(state.body.clone()).with_trailers(std::future::ready(None)))
        }
    });
    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .await
}

/// The answer to any gRPC call: OK with an empty message, which every unary method
/// can decode (all fields default; for Envoy's `Check`, an allow). It makes the
/// upstream the do-nothing floor of a gRPC benchmark, such as the ext_authz Check's.
fn grpc_ok() -> http::Response<H2Body> {
    use http_body_util::BodyExt;
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    // A message is a compression flag and a 4-byte length: an empty one is 5 zeros.
    let body = Full::new(Bytes::from_static(&[0; 5]))
        .with_trailers(std::future::ready(Some(Ok(trailers))));
    let mut resp = http::Response::new(body);
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

async fn serve_h1<S>(mut stream: S, state: Arc<State>) -> io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut out: Vec<u8> = Vec::with_capacity(4 * 1024);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        // Answer every complete request in the buffer (pipelining), then write once.
        let mut consumed = 0;
        let mut close = false;
        while !close {
            match request_head(&buf[consumed..]) {
                Ok(Some(head)) => {
                    consumed += head.len;
                    close = head.close;
                    state.on_request();
                    out.extend_from_slice(if close {
                        &state.response_h1_close
                    } else {
                        &state.response_h1
                    });
                }
                Ok(None) => break,
                Err(_) => {
                    out.extend_from_slice(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return write_and_close(&mut stream, &out).await;
                }
            }
        }
        if close {
            // The client asked to close after this response (RFC 9112 §9.6):
            // nothing after it is read, and the server closes its side.
            return write_and_close(&mut stream, &out).await;
        }
        if consumed > 0 {
            buf.drain(..consumed);
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            // A no-op on TCP; pushes buffered records out on TLS.
            stream.flush().await?;
            out.clear();
        }
        if buf.len() > MAX_REQUEST {
            return write_and_close(
                &mut stream,
                b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await;
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Writes `bytes`, flushes (TLS records), then closes the write side (TLS
/// `close_notify`, then FIN), so the client sees the end of the connection.
async fn write_and_close<S>(stream: &mut S, bytes: &[u8]) -> io::Result<()>
where
    S: tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(bytes).await?;
    stream.flush().await?;
    stream.shutdown().await
}

/// Length of the first complete request in `buf` (head and body), `None` if incomplete.
pub fn request_len(buf: &[u8]) -> io::Result<Option<usize>> {
    Ok(request_head(buf)?.map(|h| h.len))
}

/// The first complete request in a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHead {
    /// Length of the request (head and body).
    pub len: usize,
    /// The connection closes after this request's response: `Connection: close`,
    /// or HTTP/1.0 without `Connection: keep-alive`.
    pub close: bool,
}

/// The first complete request in `buf`, `None` if incomplete.
pub fn request_head(buf: &[u8]) -> io::Result<Option<RequestHead>> {
    let bad = |m: &'static str| io::Error::new(io::ErrorKind::InvalidData, m);
    let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
        if buf.len() > crate::http1::MAX_HEAD {
            return Err(bad("request head too large"));
        }
        return Ok(None);
    };
    let head = &buf[..end];
    let mut length = 0usize;
    let mut chunked = false;
    let request_line = head.split(|&b| b == b'\n').next().unwrap_or(head);
    let request_line = request_line.strip_suffix(b"\r").unwrap_or(request_line);
    let http10 = request_line.ends_with(b" HTTP/1.0");
    let (mut saw_close, mut keep_alive) = (false, false);
    for line in head.split(|&b| b == b'\n').skip(1) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = memchr::memchr(b':', line) else {
            return Err(bad("malformed header"));
        };
        let name = &line[..colon];
        let value = std::str::from_utf8(&line[colon + 1..])
            .map_err(|_| bad("non-UTF-8 header"))?
            .trim();
        if name.eq_ignore_ascii_case(b"content-length") {
            length = value.parse().map_err(|_| bad("bad content-length"))?;
            if length > MAX_REQUEST {
                return Err(bad("body too large"));
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(',').map(str::trim) {
                saw_close |= token.eq_ignore_ascii_case("close");
                keep_alive |= token.eq_ignore_ascii_case("keep-alive");
            }
        }
    }
    let close = saw_close || (http10 && !keep_alive);
    let body_start = end + 4;
    let done = |len: usize| Ok(Some(RequestHead { len, close }));
    if !chunked {
        return if buf.len() >= body_start + length {
            done(body_start + length)
        } else {
            Ok(None)
        };
    }
    // Chunked: walk chunk headers.
    let mut pos = body_start;
    loop {
        let Some(nl) = memchr::memchr(b'\n', &buf[pos..]) else {
            return Ok(None);
        };
        let line = &buf[pos..pos + nl];
        let hex = std::str::from_utf8(line)
            .map_err(|_| bad("bad chunk"))?
            .split(';')
            .next()
            .unwrap_or("")
            .trim();
        let size = usize::from_str_radix(hex, 16).map_err(|_| bad("bad chunk size"))?;
        if size > MAX_REQUEST {
            return Err(bad("chunk too large"));
        }
        pos += nl + 1;
        if size == 0 {
            // Trailers until an empty line.
            loop {
                let Some(nl) = memchr::memchr(b'\n', &buf[pos..]) else {
                    return Ok(None);
                };
                let empty = nl <= 1;
                pos += nl + 1;
                if empty {
                    return done(pos);
                }
            }
        }
        if buf.len() < pos + size + 2 {
            return Ok(None);
        }
        pos += size + 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_request_ends() {
        assert_eq!(
            request_len(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").unwrap(),
            Some(27)
        );
        assert_eq!(request_len(b"GET / HTTP/1.1\r\nHost: a\r\n").unwrap(), None);
        let post = b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET";
        assert_eq!(request_len(post).unwrap(), Some(post.len() - 3));
        assert_eq!(
            request_len(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nab").unwrap(),
            None
        );
        let ch = b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n";
        assert_eq!(request_len(ch).unwrap(), Some(ch.len()));
        assert_eq!(request_len(&ch[..ch.len() - 1]).unwrap(), None);
        assert!(request_len(b"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n").is_err());
        assert!(request_len(b"POST / HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n").is_err());
    }
}

#[cfg(test)]
mod connection_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn parses_connection_close() {
        let h = |b: &[u8]| request_head(b).unwrap().unwrap();
        assert!(!h(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").close);
        assert!(h(b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n").close);
        assert!(h(b"GET / HTTP/1.1\r\nconnection: Upgrade, CLOSE\r\n\r\n").close);
        assert!(h(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n").close);
        assert!(!h(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").close);
        assert!(h(b"GET / HTTP/1.1\r\nConnection: keep-alive, close\r\n\r\n").close);
        let post = b"POST / HTTP/1.1\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(h(post).len, post.len());
    }

    /// N full TLS handshakes in a row, one `Connection: close` request each: every
    /// response says `Connection: close` and is followed by the server's
    /// `close_notify` and FIN, so reading to the end finishes cleanly.
    #[test]
    fn sequential_tls_connections_with_connection_close() {
        const N: u64 = 20;
        let cert = crate::tls::self_signed(&["localhost", "127.0.0.1"]).unwrap();
        let up = Upstream::start(UpstreamConfig {
            tls: Some(Arc::new(crate::tls::server_config(&cert).unwrap())),
            ..Default::default()
        })
        .unwrap();
        let client = crate::tls::client_config(&[b"http/1.1"], false, None).unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        runtime().block_on(async {
            for i in 0..N {
                let tcp = TcpStream::connect(up.addr()).await.unwrap();
                let mut tls = connector.connect(name.clone(), tcp).await.unwrap();
                tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    .await
                    .unwrap();
                tls.flush().await.unwrap();
                let mut resp = Vec::new();
                // Err(UnexpectedEof) here would mean a FIN without close_notify; the
                // timeout turns a server that never closes into a failure, not a hang.
                tokio::time::timeout(Duration::from_secs(30), tls.read_to_end(&mut resp))
                    .await
                    .expect("the server did not close the connection")
                    .unwrap();
                let text = String::from_utf8(resp).unwrap();
                assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{i}: {text}");
                assert!(text.contains("\r\nConnection: close\r\n"), "{i}: {text}");
                assert!(text.ends_with("\r\n\r\nhello\n"), "{i}: {text}");
            }
        });
        assert_eq!(up.requests(), N);
    }

    /// On one plain connection: a keep-alive request, then one that asks to close:
    /// the first response keeps the connection, the second says `Connection:
    /// close` and the server ends the connection (EOF).
    #[test]
    fn connection_close_ends_a_keep_alive_connection() {
        let up = Upstream::start(UpstreamConfig::default()).unwrap();
        runtime().block_on(async {
            let mut s = TcpStream::connect(up.addr()).await.unwrap();
            s.write_all(b"GET /1 HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .unwrap();
            let mut first = vec![0u8; 4096];
            let mut got = 0;
            while !first[..got].ends_with(b"hello\n") {
                let n = s.read(&mut first[got..]).await.unwrap();
                assert!(n > 0, "closed after a keep-alive request");
                got += n;
            }
            let first = String::from_utf8_lossy(&first[..got]).to_string();
            assert!(!first.contains("Connection: close"), "{first}");
            s.write_all(b"GET /2 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut rest = Vec::new();
            tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut rest))
                .await
                .expect("the server did not close the connection")
                .unwrap();
            let rest = String::from_utf8_lossy(&rest).to_string();
            assert_eq!(rest.matches("HTTP/1.1 200 OK").count(), 1, "{rest}");
            assert!(rest.contains("\r\nConnection: close\r\n"), "{rest}");
        });
        assert_eq!(up.requests(), 2);
    }
}
