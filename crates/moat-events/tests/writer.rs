//! The queue and writer with real files, pipes, child processes and SQLite.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]
// mkfifo(3) and kill(2) through libc.
#![allow(unsafe_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moat_core::{EventAction, HandshakeRecord, SecurityEvent};
use moat_events::{
    now_ms, AccessRecord, EventQuery, EventStore, EventWriter, EventsConfig, Record,
    SecurityRecord, SinkConfig, SinkKind, StoreConfig, TlsRecord,
};

fn access(i: u64) -> Record {
    Record::Access(AccessRecord {
        ts: now_ms(),
        request_id: format!("req-{i}"),
        route: "api".into(),
        method: "GET".into(),
        path: format!("/items/{i}"),
        status: 200,
        decision: "allow".into(),
        client_ip: "127.0.0.1".into(),
        duration_us: 120,
        bytes_in: 0,
        bytes_out: 42,
        upstream: Some("127.0.0.1:9000".into()),
    })
}

fn security(i: u64, ts: u64, engine: &'static str, route: &str) -> Record {
    Record::Security(SecurityRecord {
        ts,
        request_id: format!("req-{i}"),
        route: route.into(),
        // One client per record: these tests are about the writer, not about
        // flood control (which would count repeats of one client's event).
        client_ip: format!("10.1.{}.{}", (i >> 8) & 255, i & 255),
        method: "POST".into(),
        path: "/login".into(),
        event: SecurityEvent::new(engine, "sqli", EventAction::Block, "SQL injection in query")
            .at("query:id"),
    })
}

fn file_cfg(path: &Path, max_bytes: u64, max_files: u32) -> EventsConfig {
    EventsConfig {
        queue_capacity: 1024,
        sink: SinkConfig {
            kind: SinkKind::File,
            path: path.to_path_buf(),
            max_bytes,
            max_files,
        },
        store: None,
        ..EventsConfig::default()
    }
}

fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is JSON"))
        .collect()
}

fn request_no(v: &serde_json::Value) -> u64 {
    v["request_id"].as_str().unwrap()[4..].parse().unwrap()
}

#[test]
fn shutdown_flushes_sink_and_store() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EventsConfig {
        queue_capacity: 10_000,
        sink: SinkConfig {
            kind: SinkKind::File,
            path: "logs/events.jsonl".into(),
            ..SinkConfig::default()
        },
        store: Some(StoreConfig {
            path: "events.db".into(),
            // Long enough that only shutdown can have written the batch.
            batch_interval: Duration::from_secs(10),
            ..StoreConfig::default()
        }),
        ..EventsConfig::default()
    };
    let (queue, writer) = EventWriter::start(&cfg, dir.path()).unwrap();
    for i in 0..5000 {
        assert!(queue.push(access(i)));
    }
    assert_eq!(
        writer.store_path(),
        Some(dir.path().join("events.db").as_path())
    );
    writer.shutdown();
    assert_eq!(queue.written(), 5000);
    assert_eq!(queue.dropped(), 0);
    let lines = read_lines(&dir.path().join("logs/events.jsonl"));
    assert_eq!(lines.len(), 5000);
    let ids: Vec<u64> = lines.iter().map(request_no).collect();
    assert_eq!(ids, (0..5000).collect::<Vec<_>>(), "order is kept");
    assert_eq!(lines[7]["type"], "access");
    assert_eq!(lines[7]["path"], "/items/7");
    let store = EventStore::open_read_only(&dir.path().join("events.db")).unwrap();
    assert_eq!(store.count().unwrap(), 5000);
    // After shutdown the queue refuses and counts.
    assert!(!queue.push(access(9)));
    assert_eq!(queue.dropped(), 1);
}

#[test]
fn file_sink_rotates_and_keeps_max_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moat-events.jsonl");
    let (queue, writer) = EventWriter::start(&file_cfg(&path, 4096, 2), dir.path()).unwrap();
    for i in 0..200 {
        assert!(queue.push(access(i)));
    }
    writer.shutdown();
    let rotated = |n: u32| PathBuf::from(format!("{}.{n}", path.display()));
    assert!(path.exists() && rotated(1).exists() && rotated(2).exists());
    assert!(
        !rotated(3).exists(),
        "only max_files rotated files are kept"
    );
    for p in [path.clone(), rotated(1), rotated(2)] {
        let len = std::fs::metadata(&p).unwrap().len();
        assert!(len <= 4096, "{} is {len} bytes", p.display());
    }
    // Oldest to newest: .2, .1, active; contiguous and ending with the last record.
    let mut all = read_lines(&rotated(2));
    all.extend(read_lines(&rotated(1)));
    all.extend(read_lines(&path));
    let ids: Vec<u64> = all.iter().map(request_no).collect();
    assert_eq!(*ids.last().unwrap(), 199);
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    assert!(ids.len() < 200, "the oldest records were rotated away");

    // Restarting appends to the active file and rotates on from there.
    let before = read_lines(&path).len();
    let (queue, writer) = EventWriter::start(&file_cfg(&path, 4096, 2), dir.path()).unwrap();
    assert!(queue.push(access(200)));
    writer.shutdown();
    let after = read_lines(&path);
    assert!(after.len() == before + 1 || after.len() == 1);
    assert_eq!(request_no(after.last().unwrap()), 200);
}

/// The queue refuses, counts and never blocks while the writer is stuck on a
/// full pipe; everything accepted is written once the pipe is read.
#[test]
fn full_queue_drops_and_counts_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("events.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // Opening a FIFO for writing waits for a reader: open the read end first, in a thread.
    let fifo_r = fifo.clone();
    let reader = std::thread::spawn(move || std::fs::File::open(fifo_r).unwrap());
    let capacity = 1000;
    let mut cfg = file_cfg(&fifo, u64::MAX, 0);
    cfg.queue_capacity = capacity;
    let (queue, writer) = EventWriter::start(&cfg, dir.path()).unwrap();
    let mut read_end = reader.join().unwrap();

    // Stall the writer: ~4 MiB of lines it cannot get rid of while nobody reads the pipe.
    let big = "x".repeat(64 << 10);
    for i in 0..64 {
        let mut r = access(i);
        if let Record::Access(a) = &mut r {
            a.path = big.clone();
        }
        assert!(queue.push(r));
    }
    while queue.depth() > 0 {
        std::thread::sleep(Duration::from_millis(5));
    }

    // 10x capacity from 4 threads.
    let accepted = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let q = queue.clone();
            let (acc, refd) = (accepted.clone(), refused.clone());
            std::thread::spawn(move || {
                for i in 0..(capacity as u64 * 10 / 4) {
                    if q.push(access(1000 + t * 100_000 + i)) {
                        acc.fetch_add(1, Ordering::Relaxed);
                    } else {
                        refd.fetch_add(1, Ordering::Relaxed);
                    }
                    assert!(q.depth() <= q.capacity());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (accepted, refused) = (
        accepted.load(Ordering::Relaxed),
        refused.load(Ordering::Relaxed),
    );
    assert_eq!(accepted + refused, capacity as u64 * 10);
    assert_eq!(queue.dropped(), refused);
    // The writer holds at most one batch besides the queue.
    assert!(refused > 0);
    assert!(
        accepted <= (capacity + moat_events::DEFAULT_BATCH_MAX) as u64,
        "accepted {accepted}"
    );

    // Unblock the writer and check every accepted record arrives.
    let drain = std::thread::spawn(move || {
        let mut s = String::new();
        read_end.read_to_string(&mut s).unwrap();
        s
    });
    writer.shutdown();
    let out = drain.join().unwrap();
    assert_eq!(out.lines().count() as u64, 64 + accepted);
    assert_eq!(queue.written(), 64 + accepted);
}

/// Child side of the stdout and kill -9 tests (re-exec of this test binary).
#[test]
fn child_helper() {
    let Ok(mode) = std::env::var("MOAT_EVENTS_CHILD") else {
        return;
    };
    let dir = PathBuf::from(std::env::var("MOAT_EVENTS_DIR").unwrap());
    match mode.as_str() {
        "stdout" => {
            let cfg = EventsConfig {
                sink: SinkConfig {
                    kind: SinkKind::Stdout,
                    ..SinkConfig::default()
                },
                ..EventsConfig::default()
            };
            let (queue, writer) = EventWriter::start(&cfg, &dir).unwrap();
            for i in 0..300 {
                assert!(queue.push(access(i)));
            }
            writer.shutdown();
        }
        "kill" => {
            let cfg = EventsConfig {
                sink: SinkConfig {
                    kind: SinkKind::File,
                    path: "events.jsonl".into(),
                    ..SinkConfig::default()
                },
                store: Some(StoreConfig {
                    path: "events.db".into(),
                    batch_interval: Duration::from_millis(100),
                    ..StoreConfig::default()
                }),
                ..EventsConfig::default()
            };
            let (queue, _writer) = EventWriter::start(&cfg, &dir).unwrap();
            for i in 0..2000 {
                assert!(queue.push(security(i, now_ms(), "waf", "api")));
            }
            eprintln!("PHASE1 2000");
            // Keep pushing until killed.
            let mut i = 2000;
            loop {
                queue.push(security(i, now_ms(), "waf", "api"));
                i += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn child(mode: &str, dir: &Path) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["child_helper", "--exact", "--nocapture", "--test-threads=1"])
        .env("MOAT_EVENTS_CHILD", mode)
        .env("MOAT_EVENTS_DIR", dir);
    c
}

#[test]
fn stdout_sink_writes_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = child("stdout", dir.path()).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // The test harness prints its own text (`test child_helper ... ` precedes
    // the first line); ours are the JSON objects.
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.find('{').map(|i| &l[i..]))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 300);
    assert!(events.iter().all(|e| e["type"] == "access"));
    assert_eq!(request_no(&events[299]), 299);
}

#[test]
fn store_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut proc = child("kill", dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(proc.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "child exited early"
        );
        if line.starts_with("PHASE1") {
            break;
        }
    }
    // Everything pushed in phase 1 is older than one batch interval (100ms) after
    // this; the margin covers a machine so loaded that the writer thread waits
    // for a CPU. The writer naps between batches (pushes do not wake it), so this
    // also checks that it writes on its interval without being asked.
    std::thread::sleep(Duration::from_millis(2000));
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(
        unsafe { libc::kill(proc.id() as libc::pid_t, libc::SIGKILL) },
        0
    );
    let status = proc.wait().unwrap();
    assert!(!status.success());

    let store = EventStore::open(&dir.path().join("events.db")).unwrap();
    let rows = store
        .query(&EventQuery {
            limit: 10_000,
            ..EventQuery::default()
        })
        .unwrap();
    let mut seen: Vec<u64> = rows.iter().map(request_no).collect();
    seen.sort_unstable();
    for i in 0..2000 {
        assert!(seen.binary_search(&i).is_ok(), "event {i} lost");
    }
    assert!(rows.iter().all(|r| r["event"]["engine"] == "waf"));

    // The JSONL sink gets the same batches, one write each, no flush per record.
    // The process may have died in the middle of a write: only the last line
    // can be cut short.
    let text = std::fs::read_to_string(dir.path().join("events.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut seen: Vec<u64> = Vec::new();
    for (n, l) in lines.iter().enumerate() {
        match serde_json::from_str::<serde_json::Value>(l) {
            Ok(v) => seen.push(request_no(&v)),
            Err(e) => assert_eq!(n + 1, lines.len(), "line {n} is not JSON: {e}"),
        }
    }
    assert_eq!(
        seen[..2000],
        (0..2000).collect::<Vec<_>>()[..],
        "order is kept"
    );
}

#[test]
fn store_queries_filters_and_tls() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EventsConfig {
        store: Some(StoreConfig {
            path: "ev.db".into(),
            ..StoreConfig::default()
        }),
        ..EventsConfig::default()
    };
    let (queue, writer) = EventWriter::start(&cfg, dir.path()).unwrap();
    let now = now_ms();
    assert!(queue.push(security(1, now - 7_200_000, "waf", "api")));
    assert!(queue.push(security(2, now - 60_000, "waf", "api")));
    assert!(queue.push(security(3, now - 30_000, "authz", "api")));
    assert!(queue.push(security(4, now - 10_000, "waf", "web")));
    assert!(queue.push(access(5)));
    assert!(queue.push(Record::Tls(TlsRecord {
        ts: now,
        handshake: HandshakeRecord {
            role: "client",
            protocol_version: 0x0304,
            ciphersuite: 0x1301,
            ciphersuite_name: "TLS13_AES_128_GCM_SHA256".into(),
            key_exchange_group: Some("X25519".into()),
            sni: Some("api.example".into()),
            handshake_us: 900,
            ..HandshakeRecord::default()
        },
    })));
    writer.shutdown();

    let store = EventStore::open_read_only(&dir.path().join("ev.db")).unwrap();
    let q = |qs: &str| {
        let (status, body) = moat_events::http_api::events_endpoint(&store, qs);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        (status, v)
    };
    let (s, v) = q("since=1h&type=waf&route=api");
    assert_eq!(s, 200);
    assert_eq!(v["count"], 1);
    assert_eq!(v["events"][0]["request_id"], "req-2");
    let (_, v) = q("type=waf");
    assert_eq!(v["count"], 3);
    assert_eq!(v["events"][0]["request_id"], "req-4", "newest first");
    let (_, v) = q("type=security&limit=2");
    assert_eq!(v["count"], 2);
    let (_, v) = q("type=tls");
    assert_eq!(v["count"], 1);
    assert_eq!(v["events"][0]["handshake"]["key_exchange_group"], "X25519");
    assert_eq!(v["events"][0]["handshake"]["ciphersuite"], 0x1301);
    let (_, v) = q("action=allow");
    assert_eq!(v["events"][0]["type"], "access");
    let (_, v) = q("");
    assert_eq!(v["count"], 6);
    let (s, v) = q("limit=abc");
    assert_eq!(s, 400);
    assert!(v["error"].as_str().unwrap().contains("limit"));
}

#[test]
fn retention_removes_old_and_excess_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = EventStore::open(&dir.path().join("r.db")).unwrap();
    let now = now_ms();
    let day = 86_400_000;
    let old: Vec<Record> = (0..100)
        .map(|i| security(i, now - 9 * day, "waf", "api"))
        .collect();
    let fresh: Vec<Record> = (100..200)
        .map(|i| security(i, now - day, "waf", "api"))
        .collect();
    store.insert(&old).unwrap();
    store.insert(&fresh).unwrap();
    let deleted = store
        .apply_retention(now, Duration::from_secs(7 * 86_400), 1 << 30)
        .unwrap();
    assert_eq!(deleted, 100);
    assert_eq!(store.count().unwrap(), 100);
    let rows = store
        .query(&EventQuery {
            limit: 1000,
            ..EventQuery::default()
        })
        .unwrap();
    assert!(rows.iter().all(|r| request_no(r) >= 100));

    // Size: ~6 MiB of events against a 2 MiB limit keeps the newest ones.
    let pad = "p".repeat(2000);
    let big: Vec<Record> = (200..3200)
        .map(|i| {
            let mut r = security(i, now, "waf", "api");
            if let Record::Security(s) = &mut r {
                s.path = pad.clone();
            }
            r
        })
        .collect();
    store.insert(&big).unwrap();
    assert!(store.used_bytes().unwrap() > 4 << 20);
    store.checkpoint().unwrap();
    let file_before = std::fs::metadata(dir.path().join("r.db")).unwrap().len();
    store
        .apply_retention(now, Duration::from_secs(7 * 86_400), 2 << 20)
        .unwrap();
    assert!(store.used_bytes().unwrap() <= 2 << 20);
    let rows = store
        .query(&EventQuery {
            limit: 10_000,
            ..EventQuery::default()
        })
        .unwrap();
    assert!(!rows.is_empty());
    let ids: Vec<u64> = rows.iter().map(request_no).collect();
    assert!(ids.contains(&3199), "the newest record is kept");
    assert!(!ids.contains(&150), "the oldest records go first");
    // Checkpoint the WAL so the file size reflects the vacuum.
    drop(store);
    let file_after = std::fs::metadata(dir.path().join("r.db")).unwrap().len();
    assert!(file_after < file_before, "{file_after} >= {file_before}");
}
