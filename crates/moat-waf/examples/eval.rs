//! Corpus replay without building the whole `moat` binary:
//! `cargo run --release -p moat-waf --example eval -- [DATASETS_DIR] [--mistakes]`.
use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mistakes = args.iter().any(|a| a == "--mistakes");
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/datasets"
            ))
        });
    let engine = match moat_waf::WafEngine::build(&moat_waf::WafConfig::default()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    match moat_waf::eval::blaze(&engine, &dir.join("blazehttp/dev.jsonl.gz")) {
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
    match moat_waf::eval::gotestwaf(&engine, &dir.join("gotestwaf/testcases")) {
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
