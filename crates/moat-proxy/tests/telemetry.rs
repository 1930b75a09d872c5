//! Telemetry through the whole gateway, on real sockets: a WAF block reaches an HTTP
//! event sink and `/metrics` (per engine, rule, action and route; request and upstream
//! histograms; process metrics; sink counters), and sampled requests reach a real
//! OpenTelemetry Collector (built by scripts/ensure-otelcol) as spans, with the
//! W3C `traceparent` propagated upstream.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, gateway_from, get, json, send, upstream};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use moat_proxy::config;
use moat_proxy::events::QueueSink;
use moat_proxy::GatewayOptions;
use parking_lot::Mutex;

const SQLI: &str = "1%27%20UNION%20SELECT%20username%2C%20password%20FROM%20users--";

/// What `moat serve` does with the `events:` and `telemetry:` sections.
struct Running {
    gw: moat_proxy::RunningGateway,
    writer: Option<moat_events::EventWriter>,
    telemetry: Arc<moat_sinks::Telemetry>,
}

async fn start(dir: &Path, yaml: &str) -> Running {
    let file = dir.join("moat.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (cfg, src) = config::load_file(&file).unwrap();
    let telemetry = Arc::new(moat_sinks::Telemetry::start(&cfg.telemetry, &src.base_dir).unwrap());
    let metrics = telemetry.metrics().clone();
    let events =
        QueueSink::start_with_telemetry(&cfg.events, &src.base_dir, Some(&telemetry)).unwrap();
    let (sink, writer) = match events {
        Some((s, w)) => (Some(s as Arc<dyn moat_proxy::EventSink>), Some(w)),
        None => (None, None),
    };
    let opts = GatewayOptions {
        events: sink,
        telemetry: Some(telemetry.clone()),
        ..GatewayOptions::default()
    };
    let gw = gateway_from(cfg, src, opts).await;
    gw.shared()
        .metrics
        .add_renderer(Arc::new(move |out: &mut String| metrics.render(out)));
    Running {
        gw,
        writer,
        telemetry,
    }
}

/// A receiver for the HTTP sink: keeps every NDJSON line it is sent.
async fn receiver() -> (SocketAddr, Arc<Mutex<Vec<serde_json::Value>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let g = g.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let g = g.clone();
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        for l in String::from_utf8_lossy(&body).lines() {
                            g.lock().push(serde_json::from_str(l).unwrap());
                        }
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::new(),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    (addr, got)
}

fn base_yaml(up: SocketAddr, extra: &str) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{up}"]
routes:
  - name: api
    cluster: app
waf:
  enabled: true
  mode: block
{extra}"#
    )
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waf_block_reaches_the_sink_and_the_metrics() {
    let up = upstream("a").await;
    let (rx, got) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "telemetry:\n  sinks:\n    - name: siem\n      format: ocsf\n      records: [security, access]\n      http: {{ url: \"http://{rx}/ingest\" }}\n"
    );
    let run = start(dir.path(), &base_yaml(up.addr, &extra)).await;
    let addr = run.gw.listener_addr("main").unwrap();
    let c = client();
    let (s, _, _) = get(&c, &format!("http://{addr}/search?q={SQLI}")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _, _) = get(&c, &format!("http://{addr}/fine")).await;
    assert_eq!(s, StatusCode::OK);

    // The sink receives the finding and both access records.
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.lock().len() < 3 {
        assert!(Instant::now() < deadline, "sink got {:?}", got.lock());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let records = got.lock().clone();
    let finding = records.iter().find(|r| r["class_uid"] == 2004).unwrap();
    assert_eq!(finding["finding_info"]["analytic"]["uid"], "sqli");
    assert_eq!(finding["unmapped"]["route"], "api");
    assert_eq!(finding["action"], "Denied");
    let blocked = records
        .iter()
        .find(|r| r["class_uid"] == 4002 && r["http_response"]["code"] == 403)
        .unwrap();
    assert_eq!(blocked["activity_name"], "GET");

    let admin = run.gw.admin_addr();
    let (_, _, body) = get(&c, &format!("http://{admin}/metrics")).await;
    let text = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(
        metric(
            &text,
            "moat_security_events_total{route=\"api\",engine=\"waf\",rule=\"sqli\",action=\"block\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "moat_request_duration_seconds_count{route=\"api\"}"),
        Some(2.0)
    );
    // Only the allowed request reached the upstream.
    assert_eq!(
        metric(
            &text,
            "moat_upstream_latency_seconds_count{cluster=\"app\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "moat_upstream_endpoints{cluster=\"app\",state=\"healthy\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "moat_sink_delivered_total{sink=\"siem\"}"),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "moat_sink_dropped_total{sink=\"siem\"}"),
        Some(0.0)
    );
    assert!(metric(&text, "process_resident_memory_bytes").unwrap() > 1e6);
    assert!(metric(&text, "process_open_fds").unwrap() > 3.0);
    assert!(text.contains("moat_build_info{version=\""));
    // Every metric the Grafana dashboard queries exists.
    let dashboard = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/grafana/moat.json"),
    )
    .unwrap();
    let names: std::collections::BTreeSet<&str> = dashboard
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|t| t.starts_with("moat_") || t.starts_with("process_"))
        .collect();
    assert!(names.len() > 15, "{names:?}");
    for name in names {
        let family = name.strip_suffix("_bucket").unwrap_or(name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "the dashboard queries {name}, which /metrics does not have"
        );
    }
    // Tracing is off: no exporter series.
    assert!(!text.contains("sink=\"tracing\""));
    assert!(run.telemetry.tracer().is_none());
    drop(run.writer);
}

/// The collector: OTLP/HTTP on a free port, every span logged in detail to its stderr.
fn collector(dir: &Path) -> Option<(moat_testkit::ChildGuard, u16, std::path::PathBuf)> {
    let bin = moat_testkit::real_part("otelcol-moat", "scripts/ensure-otelcol")?;
    let port = moat_testkit::free_port().unwrap();
    let conf = dir.join("otelcol.yaml");
    std::fs::write(
        &conf,
        format!(
            r#"receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  debug:
    verbosity: detailed
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [debug]
"#
        ),
    )
    .unwrap();
    let log = dir.join("otelcol.log");
    let f = std::fs::File::create(&log).unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&conf)
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let guard = moat_testkit::ChildGuard(child);
    assert!(
        moat_testkit::wait_for_port(port, Duration::from_secs(30)),
        "the collector did not listen: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    Some((guard, port, log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampled_requests_reach_a_real_collector_and_traceparent_goes_upstream() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_collector, port, log)) = collector(dir.path()) else {
        return;
    };
    let up = upstream("a").await;
    // Ratio 0: only requests whose traceparent says "sampled" are traced.
    let extra = format!(
        "telemetry:\n  tracing:\n    enabled: true\n    sample_ratio: 0\n    endpoint: \"http://127.0.0.1:{port}/v1/traces\"\n    buffer: {{ retry_backoff: 20ms }}\n"
    );
    let run = start(dir.path(), &base_yaml(up.addr, &extra)).await;
    let addr = run.gw.listener_addr("main").unwrap();
    let c = client();
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let sampled = format!("00-{trace_id}-00f067aa0ba902b7-01");
    let req = Request::get(format!("http://{addr}/traced"))
        .header("traceparent", &sampled)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, _, body) = send(&c, req).await;
    assert_eq!(s, StatusCode::OK);
    // The upstream sees the same trace, with moat's client span as the parent.
    let seen = json(&body)["headers"]["traceparent"]
        .as_str()
        .unwrap()
        .to_string();
    let seen_parent = moat_sinks::trace::parse_traceparent(seen.as_bytes()).unwrap();
    assert!(
        seen.starts_with(&format!("00-{trace_id}-")) && seen.ends_with("-01"),
        "{seen}"
    );
    assert_ne!(seen, sampled);
    // A blocked request of the same trace carries the decision.
    let req = Request::get(format!("http://{addr}/search?q={SQLI}"))
        .header("traceparent", &sampled)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, _, _) = send(&c, req).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // Not sampled by the caller: not traced, and its header goes upstream unchanged.
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let req = Request::get(format!("http://{addr}/quiet"))
        .header("traceparent", unsampled)
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (_, _, body) = send(&c, req).await;
    assert_eq!(json(&body)["headers"]["traceparent"], unsampled);

    let client_span = hex(&seen_parent.parent_id);
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("moat.security_event") && text.contains(&client_span) {
            break text;
        }
        assert!(Instant::now() < deadline, "spans not received: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(text.contains(trace_id), "{text}");
    // The server span's parent is the caller's span.
    assert!(text.contains("00f067aa0ba902b7"), "{text}");
    for name in ["GET api", "moat.request_headers", "GET upstream"] {
        assert!(text.contains(name), "{name} missing: {text}");
    }
    for attr in [
        "moat.rule: Str(sqli)",
        "moat.engine: Str(waf)",
        "moat.action: Str(block)",
        "http.response.status_code: Int(403)",
        "http.route: Str(api)",
    ] {
        assert!(text.contains(attr), "{attr} missing: {text}");
    }
    assert!(
        !text.contains("0af7651916cd43dd8448eb211c80319c"),
        "an unsampled trace was exported"
    );
    let tracer = run.telemetry.tracer().unwrap();
    assert_eq!(
        tracer
            .stats()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A request to `path`, without `traceparent`.
async fn get_path(c: &common::TestClient, addr: SocketAddr, path: &str) {
    let req = Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, _, _) = send(c, req).await;
    assert_eq!(s, StatusCode::OK);
}

/// Waits until the collector has logged `needle`.
async fn collector_saw(log: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(Instant::now() < deadline, "{needle} not received: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_sampling_and_turns_tracing_off() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_collector, port, log)) = collector(dir.path()) else {
        return;
    };
    let up = upstream("a").await;
    let tracing = |ratio: &str, enabled: bool| {
        format!(
            "telemetry:\n  tracing:\n    enabled: {enabled}\n    sample_ratio: {ratio}\n    endpoint: \"http://127.0.0.1:{port}/v1/traces\"\n    buffer: {{ retry_backoff: 20ms }}\n"
        )
    };
    let run = start(dir.path(), &base_yaml(up.addr, &tracing("0", true))).await;
    let addr = run.gw.listener_addr("main").unwrap();
    let c = client();
    get_path(&c, addr, "/before-reload").await;
    let before = Arc::downgrade(&run.telemetry.tracer().unwrap());

    // Ratio 1: every new trace is sampled, on the same keep-alive connection too.
    let file = dir.path().join("moat.yaml");
    std::fs::write(&file, base_yaml(up.addr, &tracing("1", true))).unwrap();
    run.gw.shared().reload_from_file().unwrap();
    get_path(&c, addr, "/after-reload").await;
    collector_saw(&log, "/after-reload").await;
    // The old tracer goes with the last connection that held its snapshot.
    drop(c);
    gone(before, "the replaced tracer").await;

    // Off: no tracer, no exporter series; the last tracer stops.
    let last = Arc::downgrade(&run.telemetry.tracer().unwrap());
    std::fs::write(&file, base_yaml(up.addr, &tracing("1", false))).unwrap();
    run.gw.shared().reload_from_file().unwrap();
    assert!(run.telemetry.tracer().is_none());
    let c = client();
    get_path(&c, addr, "/after-off").await;
    drop(c);
    gone(last, "the tracer turned off").await;
    let c = client();
    let admin = run.gw.admin_addr();
    let (_, _, text) = get(&c, &format!("http://{admin}/metrics")).await;
    assert!(!String::from_utf8_lossy(&text).contains("sink=\"tracing\""));
    // Give a wrongly exported span time to arrive, then check none did.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("/before-reload"), "{text}");
    assert!(!text.contains("/after-off"), "{text}");
}

/// Waits until nothing holds `t` any more.
async fn gone(t: std::sync::Weak<moat_sinks::Tracer>, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while t.upgrade().is_some() {
        assert!(Instant::now() < deadline, "{what} is still alive");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
