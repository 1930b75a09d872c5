//! Secret detection wired from the gateway config, through real sockets: block replies
//! that never carry the secret, redaction of JSON bodies (valid JSON, fixed
//! Content-Length), gzip bodies, response scanning, and `POST /v1/scan` on the admin
//! listener.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{client, gateway, json, send};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use moat_proxy::admin::AdminRouter;
use moat_proxy::GatewayOptions;

/// A realistic AWS access key id (not AWS's documented example, which is allowlisted).
const AWS_KEY: &str = "AKIAZ7Q4T2MXW6VBN3RK";

/// An upstream echoing the request (method, headers, body) as JSON; `/leak` answers a
/// JSON document holding a secret.
struct Up {
    addr: SocketAddr,
    hits: Arc<AtomicUsize>,
}

impl Up {
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

async fn upstream() -> Up {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let h = h.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<Incoming>| {
                    let h = h.clone();
                    async move {
                        h.fetch_add(1, Ordering::SeqCst);
                        if req.uri().path().ends_with("/leak-gz") {
                            let body = format!(
                                r#"{{"service":"billing","aws_access_key_id":"{AWS_KEY}","pad":"{}"}}"#,
                                "abc ".repeat(500)
                            );
                            let mut gz = flate2::write::GzEncoder::new(
                                Vec::new(),
                                flate2::Compression::default(),
                            );
                            gz.write_all(body.as_bytes()).unwrap();
                            return Ok::<_, Infallible>(
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .header("content-encoding", "gzip")
                                    .body(Full::new(Bytes::from(gz.finish().unwrap())))
                                    .unwrap(),
                            );
                        }
                        if req.uri().path().ends_with("/leak") {
                            let body = format!(
                                r#"{{"service":"billing","config":{{"aws_access_key_id":"{AWS_KEY}","region":"eu-west-1"}}}}"#
                            );
                            return Ok::<_, Infallible>(
                                Response::builder()
                                    .header("content-type", "application/json")
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            );
                        }
                        let mut headers = serde_json::Map::new();
                        for (k, v) in req.headers() {
                            headers.insert(
                                k.as_str().to_string(),
                                String::from_utf8_lossy(v.as_bytes()).into_owned().into(),
                            );
                        }
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let v = serde_json::json!({
                            "headers": headers,
                            "body": String::from_utf8_lossy(&body),
                            "body_len": body.len(),
                        });
                        Ok(Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(v.to_string())))
                            .unwrap())
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
        }
    });
    Up { addr, hits }
}

fn yaml(up: SocketAddr) -> String {
    format!(
        r#"listeners:
  - name: main
    address: 127.0.0.1:0
admin: {{ address: 127.0.0.1:0 }}
clusters:
  - name: app
    endpoints: ["{up}"]
routes:
  - name: redact
    path_prefix: /redact
    cluster: app
  - name: strict
    path_prefix: /strict
    cluster: app
  - name: all
    cluster: app
secrets:
  enabled: true
  action: block
  scan_responses: true
  # The scan budget is wall-clock: an unoptimised build on a loaded machine can pass the
  # default 50 ms, and on_limit's default (allow) would then forward the body uninspected.
  # These tests are about what is detected, so they get a generous budget and fail closed.
  scan_timeout: 10s
  on_limit: block
  routes:
    redact: {{ action: redact }}
    strict: {{ response_action: block }}
"#
    )
}

async fn start() -> (Up, moat_proxy::RunningGateway, tempfile::TempDir) {
    let up = upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let opts = GatewayOptions {
        admin: moat_proxy::engine_api::engine_routes(AdminRouter::new(), None),
        ..GatewayOptions::default()
    };
    let gw = gateway(dir.path(), &yaml(up.addr), opts).await;
    (up, gw, dir)
}

fn post_json(url: String, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

fn rule_ids(v: &serde_json::Value) -> Vec<String> {
    v["findings"]
        .as_array()
        .unwrap_or_else(|| panic!("no findings: {v}"))
        .iter()
        .map(|f| f["rule_id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_mode_lists_rule_ids_never_the_secret_and_does_not_forward() {
    let (up, gw, _dir) = start().await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();

    let body = format!(r#"{{"name":"deploy","aws_access_key_id":"{AWS_KEY}"}}"#);
    let (s, _, resp) = send(&c, post_json(format!("http://{addr}/config"), body)).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{resp:?}");
    let text = String::from_utf8_lossy(&resp);
    assert!(
        !text.contains(AWS_KEY),
        "the reply leaks the secret: {text}"
    );
    let v = json(&resp);
    assert_eq!(v["error"], "secret detected");
    assert!(rule_ids(&v).iter().any(|r| r == "aws-access-key-id"), "{v}");
    assert!(v["event_id"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    assert_eq!(up.hits(), 0, "a blocked body must not reach the upstream");

    // A clean body passes unchanged.
    let clean = r#"{"name":"deploy","region":"eu-west-1"}"#;
    let (s, _, resp) = send(&c, post_json(format!("http://{addr}/config"), clean)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&resp)["body"], clean);
    assert_eq!(up.hits(), 1);

    // A password in a login form is a credential in its designated place, not a
    // finding: forwarded unchanged (docs/secrets.md, "Direction and context").
    let login = r#"{"username":"ann","password":"oiADN5RpVI2XQWhX1ssrKrxq"}"#;
    let (s, _, resp) = send(&c, post_json(format!("http://{addr}/login"), login)).await;
    assert_eq!(s, StatusCode::OK, "{resp:?}");
    assert_eq!(json(&resp)["body"], login);
    assert_eq!(up.hits(), 2);
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gzip_encoded_body_with_a_secret_is_detected() {
    let (up, gw, _dir) = start().await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();

    // Enough repetitive text that deflate uses Huffman-coded blocks (not stored ones).
    let filler = "lorem ipsum dolor sit amet ".repeat(200);
    let plain =
        format!(r#"{{"note":"{filler}","aws_access_key_id":"{AWS_KEY}","more":"{filler}"}}"#);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(plain.as_bytes()).unwrap();
    let compressed = gz.finish().unwrap();
    assert!(
        !compressed
            .windows(AWS_KEY.len())
            .any(|w| w == AWS_KEY.as_bytes()),
        "the compressed body must not contain the secret in clear"
    );
    let req = Request::post(format!("http://{addr}/upload"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(compressed)))
        .unwrap();
    let (s, _, resp) = send(&c, req).await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{resp:?}");
    assert!(rule_ids(&json(&resp))
        .iter()
        .any(|r| r == "aws-access-key-id"));
    assert_eq!(up.hits(), 0);

    // Redact mode on a gzip body: the upstream gets the decoded, redacted JSON, without
    // Content-Encoding and with a matching Content-Length.
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(plain.as_bytes()).unwrap();
    let req = Request::post(format!("http://{addr}/redact/upload"))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(gz.finish().unwrap())))
        .unwrap();
    let (s, _, resp) = send(&c, req).await;
    assert_eq!(s, StatusCode::OK, "{resp:?}");
    let echo = json(&resp);
    assert!(echo["headers"].get("content-encoding").is_none(), "{echo}");
    let received = echo["body"].as_str().unwrap();
    let forwarded: serde_json::Value = serde_json::from_str(received).unwrap();
    assert_eq!(
        forwarded["aws_access_key_id"],
        "[REDACTED:aws-access-key-id]"
    );
    assert_eq!(forwarded["note"].as_str().unwrap().len(), filler.len());
    assert_eq!(
        echo["headers"]["content-length"],
        received.len().to_string()
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redact_mode_forwards_valid_json_with_a_correct_content_length() {
    let (up, gw, _dir) = start().await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();

    let body = format!(
        r#"{{"user":"bob","keys":{{"aws_access_key_id":"{AWS_KEY}"}},"note":"plain text"}}"#
    );
    let (s, _, resp) = send(&c, post_json(format!("http://{addr}/redact/save"), body)).await;
    assert_eq!(s, StatusCode::OK, "{resp:?}");
    assert_eq!(up.hits(), 1);
    let echo = json(&resp);
    let received = echo["body"].as_str().unwrap();
    assert!(!received.contains(AWS_KEY), "{received}");
    let forwarded: serde_json::Value = serde_json::from_str(received)
        .unwrap_or_else(|e| panic!("the upstream got invalid JSON ({e}): {received}"));
    assert_eq!(
        forwarded["keys"]["aws_access_key_id"],
        "[REDACTED:aws-access-key-id]"
    );
    assert_eq!(forwarded["user"], "bob");
    assert_eq!(forwarded["note"], "plain text");
    let len = echo["body_len"].as_u64().unwrap();
    assert_eq!(len as usize, received.len());
    assert_eq!(
        echo["headers"]["content-length"],
        len.to_string(),
        "Content-Length must match the redacted body: {echo}"
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redact_mode_on_a_form_body_percent_encodes_the_marker() {
    let (up, gw, _dir) = start().await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let req = Request::post(format!("http://{addr}/redact/form"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(format!(
            "user=bob&aws_access_key_id={AWS_KEY}&x=1"
        ))))
        .unwrap();
    let (s, _, resp) = send(&c, req).await;
    assert_eq!(s, StatusCode::OK, "{resp:?}");
    assert_eq!(up.hits(), 1);
    let echo = json(&resp);
    let received = echo["body"].as_str().unwrap();
    assert_eq!(
        received,
        "user=bob&aws_access_key_id=%5BREDACTED%3Aaws-access-key-id%5D&x=1"
    );
    assert_eq!(
        echo["headers"]["content-length"],
        received.len().to_string()
    );
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_bodies_are_redacted_or_blocked() {
    let (up, gw, _dir) = start().await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();

    // `response_action: block`: the leaking response is replaced (502 for responses),
    // without the secret.
    let req = Request::get(format!("http://{addr}/strict/leak"))
        .header("accept", "application/json")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, _, resp) = send(&c, req).await;
    assert_eq!(
        up.hits(),
        1,
        "the upstream is called; its answer is blocked"
    );
    assert_eq!(s, StatusCode::BAD_GATEWAY, "{resp:?}");
    let text = String::from_utf8_lossy(&resp);
    assert!(!text.contains(AWS_KEY), "{text}");
    assert!(rule_ids(&json(&resp))
        .iter()
        .any(|r| r == "aws-access-key-id"));

    // Redact mode (and the default response action with `action: block`, the
    // `all` route): the client gets the upstream's JSON with the secret replaced.
    for path in ["/redact/leak", "/leak"] {
        let (s, h, resp) = send(
            &c,
            Request::get(format!("http://{addr}{path}"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{path}: {resp:?}");
        let v = json(&resp);
        assert_eq!(
            v["config"]["aws_access_key_id"],
            "[REDACTED:aws-access-key-id]"
        );
        assert_eq!(v["config"]["region"], "eu-west-1");
        if let Some(cl) = h.get("content-length") {
            assert_eq!(cl.to_str().unwrap(), resp.len().to_string());
        }
    }

    // A gzip-encoded response is decoded, redacted and sent without Content-Encoding.
    let (s, h, resp) = send(
        &c,
        Request::get(format!("http://{addr}/redact/leak-gz"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{resp:?}");
    assert!(h.get("content-encoding").is_none(), "{h:?}");
    let v = json(&resp);
    assert_eq!(v["aws_access_key_id"], "[REDACTED:aws-access-key-id]");
    assert_eq!(v["pad"].as_str().unwrap().len(), 2000);
    if let Some(cl) = h.get("content-length") {
        assert_eq!(cl.to_str().unwrap(), resp.len().to_string());
    }

    // Block mode on the gzip response: no secret, compressed or not, reaches the client.
    let req = Request::get(format!("http://{addr}/strict/leak-gz"))
        .header("accept", "application/json")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (s, _, resp) = send(&c, req).await;
    assert_eq!(s, StatusCode::BAD_GATEWAY, "{resp:?}");
    gw.shutdown(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_api_on_the_admin_listener() {
    let (_up, gw, _dir) = start().await;
    let admin = gw.admin_addr();
    let c = client();
    let scan = |body: String| {
        Request::post(format!("http://{admin}/v1/scan"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };

    let found = serde_json::json!({"payloads": [
        {"id": "cfg", "data": format!("region = eu\naws_access_key_id = {AWS_KEY}\n")},
        {"id": "readme", "data": "nothing to see"}
    ]});
    let (s, _, resp) = send(&c, scan(found.to_string())).await;
    assert_eq!(s, StatusCode::OK, "{resp:?}");
    let v = json(&resp);
    assert_eq!(v["status"], "FOUND", "{v}");
    let results = v["results"].as_array().unwrap();
    assert!(results.iter().any(|r| r["payload_id"] == "cfg"
        && r["rule_id"] == "aws-access-key-id"
        && r["line"] == 2));
    assert!(results.iter().all(|r| r["payload_id"] == "cfg"), "{v}");
    assert!(!String::from_utf8_lossy(&resp).contains(AWS_KEY), "{v}");

    let clean = serde_json::json!({"payloads": [{"id": "a", "data": "hello world"}]});
    let (s, _, resp) = send(&c, scan(clean.to_string())).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(json(&resp)["status"], "NOT_FOUND");

    let (s, _, resp) = send(&c, scan("{not json".into())).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(json(&resp)["status"], "INPUT_ERROR");

    let unknown = r#"{"payloads":[{"id":"a","data":"x"}],"bogus":1}"#;
    let (s, _, resp) = send(&c, scan(unknown.into())).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(json(&resp)["status"], "INPUT_ERROR");

    let (s, _, _) = send(
        &c,
        Request::get(format!("http://{admin}/v1/scan"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    gw.shutdown(Duration::from_secs(2)).await;
}
