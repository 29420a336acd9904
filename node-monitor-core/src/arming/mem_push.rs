//! Arming the memory push: how many pages a CPU may add before the kernel wakes the agent.
//!
//! On cgroup v2 no interface notifies a crossing of `memory.available` (see [`crate::eviction::headroom`]).
//! The agent's eBPF memory push keeps a net page count per CPU in the kernel (allocations minus
//! frees) and wakes the agent when one CPU's growth reaches a batch. This module picks that
//! batch from the last observation:
//!
//! - **disarmed** (0) while every memory threshold is outside its near band
//!   ([`crate::eviction::headroom::near_band`]), or already met (left to the eviction logic): the programs
//!   then return after one map lookup;
//! - otherwise the smallest, over the memory thresholds inside their band, of
//!   `headroom / DISTANCE_DIVISOR / cpus` in pages, at least `floor_pages`. With every CPU just
//!   under its batch the node has grown by at most a quarter of the distance left without a
//!   wake-up; each wake-up re-reads memory and re-arms with a smaller batch, so the agent looks
//!   at a quarter, then a sixteenth, … of the distance, down to the floor.
//!
//! The kernel's count is only a trigger: the decision uses the figures read at the wake-up.
//!
//! The programs are attached only while they may be needed ([`keep_attached`]): from the first
//! armed pass until [`DETACH_AFTER`] has passed since the last one. Far from every memory
//! threshold they are loaded but not attached, and cost the allocator nothing.
//! Pure: observations in, a batch out.
use std::time::Duration;

use crate::{
    eviction::headroom::near_band,
    signals::Observations,
    signals::threshold::{Resource, Threshold, signal_resource},
    units::clock::Timestamp,
};

/// The share of the distance to the nearest threshold the node may grow by without a wake-up.
pub const DISTANCE_DIVISOR: u64 = 4;

/// The smallest batch: below it the wake-ups (each a pass of tens of µs) would cost more than
/// the 100 ms sampling they replace.
pub const FLOOR_PAGES: u64 = 256;

/// What the batch depends on besides the observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushPolicy {
    /// The kernel's page size in bytes.
    pub page_size: u64,
    /// CPUs that may allocate (each has its own count).
    pub cpus: u32,
    /// The smallest batch in pages.
    pub floor_pages: u64,
}

impl PushPolicy {
    /// The default floor for this node.
    pub fn new(page_size: u64, cpus: u32) -> Self {
        Self {
            page_size,
            cpus,
            floor_pages: FLOOR_PAGES,
        }
    }
}

/// The batch in pages to arm the push with; 0 disarms it.
pub fn batch_pages(
    observations: &Observations,
    thresholds: &[Threshold],
    policy: PushPolicy,
) -> u64 {
    let per_cpu = u128::from(DISTANCE_DIVISOR)
        * u128::from(policy.page_size.max(1))
        * u128::from(policy.cpus.max(1));
    let mut batch: Option<u64> = None;
    for t in thresholds {
        if signal_resource(t.signal) != Resource::Memory {
            continue;
        }
        let Some(obs) = observations.signals.get(&t.signal) else {
            continue;
        };
        let threshold = t.quantity(obs.capacity).nanos() / 1_000_000_000;
        let headroom = i128::from(obs.available) - threshold;
        if headroom <= 0 || headroom > near_band(threshold, i128::from(obs.capacity)) {
            continue;
        }
        // headroom > 0 here.
        let pages = (headroom as u128) / per_cpu;
        let pages = u64::try_from(pages)
            .unwrap_or(u64::MAX)
            .max(policy.floor_pages.max(1));
        batch = Some(batch.map_or(pages, |b| b.min(pages)));
    }
    batch.unwrap_or(0)
}

/// How long the programs stay attached after the last armed pass: a signal hovering at the edge
/// of its near band does not attach and detach them on every pass.
pub const DETACH_AFTER: Duration = Duration::from_secs(5);

/// Whether the push's programs should be attached at `now`, given the batch just chosen and
/// when a pass last chose a non-zero batch (`None`: never).
pub fn keep_attached(batch: u64, now: Timestamp, last_armed: Option<Timestamp>) -> bool {
    batch > 0 || last_armed.is_some_and(|t| now.saturating_since(t) < DETACH_AFTER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        signals::threshold::{Operator, ThresholdSource, ThresholdValue},
        signals::{Signal, SignalObservation},
        units::quantity::{Format, Quantity},
    };
    use std::time::Duration;

    const MI: i64 = 1 << 20;
    const GI: i64 = 1 << 30;

    fn hard(signal: Signal, bytes: i64) -> Threshold {
        Threshold {
            signal,
            operator: Operator::LessThan,
            value: ThresholdValue::Quantity(Quantity::new(bytes, Format::BinarySI)),
            grace_period: Duration::ZERO,
            min_reclaim: None,
            source: ThresholdSource::EvictionHard,
            derived_from: None,
        }
    }

    fn obs(signals: &[(Signal, i64, i64)]) -> Observations {
        let mut o = Observations::default();
        for (s, available, capacity) in signals {
            o.signals.insert(
                *s,
                SignalObservation {
                    available: *available,
                    capacity: *capacity,
                },
            );
        }
        o
    }

    #[test]
    fn the_batch_follows_the_distance_inside_the_band() {
        use Signal::*;
        let policy = PushPolicy::new(4096, 2);
        let mem = [hard(MemoryAvailable, 300 * MI)];
        // (case, thresholds, observations, batch)
        let cases: Vec<(&str, Vec<Threshold>, Observations, u64)> = vec![
            (
                "far: outside the 819 MiB band of an 8 GiB node",
                mem.to_vec(),
                obs(&[(MemoryAvailable, 2 * GI, 8 * GI)]),
                0,
            ),
            (
                // 800 MiB headroom / 4 / 2 CPUs = 100 MiB = 25600 pages
                "near: a quarter of the headroom over the CPUs",
                mem.to_vec(),
                obs(&[(MemoryAvailable, 1100 * MI, 8 * GI)]),
                25600,
            ),
            (
                "at the band's edge",
                mem.to_vec(),
                obs(&[(MemoryAvailable, 300 * MI + 8 * GI / 10, 8 * GI)]),
                ((8 * GI / 10) / 4 / 4096 / 2) as u64,
            ),
            (
                // 4 MiB headroom / 4 / 2 = 512 KiB = 128 pages: raised to the floor
                "close: the floor",
                mem.to_vec(),
                obs(&[(MemoryAvailable, 304 * MI, 8 * GI)]),
                FLOOR_PAGES,
            ),
            (
                "met: left to the eviction logic",
                mem.to_vec(),
                obs(&[(MemoryAvailable, 299 * MI, 8 * GI)]),
                0,
            ),
            (
                "no memory observation",
                mem.to_vec(),
                obs(&[(NodeFsAvailable, GI, 8 * GI)]),
                0,
            ),
            (
                "disk thresholds never arm it",
                vec![hard(NodeFsAvailable, 300 * MI)],
                obs(&[(NodeFsAvailable, 400 * MI, 8 * GI)]),
                0,
            ),
            (
                // allocatable: 200 MiB headroom → 6400 pages, the nearer one wins
                "the nearest memory threshold wins",
                vec![
                    hard(MemoryAvailable, 300 * MI),
                    hard(AllocatableMemoryAvailable, 300 * MI),
                ],
                obs(&[
                    (MemoryAvailable, 1100 * MI, 8 * GI),
                    (AllocatableMemoryAvailable, 500 * MI, 8 * GI),
                ]),
                6400,
            ),
            (
                "one near, one far: the near one arms it",
                vec![
                    hard(MemoryAvailable, 300 * MI),
                    hard(AllocatableMemoryAvailable, 300 * MI),
                ],
                obs(&[
                    (MemoryAvailable, 4 * GI, 8 * GI),
                    (AllocatableMemoryAvailable, 500 * MI, 8 * GI),
                ]),
                6400,
            ),
        ];
        for (case, thresholds, observations, want) in cases {
            assert_eq!(
                batch_pages(&observations, &thresholds, policy),
                want,
                "{case}"
            );
        }
    }

    #[test]
    fn more_cpus_smaller_batches_and_degenerate_policies_stay_sane() {
        let mem = [hard(Signal::MemoryAvailable, 300 * MI)];
        let o = obs(&[(Signal::MemoryAvailable, 1100 * MI, 8 * GI)]);
        assert_eq!(batch_pages(&o, &mem, PushPolicy::new(4096, 8)), 6400);
        assert_eq!(batch_pages(&o, &mem, PushPolicy::new(65536, 2)), 1600);
        // zero CPUs or page size are read as one; a zero floor as one page
        let odd = PushPolicy {
            page_size: 0,
            cpus: 0,
            floor_pages: 0,
        };
        assert_eq!(batch_pages(&o, &mem, odd), (800 * MI / 4) as u64);
    }

    #[test]
    fn the_programs_stay_attached_while_armed_and_for_a_while_after() {
        let t = Timestamp::from_secs;
        let cases: &[(&str, u64, Timestamp, Option<Timestamp>, bool)] = &[
            ("armed", 256, t(100), None, true),
            ("armed again", 256, t(100), Some(t(99)), true),
            ("never armed, disarmed", 0, t(100), None, false),
            ("disarmed just now", 0, t(100), Some(t(100)), true),
            ("disarmed within the hold", 0, t(104), Some(t(100)), true),
            (
                "disarmed for the whole hold",
                0,
                t(105),
                Some(t(100)),
                false,
            ),
            ("disarmed long ago", 0, t(1000), Some(t(100)), false),
            (
                "clock before the last armed pass",
                0,
                t(50),
                Some(t(100)),
                true,
            ),
        ];
        for (name, batch, now, last, want) in cases {
            assert_eq!(keep_attached(*batch, *now, *last), *want, "{name}");
        }
    }
}
