//! Runs one benchmark request through the engine N times, for instruction counts
//! that do not depend on machine load:
//!
//! ```sh
//! cargo build --release -p moat-waf --example hotpath
//! valgrind --tool=callgrind target/release/examples/hotpath json_1k_benign 1000
//! ```
//!
//! Cases (the same requests as `benches/inspect.rs`): `json_1k_benign`,
//! `json_1k_attack`, `form_64k_benign`, `get_headers_benign`, `post_json_peer`
//! (the proxy's phases on scripts/peer-perf's 1 KiB JSON POST), `get_browser`
//! (the phases on a browser GET), `get_browser_new_ua` (the same with a
//! User-Agent never seen before on every request).
//!
//! `MOAT_HOTPATH_NO_PATCHES=1` builds the engine with `virtual_patches.builtin:
//! false` (the cost of the same requests without virtual patches).
use std::hint::black_box;

use moat_waf::{BodyView, WafConfig, WafEngine};

#[path = "../benches/common/mod.rs"]
mod common;

fn main() {
    let mut args = std::env::args().skip(1);
    let case = args.next().unwrap_or_default();
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let mut cfg = WafConfig::default();
    if std::env::var_os("MOAT_HOTPATH_NO_PATCHES").is_some_and(|v| v == "1") {
        cfg.virtual_patches.builtin = false;
    }
    let engine = match WafEngine::build(&cfg) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    let body_only = |view: &moat_waf::RequestView<'_>, data: &[u8]| {
        for _ in 0..n {
            black_box(engine.inspect_body_only(
                "bench",
                view,
                BodyView {
                    data: black_box(data),
                    truncated: false,
                },
            ));
        }
    };
    match case.as_str() {
        "json_1k_benign" => body_only(&common::json_view(), &common::json_1k(false)),
        "json_1k_attack" => body_only(&common::json_view(), &common::json_1k(true)),
        "form_64k_benign" => body_only(
            &moat_waf::RequestView {
                method: "POST",
                target: b"/submit",
                headers: common::headers("application/x-www-form-urlencoded"),
            },
            &common::form(64 << 10),
        ),
        "get_headers_benign" => {
            let view = common::get_view();
            for _ in 0..n {
                black_box(engine.inspect_headers("bench", black_box(&view)));
            }
        }
        "get_browser_new_ua" => {
            let mut parts = common::parts(None);
            let mut ctx = moat_core::RequestCtx::for_test("bench");
            for i in 0..n {
                common::fresh_user_agent(&mut parts, i as u64);
                black_box(common::run_phases(&engine, &mut ctx, &mut parts, None));
            }
        }
        "post_json_peer" | "get_browser" => {
            let json = if case == "post_json_peer" {
                match common::peer_json() {
                    Some(j) => Some(j),
                    None => {
                        eprintln!("../shared/tools/peer-eval/perf/post_1k.json not found");
                        std::process::exit(2);
                    }
                }
            } else {
                None
            };
            let mut parts = common::parts(json.as_ref().map(Vec::len));
            let mut body = json.map(|j| {
                moat_core::Body::new(
                    bytes::Bytes::from(j),
                    None,
                    false,
                    moat_core::DecodeLimits::default(),
                )
            });
            let mut ctx = moat_core::RequestCtx::for_test("bench");
            for _ in 0..n {
                black_box(common::run_phases(
                    &engine,
                    &mut ctx,
                    &mut parts,
                    body.as_mut(),
                ));
            }
        }
        other => {
            eprintln!("unknown case `{other}`");
            std::process::exit(2);
        }
    }
}
