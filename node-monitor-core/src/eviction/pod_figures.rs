//! Which per-pod figures a ranking uses: those of an earlier pass, or a pass made now.
//!
//! Ranking needs every pod's usage, and reading it costs one `memory.stat` (and `pids.current`)
//! per pod: about 15–20 µs of CPU per pod, 7–10 ms at 500 pods, more while a pod charges memory
//! fast. Made at the crossing, that pass is the whole of the reaction time's growth with the pod
//! count. The kubelet ranks from its last housekeeping's statistics, up to a housekeeping
//! interval old (10–15 s). The agent keeps them much fresher instead, and out of the crossing's
//! path:
//!
//! - while adaptive sampling says a threshold is near (its next look is due within
//!   [`NEAR_LOOK`]), the pod figures are refreshed at most every [`NEAR_REFRESH`], beside the
//!   decisions (the agent reads them between wake-ups and gives way to the next one);
//! - at the crossing, figures at most [`RANK_MAX_AGE`] old that cover every pod to rank rank
//!   them at once, and the refresh follows the eviction requests;
//! - older figures, none, or figures that miss a pod (one started since: the kubelet ranks a pod
//!   without statistics first, so a missing figure would pick it) are read again before ranking.
//!
//! Pure: the time of the figures and `now` are passed in.
use std::time::Duration;

use crate::units::clock::Timestamp;

/// The oldest per-pod figures a ranking uses without reading the pods again.
pub const RANK_MAX_AGE: Duration = Duration::from_secs(1);
/// How often the pod figures are refreshed while a threshold is near.
pub const NEAR_REFRESH: Duration = Duration::from_millis(250);
/// A threshold is near when adaptive sampling looks again within this delay: within its near
/// band, or falling towards it with at most four times this left before the crossing.
pub const NEAR_LOOK: Duration = Duration::from_secs(1);

/// Where a ranking's per-pod figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankFigures {
    /// The figures of an earlier pass: rank now, refresh after the evictions.
    Earlier {
        /// How old the figures are.
        age: Duration,
    },
    /// Read the pods now, before ranking.
    ReadNow,
}

/// The figures a ranking at `now` uses, given when the last pod figures were taken (`None`:
/// never, or no longer valid) and whether they hold a figure for every pod to rank.
pub fn rank_figures(
    taken: Option<Timestamp>,
    now: Timestamp,
    max_age: Duration,
    cover_every_pod: bool,
) -> RankFigures {
    match taken {
        // A clock that went backwards (not monotonic) cannot date the figures: read again.
        Some(t) if cover_every_pod && t <= now && now.saturating_since(t) <= max_age => {
            RankFigures::Earlier {
                age: now.saturating_since(t),
            }
        }
        _ => RankFigures::ReadNow,
    }
}

/// Whether a look without any threshold met should also refresh the pod figures: only while a
/// threshold is near (the next look is due within [`NEAR_LOOK`] of `now`), and at most every
/// `interval`.
pub fn refresh_due(
    taken: Option<Timestamp>,
    now: Timestamp,
    next_look: Option<Timestamp>,
    interval: Duration,
) -> bool {
    let near = next_look.is_some_and(|at| at.saturating_since(now) <= NEAR_LOOK);
    near && taken.is_none_or(|t| t > now || now.saturating_since(t) >= interval)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Timestamp = Timestamp::from_millis;

    #[test]
    fn rank_figures_table() {
        // (taken, now, max_age, expected)
        let cases: &[(Option<u64>, u64, u64, RankFigures)] = &[
            (None, 5_000, 1_000, RankFigures::ReadNow),
            (
                Some(4_800),
                5_000,
                1_000,
                RankFigures::Earlier {
                    age: Duration::from_millis(200),
                },
            ),
            (
                Some(4_000),
                5_000,
                1_000,
                RankFigures::Earlier {
                    age: Duration::from_secs(1),
                },
            ),
            (Some(3_999), 5_000, 1_000, RankFigures::ReadNow),
            (
                Some(5_000),
                5_000,
                0,
                RankFigures::Earlier {
                    age: Duration::ZERO,
                },
            ),
            // A zero maximum age reads again whenever any time has passed.
            (Some(4_999), 5_000, 0, RankFigures::ReadNow),
            // Figures dated after `now`: the clock cannot date them.
            (Some(6_000), 5_000, 1_000, RankFigures::ReadNow),
        ];
        for (taken, now, max_age, expected) in cases {
            assert_eq!(
                rank_figures(
                    taken.map(MS),
                    MS(*now),
                    Duration::from_millis(*max_age),
                    true
                ),
                *expected,
                "taken {taken:?}, now {now}, max age {max_age} ms"
            );
            // Figures that miss a pod to rank are read again, however recent.
            assert_eq!(
                rank_figures(
                    taken.map(MS),
                    MS(*now),
                    Duration::from_millis(*max_age),
                    false
                ),
                RankFigures::ReadNow,
                "taken {taken:?}, now {now}, max age {max_age} ms, a pod missing"
            );
        }
    }

    #[test]
    fn refresh_due_table() {
        // (taken, now, next look, expected)
        let cases: &[(Option<u64>, u64, Option<u64>, bool)] = &[
            // No threshold near: never, however old the figures.
            (None, 10_000, None, false),
            (Some(0), 10_000, Some(20_000), false),
            (Some(0), 10_000, Some(11_001), false),
            // Near: when none or old enough.
            (None, 10_000, Some(10_100), true),
            (Some(9_750), 10_000, Some(10_100), true),
            (Some(9_751), 10_000, Some(10_100), false),
            (Some(9_900), 10_000, Some(11_000), false),
            (Some(9_000), 10_000, Some(11_000), true),
            // A look already overdue is near.
            (Some(9_000), 10_000, Some(9_500), true),
            // Figures dated after `now` are refreshed.
            (Some(12_000), 10_000, Some(10_100), true),
        ];
        for (taken, now, next, expected) in cases {
            assert_eq!(
                refresh_due(taken.map(MS), MS(*now), next.map(MS), NEAR_REFRESH),
                *expected,
                "taken {taken:?}, now {now}, next look {next:?}"
            );
        }
    }
}
