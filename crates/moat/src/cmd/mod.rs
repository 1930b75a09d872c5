//! One module per subcommand; each owns its clap arguments and a `run` function.

pub mod apis;
pub mod bench;
pub mod events;
pub mod policy;
pub mod scan;
pub mod serve;
pub mod waf;
