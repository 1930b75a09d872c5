//! `moat serve` and `moat check-config` as real processes.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A blocking upstream answering every request after `delay`.
fn slow_upstream(delay: Duration) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut req = Vec::new();
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                thread::sleep(delay);
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\nconnection: close\r\n\r\nslow done",
                );
            });
        }
    });
    addr
}

fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes `dir/moat.yaml`: one listener and an admin listener on free ports, the
/// `runtime` keys given, every request routed to `upstream`. Returns the file and the
/// two addresses.
fn write_config(
    dir: &std::path::Path,
    runtime: &str,
    upstream: SocketAddr,
) -> (std::path::PathBuf, SocketAddr, SocketAddr) {
    let (listen, admin) = (free_port(), free_port());
    let cfg = dir.join("moat.yaml");
    std::fs::write(
        &cfg,
        format!(
            "runtime: {{ {runtime} }}\nlisteners:\n  - name: main\n    address: {listen}\nadmin: {{ address: {admin} }}\nclusters:\n  - name: app\n    endpoints: [\"{upstream}\"]\nroutes:\n  - name: all\n    cluster: app\n"
        ),
    )
    .unwrap();
    (cfg, listen, admin)
}

/// Starts `moat serve --config cfg` (text logs on stderr) and waits for `/readyz`.
fn serve_until_ready(cfg: &std::path::Path, admin: SocketAddr) -> Proc {
    let child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["serve", "--config"])
        .arg(cfg)
        .args(["--log-format", "text"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let proc = Proc(child);
    let start = Instant::now();
    loop {
        if let Ok(r) = http_get(admin, "/readyz") {
            if r.starts_with("HTTP/1.1 200") {
                return proc;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "moat did not become ready"
        );
        thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(unix)]
#[test]
fn sighup_reloads_and_one_worker_is_one_thread() {
    let up = slow_upstream(Duration::ZERO);
    let dir = tempfile::tempdir().unwrap();
    let (cfg, listen, admin) = write_config(dir.path(), "threads: 1", up);
    let proc = serve_until_ready(&cfg, admin);
    let pid = proc.0.id().to_string();
    // One worker is one thread: no helper thread (such as a file watcher) makes every
    // socket call pay for a multi-threaded process.
    #[cfg(target_os = "linux")]
    {
        let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count();
        assert_eq!(threads, 1, "moat --threads 1 runs {threads} threads");
    }
    assert!(http_get(listen, "/").unwrap().starts_with("HTTP/1.1 200"));
    let reloads = || {
        let m = http_get(admin, "/metrics").unwrap();
        m.lines()
            .find_map(|l| l.strip_prefix("moat_config_reloads_total{result=\"ok\"} "))
            .map(str::to_owned)
    };
    assert_eq!(reloads().as_deref(), Some("0"));
    // The file is unchanged: only the signal can cause this reload.
    let st = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads().as_deref() != Some("1") {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        thread::sleep(Duration::from_millis(50));
    }
    assert!(http_get(listen, "/").unwrap().starts_with("HTTP/1.1 200"));
}

#[test]
fn sigterm_drains_in_flight_requests() {
    let up = slow_upstream(Duration::from_millis(1500));
    let dir = tempfile::tempdir().unwrap();
    let (cfg, listen, admin) = write_config(dir.path(), "threads: 1, shutdown_timeout: 10s", up);
    let mut proc = serve_until_ready(&cfg, admin);
    let inflight = thread::spawn(move || http_get(listen, "/slow"));
    thread::sleep(Duration::from_millis(400));
    let pid = proc.0.id().to_string();
    let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(st.success());
    let resp = inflight.join().unwrap().unwrap();
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.ends_with("slow done"), "{resp}");
    // The process exits on its own, successfully, once drained.
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = proc.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "moat did not exit after draining"
        );
        thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    // No longer accepting.
    assert!(http_get(listen, "/").is_err());
    let mut err = String::new();
    if let Some(mut e) = proc.0.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(err.contains("drained"), "{err}");
}

#[test]
fn check_config_reports_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    std::fs::write(
        &good,
        "clusters:\n  - name: app\n    endpoints: [\"127.0.0.1:1\"]\nroutes:\n  - name: all\n    cluster: app\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["check-config"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "clusters:\n  - name: app\n    endpoints: [\"127.0.0.1:1\"]\nroutes:\n  - name: all\n    cluster: ap\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["check-config"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:6:", bad.display())) && err.contains("routes[0].cluster"),
        "{err}"
    );
    assert!(err.contains("unknown cluster `ap`"), "{err}");

    let typo = dir.path().join("typo.yaml");
    std::fs::write(
        &typo,
        "listeners:\n  - name: main\n    adress: 127.0.0.1:1\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(["check-config"])
        .arg(&typo)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(":3:") && err.contains("listeners[0]"), "{err}");
}

#[test]
fn quickstart_config_is_valid() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    for entry in std::fs::read_dir(examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let out = Command::new(env!("CARGO_BIN_EXE_moat"))
                .args(["check-config"])
                .arg(&path)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
