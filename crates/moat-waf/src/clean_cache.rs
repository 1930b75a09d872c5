//! Per-thread memo of header values that produced no hit at all.
//!
//! Browsers repeat the same `User-Agent`, `Accept`, `Accept-Language`,
//! `Sec-CH-UA`... on every request, and those values are the costliest part of
//! inspecting a bodiless request (a browser User-Agent has parentheses,
//! semicolons, slashes and dots, so every detector runs on it). The outcome
//! for a header value is a pure function of the engine, the header name and
//! the value, so a value seen clean before is skipped.
//!
//! Exactness: an entry is stored only when the analysis raised no detector
//! hit of any confidence (counted before exclusions, so an exclusion on one
//! route cannot make a value look clean for another) and hit no limit, and a
//! lookup compares the engine id, name and value byte for byte (the hash only
//! picks the slot). Memory is bounded: [`SLOTS`] direct-mapped slots per
//! thread holding values of at most [`MAX_VALUE`] bytes; a colliding value
//! evicts the older one, so hostile traffic can only cost misses.

use std::cell::RefCell;

/// Slots per thread (a power of two).
pub(crate) const SLOTS: usize = 256;
/// Longest header value memoised.
pub(crate) const MAX_VALUE: usize = 512;

struct Entry {
    engine: u64,
    name: Box<str>,
    value: Box<[u8]>,
}

thread_local! {
    static CACHE: RefCell<Vec<Option<Entry>>> = const { RefCell::new(Vec::new()) };
}

/// Word-at-a-time multiplicative hash (FxHash-style): the slot index only.
fn slot(engine: u64, name: &str, value: &[u8]) -> usize {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = engine.wrapping_mul(K);
    for part in [name.as_bytes(), value] {
        let mut chunks = part.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        let mut w = [0u8; 8];
        let rest = chunks.remainder();
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w) ^ part.len() as u64).wrapping_mul(K);
    }
    (h >> 32) as usize & (SLOTS - 1)
}

/// True when `value` (the bytes as received) of header `name` was seen clean by
/// engine `engine` on this thread.
pub(crate) fn seen(engine: u64, name: &str, value: &[u8]) -> bool {
    if value.len() > MAX_VALUE {
        return false;
    }
    let i = slot(engine, name, value);
    CACHE.with(|c| {
        c.borrow()
            .get(i)
            .and_then(Option::as_ref)
            .is_some_and(|e| e.engine == engine && *e.name == *name && *e.value == *value)
    })
}

/// Records `value` of header `name` as clean for engine `engine`.
pub(crate) fn insert(engine: u64, name: &str, value: &[u8]) {
    if value.len() > MAX_VALUE {
        return;
    }
    let i = slot(engine, name, value);
    CACHE.with(|c| {
        let mut c = c.borrow_mut();
        if c.len() < SLOTS {
            c.resize_with(SLOTS, || None);
        }
        c[i] = Some(Entry {
            engine,
            name: name.into(),
            value: value.into(),
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_keys() {
        insert(7, "user-agent", b"Mozilla/5.0 (X11)");
        assert!(seen(7, "user-agent", b"Mozilla/5.0 (X11)"));
        assert!(!seen(8, "user-agent", b"Mozilla/5.0 (X11)"), "other engine");
        assert!(!seen(7, "accept", b"Mozilla/5.0 (X11)"), "other header");
        assert!(!seen(7, "user-agent", b"Mozilla/5.0 (X11) "), "other value");
        // two invalid byte sequences that read the same once decoded lossily
        insert(7, "user-agent", b"a\xff");
        assert!(
            !seen(7, "user-agent", b"a\xfe"),
            "keyed on the bytes received"
        );
        let long = "a".repeat(MAX_VALUE + 1);
        insert(7, "user-agent", long.as_bytes());
        assert!(!seen(7, "user-agent", long.as_bytes()), "too long to keep");
    }

    #[test]
    fn bounded_by_slots() {
        for i in 0..10 * SLOTS {
            insert(9, "x-h", format!("value-{i}").as_bytes());
        }
        CACHE.with(|c| assert_eq!(c.borrow().len(), SLOTS));
    }
}
