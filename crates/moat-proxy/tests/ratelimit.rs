//! Rate limits, bans and lists wired from the gateway config, through real sockets:
//! limits per key kind, the 429 headers, monitor mode, bans earned by WAF blocks and
//! their expiry, deny-list reloads, buckets kept across a config reload, the
//! `/v1/bans` admin API, and config errors that name file, line and field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, gateway, json, send, upstream, TestClient};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use moat_core::{Connection, EventAction, HandshakeRecord, RequestCtx, SecurityEvent};
use moat_proxy::events::{AccessInfo, EventSink};
use moat_proxy::GatewayOptions;
use parking_lot::Mutex;

/// Keeps every security event.
#[derive(Default)]
struct Sink(Mutex<Vec<SecurityEvent>>);

impl EventSink for Sink {
    fn access(&self, _: &AccessInfo<'_>) -> bool {
        true
    }
    fn security(&self, _: &RequestCtx, ev: &SecurityEvent, _: &Method, _: &str) -> bool {
        self.0.lock().push(ev.clone());
        true
    }
    fn tls(&self, _: &Connection, _: &HandshakeRecord) -> bool {
        true
    }
}

impl Sink {
    fn of(&self, rule: &str) -> Vec<SecurityEvent> {
        self.0
            .lock()
            .iter()
            .filter(|e| e.rule == rule)
            .cloned()
            .collect()
    }
}

fn yaml(up: SocketAddr, ratelimit: &str) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
    xff_trusted_hops: 1
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{up}"]
routes:
  - name: api
    path_prefix: /api
    cluster: app
  - name: all
    cluster: app
{ratelimit}"#
    )
}

struct Setup {
    gw: moat_proxy::RunningGateway,
    addr: SocketAddr,
    sink: Arc<Sink>,
    dir: tempfile::TempDir,
    c: TestClient,
}

async fn start(ratelimit: &str) -> Setup {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    let gw = gateway(dir.path(), &yaml(up.addr, ratelimit), opts).await;
    let addr = gw.listener_addr("main").unwrap();
    Setup {
        gw,
        addr,
        sink,
        dir,
        c: client(),
    }
}

/// A GET from client `ip` (the trusted `X-Forwarded-For` hop) with extra headers.
async fn get_from(
    s: &Setup,
    path: &str,
    ip: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut b = Request::get(format!("http://{}{path}", s.addr))
        .header("x-forwarded-for", ip)
        .header("accept", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(&s.c, b.body(Full::new(Bytes::new())).unwrap()).await
}

/// How many of `n` requests pass.
async fn passes(s: &Setup, n: usize, path: &str, ip: &str, headers: &[(&str, &str)]) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if get_from(s, path, ip, headers).await.0 == StatusCode::OK {
            ok += 1;
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_ip_with_ietf_headers_and_an_event() {
    let s = start("ratelimit:\n  rules:\n    - name: per-ip\n      rate: 3\n      per: 1m\n").await;
    assert_eq!(passes(&s, 3, "/x", "198.51.100.1", &[]).await, 3);
    let (st, h, body) = get_from(&s, "/x", "198.51.100.1", &[]).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    // One token comes back every 20 s.
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((19..=20).contains(&retry), "{retry}");
    assert_eq!(h["ratelimit-policy"], "\"per-ip\";q=3;w=60");
    let state = h["ratelimit"].to_str().unwrap();
    assert!(state.starts_with("\"per-ip\";r=0;t="), "{state}");
    let v = json(&body);
    assert_eq!(v["status"], 429);
    let ev = s.sink.of("per-ip");
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].engine, "ratelimit");
    assert_eq!(ev[0].action, EventAction::Block);
    assert_eq!(v["event_id"], ev[0].id.as_str());
    // Another client has its own bucket.
    assert_eq!(passes(&s, 3, "/x", "198.51.100.2", &[]).await, 3);
    let m = common::get(&s.c, &format!("http://{}/metrics", s.gw.admin_addr())).await;
    let text = String::from_utf8_lossy(&m.2);
    assert!(
        text.contains("moat_ratelimit_requests_total{rule=\"per-ip\",outcome=\"limited\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("moat_ratelimit_requests_total{rule=\"per-ip\",outcome=\"passed\"} 6"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_header_route_and_path_template() {
    let s = start(
        r#"ratelimit:
  rules:
    - name: per-token
      routes: [api]
      key: [{header: x-api-key}]
      rate: 2
      per: 1m
    - name: per-template
      path: {template: "/users/{id}"}
      methods: [GET]
      key: [path]
      algorithm: sliding_window
      rate: 4
      per: 1m
    - name: per-route
      routes: [all]
      path: {prefix: /r/}
      key: [route]
      rate: 5
      per: 1m
"#,
    )
    .await;
    // Per token: each key has 2, whatever the IP; requests outside the route do not count.
    assert_eq!(
        passes(&s, 3, "/api/a", "192.0.2.1", &[("x-api-key", "k1")]).await,
        2
    );
    assert_eq!(
        passes(&s, 3, "/api/a", "192.0.2.2", &[("x-api-key", "k2")]).await,
        2
    );
    assert_eq!(
        passes(&s, 1, "/other", "192.0.2.2", &[("x-api-key", "k2")]).await,
        1
    );
    // A CGI-style backend reads `x_api_key` as the key; the limit counted it keyless.
    // It never reaches the backend: the upstream's echo has no such field.
    let (status, _, body) = get_from(
        &s,
        "/api/a",
        "192.0.2.9",
        &[("x_api_key", "k1"), ("x_other", "1")],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert!(echo["headers"].get("x_api_key").is_none(), "{echo}");
    assert_eq!(echo["headers"]["x_other"], "1", "{echo}");
    // Per template: every /users/{id} counts against one bucket.
    let mut ok = 0;
    for id in 0..6 {
        ok += passes(&s, 1, &format!("/users/{id}"), "192.0.2.3", &[]).await;
    }
    assert_eq!(ok, 4);
    assert_eq!(
        passes(&s, 1, "/users/1/x", "192.0.2.3", &[]).await,
        1,
        "not the template"
    );
    // Per route: all clients share it.
    let mut ok = 0;
    for i in 0..8 {
        ok += passes(&s, 1, "/r/x", &format!("203.0.113.{i}"), &[]).await;
    }
    assert_eq!(ok, 5);
}

/// A rule keyed on the discovered template: no template in the config, yet every
/// `/users/{id}` shares one bucket, and every other endpoint has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_discovered_path_template() {
    let s = start(
        "ratelimit:\n  rules:\n    - name: per-endpoint\n      key: [template]\n      rate: 3\n      per: 1m\n",
    )
    .await;
    let mut ok = 0;
    for id in ["1", "2", "42", "123e4567-e89b-12d3-a456-426614174000", "7"] {
        ok += passes(&s, 1, &format!("/users/{id}?q={id}"), "192.0.2.20", &[]).await;
    }
    assert_eq!(ok, 3, "/users/{{id}} is one endpoint");
    // Whatever the client: the key is the endpoint alone.
    assert_eq!(passes(&s, 1, "/users/8", "192.0.2.21", &[]).await, 0);
    // Other templates have buckets of their own.
    assert_eq!(passes(&s, 4, "/users/9/orders", "192.0.2.20", &[]).await, 3);
    assert_eq!(passes(&s, 4, "/users/me", "192.0.2.20", &[]).await, 3);
    let (st, h, _) = get_from(&s, "/users/5", "192.0.2.22", &[]).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(h["ratelimit-policy"], "\"per-endpoint\";q=3;w=60");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_mode_lets_requests_through_with_an_event() {
    let s = start(
        "ratelimit:\n  rules:\n    - name: watch\n      rate: 1\n      per: 1m\n      action: monitor\n",
    )
    .await;
    assert_eq!(passes(&s, 4, "/x", "198.51.100.7", &[]).await, 4);
    let ev = s.sink.of("watch");
    assert_eq!(ev.len(), 3);
    assert!(ev.iter().all(|e| e.action == EventAction::Monitor));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waf_blocks_earn_a_ban_that_expires() {
    let s = start(
        "waf: { enabled: true, mode: block }\nratelimit:\n  bans: { after_blocks: 2, within: 1m, ban_for: 1s }\n",
    )
    .await;
    let attack = "/search?q=1%27%20UNION%20SELECT%20username%2C%20password%20FROM%20users--";
    for _ in 0..3 {
        let (st, ..) = get_from(&s, attack, "198.51.100.9", &[]).await;
        assert_eq!(st, StatusCode::FORBIDDEN);
    }
    // Banned now, for benign requests too; other clients are not.
    let (st, _, body) = get_from(&s, "/fine", "198.51.100.9", &[]).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{body:?}");
    assert_eq!(s.sink.of("ban").len(), 1);
    assert_eq!(passes(&s, 1, "/fine", "198.51.100.10", &[]).await, 1);
    let admin = s.gw.admin_addr();
    let (_, _, list) = common::get(&s.c, &format!("http://{admin}/v1/bans")).await;
    assert_eq!(json(&list)["bans"][0]["ip"], "198.51.100.9");
    // The ban ends.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(passes(&s, 1, "/fine", "198.51.100.9", &[]).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_by_hand_through_the_admin_api() {
    let s = start("ratelimit:\n  bans: { after_blocks: 0 }\n").await;
    let admin = s.gw.admin_addr();
    let post = |body: &str| {
        Request::post(format!("http://{admin}/v1/bans"))
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap()
    };
    let (st, _, b) = send(&s.c, post(r#"{"ip": "2001:db8::1", "duration": "10m"}"#)).await;
    assert_eq!(st, StatusCode::OK, "{b:?}");
    assert_eq!(
        get_from(&s, "/x", "2001:db8::1", &[]).await.0,
        StatusCode::FORBIDDEN
    );
    for bad in [
        r#"{"ip": "nope", "duration": "1m"}"#,
        r#"{"ip": "192.0.2.1", "duration": "0s"}"#,
        "{",
        r#"{"ip": "192.0.2.1"}"#,
    ] {
        let (st, _, b) = send(&s.c, post(bad)).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {b:?}");
    }
    let del = |q: &str| {
        Request::delete(format!("http://{admin}/v1/bans{q}"))
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    assert_eq!(send(&s.c, del("?ip=2001:db8::1")).await.0, StatusCode::OK);
    assert_eq!(
        send(&s.c, del("?ip=2001:db8::1")).await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(send(&s.c, del("?ip=junk")).await.0, StatusCode::BAD_REQUEST);
    assert_eq!(
        get_from(&s, "/x", "2001:db8::1", &[]).await.0,
        StatusCode::OK
    );
}

/// Waits until `f` returns true (the worker re-reads lists once a second).
async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f().await {
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_and_allow_lists_reload_when_their_files_change() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "deny.txt", "# nobody yet\n");
    write(dir.path(), "allow.txt", "10.9.0.0/16\n");
    let up = upstream("a").await;
    let gw = gateway(
        dir.path(),
        &yaml(
            up.addr,
            "ratelimit:\n  bans: { deny_file: deny.txt, allow_file: allow.txt }\n  rules:\n    - name: tight\n      rate: 1\n      per: 1m\n",
        ),
        GatewayOptions::default(),
    )
    .await;
    let s = Setup {
        addr: gw.listener_addr("main").unwrap(),
        gw,
        sink: Arc::default(),
        dir,
        c: client(),
    };
    assert_eq!(passes(&s, 1, "/x", "192.0.2.50", &[]).await, 1);
    // The allow list skips limits.
    assert_eq!(passes(&s, 5, "/x", "10.9.1.1", &[]).await, 5);
    write(s.dir.path(), "deny.txt", "192.0.2.0/24 # abuse\n");
    eventually("deny list applied", async || {
        get_from(&s, "/x", "192.0.2.51", &[]).await.0 == StatusCode::FORBIDDEN
    })
    .await;
    // A broken file keeps the previous list.
    write(s.dir.path(), "deny.txt", "192.0.2.0/24\nnot an ip\n");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        get_from(&s, "/x", "192.0.2.52", &[]).await.0,
        StatusCode::FORBIDDEN
    );
    write(s.dir.path(), "deny.txt", "\n");
    eventually("deny list emptied", async || {
        get_from(&s, "/x", "192.0.2.53", &[]).await.0 == StatusCode::OK
    })
    .await;
    drop(s.gw);
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_the_buckets_of_unchanged_rules() {
    let rules = |b_rate: u32| {
        format!("ratelimit:\n  rules:\n    - name: a\n      path: {{prefix: /a}}\n      rate: 2\n      per: 1m\n    - name: b\n      path: {{prefix: /b}}\n      rate: {b_rate}\n      per: 1m\n")
    };
    let s = start(&rules(2)).await;
    assert_eq!(passes(&s, 3, "/a", "192.0.2.9", &[]).await, 2);
    assert_eq!(passes(&s, 3, "/b", "192.0.2.9", &[]).await, 2);
    let file = s.dir.path().join("moat.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let up = text
        .split("endpoints: [\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    std::fs::write(&file, yaml(up.parse().unwrap(), &rules(3))).unwrap();
    s.gw.shared().reload_from_file().unwrap();
    // Rule a did not change: still exhausted. Rule b did: a new bucket of 3.
    assert_eq!(passes(&s, 1, "/a", "192.0.2.9", &[]).await, 0);
    assert_eq!(passes(&s, 4, "/b", "192.0.2.9", &[]).await, 3);
}

#[test]
fn config_errors_name_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    for (rl, line, field, what) in [
        ("ratelimit:\n  rules:\n    - name: x\n      rate: 0\n      per: 1s\n", 18, "ratelimit.rules[0].rate", "at least 1"),
        ("ratelimit:\n  rules:\n    - name: x\n      rate: 1\n      per: 0s\n", 19, "ratelimit.rules[0].per", "longer than 0s"),
        ("ratelimit:\n  rules:\n    - name: x\n      rate: 1\n      per: 1s\n      key: [{header: \"bad header\"}]\n", 20, "ratelimit.rules[0].key", "not a header name"),
        ("ratelimit:\n  rules:\n    - name: x\n      rate: 1\n      per: 1s\n      routes: [nope]\n", 20, "ratelimit.rules[0].routes[0]", "unknown route"),
        ("ratelimit:\n  rules:\n    - name: x\n      rate: 1\n      per: 1s\n    - name: x\n      rate: 1\n      per: 1s\n", 20, "ratelimit.rules[1].name", "duplicate"),
        ("ratelimit:\n  challenge: { routes: [api], difficulty: 40 }\n", 16, "ratelimit.challenge.difficulty", "1 to 32"),
        ("ratelimit:\n  rules:\n    - name: x\n      rate: 1\n      per: 1s\n      surprise: 1\n", 20, "ratelimit.rules[0]", "surprise"),
        ("ratelimit:\n  store: { redis: \"http://cache:6379\" }\n", 16, "ratelimit.store", "starts with `redis://`"),
        ("ratelimit:\n  store: { redis: \"redis://:secret@/0\" }\n", 16, "ratelimit.store", "needs a host"),
        ("ratelimit:\n  store:\n    redis_cluster: []\n", 17, "ratelimit.store", "1 to 64 URLs"),
        ("ratelimit:\n  store:\n    redis_sentinel:\n      urls: [\"redis://127.0.0.1:26379\"]\n", 18, "ratelimit.store", "master_name"),
        ("ratelimit:\n  store:\n    redis_sentinel:\n      urls: [\"redis://127.0.0.1:26379\"]\n      master_name: \"\"\n", 19, "ratelimit.store", "master name"),
        ("ratelimit:\n  store: { memcached: \"127.0.0.1:1\" }\n", 16, "ratelimit.store", "memcached"),
    ] {
        let file = dir.path().join("moat.yaml");
        std::fs::write(&file, yaml("127.0.0.1:1".parse().unwrap(), rl)).unwrap();
        let e = match moat_proxy::config::load_file(&file) {
            Err(e) => e,
            Ok((cfg, src)) => match moat_proxy::pipeline::build_pipeline(&cfg, &src) {
                Err(e) => e,
                Ok(_) => panic!("accepted: {rl}"),
            },
        };
        let text = e.to_string();
        assert!(text.starts_with(&file.display().to_string()), "{text}");
        assert_eq!(e.line, line, "{text}");
        assert!(e.field.starts_with(field), "{text}");
        assert!(text.contains(what), "{text}");
    }
}
