//! One module per subcommand; each owns its clap arguments and a `run` function.

pub mod apis;
pub mod bans;
pub mod bench;
pub mod bench_cost;
pub mod certs;
pub mod data;
pub mod docs;
pub mod events;
pub mod policy;
pub mod scan;
pub mod serve;
pub mod waf;

/// Writes `text` to standard output. A reader that went away (`moat … | head`) is not
/// an error: the command's output was simply not wanted further, as for any Unix filter
/// (`print!` would panic there instead).
pub fn print_out(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}
