//! The `RequestHeadersPhase` implementation as the proxy calls it.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use jsonwebtoken::Algorithm;
use moat_core::{
    Connection, EventAction, PeerIdentity, RequestCtx, RequestHeadersPhase, TlsSession, Verdict,
};

const ISS: &str = "https://issuer.example.com";

fn policies(jwks_text: &str) -> String {
    format!(
        "apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {{name: jwt, namespace: shop}}
spec:
  jwtRules:
  - issuer: \"{ISS}\"
    jwks: '{jwks_text}'
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: api, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: api}}}}
  rules:
  - from: [{{source: {{requestPrincipals: [\"{ISS}/*\"]}}}}]
    to: [{{operation: {{paths: [\"/orders*\"]}}}}]
  - from: [{{source: {{principals: [\"cluster.local/ns/shop/sa/worker\"]}}}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {{name: audit-admin, namespace: istio-system}}
spec:
  action: AUDIT
  rules: [{{to: [{{operation: {{paths: [\"/admin*\"]}}}}]}}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {{name: strict-db, namespace: shop}}
spec:
  selector: {{matchLabels: {{app: db}}}}
  mtls: {{mode: STRICT}}
"
    )
}

fn ctx(app: &str, peer: Option<&str>) -> RequestCtx {
    let mut c = RequestCtx::for_test("r1");
    c.namespace = "shop".into();
    let labels: BTreeMap<String, String> =
        [("app".to_string(), app.to_string())].into_iter().collect();
    c.labels = Arc::new(labels);
    c.conn = Arc::new(Connection {
        remote_addr: ([10, 0, 0, 7], 5555).into(),
        local_addr: ([10, 0, 0, 1], 8443).into(),
        tls: peer.map(|u| {
            let (principal, namespace) = PeerIdentity::from_spiffe_uri(u);
            TlsSession {
                sni: Some("api.shop".into()),
                peer: Some(PeerIdentity {
                    principal,
                    namespace,
                    uri_sans: vec![u.into()],
                    ..Default::default()
                }),
                ..Default::default()
            }
        }),
    });
    c
}

fn parts(path: &str, bearer: Option<&str>) -> http::request::Parts {
    let mut b = http::Request::get(path).header("host", "api.shop");
    if let Some(t) = bearer {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    b.body(()).unwrap().into_parts().0
}

#[test]
fn phase_allows_denies_and_sets_auth() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let e = engine(&policies(&jwks(&[&key])));
    let phase: Arc<dyn RequestHeadersPhase> = e.clone();
    assert_eq!(phase.name(), "authz");
    let t = sign(&key, &claims(ISS, "alice"));

    let mut c = ctx("api", None);
    let mut p = parts("/orders/1", Some(&t));
    assert!(matches!(
        phase.on_request_headers(&mut c, &mut p),
        Verdict::Continue
    ));
    let auth = c.auth.as_ref().unwrap();
    assert_eq!(auth.principal, "https://issuer.example.com/alice");
    assert_eq!(auth.claims["sub"], "alice");
    assert!(
        p.headers.get("authorization").is_none(),
        "token not forwarded by default"
    );

    // Denied: 403 `RBAC: access denied` and a block event.
    let mut c = ctx("api", None);
    let mut p = parts("/admin", None);
    match phase.on_request_headers(&mut c, &mut p) {
        Verdict::Respond(r) => {
            assert_eq!(r.status, 403);
            assert_eq!(&r.body[..], b"RBAC: access denied");
        }
        Verdict::Continue => panic!("expected a denial"),
    }
    let audit = c
        .events
        .iter()
        .find(|e| e.action == EventAction::Monitor)
        .unwrap();
    assert_eq!(audit.rule, "istio-system/audit-admin[rule 0]");
    let block = c
        .events
        .iter()
        .find(|e| e.action == EventAction::Block)
        .unwrap();
    assert_eq!(block.engine, "authz");

    // mTLS peer identity from the connection.
    let mut c = ctx("api", Some("spiffe://cluster.local/ns/shop/sa/worker"));
    let mut p = parts("/anything", None);
    assert!(matches!(
        phase.on_request_headers(&mut c, &mut p),
        Verdict::Continue
    ));

    // Invalid token: 401 with WWW-Authenticate.
    let mut c = ctx("api", None);
    let mut p = parts("/orders", Some("not.a.jwt"));
    match phase.on_request_headers(&mut c, &mut p) {
        Verdict::Respond(r) => {
            assert_eq!(r.status, 401);
            let www = r
                .headers
                .iter()
                .find(|(n, _)| n == http::header::WWW_AUTHENTICATE)
                .unwrap();
            assert!(
                www.1
                    .to_str()
                    .unwrap()
                    .contains("realm=\"http://api.shop/orders\""),
                "{:?}",
                www.1
            );
        }
        Verdict::Continue => panic!("expected 401"),
    }
    assert_eq!(c.events[0].engine, "authn");

    // STRICT: plaintext refused, mTLS accepted.
    let labels: BTreeMap<String, String> = [("app".to_string(), "db".to_string())]
        .into_iter()
        .collect();
    assert_eq!(
        e.peer_auth_mode("shop", &labels, 8443),
        moat_authz::MtlsMode::Strict
    );
    let mut c = ctx("db", None);
    let mut p = parts("/", None);
    assert!(
        matches!(phase.on_request_headers(&mut c, &mut p), Verdict::Respond(r) if r.status == 403)
    );
    let mut c = ctx("db", Some("spiffe://cluster.local/ns/shop/sa/x"));
    let mut p = parts("/", None);
    assert!(matches!(
        phase.on_request_headers(&mut c, &mut p),
        Verdict::Continue
    ));
}

#[test]
fn monitor_only_never_blocks() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let cfg = moat_authz::AuthzConfig {
        monitor_only: true,
        ..Default::default()
    };
    let e = engine_cfg(&policies(&jwks(&[&key])), cfg);
    let mut c = ctx("api", None);
    let mut p = parts("/private", None);
    assert!(matches!(
        e.on_request_headers(&mut c, &mut p),
        Verdict::Continue
    ));
    assert!(c
        .events
        .iter()
        .any(|ev| ev.action == EventAction::Monitor && ev.engine == "authz"));
    // Per-route monitor mode.
    let e = engine(&policies(&jwks(&[&key])));
    let mut c = ctx("api", None);
    c.monitor_only = true;
    let mut p = parts("/private", None);
    assert!(matches!(
        e.on_request_headers(&mut c, &mut p),
        Verdict::Continue
    ));
    // A request monitor mode lets through goes upstream with the path the policies
    // matched, whichever check refused it: STRICT without a certificate, a bad token,
    // or a policy.
    for (app, bearer) in [("db", None), ("api", Some("not.a.token")), ("api", None)] {
        let mut c = ctx(app, None);
        c.monitor_only = true;
        let mut p = parts("/orders/../admin/x?q=1", bearer);
        assert!(matches!(
            e.on_request_headers(&mut c, &mut p),
            Verdict::Continue
        ));
        assert!(c.events.iter().any(|ev| ev.action == EventAction::Monitor));
        assert_eq!(
            c.forward_path.as_ref().map(|pq| pq.as_str()),
            Some("/admin/x?q=1"),
            "{app} {bearer:?}"
        );
    }
}

#[test]
fn config_section_parses_with_defaults_and_rejects_unknown_fields() {
    let cfg: moat_authz::AuthzConfig = moat_config::from_str(
        std::path::Path::new("moat.yaml"),
        "enabled: true\npolicies: [policies/]\ntrusted_proxies: 1\npath_normalization: merge_slashes\njwks_refresh_interval: 1m\n",
    )
    .unwrap();
    assert!(cfg.enabled);
    assert_eq!(cfg.root_namespace, "istio-system");
    assert_eq!(cfg.trusted_proxies, Some(1));
    assert_eq!(
        cfg.path_normalization,
        moat_authz::PathNormalization::MergeSlashes
    );
    assert_eq!(
        cfg.jwks_refresh_interval,
        std::time::Duration::from_secs(60)
    );
    assert_eq!(cfg.jwt_cache_size, 10_000);
    let e = moat_config::from_str::<moat_authz::AuthzConfig>(
        std::path::Path::new("moat.yaml"),
        "enabld: true\n",
    )
    .unwrap_err();
    assert!(e.message.contains("unknown field"), "{e}");
}

/// The Host header is read as text for `hosts` whatever its length (the phase copies
/// short values to the stack, longer ones to the heap) and whatever its bytes (not UTF-8:
/// replacement characters, as before).
#[test]
fn host_header_of_any_length_and_bytes_is_matched() {
    let e = engine(
        "apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: hosts, namespace: shop}
spec:
  rules: [{to: [{operation: {hosts: [\"*.example\"]}}]}]
",
    );
    let decide = |host: &[u8]| {
        let mut p = http::Request::get("/x")
            .header("host", http::HeaderValue::from_bytes(host).unwrap())
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let mut c = ctx("api", None);
        matches!(e.on_request_headers(&mut c, &mut p), Verdict::Continue)
    };
    assert!(decide(b"api.example"));
    assert!(!decide(b"api.other"));
    for len in [250, 256, 257, 4000] {
        let mut long = vec![b'a'; len - ".example".len()];
        long.extend_from_slice(b".example");
        assert!(decide(&long), "{len}-byte host");
        long.extend_from_slice(b".x");
        assert!(!decide(&long), "{}-byte host", len + 2);
    }
    assert!(decide(b"caf\xe9.example"), "not UTF-8, matched lossily");
    assert!(!decide(b"caf\xe9.other"));
}

/// The phase finds a workload's policies by the identity of the route's shared
/// `Arc`s: routes of different workloads, requests alternating between them, and a
/// workload cap of one (every switch starts the pinned workloads over) must still
/// give each request its own workload's decision, also for an equal workload held in
/// another allocation.
#[test]
fn each_request_gets_its_own_workloads_policies() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let cfg = moat_authz::AuthzConfig {
        max_workloads: 1,
        ..Default::default()
    };
    let e = engine_cfg(&policies(&jwks(&[&key])), cfg);
    let phase: Arc<dyn RequestHeadersPhase> = e;
    let api = ctx("api", None);
    let web = ctx("web", None);
    let verdict = |route: &RequestCtx| {
        let mut c = route.clone();
        let mut p = parts("/orders/1", None);
        matches!(phase.on_request_headers(&mut c, &mut p), Verdict::Continue)
    };
    for _ in 0..3 {
        // `api` has an ALLOW policy this anonymous request does not match; `web` none.
        assert!(!verdict(&api), "api's ALLOW policy applies");
        assert!(verdict(&web), "no policy applies to web");
        assert!(
            !verdict(&ctx("api", None)),
            "an equal workload, another Arc"
        );
    }
}

/// The fields the proxy removes the CGI twins of: those conditions read, those tokens
/// come from and those verified claims are written to, over every policy.
#[test]
fn fields_decided_on_name_conditions_tokens_and_claims() {
    let e = engine(
        "apiVersion: security.istio.io/v1
kind: RequestAuthentication
metadata: {name: jwt, namespace: shop}
spec:
  jwtRules:
  - issuer: https://issuer.example.com
    jwks: '{\"keys\":[]}'
    fromHeaders: [{name: x-jwt-assertion}]
    outputClaimToHeaders: [{header: x-jwt-sub, claim: sub}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-admin, namespace: other}
spec:
  action: DENY
  rules:
  - when: [{key: \"request.headers[X-User]\", values: [admin]}]
    to: [{operation: {methods: [DELETE]}}]
  - when: [{key: \"request.headers[:authority]\", values: [a]}]
",
    );
    let mut names: Vec<String> = e
        .fields_decided_on()
        .iter()
        .map(|h| h.to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["x-jwt-assertion", "x-jwt-sub", "x-user"]);
}
