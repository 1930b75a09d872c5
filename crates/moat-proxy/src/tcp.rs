//! `protocol: tcp` listeners: raw TCP proxied to a cluster, decided at connection time by
//! the authz engine with Istio's TCP semantics.
//!
//! A connection goes through, in order:
//! 1. TLS, by the listener's mode: none (plain TCP); termination with the listener's
//!    moat-tls acceptor (`tls:`, client certificates per `client_auth`); or passthrough
//!    (`sni_routes:`), where the ClientHello is read, its SNI picks the cluster, and the
//!    bytes read are sent to the upstream first, unchanged.
//! 2. Access control: [`moat_authz::AuthzEngine::evaluate_connection`] for the target
//!    cluster's workload (labels, namespace), the listener port, the peer and local
//!    addresses, the SNI and the verified client certificate; first, when a CUSTOM
//!    policy matched, its gRPC provider's `Check` on the connection's attributes
//!    ([`crate::ext_authz::ExtAuthzClients::check_connection`]). A denied connection is
//!    closed before any upstream connect.
//! 3. One connect to an endpoint of the cluster (round-robin, passive ejection), within
//!    the cluster's `connect_timeout`.
//! 4. Bytes copied both ways ([`tokio::io::copy_bidirectional_with_sizes`]): the end of
//!    one direction is passed on as a half-close (`shutdown(SHUT_WR)`, or a TLS
//!    close_notify) while the other keeps flowing; the connection ends when both
//!    directions have, on an error, after `idle_timeout` without a byte either way, or at
//!    `max_duration`.
//!
//! Each connection reads the snapshot current when it was accepted (a reload changes
//! policies and clusters for new connections), adds to the listener's
//! [`TcpMetrics`](crate::metrics::TcpMetrics) and ends with one [`TcpAccessInfo`] record.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use moat_authz::{AuthzEngine, ConnectionInput};
use moat_core::Connection;
use moat_tls::MaybeTls;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::events::TcpAccessInfo;
use crate::metrics::Phase;
use crate::state::{Shared, TcpListenerRt, TcpTarget};

/// Largest ClientHello handshake message read on a passthrough listener (its body, as
/// given by the handshake header); a larger one closes the connection.
pub const MAX_CLIENT_HELLO: usize = 16 << 10;
/// Most bytes buffered while reading a ClientHello (records headers included): a
/// ClientHello split into many tiny records is refused once this is reached.
const MAX_CLIENT_HELLO_BUFFER: usize = 2 * MAX_CLIENT_HELLO;
/// Time allowed on a passthrough listener from accept to a complete ClientHello.
pub const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// Buffer of each copy direction. 64 KiB moves a bulk transfer in few system calls;
/// a connection holds two (128 KiB) while it is open.
const COPY_BUF: usize = 64 << 10;

/// A connection accepted on a tcp listener, with what the current snapshot says about it.
pub(crate) struct TcpConn {
    pub(crate) shared: Arc<Shared>,
    pub(crate) listener: Arc<str>,
    pub(crate) rt: Arc<TcpListenerRt>,
    /// The listener's TLS acceptor (termination).
    pub(crate) tls: Option<moat_tls::TlsAcceptor>,
    pub(crate) authz: Option<Arc<AuthzEngine>>,
    pub(crate) tcp: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
    /// Held while the connection is open: a graceful shutdown waits for it (up to its
    /// deadline).
    pub(crate) drain: watch::Receiver<bool>,
}

type Downstream = MaybeTls<moat_tls::tokio_rustls::server::TlsStream<TcpStream>>;

/// What is known about a connection when it ends.
struct Outcome {
    tls: &'static str,
    sni: Option<String>,
    conn: Connection,
    cluster: Option<Arc<str>>,
    upstream: Option<String>,
    decision: &'static str,
    rule: Option<String>,
    reason: String,
    bytes_in: u64,
    bytes_out: u64,
}

impl Outcome {
    fn new(peer: SocketAddr, local: SocketAddr) -> Outcome {
        Outcome {
            tls: "plain",
            sni: None,
            conn: Connection {
                remote_addr: peer,
                local_addr: local,
                tls: None,
            },
            cluster: None,
            upstream: None,
            decision: "error",
            rule: None,
            reason: String::new(),
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    fn error(mut self, reason: impl Into<String>) -> Outcome {
        self.decision = "error";
        self.reason = reason.into();
        self
    }
}

/// Serves one connection of a tcp listener to its end.
pub(crate) async fn serve(c: TcpConn) {
    let started = Instant::now();
    let ts_ms = moat_events::now_ms();
    let TcpConn {
        shared,
        listener,
        rt,
        tls,
        authz,
        tcp,
        peer,
        local,
        drain,
    } = c;
    let out = run(
        &shared,
        &rt,
        tls,
        authz.as_deref(),
        tcp,
        peer,
        local,
        started,
    )
    .await;
    drop(drain);
    let m = &rt.metrics;
    let counter = match out.decision {
        "allow" => &m.allowed,
        "block" => &m.denied,
        _ => &m.errors,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    m.bytes_in.fetch_add(out.bytes_in, Ordering::Relaxed);
    m.bytes_out.fetch_add(out.bytes_out, Ordering::Relaxed);
    tracing::debug!(listener = %listener, peer = %peer, decision = out.decision, reason = %out.reason,
        bytes_in = out.bytes_in, bytes_out = out.bytes_out, "tcp connection closed");
    if let Some(sink) = &shared.events {
        let sni = out
            .sni
            .as_deref()
            .or_else(|| out.conn.tls.as_ref().and_then(|t| t.sni.as_deref()));
        let info = TcpAccessInfo {
            listener: &listener,
            conn: &out.conn,
            tls: out.tls,
            sni,
            cluster: out.cluster.as_deref(),
            upstream: out.upstream.as_deref(),
            decision: out.decision,
            rule: out.rule.as_deref(),
            reason: &out.reason,
            ts_ms,
            duration_us: started.elapsed().as_micros().min(u64::MAX as u128) as u64,
            bytes_in: out.bytes_in,
            bytes_out: out.bytes_out,
        };
        if !sink.tcp(&info) {
            shared.metrics.count_dropped_events(1);
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn run(
    shared: &Shared,
    rt: &TcpListenerRt,
    tls: Option<moat_tls::TlsAcceptor>,
    authz: Option<&AuthzEngine>,
    tcp: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    started: Instant,
) -> Outcome {
    let mut out = Outcome::new(peer, local);
    // 1. TLS.
    let mut prefix = Vec::new();
    let mut down: Downstream = if rt.passthrough() {
        out.tls = "passthrough";
        let mut tcp = tcp;
        match tokio::time::timeout(CLIENT_HELLO_TIMEOUT, read_client_hello(&mut tcp)).await {
            Err(_) => return out.error("no complete ClientHello in time"),
            Ok(Err(e)) => return out.error(e.to_string()),
            Ok(Ok((bytes, sni))) => {
                prefix = bytes;
                out.sni = sni;
            }
        }
        MaybeTls::Plain(tcp)
    } else if let Some(acceptor) = tls {
        match acceptor.accept(tcp).await {
            Ok(moat_tls::Accepted::Plain(tcp)) => MaybeTls::Plain(tcp),
            Ok(moat_tls::Accepted::Tls {
                stream,
                session,
                handshake,
            }) => {
                out.tls = "terminate";
                out.conn.tls = Some(session);
                on_handshake(shared, &out.conn, &handshake);
                MaybeTls::Tls(Box::new(stream))
            }
            Err(e) => {
                shared
                    .metrics
                    .tls_handshake_errors
                    .fetch_add(1, Ordering::Relaxed);
                out.tls = "terminate";
                return out.error(e.to_string());
            }
        }
    } else {
        MaybeTls::Plain(tcp)
    };
    // 2. Target and access control.
    let sni = out
        .sni
        .clone()
        .or_else(|| out.conn.tls.as_ref().and_then(|t| t.sni.clone()));
    let Some(target) = rt.target(sni.as_deref()) else {
        return out.error(match sni {
            Some(s) => format!("no sni_routes entry for `{s}` and no default cluster"),
            None => "no SNI and no default cluster".into(),
        });
    };
    out.cluster = Some(target.cluster.name.clone());
    if let Some(engine) = authz {
        let d = engine.evaluate_connection(&ConnectionInput {
            namespace: &target.namespace,
            labels: &target.labels,
            port: Some(local.port()),
            source_ip: Some(peer.ip()),
            remote_ip: None,
            dest_ip: Some(local.ip()),
            sni: sni.as_deref(),
            peer: out.conn.tls.as_ref().and_then(|t| t.peer.as_ref()),
        });
        if !d.audit.is_empty() || d.dry_run.is_some() {
            tracing::info!(peer = %peer, audit = ?d.audit, dry_run = ?d.dry_run, "tcp connection audited");
        }
        // CUSTOM first (Istio's order): the provider's denial closes the connection
        // whatever DENY and ALLOW said.
        if let Some(provider) = &d.custom {
            let snap = shared.snapshot.load();
            let checked = match &snap.pipeline.engines.ext_authz {
                Some(ext) => ext.check_connection(provider, &out.conn).await,
                None => Err(format!("unknown extension provider `{provider}`")),
            };
            if let Err(reason) = checked {
                out.decision = "block";
                out.rule = Some(format!("custom:{provider}"));
                out.reason = reason;
                return out;
            }
        }
        if !d.allowed {
            out.decision = "block";
            out.rule = d.policy.is_some().then(|| d.rule_id());
            out.reason = d.reason.into_owned();
            return out;
        }
        out.rule = d.policy.is_some().then(|| d.rule_id());
    }
    // 3. Upstream.
    let (i, mut up) = match connect(target).await {
        Ok(x) => x,
        Err(e) => return out.error(e),
    };
    out.upstream = Some(target.cluster.endpoints[i].authority.to_string());
    out.decision = "allow";
    // 4. Bytes both ways.
    let counts = Counts::default();
    if !prefix.is_empty() {
        if let Err(e) = up.write_all(&prefix).await {
            out.reason = format!("upstream: {e}");
            return out;
        }
        counts
            .bytes_in
            .store(prefix.len() as u64, Ordering::Relaxed);
        drop(prefix);
    }
    out.reason = pipe(&mut down, up, &counts, rt, started).await;
    out.bytes_in = counts.bytes_in.load(Ordering::Relaxed);
    out.bytes_out = counts.bytes_out.load(Ordering::Relaxed);
    out
}

/// Runs the connection phases (the TLS audit among them) on a completed handshake.
fn on_handshake(shared: &Shared, conn: &Connection, hs: &moat_core::HandshakeRecord) {
    let snap = shared.snapshot.load();
    if snap.pipeline.connection.is_empty() {
        return;
    }
    let t = std::time::Instant::now();
    for p in &snap.pipeline.connection {
        p.on_connection(conn, hs);
    }
    shared.metrics.phase(Phase::Connection).observe(t.elapsed());
}

/// Connects to the next endpoint of the target's cluster within its connect timeout.
async fn connect(target: &TcpTarget) -> Result<(usize, TcpStream), String> {
    let cluster = &target.cluster;
    let i = cluster.pick();
    let Some(ep) = cluster.endpoints.get(i) else {
        return Err(format!("cluster `{}` has no endpoint", cluster.name));
    };
    let authority = ep.authority.as_str();
    let open = async {
        match authority.parse::<SocketAddr>() {
            Ok(addr) => TcpStream::connect(addr).await,
            Err(_) => TcpStream::connect(authority).await,
        }
    };
    match tokio::time::timeout(target.connect_timeout, open).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            cluster.responded(i, http::StatusCode::OK);
            Ok((i, s))
        }
        Ok(Err(e)) => {
            cluster.failure(i);
            cluster
                .metrics
                .connect_errors
                .fetch_add(1, Ordering::Relaxed);
            Err(format!("upstream {authority}: {e}"))
        }
        Err(_) => {
            cluster.failure(i);
            cluster.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
            Err(format!("upstream {authority}: connect timeout"))
        }
    }
}

/// Bytes delivered each way and the time of the last delivery, shared by the two
/// directions of one connection and its timers.
#[derive(Default)]
struct Counts {
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// Microseconds from the connection's start to the last write either way.
    last_us: AtomicU64,
}

/// A stream whose writes are counted (as `bytes_in` towards the upstream, `bytes_out`
/// towards the client) and mark activity for the idle timeout.
struct Counted<'a, S> {
    io: S,
    written: &'a AtomicU64,
    counts: &'a Counts,
    started: Instant,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<'_, S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<'_, S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                self.written.fetch_add(n as u64, Ordering::Relaxed);
                let us = self.started.elapsed().as_micros().min(u64::MAX as u128) as u64;
                self.counts.last_us.store(us, Ordering::Relaxed);
            }
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Copies both ways until both directions ended, an error, the idle timeout or the
/// maximum duration; returns how it ended.
async fn pipe(
    down: &mut Downstream,
    up: TcpStream,
    counts: &Counts,
    rt: &TcpListenerRt,
    started: Instant,
) -> String {
    let mut client = Counted {
        io: down,
        written: &counts.bytes_out,
        counts,
        started,
    };
    let mut upstream = Counted {
        io: up,
        written: &counts.bytes_in,
        counts,
        started,
    };
    let copy =
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, COPY_BUF, COPY_BUF);
    tokio::pin!(copy);
    let max_at = rt.max_duration.map(|d| started + d);
    let mut idle_at = rt.idle_timeout.map(|d| started + d);
    loop {
        let next = match (idle_at, max_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timer = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = &mut copy => {
                return match r {
                    Ok(_) => "closed".into(),
                    Err(e) => e.to_string(),
                };
            }
            () = timer => {
                let now = Instant::now();
                if max_at.is_some_and(|m| now >= m) {
                    return "max_duration".into();
                }
                if let Some(idle) = rt.idle_timeout {
                    let last = started + Duration::from_micros(counts.last_us.load(Ordering::Relaxed));
                    if now >= last + idle {
                        return "idle_timeout".into();
                    }
                    idle_at = Some(last + idle);
                }
            }
        }
    }
}

/// Why a passthrough connection's ClientHello was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HelloError {
    /// The first bytes are not a TLS handshake record.
    NotTls,
    /// The records or the ClientHello do not parse.
    Malformed(&'static str),
    /// Larger than [`MAX_CLIENT_HELLO`] (or split over too many records).
    TooLarge,
    /// The client closed before a complete ClientHello.
    Eof,
    /// Reading failed.
    Io(io::ErrorKind),
}

impl std::fmt::Display for HelloError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HelloError::NotTls => f.write_str("not a TLS ClientHello"),
            HelloError::Malformed(m) => write!(f, "malformed ClientHello: {m}"),
            HelloError::TooLarge => {
                write!(f, "ClientHello larger than {MAX_CLIENT_HELLO} bytes")
            }
            HelloError::Eof => f.write_str("closed before a complete ClientHello"),
            HelloError::Io(k) => write!(f, "reading the ClientHello: {k}"),
        }
    }
}

/// Reads a whole ClientHello (without answering it): the bytes read, to forward first,
/// and its SNI host name (lowercased, without a trailing dot).
async fn read_client_hello(tcp: &mut TcpStream) -> Result<(Vec<u8>, Option<String>), HelloError> {
    use tokio::io::AsyncReadExt as _;
    let mut hello = HelloReader::default();
    let mut buf = Vec::with_capacity(2048);
    loop {
        if buf.len() >= MAX_CLIENT_HELLO_BUFFER {
            return Err(HelloError::TooLarge);
        }
        buf.reserve((MAX_CLIENT_HELLO_BUFFER - buf.len()).min(4096));
        let n = tcp
            .read_buf(&mut buf)
            .await
            .map_err(|e| HelloError::Io(e.kind()))?;
        if n == 0 {
            return Err(HelloError::Eof);
        }
        if let Some(sni) = hello.advance(&buf)? {
            return Ok((buf, sni));
        }
    }
}

/// Reassembles the handshake bytes of a ClientHello from its records, one complete
/// record at a time (each byte is looked at once, however the client splits it).
#[derive(Default)]
pub(crate) struct HelloReader {
    /// Offset of the next record header in the received bytes.
    next: usize,
    /// Handshake bytes of the records seen so far.
    handshake: Vec<u8>,
}

/// TLS record content type of handshake records.
const HANDSHAKE: u8 = 22;
/// Largest TLS plaintext record (RFC 8446 §5.1).
const MAX_RECORD: usize = 1 << 14;

impl HelloReader {
    /// Consumes the complete records of `received` (all bytes received so far) not seen
    /// yet. `Ok(Some(sni))` once the ClientHello is complete, `Ok(None)` while more is
    /// needed.
    pub(crate) fn advance(
        &mut self,
        received: &[u8],
    ) -> Result<Option<Option<String>>, HelloError> {
        if received.first().is_some_and(|&b| b != HANDSHAKE) {
            return Err(HelloError::NotTls);
        }
        loop {
            let Some(header) = received.get(self.next..self.next + 5) else {
                return Ok(None);
            };
            if header[0] != HANDSHAKE {
                return Err(HelloError::Malformed(
                    "a non-handshake record before the end of the ClientHello",
                ));
            }
            if header[1] != 3 {
                return Err(HelloError::NotTls);
            }
            let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
            if len == 0 || len > MAX_RECORD {
                return Err(HelloError::Malformed("record length"));
            }
            let start = self.next + 5;
            let Some(body) = received.get(start..start + len) else {
                return Ok(None);
            };
            self.next = start + len;
            self.handshake.extend_from_slice(body);
            if let Some(h) = self.handshake.get(..4) {
                if h[0] != 1 {
                    return Err(HelloError::Malformed(
                        "the first handshake message is not a ClientHello",
                    ));
                }
                let msg_len =
                    (usize::from(h[1]) << 16) | (usize::from(h[2]) << 8) | usize::from(h[3]);
                if msg_len > MAX_CLIENT_HELLO {
                    return Err(HelloError::TooLarge);
                }
                if let Some(msg) = self.handshake.get(4..4 + msg_len) {
                    return client_hello_sni(msg).map(Some);
                }
            }
        }
    }
}

/// A bounds-checked reader over a byte slice.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], HelloError> {
        if self.0.len() < n {
            return Err(HelloError::Malformed("truncated field"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<usize, HelloError> {
        Ok(usize::from(self.take(1)?[0]))
    }
    fn u16(&mut self) -> Result<usize, HelloError> {
        let b = self.take(2)?;
        Ok(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    /// A field with a length prefix of `width` bytes.
    fn vec(&mut self, width: usize) -> Result<Cursor<'a>, HelloError> {
        let n = if width == 1 { self.u8()? } else { self.u16()? };
        Ok(Cursor(self.take(n)?))
    }
}

/// The SNI host name of a ClientHello message body (RFC 8446 §4.1.2, RFC 6066 §3).
fn client_hello_sni(msg: &[u8]) -> Result<Option<String>, HelloError> {
    let mut c = Cursor(msg);
    c.take(2 + 32)?; // legacy_version, random
    if c.vec(1)?.0.len() > 32 {
        return Err(HelloError::Malformed("session id longer than 32 bytes"));
    }
    let suites = c.vec(2)?;
    if suites.0.is_empty() || suites.0.len() % 2 != 0 {
        return Err(HelloError::Malformed("cipher suites"));
    }
    if c.vec(1)?.0.is_empty() {
        return Err(HelloError::Malformed("compression methods"));
    }
    if c.0.is_empty() {
        return Ok(None);
    }
    let mut exts = c.vec(2)?;
    let mut sni = None;
    let mut seen = false;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let mut data = exts.vec(2)?;
        if kind != 0 {
            continue;
        }
        if seen {
            return Err(HelloError::Malformed("two server_name extensions"));
        }
        seen = true;
        let mut names = data.vec(2)?;
        while !names.0.is_empty() {
            let name_type = names.u8()?;
            let name = names.vec(2)?.0;
            if name_type == 0 && sni.is_none() {
                sni = Some(host_name(name)?);
            }
        }
    }
    Ok(sni)
}

/// An SNI host name as routed: ASCII letters, digits, `-`, `_` and `.`, at most 253
/// bytes (a trailing dot dropped), lowercased.
fn host_name(name: &[u8]) -> Result<String, HelloError> {
    let name = name.strip_suffix(b".").unwrap_or(name);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if !ok {
        return Err(HelloError::Malformed("server name"));
    }
    Ok(String::from_utf8_lossy(name).to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello record as rustls would send it for `sni`, built by hand.
    fn hello(sni: Option<&str>, record_split: Option<usize>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one suite
        body.extend([1, 0]); // null compression
        let mut exts = Vec::new();
        exts.extend([0, 43, 0, 3, 2, 3, 4]); // supported_versions
        if let Some(s) = sni {
            let n = s.len();
            let mut list = vec![0u8];
            list.extend((n as u16).to_be_bytes());
            list.extend(s.as_bytes());
            exts.extend([0, 0]);
            exts.extend(((list.len() + 2) as u16).to_be_bytes());
            exts.extend((list.len() as u16).to_be_bytes());
            exts.extend(list);
        }
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut hs = vec![1, 0];
        hs.extend((body.len() as u16).to_be_bytes());
        hs.extend(body);
        let mut out = Vec::new();
        for chunk in hs.chunks(record_split.unwrap_or(hs.len())) {
            out.extend([22, 3, 1]);
            out.extend((chunk.len() as u16).to_be_bytes());
            out.extend(chunk);
        }
        out
    }

    fn parse_all(bytes: &[u8]) -> Result<Option<Option<String>>, HelloError> {
        HelloReader::default().advance(bytes)
    }

    #[test]
    fn sni_is_read_in_one_or_many_records_and_byte_by_byte() {
        let one = hello(Some("Api.Example.COM."), None);
        assert_eq!(parse_all(&one), Ok(Some(Some("api.example.com".into()))));
        let many = hello(Some("a.test"), Some(7));
        let mut r = HelloReader::default();
        let mut result = None;
        for end in 1..=many.len() {
            if let Some(s) = r.advance(&many[..end]).unwrap() {
                result = Some((end, s));
                break;
            }
        }
        assert_eq!(result, Some((many.len(), Some("a.test".into()))));
        assert_eq!(parse_all(&hello(None, None)), Ok(Some(None)));
        assert_eq!(parse_all(&one[..one.len() - 1]), Ok(None));
    }

    proptest::proptest! {
        /// Arbitrary bytes, fed in arbitrary pieces, never panic, and a prefix of a
        /// valid hello followed by garbage gives the same answer however it is split.
        #[test]
        fn arbitrary_input_never_panics(
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..600),
            cut in 0usize..600,
            prefix in 0usize..80,
        ) {
            let mut bytes = hello(Some("p.test"), Some(31));
            bytes.truncate(prefix.min(bytes.len()));
            bytes.extend(&junk);
            let whole = parse_all(&bytes);
            let mut r = HelloReader::default();
            let cut = cut.min(bytes.len());
            let first = r.advance(&bytes[..cut]);
            let split = match first {
                Ok(None) => r.advance(&bytes),
                done => done,
            };
            proptest::prop_assert_eq!(whole, split);
        }
    }

    #[test]
    fn hostile_hellos_are_refused_without_panicking() {
        assert_eq!(parse_all(b"GET / HTTP/1.1\r\n"), Err(HelloError::NotTls));
        assert!(matches!(
            parse_all(&hello(Some("a b"), None)),
            Err(HelloError::Malformed(_))
        ));
        // A handshake header announcing more than the limit.
        let big = [22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff];
        assert_eq!(parse_all(&big), Err(HelloError::TooLarge));
        // Every truncation and every single-byte corruption of a valid hello.
        let good = hello(Some("x.test"), Some(20));
        for i in 0..good.len() {
            let _ = parse_all(&good[..i]);
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut bad = good.clone();
                bad[i] = v;
                let _ = parse_all(&bad);
            }
        }
    }
}
