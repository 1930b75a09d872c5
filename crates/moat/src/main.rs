//! The `moat` command line: one binary for the gateway and its tools.

#[cfg(feature = "alloc-stats")]
mod alloc_stats;
mod cmd;
mod memory;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// mimalloc: the request path allocates small, short-lived objects on every request.
#[cfg(not(feature = "alloc-stats"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc with allocation counters, exposed as `moat_allocations_total` on
/// `/metrics` (feature `alloc-stats`, for `moat bench`'s allocations per request).
#[cfg(feature = "alloc-stats")]
#[global_allocator]
static GLOBAL: alloc_stats::CountingMimalloc = alloc_stats::CountingMimalloc;

/// moat: a security gateway (access control, attack detection, secret detection,
/// API discovery and audit in one reverse proxy).
#[derive(Parser)]
#[command(name = "moat", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (with no --config: the quickstart demo on 127.0.0.1:8080).
    Serve(cmd::serve::ServeArgs),
    /// Validate a config file and exit (0 valid, 1 invalid).
    CheckConfig(cmd::serve::CheckConfigArgs),
    /// Measure what each security feature costs (load generator, scenarios, compare).
    Bench(cmd::bench::BenchArgs),
    /// Access-control tools (evaluate Istio policies against one request).
    Policy(cmd::policy::PolicyArgs),
    /// Attack-detection tools (test a request, evaluate against corpora).
    Waf(cmd::waf::WafArgs),
    /// Scan files, git history or stdin for secrets (a drop-in for gitleaks).
    Scan(cmd::scan::ScanArgs),
    /// API inventory tools (export OpenAPI).
    Apis(cmd::apis::ApisArgs),
    /// List, add and lift IP bans through a running gateway's admin API.
    Bans(cmd::bans::BansArgs),
    /// Query the security event store.
    Events(cmd::events::EventsArgs),
    /// Generate a local CA, server and client certificates (and a JWT key) for trying configs.
    Certs(cmd::certs::CertsArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(cmd::docs::CompletionsArgs),
    /// Print or write the man pages.
    Man(cmd::docs::ManArgs),
}

fn main() -> ExitCode {
    #[cfg(feature = "alloc-stats")]
    moat_proxy::metrics::set_allocation_counter(alloc_stats::totals);
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(a) => cmd::serve::run(a),
        Command::CheckConfig(a) => cmd::serve::check_config(a),
        Command::Bench(a) => cmd::bench::run(a),
        Command::Policy(a) => cmd::policy::run(a),
        Command::Waf(a) => cmd::waf::run(a),
        Command::Scan(a) => cmd::scan::run(a),
        Command::Apis(a) => cmd::apis::run(a),
        Command::Bans(a) => cmd::bans::run(a),
        Command::Events(a) => cmd::events::run(a),
        Command::Certs(a) => cmd::certs::run(a),
        Command::Completions(a) => cmd::docs::completions(a, Cli::command()),
        Command::Man(a) => cmd::docs::man(a, Cli::command()),
    }
}
