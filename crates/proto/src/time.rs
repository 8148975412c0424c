//! Time as the state machines see it: a monotonic instant handed in by the caller.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on the caller's monotonic clock, in nanoseconds since an epoch the caller chose.
///
/// The state machines never read a clock: the runtime converts `std::time::Instant`s (see
/// [`Time::since`]) and the simulator hands in virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(u64);

impl Time {
    /// The epoch.
    pub const ZERO: Time = Time(0);

    /// The instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Time {
        Time(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The instant `instant` on a clock whose epoch is `epoch`.
    pub fn since(epoch: std::time::Instant, instant: std::time::Instant) -> Time {
        let nanos = instant.saturating_duration_since(epoch).as_nanos();
        Time(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    /// The instant `duration` before `self`, the epoch if that is earlier.
    pub fn saturating_sub(self, duration: Duration) -> Time {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_sub(nanos))
    }

    /// Time elapsed from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Time) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, duration: Duration) -> Time {
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        Time(self.0.saturating_add(nanos))
    }
}

impl Sub<Time> for Time {
    type Output = Duration;
    fn sub(self, earlier: Time) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}ms", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}
