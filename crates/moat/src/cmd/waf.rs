//! `moat waf` (placeholder until its engine lands).

use std::process::ExitCode;

/// Arguments of `moat waf`.
#[derive(clap::Args)]
pub struct WafArgs {}

/// Runs `moat waf`.
pub fn run(_args: WafArgs) -> ExitCode {
    eprintln!("moat waf: not built yet");
    ExitCode::from(2)
}
