//! The event store's schema: the upgrade of a store written by the previous moat, and
//! the timeline's counts against the rows they count (through inserts and retention).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use moat_core::{EventAction, SecurityEvent};
use moat_events::{
    now_ms, AccessRecord, EventQuery, EventStore, Record, SecurityRecord, TcpRecord,
};

fn security(i: u64, ts: u64, engine: &'static str, rule: &str, ip: &str) -> Record {
    Record::Security(SecurityRecord {
        ts,
        request_id: format!("req-{i}"),
        route: if i.is_multiple_of(3) { "admin" } else { "api" }.into(),
        client_ip: ip.into(),
        method: "GET".into(),
        path: "/x".into(),
        event: SecurityEvent::new(
            engine,
            rule,
            if i.is_multiple_of(2) {
                EventAction::Block
            } else {
                EventAction::Monitor
            },
            "m",
        ),
        request: None,
    })
}

fn mixed(n: u64, start: u64, step: u64) -> Vec<Record> {
    (0..n)
        .map(|i| {
            let ts = start + i * step;
            match i % 5 {
                0 => Record::Access(AccessRecord {
                    ts,
                    request_id: format!("req-{i}"),
                    route: "api".into(),
                    decision: "allow".into(),
                    client_ip: format!("10.0.0.{}", i % 7),
                    ..AccessRecord::default()
                }),
                1 => Record::Tcp(TcpRecord {
                    ts,
                    listener: "pg".into(),
                    client_ip: format!("10.0.0.{}", i % 7),
                    decision: "block".into(),
                    rule: Some("ns/pg[rule 1]".into()),
                    ..TcpRecord::default()
                }),
                2 => security(
                    i,
                    ts,
                    "authz",
                    "ns/deny[rule 0]",
                    &format!("10.0.0.{}", i % 7),
                ),
                _ => security(i, ts, "waf", "sqli", &format!("10.0.0.{}", i % 7)),
            }
        })
        .collect()
}

/// Every stored record, newest first (no filter: read straight from the rows).
fn all_rows(store: &EventStore) -> Vec<serde_json::Value> {
    store
        .query(&EventQuery {
            limit: moat_events::store::MAX_QUERY_LIMIT,
            ..EventQuery::default()
        })
        .unwrap()
}

/// Whether a stored record matches the filters of `q`, decided from its JSON.
fn matches(v: &serde_json::Value, q: &EventQuery) -> bool {
    let s = |a: &serde_json::Value| a.as_str().map(str::to_string);
    let engine = s(&v["event"]["engine"]).or_else(|| (v["type"] == "tls").then(|| "tls".into()));
    let rule = s(&v["event"]["rule"]).or_else(|| s(&v["rule"]));
    let action = s(&v["event"]["action"]).or_else(|| s(&v["decision"]));
    let route = s(&v["route"]).or_else(|| s(&v["listener"]));
    let is = |want: &Option<String>, got: Option<String>| want.is_none() || *want == got;
    q.kind
        .as_ref()
        .is_none_or(|k| s(&v["type"]).as_ref() == Some(k) || engine.as_ref() == Some(k))
        && is(&q.rule, rule)
        && is(&q.action, action)
        && is(&q.route, route)
        && is(&q.client_ip, s(&v["client_ip"]))
        && is(&q.request_id, s(&v["request_id"]))
        && is(&q.event_id, s(&v["event"]["id"]))
}

/// The records matching `qs` within `[since, until)`, newest first, from the rows.
fn expected(rows: &[serde_json::Value], qs: &str, since: u64, until: u64) -> Vec<i64> {
    let q = EventQuery::from_query_string(qs, 0).unwrap();
    rows.iter()
        .filter(|v| (since..until).contains(&v["ts"].as_u64().unwrap()) && matches(v, &q))
        .map(|v| v["id"].as_i64().unwrap())
        .collect()
}

const FILTERS: [&str; 13] = [
    "",
    "type=security",
    "type=waf",
    "type=tcp",
    "rule=ns%2Fdeny%5Brule+0%5D",
    "rule=ns%2Fpg%5Brule+1%5D",
    "action=monitor",
    "route=admin",
    "route=pg",
    "type=authz&action=block&route=admin",
    "client_ip=10.0.0.3",
    "client_ip=10.0.0.3&type=waf",
    "request_id=req-12",
];

/// Records a page of [`assert_store_matches_rows`]: small enough to split the bursts.
const PAGE: usize = 25;

/// Every filter's listing, paged, and its timeline, slice by slice, agree with the rows
/// (the filters of [`FILTERS`], and one on the event id of the newest security record).
fn assert_store_matches_rows(store: &EventStore, since: u64, until: u64) {
    let rows = all_rows(store);
    let event_id = rows
        .iter()
        .find_map(|v| v["event"]["id"].as_str())
        .map(|id| format!("event_id={id}"));
    for qs in FILTERS.iter().copied().chain(event_id.as_deref()) {
        let want = expected(&rows, qs, since, until);
        let mut q = EventQuery::from_query_string(qs, 0).unwrap();
        (q.since, q.until, q.limit) = (Some(since), Some(until), PAGE);
        let mut got = Vec::new();
        loop {
            let page = store.query(&q).unwrap();
            got.extend(page.iter().map(|v| v["id"].as_i64().unwrap()));
            match page.last() {
                Some(last) if page.len() == PAGE => q.before_id = last["id"].as_i64(),
                _ => break,
            }
        }
        assert_eq!(got, want, "{qs}: listing");

        let q = EventQuery::from_query_string(qs, 0).unwrap();
        let t = store.timeline(&q, since, until, 12).unwrap();
        assert!(t.start <= since && t.end() >= until, "{qs}: {t:?}");
        let mut want = vec![0u64; t.counts.len()];
        for v in &rows {
            let ts = v["ts"].as_u64().unwrap();
            if ts >= t.start && ts < t.end() && matches(v, &q) {
                want[((ts - t.start) / t.width) as usize] += 1;
            }
        }
        assert_eq!(t.counts, want, "{qs}: {t:?}");
    }
}

#[test]
fn listings_and_timelines_match_the_rows_through_retention() {
    let dir = tempfile::tempdir().unwrap();
    let store = EventStore::open(&dir.path().join("t.db")).unwrap();
    let now = now_ms() / 1000 * 1000;
    let start = now - 2 * 3_600_000;
    // 2 hours, a record every 1.3 s, inserted in batches, one batch out of order.
    let rows = mixed(5_000, start, 1_300);
    for chunk in rows.chunks(700).rev() {
        store.insert(chunk).unwrap();
    }
    // A burst: 300 records of one millisecond (pages split inside it).
    store.insert(&mixed(300, start + 600_000, 0)).unwrap();
    assert_store_matches_rows(&store, start, now);
    assert_store_matches_rows(&store, start + 123_457, start + 1_800_000);

    // Age: the cut falls inside a count slice (the slice keeps its younger rows).
    let deleted = store
        .apply_retention(now, Duration::from_millis(3_600_000 + 4_321), u64::MAX)
        .unwrap();
    assert!(deleted > 2_000, "{deleted}");
    assert_store_matches_rows(&store, start, now);
    // Size: the oldest rows go, whole slices and a part of one.
    let before = store.count().unwrap();
    store
        .apply_retention(
            now,
            Duration::from_secs(86_400),
            store.used_bytes().unwrap() / 2,
        )
        .unwrap();
    assert!(store.count().unwrap() < before);
    assert_store_matches_rows(&store, start, now);
    // The overview's counts are the same counts.
    let blocks: u64 = store
        .count_security(start)
        .unwrap()
        .iter()
        .map(|(_, _, n)| n)
        .sum();
    let security = expected(&all_rows(&store), "type=security", 0, u64::MAX);
    assert_eq!(blocks, security.len() as u64);
}

/// The previous schema, as moat wrote it before version 2 (no `user_version`).
const V1: &str = "
CREATE TABLE events (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, kind TEXT NOT NULL,
    engine TEXT, route TEXT, action TEXT, request_id TEXT, data TEXT NOT NULL);
CREATE INDEX events_ts ON events(ts);
";

fn write_v1(path: &Path, rows: &[Record]) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA auto_vacuum=INCREMENTAL; PRAGMA journal_mode=WAL;")
        .unwrap();
    conn.execute_batch(V1).unwrap();
    for r in rows {
        conn.execute(
            "INSERT INTO events (ts, kind, engine, route, action, request_id, data)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            rusqlite::params![
                r.ts() as i64,
                r.kind(),
                r.engine(),
                r.route(),
                r.action(),
                r.request_id(),
                serde_json::to_string(r).unwrap()
            ],
        )
        .unwrap();
    }
}

#[test]
fn a_version_1_store_is_upgraded_when_the_writer_opens_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let now = now_ms();
    let start = now - 3_600_000;
    write_v1(&path, &mixed(600, start, 6_000));

    // A reader cannot upgrade it, and says who does.
    let e = EventStore::open_read_only(&path).unwrap_err().to_string();
    assert!(e.contains("old.db") && e.contains("version 1"), "{e}");

    let store = EventStore::open(&path).unwrap();
    assert_eq!(store.count().unwrap(), 600);
    // The filters that read the JSON before now read the new columns.
    let listed = |qs: &str| {
        let mut q = EventQuery::from_query_string(qs, 0).unwrap();
        q.limit = 1000;
        store.query(&q).unwrap().len()
    };
    assert_eq!(listed("rule=sqli"), 240);
    assert_eq!(listed("rule=ns%2Fpg%5Brule+1%5D"), 120);
    assert_eq!(listed("client_ip=10.0.0.3"), 86);
    assert_store_matches_rows(&store, start, now);
    // New records go in beside the old ones; opening again changes nothing.
    store.insert(&mixed(10, now, 1)).unwrap();
    drop(store);
    let store = EventStore::open(&path).unwrap();
    assert_eq!(store.count().unwrap(), 610);
    drop(store);
    let store = EventStore::open_read_only(&path).unwrap();
    assert_store_matches_rows(&store, start, now + 10);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let indexes: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(indexes, ["events_scan"], "the old time index is gone");
}

/// Rewrites a store of this moat as version 2 wrote it: no event id hashes.
fn downgrade_to_v2(path: &Path) {
    rusqlite::Connection::open(path)
        .unwrap()
        .execute_batch(
            "DROP INDEX events_scan;
             ALTER TABLE events DROP COLUMN event_id_hash;
             CREATE INDEX events_scan ON events(ts, id, client_ip_hash, request_id_hash);
             PRAGMA user_version = 2;",
        )
        .unwrap();
}

#[test]
fn a_version_2_store_is_upgraded_when_the_writer_opens_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v2.db");
    let now = now_ms();
    let start = now - 3_600_000;
    let records = mixed(600, start, 6_000);
    let store = EventStore::open(&path).unwrap();
    store.insert(&records).unwrap();
    drop(store);
    downgrade_to_v2(&path);

    let e = EventStore::open_read_only(&path).unwrap_err().to_string();
    assert!(e.contains("v2.db") && e.contains("version 2"), "{e}");
    let store = EventStore::open(&path).unwrap();
    assert_eq!(store.count().unwrap(), 600);
    // The event ids written before the upgrade are found by their new hashes.
    for r in records
        .iter()
        .filter(|r| r.event_id().is_some())
        .step_by(37)
    {
        let id = r.event_id().unwrap();
        let mut q = EventQuery::default();
        q.set("event_id", id, now).unwrap();
        let found = store.query(&q).unwrap();
        assert_eq!(found.len(), 1, "{id}");
        assert_eq!(found[0]["event"]["id"], id);
        assert_eq!(found[0]["request_id"], r.request_id().unwrap());
    }
    assert_store_matches_rows(&store, start, now);
    drop(store);
    let store = EventStore::open_read_only(&path).unwrap();
    assert_store_matches_rows(&store, start, now);
}

#[test]
fn a_store_from_a_newer_moat_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new.db");
    drop(EventStore::open(&path).unwrap());
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("PRAGMA user_version = 9;")
        .unwrap();
    for e in [
        EventStore::open(&path).unwrap_err(),
        EventStore::open_read_only(&path).unwrap_err(),
    ] {
        let e = e.to_string();
        assert!(e.contains("new.db") && e.contains("version 9"), "{e}");
    }
}
