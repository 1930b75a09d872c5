//! API discovery and the event store wired from the gateway config, through real
//! sockets: `GET /v1/apis` lists the templated endpoint with request and response
//! schemas (never values), and `GET /v1/events?type=waf` returns a WAF block event
//! written by the events writer.
// Test helpers: a failed setup step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, gateway_from, get, json, send, TestClient};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use moat_proxy::admin::AdminRouter;
use moat_proxy::config;
use moat_proxy::events::QueueSink;
use moat_proxy::GatewayOptions;

/// A JSON API: `GET|PUT /users/{n}` answers a user document.
async fn users_api() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let id: u64 = req
                        .uri()
                        .path()
                        .rsplit('/')
                        .next()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    let _ = req.into_body().collect().await;
                    let v = serde_json::json!({
                        "id": id,
                        "name": "Alice Liddell",
                        "active": true,
                        "score": 4.5,
                        "tags": ["vip", "beta"],
                    });
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(v.to_string())))
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    addr
}

fn yaml(up: SocketAddr, extra: &str) -> String {
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
{extra}"#
    )
}

/// Starts the gateway the way `moat serve` does: events writer from the config, engine
/// admin routes with the store path.
async fn start(
    dir: &std::path::Path,
    yaml: &str,
) -> (moat_proxy::RunningGateway, Option<moat_events::EventWriter>) {
    let file = dir.join("moat.yaml");
    std::fs::write(&file, yaml).unwrap();
    let (cfg, src) = config::load_file(&file).unwrap();
    let events = QueueSink::start_if_enabled(&cfg.events, &src.base_dir).unwrap();
    let (sink, writer) = match events {
        Some((s, w)) => (Some(s as Arc<dyn moat_proxy::EventSink>), Some(w)),
        None => (None, None),
    };
    let store = writer
        .as_ref()
        .and_then(|w| w.store_path())
        .map(|p| p.to_path_buf());
    let opts = GatewayOptions {
        events: sink,
        admin: moat_proxy::engine_api::engine_routes(AdminRouter::new(), store),
        ..GatewayOptions::default()
    };
    (gateway_from(cfg, src, opts).await, writer)
}

/// Polls `GET url` on the admin listener until `f` accepts the JSON (20 s at most).
async fn poll_json(
    c: &TestClient,
    url: &str,
    mut f: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (s, _, body) = get(c, url).await;
        assert_eq!(s, StatusCode::OK, "{body:?}");
        let v = json(&body);
        if f(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "never satisfied: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_the_templated_endpoint_with_schemas_and_no_values() {
    let up = users_api().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = r#"discovery:
  enabled: true
  sample_interval: 0s
  inventory: apis.db
  flush_interval: 1s
"#;
    let (gw, _writer) = start(dir.path(), &yaml(up, extra)).await;
    let addr = gw.listener_addr("main").unwrap();
    let admin = gw.admin_addr();
    let c = client();

    for id in [17, 42, 1234] {
        let req = Request::get(format!(
            "http://{addr}/users/{id}?fields=name&secret_q=hunter2"
        ))
        .header("x-client-version", "7.1.0")
        .body(Full::new(Bytes::new()))
        .unwrap();
        let (s, _, _) = send(&c, req).await;
        assert_eq!(s, StatusCode::OK);
        let req = Request::put(format!("http://{addr}/users/{id}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                r#"{"name":"Bob Sponge","age":33,"email":"bob.sponge@example.org"}"#,
            )))
            .unwrap();
        let (s, _, _) = send(&c, req).await;
        assert_eq!(s, StatusCode::OK);
    }

    let url = format!("http://{admin}/v1/apis");
    let find = |v: &serde_json::Value, method: &str| -> Option<serde_json::Value> {
        v["endpoints"]
            .as_array()?
            .iter()
            .find(|e| e["method"] == method && e["path"] == "/users/{id}")
            .cloned()
    };
    let v = poll_json(&c, &url, |v| {
        let ready = |m: &str, n: u64| {
            find(v, m).is_some_and(|e| {
                e["count"].as_u64() == Some(n)
                    && e["responses"]["200"].get("body").is_some()
                    && (m != "PUT" || e["request"].get("body").is_some())
            })
        };
        ready("GET", 3) && ready("PUT", 3)
    })
    .await;

    let text = v.to_string();
    for value in [
        "Alice Liddell",
        "Bob Sponge",
        "bob.sponge@example.org",
        "hunter2",
        "7.1.0",
        "/users/17",
        "/users/42",
    ] {
        assert!(
            !text.contains(value),
            "the inventory holds a value ({value}): {text}"
        );
    }
    let paths: Vec<&str> = v["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(paths.iter().all(|p| *p == "/users/{id}"), "{paths:?}");

    let get_ep = find(&v, "GET").unwrap();
    assert_eq!(get_ep["route"], "api");
    // Query: record {key: [values]} of strings.
    let query = &get_ep["request"]["query"][0];
    assert!(query.get("fields").is_some(), "{get_ep}");
    assert!(query.get("secret_q").is_some(), "{get_ep}");
    assert!(get_ep["request"]["headers"][0]
        .get("x-client-version")
        .is_some());
    // Response body: the JSON schema (4 integer, 8 string, 2 boolean, 16 real).
    let resp = &get_ep["responses"]["200"];
    assert!(
        resp["content_types"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "application/json"),
        "{resp}"
    );
    let body = &resp["body"][0];
    assert_eq!(body["id"], serde_json::json!([4]), "{resp}");
    assert_eq!(body["name"][0], 8, "{resp}");
    assert_eq!(body["active"], serde_json::json!([2]), "{resp}");
    assert_eq!(body["score"], serde_json::json!([16]), "{resp}");
    assert_eq!(body["tags"][0][0], serde_json::json!([8]), "{resp}");

    let put_ep = find(&v, "PUT").unwrap();
    let req_body = &put_ep["request"]["body"][0];
    assert_eq!(req_body["age"], serde_json::json!([4]), "{put_ep}");
    assert_eq!(req_body["name"][0], 8, "{put_ep}");
    assert_eq!(req_body["email"][0], 8, "{put_ep}");
    // The e-mail field is flagged as sensitive by its type, not by its value.
    let sensitive = put_ep["sensitive"].to_string();
    assert!(sensitive.contains("/email"), "{put_ep}");
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waf_block_event_is_served_by_the_events_api_after_the_batch_interval() {
    let up = users_api().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = r#"waf:
  enabled: true
  mode: block
events:
  store:
    path: store/events.db
    batch_interval: 100ms
"#;
    let (gw, writer) = start(dir.path(), &yaml(up, extra)).await;
    assert!(
        writer.is_some(),
        "the events writer must start with a store"
    );
    let addr = gw.listener_addr("main").unwrap();
    let admin = gw.admin_addr();
    let c = client();

    // Benign request first: an access record, no WAF event.
    let (s, _, _) = get(&c, &format!("http://{addr}/users/1")).await;
    assert_eq!(s, StatusCode::OK);

    let req = Request::get(format!(
        "http://{addr}/users/1?sort=1%27%20UNION%20SELECT%20password%20FROM%20users--"
    ))
    .header("accept", "application/json")
    .header("x-request-id", "evt-req-1")
    .body(Full::new(Bytes::new()))
    .unwrap();
    let (s, _, body) = send(&c, req).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let event_id = json(&body)["event_id"].as_str().unwrap().to_string();

    let url = format!("http://{admin}/v1/events?type=waf&since=1h");
    let v = poll_json(&c, &url, |v| v["count"].as_u64().unwrap_or(0) >= 1).await;
    let events = v["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "only the block is a WAF event: {v}");
    let e = &events[0];
    let text = e.to_string();
    assert!(text.contains(&event_id), "{e}");
    assert!(text.contains("evt-req-1"), "{e}");
    assert!(text.contains("\"block\""), "{e}");
    assert!(text.contains("sqli"), "{e}");
    assert_eq!(e["route"], "api", "{e}");

    // Filters: action=block finds it, type=secrets does not, a bad parameter is a 400.
    let (s, _, body) = get(
        &c,
        &format!("http://{admin}/v1/events?type=waf&action=block"),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&body)["count"], 1);
    let (s, _, body) = get(&c, &format!("http://{admin}/v1/events?type=secrets")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&body)["count"], 0);
    let (s, _, _) = get(&c, &format!("http://{admin}/v1/events?bogus=1")).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Access records are stored too (store.access defaults to true).
    let v = poll_json(&c, &format!("http://{admin}/v1/events?type=access"), |v| {
        v["count"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    assert_eq!(v["count"], 2, "{v}");

    gw.shutdown(Duration::from_secs(2)).await;
    if let Some(w) = writer {
        w.shutdown();
    }
}
