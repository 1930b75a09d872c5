//! Istio `action: CUSTOM` with `includeRequestBodyInCheck`, with TLS to the provider,
//! and on TCP listeners, against real external authorizers:
//!
//! * Open Policy Agent with its Envoy plugin over gRPC (`envoyExtAuthzGrpc`), a Rego
//!   policy that reads the body (`parsed_body`, `truncated_body`, `rawBody`);
//! * OPA's own HTTP server over HTTP (`envoyExtAuthzHttp` with `pathPrefix:
//!   /v0/data/...`: the check request's body is the policy's input, a defined rule
//!   answers 200, an undefined one 404), in plain text and behind mutual TLS
//!   (`--tls-cert-file`, `--authentication=tls`);
//! * gRPC with TLS: OPA's Envoy plugin has no TLS of its own, so the TLS gRPC provider
//!   is another moat's decision listener with mutual TLS (a real server too: tonic and
//!   rustls, moat's own listener code);
//! * TCP: OPA's Envoy plugin checks connections (Envoy's network ext_authz: source and
//!   destination addresses, the client certificate's SPIFFE principal).
//!
//! The upstream always gets the whole body, unchanged, whatever the provider was sent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::{client, get, send, upstream};
use http::StatusCode;
use http_body_util::Full;
use moat_proxy::GatewayOptions;
use moat_testkit::{free_port, real_part_in, wait_for_port, ChildGuard};
use moat_tls::testing::TestPki;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// The gRPC policy: a JSON body with `amount` up to 100 is allowed (the amount goes
/// upstream in a header, with the field the body came in); a body OPA was told is
/// partial is allowed with a header saying so; everything else is denied.
const REGO_GRPC: &str = r#"package envoy.authz

default result := {"allowed": false, "http_status": 403, "body": "denied by opa"}

field := "raw" if {
	count(input.attributes.request.http.rawBody) > 0
} else := "text"

result := {"allowed": true, "headers": {"x-opa-amount": format_int(input.parsed_body.amount, 10), "x-opa-field": field}} if {
	input.parsed_body.amount <= 100
}

result := {"allowed": true, "headers": {"x-opa-truncated": "yes", "x-opa-partial": input.attributes.request.http.headers["x-envoy-auth-partial-body"]}} if {
	input.truncated_body
}

# TCP connections (no request): on 127.0.0.1 only from 127.0.0.1, on 127.0.0.3 only
# with the frontend's certificate.
tcp_ok if {
	input.attributes.destination.address.socketAddress.address == "127.0.0.1"
	input.attributes.source.address.socketAddress.address == "127.0.0.1"
}

tcp_ok if {
	input.attributes.destination.address.socketAddress.address == "127.0.0.3"
	input.attributes.source.principal == "spiffe://cluster.local/ns/shop/sa/frontend"
}

result := {"allowed": true} if {
	not input.attributes.request.http
	tcp_ok
}
"#;

/// The HTTP policy, read through OPA's v0 data API: `POST /v0/data/httpapi/http/pay`
/// with the check's body as input is defined (200) for an amount up to 100.
const REGO_HTTP: &str = r#"package httpapi.http

pay := true if {
	input.amount <= 100
}
"#;

const POLICIES: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: body-grpc, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: opa-grpc }
  rules: [{ to: [{ operation: { paths: ["/grpc/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: body-partial, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: opa-partial }
  rules: [{ to: [{ operation: { paths: ["/partial/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: body-bytes, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: opa-bytes }
  rules: [{ to: [{ operation: { paths: ["/bytes/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: body-http, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: opa-http }
  rules: [{ to: [{ operation: { paths: ["/http/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: deny-blocked, namespace: shop }
spec:
  action: DENY
  rules: [{ to: [{ operation: { paths: ["/grpc/blocked"] } }] }]
"#;

fn opa() -> Option<std::path::PathBuf> {
    let tools = moat_testkit::tools_dir();
    real_part_in(
        "opa-envoy-plugin",
        &[tools.as_path()],
        "scripts/ensure-extauthz-tools",
    )
}

/// Starts OPA on `rest` (its HTTP API) and, with `grpc`, its Envoy plugin; `tls`: the
/// HTTP API behind mutual TLS with the PKI in `dir`.
fn start_opa(bin: &Path, dir: &Path, rest: u16, grpc: Option<u16>, tls: bool) -> ChildGuard {
    std::fs::write(dir.join("grpc.rego"), REGO_GRPC).unwrap();
    std::fs::write(dir.join("http.rego"), REGO_HTTP).unwrap();
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--server", "--log-level", "error"])
        .arg(format!("--addr=127.0.0.1:{rest}"))
        .arg("--set=decision_logs.console=false");
    if let Some(grpc) = grpc {
        cmd.arg(format!(
            "--set=plugins.envoy_ext_authz_grpc.addr=127.0.0.1:{grpc}"
        ))
        .arg("--set=plugins.envoy_ext_authz_grpc.path=envoy/authz/result");
    }
    if tls {
        cmd.arg(format!(
            "--tls-cert-file={}",
            dir.join("server.crt").display()
        ))
        .arg(format!(
            "--tls-private-key-file={}",
            dir.join("server.key").display()
        ))
        .arg(format!(
            "--tls-ca-cert-file={}",
            dir.join("ca.crt").display()
        ))
        .arg("--authentication=tls");
    }
    let child = cmd
        .arg(dir.join("grpc.rego"))
        .arg(dir.join("http.rego"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard(child);
    for port in [Some(rest), grpc].into_iter().flatten() {
        assert!(
            wait_for_port(port, Duration::from_secs(20)),
            "OPA did not listen on {port}"
        );
    }
    guard
}

async fn post(
    c: &common::TestClient,
    url: &str,
    body: impl Into<Bytes>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap();
    send(c, req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_body_in_check_with_opa() {
    let Some(opa) = opa() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (rest, grpc) = (free_port().unwrap(), free_port().unwrap());
    let _opa = start_opa(&opa, dir.path(), rest, Some(grpc), false);

    let up = upstream("app").await;
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).unwrap();
    let yaml = format!(
        r#"listeners:
  - {{ name: main, address: 127.0.0.1:0 }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: app, endpoints: ["{up}"], namespace: shop }}
routes:
  - {{ name: all, cluster: app }}
authz:
  enabled: true
  policies: [policies.yaml]
  extension_providers:
    - name: opa-grpc
      envoyExtAuthzGrpc:
        service: 127.0.0.1
        port: {grpc}
        timeout: 5s
        includeRequestBodyInCheck: {{ maxRequestBytes: 64 }}
    - name: opa-partial
      envoyExtAuthzGrpc:
        service: 127.0.0.1
        port: {grpc}
        timeout: 5s
        includeRequestBodyInCheck: {{ maxRequestBytes: 64, allowPartialMessage: true }}
    - name: opa-bytes
      envoyExtAuthzGrpc:
        service: 127.0.0.1
        port: {grpc}
        timeout: 5s
        includeRequestBodyInCheck: {{ maxRequestBytes: 64, packAsBytes: true }}
    - name: opa-http
      envoyExtAuthzHttp:
        service: 127.0.0.1
        port: {rest}
        timeout: 5s
        pathPrefix: /v0/data/httpapi
        includeRequestBodyInCheck: {{ maxRequestBytes: 64 }}
"#,
        up = up.addr
    );
    let gw = common::gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let base = format!("http://{}", gw.listener_addr("main").unwrap());
    let c = client();

    // gRPC: the body within the limit reaches OPA, which decides on it.
    let small = r#"{"amount": 42}"#;
    let (s, _, b) = post(&c, &format!("{base}/grpc/pay"), small).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    let echo = common::json(&b);
    assert_eq!(echo["headers"]["x-opa-amount"], "42");
    assert_eq!(echo["headers"]["x-opa-field"], "text");
    assert_eq!(echo["body"], small, "the upstream gets the body unchanged");
    let (s, _, b) = post(&c, &format!("{base}/grpc/pay"), r#"{"amount": 500}"#).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(&b[..], b"denied by opa");
    // packAsBytes: the same decision from `raw_body`.
    let (s, _, b) = post(&c, &format!("{base}/bytes/pay"), small).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    assert_eq!(common::json(&b)["headers"]["x-opa-field"], "raw");
    let (s, _, _) = post(&c, &format!("{base}/bytes/pay"), r#"{"amount": 500}"#).await;
    assert_eq!(s, StatusCode::FORBIDDEN);

    // Over the limit: 413 from moat without allowPartialMessage...
    let big = format!(r#"{{"amount": 1, "pad": "{}"}}"#, "x".repeat(100_000));
    let (s, _, _) = post(&c, &format!("{base}/grpc/pay"), big.clone()).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    // ... and the first 64 bytes, marked partial, with it; the upstream still gets all.
    let (s, _, b) = post(&c, &format!("{base}/partial/pay"), big.clone()).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    let echo = common::json(&b);
    assert_eq!(echo["headers"]["x-opa-truncated"], "yes");
    assert_eq!(echo["headers"]["x-opa-partial"], "true");
    assert_eq!(echo["body_len"], big.len());
    assert_eq!(echo["body"], big.as_str());
    // Exactly the limit is not partial: OPA parses it.
    let frame = r#"{"amount": 7, "pad": ""}"#.len();
    let exact = format!(r#"{{"amount": 7, "pad": "{}"}}"#, "y".repeat(64 - frame));
    assert_eq!(exact.len(), 64);
    let (s, _, b) = post(&c, &format!("{base}/grpc/pay"), exact.clone()).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    assert_eq!(common::json(&b)["headers"]["x-opa-amount"], "7");
    // A body-less request gets an empty body in the check (OPA: no amount, denied).
    let (s, _, _) = get(&c, &format!("{base}/grpc/pay")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // CUSTOM allows first, then DENY applies (Istio's order), after the body was read.
    let (s, _, b) = post(&c, &format!("{base}/grpc/blocked"), small).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(&b[..], b"RBAC: access denied");
    let (s, _, b) = post(&c, &format!("{base}/grpc/blocked"), r#"{"amount": 500}"#).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(&b[..], b"denied by opa", "CUSTOM's denial comes first");

    // HTTP: OPA's data API decides on the body the check carries.
    let (s, _, b) = post(&c, &format!("{base}/http/pay"), small).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    assert_eq!(common::json(&b)["body"], small);
    let (s, _, _) = post(&c, &format!("{base}/http/pay"), r#"{"amount": 500}"#).await;
    assert_eq!(
        s,
        StatusCode::NOT_FOUND,
        "OPA's undefined decision is its 404"
    );
    let (s, _, _) = post(&c, &format!("{base}/http/pay"), big).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
}

/// TLS to providers (a moat extension): OPA's HTTP API behind mutual TLS, and a moat
/// decision listener with mutual TLS over gRPC. Without the client certificate, or
/// without the private CA, the call fails and `statusOnError` applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_providers() {
    let Some(opa) = opa() else { return };
    let dir = tempfile::tempdir().unwrap();
    TestPki::generate(dir.path()).unwrap();
    let rest = free_port().unwrap();
    let _opa = start_opa(&opa, dir.path(), rest, None, true);

    // The gRPC provider: moat's decision listener with the WAF, mutual TLS.
    let waf_dir = tempfile::tempdir().unwrap();
    for f in ["ca.crt", "server.crt", "server.key"] {
        std::fs::copy(dir.path().join(f), waf_dir.path().join(f)).unwrap();
    }
    let waf_gw = common::gateway(
        waf_dir.path(),
        r#"listeners:
  - name: authz
    address: 127.0.0.1:0
    protocol: decision
    tls:
      certificates: [{ cert: server.crt, key: server.key }]
      client_auth: { mode: STRICT, ca: ca.crt }
admin: { address: 127.0.0.1:0 }
waf: { enabled: true, mode: block }
"#,
        GatewayOptions::default(),
    )
    .await;
    let waf_port = waf_gw.listener_addr("authz").unwrap().port();

    let up = upstream("app").await;
    let policies = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: tls, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: opa-tls }
  rules: [{ to: [{ operation: { paths: ["/http/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: no-cert, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: opa-no-cert }
  rules: [{ to: [{ operation: { paths: ["/nocert/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: public-roots, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: opa-public-roots }
  rules: [{ to: [{ operation: { paths: ["/roots/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: grpc-tls, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: moat-grpc-tls }
  rules: [{ to: [{ operation: { paths: ["/waf/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: grpc-no-cert, namespace: shop }
spec:
  action: CUSTOM
  provider: { name: moat-grpc-no-cert }
  rules: [{ to: [{ operation: { paths: ["/wafnocert/*"] } }] }]
"#;
    std::fs::write(dir.path().join("policies.yaml"), policies).unwrap();
    let tls = "{ ca: ca.crt, sni: localhost, client_cert: client.crt, client_key: client.key }";
    let yaml = format!(
        r#"listeners:
  - {{ name: main, address: 127.0.0.1:0 }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: app, endpoints: ["{up}"], namespace: shop }}
routes:
  - {{ name: all, cluster: app }}
authz:
  enabled: true
  policies: [policies.yaml]
  extension_providers:
    - name: opa-tls
      envoyExtAuthzHttp:
        service: 127.0.0.1
        port: {rest}
        timeout: 5s
        statusOnError: "503"
        pathPrefix: /v0/data/httpapi
        includeRequestBodyInCheck: {{ maxRequestBytes: 1024 }}
        tls: {tls}
    - name: opa-no-cert
      envoyExtAuthzHttp:
        service: 127.0.0.1
        port: {rest}
        timeout: 5s
        statusOnError: "503"
        pathPrefix: /v0/data/httpapi
        tls: {{ ca: ca.crt, sni: localhost }}
    - name: opa-public-roots
      envoyExtAuthzHttp:
        service: 127.0.0.1
        port: {rest}
        timeout: 5s
        statusOnError: "503"
        pathPrefix: /v0/data/httpapi
        tls: {{ sni: localhost, client_cert: client.crt, client_key: client.key }}
    - name: moat-grpc-tls
      envoyExtAuthzGrpc:
        service: 127.0.0.1
        port: {waf_port}
        timeout: 5s
        statusOnError: "503"
        tls: {tls}
    - name: moat-grpc-no-cert
      envoyExtAuthzGrpc:
        service: 127.0.0.1
        port: {waf_port}
        timeout: 5s
        statusOnError: "503"
        tls: {{ ca: ca.crt, sni: localhost }}
"#,
        up = up.addr
    );
    let gw = common::gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let base = format!("http://{}", gw.listener_addr("main").unwrap());
    let c = client();

    // HTTP over mutual TLS to OPA, with the body.
    let (s, _, b) = post(&c, &format!("{base}/http/pay"), r#"{"amount": 3}"#).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    let (s, _, _) = post(&c, &format!("{base}/http/pay"), r#"{"amount": 300}"#).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // OPA refuses a client without a certificate; moat refuses OPA's certificate
    // against the public roots.
    let (s, _, b) = post(&c, &format!("{base}/nocert/http/pay"), "{}").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b:?}");
    let (s, _, b) = post(&c, &format!("{base}/roots/http/pay"), "{}").await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b:?}");

    // gRPC over mutual TLS to moat's decision listener: its WAF decides.
    let (s, _, b) = get(&c, &format!("{base}/waf/search?q=shoes")).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    let sqli = "1%27%20UNION%20SELECT%20username%2C%20password%20FROM%20users--";
    let (s, h, _) = get(&c, &format!("{base}/waf/search?q={sqli}")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(h.contains_key("x-moat-event-id"), "{h:?}");
    let (s, _, _) = get(&c, &format!("{base}/wafnocert/search?q=shoes")).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
}

/// A bad body limit or an unloadable `tls` section is a config error naming the field.
#[tokio::test]
async fn provider_body_and_tls_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("moat.yaml");
    for (bad, want) in [
        (
            "{ name: x, envoyExtAuthzGrpc: { service: a, port: 1, includeRequestBodyInCheck: { maxRequestBytes: 0 } } }",
            "maxRequestBytes must be 1 to",
        ),
        (
            "{ name: x, envoyExtAuthzHttp: { service: a, port: 1, includeRequestBodyInCheck: { maxRequestBytes: 99999999 } } }",
            "maxRequestBytes must be 1 to",
        ),
        (
            "{ name: x, envoyExtAuthzGrpc: { service: a, port: 1, tls: { ca: missing.crt } } }",
            "missing.crt",
        ),
        (
            "{ name: x, envoyExtAuthzGrpc: { service: a, port: 1, tls: { client_cert: c.crt } } }",
            "client_key",
        ),
    ] {
        common::assert_provider_error(&file, bad, want);
    }
    // An unknown field inside includeRequestBodyInCheck is refused where it is.
    let yaml = "listeners: []\nadmin: { address: 127.0.0.1:0 }\nauthz:\n  enabled: true\n  extension_providers:\n    - name: x\n      envoyExtAuthzGrpc: { service: a, port: 1, includeRequestBodyInCheck: { maxRequestByte: 5 } }\n";
    std::fs::write(&file, yaml).unwrap();
    let err = moat_proxy::config::load_file(&file)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("moat.yaml:7:"), "{err}");
    assert!(err.contains("maxRequestByte"), "{err}");
}

/// A TCP upstream: reads to the client's half-close, answers `up:` and what it read.
async fn tcp_upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut got = b"up:".to_vec();
                if s.read_to_end(&mut got).await.is_ok() {
                    let _ = s.write_all(&got).await;
                }
            });
        }
    });
    addr
}

/// Sends `msg`, half-closes, reads to the end: `None` when closed without an answer.
async fn exchange<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, msg: &[u8]) -> Option<Vec<u8>> {
    let _ = s.write_all(msg).await;
    let _ = s.shutdown().await;
    let mut got = Vec::new();
    match s.read_to_end(&mut got).await {
        Ok(_) if !got.is_empty() => Some(got),
        _ => None,
    }
}

/// A plain connection to `to` from the loopback address `from`.
async fn from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from((from, 0))).unwrap();
    s.connect(to).await.unwrap()
}

/// CUSTOM on TCP listeners: OPA's Envoy plugin decides on the connection's source
/// address and on its client certificate's principal; a denial closes the connection
/// before any upstream connect. An HTTP provider cannot check a connection: closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_on_tcp_listeners_with_opa() {
    let Some(opa) = opa() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let (rest, grpc) = (free_port().unwrap(), free_port().unwrap());
    let _opa = start_opa(&opa, dir.path(), rest, Some(grpc), false);
    let up = tcp_upstream().await;
    // The rule names a path: on TCP its HTTP-only conditions are dropped (as Istio
    // builds CUSTOM for a TCP filter chain), so every connection is checked.
    let policies = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: tcp, namespace: data }
spec:
  selector: { matchLabels: { app: db } }
  action: CUSTOM
  provider: { name: opa-grpc }
  rules: [{ to: [{ operation: { paths: ["/ignored-on-tcp"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: tcp-http, namespace: data }
spec:
  selector: { matchLabels: { app: web } }
  action: CUSTOM
  provider: { name: opa-http }
  rules: [{}]
"#;
    std::fs::write(dir.path().join("policies.yaml"), policies).unwrap();
    let yaml = format!(
        r#"listeners:
  - {{ name: db, address: 127.0.0.1:0, protocol: tcp, cluster: db }}
  - name: secure
    address: 127.0.0.3:0
    protocol: tcp
    cluster: db
    tls:
      certificates: [{{ cert: server.crt, key: server.key }}]
      client_auth: {{ mode: PERMISSIVE, ca: ca.crt }}
  - {{ name: web, address: 127.0.0.1:0, protocol: tcp, cluster: web }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: db, endpoints: ["{up}"], labels: {{ app: db }}, namespace: data }}
  - {{ name: web, endpoints: ["{up}"], labels: {{ app: web }}, namespace: data }}
authz:
  enabled: true
  policies: [policies.yaml]
  extension_providers:
    - {{ name: opa-grpc, envoyExtAuthzGrpc: {{ service: 127.0.0.1, port: {grpc}, timeout: 5s }} }}
    - {{ name: opa-http, envoyExtAuthzHttp: {{ service: 127.0.0.1, port: {rest}, timeout: 5s }} }}
"#
    );
    let gw = common::gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let db = gw.listener_addr("db").unwrap();
    let secure = gw.listener_addr("secure").unwrap();

    // By source: 127.0.0.1 is allowed, 127.0.0.2 is closed.
    let got = exchange(from([127, 0, 0, 1], db).await, b"hello").await;
    assert_eq!(got.as_deref(), Some(&b"up:hello"[..]));
    let got = exchange(from([127, 0, 0, 2], db).await, b"hello").await;
    assert_eq!(got, None, "OPA denies 127.0.0.2");

    // By principal: the frontend's certificate is allowed, plaintext is closed.
    let tcp = TcpStream::connect(secure).await.unwrap();
    let tls = moat_tls::tokio_rustls::TlsConnector::from(pki.client_config(true, &[]))
        .connect(
            rustls_pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let got = exchange(tls, b"secret").await;
    assert_eq!(got.as_deref(), Some(&b"up:secret"[..]));
    let got = exchange(TcpStream::connect(secure).await.unwrap(), b"plain").await;
    assert_eq!(got, None, "no principal: OPA denies");

    // An HTTP provider cannot check a connection: closed rather than skipped.
    let got = exchange(
        TcpStream::connect(gw.listener_addr("web").unwrap())
            .await
            .unwrap(),
        b"x",
    )
    .await;
    assert_eq!(got, None);
}
