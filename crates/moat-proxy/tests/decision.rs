//! Decision listeners with real callers: nginx (Debian's, `auth_request`) in front of an
//! upstream with moat as its auth service, and a gRPC client built on Envoy's published
//! API (go-control-plane, `tests/go/extauthz`) calling `Check` with a peer certificate and
//! a body; plus the limits and hostile input, through real sockets.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use common::jwt::{ec_key, jwks, sign, TestKey};
use common::{client, send, upstream};
use http::{Method, Request, StatusCode};
use http_body_util::Full;
use moat_core::{Connection, HandshakeRecord, RequestCtx, SecurityEvent};
use moat_proxy::{AccessInfo, EventSink, GatewayOptions, RunningGateway};
use moat_testkit::{free_port, real_part, real_part_in, wait_for_port, ChildGuard};
use moat_tls::testing::TestPki;
use parking_lot::Mutex;
use serde_json::Value;

const SQLI: &str = "1' UNION SELECT username, password FROM users--";
const SQLI_Q: &str = "1%27%20UNION%20SELECT%20username%2C%20password%20FROM%20users--";

/// Security events and access records, as the gateway hands them to its sink.
#[derive(Default)]
struct Sink {
    security: Mutex<Vec<(String, String, SecurityEvent)>>,
    access: Mutex<Vec<Value>>,
}

impl EventSink for Sink {
    fn access(&self, i: &AccessInfo<'_>) -> bool {
        self.access.lock().push(serde_json::json!({
            "route": &*i.ctx.route, "client_ip": i.ctx.client_ip.to_string(),
            "method": i.method.as_str(), "path": i.path, "host": i.host,
            "status": i.status, "upstream": i.upstream.map(|(c, e)| format!("{c} {e}")),
        }));
        true
    }
    fn security(&self, ctx: &RequestCtx, ev: &SecurityEvent, _m: &Method, _p: &str) -> bool {
        self.security
            .lock()
            .push((ctx.request_id.clone(), ctx.route.to_string(), ev.clone()));
        true
    }
    fn tls(&self, _c: &Connection, _h: &HandshakeRecord) -> bool {
        true
    }
}

/// Istio policies: `/admin` is denied to everyone, and so is the `admin` user's
/// `x-user`; `/mesh` only to the frontend's SPIFFE identity; a user is not deleted.
const POLICIES: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: no-admin, namespace: shop }
spec:
  selector: { matchLabels: { app: shop } }
  action: DENY
  rules:
    - to: [{ operation: { paths: ["/admin*"] } }]
    - when: [{ key: "request.headers[x-user]", values: ["admin"] }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: mesh-frontend-only, namespace: shop }
spec:
  selector: { matchLabels: { app: shop } }
  action: DENY
  rules:
    - from: [{ source: { notPrincipals: ["cluster.local/ns/shop/sa/frontend"] } }]
      to: [{ operation: { paths: ["/mesh*"] } }]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: no-delete, namespace: shop }
spec:
  action: DENY
  rules:
    - to: [{ operation: { methods: ["DELETE"], paths: ["/api/users/*"] } }]
"#;

/// The issuers' signing key, generated once per run.
static KEY: LazyLock<TestKey> = LazyLock::new(|| ec_key("k1"));

/// A token of `issuer` for `sub`, valid for an hour.
fn token(issuer: &str, sub: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    sign(
        &KEY,
        &serde_json::json!({"iss": issuer, "sub": sub, "iat": now, "exp": now + 3600}),
    )
}

/// Tokens of two issuers, both copying `sub` into `x-jwt-sub`: `keep.test`'s are
/// forwarded (`forwardOriginalToken`), `strip.test`'s are not (Istio's default).
fn request_authentication() -> String {
    let jwks = jwks(&[&KEY]);
    format!(
        r#"---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{ name: tokens, namespace: shop }}
spec:
  selector: {{ matchLabels: {{ app: shop }} }}
  jwtRules:
    - issuer: "https://keep.test"
      jwks: '{jwks}'
      forwardOriginalToken: true
      outputClaimToHeaders: [{{ header: x-jwt-sub, claim: sub }}]
    - issuer: "https://strip.test"
      jwks: '{jwks}'
      outputClaimToHeaders: [{{ header: x-jwt-sub, claim: sub }}]
"#
    )
}

/// A gateway with one decision listener (`authz`) for the `shop` workload, every engine
/// on in block mode.
async fn decision_gateway(dir: &Path, extra: &str) -> (RunningGateway, Arc<Sink>) {
    let policies = format!("{POLICIES}{}", request_authentication());
    std::fs::write(dir.join("policies.yaml"), policies).unwrap();
    let yaml = format!(
        r#"listeners:
  - name: authz
    address: 127.0.0.1:0
    protocol: decision
    decision:
      labels: {{ app: shop }}
      namespace: shop
      trusted_proxies: ["127.0.0.1"]
      max_body: 4KiB
{extra}admin: {{ address: 127.0.0.1:0 }}
authz: {{ enabled: true, policies: [policies.yaml] }}
waf: {{ enabled: true, mode: block }}
secrets: {{ enabled: true, action: block }}
"#
    );
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    (common::gateway(dir, &yaml, opts).await, sink)
}

/// nginx in front of `up`, asking moat at `/check` with `auth_request`; `copy` is
/// added to the protected location (the fields it copies from moat's answer).
fn nginx_conf(dir: &Path, port: u16, moat: SocketAddr, up: SocketAddr, copy: &str) -> PathBuf {
    let d = dir.display();
    let conf = format!(
        r#"master_process off;
error_log stderr warn;
pid {d}/nginx.pid;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port};
        # As Traefik and Caddy do: fields with underscores reach moat and the upstream.
        underscores_in_headers on;
        location / {{
            auth_request /_moat;
            auth_request_set $moat_event $upstream_http_x_moat_event_id;
            add_header X-Moat-Event-Id $moat_event always;
            {copy}
            proxy_pass http://{up};
        }}
        location = /_moat {{
            internal;
            proxy_pass http://{moat}/check;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_set_header X-Original-Method $request_method;
            proxy_set_header X-Original-Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        }}
    }}
}}
"#
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).unwrap();
    path
}

/// Starts nginx with `conf` (prefix `dir`) and waits for it to listen on `port`.
fn start_nginx(nginx: &Path, dir: &Path, conf: &Path, port: u16) -> ChildGuard {
    // `master_process off`: one process, so that killing it leaves no worker behind.
    let child = ChildGuard(
        Command::new(nginx)
            .args(["-e", "stderr", "-p"])
            .arg(dir)
            .arg("-c")
            .arg(conf)
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for_port(port, Duration::from_secs(10)),
        "nginx did not start"
    );
    child
}

/// nginx `auth_request` in front of an upstream, moat deciding: a normal request
/// reaches the upstream, an SQL injection and a policy denial get 403 from nginx, with
/// the event id nginx copied from moat's answer; the records name the decision listener
/// and the client nginx saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_allows_and_denies() {
    let Some(nginx) = real_part("nginx", "scripts/ensure-apt nginx") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (gw, sink) = decision_gateway(dir.path(), "").await;
    let moat = gw.listener_addr("authz").unwrap();
    let up = upstream("app").await;
    let port = free_port().unwrap();
    let conf = nginx_conf(dir.path(), port, moat, up.addr, "");
    let _nginx = start_nginx(&nginx, dir.path(), &conf, port);
    let c = client();
    let url = |p: &str| format!("http://127.0.0.1:{port}{p}");

    let (s, h, b) = common::get(&c, &url("/products?id=42")).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    assert_eq!(h["x-upstream"], "app");
    assert_eq!(common::json(&b)["uri"], "/products?id=42");

    let (s, h, _) = common::get(&c, &url(&format!("/products?id={SQLI_Q}"))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let event = h["x-moat-event-id"].to_str().unwrap().to_owned();
    assert!(!event.is_empty());
    assert_eq!(up.connections(), 1, "the attack never reached the upstream");

    let (s, h, _) = common::get(&c, &url("/admin/users")).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(!h["x-moat-event-id"].is_empty());

    // The injected query was what the WAF saw, attributed to the decision listener.
    let events = sink.security.lock().clone();
    let waf = events.iter().find(|(_, _, e)| e.id == event).unwrap();
    assert_eq!(waf.1, "authz");
    assert_eq!(waf.2.engine, "waf");
    assert!(events.iter().any(|(_, _, e)| e.engine == "authz"));
    let access = sink.access.lock().clone();
    assert_eq!(access.len(), 3, "{access:?}");
    assert_eq!(access[0]["path"], "/products?id=42");
    assert_eq!(access[0]["status"], 200);
    assert_eq!(access[0]["client_ip"], "127.0.0.1");
    assert!(access[0]["upstream"]
        .as_str()
        .unwrap()
        .starts_with("caller 127.0.0.1:"));
    assert_eq!(access[1]["status"], 403);
    assert_eq!(access[2]["path"], "/admin/users");
    // Metrics count the checks under the listener's name.
    let (_, _, m) = common::get(&c, &format!("http://{}/metrics", gw.admin_addr())).await;
    let m = String::from_utf8_lossy(&m);
    assert!(
        m.contains(r#"moat_requests_total{route="authz",status="200",decision="allow"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"moat_requests_total{route="authz",status="403",decision="block"} 2"#),
        "{m}"
    );

    // A policy on `x-user` through nginx; a client's `x_user`, which a CGI-style
    // backend reads as `x-user` and nginx cannot be told to remove, is refused rather
    // than passed unread. Other fields with underscores go on.
    let get_with = |name: &'static str, value: &'static str| {
        let req = Request::get(url("/products"))
            .header(name, value)
            .body(Full::new(Bytes::new()))
            .unwrap();
        send(&c, req)
    };
    let (s, _, _) = get_with("x-user", "admin").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, _, _) = get_with("x_user", "admin").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(up.connections(), 1, "the twin never reached the upstream");
    let (s, _, b) = get_with("x_api_key", "k").await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    assert_eq!(common::json(&b)["headers"]["x_api_key"], "k");
    let access = sink.access.lock().clone();
    assert_eq!(access[4]["status"], 400, "{:?}", access[4]);
    drop(gw);
}

/// Forward-auth cannot remove a field, so moat's answer carries the token's fields as
/// the upstream is to receive them, for the proxy to copy (nginx: `auth_request_set` and
/// `proxy_set_header`; an empty value is not sent): a token `forwardOriginalToken` does
/// not forward never reaches the upstream, one it forwards does, and the verified claim
/// replaces what the client sent under its name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_forward_auth_forwards_tokens_as_the_policy_says() {
    let Some(nginx) = real_part("nginx", "scripts/ensure-apt nginx") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (gw, _sink) = decision_gateway(dir.path(), "").await;
    let moat = gw.listener_addr("authz").unwrap();
    let up = upstream("app").await;
    let port = free_port().unwrap();
    let copy = "auth_request_set $moat_authorization $upstream_http_authorization;
            auth_request_set $moat_jwt_sub $upstream_http_x_jwt_sub;
            proxy_set_header Authorization $moat_authorization;
            proxy_set_header X-Jwt-Sub $moat_jwt_sub;";
    let conf = nginx_conf(dir.path(), port, moat, up.addr, copy);
    let _nginx = start_nginx(&nginx, dir.path(), &conf, port);
    let c = client();
    let get_with = |headers: Vec<(&'static str, String)>| {
        let mut req = Request::get(format!("http://127.0.0.1:{port}/products"));
        for (k, v) in headers {
            req = req.header(k, v);
        }
        send(&c, req.body(Full::new(Bytes::new())).unwrap())
    };
    let bearer = |t: String| ("authorization", format!("Bearer {t}"));
    let spoofed = ("x-jwt-sub", "admin".to_string());

    // Istio's default: the verified token is not forwarded; its claim is.
    let (s, _, b) = get_with(vec![
        bearer(token("https://strip.test", "alice")),
        spoofed.clone(),
    ])
    .await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    let seen = &common::json(&b)["headers"];
    assert!(seen.get("authorization").is_none(), "{seen}");
    assert_eq!(seen["x-jwt-sub"], "alice");

    // forwardOriginalToken: the token goes on as it came.
    let t = token("https://keep.test", "bob");
    let (s, _, b) = get_with(vec![bearer(t.clone())]).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    let seen = &common::json(&b)["headers"];
    assert_eq!(seen["authorization"], format!("Bearer {t}").as_str());
    assert_eq!(seen["x-jwt-sub"], "bob");

    // No token: a claim header the client wrote is not passed as verified.
    let (s, _, b) = get_with(vec![spoofed]).await;
    assert_eq!(s, StatusCode::OK, "{b:?}");
    let seen = &common::json(&b)["headers"];
    assert!(seen.get("x-jwt-sub").is_none(), "{seen}");

    // A token that fails verification is refused before the upstream.
    let forged = format!("{}x", token("https://strip.test", "mallory"));
    let (s, _, _) = get_with(vec![bearer(forged)]).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "a forward-auth denial is 403");
    assert_eq!(up.connections(), 3, "one per request nginx forwarded");
    drop(gw);
}

fn go_client() -> Option<PathBuf> {
    let tools = moat_testkit::tools_dir();
    real_part_in(
        "extauthz-client",
        &[tools.as_path()],
        "scripts/ensure-extauthz-tools",
    )
}

/// Runs the Go client once against `addr`; its JSON answer.
fn check(bin: &Path, addr: SocketAddr, args: &[&str]) -> Value {
    let out = Command::new(bin)
        .arg("-addr")
        .arg(addr.to_string())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "extauthz-client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Envoy's Check, from a client on Envoy's published API types: the peer certificate
/// decides a principal policy, the body goes through the WAF and secret detection, and a
/// denial carries the status, the block page and the event id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_check_from_envoy_api_client() {
    let Some(bin) = go_client() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    let (gw, sink) = decision_gateway(dir.path(), "").await;
    let addr = gw.listener_addr("authz").unwrap();
    let cert = dir.path().join("client.crt");
    let cert = cert.to_str().unwrap();
    let _ = &pki;

    let ok = check(
        &bin,
        addr,
        &["-path", "/products?id=42", "-H", "user-agent: curl/8"],
    );
    assert_eq!(ok["grpc_code"], 0, "{ok}");
    assert_eq!(ok["allowed"], true);
    // A spelling a CGI-style backend reads as a field moat vouches for: the proxy is told
    // to remove it. Other fields with underscores stay.
    let ok = check(
        &bin,
        addr,
        &[
            "-path",
            "/products",
            "-H",
            "x_forwarded_proto: https",
            "-H",
            "x_api_key: k",
        ],
    );
    assert_eq!(ok["allowed"], true, "{ok}");
    assert_eq!(
        ok["headers_to_remove"],
        serde_json::json!(["x_forwarded_proto"]),
        "{ok}"
    );

    // The mesh path: the frontend's certificate passes, no certificate is denied.
    let ok = check(&bin, addr, &["-path", "/mesh/orders", "-cert", cert]);
    assert_eq!(ok["allowed"], true, "{ok}");
    let denied = check(&bin, addr, &["-path", "/mesh/orders"]);
    assert_eq!(denied["grpc_code"], 7, "{denied}");
    assert_eq!(denied["status"], 403);
    // The principal Envoy derived works as well as the certificate.
    let ok = check(
        &bin,
        addr,
        &[
            "-path",
            "/mesh/orders",
            "-principal",
            "spiffe://cluster.local/ns/shop/sa/frontend",
        ],
    );
    assert_eq!(ok["allowed"], true, "{ok}");

    // An injection in the body (with_request_body) is blocked with moat's block page.
    let body = format!(r#"{{"name": "{SQLI}"}}"#);
    let denied = check(
        &bin,
        addr,
        &[
            "-method",
            "POST",
            "-path",
            "/api/users",
            "-H",
            "content-type: application/json",
            "-H",
            "accept: application/json",
            "-body",
            &body,
        ],
    );
    assert_eq!(denied["status"], 403, "{denied}");
    let page: Value = serde_json::from_str(denied["body"].as_str().unwrap()).unwrap();
    let event = denied["headers"]["x-moat-event-id"].as_str().unwrap();
    assert_eq!(page["event_id"], event);

    // A form naming `_method=DELETE` is decided as a DELETE too (Rails, Laravel).
    let form = |body: &str| {
        check(
            &bin,
            addr,
            &[
                "-method",
                "POST",
                "-path",
                "/api/users/7",
                "-H",
                "content-type: application/x-www-form-urlencoded",
                "-body",
                body,
            ],
        )
    };
    assert_eq!(form("name=x&_method=PATCH")["allowed"], true);
    let denied = form("name=x&_method=DELETE");
    assert_eq!(denied["status"], 403, "{denied}");

    // A provider key pasted into a request body is a secret finding.
    let denied = check(
        &bin,
        addr,
        &[
            "-method",
            "POST",
            "-path",
            "/api/notes",
            "-H",
            "content-type: text/plain",
            "-body",
            "deploy with AKIAIOSFODNN7EXAMPLQ and go",
        ],
    );
    assert_eq!(denied["grpc_code"], 7, "{denied}");
    let events = sink.security.lock().clone();
    assert!(
        events
            .iter()
            .any(|(_, r, e)| e.engine == "secrets" && r == "authz"),
        "{events:?}"
    );
    assert!(events.iter().any(|(_, _, e)| e.engine == "waf"));

    // The source address is the client: the record names it, and Envoy as the caller.
    let access = sink.access.lock().clone();
    assert_eq!(access[0]["client_ip"], "10.1.2.3");
    assert!(access[0]["upstream"]
        .as_str()
        .unwrap()
        .starts_with("caller 127.0.0.1:"));
}

async fn http_check(
    addr: SocketAddr,
    req: Request<Full<Bytes>>,
) -> (StatusCode, http::HeaderMap, Bytes) {
    let _ = addr;
    send(&client(), req).await
}

/// Forward-auth headers are believed from trusted proxies only; Envoy's HTTP mode (the
/// request itself) and forward-auth map denials as their callers need.
#[tokio::test]
async fn forward_auth_trusts_only_configured_proxies() {
    let dir = tempfile::tempdir().unwrap();
    // 127.0.0.2 is the only trusted proxy: this test's client (127.0.0.1) is not.
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).unwrap();
    let yaml = r#"listeners:
  - name: authz
    address: 127.0.0.1:0
    protocol: decision
    decision: { labels: { app: shop }, namespace: shop, trusted_proxies: ["127.0.0.2/32"], max_body: 1KiB }
admin: { address: 127.0.0.1:0 }
authz: { enabled: true, policies: [policies.yaml] }
waf: { enabled: true, mode: block }
"#;
    let gw = common::gateway(dir.path(), yaml, GatewayOptions::default()).await;
    let addr = gw.listener_addr("authz").unwrap();
    let url = format!("http://{addr}/check");
    // An untrusted caller cannot move the request elsewhere: X-Original-URI is ignored.
    let req = Request::get(&url)
        .header("x-original-uri", "/admin")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, h, _) = http_check(addr, req).await;
    assert_eq!(s, StatusCode::OK);
    assert!(!h.contains_key("x-envoy-auth-headers-to-remove"), "{h:?}");
    // A spelling a CGI-style backend reads as a field moat vouches for: Envoy's HTTP
    // mode is told to remove it, in its header for that.
    let req = Request::get(&url)
        .header("x_forwarded_proto", "https")
        .header("x_api_key", "k")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, h, _) = http_check(addr, req).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(h["x-envoy-auth-headers-to-remove"], "x_forwarded_proto");
    // Envoy's HTTP mode: the request is the original one.
    let (s, h, _) = http_check(
        addr,
        Request::get(format!("http://{addr}/admin/x"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(h.contains_key("x-moat-event-id"));
    // Body over the listener's limit: 413, not inspected.
    let big = Request::post(format!("http://{addr}/upload"))
        .body(Full::new(Bytes::from(vec![b'a'; 2048])))
        .unwrap();
    let (s, _, _) = http_check(addr, big).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    // An injection in the body of Envoy's HTTP mode request.
    let body = Request::post(format!("http://{addr}/api"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(format!("q={SQLI_Q}"))))
        .unwrap();
    let (s, _, _) = http_check(addr, body).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
}

/// Hostile `CheckRequest`s: a header name Envoy would never send, a body over the
/// limit, no HTTP attributes at all. Each gets a clear answer, never a crash.
#[tokio::test]
async fn hostile_check_requests() {
    use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
        HttpRequest, Request as AttrRequest,
    };
    use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
    use envoy_types::pb::envoy::service::auth::v3::{
        check_response, AttributeContext, CheckRequest,
    };

    let dir = tempfile::tempdir().unwrap();
    let (gw, _) = decision_gateway(dir.path(), "").await;
    let addr = gw.listener_addr("authz").unwrap();
    let mut c = AuthorizationClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let req = |http: Option<HttpRequest>| CheckRequest {
        attributes: Some(AttributeContext {
            request: Some(AttrRequest {
                http,
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    let err = c.check(req(None)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    let mut bad = HttpRequest {
        method: "GET".into(),
        path: "/".into(),
        ..Default::default()
    };
    bad.headers.insert("bad header\n".into(), "x".into());
    let err = c.check(req(Some(bad))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("header name"), "{}", err.message());
    let big = HttpRequest {
        method: "POST".into(),
        path: "/upload".into(),
        raw_body: vec![b'a'; 8 << 10],
        ..Default::default()
    };
    let resp = c.check(req(Some(big))).await.unwrap().into_inner();
    let Some(check_response::HttpResponse::DeniedResponse(d)) = resp.http_response else {
        panic!("not denied: {resp:?}");
    };
    assert_eq!(d.status.unwrap().code, 413);
    // A message far over max_body + head room is refused by the gRPC layer itself.
    let huge = HttpRequest {
        method: "POST".into(),
        path: "/upload".into(),
        raw_body: vec![b'a'; 1 << 20],
        ..Default::default()
    };
    let err = c.check(req(Some(huge))).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange);
    // Unknown gRPC methods are Unimplemented.
    let mut raw = tonic::client::Grpc::new(
        tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    raw.ready().await.unwrap();
    let err = raw
        .unary::<CheckRequest, CheckRequest, _>(
            tonic::Request::new(req(None)),
            http::uri::PathAndQuery::from_static("/envoy.service.auth.v3.Authorization/Nope"),
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
    let _ = gw;
}
