//! "One request in, one request out", as a property checked against parsers that are
//! not moat's own.
//!
//! Requests: generated HTTP/1.1 requests (valid, ambiguous and hostile; see
//! `generated/mod.rs`) are written byte for byte to a real moat (access control denying
//! `/admin*`, the WAF in block mode) in front of a hyper HTTP/1.1 server; the same
//! property runs against Go's and Node's servers in `backend_parsers.rs`. The upstream's
//! parser must see, for each request moat accepted, exactly one request with the
//! generated method and target and exactly the generated body (the body moat
//! inspected); a request moat refused never reaches it; nothing reaches it that the
//! client did not send as a request of its own.
//!
//! Responses: generated upstream responses (lengths, chunked, both, duplicated lengths,
//! `Connection` nominations, bodies that contain a response, bodies delimited by the
//! close) are read through moat by a hyper HTTP/1.1 client: exactly one response with
//! the upstream's body, or a 502; a second request on the same connection gets the
//! upstream's second response, never bytes of the first.
//!
//! Each case runs against a gateway of its own, shut down before the upstream's log is
//! read: the upstream has then parsed every byte moat ever sent it, so the check does
//! not depend on timing.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod generated;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{exchange, gateway, guarded_gateway, h2_exchange, hpack_literal, Session};
use generated::{
    judge, request_strategy, response_strategy, run_property, Framing, GenRequest, GenResponse,
    Parsed, SMUGGLED,
};
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use moat_proxy::GatewayOptions;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Longest wait for any one exchange; a hang is a failure.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------
// The upstream: hyper's HTTP/1.1 server, recording what it parsed.
// ---------------------------------------------------------------------------------

/// One request as hyper's server parsed it.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    method: String,
    target: String,
    body: Vec<u8>,
    smuggled_marker: bool,
}

#[derive(Clone, Default)]
struct UpLog {
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Connections whose bytes hyper could not parse as HTTP/1.1 requests.
    parse_errors: Arc<Mutex<Vec<String>>>,
    /// Connections still being served.
    live: Arc<AtomicUsize>,
}

impl UpLog {
    /// Once every connection moat opened is closed (the gateway was shut down), waits
    /// until hyper has parsed all they carried; false after [`IO_TIMEOUT`].
    async fn all_parsed(&self) -> bool {
        tokio::time::timeout(IO_TIMEOUT, async {
            while self.live.load(Ordering::SeqCst) > 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .is_ok()
    }
}

async fn hyper_upstream() -> (SocketAddr, UpLog) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log = UpLog::default();
    let l = log.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let log = l.clone();
            log.live.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let svc_log = log.clone();
                let svc = service_fn(move |req: Request<Incoming>| {
                    let log = svc_log.clone();
                    async move {
                        let method = req.method().to_string();
                        let target = req.uri().to_string();
                        let smuggled_marker = req.headers().contains_key("x-smuggled");
                        // A body cut mid-way is no complete request: not recorded.
                        if let Ok(b) = req.into_body().collect().await {
                            log.seen.lock().unwrap().push(Seen {
                                method,
                                target,
                                body: b.to_bytes().to_vec(),
                                smuggled_marker,
                            });
                        }
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("x-upstream", "yes")
                                .body(Full::new(Bytes::from_static(b"upstream")))
                                .unwrap(),
                        )
                    }
                });
                let served = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
                if let Err(e) = served {
                    // A body cut short by moat (the client's own body failed) is fine;
                    // bytes that do not parse as a request are not.
                    if e.is_parse() || e.is_parse_too_large() || e.is_parse_status() {
                        log.parse_errors.lock().unwrap().push(e.to_string());
                    }
                }
                log.live.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    (addr, log)
}

/// Runs one generated request through a fresh gateway in front of hyper; checks the
/// property.
async fn check_request(req: GenRequest) -> Result<(), TestCaseError> {
    let (up, log) = hyper_upstream().await;
    let (gw, _dir) = guarded_gateway(up).await;
    let addr = gw.listener_addr("main").unwrap();
    let answer = exchange(addr, &req.wire(None)).await;
    gw.shutdown(Duration::from_secs(5)).await;
    prop_assert!(log.all_parsed().await, "upstream connections never closed");

    let seen = log.seen.lock().unwrap().clone();
    let errors = log.parse_errors.lock().unwrap().clone();
    let wire_text = String::from_utf8_lossy(&req.wire(None)).into_owned();
    prop_assert!(
        errors.is_empty(),
        "the upstream could not parse what moat sent: {:?}\nrequest:\n{}",
        errors,
        wire_text
    );
    // Nothing reached the upstream that was not one of the client's own requests.
    prop_assert!(
        seen.iter()
            .all(|s| !s.smuggled_marker || s.target != "/admin/secret"),
        "a request inside a body reached the upstream: {:?}\nrequest:\n{}",
        seen,
        wire_text
    );
    let parsed: Vec<Parsed> = seen
        .iter()
        .map(|s| (s.method.clone(), s.target.clone(), s.body.clone()))
        .collect();
    judge(&req, &answer, &parsed).map_err(TestCaseError::fail)
}

/// The reproduction: `Connection: content-length` (and a list with it) must not
/// let a body become a second request.
#[tokio::test]
async fn connection_nominating_content_length_smuggles_nothing() {
    for connection in [
        vec!["content-length"],
        vec!["keep-alive", "Content-Length"],
        vec!["transfer-encoding"],
        vec!["host"],
    ] {
        let req = GenRequest {
            method: "POST",
            target: "/",
            host: Some("x"),
            framing: Framing::Length,
            connection,
            extras: Vec::new(),
            body: SMUGGLED.to_vec(),
            pipelined: false,
        };
        check_request(req.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn one_request_in_one_request_out() {
    run_property(160, request_strategy(), check_request);
}

// ---------------------------------------------------------------------------------
// Generated responses.
// ---------------------------------------------------------------------------------

/// A raw upstream: the generated response to the first request on a connection, a
/// plain `x-seq: N` response to each later one.
async fn raw_upstream(first: Vec<u8>, closes: bool) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut seq = 0usize;
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = Vec::new();
            loop {
                // One request head (the test sends bodyless GETs).
                let end = loop {
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break Some(i + 4);
                    }
                    let mut chunk = [0u8; 4096];
                    match s.read(&mut chunk).await {
                        Ok(0) | Err(_) => break None,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                let Some(end) = end else { break };
                buf.drain(..end);
                seq += 1;
                let reply = if seq == 1 {
                    first.clone()
                } else {
                    format!("HTTP/1.1 200 OK\r\nx-seq: {seq}\r\nContent-Length: 6\r\n\r\nsecond")
                        .into_bytes()
                };
                if s.write_all(&reply).await.is_err() {
                    break;
                }
                if seq == 1 && closes {
                    let _ = s.shutdown().await;
                    break;
                }
            }
        }
    });
    addr
}

async fn check_response(resp: GenResponse) -> Result<(), TestCaseError> {
    let up = raw_upstream(resp.wire(), resp.closes()).await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = common::basic_config(up, "");
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();

    let result = tokio::time::timeout(IO_TIMEOUT, async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        let mut out = Vec::new();
        for path in ["/first", "/second"] {
            if send.ready().await.is_err() {
                break;
            }
            let req = Request::get(path)
                .header("host", "x")
                .body(Empty::<Bytes>::new())
                .unwrap();
            let Ok(r) = send.send_request(req).await else {
                break;
            };
            let status = r.status().as_u16();
            let seq = r
                .headers()
                .get("x-seq")
                .map(|v| v.to_str().unwrap_or("").to_string());
            let smuggled = r.headers().contains_key("x-smuggled");
            let body = r.into_body().collect().await.map(|b| b.to_bytes().to_vec());
            out.push((status, seq, smuggled, body.ok()));
        }
        out
    })
    .await;
    gw.shutdown(Duration::from_secs(5)).await;
    let got = result.map_err(|_| TestCaseError::fail("exchange timed out"))?;
    let wire = String::from_utf8_lossy(&resp.wire()).into_owned();
    prop_assert!(
        !got.is_empty(),
        "no response at all\nupstream sent:\n{}",
        wire
    );
    let (status, seq, smuggled, body) = &got[0];
    prop_assert!(!smuggled, "{:?}", got);
    if *status == 200 {
        prop_assert_eq!(seq.as_deref(), Some("1"));
        prop_assert_eq!(
            body.as_deref(),
            Some(&resp.body[..]),
            "first body\nupstream sent:\n{}",
            wire
        );
    } else {
        prop_assert_eq!(*status, 502, "{:?}\nupstream sent:\n{}", got, wire);
    }
    if let Some((status, seq, smuggled, body)) = got.get(1) {
        prop_assert!(!smuggled, "{:?}\nupstream sent:\n{}", got, wire);
        prop_assert_eq!(*status, 200);
        prop_assert!(
            seq.as_deref().is_some_and(|s| s != "1"),
            "second response is the first one's: {:?}",
            got
        );
        prop_assert_eq!(body.as_deref(), Some(&b"second"[..]));
    }
    Ok(())
}

#[test]
fn one_response_in_one_response_out() {
    run_property(96, response_strategy(), check_response);
}

// ---------------------------------------------------------------------------------
// HTTP/2 in, HTTP/1.1 out.
// ---------------------------------------------------------------------------------

/// Writes one HTTP/2 POST to `/` with `fields` and `body` (see [`h2_exchange`]) and
/// returns what the server answered.
async fn h2_raw(addr: SocketAddr, fields: &[(&str, &str)], body: &[u8]) -> Session {
    // :method POST (static 3), :scheme http (6), :path / (4), :authority x.
    let mut block = vec![0x83, 0x86, 0x84, 0x01, 0x01, b'x'];
    for (k, v) in fields {
        hpack_literal(&mut block, k, v);
    }
    h2_exchange(addr, &block, body).await
}

/// HTTP/2 forbids connection-specific fields (RFC 9113 8.2.2): a request carrying
/// `connection`, `transfer-encoding` or `te` other than `trailers` is malformed and
/// never reaches the upstream; a length that disagrees with the DATA sent neither.
/// A well-formed request whose body holds a request reaches it as one request with
/// exactly that body.
#[tokio::test]
async fn h2_requests_are_forwarded_as_exactly_one_request() {
    let (up, log) = hyper_upstream().await;
    let (gw, _dir) = guarded_gateway(up).await;
    let addr = gw.listener_addr("main").unwrap();
    let smuggled = std::str::from_utf8(SMUGGLED).unwrap();
    let len = SMUGGLED.len().to_string();

    for fields in [
        vec![
            ("connection", "content-length"),
            ("content-length", len.as_str()),
        ],
        vec![("connection", "keep-alive")],
        vec![("transfer-encoding", "chunked")],
        vec![("te", "gzip")],
        vec![("content-length", "3")],
        vec![("content-length", "999")],
    ] {
        let answer = h2_raw(addr, &fields, SMUGGLED).await;
        assert!(
            answer.streams[0].reset.is_some() || answer.goaway.is_some(),
            "{fields:?}: neither RST_STREAM nor GOAWAY: {answer:?}"
        );
    }
    // Well-formed: one request, the body exactly.
    let answer = h2_raw(
        addr,
        &[
            ("content-length", len.as_str()),
            ("te", "trailers"),
            ("x-a", smuggled.lines().next().unwrap()),
        ],
        SMUGGLED,
    )
    .await;
    assert!(
        answer.streams[0].head.is_some(),
        "no HEADERS answer: {answer:?}"
    );
    gw.shutdown(Duration::from_secs(5)).await;
    assert!(log.all_parsed().await, "upstream connections never closed");
    let seen = log.seen.lock().unwrap().clone();
    assert!(log.parse_errors.lock().unwrap().is_empty());
    assert_eq!(
        seen,
        vec![Seen {
            method: "POST".into(),
            target: "/".into(),
            body: SMUGGLED.to_vec(),
            smuggled_marker: false,
        }]
    );
}
