//! One cycle's report: what the pass saw, what the core decided, what the API answered. The
//! cycle runs its stages (observe → decide → act → wait) and returns this; the recorders
//! ([`super::recorders`]) each take it after the eviction requests, so none of them reads the
//! loop's decision state, and a new one needs a recorder, not a field of the loop.
use std::{collections::HashMap, sync::Arc};

use node_monitor_core::{
    eviction::Decision,
    kubelet::pod::PodInfo,
    signals::{Observations, PodUsage},
    units::clock::Timestamp,
};

use crate::cluster::actuator::{EvictOutcome, EvictionRequest};

/// How a cycle ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CycleEnd {
    /// Nothing left to do for this wake-up.
    Done,
    /// An eviction did not take effect and its pod backs off (a PDB or another refusal, a
    /// failure, a stale "gone"): the next candidate should be considered now.
    Refused,
}

/// The per-pod figures a pass holds, and when they were read (the loop's clock).
pub(super) type PodFigures = (Timestamp, Arc<HashMap<String, PodUsage>>);

/// What one cycle saw, decided and did.
#[derive(Debug)]
pub(super) struct CycleReport {
    /// The instant of the decision, on the loop's clock.
    pub(super) now: Timestamp,
    /// The pods the core could rank (active, not backing off).
    pub(super) pods: Vec<PodInfo>,
    /// The observations decided on, with the pod figures read by the pass when it read them.
    pub(super) observations: Observations,
    pub(super) decision: Decision,
    /// The eviction requests sent, with the API's answers, in order.
    pub(super) answered: Vec<(EvictionRequest, EvictOutcome)>,
    /// The latest pod figures the loop holds (read by this pass or an earlier one).
    pub(super) pod_figures: Option<PodFigures>,
    pub(super) end: CycleEnd,
}

impl CycleReport {
    /// The age of the pod figures at the decision, in milliseconds, and the figures.
    pub(super) fn figures_by_age(&self) -> Option<(u64, &HashMap<String, PodUsage>)> {
        self.pod_figures.as_ref().map(|(t, f)| {
            let age = self.now.saturating_since(*t).as_millis();
            (u64::try_from(age).unwrap_or(u64::MAX), f.as_ref())
        })
    }
}
