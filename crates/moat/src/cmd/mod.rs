//! One module per subcommand; each owns its clap arguments and a `run` function.

/// `print!` for a command's output ([`out_or_exit`]): a reader that went away ends the
/// output quietly, any other write error ends the command; `print!` would panic on
/// either.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cmd::out_or_exit(&format!($($arg)*))
    };
}

/// `println!` for a command's output, as [`out!`].
macro_rules! outln {
    () => {
        $crate::cmd::out_or_exit("\n")
    };
    ($($arg:tt)*) => {
        $crate::cmd::out_or_exit(&(format!($($arg)*) + "\n"))
    };
}

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

/// Writes a command's output to standard output. A reader that went away (`moat … |
/// head`) is not an error: the output was simply not wanted further, as for any Unix
/// filter (`print!` would panic there instead). Any other write error (a full disk
/// behind a redirection) ends the process with exit 1 and says so, rather than losing
/// the rest of the output silently.
pub fn out_or_exit(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            eprintln!("moat: cannot write to standard output: {e}");
            std::process::exit(1);
        }
        _ => {}
    }
}
