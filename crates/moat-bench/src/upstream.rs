//! The built-in upstream: a small, fast HTTP/1.1 (and h2c) server on one thread,
//! pinned to a CPU, answering every request with one configured response.
//!
//! It counts requests (tests use that to check the load generator's rate) and
//! can stall once, blocking its thread for a while at the K-th request, the way
//! a garbage-collection pause or a slow disk stalls a real server.

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
            response_h1: h1_response(&cfg, &body),
            body,
            status: cfg.status,
            content_type: cfg.content_type.clone(),
            gzip: cfg.gzip,
            stall: cfg.stall,
            requests: requests.clone(),
        });
        let cpu = cfg.cpu;
        let tls = cfg.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
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
                    let _ = ready_tx.send(Ok(()));
                    serve(listener, state, tls, stop_rx).await;
                });
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => anyhow::bail!("upstream failed to start: {e}"),
            Err(_) => anyhow::bail!("upstream thread exited during start"),
        }
        Ok(Upstream {
            addr,
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

fn h1_response(cfg: &UpstreamConfig, body: &Bytes) -> Bytes {
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}\r\n",
        cfg.status,
        reason(cfg.status),
        cfg.content_type,
        body.len(),
        if cfg.gzip {
            "Content-Encoding: gzip\r\n"
        } else {
            ""
        }
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

async fn serve_h2<S>(stream: S, state: Arc<State>) -> Result<(), hyper::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
        let state = state.clone();
        async move {
            use http_body_util::BodyExt;
            // Read the request body fully, like a real application would.
            let _ = req.into_body().collect().await;
            state.on_request();
            let mut b = http::Response::builder()
                .status(state.status)
                .header("content-type", state.content_type.as_str());
            if state.gzip {
                b = b.header("content-encoding", "gzip");
            }
            b.body(Full::new(state.body.clone()))
        }
    });
    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .await
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
        loop {
            match request_len(&buf[consumed..]) {
                Ok(Some(n)) => {
                    consumed += n;
                    state.on_request();
                    out.extend_from_slice(&state.response_h1);
                }
                Ok(None) => break,
                Err(_) => {
                    out.extend_from_slice(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    stream.write_all(&out).await?;
                    return Ok(());
                }
            }
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
            stream
                .write_all(b"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .await?;
            return Ok(());
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Length of the first complete request in `buf` (head and body), `None` if incomplete.
pub fn request_len(buf: &[u8]) -> io::Result<Option<usize>> {
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
        }
    }
    let body_start = end + 4;
    if !chunked {
        return Ok((buf.len() >= body_start + length).then_some(body_start + length));
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
                    return Ok(Some(pos));
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
