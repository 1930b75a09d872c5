//! `moat bench` end to end: scenario validation errors point at file:line:field,
//! the shipped scenarios are valid, a scenario runs against the built-in upstream
//! and an external target, and `compare` gates on regressions.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use moat_bench::report::{Cell, LoadInfo, Machine, Report, RunMetrics, VariantInfo};
use moat_bench::stats::LatencySummary;

fn moat() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moat"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn shipped_scenarios_are_valid() {
    let dir = repo().join("bench/scenarios");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "yaml") {
            let out = moat().args(["bench", "check"]).arg(&p).output().unwrap();
            assert!(
                out.status.success(),
                "{}: {}",
                p.display(),
                String::from_utf8_lossy(&out.stderr)
            );
            n += 1;
        }
    }
    assert!(n >= 5, "expected the five scenarios, found {n}");
}

#[test]
fn scenario_error_names_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.yaml");
    std::fs::write(
        &p,
        "name: bad\nrequests:\n  - path: /\nloads:\n  - name: a\n    connections: 8\n    rate: -5\nvariants:\n  - name: direct\n",
    )
    .unwrap();
    let out = moat().args(["bench", "check"]).arg(&p).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!("{}:7:", p.display());
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains("field `loads[0].rate`"), "{err}");

    std::fs::write(
        &p,
        "name: bad\nloads:\n  - name: a\n    connections: 8\nvariants:\n  - name: direct\n    engins: [waf]\n",
    )
    .unwrap();
    let out = moat().args(["bench", "check"]).arg(&p).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with(&format!("{}:7:", p.display())), "{err}");
    assert!(
        err.contains("variants[0]") && err.contains("engins"),
        "{err}"
    );
}

#[test]
fn runs_a_scenario_with_direct_and_an_external_target() {
    let dir = tempfile::tempdir().unwrap();
    // The "external gateway" is a second built-in upstream in another process.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut ext = moat()
        .args([
            "bench",
            "upstream",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--duration",
            "60s",
        ])
        .spawn()
        .unwrap();
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let sc = dir.path().join("s.yaml");
    std::fs::write(
        &sc,
        "name: smoke\nrepetitions: 2\ncpus: {load: 0, upstream: 0, moat: 0}\nrequests:\n  - {method: POST, path: /x, body: '{\"a\":1}', gzip: true}\nloads:\n  - {name: open, rate: 200, connections: 2, duration: 500ms, warmup: 100ms}\n  - {name: closed, connections: 2, duration: 500ms, warmup: 0s}\nvariants:\n  - name: direct\n",
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = moat()
        .args(["bench", "run"])
        .arg(&sc)
        .arg("--out")
        .arg(&out_dir)
        .args(["--target", &format!("other=http://127.0.0.1:{port}")])
        .output()
        .unwrap();
    let _ = ext.kill();
    let _ = ext.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Report =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap())
            .unwrap();
    assert_eq!(report.cells.len(), 4);
    for c in &report.cells {
        assert_eq!(c.runs.len(), 2, "{c:?}");
        assert!(c.failure.is_none());
        for r in &c.runs {
            assert!(r.responses > 0);
            assert_eq!(r.errors.total(), 0);
        }
    }
    let open = report.cell("open", "other").unwrap();
    assert!(
        (open.runs[0].rps - 200.0).abs() < 20.0,
        "{:?}",
        open.runs[0]
    );
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(md.contains("| other |"), "{md}");
    let html = std::fs::read_to_string(out_dir.join("report.html")).unwrap();
    assert!(html.contains("<svg"));
}

fn report(p50s: &[f64]) -> Report {
    Report {
        schema_version: moat_bench::report::SCHEMA_VERSION,
        scenario: "t".into(),
        description: String::new(),
        command: String::new(),
        started_unix: 0,
        machine: Machine::default(),
        repetitions: p50s.len() as u32,
        confidence: 0.99,
        cpus: Default::default(),
        loads: vec![LoadInfo {
            name: "l".into(),
            description: String::new(),
            handshakes: false,
        }],
        variants: vec![VariantInfo {
            name: "proxy".into(),
            description: String::new(),
        }],
        cells: vec![Cell {
            load: "l".into(),
            variant: "proxy".into(),
            runs: p50s
                .iter()
                .map(|&p| RunMetrics {
                    rps: 1000.0,
                    responses: 10_000,
                    latency: LatencySummary {
                        p50_us: p,
                        p99_us: 2.0 * p,
                        ..Default::default()
                    },
                    ..Default::default()
                })
                .collect(),
            curve: vec![],
            comparisons: vec![],
            failure: None,
        }],
    }
}

#[test]
fn compare_exits_1_on_a_regression_beyond_the_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, r: &Report| {
        let p = dir.path().join(name);
        std::fs::write(&p, serde_json::to_string(r).unwrap()).unwrap();
        p
    };
    let base = write("base.json", &report(&[100.0, 101.0, 99.0, 100.0]));
    let same = write("same.json", &report(&[100.5, 99.5, 100.0, 100.2]));
    let worse = write("worse.json", &report(&[130.0, 131.0, 129.0, 130.0]));

    let out = moat()
        .args(["bench", "compare"])
        .arg(&base)
        .arg(&same)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    let out = moat()
        .args(["bench", "compare", "--threshold", "5%"])
        .arg(&base)
        .arg(&worse)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("| l | proxy | p50 µs |") && text.contains("**regressed**"),
        "{text}"
    );

    // A 30% regression passes a 50% threshold.
    let out = moat()
        .args(["bench", "compare", "--threshold", "50%"])
        .arg(&base)
        .arg(&worse)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}

/// Runs the scenario `yaml` with `moat bench run` against this moat binary,
/// output in `dir/out`; returns the report and its Markdown rendering.
fn run_scenario(dir: &Path, yaml: &str) -> (Report, String) {
    let sc = dir.join("scenario.yaml");
    std::fs::write(&sc, yaml).unwrap();
    let out_dir = dir.join("out");
    let out = moat()
        .args(["bench", "run"])
        .arg(&sc)
        .arg("--out")
        .arg(&out_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Report =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap())
            .unwrap();
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    (report, md)
}

/// Runs a one-variant `proxy` scenario against this moat binary and returns the report.
fn run_proxy_scenario(dir: &Path) -> (Report, String) {
    run_scenario(
        dir,
        "name: proxy-smoke\nrepetitions: 1\ncpus: {load: 0, upstream: 0, moat: 0}\nrequests:\n  - {method: GET, path: /api/x}\nloads:\n  - {name: closed, connections: 2, duration: 1s, warmup: 200ms}\nvariants:\n  - name: proxy\n",
    )
}

/// Starts `moat serve` (one worker, CPU 0) on a generated config in `dir` that
/// proxies to `upstream`, every engine off, TLS with client certificates from
/// `client_ca` when given.
fn spawn_moat(
    dir: &Path,
    upstream: std::net::SocketAddr,
    tls: bool,
    client_ca: Option<&str>,
) -> moat_bench::runner::MoatProcess {
    let layout = moat_bench::generate::moat_config(&moat_bench::generate::MoatConfigInput {
        dir,
        upstream,
        engines: &[],
        threads: 1,
        tls,
        client_ca,
        policies: None,
        overrides: &[],
    })
    .unwrap();
    moat_bench::runner::MoatProcess::spawn(
        Path::new(env!("CARGO_BIN_EXE_moat")),
        &layout,
        1,
        0,
        dir,
        std::time::Duration::from_secs(20),
    )
    .unwrap()
}

#[test]
fn proxy_variant_reports_allocations_per_request_only_with_alloc_stats() {
    let dir = tempfile::tempdir().unwrap();
    let (report, md) = run_proxy_scenario(dir.path());
    let cell = report.cell("closed", "proxy").unwrap();
    assert!(cell.failure.is_none(), "{cell:?}");
    let run = &cell.runs[0];
    assert!(run.responses > 0);
    assert_eq!(run.errors.total(), 0);
    let row = md
        .lines()
        .find(|l| l.starts_with("| proxy |"))
        .unwrap()
        .to_string();
    if cfg!(feature = "alloc-stats") {
        let a = run.allocs_per_req.expect("allocs/req measured");
        let b = run.alloc_bytes_per_req.expect("bytes/req measured");
        // Forwarding a GET allocates (headers, the upstream request, buffers),
        // but not thousands of times.
        assert!((1.0..5_000.0).contains(&a), "{a} allocs/req");
        assert!((16.0..10_000_000.0).contains(&b), "{b} bytes/req");
        assert!(row.contains(&format!("| {a:.1} |")), "{row}");
    } else {
        assert_eq!(run.allocs_per_req, None);
        assert!(row.contains("| n/a | n/a |"), "{row}");
    }
}

/// The counter itself, through a real moat process: a proxied request adds a
/// plausible number of allocations, and the counter is absent without the feature.
#[test]
fn moat_allocations_total_counts_proxied_requests() {
    use moat_bench::allocs;
    use moat_bench::loadgen::{self, LoadSpec, RequestTemplate, Target};
    use moat_bench::upstream::{Upstream, UpstreamConfig};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start(UpstreamConfig::default()).unwrap();
    let mut p = spawn_moat(dir.path(), up.addr(), false, None);
    let t = Duration::from_secs(5);
    let first = allocs::read(p.admin, t).unwrap();
    if !cfg!(feature = "alloc-stats") {
        assert_eq!(first, None, "no counter without the feature");
        p.stop();
        return;
    }
    let a0 = first.expect("moat_allocations_total on /metrics");
    // What one /metrics scrape costs (it is part of every measurement).
    let a1 = allocs::read(p.admin, t).unwrap().unwrap();
    let scrape = a1.allocs - a0.allocs;
    assert!(scrape > 0 && scrape < 5_000, "a scrape allocated {scrape}");

    let n = 200;
    let served0 = up.requests();
    let mut spec = LoadSpec::closed(
        Target::parse(&format!("http://{}", p.listener)).unwrap(),
        vec![RequestTemplate::get("/api/items")],
        1,
    );
    spec.warmup = Duration::ZERO;
    spec.duration = Duration::from_secs(30);
    spec.max_requests = Some(n);
    let res = loadgen::run(&spec, None).unwrap();
    assert_eq!(res.responses, n);
    assert_eq!(
        up.requests() - served0,
        n,
        "every request reached the upstream"
    );
    let a2 = allocs::read(p.admin, t).unwrap().unwrap();
    let per_req = (a2.allocs - a1.allocs).saturating_sub(scrape) as f64 / n as f64;
    let bytes_per_req = (a2.bytes - a1.bytes) as f64 / n as f64;
    assert!(
        (1.0..5_000.0).contains(&per_req),
        "{per_req} allocations per proxied request"
    );
    assert!(bytes_per_req >= 16.0, "{bytes_per_req} bytes per request");
    p.stop();
}

/// An mTLS variant's generated config makes moat require the client
/// certificate the load generator presents: with it every handshake completes
/// and every request reaches the upstream; without it no request gets through.
/// `moat bench load --cert --key` presents a certificate read from PEM files.
#[test]
fn mtls_config_requires_the_generated_client_certificate() {
    use moat_bench::loadgen::{self, LoadSpec, RequestTemplate, Target};
    use moat_bench::upstream::{Upstream, UpstreamConfig};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let up = Upstream::start(UpstreamConfig::default()).unwrap();
    let pki = moat_bench::tls::client_pki().unwrap();
    let mut p = spawn_moat(dir.path(), up.addr(), true, Some(&pki.ca_pem));
    let spec = |identity| {
        let mut s = LoadSpec::closed(
            Target::parse(&format!("https://{}", p.listener)).unwrap(),
            vec![RequestTemplate::get("/api/items")],
            2,
        );
        s.warmup = Duration::ZERO;
        s.duration = Duration::from_secs(1);
        s.max_requests = Some(40);
        s.new_connection_per_request = true;
        s.client_identity = identity;
        s
    };

    let served0 = up.requests();
    let with_cert = loadgen::run(&spec(Some(pki.identity.clone())), None).unwrap();
    assert_eq!(with_cert.responses, 40, "{:?}", with_cert.errors);
    assert_eq!(with_cert.errors.total(), 0, "{:?}", with_cert.errors);
    assert!(with_cert.connections_opened >= 40);
    assert_eq!(up.requests() - served0, 40);

    let served1 = up.requests();
    let without = loadgen::run(&spec(None), None).unwrap();
    assert_eq!(without.responses, 0);
    assert!(without.errors.io > 0, "{:?}", without.errors);
    assert_eq!(up.requests(), served1, "nothing reached the upstream");

    // The same through `moat bench load --cert --key`, from PEM files.
    let cert = dir.path().join("client.pem");
    let key = dir.path().join("client-key.pem");
    std::fs::write(&cert, &pki.cert_pem).unwrap();
    std::fs::write(&key, &pki.key_pem).unwrap();
    let url = format!("https://{}/api/items", p.listener);
    let load = |cert: &Path, key: Option<&Path>| {
        let mut cmd = moat();
        cmd.args(["bench", "load", &url, "-c", "2", "-n", "20", "-d", "5s"])
            .args(["--warmup", "0s", "--new-connection-per-request", "--json"])
            .arg("--cert")
            .arg(cert);
        if let Some(key) = key {
            cmd.arg("--key").arg(key);
        }
        cmd.output().unwrap()
    };
    let out = load(&cert, Some(&key));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let res: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(res["responses"], 20, "{res}");
    // Hostile or inconsistent inputs are refused with a message naming the problem.
    let not_a_cert = dir.path().join("not-a-cert.pem");
    std::fs::write(&not_a_cert, "hello\n").unwrap();
    for (cert, key, expected) in [
        (
            &not_a_cert,
            Some(&key),
            "not-a-cert.pem: no certificate found",
        ),
        (&cert, Some(&cert), "client.pem: no private key found"),
        (&cert, None, "--key"),
    ] {
        let out = load(cert, key.map(|k| k.as_path()));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{cert:?} {key:?}");
        assert!(err.contains(expected), "{err}");
    }
    p.stop();
}

/// `moat bench run` wires `mtls: true` per variant: the mTLS variant and the
/// plain TLS one both complete full handshakes without errors, and the report
/// says which one required client certificates.
#[test]
fn runs_a_tls_scenario_with_an_mtls_variant() {
    let dir = tempfile::tempdir().unwrap();
    let (report, _) = run_scenario(
        dir.path(),
        "name: mtls-smoke\nrepetitions: 1\ncpus: {load: 0, upstream: 0, moat: 0}\nmoat: {tls: true}\nrequests:\n  - {method: GET, path: /api/x}\nloads:\n  - {name: hs, connections: 2, new_connection_per_request: true, duration: 500ms, warmup: 100ms}\nvariants:\n  - name: proxy\n  - name: mtls\n    mtls: true\n",
    );
    for variant in ["proxy", "mtls"] {
        let cell = report.cell("hs", variant).unwrap();
        assert!(cell.failure.is_none(), "{cell:?}");
        assert!(cell.runs[0].responses > 0, "{cell:?}");
        assert_eq!(cell.runs[0].errors.total(), 0, "{cell:?}");
    }
    let described = |name: &str| {
        report
            .variants
            .iter()
            .find(|v| v.name == name)
            .unwrap()
            .description
            .clone()
    };
    assert!(described("mtls").contains("mTLS STRICT"));
    assert!(!described("proxy").contains("mTLS"));
    let mtls_config =
        std::fs::read_to_string(dir.path().join("out/variants/mtls/moat.yaml")).unwrap();
    assert!(mtls_config.contains("STRICT"), "{mtls_config}");
}

/// `moat bench cost`: every engine of the config measured alone and together, the
/// harness alone first; an attack is answered by the WAF on every request, a benign
/// request by nobody; an engine the config does not enable is refused by name.
#[test]
fn cost_measures_each_engine_of_a_config() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("moat.yaml");
    std::fs::write(
        &cfg,
        format!(
            "listeners: [{{name: main, address: 127.0.0.1:0}}]\n\
             clusters: [{{name: app, endpoints: [\"127.0.0.1:9\"]}}]\n\
             routes: [{{name: api, host: \"*\", path_prefix: /, cluster: app}}]\n\
             events: {{sink: {{type: none}}}}\n\
             waf: {{enabled: true, mode: block}}\n\
             secrets: {{enabled: true, action: block}}\n\
             discovery: {{enabled: true, inventory: {}}}\n",
            dir.path().join("apis.db").display()
        ),
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let out = moat()
            .args(["bench", "cost"])
            .arg(&cfg)
            .args(["-n", "20", "--json"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let rows = run(&[]);
    let names: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["engines"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "none",
            "waf",
            "secrets",
            "discovery",
            "waf,secrets,discovery"
        ]
    );
    assert!(rows
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["blocked"] == 0 && r["requests"] == 20));
    // The thread's counters: a number where the machine has the counter (the task
    // clock wherever perf events are allowed; instructions on hardware that counts
    // them), else null, never zero.
    for r in rows.as_array().unwrap() {
        for field in ["instructions_per_req", "cpu_ns_per_req"] {
            let v = &r[field];
            assert!(
                v.is_null() || v.as_f64().is_some_and(|x| x > 0.0),
                "{field}: {v} in {r}"
            );
        }
    }

    let attack = run(&["--engines", "waf", "--path", "/?id=1'%20OR%201=1--"]);
    assert_eq!(attack[0]["blocked"], 20, "{attack}");
    // Evicting the caches between requests changes what a request costs, never what
    // the engines decide.
    let cold = run(&[
        "--engines",
        "waf",
        "--evict-kib",
        "64",
        "--path",
        "/?id=1'%20OR%201=1--",
    ]);
    assert_eq!(cold[0]["blocked"], 20, "{cold}");
    // A refused invocation: exit code 2, and its stderr.
    let refused = |args: &[&str]| {
        let out = moat()
            .args(["bench", "cost"])
            .arg(&cfg)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // More than 1 GiB of eviction is refused with the limit named, not attempted.
    let err = refused(&["--evict-kib", "18446744073709551615"]);
    assert!(
        err.contains("--evict-kib") && err.contains("1048576"),
        "{err}"
    );

    let err = refused(&["--engines", "authz"]);
    assert!(err.contains("engine `authz` is not enabled"), "{err}");
}

/// `moat bench cost` decides as the proxy does for the route's workload: a policy
/// that selects the cluster's labels applies (the harness once measured access control
/// on a workload without labels, to which no selector applies, and with fresh `Arc`s
/// per request, which the engine's per-workload view is keyed by).
#[test]
fn cost_applies_the_policies_of_the_routes_workload() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        "apiVersion: security.istio.io/v1\n\
         kind: AuthorizationPolicy\n\
         metadata: {name: deny-admin, namespace: shop}\n\
         spec:\n\
         \x20 selector: {matchLabels: {app: bench}}\n\
         \x20 action: DENY\n\
         \x20 rules: [{to: [{operation: {paths: [\"/admin/*\"]}}]}]\n",
    )
    .unwrap();
    let cfg = dir.path().join("moat.yaml");
    std::fs::write(
        &cfg,
        "listeners: [{name: main, address: 127.0.0.1:0}]\n\
         clusters: [{name: app, endpoints: [\"127.0.0.1:9\"], labels: {app: bench}, namespace: shop}]\n\
         routes: [{name: api, host: \"*\", path_prefix: /, cluster: app}]\n\
         events: {sink: {type: none}}\n\
         authz: {enabled: true, policies: [policies.yaml]}\n",
    )
    .unwrap();
    let blocked = |path: &str| {
        let out = moat()
            .args(["bench", "cost"])
            .arg(&cfg)
            .args(["-n", "20", "--json", "--engines", "authz", "--path", path])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(rows[0]["engines"], "authz", "{rows}");
        rows[0]["blocked"].as_u64().unwrap()
    };
    assert_eq!(blocked("/admin/users"), 20);
    assert_eq!(blocked("/api/items"), 0);
}

/// `moat … | head -1`: the reader of moat's output went away before it wrote. That is
/// the end of the output, not a crash (`println!` panics on a closed pipe).
#[test]
fn a_closed_stdout_ends_the_output_without_a_panic() {
    let scenario = repo().join("bench/scenarios/overhead.yaml");
    let up = moat_bench::upstream::Upstream::start(Default::default()).unwrap();
    let url = format!("http://{}/", up.addr());
    let runs: [&[&str]; 4] = [
        &[
            "bench", "load", &url, "-c", "1", "-n", "20", "--warmup", "0s",
        ],
        &["bench", "check", scenario.to_str().unwrap()],
        &["waf", "test", "--url", "/items?q=O%27Reilly+books"],
        &["completions", "bash"],
    ];
    for args in runs {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = moat()
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
