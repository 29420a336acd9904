//! One pass of the agent's loop as the flight recorder keeps it: the signals, the top pods,
//! PSI, the thresholds met, the evictions chosen and the prediction.
use serde::{Deserialize, Serialize};

/// One signal as the agent observed it, with its thresholds for that capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalPoint {
    /// `memory.available`, `allocatableMemory.available`.
    pub signal: String,
    /// Bytes left.
    pub available: i64,
    /// Bytes in all.
    pub capacity: i64,
    /// The hard threshold for this capacity, bytes, if one is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard: Option<i64>,
    /// The soft threshold for this capacity, bytes, if one is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soft: Option<i64>,
}

impl SignalPoint {
    /// Whether `available` is below a configured threshold (hard or soft).
    pub fn below_threshold(&self) -> bool {
        self.hard.is_some_and(|t| self.available < t)
            || self.soft.is_some_and(|t| self.available < t)
    }
}

/// One pod's memory working set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodPoint {
    /// `namespace/name`, or the UID when the pod is not known by name.
    pub pod: String,
    /// Bytes.
    pub working_set: u64,
}

/// Memory pressure stall information (`/proc/pressure/memory` or the node cgroup's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PsiPoint {
    /// `some avg10`, percent.
    pub some_avg10: f64,
    /// `full avg10`, percent.
    pub full_avg10: f64,
    /// `some total`, microseconds.
    pub some_total_us: u64,
    /// `full total`, microseconds.
    pub full_total_us: u64,
}

/// One pass of the agent's loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// When, milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The memory signals observed.
    pub signals: Vec<SignalPoint>,
    /// The largest pods by working set (at most [`TOP_PODS`]), from the latest pod figures.
    pub top_pods: Vec<PodPoint>,
    /// How old those pod figures were, milliseconds (`None`: no figures yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_figures_age_ms: Option<u64>,
    /// PSI, when the agent could read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiPoint>,
    /// Thresholds met in this pass (`memory.available hard`).
    #[serde(default)]
    pub thresholds_met: Vec<String>,
    /// Pods the decision chose to evict (`namespace/name`).
    #[serde(default)]
    pub evict: Vec<String>,
    /// The prediction a `predicted` threshold of this pass rests on: the rate, the headroom,
    /// the time to exhaustion and the lead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prediction: Option<PredictionPoint>,
}

/// A predicted crossing as a sample keeps it (the eviction pipeline's prediction).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PredictionPoint {
    /// The headroom's fall, bytes per second.
    pub rate_bytes_per_second: i64,
    /// What the node could still allocate before the kernel must OOM-kill, bytes.
    pub headroom_bytes: i64,
    /// The estimated time to exhaustion, milliseconds.
    pub exhaustion_ms: u64,
    /// The eviction's lead it was compared with, milliseconds.
    pub lead_ms: u64,
}
