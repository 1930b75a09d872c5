//! `moat scan` (placeholder until its engine lands).

use std::process::ExitCode;

/// Arguments of `moat scan`.
#[derive(clap::Args)]
pub struct ScanArgs {}

/// Runs `moat scan`.
pub fn run(_args: ScanArgs) -> ExitCode {
    eprintln!("moat scan: not built yet");
    ExitCode::from(2)
}
