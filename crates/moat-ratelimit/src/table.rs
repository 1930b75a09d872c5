//! Bounded, sharded maps from a key's hash to its state.
//!
//! Keys arrive already hashed (with a per-process random SipHash key, so a client
//! cannot aim collisions), so the maps hash with the identity. Each shard holds at most
//! `max / SHARDS` keys: when full it forgets idle keys, and while none is idle a new key
//! shares the shard's overflow slot, so a flood of distinct keys neither grows memory
//! nor escapes the limit.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use parking_lot::Mutex;

/// Number of shards (a power of two).
const SHARDS: usize = 16;

/// A hasher for keys that are already hashes.
#[derive(Default)]
pub struct Identity(u64);

impl Hasher for Identity {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8) | u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

type Map<V> = HashMap<u64, V, BuildHasherDefault<Identity>>;

/// The shard of a hash: middle bits, because the map inside uses the others (the low
/// bits place a key, the top 7 are its tag in the probe groups: shard bits there would
/// leave keys of one shard few distinct tags, and probes more false matches).
#[inline]
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

struct Shard<V> {
    map: Map<V>,
    overflow: Option<V>,
}

/// A bounded map of per-key states.
pub struct Table<V> {
    shards: Box<[Mutex<Shard<V>>]>,
    per_shard: usize,
}

impl<V> Table<V> {
    /// A table of at most about `max` keys.
    pub fn new(max: usize) -> Self {
        Table {
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        map: Map::default(),
                        overflow: None,
                    })
                })
                .collect(),
            per_shard: max.div_ceil(SHARDS).max(1),
        }
    }

    /// Runs `f` on the state of `hash`, created with `init` when new. `idle` says which
    /// states a full shard may forget.
    #[inline]
    pub fn with<R>(
        &self,
        hash: u64,
        init: impl FnOnce() -> V,
        idle: impl Fn(&V) -> bool,
        f: impl FnOnce(&mut V) -> R,
    ) -> R {
        let mut shard = self.shards[shard_of(hash)].lock();
        let shard = &mut *shard;
        if let Some(v) = shard.map.get_mut(&hash) {
            return f(v);
        }
        if shard.map.len() >= self.per_shard {
            shard.map.retain(|_, v| !idle(v));
        }
        if shard.map.len() >= self.per_shard {
            let v = shard.overflow.get_or_insert_with(init);
            return f(v);
        }
        f(shard.map.entry(hash).or_insert_with(init))
    }

    /// Runs `f` on the state of `hash` if it exists.
    pub fn get<R>(&self, hash: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let mut shard = self.shards[shard_of(hash)].lock();
        shard.map.get_mut(&hash).map(f)
    }

    /// Number of keys held (overflow slots not counted).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map.len()).sum()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every state `idle` says is idle.
    pub fn sweep(&self, idle: impl Fn(&V) -> bool) {
        for s in self.shards.iter() {
            s.lock().map.retain(|_, v| !idle(v));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_keys_stays_bounded_and_shares_overflow() {
        let t: Table<u32> = Table::new(160);
        for k in 0..100_000u64 {
            let h = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            t.with(h, || 0, |_| false, |v| *v += 1);
        }
        assert!(t.len() <= 160, "{}", t.len());
        // Idle states are forgotten when a shard is full.
        for k in 200_000..300_000u64 {
            let h = k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            t.with(h, || 0, |v| *v == 1, |v| *v = 1);
        }
        assert!(t.len() <= 160);
        t.sweep(|_| true);
        assert!(t.is_empty());
    }
}
