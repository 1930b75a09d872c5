//! The moat gateway: a reverse proxy that runs the moat-core phase pipeline.
//!
//! Modules in dependency order (each uses only those above it; `scripts/module-cycles`
//! checks there is no circle):
//!
//! * `h1`: the HTTP/1.1 wire format, pure (request and response heads, body framing).
//! * [`jwks_fetch`]: the HTTP(S) client that fetches remote JWKS for the authorization
//!   engine.
//! * [`ext_authz`]: the client of external authorizers (Istio `action: CUSTOM`).
//! * [`config`], [`metrics`], [`events`], [`pipeline`]: the YAML configuration,
//!   Prometheus counters and histograms, the sink for access, security, TLS and
//!   tcp-connection records, the engines of each phase ([`pipeline::build_pipeline`] wires them);
//!   `process_metrics` (CPU, memory, file descriptors from `/proc/self`) is rendered by `metrics`.
//! * `connection`: one downstream connection's shared data, its watchdog, the drain
//!   signal.
//! * `downstream_conn`, `upstream_conn`: a connection's I/O and the bodies read from it
//!   (request bodies from clients; upstream response bodies and the keep-alive pool).
//! * [`body`]: the bodies moat forwards, limits and pace.
//! * [`upstream`]: clusters, round-robin, passive ejection, the exchange.
//! * [`routing`], [`reloads`], [`state`], [`tls_audit`]: routes, the reload history,
//!   the configuration snapshot and the state shared by listeners, the admin API and the
//!   request path; TLS audit as a connection phase.
//! * `otel`: the OpenTelemetry spans of a sampled request (W3C `traceparent`).
//! * [`proxy`]: the request path, one function per phase group.
//! * `server`: the HTTP/1.1 connection loop and the HTTP/2 hand-off.
//! * `tcp`: `protocol: tcp` listeners (plain, TLS termination, TLS passthrough by SNI),
//!   authorized per connection with Istio's TCP semantics.
//! * `decision`: `protocol: decision` listeners, Envoy ext_authz (gRPC and HTTP) and
//!   forward-auth, deciding with the phases of [`proxy`].
//! * [`gateway`]: listeners, TLS hand-off, hot reload, graceful shutdown.
//! * [`admin`], [`engine_api`]: the admin listener and the engines' admin endpoints.
//! * [`demo`]: the quickstart demo application.

#![warn(missing_docs)]

pub mod admin;
pub mod body;
mod check_request;
pub mod config;
mod connection;
mod decision;
pub mod demo;
mod downstream_conn;
pub mod engine_api;
pub mod events;
pub mod ext_authz;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
mod h1;
pub mod jwks_fetch;
pub mod metrics;
mod otel;
pub mod pipeline;
mod process_metrics;
pub mod proxy;
pub mod reloads;
pub mod routing;
mod server;
pub mod state;
mod tcp;
pub mod tls_audit;
pub mod upstream;
mod upstream_conn;

pub use admin::{AdminHandler, AdminRequest, AdminResponse, AdminRouter};
pub use config::{ConfigSource, GatewayConfig};
pub use events::{AccessInfo, EventSink, TcpAccessInfo};
pub use gateway::{Gateway, GatewayOptions, RunningGateway};
pub use pipeline::{build_pipeline, Pipeline, PipelineFactory};
pub use proxy::X_MOAT_EVENT_ID;
pub use state::Shared;

/// The quickstart configuration (`moat serve` without `--config`).
pub const QUICKSTART_YAML: &str = include_str!("../../../examples/quickstart.yaml");
