//! The tokenizers and detectors (SQL lexer, HTML tag parser, shell tokenizer,
//! structural detectors) on arbitrary text in every scope: no panic, fragments bounded.
#![no_main]
use libfuzzer_sys::fuzz_target;
use moat_waf::detect::{self, Scope};

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    for scope in [
        Scope::Value,
        Scope::Body,
        Scope::Header,
        Scope::Path,
        Scope::Name,
    ] {
        detect::run_all(&s, scope, &mut |h| {
            assert!(h.fragment.len() <= detect::MAX_FRAGMENT);
            assert!(h.confidence <= 100);
        });
    }
});
