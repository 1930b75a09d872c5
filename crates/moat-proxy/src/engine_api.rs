//! Admin endpoints served by the engines: `POST /v1/scan` (secret detection),
//! `GET /v1/apis` (API inventory) and `GET /v1/events` (the event store).
//!
//! The handlers read the engines of the *current* snapshot, so a reload that
//! changes the secret rules or turns discovery on is visible at once.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{header, HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use parking_lot::Mutex;

use crate::admin::{AdminRequest, AdminResponse, AdminRouter};

/// Adds the engine endpoints to `router`. `event_store` is the SQLite file the
/// event writer fills (see [`moat_events::EventWriter::store_path`]), if any.
pub fn engine_routes(router: AdminRouter, event_store: Option<PathBuf>) -> AdminRouter {
    let store: Arc<Mutex<Option<moat_events::EventStore>>> = Arc::new(Mutex::new(None));
    router
        .route_fn("/v1/scan", scan)
        .route_fn("/v1/apis", apis)
        .route_fn("/v1/events", move |req| {
            let store = store.clone();
            let path = event_store.clone();
            async move {
                // SQLite reads block: keep them off the async workers.
                tokio::task::spawn_blocking(move || events(req, path, store))
                    .await
                    .unwrap_or_else(|_| error(500, "query failed"))
            }
        })
}

fn json_bytes(status: u16, body: impl Into<Bytes>) -> AdminResponse {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error(status: u16, message: &str) -> AdminResponse {
    json_bytes(status, serde_json::json!({ "error": message }).to_string())
}

/// The scanner used by `/v1/scan` when inline secret detection is off: the
/// embedded default ruleset, compiled on first use.
fn fallback_secrets() -> Option<&'static Arc<moat_secrets::SecretsEngine>> {
    static ENGINE: OnceLock<Option<Arc<moat_secrets::SecretsEngine>>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            moat_secrets::SecretsEngine::build(
                &moat_secrets::SecretsConfig::default(),
                std::path::Path::new("."),
            )
            .ok()
        })
        .as_ref()
}

async fn scan(req: AdminRequest) -> AdminResponse {
    if req.parts.method != Method::POST {
        return error(405, "use POST");
    }
    let snap = req.gateway.snapshot.load_full();
    let engine = match snap.pipeline.engines.secrets.clone() {
        Some(e) => e,
        None => match fallback_secrets() {
            Some(e) => e.clone(),
            None => return error(500, "the default secret rules failed to compile"),
        },
    };
    // Scanning is CPU work bounded by the API's own size and time limits; keep it
    // off the admin listener's async workers.
    let body = req.body;
    match tokio::task::spawn_blocking(move || moat_secrets::scan_api(&engine, &body)).await {
        Ok((status, json)) => json_bytes(status, json),
        Err(_) => error(500, "scan failed"),
    }
}

async fn apis(req: AdminRequest) -> AdminResponse {
    let snap = req.gateway.snapshot.load_full();
    match &snap.pipeline.engines.discovery {
        Some(d) => json_bytes(200, moat_schema::apis_endpoint(d.engine())),
        None => error(404, "API discovery is off (set discovery.enabled: true)"),
    }
}

fn events(
    req: AdminRequest,
    path: Option<PathBuf>,
    store: Arc<Mutex<Option<moat_events::EventStore>>>,
) -> AdminResponse {
    let Some(path) = path else {
        return error(404, "the event store is off (set events.store)");
    };
    let mut guard = store.lock();
    if guard.is_none() {
        match moat_events::EventStore::open_read_only(&path) {
            Ok(s) => *guard = Some(s),
            Err(e) => return error(500, &format!("cannot open the event store: {e}")),
        }
    }
    let Some(s) = guard.as_ref() else {
        return error(500, "the event store is unavailable");
    };
    let (status, body) =
        moat_events::http_api::events_endpoint(s, req.parts.uri.query().unwrap_or(""));
    json_bytes(status, body)
}
