//! Runs N local limit decisions, for instruction counts that do not depend on the
//! machine's load (the `decide` bench's cases):
//!
//! ```sh
//! cargo build --release -p moat-ratelimit --example decide
//! valgrind --tool=callgrind target/release/examples/decide ip 100000
//! ```
//!
//! Cases: `ip` (one rule keyed on the client IP, 1024 clients), `token` (a path
//! template keyed on a header and the route). N = 0 gives the setup's cost to subtract.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use moat_core::RequestHeadersPhase;

#[path = "../benches/common/mod.rs"]
mod common;

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_default();
    let n: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let yaml = match case.as_str() {
        "ip" => common::PER_IP,
        "token" => common::PER_TOKEN,
        other => panic!("unknown case `{other}` (ip, token)"),
    };
    let e = common::engine(yaml);
    let (mut ctx, mut parts) = common::request();
    for i in 0..n {
        ctx.client_ip = common::client(i);
        black_box(e.on_request_headers(&mut ctx, &mut parts));
    }
}
