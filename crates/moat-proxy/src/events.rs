//! Where the proxy sends access records, security events and TLS handshake records.
//!
//! The proxy calls an [`EventSink`] after each response; the binary plugs in the
//! moat-events queue, tests plug in a collector. Implementations must not block:
//! push to a bounded queue and drop (and count) when it is full.

use http::Method;
use moat_core::{Connection, HandshakeRecord, RequestCtx, SecurityEvent};

use crate::metrics::{Decision, QueueStats};

/// One finished request, borrowed from the request path.
#[derive(Debug)]
pub struct AccessInfo<'a> {
    /// Request context (request id, route, client ip, connection, auth).
    pub ctx: &'a RequestCtx,
    /// Method.
    pub method: &'a Method,
    /// Host the request was addressed to (no port).
    pub host: &'a str,
    /// Path and query.
    pub path: &'a str,
    /// `User-Agent`, if any.
    pub user_agent: Option<&'a str>,
    /// Final status sent to the client.
    pub status: u16,
    /// How the request ended.
    pub decision: Decision,
    /// Cluster and endpoint the request went to, when it was forwarded.
    pub upstream: Option<(&'a str, &'a str)>,
    /// Time from the request head to the end of the response body (the last
    /// byte handed to the connection, or the client going away), microseconds.
    pub duration_us: u64,
    /// Request body bytes (Content-Length, or the buffered size; 0 when unknown).
    pub bytes_in: u64,
    /// Response body bytes handed to the connection.
    pub bytes_out: u64,
}

/// One closed connection of a `protocol: tcp` listener.
#[derive(Debug)]
pub struct TcpAccessInfo<'a> {
    /// Listener name.
    pub listener: &'a str,
    /// Peer and local addresses; `tls` when moat terminated TLS (SNI, verified peer).
    pub conn: &'a Connection,
    /// `plain`, `terminate` or `passthrough`.
    pub tls: &'static str,
    /// SNI: read from the ClientHello (passthrough) or the terminated handshake.
    pub sni: Option<&'a str>,
    /// Cluster chosen for the connection.
    pub cluster: Option<&'a str>,
    /// Upstream endpoint, once connected.
    pub upstream: Option<&'a str>,
    /// `allow`, `block` or `error`.
    pub decision: &'static str,
    /// Deciding policy (`namespace/name[rule i]`), when one decided.
    pub rule: Option<&'a str>,
    /// Why the connection was refused, or how it ended.
    pub reason: &'a str,
    /// Accept time, unix milliseconds.
    pub ts_ms: u64,
    /// Accept to close, microseconds.
    pub duration_us: u64,
    /// Client-to-upstream bytes delivered.
    pub bytes_in: u64,
    /// Upstream-to-client bytes delivered.
    pub bytes_out: u64,
}

/// Receives the proxy's records. Every method must return quickly.
pub trait EventSink: Send + Sync {
    /// One record per request. Returns false when the record was dropped.
    fn access(&self, info: &AccessInfo<'_>) -> bool;
    /// One record per security event raised while handling the request.
    fn security(
        &self,
        ctx: &RequestCtx,
        event: &SecurityEvent,
        method: &Method,
        path: &str,
    ) -> bool;
    /// One record per security event, with the request head (for the target and
    /// headers a record may keep, secrets redacted). The default drops the head.
    fn security_with_head(
        &self,
        ctx: &RequestCtx,
        event: &SecurityEvent,
        head: &http::request::Parts,
    ) -> bool {
        let target = head.uri.path_and_query().map_or("/", |p| p.as_str());
        self.security(ctx, event, &head.method, target)
    }
    /// One record per downstream TLS handshake (when `tls_audit.enabled`).
    fn tls(&self, conn: &Connection, handshake: &HandshakeRecord) -> bool;
    /// One record per closed tcp-listener connection. The default ignores it.
    fn tcp(&self, _info: &TcpAccessInfo<'_>) -> bool {
        true
    }
    /// The queue's and its flood control's counters, for /metrics.
    fn gauge(&self) -> Option<QueueStats> {
        None
    }
}

/// An [`EventSink`] over the moat-events queue (bounded, never blocks).
#[derive(Debug, Clone)]
pub struct QueueSink {
    queue: moat_events::EventQueue,
}

impl QueueSink {
    /// Wraps a queue.
    pub fn new(queue: moat_events::EventQueue) -> Self {
        QueueSink { queue }
    }

    /// Starts the events writer for a config (`events:` section) and returns the sink
    /// and the writer (call [`moat_events::EventWriter::shutdown`] on exit).
    pub fn start(
        cfg: &moat_events::EventsConfig,
        base_dir: &std::path::Path,
    ) -> Result<(std::sync::Arc<QueueSink>, moat_events::EventWriter), moat_events::EventsError>
    {
        let (queue, writer) = moat_events::EventWriter::start(cfg, base_dir)?;
        Ok((std::sync::Arc::new(QueueSink { queue }), writer))
    }

    /// Like [`start`](Self::start), but returns `None` when the config writes
    /// records nowhere (no sink, no store): the request path then builds no records.
    #[allow(clippy::type_complexity)]
    pub fn start_if_enabled(
        cfg: &moat_events::EventsConfig,
        base_dir: &std::path::Path,
    ) -> Result<
        Option<(std::sync::Arc<QueueSink>, moat_events::EventWriter)>,
        moat_events::EventsError,
    > {
        Self::start_with_telemetry(cfg, base_dir, None)
    }

    /// [`start_if_enabled`](Self::start_if_enabled) with moat-sinks' Kafka, syslog
    /// and HTTP sinks fed by the same writer; any sink enables the pipeline. The
    /// writer offers its batches to the sinks `telemetry` runs at that moment, so
    /// sinks a reload adds get records too (when the pipeline runs at all).
    #[allow(clippy::type_complexity)]
    pub fn start_with_telemetry(
        cfg: &moat_events::EventsConfig,
        base_dir: &std::path::Path,
        telemetry: Option<&moat_sinks::Telemetry>,
    ) -> Result<
        Option<(std::sync::Arc<QueueSink>, moat_events::EventWriter)>,
        moat_events::EventsError,
    > {
        let sinks = telemetry.is_some_and(|t| t.has_sinks());
        if cfg.sink.kind == moat_events::SinkKind::None && cfg.store.is_none() && !sinks {
            return Ok(None);
        }
        let extra: Vec<Box<dyn moat_events::RecordSink>> = telemetry
            .map(|t| Box::new(t.record_sink()) as Box<dyn moat_events::RecordSink>)
            .into_iter()
            .collect();
        let (queue, writer) = moat_events::EventWriter::start_with(cfg, base_dir, extra)?;
        Ok(Some((std::sync::Arc::new(QueueSink { queue }), writer)))
    }
}

impl QueueSink {
    fn push_security(
        &self,
        ctx: &RequestCtx,
        event: &SecurityEvent,
        method: &Method,
        path: &str,
        request: Option<moat_events::RequestSummary>,
    ) -> bool {
        self.queue
            .push(moat_events::Record::Security(moat_events::SecurityRecord {
                ts: moat_events::now_ms(),
                request_id: ctx.request_id.clone(),
                route: ctx.route.to_string(),
                client_ip: ctx.client_ip.to_string(),
                method: method.as_str().to_string(),
                path: path.split('?').next().unwrap_or("/").to_string(),
                event: event.clone(),
                request,
            }))
    }
}

fn decision_name(info: &AccessInfo<'_>) -> &'static str {
    match info.decision {
        Decision::Allow => {
            if info
                .ctx
                .events
                .iter()
                .any(|e| e.action == moat_core::EventAction::Monitor)
            {
                "monitor"
            } else {
                "allow"
            }
        }
        Decision::Block | Decision::Limit => "block",
        Decision::Error => "error",
    }
}

impl EventSink for QueueSink {
    fn access(&self, info: &AccessInfo<'_>) -> bool {
        let path = info.path.split('?').next().unwrap_or("/");
        self.queue
            .push(moat_events::Record::Access(moat_events::AccessRecord {
                ts: moat_events::now_ms(),
                request_id: info.ctx.request_id.clone(),
                route: info.ctx.route.to_string(),
                method: info.method.as_str().to_string(),
                path: path.to_string(),
                status: info.status,
                decision: decision_name(info).to_string(),
                client_ip: info.ctx.client_ip.to_string(),
                duration_us: info.duration_us,
                bytes_in: info.bytes_in,
                bytes_out: info.bytes_out,
                upstream: info.upstream.map(|(_, e)| e.to_string()),
            }))
    }

    fn security(
        &self,
        ctx: &RequestCtx,
        event: &SecurityEvent,
        method: &Method,
        path: &str,
    ) -> bool {
        self.push_security(ctx, event, method, path, None)
    }

    fn security_with_head(
        &self,
        ctx: &RequestCtx,
        event: &SecurityEvent,
        head: &http::request::Parts,
    ) -> bool {
        let target = head.uri.path_and_query().map_or("/", |p| p.as_str());
        // A leaked secret may sit in any header or parameter: keep names only.
        let request = moat_events::RequestSummary::redacted(
            target,
            head.headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())),
            event.engine == "secrets",
        );
        self.push_security(ctx, event, &head.method, target, Some(request))
    }

    fn tls(&self, _conn: &Connection, handshake: &HandshakeRecord) -> bool {
        self.queue
            .push(moat_events::Record::Tls(moat_events::TlsRecord {
                ts: moat_events::now_ms(),
                handshake: handshake.clone(),
            }))
    }

    fn tcp(&self, info: &TcpAccessInfo<'_>) -> bool {
        let peer = info.conn.tls.as_ref().and_then(|t| t.peer.as_ref());
        self.queue
            .push(moat_events::Record::Tcp(moat_events::TcpRecord {
                ts: info.ts_ms,
                listener: info.listener.to_string(),
                client_ip: info.conn.remote_addr.ip().to_string(),
                client_port: info.conn.remote_addr.port(),
                port: info.conn.local_addr.port(),
                tls: info.tls.to_string(),
                sni: info.sni.map(str::to_string),
                principal: peer.and_then(|p| p.principal.clone()),
                cluster: info.cluster.map(str::to_string),
                upstream: info.upstream.map(str::to_string),
                decision: info.decision.to_string(),
                rule: info.rule.map(str::to_string),
                reason: info.reason.to_string(),
                duration_us: info.duration_us,
                bytes_in: info.bytes_in,
                bytes_out: info.bytes_out,
            }))
    }

    fn gauge(&self) -> Option<QueueStats> {
        Some(QueueStats {
            depth: self.queue.depth() as u64,
            capacity: self.queue.capacity() as u64,
            dropped: self.queue.dropped(),
            aggregated: self.queue.aggregated(),
            capped: self.queue.capped(),
        })
    }
}
