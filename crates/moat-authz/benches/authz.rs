//! Decision cost versus number of rules, per rule kind, worst case (no rule matches, or
//! only the last one does); the linear oracle for comparison; JWT verification costs.
//!
//! Run: `cargo bench -p moat-authz --bench authz`
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use http::HeaderMap;
use jsonwebtoken::Algorithm;
use moat_authz::compiled::CompiledSet;
use moat_authz::ir::{Clause, LinearSet, PathPat, Pred, ReqPrinPat, Rule, RuleMatcher, StrPat};
use moat_authz::jwt::{JwksOrigin, KeySet, KeySource, Provider, TokenCache};
use moat_authz::loader::{AuthzPolicy, Meta, PolicySet};
use moat_authz::request::Attrs;
use moat_authz::{Action, AuthzConfig, AuthzEngine, RequestInput};
use moat_core::PeerIdentity;

const SIZES: &[usize] = &[0, 10, 100, 1_000, 10_000];
const ISS: &str = "https://issuer.example.com";

#[derive(Clone, Copy)]
enum Kind {
    ExactPath,
    PrefixPath,
    SuffixPath,
    TemplatePath,
    IpBlocks,
    Principals,
    RequestPrincipals,
    Header,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::ExactPath => "exact_path",
            Kind::PrefixPath => "prefix_path",
            Kind::SuffixPath => "suffix_path",
            Kind::TemplatePath => "template_path",
            Kind::IpBlocks => "ip_blocks",
            Kind::Principals => "principals",
            Kind::RequestPrincipals => "request_principals",
            Kind::Header => "header",
        }
    }

    fn ip(i: usize) -> String {
        format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
    }

    fn rule(self, i: usize) -> Rule {
        let c = |pred| Clause {
            pred,
            negated: false,
        };
        let from = |pred| Rule {
            from: vec![vec![c(pred)]],
            ..Default::default()
        };
        let to = |pred| Rule {
            to: vec![vec![c(pred)]],
            ..Default::default()
        };
        match self {
            Kind::ExactPath => to(Pred::Path(vec![PathPat::Str(StrPat::Exact(format!(
                "/api/v1/item-{i}"
            )))])),
            Kind::PrefixPath => to(Pred::Path(vec![PathPat::Str(StrPat::Prefix(format!(
                "/api/v1/item-{i}/"
            )))])),
            Kind::SuffixPath => to(Pred::Path(vec![PathPat::Str(StrPat::Suffix(format!(
                ".ext{i}"
            )))])),
            Kind::TemplatePath => to(Pred::Path(vec![PathPat::parse(&format!(
                "/api/v1/item-{i}/{{*}}/detail/{{**}}"
            ))
            .unwrap()])),
            Kind::IpBlocks => from(Pred::SourceIp(vec![format!("{}/32", Self::ip(i))
                .parse()
                .unwrap()])),
            Kind::Principals => from(Pred::Principal(vec![StrPat::Exact(format!(
                "cluster.local/ns/bench/sa/sa-{i}"
            ))])),
            Kind::RequestPrincipals => from(Pred::RequestPrincipal(vec![ReqPrinPat::parse(
                &format!("{ISS}/user-{i}"),
            )])),
            Kind::Header => Rule {
                when: vec![c(Pred::Header(
                    "x-token".into(),
                    vec![StrPat::Exact(format!("token-{i}"))],
                ))],
                ..Default::default()
            },
        }
    }
}

/// A request that matches rule `hit` (or nothing when `None`).
struct BenchReq {
    path: String,
    src: std::net::IpAddr,
    peer: PeerIdentity,
    headers: HeaderMap,
    sub: String,
}

fn bench_req(kind: Kind, hit: Option<usize>) -> BenchReq {
    let i = hit.unwrap_or(usize::MAX / 2);
    let miss = hit.is_none();
    let path = match kind {
        Kind::ExactPath if !miss => format!("/api/v1/item-{i}"),
        Kind::PrefixPath if !miss => format!("/api/v1/item-{i}/detail"),
        Kind::SuffixPath if !miss => format!("/files/a.ext{i}"),
        Kind::TemplatePath if !miss => format!("/api/v1/item-{i}/42/detail/a/b.json"),
        _ => "/api/v1/item-none/detail.none".to_string(),
    };
    let src = match kind {
        Kind::IpBlocks if !miss => Kind::ip(i).parse().unwrap(),
        _ => "192.168.7.7".parse().unwrap(),
    };
    let sa = if matches!(kind, Kind::Principals) && !miss {
        format!("sa-{i}")
    } else {
        "nobody".into()
    };
    let uri = format!("spiffe://cluster.local/ns/bench/sa/{sa}");
    let (principal, namespace) = PeerIdentity::from_spiffe_uri(&uri);
    let peer = PeerIdentity {
        principal,
        namespace,
        uri_sans: vec![uri],
        ..Default::default()
    };
    let mut headers = HeaderMap::new();
    let tok = if matches!(kind, Kind::Header) && !miss {
        format!("token-{i}")
    } else {
        "token-none".into()
    };
    headers.insert("x-token", tok.parse().unwrap());
    headers.insert("user-agent", "bench/1.0".parse().unwrap());
    headers.insert("accept", "*/*".parse().unwrap());
    let sub = if matches!(kind, Kind::RequestPrincipals) && !miss {
        format!("user-{i}")
    } else {
        "user-none".into()
    };
    BenchReq {
        path,
        src,
        peer,
        headers,
        sub,
    }
}

fn meta(name: String) -> Meta {
    Meta {
        name,
        namespace: "bench".into(),
        selector: None,
        dry_run: false,
        created: None,
        file: PathBuf::from("bench.yaml"),
        line: 1,
    }
}

/// An engine with `n` single-rule ALLOW policies (Istio's "N policies x 1 value") and a
/// RequestAuthentication with an inline RSA JWKS.
fn engine(kind: Kind, n: usize, key: &common::TestKey) -> Arc<AuthzEngine> {
    let mut set = PolicySet::default();
    for i in 0..n {
        set.authz.push(AuthzPolicy {
            meta: meta(format!("p-{i:05}")),
            action: Action::Allow,
            provider: None,
            rules: vec![kind.rule(i)],
        });
    }
    let ra = format!(
        "apiVersion: security.istio.io/v1\nkind: RequestAuthentication\nmetadata: {{name: jwt, namespace: bench}}\nspec:\n  jwtRules:\n  - issuer: \"{ISS}\"\n    jwks: '{}'\n    forwardOriginalToken: true\n",
        common::jwks(&[key])
    );
    moat_authz::loader::parse_text(std::path::Path::new("ra.yaml"), &ra, &mut set).unwrap();
    AuthzEngine::from_policies(
        &AuthzConfig::default(),
        set,
        Arc::new(moat_authz::NoFetch),
        false,
    )
    .unwrap()
}

fn decisions(c: &mut Criterion) {
    let key = common::rsa_key(1, "k", Algorithm::RS256);
    let labels = BTreeMap::new();
    for kind in [
        Kind::ExactPath,
        Kind::PrefixPath,
        Kind::SuffixPath,
        Kind::TemplatePath,
        Kind::IpBlocks,
        Kind::Principals,
        Kind::RequestPrincipals,
        Kind::Header,
    ] {
        let mut g = c.benchmark_group(format!("decision/{}", kind.name()));
        for &n in SIZES {
            let e = engine(kind, n, &key);
            for (case, hit) in [("no_match", None), ("last_matches", n.checked_sub(1))] {
                if n == 0 && case == "last_matches" {
                    continue;
                }
                let r = bench_req(kind, hit);
                let token = common::sign(&key, &common::claims(ISS, &r.sub));
                let mut headers = r.headers.clone();
                let with_jwt = matches!(kind, Kind::RequestPrincipals);
                if with_jwt {
                    headers.insert("authorization", format!("Bearer {token}").parse().unwrap());
                }
                let input = RequestInput {
                    namespace: "bench",
                    labels: &labels,
                    scheme: "http",
                    method: "GET",
                    host: "bench.example.com",
                    path_and_query: &r.path,
                    port: Some(8080),
                    source_ip: Some(r.src),
                    remote_ip: Some(r.src),
                    dest_ip: None,
                    sni: None,
                    peer: Some(&r.peer),
                    body: None,
                };
                let mut h = headers.clone();
                let d = e.evaluate(&input, &mut h);
                assert_eq!(
                    d.allowed,
                    hit.is_some() || n == 0,
                    "{} {n} {case}: {}",
                    kind.name(),
                    d.reason
                );
                g.bench_with_input(BenchmarkId::new(case, n), &n, |b, _| {
                    b.iter(|| {
                        // The engine may rewrite headers (JWT outputs): evaluate on the same map,
                        // which is left unchanged here (forwardOriginalToken: true, no outputs).
                        black_box(e.evaluate(black_box(&input), &mut h))
                    })
                });
            }
        }
        g.finish();
    }
}

fn linear_oracle(c: &mut Criterion) {
    for kind in [Kind::ExactPath, Kind::IpBlocks] {
        let mut g = c.benchmark_group(format!("index_vs_linear/{}", kind.name()));
        for &n in &[10usize, 100, 1_000, 10_000] {
            let rules: Vec<Rule> = (0..n).map(|i| kind.rule(i)).collect();
            let compiled = CompiledSet::new(&rules);
            let linear = LinearSet { rules };
            let r = bench_req(kind, None);
            let a = Attrs {
                host: "bench.example.com",
                method: "GET",
                path: &r.path,
                raw_path: &r.path,
                headers: &r.headers,
                port: Some(8080),
                source_ip: Some(r.src),
                remote_ip: Some(r.src),
                dest_ip: None,
                sni: None,
                peer: None,
                jwt: None,
                bare_host: None,
            };
            g.bench_with_input(BenchmarkId::new("compiled", n), &n, |b, _| {
                b.iter(|| black_box(compiled.first_match(black_box(&a))))
            });
            g.bench_with_input(BenchmarkId::new("linear", n), &n, |b, _| {
                b.iter(|| black_box(linear.first_match(black_box(&a))))
            });
        }
        g.finish();
    }
}

fn jwt(c: &mut Criterion) {
    let mut g = c.benchmark_group("jwt");
    for (name, key) in [
        ("rs256", common::rsa_key(1, "k", Algorithm::RS256)),
        ("es256", common::ec_key("k", Algorithm::ES256)),
        ("eddsa", common::ed_key("k")),
    ] {
        let p = Provider {
            policy: "bench/jwt".into(),
            rule: 0,
            id: 0,
            issuer: ISS.into(),
            audiences: vec![],
            locations: moat_authz::jwt::default_locations(),
            keys: Arc::new(KeySource::new(
                JwksOrigin::Inline,
                KeySet::parse(&common::jwks(&[&key])).unwrap(),
                std::time::Duration::from_secs(5),
                true,
                Arc::new(moat_authz::NoFetch),
            )),
            output_payload_to_header: None,
            output_claims: vec![],
            forward: true,
            space_delimited: vec!["scope".into()],
        };
        let t = common::sign(&key, &common::claims(ISS, "alice"));
        let now = moat_authz::jwt::now_secs();
        g.bench_function(format!("fresh_verify/{name}"), |b| {
            b.iter(|| black_box(moat_authz::jwt::verify(black_box(&t), &p, now, 60).unwrap()))
        });
        let cache = TokenCache::new(1000);
        moat_authz::jwt::verify_cached(&t, &p, &cache, now, 60).unwrap();
        g.bench_function(format!("cached/{name}"), |b| {
            b.iter(|| {
                black_box(
                    moat_authz::jwt::verify_cached(black_box(&t), &p, &cache, now, 60).unwrap(),
                )
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = decisions, linear_oracle, jwt
}
criterion_main!(benches);
