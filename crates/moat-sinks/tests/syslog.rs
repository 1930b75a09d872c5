//! The syslog sink against a real rsyslog (Debian's rsyslogd, run in the foreground with
//! its own configuration in a temp dir): RFC 5424 over UDP, TCP and TLS, in each mapping,
//! and sinks added, changed and removed by a reload.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
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

/// A reload adds a sink (its records reach rsyslog), changes it (a new sink
/// thread with the new settings) and removes it (its thread ends); an entry that
/// only moved in the file is left running.
#[test]
fn a_reload_adds_changes_and_removes_a_sink() {
    let dir = tempfile::tempdir().unwrap();
    let Some(rs) = rsyslog(dir.path()) else {
        return;
    };
    let (queue, writer, telemetry) = common::start_telemetry("sinks: []\n", dir.path());
    assert!(queue.push(common::access("unseen", "10.0.0.9")));
    // The writer takes it (every 20 ms) before the sink exists: it goes nowhere.
    std::thread::sleep(Duration::from_millis(300));
    let sink = |app: &str| {
        format!(
            "sinks:\n  - name: rl\n    records: [access]\n    syslog: {{ address: \"127.0.0.1:{}\", app_name: {app} }}\n",
            rs.ports.tcp
        )
    };

    let (added, removed) = telemetry
        .prepare(&common::parse(&sink("first"), dir.path()), dir.path())
        .unwrap()
        .commit();
    assert_eq!((added, removed), (vec!["rl".to_string()], vec![]));
    // The thread names itself once it runs.
    common::wait_for(Duration::from_secs(5), || {
        common::thread_named("moat-sink-rl").then_some(())
    })
    .expect("no sink thread");
    let stats = telemetry.metrics().get("rl").unwrap();
    assert!(queue.push(common::access("added", "10.0.0.9")));
    let got = lines(&rs, 1);
    assert!(got[0].starts_with("first|access|"), "{got:?}");
    assert!(got[0].contains("\"request_id\":\"added\""), "{got:?}");

    // The same entry two lines further down: nothing restarts.
    let moved = format!("# moved\n\n{}", sink("first"));
    let (added, removed) = telemetry
        .prepare(&common::parse(&moved, dir.path()), dir.path())
        .unwrap()
        .commit();
    assert!(added.is_empty() && removed.is_empty());
    assert!(Arc::ptr_eq(&stats, &telemetry.metrics().get("rl").unwrap()));

    // A changed entry: the old thread delivers and ends, a new one takes over.
    let (added, removed) = telemetry
        .prepare(&common::parse(&sink("second"), dir.path()), dir.path())
        .unwrap()
        .commit();
    assert_eq!((added.len(), removed.len()), (1, 1));
    assert!(queue.push(common::access("changed", "10.0.0.9")));
    let got = lines(&rs, 2);
    assert!(got[1].starts_with("second|access|"), "{got:?}");
    assert_eq!(stats.delivered.load(Ordering::Relaxed), 1);

    // Removed: its thread ends, its series go, its records go nowhere.
    let (added, removed) = telemetry
        .prepare(&common::parse("sinks: []\n", dir.path()), dir.path())
        .unwrap()
        .commit();
    assert_eq!((added, removed), (vec![], vec!["rl".to_string()]));
    common::wait_for(Duration::from_secs(5), || {
        (!common::thread_named("moat-sink-rl")).then_some(())
    })
    .expect("the removed sink's thread is still running");
    assert!(telemetry.metrics().get("rl").is_none());
    assert!(queue.push(common::access("removed", "10.0.0.9")));
    std::thread::sleep(Duration::from_millis(300));
    writer.shutdown();
    let text = std::fs::read_to_string(&rs.out).unwrap();
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        !text.contains("unseen") && !text.contains("\"removed\""),
        "{text}"
    );
}

/// A sink that cannot start (its CA file is missing) refuses the whole change:
/// nothing running is touched and nothing new is left running.
#[test]
fn a_reload_with_a_sink_that_cannot_start_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let port = moat_testkit::free_port().unwrap();
    let (_queue, writer, telemetry) = common::start_telemetry(
        &format!("sinks:\n  - name: ok1\n    syslog: {{ address: \"127.0.0.1:{port}\" }}\n"),
        dir.path(),
    );
    let yaml = format!(
        "sinks:\n  - name: new1\n    syslog: {{ address: \"127.0.0.1:{port}\" }}\n  - name: bad1\n    syslog: {{ transport: tls, address: \"127.0.0.1:{port}\", tls: {{ ca_file: missing.pem }} }}\n"
    );
    let err = telemetry
        .prepare(&common::parse(&yaml, dir.path()), dir.path())
        .unwrap_err();
    assert!(err.to_string().starts_with("sink `bad1`: "), "{err}");
    assert!(telemetry.metrics().get("ok1").is_some());
    assert!(telemetry.metrics().get("new1").is_none());
    common::wait_for(Duration::from_secs(5), || {
        (!common::thread_named("moat-sink-new1")).then_some(())
    })
    .expect("the sink started for the refused change still runs");
    common::wait_for(Duration::from_secs(5), || {
        common::thread_named("moat-sink-ok1").then_some(())
    })
    .expect("the running sink stopped");
    writer.shutdown();
    assert!(!common::thread_named("moat-sink-ok1"));
}
