//! The web console in a real headless Chromium, driven through chromedriver (WebDriver),
//! against a real `moat serve` process: log in, find a real SQL injection's event by
//! filter, open it, apply the exclusion, see the same request pass; the inventory lists
//! the endpoints called; the policy form answers as `moat policy check` does.
//! Screenshots of each page go to `$CARGO_TARGET_DIR/console-screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use moat_testkit::{free_port, real_part, wait_for_port, ChildGuard};
use serde_json::{json, Value};

const TOKEN: &str = "console-test-token-1234";

/// A blocking HTTP/1.1 exchange (`Connection: close`): status and body.
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    http_with(addr, method, path, body, "")
}

/// [`http`] with extra header lines (`name: value\r\n` each).
fn http_with(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    extra: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    let ct = if body.is_empty() {
        String::new()
    } else {
        format!(
            "content-type: application/json\r\ncontent-length: {}\r\n",
            body.len()
        )
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\n{extra}{ct}connection: close\r\n\r\n{body}"
    )
    .unwrap();
    // Read the head, then Content-Length bytes (chromedriver keeps connections open
    // whatever `Connection` says), or to the end.
    let mut out = Vec::new();
    let mut buf = [0u8; 16384];
    let fail = |e: std::io::Error| -> ! { panic!("{method} {path} on {addr}: {e}") };
    let end = loop {
        if let Some(p) = out.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        match s.read(&mut buf) {
            Ok(0) => break out.len(),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => fail(e),
        }
    };
    let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
    let len: Option<usize> = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok());
    loop {
        if len.is_some_and(|l| out.len() >= end + l) {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => fail(e),
        }
    }
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = String::from_utf8_lossy(&out[end..]).into_owned();
    (status, body)
}

/// An upstream answering every request with a small JSON document.
fn upstream() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let mut req = Vec::new();
                loop {
                    let Some(end) = req.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&req[..end]).to_ascii_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    while req.len() < end + 4 + len {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body = r#"{"id":42,"name":"alice","email":"alice@example.com"}"#;
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    req.drain(..end + 4 + len);
                }
            });
        }
    });
    addr
}

/// A minimal WebDriver client: JSON over HTTP/1.1 to chromedriver.
struct Driver {
    addr: SocketAddr,
    session: String,
}

impl Driver {
    fn call(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string());
        let (status, text) = http(addr, method, path, body.as_deref());
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("webdriver {method} {path}: {status} {text}"));
        assert!(
            status == 200,
            "webdriver {method} {path}: {status} {}",
            v["value"]
        );
        v["value"].clone()
    }

    fn new(addr: SocketAddr, chromium: &Path, profile: &Path) -> Driver {
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1280,1000", "--ignore-certificate-errors", format!("--user-data-dir={}", profile.display())],
            },
        } } });
        let v = Self::call(addr, "POST", "/session", Some(caps));
        Driver {
            addr,
            session: v["sessionId"].as_str().unwrap().to_string(),
        }
    }

    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let p = format!("/session/{}{path}", self.session);
        Self::call(self.addr, method, &p, body)
    }

    fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })));
    }

    fn find(&self, css: &str) -> String {
        let v = self.cmd(
            "POST",
            "/element",
            Some(json!({ "using": "css selector", "value": css })),
        );
        v.as_object()
            .and_then(|o| o.values().next())
            .and_then(|v| v.as_str())
            .unwrap()
            .to_string()
    }

    /// Waits (up to 20 s) until an element matches `css`: a click that submits a form
    /// may return before the next page is there.
    fn wait_for(&self, css: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let path = format!("/session/{}/element", self.session);
        let body = json!({ "using": "css selector", "value": css }).to_string();
        while http(self.addr, "POST", &path, Some(&body)).0 != 200 {
            assert!(Instant::now() < deadline, "no {css} on {}", self.url());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.cmd("POST", &format!("/element/{e}/click"), Some(json!({})));
    }

    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.cmd("POST", &format!("/element/{e}/clear"), Some(json!({})));
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        );
    }

    fn text(&self, css: &str) -> String {
        let e = self.find(css);
        self.cmd("GET", &format!("/element/{e}/text"), None)
            .as_str()
            .unwrap_or("")
            .to_string()
    }

    fn url(&self) -> String {
        self.cmd("GET", "/url", None).as_str().unwrap().to_string()
    }

    fn source(&self) -> String {
        self.cmd("GET", "/source", None)
            .as_str()
            .unwrap()
            .to_string()
    }

    fn screenshot(&self, dir: &Path, name: &str) {
        use base64::Engine as _;
        let b64 = self.cmd("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let p = format!("/session/{}", self.session);
        let _ = std::panic::catch_unwind(|| http(self.addr, "DELETE", &p, None));
    }
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| moat_testkit::workspace_root().join("target"));
    let dir = target.join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const POLICIES: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: { name: deny-admin, namespace: default }
spec:
  selector: { matchLabels: { app: shop } }
  action: DENY
  rules:
    - to: [{ operation: { paths: ["/admin*"] } }]
"#;

#[test]
fn console_in_a_real_browser() {
    let Some(chromium) = real_part("chromium", "scripts/ensure-apt chromium chromium-driver")
    else {
        return;
    };
    let Some(chromedriver) = real_part(
        "chromedriver",
        "scripts/ensure-apt chromium chromium-driver",
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let shots = screenshot_dir();
    let up = upstream();
    let (listen, admin) = (free_port().unwrap(), free_port().unwrap());
    let tls_port = free_port().unwrap();
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).unwrap();
    let moat = env!("CARGO_BIN_EXE_moat");
    let certs = Command::new(moat)
        .args(["certs", "--out"])
        .arg(dir.path().join("certs"))
        .output()
        .unwrap();
    assert!(certs.status.success(), "{certs:?}");
    let cfg = dir.path().join("moat.yaml");
    std::fs::write(
        &cfg,
        format!(
            "# console test\nlisteners:\n  - name: main\n    address: 127.0.0.1:{listen}\n  - name: tls\n\
             \x20   address: 127.0.0.1:{tls_port}\n    tls: {{ certificates: [{{ cert: certs/server.crt, key: certs/server.key }}] }}\n\
             admin:\n  address: 127.0.0.1:{admin}\n  token: {TOKEN}\n\
             tls_audit: {{ enabled: true }}\n\
             clusters:\n  - name: shop\n    endpoints: [\"{up}\"]\n    labels: {{ app: shop }}\n    namespace: default\n\
             routes:\n  - name: api\n    cluster: shop\n\
             events:\n  store: {{ path: events.db }}\n  sink: {{ type: none }}\n\
             authz:\n  enabled: true\n  policies: [policies.yaml]\n\
             discovery: {{ enabled: true }}\n\
             waf:\n  enabled: true\n  mode: block\n"
        ),
    )
    .unwrap();
    let _gw = ChildGuard(
        Command::new(moat)
            .args(["serve", "--log-format", "text", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("moat.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for_port(admin, Duration::from_secs(20)),
        "moat did not start: {}",
        std::fs::read_to_string(dir.path().join("moat.log")).unwrap_or_default()
    );
    assert!(wait_for_port(listen, Duration::from_secs(5)));
    let gw: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();

    // Real traffic: two API calls, a denied path, a SQL injection.
    assert_eq!(http(gw, "GET", "/api/users/42", None).0, 200);
    assert_eq!(
        http(
            gw,
            "POST",
            "/api/orders",
            Some(r#"{"item":"book","qty":2}"#)
        )
        .0,
        200
    );
    assert_eq!(http(gw, "GET", "/admin/panel", None).0, 403);
    let sqli = "/search?q=1%27%20OR%20%271%27=%271";
    let (status, page) = http(gw, "GET", sqli, None);
    assert_eq!(status, 403, "the SQL injection is blocked");
    // What the blocked user sees and quotes to support.
    let event_id = page
        .split("Event id: <code>")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_else(|| panic!("no event id on the block page: {page}"))
        .to_string();

    let driver_port = free_port().unwrap();
    let _driver = ChildGuard(
        Command::new(&chromedriver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for_port(driver_port, Duration::from_secs(20)));
    let wd: SocketAddr = format!("127.0.0.1:{driver_port}").parse().unwrap();
    let profile = dir.path().join("chromium-profile");
    let d = Driver::new(wd, &chromium, &profile);
    let base = format!("http://127.0.0.1:{admin}");

    // Not logged in: the login page. A wrong token is refused.
    d.goto(&format!("{base}/console/events"));
    assert!(d.url().ends_with("/console/login"), "{}", d.url());
    d.screenshot(&shots, "login");
    d.type_into("input[name=token]", "wrong");
    d.click("#login");
    d.wait_for("p.error");
    let page = d.source();
    assert!(page.contains("Wrong admin token"), "{page}");
    d.type_into("input[name=token]", TOKEN);
    d.click("#login");
    d.wait_for("#rps");
    assert!(d.url().ends_with("/console"), "{}", d.url());
    let cookies = d.cmd("GET", "/cookie", None);
    let c = cookies
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "moat_console")
        .expect("session cookie");
    assert_eq!(c["httpOnly"], true);
    assert_eq!(c["sameSite"], "Strict");
    let session = format!("cookie: moat_console={}\r\n", c["value"].as_str().unwrap());
    // The live chart is drawn by console.js (a file: the CSP forbids inline scripts)
    // from the request counters, while traffic flows.
    let traffic = std::thread::spawn(move || {
        for i in 0..60 {
            http(gw, "GET", &format!("/api/users/{i}"), None);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    let line = d.find("#rps-chart polyline");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let points = d.cmd("GET", &format!("/element/{line}/attribute/points"), None);
        if points.as_str().unwrap_or("").split(' ').count() >= 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "console.js drew no line: {points}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_ne!(d.text("#rps"), "0.0", "requests/s while traffic flows");
    d.screenshot(&shots, "overview");
    traffic.join().unwrap();

    // Find the SQL injection by filter, open it.
    d.goto(&format!("{base}/console/events"));
    d.type_into("#f-rule", "sqli");
    d.click("#filter");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !d.url().contains("rule=sqli") {
        assert!(Instant::now() < deadline, "the filter was not submitted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !d.source().contains("a class=\"event\"") {
        // The event writer commits in batches: poll.
        assert!(Instant::now() < deadline, "no sqli event listed");
        std::thread::sleep(Duration::from_millis(300));
        d.cmd("POST", "/refresh", Some(json!({})));
    }
    d.screenshot(&shots, "events");
    d.click("a.event");
    d.wait_for("#detail");
    let detail = d.text("#detail");
    assert!(detail.contains("sqli"), "{detail}");
    assert!(d.text("#request-line").contains("GET /search?q=1%27%20OR"));
    assert!(d.text("#headers").contains("host"));
    assert!(detail.contains(&event_id), "{detail}");

    // Support's way in: the event id from the block page, alone in the listing.
    d.goto(&format!("{base}/console/events"));
    d.type_into("#f-event_id", &event_id);
    d.click("#filter");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !d.url().contains("event_id=") {
        assert!(Instant::now() < deadline, "the filter was not submitted");
        std::thread::sleep(Duration::from_millis(100));
    }
    let listing = d.source();
    assert_eq!(listing.matches("a class=\"event\"").count(), 1, "{listing}");
    d.click("a.event");
    d.wait_for("#detail");
    assert!(d.text("#detail").contains(&event_id));
    d.screenshot(&shots, "event");

    // Exclude: the snippet and the diff, then apply.
    d.click("#exclude");
    d.wait_for("#snippet");
    let snippet = d.text("#snippet");
    assert!(snippet.contains("detector: \"sqli\""), "{snippet}");
    assert!(snippet.contains("path_prefix: \"/search\""), "{snippet}");
    let diff = d.text("#diff");
    assert!(diff.contains("+    - route: \"api\""), "{diff}");
    d.screenshot(&shots, "exclude");
    d.click("#apply");
    d.wait_for("#applied");
    let page = d.source();
    assert!(page.contains("id=\"applied\""), "{page}");
    assert!(d.text("#reloads").contains("console: WAF exclusion"));
    d.screenshot(&shots, "config");
    let on_disk = std::fs::read_to_string(&cfg).unwrap();
    assert!(on_disk.starts_with("# console test\n"), "comments kept");
    assert!(on_disk.contains("detector: \"sqli\""));

    // The same request passes now; another attack on another path is still blocked.
    assert_eq!(http(gw, "GET", sqli, None).0, 200);
    assert_eq!(
        http(gw, "GET", "/api/users/1?id=1%27%20OR%20%271%27=%271", None).0,
        403
    );

    // The inventory lists the endpoints called (discovery's worker runs behind).
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        d.goto(&format!("{base}/console/apis"));
        let t = d.source();
        if t.contains("/api/orders") && t.contains("/api/users/") {
            break;
        }
        assert!(Instant::now() < deadline, "inventory incomplete: {t}");
        std::thread::sleep(Duration::from_millis(500));
    }
    d.screenshot(&shots, "apis");
    // The OpenAPI download is behind the session as well.
    let admin_addr: SocketAddr = format!("127.0.0.1:{admin}").parse().unwrap();
    let (status, _) = http(admin_addr, "GET", "/console/openapi.json", None);
    assert_eq!(status, 303, "no session: redirected to the login page");
    let (status, doc) = http_with(admin_addr, "GET", "/console/openapi.json", None, &session);
    assert_eq!(status, 200);
    let doc: Value = serde_json::from_str(&doc).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.keys().any(|p| p == "/api/orders"), "{paths:?}");

    // The policy form answers as `moat policy check` does.
    d.goto(&format!("{base}/console/policy"));
    d.type_into("#p-url", "http://shop.local/admin/users");
    d.click("#p-check");
    d.wait_for("#p-text");
    let console_answer = d.text("#p-text");
    d.screenshot(&shots, "policy");
    let cli = Command::new(moat)
        .args(["policy", "check", "--policies"])
        .arg(dir.path().join("policies.yaml"))
        .args([
            "--url",
            "http://shop.local/admin/users",
            "--label",
            "app=shop",
            "--namespace",
            "default",
        ])
        .output()
        .unwrap();
    let cli_answer = String::from_utf8_lossy(&cli.stdout);
    assert_eq!(console_answer.trim(), cli_answer.trim());
    assert!(cli_answer.starts_with("403 DENY"), "{cli_answer}");

    // A real TLS handshake from Chromium (the certificate is moat's own test CA's),
    // audited: the TLS page counts it.
    d.goto(&format!("https://127.0.0.1:{tls_port}/api/users/7"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        d.goto(&format!("{base}/console/tls"));
        if d.text("#tls-versions").contains("TLS 1.3") {
            break;
        }
        assert!(Instant::now() < deadline, "no audited handshake");
        std::thread::sleep(Duration::from_millis(300));
    }
    // The served certificate, from the audit record, with its expiry.
    let certs = d.text("#certs");
    assert!(
        certs.contains("served") && certs.contains("days left"),
        "certificate expiry: {certs}"
    );
    d.screenshot(&shots, "tls");
    eprintln!("screenshots in {}", shots.display());
}
