//! The after-cycle recorders. Each takes the cycle's report ([`CycleReport`]), keeps its own
//! state, and runs after the eviction requests, so neither its work nor an API round trip of
//! its own delays an eviction (the kubelet too updates the node status apart from its eviction
//! loop). In order: the signals' and evictions' metrics ([`super::cycle_metrics`]), the live view
//! the node API shows, the flight record ([`super::flight`]), the node conditions and taints
//! ([`super::conditions`]), and the kubelet's own thresholds compared with the agent's
//! ([`super::kubelet_config`], read at most once a minute).
use std::sync::Arc;

use tokio::time::Instant;

use node_monitor_core::{config::EvictionConfig, guarantees::KubeletConfig};

use super::{
    conditions::PublishedConditions, kubelet_config::KubeletThresholds, ports::ClusterWrites,
    report::CycleReport,
};
use crate::{http::Health, live::LiveView, metrics::Metrics};

/// The recorders' state.
pub(super) struct Recorders {
    /// What the node API shows: the last decision, the recent evictions, the flight record.
    pub(super) live: Arc<LiveView>,
    /// The agent's conditions and taints as last written to the node.
    pub(super) published: PublishedConditions,
    /// The kubelet's own thresholds, to tell which signals it acts on first; `None`: not read.
    pub(super) kubelet: Option<KubeletThresholds>,
}

/// What the recorders write through and read.
pub(super) struct Outputs<'a, C> {
    pub(super) config: &'a EvictionConfig,
    pub(super) metrics: &'a Metrics,
    pub(super) actuator: &'a C,
    pub(super) health: &'a Health,
}

impl Recorders {
    /// Recorders with nothing recorded yet, showing in `live`.
    pub(super) fn new(live: Arc<LiveView>) -> Self {
        Recorders {
            live,
            published: PublishedConditions::default(),
            kubelet: None,
        }
    }

    /// Every recorder, in order, on `report`.
    pub(super) async fn record<C: ClusterWrites>(
        &mut self,
        report: &CycleReport,
        out: Outputs<'_, C>,
    ) {
        super::cycle_metrics::record(
            out.metrics,
            &out.config.thresholds,
            &report.observations,
            &report.decision,
        );
        self.live
            .record_cycle(out.config, &report.observations, &report.decision);
        super::flight::record(&self.live, out.metrics, &out.config.thresholds, report);
        self.published
            .publish(
                &report.decision,
                out.actuator,
                out.health,
                out.metrics,
                &out.config.node_monitor,
            )
            .await;
        out.health.progress();
        if let Some(k) = &mut self.kubelet {
            k.check(
                Instant::now(),
                &out.config.thresholds,
                &report.observations.signals,
                out.metrics,
            );
        }
        let kubelet = self
            .kubelet
            .as_ref()
            .map_or(KubeletConfig::Off, KubeletThresholds::fact);
        self.live.guarantees.set_kubelet_config(kubelet);
    }
}
