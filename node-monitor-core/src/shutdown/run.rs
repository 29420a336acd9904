//! The plan (pods into priority groups, each pod's grace period) and the phase state machine of
//! one shutdown run ([`ShutdownRun`]).
use std::{collections::BTreeSet, fmt, time::Duration};

use serde::Serialize;

use super::Group;
use crate::units::clock::Timestamp;

/// What the plan needs to know of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShutdownPod {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID.
    pub uid: String,
    /// `spec.priority`, 0 when unset.
    pub priority: i32,
    /// `spec.terminationGracePeriodSeconds`; `None` gives the group's period, as in the kubelet.
    pub termination_grace_period_seconds: Option<i64>,
}

/// A pod with the grace period it will be given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedPod {
    /// The pod.
    pub pod: ShutdownPod,
    /// min(its `terminationGracePeriodSeconds`, the group's period), seconds.
    pub grace_period_seconds: i64,
}

/// One group to run: its pods, its period, and when it starts relative to the shutdown's start
/// (the sum of the earlier non-empty groups' periods: the latest it may start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedGroup {
    /// The lowest pod priority of the group.
    pub priority: i32,
    /// The group's period.
    pub period: Duration,
    /// The latest the group starts, after the shutdown's start.
    pub latest_start: Duration,
    /// The group's pods, by namespace and name.
    pub pods: Vec<PlannedPod>,
}

/// The whole plan, lowest priority first; empty groups are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ShutdownPlan {
    /// The groups with pods, in the order they run.
    pub groups: Vec<PlannedGroup>,
}

impl ShutdownPlan {
    /// The number of pods in all groups.
    pub fn pod_count(&self) -> usize {
        self.groups.iter().map(|g| g.pods.len()).sum()
    }
}

impl fmt::Display for ShutdownPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for g in &self.groups {
            writeln!(
                f,
                "priority>={} period={:?} pods={}",
                g.priority,
                g.period,
                g.pods.len()
            )?;
        }
        Ok(())
    }
}

/// Assigns pods to groups (kubelet `groupByPriority`) and gives each its grace period.
pub fn plan(groups: &[Group], pods: &[ShutdownPod]) -> ShutdownPlan {
    if groups.is_empty() {
        return ShutdownPlan::default();
    }
    let mut buckets: Vec<Vec<PlannedPod>> = vec![Vec::new(); groups.len()];
    for pod in pods {
        // The last group whose priority is not above the pod's; pods below all go to the first.
        let idx = groups
            .iter()
            .rposition(|g| g.priority <= pod.priority)
            .unwrap_or(0);
        let period = i64::try_from(groups[idx].period.as_secs()).unwrap_or(i64::MAX);
        // The kubelet takes the pod's own period only when it is set and not longer.
        let grace = match pod.termination_grace_period_seconds {
            Some(own) if own <= period => own.max(0),
            _ => period,
        };
        buckets[idx].push(PlannedPod {
            pod: pod.clone(),
            grace_period_seconds: grace,
        });
    }
    let mut out = ShutdownPlan::default();
    let mut offset = Duration::ZERO;
    for (g, mut pods) in groups.iter().zip(buckets) {
        if pods.is_empty() {
            continue;
        }
        pods.sort_by(|a, b| (&a.pod.namespace, &a.pod.name).cmp(&(&b.pod.namespace, &b.pod.name)));
        out.groups.push(PlannedGroup {
            priority: g.priority,
            period: g.period,
            latest_start: offset,
            pods,
        });
        offset = offset.saturating_add(g.period);
    }
    out
}

/// The metric `phase` label of a group: `priority_<N>`.
pub fn group_phase(priority: i32) -> String {
    format!("priority_{priority}")
}

/// The metric `phase` label of the whole shutdown, from PrepareForShutdown to the lock's release.
pub const PHASE_TOTAL: &str = "total";

/// How a group ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum GroupOutcome {
    /// The API confirmed every pod of the group gone.
    AllGone,
    /// The group's period ran out with these pods (`namespace/name`) still present.
    PeriodElapsed {
        /// The pods still present, `namespace/name`.
        remaining: Vec<String>,
    },
}

/// What the manager must do next, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Terminate the group's pods now, each with its planned grace period.
    StartGroup {
        /// The group's position in the plan.
        index: usize,
        /// The group's lowest pod priority.
        priority: i32,
        /// The pods to terminate.
        pods: Vec<PlannedPod>,
    },
    /// The group is over.
    EndGroup {
        /// The group's position in the plan.
        index: usize,
        /// The group's lowest pod priority.
        priority: i32,
        /// How it ended.
        outcome: GroupOutcome,
    },
    /// Every group ran: release the inhibitor.
    Release,
}

/// A group's times, for metrics and the benchmark.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupRecord {
    /// The group's lowest pod priority.
    pub priority: i32,
    /// When the group started.
    pub started: Timestamp,
    /// When it ended; `None` while it runs.
    pub ended: Option<Timestamp>,
    /// How it ended; `None` while it runs.
    pub outcome: Option<GroupOutcome>,
}

/// The phase state machine of one shutdown: runs the plan's groups one after another, each until
/// its pods are gone or its period (counted from its own start, as the kubelet's timer is) runs
/// out. The manager calls [`ShutdownRun::advance`] with the time and the UIDs the API still
/// shows, whenever the API answers and at the latest at [`ShutdownRun::deadline`].
#[derive(Debug, Clone)]
pub struct ShutdownRun {
    plan: ShutdownPlan,
    started: Timestamp,
    /// Index of the running group; `plan.groups.len()` once all ran.
    current: usize,
    records: Vec<GroupRecord>,
    released: Option<Timestamp>,
}

impl ShutdownRun {
    /// A run of `plan` that starts at `now`; the first [`Self::advance`] starts its first group.
    pub fn new(plan: ShutdownPlan, now: Timestamp) -> Self {
        Self {
            plan,
            started: now,
            current: 0,
            records: Vec::new(),
            released: None,
        }
    }

    /// The plan being run.
    pub fn plan(&self) -> &ShutdownPlan {
        &self.plan
    }

    /// When the shutdown started.
    pub fn started(&self) -> Timestamp {
        self.started
    }

    /// The groups started so far, in order.
    pub fn records(&self) -> &[GroupRecord] {
        &self.records
    }

    /// When the lock was released, once it was.
    pub fn released(&self) -> Option<Timestamp> {
        self.released
    }

    /// The lock was released: every group ran, or the run was aborted.
    pub fn is_finished(&self) -> bool {
        self.released.is_some()
    }

    /// The pods of the running group, if any.
    pub fn current_pods(&self) -> &[PlannedPod] {
        if self.records.len() == self.current + 1 {
            self.plan
                .groups
                .get(self.current)
                .map_or(&[], |g| g.pods.as_slice())
        } else {
            &[]
        }
    }

    /// The latest time the manager must call [`Self::advance`] again: the running group's end.
    pub fn deadline(&self) -> Option<Timestamp> {
        if self.released.is_some() {
            return None;
        }
        let g = self.plan.groups.get(self.current)?;
        let rec = self.records.get(self.current)?;
        Some(rec.started + g.period)
    }

    /// Advances the phases. `present` holds the UIDs of planned pods the API still shows (a UID
    /// the manager could not check counts as present). Returns the steps to carry out, in order.
    pub fn advance(&mut self, now: Timestamp, present: &BTreeSet<String>) -> Vec<Step> {
        let mut steps = Vec::new();
        if self.released.is_some() {
            return steps;
        }
        loop {
            let Some(group) = self.plan.groups.get(self.current) else {
                self.released = Some(now);
                steps.push(Step::Release);
                return steps;
            };
            if self.records.len() == self.current {
                self.records.push(GroupRecord {
                    priority: group.priority,
                    started: now,
                    ended: None,
                    outcome: None,
                });
                steps.push(Step::StartGroup {
                    index: self.current,
                    priority: group.priority,
                    pods: group.pods.clone(),
                });
                // Pods already gone (e.g. deleted by someone else) still get their group's
                // start; the end is decided on the next call, after the deletions went out.
                return steps;
            }
            let remaining: Vec<String> = group
                .pods
                .iter()
                .filter(|p| present.contains(&p.pod.uid))
                .map(|p| format!("{}/{}", p.pod.namespace, p.pod.name))
                .collect();
            let rec = &mut self.records[self.current];
            let outcome = if remaining.is_empty() {
                GroupOutcome::AllGone
            } else if now >= rec.started + group.period {
                GroupOutcome::PeriodElapsed { remaining }
            } else {
                return steps;
            };
            rec.ended = Some(now);
            rec.outcome = Some(outcome.clone());
            steps.push(Step::EndGroup {
                index: self.current,
                priority: group.priority,
                outcome,
            });
            self.current += 1;
        }
    }

    /// Stops the run early (a cancelled shutdown): the running group ends now with the pods it
    /// still had, and no later group starts.
    pub fn abort(&mut self, now: Timestamp, present: &BTreeSet<String>) -> Option<Step> {
        if self.released.is_some() {
            return None;
        }
        self.released = Some(now);
        let group = self.plan.groups.get(self.current)?;
        let rec = self.records.get_mut(self.current)?;
        let remaining: Vec<String> = group
            .pods
            .iter()
            .filter(|p| present.contains(&p.pod.uid))
            .map(|p| format!("{}/{}", p.pod.namespace, p.pod.name))
            .collect();
        let outcome = if remaining.is_empty() {
            GroupOutcome::AllGone
        } else {
            GroupOutcome::PeriodElapsed { remaining }
        };
        rec.ended = Some(now);
        rec.outcome = Some(outcome.clone());
        Some(Step::EndGroup {
            index: self.current,
            priority: group.priority,
            outcome,
        })
    }
}
