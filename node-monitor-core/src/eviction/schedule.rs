//! When the next decision is due, and how often a dry run reports the same eviction.
use std::{collections::BTreeMap, time::Duration};

use super::EvictionState;
use crate::{config::EvictionConfig, signals::Signal, units::clock::Timestamp};

/// The shortest delay between a decision and the next one a timer schedules: a timer that is due
/// (or overdue) wakes the loop this long after `now`, never at once, so no state in which every
/// timer stays due can make the loop spin.
pub const MIN_TIMER_INTERVAL: Duration = Duration::from_millis(100);

/// How often a dry run reports the same pod for the same signal (Event and log line): once per
/// this interval, however often the decision repeats.
pub const DRY_RUN_REPORT_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// When the earliest soft threshold still waiting for its grace period will have waited it out,
/// for callers that schedule the next decision; `None` when no soft threshold is waiting. A
/// threshold whose grace period has elapsed is acting: the regular wake-ups (housekeeping,
/// headroom, notifications) decide for it, so it never schedules a timer in the past.
pub fn next_grace_deadline(
    state: &EvictionState,
    config: &EvictionConfig,
    now: Timestamp,
) -> Option<Timestamp> {
    state
        .first_observed
        .iter()
        .filter_map(|(key, at)| {
            let t = config.threshold(*key)?;
            (!t.is_hard()).then(|| *at + t.grace_period)
        })
        .filter(|deadline| *deadline > now)
        .min()
}

/// The next timer wake-up: the earliest of `timers`, never sooner than `min_interval` after
/// `now`. `None` when no timer is set.
pub fn next_timer(
    timers: impl IntoIterator<Item = Option<Timestamp>>,
    now: Timestamp,
    min_interval: Duration,
) -> Option<Timestamp> {
    timers
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.max(now + min_interval))
}

/// Limits repeated reports of the same would-be eviction (a dry run decides the same pod on every
/// wake-up): one per pod and signal per interval. Bounded: entries older than the interval are
/// dropped by [`ReportLimiter::allow`].
#[derive(Debug, Clone)]
pub struct ReportLimiter {
    interval: Duration,
    /// By pod UID and what the report is for (a signal's name, or another eviction's kind).
    last: BTreeMap<(String, String), Timestamp>,
}

impl ReportLimiter {
    /// A limiter that allows one report per pod and signal per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: BTreeMap::new(),
        }
    }

    /// Whether to report pod `uid` for `signal` at `now`; a `true` counts as the report.
    pub fn allow(&mut self, uid: &str, signal: Signal, now: Timestamp) -> bool {
        self.allow_named(uid, signal.as_str(), now)
    }

    /// [`ReportLimiter::allow`] for an eviction driven by something other than a signal (the
    /// kubelet's `emptydirfs.limit`, …), named by `what`.
    pub fn allow_named(&mut self, uid: &str, what: &str, now: Timestamp) -> bool {
        let interval = self.interval;
        self.last
            .retain(|_, at| now.saturating_since(*at) < interval);
        let key = (uid.to_owned(), what.to_owned());
        if self.last.contains_key(&key) {
            return false;
        }
        self.last.insert(key, now);
        true
    }

    /// The number of pod and signal pairs reported within the interval (as of the last
    /// [`ReportLimiter::allow`]).
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Nothing reported within the interval (as of the last [`ReportLimiter::allow`]).
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}
