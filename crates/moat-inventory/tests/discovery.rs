//! The discovery phase end to end: sampling, extraction on the worker, the
//! inventory and its persistence, the admin JSON and the OpenAPI export.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use moat_core::{
    AfterResponsePhase, BodyNeed, Connection, Exchange, Finished, PeerIdentity, RequestAuth,
    RequestCtx, TlsSession,
};
use moat_inventory::{load_inventory, DiscoveryWorker};
use moat_schema::{apis_endpoint, Discovery, DiscoveryConfig};
use serde_json::Value;

fn cfg(interval: Duration) -> DiscoveryConfig {
    DiscoveryConfig {
        enabled: true,
        sample_interval: interval,
        max_samples_per_sec: 10_000,
        ..DiscoveryConfig::default()
    }
}

struct Ex {
    method: &'static str,
    uri: String,
    headers: Vec<(&'static str, String)>,
    body: Option<&'static str>,
    status: u16,
    resp_headers: Vec<(&'static str, &'static str)>,
    resp_body: Option<Bytes>,
    ctx: RequestCtx,
}

impl Ex {
    fn get(uri: &str, status: u16) -> Ex {
        Ex {
            method: "GET",
            uri: uri.into(),
            headers: vec![],
            body: None,
            status,
            resp_headers: vec![],
            resp_body: None,
            ctx: RequestCtx::for_test("api"),
        }
    }
    fn build(self) -> Exchange {
        let mut b = http::Request::builder().method(self.method).uri(&self.uri);
        for (k, v) in &self.headers {
            b = b.header(*k, v.as_str());
        }
        let (request, ()) = b.body(()).unwrap().into_parts();
        let mut response_headers = http::HeaderMap::new();
        for (k, v) in self.resp_headers {
            response_headers.append(k, http::HeaderValue::from_static(v));
        }
        Exchange {
            ctx: self.ctx,
            request,
            request_body: self.body.map(|b| Bytes::from_static(b.as_bytes())),
            status: http::StatusCode::from_u16(self.status).unwrap(),
            response_headers,
            response_body: self.resp_body,
            duration_us: 10,
        }
    }

    /// Hands the exchange to `d` as the proxy does: the phase, then, once the
    /// response has been sent, the work it deferred.
    fn send(self, d: &Discovery) {
        let ex = self.build();
        let done = Finished::of(&ex);
        d.after_response(&done);
        done.into_after_sent().run();
    }
}

fn endpoint<'a>(apis: &'a Value, method: &str, path: &str) -> &'a Value {
    apis["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["method"] == method && e["path"] == path)
        .unwrap_or_else(|| panic!("{method} {path} missing from {apis}"))
}

fn parts(method: &str, uri: &str) -> http::request::Parts {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .body(())
        .unwrap()
        .into_parts()
        .0
}

#[test]
fn extracts_schemas_and_builds_inventory() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::from_secs(3600)), dir.path()).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(br#"{"id":7,"email":"jane@example.com","roles":["admin"]}"#)
        .unwrap();
    let ex = Ex {
        method: "POST",
        uri: "/users/123/orders?expand=items&ssn=123-45-6789".into(),
        headers: vec![
            ("content-type", "application/json; charset=utf-8".into()),
            ("authorization", "Bearer abc.def.ghi".into()),
            ("cookie", "session=secret".into()),
        ],
        body: Some(r#"{"card":"4111 1111 1111 1111","qty":2,"price":9.5}"#),
        status: 201,
        resp_headers: vec![
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
            ("set-cookie", "a=b"),
        ],
        resp_body: Some(Bytes::from(gz.finish().unwrap())),
        ctx: RequestCtx::for_test("api"),
    };
    ex.send(&d);
    d.shutdown();
    let st = d.stats();
    assert_eq!(
        (st.received, st.processed, st.sampled, st.dropped),
        (1, 1, 1, 0)
    );

    let apis: Value = serde_json::from_str(&apis_endpoint(&d)).unwrap();
    assert_eq!(apis["count"], 1);
    let ep = endpoint(&apis, "POST", "/users/{id}/orders");
    assert_eq!(ep["route"], "api");
    assert_eq!(ep["count"], 1);
    assert_eq!(ep["auth"]["jwt"], 1);
    assert_eq!(
        ep["request"]["body"],
        serde_json::json!([{"card":[8,{"card_type":"visa","category":"payment","type":"card"}],"price":[16],"qty":[4]}])
    );
    assert_eq!(
        ep["request"]["query"][0]["ssn"],
        serde_json::json!([[[8, {"category":"pii","type":"us_ssn"}]], {"len":1}])
    );
    assert_eq!(ep["request"]["content_types"][0], "application/json");
    let headers = &ep["request"]["headers"][0];
    assert!(headers.get("cookie").is_none(), "cookies are left out");
    assert_eq!(headers["authorization"][1]["type"], "bearer_token");
    let resp = &ep["responses"]["201"];
    assert_eq!(resp["count"], 1);
    assert_eq!(
        resp["body"],
        serde_json::json!([{"email":[8,{"category":"pii","type":"email"}],"id":[4],"roles":[[[8]],{"len":1}]}]),
        "the gzip body was decoded"
    );
    assert!(resp["headers"][0].get("set-cookie").is_none());
    // Values never reach the inventory.
    let text = apis.to_string();
    for secret in [
        "4111",
        "jane@example.com",
        "123-45-6789",
        "abc.def.ghi",
        "session=secret",
    ] {
        assert!(!text.contains(secret), "{secret} leaked: {text}");
    }
    let sensitive: Vec<String> = ep["sensitive"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            format!(
                "{}:{}:{}",
                s["location"].as_str().unwrap(),
                s["path"].as_str().unwrap(),
                s["tags"]["type"].as_str().unwrap()
            )
        })
        .collect();
    for want in [
        "request.body:/card:card",
        "request.query:/ssn/[]:us_ssn",
        "request.headers:/authorization:bearer_token",
        "response.201.body:/email:email",
    ] {
        assert!(
            sensitive.contains(&want.to_string()),
            "{want} not in {sensitive:?}"
        );
    }
}

#[test]
fn sampling_windows_by_template_and_status() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::from_secs(3600)), dir.path()).unwrap();
    for (uri, status) in [
        ("/users/1", 200),
        ("/users/2", 200), // same (GET, /users/{id}, 200): not sampled
        ("/users/3", 404), // new status: sampled
        ("/users/4", 404),
        ("/orders/5", 200), // new template
    ] {
        Ex::get(uri, status).send(&d);
    }
    // With bodies, the same key is sampled again once (its body window had not been used).
    let mut with_body = Ex::get("/users/6", 200);
    with_body.resp_headers = vec![("content-type", "application/json")];
    with_body.resp_body = Some(Bytes::from_static(br#"{"name":"x"}"#));
    with_body.send(&d);
    let mut again = Ex::get("/users/7", 200);
    again.resp_headers = vec![("content-type", "application/json")];
    again.resp_body = Some(Bytes::from_static(br#"{"name":"y"}"#));
    again.send(&d);
    d.shutdown();
    let st = d.stats();
    // Only the sampled exchanges reach the worker; every request is counted.
    assert_eq!(st.received, 7);
    assert_eq!((st.sampled, st.processed), (4, 4));
    let apis: Value = serde_json::from_str(&apis_endpoint(&d)).unwrap();
    let users = endpoint(&apis, "GET", "/users/{id}");
    assert_eq!(users["count"], 6);
    assert_eq!(users["samples"], 3);
    assert_eq!(users["responses"]["200"]["count"], 4);
    assert_eq!(users["responses"]["404"]["count"], 2);
    assert_eq!(
        users["responses"]["200"]["body"],
        serde_json::json!([{"name":[8]}])
    );
    assert_eq!(endpoint(&apis, "GET", "/orders/{id}")["count"], 1);
}

/// The proxy asks for the body need before the response, which leaves the template's
/// keyed hash in the request's slot; after the response the slot key is derived from
/// it. Requests that went through both phases and requests that did not (a caller
/// that never asked) must land in the same (method, template, status) slots, and
/// statuses and templates must stay apart.
#[test]
fn slot_keys_from_the_body_need_hash_match_a_fresh_walk() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::from_secs(3600)), dir.path()).unwrap();
    let as_proxy = |uri: &str, status: u16| {
        let mut ex = Ex::get(uri, status);
        let _ = d.wants_bodies(&mut ex.ctx, &parts("GET", uri));
        assert!(ex.ctx.slots.discovery.is_some());
        ex.send(&d);
    };
    for i in 0..6 {
        as_proxy(&format!("/users/{i}"), 200);
        Ex::get(&format!("/users/{}", 100 + i), 200).send(&d);
    }
    as_proxy("/users/7", 404);
    Ex::get("/users/8", 404).send(&d);
    as_proxy("/users/9", 500);
    as_proxy("/orders/1", 200);
    Ex::get("/orders/2", 200).send(&d);
    d.shutdown();
    let st = d.stats();
    assert_eq!(st.received, 17);
    // One sample per (method, template, status): 200, 404 and 500 of /users/{id}, 200
    // of /orders/{id}; the slot-derived and freshly walked keys agree, or there would
    // be more.
    assert_eq!(st.sampled, 4, "{st:?}");
    let apis: Value = serde_json::from_str(&apis_endpoint(&d)).unwrap();
    let users = endpoint(&apis, "GET", "/users/{id}");
    assert_eq!(users["count"], 15);
    assert_eq!(users["responses"]["200"]["count"], 12);
    assert_eq!(users["responses"]["404"]["count"], 2);
    assert_eq!(users["responses"]["500"]["count"], 1);
    assert_eq!(endpoint(&apis, "GET", "/orders/{id}")["count"], 2);
}

#[test]
fn zero_interval_samples_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::ZERO), dir.path()).unwrap();
    for i in 0..5 {
        Ex::get(&format!("/a/{i}"), 200).send(&d);
    }
    d.shutdown();
    assert_eq!(d.stats().sampled, 5);
}

#[test]
fn wants_bodies_once_per_template_window_under_global_cap() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::from_secs(3600)), dir.path()).unwrap();
    let mut ctx = RequestCtx::for_test("api");
    let max = DiscoveryConfig::default().max_body_bytes as usize;
    assert_eq!(
        d.wants_bodies(&mut ctx, &parts("GET", "/users/1")),
        BodyNeed::Buffer(max)
    );
    assert_eq!(
        d.wants_bodies(&mut ctx, &parts("GET", "/users/2?x=1")),
        BodyNeed::None
    );
    assert_eq!(
        d.wants_bodies(&mut ctx, &parts("POST", "/users/2")),
        BodyNeed::Buffer(max)
    );
    assert_eq!(
        d.wants_bodies(&mut ctx, &parts("GET", "/users/me")),
        BodyNeed::Buffer(max)
    );
    assert_eq!(d.stats().body_requests, 3);

    // Global cap: 1 per second (burst 1) across distinct templates.
    let dir2 = tempfile::tempdir().unwrap();
    let capped = DiscoveryWorker::start(
        &DiscoveryConfig {
            max_samples_per_sec: 1,
            ..cfg(Duration::from_secs(3600))
        },
        dir2.path(),
    )
    .unwrap();
    let yes = (0..20)
        .filter(|i| {
            capped.wants_bodies(&mut ctx, &parts("GET", &format!("/t{i}/x"))) != BodyNeed::None
        })
        .count();
    assert!((1..20).contains(&yes), "{yes} of 20 allowed at 1/s");
    assert_eq!(capped.stats().body_requests, yes as u64);
}

#[test]
fn auth_kinds_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::from_secs(3600)), dir.path()).unwrap();
    Ex::get("/open", 200).send(&d);
    let mut jwt = Ex::get("/secure", 200);
    jwt.ctx.auth = Some(RequestAuth::default());
    jwt.send(&d);
    let mut mtls = Ex::get("/secure", 200);
    let addr = ([127, 0, 0, 1], 1).into();
    mtls.ctx.conn = Arc::new(Connection {
        remote_addr: addr,
        local_addr: addr,
        tls: Some(TlsSession {
            peer: Some(PeerIdentity::default()),
            ..TlsSession::default()
        }),
    });
    mtls.send(&d);
    d.shutdown();
    let apis: Value = serde_json::from_str(&apis_endpoint(&d)).unwrap();
    assert_eq!(
        endpoint(&apis, "GET", "/open")["auth"],
        serde_json::json!({"none": 1})
    );
    assert_eq!(
        endpoint(&apis, "GET", "/secure")["auth"],
        serde_json::json!({"jwt": 1, "mtls": 1})
    );
}

#[test]
fn inventory_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(Duration::from_secs(3600));
    let d = DiscoveryWorker::start(&c, dir.path()).unwrap();
    let mut ex = Ex::get("/items/1?q=x", 200);
    ex.resp_headers = vec![("content-type", "application/json")];
    ex.resp_body = Some(Bytes::from_static(br#"[{"id":1}]"#));
    ex.send(&d);
    d.shutdown();
    let before = d.endpoints();
    drop(d);
    assert_eq!(before.len(), 1);

    let d = DiscoveryWorker::start(&c, dir.path()).unwrap();
    assert_eq!(d.endpoints(), before);
    Ex::get("/items/2", 200).send(&d);
    d.shutdown();
    let after = d.endpoints();
    assert_eq!(after[0].count, 2);
    assert_eq!(after[0].first_seen, before[0].first_seen);
    assert_eq!(
        after[0].responses[&200].body,
        before[0].responses[&200].body
    );
    // The file can be read while no worker runs (moat apis export).
    let loaded = load_inventory(&dir.path().join("moat-apis.db")).unwrap();
    assert_eq!(loaded, after);
}

#[test]
fn full_queue_drops_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(
        &DiscoveryConfig {
            queue_capacity: 4,
            max_body_bytes: 16 << 20,
            ..cfg(Duration::from_secs(3600))
        },
        dir.path(),
    )
    .unwrap();
    // Keep the worker busy with an ~8 MiB JSON body.
    let big: String = format!(
        "[{}]",
        vec![r#"{"a":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb","n":[1,2,3]}"#; 150_000].join(",")
    );
    let mut slow = Ex::get("/big", 200);
    slow.resp_headers = vec![("content-type", "application/json")];
    slow.resp_body = Some(Bytes::from(big));
    slow.send(&d);
    while d.queue_depth() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    // Distinct templates: each one's first request is a sample.
    for i in 0..1000 {
        Ex::get(&format!("/x{i}/y"), 200).send(&d);
        assert!(d.queue_depth() <= 4);
    }
    d.shutdown();
    let st = d.stats();
    assert_eq!(st.received, 1001);
    assert!(st.dropped > 0);
    assert_eq!(st.sampled + st.dropped, st.received);
    assert_eq!(st.processed, st.sampled);
    // A dropped sample's request is still counted.
    assert_eq!(
        d.endpoints().iter().map(|e| e.count).sum::<u64>(),
        st.received
    );
    // After shutdown everything is dropped and counted.
    Ex::get("/late", 200).send(&d);
    assert_eq!(d.stats().dropped, st.dropped + 1);
}

#[test]
fn sampler_keys_are_bounded_and_overflow_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(
        &DiscoveryConfig {
            // The minimum: one key per shard.
            max_sampler_keys: 16,
            ..cfg(Duration::from_secs(3600))
        },
        dir.path(),
    )
    .unwrap();
    for i in 0..100 {
        Ex::get(&format!("/k{i}"), 200).send(&d);
    }
    d.shutdown();
    let st = d.stats();
    let counted: u64 = d.endpoints().iter().map(|e| e.count).sum();
    assert!(counted <= 16, "{counted} keys tracked");
    assert!(st.untracked >= 84);
    assert_eq!(counted + st.untracked, 100);
}

#[test]
fn counts_between_samples_reach_the_inventory_with_their_times() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::from_secs(3600)), dir.path()).unwrap();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for i in 0..50 {
        Ex::get(&format!("/p/{i}"), 200).send(&d);
    }
    // Read while the worker runs: the reader folds the counts itself.
    let eps = d.endpoints();
    assert_eq!(eps.len(), 1);
    assert_eq!(eps[0].count, 50);
    assert!(eps[0].first_seen + 1000 >= before && eps[0].first_seen <= eps[0].last_seen);
    d.shutdown();
    assert_eq!(d.stats().sampled, 1);
    assert_eq!(d.endpoints()[0].samples, 1);
    assert_eq!(d.endpoints()[0].count, 50);
}

#[test]
fn inventory_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(
        &DiscoveryConfig {
            max_endpoints: 3,
            ..cfg(Duration::from_secs(3600))
        },
        dir.path(),
    )
    .unwrap();
    for p in ["/a", "/b", "/c", "/d", "/e", "/a"] {
        Ex::get(p, 200).send(&d);
    }
    d.shutdown();
    assert_eq!(d.endpoints().len(), 3);
    assert_eq!(d.stats().endpoints_dropped, 2);
}

#[test]
fn schema_weight_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(
        &DiscoveryConfig {
            max_schema_weight: 60,
            ..cfg(Duration::from_secs(3600))
        },
        dir.path(),
    )
    .unwrap();
    // Each response body has 21 nodes; with headers, three endpoints exceed 60.
    let body = format!(
        "{{{}}}",
        (0..20)
            .map(|i| format!(r#""k{i}":{i}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    for p in ["/a", "/b", "/c", "/d", "/e"] {
        let mut ex = Ex::get(p, 200);
        ex.resp_headers = vec![("content-type", "application/json")];
        ex.resp_body = Some(Bytes::from(body.clone()));
        ex.send(&d);
    }
    d.shutdown();
    assert!(d.schema_weight() <= 60, "{}", d.schema_weight());
    assert!(d.stats().schemas_dropped > 0);
    // Every request is still counted.
    assert_eq!(d.endpoints().iter().map(|e| e.count).sum::<u64>(), 5);
    // The weight is restored from the database at restart.
    let w = d.schema_weight();
    drop(d);
    let d = DiscoveryWorker::start(
        &DiscoveryConfig {
            max_schema_weight: 60,
            ..cfg(Duration::from_secs(3600))
        },
        dir.path(),
    )
    .unwrap();
    assert_eq!(d.schema_weight(), w);
}

#[test]
fn openapi_export() {
    let dir = tempfile::tempdir().unwrap();
    let d = DiscoveryWorker::start(&cfg(Duration::from_secs(3600)), dir.path()).unwrap();
    let ex = Ex {
        method: "POST",
        uri: "/users/42/orders?expand=items".into(),
        headers: vec![
            ("content-type", "application/json".into()),
            ("authorization", "Bearer a.b.c".into()),
            ("x-tenant", "t1".into()),
        ],
        body: Some(r#"{"email":"a@b.io","qty":1}"#),
        status: 200,
        resp_headers: vec![("content-type", "application/json")],
        resp_body: Some(Bytes::from_static(br#"{"id":"o-1","total":1.5}"#)),
        ctx: RequestCtx::for_test("shop"),
    };
    ex.send(&d);
    d.shutdown();
    let doc = moat_schema::openapi::openapi(&d.endpoints(), "moat");
    assert_eq!(doc["openapi"], "3.1.0");
    let op = &doc["paths"]["/users/{id}/orders"]["post"];
    assert_eq!(op["x-moat-route"], "shop");
    let params = op["parameters"].as_array().unwrap();
    let names: Vec<(&str, &str)> = params
        .iter()
        .map(|p| (p["name"].as_str().unwrap(), p["in"].as_str().unwrap()))
        .collect();
    assert!(names.contains(&("id", "path")));
    assert!(names.contains(&("expand", "query")));
    assert!(names.contains(&("x-tenant", "header")));
    assert!(!names.iter().any(|(n, _)| *n == "authorization"));
    let body = &op["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(body["properties"]["qty"]["type"], "integer");
    assert_eq!(body["properties"]["email"]["format"], "email");
    assert_eq!(
        body["properties"]["email"]["x-moat-sensitive"]["type"],
        "email"
    );
    let resp = &op["responses"]["200"]["content"]["application/json"]["schema"];
    assert_eq!(resp["properties"]["total"]["type"], "number");
    assert_eq!(op["security"], serde_json::json!([{"bearerAuth": []}]));
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"]["scheme"],
        "bearer"
    );
}

#[test]
fn config_from_yaml_and_limits() {
    let c: DiscoveryConfig = moat_config::from_str(
        Path::new("moat.yaml"),
        "enabled: true\nsample_interval: 10s\nmax_body_bytes: 1MiB\ninventory: data/apis.db\n",
    )
    .unwrap();
    assert!(c.enabled);
    assert_eq!(c.sample_interval, Duration::from_secs(10));
    assert_eq!(c.max_body_bytes, 1 << 20);
    c.validate().unwrap();
    let e = moat_config::from_str::<DiscoveryConfig>(Path::new("moat.yaml"), "sample_rate: 1\n")
        .unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
    for bad in [
        DiscoveryConfig {
            queue_capacity: 0,
            ..DiscoveryConfig::default()
        },
        DiscoveryConfig {
            max_samples_per_sec: 0,
            ..DiscoveryConfig::default()
        },
        DiscoveryConfig {
            max_body_bytes: 1 << 30,
            ..DiscoveryConfig::default()
        },
        DiscoveryConfig {
            max_endpoints: 0,
            ..DiscoveryConfig::default()
        },
    ] {
        assert!(bad.validate().is_err());
    }
}
