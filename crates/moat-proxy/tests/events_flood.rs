//! Event flood control on a real gateway: thousands of attack requests over
//! loopback into a real SQLite store. The store must stay small, and the counts of
//! the aggregated records must add up to the requests sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use moat_events::{EventQuery, EventStore};
use moat_proxy::admin::AdminRouter;
use moat_proxy::config;
use moat_proxy::events::QueueSink;
use moat_proxy::GatewayOptions;
use serde_json::Value;

/// Identical attacks (one aggregation key per record type).
const REPEATS: usize = 3000;
/// Attacks on distinct paths: a new key each, so the client cap applies.
const DISTINCT: usize = 300;
const CLIENT_CAP: u64 = 50;

fn yaml(up: SocketAddr) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{up}"]
routes:
  - name: all
    cluster: app
waf: {{ enabled: true, mode: block }}
events:
  store: {{ path: events.db, batch_interval: 50ms }}
  aggregate: {{ window: 1s, client_cap: {CLIENT_CAP}, max_keys: 1024 }}
"#
    )
}

/// Sends `paths` over `conns` keep-alive connections; returns the statuses seen.
async fn flood(addr: SocketAddr, paths: Vec<String>, conns: usize) -> Vec<u16> {
    let paths = Arc::new(paths);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let (paths, next) = (paths.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let c = client();
            let mut statuses = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(p) = paths.get(i) else { break };
                let (s, _, _) = get(&c, &format!("http://{addr}{p}")).await;
                statuses.push(s.as_u16());
            }
            statuses
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all
}

fn count(v: &Value) -> u64 {
    v["count"].as_u64().unwrap_or(1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_attack_flood_is_stored_aggregated_with_exact_counts() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("moat.yaml");
    std::fs::write(&file, yaml(up.addr)).unwrap();
    let (cfg, src) = config::load_file(&file).unwrap();
    let (sink, writer) = QueueSink::start(&cfg.events, &src.base_dir).unwrap();
    let db = writer.store_path().unwrap().to_path_buf();
    let opts = GatewayOptions {
        events: Some(sink as Arc<dyn moat_proxy::EventSink>),
        admin: moat_proxy::engine_api::engine_routes(AdminRouter::new(), Some(db.clone())),
        ..GatewayOptions::default()
    };
    let gw = gateway_from(cfg, src, opts).await;
    let addr = gw.listener_addr("main").unwrap();
    let attack = "q=1%27%20OR%201%3D1--";

    // One attack first: how many security records one request raises.
    let statuses = flood(addr, vec![format!("/search?{attack}")], 1).await;
    assert_eq!(statuses, [403]);
    let store = EventStore::open_read_only(&db).unwrap();
    let security = |store: &EventStore| {
        let q = EventQuery {
            kind: Some("security".into()),
            limit: 10_000,
            ..EventQuery::default()
        };
        store.query(&q).unwrap()
    };
    let mut per_request = 0;
    for _ in 0..200 {
        per_request = security(&store).len() as u64;
        if per_request > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(per_request >= 1, "the attack raised no security event");

    // The flood: identical attacks, then attacks on distinct paths.
    let mut paths = vec![format!("/search?{attack}"); REPEATS];
    paths.extend((0..DISTINCT).map(|i| format!("/p{i}?{attack}")));
    let statuses = flood(addr, paths, 32).await;
    assert_eq!(statuses.len(), REPEATS + DISTINCT);
    assert!(
        statuses.iter().all(|&s| s == 403),
        "every attack is blocked"
    );
    let requests = (1 + REPEATS + DISTINCT) as u64;

    let metrics = get(&client(), &format!("http://{}/metrics", gw.admin_addr())).await;
    let text = String::from_utf8_lossy(&metrics.2).into_owned();
    let metric = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics"))
    };
    assert!(metric("moat_events_aggregated_total ") > 0, "{text}");
    assert!(metric("moat_events_client_capped_total ") > 0, "{text}");
    assert_eq!(metric("moat_event_queue_dropped_total "), 0);

    // The admin API shows the counts: the flood's aggregate arrives once its
    // window (1 s) has closed.
    let url = format!("http://{}/v1/events?type=waf&limit=50", gw.admin_addr());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, body) = get(&client(), &url).await;
        assert_eq!(status, 200);
        let v = json(&body);
        let events = v["events"].as_array().unwrap();
        if events
            .iter()
            .any(|e| count(e) > 1 && e["last_ts"].as_u64().is_some())
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no aggregate in /v1/events: {v}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Shutting the writer down writes the aggregates still open.
    gw.shutdown(Duration::from_secs(5)).await;
    writer.shutdown();

    let all = store
        .query(&EventQuery {
            limit: 10_000,
            ..EventQuery::default()
        })
        .unwrap();
    let access: u64 = all
        .iter()
        .filter(|v| v["type"] == "access")
        .map(count)
        .sum();
    let security_records = security(&store);
    let sec: u64 = security_records.iter().map(count).sum();
    // Records over the client cap are counted in `events/client_cap` records,
    // whatever their type: the grand total is what must add up.
    assert_eq!(
        access + sec,
        requests * (1 + per_request),
        "access {access} + security {sec} for {requests} requests"
    );
    let capped: u64 = security_records
        .iter()
        .filter(|v| v["event"]["rule"] == "client_cap")
        .map(count)
        .sum();
    assert!(capped > 0);
    // Every identical attack is in one record with its count, the first
    // occurrence stored at once on its own.
    let sqli_search: Vec<&Value> = all
        .iter()
        .filter(|v| v["type"] == "access" && v["path"] == "/search")
        .collect();
    assert_eq!(
        sqli_search.iter().map(|v| count(v)).sum::<u64>(),
        (1 + REPEATS) as u64
    );
    assert!(
        sqli_search.len() <= 1 + 10,
        "one record per 1 s window: {}",
        sqli_search.len()
    );
    // The store holds a few hundred records, not thousands: at most the client cap
    // of new records per window, plus one record per key and window.
    assert!(
        (all.len() as u64) < 2 * (REPEATS + DISTINCT) as u64 / 10,
        "{} records stored for {requests} requests",
        all.len()
    );
    let store = EventStore::open(&db).unwrap();
    assert!(
        store.used_bytes().unwrap() < 1 << 20,
        "{}",
        store.used_bytes().unwrap()
    );
}

/// The sum of the counts in one sink's output per (rule, location) of the WAF's
/// findings, and whether one record stood for more than one occurrence with its
/// first and last times. `count`, `first` and `last` read a record of the sink's format.
fn tally(
    records: &[Value],
    key: impl Fn(&Value) -> String,
    count: impl Fn(&Value) -> u64,
    span: impl Fn(&Value) -> Option<(String, String)>,
) -> (std::collections::BTreeMap<String, u64>, bool) {
    let mut sums = std::collections::BTreeMap::new();
    let mut spanned = false;
    for r in records {
        let n = count(r);
        *sums.entry(key(r)).or_insert(0) += n;
        if n > 1 {
            let (first, last) = span(r).unwrap_or_else(|| panic!("a count without times: {r}"));
            assert!(first <= last, "{r}");
            spanned = true;
        }
    }
    (sums, spanned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregated_counts_reach_a_real_syslog_receiver_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let Some(rs) = moat_testkit::rsyslog::Rsyslog::start(dir.path(), None) else {
        return;
    };
    let up = upstream("a").await;
    let file = dir.path().join("moat.yaml");
    let tcp = rs.ports.tcp;
    let sink = |name: &str, format: &str| {
        format!(
            "    - {{ name: {name}, format: {format}, records: [security], syslog: {{ address: \"127.0.0.1:{tcp}\", app_name: {name} }} }}\n"
        )
    };
    let yaml = format!(
        "{}telemetry:\n  sinks:\n{}{}{}",
        yaml(up.addr),
        sink("moat", "moat"),
        sink("ecs", "ecs"),
        sink("ocsf", "ocsf")
    );
    std::fs::write(&file, yaml).unwrap();
    let (cfg, src) = config::load_file(&file).unwrap();
    let telemetry = moat_sinks::Telemetry::start(&cfg.telemetry, &src.base_dir).unwrap();
    let (events, writer) =
        QueueSink::start_with_telemetry(&cfg.events, &src.base_dir, Some(&telemetry))
            .unwrap()
            .unwrap();
    let opts = GatewayOptions {
        events: Some(events as Arc<dyn moat_proxy::EventSink>),
        ..GatewayOptions::default()
    };
    let gw = gateway_from(cfg, src, opts).await;
    let addr = gw.listener_addr("main").unwrap();
    let statuses = flood(
        addr,
        vec!["/search?q=1%27%20OR%201%3D1--".to_string(); REPEATS],
        16,
    )
    .await;
    assert!(
        statuses.iter().all(|&s| s == 403),
        "every attack is blocked"
    );
    // The writer's shutdown closes the open windows and gives each sink its
    // shutdown time to deliver them.
    gw.shutdown(Duration::from_secs(5)).await;
    writer.shutdown();

    let parse = |app: &str, lines: &[String]| -> Vec<Value> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(&format!("{app}|security|")))
            .map(|l| serde_json::from_str(l.split_once('|').unwrap().1).unwrap())
            .collect()
    };
    // Every identical attack raises the same findings: each (rule, location)
    // must add up to the requests sent, in every format.
    let complete = |sums: &std::collections::BTreeMap<String, u64>| {
        !sums.is_empty() && sums.values().all(|&n| n == REPEATS as u64)
    };
    let str_of = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .or(v.as_u64().map(|n| format!("{n:020}")))
    };
    let moat_key = |r: &Value| format!("{}@{}", r["event"]["rule"], r["event"]["location"]);
    let moat_span = |r: &Value| Some((str_of(&r["ts"])?, str_of(&r["last_ts"])?));
    let tally_moat = |lines: &[String]| tally(&parse("moat", lines), moat_key, count, moat_span);
    let tally_ecs = |lines: &[String]| {
        tally(
            &parse("ecs", lines),
            |r| format!("{}@{}", r["rule"]["id"], r["moat"]["location"]),
            |r| r["moat"]["count"].as_u64().unwrap_or(1),
            |r| Some((str_of(&r["event"]["start"])?, str_of(&r["event"]["end"])?)),
        )
    };
    let tally_ocsf = |lines: &[String]| {
        tally(
            &parse("ocsf", lines),
            |r| {
                format!(
                    "{}@{}",
                    r["finding_info"]["analytic"]["uid"], r["evidences"][0]["data"]["location"]
                )
            },
            |r| r["count"].as_u64().unwrap_or(1),
            |r| Some((str_of(&r["start_time"])?, str_of(&r["end_time"])?)),
        )
    };
    // The three sinks deliver independently: wait for every format, not the first.
    let lines = rs.wait_until(Duration::from_secs(15), |lines| {
        complete(&tally_moat(lines).0)
            && complete(&tally_ecs(lines).0)
            && complete(&tally_ocsf(lines).0)
    });
    let (moat, ecs, ocsf) = (tally_moat(&lines), tally_ecs(&lines), tally_ocsf(&lines));
    for (name, (sums, spanned)) in [("moat", &moat), ("ecs", &ecs), ("ocsf", &ocsf)] {
        assert!(complete(sums), "{name}: {sums:?}");
        assert!(*spanned, "{name}: no record carried a count");
        assert_eq!(sums, &moat.0, "{name} counts differ from moat's own format");
    }
    // Aggregated: far fewer messages than findings.
    let messages = parse("moat", &lines).len();
    assert!(
        messages < REPEATS / 10,
        "{messages} messages for {REPEATS} attacks"
    );
}
