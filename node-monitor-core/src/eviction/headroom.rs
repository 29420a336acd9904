//! Adaptive sampling between wake-ups: how soon to look again, from how close each signal is to
//! its thresholds and how fast it is falling.
//!
//! Push notifications do not cover every crossing. A cgroup v2 node cgroup has no memory
//! threshold eventfd (`memory.usage_in_bytes` notifications are cgroup v1 only), `memory.events`
//! fires only at `high`/`max`, and PSI only once tasks stall in reclaim, which a node with free
//! page cache to drop may never do before the threshold is crossed. Between those, the kubelet's
//! 10 s housekeeping poll is all that is left, and a pod climbing at 100 MiB/s crosses a 300 MiB
//! margin in 3 s.
//!
//! This module keeps, per threshold, the last observed headroom (`available − threshold`) and
//! turns it into the delay before the next signals-only sample (tens of µs):
//!
//! - **falling**: the next look comes after a quarter of the estimated time to the crossing
//!   (`headroom / rate`), so a steady climb is sampled about four times more often as it nears
//!   the threshold, and a fast one is seen within one `fast` interval;
//! - **near**: within `near_band` of the threshold (the larger of the threshold itself and a tenth of
//!   the capacity), the agent looks every `fast` interval even when nothing is falling yet;
//! - otherwise the housekeeping interval applies.
//!
//! Pure: observations and time are passed in.
use std::{collections::BTreeMap, time::Duration};

use crate::{
    signals::Observations,
    signals::threshold::{Threshold, ThresholdKey},
    units::clock::Timestamp,
};

/// The limits of adaptive sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadroomPolicy {
    /// The shortest delay between two samples, and the delay near a threshold.
    pub fast: Duration,
    /// The longest delay: the housekeeping interval.
    pub slow: Duration,
    /// The predictor's least lead ([`crate::eviction::predict`]); `None` with predictive
    /// eviction off.
    pub lead: Option<Duration>,
}

/// How far above a threshold its signal is near it: the larger of the threshold itself and a
/// tenth of the capacity (in the signal's unit).
pub fn near_band(threshold: i128, capacity: i128) -> i128 {
    threshold.max(capacity / 10)
}

/// A fraction of the time left before a crossing: sample four times before it at a steady rate.
const ETA_DIVISOR: u32 = 4;

/// With predictive eviction on, the longest delay between two looks at the kernel's headroom: a
/// ramp that starts far from every threshold is seen within this, and the looks then follow its
/// fall. Longer than [`crate::eviction::pod_figures::NEAR_LOOK`], so these looks alone never
/// read the pods; a signals-only pass costs tens of µs.
pub const PREDICTION_WATCH: Duration = Duration::from_millis(1500);

/// The last headroom seen per threshold.
#[derive(Debug, Clone, Default)]
pub struct Headroom {
    last: BTreeMap<ThresholdKey, (Timestamp, i128)>,
    /// The kernel's headroom last seen ([`Observations::kernel_headroom`]).
    kernel: Option<(Timestamp, i128)>,
}

impl Headroom {
    /// No headroom seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one sampling pass and returns the delay before the next sample, or `None` when
    /// no threshold needs a look before the housekeeping tick. Thresholds already met are left to
    /// the eviction logic (its grace and retry timers), not sampled faster.
    pub fn observe(
        &mut self,
        now: Timestamp,
        observations: &Observations,
        thresholds: &[Threshold],
        policy: HeadroomPolicy,
    ) -> Option<Duration> {
        let mut next: Option<Duration> = None;
        let mut seen = Vec::with_capacity(thresholds.len());
        for t in thresholds {
            let Some(obs) = observations.signals.get(&t.signal) else {
                continue;
            };
            let key = t.key();
            seen.push(key);
            // In bytes (or inodes, or pids) as the signal counts them; nanos keep fractions.
            let threshold = t.quantity(obs.capacity).nanos() / 1_000_000_000;
            let headroom = i128::from(obs.available) - threshold;
            let previous = self.last.insert(key, (now, headroom));
            if headroom <= 0 {
                continue;
            }
            let mut delay = policy.slow;
            let near_band = near_band(threshold, i128::from(obs.capacity));
            if headroom <= near_band {
                delay = delay.min(policy.fast);
            }
            if let Some((then, before)) = previous {
                let elapsed = now.saturating_since(then);
                let fallen = before - headroom;
                if fallen > 0 && !elapsed.is_zero() {
                    // time to the crossing at the observed rate = headroom × elapsed / fallen
                    let eta_ns = headroom.saturating_mul(elapsed.as_nanos() as i128) / fallen;
                    let eta = Duration::from_nanos(u64::try_from(eta_ns).unwrap_or(u64::MAX));
                    delay = delay.min(eta / ETA_DIVISOR);
                }
            }
            let delay = delay.clamp(policy.fast, policy.slow.max(policy.fast));
            next = Some(next.map_or(delay, |n| n.min(delay)));
        }
        // Forget thresholds that are gone (a signal no longer read): no stale rate later.
        self.last.retain(|k, _| seen.contains(k));
        if let Some(delay) = self.kernel_delay(now, observations.kernel_headroom, policy) {
            next = Some(next.map_or(delay, |n| n.min(delay)));
        }
        next.filter(|d| *d < policy.slow)
    }

    /// With predictive eviction on, the delay before the next look at the kernel's headroom:
    /// [`PREDICTION_WATCH`] at most; while it falls, a quarter of the time left before the
    /// prediction's point (one lead before exhaustion), so the predictor sees the fall at the
    /// fast interval by then.
    fn kernel_delay(
        &mut self,
        now: Timestamp,
        headroom: Option<i64>,
        policy: HeadroomPolicy,
    ) -> Option<Duration> {
        let (Some(lead), Some(h)) = (policy.lead, headroom) else {
            self.kernel = None;
            return None;
        };
        let watch = PREDICTION_WATCH.clamp(policy.fast, policy.slow.max(policy.fast));
        let h = i128::from(h);
        let Some((then, before)) = self.kernel.replace((now, h)) else {
            return Some(watch);
        };
        let elapsed = now.saturating_since(then);
        let fallen = before - h;
        if fallen <= 0 || elapsed.is_zero() {
            return Some(watch);
        }
        let eta_ns = h.max(0).saturating_mul(elapsed.as_nanos() as i128) / fallen;
        let eta = Duration::from_nanos(u64::try_from(eta_ns).unwrap_or(u64::MAX));
        let delay = eta.saturating_sub(lead) / ETA_DIVISOR;
        Some(delay.clamp(policy.fast, watch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        signals::threshold::{Operator, ThresholdSource, ThresholdValue},
        signals::{Signal, SignalObservation},
        units::quantity::{Format, Quantity},
    };

    const MI: i64 = 1 << 20;
    const POLICY: HeadroomPolicy = HeadroomPolicy {
        fast: Duration::from_millis(100),
        slow: Duration::from_secs(10),
        lead: None,
    };

    fn hard(signal: Signal, bytes: i64) -> Threshold {
        Threshold {
            signal,
            operator: Operator::LessThan,
            value: ThresholdValue::Quantity(Quantity::new(bytes, Format::BinarySI)),
            grace_period: Duration::ZERO,
            min_reclaim: None,
            source: if signal == Signal::MemoryAvailable {
                ThresholdSource::EvictionHard
            } else {
                ThresholdSource::Allocatable
            },
            derived_from: None,
        }
    }

    fn memory(available: i64, capacity: i64) -> Observations {
        let mut o = Observations::default();
        o.signals.insert(
            Signal::MemoryAvailable,
            SignalObservation {
                available,
                capacity,
            },
        );
        o
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_duration(Duration::from_millis(ms))
    }

    #[test]
    fn delays_follow_headroom_and_rate() {
        let gi = 1024 * MI;
        // (case, first available, second available, ms between, expected delay)
        let cases: &[(&str, i64, i64, u64, Option<Duration>)] = &[
            ("far and steady: housekeeping", 8 * gi, 8 * gi, 1000, None),
            ("far and rising: housekeeping", 6 * gi, 8 * gi, 1000, None),
            (
                // 1 GiB headroom falling 100 MiB/s: ~10.2 s to the crossing, a quarter of it
                "falling at 100 MiB/s, 1 GiB away",
                gi + 100 * MI + 300 * MI,
                gi + 300 * MI,
                1000,
                Some(Duration::from_millis(2560)),
            ),
            (
                // 100 MiB/s for 1 s just seen, 2 GiB to go: 5.12 s
                "falling at 100 MiB/s, 2 GiB away",
                2 * gi + 400 * MI,
                2 * gi + 300 * MI,
                1000,
                Some(Duration::from_millis(5120)),
            ),
            (
                "falling too slowly to matter",
                8 * gi + MI,
                8 * gi,
                1000,
                None,
            ),
            (
                // within the 819 MiB band (a tenth of 8 GiB) without falling
                "near the threshold, steady",
                800 * MI,
                800 * MI,
                1000,
                Some(Duration::from_millis(100)),
            ),
            (
                // 900 MiB to go (outside the band) at ~6.8 GiB/s: 32 ms, raised to the minimum
                "falling very fast, clamped to the fast interval",
                8 * gi,
                1200 * MI,
                1000,
                Some(Duration::from_millis(100)),
            ),
            (
                "already met: left to the eviction logic",
                200 * MI,
                100 * MI,
                1000,
                None,
            ),
        ];
        for (case, first, second, ms, want) in cases {
            let t = [hard(Signal::MemoryAvailable, 300 * MI)];
            let mut h = Headroom::new();
            let cap = 8 * gi;
            let _ = h.observe(at(0), &memory(*first, cap), &t, POLICY);
            let got = h.observe(at(*ms), &memory(*second, cap), &t, POLICY);
            assert_eq!(got, *want, "{case}");
        }
    }

    #[test]
    fn the_band_is_the_threshold_on_a_small_node() {
        // 1 GiB node, 300 MiB threshold: the band is 300 MiB (more than a tenth of 1 GiB).
        let t = [hard(Signal::MemoryAvailable, 300 * MI)];
        let mut h = Headroom::new();
        assert_eq!(
            h.observe(at(0), &memory(599 * MI, 1024 * MI), &t, POLICY),
            Some(POLICY.fast)
        );
        let mut h = Headroom::new();
        assert_eq!(
            h.observe(at(0), &memory(601 * MI, 1024 * MI), &t, POLICY),
            None
        );
    }

    #[test]
    fn the_closest_threshold_wins_and_gone_signals_are_forgotten() {
        let gi = 1024 * MI;
        let t = [
            hard(Signal::MemoryAvailable, 300 * MI),
            hard(Signal::AllocatableMemoryAvailable, 300 * MI),
        ];
        let mut both = memory(4 * gi, 8 * gi);
        both.signals.insert(
            Signal::AllocatableMemoryAvailable,
            SignalObservation {
                available: 700 * MI,
                capacity: 8 * gi,
            },
        );
        let mut h = Headroom::new();
        assert_eq!(h.observe(at(0), &both, &t, POLICY), Some(POLICY.fast));
        // allocatable no longer read; memory.available far: housekeeping, and no stale entry
        assert_eq!(
            h.observe(at(1000), &memory(4 * gi, 8 * gi), &t, POLICY),
            None
        );
        assert_eq!(h.last.len(), 1);
    }

    #[test]
    fn a_repeated_timestamp_gives_no_rate() {
        let gi = 1024 * MI;
        let t = [hard(Signal::MemoryAvailable, 300 * MI)];
        let mut h = Headroom::new();
        let _ = h.observe(at(5), &memory(4 * gi, 8 * gi), &t, POLICY);
        assert_eq!(h.observe(at(5), &memory(3 * gi, 8 * gi), &t, POLICY), None);
    }

    /// With predictive eviction on, a falling kernel headroom is looked at four times before
    /// the prediction's point (one lead before exhaustion), even far from every threshold.
    #[test]
    fn a_falling_kernel_headroom_is_sampled_before_the_prediction_point() {
        let gi = 1024 * MI;
        let t = [hard(Signal::MemoryAvailable, 100 * MI)];
        let on = HeadroomPolicy {
            lead: Some(Duration::from_secs(2)),
            ..POLICY
        };
        let node = |kernel: Option<i64>| Observations {
            kernel_headroom: kernel,
            ..memory(3 * gi, 4 * gi)
        };
        // (case, policy, (ms, kernel headroom) passes, delay after the last)
        type Passes = Vec<(u64, Option<i64>)>;
        let cases: Vec<(&str, HeadroomPolicy, Passes, Option<Duration>)> = vec![
            (
                "100 MiB/s, 1.2 GiB left: 12 s, less the 2 s lead, over 4, at most the watch",
                on,
                vec![(0, Some(1300 * MI)), (1000, Some(1200 * MI))],
                Some(PREDICTION_WATCH),
            ),
            (
                "300 MiB/s, 1.2 GiB left: 4 s, less the 2 s lead, over 4",
                on,
                vec![(0, Some(1500 * MI)), (1000, Some(1200 * MI))],
                Some(Duration::from_millis(500)),
            ),
            (
                "within one lead already: the fast interval",
                on,
                vec![(0, Some(400 * MI)), (1000, Some(150 * MI))],
                Some(POLICY.fast),
            ),
            (
                "rising: the watch's 1.5 s",
                on,
                vec![(0, Some(400 * MI)), (1000, Some(500 * MI))],
                Some(PREDICTION_WATCH),
            ),
            (
                "a slow leak: the watch's 1.5 s",
                on,
                vec![(0, Some(1300 * MI)), (1000, Some(1299 * MI))],
                Some(PREDICTION_WATCH),
            ),
            (
                "not observed in between: no rate, the watch",
                on,
                vec![(0, Some(1300 * MI)), (500, None), (1000, Some(300 * MI))],
                Some(PREDICTION_WATCH),
            ),
            (
                "the headroom not observed: housekeeping",
                on,
                vec![(0, None)],
                None,
            ),
            (
                "predictive eviction off",
                POLICY,
                vec![(0, Some(400 * MI)), (1000, Some(150 * MI))],
                None,
            ),
        ];
        for (case, policy, passes, want) in cases {
            let mut h = Headroom::new();
            let mut got = None;
            for (ms, kernel) in passes {
                got = h.observe(Timestamp::from_millis(ms), &node(kernel), &t, policy);
            }
            match (got, want) {
                (Some(g), Some(w)) => assert!(
                    g.abs_diff(w) < Duration::from_millis(10),
                    "{case}: {g:?}, want {w:?}"
                ),
                _ => assert_eq!(got, want, "{case}"),
            }
        }
    }
}
