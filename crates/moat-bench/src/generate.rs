//! Generated inputs: Istio policies with N rules of each kind, a signed JWT with
//! its JWKS inline, self-signed certificates, and one moat config per variant.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::scenario::{AuthzGen, Engine, RuleKind, RuleLayout};

/// Issuer of the generated token; the last JWT rule of every generated
/// RequestAuthentication uses it, so every earlier rule is tried first.
pub const TOKEN_ISSUER: &str = "https://issuer.bench.moat.test";

/// Issuer of the `i`-th of `n` generated JWT rules.
pub fn issuer(i: u32, n: u32) -> String {
    if i + 1 == n {
        TOKEN_ISSUER.to_string()
    } else {
        format!("https://issuer-{i}.bench.moat.test")
    }
}

/// Subject of the generated token.
pub const SUBJECT: &str = "bench-user";

/// A signing key with its JWKS and a token signed by it.
#[derive(Debug, Clone)]
pub struct Jwt {
    /// JWKS JSON with the public key.
    pub jwks: String,
    /// `header.payload.signature` for `iss` = the given issuer, `sub` = [`SUBJECT`].
    pub token: String,
}

/// Generates an ES256 key pair and signs a token for `iss` valid for one year.
pub fn jwt(iss: &str) -> anyhow::Result<Jwt> {
    let kp = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let raw = kp.public_key_raw();
    anyhow::ensure!(
        raw.len() == 65 && raw[0] == 4,
        "unexpected P-256 public key encoding"
    );
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let jwks = json!({"keys": [{
        "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig", "kid": "bench",
        "x": b64.encode(&raw[1..33]), "y": b64.encode(&raw[33..65]),
    }]})
    .to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let claims = json!({
        "iss": iss, "sub": SUBJECT, "aud": "bench", "iat": now, "nbf": now.saturating_sub(60),
        "exp": now + 365 * 24 * 3600,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
    header.kid = Some("bench".into());
    let key = jsonwebtoken::EncodingKey::from_ec_der(&kp.serialize_der());
    let token = jsonwebtoken::encode(&header, &claims, &key)?;
    Ok(Jwt { jwks, token })
}

fn yaml_str(s: &str) -> String {
    // JSON strings are valid YAML double-quoted scalars.
    Value::String(s.to_string()).to_string()
}

/// Rules per generated `AuthorizationPolicy`: larger rule counts are split over
/// several policies of the same action (moat accepts at most 512 rules per policy).
pub const RULES_PER_POLICY: u32 = 500;

/// Generates Istio `RequestAuthentication` and `AuthorizationPolicy` documents
/// (multi-document YAML) for `spec`, using `jwt` for JWT rules.
///
/// Layout `deny`: one DENY policy per kind with `rules` rules, none of which
/// matches the benchmark's requests, so every rule is evaluated and the request
/// is allowed. Layout `allow_last`: one ALLOW policy per kind where only the last
/// rule matches.
pub fn istio_policies(spec: &AuthzGen, jwt: &Jwt) -> String {
    let mut out = String::new();
    let header = |out: &mut String, kind: &str, name: &str| {
        let _ = write!(
            out,
            "---\napiVersion: security.istio.io/v1\nkind: {kind}\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  selector:\n    matchLabels:\n      app: bench\n"
        );
    };
    if spec.jwt_rules > 0 {
        header(&mut out, "RequestAuthentication", "bench-jwt");
        out.push_str("  jwtRules:\n");
        for i in 0..spec.jwt_rules {
            let _ = write!(
                out,
                "    - issuer: {}\n      jwks: {}\n",
                yaml_str(&issuer(i, spec.jwt_rules)),
                yaml_str(&jwt.jwks)
            );
        }
    }
    if spec.rules == 0 {
        return out;
    }
    let token_iss = TOKEN_ISSUER;
    for kind in &spec.kinds {
        let kname = match kind {
            RuleKind::Paths => "paths",
            RuleKind::IpBlocks => "ipblocks",
            RuleKind::Principals => "principals",
            RuleKind::RequestPrincipals => "requestprincipals",
        };
        let action = match spec.layout {
            RuleLayout::Deny => "DENY",
            RuleLayout::AllowLast => "ALLOW",
        };
        for i in 0..spec.rules {
            if i % RULES_PER_POLICY == 0 {
                header(
                    &mut out,
                    "AuthorizationPolicy",
                    &format!(
                        "bench-{}-{kname}-{}",
                        action.to_ascii_lowercase(),
                        i / RULES_PER_POLICY
                    ),
                );
                let _ = writeln!(out, "  action: {action}\n  rules:");
            }
            let last_matches = spec.layout == RuleLayout::AllowLast && i + 1 == spec.rules;
            let rule = match (kind, last_matches) {
                (RuleKind::Paths, false) => format!(
                    "    - to:\n        - operation:\n            paths: [\"/denied/{i}/*\"]\n"
                ),
                (RuleKind::Paths, true) => {
                    "    - to:\n        - operation:\n            paths: [\"/*\"]\n".to_string()
                }
                (RuleKind::IpBlocks, false) => format!(
                    "    - from:\n        - source:\n            ipBlocks: [\"10.{}.{}.{}/32\"]\n",
                    (i >> 16) & 0xff,
                    (i >> 8) & 0xff,
                    i & 0xff
                ),
                (RuleKind::IpBlocks, true) => {
                    "    - from:\n        - source:\n            ipBlocks: [\"127.0.0.0/8\"]\n"
                        .to_string()
                }
                (RuleKind::Principals, false) => format!(
                    "    - from:\n        - source:\n            principals: [\"cluster.local/ns/bench/sa/denied-{i}\"]\n"
                ),
                (RuleKind::Principals, true) => {
                    // Plain-text benchmark clients have no principal: match through notPrincipals.
                    "    - from:\n        - source:\n            notPrincipals: [\"cluster.local/ns/none/sa/none\"]\n"
                        .to_string()
                }
                (RuleKind::RequestPrincipals, false) => format!(
                    "    - from:\n        - source:\n            requestPrincipals: [{}]\n",
                    yaml_str(&format!("{}/denied-{i}", token_iss))
                ),
                (RuleKind::RequestPrincipals, true) => format!(
                    "    - from:\n        - source:\n            requestPrincipals: [{}]\n",
                    yaml_str(&format!("{token_iss}/{SUBJECT}"))
                ),
            };
            out.push_str(&rule);
        }
    }
    out
}

/// Ports and files of one spawned moat.
#[derive(Debug, Clone)]
pub struct MoatLayout {
    /// Data-plane listener.
    pub listener: SocketAddr,
    /// Admin listener.
    pub admin: SocketAddr,
    /// The config file written.
    pub config_path: PathBuf,
}

/// Inputs of [`moat_config`](fn@moat_config).
pub struct MoatConfigInput<'a> {
    /// Directory for the config and its side files.
    pub dir: &'a Path,
    /// Upstream address.
    pub upstream: SocketAddr,
    /// Engines on.
    pub engines: &'a [Engine],
    /// Worker threads.
    pub threads: usize,
    /// TLS listener.
    pub tls: bool,
    /// With `tls`: require client certificates issued by this CA (PEM text),
    /// Istio's `PeerAuthentication` STRICT.
    pub client_ca: Option<&'a str>,
    /// Generated policies text (written next to the config) when authz is on.
    pub policies: Option<&'a str>,
    /// Overrides merged in order (scenario level, then variant level).
    pub overrides: &'a [&'a Value],
}

/// Picks a free loopback port (bind to port 0, read it, release it).
pub fn free_port() -> std::io::Result<SocketAddr> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}

/// Builds and writes a moat config for one variant.
pub fn moat_config(input: &MoatConfigInput<'_>) -> anyhow::Result<MoatLayout> {
    std::fs::create_dir_all(input.dir)?;
    let listener = free_port()?;
    let admin = free_port()?;
    let on = |e: Engine| input.engines.contains(&e);
    let mut listener_v = json!({"name": "main", "address": listener.to_string()});
    // Files the config names are written beside it and named by file name alone: moat
    // resolves a relative path against the config's directory, so `input.dir` joined in
    // would name `dir/dir/file` whenever `dir` is itself relative (the default output
    // directory is).
    if input.tls {
        let cert = crate::tls::self_signed(&["localhost", "127.0.0.1"])?;
        std::fs::write(input.dir.join("cert.pem"), &cert.cert_pem)?;
        std::fs::write(input.dir.join("key.pem"), &cert.key_pem)?;
        listener_v["tls"] = json!({"certificates": [{"cert": "cert.pem", "key": "key.pem"}]});
        if let Some(ca_pem) = input.client_ca {
            std::fs::write(input.dir.join("clients-ca.pem"), ca_pem)?;
            listener_v["tls"]["client_auth"] = json!({"mode": "STRICT", "ca": "clients-ca.pem"});
        }
    }
    let mut cfg = json!({
        "runtime": {"threads": input.threads},
        "listeners": [listener_v],
        "admin": {"address": admin.to_string()},
        "clusters": [{"name": "app", "endpoints": [input.upstream.to_string()],
                      "labels": {"app": "bench"}, "namespace": "default"}],
        "routes": [{"name": "api", "host": "*", "path_prefix": "/", "cluster": "app"}],
        "events": {"sink": {"type": "none"}},
        "tls_audit": {"enabled": on(Engine::TlsAudit)},
    });
    // Engine sections are written only for engines that are on (an engine that is
    // off is absent, which every engine treats as disabled).
    if on(Engine::Authz) {
        std::fs::write(
            input.dir.join("policies.yaml"),
            input.policies.unwrap_or(""),
        )?;
        cfg["authz"] = json!({"enabled": true, "policies": ["policies.yaml"]});
    }
    for e in [Engine::Waf, Engine::Secrets, Engine::Discovery] {
        if on(e) {
            cfg[e.key()] = json!({"enabled": true});
        }
    }
    for o in input.overrides {
        merge(&mut cfg, o);
    }
    let text = serde_saphyr::to_string(&cfg)?;
    let config_path = input.dir.join("moat.yaml");
    std::fs::write(&config_path, text)?;
    Ok(MoatLayout {
        listener,
        admin,
        config_path,
    })
}

/// Deep-merges `over` into `base`: maps merge key by key, anything else replaces;
/// a `null` value removes the key.
pub fn merge(base: &mut Value, over: &Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                if v.is_null() {
                    b.remove(k);
                } else {
                    merge(b.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jwt_verifies_with_its_jwks() {
        let j = jwt(TOKEN_ISSUER).unwrap();
        let jwks: jsonwebtoken::jwk::JwkSet = serde_json::from_str(&j.jwks).unwrap();
        let key = jsonwebtoken::DecodingKey::from_jwk(&jwks.keys[0]).unwrap();
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        v.set_audience(&["bench"]);
        let data = jsonwebtoken::decode::<serde_json::Value>(&j.token, &key, &v).unwrap();
        assert_eq!(data.claims["iss"], TOKEN_ISSUER);
        assert_eq!(data.claims["sub"], SUBJECT);
    }

    #[test]
    fn policies_have_the_requested_rules() {
        let j = Jwt {
            jwks: "{\"keys\":[]}".into(),
            token: String::new(),
        };
        let spec = AuthzGen {
            rules: 1000,
            kinds: vec![
                RuleKind::Paths,
                RuleKind::IpBlocks,
                RuleKind::RequestPrincipals,
            ],
            jwt_rules: 3,
            layout: RuleLayout::Deny,
        };
        let text = istio_policies(&spec, &j);
        let docs: Vec<Value> = moat_config::from_str_multi(Path::new("p.yaml"), &text).unwrap();
        // 1 RequestAuthentication + 3 kinds x 2 policies of 500 rules.
        assert_eq!(docs.len(), 7);
        assert_eq!(docs[0]["kind"], "RequestAuthentication");
        assert_eq!(docs[0]["spec"]["jwtRules"].as_array().unwrap().len(), 3);
        for d in &docs[1..] {
            assert_eq!(d["spec"]["action"], "DENY");
            assert_eq!(d["spec"]["rules"].as_array().unwrap().len(), 500);
        }
        assert_eq!(docs[4]["metadata"]["name"], "bench-deny-ipblocks-1");
        assert_eq!(
            docs[4]["spec"]["rules"][499]["from"][0]["source"]["ipBlocks"][0],
            "10.0.3.231/32"
        );
        // No generated DENY rule names the token's principal.
        assert!(!text.contains(&format!("{TOKEN_ISSUER}/{SUBJECT}")));
        assert_eq!(docs[0]["spec"]["jwtRules"][2]["issuer"], TOKEN_ISSUER);
        let spec = AuthzGen {
            layout: RuleLayout::AllowLast,
            ..spec
        };
        let text = istio_policies(&spec, &j);
        assert!(text.contains(&format!("{TOKEN_ISSUER}/{SUBJECT}")));
        let spec0 = AuthzGen {
            rules: 0,
            jwt_rules: 0,
            ..spec
        };
        assert_eq!(istio_policies(&spec0, &j), "");
    }

    #[test]
    fn config_has_engines_and_overrides() {
        // A relative directory, as the default output directory is: paths written
        // into the config must not repeat it.
        let tmp = tempfile::tempdir_in(".").unwrap();
        let cwd = std::env::current_dir().unwrap();
        let rel = tmp.path().strip_prefix(&cwd).unwrap_or(tmp.path());
        assert!(rel.is_relative(), "{rel:?}");
        let over = json!({"waf": {"mode": "block"}, "events": null});
        let l = moat_config(&MoatConfigInput {
            dir: rel,
            upstream: "127.0.0.1:9".parse().unwrap(),
            engines: &[Engine::Waf, Engine::Authz],
            threads: 1,
            tls: true,
            client_ca: Some("CA PEM"),
            policies: Some(""),
            overrides: &[&over],
        })
        .unwrap();
        let v: Value = moat_config::from_file(&l.config_path).unwrap();
        assert_eq!(v["waf"]["enabled"], true);
        assert_eq!(v["waf"]["mode"], "block");
        assert!(v.get("secrets").is_none());
        assert!(v.get("events").is_none());
        // Every file the config names is found relative to the config's directory, as
        // moat resolves it.
        let beside = |v: &Value| rel.join(v.as_str().unwrap());
        assert!(beside(&v["authz"]["policies"][0]).is_file());
        let cert = &v["listeners"][0]["tls"]["certificates"][0];
        assert!(beside(&cert["cert"]).is_file() && beside(&cert["key"]).is_file());
        let client_auth = &v["listeners"][0]["tls"]["client_auth"];
        assert_eq!(client_auth["mode"], "STRICT");
        let ca = std::fs::read_to_string(beside(&client_auth["ca"])).unwrap();
        assert_eq!(ca, "CA PEM");
        assert_eq!(v["clusters"][0]["endpoints"][0], "127.0.0.1:9");
    }
}
