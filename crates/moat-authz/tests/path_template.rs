//! Path templates (`{*}`, `{**}`) in `paths`/`notPaths`: Istio's validation with its error
//! text, Envoy's `uri_template` rules Istio does not check, and matching as Envoy's
//! generated regex (cases from Istio's `security_test.go` and the integration test
//! `TestAuthz_PathTemplating`).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use moat_authz::ir::{PathPat, PathTemplate};

fn template(v: &str) -> PathTemplate {
    match PathPat::parse(v) {
        Ok(PathPat::Template(t)) => t,
        other => panic!("{v}: {other:?}"),
    }
}

fn err(v: &str) -> String {
    PathPat::parse(v).expect_err(v)
}

#[test]
fn valid_templates() {
    for v in [
        "/{*}/foo",
        "/{*}/foo/",
        "/foo/{**}/bar",
        "/foo/bar/{**}",
        "/path/template/{*}",
        "/{**}/path/template",
        "/{**}",
        "/{*}",
        "/a/{*}/{*}/b/{**}/c/d",
        "/v1/{*}/x~y_z-1.2%41!$&'()+,;:@",
    ] {
        template(v);
    }
}

#[test]
fn invalid_templates_have_istios_messages() {
    let braces = |p: &str| {
        format!(
            "invalid or unsupported path {p}, found in Paths. Contains '{{' or '}}' beyond a supported path template"
        )
    };
    let not_last = |p: &str| {
        format!("invalid or unsupported path {p}, found in Paths. {{**}} is not the last operator")
    };
    let literal = |p: &str, seg: &str| {
        format!(
            "invalid or unsupported path {p}, found in Paths. Contains segment {seg} with invalid string literal"
        )
    };
    for (v, want) in [
        ("/foo/{**}buzz/bar", braces("foo/{**}buzz/bar")),
        ("/{*}/foo/{}/bar", braces("{*}/foo/{}/bar")),
        ("/foo/{buzz}/bar", braces("foo/{buzz}/bar")),
        ("/{buzz}", braces("{buzz}")),
        ("/foo/{buzz}/bar/{**}", braces("foo/{buzz}/bar/{**}")),
        ("/foo/{buzz=*}/bar/{**}", braces("foo/{buzz=*}/bar/{**}")),
        ("/{*}/foo/{buzz=**}/bar", braces("{*}/foo/{buzz=**}/bar")),
        ("/{*}/foo/{**}bar", braces("{*}/foo/{**}bar")),
        ("/{*}/foo/{*}.txt", braces("{*}/foo/{*}.txt")),
        ("/foo/{*}/bar/{**}.txt", braces("foo/{*}/bar/{**}.txt")),
        ("/{*}/foo/{temp", braces("{*}/foo/{temp")),
        ("/{*}/foo/temp}/bar", braces("{*}/foo/temp}/bar")),
        ("/foo/{*}*", braces("foo/{*}*")),
        ("/{**}/foo/temp/{*}/bar", not_last("{**}/foo/temp/{*}/bar")),
        ("/{**}/{**}", not_last("{**}/{**}")),
        (
            "/{**}/foo/temp/{**}/bar",
            not_last("{**}/foo/temp/{**}/bar"),
        ),
        ("/foo/{*}/bar/*", literal("foo/{*}/bar/*", "*")),
        ("/foo/{*}/bar/**/buzz", literal("foo/{*}/bar/**/buzz", "**")),
        ("*/foo/{*}", literal("*/foo/{*}", "*")),
        ("/{*}/foo/?abc", literal("{*}/foo/?abc", "?abc")),
        ("/{*}/a b", literal("{*}/a b", "a b")),
        ("/{*}//x", literal("{*}//x", "")),
    ] {
        assert_eq!(err(v), want, "{v}");
    }
    assert_eq!(
        PathPat::parse_for("/{**}/{*}", "NotPaths").unwrap_err(),
        "invalid or unsupported path {**}/{*}, found in NotPaths. {**} is not the last operator"
    );
}

#[test]
fn templates_istio_accepts_and_envoy_refuses_are_refused() {
    for (v, why) in [
        ("foo/{*}", "must start with `/`"),
        ("//{*}", "empty segment"),
        ("/a/{*}//", "empty segment"),
        ("/{*}/a=b", "`=`"),
    ] {
        let e = err(v);
        assert!(
            e.contains("Envoy's uri_template matcher refuses it") && e.contains(why),
            "{v}: {e}"
        );
    }
}

#[test]
fn plain_values_are_not_templates() {
    for v in ["/foo/*", "*/suffix", "*", "/exact", "/a/*/b", "/a=b"] {
        assert!(matches!(PathPat::parse(v), Ok(PathPat::Str(_))), "{v}");
    }
}

#[test]
fn matching_follows_envoys_regex() {
    for (t, path, want) in [
        // `/allow/admin/{**}` (Istio integration test)
        ("/allow/admin/{**}", "/allow/admin/", true),
        ("/allow/admin/{**}", "/allow/admin", false),
        ("/allow/admin/{**}", "/allow/user/", false),
        ("/allow/admin/{**}", "/allow", false),
        ("/allow/admin/{**}", "/allow/admin/temp", true),
        ("/allow/admin/{**}", "/allow/admin/temp.txt", true),
        ("/allow/admin/{**}", "/allow/admin/foo/temp.txt", true),
        // `/foo/{*}/bar/{**}`
        ("/foo/{*}/bar/{**}", "/foo/buzz/bar/bat.txt", true),
        ("/foo/{*}/bar/{**}", "/foo/buzz/bar/bat.temp.txt", true),
        ("/foo/{*}/bar/{**}", "/foo/buzz/bar/bat/fuzz.txt", true),
        ("/foo/{*}/bar/{**}", "/foo/bar/bat.txt", false),
        ("/foo/{*}/bar/{**}", "/foo//bar/bat.txt", false),
        ("/foo/{*}/bar/{**}", "/foo/buzz/bar/bat", true),
        // `/store/{**}/cart`
        ("/store/{**}/cart", "/store//cart", true),
        ("/store/{**}/cart", "/store/cart", false),
        ("/store/{**}/cart", "/store/foo/cart", true),
        ("/store/{**}/cart", "/store/foo/bar/cart", true),
        ("/store/{**}/cart", "/store/foo/bar/cart/", false),
        // one segment, trailing slash
        ("/foo/{*}", "/foo/bar", true),
        ("/foo/{*}", "/foo/bar/baz", false),
        ("/foo/{*}", "/foo/", false),
        ("/{*}/foo/", "/x/foo/", true),
        ("/{*}/foo/", "/x/foo", false),
        ("/foo/{**}/", "/foo//", true),
        ("/foo/{**}/", "/foo/bar/", true),
        ("/foo/{**}/", "/foo/bar/baz.txt", false),
        ("/{**}", "/", true),
        ("/{**}", "/a/b/c", true),
        // `*` and `**` match pchar without `*` and `=` (Envoy's kLiteral)
        ("/foo/{*}", "/foo/a=b", false),
        ("/foo/{*}", "/foo/a*b", false),
        ("/foo/{*}", "/foo/a%2Fb", true),
        ("/foo/{*}", "/foo/a:b@c", true),
        ("/foo/{**}", "/foo/x/a=b", false),
        ("/foo/{**}", "/foo/x\"y", false),
        ("/foo/{**}", "foo/x", false),
    ] {
        assert_eq!(template(t).matches(path), want, "{t} {path}");
    }
}

#[test]
fn templates_through_the_engine() {
    let yaml = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: foo}\nspec:\n  rules:\n  - to: [{operation: {paths: [\"/allow/admin/{**}\", \"/foo/{*}/bar/{**}\", \"/store/{**}/cart\"]}}]\n";
    let e = engine(yaml);
    for (p, s) in [
        ("/allow/admin/", 200),
        ("/allow/admin", 403),
        ("/allow/admin?param=value", 403),
        ("/allow/admin/temp.txt", 200),
        ("/foo/buzz/bar/bat/fuzz.txt", 200),
        ("/foo//bar/bat.txt", 403),
        ("/store//cart", 200),
        ("/store/cart", 403),
    ] {
        assert_eq!(req(p).status(&e), s, "{p}");
    }
    let e = engine(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: foo}\nspec:\n  rules:\n  - to: [{operation: {notPaths: [\"/private/{**}\"]}}]\n",
    );
    assert_eq!(req("/private/x").status(&e), 403);
    assert_eq!(req("/private").status(&e), 200);
}

#[test]
fn load_error_names_file_line_field_and_istios_message() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.yaml");
    std::fs::write(
        &p,
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: foo}\nspec:\n  rules:\n  - to:\n    - operation:\n        notPaths: [\"/ok/{*}\", \"/foo/{*}/bar/{**}.txt\"]\n",
    )
    .unwrap();
    let e = moat_authz::loader::load_paths(&[p], dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.yaml:8:"), "{e}");
    assert!(e.contains("notPaths"), "{e}");
    assert!(
        e.contains(
            "invalid or unsupported path foo/{*}/bar/{**}.txt, found in NotPaths. Contains '{' or '}' beyond a supported path template"
        ),
        "{e}"
    );
}

/// Envoy's `toRegexPattern` for a template Istio accepted: `{*}` -> `*` -> `[lit]+`,
/// `{**}` -> `**` -> `[lit/]*`, literals escaped, segments joined by `/`.
fn envoy_regex(template: &str) -> regex::Regex {
    const LIT: &str = r"a-zA-Z0-9\-._~%!$&'()+,;:@";
    let body: Vec<String> = template[1..]
        .split('/')
        .map(|seg| match seg {
            "{*}" => format!("[{LIT}]+"),
            "{**}" => format!("[{LIT}/]*"),
            lit => regex::escape(lit),
        })
        .collect();
    regex::Regex::new(&format!("^/{}$", body.join("/"))).unwrap()
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn segment() -> impl Strategy<Value = String> {
        prop::sample::select(&["{*}", "{**}", "a", "b.txt", "%41", "x:y", ""][..])
            .prop_map(String::from)
    }

    fn path() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop::sample::select(&["a", "b.txt", "%41", "x:y", "", "a=b", "*", "q\"", "a/b"][..]),
            0..6,
        )
        .prop_map(|segs| format!("/{}", segs.join("/")))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, .. ProptestConfig::default() })]

        /// Every template moat accepts matches exactly like Envoy's regex.
        #[test]
        fn matches_like_envoys_regex(segs in prop::collection::vec(segment(), 1..6), paths in prop::collection::vec(path(), 1..10)) {
            let t = format!("/{}", segs.join("/"));
            if let Ok(PathPat::Template(tpl)) = PathPat::parse(&t) {
                let re = envoy_regex(&t);
                for p in &paths {
                    prop_assert_eq!(tpl.matches(p), re.is_match(p), "{} {}", t, p);
                }
            }
        }

        /// Arbitrary text never panics the parser or the matcher.
        #[test]
        fn hostile_input(v in "\\PC{0,40}", p in "\\PC{0,40}") {
            if let Ok(pat) = PathPat::parse(&v) {
                let _ = pat.matches(&p);
            }
        }
    }
}
