//! The quickstart demo application: a small JSON API on an ephemeral loopback port.
//!
//! Endpoints: `GET /api/users/{id}`, `POST /login` (JSON), `GET /search?q=`,
//! `POST /upload`, `GET /health`.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use tokio::net::TcpListener;

/// Largest body the demo reads.
const MAX_BODY: usize = 10 << 20;

/// Starts the demo app on `127.0.0.1:0`; returns its address. Runs until the runtime stops.
pub async fn start() -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tcp), service_fn(handle))
                    .await;
            });
        }
    });
    Ok(addr)
}

fn reply(status: StatusCode, v: serde_json::Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path();
    let resp = match (&parts.method, path) {
        (&Method::GET, "/health") => reply(StatusCode::OK, json!({"status": "ok"})),
        (&Method::GET, p) if p.starts_with("/api/users/") => {
            let id = &p["/api/users/".len()..];
            match id.parse::<u64>() {
                Ok(n) => reply(
                    StatusCode::OK,
                    json!({"id": n, "name": format!("user{n}"), "email": format!("user{n}@example.com"), "role": "member"}),
                ),
                Err(_) => reply(
                    StatusCode::NOT_FOUND,
                    json!({"error": "user not found", "id": id}),
                ),
            }
        }
        (&Method::GET, "/search") => {
            let q = parts
                .uri
                .query()
                .and_then(|q| query_param(q, "q"))
                .unwrap_or("");
            reply(StatusCode::OK, json!({"query": q, "results": []}))
        }
        (&Method::POST, "/login") => match Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => match serde_json::from_slice::<serde_json::Value>(&b.to_bytes()) {
                Ok(v) if v.get("username").is_some_and(|u| u.is_string()) => reply(
                    StatusCode::OK,
                    json!({"token": "demo-session", "username": v["username"]}),
                ),
                _ => reply(
                    StatusCode::BAD_REQUEST,
                    json!({"error": "expected {\"username\": ..., \"password\": ...}"}),
                ),
            },
            Err(_) => reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": "body too large"}),
            ),
        },
        (&Method::POST, "/upload") => match Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => reply(
                StatusCode::OK,
                json!({"received_bytes": b.to_bytes().len()}),
            ),
            Err(_) => reply(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": "body too large"}),
            ),
        },
        _ => reply(StatusCode::NOT_FOUND, json!({"error": "not found"})),
    };
    Ok(resp)
}
