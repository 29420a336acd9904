//! The node API's contract, which the agent serves and `kubectl node-monitor` calls: its paths,
//! the header that carries the caller's token through the API server's pod proxy, its bounds,
//! and its answers as typed wire structs ([`StatusAnswer`], [`TraceAnswer`], [`FlightAnswer`]):
//! the agent writes them, the plugin reads them. Time is `crate::flight::utc`'s. docs/cli.md
//! describes the answers.

pub mod names;

/// The agent's status: its configuration in force, the last decision, recent evictions.
pub const STATUS_PATH: &str = "/node-monitor/v1/status";
/// The live explain of the last decision.
pub const EXPLAIN_PATH: &str = "/node-monitor/v1/explain";
/// Recent kernel events, attributed to pods.
pub const TRACE_PATH: &str = "/node-monitor/v1/trace";
/// The OOM flight recorder's records (docs/runbook.md).
pub const FLIGHT_PATH: &str = "/node-monitor/v1/flight";
/// The header that carries the caller's bearer token through the pod proxy (which drops
/// `Authorization`).
pub const TOKEN_HEADER: &str = "x-node-monitor-token";
/// The most events one `trace` answer carries.
pub const TRACE_PAGE_MAX: usize = 1024;
/// The longest token the node API accepts (service-account and OIDC tokens are a few KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The `status` answer of one agent ([`STATUS_PATH`]). Every field has a default, so an answer
/// of an older or newer agent still reads; `error` alone is set when the agent's view is
/// unavailable, or by a client for an agent it could not reach.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StatusAnswer {
    /// The node the agent runs on.
    pub node: String,
    /// Why there is no status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The agent decides and reports but evicts nothing.
    pub dry_run: bool,
    /// `/readyz`, and why.
    pub ready: bool,
    /// `/readyz`'s explanation.
    pub readiness: String,
    /// The sources and probes the agent runs without.
    pub degraded: Vec<String>,
    /// When the last decision's observations were taken (Unix ms); `None` before the first.
    pub observed_at_ms: Option<u64>,
    /// Every threshold in force, with what the last pass observed of its signal.
    pub thresholds: Vec<ThresholdStatus>,
    /// The pressure conditions of the last decision.
    pub conditions: Vec<ConditionStatus>,
    /// The recent evictions, newest first.
    pub recent_evictions: Vec<EvictionEntry>,
    /// Configuration warnings.
    pub warnings: Vec<String>,
    /// The guarantees the node gives (docs/guarantees.md), as the node annotation shows them.
    pub guarantees: Value,
    /// The agent's version and commit (`0.1.0 (commit 1a2b3c4d5e6f)`); empty from an agent older
    /// than the field.
    pub agent_version: String,
}

/// One threshold in a [`StatusAnswer`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ThresholdStatus {
    /// The kubelet's signal name (`memory.available`).
    pub signal: String,
    /// `hard` or `soft`.
    pub kind: String,
    /// The threshold as configured (`100Mi`, `10%`).
    pub value: String,
    /// A soft threshold's grace period.
    pub grace_period_seconds: f64,
    /// What the last pass observed; `None` when it did not observe the signal.
    pub available: Option<i64>,
    /// The signal's capacity in that pass.
    pub capacity: Option<i64>,
    /// The threshold's quantity at that capacity.
    pub threshold: Option<i64>,
    /// `available - threshold`.
    pub headroom: Option<i64>,
    /// Whether the threshold was met.
    pub met: Option<bool>,
}

/// One pressure condition in a [`StatusAnswer`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ConditionStatus {
    /// The condition's type (`NodeMonitorMemoryPressure`).
    #[serde(rename = "type")]
    pub type_: String,
    /// Reported true.
    pub status: bool,
    /// A threshold of this condition is met in the last observation.
    pub observed_now: bool,
    /// With `status` true and not observed now: time left before it turns false.
    pub transition_remaining_seconds: Option<f64>,
}

/// One recent eviction in a [`StatusAnswer`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct EvictionEntry {
    /// When it was answered (Unix ms).
    pub at_ms: u64,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The signal it was evicted for.
    pub signal: String,
    /// `hard` or `soft`.
    pub kind: String,
    /// How the API answered (`evicted`, `pdb_blocked`, …).
    pub outcome: String,
    /// The eviction's message, as the pod's Event says it.
    pub message: String,
}

/// The `trace` answer of one agent ([`TRACE_PATH`]): a page of its kernel events.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TraceAnswer {
    /// The node the agent runs on.
    pub node: String,
    /// The `since` of the next page.
    pub next: u64,
    /// Events dropped between `since` and the oldest kept.
    pub missed: u64,
    /// How many events the agent keeps.
    pub capacity: usize,
    /// The events, oldest first: each a kernel event attributed to its pod (docs/trace.md).
    pub events: Vec<Value>,
}

/// The `flight` answer of one agent ([`FLIGHT_PATH`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlightAnswer {
    /// The node the agent runs on.
    pub node: String,
    /// How much history a record holds before its event, in seconds.
    pub window_seconds: u64,
    /// How much a record holds after it, in seconds.
    pub tail_seconds: u64,
    /// How many records the agent keeps.
    pub capacity: usize,
    /// The records, newest first (node_monitor_base::flight_view's JSON).
    pub records: Vec<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer reads back as it was written, and an answer with fields missing or added (an
    /// older or newer agent) still reads.
    #[test]
    fn answers_round_trip_and_tolerate_other_versions() {
        let status = StatusAnswer {
            node: "n1".into(),
            ready: true,
            observed_at_ms: Some(5),
            thresholds: vec![ThresholdStatus {
                signal: "memory.available".into(),
                kind: "hard".into(),
                value: "100Mi".into(),
                available: Some(1),
                met: Some(true),
                ..ThresholdStatus::default()
            }],
            conditions: vec![ConditionStatus {
                type_: "NodeMonitorMemoryPressure".into(),
                status: true,
                ..ConditionStatus::default()
            }],
            ..StatusAnswer::default()
        };
        let text = serde_json::to_string(&status).expect("serialize");
        assert!(
            text.contains(r#""type":"NodeMonitorMemoryPressure""#),
            "{text}"
        );
        assert!(!text.contains("error"), "{text}");
        assert_eq!(
            serde_json::from_str::<StatusAnswer>(&text).expect("parse"),
            status
        );
        let other: StatusAnswer = serde_json::from_str(
            r#"{"node":"n2","future_field":1,"thresholds":[{"signal":"pid.available"}]}"#,
        )
        .expect("a newer agent's answer");
        assert_eq!(other.node, "n2");
        assert_eq!(other.thresholds[0].met, None);
        let trace: TraceAnswer =
            serde_json::from_str(r#"{"node":"n1","events":[{"kind":"oom_kill"}]}"#).expect("trace");
        assert_eq!(trace.events.len(), 1);
    }
}
