//! Property tests: the compiled index decides exactly like the linear oracle, for requests
//! and for the TCP form of the rules on connections.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderMap;
use ipnet::IpNet;
use moat_authz::compiled::CompiledSet;
use moat_authz::ir::*;
use moat_authz::jwt::VerifiedJwt;
use moat_authz::request::{Attrs, PeerView};
use proptest::prelude::*;
use serde_json::json;

const WORDS: &[&str] = &[
    "a", "ab", "abc", "b", "ba", "/a", "/a/b", "/ab", "x-1", "GET", "POST",
];

fn word() -> impl Strategy<Value = String> {
    prop::sample::select(WORDS).prop_map(String::from)
}

fn str_pat() -> impl Strategy<Value = StrPat> {
    prop_oneof![
        3 => word().prop_map(StrPat::Exact),
        2 => word().prop_map(StrPat::Prefix),
        2 => word().prop_map(StrPat::Suffix),
        1 => Just(StrPat::Any),
    ]
}

fn pats() -> impl Strategy<Value = Vec<StrPat>> {
    prop::collection::vec(str_pat(), 1..4)
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        (0u8..4, 0u8..4).prop_map(|(a, b)| IpAddr::from([10, a, b, 1])),
        (0u16..3).prop_map(|a| IpAddr::from([0x2001, 0xdb8, a, 0, 0, 0, 0, 1])),
    ]
}

fn net() -> impl Strategy<Value = IpNet> {
    (ip(), 0u8..4).prop_map(|(ip, l)| {
        let len = match ip {
            IpAddr::V4(_) => [8, 16, 24, 32][l as usize],
            IpAddr::V6(_) => [16, 32, 48, 128][l as usize],
        };
        IpNet::new(ip, len).unwrap()
    })
}

const NS: &[&str] = &["a", "b", "c"];

fn pred() -> impl Strategy<Value = Pred> {
    prop_oneof![
        pats().prop_map(Pred::Principal),
        prop::collection::vec(
            prop_oneof![
                Just("iss/alice".to_string()),
                Just("iss/bob".to_string()),
                Just("*".to_string()),
                Just("*ice".to_string()),
                Just("iss/*".to_string()),
                Just("iss/al*".to_string()),
                Just("is*".to_string()),
                Just("*ss/bob".to_string()),
            ]
            .prop_map(|v| ReqPrinPat::parse(&v)),
            1..3
        )
        .prop_map(Pred::RequestPrincipal),
        prop::collection::vec(
            prop_oneof![
                prop::sample::select(NS).prop_map(String::from),
                Just("*".to_string()),
                Just("a*".to_string())
            ],
            1..3
        )
        .prop_map(|v| Pred::Namespace(v.iter().map(|x| NsPat::new(x).unwrap()).collect())),
        prop::collection::vec(net(), 1..3).prop_map(Pred::SourceIp),
        prop::collection::vec(net(), 1..3).prop_map(Pred::RemoteIp),
        pats().prop_map(|p| Pred::Host(
            p.into_iter()
                .map(|x| match x {
                    StrPat::Exact(s) => StrPat::Exact(s.to_ascii_lowercase()),
                    StrPat::Prefix(s) => StrPat::Prefix(s.to_ascii_lowercase()),
                    StrPat::Suffix(s) => StrPat::Suffix(s.to_ascii_lowercase()),
                    StrPat::Any => StrPat::Any,
                })
                .collect()
        )),
        prop::collection::vec(prop::sample::select(&[80u16, 443, 8080][..]), 1..3)
            .prop_map(Pred::Port),
        pats().prop_map(Pred::Method),
        prop::collection::vec(
            prop_oneof![
                3 => str_pat().prop_map(PathPat::Str),
                1 => prop::sample::select(&["/a/{*}", "/a/{**}", "/{*}/b", "/{**}"][..])
                    .prop_map(|t| PathPat::parse(t).unwrap()),
            ],
            1..3
        )
        .prop_map(Pred::Path),
        (prop::sample::select(&["x-a", "x-b"][..]), pats())
            .prop_map(|(n, p)| Pred::Header(n.into(), p)),
        pats().prop_map(Pred::Audience),
        pats().prop_map(Pred::Presenter),
        (prop::sample::select(&["grp", "scope"][..]), pats())
            .prop_map(|(c, p)| Pred::Claim(vec![c.into()], p)),
        pats().prop_map(Pred::Sni),
    ]
}

fn clause() -> impl Strategy<Value = Clause> {
    (pred(), prop::bool::weighted(0.25)).prop_map(|(pred, negated)| Clause { pred, negated })
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        prop::collection::vec(prop::collection::vec(clause(), 1..3), 0..3),
        prop::collection::vec(prop::collection::vec(clause(), 1..3), 0..3),
        prop::collection::vec(clause(), 0..3),
    )
        .prop_map(|(from, to, when)| Rule { from, to, when })
}

/// iss, sub, aud, azp, claims.
type JwtParts = (
    String,
    String,
    Vec<String>,
    Option<String>,
    serde_json::Value,
);

#[derive(Debug, Clone)]
struct R {
    host: String,
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    port: Option<u16>,
    src: Option<IpAddr>,
    remote: Option<IpAddr>,
    sni: Option<String>,
    peer: Option<String>,
    jwt: Option<JwtParts>,
}

fn request() -> impl Strategy<Value = R> {
    (
        (word(), word(), word()),
        prop::collection::vec(
            (
                prop::sample::select(&["x-a", "x-b", "x-c"][..]).prop_map(String::from),
                word(),
            ),
            0..3,
        ),
        prop::option::of(prop::sample::select(&[80u16, 443, 8080, 9][..])),
        (prop::option::of(ip()), prop::option::of(ip())),
        prop::option::of(word()),
        prop::option::of(
            (prop::sample::select(NS), word())
                .prop_map(|(ns, sa)| format!("spiffe://td/ns/{ns}/sa/{sa}")),
        ),
        prop::option::of((
            prop::sample::select(&["iss", "iss2", "xiss"][..]).prop_map(String::from),
            prop::sample::select(&["alice", "bob", ""][..]).prop_map(String::from),
            prop::collection::vec(word(), 0..2),
            prop::option::of(word()),
            (prop::collection::vec(word(), 0..3), word())
                .prop_map(|(g, s)| json!({"grp": g, "scope": [s]})),
        )),
    )
        .prop_map(
            |((host, method, path), headers, port, (src, remote), sni, peer, jwt)| R {
                host: host.to_ascii_uppercase(),
                method,
                path,
                headers,
                port,
                src,
                remote,
                sni,
                peer,
                jwt,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, .. ProptestConfig::default() })]

    #[test]
    fn compiled_equals_linear(rules in prop::collection::vec(rule(), 0..12), reqs in prop::collection::vec(request(), 1..8)) {
        let linear = LinearSet { rules: rules.clone() };
        let compiled = CompiledSet::new(&rules);
        for r in &reqs {
            let mut h = HeaderMap::new();
            for (k, v) in &r.headers {
                h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
            }
            let uris: Vec<String> = r.peer.iter().cloned().collect();
            let jwt = r.jwt.as_ref().map(|(iss, sub, aud, azp, c)| VerifiedJwt {
                iss: iss.clone(),
                sub: sub.clone(),
                audiences: aud.clone(),
                presenter: azp.clone(),
                claims: Arc::new(c.clone()),
                claims_for_match: Arc::new(c.clone()),
                exp: None,
                nbf: None,
                payload_b64: String::new(),
            });
            let a = Attrs {
                host: &r.host,
                method: &r.method,
                path: &r.path,
                raw_path: &r.path,
                headers: &h,
                port: r.port,
                source_ip: r.src,
                remote_ip: r.remote,
                dest_ip: None,
                sni: r.sni.as_deref(),
                peer: r.peer.as_ref().map(|_| PeerView { uris: &uris }),
                jwt: jwt.as_ref(),
                // Any word: what matters is that both read a negated host condition
                // against it the same way.
                bare_host: r.port.map(|_| r.path.as_str()),
            };
            prop_assert_eq!(compiled.first_match(&a), linear.first_match(&a), "request {:?}", r);
        }
    }

    #[test]
    fn tcp_forms(rules in prop::collection::vec(rule(), 0..12), reqs in prop::collection::vec(request(), 1..6)) {
        let h = HeaderMap::new();
        for allow in [true, false] {
            // The TCP form of each rule (`None`: skipped), then the rules kept.
            let mut forms: Vec<Option<Rule>> = Vec::new();
            for r in &rules {
                match r.for_tcp(allow) {
                    TcpRule::AsWritten(t) => {
                        prop_assert!(!r.uses_http_only());
                        prop_assert_eq!(&t, r);
                        forms.push(Some(t));
                    }
                    TcpRule::Broadened(t) => {
                        prop_assert!(!allow && r.uses_http_only() && !t.uses_http_only());
                        forms.push(Some(t));
                    }
                    TcpRule::Skipped => {
                        prop_assert!(allow && r.uses_http_only());
                        forms.push(None);
                    }
                }
            }
            let tcp: Vec<Rule> = forms.iter().flatten().cloned().collect();
            let linear = LinearSet { rules: tcp.clone() };
            let compiled = CompiledSet::new(&tcp);
            for r in &reqs {
                let uris: Vec<String> = r.peer.iter().cloned().collect();
                // A connection: no method, host, path, header or token.
                let a = Attrs {
                    host: "",
                    method: "",
                    path: "",
                    raw_path: "",
                    headers: &h,
                    port: r.port,
                    source_ip: r.src,
                    remote_ip: r.remote,
                    dest_ip: None,
                    sni: r.sni.as_deref(),
                    peer: r.peer.as_ref().map(|_| PeerView { uris: &uris }),
                    jwt: None,
                    bare_host: None,
                };
                prop_assert_eq!(compiled.first_match(&a), linear.first_match(&a), "connection {:?}", r);
                // A DENY/AUDIT rule only gets broader: whatever request the rule matched
                // over HTTP, its TCP form matches the same connection.
                if !allow {
                    let mut hh = HeaderMap::new();
                    for (k, v) in &r.headers {
                        hh.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
                    }
                    let full = Attrs { host: &r.host, method: &r.method, path: &r.path, raw_path: &r.path, headers: &hh, ..a };
                    for (orig, t) in rules.iter().zip(&forms) {
                        if let Some(t) = t {
                            prop_assert!(!orig.eval(&full) || t.eval(&a), "{:?} -> {:?} on {:?}", orig, t, r);
                        }
                    }
                }
            }
        }
    }
}
