//! The disk evicted pods still hold: pods evicted for a disk signal keep their writable layers
//! and logs until the kubelet collects their dead containers, so their measured usage is
//! credited back to the disk signals meanwhile (see [`node_monitor_core::eviction::reclaim`]).
use node_monitor_core::{
    eviction::Decision, eviction::reclaim::PendingReclaim, signals::Observations,
    units::clock::Timestamp,
};
use tracing::info;

use crate::{
    cluster::actuator::{EvictOutcome, EvictionRequest},
    metrics::Metrics,
};

/// The observations with the disk evicted pods still hold added back (see
/// [`node_monitor_core::eviction::reclaim`]), and its gauge updated.
pub(super) fn credit(
    pending: &mut PendingReclaim,
    metrics: &Metrics,
    observations: &Observations,
    now: Timestamp,
) -> Observations {
    let credited = pending.credited(observations, now);
    metrics
        .eviction
        .disk_reclaim_pending_bytes
        .set(pending.pending_bytes());
    credited
}

/// Pods evicted for a disk signal keep their writable layers and logs on disk until the
/// kubelet collects their dead containers: their measured usage is credited meanwhile, so
/// no bystander is evicted for space about to be freed.
pub(super) fn note_evictions(
    pending: &mut PendingReclaim,
    decision: &Decision,
    answered: &[(EvictionRequest, EvictOutcome)],
    observations: &Observations,
    now: Timestamp,
) {
    for (req, outcome) in answered {
        let disk_signal = decision
            .evict
            .iter()
            .find(|e| e.uid == req.uid)
            .is_some_and(|e| node_monitor_core::signals::threshold::ranks_by_disk(e.signal));
        if !(disk_signal && outcome.took_effect()) {
            continue;
        }
        let bytes = observations
            .pods
            .get(&req.uid)
            .and_then(|u| u.disk)
            .unwrap_or(0);
        if bytes > 0 {
            info!(pod = %format!("{}/{}", req.namespace, req.name), bytes,
                  window_s = node_monitor_core::eviction::reclaim::RECLAIM_WINDOW.as_secs(),
                  "evicted pod's disk credited until the kubelet's garbage collection frees it");
        }
        pending.record(&req.uid, bytes, observations, now);
    }
}
