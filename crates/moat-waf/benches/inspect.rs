//! Criterion benches for the WAF hot path:
//! `CARGO_TARGET_DIR=/work/target-waf cargo bench -p moat-waf --bench inspect`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use moat_waf::{BodyView, RequestView, WafConfig, WafEngine};

fn json_1k(attack: bool) -> Vec<u8> {
    let mut items = Vec::new();
    let mut i = 0;
    loop {
        let comment = if attack && i == 3 {
            "1' UNION SELECT username, password FROM users-- ".to_string()
        } else {
            format!("Great product, arrived on time {i}")
        };
        items.push(format!(
            "{{\"id\":{i},\"name\":\"Customer number {i}\",\"email\":\"user{i}@example.com\",\"comment\":\"{comment}\",\"tags\":[\"blue\",\"large\"]}}"
        ));
        let doc = format!("{{\"orders\":[{}],\"page\":1}}", items.join(","));
        if doc.len() >= 1000 {
            return doc.into_bytes();
        }
        i += 1;
    }
}

fn form(len: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!(
            "field{i}=Hello+world+this+is+value+{i}&email{i}=someone%40example.com&qty{i}=42&"
        ));
        i += 1;
    }
    s.truncate(len);
    s.into_bytes()
}

fn headers() -> Vec<(&'static str, &'static [u8])> {
    vec![
        ("host", b"shop.example.com".as_slice()),
        (
            "user-agent",
            b"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/114.0.0.0 Safari/537.36".as_slice(),
        ),
        ("accept", b"application/json".as_slice()),
        ("content-type", b"application/json".as_slice()),
    ]
}

fn benches(c: &mut Criterion) {
    let engine = match WafEngine::build(&WafConfig::default()) {
        Ok(e) => e,
        Err(e) => panic!("config: {e}"),
    };
    let mut g = c.benchmark_group("waf");
    for (name, body) in [
        ("json_1k_benign", json_1k(false)),
        ("json_1k_attack", json_1k(true)),
    ] {
        let view = RequestView {
            method: "POST",
            target: b"/api/orders?page=1",
            headers: headers(),
        };
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
    let mut fh = headers();
    fh[3] = (
        "content-type",
        b"application/x-www-form-urlencoded".as_slice(),
    );
    let form_view = RequestView {
        method: "POST",
        target: b"/submit",
        headers: fh,
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
    let get = RequestView {
        method: "GET",
        target: b"/search?q=blue+shoes&page=2&sort=price_asc",
        headers: headers(),
    };
    g.throughput(Throughput::Elements(1));
    g.bench_function("get_headers_benign", |b| {
        b.iter(|| black_box(engine.inspect_headers("bench", black_box(&get))))
    });
    g.finish();

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
            headers: headers(),
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
