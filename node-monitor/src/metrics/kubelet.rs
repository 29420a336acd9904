//! The kubelet cross-check's metrics (`agent::kubelet_config`): what the agent read of the
//! kubelet's own eviction settings. A group of the agent's registry that registers itself.
use prometheus_client::metrics::{family::Family, gauge::Gauge};

use super::{KubeletSourceLabels, Reg, ThresholdLabels};

/// The kubelet cross-check's families: `node_monitor_kubelet_*`.
#[derive(Debug, Default)]
pub struct KubeletMetrics {
    /// `node_monitor_kubelet_config_read`.
    pub config_read: Gauge,
    /// `node_monitor_kubelet_config_source`.
    pub config_source: Family<KubeletSourceLabels, Gauge>,
    /// `node_monitor_kubelet_threshold_preempts`.
    pub threshold_preempts: Family<ThresholdLabels, Gauge>,
}

impl KubeletMetrics {
    /// Adds every family of the group to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        reg.add(
            "kubelet_config_read",
            "1 when the kubelet's configuration (nodeMonitor.kubeletConfigPath: its command line, file and drop-ins) was found and parsed at the last look, 0 when none was found, or one is unreadable or malformed, or the setting is off",
            self.config_read.clone(),
        );
        reg.add(
            "kubelet_config_source",
            "1 for each source of the kubelet's eviction settings read at the last look: its command line, its configuration file and each drop-in",
            self.config_source.clone(),
        );
        reg.add(
            "kubelet_threshold_preempts",
            "1 when the kubelet's own eviction threshold for the signal is at or above node-monitor's threshold of this kind, so the kubelet acts at or before node-monitor; 0 when node-monitor acts first or the kubelet has none for the signal",
            self.threshold_preempts.clone(),
        );
    }
}
