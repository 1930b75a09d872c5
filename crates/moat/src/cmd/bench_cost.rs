//! `moat bench cost`: the work each engine adds to one request, measured in process.
//!
//! The engines of a moat config run on one request, over and over, in the order and
//! with the calls the proxy makes (request headers, the body needs, the request body,
//! the response body, after the response and its deferred work), without sockets: what
//! is left is the engines' own work. Each engine is measured alone (the pipeline keeps
//! only its phases), then all together, and a run with no engine gives the harness's
//! own cost, which the table subtracts.
//!
//! Allocations per request come from the counting allocator (a binary built with the
//! `alloc-stats` feature). Instructions and CPU time per request come from the
//! thread's perf counters ([`thread_counters`]) where the machine has them. Virtual
//! machines often lack the hardware instruction counter; `scripts/engine-cost` runs
//! this command under callgrind instead (collecting only inside [`measured`], see
//! there), which counts the same instructions on any machine and repeats to the
//! instruction whatever else runs.

mod thread_counters;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use bytes::Bytes;
use moat_core::{BodyNeed, DecodeLimits, Finished, RequestCtx, Verdict};
use moat_proxy::config::{self, ConfigSource};
use moat_proxy::pipeline::{build_pipeline, Pipeline};
use thread_counters::ThreadCounter;

/// Arguments of `moat bench cost`.
#[derive(clap::Args)]
pub struct CostArgs {
    /// A moat config with the engines to measure (e.g. bench/peer-all.yaml).
    config: PathBuf,
    /// Measure exactly these engines together (comma separated; `none`: the harness
    /// alone). Default: no engine, each engine the config enables alone, then all of
    /// them.
    #[arg(long, value_delimiter = ',')]
    engines: Option<Vec<String>>,
    /// Requests per measurement (after as many warm-up requests).
    #[arg(short = 'n', long, default_value_t = 2000)]
    requests: u64,
    /// Method.
    #[arg(short = 'X', long, default_value = "GET")]
    method: String,
    /// Request target.
    #[arg(long, default_value = "/api/items?page=1")]
    path: String,
    /// Request header `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// Request body from a file.
    #[arg(long)]
    body_file: Option<PathBuf>,
    /// Response body from a file (default: a small JSON object), sent as
    /// `application/json`.
    #[arg(long)]
    response_file: Option<PathBuf>,
    /// Between requests, write this many KiB of other memory (one byte per cache
    /// line), so that each request starts with caches holding someone else's data,
    /// as under the peer protocol, where the upstream runs on moat's CPU between its
    /// requests. The `none` row pays the same eviction, so the added columns are
    /// each engine's cost from cold caches. 0: warm caches (the default); at most
    /// 1048576 (1 GiB).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(..=1 << 20))]
    evict_kib: u64,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// One request as the engines see it.
struct Exchange {
    head: http::request::Parts,
    body: Option<Bytes>,
    response: http::response::Parts,
    response_body: Bytes,
    route: String,
    /// The route's workload, shared by every request as the proxy's route shares it
    /// (access control finds its view of a workload by these `Arc`s' addresses).
    labels: Arc<BTreeMap<String, String>>,
    namespace: Arc<str>,
}

/// What one measurement found, per request.
#[derive(serde::Serialize)]
struct Cost {
    engines: String,
    requests: u64,
    blocked: u64,
    allocs_per_req: Option<f64>,
    alloc_bytes_per_req: Option<f64>,
    /// User-space instructions retired (hardware counter; `None` without one).
    instructions_per_req: Option<f64>,
    /// CPU time of the measuring thread (the kernel's task clock).
    cpu_ns_per_req: Option<f64>,
    /// Wall time.
    ns_per_req: f64,
}

/// The thread's counters, opened once for every measurement.
struct Counters {
    instructions: ThreadCounter,
    cpu_time: ThreadCounter,
}

/// Runs `moat bench cost`.
pub fn run(a: CostArgs) -> ExitCode {
    match cost(a) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("moat bench cost: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn cost(a: CostArgs) -> anyhow::Result<ExitCode> {
    let (cfg, src) = config::load_file(&a.config).map_err(|e| anyhow::anyhow!("{e}"))?;
    let full = build_pipeline(&cfg, &src).map_err(|e| anyhow::anyhow!("{e}"))?;
    let ex = exchange(&a, &cfg, &src)?;
    let configured = engine_names(&full);
    let sets: Vec<Vec<String>> = match &a.engines {
        Some(list) if list.iter().all(|e| e == "none") => vec![Vec::new()],
        Some(list) => {
            for e in list {
                anyhow::ensure!(
                    configured.contains(e),
                    "engine `{e}` is not enabled in {} (enabled: {})",
                    a.config.display(),
                    configured.join(", ")
                );
            }
            vec![list.clone()]
        }
        None => {
            let mut sets = vec![Vec::new()];
            sets.extend(configured.iter().map(|n| vec![n.clone()]));
            if configured.len() > 1 {
                sets.push(configured.clone());
            }
            sets
        }
    };
    let mut counters = Counters {
        instructions: ThreadCounter::instructions(),
        cpu_time: ThreadCounter::cpu_time(),
    };
    let rows: Vec<Cost> = sets
        .iter()
        .map(|set| measure(&full, set, &ex, a.requests, a.evict_kib, &mut counters))
        .collect();
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows, &counters);
    }
    Ok(ExitCode::SUCCESS)
}

/// The engines of a pipeline, in the order they first appear.
fn engine_names(p: &Pipeline) -> Vec<String> {
    let mut names: Vec<&'static str> = Vec::new();
    let all = p
        .request_headers
        .iter()
        .map(|x| x.name())
        .chain(p.request_body.iter().map(|x| x.name()))
        .chain(p.response_body.iter().map(|x| x.name()))
        .chain(p.after_response.iter().map(|x| x.name()));
    for n in all {
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names.into_iter().map(String::from).collect()
}

/// The pipeline with only the phases of `engines`.
fn only(p: &Pipeline, engines: &[String]) -> Pipeline {
    let keep = |n: &str| engines.iter().any(|e| e == n);
    Pipeline {
        connection: Vec::new(),
        request_headers: p
            .request_headers
            .iter()
            .filter(|x| keep(x.name()))
            .cloned()
            .collect(),
        request_body: p
            .request_body
            .iter()
            .filter(|x| keep(x.name()))
            .cloned()
            .collect(),
        response_body: p
            .response_body
            .iter()
            .filter(|x| keep(x.name()))
            .cloned()
            .collect(),
        after_response: p
            .after_response
            .iter()
            .filter(|x| keep(x.name()))
            .cloned()
            .collect(),
        engines: p.engines.clone(),
    }
}

fn exchange(
    a: &CostArgs,
    cfg: &config::GatewayConfig,
    src: &ConfigSource,
) -> anyhow::Result<Exchange> {
    let mut b = http::Request::builder()
        .method(a.method.as_str())
        .uri(a.path.as_str())
        .header("host", "bench.test")
        .header("user-agent", "moat-bench");
    for h in &a.headers {
        let (n, v) = h
            .split_once(':')
            .with_context(|| format!("header `{h}`: expected `Name: value`"))?;
        b = b.header(n.trim(), v.trim());
    }
    let body = match &a.body_file {
        Some(f) => {
            let data = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            b = b.header("content-length", data.len());
            Some(Bytes::from(data))
        }
        None => None,
    };
    let head = b.body(()).context("request")?.into_parts().0;
    let response_body = match &a.response_file {
        Some(f) => {
            Bytes::from(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?)
        }
        None => Bytes::from_static(br#"{"id":1,"name":"item","tags":["a","b"],"price":9.5}"#),
    };
    let response = http::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("content-length", response_body.len())
        .body(())
        .context("response")?
        .into_parts()
        .0;
    // The route the proxy would pick for this request, and the workload behind it.
    let route = cfg
        .routes
        .first()
        .with_context(|| format!("{}: no route", src.file.display()))?;
    let cluster = cfg
        .clusters
        .iter()
        .find(|c| c.name.value == route.cluster.value)
        .with_context(|| {
            format!(
                "{}: no cluster `{}`",
                src.file.display(),
                route.cluster.value
            )
        })?;
    Ok(Exchange {
        head,
        body,
        response,
        response_body,
        route: route.name.value.clone(),
        labels: Arc::new(cluster.labels.clone()),
        namespace: cluster.namespace.as_str().into(),
    })
}

fn measure(
    full: &Pipeline,
    engines: &[String],
    ex: &Exchange,
    n: u64,
    evict_kib: u64,
    counters: &mut Counters,
) -> Cost {
    let p = only(full, engines);
    // Warm-up: caches, lazily built matchers, the discovery window's first sample.
    warm_up(&p, ex, n);
    // filled, so that its pages exist before the measurement
    let mut other = vec![1u8; (evict_kib as usize) << 10];
    let a0 = moat_proxy::metrics::allocation_totals();
    counters.instructions.start();
    counters.cpu_time.start();
    let t = Instant::now();
    let blocked = measured(&p, ex, n, &mut other);
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let cpu_ns = counters.cpu_time.stop();
    let instructions = counters.instructions.stop();
    let a1 = moat_proxy::metrics::allocation_totals();
    let per = |x: u64| x as f64 / n as f64;
    let (allocs, bytes) = match (a0, a1) {
        (Some(a0), Some(a1)) => (
            Some(per(a1.calls - a0.calls)),
            Some(per(a1.bytes - a0.bytes)),
        ),
        _ => (None, None),
    };
    Cost {
        engines: if engines.is_empty() {
            "none".into()
        } else {
            engines.join(",")
        },
        requests: n,
        blocked,
        allocs_per_req: allocs,
        alloc_bytes_per_req: bytes,
        instructions_per_req: instructions.map(per),
        cpu_ns_per_req: cpu_ns.map(per),
        ns_per_req: ns,
    }
}

/// The warm-up loop, a function of its own so that callgrind does not collect inside
/// it: what is built once (matchers compiled on first use, per-thread caches) is not
/// work per request, and would otherwise be spread over the measured requests.
#[inline(never)]
fn warm_up(p: &Pipeline, ex: &Exchange, n: u64) {
    for _ in 0..n {
        one(p, ex);
    }
}

/// The measured loop: `n` requests through `p`, each followed by a write to every
/// cache line of `other` (empty: none); returns how many were answered by a phase.
/// Not inlined, so that callgrind can collect inside it alone
/// (`--toggle-collect='*bench_cost::measured*'`).
#[inline(never)]
fn measured(p: &Pipeline, ex: &Exchange, n: u64, other: &mut [u8]) -> u64 {
    let mut blocked = 0;
    for _ in 0..n {
        blocked += u64::from(one(p, ex));
        for line in other.chunks_mut(64) {
            line[0] = line[0].wrapping_add(1);
        }
        std::hint::black_box(&mut *other);
    }
    blocked
}

/// One request through the phases, as `moat_proxy::proxy` calls them; true when a
/// phase answered it.
fn one(p: &Pipeline, ex: &Exchange) -> bool {
    let mut ctx = RequestCtx::for_test(&ex.route);
    ctx.labels = ex.labels.clone();
    ctx.namespace = ex.namespace.clone();
    let mut head = ex.head.clone();
    for ph in &p.request_headers {
        if let Verdict::Respond(_) = ph.on_request_headers(&mut ctx, &mut head) {
            return true;
        }
    }
    let mut keep = BodyNeed::None;
    for ph in &p.after_response {
        keep = keep.max(ph.wants_bodies(&mut ctx, &head));
    }
    let need = keep.max(p.request_body_need(&ctx, &head));
    let mut kept_request = None;
    let buffered = ex.body.as_ref().filter(|data| match need {
        BodyNeed::Buffer(_) => true,
        BodyNeed::BufferText(_) => !moat_core::starts_binary(data),
        BodyNeed::None => false,
    });
    if let Some(data) = buffered {
        let mut body = moat_core::Body::new(data.clone(), None, false, DecodeLimits::default());
        for ph in &p.request_body {
            if let Verdict::Respond(_) = ph.on_request_body(&mut ctx, &mut head, &mut body) {
                return true;
            }
        }
        if keep != BodyNeed::None {
            kept_request = Some(body.raw().clone());
        }
    }
    let mut resp = ex.response.clone();
    let mut rneed = keep;
    for ph in &p.response_body {
        rneed = rneed.max(ph.body_need(&ctx, &head, &resp));
    }
    let mut kept_response = None;
    if rneed != BodyNeed::None {
        let mut body = moat_core::Body::new(
            ex.response_body.clone(),
            None,
            false,
            DecodeLimits::default(),
        );
        for ph in &p.response_body {
            if let Verdict::Respond(_) = ph.on_response_body(&mut ctx, &head, &mut resp, &mut body)
            {
                return true;
            }
        }
        if keep != BodyNeed::None {
            kept_response = Some(body.raw().clone());
        }
    }
    if !p.after_response.is_empty() {
        let done = Finished::new(&ctx, &head, resp.status, &resp.headers)
            .with_bodies(kept_request.as_ref(), kept_response.as_ref());
        for ph in &p.after_response {
            ph.after_response(&done);
        }
        done.into_after_sent().run();
    }
    false
}

fn print_table(rows: &[Cost], counters: &Counters) {
    let base = rows.first().filter(|r| r.engines == "none");
    outln!(
        "| engines | instructions/req | added instructions/req | CPU ns/req | added CPU ns/req \
         | allocs/req | alloc bytes/req | added allocs/req | blocked |"
    );
    outln!("|---|---|---|---|---|---|---|---|---|");
    let opt = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.1}"));
    let whole = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.0}"));
    let added = |x: Option<f64>, b: Option<f64>, digits: usize| match (x, b) {
        (Some(x), Some(b)) => format!("{:.*}", digits, x - b),
        _ => "n/a".into(),
    };
    for r in rows {
        let b = |f: fn(&Cost) -> Option<f64>| base.and_then(f);
        outln!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
            r.engines,
            whole(r.instructions_per_req),
            added(r.instructions_per_req, b(|c| c.instructions_per_req), 0),
            whole(r.cpu_ns_per_req),
            added(r.cpu_ns_per_req, b(|c| c.cpu_ns_per_req), 0),
            opt(r.allocs_per_req),
            opt(r.alloc_bytes_per_req),
            added(r.allocs_per_req, b(|c| c.allocs_per_req), 1),
            r.blocked,
            r.requests
        );
    }
    if let Some(why) = counters.instructions.missing() {
        outln!("\ninstructions: n/a ({why}; `scripts/engine-cost` counts them under callgrind)");
    }
    if let Some(why) = counters.cpu_time.missing() {
        outln!("\nCPU time: n/a ({why})");
    }
    if base.is_some_and(|b| b.allocs_per_req.is_none()) {
        outln!("\nallocations: n/a (build with `--features alloc-stats`)");
    }
}
