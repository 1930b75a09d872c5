//! AuthorizationPolicy / PeerAuthentication semantics, field by field, through the engine.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use jsonwebtoken::Algorithm;
use moat_authz::MtlsMode;
use serde_json::json;

fn ap(ns: &str, name: &str, action: &str, rules: &str) -> String {
    let rules = if rules.is_empty() {
        String::new()
    } else {
        format!("  rules: {rules}\n")
    };
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  action: {action}\n{rules}---\n"
    )
}

fn ap_sel(ns: &str, name: &str, action: &str, sel: &str, rules: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1beta1\nkind: AuthorizationPolicy\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  selector:\n    matchLabels: {sel}\n  action: {action}\n  rules: {rules}\n---\n"
    )
}

/// ALLOW policy in `foo` with one rule.
fn allow(rule: &str) -> std::sync::Arc<moat_authz::AuthzEngine> {
    engine(&ap("foo", "p", "ALLOW", &format!("[{rule}]")))
}

#[test]
fn no_policy_allows() {
    let e = engine("");
    assert_eq!(req("/").status(&e), 200);
}

#[test]
fn allow_nothing_deny_noop_audit_noop() {
    let e = engine(&ap("foo", "allow-nothing", "ALLOW", ""));
    let d = req("/").eval(&e);
    assert_eq!((d.status, d.allowed), (403, false));
    assert_eq!(d.reason, "no ALLOW policy matched");
    let e = engine(&ap("foo", "deny-none", "DENY", ""));
    assert_eq!(req("/").status(&e), 200);
    let e = engine(&ap("foo", "audit-none", "AUDIT", ""));
    let d = req("/").eval(&e);
    assert_eq!(d.status, 200);
    assert!(d.audit.is_empty());
    // `rules: []` is the same as no rules.
    let e = engine(&ap("foo", "allow-nothing", "ALLOW", "[]"));
    assert_eq!(req("/").status(&e), 403);
}

/// CUSTOM names the provider of the first matching CUSTOM policy; DENY and ALLOW
/// still decide for themselves (the proxy calls the provider first).
#[test]
fn custom_names_its_provider() {
    let yaml = format!(
        "{}apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: ext, namespace: foo}}\nspec:\n  action: CUSTOM\n  provider: {{name: opa}}\n  rules: [{{to: [{{operation: {{paths: [\"/ext/*\"]}}}}]}}]\n",
        ap("foo", "d", "DENY", r#"[{to: [{operation: {paths: ["/ext/denied"]}}]}]"#)
    );
    let cfg = moat_authz::AuthzConfig {
        extension_providers: vec![serde_json::from_value(json!({
            "name": "opa", "envoyExtAuthzGrpc": {"service": "opa.local", "port": 9191}
        }))
        .unwrap()],
        ..Default::default()
    };
    let e = engine_cfg(&yaml, cfg);
    let d = req("/ext/x").eval(&e);
    assert_eq!(d.custom.as_deref(), Some("opa"));
    assert!(d.allowed);
    let d = req("/ext/denied").eval(&e);
    assert_eq!((d.custom.as_deref(), d.allowed), (Some("opa"), false));
    assert_eq!(req("/other").eval(&e).custom, None);
    // The path without its `;` parameters is sent to the provider it names too.
    assert_eq!(req("/x/..;/ext/y").eval(&e).custom.as_deref(), Some("opa"));
    let d = req("/ext/denied;v=1").eval(&e);
    assert_eq!((d.custom.as_deref(), d.allowed), (Some("opa"), false));
}

#[test]
fn empty_rule_matches_everything() {
    let e = engine(&ap("foo", "allow-all", "ALLOW", "[{}]"));
    let d = req("/anything").eval(&e);
    assert_eq!(
        (d.status, d.policy.as_deref(), d.rule),
        (200, Some("foo/allow-all"), Some(0))
    );
    let e = engine(&ap("foo", "deny-all", "DENY", "[{}]"));
    let d = req("/anything").eval(&e);
    assert_eq!((d.status, d.policy.as_deref()), (403, Some("foo/deny-all")));
    let e = engine(&ap("foo", "audit-all", "AUDIT", "[{}]"));
    let d = req("/").eval(&e);
    assert_eq!(d.status, 200);
    assert_eq!(d.audit, vec!["foo/audit-all[rule 0]".to_string()]);
}

#[test]
fn deny_before_allow_and_default_deny() {
    let y = ap("foo", "allow-all", "ALLOW", "[{}]")
        + &ap(
            "foo",
            "deny-admin",
            "DENY",
            r#"[{to: [{operation: {paths: ["/admin"]}}]}]"#,
        );
    let e = engine(&y);
    let d = req("/admin").eval(&e);
    assert_eq!(
        (d.status, d.policy.as_deref()),
        (403, Some("foo/deny-admin"))
    );
    assert_eq!(req("/x").status(&e), 200);
    let e = engine(&ap(
        "foo",
        "a",
        "ALLOW",
        r#"[{to: [{operation: {paths: ["/ok"]}}]}]"#,
    ));
    assert_eq!(req("/ok").status(&e), 200);
    assert_eq!(req("/nope").status(&e), 403);
}

#[test]
fn audit_never_changes_the_decision() {
    let y = ap(
        "foo",
        "audit",
        "AUDIT",
        r#"[{to: [{operation: {paths: ["/a"]}}]}]"#,
    ) + &ap(
        "foo",
        "deny",
        "DENY",
        r#"[{to: [{operation: {paths: ["/a"]}}]}]"#,
    );
    let d = req("/a").eval(&engine(&y));
    assert_eq!(d.status, 403);
    assert_eq!(d.audit, vec!["foo/audit[rule 0]".to_string()]);
}

#[test]
fn scope_by_namespace_selector_and_root() {
    let y = ap("bar", "deny-bar", "DENY", "[{}]")
        + &ap_sel("foo", "deny-app", "DENY", "{app: web}", "[{}]")
        + &ap_sel("istio-system", "mesh-deny-db", "DENY", "{app: db}", "[{}]")
        + &ap(
            "istio-system",
            "mesh-deny-x",
            "DENY",
            r#"[{to: [{operation: {paths: ["/x"]}}]}]"#,
        );
    let e = engine(&y);
    assert_eq!(
        req("/").ns("foo").status(&e),
        200,
        "bar policy does not apply to foo"
    );
    assert_eq!(req("/").ns("bar").status(&e), 403);
    assert_eq!(req("/").ns("foo").label("app", "web").status(&e), 403);
    assert_eq!(req("/").ns("foo").label("app", "api").status(&e), 200);
    assert_eq!(
        req("/").ns("zzz").label("app", "db").status(&e),
        403,
        "root ns selector applies everywhere"
    );
    assert_eq!(
        req("/x").ns("any").status(&e),
        403,
        "root ns policy applies mesh-wide"
    );
    // A custom root namespace.
    let cfg = moat_authz::AuthzConfig {
        root_namespace: "mesh".into(),
        ..Default::default()
    };
    let e = engine_cfg(&ap("mesh", "deny-all", "DENY", "[{}]"), cfg);
    assert_eq!(req("/").ns("whatever").status(&e), 403);
    // Selector needs every label.
    let e = engine(&ap_sel(
        "foo",
        "d",
        "DENY",
        "{app: web, version: v1}",
        "[{}]",
    ));
    assert_eq!(req("/").label("app", "web").status(&e), 200);
    assert_eq!(
        req("/")
            .label("app", "web")
            .label("version", "v1")
            .label("x", "y")
            .status(&e),
        403
    );
}

#[test]
fn metadata_namespace_defaults_to_default() {
    let y = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: d}\nspec: {action: DENY, rules: [{}]}\n";
    let e = engine(y);
    assert_eq!(req("/").ns("default").status(&e), 403);
    assert_eq!(req("/").ns("foo").status(&e), 200);
}

#[test]
fn paths_forms_and_normalization() {
    let e = allow(
        r#"{to: [{operation: {paths: ["/exact", "/pre/*", "*.png", "/t/{*}/x", "/u/{**}"]}}]}"#,
    );
    for (p, s) in [
        ("/exact", 200),
        ("/exact?q=1", 200),
        ("/exact/", 403),
        ("/Exact", 403),
        ("/pre/", 200),
        ("/pre/a/b", 200),
        ("/pre", 403),
        ("/img/a.png", 200),
        ("/a.PNG", 403),
        ("/t/abc/x", 200),
        ("/t//x", 403),
        ("/t/a/b/x", 403),
        ("/u", 403), // Envoy: `/u/**` needs the `/` after `u`
        ("/u/", 200),
        ("/u/a/b/c", 200),
        ("/x/../exact", 200),
        ("/%65xact", 200),
        ("/pre/..", 403),
    ] {
        assert_eq!(req(p).status(&e), s, "{p}");
    }
    let e = allow(r#"{to: [{operation: {paths: ["*"]}}]}"#);
    assert_eq!(req("/anything").status(&e), 200);
    let e = allow(r#"{to: [{operation: {notPaths: ["/admin*"]}}]}"#);
    assert_eq!(req("/admin/x").status(&e), 403);
    assert_eq!(
        req("/x/../admin/x").status(&e),
        403,
        "normalized before matching"
    );
    assert_eq!(req("/user").status(&e), 200);
}

#[test]
fn path_normalization_modes() {
    let y = ap(
        "foo",
        "deny",
        "DENY",
        r#"[{to: [{operation: {paths: ["/admin"]}}]}]"#,
    );
    let mk = |n| {
        engine_cfg(
            &y,
            moat_authz::AuthzConfig {
                path_normalization: n,
                ..Default::default()
            },
        )
    };
    use moat_authz::PathNormalization::*;
    assert_eq!(req("/a/../admin").status(&mk(None)), 200);
    assert_eq!(req("/a/../admin").status(&mk(Base)), 403);
    assert_eq!(req("//admin").status(&mk(Base)), 200);
    assert_eq!(req("//admin").status(&mk(MergeSlashes)), 403);
    assert_eq!(req("/x%2F..%2Fadmin").status(&mk(MergeSlashes)), 200);
    assert_eq!(
        req("/x%2F..%2Fadmin").status(&mk(DecodeAndMergeSlashes)),
        403
    );
    let d = req("/a%00").eval(&mk(Base));
    assert_eq!((d.status, d.allowed), (400, false));
    assert!(d.normalized_path.is_none());
    // The decision carries the path the policies matched when normalization changed it,
    // allowed or refused, so that the proxy forwards that one; an unchanged path is None.
    assert_eq!(
        req("/a/../admin?x=1")
            .eval(&mk(Base))
            .normalized_path
            .as_deref(),
        Some("/admin")
    );
    assert_eq!(
        req("/a/../b").eval(&mk(Base)).normalized_path.as_deref(),
        Some("/b")
    );
    assert!(req("/a/../b").eval(&mk(None)).normalized_path.is_none());
    assert!(req("/b?x=/../").eval(&mk(Base)).normalized_path.is_none());
}

/// Engines for one DENY and one ALLOW policy in `foo` (rule lists): with the default
/// config, which reads requests as backends may, and with every such reading off
/// (`as_received`, Istio's reading), with `normalization`.
fn by_default_and_as_istio(
    deny: &str,
    allow: &str,
    normalization: moat_authz::PathNormalization,
) -> (
    std::sync::Arc<moat_authz::AuthzEngine>,
    std::sync::Arc<moat_authz::AuthzEngine>,
) {
    let y = format!(
        "{}{}",
        ap("foo", "deny", "DENY", deny),
        ap("foo", "allow", "ALLOW", allow)
    );
    let cfg = moat_authz::AuthzConfig {
        path_normalization: normalization,
        ..Default::default()
    };
    let istio = moat_authz::AuthzConfig {
        path_parameters: moat_authz::PathParameters::AsReceived,
        method_overrides: moat_authz::MethodOverrides::AsReceived,
        host_port: moat_authz::HostPort::AsReceived,
        ..cfg.clone()
    };
    (engine_cfg(&y, cfg), engine_cfg(&y, istio))
}

/// istio/istio#27409: Tomcat, Jetty and Spring route `/admin;x` to `/admin` and
/// `/public/..;/admin` to `/admin`. By default a path must be allowed read both ways;
/// `as_received` is Envoy's reading alone.
#[test]
fn path_parameters_are_read_as_servlet_containers_read_them() {
    use moat_authz::PathNormalization::{Base, MergeSlashes};
    let (deny, allow) = (
        r#"[{to: [{operation: {paths: ["/admin"]}}]}]"#,
        r#"[{to: [{operation: {paths: ["/public/*", "/admin"]}}]}]"#,
    );
    let (both, istio) = by_default_and_as_istio(deny, allow, Base);
    for (path, by_default, as_received) in [
        ("/public/a", 200, 200),
        ("/public/a;jsessionid=1F2E", 200, 200),
        ("/public/a?x=;y", 200, 200),
        ("/public;v=2/a", 403, 403), // not under `/public/` as sent: refused either way
        ("/admin", 403, 403),
        ("/admin;x", 403, 403), // ALLOW has no `/admin;x`: refused either way
        ("/public/..;/admin", 403, 200),
        ("/public/..;x=1/admin;y", 403, 200),
        ("/public/.;/a", 200, 200),
        ("/public/a/..;/..;/b", 403, 200), // `/b`: no ALLOW
        ("/public/;x/admin", 200, 200),    // `/public//admin` keeps its `//` under base
    ] {
        assert_eq!(req(path).status(&both), by_default, "{path}");
        assert_eq!(
            req(path).status(&istio),
            as_received,
            "{path} (as_received)"
        );
    }
    // Merged slashes apply to the second reading as to the first.
    let (merging, _) = by_default_and_as_istio(deny, allow, MergeSlashes);
    assert_eq!(req("/;x/admin").status(&merging), 403);
    let d = req("/public/..;/admin").eval(&both);
    assert_eq!(d.policy.as_deref(), Some("foo/deny"));
    assert_eq!(
        d.reason,
        "matched a DENY policy for the path without its `;` parameters (/admin)"
    );
    // The second reading decides; the path that goes upstream is the one sent.
    assert_eq!(d.normalized_path, None);
    let d = req("/public/..;/x").eval(&both);
    assert_eq!((d.status, d.policy.as_deref()), (403, None));
    assert_eq!(
        d.reason,
        "no ALLOW policy matched for the path without its `;` parameters (/x)"
    );
    // A DENY written with `notPaths` is passed the same way.
    let e = engine_cfg(
        &ap(
            "foo",
            "d",
            "DENY",
            r#"[{to: [{operation: {notPaths: ["/public/*"]}}]}]"#,
        ),
        Default::default(),
    );
    assert_eq!(req("/public/x").status(&e), 200);
    assert_eq!(req("/public/..;/admin").status(&e), 403);
    // Dry-run policies report what enforcing them would do, both readings included.
    let y = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: d\n  namespace: foo\n  annotations:\n    istio.io/dry-run: \"true\"\nspec:\n  action: DENY\n  rules: [{to: [{operation: {paths: [\"/admin\"]}}]}]\n";
    let d = req("/admin;x").eval(&engine(y));
    assert_eq!(d.status, 200);
    assert!(
        d.dry_run.as_deref().unwrap_or("").contains("foo/d"),
        "{:?}",
        d.dry_run
    );
}

/// Symfony, Laravel, Express's `method-override` and ASP.NET route a POST carrying
/// `X-HTTP-Method-Override: DELETE` (or `_method=DELETE`) as a DELETE. By default the
/// request must be allowed as each method it names; `as_received` is Envoy's reading.
#[test]
fn method_overrides_are_read_as_frameworks_read_them() {
    const FORM: &str = "application/x-www-form-urlencoded";
    let (both, istio) = by_default_and_as_istio(
        r#"[{to: [{operation: {methods: ["DELETE"]}}]}]"#,
        r#"[{to: [{operation: {methods: ["GET", "POST"], paths: ["/api/*"]}}]}]"#,
        moat_authz::PathNormalization::Base,
    );
    let post = |path: &str| req(path).method("POST");
    for (r, by_default, as_received) in [
        (post("/api/x"), 200, 200),
        (
            post("/api/x").header("x-http-method-override", "GET"),
            200,
            200,
        ),
        (
            post("/api/x").header("x-http-method-override", "POST"),
            200,
            200,
        ),
        (
            post("/api/x").header("x-http-method-override", "DELETE"),
            403,
            200,
        ),
        (post("/api/x").header("x-http-method", "delete"), 403, 200),
        (
            post("/api/x").header("x-method-override", "GET, DELETE"),
            403,
            200,
        ),
        (post("/api/x?_method=DELETE"), 403, 200),
        (post("/api/x?%5Fmethod=delete"), 403, 200),
        // PUT is in no ALLOW rule.
        (post("/api/x?_method=PUT"), 403, 200),
        (req("/api/x").method("DELETE"), 403, 403),
        // A `_method` field in a POST form or JSON body (Rails, Laravel).
        (post("/api/x").body(FORM, "a=1&_method=GET"), 200, 200),
        (post("/api/x").body(FORM, "a=1&_method=delete"), 403, 200),
        (
            post("/api/x").body("application/json", r#"{"_method":"DELETE"}"#),
            403,
            200,
        ),
        (
            post("/api/x").body("text/plain", "_method=DELETE"),
            200,
            200,
        ),
        // Only a POST's body: the frameworks override nothing else.
        (req("/api/x").body(FORM, "_method=DELETE"), 200, 200),
    ] {
        assert_eq!(r.status(&both), by_default, "{r:?}");
        assert_eq!(r.status(&istio), as_received, "{r:?} (as_received)");
    }
    let d = post("/api/x")
        .header("x-http-method-override", "DELETE")
        .eval(&both);
    assert_eq!(d.policy.as_deref(), Some("foo/deny"));
    assert_eq!(
        d.reason,
        "matched a DENY policy as DELETE (a method override)"
    );
    // Both second readings at once: the override and the path without its parameters.
    let e = engine(&ap(
        "foo",
        "deny",
        "DENY",
        r#"[{to: [{operation: {methods: ["DELETE"], paths: ["/admin"]}}]}]"#,
    ));
    let d = post("/admin;x")
        .header("x-http-method-override", "DELETE")
        .eval(&e);
    assert_eq!(
        d.reason,
        "matched a DENY policy as DELETE (a method override) for the path without its `;` parameters (/admin)"
    );
    assert_eq!(post("/admin;x").status(&e), 200);
    assert_eq!(
        post("/admin")
            .header("x-http-method-override", "GET")
            .status(&e),
        200
    );
    // A condition on the `:method` header reads the override too.
    let e = engine(&ap(
        "foo",
        "deny",
        "DENY",
        r#"[{when: [{key: "request.headers[:method]", values: ["DELETE"]}]}]"#,
    ));
    let r = post("/x").header("x-http-method-override", "DELETE");
    assert_eq!(r.status(&e), 403);
    // A request naming more methods than are read is refused, not evaluated per method.
    let many = "A,B,C,D,E";
    let d = post("/api/x")
        .header("x-http-method-override", many)
        .eval(&both);
    assert_eq!((d.status, d.allowed), (400, false));
    assert_eq!(d.decided_by, moat_authz::DecidedBy::Method);
    assert_eq!(
        post("/api/x")
            .header("x-http-method-override", many)
            .status(&istio),
        200
    );
}

/// Virtual-host routing ignores the port and the trailing dot (moat's routes, Istio's
/// gateways, nginx), while `hosts` match the authority as sent: by default DENY policies
/// read the bare host too; ALLOW policies still match the host as sent.
#[test]
fn deny_policies_read_the_host_without_its_port() {
    use moat_authz::HostPort::{AsReceived, Both};
    let (both, istio) = by_default_and_as_istio(
        r#"[{to: [{operation: {hosts: ["admin.example.com"]}}]}]"#,
        r#"[{to: [{operation: {hosts: ["*.example.com", "a.dev.example.com:*"]}}]}]"#,
        moat_authz::PathNormalization::Base,
    );
    for (host, by_default, as_received) in [
        ("www.example.com", 200, 200),
        ("admin.example.com", 403, 403),
        ("ADMIN.example.com:443", 403, 403), // no ALLOW for a port: fails closed
        ("a.dev.example.com:8443", 200, 200), // an ALLOW that names ports keeps them
        ("www.example.com:443", 403, 403),
    ] {
        assert_eq!(req("/").host(host).status(&both), by_default, "{host}");
        assert_eq!(req("/").host(host).status(&istio), as_received, "{host}");
    }
    // A DENY on the bare host: only the ALLOW on ports lets these through as sent.
    let e = |host_port| {
        engine_cfg(
            &format!(
                "{}{}",
                ap(
                    "foo",
                    "deny",
                    "DENY",
                    r#"[{to: [{operation: {hosts: ["admin.dev.example.com"]}}]}]"#
                ),
                ap(
                    "foo",
                    "allow",
                    "ALLOW",
                    r#"[{to: [{operation: {hosts: ["admin.dev.example.com:*", "www.dev.example.com:*", "*.example.com."]}}]}]"#
                )
            ),
            moat_authz::AuthzConfig {
                host_port,
                ..Default::default()
            },
        )
    };
    let (both, istio) = (e(Both), e(AsReceived));
    for host in ["admin.dev.example.com:443", "admin.dev.example.com."] {
        assert_eq!(req("/").host(host).status(&both), 403, "{host}");
        assert_eq!(req("/").host(host).status(&istio), 200, "{host}");
    }
    assert_eq!(req("/").host("www.dev.example.com:443").status(&both), 200);
    // So does a condition on the `host` header.
    let e = engine(&ap(
        "foo",
        "deny",
        "DENY",
        r#"[{when: [{key: "request.headers[host]", values: ["admin.example.com"]}]}]"#,
    ));
    assert_eq!(req("/").host("admin.example.com:8443").status(&e), 403);
    assert_eq!(req("/").host("www.example.com:8443").status(&e), 200);
    let d = req("/").host("admin.dev.example.com:443").eval(&both);
    assert_eq!(d.policy.as_deref(), Some("foo/deny"));
    assert_eq!(
        d.reason,
        "matched a DENY policy for the host without its port (admin.dev.example.com)"
    );
}

/// An ALLOW of every host but one (`notHosts`) is not passed by that host with a port
/// or a trailing dot: the negated condition fails on the bare host too. A DENY with
/// `notHosts` keeps Istio's reading (it fails closed on a port).
#[test]
fn allow_policies_negating_a_host_read_it_without_its_port() {
    let (both, istio) = by_default_and_as_istio(
        r#"[{to: [{operation: {notHosts: ["public.example.com"], paths: ["/private"]}}]}]"#,
        r#"[{to: [{operation: {notHosts: ["admin.example.com", "*.internal"], notPaths: ["/h"]}}]},
           {when: [{key: "request.headers[:authority]", notValues: ["ops.example.com"]}], to: [{operation: {paths: ["/h"]}}]}]"#,
        moat_authz::PathNormalization::Base,
    );
    for (host, path, by_default, as_received) in [
        ("public.example.com", "/private", 200, 200),
        ("public.example.com:443", "/private", 403, 403), // the DENY's notHosts as sent
        ("public.example.com:443", "/", 200, 200),
        ("admin.example.com", "/", 403, 403),
        ("admin.example.com:443", "/", 403, 200),
        ("admin.example.com.", "/", 403, 200),
        ("db.internal:5432", "/", 403, 200),
        ("ops.example.com:8080", "/h", 403, 200),
        ("www.example.com:8080", "/h", 200, 200),
    ] {
        let r = || req(path).host(host);
        assert_eq!(r().status(&both), by_default, "{host}{path}");
        assert_eq!(
            r().status(&istio),
            as_received,
            "{host}{path} (as_received)"
        );
    }
}

#[test]
fn methods_hosts_ports() {
    let e = allow(r#"{to: [{operation: {methods: ["GET", "P*"]}}]}"#);
    assert_eq!(req("/").method("GET").status(&e), 200);
    assert_eq!(req("/").method("PUT").status(&e), 200);
    assert_eq!(
        req("/").method("get").status(&e),
        403,
        "methods are case-sensitive"
    );
    assert_eq!(req("/").method("DELETE").status(&e), 403);
    let e = allow(r#"{to: [{operation: {notMethods: ["DELETE"]}}]}"#);
    assert_eq!(req("/").method("DELETE").status(&e), 403);
    assert_eq!(req("/").method("GET").status(&e), 200);

    let e = allow(r#"{to: [{operation: {hosts: ["Example.COM", "*.svc.local", "api.*"]}}]}"#);
    assert_eq!(
        req("/").host("example.com").status(&e),
        200,
        "hosts ignore case"
    );
    assert_eq!(req("/").host("EXAMPLE.com").status(&e), 200);
    assert_eq!(
        req("/").host("example.com:8080").status(&e),
        403,
        "port is part of the authority"
    );
    assert_eq!(req("/").host("a.SVC.local").status(&e), 200);
    assert_eq!(req("/").host("api.x:9").status(&e), 200);
    assert_eq!(req("/").host("other").status(&e), 403);
    let e = allow(r#"{to: [{operation: {notHosts: ["bad.com"]}}]}"#);
    assert_eq!(req("/").host("BAD.com").status(&e), 403);

    let e = allow(r#"{to: [{operation: {ports: ["8080", "9090"]}}]}"#);
    assert_eq!(req("/").port(8080).status(&e), 200);
    assert_eq!(req("/").port(9091).status(&e), 403);
    let e = allow(r#"{to: [{operation: {notPorts: ["8080"]}}]}"#);
    assert_eq!(req("/").port(8080).status(&e), 403);
    assert_eq!(req("/").port(1).status(&e), 200);
    let e = allow(r#"{when: [{key: destination.port, values: ["443"]}]}"#);
    assert_eq!(req("/").port(443).status(&e), 200);
    assert_eq!(req("/").port(80).status(&e), 403);
}

#[test]
fn principals_and_plaintext() {
    let e = allow(
        r#"{from: [{source: {principals: ["cluster.local/ns/a/sa/x", "cluster.local/ns/b/*", "*/sa/admin"]}}]}"#,
    );
    assert_eq!(
        req("/").peer("spiffe://cluster.local/ns/a/sa/x").status(&e),
        200
    );
    assert_eq!(
        req("/").peer("spiffe://cluster.local/ns/a/sa/y").status(&e),
        403
    );
    assert_eq!(
        req("/").peer("spiffe://cluster.local/ns/b/sa/y").status(&e),
        200
    );
    assert_eq!(req("/").peer("spiffe://td2/ns/c/sa/admin").status(&e), 200);
    assert_eq!(req("/").status(&e), 403, "plaintext has no principal");
    let e = allow(r#"{from: [{source: {principals: ["*"]}}]}"#);
    assert_eq!(req("/").peer("spiffe://x/ns/y/sa/z").status(&e), 200);
    assert_eq!(req("/").status(&e), 403);
    // Istio "deny plaintext": notPrincipals ["*"] matches requests without a peer.
    let e = engine(&ap(
        "foo",
        "deny-plain",
        "DENY",
        r#"[{from: [{source: {notPrincipals: ["*"]}}]}]"#,
    ));
    assert_eq!(req("/").status(&e), 403);
    assert_eq!(req("/").peer("spiffe://x/ns/y/sa/z").status(&e), 200);
    let e = allow(r#"{when: [{key: source.principal, values: ["cluster.local/ns/a/sa/x"]}]}"#);
    assert_eq!(
        req("/").peer("spiffe://cluster.local/ns/a/sa/x").status(&e),
        200
    );
    assert_eq!(req("/").status(&e), 403);
}

#[test]
fn namespaces_and_service_accounts() {
    let e = allow(r#"{from: [{source: {namespaces: ["prod", "team-*"]}}]}"#);
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/prod/sa/x")
            .status(&e),
        200
    );
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/team-a/sa/x")
            .status(&e),
        200
    );
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/production/sa/x")
            .status(&e),
        403
    );
    assert_eq!(req("/").status(&e), 403);
    let e = engine(&ap(
        "foo",
        "d",
        "DENY",
        r#"[{from: [{source: {notNamespaces: ["foo"]}}]}]"#,
    ));
    assert_eq!(req("/").status(&e), 403, "plaintext matches notNamespaces");
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/foo/sa/x")
            .status(&e),
        200
    );
    let e = allow(r#"{when: [{key: source.namespace, values: ["prod"]}]}"#);
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/prod/sa/x")
            .status(&e),
        200
    );
    let e = allow(r#"{from: [{source: {serviceAccounts: ["prod/web", "local"]}}]}"#);
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/prod/sa/web")
            .status(&e),
        200
    );
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/foo/sa/local")
            .status(&e),
        200,
        "bare name = policy namespace"
    );
    assert_eq!(
        req("/")
            .peer("spiffe://cluster.local/ns/prod/sa/webx")
            .status(&e),
        403
    );
}

#[test]
fn ip_blocks_v4_v6_remote_and_unknown() {
    let e =
        allow(r#"{from: [{source: {ipBlocks: ["10.0.0.0/8", "192.168.1.7", "2001:db8::/32"]}}]}"#);
    assert_eq!(req("/").src("10.200.1.1").status(&e), 200);
    assert_eq!(req("/").src("192.168.1.7").status(&e), 200);
    assert_eq!(req("/").src("192.168.1.8").status(&e), 403);
    assert_eq!(req("/").src("2001:db8::1").status(&e), 200);
    assert_eq!(req("/").src("2001:db9::1").status(&e), 403);
    assert_eq!(
        req("/").no_src().status(&e),
        403,
        "unknown source ip never matches"
    );
    let e = allow(r#"{from: [{source: {notIpBlocks: ["10.0.0.0/8"]}}]}"#);
    assert_eq!(
        req("/").no_src().status(&e),
        200,
        "negative on unknown holds"
    );
    assert_eq!(req("/").src("10.1.1.1").status(&e), 403);
    let e = allow(r#"{from: [{source: {remoteIpBlocks: ["1.2.3.0/24"]}}]}"#);
    assert_eq!(req("/").src("10.0.0.1").remote("1.2.3.4").status(&e), 200);
    assert_eq!(req("/").src("1.2.3.4").remote("9.9.9.9").status(&e), 403);
    let e = allow(r#"{from: [{source: {notRemoteIpBlocks: ["1.2.3.0/24"]}}]}"#);
    assert_eq!(req("/").remote("1.2.3.4").status(&e), 403);
    let e = allow(
        r#"{when: [{key: source.ip, values: ["10.0.0.1"]}, {key: remote.ip, notValues: ["6.6.6.6"]}]}"#,
    );
    assert_eq!(req("/").src("10.0.0.1").remote("1.1.1.1").status(&e), 200);
    assert_eq!(req("/").src("10.0.0.1").remote("6.6.6.6").status(&e), 403);
    let e = allow(r#"{when: [{key: destination.ip, values: ["10.1.0.0/16"]}]}"#);
    assert_eq!(req("/").dest("10.1.2.3").status(&e), 200);
    assert_eq!(req("/").dest("10.2.2.3").status(&e), 403);
}

#[test]
fn remote_ip_from_xff_with_trusted_proxies() {
    let y = ap(
        "foo",
        "p",
        "ALLOW",
        r#"[{from: [{source: {remoteIpBlocks: ["1.2.3.4"]}}]}]"#,
    );
    let e = engine(&y);
    let d = moat_authz::check::check_with(
        &e,
        &moat_authz::check::CheckArgs {
            url: "http://svc/".into(),
            namespace: "foo".into(),
            source_ip: Some("10.0.0.9".into()),
            headers: vec!["X-Forwarded-For: 1.2.3.4, 10.0.0.5".into()],
            trusted_proxies: 2,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(d.status, 200);
    let d = moat_authz::check::check_with(
        &e,
        &moat_authz::check::CheckArgs {
            url: "http://svc/".into(),
            namespace: "foo".into(),
            source_ip: Some("10.0.0.9".into()),
            headers: vec!["X-Forwarded-For: 1.2.3.4, 10.0.0.5".into()],
            trusted_proxies: 1,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(d.status, 403, "with 1 trusted proxy the client is 10.0.0.5");
}

#[test]
fn header_conditions() {
    let e = allow(
        r#"{when: [{key: "request.headers[X-Env]", values: ["prod", "stag*", "*-canary"]}]}"#,
    );
    assert_eq!(req("/").header("x-env", "prod").status(&e), 200);
    assert_eq!(
        req("/").header("X-ENV", "staging").status(&e),
        200,
        "header names ignore case"
    );
    assert_eq!(req("/").header("x-env", "eu-canary").status(&e), 200);
    assert_eq!(
        req("/").header("x-env", "Prod").status(&e),
        403,
        "values are case-sensitive"
    );
    assert_eq!(req("/").status(&e), 403);
    // Repeated headers are joined with ','.
    assert_eq!(
        req("/")
            .header("x-env", "prod")
            .header("x-env", "dev")
            .status(&e),
        403
    );
    let e = allow(r#"{when: [{key: "request.headers[x-env]", values: ["prod,dev"]}]}"#);
    assert_eq!(
        req("/")
            .header("x-env", "prod")
            .header("x-env", "dev")
            .status(&e),
        200
    );
    let e = allow(r#"{when: [{key: "request.headers[x-token]", values: ["*"]}]}"#);
    assert_eq!(
        req("/").header("x-token", "").status(&e),
        200,
        "* = header present"
    );
    assert_eq!(req("/").status(&e), 403);
    let e = engine(&ap(
        "foo",
        "d",
        "DENY",
        r#"[{when: [{key: "request.headers[x-token]", notValues: ["s3cret"]}]}]"#,
    ));
    assert_eq!(
        req("/").status(&e),
        403,
        "notValues on a missing header matches"
    );
    assert_eq!(req("/").header("x-token", "s3cret").status(&e), 200);
    let e = allow(r#"{when: [{key: "request.headers[:authority]", values: ["svc.example.com"]}]}"#);
    assert_eq!(req("/").status(&e), 200);
}

#[test]
fn sni_condition() {
    let e = allow(r#"{when: [{key: connection.sni, values: ["*.example.com"]}]}"#);
    assert_eq!(req("/").sni("a.example.com").status(&e), 200);
    assert_eq!(req("/").status(&e), 403);
    let e = allow(r#"{when: [{key: connection.sni, notValues: ["bad.example.com"]}]}"#);
    assert_eq!(req("/").status(&e), 200);
}

#[test]
fn and_across_fields_or_within_and_across_entries() {
    let e = allow(
        r#"{from: [{source: {ipBlocks: ["1.1.1.1"]}}, {source: {ipBlocks: ["2.2.2.2"], notIpBlocks: ["2.2.2.2"]}}], to: [{operation: {methods: ["GET"], paths: ["/a", "/b"]}}, {operation: {methods: ["POST"]}}], when: [{key: "request.headers[x]", values: ["1"]}]}"#,
    );
    let ok = req("/b").src("1.1.1.1").header("x", "1");
    assert_eq!(ok.clone().status(&e), 200);
    assert_eq!(
        ok.clone().method("POST").status(&e),
        200,
        "second operation"
    );
    assert_eq!(ok.clone().method("PUT").status(&e), 403);
    assert_eq!(
        ok.clone().src("2.2.2.2").status(&e),
        403,
        "x and notX in one source"
    );
    assert_eq!(req("/b").src("1.1.1.1").status(&e), 403, "when is ANDed");
    assert_eq!(req("/c").src("1.1.1.1").header("x", "1").status(&e), 403);
}

#[test]
fn first_policy_by_name_and_rule_reported() {
    let y = ap(
        "foo",
        "b-second",
        "DENY",
        r#"[{to: [{operation: {paths: ["/x"]}}]}]"#,
    ) + &ap(
        "foo",
        "a-first",
        "DENY",
        r#"[{to: [{operation: {paths: ["/y"]}}]}, {to: [{operation: {paths: ["/x"]}}]}]"#,
    );
    let d = req("/x").eval(&engine(&y));
    assert_eq!(
        (d.policy.as_deref(), d.rule),
        (Some("foo/a-first"), Some(1))
    );
}

#[test]
fn dry_run_is_not_enforced() {
    let y = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: d\n  namespace: foo\n  annotations:\n    istio.io/dry-run: \"true\"\nspec:\n  action: DENY\n  rules: [{}]\n";
    let d = req("/").eval(&engine(y));
    assert_eq!(d.status, 200);
    assert!(
        d.dry_run.as_deref().unwrap_or("").contains("foo/d"),
        "{:?}",
        d.dry_run
    );
}

const ISS: &str = "https://issuer.example.com";

fn ra(extra_rule: &str, jwks: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: foo}}\nspec:\n  jwtRules:\n  - issuer: \"{ISS}\"\n    jwks: '{jwks}'\n{extra_rule}---\n"
    )
}

#[test]
fn request_principals_and_claims() {
    let key = rsa_key(1, "k1", Algorithm::RS256);
    let base = ra("", &jwks(&[&key]));
    let tok = |sub: &str, extra: serde_json::Value| {
        let mut c = claims(ISS, sub);
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        sign(&key, &c)
    };
    let alice = tok(
        "alice",
        json!({"groups": ["dev", "ops"], "scope": "read write", "org": {"team": {"name": "core"}}, "azp": "cli", "aud": ["a1", "a2"], "level": 3}),
    );

    let case = |rule: &str, t: Option<&str>| -> u16 {
        let e = engine(&(base.clone() + &ap("foo", "p", "ALLOW", &format!("[{rule}]"))));
        let r = req("/");
        match t {
            Some(t) => r.jwt(t).status(&e),
            None => r.status(&e),
        }
    };
    let rp = |v: &str| format!(r#"{{from: [{{source: {{requestPrincipals: ["{v}"]}}}}]}}"#);
    assert_eq!(case(&rp(&format!("{ISS}/alice")), Some(&alice)), 200);
    assert_eq!(case(&rp(&format!("{ISS}/bob")), Some(&alice)), 403);
    assert_eq!(case(&rp("*"), Some(&alice)), 200);
    assert_eq!(case(&rp("*"), None), 403, "no token: no request principal");
    assert_eq!(case(&rp("*ice"), Some(&alice)), 200, "*x: subject suffix");
    assert_eq!(
        case(&rp("*example.com/alice"), Some(&alice)),
        200,
        "*x/s: issuer suffix + subject"
    );
    assert_eq!(case(&rp(&format!("{ISS}/*")), Some(&alice)), 200);
    assert_eq!(case(&rp(&format!("{ISS}/al*")), Some(&alice)), 200);
    assert_eq!(case(&rp(&format!("{ISS}/bo*")), Some(&alice)), 403);
    // Values are split at the last `/`: `https://issuer*` is issuer `https:` + subject prefix.
    assert_eq!(
        case(&rp("https://issuer*"), Some(&alice)),
        403,
        "split at last /"
    );
    let e = engine(
        &(base.clone()
            + &ap(
                "foo",
                "d",
                "DENY",
                r#"[{from: [{source: {notRequestPrincipals: ["*"]}}]}]"#,
            )),
    );
    assert_eq!(req("/").status(&e), 403, "require JWT");
    assert_eq!(req("/").jwt(&alice).status(&e), 200);

    let w = |k: &str, v: &str| format!(r#"{{when: [{{key: "{k}", values: ["{v}"]}}]}}"#);
    assert_eq!(
        case(
            &w("request.auth.principal", &format!("{ISS}/alice")),
            Some(&alice)
        ),
        200
    );
    assert_eq!(
        case(&w("request.auth.claims[groups]", "ops"), Some(&alice)),
        200,
        "list claim: any element"
    );
    assert_eq!(
        case(&w("request.auth.claims[groups]", "admin"), Some(&alice)),
        403
    );
    assert_eq!(
        case(&w("request.auth.claims[scope]", "write"), Some(&alice)),
        200,
        "scope is space-delimited"
    );
    assert_eq!(
        case(&w("request.auth.claims[scope]", "read write"), Some(&alice)),
        403
    );
    assert_eq!(
        case(
            &w("request.auth.claims[org][team][name]", "core"),
            Some(&alice)
        ),
        200,
        "nested claim"
    );
    assert_eq!(
        case(
            &w("request.auth.claims[org][team][name]", "co*"),
            Some(&alice)
        ),
        200
    );
    assert_eq!(
        case(&w("request.auth.claims[level]", "3"), Some(&alice)),
        403,
        "numbers never string-match"
    );
    assert_eq!(
        case(&w("request.auth.claims[missing]", "*"), Some(&alice)),
        403
    );
    assert_eq!(case(&w("request.auth.audiences", "a2"), Some(&alice)), 200);
    assert_eq!(case(&w("request.auth.presenter", "cli"), Some(&alice)), 200);
    assert_eq!(case(&w("request.auth.presenter", "web"), Some(&alice)), 403);
    assert_eq!(case(&w("request.auth.claims[groups]", "ops"), None), 403);
    let nv = r#"{when: [{key: "request.auth.claims[groups]", notValues: ["admin"]}]}"#;
    assert_eq!(case(nv, None), 200, "notValues on missing claim holds");
}

fn pa(ns: &str, name: &str, sel: Option<&str>, mode: &str, ports: &str) -> String {
    let sel = sel
        .map(|s| format!("  selector:\n    matchLabels: {s}\n"))
        .unwrap_or_default();
    let ports = if ports.is_empty() {
        String::new()
    } else {
        format!("  portLevelMtls: {ports}\n")
    };
    format!("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n{sel}  mtls: {{mode: {mode}}}\n{ports}---\n")
}

#[test]
fn peer_authentication_modes_and_precedence() {
    let e = engine("");
    assert_eq!(
        e.peer_auth_mode("foo", &Default::default(), 80),
        MtlsMode::Permissive
    );
    let e = engine(&pa("istio-system", "mesh", None, "STRICT", ""));
    let d = req("/").eval(&e);
    assert_eq!(
        (d.status, d.policy.as_deref()),
        (403, Some("istio-system/mesh"))
    );
    assert_eq!(
        req("/").peer("spiffe://cluster.local/ns/a/sa/b").status(&e),
        200
    );

    let y = pa("istio-system", "mesh", None, "STRICT", "")
        + &pa("foo", "ns", None, "PERMISSIVE", "")
        + &pa(
            "foo",
            "wl",
            Some("{app: db}"),
            "UNSET",
            "{5432: {mode: STRICT}, 8080: {mode: DISABLE}}",
        )
        + &pa(
            "istio-system",
            "ignored-selector",
            Some("{app: db}"),
            "DISABLE",
            "",
        );
    let e = engine(&y);
    let db = [("app".to_string(), "db".to_string())]
        .into_iter()
        .collect();
    assert_eq!(e.peer_auth_mode("foo", &db, 5432), MtlsMode::Strict);
    assert_eq!(e.peer_auth_mode("foo", &db, 8080), MtlsMode::Disable);
    assert_eq!(
        e.peer_auth_mode("foo", &db, 9000),
        MtlsMode::Permissive,
        "UNSET inherits namespace"
    );
    assert_eq!(
        e.peer_auth_mode("bar", &db, 5432),
        MtlsMode::Strict,
        "mesh level"
    );
    assert_eq!(req("/").label("app", "db").port(5432).status(&e), 403);
    assert_eq!(req("/").label("app", "db").port(9000).status(&e), 200);

    // DISABLE: the client certificate is not used for identity.
    let y = pa("foo", "off", None, "DISABLE", "")
        + &ap(
            "foo",
            "p",
            "ALLOW",
            r#"[{from: [{source: {principals: ["*"]}}]}]"#,
        );
    let e = engine(&y);
    assert_eq!(req("/").peer("spiffe://td/ns/a/sa/b").status(&e), 403);
}

fn load_err(y: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.yaml");
    std::fs::write(&p, y).unwrap();
    let cfg = moat_authz::AuthzConfig {
        policies: vec![p],
        ..Default::default()
    };
    moat_authz::AuthzEngine::build_with(
        &cfg,
        dir.path(),
        std::sync::Arc::new(moat_authz::NoFetch),
        false,
    )
    .unwrap_err()
    .to_string()
}

#[test]
fn invalid_policies_are_located_errors() {
    let head = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: p, namespace: foo}\nspec:\n";
    let e = load_err(&format!(
        "{head}  rules:\n  - to:\n    - operation:\n        pathz: [\"/a\"]\n"
    ));
    assert!(
        e.contains("bad.yaml:8:")
            && e.contains("spec.rules[0].to[0].operation")
            && e.contains("pathz"),
        "{e}"
    );
    let e = load_err(&format!("{head}  action: CUSTOM\n"));
    assert!(
        e.contains("spec.provider") && e.contains("provider.name"),
        "{e}"
    );
    let e = load_err(&format!("{head}  action: ALLOW\n  provider: {{name: x}}\n"));
    assert!(e.contains("only for action CUSTOM"), "{e}");
    let e = load_err(&format!(
        "{head}  action: CUSTOM\n  provider: {{name: x}}\n"
    ));
    assert!(e.contains("unknown extension provider `x`"), "{e}");
    let e = load_err(&format!(
        "{head}  rules: [{{from: [{{source: {{ipBlocks: [\"10.0.0.0/33\"]}}}}]}}]\n"
    ));
    assert!(e.contains("invalid CIDR") && e.contains("ipBlocks"), "{e}");
    let e = load_err(&format!(
        "{head}  rules: [{{to: [{{operation: {{ports: [\"99999\"]}}}}]}}]\n"
    ));
    assert!(e.contains("invalid port"), "{e}");
    let e = load_err(&format!(
        "{head}  rules: [{{when: [{{key: request.foo, values: [a]}}]}}]\n"
    ));
    assert!(e.contains("unknown key `request.foo`"), "{e}");
    let e = load_err(&format!(
        "{head}  rules: [{{when: [{{key: source.ip}}]}}]\n"
    ));
    assert!(e.contains("at least one of values or notValues"), "{e}");
    let e = load_err(&format!(
        "{head}  rules: [{{to: [{{operation: {{paths: [\"\"]}}}}]}}]\n"
    ));
    assert!(e.contains("empty value"), "{e}");
    let e = load_err(&format!(
        "{head}  rules: [{{to: [{{operation: {{paths: [\"/a/{{**}}/{{*}}\"]}}}}]}}]\n"
    ));
    assert!(e.contains("last operator"), "{e}");
    let e = load_err(&format!(
        "{head}  targetRefs: [{{kind: Gateway, name: gw}}]\n"
    ));
    assert!(e.contains("targetRef"), "{e}");
    let e = load_err(&format!(
        "{head}  rules: [{{from: [{{source: {{serviceAccounts: [a], principals: [b]}}}}]}}]\n"
    ));
    assert!(e.contains("serviceAccounts cannot be combined"), "{e}");
    let e = load_err(
        "apiVersion: security.istio.io/v1alpha1\nkind: AuthorizationPolicy\nmetadata: {name: p}\n",
    );
    assert!(e.contains("bad.yaml:1:") && e.contains("apiVersion"), "{e}");
    let e =
        load_err("apiVersion: networking.istio.io/v1\nkind: VirtualService\nmetadata: {name: p}\n");
    assert!(e.contains("unsupported kind `VirtualService`"), "{e}");
    let e = load_err("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p}\nspec:\n  portLevelMtls: {80: {mode: STRICT}}\n");
    assert!(e.contains("requires a workload selector"), "{e}");
    let e = load_err("apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: p}\nspec:\n  mtls: {mode: STRICTER}\n");
    assert!(e.contains("unknown mode"), "{e}");
    let e = load_err("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: p}\nspec:\n  jwtRules: [{issuer: a, jwks: '{\"keys\":[]}', jwksUri: 'http://x/'}]\n");
    assert!(e.contains("only one of jwks and jwksUri"), "{e}");
    let e = load_err("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: p}\nspec:\n  jwtRules: [{issuer: a, jwks: 'not json'}]\n");
    assert!(e.contains("JWKS is not JSON"), "{e}");
    let e = load_err("apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {name: p}\nspec:\n  jwtRules: [{issuer: a, jwksUri: 'ftp://x/'}]\n");
    assert!(e.contains("http://, https:// or file:"), "{e}");
    // Second document: line numbers are file-relative.
    let e = load_err(&format!(
        "{head}  action: DENY\n---\n{head}  actoin: DENY\n"
    ));
    assert!(e.contains("bad.yaml:11:"), "{e}");
}

#[test]
fn too_many_rules_is_refused() {
    let rules: Vec<String> = (0..513)
        .map(|i| format!("{{to: [{{operation: {{paths: [\"/{i}\"]}}}}]}}"))
        .collect();
    let e = load_err(&ap(
        "foo",
        "big",
        "ALLOW",
        &format!("[{}]", rules.join(",")),
    ));
    assert!(e.contains("at most 512"), "{e}");
}

#[test]
fn directory_loading_is_recursive_and_ordered() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    std::fs::write(
        dir.path().join("a.yaml"),
        ap(
            "foo",
            "a",
            "DENY",
            r#"[{to: [{operation: {paths: ["/a"]}}]}]"#,
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("sub/b.yml"),
        ap(
            "foo",
            "b",
            "DENY",
            r#"[{to: [{operation: {paths: ["/b"]}}]}]"#,
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("ignored.txt"), "not yaml").unwrap();
    let cfg = moat_authz::AuthzConfig {
        policies: vec![dir.path().to_path_buf()],
        ..Default::default()
    };
    let e = moat_authz::AuthzEngine::build_with(
        &cfg,
        dir.path(),
        std::sync::Arc::new(moat_authz::NoFetch),
        false,
    )
    .unwrap();
    assert_eq!(e.policies().authz.len(), 2);
    assert_eq!(req("/a").status(&e), 403);
    assert_eq!(req("/b").status(&e), 403);
    assert_eq!(req("/c").status(&e), 200);
}
