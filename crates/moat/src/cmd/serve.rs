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

/// Where the quickstart keeps its policy file, event store and API inventory.
const QUICKSTART_DIR: &str = "moat-quickstart";

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
    let (cfg, src) = match &args.config {
        Some(file) => match config::load_file(file) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(1);
            }
        },
        None => {
            let base_dir = PathBuf::from(QUICKSTART_DIR);
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
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(serve(cfg, src, quickstart, threads)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat serve: {e}");
            ExitCode::from(1)
        }
    }
}

async fn serve(
    mut cfg: GatewayConfig,
    src: ConfigSource,
    quickstart: bool,
    threads: usize,
) -> anyhow::Result<()> {
    if quickstart {
        let demo = moat_proxy::demo::start().await?;
        for c in cfg.clusters.iter_mut().filter(|c| c.name.value == "demo") {
            c.endpoints = vec![unlocated(demo.to_string())];
        }
        tracing::info!(address = %demo, "demo app listening");
    }
    let drain = cfg.runtime.shutdown_timeout;
    let events = moat_proxy::events::QueueSink::start_if_enabled(&cfg.events, &src.base_dir)
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
        admin: moat_proxy::engine_api::engine_routes(AdminRouter::new(), store_path),
        ..GatewayOptions::default()
    };
    let gw = Gateway::new(cfg, src, opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    let running = gw.start().await?;
    running.spawn_reload_triggers();
    tracing::info!(threads, "moat started");
    if quickstart {
        print_quickstart(&running);
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
    Ok(())
}

fn print_quickstart(running: &moat_proxy::RunningGateway) {
    let gw = running
        .listener_addr("main")
        .map(|a| a.to_string())
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let admin = running.admin_addr();
    println!(
        "\nmoat quickstart: a demo API is running behind the gateway.\n\n\
         Try:\n  \
         curl -s http://{gw}/api/users/42\n  \
         curl -s -X POST http://{gw}/login -H 'content-type: application/json' -d '{{\"username\":\"alice\",\"password\":\"s3cret\"}}'\n  \
         curl -s \"http://{gw}/search?q=1%27%20OR%20%271%27=%271\"      # SQL injection: 403 with an event id\n  \
         curl -s http://{gw}/admin                                    # denied by an Istio policy\n  \
         curl -s -X POST http://{gw}/upload -d 'aws_secret=AKIAQYLPMN5HHHFPZAM2'   # a leaked key: blocked\n  \
         curl -s \"http://{gw}/search?q=AKIAQYLPMN5HHHFPZAM2\"       # a key in a response: redacted\n  \
         curl -s http://{admin}/v1/events?since=10m                  # the security events\n  \
         curl -s http://{admin}/v1/apis                               # the discovered API\n  \
         curl -s http://{admin}/metrics\n  \
         curl -s http://{admin}/config\n\n\
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
