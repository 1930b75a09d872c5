//! The HTTP/1 connection watchdog on a paused clock: an idle keep-alive connection is
//! closed, a client that stops reading its response is disconnected, and a client that
//! reads slowly but steadily gets its whole response. (The watchdog's period is 10 s;
//! tokio's paused clock jumps to the next timer whenever every task waits.)

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
