//! `protocol: tcp` listeners through real loopback sockets: plain TCP, TLS termination
//! with real SPIFFE client certificates, TLS passthrough routed by SNI to two real TLS
//! upstreams; access control with Istio's TCP semantics (deny before any upstream
//! connect, HTTP-only fields in ALLOW and DENY rules, PeerAuthentication per port),
//! half-close, idle and maximum-duration timeouts on a paused clock, bytes in metrics
//! and event records, and a reload changing the policy for new connections only.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::gateway;
use moat_proxy::{GatewayOptions, RunningGateway, TcpAccessInfo};
use moat_tls::testing::TestPki;
use moat_tls::tokio_rustls::TlsConnector;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that reads until the client's half-close, then answers `TAG:` and the
/// bytes it read, and closes: it answers only when moat passed the half-close on and
/// kept the other direction open.
struct Upstream {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
}

async fn answer_after_eof<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, tag: &str) {
    let mut got = Vec::new();
    if s.read_to_end(&mut got).await.is_err() {
        return;
    }
    let mut reply = format!("{tag}:").into_bytes();
    reply.extend(got);
    let _ = s.write_all(&reply).await;
    let _ = s.shutdown().await;
}

async fn upstream(tag: &'static str) -> Upstream {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer_after_eof(s, tag));
        }
    });
    Upstream { addr, accepted }
}

/// A TLS upstream (the test server certificate, for `localhost` and `api.moat.test`)
/// answering like [`upstream`] inside TLS: the target of passthrough.
async fn tls_upstream(pki: &TestPki, tag: &'static str) -> Upstream {
    let mut cfg = pki.server_tls_config(moat_tls::ClientAuthMode::Disable);
    cfg.alpn.clear();
    let acceptor = moat_tls::TlsAcceptor::new(&cfg, &pki.dir).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let n = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            n.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(moat_tls::Accepted::Tls { stream, .. }) = acceptor.accept(s).await {
                    answer_after_eof(stream, tag).await;
                }
            });
        }
    });
    Upstream { addr, accepted }
}

/// Sends `msg`, half-closes, and reads to the end; `None` when the connection was closed
/// or reset without an answer.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, msg: &[u8]) -> Option<Vec<u8>> {
    let _ = s.write_all(msg).await;
    let _ = s.shutdown().await;
    let mut got = Vec::new();
    match s.read_to_end(&mut got).await {
        Ok(_) if !got.is_empty() => Some(got),
        _ => None,
    }
}

async fn plain(addr: SocketAddr, msg: &[u8]) -> Option<Vec<u8>> {
    exchange(TcpStream::connect(addr).await.unwrap(), msg).await
}

/// Over TLS to `addr` with `sni`, with or without the client certificate.
async fn tls(
    pki: &TestPki,
    addr: SocketAddr,
    sni: &str,
    cert: bool,
    msg: &[u8],
) -> Option<Vec<u8>> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let connector = TlsConnector::from(pki.client_config(cert, &[]));
    let s = connector
        .connect(ServerName::try_from(sni.to_string()).unwrap(), tcp)
        .await
        .ok()?;
    exchange(s, msg).await
}

/// One tcp record, owned.
#[derive(Debug, Clone)]
struct Rec {
    listener: String,
    tls: &'static str,
    sni: Option<String>,
    principal: Option<String>,
    cluster: Option<String>,
    decision: &'static str,
    rule: Option<String>,
    reason: String,
    bytes_in: u64,
    bytes_out: u64,
}

#[derive(Default)]
struct Sink {
    tcp: parking_lot::Mutex<Vec<Rec>>,
}

impl Sink {
    /// The records of a listener (waits a little: a record is written when the
    /// connection's task ends, just after the client saw the close).
    async fn of(&self, listener: &str, n: usize) -> Vec<Rec> {
        for _ in 0..200 {
            let v: Vec<Rec> = self
                .tcp
                .lock()
                .iter()
                .filter(|r| r.listener == listener)
                .cloned()
                .collect();
            if v.len() >= n {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "fewer than {n} records for {listener}: {:?}",
            self.tcp.lock()
        );
    }
}

impl moat_proxy::EventSink for Sink {
    fn access(&self, _info: &moat_proxy::AccessInfo<'_>) -> bool {
        true
    }
    fn security(
        &self,
        _ctx: &moat_core::RequestCtx,
        _e: &moat_core::SecurityEvent,
        _m: &http::Method,
        _p: &str,
    ) -> bool {
        true
    }
    fn tls(&self, _c: &moat_core::Connection, _h: &moat_core::HandshakeRecord) -> bool {
        true
    }
    fn tcp(&self, i: &TcpAccessInfo<'_>) -> bool {
        self.tcp.lock().push(Rec {
            listener: i.listener.to_string(),
            tls: i.tls,
            sni: i.sni.map(str::to_string),
            principal: i
                .conn
                .tls
                .as_ref()
                .and_then(|t| t.peer.as_ref())
                .and_then(|p| p.principal.clone()),
            cluster: i.cluster.map(str::to_string),
            decision: i.decision,
            rule: i.rule.map(str::to_string),
            reason: i.reason.to_string(),
            bytes_in: i.bytes_in,
            bytes_out: i.bytes_out,
        });
        true
    }
}

struct Setup {
    gw: RunningGateway,
    sink: Arc<Sink>,
    pki: TestPki,
    dir: tempfile::TempDir,
}

impl Setup {
    fn addr(&self, listener: &str) -> SocketAddr {
        self.gw.listener_addr(listener).unwrap()
    }
}

fn write_policies(dir: &Path, text: &str) {
    let p = dir.join("policies");
    let _ = std::fs::create_dir(&p);
    std::fs::write(p.join("p.yaml"), text).unwrap();
}

/// A gateway from `yaml` (and `policies`, under `policies/`) with the test PKI in its
/// directory and a collecting event sink.
async fn setup(yaml: &str, policies: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    write_policies(dir.path(), policies);
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    let gw = gateway(dir.path(), yaml, opts).await;
    Setup { gw, sink, pki, dir }
}

const NO_POLICY: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: none, namespace: elsewhere}\nspec: {selector: {matchLabels: {app: nothing}}, action: AUDIT, rules: [{}]}\n";

fn metric(gw: &RunningGateway, line: &str) -> u64 {
    let text = gw.shared().metrics.render();
    text.lines()
        .find_map(|l| l.strip_prefix(line).map(|v| v.trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("no `{line}` in\n{text}"))
}

#[tokio::test]
async fn plain_tcp_is_proxied_with_half_close_and_counted() {
    let up = upstream("up").await;
    let yaml = format!(
        r#"listeners:
  - {{ name: db, address: 127.0.0.1:0, protocol: tcp, cluster: db }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: db, endpoints: ["{}"], labels: {{ app: db }}, namespace: data }}
authz: {{ enabled: true, policies: [policies/] }}
"#,
        up.addr
    );
    let s = setup(&yaml, NO_POLICY).await;
    let big = vec![7u8; 300_000];
    let got = plain(s.addr("db"), &big).await.unwrap();
    assert_eq!(&got[..3], b"up:");
    assert_eq!(&got[3..], &big[..]);
    let recs = s.sink.of("db", 1).await;
    let r = &recs[0];
    assert_eq!(
        (r.decision, r.tls, r.reason.as_str()),
        ("allow", "plain", "closed")
    );
    assert_eq!(r.cluster.as_deref(), Some("db"));
    assert_eq!((r.bytes_in, r.bytes_out), (300_000, 300_003));
    assert_eq!(
        metric(
            &s.gw,
            "moat_tcp_bytes_total{listener=\"db\",direction=\"in\"}"
        ),
        300_000
    );
    assert_eq!(
        metric(
            &s.gw,
            "moat_tcp_bytes_total{listener=\"db\",direction=\"out\"}"
        ),
        300_003
    );
    assert_eq!(
        metric(
            &s.gw,
            "moat_tcp_connections_total{listener=\"db\",result=\"allow\"}"
        ),
        1
    );
}

#[tokio::test]
async fn denied_connections_close_before_any_upstream_connect() {
    let up = upstream("up").await;
    let yaml = format!(
        r#"listeners:
  - {{ name: db, address: 127.0.0.1:0, protocol: tcp, cluster: db }}
  - {{ name: open, address: 127.0.0.1:0, protocol: tcp, cluster: open }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: db, endpoints: ["{a}"], labels: {{ app: db }}, namespace: data }}
  - {{ name: open, endpoints: ["{a}"], labels: {{ app: open }}, namespace: data }}
authz: {{ enabled: true, policies: [policies/] }}
"#,
        a = up.addr
    );
    let policy = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-loopback, namespace: data}
spec:
  selector: {matchLabels: {app: db}}
  action: DENY
  rules:
  - from: [{source: {ipBlocks: ["127.0.0.0/8"]}}]
"#;
    let s = setup(&yaml, policy).await;
    assert_eq!(plain(s.addr("db"), b"hello").await, None);
    let r = &s.sink.of("db", 1).await[0];
    assert_eq!(r.decision, "block");
    assert_eq!(r.rule.as_deref(), Some("data/no-loopback[rule 0]"));
    assert_eq!((r.bytes_in, r.bytes_out), (0, 0));
    assert_eq!(
        up.accepted.load(Ordering::SeqCst),
        0,
        "the upstream was connected to"
    );
    // The other workload is not selected by the policy.
    assert_eq!(
        plain(s.addr("open"), b"hi").await.as_deref(),
        Some(&b"up:hi"[..])
    );
    assert_eq!(up.accepted.load(Ordering::SeqCst), 1);
    assert_eq!(
        metric(
            &s.gw,
            "moat_tcp_connections_total{listener=\"db\",result=\"deny\"}"
        ),
        1
    );
}

#[tokio::test]
async fn http_only_fields_follow_istio_tcp_semantics() {
    let up = upstream("up").await;
    let listeners = ["allow-http", "allow-mixed", "deny-http", "deny-port"];
    let mut yaml = String::from("listeners:\n");
    for l in listeners {
        yaml +=
            &format!("  - {{ name: {l}, address: 127.0.0.1:0, protocol: tcp, cluster: {l} }}\n");
    }
    yaml += "admin: { address: 127.0.0.1:0 }\nclusters:\n";
    for l in listeners {
        yaml += &format!(
            "  - {{ name: {l}, endpoints: [\"{}\"], labels: {{ app: {l} }}, namespace: data }}\n",
            up.addr
        );
    }
    yaml += "authz: { enabled: true, policies: [policies/] }\n";
    let policies = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-get, namespace: data}
spec:
  selector: {matchLabels: {app: allow-http}}
  action: ALLOW
  rules:
  - to: [{operation: {methods: ["GET"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: allow-mixed, namespace: data}
spec:
  selector: {matchLabels: {app: allow-mixed}}
  action: ALLOW
  rules:
  - from: [{source: {ipBlocks: ["127.0.0.1/32"]}}]
    to: [{operation: {paths: ["/x"]}}]
  - from: [{source: {ipBlocks: ["127.0.0.1/32"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-get, namespace: data}
spec:
  selector: {matchLabels: {app: deny-http}}
  action: DENY
  rules:
  - to: [{operation: {methods: ["GET"]}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-other-port, namespace: data}
spec:
  selector: {matchLabels: {app: deny-port}}
  action: DENY
  rules:
  - to: [{operation: {ports: ["1"], paths: ["/admin"]}}]
"#;
    let s = setup(&yaml, policies).await;
    // An ALLOW rule with an HTTP-only field never matches: no ALLOW match, closed.
    assert_eq!(plain(s.addr("allow-http"), b"x").await, None);
    let r = &s.sink.of("allow-http", 1).await[0];
    assert_eq!(r.decision, "block");
    assert!(r.reason.contains("HTTP-only"), "{}", r.reason);
    // The rule without one still allows.
    assert_eq!(
        plain(s.addr("allow-mixed"), b"x").await.as_deref(),
        Some(&b"up:x"[..])
    );
    assert_eq!(
        s.sink.of("allow-mixed", 1).await[0].rule.as_deref(),
        Some("data/allow-mixed[rule 1]")
    );
    // A DENY rule made only of HTTP fields loses them and denies every connection.
    assert_eq!(plain(s.addr("deny-http"), b"x").await, None);
    assert_eq!(
        s.sink.of("deny-http", 1).await[0].rule.as_deref(),
        Some("data/deny-get[rule 0]")
    );
    // A DENY rule keeps its TCP conditions: another port is not denied.
    assert_eq!(
        plain(s.addr("deny-port"), b"x").await.as_deref(),
        Some(&b"up:x"[..])
    );
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

/// A port free at the time of the call (the listener config needs it in advance, for
/// `portLevelMtls`).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn peer_authentication_per_port_and_spiffe_principal() {
    let up = upstream("up").await;
    let (strict, permissive, disable) = (free_port(), free_port(), free_port());
    let tls_cfg = "tls: { certificates: [{ cert: server.crt, key: server.key }], alpn: [], client_auth: { mode: PERMISSIVE, ca: ca.crt } }";
    let yaml = format!(
        r#"listeners:
  - {{ name: strict, address: "127.0.0.1:{strict}", protocol: tcp, cluster: mesh, {tls_cfg} }}
  - {{ name: permissive, address: "127.0.0.1:{permissive}", protocol: tcp, cluster: mesh, {tls_cfg} }}
  - {{ name: disable, address: "127.0.0.1:{disable}", protocol: tcp, cluster: mesh, {tls_cfg} }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: mesh, endpoints: ["{}"], labels: {{ app: mesh }}, namespace: shop }}
authz: {{ enabled: true, policies: [policies/] }}
"#,
        up.addr
    );
    let policies = format!(
        r#"apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: mesh, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: mesh}}}}
  mtls: {{mode: PERMISSIVE}}
  portLevelMtls:
    {strict}: {{mode: STRICT}}
    {disable}: {{mode: DISABLE}}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: frontend-only, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: mesh}}}}
  action: ALLOW
  rules:
  - from: [{{source: {{principals: ["cluster.local/ns/shop/sa/frontend"], namespaces: ["shop"]}}}}]
"#
    );
    let s = setup(&yaml, &policies).await;
    let pki = &s.pki;
    let ok = Some(&b"up:m"[..]);
    // STRICT: the certificate's SPIFFE identity is allowed; TLS without a certificate
    // and plaintext are closed by PeerAuthentication, before the ALLOW policy.
    assert_eq!(
        tls(pki, s.addr("strict"), "localhost", true, b"m")
            .await
            .as_deref(),
        ok
    );
    assert_eq!(
        tls(pki, s.addr("strict"), "localhost", false, b"m").await,
        None
    );
    assert_eq!(plain(s.addr("strict"), b"m").await, None);
    let recs = s.sink.of("strict", 3).await;
    assert_eq!(
        recs[0].principal.as_deref(),
        Some("cluster.local/ns/shop/sa/frontend")
    );
    assert_eq!((recs[0].tls, recs[0].decision), ("terminate", "allow"));
    for r in &recs[1..] {
        assert_eq!(r.decision, "block");
        assert!(r.reason.starts_with("mTLS required"), "{}", r.reason);
    }
    // PERMISSIVE: plaintext is let through TLS detection, then the ALLOW policy closes it.
    assert_eq!(
        tls(pki, s.addr("permissive"), "localhost", true, b"m")
            .await
            .as_deref(),
        ok
    );
    assert_eq!(plain(s.addr("permissive"), b"m").await, None);
    let recs = s.sink.of("permissive", 2).await;
    assert_eq!((recs[1].tls, recs[1].decision), ("plain", "block"));
    assert!(recs[1].reason.contains("ALLOW"), "{}", recs[1].reason);
    // DISABLE: the certificate is ignored, so the principal rule does not match.
    assert_eq!(
        tls(pki, s.addr("disable"), "localhost", true, b"m").await,
        None
    );
    let r = &s.sink.of("disable", 1).await[0];
    assert_eq!(r.decision, "block");
    assert_eq!(up.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn sni_passthrough_routes_to_two_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let (a, b) = (tls_upstream(&pki, "A").await, tls_upstream(&pki, "B").await);
    let yaml = format!(
        r#"listeners:
  - name: edge
    address: 127.0.0.1:0
    protocol: tcp
    sni_routes: {{ "localhost": a, "*.moat.test": b }}
  - name: edge-default
    address: 127.0.0.1:0
    protocol: tcp
    sni_routes: {{ "localhost": a }}
    cluster: b
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: a, endpoints: ["{}"], labels: {{ app: a }} }}
  - {{ name: b, endpoints: ["{}"], labels: {{ app: b }} }}
authz: {{ enabled: true, policies: [policies/] }}
"#,
        a.addr, b.addr
    );
    let policy = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: sni, namespace: default}
spec:
  selector: {matchLabels: {app: b}}
  action: ALLOW
  rules:
  - when: [{key: connection.sni, values: ["*.moat.test"]}]
"#;
    let s = setup(&yaml, policy).await;
    // The client verifies the upstream's certificate end to end: moat did not terminate.
    let edge = s.addr("edge");
    assert_eq!(
        tls(&pki, edge, "localhost", false, b"1").await.as_deref(),
        Some(&b"A:1"[..])
    );
    assert_eq!(
        tls(&pki, edge, "api.moat.test", false, b"2")
            .await
            .as_deref(),
        Some(&b"B:2"[..])
    );
    assert_eq!(
        (
            a.accepted.load(Ordering::SeqCst),
            b.accepted.load(Ordering::SeqCst)
        ),
        (1, 1)
    );
    // No route for the name and no default cluster; not TLS at all: closed.
    assert_eq!(tls(&pki, edge, "other.test", false, b"3").await, None);
    assert_eq!(plain(edge, b"GET / HTTP/1.1\r\n\r\n").await, None);
    let recs = s.sink.of("edge", 4).await;
    assert_eq!(recs[1].sni.as_deref(), Some("api.moat.test"));
    assert_eq!(
        (recs[1].tls, recs[1].cluster.as_deref()),
        ("passthrough", Some("b"))
    );
    assert!(
        recs[1].bytes_in > 100,
        "the ClientHello is counted: {:?}",
        recs[1]
    );
    assert!(recs[2].reason.contains("other.test"), "{:?}", recs[2]);
    assert_eq!(recs[3].reason, "not a TLS ClientHello");
    // With a default cluster, an unmatched name goes there, and `connection.sni` is
    // seen by policies: b only allows `*.moat.test`.
    let edge2 = s.addr("edge-default");
    assert_eq!(
        tls(&pki, edge2, "api.moat.test", false, b"4")
            .await
            .as_deref(),
        Some(&b"B:4"[..])
    );
    assert_eq!(tls(&pki, edge2, "127.0.0.1", false, b"5").await, None);
    let recs = s.sink.of("edge-default", 2).await;
    assert_eq!((recs[1].decision, recs[1].sni.as_deref()), ("block", None));
    assert_eq!(b.accepted.load(Ordering::SeqCst), 2);
    drop(dir);
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_and_max_duration_on_a_paused_clock() {
    // An upstream that echoes as it reads.
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let yaml = format!(
        r#"listeners:
  - {{ name: idle, address: 127.0.0.1:0, protocol: tcp, cluster: echo, idle_timeout: 10s }}
  - {{ name: max, address: 127.0.0.1:0, protocol: tcp, cluster: echo, idle_timeout: 0s, max_duration: 30s }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: echo, endpoints: ["{up}"] }}
"#
    );
    let s = setup(&yaml, NO_POLICY).await;
    let mut c = TcpStream::connect(s.addr("idle")).await.unwrap();
    let mut buf = [0u8; 4];
    // Activity every 8 s keeps it open past the 10 s idle timeout...
    for _ in 0..4 {
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_secs(8)).await;
    }
    // ...and 10 s of silence closes it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        c.read(&mut buf).await.unwrap_or(0),
        0,
        "an idle connection was kept open"
    );
    let r = &s.sink.of("idle", 1).await[0];
    assert_eq!(
        (r.reason.as_str(), r.bytes_in, r.bytes_out),
        ("idle_timeout", 16, 16)
    );

    // max_duration closes a busy connection; idle_timeout 0s never closes one.
    let mut c = TcpStream::connect(s.addr("max")).await.unwrap();
    for _ in 0..25 {
        c.write_all(b"ping").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        c.read(&mut buf).await.unwrap_or(0),
        0,
        "max_duration did not close it"
    );
    assert_eq!(s.sink.of("max", 1).await[0].reason, "max_duration");
}

#[tokio::test]
async fn reload_changes_the_policy_for_new_connections() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let yaml = format!(
        r#"listeners:
  - {{ name: db, address: 127.0.0.1:0, protocol: tcp, cluster: db }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: db, endpoints: ["{up}"], labels: {{ app: db }}, namespace: data }}
authz: {{ enabled: true, policies: [policies/] }}
"#
    );
    let s = setup(&yaml, NO_POLICY).await;
    let mut before = TcpStream::connect(s.addr("db")).await.unwrap();
    let mut buf = [0u8; 3];
    before.write_all(b"one").await.unwrap();
    before.read_exact(&mut buf).await.unwrap();
    write_policies(
        s.dir.path(),
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: lock, namespace: data}\nspec: {action: DENY, rules: [{}]}\n",
    );
    s.gw.shared().reload_from_file().unwrap();
    // New connections are closed; the one opened before keeps its decision.
    let mut after = TcpStream::connect(s.addr("db")).await.unwrap();
    let _ = after.write_all(b"two").await;
    assert_eq!(after.read(&mut buf).await.unwrap_or(0), 0);
    before.write_all(b"thr").await.unwrap();
    before.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"thr");
    let recs = s.sink.of("db", 1).await;
    assert_eq!(recs[0].rule.as_deref(), Some("data/lock[rule 0]"));
}

#[test]
fn tcp_listener_config_is_checked() {
    let src = moat_proxy::ConfigSource {
        file: "moat.yaml".into(),
        base_dir: ".".into(),
    };
    let base = "admin: { address: 127.0.0.1:0 }\nclusters:\n  - { name: c, endpoints: [\"127.0.0.1:1\"] }\n  - { name: t, endpoints: [\"127.0.0.1:1\"], tls: {} }\n";
    for (listener, field, what) in [
        ("{ name: l, address: 127.0.0.1:0, protocol: tcp }", "listeners[0].cluster", "needs `cluster` or `sni_routes`"),
        ("{ name: l, address: 127.0.0.1:0, cluster: c }", "listeners[0].cluster", "only for `protocol: tcp`"),
        ("{ name: l, address: 127.0.0.1:0, idle_timeout: 1s }", "listeners[0].idle_timeout", "only for `protocol: tcp`"),
        ("{ name: l, address: 127.0.0.1:0, protocol: tcp, cluster: nope }", "listeners[0].cluster", "unknown cluster `nope`"),
        ("{ name: l, address: 127.0.0.1:0, protocol: tcp, cluster: t }", "listeners[0].cluster", "does not originate TLS"),
        ("{ name: l, address: 127.0.0.1:0, protocol: tcp, sni_routes: { \"a*b\": c } }", "listeners[0].sni_routes", "`a*b`"),
        ("{ name: l, address: 127.0.0.1:0, protocol: tcp, cluster: c, xff_trusted_hops: 1 }", "listeners[0].xff_trusted_hops", "only for HTTP"),
        ("{ name: l, address: 127.0.0.1:0, protocol: tcp, sni_routes: { a: c }, tls: { certificates: [] } }", "listeners[0].sni_routes", "exclude each other"),
    ] {
        let text = format!("listeners:\n  - {listener}\n{base}");
        let e = moat_proxy::config::parse(&src, &text).unwrap_err();
        assert_eq!(e.field, field, "{e}");
        assert!(e.to_string().contains(what), "{e}");
    }
    let ok = moat_proxy::config::parse(
        &src,
        &format!("listeners:\n  - {{ name: l, address: 127.0.0.1:0, protocol: tcp, sni_routes: {{ \"*.a\": c }}, cluster: c, max_duration: 1h }}\n{base}"),
    )
    .unwrap();
    assert_eq!(
        ok.listeners[0].max_duration,
        Some(Duration::from_secs(3600))
    );
}

#[tokio::test(start_paused = true)]
async fn failures_are_errors_in_metrics_and_records() {
    let closed = free_port();
    let yaml = format!(
        r#"listeners:
  - {{ name: down, address: 127.0.0.1:0, protocol: tcp, cluster: down }}
  - {{ name: edge, address: 127.0.0.1:0, protocol: tcp, sni_routes: {{ "*": down }} }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: down, endpoints: ["127.0.0.1:{closed}"] }}
"#
    );
    let s = setup(&yaml, NO_POLICY).await;
    // Nothing listens on the endpoint: the client's connection is closed.
    assert_eq!(plain(s.addr("down"), b"x").await, None);
    let r = &s.sink.of("down", 1).await[0];
    assert_eq!(r.decision, "error");
    assert!(
        r.reason
            .starts_with(&format!("upstream 127.0.0.1:{closed}")),
        "{}",
        r.reason
    );
    assert_eq!(
        metric(
            &s.gw,
            "moat_tcp_connections_total{listener=\"down\",result=\"error\"}"
        ),
        1
    );
    assert_eq!(
        metric(
            &s.gw,
            "moat_upstream_errors_total{cluster=\"down\",kind=\"connect\"}"
        ),
        1
    );
    // A passthrough client that sends no ClientHello is closed after 10 s.
    let mut c = TcpStream::connect(s.addr("edge")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await;
    let mut buf = [0u8; 1];
    assert_eq!(c.read(&mut buf).await.unwrap_or(0), 0);
    let r = &s.sink.of("edge", 1).await[0];
    assert_eq!(
        (r.decision, r.tls, r.reason.as_str()),
        ("error", "passthrough", "no complete ClientHello in time")
    );
}
