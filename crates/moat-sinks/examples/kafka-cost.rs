//! What the Kafka sink costs per record next to the SQLite store, in instructions
//! (callgrind counts them repeatably on a busy machine, where wall clock cannot):
//!
//! ```sh
//! for mode in build store kafka; do
//!   valgrind --tool=callgrind target/release/examples/kafka-cost BROKER 20000 $mode
//! done
//! ```
//!
//! Every mode builds the same N access records. `store` pushes them through the event
//! writer into a SQLite store (in a temp dir); `kafka` pushes them through the event
//! writer into a Kafka sink (no store) and waits until the broker has acknowledged all
//! of them. (mode − build) / N is what one record costs in moat's process: for Kafka,
//! encoding, buffering, partitioning, rskafka's batch encoding and compression, the
//! produce requests. The topics must exist (`kafka-topics` example). `COMPRESSION`
//! (snappy by default) picks the sink's compression.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use moat_events::{AccessRecord, EventWriter, Record};

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: kafka-cost BROKER N build|store|kafka";
    let broker = args.next().expect(usage);
    let n: usize = args.next().expect(usage).parse().expect("N");
    let mode = args.next().expect(usage);
    let compression = std::env::var("COMPRESSION").unwrap_or_else(|_| "snappy".into());
    let records: Vec<Record> = (0..n)
        .map(|i| {
            Record::Access(AccessRecord {
                ts: moat_events::now_ms(),
                request_id: format!("{i:016x}{:016x}", i * 7919),
                route: "api".into(),
                method: "GET".into(),
                path: "/api/users/1".into(),
                status: 200,
                decision: "allow".into(),
                client_ip: format!("10.0.{}.{}", i % 200, i % 250),
                duration_us: 180 + (i % 50) as u64,
                bytes_in: 0,
                bytes_out: 172,
                upstream: Some("10.0.0.5:8080".into()),
            })
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let mut events = moat_events::EventsConfig {
        queue_capacity: n + 1,
        ..moat_events::EventsConfig::default()
    };
    match mode.as_str() {
        "build" => {
            std::hint::black_box(&records);
            return;
        }
        "store" => {
            events.store = Some(moat_events::StoreConfig {
                path: dir.path().join("events.db"),
                ..moat_events::StoreConfig::default()
            });
            let (queue, writer) = EventWriter::start_with(&events, dir.path(), Vec::new()).unwrap();
            for r in records {
                assert!(queue.push(r));
            }
            writer.shutdown();
            return;
        }
        "kafka" => {}
        _ => panic!("{usage}"),
    }
    let yaml = format!(
        "sinks:\n  - name: kafka\n    records: [access]\n    kafka: {{ brokers: [\"{broker}\"], compression: {compression} }}\n"
    );
    let file = dir.path().join("kafka-cost.yaml");
    let cfg: moat_sinks::TelemetryConfig = moat_config::from_str(&file, &yaml).unwrap();
    cfg.validate(&file).unwrap();
    let telemetry = moat_sinks::Telemetry::start(&cfg, dir.path()).unwrap();
    let stats = telemetry.metrics().get("kafka").unwrap();
    let (queue, writer) =
        EventWriter::start_with(&events, dir.path(), vec![Box::new(telemetry.record_sink())])
            .unwrap();
    for r in records {
        assert!(queue.push(r));
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    while load(&stats.delivered) < n as u64 {
        assert!(
            Instant::now() < deadline,
            "delivered {} of {n}",
            load(&stats.delivered)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    writer.shutdown();
    eprintln!(
        "delivered {n}, dropped {}, send errors {}",
        load(&stats.dropped),
        load(&stats.send_errors)
    );
}
