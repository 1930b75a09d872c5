//! TLS handshake audit through the gateway: a TLS 1.2 and a TLS 1.3 client handshake
//! (real sockets, real certificates) each produce one `tls` record with the negotiated
//! version, cipher suite, group, SNI, ALPN and client address, written by the events
//! writer to the JSON-lines sink and to the store (`GET /v1/events?type=tls`).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, gateway_from, get, json, upstream};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use moat_proxy::admin::AdminRouter;
use moat_proxy::config;
use moat_proxy::events::QueueSink;
use moat_proxy::GatewayOptions;
use moat_tls::rustls::{self, SupportedProtocolVersion};
use moat_tls::testing::TestPki;
use moat_tls::tokio_rustls::TlsConnector;
use rustls_pki_types::ServerName;
use serde_json::Value;

fn yaml(up: SocketAddr) -> String {
    format!(
        r#"listeners:
  - name: tls
    address: 127.0.0.1:0
    tls:
      certificates: [{{ cert: server.crt, key: server.key }}]
      alpn: [h2, http/1.1]
      client_auth: {{ mode: PERMISSIVE, ca: ca.crt }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{up}"]
routes:
  - name: all
    cluster: app
tls_audit: {{ enabled: true }}
events:
  sink: {{ type: file, path: events.jsonl }}
  store: {{ path: events.db, batch_interval: 100ms }}
"#
    )
}

/// What the client saw of one handshake.
struct ClientSide {
    local: SocketAddr,
    version: u16,
    suite: u16,
    suite_name: String,
    alpn: String,
}

/// Handshakes with the given version and ALPN, then sends one request on the connection.
async fn handshake_and_get(
    pki: &TestPki,
    addr: SocketAddr,
    version: &'static SupportedProtocolVersion,
    alpn: &str,
    with_cert: bool,
) -> ClientSide {
    let cfg = moat_tls::testing::client_config(
        &pki.ca,
        with_cert.then_some(&pki.client),
        &[alpn],
        &[version],
    );
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let local = tcp.local_addr().unwrap();
    let tls = TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let conn = tls.get_ref().1;
    let side = ClientSide {
        local,
        version: u16::from(conn.protocol_version().unwrap()),
        suite: u16::from(conn.negotiated_cipher_suite().unwrap().suite()),
        suite_name: format!("{:?}", conn.negotiated_cipher_suite().unwrap().suite())
            .replacen("TLS13_", "TLS_", 1),
        alpn: String::from_utf8(conn.alpn_protocol().unwrap().to_vec()).unwrap(),
    };
    let io = TokioIo::new(tls);
    let status = if alpn == "h2" {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        let req = Request::get("https://localhost/audited")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        status
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        let req = Request::get("/audited")
            .header("host", "localhost")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = send.send_request(req).await.unwrap();
        let status = resp.status();
        let _ = resp.into_body().collect().await;
        status
    };
    assert_eq!(status, StatusCode::OK);
    side
}

/// The `tls` records of the JSON-lines sink.
fn tls_lines(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "tls")
        .collect()
}

/// The handshake record of `side` among `records`, checked field by field.
fn check(records: &[Value], side: &ClientSide, with_cert: bool) {
    let rec = records
        .iter()
        .find(|r| r["handshake"]["peer_addr"] == side.local.to_string())
        .unwrap_or_else(|| panic!("no record for {}: {records:?}", side.local));
    let hs = &rec["handshake"];
    assert_eq!(hs["role"], "server", "{hs}");
    assert_eq!(hs["protocol_version"], side.version, "{hs}");
    assert_eq!(hs["ciphersuite"], side.suite, "{hs}");
    // IANA names (rustls spells the TLS 1.3 ones `TLS13_...`).
    assert_eq!(hs["ciphersuite_name"], side.suite_name.as_str(), "{hs}");
    assert!(
        hs["signature_algorithm"]
            .as_str()
            .is_some_and(|g| !g.is_empty()),
        "{hs}"
    );
    assert!(
        hs["key_exchange_group"]
            .as_str()
            .is_some_and(|g| !g.is_empty()),
        "{hs}"
    );
    assert_eq!(hs["sni"], "localhost", "{hs}");
    assert_eq!(hs["alpn"], side.alpn.as_str(), "{hs}");
    assert_eq!(hs["resumed"], false, "{hs}");
    if with_cert {
        let sans = hs["peer"]["sans"].to_string();
        assert!(
            sans.contains("spiffe://cluster.local/ns/shop/sa/frontend"),
            "{hs}"
        );
    } else {
        assert!(hs["peer"].is_null(), "{hs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_and_tls13_handshakes_are_audited_in_the_sink_and_the_store() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let file = dir.path().join("moat.yaml");
    std::fs::write(&file, yaml(up.addr)).unwrap();
    let (cfg, src) = config::load_file(&file).unwrap();
    let (sink, writer) = QueueSink::start(&cfg.events, &src.base_dir).unwrap();
    let store = writer.store_path().map(|p| p.to_path_buf());
    assert!(store.is_some());
    let opts = GatewayOptions {
        events: Some(sink as Arc<dyn moat_proxy::EventSink>),
        admin: moat_proxy::engine_api::engine_routes(AdminRouter::new(), store),
        ..GatewayOptions::default()
    };
    let gw = gateway_from(cfg, src, opts).await;
    let addr = gw.listener_addr("tls").unwrap();

    let v12 = handshake_and_get(&pki, addr, &rustls::version::TLS12, "http/1.1", true).await;
    assert_eq!(v12.version, 0x0303);
    assert_eq!(v12.alpn, "http/1.1");
    let v13 = handshake_and_get(&pki, addr, &rustls::version::TLS13, "h2", false).await;
    assert_eq!(v13.version, 0x0304);
    assert_eq!(v13.alpn, "h2");

    // The JSON-lines sink.
    let jsonl = dir.path().join("events.jsonl");
    let deadline = Instant::now() + Duration::from_secs(20);
    let lines = loop {
        let lines = tls_lines(&jsonl);
        if lines.len() >= 2 || Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(lines.len(), 2, "one record per handshake: {lines:?}");
    check(&lines, &v12, true);
    check(&lines, &v13, false);

    // The store, through the admin API.
    let c = client();
    let url = format!("http://{}/v1/events?type=tls", gw.admin_addr());
    let deadline = Instant::now() + Duration::from_secs(20);
    let events = loop {
        let (s, _, body) = get(&c, &url).await;
        assert_eq!(s, StatusCode::OK);
        let v = json(&body);
        let events = v["events"].as_array().cloned().unwrap_or_default();
        if events.len() >= 2 || Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(events.len(), 2, "{events:?}");
    check(&events, &v12, true);
    check(&events, &v13, false);

    // /metrics counts the handshakes by version, cipher suite and group.
    let (s, _, body) = get(&c, &format!("http://{}/metrics", gw.admin_addr())).await;
    assert_eq!(s, StatusCode::OK);
    let text = String::from_utf8_lossy(&body);
    let handshakes: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("moat_tls_handshakes_total{"))
        .collect();
    assert!(
        handshakes.iter().any(|l| l.contains("version=\"TLSv1.2\"")),
        "{handshakes:?}"
    );
    assert!(
        handshakes.iter().any(|l| l.contains("version=\"TLSv1.3\"")),
        "{handshakes:?}"
    );

    gw.shutdown(Duration::from_secs(2)).await;
    writer.shutdown();
}
