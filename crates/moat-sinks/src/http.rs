//! HTTP sink: each batch is one `POST` of JSON (NDJSON, a JSON array,
//! Elasticsearch `_bulk` or a Loki push), over one kept-alive HTTP/1.1 connection.
//!
//! A 2xx answer delivers the batch; 408, 429 and 5xx (and any connection
//! error) are retried with backoff; any other status refuses the batch for
//! good (counted as rejected: retrying a 400 would block the sink forever).

use std::io::Write as _;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use hyper::{Request, Uri};
use hyper_util::rt::TokioIo;

use crate::config::{HttpBody, HttpConfig, RecordKind};
use crate::net::Endpoint;
use crate::outbox::{Message, SendError, Transport};

/// The OTLP `ExportTraceServiceRequest` around encoded spans.
pub(crate) fn write_otlp_request(service_name: &str, batch: &[Message], out: &mut Vec<u8>) {
    out.extend_from_slice(
        b"{\"resourceSpans\":[{\"resource\":{\"attributes\":[{\"key\":\"service.name\",\"value\":{\"stringValue\":",
    );
    let _ = serde_json::to_writer(&mut *out, service_name);
    let _ = std::io::Write::write_fmt(
        out,
        format_args!(
            "}}}}]}},\"scopeSpans\":[{{\"scope\":{{\"name\":\"moat\",\"version\":\"{}\"}},\"spans\":[",
            env!("CARGO_PKG_VERSION")
        ),
    );
    for (i, m) in batch.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&m.body);
    }
    out.extend_from_slice(b"]}]}]}");
}

/// Appends the request body of a batch in `layout` to `out`.
pub fn write_body(layout: HttpBody, batch: &[Message], out: &mut Vec<u8>) {
    match layout {
        HttpBody::Ndjson => {
            for m in batch {
                out.extend_from_slice(&m.body);
                out.push(b'\n');
            }
        }
        HttpBody::JsonArray => {
            out.push(b'[');
            for (i, m) in batch.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(&m.body);
            }
            out.push(b']');
        }
        HttpBody::ElasticBulk => {
            for m in batch {
                out.extend_from_slice(b"{\"create\":{}}\n");
                out.extend_from_slice(&m.body);
                out.push(b'\n');
            }
        }
        HttpBody::Loki => {
            // One stream per record kind; Loki wants nanosecond strings and the line as a string.
            out.extend_from_slice(b"{\"streams\":[");
            let mut first_stream = true;
            for kind in RecordKind::ALL {
                let mut lines = batch.iter().filter(|m| m.kind == kind).peekable();
                if lines.peek().is_none() {
                    continue;
                }
                if !first_stream {
                    out.push(b',');
                }
                first_stream = false;
                let _ = write!(
                    out,
                    "{{\"stream\":{{\"app\":\"moat\",\"type\":\"{}\"}},\"values\":[",
                    kind.name()
                );
                for (i, m) in lines.enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    let _ = write!(out, "[\"{}000000\",", m.ts_ms);
                    // The JSON object as a JSON string: serde_json escapes it. The body
                    // is UTF-8 (serde_json wrote it); a lossy view cannot differ.
                    let _ = serde_json::to_writer(&mut *out, &String::from_utf8_lossy(&m.body));
                    out.push(b']');
                }
                out.extend_from_slice(b"]}");
            }
            out.extend_from_slice(b"]}");
        }
    }
}

fn content_type(layout: HttpBody) -> &'static str {
    match layout {
        HttpBody::Ndjson | HttpBody::ElasticBulk => "application/x-ndjson",
        HttpBody::JsonArray | HttpBody::Loki => "application/json",
    }
}

pub(crate) struct HttpSink {
    layout: HttpBody,
    uri: Uri,
    host: HeaderValue,
    headers: Vec<(HeaderName, HeaderValue)>,
    endpoint: Endpoint,
    conn: Option<SendRequest<Full<Bytes>>>,
    buf: Vec<u8>,
    /// Set for the trace exporter: batches are OTLP requests of this service.
    otlp_service: Option<String>,
}

impl HttpSink {
    /// `cfg` was validated: its URL parses and has a host, its headers are valid.
    pub(crate) fn new(
        cfg: &HttpConfig,
        base_dir: &std::path::Path,
    ) -> Result<HttpSink, crate::SinkError> {
        let bad = |m: String| crate::SinkError::Config(format!("http.url: {m}"));
        let uri: Uri = cfg.url.parse().map_err(|e| bad(format!("{e}")))?;
        let https = uri.scheme_str() == Some("https");
        let authority = uri
            .authority()
            .ok_or_else(|| bad("no host".into()))?
            .clone();
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let address = format!("{}:{port}", authority.host());
        let tls = if https {
            let default = crate::config::ClientTlsConfig::default();
            Some(crate::net::client_config(
                cfg.tls.as_ref().unwrap_or(&default),
                base_dir,
            )?)
        } else {
            None
        };
        let server_name = cfg.tls.as_ref().and_then(|t| t.server_name.as_deref());
        let host_name = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let endpoint = Endpoint::new(
            &address,
            tls.map(|c| (c, Some(server_name.unwrap_or(host_name)))),
        )?;
        let mut headers = Vec::new();
        for (k, v) in &cfg.headers {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|e| crate::SinkError::Config(format!("http.headers.{k}: {e}")))?;
            let value = HeaderValue::from_str(v)
                .map_err(|e| crate::SinkError::Config(format!("http.headers.{k}: {e}")))?;
            headers.push((name, value));
        }
        let host =
            HeaderValue::from_str(authority.as_str()).map_err(|e| bad(format!("host: {e}")))?;
        Ok(HttpSink {
            layout: cfg.body,
            uri,
            host,
            headers,
            endpoint,
            conn: None,
            buf: Vec::new(),
            otlp_service: None,
        })
    }

    /// Posts batches of encoded spans as OTLP/HTTP JSON requests of `service`.
    pub(crate) fn with_otlp(mut self, service: String) -> Self {
        self.otlp_service = Some(service);
        self
    }

    async fn connection(&mut self) -> Result<&mut SendRequest<Full<Bytes>>, SendError> {
        if self.conn.as_ref().is_some_and(|c| c.is_closed()) {
            self.conn = None;
        }
        if self.conn.is_none() {
            let retry = |e: String| SendError::Retry(format!("{}: {e}", self.endpoint.address));
            let io = self
                .endpoint
                .connect()
                .await
                .map_err(|e| retry(e.to_string()))?;
            let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
                .await
                .map_err(|e| retry(e.to_string()))?;
            // The connection task ends when the sink drops `send` or the peer closes.
            tokio::spawn(async move {
                let _ = conn.await;
            });
            self.conn = Some(send);
        }
        match &mut self.conn {
            Some(c) => Ok(c),
            None => Err(SendError::Retry("not connected".into())),
        }
    }
}

impl Transport for HttpSink {
    async fn send(&mut self, batch: &mut Vec<Message>) -> Result<(), SendError> {
        self.buf.clear();
        let content_type = match &self.otlp_service {
            Some(service) => {
                write_otlp_request(service, batch, &mut self.buf);
                "application/json"
            }
            None => {
                write_body(self.layout, batch, &mut self.buf);
                content_type(self.layout)
            }
        };
        let body = Bytes::from(std::mem::take(&mut self.buf));
        let mut req = Request::post(self.uri.clone())
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .map_err(|e| SendError::Reject(e.to_string()))?;
        for (k, v) in &self.headers {
            req.headers_mut().insert(k.clone(), v.clone());
        }
        let conn = self.connection().await?;
        conn.ready()
            .await
            .map_err(|e| SendError::Retry(e.to_string()))?;
        let resp = match conn.send_request(req).await {
            Ok(r) => r,
            Err(e) => {
                self.conn = None;
                return Err(SendError::Retry(e.to_string()));
            }
        };
        let status = resp.status();
        // Read the answer to the end so the connection can carry the next batch.
        let answer = resp.into_body().collect().await.map(|b| b.to_bytes());
        if answer.is_err() {
            self.conn = None;
        }
        if status.is_success() {
            batch.clear();
            return Ok(());
        }
        let text = answer
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(200)]).into_owned())
            .unwrap_or_default();
        let msg = format!("{} answered {status}: {text}", self.uri);
        if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 408 {
            Err(SendError::Retry(msg))
        } else {
            Err(SendError::Reject(msg))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outbox::Severity;

    fn m(kind: RecordKind, body: &str) -> Message {
        Message {
            kind,
            ts_ms: 5,
            severity: Severity::Info,
            key: None,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn body_layouts() {
        let batch = [
            m(RecordKind::Access, "{\"a\":1}"),
            m(RecordKind::Tls, "{\"b\":\"x\"}"),
        ];
        let mut out = Vec::new();
        write_body(HttpBody::JsonArray, &batch, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v[1]["b"], "x");
        out.clear();
        write_body(HttpBody::ElasticBulk, &batch, &mut out);
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"create\":{}}\n{\"a\":1}\n{\"create\":{}}\n{\"b\":\"x\"}\n"
        );
        out.clear();
        write_body(HttpBody::Loki, &batch, &mut out);
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["streams"][0]["stream"]["type"], "access");
        assert_eq!(v["streams"][1]["values"][0][0], "5000000");
        assert_eq!(v["streams"][1]["values"][0][1], "{\"b\":\"x\"}");
    }
}
