//! moat as the client of external authorizers: the calls of Istio `action: CUSTOM`
//! policies.
//!
//! Access control decides which provider applies (it sets `RequestCtx::ext_authz`);
//! the proxy calls it here, before DENY and ALLOW take effect (Istio's order). A gRPC
//! provider (`envoyExtAuthzGrpc`) gets Envoy's `CheckRequest` (`envoy-types`' message
//! types) as one whole gRPC message over one HTTP/2 connection per provider, made on
//! first use and multiplexed (`grpc`); an HTTP
//! provider (`envoyExtAuthzHttp`) gets the original method
//! and `pathPrefix` + path with the configured headers, through hyper's pooled client.
//! A call that fails or takes longer than `timeout` allows the request when `failOpen`,
//! else is denied with `statusOnError` (default 403).
//!
//! With `includeRequestBodyInCheck` the proxy buffers the body first (up to
//! `maxRequestBytes`) and the call carries it as Envoy's `with_request_body` does: in
//! `body` (text) or `raw_body` (`packAsBytes`) of a gRPC check, as the body of an HTTP
//! check, with `x-envoy-auth-partial-body` saying whether it was cut. The upstream gets
//! the whole body either way. With a `tls` section (a moat extension: Istio takes it
//! from a DestinationRule) the connections use TLS, mutual when a client certificate is
//! given.

mod connector;
mod grpc;

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use connector::Connector;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::CheckResponse;
use grpc::GrpcClient;
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use moat_authz::providers::{parse_status, ExtAuthzHttp, RequestBodyInCheck};
use moat_authz::ExtensionProvider;
use moat_core::{Connection, EventAction, Reply, RequestCtx, SecurityEvent};
use moat_tls::UpstreamConnector;
use prost::Message as _;

use crate::check_request::{CheckOut, HttpOut};

/// Largest denial body taken from an HTTP provider.
const MAX_DENIAL_BODY: usize = 64 << 10;

/// Largest answer taken from a gRPC provider (tonic's default limit for a message).
const MAX_CHECK_RESPONSE: usize = 4 << 20;

/// Tells the provider whether the body it got was cut at `maxRequestBytes` (Envoy's
/// header; OPA's Envoy plugin reads truncation from `content-length` instead).
const PARTIAL_BODY: HeaderName = HeaderName::from_static(PARTIAL_BODY_NAME);
const PARTIAL_BODY_NAME: &str = "x-envoy-auth-partial-body";

/// The configured external authorizers, by name.
#[derive(Default)]
pub struct ExtAuthzClients {
    providers: HashMap<String, Provider>,
}

impl std::fmt::Debug for ExtAuthzClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.providers.keys()).finish()
    }
}

struct Provider {
    timeout: Duration,
    fail_open: bool,
    status_on_error: StatusCode,
    body: Option<RequestBodyInCheck>,
    kind: Kind,
}

/// Boxed: the clients are large, and a provider is looked up by reference.
enum Kind {
    Grpc(Box<GrpcClient>),
    Http(Box<HttpProvider>),
}

struct HttpProvider {
    base: String,
    cfg: ExtAuthzHttp,
    client: Client<Connector, Full<Bytes>>,
}

/// The body sent with a check (`includeRequestBodyInCheck`).
#[derive(Clone, Copy)]
pub struct CheckBody<'a> {
    /// At most `maxRequestBytes` of the body.
    pub data: &'a Bytes,
    /// The body is longer than `data`.
    pub partial: bool,
}

/// What a provider answered.
enum Answer {
    /// Allowed: headers to set on the request forwarded, and to remove from it.
    Allow(Vec<(HeaderName, HeaderValue)>, Vec<HeaderName>),
    /// Denied, with the reply for the client.
    Deny(Reply),
}

impl ExtAuthzClients {
    /// Clients for the configured providers (validated by the authz engine's build);
    /// `base_dir` resolves the paths of their `tls` sections. Fails on a `tls` section
    /// that cannot be loaded.
    pub fn new(providers: &[ExtensionProvider], base_dir: &Path) -> Result<Self, String> {
        let mut out = ExtAuthzClients::default();
        for p in providers {
            let Some(c) = p.common() else { continue };
            let grpc = p.envoy_ext_authz_grpc.is_some();
            let connector = Connector {
                tls: c
                    .tls
                    .map(|t| {
                        let mut t = t.clone();
                        if t.alpn.is_empty() {
                            // gRPC servers (grpc-go among them) insist on ALPN `h2`.
                            t.alpn = vec![if grpc { "h2" } else { "http/1.1" }.into()];
                        }
                        UpstreamConnector::new(&t, base_dir)
                            .map(Arc::new)
                            .map_err(|e| format!("provider `{}`: tls: {e}", p.name))
                    })
                    .transpose()?,
            };
            let authority = authority(c.service, c.port);
            let kind = match &p.envoy_ext_authz_http {
                None => Kind::Grpc(Box::new(
                    GrpcClient::new(connector, c.service, c.port)
                        .map_err(|e| format!("provider `{}`: {e}", p.name))?,
                )),
                Some(h) => {
                    let scheme = if c.tls.is_some() { "https" } else { "http" };
                    Kind::Http(Box::new(HttpProvider {
                        base: format!("{scheme}://{authority}{}", h.path_prefix),
                        cfg: h.clone(),
                        client: Client::builder(TokioExecutor::new()).build(connector),
                    }))
                }
            };
            let status_on_error = c
                .status_on_error
                .and_then(parse_status)
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::FORBIDDEN);
            out.providers.insert(
                p.name.clone(),
                Provider {
                    timeout: c.timeout,
                    fail_open: c.fail_open,
                    status_on_error,
                    body: c.body,
                    kind,
                },
            );
        }
        Ok(out)
    }

    /// The body provider `name` wants with its checks, if any.
    pub fn wants_body(&self, name: &str) -> Option<RequestBodyInCheck> {
        self.providers.get(name).and_then(|p| p.body)
    }

    /// Asks provider `name` about the request (with `body` when it
    /// [wants one](Self::wants_body)). Allowed: its headers are applied to `parts`.
    /// Denied (or failed without `failOpen`): the reply for the client. Either way the
    /// outcome is a security event when it is not a plain allow.
    pub async fn check(
        &self,
        name: &str,
        ctx: &mut RequestCtx,
        parts: &mut http::request::Parts,
        body: Option<CheckBody<'_>>,
    ) -> Result<(), Reply> {
        // Only a non-allow is an event: the rule name is made for one only.
        let rule = || format!("custom:{name}");
        let block = if ctx.monitor_only {
            EventAction::Monitor
        } else {
            EventAction::Block
        };
        let Some(p) = self.providers.get(name) else {
            ctx.events.push(SecurityEvent::new(
                "authz",
                rule(),
                block,
                "unknown extension provider",
            ));
            return if ctx.monitor_only {
                Ok(())
            } else {
                Err(Reply::text(StatusCode::FORBIDDEN, "RBAC: access denied"))
            };
        };
        let t = Instant::now();
        // Boxed: the clients' futures are large, and inline they would be part of every
        // request's future (moved on each spawn), CUSTOM or not.
        let call = Box::pin(p.call(ctx, parts, body));
        let answer = match tokio::time::timeout(p.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", p.timeout)),
        };
        let took = t.elapsed().as_micros() as u64;
        match answer {
            Ok(Answer::Allow(set, remove)) => {
                for h in remove {
                    parts.headers.remove(h);
                }
                for (k, v) in set {
                    parts.headers.insert(k, v);
                }
                Ok(())
            }
            Ok(Answer::Deny(reply)) => {
                ctx.events.push(
                    SecurityEvent::new("authz", rule(), block, "the external authorizer denied")
                        .with_details(serde_json::json!({
                            "status": reply.status.as_u16(), "duration_us": took,
                        })),
                );
                if ctx.monitor_only {
                    Ok(())
                } else {
                    Err(reply)
                }
            }
            Err(e) => {
                let action = if p.fail_open {
                    EventAction::Monitor
                } else {
                    block
                };
                ctx.events.push(
                    SecurityEvent::new(
                        "authz",
                        rule(),
                        action,
                        format!("external authorizer failed: {e}"),
                    )
                    .with_details(serde_json::json!({ "fail_open": p.fail_open })),
                );
                tracing::debug!(provider = name, error = %e, "external authorizer failed");
                if p.fail_open || ctx.monitor_only {
                    Ok(())
                } else {
                    Err(Reply::text(
                        p.status_on_error,
                        "external authorization failed",
                    ))
                }
            }
        }
    }
}

impl ExtAuthzClients {
    /// Asks provider `name` about a TCP connection (Istio's CUSTOM on a TCP workload,
    /// Envoy's network ext_authz filter): a `CheckRequest` with the connection's
    /// attributes only. `Err` holds why the connection is closed: the provider denied,
    /// or failed without `failOpen`, or is an HTTP provider (Istio supports gRPC
    /// providers only on TCP; moat closes rather than skip the check).
    pub async fn check_connection(&self, name: &str, conn: &Connection) -> Result<(), String> {
        let Some(p) = self.providers.get(name) else {
            return Err(format!("unknown extension provider `{name}`"));
        };
        let Kind::Grpc(client) = &p.kind else {
            return Err(format!(
                "extension provider `{name}` is HTTP: only gRPC providers check TCP connections"
            ));
        };
        let req = connection_attributes(conn);
        let call = Box::pin(grpc_check(client, &req));
        let answer = match tokio::time::timeout(p.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(format!("no answer within {:?}", p.timeout)),
        };
        match answer {
            Ok(Answer::Allow(..)) => Ok(()),
            Ok(Answer::Deny(_)) => Err(format!("extension provider `{name}` denied")),
            Err(e) if p.fail_open => {
                tracing::debug!(provider = name, error = %e, "external authorizer failed (failOpen)");
                Ok(())
            }
            Err(e) => Err(format!("extension provider `{name}` failed: {e}")),
        }
    }
}

fn authority(service: &str, port: u16) -> String {
    if service.contains(':') && !service.starts_with('[') {
        format!("[{service}]:{port}")
    } else {
        format!("{service}:{port}")
    }
}

impl Provider {
    async fn call(
        &self,
        ctx: &RequestCtx,
        parts: &http::request::Parts,
        body: Option<CheckBody<'_>>,
    ) -> Result<Answer, String> {
        match &self.kind {
            Kind::Grpc(client) => {
                let pack = self.body.is_some_and(|b| b.pack_as_bytes);
                grpc_check(client, &check_request(ctx, parts, body, pack)).await
            }
            Kind::Http(h) => http_check(&h.client, &h.base, &h.cfg, ctx, parts, body).await,
        }
    }
}

/// Envoy's `CheckRequest` for the request, as Envoy's ext_authz filter fills it: the
/// headers as Envoy's map (a name's values joined with `,`, then the pseudo-headers, and
/// with a body `x-envoy-auth-partial-body`, moat's own and never the client's), the body
/// in `raw_body` when `pack_as_bytes`, else in `body` (as text: Envoy copies the bytes
/// into the string field; moat replaces what is not UTF-8, which protobuf requires of a
/// string, as it does in header values). Borrowed from the request: only a header
/// whose values are joined or not UTF-8 is copied.
fn check_request<'a>(
    ctx: &'a RequestCtx,
    parts: &'a http::request::Parts,
    body: Option<CheckBody<'a>>,
    pack_as_bytes: bool,
) -> CheckOut<'a> {
    let tls = ctx.conn.tls.as_ref();
    let host = parts
        .uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| parts.headers.get(HOST).and_then(|h| h.to_str().ok()))
        .unwrap_or_default();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut headers: Vec<(&str, Cow<'_, str>)> = Vec::with_capacity(parts.headers.len() + 5);
    // The map's iterator gives a name's values one after the other.
    for (name, value) in &parts.headers {
        if body.is_some() && *name == PARTIAL_BODY {
            continue;
        }
        match headers.last_mut() {
            Some((last, joined)) if *last == name.as_str() => {
                let joined = joined.to_mut();
                joined.push(',');
                joined.push_str(&String::from_utf8_lossy(value.as_bytes()));
            }
            _ => headers.push((name.as_str(), String::from_utf8_lossy(value.as_bytes()))),
        }
    }
    headers.push((":authority", Cow::Borrowed(host)));
    headers.push((":method", Cow::Borrowed(parts.method.as_str())));
    headers.push((":path", Cow::Borrowed(path)));
    headers.push((":scheme", Cow::Borrowed(scheme)));
    let (mut text_body, mut raw_body) = (Cow::Borrowed(""), &[][..]);
    if let Some(b) = body {
        let partial = if b.partial { "true" } else { "false" };
        headers.push((PARTIAL_BODY_NAME, Cow::Borrowed(partial)));
        if pack_as_bytes {
            raw_body = &b.data[..];
        } else {
            text_body = String::from_utf8_lossy(b.data);
        }
    }
    let size = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(-1);
    CheckOut {
        http: Some(HttpOut {
            id: &ctx.request_id,
            method: parts.method.as_str(),
            headers,
            path,
            host,
            scheme,
            size,
            protocol: protocol(parts.version),
            body: text_body,
            raw_body,
        }),
        ..connection_attributes(&ctx.conn)
    }
}

/// The protocol as Envoy names it in `AttributeContext.HttpRequest.protocol`.
fn protocol(v: http::Version) -> &'static str {
    match v {
        http::Version::HTTP_09 => "HTTP/0.9",
        http::Version::HTTP_10 => "HTTP/1.0",
        http::Version::HTTP_2 => "HTTP/2",
        http::Version::HTTP_3 => "HTTP/3",
        _ => "HTTP/1.1",
    }
}

/// The attributes Envoy gives of a connection: the source (address, and the SPIFFE
/// URI SAN of a verified client certificate as `principal`), the destination and the
/// SNI. All a TCP check (Envoy's network ext_authz filter) carries.
fn connection_attributes(conn: &Connection) -> CheckOut<'_> {
    let tls = conn.tls.as_ref();
    let principal = tls
        .and_then(|t| t.peer.as_ref())
        .and_then(|p| p.uri_sans.iter().find(|u| u.starts_with("spiffe://")))
        .map_or("", String::as_str);
    CheckOut {
        source: conn.remote_addr,
        principal,
        destination: conn.local_addr,
        sni: tls.and_then(|t| t.sni.as_deref()),
        http: None,
    }
}

/// Calls `Check` on a gRPC provider: the request as one whole message with its
/// length known (not a streaming codec's body, which ends with an empty frame of its
/// own), the answer's one `CheckResponse` mapped to allow or deny.
async fn grpc_check(client: &GrpcClient, req: &CheckOut<'_>) -> Result<Answer, String> {
    let body = client.call(req.grpc_frame()?).await?;
    let resp = check_response(&body)?;
    let ok = resp.status.as_ref().is_none_or(|s| s.code == 0);
    let header = |h: &envoy_types::pb::envoy::config::core::v3::HeaderValueOption| {
        let h = h.header.as_ref()?;
        let v = if h.raw_value.is_empty() {
            HeaderValue::from_str(&h.value).ok()?
        } else {
            HeaderValue::from_bytes(&h.raw_value).ok()?
        };
        Some((HeaderName::from_bytes(h.key.as_bytes()).ok()?, v))
    };
    match resp.http_response {
        Some(HttpResponse::OkResponse(o)) if ok => Ok(Answer::Allow(
            o.headers.iter().filter_map(header).collect(),
            o.headers_to_remove
                .iter()
                .filter_map(|h| HeaderName::from_bytes(h.as_bytes()).ok())
                .collect(),
        )),
        _ if ok => Ok(Answer::Allow(Vec::new(), Vec::new())),
        Some(HttpResponse::DeniedResponse(d)) => {
            let status = d
                .status
                .and_then(|s| u16::try_from(s.code).ok())
                .and_then(|c| StatusCode::from_u16(c).ok())
                .filter(|s| *s != StatusCode::OK)
                .unwrap_or(StatusCode::FORBIDDEN);
            Ok(Answer::Deny(Reply {
                status,
                headers: d.headers.iter().filter_map(header).collect(),
                body: Bytes::from(d.body),
            }))
        }
        _ => Ok(Answer::Deny(Reply::text(
            StatusCode::FORBIDDEN,
            "RBAC: access denied",
        ))),
    }
}

/// Whether `headers` carry a `grpc-status`; `Err` with the status and its message
/// when it is not OK.
fn grpc_status(headers: &HeaderMap) -> Result<bool, String> {
    let Some(code) = headers.get("grpc-status") else {
        return Ok(false);
    };
    if code == "0" {
        return Ok(true);
    }
    let code = code
        .to_str()
        .ok()
        .and_then(|c| c.parse::<i32>().ok())
        .map_or_else(
            || format!("{code:?}"),
            |c| format!("{:?}", tonic::Code::from_i32(c)),
        );
    let message = headers
        .get("grpc-message")
        .map(|m| percent_encoding::percent_decode(m.as_bytes()).decode_utf8_lossy())
        .unwrap_or_default();
    Err(format!("gRPC {code}: {message}"))
}

/// The `CheckResponse` in a gRPC answer's body: exactly one uncompressed message
/// (moat offers no compression, so a compressed one is refused).
pub(crate) fn check_response(body: &[u8]) -> Result<CheckResponse, String> {
    let Some((prefix, rest)) = body.split_first_chunk::<5>() else {
        return Err("gRPC answer without a message".into());
    };
    let [flag, a, b, c, d] = *prefix;
    if flag != 0 {
        return Err(format!(
            "gRPC answer: message flag {flag} (compression was not offered)"
        ));
    }
    let len = u32::from_be_bytes([a, b, c, d]) as usize;
    if rest.len() != len {
        return Err(format!(
            "gRPC answer: a message of {len} bytes declared, {} received",
            rest.len()
        ));
    }
    CheckResponse::decode(rest).map_err(|e| format!("CheckResponse: {e}"))
}

async fn http_check(
    client: &Client<Connector, Full<Bytes>>,
    base: &str,
    cfg: &ExtAuthzHttp,
    ctx: &RequestCtx,
    parts: &http::request::Parts,
    body: Option<CheckBody<'_>>,
) -> Result<Answer, String> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let data = body.map_or_else(Bytes::new, |b| b.data.clone());
    let length = HeaderValue::from(data.len());
    let mut req = http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{base}{path}"))
        .body(Full::new(data))
        .map_err(|e| format!("check request: {e}"))?;
    let h = req.headers_mut();
    if let Some(host) = parts.headers.get(HOST) {
        h.insert(HOST, host.clone());
    }
    for name in &cfg.include_request_headers_in_check {
        for v in parts.headers.get_all(name.as_str()) {
            if let Ok(n) = HeaderName::from_bytes(name.as_bytes()) {
                h.append(n, v.clone());
            }
        }
    }
    for (k, v) in &cfg.include_additional_headers_in_check {
        if let (Ok(k), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            h.insert(k, v);
        }
    }
    h.insert(CONTENT_LENGTH, length);
    if let Some(b) = body {
        h.insert(
            PARTIAL_BODY,
            HeaderValue::from_static(if b.partial { "true" } else { "false" }),
        );
    }
    if let Ok(id) = HeaderValue::from_str(&ctx.request_id) {
        h.insert(HeaderName::from_static("x-request-id"), id);
    }
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    let (rparts, body) = resp.into_parts();
    let pick =
        |names: &[String], all: bool, headers: &HeaderMap| -> Vec<(HeaderName, HeaderValue)> {
            headers
                .iter()
                .filter(|(k, _)| {
                    (all && *k != CONTENT_LENGTH)
                        || names.iter().any(|n| n.eq_ignore_ascii_case(k.as_str()))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
    if rparts.status.is_success() {
        return Ok(Answer::Allow(
            pick(&cfg.headers_to_upstream_on_allow, false, &rparts.headers),
            Vec::new(),
        ));
    }
    let body = Limited::new(body, MAX_DENIAL_BODY)
        .collect()
        .await
        .map_err(|e| format!("denial body: {e}"))?
        .to_bytes();
    Ok(Answer::Deny(Reply {
        status: rparts.status,
        headers: pick(
            &cfg.headers_to_downstream_on_deny,
            cfg.headers_to_downstream_on_deny.is_empty(),
            &rparts.headers,
        ),
        body,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::auth::v3 as envoy;
    use envoy_types::pb::envoy::service::auth::v3::DeniedHttpResponse;

    fn framed(flag: u8, msg: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        out.extend_from_slice(msg);
        out
    }

    /// The `CheckRequest` a gateway request becomes, as a provider decodes it (with
    /// `envoy-types`' own message types): Envoy's header map (repeated names joined with
    /// `,`, values made UTF-8, pseudo-headers added, the partial-body flag moat's own),
    /// the request line, the body as text or bytes, and the connection's addresses.
    #[test]
    fn a_request_becomes_the_check_request_envoy_sends() {
        use envoy_types::pb::envoy::config::core::v3::address;
        use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
        let ctx = RequestCtx::for_test("r");
        let (mut parts, ()) = http::Request::builder()
            .method("POST")
            .uri("/items?id=1")
            .header(HOST, "shop.example")
            .header("accept", "text/html")
            .header("accept", "x/y")
            .header("x-bin", HeaderValue::from_bytes(b"a\xffb").unwrap())
            .header(PARTIAL_BODY, "true")
            .header(CONTENT_LENGTH, "9")
            .body(())
            .unwrap()
            .into_parts();
        parts.version = http::Version::HTTP_11;
        let data = Bytes::from_static(b"body\xff1234");
        let body = CheckBody {
            data: &data,
            partial: false,
        };
        for pack in [false, true] {
            let wire = check_request(&ctx, &parts, Some(body), pack)
                .grpc_frame()
                .unwrap();
            let req = envoy::CheckRequest::decode(&wire[5..]).unwrap();
            let a = req.attributes.unwrap();
            let addr = |p: Option<envoy::attribute_context::Peer>| match p
                .unwrap()
                .address
                .unwrap()
                .address
                .unwrap()
            {
                address::Address::SocketAddress(s) => (s.address, s.port_specifier),
                other => panic!("{other:?}"),
            };
            assert_eq!(
                addr(a.source),
                ("127.0.0.1".into(), Some(PortSpecifier::PortValue(40000)))
            );
            assert_eq!(
                addr(a.destination),
                ("127.0.0.1".into(), Some(PortSpecifier::PortValue(8080)))
            );
            let h = a.request.unwrap().http.unwrap();
            assert_eq!(h.id, "test");
            assert_eq!(h.method, "POST");
            assert_eq!(h.path, "/items?id=1");
            assert_eq!(h.host, "shop.example");
            assert_eq!(h.scheme, "http");
            assert_eq!(h.protocol, "HTTP/1.1");
            assert_eq!(h.size, 9);
            let mut headers: Vec<(&str, &str)> = h
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            headers.sort();
            assert_eq!(
                headers,
                [
                    (":authority", "shop.example"),
                    (":method", "POST"),
                    (":path", "/items?id=1"),
                    (":scheme", "http"),
                    ("accept", "text/html,x/y"),
                    ("content-length", "9"),
                    ("host", "shop.example"),
                    ("x-bin", "a\u{fffd}b"),
                    // moat's own flag, not the client's.
                    ("x-envoy-auth-partial-body", "false"),
                ]
            );
            if pack {
                assert_eq!(h.raw_body, b"body\xff1234");
                assert!(h.body.is_empty());
            } else {
                assert_eq!(h.body, "body\u{fffd}1234");
                assert!(h.raw_body.is_empty());
            }
        }
    }

    #[test]
    fn answers_are_one_uncompressed_message() {
        let deny = CheckResponse {
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                body: "no".into(),
                ..DeniedHttpResponse::default()
            })),
            ..CheckResponse::default()
        };
        let msg = deny.encode_to_vec();
        assert_eq!(check_response(&framed(0, &msg)).unwrap(), deny);
        // The empty message: an allow with every field defaulted.
        assert_eq!(
            check_response(&framed(0, &[])).unwrap(),
            CheckResponse::default()
        );
        for bad in [
            Vec::new(),                                  // no message
            vec![0, 0, 0],                               // a cut prefix
            framed(1, &msg),                             // compressed: not offered
            framed(0, &msg)[..msg.len()].to_vec(),       // cut short
            [framed(0, &msg), framed(0, &msg)].concat(), // two messages
            framed(0, &[0xff, 0xff]),                    // not protobuf
        ] {
            assert!(check_response(&bad).is_err(), "{bad:?}");
            crate::fuzzing::check_response_parse(&bad).unwrap();
        }
        crate::fuzzing::check_response_parse(&framed(0, &msg)).unwrap();
    }

    #[test]
    fn a_grpc_status_other_than_ok_is_an_error_with_its_message() {
        let mut h = HeaderMap::new();
        assert_eq!(grpc_status(&h), Ok(false));
        h.insert("grpc-status", HeaderValue::from_static("0"));
        assert_eq!(grpc_status(&h), Ok(true));
        h.insert("grpc-status", HeaderValue::from_static("14"));
        h.insert(
            "grpc-message",
            HeaderValue::from_static("connection%20refused"),
        );
        assert_eq!(
            grpc_status(&h),
            Err("gRPC Unavailable: connection refused".into())
        );
        h.insert("grpc-status", HeaderValue::from_static("x"));
        assert!(grpc_status(&h).unwrap_err().starts_with("gRPC \"x\""));
    }
}
