//! The gateway phases (block / redact / monitor, limits, gzip) and the scan API.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use moat_core::{
    Body, BodyNeed, DecodeLimits, EventAction, RequestBodyPhase, RequestCtx, ResponseBodyPhase,
    Verdict,
};
use moat_secrets::api::scan_api_with;
use moat_secrets::{
    scan_api, ApiLimits, LimitOutcome, RouteSecrets, SecretsAction, SecretsConfig, SecretsEngine,
};

const GH: &str = "ghp_N5N1aE6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV";
const SLACK: &str = "xoxb-2837465019-8364519027-Qm7Zt2Lx9Rv4Kp8Wn3Hs6Jd1";

fn engine(f: impl FnOnce(&mut SecretsConfig)) -> Arc<SecretsEngine> {
    let mut c = SecretsConfig {
        enabled: true,
        ..SecretsConfig::default()
    };
    f(&mut c);
    SecretsEngine::build(&c, Path::new(".")).expect("engine")
}

fn request(ctype: &str) -> http::request::Parts {
    http::Request::builder()
        .method("POST")
        .uri("/upload")
        .header("content-type", ctype)
        .body(())
        .unwrap()
        .into_parts()
        .0
}

fn body(data: &[u8], enc: Option<&str>) -> Body {
    Body::new(
        Bytes::copy_from_slice(data),
        enc.map(str::to_string),
        false,
        DecodeLimits::default(),
    )
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn json_doc() -> String {
    format!("{{\"user\":\"ann\",\"github\":\"{GH}\",\"nested\":{{\"slack\":\"{SLACK}\"}},\"n\":1}}")
}

#[test]
fn block_lists_rule_ids_and_locations_never_the_secret() {
    let e = engine(|_| {});
    let mut ctx = RequestCtx::for_test("r");
    let mut req = request("application/json");
    let mut b = body(json_doc().as_bytes(), None);
    let Verdict::Respond(reply) = e.on_request_body(&mut ctx, &mut req, &mut b) else {
        panic!("expected a block");
    };
    assert_eq!(reply.status.as_u16(), 403);
    let text = String::from_utf8(reply.body.to_vec()).unwrap();
    assert!(!text.contains(GH) && !text.contains(SLACK), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rule_id"].as_str().unwrap())
        .collect();
    assert_eq!(rules, ["github-token", "slack-token"]);
    assert_eq!(v["findings"][0]["line"], 1);
    assert_eq!(ctx.events.len(), 2);
    for ev in &ctx.events {
        assert_eq!(ev.engine, "secrets");
        assert_eq!(ev.action, EventAction::Block);
        let s = serde_json::to_string(ev).unwrap();
        assert!(!s.contains(GH) && !s.contains(SLACK), "{s}");
        assert!(ev.location.as_deref().unwrap().starts_with("body:1:"));
    }
}

#[test]
fn redact_keeps_json_valid_and_removes_secrets() {
    let e = engine(|c| c.action = SecretsAction::Redact);
    let mut ctx = RequestCtx::for_test("r");
    let mut req = request("application/json");
    let mut b = body(&gzip(json_doc().as_bytes()), Some("gzip"));
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut req, &mut b),
        Verdict::Continue
    ));
    assert!(b.modified());
    assert_eq!(b.content_encoding(), None);
    let out = String::from_utf8(b.raw().to_vec()).unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).expect("still JSON");
    assert_eq!(v["github"], "[REDACTED:github-token]");
    assert_eq!(v["nested"]["slack"], "[REDACTED:slack-token]");
    assert_eq!(v["user"], "ann");
    assert!(ctx.events.iter().all(|e| e.action == EventAction::Redact));
}

#[test]
fn redact_keeps_form_data_parseable() {
    let e = engine(|c| c.action = SecretsAction::Redact);
    let mut ctx = RequestCtx::for_test("r");
    let mut req = request("application/x-www-form-urlencoded");
    // (A `token` field would be the API's own parameter, exempt: see context.rs.)
    let form = format!("user=ann&pasted={GH}&note=hello+world");
    let mut b = body(form.as_bytes(), None);
    e.on_request_body(&mut ctx, &mut req, &mut b);
    let out = String::from_utf8(b.raw().to_vec()).unwrap();
    assert_eq!(
        out,
        "user=ann&pasted=%5BREDACTED%3Agithub-token%5D&note=hello+world"
    );
    let pairs: Vec<(&str, &str)> = out
        .split('&')
        .map(|kv| kv.split_once('=').unwrap())
        .collect();
    assert_eq!(pairs.len(), 3);
}

#[test]
fn monitor_forwards_unchanged_with_events() {
    let e = engine(|c| c.action = SecretsAction::Monitor);
    let mut ctx = RequestCtx::for_test("r");
    let mut req = request("text/plain");
    let mut b = body(GH.as_bytes(), None);
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut req, &mut b),
        Verdict::Continue
    ));
    assert!(!b.modified());
    assert_eq!(ctx.events[0].action, EventAction::Monitor);
    // A route in monitor-only mode never blocks either.
    let e = engine(|_| {});
    let mut ctx = RequestCtx::for_test("r");
    ctx.monitor_only = true;
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut req, &mut b),
        Verdict::Continue
    ));
    assert_eq!(ctx.events[0].action, EventAction::Monitor);
}

#[test]
fn clean_bodies_pass_without_events() {
    let e = engine(|_| {});
    let mut ctx = RequestCtx::for_test("r");
    let mut req = request("application/json");
    let mut b = body(b"{\"token_count\": 12, \"api\": \"v2\"}", None);
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut req, &mut b),
        Verdict::Continue
    ));
    assert!(ctx.events.is_empty());
}

#[test]
fn routes_override_and_response_scanning() {
    let e = engine(|c| {
        c.routes.insert(
            "public".into(),
            RouteSecrets {
                enabled: Some(false),
                ..Default::default()
            },
        );
        c.routes.insert(
            "leaky".into(),
            RouteSecrets {
                scan_responses: Some(true),
                action: Some(SecretsAction::Redact),
                ..Default::default()
            },
        );
    });
    let req = request("application/json");
    let resp = http::Response::builder()
        .status(200)
        .body(())
        .unwrap()
        .into_parts()
        .0;
    assert_eq!(
        RequestBodyPhase::body_need(&*e, &RequestCtx::for_test("public"), &req),
        BodyNeed::None
    );
    assert_eq!(
        RequestBodyPhase::body_need(&*e, &RequestCtx::for_test("other"), &req),
        BodyNeed::Buffer(1 << 20)
    );
    assert_eq!(
        ResponseBodyPhase::body_need(&*e, &RequestCtx::for_test("other"), &req, &resp),
        BodyNeed::None
    );
    assert_eq!(
        ResponseBodyPhase::body_need(&*e, &RequestCtx::for_test("leaky"), &req, &resp),
        BodyNeed::Buffer(1 << 20)
    );
    let mut ctx = RequestCtx::for_test("leaky");
    let mut resp = resp;
    let mut b = body(&gzip(json_doc().as_bytes()), Some("gzip"));
    assert!(matches!(
        e.on_response_body(&mut ctx, &req, &mut resp, &mut b),
        Verdict::Continue
    ));
    let out = String::from_utf8(b.raw().to_vec()).unwrap();
    assert!(out.contains("[REDACTED:github-token]") && !out.contains(GH));
    assert!(ctx.events[0]
        .location
        .as_deref()
        .unwrap()
        .starts_with("response_body:"));
}

#[test]
fn limits_follow_on_limit() {
    // Truncated body (larger than the buffer limit).
    for (outcome, blocked) in [(LimitOutcome::Allow, false), (LimitOutcome::Block, true)] {
        let e = engine(|c| c.on_limit = outcome);
        let mut ctx = RequestCtx::for_test("r");
        let mut req = request("text/plain");
        let mut b = Body::new(
            Bytes::from_static(b"abc"),
            None,
            true,
            DecodeLimits::default(),
        );
        let v = e.on_request_body(&mut ctx, &mut req, &mut b);
        assert_eq!(matches!(v, Verdict::Respond(_)), blocked);
        if let Verdict::Respond(r) = v {
            assert_eq!(r.status.as_u16(), 413);
        }
        assert_eq!(
            ctx.events[0].action,
            if blocked {
                EventAction::Block
            } else {
                EventAction::Bypass
            }
        );
    }
    // Corrupt gzip cannot be inspected.
    let e = engine(|c| c.on_limit = LimitOutcome::Block);
    let mut ctx = RequestCtx::for_test("r");
    let mut b = body(b"not gzip", Some("gzip"));
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut request("text/plain"), &mut b),
        Verdict::Respond(_)
    ));
    // Decoded size over max_body_bytes.
    let e = engine(|c| {
        c.on_limit = LimitOutcome::Block;
        c.max_body_bytes = 1000;
    });
    let mut ctx = RequestCtx::for_test("r");
    let mut b = body(&gzip(&vec![b'a'; 50_000]), Some("gzip"));
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut request("text/plain"), &mut b),
        Verdict::Respond(_)
    ));
}

#[test]
fn scan_time_limit_follows_on_limit() {
    let e = engine(|c| {
        c.on_limit = LimitOutcome::Block;
        c.scan_timeout = Duration::from_micros(1);
    });
    let mut ctx = RequestCtx::for_test("r");
    // The scan reads the coarse clock, which moves once a scheduler tick (1-4 ms):
    // the body is one line of about 21k tokens, whose scan outlasts a tick.
    let dense = format!("token {GH} ").repeat(1_000_000 / (GH.len() + 7));
    let mut b = body(dense.as_bytes(), None);
    let Verdict::Respond(r) = e.on_request_body(&mut ctx, &mut request("text/plain"), &mut b)
    else {
        panic!("expected the time limit to block");
    };
    assert_eq!(r.status.as_u16(), 413);
    assert!(ctx.events[0].message.contains("time limit"));
}

#[test]
fn config_is_strict_and_validated() {
    let c: SecretsConfig = moat_config::from_str(
        Path::new("moat.yaml"),
        "enabled: true\naction: redact\nmax_body_bytes: 64KiB\nscan_timeout: 20ms\non_limit: block\nroutes:\n  api:\n    scan_responses: true\n",
    )
    .expect("config");
    assert_eq!(c.max_body_bytes, 64 << 10);
    assert_eq!(c.for_route("api"), (true, SecretsAction::Redact, true));
    let e = moat_config::from_str::<SecretsConfig>(
        Path::new("moat.yaml"),
        "enabled: true\nactoin: block\n",
    )
    .unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
    let bad = SecretsConfig {
        status: 200,
        ..Default::default()
    };
    assert!(SecretsEngine::build(&bad, Path::new(".")).is_err());
    let missing = SecretsConfig {
        rules: Some("does-not-exist.toml".into()),
        ..Default::default()
    };
    assert!(SecretsEngine::build(&missing, Path::new(".")).is_err());
}

#[test]
fn custom_rules_file_relative_to_base_dir() {
    let dir = std::env::temp_dir().join(format!("moat-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rules.toml"),
        "[[rules]]\nid = \"internal-id\"\nregex = '''INT-[0-9]{8}'''\nkeywords = [\"int-\"]\n",
    )
    .unwrap();
    let c = SecretsConfig {
        enabled: true,
        rules: Some("rules.toml".into()),
        ..Default::default()
    };
    let e = SecretsEngine::build(&c, &dir).unwrap();
    let mut ctx = RequestCtx::for_test("r");
    let mut b = body(b"ref INT-12345678", None);
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut request("text/plain"), &mut b),
        Verdict::Respond(_)
    ));
    assert_eq!(ctx.events[0].rule, "internal-id");
    let _ = std::fs::remove_dir_all(&dir);
}

fn api(e: &SecretsEngine, body: &serde_json::Value) -> (u16, serde_json::Value) {
    let (code, out) = scan_api(e, body.to_string().as_bytes());
    (code, serde_json::from_slice(&out).expect("json response"))
}

#[test]
fn api_found_and_not_found() {
    let e = engine(|_| {});
    let (code, v) = api(
        &e,
        &serde_json::json!({"payloads": [
            {"id": "a", "data": format!("line one\ntoken = {GH}\n")},
            {"id": "b", "data": "nothing to see"},
            {"id": "c", "data": SLACK},
        ]}),
    );
    assert_eq!(code, 200);
    assert_eq!(v["status"], "FOUND");
    let r = v["results"].as_array().unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(r[0]["payload_id"], "a");
    assert_eq!(r[0]["rule_id"], "github-token");
    assert_eq!(r[0]["line"], 2);
    assert_eq!(r[0]["column"], 9);
    assert_eq!(r[0]["start"], 17);
    assert_eq!(r[0]["end"], 17 + GH.len());
    assert!(r[0]["description"].as_str().unwrap().contains("GitHub"));
    assert!(!v.to_string().contains(GH));
    assert_eq!(r[1]["payload_id"], "c");

    let (code, v) = api(
        &e,
        &serde_json::json!({"payloads": [{"id": "a", "data": "hello"}]}),
    );
    assert_eq!((code, v["status"].as_str()), (200, Some("NOT_FOUND")));
}

#[test]
fn api_exclusions() {
    let e = engine(|_| {});
    let payloads = serde_json::json!([{"id": "a", "data": format!("{GH} {SLACK}")}]);
    let (_, v) = api(
        &e,
        &serde_json::json!({"payloads": payloads, "exclusions": [{"type": "rule", "value": "github-token"}]}),
    );
    assert_eq!(v["results"].as_array().unwrap().len(), 1);
    assert_eq!(v["results"][0]["rule_id"], "slack-token");
    let (_, v) = api(
        &e,
        &serde_json::json!({"payloads": payloads, "exclusions": [
            {"type": "raw_value", "value": GH}, {"type": "raw_value", "value": SLACK}]}),
    );
    assert_eq!(v["status"], "NOT_FOUND");
}

#[test]
fn api_input_errors() {
    let e = engine(|_| {});
    let cases: Vec<Vec<u8>> = vec![
        b"not json".to_vec(),
        br#"{"payloads": [{"id": "", "data": "x"}]}"#.to_vec(),
        br#"{"payloads": [{"id": "a"}]}"#.to_vec(),
        br#"{"payloads": [{"id": "a", "data": "x"}], "exclusions": [{"type": "rule", "value": ""}]}"#.to_vec(),
        br#"{"payloads": [{"id": "a", "data": "x"}], "timeout_ms": 0}"#.to_vec(),
        br#"{"payloads": [{"id": "a", "data": "x"}], "timeout_ms": 600001}"#.to_vec(),
        br#"{"payloads": [], "bogus": 1}"#.to_vec(),
    ];
    for c in cases {
        let (code, out) = scan_api(&e, &c);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (code, v["status"].as_str()),
            (400, Some("INPUT_ERROR")),
            "{}",
            String::from_utf8_lossy(&c)
        );
    }
    let limits = ApiLimits {
        max_payloads: 2,
        max_request_bytes: 200,
        ..ApiLimits::default()
    };
    let three = br#"{"payloads": [{"id": "a", "data": ""}, {"id": "b", "data": ""}, {"id": "c", "data": ""}]}"#;
    let (code, _) = scan_api_with(e.scanner(), three, &limits);
    assert_eq!(code, 400);
    let big = format!(
        r#"{{"payloads": [{{"id": "a", "data": "{}"}}]}}"#,
        "x".repeat(300)
    );
    let (code, out) = scan_api_with(e.scanner(), big.as_bytes(), &limits);
    assert_eq!(code, 413);
    assert!(String::from_utf8_lossy(&out).contains("INPUT_ERROR"));
}

#[test]
fn api_timeout() {
    let e = engine(|_| {});
    // 1000 keyword-dense payloads cannot all be scanned within 1 ms.
    let data = format!("api_key = {GH}\n").repeat(50);
    let payloads: Vec<serde_json::Value> = (0..1000)
        .map(|i| serde_json::json!({"id": i.to_string(), "data": data}))
        .collect();
    let (code, v) = api(
        &e,
        &serde_json::json!({"payloads": payloads, "timeout_ms": 1}),
    );
    assert_eq!(code, 200);
    assert_eq!(v["status"], "TIMEOUT");
}

/// `GH` base64-encoded, as Go's StdEncoding writes it.
const GH_B64: &str = "Z2hwX041TjFhRTZQd1pQZjFRaDZ5WVRXbUU0bEJZT3ZmWjhVekR6Vg==";

#[test]
fn inline_and_api_decode_by_default_and_max_decode_depth_turns_it_off() {
    let doc = format!("{{\"blob\":\"{GH_B64}\"}}");
    // Default max_decode_depth (5): the encoded token is found, redacted whole.
    // (gitleaks v8.30.1 with its own default config: github-pat, columns 10-65,
    // decoded:base64 decode-depth:1.)
    let e = engine(|c| c.action = SecretsAction::Redact);
    assert_eq!(e.scanner().decode_limits().max_depth, 5);
    let mut ctx = RequestCtx::for_test("r");
    let mut b = body(doc.as_bytes(), None);
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut request("application/json"), &mut b),
        Verdict::Continue
    ));
    assert_eq!(ctx.events[0].rule, "github-token");
    assert_eq!(b.raw().as_ref(), b"{\"blob\":\"[REDACTED:github-token]\"}");
    let (code, v) = api(
        &e,
        &serde_json::json!({"payloads": [{"id": "a", "data": doc}]}),
    );
    assert_eq!((code, v["status"].as_str()), (200, Some("FOUND")));
    assert_eq!(v["results"][0]["start"], 9);
    // max_decode_depth: 0 turns decoding off; above the maximum is refused.
    let off = engine(|c| c.max_decode_depth = 0);
    let (_, v) = api(
        &off,
        &serde_json::json!({"payloads": [{"id": "a", "data": doc}]}),
    );
    assert_eq!(v["status"], "NOT_FOUND");
    let c: SecretsConfig = moat_config::from_str(
        Path::new("moat.yaml"),
        "enabled: true\nmax_decode_depth: 65\n",
    )
    .expect("config parses");
    let err = SecretsEngine::build(&c, Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_decode_depth"), "{err}");
}
