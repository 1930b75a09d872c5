//! Linux process helpers: CPU pinning and resource usage from `/proc`.

// System calls (CPU affinity, thread CPU time, clock ticks) through libc.
#![allow(unsafe_code)]

use std::io;

/// Pins the calling thread to `cpu` with `sched_setaffinity`.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    pin_pid(0, cpu)
}

/// Pins process (or thread) `pid` to `cpu`; `pid` 0 is the calling thread.
pub fn pin_pid(pid: i32, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cpu {cpu} out of range"),
        ));
    }
    // SAFETY: cpu_set_t is plain data, zero-initialized is the empty set; CPU_SET
    // writes inside it (bound checked above); sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// CPU seconds used by the calling thread (`CLOCK_THREAD_CPUTIME_ID`).
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Number of CPUs this process may run on.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Clock ticks per second for `/proc/PID/stat` times.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// User + system CPU seconds consumed so far by process `pid` (all its threads).
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat_cpu(&stat)
        .map(|ticks| ticks as f64 / clock_ticks())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed /proc stat"))
}

/// utime + stime (fields 14 and 15) in clock ticks from a `/proc/PID/stat` line.
pub fn parse_stat_cpu(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: skip to the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 => index 11.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Scheduler statistics of one thread (`/proc/PID/task/TID/schedstat`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SchedStat {
    /// Seconds on the CPU.
    pub run_s: f64,
    /// Seconds runnable but waiting for the CPU (other threads had it).
    pub wait_s: f64,
}

/// Scheduler statistics of thread `tid` of process `pid` so far.
pub fn thread_schedstat(pid: u32, tid: i32) -> io::Result<SchedStat> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat"))?;
    parse_schedstat(&s)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed schedstat"))
}

/// `run_ns wait_ns timeslices` from a schedstat line.
pub fn parse_schedstat(s: &str) -> Option<SchedStat> {
    let mut it = s.split_whitespace().map(|f| f.parse::<u64>().ok());
    let run = it.next()??;
    let wait = it.next()??;
    Some(SchedStat {
        run_s: run as f64 / 1e9,
        wait_s: wait as f64 / 1e9,
    })
}

/// Peak resident set size (`VmHWM`) of process `pid`, in KiB.
pub fn peak_rss_kib(pid: u32) -> io::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    parse_status_kib(&status, "VmHWM:")
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "no VmHWM in /proc status"))
}

/// Value in KiB of a `Name:   123 kB` line of `/proc/PID/status`.
pub fn parse_status_kib(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Resets the peak RSS counter of `pid` (writes 5 to `/proc/PID/clear_refs`), so
/// `VmHWM` measures one phase. Fails without permission; callers treat that as
/// "peak since start".
pub fn reset_peak_rss(pid: u32) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_stat() {
        let line =
            "1234 (moat (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1 1 1";
        assert_eq!(parse_stat_cpu(line), Some(300));
        assert_eq!(parse_stat_cpu("garbage"), None);
    }

    #[test]
    fn parses_proc_status() {
        let s = "Name:\tmoat\nVmPeak:\t  9000 kB\nVmHWM:\t    4242 kB\n";
        assert_eq!(parse_status_kib(s, "VmHWM:"), Some(4242));
        assert_eq!(parse_status_kib(s, "VmRSS:"), None);
    }

    #[test]
    fn parses_schedstat() {
        let s = parse_schedstat("1500000000 250000000 42\n").unwrap();
        assert_eq!((s.run_s, s.wait_s), (1.5, 0.25));
        assert_eq!(parse_schedstat("x 1 2"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn reads_own_process() {
        let pid = std::process::id();
        assert!(peak_rss_kib(pid).unwrap() > 0);
        assert!(cpu_seconds(pid).unwrap() >= 0.0);
    }
}
