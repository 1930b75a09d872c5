//! Giving the allocator's free memory back once a flood is over.
//!
//! mimalloc keeps per-thread heaps. A block freed by another thread than the
//! one that allocated it (a request's buffers when its task moved to another
//! worker, an event record freed by the event writer) goes on the owning
//! thread's delayed-free list, and the pages it empties are returned to the OS
//! only when the owner allocates again or collects. A worker that goes idle
//! after a flood would keep that memory resident indefinitely: the measured RSS
//! stayed near the flood's peak (docs/perf.md, "Memory after a flood").
//!
//! So each runtime worker collects its heap when it parks (it has run out of
//! work), at most once per [`COLLECT_EVERY`]: under load a worker parks
//! thousands of times a second and a forced collection visits every page, while
//! an idle gateway pays nothing. The wake-ups of the config poll (every second)
//! give a parked worker further chances after the flood.

use moat_core::clock::CoarseInstant;
use std::cell::Cell;
use std::time::Duration;

/// Least time between two collections on one thread.
pub const COLLECT_EVERY: Duration = Duration::from_millis(500);

thread_local! {
    static LAST_COLLECT: Cell<Option<CoarseInstant>> = const { Cell::new(None) };
}

/// The runtime's `on_thread_park` hook: collects this thread's heap when the
/// last collection is older than [`COLLECT_EVERY`]. A worker parks up to twice per
/// request at low load: the coarse clock (no TSC read) times half-second intervals.
pub fn on_park() {
    let now = CoarseInstant::now();
    let due = LAST_COLLECT.with(|last| {
        let due = last
            .get()
            .is_none_or(|t| now.duration_since(t) >= COLLECT_EVERY);
        if due {
            last.set(Some(now));
        }
        due
    });
    if due {
        collect();
    }
}

/// Frees this thread's delayed frees and empty pages and returns them to the OS.
#[allow(unsafe_code)]
fn collect() {
    // SAFETY: mi_collect takes no pointer; it only walks the calling thread's
    // own heap, which no other thread touches, and is safe at any time.
    unsafe { libmimalloc_sys::mi_collect(true) }
}
