//! `moat waf`: run requests through the attack-detection engine (`test`) and
//! replay the evaluation corpora in-process (`eval`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use moat_waf::rawhttp::RawRequest;
use moat_waf::{eval, WafConfig, WafEngine};

/// Arguments of `moat waf`.
#[derive(Args)]
pub struct WafArgs {
    #[command(subcommand)]
    command: WafCommand,
}

#[derive(Subcommand)]
enum WafCommand {
    /// Inspect one request (a raw HTTP request file, or --url with --body) and print the findings.
    Test(TestArgs),
    /// Replay the blazehttp and gotestwaf corpora and print detection / false-positive tables.
    Eval(EvalArgs),
}

#[derive(Args)]
struct CommonArgs {
    /// WAF configuration: a YAML file holding the `waf:` section (or a moat config with a `waf:` key).
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct TestArgs {
    /// Raw HTTP/1.x request file (`-` for stdin). Ignored when --url is given.
    file: Option<PathBuf>,
    /// Request URL or path (e.g. `/search?q=1' or '1'='1`).
    #[arg(long)]
    url: Option<String>,
    /// Method for --url.
    #[arg(long, default_value = "GET")]
    method: String,
    /// Request body for --url (`@file` reads a file).
    #[arg(long)]
    body: Option<String>,
    /// Extra header `Name: value` for --url (repeatable).
    #[arg(long = "header", short = 'H')]
    headers: Vec<String>,
    /// Route name used for per-route modes and exclusions.
    #[arg(long, default_value = "default")]
    route: String,
    /// Print findings as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(Args)]
struct EvalArgs {
    /// Directory holding `blazehttp/` and `gotestwaf/` (default: the shared datasets).
    #[arg(long, env = "MOAT_DATASETS")]
    datasets: Option<PathBuf>,
    /// Only the blazehttp corpus.
    #[arg(long, conflicts_with = "gotestwaf_only")]
    blaze_only: bool,
    /// Only the gotestwaf corpus.
    #[arg(long)]
    gotestwaf_only: bool,
    /// Also list every miss and false positive with its strongest finding.
    #[arg(long)]
    mistakes: bool,
    /// Print the reports as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    common: CommonArgs,
}

#[derive(serde::Deserialize)]
struct Wrapped {
    waf: WafConfig,
}

fn load_config(path: Option<&Path>) -> Result<WafConfig, String> {
    let Some(path) = path else {
        return Ok(WafConfig::default());
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match moat_config::from_str::<WafConfig>(path, &text) {
        Ok(c) => Ok(c),
        Err(bare) => match moat_config::from_str::<serde_json::Value>(path, &text) {
            Ok(v) if v.get("waf").is_some() => {
                let w: serde_json::Value = serde_json::json!({ "waf": v["waf"].clone() });
                serde_json::from_value::<Wrapped>(w)
                    .map(|w| w.waf)
                    .map_err(|e| format!("{}: field `waf`: {e}", path.display()))
            }
            _ => Err(bare.to_string()),
        },
    }
}

/// Runs `moat waf`.
pub fn run(args: WafArgs) -> ExitCode {
    match args.command {
        WafCommand::Test(a) => test(a),
        WafCommand::Eval(a) => run_eval(a),
    }
}

fn build(common: &CommonArgs) -> Result<std::sync::Arc<WafEngine>, ExitCode> {
    let cfg = load_config(common.config.as_deref()).map_err(|e| {
        eprintln!("moat waf: {e}");
        ExitCode::from(2)
    })?;
    WafEngine::build(&cfg).map_err(|e| {
        eprintln!("moat waf: {e}");
        ExitCode::from(2)
    })
}

fn request_from_args(a: &TestArgs) -> Result<RawRequest, String> {
    if let Some(url) = &a.url {
        let (host, target) = match url.split_once("://") {
            Some((_, rest)) => match rest.find('/') {
                Some(p) => (rest[..p].to_string(), rest[p..].to_string()),
                None => (rest.to_string(), "/".to_string()),
            },
            None => ("localhost".to_string(), url.clone()),
        };
        let mut headers = vec![("Host".to_string(), host.into_bytes())];
        for h in &a.headers {
            let (n, v) = h
                .split_once(':')
                .ok_or_else(|| format!("--header `{h}`: expected `Name: value`"))?;
            headers.push((n.trim().to_string(), v.trim().as_bytes().to_vec()));
        }
        let body = match &a.body {
            Some(b) if b.starts_with('@') => {
                std::fs::read(&b[1..]).map_err(|e| format!("{}: {e}", &b[1..]))?
            }
            Some(b) => b.clone().into_bytes(),
            None => Vec::new(),
        };
        return Ok(RawRequest {
            method: a.method.clone(),
            target: target.into_bytes(),
            headers,
            body,
        });
    }
    let data = match a.file.as_deref() {
        None => return Err("give a raw request file (or `-` for stdin) or --url".into()),
        Some(p) if p == Path::new("-") => {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut v).map_err(|e| e.to_string())?;
            v
        }
        Some(p) => std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?,
    };
    RawRequest::parse(&data).map_err(|e| e.to_string())
}

fn test(a: TestArgs) -> ExitCode {
    let engine = match build(&a.common) {
        Ok(e) => e,
        Err(c) => return c,
    };
    let req = match request_from_args(&a) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("moat waf test: {e}");
            return ExitCode::from(2);
        }
    };
    let limits = moat_core::DecodeLimits {
        max_output: usize::try_from(engine.config().limits.max_decode_output).unwrap_or(usize::MAX),
        max_ratio: 100,
    };
    let (body, mut extra_limits) = match req.decoded_body(limits) {
        Ok(b) => (b, Vec::new()),
        Err(e) => (Vec::new(), vec![(e, "body".to_string())]),
    };
    let max = usize::try_from(engine.config().limits.max_body_bytes).unwrap_or(usize::MAX);
    let view = req.view();
    let mut f = engine.inspect(
        &a.route,
        &view,
        Some(moat_waf::BodyView {
            data: &body[..body.len().min(max)],
            truncated: body.len() > max,
        }),
    );
    f.limits.append(&mut extra_limits);
    let blocked = engine.would_block(&f);
    if a.json {
        let v = serde_json::json!({
            "verdict": if blocked { "block" } else { "pass" },
            "findings": f.findings,
            "limits": f.limits,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "verdict: {}",
            if blocked {
                format!("block ({})", engine.config().status)
            } else {
                "pass".to_string()
            }
        );
        for x in &f.findings {
            println!(
                "  {:<15} {:>3}  {:<28} {:?}",
                x.attack.name(),
                x.confidence,
                x.location,
                x.fragment
            );
        }
        for (what, loc) in &f.limits {
            println!(
                "  limit {what} at {loc} (on_limit: {:?})",
                engine.config().limits.on_limit
            );
        }
        if f.findings.is_empty() && f.limits.is_empty() {
            println!("  no findings");
        }
    }
    if blocked {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn run_eval(a: EvalArgs) -> ExitCode {
    let engine = match build(&a.common) {
        Ok(e) => e,
        Err(c) => return c,
    };
    let dir = a.datasets.clone().unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/datasets"
        ))
    });
    let mut out = serde_json::Map::new();
    if !a.gotestwaf_only {
        let p = dir.join("blazehttp/dev.jsonl.gz");
        match eval::blaze(&engine, &p) {
            Ok(r) => {
                if a.json {
                    out.insert(
                        "blazehttp".into(),
                        serde_json::to_value(&r).unwrap_or_default(),
                    );
                } else {
                    println!("{}", eval::render_blaze(&r));
                    if a.mistakes {
                        for (id, cat, blocked, desc) in &r.mistakes {
                            println!(
                                "{} {id} {cat} {desc}",
                                if *blocked { "FP  " } else { "MISS" }
                            );
                        }
                        println!();
                    }
                }
            }
            Err(e) => {
                eprintln!("moat waf eval: {}: {e}", p.display());
                return ExitCode::from(2);
            }
        }
    }
    if !a.blaze_only {
        let p = dir.join("gotestwaf/testcases");
        match eval::gotestwaf(&engine, &p) {
            Ok(r) => {
                if a.json {
                    out.insert(
                        "gotestwaf".into(),
                        serde_json::to_value(&r).unwrap_or_default(),
                    );
                } else {
                    println!("{}", eval::render_gotestwaf(&r));
                    if a.mistakes {
                        for (kind, ph, enc, payload, desc) in &r.mistakes {
                            println!("{kind} [{ph}/{enc}] {payload:?} -> {desc}");
                        }
                    }
                }
            }
            Err(e) => {
                eprintln!("moat waf eval: {}: {e}", p.display());
                return ExitCode::from(2);
            }
        }
    }
    if a.json {
        println!("{}", serde_json::Value::Object(out));
    }
    ExitCode::SUCCESS
}
