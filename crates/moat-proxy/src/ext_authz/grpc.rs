//! The transport of `envoyExtAuthzGrpc` calls: one HTTP/2 connection per provider,
//! made on first use and multiplexed, spoken through the h2 crate (hyper's HTTP/2)
//! directly.
//!
//! Why not a tonic channel or hyper's client: both hand the call to other tasks (tonic's
//! buffer worker, hyper's dispatcher and its body pipe) before it reaches the connection,
//! and hyper flushes a request's HEADERS before its DATA. Here the calling task queues
//! the HEADERS and the whole message on the stream itself, so the connection writes the
//! call in one system call, and the answer wakes the caller directly (docs/perf.md,
//! "CUSTOM").

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use parking_lot::Mutex;

use super::connector::Connector;
use super::{grpc_status, MAX_CHECK_RESPONSE};
use crate::check_request::CHECK_PATH;

/// Calls a gRPC provider's `Check`.
pub(super) struct GrpcClient {
    connector: Connector,
    host: String,
    port: u16,
    /// `http(s)://authority/envoy.service.auth.v3.Authorization/Check`.
    uri: Uri,
    /// The connection in use (its handle, and a number that tells it from the one that
    /// replaces it); `None` before the first call and after the connection failed.
    current: Mutex<Option<(u64, SendRequest<Bytes>)>>,
    /// Held while a connection is made, so that the calls waiting for it share it.
    connecting: tokio::sync::Mutex<u64>,
}

/// Why a call failed, whether the connection is to blame (then it is replaced), and
/// whether the call had gone out.
struct Failure {
    message: String,
    connection: bool,
    sent: bool,
}

impl Failure {
    fn h2(what: &str, e: &h2::Error, sent: bool) -> Failure {
        Failure {
            message: format!("gRPC transport: {what}: {e}"),
            // A reset stream is this call's alone; anything else is the connection's.
            connection: e.is_io() || e.is_go_away() || e.reason().is_none(),
            sent,
        }
    }

    fn answer(message: String) -> Failure {
        Failure {
            message,
            connection: false,
            sent: true,
        }
    }
}

impl GrpcClient {
    /// A client of `service:port` (TLS when the connector has it); connects on first use.
    pub(super) fn new(connector: Connector, service: &str, port: u16) -> Result<Self, String> {
        let scheme = if connector.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let authority = super::authority(service, port);
        let uri = format!("{scheme}://{authority}{CHECK_PATH}")
            .parse()
            .map_err(|e| format!("`{authority}`: {e}"))?;
        Ok(GrpcClient {
            connector,
            host: service.to_owned(),
            port,
            uri,
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(0),
        })
    }

    /// Posts `message` (one framed gRPC message) to `Check` and returns the body of an
    /// answer with `grpc-status` 0 (at most [`MAX_CHECK_RESPONSE`] bytes). A connection
    /// found closed before the call went out is replaced and the call made on the new one.
    pub(super) async fn call(&self, message: Bytes) -> Result<Bytes, String> {
        let (id, sender, fresh) = self.connection().await?;
        let failure = match self.exchange(sender, message.clone()).await {
            Ok(body) => return Ok(body),
            Err(f) => f,
        };
        if !failure.connection {
            return Err(failure.message);
        }
        self.forget(id);
        // A connection that was already closed refuses the call before taking it (the
        // provider restarted since the last call): nothing reached the provider, so the
        // call goes out on a new connection, once.
        if fresh || failure.sent {
            return Err(failure.message);
        }
        let (id, sender, _) = self.connection().await?;
        self.exchange(sender, message).await.map_err(|f| {
            if f.connection {
                self.forget(id);
            }
            f.message
        })
    }

    /// The connection in use, made when there is none; `true` when made by this call.
    async fn connection(&self) -> Result<(u64, SendRequest<Bytes>, bool), String> {
        if let Some((id, s)) = self.current.lock().as_ref() {
            return Ok((*id, s.clone(), false));
        }
        let mut made = self.connecting.lock().await;
        if let Some((id, s)) = self.current.lock().as_ref() {
            return Ok((*id, s.clone(), false));
        }
        let io = self
            .connector
            .open(&self.host, self.port)
            .await
            .map_err(|e| format!("gRPC transport: connect: {e}"))?;
        let (sender, connection) = h2::client::handshake(io)
            .await
            .map_err(|e| format!("gRPC transport: handshake: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "external authorizer connection closed");
            }
        });
        *made += 1;
        *self.current.lock() = Some((*made, sender.clone()));
        Ok((*made, sender, true))
    }

    /// Drops connection `id` if it is still the one in use.
    fn forget(&self, id: u64) {
        let mut current = self.current.lock();
        if current.as_ref().is_some_and(|(c, _)| *c == id) {
            *current = None;
        }
    }

    async fn exchange(&self, sender: SendRequest<Bytes>, message: Bytes) -> Result<Bytes, Failure> {
        let mut sender = sender
            .ready()
            .await
            .map_err(|e| Failure::h2("call refused", &e, false))?;
        let mut head = http::Request::new(());
        *head.method_mut() = Method::POST;
        *head.uri_mut() = self.uri.clone();
        let h = head.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        let (answer, mut stream) = sender
            .send_request(head, false)
            .map_err(|e| Failure::h2("call refused", &e, false))?;
        // Queued with the HEADERS before the connection task runs: one write for both.
        stream
            .send_data(message, true)
            .map_err(|e| Failure::h2("sending the check", &e, true))?;
        let answer = answer
            .await
            .map_err(|e| Failure::h2("awaiting the answer", &e, true))?;
        let (head, mut body) = answer.into_parts();
        if head.status != StatusCode::OK {
            return Err(Failure::answer(format!(
                "gRPC: HTTP status {}",
                head.status
            )));
        }
        // An error before any message comes in the head alone ("trailers-only").
        let in_head = grpc_status(&head.headers).map_err(Failure::answer)?;
        let mut data = Chunks::default();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| Failure::h2("reading the answer", &e, true))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            if data.len() + chunk.len() > MAX_CHECK_RESPONSE {
                return Err(Failure::answer(format!(
                    "gRPC answer: longer than {MAX_CHECK_RESPONSE} bytes"
                )));
            }
            data.push(chunk);
        }
        let trailers: Option<HeaderMap> = body
            .trailers()
            .await
            .map_err(|e| Failure::h2("reading the trailers", &e, true))?;
        let in_trailers = match &trailers {
            Some(t) => grpc_status(t).map_err(Failure::answer)?,
            None => false,
        };
        if !in_head && !in_trailers {
            return Err(Failure::answer(
                "gRPC: the answer ended without a grpc-status".into(),
            ));
        }
        Ok(data.into_bytes())
    }
}

/// An answer's body: its one chunk as received (the usual case, no copy), or the
/// chunks joined.
#[derive(Default)]
enum Chunks {
    #[default]
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Chunks {
    fn len(&self) -> usize {
        match self {
            Chunks::Empty => 0,
            Chunks::One(b) => b.len(),
            Chunks::Many(b) => b.len(),
        }
    }

    fn push(&mut self, chunk: Bytes) {
        *self = match std::mem::take(self) {
            Chunks::Empty => Chunks::One(chunk),
            Chunks::One(first) => {
                let mut all = BytesMut::with_capacity(first.len() + chunk.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&chunk);
                Chunks::Many(all)
            }
            Chunks::Many(mut all) => {
                all.extend_from_slice(&chunk);
                Chunks::Many(all)
            }
        };
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Chunks::Empty => Bytes::new(),
            Chunks::One(b) => b,
            Chunks::Many(b) => b.freeze(),
        }
    }
}
