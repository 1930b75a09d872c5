//! Proxying behaviour through real sockets on loopback.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use moat_proxy::GatewayOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_get_post_and_chunked_bodies() {
    let g = basic_gateway().await;
    let (gw, addr) = (g.gw, g.addr);
    let c = client();

    let (status, headers, body) = get(&c, &format!("http://{addr}/hello?x=1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-upstream"], "a");
    let v = json(&body);
    assert_eq!(v["method"], "GET");
    assert_eq!(v["uri"], "/hello?x=1");
    assert_eq!(v["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(v["headers"]["x-forwarded-proto"], "http");
    assert_eq!(v["headers"]["host"], addr.to_string());
    assert_eq!(v["headers"]["x-request-id"].as_str().unwrap().len(), 32);

    // POST with content-length, an incoming request id and hop-by-hop headers. A field
    // `Connection` names is forwarded as inspected (nominations are not honoured, see
    // docs/SECURITY.md); the standard hop-by-hop fields are dropped.
    let req = Request::post(format!("http://{addr}/submit"))
        .header("x-request-id", "abc-123")
        .header("x-forwarded-for", "203.0.113.9")
        .header("connection", "x-hop")
        .header("x-hop", "inspected-and-forwarded")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"hello body")))
        .unwrap();
    let (status, _, body) = send(&c, req).await;
    assert_eq!(status, StatusCode::OK);
    let v = json(&body);
    assert_eq!(v["body"], "hello body");
    assert_eq!(v["headers"]["content-length"], "10");
    assert_eq!(v["headers"]["x-request-id"], "abc-123");
    assert_eq!(v["headers"]["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(v["headers"]["x-hop"], "inspected-and-forwarded", "{v}");
    assert!(v["headers"].get("te").is_none(), "{v}");

    // Chunked request body.
    let resp = raw(
        addr,
        b"POST /chunked HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains(r#""body":"hello world""#), "{resp}");
    assert!(resp.contains(r#""body_len":11"#), "{resp}");

    // A large streamed response arrives intact.
    let (status, _, body) = get(&c, &format!("http://{addr}/big?n=300000")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), 300000);
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_reuses_upstream_connections() {
    let g = basic_gateway().await;
    let (gw, addr) = (g.gw, g.addr);
    let c = client();
    for i in 0..30 {
        let (status, _, _) = get(&c, &format!("http://{addr}/r{i}")).await;
        assert_eq!(status, StatusCode::OK);
    }
    // Also from separate downstream connections: the upstream pool is shared.
    for i in 0..5 {
        let resp = raw(
            addr,
            format!("GET /c{i} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    }
    assert_eq!(
        g.up.connections(),
        1,
        "sequential requests must reuse one upstream connection"
    );
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_connections_leave_no_tasks_behind() {
    // Every downstream connection's state (its task, its idle watchdog) must go away
    // when it closes: a watchdog that outlived its connection by a 10 s tick once held
    // every finished connection's memory, gigabytes under short-connection load.
    let g = basic_gateway().await;
    let (gw, addr) = (g.gw, g.addr);
    let close = b"GET /x HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n";
    // Warm up: the upstream connection is pooled, its task exists from now on.
    assert!(raw(addr, close).await.starts_with("HTTP/1.1 200"));
    let metrics = tokio::runtime::Handle::current().metrics();
    let settle = |base: usize| async move {
        for _ in 0..500 {
            if metrics.num_alive_tasks() <= base {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    };
    let base = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    for _ in 0..50 {
        assert!(raw(addr, close).await.starts_with("HTTP/1.1 200"));
    }
    assert!(
        settle(base).await,
        "tasks still alive after 50 closed connections: {} (before: {base})",
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    );
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_is_502_and_slow_is_504() {
    // A port with nothing listening.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: dead
    endpoints: ["{dead}"]
  - name: app
    endpoints: ["{}"]
    request_timeout: 300ms
routes:
  - name: down
    path_prefix: /down
    cluster: dead
  - name: all
    cluster: app
"#,
        up.addr
    );
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();

    let req = Request::get(format!("http://{addr}/down"))
        .header("accept", "application/json")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, body) = send(&c, req).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let v = json(&body);
    assert_eq!(v["status"], 502);
    assert_eq!(v["request_id"], headers["x-request-id"].to_str().unwrap());

    let req = Request::get(format!("http://{addr}/slow?ms=3000"))
        .header("accept", "text/html")
        .header("x-request-id", "slow-1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, headers, body) = send(&c, req).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(headers["x-request-id"], "slow-1");
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(String::from_utf8_lossy(&body).contains("slow-1"));

    let (_, _, metrics) = get(&c, &format!("http://{}/metrics", gw.admin_addr())).await;
    let m = String::from_utf8_lossy(&metrics);
    assert!(
        m.contains(r#"moat_requests_total{route="down",status="502",decision="error"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"moat_requests_total{route="all",status="504",decision="error"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"moat_upstream_errors_total{cluster="dead",kind="connect"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"moat_upstream_errors_total{cluster="app",kind="timeout"} 1"#),
        "{m}"
    );
    gw.shutdown(Duration::from_secs(5)).await;
}

/// A config with cluster `app` over endpoints `a` and `b` (round robin) with
/// `ejection: { <ejection>duration: 1m }`, and one catch-all route.
fn two_endpoints(a: SocketAddr, b: SocketAddr, ejection: &str) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{a}", "{b}"]
    ejection: {{ {ejection}duration: 1m }}
routes:
  - name: all
    cluster: app
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_ejection_skips_a_dead_endpoint() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let up = upstream("live").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = two_endpoints(dead, up.addr, "consecutive_failures: 2, ");
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let mut failures = 0;
    for _ in 0..6 {
        let (status, _, _) = get(&c, &format!("http://{addr}/")).await;
        if status == StatusCode::BAD_GATEWAY {
            failures += 1;
        }
    }
    assert_eq!(failures, 2, "the dead endpoint is ejected after 2 failures");
    for _ in 0..10 {
        let (status, _, _) = get(&c, &format!("http://{addr}/")).await;
        assert_eq!(status, StatusCode::OK);
    }
    let (_, _, metrics) = get(&c, &format!("http://{}/metrics", gw.admin_addr())).await;
    assert!(String::from_utf8_lossy(&metrics)
        .contains(r#"moat_upstream_ejections_total{cluster="app"} 1"#));
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passive_ejection_on_consecutive_5xx_when_enabled() {
    let sick = upstream("sick").await;
    let well = upstream("well").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = two_endpoints(sick.addr, well.addr, "consecutive_5xx: 2, ");
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let mut errors = 0;
    // Round robin: sick, well, sick (its second 5xx in a row: ejected), then well only.
    for _ in 0..12 {
        let (status, headers, _) = get(&c, &format!("http://{addr}/flaky")).await;
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            errors += 1;
            assert_eq!(headers["x-upstream"], "sick");
        }
    }
    assert_eq!(errors, 2, "the endpoint answering 500 is ejected after 2");
    let (_, _, metrics) = get(&c, &format!("http://{}/metrics", gw.admin_addr())).await;
    assert!(String::from_utf8_lossy(&metrics)
        .contains(r#"moat_upstream_ejections_total{cluster="app"} 1"#));
    gw.shutdown(Duration::from_secs(5)).await;

    // Off by default: 5xx responses do not eject.
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(
        dir.path(),
        &two_endpoints(sick.addr, well.addr, ""),
        GatewayOptions::default(),
    )
    .await;
    let addr = gw.listener_addr("main").unwrap();
    let mut errors = 0;
    for _ in 0..12 {
        let (status, _, _) = get(&c, &format!("http://{addr}/flaky")).await;
        errors += usize::from(status == StatusCode::INTERNAL_SERVER_ERROR);
    }
    assert_eq!(errors, 6);
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_headers_431_and_bodies_413() {
    let g = basic_gateway().await;
    let (gw, addr) = (g.gw, g.addr);
    let c = client();

    // Head larger than max_header_bytes (8KiB).
    let req = Request::get(format!("http://{addr}/"))
        .header("x-big", "a".repeat(9000))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, _) = send(&c, req).await;
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

    // More headers than max_headers (50).
    let mut b = Request::get(format!("http://{addr}/"));
    for i in 0..60 {
        b = b.header(format!("x-h{i}"), "1");
    }
    let (status, _, _) = send(&c, b.body(Full::new(Bytes::new())).unwrap()).await;
    assert_eq!(status, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);

    // Body over 64KiB with content-length.
    let req = Request::post(format!("http://{addr}/"))
        .body(Full::new(Bytes::from(vec![b'a'; 70_000])))
        .unwrap();
    let (status, _, _) = send(&c, req).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);

    // Chunked body over the limit (no engine buffers it: the stream is cut and 413 sent).
    let mut raw_req =
        b"POST /up HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            .to_vec();
    for _ in 0..20 {
        raw_req.extend_from_slice(b"1000\r\n");
        raw_req.extend_from_slice(&[b'b'; 4096]);
        raw_req.extend_from_slice(b"\r\n");
    }
    raw_req.extend_from_slice(b"0\r\n\r\n");
    let resp = raw(addr, &raw_req).await;
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");

    // A body under the limit still passes.
    let req = Request::post(format!("http://{addr}/"))
        .body(Full::new(Bytes::from(vec![b'a'; 60_000])))
        .unwrap();
    let (status, _, body) = send(&c, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(json(&body)["body_len"], 60000);
    gw.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_passes_through() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let g = basic_gateway().await;
    let (gw, addr) = (g.gw, g.addr);
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nhost: t\r\nconnection: Upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let head = read_head(&mut s).await;
    let mut buf = vec![0u8; 4096];
    let text = String::from_utf8_lossy(&head).to_lowercase();
    assert!(text.starts_with("http/1.1 101"), "{text}");
    assert!(text.contains("upgrade: websocket"), "{text}");
    s.write_all(b"ping-1").await.unwrap();
    let mut got = Vec::new();
    while got.len() < b"echo:ping-1".len() {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, b"echo:ping-1");
    s.write_all(b"second").await.unwrap();
    let n = s.read(&mut buf).await.unwrap();
    assert_eq!(&buf[..n], b"echo:second");
    gw.shutdown(Duration::from_secs(1)).await;
}

/// Only the protocols a route lists (`routes[].upgrades`, default `websocket`) switch a
/// connection into a tunnel. Any other `Upgrade` (h2c above all) is forwarded as a plain
/// request without it, and an upstream that switches anyway (`/ws` answers `101` to
/// whatever asks) is an upstream error, never a tunnel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_listed_upgrades_become_tunnels() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let custom = "  - name: custom\n    path_prefix: /custom/\n    cluster: app\n    upgrades: [Custom-Proto]\n";
    let yaml =
        basic_config(up.addr, custom).replace("path_prefix: /custom/", "path_prefix: /ws/custom");
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let ask = |path: &str, upgrade: &str| {
        format!(
            "GET {path} HTTP/1.1\r\nhost: t\r\nconnection: Upgrade, HTTP2-Settings\r\n\
             upgrade: {upgrade}\r\nhttp2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        )
    };
    for (path, upgrade, tunnel) in [
        ("/ws", "websocket", true),
        ("/ws", "WebSocket/13", true),
        ("/ws", "h2c", false),
        ("/ws", "h2c, websocket", false),
        ("/ws", "HTTP/2.0", false),
        ("/ws", "custom-proto", false),
        ("/ws/custom", "custom-proto/2", true),
        ("/ws/custom", "websocket", false),
    ] {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(ask(path, upgrade).as_bytes()).await.unwrap();
        let head = String::from_utf8_lossy(&read_head(&mut s).await).to_lowercase();
        if tunnel {
            assert!(
                head.starts_with("http/1.1 101"),
                "{upgrade} on {path}: {head}"
            );
            s.write_all(b"ping").await.unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.unwrap();
            assert_eq!(&buf[..n], b"echo:ping", "{upgrade} on {path}");
        } else {
            // The upstream was asked for no switch, so its 101 is refused as an
            // upstream error and no byte the client sends next reaches it.
            assert!(
                head.starts_with("http/1.1 502"),
                "{upgrade} on {path}: {head}"
            );
            assert!(!head.contains("upgrade:"), "{upgrade} on {path}: {head}");
        }
    }
    gw.shutdown(Duration::from_secs(1)).await;
}

/// `h2c` cannot be listed: the error names the file, line and field.
#[test]
fn h2c_cannot_be_an_allowed_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("moat.yaml");
    for http in ["h2c", "H2C", "HTTP/2.0", "h2"] {
        let yaml = basic_config("127.0.0.1:9".parse().unwrap(), "").replace(
            "    cluster: app\n    body:",
            &format!("    cluster: app\n    upgrades: [websocket, \"{http}\"]\n    body:"),
        );
        let e = gateway_error(&file, &yaml);
        assert!(e.contains("moat.yaml:"), "{e}");
        assert!(e.contains("routes[0].upgrades[1]"), "{e}");
        assert!(e.contains(http), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_and_token() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = basic_config(up.addr, "").replace(
        "admin: { address: 127.0.0.1:0 }",
        "admin: { address: 127.0.0.1:0, token: s3cr3t-admin }",
    );
    let opts = GatewayOptions {
        admin: moat_proxy::AdminRouter::new().route_fn("/v1/hello", |req| async move {
            moat_proxy::admin::json(
                StatusCode::OK,
                &serde_json::json!({"routes": req.gateway.snapshot().routes.len()}),
            )
        }),
        ..GatewayOptions::default()
    };
    let gw = gateway(dir.path(), &yaml, opts).await;
    let admin = gw.admin_addr();
    let c = client();
    let (s, _, _) = get(&c, &format!("http://{admin}/healthz")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, _) = get(&c, &format!("http://{admin}/readyz")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, _) = get(&c, &format!("http://{admin}/metrics")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let authed = |path: &str| {
        Request::get(format!("http://{admin}{path}"))
            .header("authorization", "Bearer s3cr3t-admin")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (s, _, body) = send(&c, authed("/config")).await;
    assert_eq!(s, StatusCode::OK);
    let v = json(&body);
    assert_eq!(v["admin"]["token"], "<redacted>");
    assert_eq!(v["routes"][0]["cluster"], "app");
    assert!(!String::from_utf8_lossy(&body).contains("s3cr3t-admin"));
    let (s, _, body) = send(&c, authed("/v1/hello")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&body)["routes"], 1);
    let (s, _, body) = send(&c, authed("/metrics")).await;
    assert_eq!(s, StatusCode::OK);
    let m = String::from_utf8_lossy(&body);
    for needle in [
        "moat_phase_duration_seconds_bucket{phase=\"upstream\"",
        "moat_event_queue_depth",
        "moat_event_queue_dropped_total",
        "moat_config_reloads_total{result=\"ok\"} 0",
    ] {
        assert!(m.contains(needle), "missing {needle}: {m}");
    }
    let (s, _, _) = send(&c, authed("/nope")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let _ = Arc::new(());
    gw.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_upstream_connections_expire() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = basic_config(up.addr, "").replace(
        "    request_timeout: 1s\n",
        "    request_timeout: 1s\n    idle_timeout: 200ms\n",
    );
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let (s, _, _) = get(&c, &format!("http://{addr}/one")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, _, _) = get(&c, &format!("http://{addr}/two")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(up.connections(), 1);
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (s, _, _) = get(&c, &format!("http://{addr}/three")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        up.connections(),
        2,
        "the idle connection must have been closed"
    );
    gw.shutdown(Duration::from_secs(1)).await;
}

/// HTTP/2 with prior knowledge on a plain listener: the first bytes decide, and the
/// connection is served as HTTP/2 (GET and POST, several streams on one connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_prior_knowledge_on_a_plain_listener() {
    use http_body_util::BodyExt;
    let g = basic_gateway().await;
    let (gw, addr) = (g.gw, g.addr);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    for i in 0..3 {
        let req = Request::post(format!("http://{addr}/h2c/{i}"))
            .body(Full::new(Bytes::from(format!("body {i}"))))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.headers()["x-request-id"].len(), 32);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let v = json(&body);
        assert_eq!(v["method"], "POST");
        assert_eq!(v["uri"], format!("/h2c/{i}"));
        assert_eq!(v["body"], format!("body {i}"));
    }
    assert!(gw.shutdown(Duration::from_secs(2)).await);
}

/// `listeners[].headers_with_underscores`: a CGI-style backend reads `x_internal` as
/// `x-internal`, which a policy on `request.headers[x-internal]` never sees. `allow`
/// forwards fields with underscores (Envoy's default) but for the twins of the fields a
/// policy reads or moat writes, which never reach the backend; `drop` removes every
/// such field before the engines read the head, `reject` answers 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_fields_with_underscores_are_allowed_dropped_or_refused() {
    let up = upstream("u").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(
        dir.path().join("policies/deny.yaml"),
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-internal, namespace: istio-system}
spec:
  action: DENY
  rules:
  - when: [{key: "request.headers[x-internal]", values: ["*"]}]
"#,
    )
    .unwrap();
    let yaml = format!(
        r#"listeners:
  - name: allow
    address: 127.0.0.1:0
  - name: drop
    address: 127.0.0.1:0
    headers_with_underscores: drop
  - name: reject
    address: 127.0.0.1:0
    headers_with_underscores: reject
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{}"]
routes:
  - name: all
    cluster: app
authz:
  enabled: true
  policies: [policies]
"#,
        up.addr
    );
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let c = client();
    let get_with = |listener: &str, name: &'static str| {
        let addr = gw.listener_addr(listener).unwrap();
        Request::get(format!("http://{addr}/x"))
            .header(name, "1")
            .header("x-plain", "1")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    // The policy reads the dash spelling on every listener.
    for listener in ["allow", "drop", "reject"] {
        let (s, _, _) = send(&c, get_with(listener, "x-internal")).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{listener}");
    }
    let (s, _, body) = send(&c, get_with("allow", "x_internal")).await;
    assert_eq!(s, StatusCode::OK);
    let seen = &json(&body)["headers"];
    assert!(seen.get("x_internal").is_none(), "{seen}");
    // The twins of the fields moat writes go too, other fields with underscores stay.
    let addr = gw.listener_addr("allow").unwrap();
    let answer = raw(
        addr,
        b"GET /x HTTP/1.1\r\nhost: x\r\nX_INTERNAL: 1\r\nx_forwarded_proto: https\r\n\
          x_request_id: 1\r\nx_forwarded-for: 10.0.0.1\r\nx_api_key: k\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:.300}");
    let echo = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let seen = &json(&Bytes::copy_from_slice(echo.as_bytes()))["headers"];
    for twin in [
        "x_internal",
        "x_forwarded_proto",
        "x_request_id",
        "x_forwarded-for",
    ] {
        assert!(seen.get(twin).is_none(), "{twin} forwarded: {seen}");
    }
    assert_eq!(seen["x-forwarded-proto"], "http", "{seen}");
    assert_eq!(seen["x_api_key"], "k", "{seen}");
    let (s, _, body) = send(&c, get_with("drop", "x_internal")).await;
    assert_eq!(s, StatusCode::OK);
    let seen = &json(&body)["headers"];
    assert!(seen.get("x_internal").is_none(), "{seen}");
    assert_eq!(seen["x-plain"], "1");
    let (s, _, _) = send(&c, get_with("reject", "x_internal")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _, _) = send(&c, get_with("reject", "x-plain-too")).await;
    assert_eq!(s, StatusCode::OK);
    gw.shutdown(Duration::from_secs(2)).await;

    // Only HTTP listeners take it.
    let tcp = "listeners:\n  - name: t\n    address: 127.0.0.1:0\n    protocol: tcp\n    cluster: app\n    headers_with_underscores: drop\nclusters:\n  - name: app\n    endpoints: [\"127.0.0.1:9\"]\n";
    let file = dir.path().join("tcp.yaml");
    std::fs::write(&file, tcp).unwrap();
    let err = moat_proxy::config::load_file(&file)
        .unwrap_err()
        .to_string();
    assert!(err.contains("tcp.yaml:2"), "{err}");
    assert!(
        err.contains("listeners[0].headers_with_underscores"),
        "{err}"
    );
}

/// The path access control matched is the path that goes upstream (Envoy's
/// `normalize_path` rewrites `:path`): a prefix router that does not resolve dot
/// segments would take `/admin/../public/x`, allowed as `/public/x`, into its `/admin`
/// handler if the raw path went on. The WAF reads the path as it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_normalized_path_is_the_one_forwarded() {
    let up = upstream("u").await;
    let policy = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: public-only, namespace: istio-system}
spec:
  action: ALLOW
  rules:
  - to: [{operation: {paths: ["/public/*"]}}]
"#;
    let (gw, addr, _dir) =
        authz_gateway(up.addr, policy, "waf: { enabled: true, mode: block }\n").await;
    // What comes of each target: forwarded as this path, or refused with this text.
    for (raw, outcome) in [
        ("/admin/../public/x?y=1", Ok("/public/x?y=1")),
        ("/public/./a/%7Euser", Ok("/public/a/~user")),
        ("/public\\x", Ok("/public/x")),
        (
            "/public/plain?q=a%2Fb/../c",
            Ok("/public/plain?q=a%2Fb/../c"),
        ),
        ("/public/../admin", Err("RBAC: access denied")),
        // `;` parameters stay on the path that goes upstream; the policies also read the
        // path without them, as Tomcat routes `/public/..;/admin` to `/admin`.
        (
            "/public/x;jsessionid=1F;v=2?y=1",
            Ok("/public/x;jsessionid=1F;v=2?y=1"),
        ),
        ("/public/..;/admin", Err("RBAC: access denied")),
        // Allowed as `/public/etc/passwd`, but the WAF reads the path as it was sent.
        (
            "/public/x/../../../public/etc/passwd",
            Err("403 Request blocked"),
        ),
    ] {
        let answer = raw_request(addr, raw).await;
        match outcome {
            Ok(path) => {
                assert!(answer.starts_with("HTTP/1.1 200"), "{raw}: {answer:.300}");
                let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
                let v: serde_json::Value = serde_json::from_str(body).unwrap();
                assert_eq!(v["uri"], path, "{raw}");
            }
            Err(text) => {
                assert!(answer.starts_with("HTTP/1.1 403"), "{raw}: {answer:.300}");
                assert!(answer.contains(text), "{raw}: {answer:.400}");
            }
        }
    }
    gw.shutdown(Duration::from_secs(2)).await;
}

/// A POST naming another method in `X-HTTP-Method-Override` or `_method` is routed as
/// that method by Symfony, Laravel, Express's `method-override` and ASP.NET, and a host
/// is routed without its port: access control reads such requests both ways, and they
/// go upstream as they were sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_overrides_and_host_ports_are_read_as_the_backend_reads_them() {
    let up = upstream("u").await;
    let policy = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-delete, namespace: istio-system}
spec:
  action: DENY
  rules:
  - to: [{operation: {methods: ["DELETE"]}}]
  - to: [{operation: {hosts: ["admin.example.com"]}}]
"#;
    let (gw, addr, _dir) = authz_gateway(up.addr, policy, "").await;
    let post = |target: &str, field: &str| {
        format!(
            "POST {target} HTTP/1.1\r\nhost: x\r\n{field}content-length: 0\r\nconnection: close\r\n\r\n"
        )
    };
    // DENY policies read the host without its port and trailing dot, as the routes do.
    for (host, status) in [
        ("admin.example.com", "403"),
        ("admin.example.com:8080", "403"),
        ("admin.example.com.", "403"),
        ("www.example.com:8080", "200"),
    ] {
        let answer = raw(
            addr,
            format!("GET / HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{host}: {answer:.300}"
        );
    }
    for (target, field, status) in [
        ("/items/1", "", "200"),
        ("/items/1", "x-http-method-override: PATCH\r\n", "200"),
        ("/items/1", "x-http-method-override: DELETE\r\n", "403"),
        ("/items/1", "X-HTTP-Method: delete\r\n", "403"),
        ("/items/1?_method=DELETE", "", "403"),
        ("/items/1", "x-http-method-override: A,B,C,D,E\r\n", "400"),
    ] {
        let answer = raw(addr, post(target, field).as_bytes()).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{target} {field}: {answer:.300}"
        );
        if status == "200" {
            let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
            let v: serde_json::Value = serde_json::from_slice(body.as_bytes()).unwrap();
            assert_eq!((&v["method"], &v["uri"]), (&"POST".into(), &target.into()));
        }
    }
    gw.shutdown(Duration::from_secs(2)).await;
}

/// Rails, Symfony and Laravel route a POST whose form names `_method=DELETE` as a
/// DELETE (Laravel a JSON body's `_method` too): the request allowed on its head is
/// decided again with its body, and goes upstream as it was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn method_fields_of_post_bodies_are_read_as_the_backend_reads_them() {
    let up = upstream("u").await;
    let policy = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-delete, namespace: istio-system}
spec:
  action: DENY
  rules:
  - to: [{operation: {methods: ["DELETE"], paths: ["/items/*"]}}]
"#;
    let multipart = |name: &str, value: &str| {
        format!(
            "--XyZ\r\ncontent-disposition: form-data; name=\"title\"\r\n\r\nhello\r\n\
             --XyZ\r\nContent-Disposition: form-data; name={name}\r\n\r\n{value}\r\n--XyZ--\r\n"
        )
    };
    let form = "application/x-www-form-urlencoded";
    let json = "application/json; charset=utf-8";
    let multi = "multipart/form-data; boundary=XyZ";
    let cases: Vec<(&str, &str, String, &str)> = vec![
        ("/items/1", form, "title=a&_method=patch".into(), "200"),
        ("/items/1", form, "title=a&_method=delete".into(), "403"),
        (
            "/items/1",
            form,
            "_method=PUT&%5Fmethod=DELETE".into(),
            "403",
        ),
        ("/items/1", form, "title=a&.method=DELETE".into(), "403"),
        ("/other", form, "_method=DELETE".into(), "200"),
        ("/items/1", "text/plain", "_method=DELETE".into(), "200"),
        ("/items/1", "", "_method=DELETE".into(), "403"), // Rack: a form
        (
            "/items/1",
            json,
            r#"{"title":"a","_method":"PATCH"}"#.into(),
            "200",
        ),
        (
            "/items/1",
            json,
            r#"{"a":{"_method":"DELETE"}}"#.into(),
            "200",
        ),
        (
            "/items/1",
            json,
            r#"{"\u005fmethod":"DELETE"}"#.into(),
            "403",
        ),
        (
            "/items/1",
            json,
            r#"{"_method":"PUT","_method":"DELETE"}"#.into(),
            "403",
        ),
        // Deeper than serde_json's 128 levels, within PHP's 512.
        (
            "/items/1",
            json,
            format!(
                r#"{{"a":{}{},"_method":"DELETE"}}"#,
                "[".repeat(200),
                "]".repeat(200)
            ),
            "403",
        ),
        ("/items/1", multi, multipart("\"_method\"", "DELETE"), "403"),
        ("/items/1", multi, multipart("_method", "delete"), "403"),
        ("/items/1", multi, multipart("\"_method\"", "PATCH"), "200"),
        (
            "/items/1",
            form,
            "_method=A&_method=B&_method=C&_method=D&_method=E".into(),
            "400",
        ),
    ];
    for (mode, refused) in [("", true), ("  method_overrides: as_received\n", false)] {
        let (gw, addr, _dir) = authz_gateway(up.addr, policy, mode).await;
        for (target, content_type, body, status) in &cases {
            let status = if refused { status } else { "200" };
            let content_type = match content_type {
                &"" => String::new(),
                ct => format!("content-type: {ct}\r\n"),
            };
            let request = format!(
                "POST {target} HTTP/1.1\r\nhost: x\r\n{content_type}\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let answer = raw(addr, request.as_bytes()).await;
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}")),
                "{mode}{target} {body}: {answer:.300}"
            );
            if status == "200" {
                let echo = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
                let v: serde_json::Value = serde_json::from_slice(echo.as_bytes()).unwrap();
                assert_eq!(
                    (&v["method"], &v["body"]),
                    (&"POST".into(), &body.as_str().into())
                );
            }
        }
        gw.shutdown(Duration::from_secs(2)).await;
    }
}

/// A gateway in front of `upstream` with access control on the Istio policies in
/// `policy` and the `extra` config: the gateway, its main listener's address, and the
/// directory holding its files.
async fn authz_gateway(
    upstream: SocketAddr,
    policy: &str,
    extra: &str,
) -> (moat_proxy::RunningGateway, SocketAddr, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(dir.path().join("policies/policy.yaml"), policy).unwrap();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\nadmin: {{ address: 127.0.0.1:0 }}\n\
         clusters:\n  - name: app\n    endpoints: [\"{upstream}\"]\nroutes:\n  - name: all\n    cluster: app\n\
         authz:\n  enabled: true\n  policies: [policies]\n{extra}"
    );
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    (gw, addr, dir)
}

/// A GET of `target` as written, on its own connection.
async fn raw_request(addr: SocketAddr, target: &str) -> String {
    raw(
        addr,
        format!("GET {target} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
}
