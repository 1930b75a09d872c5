//! `moat serve` and `moat check-config`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use moat_proxy::config::{self, unlocated, ConfigSource, GatewayConfig};
use moat_proxy::{AdminRouter, Gateway, GatewayOptions};

/// Arguments of `moat serve`.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// Config file; without it moat runs the quickstart demo.
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Worker threads (default: `runtime.threads` from the config, 0 = one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Json)]
    pub log_format: LogFormat,
    /// Listen on this address instead of the config's: `ADDR` for the first listener,
    /// `NAME=ADDR` for a named one (repeatable). Port 0 picks a free port.
    #[arg(long, value_name = "[NAME=]ADDR")]
    pub listen: Vec<String>,
    /// Serve the admin API on this address instead of `admin.address`.
    #[arg(long, value_name = "ADDR")]
    pub admin: Option<String>,
    /// Quickstart only: where its policies, event store and API inventory are kept
    /// (`moat events` and `moat apis` take the same option, or find the default).
    #[arg(long, env = "MOAT_DATA_DIR", default_value = super::data::QUICKSTART_DIR)]
    pub data_dir: PathBuf,
}

/// Log output format.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable text.
    Text,
}

/// Arguments of `moat check-config`.
#[derive(clap::Args)]
pub struct CheckConfigArgs {
    /// Config file to validate.
    pub file: PathBuf,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MOAT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// The Istio policies the quickstart enforces.
const QUICKSTART_POLICIES: &str =
    include_str!("../../../../examples/istio/quickstart-policies.yaml");

fn write_quickstart_files(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("istio"))?;
    std::fs::write(
        dir.join("istio/quickstart-policies.yaml"),
        QUICKSTART_POLICIES,
    )
}

/// Runs `moat serve`.
pub fn run(args: ServeArgs) -> ExitCode {
    init_logging(args.log_format);
    let quickstart = args.config.is_none();
    let (mut cfg, src) = match &args.config {
        Some(file) => match config::load_file(file) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(1);
            }
        },
        None => {
            let base_dir = args.data_dir.clone();
            if let Err(e) = write_quickstart_files(&base_dir) {
                eprintln!("cannot prepare {}: {e}", base_dir.display());
                return ExitCode::from(1);
            }
            let src = ConfigSource {
                file: PathBuf::from("<quickstart>"),
                base_dir,
            };
            match config::parse(&src, moat_proxy::QUICKSTART_YAML) {
                Ok(c) => (c, src),
                Err(e) => {
                    eprintln!("embedded quickstart config: {e}");
                    return ExitCode::from(1);
                }
            }
        }
    };
    if let Err(e) = apply_overrides(&mut cfg, &args.listen, args.admin.as_deref()) {
        eprintln!("moat serve: {e}");
        return ExitCode::from(2);
    }
    if let Err(e) = moat_core::event::check_os_random() {
        eprintln!("moat serve: {e}");
        return ExitCode::from(1);
    }
    let threads = args
        .threads
        .filter(|&t| t > 0)
        .or(Some(cfg.runtime.threads).filter(|&t| t > 0))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
    let rt = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(crate::memory::on_park)
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .on_thread_park(crate::memory::on_park)
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let data_dir = quickstart.then(|| args.data_dir.clone());
    match rt.block_on(serve(cfg, src, data_dir, threads)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat serve: {e}");
            ExitCode::from(1)
        }
    }
}

/// `--listen` and `--admin`: addresses from the command line replace the config's.
/// A reload keeps the bound sockets (listener addresses change only on restart).
fn apply_overrides(
    cfg: &mut GatewayConfig,
    listen: &[String],
    admin: Option<&str>,
) -> Result<(), String> {
    let check = |a: &str| {
        a.parse::<std::net::SocketAddr>()
            .map(|_| ())
            .map_err(|e| format!("`{a}` is not an address such as 127.0.0.1:8080: {e}"))
    };
    for l in listen {
        let (name, addr) = match l.split_once('=') {
            Some((n, a)) => (Some(n), a),
            None => (None, l.as_str()),
        };
        check(addr).map_err(|e| format!("--listen {e}"))?;
        let target = match name {
            Some(n) => cfg.listeners.iter_mut().find(|x| x.name.value == n),
            None => cfg.listeners.first_mut(),
        };
        match target {
            Some(t) => t.address = unlocated(addr.to_string()),
            None => {
                return Err(format!(
                    "--listen {l}: the config has no listener {}",
                    name.map(|n| format!("named `{n}`")).unwrap_or_default()
                ))
            }
        }
    }
    if let Some(a) = admin {
        check(a).map_err(|e| format!("--admin {e}"))?;
        cfg.admin.address = unlocated(a.to_string());
    }
    Ok(())
}

async fn serve(
    mut cfg: GatewayConfig,
    src: ConfigSource,
    quickstart: Option<PathBuf>,
    threads: usize,
) -> anyhow::Result<()> {
    if quickstart.is_some() {
        let demo = moat_proxy::demo::start().await?;
        for c in cfg.clusters.iter_mut().filter(|c| c.name.value == "demo") {
            c.endpoints = vec![unlocated(demo.to_string())];
        }
        tracing::info!(address = %demo, "demo app listening");
    }
    let drain = cfg.runtime.shutdown_timeout;
    let telemetry = Arc::new(
        moat_sinks::Telemetry::start(&cfg.telemetry, &src.base_dir)
            .map_err(|e| anyhow::anyhow!("telemetry: {e}"))?,
    );
    // The span exporter's buffer is reported like a sink's, as `sink="tracing"`.
    let sink_metrics = telemetry.metrics().clone();
    let events = moat_proxy::events::QueueSink::start_with_telemetry(
        &cfg.events,
        &src.base_dir,
        Some(&telemetry),
    )
    .map_err(|e| anyhow::anyhow!("events: {e}"))?;
    let (sink, writer) = match events {
        Some((s, w)) => (Some(s as Arc<dyn moat_proxy::EventSink>), Some(w)),
        None => (None, None),
    };
    let store_path = writer
        .as_ref()
        .and_then(|w| w.store_path())
        .map(Path::to_path_buf);
    let opts = GatewayOptions {
        events: sink,
        telemetry: Some(telemetry.clone()),
        admin: moat_console::console_routes(
            moat_proxy::engine_api::engine_routes(AdminRouter::new(), store_path.clone()),
            store_path,
        ),
        ..GatewayOptions::default()
    };
    let gw = Gateway::new(cfg, src, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    gw.shared()
        .metrics
        .add_renderer(Arc::new(move |out: &mut String| sink_metrics.render(out)));

    let running = gw.start().await?;
    running.spawn_reload_triggers();
    tracing::info!(threads, "moat started");
    if let Some(dir) = &quickstart {
        print_quickstart(&running, dir);
    }
    wait_for_signal().await;
    tracing::info!(deadline = ?drain, "shutting down: draining in-flight requests");
    let drained = running.shutdown(drain).await;
    if drained {
        tracing::info!("drained; bye");
    } else {
        tracing::warn!("drain deadline reached; closing remaining connections");
    }
    if let Some(writer) = writer {
        let _ = tokio::task::spawn_blocking(move || writer.shutdown()).await;
    }
    let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    Ok(())
}

fn print_quickstart(running: &moat_proxy::RunningGateway, data_dir: &Path) {
    let gw = running
        .listener_addr("main")
        .map(|a| a.to_string())
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let admin = running.admin_addr();
    let dir = data_dir.display();
    // `moat events` and `moat apis` find ./moat-quickstart by themselves.
    let data_flag = if data_dir == Path::new(super::data::QUICKSTART_DIR) {
        String::new()
    } else {
        format!(" --data-dir '{dir}'")
    };
    println!(
        "\nmoat quickstart: a demo API is running behind the gateway on {gw}, admin API on {admin}.\n\
         Its data (policies, event store, API inventory) is in {dir}/.\n\n\
         Try:\n  \
         curl -s 'http://{gw}/api/users/42'\n  \
         curl -s -X POST 'http://{gw}/login' -H 'content-type: application/json' -d '{{\"username\":\"alice\",\"password\":\"s3cret\"}}'\n  \
         curl -s 'http://{gw}/search?q=1%27%20OR%20%271%27=%271'      # SQL injection: 403 with an event id\n  \
         curl -s 'http://{gw}/admin'                                    # denied by an Istio policy\n  \
         curl -s -X POST 'http://{gw}/upload' -d 'aws_secret=AKIAQYLPMN5HHHFPZAM2'   # a leaked key: blocked\n  \
         curl -s 'http://{gw}/search?q=AKIAQYLPMN5HHHFPZAM2'       # a key in a response: redacted\n  \
         curl -s 'http://{admin}/v1/events?since=10m'                  # the security events\n  \
         curl -s 'http://{admin}/v1/apis'                               # the discovered API\n  \
         curl -s 'http://{admin}/metrics'\n  \
         curl -s 'http://{admin}/config'\n  \
         open 'http://{admin}/console'                               # the web console\n  \
         moat events{data_flag} --since 10m                           # the event store ({dir}/moat-events.db)\n  \
         moat apis list{data_flag}                                    # the API inventory ({dir}/moat-apis.db)\n\n\
         Press Ctrl-C to stop.\n"
    );
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        match (term, int) {
            (Ok(mut t), Ok(mut i)) => {
                tokio::select! {
                    _ = t.recv() => {}
                    _ = i.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs `moat check-config`.
pub fn check_config(args: CheckConfigArgs) -> ExitCode {
    match check(&args.file) {
        Ok(()) => {
            println!("{}: ok", args.file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

fn check(file: &Path) -> Result<(), moat_config::ConfigError> {
    let (mut cfg, src) = config::load_file(file)?;
    // API discovery opens its inventory database and starts a worker: validating
    // must not create files, and its section was already checked by the parser.
    cfg.discovery.enabled = false;
    // Build everything a start would build (pipeline, clusters), without binding.
    Gateway::new(cfg, src, GatewayOptions::default()).map(|_| ())
}
