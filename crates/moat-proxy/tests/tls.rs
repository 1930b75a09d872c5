//! TLS termination: h2 over TLS (ALPN), mTLS modes and peer identity, TLS to upstreams.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderValue, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use moat_core::{
    Connection, HandshakeRecord, RequestCtx, RequestHeadersPhase, SecurityEvent, Verdict,
};
use moat_proxy::events::{AccessInfo, EventSink};
use moat_proxy::GatewayOptions;
use moat_tls::testing::TestPki;
use moat_tls::tokio_rustls::TlsConnector;
use moat_tls::ClientAuthMode;
use rustls_pki_types::ServerName;

/// Copies the TLS facts of the connection into request headers (so the upstream echoes them).
struct ExposePeer;
impl RequestHeadersPhase for ExposePeer {
    fn name(&self) -> &'static str {
        "test-expose-peer"
    }
    fn on_request_headers(&self, ctx: &mut RequestCtx, req: &mut http::request::Parts) -> Verdict {
        let tls = ctx.conn.tls.as_ref();
        let set = |req: &mut http::request::Parts, k: &'static str, v: Option<&str>| {
            if let Some(v) = v.and_then(|v| HeaderValue::from_str(v).ok()) {
                req.headers.insert(k, v);
            }
        };
        set(req, "x-tls-alpn", tls.and_then(|t| t.alpn.as_deref()));
        let peer = tls.and_then(|t| t.peer.as_ref());
        set(
            req,
            "x-peer-principal",
            peer.and_then(|p| p.principal.as_deref()),
        );
        set(
            req,
            "x-peer-namespace",
            peer.and_then(|p| p.namespace.as_deref()),
        );
        Verdict::Continue
    }
}

#[derive(Default)]
struct TlsCounter(AtomicUsize);
impl EventSink for TlsCounter {
    fn access(&self, _: &AccessInfo<'_>) -> bool {
        true
    }
    fn security(&self, _: &RequestCtx, _: &SecurityEvent, _: &Method, _: &str) -> bool {
        true
    }
    fn tls(&self, _: &Connection, hs: &HandshakeRecord) -> bool {
        assert!(hs.protocol_version >= 0x0303);
        self.0.fetch_add(1, Ordering::SeqCst);
        true
    }
}

fn tls_yaml(upstream: SocketAddr, mode: &str) -> String {
    format!(
        r#"listeners:
  - name: tls
    address: 127.0.0.1:0
    tls:
      certificates: [{{ cert: server.crt, key: server.key }}]
      alpn: [h2, http/1.1]
      client_auth: {{ mode: {mode}, ca: ca.crt }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{upstream}"]
routes:
  - name: all
    cluster: app
"#
    )
}

fn opts(sink: Arc<TlsCounter>) -> GatewayOptions {
    GatewayOptions {
        pipeline_factory: Arc::new(|cfg, src| {
            let mut p = moat_proxy::build_pipeline(cfg, src)?;
            p.request_headers.push(Arc::new(ExposePeer));
            Ok(p)
        }),
        events: Some(sink),
        ..GatewayOptions::default()
    }
}

/// One request over TLS; `h2` selects HTTP/2 (ALPN h2) or HTTP/1.1.
async fn tls_get(
    pki: &TestPki,
    addr: SocketAddr,
    with_cert: bool,
    h2: bool,
) -> Result<(StatusCode, http::Version, serde_json::Value), String> {
    let alpn: &[&str] = if h2 { &["h2"] } else { &["http/1.1"] };
    let cfg = pki.client_config(with_cert, alpn);
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let tls = TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let io = TokioIo::new(tls);
    let req = Request::get("https://localhost/who")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| format!("h2 handshake: {e}"))?;
        tokio::spawn(conn);
        send.send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("h1 handshake: {e}"))?;
        tokio::spawn(conn);
        let mut req = req;
        req.headers_mut()
            .insert("host", HeaderValue::from_static("localhost"));
        *req.uri_mut() = "/who".parse().unwrap();
        send.send_request(req)
            .await
            .map_err(|e| format!("request: {e}"))?
    };
    let status = resp.status();
    let version = resp.version();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, version, json(&body)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_over_tls_with_alpn() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let sink = Arc::new(TlsCounter::default());
    let gw = gateway(
        dir.path(),
        &tls_yaml(up.addr, "DISABLE"),
        opts(sink.clone()),
    )
    .await;
    let addr = gw.listener_addr("tls").unwrap();

    let (status, version, v) = tls_get(&pki, addr, false, true).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(version, http::Version::HTTP_2);
    assert_eq!(v["headers"]["x-tls-alpn"], "h2");
    assert_eq!(v["headers"]["x-forwarded-proto"], "https");
    assert_eq!(v["headers"]["host"], "localhost");

    let (status, version, v) = tls_get(&pki, addr, false, false).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(version, http::Version::HTTP_11);
    assert_eq!(v["headers"]["x-tls-alpn"], "http/1.1");
    assert_eq!(
        sink.0.load(Ordering::SeqCst),
        2,
        "one TLS record per handshake"
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_strict_requires_a_client_certificate() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let gw = gateway(
        dir.path(),
        &tls_yaml(up.addr, "STRICT"),
        opts(Arc::new(TlsCounter::default())),
    )
    .await;
    let addr = gw.listener_addr("tls").unwrap();

    let err = tls_get(&pki, addr, false, true).await;
    assert!(
        err.is_err(),
        "a client without a certificate must be refused: {err:?}"
    );

    let (status, _, v) = tls_get(&pki, addr, true, true).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v["headers"]["x-peer-principal"],
        "cluster.local/ns/shop/sa/frontend"
    );
    assert_eq!(v["headers"]["x-peer-namespace"], "shop");

    // Plaintext is refused too.
    let resp = raw(
        addr,
        b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(!resp.starts_with("HTTP/1.1 200"), "{resp}");
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_permissive_accepts_both_and_exposes_the_principal() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let gw = gateway(
        dir.path(),
        &tls_yaml(up.addr, "PERMISSIVE"),
        opts(Arc::new(TlsCounter::default())),
    )
    .await;
    let addr = gw.listener_addr("tls").unwrap();

    let (status, _, v) = tls_get(&pki, addr, true, true).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v["headers"]["x-peer-principal"],
        "cluster.local/ns/shop/sa/frontend"
    );

    let (status, _, v) = tls_get(&pki, addr, false, false).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(v["headers"].get("x-peer-principal").is_none(), "{v}");

    let resp = raw(
        addr,
        b"GET /plain HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(resp.contains(r#""x-forwarded-proto":"http""#), "{resp}");
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_upstream() {
    // An upstream that only speaks TLS (moat-tls acceptor in front of the echo server).
    let plain = upstream("tls-upstream").await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let acceptor =
        moat_tls::TlsAcceptor::new(&pki.server_tls_config(ClientAuthMode::Disable), dir.path())
            .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let tls_addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(moat_tls::Accepted::Tls { mut stream, .. }) = acceptor.accept(tcp).await {
                    if let Ok(mut back) = tokio::net::TcpStream::connect(plain.addr).await {
                        let _ = tokio::io::copy_bidirectional(&mut stream, &mut back).await;
                    }
                }
            });
        }
    });
    let yaml = format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: secure
    endpoints: ["{tls_addr}"]
    tls: {{ ca: ca.crt, sni: localhost }}
routes:
  - name: all
    cluster: secure
"#
    );
    let gw = gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    for _ in 0..3 {
        let (status, h, _) = get(&c, &format!("http://{addr}/x")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(h["x-upstream"], "tls-upstream");
    }
    gw.shutdown(Duration::from_secs(2)).await;
}
