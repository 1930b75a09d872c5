//! The HTTP sink against a receiver on a real loopback socket (hyper's HTTP/1.1 server):
//! batches arrive as NDJSON, a 503 is retried with backoff, a 400 refuses the batch for good,
//! and a reload leaves what an unchanged sink holds in place.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;

/// A receiver answering `status(n)` to its n-th request and keeping every body.
struct Receiver {
    addr: std::net::SocketAddr,
    bodies: Arc<Mutex<Vec<(String, String)>>>,
    _rt: tokio::runtime::Runtime,
}

fn receiver(status: fn(usize) -> u16) -> Receiver {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let bodies = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let b = bodies.clone();
    rt.spawn(async move {
        loop {
            let (s, _) = listener.accept().await.unwrap();
            let (b, count) = (b.clone(), count.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    let (b, count) = (b.clone(), count.clone());
                    async move {
                        let auth = req
                            .headers()
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string())
                            .unwrap_or_default();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let n = count.fetch_add(1, Ordering::SeqCst);
                        let code = status(n);
                        if code == 200 {
                            b.lock()
                                .push((auth, String::from_utf8(body.to_vec()).unwrap()));
                        }
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .status(StatusCode::from_u16(code).unwrap())
                                .body(Full::new(Bytes::from_static(b"{}")))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    Receiver {
        addr,
        bodies,
        _rt: rt,
    }
}

#[test]
fn batches_are_posted_and_5xx_retried() {
    // The first two requests fail with 503: the batch is sent again, unchanged.
    let rx = receiver(|n| if n < 2 { 503 } else { 200 });
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "sinks:\n  - name: hec\n    buffer: {{ retry_backoff: 10ms }}\n    http: {{ url: \"http://{}/services/collector/raw\", headers: {{ Authorization: \"Splunk t0ken\" }} }}\n",
        rx.addr
    );
    let (queue, writer, metrics) = common::start(&yaml, dir.path());
    for i in 0..10 {
        queue.push(common::access(&format!("r{i}"), "10.1.1.1"));
    }
    let stats = metrics.get("hec").unwrap();
    common::wait_for(Duration::from_secs(10), || {
        (stats.delivered.load(Ordering::Relaxed) >= 10).then_some(())
    })
    .expect("not delivered");
    writer.shutdown();
    let bodies = rx.bodies.lock();
    let lines: Vec<serde_json::Value> = bodies
        .iter()
        .flat_map(|(_, b)| {
            b.lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    assert_eq!(lines.len(), 10, "each record once");
    assert_eq!(lines[0]["request_id"], "r0");
    assert_eq!(lines[9]["request_id"], "r9");
    assert!(bodies.iter().all(|(auth, _)| auth == "Splunk t0ken"));
    assert_eq!(stats.send_errors.load(Ordering::Relaxed), 2);
}

#[test]
fn a_4xx_refuses_the_batch_for_good() {
    let rx = receiver(|n| if n == 0 { 400 } else { 200 });
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "sinks:\n  - name: es\n    format: ecs\n    http: {{ url: \"http://{}/_bulk\", body: elastic_bulk }}\n",
        rx.addr
    );
    let (queue, writer, metrics) = common::start(&yaml, dir.path());
    let stats = metrics.get("es").unwrap();
    queue.push(common::security("bad", "10.1.1.2"));
    common::wait_for(Duration::from_secs(10), || {
        (stats.rejected.load(Ordering::Relaxed) == 1).then_some(())
    })
    .expect("the 400 was not counted as a refusal");
    // Another client: the same event from 10.1.1.2 within the aggregation window
    // would be counted into the first one (events.md, "Flood control").
    queue.push(common::security("good", "10.1.1.4"));
    common::wait_for(Duration::from_secs(10), || {
        (stats.delivered.load(Ordering::Relaxed) == 1).then_some(())
    })
    .expect("the next batch was not delivered");
    writer.shutdown();
    let bodies = rx.bodies.lock();
    assert_eq!(bodies.len(), 1);
    let lines: Vec<&str> = bodies[0].1.lines().collect();
    assert_eq!(lines[0], "{\"create\":{}}");
    let doc: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(doc["http"]["request"]["id"], "good");
    assert_eq!(doc["rule"]["id"], "sqli");
    assert_eq!(doc["event"]["kind"], "alert");
}

#[test]
fn a_dead_receiver_never_blocks_and_drops_are_counted() {
    // Nothing listens on this port.
    let port = moat_testkit::free_port().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "sinks:\n  - name: dead\n    buffer: {{ max_records: 50, batch_max: 10 }}\n    http: {{ url: \"http://127.0.0.1:{port}/\" }}\n"
    );
    let (queue, writer, metrics) = common::start(&yaml, dir.path());
    for i in 0..500 {
        assert!(queue.push(common::access(&format!("r{i}"), "10.1.1.3")));
    }
    let stats = metrics.get("dead").unwrap();
    common::wait_for(Duration::from_secs(10), || {
        (stats.dropped.load(Ordering::Relaxed) >= 440 && stats.down.load(Ordering::Relaxed))
            .then_some(())
    })
    .expect("drops not counted");
    assert!(stats.depth.load(Ordering::Relaxed) <= 50);
    let mut text = String::new();
    metrics.render(&mut text);
    assert!(text.contains("moat_sink_up{sink=\"dead\"} 0"), "{text}");
    assert!(
        text.contains("moat_sink_queue_depth{sink=\"dead\"}"),
        "{text}"
    );
    // Shutdown gives up after `shutdown_timeout` and counts what it could not deliver.
    let t = std::time::Instant::now();
    writer.shutdown();
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "shutdown took {:?}",
        t.elapsed()
    );
    assert_eq!(stats.depth.load(Ordering::Relaxed), 0);
    assert_eq!(
        stats.dropped.load(Ordering::Relaxed) + stats.delivered.load(Ordering::Relaxed),
        500
    );
}

/// Records an unchanged sink holds while its destination fails are neither lost
/// nor sent twice when a reload adds another sink next to it.
#[test]
fn a_reload_keeps_what_an_unchanged_sink_holds() {
    let rx = receiver(|n| if n < 3 { 503 } else { 200 });
    let other = receiver(|_| 200);
    let dir = tempfile::tempdir().unwrap();
    let one = format!(
        "  - name: held\n    buffer: {{ retry_backoff: 200ms }}\n    http: {{ url: \"http://{}/\" }}\n",
        rx.addr
    );
    let (queue, writer, telemetry) = common::start_telemetry(&format!("sinks:\n{one}"), dir.path());
    let held = telemetry.metrics().get("held").unwrap();
    for i in 0..10 {
        queue.push(common::access(&format!("r{i}"), "10.1.2.1"));
    }
    common::wait_for(Duration::from_secs(10), || {
        (held.send_errors.load(Ordering::Relaxed) >= 1).then_some(())
    })
    .expect("the receiver's 503 was not seen");
    let two = format!(
        "sinks:\n  - name: added\n    http: {{ url: \"http://{}/\" }}\n{one}",
        other.addr
    );
    let cfg = common::parse(&two, dir.path());
    let (added, removed) = telemetry.prepare(&cfg, dir.path()).unwrap().commit();
    assert_eq!((added, removed), (vec!["added".to_string()], vec![]));
    queue.push(common::access("r10", "10.1.2.1"));
    common::wait_for(Duration::from_secs(10), || {
        (held.delivered.load(Ordering::Relaxed) >= 11).then_some(())
    })
    .expect("what the sink held was not delivered after the reload");
    writer.shutdown();
    let ids: Vec<String> = rx
        .bodies
        .lock()
        .iter()
        .flat_map(|(_, b)| {
            b.lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["request_id"].to_string()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let want: Vec<String> = (0..=10).map(|i| format!("\"r{i}\"")).collect();
    assert_eq!(ids, want, "each record once, in order");
    assert_eq!(held.dropped.load(Ordering::Relaxed), 0);
    // The added sink saw only what came after it.
    let got = other.bodies.lock();
    assert_eq!(got.len(), 1);
    assert!(got[0].1.contains("\"r10\""), "{got:?}");
}

#[test]
fn linger_holds_a_partial_batch_and_a_full_one_goes_at_once() {
    let rx = receiver(|_| 200);
    let dir = tempfile::tempdir().unwrap();
    // A minute of linger: only a full batch (20) or the shutdown can send before it ends.
    let yaml = format!(
        "sinks:\n  - name: l\n    buffer: {{ linger: 60s, batch_max: 20 }}\n    http: {{ url: \"http://{}/in\" }}\n",
        rx.addr
    );
    let (queue, writer, metrics) = common::start(&yaml, dir.path());
    let stats = metrics.get("l").unwrap();
    for i in 0..20 {
        queue.push(common::access(&format!("r{i}"), "10.1.1.1"));
    }
    common::wait_for(Duration::from_secs(10), || {
        (stats.delivered.load(Ordering::Relaxed) == 20).then_some(())
    })
    .expect("a full batch waited for the linger");
    for i in 20..25 {
        queue.push(common::access(&format!("r{i}"), "10.1.1.1"));
    }
    common::wait_for(Duration::from_secs(5), || {
        (stats.depth.load(Ordering::Relaxed) == 5).then_some(())
    })
    .expect("the records did not reach the sink's buffer");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        stats.delivered.load(Ordering::Relaxed),
        20,
        "a partial batch went before the linger"
    );
    // Shutdown delivers what lingers.
    writer.shutdown();
    assert_eq!(stats.delivered.load(Ordering::Relaxed), 25);
    let sizes: Vec<usize> = rx
        .bodies
        .lock()
        .iter()
        .map(|(_, b)| b.lines().count())
        .collect();
    assert_eq!(sizes, [20, 5], "one POST per batch");
}
