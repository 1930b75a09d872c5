//! Schema extraction speed.
//!
//! `cargo bench -p moat-schema --bench extract`
//!
//! - `extract/json_1k`: schema (with the built-in scanners) of a ~1 KB JSON body;
//! - `extract/json_1k_no_scanners`: the same without scanners;
//! - `template/path`: templating one path;
//! - `exchange/full`: every schema of one exchange (query, headers, 1 KB request and response bodies);
//! - `phase/wants_bodies`, `phase/after_response`: what the request thread pays per request
//!   (after_response on the common path: the request counted in its slot; the
//!   sample queue is not reached, so a queue that refuses everything stands in for
//!   moat-inventory's worker).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use moat_core::AfterResponsePhase;
use moat_schema::discovery::extract;
use moat_schema::{from_json, template, Discovery, DiscoveryConfig, SampleQueue, Scanners};

/// A queue that refuses every sample (counted as dropped): the measured path never queues.
struct Refuse;

impl SampleQueue for Refuse {
    fn try_push(&self, _sample: Arc<moat_core::Exchange>) -> bool {
        false
    }
    fn depth(&self) -> usize {
        0
    }
}

fn body_1k() -> String {
    let items: Vec<String> = (0..6)
        .map(|i| {
            format!(
                r#"{{"sku":"SKU-{i:04}","name":"Item number {i}","qty":{i},"price":{}.99,"tags":["new","sale"]}}"#,
                i * 3
            )
        })
        .collect();
    format!(
        r#"{{"order_id":"9f1c2a7e-1b2c-4d5e-8f90-123456789abc","customer":{{"name":"Jane Doe","email":"jane.doe@example.com","phone":"+1 415 555 0100","address":{{"street":"1 Main St","city":"Springfield","zip":"12345"}}}},"card":"4111111111111111","items":[{}],"total":123.45,"paid":true,"note":null}}"#,
        items.join(",")
    )
}

fn bench(c: &mut Criterion) {
    let body = body_1k();
    let sc = Scanners::builtin();
    let none = Scanners::none();
    let mut g = c.benchmark_group("extract");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("json_1k", |b| b.iter(|| from_json(body.as_bytes(), &sc)));
    g.bench_function("json_1k_no_scanners", |b| {
        b.iter(|| from_json(body.as_bytes(), &none))
    });
    g.finish();

    c.bench_function("template/path", |b| {
        b.iter(|| template("/api/v1/users/12345/orders/9f1c2a7e-1b2c-4d5e-8f90-123456789abc/items"))
    });

    let (request, ()) = http::Request::builder()
        .method("POST")
        .uri("/api/v1/users/42/orders?expand=items&email=jane%40example.com")
        .header("content-type", "application/json")
        .header("authorization", "Bearer abc.def.ghi")
        .header("user-agent", "bench")
        .header("x-request-id", "abc123")
        .body(())
        .expect("request")
        .into_parts();
    let mut response_headers = http::HeaderMap::new();
    response_headers.insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    response_headers.insert("x-trace", http::HeaderValue::from_static("1"));
    let ex = Arc::new(moat_core::Exchange {
        ctx: moat_core::RequestCtx::for_test("api"),
        request,
        request_body: Some(bytes::Bytes::from(body.clone())),
        status: http::StatusCode::OK,
        response_headers,
        response_body: Some(bytes::Bytes::from(body.clone())),
        duration_us: 100,
    });
    c.bench_function("exchange/full", |b| b.iter(|| extract(&ex, &sc, 64 << 10)));

    // Request-thread cost of the phase: what the proxy pays per request.
    let d = Discovery::new(
        &DiscoveryConfig {
            enabled: true,
            ..DiscoveryConfig::default()
        },
        Vec::new(),
        Arc::new(Refuse),
    )
    .expect("discovery");
    let mut ctx = moat_core::RequestCtx::for_test("api");
    let (parts, ()) = http::Request::builder()
        .uri("/api/v1/users/12345/orders/9f1c2a7e-1b2c-4d5e-8f90-123456789abc")
        .body(())
        .expect("request")
        .into_parts();
    // The first call samples the template; the measured calls take the common path.
    let _ = d.wants_bodies(&mut ctx, &parts);
    c.bench_function("phase/wants_bodies", |b| {
        b.iter(|| d.wants_bodies(&mut ctx, &parts))
    });
    // The proxy asks for the body need first, which leaves the template's hash in the
    // request's slot for after_response.
    let mut ex = (*ex).clone();
    let _ = d.wants_bodies(&mut ex.ctx, &ex.request);
    // After the first (sampled) call, the common path: the request is counted in its slot.
    let done = moat_core::Finished::of(&ex);
    d.after_response(&done);
    done.into_after_sent().run();
    c.bench_function("phase/after_response", |b| {
        b.iter(|| d.after_response(&moat_core::Finished::of(&ex)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
