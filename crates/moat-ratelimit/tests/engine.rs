//! The engine as the proxy calls it: keys on JWT claims, and hostile keys (huge
//! values, floods of distinct keys) that must neither escape the limit nor grow memory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use moat_core::{RequestAuth, RequestCtx, RequestHeadersPhase, Verdict};
use moat_ratelimit::{RateLimitConfig, RateLimitEngine};

fn engine(yaml: &str) -> Arc<RateLimitEngine> {
    let cfg: RateLimitConfig = moat_config::from_str(Path::new("t.yaml"), yaml).unwrap();
    RateLimitEngine::build(
        &cfg,
        Path::new("t.yaml"),
        Path::new("."),
        &["app"],
        None,
        None,
    )
    .unwrap()
}

fn status(e: &RateLimitEngine, ctx: &mut RequestCtx, parts: &mut http::request::Parts) -> u16 {
    match e.on_request_headers(ctx, parts) {
        Verdict::Continue => 200,
        Verdict::Respond(r) => r.status.as_u16(),
    }
}

fn parts(headers: &[(&str, &str)]) -> http::request::Parts {
    let mut b = http::Request::get("http://h/api");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap().into_parts().0
}

#[test]
fn claims_key_requests_per_subject() {
    let e =
        engine("rules:\n  - name: per-sub\n    key: [{claim: sub}]\n    rate: 2\n    per: 1m\n");
    let mut p = parts(&[]);
    let with_sub = |sub: serde_json::Value| {
        let mut ctx = RequestCtx::for_test("app");
        ctx.auth = Some(RequestAuth {
            principal: "iss/x".into(),
            claims: Arc::new(serde_json::json!({ "sub": sub })),
            ..RequestAuth::default()
        });
        ctx
    };
    for sub in [serde_json::json!("alice"), serde_json::json!(42)] {
        let codes: Vec<u16> = (0..3)
            .map(|_| status(&e, &mut with_sub(sub.clone()), &mut p))
            .collect();
        assert_eq!(codes, [200, 200, 429], "{sub}");
    }
    // No token: the empty key, shared by every anonymous request.
    let codes: Vec<u16> = (0..3)
        .map(|_| status(&e, &mut RequestCtx::for_test("app"), &mut p))
        .collect();
    assert_eq!(codes, [200, 200, 429]);
}

#[test]
fn a_flood_of_distinct_keys_stays_bounded_and_limited() {
    let e = engine("max_keys: 64\nrules:\n  - name: per-key\n    key: [{header: x-api-key}]\n    rate: 1\n    per: 1h\n");
    let mut ctx = RequestCtx::for_test("app");
    let mut passed = 0;
    for i in 0..20_000 {
        let key = format!("random-{i}");
        if status(&e, &mut ctx, &mut parts(&[("x-api-key", &key)])) == 200 {
            passed += 1;
        }
    }
    let held = e.rules()[0].state.local.len();
    assert!(held <= 64, "{held} keys held");
    // Each of the tracked keys passed once; the rest shared overflow buckets (one per
    // shard), which let one request each through.
    assert!(passed <= 64 + 16, "{passed} passed");
}

#[test]
fn huge_key_values_are_hashed_not_stored() {
    let e = engine("rules:\n  - name: per-key\n    key: [{header: x-api-key}, ip, route, path]\n    rate: 1\n    per: 1h\n");
    let mut ctx = RequestCtx::for_test("app");
    let big = "k".repeat(60_000);
    let mut p = parts(&[("x-api-key", &big)]);
    assert_eq!(status(&e, &mut ctx, &mut p), 200);
    assert_eq!(status(&e, &mut ctx, &mut p), 429);
    let rule = &e.rules()[0];
    assert_eq!(
        rule.store_key(&ctx, &p).len(),
        "moat:rl:per-key:".len() + 32
    );
}
