//! HTTP/2 conformance: h2spec (github.com/summerwind/h2spec, a real client, built by
//! `scripts/test-deps`) against a gateway with an h2c listener (HTTP/1.1 and HTTP/2
//! with prior knowledge on one port) and a TLS listener (ALPN `h2`).
//!
//! Every case passes but one, on h2c only: 3.5/2, "Sends invalid connection preface".
//! A plain-text port shared by HTTP/1.1 and HTTP/2 decides the protocol from the first
//! bytes: a connection that does not open with the HTTP/2 preface is HTTP/1.1, so an
//! invalid preface gets an HTTP/1.1 `400` instead of an HTTP/2 GOAWAY
//! (docs/fuzzing.md, "HTTP/2 conformance"). Over TLS the protocol is fixed by ALPN and
//! the case passes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{gateway, upstream};
use moat_proxy::GatewayOptions;
use moat_tls::testing::TestPki;

/// The one case allowed to fail, and only on the h2c listener (see the module docs).
const H2C_EXCEPTION: &str = "3.5/2";

fn yaml(upstream: std::net::SocketAddr) -> String {
    format!(
        r#"listeners:
  - name: h2c
    address: 127.0.0.1:0
  - name: tls
    address: 127.0.0.1:0
    tls:
      certificates: [{{ cert: server.crt, key: server.key }}]
      alpn: [h2, http/1.1]
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

/// One h2spec case from its JUnit report.
#[derive(Debug)]
struct Case {
    /// `section/number`, e.g. `http2/3.5/2` shortened to `3.5/2` for the http2 suite.
    id: String,
    title: String,
    passed: bool,
}

/// The value of `attr="..."` in `tag`.
fn attr<'a>(tag: &'a str, attr: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {attr}=\""))? + attr.len() + 3;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// Reads h2spec's JUnit report: one `<testcase>` per case, numbered within its
/// `<testsuite>` (the section); a case with a `<failure>` or `<error>` failed, a
/// `<skipped>` one is counted as failed too (nothing may be skipped).
fn parse_report(xml: &str) -> Vec<Case> {
    let mut cases = Vec::new();
    for suite in xml.split("<testsuite ").skip(1) {
        let package = attr(&format!(" {suite}"), "package")
            .unwrap_or("?")
            .to_string();
        let section = package
            .strip_prefix("http2/")
            .unwrap_or(&package)
            .to_string();
        for (i, case) in suite.split("<testcase ").skip(1).enumerate() {
            let head = &case[..case.find('>').unwrap_or(case.len())];
            let body = case.split("</testcase>").next().unwrap_or("");
            let title = attr(&format!(" {head}"), "classname")
                .unwrap_or("?")
                .to_string();
            let failed = !head.ends_with('/')
                && (body.contains("<failure")
                    || body.contains("<error")
                    || body.contains("<skipped"));
            cases.push(Case {
                id: format!("{section}/{}", i + 1),
                title,
                passed: !failed,
            });
        }
    }
    cases
}

/// Runs h2spec against `port` and returns its cases.
fn run_h2spec(h2spec: &Path, port: u16, tls: bool, report: PathBuf) -> Vec<Case> {
    let mut cmd = Command::new(h2spec);
    cmd.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-o", "2", "-j"])
        .arg(&report);
    if tls {
        cmd.args(["-t", "-k"]);
    }
    let out = cmd.output().expect("h2spec runs");
    let xml = std::fs::read_to_string(&report).unwrap_or_else(|e| {
        panic!(
            "h2spec wrote no report ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let cases = parse_report(&xml);
    assert!(
        cases.len() >= 140,
        "h2spec ran {} cases: {}",
        cases.len(),
        String::from_utf8_lossy(&out.stdout)
    );
    cases
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2spec_passes_on_h2c_and_tls_listeners() {
    let Some(h2spec) = moat_testkit::real_part(
        "h2spec",
        "scripts/ensure-go-tool h2spec github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible",
    ) else {
        return;
    };
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    TestPki::generate(dir.path()).unwrap();
    let gw = gateway(dir.path(), &yaml(up.addr), GatewayOptions::default()).await;
    let h2c = gw.listener_addr("h2c").unwrap().port();
    let tls = gw.listener_addr("tls").unwrap().port();

    // Both runs at once: most of h2spec's time is spent waiting for the server.
    let (a, b) = (h2spec.clone(), dir.path().to_path_buf());
    let plain = tokio::task::spawn_blocking(move || run_h2spec(&a, h2c, false, b.join("h2c.xml")));
    let (a, b) = (h2spec, dir.path().to_path_buf());
    let secure = tokio::task::spawn_blocking(move || run_h2spec(&a, tls, true, b.join("tls.xml")));
    let (plain, secure) = (plain.await.unwrap(), secure.await.unwrap());

    let failed = |cases: &[Case]| -> Vec<String> {
        cases
            .iter()
            .filter(|c| !c.passed)
            .map(|c| format!("{} {}", c.id, c.title))
            .collect()
    };
    let plain_failed = failed(&plain);
    let secure_failed = failed(&secure);
    eprintln!(
        "h2spec: h2c {}/{} passed, TLS {}/{} passed",
        plain.len() - plain_failed.len(),
        plain.len(),
        secure.len() - secure_failed.len(),
        secure.len()
    );
    assert!(secure_failed.is_empty(), "TLS listener: {secure_failed:#?}");
    assert!(
        plain_failed.len() <= 1
            && plain_failed
                .iter()
                .all(|c| c.starts_with(&format!("{H2C_EXCEPTION} "))),
        "h2c listener: {plain_failed:#?}"
    );
    assert_eq!(plain.len(), secure.len());
    gw.shutdown(Duration::from_secs(2)).await;
}
