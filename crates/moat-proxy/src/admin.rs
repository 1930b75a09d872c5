//! The admin listener: a table of `path -> handler`.
//!
//! Built-ins: `/healthz`, `/readyz`, `/metrics`, `/config`. More endpoints (e.g.
//! `/v1/scan`, `/v1/events`, `/v1/apis`) are added with [`AdminRouter::route`]
//! before the gateway starts (see [`crate::GatewayOptions::admin`]).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::state::Shared;

/// Largest request body the admin API reads.
pub const MAX_ADMIN_BODY: usize = 8 << 20;

/// A request to an admin endpoint, body fully read.
pub struct AdminRequest {
    /// Method, URI, headers.
    pub parts: http::request::Parts,
    /// The request body (at most [`MAX_ADMIN_BODY`]).
    pub body: Bytes,
    /// The gateway (current config, metrics, reload).
    pub gateway: Arc<Shared>,
    /// The TCP peer of the admin connection (the console serves loopback peers only
    /// unless configured otherwise).
    pub peer: SocketAddr,
}

/// The response of an admin endpoint.
pub type AdminResponse = Response<Full<Bytes>>;

/// Future returned by an admin handler.
pub type AdminFuture = Pin<Box<dyn Future<Output = AdminResponse> + Send>>;

/// An admin endpoint.
pub type AdminHandler = Arc<dyn Fn(AdminRequest) -> AdminFuture + Send + Sync>;

/// Who checks the credentials of a route's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Auth {
    /// The router: `Authorization: Bearer <admin.token>`.
    Bearer,
    /// The handler itself (the web console's login and session cookie).
    Handler,
}

/// Admin routes: exact path match (query ignored); later registrations of the same path win.
#[derive(Clone, Default)]
pub struct AdminRouter {
    routes: Vec<(String, AdminHandler, Auth)>,
}

impl AdminRouter {
    /// An empty router.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the handler of `path`.
    pub fn route(self, path: &str, handler: AdminHandler) -> Self {
        self.insert(path, handler, Auth::Bearer)
    }

    /// Adds (or replaces) the handler of `path`, which checks credentials itself: the
    /// router does not ask for the bearer token (the web console logs in with the token
    /// once and then carries a session cookie).
    pub fn route_self_authenticated(self, path: &str, handler: AdminHandler) -> Self {
        self.insert(path, handler, Auth::Handler)
    }

    fn insert(mut self, path: &str, handler: AdminHandler, auth: Auth) -> Self {
        self.routes.retain(|(p, _, _)| p != path);
        self.routes.push((path.to_string(), handler, auth));
        self
    }

    /// Adds a handler written as a plain async function.
    pub fn route_fn<F, Fut>(self, path: &str, f: F) -> Self
    where
        F: Fn(AdminRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = AdminResponse> + Send + 'static,
    {
        self.route(path, Arc::new(move |r| Box::pin(f(r))))
    }

    /// Paths served.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.routes.iter().map(|(p, _, _)| p.as_str())
    }

    fn find(&self, path: &str) -> Option<(&AdminHandler, Auth)> {
        self.routes
            .iter()
            .find(|(p, _, _)| p == path)
            .map(|(_, h, a)| (h, *a))
    }

    /// This router plus the built-in endpoints (user routes with the same path win).
    pub(crate) fn with_builtins(self) -> Self {
        let mut r = AdminRouter::new()
            .route_fn("/healthz", |_| async { text(StatusCode::OK, "ok\n") })
            .route_fn("/readyz", |req| async move {
                if req.gateway.is_ready() {
                    text(StatusCode::OK, "ready\n")
                } else {
                    text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                }
            })
            .route_fn("/metrics", |req| async move {
                let mut text = req.gateway.metrics.render();
                if let Some((rl, bg)) = &req.gateway.snapshot.load().pipeline.engines.ratelimit {
                    rl.render_metrics(&mut text);
                    bg.render_metrics(&mut text);
                }
                let mut resp = Response::new(Full::new(Bytes::from(text)));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                resp
            })
            .route_fn("/config", |req| async move {
                let snap = req.gateway.snapshot.load();
                let mut v = serde_json::to_value(&*snap.config).unwrap_or_default();
                redact(&mut v);
                json(StatusCode::OK, &v)
            })
            .route_fn("/v1/bans", |req| async move { bans(req) });
        for (p, h, a) in self.routes {
            r = r.insert(&p, h, a);
        }
        r
    }
}

/// `/v1/bans`: `GET` lists the bans in force, `POST {"ip": "...", "duration": "10m"}`
/// bans an IP, `DELETE ?ip=...` lifts a ban. With a shared store the change reaches
/// every instance.
fn bans(req: AdminRequest) -> AdminResponse {
    let snap = req.gateway.snapshot.load();
    let Some((engine, _)) = &snap.pipeline.engines.ratelimit else {
        return json_error(
            StatusCode::NOT_FOUND,
            "bans are not configured (ratelimit.bans)",
        );
    };
    let Some(bans) = engine.bans() else {
        return json_error(
            StatusCode::NOT_FOUND,
            "bans are not configured (ratelimit.bans)",
        );
    };
    let now = moat_ratelimit::bans::unix_ms();
    match req.parts.method {
        Method::GET => json(
            StatusCode::OK,
            &serde_json::json!({ "bans": bans.list(now) }),
        ),
        Method::POST => {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Add {
                ip: std::net::IpAddr,
                duration: String,
            }
            let add: Add = match serde_json::from_slice(&req.body) {
                Ok(a) => a,
                Err(e) => {
                    return json_error(
                        StatusCode::BAD_REQUEST,
                        &format!("expected {{\"ip\": \"...\", \"duration\": \"10m\"}}: {e}"),
                    )
                }
            };
            let d = match moat_config::parse_duration(&add.duration) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    return json_error(StatusCode::BAD_REQUEST, "duration must be longer than 0s")
                }
                Err(e) => return json_error(StatusCode::BAD_REQUEST, &e),
            };
            let ban = moat_ratelimit::Ban {
                ip: add.ip,
                until_ms: now.saturating_add(d.as_millis().min(u128::from(u64::MAX)) as u64),
            };
            bans.add(&ban);
            if let Some(store) = engine.store() {
                store.ban(&ban);
            }
            json(StatusCode::OK, &serde_json::json!(ban))
        }
        Method::DELETE => {
            let ip = req
                .parts
                .uri
                .query()
                .unwrap_or("")
                .split('&')
                .find_map(|kv| kv.strip_prefix("ip="))
                .and_then(|v| v.parse::<std::net::IpAddr>().ok());
            let Some(ip) = ip else {
                return json_error(StatusCode::BAD_REQUEST, "expected ?ip=ADDRESS");
            };
            let found = bans.remove(ip);
            if let Some(store) = engine.store() {
                store.unban(ip);
            }
            let status = if found {
                StatusCode::OK
            } else {
                StatusCode::NOT_FOUND
            };
            json(status, &serde_json::json!({ "ip": ip, "removed": found }))
        }
        _ => json_error(StatusCode::METHOD_NOT_ALLOWED, "use GET, POST or DELETE"),
    }
}

fn json_error(status: StatusCode, msg: &str) -> AdminResponse {
    json(status, &serde_json::json!({ "error": msg }))
}

/// A JSON response.
pub fn json(status: StatusCode, v: &serde_json::Value) -> AdminResponse {
    let mut resp = Response::new(Full::new(Bytes::from(v.to_string())));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// A plain-text response.
pub fn text(status: StatusCode, body: &'static str) -> AdminResponse {
    let mut resp = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    resp
}

/// Keys whose values never leave the process through `/config`.
const SECRET_KEYS: &[&str] = &[
    "token",
    "password",
    "secret",
    "api_key",
    "client_secret",
    "authorization",
    "private_key",
];

/// Replaces secret values (by key name) with `"<redacted>"`, recursively.
pub fn redact(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, val) in m.iter_mut() {
                let lk = k.to_ascii_lowercase();
                if SECRET_KEYS
                    .iter()
                    .any(|s| lk == *s || lk.ends_with(&format!("_{s}")))
                    && !val.is_null()
                {
                    *val = serde_json::Value::String("<redacted>".into());
                } else {
                    redact(val);
                }
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(redact),
        _ => {}
    }
}

fn authorized(shared: &Shared, parts: &http::request::Parts) -> bool {
    let snap = shared.snapshot.load();
    let Some(token) = snap.config.admin.token.as_deref() else {
        return true;
    };
    let Some(got) = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    token_matches(got.trim(), token)
}

/// Compares a presented admin token with the configured one in constant time (the
/// time does not tell how many leading bytes matched).
pub fn token_matches(got: &str, token: &str) -> bool {
    let (a, b) = (got.as_bytes(), token.as_bytes());
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        diff |= (a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0)) as usize;
    }
    diff == 0
}

async fn dispatch(
    shared: Arc<Shared>,
    router: Arc<AdminRouter>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<AdminResponse, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let found = router.find(&path);
    let open =
        path == "/healthz" || path == "/readyz" || found.is_some_and(|(_, a)| a == Auth::Handler);
    if !open && !authorized(&shared, &parts) {
        let mut r = text(StatusCode::UNAUTHORIZED, "admin token required\n");
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return Ok(r);
    }
    let Some(handler) = found.map(|(h, _)| h.clone()) else {
        return Ok(text(StatusCode::NOT_FOUND, "not found\n"));
    };
    let body = if parts.method == Method::GET || parts.method == Method::HEAD {
        Bytes::new()
    } else {
        match Limited::new(body, MAX_ADMIN_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => return Ok(text(StatusCode::PAYLOAD_TOO_LARGE, "body too large\n")),
        }
    };
    Ok(handler(AdminRequest {
        parts,
        body,
        gateway: shared,
        peer,
    })
    .await)
}

pub(crate) async fn serve(
    shared: Arc<Shared>,
    router: Arc<AdminRouter>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.changed() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
        };
        let shared = shared.clone();
        let router = router.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| dispatch(shared.clone(), router.clone(), peer, req));
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tcp), svc)
                .await;
        });
    }
}
