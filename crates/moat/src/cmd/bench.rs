//! `moat bench`: scenarios, an ad-hoc load generator, the built-in upstream, the
//! generator's self-test, and baseline-vs-candidate comparison.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use moat_bench::loadgen::{self, LoadSpec, Mode, Protocol, RequestTemplate, Target};
use moat_bench::scenario::Cpus;

/// Arguments of `moat bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Run a scenario file (bench/scenarios/*.yaml): every variant under every load.
    Run(RunArgs),
    /// Validate a scenario file and exit (0 valid, 1 invalid).
    Check {
        /// Scenario file.
        scenario: PathBuf,
    },
    /// Send load to one URL (like wrk / wrk2) and print the latency summary.
    Load(LoadArgs),
    /// Run the built-in upstream alone (to put another gateway in front of it).
    Upstream(UpstreamArgs),
    /// Measure the load generator's own maximum against the built-in upstream.
    Selftest(SelftestArgs),
    /// Compare two report.json files; exit 1 when a metric regressed beyond the threshold.
    Compare(CompareArgs),
    /// The work each engine of a config adds to one request, in process: allocations
    /// per request (with `alloc-stats`); instructions with `scripts/engine-cost`.
    Cost(super::bench_cost::CostArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Scenario file.
    scenario: PathBuf,
    /// Output directory (default: moat-bench-out/NAME, NAME being the scenario's name).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Only these variants (comma separated).
    #[arg(long, value_delimiter = ',')]
    variants: Option<Vec<String>>,
    /// Only these loads (comma separated).
    #[arg(long, value_delimiter = ',')]
    loads: Option<Vec<String>>,
    /// Extra variant: NAME=http://127.0.0.1:PORT (another gateway in front of the
    /// built-in upstream, started with `moat bench upstream`).
    #[arg(long = "target", value_name = "NAME=URL")]
    targets: Vec<String>,
    /// Repetitions per cell (confidence intervals need 2 or more).
    #[arg(long)]
    repetitions: Option<u32>,
    /// Measured duration of every load (e.g. 10s).
    #[arg(long, value_parser = moat_bench::parse_duration)]
    duration: Option<Duration>,
    /// Warm-up of every load (e.g. 2s).
    #[arg(long, value_parser = moat_bench::parse_duration)]
    warmup: Option<Duration>,
    /// CPU pinning as LOAD,UPSTREAM,MOAT (e.g. 0,0,1).
    #[arg(long)]
    cpus: Option<String>,
    /// The moat executable to benchmark (default: this one).
    #[arg(long)]
    moat_bin: Option<PathBuf>,
}

#[derive(clap::Args)]
struct LoadArgs {
    /// Target URL, e.g. http://127.0.0.1:8080/api (loopback only).
    url: String,
    /// Connections.
    #[arg(short, long, default_value_t = 8)]
    connections: usize,
    /// Open loop at this many requests per second (default: closed loop).
    #[arg(short, long)]
    rate: Option<f64>,
    /// Measured duration.
    #[arg(short, long, default_value = "10s", value_parser = moat_bench::parse_duration)]
    duration: Duration,
    /// Warm-up.
    #[arg(long, default_value = "1s", value_parser = moat_bench::parse_duration)]
    warmup: Duration,
    /// Stop after this many measured requests.
    #[arg(short = 'n', long)]
    requests: Option<u64>,
    /// Method.
    #[arg(short = 'X', long, default_value = "GET")]
    method: String,
    /// Header `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Request body from a file.
    #[arg(long)]
    body_file: Option<PathBuf>,
    /// Use h2 (prior knowledge on http://, ALPN on https://).
    #[arg(long)]
    h2: bool,
    /// Concurrent streams per h2 connection.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// A new connection per request (measures handshakes).
    #[arg(long)]
    new_connection_per_request: bool,
    /// Client certificate chain (PEM, leaf first) presented when an https://
    /// target asks for one (mTLS); needs --key.
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// Pin the generator to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct UpstreamArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:18080")]
    listen: std::net::SocketAddr,
    /// Response body file (default: `hello`).
    #[arg(long)]
    body_file: Option<PathBuf>,
    /// Content-Type.
    #[arg(long)]
    content_type: Option<String>,
    /// Pin to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Stop after this long (default: run until interrupted).
    #[arg(long, value_parser = moat_bench::parse_duration)]
    duration: Option<Duration>,
}

#[derive(clap::Args)]
struct SelftestArgs {
    /// Connections.
    #[arg(short, long, default_value_t = 32)]
    connections: usize,
    /// Measured duration.
    #[arg(short, long, default_value = "5s", value_parser = moat_bench::parse_duration)]
    duration: Duration,
    /// CPU of the generator.
    #[arg(long, default_value_t = 0)]
    cpu_load: usize,
    /// CPU of the upstream.
    #[arg(long, default_value_t = 1)]
    cpu_upstream: usize,
}

#[derive(clap::Args)]
struct CompareArgs {
    /// Baseline report.json.
    base: PathBuf,
    /// Candidate report.json.
    candidate: PathBuf,
    /// Relative change that counts as a regression (e.g. 5% or 0.05).
    #[arg(long, default_value = "5%")]
    threshold: String,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    json: bool,
}

/// Runs `moat bench`.
pub fn run(args: BenchArgs) -> ExitCode {
    let result = match args.command {
        BenchCommand::Run(a) => run_scenario(a),
        BenchCommand::Check { scenario } => match moat_bench::scenario::Scenario::load(&scenario) {
            Ok(s) => {
                outln!(
                    "{}: ok ({} load(s), {} variant(s), {} repetition(s))",
                    scenario.display(),
                    s.loads.len(),
                    s.variants.len(),
                    s.repetitions
                );
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("{e}");
                Ok(ExitCode::from(1))
            }
        },
        BenchCommand::Load(a) => load(a),
        BenchCommand::Upstream(a) => upstream(a),
        BenchCommand::Selftest(a) => selftest(a),
        BenchCommand::Compare(a) => compare(a),
        BenchCommand::Cost(a) => return super::bench_cost::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moat bench: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn parse_cpus(s: &str) -> anyhow::Result<Cpus> {
    let v: Vec<usize> = s
        .split(',')
        .map(|x| x.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--cpus: expected LOAD,UPSTREAM,MOAT, e.g. 0,0,1"))?;
    anyhow::ensure!(
        v.len() == 3,
        "--cpus: expected LOAD,UPSTREAM,MOAT, e.g. 0,0,1"
    );
    Ok(Cpus {
        load: v[0],
        upstream: v[1],
        moat: v[2],
    })
}

fn run_scenario(a: RunArgs) -> anyhow::Result<ExitCode> {
    let targets = a
        .targets
        .iter()
        .map(|t| {
            t.split_once('=')
                .map(|(n, u)| (n.to_string(), u.to_string()))
                .ok_or_else(|| anyhow::anyhow!("--target {t}: expected NAME=URL"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let moat_bin = match a.moat_bin {
        Some(p) => p,
        None => std::env::current_exe()?,
    };
    let scenario_name = moat_bench::scenario::Scenario::load(&a.scenario)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .name;
    let out_dir = a
        .out
        .unwrap_or_else(|| PathBuf::from("moat-bench-out").join(&scenario_name));
    let opts = moat_bench::runner::RunOptions {
        scenario: a.scenario,
        out_dir: out_dir.clone(),
        moat_bin,
        variants: a.variants,
        loads: a.loads,
        targets,
        repetitions: a.repetitions,
        duration: a.duration,
        warmup: a.warmup,
        cpus: a.cpus.as_deref().map(parse_cpus).transpose()?,
        command: std::env::args().collect::<Vec<_>>().join(" "),
    };
    let report = moat_bench::runner::run(&opts, &mut |m| eprintln!("{m}"))?;
    outln!("{}", moat_bench::report::markdown(&report));
    eprintln!(
        "wrote {0}/report.md, {0}/report.html, {0}/report.json",
        out_dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn load(a: LoadArgs) -> anyhow::Result<ExitCode> {
    let target = Target::parse(&a.url).map_err(|e| anyhow::anyhow!(e))?;
    let client_identity = match (&a.cert, &a.key) {
        (Some(cert), Some(key)) => {
            anyhow::ensure!(target.tls, "--cert needs an https:// URL");
            Some(std::sync::Arc::new(
                moat_bench::tls::ClientIdentity::from_pem_files(cert, key)?,
            ))
        }
        _ => None,
    };
    let mut req = RequestTemplate::get("");
    req.method = a.method.clone();
    if target.base_path.is_empty() {
        req.path = "/".into();
    }
    for h in &a.headers {
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("--header `{h}`: expected `Name: value`"))?;
        req.headers
            .push((k.trim().to_string(), v.trim().to_string()));
    }
    if let Some(f) = &a.body_file {
        req.body = moat_bench::scenario::read_body_file(f)?.into();
    }
    let spec = LoadSpec {
        target,
        protocol: if a.h2 { Protocol::H2 } else { Protocol::Http1 },
        requests: vec![req],
        connections: a.connections,
        streams: a.streams,
        mode: a.rate.map_or(Mode::Closed, |rate| Mode::Open { rate }),
        warmup: a.warmup,
        duration: a.duration,
        max_requests: a.requests,
        new_connection_per_request: a.new_connection_per_request,
        client_identity,
        grace: Duration::from_secs(2),
        on_measure_start: None,
    };
    let res = loadgen::run(&spec, a.cpu)?;
    print_result(&res, a.json)?;
    Ok(ExitCode::SUCCESS)
}

fn print_result(res: &loadgen::LoadResult, json: bool) -> anyhow::Result<()> {
    let s = res.summary();
    let text = if json {
        serde_json::to_string_pretty(&serde_json::json!({
            "rps": res.rps(), "responses": res.responses, "errors": res.errors,
            "elapsed_s": res.elapsed_s, "bytes": res.bytes,
            "connections_opened": res.connections_opened, "latency_us": s,
            "generator_cpu_s": res.generator_cpu_s,
        }))? + "\n"
    } else {
        format!(
            "{:.0} req/s, {} responses in {:.2}s, errors {} (io {}, timeouts {}, 4xx {}, 5xx {}, gRPC {}), {} connections opened\n\
             latency µs: mean {:.1}  p50 {:.1}  p90 {:.1}  p95 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}\n",
            res.rps(), res.responses, res.elapsed_s, res.errors.total(), res.errors.io,
            res.errors.timeouts, res.errors.status_4xx, res.errors.status_5xx, res.errors.grpc,
            res.connections_opened,
            s.mean_us, s.p50_us, s.p90_us, s.p95_us, s.p99_us, s.p999_us, s.max_us
        )
    };
    out!("{text}");
    Ok(())
}

fn upstream(a: UpstreamArgs) -> anyhow::Result<ExitCode> {
    let mut cfg = moat_bench::upstream::UpstreamConfig {
        bind: a.listen,
        cpu: a.cpu,
        ..Default::default()
    };
    if let Some(f) = &a.body_file {
        cfg.body = moat_bench::scenario::read_body_file(f)?.into();
        if f.extension().is_some_and(|e| e == "json") {
            cfg.content_type = "application/json".into();
        }
    }
    if let Some(ct) = a.content_type {
        cfg.content_type = ct;
    }
    let up = moat_bench::upstream::Upstream::start(cfg)?;
    eprintln!("upstream listening on http://{}", up.addr());
    match a.duration {
        Some(d) => std::thread::sleep(d),
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
    eprintln!("{} requests served", up.requests());
    Ok(ExitCode::SUCCESS)
}

fn selftest(a: SelftestArgs) -> anyhow::Result<ExitCode> {
    let up = moat_bench::upstream::Upstream::start(moat_bench::upstream::UpstreamConfig {
        cpu: Some(a.cpu_upstream),
        ..Default::default()
    })?;
    let target = Target::parse(&format!("http://{}", up.addr())).map_err(|e| anyhow::anyhow!(e))?;
    let mut spec = LoadSpec::closed(target, vec![RequestTemplate::get("/")], a.connections);
    spec.duration = a.duration;
    let res = loadgen::run(&spec, Some(a.cpu_load))?;
    outln!(
        "load generator on CPU {}, upstream on CPU {}, {} connections, closed loop, HTTP/1.1 keep-alive:",
        a.cpu_load, a.cpu_upstream, a.connections
    );
    print_result(&res, false)?;
    outln!(
        "generator thread CPU: {:.2} s for {} responses (warm-up included) = {:.0} responses per CPU-second; load average {}",
        res.generator_cpu_s,
        res.total_responses,
        res.responses_per_generator_cpu_s(),
        moat_bench::report::loadavg()
    );
    Ok(ExitCode::SUCCESS)
}

fn compare(a: CompareArgs) -> anyhow::Result<ExitCode> {
    let threshold =
        moat_bench::compare::parse_threshold(&a.threshold).map_err(|e| anyhow::anyhow!(e))?;
    let read = |p: &PathBuf| -> anyhow::Result<moat_bench::report::Report> {
        let text = std::fs::read_to_string(p)
            .map_err(|e| anyhow::anyhow!("{}: cannot read: {e}", p.display()))?;
        serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{}: not a moat bench report: {e}", p.display()))
    };
    let (base, cand) = (read(&a.base)?, read(&a.candidate)?);
    let lines = moat_bench::compare::compare(&base, &cand, threshold);
    anyhow::ensure!(
        !lines.is_empty(),
        "the reports have no (load, variant) cell in common"
    );
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&lines)?);
    } else {
        out!("{}", moat_bench::compare::markdown(&lines, threshold));
    }
    let regressed = lines
        .iter()
        .any(|l| l.verdict == moat_bench::compare::Verdict::Regressed);
    Ok(if regressed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
