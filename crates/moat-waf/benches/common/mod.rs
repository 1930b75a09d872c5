//! Request inputs shared by the criterion bench (`benches/inspect.rs`) and the
//! callgrind driver (`examples/hotpath.rs`), so instruction counts and timings
//! measure the same requests.

use moat_waf::RequestView;

/// A JSON document of orders, just over 1000 bytes; with `attack`, one comment
/// carries a UNION SELECT.
pub fn json_1k(attack: bool) -> Vec<u8> {
    let mut items = Vec::new();
    let mut i = 0;
    loop {
        let comment = if attack && i == 3 {
            "1' UNION SELECT username, password FROM users-- ".to_string()
        } else {
            format!("Great product, arrived on time {i}")
        };
        items.push(format!(
            "{{\"id\":{i},\"name\":\"Customer number {i}\",\"email\":\"user{i}@example.com\",\"comment\":\"{comment}\",\"tags\":[\"blue\",\"large\"]}}"
        ));
        let doc = format!("{{\"orders\":[{}],\"page\":1}}", items.join(","));
        if doc.len() >= 1000 {
            return doc.into_bytes();
        }
        i += 1;
    }
}

/// A urlencoded form of `len` bytes.
pub fn form(len: usize) -> Vec<u8> {
    let mut s = String::new();
    let mut i = 0;
    while s.len() < len {
        s.push_str(&format!(
            "field{i}=Hello+world+this+is+value+{i}&email{i}=someone%40example.com&qty{i}=42&"
        ));
        i += 1;
    }
    s.truncate(len);
    s.into_bytes()
}

/// Browser-like request headers with the given content type.
pub fn headers(content_type: &'static str) -> moat_waf::ViewHeaders<'static> {
    [
        ("host", b"shop.example.com".as_slice()),
        (
            "user-agent",
            b"Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/114.0.0.0 Safari/537.36".as_slice(),
        ),
        ("accept", b"application/json".as_slice()),
        ("content-type", content_type.as_bytes()),
    ]
    .into_iter()
    .collect()
}

/// `POST /api/orders?page=1` with JSON headers.
pub fn json_view() -> RequestView<'static> {
    RequestView {
        method: "POST",
        target: b"/api/orders?page=1",
        headers: headers("application/json"),
    }
}

/// `GET /search?q=blue+shoes&page=2&sort=price_asc` with browser headers.
pub fn get_view() -> RequestView<'static> {
    RequestView {
        method: "GET",
        target: b"/search?q=blue+shoes&page=2&sort=price_asc",
        headers: headers("application/json"),
    }
}

/// The 1 KiB JSON body scripts/peer-perf POSTs through the proxy (an order with a
/// 600-byte English comment), read from the shared peer-eval tools; `None` when
/// ../shared is not checked out next to the repository.
pub fn peer_json() -> Option<Vec<u8>> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/tools/peer-eval/perf/post_1k.json"
    );
    std::fs::read(p).ok()
}

/// Request parts as the proxy hands them to the phases for wrk's
/// `POST /` (Host, Content-Type, Content-Length) or `GET /search?...` with
/// browser headers.
pub fn parts(post_len: Option<usize>) -> http::request::Parts {
    let b = match post_len {
        Some(len) => http::Request::post("/")
            .header("host", "127.0.0.1:18090")
            .header("content-type", "application/json")
            .header("content-length", len.to_string()),
        None => {
            let mut b = http::Request::get("/search?q=blue+shoes&page=2&sort=price_asc");
            for (n, v) in headers("application/json") {
                b = b.header(n, v);
            }
            b
        }
    };
    match b.body(()) {
        Ok(r) => r.into_parts().0,
        Err(e) => panic!("request: {e}"),
    }
}

/// Gives `parts` a User-Agent never seen before (`n` distinguishes it): the
/// clean-header memo misses, so this measures a first-seen browser request.
pub fn fresh_user_agent(parts: &mut http::request::Parts, n: u64) {
    let ua = format!(
        "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/114.0.{n}.0 Safari/537.36"
    );
    if let Ok(v) = http::HeaderValue::from_str(&ua) {
        parts.headers.insert(http::header::USER_AGENT, v);
    }
}

/// Everything the proxy calls on the WAF for one request: the head phase, the
/// body-need query and (with a body) the body phase. Returns true when a phase
/// answered (blocked).
pub fn run_phases(
    engine: &moat_waf::WafEngine,
    ctx: &mut moat_core::RequestCtx,
    parts: &mut http::request::Parts,
    body: Option<&mut moat_core::Body>,
) -> bool {
    use moat_core::{BodyNeed, RequestBodyPhase, RequestHeadersPhase, Verdict};
    if let Verdict::Respond(_) = engine.on_request_headers(ctx, parts) {
        return true;
    }
    let Some(body) = body else { return false };
    if engine.body_need(ctx, parts) == BodyNeed::None {
        return false;
    }
    matches!(
        engine.on_request_body(ctx, parts, body),
        Verdict::Respond(_)
    )
}
