//! The eviction manager's metrics (`agent::cycle`, `agent::cycle_metrics`, the disk reclaim and
//! the storage limits): the signals as observed, the thresholds, the decisions and their speed.
//! A group of the agent's registry that registers itself.
use prometheus_client::metrics::{
    counter::Counter,
    family::Family,
    gauge::Gauge,
    histogram::{Histogram, exponential_buckets},
};

use super::{
    ConditionLabels, EvictionLabels, LimitKindLabels, OutcomeLabels, PerUnit, ReasonLabels, Reg,
    SignalLabels, ThresholdLabels,
};

/// The eviction group's families: `node_monitor_signal_*`, `node_monitor_eviction*`,
/// `node_monitor_threshold_met`, `node_monitor_node_condition` and the eviction's timings.
#[derive(Debug)]
pub struct EvictionMetrics {
    /// `node_monitor_signal_available_{bytes,inodes,pids}`.
    pub signal_available: PerUnit<SignalLabels>,
    /// `node_monitor_signal_capacity_{bytes,inodes,pids}`.
    pub signal_capacity: PerUnit<SignalLabels>,
    /// `node_monitor_eviction_threshold_{bytes,inodes,pids}`.
    pub eviction_threshold: PerUnit<ThresholdLabels>,
    /// `node_monitor_threshold_met`.
    pub threshold_met: Family<ThresholdLabels, Gauge>,
    /// `node_monitor_node_condition`.
    pub node_condition: Family<ConditionLabels, Gauge>,
    /// `node_monitor_evictions`.
    pub evictions: Family<EvictionLabels, Counter>,
    /// `node_monitor_predicted_evictions`.
    pub predicted_evictions: Family<OutcomeLabels, Counter>,
    /// `node_monitor_local_storage_limit_evictions`.
    pub local_storage_limit_evictions: Family<LimitKindLabels, Counter>,
    /// `node_monitor_eviction_failures`.
    pub eviction_failures: Family<ReasonLabels, Counter>,
    /// `node_monitor_detection_to_eviction_seconds`.
    pub detection_to_eviction_seconds: Histogram,
    /// `node_monitor_rank_pod_figures_age_seconds`.
    pub rank_pod_figures_age_seconds: Histogram,
    /// `node_monitor_pod_figures_refreshes_given_up_total`.
    pub pod_refreshes_given_up: Counter,
    /// `node_monitor_disk_reclaim_pending_bytes`.
    pub disk_reclaim_pending_bytes: Gauge,
}

impl Default for EvictionMetrics {
    fn default() -> Self {
        Self {
            signal_available: PerUnit::default(),
            signal_capacity: PerUnit::default(),
            eviction_threshold: PerUnit::default(),
            threshold_met: Family::default(),
            node_condition: Family::default(),
            evictions: Family::default(),
            predicted_evictions: Family::default(),
            local_storage_limit_evictions: Family::default(),
            eviction_failures: Family::default(),
            // 1 ms … ~33 s.
            detection_to_eviction_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            // 0 (read now) and 1 ms … ~1 s.
            rank_pod_figures_age_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 11)),
            pod_refreshes_given_up: Counter::default(),
            disk_reclaim_pending_bytes: Gauge::default(),
        }
    }
}

impl EvictionMetrics {
    /// Adds every family of the group to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        self.signal_available.register(
            reg,
            "signal_available",
            "Observed available amount per eviction signal",
        );
        self.signal_capacity.register(
            reg,
            "signal_capacity",
            "Capacity per eviction signal (the base of percentage thresholds)",
        );
        self.eviction_threshold.register(
            reg,
            "eviction_threshold",
            "Configured eviction threshold per signal resolved against capacity",
        );
        reg.add(
            "threshold_met",
            "1 when the threshold is met in the latest observation",
            self.threshold_met.clone(),
        );
        reg.add(
            "node_condition",
            "1 when the node condition (MemoryPressure, DiskPressure, PIDPressure) holds as node-monitor sees it",
            self.node_condition.clone(),
        );
        reg.add(
            "evictions",
            "Eviction attempts by signal, threshold kind and outcome",
            self.evictions.clone(),
        );
        reg.add(
            "predicted_evictions",
            "Evictions made before memory.available crossed its hard threshold because the kernel's OOM point was nearer than an eviction's lead, by outcome; also counted in node_monitor_evictions",
            self.predicted_evictions.clone(),
        );
        reg.add(
            "local_storage_limit_evictions",
            "Evictions of pods over a local-storage limit (an emptyDir sizeLimit, the pod's or a container's ephemeral-storage limit), by limit kind and outcome; also counted in node_monitor_evictions",
            self.local_storage_limit_evictions.clone(),
        );
        reg.add(
            "eviction_failures",
            "Evictions that failed or were refused for another reason than a disruption budget, by reason; the pod backs off and the next candidate is considered",
            self.eviction_failures.clone(),
        );
        reg.add(
            "rank_pod_figures_age_seconds",
            "Age of the per-pod figures each ranking under pressure used (0: read before ranking)",
            self.rank_pod_figures_age_seconds.clone(),
        );
        reg.add(
            "pod_figures_refreshes_given_up",
            "Refreshes of the per-pod figures, made between wake-ups near a threshold, that gave way to a wake-up before every pod was read",
            self.pod_refreshes_given_up.clone(),
        );
        reg.add(
            "detection_to_eviction_seconds",
            "Time from the wake-up that first saw a threshold met to the eviction request's answer",
            self.detection_to_eviction_seconds.clone(),
        );
        reg.add(
            "disk_reclaim_pending_bytes",
            "Bytes of the node's disk that pods evicted for disk pressure still hold until the kubelet's container garbage collection frees them; credited back to the disk signals meanwhile",
            self.disk_reclaim_pending_bytes.clone(),
        );
    }
}
