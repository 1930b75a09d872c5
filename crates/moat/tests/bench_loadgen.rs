//! Behaviour of the load generator against the built-in upstream on loopback:
//! open-loop rate accuracy, and coordinated-omission correction.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use moat_bench::loadgen::{self, LoadSpec, Mode, Protocol, RequestTemplate, Target};
use moat_bench::upstream::{Upstream, UpstreamConfig};

fn target(up: &Upstream) -> Target {
    Target::parse(&format!("http://{}", up.addr())).unwrap()
}

#[test]
fn open_loop_rate_is_within_two_percent_at_1000_rps() {
    let up = Upstream::start(UpstreamConfig::default()).unwrap();
    let mut spec = LoadSpec::closed(target(&up), vec![RequestTemplate::get("/")], 8);
    spec.mode = Mode::Open { rate: 1000.0 };
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_secs(3);
    let before = up.requests();
    let res = loadgen::run(&spec, None).unwrap();
    let received = up.requests() - before;
    // 3 s at 1000 req/s: 3000 requests, counted by the server.
    let expected = 3000.0;
    let err = (received as f64 - expected).abs() / expected;
    assert!(
        err <= 0.02,
        "server received {received}, expected {expected}"
    );
    assert_eq!(res.errors.total(), 0, "{:?}", res.errors);
    assert_eq!(res.responses, received);
    assert!((res.rps() - 1000.0).abs() / 1000.0 <= 0.02, "{}", res.rps());
}

#[test]
fn open_loop_p99_reflects_a_stall_and_closed_loop_p99_does_not() {
    let stall = Duration::from_millis(200);
    // Open loop: 1000 req/s for 3 s; the server blocks 200 ms at request 500.
    // About 200 requests (6.7%) should have been sent during the stall.
    let up = Upstream::start(UpstreamConfig {
        stall: Some((500, stall)),
        ..Default::default()
    })
    .unwrap();
    let mut spec = LoadSpec::closed(target(&up), vec![RequestTemplate::get("/")], 4);
    spec.mode = Mode::Open { rate: 1000.0 };
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_secs(3);
    let open = loadgen::run(&spec, None).unwrap().summary();
    drop(up);

    // Closed loop: same stall, 4 connections as fast as possible; only the 4
    // requests in flight during the stall see it.
    let up = Upstream::start(UpstreamConfig {
        stall: Some((2000, stall)),
        ..Default::default()
    })
    .unwrap();
    let mut spec = LoadSpec::closed(target(&up), vec![RequestTemplate::get("/")], 4);
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_secs(3);
    let closed_res = loadgen::run(&spec, None).unwrap();
    let closed = closed_res.summary();
    assert!(up.requests() > 2000, "the stall must have happened");

    assert!(open.p99_us >= 100_000.0, "open loop p99 {open:?}");
    assert!(open.max_us >= 150_000.0, "open loop max {open:?}");
    assert!(
        closed.max_us >= 150_000.0,
        "closed loop saw the stall: {closed:?}"
    );
    assert!(closed.p99_us < 100_000.0, "closed loop p99 {closed:?}");
}

#[test]
fn h2_and_keep_alive_and_reconnects_work() {
    let up = Upstream::start(UpstreamConfig::default()).unwrap();
    let mut spec = LoadSpec::closed(target(&up), vec![RequestTemplate::get("/")], 2);
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_secs(10);
    spec.max_requests = Some(200);
    spec.protocol = Protocol::H2;
    spec.streams = 4;
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, 200);
    assert_eq!(res.errors.total(), 0);
    assert_eq!(res.connections_opened, 2);

    spec.protocol = Protocol::Http1;
    spec.streams = 1;
    spec.new_connection_per_request = true;
    let mut post = RequestTemplate::get("/upload");
    post.method = "POST".into();
    post.body = vec![b'x'; 50_000].into();
    spec.requests = vec![post];
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, 200);
    assert_eq!(res.errors.total(), 0);
    assert!(res.connections_opened >= 200);
}

#[test]
fn the_upstream_answers_grpc_calls_over_h2() {
    let up = Upstream::start(UpstreamConfig::default()).unwrap();
    let mut call = RequestTemplate::get("/envoy.service.auth.v3.Authorization/Check");
    call.method = "POST".into();
    call.headers = vec![
        ("content-type".into(), "application/grpc".into()),
        ("te".into(), "trailers".into()),
    ];
    // An empty CheckRequest: a zero compression flag and a zero length.
    call.body = vec![0u8; 5].into();
    let mut spec = LoadSpec::closed(target(&up), vec![call], 2);
    spec.warmup = Duration::ZERO;
    spec.max_requests = Some(100);
    spec.protocol = Protocol::H2;
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, 100);
    // grpc-status 0 in the trailers: no gRPC errors.
    assert_eq!(res.errors.total(), 0, "{:?}", res.errors);
    // The empty message: 5 bytes.
    assert_eq!(res.bytes, 500);
}

#[test]
fn refused_connections_are_counted_as_errors() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let t = Target::parse(&format!("http://{addr}")).unwrap();
    let mut spec = LoadSpec::closed(t, vec![RequestTemplate::get("/")], 1);
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_millis(300);
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, 0);
    assert!(res.errors.io > 0);
}

#[test]
fn tls_upstream_serves_full_handshakes_over_http1_and_h2() {
    // The `direct` baseline of the TLS scenario: the upstream terminates TLS.
    let cert = moat_bench::tls::self_signed(&["localhost", "127.0.0.1"]).unwrap();
    let up = Upstream::start(UpstreamConfig {
        tls: Some(std::sync::Arc::new(
            moat_bench::tls::server_config(&cert).unwrap(),
        )),
        ..Default::default()
    })
    .unwrap();
    let t = Target::parse(&format!("https://{}", up.addr())).unwrap();
    let mut spec = LoadSpec::closed(t, vec![RequestTemplate::get("/")], 2);
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_secs(20);
    spec.max_requests = Some(100);
    spec.new_connection_per_request = true;
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, 100, "{:?}", res.errors);
    assert_eq!(res.errors.total(), 0);
    assert!(res.connections_opened >= 100);

    spec.new_connection_per_request = false;
    spec.protocol = Protocol::H2;
    spec.streams = 2;
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, 100, "{:?}", res.errors);
    assert_eq!(res.errors.total(), 0);
    assert_eq!(res.connections_opened, 2);
    assert!(up.requests() >= 200);
}

#[test]
fn measure_hook_runs_once_after_the_warm_up() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let up = Arc::new(Upstream::start(UpstreamConfig::default()).unwrap());
    let calls = Arc::new(AtomicU64::new(0));
    let served_at_call = Arc::new(AtomicU64::new(0));
    let mut spec = LoadSpec::closed(target(&up), vec![RequestTemplate::get("/")], 2);
    spec.mode = Mode::Open { rate: 500.0 };
    spec.warmup = Duration::from_millis(400);
    spec.duration = Duration::from_millis(400);
    let (c, s, u) = (calls.clone(), served_at_call.clone(), up.clone());
    spec.on_measure_start = Some(loadgen::MeasureHook(Arc::new(move || {
        c.fetch_add(1, Ordering::SeqCst);
        s.store(u.requests(), Ordering::SeqCst);
    })));
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Warm-up requests were served before the hook, measured ones after it.
    let at_call = served_at_call.load(Ordering::SeqCst);
    assert!(at_call > 0, "no warm-up request before the hook");
    assert!(res.responses > 0 && up.requests() > at_call);
}

#[test]
fn closed_loop_with_a_request_count_sends_exactly_that_many() {
    let up = Upstream::start(UpstreamConfig::default()).unwrap();
    let mut spec = LoadSpec::closed(target(&up), vec![RequestTemplate::get("/")], 3);
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_secs(30);
    spec.max_requests = Some(300);
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, 300);
    // Nothing unrecorded before the clock starts.
    assert_eq!(up.requests(), 300);
}
