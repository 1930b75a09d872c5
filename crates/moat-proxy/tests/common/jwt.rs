//! Signing keys and tokens for the access-control tests: an ES256 key generated per test,
//! its public JWK, and tokens signed with it.

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::{json, Value};

/// An ES256 signing key generated for the test, with its public JWK.
pub struct TestKey {
    pub enc: EncodingKey,
    pub jwk: Value,
}

fn b64u(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// A fresh P-256 key whose JWK has `kid`.
pub fn ec_key(kid: &str) -> TestKey {
    let rng = SystemRandom::new();
    let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
    let doc = signature::EcdsaKeyPair::generate_pkcs8(alg, &rng).unwrap();
    let kp = signature::EcdsaKeyPair::from_pkcs8(alg, doc.as_ref(), &rng).unwrap();
    let pk = kp.public_key().as_ref();
    TestKey {
        enc: EncodingKey::from_ec_der(doc.as_ref()),
        jwk: json!({"kty": "EC", "kid": kid, "use": "sig", "crv": "P-256",
                    "x": b64u(&pk[1..33]), "y": b64u(&pk[33..])}),
    }
}

/// The JWKS document publishing `keys`.
pub fn jwks(keys: &[&TestKey]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

/// Signs `claims` with `key`, using `kid` in the header.
pub fn sign_kid(key: &TestKey, kid: &str, claims: &Value) -> String {
    let mut h = Header::new(Algorithm::ES256);
    h.kid = Some(kid.to_string());
    jsonwebtoken::encode(&h, claims, &key.enc).unwrap()
}

/// Signs `claims` with `key` under its own `kid`.
pub fn sign(key: &TestKey, claims: &Value) -> String {
    sign_kid(key, key.jwk["kid"].as_str().unwrap(), claims)
}
