//! `moat apis` (placeholder until its engine lands).

use std::process::ExitCode;

/// Arguments of `moat apis`.
#[derive(clap::Args)]
pub struct ApisArgs {}

/// Runs `moat apis`.
pub fn run(_args: ApisArgs) -> ExitCode {
    eprintln!("moat apis: not built yet");
    ExitCode::from(2)
}
