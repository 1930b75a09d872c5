//! moat's upstream HTTP/1.1 client against a scripted upstream on loopback: hostile
//! heads and bodies become 502 (never a panic), interim responses, bodies without a
//! body (HEAD, 204), close-delimited and chunked bodies with trailers, connection reuse,
//! and a pooled connection the upstream closed while idle.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use moat_proxy::GatewayOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the scripted upstream does with one request.
struct Script {
    /// Written in this order, with a short pause between pieces.
    pieces: Vec<Vec<u8>>,
    /// Close the connection after the response.
    close: bool,
}

fn reply(pieces: &[&[u8]], close: bool) -> Script {
    Script {
        pieces: pieces.iter().map(|p| p.to_vec()).collect(),
        close,
    }
}

/// The response for a request line (`METHOD /path`).
fn script(method: &str, path: &str) -> Script {
    match path {
        "/ok" => reply(&[b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"], false),
        "/bad-length" => reply(
            &[b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\nabcd"],
            false,
        ),
        "/garbage" => reply(&[b"SSH-2.0-OpenSSH_9.6\r\n\r\n"], false),
        "/huge-head" => {
            let mut head = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
            head.resize(80 << 10, b'a');
            Script {
                pieces: vec![head],
                close: false,
            }
        }
        "/many-headers" => {
            let mut head = b"HTTP/1.1 200 OK\r\n".to_vec();
            for i in 0..200 {
                head.extend_from_slice(format!("x-h{i}: 1\r\n").as_bytes());
            }
            head.extend_from_slice(b"content-length: 0\r\n\r\n");
            Script {
                pieces: vec![head],
                close: false,
            }
        }
        "/bad-chunk" => reply(
            &[b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"],
            false,
        ),
        "/early-close" => reply(
            &[b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort"],
            true,
        ),
        "/unexpected-101" => reply(
            &[b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n"],
            false,
        ),
        "/interim" => reply(
            &[
                b"HTTP/1.1 100 Continue\r\n\r\n",
                b"HTTP/1.1 103 Early Hints\r\nlink: </a.css>; rel=preload\r\n\r\n",
                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nfinal",
            ],
            false,
        ),
        "/head" if method == "HEAD" => {
            reply(&[b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n"], false)
        }
        "/no-content" => reply(&[b"HTTP/1.1 204 No Content\r\n\r\n"], false),
        "/until-close" => reply(
            &[
                b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nfirst part, ",
                b"second part",
            ],
            true,
        ),
        "/chunked" => reply(
            &[
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhel",
                b"lo\r\n6;ext=1\r\n world\r",
                b"\n0\r\nx-checksum: 42\r\n",
                b"\r\n",
            ],
            false,
        ),
        // Answers, then closes the keep-alive connection as if its idle timer fired.
        "/then-idle-close" => reply(&[b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nonce"], true),
        _ => reply(
            &[b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"],
            false,
        ),
    }
}

/// Reads one request (head and `content-length` body) from `s`; `None` at end of file.
async fn read_request(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<(String, String)> {
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < end + len {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let line = head.lines().next().unwrap_or("").to_owned();
    buf.drain(..end + len);
    let mut words = line.split(' ');
    let method = words.next().unwrap_or("").to_uppercase();
    let path = words.next().unwrap_or("").to_owned();
    Some((method, path))
}

/// Starts the scripted upstream; returns its address and the connections it accepted.
async fn scripted_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let count = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                while let Some((method, path)) = read_request(&mut s, &mut buf).await {
                    let script = script(&method, &path);
                    for (i, piece) in script.pieces.iter().enumerate() {
                        if i > 0 {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        if s.write_all(piece).await.is_err() {
                            return;
                        }
                    }
                    if script.close {
                        return;
                    }
                }
            });
        }
    });
    (addr, connections)
}

/// Sends `method path` on a new connection and returns the whole raw response.
async fn call(gw: SocketAddr, method: &str, path: &str) -> String {
    raw(
        gw,
        format!("{method} {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
}

fn body_of(resp: &str) -> &str {
    resp.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

/// The data of a chunked body as moat sent it downstream.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size, 16).unwrap();
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = &rest[n + 2..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_upstream_responses_are_502() {
    let (up, _) = scripted_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &basic_config(up, ""), GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    for path in [
        "/bad-length",
        "/garbage",
        "/huge-head",
        "/many-headers",
        "/bad-chunk",
        "/unexpected-101",
    ] {
        let resp = call(addr, "GET", path).await;
        assert!(resp.starts_with("HTTP/1.1 502"), "{path}: {resp}");
    }
    // A body cut short by the upstream never passes as complete: either a 502 (the
    // close was seen before the head went out) or a truncated response.
    let resp = call(addr, "GET", "/early-close").await;
    assert!(
        resp.starts_with("HTTP/1.1 502")
            || (resp.starts_with("HTTP/1.1 200") && body_of(&resp).len() < 100),
        "{resp}"
    );
    // The gateway still serves.
    let resp = call(addr, "GET", "/ok").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert_eq!(body_of(&resp), "ok");
    gw.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interim_bodyless_close_delimited_and_chunked_responses() {
    let (up, connections) = scripted_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &basic_config(up, ""), GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();

    let resp = call(addr, "GET", "/interim").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert_eq!(body_of(&resp), "final");

    // HEAD keeps the upstream's content-length and has no body; 204 has none either;
    // both leave the upstream connection reusable.
    let resp = call(addr, "HEAD", "/head").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("content-length: 1234"), "{resp}");
    assert_eq!(body_of(&resp), "");
    let resp = call(addr, "GET", "/no-content").await;
    assert!(resp.starts_with("HTTP/1.1 204"), "{resp}");
    let resp = call(addr, "GET", "/ok").await;
    assert_eq!(body_of(&resp), "ok");
    assert_eq!(
        connections.load(Ordering::SeqCst),
        1,
        "HEAD and 204 must leave the connection reusable"
    );

    // A chunked body arriving in pieces, with trailers.
    let resp = call(addr, "GET", "/chunked").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains("transfer-encoding: chunked"), "{resp}");
    assert_eq!(dechunk(body_of(&resp)), "hello world", "{resp}");
    assert_eq!(connections.load(Ordering::SeqCst), 1);

    // A body delimited by the close arrives whole; that connection is not reused.
    let resp = call(addr, "GET", "/until-close").await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert_eq!(dechunk(body_of(&resp)), "first part, second part", "{resp}");
    let resp = call(addr, "GET", "/ok").await;
    assert_eq!(body_of(&resp), "ok");
    assert_eq!(connections.load(Ordering::SeqCst), 2);
    gw.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooled_connection_closed_by_the_upstream_is_replaced() {
    let (up, connections) = scripted_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &basic_config(up, ""), GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    for round in 1..=3 {
        // The upstream closes each connection right after answering, without saying so:
        // the next request finds a dead pooled connection and must still succeed.
        let resp = call(addr, "GET", "/then-idle-close").await;
        assert!(resp.starts_with("HTTP/1.1 200"), "round {round}: {resp}");
        assert_eq!(body_of(&resp), "once");
        assert_eq!(connections.load(Ordering::SeqCst), round);
    }
    // Also with a small POST body (the closed connection is found at checkout).
    let resp = raw(
        addr,
        b"POST /then-idle-close HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\nconnection: close\r\n\r\nabc",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    gw.shutdown(Duration::from_secs(1)).await;
}
