//! `moat bench` (placeholder until its engine lands).

use std::process::ExitCode;

/// Arguments of `moat bench`.
#[derive(clap::Args)]
pub struct BenchArgs {}

/// Runs `moat bench`.
pub fn run(_args: BenchArgs) -> ExitCode {
    eprintln!("moat bench: not built yet");
    ExitCode::from(2)
}
