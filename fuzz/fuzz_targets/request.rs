//! A whole raw request (head parsing, query/cookie/header decomposition,
//! chunked and Content-Encoding gzip/deflate/br decoding, JSON in UTF-8/16,
//! XML, multipart and form bodies) through the engine with small limits.
//! Inspecting the same request twice must give the same result (the second
//! pass is served partly by the per-thread clean-header memo).
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use moat_core::DecodeLimits;
use moat_waf::{rawhttp::RawRequest, BodyView, WafConfig, WafEngine};

fn engine() -> &'static WafEngine {
    static E: OnceLock<std::sync::Arc<WafEngine>> = OnceLock::new();
    E.get_or_init(|| {
        let mut c = WafConfig::default();
        c.limits.max_params = 256;
        c.limits.max_json_depth = 16;
        WafEngine::build(&c).unwrap_or_else(|e| panic!("{e}"))
    })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = RawRequest::parse(data) {
        let view = req.view();
        let limits = DecodeLimits {
            max_output: 1 << 20,
            max_ratio: 100,
        };
        let body = req
            .decoded_body(limits)
            .unwrap_or_else(|_| req.body.clone());
        assert!(body.len() <= (1 << 20).max(req.body.len()));
        let run = || {
            engine().inspect(
                "fuzz",
                &view,
                Some(BodyView {
                    data: &body,
                    truncated: false,
                }),
            )
        };
        let first = run();
        assert!(first.findings.len() <= 32);
        let second = run();
        assert_eq!(first.findings, second.findings);
        assert_eq!(first.limits, second.limits);
    }
});
