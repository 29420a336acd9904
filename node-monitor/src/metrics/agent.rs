//! The agent's metrics (`node-monitor agent`): eviction signals and decisions, kernel events,
//! wake-ups, the graceful shutdown, the API.
use std::{
    collections::{HashMap, HashSet},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use prometheus_client::{
    metrics::histogram::exponential_buckets,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

pub use super::labels::*;
use super::{Exposition, Family_, ReasonLabels, Reg, encode_registry};

/// Distinct (namespace, pod) label sets kept for OOM kills before new ones fold into `_other`.
pub const OOM_POD_LABEL_LIMIT: usize = 200;
const OTHER: &str = "_other";

/// Every metric the agent exports: its own registry, served on the agent's `/metrics`; the
/// families of remediate are not among them (its own crate).
pub struct Metrics {
    registry: Registry,
    families: Vec<Family_>,
    pub signal_available: PerUnit<SignalLabels>,
    pub signal_capacity: PerUnit<SignalLabels>,
    pub eviction_threshold: PerUnit<ThresholdLabels>,
    pub threshold_met: Family<ThresholdLabels, Gauge>,
    pub node_condition: Family<ConditionLabels, Gauge>,
    pub evictions: Family<EvictionLabels, Counter>,
    pub local_storage_limit_evictions: Family<LimitKindLabels, Counter>,
    pub eviction_failures: Family<ReasonLabels, Counter>,
    pub kernel_events: Family<KindLabels, Counter>,
    pub kernel_event_errors: Counter,
    pub ringbuf_drops: Counter,
    pub oom_kills: Family<OomLabels, Counter>,
    pub wakeups: Family<SourceLabels, Counter>,
    pub wakeup_to_decision_seconds: Histogram,
    pub detection_to_eviction_seconds: Histogram,
    pub rank_pod_figures_age_seconds: Histogram,
    pub ebpf_program_state: Family<ProgramLabels, Gauge>,
    pub memory_push_records: Family<OutcomeLabels, Counter>,
    pub memory_push_attached: Gauge,
    pub memory_push_switches: Family<OutcomeLabels, Counter>,
    pub wakeup_source_state: Family<SourceStateLabels, Gauge>,
    pub liveness_lease: super::lease::RenewalMetrics,
    /// The graceful shutdown manager's and the reboot probe's families.
    pub shutdown: super::shutdown::ShutdownMetrics,
    /// The OOM flight recorder's families.
    pub flight: super::flight::FlightMetrics,
    pub api_errors: Family<OperationLabels, Counter>,
    pub events_dropped: Family<ReasonLabels, Counter>,
    pub degraded: Gauge,
    pub kubepods_layout: Family<KubepodsLabels, Gauge>,
    pub pod_cgroups_missing: Gauge,
    pub disk_reclaim_pending_bytes: Gauge,
    pub pod_watch_failing: Gauge,
    pub pod_watch_errors: Counter,
    pub loop_last_progress_timestamp_seconds: Gauge<f64, AtomicU64>,
    pub loop_liveness_bound_seconds: Gauge<f64, AtomicU64>,
    pub kubelet_config_read: Gauge,
    pub kubelet_config_source: Family<KubeletSourceLabels, Gauge>,
    pub kubelet_threshold_preempts: Family<ThresholdLabels, Gauge>,
    pub guarantee: Family<GuaranteeLabels, Gauge>,
    oom_pods_seen: Mutex<HashSet<(String, String)>>,
    ringbuf_drops_seen: AtomicU64,
    /// The kernel's and the switch's cumulative memory push counts last mirrored, by family
    /// and outcome.
    memory_push_seen: Mutex<HashMap<(&'static str, &'static str), u64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    #[expect(
        clippy::too_many_lines,
        reason = "one registration per family, read top to bottom"
    )]
    pub fn new() -> Self {
        let mut reg = Reg::new();
        let m = Self {
            signal_available: PerUnit::default(),
            signal_capacity: PerUnit::default(),
            eviction_threshold: PerUnit::default(),
            threshold_met: Family::default(),
            node_condition: Family::default(),
            evictions: Family::default(),
            local_storage_limit_evictions: Family::default(),
            eviction_failures: Family::default(),
            kernel_events: Family::default(),
            kernel_event_errors: Counter::default(),
            ringbuf_drops: Counter::default(),
            oom_kills: Family::default(),
            wakeups: Family::default(),
            // 50 µs … ~26 s.
            wakeup_to_decision_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 20)),
            // 1 ms … ~33 s.
            detection_to_eviction_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            // 0 (read now) and 1 ms … ~1 s.
            rank_pod_figures_age_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 11)),
            ebpf_program_state: Family::default(),
            memory_push_records: Family::default(),
            memory_push_attached: Gauge::default(),
            memory_push_switches: Family::default(),
            wakeup_source_state: Family::default(),
            liveness_lease: super::lease::RenewalMetrics::default(),
            shutdown: super::shutdown::ShutdownMetrics::default(),
            flight: super::flight::FlightMetrics::default(),
            api_errors: Family::default(),
            events_dropped: Family::default(),
            degraded: Gauge::default(),
            kubepods_layout: Family::default(),
            pod_cgroups_missing: Gauge::default(),
            pod_watch_failing: Gauge::default(),
            pod_watch_errors: Counter::default(),
            disk_reclaim_pending_bytes: Gauge::default(),
            loop_last_progress_timestamp_seconds: Gauge::default(),
            loop_liveness_bound_seconds: Gauge::default(),
            kubelet_config_read: Gauge::default(),
            kubelet_config_source: Family::default(),
            guarantee: Family::default(),
            kubelet_threshold_preempts: Family::default(),
            oom_pods_seen: Mutex::new(HashSet::new()),
            ringbuf_drops_seen: AtomicU64::new(0),
            memory_push_seen: Mutex::new(HashMap::new()),
            registry: Registry::default(),
            families: Vec::new(),
        };
        reg.add_build_info("Build information of the running agent");
        m.signal_available.register(
            &mut reg,
            "signal_available",
            "Observed available amount per eviction signal",
        );
        m.signal_capacity.register(
            &mut reg,
            "signal_capacity",
            "Capacity per eviction signal (the base of percentage thresholds)",
        );
        m.eviction_threshold.register(
            &mut reg,
            "eviction_threshold",
            "Configured eviction threshold per signal resolved against capacity",
        );
        reg.add(
            "threshold_met",
            "1 when the threshold is met in the latest observation",
            m.threshold_met.clone(),
        );
        reg.add(
            "node_condition",
            "1 when the node condition (MemoryPressure, DiskPressure, PIDPressure) holds as node-monitor sees it",
            m.node_condition.clone(),
        );
        reg.add(
            "evictions",
            "Eviction attempts by signal, threshold kind and outcome",
            m.evictions.clone(),
        );
        reg.add(
            "local_storage_limit_evictions",
            "Evictions of pods over a local-storage limit (an emptyDir sizeLimit, the pod's or a container's ephemeral-storage limit), by limit kind and outcome; also counted in node_monitor_evictions",
            m.local_storage_limit_evictions.clone(),
        );
        reg.add(
            "eviction_failures",
            "Evictions that failed or were refused for another reason than a disruption budget, by reason; the pod backs off and the next candidate is considered",
            m.eviction_failures.clone(),
        );
        reg.add(
            "kernel_events",
            "Kernel events received from the eBPF programs, by kind",
            m.kernel_events.clone(),
        );
        reg.add(
            "kernel_event_errors",
            "Kernel event records that could not be decoded",
            m.kernel_event_errors.clone(),
        );
        reg.add(
            "ringbuf_drops",
            "Kernel events dropped because the ring buffer was full",
            m.ringbuf_drops.clone(),
        );
        reg.add(
            "oom_kills",
            "Kernel OOM kills by scope (global or pod); namespace and pod are bounded in cardinality",
            m.oom_kills.clone(),
        );
        reg.add("wakeups", "Sampler wake-ups by source", m.wakeups.clone());
        reg.add(
            "wakeup_to_decision_seconds",
            "Time from a wake-up to the decision it led to",
            m.wakeup_to_decision_seconds.clone(),
        );
        reg.add(
            "rank_pod_figures_age_seconds",
            "Age of the per-pod figures each ranking under pressure used (0: read before ranking)",
            m.rank_pod_figures_age_seconds.clone(),
        );
        reg.add(
            "detection_to_eviction_seconds",
            "Time from the wake-up that first saw a threshold met to the eviction request's answer",
            m.detection_to_eviction_seconds.clone(),
        );
        reg.add(
            "ebpf_program_state",
            "1 for the current state of each eBPF program",
            m.ebpf_program_state.clone(),
        );
        reg.add(
            "memory_push_records",
            "Memory push wake records by outcome: sent, withheld by the rate limit, dropped",
            m.memory_push_records.clone(),
        );
        reg.add(
            "memory_push_attached",
            "1 while the memory push's programs are attached",
            m.memory_push_attached.clone(),
        );
        reg.add(
            "memory_push_switches",
            "Attaches, detaches and failed attaches of the memory push's programs",
            m.memory_push_switches.clone(),
        );
        reg.add(
            "wakeup_source_state",
            "1 for the current state of each wake-up source",
            m.wakeup_source_state.clone(),
        );
        m.shutdown.register(&mut reg);
        reg.add(
            "api_errors",
            "Kubernetes API calls that failed, by operation",
            m.api_errors.clone(),
        );
        reg.add(
            "events_dropped",
            "Kubernetes Events not written because the node's Event rate limit was spent, by reason",
            m.events_dropped.clone(),
        );
        reg.add(
            "degraded",
            "1 when the agent runs without some of its sources (see ebpf_program_state, wakeup_source_state)",
            m.degraded.clone(),
        );
        reg.add(
            "kubepods_layout",
            "1 for the kubepods cgroup the agent reads pods from, labelled with the cgroup driver",
            m.kubepods_layout.clone(),
        );
        reg.add(
            "disk_reclaim_pending_bytes",
            "Bytes of the node's disk that pods evicted for disk pressure still hold until the kubelet's container garbage collection frees them; credited back to the disk signals meanwhile",
            m.disk_reclaim_pending_bytes.clone(),
        );
        m.flight.register(&mut reg);
        reg.add(
            "pod_cgroups_missing",
            "1 while the API lists pods running on this node and none of their cgroups is found; evictions are held",
            m.pod_cgroups_missing.clone(),
        );
        reg.add(
            "pod_watch_failing",
            "1 while the watch of this node's pods is failing (the API server unreachable, refusing or silent): the pod cache is not updated meanwhile",
            m.pod_watch_failing.clone(),
        );
        reg.add(
            "pod_watch_errors",
            "Errors of the watch of this node's pods, each followed by a reconnect with backoff",
            m.pod_watch_errors.clone(),
        );
        reg.add(
            "loop_last_progress_timestamp_seconds",
            "Unix time at which the decision loop last made progress (a wake-up, a decision, an API answer); 0 until the loop runs",
            m.loop_last_progress_timestamp_seconds.clone(),
        );
        reg.add(
            "loop_liveness_bound_seconds",
            "The longest the decision loop may go without progress before /healthz fails; 0 until the loop runs",
            m.loop_liveness_bound_seconds.clone(),
        );
        reg.add(
            "liveness_lease_renewals",
            "Renewals of the agent's liveness Lease by result: renewed (patched), created, conflict (created meanwhile by another writer: nothing written), error",
            m.liveness_lease.renewals.clone(),
        );
        reg.add(
            "liveness_lease_last_renewal_timestamp_seconds",
            "Unix time of the last renewal that wrote the agent's liveness Lease (renewed or created); 0 until one does",
            m.liveness_lease.last_renewal.clone(),
        );
        reg.add(
            "kubelet_config_read",
            "1 when the kubelet's configuration (nodeMonitor.kubeletConfigPath: its command line, file and drop-ins) was found and parsed at the last look, 0 when none was found, or one is unreadable or malformed, or the setting is off",
            m.kubelet_config_read.clone(),
        );
        reg.add(
            "kubelet_config_source",
            "1 for each source of the kubelet's eviction settings read at the last look: its command line, its configuration file and each drop-in",
            m.kubelet_config_source.clone(),
        );
        reg.add(
            "kubelet_threshold_preempts",
            "1 when the kubelet's own eviction threshold for the signal is at or above node-monitor's threshold of this kind, so the kubelet acts at or before node-monitor; 0 when node-monitor acts first or the kubelet has none for the signal",
            m.kubelet_threshold_preempts.clone(),
        );
        reg.add(
            "guarantee",
            "1 for each of the agent's guarantees (reboot-probe, core-reads, memcg-thresholds, psi-trigger, memory-push, kubelet-config) at whether it holds on this node: yes, no or not_applicable; the node's node-monitor.io/guarantees annotation says why not",
            m.guarantee.clone(),
        );
        Self {
            registry: reg.registry,
            families: reg.families,
            ..m
        }
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

    /// Counts an OOM kill. Pod labels are kept for at most [`OOM_POD_LABEL_LIMIT`] distinct pods;
    /// later ones are counted under `_other` so a crash-looping namespace cannot blow up the series.
    pub fn record_oom_kill(&self, global: bool, pod: Option<(&str, &str)>) {
        let scope = if global { "global" } else { "pod" };
        let (ns, name) = pod.unwrap_or(("", ""));
        let (ns, name) = match self.oom_pods_seen.lock() {
            Ok(mut seen) => {
                let key = (ns.to_owned(), name.to_owned());
                if seen.contains(&key) || seen.len() < OOM_POD_LABEL_LIMIT {
                    seen.insert(key);
                    (ns.to_owned(), name.to_owned())
                } else {
                    (OTHER.to_owned(), OTHER.to_owned())
                }
            }
            Err(_) => (OTHER.to_owned(), OTHER.to_owned()),
        };
        self.oom_kills
            .get_or_create(&OomLabels {
                scope: scope.to_owned(),
                namespace: ns,
                pod: name,
            })
            .inc();
    }

    /// Mirrors the kernel's cumulative drop counter into the `_total` counter.
    pub fn observe_ringbuf_drops(&self, kernel_total: u64) {
        let prev = self
            .ringbuf_drops_seen
            .fetch_max(kernel_total, Ordering::Relaxed);
        if kernel_total > prev {
            self.ringbuf_drops.inc_by(kernel_total - prev);
        }
    }

    /// Mirrors the memory push's cumulative counts (the kernel's records by outcome, the
    /// switch's attaches by outcome) into their `_total` counters, and whether it is attached.
    pub fn observe_memory_push(
        &self,
        records: [(&'static str, u64); 3],
        switches: [(&'static str, u64); 3],
        attached: bool,
    ) {
        self.memory_push_attached.set(i64::from(attached));
        let Ok(mut seen) = self.memory_push_seen.lock() else {
            return;
        };
        for (family, counts, metric) in [
            ("records", records, &self.memory_push_records),
            ("switches", switches, &self.memory_push_switches),
        ] {
            for (outcome, total) in counts {
                let prev = seen.entry((family, outcome)).or_insert(0);
                let c = metric.get_or_create(&OutcomeLabels {
                    outcome: outcome.to_owned(),
                });
                if total > *prev {
                    c.inc_by(total - *prev);
                    *prev = total;
                }
            }
        }
    }

    /// Sets a one-hot state family: the given state is 1, the other known states are 0.
    pub fn set_program_state(&self, program: &str, state: &str) {
        for s in ["attached", "degraded", "loaded", "failed", "disabled"] {
            self.ebpf_program_state
                .get_or_create(&ProgramLabels {
                    program: program.to_owned(),
                    state: s.to_owned(),
                })
                .set(i64::from(s == state));
        }
    }

    /// Sets a wake-up source's state (`active` or `unavailable`).
    pub fn set_source_state(&self, source: &str, state: &str) {
        for s in ["active", "unavailable", "not_applicable", "disabled"] {
            self.wakeup_source_state
                .get_or_create(&SourceStateLabels {
                    source: source.to_owned(),
                    state: s.to_owned(),
                })
                .set(i64::from(s == state));
        }
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
        m.evictions
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

    #[test]
    fn oom_pod_labels_are_bounded() {
        let m = Metrics::new();
        for i in 0..OOM_POD_LABEL_LIMIT + 50 {
            m.record_oom_kill(false, Some(("ns", &format!("p{i}"))));
        }
        let text = m.encode();
        let series = text
            .lines()
            .filter(|l| l.starts_with("node_monitor_oom_kills_total{"))
            .count();
        assert_eq!(
            series,
            OOM_POD_LABEL_LIMIT + 1,
            "limit plus the _other series"
        );
        assert!(
            text.contains("namespace=\"_other\",pod=\"_other\"} 50"),
            "{text}"
        );
    }

    #[test]
    fn ringbuf_drops_follow_the_kernel_counter_monotonically() {
        let m = Metrics::new();
        m.observe_ringbuf_drops(5);
        m.observe_ringbuf_drops(3); // a stale read never decreases the counter
        m.observe_ringbuf_drops(9);
        assert_eq!(m.ringbuf_drops.get(), 9);
    }

    #[test]
    fn the_memory_push_counts_follow_the_kernel_and_the_switch() {
        let m = Metrics::new();
        let sw = |a, d, f| [("attached", a), ("detached", d), ("failed", f)];
        m.observe_memory_push(
            [("sent", 3), ("withheld", 1), ("dropped", 0)],
            sw(1, 0, 0),
            true,
        );
        // A stale read never decreases a counter.
        m.observe_memory_push(
            [("sent", 2), ("withheld", 4), ("dropped", 2)],
            sw(1, 1, 2),
            false,
        );
        let text = m.encode();
        for line in [
            "node_monitor_memory_push_records_total{outcome=\"sent\"} 3",
            "node_monitor_memory_push_records_total{outcome=\"withheld\"} 4",
            "node_monitor_memory_push_records_total{outcome=\"dropped\"} 2",
            "node_monitor_memory_push_switches_total{outcome=\"attached\"} 1",
            "node_monitor_memory_push_switches_total{outcome=\"detached\"} 1",
            "node_monitor_memory_push_switches_total{outcome=\"failed\"} 2",
            "node_monitor_memory_push_attached 0",
        ] {
            assert!(text.contains(line), "{line}\n{text}");
        }
    }

    #[test]
    fn program_state_is_one_hot() {
        let m = Metrics::new();
        m.set_program_state("oom_mark_victim", "attached");
        m.set_program_state("oom_mark_victim", "failed");
        let text = m.encode();
        assert!(
            text.contains("program=\"oom_mark_victim\",state=\"failed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("program=\"oom_mark_victim\",state=\"attached\"} 0"),
            "{text}"
        );
    }
}
