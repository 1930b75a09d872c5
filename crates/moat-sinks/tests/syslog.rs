//! The syslog sink against a real rsyslog (Debian's rsyslogd, run in the foreground with
//! its own configuration in a temp dir): RFC 5424 over UDP, TCP and TLS, in each mapping.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use moat_testkit::rsyslog::{Rsyslog, TlsFiles};

/// rsyslogd with a UDP, a TCP and a TLS input (a certificate of a test CA, whose
/// certificate is `dir/ca.pem` for the sinks to trust).
fn rsyslog(dir: &Path) -> Option<Rsyslog> {
    let ca = moat_tls::testing::TestCa::new("syslog test CA");
    let server = ca.server_cert(&["localhost"]);
    let (cert, key) = server.write(dir, "server").unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.cert_pem()).unwrap();
    Rsyslog::start(
        dir,
        Some(TlsFiles {
            ca: &ca_file,
            cert: &cert,
            key: &key,
        }),
    )
}

fn lines(rs: &Rsyslog, n: usize) -> Vec<String> {
    rs.wait_until(Duration::from_secs(15), |l| l.len() >= n)
}

#[test]
fn rsyslog_receives_udp_tcp_and_tls_in_every_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let Some(rs) = rsyslog(dir.path()) else {
        return;
    };
    let yaml = format!(
        r#"sinks:
  - name: udp
    format: moat
    records: [security]
    syslog: {{ transport: udp, address: "127.0.0.1:{}", app_name: moat-udp }}
  - name: tcp
    format: ecs
    records: [security, access]
    syslog: {{ transport: tcp, address: "127.0.0.1:{}", app_name: moat-tcp, facility: authpriv }}
  - name: tls
    format: ocsf
    syslog: {{ transport: tls, address: "127.0.0.1:{}", app_name: moat-tls, tls: {{ ca_file: ca.pem, server_name: localhost }} }}
"#,
        rs.ports.udp, rs.ports.tcp, rs.ports.tls
    );
    let (queue, writer, metrics) = common::start(&yaml, dir.path());
    assert!(queue.push(common::security("r1", "10.0.0.1")));
    assert!(queue.push(common::access("r1", "10.0.0.1")));
    assert!(queue.push(common::tls()));
    // udp: 1 (security); tcp: 2 (security, access); tls: 3 (all)
    let got = lines(&rs, 6);
    writer.shutdown();
    let by_app = |app: &str| -> Vec<&String> {
        got.iter()
            .filter(|l| l.starts_with(&format!("{app}|")))
            .collect()
    };
    let udp = by_app("moat-udp");
    assert_eq!(udp.len(), 1, "{got:?}");
    // local0 (16) * 8 + warning (4) = 132: a block is a warning.
    assert!(udp[0].starts_with("moat-udp|security|132|"), "{}", udp[0]);
    let msg: serde_json::Value =
        serde_json::from_str(udp[0].splitn(4, '|').nth(3).unwrap()).unwrap();
    assert_eq!(msg["event"]["rule"], "sqli");
    assert_eq!(msg["request_id"], "r1");

    let tcp = by_app("moat-tcp");
    assert_eq!(tcp.len(), 2, "{got:?}");
    // authpriv (10) * 8 + info (6) = 86 for the access record.
    let access = tcp.iter().find(|l| l.contains("|access|")).unwrap();
    assert!(access.starts_with("moat-tcp|access|86|"), "{access}");
    let ecs: serde_json::Value =
        serde_json::from_str(access.splitn(4, '|').nth(3).unwrap()).unwrap();
    assert_eq!(ecs["http"]["response"]["status_code"], 200);
    assert_eq!(ecs["source"]["ip"], "10.0.0.1");
    assert_eq!(ecs["ecs"]["version"], moat_sinks::format::ECS_VERSION);

    let tls = by_app("moat-tls");
    assert_eq!(tls.len(), 3, "{got:?}");
    let hs = tls.iter().find(|l| l.contains("|tls|")).unwrap();
    let ocsf: serde_json::Value = serde_json::from_str(hs.splitn(4, '|').nth(3).unwrap()).unwrap();
    assert_eq!(ocsf["class_uid"], 4001);
    assert_eq!(ocsf["tls"]["version"], "1.3");
    // The crypto-auditing vocabulary of docs/tls.md travels unchanged.
    assert_eq!(ocsf["unmapped"]["tls"]["protocol_version"], 0x0304);
    assert_eq!(ocsf["unmapped"]["tls"]["key_exchange_group"], "X25519");
    let finding = tls.iter().find(|l| l.contains("|security|")).unwrap();
    let ocsf: serde_json::Value =
        serde_json::from_str(finding.splitn(4, '|').nth(3).unwrap()).unwrap();
    assert_eq!(ocsf["class_uid"], 2004);
    assert_eq!(ocsf["finding_info"]["analytic"]["uid"], "sqli");

    for sink in ["udp", "tcp", "tls"] {
        let s = metrics.get(sink).unwrap();
        assert_eq!(
            s.dropped.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "{sink}"
        );
    }
    assert_eq!(
        metrics
            .get("tls")
            .unwrap()
            .delivered
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[test]
fn tcp_sink_reconnects_after_the_receiver_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let Some(rs) = rsyslog(dir.path()) else {
        return;
    };
    let yaml = format!(
        "sinks:\n  - name: tcp\n    buffer: {{ retry_backoff: 20ms, retry_backoff_max: 200ms }}\n    syslog: {{ address: \"127.0.0.1:{}\" }}\n",
        rs.ports.tcp
    );
    let (queue, writer, metrics) = common::start(&yaml, dir.path());
    queue.push(common::access("before", "10.0.0.2"));
    lines(&rs, 1);
    let (ports, out) = (rs.ports, rs.out.clone());
    drop(rs);
    // Records pushed while the receiver is down wait in the sink's buffer.
    for i in 0..5 {
        assert!(queue.push(common::access(&format!("down-{i}"), "10.0.0.2")));
    }
    std::thread::sleep(Duration::from_millis(300));
    // The same ports again: a restarted receiver.
    let Some(rs) = Rsyslog::restart(dir.path(), ports, out) else {
        return;
    };
    queue.push(common::access("after", "10.0.0.2"));
    let got = lines(&rs, 7);
    writer.shutdown();
    let text = got.join("\n");
    for id in ["before", "down-0", "down-4", "after"] {
        assert!(
            text.contains(&format!("\"request_id\":\"{id}\"")),
            "{id} missing: {text}"
        );
    }
    let s = metrics.get("tcp").unwrap();
    assert_eq!(s.dropped.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert!(s.send_errors.load(std::sync::atomic::Ordering::Relaxed) >= 1);
}
