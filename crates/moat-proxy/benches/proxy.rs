//! End-to-end request cost through the gateway on loopback, against a direct baseline.
//!
//! `cargo bench -p moat-proxy --bench proxy`
//!
//! Each iteration is one keep-alive GET from a hyper client. `direct` talks to the
//! upstream, `via_moat` goes through the gateway (no engines), `via_moat_phases` adds one
//! request-headers phase. The difference is what the proxy adds per request (client,
//! gateway and upstream share the runtime's threads).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use moat_core::{RequestCtx, RequestHeadersPhase, Verdict};
use moat_proxy::config::{self, ConfigSource};
use moat_proxy::{Gateway, GatewayOptions};

struct Noop;
impl RequestHeadersPhase for Noop {
    fn name(&self) -> &'static str {
        "noop"
    }
    fn on_request_headers(&self, _: &mut RequestCtx, _: &mut http::request::Parts) -> Verdict {
        Verdict::Continue
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (up, plain, phased) = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let svc = service_fn(|_req| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
                            b"hello from upstream\n",
                        ))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        let yaml = format!(
            "listeners:\n  - name: main\n    address: 127.0.0.1:0\nadmin: {{ address: 127.0.0.1:0 }}\nclusters:\n  - name: app\n    endpoints: [\"{up}\"]\nroutes:\n  - name: all\n    cluster: app\n"
        );
        let src = ConfigSource {
            file: "bench.yaml".into(),
            base_dir: ".".into(),
        };
        let cfg = config::parse(&src, &yaml).unwrap();
        let plain = Gateway::new(cfg.clone(), src.clone(), GatewayOptions::default())
            .unwrap()
            .start()
            .await
            .unwrap();
        let opts = GatewayOptions {
            pipeline_factory: Arc::new(|cfg, src| {
                let mut p = moat_proxy::build_pipeline(cfg, src)?;
                p.request_headers.push(Arc::new(Noop));
                Ok(p)
            }),
            ..GatewayOptions::default()
        };
        let phased = Gateway::new(cfg, src, opts).unwrap().start().await.unwrap();
        (up, plain, phased)
    });
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let targets = [
        ("direct", up),
        ("via_moat", plain.listener_addr("main").unwrap()),
        ("via_moat_phases", phased.listener_addr("main").unwrap()),
    ];
    let mut g = c.benchmark_group("get");
    for (name, addr) in targets {
        let url: http::Uri = format!("http://{addr}/bench").parse().unwrap();
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let resp = client
                        .request(
                            Request::get(url.clone())
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                        .await
                        .unwrap();
                    resp.into_body().collect().await.unwrap().to_bytes()
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
