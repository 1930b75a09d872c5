//! The TLS page's certificate expiry comes from the audit records of real handshakes:
//! a listener serving a certificate that expires in 5 days, a client connecting over
//! TLS, and the page flags the certificate from the stored record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moat_proxy::config::{self, ConfigSource};
use moat_proxy::events::QueueSink;
use moat_proxy::{AdminRouter, Gateway, GatewayOptions};
use moat_tls::rustls;
use moat_tls::testing::{client_config, TestCa};

const TOKEN: &str = "tls-page-token";

fn get(addr: SocketAddr, path: &str, cookie: Option<&str>, body: Option<&str>) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let (method, extra) = match body {
        Some(b) => (
            "POST",
            format!(
                "origin: http://{addr}\r\ncontent-type: application/x-www-form-urlencoded\r\n\
                 content-length: {}\r\n\r\n{b}",
                b.len()
            ),
        ),
        None => ("GET", "\r\n".to_string()),
    };
    let cookie = cookie
        .map(|c| format!("cookie: {c}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n{cookie}{extra}"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// One TLS request through the listener, as a real client does it.
fn tls_request(addr: SocketAddr, config: Arc<rustls::ClientConfig>, name: &str) {
    let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let conn = rustls::ClientConnection::new(config, server_name).unwrap();
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    write!(
        tls,
        "GET / HTTP/1.1\r\nhost: {name}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    // The upstream is down (502); the handshake is what matters.
    let _ = tls.read_to_end(&mut out);
    assert!(
        out.starts_with(b"HTTP/1.1 "),
        "{}",
        String::from_utf8_lossy(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_page_flags_a_certificate_expiring_soon_from_the_audit_records() {
    let dir = tempfile::tempdir().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let ca = TestCa::new("console test CA");
    let soon = ca.server_cert_until(&["soon.moat.test"], now + 5 * 86_400 + 3_600);
    soon.write(dir.path(), "soon").unwrap();
    let yaml = format!(
        "listeners:\n  - name: main\n    address: 127.0.0.1:0\n    tls:\n      \
         certificates: [{{ cert: soon.crt, key: soon.key }}]\n\
         admin:\n  address: 127.0.0.1:0\n  token: {TOKEN}\n\
         clusters:\n  - name: app\n    endpoints: [\"127.0.0.1:9\"]\n\
         routes:\n  - name: api\n    cluster: app\n\
         events:\n  sink: {{ type: none }}\n  store: {{ path: events.db }}\n\
         tls_audit: {{ enabled: true }}\n"
    );
    let src = ConfigSource {
        file: "<test>".into(),
        base_dir: dir.path().to_path_buf(),
    };
    let cfg = config::parse(&src, &yaml).unwrap();
    // The event writer `moat serve` starts: TLS records into the store.
    let (sink, writer) = QueueSink::start(&cfg.events, dir.path()).unwrap();
    let opts = GatewayOptions {
        events: Some(sink),
        admin: moat_console::console_routes(
            AdminRouter::new(),
            writer.store_path().map(Into::into),
        ),
        ..GatewayOptions::default()
    };
    let gw = Gateway::new(cfg, src, opts).unwrap().start().await.unwrap();
    let (admin, listener) = (gw.admin_addr(), gw.listener_addr("main").unwrap());
    let client = client_config(&ca, None, &[], &[]);
    tokio::task::spawn_blocking(move || {
        tls_request(listener, client, "soon.moat.test");
        let login = get(
            admin,
            "/console/login",
            None,
            Some(&format!("token={TOKEN}")),
        );
        let cookie = login
            .lines()
            .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
            .and_then(|l| l["set-cookie:".len()..].split(';').next())
            .map(str::trim)
            .expect("session cookie")
            .to_string();
        // The writer stores the record within its batch interval.
        let deadline = Instant::now() + Duration::from_secs(10);
        let page = loop {
            let page = get(admin, "/console/tls", Some(&cookie), None);
            if page.contains("CN=soon.moat.test") || Instant::now() > deadline {
                break page;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(page.contains("CN=soon.moat.test"), "{page}");
        assert!(page.contains("id=\"expiring\""), "{page}");
        assert!(
            page.contains("<td class=\"bad\">5</td>"),
            "5 days left, flagged: {page}"
        );
        assert!(
            page.contains("soon.moat.test "),
            "the SNI it was served for"
        );
    })
    .await
    .unwrap();
    gw.shutdown(Duration::from_secs(1)).await;
    writer.shutdown();
}
