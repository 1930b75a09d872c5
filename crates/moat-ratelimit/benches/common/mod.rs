//! The engines and request the bench and the instruction-count example share.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::Path;
use std::sync::Arc;

use moat_core::RequestCtx;
use moat_ratelimit::{RateLimitConfig, RateLimitEngine};

/// One rule keyed on the client IP, a limit every request is within (the common case).
pub const PER_IP: &str = "rules:\n  - name: per-ip\n    rate: 1000000000\n    per: 1s\n";

/// One rule on a path template keyed on an API key header and the route.
pub const PER_TOKEN: &str = "rules:\n  - name: per-token\n    rate: 1000000000\n    per: 1s\n    path: {template: \"/users/{id}\"}\n    key: [{header: x-api-key}, route]\n";

pub fn engine(yaml: &str) -> Arc<RateLimitEngine> {
    let cfg: RateLimitConfig = moat_config::from_str(Path::new("bench.yaml"), yaml).unwrap();
    RateLimitEngine::build(
        &cfg,
        Path::new("bench.yaml"),
        Path::new("."),
        &["app"],
        None,
        None,
    )
    .unwrap()
}

pub fn request() -> (RequestCtx, http::request::Parts) {
    let (parts, _) = http::Request::get("http://api.example/users/42")
        .header("host", "api.example")
        .header("x-api-key", "k-0123456789abcdef")
        .body(())
        .unwrap()
        .into_parts();
    (RequestCtx::for_test("app"), parts)
}

/// The client of the `i`th request: one of 1024, so the table is warm but not a
/// single entry.
pub fn client(i: u32) -> std::net::IpAddr {
    std::net::Ipv4Addr::from(0x0a00_0000 | (i & 1023)).into()
}
