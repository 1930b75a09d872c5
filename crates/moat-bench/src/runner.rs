//! Runs a scenario: starts the built-in upstream, then for every repetition and
//! every variant spawns `moat serve` with a generated config (pinned to a CPU),
//! sends every load, and measures the gateway process from `/proc`.
//!
//! Repetitions are the outer loop, so slow drifts of the machine (other work
//! starting or stopping) spread over all variants instead of biasing one.

// pre_exec to pin a spawned target to its CPU, kill to stop it.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;

use crate::generate::{self, Jwt};
use crate::loadgen::{self, LoadSpec, Mode, RequestTemplate, Target};
use crate::report::{Cell, LoadInfo, Machine, Report, RunMetrics, VariantInfo, SCHEMA_VERSION};
use crate::scenario::{Cpus, LoadDef, RequestDef, Scenario, VariantDef, VariantKind};
use crate::stats;
use crate::upstream::{Upstream, UpstreamConfig};

/// How long a `/metrics` read of the moat under test may take.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Options of a scenario run (command-line overrides).
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Scenario file.
    pub scenario: PathBuf,
    /// Output directory (configs, logs, report.{json,md,html}).
    pub out_dir: PathBuf,
    /// The moat executable to spawn.
    pub moat_bin: PathBuf,
    /// Only these variants.
    pub variants: Option<Vec<String>>,
    /// Only these loads.
    pub loads: Option<Vec<String>>,
    /// Extra external targets `(name, url)`.
    pub targets: Vec<(String, String)>,
    /// Override repetitions.
    pub repetitions: Option<u32>,
    /// Override measured duration of every load.
    pub duration: Option<Duration>,
    /// Override warm-up of every load.
    pub warmup: Option<Duration>,
    /// Override CPU pinning.
    pub cpus: Option<Cpus>,
    /// Command line recorded in the report.
    pub command: String,
}

/// Loads the scenario and applies the overrides.
pub fn prepare(opts: &RunOptions) -> anyhow::Result<Scenario> {
    let mut s = Scenario::load(&opts.scenario).map_err(|e| anyhow::anyhow!("{e}"))?;
    if let Some(r) = opts.repetitions {
        anyhow::ensure!(
            (1..=crate::scenario::MAX_REPETITIONS).contains(&r),
            "--repetitions must be within 1..={}",
            crate::scenario::MAX_REPETITIONS
        );
        s.repetitions = r;
    }
    if let Some(c) = opts.cpus {
        s.cpus = c;
    }
    for l in &mut s.loads {
        if let Some(d) = opts.duration {
            l.duration = d;
        }
        if let Some(w) = opts.warmup {
            l.warmup = w;
        }
    }
    for (name, url) in &opts.targets {
        Target::parse(url).map_err(|e| anyhow::anyhow!("--target {name}: {e}"))?;
        anyhow::ensure!(
            !s.variants.iter().any(|v| &v.name == name),
            "--target {name}: a variant of that name exists"
        );
        s.variants.push(VariantDef {
            name: name.clone(),
            engines: None,
            url: Some(url.clone()),
            authz: None,
            config: None,
            mtls: false,
        });
    }
    if let Some(keep) = &opts.variants {
        for k in keep {
            anyhow::ensure!(
                s.variants.iter().any(|v| &v.name == k),
                "--variants: no variant `{k}` in {}",
                opts.scenario.display()
            );
        }
        s.variants
            .retain(|v| keep.contains(&v.name) || opts.targets.iter().any(|t| t.0 == v.name));
    }
    if let Some(keep) = &opts.loads {
        for k in keep {
            anyhow::ensure!(
                s.loads.iter().any(|l| &l.name == k),
                "--loads: no load `{k}` in {}",
                opts.scenario.display()
            );
        }
        s.loads.retain(|l| keep.contains(&l.name));
    }
    Ok(s)
}

/// Builds the request templates of a load.
pub fn templates(
    scenario_path: &Path,
    defs: &[RequestDef],
    jwt: &Jwt,
) -> anyhow::Result<Vec<RequestTemplate>> {
    defs.iter()
        .map(|d| {
            let mut body = match (&d.body, &d.body_file) {
                (Some(b), None) => b.clone().into_bytes(),
                (None, Some(f)) => {
                    crate::scenario::read_body_file(&Scenario::resolve(scenario_path, f))?
                }
                (None, None) => Vec::new(),
                (Some(_), Some(_)) => anyhow::bail!("a request has both `body` and `body_file`"),
            };
            let mut headers: Vec<(String, String)> = d
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if d.gzip {
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                enc.write_all(&body)?;
                body = enc.finish()?;
                headers.push(("Content-Encoding".into(), "gzip".into()));
            }
            if d.jwt {
                headers.push(("Authorization".into(), format!("Bearer {}", jwt.token)));
            }
            Ok(RequestTemplate {
                method: d.method.clone(),
                path: d.path.clone(),
                headers,
                body: Bytes::from(body),
            })
        })
        .collect()
}

/// Human description of a load.
pub fn describe_load(l: &LoadDef) -> String {
    let mode = match l.rate {
        Some(r) => format!("open loop {r} req/s"),
        None => "closed loop".into(),
    };
    let proto = match l.protocol {
        loadgen::Protocol::Http1 => "HTTP/1.1",
        loadgen::Protocol::H2 => "h2",
    };
    let conns = if l.new_connection_per_request {
        format!(
            "{} connections, a new connection per request",
            l.connections
        )
    } else {
        format!("{} connections", l.connections)
    };
    format!(
        "{mode}, {conns}, {proto}, {} measured after {} warm-up",
        humantime::format_duration(l.duration),
        humantime::format_duration(l.warmup)
    )
}

fn describe_variant(v: &VariantDef, tls: bool) -> String {
    let mut d = describe_variant_kind(v, tls);
    if v.mtls {
        d.push_str("; mTLS STRICT (the client presents a SPIFFE certificate from a generated CA)");
    }
    d
}

fn describe_variant_kind(v: &VariantDef, tls: bool) -> String {
    match v.kind() {
        VariantKind::Direct if tls => {
            "straight to the upstream (no gateway), which terminates TLS itself (rustls, the same certificate type) on moat's CPU".into()
        }
        VariantKind::Direct => "straight to the upstream (no gateway)".into(),
        VariantKind::External(u) => format!("external target {u}"),
        VariantKind::Moat(e) if e.is_empty() => "moat, every engine off".into(),
        VariantKind::Moat(e) => {
            let names: Vec<&str> = e.iter().map(|e| e.key()).collect();
            let mut d = format!("moat with {}", names.join(", "));
            if let Some(a) = &v.authz {
                d.push_str(&format!(
                    "; {} rule(s) of each of {:?}, {} JWT rule(s), layout {:?}",
                    a.rules, a.kinds, a.jwt_rules, a.layout
                ));
            }
            d
        }
    }
}

/// A spawned `moat serve`.
pub struct MoatProcess {
    child: Child,
    /// Its pid.
    pub pid: u32,
    /// Where it listens.
    pub listener: std::net::SocketAddr,
    /// Its admin listener (`/metrics`).
    pub admin: std::net::SocketAddr,
    log: PathBuf,
}

impl MoatProcess {
    /// Spawns `bin serve --config CONFIG --threads N` pinned to `cpu`, and waits until it accepts connections.
    pub fn spawn(
        bin: &Path,
        layout: &generate::MoatLayout,
        threads: usize,
        cpu: usize,
        dir: &Path,
        timeout: Duration,
    ) -> anyhow::Result<MoatProcess> {
        use std::os::unix::process::CommandExt;
        let log = dir.join("moat.log");
        let logf = std::fs::File::create(&log)?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg("--config")
            .arg(&layout.config_path)
            .arg("--threads")
            .arg(threads.to_string())
            .stdin(Stdio::null())
            .stdout(logf.try_clone()?)
            .stderr(logf);
        // SAFETY: the closure only calls sched_setaffinity (a system call, safe after fork).
        unsafe {
            cmd.pre_exec(move || crate::sys::pin_pid(0, cpu));
        }
        let child = cmd
            .spawn()
            .map_err(|e| anyhow::anyhow!("spawning {}: {e}", bin.display()))?;
        let mut p = MoatProcess {
            pid: child.id(),
            child,
            listener: layout.listener,
            admin: layout.admin,
            log,
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = p.child.try_wait()? {
                anyhow::bail!(
                    "moat serve exited during start-up ({status}); log {}:\n{}",
                    p.log.display(),
                    tail(&p.log)
                );
            }
            if std::net::TcpStream::connect_timeout(&p.listener, Duration::from_millis(200)).is_ok()
            {
                return Ok(p);
            }
            if Instant::now() > deadline {
                p.stop();
                anyhow::bail!(
                    "moat serve did not listen on {} within {:?}; log {}:\n{}",
                    p.listener,
                    timeout,
                    p.log.display(),
                    tail(&p.log)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Is it still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, then SIGKILL after 5 s.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        if let Ok(pid) = i32::try_from(self.pid) {
            // SAFETY: kill on our own child's pid.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for MoatProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail(path: &Path) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Runs the scenario and writes `report.json`, `report.md` and `report.html` into the output directory.
pub fn run(opts: &RunOptions, log: &mut dyn FnMut(&str)) -> anyhow::Result<Report> {
    let s = prepare(opts)?;
    std::fs::create_dir_all(&opts.out_dir)?;
    let mut machine = Machine::probe();
    let cpus_avail = crate::sys::available_cpus();
    for c in [s.cpus.load, s.cpus.upstream, s.cpus.moat] {
        anyhow::ensure!(
            c < cpus_avail,
            "cpu {c} is not available (this machine has {cpus_avail}); set cpus: in the scenario or --cpus"
        );
    }
    let jwt = generate::jwt(generate::TOKEN_ISSUER)?;
    let mut load_templates = Vec::new();
    for l in &s.loads {
        let defs = if l.requests.is_empty() {
            &s.requests
        } else {
            &l.requests
        };
        load_templates.push(templates(&opts.scenario, defs, &jwt)?);
    }
    // The upstream.
    let mut up = UpstreamConfig {
        cpu: Some(s.cpus.upstream),
        ..Default::default()
    };
    if let Some(st) = s.upstream.status {
        up.status = st;
    }
    match (&s.upstream.body, &s.upstream.body_file) {
        (Some(b), _) => up.body = Bytes::from(b.clone()),
        (None, Some(f)) => {
            let p = Scenario::resolve(&opts.scenario, f);
            if p.extension().is_some_and(|e| e == "json") {
                up.content_type = "application/json".into();
            }
            up.body = Bytes::from(crate::scenario::read_body_file(&p)?);
        }
        (None, None) => {}
    }
    if let Some(ct) = &s.upstream.content_type {
        up.content_type = ct.clone();
    }
    up.gzip = s.upstream.gzip;
    // With a TLS listener, `direct` gets a second copy of the upstream that
    // terminates TLS itself (same response), so the baseline does the same
    // handshakes the gateway does. It runs on moat's CPU: on the generator's CPU
    // both ends of every handshake would share one core and the baseline would
    // measure that, not the server side. moat variants use the plain upstream.
    let tls_upstream = if s.moat.tls && s.variants.iter().any(|v| v.kind() == VariantKind::Direct) {
        let cert = crate::tls::self_signed(&["localhost", "127.0.0.1"])?;
        let mut c = up.clone();
        c.cpu = Some(s.cpus.moat);
        c.tls = Some(Arc::new(crate::tls::server_config(&cert)?));
        let u = Upstream::start(c)?;
        log(&format!("TLS upstream (direct) listening on {}", u.addr()));
        Some(u)
    } else {
        None
    };
    let upstream = Upstream::start(up)?;
    log(&format!("upstream listening on {}", upstream.addr()));
    // One client CA and certificate for every mTLS variant.
    let client_pki = if s.variants.iter().any(|v| v.mtls) {
        Some(crate::tls::client_pki()?)
    } else {
        None
    };

    let mut runs: HashMap<(usize, usize), Vec<RunMetrics>> = HashMap::new();
    let mut hists: HashMap<(usize, usize), Histogram<u64>> = HashMap::new();
    let mut failures: HashMap<(usize, usize), String> = HashMap::new();

    for rep in 0..s.repetitions {
        for (vi, v) in s.variants.iter().enumerate() {
            let vdir = opts.out_dir.join("variants").join(&v.name);
            let variant_pki = client_pki.as_ref().filter(|_| v.mtls);
            // Reach the variant.
            let mut proc_: Option<MoatProcess> = None;
            let target = match v.kind() {
                VariantKind::Direct => match &tls_upstream {
                    Some(t) => Target::parse(&format!("https://{}", t.addr()))
                        .map_err(|e| anyhow::anyhow!(e))?,
                    None => Target::parse(&format!("http://{}", upstream.addr()))
                        .map_err(|e| anyhow::anyhow!(e))?,
                },
                VariantKind::External(u) => Target::parse(&u).map_err(|e| anyhow::anyhow!(e))?,
                VariantKind::Moat(engines) => {
                    let policies = v.authz.as_ref().map(|a| generate::istio_policies(a, &jwt));
                    let overrides: Vec<&serde_json::Value> =
                        s.moat.config.iter().chain(v.config.iter()).collect();
                    let layout = generate::moat_config(&generate::MoatConfigInput {
                        dir: &vdir,
                        upstream: upstream.addr(),
                        engines: &engines,
                        threads: s.moat.threads,
                        tls: s.moat.tls,
                        client_ca: variant_pki.map(|pki| pki.ca_pem.as_str()),
                        policies: policies.as_deref(),
                        overrides: &overrides,
                    })?;
                    match MoatProcess::spawn(
                        &opts.moat_bin,
                        &layout,
                        s.moat.threads,
                        s.cpus.moat,
                        &vdir,
                        s.moat.startup_timeout,
                    ) {
                        Ok(p) => {
                            let scheme = if s.moat.tls { "https" } else { "http" };
                            let t = Target::parse(&format!("{scheme}://{}", p.listener))
                                .map_err(|e| anyhow::anyhow!(e))?;
                            proc_ = Some(p);
                            t
                        }
                        Err(e) => {
                            log(&format!("variant {}: {e}", v.name));
                            for li in 0..s.loads.len() {
                                failures.insert((li, vi), first_line(&e.to_string()));
                            }
                            continue;
                        }
                    }
                }
            };
            for (li, l) in s.loads.iter().enumerate() {
                if let Some(p) = proc_.as_mut() {
                    if !p.alive() {
                        failures.insert((li, vi), "moat exited during the run".into());
                        continue;
                    }
                    // Measure this load's peak only (needs permission; otherwise peak since start).
                    let _ = crate::sys::reset_peak_rss(p.pid);
                }
                // Allocations of the measured window: read when it starts (on a
                // helper thread) and after the load; None without `alloc-stats`.
                let alloc_start = match proc_.as_ref() {
                    Some(p) => Some(crate::allocs::StartReading::new(p.admin, ADMIN_TIMEOUT)?),
                    None => None,
                };
                let spec = LoadSpec {
                    target: target.clone(),
                    protocol: l.protocol,
                    requests: load_templates[li].clone(),
                    connections: l.connections,
                    streams: l.streams,
                    mode: l.rate.map_or(Mode::Closed, |rate| Mode::Open { rate }),
                    warmup: l.warmup,
                    duration: l.duration,
                    max_requests: l.requests_limit,
                    new_connection_per_request: l.new_connection_per_request,
                    client_identity: variant_pki.map(|pki| pki.identity.clone()),
                    grace: Duration::from_secs(2),
                    on_measure_start: alloc_start.as_ref().map(|a| a.hook()),
                };
                let pid = proc_.as_ref().map(|p| p.pid);
                let cpu0 = pid.and_then(|p| crate::sys::cpu_seconds(p).ok());
                // `direct`: the server side is the upstream's one thread; its CPU
                // time is the counterpart of moat's, and its run-queue wait shows
                // how much of the run other processes held its core.
                let direct_server = match v.kind() {
                    VariantKind::Direct => Some(tls_upstream.as_ref().unwrap_or(&upstream)),
                    _ => None,
                };
                let sched0 = direct_server.and_then(|u| u.thread_sched().ok());
                let res = loadgen::run(&spec, Some(s.cpus.load));
                let sched1 = direct_server.and_then(|u| u.thread_sched().ok());
                drop(spec);
                let alloc0 = alloc_start.and_then(|a| a.finish());
                let res = match res {
                    Ok(r) => r,
                    Err(e) => {
                        failures.insert((li, vi), first_line(&e.to_string()));
                        continue;
                    }
                };
                let cpu1 = pid.and_then(|p| crate::sys::cpu_seconds(p).ok());
                let alloc1 = match (&alloc0, proc_.as_ref()) {
                    (Some(_), Some(p)) => {
                        crate::allocs::read(p.admin, ADMIN_TIMEOUT).ok().flatten()
                    }
                    _ => None,
                };
                let per_req = match (alloc0, alloc1) {
                    (Some(a), Some(b)) => a.per_response(&b, res.responses),
                    _ => None,
                };
                let rss = pid.and_then(|p| crate::sys::peak_rss_kib(p).ok());
                let server_cpu = match (cpu0, cpu1, sched0, sched1) {
                    (Some(a), Some(b), _, _) => Some(b - a),
                    (_, _, Some(a), Some(b)) => Some(b.run_s - a.run_s),
                    _ => None,
                };
                let cpu_ms_per_1k = match server_cpu {
                    Some(c) if res.total_responses > 0 => {
                        Some(c * 1000.0 / res.total_responses as f64 * 1000.0)
                    }
                    _ => None,
                };
                if let (Some(a), Some(b)) = (sched0, sched1) {
                    log(&format!(
                        "  upstream thread: {:.2} s on the CPU, {:.2} s runnable but waiting for it; generator thread: {:.2} s on the CPU",
                        b.run_s - a.run_s,
                        b.wait_s - a.wait_s,
                        res.generator_cpu_s,
                    ));
                }
                let m = RunMetrics {
                    rps: res.rps(),
                    responses: res.responses,
                    errors: res.errors,
                    latency: res.summary(),
                    cpu_ms_per_1k,
                    peak_rss_kib: rss,
                    allocs_per_req: per_req.map(|p| p.0),
                    alloc_bytes_per_req: per_req.map(|p| p.1),
                };
                log(&format!(
                    "[{}/{}] {:<12} {:<14} {:>9.0} req/s  err {:>5}  p50 {:>8.1}µs  p99 {:>9.1}µs  {}{}",
                    rep + 1,
                    s.repetitions,
                    v.name,
                    l.name,
                    m.rps,
                    m.errors.total(),
                    m.latency.p50_us,
                    m.latency.p99_us,
                    m.cpu_ms_per_1k
                        .map_or(String::new(), |c| format!("cpu {c:.1} ms/1k")),
                    m.allocs_per_req
                        .map_or(String::new(), |a| format!("  {a:.1} allocs/req")),
                ));
                let h = hists.entry((li, vi)).or_insert_with(stats::new_histogram);
                let _ = h.add(&res.histogram);
                runs.entry((li, vi)).or_default().push(m);
            }
            if let Some(mut p) = proc_ {
                p.stop();
            }
        }
    }
    drop(upstream);
    drop(tls_upstream);
    machine.loadavg_end = crate::report::loadavg();

    let mut cells = Vec::new();
    for (li, l) in s.loads.iter().enumerate() {
        for (vi, v) in s.variants.iter().enumerate() {
            let r = runs.remove(&(li, vi)).unwrap_or_default();
            let failure = failures.remove(&(li, vi));
            if r.is_empty() && failure.is_none() {
                continue;
            }
            cells.push(Cell {
                load: l.name.clone(),
                variant: v.name.clone(),
                curve: hists
                    .get(&(li, vi))
                    .map(stats::percentile_curve)
                    .unwrap_or_default(),
                runs: r,
                comparisons: Vec::new(),
                failure,
            });
        }
    }
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        scenario: s.name.clone(),
        description: s.description.clone(),
        command: opts.command.clone(),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        machine,
        repetitions: s.repetitions,
        confidence: s.confidence,
        cpus: s.cpus,
        loads: s
            .loads
            .iter()
            .map(|l| LoadInfo {
                name: l.name.clone(),
                description: describe_load(l),
                handshakes: l.new_connection_per_request,
            })
            .collect(),
        variants: s
            .variants
            .iter()
            .map(|v| VariantInfo {
                name: v.name.clone(),
                description: describe_variant(v, s.moat.tls),
            })
            .collect(),
        cells,
    };
    report.compute_comparisons();
    write_outputs(&report, &opts.out_dir)?;
    Ok(report)
}

/// One line for a report cell: the first line of the error, or, when the error
/// quotes moat's log, the log's last line (where moat says what was wrong).
fn first_line(s: &str) -> String {
    let first = s.lines().next().unwrap_or("");
    match s.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(last) if last != first => {
            let head = first.split("; log ").next().unwrap_or(first);
            format!("{head}: {}", last.trim())
        }
        _ => first.to_string(),
    }
}

/// Writes `report.json`, `report.md`, `report.html` into `dir`.
pub fn write_outputs(report: &Report, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(
        dir.join("report.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    std::fs::write(dir.join("report.md"), crate::report::markdown(report))?;
    std::fs::write(dir.join("report.html"), crate::report::html(report))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_lines_quote_the_log() {
        let e = "moat serve exited during start-up (exit status: 1); log /x/moat.log:\n/x/moat.yaml:25:1: field `waf`: unknown field `waf`\n";
        assert_eq!(
            first_line(e),
            "moat serve exited during start-up (exit status: 1): /x/moat.yaml:25:1: field `waf`: unknown field `waf`"
        );
        assert_eq!(first_line("one line"), "one line");
    }
}
