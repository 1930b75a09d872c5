//! Scans files with a gitleaks-format ruleset and prints the number of findings
//! and the in-process scan time: the process-level counterpart of
//! `gitleaks dir`, used to time both tools on the same files with hyperfine.
//!
//! `cargo run --release -p moat-secrets --example scan_files -- [--repeat N] RULES.toml FILE...`
//!
//! `--repeat N` scans the files N times (one timing for all), so that a
//! profiler (`valgrind --tool=callgrind --toggle-collect='*scan_impl*'`) sees
//! the scan rather than the rule compilation.

use std::process::ExitCode;
use std::time::Instant;

use moat_secrets::Scanner;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut repeat = 1usize;
    if args.first().map(String::as_str) == Some("--repeat") {
        match args.get(1).and_then(|n| n.parse().ok()) {
            Some(n) if n > 0 => repeat = n,
            _ => {
                eprintln!("--repeat needs a positive number");
                return ExitCode::from(2);
            }
        }
        args.drain(..2);
    }
    let Some((rules, files)) = args.split_first() else {
        eprintln!("usage: scan_files [--repeat N] RULES.toml FILE...");
        return ExitCode::from(2);
    };
    let t = Instant::now();
    let scanner = match Scanner::from_file(std::path::Path::new(rules)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let compiled = t.elapsed();
    let mut data = Vec::new();
    for f in files {
        match std::fs::read(f) {
            Ok(d) => data.push((f.as_str(), d)),
            Err(e) => {
                eprintln!("{f}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let t = Instant::now();
    let mut found = 0;
    for _ in 0..repeat {
        found = data
            .iter()
            .map(|(p, d)| scanner.scan(d, Some(p)).len())
            .sum();
    }
    eprintln!(
        "compiled {} rules in {:.1} ms; scanned {} bytes {repeat} times in {:.1} us; {found} findings",
        scanner.rules().len(),
        compiled.as_secs_f64() * 1e3,
        data.iter().map(|(_, d)| d.len()).sum::<usize>(),
        t.elapsed().as_secs_f64() * 1e6
    );
    if found > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
