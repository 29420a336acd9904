//! The OOM flight recorder's adapters: a [`Sample`] from what one pass of the agent's loop
//! observed and decided, a [`FlightEvent`] from a kernel event, PSI from its file, a record's
//! text summary and its SVG timeline ([`svg`]). The recording itself is
//! [`node_monitor_core::flight`]; the agent keeps it in its live view (`/node-monitor/v1/flight`).
use std::{collections::HashMap, path::Path};

use serde_json::{Value, json};

pub use node_monitor_core::flight::{
    EventKind, FlightEvent, FlightRecord, FlightRecorder, PodPoint, PsiPoint, Sample, SignalPoint,
    TOP_PODS,
};
use node_monitor_core::{
    eviction::Decision,
    pod::PodInfo,
    signals::{Observations, PodUsage},
    threshold::{Resource, Threshold, signal_resource},
};

pub mod store;
pub mod svg;

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

/// A record as the node API answers it: the record, its verdict and the node.
pub fn record_json(record: &FlightRecord, node: &str) -> Value {
    let mut v = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert("node".into(), json!(node));
        m.insert("verdict".into(), json!(record.verdict()));
    }
    v
}

/// The records of a node API answer (`{"records": [...]}`), newest first; a record that does
/// not parse is an error naming it.
pub fn records_of(answer: &Value) -> anyhow::Result<Vec<FlightRecord>> {
    answer
        .get("records")
        .and_then(Value::as_array)
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            serde_json::from_value(r.clone())
                .map_err(|e| anyhow::anyhow!("flight record {i}: not a flight record: {e}"))
        })
        .collect()
}

/// One record in a few lines: the trigger, the verdict, the lowest memory seen, the peak PSI,
/// the reclaim activity and the agent's actions before the trigger.
pub fn record_text(r: &FlightRecord, node: &str) -> String {
    let at = r.trigger.at_ms;
    let mut out = format!(
        "{node} record {} at {}: {}\n  verdict: {}\n",
        r.id,
        node_monitor_core::flight::utc(at),
        event_label(&r.trigger.kind),
        r.verdict()
    );
    let before: Vec<&Sample> = r.samples.iter().filter(|s| s.at_ms <= at).collect();
    out.push_str(&format!(
        "  samples: {} in the {} s before, {} after\n",
        before.len(),
        node_monitor_core::flight::WINDOW_MS / 1000,
        r.samples.len() - before.len()
    ));
    if let Some((s, p)) = before
        .iter()
        .flat_map(|s| s.signals.iter().map(move |p| (*s, p)))
        .min_by_key(|(_, p)| p.available)
    {
        let threshold = p.hard.or(p.soft).map_or_else(
            || "no threshold".to_owned(),
            |t| format!("threshold {}", mib(t)),
        );
        out.push_str(&format!(
            "  lowest {}: {} ({threshold}) at {:+.1} s\n",
            p.signal,
            mib(p.available),
            rel_s(s.at_ms, at)
        ));
    }
    if let Some(psi) = before.iter().filter_map(|s| s.psi).max_by(|a, b| {
        a.some_avg10
            .partial_cmp(&b.some_avg10)
            .unwrap_or(std::cmp::Ordering::Equal)
    }) {
        out.push_str(&format!(
            "  peak PSI memory: some avg10 {:.1}%, full avg10 {:.1}%\n",
            psi.some_avg10, psi.full_avg10
        ));
    }
    if let Some(last) = before.last().filter(|s| !s.top_pods.is_empty()) {
        let pods: Vec<String> = last
            .top_pods
            .iter()
            .map(|p| {
                format!(
                    "{} {}",
                    p.pod,
                    mib(i64::try_from(p.working_set).unwrap_or(i64::MAX))
                )
            })
            .collect();
        out.push_str(&format!("  top pods: {}\n", pods.join(", ")));
    }
    let (stalls, kswapd) = r
        .events
        .iter()
        .filter(|e| e.at_ms <= at)
        .fold((0, 0), |(s, k), e| match e.kind {
            EventKind::ReclaimStall { .. } => (s + 1, k),
            EventKind::KswapdWake { suppressed } => (s, k + 1 + u64::from(suppressed)),
            _ => (s, k),
        });
    out.push_str(&format!(
        "  reclaim: {stalls} stalls, {kswapd} kswapd wake-ups\n"
    ));
    for e in r.events.iter().filter(|e| {
        matches!(
            e.kind,
            EventKind::Eviction { .. } | EventKind::OomKill { .. } | EventKind::Threshold { .. }
        )
    }) {
        out.push_str(&format!(
            "  {:+.1} s {}\n",
            rel_s(e.at_ms, at),
            event_label(&e.kind)
        ));
    }
    out.trim_end().to_owned()
}

/// An event in a few words.
pub fn event_label(kind: &EventKind) -> String {
    match kind {
        EventKind::OomKill {
            pod,
            comm,
            pid,
            global,
        } => {
            let scope = match global {
                Some(true) => "node-wide ",
                Some(false) => "cgroup ",
                None => "",
            };
            let whose = if pod.is_empty() {
                String::new()
            } else {
                format!(" of {pod}")
            };
            format!("{scope}OOM kill of {comm} ({pid}){whose}")
        }
        EventKind::Eviction {
            pod,
            signal,
            outcome,
        } => format!("eviction of {pod} for {signal}: {outcome}"),
        EventKind::ReclaimStall { pod, stall_ns } => {
            format!("reclaim stall {} ms {pod}", stall_ns / 1_000_000)
        }
        EventKind::KswapdWake { suppressed } => format!("kswapd wake (+{suppressed})"),
        EventKind::Threshold { threshold, met } => {
            format!(
                "threshold {threshold} {}",
                if *met { "met" } else { "no longer met" }
            )
        }
    }
}

fn mib(bytes: i64) -> String {
    format!("{:.0}Mi", bytes as f64 / f64::from(1u32 << 20))
}

fn rel_s(at_ms: u64, trigger_ms: u64) -> f64 {
    (at_ms as f64 - trigger_ms as f64) / 1e3
}

#[cfg(test)]
mod tests;
