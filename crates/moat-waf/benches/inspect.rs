//! Criterion benches for the WAF hot path:
//! `CARGO_TARGET_DIR=/work/target-waf cargo bench -p moat-waf --bench inspect`.
//! `MOAT_BENCH_NO_PATCHES=1` builds the engine with `virtual_patches.builtin:
//! false` (what the same requests cost without virtual patches).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moat_waf::{BodyView, RequestView, WafConfig, WafEngine};

mod common;
use common::{form, get_view, headers, json_1k, json_view};

fn benches(c: &mut Criterion) {
    let mut cfg = WafConfig::default();
    if std::env::var_os("MOAT_BENCH_NO_PATCHES").is_some_and(|v| v == "1") {
        cfg.virtual_patches.builtin = false;
    }
    let engine = match WafEngine::build(&cfg) {
        Ok(e) => e,
        Err(e) => panic!("config: {e}"),
    };
    let mut g = c.benchmark_group("waf");
    for (name, body) in [
        ("json_1k_benign", json_1k(false)),
        ("json_1k_attack", json_1k(true)),
    ] {
        let view = json_view();
        let f = engine.inspect(
            "bench",
            &view,
            Some(BodyView {
                data: &body,
                truncated: false,
            }),
        );
        assert_eq!(
            f.findings.is_empty(),
            name.ends_with("benign"),
            "{name}: {f:?}"
        );
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                black_box(engine.inspect_body_only(
                    "bench",
                    &view,
                    BodyView {
                        data: black_box(&body),
                        truncated: false,
                    },
                ))
            })
        });
    }
    let form_view = RequestView {
        method: "POST",
        target: b"/submit",
        headers: headers("application/x-www-form-urlencoded"),
    };
    let body = form(64 << 10);
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("form_64k_benign", |b| {
        b.iter(|| {
            black_box(engine.inspect_body_only(
                "bench",
                &form_view,
                BodyView {
                    data: black_box(&body),
                    truncated: false,
                },
            ))
        })
    });
    let get = get_view();
    g.throughput(Throughput::Elements(1));
    g.bench_function("get_headers_benign", |b| {
        b.iter(|| black_box(engine.inspect_headers("bench", black_box(&get))))
    });
    g.finish();

    // what the proxy calls per request (head phase, body need, body phase)
    let mut px = c.benchmark_group("waf_proxy");
    px.throughput(Throughput::Elements(1));
    if let Some(json) = common::peer_json() {
        let mut parts = common::parts(Some(json.len()));
        let mut body = moat_core::Body::new(
            bytes::Bytes::from(json),
            None,
            false,
            moat_core::DecodeLimits::default(),
        );
        let mut ctx = moat_core::RequestCtx::for_test("bench");
        assert!(!common::run_phases(
            &engine,
            &mut ctx,
            &mut parts,
            Some(&mut body)
        ));
        px.bench_function("post_json_peer", |b| {
            b.iter(|| common::run_phases(&engine, &mut ctx, &mut parts, Some(&mut body)))
        });
    }
    let mut parts = common::parts(None);
    let mut ctx = moat_core::RequestCtx::for_test("bench");
    px.bench_function("get_browser", |b| {
        b.iter(|| common::run_phases(&engine, &mut ctx, &mut parts, None))
    });
    let mut n = 0u64;
    px.bench_function("get_browser_new_ua", |b| {
        b.iter(|| {
            n += 1;
            common::fresh_user_agent(&mut parts, n);
            common::run_phases(&engine, &mut ctx, &mut parts, None)
        })
    });
    px.finish();

    // linear time: one long value with many trigger characters
    let mut lin = c.benchmark_group("waf_linear");
    for size in [1usize << 10, 16 << 10, 256 << 10] {
        let unit = "a'b(c)<d> e;f|g ${h} ../ ";
        let v: String = unit.repeat(size / unit.len() + 1)[..size].to_string();
        let body = format!(
            "{{\"v\":{}}}",
            serde_json::to_string(&v).unwrap_or_default()
        );
        let view = RequestView {
            method: "POST",
            target: b"/",
            headers: headers("application/json"),
        };
        lin.throughput(Throughput::Bytes(body.len() as u64));
        lin.bench_with_input(BenchmarkId::new("hostile_value", size), &body, |b, body| {
            b.iter(|| {
                black_box(engine.inspect_body_only(
                    "bench",
                    &view,
                    BodyView {
                        data: body.as_bytes(),
                        truncated: false,
                    },
                ))
            })
        });
    }
    lin.finish();
}

criterion_group! {
    name = b;
    config = Criterion::default().sample_size(30).measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_secs(1));
    targets = benches
}
criterion_main!(b);
