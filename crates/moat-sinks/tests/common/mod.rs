//! Records and helpers shared by the sink tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use moat_core::{EventAction, HandshakeRecord, SecurityEvent};
use moat_events::{
    AccessRecord, EventQueue, EventWriter, EventsConfig, Record, SecurityRecord, TlsRecord,
};

/// An access record of request `id` from `ip`.
pub fn access(id: &str, ip: &str) -> Record {
    Record::Access(AccessRecord {
        ts: moat_events::now_ms(),
        request_id: id.into(),
        route: "api".into(),
        method: "GET".into(),
        path: "/x".into(),
        status: 200,
        decision: "allow".into(),
        client_ip: ip.into(),
        duration_us: 120,
        ..AccessRecord::default()
    })
}

/// A blocking WAF event of request `id`.
pub fn security(id: &str, ip: &str) -> Record {
    Record::Security(SecurityRecord {
        ts: moat_events::now_ms(),
        request_id: id.into(),
        route: "api".into(),
        client_ip: ip.into(),
        method: "POST".into(),
        path: "/login".into(),
        event: SecurityEvent::new("waf", "sqli", EventAction::Block, "SQL injection")
            .at("query:id"),
        request: None,
    })
}

/// A TLS 1.3 handshake record.
pub fn tls() -> Record {
    Record::Tls(TlsRecord {
        ts: moat_events::now_ms(),
        handshake: HandshakeRecord {
            role: "server",
            protocol_version: 0x0304,
            ciphersuite: 0x1301,
            ciphersuite_name: "TLS13_AES_128_GCM_SHA256".into(),
            key_exchange_group: Some("X25519".into()),
            sni: Some("api.example".into()),
            ..HandshakeRecord::default()
        },
    })
}

/// Parses and validates a `telemetry:` section.
pub fn parse(yaml: &str, dir: &Path) -> moat_sinks::TelemetryConfig {
    let file = dir.join("moat.yaml");
    let cfg: moat_sinks::TelemetryConfig = moat_config::from_str(&file, yaml).unwrap();
    cfg.validate(&file).unwrap();
    cfg
}

/// Parses a `telemetry:` section and starts the event writer with its sinks
/// (no JSON-lines sink, no store).
pub fn start(yaml: &str, dir: &Path) -> (EventQueue, EventWriter, moat_sinks::SinkMetrics) {
    let (queue, writer, telemetry) = start_telemetry(yaml, dir);
    (queue, writer, telemetry.metrics().clone())
}

/// [`start`], keeping the [`moat_sinks::Telemetry`] for reloads.
pub fn start_telemetry(yaml: &str, dir: &Path) -> (EventQueue, EventWriter, moat_sinks::Telemetry) {
    let telemetry = moat_sinks::Telemetry::start(&parse(yaml, dir), dir).unwrap();
    // A store is what sets the writer's batch interval (20 ms keeps the tests quick).
    let events = EventsConfig {
        store: Some(moat_events::StoreConfig {
            path: dir.join("events.db"),
            batch_interval: Duration::from_millis(20),
            ..moat_events::StoreConfig::default()
        }),
        ..EventsConfig::default()
    };
    let (queue, writer) =
        EventWriter::start_with(&events, dir, vec![Box::new(telemetry.record_sink())]).unwrap();
    (queue, writer, telemetry)
}

/// Whether a thread of this process is named `name` (Linux truncates names to 15 bytes).
pub fn thread_named(name: &str) -> bool {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .any(|comm| comm.trim_end() == name)
}

/// Polls `f` every 50 ms until it returns `Some`, up to `timeout`.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
