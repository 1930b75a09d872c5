//! TCP (L4) connections: Istio's TCP filter-chain semantics (`model.go` `checkError`,
//! `builder.go` "skipped rule ... on TCP filter chain"; builder testdata
//! `tcp/allow-only-http-*`, `tcp/deny-both-http-tcp-*`).

mod common;

use common::*;
use moat_authz::MtlsMode;

fn ap(ns: &str, name: &str, action: &str, rules: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: {name}\n  namespace: {ns}\nspec:\n  action: {action}\n  rules: {rules}\n---\n"
    )
}

const FRONTEND: &str = "spiffe://cluster.local/ns/shop/sa/frontend";
const OTHER: &str = "spiffe://cluster.local/ns/other/sa/batch";

fn conn() -> Req {
    // No HTTP attribute matters for a connection; the request fields are left at
    // their defaults to show they are ignored.
    req("/admin").method("DELETE").host("db.example.com")
}

#[test]
fn no_policy_accepts() {
    let e = engine("");
    let d = conn().conn(&e);
    assert!(d.allowed);
    assert_eq!(d.status, 200);
}

#[test]
fn allow_on_tcp_fields() {
    let e = engine(&ap(
        "foo",
        "tcp",
        "ALLOW",
        r#"[{from: [{source: {principals: ["cluster.local/ns/shop/sa/frontend"]}}], to: [{operation: {ports: ["5432"]}}]},
            {from: [{source: {namespaces: ["ops"]}}]},
            {from: [{source: {ipBlocks: ["192.168.0.0/16"], notIpBlocks: ["192.168.9.0/24"]}}]},
            {from: [{source: {remoteIpBlocks: ["203.0.113.0/24"]}}]},
            {when: [{key: connection.sni, values: ["db.internal"]}, {key: destination.ip, values: ["10.9.0.0/16"]}]}]"#,
    ));
    let base = conn().src("10.0.0.1").port(5432);
    assert!(base.clone().peer(FRONTEND).conn_ok(&e));
    let d = base.clone().peer(FRONTEND).conn(&e);
    assert_eq!((d.policy.as_deref(), d.rule), (Some("foo/tcp"), Some(0)));
    assert!(!base.clone().peer(FRONTEND).port(5433).conn_ok(&e), "port");
    assert!(!base.clone().peer(OTHER).conn_ok(&e), "principal");
    assert!(!base.clone().conn_ok(&e), "plaintext has no principal");
    assert!(
        base.clone()
            .peer("spiffe://cluster.local/ns/ops/sa/x")
            .conn_ok(&e),
        "namespace"
    );
    assert!(
        conn().src("192.168.1.1").remote("192.168.1.1").conn_ok(&e),
        "ipBlocks"
    );
    assert!(
        !conn().src("192.168.9.1").remote("192.168.9.1").conn_ok(&e),
        "notIpBlocks"
    );
    // remoteIpBlocks: the remote address given, else the source address.
    assert!(conn().src("10.0.0.1").remote("203.0.113.9").conn_ok(&e));
    let mut no_remote = conn().src("203.0.113.9");
    no_remote.remote = None;
    assert!(no_remote.conn_ok(&e), "remote.ip defaults to source.ip");
    assert!(!conn().src("10.0.0.1").remote("10.0.0.1").conn_ok(&e));
    // when: connection.sni and destination.ip
    assert!(conn().sni("db.internal").dest("10.9.1.1").conn_ok(&e));
    assert!(!conn().sni("db.internal").dest("10.8.1.1").conn_ok(&e));
    let d = conn().conn(&e);
    assert_eq!(
        (d.status, d.reason.as_ref()),
        (403, "no ALLOW policy matched")
    );
}

#[test]
fn allow_rule_with_any_http_field_never_matches() {
    // Each rule would match the connection on its TCP fields alone; each also uses one
    // HTTP-only field (or its not-form), so Istio skips it on a TCP filter chain.
    for rule in [
        r#"{to: [{operation: {ports: ["8080"], methods: ["GET"]}}]}"#,
        r#"{to: [{operation: {ports: ["8080"], notPaths: ["/x"]}}]}"#,
        r#"{to: [{operation: {ports: ["8080"], hosts: ["*"]}}]}"#,
        r#"{to: [{operation: {ports: ["8080"], notHosts: ["a"]}}]}"#,
        r#"{from: [{source: {ipBlocks: ["10.0.0.0/8"], requestPrincipals: ["*"]}}]}"#,
        r#"{from: [{source: {ipBlocks: ["10.0.0.0/8"], notRequestPrincipals: ["x/y"]}}]}"#,
        r#"{from: [{source: {ipBlocks: ["10.0.0.0/8"]}}], when: [{key: "request.headers[x-a]", notValues: ["b"]}]}"#,
        r#"{from: [{source: {ipBlocks: ["10.0.0.0/8"]}}], when: [{key: "request.auth.claims[group]", values: ["a"]}]}"#,
        r#"{from: [{source: {ipBlocks: ["10.0.0.0/8"]}}], when: [{key: request.auth.audiences, values: ["a"]}]}"#,
        r#"{from: [{source: {ipBlocks: ["10.0.0.0/8"]}}], when: [{key: request.auth.presenter, values: ["a"]}]}"#,
        r#"{from: [{source: {ipBlocks: ["10.0.0.0/8"]}}], when: [{key: request.auth.principal, values: ["a/b"]}]}"#,
        // an HTTP field in another `to` entry also skips the rule
        r#"{to: [{operation: {ports: ["8080"]}}, {operation: {paths: ["/a"]}}]}"#,
    ] {
        let e = engine(&ap("foo", "p", "ALLOW", &format!("[{rule}]")));
        let d = conn().conn(&e);
        assert!(!d.allowed, "{rule}");
        assert_eq!(
            d.reason,
            "no ALLOW policy matched (1 ALLOW rule(s) use HTTP-only fields and never match a TCP connection)",
            "{rule}"
        );
    }
    // A TCP-only rule beside a skipped one still allows.
    let e = engine(&ap(
        "foo",
        "p",
        "ALLOW",
        r#"[{to: [{operation: {methods: ["GET"]}}]}, {to: [{operation: {ports: ["8080"]}}]}]"#,
    ));
    let d = conn().conn(&e);
    assert!(d.allowed);
    assert_eq!(d.rule, Some(1));
    // The skipped rule still counts as an ALLOW policy: an HTTP-only ALLOW policy denies
    // every TCP connection.
    let e = engine(&ap(
        "foo",
        "http-only",
        "ALLOW",
        r#"[{to: [{operation: {paths: ["/public/*"]}}]}]"#,
    ));
    assert!(!conn().conn_ok(&e));
    assert_eq!(req("/public/a").status(&e), 200, "HTTP unchanged");
}

#[test]
fn deny_rule_drops_only_its_http_conditions() {
    // Only HTTP conditions: the rule matches every connection.
    for rule in [
        r#"{to: [{operation: {methods: ["GET"]}}]}"#,
        r#"{to: [{operation: {notPaths: ["/health"]}}]}"#,
        r#"{from: [{source: {requestPrincipals: ["*"]}}]}"#,
        r#"{when: [{key: "request.headers[x-token]", values: ["secret"]}]}"#,
    ] {
        let e = engine(&ap("foo", "d", "DENY", &format!("[{rule}]")));
        let d = conn().conn(&e);
        assert!(!d.allowed, "{rule}");
        assert_eq!(
            (d.status, d.policy.as_deref(), d.rule),
            (403, Some("foo/d"), Some(0)),
            "{rule}"
        );
    }
    // Mixed: the TCP conditions still apply (broader, not "deny everything").
    let e = engine(&ap(
        "foo",
        "d",
        "DENY",
        r#"[{to: [{operation: {ports: ["22"], methods: ["GET"]}}], from: [{source: {notIpBlocks: ["10.0.0.0/8"], requestPrincipals: ["*"]}}]}]"#,
    ));
    assert!(!conn().port(22).src("192.0.2.1").conn_ok(&e));
    assert!(
        conn().port(22).src("10.0.0.1").conn_ok(&e),
        "notIpBlocks kept"
    );
    assert!(conn().port(23).src("192.0.2.1").conn_ok(&e), "ports kept");
    // Over HTTP the same rule needs a JWT: no JWT, no match.
    assert_eq!(req("/").port(22).src("192.0.2.1").status(&e), 200);
    // An HTTP-only `to` entry beside a TCP one becomes "any operation".
    let e = engine(&ap(
        "foo",
        "d",
        "DENY",
        r#"[{to: [{operation: {ports: ["22"]}}, {operation: {hosts: ["x"]}}]}]"#,
    ));
    assert!(!conn().port(8080).conn_ok(&e));
}

#[test]
fn deny_before_allow_and_audit() {
    let yaml = ap(
        "foo",
        "allow-mesh",
        "ALLOW",
        r#"[{from: [{source: {principals: ["*"]}}]}]"#,
    ) + &ap(
        "foo",
        "deny-other",
        "DENY",
        r#"[{from: [{source: {namespaces: ["other"]}}]}]"#,
    ) + &ap(
        "foo",
        "audit-ssh",
        "AUDIT",
        r#"[{to: [{operation: {ports: ["22"], paths: ["/x"]}}]}]"#,
    );
    let e = engine(&yaml);
    let d = conn().peer(FRONTEND).conn(&e);
    assert!(d.allowed);
    assert_eq!(d.policy.as_deref(), Some("foo/allow-mesh"));
    let d = conn().peer(OTHER).conn(&e);
    assert!(!d.allowed);
    assert_eq!(d.policy.as_deref(), Some("foo/deny-other"));
    assert!(
        !conn().conn_ok(&e),
        "plaintext: principals `*` needs a peer"
    );
    let d = conn().peer(FRONTEND).port(22).conn(&e);
    assert_eq!(d.audit, vec!["foo/audit-ssh[rule 0]".to_string()]);
}

#[test]
fn service_accounts_and_not_principals() {
    let e = engine(&ap(
        "foo",
        "d",
        "DENY",
        r#"[{from: [{source: {notPrincipals: ["*"]}}]}]"#,
    ));
    assert!(!conn().conn_ok(&e), "deny plaintext");
    assert!(conn().peer(FRONTEND).conn_ok(&e));
    let e = engine(&ap(
        "foo",
        "a",
        "ALLOW",
        r#"[{from: [{source: {serviceAccounts: ["shop/frontend"]}}]}]"#,
    ));
    assert!(conn().peer(FRONTEND).conn_ok(&e));
    assert!(!conn().peer(OTHER).conn_ok(&e));
}

#[test]
fn peer_authentication_applies_to_connections() {
    let yaml = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: strict, namespace: foo}\nspec:\n  mtls: {mode: STRICT}\n---\n".to_string()
        + &ap("foo", "a", "ALLOW", r#"[{from: [{source: {namespaces: ["shop"]}}]}]"#);
    let e = engine(&yaml);
    let d = conn().conn(&e);
    assert!(!d.allowed);
    assert_eq!(d.policy.as_deref(), Some("foo/strict"));
    assert_eq!(d.mtls_mode, MtlsMode::Strict);
    assert!(conn().peer(FRONTEND).conn_ok(&e));
    let yaml = "apiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {name: off, namespace: foo}\nspec:\n  mtls: {mode: DISABLE}\n---\n".to_string()
        + &ap("foo", "a", "ALLOW", r#"[{from: [{source: {namespaces: ["shop"]}}]}]"#);
    let e = engine(&yaml);
    assert!(
        !conn().peer(FRONTEND).conn_ok(&e),
        "DISABLE: the certificate is not used"
    );
}

#[test]
fn dry_run_on_connections() {
    let yaml = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata:\n  name: dry\n  namespace: foo\n  annotations: {\"istio.io/dry-run\": \"true\"}\nspec:\n  action: DENY\n  rules: [{to: [{operation: {ports: [\"8080\"]}}]}]\n";
    let e = engine(yaml);
    let d = conn().conn(&e);
    assert!(d.allowed);
    assert!(d.dry_run.unwrap_or_default().contains("foo/dry[rule 0]"));
}

/// CUSTOM on a TCP filter chain, as Istio builds it (`buildTCP`: "use the DENY action
/// so that a HTTP rule is properly handled"): HTTP-only conditions are dropped, so a rule
/// naming a path sends every connection to the port it names to the provider; a rule
/// with TCP fields only is matched as written. DENY and ALLOW still decide for
/// themselves (the proxy asks the provider first).
#[test]
fn custom_on_tcp_drops_http_conditions() {
    let custom = |name: &str, provider: &str, rules: &str| {
        format!(
            "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {{name: {name}, namespace: foo}}\nspec:\n  action: CUSTOM\n  provider: {{name: {provider}}}\n  rules: {rules}\n---\n"
        )
    };
    let yaml = format!(
        "{}{}{}",
        custom(
            "a-by-path",
            "opa",
            r#"[{to: [{operation: {ports: ["5432"], paths: ["/only/http"]}}]}]"#
        ),
        custom(
            "b-by-source",
            "other",
            r#"[{from: [{source: {ipBlocks: ["10.1.0.0/16"]}}]}]"#
        ),
        ap(
            "foo",
            "deny",
            "DENY",
            r#"[{to: [{operation: {ports: ["6379"]}}]}]"#
        ),
    );
    let provider = |name: &str| {
        serde_json::from_value(serde_json::json!({
            "name": name, "envoyExtAuthzGrpc": {"service": "opa.local", "port": 9191}
        }))
        .unwrap()
    };
    let cfg = moat_authz::AuthzConfig {
        extension_providers: vec![provider("opa"), provider("other")],
        ..Default::default()
    };
    let e = engine_cfg(&yaml, cfg);
    let d = conn().src("10.0.0.1").port(5432).conn(&e);
    assert_eq!(
        d.custom.as_deref(),
        Some("opa"),
        "the path is dropped on TCP"
    );
    assert!(d.allowed);
    let d = conn().src("10.1.2.3").port(5433).conn(&e);
    assert_eq!(d.custom.as_deref(), Some("other"), "a TCP field as written");
    assert_eq!(conn().src("10.0.0.1").port(5433).conn(&e).custom, None);
    let d = conn().src("10.1.2.3").port(6379).conn(&e);
    assert_eq!((d.custom.as_deref(), d.allowed), (Some("other"), false));
}
