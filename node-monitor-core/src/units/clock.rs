//! Time as the pure core sees it: a value passed in, never read from a clock.

use std::{ops::Add, time::Duration};

use serde::Serialize;

/// A point on a monotonic clock, as the time elapsed since an origin the caller chooses (the
/// agent: its start; tests: zero, stepped by hand).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Timestamp(Duration);

impl Timestamp {
    /// The origin itself.
    pub const ZERO: Timestamp = Timestamp(Duration::ZERO);

    /// The point `since_origin` after the origin.
    pub const fn from_duration(since_origin: Duration) -> Self {
        Self(since_origin)
    }

    /// The point `secs` seconds after the origin.
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// The point `millis` milliseconds after the origin.
    pub const fn from_millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }

    /// The time elapsed since the origin.
    pub const fn since_origin(self) -> Duration {
        self.0
    }

    /// Time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

impl Add<Duration> for Timestamp {
    type Output = Timestamp;
    fn add(self, rhs: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(rhs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp::from_secs(10);
        assert_eq!(
            (t + Duration::from_secs(5)).saturating_since(t),
            Duration::from_secs(5)
        );
        assert_eq!(t.saturating_since(Timestamp::from_secs(20)), Duration::ZERO);
        assert_eq!(
            Timestamp::from_millis(1500).since_origin(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            Timestamp::from_duration(Duration::MAX) + Duration::from_secs(1),
            Timestamp::from_duration(Duration::MAX)
        );
    }
}
