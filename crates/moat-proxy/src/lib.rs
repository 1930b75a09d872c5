//! The moat gateway: a reverse proxy that runs the moat-core phase pipeline.
//!
//! * [`config`]: the YAML configuration (types, loading, semantic checks).
//! * [`pipeline`]: the engines of each phase; [`pipeline::build_pipeline`] is where engines are wired.
//! * [`gateway`]: listeners, TLS hand-off, configuration snapshots, hot reload, graceful shutdown.
//! * [`proxy`]: the request path.
//! * [`upstream`]: clusters, round-robin, passive ejection, keep-alive pools.
//! * [`stream`]: a TCP connection, plain or under TLS, as one type.
//! * [`admin`]: the admin listener (a `path -> handler` table).
//! * [`metrics`]: Prometheus counters and per-phase histograms.
//! * [`events`]: the sink for access, security, TLS and tcp-connection records.
//! * `tcp`: `protocol: tcp` listeners (plain, TLS termination, TLS passthrough by SNI).
//! * [`demo`]: the quickstart demo application.

#![warn(missing_docs)]

pub mod admin;
pub mod body;
pub mod config;
mod connection;
pub mod demo;
mod downstream_conn;
pub mod engine_api;
pub mod events;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
mod h1;
pub mod metrics;
pub mod pipeline;
pub mod proxy;
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
pub use state::Shared;

/// The quickstart configuration (`moat serve` without `--config`).
pub const QUICKSTART_YAML: &str = include_str!("../../../examples/quickstart.yaml");
