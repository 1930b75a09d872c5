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

#![warn(missing_docs)]

pub mod config;
pub mod format;
pub mod http;
pub mod kafka;
mod net;
pub mod outbox;
pub mod syslog;
pub mod trace;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

pub use config::{Format, RecordKind, SinkConfig, TelemetryConfig, TracingConfig};
pub use outbox::SinkStats;
pub use trace::Tracer;

use outbox::{Encoder, Outbox, Transport, Warner};

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
}

/// The running sinks: their [`RecordSink`](moat_events::RecordSink)s for the
/// event writer, and their counters for `/metrics`.
pub struct Started {
    /// Give these to [`moat_events::EventWriter::start_with`].
    pub record_sinks: Vec<Box<dyn moat_events::RecordSink>>,
    /// The counters of each sink.
    pub metrics: SinkMetrics,
}

/// The counters of every sink, by name; cheap to clone.
#[derive(Clone, Default)]
pub struct SinkMetrics {
    sinks: Arc<Vec<(String, Arc<SinkStats>)>>,
}

impl std::fmt::Debug for SinkMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkMetrics")
            .field("sinks", &self.sinks.len())
            .finish()
    }
}

impl SinkMetrics {
    /// The counters of the sink `name`.
    pub fn get(&self, name: &str) -> Option<&SinkStats> {
        self.sinks
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| &**s)
    }

    /// These counters and `stats` under `name` (the span exporter's, as `tracing`).
    pub fn with(&self, name: &str, stats: Arc<SinkStats>) -> SinkMetrics {
        let mut v = (*self.sinks).clone();
        v.push((name.to_string(), stats));
        SinkMetrics { sinks: Arc::new(v) }
    }

    /// Renders the sinks' series in the Prometheus text format (nothing without sinks).
    /// Label values are sink names: at most [`config::MAX_SINKS`] series per metric.
    pub fn render(&self, out: &mut String) {
        if self.sinks.is_empty() {
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
            for (sink, stats) in self.sinks.iter() {
                let _ = writeln!(out, "{name}{{sink=\"{sink}\"}} {}", get(stats));
            }
        }
    }
}

/// Starts every sink of `cfg` (validated by the caller; relative CA files
/// resolve against `base_dir`). Nothing connects yet: each sink connects on its
/// first batch and reconnects as needed, so a destination that is down at start
/// does not stop moat.
pub fn start(cfg: &TelemetryConfig, base_dir: &Path) -> Result<Started, SinkError> {
    let mut record_sinks: Vec<Box<dyn moat_events::RecordSink>> = Vec::new();
    let mut stats = Vec::new();
    for s in &cfg.sinks {
        let name = s.name.value.clone();
        let outbox = Outbox::new(&s.buffer);
        stats.push((name.clone(), outbox.stats.clone()));
        let mut kinds = [false; 4];
        for k in &s.records {
            kinds[k.index()] = true;
        }
        let encoder = Encoder {
            format: s.format,
            kinds,
            key: s.kafka.as_ref().map(|k| k.key),
        };
        let thread = if let Some(k) = &s.kafka {
            let tls = k
                .tls
                .as_ref()
                .map(|t| net::client_config(t, base_dir))
                .transpose()?;
            spawn(
                &name,
                outbox.clone(),
                &s.buffer,
                kafka::KafkaSink::new(k, tls, s.buffer.timeout),
            )?
        } else if let Some(sl) = &s.syslog {
            let tls = match sl.transport {
                config::SyslogTransport::Tls => Some(net::client_config(
                    sl.tls
                        .as_ref()
                        .unwrap_or(&config::ClientTlsConfig::default()),
                    base_dir,
                )?),
                _ => None,
            };
            let server_name = sl.tls.as_ref().and_then(|t| t.server_name.as_deref());
            let endpoint = net::Endpoint::new(&sl.address, tls.map(|c| (c, server_name)))?;
            let facility = config::facility_code(&sl.facility)
                .ok_or_else(|| SinkError::Config(format!("syslog.facility `{}`", sl.facility)))?;
            spawn(
                &name,
                outbox.clone(),
                &s.buffer,
                syslog::SyslogSink::new(sl, endpoint, facility),
            )?
        } else if let Some(h) = &s.http {
            spawn(
                &name,
                outbox.clone(),
                &s.buffer,
                http::HttpSink::new(h, base_dir)?,
            )?
        } else {
            return Err(SinkError::Config(format!(
                "sink `{name}` has no destination"
            )));
        };
        record_sinks.push(Box::new(OutboxSink {
            warner: Warner::new(&name),
            encoder,
            outbox,
            thread: Some(thread),
        }));
    }
    Ok(Started {
        record_sinks,
        metrics: SinkMetrics {
            sinks: Arc::new(stats),
        },
    })
}

/// Starts the sink's thread: a current-thread tokio runtime running its delivery loop.
pub(crate) fn spawn<T: Transport>(
    name: &str,
    outbox: Arc<Outbox>,
    buffer: &config::BufferConfig,
    transport: T,
) -> Result<JoinHandle<()>, SinkError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(SinkError::Thread)?;
    let buffer = buffer.clone();
    let task_name = name.to_string();
    std::thread::Builder::new()
        .name(format!("moat-sink-{name}"))
        .spawn(move || rt.block_on(outbox::deliver(outbox, transport, buffer, task_name)))
        .map_err(SinkError::Thread)
}

/// The event writer's handle on one sink.
struct OutboxSink {
    encoder: Encoder,
    outbox: Arc<Outbox>,
    warner: Warner,
    thread: Option<JoinHandle<()>>,
}

impl moat_events::RecordSink for OutboxSink {
    fn offer(&mut self, batch: &[moat_events::Record], counted: &[moat_events::Counted]) {
        let mut encode_errors = 0u64;
        let entries = batch
            .iter()
            .map(format::Entry::One)
            .chain(counted.iter().map(format::Entry::Counted));
        let msgs = entries
            .filter_map(|e| self.encoder.encode(e))
            .filter_map(|m| m.map_err(|_| encode_errors += 1).ok())
            .collect::<Vec<_>>();
        let dropped = self.outbox.push(msgs.into_iter());
        if encode_errors > 0 {
            self.outbox
                .stats
                .encode_errors
                .fetch_add(encode_errors, Ordering::Relaxed);
        }
        if dropped > 0 {
            self.warner
                .warn(&format!("buffer full, {dropped} records dropped"));
        }
    }

    fn close(&mut self) {
        self.outbox.close();
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("an event sink thread panicked");
            }
        }
    }
}

impl Drop for OutboxSink {
    fn drop(&mut self) {
        moat_events::RecordSink::close(self);
    }
}
