//! The agent's metric label sets, and the per-unit gauge families of the eviction signals.
use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{family::Family, gauge::Gauge},
};

use super::Reg;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub eviction_signal: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThresholdLabels {
    pub eviction_signal: String,
    /// `hard` or `soft`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConditionLabels {
    pub condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    pub eviction_signal: String,
    /// `hard` or `soft`: the kind of threshold that drove the eviction.
    pub threshold: String,
    /// `evicted`, `pdb_blocked`, `escalated`, `dry_run`, `gone`, `throttled`, `failed`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitKindLabels {
    /// `emptydir`, `pod` or `container`: the local-storage limit the pod went over.
    pub kind: String,
    /// As in `node_monitor_evictions_total`.
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OomLabels {
    /// `global` (node-level OOM) or `pod` (a pod or container limit).
    pub scope: String,
    /// The killed pod's namespace (empty for a kill in no pod). Not `namespace`: a Prometheus
    /// scraping through a ServiceMonitor gives every series the agent pod's own `namespace` and
    /// `pod` target labels, which would hide these.
    pub pod_namespace: String,
    /// The killed pod's name (its UID when its name is not known; empty for a kill in no pod).
    pub pod_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeletSourceLabels {
    /// `file`, `drop_in` or `command_line`.
    pub kind: String,
    /// The file's path, or the program and its process ID.
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuaranteeLabels {
    /// `reboot-probe`, `core-reads`, `memcg-thresholds`, `psi-trigger`, `memory-push`,
    /// `kubelet-config` (`node_monitor_core::guarantees::Guarantee`).
    pub guarantee: String,
    /// `yes`, `no`, `not_applicable`.
    pub holds: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubepodsLabels {
    /// `systemd`, `cgroupfs` or `unknown` (not yet detected).
    pub driver: String,
    /// The kubepods cgroup's directory as the agent reads it.
    pub path: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProgramLabels {
    pub program: String,
    /// `attached`, `degraded`, `loaded`, `failed`, `disabled`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceStateLabels {
    pub source: String,
    /// `active`, `unavailable`.
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
}

/// A Kubernetes API call of the agent (`node_monitor_api_errors_total{operation}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[expect(
    non_camel_case_types,
    reason = "the derive writes a variant's name as the label value, which is snake_case"
)]
pub enum ApiOperation {
    /// An eviction request (policy/v1 Eviction).
    evict,
    /// The node's conditions.
    patch_conditions,
    /// A node taint.
    patch_taint,
    /// The node's `spec.unschedulable` (graceful shutdown).
    patch_unschedulable,
    /// A node annotation (graceful shutdown).
    patch_annotation,
    /// A pod deletion (graceful shutdown).
    delete_pod,
    /// The node's pods listed (graceful shutdown).
    list_pods,
    /// The last gasp's node writes.
    last_gasp,
}

impl ApiOperation {
    /// Every operation, each series created at start-up at 0.
    pub const ALL: [ApiOperation; 8] = [
        Self::evict,
        Self::patch_conditions,
        Self::patch_taint,
        Self::patch_unschedulable,
        Self::patch_annotation,
        Self::delete_pod,
        Self::list_pods,
        Self::last_gasp,
    ];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub operation: ApiOperation,
}

/// The base unit of an eviction signal's amounts. Each unit has its own families
/// (`node_monitor_signal_available_bytes`, `_inodes`, `_pids`): one family never mixes units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalUnit {
    /// Memory and filesystem space.
    Bytes,
    /// Filesystem inodes.
    Inodes,
    /// Process IDs.
    Pids,
}

impl SignalUnit {
    /// Every unit, in the order the families are registered.
    pub const ALL: [SignalUnit; 3] = [SignalUnit::Bytes, SignalUnit::Inodes, SignalUnit::Pids];

    /// The family name's unit suffix, as Prometheus conventions spell it.
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }
}

/// One gauge family per [`SignalUnit`], for an amount that every signal has in its own unit.
#[derive(Clone, Debug)]
pub struct PerUnit<L> {
    pub bytes: Family<L, Gauge>,
    pub inodes: Family<L, Gauge>,
    pub pids: Family<L, Gauge>,
}

impl<L: Clone + std::hash::Hash + Eq> Default for PerUnit<L> {
    fn default() -> Self {
        Self {
            bytes: Family::default(),
            inodes: Family::default(),
            pids: Family::default(),
        }
    }
}

impl<L> PerUnit<L>
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
{
    /// The family of `unit`.
    pub fn unit(&self, unit: SignalUnit) -> &Family<L, Gauge> {
        match unit {
            SignalUnit::Bytes => &self.bytes,
            SignalUnit::Inodes => &self.inodes,
            SignalUnit::Pids => &self.pids,
        }
    }

    /// Registers `<name>_bytes`, `<name>_inodes` and `<name>_pids`.
    pub(super) fn register(&self, reg: &mut Reg, name: &str, help: &str) {
        for unit in SignalUnit::ALL {
            let suffix = unit.suffix();
            reg.add(
                &format!("{name}_{suffix}"),
                &format!("{help}, in {suffix}"),
                self.unit(unit).clone(),
            );
        }
    }
}
