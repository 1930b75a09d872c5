//! Test helpers: an instrumented upstream, a gateway on ephemeral ports, clients.
#![allow(dead_code)]
// Test helpers: a failed setup step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod jwt;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use moat_proxy::config::{self, ConfigSource};
use moat_proxy::{Gateway, GatewayOptions, RunningGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream test server counting the TCP connections it accepted.
pub struct Upstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
}

impl Upstream {
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Starts the upstream. `tag` is returned in the `x-upstream` response header.
pub async fn upstream(tag: &'static str) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            c.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = service_fn(move |req| upstream_handle(tag, req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Upstream { addr, connections }
}

fn query<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.uri()
        .query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

async fn upstream_handle(
    tag: &'static str,
    mut req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    if path == "/slow" {
        let ms: u64 = query(&req, "ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        return Ok(Response::builder()
            .header("x-upstream", tag)
            .body(Full::new(Bytes::from_static(b"slow done")))
            .unwrap());
    }
    if path == "/ws" || path.starts_with("/ws/") {
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(up) = on.await {
                let mut io = TokioIo::new(up);
                let mut buf = [0u8; 1024];
                loop {
                    match io.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let mut out = b"echo:".to_vec();
                            out.extend_from_slice(&buf[..n]);
                            if io.write_all(&out).await.is_err() {
                                break;
                            }
                        }
                    }
                }
            }
        });
        return Ok(Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .body(Full::new(Bytes::new()))
            .unwrap());
    }
    if path == "/big" {
        let n: usize = query(&req, "n")
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        return Ok(Response::builder()
            .header("x-upstream", tag)
            .body(Full::new(Bytes::from(vec![b'x'; n])))
            .unwrap());
    }
    if path == "/flaky" {
        // An application error on the upstream tagged `sick` only.
        let status = if tag == "sick" {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        return Ok(Response::builder()
            .status(status)
            .header("x-upstream", tag)
            .body(Full::new(Bytes::from_static(b"flaky")))
            .unwrap());
    }
    if path == "/secret" {
        return Ok(Response::builder()
            .header("x-upstream", tag)
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(
                b"token=SECRET-VALUE and more",
            )))
            .unwrap());
    }
    // Echo.
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let mut headers = serde_json::Map::new();
    for (k, v) in req.headers() {
        headers.insert(
            k.as_str().to_string(),
            serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()),
        );
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => Bytes::from(format!("body error: {e}")),
    };
    let v = serde_json::json!({
        "method": method,
        "uri": uri,
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
        "body_len": body.len(),
    });
    Ok(Response::builder()
        .header("x-upstream", tag)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(v.to_string())))
        .unwrap())
}

/// A config file for one cluster (`app`) and one catch-all route.
pub fn basic_config(upstream: SocketAddr, extra_route: &str) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{upstream}"]
    connect_timeout: 500ms
    request_timeout: 1s
routes:
{extra_route}  - name: all
    cluster: app
    body: {{ max_bytes: 64KiB, on_limit: reject }}
limits: {{ max_header_bytes: 8KiB, max_headers: 50 }}
"#
    )
}

/// A gateway on [`basic_config`] in front of `upstream("a")`. Tests bind it whole and
/// move out the fields they use, so that the rest (the upstream, the config directory)
/// lives to the end of the test.
pub struct BasicGateway {
    pub gw: RunningGateway,
    /// The main listener's address.
    pub addr: SocketAddr,
    pub up: Upstream,
    /// Holds the config file; bind it (not to `_`) to keep it for the test's duration.
    pub dir: tempfile::TempDir,
}

/// Starts the most common test setup: [`BasicGateway`].
pub async fn basic_gateway() -> BasicGateway {
    let up = upstream("a").await;
    let (gw, addr, dir) = basic_gateway_to(up.addr).await;
    BasicGateway { gw, addr, up, dir }
}

/// A gateway on [`basic_config`] in front of the upstream at `upstream`: the gateway,
/// its main listener's address, and the directory holding its config file.
pub async fn basic_gateway_to(
    upstream: SocketAddr,
) -> (RunningGateway, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        dir.path(),
        &basic_config(upstream, ""),
        GatewayOptions::default(),
    )
    .await;
    let addr = gw.listener_addr("main").unwrap();
    (gw, addr, dir)
}

/// Starts a gateway from YAML text written to `dir/moat.yaml`.
pub async fn gateway(dir: &Path, yaml: &str, opts: GatewayOptions) -> RunningGateway {
    let file = dir.join("moat.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (cfg, src) = config::load_file(&file).unwrap();
    gateway_from(cfg, src, opts).await
}

/// Starts a gateway from a parsed config.
pub async fn gateway_from(
    cfg: moat_proxy::GatewayConfig,
    src: ConfigSource,
    opts: GatewayOptions,
) -> RunningGateway {
    Gateway::new(cfg, src, opts).unwrap().start().await.unwrap()
}

pub type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Sends a request, returns status, headers and the body.
pub async fn send(
    c: &TestClient,
    req: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let resp = c.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, body)
}

pub async fn get(c: &TestClient, url: &str) -> (StatusCode, http::HeaderMap, Bytes) {
    send(c, Request::get(url).body(Full::new(Bytes::new())).unwrap()).await
}

/// Writes `request` on a new connection, half-closes it and returns every byte the
/// server answered with (up to 10 s).
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let _ = s.shutdown().await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    out
}

/// Writes raw bytes on a new connection and reads until the server closes it.
pub async fn raw(addr: SocketAddr, request: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads from `s` until the end of a response head; returns all that was read (the head,
/// and whatever followed it in the same reads).
pub async fn read_head(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "connection closed before the response head");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

pub fn json(b: &Bytes) -> serde_json::Value {
    serde_json::from_slice(b).unwrap_or_else(|e| panic!("not JSON ({e}): {b:?}"))
}

/// The error a gateway built from `yaml` (written to `file`, then loaded as moat
/// would load it) fails with.
pub fn gateway_error(file: &Path, yaml: &str) -> String {
    std::fs::write(file, yaml).unwrap();
    let (cfg, src) = config::load_file(file).unwrap();
    Gateway::new(cfg, src, GatewayOptions::default())
        .err()
        .unwrap()
        .to_string()
}

/// A gateway whose one extension provider is `provider` (a YAML flow mapping) fails
/// with an error naming `authz.extension_providers` and containing `want`.
pub fn assert_provider_error(file: &Path, provider: &str, want: &str) {
    let yaml = format!(
        "listeners: []\nadmin: {{ address: 127.0.0.1:0 }}\nauthz:\n  enabled: true\n  extension_providers: [{provider}]\n"
    );
    let err = gateway_error(file, &yaml);
    assert!(err.contains("authz.extension_providers"), "{err}");
    assert!(err.contains(want), "{err}");
}

/// Final (non-1xx) response statuses in `bytes`, in order, and whether each came from
/// the upstream.
pub fn answer_statuses(mut bytes: &[u8]) -> Vec<(u16, bool)> {
    let mut out = Vec::new();
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let Ok(httparse::Status::Complete(n)) = resp.parse(bytes) else {
            return out;
        };
        let code = resp.code.unwrap_or(0);
        let from_upstream = resp
            .headers
            .iter()
            .any(|h| h.name.eq_ignore_ascii_case("x-upstream"));
        let len = resp
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .and_then(|h| {
                std::str::from_utf8(h.value)
                    .ok()?
                    .trim()
                    .parse::<usize>()
                    .ok()
            });
        bytes = &bytes[n..];
        if code >= 200 {
            out.push((code, from_upstream));
            match len {
                Some(l) if l <= bytes.len() => bytes = &bytes[l..],
                // moat's own pages and the upstream's carry lengths; anything else ends here.
                _ => return out,
            }
        }
    }
}

/// An HPACK literal field without indexing, new name (RFC 7541 6.2.2): any bytes, any
/// length, no Huffman coding.
pub fn hpack_literal(out: &mut Vec<u8>, name: impl AsRef<[u8]>, value: impl AsRef<[u8]>) {
    out.push(0x00);
    for s in [name.as_ref(), value.as_ref()] {
        hpack_integer(out, 0x00, 7, s.len());
        out.extend_from_slice(s);
    }
}

/// An HPACK integer with an `bits`-bit prefix after the flag bits in `first`
/// (RFC 7541 5.1).
pub fn hpack_integer(out: &mut Vec<u8>, first: u8, bits: u32, mut n: usize) {
    let max = (1usize << bits) - 1;
    if n < max {
        out.push(first | n as u8);
        return;
    }
    out.push(first | max as u8);
    n -= max;
    while n >= 128 {
        out.push((n % 128) as u8 | 0x80);
        n /= 128;
    }
    out.push(n as u8);
}

/// Appends one HTTP/2 frame.
pub fn h2_frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Writes one HTTP/2 request on a new connection (prior knowledge, frames built by hand
/// so that fields a client library would refuse to send can be sent): `block` is the
/// HPACK-encoded field block of stream 1, `body` its DATA. Returns what came back for
/// stream 1 (see [`h2_session`]).
pub async fn h2_exchange(addr: SocketAddr, block: &[u8], body: &[u8]) -> Session {
    let mut w = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    h2_frame(&mut w, 0x4, 0, 0, &[]);
    let end_stream = if body.is_empty() { END_STREAM } else { 0 };
    h2_frame(&mut w, 0x1, END_HEADERS | end_stream, 1, block);
    if !body.is_empty() {
        h2_frame(&mut w, 0x0, END_STREAM, 1, body);
    }
    h2_session(addr, &w, 1).await
}

/// HTTP/2 frame flags (RFC 9113 6).
pub const END_STREAM: u8 = 0x1;
pub const END_HEADERS: u8 = 0x4;
pub const PADDED: u8 = 0x8;

/// A header field as HTTP/2 carries it: any bytes.
pub type Field = (Vec<u8>, Vec<u8>);

/// What the client read of one stream.
#[derive(Debug, Default, Clone)]
pub struct Answer {
    /// The response's header fields, decoded.
    pub head: Option<Vec<Field>>,
    /// The stream ended (END_STREAM) or was reset.
    pub done: bool,
    /// END_STREAM came: the answer is whole.
    pub ended: bool,
    /// RST_STREAM's error code.
    pub reset: Option<u32>,
}

impl Answer {
    /// The upstream answered the stream: moat's own answers carry no `x-upstream`.
    pub fn answered_by_upstream(&self) -> bool {
        self.head
            .iter()
            .flatten()
            .any(|(n, v)| n == b"x-upstream" && v == b"yes")
    }

    pub fn status(&self) -> Option<String> {
        self.head
            .iter()
            .flatten()
            .find_map(|(n, v)| (n == b":status").then(|| String::from_utf8_lossy(v).into_owned()))
    }
}

/// What the client read of the connection.
#[derive(Debug, Default)]
pub struct Session {
    pub streams: Vec<Answer>,
    /// GOAWAY's error code, if one came.
    pub goaway: Option<u32>,
}

/// Writes `frames` to `addr` and reads what comes back for `streams` streams (ids 1, 3,
/// 5...) until each ended or was reset, the connection closed, or 5 s passed. SETTINGS
/// are acknowledged; header blocks are decoded in order with one HPACK decoder.
pub async fn h2_session(addr: SocketAddr, frames: &[u8], streams: usize) -> Session {
    let mut session = Session {
        streams: vec![Answer::default(); streams],
        goaway: None,
    };
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return session;
    };
    if s.write_all(frames).await.is_err() {
        return session;
    }
    let mut decoder = loona_hpack::Decoder::new();
    let mut acc = Vec::new();
    let mut at = 0;
    // A header block begun by HEADERS without END_HEADERS: its stream and bytes.
    let mut open: Option<(u32, u8, Vec<u8>)> = None;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = [0u8; 8192];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => acc.extend_from_slice(&buf[..n]),
            }
            while acc.len() >= at + 9 {
                let len = u32::from_be_bytes([0, acc[at], acc[at + 1], acc[at + 2]]) as usize;
                if acc.len() < at + 9 + len {
                    break;
                }
                let (kind, flags) = (acc[at + 3], acc[at + 4]);
                let id = u32::from_be_bytes([acc[at + 5], acc[at + 6], acc[at + 7], acc[at + 8]])
                    & 0x7fff_ffff;
                let payload = acc[at + 9..at + 9 + len].to_vec();
                at += 9 + len;
                let answer = (id % 2 == 1)
                    .then(|| session.streams.get_mut((id as usize - 1) / 2))
                    .flatten();
                match kind {
                    // SETTINGS, not an acknowledgement.
                    0x4 if flags & 0x1 == 0 => {
                        let mut ack = Vec::new();
                        h2_frame(&mut ack, 0x4, 0x1, 0, &[]);
                        let _ = s.write_all(&ack).await;
                    }
                    0x1 => {
                        let mut p = &payload[..];
                        if flags & PADDED != 0 && !p.is_empty() {
                            let pad = p[0] as usize;
                            p = &p[1..p.len().saturating_sub(pad).max(1)];
                        }
                        if flags & 0x20 != 0 && p.len() >= 5 {
                            p = &p[5..];
                        }
                        if flags & END_HEADERS != 0 {
                            let head = decoder.decode(p).unwrap_or_default();
                            if let Some(a) = answer {
                                a.head.get_or_insert(head);
                                a.ended |= flags & END_STREAM != 0;
                                a.done |= a.ended;
                            }
                        } else {
                            open = Some((id, flags, p.to_vec()));
                        }
                    }
                    0x9 => {
                        if let Some((sid, first, mut block)) = open.take() {
                            block.extend_from_slice(&payload);
                            if flags & END_HEADERS != 0 {
                                let head = decoder.decode(&block).unwrap_or_default();
                                let i = (sid as usize).saturating_sub(1) / 2;
                                if let Some(a) = session.streams.get_mut(i) {
                                    a.head.get_or_insert(head);
                                    a.ended |= first & END_STREAM != 0;
                                    a.done |= a.ended;
                                }
                            } else {
                                open = Some((sid, first, block));
                            }
                        }
                    }
                    0x0 => {
                        if let Some(a) = answer {
                            a.ended |= flags & END_STREAM != 0;
                            a.done |= a.ended;
                        }
                    }
                    0x3 => {
                        if let Some(a) = answer {
                            a.done = true;
                            a.reset = payload
                                .get(..4)
                                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                        }
                    }
                    0x7 => {
                        session.goaway = payload
                            .get(4..8)
                            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]));
                    }
                    _ => {}
                }
            }
            if session.streams.iter().all(|a| a.done) {
                return;
            }
        }
    })
    .await;
    session
}

/// The config of [`guarded_gateway`].
fn guarded_config(upstream: SocketAddr) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{upstream}"]
    connect_timeout: 2s
    request_timeout: 5s
    read_timeout: 1s
routes:
  - name: all
    cluster: app
    body: {{ max_bytes: 64KiB, on_limit: reject }}
authz:
  enabled: true
  policies: [policies]
waf: {{ enabled: true, mode: block }}
"#
    )
}

/// The policy of [`guarded_gateway`].
const DENY_ADMIN: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: istio-system}
spec:
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*"]}}]
"#;

/// A gateway in front of `upstream` with access control denying `/admin*` and the WAF
/// in block mode: the smuggling tests' target, where a request hidden from moat would
/// reach `/admin/secret`. The directory holds its config; keep it for the test.
pub async fn guarded_gateway(upstream: SocketAddr) -> (RunningGateway, tempfile::TempDir) {
    guarded_gateway_with(upstream, DENY_ADMIN).await
}

/// [`guarded_gateway`] with `policy` (one AuthorizationPolicy document) in place of
/// its `/admin*` denial.
pub async fn guarded_gateway_with(
    upstream: SocketAddr,
    policy: &str,
) -> (RunningGateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(dir.path().join("policies/deny.yaml"), policy).unwrap();
    let gw = gateway(
        dir.path(),
        &guarded_config(upstream),
        GatewayOptions::default(),
    )
    .await;
    (gw, dir)
}
