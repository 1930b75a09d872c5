//! The request path: limits, routing, phases, upstream call, response phases, records.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use http::header::{
    HeaderValue, ACCEPT, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, EXPECT, HOST, UPGRADE,
    USER_AGENT,
};
use http::{HeaderMap, HeaderName, Response, StatusCode, Version};
use moat_core::{
    AfterSent, Body, BodyNeed, DecodeLimits, EventAction, Finished, Reply, ReplyFormat, RequestCtx,
    SecurityEvent, Verdict,
};

use crate::body::{
    gather_ready, read_prefix, BodyTimedOut, BodyTooLarge, Buffered, ProxyBody, RequestBody,
};
use crate::config::{OnLimit, UnderscoreHeaders};
use crate::connection::ConnInfo;
use crate::events::AccessInfo;
use crate::ext_authz::CheckBody;
use crate::metrics::{Decision, Metrics, Phase};
use crate::otel::{RequestTrace, TRACEPARENT};
use crate::pipeline::Pipeline;
use crate::routing::Route;
use crate::state::{Shared, Snapshot};
use crate::upstream::{
    UpstreamBody, UpstreamError, UpstreamHead, UpstreamRequest, X_FORWARDED_FOR, X_REQUEST_ID,
};

/// The response type of the proxy service.
pub type ProxyResponse = Response<ProxyBody>;

/// Longest accepted incoming `x-request-id`; longer ones are replaced.
const MAX_REQUEST_ID: usize = 128;

/// Names the security event a request raised: on every refusal, and in the decision
/// service's answers (allowed in monitor mode, or denied).
pub const X_MOAT_EVENT_ID: HeaderName = HeaderName::from_static("x-moat-event-id");

/// Bodies up to this size that are already in memory (request bodies with a
/// `Content-Length`, small upstream responses) are forwarded in the same write as their
/// head instead of being streamed frame by frame (see [`gather_ready`]).
const GATHER_MAX: usize = 64 << 10;

/// Handles one downstream request. Never fails: every error becomes a reply.
///
/// Returns the response and what is left to do once its body has been sent (the
/// access record, work after-response phases registered; see [`AfterBody`]).
pub(crate) async fn handle(
    shared: &Arc<Shared>,
    ci: &ConnInfo,
    snap: &Snapshot,
    parts: &mut http::request::Parts,
    body: RequestBody,
) -> (ProxyResponse, Option<Box<AfterBody>>) {
    let start = Instant::now();

    // Request head limits, on the head as the client sent it (the connection's parser
    // enforces hard caps on the raw head before this).
    let too_large =
        parts.headers.len() > snap.max_headers || head_bytes(parts) > snap.max_header_bytes;
    let h2_error = if parts.version == Version::HTTP_2 {
        h2_request_error(parts)
    } else {
        None
    };
    // Before any engine reads the head: what the engines see is what goes upstream.
    let underscore_refused =
        ci.underscores != UnderscoreHeaders::Allow && underscore_fields(parts, ci.underscores);
    snap.cgi_twins.remove_from(&mut parts.headers);
    let request_id = request_id(&parts.headers);
    // moat's own answer before any route is known, counted as the route-less one.
    let refuse = |status: StatusCode, decision: Decision, reason: &str| {
        snap.no_route.record(decision, status.as_u16());
        let reply = error_page(status, parts.headers.get(ACCEPT), reason, &request_id);
        (reply_response(reply, &request_id), None)
    };
    if too_large {
        return refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Decision::Limit,
            "request header fields too large",
        );
    }
    if underscore_refused {
        return refuse(
            StatusCode::BAD_REQUEST,
            Decision::Error,
            "header field name with an underscore",
        );
    }

    if let Some(reason) = authority_error(&parts.uri) {
        return refuse(StatusCode::BAD_REQUEST, Decision::Error, reason);
    }

    if let Some((status, reason)) = h2_error {
        return refuse(status, Decision::Error, reason);
    }

    let Some(route) = snap.match_route(request_host(parts), parts.uri.path()) else {
        return refuse(StatusCode::NOT_FOUND, Decision::Error, "no route");
    };

    // The host is kept only for access records.
    let host = if shared.events.is_some() {
        request_host(parts).to_owned()
    } else {
        String::new()
    };
    let client_ip = client_ip(ci, &parts.headers);
    let mut ctx = RequestCtx {
        request_id,
        route: route.name.clone(),
        labels: route.labels.clone(),
        namespace: route.namespace.clone(),
        conn: ci.conn.clone(),
        client_ip,
        auth: None,
        events: Vec::new(),
        monitor_only: route.monitor_only,
        ext_authz: None,
        forward_path: None,
        slots: Default::default(),
    };
    let trace = snap
        .tracer
        .as_ref()
        .and_then(|t| RequestTrace::begin(t, &parts.headers, start));
    let mut state = ReqState {
        trace,
        user_agent: if shared.events.is_some() {
            parts.headers.get(USER_AGENT).cloned()
        } else {
            None
        },
        shared,
        snap,
        route,
        start,
        host,
        xff: &ci.xff,
        upstream: None,
        request_body: None,
        response_body: None,
        bytes_in: 0,
    };
    let resp = proxy(&mut state, &mut ctx, parts, body).await;
    let (mut resp, decision) = match resp {
        Ok(x) => x,
        Err((reply, decision)) => (refusal_response(reply, &ctx), decision),
    };
    // The client can quote the id of any response (unless the upstream set its own).
    // A value of its own, not a clone of the request's: a clone would turn both into
    // reference-counted buffers.
    if !resp.headers().contains_key(&X_REQUEST_ID) {
        if let Ok(id) = HeaderValue::from_str(&ctx.request_id) {
            resp.headers_mut().insert(X_REQUEST_ID.clone(), id);
        }
    }
    let after = state.finish(ctx, parts, &resp, decision);
    (resp, after)
}

/// Yields once, to the back of the tasks already queued: the request's task wakes
/// itself, so it runs again after the tasks that are ready now and before those the
/// next I/O poll wakes. `tokio::task::yield_now` defers the wake-up past that poll,
/// which puts every request of a batch behind the phases of the next batch as well
/// (docs/perf-log/2026-11-29-session16.md).
#[derive(Default)]
struct BehindReadyTasks {
    yielded: bool,
}

impl std::future::Future for BehindReadyTasks {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.yielded {
            return std::task::Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// Per-request state that outlives the phases (for records).
struct ReqState<'a> {
    /// The request's spans, when tracing is on and the request is sampled.
    trace: Option<Box<RequestTrace>>,
    user_agent: Option<HeaderValue>,
    shared: &'a Arc<Shared>,
    snap: &'a Snapshot,
    route: &'a Route,
    start: Instant,
    /// Empty unless events are recorded.
    host: String,
    /// The peer address as an `X-Forwarded-For` element.
    xff: &'a HeaderValue,
    upstream: Option<usize>,
    request_body: Option<Bytes>,
    response_body: Option<Bytes>,
    bytes_in: u64,
}

type ProxyResult = Result<(ProxyResponse, Decision), (Reply, Decision)>;

/// The request's phases in order: request headers, request body, upstream, response.
/// Each phase group is a function; a refusal anywhere ends the request with a reply.
async fn proxy(
    st: &mut ReqState<'_>,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
    body: RequestBody,
) -> ProxyResult {
    let pipeline = &st.snap.pipeline;
    let headers = request_headers_phase(&st.shared.metrics, &mut st.trace, pipeline, ctx, parts);
    // A CUSTOM provider that wants the body (still named in `ctx.ext_authz`) is called
    // once it is buffered, and decides before the refusal of the headers phase.
    let refused = match headers.await {
        Err(e) if ctx.ext_authz.is_none() => return Err(e),
        r => r.err(),
    };
    // After-response phases that want the bodies get copies of what was inspected.
    let mut keep_bodies = BodyNeed::None;
    for p in &pipeline.after_response {
        keep_bodies = keep_bodies.max(p.wants_bodies(ctx, parts));
    }
    let body = body.paced(st.route.body_pace);
    let (forward, tripped) = request_body_phase(st, ctx, parts, body, keep_bodies, refused).await?;
    let resp = upstream_phase(st, ctx, parts, forward, tripped).await?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        // The client only gets a 101 it asked for (the upstream client refuses others);
        // the body holds the upstream connection, which the server joins with the
        // client's once the 101 head is written.
        let (rparts, rbody) = resp.into_parts();
        return Ok((
            Response::from_parts(rparts, ProxyBody::Upstream(rbody)),
            Decision::Allow,
        ));
    }
    response_phase(st, ctx, parts, resp, keep_bodies).await
}

/// The request-headers phase, and the external authorizer an Istio `action: CUSTOM`
/// policy named in it: CUSTOM decides first (its denial is the reply even when a DENY
/// policy or another engine refused too), then the phase's own refusal. A provider
/// that wants the body is left in `ctx.ext_authz` for [`custom_with_body`].
pub(crate) async fn request_headers_phase(
    metrics: &Metrics,
    trace: &mut Option<Box<RequestTrace>>,
    pipeline: &Pipeline,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
) -> Result<(), (Reply, Decision)> {
    let verdict = run_phase(
        metrics,
        trace,
        Phase::RequestHeaders,
        &pipeline.request_headers,
        |p| p.on_request_headers(ctx, parts),
    );
    if let Some(pq) = ctx.forward_path.take() {
        forward_path(parts, pq);
    }
    if let (Some(provider), Some(ext)) = (ctx.ext_authz.take(), &pipeline.engines.ext_authz) {
        if ext.wants_body(&provider).is_some() {
            ctx.ext_authz = Some(provider);
        } else {
            ext.check(&provider, ctx, parts, None)
                .await
                .map_err(|reply| (reply, Decision::Block))?;
        }
    }
    verdict
}

/// Replaces the path and query of the request's target by the one access control
/// matched ([`RequestCtx::forward_path`]): the CUSTOM provider, the body phases and the
/// upstream get the path the policies were evaluated on.
fn forward_path(parts: &mut http::request::Parts, pq: http::uri::PathAndQuery) {
    let mut uri = parts.uri.clone().into_parts();
    uri.path_and_query = Some(pq);
    // The target was a valid URI with another path; with this one it still is.
    if let Ok(u) = http::Uri::from_parts(uri) {
        parts.uri = u;
    }
}

/// Calls the CUSTOM provider left in `ctx.ext_authz` once the body is buffered: the one
/// [`request_headers_phase`] left for the body, or one access control's body phase named
/// (a `_method` field a CUSTOM rule matched). `data` is the start of the body (all of it
/// unless `more`). A body longer than the provider's `maxRequestBytes` is refused (413)
/// unless it allows partial messages; then it gets the first `maxRequestBytes`. A
/// provider that does not want the body is called without it.
pub(crate) async fn custom_with_body(
    pipeline: &Pipeline,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
    data: &Bytes,
    more: bool,
) -> Result<(), (Reply, Decision)> {
    let (Some(provider), Some(ext)) = (ctx.ext_authz.take(), &pipeline.engines.ext_authz) else {
        return Ok(());
    };
    let Some(spec) = ext.wants_body(&provider) else {
        return ext
            .check(&provider, ctx, parts, None)
            .await
            .map_err(|reply| (reply, Decision::Block));
    };
    let max = spec.max_request_bytes as usize;
    let partial = more || data.len() > max;
    if partial && !spec.allow_partial_message {
        return Err(refuse_body(BodyRefusal::TooLarge, parts, ctx));
    }
    let sent = if data.len() > max {
        data.slice(..max)
    } else {
        data.clone()
    };
    let body = CheckBody {
        data: &sent,
        partial,
    };
    ext.check(&provider, ctx, parts, Some(body))
        .await
        .map_err(|reply| (reply, Decision::Block))
}

/// Which message a buffered body belongs to.
#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}

/// The `limits` event of a body longer than what its route lets moat inspect.
fn inspection_limit_event(side: Side, limit: u64) -> SecurityEvent {
    let (rule, location, what) = match side {
        Side::Request => ("request_body_limit", "body", "request"),
        Side::Response => ("response_body_limit", "response_body", "response"),
    };
    SecurityEvent::new(
        "limits",
        rule,
        EventAction::Bypass,
        format!("{what} body exceeds {limit} bytes: only the first {limit} bytes were inspected"),
    )
    .at(location)
}

/// What goes on after a buffered body was inspected: the whole (possibly rewritten)
/// body with its length (or, when trailers ended it, without a length, so that an
/// HTTP/1.1 peer gets it chunked with the trailers), or, when only a prefix was read,
/// the inspected prefix followed by the rest of the stream (`rest`, given the bytes
/// already taken).
fn forward_inspected(
    inspected: &Inspected,
    buffered: &Buffered,
    headers: &mut HeaderMap,
    set_length: bool,
    rest: impl FnOnce(u64) -> ProxyBody,
) -> ProxyBody {
    if buffered.truncated {
        let prefix = inspected.followed_by(&buffered.overflow);
        let consumed = prefix.len() as u64;
        ProxyBody::Prefixed(Some(prefix), Box::new(rest(consumed)))
    } else if let Some(t) = &buffered.trailers {
        headers.remove(CONTENT_LENGTH);
        ProxyBody::Prefixed(
            Some(inspected.data.clone()),
            Box::new(ProxyBody::Trailers(Some(t.clone()))),
        )
    } else {
        if set_length {
            set_content_length(headers, inspected.data.len());
        }
        ProxyBody::full(inspected.data.clone())
    }
}

/// The request body phase: the route's limit, buffering when a phase (or an
/// after-response phase) asks for the body, the phases, and the body to forward
/// (with the flag a streamed body sets when it crosses the limit).
async fn request_body_phase(
    st: &mut ReqState<'_>,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
    body: RequestBody,
    keep_bodies: BodyNeed,
    refused: Option<(Reply, Decision)>,
) -> Result<(ProxyBody, Option<Arc<AtomicBool>>), (Reply, Decision)> {
    let route = st.route;
    let pipeline = &st.snap.pipeline;
    let content_length = content_length(&parts.headers);
    st.bytes_in = content_length.unwrap_or(0);
    let limit = route.body_max;
    if route.on_limit == OnLimit::Reject && content_length.is_some_and(|l| l > limit) {
        return Err(refuse_body(BodyRefusal::TooLarge, parts, ctx));
    }
    let mut need = keep_bodies;
    // The CUSTOM provider left for the body, and what it wants of it.
    let custom = ctx
        .ext_authz
        .as_ref()
        .zip(pipeline.engines.ext_authz.as_ref())
        .and_then(|(name, ext)| ext.wants_body(name));
    if let Some(spec) = custom {
        need = need.max(BodyNeed::Buffer(spec.max_request_bytes as usize));
    }
    if !pipeline.request_body.is_empty() {
        need = need.max(pipeline.request_body_need(ctx, parts));
    }
    // Set when a streamed body exceeds the limit (allocated only for such bodies).
    let mut tripped: Option<Arc<AtomicBool>> = None;
    // Ended already: an HTTP/1.1 body of length 0 is. (An HTTP/2 stream that declares
    // a length of 0 is read to its end: trailers may follow.)
    if http_body::Body::is_end_stream(&body) {
        custom_with_body(pipeline, ctx, parts, &Bytes::new(), false).await?;
        return match refused {
            Some(r) => Err(r),
            None => Ok((ProxyBody::Empty, None)),
        };
    }
    let mut body = body;
    let untrailed = pipeline.inspects_request_trailers(ctx);
    let (cap, text_only) = match need {
        BodyNeed::None => {
            let forward = match content_length {
                // A small body with a known length usually arrived with its head:
                // take it so that head and body go upstream in one write.
                Some(n) if n <= GATHER_MAX as u64 => {
                    let g = match gather_ready(&mut body, n as usize).await {
                        Ok(g) => g,
                        Err(e) => return Err(refuse_body(BodyRefusal::from(&*e), parts, ctx)),
                    };
                    if let Some(t) = &g.trailers {
                        request_trailers_phase(st, ctx, parts, t)?;
                    }
                    g.into_body(|| untrailed_if(untrailed, ProxyBody::Stream(body)))
                }
                _ => untrailed_if(
                    untrailed,
                    limited_stream(body, route, content_length, 0, &mut tripped),
                ),
            };
            return Ok((forward, tripped));
        }
        BodyNeed::Buffer(n) => ((n as u64).min(limit) as usize, false),
        BodyNeed::BufferText(n) => ((n as u64).min(limit) as usize, true),
    };
    let buffered = match read_prefix(&mut body, cap, text_only).await {
        Ok(b) => b,
        Err(e) => return Err(refuse_body(BodyRefusal::from(&*e), parts, ctx)),
    };
    if buffered.binary {
        // Binary: streamed as if no phase wanted it, its first frame included.
        let consumed = buffered.data.len() as u64;
        if route.on_limit == OnLimit::Reject && consumed > limit {
            return Err(refuse_body(BodyRefusal::TooLarge, parts, ctx));
        }
        let rest = limited_stream(body, route, content_length, consumed, &mut tripped);
        let forward =
            ProxyBody::Prefixed(Some(buffered.data), Box::new(untrailed_if(untrailed, rest)));
        return Ok((forward, tripped));
    }
    let over_limit = buffered.truncated && cap as u64 == limit;
    if over_limit {
        if route.on_limit == OnLimit::Reject {
            return Err(refuse_body(BodyRefusal::TooLarge, parts, ctx));
        }
        ctx.events
            .push(inspection_limit_event(Side::Request, limit));
    }
    custom_with_body(pipeline, ctx, parts, &buffered.data, buffered.truncated).await?;
    if let Some(r) = refused {
        return Err(r);
    }
    let mut b = phase_body(buffered.data.clone(), buffered.truncated, &parts.headers);
    run_phase(
        &st.shared.metrics,
        &mut st.trace,
        Phase::RequestBody,
        &pipeline.request_body,
        |p| p.on_request_body(ctx, parts, &mut b),
    )?;
    // A CUSTOM rule a `_method` field of the body matched (access control's body phase).
    if ctx.ext_authz.is_some() {
        custom_with_body(pipeline, ctx, parts, &buffered.data, buffered.truncated).await?;
    }
    if let Some(t) = &buffered.trailers {
        request_trailers_phase(st, ctx, parts, t)?;
    }
    let inspected = Inspected::new(b, &mut parts.headers);
    if keep_bodies != BodyNeed::None {
        st.request_body = Some(inspected.data.clone());
    }
    if buffered.truncated && (content_length.is_none() || inspected.modified) {
        parts.headers.remove(CONTENT_LENGTH);
    }
    let forward = forward_inspected(
        &inspected,
        &buffered,
        &mut parts.headers,
        true,
        |consumed| {
            let rest = if route.on_limit == OnLimit::Reject && !over_limit {
                ProxyBody::Limited {
                    inner: Box::new(body),
                    remaining: limit.saturating_sub(consumed),
                    tripped: tripped.get_or_insert_with(Default::default).clone(),
                }
            } else {
                ProxyBody::Stream(body)
            };
            untrailed_if(untrailed, rest)
        },
    );
    Ok((forward, tripped))
}

/// The trailers of a request body moat read whole, shown to the phases that inspect
/// trailer fields before anything of the body is forwarded.
fn request_trailers_phase(
    st: &mut ReqState<'_>,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
    trailers: &HeaderMap,
) -> Result<(), (Reply, Decision)> {
    run_phase(
        &st.shared.metrics,
        &mut st.trace,
        Phase::RequestBody,
        &st.snap.pipeline.request_body,
        |p| p.on_request_trailers(ctx, parts, trailers),
    )
}

/// `stream`, without its trailers when a phase inspects trailer fields: those of a
/// streamed body arrive after it was forwarded, too late to be inspected.
fn untrailed_if(untrailed: bool, stream: ProxyBody) -> ProxyBody {
    if untrailed {
        ProxyBody::Untrailed(Box::new(stream))
    } else {
        stream
    }
}

/// The upstream phase: an endpoint of the route's cluster, the exchange, and the
/// reply when it fails (413 for a streamed body over the limit, 408 for one that did
/// not arrive in time, 502/504 for the upstream's failures).
async fn upstream_phase(
    st: &mut ReqState<'_>,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
    forward: ProxyBody,
    tripped: Option<Arc<AtomicBool>>,
) -> Result<Response<UpstreamBody>, (Reply, Decision)> {
    let cluster = &st.route.cluster;
    let ep = cluster.pick();
    st.upstream = Some(ep);
    if let Some(tr) = &mut st.trace {
        // The upstream joins the trace as a child of moat's client span.
        if let Some(v) = tr.upstream_start(cluster.endpoints[ep].authority.as_str()) {
            parts.headers.insert(TRACEPARENT.clone(), v);
        }
    }
    let up_req = UpstreamRequest {
        head: UpstreamHead {
            method: &parts.method,
            // Origin-form request target; the endpoint is chosen by the connection.
            target: parts.uri.path_and_query().map_or("/", |pq| pq.as_str()),
            headers: &parts.headers,
            upgrade: is_upgrade(parts, st.route),
            // RFC 9112 3.2.2: the authority of an absolute-form target replaces `Host`.
            replace_host: parts.uri.authority().is_some(),
            // HTTP/2 carries the host in `:authority`; HTTP/1.0 may carry none at all.
            default_host: parts
                .uri
                .authority()
                .unwrap_or(&cluster.endpoints[ep].authority)
                .as_str(),
            forwarded_for: st.xff,
            request_id: &ctx.request_id,
            forwarded_proto: if ctx.conn.tls.is_some() {
                "https"
            } else {
                "http"
            },
        },
        body: forward,
    };

    // Every request ready now runs its phases before the first of them is written
    // upstream: an upstream on moat's CPU runs at each write (its wake-up preempts
    // moat) and evicts the engines' code from the caches, so the phases of a batch
    // run back to back while that code is warm. Under the peer protocol this halves
    // the turns per all-engines POST and gains 16% req/s; without request phases
    // there is nothing to keep warm and the yield only adds turns
    // (docs/perf-log/2026-11-29-session14.md).
    if st.snap.pipeline.inspects_requests() {
        BehindReadyTasks::default().await;
    }
    let t = Instant::now();
    let result = cluster.send(ep, up_req).await;
    let took = t.elapsed();
    st.shared.metrics.phase(Phase::Upstream).observe(took);
    if let Some(tr) = &mut st.trace {
        tr.upstream_end();
    }
    let e = match result {
        Ok(resp) => {
            cluster.metrics.latency.observe(took);
            cluster.responded(ep, resp.status());
            return Ok(resp);
        }
        Err(e) => e,
    };
    let over = tripped.as_ref().is_some_and(|t| t.load(Ordering::Acquire));
    if let UpstreamError::RequestBody(b) = &e {
        if over || source_is::<BodyTooLarge>(b.as_ref()) {
            return Err(refuse_body(BodyRefusal::TooLarge, parts, ctx));
        }
        if source_is::<BodyTimedOut>(b.as_ref()) {
            return Err(refuse_body(BodyRefusal::TimedOut, parts, ctx));
        }
    } else if over {
        return Err(refuse_body(BodyRefusal::TooLarge, parts, ctx));
    }
    let (status, title) = match &e {
        UpstreamError::ConnectTimeout | UpstreamError::Timeout => {
            cluster.failure(ep);
            cluster.metrics.timeouts.fetch_add(1, Ordering::Relaxed);
            (StatusCode::GATEWAY_TIMEOUT, "upstream timeout")
        }
        UpstreamError::Connect(_) => {
            cluster.failure(ep);
            cluster
                .metrics
                .connect_errors
                .fetch_add(1, Ordering::Relaxed);
            (StatusCode::BAD_GATEWAY, "upstream unreachable")
        }
        UpstreamError::RequestBody(_) => {
            (StatusCode::BAD_REQUEST, "request body could not be read")
        }
        UpstreamError::Io(_) | UpstreamError::Protocol(_) => {
            // A reset or an answer moat refuses is a failed exchange like a timeout
            // (Envoy's "gateway failure"): a hostile or broken endpoint is ejected too.
            cluster.failure(ep);
            cluster.metrics.other_errors.fetch_add(1, Ordering::Relaxed);
            (StatusCode::BAD_GATEWAY, "upstream error")
        }
    };
    tracing::debug!(request_id = %ctx.request_id, cluster = %cluster.name, error = %e, "upstream request failed");
    Err((
        error_page(status, parts.headers.get(ACCEPT), title, &ctx.request_id),
        Decision::Error,
    ))
}

/// The response phase: the response body buffered when a phase (or an after-response
/// phase) asks for it, the phases, and the response to send; else the body streams
/// (a small one gathered into the head's write).
async fn response_phase(
    st: &mut ReqState<'_>,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
    resp: Response<UpstreamBody>,
    keep_bodies: BodyNeed,
) -> ProxyResult {
    let pipeline = &st.snap.pipeline;
    let cluster = &st.route.cluster;
    // Hop-by-hop fields were left out when the head was parsed.
    let (mut rparts, mut rbody) = resp.into_parts();
    let mut need = keep_bodies;
    for p in &pipeline.response_body {
        need = need.max(p.body_need(ctx, parts, &rparts));
    }
    // The upstream failed while sending the response body, before any of it left.
    let body_failed = |ctx: &RequestCtx| {
        cluster.metrics.other_errors.fetch_add(1, Ordering::Relaxed);
        let page = error_page(
            StatusCode::BAD_GATEWAY,
            parts.headers.get(ACCEPT),
            "upstream error",
            &ctx.request_id,
        );
        (page, Decision::Error)
    };
    let cap = match need {
        BodyNeed::None => {
            let small = http_body::Body::size_hint(&rbody)
                .exact()
                .is_none_or(|n| n <= GATHER_MAX as u64);
            let out = if small && !http_body::Body::is_end_stream(&rbody) {
                // Take what the upstream connection already read (for a small chunked
                // response: all of it, end included), so the response leaves in one write.
                match gather_ready(&mut rbody, GATHER_MAX).await {
                    Ok(g) => g.into_body(|| ProxyBody::Upstream(rbody)),
                    Err(_) => return Err(body_failed(ctx)),
                }
            } else {
                ProxyBody::Upstream(rbody)
            };
            return Ok((Response::from_parts(rparts, out), Decision::Allow));
        }
        BodyNeed::Buffer(n) | BodyNeed::BufferText(n) => {
            (n as u64).min(st.route.response_max) as usize
        }
    };
    let buffered = match read_prefix(&mut rbody, cap, false).await {
        Ok(b) => b,
        Err(_) => return Err(body_failed(ctx)),
    };
    if buffered.truncated && cap as u64 == st.route.response_max {
        ctx.events.push(inspection_limit_event(
            Side::Response,
            st.route.response_max,
        ));
    }
    let mut b = phase_body(buffered.data.clone(), buffered.truncated, &rparts.headers);
    run_phase(
        &st.shared.metrics,
        &mut st.trace,
        Phase::ResponseBody,
        &pipeline.response_body,
        |p| p.on_response_body(ctx, parts, &mut rparts, &mut b),
    )?;
    let inspected = Inspected::new(b, &mut rparts.headers);
    if keep_bodies != BodyNeed::None {
        st.response_body = Some(inspected.data.clone());
    }
    if buffered.truncated && inspected.modified {
        rparts.headers.remove(CONTENT_LENGTH);
    }
    // A response to HEAD keeps the length of the representation.
    let set_length = parts.method != http::Method::HEAD;
    let out = forward_inspected(
        &inspected,
        &buffered,
        &mut rparts.headers,
        set_length,
        |_| ProxyBody::Upstream(rbody),
    );
    Ok((Response::from_parts(rparts, out), Decision::Allow))
}

impl ReqState<'_> {
    /// Counts the request, writes its security events, hands the exchange to
    /// after-response phases, and returns what is left for when the response
    /// body has been sent: the access record and the phases' deferred work.
    fn finish(
        &mut self,
        ctx: RequestCtx,
        parts: &mut http::request::Parts,
        resp: &ProxyResponse,
        decision: Decision,
    ) -> Option<Box<AfterBody>> {
        let status = resp.status();
        self.route.metrics.record(decision, status.as_u16());
        // One clock read serves the request's duration and the start of the
        // after-response phase (each read is a vDSO call).
        let t = Instant::now();
        let duration = t.saturating_duration_since(self.start);
        self.route.metrics.duration.observe(duration);
        for ev in &ctx.events {
            self.shared.metrics.count_security_event(
                &ctx.route,
                ev.engine,
                &ev.rule,
                moat_events::record::action_name(ev.action),
            );
        }
        if let Some(tr) = self.trace.take() {
            let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            tr.finish(&ctx, &parts.method, path, status.as_u16(), decision);
        }
        let pipeline = &self.snap.pipeline;
        let sink = self.shared.events.as_ref();
        if pipeline.after_response.is_empty() && sink.is_none() {
            return None;
        }
        if let Some(sink) = sink {
            let dropped = ctx
                .events
                .iter()
                .filter(|ev| !sink.security_with_head(&ctx, ev, parts))
                .count();
            self.shared.metrics.count_dropped_events(dropped as u64);
        }
        let mut after_sent = AfterSent::default();
        if !pipeline.after_response.is_empty() {
            let done = Finished::new(&ctx, parts, status, resp.headers())
                .with_bodies(self.request_body.as_ref(), self.response_body.as_ref())
                .with_duration_us(duration.as_micros() as u64);
            for p in &pipeline.after_response {
                p.after_response(&done);
            }
            after_sent = done.into_after_sent();
        }
        let access = sink.map(|_| PendingAccess {
            shared: self.shared.clone(),
            upstream: self.upstream.map(|i| {
                let cluster = &self.route.cluster;
                (cluster.name.clone(), cluster.endpoints[i].authority.clone())
            }),
            ctx,
            // The request is done with: its method and target move to the record.
            method: std::mem::take(&mut parts.method),
            uri: std::mem::take(&mut parts.uri),
            host: std::mem::take(&mut self.host),
            user_agent: self.user_agent.take(),
            status: status.as_u16(),
            decision,
            start: self.start,
            bytes_in: self.bytes_in,
            bytes_out: 0,
        });
        self.shared
            .metrics
            .phase(Phase::AfterResponse)
            .observe(t.elapsed());
        (access.is_some() || !after_sent.is_empty())
            .then(|| Box::new(AfterBody { access, after_sent }))
    }
}

/// What is left of a request once its response head is ready, run when the
/// response body has ended or was dropped because the client went away.
pub(crate) struct AfterBody {
    access: Option<PendingAccess>,
    after_sent: AfterSent,
}

impl AfterBody {
    /// Counts response body bytes as they are sent.
    #[inline]
    pub(crate) fn sent(&mut self, n: usize) {
        if let Some(a) = &mut self.access {
            a.bytes_out += n as u64;
        }
    }

    /// Writes the access record, then runs the phases' deferred work.
    pub(crate) fn run(self) {
        if let Some(a) = self.access {
            a.write();
        }
        self.after_sent.run();
    }
}

/// The access record of a request whose response body is still being sent. It
/// is written when the body has ended, or was dropped because the client went
/// away, so that its duration runs to the last byte and `bytes_out` counts the
/// body bytes actually handed to the connection.
struct PendingAccess {
    /// Holds the event sink (`shared.events`) and the drop counter.
    shared: Arc<Shared>,
    ctx: RequestCtx,
    method: http::Method,
    uri: http::Uri,
    host: String,
    user_agent: Option<HeaderValue>,
    status: u16,
    decision: Decision,
    upstream: Option<(Arc<str>, http::uri::Authority)>,
    start: Instant,
    bytes_in: u64,
    bytes_out: u64,
}

impl PendingAccess {
    /// Writes the record (the response has ended).
    fn write(self) {
        let info = AccessInfo {
            ctx: &self.ctx,
            method: &self.method,
            host: &self.host,
            path: self.uri.path_and_query().map_or("/", |p| p.as_str()),
            user_agent: self.user_agent.as_ref().and_then(|v| v.to_str().ok()),
            status: self.status,
            decision: self.decision,
            upstream: self.upstream.as_ref().map(|(c, e)| (&**c, e.as_str())),
            duration_us: self.start.elapsed().as_micros() as u64,
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
        };
        if let Some(sink) = &self.shared.events {
            if !sink.access(&info) {
                self.shared.metrics.count_dropped_events(1);
            }
        }
    }
}

fn limited_stream(
    body: RequestBody,
    route: &Route,
    content_length: Option<u64>,
    consumed: u64,
    tripped: &mut Option<Arc<AtomicBool>>,
) -> ProxyBody {
    if route.on_limit == OnLimit::Reject && content_length.is_none() {
        ProxyBody::Limited {
            inner: Box::new(body),
            remaining: route.body_max.saturating_sub(consumed),
            tripped: tripped.get_or_insert_with(Default::default).clone(),
        }
    } else {
        ProxyBody::Stream(body)
    }
}

fn source_is<E: std::error::Error + 'static>(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if err.is::<E>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Applies a listener's `headers_with_underscores` other than `allow`: drops the fields
/// whose names contain `_`, or returns true when the request must be refused for one.
fn underscore_fields(parts: &mut http::request::Parts, action: UnderscoreHeaders) -> bool {
    let has = |k: &HeaderName| k.as_str().contains('_');
    if !parts.headers.keys().any(has) {
        return false;
    }
    if action == UnderscoreHeaders::Reject {
        return true;
    }
    let names: Vec<HeaderName> = parts.headers.keys().filter(|k| has(k)).cloned().collect();
    for k in names {
        parts.headers.remove(k);
    }
    false
}

/// What is wrong with the authority of a request target (absolute form, or HTTP/2's
/// `:authority`), if anything. moat routes and authorizes on its host, and an upstream
/// reads the whole authority as the `Host` it is sent; where the two could part, the
/// request is refused:
/// - userinfo (`http://admin@host/`, an error by RFC 9110 4.2.4 and RFC 9113 8.3.1): a
///   backend reading the `Host` another way would see a host moat never checked;
/// - a port that is not digits (`a.example:x`, which the `http` crate takes): no two
///   parsers agree on where such a host ends.
pub(crate) fn authority_error(uri: &http::Uri) -> Option<&'static str> {
    let a = uri.authority()?;
    if a.as_str().contains('@') {
        return Some("userinfo in the request target");
    }
    // Without userinfo the authority is the host, then `:port` if any.
    let port = a.as_str().get(a.host().len()..).unwrap_or_default();
    match port.strip_prefix(':') {
        Some(digits) if !digits.bytes().all(|b| b.is_ascii_digit()) => {
            Some("invalid port in the request target")
        }
        _ => None,
    }
}

/// What HTTP/1.1's parser refuses in a head and HTTP/2 lets through, checked on an
/// HTTP/2 request before moat translates it: the error to answer with, if any.
/// - An expectation (RFC 9110 10.1.1): moat frames the body it forwards itself, so
///   `100-continue` is dropped, as HTTP/1.1's parser drops it; any other is refused.
/// - A field name that is not a token (RFC 9110 5.1). HTTP/2 forbids only controls,
///   spaces, upper case and non-ASCII in a name (RFC 9113 8.2.1), and the `http` crate
///   lets `"` through as well: written into an HTTP/1.1 head, such a name is one an
///   upstream's parser refuses or reads another way.
/// - Whitespace around a field value (malformed, RFC 9113 8.2.1), which HTTP/1.1's
///   parser strips (RFC 9112 5.1) and an HTTP/1.1 upstream would strip from what moat
///   forwards: it is trimmed here, so the engines read each value as the upstream will
///   (a padded ` Bearer <jwt>` checked as no token, then read as one, or a padded
///   `host` matched against no policy host, then served as the host it names).
/// - A `host` field that is not one `host[:port]` (RFC 9112 3.2, as HTTP/1.1's parser
///   checks it): moat routes and authorizes an HTTP/2 request without `:authority` on
///   it, and an upstream would read it another way.
pub(crate) fn h2_request_error(
    parts: &mut http::request::Parts,
) -> Option<(StatusCode, &'static str)> {
    if parts.headers.keys().any(|k| k.as_str().contains('"')) {
        return Some((StatusCode::BAD_REQUEST, "invalid header field name"));
    }
    for (_, v) in parts.headers.iter_mut() {
        let b = v.as_bytes();
        let padded = |c: Option<&u8>| matches!(c, Some(b' ' | b'\t'));
        if padded(b.first()) || padded(b.last()) {
            // A part of a valid value is valid: it only loses bytes at both ends.
            if let Ok(trimmed) = HeaderValue::from_bytes(b.trim_ascii()) {
                *v = trimmed;
            }
        }
    }
    if parts.headers.contains_key(HOST) {
        let mut hosts = parts.headers.get_all(HOST).iter();
        let valid = hosts
            .next()
            .is_some_and(|h| crate::h1::server::valid_host(h.as_bytes()));
        if !valid || hosts.next().is_some() {
            return Some((StatusCode::BAD_REQUEST, "invalid host"));
        }
    }
    if parts.headers.contains_key(EXPECT) {
        let failed = parts
            .headers
            .get_all(EXPECT)
            .iter()
            .any(|v| !v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        parts.headers.remove(EXPECT);
        if failed {
            return Some((StatusCode::EXPECTATION_FAILED, "expectation not supported"));
        }
    }
    None
}

/// The request id: a valid incoming `x-request-id`, or a new one. The upstream request
/// carries it in place of the incoming field (see [`UpstreamRequest::request_id`]).
pub(crate) fn request_id(headers: &HeaderMap) -> String {
    if let Some(v) = headers.get(&X_REQUEST_ID) {
        if !v.is_empty() && v.len() <= MAX_REQUEST_ID {
            if let Ok(s) = v.to_str() {
                return s.to_owned();
            }
        }
    }
    new_request_id()
}

/// A random request id: 32 lowercase hex digits (filled in place: this runs per request).
pub fn new_request_id() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let n: u128 = rand::random();
    let mut digits = [0u8; 32];
    // A byte at a time, two digits each (a 128-bit shift per digit cost 150
    // instructions a request).
    for (pair, byte) in digits.chunks_exact_mut(2).zip(n.to_le_bytes()) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0xf)];
    }
    // Hex digits are ASCII: `from_utf8` checks them on its ASCII fast path, where
    // `from_utf8_lossy` walked them chunk by chunk (about 250 instructions a request).
    String::from_utf8(digits.to_vec()).unwrap_or_default()
}

/// Host addressed by the request, without port.
pub(crate) fn request_host(parts: &http::request::Parts) -> &str {
    moat_core::request_host(parts)
}

fn head_bytes(parts: &http::request::Parts) -> usize {
    let mut n = parts.uri.path_and_query().map_or(1, |p| p.as_str().len());
    for (k, v) in parts.headers.iter() {
        n += k.as_str().len() + v.len() + 4;
    }
    n
}

fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// Runs one phase's engines in order, timed as that phase (an empty phase is not
/// timed: the clock is read per request). The first engine that answers ends the
/// request with its reply.
pub(crate) fn run_phase<P: ?Sized>(
    metrics: &Metrics,
    trace: &mut Option<Box<RequestTrace>>,
    phase: Phase,
    engines: &[Arc<P>],
    mut call: impl FnMut(&P) -> Verdict,
) -> Result<(), (Reply, Decision)> {
    if engines.is_empty() {
        return Ok(());
    }
    let t = Instant::now();
    let verdict = engines.iter().map(|p| call(p)).find_map(|v| match v {
        Verdict::Respond(r) => Some(r),
        _ => None,
    });
    metrics.phase(phase).observe(t.elapsed());
    if let Some(tr) = trace {
        tr.phase(phase, t);
    }
    verdict.map_or(Ok(()), |r| Err((r, Decision::Block)))
}

/// A buffered body (or its first `truncated` part) as body phases see it, decoded
/// according to the message's `Content-Encoding`.
pub(crate) fn phase_body(data: Bytes, truncated: bool, headers: &HeaderMap) -> Body {
    let encoding = headers
        .get(CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    Body::new(data, encoding, truncated, DecodeLimits::default())
}

/// A body after its phases ran: the bytes to forward in its place.
struct Inspected {
    /// The body as the phases left it (on the wire encoding, or rewritten).
    data: Bytes,
    /// A phase rewrote it.
    modified: bool,
}

impl Inspected {
    /// Takes the phases' result; a rewritten body is sent without its original
    /// `Content-Encoding` (phases write decoded bytes).
    fn new(body: Body, headers: &mut HeaderMap) -> Self {
        let modified = body.modified();
        if modified {
            headers.remove(CONTENT_ENCODING);
        }
        Inspected {
            data: body.into_raw(),
            modified,
        }
    }

    /// The inspected prefix followed by the bytes read past it (`overflow`), for a
    /// body whose rest still streams.
    fn followed_by(&self, overflow: &Bytes) -> Bytes {
        let mut prefix = BytesMut::with_capacity(self.data.len() + overflow.len());
        prefix.extend_from_slice(&self.data);
        prefix.extend_from_slice(overflow);
        prefix.freeze()
    }
}

fn set_content_length(h: &mut HeaderMap, n: usize) {
    h.insert(CONTENT_LENGTH, HeaderValue::from(n));
}

/// True when the request switches protocols on its way: HTTP/1.1, `Connection:
/// upgrade`, and only protocols the route allows in `Upgrade`. Any other request is
/// forwarded as a plain one (`Upgrade` is hop-by-hop and dropped), so the upstream cannot
/// answer `101` and turn the connection into a tunnel moat does not inspect.
fn is_upgrade(parts: &http::request::Parts, route: &Route) -> bool {
    let mut upgrade = parts.headers.get_all(UPGRADE).iter().peekable();
    parts.version == Version::HTTP_11
        && upgrade.peek().is_some()
        && upgrade.all(|v| route.allows_upgrade(v.as_bytes()))
        && parts
            .headers
            .get_all(CONNECTION)
            .iter()
            .any(|v| header_has_token(v, "upgrade"))
}

fn header_has_token(v: &HeaderValue, token: &str) -> bool {
    v.to_str()
        .map(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        .unwrap_or(false)
}

/// The original client: the `xff_trusted_hops`-th address from the right of
/// `X-Forwarded-For`, or the TCP peer.
fn client_ip(ci: &ConnInfo, h: &HeaderMap) -> std::net::IpAddr {
    let peer = ci.conn.remote_addr.ip();
    if ci.xff_hops == 0 {
        return peer;
    }
    let mut addrs: Vec<&str> = Vec::new();
    for v in h.get_all(&X_FORWARDED_FOR).iter() {
        if let Ok(s) = v.to_str() {
            addrs.extend(s.split(',').map(str::trim));
        }
    }
    let hops = ci.xff_hops as usize;
    if addrs.len() >= hops {
        if let Ok(ip) = addrs[addrs.len() - hops].parse() {
            return ip;
        }
    }
    peer
}

/// Why a request body is refused before the upstream sees it.
#[derive(Clone, Copy)]
enum BodyRefusal {
    /// Over the route's limit (413).
    TooLarge,
    /// Not readable: the client broke its framing or went away (400).
    Unreadable,
    /// Not received at the route's pace (408).
    TimedOut,
}

impl From<&(dyn std::error::Error + Send + Sync + 'static)> for BodyRefusal {
    fn from(e: &(dyn std::error::Error + Send + Sync + 'static)) -> Self {
        if source_is::<BodyTimedOut>(e) {
            BodyRefusal::TimedOut
        } else {
            BodyRefusal::Unreadable
        }
    }
}

/// moat's reply to a refused request body.
fn refuse_body(
    why: BodyRefusal,
    parts: &http::request::Parts,
    ctx: &RequestCtx,
) -> (Reply, Decision) {
    let (status, title, decision) = match why {
        BodyRefusal::TooLarge => (
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
            Decision::Limit,
        ),
        BodyRefusal::Unreadable => (
            StatusCode::BAD_REQUEST,
            "request body could not be read",
            Decision::Error,
        ),
        BodyRefusal::TimedOut => (
            StatusCode::REQUEST_TIMEOUT,
            "request body not received in time",
            Decision::Error,
        ),
    };
    let page = error_page(status, parts.headers.get(ACCEPT), title, &ctx.request_id);
    (page, decision)
}

/// moat's own error page, format chosen by `Accept`.
pub(crate) fn error_page(
    status: StatusCode,
    accept: Option<&HeaderValue>,
    title: &str,
    request_id: &str,
) -> Reply {
    Reply::page(
        status,
        ReplyFormat::from_accept(accept),
        title,
        request_id,
        None,
    )
}

/// The response for a refusal, naming its event whatever its body: Istio's `RBAC:
/// access denied` and a token's 401 carry none of their own. Out of line: the
/// forwarded request's path does not carry it.
#[cold]
fn refusal_response(reply: Reply, ctx: &RequestCtx) -> ProxyResponse {
    let mut resp = reply_response(reply, &ctx.request_id);
    if let Some(ev) = blocking_event(&ctx.events) {
        if let Ok(id) = HeaderValue::from_str(&ev.id) {
            resp.headers_mut().entry(X_MOAT_EVENT_ID).or_insert(id);
        }
    }
    resp
}

/// The event of the engine that refused the request: the last one that blocked.
pub(crate) fn blocking_event(events: &[SecurityEvent]) -> Option<&SecurityEvent> {
    events.iter().rev().find(|e| e.action == EventAction::Block)
}

/// Turns a [`Reply`] into a response carrying `x-request-id`.
pub(crate) fn reply_response(reply: Reply, request_id: &str) -> ProxyResponse {
    let mut resp = Response::new(ProxyBody::full(reply.body));
    *resp.status_mut() = reply.status;
    let h = resp.headers_mut();
    for (k, v) in reply.headers {
        h.append(k, v);
    }
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert(X_REQUEST_ID.clone(), v);
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2_field_values_are_trimmed_and_the_host_checked() {
        let head = |fields: &[(&str, &str)]| {
            let mut b = http::Request::builder().version(Version::HTTP_2).uri("/");
            for (k, v) in fields {
                b = b.header(*k, *v);
            }
            b.body(()).unwrap().into_parts().0
        };
        let mut p = head(&[
            ("authorization", " Bearer abc\t"),
            ("x-a", "\t \t"),
            ("x-b", "in side"),
            ("host", " a.example:8080 "),
        ]);
        assert_eq!(h2_request_error(&mut p), None);
        assert_eq!(p.headers["authorization"], "Bearer abc");
        assert_eq!(p.headers["x-a"], "");
        assert_eq!(p.headers["x-b"], "in side");
        assert_eq!(request_host(&p), "a.example");
        for hosts in [&["a b"][..], &["a", "b"], &["a/b"], &[""]] {
            let fields: Vec<_> = hosts.iter().map(|h| ("host", *h)).collect();
            let refused = h2_request_error(&mut head(&fields)).map(|(s, _)| s);
            let want = (!hosts[0].is_empty() || hosts.len() > 1).then_some(StatusCode::BAD_REQUEST);
            assert_eq!(refused, want, "{hosts:?}");
        }
    }

    proptest::proptest! {
        /// What the engines read of an HTTP/2 head is what an HTTP/1.1 upstream reads
        /// of the head moat writes (`fuzzing::check_h2_head`, also a fuzz target),
        /// on fields padded, repeated and named as hosts.
        #[test]
        fn an_h2_head_reaches_the_upstream_as_the_engines_read_it(
            authority in proptest::sample::select(vec!["", "a.example", "a.example:8080", "[::1]:1", "a.e:x"]),
            fields in proptest::collection::vec(
                (
                    proptest::sample::select(vec![
                        "host", "cookie", "authorization", "x-a", "x-forwarded-for", "te",
                    ]),
                    "[ \t]{0,2}[a-z.:; ]{0,8}[ \t]{0,2}",
                ),
                0..6,
            ),
        ) {
            let mut input = authority.as_bytes().to_vec();
            for (name, value) in &fields {
                input.push(b'\n');
                input.extend_from_slice(name.as_bytes());
                input.push(b':');
                input.extend_from_slice(value.as_bytes());
            }
            if let Err(e) = crate::fuzzing::check_h2_head(&input) {
                proptest::prop_assert!(false, "{}", e);
            }
        }
    }

    #[test]
    fn a_target_authority_is_one_host_and_a_numeric_port() {
        for (target, refused) in [
            ("/p", false),
            ("http://a.example/p", false),
            ("http://a.example:8080/p", false),
            ("http://a.example:/p", false),
            ("http://[::1]:80/p", false),
            ("http://[::1]/p", false),
            ("http://a.example:x/p", true),
            ("http://a.example:80x/p", true),
            ("http://u@a.example/p", true),
            ("http://u:p@a.example:80/p", true),
        ] {
            let uri: http::Uri = target.parse().unwrap();
            assert_eq!(authority_error(&uri).is_some(), refused, "{target}");
        }
    }

    #[test]
    fn host_port_is_stripped() {
        use moat_core::strip_port;
        assert_eq!(strip_port("a.example:8080"), "a.example");
        assert_eq!(strip_port("a.example"), "a.example");
        assert_eq!(strip_port("[::1]:80"), "[::1]");
        let id = new_request_id();
        assert_eq!(id.len(), 32);
        assert!(id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        assert_ne!(id, new_request_id());
    }
}
