//! Shared test helpers: keys, signed tokens, JWKS documents, engines from YAML text.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)]

pub mod http_fetch;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine as _;
use http::HeaderMap;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use moat_authz::engine::{AuthzConfig, AuthzEngine, ConnectionInput, Decision, RequestInput};
use moat_core::PeerIdentity;
use ring::rand::SystemRandom;
use ring::signature::{self, KeyPair};
use serde_json::{json, Value};

/// RSA-2048 test key generated once with `openssl genpkey` (tests only; ring cannot
/// generate RSA keys).
pub const RSA1_PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQDPzJxEaEzdCh/P\nbmuqvPZC143gyOEkVi3FgeyzSLRkFe8DY+6dGnkt/gaWCEjYJbN5ZxQinnYbsQix\nQvB2fhdA6tFjybO+FtLm4zkXrOYGXpGz/rJiFBXxj0l1ApCjb2hs5A8XOTcondr7\n/BLUYTgh4vMmeE5XaDpPckTMyz9mhlvVpxJfQ94o6+c63Ifhj9OTc1onaANTDrx1\naGyWI8KnvjMsNy7VE6Fcd1lY8ny6NrcArs6us0BYHnn/5CxqIGR7G5Ue/pTvD2W1\nss31vkTiES62YvW9pt+Yb+5VfMNy3rn0XVXCFHaIq7q68wvokkj0+94qjvPtZj68\nyXjBi35vAgMBAAECggEAIF6uRRW+S3yFQgngacNv1S/A4TBJqiBmlurLVY5Q03p7\nNhr+E6kJEXoNypdVyZ3t3E6LW2011tB4GyzjSoIP20P5BENqZYUmq2LgBOkhGALp\nTZGydgbM+Ekq1zhkEaGMMdJA64w1JHWapEA7KqxOUzEIUYjSI1mQI8oYH5LVuIGT\nrHPtwrj6EfPXy6KNjUYOxdsG0o+DkmXC3HMaZuyuRp86kZ4X0vepurXyzA3gTCPi\nq6artv6NSQBZgWrm0PR/8uxrr9nab5CIH2FxB3rae7/MeGtt1ftVTzarg8gyA2Qc\nSVEOlPBJhQBUEAU+ewIyxNT8zO+8wpzcqZb5tQzn+QKBgQDumZmeqlu0Lc9aUPBG\nC5FqvjpxdSa7HHM48k8KFJr5pX1N4DKGDO09sk+1PTVRWQETJn8FTYedX7CCSYNe\nt8LhRdQU0pYFbodM4PNA7hDHuvA8r7RJSMWT5q1VNokH59u4cJ+fUwgklpfEXOOV\nC8vZmgMy3I+b4emM/ncg3PD+awKBgQDe8/6NMUo9t6jU2DXmg4dl5rSKklmaNrl5\nE0LwdcWKArE0t1oBsxLwIWyJc90oUe8H8R9guJp9fj5pNjriAwbNbBYC1jy4fZ+m\nsAxMSTQ5AaiAE1+NgKlYEXNKMhefETCaHaxprTCEqr2mRCY4fgV00jakFbBDGQMx\n0ePTiqp5DQKBgGjp70t+Gx6p+f/7kPsrwQBPrwEOgz5JLzz+BtUm5FIbe3KPv4eE\nDZlQW44U4OnpGfjit32MbrI7TjCrxHEUmkNV4gBZ7I9s319llnCZfZVlVJdKpxqG\nPiJfjx3mAfEQ+WMrWnTDHNSBxzAXrBZwfm0rNHbb1uWzO2+8wIMZw3oLAoGARN9Q\nsiMY0QnsIJwNwoC9EdB70xa0kTv4fZtioU9wT1rXjPZa2o2L+xwIIEnndq4gze5B\niCpepweZlfzHocvXjRunjQbLSR6dc+uMUQCIHlgRykaxzM+DAI6bc78Xpu6zedhS\ny25Rv5nS7gq9V9QuMVFCydtdUMzoPLqey1lZof0CgYAmLyfBS6d3TiY/ofHn07Lg\noIyENo7G7PYkCqBxoN4s7BbgldFhtkHXa5pcH6UMEB5o95uyGGpNi6ZtVcFJ2Scd\n7m06xZ67b+EvJT9tiBKJ7NhWtn3iWe5LV/DkIL8mskqfRyH3AhlQopqygCqLDa+E\nkG5bSyn/uZykJnG7zu+OZw==\n-----END PRIVATE KEY-----";
/// Modulus of RSA1, base64url.
pub const RSA1_N: &str = "z8ycRGhM3Qofz25rqrz2QteN4MjhJFYtxYHss0i0ZBXvA2PunRp5Lf4GlghI2CWzeWcUIp52G7EIsULwdn4XQOrRY8mzvhbS5uM5F6zmBl6Rs_6yYhQV8Y9JdQKQo29obOQPFzk3KJ3a-_wS1GE4IeLzJnhOV2g6T3JEzMs_ZoZb1acSX0PeKOvnOtyH4Y_Tk3NaJ2gDUw68dWhsliPCp74zLDcu1ROhXHdZWPJ8uja3AK7OrrNAWB55_-QsaiBkexuVHv6U7w9ltbLN9b5E4hEutmL1vabfmG_uVXzDct659F1VwhR2iKu6uvML6JJI9PveKo7z7WY-vMl4wYt-bw";
/// A second RSA-2048 test key.
pub const RSA2_PEM: &str = "-----BEGIN PRIVATE KEY-----\nMIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQCemptzQl4XVqn3\nkAqjIijOSOqAiNX/3ag7rIcbVMYtZKXJambkYo6FAOOR28xnMzuTqWnUr/9rwuyg\ns/0t1RuYO+rUflee02b658rjyJwp/S5WowWZQ+1faY2AoIWzl8T3LWHa1InYLTN6\n0hPjrjlmlZK8W8MbFCWo9yMATuY6QNckL0aZAvTqS0jd7eFP3COrnMurm2+SbXEJ\nbyQsZEo2BYwYDiDeIATcx/lKnkmcAmVHYOZ3j+RwFvECfYY261PhamRQZ6vj1JYk\ni6us/S+xaORAb7sAgy4QwA0vz9lZ8KGIgL2ZHQ5TzfYe96FGLUfKOZgmrFmKbpRA\nFQwvIljJAgMBAAECggEAPEDtNITunPwyFxhUSjRkfzXpTMpvTkSlsIHzU/lJTp5x\nc0rmavZcQYAcdGGlzkEC7a6LQ59XMFe9sLGgSgSvdo6wwGh9Hhwe/8wGYrHoTfVe\n4NAPBPJu3/QIK2kQUjGixOqrRci/024cpBjiMHmUWfoR5FgSD5wAUKgO1oOi6Fb3\nkDiTou8XTove0+7GKado+N8kSR+KBwv0cqRLg+KEDp+2TvPXB7V/LIqE6mA4Kmqn\nUta0/3AiKzJyNb3xzVuujbsCCH1uxd3Cs7sCwJwYp/tl33xPjzA53s69Y8OmspK1\nx6mKLUP0y0Ua123bNdtau5iZPl9Af8DSLZEMco79XwKBgQDRBFAnpwZJaWY5ma+3\nUaikbLN9ybHomAKj+Cvm0YKevakVCjkzf5TC2LnLsv+3ttV7/nl2aOGJKBqAahRo\nq340A0vThWaTxg0ZrGqrdrtFv1xbfRsp/PJfqQZzB5rmmbKdcV0UAAgZSARQOHlO\ngN28FfOGPlpO3JOCy65/6AlntwKBgQDCQVQJHbrnHOYiqneMOryShEn9qdsPB+MS\nTSS4ehJ24XErO1GIHtM+lMpJE9oo4yWFZMn4gqb1G/D4ldFi5QkR2U0z52yseCdn\nESlEklXzd0osD26Mi9zsqkuzBj/k3NKMYwdTlvj/2asZPsjHtnEq3gqkBwx6ptms\n9+RAmEVDfwKBgHjkt7/XmYlIjzntrHapopNH1CGDUYWoto5EcpAUyioqpOtoeGFS\n/6YbWIt7QvDtrVkEfRiB3UFJktqHgLpxxpMq/OahGA2M1fLtiN0X1YWoAzFfkSCe\nD0pJJ1PNKEkMyQTLlvyEcCq/Ps9veqpvWtD5GVuiIPXQGvnh+VI90YLNAoGACpKh\nr0lV9eRFxlc+4HwF7XeTy2GmUaAdRM68E+pY/O1ySmcVHfKHjt1sUSPqeNU8IpGE\nyKjby3V03SLSXa6XmsgYAp4y9QQpKNvvQhMw6GpyuAky/CVUpfDy49CQQ7WdJBTz\nviH2dX50aJBZPz131Vx2ec0EadyQ9nAblUR0aKMCgYB/Z6bfXoljBMu4RZX+oIhs\nU8NdHGO1vDaSdGqh2Dv6oBbJ18y3J1ZRYqV2Avn5Opo1x1Wq5iuQypVzYW1pRi+p\np3kdUYqNKYDMoKmbRXaKaYbOcpzOXTsqiC3sr3l0gAMYrH+UNX3+G8HKXQY93v6q\nLEUBBOSE4vQclFFpGboJcg==\n-----END PRIVATE KEY-----";
/// Modulus of RSA2, base64url.
pub const RSA2_N: &str = "npqbc0JeF1ap95AKoyIozkjqgIjV_92oO6yHG1TGLWSlyWpm5GKOhQDjkdvMZzM7k6lp1K__a8LsoLP9LdUbmDvq1H5XntNm-ufK48icKf0uVqMFmUPtX2mNgKCFs5fE9y1h2tSJ2C0zetIT4645ZpWSvFvDGxQlqPcjAE7mOkDXJC9GmQL06ktI3e3hT9wjq5zLq5tvkm1xCW8kLGRKNgWMGA4g3iAE3Mf5Sp5JnAJlR2Dmd4_kcBbxAn2GNutT4WpkUGer49SWJIurrP0vsWjkQG-7AIMuEMANL8_ZWfChiIC9mR0OU832HvehRi1HyjmYJqxZim6UQBUMLyJYyQ";

/// A signing key with its public JWK.
pub struct TestKey {
    pub enc: EncodingKey,
    pub jwk: Value,
    pub alg: Algorithm,
}

pub fn b64u(b: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

pub fn rsa_key(which: u8, kid: &str, alg: Algorithm) -> TestKey {
    let (pem, n) = if which == 1 {
        (RSA1_PEM, RSA1_N)
    } else {
        (RSA2_PEM, RSA2_N)
    };
    TestKey {
        enc: EncodingKey::from_rsa_pem(pem.as_bytes()).unwrap(),
        jwk: json!({"kty": "RSA", "kid": kid, "use": "sig", "n": n, "e": "AQAB"}),
        alg,
    }
}

pub fn ec_key(kid: &str, alg: Algorithm) -> TestKey {
    let rng = SystemRandom::new();
    let (salg, crv, len) = match alg {
        Algorithm::ES256 => (&signature::ECDSA_P256_SHA256_FIXED_SIGNING, "P-256", 32),
        _ => (&signature::ECDSA_P384_SHA384_FIXED_SIGNING, "P-384", 48),
    };
    let doc = signature::EcdsaKeyPair::generate_pkcs8(salg, &rng).unwrap();
    let kp = signature::EcdsaKeyPair::from_pkcs8(salg, doc.as_ref(), &rng).unwrap();
    let pk = kp.public_key().as_ref();
    TestKey {
        enc: EncodingKey::from_ec_der(doc.as_ref()),
        jwk: json!({"kty": "EC", "kid": kid, "crv": crv, "x": b64u(&pk[1..1 + len]), "y": b64u(&pk[1 + len..])}),
        alg,
    }
}

pub fn ed_key(kid: &str) -> TestKey {
    let rng = SystemRandom::new();
    let doc = signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let kp = signature::Ed25519KeyPair::from_pkcs8(doc.as_ref()).unwrap();
    TestKey {
        enc: EncodingKey::from_ed_der(doc.as_ref()),
        jwk: json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": b64u(kp.public_key().as_ref())}),
        alg: Algorithm::EdDSA,
    }
}

pub fn jwks(keys: &[&TestKey]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

pub fn now() -> i64 {
    moat_authz::jwt::now_secs()
}

/// Signs `claims` with `key`, `kid` from the JWK.
pub fn sign(key: &TestKey, claims: &Value) -> String {
    let mut h = Header::new(key.alg);
    h.kid = key.jwk["kid"].as_str().map(String::from);
    jsonwebtoken::encode(&h, claims, &key.enc).unwrap()
}

/// Standard claims: iss, sub, exp in one hour.
pub fn claims(iss: &str, sub: &str) -> Value {
    json!({"iss": iss, "sub": sub, "exp": now() + 3600, "iat": now()})
}

/// Writes `yaml` to a temp dir and builds an engine (no background refresh).
pub fn engine(yaml: &str) -> Arc<AuthzEngine> {
    engine_cfg(yaml, AuthzConfig::default())
}

pub fn engine_cfg(yaml: &str, mut cfg: AuthzConfig) -> Arc<AuthzEngine> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p.yaml");
    std::fs::write(&p, yaml).unwrap();
    cfg.enabled = true;
    cfg.policies = vec![p];
    AuthzEngine::build_with(&cfg, dir.path(), Arc::new(moat_authz::NoFetch), false).unwrap()
}

/// A request for tests; builder style.
#[derive(Clone, Debug)]
pub struct Req {
    pub ns: String,
    pub labels: BTreeMap<String, String>,
    pub method: String,
    pub host: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub port: Option<u16>,
    pub src: Option<std::net::IpAddr>,
    pub remote: Option<std::net::IpAddr>,
    pub dest: Option<std::net::IpAddr>,
    pub sni: Option<String>,
    pub peer: Option<String>,
    pub jwt: Option<String>,
    pub body: Option<Vec<u8>>,
}

pub fn req(path: &str) -> Req {
    Req {
        ns: "foo".into(),
        labels: BTreeMap::new(),
        method: "GET".into(),
        host: "svc.example.com".into(),
        path: path.into(),
        headers: Vec::new(),
        port: Some(8080),
        src: Some("10.0.0.1".parse().unwrap()),
        remote: Some("10.0.0.1".parse().unwrap()),
        dest: Some("10.1.0.1".parse().unwrap()),
        sni: None,
        peer: None,
        jwt: None,
        body: None,
    }
}

impl Req {
    pub fn ns(mut self, ns: &str) -> Self {
        self.ns = ns.into();
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn method(mut self, m: &str) -> Self {
        self.method = m.into();
        self
    }
    pub fn host(mut self, h: &str) -> Self {
        self.host = h.into();
        self
    }
    pub fn header(mut self, k: &str, v: &str) -> Self {
        self.headers.push((k.into(), v.into()));
        self
    }
    pub fn port(mut self, p: u16) -> Self {
        self.port = Some(p);
        self
    }
    pub fn src(mut self, ip: &str) -> Self {
        self.src = Some(ip.parse().unwrap());
        self
    }
    pub fn no_src(mut self) -> Self {
        self.src = None;
        self.remote = None;
        self
    }
    pub fn remote(mut self, ip: &str) -> Self {
        self.remote = Some(ip.parse().unwrap());
        self
    }
    pub fn dest(mut self, ip: &str) -> Self {
        self.dest = Some(ip.parse().unwrap());
        self
    }
    pub fn sni(mut self, s: &str) -> Self {
        self.sni = Some(s.into());
        self
    }
    pub fn peer(mut self, uri: &str) -> Self {
        self.peer = Some(uri.into());
        self
    }
    pub fn jwt(mut self, t: &str) -> Self {
        self.jwt = Some(t.into());
        self
    }
    pub fn body(mut self, content_type: &str, body: &str) -> Self {
        self.headers
            .push(("content-type".into(), content_type.into()));
        self.body = Some(body.into());
        self
    }

    /// Evaluates; returns the decision and the (possibly rewritten) headers.
    pub fn eval_full(&self, e: &AuthzEngine) -> (Decision, HeaderMap) {
        let mut h = HeaderMap::new();
        for (k, v) in &self.headers {
            h.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        if let Some(t) = &self.jwt {
            h.append(
                http::header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
        }
        let peer = self.peer.as_ref().map(|u| {
            let (principal, namespace) = PeerIdentity::from_spiffe_uri(u);
            PeerIdentity {
                principal,
                namespace,
                uri_sans: vec![u.clone()],
                ..Default::default()
            }
        });
        let input = RequestInput {
            namespace: &self.ns,
            labels: &self.labels,
            scheme: "http",
            method: &self.method,
            host: &self.host,
            path_and_query: &self.path,
            port: self.port,
            source_ip: self.src,
            remote_ip: self.remote,
            dest_ip: self.dest,
            sni: self.sni.as_deref(),
            peer: peer.as_ref(),
            body: self.body.as_deref(),
        };
        let d = e.evaluate(&input, &mut h);
        (d, h)
    }

    pub fn eval(&self, e: &AuthzEngine) -> Decision {
        self.eval_full(e).0
    }

    /// Status code only.
    pub fn status(&self, e: &AuthzEngine) -> u16 {
        self.eval(e).status
    }

    /// Evaluates the same workload, addresses, port, SNI and peer as a TCP connection
    /// (method, host, path, headers and JWT are not part of a connection).
    pub fn conn(&self, e: &AuthzEngine) -> Decision {
        let peer = self.peer.as_ref().map(|u| {
            let (principal, namespace) = PeerIdentity::from_spiffe_uri(u);
            PeerIdentity {
                principal,
                namespace,
                uri_sans: vec![u.clone()],
                ..Default::default()
            }
        });
        e.evaluate_connection(&ConnectionInput {
            namespace: &self.ns,
            labels: &self.labels,
            port: self.port,
            source_ip: self.src,
            remote_ip: self.remote,
            dest_ip: self.dest,
            sni: self.sni.as_deref(),
            peer: peer.as_ref(),
        })
    }

    /// Whether the connection is accepted.
    pub fn conn_ok(&self, e: &AuthzEngine) -> bool {
        self.conn(e).allowed
    }
}

pub fn tmp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(name)
}
