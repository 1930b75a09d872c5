//! Limits shared by a fleet through a store, without a store round trip per request.
//!
//! Each instance holds, per key, a lease of tokens reserved from the store's bucket in
//! batches of `batch` (the traffic of `ratelimit.lease` at the limit's rate). A request
//! spends a token of the lease; when the lease runs low the instance asks the store for
//! another batch in the background. A key the instance has not seen yet, or whose
//! lease ran out before the next batch arrived, may go into debt of up to `batch`
//! tokens, repaid from the next batch: that is the fleet's only overshoot, at most
//! `instances x batch` requests per key over the configured limit, whatever the
//! duration. When the store answers that its bucket is empty, the key is refused until
//! the store's own retry time.
//!
//! The store is behind [`LeaseStore`]: this module only does the accounting.

use std::sync::Arc;

use crate::bucket::Limit;
use crate::table::Table;

/// One key's lease.
#[derive(Debug)]
pub struct Lease {
    /// The store's key for this rule and key (made once, when the key is first seen).
    key: Arc<str>,
    /// Tokens in hand; negative = debt to the store.
    tokens: i64,
    /// A reservation is on its way.
    inflight: bool,
    /// The store said its bucket was empty: refuse until then.
    exhausted_until: u64,
    /// Last request, for forgetting idle keys and expiring unspent tokens.
    last_used: u64,
}

/// A reservation for the store to carry out.
#[derive(Debug)]
pub struct LeaseRequest {
    /// The rule's lease table, to report the grant to ([`Leases::granted`]).
    pub leases: Arc<Leases>,
    /// The key's hash in the table.
    pub hash: u64,
    /// The store's key.
    pub key: Arc<str>,
    /// Tokens wanted (the debt to repay plus a batch).
    pub want: u32,
}

/// Where leases come from: a shared store, reached off the request path.
pub trait LeaseStore: Send + Sync {
    /// Queues a reservation; must not block. The store reports the outcome with
    /// [`Leases::granted`] or [`Leases::failed`]. A full queue drops the request and
    /// reports it as failed.
    fn reserve(&self, req: LeaseRequest);
    /// False while the store is unreachable (the rules then follow `on_store_error`).
    fn healthy(&self) -> bool;
    /// Shares a ban this instance imposed (or the admin API added) with the fleet;
    /// must not block.
    fn ban(&self, ban: &crate::Ban);
    /// Lifts a ban fleet-wide; must not block.
    fn unban(&self, ip: std::net::IpAddr);
}

/// A rule's leases.
pub struct Leases {
    /// The rule's limit (the store's bucket has the same parameters).
    pub limit: Limit,
    /// Tokens reserved at a time.
    pub batch: u32,
    table: Table<Lease>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("limit", &self.limit)
            .field("batch", &self.batch)
            .finish()
    }
}

/// What the lease allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// Allowed, with about this many tokens left in hand.
    Allowed(u32),
    /// Refused for this many nanoseconds.
    Refused(u64),
}

impl Leases {
    /// Leases for `limit`, reserving `batch` tokens at a time, for at most `max_keys` keys.
    pub fn new(limit: Limit, batch: u32, max_keys: usize) -> Self {
        Leases {
            limit,
            batch: batch.clamp(1, limit.burst.max(1)),
            table: Table::new(max_keys),
        }
    }

    /// Spends a token of the key `hash` (`key` makes the store's key of a new one) and
    /// asks `store` for more when the lease runs low.
    pub fn take(
        self: &Arc<Self>,
        hash: u64,
        key: impl FnOnce() -> Arc<str>,
        now: u64,
        store: &dyn LeaseStore,
    ) -> LeaseOutcome {
        let batch = i64::from(self.batch);
        let window = self.limit.window_ns;
        let (outcome, refill) = self.table.with(
            hash,
            || Lease {
                key: key(),
                tokens: 0,
                inflight: false,
                exhausted_until: 0,
                last_used: now,
            },
            |l| l.tokens <= 0 && !l.inflight && l.last_used.saturating_add(window) < now,
            |l| {
                // Tokens reserved a window ago belong to traffic that never came.
                if l.tokens > 0 && now.saturating_sub(l.last_used) > window {
                    l.tokens = 0;
                }
                l.last_used = now;
                let outcome = if l.tokens >= 1 {
                    l.tokens -= 1;
                    LeaseOutcome::Allowed(l.tokens as u32)
                } else if now < l.exhausted_until {
                    return (LeaseOutcome::Refused(l.exhausted_until - now), None);
                } else if l.tokens > -batch {
                    l.tokens -= 1;
                    LeaseOutcome::Allowed(0)
                } else {
                    // In full debt and waiting for the store's answer.
                    LeaseOutcome::Refused(self.limit.interval_ns)
                };
                let refill = (!l.inflight && l.tokens * 2 < batch).then(|| {
                    l.inflight = true;
                    (l.key.clone(), (batch - l.tokens) as u32)
                });
                (outcome, refill)
            },
        );
        if let Some((key, want)) = refill {
            store.reserve(LeaseRequest {
                leases: self.clone(),
                hash,
                key,
                want,
            });
        }
        outcome
    }

    /// The store granted `got` of the `want` tokens; when short, its bucket is empty
    /// for `retry_ns`.
    pub fn granted(&self, hash: u64, want: u32, got: u32, retry_ns: u64, now: u64) {
        self.table.get(hash, |l| {
            l.inflight = false;
            l.tokens += i64::from(got);
            if got < want {
                l.exhausted_until = now.saturating_add(retry_ns.max(1));
            }
        });
    }

    /// The reservation failed (the store is unreachable or the queue was full).
    pub fn failed(&self, hash: u64) {
        self.table.get(hash, |l| l.inflight = false);
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True when no key is held.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Algorithm;
    use crate::State;
    use parking_lot::Mutex;

    const S: u64 = 1_000_000_000;

    /// A store in this process, answering each reservation when the test says so, with
    /// a real bucket: the accounting is what is under test here (the Redis store has its
    /// own tests against a real redis-server).
    struct Bucket {
        state: Mutex<State>,
        queue: Mutex<Vec<LeaseRequest>>,
    }

    impl LeaseStore for Bucket {
        fn reserve(&self, req: LeaseRequest) {
            self.queue.lock().push(req);
        }
        fn healthy(&self) -> bool {
            true
        }
        fn ban(&self, _: &crate::Ban) {}
        fn unban(&self, _: std::net::IpAddr) {}
    }

    impl Bucket {
        fn answer(&self, now: u64) {
            let reqs: Vec<_> = self.queue.lock().drain(..).collect();
            for r in reqs {
                let mut st = self.state.lock();
                let mut got = 0;
                let mut retry = 0;
                for _ in 0..r.want {
                    let o = st.take(&r.leases.limit, now, 1);
                    if !o.allowed {
                        retry = o.retry_after_ns;
                        break;
                    }
                    got += 1;
                }
                r.leases.granted(r.hash, r.want, got, retry, now);
            }
        }
    }

    #[test]
    fn two_instances_hold_the_combined_limit() {
        let limit = Limit::new(Algorithm::TokenBucket, 100, S, 10);
        let store = Bucket {
            state: Mutex::new(State::new(&limit, 0)),
            queue: Mutex::new(Vec::new()),
        };
        let a = Arc::new(Leases::new(limit, 10, 100));
        let b = Arc::new(Leases::new(limit, 10, 100));
        let key: Arc<str> = "k".into();
        let mut allowed = 0;
        // 10 s of 1000 req/s split over two instances; the store answers every 5 ms.
        for ms in 0..10_000u64 {
            let now = ms * S / 1000;
            for leases in [&a, &b] {
                if let LeaseOutcome::Allowed(_) = leases.take(1, || key.clone(), now, &store) {
                    allowed += 1;
                }
            }
            if ms % 5 == 0 {
                store.answer(now);
            }
        }
        // The limit is 100/s + a burst of 10; the overshoot at most 2 x batch.
        let limit = 1000 + 10;
        assert!(allowed <= limit + 20, "{allowed}");
        assert!(allowed >= limit * 95 / 100, "{allowed}");
    }
}
