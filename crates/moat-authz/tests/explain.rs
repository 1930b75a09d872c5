//! `moat policy explain` (the formatting and content) and `moat policy check --tcp` (the
//! library half of the CLI).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;

use common::*;
use moat_authz::check::{self, CheckArgs};
use moat_authz::explain;

const POLICIES: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin, namespace: istio-system}
spec:
  action: DENY
  rules:
  - to: [{operation: {paths: ["/admin*"], ports: ["8080"]}}]
    when: [{key: "request.headers[x-break-glass]", notValues: ["yes"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  rules:
  - to: [{operation: {methods: ["GET"], paths: ["/public/{**}"]}}]
  - from: [{source: {principals: ["cluster.local/ns/shop/sa/frontend"]}}, {source: {notIpBlocks: ["10.0.0.0/8"]}}]
  - from: [{source: {requestPrincipals: ["https://issuer.example.com/*"]}}]
    when: [{key: "request.auth.claims[groups][0]", values: ["admins"]}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: nothing, namespace: shop}
spec: {}
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: audit-delete, namespace: shop, annotations: {"istio.io/dry-run": "true"}}
spec:
  action: AUDIT
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: other-workload, namespace: shop}
spec:
  selector: {matchLabels: {app: db}}
  rules: [{}]
---
apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: shop}
spec:
  jwtRules:
  - issuer: https://issuer.example.com
    jwks: '{"keys":[]}'
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: mesh, namespace: istio-system}
spec:
  mtls: {mode: STRICT}
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: web, namespace: shop}
spec:
  selector: {matchLabels: {app: web}}
  portLevelMtls: {8081: {mode: PERMISSIVE}}
"#;

fn web() -> BTreeMap<String, String> {
    BTreeMap::from([("app".to_string(), "web".to_string())])
}

#[test]
fn explain_lists_policies_in_evaluation_order() {
    let e = engine(POLICIES);
    let x = explain::explain(&e, "shop", &web());
    let actions: Vec<&str> = x.authorization.iter().map(|s| s.action).collect();
    assert_eq!(actions, ["CUSTOM", "AUDIT", "DENY", "ALLOW"]);
    let names = |i: usize| -> Vec<String> {
        x.authorization[i]
            .policies
            .iter()
            .map(|p| p.policy.clone())
            .collect()
    };
    assert!(names(0).is_empty());
    assert_eq!(names(1), ["shop/audit-delete"]);
    assert_eq!(names(2), ["istio-system/deny-admin"]);
    assert_eq!(
        names(3),
        ["shop/nothing", "shop/web"],
        "namespace/name order; db policy excluded"
    );
    assert_eq!(
        x.peer_authentication.policy.as_deref(),
        Some("istio-system/mesh")
    );
    assert_eq!(x.peer_authentication.ports.len(), 1);
    assert_eq!(x.request_authentication[0].policy, "shop/jwt");

    let text = explain::to_text(&x);
    let want = "\
workload: namespace shop, labels {app=web} (root namespace istio-system)
1. PeerAuthentication: STRICT (istio-system/mesh); port 8081: PERMISSIVE (shop/web)
2. RequestAuthentication: shop/jwt (issuers https://issuer.example.com)
3. AuthorizationPolicy, in evaluation order (the first matching rule decides):
ACTION  POLICY                       RULE  CONDITIONS                                                                                                ON TCP
CUSTOM  -                            -     (none)                                                                                                    -
AUDIT   shop/audit-delete (dry-run)  0     (empty rule: matches everything)                                                                          as written
DENY    istio-system/deny-admin      0     to: {ports=8080 paths=/admin*}; when: request.headers[x-break-glass] notIn [yes]                          drops paths,request.headers[x-break-glass]: to: {ports=8080}
ALLOW   shop/nothing                 -     (no rules: matches nothing)                                                                               as written
ALLOW   shop/web                     0     to: {methods=GET paths=/public/{**}}                                                                      never matches (HTTP-only: methods,paths)
ALLOW   shop/web                     1     from: {principals=cluster.local/ns/shop/sa/frontend} or {notIpBlocks=10.0.0.0/8}                          as written
ALLOW   shop/web                     2     from: {requestPrincipals=https://issuer.example.com/*}; when: request.auth.claims[groups][0] in [admins]  never matches (HTTP-only: requestPrincipals,request.auth.claims[groups][0])
";
    assert_eq!(text, want, "\n{text}");

    let j = explain::to_json(&x);
    assert_eq!(j["namespace"], "shop");
    assert_eq!(j["peer_authentication"]["mode"], "STRICT");
    assert_eq!(j["authorization"][0]["action"], "CUSTOM");
    assert_eq!(j["authorization"][3]["policies"][1]["rules"][0]["index"], 0);
    assert_eq!(
        j["authorization"][2]["policies"][0]["rules"][0]["tcp"],
        "drops paths,request.headers[x-break-glass]: to: {ports=8080}"
    );
    assert_eq!(j["authorization"][1]["policies"][0]["dry_run"], true);
}

#[test]
fn explain_of_a_workload_without_policies() {
    let e = engine(POLICIES);
    let x = explain::explain(&e, "elsewhere", &BTreeMap::new());
    let text = explain::to_text(&x);
    assert!(text.contains("2. RequestAuthentication: none"), "{text}");
    assert!(text.contains("ALLOW   -"), "{text}");
    assert!(text.contains("DENY    istio-system/deny-admin"), "{text}");
}

fn tcp_args(dir: &std::path::Path) -> CheckArgs {
    CheckArgs {
        policies: vec![dir.join("p.yaml")],
        namespace: "shop".into(),
        labels: vec!["app=web".into()],
        port: Some(8081),
        ..CheckArgs::default()
    }
}

#[test]
fn check_connection() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("p.yaml"), POLICIES).unwrap();
    let args = tcp_args(dir.path());
    let e = check::build_engine(&args, std::sync::Arc::new(moat_authz::NoFetch)).unwrap();
    // Port 8081 is PERMISSIVE; plaintext from 10.0.0.1: rule 1's second source
    // (notIpBlocks) does not hold, rules 0 and 2 never match a connection.
    let a = CheckArgs {
        source_ip: Some("10.0.0.1".into()),
        ..args.clone()
    };
    let d = check::check_connection_with(&e, &a).unwrap();
    assert!(!d.allowed);
    assert_eq!(
        check::connection_to_text(&d),
        "DENY (connection closed)\nreason: no ALLOW policy matched (2 ALLOW rule(s) use HTTP-only fields and never match a TCP connection)\naudit: shop/audit-delete[rule 0] (dry-run)\n"
    );
    let a = CheckArgs {
        source_ip: Some("192.0.2.1".into()),
        ..args.clone()
    };
    let d = check::check_connection_with(&e, &a).unwrap();
    assert_eq!(
        check::connection_to_text(&d),
        "ALLOW (connection accepted)\npolicy: shop/web rule 1\nreason: matched an ALLOW policy\naudit: shop/audit-delete[rule 0] (dry-run)\n"
    );
    let j = check::connection_to_json(&d);
    assert_eq!(j["protocol"], "tcp");
    assert_eq!(j["decision"], "ALLOW");
    assert_eq!(j["connection"], "accepted");
    assert_eq!(j["mtls_mode"], "PERMISSIVE");
    assert_eq!(
        j["audit_policies"][0],
        "shop/audit-delete[rule 0] (dry-run)"
    );
    // The DENY on port 8080 loses its path and header conditions: every connection to
    // 8080 is closed, whatever the peer.
    let a = CheckArgs {
        port: Some(8080),
        peer_uri: Some("spiffe://cluster.local/ns/shop/sa/frontend".into()),
        ..args.clone()
    };
    let d = check::check_connection_with(&e, &a).unwrap();
    assert_eq!(
        (d.allowed, d.policy.as_deref()),
        (false, Some("istio-system/deny-admin"))
    );
    // Port 9000 falls back to the mesh-wide STRICT: plaintext is closed.
    let a = CheckArgs {
        port: Some(9000),
        ..args.clone()
    };
    let d = check::check_connection_with(&e, &a).unwrap();
    assert_eq!(d.policy.as_deref(), Some("istio-system/mesh"));
    // Input errors.
    let a = CheckArgs {
        port: None,
        ..args.clone()
    };
    assert!(check::check_connection_with(&e, &a)
        .unwrap_err()
        .contains("--port is required"));
    let a = CheckArgs {
        source_ip: Some("nope".into()),
        ..args
    };
    assert!(check::check_connection_with(&e, &a)
        .unwrap_err()
        .contains("--source-ip"));
}
