//! Arms the cgroup v1 memcg thresholds the core's arming policy picks
//! ([`node_monitor_core::arming`]) at the sampler's last readings.

use node_monitor_core::{
    arming::{CgroupMemory, memcg_arming},
    signals::threshold::Threshold,
};

use crate::{
    sampler::MemoryReading,
    wakeup::{MemcgTarget, Wakeups},
};

/// What the arming policy needs of a reading.
pub fn cgroup_memory(m: MemoryReading) -> CgroupMemory {
    CgroupMemory {
        capacity: m.capacity,
        file_outside_working_set: m.file_outside_working_set(),
    }
}

/// Arms (or re-arms at the fresh page-cache figures) the memcg thresholds `memcg_arming` picks,
/// as the kubelet does on each synchronize. The agent calls it after every pass with the
/// sampler's last readings (`Sampler::last_node_memory`, `Sampler::last_kubepods_memory`).
pub fn rearm(
    wakeups: &mut Wakeups,
    thresholds: &[Threshold],
    node: Option<MemoryReading>,
    kubepods: Option<MemoryReading>,
) {
    for a in memcg_arming(
        thresholds,
        node.map(cgroup_memory),
        kubepods.map(cgroup_memory),
    ) {
        match a.target {
            MemcgTarget::Node => {
                wakeups.arm_memory_thresholds(&a.levels, a.capacity, a.file_outside_working_set);
            }
            MemcgTarget::Allocatable => {
                wakeups.arm_allocatable_thresholds(
                    &a.levels,
                    a.capacity,
                    a.file_outside_working_set,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use node_monitor_core::{
        signals::Signal,
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

    #[test]
    fn the_armed_level_follows_the_working_set_formula() {
        use node_monitor_core::signals::{
            MemoryStatFigures, MemoryWorkingSet, file_outside_working_set, memory_working_set,
        };
        let t = [threshold(
            Signal::MemoryAvailable,
            100 * MIB,
            ThresholdSource::EvictionHard,
        )];
        let capacity = 1000 * MIB;
        // 600 MiB used: 100 MiB anonymous, 500 MiB page cache (100 inactive, 400 active of
        // which 50 dirty and 30 shmem on the anon lists).
        let m = MemoryStatFigures {
            usage: 600 * MIB,
            inactive_file: 100 * MIB,
            active_file: 400 * MIB,
            file: 530 * MIB,
            shmem: 30 * MIB,
            dirty: 50 * MIB,
            writeback: 0,
        };
        for (mode, outside) in [
            (MemoryWorkingSet::Kubelet, 100 * MIB),
            (MemoryWorkingSet::Reclaimable, (100 + 350) * MIB),
        ] {
            let ws = memory_working_set(mode, &m);
            let reading = MemoryReading {
                capacity,
                usage: m.usage,
                inactive_file: m.inactive_file,
                reclaimable_active_file: file_outside_working_set(mode, &m) - m.inactive_file,
                working_set: ws,
            };
            let arming = memcg_arming(&t, Some(cgroup_memory(reading)), None);
            assert_eq!(arming[0].file_outside_working_set, outside, "{mode:?}");
            // The kernel fires when usage reaches the level; at that usage (page cache
            // unchanged) the signal sits exactly at the threshold.
            let level = crate::sampler::memcg_usage_threshold(capacity, 100 * MIB, outside);
            let ws_at_level = memory_working_set(mode, &MemoryStatFigures { usage: level, ..m });
            assert_eq!(capacity - ws_at_level, 100 * MIB, "{mode:?}");
        }
    }
}
