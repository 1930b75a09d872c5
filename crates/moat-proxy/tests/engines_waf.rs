//! The WAF wired from the gateway config, through real sockets: block pages (JSON and
//! HTML) with event ids, request bodies, benign traffic, monitor mode and route-level
//! exclusions, with the security events checked at the event sink.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{client, gateway, json, send};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use moat_core::{Connection, EventAction, HandshakeRecord, RequestCtx, SecurityEvent};
use moat_proxy::events::{AccessInfo, EventSink};
use moat_proxy::GatewayOptions;
use parking_lot::Mutex;

/// An echo upstream counting the requests it answered.
struct Up {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl Up {
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn echo_upstream() -> Up {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let h = h.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let h = h.clone();
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        let uri = req.uri().to_string();
                        let got = req.into_body().collect().await.unwrap();
                        let trailers: serde_json::Map<String, serde_json::Value> = got
                            .trailers()
                            .into_iter()
                            .flatten()
                            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").into()))
                            .collect();
                        let body = got.to_bytes();
                        let v = serde_json::json!({
                            "uri": uri,
                            "body": String::from_utf8_lossy(&body),
                            "trailers": trailers,
                        });
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(v.to_string())))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Up { addr, hits }
}

/// Keeps every security event with its request id and route.
#[derive(Default)]
struct Sink {
    security: Mutex<Vec<(String, String, SecurityEvent)>>,
}

impl Sink {
    fn events_of(&self, request_id: &str) -> Vec<SecurityEvent> {
        self.security
            .lock()
            .iter()
            .filter(|(rid, _, _)| rid == request_id)
            .map(|(_, _, e)| e.clone())
            .collect()
    }
}

impl EventSink for Sink {
    fn access(&self, _info: &AccessInfo<'_>) -> bool {
        true
    }
    fn security(&self, ctx: &RequestCtx, event: &SecurityEvent, _m: &Method, _p: &str) -> bool {
        self.security
            .lock()
            .push((ctx.request_id.clone(), ctx.route.to_string(), event.clone()));
        true
    }
    fn tls(&self, _conn: &Connection, _hs: &HandshakeRecord) -> bool {
        true
    }
}

const SQLI: &str = "1%27%20UNION%20SELECT%20username%2C%20password%20FROM%20users--";

fn yaml(up: SocketAddr) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{up}"]
routes:
  - name: cms
    path_prefix: /cms
    cluster: app
  - name: legacy
    path_prefix: /legacy
    cluster: app
  - name: all
    cluster: app
waf:
  enabled: true
  mode: block
  routes:
    legacy: {{ mode: monitor }}
  exclusions:
    - route: cms
      location: "query:q"
      detector: sqli
"#
    )
}

fn get_req(url: String, accept: &str, request_id: &str) -> Request<Full<Bytes>> {
    Request::get(url)
        .header("accept", accept)
        .header("x-request-id", request_id)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

async fn start() -> (
    Up,
    Arc<Sink>,
    moat_proxy::RunningGateway,
    SocketAddr,
    tempfile::TempDir,
) {
    let up = echo_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    let gw = gateway(dir.path(), &yaml(up.addr), opts).await;
    let addr = gw.listener_addr("main").unwrap();
    (up, sink, gw, addr, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqli_in_query_is_blocked_with_json_or_html_page_and_never_forwarded() {
    let (up, sink, gw, addr, _dir) = start().await;
    let c = client();

    let (s, h, body) = send(
        &c,
        get_req(
            format!("http://{addr}/search?q={SQLI}"),
            "application/json",
            "waf-json-1",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body:?}");
    assert!(h["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    let v = json(&body);
    assert_eq!(v["status"], 403);
    assert_eq!(v["request_id"], "waf-json-1");
    let event_id = v["event_id"].as_str().expect("event id").to_string();
    assert!(!event_id.is_empty());
    let events = sink.events_of("waf-json-1");
    let ev = events
        .iter()
        .find(|e| e.id == event_id)
        .unwrap_or_else(|| panic!("the page's event id is not in the sink: {events:?}"));
    assert_eq!(ev.engine, "waf");
    assert_eq!(ev.rule, "sqli");
    assert_eq!(ev.action, EventAction::Block);
    assert_eq!(ev.location.as_deref(), Some("query:q"));
    assert_eq!(
        up.hits(),
        0,
        "a blocked request must not reach the upstream"
    );

    // HTML when the client does not ask for JSON.
    let (s, h, body) = send(
        &c,
        get_req(
            format!("http://{addr}/search?q={SQLI}"),
            "text/html",
            "waf-html-1",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(h["content-type"].to_str().unwrap().starts_with("text/html"));
    let html = String::from_utf8_lossy(&body);
    let ev = sink
        .events_of("waf-html-1")
        .into_iter()
        .find(|e| e.action == EventAction::Block)
        .expect("block event");
    assert!(
        html.contains(&format!("Event id: <code>{}</code>", ev.id)),
        "{html}"
    );
    assert!(html.contains("waf-html-1"), "{html}");
    assert_eq!(up.hits(), 0);

    // Benign traffic passes.
    let (s, _, body) = send(
        &c,
        get_req(
            format!("http://{addr}/search?q=blue+shoes&page=2"),
            "application/json",
            "benign-1",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body:?}");
    assert_eq!(json(&body)["uri"], "/search?q=blue+shoes&page=2");
    assert_eq!(up.hits(), 1);
    assert!(sink.events_of("benign-1").is_empty());
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xss_in_json_body_is_blocked_and_benign_json_passes() {
    let (up, sink, gw, addr, _dir) = start().await;
    let c = client();
    let post = |body: &str, rid: &str| {
        Request::post(format!("http://{addr}/comments"))
            .header("content-type", "application/json")
            .header("accept", "application/json")
            .header("x-request-id", rid)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap()
    };

    let attack =
        r#"{"post": 7, "comment": {"text": "<img src=x onerror=alert(document.cookie)>"}}"#;
    let (s, _, body) = send(&c, post(attack, "xss-1")).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{body:?}");
    let v = json(&body);
    let ev = sink
        .events_of("xss-1")
        .into_iter()
        .find(|e| e.action == EventAction::Block)
        .expect("block event");
    assert_eq!(v["event_id"], ev.id.as_str());
    assert_eq!(ev.rule, "xss");
    assert_eq!(ev.location.as_deref(), Some("json:/comment/text"));
    assert_eq!(up.hits(), 0, "a blocked body must not reach the upstream");

    let benign =
        r#"{"post": 7, "comment": {"text": "Great product, <3 it. Would buy again & again!"}}"#;
    let (s, _, body) = send(&c, post(benign, "benign-json")).await;
    assert_eq!(s, StatusCode::OK, "{body:?}");
    assert_eq!(json(&body)["body"], benign);
    assert_eq!(up.hits(), 1);
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_route_forwards_and_reports_a_monitor_event() {
    let (up, sink, gw, addr, _dir) = start().await;
    let c = client();
    let (s, _, body) = send(
        &c,
        get_req(
            format!("http://{addr}/legacy/search?q={SQLI}"),
            "application/json",
            "monitor-1",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body:?}");
    assert_eq!(up.hits(), 1);
    let events = sink.events_of("monitor-1");
    assert!(
        events
            .iter()
            .any(|e| e.engine == "waf" && e.rule == "sqli" && e.action == EventAction::Monitor),
        "{events:?}"
    );
    assert!(
        events.iter().all(|e| e.action != EventAction::Block),
        "{events:?}"
    );
    let routes: Vec<String> = sink
        .security
        .lock()
        .iter()
        .filter(|(rid, _, _)| rid == "monitor-1")
        .map(|(_, r, _)| r.clone())
        .collect();
    assert!(routes.iter().all(|r| r == "legacy"), "{routes:?}");
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_exclusion_skips_only_that_location_and_detector() {
    let (up, sink, gw, addr, _dir) = start().await;
    let c = client();

    // Excluded: route cms, query:q, sqli.
    let (s, _, body) = send(
        &c,
        get_req(
            format!("http://{addr}/cms/search?q={SQLI}"),
            "application/json",
            "excl-1",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body:?}");
    assert_eq!(up.hits(), 1);
    assert!(
        sink.events_of("excl-1")
            .iter()
            .all(|e| e.action != EventAction::Block),
        "{:?}",
        sink.events_of("excl-1")
    );

    // Another parameter on the same route is still inspected.
    let (s, _, _) = send(
        &c,
        get_req(
            format!("http://{addr}/cms/search?id={SQLI}"),
            "application/json",
            "excl-2",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Another detector on the excluded location is still applied.
    let (s, _, _) = send(
        &c,
        get_req(
            format!("http://{addr}/cms/search?q=%3Cscript%3Ealert(1)%3C%2Fscript%3E"),
            "application/json",
            "excl-3",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // The exclusion is scoped to its route.
    let (s, _, _) = send(
        &c,
        get_req(
            format!("http://{addr}/search?q={SQLI}"),
            "application/json",
            "excl-4",
        ),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(up.hits(), 1);
    gw.shutdown(Duration::from_secs(2)).await;
}

/// A gateway with one catch-all route and the given `waf:` mode and route flags.
async fn start_with(
    mode: &str,
    monitor_only_route: bool,
) -> (Up, Arc<Sink>, moat_proxy::RunningGateway, tempfile::TempDir) {
    let up = echo_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    let yaml = format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{}"]
routes:
  - name: all
    cluster: app
    monitor_only: {monitor_only_route}
waf:
  enabled: true
  mode: {mode}
"#,
        up.addr
    );
    let gw = gateway(dir.path(), &yaml, opts).await;
    (up, sink, gw, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_monitor_mode_and_monitor_only_route_forward_attacks_with_monitor_events() {
    for (mode, monitor_only) in [("monitor", false), ("block", true)] {
        let (up, sink, gw, _dir) = start_with(mode, monitor_only).await;
        let addr = gw.listener_addr("main").unwrap();
        let c = client();
        let rid = format!("mon-{mode}-{monitor_only}");
        let (s, _, body) = send(
            &c,
            get_req(
                format!("http://{addr}/search?q={SQLI}"),
                "application/json",
                &rid,
            ),
        )
        .await;
        assert_eq!(
            s,
            StatusCode::OK,
            "mode {mode}, monitor_only {monitor_only}: {body:?}"
        );
        assert_eq!(up.hits(), 1);
        let events = sink.events_of(&rid);
        assert!(
            events
                .iter()
                .any(|e| e.engine == "waf" && e.rule == "sqli" && e.action == EventAction::Monitor),
            "mode {mode}, monitor_only {monitor_only}: {events:?}"
        );
        assert!(
            events.iter().all(|e| e.action != EventAction::Block),
            "{events:?}"
        );
        gw.shutdown(Duration::from_secs(2)).await;
    }
}

/// A request body of frames given in advance, with no length known to the client.
type FramesBody =
    StreamBody<futures_util::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Infallible>>>>;

/// An HTTP/2 client (prior knowledge, as a gRPC or service-mesh client connects).
fn h2_client() -> hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    FramesBody,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// A POST over HTTP/2 whose body is `frames`: no length is known in advance, so none
/// is sent, and trailers can follow the data.
fn h2_post(
    url: String,
    rid: &str,
    fields: &[(&str, &str)],
    frames: Vec<Frame<Bytes>>,
) -> Request<FramesBody> {
    let mut req = Request::post(url)
        .header("accept", "application/json")
        .header("x-request-id", rid);
    for (n, v) in fields {
        req = req.header(*n, *v);
    }
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = frames.into_iter().map(Ok).collect();
    req.body(StreamBody::new(futures_util::stream::iter(frames)))
        .unwrap()
}

const XSS_BODY: &str =
    r#"{"post": 7, "comment": {"text": "<img src=x onerror=alert(document.cookie)>"}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_body_without_type_or_length_is_inspected() {
    // HTTP/2 announces a body by its framing alone: no field says there is one. The
    // WAF once inspected an untyped body only when `Content-Length` or
    // `Transfer-Encoding` was present, so such a stream went through unread.
    let (up, sink, gw, addr, _dir) = start().await;
    let c = h2_client();
    for (i, body) in [
        XSS_BODY,
        "id=1' UNION SELECT username, password FROM users--",
    ]
    .into_iter()
    .enumerate()
    {
        let rid = format!("h2-untyped-{i}");
        let frames = vec![Frame::data(Bytes::from(body))];
        let resp = c
            .request(h2_post(
                format!("http://{addr}/comments"),
                &rid,
                &[],
                frames,
            ))
            .await
            .unwrap();
        assert_eq!(resp.version(), http::Version::HTTP_2);
        assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{body}");
        assert!(
            sink.events_of(&rid)
                .iter()
                .any(|e| e.action == EventAction::Block),
            "{body}"
        );
    }
    assert_eq!(
        up.hits(),
        0,
        "an attack in an untyped body reached the upstream"
    );
    let frames = vec![Frame::data(Bytes::from(r#"{"comment": "fine"}"#))];
    let resp = c
        .request(h2_post(
            format!("http://{addr}/comments"),
            "h2-fine",
            &[],
            frames,
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(up.hits(), 1);
    gw.shutdown(Duration::from_secs(2)).await;
}

/// Writes an HTTP/1.1 request and returns the status and body of the answer.
async fn h1_raw(addr: SocketAddr, request: String) -> (u16, serde_json::Value) {
    let answer = common::exchange(addr, request.as_bytes()).await;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    (status, serde_json::from_str(body).unwrap_or_default())
}

/// A chunked HTTP/1.1 POST of `body` with one trailer field.
fn chunked_with_trailer(rid: &str, content_type: &str, body: &str, trailer: &str) -> String {
    format!(
        "POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept: application/json\r\n\
         X-Request-Id: {rid}\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\n\r\n\
         {:x}\r\n{body}\r\n0\r\n{trailer}\r\n\r\n",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailer_fields_are_inspected_before_forwarding_or_dropped() {
    // A backend that merges trailers into its header section reads a trailer field as
    // a header. The WAF reads the trailers of a body moat reads whole before any of it
    // goes on; those of a streamed body come after it went on and are dropped.
    let (up, sink, gw, addr, _dir) = start().await;
    let attack = "User-Agent: <script>alert(document.cookie)</script>";
    let json = "application/json";

    // Read whole (the WAF parses JSON): an attack in a trailer blocks the request...
    let (status, v) = h1_raw(addr, chunked_with_trailer("tr-1", json, "{}", attack)).await;
    assert_eq!(status, 403, "{v}");
    let ev = sink
        .events_of("tr-1")
        .into_iter()
        .find(|e| e.action == EventAction::Block)
        .expect("block event");
    assert_eq!(v["event_id"], ev.id.as_str());
    assert_eq!(ev.location.as_deref(), Some("header:user-agent"));
    assert_eq!(up.hits(), 0, "a blocked request reached the upstream");
    // ... and a benign one reaches the upstream with its trailer.
    let (status, v) = h1_raw(
        addr,
        chunked_with_trailer("tr-2", json, "{}", "X-Checksum: abc"),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["trailers"], serde_json::json!({"x-checksum": "abc"}));

    // Streamed (a binary body: the WAF does not read it): the trailers go, the body
    // arrives. (A control byte first: a NUL followed by text would be UTF-16 text.)
    let octets = "application/octet-stream";
    let long = format!("\x01{}", "b".repeat(4000));
    for (rid, trailer, body) in [
        ("tr-3", "X-Checksum: abc", "\x01bc"),
        ("tr-4", attack, "\x01bc"),
        ("tr-4b", attack, long.as_str()),
    ] {
        let (status, v) = h1_raw(addr, chunked_with_trailer(rid, octets, body, trailer)).await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["body"], body);
        assert_eq!(v["trailers"], serde_json::json!({}), "{trailer}");
    }

    // The same over HTTP/2, where a stream ends with a trailer section.
    let c = h2_client();
    let trailers = |name: &'static str, value: &'static str| {
        let mut t = http::HeaderMap::new();
        t.insert(name, http::HeaderValue::from_static(value));
        Frame::trailers(t)
    };
    let send = |rid: &'static str, ct: &'static str, t: Frame<Bytes>| {
        let body = if ct == json {
            Bytes::from_static(b"{}")
        } else {
            Bytes::from(long.clone())
        };
        let frames = vec![Frame::data(body), t];
        c.request(h2_post(
            format!("http://{addr}/upload"),
            rid,
            &[("content-type", ct)],
            frames,
        ))
    };
    let xss = "<script>alert(document.cookie)</script>";
    let resp = send("tr-5", json, trailers("user-agent", xss))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = send("tr-6", json, trailers("x-checksum", "abc"))
        .await
        .unwrap();
    let v = common::json(&resp.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(v["trailers"], serde_json::json!({"x-checksum": "abc"}));
    let resp = send("tr-7", octets, trailers("user-agent", xss))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let v = common::json(&resp.into_body().collect().await.unwrap().to_bytes());
    assert_eq!(v["trailers"], serde_json::json!({}));
    assert_eq!(up.hits(), 6, "tr-2, tr-3, tr-4, tr-4b, tr-6 and tr-7");
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_type_with_a_structured_suffix_is_parsed() {
    // `application/*+json` is JSON to Spring and to the WAF's body parsers; the body
    // phase once skipped it for naming an octet stream or protobuf.
    let (up, _sink, gw, addr, _dir) = start().await;
    let c = client();
    for ct in [
        "application/octet-stream+json",
        "application/vnd.google.protobuf+json",
    ] {
        let req = Request::post(format!("http://{addr}/comments"))
            .header("content-type", ct)
            .body(Full::new(Bytes::from(XSS_BODY)))
            .unwrap();
        let (s, _, _) = send(&c, req).await;
        assert_eq!(s, StatusCode::FORBIDDEN, "{ct}");
    }
    assert_eq!(up.hits(), 0);
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_uploads_pass_whatever_else_buffers_them() {
    // The WAF streams the types it does not parse. Secret detection buffers every body
    // (up to its own 1 MiB): the WAF must then leave a binary body alone as it does when
    // it is the only engine, not read its first MiB as a truncated text body and block.
    let up = echo_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = yaml(up.addr).replace(
        "  - name: all\n    cluster: app\n",
        "  - name: all\n    cluster: app\n    body: { max_bytes: 16MiB }\n",
    ) + "secrets: { enabled: true }\n";
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let png: Vec<u8> = b"\x89PNG\r\n\x1a\n"
        .iter()
        .copied()
        .chain((0..3u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8))
        .collect();
    for ct in ["image/png", "application/octet-stream"] {
        let req = Request::post(format!("http://{addr}/upload"))
            .header("content-type", ct)
            .body(Full::new(Bytes::from(png.clone())))
            .unwrap();
        let (s, _, body) = send(&c, req).await;
        assert_eq!(
            s,
            StatusCode::OK,
            "{ct}: {:?}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        );
    }
    assert_eq!(up.hits(), 2);
    gw.shutdown(Duration::from_secs(2)).await;
}

const SQLI_JSON: &str = r#"{"id": "1' UNION SELECT username, password FROM users--"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_declared_binary_is_read_when_it_is_text() {
    // Go's `json.NewDecoder(r.Body)` and Flask's `get_json(force=True)` parse a body
    // whatever its declared type. Bodies declared binary were streamed unread, so an
    // attack in JSON or a form labelled `application/octet-stream` reached such a
    // backend. A body whose first bytes are text is now read as one with no type.
    let (up, sink, gw, addr, _dir) = start().await;
    let c = client();
    let sqli_form = "id=1' UNION SELECT username, password FROM users--";
    for ct in [
        "application/octet-stream",
        "image/png",
        "video/mp4",
        "audio/mpeg",
    ] {
        for body in [SQLI_JSON, sqli_form, XSS_BODY] {
            let req = Request::post(format!("http://{addr}/api"))
                .header("content-type", ct)
                .body(Full::new(Bytes::from(body)))
                .unwrap();
            let (s, _, _) = send(&c, req).await;
            assert_eq!(s, StatusCode::FORBIDDEN, "{ct}: {body}");
        }
    }
    // JSON in UTF-16 or UTF-32 without a byte order mark has a NUL beside every ASCII
    // character; Python's `json.loads` (so Flask) reads it by RFC 4627's rule all the same.
    let utf16: Vec<u8> = SQLI_JSON
        .encode_utf16()
        .flat_map(u16::to_le_bytes)
        .collect();
    let utf32: Vec<u8> = SQLI_JSON
        .chars()
        .flat_map(|c| u32::from(c).to_be_bytes())
        .collect();
    for wide in [utf16, utf32] {
        let req = Request::post(format!("http://{addr}/api"))
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::from(wide)))
            .unwrap();
        let (s, _, _) = send(&c, req).await;
        assert_eq!(s, StatusCode::FORBIDDEN);
    }
    // Sent a byte at a time, the first byte is all moat has seen when it decides
    // whether to buffer: it is text, so the body is read whole.
    let h2 = h2_client();
    let frames: Vec<Frame<Bytes>> = SQLI_JSON
        .as_bytes()
        .chunks(1)
        .map(|b| Frame::data(Bytes::copy_from_slice(b)))
        .collect();
    let resp = h2
        .request(h2_post(
            format!("http://{addr}/api"),
            "h2-octets",
            &[("content-type", "application/octet-stream")],
            frames,
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    assert!(sink
        .events_of("h2-octets")
        .iter()
        .any(|e| e.action == EventAction::Block));
    let chunked = format!(
        "POST /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAccept: application/json\r\n\
         Content-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
         1\r\n{{\r\n{:x}\r\n{}\r\n0\r\n\r\n",
        SQLI_JSON.len() - 1,
        &SQLI_JSON[1..]
    );
    let (status, _) = h1_raw(addr, chunked).await;
    assert_eq!(status, 403);
    assert_eq!(
        up.hits(),
        0,
        "an attack in a body declared binary was forwarded"
    );
    // Text that is no attack goes through as it was sent, and so does a binary body
    // carrying the same attack text after a binary byte (no JSON or form parser reads
    // it): streamed unread, as uploads are.
    let csv = "id,name\n1,O'Brien\n2,\"Smith, J\"\n";
    let binary = [&b"\x00\x01"[..], SQLI_JSON.as_bytes()].concat();
    for (body, expect) in [
        (csv.as_bytes(), csv.to_string()),
        (&binary[..], String::from_utf8_lossy(&binary).into_owned()),
    ] {
        let req = Request::post(format!("http://{addr}/api"))
            .header("content-type", "application/octet-stream")
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap();
        let (s, _, answer) = send(&c, req).await;
        assert_eq!(s, StatusCode::OK);
        let echoed: serde_json::Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(echoed["body"], expect);
    }
    assert_eq!(up.hits(), 2);
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_upload_is_streamed_not_held_back() {
    // Reading text bodies declared binary must not hold back real uploads: the
    // upstream gets the first bytes of a binary body before the client sends the rest.
    // (A client that waits for them, as a streaming protocol does, would otherwise wait
    // for its own body's end.)
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let (first_tx, mut first_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let svc = service_fn(move |req: Request<Incoming>| {
            let first_tx = first_tx.clone();
            async move {
                let mut body = req.into_body();
                let mut total = 0;
                while let Some(frame) = body.frame().await {
                    if let Ok(d) = frame.unwrap().into_data() {
                        if total == 0 {
                            let _ = first_tx.send(d.len());
                        }
                        total += d.len();
                    }
                }
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(total.to_string()))))
            }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tcp), svc)
            .await;
    });
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &yaml(up), GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let first: Vec<u8> = b"\x89PNG\r\n\x1a\n"
        .iter()
        .copied()
        .chain(0..=255u8)
        .collect();
    let head = "POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
                Content-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(format!("{:x}\r\n", first.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(&first).await.unwrap();
    s.write_all(b"\r\n").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), first_rx.recv())
        .await
        .expect("the upload's first bytes did not reach the upstream before its end");
    assert!(got.is_some_and(|n| n > 0));
    s.write_all(b"5\r\nIEND!\r\n0\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(&(first.len() + 5).to_string()), "{answer}");
    gw.shutdown(Duration::from_secs(2)).await;
}
