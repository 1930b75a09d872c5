//! The configuration loaders on arbitrary text: moat's gateway config
//! (`moat_proxy::config::parse`: `${...}` substitution, YAML, `deny_unknown_fields`,
//! semantic checks) and Istio policy files (`moat_authz::loader::parse_text`,
//! multi-document):
//!
//! * an error names the file and a position inside the text (a line that exists, a
//!   column within that line);
//! * the YAML layer (`moat_config`) agrees with `serde_json` on JSON documents, which
//!   are YAML: what it reads is the value `serde_json` reads.
//!
//! Inputs naming `${file:...}` are skipped: they would read the fuzzing machine's files.
#![no_main]
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use moat_config::ConfigError;
use serde_json::Value;

/// The error points into `text`: its file, a line of it, a column of that line.
fn located(e: &ConfigError, file: &Path, text: &str) {
    assert_eq!(e.file, file, "{e}");
    // YAML line breaks: CR LF, LF, and a bare CR.
    let lines: Vec<&str> = text
        .split("\r\n")
        .flat_map(|l| l.split(['\r', '\n']))
        .collect();
    assert!(e.line as usize <= lines.len(), "{e}: {} lines", lines.len());
    if e.line > 0 {
        let line = lines[e.line as usize - 1];
        assert!(
            e.column as usize <= line.chars().count() + 1,
            "{e}: line {:?}",
            line
        );
    }
    assert!(!e.message.is_empty());
}

/// Numbers compared as `f64` (YAML and JSON spell `1.0` and `1` alike or not).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        // serde_json's default float parser is not correctly rounded (`6e23`
        // comes out one ULP low without its `float_roundtrip` feature); the
        // YAML side is: numbers agree to within two ULPs.
        (Value::Number(x), Value::Number(y)) => match (x.as_f64(), y.as_f64()) {
            (Some(x), Some(y)) => {
                x == y || (x - y).abs() <= 2.0 * f64::EPSILON * x.abs().max(y.abs())
            }
            (x, y) => x == y,
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if text.contains("file:") {
        return;
    }
    let file = Path::new("fuzz/moat.yaml");
    let src = moat_proxy::config::ConfigSource {
        file: file.to_path_buf(),
        base_dir: std::env::temp_dir(),
    };
    if let Err(e) = moat_proxy::config::parse(&src, text) {
        located(&e, file, text);
    }

    let policies = Path::new("fuzz/policies.yaml");
    let mut set = moat_authz::loader::PolicySet::default();
    if let Err(e) = moat_authz::loader::parse_text(policies, text, &mut set) {
        located(&e, policies, text);
    }

    if let Ok(json) = serde_json::from_str::<Value>(text) {
        // YAML refuses duplicate keys where `serde_json` keeps the last: only a
        // document it reads is compared.
        if let Ok(yaml) = moat_config::from_str_verbatim::<Value>(file, text) {
            assert!(same(&yaml, &json), "YAML {yaml} != JSON {json}");
        }
    }
});
