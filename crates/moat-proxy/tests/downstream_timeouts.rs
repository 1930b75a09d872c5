//! The HTTP/1 connection watchdog on a paused clock: an idle keep-alive connection is
//! closed, a client that stops reading its response is disconnected, and a client that
//! reads slowly but steadily gets its whole response. (The watchdog's period is 10 s;
//! tokio's paused clock jumps to the next timer whenever every task waits.)
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until end of file or a reset; returns the number of bytes.
async fn drain(s: &mut TcpStream) -> usize {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return total,
            Ok(n) => total += n,
        }
    }
}

#[tokio::test(start_paused = true)]
async fn idle_keep_alive_connection_is_closed() {
    let g = basic_gateway().await;
    let addr = g.addr;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    // Still open a little later...
    tokio::time::sleep(Duration::from_secs(5)).await;
    s.write_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
        .await
        .unwrap();
    assert!(read_head(&mut s).await.starts_with(b"HTTP/1.1 200"));
    // ...closed after 30 to 40 s without a request.
    tokio::time::sleep(Duration::from_secs(45)).await;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "an idle connection was kept open");
}

#[tokio::test(start_paused = true)]
async fn client_that_stops_reading_is_disconnected() {
    let g = basic_gateway().await;
    let addr = g.addr;
    let total = 32 << 20;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET /big?n={total} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    // The client stops reading: moat's write blocks once the socket buffers are full.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let received = head.len() + drain(&mut s).await;
    assert!(
        received < total,
        "the whole response ({received} bytes) arrived: the stalled connection was kept"
    );
}

#[tokio::test(start_paused = true)]
async fn client_that_reads_slowly_gets_the_whole_response() {
    let g = basic_gateway().await;
    let addr = g.addr;
    let total: usize = 12 << 20;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET /big?n={total} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    let end = head.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let mut body = head.len() - end;
    // 1 MiB every 5 s: slow, but never 30 s without progress.
    let mut buf = vec![0u8; 1 << 16];
    while body < total {
        let mut chunk = 0;
        while chunk < 1 << 20 && body < total {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed after {body} of {total} bytes");
            chunk += n;
            body += n;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert_eq!(body, total);
}

/// Sends the head of a `Content-Length: 50000` POST to `path`, then one byte every
/// `every` until moat answers or `give_up` passes; returns moat's answer and how long
/// after the head it came.
async fn trickle(
    addr: std::net::SocketAddr,
    path: &str,
    every: Duration,
    give_up: Duration,
) -> (String, Duration) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("POST {path} HTTP/1.1\r\nhost: t\r\ncontent-length: 50000\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let start = tokio::time::Instant::now();
    let mut buf = vec![0u8; 4096];
    let mut answer = Vec::new();
    while start.elapsed() < give_up {
        tokio::select! {
            n = s.read(&mut buf) => match n {
                Ok(0) | Err(_) => break,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            },
            _ = tokio::time::sleep(every) => {
                if s.write_all(b"x").await.is_err() {
                    break;
                }
            }
        }
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        start.elapsed(),
    )
}

#[tokio::test(start_paused = true)]
async fn trickled_body_is_cut_at_the_default_pace() {
    let g = basic_gateway().await;
    // A byte every 3 s: the default 20 s plus 1 s per 500 bytes is never earned.
    let (answer, after) = trickle(
        g.addr,
        "/",
        Duration::from_secs(3),
        Duration::from_secs(120),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert!(
        after >= Duration::from_secs(20) && after < Duration::from_secs(25),
        "cut after {after:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn body_pace_is_configured_per_route() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let route = "  - name: paced\n    path_prefix: /paced\n    cluster: app\n    \
                 body: { max_bytes: 1MiB, read_timeout: 5s, min_rate: 0 }\n";
    let gw = gateway(
        dir.path(),
        &basic_config(up.addr, route),
        moat_proxy::GatewayOptions::default(),
    )
    .await;
    let addr = gw.listener_addr("main").unwrap();
    // A steady 1 byte/s is cut at 5 s on this route (no rate extension)...
    let (answer, after) = trickle(
        addr,
        "/paced",
        Duration::from_secs(1),
        Duration::from_secs(60),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        after >= Duration::from_secs(5) && after < Duration::from_secs(7),
        "cut after {after:?}"
    );

    // ...and a body that keeps above the default rate is never cut, however long it
    // takes: 40 KiB at 1 KiB/s on the default route (20 s + 1 s per 500 bytes).
    let mut s = TcpStream::connect(addr).await.unwrap();
    let total = 40 << 10;
    s.write_all(
        format!("POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: {total}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        s.write_all(&[b'y'; 1024]).await.unwrap();
    }
    let head = read_head(&mut s).await;
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
}

#[tokio::test(start_paused = true)]
async fn trickled_body_is_cut_while_an_engine_buffers_it() {
    // With the WAF on, the body is read whole for inspection before the upstream is
    // called: the pace holds there too.
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = basic_config(up.addr, "") + "waf: { enabled: true, mode: block }\n";
    let gw = gateway(dir.path(), &yaml, moat_proxy::GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let (answer, after) =
        trickle(addr, "/", Duration::from_secs(3), Duration::from_secs(120)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(after < Duration::from_secs(25), "cut after {after:?}");
    assert_eq!(up.connections(), 0, "the upstream was called");
}

/// A request body fed from a channel, a piece at a time.
struct ChannelBody(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for ChannelBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|piece| piece.map(|b| Ok(http_body::Frame::data(b))))
    }
}

#[tokio::test(start_paused = true)]
async fn trickled_h2_body_is_cut_at_the_default_pace() {
    let g = basic_gateway().await;
    let tcp = TcpStream::connect(g.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let req = http::Request::post(format!("http://{}/", g.addr))
        .header("content-length", "50000")
        .body(ChannelBody(rx))
        .unwrap();
    let start = tokio::time::Instant::now();
    let trickler = tokio::spawn(async move {
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            if tx.send(bytes::Bytes::from_static(b"x")).await.is_err() {
                return;
            }
        }
    });
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), http::StatusCode::REQUEST_TIMEOUT);
    let after = start.elapsed();
    assert!(
        after >= Duration::from_secs(20) && after < Duration::from_secs(25),
        "cut after {after:?}"
    );
    trickler.abort();
}
