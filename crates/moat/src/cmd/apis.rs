//! `moat apis`: the API inventory built by discovery (list it, export OpenAPI 3.1).

use std::path::PathBuf;
use std::process::ExitCode;

use moat_inventory::load_inventory;
use moat_schema::Endpoint;

/// Arguments of `moat apis`.
#[derive(clap::Args)]
pub struct ApisArgs {
    #[command(subcommand)]
    command: ApisCommand,
}

#[derive(clap::Subcommand)]
enum ApisCommand {
    /// Export the inventory as an OpenAPI 3.1 document (JSON).
    Export {
        /// Output file (`-` for standard output).
        #[arg(long)]
        openapi: PathBuf,
        /// Inventory database (the `discovery.inventory` of the config). Default:
        /// found as `DATA_DIR/moat-apis.db`, else `./moat-apis.db`, else
        /// `./moat-quickstart/moat-apis.db`.
        #[arg(long)]
        db: Option<PathBuf>,
        /// Directory holding `moat-apis.db` (the quickstart's `--data-dir`).
        #[arg(long, env = "MOAT_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// `info.title` of the document.
        #[arg(long, default_value = "API discovered by moat")]
        title: String,
    },
    /// List the endpoints of the inventory.
    List {
        /// Inventory database (default: found as for `export`).
        #[arg(long)]
        db: Option<PathBuf>,
        /// Directory holding `moat-apis.db` (the quickstart's `--data-dir`).
        #[arg(long, env = "MOAT_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Print the endpoints as JSON (as `GET /v1/apis` does).
        #[arg(long)]
        json: bool,
    },
}

/// Runs `moat apis`: exit 0 on success, 1 when the inventory cannot be read or the file written.
pub fn run(args: ApisArgs) -> ExitCode {
    match args.command {
        ApisCommand::Export {
            openapi,
            db,
            data_dir,
            title,
        } => {
            let endpoints = match load(db.as_deref(), data_dir.as_deref()) {
                Some(e) => e,
                None => return ExitCode::from(1),
            };
            let doc = moat_schema::openapi::openapi(&endpoints, &title);
            let text = match serde_json::to_string_pretty(&doc) {
                Ok(t) => t + "\n",
                Err(e) => {
                    eprintln!("moat apis export: {e}");
                    return ExitCode::from(1);
                }
            };
            if openapi.as_os_str() == "-" {
                out!("{text}");
            } else if let Err(e) = std::fs::write(&openapi, text) {
                eprintln!("moat apis export: {}: {e}", openapi.display());
                return ExitCode::from(1);
            } else {
                eprintln!(
                    "wrote {} endpoint(s) to {}",
                    endpoints.len(),
                    openapi.display()
                );
            }
            ExitCode::SUCCESS
        }
        ApisCommand::List { db, data_dir, json } => {
            let endpoints = match load(db.as_deref(), data_dir.as_deref()) {
                Some(e) => e,
                None => return ExitCode::from(1),
            };
            if json {
                let list: Vec<serde_json::Value> =
                    endpoints.iter().map(Endpoint::to_json).collect();
                outln!(
                    "{}",
                    serde_json::json!({ "count": list.len(), "endpoints": list })
                );
            } else {
                out!("{}", table(&endpoints));
            }
            ExitCode::SUCCESS
        }
    }
}

fn load(db: Option<&std::path::Path>, data_dir: Option<&std::path::Path>) -> Option<Vec<Endpoint>> {
    let db = match super::data::resolve(db, data_dir, super::data::APIS_DB) {
        Ok(db) => db,
        Err(e) => {
            eprintln!("moat apis: {e}");
            return None;
        }
    };
    match load_inventory(&db) {
        Ok(e) => Some(e),
        Err(e) => {
            eprintln!("moat apis: {}: {e}", db.display());
            None
        }
    }
}

fn table(endpoints: &[Endpoint]) -> String {
    let mut rows = vec![[
        "METHOD".to_string(),
        "PATH".into(),
        "ROUTE".into(),
        "COUNT".into(),
        "STATUSES".into(),
        "AUTH".into(),
        "SENSITIVE".into(),
    ]];
    for e in endpoints {
        let statuses: Vec<String> = e.responses.keys().map(u16::to_string).collect();
        let auth: Vec<&str> = e.auth.keys().map(String::as_str).collect();
        let mut sensitive: Vec<String> = e
            .sensitive()
            .iter()
            .filter_map(|s| s.tags.get("type").cloned())
            .collect();
        sensitive.sort();
        sensitive.dedup();
        rows.push([
            e.method.clone(),
            e.path.clone(),
            e.route.clone(),
            e.count.to_string(),
            statuses.join(","),
            auth.join(","),
            sensitive.join(","),
        ]);
    }
    let mut widths = [0usize; 7];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(widths.iter())
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
