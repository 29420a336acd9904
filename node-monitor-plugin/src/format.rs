//! The plugin's pure parts: which pods are agents, what an agent's answer means, the trace
//! filters, and the text, JSON and column outputs.
use std::fmt::Write as _;

use anyhow::bail;
use k8s_openapi::api::core::v1::Pod;
use node_monitor_core::contract::{EvictionEntry, StatusAnswer, ThresholdStatus, TraceAnswer};
use serde_json::{Value, json};

use super::AgentPod;

/// The agents' port when their pod names none.
pub const DEFAULT_PORT: u16 = 9101;

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
    Yaml,
    Columns,
}

impl std::str::FromStr for Output {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            "yaml" => Ok(Self::Yaml),
            "columns" | "wide" => Ok(Self::Columns),
            other => Err(format!(
                "output {other:?}: expected text, json, yaml or columns"
            )),
        }
    }
}

/// `value` as JSON (pretty) or YAML, for the structured outputs; `None` for the others.
pub fn structured<T: serde::Serialize + ?Sized>(
    output: Output,
    value: &T,
) -> anyhow::Result<Option<String>> {
    Ok(match output {
        Output::Json => Some(serde_json::to_string_pretty(value)?),
        Output::Yaml => Some(serde_norway::to_string(value)?.trim_end().to_owned()),
        Output::Text | Output::Columns => None,
    })
}

/// Which kernel events `trace` shows; every filter given must match.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TraceFilter {
    /// Only events of pods in this namespace.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Only events of this pod (by name).
    #[arg(long)]
    pub pod: Option<String>,
    /// Only events of this container (by name, or a prefix of its id).
    #[arg(long)]
    pub container: Option<String>,
    /// Only events of this node (only its agent is asked).
    #[arg(long)]
    pub node: Option<String>,
    /// Only these kinds (comma-separated): oom_kill, reclaim_stall, kswapd_wake, reboot.
    #[arg(long, value_delimiter = ',', value_parser = parse_kind)]
    pub kind: Vec<String>,
}

/// The kinds of kernel events the agents keep.
pub const TRACE_KINDS: [&str; 4] = ["oom_kill", "reclaim_stall", "kswapd_wake", "reboot"];

/// `--kind`: one of [`TRACE_KINDS`], else an error naming the value and the kinds.
pub fn parse_kind(s: &str) -> Result<String, String> {
    if TRACE_KINDS.contains(&s) {
        Ok(s.to_owned())
    } else {
        Err(format!(
            "{s:?} is not a kind of kernel event (one of {})",
            TRACE_KINDS.join(", ")
        ))
    }
}

impl TraceFilter {
    /// Whether `event` (with its `node`) passes.
    pub fn matches(&self, event: &Value) -> bool {
        let field = |k: &str| event.get(k).and_then(Value::as_str);
        let same =
            |want: &Option<String>, k: &str| want.as_deref().is_none_or(|w| field(k) == Some(w));
        let container = self.container.as_deref().is_none_or(|c| {
            field("container_name") == Some(c)
                || (!c.is_empty() && field("container_id").is_some_and(|id| id.starts_with(c)))
        });
        same(&self.namespace, "pod_namespace")
            && same(&self.pod, "pod_name")
            && same(&self.node, "node")
            && container
            && (self.kind.is_empty() || self.kind.iter().any(|k| field("kind") == Some(k)))
    }

    /// The events that pass, oldest first (by arrival at their agent).
    pub fn apply(&self, events: Vec<Value>) -> Vec<Value> {
        let mut out: Vec<Value> = events.into_iter().filter(|e| self.matches(e)).collect();
        out.sort_by_key(|e| {
            (
                e.get("received_at_ms").and_then(Value::as_u64).unwrap_or(0),
                e.get("node")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
                e.get("seq").and_then(Value::as_u64).unwrap_or(0),
            )
        });
        out
    }
}

/// The agent of a pod listed by the plugin: running, on a node, with an IP; its port is `port`,
/// else its container port named `metrics`, else [`DEFAULT_PORT`].
pub fn agent_pod(pod: &Pod, port: Option<u16>) -> Option<AgentPod> {
    let status = pod.status.as_ref()?;
    if status.phase.as_deref() != Some("Running")
        || status.pod_ip.as_deref().is_none_or(str::is_empty)
    {
        return None;
    }
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let spec = pod.spec.as_ref()?;
    let named = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("metrics"))
        .and_then(|p| u16::try_from(p.container_port).ok());
    Some(AgentPod {
        name: pod.metadata.name.clone()?,
        node: spec.node_name.clone()?,
        port: port.or(named).unwrap_or(DEFAULT_PORT),
    })
}

/// An agent's answer: its JSON on 200; otherwise an error that says what the status means.
pub fn agent_answer(status: u16, body: &[u8]) -> anyhow::Result<Value> {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let said = parsed
        .as_ref()
        .and_then(|v| v.get("error").or_else(|| v.get("message")))
        .and_then(Value::as_str)
        .map_or_else(
            || {
                String::from_utf8_lossy(&body[..body.len().min(300)])
                    .trim()
                    .to_owned()
            },
            str::to_owned,
        );
    match (status, parsed) {
        (200, Some(v)) => Ok(v),
        (200, None) => bail!("the agent's answer is not JSON: {said}"),
        (401, _) => bail!("401 Unauthorized: {said}"),
        (403, Some(v)) if v.get("kind").and_then(Value::as_str) == Some("Status") => bail!(
            "403 Forbidden by the API server (the pod proxy needs `get pods/proxy` in the agents' namespace): {said}"
        ),
        (403, _) => bail!(
            "403 Forbidden by the agent (it needs `get nodes/node-monitor` on the node): {said}"
        ),
        (404, _) => bail!(
            "404 Not Found: the agent does not serve the node API (an older version?): {said}"
        ),
        (code, _) => bail!("HTTP {code}: {said}"),
    }
}

/// The events of one agent's trace answer (the contract's [`TraceAnswer`]), each with its
/// node; an answer that does not read has none.
pub fn node_events(answer: &Value, node: &str) -> Vec<Value> {
    let Ok(page) = serde_json::from_value::<TraceAnswer>(answer.clone()) else {
        return Vec::new();
    };
    let node = if page.node.is_empty() {
        node.to_owned()
    } else {
        page.node
    };
    page.events
        .into_iter()
        .map(|mut e| {
            if let Value::Object(m) = &mut e {
                m.insert("node".into(), json!(node));
            }
            e
        })
        .collect()
}

pub use node_monitor_core::flight::utc;

/// A signal's amount: bytes in binary units, counts (PIDs, inodes) as they are.
pub fn amount(signal: &str, v: Option<i64>) -> String {
    let Some(v) = v else {
        return "-".to_owned();
    };
    if signal.starts_with("pid") || signal.contains("inodes") {
        return v.to_string();
    }
    let units = [("Gi", 1i64 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)];
    for (unit, size) in units {
        if v.abs() >= size {
            return format!("{:.1}{unit}", v as f64 / size as f64);
        }
    }
    v.to_string()
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

/// An agent's `status` answer read into the contract's type; an answer that does not read (not
/// the node API's) becomes an error answer that says so.
pub fn read_status(v: &Value) -> StatusAnswer {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| StatusAnswer {
        node: s(v, "node").to_owned(),
        error: Some(format!("the agent's status answer does not read: {e}")),
        ..StatusAnswer::default()
    })
}

/// One agent's `status` answer (or its error) as text.
pub fn status_text(v: &StatusAnswer) -> String {
    let mut out = String::new();
    let node = &v.node;
    if let Some(e) = &v.error {
        let _ = writeln!(out, "node {node}: error: {e}");
        return out;
    }
    let observed = v.observed_at_ms.map_or_else(|| "never".to_owned(), utc);
    let dry = if v.dry_run { " (dry run)" } else { "" };
    let _ = writeln!(
        out,
        "node {node}{dry}: {} ({}), observed {observed}",
        if v.ready { "ready" } else { "not ready" },
        v.readiness
    );
    thresholds_text(&mut out, &v.thresholds);
    let conditions: Vec<String> = v
        .conditions
        .iter()
        .map(|c| {
            let status = if c.status { "True" } else { "False" };
            format!("{}={status}", c.type_)
        })
        .collect();
    let _ = writeln!(
        out,
        "  conditions: {}",
        if conditions.is_empty() {
            "none".to_owned()
        } else {
            conditions.join(" ")
        }
    );
    let _ = writeln!(
        out,
        "  degraded: {}",
        if v.degraded.is_empty() {
            "none".to_owned()
        } else {
            v.degraded.join("; ")
        }
    );
    evictions_text(&mut out, &v.recent_evictions);
    out
}

/// The thresholds of a `status` answer, one line each, under a header.
fn thresholds_text(out: &mut String, thresholds: &[ThresholdStatus]) {
    let _ = writeln!(
        *out,
        "  {:<30} {:<5} {:<8} {:>10} {:>10} {:>10}  MET",
        "THRESHOLD", "KIND", "VALUE", "AVAILABLE", "THRESHOLD", "HEADROOM"
    );
    for t in thresholds {
        let signal = t.signal.as_str();
        let met = match t.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "unobserved",
        };
        let _ = writeln!(
            *out,
            "  {signal:<30} {:<5} {:<8} {:>10} {:>10} {:>10}  {met}",
            t.kind,
            t.value,
            amount(signal, t.available),
            amount(signal, t.threshold),
            amount(signal, t.headroom),
        );
    }
}

/// The recent evictions of a `status` answer, newest first.
fn evictions_text(out: &mut String, evictions: &[EvictionEntry]) {
    if evictions.is_empty() {
        let _ = writeln!(*out, "  recent evictions: none");
    } else {
        let _ = writeln!(*out, "  recent evictions (newest first):");
        for e in evictions {
            let _ = writeln!(
                *out,
                "    {} {}/{} {} {} {}: {}",
                utc(e.at_ms),
                e.namespace,
                e.name,
                e.signal,
                e.kind,
                e.outcome,
                e.message
            );
        }
    }
}

/// The thresholds met of a live explain, one phrase each.
fn thresholds_met(v: &Value) -> Vec<String> {
    v.get("thresholds_met")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| {
            format!(
                "{} {}{} (available {}, grace {})",
                s(t, "signal"),
                s(t, "value"),
                if s(t, "reason") == "predicted" {
                    " predicted"
                } else {
                    ""
                },
                amount(s(t, "signal"), t.get("available").and_then(Value::as_i64)),
                if t.get("grace_period_elapsed").and_then(Value::as_bool) == Some(true) {
                    "elapsed"
                } else {
                    "pending"
                }
            )
        })
        .collect()
}

/// The live explain as text: what would be evicted, in order, why, and the ranking.
pub fn explain_text(v: &Value) -> String {
    let mut out = String::new();
    let observed = v
        .get("observed_at_ms")
        .and_then(Value::as_u64)
        .map_or_else(|| "never".to_owned(), utc);
    let _ = writeln!(out, "node {}: decision of {observed}", s(v, "node"));
    let met = thresholds_met(v);
    let _ = writeln!(
        out,
        "thresholds met: {}",
        if met.is_empty() {
            "none".to_owned()
        } else {
            met.join("; ")
        }
    );
    match v.get("reclaim").and_then(Value::as_str) {
        Some(signal) => {
            let _ = writeln!(out, "reclaiming for: {signal}");
        }
        None => {
            let _ = writeln!(out, "reclaiming for: nothing (no threshold acts)");
        }
    }
    let evict = v
        .get("evict")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if evict.is_empty() {
        let _ = writeln!(out, "would evict: nobody");
    }
    for (i, e) in evict.iter().enumerate() {
        let _ = writeln!(
            out,
            "would evict #{}: {}/{} ({} {}): {}",
            i + 1,
            s(e, "namespace"),
            s(e, "name"),
            s(e, "signal"),
            if e.get("hard").and_then(Value::as_bool) == Some(true) {
                "hard"
            } else {
                "soft"
            },
            s(e, "message")
        );
    }
    let ranked = v
        .get("ranked")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !ranked.is_empty() {
        let _ = writeln!(out, "ranking (first is evicted first):");
        for (i, r) in ranked.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:>3}. {}/{} qos={} priority={} usage={} exceeds_request={}{}",
                i + 1,
                s(r, "namespace"),
                s(r, "name"),
                s(r, "qos"),
                r.get("priority").and_then(Value::as_i64).unwrap_or(0),
                r.get("usage")
                    .and_then(Value::as_i64)
                    .map_or_else(|| "-".to_owned(), |u| u.to_string()),
                r.get("exceeds_request")
                    .and_then(Value::as_bool)
                    .map_or("-", |b| if b { "yes" } else { "no" }),
                if r.get("critical").and_then(Value::as_bool) == Some(true) {
                    " (critical: skipped)"
                } else {
                    ""
                }
            );
        }
    }
    out
}

/// The pod an event belongs to, `namespace/name`, else its UID, else `-`.
fn event_pod(e: &Value) -> String {
    match (
        e.get("pod_namespace").and_then(Value::as_str),
        e.get("pod_name").and_then(Value::as_str),
    ) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        _ => e
            .get("pod_uid")
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_owned(),
    }
}

/// The kind-specific part of an event, short.
fn event_detail(e: &Value) -> String {
    let num = |k: &str| e.get(k).and_then(Value::as_i64);
    match s(e, "kind") {
        "oom_kill" => format!(
            "oom={} rss={}",
            e.get("scope").and_then(Value::as_str).unwrap_or("unknown"),
            amount("memory", num("rss_bytes"))
        ),
        "reclaim_stall" => format!(
            "{} reclaim {:.1}ms in {} episodes",
            s(e, "flavor"),
            num("stall_ns").unwrap_or(0) as f64 / 1e6,
            num("count").unwrap_or(0)
        ),
        "kswapd_wake" => format!(
            "nid={} order={}",
            num("nid").unwrap_or(0),
            num("order").unwrap_or(0)
        ),
        "reboot" => format!("cmd={}", s(e, "cmd")),
        _ => String::new(),
    }
}

fn event_container(e: &Value) -> String {
    e.get("container_name")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| {
            e.get("container_id")
                .and_then(Value::as_str)
                .map(|id| id.chars().take(12).collect())
        })
        .unwrap_or_else(|| "-".to_owned())
}

/// The events in `output`: JSON lines, one text line each, or columns under a header.
pub fn trace_output(events: &[Value], output: Output) -> String {
    let at = |e: &Value| {
        e.get("received_at_ms")
            .and_then(Value::as_u64)
            .map_or_else(|| "-".to_owned(), utc)
    };
    match output {
        Output::Json => events
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        // One YAML document per event, as JSON has one line per event.
        Output::Yaml => events
            .iter()
            .map(|e| {
                format!(
                    "---\n{}",
                    serde_norway::to_string(e).unwrap_or_default().trim_end()
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Output::Text => events
            .iter()
            .map(|e| {
                format!(
                    "{} {} {:<13} pid={} comm={} pod={} container={} {}",
                    at(e),
                    s(e, "node"),
                    s(e, "kind"),
                    e.get("pid").and_then(Value::as_u64).unwrap_or(0),
                    e.get("comm").and_then(Value::as_str).unwrap_or("-"),
                    event_pod(e),
                    event_container(e),
                    event_detail(e)
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Output::Columns => {
            let mut rows = vec![[
                "TIME".to_owned(),
                "NODE".to_owned(),
                "KIND".to_owned(),
                "POD".to_owned(),
                "CONTAINER".to_owned(),
                "PID".to_owned(),
                "COMM".to_owned(),
                "DETAIL".to_owned(),
            ]];
            for e in events {
                rows.push([
                    at(e),
                    s(e, "node").to_owned(),
                    s(e, "kind").to_owned(),
                    event_pod(e),
                    event_container(e),
                    e.get("pid")
                        .and_then(Value::as_u64)
                        .unwrap_or(0)
                        .to_string(),
                    e.get("comm")
                        .and_then(Value::as_str)
                        .unwrap_or("-")
                        .to_owned(),
                    event_detail(e),
                ]);
            }
            columns(&rows)
        }
    }
}

/// Rows aligned in columns two spaces apart; the last column unpadded.
fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    rows.iter()
        .map(|r| {
            let mut line = String::new();
            for (i, c) in r.iter().enumerate() {
                if i + 1 == N {
                    line.push_str(c);
                } else {
                    let _ = write!(line, "{c:<w$}  ", w = widths[i]);
                }
            }
            line.trim_end().to_owned()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;
