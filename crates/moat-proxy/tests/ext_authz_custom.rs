//! Istio `action: CUSTOM` through the proxy, with real external authorizers: Open Policy
//! Agent with its Envoy ext_authz plugin over gRPC (`envoyExtAuthzGrpc`), and a second
//! moat's decision listener over HTTP (`envoyExtAuthzHttp`). Timeouts are tested by
//! stopping OPA (SIGSTOP: connections hang), failures by killing it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, get, upstream};
use http::StatusCode;
use moat_proxy::GatewayOptions;
use moat_testkit::{free_port, real_part_in, wait_for_port, ChildGuard};

const SQLI_Q: &str = "1%27%20UNION%20SELECT%20username%2C%20password%20FROM%20users--";

/// OPA's policy: GETs outside `/opa/private` are allowed with a header for the
/// upstream; everything else is denied with 401 and a body of OPA's.
const REGO: &str = r#"package envoy.authz

default result := {"allowed": false, "http_status": 401, "body": "denied by opa"}

result := {"allowed": true, "headers": {"x-opa-checked": "yes"}} if {
	input.attributes.request.http.method == "GET"
	not startswith(input.attributes.request.http.path, "/opa/private")
	not startswith(input.attributes.request.http.path, "/open/private")
}
"#;

const POLICIES: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: opa, namespace: shop }
spec:
  selector: { matchLabels: { app: shop } }
  action: CUSTOM
  provider: { name: opa }
  rules: [{ to: [{ operation: { paths: ["/opa/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: opa-open, namespace: shop }
spec:
  selector: { matchLabels: { app: shop } }
  action: CUSTOM
  provider: { name: opa-open }
  rules: [{ to: [{ operation: { paths: ["/open/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: waf-service, namespace: shop }
spec:
  selector: { matchLabels: { app: shop } }
  action: CUSTOM
  provider: { name: moat-http }
  rules: [{ to: [{ operation: { paths: ["/waf/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: opa-deletes, namespace: shop }
spec:
  selector: { matchLabels: { app: shop } }
  action: CUSTOM
  provider: { name: opa }
  rules: [{ to: [{ operation: { methods: [DELETE], paths: ["/items/*"] } }] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: rbac, namespace: shop }
spec:
  selector: { matchLabels: { app: shop } }
  action: DENY
  rules: [{ to: [{ operation: { paths: ["/opa/rbac-denied"] } }] }]
"#;

fn start_opa(bin: &Path, dir: &Path, grpc: u16) -> ChildGuard {
    std::fs::write(dir.join("policy.rego"), REGO).unwrap();
    let rest = free_port().unwrap();
    let child = Command::new(bin)
        .args(["run", "--server", "--log-level", "error"])
        .arg(format!("--addr=127.0.0.1:{rest}"))
        .arg(format!(
            "--set=plugins.envoy_ext_authz_grpc.addr=127.0.0.1:{grpc}"
        ))
        .arg("--set=plugins.envoy_ext_authz_grpc.path=envoy/authz/result")
        .arg("--set=decision_logs.console=false")
        .arg(dir.join("policy.rego"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let guard = ChildGuard(child);
    assert!(
        wait_for_port(grpc, Duration::from_secs(20)),
        "OPA's ext_authz gRPC server did not start"
    );
    guard
}

fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(ok.success());
    if sig == "STOP" {
        // kill(2) returns before every thread of the process has stopped: a thread
        // running on another CPU could still answer a call. Wait until all are `T`.
        let stopped = || {
            std::fs::read_dir(format!("/proc/{pid}/task"))
                .unwrap()
                .all(|t| {
                    let stat =
                        std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                    stat.rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('T')
                })
        };
        let t = Instant::now();
        while !stopped() {
            assert!(t.elapsed() < Duration::from_secs(5), "OPA did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_action_calls_opa_and_moat_http() {
    let tools = moat_testkit::tools_dir();
    let Some(opa) = real_part_in(
        "opa-envoy-plugin",
        &[tools.as_path()],
        "scripts/ensure-extauthz-tools",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let grpc_port = free_port().unwrap();
    let mut opa_proc = Some(start_opa(&opa, dir.path(), grpc_port));

    // The HTTP provider: another moat, a decision listener with the WAF.
    let waf_dir = tempfile::tempdir().unwrap();
    let waf_gw = common::gateway(
        waf_dir.path(),
        r#"listeners:
  - { name: authz, address: 127.0.0.1:0, protocol: decision }
admin: { address: 127.0.0.1:0 }
waf: { enabled: true, mode: block }
"#,
        GatewayOptions::default(),
    )
    .await;
    let waf_port = waf_gw.listener_addr("authz").unwrap().port();

    let up = upstream("app").await;
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).unwrap();
    let yaml = format!(
        r#"listeners:
  - {{ name: main, address: 127.0.0.1:0 }}
  - {{ name: check, address: 127.0.0.1:0, protocol: decision, decision: {{ labels: {{ app: shop }}, namespace: shop }} }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - {{ name: app, endpoints: ["{up}"], labels: {{ app: shop }}, namespace: shop }}
routes:
  - {{ name: all, cluster: app }}
authz:
  enabled: true
  policies: [policies.yaml]
  extension_providers:
    - name: opa
      envoyExtAuthzGrpc: {{ service: 127.0.0.1, port: {grpc_port}, timeout: 300ms, statusOnError: "503" }}
    - name: opa-open
      envoyExtAuthzGrpc: {{ service: 127.0.0.1, port: {grpc_port}, timeout: 300ms, failOpen: true }}
    - name: moat-http
      envoyExtAuthzHttp:
        service: 127.0.0.1
        port: {waf_port}
        timeout: 1s
        includeRequestHeadersInCheck: [user-agent]
        headersToUpstreamOnAllow: [x-moat-event-id]
"#,
        up = up.addr
    );
    let gw = common::gateway(dir.path(), &yaml, GatewayOptions::default()).await;
    let base = format!("http://{}", gw.listener_addr("main").unwrap());
    let c = client();

    // OPA allows, and its header reaches the upstream.
    let (s, _, b) = get(&c, &format!("{base}/opa/items")).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    assert_eq!(common::json(&b)["headers"]["x-opa-checked"], "yes");
    // OPA denies with its own status and body.
    let (s, _, b) = get(&c, &format!("{base}/opa/private/x")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{b:?}");
    assert_eq!(&b[..], b"denied by opa");
    // CUSTOM allows, then DENY still applies (Istio's order).
    let (s, _, b) = get(&c, &format!("{base}/opa/rbac-denied")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(&b[..], b"RBAC: access denied");
    // Paths no CUSTOM policy names never reach OPA: allowed without its header.
    let (s, _, b) = get(&c, &format!("{base}/plain")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(common::json(&b)["headers"].get("x-opa-checked").is_none());

    // A POST that a Rails, Symfony or Laravel backend routes as a DELETE (`_method`)
    // is put to the provider the CUSTOM rule on DELETE names, as it is: OPA denies
    // every method but GET. Without the field, no CUSTOM rule matches.
    let addr = gw.listener_addr("main").unwrap();
    let post = |body: &'static str| {
        format!(
            "POST /items/1 HTTP/1.1\r\nhost: x\r\ncontent-type: application/x-www-form-urlencoded\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let answer = common::raw(addr, post("title=a").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:.300}");
    let answer = common::raw(addr, post("title=a&_method=DELETE").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer:.300}");
    assert!(answer.ends_with("denied by opa"), "{answer:.300}");
    // The decision service does the same for Envoy's HTTP mode (the request itself).
    let check = gw.listener_addr("check").unwrap();
    let answer = common::raw(check, post("title=a").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:.300}");
    let answer = common::raw(check, post("title=a&_method=DELETE").as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer:.300}");
    // A DELETE itself is put to OPA at its head.
    let answer = common::raw(
        addr,
        b"DELETE /items/1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer:.300}");

    // moat over HTTP: its WAF decides.
    let (s, _, _) = get(&c, &format!("{base}/waf/search?q=shoes")).await;
    assert_eq!(s, StatusCode::OK);
    let (s, h, b) = get(&c, &format!("{base}/waf/search?q={SQLI_Q}")).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{b:?}");
    assert!(h.contains_key("x-moat-event-id"), "{h:?}");

    // OPA stopped (SIGSTOP): calls hang until the provider's timeout.
    let pid = opa_proc.as_ref().unwrap().id();
    signal(pid, "STOP");
    let t = Instant::now();
    let (s, _, b) = get(&c, &format!("{base}/opa/items")).await;
    let waited = t.elapsed();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "statusOnError: {b:?}");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    let (s, _, _) = get(&c, &format!("{base}/open/items")).await;
    assert_eq!(s, StatusCode::OK, "failOpen");
    signal(pid, "CONT");
    let (s, _, _) = get(&c, &format!("{base}/opa/items")).await;
    assert_eq!(s, StatusCode::OK, "OPA answers again");

    // OPA gone: fail closed with statusOnError, or open.
    drop(opa_proc.take());
    let (s, _, b) = get(&c, &format!("{base}/opa/items")).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(&b[..], b"external authorization failed");
    let (s, _, _) = get(&c, &format!("{base}/open/items")).await;
    assert_eq!(s, StatusCode::OK);
    // failOpen still applies the DENY policies after it.
    let (s, _, _) = get(&c, &format!("{base}/open/private")).await;
    assert_eq!(s, StatusCode::OK, "OPA is down: only RBAC decides");

    // OPA back on the same port: the next call opens a new connection (the old one is
    // closed) and OPA decides again.
    let _opa_again = start_opa(&opa, dir.path(), grpc_port);
    let (s, _, b) = get(&c, &format!("{base}/opa/items")).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    assert_eq!(common::json(&b)["headers"]["x-opa-checked"], "yes");
    let (s, _, _) = get(&c, &format!("{base}/opa/private/x")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
}

/// Provider references are checked when the policies are loaded.
#[tokio::test]
async fn custom_policy_names_a_known_provider() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).unwrap();
    let yaml = r#"listeners:
  - { name: main, address: 127.0.0.1:0 }
admin: { address: 127.0.0.1:0 }
clusters: [{ name: app, endpoints: ["127.0.0.1:9"] }]
routes: [{ name: all, cluster: app }]
authz:
  enabled: true
  policies: [policies.yaml]
  extension_providers:
    - { name: opa, envoyExtAuthzGrpc: { service: 127.0.0.1, port: 9 } }
"#;
    let file = dir.path().join("moat.yaml");
    let err = common::gateway_error(&file, yaml);
    assert!(err.contains("policies.yaml"), "{err}");
    assert!(err.contains("spec.provider.name"), "{err}");
    assert!(
        err.contains("unknown extension provider `opa-open`"),
        "{err}"
    );

    // A provider of both kinds, and a bad statusOnError.
    for (bad, want) in [
        (
            "{ name: x, envoyExtAuthzGrpc: { service: a, port: 1 }, envoyExtAuthzHttp: { service: a, port: 1 } }",
            "exactly one",
        ),
        (
            "{ name: x, envoyExtAuthzGrpc: { service: a, port: 1, statusOnError: \"99\" } }",
            "statusOnError",
        ),
    ] {
        common::assert_provider_error(&file, bad, want);
    }
}
