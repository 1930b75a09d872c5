//! TLS audit as a connection phase: each completed downstream handshake is counted in
//! the metrics (protocol versions, cipher suites, key exchange groups) and its record
//! goes to the event sink (docs/tls.md). On when `tls_audit.enabled` (the default).

use std::sync::Arc;

use moat_core::{Connection, ConnectionPhase, HandshakeRecord};

use crate::events::EventSink;
use crate::metrics::Metrics;

/// The TLS audit phase.
pub struct TlsAudit {
    metrics: Arc<Metrics>,
    sink: Option<Arc<dyn EventSink>>,
}

impl TlsAudit {
    /// Counts handshakes into `metrics` and writes their records to `sink`.
    pub fn new(metrics: Arc<Metrics>, sink: Option<Arc<dyn EventSink>>) -> TlsAudit {
        TlsAudit { metrics, sink }
    }
}

impl ConnectionPhase for TlsAudit {
    fn name(&self) -> &'static str {
        "tls_audit"
    }

    fn on_connection(&self, conn: &Connection, handshake: &HandshakeRecord) {
        self.metrics.record_tls_handshake(handshake);
        if let Some(sink) = &self.sink {
            // The sink's queue is bounded: a full queue drops the record, counted.
            if !sink.tls(conn, handshake) {
                self.metrics.count_dropped_events(1);
            }
        }
    }
}
