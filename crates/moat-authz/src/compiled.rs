//! Rules compiled into an index so a decision does not walk every rule.
//!
//! Two layers:
//! - every clause is compiled into set matchers (hash sets for exact values, byte tries
//!   for prefixes and reversed suffixes, CIDR tries for IP blocks), so checking one rule
//!   costs O(fields x key length), not O(values);
//! - every rule registers *anchors*: values of one positive clause that must hold for the
//!   rule to match (the most selective side among `from`, `to` and `when`). A request
//!   looks its attributes up in the anchor maps and only checks the rules found there,
//!   plus the few rules that have no anchor (only negative or wildcard-regex clauses).
//!
//! The result is identical to [`crate::ir::LinearSet`] (property-tested): the lowest
//! matching rule id wins in both.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use foldhash::fast::RandomState;
use ipnet::IpNet;

use crate::ir::{
    claim_values, Clause, NsPat, PathPat, PathTemplate, Pred, ReqPrinPat, Rule, RuleMatcher, SaPat,
    StrPat,
};
use crate::request::Attrs;

type Map<K, V> = HashMap<K, V, RandomState>;
type Set<K> = HashSet<K, RandomState>;

/// A byte trie whose nodes carry payload ids; walking a key visits every stored prefix.
#[derive(Debug, Clone)]
struct ByteTrie {
    nodes: Vec<TrieNode>,
    /// Contiguous copy used for lookups once built (see [`ByteTrie::freeze`]).
    flat: Option<FlatTrie>,
}

#[derive(Debug, Clone, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    ids: Vec<u32>,
}

/// A trie in three flat arrays: node -> (edges range, ids range). Fewer cache misses
/// than one heap allocation per node.
#[derive(Debug, Clone, Default)]
struct FlatTrie {
    nodes: Vec<[u32; 4]>,
    edges: Vec<(u8, u32)>,
    ids: Vec<u32>,
}

impl Default for ByteTrie {
    fn default() -> Self {
        ByteTrie {
            nodes: vec![TrieNode::default()],
            flat: None,
        }
    }
}

impl ByteTrie {
    fn insert(&mut self, key: impl Iterator<Item = u8>, id: u32) {
        self.flat = None;
        let mut cur = 0usize;
        for b in key {
            let pos = self.nodes[cur].children.binary_search_by_key(&b, |c| c.0);
            cur = match pos {
                Ok(i) => self.nodes[cur].children[i].1 as usize,
                Err(i) => {
                    let n = self.nodes.len() as u32;
                    self.nodes.push(TrieNode::default());
                    self.nodes[cur].children.insert(i, (b, n));
                    n as usize
                }
            };
        }
        let ids = &mut self.nodes[cur].ids;
        if ids.last() != Some(&id) {
            ids.push(id);
        }
    }

    /// Builds the flat lookup copy (call once all keys are inserted).
    fn freeze(&mut self) {
        if self.is_empty() {
            return;
        }
        let mut flat = FlatTrie::default();
        for n in &self.nodes {
            let es = flat.edges.len() as u32;
            flat.edges.extend_from_slice(&n.children);
            let is = flat.ids.len() as u32;
            flat.ids.extend_from_slice(&n.ids);
            flat.nodes
                .push([es, n.children.len() as u32, is, n.ids.len() as u32]);
        }
        self.flat = Some(flat);
    }

    fn is_empty(&self) -> bool {
        self.nodes.len() == 1
    }

    /// Calls `f` with the ids of every stored key that is a prefix of `key`.
    #[inline]
    fn walk(&self, key: impl Iterator<Item = u8>, f: &mut impl FnMut(u32)) {
        if self.is_empty() {
            return;
        }
        if let Some(flat) = &self.flat {
            let mut cur = 0usize;
            for b in key {
                let [es, el, _, _] = flat.nodes[cur];
                let edges = &flat.edges[es as usize..(es + el) as usize];
                match edges.binary_search_by_key(&b, |e| e.0) {
                    Ok(i) => cur = edges[i].1 as usize,
                    Err(_) => return,
                }
                let [_, _, is, il] = flat.nodes[cur];
                for &id in &flat.ids[is as usize..(is + il) as usize] {
                    f(id);
                }
            }
            return;
        }
        let mut cur = 0usize;
        for b in key {
            let node = &self.nodes[cur];
            match node.children.binary_search_by_key(&b, |c| c.0) {
                Ok(i) => cur = node.children[i].1 as usize,
                Err(_) => return,
            }
            for &id in &self.nodes[cur].ids {
                f(id);
            }
        }
    }
}

/// String values (exact / prefix / suffix / presence) mapped to ids.
#[derive(Debug, Clone, Default)]
struct StrIndex {
    exact: Map<Box<str>, Vec<u32>>,
    prefix: ByteTrie,
    suffix: ByteTrie,
    any: Vec<u32>,
    /// Compare case-insensitively (hosts): keys are stored lowercase.
    ci: bool,
}

impl StrIndex {
    fn new(ci: bool) -> Self {
        StrIndex {
            ci,
            ..Default::default()
        }
    }

    fn insert(&mut self, p: &StrPat, id: u32) {
        match p {
            StrPat::Any => push_unique(&mut self.any, id),
            StrPat::Exact(e) => push_unique(self.exact.entry(e.as_str().into()).or_default(), id),
            StrPat::Prefix(x) => self.prefix.insert(x.bytes(), id),
            StrPat::Suffix(x) => self.suffix.insert(x.bytes().rev(), id),
        }
    }

    fn freeze(&mut self) {
        self.prefix.freeze();
        self.suffix.freeze();
    }

    /// Ids whose value matches `s`. `any` ids fire when `any_ok` (presence semantics
    /// differ: headers and hosts accept empty values, other attributes do not).
    #[inline]
    fn lookup(&self, s: &str, any_ok: bool, f: &mut impl FnMut(u32)) {
        if any_ok {
            for &id in &self.any {
                f(id);
            }
        }
        if self.ci {
            if !self.exact.is_empty() {
                let lower;
                let key: &str = if s.bytes().any(|b| b.is_ascii_uppercase()) {
                    lower = s.to_ascii_lowercase();
                    &lower
                } else {
                    s
                };
                if let Some(ids) = self.exact.get(key) {
                    ids.iter().for_each(|&i| f(i));
                }
            }
            self.prefix
                .walk(s.bytes().map(|b| b.to_ascii_lowercase()), f);
            self.suffix
                .walk(s.bytes().rev().map(|b| b.to_ascii_lowercase()), f);
        } else {
            if let Some(ids) = self.exact.get(s) {
                ids.iter().for_each(|&i| f(i));
            }
            self.prefix.walk(s.bytes(), f);
            self.suffix.walk(s.bytes().rev(), f);
        }
    }

    fn matches(&self, s: &str, any_ok: bool) -> bool {
        if any_ok && !self.any.is_empty() {
            return true;
        }
        let mut hit = false;
        self.lookup(s, false, &mut |_| hit = true);
        hit
    }
}

fn push_unique(v: &mut Vec<u32>, id: u32) {
    if v.last() != Some(&id) {
        v.push(id);
    }
}

/// CIDR blocks mapped to ids (a binary trie per address family).
#[derive(Debug, Clone, Default)]
struct IpIndex {
    v4: BitTrie,
    v6: BitTrie,
}

#[derive(Debug, Clone)]
struct BitTrie {
    nodes: Vec<([u32; 2], Vec<u32>)>,
}

impl Default for BitTrie {
    fn default() -> Self {
        BitTrie {
            nodes: vec![([0, 0], Vec::new())],
        }
    }
}

impl BitTrie {
    fn insert(&mut self, bits: u128, width: u32, len: u8, id: u32) {
        let mut cur = 0usize;
        for i in 0..u32::from(len) {
            let bit = ((bits >> (width - 1 - i)) & 1) as usize;
            let next = self.nodes[cur].0[bit];
            cur = if next == 0 {
                let n = self.nodes.len() as u32;
                self.nodes.push(([0, 0], Vec::new()));
                self.nodes[cur].0[bit] = n;
                n as usize
            } else {
                next as usize
            };
        }
        push_unique(&mut self.nodes[cur].1, id);
    }

    #[inline]
    fn walk(&self, bits: u128, width: u32, f: &mut impl FnMut(u32)) {
        if self.nodes.len() == 1 && self.nodes[0].1.is_empty() {
            return;
        }
        let mut cur = 0usize;
        for &id in &self.nodes[0].1 {
            f(id);
        }
        for i in 0..width {
            let bit = ((bits >> (width - 1 - i)) & 1) as usize;
            let next = self.nodes[cur].0[bit];
            if next == 0 {
                return;
            }
            cur = next as usize;
            for &id in &self.nodes[cur].1 {
                f(id);
            }
        }
    }
}

impl IpIndex {
    fn insert(&mut self, net: &IpNet, id: u32) {
        match net {
            IpNet::V4(n) => {
                self.v4
                    .insert(u128::from(u32::from(n.network())), 32, n.prefix_len(), id)
            }
            IpNet::V6(n) => self
                .v6
                .insert(u128::from(n.network()), 128, n.prefix_len(), id),
        }
    }

    #[inline]
    fn lookup(&self, ip: IpAddr, f: &mut impl FnMut(u32)) {
        match ip {
            IpAddr::V4(a) => self.v4.walk(u128::from(u32::from(a)), 32, f),
            IpAddr::V6(a) => self.v6.walk(u128::from(a), 128, f),
        }
    }

    fn matches(&self, ip: Option<IpAddr>) -> bool {
        let Some(ip) = ip else { return false };
        let mut hit = false;
        self.lookup(ip, &mut |_| hit = true);
        hit
    }
}

/// Request principal values: exact `iss/sub` pairs hashed, issuer-keyed forms hashed by
/// issuer, the rest (suffix/prefix forms) kept in a short list.
#[derive(Debug, Clone, Default)]
struct RpIndex {
    exact: Map<Box<str>, Map<Box<str>, Vec<u32>>>,
    by_iss: Map<Box<str>, Vec<(ReqPrinPat, u32)>>,
    other: Vec<(ReqPrinPat, u32)>,
}

impl RpIndex {
    fn insert(&mut self, p: &ReqPrinPat, id: u32) {
        match p {
            ReqPrinPat::Exact(i, s) => push_unique(
                self.exact
                    .entry(i.as_str().into())
                    .or_default()
                    .entry(s.as_str().into())
                    .or_default(),
                id,
            ),
            ReqPrinPat::IssExactSubAny(i) | ReqPrinPat::IssExactSubPrefix(i, _) => self
                .by_iss
                .entry(i.as_str().into())
                .or_default()
                .push((p.clone(), id)),
            _ => self.other.push((p.clone(), id)),
        }
    }

    #[inline]
    fn lookup(&self, iss: &str, sub: &str, f: &mut impl FnMut(u32)) {
        if let Some(subs) = self.exact.get(iss) {
            if let Some(ids) = subs.get(sub) {
                if !sub.is_empty() {
                    ids.iter().for_each(|&i| f(i));
                }
            }
        }
        if let Some(list) = self.by_iss.get(iss) {
            for (p, id) in list {
                if p.matches(iss, sub) {
                    f(*id);
                }
            }
        }
        for (p, id) in &self.other {
            if p.matches(iss, sub) {
                f(*id);
            }
        }
    }
}

/// Namespace values: plain names hashed (compared with every `/ns/<x>/` segment of the
/// URI), wildcard values kept as regexes.
#[derive(Debug, Clone, Default)]
struct NsIndex {
    exact: Map<Box<str>, Vec<u32>>,
    re: Vec<(NsPat, u32)>,
}

impl NsIndex {
    fn insert(&mut self, p: &NsPat, id: u32) {
        if p.raw.contains('*') || p.raw.contains('/') {
            self.re.push((p.clone(), id));
        } else {
            push_unique(self.exact.entry(p.raw.as_str().into()).or_default(), id);
        }
    }

    #[inline]
    fn lookup(&self, uri: &str, f: &mut impl FnMut(u32)) {
        if !self.exact.is_empty() {
            let mut rest = uri;
            while let Some(i) = rest.find("/ns/") {
                let after = &rest[i + 4..];
                if let Some(end) = after.find('/') {
                    if let Some(ids) = self.exact.get(&after[..end]) {
                        ids.iter().for_each(|&i| f(i));
                    }
                }
                rest = &rest[i + 1..];
            }
        }
        for (p, id) in &self.re {
            if p.re.is_match(uri) {
                f(*id);
            }
        }
    }
}

/// Path values: string forms in a [`StrIndex`], templates checked one by one (their
/// literal prefix serves as anchor).
#[derive(Debug, Clone, Default)]
struct PathIndex {
    strs: StrIndex,
    templates: Vec<(PathTemplate, u32)>,
    template_prefix: ByteTrie,
}

impl PathIndex {
    fn insert(&mut self, p: &PathPat, id: u32) {
        match p {
            PathPat::Str(s) => self.strs.insert(s, id),
            PathPat::Template(t) => {
                let idx = self.templates.len() as u32;
                self.templates.push((t.clone(), id));
                // Every path the template matches starts with its literal prefix.
                self.template_prefix.insert(t.literal_prefix().bytes(), idx);
            }
        }
    }

    fn freeze(&mut self) {
        self.strs.freeze();
        self.template_prefix.freeze();
    }

    #[inline]
    fn lookup(&self, path: &str, f: &mut impl FnMut(u32)) {
        self.strs.lookup(path, true, f);
        if !self.templates.is_empty() {
            let templates = &self.templates;
            self.template_prefix.walk(path.bytes(), &mut |idx| {
                let (t, id) = &templates[idx as usize];
                if t.matches(path) {
                    f(*id);
                }
            });
        }
    }

    fn matches(&self, path: &str) -> bool {
        if self.strs.matches(path, true) {
            return true;
        }
        // The few templates of one clause are cheaper to try than a trie walk.
        if self.templates.len() <= 8 {
            return self.templates.iter().any(|(t, _)| t.matches(path));
        }
        let mut hit = false;
        self.lookup(path, &mut |_| hit = true);
        hit
    }
}

/// A clause compiled into set matchers.
#[derive(Debug, Clone)]
enum CPred {
    Principal(StrIndex),
    RequestPrincipal(RpIndex),
    Namespace(NsIndex),
    ServiceAccount(Vec<SaPat>),
    SourceIp(IpIndex),
    RemoteIp(IpIndex),
    DestIp(IpIndex),
    Host(StrIndex),
    Port(Vec<u16>),
    Method(StrIndex),
    Path(PathIndex),
    Header(String, StrIndex),
    Audience(StrIndex),
    Presenter(StrIndex),
    Claim(Vec<String>, StrIndex),
    Sni(StrIndex),
}

fn str_index(pats: &[StrPat], ci: bool) -> StrIndex {
    let mut idx = StrIndex::new(ci);
    for p in pats {
        idx.insert(p, 0);
    }
    idx.freeze();
    idx
}

fn ip_index(nets: &[IpNet]) -> IpIndex {
    let mut idx = IpIndex::default();
    for n in nets {
        idx.insert(n, 0);
    }
    idx
}

impl CPred {
    fn compile(p: &Pred) -> CPred {
        match p {
            Pred::Principal(v) => CPred::Principal(str_index(v, false)),
            Pred::RequestPrincipal(v) => {
                let mut idx = RpIndex::default();
                v.iter().for_each(|p| idx.insert(p, 0));
                CPred::RequestPrincipal(idx)
            }
            Pred::Namespace(v) => {
                let mut idx = NsIndex::default();
                v.iter().for_each(|p| idx.insert(p, 0));
                CPred::Namespace(idx)
            }
            Pred::ServiceAccount(v) => CPred::ServiceAccount(v.clone()),
            Pred::SourceIp(v) => CPred::SourceIp(ip_index(v)),
            Pred::RemoteIp(v) => CPred::RemoteIp(ip_index(v)),
            Pred::DestIp(v) => CPred::DestIp(ip_index(v)),
            Pred::Host(v) => CPred::Host(str_index(v, true)),
            Pred::Port(v) => {
                let mut v = v.clone();
                v.sort_unstable();
                v.dedup();
                CPred::Port(v)
            }
            Pred::Method(v) => CPred::Method(str_index(v, false)),
            Pred::Path(v) => {
                let mut idx = PathIndex::default();
                v.iter().for_each(|p| idx.insert(p, 0));
                idx.freeze();
                CPred::Path(idx)
            }
            Pred::Header(n, v) => CPred::Header(n.clone(), str_index(v, false)),
            Pred::Audience(v) => CPred::Audience(str_index(v, false)),
            Pred::Presenter(v) => CPred::Presenter(str_index(v, false)),
            Pred::Claim(path, v) => CPred::Claim(path.clone(), str_index(v, false)),
            Pred::Sni(v) => CPred::Sni(str_index(v, false)),
        }
    }

    #[inline]
    fn eval(&self, a: &Attrs<'_>) -> bool {
        match self {
            CPred::Principal(idx) => match a.peer {
                Some(peer) => {
                    !idx.any.is_empty()
                        || peer.uris.iter().any(|u| {
                            u.strip_prefix("spiffe://")
                                .is_some_and(|r| idx.matches(r, false))
                        })
                }
                None => false,
            },
            CPred::RequestPrincipal(idx) => match a.jwt {
                Some(j) => {
                    let mut hit = false;
                    idx.lookup(&j.iss, &j.sub, &mut |_| hit = true);
                    hit
                }
                None => false,
            },
            CPred::Namespace(idx) => a.peer_uris().any(|u| {
                let mut hit = false;
                idx.lookup(u, &mut |_| hit = true);
                hit
            }),
            CPred::ServiceAccount(v) => a.peer_uris().any(|u| v.iter().any(|p| p.re.is_match(u))),
            CPred::SourceIp(idx) => idx.matches(a.source_ip),
            CPred::RemoteIp(idx) => idx.matches(a.remote_ip),
            CPred::DestIp(idx) => idx.matches(a.dest_ip),
            CPred::Host(idx) => idx.matches(a.host, true),
            CPred::Port(v) => a.port.is_some_and(|p| v.binary_search(&p).is_ok()),
            CPred::Method(idx) => idx.matches(a.method, !a.method.is_empty()),
            CPred::Path(idx) => idx.matches(a.path),
            CPred::Header(name, idx) => match a.header(name) {
                Some(v) => idx.matches(&v, true),
                None => false,
            },
            CPred::Audience(idx) => a
                .jwt
                .is_some_and(|j| j.audiences.iter().any(|s| idx.matches(s, !s.is_empty()))),
            CPred::Presenter(idx) => a
                .jwt
                .and_then(|j| j.presenter.as_deref())
                .is_some_and(|s| idx.matches(s, !s.is_empty())),
            CPred::Claim(path, idx) => a.jwt.is_some_and(|j| {
                claim_values(&j.claims_for_match, path)
                    .iter()
                    .any(|s| idx.matches(s, !s.is_empty()))
            }),
            CPred::Sni(idx) => a.sni.is_some_and(|s| idx.matches(s, !s.is_empty())),
        }
    }
}

#[derive(Debug, Clone)]
struct CClause {
    pred: CPred,
    negated: bool,
    /// A negated host condition: it fails on [`Attrs::bare_host`] too.
    not_host: bool,
}

impl CClause {
    #[inline]
    fn eval(&self, a: &Attrs<'_>) -> bool {
        if self.not_host {
            if let Some(host) = a.bare_host {
                return !self.pred.eval(a) && !self.pred.eval(&Attrs { host, ..*a });
            }
        }
        self.pred.eval(a) != self.negated
    }
}

/// A rule with compiled clauses.
#[derive(Debug, Clone)]
struct CRule {
    from: Vec<Vec<CClause>>,
    to: Vec<Vec<CClause>>,
    when: Vec<CClause>,
}

fn compile_clauses(cs: &[Clause]) -> Vec<CClause> {
    cs.iter()
        .map(|c| CClause {
            pred: CPred::compile(&c.pred),
            negated: c.negated,
            not_host: c.negated && c.reads_host(),
        })
        .collect()
}

impl CRule {
    fn compile(r: &Rule) -> CRule {
        CRule {
            from: r.from.iter().map(|s| compile_clauses(s)).collect(),
            to: r.to.iter().map(|s| compile_clauses(s)).collect(),
            when: compile_clauses(&r.when),
        }
    }

    #[inline]
    fn eval(&self, a: &Attrs<'_>) -> bool {
        self.when.iter().all(|c| c.eval(a))
            && (self.to.is_empty() || self.to.iter().any(|o| o.iter().all(|c| c.eval(a))))
            && (self.from.is_empty() || self.from.iter().any(|s| s.iter().all(|c| c.eval(a))))
    }
}

/// Anchor maps: attribute values -> ids of rules that need them.
#[derive(Debug, Clone, Default)]
struct AnchorIndex {
    path: PathIndex,
    host: StrIndex,
    method: StrIndex,
    port: Map<u16, Vec<u32>>,
    principal: StrIndex,
    principal_any: Vec<u32>,
    namespace: NsIndex,
    source_ip: IpIndex,
    remote_ip: IpIndex,
    dest_ip: IpIndex,
    request_principal: RpIndex,
    headers: Map<Box<str>, StrIndex>,
    audience: StrIndex,
    presenter: StrIndex,
    claims: Vec<(Vec<String>, StrIndex)>,
    sni: StrIndex,
    /// Which families of anchors are in use (skips empty lookups).
    has: Set<u8>,
}

const K_PATH: u8 = 0;
const K_HOST: u8 = 1;
const K_METHOD: u8 = 2;
const K_PORT: u8 = 3;
const K_PRINCIPAL: u8 = 4;
const K_NS: u8 = 5;
const K_SIP: u8 = 6;
const K_RIP: u8 = 7;
const K_DIP: u8 = 8;
const K_RP: u8 = 9;
const K_HDR: u8 = 10;
const K_AUD: u8 = 11;
const K_AZP: u8 = 12;
const K_CLAIM: u8 = 13;
const K_SNI: u8 = 14;

fn str_score(pats: &[StrPat]) -> u32 {
    pats.iter()
        .map(|p| match p {
            StrPat::Exact(_) => 1,
            StrPat::Prefix(x) | StrPat::Suffix(x) => {
                if x.len() >= 4 {
                    3
                } else {
                    6
                }
            }
            StrPat::Any => 60,
        })
        .max()
        .unwrap_or(u32::MAX)
}

/// Selectivity score of a positive clause as an anchor (lower is better), `None` when
/// it cannot serve as one.
fn anchor_score(c: &Clause) -> Option<u32> {
    if c.negated {
        return None;
    }
    Some(match &c.pred {
        Pred::Path(v) => v
            .iter()
            .map(|p| match p {
                PathPat::Str(s) => str_score(std::slice::from_ref(s)),
                PathPat::Template(_) => 8,
            })
            .max()?,
        Pred::Host(v) => str_score(v) + 2,
        Pred::Method(v) => str_score(v) + 20,
        Pred::Port(_) => 25,
        Pred::Principal(v) => str_score(v),
        Pred::Namespace(v) => {
            if v.iter()
                .all(|p| !p.raw.contains('*') && !p.raw.contains('/'))
            {
                4
            } else {
                return None;
            }
        }
        Pred::SourceIp(v) | Pred::RemoteIp(v) | Pred::DestIp(v) => v
            .iter()
            .map(|n| 2 + (32u32.saturating_sub(u32::from(n.prefix_len()).min(32))))
            .max()?,
        Pred::RequestPrincipal(v) => v
            .iter()
            .map(|p| match p {
                ReqPrinPat::Exact(..) => 1,
                ReqPrinPat::IssExactSubAny(_) | ReqPrinPat::IssExactSubPrefix(..) => 5,
                _ => 40,
            })
            .max()?,
        Pred::Header(name, v) => {
            if name.starts_with(':') || name == "host" {
                return None;
            }
            str_score(v) + 1
        }
        Pred::Audience(v) | Pred::Presenter(v) | Pred::Sni(v) => str_score(v) + 3,
        Pred::Claim(_, v) => str_score(v) + 2,
        Pred::ServiceAccount(_) => return None,
    })
}

impl AnchorIndex {
    fn freeze(&mut self) {
        self.path.freeze();
        self.host.freeze();
        self.method.freeze();
        self.principal.freeze();
        self.headers.values_mut().for_each(StrIndex::freeze);
        self.audience.freeze();
        self.presenter.freeze();
        self.claims.iter_mut().for_each(|(_, i)| i.freeze());
        self.sni.freeze();
    }

    fn add(&mut self, c: &Clause, id: u32) {
        let kind = match &c.pred {
            Pred::Path(v) => {
                v.iter().for_each(|p| self.path.insert(p, id));
                K_PATH
            }
            Pred::Host(v) => {
                self.host.ci = true;
                v.iter().for_each(|p| self.host.insert(p, id));
                K_HOST
            }
            Pred::Method(v) => {
                v.iter().for_each(|p| self.method.insert(p, id));
                K_METHOD
            }
            Pred::Port(v) => {
                v.iter()
                    .for_each(|p| push_unique(self.port.entry(*p).or_default(), id));
                K_PORT
            }
            Pred::Principal(v) => {
                for p in v {
                    match p {
                        StrPat::Any => push_unique(&mut self.principal_any, id),
                        p => self.principal.insert(p, id),
                    }
                }
                K_PRINCIPAL
            }
            Pred::Namespace(v) => {
                v.iter().for_each(|p| self.namespace.insert(p, id));
                K_NS
            }
            Pred::SourceIp(v) => {
                v.iter().for_each(|n| self.source_ip.insert(n, id));
                K_SIP
            }
            Pred::RemoteIp(v) => {
                v.iter().for_each(|n| self.remote_ip.insert(n, id));
                K_RIP
            }
            Pred::DestIp(v) => {
                v.iter().for_each(|n| self.dest_ip.insert(n, id));
                K_DIP
            }
            Pred::RequestPrincipal(v) => {
                v.iter().for_each(|p| self.request_principal.insert(p, id));
                K_RP
            }
            Pred::Header(name, v) => {
                let idx = self.headers.entry(name.as_str().into()).or_default();
                v.iter().for_each(|p| idx.insert(p, id));
                K_HDR
            }
            Pred::Audience(v) => {
                v.iter().for_each(|p| self.audience.insert(p, id));
                K_AUD
            }
            Pred::Presenter(v) => {
                v.iter().for_each(|p| self.presenter.insert(p, id));
                K_AZP
            }
            Pred::Claim(path, v) => {
                let pos = match self.claims.iter().position(|(p, _)| p == path) {
                    Some(i) => i,
                    None => {
                        self.claims.push((path.clone(), StrIndex::default()));
                        self.claims.len() - 1
                    }
                };
                v.iter().for_each(|p| self.claims[pos].1.insert(p, id));
                K_CLAIM
            }
            Pred::Sni(v) => {
                v.iter().for_each(|p| self.sni.insert(p, id));
                K_SNI
            }
            Pred::ServiceAccount(_) => return,
        };
        self.has.insert(kind);
    }

    #[inline]
    fn candidates(&self, a: &Attrs<'_>, f: &mut impl FnMut(u32)) {
        let has = |k: u8| self.has.contains(&k);
        if has(K_PATH) {
            self.path.lookup(a.path, f);
        }
        if has(K_HOST) {
            self.host.lookup(a.host, true, f);
        }
        if has(K_METHOD) {
            self.method.lookup(a.method, !a.method.is_empty(), f);
        }
        if has(K_PORT) {
            if let Some(ids) = a.port.and_then(|p| self.port.get(&p)) {
                ids.iter().for_each(|&i| f(i));
            }
        }
        if has(K_PRINCIPAL) {
            if let Some(peer) = a.peer {
                self.principal_any.iter().for_each(|&i| f(i));
                for u in peer.uris {
                    if let Some(r) = u.strip_prefix("spiffe://") {
                        self.principal.lookup(r, false, f);
                    }
                }
            }
        }
        if has(K_NS) {
            for u in a.peer_uris() {
                self.namespace.lookup(u, f);
            }
        }
        if has(K_SIP) {
            if let Some(ip) = a.source_ip {
                self.source_ip.lookup(ip, f);
            }
        }
        if has(K_RIP) {
            if let Some(ip) = a.remote_ip {
                self.remote_ip.lookup(ip, f);
            }
        }
        if has(K_DIP) {
            if let Some(ip) = a.dest_ip {
                self.dest_ip.lookup(ip, f);
            }
        }
        if has(K_SNI) {
            if let Some(s) = a.sni {
                self.sni.lookup(s, !s.is_empty(), f);
            }
        }
        if has(K_HDR) {
            if self.headers.len() <= 4 {
                for (name, idx) in &self.headers {
                    if let Some(v) = crate::request::header_joined(a.headers, name) {
                        idx.lookup(&v, true, f);
                    }
                }
            } else {
                for name in a.headers.keys() {
                    if let Some(idx) = self.headers.get(name.as_str()) {
                        if let Some(v) = crate::request::header_joined(a.headers, name.as_str()) {
                            idx.lookup(&v, true, f);
                        }
                    }
                }
            }
        }
        if let Some(j) = a.jwt {
            if has(K_RP) {
                self.request_principal.lookup(&j.iss, &j.sub, f);
            }
            if has(K_AUD) {
                for s in &j.audiences {
                    self.audience.lookup(s, !s.is_empty(), f);
                }
            }
            if has(K_AZP) {
                if let Some(s) = j.presenter.as_deref() {
                    self.presenter.lookup(s, !s.is_empty(), f);
                }
            }
            if has(K_CLAIM) {
                for (path, idx) in &self.claims {
                    for s in claim_values(&j.claims_for_match, path) {
                        idx.lookup(s, !s.is_empty(), f);
                    }
                }
            }
        }
    }
}

/// A rule set compiled into an anchor index.
#[derive(Debug, Clone, Default)]
pub struct CompiledSet {
    rules: Vec<CRule>,
    index: AnchorIndex,
    /// Rules without an anchor, checked in order.
    always: Vec<u32>,
}

/// The anchors of one side (`from` or `to`): every entry needs an anchorable clause.
fn side_anchors(entries: &[Vec<Clause>]) -> Option<(u32, Vec<&Clause>)> {
    if entries.is_empty() {
        return None;
    }
    let mut worst = 0;
    let mut picks = Vec::with_capacity(entries.len());
    for e in entries {
        let best = e
            .iter()
            .filter_map(|c| anchor_score(c).map(|s| (s, c)))
            .min_by_key(|(s, _)| *s)?;
        worst = worst.max(best.0);
        picks.push(best.1);
    }
    Some((worst, picks))
}

/// The best anchor side of a rule: the clauses to register (one per entry of that side).
fn choose_anchors(r: &Rule) -> Option<Vec<&Clause>> {
    let when = r
        .when
        .iter()
        .filter_map(|c| anchor_score(c).map(|s| (s, vec![c])))
        .min_by_key(|(s, _)| *s);
    [when, side_anchors(&r.to), side_anchors(&r.from)]
        .into_iter()
        .flatten()
        .min_by_key(|(s, _)| *s)
        .map(|b| b.1)
}

impl CompiledSet {
    /// Compiles rules (ids are their positions).
    pub fn new(rules: &[Rule]) -> CompiledSet {
        let mut set = CompiledSet::default();
        for (id, r) in rules.iter().enumerate() {
            let id = id as u32;
            set.rules.push(CRule::compile(r));
            match choose_anchors(r) {
                Some(clauses) => clauses.into_iter().for_each(|c| set.index.add(c, id)),
                None => set.always.push(id),
            }
        }
        set.index.freeze();
        set
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether the set has no rule.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Number of rules checked on every request (no anchor).
    pub fn unanchored(&self) -> usize {
        self.always.len()
    }
}

impl RuleMatcher for CompiledSet {
    fn first_match(&self, a: &Attrs<'_>) -> Option<u32> {
        if self.rules.is_empty() {
            return None;
        }
        let mut best = u32::MAX;
        let rules = &self.rules;
        self.index.candidates(a, &mut |id| {
            if id < best && rules[id as usize].eval(a) {
                best = id;
            }
        });
        for &id in &self.always {
            if id >= best {
                break;
            }
            if rules[id as usize].eval(a) {
                best = id;
                break;
            }
        }
        (best != u32::MAX).then_some(best)
    }
}
