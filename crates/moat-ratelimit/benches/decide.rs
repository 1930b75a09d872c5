#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A local limit decision: matching a rule, hashing the key, the bucket.

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion};
use moat_core::{RequestCtx, RequestHeadersPhase};
use moat_ratelimit::{RateLimitConfig, RateLimitEngine};

fn engine(yaml: &str) -> std::sync::Arc<RateLimitEngine> {
    let cfg: RateLimitConfig = moat_config::from_str(Path::new("bench.yaml"), yaml).unwrap();
    RateLimitEngine::build(
        &cfg,
        Path::new("bench.yaml"),
        Path::new("."),
        &["app"],
        None,
        None,
    )
    .unwrap()
}

fn bench(c: &mut Criterion) {
    // A limit high enough that every request passes (the common case).
    let e = engine("rules:\n  - name: per-ip\n    rate: 1000000000\n    per: 1s\n");
    let (mut parts, _) = http::Request::get("http://api.example/users/42")
        .header("host", "api.example")
        .body(())
        .unwrap()
        .into_parts();
    let mut ctx = RequestCtx::for_test("app");
    let mut ip = 0u32;
    c.bench_function("ratelimit/local_decision_ip", |b| {
        b.iter(|| {
            // 1024 clients, so the table is warm but not a single entry.
            ip = ip.wrapping_add(1);
            ctx.client_ip = std::net::Ipv4Addr::from(0x0a00_0000 | (ip & 1023)).into();
            black_box(e.on_request_headers(&mut ctx, &mut parts));
        })
    });
    let e = engine("rules:\n  - name: per-token\n    rate: 1000000000\n    per: 1s\n    path: {template: \"/users/{id}\"}\n    key: [{header: x-api-key}, route]\n");
    parts
        .headers
        .insert("x-api-key", "k-0123456789abcdef".parse().unwrap());
    c.bench_function("ratelimit/local_decision_header_template", |b| {
        b.iter(|| black_box(e.on_request_headers(&mut ctx, &mut parts)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
