//! Event writer throughput into SQLite, and behaviour at 10x offered load.
//!
//! `cargo bench -p moat-events --bench writer`
//!
//! - `store/insert_direct`: serialize + insert on the bench thread (one core), one transaction per 10k.
//! - `writer/pipeline_sqlite`: push into the queue, background writer thread commits to SQLite.
//! - `store/insert_direct_cpu_time`: the same timed by thread CPU time (immune to other load).
//! - before the criterion groups, an overload run pushes as fast as one thread can
//!   for 3 s (far more than 10x what the writer drains) and prints offered,
//!   accepted, dropped, the queue's peak depth and the process's peak RSS.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use moat_core::{EventAction, SecurityEvent};
use moat_events::{
    now_ms, AccessRecord, AggregateConfig, EventStore, EventWriter, EventsConfig, Record,
    SecurityRecord, StoreConfig,
};

fn record(i: u64) -> Record {
    if i & 3 == 0 {
        Record::Security(SecurityRecord {
            ts: now_ms(),
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
        })
    } else {
        Record::Access(AccessRecord {
            ts: now_ms(),
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

fn bench_store(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut g = c.benchmark_group("store");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    let n = 10_000u64;
    g.throughput(Throughput::Elements(n));
    let store = EventStore::open(&dir.path().join("direct.db")).expect("store");
    let records: Vec<Record> = (0..n).map(record).collect();
    g.bench_function(BenchmarkId::new("insert_direct", n), |b| {
        b.iter(|| store.insert(&records).expect("insert"))
    });
    // The same, timed by this thread's CPU time: what one core can do, without
    // the time other processes on the machine take from it.
    g.bench_function(BenchmarkId::new("insert_direct_cpu_time", n), |b| {
        b.iter_custom(|iters| {
            let start = thread_cpu();
            for _ in 0..iters {
                store.insert(&records).expect("insert");
            }
            thread_cpu().saturating_sub(start)
        })
    });
    g.finish();

    let mut g = c.benchmark_group("writer");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    let n = 50_000u64;
    g.throughput(Throughput::Elements(n));
    let cfg = EventsConfig {
        queue_capacity: 1 << 20,
        store: Some(StoreConfig {
            path: "pipeline.db".into(),
            ..StoreConfig::default()
        }),
        // The writer's own cost: flood control would keep the repeated security
        // records of `record` out of the queue.
        aggregate: AggregateConfig {
            window: Duration::ZERO,
            ..AggregateConfig::default()
        },
        ..EventsConfig::default()
    };
    let (queue, writer) = EventWriter::start(&cfg, dir.path()).expect("writer");
    g.bench_function(BenchmarkId::new("pipeline_sqlite", n), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batch: Vec<Record> = (0..n).map(record).collect();
                let target = queue.written() + n;
                let start = Instant::now();
                for r in batch {
                    assert!(queue.push(r));
                }
                while queue.written() < target {
                    std::thread::sleep(Duration::from_micros(200));
                }
                total += start.elapsed();
            }
            total
        })
    });
    g.finish();
    writer.shutdown();
}

#[allow(unsafe_code)]
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(
        ts.tv_sec.max(0) as u64,
        ts.tv_nsec.clamp(0, 999_999_999) as u32,
    )
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn overload() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = EventsConfig {
        store: Some(StoreConfig {
            path: "overload.db".into(),
            ..StoreConfig::default()
        }),
        // The writer's own cost: flood control would keep the repeated security
        // records of `record` out of the queue.
        aggregate: AggregateConfig {
            window: Duration::ZERO,
            ..AggregateConfig::default()
        },
        ..EventsConfig::default()
    };
    let rss_before = peak_rss_kib();
    let (queue, writer) = EventWriter::start(&cfg, dir.path()).expect("writer");
    let start = Instant::now();
    let (mut offered, mut accepted, mut max_depth) = (0u64, 0u64, 0usize);
    while start.elapsed() < Duration::from_secs(3) {
        for _ in 0..1000 {
            if queue.push(record(offered)) {
                accepted += 1;
            }
            offered += 1;
        }
        max_depth = max_depth.max(queue.depth());
    }
    let secs = start.elapsed().as_secs_f64();
    let written_during = queue.written();
    writer.shutdown();
    println!(
        "overload: {secs:.1}s offered {offered} ({:.0}/s), accepted {accepted}, dropped {} (counted {}), \
         written during run {written_during} ({:.0}/s), queue capacity {} peak depth {max_depth}, \
         peak RSS {} KiB before / {} KiB after",
        offered as f64 / secs,
        offered - accepted,
        queue.dropped(),
        written_during as f64 / secs,
        queue.capacity(),
        rss_before,
        peak_rss_kib()
    );
}

fn main() {
    // First, so the peak RSS reflects the overload run only.
    overload();
    let mut c = Criterion::default().configure_from_args();
    bench_store(&mut c);
    c.final_summary();
}
