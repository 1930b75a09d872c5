//! One connection of a decision listener: HTTP/1.1 (forward-auth, Envoy's HTTP mode)
//! and HTTP/2 (gRPC `Check`, or HTTP checks over h2c) on the same port, told apart by
//! the request's `content-type`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::header::CONTENT_TYPE;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use super::grpc::{serve_call, CheckService};
use super::http_check;
use crate::state::Shared;

/// A request head not received within this long closes the connection.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Room for a `CheckRequest`'s attributes besides the body it may carry.
const GRPC_HEAD_ROOM: usize = 256 << 10;

/// Serves one accepted connection until it closes, or until the gateway drains.
pub(crate) async fn serve<I>(
    shared: Arc<Shared>,
    listener: Arc<str>,
    io: I,
    peer: SocketAddr,
    local: SocketAddr,
    mut drain: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let max_body = shared
        .snapshot
        .load()
        .decision_listener(&listener)
        .map_or(0, |rt| usize::try_from(rt.max_body).unwrap_or(usize::MAX));
    let grpc = CheckService {
        shared: shared.clone(),
        listener: listener.clone(),
        caller: peer,
    };
    let max_message = max_body.saturating_add(GRPC_HEAD_ROOM);
    let svc = service_fn(move |req: http::Request<Incoming>| {
        let is_grpc = req
            .headers()
            .get(CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let grpc = grpc.clone();
        let shared = shared.clone();
        let listener = listener.clone();
        async move {
            // Both paths boxed: hyper spawns this future for every HTTP/2 stream, and
            // either one inline (tonic's unary call, or the HTTP decision with its
            // external calls) would be moved into each stream's task; the HTTP path
            // inline cost more than half of a Check's instructions in copies.
            if is_grpc {
                return Ok::<_, Infallible>(Box::pin(serve_call(grpc, max_message, req)).await);
            }
            let resp = Box::pin(http_check::handle(&shared, &listener, peer, local, req)).await;
            Ok::<_, Infallible>(resp.map(tonic::body::Body::new))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection(TokioIo::new(io), svc);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(peer = %peer, error = %e, "decision connection ended with an error");
            }
        }
        _ = async { drain.wait_for(|d| *d).await.map(|_| ()) } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
