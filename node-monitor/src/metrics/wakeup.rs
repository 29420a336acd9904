//! The wake-up sources' metrics (`agent::sources`, the cycle's wake-ups): a group of the agent's
//! registry that registers itself.
use prometheus_client::metrics::{
    counter::Counter,
    family::Family,
    gauge::Gauge,
    histogram::{Histogram, exponential_buckets},
};

use super::{Reg, SourceLabels, SourceStateLabels, set_one_hot};

/// The wake-up group's families: `node_monitor_wakeups`, `node_monitor_wakeup_*`.
#[derive(Debug)]
pub struct WakeupMetrics {
    /// `node_monitor_wakeups`.
    pub by_source: Family<SourceLabels, Counter>,
    /// `node_monitor_wakeup_to_decision_seconds`.
    pub to_decision_seconds: Histogram,
    /// `node_monitor_wakeup_source_state`.
    pub source_state: Family<SourceStateLabels, Gauge>,
}

impl Default for WakeupMetrics {
    fn default() -> Self {
        Self {
            by_source: Family::default(),
            // 50 µs … ~26 s.
            to_decision_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 20)),
            source_state: Family::default(),
        }
    }
}

impl WakeupMetrics {
    /// Adds every family of the group to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        reg.add(
            "wakeups",
            "Sampler wake-ups by source",
            self.by_source.clone(),
        );
        reg.add(
            "wakeup_to_decision_seconds",
            "Time from a wake-up to the decision it led to",
            self.to_decision_seconds.clone(),
        );
        reg.add(
            "wakeup_source_state",
            "1 for the current state of each wake-up source",
            self.source_state.clone(),
        );
    }

    /// One wake-up received from `source`.
    pub fn count(&self, source: &str) {
        self.by_source
            .get_or_create(&SourceLabels {
                source: source.to_owned(),
            })
            .inc();
    }

    /// Sets a wake-up source's state (`active`, `unavailable`, `not_applicable` or `disabled`):
    /// the given state is 1, the other known states are 0.
    pub fn set_source_state(&self, source: &str, state: &str) {
        set_one_hot(
            &self.source_state,
            &["active", "unavailable", "not_applicable", "disabled"],
            state,
            |s| SourceStateLabels {
                source: source.to_owned(),
                state: s.to_owned(),
            },
        );
    }
}
