//! Every example under examples/ passes `moat check-config` once the files its
//! comments tell you to make exist (`moat certs`), the JWT example runs as written
//! (with `--listen`/`--admin` on free ports), and the quickstart's suggested
//! commands find its data.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

fn moat() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moat"));
    c.env_remove("MOAT_DATA_DIR").env_remove("MOAT_ADMIN_TOKEN");
    c
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dest = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dest);
        } else {
            std::fs::copy(e.path(), dest).unwrap();
        }
    }
}

/// A copy of examples/ with the certificates and keys the examples' comments make.
fn prepared_examples() -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let ex = d.path().join("examples");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples"),
        &ex,
    );
    ok(&moat()
        .args(["certs", "--out"])
        .arg(ex.join("tls/certs"))
        .output()
        .unwrap());
    ok(&moat()
        .args([
            "certs",
            "--jwt-issuer",
            "https://issuer.example.com",
            "--out",
        ])
        .arg(ex.join("jwt-api/keys"))
        .output()
        .unwrap());
    (d, ex)
}

fn config_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "istio") {
                config_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "yaml") {
            out.push(p);
        }
    }
}

#[test]
fn every_example_passes_check_config() {
    let (_d, ex) = prepared_examples();
    let mut files = Vec::new();
    config_files(&ex, &mut files);
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(&ex).unwrap().display().to_string())
        .collect();
    for want in [
        "quickstart.yaml",
        "tls/moat.yaml",
        "jwt-api/moat.yaml",
        "kubernetes/moat.yaml",
        "ratelimit/moat.yaml",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    for f in &files {
        let out = moat()
            .arg("check-config")
            .arg(f)
            .env("MOAT_ADMIN_TOKEN", "t0ken-from-a-secret")
            .output()
            .unwrap();
        ok(&out);
    }
    // The Kubernetes example's admin token is not in the file: without the
    // variable the config is refused, naming the line and the variable.
    let out = moat()
        .arg("check-config")
        .arg(ex.join("kubernetes/moat.yaml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kubernetes/moat.yaml:") && err.contains("`MOAT_ADMIN_TOKEN` is not set"),
        "{err}"
    );
}

fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn upstream() -> SocketAddr {
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
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\nconnection: close\r\n\r\nupstream",
                );
            });
        }
    });
    addr
}

fn get(addr: SocketAddr, path: &str, header: &str) -> String {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: t\r\n{header}connection: close\r\n\r\n").as_bytes(),
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_ready(admin: SocketAddr, proc: &mut Proc) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !get(admin, "/readyz", "").starts_with("HTTP/1.1 200") {
        if let Some(st) = proc.0.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = proc.0.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("moat exited ({st}): {err}");
        }
        assert!(Instant::now() < deadline, "moat did not become ready");
        thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn jwt_example_runs_as_written_on_the_addresses_given() {
    let (_d, ex) = prepared_examples();
    let up = upstream();
    let cfg = ex.join("jwt-api/moat.yaml");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("127.0.0.1:8081", &up.to_string());
    std::fs::write(&cfg, text).unwrap();
    let (listen, admin) = (free_port(), free_port());
    let child = moat()
        .args(["serve", "--log-format", "text", "--config"])
        .arg(&cfg)
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--admin")
        .arg(admin.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut proc = Proc(child);
    wait_ready(admin, &mut proc);
    let token = std::fs::read_to_string(ex.join("jwt-api/keys/token.jwt")).unwrap();
    let denied = get(listen, "/api/orders", "");
    assert!(denied.starts_with("HTTP/1.1 403"), "{denied}");
    let allowed = get(
        listen,
        "/api/orders",
        &format!("authorization: Bearer {}\r\n", token.trim()),
    );
    assert!(
        allowed.starts_with("HTTP/1.1 200") && allowed.ends_with("upstream"),
        "{allowed}"
    );
}

#[test]
fn quickstart_prints_quoted_urls_and_its_data_is_found() {
    let d = tempfile::tempdir().unwrap();
    let (listen, admin) = (free_port(), free_port());
    let child = moat()
        .current_dir(d.path())
        .args(["serve", "--log-format", "text", "--threads", "1"])
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--admin")
        .arg(admin.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut proc = Proc(child);
    wait_ready(admin, &mut proc);
    // A request the WAF blocks, so the event store has a row.
    let blocked = get(listen, "/search?q=1%27%20OR%20%271%27=%271", "");
    assert!(blocked.starts_with("HTTP/1.1 403"), "{blocked}");
    let _ = get(listen, "/api/users/42", "");
    // SIGTERM: the event writer flushes on the way out. Then the printed text: every
    // URL quoted, the data directory named.
    let pid = proc.0.id().to_string();
    let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(st.success());
    let _ = proc.0.wait();
    let mut printed = String::new();
    if let Some(mut o) = proc.0.stdout.take() {
        o.read_to_string(&mut printed).unwrap();
    }
    assert!(
        printed.contains(&format!("on {listen}, admin API on {admin}")),
        "{printed}"
    );
    assert!(printed.contains("moat-quickstart/"), "{printed}");
    for line in printed.lines().filter(|l| l.contains("http://")) {
        assert!(line.contains("'http://"), "unquoted URL: {line}");
    }
    assert!(printed.contains(&format!("'http://{admin}/v1/events?since=10m'")));
    // `moat events` and `moat apis` run from the same directory find the data.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = moat()
            .current_dir(d.path())
            .args(["events", "--json"])
            .output()
            .unwrap();
        let text = ok(&out);
        if text.contains("waf") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no WAF event in the store: {text}"
        );
        thread::sleep(Duration::from_millis(200));
    }
    let apis = moat()
        .current_dir(d.path())
        .args(["apis", "list"])
        .output()
        .unwrap();
    ok(&apis);
    // Elsewhere, the error names the paths tried.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = moat()
        .current_dir(elsewhere.path())
        .arg("events")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("moat-quickstart/moat-events.db"));
}
