//! RequestAuthentication: real signed tokens for every supported algorithm, refusals,
//! token locations, outputs, composition and the verified-token cache.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde_json::json;

const ISS: &str = "https://issuer.example.com";

fn ra_rule(issuer: &str, jwks_text: &str, extra: &str) -> String {
    format!("  - issuer: \"{issuer}\"\n    jwks: '{jwks_text}'\n{extra}")
}

fn ra(rules: &[String]) -> String {
    format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: foo}}\nspec:\n  jwtRules:\n{}---\n",
        rules.concat()
    )
}

const REQUIRE_JWT: &str = "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: require, namespace: foo}\nspec:\n  rules: [{from: [{source: {requestPrincipals: [\"*\"]}}]}]\n---\n";

#[test]
fn every_supported_algorithm_verifies() {
    let keys = vec![
        rsa_key(1, "rs256", Algorithm::RS256),
        rsa_key(1, "rs384", Algorithm::RS384),
        rsa_key(1, "rs512", Algorithm::RS512),
        rsa_key(2, "ps256", Algorithm::PS256),
        rsa_key(2, "ps384", Algorithm::PS384),
        rsa_key(2, "ps512", Algorithm::PS512),
        ec_key("es256", Algorithm::ES256),
        ec_key("es384", Algorithm::ES384),
        ed_key("eddsa"),
    ];
    let refs: Vec<&TestKey> = keys.iter().collect();
    let e = engine(&(ra(&[ra_rule(ISS, &jwks(&refs), "")]) + REQUIRE_JWT));
    for k in &keys {
        let t = sign(k, &claims(ISS, "alice"));
        let d = req("/").jwt(&t).eval(&e);
        assert_eq!(d.status, 200, "{:?}: {}", k.alg, d.reason);
        assert_eq!(
            d.request_principal.as_deref(),
            Some("https://issuer.example.com/alice")
        );
    }
    // A signature from another key with the same kid fails.
    let other = rsa_key(2, "rs256", Algorithm::RS256);
    let d = req("/").jwt(&sign(&other, &claims(ISS, "alice"))).eval(&e);
    assert_eq!(
        (d.status, d.reason.as_ref()),
        (401, "Jwt verification fails")
    );
    let www = d.www_authenticate.unwrap();
    assert!(
        www.starts_with("Bearer realm=\"http://svc.example.com/\"")
            && www.contains("invalid_token"),
        "{www}"
    );
    // Unknown kid.
    let mut k = ec_key("unknown-kid", Algorithm::ES256);
    k.jwk["kid"] = json!("nope");
    let d = req("/").jwt(&sign(&k, &claims(ISS, "alice"))).eval(&e);
    assert_eq!(d.status, 401);
}

#[test]
fn alg_none_and_confusion_are_refused() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let e = engine(&(ra(&[ra_rule(ISS, &jwks(&[&key]), "")]) + REQUIRE_JWT));
    let h = b64u(br#"{"alg":"none","typ":"JWT"}"#);
    let p = b64u(claims(ISS, "alice").to_string().as_bytes());
    for t in [format!("{h}.{p}."), format!("{h}.{p}.c2ln")] {
        let d = req("/").jwt(&t).eval(&e);
        assert_eq!(d.status, 401);
        assert!(d.reason.contains("alg none"), "{}", d.reason);
    }
    // HS256 signed with the RSA public key material as HMAC secret.
    let mut hdr = Header::new(Algorithm::HS256);
    hdr.kid = Some("k".into());
    let t = jsonwebtoken::encode(
        &hdr,
        &claims(ISS, "alice"),
        &EncodingKey::from_secret(RSA1_N.as_bytes()),
    )
    .unwrap();
    let d = req("/").jwt(&t).eval(&e);
    assert_eq!(d.status, 401);
    // jsonwebtoken itself: alg none does not parse, HS256 against an RSA key is refused.
    assert!(jsonwebtoken::decode_header(&format!("{h}.{p}.")).is_err());
    let rsa_pub = DecodingKey::from_rsa_components(RSA1_N, "AQAB").unwrap();
    let mut v = Validation::new(Algorithm::HS256);
    v.required_spec_claims.clear();
    let err = jsonwebtoken::decode::<serde_json::Value>(&t, &rsa_pub, &v).unwrap_err();
    assert_eq!(
        *err.kind(),
        jsonwebtoken::errors::ErrorKind::InvalidAlgorithm
    );
    // RS256 token claimed as ES256 with an EC kid: family mismatch, never verified.
    let ek = ec_key("ec", Algorithm::ES256);
    let e2 = engine(&(ra(&[ra_rule(ISS, &jwks(&[&ek]), "")]) + REQUIRE_JWT));
    let t = sign(&rsa_key(1, "ec", Algorithm::RS256), &claims(ISS, "alice"));
    assert_eq!(req("/").jwt(&t).status(&e2), 401);
}

#[test]
fn time_issuer_audience_and_format() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let e = engine(&ra(&[ra_rule(
        ISS,
        &jwks(&[&key]),
        "    audiences: [api, web]\n",
    )]));
    let mk = |c: serde_json::Value| sign(&key, &c);
    let n = now();
    let base = json!({"iss": ISS, "sub": "s", "aud": "api"});
    let with = |k: &str, v: serde_json::Value| {
        let mut c = base.clone();
        c[k] = v;
        c
    };
    let d = req("/").jwt(&mk(with("exp", json!(n - 120)))).eval(&e);
    assert_eq!((d.status, d.reason.as_ref()), (401, "Jwt is expired"));
    assert_eq!(
        req("/").jwt(&mk(with("exp", json!(n - 30)))).status(&e),
        200,
        "within 60s clock skew"
    );
    let d = req("/").jwt(&mk(with("nbf", json!(n + 600)))).eval(&e);
    assert_eq!((d.status, d.reason.as_ref()), (401, "Jwt not yet valid"));
    assert_eq!(
        req("/").jwt(&mk(with("nbf", json!(n + 30)))).status(&e),
        200
    );
    assert_eq!(
        req("/").jwt(&mk(base.clone())).status(&e),
        200,
        "no exp: no expiry check"
    );
    let d = req("/").jwt(&mk(with("aud", json!(["other"])))).eval(&e);
    assert_eq!(
        (d.status, d.reason.as_ref()),
        (403, "Audiences in Jwt are not allowed")
    );
    assert_eq!(
        req("/")
            .jwt(&mk(with("aud", json!(["x", "web"]))))
            .status(&e),
        200
    );
    let d = req("/")
        .jwt(&mk(with("iss", json!("https://evil"))))
        .eval(&e);
    assert_eq!(
        (d.status, d.reason.as_ref()),
        (401, "Jwt issuer is not configured")
    );
    for bad in ["abc", "a.b", "a.b.c.d", "!!.!!.!!", &"x".repeat(20_000)] {
        assert_eq!(req("/").jwt(bad).status(&e), 401, "{bad:.20}");
    }
    assert_eq!(
        req("/").jwt(&mk(with("exp", json!("soon")))).status(&e),
        401
    );
}

#[test]
fn no_token_passes_without_principal() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let e = engine(&ra(&[ra_rule(ISS, &jwks(&[&key]), "")]));
    let d = req("/").eval(&e);
    assert_eq!((d.status, d.request_principal), (200, None));
    // A token in a header nobody configured is ignored.
    let t = sign(&key, &claims("https://evil", "x"));
    assert_eq!(req("/").header("x-other", &t).status(&e), 200);
    // Without any RequestAuthentication a token is not even looked at.
    let e = engine("");
    let d = req("/").jwt("garbage").eval(&e);
    assert_eq!((d.status, d.request_principal), (200, None));
}

#[test]
fn token_locations() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let extra = "    fromHeaders: [{name: x-jwt-assertion}, {name: x-auth, prefix: \"Token \"}]\n    fromParams: [tok]\n    fromCookies: [session]\n";
    let e = engine(&(ra(&[ra_rule(ISS, &jwks(&[&key]), extra)]) + REQUIRE_JWT));
    let t = sign(&key, &claims(ISS, "alice"));
    assert_eq!(req("/").header("x-jwt-assertion", &t).status(&e), 200);
    assert_eq!(
        req("/").header("x-auth", &format!("Token {t}")).status(&e),
        200
    );
    assert_eq!(
        req("/").header("x-auth", &format!("token {t}")).status(&e),
        403,
        "prefix is case-sensitive: header skipped"
    );
    assert_eq!(req(&format!("/p?a=1&tok={t}")).status(&e), 200);
    assert_eq!(
        req("/")
            .header("cookie", &format!("a=b; session={t}"))
            .status(&e),
        200
    );
    assert_eq!(
        req("/").jwt(&t).status(&e),
        403,
        "defaults do not apply when locations are configured"
    );
    // Defaults: Authorization Bearer and access_token.
    let e = engine(&(ra(&[ra_rule(ISS, &jwks(&[&key]), "")]) + REQUIRE_JWT));
    assert_eq!(req("/").jwt(&t).status(&e), 200);
    assert_eq!(req(&format!("/?access_token={t}")).status(&e), 200);
    // Two tokens, one invalid: refused.
    assert_eq!(
        req(&format!("/?access_token={t}"))
            .jwt("bad.token.here")
            .status(&e),
        401
    );
}

#[test]
fn multiple_rules_compose_like_istio() {
    let k1 = rsa_key(1, "k1", Algorithm::RS256);
    let k2 = ec_key("k2", Algorithm::ES256);
    let y = ra(&[
        ra_rule("iss1", &jwks(&[&k1]), ""),
        ra_rule("iss2", &jwks(&[&k2]), "    audiences: [bar]\n"),
        ra_rule("iss2", &jwks(&[&k2]), ""),
    ]);
    let e = engine(&y);
    let d = req("/").jwt(&sign(&k1, &claims("iss1", "a"))).eval(&e);
    assert_eq!(
        (d.status, d.request_principal.as_deref()),
        (200, Some("iss1/a"))
    );
    // iss2 without aud: rejected by the rule with audiences, accepted by the other.
    assert_eq!(
        req("/").jwt(&sign(&k2, &claims("iss2", "b"))).status(&e),
        200
    );
    // iss1 claimed but signed with k2: refused.
    assert_eq!(
        req("/").jwt(&sign(&k2, &claims("iss1", "b"))).status(&e),
        401
    );
    assert_eq!(
        req("/").jwt(&sign(&k1, &claims("iss3", "b"))).status(&e),
        401
    );
}

#[test]
fn outputs_and_forwarding() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let extra = "    outputPayloadToHeader: x-jwt-payload\n    outputClaimToHeaders: [{header: x-sub, claim: sub}, {header: x-team, claim: org.team}, {header: x-admin, claim: admin}, {header: x-missing, claim: nope}]\n";
    let e = engine(&ra(&[ra_rule(ISS, &jwks(&[&key]), extra)]));
    let mut c = claims(ISS, "alice");
    c["org"] = json!({"team": "core"});
    c["admin"] = json!(true);
    let t = sign(&key, &c);
    let (d, h) = req("/")
        .jwt(&t)
        .header("x-missing", "spoofed")
        .eval_full(&e);
    assert_eq!(d.status, 200);
    assert!(
        h.get("authorization").is_none(),
        "forwardOriginalToken defaults to false"
    );
    assert_eq!(h["x-sub"], "alice");
    assert_eq!(h["x-team"], "core");
    assert_eq!(h["x-admin"], "true");
    assert!(h.get("x-missing").is_none());
    assert_eq!(h["x-jwt-payload"], t.split('.').nth(1).unwrap());
    let e = engine(&ra(&[ra_rule(
        ISS,
        &jwks(&[&key]),
        "    forwardOriginalToken: true\n",
    )]));
    let (_, h) = req("/").jwt(&t).eval_full(&e);
    assert!(h.get("authorization").is_some());
}

#[test]
fn verified_tokens_are_cached_and_bounded() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let cfg = moat_authz::AuthzConfig {
        jwt_cache_size: 32,
        ..Default::default()
    };
    let e = engine_cfg(&ra(&[ra_rule(ISS, &jwks(&[&key]), "")]), cfg);
    let t = sign(&key, &claims(ISS, "alice"));
    assert_eq!(e.cached_tokens(), 0);
    assert_eq!(req("/").jwt(&t).status(&e), 200);
    assert_eq!(e.cached_tokens(), 1);
    assert_eq!(req("/").jwt(&t).status(&e), 200);
    assert_eq!(e.cached_tokens(), 1, "a repeated token is a cache hit");
    for i in 0..200 {
        let t = sign(&key, &claims(ISS, &format!("user{i}")));
        assert_eq!(req("/").jwt(&t).status(&e), 200);
    }
    assert!(e.cached_tokens() <= 32, "{}", e.cached_tokens());
    // Cache disabled.
    let cfg = moat_authz::AuthzConfig {
        jwt_cache_size: 0,
        ..Default::default()
    };
    let e = engine_cfg(&ra(&[ra_rule(ISS, &jwks(&[&key]), "")]), cfg);
    assert_eq!(req("/").jwt(&t).status(&e), 200);
    assert_eq!(e.cached_tokens(), 0);
}

#[test]
fn cache_respects_expiry() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let p = moat_authz::jwt::Provider {
        policy: "foo/jwt".into(),
        rule: 0,
        id: 7,
        issuer: ISS.into(),
        audiences: vec![],
        locations: moat_authz::jwt::default_locations(),
        keys: std::sync::Arc::new(moat_authz::jwt::KeySource::new(
            moat_authz::jwt::JwksOrigin::Inline,
            moat_authz::jwt::KeySet::parse(&jwks(&[&key])).unwrap(),
            std::time::Duration::from_secs(5),
            true,
            std::sync::Arc::new(moat_authz::NoFetch),
        )),
        output_payload_to_header: None,
        output_claims: vec![],
        forward: false,
        space_delimited: vec![],
    };
    let cache = moat_authz::jwt::TokenCache::new(10);
    let mut c = claims(ISS, "a");
    c["exp"] = json!(now() + 100);
    let t = sign(&key, &c);
    let n = now();
    assert!(moat_authz::jwt::verify_cached(&t, &p, &cache, n, 0).is_ok());
    assert!(cache.get(7, &t, n, 0).is_some());
    assert!(
        cache.get(7, &t, n + 1000, 0).is_none(),
        "expired entry is not served"
    );
    assert!(cache.get(8, &t, n, 0).is_none(), "keyed by provider");
    assert_eq!(
        moat_authz::jwt::verify_cached(&t, &p, &cache, n + 1000, 0).unwrap_err(),
        moat_authz::jwt::JwtError::Expired
    );
}

#[test]
fn cors_preflight_bypasses_jwt() {
    let key = rsa_key(1, "k", Algorithm::RS256);
    let e = engine(&ra(&[ra_rule(ISS, &jwks(&[&key]), "")]));
    let mut c = claims(ISS, "alice");
    c["exp"] = json!(now() - 3600);
    let expired = sign(&key, &c);
    let pre = req("/")
        .method("OPTIONS")
        .jwt(&expired)
        .header("origin", "https://app")
        .header("access-control-request-method", "GET");
    assert_eq!(pre.status(&e), 200);
    let no_origin = req("/")
        .method("OPTIONS")
        .jwt(&expired)
        .header("access-control-request-method", "GET");
    assert_eq!(no_origin.status(&e), 401);
}
