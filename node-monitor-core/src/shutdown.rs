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
mod reboot;
mod run;

pub use reboot::*;
pub use run::*;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    time::Duration,
};

use serde::{Deserialize, Serialize};

pub use crate::config::shutdown_model::KubeletInhibitorPolicy;
use crate::{
    kubelet::pod::SYSTEM_CRITICAL_PRIORITY,
    units::duration::{format_go_duration, parse_go_duration},
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
    pub fn parse(s: &str) -> Result<Self, crate::units::duration::DurationError> {
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

/// Counts pods per group for a log line: `{priority: pods}`.
pub fn plan_summary(plan: &ShutdownPlan) -> BTreeMap<i32, usize> {
    plan.groups
        .iter()
        .map(|g| (g.priority, g.pods.len()))
        .collect()
}

#[cfg(test)]
mod tests;
