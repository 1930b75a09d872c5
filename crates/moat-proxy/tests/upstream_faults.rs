//! A hostile upstream on a real socket: it resets connections before the head and in
//! the middle of a body, answers garbage, answers too slowly, and closes keep-alive
//! connections at random. Each fault gets the right status (502, 504, or a cut
//! response once the head has gone out), no connection is leaked (the sockets open
//! on both sides match the gateway's idle pool, the process's sockets come back),
//! and passive ejection takes a hostile endpoint out of rotation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use moat_proxy::{GatewayOptions, RunningGateway};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Descriptor counts are per process: the tests of this file run one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The hostile upstream: its address, the connections open on its side now and
/// those it accepted since it started.
struct Hostile {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
}

/// Decrements the open-connection count when a connection task ends.
struct Open(Arc<AtomicUsize>);
impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads one request head (these tests send no bodies); `None` at end of file.
async fn read_head_of(s: &mut TcpStream, buf: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).into_owned();
            buf.drain(..i + 4);
            return Some(head.split(' ').nth(1).unwrap_or("").to_owned());
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Closes with a TCP reset (SO_LINGER 0) instead of a FIN.
// tokio deprecates `set_linger` because a nonzero linger blocks the dropping thread;
// a zero linger resets at once and never blocks.
#[allow(deprecated)]
fn reset(s: TcpStream) {
    let _ = s.set_linger(Some(Duration::ZERO));
    drop(s);
}

async fn hostile_upstream() -> Hostile {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::new(AtomicUsize::new(0));
    let (count, total) = (open.clone(), accepted.clone());
    tokio::spawn(async move {
        let mut seq = 0u64;
        while let Ok((mut s, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            total.fetch_add(1, Ordering::SeqCst);
            let guard = Open(count.clone());
            seq += 1;
            let mut rng = seq;
            tokio::spawn(async move {
                let _guard = guard;
                let mut buf = Vec::new();
                while let Some(path) = read_head_of(&mut s, &mut buf).await {
                    match path.as_str() {
                        "/reset-head" => return reset(s),
                        "/reset-body" => {
                            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n";
                            let _ = s.write_all(head).await;
                            let _ = s.write_all(&[b'x'; 1000]).await;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            return reset(s);
                        }
                        // Sends part of its body, then nothing for longer than the
                        // read timeout.
                        "/stall-body" => {
                            let head = b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n";
                            let _ = s.write_all(head).await;
                            let _ = s.write_all(&[b'x'; 1000]).await;
                            tokio::time::sleep(Duration::from_secs(5)).await;
                            return;
                        }
                        // Sends its body a byte at a time, each within the read timeout.
                        "/trickle" => {
                            let head = "HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\n";
                            if !trickle(&mut s, head, "slowly", "").await {
                                return;
                            }
                        }
                        // A chunked body whose chunk-size line (an extension) comes a
                        // byte at a time: bytes arrive, none of them data yet.
                        "/trickle-chunk-line" => {
                            let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
                            let (line, rest) = ("6;wait=abcdefgh\r\n", "slowly\r\n0\r\n\r\n");
                            if !trickle(&mut s, head, line, rest).await {
                                return;
                            }
                        }
                        "/garbage" => {
                            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n\r\n").await;
                        }
                        // Holds its connection a while: concurrent requests need
                        // as many upstream connections.
                        "/hold" => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                        "/slow" => {
                            tokio::time::sleep(Duration::from_secs(2)).await;
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                        }
                        _ => {
                            let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                            if s.write_all(ok).await.is_err() {
                                return;
                            }
                            // `/flaky`: one answer in four closes the keep-alive
                            // connection without saying so (xorshift, per connection).
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            if path == "/flaky" && rng & 3 == 0 {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    Hostile {
        addr,
        open,
        accepted,
    }
}

fn config(endpoints: &[SocketAddr], consecutive_failures: u32) -> String {
    let eps: Vec<String> = endpoints.iter().map(|a| format!("\"{a}\"")).collect();
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: [{}]
    connect_timeout: 500ms
    request_timeout: 300ms
    read_timeout: 500ms
    ejection: {{ consecutive_failures: {consecutive_failures}, duration: 1m }}
routes:
  - name: all
    cluster: app
"#,
        eps.join(", ")
    )
}

/// A gateway with [`config`] in front of `endpoints`; the directory holds its config.
async fn gateway_to(
    endpoints: &[SocketAddr],
    consecutive_failures: u32,
) -> (RunningGateway, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let yaml = config(endpoints, consecutive_failures);
    (
        gateway(dir.path(), &yaml, GatewayOptions::default()).await,
        dir,
    )
}

/// TCP sockets the process holds. Only TCP: a test waiting for [`SERIAL`] has
/// already built its runtime, whose epoll and eventfd descriptors and whose copy of
/// tokio's signal socket would otherwise count against the test that holds the lock.
fn open_sockets() -> usize {
    fd_targets().iter().filter(|t| t.contains(" tcp ")).count()
}

/// What each open descriptor is, for a failure message; a TCP socket with its
/// line of /proc/net/tcp (local, remote address and state, in hex).
fn fd_targets() -> Vec<String> {
    let tcp = ["/proc/self/net/tcp", "/proc/self/net/tcp6"]
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .concat();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| {
            let t = t.display().to_string();
            let inode = t.strip_prefix("socket:[").and_then(|i| i.strip_suffix(']'));
            let line =
                inode.and_then(|i| tcp.lines().find(|l| l.split_whitespace().nth(9) == Some(i)));
            match line {
                Some(l) => {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    format!("{t} tcp {} -> {} st {}", f[1], f[2], f[3])
                }
                None => t,
            }
        })
        .collect()
}

/// Idle connections in the gateway's pool, over every endpoint of the route, after
/// the reaper's pass (which drops the ones the upstream closed meanwhile).
fn pooled(gw: &RunningGateway) -> usize {
    let snap = gw.shared().snapshot();
    let cluster = &snap
        .routes
        .iter()
        .find(|r| &*r.name == "all")
        .unwrap()
        .cluster;
    cluster.prune_idle();
    cluster.endpoints.iter().map(|e| e.pool.idle_count()).sum()
}

/// Waits until every upstream connection still open is one the gateway pools (none
/// leaked in a request task, none half-closed forever) and the process holds no
/// socket beyond `baseline` plus both ends of each pooled connection.
async fn assert_no_leak(gw: &RunningGateway, up: &Hostile, baseline: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (pooled, open, sockets) = (pooled(gw), up.open.load(Ordering::SeqCst), open_sockets());
        if open == pooled && sockets <= baseline + 2 * pooled {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "leak: {open} upstream connections open, {pooled} pooled, {sockets} sockets (baseline {baseline}): {:?}",
            fd_targets()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Writes `head`, then `slow` a byte every 200 ms, then `rest`; false when the peer
/// went away.
async fn trickle(s: &mut TcpStream, head: &str, slow: &str, rest: &str) -> bool {
    if s.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for b in slow.bytes() {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if s.write_all(&[b]).await.is_err() {
            return false;
        }
    }
    s.write_all(rest.as_bytes()).await.is_ok()
}
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fault_gets_its_status_and_leaks_nothing() {
    let _serial = SERIAL.lock().await;
    let up = hostile_upstream().await;
    // Ejection off: this test is about each fault's answer.
    let (gw, _dir) = gateway_to(&[up.addr], 0).await;
    let addr = gw.listener_addr("main").unwrap();
    let baseline = open_sockets();

    for round in 0..3 {
        for (path, want) in [
            ("/reset-head", "HTTP/1.1 502"),
            ("/garbage", "HTTP/1.1 502"),
            ("/slow", "HTTP/1.1 504"),
            ("/ok", "HTTP/1.1 200"),
        ] {
            let resp = raw(
                addr,
                format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").as_bytes(),
            )
            .await;
            assert!(resp.starts_with(want), "round {round} {path}: {resp:.200}");
        }
        // Reset in the middle of the body: the head is out, so the client gets a cut
        // response (never a complete one) or, if the reset came first, a 502.
        let resp = raw(
            addr,
            b"GET /reset-body HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
        )
        .await;
        let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        assert!(
            resp.starts_with("HTTP/1.1 502")
                || (resp.starts_with("HTTP/1.1 200") && body.len() < 100_000),
            "round {round}: {:.200}",
            resp
        );
    }
    // The slow upstream answers after the gateway gave up: its connection was closed,
    // not pooled, and its late answer reaches nobody.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_no_leak(&gw, &up, baseline).await;
    gw.shutdown(Duration::from_secs(2)).await;
}

/// An upstream that stops sending in the middle of a body is cut at the cluster's
/// `read_timeout`: the client's response ends short (its connection closed), the
/// upstream connection is closed, and the timeout is counted. One that sends slowly,
/// each piece within the timeout, is read to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_response_body_is_cut_at_the_read_timeout() {
    let _serial = SERIAL.lock().await;
    let up = hostile_upstream().await;
    let (gw, _dir) = gateway_to(&[up.addr], 0).await;
    let addr = gw.listener_addr("main").unwrap();
    let baseline = open_sockets();

    let started = Instant::now();
    let resp = raw(addr, b"GET /stall-body HTTP/1.1\r\nhost: t\r\n\r\n").await;
    let took = started.elapsed();
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp:.200}");
    assert_eq!(
        body.len(),
        1000,
        "the body the upstream sent before it stalled"
    );
    // `raw` reads to the close: moat closed the keep-alive connection of a cut response.
    assert!(
        took >= Duration::from_millis(450) && took < Duration::from_secs(3),
        "cut after {took:?}"
    );

    // Over HTTP/2 the stream is reset after the part that came: never ended as if whole.
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    hpack_literal(&mut block, ":path", "/stall-body");
    hpack_literal(&mut block, ":authority", "t");
    let session = h2_exchange(addr, &block, b"").await;
    let answer = &session.streams[0];
    assert!(answer.head.is_some(), "HEADERS first: {session:?}");
    assert!(
        !answer.ended && (answer.reset.is_some() || session.goaway.is_some()),
        "RST_STREAM or GOAWAY, not END_STREAM: {session:?}"
    );

    let resp = raw(
        addr,
        b"GET /trickle HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp:.200}");
    assert!(resp.ends_with("\r\n\r\nslowly"), "{resp:.200}");
    // Bytes that arrive count, not only the data they decode to.
    let resp = raw(
        addr,
        b"GET /trickle-chunk-line HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp:.200}");
    assert!(resp.ends_with("slowly\r\n0\r\n\r\n"), "{resp:.300}");

    // A client of its own, dropped before the count: its pooled connection to the
    // admin listener is no leak.
    let m = get(&client(), &format!("http://{}/metrics", gw.admin_addr()))
        .await
        .2;
    let m = String::from_utf8_lossy(&m);
    assert!(
        m.contains(r#"moat_upstream_errors_total{cluster="app",kind="timeout"} 2"#),
        "{m}"
    );
    assert_no_leak(&gw, &up, baseline).await;
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_connections_closed_at_random_lose_no_request() {
    let _serial = SERIAL.lock().await;
    let up = hostile_upstream().await;
    let (gw, _dir) = gateway_to(&[up.addr], 5).await;
    let addr = gw.listener_addr("main").unwrap();
    let baseline = open_sockets();
    // 16 clients, 40 keep-alive requests each; the upstream drops a quarter of its
    // connections after an answer. Idempotent requests that meet a dead pooled
    // connection are sent again on a new one: every request succeeds.
    let mut tasks = Vec::new();
    for _ in 0..16 {
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let mut ok = 0;
            for _ in 0..40 {
                s.write_all(b"GET /flaky HTTP/1.1\r\nhost: t\r\n\r\n")
                    .await
                    .unwrap();
                let head = read_head(&mut s).await;
                let text = String::from_utf8_lossy(&head);
                assert!(text.starts_with("HTTP/1.1 200"), "{text}");
                // The 2-byte body may have come with the head.
                let mut got = text.split_once("\r\n\r\n").map_or(0, |(_, b)| b.len());
                while got < 2 {
                    let mut b = [0u8; 16];
                    got += s.read(&mut b).await.unwrap();
                }
                ok += 1;
            }
            ok
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap();
    }
    assert_eq!(ok, 16 * 40);
    let (_, _, metrics) = get(&client(), &format!("http://{}/metrics", gw.admin_addr())).await;
    let m = String::from_utf8_lossy(&metrics);
    assert!(
        m.contains(r#"moat_upstream_ejections_total{cluster="app"} 0"#),
        "keep-alive races are not failures: {m}"
    );
    assert_no_leak(&gw, &up, baseline).await;
    gw.shutdown(Duration::from_secs(2)).await;
}

/// Sends `n` requests for `path` on new connections; returns how many got a 502
/// (every other answer must be a 200).
async fn count_502(addr: SocketAddr, path: &str, n: usize) -> usize {
    let mut failed = 0;
    for _ in 0..n {
        let req = format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n");
        let resp = raw(addr, req.as_bytes()).await;
        if resp.starts_with("HTTP/1.1 502") {
            failed += 1;
        } else {
            assert!(resp.starts_with("HTTP/1.1 200"), "{path}: {resp:.200}");
        }
    }
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_endpoint_is_ejected() {
    let _serial = SERIAL.lock().await;
    let bad = hostile_upstream().await;
    let good = upstream("good").await;
    // The hostile endpoint answers garbage (or resets); the good one answers
    // everything. Round robin: after two failures in a row the hostile one is out.
    for path in ["/garbage", "/reset-head"] {
        let (gw, _dir) = gateway_to(&[bad.addr, good.addr], 2).await;
        let addr = gw.listener_addr("main").unwrap();
        assert_eq!(count_502(addr, path, 12).await, 2, "{path}");
        let (_, _, metrics) = get(&client(), &format!("http://{}/metrics", gw.admin_addr())).await;
        assert!(
            String::from_utf8_lossy(&metrics)
                .contains(r#"moat_upstream_ejections_total{cluster="app"} 1"#),
            "{path}"
        );
        gw.shutdown(Duration::from_secs(2)).await;
    }
}

/// A burst of concurrent requests opens as many upstream connections; the pool
/// keeps at most `max_idle_per_endpoint` of them (the rest are closed as they come
/// back), the purge then closes the idle ones by halves, and it never closes a
/// connection that steady traffic keeps reusing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_pool_stays_under_its_cap_and_a_burst_is_purged() {
    let _serial = SERIAL.lock().await;
    let up = hostile_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    const CAP: usize = 8;
    const BURST: usize = 64;
    let cfg = config(&[up.addr], 0).replace(
        "    request_timeout: 300ms\n",
        &format!(
            "    request_timeout: 5s\n    max_idle_per_endpoint: {CAP}\n    idle_purge: 300ms\n"
        ),
    );
    let gw = gateway(dir.path(), &cfg, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let baseline = open_sockets();

    let burst: Vec<_> = (0..BURST)
        .map(|_| {
            tokio::spawn(async move {
                raw(
                    addr,
                    b"GET /hold HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
                )
                .await
            })
        })
        .collect();
    // Sampled while the burst runs and ends: never more than the cap pooled.
    let mut most = 0;
    while !burst.iter().all(|t| t.is_finished()) {
        most = most.max(pooled(&gw));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for t in burst {
        let resp = t.await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp:.200}");
    }
    most = most.max(pooled(&gw));
    assert!(most <= CAP, "{most} idle connections pooled, cap {CAP}");
    assert!(
        up.accepted.load(Ordering::SeqCst) >= BURST / 2,
        "the burst was not concurrent: {} upstream connections",
        up.accepted.load(Ordering::SeqCst)
    );
    // The surplus was closed on both sides at once: nothing but the pool is open.
    assert_no_leak(&gw, &up, baseline).await;

    // Steady traffic (a request every 50 ms, several purge intervals): the one
    // connection it reuses is never purged.
    let before = up.accepted.load(Ordering::SeqCst);
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        let resp = raw(
            addr,
            b"GET /ok HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp:.200}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        up.accepted.load(Ordering::SeqCst) - before <= 1,
        "steady traffic reconnected: {} new upstream connections",
        up.accepted.load(Ordering::SeqCst) - before
    );

    // Idle: halved every 300 ms down to nothing, on both sides.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pooled(&gw) > 0 || up.open.load(Ordering::SeqCst) > 0 {
        assert!(
            Instant::now() < deadline,
            "idle pool not purged: {} pooled, {} open upstream",
            pooled(&gw),
            up.open.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        open_sockets() <= baseline,
        "{} sockets, baseline {baseline}: {:?}",
        open_sockets(),
        fd_targets()
    );
}
