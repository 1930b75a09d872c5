//! Test support shared by the crates whose tests start real external components
//! (redis-server, nginx, Chromium, Kafka, OPA, an OTLP collector...).
//!
//! The project's test command (`scripts/test`) installs those components first and sets
//! `MOAT_REQUIRE_REAL_PARTS=1`, so a component that is still missing fails the run instead
//! of being skipped. A developer running `cargo test` without them gets a printed notice
//! naming what to install, and the test returns early.

use std::path::{Path, PathBuf};

pub mod rsyslog;

/// The environment variable that turns a missing real component into a test failure.
pub const REQUIRE_VAR: &str = "MOAT_REQUIRE_REAL_PARTS";

/// The workspace's root directory (where `Cargo.toml` with `[workspace]` lives).
pub fn workspace_root() -> PathBuf {
    // This crate is at <root>/crates/moat-testkit.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// `target/tools` (or `$CARGO_TARGET_DIR/tools`), where the scripts build Go tools.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
        .join("tools")
}

/// Finds the executable `name` on `PATH`, in `target/tools` or in `extra` directories.
pub fn find_executable(name: &str, extra: &[&Path]) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = extra.iter().map(|d| d.to_path_buf()).collect();
    dirs.push(tools_dir());
    dirs.push(tools_dir().join("bin"));
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.extend(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// `PATH` with the directory of `exe` first: for a script a test starts that calls a
/// real component found outside `PATH` (`go` in `target/tools`, say).
pub fn path_with_dir_of(exe: &Path) -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> = exe.parent().map(Path::to_path_buf).into_iter().collect();
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap_or_default()
}

/// Whether the run requires every real component (`MOAT_REQUIRE_REAL_PARTS=1`).
pub fn required() -> bool {
    std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1")
}

/// Returns the path of the real component `name`, or `None` after printing a notice that
/// the test is skipped and how to install it (`hint`). Panics instead of skipping when
/// [`required`], so the project's test command cannot pass without the component.
pub fn real_part(name: &str, hint: &str) -> Option<PathBuf> {
    real_part_in(name, &[], hint)
}

/// [`real_part`], also looking in `extra` directories first.
pub fn real_part_in(name: &str, extra: &[&Path], hint: &str) -> Option<PathBuf> {
    if let Some(path) = find_executable(name, extra) {
        return Some(path);
    }
    assert!(
        !required(),
        "{name} is required ({REQUIRE_VAR}=1) but was not found: {hint}"
    );
    eprintln!("notice: test skipped: {name} not found ({hint})");
    None
}

/// A free TCP port on 127.0.0.1 (bound, then released; good enough for tests that start a
/// separate process on it).
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Waits until something accepts TCP connections on `127.0.0.1:port`, up to `timeout`.
pub fn wait_for_port(port: u16, timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    false
}

/// A child process killed (and reaped) when dropped, so a failed test leaves no server behind.
pub struct ChildGuard(pub std::process::Child);

impl ChildGuard {
    /// The process id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
