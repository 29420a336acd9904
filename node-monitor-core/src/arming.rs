//! Arming: which wake-ups to set after a pass, as pure policies of the thresholds and the last
//! readings. Here, the cgroup v1 memcg thresholds, like the kubelet's `memoryThresholdNotifier`s:
//! one per `memory.available` threshold on the node cgroup, one per
//! `allocatableMemory.available` threshold on the kubepods cgroup (capacity = allocatable). Each
//! threshold has a second level where its near band begins, the edge at which adaptive sampling
//! takes over and the pods are read ahead of the crossing. The eBPF memory push's batches are
//! [`crate::arming::mem_push`]'s.

pub mod mem_push;
use serde::Serialize;

use crate::{signals::Signal, signals::threshold::Threshold};

/// Which memory cgroup a memcg threshold watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MemcgTarget {
    /// The node cgroup (`memory.available`).
    Node,
    /// The kubepods cgroup (`allocatableMemory.available`).
    Allocatable,
}

/// One cgroup's memory as the last pass read it: its capacity, and the page cache its working set
/// leaves out (`inactive_file`, plus the reclaimable active file pages with
/// `memoryWorkingSet: reclaimable`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The cgroup's capacity in bytes (the node's memory, or the allocatable).
    pub capacity: u64,
    /// The page cache the working set leaves out, in bytes.
    pub file_outside_working_set: u64,
}

/// The thresholds to arm on one cgroup: levels on `available` in bytes, with the capacity of
/// that cgroup from the last pass and the page cache its working set left out, so the level on
/// `memory.usage_in_bytes` follows the same formula as the signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemcgArming {
    /// The cgroup watched.
    pub target: MemcgTarget,
    /// The levels of `available`, in bytes, ascending: each threshold and its near band's edge.
    pub levels: Vec<u64>,
    /// The cgroup's capacity in bytes.
    pub capacity: u64,
    /// The page cache the working set leaves out, in bytes.
    pub file_outside_working_set: u64,
}

/// What to arm given the configured thresholds and the last readings of the node and kubepods
/// memory. A target without a reading (not read yet, no allocatable) or without a threshold of
/// its signal is left as it is.
pub fn memcg_arming(
    thresholds: &[Threshold],
    node: Option<CgroupMemory>,
    kubepods: Option<CgroupMemory>,
) -> Vec<MemcgArming> {
    [
        (MemcgTarget::Node, Signal::MemoryAvailable, node),
        (
            MemcgTarget::Allocatable,
            Signal::AllocatableMemoryAvailable,
            kubepods,
        ),
    ]
    .into_iter()
    .filter_map(|(target, signal, reading)| {
        let m = reading?;
        let capacity = i64::try_from(m.capacity).unwrap_or(i64::MAX);
        let mut levels: Vec<u64> = thresholds
            .iter()
            .filter(|t| t.signal == signal)
            .filter_map(|t| u64::try_from(t.quantity(capacity).value()).ok())
            .flat_map(|level| [Some(level), approach_level(level, m.capacity)])
            .flatten()
            .collect();
        levels.sort_unstable();
        levels.dedup();
        (!levels.is_empty()).then_some(MemcgArming {
            target,
            levels,
            capacity: m.capacity,
            file_outside_working_set: m.file_outside_working_set,
        })
    })
    .collect()
}

/// The level at which `available` enters a threshold's near band (see
/// [`crate::eviction::headroom::near_band`]): crossing it wakes the agent, whose adaptive
/// sampling then looks every `fastSamplingInterval` and reads the pods ahead of the crossing
/// ([`crate::eviction::pod_figures`]). `None` when the band reaches the capacity.
fn approach_level(level: u64, capacity: u64) -> Option<u64> {
    let band = crate::eviction::headroom::near_band(i128::from(level), i128::from(capacity));
    u64::try_from(i128::from(level) + band)
        .ok()
        .filter(|l| *l < capacity)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{
        signals::threshold::{Operator, ThresholdSource, ThresholdValue},
        units::quantity::{Format, Quantity},
    };

    use super::*;

    const MIB: u64 = 1 << 20;

    fn threshold(signal: Signal, bytes: u64, source: ThresholdSource) -> Threshold {
        Threshold {
            signal,
            operator: Operator::LessThan,
            value: ThresholdValue::Quantity(Quantity::new(
                i64::try_from(bytes).expect("fits"),
                Format::BinarySI,
            )),
            grace_period: Duration::ZERO,
            min_reclaim: None,
            source,
            derived_from: None,
        }
    }

    fn reading(capacity: u64, inactive_file: u64) -> CgroupMemory {
        CgroupMemory {
            capacity,
            file_outside_working_set: inactive_file,
        }
    }

    #[test]
    fn node_and_allocatable_thresholds_are_armed_on_their_cgroups() {
        let thresholds = [
            threshold(
                Signal::MemoryAvailable,
                100 * MIB,
                ThresholdSource::EvictionHard,
            ),
            threshold(
                Signal::MemoryAvailable,
                300 * MIB,
                ThresholdSource::EvictionSoft,
            ),
            threshold(
                Signal::AllocatableMemoryAvailable,
                100 * MIB,
                ThresholdSource::Allocatable,
            ),
            threshold(
                Signal::NodeFsAvailable,
                100 * MIB,
                ThresholdSource::EvictionHard,
            ),
        ];
        let node = reading(4096 * MIB, 50 * MIB);
        let kubepods = reading(3000 * MIB, 20 * MIB);
        assert_eq!(
            memcg_arming(&thresholds, Some(node), Some(kubepods)),
            vec![
                MemcgArming {
                    target: MemcgTarget::Node,
                    // 100 and 300 MiB, and where their near bands (a tenth of the capacity,
                    // 409.6 MiB, larger than either threshold) begin.
                    levels: vec![
                        100 * MIB,
                        300 * MIB,
                        100 * MIB + 4096 * MIB / 10,
                        300 * MIB + 4096 * MIB / 10
                    ],
                    capacity: 4096 * MIB,
                    file_outside_working_set: 50 * MIB,
                },
                MemcgArming {
                    target: MemcgTarget::Allocatable,
                    // 100 MiB, and 300 MiB (a tenth of 3000 MiB) above it.
                    levels: vec![100 * MIB, 400 * MIB],
                    capacity: 3000 * MIB,
                    file_outside_working_set: 20 * MIB,
                },
            ]
        );
    }

    /// With `memoryWorkingSet: reclaimable` the sampler leaves reclaimable active page cache
    /// out of the working set; the armed usage level must sit that much higher, or the kernel
    /// notifies while the signal is still far above its threshold.

    #[test]
    fn percentages_resolve_against_each_cgroups_capacity() {
        let mut t = threshold(
            Signal::AllocatableMemoryAvailable,
            0,
            ThresholdSource::Allocatable,
        );
        t.value = ThresholdValue::Percentage {
            fraction: 0.1,
            percent: 10.0,
        };
        let arming = memcg_arming(&[t], None, Some(reading(1000 * MIB, 0)));
        assert_eq!(arming.len(), 1);
        assert_eq!(arming[0].target, MemcgTarget::Allocatable);
        // 10 % of 1000 MiB, with the kubelet's float32 rounding.
        let level = arming[0].levels[0];
        assert!(level.abs_diff(100 * MIB) < MIB, "{level}");
    }

    #[test]
    fn a_near_band_that_reaches_the_capacity_arms_no_approach_level() {
        // 600 MiB of 1000: its band (600 MiB, the threshold itself) would end above the capacity.
        let t = [threshold(
            Signal::MemoryAvailable,
            600 * MIB,
            ThresholdSource::EvictionHard,
        )];
        let arming = memcg_arming(&t, Some(reading(1000 * MIB, 0)), None);
        assert_eq!(arming[0].levels, [600 * MIB]);
    }

    #[test]
    fn a_target_without_reading_or_threshold_is_left_alone() {
        let node_only = [threshold(
            Signal::MemoryAvailable,
            100 * MIB,
            ThresholdSource::EvictionHard,
        )];
        let kubepods = Some(reading(3000 * MIB, 0));
        // No allocatable threshold: nothing on kubepods.
        let arming = memcg_arming(&node_only, None, kubepods);
        assert!(arming.is_empty(), "{arming:?}");
        // An allocatable threshold but no kubepods reading (no allocatable known).
        let alloc = [threshold(
            Signal::AllocatableMemoryAvailable,
            100 * MIB,
            ThresholdSource::Allocatable,
        )];
        assert!(memcg_arming(&alloc, Some(reading(4096 * MIB, 0)), None).is_empty());
    }
}
