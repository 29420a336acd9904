//! What a decision reports: the thresholds met, the conditions, the reclaim, the evictions.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::{
    eviction::predict::Prediction,
    eviction::rank::RankedPod,
    signals::Signal,
    signals::threshold::{NodeConditionType, Operator, Resource, ThresholdSource},
};

/// Why a threshold counts as met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetReason {
    /// The signal is below the threshold.
    BelowThreshold,
    /// The signal is above the threshold but below threshold plus minimum reclaim, and the
    /// threshold was acted on last time.
    MinimumReclaimPending,
    /// A hard `memory.available` threshold not crossed yet, but the kernel's OOM point is
    /// nearer than an eviction's lead ([`crate::eviction::predict`]).
    Predicted,
}

/// A threshold that is met, with its grace status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThresholdReport {
    /// The threshold's signal.
    pub signal: Signal,
    /// Where the threshold comes from.
    pub source: ThresholdSource,
    /// A hard threshold (zero grace period).
    pub hard: bool,
    /// The comparison (always `LessThan`).
    pub operator: Operator,
    /// As configured: `100Mi`, `10%`.
    pub value: String,
    /// The threshold for this observation's capacity, base units.
    pub quantity: i64,
    /// The observed value, base units.
    pub available: i64,
    /// The observed capacity, base units.
    pub capacity: i64,
    /// The minimum reclaim for this capacity, base units.
    pub min_reclaim: Option<i64>,
    /// Why the threshold counts as met.
    pub reason: MetReason,
    /// The configured grace period (0 for hard thresholds).
    pub grace_period_seconds: f64,
    /// Time since the threshold was first observed met.
    pub met_for_seconds: f64,
    /// The grace period has elapsed: the threshold drives eviction.
    pub grace_period_elapsed: bool,
    /// Time left before the grace period elapses (0 once it has).
    pub grace_remaining_seconds: f64,
}

/// A node condition the eviction manager owns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConditionReport {
    /// The condition's type.
    #[serde(rename = "type")]
    pub condition: NodeConditionType,
    /// Reported true: observed within the pressure transition period.
    pub status: bool,
    /// A threshold mapping to this condition is met in this observation.
    pub observed_now: bool,
    /// With `status` true and not observed now: time left before it turns false.
    pub transition_remaining_seconds: Option<f64>,
}

/// The threshold chosen for reclaim.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReclaimReport {
    /// The chosen threshold's signal.
    pub signal: Signal,
    /// The resource reclaimed for that signal.
    pub resource: Resource,
    /// Where the threshold comes from.
    pub source: ThresholdSource,
    /// A hard threshold (zero grace period).
    pub hard: bool,
    /// Threshold, base units.
    pub quantity: i64,
    /// The observed value, base units.
    pub available: i64,
    /// The minimum reclaim, base units.
    pub min_reclaim: Option<i64>,
    /// Threshold plus minimum reclaim minus available, base units.
    pub shortfall: i64,
}

/// One eviction to carry out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Eviction {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (a precondition of the eviction, so a re-created pod of the same name is
    /// not hit).
    pub uid: String,
    /// Never 0 (a force delete through the API).
    pub grace_period_seconds: i64,
    /// The signal whose threshold drives the eviction.
    pub signal: Signal,
    /// The resource reclaimed.
    pub resource: Resource,
    /// Driven by a hard threshold.
    pub hard: bool,
    /// `Evicted`.
    pub reason: &'static str,
    /// Worded as the kubelet words it.
    pub message: String,
    /// The annotations the kubelet puts on its eviction event.
    pub annotations: BTreeMap<String, String>,
}

/// The outcome of one decision, with its reasons.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Every threshold met, grace period elapsed or not.
    pub thresholds_met: Vec<ThresholdReport>,
    /// Every pressure condition, reported or not.
    pub conditions: Vec<ConditionReport>,
    /// The threshold reclaimed for; `None` when no threshold's grace period has elapsed.
    pub reclaim: Option<ReclaimReport>,
    /// Eviction order for the reclaimed resource (empty when nothing is reclaimed).
    pub ranked: Vec<RankedPod>,
    /// The pods to evict, in order (at most `maxPodsPerCycle`; critical pods never).
    pub evict: Vec<Eviction>,
    /// Configured signals with no observation (their thresholds cannot be evaluated).
    pub unobserved_signals: Vec<Signal>,
    /// The prediction a `predicted` threshold rests on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<Prediction>,
}

/// A decision as `explain` shows it, offline and from the agent's node API alike: the report
/// with the reclaimed signal first and its details apart, how long the thresholds were taken as
/// held, the pods left out as inactive, the configuration's warnings and the working-set formula
/// of the memory signals.
pub fn explain_json(
    decision: &Decision,
    held_for: std::time::Duration,
    inactive: &[String],
    warnings: &[String],
    memory_working_set: crate::signals::MemoryWorkingSet,
) -> serde_json::Result<serde_json::Value> {
    use serde_json::{Value, json};
    let mut out = serde_json::to_value(decision)?;
    if let Value::Object(map) = &mut out {
        let details = map.remove("reclaim").unwrap_or(Value::Null);
        map.insert(
            "reclaim".into(),
            details.get("signal").cloned().unwrap_or(Value::Null),
        );
        map.insert("reclaim_details".into(), details);
        map.insert("held_for_seconds".into(), json!(held_for.as_secs_f64()));
        map.insert("inactive_pods".into(), json!(inactive));
        map.insert("warnings".into(), json!(warnings));
        map.insert(
            "memory_working_set".into(),
            json!({
                "setting": memory_working_set.as_str(),
                "formula": memory_working_set.formula(),
            }),
        );
    }
    Ok(out)
}
