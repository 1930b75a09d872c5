//! The phase pipeline: which engines run in which phase.
//!
//! A [`Pipeline`] is built from the configuration when it is loaded (and on
//! every reload) and swapped atomically with the routes and clusters.
//!
//! Wiring an engine is two edits:
//! 1. add its section to [`GatewayConfig`](crate::config::GatewayConfig)
//!    (e.g. `pub waf: Option<moat_waf::WafConfig>` with `#[serde(default)]`);
//! 2. add one line to [`build_pipeline`] that builds the engine from that
//!    section and registers it in the phases it implements
//!    (e.g. `p.request_headers.push(engine.clone()); p.request_body.push(engine);`).

use std::sync::Arc;

use moat_config::ConfigError;
use moat_core::{
    AfterResponsePhase, BodyNeed, ConnectionPhase, RequestBodyPhase, RequestCtx,
    RequestHeadersPhase, ResponseBodyPhase, ResponseHeadersPhase,
};

use crate::config::{ConfigSource, GatewayConfig};

/// The engines of each phase, called in order.
#[derive(Clone, Default)]
pub struct Pipeline {
    /// Called once per downstream TLS handshake.
    pub connection: Vec<Arc<dyn ConnectionPhase>>,
    /// Called with the request head.
    pub request_headers: Vec<Arc<dyn RequestHeadersPhase>>,
    /// Called with the buffered request body (when any of them asks for it).
    pub request_body: Vec<Arc<dyn RequestBodyPhase>>,
    /// Called with the upstream response head.
    pub response_headers: Vec<Arc<dyn ResponseHeadersPhase>>,
    /// Called with the buffered response body (when any of them asks for it).
    pub response_body: Vec<Arc<dyn ResponseBodyPhase>>,
    /// Called after the response, with the finished exchange.
    pub after_response: Vec<Arc<dyn AfterResponsePhase>>,
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
                "response_headers",
                &names(self.response_headers.iter().map(|p| p.name()).collect()),
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

/// Combines two body needs: the larger buffer wins.
pub fn max_need(a: BodyNeed, b: BodyNeed) -> BodyNeed {
    match (a, b) {
        (BodyNeed::None, x) | (x, BodyNeed::None) => x,
        (BodyNeed::Buffer(x), BodyNeed::Buffer(y)) => BodyNeed::Buffer(x.max(y)),
    }
}

impl Pipeline {
    /// What the request body phases (and after-response phases wanting bodies) need.
    pub fn request_body_need(&self, ctx: &RequestCtx, req: &http::request::Parts) -> BodyNeed {
        let mut need = BodyNeed::None;
        for p in &self.request_body {
            need = max_need(need, p.body_need(ctx, req));
        }
        need
    }

    /// True when no phase of any kind is configured (plain proxying fast path).
    pub fn is_empty(&self) -> bool {
        self.connection.is_empty()
            && self.request_headers.is_empty()
            && self.request_body.is_empty()
            && self.response_headers.is_empty()
            && self.response_body.is_empty()
            && self.after_response.is_empty()
    }
}

/// Builds the pipeline for a configuration. This is the single place engines are wired.
pub fn build_pipeline(cfg: &GatewayConfig, src: &ConfigSource) -> Result<Pipeline, ConfigError> {
    let _ = (cfg, src);
    let p = Pipeline::default();
    // Engines are added here at integration time, one line each, e.g.:
    //   if let Some(c) = &cfg.waf { let e = Arc::new(moat_waf::Engine::build(c, &src.base_dir)?); p.request_headers.push(e.clone()); p.request_body.push(e); }
    Ok(p)
}

/// Builds a pipeline from a configuration; [`build_pipeline`] by default, replaceable
/// (e.g. in tests, or to add engines that are not configured from YAML).
pub type PipelineFactory =
    Arc<dyn Fn(&GatewayConfig, &ConfigSource) -> Result<Pipeline, ConfigError> + Send + Sync>;

/// The default factory: [`build_pipeline`].
pub fn default_factory() -> PipelineFactory {
    Arc::new(build_pipeline)
}
