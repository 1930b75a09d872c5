//! `moat bench`: measures what each of moat's security features costs, against
//! the upstream directly and against other gateways, under published loads.
//!
//! - [`loadgen`]: closed-loop and open-loop (coordinated-omission corrected)
//!   load generator over HTTP/1.1 keep-alive or h2, plain or TLS.
//! - [`upstream`]: a built-in fast upstream with a configurable response.
//! - [`scenario`]: experiment files (`bench/scenarios/*.yaml`).
//! - [`generate`]: Istio policies, JWTs, certificates and moat configs per variant.
//! - [`runner`]: runs a scenario: variants × loads × repetitions.
//! - [`allocs`]: allocations per request of moat, from its admin `/metrics`.
//! - [`stats`], [`report`], [`compare`]: statistics, Markdown/HTML/JSON reports,
//!   baseline-vs-candidate verdicts.

#![warn(missing_docs)]

pub mod allocs;
pub mod compare;
pub mod generate;
pub mod http1;
pub mod loadgen;
pub mod report;
pub mod runner;
pub mod scenario;
pub mod stats;
pub mod sys;
pub mod tls;
pub mod upstream;

pub use moat_config::parse_duration;
