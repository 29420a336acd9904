//! How a flight record is shown, by the agent's node API and `trace --flight` as by
//! `kubectl node-monitor flight`: its JSON answer, a few lines of text, its SVG timeline
//! ([`svg`]). The recording itself is [`node_monitor_core::flight`].
use serde_json::{Value, json};

pub use node_monitor_core::flight::{EventKind, FlightRecord, Sample};

pub mod svg;

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
    if let Some((s, p)) = before
        .iter()
        .rev()
        .find_map(|s| s.prediction.map(|p| (*s, p)))
    {
        out.push_str(&format!(
            "  predicted at {:+.1} s: falling {}/s, {} left, exhaustion in {:.1} s, lead {:.1} s\n",
            rel_s(s.at_ms, at),
            mib(p.rate_bytes_per_second),
            mib(p.headroom_bytes),
            p.exhaustion_ms as f64 / 1000.0,
            p.lead_ms as f64 / 1000.0
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
pub(crate) mod tests;
