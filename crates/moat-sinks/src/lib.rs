//! moat's distributed event sinks: Kafka, syslog (RFC 5424 over UDP, TCP, TLS)
//! and HTTP (batched JSON POST), each in moat's own schema, ECS or OCSF.
//!
//! The sinks hang off moat-events' writer thread through its
//! [`RecordSink`](moat_events::RecordSink) seam, so the request path is never
//! involved: the proxy pushes a record into the event queue as before, the
//! writer drains a batch, writes the JSON-lines sink and the SQLite store, and
//! offers the batch to every sink here. A sink encodes the records it takes into
//! its own bounded buffer and returns; its own thread delivers them (see
//! [`outbox`] for batching, retries and drops).
//!
//! ```text
//! proxy --push--> EventQueue --> writer thread --> JSON lines, SQLite store
//!                                     |  offer(batch)
//!                       +-------------+--------------+
//!                   Outbox(kafka)  Outbox(syslog)  Outbox(http)   bounded, drop when full
//!                       |              |              |
//!                   thread+runtime  thread+runtime  thread+runtime  batches, retries, backoff
//! ```
//!
//! A reload reconfigures the sinks and the span exporter in place
//! ([`Telemetry::prepare`], [`Change::commit`]): an unchanged sink keeps its
//! buffer and thread, a changed or removed one delivers what it holds and stops.

#![warn(missing_docs)]

pub mod config;
pub mod format;
pub mod http;
pub mod kafka;
mod net;
pub mod outbox;
mod running;
pub mod syslog;
pub mod trace;

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::RwLock;

pub use config::{Format, RecordKind, SinkConfig, TelemetryConfig, TracingConfig};
pub use outbox::SinkStats;
pub use running::{Change, SinkSet, Telemetry};
pub use trace::Tracer;

/// Why a sink could not start.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A setting that validation could not check (a header, a URL part).
    #[error("{0}")]
    Config(String),
    /// The TLS settings: CA file, server name.
    #[error("tls: {0}")]
    Tls(String),
    /// The sink's thread or runtime could not start.
    #[error("cannot start the sink thread: {0}")]
    Thread(std::io::Error),
    /// One sink of the list could not start.
    #[error("sink `{name}`: {error}")]
    Sink {
        /// The sink's name.
        name: String,
        /// Why.
        error: Box<SinkError>,
    },
}

/// The counters of every sink, by name, and the span exporter's as `tracing`;
/// cheap to clone, and follows reloads (a clone sees the sinks a reload installs).
#[derive(Clone, Default)]
pub struct SinkMetrics {
    sinks: Arc<RwLock<NamedStats>>,
}

/// Counters by sink name, in configuration order (the tracer's last).
type NamedStats = Vec<(String, Arc<SinkStats>)>;

impl std::fmt::Debug for SinkMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkMetrics")
            .field("sinks", &self.sinks.read().len())
            .finish()
    }
}

impl SinkMetrics {
    /// The counters of the sink `name` (`tracing`: the span exporter).
    pub fn get(&self, name: &str) -> Option<Arc<SinkStats>> {
        self.sinks
            .read()
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
    }

    /// Replaces the list (a reload changed the sinks).
    fn set(&self, sinks: NamedStats) {
        *self.sinks.write() = sinks;
    }

    /// Renders the sinks' series in the Prometheus text format (nothing without sinks).
    /// Label values are sink names: at most [`config::MAX_SINKS`] series per metric.
    pub fn render(&self, out: &mut String) {
        let sinks = self.sinks.read();
        if sinks.is_empty() {
            return;
        }
        type Get = fn(&SinkStats) -> u64;
        let series: [(&str, &str, &str, Get); 7] = [
            (
                "moat_sink_queue_depth",
                "gauge",
                "Records buffered in the sink, waiting for delivery.",
                |s| s.depth.load(Ordering::Relaxed) as u64,
            ),
            (
                "moat_sink_queue_bytes",
                "gauge",
                "Encoded bytes buffered in the sink.",
                |s| s.bytes.load(Ordering::Relaxed) as u64,
            ),
            (
                "moat_sink_dropped_total",
                "counter",
                "Records dropped because the sink's buffer was full (or at shutdown).",
                |s| s.dropped.load(Ordering::Relaxed),
            ),
            (
                "moat_sink_delivered_total",
                "counter",
                "Records delivered by the sink.",
                |s| s.delivered.load(Ordering::Relaxed),
            ),
            (
                "moat_sink_rejected_total",
                "counter",
                "Records the destination refused for good.",
                |s| s.rejected.load(Ordering::Relaxed) + s.encode_errors.load(Ordering::Relaxed),
            ),
            (
                "moat_sink_send_errors_total",
                "counter",
                "Failed delivery attempts (retried).",
                |s| s.send_errors.load(Ordering::Relaxed),
            ),
            (
                "moat_sink_up",
                "gauge",
                "1 unless the sink's last delivery attempt failed.",
                |s| u64::from(!s.down.load(Ordering::Relaxed)),
            ),
        ];
        for (name, kind, help, get) in series {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (sink, stats) in sinks.iter() {
                let _ = writeln!(out, "{name}{{sink=\"{sink}\"}} {}", get(stats));
            }
        }
    }
}
