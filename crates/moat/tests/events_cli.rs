//! `moat events` against a store written by the real event writer.
// Test helpers: a failed setup step is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use moat_core::{EventAction, SecurityEvent};
use moat_events::{
    now_ms, AccessRecord, EventWriter, EventsConfig, Record, SecurityRecord, StoreConfig,
};

fn moat(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_moat"))
        .args(args)
        .output()
        .expect("run moat");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `moat events --json`'s output: one record a line.
fn json_lines(out: &str) -> Vec<serde_json::Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn events_query_table_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EventsConfig {
        store: Some(StoreConfig {
            path: "events.db".into(),
            ..StoreConfig::default()
        }),
        ..EventsConfig::default()
    };
    let (queue, writer) = EventWriter::start(&cfg, dir.path()).unwrap();
    let now = now_ms();
    let mut event_ids = Vec::new();
    for (i, (engine, route, age_ms)) in [
        ("waf", "api", 60_000u64),
        ("waf", "web", 120_000),
        ("authz", "api", 30_000),
        ("waf", "api", 3 * 3_600_000),
    ]
    .into_iter()
    .enumerate()
    {
        let event = SecurityEvent::new(engine, "xss", EventAction::Block, "cross-site scripting");
        event_ids.push(event.id.clone());
        assert!(queue.push(Record::Security(SecurityRecord {
            ts: now - age_ms,
            request_id: format!("req-{i}"),
            route: route.into(),
            client_ip: "192.0.2.1".into(),
            method: "GET".into(),
            path: "/search".into(),
            event,
            request: None,
        })));
    }
    assert!(queue.push(Record::Access(AccessRecord {
        ts: now,
        request_id: "req-9".into(),
        route: "api".into(),
        method: "GET".into(),
        path: "/".into(),
        status: 200,
        decision: "allow".into(),
        ..AccessRecord::default()
    })));
    writer.shutdown();
    let db = dir.path().join("events.db");
    let db = db.to_str().unwrap();

    let (code, out, err) = moat(&[
        "events", "--db", db, "--since", "1h", "--type", "waf", "--route", "api", "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["request_id"], "req-0");
    assert_eq!(lines[0]["event"]["rule"], "xss");

    let (code, out, _) = moat(&["events", "--db", db, "--type", "security", "--limit", "2"]);
    assert_eq!(code, 0);
    let rows: Vec<&str> = out.lines().collect();
    assert_eq!(rows.len(), 3, "{out}");
    assert!(rows[0].starts_with("TIME"));
    assert!(rows[1].contains("authz/xss"), "newest first: {out}");

    let (code, out, _) = moat(&["events", "--db", db, "--json"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 5);

    // What a refused user quotes (the response's x-request-id) finds its events.
    let (code, out, err) = moat(&["events", "--db", db, "--request-id", "req-2", "--json"]);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["event"]["engine"], "authz");
    let (code, out, _) = moat(&[
        "events",
        "--db",
        db,
        "--client-ip",
        "192.0.2.1",
        "--rule",
        "xss",
    ]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 5, "a header and 4 rows: {out}");
    // The event id a refusal's x-moat-event-id (or a block page) names finds that
    // event alone, however old (the 3-hour-old one here).
    let (code, out, err) = moat(&["events", "--db", db, "--event-id", &event_ids[3], "--json"]);
    assert_eq!(code, 0, "{err}");
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{out}");
    assert_eq!(lines[0]["event"]["id"], event_ids[3].as_str());
    assert_eq!(lines[0]["request_id"], "req-3");
    let (code, out, _) = moat(&["events", "--db", db, "--event-id", "0123456789abcdef"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 1, "the header alone: {out}");
    let (code, out, _) = moat(&["events", "--db", db, "--client-ip", "192.0.2.9"]);
    assert_eq!(code, 0);
    assert_eq!(out.lines().count(), 1, "the header alone: {out}");

    let (code, _, err) = moat(&["events", "--db", db, "--since", "soon"]);
    assert_eq!(code, 2);
    assert!(err.contains("since"), "{err}");

    let missing = dir.path().join("none.db");
    let (code, _, err) = moat(&["events", "--db", missing.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("none.db"), "{err}");
}
