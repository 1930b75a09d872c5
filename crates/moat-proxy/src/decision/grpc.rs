//! Envoy's ext_authz gRPC service (`envoy.service.auth.v3.Authorization/Check`): the
//! request decoded as moat's view of Envoy's `CheckRequest` (`crate::check_request`),
//! the answer encoded as `envoy-types`' `CheckResponse`, served by tonic's unary server.
//!
//! What moat reads from the `CheckRequest`'s attributes:
//! * `request.http`: method, path and query (`path`), host, headers (`header_map` when
//!   Envoy sends raw values, else `headers`; pseudo-headers are dropped), and the body
//!   (`raw_body`, else `body`) when Envoy's `with_request_body` sent it;
//! * `source.address`: the downstream client (the connection's peer, Istio's
//!   `source.ip`); `x-forwarded-for` then gives `remote.ip` the way the proxy derives it;
//! * `source.certificate` (URL-encoded PEM) or else `source.principal`: the peer
//!   identity (`source.principals`, `source.namespaces`);
//! * `destination.address`: the destination (`destination.ip`, `destination.port`);
//! * `tls_session.sni`: `connection.sni`.

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    address, Address, HeaderValue as PbHeader, HeaderValueOption,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{
    CheckResponse, DeniedHttpResponse, OkHttpResponse,
};
use envoy_types::pb::google::rpc;
use http::header::{HeaderName, HeaderValue};
use moat_core::{Connection, PeerIdentity, TlsSession};
use percent_encoding::percent_decode_str;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::{decide, Check, Decided};
use crate::check_request::{Attributes, CheckRequest, Peer, CHECK_PATH};
use crate::state::Shared;

/// gRPC status codes Envoy reads (`google.rpc.Code`).
const OK: i32 = 0;
const PERMISSION_DENIED: i32 = 7;

/// The `Check` method of one decision listener, for one caller connection.
#[derive(Clone)]
pub(crate) struct CheckService {
    pub(crate) shared: Arc<Shared>,
    pub(crate) listener: Arc<str>,
    pub(crate) caller: SocketAddr,
}

impl CheckService {
    async fn check(self, request: CheckRequest) -> Result<CheckResponse, tonic::Status> {
        let snap = self.shared.snapshot.load();
        let Some(rt) = snap.decision_listener(&self.listener) else {
            return Err(tonic::Status::unavailable("listener removed by a reload"));
        };
        let attrs = request.attributes.unwrap_or_default();
        let check = to_check(attrs, self.caller)
            .map_err(|m| tonic::Status::invalid_argument(format!("CheckRequest: {m}")))?;
        let decided = decide(&self.shared, &snap, rt, check).await;
        Ok(to_response(decided))
    }
}

impl tonic::server::UnaryService<CheckRequest> for CheckService {
    type Response = CheckResponse;
    /// Boxed: hyper spawns a task per HTTP/2 stream, and inline the whole decision (with
    /// its external calls) would be moved into each of them.
    type Future =
        Pin<Box<dyn Future<Output = Result<tonic::Response<CheckResponse>, tonic::Status>> + Send>>;

    fn call(&mut self, request: tonic::Request<CheckRequest>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            this.check(request.into_inner())
                .await
                .map(tonic::Response::new)
        })
    }
}

/// Answers one gRPC call: `Check`, decoded with messages of at most `max_message`
/// bytes; `UNIMPLEMENTED` for any other method.
pub(crate) async fn serve_call<B>(
    service: CheckService,
    max_message: usize,
    req: http::Request<B>,
) -> http::Response<tonic::body::Body>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    if req.uri().path() != CHECK_PATH {
        return tonic::Status::unimplemented(format!("no method {}", req.uri().path())).into_http();
    }
    let codec = tonic_prost::ProstCodec::<CheckResponse, CheckRequest>::default();
    let mut grpc =
        tonic::server::Grpc::new(codec).apply_max_message_size_config(Some(max_message), None);
    grpc.unary(service, req).await
}

/// Builds the request model from a `CheckRequest`'s attributes. The path must be in
/// origin form (start with `/`, as Envoy's `:path` does): anything else would parse as
/// an authority, and the policies would see `/` instead of what the proxy forwards.
pub(crate) fn to_check(a: Attributes, caller: SocketAddr) -> Result<Check, String> {
    let http = a
        .request
        .and_then(|r| r.http)
        .ok_or("attributes.request.http is missing")?;
    if !http.path.is_empty() && !http.path.starts_with(b"/") {
        return Err("attributes.request.http.path must start with `/`".into());
    }
    let method = if http.method.is_empty() {
        http::Method::GET
    } else {
        http::Method::from_bytes(&http.method).map_err(|_| "bad method")?
    };
    let uri = if http.path.is_empty() {
        http::Uri::from_static("/")
    } else {
        http::Uri::from_maybe_shared(http.path).map_err(|e| format!("path: {e}"))?
    };
    let mut req = http::Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    let header = |k: &[u8], v: bytes::Bytes| -> Result<Option<(HeaderName, HeaderValue)>, String> {
        if k.starts_with(b":") {
            return Ok(None);
        }
        let shown = || String::from_utf8_lossy(k).into_owned();
        let name = HeaderName::from_bytes(k).map_err(|_| format!("header name `{}`", shown()))?;
        let value = HeaderValue::from_maybe_shared(v)
            .map_err(|_| format!("header `{}`: bad value", shown()))?;
        Ok(Some((name, value)))
    };
    match http.header_map {
        Some(map) => {
            for h in map.headers {
                let v = if h.raw_value.is_empty() {
                    h.value
                } else {
                    h.raw_value
                };
                if let Some((k, v)) = header(&h.key, v)? {
                    headers.append(k, v);
                }
            }
        }
        // A protobuf map: a key given twice keeps its last value (names are
        // case-insensitive, so `Foo` and `foo` are one key here).
        None => {
            for h in http.headers {
                if let Some((k, v)) = header(&h.key, h.value)? {
                    headers.insert(k, v);
                }
            }
        }
    }
    if !headers.contains_key(http::header::HOST) && !http.host.is_empty() {
        let host = HeaderValue::from_maybe_shared(http.host).map_err(|_| "bad host")?;
        headers.insert(http::header::HOST, host);
    }
    let (parts, ()) = req.into_parts();
    let body = if !http.raw_body.is_empty() {
        Some(http.raw_body)
    } else if !http.body.is_empty() {
        Some(http.body)
    } else {
        None
    };
    let unspecified = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
    let source = a.source.unwrap_or_default();
    let remote_addr = socket_addr(source.address.as_ref()).unwrap_or(unspecified);
    let local_addr = a
        .destination
        .as_ref()
        .and_then(|d| socket_addr(d.address.as_ref()))
        .unwrap_or(unspecified);
    let peer = peer_identity(&source)?;
    let sni = a.tls_session.map(|t| t.sni).filter(|s| !s.is_empty());
    let tls = (peer.is_some() || sni.is_some()).then(|| TlsSession {
        sni,
        alpn: None,
        version: String::new(),
        cipher_suite: String::new(),
        peer,
    });
    let conn = Arc::new(Connection {
        remote_addr,
        local_addr,
        tls,
    });
    // `remote.ip`: Envoy has already applied its own trusted-hops setting to choose
    // the source; the header is the client's claim, so the source is the client.
    let client_ip = remote_addr.ip();
    Ok(Check {
        parts,
        body,
        conn,
        client_ip,
        caller,
        removes_fields: true,
    })
}

fn socket_addr(a: Option<&Address>) -> Option<SocketAddr> {
    let Some(address::Address::SocketAddress(s)) = a?.address.as_ref() else {
        return None;
    };
    let ip: IpAddr = s.address.parse().ok()?;
    let port = match s.port_specifier {
        Some(
            envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p),
        ) => u16::try_from(p).ok()?,
        _ => 0,
    };
    Some(SocketAddr::new(ip, port))
}

/// The peer identity: from the certificate Envoy forwards (`source.certificate`, a
/// URL-encoded PEM certificate), else from the principal it derived (`source.principal`,
/// the SPIFFE URI SAN).
fn peer_identity(source: &Peer) -> Result<Option<PeerIdentity>, String> {
    if !source.certificate.is_empty() {
        // Encoders escape a literal `+` (base64 has them) as `%2B`; a bare `+` is a
        // form-encoded space (Go's `url.QueryEscape`), Envoy writes `%20`.
        let spaced = source.certificate.replace('+', " ");
        let pem = percent_decode_str(&spaced).collect::<Vec<u8>>();
        let der = CertificateDer::from_pem_slice(&pem)
            .map_err(|e| format!("source.certificate is not a PEM certificate: {e}"))?;
        return Ok(Some(moat_tls::peer_identity(&der)));
    }
    if source.principal.is_empty() {
        return Ok(None);
    }
    let (principal, namespace) = PeerIdentity::from_spiffe_uri(&source.principal);
    Ok(Some(PeerIdentity {
        principal,
        namespace,
        uri_sans: vec![source.principal.clone()],
        ..PeerIdentity::default()
    }))
}

fn header_option(k: &HeaderName, v: &HeaderValue) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(PbHeader {
            key: k.as_str().to_owned(),
            value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
            raw_value: Vec::new(),
        }),
        ..HeaderValueOption::default()
    }
}

/// The `CheckResponse`: OK with the headers to add and remove, or PERMISSION_DENIED with
/// the denial's status, headers and block page.
fn to_response(d: Decided) -> CheckResponse {
    let headers = d.headers.iter().map(|(k, v)| header_option(k, v)).collect();
    match d.denied {
        None => CheckResponse {
            status: Some(rpc::Status {
                code: OK,
                ..rpc::Status::default()
            }),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers,
                headers_to_remove: d.removed.iter().map(|h| h.as_str().to_owned()).collect(),
                ..OkHttpResponse::default()
            })),
            ..CheckResponse::default()
        },
        Some(reply) => CheckResponse {
            status: Some(rpc::Status {
                code: PERMISSION_DENIED,
                ..rpc::Status::default()
            }),
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                status: Some(HttpStatus {
                    code: i32::from(reply.status.as_u16()),
                }),
                headers,
                body: String::from_utf8_lossy(&reply.body).into_owned(),
            })),
            ..CheckResponse::default()
        },
    }
}
