//! `moat events` (placeholder until its engine lands).

use std::process::ExitCode;

/// Arguments of `moat events`.
#[derive(clap::Args)]
pub struct EventsArgs {}

/// Runs `moat events`.
pub fn run(_args: EventsArgs) -> ExitCode {
    eprintln!("moat events: not built yet");
    ExitCode::from(2)
}
