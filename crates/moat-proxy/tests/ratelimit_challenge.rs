//! The bot challenge against a real headless Chromium (through chromedriver): the
//! browser runs the proof-of-work page and reaches the upstream; a plain HTTP client
//! gets the page and never reaches it; forged and expired cookies are refused;
//! exempt requests pass.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{client, gateway, send, upstream, TestClient};
use http::{Request, StatusCode};
use http_body_util::Full;
use moat_proxy::GatewayOptions;
use moat_ratelimit::config::ChallengeConfig;
use moat_ratelimit::Challenger;
use moat_testkit::{free_port, real_part, wait_for_port, ChildGuard};

const SECRET: &str = "test-secret-0123456789-0123456789-abcdef";

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
  - name: web
    path_prefix: /web
    cluster: app
  - name: all
    cluster: app
ratelimit:
  challenge:
    routes: [web]
    difficulty: 14
    ttl: 10m
    keys: [{{ id: k1, secret: "{SECRET}" }}]
    exempt: {{ headers: [x-api-client], paths: [/web/health], tokens: [ci-token] }}
"#
    )
}

async fn get(
    c: &TestClient,
    url: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, Bytes) {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(c, b.body(Full::new(Bytes::new())).unwrap()).await
}

/// The gateway's own challenger, to make cookies a browser could not have.
fn challenger() -> Challenger {
    let text = format!(
        "routes: [web]\ndifficulty: 14\nttl: 10m\nkeys: [{{ id: k1, secret: \"{SECRET}\" }}]\n"
    );
    let cfg: ChallengeConfig =
        moat_config::from_str(std::path::Path::new("t.yaml"), &text).unwrap();
    Challenger::new(&cfg)
}

fn loopback_binding() -> [u8; 16] {
    std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_client_gets_the_page_and_forged_or_expired_cookies_are_refused() {
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &yaml(up.addr), GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let c = client();
    let url = format!("http://{addr}/web/page");
    let (st, h, body) = get(&c, &url, &[]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert!(h.get("x-upstream").is_none());
    let page = String::from_utf8_lossy(&body);
    assert!(page.contains("Checking your browser"), "{page}");
    assert!(
        !page.contains("src=") && !page.contains("href="),
        "no external assets"
    );
    assert_eq!(up.connections(), 0);
    // Routes without the challenge are untouched.
    assert_eq!(
        get(&c, &format!("http://{addr}/other"), &[]).await.0,
        StatusCode::OK
    );

    let ch = challenger();
    let now = moat_ratelimit::bans::unix_ms() / 1000;
    let good = ch.cookie(&loopback_binding(), now);
    let cookie = |v: &str| format!("moat_clearance={v}");
    assert_eq!(
        get(&c, &url, &[("cookie", &cookie(&good))]).await.0,
        StatusCode::OK
    );
    // Forged: another expiry, another key, another client, garbage.
    let mut parts: Vec<&str> = good.split('.').collect();
    let later = (now + 100_000).to_string();
    parts[1] = &later;
    let forged = parts.join(".");
    let other_key = {
        let cfg: ChallengeConfig = moat_config::from_str(
            std::path::Path::new("t.yaml"),
            "routes: [web]\nkeys: [{ id: k1, secret: \"another-secret-0123456789-0123456789\" }]\n",
        )
        .unwrap();
        Challenger::new(&cfg).cookie(&loopback_binding(), now)
    };
    let other_client = ch.cookie(
        &std::net::Ipv4Addr::new(192, 0, 2, 1)
            .to_ipv6_mapped()
            .octets(),
        now,
    );
    // Expired: issued two lifetimes ago.
    let expired = ch.cookie(&loopback_binding(), now - 1200);
    for bad in [
        forged,
        other_key,
        other_client,
        expired,
        "k1.1.AAAA".into(),
        "x".repeat(5000),
    ] {
        let (st, _, body) = get(&c, &url, &[("cookie", &cookie(&bad))]).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{bad}");
        assert!(String::from_utf8_lossy(&body).contains("Checking your browser"));
    }
    // A wrong solution is refused; a right one sets the cookie and redirects back.
    let (_, _, body) = get(&c, &url, &[]).await;
    let page = String::from_utf8_lossy(&body);
    let challenge = page
        .split("var C=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .to_string();
    let (st, ..) = get(&c, &format!("{url}?a=1&__moat_pow={challenge}.x"), &[]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let solution = Challenger::solve(&challenge, 14);
    let (st, h, _) = get(&c, &format!("{url}?a=1&__moat_pow={solution}"), &[]).await;
    assert_eq!(st, StatusCode::SEE_OTHER);
    assert_eq!(h["location"], "/web/page?a=1");
    let set = h["set-cookie"].to_str().unwrap();
    assert!(
        set.contains("HttpOnly") && set.contains("Max-Age=600"),
        "{set}"
    );
    let value = set.split(';').next().unwrap();
    assert_eq!(get(&c, &url, &[("cookie", value)]).await.0, StatusCode::OK);
    // Exemptions: header, path, bearer token.
    for h in [("x-api-client", "1"), ("authorization", "Bearer ci-token")] {
        assert_eq!(get(&c, &url, &[h]).await.0, StatusCode::OK, "{h:?}");
    }
    assert_eq!(
        get(&c, &url, &[("authorization", "Bearer other")]).await.0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        get(&c, &format!("http://{addr}/web/health"), &[]).await.0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_solves_the_challenge_and_reaches_the_upstream() {
    let Some(driver) = real_part(
        "chromedriver",
        "scripts/ensure-apt chromium chromium-driver",
    ) else {
        return;
    };
    let Some(chromium) = real_part("chromium", "scripts/ensure-apt chromium chromium-driver")
    else {
        return;
    };
    let up = upstream("a").await;
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &yaml(up.addr), GatewayOptions::default()).await;
    let addr = gw.listener_addr("main").unwrap();
    let port = free_port().unwrap();
    let _driver = ChildGuard(
        Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for_port(port, Duration::from_secs(20)),
        "chromedriver did not start"
    );
    let c = client();
    let browser = WebDriver::new_session(&c, port, &chromium).await;
    let url = format!("http://{addr}/web/page?from=chromium");
    browser.go(&url).await;
    // The page works, reloads with its solution, gets the cookie and the upstream's answer.
    let deadline = Instant::now() + Duration::from_secs(30);
    let source = loop {
        let source = browser.source().await;
        if source.contains("\"uri\"") {
            break source;
        }
        assert!(
            Instant::now() < deadline,
            "the browser did not get through: {source}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(source.contains("from=chromium"), "{source}");
    assert!(
        !source.contains("__moat_pow"),
        "the solution is not forwarded: {source}"
    );
    assert_eq!(browser.current_url().await, url);
    let cookie = browser.cookie("moat_clearance").await;
    // The browser's cookie lets it through again without another challenge.
    browser.go(&format!("http://{addr}/web/again")).await;
    assert!(browser.source().await.contains("/web/again"));
    browser.close().await;
    // The same cookie works for a plain client from the same IP; without it, no.
    let with = format!("moat_clearance={cookie}");
    assert_eq!(get(&c, &url, &[("cookie", &with)]).await.0, StatusCode::OK);
    assert_eq!(get(&c, &url, &[]).await.0, StatusCode::FORBIDDEN);
}

/// The few W3C WebDriver commands the test needs, sent to chromedriver. (fantoccini,
/// the maintained client, reaches TLS through hyper-rustls' default aws-lc-rs
/// provider: a C build of several minutes for a test that speaks plain HTTP to
/// localhost.)
struct WebDriver<'a> {
    c: &'a TestClient,
    base: String,
}

impl<'a> WebDriver<'a> {
    async fn call(
        c: &TestClient,
        method: http::Method,
        url: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let req = Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let (st, _, body) = send(c, req).await;
        let v = common::json(&body);
        assert_eq!(st, StatusCode::OK, "webdriver {url}: {v}");
        v["value"].clone()
    }

    async fn new_session(c: &'a TestClient, port: u16, chromium: &std::path::Path) -> Self {
        let caps = serde_json::json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            }
        }}});
        let v = Self::call(
            c,
            http::Method::POST,
            &format!("http://127.0.0.1:{port}/session"),
            caps,
        )
        .await;
        let id = v["sessionId"].as_str().unwrap();
        WebDriver {
            c,
            base: format!("http://127.0.0.1:{port}/session/{id}"),
        }
    }

    async fn go(&self, url: &str) {
        Self::call(
            self.c,
            http::Method::POST,
            &format!("{}/url", self.base),
            serde_json::json!({ "url": url }),
        )
        .await;
    }

    async fn get(&self, what: &str) -> serde_json::Value {
        let req = Request::get(format!("{}/{what}", self.base))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let (st, _, body) = send(self.c, req).await;
        let v = common::json(&body);
        assert_eq!(st, StatusCode::OK, "webdriver {what}: {v}");
        v["value"].clone()
    }

    async fn source(&self) -> String {
        self.get("source").await.as_str().unwrap().to_string()
    }

    async fn current_url(&self) -> String {
        self.get("url").await.as_str().unwrap().to_string()
    }

    async fn cookie(&self, name: &str) -> String {
        self.get(&format!("cookie/{name}")).await["value"]
            .as_str()
            .unwrap()
            .to_string()
    }

    async fn close(&self) {
        let req = Request::delete(self.base.clone())
            .body(Full::new(Bytes::new()))
            .unwrap();
        send(self.c, req).await;
    }
}
