//! One module per subcommand; each owns its clap arguments and a `run` function.

pub mod apis;
pub mod bench;
pub mod bench_cost;
pub mod certs;
pub mod data;
pub mod docs;
pub mod events;
pub mod policy;
pub mod scan;
pub mod serve;
pub mod waf;
