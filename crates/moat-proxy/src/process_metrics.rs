//! Process metrics in the names every Prometheus client library uses
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...), read from
//! `/proc/self` when `/metrics` is scraped. Linux only; elsewhere nothing is rendered.

use std::fmt::Write as _;

/// Appends the process series to `out`.
pub(crate) fn render(out: &mut String) {
    #[cfg(target_os = "linux")]
    linux::render(out);
    #[cfg(not(target_os = "linux"))]
    let _ = out;
}

#[cfg(target_os = "linux")]
mod linux {
    use super::*;

    /// /proc reports CPU times and start times in USER_HZ ticks, which the kernel
    /// fixes at 100 per second for user space on every architecture.
    const USER_HZ: f64 = 100.0;

    pub(super) fn render(out: &mut String) {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        // Fields after the command name (which may hold spaces, inside parentheses);
        // `rest[0]` is field 3, the state.
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| rest.get(n - 3).and_then(|v| v.parse::<u64>().ok());
        if let (Some(utime), Some(stime)) = (field(14), field(15)) {
            let cpu = (utime + stime) as f64 / USER_HZ;
            let _ = write!(out, "# HELP process_cpu_seconds_total User and system CPU time spent, seconds.\n# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total {cpu}\n");
        }
        let btime = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
        if let (Some(start), Some(btime)) = (field(22), btime) {
            let t = btime as f64 + start as f64 / USER_HZ;
            let _ = write!(out, "# HELP process_start_time_seconds Start time of the process since the unix epoch, seconds.\n# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {t}\n");
        }
        // VmRSS is in kB whatever the page size.
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kb = |key: &str| {
            status.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            })
        };
        if let Some(rss) = kb("VmRSS:") {
            let _ = write!(out, "# HELP process_resident_memory_bytes Resident memory size, bytes.\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes {}\n", rss * 1024);
        }
        if let Some(vm) = kb("VmSize:") {
            let _ = write!(out, "# HELP process_virtual_memory_bytes Virtual memory size, bytes.\n# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes {}\n", vm * 1024);
        }
        if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle itself is one of the entries.
            let n = dir.count().saturating_sub(1);
            let _ = write!(out, "# HELP process_open_fds Open file descriptors.\n# TYPE process_open_fds gauge\nprocess_open_fds {n}\n");
        }
        let max = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Max open files"))
                    .and_then(|l| l.split_whitespace().nth(3))
                    .and_then(|v| v.parse::<u64>().ok())
            });
        if let Some(max) = max {
            let _ = write!(out, "# HELP process_max_fds Limit on open file descriptors.\n# TYPE process_max_fds gauge\nprocess_max_fds {max}\n");
        }
    }
}
