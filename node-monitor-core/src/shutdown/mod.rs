//! Graceful node shutdown, with the kubelet's semantics
//! (`pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go`, seed 000):
//!
//! - Without `shutdownGracePeriodByPodPriority`, two groups (`migrateConfig`): regular pods get
//!   `shutdownGracePeriod − shutdownGracePeriodCriticalPods`, then critical pods (priority ≥
//!   system-critical, 2 000 000 000) get `shutdownGracePeriodCriticalPods`.
//! - With it, each pod joins the group with the highest priority not above its own (pods below
//!   every group join the lowest); groups run from the lowest priority upwards
//!   (`groupByPriority`).
//! - Each pod gets min(its terminationGracePeriodSeconds, the group's period); a pod without one
//!   gets the group's period.
//! - Groups without pods are skipped: no time is spent waiting on them.
//! - A group ends when all its pods are gone or when its period, counted from the group's start,
//!   runs out; the next group starts then.
//!
//! Validation follows `ValidateKubeletConfiguration` (`pkg/kubelet/apis/config/validation`).
//!
//! Also here, pure and table-tested: the phase state machine the shutdown manager drives with
//! the pods the API still shows and the time ([`ShutdownRun`]), and the policy decisions around
//! logind's inhibitor ([`role`], [`inhibit_delay_check`], [`classify_reboot`]).
//!
//! Pure: no I/O; the manager passes pods and time in.
pub mod config;
pub mod lifecycle;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use serde::{Deserialize, Serialize};

use node_monitor_common::logic::{RebootCaller, RebootGate, reboot_gate};

use crate::{
    clock::Timestamp,
    duration::{format_go_duration, parse_go_duration},
    pod::SYSTEM_CRITICAL_PRIORITY,
};

/// A Go duration as a KubeletConfiguration holds it (`metav1.Duration`): signed nanoseconds,
/// written as a string such as `"30s"` or `"1m30s"`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GoDuration(pub i64);

impl GoDuration {
    /// Zero: for `shutdownGracePeriod`, shutdown handling off.
    pub const ZERO: GoDuration = GoDuration(0);

    /// `secs` seconds, saturating.
    pub const fn from_secs(secs: i64) -> Self {
        Self(secs.saturating_mul(1_000_000_000))
    }

    /// `millis` milliseconds, saturating.
    pub const fn from_millis(millis: i64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }

    /// Parses a Go duration string.
    pub fn parse(s: &str) -> Result<Self, crate::duration::DurationError> {
        parse_go_duration(s).map(Self)
    }

    /// Below zero (the kubelet refuses negative shutdown periods).
    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// Whole seconds, truncated towards zero as Go's `int64(d / time.Second)` does.
    pub const fn whole_seconds(self) -> i64 {
        self.0 / 1_000_000_000
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let abs = Duration::from_nanos(self.0.unsigned_abs());
        if self.0 < 0 {
            write!(f, "-{}", format_go_duration(abs))
        } else {
            f.write_str(&format_go_duration(abs))
        }
    }
}

impl Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        GoDuration::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// One `shutdownGracePeriodByPodPriority` entry (`ShutdownGracePeriodByPodPriority` in the
/// kubelet's config API: `priority` int32, `shutdownGracePeriodSeconds` int64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityPeriod {
    /// The lowest pod priority of the group.
    pub priority: i32,
    /// The group's period, seconds.
    pub shutdown_grace_period_seconds: i64,
}

/// The kubelet's shutdown settings, with the KubeletConfiguration field names and formats:
/// `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` are Go durations,
/// `shutdownGracePeriodByPodPriority` a list of `{priority, shutdownGracePeriodSeconds}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownSettings {
    /// The whole budget when `shutdownGracePeriodByPodPriority` is empty.
    #[serde(default)]
    pub shutdown_grace_period: GoDuration,
    /// Reserved for critical pods, out of `shutdownGracePeriod`.
    #[serde(default)]
    pub shutdown_grace_period_critical_pods: GoDuration,
    /// One group per entry; excludes the other two fields.
    #[serde(default)]
    pub shutdown_grace_period_by_pod_priority: Vec<PriorityPeriod>,
}

/// The longest delay logind can be asked to wait: `InhibitDelayMaxSec` is held in microseconds
/// in a `usec_t` whose largest value means infinity (`USEC_INFINITY`, systemd's
/// `src/basic/time-util.h`). Longer shutdown budgets cannot be granted, and are refused before any
/// arithmetic on them can overflow.
pub const LOGIND_MAX_DELAY: Duration = Duration::from_micros(u64::MAX - 1);

/// A configuration the kubelet would refuse, or one that cannot fit the logind budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShutdownConfigError {
    /// A negative period.
    #[error("{field}: {value} is negative")]
    Negative {
        /// The field (`shutdownGracePeriod`, …).
        field: &'static str,
        /// The value as a Go duration, or seconds for a priority entry.
        value: String,
    },
    /// A `shutdownGracePeriod` or `shutdownGracePeriodCriticalPods` between 0 and 1 s.
    #[error("{field}: {value} must be either zero or otherwise >= 1s")]
    SubSecond {
        /// The field.
        field: &'static str,
        /// The value as a Go duration.
        value: String,
    },
    /// `shutdownGracePeriodCriticalPods` is longer than the whole `shutdownGracePeriod`.
    #[error("shutdownGracePeriodCriticalPods: {critical} exceeds shutdownGracePeriod: {total}")]
    CriticalExceedsTotal {
        /// `shutdownGracePeriodCriticalPods`, as a Go duration.
        critical: String,
        /// `shutdownGracePeriod`, as a Go duration.
        total: String,
    },
    /// Two `shutdownGracePeriodByPodPriority` entries with this priority.
    #[error("shutdownGracePeriodByPodPriority: priority {0} appears more than once")]
    DuplicatePriority(i32),
    /// The groups need longer than logind can be asked to wait ([`LOGIND_MAX_DELAY`]).
    #[error(
        "{field}: the shutdown groups need {needed_seconds}s in total, more than logind's InhibitDelayMaxSec can hold ({max_seconds}s)"
    )]
    BudgetTooLong {
        /// The field.
        field: &'static str,
        /// The groups' periods summed, seconds.
        needed_seconds: u128,
        /// [`LOGIND_MAX_DELAY`], seconds.
        max_seconds: u64,
    },
    /// The priority list and the two-group fields are both set (the kubelet takes one form).
    #[error(
        "shutdownGracePeriodByPodPriority and shutdownGracePeriod/shutdownGracePeriodCriticalPods are both set; use one"
    )]
    BothForms,
    /// logind's `InhibitDelayMaxSec` is shorter than the groups need, and node-monitor may not
    /// raise it.
    #[error(
        "the shutdown groups need {needed}s but logind's InhibitDelayMaxSec allows {allowed}s; raise it (nodeMonitor.shutdown.manageInhibitDelay) or shorten the groups"
    )]
    ExceedsInhibitDelay {
        /// The groups' budget, seconds.
        needed: u64,
        /// `InhibitDelayMaxSec`, seconds.
        allowed: u64,
    },
}

/// A group of the plan's configuration: pods at or above `priority` (and below the next group's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Group {
    /// The lowest pod priority of the group.
    pub priority: i32,
    /// How long the group's pods get, counted from the group's start.
    pub period: Duration,
}

impl ShutdownSettings {
    /// The groups, sorted by priority ascending, validated. Empty when shutdown handling is off
    /// (no priority list and a zero `shutdownGracePeriod`).
    pub fn groups(&self) -> Result<Vec<Group>, ShutdownConfigError> {
        let total = self.shutdown_grace_period;
        let critical = self.shutdown_grace_period_critical_pods;
        for (field, value) in [
            ("shutdownGracePeriod", total),
            ("shutdownGracePeriodCriticalPods", critical),
        ] {
            if value.is_negative() {
                return Err(ShutdownConfigError::Negative {
                    field,
                    value: value.to_string(),
                });
            }
            if value.0 > 0 && value < GoDuration::from_secs(1) {
                return Err(ShutdownConfigError::SubSecond {
                    field,
                    value: value.to_string(),
                });
            }
        }
        if critical > total {
            return Err(ShutdownConfigError::CriticalExceedsTotal {
                critical: critical.to_string(),
                total: total.to_string(),
            });
        }
        if !self.shutdown_grace_period_by_pod_priority.is_empty() {
            if total.0 != 0 || critical.0 != 0 {
                return Err(ShutdownConfigError::BothForms);
            }
            let mut seen = BTreeSet::new();
            let mut groups = Vec::new();
            // Summed in seconds as i128: no entry list can overflow it.
            let mut total_seconds: i128 = 0;
            for p in &self.shutdown_grace_period_by_pod_priority {
                if p.shutdown_grace_period_seconds < 0 {
                    return Err(ShutdownConfigError::Negative {
                        field: "shutdownGracePeriodByPodPriority.shutdownGracePeriodSeconds",
                        value: p.shutdown_grace_period_seconds.to_string(),
                    });
                }
                if !seen.insert(p.priority) {
                    return Err(ShutdownConfigError::DuplicatePriority(p.priority));
                }
                total_seconds += i128::from(p.shutdown_grace_period_seconds);
                groups.push(Group {
                    priority: p.priority,
                    period: secs(p.shutdown_grace_period_seconds),
                });
            }
            if total_seconds > i128::from(LOGIND_MAX_DELAY.as_secs()) {
                return Err(ShutdownConfigError::BudgetTooLong {
                    field: "shutdownGracePeriodByPodPriority",
                    needed_seconds: total_seconds.unsigned_abs(),
                    max_seconds: LOGIND_MAX_DELAY.as_secs(),
                });
            }
            groups.sort_by_key(|g| g.priority);
            return Ok(groups);
        }
        if total.0 == 0 {
            return Ok(Vec::new());
        }
        // migrateConfig: the regular group gets total − critical, the critical group the rest,
        // each truncated to whole seconds.
        let regular = GoDuration(total.0 - critical.0);
        let critical_rest = GoDuration(total.0 - regular.0);
        Ok(vec![
            Group {
                priority: 0,
                period: secs(regular.whole_seconds()),
            },
            Group {
                priority: SYSTEM_CRITICAL_PRIORITY,
                period: secs(critical_rest.whole_seconds()),
            },
        ])
    }

    /// The budget the groups need from logind: the sum of their periods (`periodRequested`).
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

/// What node-monitor does when the kubelet holds a shutdown inhibitor of its own
/// (`nodeMonitor.shutdown.kubeletInhibitorPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum KubeletInhibitorPolicy {
    /// Terminate the pods through the API anyway, with node-monitor's plan.
    TakeOver,
    /// Hold a lock and mark the node, but leave terminating the pods to the kubelet; wait for
    /// the API to show them finished before releasing.
    #[default]
    Cooperate,
    /// Take no lock and mark nothing; only watch (bypass detection still works).
    StandAside,
}

impl KubeletInhibitorPolicy {
    /// Every policy with its configuration spelling.
    pub const ALL: [(&'static str, KubeletInhibitorPolicy); 3] = [
        ("takeOver", KubeletInhibitorPolicy::TakeOver),
        ("cooperate", KubeletInhibitorPolicy::Cooperate),
        ("standAside", KubeletInhibitorPolicy::StandAside),
    ];
}

/// node-monitor's part in a shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Hold the lock, mark the node, terminate the pods group by group through the API.
    Terminate,
    /// Hold the lock, mark the node, wait for the kubelet to finish the pods.
    Observe,
    /// Hold no lock; watch only.
    Passive,
}

/// The role for a policy, given whether the kubelet holds its own shutdown delay inhibitor.
/// Without one, node-monitor is the only graceful shutdown there is, whatever the policy.
pub fn role(policy: KubeletInhibitorPolicy, kubelet_holds_inhibitor: bool) -> Role {
    match (kubelet_holds_inhibitor, policy) {
        (false, _) | (true, KubeletInhibitorPolicy::TakeOver) => Role::Terminate,
        (true, KubeletInhibitorPolicy::Cooperate) => Role::Observe,
        (true, KubeletInhibitorPolicy::StandAside) => Role::Passive,
    }
}

/// One row of logind's `ListInhibitors` (`a(ssssuu)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inhibitor {
    /// What is inhibited, colon-separated (`shutdown:sleep`).
    pub what: String,
    /// The holder's name (`kubelet`, `node-monitor`).
    pub who: String,
    /// The holder's reason, free text.
    pub why: String,
    /// `delay` (postpones for up to `InhibitDelayMaxSec`) or `block`.
    pub mode: String,
    /// The holder's user ID.
    pub uid: u32,
    /// The holder's process ID.
    pub pid: u32,
}

/// Whether the kubelet holds a shutdown delay inhibitor (`who` is `kubelet`, as
/// `pkg/kubelet/nodeshutdown/systemd/inhibit_linux.go` names it).
pub fn kubelet_holds_inhibitor(inhibitors: &[Inhibitor]) -> bool {
    inhibitors.iter().any(|i| {
        i.who == "kubelet" && i.mode == "delay" && i.what.split(':').any(|w| w == "shutdown")
    })
}

/// What to do about logind's `InhibitDelayMaxSec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DelayCheck {
    /// logind already waits long enough.
    Sufficient,
    /// Write a drop-in raising it to this many seconds and reload logind.
    Raise {
        /// The new `InhibitDelayMaxSec`: the needed delay rounded up to whole seconds.
        seconds: u64,
    },
    /// Too low and not ours to change.
    TooLow {
        /// The delay the shutdown groups need.
        needed: Duration,
        /// logind's current `InhibitDelayMaxSec`.
        allowed: Duration,
    },
}

/// Compares the delay the shutdown needs with logind's, and says whether to raise it.
pub fn inhibit_delay_check(needed: Duration, current: Duration, manage: bool) -> DelayCheck {
    if needed <= current {
        DelayCheck::Sufficient
    } else if manage {
        // Whole seconds, rounded up: logind.conf takes seconds here.
        let seconds = needed.as_secs() + u64::from(needed.subsec_nanos() > 0);
        DelayCheck::Raise { seconds }
    } else {
        DelayCheck::TooLow {
            needed,
            allowed: current,
        }
    }
}

/// The logind.conf drop-in that raises `InhibitDelayMaxSec` (logind.conf(5)).
pub fn logind_dropin(seconds: u64) -> String {
    format!(
        "# Written by node-monitor: graceful node shutdown needs logind to wait this long for\n\
         # delay inhibitors (nodeMonitor.shutdown.manageInhibitDelay).\n\
         [Login]\nInhibitDelayMaxSec={seconds}\n"
    )
}

/// Whether `text` is a drop-in node-monitor wrote and nobody changed since: exactly
/// [`logind_dropin`] for some number of seconds. Only such a file is removed when the agent stops.
pub fn is_own_dropin(text: &str) -> bool {
    let Some(value) = text
        .lines()
        .find_map(|l| l.strip_prefix("InhibitDelayMaxSec="))
    else {
        return false;
    };
    value
        .parse::<u64>()
        .is_ok_and(|seconds| logind_dropin(seconds) == text)
}

/// A last gasp is sent at most once in this long: a process that may reboot the node but keeps
/// calling reboot(2) without effect (a kexec with no kernel loaded fails with EINVAL) makes one
/// API write per interval, not one per call.
pub const LAST_GASP_MIN_INTERVAL: Duration = Duration::from_secs(600);
/// Reboot requests that cannot take the node down are logged at most once in this long per
/// verdict; the line says how many went unlogged since the previous one.
pub const REBOOT_LOG_INTERVAL: Duration = Duration::from_secs(60);

/// A reboot(2) request from the kernel probe, as the shutdown manager decides on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebootRequest {
    /// The probe's verdict (see [`effective_gate`]).
    pub gate: RebootGate,
    /// Requests with the same verdict the probe withheld (rate limit) before this one.
    pub suppressed: u32,
}

/// The verdict the agent acts on: the probe's, unless the probe says `allowed` and the reported
/// caller and arguments say otherwise (the agent recomputes it from them; a disagreement means
/// mismatched kernel and agent builds, and never widens what counts as a shutdown).
pub fn effective_gate(
    reported: RebootGate,
    caller: Option<RebootCaller>,
    magic1: u32,
    magic2: u32,
    cmd: u32,
) -> RebootGate {
    match reported {
        RebootGate::Allowed => reboot_gate(caller, magic1, magic2, cmd),
        other => other,
    }
}

/// What the shutdown manager remembers about reboot requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RebootRequests {
    /// When the last last gasp went out.
    last_gasp: Option<Timestamp>,
    /// Per verdict: when it was last logged, and requests not logged since.
    logged: BTreeMap<RebootGate, (Timestamp, u64)>,
}

/// What to do about a reboot request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebootAction {
    /// Count `n` requests the kernel refuses, under `reason` (`RebootGate::refusal`).
    CountRefused {
        /// Why the kernel refuses them (`RebootGate::refusal`: `capability`, `magic`, …).
        reason: &'static str,
        /// How many: this request and those the probe withheld.
        n: u64,
    },
    /// Count `n` requests whose caller could not be checked.
    CountUnverified {
        /// How many: this request and those the probe withheld.
        n: u64,
    },
    /// Log the request; `unlogged` earlier requests with its verdict went unlogged (rate limit
    /// here or in the probe).
    Log {
        /// The request's verdict.
        gate: RebootGate,
        /// Earlier requests with this verdict not logged.
        unlogged: u64,
    },
    /// The end of a shutdown logind announced.
    Graceful,
    /// A shutdown that went around logind and every inhibitor: count it.
    Bypassed,
    /// Tell the API at once (the configured last gasp).
    LastGasp,
    /// A last gasp was due, but one went out at `previous`, less than
    /// [`LAST_GASP_MIN_INTERVAL`] ago: no API write.
    LastGaspSuppressed {
        /// When the previous last gasp went out.
        previous: Timestamp,
    },
}

impl RebootRequests {
    /// The actions for one request at `now`; `preparing` when logind announced a shutdown not
    /// cancelled since. Only an `allowed` request can become a bypass and a last gasp; refused
    /// and unverified ones are counted and logged at most once per [`REBOOT_LOG_INTERVAL`] per
    /// verdict.
    pub fn on_request(
        &mut self,
        req: RebootRequest,
        preparing: bool,
        now: Timestamp,
    ) -> Vec<RebootAction> {
        let n = 1 + u64::from(req.suppressed);
        let mut out = Vec::new();
        match req.gate {
            RebootGate::Allowed => {
                match classify_reboot(true, preparing) {
                    RebootVerdict::Graceful => out.push(RebootAction::Graceful),
                    _ => {
                        out.push(RebootAction::Bypassed);
                        match self.last_gasp {
                            Some(previous)
                                if now.saturating_since(previous) < LAST_GASP_MIN_INTERVAL =>
                            {
                                out.push(RebootAction::LastGaspSuppressed { previous });
                            }
                            _ => {
                                self.last_gasp = Some(now);
                                out.push(RebootAction::LastGasp);
                            }
                        }
                    }
                }
                return out;
            }
            RebootGate::Unverified => out.push(RebootAction::CountUnverified { n }),
            RebootGate::NotShutdown => {}
            refused => {
                if let Some(reason) = refused.refusal() {
                    out.push(RebootAction::CountRefused { reason, n });
                }
            }
        }
        let pending = match self.logged.get(&req.gate) {
            None => Some(0),
            Some(&(at, pending)) if now.saturating_since(at) >= REBOOT_LOG_INTERVAL => {
                Some(pending)
            }
            Some(_) => None,
        };
        match pending {
            Some(pending) => {
                self.logged.insert(req.gate, (now, 0));
                out.push(RebootAction::Log {
                    gate: req.gate,
                    unlogged: pending + u64::from(req.suppressed),
                });
            }
            None => {
                if let Some(entry) = self.logged.get_mut(&req.gate) {
                    entry.1 += n;
                }
            }
        }
        out
    }
}

/// What a reboot(2) seen by the kernel probe means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RebootVerdict {
    /// The command does not take the machine down (e.g. enabling Ctrl-Alt-Del).
    NotShutdown,
    /// The end of a shutdown logind announced: graceful.
    Graceful,
    /// A shutdown that went around logind and every inhibitor.
    BypassedInhibitor,
}

/// Classifies a reboot(2) call: `goes_down` from the command, `preparing` when logind announced
/// a shutdown (PrepareForShutdown(true)) not cancelled since.
pub fn classify_reboot(goes_down: bool, preparing: bool) -> RebootVerdict {
    match (goes_down, preparing) {
        (false, _) => RebootVerdict::NotShutdown,
        (true, true) => RebootVerdict::Graceful,
        (true, false) => RebootVerdict::BypassedInhibitor,
    }
}

/// Counts pods per group for a log line: `{priority: pods}`.
pub fn plan_summary(plan: &ShutdownPlan) -> BTreeMap<i32, usize> {
    plan.groups
        .iter()
        .map(|g| (g.priority, g.pods.len()))
        .collect()
}

#[cfg(test)]
mod tests;
