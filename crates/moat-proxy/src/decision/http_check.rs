//! HTTP decisions: Envoy's HTTP ext_authz service mode and forward-auth.
//!
//! * Envoy (HTTP service mode) sends the original request's method, path, headers and,
//!   with `with_request_body`, its body: the request moat receives is the request to
//!   decide. A 200 allows (Envoy copies `allowed_upstream_headers` from it); anything
//!   else is the denial Envoy sends to the client.
//! * nginx `auth_request`, Traefik ForwardAuth and Caddy `forward_auth` send a
//!   subrequest that carries the original request in headers: `X-Original-Method`,
//!   `X-Original-URI`, `X-Original-Host` (nginx, by convention of its configs) or
//!   `X-Forwarded-Method`, `X-Forwarded-Uri`, `X-Forwarded-Host` (Traefik, Caddy), and
//!   the client in `X-Forwarded-For` (its last element, the address the proxy saw). These
//!   are believed only from `trusted_proxies`; from any other peer they are ignored
//!   and the request is decided as sent. A forward-auth denial is always 403 (nginx
//!   turns any status but 401 and 403 into a 500): the engine's own status is in
//!   `x-moat-status`, the event id in `x-moat-event-id`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use moat_core::{Connection, Reply};

use super::{decide, Check};
use crate::proxy::{error_page, request_id};
use crate::state::{DecisionRt, Shared};

/// A body not received within this long is refused (408).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

const X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
const X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
const X_ORIGINAL_HOST: HeaderName = HeaderName::from_static("x-original-host");
const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// Envoy's HTTP service mode: the fields the proxy is to remove from the request, as a
/// list (the gRPC answer's `headers_to_remove`).
const X_ENVOY_AUTH_HEADERS_TO_REMOVE: HeaderName =
    HeaderName::from_static("x-envoy-auth-headers-to-remove");
const X_MOAT_STATUS: HeaderName = HeaderName::from_static("x-moat-status");

/// Answers one HTTP decision request.
pub(crate) async fn handle<B>(
    shared: &Arc<Shared>,
    listener: &str,
    peer: SocketAddr,
    local: SocketAddr,
    req: http::Request<B>,
) -> Response<Full<Bytes>>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let snap = shared.snapshot.load();
    let Some(rt) = snap.decision_listener(listener) else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "listener removed by a reload",
        );
    };
    let (mut parts, body) = req.into_parts();
    let trusted = rt.trusted_proxies.iter().any(|n| n.contains(&peer.ip()));
    let forward_auth = trusted && original_request(&mut parts);
    let has_body = parts
        .headers
        .get(CONTENT_LENGTH)
        .is_none_or(|v| v.as_bytes() != b"0");
    let body = if forward_auth || !has_body {
        None
    } else {
        match read_body(rt, body).await {
            Ok(b) => Some(b).filter(|b| !b.is_empty()),
            Err(status) => {
                let title = match status {
                    StatusCode::PAYLOAD_TOO_LARGE => "request body too large",
                    StatusCode::REQUEST_TIMEOUT => "request body not received in time",
                    _ => "request body could not be read",
                };
                let rid = request_id(&parts.headers);
                let page = error_page(status, parts.headers.get(http::header::ACCEPT), title, &rid);
                return reply(page, Vec::new());
            }
        }
    };
    let client_ip = if trusted {
        forwarded_client(&parts.headers).unwrap_or(peer.ip())
    } else {
        peer.ip()
    };
    // The caller's connection is the original one as far as moat can know: a trusted
    // proxy's client is the source; otherwise the caller itself is.
    let conn = Arc::new(Connection {
        remote_addr: SocketAddr::new(client_ip, if trusted { 0 } else { peer.port() }),
        local_addr: local,
        tls: None,
    });
    let check = Check {
        parts,
        body,
        conn,
        client_ip,
        caller: peer,
        removes_fields: !forward_auth,
    };
    let decided = decide(shared, &snap, rt, check).await;
    match decided.denied {
        None => {
            let mut resp = Response::new(Full::new(Bytes::new()));
            for (k, v) in decided.headers {
                resp.headers_mut().append(k, v);
            }
            // Forward-auth proxies (nginx, Traefik, Caddy) have no such list.
            if !forward_auth && !decided.removed.is_empty() {
                let names = decided.removed.iter().map(|h| h.as_str());
                let list = names.collect::<Vec<_>>().join(", ");
                if let Ok(v) = HeaderValue::from_str(&list) {
                    resp.headers_mut().insert(X_ENVOY_AUTH_HEADERS_TO_REMOVE, v);
                }
            }
            resp
        }
        Some(mut page) => {
            let mut headers = decided.headers;
            if forward_auth && page.status != StatusCode::FORBIDDEN {
                headers.push((X_MOAT_STATUS, HeaderValue::from(page.status.as_u16())));
                page.status = StatusCode::FORBIDDEN;
            }
            reply(page, headers)
        }
    }
}

/// Rewrites `parts` into the original request a forward-auth subrequest describes;
/// false when it describes none (Envoy's HTTP mode sends the request itself).
pub(crate) fn original_request(parts: &mut http::request::Parts) -> bool {
    let h = &mut parts.headers;
    let uri = take(h, &X_ORIGINAL_URI).or_else(|| take(h, &X_FORWARDED_URI));
    let method = take(h, &X_ORIGINAL_METHOD).or_else(|| take(h, &X_FORWARDED_METHOD));
    let host = take(h, &X_ORIGINAL_HOST).or_else(|| take(h, &X_FORWARDED_HOST));
    h.remove(&X_FORWARDED_PROTO);
    let Some(uri) = uri.and_then(|u| http::Uri::try_from(u.as_bytes()).ok()) else {
        return false;
    };
    // Only the path and query: an absolute URI's authority would be a second host.
    parts.uri = uri
        .path_and_query()
        .and_then(|pq| http::Uri::try_from(pq.as_str()).ok())
        .unwrap_or_else(|| http::Uri::from_static("/"));
    if let Some(m) = method.and_then(|m| http::Method::from_bytes(m.as_bytes()).ok()) {
        parts.method = m;
    }
    if let Some(host) = host {
        parts.headers.insert(HOST, host);
    }
    // The subrequest's framing is not the original request's.
    parts.headers.remove(CONTENT_LENGTH);
    true
}

fn take(h: &mut http::HeaderMap, name: &HeaderName) -> Option<HeaderValue> {
    h.remove(name).filter(|v| !v.is_empty())
}

/// The last `X-Forwarded-For` element: the client as the trusted proxy saw it.
pub(crate) fn forwarded_client(h: &http::HeaderMap) -> Option<IpAddr> {
    let last = h.get_all(&X_FORWARDED_FOR).iter().next_back()?;
    last.to_str().ok()?.rsplit(',').next()?.trim().parse().ok()
}

/// Reads the body up to the listener's limit (413 past it, 408 when it is too slow).
async fn read_body<B>(rt: &DecisionRt, body: B) -> Result<Bytes, StatusCode>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let limit = usize::try_from(rt.max_body).unwrap_or(usize::MAX);
    match tokio::time::timeout(BODY_TIMEOUT, Limited::new(body, limit).collect()).await {
        Err(_) => Err(StatusCode::REQUEST_TIMEOUT),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            Err(StatusCode::PAYLOAD_TOO_LARGE)
        }
        Ok(Err(_)) => Err(StatusCode::BAD_REQUEST),
        Ok(Ok(c)) => Ok(c.to_bytes()),
    }
}

fn reply(page: Reply, headers: Vec<(HeaderName, HeaderValue)>) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(page.body));
    *resp.status_mut() = page.status;
    for (k, v) in page.headers.into_iter().chain(headers) {
        resp.headers_mut().append(k, v);
    }
    resp
}

fn plain(status: StatusCode, msg: &'static str) -> Response<Full<Bytes>> {
    reply(Reply::text(status, msg), Vec::new())
}
