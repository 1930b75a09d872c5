//! The rate limit phase on hostile request heads: clearance cookies, challenge
//! solutions, header keys and bearer tokens from the network must never panic.
#![no_main]

use std::path::Path;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use moat_core::{RequestCtx, RequestHeadersPhase};
use moat_ratelimit::{RateLimitConfig, RateLimitEngine};

const CONFIG: &str = r#"
challenge:
  routes: [app]
  difficulty: 8
  keys: [{ id: k1, secret: "fuzz-secret-0123456789-0123456789-abcdef" }]
  exempt: { tokens: [t0k3n] }
rules:
  - name: per-key
    key: [{header: x-key}, ip, path]
    path: { template: "/u/{id}/x" }
    rate: 5
    per: 1s
"#;

fn engine() -> &'static Arc<RateLimitEngine> {
    static E: OnceLock<Arc<RateLimitEngine>> = OnceLock::new();
    E.get_or_init(|| {
        let cfg: RateLimitConfig = moat_config::from_str(Path::new("fuzz.yaml"), CONFIG).unwrap();
        RateLimitEngine::build(
            &cfg,
            Path::new("fuzz.yaml"),
            Path::new("."),
            &["app"],
            None,
            None,
        )
        .unwrap()
    })
}

fuzz_target!(|data: &[u8]| {
    // cookie \0 query \0 authorization \0 path
    let mut it = data.split(|b| *b == 0);
    let (cookie, query, auth, path) = (
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
        it.next().unwrap_or_default(),
    );
    let path = String::from_utf8_lossy(path);
    let query = String::from_utf8_lossy(query);
    let mut b = http::Request::get(format!("/{}?{}", path.trim_start_matches('/'), query));
    for (name, v) in [
        ("cookie", cookie),
        ("authorization", auth),
        ("x-key", cookie),
    ] {
        if let Ok(v) = http::HeaderValue::from_bytes(v) {
            b = b.header(name, v);
        }
    }
    let Ok(req) = b.body(()) else { return };
    let (mut parts, _) = req.into_parts();
    let mut ctx = RequestCtx::for_test("app");
    let _ = engine().on_request_headers(&mut ctx, &mut parts);
});
