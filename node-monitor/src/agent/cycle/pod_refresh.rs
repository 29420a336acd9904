//! The ranking's pod figures, refreshed beside the decisions rather than in them.
//!
//! Reading every pod costs one `memory.stat` and `pids.current` per pod (tens of milliseconds at
//! a few hundred pods under emulation). While a threshold is near, the figures a crossing ranks
//! from are kept recent (`node_monitor_core::eviction::pod_figures`); a pass that wants them
//! refreshed (near a threshold and due, or after a ranking from an earlier pass's figures) only
//! says so, and the loop reads the pods between wake-ups. That read gives way, between two
//! pods, to any wake-up that arrives: a crossing reported by a notification (the memory push,
//! memcg, PSI, the kernel probes) never waits behind it. The agent's own next look is not a
//! reason to give up: a read longer than the look's interval (hundreds of pods on a slow CPU)
//! would then never complete, and that look is late by one read at most, as before.
//! A refresh given up leaves the figures as they were; the next pass asks again, and a crossing
//! whose figures have grown older than a ranking accepts reads the pods itself.
use std::sync::Arc;

use tracing::debug;

use node_monitor_core::signals::Observations;

use super::{
    super::ports::{ClusterWrites, PodSource, PodView, WakeupStream},
    Loop,
};

/// Whether the last pass wants the pod figures refreshed.
#[derive(Debug, Default)]
pub(in crate::agent) struct PodRefresh {
    wanted: bool,
}

impl PodRefresh {
    /// Asks for a refresh before the next wait.
    pub(in crate::agent) fn want(&mut self) {
        self.wanted = true;
    }
}

impl<C: ClusterWrites, P: PodSource> Loop<C, P> {
    /// The refresh a pass asked for, if any: given up as soon as a wake-up is pending.
    pub(in crate::agent) fn refresh_pods_beside<N: PodView, W: WakeupStream>(
        &mut self,
        sampler: &mut N,
        wakeups: &W,
    ) {
        if !std::mem::take(&mut self.pod_refresh.wanted) {
            return;
        }
        let mut out = Observations::default();
        let mut give_up = || wakeups.pending();
        if sampler.read_pods_unless(&mut out, &mut give_up) {
            self.pod_figures = Some((self.now(), Arc::new(out.pods)));
        } else {
            self.metrics.eviction.pod_refreshes_given_up.inc();
            debug!("the pods' figures refresh gave way to a wake-up");
        }
    }
}
