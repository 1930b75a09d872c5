//! RequestAuthentication: JWKS, token extraction, verification, the verified-token cache
//! and Istio's composition of several JWT rules.

use std::hash::{BuildHasher, Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use base64::Engine as _;
use foldhash::fast::RandomState;
use http::{HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use serde_json::Value;

use crate::fetch::{JwksFetcher, MAX_DOCUMENT_BYTES};

/// Maximum accepted token length (longer tokens are rejected as malformed).
pub const MAX_TOKEN_LEN: usize = 16 * 1024;
/// Maximum number of keys kept from one JWKS document.
pub const MAX_JWKS_KEYS: usize = 64;

/// A token that passed verification.
#[derive(Debug, Clone)]
pub struct VerifiedJwt {
    /// `iss`.
    pub iss: String,
    /// `sub` (empty when absent).
    pub sub: String,
    /// `aud` as a list.
    pub audiences: Vec<String>,
    /// `azp`.
    pub presenter: Option<String>,
    /// The payload as received.
    pub claims: Arc<Value>,
    /// The payload with space-delimited claims (`scope`, `permission`, configured extras)
    /// split into lists: what `request.auth.claims[..]` conditions match.
    pub claims_for_match: Arc<Value>,
    /// `exp`, seconds since the epoch.
    pub exp: Option<i64>,
    /// `nbf`, seconds since the epoch.
    pub nbf: Option<i64>,
    /// The base64url payload segment (for `outputPayloadToHeader`).
    pub payload_b64: String,
}

impl VerifiedJwt {
    /// Istio's request principal `iss/sub`.
    pub fn principal(&self) -> String {
        format!("{}/{}", self.iss, self.sub)
    }
}

/// Why a token was refused; the texts are Envoy's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtError {
    /// Not three base64url sections with JSON header and payload.
    BadFormat,
    /// `alg` is `none`.
    AlgNone,
    /// `alg` missing or not supported.
    BadAlg,
    /// `iss` is not the provider's issuer.
    UnknownIssuer,
    /// `exp` is past (beyond the clock skew).
    Expired,
    /// `nbf` is in the future (beyond the clock skew).
    NotYetValid,
    /// `aud` not among the configured audiences (403).
    AudienceNotAllowed,
    /// No key of the JWKS fits `kid`/`alg`.
    KidAlgMismatch,
    /// The JWKS could not be fetched.
    JwksFetchFail,
    /// The signature does not verify.
    VerificationFail,
}

impl JwtError {
    /// Envoy's message for this status.
    pub fn message(&self) -> &'static str {
        match self {
            JwtError::BadFormat => {
                "Jwt is not in the form of Header.Payload.Signature with two dots and 3 sections"
            }
            JwtError::AlgNone => "Jwt header [alg] field is not valid: alg none is refused",
            JwtError::BadAlg => "Jwt header [alg] field is not valid",
            JwtError::UnknownIssuer => "Jwt issuer is not configured",
            JwtError::Expired => "Jwt is expired",
            JwtError::NotYetValid => "Jwt not yet valid",
            JwtError::AudienceNotAllowed => "Audiences in Jwt are not allowed",
            JwtError::KidAlgMismatch => "Jwks doesn't have key to match kid or alg from Jwt",
            JwtError::JwksFetchFail => "Jwks remote fetch is failed",
            JwtError::VerificationFail => "Jwt verification fails",
        }
    }

    /// HTTP status: 403 for a disallowed audience, 401 otherwise.
    pub fn status(&self) -> u16 {
        if *self == JwtError::AudienceNotAllowed {
            403
        } else {
            401
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Rsa,
    P256,
    P384,
    Ed25519,
}

fn family_of(alg: Algorithm) -> Option<Family> {
    Some(match alg {
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => Family::Rsa,
        Algorithm::ES256 => Family::P256,
        Algorithm::ES384 => Family::P384,
        Algorithm::EdDSA => Family::Ed25519,
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512 => return None,
    })
}

/// One public key of a JWKS.
#[derive(Clone)]
pub struct Key {
    kid: Option<String>,
    alg: Option<String>,
    family: Family,
    key: DecodingKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .field("family", &self.family)
            .finish()
    }
}

/// The usable public keys of a JWKS document.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    /// Keys (RSA, EC P-256/P-384, Ed25519; symmetric and unknown keys are skipped).
    pub keys: Vec<Key>,
}

impl KeySet {
    /// Parses a JWKS document (`{"keys": [...]}`). Keys of unsupported types are skipped;
    /// a document that is not JSON or has no `keys` array is an error.
    pub fn parse(text: &str) -> Result<KeySet, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("JWKS is not JSON: {e}"))?;
        let keys = v
            .get("keys")
            .and_then(|k| k.as_array())
            .ok_or_else(|| "JWKS has no `keys` array".to_string())?;
        let mut out = Vec::new();
        for k in keys.iter().take(MAX_JWKS_KEYS) {
            if let Some(key) = parse_jwk(k) {
                out.push(key);
            }
        }
        Ok(KeySet { keys: out })
    }

    /// Number of usable keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is usable.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Key ids, for diagnostics and tests.
    pub fn kids(&self) -> Vec<String> {
        self.keys.iter().filter_map(|k| k.kid.clone()).collect()
    }
}

fn parse_jwk(k: &Value) -> Option<Key> {
    let s = |name: &str| k.get(name).and_then(|v| v.as_str());
    if let Some(u) = s("use") {
        if u != "sig" {
            return None;
        }
    }
    let (family, key) = match s("kty")? {
        "RSA" => (
            Family::Rsa,
            DecodingKey::from_rsa_components(s("n")?, s("e")?).ok()?,
        ),
        "EC" => {
            let fam = match s("crv")? {
                "P-256" => Family::P256,
                "P-384" => Family::P384,
                _ => return None,
            };
            (fam, DecodingKey::from_ec_components(s("x")?, s("y")?).ok()?)
        }
        "OKP" => {
            if s("crv")? != "Ed25519" {
                return None;
            }
            (
                Family::Ed25519,
                DecodingKey::from_ed_components(s("x")?).ok()?,
            )
        }
        _ => return None,
    };
    Some(Key {
        kid: s("kid").map(str::to_string),
        alg: s("alg").map(str::to_string),
        family,
        key,
    })
}

/// Where a JWKS comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum JwksOrigin {
    /// `jwks:` inline.
    Inline,
    /// `jwksUri: file:///path` (or a relative `file:` path, resolved against the policy file).
    File(PathBuf),
    /// `jwksUri: http(s)://...`.
    Uri(String),
    /// No `jwks`/`jwksUri`: OpenID discovery at `<issuer>/.well-known/openid-configuration`.
    Discovery(String),
}

/// A JWKS shared by every rule that names the same origin; refreshed in the background.
pub struct KeySource {
    /// Where the keys come from.
    pub origin: JwksOrigin,
    /// Current keys (kept when a refresh fails).
    pub keys: ArcSwap<KeySet>,
    /// Fetch timeout.
    pub timeout: Duration,
    /// Whether a fetch ever succeeded (inline sets are born loaded).
    pub loaded: AtomicBool,
    /// Last fetch error, if the last fetch failed.
    pub last_error: Mutex<Option<String>>,
    /// Fetches `Uri` and `Discovery` origins (never called for inline and `file:` keys).
    fetcher: Arc<dyn JwksFetcher>,
}

impl std::fmt::Debug for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeySource")
            .field("origin", &self.origin)
            .field("keys", &self.keys.load().kids())
            .field("timeout", &self.timeout)
            .field("loaded", &self.loaded.load(Ordering::Acquire))
            .field("last_error", &*self.last_error.lock())
            .finish_non_exhaustive()
    }
}

impl KeySource {
    /// A key source with the given initial keys; `fetcher` fetches `Uri` and `Discovery`
    /// origins (pass [`NoFetch`](crate::fetch::NoFetch) for inline or `file:` keys).
    pub fn new(
        origin: JwksOrigin,
        keys: KeySet,
        timeout: Duration,
        loaded: bool,
        fetcher: Arc<dyn JwksFetcher>,
    ) -> Self {
        KeySource {
            origin,
            keys: ArcSwap::from_pointee(keys),
            timeout,
            loaded: AtomicBool::new(loaded),
            last_error: Mutex::new(None),
            fetcher,
        }
    }

    /// Whether this source is fetched (file, URI, discovery) rather than inline.
    pub fn is_remote(&self) -> bool {
        !matches!(self.origin, JwksOrigin::Inline)
    }

    /// Fetches the keys once (blocking); on failure the current keys are kept and the
    /// error recorded. Returns whether new keys were installed.
    pub fn refresh_blocking(&self) -> Result<usize, String> {
        let result = match &self.origin {
            JwksOrigin::Inline => return Ok(self.keys.load().len()),
            JwksOrigin::File(p) => std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read JWKS file {}: {e}", p.display())),
            JwksOrigin::Uri(u) => fetch_document(self.fetcher.as_ref(), u, self.timeout),
            JwksOrigin::Discovery(iss) => discover(self.fetcher.as_ref(), iss, self.timeout),
        }
        .and_then(|text| KeySet::parse(&text));
        match result {
            Ok(set) if !set.is_empty() => {
                let n = set.len();
                self.keys.store(Arc::new(set));
                self.loaded.store(true, Ordering::Release);
                *self.last_error.lock() = None;
                Ok(n)
            }
            Ok(_) => {
                let e = "JWKS has no usable key".to_string();
                *self.last_error.lock() = Some(e.clone());
                Err(e)
            }
            Err(e) => {
                *self.last_error.lock() = Some(e.clone());
                Err(e)
            }
        }
    }
}

/// One fetch through `fetcher`, holding it to [`MAX_DOCUMENT_BYTES`].
fn fetch_document(
    fetcher: &dyn JwksFetcher,
    url: &str,
    timeout: Duration,
) -> Result<String, String> {
    let text = fetcher.fetch(url, timeout)?;
    if text.len() > MAX_DOCUMENT_BYTES {
        return Err(format!(
            "GET {url}: document of {} bytes exceeds the {MAX_DOCUMENT_BYTES}-byte limit",
            text.len()
        ));
    }
    Ok(text)
}

/// OpenID discovery: the issuer's configuration document, then its `jwks_uri`.
fn discover(fetcher: &dyn JwksFetcher, issuer: &str, timeout: Duration) -> Result<String, String> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let doc = fetch_document(fetcher, &url, timeout)?;
    let v: Value = serde_json::from_str(&doc).map_err(|e| format!("discovery document: {e}"))?;
    let uri = v
        .get("jwks_uri")
        .and_then(|u| u.as_str())
        .ok_or_else(|| "discovery document has no jwks_uri".to_string())?;
    fetch_document(fetcher, uri, timeout)
}

/// Where a token is looked for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Location {
    /// A header whose value starts with `prefix` (stripped).
    Header {
        /// Header name.
        name: HeaderName,
        /// Required value prefix, e.g. `Bearer `.
        prefix: String,
    },
    /// A query parameter.
    Param(String),
    /// A cookie.
    Cookie(String),
}

/// One JWT rule of a RequestAuthentication (an Envoy provider).
#[derive(Debug)]
pub struct Provider {
    /// `namespace/name` of the RequestAuthentication.
    pub policy: String,
    /// Rule index within it.
    pub rule: usize,
    /// Unique id within the engine (cache key).
    pub id: u32,
    /// `issuer`.
    pub issuer: String,
    /// `audiences` (empty: no check).
    pub audiences: Vec<String>,
    /// Token locations (defaults applied).
    pub locations: Vec<Location>,
    /// The keys.
    pub keys: Arc<KeySource>,
    /// `outputPayloadToHeader`.
    pub output_payload_to_header: Option<HeaderName>,
    /// `outputClaimToHeaders`: header and claim path (`a.b.c`).
    pub output_claims: Vec<(HeaderName, Vec<String>)>,
    /// `forwardOriginalToken`.
    pub forward: bool,
    /// Claims split on whitespace (`scope`, `permission` and `spaceDelimitedClaims`).
    pub space_delimited: Vec<String>,
}

/// Default locations: `Authorization: Bearer <t>` and `?access_token=`.
pub fn default_locations() -> Vec<Location> {
    vec![
        Location::Header {
            name: http::header::AUTHORIZATION,
            prefix: "Bearer ".into(),
        },
        Location::Param("access_token".into()),
    ]
}

/// Whether any configured location could hold a token (cheap pre-check, no allocation).
pub fn any_token(providers: &[Arc<Provider>], headers: &HeaderMap, query: Option<&str>) -> bool {
    providers.iter().any(|p| {
        p.locations.iter().any(|l| match l {
            Location::Header { name, .. } => headers.contains_key(name),
            Location::Param(name) => query.is_some_and(|q| q.contains(name.as_str())),
            Location::Cookie(_) => headers.contains_key(http::header::COOKIE),
        })
    })
}

/// Tokens found at one location.
pub fn extract(loc: &Location, headers: &HeaderMap, query: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    match loc {
        Location::Header { name, prefix } => {
            for v in headers.get_all(name) {
                let Ok(s) = std::str::from_utf8(v.as_bytes()) else {
                    continue;
                };
                if let Some(rest) = s.strip_prefix(prefix.as_str()) {
                    let t = rest.trim();
                    if !t.is_empty() {
                        out.push(t.to_string());
                    }
                }
            }
        }
        Location::Param(p) => {
            if let Some(q) = query {
                for pair in q.split('&') {
                    let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                    if crate::percent::decode_all(k) == *p && !v.is_empty() {
                        out.push(crate::percent::decode_all(v));
                    }
                }
            }
        }
        Location::Cookie(c) => {
            for v in headers.get_all(http::header::COOKIE) {
                let Ok(s) = std::str::from_utf8(v.as_bytes()) else {
                    continue;
                };
                for kv in s.split(';') {
                    if let Some((k, val)) = kv.trim().split_once('=') {
                        if k.trim() == c && !val.trim().is_empty() {
                            out.push(val.trim().trim_matches('"').to_string());
                        }
                    }
                }
            }
        }
    }
    out
}

fn b64(s: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .ok()
}

/// Verifies `token` against one provider (Envoy's order: format, issuer, time, audience,
/// key, signature).
/// A token split and decoded, before any provider-specific check.
struct ParsedToken<'a> {
    /// The second (payload) segment, still base64url.
    payload_b64: &'a str,
    header: Value,
    payload: Value,
    alg: Algorithm,
    family: Family,
}

impl ParsedToken<'_> {
    fn issuer(&self) -> &str {
        self.payload
            .get("iss")
            .and_then(|v| v.as_str())
            .unwrap_or("")
    }
}

/// The provider-independent part of [`verify`]: size, shape, JSON, `alg`.
fn parse_token(token: &str) -> Result<ParsedToken<'_>, JwtError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(JwtError::BadFormat);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(pl), Some(_sig), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(JwtError::BadFormat);
    };
    let header: Value = b64(h)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|v: &Value| v.is_object())
        .ok_or(JwtError::BadFormat)?;
    let payload: Value = b64(pl)
        .and_then(|b| serde_json::from_slice(&b).ok())
        .filter(|v: &Value| v.is_object())
        .ok_or(JwtError::BadFormat)?;
    let alg_name = header
        .get("alg")
        .and_then(|a| a.as_str())
        .ok_or(JwtError::BadAlg)?;
    if alg_name.eq_ignore_ascii_case("none") {
        return Err(JwtError::AlgNone);
    }
    let alg: Algorithm = alg_name.parse().map_err(|_| JwtError::BadAlg)?;
    let family = family_of(alg).ok_or(JwtError::BadAlg)?;
    Ok(ParsedToken {
        payload_b64: pl,
        header,
        payload,
        alg,
        family,
    })
}

/// Verifies a token against one provider.
pub fn verify(token: &str, p: &Provider, now: i64, skew: i64) -> Result<VerifiedJwt, JwtError> {
    let parsed = parse_token(token)?;
    if parsed.issuer() != p.issuer {
        return Err(JwtError::UnknownIssuer);
    }
    let ParsedToken {
        payload_b64: pl,
        header,
        payload,
        alg,
        family,
    } = parsed;
    let alg_name = header.get("alg").and_then(|a| a.as_str()).unwrap_or("");
    let iss = payload.get("iss").and_then(|v| v.as_str()).unwrap_or("");
    let num = |name: &str| -> Result<Option<i64>, JwtError> {
        match payload.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map(Some)
                .ok_or(JwtError::BadFormat),
            Some(_) => Err(JwtError::BadFormat),
        }
    };
    let exp = num("exp")?;
    let nbf = num("nbf")?;
    if let Some(exp) = exp {
        if now > exp.saturating_add(skew) {
            return Err(JwtError::Expired);
        }
    }
    if let Some(nbf) = nbf {
        if now.saturating_add(skew) < nbf {
            return Err(JwtError::NotYetValid);
        }
    }
    let audiences: Vec<String> = match payload.get("aud") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(String::from))
            .collect(),
        _ => Vec::new(),
    };
    if !p.audiences.is_empty() && !audiences.iter().any(|a| p.audiences.contains(a)) {
        return Err(JwtError::AudienceNotAllowed);
    }
    let keys = p.keys.keys.load();
    if keys.is_empty() {
        return Err(if p.keys.is_remote() {
            JwtError::JwksFetchFail
        } else {
            JwtError::KidAlgMismatch
        });
    }
    let kid = header.get("kid").and_then(|k| k.as_str());
    let mut validation = Validation::new(alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    let mut candidates = 0;
    let mut ok = false;
    for k in keys.keys.iter() {
        if k.family != family
            || k.alg.as_deref().is_some_and(|a| a != alg_name)
            || kid.is_some_and(|kid| k.kid.as_deref() != Some(kid))
        {
            continue;
        }
        candidates += 1;
        if jsonwebtoken::decode::<serde::de::IgnoredAny>(token, &k.key, &validation).is_ok() {
            ok = true;
            break;
        }
    }
    if candidates == 0 {
        return Err(JwtError::KidAlgMismatch);
    }
    if !ok {
        return Err(JwtError::VerificationFail);
    }
    let sub = payload
        .get("sub")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    let presenter = payload
        .get("azp")
        .and_then(|v| v.as_str())
        .map(String::from);
    let mut for_match = payload.clone();
    if let Some(obj) = for_match.as_object_mut() {
        for name in &p.space_delimited {
            if let Some(Value::String(s)) = obj.get(name.as_str()) {
                let items: Vec<Value> = s
                    .split_whitespace()
                    .map(|x| Value::String(x.into()))
                    .collect();
                obj.insert(name.clone(), Value::Array(items));
            }
        }
    }
    Ok(VerifiedJwt {
        iss: iss.to_string(),
        sub,
        audiences,
        presenter,
        claims: Arc::new(payload),
        claims_for_match: Arc::new(for_match),
        exp,
        nbf,
        payload_b64: pl.to_string(),
    })
}

/// A bounded cache of verified tokens: a repeated token costs a hash lookup, not a
/// signature check. Entries are dropped once the token expires; when a shard is full
/// an arbitrary entry is evicted.
#[derive(Debug)]
pub struct TokenCache {
    shards: Vec<Mutex<std::collections::HashMap<u64, CacheEntry, RandomState>>>,
    per_shard: usize,
    hasher: RandomState,
}

#[derive(Debug)]
struct CacheEntry {
    provider: u32,
    token: Box<str>,
    jwt: Arc<VerifiedJwt>,
}

const SHARDS: usize = 16;

impl TokenCache {
    /// A cache holding at most `capacity` tokens (0 disables caching).
    pub fn new(capacity: usize) -> Self {
        TokenCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(std::collections::HashMap::default()))
                .collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::default(),
        }
    }

    fn hash(&self, provider: u32, token: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        provider.hash(&mut h);
        token.hash(&mut h);
        h.finish()
    }

    /// A cached verification still valid at `now`.
    pub fn get(&self, provider: u32, token: &str, now: i64, skew: i64) -> Option<Arc<VerifiedJwt>> {
        if self.per_shard == 0 {
            return None;
        }
        let h = self.hash(provider, token);
        let mut shard = self.shards[(h as usize) % SHARDS].lock();
        let e = shard.get(&h)?;
        if e.provider != provider || &*e.token != token {
            return None;
        }
        let j = &e.jwt;
        if j.exp.is_some_and(|exp| now > exp.saturating_add(skew))
            || j.nbf.is_some_and(|nbf| now.saturating_add(skew) < nbf)
        {
            shard.remove(&h);
            return None;
        }
        Some(j.clone())
    }

    /// Remembers a verified token.
    pub fn put(&self, provider: u32, token: &str, jwt: Arc<VerifiedJwt>) {
        if self.per_shard == 0 {
            return;
        }
        let h = self.hash(provider, token);
        let mut shard = self.shards[(h as usize) % SHARDS].lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&h) {
            if let Some(k) = shard.keys().next().copied() {
                shard.remove(&k);
            }
        }
        shard.insert(
            h,
            CacheEntry {
                provider,
                token: token.into(),
                jwt,
            },
        );
    }

    /// Number of cached tokens.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Outcome of request authentication.
#[derive(Debug, Clone)]
pub enum Authn {
    /// No token at any configured location: no request principal.
    NoToken,
    /// A token verified.
    Verified {
        /// The token.
        jwt: Arc<VerifiedJwt>,
        /// Index (into the providers given) of the provider that verified it.
        provider: usize,
    },
    /// A token was present and refused.
    Failed {
        /// Why.
        error: JwtError,
        /// Provider policy (`ns/name`) whose issuer matched, if any.
        policy: Option<String>,
    },
}

/// Verifies with the cache in front.
pub fn verify_cached(
    token: &str,
    p: &Provider,
    cache: &TokenCache,
    now: i64,
    skew: i64,
) -> Result<Arc<VerifiedJwt>, JwtError> {
    if let Some(j) = cache.get(p.id, token, now, skew) {
        return Ok(j);
    }
    let j = Arc::new(verify(token, p, now, skew)?);
    cache.put(p.id, token, j.clone());
    Ok(j)
}

/// The issuer of each token of one request, parsed once: every provider is offered
/// every token, and most refuse it on the issuer alone, so without this a workload
/// with N JWT rules would decode the same token N times per request.
struct TokenIssuers<'t> {
    seen: Vec<(&'t str, Result<String, JwtError>)>,
}

impl<'t> TokenIssuers<'t> {
    fn new() -> Self {
        TokenIssuers { seen: Vec::new() }
    }

    /// [`verify_cached`] for one of the request's tokens. Until the token has been
    /// parsed in this request, the cache is tried first: a token `p` verified before
    /// has `p`'s issuer, so the common case (one provider, a repeated token) costs one
    /// lookup and no parsing. Once parsed, the issuer check comes first, so N
    /// providers cost N string comparisons, not N cache lookups.
    fn verify(
        &mut self,
        token: &'t str,
        p: &Provider,
        cache: &TokenCache,
        now: i64,
        skew: i64,
    ) -> Result<Arc<VerifiedJwt>, JwtError> {
        if !self.seen.iter().any(|(t, _)| *t == token) {
            if let Some(j) = cache.get(p.id, token, now, skew) {
                return Ok(j);
            }
        }
        self.precheck(token, p)?;
        verify_cached(token, p, cache, now, skew)
    }

    /// What [`verify`] would answer before its provider-specific checks:
    /// `Ok` when the token is well formed and `p` is its issuer's provider.
    fn precheck(&mut self, token: &'t str, p: &Provider) -> Result<(), JwtError> {
        let idx = match self.seen.iter().position(|(t, _)| *t == token) {
            Some(i) => i,
            None => {
                let r = parse_token(token).map(|t| t.issuer().to_string());
                self.seen.push((token, r));
                self.seen.len() - 1
            }
        };
        match &self.seen[idx].1 {
            Err(e) => Err(e.clone()),
            Ok(iss) if *iss != p.issuer => Err(JwtError::UnknownIssuer),
            Ok(_) => Ok(()),
        }
    }
}

/// Istio's composition of the JWT rules that apply to a workload: with providers
/// P1..Pn Envoy requires `any(P1, .., Pn, all(any(Pi, allow_missing)))`, i.e. the
/// request passes when some provider verifies every token at its locations, or when
/// every token present verifies with a provider of its issuer that looks at that
/// location; no token at all passes without a principal.
pub fn authenticate(
    providers: &[Arc<Provider>],
    headers: &HeaderMap,
    query: Option<&str>,
    cache: &TokenCache,
    now: i64,
    skew: i64,
) -> Authn {
    if providers.is_empty() {
        return Authn::NoToken;
    }
    // Tokens per provider.
    let per: Vec<Vec<(usize, String)>> = providers
        .iter()
        .map(|p| {
            let mut v = Vec::new();
            for (li, loc) in p.locations.iter().enumerate() {
                for t in extract(loc, headers, query) {
                    v.push((li, t));
                }
            }
            v
        })
        .collect();
    if per.iter().all(|v| v.is_empty()) {
        return Authn::NoToken;
    }
    let mut first_err: Option<(JwtError, Option<String>)> = None;
    let mut note = |e: JwtError, p: &Provider| {
        let better = match &first_err {
            None => true,
            // Prefer the error of a provider whose issuer matched.
            Some((prev, _)) => *prev == JwtError::UnknownIssuer && e != JwtError::UnknownIssuer,
        };
        if better {
            let pol = (e != JwtError::UnknownIssuer).then(|| p.policy.clone());
            first_err = Some((e, pol));
        }
    };
    let mut issuers = TokenIssuers::new();
    // Branch 1: one provider verifies all its tokens.
    for (i, p) in providers.iter().enumerate() {
        if per[i].is_empty() {
            continue;
        }
        let mut first: Option<Arc<VerifiedJwt>> = None;
        let mut all_ok = true;
        for (_, t) in &per[i] {
            match issuers.verify(t, p, cache, now, skew) {
                Ok(j) => {
                    first.get_or_insert(j);
                }
                Err(e) => {
                    note(e, p);
                    all_ok = false;
                    break;
                }
            }
        }
        if all_ok {
            if let Some(j) = first {
                return Authn::Verified {
                    jwt: j,
                    provider: i,
                };
            }
        }
    }
    // Branch 2 (allow_missing): every token present verifies with some provider that
    // looks at its location.
    let mut result: Option<(Arc<VerifiedJwt>, usize)> = None;
    for (i, toks) in per.iter().enumerate() {
        for (li, t) in toks {
            let loc = &providers[i].locations[*li];
            let mut ok = None;
            for (k, q) in providers.iter().enumerate() {
                if !q.locations.contains(loc) {
                    continue;
                }
                if let Ok(j) = issuers.verify(t, q, cache, now, skew) {
                    ok = Some((j, k));
                    break;
                }
            }
            match ok {
                Some(v) => {
                    result.get_or_insert(v);
                }
                None => {
                    let (e, pol) = first_err.unwrap_or((JwtError::VerificationFail, None));
                    return Authn::Failed {
                        error: e,
                        policy: pol,
                    };
                }
            }
        }
    }
    match result {
        Some((jwt, provider)) => Authn::Verified { jwt, provider },
        None => Authn::NoToken,
    }
}

/// Removes every header the providers write from a verified token
/// (`outputPayloadToHeader`, `outputClaimToHeaders`), so a client cannot send
/// them itself and have them pass as verified claims. (Their spellings with `_` for
/// `-`, which CGI-style backends read as them, are gone before the engines run:
/// [`output_fields`] and `moat_core::fields::CgiTwins`.)
pub fn strip_outputs(providers: &[std::sync::Arc<Provider>], headers: &mut HeaderMap) {
    for h in providers.iter().flat_map(|p| output_fields(p)) {
        headers.remove(h);
    }
}

/// The header fields a provider writes from a verified token.
pub fn output_fields(p: &Provider) -> impl Iterator<Item = &HeaderName> {
    p.output_payload_to_header
        .iter()
        .chain(p.output_claims.iter().map(|(h, _)| h))
}

/// Applies `outputPayloadToHeader`, `outputClaimToHeaders` and `forwardOriginalToken`
/// of the provider that verified the token.
pub fn apply_outputs(p: &Provider, jwt: &VerifiedJwt, headers: &mut HeaderMap) {
    if !p.forward {
        for loc in &p.locations {
            if let Location::Header { name, .. } = loc {
                headers.remove(name);
            }
        }
    }
    if let Some(h) = &p.output_payload_to_header {
        if let Ok(v) = HeaderValue::from_str(&jwt.payload_b64) {
            headers.insert(h.clone(), v);
        }
    }
    for (h, path) in &p.output_claims {
        let mut cur = Some(jwt.claims.as_ref());
        for k in path {
            cur = cur.and_then(|c| c.get(k.as_str()));
        }
        let text = match cur {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(Value::Bool(b)) => Some(b.to_string()),
            _ => None,
        };
        match text.and_then(|t| HeaderValue::from_str(&t).ok()) {
            Some(v) => {
                headers.insert(h.clone(), v);
            }
            None => {
                headers.remove(h);
            }
        }
    }
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
