//! Graceful node shutdown planning, with the kubelet's semantics
//! (`pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go`, seed 000):
//!
//! - Without `shutdownGracePeriodByPodPriority`, two groups: regular pods get
//!   `shutdownGracePeriod − shutdownGracePeriodCriticalPods`, then critical pods (priority ≥
//!   system-critical, 2 000 000 000) get `shutdownGracePeriodCriticalPods`.
//! - With it, each pod joins the group with the highest priority not above its own (pods below
//!   every group join the lowest); groups run from the lowest priority upwards.
//! - Each pod gets min(its terminationGracePeriodSeconds, the group's period).
//! - Groups without pods are skipped: no time is spent waiting on them.
//!
//! Pure: no I/O; the manager passes pods and time in.
use std::{collections::BTreeSet, fmt, time::Duration};

use serde::{Deserialize, Serialize};

use super::pod::SYSTEM_CRITICAL_PRIORITY;

/// One `shutdownGracePeriodByPodPriority` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityPeriod {
    pub priority: i32,
    pub shutdown_grace_period_seconds: i64,
}

/// The kubelet's shutdown settings (KubeletConfiguration field names).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShutdownSettings {
    /// Seconds. The whole budget when `shutdownGracePeriodByPodPriority` is empty.
    #[serde(default)]
    pub shutdown_grace_period_seconds: i64,
    /// Seconds reserved for critical pods, out of `shutdownGracePeriodSeconds`.
    #[serde(default)]
    pub shutdown_grace_period_critical_pods_seconds: i64,
    #[serde(default)]
    pub shutdown_grace_period_by_pod_priority: Vec<PriorityPeriod>,
}

/// A configuration the kubelet would refuse, or one that cannot fit the logind budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShutdownConfigError {
    #[error("{field}: {value} is negative")]
    Negative { field: &'static str, value: i64 },
    #[error(
        "shutdownGracePeriodCriticalPods: {critical}s exceeds shutdownGracePeriod: {total}s"
    )]
    CriticalExceedsTotal { critical: i64, total: i64 },
    #[error("shutdownGracePeriodByPodPriority: priority {0} appears more than once")]
    DuplicatePriority(i32),
    #[error(
        "shutdownGracePeriodByPodPriority and shutdownGracePeriod/shutdownGracePeriodCriticalPods are both set; use one"
    )]
    BothForms,
    #[error(
        "the shutdown groups need {needed}s but logind's InhibitDelayMaxSec allows {allowed}s; raise it (nodeMonitor.shutdown.manageInhibitDelay) or shorten the groups"
    )]
    ExceedsInhibitDelay { needed: u64, allowed: u64 },
}

/// A group of the plan's configuration: pods at or above `priority` (and below the next group's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Group {
    pub priority: i32,
    pub period: Duration,
}

impl ShutdownSettings {
    /// The groups, sorted by priority ascending, validated. Empty when shutdown handling is off
    /// (all periods zero).
    pub fn groups(&self) -> Result<Vec<Group>, ShutdownConfigError> {
        let total = self.shutdown_grace_period_seconds;
        let critical = self.shutdown_grace_period_critical_pods_seconds;
        for (field, value) in [
            ("shutdownGracePeriod", total),
            ("shutdownGracePeriodCriticalPods", critical),
        ] {
            if value < 0 {
                return Err(ShutdownConfigError::Negative { field, value });
            }
        }
        if !self.shutdown_grace_period_by_pod_priority.is_empty() {
            if total != 0 || critical != 0 {
                return Err(ShutdownConfigError::BothForms);
            }
            let mut seen = BTreeSet::new();
            let mut groups = Vec::new();
            for p in &self.shutdown_grace_period_by_pod_priority {
                if p.shutdown_grace_period_seconds < 0 {
                    return Err(ShutdownConfigError::Negative {
                        field: "shutdownGracePeriodByPodPriority.shutdownGracePeriodSeconds",
                        value: p.shutdown_grace_period_seconds,
                    });
                }
                if !seen.insert(p.priority) {
                    return Err(ShutdownConfigError::DuplicatePriority(p.priority));
                }
                groups.push(Group {
                    priority: p.priority,
                    period: secs(p.shutdown_grace_period_seconds),
                });
            }
            groups.sort_by_key(|g| g.priority);
            return Ok(groups);
        }
        if critical > total {
            return Err(ShutdownConfigError::CriticalExceedsTotal { critical, total });
        }
        if total == 0 {
            return Ok(Vec::new());
        }
        // The kubelet's migration of the two legacy fields (migrateInsufficientConfig).
        Ok(vec![
            Group { priority: 0, period: secs(total - critical) },
            Group { priority: SYSTEM_CRITICAL_PRIORITY, period: secs(critical) },
        ])
    }

    /// The budget the groups need from logind: the sum of their periods.
    pub fn budget(&self) -> Result<Duration, ShutdownConfigError> {
        Ok(self.groups()?.iter().map(|g| g.period).sum())
    }
}

/// Checks the budget against logind's `InhibitDelayMaxUSec`.
pub fn check_inhibit_delay(needed: Duration, allowed: Duration) -> Result<(), ShutdownConfigError> {
    if needed > allowed {
        return Err(ShutdownConfigError::ExceedsInhibitDelay {
            needed: needed.as_secs(),
            allowed: allowed.as_secs(),
        });
    }
    Ok(())
}

fn secs(s: i64) -> Duration {
    Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// What the plan needs to know of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShutdownPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub priority: i32,
    /// `spec.terminationGracePeriodSeconds`; `None` means the API default (30 s).
    pub termination_grace_period_seconds: Option<i64>,
}

/// A pod with the grace period it will be given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedPod {
    pub pod: ShutdownPod,
    pub grace_period_seconds: i64,
}

/// One group to run: its pods, its period, and when it starts relative to the shutdown's start
/// (the sum of the earlier non-empty groups' periods: the latest it may start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedGroup {
    pub priority: i32,
    pub period: Duration,
    pub latest_start: Duration,
    pub pods: Vec<PlannedPod>,
}

/// The whole plan, lowest priority first; empty groups are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ShutdownPlan {
    pub groups: Vec<PlannedGroup>,
}

impl fmt::Display for ShutdownPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for g in &self.groups {
            writeln!(f, "priority>={} period={:?} pods={}", g.priority, g.period, g.pods.len())?;
        }
        Ok(())
    }
}

/// The API's default terminationGracePeriodSeconds.
const DEFAULT_TERMINATION_GRACE: i64 = 30;

/// Assigns pods to groups (kubelet `groupByPriority`) and gives each its grace period.
pub fn plan(groups: &[Group], pods: &[ShutdownPod]) -> ShutdownPlan {
    if groups.is_empty() {
        return ShutdownPlan::default();
    }
    let mut buckets: Vec<Vec<PlannedPod>> = vec![Vec::new(); groups.len()];
    for pod in pods {
        // The last group whose priority is not above the pod's; pods below all go to the first.
        let idx = groups.iter().rposition(|g| g.priority <= pod.priority).unwrap_or(0);
        let period = i64::try_from(groups[idx].period.as_secs()).unwrap_or(i64::MAX);
        let own = pod.termination_grace_period_seconds.unwrap_or(DEFAULT_TERMINATION_GRACE).max(0);
        buckets[idx].push(PlannedPod { pod: pod.clone(), grace_period_seconds: own.min(period) });
    }
    let mut out = ShutdownPlan::default();
    let mut offset = Duration::ZERO;
    for (g, mut pods) in groups.iter().zip(buckets) {
        if pods.is_empty() {
            continue;
        }
        pods.sort_by(|a, b| (&a.pod.namespace, &a.pod.name).cmp(&(&b.pod.namespace, &b.pod.name)));
        out.groups.push(PlannedGroup { priority: g.priority, period: g.period, latest_start: offset, pods });
        offset += g.period;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: i32, tgp: Option<i64>) -> ShutdownPod {
        ShutdownPod {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            priority,
            termination_grace_period_seconds: tgp,
        }
    }

    fn by_priority(entries: &[(i32, i64)]) -> ShutdownSettings {
        ShutdownSettings {
            shutdown_grace_period_by_pod_priority: entries
                .iter()
                .map(|&(priority, s)| PriorityPeriod { priority, shutdown_grace_period_seconds: s })
                .collect(),
            ..ShutdownSettings::default()
        }
    }

    #[test]
    fn legacy_fields_become_two_groups() {
        let s = ShutdownSettings {
            shutdown_grace_period_seconds: 30,
            shutdown_grace_period_critical_pods_seconds: 10,
            ..ShutdownSettings::default()
        };
        assert_eq!(
            s.groups(),
            Ok(vec![
                Group { priority: 0, period: Duration::from_secs(20) },
                Group { priority: SYSTEM_CRITICAL_PRIORITY, period: Duration::from_secs(10) },
            ])
        );
        assert_eq!(s.budget(), Ok(Duration::from_secs(30)));
        assert_eq!(ShutdownSettings::default().groups(), Ok(vec![]));
    }

    /// The seed's example: 100000→10 s, 10000→180 s, 1000→120 s, 0→60 s.
    #[test]
    fn seed_example_groups_and_periods() {
        let s = by_priority(&[(100_000, 10), (10_000, 180), (1_000, 120), (0, 60)]);
        let groups = s.groups().expect("valid");
        assert_eq!(groups.iter().map(|g| g.priority).collect::<Vec<_>>(), vec![0, 1_000, 10_000, 100_000]);
        assert_eq!(s.budget(), Ok(Duration::from_secs(370)));
        let pods = [
            pod("custom-class-a", 2_000, Some(600)), // 1000 ≤ 2000 < 10000 → 120 s group
            pod("custom-class-b", 20_000, Some(5)),  // own 5 s < 180 s
            pod("low", -5, None),                    // below every group → lowest (60 s), default 30 s
            pod("critical", 2_000_000_000, Some(60)), // → 100000 group, capped at 10 s
        ];
        let p = plan(&groups, &pods);
        type Row<'a> = (i32, Vec<(&'a str, i64)>, u64);
        let got: Vec<Row<'_>> = p
            .groups
            .iter()
            .map(|g| {
                (
                    g.priority,
                    g.pods.iter().map(|pp| (pp.pod.name.as_str(), pp.grace_period_seconds)).collect(),
                    g.latest_start.as_secs(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, vec![("low", 30)], 0),
                (1_000, vec![("custom-class-a", 120)], 60),
                (10_000, vec![("custom-class-b", 5)], 180),
                (100_000, vec![("critical", 10)], 360),
            ]
        );
    }

    #[test]
    fn empty_groups_are_skipped_and_take_no_time() {
        let s = by_priority(&[(0, 20), (1_000, 30), (10_000, 40)]);
        let p = plan(&s.groups().expect("valid"), &[pod("a", 0, Some(5)), pod("c", 50_000, Some(100))]);
        let got: Vec<(i32, u64)> = p.groups.iter().map(|g| (g.priority, g.latest_start.as_secs())).collect();
        assert_eq!(got, vec![(0, 0), (10_000, 20)]);
        assert_eq!(p.groups[1].pods[0].grace_period_seconds, 40);
    }

    #[test]
    fn invalid_configurations_name_the_field() {
        let cases: Vec<(ShutdownSettings, ShutdownConfigError)> = vec![
            (
                ShutdownSettings { shutdown_grace_period_seconds: -1, ..Default::default() },
                ShutdownConfigError::Negative { field: "shutdownGracePeriod", value: -1 },
            ),
            (
                ShutdownSettings {
                    shutdown_grace_period_seconds: 10,
                    shutdown_grace_period_critical_pods_seconds: 20,
                    ..Default::default()
                },
                ShutdownConfigError::CriticalExceedsTotal { critical: 20, total: 10 },
            ),
            (by_priority(&[(0, 10), (0, 20)]), ShutdownConfigError::DuplicatePriority(0)),
            (
                by_priority(&[(0, -3)]),
                ShutdownConfigError::Negative {
                    field: "shutdownGracePeriodByPodPriority.shutdownGracePeriodSeconds",
                    value: -3,
                },
            ),
            (
                ShutdownSettings { shutdown_grace_period_seconds: 5, ..by_priority(&[(0, 10)]) },
                ShutdownConfigError::BothForms,
            ),
        ];
        for (s, want) in cases {
            assert_eq!(s.groups(), Err(want.clone()), "{s:?}");
            assert!(!want.to_string().is_empty());
        }
    }

    #[test]
    fn budget_must_fit_logind_delay() {
        assert_eq!(check_inhibit_delay(Duration::from_secs(30), Duration::from_secs(30)), Ok(()));
        let err = check_inhibit_delay(Duration::from_secs(30), Duration::from_secs(5)).expect_err("too long");
        assert_eq!(err, ShutdownConfigError::ExceedsInhibitDelay { needed: 30, allowed: 5 });
        assert!(err.to_string().contains("InhibitDelayMaxSec allows 5s"), "{err}");
    }
}
