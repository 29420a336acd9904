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
                .map(|&(priority, s)| PriorityPeriod {
                    priority,
                    shutdown_grace_period_seconds: s,
                })
                .collect(),
            ..ShutdownSettings::default()
        }
    }

    fn legacy(total: GoDuration, critical: GoDuration) -> ShutdownSettings {
        ShutdownSettings {
            shutdown_grace_period: total,
            shutdown_grace_period_critical_pods: critical,
            ..ShutdownSettings::default()
        }
    }

    #[test]
    fn legacy_fields_become_two_groups() {
        let s = legacy(GoDuration::from_secs(30), GoDuration::from_secs(10));
        assert_eq!(
            s.groups(),
            Ok(vec![
                Group {
                    priority: 0,
                    period: Duration::from_secs(20)
                },
                Group {
                    priority: SYSTEM_CRITICAL_PRIORITY,
                    period: Duration::from_secs(10)
                },
            ])
        );
        assert_eq!(s.budget(), Ok(Duration::from_secs(30)));
        assert_eq!(ShutdownSettings::default().groups(), Ok(vec![]));
        // Sub-second remainders are truncated per group, as Go's int64(d / time.Second) does.
        let s = legacy(GoDuration::from_millis(2500), GoDuration::from_millis(1200));
        let periods: Vec<u64> = s
            .groups()
            .expect("valid")
            .iter()
            .map(|g| g.period.as_secs())
            .collect();
        assert_eq!(periods, vec![1, 1]);
    }

    /// The kubelet's field names and formats: Go duration strings and the priority list.
    #[test]
    fn serde_uses_kubelet_configuration_names() {
        let yaml = "shutdownGracePeriod: 1m30s\nshutdownGracePeriodCriticalPods: 30s\n";
        let s: ShutdownSettings = serde_norway::from_str(yaml).expect("legacy form");
        assert_eq!(
            s,
            legacy(GoDuration::from_secs(90), GoDuration::from_secs(30))
        );
        let yaml = "shutdownGracePeriodByPodPriority:\n  - priority: 100000\n    shutdownGracePeriodSeconds: 10\n  - priority: 0\n    shutdownGracePeriodSeconds: 60\n";
        let s: ShutdownSettings = serde_norway::from_str(yaml).expect("priority form");
        assert_eq!(s, by_priority(&[(100_000, 10), (0, 60)]));
        let json = serde_json::to_value(legacy(GoDuration::from_secs(90), GoDuration::ZERO))
            .expect("json");
        assert_eq!(json["shutdownGracePeriod"], "1m30s");
        assert_eq!(json["shutdownGracePeriodCriticalPods"], "0s");
        let err = serde_norway::from_str::<ShutdownSettings>("shutdownGracePeriod: 30\n")
            .expect_err("a number without a unit is not a Go duration");
        assert!(
            err.to_string().contains("missing unit in duration \"30\""),
            "{err}"
        );
        assert_eq!(GoDuration::from_secs(-5).to_string(), "-5s");
    }

    /// The seed's example: 100000→10 s, 10000→180 s, 1000→120 s, 0→60 s.
    #[test]
    fn seed_example_groups_and_periods() {
        let s = by_priority(&[(100_000, 10), (10_000, 180), (1_000, 120), (0, 60)]);
        let groups = s.groups().expect("valid");
        assert_eq!(
            groups.iter().map(|g| g.priority).collect::<Vec<_>>(),
            vec![0, 1_000, 10_000, 100_000]
        );
        assert_eq!(s.budget(), Ok(Duration::from_secs(370)));
        let pods = [
            pod("custom-class-a", 2_000, Some(600)), // 1000 ≤ 2000 < 10000 → 120 s group
            pod("custom-class-b", 20_000, Some(5)),  // own 5 s < 180 s
            pod("low", -5, None), // below every group → lowest; no own period → 60 s
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
                    g.pods
                        .iter()
                        .map(|pp| (pp.pod.name.as_str(), pp.grace_period_seconds))
                        .collect(),
                    g.latest_start.as_secs(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (0, vec![("low", 60)], 0),
                (1_000, vec![("custom-class-a", 120)], 60),
                (10_000, vec![("custom-class-b", 5)], 180),
                (100_000, vec![("critical", 10)], 360),
            ]
        );
        assert_eq!(p.pod_count(), 4);
        assert_eq!(plan_summary(&p).get(&1_000), Some(&1));
    }

    #[test]
    fn empty_groups_are_skipped_and_take_no_time() {
        let s = by_priority(&[(0, 20), (1_000, 30), (10_000, 40)]);
        let p = plan(
            &s.groups().expect("valid"),
            &[pod("a", 0, Some(5)), pod("c", 50_000, Some(100))],
        );
        let got: Vec<(i32, u64)> = p
            .groups
            .iter()
            .map(|g| (g.priority, g.latest_start.as_secs()))
            .collect();
        assert_eq!(got, vec![(0, 0), (10_000, 20)]);
        assert_eq!(p.groups[1].pods[0].grace_period_seconds, 40);
    }

    #[test]
    fn invalid_configurations_name_the_field() {
        let cases: Vec<(ShutdownSettings, ShutdownConfigError, &str)> = vec![
            (
                legacy(GoDuration::from_secs(-1), GoDuration::ZERO),
                ShutdownConfigError::Negative {
                    field: "shutdownGracePeriod",
                    value: "-1s".into(),
                },
                "shutdownGracePeriod: -1s is negative",
            ),
            (
                legacy(GoDuration::from_millis(500), GoDuration::ZERO),
                ShutdownConfigError::SubSecond {
                    field: "shutdownGracePeriod",
                    value: "500ms".into(),
                },
                ">= 1s",
            ),
            (
                legacy(GoDuration::from_secs(10), GoDuration::from_millis(200)),
                ShutdownConfigError::SubSecond {
                    field: "shutdownGracePeriodCriticalPods",
                    value: "200ms".into(),
                },
                "shutdownGracePeriodCriticalPods: 200ms",
            ),
            (
                legacy(GoDuration::from_secs(10), GoDuration::from_secs(20)),
                ShutdownConfigError::CriticalExceedsTotal {
                    critical: "20s".into(),
                    total: "10s".into(),
                },
                "20s exceeds shutdownGracePeriod: 10s",
            ),
            (
                by_priority(&[(0, 10), (0, 20)]),
                ShutdownConfigError::DuplicatePriority(0),
                "priority 0",
            ),
            (
                by_priority(&[(0, -3)]),
                ShutdownConfigError::Negative {
                    field: "shutdownGracePeriodByPodPriority.shutdownGracePeriodSeconds",
                    value: "-3".into(),
                },
                "shutdownGracePeriodSeconds: -3 is negative",
            ),
            (
                ShutdownSettings {
                    shutdown_grace_period: GoDuration::from_secs(5),
                    ..by_priority(&[(0, 10)])
                },
                ShutdownConfigError::BothForms,
                "both set",
            ),
            // Each entry is valid, the sum is more than logind can wait (and more than a
            // Duration sum could hold).
            (
                by_priority(&[(0, i64::MAX), (1, i64::MAX), (2, i64::MAX)]),
                ShutdownConfigError::BudgetTooLong {
                    field: "shutdownGracePeriodByPodPriority",
                    needed_seconds: 3 * u128::from(i64::MAX.unsigned_abs()),
                    max_seconds: 18_446_744_073_709,
                },
                "need 27670116110564327421s in total",
            ),
            (
                by_priority(&[(0, 18_446_744_073_710)]),
                ShutdownConfigError::BudgetTooLong {
                    field: "shutdownGracePeriodByPodPriority",
                    needed_seconds: 18_446_744_073_710,
                    max_seconds: 18_446_744_073_709,
                },
                "(18446744073709s)",
            ),
        ];
        for (s, want, text) in cases {
            assert_eq!(s.groups(), Err(want.clone()), "{s:?}");
            assert!(
                want.to_string().contains(text),
                "{want} should contain {text:?}"
            );
        }
    }

    /// The longest budget logind can hold is accepted, and its plan's offsets do not overflow.
    #[test]
    fn the_longest_budget_logind_holds_is_accepted() {
        let max = LOGIND_MAX_DELAY.as_secs();
        let half = i64::try_from(max / 2).expect("fits");
        let rest = i64::try_from(max).expect("fits") - half;
        let s = by_priority(&[(0, half), (1, rest)]);
        let groups = s.groups().expect("within logind's limit");
        assert_eq!(s.budget(), Ok(Duration::from_secs(max)));
        let p = plan(&groups, &[pod("a", 0, None), pod("b", 1, None)]);
        assert_eq!(p.groups[1].latest_start, Duration::from_secs(max / 2));
        // One second more is refused.
        assert!(matches!(
            by_priority(&[(0, half), (1, rest + 1)]).groups(),
            Err(ShutdownConfigError::BudgetTooLong { .. })
        ));
    }

    #[test]
    fn budget_must_fit_logind_delay() {
        assert_eq!(
            check_inhibit_delay(Duration::from_secs(30), Duration::from_secs(30)),
            Ok(())
        );
        let err = check_inhibit_delay(Duration::from_secs(30), Duration::from_secs(5))
            .expect_err("too long");
        assert_eq!(
            err,
            ShutdownConfigError::ExceedsInhibitDelay {
                needed: 30,
                allowed: 5
            }
        );
        assert!(
            err.to_string().contains("InhibitDelayMaxSec allows 5s"),
            "{err}"
        );
    }

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn uids(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| format!("uid-{n}")).collect()
    }

    fn three_groups() -> ShutdownPlan {
        let groups = by_priority(&[(0, 10), (1_000, 20), (100_000, 5)])
            .groups()
            .expect("valid");
        plan(
            &groups,
            &[
                pod("low-a", 0, Some(3)),
                pod("low-b", 10, Some(30)),
                pod("mid", 5_000, Some(3)),
                pod("top", 200_000, Some(3)),
            ],
        )
    }

    /// Steps of a run, as short strings, for table-driven checks.
    fn describe(steps: &[Step]) -> Vec<String> {
        steps
            .iter()
            .map(|s| match s {
                Step::StartGroup { priority, pods, .. } => format!(
                    "start {priority} [{}]",
                    pods.iter()
                        .map(|p| format!("{}:{}", p.pod.name, p.grace_period_seconds))
                        .collect::<Vec<_>>()
                        .join(",")
                ),
                Step::EndGroup {
                    priority,
                    outcome: GroupOutcome::AllGone,
                    ..
                } => {
                    format!("end {priority} gone")
                }
                Step::EndGroup {
                    priority,
                    outcome: GroupOutcome::PeriodElapsed { remaining },
                    ..
                } => {
                    format!("end {priority} elapsed {}", remaining.join(","))
                }
                Step::Release => "release".into(),
            })
            .collect()
    }

    /// The run with a fixed clock: (time ms, pods the API still shows, expected steps, deadline ms).
    #[test]
    fn run_goes_group_by_group_until_gone_or_elapsed() {
        let mut run = ShutdownRun::new(three_groups(), t(0));
        type Case = (
            u64,
            &'static [&'static str],
            &'static [&'static str],
            Option<u64>,
        );
        let cases: &[Case] = &[
            (
                0,
                &["low-a", "low-b", "mid", "top"],
                &["start 0 [low-a:3,low-b:10]"],
                Some(10_000),
            ),
            // One low pod gone: the group goes on.
            (2_000, &["low-b", "mid", "top"], &[], Some(10_000)),
            // Period elapsed with low-b still there: end, and the next group starts at once.
            (
                10_000,
                &["low-b", "mid", "top"],
                &["end 0 elapsed ns/low-b", "start 1000 [mid:3]"],
                Some(30_000),
            ),
            // mid gone well before its 20 s: the top group starts without waiting.
            (
                12_500,
                &["low-b", "top"],
                &["end 1000 gone", "start 100000 [top:3]"],
                Some(17_500),
            ),
            (13_000, &["low-b", "top"], &[], Some(17_500)),
            (14_000, &["low-b"], &["end 100000 gone", "release"], None),
            // Nothing after the release.
            (20_000, &[], &[], None),
        ];
        for &(now, present, want, deadline) in cases {
            let steps = run.advance(t(now), &uids(present));
            assert_eq!(describe(&steps), want, "at {now} ms");
            assert_eq!(run.deadline(), deadline.map(t), "deadline at {now} ms");
        }
        assert!(run.is_finished());
        assert_eq!(run.released(), Some(t(14_000)));
        let rec: Vec<(i32, u64, Option<u64>)> = run
            .records()
            .iter()
            .map(|r| {
                (
                    r.priority,
                    r.started.since_origin().as_millis() as u64,
                    r.ended.map(|e| e.since_origin().as_millis() as u64),
                )
            })
            .collect();
        assert_eq!(
            rec,
            vec![
                (0, 0, Some(10_000)),
                (1_000, 10_000, Some(12_500)),
                (100_000, 12_500, Some(14_000))
            ]
        );
    }

    #[test]
    fn run_without_pods_releases_at_once_and_abort_stops_early() {
        let mut run = ShutdownRun::new(ShutdownPlan::default(), t(5));
        assert_eq!(
            describe(&run.advance(t(5), &BTreeSet::new())),
            vec!["release"]
        );
        assert_eq!(run.released(), Some(t(5)));

        let mut run = ShutdownRun::new(three_groups(), t(0));
        run.advance(t(0), &uids(&["low-a", "low-b", "mid", "top"]));
        assert_eq!(run.current_pods().len(), 2);
        let step = run.abort(t(1_000), &uids(&["low-b", "mid", "top"]));
        assert_eq!(
            describe(&step.into_iter().collect::<Vec<_>>()),
            vec!["end 0 elapsed ns/low-b"]
        );
        assert!(run.is_finished());
        assert_eq!(run.deadline(), None);
        assert!(
            run.advance(t(2_000), &BTreeSet::new()).is_empty(),
            "no group starts after an abort"
        );
        assert!(run.abort(t(3_000), &BTreeSet::new()).is_none());
    }

    /// Pods gone before their group starts (deleted by someone else) end the group on the next
    /// call, without waiting for its period.
    #[test]
    fn pods_gone_early_do_not_hold_their_group() {
        let mut run = ShutdownRun::new(three_groups(), t(0));
        assert_eq!(
            describe(&run.advance(t(0), &uids(&["low-a", "low-b"]))),
            vec!["start 0 [low-a:3,low-b:10]"]
        );
        assert_eq!(
            describe(&run.advance(t(100), &uids(&[]))),
            vec!["end 0 gone", "start 1000 [mid:3]"]
        );
        assert_eq!(
            describe(&run.advance(t(200), &uids(&[]))),
            vec!["end 1000 gone", "start 100000 [top:3]"]
        );
        assert_eq!(
            describe(&run.advance(t(300), &uids(&[]))),
            vec!["end 100000 gone", "release"]
        );
    }

    #[test]
    fn role_follows_policy_only_when_the_kubelet_holds_a_lock() {
        use KubeletInhibitorPolicy::*;
        let cases = [
            (TakeOver, false, Role::Terminate),
            (Cooperate, false, Role::Terminate),
            (StandAside, false, Role::Terminate),
            (TakeOver, true, Role::Terminate),
            (Cooperate, true, Role::Observe),
            (StandAside, true, Role::Passive),
        ];
        for (policy, kubelet, want) in cases {
            assert_eq!(role(policy, kubelet), want, "{policy:?} kubelet={kubelet}");
        }
    }

    #[test]
    fn kubelet_inhibitor_is_recognised() {
        let inh = |what: &str, who: &str, mode: &str| Inhibitor {
            what: what.into(),
            who: who.into(),
            why: "Kubelet needs time to handle node shutdown".into(),
            mode: mode.into(),
            uid: 0,
            pid: 42,
        };
        let cases = [
            (vec![inh("shutdown", "kubelet", "delay")], true),
            (vec![inh("sleep:shutdown", "kubelet", "delay")], true),
            (vec![inh("shutdown", "kubelet", "block")], false),
            (vec![inh("sleep", "kubelet", "delay")], false),
            (
                vec![
                    inh("shutdown", "node-monitor", "delay"),
                    inh("handle-power-key", "kubelet", "block"),
                ],
                false,
            ),
            (vec![], false),
        ];
        for (list, want) in cases {
            assert_eq!(kubelet_holds_inhibitor(&list), want, "{list:?}");
        }
    }

    #[test]
    fn inhibit_delay_decisions() {
        let s = Duration::from_secs;
        let cases = [
            (s(30), s(30), true, DelayCheck::Sufficient),
            (s(30), s(60), false, DelayCheck::Sufficient),
            (s(30), s(5), true, DelayCheck::Raise { seconds: 30 }),
            (
                Duration::from_millis(30_200),
                s(5),
                true,
                DelayCheck::Raise { seconds: 31 },
            ),
            (
                s(30),
                s(5),
                false,
                DelayCheck::TooLow {
                    needed: s(30),
                    allowed: s(5),
                },
            ),
        ];
        for (needed, current, manage, want) in cases {
            assert_eq!(
                inhibit_delay_check(needed, current, manage),
                want,
                "{needed:?} {current:?} {manage}"
            );
        }
        let dropin = logind_dropin(23);
        assert!(
            dropin.contains("[Login]\nInhibitDelayMaxSec=23\n"),
            "{dropin}"
        );
    }

    #[test]
    fn own_dropin_is_told_from_an_edited_one() {
        let own = logind_dropin(29);
        let cases = [
            (own.clone(), true),
            (logind_dropin(0), true),
            (own.replace("=29", "=30"), true),
            (own.replace("=29", "=29s"), false),
            (format!("{own}HandlePowerKey=ignore\n"), false),
            (own.replace("# Written by node-monitor", "# Mine"), false),
            ("[Login]\nInhibitDelayMaxSec=29\n".to_owned(), false),
            (String::new(), false),
        ];
        for (text, want) in cases {
            assert_eq!(is_own_dropin(&text), want, "{text:?}");
        }
    }

    #[test]
    fn reboot_classification() {
        let cases = [
            (true, false, RebootVerdict::BypassedInhibitor),
            (true, true, RebootVerdict::Graceful),
            (false, false, RebootVerdict::NotShutdown),
            (false, true, RebootVerdict::NotShutdown),
        ];
        for (down, preparing, want) in cases {
            assert_eq!(
                classify_reboot(down, preparing),
                want,
                "down={down} preparing={preparing}"
            );
        }
        assert_eq!(group_phase(1_000), "priority_1000");
    }

    fn req(gate: RebootGate, suppressed: u32) -> RebootRequest {
        RebootRequest { gate, suppressed }
    }

    #[test]
    fn refused_and_unverified_requests_never_become_a_last_gasp() {
        use RebootAction::*;
        let t = Timestamp::from_secs(1000);
        // (verdict, suppressed, preparing, actions of a first request)
        let cases = [
            (RebootGate::Allowed, 0, false, vec![Bypassed, LastGasp]),
            (RebootGate::Allowed, 5, true, vec![Graceful]),
            (
                RebootGate::RefusedPidNs,
                0,
                false,
                vec![
                    CountRefused {
                        reason: "pid_namespace",
                        n: 1,
                    },
                    Log {
                        gate: RebootGate::RefusedPidNs,
                        unlogged: 0,
                    },
                ],
            ),
            (
                RebootGate::RefusedUserNs,
                0,
                true,
                vec![
                    CountRefused {
                        reason: "user_namespace",
                        n: 1,
                    },
                    Log {
                        gate: RebootGate::RefusedUserNs,
                        unlogged: 0,
                    },
                ],
            ),
            (
                // The probe withheld 9 before this one: all ten are counted and said.
                RebootGate::RefusedCap,
                9,
                false,
                vec![
                    CountRefused {
                        reason: "capability",
                        n: 10,
                    },
                    Log {
                        gate: RebootGate::RefusedCap,
                        unlogged: 9,
                    },
                ],
            ),
            (
                RebootGate::RefusedMagic,
                0,
                false,
                vec![
                    CountRefused {
                        reason: "magic",
                        n: 1,
                    },
                    Log {
                        gate: RebootGate::RefusedMagic,
                        unlogged: 0,
                    },
                ],
            ),
            (
                RebootGate::Unverified,
                2,
                false,
                vec![
                    CountUnverified { n: 3 },
                    Log {
                        gate: RebootGate::Unverified,
                        unlogged: 2,
                    },
                ],
            ),
            (
                RebootGate::NotShutdown,
                0,
                false,
                vec![Log {
                    gate: RebootGate::NotShutdown,
                    unlogged: 0,
                }],
            ),
        ];
        for (gate, suppressed, preparing, want) in cases {
            let mut state = RebootRequests::default();
            assert_eq!(
                state.on_request(req(gate, suppressed), preparing, t),
                want,
                "{gate:?} suppressed={suppressed} preparing={preparing}"
            );
        }
    }

    #[test]
    fn a_flood_of_refused_requests_is_counted_and_logged_once_per_interval() {
        let mut state = RebootRequests::default();
        let t0 = Timestamp::from_secs(50);
        let mut logs = Vec::new();
        let mut counted = 0;
        // 1000 refused calls, one every 100 ms, over 100 s.
        for i in 0..1000u64 {
            let now = t0 + Duration::from_millis(100 * i);
            for a in state.on_request(req(RebootGate::RefusedCap, 0), false, now) {
                match a {
                    RebootAction::CountRefused { n, .. } => counted += n,
                    RebootAction::Log { unlogged, .. } => logs.push((now, unlogged)),
                    other => panic!("a refused request must not do {other:?}"),
                }
            }
        }
        assert_eq!(counted, 1000);
        // At t0, t0 + 60 s: the second line says 599 went unlogged.
        assert_eq!(logs, vec![(t0, 0), (t0 + Duration::from_secs(60), 599)]);
        // Another verdict has its own interval.
        let actions = state.on_request(
            req(RebootGate::RefusedPidNs, 0),
            false,
            t0 + Duration::from_secs(1),
        );
        assert!(actions.contains(&RebootAction::Log {
            gate: RebootGate::RefusedPidNs,
            unlogged: 0
        }));
    }

    #[test]
    fn last_gasps_are_rate_limited() {
        use RebootAction::*;
        let mut state = RebootRequests::default();
        let t0 = Timestamp::from_secs(5);
        let allowed = req(RebootGate::Allowed, 0);
        assert_eq!(
            state.on_request(allowed, false, t0),
            vec![Bypassed, LastGasp]
        );
        // A privileged process calling again and again (the node stayed up): counted, no write.
        for s in [1, 30, 599] {
            assert_eq!(
                state.on_request(allowed, false, t0 + Duration::from_secs(s)),
                vec![Bypassed, LastGaspSuppressed { previous: t0 }],
                "{s}s later"
            );
        }
        // A graceful shutdown in between neither sends nor resets anything.
        assert_eq!(
            state.on_request(allowed, true, t0 + Duration::from_secs(300)),
            vec![Graceful]
        );
        // Refused requests never touch the last-gasp interval.
        let _ = state.on_request(
            req(RebootGate::RefusedCap, 0),
            false,
            t0 + Duration::from_secs(400),
        );
        let later = t0 + LAST_GASP_MIN_INTERVAL;
        assert_eq!(
            state.on_request(allowed, false, later),
            vec![Bypassed, LastGasp]
        );
        assert_eq!(
            state.on_request(allowed, false, later + Duration::from_secs(1)),
            vec![Bypassed, LastGaspSuppressed { previous: later }]
        );
    }

    #[test]
    fn an_allowed_verdict_the_fields_contradict_is_not_trusted() {
        const RESTART: u32 = 0x0123_4567;
        let root = RebootCaller {
            cap_effective: 1 << 22,
            pid_ns_level: 0,
            user_ns_level: 0,
        };
        let child = RebootCaller {
            pid_ns_level: 1,
            ..root
        };
        let m1 = 0xfee1_dead;
        let m2 = 672_274_793;
        let cases = [
            (
                RebootGate::Allowed,
                Some(root),
                m1,
                m2,
                RESTART,
                RebootGate::Allowed,
            ),
            (
                RebootGate::Allowed,
                Some(child),
                m1,
                m2,
                RESTART,
                RebootGate::RefusedPidNs,
            ),
            (
                RebootGate::Allowed,
                None,
                m1,
                m2,
                RESTART,
                RebootGate::Unverified,
            ),
            (
                RebootGate::Allowed,
                Some(root),
                m1,
                3,
                RESTART,
                RebootGate::RefusedMagic,
            ),
            (
                RebootGate::Allowed,
                Some(root),
                m1,
                m2,
                0,
                RebootGate::NotShutdown,
            ),
            // A refusal is kept as reported.
            (
                RebootGate::RefusedCap,
                Some(root),
                m1,
                m2,
                RESTART,
                RebootGate::RefusedCap,
            ),
            (
                RebootGate::Unverified,
                None,
                m1,
                m2,
                RESTART,
                RebootGate::Unverified,
            ),
        ];
        for (reported, caller, a, b, cmd, want) in cases {
            assert_eq!(
                effective_gate(reported, caller, a, b, cmd),
                want,
                "{reported:?} {caller:?}"
            );
        }
    }
}
