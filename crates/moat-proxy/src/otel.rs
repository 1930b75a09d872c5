//! OpenTelemetry spans of a request: one server span for moat's handling, a child
//! per timed phase, a client span for the upstream exchange, and the engines'
//! decisions as attributes and span events.
//!
//! Only sampled requests carry a [`RequestTrace`]; with tracing off (the default)
//! the proxy holds no tracer and a request costs one `None` check per phase. The
//! W3C `traceparent` of a request decides its sampling; a sampled request goes
//! upstream with moat's client span as the parent, an unsampled one with the
//! client's header unchanged.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use moat_core::RequestCtx;
use moat_sinks::trace::{
    format_traceparent, new_span_id, parse_traceparent, AttrValue, Span, SpanEvent, SpanKind,
    Tracer,
};

use crate::metrics::{Decision, Phase};

/// The W3C Trace Context header.
pub static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The spans of one sampled request, as timestamps until it ends.
pub(crate) struct RequestTrace {
    tracer: Arc<Tracer>,
    trace_id: [u8; 16],
    span_id: [u8; 8],
    parent: Option<[u8; 8]>,
    start: Instant,
    start_ns: u64,
    phases: Vec<(Phase, Instant, Instant)>,
    /// The client span: its id (sent upstream), start, end, and the endpoint.
    upstream: Option<([u8; 8], Instant, Option<Instant>, String)>,
}

/// `parts` in one string, allocated once (a span name; `format!` costs more).
fn joined(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl RequestTrace {
    /// The trace of a request that started at `start`, when it is sampled.
    pub(crate) fn begin(
        tracer: &Arc<Tracer>,
        headers: &HeaderMap,
        start: Instant,
    ) -> Option<Box<RequestTrace>> {
        let parent = headers
            .get(&TRACEPARENT)
            .and_then(|v| parse_traceparent(v.as_bytes()));
        let (trace_id, parent) = tracer.sample(parent.as_ref())?;
        Some(Box::new(RequestTrace {
            tracer: tracer.clone(),
            trace_id,
            span_id: new_span_id(),
            parent,
            start,
            start_ns: unix_ns().saturating_sub(start.elapsed().as_nanos() as u64),
            phases: Vec::with_capacity(6),
            upstream: None,
        }))
    }

    /// A phase that ran from `t0` until now.
    pub(crate) fn phase(&mut self, p: Phase, t0: Instant) {
        self.phases.push((p, t0, Instant::now()));
    }

    /// Starts the client span; returns the `traceparent` the upstream request carries.
    pub(crate) fn upstream_start(&mut self, endpoint: &str) -> Option<HeaderValue> {
        let id = new_span_id();
        self.upstream = Some((id, Instant::now(), None, endpoint.to_string()));
        HeaderValue::from_bytes(&format_traceparent(&self.trace_id, &id)).ok()
    }

    /// Ends the client span.
    pub(crate) fn upstream_end(&mut self) {
        if let Some(u) = &mut self.upstream {
            u.2 = Some(Instant::now());
        }
    }

    fn ns(&self, t: Instant) -> u64 {
        self.start_ns + t.saturating_duration_since(self.start).as_nanos() as u64
    }

    fn child(
        &self,
        span_id: [u8; 8],
        name: Cow<'static, str>,
        kind: SpanKind,
        t0: Instant,
        t1: Instant,
    ) -> Span<'_> {
        Span {
            trace_id: self.trace_id,
            span_id,
            parent: Some(self.span_id),
            name,
            kind,
            start_ns: self.ns(t0),
            end_ns: self.ns(t1),
            attributes: Vec::new(),
            events: Vec::new(),
            error: false,
        }
    }

    /// Ends the request's spans and hands them to the exporter.
    pub(crate) fn finish(
        self,
        ctx: &RequestCtx,
        method: &http::Method,
        path: &str,
        status: u16,
        decision: Decision,
    ) {
        let end = Instant::now();
        let mut spans = Vec::with_capacity(self.phases.len() + 2);
        for (p, t0, t1) in &self.phases {
            spans.push(self.child(
                new_span_id(),
                Cow::Borrowed(p.span_name()),
                SpanKind::Internal,
                *t0,
                *t1,
            ));
        }
        if let Some((id, t0, t1, endpoint)) = &self.upstream {
            let mut s = self.child(
                *id,
                Cow::Owned(joined(&[method.as_str(), " upstream"])),
                SpanKind::Client,
                *t0,
                t1.unwrap_or(end),
            );
            s.attributes
                .push(("server.address", AttrValue::Str(endpoint.into())));
            spans.push(s);
        }
        let path = path.split('?').next().unwrap_or("/");
        let mut attributes = vec![
            (
                "http.request.method",
                AttrValue::Str(method.as_str().into()),
            ),
            ("url.path", AttrValue::Str(path.into())),
            ("http.route", AttrValue::Str((&*ctx.route).into())),
            (
                "http.response.status_code",
                AttrValue::Int(i64::from(status)),
            ),
            (
                "client.address",
                AttrValue::Str(ctx.client_ip.to_string().into()),
            ),
            ("moat.request_id", AttrValue::Str((&*ctx.request_id).into())),
            ("moat.decision", AttrValue::Str(decision.name().into())),
        ];
        // The engine decision that shaped the response: the first blocking event, else the first.
        let deciding = ctx
            .events
            .iter()
            .find(|e| e.action == moat_core::EventAction::Block)
            .or(ctx.events.first());
        if let Some(e) = deciding {
            attributes.push(("moat.engine", AttrValue::Str(e.engine.into())));
            attributes.push(("moat.rule", AttrValue::Str((&*e.rule).into())));
            attributes.push((
                "moat.action",
                AttrValue::Str(moat_events::record::action_name(e.action).into()),
            ));
            if let Some(c) = e.details.get("confidence").and_then(|c| c.as_f64()) {
                attributes.push(("moat.confidence", AttrValue::F64(c)));
            }
        }
        let end_ns = self.ns(end);
        let events = ctx
            .events
            .iter()
            .map(|e| {
                let mut a = vec![
                    ("moat.engine", AttrValue::Str(e.engine.into())),
                    ("moat.rule", AttrValue::Str((&*e.rule).into())),
                    (
                        "moat.action",
                        AttrValue::Str(moat_events::record::action_name(e.action).into()),
                    ),
                    ("moat.event_id", AttrValue::Str((&*e.id).into())),
                ];
                if let Some(c) = e.details.get("confidence").and_then(|c| c.as_f64()) {
                    a.push(("moat.confidence", AttrValue::F64(c)));
                }
                if let Some(l) = &e.location {
                    a.push(("moat.location", AttrValue::Str((&**l).into())));
                }
                SpanEvent {
                    name: "moat.security_event",
                    time_ns: end_ns,
                    attributes: a,
                }
            })
            .collect();
        spans.push(Span {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent: self.parent,
            name: Cow::Owned(joined(&[method.as_str(), " ", &ctx.route])),
            kind: SpanKind::Server,
            start_ns: self.start_ns,
            end_ns,
            attributes,
            events,
            error: status >= 500,
        });
        self.tracer.export(&spans);
    }
}
