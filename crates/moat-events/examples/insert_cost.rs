//! Inserts B batches of the `writer` bench's 10,000 records (serialization included,
//! as `store/insert_direct`), for instruction counts that do not depend on the
//! machine's load:
//!
//! ```sh
//! cargo build --release -p moat-events --example insert_cost
//! valgrind --tool=callgrind target/release/examples/insert_cost 6
//! ```
//!
//! B = 1 gives the setup's and the first batch's cost to subtract. Each batch has
//! fresh times (one record per 10 µs), as the writer's batches do.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use moat_core::{EventAction, SecurityEvent};
use moat_events::{AccessRecord, EventStore, Record, SecurityRecord};

/// The `writer` bench's mix: a WAF block for every fourth record, access records.
fn record(i: u64, ts: u64) -> Record {
    if i & 3 == 0 {
        Record::Security(SecurityRecord {
            ts,
            request_id: format!("{i:016x}"),
            route: "api".into(),
            client_ip: "203.0.113.7".into(),
            method: "POST".into(),
            path: "/api/v1/orders".into(),
            event: SecurityEvent::new(
                "waf",
                "sqli",
                EventAction::Block,
                "SQL injection in query parameter",
            )
            .at("query:id")
            .with_details(serde_json::json!({"fragment": "1 OR 1=1", "score": 5})),
            request: None,
        })
    } else {
        Record::Access(AccessRecord {
            ts,
            request_id: format!("{i:016x}"),
            route: "api".into(),
            method: "GET".into(),
            path: format!("/api/v1/items/{i}"),
            status: 200,
            decision: "allow".into(),
            client_ip: "203.0.113.7".into(),
            duration_us: 350,
            bytes_in: 0,
            bytes_out: 1234,
            upstream: Some("127.0.0.1:9000".into()),
        })
    }
}

fn main() {
    let batches: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(6);
    let dir = tempfile::tempdir().unwrap();
    let store = EventStore::open(&dir.path().join("cost.db")).unwrap();
    let start = 1_800_000_000_000u64;
    for b in 0..batches {
        let records: Vec<Record> = (0..10_000)
            .map(|i| record(b * 10_000 + i, start + (b * 10_000 + i) / 100))
            .collect();
        store.insert(&records).unwrap();
    }
}
