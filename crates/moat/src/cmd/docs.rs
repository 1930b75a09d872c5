//! `moat completions` and `moat man`: shell completions and man pages generated
//! from the command-line definition itself, so they never drift from it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap_complete::Shell;

/// Arguments of `moat completions`.
#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Arguments of `moat man`.
#[derive(clap::Args)]
pub struct ManArgs {
    /// Write `moat.1` and one `moat-<command>.1` per subcommand into this directory
    /// (default: print `moat.1` on standard output).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// Prints the completion script of `shell` for `cmd` on standard output.
pub fn completions(args: CompletionsArgs, mut cmd: clap::Command) -> ExitCode {
    let name = cmd.get_name().to_string();
    // Generated into memory: clap_complete panics on a failed write (a closed pipe).
    let mut buf = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, name, &mut buf);
    out!("{}", String::from_utf8_lossy(&buf));
    ExitCode::SUCCESS
}

/// Prints or writes the man pages of `cmd`.
pub fn man(args: ManArgs, cmd: clap::Command) -> ExitCode {
    let result = match &args.dir {
        None => {
            let mut out = std::io::stdout().lock();
            clap_mangen::Man::new(cmd).render(&mut out)
        }
        Some(dir) => std::fs::create_dir_all(dir).and_then(|_| write_pages(dir, cmd)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moat man: {e}");
            ExitCode::from(1)
        }
    }
}

/// `moat.1` and one page per subcommand (`moat-serve.1`, ...), recursively.
fn write_pages(dir: &std::path::Path, cmd: clap::Command) -> std::io::Result<()> {
    let mut cmd = cmd;
    cmd.build();
    write_page(dir, &cmd, cmd.get_name())
}

fn write_page(dir: &std::path::Path, cmd: &clap::Command, name: &str) -> std::io::Result<()> {
    let page = cmd.clone().name(name.to_string());
    let mut buf = Vec::new();
    clap_mangen::Man::new(page).render(&mut buf)?;
    let path = dir.join(format!("{name}.1"));
    std::fs::write(&path, buf)?;
    {
        use std::io::Write;
        writeln!(std::io::stdout().lock(), "{}", path.display())?;
    }
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write_page(dir, sub, &format!("{name}-{}", sub.get_name()))?;
    }
    Ok(())
}
