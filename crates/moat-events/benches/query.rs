//! The console's event queries over a store of 100,000 events (newest first).
//!
//! `cargo bench -p moat-events --bench query`
//!
//! - `query/first_page`: the newest 50 security events of the last hour.
//! - `query/deep_page`: 50 events after one 90,000 rows deep (keyset pagination).
//! - `query/client_ip`: the one event of a client IP (a JSON field, no index).
//! - `query/timeline`: the 60-slice histogram of the last hour.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::Criterion;
use moat_core::{EventAction, SecurityEvent};
use moat_events::{now_ms, EventQuery, EventStore, Record, SecurityRecord};

const N: u64 = 100_000;

fn record(ts: u64, ip: &str) -> Record {
    Record::Security(SecurityRecord {
        ts,
        request_id: format!("{ts:016x}"),
        route: "api".into(),
        client_ip: ip.into(),
        method: "GET".into(),
        path: "/search".into(),
        event: SecurityEvent::new("waf", "sqli", EventAction::Block, "SQL injection")
            .at("query:q")
            .with_details(serde_json::json!({"fragment": "1' OR '1'='1"})),
        request: None,
    })
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let store = EventStore::open(&dir.path().join("events.db")).unwrap();
    let now = now_ms();
    let rows: Vec<Record> = (0..N)
        .map(|i| {
            record(
                now - N + i,
                if i == N / 2 {
                    "203.0.113.9"
                } else {
                    "10.0.0.1"
                },
            )
        })
        .collect();
    for chunk in rows.chunks(10_000) {
        store.insert(chunk).unwrap();
    }
    let q = |qs: &str| EventQuery::from_query_string(qs, now).unwrap();
    let first = q("since=1h&type=security&limit=50");
    let deep = q(&format!(
        "since=1h&type=security&limit=50&before={}",
        N - 90_000
    ));
    let ip = q("since=1h&type=security&limit=50&client_ip=203.0.113.9");
    assert_eq!(store.query(&first).unwrap().len(), 50);
    assert_eq!(store.query(&deep).unwrap().len(), 50);
    assert_eq!(store.query(&ip).unwrap().len(), 1);
    let mut c = Criterion::default().configure_from_args().sample_size(20);
    let mut g = c.benchmark_group("query");
    g.bench_function("first_page", |b| b.iter(|| store.query(&first).unwrap()));
    g.bench_function("deep_page", |b| b.iter(|| store.query(&deep).unwrap()));
    g.bench_function("client_ip", |b| b.iter(|| store.query(&ip).unwrap()));
    g.bench_function("timeline", |b| {
        b.iter(|| store.histogram(&first, now - 3_600_000, now, 60).unwrap())
    });
    g.finish();
    c.final_summary();
}
