//! OpenTelemetry traces: W3C `traceparent`, sampling, and OTLP/HTTP export.
//!
//! The proxy builds a [`Span`] per sampled request and one per phase; the
//! [`Tracer`] encodes them as OTLP JSON into a bounded buffer that an HTTP sink
//! posts to the collector (`/v1/traces`), with the same batching, retries and
//! drop counting as the event sinks ([`crate::outbox`]).
//!
//! What it costs (docs/sinks.md#what-tracing-costs): an unsampled request pays a
//! `traceparent` lookup and one draw of a fast generator, compared against the
//! sampling threshold; only a sampled request gets ids, spans and an encoding.
//! The exporter lingers (`buffer.linger`) so that a low rate of sampled requests
//! costs one POST a second, and it runs as a task on the caller's tokio runtime
//! rather than on a thread of its own: the first extra thread of a one-worker moat
//! switches glibc to its multi-threaded system-call path, which alone cost more
//! per request (about 290 instructions) than everything else tracing does at 1%.
//!
//! Configuration: [`TracingConfig`].
//!
//! Why not the `opentelemetry` + `opentelemetry-otlp` crates: moat's spans have
//! one fixed shape built from timestamps the proxy already takes, so what those
//! crates would add is their SDK (span processors, a global provider, context
//! propagation through `tracing`) and an HTTP or gRPC stack of their own
//! (reqwest, or tonic + prost) next to the one moat has. OTLP/HTTP with JSON
//! encoding is part of the OTLP specification and every collector accepts it;
//! a few hundred lines here reuse the sinks' buffer, retries and metrics.
//!
//! Off by default. When off the proxy holds no tracer and does no per-request work.

use std::borrow::Cow;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::{RecordKind, TracingConfig};
use crate::outbox::{Message, Outbox, Severity, SinkStats};
use crate::SinkError;

/// A parsed W3C `traceparent` (version 00).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace id (never all zero).
    pub trace_id: [u8; 16],
    /// The caller's span id (never all zero).
    pub parent_id: [u8; 8],
    /// The `sampled` flag.
    pub sampled: bool,
}

fn hex_into(s: &[u8], out: &mut [u8]) -> Option<()> {
    if s.len() != out.len() * 2 {
        return None;
    }
    for (i, o) in out.iter_mut().enumerate() {
        let d = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        *o = d(s[2 * i])? << 4 | d(s[2 * i + 1])?;
    }
    Some(())
}

/// Parses a `traceparent` value; `None` when it is not valid W3C Trace Context
/// (the header is then ignored, as the specification asks).
pub fn parse_traceparent(v: &[u8]) -> Option<TraceParent> {
    // version "-" trace-id "-" parent-id "-" flags: 2+1+32+1+16+1+2 = 55 bytes for
    // version 00; later versions may append fields after another "-".
    if v.len() < 55 || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    if &v[..2] == b"ff" || (v.len() > 55 && (&v[..2] == b"00" || v[55] != b'-')) {
        return None;
    }
    let mut version = [0u8; 1];
    hex_into(&v[..2], &mut version)?;
    let mut trace_id = [0u8; 16];
    hex_into(&v[3..35], &mut trace_id)?;
    let mut parent_id = [0u8; 8];
    hex_into(&v[36..52], &mut parent_id)?;
    let mut flags = [0u8; 1];
    hex_into(&v[53..55], &mut flags)?;
    if trace_id == [0; 16] || parent_id == [0; 8] {
        return None;
    }
    Some(TraceParent {
        trace_id,
        parent_id,
        sampled: flags[0] & 1 == 1,
    })
}

/// The `traceparent` value for a span of a sampled trace.
pub fn format_traceparent(trace_id: &[u8; 16], span_id: &[u8; 8]) -> [u8; 55] {
    let mut s = [0u8; 55];
    s[..3].copy_from_slice(b"00-");
    hex_to(trace_id, &mut s[3..35]);
    s[35] = b'-';
    hex_to(span_id, &mut s[36..52]);
    s[52..].copy_from_slice(b"-01");
    s
}

/// Lower-case hex of `b` into `out` (twice as long); a table, not `fmt`, which
/// cost ~130 instructions a byte.
fn hex_to(b: &[u8], out: &mut [u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (x, o) in b.iter().zip(out.chunks_exact_mut(2)) {
        o[0] = HEX[usize::from(x >> 4)];
        o[1] = HEX[usize::from(x & 15)];
    }
}

/// A new random span id (never zero).
///
/// Ids come from `fastrand` (wyrand, seeded per thread), not from a cryptographic
/// generator: they need to be unique and uniformly spread (sampling reads the trace
/// id's bits), not secret; OpenTelemetry's SDKs make the same choice.
pub fn new_span_id() -> [u8; 8] {
    nonzero_u64().to_be_bytes()
}

fn nonzero_u64() -> u64 {
    loop {
        let x = fastrand::u64(..);
        if x != 0 {
            return x;
        }
    }
}

/// OTLP span kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// A step inside moat (a phase).
    Internal = 1,
    /// moat's handling of a request.
    Server = 2,
    /// The request to the upstream.
    Client = 3,
}

/// An attribute value.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue<'a> {
    /// A string (borrowed from the request where it can be).
    Str(Cow<'a, str>),
    /// An integer.
    Int(i64),
    /// A floating-point number.
    F64(f64),
}

/// A timed event inside a span (a security event).
#[derive(Debug, Clone, PartialEq)]
pub struct SpanEvent<'a> {
    /// Event name.
    pub name: &'static str,
    /// Unix time, nanoseconds.
    pub time_ns: u64,
    /// Attributes.
    pub attributes: Vec<(&'static str, AttrValue<'a>)>,
}

/// A finished span; it borrows what it can from the request, since it is encoded
/// before the request is dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Span<'a> {
    /// Trace id.
    pub trace_id: [u8; 16],
    /// Span id.
    pub span_id: [u8; 8],
    /// Parent span id (none for a root span).
    pub parent: Option<[u8; 8]>,
    /// Span name.
    pub name: Cow<'a, str>,
    /// Kind.
    pub kind: SpanKind,
    /// Start, unix nanoseconds.
    pub start_ns: u64,
    /// End, unix nanoseconds.
    pub end_ns: u64,
    /// Attributes.
    pub attributes: Vec<(&'static str, AttrValue<'a>)>,
    /// Events.
    pub events: Vec<SpanEvent<'a>>,
    /// Whether the span's status is an error.
    pub error: bool,
}

fn json_str(out: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        // Nothing to escape (names, routes, ids, addresses): copied as is.
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing a &str to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

/// `n` as a JSON string (OTLP/JSON writes 64-bit integers as strings).
fn json_int(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.push(b'"');
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.push(b'"');
}

fn json_hex(out: &mut Vec<u8>, b: &[u8]) {
    let start = out.len() + 1;
    out.push(b'"');
    out.resize(start + 2 * b.len(), 0);
    hex_to(b, &mut out[start..]);
    out.push(b'"');
}

fn write_attrs(out: &mut Vec<u8>, attrs: &[(&'static str, AttrValue<'_>)]) {
    out.extend_from_slice(b"[");
    for (i, (k, v)) in attrs.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"key\":");
        json_str(out, k);
        out.extend_from_slice(b",\"value\":");
        match v {
            AttrValue::Str(s) => {
                out.extend_from_slice(b"{\"stringValue\":");
                json_str(out, s);
                out.push(b'}');
            }
            AttrValue::Int(n) => {
                out.extend_from_slice(b"{\"intValue\":");
                json_int(out, *n);
                out.push(b'}');
            }
            AttrValue::F64(f) if f.is_finite() => {
                let _ = std::io::Write::write_fmt(out, format_args!("{{\"doubleValue\":{f}}}"));
            }
            AttrValue::F64(_) => out.extend_from_slice(b"{\"doubleValue\":0}"),
        }
        out.push(b'}');
    }
    out.push(b']');
}

/// About the length of `span` encoded, so that its buffer is allocated once: the fixed
/// fields take up to 256 bytes, an attribute's JSON up to 48 plus its key and value (24
/// for a number), an event's 64 plus its name and attributes.
fn encoded_len_hint(span: &Span<'_>) -> usize {
    fn attrs(a: &[(&'static str, AttrValue<'_>)]) -> usize {
        a.iter()
            .map(|(k, v)| {
                48 + k.len()
                    + match v {
                        AttrValue::Str(s) => s.len() + 8,
                        _ => 24,
                    }
            })
            .sum()
    }
    256 + span.name.len()
        + attrs(&span.attributes)
        + span
            .events
            .iter()
            .map(|e| 64 + e.name.len() + attrs(&e.attributes))
            .sum::<usize>()
}

/// Appends `span` as an OTLP JSON `Span` object.
pub fn encode_span(span: &Span<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"traceId\":");
    json_hex(out, &span.trace_id);
    out.extend_from_slice(b",\"spanId\":");
    json_hex(out, &span.span_id);
    if let Some(p) = &span.parent {
        out.extend_from_slice(b",\"parentSpanId\":");
        json_hex(out, p);
    }
    out.extend_from_slice(b",\"name\":");
    json_str(out, &span.name);
    out.extend_from_slice(b",\"kind\":");
    out.push(b'0' + span.kind as u8);
    out.extend_from_slice(b",\"startTimeUnixNano\":");
    json_int(out, span.start_ns);
    out.extend_from_slice(b",\"endTimeUnixNano\":");
    json_int(out, span.end_ns);
    out.extend_from_slice(b",\"attributes\":");
    write_attrs(out, &span.attributes);
    out.extend_from_slice(b",\"events\":[");
    for (i, e) in span.events.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"timeUnixNano\":");
        json_int(out, e.time_ns);
        out.extend_from_slice(b",\"name\":");
        json_str(out, e.name);
        out.extend_from_slice(b",\"attributes\":");
        write_attrs(out, &e.attributes);
        out.push(b'}');
    }
    out.extend_from_slice(b"]");
    // Status code 2 is ERROR; 0 (UNSET) otherwise.
    if span.error {
        out.extend_from_slice(b",\"status\":{\"code\":2}");
    }
    out.push(b'}');
}

/// The span exporter: samples, and sends spans to the collector off the request path.
pub struct Tracer {
    outbox: Arc<Outbox>,
    /// A trace is sampled when the low 8 bytes of its id, as an integer, are below this.
    threshold: u64,
    always: bool,
    /// Closed when the delivery task ends: [`Tracer::shutdown`] waits on it.
    done: Mutex<Option<mpsc::Receiver<()>>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("threshold", &self.threshold)
            .finish_non_exhaustive()
    }
}

impl Tracer {
    /// Starts the exporter, a task on the current tokio runtime (see the module
    /// docs for why not a thread); `None` when tracing is off. Fails outside a
    /// runtime.
    pub fn start(cfg: &TracingConfig, base_dir: &Path) -> Result<Option<Arc<Tracer>>, SinkError> {
        if !cfg.enabled {
            return Ok(None);
        }
        let rt = tokio::runtime::Handle::try_current()
            .map_err(|e| SinkError::Thread(std::io::Error::other(e)))?;
        let outbox = Outbox::new(&cfg.buffer);
        let sink =
            crate::http::HttpSink::new(&cfg.http(), base_dir)?.with_otlp(cfg.service_name.clone());
        let (done, wait) = mpsc::channel::<()>();
        let delivery =
            crate::outbox::deliver(outbox.clone(), sink, cfg.buffer.clone(), "tracing".into());
        rt.spawn(async move {
            delivery.await;
            drop(done);
        });
        Ok(Some(Arc::new(Tracer {
            outbox,
            threshold: (cfg.sample_ratio * u64::MAX as f64) as u64,
            always: cfg.sample_ratio >= 1.0,
            done: Mutex::new(Some(wait)),
        })))
    }

    /// The sampling decision for a request: its trace id and parent span when it is
    /// sampled. A `traceparent` decides for its trace (parent-based sampling); a new
    /// trace is sampled with the configured ratio, by its id, as OpenTelemetry's
    /// `TraceIdRatioBased` does (so every component using the same ratio agrees).
    /// The id's low 8 bytes are drawn first and the rest only for a sampled trace:
    /// an unsampled request costs one draw and a comparison.
    pub fn sample(&self, parent: Option<&TraceParent>) -> Option<([u8; 16], Option<[u8; 8]>)> {
        if let Some(p) = parent {
            return p.sampled.then_some((p.trace_id, Some(p.parent_id)));
        }
        let low = fastrand::u64(..);
        if !(self.always || low < self.threshold) {
            return None;
        }
        let mut trace_id = [0u8; 16];
        // The high half is never zero, so neither is the id.
        trace_id[..8].copy_from_slice(&nonzero_u64().to_be_bytes());
        trace_id[8..].copy_from_slice(&low.to_be_bytes());
        Some((trace_id, None))
    }

    /// Queues the spans of one request for export; never blocks (a full buffer drops them).
    pub fn export(&self, spans: &[Span<'_>]) {
        let msgs = spans.iter().map(|s| {
            let mut body = Vec::with_capacity(encoded_len_hint(s));
            encode_span(s, &mut body);
            Message {
                kind: RecordKind::Access,
                ts_ms: s.start_ns / 1_000_000,
                severity: Severity::Info,
                key: None,
                body,
            }
        });
        self.outbox.push(msgs);
    }

    /// The exporter's counters (`moat_sink_*{sink="tracing"}`).
    pub fn stats(&self) -> &Arc<SinkStats> {
        &self.outbox.stats
    }

    /// Delivers what is buffered (within the buffer's `shutdown_timeout`) and stops.
    /// Blocks until the delivery task has ended: call it off the runtime's threads
    /// (`spawn_blocking`), which the task needs to run.
    pub fn shutdown(&self) {
        self.outbox.close();
        if let Some(wait) = self.done.lock().take() {
            // Err once the task dropped its sender: it ended (or the runtime went).
            let _ = wait.recv();
        }
    }
}

impl Drop for Tracer {
    /// Asks the exporter to deliver what is buffered and end, without waiting:
    /// the last reference may go on the request path (a reload replaced this
    /// tracer and the last request that held it is done).
    fn drop(&mut self) {
        self.outbox.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trip_and_hostile_values() {
        let v = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = parse_traceparent(v).unwrap();
        assert!(p.sampled);
        assert_eq!(
            p.parent_id,
            [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7]
        );
        assert_eq!(&format_traceparent(&p.trace_id, &p.parent_id), v);
        for bad in [
            &b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"[..],
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            b"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            b"",
            b"00-",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u{e9}".as_bytes(),
        ] {
            assert!(
                parse_traceparent(bad).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A later version may append fields.
        assert!(
            parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-xyz")
                .is_some()
        );
    }

    #[test]
    fn sampling_follows_the_parent_else_the_ratio() {
        let cfg = TracingConfig {
            enabled: true,
            sample_ratio: 0.25,
            ..TracingConfig::default()
        };
        // Outside a runtime the exporter cannot start: an error, not a panic.
        assert!(Tracer::start(&cfg, Path::new(".")).is_err());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _in_rt = rt.enter();
        let t = Tracer::start(&cfg, Path::new(".")).unwrap().unwrap();
        let ids: Vec<_> = (0..20_000).filter_map(|_| t.sample(None)).collect();
        let n = ids.len();
        assert!((4_400..5_600).contains(&n), "{n} of 20000 sampled at 25%");
        // A sampled id's low half is below the threshold (TraceIdRatioBased), the id is
        // never zero, and ids do not repeat.
        for (id, parent) in &ids {
            let low = u64::from_be_bytes(id[8..].try_into().unwrap());
            assert!(low < u64::MAX / 4 + 1 && *id != [0; 16] && parent.is_none());
        }
        let distinct: std::collections::HashSet<_> = ids.iter().map(|(id, _)| *id).collect();
        assert_eq!(distinct.len(), n);
        let mut p =
            parse_traceparent(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").unwrap();
        assert_eq!(t.sample(Some(&p)), Some((p.trace_id, Some(p.parent_id))));
        p.sampled = false;
        assert_eq!(t.sample(Some(&p)), None);
        let off = TracingConfig::default();
        assert!(Tracer::start(&off, Path::new(".")).unwrap().is_none());
    }

    #[test]
    fn span_encodes_as_otlp_json() {
        let s = Span {
            trace_id: [1; 16],
            span_id: [0xab; 8],
            parent: Some([3; 8]),
            name: "GET \"api\"\n".into(),
            kind: SpanKind::Server,
            start_ns: 10,
            end_ns: 20,
            attributes: vec![
                ("http.response.status_code", AttrValue::Int(403)),
                ("f", AttrValue::F64(0.5)),
            ],
            events: vec![SpanEvent {
                name: "moat.security_event",
                time_ns: 15,
                attributes: vec![("moat.rule", AttrValue::Str("sqli".into()))],
            }],
            error: true,
        };
        let mut out = Vec::new();
        encode_span(&s, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["traceId"], "01010101010101010101010101010101");
        assert_eq!(v["spanId"], "abababababababab");
        assert_eq!(v["parentSpanId"], "0303030303030303");
        assert_eq!(v["name"], "GET \"api\"\n");
        assert_eq!(v["kind"], 2);
        assert_eq!(v["startTimeUnixNano"], "10");
        assert_eq!(v["endTimeUnixNano"], "20");
        assert_eq!(v["attributes"][0]["value"]["intValue"], "403");
        assert_eq!(v["attributes"][1]["value"]["doubleValue"], 0.5);
        assert_eq!(v["events"][0]["timeUnixNano"], "15");
        assert_eq!(
            v["events"][0]["attributes"][0]["value"]["stringValue"],
            "sqli"
        );
        assert_eq!(v["status"]["code"], 2);
        let m = Message {
            kind: RecordKind::Access,
            ts_ms: 0,
            severity: Severity::Info,
            key: None,
            body: out,
        };
        let mut req = Vec::new();
        crate::http::write_otlp_request("moat", &[m.clone(), m], &mut req);
        let v: serde_json::Value = serde_json::from_slice(&req).unwrap();
        assert_eq!(
            v["resourceSpans"][0]["scopeSpans"][0]["spans"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        assert_eq!(
            v["resourceSpans"][0]["resource"]["attributes"][0]["value"]["stringValue"],
            "moat"
        );
    }
}
