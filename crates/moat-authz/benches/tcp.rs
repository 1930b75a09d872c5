//! TCP (L4) connection decisions (`AuthzEngine::evaluate_connection`) versus number of
//! rules, per rule kind, worst cases (no rule matches, or only the last one does).
//!
//! Run: `cargo bench -p moat-authz --bench tcp`
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use moat_authz::ir::{Clause, NsPat, PathPat, Pred, Rule, StrPat};
use moat_authz::loader::{AuthzPolicy, Meta, PolicySet};
use moat_authz::{Action, AuthzConfig, AuthzEngine, ConnectionInput};
use moat_core::PeerIdentity;

const SIZES: &[usize] = &[10, 1_000, 10_000];

#[derive(Clone, Copy)]
enum Kind {
    Principals,
    Namespaces,
    IpBlocks,
    RemoteIpBlocks,
    Ports,
    /// ALLOW principals rules, each with an HTTP-only twin rule (skipped on TCP), and as
    /// many DENY rules on ports with an HTTP-only method (broadened to the port).
    MixedHttp,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Principals => "principals",
            Kind::Namespaces => "namespaces",
            Kind::IpBlocks => "ip_blocks",
            Kind::RemoteIpBlocks => "remote_ip_blocks",
            Kind::Ports => "ports",
            Kind::MixedHttp => "mixed_http",
        }
    }
}

fn ip(i: usize) -> IpAddr {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
        .parse()
        .expect("generated IP")
}

fn c(pred: Pred) -> Clause {
    Clause {
        pred,
        negated: false,
    }
}

fn from(pred: Pred) -> Rule {
    Rule {
        from: vec![vec![c(pred)]],
        ..Default::default()
    }
}

fn principal(i: usize) -> Pred {
    Pred::Principal(vec![StrPat::Exact(format!(
        "cluster.local/ns/bench/sa/sa-{i}"
    ))])
}

/// The ALLOW rules of policy `i` (and a DENY rule for `MixedHttp`).
fn rules(kind: Kind, i: usize) -> (Vec<Rule>, Option<Rule>) {
    let one = |r| (vec![r], None);
    match kind {
        Kind::Principals => one(from(principal(i))),
        Kind::Namespaces => one(from(Pred::Namespace(vec![
            NsPat::new(&format!("ns-{i}")).expect("namespace pattern")
        ]))),
        Kind::IpBlocks => one(from(Pred::SourceIp(vec![ip(i).into()]))),
        Kind::RemoteIpBlocks => one(from(Pred::RemoteIp(vec![ip(i).into()]))),
        Kind::Ports => one(Rule {
            to: vec![vec![c(Pred::Port(vec![1000 + i as u16]))]],
            ..Default::default()
        }),
        Kind::MixedHttp => {
            let http_twin = Rule {
                from: vec![vec![c(principal(i))]],
                to: vec![vec![c(Pred::Path(vec![PathPat::Str(StrPat::Prefix(
                    format!("/api/{i}/"),
                ))]))]],
                ..Default::default()
            };
            let deny = Rule {
                to: vec![vec![
                    c(Pred::Port(vec![30_000 + i as u16])),
                    c(Pred::Method(vec![StrPat::Exact("GET".into())])),
                ]],
                ..Default::default()
            };
            (vec![http_twin, from(principal(i))], Some(deny))
        }
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

/// `n` ALLOW policies of one rule kind (Istio's "N policies x 1 value").
fn engine(kind: Kind, n: usize) -> Arc<AuthzEngine> {
    let mut set = PolicySet::default();
    for i in 0..n {
        let (allow, deny) = rules(kind, i);
        set.authz.push(AuthzPolicy {
            meta: meta(format!("p-{i:05}")),
            action: Action::Allow,
            provider: None,
            rules: allow,
        });
        if let Some(d) = deny {
            set.authz.push(AuthzPolicy {
                meta: meta(format!("d-{i:05}")),
                action: Action::Deny,
                provider: None,
                rules: vec![d],
            });
        }
    }
    AuthzEngine::from_policies(
        &AuthzConfig::default(),
        set,
        std::sync::Arc::new(moat_authz::NoFetch),
        false,
    )
    .expect("engine")
}

fn peer(uri: String) -> PeerIdentity {
    let (principal, namespace) = PeerIdentity::from_spiffe_uri(&uri);
    PeerIdentity {
        principal,
        namespace,
        uri_sans: vec![uri],
        ..Default::default()
    }
}

fn connections(c: &mut Criterion) {
    let labels = BTreeMap::new();
    for kind in [
        Kind::Principals,
        Kind::Namespaces,
        Kind::IpBlocks,
        Kind::RemoteIpBlocks,
        Kind::Ports,
        Kind::MixedHttp,
    ] {
        let mut g = c.benchmark_group(format!("tcp/{}", kind.name()));
        for &n in SIZES {
            let e = engine(kind, n);
            for (case, hit) in [("no_match", None), ("last_matches", Some(n - 1))] {
                let i = hit.unwrap_or(usize::MAX / 2);
                let miss = hit.is_none();
                let p = match kind {
                    Kind::Principals | Kind::MixedHttp if !miss => {
                        peer(format!("spiffe://cluster.local/ns/bench/sa/sa-{i}"))
                    }
                    Kind::Namespaces if !miss => {
                        peer(format!("spiffe://cluster.local/ns/ns-{i}/sa/default"))
                    }
                    _ => peer("spiffe://cluster.local/ns/nowhere/sa/nobody".into()),
                };
                let src = match kind {
                    Kind::IpBlocks if !miss => ip(i),
                    _ => "192.168.7.7".parse().expect("IP"),
                };
                let remote = match kind {
                    Kind::RemoteIpBlocks if !miss => ip(i),
                    _ => "192.168.8.8".parse().expect("IP"),
                };
                // Outside every generated port (1000.. and 30000..).
                let port = match kind {
                    Kind::Ports if !miss => 1000 + i as u16,
                    _ => 60_000,
                };
                let input = ConnectionInput {
                    namespace: "bench",
                    labels: &labels,
                    port: Some(port),
                    source_ip: Some(src),
                    remote_ip: Some(remote),
                    dest_ip: None,
                    sni: None,
                    peer: Some(&p),
                };
                let d = e.evaluate_connection(&input);
                assert_eq!(d.allowed, !miss, "{} {n} {case}: {}", kind.name(), d.reason);
                g.bench_with_input(BenchmarkId::new(case, n), &n, |b, _| {
                    b.iter(|| black_box(e.evaluate_connection(black_box(&input))))
                });
            }
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = connections
}
criterion_main!(benches);
