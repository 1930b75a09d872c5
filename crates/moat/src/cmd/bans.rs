//! `moat bans`: list, add and lift IP bans through a running gateway's admin API
//! (`/v1/bans`). With a shared store (`ratelimit.store: { redis: ... }`) a change made
//! through one instance reaches them all.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::time::Duration;

/// Longest admin answer read.
const MAX_ANSWER: u64 = 16 << 20;

/// Arguments of `moat bans`.
#[derive(clap::Args)]
pub struct BansArgs {
    /// The gateway's admin address (`admin.address`).
    #[arg(
        long,
        env = "MOAT_ADMIN",
        default_value = "127.0.0.1:9901",
        global = true
    )]
    admin: String,
    /// The admin bearer token (`admin.token`), if one is configured.
    #[arg(long, env = "MOAT_ADMIN_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    #[command(subcommand)]
    command: BansCommand,
}

#[derive(clap::Subcommand)]
enum BansCommand {
    /// List the bans in force.
    List {
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Ban an IP address.
    Add {
        /// The address.
        ip: std::net::IpAddr,
        /// How long, e.g. `10m`, `2h`.
        #[arg(long = "for", default_value = "1h")]
        duration: String,
    },
    /// Lift the ban of an IP address.
    Delete {
        /// The address.
        ip: std::net::IpAddr,
    },
}

/// Runs `moat bans`: exit 0 on success, 1 when the gateway refused or could not be reached.
pub fn run(args: BansArgs) -> ExitCode {
    let (method, path, body) = match &args.command {
        BansCommand::List { .. } => ("GET", "/v1/bans".to_string(), String::new()),
        BansCommand::Add { ip, duration } => (
            "POST",
            "/v1/bans".to_string(),
            serde_json::json!({ "ip": ip, "duration": duration }).to_string(),
        ),
        BansCommand::Delete { ip } => ("DELETE", format!("/v1/bans?ip={ip}"), String::new()),
    };
    let (status, answer) = match request(&args.admin, args.token.as_deref(), method, &path, &body) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("moat bans: admin API at {}: {e}", args.admin);
            return ExitCode::from(1);
        }
    };
    let v: serde_json::Value = serde_json::from_str(&answer).unwrap_or(serde_json::Value::Null);
    if status != 200 {
        let msg = v["error"]
            .as_str()
            .map_or(answer.trim().to_string(), str::to_string);
        eprintln!("moat bans: {status}: {msg}");
        return ExitCode::from(1);
    }
    match args.command {
        BansCommand::List { json: true } => outln!("{answer}"),
        BansCommand::List { json: false } => {
            let now = moat_ratelimit::bans::unix_ms();
            let bans = v["bans"].as_array().cloned().unwrap_or_default();
            if bans.is_empty() {
                outln!("no bans");
            }
            for b in bans {
                let left = b["until_ms"].as_u64().unwrap_or(0).saturating_sub(now) / 1000;
                outln!("{}\t{left}s left", b["ip"].as_str().unwrap_or("?"));
            }
        }
        BansCommand::Add { ip, .. } => outln!("banned {ip}"),
        BansCommand::Delete { ip } => outln!("lifted the ban of {ip}"),
    }
    ExitCode::SUCCESS
}

/// One HTTP/1.1 request to the admin listener: the status and the body.
fn request(
    admin: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(admin)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(10)))?;
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {admin}\r\n{auth}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.take(MAX_ANSWER).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP answer");
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}
