//! The pod sight's metrics (`agent::cycle::sight`, the pod watch): where the agent finds pods
//! and whether it still sees them. A group of the agent's registry that registers itself.
use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use super::{KubepodsLabels, Reg};

/// The pod sight's families: `node_monitor_kubepods_layout`, `node_monitor_pod_*`.
#[derive(Debug, Default)]
pub struct PodMetrics {
    /// `node_monitor_kubepods_layout`.
    pub kubepods_layout: Family<KubepodsLabels, Gauge>,
    /// `node_monitor_pod_cgroups_missing`.
    pub cgroups_missing: Gauge,
    /// `node_monitor_pod_watch_failing`.
    pub watch_failing: Gauge,
    /// `node_monitor_pod_watch_errors`.
    pub watch_errors: Counter,
}

impl PodMetrics {
    /// Adds every family of the group to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        reg.add(
            "kubepods_layout",
            "1 for the kubepods cgroup the agent reads pods from, labelled with the cgroup driver",
            self.kubepods_layout.clone(),
        );
        reg.add(
            "pod_cgroups_missing",
            "1 while the API lists pods running on this node and none of their cgroups is found; evictions are held",
            self.cgroups_missing.clone(),
        );
        reg.add(
            "pod_watch_failing",
            "1 while the watch of this node's pods is failing (the API server unreachable, refusing or silent): the pod cache is not updated meanwhile",
            self.watch_failing.clone(),
        );
        reg.add(
            "pod_watch_errors",
            "Errors of the watch of this node's pods, each followed by a reconnect with backoff",
            self.watch_errors.clone(),
        );
    }
}
