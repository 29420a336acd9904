//! The kernel side's metrics (`ebpf`, `agent::kernel`): the eBPF programs' states, the kernel
//! events and OOM kills they report, the ring buffer and the memory push. A group of the agent's
//! registry that registers itself.
use std::{
    collections::{HashMap, HashSet},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use super::{KindLabels, OomLabels, OutcomeLabels, ProgramLabels, Reg, set_one_hot};

/// Distinct (namespace, pod) label sets kept for OOM kills before new ones fold into `_other`.
pub const OOM_POD_LABEL_LIMIT: usize = 200;
const OTHER: &str = "_other";

/// The kernel group's families: `node_monitor_kernel_event*`, `node_monitor_ringbuf_drops`,
/// `node_monitor_oom_kills`, `node_monitor_ebpf_program_state`, `node_monitor_memory_push_*`.
#[derive(Debug, Default)]
pub struct KernelMetrics {
    /// `node_monitor_kernel_events`.
    pub events: Family<KindLabels, Counter>,
    /// `node_monitor_kernel_event_errors`.
    pub event_errors: Counter,
    /// `node_monitor_ringbuf_drops`.
    pub ringbuf_drops: Counter,
    /// `node_monitor_oom_kills`.
    pub oom_kills: Family<OomLabels, Counter>,
    /// `node_monitor_ebpf_program_state`.
    pub program_state: Family<ProgramLabels, Gauge>,
    /// `node_monitor_memory_push_records`.
    pub memory_push_records: Family<OutcomeLabels, Counter>,
    /// `node_monitor_memory_push_attached`.
    pub memory_push_attached: Gauge,
    /// `node_monitor_memory_push_switches`.
    pub memory_push_switches: Family<OutcomeLabels, Counter>,
    oom_pods_seen: Mutex<HashSet<(String, String)>>,
    ringbuf_drops_seen: AtomicU64,
    /// The kernel's and the switch's cumulative memory push counts last mirrored, by family
    /// and outcome.
    memory_push_seen: Mutex<HashMap<(&'static str, &'static str), u64>>,
}

impl KernelMetrics {
    /// Adds every family of the group to the agent's registry.
    pub fn register(&self, reg: &mut Reg) {
        reg.add(
            "kernel_events",
            "Kernel events received from the eBPF programs, by kind",
            self.events.clone(),
        );
        reg.add(
            "kernel_event_errors",
            "Kernel event records that could not be decoded",
            self.event_errors.clone(),
        );
        reg.add(
            "ringbuf_drops",
            "Kernel events dropped because the ring buffer was full",
            self.ringbuf_drops.clone(),
        );
        reg.add(
            "oom_kills",
            "Kernel OOM kills by scope (global or pod); namespace and pod are bounded in cardinality",
            self.oom_kills.clone(),
        );
        reg.add(
            "ebpf_program_state",
            "1 for the current state of each eBPF program",
            self.program_state.clone(),
        );
        reg.add(
            "memory_push_records",
            "Memory push wake records by outcome: sent, withheld by the rate limit, dropped",
            self.memory_push_records.clone(),
        );
        reg.add(
            "memory_push_attached",
            "1 while the memory push's programs are attached",
            self.memory_push_attached.clone(),
        );
        reg.add(
            "memory_push_switches",
            "Attaches, detaches and failed attaches of the memory push's programs",
            self.memory_push_switches.clone(),
        );
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
                pod_namespace: ns,
                pod_name: name,
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
        set_one_hot(
            &self.program_state,
            &["attached", "degraded", "loaded", "failed", "disabled"],
            state,
            |s| ProgramLabels {
                program: program.to_owned(),
                state: s.to_owned(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    #[test]
    fn oom_pod_labels_are_bounded() {
        let m = Metrics::new();
        for i in 0..OOM_POD_LABEL_LIMIT + 50 {
            m.kernel
                .record_oom_kill(false, Some(("ns", &format!("p{i}"))));
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
            text.contains("pod_namespace=\"_other\",pod_name=\"_other\"} 50"),
            "{text}"
        );
    }

    #[test]
    fn ringbuf_drops_follow_the_kernel_counter_monotonically() {
        let m = KernelMetrics::default();
        m.observe_ringbuf_drops(5);
        m.observe_ringbuf_drops(3); // a stale read never decreases the counter
        m.observe_ringbuf_drops(9);
        assert_eq!(m.ringbuf_drops.get(), 9);
    }

    #[test]
    fn the_memory_push_counts_follow_the_kernel_and_the_switch() {
        let m = Metrics::new();
        let sw = |a, d, f| [("attached", a), ("detached", d), ("failed", f)];
        m.kernel.observe_memory_push(
            [("sent", 3), ("withheld", 1), ("dropped", 0)],
            sw(1, 0, 0),
            true,
        );
        // A stale read never decreases a counter.
        m.kernel.observe_memory_push(
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
        m.kernel.set_program_state("oom_mark_victim", "attached");
        m.kernel.set_program_state("oom_mark_victim", "failed");
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
