//! API discovery's schema extractor (`moat_schema::schema::from_json`, which builds the
//! schema while it parses, without a value tree) on arbitrary bytes:
//!
//! * it accepts exactly the documents `serde_json` parses into a `Value`;
//! * on a document without duplicate keys (the `Value` re-serialized), it gives the
//!   schema that the tree walk (`from_value`) gives for the parsed `Value`;
//! * the schema respects its limits: at most 18 nested containers, 10 array children,
//!   255 record entries, and arrays report their real length;
//! * its JSON encoding reads back to the same schema (`to_json` / `Node::from_value`).
//!
//! The same for form and query strings (`form_schema`), and path templating
//! (`template`): a template is a fixed point, and keeps the number of segments.
#![no_main]
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use moat_schema::discovery::form_schema;
use moat_schema::scanner::Scanners;
use moat_schema::schema::{
    from_json, from_value, Node, MAX_ARRAY_NODES, MAX_CONTAINER_DEPTH, MAX_RECORD_NODES,
};
use moat_schema::template::{template, MAX_SEGMENTS};

fn scanners() -> &'static Scanners {
    static S: OnceLock<Scanners> = OnceLock::new();
    S.get_or_init(Scanners::builtin)
}

/// Containers nested in `n` (a scalar is 0).
fn depth(n: &Node) -> usize {
    match n {
        Node::Scalar { .. } => 0,
        Node::Array { children, .. } => 1 + children.iter().map(depth).max().unwrap_or(0),
        Node::Record { entries, .. } => 1 + entries.values().map(depth).max().unwrap_or(0),
    }
}

/// The limits of every node of `n`, and array lengths against the parsed value `v`
/// (the first array element stands for the others).
fn check_limits(n: &Node, v: Option<&serde_json::Value>) {
    match n {
        Node::Scalar { .. } => {}
        Node::Array {
            children,
            len,
            truncated,
        } => {
            assert!(children.len() <= MAX_ARRAY_NODES);
            assert_eq!(*truncated, *len > MAX_ARRAY_NODES as u64);
            if let Some(a) = v.and_then(|v| v.as_array()) {
                assert_eq!(*len, a.len() as u64);
            }
            for c in children {
                check_limits(c, None);
            }
        }
        Node::Record { entries, .. } => {
            assert!(entries.len() <= MAX_RECORD_NODES);
            for (k, c) in entries {
                assert!(!k.is_empty(), "empty key kept");
                check_limits(c, v.and_then(|v| v.get(k)));
            }
        }
    }
}

fn round_trip(n: &Node) {
    let text = n.to_json();
    let v: serde_json::Value = serde_json::from_str(&text).expect("to_json writes JSON");
    assert_eq!(Node::from_value(&v).as_ref(), Some(n), "{text}");
}

fuzz_target!(|data: &[u8]| {
    let sc = scanners();
    let streamed = from_json(data, sc);
    let parsed = serde_json::from_slice::<serde_json::Value>(data);
    // One known, accepted difference: the extractor skips values past its limits with
    // `IgnoredAny`, and serde_json's skipping reader checks `\u` escapes for four hex
    // digits but not for lone surrogates, which its full parse refuses. Such a document
    // only ever gets a schema of the parts that were read (the campaign's one finding,
    // docs/fuzzing.md).
    let lone_surrogate = parsed.as_ref().is_err_and(|e| {
        e.to_string().contains("surrogate") || e.to_string().contains("unicode code point")
    });
    if !(streamed.is_some() && lone_surrogate) {
        assert_eq!(
            streamed.is_some(),
            parsed.is_ok(),
            "from_json and serde_json disagree: {parsed:?}"
        );
    }
    if let (Some(node), Ok(value)) = (&streamed, &parsed) {
        assert!(depth(node) <= MAX_CONTAINER_DEPTH);
        check_limits(node, Some(value));
        round_trip(node);
        // Duplicate keys are gone from the re-serialized value (the first wins in the
        // extractor, the last in `Value`), so there both walks must agree.
        let canonical = serde_json::to_vec(value).expect("a Value serializes");
        assert_eq!(from_json(&canonical, sc), Some(from_value(value, sc)));
    }

    let text = String::from_utf8_lossy(data);
    let form = form_schema(&text, sc);
    check_limits(&form, None);
    round_trip(&form);

    let t = template(&text);
    let path = text.split(['?', '#']).next().unwrap_or("");
    assert_eq!(template(&t), t, "template of a template");
    if path.is_empty() {
        assert_eq!(t, "/");
    } else {
        let segments = path.split('/').count().min(MAX_SEGMENTS + 2);
        assert_eq!(t.split('/').count(), segments, "{t}");
    }
});
