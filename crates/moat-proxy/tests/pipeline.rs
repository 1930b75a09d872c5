//! The phase pipeline with test-only engines, and hot reload, through real sockets.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::Full;
use moat_core::{
    AfterResponsePhase, Body, BodyNeed, Connection, EventAction, Exchange, Finished,
    HandshakeRecord, Reply, ReplyFormat, RequestBodyPhase, RequestCtx, RequestHeadersPhase,
    ResponseBodyPhase, SecurityEvent, Verdict,
};
use moat_proxy::config::{self, ConfigSource};
use moat_proxy::events::{AccessInfo, EventSink};
use moat_proxy::{GatewayOptions, Pipeline, PipelineFactory};
use parking_lot::Mutex;

/// Blocks requests carrying `x-attack`.
struct BlockHeader;
impl RequestHeadersPhase for BlockHeader {
    fn name(&self) -> &'static str {
        "test-block"
    }
    fn on_request_headers(&self, ctx: &mut RequestCtx, req: &mut http::request::Parts) -> Verdict {
        req.headers
            .insert("x-seen-by", HeaderValue::from_static("test-block"));
        if req.headers.contains_key("x-attack") {
            let ev = SecurityEvent::new("waf", "test-rule", EventAction::Block, "attack header");
            let reply = Reply::page(
                StatusCode::FORBIDDEN,
                ReplyFormat::from_accept(req.headers.get("accept")),
                "blocked",
                &ctx.request_id,
                Some(&ev.id),
            );
            ctx.events.push(ev);
            return Verdict::Respond(reply);
        }
        Verdict::Continue
    }
}

/// Upper-cases request bodies on /rewrite (buffering up to 1MiB), blocks bodies containing "DROP TABLE".
struct RewriteBody;
impl RequestBodyPhase for RewriteBody {
    fn name(&self) -> &'static str {
        "test-rewrite"
    }
    fn body_need(&self, _ctx: &RequestCtx, req: &http::request::Parts) -> BodyNeed {
        if req.uri.path().starts_with("/rewrite") || req.uri.path().starts_with("/inspect") {
            BodyNeed::Buffer(1 << 20)
        } else {
            BodyNeed::None
        }
    }
    fn on_request_body(
        &self,
        ctx: &mut RequestCtx,
        req: &mut http::request::Parts,
        body: &mut Body,
    ) -> Verdict {
        let Ok(decoded) = body.decoded() else {
            return Verdict::Continue;
        };
        if decoded.windows(10).any(|w| w == b"DROP TABLE") {
            ctx.events.push(SecurityEvent::new(
                "waf",
                "sqli",
                EventAction::Block,
                "sql in body",
            ));
            return Verdict::Respond(Reply::text(StatusCode::FORBIDDEN, "no sql"));
        }
        if req.uri.path().starts_with("/rewrite") {
            let upper = decoded.to_ascii_uppercase();
            body.replace(Bytes::from(upper));
        }
        Verdict::Continue
    }
}

/// Redacts `SECRET-VALUE` in responses of /secret and marks them with a header.
struct ResponseRedact;
impl ResponseBodyPhase for ResponseRedact {
    fn name(&self) -> &'static str {
        "test-redact"
    }
    fn body_need(
        &self,
        _ctx: &RequestCtx,
        req: &http::request::Parts,
        _resp: &http::response::Parts,
    ) -> BodyNeed {
        if req.uri.path() == "/secret" {
            BodyNeed::Buffer(1 << 20)
        } else {
            BodyNeed::None
        }
    }
    fn on_response_body(
        &self,
        ctx: &mut RequestCtx,
        _req: &http::request::Parts,
        resp: &mut http::response::Parts,
        body: &mut Body,
    ) -> Verdict {
        resp.headers
            .insert("x-inspected", HeaderValue::from_static("1"));
        let text =
            String::from_utf8_lossy(body.decoded().map(|b| &b[..]).unwrap_or(b"")).into_owned();
        if text.contains("SECRET-VALUE") {
            body.replace(Bytes::from(text.replace("SECRET-VALUE", "[REDACTED]")));
            ctx.events.push(SecurityEvent::new(
                "secrets",
                "test-secret",
                EventAction::Redact,
                "redacted",
            ));
        }
        Verdict::Continue
    }
}

/// Keeps every exchange, once its response has been sent.
#[derive(Default)]
struct Recorder {
    exchanges: Arc<Mutex<Vec<Arc<Exchange>>>>,
}
impl AfterResponsePhase for Recorder {
    fn name(&self) -> &'static str {
        "test-recorder"
    }
    fn wants_bodies(&self, _ctx: &mut RequestCtx, _req: &http::request::Parts) -> BodyNeed {
        BodyNeed::None
    }
    fn after_response(&self, done: &Finished<'_>) {
        let (exchange, kept) = (done.exchange(), self.exchanges.clone());
        done.after_sent(move || kept.lock().push(exchange));
    }
}

/// Collects records.
#[derive(Default)]
struct Sink {
    access: Mutex<Vec<(String, u16, String)>>,
    /// Path and response body bytes of each access record.
    bytes_out: Mutex<Vec<(String, u64)>>,
    security: Mutex<Vec<(String, String, String)>>,
}
impl EventSink for Sink {
    fn access(&self, info: &AccessInfo<'_>) -> bool {
        self.bytes_out
            .lock()
            .push((info.path.to_string(), info.bytes_out));
        self.access.lock().push((
            info.path.to_string(),
            info.status,
            format!("{:?}", info.decision),
        ));
        true
    }
    fn security(&self, ctx: &RequestCtx, event: &SecurityEvent, _m: &Method, path: &str) -> bool {
        self.security
            .lock()
            .push((ctx.request_id.clone(), event.rule.clone(), path.to_string()));
        true
    }
    fn tls(&self, _conn: &Connection, _hs: &HandshakeRecord) -> bool {
        true
    }
}

fn factory(recorder: Arc<Recorder>) -> PipelineFactory {
    Arc::new(move |cfg, src| {
        let mut p: Pipeline = moat_proxy::build_pipeline(cfg, src)?;
        p.request_headers.push(Arc::new(BlockHeader));
        p.request_body.push(Arc::new(RewriteBody));
        p.response_body.push(Arc::new(ResponseRedact));
        p.after_response.push(recorder.clone());
        Ok(p)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phases_block_rewrite_redact_and_record() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::default());
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        pipeline_factory: factory(recorder.clone()),
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    let gw = gateway(dir.path(), &basic_config(up.addr, ""), opts).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();

    // Request-headers phase sees and modifies the request.
    let (s, h, body) = get(&c, &format!("http://{addr}/plain")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&body)["headers"]["x-seen-by"], "test-block");
    assert!(!h.contains_key("x-inspected"));

    // Blocked by header: 403 block page carrying the event id; upstream not called.
    let before = up.connections();
    let req = Request::get(format!("http://{addr}/x"))
        .header("x-attack", "1")
        .header("accept", "application/json")
        .header("x-request-id", "blocked-req")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, _, body) = send(&c, req).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let v = json(&body);
    assert_eq!(v["request_id"], "blocked-req");
    assert_eq!(v["event_id"].as_str().unwrap().len(), 16);
    assert_eq!(up.connections(), before);

    // Body rewrite: gzip-encoded body is decoded, replaced, content-encoding dropped, length fixed.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"make me loud").unwrap();
    let req = Request::post(format!("http://{addr}/rewrite"))
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(gz.finish().unwrap())))
        .unwrap();
    let (s, _, body) = send(&c, req).await;
    assert_eq!(s, StatusCode::OK);
    let v = json(&body);
    assert_eq!(v["body"], "MAKE ME LOUD");
    assert_eq!(v["headers"]["content-length"], "12");
    assert!(v["headers"].get("content-encoding").is_none(), "{v}");

    // Chunked body is buffered for the phase too.
    let resp = raw(
        addr,
        b"POST /rewrite HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n",
    )
    .await;
    assert!(resp.contains(r#""body":"ABCDEF""#), "{resp}");

    // Body block.
    let req = Request::post(format!("http://{addr}/inspect"))
        .body(Full::new(Bytes::from_static(b"1; DROP TABLE users")))
        .unwrap();
    let (s, _, body) = send(&c, req).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(&body[..], b"no sql");

    // Response body redaction with a fixed content-length.
    let (s, h, body) = get(&c, &format!("http://{addr}/secret")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(&body[..], b"token=[REDACTED] and more");
    assert_eq!(h["content-length"], body.len().to_string());
    // The response phase may change the response head too.
    assert_eq!(h["x-inspected"], "1");

    // A streamed response (larger than what is gathered with its head, no buffering phase).
    let (s, _, big) = get(&c, &format!("http://{addr}/big?n=300000")).await;
    assert_eq!((s, big.len()), (StatusCode::OK, 300_000));

    // Records: one access record per request, written once the body was sent,
    // with the body bytes sent; security events with the request id.
    let access = sink.access.lock().clone();
    assert_eq!(access.len(), 7, "{access:?}");
    let bytes_out = sink.bytes_out.lock().clone();
    assert!(
        bytes_out.contains(&("/big?n=300000".into(), 300_000)),
        "{bytes_out:?}"
    );
    assert!(
        bytes_out.contains(&("/secret".into(), b"token=[REDACTED] and more".len() as u64)),
        "{bytes_out:?}"
    );
    assert!(access.contains(&("/x".into(), 403, "Block".into())));
    let sec = sink.security.lock().clone();
    assert!(
        sec.contains(&("blocked-req".into(), "test-rule".into(), "/x".into())),
        "{sec:?}"
    );
    assert!(sec.iter().any(|(_, r, _)| r == "sqli"));
    assert!(sec
        .iter()
        .any(|(_, r, p)| r == "test-secret" && p == "/secret"));
    // After-response phase saw every exchange.
    let ex = recorder.exchanges.lock().clone();
    assert_eq!(ex.len(), 7);
    assert!(ex
        .iter()
        .any(|e| e.status == StatusCode::FORBIDDEN && e.ctx.route.as_ref() == "all"));

    // Per-phase histograms were fed.
    let (_, _, m) = get(&c, &format!("http://{}/metrics", gw.admin_addr())).await;
    let m = String::from_utf8_lossy(&m);
    for phase in [
        "request_headers",
        "request_body",
        "upstream",
        "response_body",
        "after_response",
    ] {
        let needle = format!("moat_phase_duration_seconds_count{{phase=\"{phase}\"}} 0");
        assert!(!m.contains(&needle), "phase {phase} not timed: {m}");
    }
    assert!(
        m.contains(r#"moat_requests_total{route="all",status="403",decision="block"} 2"#),
        "{m}"
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_policy_inspects_prefix_and_forwards_everything() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        pipeline_factory: factory(Arc::new(Recorder::default())),
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    let yaml = basic_config(up.addr, "").replace(
        "body: { max_bytes: 64KiB, on_limit: reject }",
        "body: { max_bytes: 1KiB, on_limit: forward }",
    );
    let gw = gateway(dir.path(), &yaml, opts).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let big = vec![b'q'; 5000];
    let req = Request::post(format!("http://{addr}/inspect"))
        .body(Full::new(Bytes::from(big)))
        .unwrap();
    let (s, _, body) = send(&c, req).await;
    assert_eq!(s, StatusCode::OK);
    let v = json(&body);
    assert_eq!(v["body_len"], 5000);
    assert_eq!(v["headers"]["content-length"], "5000");
    let sec = sink.security.lock().clone();
    assert!(
        sec.iter().any(|(_, r, _)| r == "request_body_limit"),
        "{sec:?}"
    );

    // Same with a chunked body.
    let mut raw_req =
        b"POST /inspect HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            .to_vec();
    for _ in 0..3 {
        raw_req.extend_from_slice(b"400\r\n");
        raw_req.extend_from_slice(&[b'z'; 1024]);
        raw_req.extend_from_slice(b"\r\n");
    }
    raw_req.extend_from_slice(b"0\r\n\r\n");
    let resp = raw(addr, &raw_req).await;
    assert!(resp.contains(r#""body_len":3072"#), "{resp}");
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_swaps_routes_without_dropping_in_flight_requests() {
    let a = upstream("a").await;
    let b = upstream("b").await;
    let dir = tempfile::tempdir().unwrap();
    let yaml_a = basic_config(a.addr, "");
    let gw = gateway(dir.path(), &yaml_a, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let (_, h, _) = get(&c, &format!("http://{addr}/")).await;
    assert_eq!(h["x-upstream"], "a");

    // A slow request in flight on the old config.
    let c2 = c.clone();
    let inflight =
        tokio::spawn(async move { get(&c2, &format!("http://{addr}/slow?ms=700")).await });
    tokio::time::sleep(Duration::from_millis(150)).await;

    // Swap to upstream b through the file (SIGHUP / file watch call the same function).
    let file = dir.path().join("moat.yaml");
    std::fs::write(&file, basic_config(b.addr, "")).unwrap();
    gw.shared().reload_from_file().unwrap();
    let (_, h, _) = get(&c, &format!("http://{addr}/")).await;
    assert_eq!(h["x-upstream"], "b");
    let (s, h, body) = inflight.await.unwrap();
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-upstream"], "a");
    assert_eq!(&body[..], b"slow done");

    // A bad config is refused with file:line:field; the old config keeps serving.
    let bad = basic_config(a.addr, "").replace("    cluster: app\n", "    cluster: nope\n");
    std::fs::write(&file, &bad).unwrap();
    let err = gw.shared().reload_from_file().unwrap_err();
    let line = bad
        .lines()
        .position(|l| l.contains("cluster: nope"))
        .unwrap() as u32
        + 1;
    assert_eq!(err.line, line, "{err}");
    assert_eq!(err.field, "routes[0].cluster");
    assert!(
        err.to_string()
            .starts_with(&format!("{}:{line}:", file.display())),
        "{err}"
    );
    let (_, h, _) = get(&c, &format!("http://{addr}/")).await;
    assert_eq!(h["x-upstream"], "b");

    // A syntax / type error too.
    std::fs::write(
        &file,
        basic_config(a.addr, "").replace("max_headers: 50", "max_headers: lots"),
    )
    .unwrap();
    let err = gw.shared().reload_from_file().unwrap_err();
    assert_eq!(err.field, "limits.max_headers", "{err}");
    assert!(err.line > 0);

    let (_, _, m) = get(&c, &format!("http://{}/metrics", gw.admin_addr())).await;
    let m = String::from_utf8_lossy(&m);
    assert!(
        m.contains("moat_config_reloads_total{result=\"ok\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("moat_config_reloads_total{result=\"failed\"} 2"),
        "{m}"
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

/// True once requests to `addr` reach the upstream named `name` (within 5 s).
async fn upstream_becomes(c: &TestClient, addr: std::net::SocketAddr, name: &str) -> bool {
    for _ in 0..100 {
        let (_, h, _) = get(c, &format!("http://{addr}/")).await;
        if h["x-upstream"] == name {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_change_triggers_reload() {
    let a = upstream("a").await;
    let b = upstream("b").await;
    let (gw, addr, dir) = basic_gateway_to(a.addr).await;
    gw.spawn_reload_triggers();
    let c = client();
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::write(dir.path().join("moat.yaml"), basic_config(b.addr, "")).unwrap();
    assert!(
        upstream_becomes(&c, addr, "b").await,
        "the file watcher did not reload the config"
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

/// A Kubernetes ConfigMap volume: `moat.yaml` -> `..data/moat.yaml`, and an update swaps
/// the `..data` symlink to a new directory (the file moat read is never written).
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_style_symlink_swap_triggers_reload() {
    use std::os::unix::fs::symlink;
    let a = upstream("a").await;
    let b = upstream("b").await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for (version, up) in [("v1", a.addr), ("v2", b.addr)] {
        std::fs::create_dir(d.join(version)).unwrap();
        std::fs::write(d.join(version).join("moat.yaml"), basic_config(up, "")).unwrap();
    }
    symlink("v1", d.join("..data")).unwrap();
    symlink("..data/moat.yaml", d.join("moat.yaml")).unwrap();
    let (cfg, src) = config::load_file(&d.join("moat.yaml")).unwrap();
    let gw = gateway_from(cfg, src, GatewayOptions::default()).await;
    gw.spawn_reload_triggers();
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let (_, h, _) = get(&c, &format!("http://{addr}/")).await;
    assert_eq!(h["x-upstream"], "a");
    // The atomic swap kubelet does: a new link renamed over the old one.
    symlink("v2", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    assert!(
        upstream_becomes(&c, addr, "b").await,
        "the swapped ConfigMap symlink did not reload the config"
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

#[test]
fn routes_match_host_and_prefix_in_order() {
    let src = ConfigSource {
        file: "t.yaml".into(),
        base_dir: ".".into(),
    };
    let cfg = config::parse(
        &src,
        "clusters:\n  - name: c\n    endpoints: [\"127.0.0.1:1\"]\nroutes:\n  - name: exact\n    host: api.example.com\n    path_prefix: /v1\n    cluster: c\n  - name: wild\n    host: \"*.example.com\"\n    cluster: c\n  - name: any\n    cluster: c\n",
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let gw = moat_proxy::Gateway::new(cfg, src, GatewayOptions::default()).unwrap();
        let snap = gw.shared().snapshot();
        let m = |h: &str, p: &str| snap.match_route(h, p).map(|r| r.name.to_string());
        assert_eq!(m("api.example.com", "/v1/x").as_deref(), Some("exact"));
        assert_eq!(m("API.Example.com", "/v1").as_deref(), Some("exact"));
        assert_eq!(m("api.example.com", "/v2").as_deref(), Some("wild"));
        assert_eq!(m("www.example.com", "/").as_deref(), Some("wild"));
        assert_eq!(m("example.com", "/").as_deref(), Some("any"));
    });
}

/// A virtual patch file the config names is watched like the config: editing it
/// reloads the WAF with the new rules (the config file itself is not touched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_patch_file_change_triggers_reload() {
    let a = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let rule = |path: &str| {
        format!(
            "rules:\n  - id: LOCAL-1\n    description: a local exploit endpoint\n    \
             path: {path}\n    examples:\n      block:\n        - target: {path}\n      \
             pass:\n        - target: /elsewhere\n"
        )
    };
    std::fs::write(dir.path().join("patches.yaml"), rule("/exploit-one")).unwrap();
    let yaml = basic_config(a.addr, "")
        + "waf: { enabled: true, mode: block, virtual_patches: { builtin: false, files: [patches.yaml] } }\n";
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    gw.spawn_reload_triggers();
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let (s, _, _) = get(&c, &format!("http://{addr}/exploit-one")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _, _) = get(&c, &format!("http://{addr}/exploit-two")).await;
    assert_eq!(s, StatusCode::OK);
    std::fs::write(dir.path().join("patches.yaml"), rule("/exploit-two")).unwrap();
    let mut reloaded = false;
    for _ in 0..100 {
        let (s, _, _) = get(&c, &format!("http://{addr}/exploit-two")).await;
        if s == StatusCode::FORBIDDEN {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        reloaded,
        "the virtual patch file change did not reload the WAF"
    );
    let (s, _, _) = get(&c, &format!("http://{addr}/exploit-one")).await;
    assert_eq!(s, StatusCode::OK);
    gw.shutdown(Duration::from_secs(2)).await;
}

/// Permits for the gated upstream's reads: a connection's handler takes one before
/// each request it reads, so the test decides when bytes leave the socket's queue.
#[derive(Default)]
struct Permits {
    left: std::sync::Mutex<usize>,
    granted: std::sync::Condvar,
}

impl Permits {
    fn grant(&self, n: usize) {
        *self.left.lock().unwrap() += n;
        self.granted.notify_all();
    }
    fn take(&self) {
        let mut left = self.left.lock().unwrap();
        while *left == 0 {
            left = self.granted.wait(left).unwrap();
        }
        *left -= 1;
    }
}

/// An HTTP/1.1 upstream on blocking sockets that answers each GET with `200 ok` once
/// a permit allows it to read the request, and keeps a handle on every connection it
/// accepted, for the test to look into their receive queues.
fn gated_upstream(
    permits: Arc<Permits>,
) -> (std::net::SocketAddr, Arc<Mutex<Vec<std::net::TcpStream>>>) {
    use std::io::Read as _;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let conns: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
    let kept = conns.clone();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            kept.lock().push(s.try_clone().unwrap());
            let permits = permits.clone();
            std::thread::spawn(move || loop {
                permits.take();
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match s.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .is_err()
                {
                    return;
                }
            });
        }
    });
    (addr, conns)
}

/// The request-headers phase of the batching test. Request `x-order: hold` holds the
/// gateway's only thread until the test has queued requests 1 and 2 at moat's sockets,
/// then answers itself (it never goes upstream); of requests 1 and 2, whichever runs
/// its phase second records whether any bytes were waiting in the upstream's sockets.
struct OrderProbe {
    in_phase: std::sync::mpsc::SyncSender<()>,
    queued_both: Mutex<std::sync::mpsc::Receiver<()>>,
    phases_run: std::sync::atomic::AtomicUsize,
    upstream_conns: Arc<Mutex<Vec<std::net::TcpStream>>>,
    written_before_second_phase: std::sync::mpsc::SyncSender<bool>,
}

impl RequestHeadersPhase for OrderProbe {
    fn name(&self) -> &'static str {
        "test-order"
    }
    fn on_request_headers(&self, _ctx: &mut RequestCtx, req: &mut http::request::Parts) -> Verdict {
        match req.headers.get("x-order").map(|v| v.as_bytes()) {
            Some(b"hold") => {
                self.in_phase.send(()).unwrap();
                let queued = self
                    .queued_both
                    .lock()
                    .recv_timeout(Duration::from_secs(10));
                queued.expect("the test queues requests 1 and 2");
                return Verdict::Respond(Reply::text(StatusCode::OK, "ok"));
            }
            Some(b"1" | b"2") => {
                let earlier = self
                    .phases_run
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if earlier == 1 {
                    // The upstream's handlers are waiting for permits, not reading:
                    // any byte queued on their sockets is a request moat already wrote.
                    let mut queued = false;
                    for s in self.upstream_conns.lock().iter() {
                        s.set_nonblocking(true).unwrap();
                        queued |= matches!(s.peek(&mut [0u8; 1]), Ok(n) if n > 0);
                        s.set_nonblocking(false).unwrap();
                    }
                    self.written_before_second_phase.send(queued).unwrap();
                }
            }
            _ => {}
        }
        Verdict::Continue
    }
}

/// Sends a GET with an `x-order` header on a kept-alive client connection, in one
/// write (`write!` would make one per piece, and Nagle's algorithm would hold all but
/// the first until moat's acknowledgement).
fn send_get(c: &mut std::net::TcpStream, path: &str, order: &str) {
    let head = format!("GET {path} HTTP/1.1\r\nhost: t\r\nx-order: {order}\r\n\r\n");
    c.write_all(head.as_bytes()).unwrap();
}

/// The bytes waiting to be read on the IPv4 TCP socket bound to `local` and connected
/// to `remote`, from /proc/net/tcp (its `rx_queue`); 0 when there is no such socket.
fn unread_bytes(local: std::net::SocketAddr, remote: std::net::SocketAddr) -> u64 {
    let hex = |a: std::net::SocketAddr| match a.ip() {
        std::net::IpAddr::V4(ip) => {
            format!("{:08X}:{:04X}", u32::from_le_bytes(ip.octets()), a.port())
        }
        std::net::IpAddr::V6(_) => String::new(),
    };
    let (local, remote) = (hex(local), hex(remote));
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 4 && f[1] == local && f[2] == remote)
        .and_then(|f| f[4].split_once(':'))
        .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
        .unwrap_or(0)
}

/// Reads the upstream's `200 ok`, forwarded, from a client connection.
fn read_ok(c: &mut std::net::TcpStream) {
    use std::io::Read as _;
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !got.ends_with(b"\r\n\r\nok") {
        let n = c.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
}

/// Before it writes its request upstream, a request lets every other request that is
/// ready run its phases: under load the engines' code then serves a batch while it is
/// in the caches, where an upstream on moat's CPU, which runs at each write, would
/// evict it between requests. Checked on the single-threaded runtime `moat serve`
/// uses on one CPU, without timing: a third request's phase holds the thread until
/// requests 1 and 2 have both reached moat's sockets, so one I/O poll makes both
/// ready; whichever of them runs its phase second then finds nothing written upstream
/// yet (the other goes out on a pooled connection, which a write without the yield
/// would have reached at once).
///
/// A request that arrives while a batch runs its phases joins the next batch: the
/// batch's writes go out first (docs/perf-log/2026-11-29-session17.md).
#[test]
fn ready_requests_run_their_phases_before_the_first_upstream_write() {
    let permits = Arc::new(Permits::default());
    let (up, upstream_conns) = gated_upstream(permits.clone());
    let (in_phase_tx, in_phase) = std::sync::mpsc::sync_channel(1);
    let (queued_both, queued_both_rx) = std::sync::mpsc::sync_channel(1);
    let (written_tx, written) = std::sync::mpsc::sync_channel(1);
    let probe = Arc::new(OrderProbe {
        in_phase: in_phase_tx,
        queued_both: Mutex::new(queued_both_rx),
        phases_run: Default::default(),
        upstream_conns: upstream_conns.clone(),
        written_before_second_phase: written_tx,
    });
    let opts = GatewayOptions {
        pipeline_factory: Arc::new(move |cfg, src| {
            let mut p: Pipeline = moat_proxy::build_pipeline(cfg, src)?;
            p.request_headers.push(probe.clone());
            Ok(p)
        }),
        ..GatewayOptions::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let yaml = basic_config(up, "");
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let dir_path = dir.path().to_path_buf();
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let gw = gateway(&dir_path, &yaml, opts).await;
            addr_tx.send(gw.listener_addr("main").unwrap()).unwrap();
            let _ = stop_rx.await;
            gw.shutdown(Duration::from_secs(1)).await;
        });
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let timeout = Some(Duration::from_secs(10));
    let mut holder = std::net::TcpStream::connect(addr).unwrap();
    let mut first = std::net::TcpStream::connect(addr).unwrap();
    let mut second = std::net::TcpStream::connect(addr).unwrap();
    for c in [&holder, &first, &second] {
        c.set_read_timeout(timeout).unwrap();
        c.set_nodelay(true).unwrap();
    }

    // One exchange on each connection: moat has accepted both, and their exchanges,
    // one after the other, leave one idle upstream connection in moat's pool.
    permits.grant(2);
    send_get(&mut first, "/warm", "0");
    read_ok(&mut first);
    send_get(&mut second, "/warm", "0");
    read_ok(&mut second);
    assert_eq!(upstream_conns.lock().len(), 1);

    send_get(&mut holder, "/hold", "hold");
    in_phase.recv_timeout(Duration::from_secs(10)).unwrap();
    send_get(&mut first, "/one", "1");
    send_get(&mut second, "/two", "2");
    // Loopback delivery can be left to a softirq thread on a busy machine: a request
    // is ready once it is in moat's receive queue.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for c in [&first, &second] {
        while unread_bytes(c.peer_addr().unwrap(), c.local_addr().unwrap()) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "a request never reached moat"
            );
            std::thread::yield_now();
        }
    }
    queued_both.send(()).unwrap();
    read_ok(&mut holder);
    let queued = written.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(
        !queued,
        "a request was written upstream before the other ready request's phases ran"
    );

    // Both are then forwarded and answered.
    permits.grant(100);
    read_ok(&mut first);
    read_ok(&mut second);
    stop_tx.send(()).unwrap();
    server.join().unwrap();
}
