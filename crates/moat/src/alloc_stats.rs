//! A counting global allocator (cargo feature `alloc-stats`).
//!
//! It wraps mimalloc and counts every allocation call and the bytes requested,
//! so `moat bench` can report allocations per request of the real moat process
//! (read from `moat_allocations_total` on the admin `/metrics`). Without the
//! feature this module is not compiled and the binary uses mimalloc directly:
//! counting costs nothing unless asked for.
//!
//! The counters are sharded: each thread picks one of [`SHARDS`] cache-line
//! aligned slots the first time it allocates, so worker threads do not bounce
//! one cache line between cores on every allocation. Threads beyond the shard
//! count share slots, which is still correct (atomic adds), only slower.

// A global allocator is unsafe by definition.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use moat_proxy::metrics::AllocTotals;

/// Number of counter slots (more than moat's usual thread count).
const SHARDS: usize = 32;

/// One slot, alone on its cache line (128 bytes covers adjacent-line prefetch).
#[repr(align(128))]
struct Shard {
    allocs: AtomicU64,
    bytes: AtomicU64,
}

static COUNTERS: [Shard; SHARDS] = [const {
    Shard {
        allocs: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    }
}; SHARDS];

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // A const-initialized Cell without Drop: plain thread-local storage, no
    // destructor registration and no allocation, so it is usable inside the
    // allocator (including while a thread is being torn down).
    static MY_SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

#[inline]
fn shard() -> &'static Shard {
    let i = MY_SHARD
        .try_with(|s| {
            let i = s.get();
            if i < SHARDS {
                i
            } else {
                let n = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
                s.set(n);
                n
            }
        })
        .unwrap_or(0);
    &COUNTERS[i % SHARDS]
}

#[inline]
fn count(size: usize) {
    let s = shard();
    s.allocs.fetch_add(1, Ordering::Relaxed);
    s.bytes.fetch_add(size as u64, Ordering::Relaxed);
}

/// Process-wide totals since start: allocation calls and bytes requested.
///
/// `alloc`, `alloc_zeroed` and `realloc` each count as one allocation
/// (a `realloc` may move the block; its bytes are the new size). Frees are not
/// counted: the question answered is "how much allocator work does a request
/// cause", not "what is live".
pub fn totals() -> AllocTotals {
    COUNTERS
        .iter()
        .fold(AllocTotals::default(), |t, s| AllocTotals {
            calls: t.calls + s.allocs.load(Ordering::Relaxed),
            bytes: t.bytes + s.bytes.load(Ordering::Relaxed),
        })
}

/// mimalloc with allocation counting.
pub struct CountingMimalloc;

// SAFETY: every method forwards to mimalloc with the same arguments; the counting
// only touches atomics and const thread-local storage and never allocates.
unsafe impl GlobalAlloc for CountingMimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // These run inside the moat test binary, whose global allocator is this one
    // when the feature is on, so they observe real allocations.

    #[test]
    fn counts_this_threads_allocations_and_bytes() {
        let AllocTotals {
            calls: a0,
            bytes: b0,
        } = totals();
        let v: Vec<Box<[u8; 1000]>> = (0..100).map(|_| Box::new([7u8; 1000])).collect();
        std::hint::black_box(&v);
        let AllocTotals {
            calls: a1,
            bytes: b1,
        } = totals();
        // 100 boxes plus the vector's own buffer; other test threads may add more.
        assert!(a1 - a0 >= 101, "{a0} -> {a1}");
        assert!(b1 - b0 >= 100 * 1000, "{b0} -> {b1}");
    }

    #[test]
    fn counts_allocations_of_other_threads() {
        let a0 = totals().calls;
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for i in 0..1000u32 {
                        std::hint::black_box(i.to_string());
                    }
                });
            }
        });
        let a1 = totals().calls;
        assert!(a1 - a0 >= 4000, "{a0} -> {a1}");
    }
}
