//! `moat events`: query the persistent event store.

use std::path::PathBuf;
use std::process::ExitCode;

use moat_events::{now_ms, EventQuery, EventStore};

/// Arguments of `moat events`.
#[derive(clap::Args)]
pub struct EventsArgs {
    /// Event database (the `events.store.path` of the config). Default: found as
    /// `DATA_DIR/moat-events.db`, else `./moat-events.db`, else
    /// `./moat-quickstart/moat-events.db`.
    #[arg(long)]
    pub db: Option<PathBuf>,
    /// Directory holding `moat-events.db` (the quickstart's `--data-dir`).
    #[arg(long, env = "MOAT_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Only events since this time: a duration ago (`1h`, `30m`, `7d`), RFC 3339, or unix ms.
    #[arg(long)]
    pub since: Option<String>,
    /// Only events before this time (same forms as --since).
    #[arg(long)]
    pub until: Option<String>,
    /// Record type (`access`, `security`, `tls`) or engine (`waf`, `authz`, `authn`, `secrets`, `limits`).
    #[arg(long = "type")]
    pub kind: Option<String>,
    /// Route name.
    #[arg(long)]
    pub route: Option<String>,
    /// Decision or action (`allow`, `block`, `monitor`, `error`, `redact`, `bypass`).
    #[arg(long)]
    pub action: Option<String>,
    /// Rule, detector or policy of a security event (`sqli`, `ns/policy[rule 0]`).
    #[arg(long)]
    pub rule: Option<String>,
    /// Client IP, as recorded.
    #[arg(long)]
    pub client_ip: Option<String>,
    /// Request id: the `x-request-id` of a response (a block page shows it too).
    #[arg(long)]
    pub request_id: Option<String>,
    /// Event id of a security event: the `x-moat-event-id` of a refusal (a block page
    /// shows it too).
    #[arg(long)]
    pub event_id: Option<String>,
    /// Maximum number of events, newest first (1..=10000).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
    /// Print JSON (one object per line) instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `moat events`: exit 0 on success, 1 on a store error, 2 on bad arguments.
pub fn run(args: EventsArgs) -> ExitCode {
    let now = now_ms();
    let mut q = EventQuery::default();
    let params = [
        ("since", args.since),
        ("until", args.until),
        ("type", args.kind),
        ("route", args.route),
        ("action", args.action),
        ("rule", args.rule),
        ("client_ip", args.client_ip),
        ("request_id", args.request_id),
        ("event_id", args.event_id),
        ("limit", Some(args.limit.to_string())),
    ];
    for (k, v) in params {
        if let Some(v) = v {
            if let Err(e) = q.set(k, &v, now) {
                eprintln!("moat events: --{e}");
                return ExitCode::from(2);
            }
        }
    }
    let db = match super::data::resolve(
        args.db.as_deref(),
        args.data_dir.as_deref(),
        super::data::EVENTS_DB,
    ) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("moat events: {e}");
            return ExitCode::from(1);
        }
    };
    let store = match EventStore::open_read_only(&db) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("moat events: {}: {e}", db.display());
            return ExitCode::from(1);
        }
    };
    let events = match store.query(&q) {
        Ok(ev) => ev,
        Err(e) => {
            eprintln!("moat events: {e}");
            return ExitCode::from(1);
        }
    };
    if args.json {
        for e in &events {
            outln!("{e}");
        }
    } else {
        out!("{}", moat_events::text::render_table(&events));
    }
    ExitCode::SUCCESS
}
