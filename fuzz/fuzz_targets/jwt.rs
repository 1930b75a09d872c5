//! JWT parsing and verification (`moat_authz::jwt::verify`) on tokens that are
//! arbitrary text, and on tokens signed with the provider's Ed25519 key around a
//! fuzzer-chosen header and payload, held against `jsonwebtoken`'s own reading of the
//! same token (its segment split, base64url and JSON decoding, signature check):
//!
//! * a token moat accepts, `jsonwebtoken` accepts with the same claims, and moat's
//!   `iss` and `sub` are the payload's;
//! * a token `jsonwebtoken` accepts under the provider's key, whose payload is a JSON
//!   object with the provider's issuer and no time claims, moat accepts;
//! * not three segments, over `MAX_TOKEN_LEN` bytes, or `alg: none`: refused as such;
//! * a JWKS document (as fetched from a `jwksUri`) is accepted exactly when
//!   `serde_json` reads it as an object with a `keys` array, keeps at most
//!   `MAX_JWKS_KEYS` keys, and never more than the array holds.
#![no_main]
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use libfuzzer_sys::fuzz_target;
use moat_authz::fetch::NoFetch;
use moat_authz::jwt::{
    verify, JwksOrigin, JwtError, KeySet, KeySource, Provider, MAX_JWKS_KEYS, MAX_TOKEN_LEN,
};
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::Value;

const ISSUER: &str = "https://issuer.fuzz";
const NOW: i64 = 1_800_000_000;

struct Fixture {
    pair: Ed25519KeyPair,
    provider: Provider,
    key: DecodingKey,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let pair = Ed25519KeyPair::from_seed_unchecked(&[7; 32]).expect("seed");
        let x = URL_SAFE_NO_PAD.encode(pair.public_key().as_ref());
        let jwks = format!(
            r#"{{"keys":[{{"kty":"OKP","crv":"Ed25519","x":"{x}","kid":"k1","use":"sig"}}]}}"#
        );
        let keys = KeySet::parse(&jwks).expect("jwks");
        assert_eq!(keys.len(), 1);
        let source = KeySource::new(
            JwksOrigin::Inline,
            keys,
            Duration::from_secs(1),
            true,
            Arc::new(NoFetch),
        );
        let provider = Provider {
            policy: "fuzz/jwt".into(),
            rule: 0,
            id: 0,
            issuer: ISSUER.into(),
            audiences: Vec::new(),
            locations: moat_authz::jwt::default_locations(),
            keys: Arc::new(source),
            output_payload_to_header: None,
            output_claims: Vec::new(),
            forward: false,
            space_delimited: vec!["scope".into()],
        };
        let key = DecodingKey::from_ed_components(&x).expect("key");
        Fixture {
            pair,
            provider,
            key,
        }
    })
}

/// `header.payload.signature`, signed with the provider's key.
fn sign(f: &Fixture, header: &[u8], payload: &[u8]) -> String {
    let mut token = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let sig = f.pair.sign(token.as_bytes());
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(sig.as_ref()));
    token
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 4 == 3 {
        let text = String::from_utf8_lossy(rest);
        let keys = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("keys").and_then(Value::as_array).map(Vec::len));
        match KeySet::parse(&text) {
            Ok(set) => {
                let n = keys.expect("accepted a JWKS without a keys array");
                assert!(set.len() <= n.min(MAX_JWKS_KEYS));
            }
            Err(e) => assert!(keys.is_none(), "refused a JWKS with a keys array: {e}"),
        }
        return;
    }
    // The header and payload signed, when the fuzzer chose them.
    let segments: Option<(&[u8], &[u8])> = match mode % 4 {
        0 => None,
        1 => Some((br#"{"alg":"EdDSA","typ":"JWT"}"#, rest)),
        _ => {
            // 2: header, then payload after the first NUL.
            let at = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            Some((&rest[..at], rest.get(at + 1..).unwrap_or_default()))
        }
    };
    let token = match segments {
        None => String::from_utf8_lossy(rest).into_owned(),
        Some((h, p)) => sign(f, h, p),
    };
    let ours = verify(&token, &f.provider, NOW, 0);

    if token.len() > MAX_TOKEN_LEN || token.split('.').count() != 3 {
        assert_eq!(ours.as_ref().err(), Some(&JwtError::BadFormat));
        return;
    }
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    let theirs = jsonwebtoken::decode::<Value>(&token, &f.key, &validation);
    let header = jsonwebtoken::decode_header(&token);

    match &ours {
        Ok(v) => {
            let t = theirs.unwrap_or_else(|e| panic!("moat accepted, jsonwebtoken: {e}"));
            assert_eq!(*v.claims, t.claims);
            assert_eq!(v.iss, ISSUER);
            assert_eq!(
                v.sub,
                t.claims.get("sub").and_then(Value::as_str).unwrap_or("")
            );
        }
        Err(e) => {
            if let (Ok(t), Ok(h)) = (&theirs, &header) {
                let plain = t.claims.is_object()
                    && t.claims.get("iss").and_then(Value::as_str) == Some(ISSUER)
                    && t.claims.get("exp").is_none_or(Value::is_null)
                    && t.claims.get("nbf").is_none_or(Value::is_null)
                    && h.kid.as_deref().is_none_or(|k| k == "k1");
                assert!(!plain, "jsonwebtoken accepted, moat: {e:?}: {token}");
            }
        }
    }
    // `alg: none` in a well-formed token is refused as such (in any case).
    if let Some((h, p)) = segments {
        let object = |b: &[u8]| serde_json::from_slice::<Value>(b).is_ok_and(|v| v.is_object());
        let none = serde_json::from_slice::<Value>(h).is_ok_and(|v| {
            v.get("alg")
                .and_then(Value::as_str)
                .is_some_and(|a| a.eq_ignore_ascii_case("none"))
        });
        if none && object(h) && object(p) && token.len() <= MAX_TOKEN_LEN {
            assert_eq!(ours.as_ref().err(), Some(&JwtError::AlgNone));
        }
    }
});
