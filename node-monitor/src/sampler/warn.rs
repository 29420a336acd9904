//! Rate-limited warnings: a failing read is logged the first time, then at most once per
//! interval with the number of repeats in between, and once more when it recovers. The sampler
//! runs on every wake-up; without this a missing file would flood the log under pressure, exactly
//! when the log matters.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// How often a persisting failure is logged again.
pub const REPEAT_INTERVAL: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Entry {
    last_logged: Instant,
    suppressed: u64,
}

/// Remembers which failures were logged. Keys name what failed (a signal, a file).
#[derive(Debug, Default)]
pub struct WarnLimiter {
    failing: HashMap<String, Entry>,
}

impl WarnLimiter {
    /// Logs `err` for `key` unless it was logged less than [`REPEAT_INTERVAL`] ago.
    pub fn warn(&mut self, key: &str, now: Instant, err: &dyn std::error::Error) {
        match self.failing.get_mut(key) {
            None => {
                tracing::warn!(what = key, error = %ErrorChain(err), "sampler: value unavailable, leaving it out");
                self.failing.insert(
                    key.to_owned(),
                    Entry {
                        last_logged: now,
                        suppressed: 0,
                    },
                );
            }
            Some(e) if now.saturating_duration_since(e.last_logged) >= REPEAT_INTERVAL => {
                tracing::warn!(
                    what = key,
                    error = %ErrorChain(err),
                    repeats = e.suppressed,
                    "sampler: value still unavailable, leaving it out"
                );
                e.last_logged = now;
                e.suppressed = 0;
            }
            Some(e) => e.suppressed += 1,
        }
    }

    /// Marks `key` as working again; logs the recovery if it was failing. Cheap when nothing is
    /// failing (no allocation, no hashing).
    pub fn ok(&mut self, key: &str) {
        if self.failing.is_empty() {
            return;
        }
        if let Some(e) = self.failing.remove(key) {
            tracing::info!(
                what = key,
                repeats = e.suppressed,
                "sampler: value available again"
            );
        }
    }

    /// Whether `key` is currently failing.
    #[cfg(test)]
    pub fn is_failing(&self, key: &str) -> bool {
        self.failing.contains_key(key)
    }
}

/// Formats an error with its `source()` chain: `outer: inner: root`.
pub struct ErrorChain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(e) = cur {
            write!(f, ": {e}")?;
            cur = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn repeats_are_suppressed_until_the_interval() {
        let mut w = WarnLimiter::default();
        let t0 = Instant::now();
        let err = Outer(std::io::Error::other("inner"));
        w.warn("memory.available", t0, &err);
        w.warn("memory.available", t0 + Duration::from_secs(1), &err);
        w.warn("memory.available", t0 + Duration::from_secs(2), &err);
        assert!(w.is_failing("memory.available"));
        assert_eq!(w.failing["memory.available"].suppressed, 2);
        w.warn("memory.available", t0 + REPEAT_INTERVAL, &err);
        assert_eq!(w.failing["memory.available"].suppressed, 0);
        assert_eq!(
            w.failing["memory.available"].last_logged,
            t0 + REPEAT_INTERVAL
        );
        w.ok("memory.available");
        assert!(!w.is_failing("memory.available"));
        assert_eq!(ErrorChain(&err).to_string(), "outer: inner");
    }
}
