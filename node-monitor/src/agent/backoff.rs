//! Per-pod retry backoff for evictions a PodDisruptionBudget refused (HTTP 429). While a pod backs
//! off, the planner considers the next candidate, as the eviction API's retry guidance suggests.
//! Pure: time is passed in.
use std::{collections::HashMap, time::Duration};

use crate::core::clock::Timestamp;

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    until: Timestamp,
    delay: Duration,
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    /// Records a refusal for `uid` at `now`; the delay doubles per refusal up to `max`.
    pub fn refused(&mut self, uid: &str, now: Timestamp) -> Duration {
        let delay = match self.entries.get(uid) {
            Some(e) => (e.delay * 2).min(self.max),
            None => self.initial,
        };
        self.entries.insert(
            uid.to_owned(),
            Entry {
                until: now + delay,
                delay,
            },
        );
        delay
    }

    /// Is `uid` still backing off at `now`?
    pub fn active(&self, uid: &str, now: Timestamp) -> bool {
        self.entries.get(uid).is_some_and(|e| now < e.until)
    }

    /// Forgets pods that are gone or were evicted, and entries long expired.
    pub fn forget(&mut self, uid: &str) {
        self.entries.remove(uid);
    }

    /// Drops entries whose backoff ended more than `max` ago, so the map stays bounded.
    pub fn prune(&mut self, now: Timestamp) {
        let max = self.max;
        self.entries
            .retain(|_, e| now.saturating_since(e.until) < max);
    }

    /// When the earliest active backoff ends, so the loop can decide again then.
    pub fn next_expiry(&self, now: Timestamp) -> Option<Timestamp> {
        self.entries
            .values()
            .map(|e| e.until)
            .filter(|u| *u > now)
            .min()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> Timestamp {
        Timestamp::from_duration(Duration::from_secs(secs))
    }

    #[test]
    fn doubles_up_to_max_and_expires() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        let steps = [(0, 1), (1, 2), (3, 4), (7, 4)];
        for (now, want) in steps {
            assert_eq!(
                b.refused("a", at(now)),
                Duration::from_secs(want),
                "refusal at {now}s"
            );
        }
        assert_eq!(b.next_expiry(at(7)), Some(at(11)));
        assert_eq!(
            b.next_expiry(at(11)),
            None,
            "expired entries do not schedule a wake-up"
        );
        assert!(b.active("a", at(10)));
        assert!(!b.active("a", at(11)));
        assert!(!b.active("other", at(0)));
    }

    #[test]
    fn forget_and_prune_bound_the_map() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        b.refused("a", at(0));
        b.refused("b", at(0));
        b.forget("a");
        assert_eq!(b.len(), 1);
        b.prune(at(3));
        assert_eq!(b.len(), 1, "b's backoff ended 2 s ago, within max");
        b.prune(at(10));
        assert!(b.is_empty());
    }
}
