//! Corpus replay without building the whole `moat` binary:
//! `cargo run --release -p moat-waf --example eval -- [DATASETS_DIR] [--split A|B]
//! [--sensitivity low|balanced|strict] [--mistakes]`.
//!
//! Both halves are reported unless `--split` selects one; `--mistakes` lists the
//! misses and false positives of what was replayed (develop with `--split A`).
use std::path::PathBuf;

use moat_waf::eval::Half;
use moat_waf::Sensitivity;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mistakes = args.iter().any(|a| a == "--mistakes");
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let split: Option<Half> = match value("--split").map(|s| s.parse()) {
        None => None,
        Some(Ok(h)) => Some(h),
        Some(Err(e)) => {
            eprintln!("--split {e}");
            std::process::exit(2);
        }
    };
    let sensitivity = match value("--sensitivity").as_deref() {
        None | Some("balanced") => Sensitivity::Balanced,
        Some("low") => Sensitivity::Low,
        Some("strict") => Sensitivity::Strict,
        Some(o) => {
            eprintln!("--sensitivity `{o}`: expected low, balanced or strict");
            std::process::exit(2);
        }
    };
    let flag_values = ["--split", "--sensitivity"];
    let dir = args
        .iter()
        .enumerate()
        .find(|(i, a)| {
            !a.starts_with("--") && (*i == 0 || !flag_values.contains(&args[i - 1].as_str()))
        })
        .map(|(_, a)| PathBuf::from(a))
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/datasets"
            ))
        });
    let cfg = moat_waf::WafConfig {
        sensitivity,
        ..Default::default()
    };
    let engine = match moat_waf::WafEngine::build(&cfg) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    println!("sensitivity: {}\n", sensitivity.name());
    match moat_waf::eval::blaze(&engine, &dir.join("blazehttp/dev.jsonl.gz"), split) {
        Ok(r) => {
            println!("{}", moat_waf::eval::render_blaze(&r));
            if mistakes {
                for (id, cat, blocked, desc) in &r.mistakes {
                    println!(
                        "{} {id} {cat} {desc}",
                        if *blocked { "FP  " } else { "MISS" }
                    );
                }
                for (id, cat, desc) in &r.near_misses {
                    println!("NEAR {id} {cat} {desc}");
                }
            }
        }
        Err(e) => eprintln!("blazehttp: {e}"),
    }
    match moat_waf::eval::gotestwaf(&engine, &dir.join("gotestwaf/testcases"), split) {
        Ok(r) => {
            println!("{}", moat_waf::eval::render_gotestwaf(&r));
            if mistakes {
                for (kind, ph, enc, payload, desc) in &r.mistakes {
                    println!("{kind} [{ph}/{enc}] {payload:?} -> {desc}");
                }
            }
        }
        Err(e) => eprintln!("gotestwaf: {e}"),
    }
}
