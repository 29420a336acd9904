//! The agent's metrics (`node-monitor agent`): one registry of groups, each owned by the
//! subsystem it describes and registering itself (eviction, wake-ups, kernel, pods, kubelet,
//! shutdown, flight, liveness lease), and the agent's own health families.
use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

pub use super::labels::*;
use super::{
    Exposition, Family_, ReasonLabels, Reg, encode_registry, eviction::EvictionMetrics,
    flight::FlightMetrics, kernel::KernelMetrics, kubelet::KubeletMetrics, lease::RenewalMetrics,
    pods::PodMetrics, shutdown::ShutdownMetrics, wakeup::WakeupMetrics,
};

/// Every metric the agent exports: its own registry, served on the agent's `/metrics`; the
/// families of remediate are not among them (its own crate).
pub struct Metrics {
    registry: Registry,
    families: Vec<Family_>,
    /// The eviction manager's signals, thresholds, decisions and timings.
    pub eviction: EvictionMetrics,
    /// The wake-up sources.
    pub wakeups: WakeupMetrics,
    /// The eBPF programs, kernel events, OOM kills and the memory push.
    pub kernel: KernelMetrics,
    /// Where the agent finds pods, and whether it still sees them.
    pub pods: PodMetrics,
    /// What the agent read of the kubelet's own eviction settings.
    pub kubelet: KubeletMetrics,
    /// The liveness Lease's renewals.
    pub liveness_lease: RenewalMetrics,
    /// The graceful shutdown manager's and the reboot probe's families.
    pub shutdown: ShutdownMetrics,
    /// The OOM flight recorder's families.
    pub flight: FlightMetrics,
    /// `node_monitor_api_errors`.
    pub api_errors: Family<OperationLabels, Counter>,
    /// `node_monitor_events_dropped`.
    pub events_dropped: Family<ReasonLabels, Counter>,
    /// `node_monitor_degraded`.
    pub degraded: Gauge,
    /// `node_monitor_loop_last_progress_timestamp_seconds`.
    pub loop_last_progress_timestamp_seconds: Gauge<f64, AtomicU64>,
    /// `node_monitor_loop_liveness_bound_seconds`.
    pub loop_liveness_bound_seconds: Gauge<f64, AtomicU64>,
    /// `node_monitor_guarantee`.
    pub guarantee: Family<GuaranteeLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every group registered.
    pub fn new() -> Self {
        let m = Self {
            registry: Registry::default(),
            families: Vec::new(),
            eviction: EvictionMetrics::default(),
            wakeups: WakeupMetrics::default(),
            kernel: KernelMetrics::default(),
            pods: PodMetrics::default(),
            kubelet: KubeletMetrics::default(),
            liveness_lease: RenewalMetrics::default(),
            shutdown: ShutdownMetrics::default(),
            flight: FlightMetrics::default(),
            api_errors: Family::default(),
            events_dropped: Family::default(),
            degraded: Gauge::default(),
            loop_last_progress_timestamp_seconds: Gauge::default(),
            loop_liveness_bound_seconds: Gauge::default(),
            guarantee: Family::default(),
        };
        let mut reg = Reg::new();
        reg.add_build_info("Build information of the running agent");
        m.eviction.register(&mut reg);
        m.wakeups.register(&mut reg);
        m.kernel.register(&mut reg);
        m.pods.register(&mut reg);
        m.kubelet.register(&mut reg);
        m.shutdown.register(&mut reg);
        m.flight.register(&mut reg);
        m.liveness_lease.register(&mut reg);
        m.register_health(&mut reg);
        Self {
            registry: reg.registry,
            families: reg.families,
            ..m
        }
    }

    /// The agent's own health: API errors, dropped Events, degradation, the loop's progress,
    /// the guarantees.
    fn register_health(&self, reg: &mut Reg) {
        reg.add(
            "api_errors",
            "Kubernetes API calls that failed, by operation",
            self.api_errors.clone(),
        );
        reg.add(
            "events_dropped",
            "Kubernetes Events not written because the node's Event rate limit was spent, by reason",
            self.events_dropped.clone(),
        );
        reg.add(
            "degraded",
            "1 when the agent runs without some of its sources (see ebpf_program_state, wakeup_source_state)",
            self.degraded.clone(),
        );
        reg.add(
            "loop_last_progress_timestamp_seconds",
            "Unix time at which the decision loop last made progress (a wake-up, a decision, an API answer); 0 until the loop runs",
            self.loop_last_progress_timestamp_seconds.clone(),
        );
        reg.add(
            "loop_liveness_bound_seconds",
            "The longest the decision loop may go without progress before /healthz fails; 0 until the loop runs",
            self.loop_liveness_bound_seconds.clone(),
        );
        reg.add(
            "guarantee",
            "1 for each of the agent's guarantees (reboot-probe, core-reads, memcg-thresholds, psi-trigger, memory-push, kubelet-config) at whether it holds on this node: yes, no or not_applicable; the node's node-monitor.io/guarantees annotation says why not",
            self.guarantee.clone(),
        );
    }

    /// The text exposition format.
    pub fn encode(&self) -> String {
        encode_registry(&self.registry)
    }

    /// One Event of `reason` not written: the node's Event rate limit was spent or the writer
    /// was busy.
    pub fn record_event_dropped(&self, reason: &str) {
        self.events_dropped
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Every registered family as Prometheus scrapes it (`node_monitor_x_total` for counters,
    /// `_info` for info metrics), with its type; for the docs check and the dashboard test.
    pub fn families(&self) -> &[Family_] {
        &self.families
    }
}

impl Exposition for Metrics {
    fn encode(&self) -> String {
        Metrics::encode(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_exported_with_total_suffix_and_prefix() {
        let m = Metrics::new();
        m.eviction
            .evictions
            .get_or_create(&EvictionLabels {
                eviction_signal: "memory.available".into(),
                threshold: "hard".into(),
                outcome: "evicted".into(),
            })
            .inc();
        let text = m.encode();
        assert!(
            text.contains(
                "node_monitor_evictions_total{eviction_signal=\"memory.available\",threshold=\"hard\",outcome=\"evicted\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("node_monitor_build_info{version="), "{text}");
    }

    /// Every group registers each of its families once: no name is added twice.
    #[test]
    fn no_family_is_registered_twice() {
        let m = Metrics::new();
        let mut names: Vec<&str> = m.families().iter().map(|f| f.name.as_str()).collect();
        let all = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all, "{names:?}");
    }
}
