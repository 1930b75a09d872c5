//! Limits and bans shared through a real `redis-server` by real `moat serve` processes:
//! two gateways hold one combined limit; a ban made through one (with `moat bans`)
//! reaches the other; Redis killed and restarted mid-run (no stall, the configured
//! outcome, recovery).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use moat_testkit::{free_port, real_part, wait_for_port, ChildGuard};

fn redis_server(port: u16) -> Option<ChildGuard> {
    let bin = real_part("redis-server", "scripts/ensure-apt redis-server")?;
    let child = Command::new(bin)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard(child);
    assert!(
        wait_for_port(port, Duration::from_secs(10)),
        "redis-server did not start"
    );
    Some(guard)
}

/// An upstream answering every request `200 ok`, keeping connections open.
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            thread::spawn(move || {
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                let mut line = String::new();
                loop {
                    line.clear();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line == "\r\n" => {
                            if w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                                .is_err()
                            {
                                return;
                            }
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    addr
}

/// A `moat serve` process on `ratelimit` settings; returns it with its listener and
/// admin addresses.
fn moat(
    dir: &Path,
    name: &str,
    up: SocketAddr,
    ratelimit: &str,
) -> (ChildGuard, SocketAddr, SocketAddr) {
    let (listen, admin) = (free_port().unwrap(), free_port().unwrap());
    let cfg = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &cfg,
        format!(
            "runtime: {{ threads: 1 }}\nlisteners:\n  - name: main\n    address: 127.0.0.1:{listen}\nadmin: {{ address: 127.0.0.1:{admin} }}\nclusters:\n  - name: app\n    endpoints: [\"{up}\"]\nroutes:\n  - name: all\n    cluster: app\nratelimit:\n{ratelimit}"
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--config"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard(child);
    assert!(
        wait_for_port(listen, Duration::from_secs(20)),
        "moat did not start"
    );
    (
        guard,
        ([127, 0, 0, 1], listen).into(),
        ([127, 0, 0, 1], admin).into(),
    )
}

/// A keep-alive HTTP/1.1 client connection.
struct Conn(BufReader<TcpStream>);

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn(BufReader::new(s))
    }

    /// Sends a GET and returns the status.
    fn get(&mut self, path: &str) -> u16 {
        self.0
            .get_mut()
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())
            .unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).unwrap();
        let status = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut len = 0usize;
        loop {
            line.clear();
            self.0.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        self.0.read_exact(&mut body).unwrap();
        status
    }
}

fn admin_get(admin: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(admin).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Two gateways, one Redis: 100 requests/s (burst 10) for the fleet, offered far more
/// through both for 10 s (the issue says 30 s; 10 s keeps the test's wall time modest
/// and the bound is on the total, which the lease batches offset by a constant).
#[test]
fn two_gateways_hold_one_combined_limit_and_share_bans() {
    let port = free_port().unwrap();
    let Some(_redis) = redis_server(port) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let up = upstream();
    let rl = format!("  store: {{ redis: \"redis://127.0.0.1:{port}\" }}\n  bans: {{ after_blocks: 0 }}\n  rules:\n    - name: fleet\n      rate: 100\n      per: 1s\n      burst: 10\n");
    let (_a, a, admin_a) = moat(dir.path(), "a", up, &rl);
    let (_b, b, admin_b) = moat(dir.path(), "b", up, &rl);
    let window = Duration::from_secs(10);
    let ok = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let clients: Vec<_> = [a, a, b, b]
        .into_iter()
        .map(|addr| {
            let (ok, total) = (ok.clone(), total.clone());
            thread::spawn(move || {
                let mut c = Conn::open(addr);
                while start.elapsed() < window {
                    total.fetch_add(1, Ordering::Relaxed);
                    match c.get("/x") {
                        200 => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        429 => {}
                        s => panic!("status {s}"),
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let ok = ok.load(Ordering::Relaxed) as f64;
    let total = total.load(Ordering::Relaxed);
    let expected = 10.0 + 100.0 * elapsed;
    eprintln!("fleet: {ok} of {total} requests passed in {elapsed:.2} s; limit {expected:.0}");
    assert!(
        total as f64 > 2.0 * expected,
        "the offered load must exceed the limit: {total}"
    );
    assert!(
        ok <= expected * 1.05,
        "over the limit by more than 5%: {ok} > {expected:.0}"
    );
    assert!(
        ok >= expected * 0.95,
        "under the limit by more than 5%: {ok} < {expected:.0}"
    );

    // A ban made through gateway a with the CLI reaches gateway b.
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["bans", "add", "127.0.0.1", "--for", "1m", "--admin"])
        .arg(admin_a.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if Conn::open(b).get("/y") == 403 {
            break;
        }
        assert!(Instant::now() < deadline, "the ban did not reach gateway b");
        thread::sleep(Duration::from_millis(100));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["bans", "list", "--admin"])
        .arg(admin_b.to_string())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("127.0.0.1"),
        "{out:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["bans", "delete", "127.0.0.1", "--admin"])
        .arg(admin_b.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while Conn::open(a).get("/y") == 403 {
        assert!(
            Instant::now() < deadline,
            "the lifted ban did not reach gateway a"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Redis killed mid-run: requests keep being answered promptly with each gateway's
/// configured outcome (`allow`: served, `deny`: 503), the store errors are counted,
/// and once Redis is back both gateways use it again.
#[test]
fn redis_killed_and_restarted_mid_run() {
    let port = free_port().unwrap();
    let Some(redis) = redis_server(port) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let up = upstream();
    let rl = |mode: &str| {
        format!("  store: {{ redis: \"redis://127.0.0.1:{port}\" }}\n  on_store_error: {mode}\n  store_timeout: 100ms\n  rules:\n    - name: high\n      rate: 100000\n      per: 1s\n")
    };
    let (_a, allow, admin_allow) = moat(dir.path(), "allow", up, &rl("allow"));
    let (_d, deny, admin_deny) = moat(dir.path(), "deny", up, &rl("deny"));
    let mut ca = Conn::open(allow);
    let mut cd = Conn::open(deny);
    // Both reach Redis (the first requests may run on credit before the connection).
    let wait_for = |c: &mut Conn, want: u16, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let t = Instant::now();
            let s = c.get("/x");
            assert!(
                t.elapsed() < Duration::from_secs(1),
                "{what}: a request stalled {:?}",
                t.elapsed()
            );
            if s == want {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: still {s}");
            thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for(&mut ca, 200, "allow before");
    wait_for(&mut cd, 200, "deny before");
    drop(redis);
    // Both keep answering promptly while Redis is down.
    wait_for(&mut cd, 503, "deny with redis down");
    for _ in 0..50 {
        let t = Instant::now();
        assert_eq!(ca.get("/x"), 200, "allow with redis down");
        assert_eq!(cd.get("/x"), 503, "deny with redis down");
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "stalled: {:?}",
            t.elapsed()
        );
    }
    let metrics = admin_get(admin_deny, "/metrics");
    let errors = metrics
        .lines()
        .find(|l| l.starts_with("moat_ratelimit_store_total{what=\"errors\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap();
    assert!(errors > 0, "{metrics}");
    assert!(metrics.contains("moat_ratelimit_store_up 0"), "{metrics}");
    // Back on the same port: both recover (reconnection backs off to at most 5 s).
    let _redis = redis_server(port).unwrap();
    wait_for(&mut cd, 200, "deny after restart");
    wait_for(&mut ca, 200, "allow after restart");
    // The allow gateway answers 200 either way: its store gauge says it is back.
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let m = admin_get(admin_allow, "/metrics");
        if m.contains("moat_ratelimit_store_up 1") {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "allow gateway did not reconnect: {m}"
        );
        thread::sleep(Duration::from_millis(100));
    };
    assert!(
        metrics.contains("moat_ratelimit_requests_total{rule=\"high\",outcome=\"store_fallback\"}"),
        "{metrics}"
    );
}
