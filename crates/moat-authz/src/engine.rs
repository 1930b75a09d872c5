//! The engine: per-workload compiled views, the decision algorithm, the request-headers
//! phase and background JWKS refresh.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwap;
use foldhash::fast::RandomState;
use http::{HeaderMap, HeaderValue, StatusCode};
use moat_core::{
    ArrivedHead, Body, BodyNeed, EventAction, PeerIdentity, Reply, RequestAuth, RequestBodyPhase,
    RequestCtx, RequestHeadersPhase, SecurityEvent, Verdict,
};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::compiled::CompiledSet;
use crate::fetch::JwksFetcher;
use crate::ir::{Reads, Rule, RuleMatcher, TcpRule};
use crate::jwt::{self, Authn, JwksOrigin, KeySet, KeySource, Provider, TokenCache, VerifiedJwt};
use crate::loader::{self, Action, MtlsMode, PeerAuthn, PolicySet};
use crate::request::{
    bare_host, body_method_overrides, merges_slashes, method_overrides, normalize_path,
    remote_ip_from_xff, without_path_parameters, Attrs, BadPath, BodyForm, HostPort,
    MethodOverrides, PathNormalization, PathParameters, PeerView, TooManyOverrides,
    MAX_METHOD_OVERRIDES,
};
use crate::AuthzError;

/// Configuration of access control (the `authz:` section of moat's config).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthzConfig {
    /// Whether access control runs at all.
    pub enabled: bool,
    /// Istio policy files or directories (`*.yaml`/`*.yml`, recursive).
    pub policies: Vec<PathBuf>,
    /// Istio root namespace: its policies apply to every workload (default `istio-system`).
    pub root_namespace: String,
    /// Trusted proxies in front of moat for `remote.ip` / `remoteIpBlocks`
    /// (Envoy `xff_num_trusted_hops`). Unset: use the proxy's `ctx.client_ip`.
    pub trusted_proxies: Option<u32>,
    /// Path normalization before matching `paths` (Istio mesh `pathNormalization`).
    pub path_normalization: PathNormalization,
    /// How `;` path parameters are read when `paths` are matched (default `both`: the
    /// path must be allowed with and without them, see [`PathParameters`]).
    pub path_parameters: PathParameters,
    /// How methods named in method-override fields and `_method` are read (default
    /// `both`: the request must be allowed as each, see [`MethodOverrides`]).
    pub method_overrides: MethodOverrides,
    /// Whether DENY policies also read the host without its port and trailing dot
    /// (default `both`, see [`HostPort`]).
    pub host_port: HostPort,
    /// Maximum number of verified tokens cached (0 disables the cache).
    pub jwt_cache_size: usize,
    /// Clock skew allowed on `exp`/`nbf` (Envoy default 60s).
    #[serde(with = "moat_config::duration")]
    pub jwt_clock_skew: Duration,
    /// How often fetched JWKS are refreshed.
    #[serde(with = "moat_config::duration")]
    pub jwks_refresh_interval: Duration,
    /// Retry delay after a failed fetch while a JWKS has no keys yet.
    #[serde(with = "moat_config::duration")]
    pub jwks_retry_interval: Duration,
    /// Evaluate and raise events, never block.
    pub monitor_only: bool,
    /// Most distinct (namespace, labels) workloads whose compiled view is cached.
    pub max_workloads: usize,
    /// External authorizers of `action: CUSTOM` policies (Istio MeshConfig
    /// `extensionProviders`).
    pub extension_providers: Vec<crate::ExtensionProvider>,
}

impl Default for AuthzConfig {
    fn default() -> Self {
        AuthzConfig {
            enabled: false,
            policies: Vec::new(),
            root_namespace: "istio-system".into(),
            trusted_proxies: None,
            path_normalization: PathNormalization::Base,
            path_parameters: PathParameters::Both,
            method_overrides: MethodOverrides::Both,
            host_port: HostPort::Both,
            jwt_cache_size: 10_000,
            jwt_clock_skew: Duration::from_secs(60),
            jwks_refresh_interval: Duration::from_secs(300),
            jwks_retry_interval: Duration::from_secs(10),
            monitor_only: false,
            max_workloads: 4096,
            extension_providers: Vec::new(),
        }
    }
}

/// Rules of one action for one workload, compiled, with the policy of each rule.
#[derive(Debug, Default)]
struct Group {
    set: CompiledSet,
    /// `(policy id, rule index)` per rule id.
    meta: Vec<(Arc<str>, u32)>,
    /// Number of policies in the group (an ALLOW policy without rules still counts).
    policies: usize,
    /// TCP groups: ALLOW rules skipped because they use HTTP-only fields.
    skipped: usize,
    /// The attributes with more than one reading that some rule looks at.
    reads: Reads,
    /// ALLOW groups under `host_port: both` whose rules negate a host: such a condition
    /// must not match the host without its port either ([`Attrs::bare_host`]).
    not_hosts_bare: bool,
}

impl Group {
    fn build(policies: &[&loader::AuthzPolicy]) -> Group {
        let mut g = Group {
            policies: policies.len(),
            ..Default::default()
        };
        let mut rules: Vec<Rule> = Vec::new();
        for p in policies {
            let id: Arc<str> = p.meta.id().into();
            for (i, r) in p.rules.iter().enumerate() {
                g.reads = g.reads | r.reads();
                rules.push(r.clone());
                g.meta.push((id.clone(), i as u32));
            }
        }
        g.set = CompiledSet::new(&rules);
        g
    }

    /// The group as Istio builds it for a TCP filter chain: ALLOW rules with an
    /// HTTP-only field are skipped, DENY/AUDIT rules lose their HTTP-only conditions.
    fn build_tcp(policies: &[&loader::AuthzPolicy], action: Action) -> Group {
        let mut g = Group {
            policies: policies.len(),
            ..Default::default()
        };
        let mut rules: Vec<Rule> = Vec::new();
        for p in policies {
            let id: Arc<str> = p.meta.id().into();
            for (i, r) in p.rules.iter().enumerate() {
                match r.for_tcp(action == Action::Allow) {
                    TcpRule::AsWritten(r) | TcpRule::Broadened(r) => {
                        rules.push(r);
                        g.meta.push((id.clone(), i as u32));
                    }
                    TcpRule::Skipped => g.skipped += 1,
                }
            }
        }
        g.set = CompiledSet::new(&rules);
        g
    }

    #[inline(always)]
    fn first(&self, a: &Attrs<'_>) -> Option<(Arc<str>, u32)> {
        let bare = if self.not_hosts_bare {
            bare_host(a.host)
        } else {
            None
        };
        let id = match bare {
            Some(host) => self.set.first_match(&Attrs {
                bare_host: Some(host),
                ..*a
            }),
            None => self.set.first_match(a),
        };
        id.map(|id| self.meta[id as usize].clone())
    }
}

/// The resolved PeerAuthentication of a workload.
#[derive(Debug, Clone)]
pub(crate) struct PeerPolicy {
    /// Workload-wide mode (never `Unset`).
    pub(crate) mode: MtlsMode,
    /// The PeerAuthentication that set it (`namespace/name`), if any.
    pub(crate) policy: Option<String>,
    /// `portLevelMtls` overrides: port, mode, policy.
    pub(crate) ports: Vec<(u16, MtlsMode, String)>,
}

/// The CUSTOM/AUDIT/DENY/ALLOW groups of a workload for TCP connections (built on
/// first use).
#[derive(Debug)]
struct TcpView {
    /// CUSTOM rules as Istio builds them for a TCP filter chain: like DENY rules (their
    /// HTTP-only conditions dropped), so a rule naming a path still sends the
    /// connection to the provider.
    custom: Group,
    audit: Group,
    deny: Group,
    allow: Group,
    dry_audit: Group,
    dry_deny: Group,
    dry_allow: Group,
}

/// Everything that applies to one (namespace, labels) workload.
#[derive(Debug)]
struct View {
    namespace: String,
    labels: BTreeMap<String, String>,
    /// Indices in `PolicySet::authz` of the AuthorizationPolicies that apply, by
    /// namespace/name (Envoy's order).
    applicable: Vec<usize>,
    /// The same policies compiled for TCP connections, on first use.
    tcp: OnceLock<TcpView>,
    /// CUSTOM policies, with each one's provider by policy id.
    custom: Group,
    custom_providers: HashMap<Arc<str>, Arc<str>>,
    audit: Group,
    deny: Group,
    allow: Group,
    dry_audit: Group,
    dry_deny: Group,
    dry_allow: Group,
    providers: Vec<Arc<Provider>>,
    peer: PeerPolicy,
    /// What the rules of every group but AUDIT look at, for the second readings.
    reads: Reads,
    /// The same for the groups a host reading is checked against (DENY, CUSTOM).
    deny_reads: Reads,
}

/// A workload's view held with the very `Arc`s a route shares with every request it
/// routes. Holding them keeps their allocations alive, so no other workload's `Arc`
/// can have their addresses while the entry exists: an address match is a match of
/// the namespace and labels, without hashing or comparing them.
#[derive(Clone)]
struct PinnedView {
    namespace: Arc<str>,
    labels: Arc<BTreeMap<String, String>>,
    view: Arc<View>,
}

/// The outcome of evaluating one request.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// HTTP status the gateway answers with (200 when forwarded).
    pub status: u16,
    /// Whether the request is forwarded.
    pub allowed: bool,
    /// Policy (`namespace/name`) that decided, if one did.
    pub policy: Option<String>,
    /// Rule index within that policy.
    pub rule: Option<u32>,
    /// Why.
    pub reason: Cow<'static, str>,
    /// AUDIT policies that matched (`namespace/name[rule i]`).
    pub audit: Vec<String>,
    /// What dry-run (`istio.io/dry-run`) policies would have done, when they would deny.
    pub dry_run: Option<String>,
    /// `WWW-Authenticate` for a refused token.
    pub www_authenticate: Option<String>,
    /// Verified request principal (`iss/sub`).
    pub request_principal: Option<String>,
    /// Effective PeerAuthentication mode on this port.
    pub mtls_mode: MtlsMode,
    /// The verified token.
    #[serde(skip)]
    pub jwt: Option<Arc<VerifiedJwt>>,
    /// Which check decided.
    #[serde(skip)]
    pub decided_by: DecidedBy,
    /// The provider of the CUSTOM policy that matched: the request goes to that
    /// external authorizer first (Istio's order: CUSTOM, DENY, ALLOW).
    #[serde(skip)]
    pub custom: Option<Arc<str>>,
    /// The path (without the query) as the policies matched it, when path normalization
    /// changed it: what goes upstream in place of the path the client sent. Set whatever
    /// the decision, since monitor mode forwards refused requests too.
    #[serde(skip)]
    pub normalized_path: Option<String>,
}

/// Which check of access control decided a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecidedBy {
    /// AuthorizationPolicy (CUSTOM, DENY, ALLOW).
    Authz,
    /// RequestAuthentication: the JWT was refused (401, or 403 when required).
    Authn,
    /// PeerAuthentication STRICT without a verified client certificate.
    Peer,
    /// The path could not be normalized.
    Path,
    /// The request names more methods as overrides than are read
    /// ([`crate::request::MAX_METHOD_OVERRIDES`]).
    Method,
}

impl DecidedBy {
    /// The name events and records use (`authz`, `authn`, `peer`, `path`, `method`).
    pub fn as_str(self) -> &'static str {
        match self {
            DecidedBy::Authz => "authz",
            DecidedBy::Authn => "authn",
            DecidedBy::Peer => "peer",
            DecidedBy::Path => "path",
            DecidedBy::Method => "method",
        }
    }
}

impl Decision {
    fn new(
        status: u16,
        allowed: bool,
        reason: impl Into<Cow<'static, str>>,
        decided_by: DecidedBy,
    ) -> Self {
        Decision {
            status,
            allowed,
            policy: None,
            rule: None,
            reason: reason.into(),
            audit: Vec::new(),
            dry_run: None,
            www_authenticate: None,
            request_principal: None,
            mtls_mode: MtlsMode::Permissive,
            jwt: None,
            decided_by,
            custom: None,
            normalized_path: None,
        }
    }

    /// `namespace/name[rule i]` of the deciding policy, or the engine name.
    pub fn rule_id(&self) -> String {
        match (&self.policy, self.rule) {
            (Some(p), Some(r)) => format!("{p}[rule {r}]"),
            (Some(p), None) => p.clone(),
            _ => self.decided_by.as_str().to_string(),
        }
    }
}

/// One request as the engine sees it (what the proxy or `moat policy check` provides).
#[derive(Debug, Clone, Copy)]
pub struct RequestInput<'a> {
    /// Workload namespace.
    pub namespace: &'a str,
    /// Workload labels.
    pub labels: &'a BTreeMap<String, String>,
    /// `http` or `https` (for the `WWW-Authenticate` realm).
    pub scheme: &'a str,
    /// Method.
    pub method: &'a str,
    /// `:authority` / Host.
    pub host: &'a str,
    /// Path and query as received.
    pub path_and_query: &'a str,
    /// Destination port.
    pub port: Option<u16>,
    /// TCP peer address.
    pub source_ip: Option<IpAddr>,
    /// Original client address.
    pub remote_ip: Option<IpAddr>,
    /// Local address.
    pub dest_ip: Option<IpAddr>,
    /// TLS SNI.
    pub sni: Option<&'a str>,
    /// Verified client certificate (`None` for plaintext).
    pub peer: Option<&'a PeerIdentity>,
    /// The body of a POST form, JSON or multipart, when the request is decided with it:
    /// each method a `_method` field names is one more reading (see
    /// [`MethodOverrides`]). `None` decides on the head alone.
    pub body: Option<&'a [u8]>,
}

/// One TCP (L4) connection as the engine sees it: no HTTP attributes.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionInput<'a> {
    /// Workload namespace.
    pub namespace: &'a str,
    /// Workload labels.
    pub labels: &'a BTreeMap<String, String>,
    /// Destination (listener) port: `ports`, `destination.port`, PeerAuthentication
    /// `portLevelMtls`.
    pub port: Option<u16>,
    /// TCP peer address (`ipBlocks`, `source.ip`).
    pub source_ip: Option<IpAddr>,
    /// Original client address (`remoteIpBlocks`, `remote.ip`); `None` = the source IP
    /// (Envoy's downstream remote address of a connection without PROXY protocol).
    pub remote_ip: Option<IpAddr>,
    /// Local address (`destination.ip`).
    pub dest_ip: Option<IpAddr>,
    /// TLS SNI (`connection.sni`).
    pub sni: Option<&'a str>,
    /// Verified client certificate (`None` for plaintext): `principals`, `namespaces`,
    /// `serviceAccounts` and their `source.*` keys.
    pub peer: Option<&'a PeerIdentity>,
}

/// Istio access control compiled for moat.
pub struct AuthzEngine {
    cfg: AuthzConfig,
    set: PolicySet,
    /// Providers per RequestAuthentication (same order as `set.request_authn`).
    providers: Vec<Vec<Arc<Provider>>>,
    sources: Vec<Arc<KeySource>>,
    cache: TokenCache,
    views: RwLock<HashMap<u64, Vec<Arc<View>>, RandomState>>,
    hasher: RandomState,
    /// The views of the workloads requests name through the proxy's shared `Arc`s,
    /// found by those `Arc`s' addresses (see [`AuthzEngine::with_pinned_view`]).
    pinned: ArcSwap<Vec<PinnedView>>,
    /// Dropping the sender stops the refresh thread.
    _refresh_stop: Option<mpsc::Sender<()>>,
}

impl std::fmt::Debug for AuthzEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthzEngine")
            .field("authorization_policies", &self.set.authz.len())
            .field("request_authentications", &self.set.request_authn.len())
            .field("peer_authentications", &self.set.peer_authn.len())
            .finish()
    }
}

impl AuthzEngine {
    /// The header fields verified tokens are read from and the fields their claims are
    /// written to, over every provider (with repeats): the fields whose value the
    /// request phase may remove or set from a token.
    pub fn token_fields(&self) -> impl Iterator<Item = &http::HeaderName> {
        self.providers.iter().flatten().flat_map(|p| {
            let from = p.locations.iter().filter_map(|l| match l {
                jwt::Location::Header { name, .. } => Some(name),
                _ => None,
            });
            from.chain(jwt::output_fields(p))
        })
    }

    /// Loads the policies named in `cfg` (relative to `base_dir`), fetches remote JWKS
    /// once through `fetcher` and starts refreshing them in the background (on a thread
    /// of the engine's, which calls `fetcher` too).
    pub fn build(
        cfg: &AuthzConfig,
        base_dir: &Path,
        fetcher: Arc<dyn JwksFetcher>,
    ) -> Result<Arc<AuthzEngine>, AuthzError> {
        Self::build_with(cfg, base_dir, fetcher, true)
    }

    /// As [`AuthzEngine::build`]; `background_refresh: false` fetches remote JWKS once
    /// and never again (for one-shot tools).
    pub fn build_with(
        cfg: &AuthzConfig,
        base_dir: &Path,
        fetcher: Arc<dyn JwksFetcher>,
        background_refresh: bool,
    ) -> Result<Arc<AuthzEngine>, AuthzError> {
        let set = loader::load_paths(&cfg.policies, base_dir)?;
        Self::from_policies(cfg, set, fetcher, background_refresh)
    }

    /// Builds from already loaded policies; `fetcher` fetches remote JWKS (inline and
    /// `file:` JWKS do not use it).
    pub fn from_policies(
        cfg: &AuthzConfig,
        set: PolicySet,
        fetcher: Arc<dyn JwksFetcher>,
        background_refresh: bool,
    ) -> Result<Arc<AuthzEngine>, AuthzError> {
        check_providers(cfg, &set)?;
        let mut sources: Vec<Arc<KeySource>> = Vec::new();
        let mut by_origin: HashMap<JwksOrigin, Arc<KeySource>> = HashMap::new();
        let mut providers = Vec::new();
        let mut next_id = 0u32;
        for ra in &set.request_authn {
            let mut ps = Vec::new();
            for (i, r) in ra.rules.iter().enumerate() {
                let source = match (&r.origin, &r.inline) {
                    (JwksOrigin::Inline, Some(text)) => {
                        let keys = KeySet::parse(text).map_err(|e| AuthzError::Jwks {
                            policy: ra.meta.id(),
                            message: e,
                        })?;
                        let s = Arc::new(KeySource::new(
                            JwksOrigin::Inline,
                            keys,
                            r.timeout,
                            true,
                            fetcher.clone(),
                        ));
                        sources.push(s.clone());
                        s
                    }
                    (origin, _) => match by_origin.get(origin) {
                        Some(s) => s.clone(),
                        None => {
                            let s = Arc::new(KeySource::new(
                                origin.clone(),
                                KeySet::default(),
                                r.timeout,
                                false,
                                fetcher.clone(),
                            ));
                            if let Err(e) = s.refresh_blocking() {
                                tracing::warn!(policy = %ra.meta.id(), error = %e,
                                    "JWKS fetch failed; tokens of this issuer are refused until it succeeds");
                            }
                            by_origin.insert(origin.clone(), s.clone());
                            sources.push(s.clone());
                            s
                        }
                    },
                };
                ps.push(Arc::new(Provider {
                    policy: ra.meta.id(),
                    rule: i,
                    id: next_id,
                    issuer: r.issuer.clone(),
                    audiences: r.audiences.clone(),
                    locations: r.locations.clone(),
                    keys: source,
                    output_payload_to_header: r.output_payload_to_header.clone(),
                    output_claims: r.output_claims.clone(),
                    forward: r.forward,
                    space_delimited: r.space_delimited.clone(),
                }));
                next_id += 1;
            }
            providers.push(ps);
        }
        let remote: Vec<Arc<KeySource>> =
            sources.iter().filter(|s| s.is_remote()).cloned().collect();
        let stop = if background_refresh && !remote.is_empty() {
            Some(spawn_refresher(
                remote,
                cfg.jwks_refresh_interval,
                cfg.jwks_retry_interval,
            )?)
        } else {
            None
        };
        Ok(Arc::new(AuthzEngine {
            cfg: cfg.clone(),
            set,
            providers,
            sources,
            cache: TokenCache::new(cfg.jwt_cache_size),
            views: RwLock::new(HashMap::default()),
            hasher: RandomState::default(),
            pinned: ArcSwap::default(),
            _refresh_stop: stop,
        }))
    }

    /// The loaded policies.
    pub fn policies(&self) -> &PolicySet {
        &self.set
    }

    /// The configuration.
    pub fn config(&self) -> &AuthzConfig {
        &self.cfg
    }

    /// Key ids currently loaded for each JWKS (diagnostics and tests).
    pub fn jwks_kids(&self) -> Vec<Vec<String>> {
        self.sources.iter().map(|s| s.keys.load().kids()).collect()
    }

    /// Fetches every remote JWKS now (blocking); failures keep the current keys.
    pub fn refresh_jwks(&self) -> Vec<Result<usize, String>> {
        self.sources
            .iter()
            .filter(|s| s.is_remote())
            .map(|s| s.refresh_blocking())
            .collect()
    }

    /// Number of verified tokens in the cache.
    pub fn cached_tokens(&self) -> usize {
        self.cache.len()
    }

    /// The effective PeerAuthentication mode for a workload and port (never `Unset`:
    /// PERMISSIVE when nothing applies): the mode [`RequestHeadersPhase`] enforces on
    /// each request. The proxy does not call it (a listener's own `client_auth.mode`
    /// decides whether its handshake asks for a certificate); tools and tests do.
    pub fn peer_auth_mode(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        port: u16,
    ) -> MtlsMode {
        self.view(namespace, labels).peer_mode(port).0
    }

    fn view_hash(&self, ns: &str, labels: &BTreeMap<String, String>) -> u64 {
        let mut h = self.hasher.build_hasher();
        ns.hash(&mut h);
        labels.hash(&mut h);
        h.finish()
    }

    fn view(&self, ns: &str, labels: &BTreeMap<String, String>) -> Arc<View> {
        let h = self.view_hash(ns, labels);
        if let Some(list) = self.views.read().get(&h) {
            if let Some(v) = list
                .iter()
                .find(|v| v.namespace == ns && v.labels == *labels)
            {
                return v.clone();
            }
        }
        let v = Arc::new(self.build_view(ns, labels));
        let mut w = self.views.write();
        if w.len() >= self.cfg.max_workloads.max(1) {
            w.clear();
        }
        w.entry(h).or_default().push(v.clone());
        v
    }

    /// Calls `f` with the view of a workload named by shared `Arc`s (a route's,
    /// carried by each request's context): on every request after the first, one
    /// atomic load and an address comparison per pinned workload instead of
    /// [`Self::view`]'s hash, lock and comparison of the labels. Pins at most
    /// `max_workloads` workloads, then starts over, as `view` does.
    fn with_pinned_view<R>(
        &self,
        ns: &Arc<str>,
        labels: &Arc<BTreeMap<String, String>>,
        f: impl FnOnce(&View) -> R,
    ) -> R {
        let same = |p: &PinnedView| Arc::ptr_eq(&p.labels, labels) && Arc::ptr_eq(&p.namespace, ns);
        if let Some(p) = self.pinned.load().iter().find(|p| same(p)) {
            return f(&p.view);
        }
        let view = self.view(ns, labels);
        let max = self.cfg.max_workloads.max(1);
        self.pinned.rcu(|list| {
            let mut list = if list.len() >= max {
                Vec::new()
            } else {
                list.to_vec()
            };
            if !list.iter().any(same) {
                list.push(PinnedView {
                    namespace: ns.clone(),
                    labels: labels.clone(),
                    view: view.clone(),
                });
            }
            list
        });
        f(&view)
    }

    fn build_view(&self, ns: &str, labels: &BTreeMap<String, String>) -> View {
        let root = self.cfg.root_namespace.as_str();
        let applicable = self.applicable_policies(ns, labels);
        let pick = |action: Action, dry: bool| self.pick(&applicable, action, dry);
        let mut providers = Vec::new();
        let mut ras: Vec<(usize, &loader::RequestAuthn)> = self
            .set
            .request_authn
            .iter()
            .enumerate()
            .filter(|(_, r)| r.meta.applies(root, ns, labels))
            .collect();
        ras.sort_by(|a, b| {
            (&a.1.meta.namespace, &a.1.meta.name).cmp(&(&b.1.meta.namespace, &b.1.meta.name))
        });
        for (i, _) in ras {
            providers.extend(self.providers[i].iter().cloned());
        }
        // Istio sorts the merged rules by issuer.
        providers.sort_by(|a, b| a.issuer.cmp(&b.issuer));
        let custom = pick(Action::Custom, false);
        let custom_providers = custom
            .iter()
            .filter_map(|p| Some((p.meta.id().into(), p.provider.as_deref()?.into())))
            .collect();
        let custom = Group::build(&custom);
        let deny = Group::build(&pick(Action::Deny, false));
        // An ALLOW of every host but `admin` is not passed by `admin:443`: routing
        // ignores the port. (DENY and CUSTOM read the bare host as a second reading.)
        let allow_group = |dry| {
            let mut g = Group::build(&pick(Action::Allow, dry));
            g.not_hosts_bare = self.cfg.host_port == HostPort::Both && g.reads.not_host;
            g
        };
        let allow = allow_group(false);
        let dry_deny = Group::build(&pick(Action::Deny, true));
        let dry_allow = allow_group(true);
        let deny_reads = custom.reads | deny.reads | dry_deny.reads;
        View {
            namespace: ns.to_string(),
            labels: labels.clone(),
            reads: deny_reads | allow.reads | dry_allow.reads,
            deny_reads,
            custom,
            custom_providers,
            audit: Group::build(&pick(Action::Audit, false)),
            deny,
            allow,
            dry_audit: Group::build(&pick(Action::Audit, true)),
            dry_deny,
            dry_allow,
            applicable,
            tcp: OnceLock::new(),
            providers,
            peer: compose_peer(&self.set.peer_authn, root, ns, labels),
        }
    }

    /// Indices in `PolicySet::authz` of the AuthorizationPolicies that apply to a
    /// workload, in Envoy's order (namespace, then name).
    pub(crate) fn applicable_policies(
        &self,
        ns: &str,
        labels: &BTreeMap<String, String>,
    ) -> Vec<usize> {
        let root = self.cfg.root_namespace.as_str();
        let mut applicable: Vec<usize> = (0..self.set.authz.len())
            .filter(|&i| self.set.authz[i].meta.applies(root, ns, labels))
            .collect();
        applicable.sort_by(|&a, &b| {
            let (a, b) = (&self.set.authz[a].meta, &self.set.authz[b].meta);
            (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
        });
        applicable
    }

    fn pick(&self, applicable: &[usize], action: Action, dry: bool) -> Vec<&loader::AuthzPolicy> {
        applicable
            .iter()
            .map(|&i| &self.set.authz[i])
            .filter(|p| p.action == action && p.meta.dry_run == dry)
            .collect()
    }

    fn tcp_view<'v>(&self, view: &'v View) -> &'v TcpView {
        view.tcp.get_or_init(|| {
            let g = |action: Action, dry: bool| {
                Group::build_tcp(&self.pick(&view.applicable, action, dry), action)
            };
            TcpView {
                custom: g(Action::Custom, false),
                audit: g(Action::Audit, false),
                deny: g(Action::Deny, false),
                allow: g(Action::Allow, false),
                dry_audit: g(Action::Audit, true),
                dry_deny: g(Action::Deny, true),
                dry_allow: g(Action::Allow, true),
            }
        })
    }

    /// Evaluates one TCP (L4) connection with Istio's TCP filter-chain semantics:
    /// PeerAuthentication (STRICT without a client certificate closes the connection,
    /// DISABLE ignores it), then AUDIT, DENY and ALLOW over the connection attributes
    /// (ports, ipBlocks, remoteIpBlocks, principals, namespaces, serviceAccounts,
    /// destination.ip, connection.sni). A rule using an HTTP-only field never matches
    /// when it is an ALLOW rule; in a DENY/AUDIT rule only those conditions are dropped
    /// (see [`crate::ir::TcpRule`]).
    ///
    /// `status` in the result is 200 when the connection is accepted and 403 when it is
    /// closed. `custom` names the provider of the first CUSTOM rule that matched (its
    /// HTTP-only conditions dropped, as Istio builds CUSTOM for TCP): the caller asks it
    /// first, and its denial closes the connection whatever DENY and ALLOW said.
    pub fn evaluate_connection(&self, c: &ConnectionInput<'_>) -> Decision {
        let view = self.view(c.namespace, c.labels);
        let (mode, pa_policy) = view.peer_mode(c.port.unwrap_or(0));
        if let Some(d) = strict_rejection(mode, pa_policy, c.peer.is_some()) {
            return d;
        }
        let mut fallback = Vec::new();
        let peer_view = peer_view(mode, c.peer, &mut fallback);
        let no_headers = HeaderMap::new();
        let attrs = Attrs {
            host: "",
            method: "",
            path: "",
            raw_path: "",
            headers: &no_headers,
            port: c.port,
            source_ip: c.source_ip,
            remote_ip: c.remote_ip.or(c.source_ip),
            dest_ip: c.dest_ip,
            sni: c.sni,
            peer: peer_view,
            jwt: None,
            bare_host: None,
        };
        let tcp = self.tcp_view(&view);
        let mut d = decide(&tcp.audit, &tcp.deny, &tcp.allow, &attrs);
        d.custom = tcp
            .custom
            .first(&attrs)
            .and_then(|(p, _)| view.custom_providers.get(&p).cloned());
        if !d.allowed && d.policy.is_none() && tcp.allow.skipped > 0 {
            d.reason = format!(
                "no ALLOW policy matched ({} ALLOW rule(s) use HTTP-only fields and never match a TCP connection)",
                tcp.allow.skipped
            )
            .into();
        }
        d.mtls_mode = mode;
        dry_run(
            &mut d,
            &tcp.dry_audit,
            &tcp.dry_deny,
            &tcp.dry_allow,
            &attrs,
            &[],
        );
        d
    }

    /// Evaluates one request: peer authentication, request authentication (may rewrite
    /// `headers` per outputPayloadToHeader / outputClaimToHeaders / forwardOriginalToken),
    /// then AUDIT, DENY and ALLOW policies.
    pub fn evaluate(&self, req: &RequestInput<'_>, headers: &mut HeaderMap) -> Decision {
        self.evaluate_in(&self.view(req.namespace, req.labels), req, headers)
    }

    /// [`Self::evaluate`] with the workload's view already found. The path is normalized
    /// once, here: the policies match it and [`Decision::normalized_path`] carries it out.
    fn evaluate_in(
        &self,
        view: &View,
        req: &RequestInput<'_>,
        headers: &mut HeaderMap,
    ) -> Decision {
        let path = normalize_path(req.path_and_query, self.cfg.path_normalization);
        let mut d = self.evaluate_path(view, req, &path, headers);
        if let Ok(Cow::Owned(p)) = path {
            // A path with a dot that is no dot segment (`/..;/`) is walked and kept.
            let sent = req
                .path_and_query
                .split(['?', '#'])
                .next()
                .unwrap_or_default();
            if p != sent {
                d.normalized_path = Some(p);
            }
        }
        d
    }

    /// [`Self::evaluate_in`] given the normalized path: STRICT first, then the path's
    /// validity, then the token, then the policies.
    fn evaluate_path(
        &self,
        view: &View,
        req: &RequestInput<'_>,
        path: &Result<Cow<'_, str>, BadPath>,
        headers: &mut HeaderMap,
    ) -> Decision {
        let (mode, pa_policy) = view.peer_mode(req.port.unwrap_or(0));
        if let Some(d) = strict_rejection(mode, pa_policy, req.peer.is_some()) {
            return d;
        }
        let path: &str = match path {
            Ok(p) => p,
            Err(e) => {
                let mut d =
                    Decision::new(400, false, format!("bad path: {}", e.0), DecidedBy::Path);
                d.mtls_mode = mode;
                return d;
            }
        };
        let query = req.path_and_query.split_once('?').map(|(_, q)| q);
        let overrides = match self.cfg.method_overrides {
            MethodOverrides::Both => {
                method_overrides(req.method, headers, query).and_then(|head| {
                    // The body's form is looked up only when there is a body.
                    let form = req
                        .body
                        .and_then(|body| Some((body, post_form(req.method, headers)?)));
                    match form {
                        Some((body, form)) => body_method_overrides(req.method, form, body, head),
                        None => Ok(head),
                    }
                })
            }
            MethodOverrides::AsReceived => Ok(Vec::new()),
        };
        let overrides = match overrides {
            Ok(methods) => methods,
            Err(TooManyOverrides) => {
                let mut d = Decision::new(
                    400,
                    false,
                    format!("more than {MAX_METHOD_OVERRIDES} methods named as method overrides"),
                    DecidedBy::Method,
                );
                d.mtls_mode = mode;
                return d;
            }
        };
        let skew = self.cfg.jwt_clock_skew.as_secs() as i64;
        // Istio configures Envoy with `bypass_cors_preflight`: a CORS preflight skips JWT.
        let preflight = req.method == "OPTIONS"
            && headers.contains_key(http::header::ORIGIN)
            && headers.contains_key(http::header::ACCESS_CONTROL_REQUEST_METHOD);
        let authn = if !preflight && jwt::any_token(&view.providers, headers, query) {
            let now = jwt::now_secs();
            jwt::authenticate(&view.providers, headers, query, &self.cache, now, skew)
        } else {
            Authn::NoToken
        };
        if !matches!(authn, Authn::Failed { .. }) {
            jwt::strip_outputs(&view.providers, headers);
        }
        let verified = match authn {
            Authn::NoToken => None,
            Authn::Verified { jwt, provider } => {
                jwt::apply_outputs(&view.providers[provider], &jwt, headers);
                Some(jwt)
            }
            Authn::Failed { error, policy } => {
                let mut d = Decision::new(error.status(), false, error.message(), DecidedBy::Authn);
                d.policy = policy;
                d.mtls_mode = mode;
                let realm = format!("{}://{}{}", req.scheme, req.host, path);
                d.www_authenticate = Some(format!(
                    "Bearer realm=\"{}\", error=\"invalid_token\"",
                    realm.replace('"', "%22")
                ));
                return d;
            }
        };
        let mut fallback = Vec::new();
        let peer_view = peer_view(mode, req.peer, &mut fallback);
        let attrs = Attrs {
            host: req.host,
            method: req.method,
            path,
            raw_path: req.path_and_query,
            headers,
            port: req.port,
            source_ip: req.source_ip,
            remote_ip: req.remote_ip,
            dest_ip: req.dest_ip,
            sni: req.sni,
            peer: peer_view,
            jwt: verified.as_deref(),
            bare_host: None,
        };
        // What else a backend may read the request as (PathParameters, MethodOverrides,
        // HostPort): each reading must pass too. They are readings, not rewrites: what
        // goes upstream is unchanged. A reading that changes only what no rule looks at
        // cannot change the decision and is not made.
        let servlet_path = match self.cfg.path_parameters {
            PathParameters::Both if view.reads.path => {
                without_path_parameters(path, merges_slashes(self.cfg.path_normalization))
            }
            _ => None,
        };
        let overrides: &[String] = if view.reads.method { &overrides } else { &[] };
        // The bare host is read by DENY (and CUSTOM) policies only.
        let bare = match self.cfg.host_port {
            HostPort::Both if view.deny_reads.host => bare_host(req.host),
            _ => None,
        };
        let mut readings = Vec::new();
        if servlet_path.is_some() || !overrides.is_empty() || bare.is_some() {
            let methods = std::iter::once(req.method).chain(overrides.iter().map(String::as_str));
            for (i, method) in methods.enumerate() {
                for (j, path) in [Some(path), servlet_path.as_deref()]
                    .into_iter()
                    .flatten()
                    .enumerate()
                {
                    let attrs = Attrs {
                        method,
                        path,
                        ..attrs
                    };
                    // The first is the request as Envoy reads it, decided below.
                    if i + j > 0 {
                        readings.push(Reading {
                            attrs,
                            deny_only: false,
                        });
                    }
                    if let Some(host) = bare {
                        readings.push(Reading {
                            attrs: Attrs { host, ..attrs },
                            deny_only: true,
                        });
                    }
                }
            }
        }
        let mut d = decide_readings(&view.audit, &view.deny, &view.allow, &attrs, &readings);
        let custom = view.custom.first(&attrs).or_else(|| {
            readings
                .iter()
                .find_map(|read| view.custom.first(&read.attrs))
        });
        d.custom = custom.and_then(|(p, _)| view.custom_providers.get(&p).cloned());
        d.mtls_mode = mode;
        dry_run(
            &mut d,
            &view.dry_audit,
            &view.dry_deny,
            &view.dry_allow,
            &attrs,
            &readings,
        );
        d.request_principal = verified.as_ref().map(|j| j.principal());
        d.jwt = verified;
        d
    }
}

impl Decision {
    fn reason_with_rule(&self) -> String {
        match &self.policy {
            Some(_) => format!("{} ({})", self.rule_id(), self.reason),
            None => self.reason.to_string(),
        }
    }
}

/// Every extension provider is valid and named once; every CUSTOM policy names one.
fn check_providers(cfg: &AuthzConfig, set: &PolicySet) -> Result<(), AuthzError> {
    let mut names = std::collections::HashSet::new();
    for p in &cfg.extension_providers {
        p.validate().map_err(AuthzError::Provider)?;
        if !names.insert(p.name.as_str()) {
            return Err(AuthzError::Provider(format!(
                "provider `{}` is defined twice",
                p.name
            )));
        }
    }
    for p in set.authz.iter().filter(|p| p.action == Action::Custom) {
        let name = p.provider.as_deref().unwrap_or_default();
        if !names.contains(name) {
            return Err(AuthzError::Config(moat_config::ConfigError::semantic(
                &p.meta.file,
                p.meta.line,
                1,
                "spec.provider.name",
                format!(
                    "{}: unknown extension provider `{name}` (define it in authz.extension_providers)",
                    p.meta.id()
                ),
            )));
        }
    }
    Ok(())
}

/// The 403 of PeerAuthentication STRICT for a connection without a verified client
/// certificate (Istio refuses the handshake).
fn strict_rejection(mode: MtlsMode, policy: Option<&str>, has_peer: bool) -> Option<Decision> {
    if mode != MtlsMode::Strict || has_peer {
        return None;
    }
    let mut d = Decision::new(
        403,
        false,
        "mTLS required: PeerAuthentication STRICT and the connection has no verified client certificate",
        DecidedBy::Peer,
    );
    d.policy = policy.map(str::to_string);
    d.mtls_mode = mode;
    Some(d)
}

/// The URI SANs policies see: none under DISABLE or for plaintext; the certificate's URI
/// SANs, or `spiffe://<principal>` (put in `fallback`) when it has none.
fn peer_view<'a>(
    mode: MtlsMode,
    peer: Option<&'a PeerIdentity>,
    fallback: &'a mut Vec<String>,
) -> Option<PeerView<'a>> {
    let p = peer.filter(|_| mode != MtlsMode::Disable)?;
    if !p.uri_sans.is_empty() {
        return Some(PeerView { uris: &p.uri_sans });
    }
    fallback.extend(p.principal.iter().map(|x| format!("spiffe://{x}")));
    let uris: &'a Vec<String> = fallback;
    Some(PeerView { uris })
}

/// Evaluates the dry-run (`istio.io/dry-run`) groups and reports them in `d`: their AUDIT
/// matches, and what they would have denied.
fn dry_run(
    d: &mut Decision,
    audit: &Group,
    deny: &Group,
    allow: &Group,
    a: &Attrs<'_>,
    readings: &[Reading<'_>],
) {
    if deny.policies + allow.policies + audit.policies == 0 {
        return;
    }
    let shadow = decide_readings(audit, deny, allow, a, readings);
    d.audit
        .extend(shadow.audit.iter().map(|a| format!("{a} (dry-run)")));
    if deny.policies + allow.policies > 0 && !shadow.allowed {
        d.dry_run = Some(format!(
            "dry-run policies would deny: {}",
            shadow.reason_with_rule()
        ));
    }
}

/// One more way a backend may read a request: checked after the request as Envoy reads
/// it, by every policy or, with `deny_only`, by DENY policies alone.
#[derive(Debug, Clone, Copy)]
struct Reading<'a> {
    attrs: Attrs<'a>,
    deny_only: bool,
}

/// [`decide`] for `a`, and when it allows, the refusal of the first of `readings` (what
/// else a backend may read the request as) that is refused. AUDIT marks come from `a`.
fn decide_readings(
    audit: &Group,
    deny: &Group,
    allow: &Group,
    a: &Attrs<'_>,
    readings: &[Reading<'_>],
) -> Decision {
    let d = decide(audit, deny, allow, a);
    if !d.allowed {
        return d;
    }
    for read in readings {
        let other = if read.deny_only {
            match deny.first(&read.attrs) {
                Some((p, r)) => denied(&p, r),
                None => continue,
            }
        } else {
            decide(audit, deny, allow, &read.attrs)
        };
        if other.allowed {
            continue;
        }
        let read = &read.attrs;
        let mut reason = other.reason.into_owned();
        if read.method != a.method {
            reason.push_str(&format!(" as {} (a method override)", read.method));
        }
        if read.path != a.path {
            reason.push_str(&format!(
                " for the path without its `;` parameters ({})",
                read.path
            ));
        }
        if read.host != a.host {
            reason.push_str(&format!(" for the host without its port ({})", read.host));
        }
        return Decision {
            reason: reason.into(),
            audit: d.audit,
            ..other
        };
    }
    d
}

/// The refusal by rule `rule` of DENY policy `policy`.
fn denied(policy: &str, rule: u32) -> Decision {
    let mut d = Decision::new(403, false, "matched a DENY policy", DecidedBy::Authz);
    d.policy = Some(policy.to_string());
    d.rule = Some(rule);
    d
}

/// Istio's algorithm: AUDIT marks, any DENY match denies, no ALLOW policy allows,
/// an ALLOW match allows, otherwise deny.
fn decide(audit: &Group, deny: &Group, allow: &Group, a: &Attrs<'_>) -> Decision {
    let audits: Vec<String> = audit
        .first(a)
        .map(|(p, r)| vec![format!("{p}[rule {r}]")])
        .unwrap_or_default();
    let mut d = if let Some((p, r)) = deny.first(a) {
        denied(&p, r)
    } else if allow.policies == 0 {
        Decision::new(
            200,
            true,
            "no ALLOW policy applies to the workload",
            DecidedBy::Authz,
        )
    } else if let Some((p, r)) = allow.first(a) {
        let mut d = Decision::new(200, true, "matched an ALLOW policy", DecidedBy::Authz);
        d.policy = Some(p.to_string());
        d.rule = Some(r);
        d
    } else {
        Decision::new(403, false, "no ALLOW policy matched", DecidedBy::Authz)
    };
    d.audit = audits;
    d
}

impl View {
    fn peer_mode(&self, port: u16) -> (MtlsMode, Option<&str>) {
        match self.peer.ports.iter().find(|(p, _, _)| *p == port) {
            Some((_, m, p)) => (*m, Some(p.as_str())),
            None => (self.peer.mode, self.peer.policy.as_deref()),
        }
    }
}

/// Istio's ComposePeerAuthentication: workload (selector, not root ns) > namespace
/// (no selector) > mesh (root ns, no selector); the oldest wins within a level; UNSET
/// inherits; portLevelMtls of the workload policy overrides per port; default PERMISSIVE.
pub(crate) fn compose_peer(
    pas: &[PeerAuthn],
    root: &str,
    ns: &str,
    labels: &BTreeMap<String, String>,
) -> PeerPolicy {
    let oldest = |f: &dyn Fn(&PeerAuthn) -> bool| -> Option<&PeerAuthn> {
        pas.iter().filter(|p| f(p)).min_by(|a, b| {
            (
                a.meta.created.as_deref().unwrap_or(""),
                &a.meta.namespace,
                &a.meta.name,
            )
                .cmp(&(
                    b.meta.created.as_deref().unwrap_or(""),
                    &b.meta.namespace,
                    &b.meta.name,
                ))
        })
    };
    let mesh = oldest(&|p| p.meta.namespace == root && p.meta.selector.is_none());
    let nsl = oldest(&|p| p.meta.namespace == ns && p.meta.selector.is_none());
    let wl = oldest(&|p| {
        p.meta.namespace == ns && ns != root && p.meta.selector.is_some() && p.meta.selects(labels)
    });
    let mut out = PeerPolicy {
        mode: MtlsMode::Permissive,
        policy: None,
        ports: Vec::new(),
    };
    for level in [mesh, nsl, wl].into_iter().flatten() {
        if level.mode != MtlsMode::Unset {
            out.mode = level.mode;
            out.policy = Some(level.meta.id());
        }
    }
    if let Some(w) = wl {
        for (port, m) in &w.ports {
            if *m != MtlsMode::Unset {
                out.ports.push((*port, *m, w.meta.id()));
            }
        }
    }
    out
}

fn spawn_refresher(
    sources: Vec<Arc<KeySource>>,
    interval: Duration,
    retry: Duration,
) -> Result<mpsc::Sender<()>, AuthzError> {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("moat-jwks".into())
        .spawn(move || loop {
            let any_empty = sources.iter().any(|s| s.keys.load().is_empty());
            let wait = if any_empty {
                retry.min(interval)
            } else {
                interval
            };
            match rx.recv_timeout(wait) {
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            for s in &sources {
                if let Err(e) = s.refresh_blocking() {
                    tracing::warn!(error = %e, "JWKS refresh failed; keeping the previous keys");
                }
            }
        })
        .map_err(|e| AuthzError::Jwks {
            policy: String::new(),
            message: format!("cannot start the JWKS refresh thread: {e}"),
        })?;
    Ok(tx)
}

fn reply_for(d: &Decision) -> Reply {
    let status = StatusCode::from_u16(d.status).unwrap_or(StatusCode::FORBIDDEN);
    match d.status {
        401 | 403 if d.decided_by == DecidedBy::Authn => {
            let mut r = Reply::text(status, d.reason.to_string());
            if let Some(w) = d
                .www_authenticate
                .as_deref()
                .and_then(|w| HeaderValue::from_str(w).ok())
            {
                r = r.with_header(http::header::WWW_AUTHENTICATE, w);
            }
            r
        }
        400 => Reply::text(status, "Bad Request"),
        _ => Reply::text(status, "RBAC: access denied"),
    }
}

/// The form of a POST body that may name another method in a `_method` field, by the
/// request's `Content-Type`; `None` for every other request. Rack parses a POST without
/// a `Content-Type` as a form.
fn post_form<'h>(method: &str, headers: &'h HeaderMap) -> Option<BodyForm<'h>> {
    if method != "POST" {
        return None;
    }
    match headers.get(http::header::CONTENT_TYPE) {
        None => Some(BodyForm::UrlEncoded),
        Some(value) => BodyForm::of(value.to_str().ok()?),
    }
}

/// The host a request addresses (its target's authority, else `Host`), copied out of
/// `headers`, which the decision borrows mutably: into `buf` when it fits (no
/// allocation), else into `owned`. Inlined: out of line, the `Host` lookup loses its
/// specialisation for a standard header name (+85 instructions a request, callgrind).
#[inline(always)]
fn copied_host<'b>(
    uri: &'b http::Uri,
    headers: &HeaderMap,
    buf: &'b mut [u8; 256],
    owned: &'b mut String,
) -> &'b str {
    if let Some(a) = uri.authority() {
        return a.as_str();
    }
    let v = headers
        .get(http::header::HOST)
        .map_or(&[][..], |h| h.as_bytes());
    if let Some(b) = buf.get_mut(..v.len()) {
        b.copy_from_slice(v);
        if let Ok(h) = std::str::from_utf8(b) {
            return h;
        }
    }
    *owned = String::from_utf8_lossy(v).into_owned();
    owned
}

impl AuthzEngine {
    /// The request as policies see it: the connection's addresses from `ctx`, the
    /// original client from `headers` (X-Forwarded-For, when trusted) or `ctx`.
    #[inline(always)]
    fn request_input<'a>(
        &self,
        ctx: &'a RequestCtx,
        method: &'a str,
        host: &'a str,
        path_and_query: &'a str,
        headers: &HeaderMap,
        body: Option<&'a [u8]>,
    ) -> RequestInput<'a> {
        let conn = &*ctx.conn;
        let tls = conn.tls.as_ref();
        let source_ip = crate::request::canonical_ip(conn.remote_addr.ip());
        let remote_ip = match self.cfg.trusted_proxies {
            Some(n) => remote_ip_from_xff(headers, n, Some(source_ip)),
            None => Some(crate::request::canonical_ip(ctx.client_ip)),
        };
        RequestInput {
            namespace: &ctx.namespace,
            labels: &ctx.labels,
            scheme: if tls.is_some() { "https" } else { "http" },
            method,
            host,
            path_and_query,
            port: Some(conn.local_addr.port()),
            source_ip: Some(source_ip),
            remote_ip,
            dest_ip: Some(crate::request::canonical_ip(conn.local_addr.ip())),
            sni: tls.and_then(|t| t.sni.as_deref()),
            peer: tls.and_then(|t| t.peer.as_ref()),
            body,
        }
    }

    /// Whether a `_method` field in a request body is read (`method_overrides: both`):
    /// the engine is then a request body phase too.
    pub fn reads_body_methods(&self) -> bool {
        self.cfg.method_overrides == MethodOverrides::Both
    }

    /// Whether the body of this request may name a method the policies of `view` read
    /// differently: a POST form, JSON or multipart body, where some rule looks at the
    /// method and overrides are read.
    fn body_may_override(&self, view: &View, method: &str, headers: &HeaderMap) -> bool {
        method == "POST"
            && self.reads_body_methods()
            && view.reads.method
            && post_form(method, headers).is_some()
    }

    /// The event of a refusal, and the reply unless in monitor mode.
    fn refusal(&self, ctx: &mut RequestCtx, d: &Decision) -> Verdict {
        let monitor = self.cfg.monitor_only || ctx.monitor_only;
        // JWT refusals are `authn` events; every other refusal is access control's.
        let engine = match d.decided_by {
            DecidedBy::Authn => DecidedBy::Authn.as_str(),
            _ => DecidedBy::Authz.as_str(),
        };
        let action = if monitor {
            EventAction::Monitor
        } else {
            EventAction::Block
        };
        ctx.events.push(
            SecurityEvent::new(engine, d.rule_id(), action, d.reason.to_string())
                .with_details(serde_json::json!({ "status": d.status, "mtls_mode": d.mtls_mode })),
        );
        if monitor {
            Verdict::Continue
        } else {
            Verdict::Respond(reply_for(d))
        }
    }
}

impl RequestHeadersPhase for AuthzEngine {
    fn name(&self) -> &'static str {
        "authz"
    }

    /// The fields the policies' conditions read, the fields tokens are taken from and
    /// the fields verified claims are written to, over every policy (a twin is removed
    /// for all workloads when any policy reads the field).
    fn fields_decided_on(&self) -> Vec<http::HeaderName> {
        let conditions = self
            .set
            .authz
            .iter()
            .flat_map(|p| &p.rules)
            .flat_map(|r| r.header_names())
            .filter_map(|n| http::HeaderName::from_bytes(n.as_bytes()).ok());
        conditions.chain(self.token_fields().cloned()).collect()
    }

    fn on_request_headers(&self, ctx: &mut RequestCtx, req: &mut http::request::Parts) -> Verdict {
        let (mut buf, mut owned) = ([0u8; 256], String::new());
        let host = copied_host(&req.uri, &req.headers, &mut buf, &mut owned);
        let pq = req.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let input = self.request_input(ctx, req.method.as_str(), host, pq, &req.headers, None);
        let mut arrived = None;
        let d = self.with_pinned_view(&ctx.namespace, &ctx.labels, |view| {
            if self.body_may_override(view, input.method, &req.headers) {
                // The fields are copied only when a token may be verified: its outputs
                // (and the token's removal) are the only rewrite of them before the
                // body phases.
                let query = pq.split_once('?').map(|(_, q)| q);
                let rewritten = jwt::any_token(&view.providers, &req.headers, query);
                arrived = Some(Box::new(ArrivedHead {
                    uri: req.uri.clone(),
                    headers: rewritten.then(|| req.headers.clone()),
                    custom_asked: false,
                }));
            }
            self.evaluate_in(view, &input, &mut req.headers)
        });
        // The path the policies matched is the path that goes upstream (`forward_path`),
        // as Envoy's `normalize_path` rewrites `:path`: a backend that does not resolve dot
        // segments itself (a prefix router) would otherwise take `/admin/../public/x`,
        // allowed as `/public/x`, into `/admin`.
        ctx.forward_path = d
            .normalized_path
            .as_deref()
            .and_then(|path| http::uri::PathAndQuery::try_from(with_path(pq, path)).ok());
        ctx.ext_authz = d.custom.clone();
        if let Some(j) = &d.jwt {
            ctx.auth = Some(RequestAuth {
                principal: j.principal(),
                audiences: j.audiences.clone(),
                presenter: j.presenter.clone(),
                claims: j.claims.clone(),
            });
        }
        for a in &d.audit {
            ctx.events.push(
                SecurityEvent::new(
                    "authz",
                    a.clone(),
                    EventAction::Monitor,
                    "AUDIT policy matched",
                )
                .at("request"),
            );
        }
        if let Some(dr) = &d.dry_run {
            ctx.events.push(SecurityEvent::new(
                "authz",
                "dry-run",
                EventAction::Monitor,
                dr.clone(),
            ));
        }
        if d.allowed {
            if let Some(a) = &mut arrived {
                a.custom_asked = d.custom.is_some();
            }
            ctx.slots.authz = arrived;
            return Verdict::Continue;
        }
        self.refusal(ctx, &d)
    }
}

/// A POST body that names another method in a `_method` field (Rails, Symfony and
/// Laravel route `POST` + `_method=DELETE` as a DELETE): the request allowed on its
/// head is decided again, on the head as it arrived, with each method the body names as
/// one more reading. Only the first `body_max` bytes are read, as every body phase reads
/// them (the route's `on_limit`). A CUSTOM policy that only such a reading matches has
/// its provider asked after the body phases (`RequestCtx::ext_authz`), with the request
/// as it is (a `POST`, and its body when the provider wants it).
impl RequestBodyPhase for AuthzEngine {
    fn name(&self) -> &'static str {
        "authz"
    }

    fn body_need(&self, ctx: &RequestCtx, _req: &http::request::Parts) -> BodyNeed {
        if ctx.slots.authz.is_some() {
            BodyNeed::Buffer(usize::MAX)
        } else {
            BodyNeed::None
        }
    }

    fn on_request_body(
        &self,
        ctx: &mut RequestCtx,
        req: &mut http::request::Parts,
        body: &mut Body,
    ) -> Verdict {
        let Some(arrived) = ctx.slots.authz.take() else {
            return Verdict::Continue;
        };
        let data: &[u8] = match body.decoded() {
            Ok(decoded) => decoded,
            Err(_) => body.raw(),
        };
        let ArrivedHead {
            uri,
            headers,
            custom_asked,
        } = *arrived;
        let mut copy;
        let headers = match headers {
            Some(arrived) => {
                copy = arrived;
                &mut copy
            }
            None => &mut req.headers,
        };
        let method = req.method.as_str();
        // A body naming no method of its own (nearly every one) is not decided again.
        let names_none = post_form(method, headers).is_none_or(|form| {
            body_method_overrides(method, form, data, Vec::new())
                .is_ok_and(|named| named.is_empty())
        });
        if names_none {
            return Verdict::Continue;
        }
        let (mut buf, mut owned) = ([0u8; 256], String::new());
        let host = copied_host(&uri, headers, &mut buf, &mut owned);
        let pq = uri.path_and_query().map_or("/", |p| p.as_str());
        let input = self.request_input(ctx, method, host, pq, headers, Some(data));
        let d = self.with_pinned_view(&ctx.namespace, &ctx.labels, |view| {
            self.evaluate_in(view, &input, headers)
        });
        if d.allowed {
            // A CUSTOM rule a method the body names matched: its provider is asked once
            // the body phases ran (the gateway calls it, as it does after the head's).
            if !custom_asked {
                ctx.ext_authz = d.custom;
            }
            return Verdict::Continue;
        }
        self.refusal(ctx, &d)
    }
}

/// `path_and_query` with its path (everything before `?`) replaced by `path`.
fn with_path(path_and_query: &str, path: &str) -> String {
    let query = path_and_query
        .find('?')
        .map_or("", |q| &path_and_query[q..]);
    format!("{path}{query}")
}
