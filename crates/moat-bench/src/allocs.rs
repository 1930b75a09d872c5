//! Allocations of the moat process, read from its admin `/metrics`.
//!
//! A moat binary built with `--features alloc-stats` counts every heap
//! allocation (a counting global allocator around mimalloc) and exposes the
//! totals as `moat_allocations_total` and `moat_allocated_bytes_total`. The
//! runner reads them when the measured window starts and after the load, and
//! divides the difference by the measured responses. A binary without the
//! feature has no such series: the report then shows `n/a`.
//!
//! The start reading is taken by a separate thread woken by the load
//! generator's [`crate::loadgen::MeasureHook`], never by the generator itself
//! (a blocking scrape on the generator thread would delay requests). Both
//! scrapes are themselves served by moat and allocate a little (rendering the
//! text); over thousands of measured requests that is well below 0.1 per
//! request. Requests served between the start of the window and the start
//! reading (the scraper thread's wake-up, well under a millisecond when the
//! machine is not saturated) are in the responses but not in the allocations,
//! which under-counts by the same tiny fraction.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::loadgen::MeasureHook;

/// Largest `/metrics` response read (moat's is a few KiB to a few hundred KiB).
const MAX_METRICS: u64 = 16 << 20;

/// Allocation totals of a process at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocTotals {
    /// Allocation calls since start.
    pub allocs: u64,
    /// Bytes requested since start.
    pub bytes: u64,
}

impl AllocTotals {
    /// `(allocations per response, bytes per response)` between `self` and a later reading.
    pub fn per_response(&self, later: &AllocTotals, responses: u64) -> Option<(f64, f64)> {
        if responses == 0 {
            return None;
        }
        let a = later.allocs.checked_sub(self.allocs)?;
        let b = later.bytes.checked_sub(self.bytes)?;
        Some((a as f64 / responses as f64, b as f64 / responses as f64))
    }
}

/// Finds the allocation counters in a Prometheus text exposition; `None` when absent.
pub fn parse_metrics(text: &str) -> Option<AllocTotals> {
    let value = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?;
            // The name must end here (not `moat_allocations_total_foo`).
            let v = rest.strip_prefix(' ')?;
            v.trim().parse::<u64>().ok()
        })
    };
    Some(AllocTotals {
        allocs: value("moat_allocations_total")?,
        bytes: value("moat_allocated_bytes_total")?,
    })
}

/// Reads `/metrics` from the admin listener at `admin`; `Ok(None)` when the
/// binary does not count allocations.
pub fn read(admin: SocketAddr, timeout: Duration) -> std::io::Result<Option<AllocTotals>> {
    let mut s = TcpStream::connect_timeout(&admin, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.write_all(
        format!("GET /metrics HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut buf = Vec::new();
    s.take(MAX_METRICS).read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf);
    if !text.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "admin /metrics answered `{}`",
                text.lines().next().unwrap_or("")
            ),
        ));
    }
    Ok(parse_metrics(&text))
}

/// Takes one reading on a helper thread when the measured window starts.
pub struct StartReading {
    hook: MeasureHook,
    thread: JoinHandle<Option<AllocTotals>>,
}

impl StartReading {
    /// Prepares a reading of `admin`, taken when [`StartReading::hook`] is called.
    pub fn new(admin: SocketAddr, timeout: Duration) -> std::io::Result<StartReading> {
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("moat-bench-allocs".into())
            .spawn(move || {
                // Err: the hook was dropped without being called (the load failed).
                rx.recv().ok()?;
                read(admin, timeout).ok().flatten()
            })?;
        let hook = MeasureHook(Arc::new(move || {
            let _ = tx.send(());
        }));
        Ok(StartReading { hook, thread })
    }

    /// The hook to put in the [`crate::loadgen::LoadSpec`].
    pub fn hook(&self) -> MeasureHook {
        self.hook.clone()
    }

    /// The reading, once every copy of the hook has been called or dropped
    /// (drop the `LoadSpec` first, or this waits for ever).
    pub fn finish(self) -> Option<AllocTotals> {
        drop(self.hook);
        self.thread.join().ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counters_and_rejects_prefixes() {
        let text = "# HELP moat_allocations_total x\n# TYPE moat_allocations_total counter\nmoat_allocations_total 12345\nmoat_allocated_bytes_total 999999\n";
        assert_eq!(
            parse_metrics(text),
            Some(AllocTotals {
                allocs: 12345,
                bytes: 999999
            })
        );
        assert_eq!(parse_metrics("moat_connections_total 3\n"), None);
        assert_eq!(
            parse_metrics("moat_allocations_total_x 1\nmoat_allocated_bytes_total 2\n"),
            None
        );
    }

    #[test]
    fn per_response_divides_and_refuses_nonsense() {
        let a = AllocTotals {
            allocs: 1000,
            bytes: 10_000,
        };
        let b = AllocTotals {
            allocs: 3000,
            bytes: 50_000,
        };
        assert_eq!(a.per_response(&b, 100), Some((20.0, 400.0)));
        assert_eq!(a.per_response(&b, 0), None);
        // A restarted process (counters went down) gives no value.
        assert_eq!(b.per_response(&a, 100), None);
    }

    #[test]
    fn start_reading_without_the_hook_called_is_none() {
        // Nothing listens on port 9 of loopback in tests; the hook is never called.
        let r = StartReading::new(
            SocketAddr::from(([127, 0, 0, 1], 9)),
            Duration::from_millis(100),
        )
        .unwrap();
        assert_eq!(r.finish(), None);
    }
}
