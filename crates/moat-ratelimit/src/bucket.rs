//! The arithmetic of one key's limit: GCRA (a token bucket kept as one timestamp) and
//! the two-window sliding estimate. Times are nanoseconds on a monotonic clock the
//! caller reads once per request.

use crate::config::Algorithm;

/// A limit compiled from a rule: `rate` per `window`, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// Token bucket or sliding window.
    pub algorithm: Algorithm,
    /// Requests per window.
    pub rate: u32,
    /// The window (`per`), nanoseconds.
    pub window_ns: u64,
    /// Token bucket capacity.
    pub burst: u32,
    /// Time one token takes to come back (`window / rate`), nanoseconds, at least 1.
    pub interval_ns: u64,
}

impl Limit {
    /// A limit of `rate` per `window_ns`, with a bucket of `burst`.
    pub fn new(algorithm: Algorithm, rate: u32, window_ns: u64, burst: u32) -> Self {
        Limit {
            algorithm,
            rate,
            window_ns,
            burst: burst.max(1),
            interval_ns: (window_ns / u64::from(rate.max(1))).max(1),
        }
    }

    /// The window in whole seconds (at least 1), as the `RateLimit-Policy` header writes it.
    pub fn window_secs(&self) -> u64 {
        self.window_ns.div_ceil(1_000_000_000).max(1)
    }

    /// The quota the `RateLimit-Policy` header announces.
    pub fn quota(&self) -> u32 {
        match self.algorithm {
            Algorithm::TokenBucket => self.burst,
            Algorithm::SlidingWindow => self.rate,
        }
    }
}

/// One key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// GCRA: the theoretical arrival time of the next request.
    Gcra(u64),
    /// Sliding window: the start of the current fixed window, and the counts of the
    /// previous and current windows.
    Window {
        /// Start of the current window.
        start: u64,
        /// Requests counted in the previous window.
        prev: u32,
        /// Requests counted in the current window.
        cur: u32,
    },
}

/// What one decision found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// The request is within the limit (and was counted).
    pub allowed: bool,
    /// Requests left right now.
    pub remaining: u32,
    /// Nanoseconds until the quota is whole again (the `RateLimit` header's `t`).
    pub reset_ns: u64,
    /// Refused: nanoseconds until a request would be allowed.
    pub retry_after_ns: u64,
}

impl State {
    /// A new key's state.
    pub fn new(limit: &Limit, now: u64) -> Self {
        match limit.algorithm {
            Algorithm::TokenBucket => State::Gcra(now),
            Algorithm::SlidingWindow => State::Window {
                start: now - now % limit.window_ns.max(1),
                prev: 0,
                cur: 0,
            },
        }
    }

    /// True when the key holds no information any more (a whole bucket, or two
    /// windows without requests): it can be forgotten without changing any decision.
    pub fn idle(&self, limit: &Limit, now: u64) -> bool {
        match *self {
            State::Gcra(tat) => tat <= now,
            State::Window { start, .. } => now >= start.saturating_add(2 * limit.window_ns),
        }
    }

    /// Counts `n` requests at `now` if they fit.
    #[inline]
    pub fn take(&mut self, limit: &Limit, now: u64, n: u32) -> Outcome {
        match self {
            State::Gcra(tat) => gcra(tat, limit, now, n),
            State::Window { start, prev, cur } => window(start, prev, cur, limit, now, n),
        }
    }
}

fn gcra(tat: &mut u64, limit: &Limit, now: u64, n: u32) -> Outcome {
    let t = limit.interval_ns;
    let capacity = t.saturating_mul(u64::from(limit.burst));
    let base = (*tat).max(now);
    let new_tat = base.saturating_add(t.saturating_mul(u64::from(n)));
    let debt = new_tat - now;
    if debt > capacity {
        let used = base - now;
        return Outcome {
            allowed: false,
            remaining: ((capacity.saturating_sub(used)) / t) as u32,
            reset_ns: used,
            retry_after_ns: debt - capacity,
        };
    }
    *tat = new_tat;
    Outcome {
        allowed: true,
        remaining: ((capacity - debt) / t) as u32,
        reset_ns: debt,
        retry_after_ns: 0,
    }
}

fn window(
    start: &mut u64,
    prev: &mut u32,
    cur: &mut u32,
    limit: &Limit,
    now: u64,
    n: u32,
) -> Outcome {
    let w = limit.window_ns.max(1);
    let aligned = now - now % w;
    if aligned != *start {
        *prev = if aligned - *start == w { *cur } else { 0 };
        *cur = 0;
        *start = aligned;
    }
    let elapsed = now - aligned;
    let left = w - elapsed;
    let weight = left as f64 / w as f64;
    let estimate = f64::from(*prev) * weight + f64::from(*cur);
    let rate = f64::from(limit.rate);
    if estimate + f64::from(n) > rate {
        // When the estimate (prev * left/w + cur) falls to `rate - n`.
        let room = rate - f64::from(n);
        let retry = if f64::from(*cur) > room {
            // Not before the next window, where this window's count becomes `prev`.
            let into_next = if *cur == 0 {
                0.0
            } else {
                (1.0 - room.max(0.0) / f64::from(*cur)).max(0.0) * w as f64
            };
            left as f64 + into_next
        } else {
            let need = (room - f64::from(*cur)) / f64::from((*prev).max(1));
            ((1.0 - need) * w as f64 - elapsed as f64).max(1.0)
        };
        return Outcome {
            allowed: false,
            remaining: 0,
            reset_ns: left,
            retry_after_ns: retry.ceil() as u64,
        };
    }
    *cur = cur.saturating_add(n);
    Outcome {
        allowed: true,
        remaining: (rate - estimate - f64::from(n)).max(0.0) as u32,
        reset_ns: left,
        retry_after_ns: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn token_bucket_allows_burst_then_rate() {
        let l = Limit::new(Algorithm::TokenBucket, 10, S, 5);
        let mut s = State::new(&l, 0);
        let now = 10 * S;
        for i in 0..5 {
            let o = s.take(&l, now, 1);
            assert!(o.allowed, "request {i}");
            assert_eq!(o.remaining, 4 - i);
        }
        let o = s.take(&l, now, 1);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_ns, S / 10);
        // One interval later, one more.
        assert!(s.take(&l, now + S / 10, 1).allowed);
        assert!(!s.take(&l, now + S / 10, 1).allowed);
        // Idle once the bucket has refilled.
        assert!(!s.idle(&l, now + S / 10));
        assert!(s.idle(&l, now + 2 * S));
    }

    #[test]
    fn token_bucket_holds_rate_over_time() {
        let l = Limit::new(Algorithm::TokenBucket, 100, S, 1);
        let mut s = State::new(&l, 0);
        // 1000 attempts per second for 10 s: 100/s pass, plus the first.
        let allowed = (0..10_000u64)
            .filter(|i| s.take(&l, i * S / 1000, 1).allowed)
            .count();
        assert!((1000..=1001).contains(&allowed), "{allowed}");
    }

    #[test]
    fn sliding_window_counts_the_previous_window() {
        let l = Limit::new(Algorithm::SlidingWindow, 10, S, 10);
        let mut s = State::new(&l, 0);
        for _ in 0..10 {
            assert!(s.take(&l, 100 * S + S / 2, 1).allowed);
        }
        let o = s.take(&l, 100 * S + S / 2, 1);
        assert!(!o.allowed);
        assert!(o.retry_after_ns > S / 2, "{o:?}");
        // A quarter into the next window the previous one still weighs 7.5.
        let now = 101 * S + S / 4;
        let passed = (0..10).filter(|_| s.take(&l, now, 1).allowed).count();
        assert_eq!(passed, 2);
        // The estimate never lets more than `rate` through in any one window.
        let l = Limit::new(Algorithm::SlidingWindow, 50, S, 50);
        let mut s = State::new(&l, 0);
        let allowed = (0..10_000u64)
            .filter(|i| s.take(&l, i * S / 1000, 1).allowed)
            .count();
        assert!((480..=510).contains(&allowed), "{allowed}");
    }

    #[test]
    fn hostile_values_saturate() {
        let l = Limit::new(Algorithm::TokenBucket, u32::MAX, 1, u32::MAX);
        let mut s = State::new(&l, u64::MAX - 1);
        let o = s.take(&l, u64::MAX - 1, u32::MAX);
        assert!(o.allowed || o.retry_after_ns > 0);
        let l = Limit::new(Algorithm::SlidingWindow, 1, u64::MAX, 1);
        let mut s = State::new(&l, 5);
        assert!(s.take(&l, 5, 1).allowed);
        assert!(!s.take(&l, 6, 1).allowed);
    }
}
