//! Access control wired from the gateway config, through real sockets: a TLS listener
//! (client auth PERMISSIVE) with real SPIFFE client certificates, Istio policies read
//! from files, real signed JWTs verified against a JWKS served by a local HTTP server
//! (key rotation, server down), and PeerAuthentication STRICT.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::jwt::{ec_key, jwks, sign, sign_kid, TestKey};
use common::{gateway, json, raw, upstream};
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use moat_proxy::GatewayOptions;
use moat_tls::testing::TestPki;
use moat_tls::tokio_rustls::TlsConnector;
use rustls_pki_types::ServerName;
use serde_json::{json as js, Value};

const ISS: &str = "https://issuer.test";

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn claims(sub: &str) -> Value {
    js!({"iss": ISS, "sub": sub, "iat": now(), "exp": now() + 3600})
}

/// A JWKS server on its own thread and runtime (the gateway fetches synchronously while
/// it is built), whose answer can be changed and which can be shut down.
struct JwksServer {
    addr: SocketAddr,
    state: Arc<Mutex<(u16, String)>>,
    hits: Arc<AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl JwksServer {
    fn start(body: String) -> JwksServer {
        let state = Arc::new(Mutex::new((200u16, body)));
        let hits = Arc::new(AtomicUsize::new(0));
        let (tx_addr, rx_addr) = std::sync::mpsc::channel();
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (st, h) = (state.clone(), hits.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx_addr.send(listener.local_addr().unwrap()).unwrap();
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => return,
                        acc = listener.accept() => {
                            let Ok((sock, _)) = acc else { continue };
                            let (st, h) = (st.clone(), h.clone());
                            tokio::spawn(async move {
                                let svc = service_fn(move |_req: Request<hyper::body::Incoming>| {
                                    h.fetch_add(1, Ordering::SeqCst);
                                    let (status, body) = st.lock().unwrap().clone();
                                    async move {
                                        Ok::<_, Infallible>(
                                            hyper::Response::builder()
                                                .status(status)
                                                .header("content-type", "application/json")
                                                .body(Full::new(Bytes::from(body)))
                                                .unwrap(),
                                        )
                                    }
                                });
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(TokioIo::new(sock), svc)
                                    .await;
                            });
                        }
                    }
                }
            });
        });
        let addr = rx_addr.recv_timeout(Duration::from_secs(10)).unwrap();
        JwksServer {
            addr,
            state,
            hits,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    fn set(&self, status: u16, body: String) {
        *self.state.lock().unwrap() = (status, body);
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn policies(jwks_uri: &str) -> String {
    format!(
        r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: deny-admin, namespace: istio-system}}
spec:
  action: DENY
  rules:
  - to: [{{operation: {{paths: ["/admin*"]}}}}]
  - to: [{{operation: {{paths: ["/me/locked"], methods: ["DELETE"]}}}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: shop-api, namespace: shop}}
spec:
  action: ALLOW
  rules:
  - from: [{{source: {{principals: ["cluster.local/ns/shop/sa/frontend"]}}}}]
    to: [{{operation: {{paths: ["/api/*"]}}}}]
  - from: [{{source: {{requestPrincipals: ["{ISS}/*"]}}}}]
    to: [{{operation: {{paths: ["/me/*"]}}}}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: shop}}
spec:
  jwtRules:
  - issuer: "{ISS}"
    jwksUri: "{jwks_uri}"
    timeout: 2s
    outputClaimToHeaders:
    - header: x-jwt-sub
      claim: sub
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: strict, namespace: vault}}
spec:
  mtls: {{mode: STRICT}}
"#
    )
}

fn yaml(up: SocketAddr) -> String {
    format!(
        r#"listeners:
  - name: tls
    address: 127.0.0.1:0
    tls:
      certificates: [{{ cert: server.crt, key: server.key }}]
      alpn: [http/1.1]
      client_auth: {{ mode: PERMISSIVE, ca: ca.crt }}
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: shop
    endpoints: ["{up}"]
    namespace: shop
    labels: {{ app: web }}
  - name: vault
    endpoints: ["{up}"]
    namespace: vault
routes:
  - name: vault
    path_prefix: /vault
    cluster: vault
  - name: shop
    cluster: shop
authz:
  enabled: true
  policies: [policies]
  jwt_cache_size: 0
  jwks_refresh_interval: 200ms
  jwks_retry_interval: 200ms
"#
    )
}

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: Bytes,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// One HTTP/1.1 request over a new TLS connection, with or without the client certificate.
async fn https(
    pki: &TestPki,
    addr: SocketAddr,
    with_cert: bool,
    path: &str,
    bearer: Option<&str>,
) -> Reply {
    https_with(pki, addr, with_cert, path, bearer, &[]).await
}

/// [`https`] with extra request headers.
async fn https_with(
    pki: &TestPki,
    addr: SocketAddr,
    with_cert: bool,
    path: &str,
    bearer: Option<&str>,
    extra: &[(&'static str, &'static str)],
) -> Reply {
    let mut req = Request::get(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    for (k, v) in extra {
        req.headers_mut().insert(*k, HeaderValue::from_static(v));
    }
    https_request(pki, addr, with_cert, req, bearer).await
}

/// `req` over a new TLS connection, with `bearer` as its token.
async fn https_request(
    pki: &TestPki,
    addr: SocketAddr,
    with_cert: bool,
    mut req: Request<Full<Bytes>>,
    bearer: Option<&str>,
) -> Reply {
    let cfg = pki.client_config(with_cert, &["http/1.1"]);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(cfg)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    if let Some(t) = bearer {
        req.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
        );
    }
    let resp = send.send_request(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// Keeps (request path, engine, rule, action) of every security event.
#[derive(Default)]
struct Sink {
    /// Path, engine, rule, action and event id of each security event.
    #[allow(clippy::type_complexity)]
    security:
        parking_lot::Mutex<Vec<(String, &'static str, String, moat_core::EventAction, String)>>,
}

impl Sink {
    fn has(&self, path: &str, engine: &str, rule_prefix: &str) -> bool {
        self.security.lock().iter().any(|(p, e, r, a, _)| {
            p == path
                && *e == engine
                && r.starts_with(rule_prefix)
                && *a == moat_core::EventAction::Block
        })
    }

    /// The id of the last event `engine` blocked `path` with.
    fn block_id(&self, path: &str, engine: &str) -> Option<String> {
        let events = self.security.lock();
        let last = events.iter().rev().find(|(p, e, _, a, _)| {
            p == path && *e == engine && *a == moat_core::EventAction::Block
        });
        last.map(|ev| ev.4.clone())
    }
}

impl moat_proxy::EventSink for Sink {
    fn access(&self, _info: &moat_proxy::AccessInfo<'_>) -> bool {
        true
    }
    fn security(
        &self,
        _ctx: &moat_core::RequestCtx,
        event: &moat_core::SecurityEvent,
        _m: &http::Method,
        path: &str,
    ) -> bool {
        self.security.lock().push((
            path.to_string(),
            event.engine,
            event.rule.clone(),
            event.action,
            event.id.clone(),
        ));
        true
    }
    fn tls(&self, _c: &moat_core::Connection, _h: &moat_core::HandshakeRecord) -> bool {
        true
    }
}

struct Setup {
    sink: Arc<Sink>,
    pki: TestPki,
    jwks: JwksServer,
    gw: moat_proxy::RunningGateway,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

async fn setup(initial: &[&TestKey]) -> Setup {
    let jwks_server = JwksServer::start(jwks(initial));
    let uri = format!("http://{}/jwks", jwks_server.addr);
    setup_with(jwks_server, &uri).await
}

/// The gateway with the policies, the RequestAuthentication reading `jwks_uri`.
async fn setup_with(jwks_server: JwksServer, jwks_uri: &str) -> Setup {
    let up = upstream("shop").await;
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::generate(dir.path()).unwrap();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    std::fs::write(dir.path().join("policies/shop.yaml"), policies(jwks_uri)).unwrap();
    let sink = Arc::new(Sink::default());
    let opts = GatewayOptions {
        events: Some(sink.clone()),
        ..GatewayOptions::default()
    };
    let gw = gateway(dir.path(), &yaml(up.addr), opts).await;
    let addr = gw.listener_addr("tls").unwrap();
    Setup {
        sink,
        pki,
        jwks: jwks_server,
        gw,
        addr,
        _dir: dir,
    }
}

/// Polls `f` until it holds or 20 s pass.
async fn eventually<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spiffe_principal_policies_over_mtls() {
    let k1 = ec_key("k1");
    let s = setup(&[&k1]).await;

    // The SPIFFE client certificate is allowed on /api/*: the upstream answers.
    let r = https(&s.pki, s.addr, true, "/api/items?page=1", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.headers["x-upstream"], "shop");
    assert_eq!(json(&r.body)["uri"], "/api/items?page=1");

    // Same path without a client certificate (TLS, PERMISSIVE): denied by the ALLOW policy.
    let r = https(&s.pki, s.addr, false, "/api/items", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.text(), "RBAC: access denied");
    assert!(r.headers.get("x-upstream").is_none());

    // Plaintext on the PERMISSIVE listener: no principal, denied the same way.
    let resp = raw(
        s.addr,
        b"GET /api/items HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    assert!(resp.ends_with("RBAC: access denied"), "{resp}");

    // DENY /admin* in the root namespace wins even for the allowed principal.
    let r = https(&s.pki, s.addr, true, "/admin/users", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.text(), "RBAC: access denied");
    let r = https(&s.pki, s.addr, true, "/administrator", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);

    // Each denial is a security event at the sink, naming the deciding policy; the
    // response names the event beside Istio's text.
    assert!(s
        .sink
        .has("/admin/users", "authz", "istio-system/deny-admin"));
    let r = https(&s.pki, s.addr, true, "/admin/users", None).await;
    assert_eq!(r.text(), "RBAC: access denied");
    let id = r.headers["x-moat-event-id"].to_str().unwrap();
    assert!(
        eventually(|| async { s.sink.block_id("/admin/users", "authz").as_deref() == Some(id) })
            .await
    );
    assert!(s.sink.has("/api/items", "authz", ""));

    // Outside /api/* the principal rule does not apply.
    let r = https(&s.pki, s.addr, true, "/other", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    s.gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_authentication_strict_rejects_requests_without_a_client_certificate() {
    let k1 = ec_key("k1");
    let s = setup(&[&k1]).await;

    // Namespace `vault` is STRICT and has no ALLOW policy: a verified certificate passes.
    let r = https(&s.pki, s.addr, true, "/vault/keys", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.headers["x-upstream"], "shop");

    // TLS without a client certificate.
    let r = https(&s.pki, s.addr, false, "/vault/keys", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.text(), "RBAC: access denied");

    // Plaintext.
    let resp = raw(
        s.addr,
        b"GET /vault/keys HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    assert!(!resp.contains("x-upstream"), "{resp}");

    // A valid JWT is no substitute for the client certificate.
    let t = sign(&k1, &claims("alice"));
    let r = https(&s.pki, s.addr, false, "/vault/keys", Some(&t)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    s.gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_request_principal_claim_headers_and_invalid_tokens() {
    let k1 = ec_key("k1");
    let s = setup(&[&k1]).await;
    assert!(
        s.jwks.hits() >= 1,
        "the JWKS is fetched when the gateway is built"
    );

    // A valid token: allowed by the requestPrincipals rule; the claim is copied into a
    // header for the upstream and the token itself is not forwarded.
    let t = sign(&k1, &claims("alice"));
    let r = https(&s.pki, s.addr, false, "/me/profile", Some(&t)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = json(&r.body);
    assert_eq!(v["headers"]["x-jwt-sub"], "alice", "{v}");
    assert!(v["headers"].get("authorization").is_none(), "{v}");

    // No token: no request principal, the ALLOW policy does not match.
    let r = https(&s.pki, s.addr, false, "/me/profile", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.text(), "RBAC: access denied");

    // Expired token: 401 with WWW-Authenticate.
    let expired = sign(
        &k1,
        &js!({"iss": ISS, "sub": "alice", "iat": now() - 7200, "exp": now() - 3600}),
    );
    let r = https(&s.pki, s.addr, false, "/me/profile", Some(&expired)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.text(), "Jwt is expired");
    let id = r.headers["x-moat-event-id"].to_str().unwrap();
    assert!(
        eventually(|| async { s.sink.block_id("/me/profile", "authn").as_deref() == Some(id) })
            .await
    );
    let www = r.headers["www-authenticate"].to_str().unwrap();
    assert!(www.starts_with("Bearer realm="), "{www}");
    assert!(www.contains(r#"error="invalid_token""#), "{www}");

    // Bad signature: signed by another key under the published kid.
    let forged = sign_kid(&ec_key("other"), "k1", &claims("mallory"));
    let r = https(&s.pki, s.addr, false, "/me/profile", Some(&forged)).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{}", r.text());
    assert!(r.headers.contains_key("www-authenticate"));
    assert!(s.sink.has("/me/profile", "authn", ""));
    assert!(!r.headers.contains_key("x-upstream"));

    // With a verified token, a client-sent output header is overwritten by the claim.
    let spoof = [("x-jwt-sub", "admin")];
    let t_bob = sign(&k1, &claims("bob"));
    let r = https_with(&s.pki, s.addr, true, "/api/whoami", Some(&t_bob), &spoof).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(json(&r.body)["headers"]["x-jwt-sub"], "bob");
    s.gw.shutdown(Duration::from_secs(2)).await;
}

/// A POST form naming `_method` is decided again with its body, on the head as it
/// arrived: its token (which the first decision took off the request, as
/// `forwardOriginalToken` is unset) is verified again, so the ALLOW on the request
/// principal holds for that reading too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_method_field_is_decided_with_the_verified_token() {
    let k1 = ec_key("k1");
    let s = setup(&[&k1]).await;
    let t = sign(&k1, &claims("alice"));
    let post = |path: &str, form: &'static str| {
        Request::post(path)
            .header("host", "localhost")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Full::new(Bytes::from_static(form.as_bytes())))
            .unwrap()
    };
    let r = https_request(
        &s.pki,
        s.addr,
        false,
        post("/me/profile", "_method=PATCH&a=1"),
        Some(&t),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = json(&r.body);
    assert_eq!(
        (&v["method"], &v["body"]),
        (&"POST".into(), &"_method=PATCH&a=1".into())
    );
    assert_eq!(v["headers"]["x-jwt-sub"], "alice", "{v}");
    assert!(v["headers"].get("authorization").is_none(), "{v}");
    let r = https_request(
        &s.pki,
        s.addr,
        false,
        post("/me/locked", "_method=DELETE"),
        Some(&t),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.text());
    assert!(s.sink.has("/me/locked", "authz", "istio-system/deny-admin"));
    let r = https_request(
        &s.pki,
        s.addr,
        false,
        post("/me/locked", "_method=PUT"),
        Some(&t),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    s.gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwks_rotation_then_server_down_keeps_the_last_keys() {
    let k1 = ec_key("k1");
    let k2 = ec_key("k2");
    let mut s = setup(&[&k1]).await;

    let r = https(
        &s.pki,
        s.addr,
        false,
        "/me/a",
        Some(&sign(&k1, &claims("u1"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = https(
        &s.pki,
        s.addr,
        false,
        "/me/a",
        Some(&sign(&k2, &claims("u2"))),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "kid k2 is not published yet"
    );

    // Rotate: the server now publishes only k2.
    s.jwks.set(200, jwks(&[&k2]));
    let (pki, addr, k2_ref) = (&s.pki, s.addr, &k2);
    assert!(
        eventually(|| async move {
            let t = sign(k2_ref, &claims("u3"));
            https(pki, addr, false, "/me/a", Some(&t)).await.status == StatusCode::OK
        })
        .await,
        "the new kid was never picked up by the refresh"
    );
    let r = https(
        &s.pki,
        s.addr,
        false,
        "/me/a",
        Some(&sign(&k1, &claims("u4"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "k1 was rotated out");

    // The server fails: refreshes keep failing, the last good keys stay in use.
    s.jwks.set(503, "unavailable".into());
    let before = s.jwks.hits();
    let jwks_server = &s.jwks;
    assert!(
        eventually(|| async move { jwks_server.hits() >= before + 2 }).await,
        "the refresh never retried"
    );
    let r = https(
        &s.pki,
        s.addr,
        false,
        "/me/a",
        Some(&sign(&k2, &claims("u5"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());

    // The server is gone (connection refused): still the last good keys. Wait several
    // refresh intervals (200 ms) so that failed refreshes have happened.
    s.jwks.shutdown();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let r = https(
        &s.pki,
        s.addr,
        false,
        "/me/a",
        Some(&sign(&k2, &claims("u6"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(json(&r.body)["headers"]["x-jwt-sub"], "u6");
    s.gw.shutdown(Duration::from_secs(2)).await;
}

/// docs/access-control.md: "outputClaimToHeaders (... the header is removed when the
/// claim is missing, so a client cannot spoof it)". Without any token the engine returns
/// `Authn::NoToken` and never calls `jwt::apply_outputs`, so the client's header reaches
/// the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_claim_header_cannot_be_spoofed_without_a_token() {
    let k1 = ec_key("k1");
    let s = setup(&[&k1]).await;
    // /api/* is allowed by the client certificate alone (no token needed).
    // The underscore spelling too: a CGI, WSGI, PHP or Rack backend reads `x_jwt_sub`
    // as `HTTP_X_JWT_SUB`, the variable `x-jwt-sub` becomes.
    let spoof = [
        ("x-jwt-sub", "admin"),
        ("x_jwt_sub", "admin"),
        ("x_jwt-sub", "admin"),
    ];
    let r = https_with(&s.pki, s.addr, true, "/api/whoami", None, &spoof).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let headers = &json(&r.body)["headers"];
    for name in ["x-jwt-sub", "x_jwt_sub", "x_jwt-sub"] {
        assert!(
            headers.get(name).is_none(),
            "spoofed claim header {name} forwarded: {}",
            r.text()
        );
    }
    // Other fields with underscores are the client's own and go on.
    let r = https_with(
        &s.pki,
        s.addr,
        true,
        "/api/whoami",
        None,
        &[("x_api_key", "k")],
    )
    .await;
    assert_eq!(json(&r.body)["headers"]["x_api_key"], "k", "{}", r.text());
    s.gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwks_server_down_from_the_start() {
    // A port with nothing listening: the first fetch fails (connection refused).
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut jwks_server = JwksServer::start(jwks(&[]));
    jwks_server.shutdown();
    let s = setup_with(jwks_server, &format!("http://{closed}/jwks")).await;

    // A token cannot be verified: 401 with Envoy's message.
    let k1 = ec_key("k1");
    let r = https(
        &s.pki,
        s.addr,
        false,
        "/me/profile",
        Some(&sign(&k1, &claims("alice"))),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.text(), "Jwks remote fetch is failed");
    assert!(r.headers.contains_key("www-authenticate"));

    // Without a token the policies decide as usual.
    let r = https(&s.pki, s.addr, true, "/api/items", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = https(&s.pki, s.addr, false, "/api/items", None).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    s.gw.shutdown(Duration::from_secs(2)).await;
}
