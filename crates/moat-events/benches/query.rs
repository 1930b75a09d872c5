//! The console's event queries over a store of 100,000 events in one hour (newest first).
//!
//! `cargo bench -p moat-events --bench query`
//!
//! The store: 100,000 records over the last hour, one every 36 ms: WAF blocks of
//! `sqli` on route `api` from 1,000 client IPs, and every 10,000th record an `authz`
//! event in `monitor` mode on route `admin` (rule `ns/deny[rule 0]`): the sparse
//! matches a filter has to find among the others. One client IP has a single event.
//!
//! - `query/first_page`: the newest 50 security events of the last hour.
//! - `query/deep_page`: 50 events after one 90,000 rows deep (keyset pagination).
//! - `query/time_range`: the newest 50 of a 10-minute window 30 minutes ago.
//! - `query/engine`, `query/rule`, `query/action`, `query/route`: the 10 sparse events,
//!   found by each filter alone.
//! - `query/client_ip`, `query/request_id`: the one event of a client IP, of a request.
//! - `query/timeline`: the 60-slice timeline of the last hour (security events).
//! - `query/timeline_rule`: the same, filtered on the sparse rule.
//! - `query/timeline_client_ip`: the same, filtered on a client IP with 100 events
//!   (a filter the counts table cannot answer: read from the rows).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::Criterion;
use moat_core::{EventAction, SecurityEvent};
use moat_events::{now_ms, EventQuery, EventStore, Record, SecurityRecord};

const N: u64 = 100_000;
const HOUR: u64 = 3_600_000;

fn record(i: u64, ts: u64) -> Record {
    let sparse = i % 10_000 == 5;
    let ip = if i == N / 2 {
        "203.0.113.9".to_string()
    } else {
        format!("10.0.{}.{}", (i % 1000) / 256, i % 256)
    };
    let event = if sparse {
        SecurityEvent::new("authz", "ns/deny[rule 0]", EventAction::Monitor, "denied")
    } else {
        SecurityEvent::new("waf", "sqli", EventAction::Block, "SQL injection")
            .at("query:q")
            .with_details(serde_json::json!({"fragment": "1' OR '1'='1"}))
    };
    Record::Security(SecurityRecord {
        ts,
        // Random-looking, like the proxy's.
        request_id: format!(
            "{:032x}",
            (i as u128 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c)
        ),
        route: if sparse { "admin" } else { "api" }.into(),
        client_ip: ip,
        method: "GET".into(),
        path: "/search".into(),
        event,
        request: None,
    })
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let store = EventStore::open(&dir.path().join("events.db")).unwrap();
    let now = now_ms();
    let start = now - HOUR;
    let rows: Vec<Record> = (0..N).map(|i| record(i, start + i * (HOUR / N))).collect();
    for chunk in rows.chunks(10_000) {
        store.insert(chunk).unwrap();
    }
    let one_request = rows[(N / 3) as usize].request_id().unwrap().to_string();
    let one_event = rows[(N / 4) as usize].event_id().unwrap().to_string();
    let q = |qs: &str| EventQuery::from_query_string(qs, now).unwrap();
    let queries = [
        ("first_page", q("since=1h&type=security&limit=50"), 50),
        (
            "deep_page",
            q(&format!(
                "since=1h&type=security&limit=50&before={}",
                N - 90_000
            )),
            50,
        ),
        (
            "time_range",
            q(&format!(
                "since={}&until={}&type=security&limit=50",
                now - HOUR / 2,
                now - HOUR / 2 + 600_000
            )),
            50,
        ),
        ("engine", q("since=1h&type=authz&limit=50"), 10),
        (
            "rule",
            q("since=1h&rule=ns%2Fdeny%5Brule+0%5D&limit=50"),
            10,
        ),
        ("action", q("since=1h&action=monitor&limit=50"), 10),
        ("route", q("since=1h&route=admin&limit=50"), 10),
        ("client_ip", q("since=1h&client_ip=203.0.113.9&limit=50"), 1),
        (
            "request_id",
            q(&format!("since=1h&request_id={one_request}&limit=50")),
            1,
        ),
        (
            "event_id",
            q(&format!("since=1h&event_id={one_event}&limit=50")),
            1,
        ),
    ];
    for (name, query, expect) in &queries {
        assert_eq!(store.query(query).unwrap().len(), *expect, "{name}");
    }
    let security = q("type=security");
    let rule = q("rule=ns%2Fdeny%5Brule+0%5D");
    let ip = q("client_ip=10.0.0.7");
    let timeline = |f: &EventQuery| store.timeline(f, now - HOUR, now, 60).unwrap();
    assert_eq!(timeline(&security).counts.iter().sum::<u64>(), N);
    assert_eq!(timeline(&rule).counts.iter().sum::<u64>(), 10);
    assert_eq!(timeline(&ip).counts.iter().sum::<u64>(), 100);

    let mut c = Criterion::default().configure_from_args().sample_size(20);
    let mut g = c.benchmark_group("query");
    for (name, query, _) in &queries {
        g.bench_function(*name, |b| b.iter(|| store.query(query).unwrap()));
    }
    g.bench_function("timeline", |b| b.iter(|| timeline(&security)));
    g.bench_function("timeline_rule", |b| b.iter(|| timeline(&rule)));
    g.bench_function("timeline_client_ip", |b| b.iter(|| timeline(&ip)));
    g.finish();
    c.final_summary();
}
