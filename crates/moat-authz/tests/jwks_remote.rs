//! JWKS fetched over real HTTP from a local server (127.0.0.1): initial fetch, key
//! rotation picked up by the background refresh, a server that goes down (keys kept),
//! a server down at start, OpenID discovery, and `file:` JWKS. Fetched through the small
//! `std::net` fetcher of `common::http_fetch` (the gateway's HTTP(S) client is tested in
//! moat-proxy's `tests/jwks_fetch.rs`).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http_fetch::StdHttpFetcher;
use common::*;
use jsonwebtoken::Algorithm;
use moat_authz::{AuthzConfig, AuthzEngine};

struct State {
    status: u16,
    body: String,
}

/// A JWKS server on 127.0.0.1: one thread, one connection at a time, `Connection:
/// close` responses; `/.well-known/openid-configuration` points at `/jwks`.
struct JwksServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    hits: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl JwksServer {
    fn start(body: String) -> JwksServer {
        let state = Arc::new(Mutex::new(State { status: 200, body }));
        let hits = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (st, h, stp) = (state.clone(), hits.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for sock in listener.incoming() {
                if stp.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(sock) = sock {
                    serve(sock, addr, &st, &h);
                }
            }
        });
        JwksServer {
            addr,
            state,
            hits,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, status: u16, body: String) {
        let mut s = self.state.lock().unwrap();
        s.status = status;
        s.body = body;
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Stops accepting and closes the port.
    fn shutdown(&mut self) {
        if let Some(t) = self.thread.take() {
            self.stop.store(true, Ordering::SeqCst);
            // Wake the blocking accept.
            let _ = TcpStream::connect(self.addr);
            let _ = t.join();
        }
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Reads one request head and answers it.
fn serve(mut sock: TcpStream, addr: SocketAddr, state: &Mutex<State>, hits: &AtomicUsize) {
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&b[..n]),
        }
    }
    hits.fetch_add(1, Ordering::SeqCst);
    let head = String::from_utf8_lossy(&head);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = if path == "/.well-known/openid-configuration" {
        (
            200,
            format!("{{\"issuer\":\"http://{addr}\",\"jwks_uri\":\"http://{addr}/jwks\"}}"),
        )
    } else {
        let s = state.lock().unwrap();
        (s.status, s.body.clone())
    };
    let _ = write!(
        sock,
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
}

const ISS: &str = "https://issuer.example.com";

fn ra_uri(uri: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: foo}}\nspec:\n  jwtRules:\n  - issuer: \"{ISS}\"\n    jwksUri: \"{uri}\"\n    timeout: 2s\n"
    )
}

fn fast_refresh() -> AuthzConfig {
    AuthzConfig {
        jwks_refresh_interval: Duration::from_millis(100),
        jwks_retry_interval: Duration::from_millis(100),
        ..Default::default()
    }
}

fn build(yaml: &str, cfg: AuthzConfig, background: bool) -> (Arc<AuthzEngine>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("ra.yaml");
    std::fs::write(&p, yaml).unwrap();
    let cfg = AuthzConfig {
        enabled: true,
        policies: vec![p],
        ..cfg
    };
    (
        AuthzEngine::build_with(&cfg, dir.path(), Arc::new(StdHttpFetcher), background).unwrap(),
        dir,
    )
}

/// Polls `f` until it holds (bounded: 20 s); returns whether it did.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[test]
fn rotation_is_picked_up_by_background_refresh() {
    let a = ec_key("a", Algorithm::ES256);
    let b = rsa_key(1, "b", Algorithm::RS256);
    let server = JwksServer::start(jwks(&[&a]));
    let (e, _d) = build(
        &ra_uri(&format!("http://{}/jwks", server.addr)),
        fast_refresh(),
        true,
    );
    assert_eq!(e.jwks_kids(), vec![vec!["a".to_string()]]);
    let ta = sign(&a, &claims(ISS, "alice"));
    let tb = sign(&b, &claims(ISS, "bob"));
    assert_eq!(req("/").jwt(&ta).status(&e), 200);
    assert_eq!(req("/").jwt(&tb).status(&e), 401, "kid b not published yet");
    server.set(200, jwks(&[&a, &b]));
    assert!(
        eventually(|| req("/").jwt(&tb).status(&e) == 200),
        "new kid never picked up"
    );
    assert!(server.hits() >= 2);
}

#[test]
fn keys_are_kept_when_the_server_goes_down() {
    let a = ec_key("a", Algorithm::ES256);
    let mut server = JwksServer::start(jwks(&[&a]));
    let (e, _d) = build(
        &ra_uri(&format!("http://{}/jwks", server.addr)),
        fast_refresh(),
        true,
    );
    assert_eq!(req("/").jwt(&sign(&a, &claims(ISS, "u0"))).status(&e), 200);
    server.set(503, "down".into());
    let before = server.hits();
    assert!(
        eventually(|| server.hits() >= before + 2),
        "refresh never retried"
    );
    // Fresh tokens (not cached) still verify with the kept keys.
    assert_eq!(req("/").jwt(&sign(&a, &claims(ISS, "u1"))).status(&e), 200);
    server.set(200, "{not json".into());
    let before = server.hits();
    assert!(eventually(|| server.hits() >= before + 2));
    assert_eq!(req("/").jwt(&sign(&a, &claims(ISS, "u2"))).status(&e), 200);
    server.shutdown();
    assert!(
        e.refresh_jwks().iter().all(|r| r.is_err()),
        "fetch from a closed port fails"
    );
    assert_eq!(req("/").jwt(&sign(&a, &claims(ISS, "u3"))).status(&e), 200);
    assert_eq!(e.jwks_kids(), vec![vec!["a".to_string()]]);
}

#[test]
fn server_down_at_start_then_recovers() {
    let a = ed_key("a");
    let server = JwksServer::start(String::new());
    server.set(500, "oops".into());
    let (e, _d) = build(
        &ra_uri(&format!("http://{}/jwks", server.addr)),
        AuthzConfig::default(),
        false,
    );
    let t = sign(&a, &claims(ISS, "alice"));
    let d = req("/").jwt(&t).eval(&e);
    assert_eq!(
        (d.status, d.reason.as_ref()),
        (401, "Jwks remote fetch is failed")
    );
    assert_eq!(req("/").status(&e), 200, "no token still passes");
    server.set(200, jwks(&[&a]));
    assert!(e.refresh_jwks().iter().all(|r| r.is_ok()));
    assert_eq!(req("/").jwt(&t).status(&e), 200);
}

#[test]
fn openid_discovery_from_issuer() {
    let a = rsa_key(2, "disc", Algorithm::PS256);
    let server = JwksServer::start(jwks(&[&a]));
    let iss = format!("http://{}", server.addr);
    let y = format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: foo}}\nspec:\n  jwtRules:\n  - issuer: \"{iss}\"\n"
    );
    let (e, _d) = build(&y, AuthzConfig::default(), false);
    let d = req("/").jwt(&sign(&a, &claims(&iss, "alice"))).eval(&e);
    assert_eq!(d.status, 200, "{}", d.reason);
    assert_eq!(d.request_principal, Some(format!("{iss}/alice")));
}

#[test]
fn jwks_from_a_file() {
    let a = ec_key("f1", Algorithm::ES384);
    let b = ec_key("f2", Algorithm::ES384);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keys.json"), jwks(&[&a])).unwrap();
    let y = ra_uri("file:keys.json");
    std::fs::write(dir.path().join("ra.yaml"), y).unwrap();
    let cfg = AuthzConfig {
        enabled: true,
        policies: vec!["ra.yaml".into()],
        ..Default::default()
    };
    let e =
        AuthzEngine::build_with(&cfg, dir.path(), Arc::new(moat_authz::NoFetch), false).unwrap();
    assert_eq!(req("/").jwt(&sign(&a, &claims(ISS, "x"))).status(&e), 200);
    let tb = sign(&b, &claims(ISS, "y"));
    assert_eq!(req("/").jwt(&tb).status(&e), 401);
    std::fs::write(dir.path().join("keys.json"), jwks(&[&a, &b])).unwrap();
    assert!(e.refresh_jwks().iter().all(|r| r.is_ok()));
    assert_eq!(req("/").jwt(&tb).status(&e), 200);
}
