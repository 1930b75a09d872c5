//! A coarse monotonic clock, for the request path's deadlines and time windows.
//!
//! Reading `std::time::Instant` is a vDSO call that reads the TSC: about 60 ns on
//! the development VM (22 ns of it the `rdtsc` itself, which a hypervisor makes
//! slow), and moat's own code read it 18 times per proxied POST with every engine
//! on (about 1.1 us of the request's 20-30 us of CPU; 10 times since this clock).
//! `CLOCK_MONOTONIC_COARSE` returns the time of the last scheduler tick without
//! reading the TSC (9 ns there), and is off by at most one tick (1-4 ms, see
//! [`resolution`]). That is precise enough for what is measured in seconds or
//! tens of milliseconds (a scan's 50 ms budget, a sampling window, how long a
//! pooled connection has been idle) and not for a latency histogram: durations
//! reported as metrics keep reading `Instant`.
//!
//! Off Linux the clock is `Instant` measured from the first reading.

use std::ops::Add;
use std::time::Duration;

/// A point on the coarse monotonic clock (comparable with other points only).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CoarseInstant(Duration);

impl CoarseInstant {
    /// The time of the last clock tick.
    #[inline]
    pub fn now() -> CoarseInstant {
        CoarseInstant(imp::monotonic())
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    #[inline]
    pub fn duration_since(self, earlier: CoarseInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Time since `self`, on this clock.
    #[inline]
    pub fn elapsed(self) -> Duration {
        CoarseInstant::now().duration_since(self)
    }
}

impl Add<Duration> for CoarseInstant {
    type Output = CoarseInstant;

    /// Saturates instead of overflowing (a deadline that far away never comes).
    fn add(self, d: Duration) -> CoarseInstant {
        CoarseInstant(self.0.saturating_add(d))
    }
}

/// Seconds since the Unix epoch at the last clock tick (`CLOCK_REALTIME_COARSE`).
#[inline]
pub fn unix_secs() -> u64 {
    imp::unix_secs()
}

/// Milliseconds since the Unix epoch, read precisely (`SystemTime`): the
/// timestamp of a record, a ban's expiry, a reload. Zero before 1970.
pub fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How far a reading may lag the precise clock: one scheduler tick.
pub fn resolution() -> Duration {
    imp::resolution()
}

#[cfg(target_os = "linux")]
mod imp {
    use rustix::time::{clock_getres, clock_gettime, ClockId, Timespec};
    use std::time::Duration;

    fn duration(t: Timespec) -> Duration {
        let secs = u64::try_from(t.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(t.tv_nsec).unwrap_or(0);
        Duration::new(secs, nanos)
    }

    #[inline]
    pub(super) fn monotonic() -> Duration {
        duration(clock_gettime(ClockId::MonotonicCoarse))
    }

    #[inline]
    pub(super) fn unix_secs() -> u64 {
        u64::try_from(clock_gettime(ClockId::RealtimeCoarse).tv_sec).unwrap_or(0)
    }

    pub(super) fn resolution() -> Duration {
        duration(clock_getres(ClockId::MonotonicCoarse))
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    use std::sync::OnceLock;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    pub(super) fn monotonic() -> Duration {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed()
    }

    pub(super) fn unix_secs() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    pub(super) fn resolution() -> Duration {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    /// The coarse clock advances with the precise one, lagging it by at most a
    /// tick, and never goes backwards. Each coarse reading is bracketed by two
    /// precise ones, so a preemption between the calls widens the bounds instead of
    /// failing the test on a loaded machine.
    #[test]
    fn follows_the_precise_clock_within_a_tick() {
        let tick = resolution();
        assert!(tick <= Duration::from_millis(10), "resolution {tick:?}");
        let bracket = || {
            let before = Instant::now();
            let c = CoarseInstant::now();
            (before, c, Instant::now())
        };
        let (a0, c0, b0) = bracket();
        let mut last = c0;
        while a0.elapsed() < Duration::from_millis(60) {
            let c = CoarseInstant::now();
            assert!(c >= last, "went backwards: {c:?} after {last:?}");
            last = c;
        }
        let (a1, c1, b1) = bracket();
        // c0 lies in [a0 - tick, b0] and c1 in [a1 - tick, b1] on the precise clock.
        let coarse = c1.duration_since(c0);
        let slack = tick + Duration::from_millis(1);
        let least = a1.duration_since(b0).saturating_sub(slack);
        let most = b1.duration_since(a0) + slack;
        assert!(
            least <= coarse && coarse <= most,
            "coarse {coarse:?} outside [{least:?}, {most:?}] (tick {tick:?})"
        );
        assert!(c0.elapsed() >= coarse);
    }

    #[test]
    fn arithmetic_saturates() {
        let t = CoarseInstant::now();
        assert_eq!(t.duration_since(t + Duration::from_secs(1)), Duration::ZERO);
        assert_eq!(
            (t + Duration::from_secs(2)).duration_since(t),
            Duration::from_secs(2)
        );
        assert!(t + Duration::MAX > t);
    }

    #[test]
    fn unix_seconds_are_the_wall_clock() {
        let precise = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        assert!(unix_secs().abs_diff(precise) <= 1);
        assert!(unix_millis() / 1000 >= precise);
    }
}
