//! Eviction thresholds and how a signal maps to what the kubelet reclaims and reports
//! (`pkg/kubelet/eviction/api/types.go`, `helpers.go`: `signalToResource`,
//! `signalToNodeCondition`, `GetThresholdQuantity`, `thresholdsMet`).

use std::{fmt, time::Duration};

use serde::Serialize;

use crate::{
    signals::{Signal, SignalObservation},
    units::quantity::{Format, Quantity},
};

/// The only operator the kubelet supports (`evictionapi.OpLessThan`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Operator {
    /// Met when the observed value is below the threshold (`<` in `memory.available<100Mi`).
    LessThan,
}

/// A threshold amount: a literal quantity or a share of the signal's capacity.
#[derive(Debug, Clone, PartialEq)]
pub enum ThresholdValue {
    /// An absolute amount in the signal's unit (`100Mi`, `1000` inodes).
    Quantity(Quantity),
    /// The kubelet keeps the share as a float32 fraction (`parsePercentage`), which is what the
    /// arithmetic uses; `percent` is the number as written, for display.
    Percentage {
        /// The share of capacity, `0.1` for `10%`.
        fraction: f32,
        /// The percentage as written, `10` for `10%`.
        percent: f64,
    },
}

impl ThresholdValue {
    /// `evictionapi.GetThresholdQuantity`: the amount for a signal with this capacity.
    pub fn resolve(&self, capacity: i64) -> Quantity {
        match self {
            Self::Quantity(q) => q.clone(),
            Self::Percentage { fraction, .. } => {
                // int64(float64(capacity.Value()) * float64(percentage)), float32 share and all:
                // 10% of 10Gi is 1073741840 bytes, 16 more than 1Gi, exactly as in the kubelet.
                let v = (capacity as f64 * f64::from(*fraction)) as i64;
                Quantity::new(v, Format::BinarySI)
            }
        }
    }
}

impl fmt::Display for ThresholdValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Quantity(q) => write!(f, "{q}"),
            Self::Percentage { percent, .. } => write!(f, "{percent}%"),
        }
    }
}

/// Where a threshold comes from. Together with the signal it identifies a threshold: the kubelet
/// allows one hard and one soft threshold per signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ThresholdSource {
    /// `evictionHard` / `--eviction-hard` (or the Linux defaults).
    EvictionHard,
    /// `evictionSoft` / `--eviction-soft`.
    EvictionSoft,
    /// The `allocatableMemory.available` copy of each hard `memory.available` threshold the
    /// kubelet adds when `enforceNodeAllocatable` contains `pods` (`addAllocatableThresholds`).
    Allocatable,
}

/// Identifies a threshold across configuration reloads and in the pressure state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ThresholdKey {
    /// The threshold's signal.
    pub signal: Signal,
    /// Where the threshold comes from.
    pub source: ThresholdSource,
}

/// One eviction threshold (`evictionapi.Threshold`).
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    /// The signal the threshold watches.
    pub signal: Signal,
    /// How the observation is compared with the value.
    pub operator: Operator,
    /// The amount below which the threshold is met.
    pub value: ThresholdValue,
    /// Zero for hard thresholds; how long a soft threshold must hold before it acts.
    pub grace_period: Duration,
    /// `evictionMinimumReclaim`: once met, the threshold stays met until `available` is this much
    /// above the value.
    pub min_reclaim: Option<ThresholdValue>,
    /// Where the threshold comes from.
    pub source: ThresholdSource,
    /// The threshold this one was copied from: `memory.available` for the allocatable copies,
    /// `nodefs.*` or `imagefs.*` for `containerfs.*` thresholds (`UpdateContainerFsThresholds`).
    pub derived_from: Option<Signal>,
}

impl Threshold {
    /// The signal and source that identify the threshold.
    pub fn key(&self) -> ThresholdKey {
        ThresholdKey {
            signal: self.signal,
            source: self.source,
        }
    }

    /// `isHardEvictionThreshold`: the kubelet decides by the grace period alone, so a soft
    /// threshold with a zero grace period acts as a hard one.
    pub fn is_hard(&self) -> bool {
        self.grace_period.is_zero()
    }

    /// The threshold amount for an observation's capacity.
    pub fn quantity(&self, capacity: i64) -> Quantity {
        self.value.resolve(capacity)
    }

    /// The minimum reclaim amount for an observation's capacity, if one is configured.
    pub fn min_reclaim_quantity(&self, capacity: i64) -> Option<Quantity> {
        self.min_reclaim.as_ref().map(|v| v.resolve(capacity))
    }

    /// `thresholdsMet` for one threshold: is `available` below the threshold (plus the minimum
    /// reclaim when `enforce_min_reclaim`)?
    pub fn is_met(&self, observed: &SignalObservation, enforce_min_reclaim: bool) -> bool {
        let mut quantity = self.quantity(observed.capacity);
        if enforce_min_reclaim && let Some(min) = self.min_reclaim_quantity(observed.capacity) {
            quantity.add(&min);
        }
        match self.operator {
            Operator::LessThan => quantity.nanos() > i128::from(observed.available) * 1_000_000_000,
        }
    }
}

/// The resource the kubelet reclaims for a signal (`signalToResource`), named as in its events
/// and eviction messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Resource {
    /// Reclaimed for `memory.available` and `allocatableMemory.available`.
    #[serde(rename = "memory")]
    Memory,
    /// Reclaimed for `nodefs.available`, `imagefs.available` and `containerfs.available`.
    #[serde(rename = "ephemeral-storage")]
    EphemeralStorage,
    /// Reclaimed for the `*.inodesFree` signals.
    #[serde(rename = "inodes")]
    Inodes,
    /// Reclaimed for `pid.available`.
    #[serde(rename = "pids")]
    Pids,
}

impl Resource {
    /// The kubelet's name for the resource (`memory`, `ephemeral-storage`, `inodes`, `pids`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::EphemeralStorage => "ephemeral-storage",
            Self::Inodes => "inodes",
            Self::Pids => "pids",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The node conditions the eviction manager reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum NodeConditionType {
    /// A memory signal's threshold is met.
    MemoryPressure,
    /// A nodefs, imagefs or containerfs threshold (bytes or inodes) is met.
    DiskPressure,
    /// The `pid.available` threshold is met.
    #[serde(rename = "PIDPressure")]
    PidPressure,
}

impl NodeConditionType {
    /// Every condition, in declaration order.
    pub const ALL: [NodeConditionType; 3] = [
        NodeConditionType::MemoryPressure,
        NodeConditionType::DiskPressure,
        NodeConditionType::PidPressure,
    ];

    /// The condition's type as the Node status spells it (`PIDPressure`, not `PidPressure`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MemoryPressure => "MemoryPressure",
            Self::DiskPressure => "DiskPressure",
            Self::PidPressure => "PIDPressure",
        }
    }
}

impl fmt::Display for NodeConditionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `signalToResource`.
pub fn signal_resource(signal: Signal) -> Resource {
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Resource::Memory,
        Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
            Resource::EphemeralStorage
        }
        Signal::NodeFsInodesFree | Signal::ImageFsInodesFree | Signal::ContainerFsInodesFree => {
            Resource::Inodes
        }
        Signal::PidAvailable => Resource::Pids,
    }
}

/// Whether pods are ranked by their disk usage (bytes or inodes) for `signal`: the starved
/// resource is ephemeral storage or inodes.
pub fn ranks_by_disk(signal: Signal) -> bool {
    matches!(
        signal_resource(signal),
        Resource::EphemeralStorage | Resource::Inodes
    )
}

/// `signalToNodeCondition`.
pub fn signal_condition(signal: Signal) -> NodeConditionType {
    match signal_resource(signal) {
        Resource::Memory => NodeConditionType::MemoryPressure,
        Resource::EphemeralStorage | Resource::Inodes => NodeConditionType::DiskPressure,
        Resource::Pids => NodeConditionType::PidPressure,
    }
}

/// How the kubelet prints an observed amount (`makeSignalObservations`): bytes in binary SI,
/// inode and process counts in decimal SI.
pub fn signal_format(signal: Signal) -> Format {
    match signal_resource(signal) {
        Resource::Memory | Resource::EphemeralStorage => Format::BinarySI,
        Resource::Inodes | Resource::Pids => Format::DecimalSI,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pct(percent: f64) -> ThresholdValue {
        ThresholdValue::Percentage {
            fraction: (percent as f32) / 100.0,
            percent,
        }
    }

    fn threshold(value: ThresholdValue, min_reclaim: Option<ThresholdValue>) -> Threshold {
        Threshold {
            signal: Signal::MemoryAvailable,
            operator: Operator::LessThan,
            value,
            grace_period: Duration::ZERO,
            min_reclaim,
            source: ThresholdSource::EvictionHard,
            derived_from: None,
        }
    }

    const GI: i64 = 1 << 30;

    /// The kubelet docs' example: 10GiB of memory, `memory.available<10%` or `<1Gi`.
    #[test]
    fn percentage_resolves_with_the_kubelets_float32_share() {
        assert_eq!(pct(10.0).resolve(10 * GI).value(), 1_073_741_840);
        assert_eq!(pct(50.0).resolve(10 * GI).value(), 5 * GI);
        let literal = ThresholdValue::Quantity(Quantity::parse("1Gi").expect("1Gi"));
        assert_eq!(literal.resolve(10 * GI).value(), GI);
    }

    #[test]
    fn met_strictly_below_and_with_min_reclaim() {
        let obs = |available| SignalObservation {
            available,
            capacity: 10 * GI,
        };
        let t = threshold(
            ThresholdValue::Quantity(Quantity::parse("1Gi").expect("q")),
            None,
        );
        assert!(t.is_met(&obs(GI - 1), false));
        assert!(!t.is_met(&obs(GI), false), "equal is not below");
        // Minimum reclaim 500Mi: once met, the kubelet keeps reclaiming until 1.5Gi is available.
        let t = threshold(
            ThresholdValue::Quantity(Quantity::parse("1Gi").expect("q")),
            Some(ThresholdValue::Quantity(
                Quantity::parse("500Mi").expect("q"),
            )),
        );
        let target = GI + 500 * (1 << 20);
        assert!(!t.is_met(&obs(GI + 1), false));
        assert!(t.is_met(&obs(GI + 1), true));
        assert!(t.is_met(&obs(target - 1), true));
        assert!(!t.is_met(&obs(target), true));
    }

    #[test]
    fn signal_mappings() {
        for (signal, resource, condition, format) in [
            (
                Signal::AllocatableMemoryAvailable,
                Resource::Memory,
                NodeConditionType::MemoryPressure,
                Format::BinarySI,
            ),
            (
                Signal::ImageFsAvailable,
                Resource::EphemeralStorage,
                NodeConditionType::DiskPressure,
                Format::BinarySI,
            ),
            (
                Signal::ContainerFsInodesFree,
                Resource::Inodes,
                NodeConditionType::DiskPressure,
                Format::DecimalSI,
            ),
            (
                Signal::PidAvailable,
                Resource::Pids,
                NodeConditionType::PidPressure,
                Format::DecimalSI,
            ),
            (
                Signal::NodeFsInodesFree,
                Resource::Inodes,
                NodeConditionType::DiskPressure,
                Format::DecimalSI,
            ),
            (
                Signal::NodeFsAvailable,
                Resource::EphemeralStorage,
                NodeConditionType::DiskPressure,
                Format::BinarySI,
            ),
        ] {
            assert_eq!(signal_resource(signal), resource, "{signal:?}");
            assert_eq!(signal_condition(signal), condition, "{signal:?}");
            assert_eq!(signal_format(signal), format, "{signal:?}");
        }
        assert_eq!(
            serde_json::to_string(&NodeConditionType::PidPressure).expect("json"),
            "\"PIDPressure\""
        );
    }
}
