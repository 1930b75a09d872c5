//! Authorization path normalisation (`moat_authz::request::normalize_path`, Istio's
//! `pathNormalization`) on arbitrary paths, in every mode:
//!
//! * limits: paths over `MAX_PATH_LEN` and paths with `%00` are refused;
//! * the result never grows, drops the query and fragment, and (but for `none`) has no
//!   `\`, and for a path starting with `/` no `.` or `..` segment, and for the merging
//!   modes no `//`;
//! * without `%` in the path (no decoding), normalising twice changes nothing: what the
//!   policy matched is what a second normaliser behind moat would see;
//! * RFC 3986 dot-segment removal agrees with the `url` crate's (WHATWG) on paths of
//!   unreserved characters, `/` and `\`;
//! * the second reading without `;` parameters (`without_path_parameters`) of a
//!   normalised path has no `;`, no dot segment, no `//` when merging, and does not grow;
//! * the methods a request names as overrides (`method_overrides`, the input read as a
//!   query and as an override field; `body_method_overrides`, the input read as a form,
//!   a multipart and a JSON body) are at most `MAX_METHOD_OVERRIDES` distinct
//!   upper-case tokens, none the request's own method;
//! * the bare host (`bare_host`, the input read as a `Host`) is a shorter prefix of it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use moat_authz::request::{
    bare_host, body_method_overrides, merges_slashes, method_overrides, normalize_path,
    without_path_parameters, BodyForm, PathNormalization, TooManyOverrides,
    MAX_METHOD_OVERRIDES, MAX_PATH_LEN,
};

const MODES: [PathNormalization; 4] = [
    PathNormalization::None,
    PathNormalization::Base,
    PathNormalization::MergeSlashes,
    PathNormalization::DecodeAndMergeSlashes,
];

/// At most `MAX_METHOD_OVERRIDES` distinct upper-case method names, none `POST`.
fn check_overrides(named: Result<Vec<String>, TooManyOverrides>) {
    let Ok(methods) = named else {
        return;
    };
    assert!(methods.len() <= MAX_METHOD_OVERRIDES, "{methods:?}");
    for (i, m) in methods.iter().enumerate() {
        assert!(m != "POST" && !methods[..i].contains(m), "{methods:?}");
        assert!(
            !m.is_empty() && !m.bytes().any(|b| b.is_ascii_lowercase()),
            "{methods:?}"
        );
    }
}

/// True when `p` holds a `.` or `..` segment.
fn has_dot_segment(p: &str) -> bool {
    p.split('/').any(|s| s == "." || s == "..")
}

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let path = &raw[..raw.find(['?', '#']).unwrap_or(raw.len())];
    for mode in MODES {
        let got = normalize_path(raw, mode);
        if path.contains("%00") {
            assert!(got.is_err(), "{mode:?}: %00 accepted");
            continue;
        }
        let out = got.unwrap_or_else(|e| panic!("{mode:?}: {raw:?} refused: {e:?}"));
        assert!(out.len() <= path.len(), "{mode:?}: {raw:?} grew to {out:?}");
        if mode == PathNormalization::None {
            assert_eq!(out, path);
            continue;
        }
        assert!(!out.contains('\\'), "{mode:?}: {out:?}");
        // Request paths start with `/` (origin form); a relative one is taken as is
        // when it needs nothing else.
        if !path.starts_with('/') {
            continue;
        }
        assert!(!has_dot_segment(&out), "{mode:?}: {raw:?} -> {out:?}");
        if mode != PathNormalization::Base {
            assert!(!out.contains("//"), "{mode:?}: {raw:?} -> {out:?}");
        }
        if let Some(servlet) = without_path_parameters(&out, merges_slashes(mode)) {
            assert!(
                servlet.len() <= out.len(),
                "{mode:?}: {out:?} -> {servlet:?}"
            );
            assert!(!servlet.contains(';'), "{mode:?}: {out:?} -> {servlet:?}");
            assert!(
                !has_dot_segment(&servlet),
                "{mode:?}: {out:?} -> {servlet:?}"
            );
            if merges_slashes(mode) {
                assert!(!servlet.contains("//"), "{mode:?}: {out:?} -> {servlet:?}");
            }
        }
        if !path.contains('%') {
            let again = normalize_path(&out, mode).expect("a normalised path is accepted");
            assert_eq!(again, out, "{mode:?}: {raw:?} is not stable");
        }
    }
    // The `url` crate: for special schemes it reads `\` as `/` and removes dot
    // segments (also from a relative-looking start) as RFC 3986 5.2.4 does.
    let plain = path.bytes().all(|b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/' | b'\\')
    });
    if plain && path.starts_with('/') && !path.starts_with("//") && !path.starts_with("/\\") {
        let ours = normalize_path(path, PathNormalization::Base).expect("plain path");
        let url = url::Url::parse(&format!("http://h.example{path}")).expect("url parses");
        assert_eq!(ours, url.path(), "{path:?}");
    }
    let mut fields = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_bytes(data) {
        fields.append("x-http-method-override", value);
    }
    for (headers, query) in [(&http::HeaderMap::new(), Some(raw)), (&fields, None)] {
        check_overrides(method_overrides("POST", headers, query));
    }
    for form in [BodyForm::UrlEncoded, BodyForm::Multipart("b"), BodyForm::Json] {
        check_overrides(body_method_overrides("POST", form, data, Vec::new()));
    }
    if let Some(bare) = bare_host(raw) {
        assert!(
            bare.len() < raw.len() && raw.starts_with(bare),
            "{raw:?} -> {bare:?}"
        );
    }
    // The length limit, at its edge (once: only for the input `/`).
    if raw == "/" {
        let at = "/".repeat(MAX_PATH_LEN);
        assert!(normalize_path(&at, PathNormalization::Base).is_ok());
        let over = "/".repeat(MAX_PATH_LEN + 1);
        assert!(normalize_path(&over, PathNormalization::Base).is_err());
    }
});
