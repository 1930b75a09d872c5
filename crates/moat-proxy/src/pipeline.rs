//! The phase pipeline: which engines run in which phase.
//!
//! A [`Pipeline`] is built from the configuration when it is loaded (and on
//! every reload) and swapped atomically with the routes and clusters.
//!
//! Wiring an engine is two edits:
//! 1. add its section to [`GatewayConfig`]
//!    (e.g. `pub waf: Option<moat_waf::WafConfig>` with `#[serde(default)]`);
//! 2. add one line to [`build_pipeline`] that builds the engine from that
//!    section and registers it in the phases it implements
//!    (e.g. `p.request_headers.push(engine.clone()); p.request_body.push(engine);`).

use std::sync::Arc;

use std::path::PathBuf;

use moat_authz::AuthzEngine;
use moat_config::ConfigError;
use moat_core::{
    AfterResponsePhase, BodyNeed, ConnectionPhase, RequestBodyPhase, RequestCtx,
    RequestHeadersPhase, ResponseBodyPhase,
};
use moat_inventory::DiscoveryWorker;
use moat_ratelimit::RateLimitEngine;
use moat_ratelimit_store::Background;
use moat_secrets::SecretsEngine;
use moat_waf::WafEngine;
use parking_lot::Mutex;

use crate::config::{ConfigSource, GatewayConfig};
use crate::jwks_fetch::HttpJwksFetcher;

/// The engines of each phase, called in order.
#[derive(Clone, Default)]
pub struct Pipeline {
    /// Called once per downstream TLS handshake.
    pub connection: Vec<Arc<dyn ConnectionPhase>>,
    /// Called with the request head.
    pub request_headers: Vec<Arc<dyn RequestHeadersPhase>>,
    /// Called with the buffered request body (when any of them asks for it).
    pub request_body: Vec<Arc<dyn RequestBodyPhase>>,
    /// Called with the buffered response body (when any of them asks for it).
    pub response_body: Vec<Arc<dyn ResponseBodyPhase>>,
    /// Called after the response, with the finished exchange.
    pub after_response: Vec<Arc<dyn AfterResponsePhase>>,
    /// Typed handles on the configured engines, for the admin API.
    pub engines: Engines,
}

/// The engines other parts of the gateway call by type (the phase lists hold them
/// type-erased).
#[derive(Clone, Default)]
pub struct Engines {
    /// Access control (tcp listeners evaluate each connection with it).
    pub authz: Option<Arc<AuthzEngine>>,
    /// Secret detection (also serves `POST /v1/scan`).
    pub secrets: Option<Arc<SecretsEngine>>,
    /// The external authorizers of `action: CUSTOM` policies (set with access control
    /// when it declares extension providers).
    pub ext_authz: Option<Arc<crate::ext_authz::ExtAuthzClients>>,
    /// API discovery with its worker thread and inventory file (also serves
    /// `GET /v1/apis`); the after-response phase is its engine.
    pub discovery: Option<Arc<DiscoveryWorker>>,
    /// Rate limits, bans and challenge (also serve `/v1/bans`), with the worker that
    /// does their I/O.
    pub ratelimit: Option<(Arc<RateLimitEngine>, Arc<Background>)>,
}

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names = |v: Vec<&'static str>| v.join(",");
        f.debug_struct("Pipeline")
            .field(
                "connection",
                &names(self.connection.iter().map(|p| p.name()).collect()),
            )
            .field(
                "request_headers",
                &names(self.request_headers.iter().map(|p| p.name()).collect()),
            )
            .field(
                "request_body",
                &names(self.request_body.iter().map(|p| p.name()).collect()),
            )
            .field(
                "response_body",
                &names(self.response_body.iter().map(|p| p.name()).collect()),
            )
            .field(
                "after_response",
                &names(self.after_response.iter().map(|p| p.name()).collect()),
            )
            .finish()
    }
}

impl Pipeline {
    /// What the request body phases (and after-response phases wanting bodies) need.
    pub fn request_body_need(&self, ctx: &RequestCtx, req: &http::request::Parts) -> BodyNeed {
        let mut need = BodyNeed::None;
        for p in &self.request_body {
            need = need.max(p.body_need(ctx, req));
        }
        need
    }

    /// Whether a phase reads the trailer fields of this request's body (the trailers of
    /// a body moat streams are then dropped: they would be forwarded uninspected).
    pub fn inspects_request_trailers(&self, ctx: &RequestCtx) -> bool {
        self.request_body.iter().any(|p| p.inspects_trailers(ctx))
    }

    /// Whether any engine inspects the request before it is forwarded (a phase on
    /// its head or its body).
    pub fn inspects_requests(&self) -> bool {
        !self.request_headers.is_empty() || !self.request_body.is_empty()
    }

    /// True when no phase of any kind is configured (plain proxying fast path).
    pub fn is_empty(&self) -> bool {
        self.connection.is_empty()
            && self.request_headers.is_empty()
            && self.request_body.is_empty()
            && self.response_body.is_empty()
            && self.after_response.is_empty()
    }
}

/// Builds the pipeline for a configuration. This is the single place engines are wired.
///
/// Order matters: access control runs first (a denied request costs no inspection),
/// then attack detection on the head; on the body, attack detection before secret
/// detection (a blocked attack is not redacted and forwarded).
pub fn build_pipeline(cfg: &GatewayConfig, src: &ConfigSource) -> Result<Pipeline, ConfigError> {
    build_pipeline_with(cfg, src, &EngineCache::default())
}

/// Engines that own background workers or files and must survive a reload
/// unchanged when their configuration did not change (API discovery keeps its
/// inventory and its worker; a second instance would race on the same database).
#[derive(Default)]
pub struct EngineCache {
    discovery: Mutex<Option<(moat_schema::DiscoveryConfig, PathBuf, Arc<DiscoveryWorker>)>>,
    /// The rate limit engine (unchanged rules keep their buckets, bans are kept) and
    /// its worker, kept while the store's settings do not change.
    ratelimit: Mutex<Option<RateLimitCache>>,
}

struct RateLimitCache {
    store: (moat_ratelimit::StoreConfig, std::time::Duration),
    background: Arc<Background>,
    engine: Arc<RateLimitEngine>,
}

fn engine_error(src: &ConfigSource, field: &str, e: impl std::fmt::Display) -> ConfigError {
    ConfigError::semantic(&src.file, 0, 0, field, e.to_string())
}

/// [`build_pipeline`] reusing long-lived engines from `cache`.
pub fn build_pipeline_with(
    cfg: &GatewayConfig,
    src: &ConfigSource,
    cache: &EngineCache,
) -> Result<Pipeline, ConfigError> {
    let mut p = Pipeline::default();
    if cfg.authz.enabled {
        let e = AuthzEngine::build(&cfg.authz, &src.base_dir, HttpJwksFetcher::shared()).map_err(
            |e| match e {
                moat_authz::AuthzError::Config(c) => c,
                e @ moat_authz::AuthzError::Provider(_) => {
                    engine_error(src, "authz.extension_providers", e)
                }
                other => engine_error(src, "authz", other),
            },
        )?;
        p.request_headers.push(e.clone());
        // First on the body too: a `_method` field it refuses costs no inspection.
        if e.reads_body_methods() {
            p.request_body.push(e.clone());
        }
        p.engines.authz = Some(e);
        if !cfg.authz.extension_providers.is_empty() {
            let clients = crate::ext_authz::ExtAuthzClients::new(
                &cfg.authz.extension_providers,
                &src.base_dir,
            )
            .map_err(|e| engine_error(src, "authz.extension_providers", e))?;
            p.engines.ext_authz = Some(Arc::new(clients));
        }
    }
    // After access control (a limit may key on a JWT claim), before inspection.
    match &cfg.ratelimit {
        Some(rl) => {
            let (e, bg) = ratelimit(cfg, rl, src, cache)?;
            p.request_headers.push(e.clone());
            // Blocks are counted only for automatic bans: without them the
            // after-response step (and its per-request view) is not paid for.
            if e.counts_blocks() {
                p.after_response.push(e.clone());
            }
            p.engines.ratelimit = Some((e, bg));
        }
        None => {
            if let Some(old) = cache.ratelimit.lock().take() {
                old.background.shutdown();
            }
        }
    }
    if cfg.waf.enabled {
        // Virtual patch files resolve against the config file's directory.
        let e = WafEngine::build_with_base(&cfg.waf, &src.base_dir)
            .map_err(|e| engine_error(src, "waf", e))?;
        p.request_headers.push(e.clone());
        p.request_body.push(e);
    }
    if cfg.secrets.enabled {
        let e = SecretsEngine::build(&cfg.secrets, &src.base_dir)
            .map_err(|e| engine_error(src, "secrets", e))?;
        p.request_body.push(e.clone());
        p.response_body.push(e.clone());
        p.engines.secrets = Some(e);
    }
    if cfg.discovery.enabled {
        let mut slot = cache.discovery.lock();
        let reusable = slot
            .as_ref()
            .filter(|(c, dir, _)| *c == cfg.discovery && *dir == src.base_dir)
            .map(|(_, _, d)| d.clone());
        let d = match reusable {
            Some(d) => d,
            None => {
                if let Some((_, _, old)) = slot.take() {
                    old.shutdown();
                }
                let d = DiscoveryWorker::start(&cfg.discovery, &src.base_dir)
                    .map_err(|e| engine_error(src, "discovery", e))?;
                *slot = Some((cfg.discovery.clone(), src.base_dir.clone(), d.clone()));
                d
            }
        };
        p.after_response.push(d.engine().clone());
        p.engines.discovery = Some(d);
    }
    Ok(p)
}

/// The rate limit engine for `rl`, reusing the cached worker when the store did not
/// change and handing the previous engine over (kept buckets and bans).
fn ratelimit(
    cfg: &GatewayConfig,
    rl: &moat_ratelimit::RateLimitConfig,
    src: &ConfigSource,
    cache: &EngineCache,
) -> Result<(Arc<RateLimitEngine>, Arc<Background>), ConfigError> {
    let mut slot = cache.ratelimit.lock();
    let store = (rl.store.clone(), rl.store_timeout);
    if slot.as_ref().is_some_and(|c| c.store != store) {
        if let Some(old) = slot.take() {
            old.background.shutdown();
        }
    }
    let background = match slot.as_ref() {
        Some(c) => c.background.clone(),
        None => Background::start(&rl.store, rl.store_timeout)
            .map_err(|e| engine_error(src, "ratelimit.store", e))?,
    };
    let shared: Option<Arc<dyn moat_ratelimit::LeaseStore>> = match rl.store {
        moat_ratelimit::StoreConfig::Local => None,
        _ => Some(background.clone()),
    };
    let routes: Vec<&str> = cfg.routes.iter().map(|r| r.name.value.as_str()).collect();
    let previous = slot.as_ref().map(|c| c.engine.clone());
    let engine = RateLimitEngine::build(
        rl,
        &src.file,
        &src.base_dir,
        &routes,
        shared,
        previous.as_deref(),
    )?;
    background
        .attach(engine.bans())
        .map_err(|e| engine_error(src, "ratelimit.bans", e))?;
    *slot = Some(RateLimitCache {
        store,
        background: background.clone(),
        engine: engine.clone(),
    });
    Ok((engine, background))
}

/// Builds a pipeline from a configuration; [`build_pipeline`] by default, replaceable
/// (e.g. in tests, or to add engines that are not configured from YAML).
pub type PipelineFactory =
    Arc<dyn Fn(&GatewayConfig, &ConfigSource) -> Result<Pipeline, ConfigError> + Send + Sync>;

/// The default factory: [`build_pipeline_with`] and an engine cache kept across reloads.
pub fn default_factory() -> PipelineFactory {
    let cache = EngineCache::default();
    Arc::new(move |cfg, src| build_pipeline_with(cfg, src, &cache))
}
