#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A local limit decision: matching a rule, hashing the key, the bucket.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use moat_core::RequestHeadersPhase;

mod common;

fn bench(c: &mut Criterion) {
    let (mut ctx, mut parts) = common::request();
    let e = common::engine(common::PER_IP);
    let mut i = 0u32;
    c.bench_function("ratelimit/local_decision_ip", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            ctx.client_ip = common::client(i);
            black_box(e.on_request_headers(&mut ctx, &mut parts));
        })
    });
    let e = common::engine(common::PER_TOKEN);
    c.bench_function("ratelimit/local_decision_header_template", |b| {
        b.iter(|| black_box(e.on_request_headers(&mut ctx, &mut parts)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
