//! Decision listeners (`protocol: decision`): moat as the authorization service of a
//! proxy it does not replace.
//!
//! Three front doors lead to one decision ([`decide`]):
//! * `grpc`: Envoy's ext_authz gRPC service, `envoy.service.auth.v3.Authorization/Check`
//!   (Envoy itself, Istio's `envoyExtAuthzGrpc` providers);
//! * `http`: Envoy's HTTP ext_authz service mode (the original request's method, path
//!   and headers) and forward-auth (nginx `auth_request`, Traefik ForwardAuth, Caddy
//!   `forward_auth`: the original method, URI, host and client in `X-Original-*` /
//!   `X-Forwarded-*` headers, believed from `trusted_proxies` only);
//! * `serve`: one listener speaks both, HTTP/1.1 and HTTP/2 (gRPC) on the same port.
//!
//! Each front door turns what it receives into a [`Check`]: the request model the proxy
//! builds for a request it carries itself (`http::request::Parts`, a `RequestCtx` with
//! the source as the connection's peer, its certificate as the peer identity), and
//! [`decide`] runs the pipeline's request phases on it through the functions the proxy
//! uses ([`run_phase`], [`phase_body`]), then records events, the access record and the
//! metrics as for a proxied request. The proxy that asked (the caller) is named in the
//! access record's `upstream` field as `caller`.

mod grpc;
mod http_check;
mod serve;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCEPT, USER_AGENT};
use http::StatusCode;
use moat_core::{Connection, Reply, RequestCtx};

use crate::events::AccessInfo;
use crate::metrics::{Decision, Phase};
use crate::proxy::{
    blocking_event, custom_with_body, error_page, phase_body, request_headers_phase, request_host,
    request_id, run_phase, X_MOAT_EVENT_ID,
};
use crate::state::{DecisionRt, Shared, Snapshot};

pub(crate) use serve::serve;

/// The network-facing parsers, for the fuzz targets (see [`crate::fuzzing`]).
pub(crate) mod parsers {
    pub(crate) use super::grpc::to_check;
    pub(crate) use super::http_check::{forwarded_client, original_request};
    pub(crate) use crate::check_request::CheckRequest;
}

/// One authorization question, whichever front door it came through.
pub(crate) struct Check {
    /// The original request's head: method, path and query, headers (with `host`).
    pub(crate) parts: http::request::Parts,
    /// The original request's body, when the caller sent it.
    pub(crate) body: Option<Bytes>,
    /// The original connection: `remote_addr` is the downstream client as the caller
    /// saw it (its TCP peer), `local_addr` the destination, `tls` its certificate.
    pub(crate) conn: Arc<Connection>,
    /// The original client (`remote.ip`): the source, or what a trusted caller said.
    pub(crate) client_ip: IpAddr,
    /// The proxy that asked.
    pub(crate) caller: SocketAddr,
    /// Whether the caller removes the fields the answer names before it forwards the
    /// request (Envoy does; forward-auth proxies have no such list).
    pub(crate) removes_fields: bool,
}

/// What [`decide`] answers.
pub(crate) struct Decided {
    /// The status of the denial; `None` allows.
    pub(crate) denied: Option<Reply>,
    /// Allowed: headers the caller adds to the request it forwards (what the phases
    /// added or changed, e.g. JWT claims copied by `outputClaimToHeaders`, and
    /// `x-moat-event-id` when an engine reported without blocking). Denied: headers of
    /// the denial (`x-moat-event-id` among them).
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    /// Allowed: headers the phases removed (e.g. a verified JWT not forwarded).
    pub(crate) removed: Vec<HeaderName>,
}

/// Runs the request phases on `check` and records the outcome.
pub(crate) async fn decide(
    shared: &Arc<Shared>,
    snap: &Snapshot,
    rt: &DecisionRt,
    check: Check,
) -> Decided {
    let start = Instant::now();
    let Check {
        mut parts,
        body,
        conn,
        client_ip,
        caller,
        removes_fields,
    } = check;
    let mut ctx = RequestCtx {
        request_id: request_id(&parts.headers),
        route: rt.name.clone(),
        labels: rt.labels.clone(),
        namespace: rt.namespace.clone(),
        conn,
        client_ip,
        auth: None,
        events: Vec::new(),
        monitor_only: rt.monitor_only,
        ext_authz: None,
        forward_path: None,
        slots: Default::default(),
    };
    let original = parts.headers.clone();
    let outcome = run_phases(
        shared,
        snap,
        rt,
        &mut ctx,
        &mut parts,
        body.as_ref(),
        removes_fields,
    )
    .await;
    let event_id = blocking_event(&ctx.events)
        .or_else(|| ctx.events.last())
        .and_then(|e| HeaderValue::from_str(&e.id).ok());
    let (decided, decision) = match outcome {
        Ok(()) => {
            let mut headers = added_headers(&original, &parts.headers);
            if !removes_fields {
                token_fields_as_forwarded(snap, &parts.headers, &mut headers);
            }
            headers.extend(event_id.map(|id| (X_MOAT_EVENT_ID, id)));
            let removed = original
                .keys()
                .filter(|k| !parts.headers.contains_key(*k))
                .cloned()
                .collect();
            let d = Decided {
                denied: None,
                headers,
                removed,
            };
            (d, Decision::Allow)
        }
        Err((mut reply, decision)) => {
            if let Some(id) = event_id {
                reply.headers.push((X_MOAT_EVENT_ID, id));
            }
            let headers = std::mem::take(&mut reply.headers);
            let d = Decided {
                denied: Some(reply),
                headers,
                removed: Vec::new(),
            };
            (d, decision)
        }
    };
    let status = decided.denied.as_ref().map_or(200, |r| r.status.as_u16());
    rt.metrics.record(decision, status);
    rt.metrics.duration.observe(start.elapsed());
    for ev in &ctx.events {
        shared.metrics.count_security_event(
            &ctx.route,
            ev.engine,
            &ev.rule,
            moat_events::record::action_name(ev.action),
        );
    }
    record(shared, &ctx, &parts, caller, status, decision, start, &body);
    decided
}

/// moat's own refusal of a check, before any phase ran: its error page.
fn refuse(
    parts: &http::request::Parts,
    ctx: &RequestCtx,
    status: StatusCode,
    title: &str,
    decision: Decision,
) -> Result<(), (Reply, Decision)> {
    let page = error_page(status, parts.headers.get(ACCEPT), title, &ctx.request_id);
    Err((page, decision))
}

/// The request head and body phases; the first refusal ends them.
async fn run_phases(
    shared: &Shared,
    snap: &Snapshot,
    rt: &DecisionRt,
    ctx: &mut RequestCtx,
    parts: &mut http::request::Parts,
    body: Option<&Bytes>,
    removes_fields: bool,
) -> Result<(), (Reply, Decision)> {
    if parts.headers.len() > snap.max_headers {
        let title = "request header fields too large";
        let status = StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE;
        return refuse(parts, ctx, status, title, Decision::Limit);
    }
    if body.is_some_and(|b| b.len() as u64 > rt.max_body) {
        let title = "request body too large";
        return refuse(
            parts,
            ctx,
            StatusCode::PAYLOAD_TOO_LARGE,
            title,
            Decision::Limit,
        );
    }
    // Removed here, after the caller's fields were copied: the answer tells the proxy
    // to remove them too (`headers_to_remove`). A caller that cannot would forward a
    // twin to a CGI-style backend as the field the phases decided on: refused instead,
    // as the proxy's `headers_with_underscores: reject` refuses such fields.
    if snap.cgi_twins.remove_from(&mut parts.headers) > 0 && !removes_fields {
        let title = "header field name with an underscore";
        return refuse(parts, ctx, StatusCode::BAD_REQUEST, title, Decision::Error);
    }
    let pipeline = &snap.pipeline;
    let headers = request_headers_phase(&shared.metrics, &mut None, pipeline, ctx, parts).await;
    if ctx.ext_authz.is_some() {
        // A CUSTOM provider that wants the body: the whole body is here.
        let empty = Bytes::new();
        custom_with_body(pipeline, ctx, parts, body.unwrap_or(&empty), false).await?;
    }
    headers?;
    let Some(body) = body.filter(|b| !b.is_empty()) else {
        return Ok(());
    };
    if pipeline.request_body.is_empty() {
        return Ok(());
    }
    let mut b = phase_body(body.clone(), false, &parts.headers);
    run_phase(
        &shared.metrics,
        &mut None,
        Phase::RequestBody,
        &pipeline.request_body,
        |p| p.on_request_body(ctx, parts, &mut b),
    )?;
    // A CUSTOM rule a `_method` field of the body matched (access control's body phase).
    if ctx.ext_authz.is_some() {
        custom_with_body(pipeline, ctx, parts, body, false).await?;
    }
    Ok(())
}

/// For a caller that cannot remove fields (forward-auth): the fields verified tokens are
/// read from and written to, each with the values the upstream is to receive, absent
/// when it is to receive none (a token `forwardOriginalToken` does not forward, a claim
/// header a client sent without a token). nginx (`auth_request_set` and
/// `proxy_set_header`), Traefik (`authResponseHeaders`) and Caddy (`copy_headers`) set
/// a field they are told to copy from the answer, and remove it when the answer has
/// none. `headers` already holds the fields the phases added or changed.
fn token_fields_as_forwarded(
    snap: &Snapshot,
    after: &http::HeaderMap,
    headers: &mut Vec<(HeaderName, HeaderValue)>,
) {
    let Some(authz) = &snap.pipeline.engines.authz else {
        return;
    };
    for name in authz.token_fields() {
        // Already answered: changed by the phases, or named by two providers.
        if headers.iter().any(|(k, _)| k == name) {
            continue;
        }
        headers.extend(
            after
                .get_all(name)
                .iter()
                .map(|v| (name.clone(), v.clone())),
        );
    }
}

/// Headers in `after` that `before` did not have with that value.
fn added_headers(
    before: &http::HeaderMap,
    after: &http::HeaderMap,
) -> Vec<(HeaderName, HeaderValue)> {
    after
        .iter()
        .filter(|(k, v)| !before.get_all(*k).iter().any(|b| b == *v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Security events and the access record, as the proxy writes them for a request.
#[allow(clippy::too_many_arguments)]
fn record(
    shared: &Shared,
    ctx: &RequestCtx,
    parts: &http::request::Parts,
    caller: SocketAddr,
    status: u16,
    decision: Decision,
    start: Instant,
    body: &Option<Bytes>,
) {
    let Some(sink) = shared.events.as_ref() else {
        return;
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let dropped = ctx
        .events
        .iter()
        .filter(|ev| !sink.security(ctx, ev, &parts.method, path))
        .count();
    let caller = caller.to_string();
    let info = AccessInfo {
        ctx,
        method: &parts.method,
        host: request_host(parts),
        path,
        user_agent: parts.headers.get(USER_AGENT).and_then(|v| v.to_str().ok()),
        status,
        decision,
        upstream: Some(("caller", &caller)),
        duration_us: start.elapsed().as_micros() as u64,
        bytes_in: body.as_ref().map_or(0, |b| b.len() as u64),
        bytes_out: 0,
    };
    let dropped = dropped + usize::from(!sink.access(&info));
    shared.metrics.count_dropped_events(dropped as u64);
}
