//! The OOM flight recorder's adapters: a [`Sample`] from what one pass of the agent's loop
//! observed and decided, a [`FlightEvent`] from a kernel event, PSI from its file, a record's
//! text summary and its SVG timeline ([`svg`]). The recording itself is
//! [`node_monitor_core::flight`]; the agent keeps it in its live view (`/node-monitor/v1/flight`).
use std::{collections::HashMap, path::Path};

pub use node_monitor_core::flight::{
    EventKind, FlightEvent, FlightRecord, FlightRecorder, PodPoint, PredictionPoint, PsiPoint,
    Sample, SignalPoint, TOP_PODS,
};
use node_monitor_core::{
    eviction::Decision,
    kubelet::pod::PodInfo,
    signals::threshold::{Resource, Threshold, signal_resource},
    signals::{Observations, PodUsage},
};

pub mod store;

pub use node_monitor_base::flight_view::{event_label, record_json, record_text, records_of, svg};

/// What one pass observed and decided, as the recorder keeps it: the memory signals with their
/// thresholds, the [`TOP_PODS`] largest working sets of `figures` (the latest pod figures and
/// their age, ms), PSI, the thresholds met and the pods chosen. Pure.
pub fn sample_of(
    at_ms: u64,
    thresholds: &[Threshold],
    obs: &Observations,
    decision: &Decision,
    pods: &[PodInfo],
    figures: Option<(u64, &HashMap<String, PodUsage>)>,
    psi: Option<PsiPoint>,
) -> Sample {
    let signals = obs
        .signals
        .iter()
        .filter(|(s, _)| signal_resource(**s) == Resource::Memory)
        .map(|(s, o)| {
            let quantity = |hard: bool| {
                thresholds
                    .iter()
                    .filter(|t| t.signal == *s && t.is_hard() == hard)
                    .map(|t| t.quantity(o.capacity).value())
                    .max()
            };
            SignalPoint {
                signal: s.as_str().to_owned(),
                available: o.available,
                capacity: o.capacity,
                hard: quantity(true),
                soft: quantity(false),
            }
        })
        .collect();
    // The largest working sets first (by UID, no allocation), then the names of those alone.
    let mut top: Vec<(&String, u64)> = figures
        .map(|(_, f)| {
            f.iter()
                .filter_map(|(uid, u)| Some((uid, u.memory?)))
                .collect()
        })
        .unwrap_or_default();
    let order = |a: &(&String, u64), b: &(&String, u64)| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0));
    if top.len() > TOP_PODS {
        top.select_nth_unstable_by(TOP_PODS - 1, order);
        top.truncate(TOP_PODS);
    }
    top.sort_by(order);
    let top_pods: Vec<PodPoint> = top
        .into_iter()
        .map(|(uid, working_set)| PodPoint {
            pod: pods
                .iter()
                .find(|p| &p.uid == uid)
                .map_or_else(|| uid.clone(), |p| format!("{}/{}", p.namespace, p.name)),
            working_set,
        })
        .collect();
    Sample {
        at_ms,
        signals,
        top_pods,
        pod_figures_age_ms: figures.map(|(age, _)| age),
        psi,
        thresholds_met: decision
            .thresholds_met
            .iter()
            .map(|t| threshold_name(t.signal.as_str(), t.hard))
            .collect(),
        evict: decision
            .evict
            .iter()
            .map(|e| format!("{}/{}", e.namespace, e.name))
            .collect(),
        prediction: decision.prediction.map(|p| PredictionPoint {
            rate_bytes_per_second: p.rate_bytes_per_second,
            headroom_bytes: p.headroom_bytes,
            exhaustion_ms: p.exhaustion_ms,
            lead_ms: p.lead_ms,
        }),
    }
}

/// The working set of every pod of `figures`, named as in the samples (`namespace/name`, or
/// the UID when the pod is not known by name): what a sample may need beyond its [`TOP_PODS`]
/// (the pod of an OOM kill, whatever its rank). Pure.
pub fn named_figures(pods: &[PodInfo], figures: &HashMap<String, PodUsage>) -> Vec<PodPoint> {
    let by_uid: HashMap<&str, &PodInfo> = pods.iter().map(|p| (p.uid.as_str(), p)).collect();
    figures
        .iter()
        .filter_map(|(uid, u)| {
            Some(PodPoint {
                working_set: u.memory?,
                pod: by_uid
                    .get(uid.as_str())
                    .map_or_else(|| uid.clone(), |p| format!("{}/{}", p.namespace, p.name)),
            })
        })
        .collect()
}

/// An OOM kill, reclaim stall or kswapd wake-up as the flight recorder keeps it, at `at_ms`,
/// with its pod (`namespace/name`, else its UID); other events are not kept. Pure.
pub fn kernel_event(
    ev: &crate::ebpf::KernelEvent,
    attribution: Option<&crate::attribution::Attribution>,
    at_ms: u64,
) -> Option<FlightEvent> {
    use crate::ebpf::KernelEvent;
    let pod = attribution
        .and_then(|a| {
            a.pod_ref
                .as_ref()
                .map(|r| format!("{}/{}", r.namespace, r.name))
                .or_else(|| a.pod.as_ref().map(|p| p.pod_uid.clone()))
        })
        .unwrap_or_default();
    let kind = match ev {
        KernelEvent::OomKill(o) => EventKind::OomKill {
            pod,
            comm: o.victim_comm.clone().unwrap_or_default(),
            pid: o.victim_pid,
            global: o.global(),
        },
        KernelEvent::ReclaimStall(r) => EventKind::ReclaimStall {
            pod,
            stall_ns: r.stall_ns,
        },
        KernelEvent::KswapdWake(k) => EventKind::KswapdWake {
            suppressed: k.suppressed,
        },
        KernelEvent::Reboot(_) | KernelEvent::Synthetic(_) => return None,
    };
    Some(FlightEvent { at_ms, kind })
}

/// `memory.available hard`.
pub fn threshold_name(signal: &str, hard: bool) -> String {
    format!("{signal} {}", if hard { "hard" } else { "soft" })
}

/// PSI from a pressure file (`/proc/pressure/memory`, a cgroup's `memory.pressure`); `None` when
/// it cannot be read or parsed (the sample goes without).
pub fn read_psi(path: &Path) -> Option<PsiPoint> {
    let text = std::fs::read_to_string(path).ok()?;
    let p = crate::sampler::parse::parse_pressure(&text).ok()?;
    let full = p.full.unwrap_or_default();
    Some(PsiPoint {
        some_avg10: p.some.avg10,
        full_avg10: full.avg10,
        some_total_us: p.some.total_us,
        full_total_us: full.total_us,
    })
}

#[cfg(test)]
mod tests;
