//! The secret scanner on arbitrary bytes (the bodies the proxy scans), with moat's
//! default rules and with rules whose Go patterns read text rune by rune (`.`,
//! `(?s:.)`, `\S`, `\W`, negated classes, an allowlist), at decode depth 0 and 5:
//!
//! * the keyword-windowed scan gives exactly the findings of the whole-payload
//!   reference scan (gitleaks' own method: a rule runs over everything once one of
//!   its keywords occurs);
//! * every finding lies inside the input: `start <= end`, the secret inside the
//!   match for a plain finding, a 1-based line and column;
//! * each finding converts to its gitleaks report entry.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use moat_secrets::report::{report_finding, Lines, Origin};
use moat_secrets::Scanner;

const RUNE_RULES: &str = r#"
[[rules]]
id = "dot-window"
regex = '''pass.{0,10}=([a-z0-9]{6,})'''
keywords = ["pass"]
[[rules]]
id = "negated-count"
regex = '''tok_([^"\s]{4,12})"'''
keywords = ["tok_"]
[[rules]]
id = "dot-s-flag"
regex = '''(?s:begin.{0,20}?end)'''
keywords = ["begin"]
[[rules]]
id = "nonspace"
regex = '''key_([\S]{3,8})\W'''
keywords = ["key_"]
[[rules]]
id = "unkeyed"
regex = '''(?i)secret[^a-z]{1,3}([\w.-]{8,})'''
[[rules.allowlists]]
regexTarget = "line"
regexes = ['''ok.{0,3}secret''']
"#;

fn scanners() -> &'static [Scanner; 4] {
    static S: OnceLock<[Scanner; 4]> = OnceLock::new();
    S.get_or_init(|| {
        let make = |toml: &str, depth: usize| {
            let mut s = Scanner::from_toml(toml, "fuzz.toml").expect("rules compile");
            s.set_max_decode_depth(depth);
            s
        };
        [
            make(moat_secrets::DEFAULT_RULES, 0),
            make(moat_secrets::DEFAULT_RULES, 5),
            make(RUNE_RULES, 0),
            make(RUNE_RULES, 5),
        ]
    })
}

fuzz_target!(|data: &[u8]| {
    let lines = Lines::new(data);
    for s in scanners() {
        let found = s.scan(data, None);
        assert_eq!(found, s.scan_reference(data, None));
        for f in &found {
            assert!(f.start <= f.end && f.end <= data.len(), "{f:?}");
            assert!(f.line >= 1 && f.column >= 1, "{f:?}");
            if f.decoded.is_none() {
                assert!(
                    f.start <= f.secret_start && f.secret_start <= f.secret_end,
                    "{f:?}"
                );
                assert!(f.secret_end <= f.end, "{f:?}");
            }
            let origin = Origin {
                file: "fuzz.txt",
                symlink: "",
                first_line: 1,
                commit: None,
            };
            let r = report_finding(f, data, &lines, origin, &[]);
            assert!(r.start_line >= 1 && r.start_line <= r.end_line, "{r:?}");
        }
    }
});
