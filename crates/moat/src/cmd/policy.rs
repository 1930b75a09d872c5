//! `moat policy` (placeholder until its engine lands).

use std::process::ExitCode;

/// Arguments of `moat policy`.
#[derive(clap::Args)]
pub struct PolicyArgs {}

/// Runs `moat policy`.
pub fn run(_args: PolicyArgs) -> ExitCode {
    eprintln!("moat policy: not built yet");
    ExitCode::from(2)
}
