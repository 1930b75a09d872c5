//! A whole raw request (head parsing, query/cookie/header decomposition, JSON,
//! XML, multipart and form bodies) through the engine with small limits.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
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
        let f = engine().inspect("fuzz", &view, Some(BodyView { data: &req.body, truncated: false }));
        assert!(f.findings.len() <= 32);
    }
});
