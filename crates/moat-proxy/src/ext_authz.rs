//! moat as the client of external authorizers: the calls of Istio `action: CUSTOM`
//! policies.
//!
//! Access control decides which provider applies (it sets `RequestCtx::ext_authz`);
//! the proxy calls it here, before DENY and ALLOW take effect (Istio's order). A gRPC
//! provider (`envoyExtAuthzGrpc`) gets Envoy's `CheckRequest` through the client
//! `envoy-types` generates for tonic (one HTTP/2 connection per provider, made on first
//! use and multiplexed); an HTTP provider (`envoyExtAuthzHttp`) gets the original method
//! and `pathPrefix` + path with the configured headers, through hyper's pooled client.
//! A call that fails or takes longer than `timeout` allows the request when `failOpen`,
//! else is denied with `statusOnError` (default 403). Request bodies are not sent
//! (`includeRequestBodyInCheck` is refused when the config is loaded).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{address, socket_address, Address, SocketAddress};
use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
    HttpRequest, Peer, Request as AttrRequest, TlsSession,
};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest};
use http::header::{HeaderName, HeaderValue, CONTENT_LENGTH, HOST};
use http::{HeaderMap, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use moat_authz::providers::{parse_status, ExtAuthzHttp};
use moat_authz::ExtensionProvider;
use moat_core::{EventAction, Reply, RequestCtx, SecurityEvent};
use tonic::transport::Channel;

/// Largest denial body taken from an HTTP provider.
const MAX_DENIAL_BODY: usize = 64 << 10;

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
    kind: Kind,
}

enum Kind {
    Grpc {
        uri: String,
        /// Made on first use: a tonic channel needs the runtime.
        client: OnceLock<Result<AuthorizationClient<Channel>, String>>,
    },
    /// Boxed: the pooled client is large, and a provider is looked up by reference.
    Http(Box<HttpProvider>),
}

struct HttpProvider {
    base: String,
    cfg: ExtAuthzHttp,
    client: Client<HttpConnector, Full<Bytes>>,
}

/// What a provider answered.
enum Answer {
    /// Allowed: headers to set on the request forwarded, and to remove from it.
    Allow(Vec<(HeaderName, HeaderValue)>, Vec<HeaderName>),
    /// Denied, with the reply for the client.
    Deny(Reply),
}

impl ExtAuthzClients {
    /// Clients for the configured providers (validated by the authz engine's build).
    pub fn new(providers: &[ExtensionProvider]) -> Self {
        let mut out = ExtAuthzClients::default();
        for p in providers {
            let (timeout, fail_open, status, kind) =
                match (&p.envoy_ext_authz_grpc, &p.envoy_ext_authz_http) {
                    (Some(g), _) => (
                        g.timeout,
                        g.fail_open,
                        &g.status_on_error,
                        Kind::Grpc {
                            uri: format!("http://{}", authority(&g.service, g.port)),
                            client: OnceLock::new(),
                        },
                    ),
                    (None, Some(h)) => (
                        h.timeout,
                        h.fail_open,
                        &h.status_on_error,
                        Kind::Http(Box::new(HttpProvider {
                            base: format!(
                                "http://{}{}",
                                authority(&h.service, h.port),
                                h.path_prefix
                            ),
                            cfg: h.clone(),
                            client: Client::builder(TokioExecutor::new()).build_http(),
                        })),
                    ),
                    (None, None) => continue,
                };
            let status_on_error = status
                .as_deref()
                .and_then(parse_status)
                .and_then(|c| StatusCode::from_u16(c).ok())
                .unwrap_or(StatusCode::FORBIDDEN);
            out.providers.insert(
                p.name.clone(),
                Provider {
                    timeout,
                    fail_open,
                    status_on_error,
                    kind,
                },
            );
        }
        out
    }

    /// Asks provider `name` about the request. Allowed: its headers are applied to
    /// `parts`. Denied (or failed without `failOpen`): the reply for the client. Either
    /// way the outcome is a security event when it is not a plain allow.
    pub async fn check(
        &self,
        name: &str,
        ctx: &mut RequestCtx,
        parts: &mut http::request::Parts,
    ) -> Result<(), Reply> {
        let rule = format!("custom:{name}");
        let block = if ctx.monitor_only {
            EventAction::Monitor
        } else {
            EventAction::Block
        };
        let Some(p) = self.providers.get(name) else {
            ctx.events.push(SecurityEvent::new(
                "authz",
                rule,
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
        let answer = match tokio::time::timeout(p.timeout, p.call(ctx, parts)).await {
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
                    SecurityEvent::new("authz", rule, block, "the external authorizer denied")
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
                        rule,
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

fn authority(service: &str, port: u16) -> String {
    if service.contains(':') && !service.starts_with('[') {
        format!("[{service}]:{port}")
    } else {
        format!("{service}:{port}")
    }
}

impl Provider {
    async fn call(&self, ctx: &RequestCtx, parts: &http::request::Parts) -> Result<Answer, String> {
        match &self.kind {
            Kind::Grpc { uri, client } => {
                let client = client
                    .get_or_init(|| {
                        Channel::from_shared(uri.clone())
                            .map(|c| AuthorizationClient::new(c.connect_lazy()))
                            .map_err(|e| e.to_string())
                    })
                    .clone()?;
                grpc_check(client, ctx, parts).await
            }
            Kind::Http(h) => http_check(&h.client, &h.base, &h.cfg, ctx, parts).await,
        }
    }
}

fn socket(addr: std::net::SocketAddr) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: addr.ip().to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(
                addr.port(),
            ))),
            ..SocketAddress::default()
        })),
    }
}

/// Envoy's `CheckRequest` for the request, as Envoy's ext_authz filter fills it.
fn check_request(ctx: &RequestCtx, parts: &http::request::Parts) -> CheckRequest {
    let tls = ctx.conn.tls.as_ref();
    let principal = tls
        .and_then(|t| t.peer.as_ref())
        .and_then(|p| p.uri_sans.iter().find(|u| u.starts_with("spiffe://")))
        .cloned()
        .unwrap_or_default();
    let mut headers: HashMap<String, String> = HashMap::new();
    for (k, v) in &parts.headers {
        let v = String::from_utf8_lossy(v.as_bytes());
        headers
            .entry(k.as_str().to_owned())
            .and_modify(|e| {
                e.push(',');
                e.push_str(&v);
            })
            .or_insert_with(|| v.into_owned());
    }
    let host = parts
        .uri
        .authority()
        .map(|a| a.as_str())
        .or_else(|| parts.headers.get(HOST).and_then(|h| h.to_str().ok()))
        .unwrap_or_default()
        .to_owned();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let scheme = if tls.is_some() { "https" } else { "http" };
    headers.insert(":authority".into(), host.clone());
    headers.insert(":method".into(), parts.method.as_str().into());
    headers.insert(":path".into(), path.clone());
    headers.insert(":scheme".into(), scheme.into());
    CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(Peer {
                address: Some(socket(ctx.conn.remote_addr)),
                principal,
                ..Peer::default()
            }),
            destination: Some(Peer {
                address: Some(socket(ctx.conn.local_addr)),
                ..Peer::default()
            }),
            request: Some(AttrRequest {
                http: Some(HttpRequest {
                    id: ctx.request_id.clone(),
                    method: parts.method.as_str().into(),
                    headers,
                    path,
                    host,
                    scheme: scheme.into(),
                    protocol: format!("{:?}", parts.version),
                    ..HttpRequest::default()
                }),
                ..AttrRequest::default()
            }),
            tls_session: tls
                .and_then(|t| t.sni.clone())
                .map(|sni| TlsSession { sni }),
            ..AttributeContext::default()
        }),
    }
}

async fn grpc_check(
    mut client: AuthorizationClient<Channel>,
    ctx: &RequestCtx,
    parts: &http::request::Parts,
) -> Result<Answer, String> {
    let resp = client
        .check(check_request(ctx, parts))
        .await
        .map_err(|s| format!("gRPC {:?}: {}", s.code(), s.message()))?
        .into_inner();
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

async fn http_check(
    client: &Client<HttpConnector, Full<Bytes>>,
    base: &str,
    cfg: &ExtAuthzHttp,
    ctx: &RequestCtx,
    parts: &http::request::Parts,
) -> Result<Answer, String> {
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut req = http::Request::builder()
        .method(parts.method.clone())
        .uri(format!("{base}{path}"))
        .body(Full::new(Bytes::new()))
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
    h.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
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
