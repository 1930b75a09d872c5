//! The calling thread's own counters, read around a measured loop: user-space
//! instructions retired (a hardware counter) and CPU time (the kernel's task clock, a
//! software counter), through Linux perf events.
//!
//! Either may be missing: virtual machines often expose no hardware counters, and
//! `kernel.perf_event_paranoid` can refuse both; each missing counter says why. A
//! counter the kernel multiplexed with others is scaled by the share of the time it
//! actually counted, as `perf stat` does.

/// One counter of the calling thread, or why there is none.
#[derive(Debug)]
pub(super) struct ThreadCounter {
    #[cfg(target_os = "linux")]
    counter: Result<perf_event::Counter, String>,
    #[cfg(not(target_os = "linux"))]
    counter: Result<std::convert::Infallible, String>,
}

impl ThreadCounter {
    /// User-space instructions retired by this thread.
    pub(super) fn instructions() -> ThreadCounter {
        #[cfg(target_os = "linux")]
        {
            Self::open(perf_event::events::Hardware::INSTRUCTIONS)
        }
        #[cfg(not(target_os = "linux"))]
        {
            Self::unsupported()
        }
    }

    /// This thread's CPU time in nanoseconds (user and system).
    pub(super) fn cpu_time() -> ThreadCounter {
        #[cfg(target_os = "linux")]
        {
            Self::open(perf_event::events::Software::TASK_CLOCK)
        }
        #[cfg(not(target_os = "linux"))]
        {
            Self::unsupported()
        }
    }

    #[cfg(target_os = "linux")]
    fn open(event: impl perf_event::events::Event) -> ThreadCounter {
        // The builder's defaults: this thread only (not its children), on any CPU,
        // disabled until `start`, kernel and hypervisor excluded.
        let counter = perf_event::Builder::new(event)
            .build()
            .map_err(|e| match e.kind() {
                // ENOENT: no such event on this PMU (or under this hypervisor); ENOSYS:
                // a kernel without perf events. Other errors keep the OS message.
                std::io::ErrorKind::NotFound | std::io::ErrorKind::Unsupported => {
                    "no such counter on this machine".to_string()
                }
                std::io::ErrorKind::PermissionDenied => {
                    format!("not permitted (kernel.perf_event_paranoid): {e}")
                }
                _ => e.to_string(),
            });
        ThreadCounter { counter }
    }

    #[cfg(not(target_os = "linux"))]
    fn unsupported() -> ThreadCounter {
        ThreadCounter {
            counter: Err("perf events are Linux's".to_string()),
        }
    }

    /// Why there is no count, if there is none.
    pub(super) fn missing(&self) -> Option<&str> {
        self.counter.as_ref().err().map(String::as_str)
    }

    /// Zeroes and starts the counter.
    pub(super) fn start(&mut self) {
        #[cfg(target_os = "linux")]
        if let Ok(c) = &mut self.counter {
            if let Err(e) = c.reset().and_then(|()| c.enable()) {
                self.counter = Err(format!("starting the counter: {e}"));
            }
        }
    }

    /// Stops the counter and returns its count since [`start`](Self::start), scaled
    /// when the kernel multiplexed it; `None` when there is no counter.
    pub(super) fn stop(&mut self) -> Option<u64> {
        #[cfg(target_os = "linux")]
        {
            let c = self.counter.as_mut().ok()?;
            let read = c.disable().and_then(|()| c.read_full());
            match read {
                Ok(data) => {
                    let count = data.count();
                    match (data.time_enabled(), data.time_running()) {
                        (Some(on), Some(ran)) if !ran.is_zero() && ran < on => Some(
                            (count as f64 * on.as_secs_f64() / ran.as_secs_f64()).round() as u64,
                        ),
                        (Some(_), Some(ran)) if ran.is_zero() && count == 0 => {
                            self.counter = Err("the kernel never scheduled the counter".into());
                            None
                        }
                        _ => Some(count),
                    }
                }
                Err(e) => {
                    self.counter = Err(format!("reading the counter: {e}"));
                    None
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            None
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// The task clock is a software counter: it exists wherever perf events are
    /// allowed, including virtual machines without hardware counters. It counts this
    /// thread's CPU time, so a busy loop shows up and a sleep does not.
    #[test]
    fn cpu_time_counts_this_threads_work_not_its_sleep() {
        let mut c = ThreadCounter::cpu_time();
        if let Some(why) = c.missing() {
            eprintln!("skipped: no task clock here ({why})");
            return;
        }
        c.start();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let slept = c.stop().expect("task clock");
        // Busy until the scheduler's own account of this thread's CPU time
        // (`/proc/thread-self/schedstat`) has grown 50 ms: a wall-clock loop counts less
        // CPU when a loaded machine preempts the thread.
        let ran = || -> u64 {
            std::fs::read_to_string("/proc/thread-self/schedstat")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        c.start();
        let (from, t) = (ran(), std::time::Instant::now());
        let mut x = 1u64;
        while ran().saturating_sub(from) < 50_000_000 && t.elapsed().as_secs() < 10 {
            for _ in 0..10_000 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        }
        let busy = c.stop().expect("task clock");
        assert!(
            slept < 10_000_000,
            "a 50 ms sleep counted {slept} ns of CPU"
        );
        assert!(
            busy > 25_000_000,
            "50 ms of CPU in a busy loop counted {busy} ns"
        );
    }

    /// Instructions are counted when the machine has the hardware counter; else the
    /// counter says why, and reads as `None` rather than zero.
    #[test]
    fn instructions_are_counted_or_missing_with_a_reason() {
        let mut c = ThreadCounter::instructions();
        c.start();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = std::hint::black_box(x ^ i);
        }
        match (c.stop(), c.missing()) {
            (Some(n), None) => assert!(n > 1_000_000, "{n} instructions for a million steps"),
            (None, Some(why)) => assert!(!why.is_empty()),
            other => panic!("count and reason disagree: {other:?}"),
        }
    }
}
