//! `moat serve` and `moat check-config` (placeholder until the proxy lands).

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `moat serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Config file; without it moat runs the quickstart demo.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// Arguments of `moat check-config`.
#[derive(clap::Args)]
pub struct CheckConfigArgs {
    /// Config file to validate.
    pub file: PathBuf,
}

/// Runs `moat serve`.
pub fn run(_args: ServeArgs) -> ExitCode {
    eprintln!("moat serve: not built yet");
    ExitCode::from(2)
}

/// Runs `moat check-config`.
pub fn check_config(_args: CheckConfigArgs) -> ExitCode {
    eprintln!("moat check-config: not built yet");
    ExitCode::from(2)
}
