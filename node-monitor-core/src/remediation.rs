//! Pure decisions of `node-monitor remediate`: when a node is dead, whether fencing it now is
//! safe (zone states and storm protection), how fast nodes may be fenced (per-zone token
//! buckets), and how a fencing operation moves from isolation to release to recovery.
//!
//! No I/O, no async; time is passed in. Two clocks appear, never mixed:
//! - [`Timestamp`]: the controller's monotonic clock, for liveness observations and rate limits;
//! - [`UnixMillis`]: the controller's wall clock, for the persisted fencing operation (it must
//!   survive a restart, so it cannot be monotonic).
//!
//! Times written by a node (its Lease's `renewTime`, its agent's heartbeats and last gasp) are
//! [`WallMicros`] and are only ever compared with other times written by the same node, never with
//! the controller's clock: a node whose clock is off must not look dead.
//!
//! The zone logic follows the node lifecycle controller
//! (<https://github.com/kubernetes/kubernetes/blob/master/pkg/controller/nodelifecycle/node_lifecycle_controller.go>:
//! `ComputeZoneState`, `handleDisruption`, `setLimiterInZone`, `ReducedQPSFunc`,
//! `HealthyQPSFunc`); the fencing steps follow the node-fencing design proposal (isolation, then
//! power management, then recovery; skip fencing when too many nodes are unresponsive).
use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    clock::Timestamp,
    duration::{DurationError, parse_non_negative},
};

/// The taint of KEP-2268 (non-graceful node shutdown): pods without a matching toleration are
/// deleted, the pod GC force-deletes terminating pods of a NotReady node carrying it, and the
/// attach-detach controller detaches volumes still marked in use on it at once instead of after
/// 6 minutes.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
/// The value the KEP and the Kubernetes documentation use.
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";
/// The taint's effect.
pub const OUT_OF_SERVICE_EFFECT: &str = "NoExecute";
/// A pod's toleration, as the API has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TolerationRef<'a> {
    pub key: Option<&'a str>,
    /// `Equal` (also when empty) or `Exists`.
    pub operator: Option<&'a str>,
    pub value: Option<&'a str>,
    pub effect: Option<&'a str>,
}

/// `Toleration.ToleratesTaint` (k8s.io/api/core/v1/toleration.go) for a taint of `key`, `value`,
/// `effect`: an empty effect matches every effect, an empty key (with `Exists`) every key;
/// `Exists` matches any value, `Equal` (or no operator) only the same value; any other operator
/// matches nothing.
pub fn tolerates(t: &TolerationRef<'_>, key: &str, value: &str, effect: &str) -> bool {
    if t.effect.is_some_and(|e| !e.is_empty() && e != effect) {
        return false;
    }
    if t.key.is_some_and(|k| !k.is_empty() && k != key) {
        return false;
    }
    match t.operator.unwrap_or("") {
        "" | "Equal" => t.value.unwrap_or("") == value,
        "Exists" => true,
        _ => false,
    }
}

/// Whether a pod with these tolerations tolerates the out-of-service taint. Such a pod is meant to
/// stay on (or be evicted from, after its `tolerationSeconds`) an out-of-service node by the
/// taint's own rules, so a release never force-deletes it.
pub fn tolerates_out_of_service<'a>(
    tolerations: impl IntoIterator<Item = TolerationRef<'a>>,
) -> bool {
    tolerations.into_iter().any(|t| {
        tolerates(
            &t,
            OUT_OF_SERVICE_TAINT,
            OUT_OF_SERVICE_VALUE,
            OUT_OF_SERVICE_EFFECT,
        )
    })
}

/// Node annotation the node agent sets when it sees its machine go down around the shutdown
/// inhibitor (`nodeMonitor.shutdown.lastGasp: annotation`): JSON whose `time` is the Unix time in
/// seconds of the reboot/power-off call (an RFC 3339 string is accepted too).
pub const LAST_GASP_ANNOTATION: &str = "node-monitor.io/last-gasp";
/// The agent-owned condition of a shutdown (`nodeMonitor.shutdown.lastGasp: condition`).
pub const SHUTTING_DOWN_CONDITION: &str = "NodeMonitorShuttingDown";
/// Its reason when the shutdown bypassed the inhibitor: only this one is a last gasp (a graceful
/// shutdown terminates the pods itself); the condition's `lastTransitionTime` is the moment.
pub const NON_GRACEFUL_SHUTDOWN_REASON: &str = "NonGracefulShutdown";
/// Prefix of the conditions the node agent re-publishes at least every 60 s.
pub const AGENT_CONDITION_PREFIX: &str = "NodeMonitor";
/// Node annotation that takes a node out of remediation when set to `disabled`.
pub const OPT_OUT_ANNOTATION: &str = "node-monitor.io/remediation";
/// The kubelet renews its Lease every `nodeLeaseDurationSeconds × 0.25`
/// (`nodeLeaseRenewIntervalFraction`, pkg/kubelet/kubelet.go).
pub const NODE_LEASE_RENEW_INTERVAL_FRACTION: f64 = 0.25;
/// The kubelet's default `nodeLeaseDurationSeconds`, used when a Lease does not say.
pub const DEFAULT_LEASE_DURATION_SECONDS: i32 = 40;
/// `scheduler.EvictionRateLimiterBurst`: the node lifecycle controller's buckets hold one token.
pub const FENCE_RATE_BURST: u32 = 1;

/// Microseconds since the Unix epoch, as written by a node (Lease `renewTime`, condition times).
pub type WallMicros = i64;
/// Milliseconds since the Unix epoch on the controller's clock.
pub type UnixMillis = i64;

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// How a dead node is recognised.
#[derive(Debug, Clone, PartialEq)]
pub struct DetectionConfig {
    /// Renewals a Lease may miss before its node is dead.
    pub missed_renewals: u32,
    /// The renewal interval; `None`: the Lease's `leaseDurationSeconds × 0.25`, as the kubelet.
    pub renew_interval: Option<Duration>,
    /// Silent for this many renewal intervals: suspect (counted unhealthy for storm protection,
    /// not fenced).
    pub suspect_after_renewals: f64,
    /// A node agent whose heartbeat changed within this window is reporting: its node is alive.
    pub agent_heartbeat_timeout: Duration,
}

/// Storm protection: the node lifecycle controller's zone logic plus the fencing proposal's
/// cluster-wide rules.
#[derive(Debug, Clone, PartialEq)]
pub struct StormConfig {
    /// `--unhealthy-zone-threshold`.
    pub unhealthy_zone_threshold: f64,
    /// `--large-cluster-size-threshold`.
    pub large_cluster_size_threshold: u32,
    /// Nodes fenced per second per healthy zone (`--node-eviction-rate`).
    pub node_fence_rate: f64,
    /// Nodes fenced per second in a partially disrupted large zone (`--secondary-node-eviction-rate`).
    pub secondary_node_fence_rate: f64,
    /// Fence nothing while at least this fraction of all nodes (and at least two) is unhealthy.
    pub max_unhealthy_fraction: f64,
    /// Fence nothing when the controller has not reached the API server for this long.
    pub api_stale_after: Duration,
}

/// Timeouts and retries of the fencing steps.
#[derive(Debug, Clone, PartialEq)]
pub struct FencingPolicy {
    /// Default bound on one fence method's run.
    pub method_timeout: Duration,
    /// Extra attempts of a failing step before the next step.
    pub step_retries: u32,
    /// Pause between attempts of a step.
    pub retry_backoff: Duration,
    /// Pause before the whole fencing cycle starts again after every step failed.
    pub unconfirmed_retry_interval: Duration,
    /// After a release confirmed by isolation alone, run power management when the node is
    /// still dead this long after (the proposal's 5 minutes); `None`: never.
    pub power_management_after_isolation: Option<Duration>,
}

/// Leader election on a coordination.k8s.io Lease (client-go's defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderSettings {
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// Every setting of `node-monitor remediate`.
#[derive(Debug, Clone, PartialEq)]
pub struct RemediationConfig {
    pub tick_interval: Duration,
    pub detection: DetectionConfig,
    pub storm: StormConfig,
    pub fencing: FencingPolicy,
    pub leader: LeaderSettings,
    /// Force-delete the pods of a fenced node (else: taint only, and let the pod GC act once the
    /// node lifecycle controller marks the node NotReady).
    pub force_delete_pods: bool,
    /// Only nodes with all these labels are remediated.
    pub node_selector: BTreeMap<String, String>,
    /// Decide and report; fence, taint and delete nothing.
    pub dry_run: bool,
}

impl Default for RemediationConfig {
    fn default() -> Self {
        Self {
            tick_interval: Duration::from_secs(1),
            detection: DetectionConfig {
                missed_renewals: 3,
                renew_interval: None,
                suspect_after_renewals: 1.5,
                agent_heartbeat_timeout: Duration::from_secs(90),
            },
            storm: StormConfig {
                unhealthy_zone_threshold: 0.55,
                large_cluster_size_threshold: 50,
                node_fence_rate: 0.1,
                secondary_node_fence_rate: 0.01,
                max_unhealthy_fraction: 0.55,
                api_stale_after: Duration::from_secs(6),
            },
            fencing: FencingPolicy {
                method_timeout: Duration::from_secs(60),
                step_retries: 2,
                retry_backoff: Duration::from_secs(5),
                unconfirmed_retry_interval: Duration::from_secs(60),
                power_management_after_isolation: Some(Duration::from_secs(300)),
            },
            leader: LeaderSettings {
                lease_name: "node-monitor-remediate".to_owned(),
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                retry_period: Duration::from_secs(2),
            },
            force_delete_pods: true,
            node_selector: BTreeMap::new(),
            dry_run: false,
        }
    }
}

/// A configuration that cannot be used; every message names the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum RemediationConfigError {
    #[error("{source_name}: not a valid remediate configuration")]
    Syntax {
        source_name: String,
        #[source]
        source: serde_norway::Error,
    },
    #[error("{field}: invalid duration {value:?}")]
    Duration {
        field: &'static str,
        value: String,
        #[source]
        source: DurationError,
    },
    #[error("{field}: {value:?} {reason}")]
    Invalid {
        field: &'static str,
        value: String,
        reason: &'static str,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    tick_interval: Option<String>,
    missed_renewals: Option<u32>,
    renew_interval: Option<String>,
    suspect_after_renewals: Option<f64>,
    agent_heartbeat_timeout: Option<String>,
    unhealthy_zone_threshold: Option<f64>,
    large_cluster_size_threshold: Option<u32>,
    node_fence_rate: Option<f64>,
    secondary_node_fence_rate: Option<f64>,
    max_unhealthy_fraction: Option<f64>,
    api_stale_after: Option<String>,
    method_timeout: Option<String>,
    step_retries: Option<u32>,
    retry_backoff: Option<String>,
    unconfirmed_retry_interval: Option<String>,
    /// A duration, or `never`.
    power_management_after_isolation: Option<String>,
    force_delete_pods: Option<bool>,
    node_selector: Option<BTreeMap<String, String>>,
    dry_run: Option<bool>,
    leader_election: Option<RawLeader>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLeader {
    lease_name: Option<String>,
    lease_duration: Option<String>,
    renew_deadline: Option<String>,
    retry_period: Option<String>,
}

/// `d × f`, saturating at [`Duration::MAX`] instead of panicking (`Duration::mul_f64` panics on
/// overflow); a negative or NaN factor gives zero.
pub fn mul_f64_saturating(d: Duration, f: f64) -> Duration {
    if f.is_nan() || f <= 0.0 {
        return Duration::ZERO;
    }
    Duration::try_from_secs_f64(d.as_secs_f64() * f).unwrap_or(Duration::MAX)
}

/// The longest any duration setting may be: longer is a mistake, not a policy.
pub const MAX_DURATION_SETTING: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest detection window (`renewInterval × missedRenewals`).
pub const MAX_DETECTION_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// The most `missedRenewals`.
pub const MAX_MISSED_RENEWALS: u32 = 1000;
/// The most `stepRetries`.
pub const MAX_STEP_RETRIES: u32 = 100;

fn duration_field(
    field: &'static str,
    value: Option<String>,
    default: Duration,
) -> Result<Duration, RemediationConfigError> {
    let Some(v) = value else { return Ok(default) };
    let d = parse_non_negative(&v)
        .map_err(|source| RemediationConfigError::Duration {
            field,
            value: v.clone(),
            source,
        })?
        .ok_or(RemediationConfigError::Invalid {
            field,
            value: v.clone(),
            reason: "must not be negative",
        })?;
    if d.is_zero() {
        return Err(RemediationConfigError::Invalid {
            field,
            value: v,
            reason: "must be positive",
        });
    }
    if d > MAX_DURATION_SETTING {
        return Err(RemediationConfigError::Invalid {
            field,
            value: v,
            reason: "must be at most 720h (30 days)",
        });
    }
    Ok(d)
}

fn fraction_field(
    field: &'static str,
    value: Option<f64>,
    default: f64,
) -> Result<f64, RemediationConfigError> {
    let v = value.unwrap_or(default);
    if !(v > 0.0 && v <= 1.0) {
        return Err(RemediationConfigError::Invalid {
            field,
            value: v.to_string(),
            reason: "must be in (0, 1]",
        });
    }
    Ok(v)
}

fn rate_field(
    field: &'static str,
    value: Option<f64>,
    default: f64,
) -> Result<f64, RemediationConfigError> {
    let v = value.unwrap_or(default);
    if !(v.is_finite() && v >= 0.0) {
        return Err(RemediationConfigError::Invalid {
            field,
            value: v.to_string(),
            reason: "must be a finite number of nodes per second, 0 or more",
        });
    }
    Ok(v)
}

/// Parses and validates the configuration document (YAML or JSON; an empty document means every
/// default). `source_name` names the document in errors.
pub fn parse_config(
    source_name: &str,
    text: &str,
) -> Result<RemediationConfig, RemediationConfigError> {
    let raw: RawConfig = if text.trim().is_empty() {
        RawConfig::default()
    } else {
        serde_norway::from_str::<Option<RawConfig>>(text)
            .map_err(|source| RemediationConfigError::Syntax {
                source_name: source_name.to_owned(),
                source,
            })?
            .unwrap_or_default()
    };
    let d = RemediationConfig::default();
    let missed_renewals = raw.missed_renewals.unwrap_or(d.detection.missed_renewals);
    if missed_renewals == 0 || missed_renewals > MAX_MISSED_RENEWALS {
        return Err(RemediationConfigError::Invalid {
            field: "missedRenewals",
            value: missed_renewals.to_string(),
            reason: "must be between 1 and 1000",
        });
    }
    let step_retries = raw.step_retries.unwrap_or(d.fencing.step_retries);
    if step_retries > MAX_STEP_RETRIES {
        return Err(RemediationConfigError::Invalid {
            field: "stepRetries",
            value: step_retries.to_string(),
            reason: "must be at most 100",
        });
    }
    let suspect_after_renewals = raw
        .suspect_after_renewals
        .unwrap_or(d.detection.suspect_after_renewals);
    if !(suspect_after_renewals > 0.0 && suspect_after_renewals < f64::from(missed_renewals)) {
        return Err(RemediationConfigError::Invalid {
            field: "suspectAfterRenewals",
            value: suspect_after_renewals.to_string(),
            reason: "must be positive and below missedRenewals",
        });
    }
    let renew_interval = match raw.renew_interval {
        None => None,
        Some(v) => {
            let d = duration_field("renewInterval", Some(v.clone()), Duration::ZERO)?;
            if d.saturating_mul(missed_renewals) > MAX_DETECTION_WINDOW {
                return Err(RemediationConfigError::Invalid {
                    field: "renewInterval",
                    value: v,
                    reason: "× missedRenewals must be at most 24h",
                });
            }
            Some(d)
        }
    };
    let power_management_after_isolation = match raw.power_management_after_isolation {
        Some(v) if v == "never" => None,
        Some(v) => Some(duration_field(
            "powerManagementAfterIsolation",
            Some(v),
            Duration::ZERO,
        )?),
        None => d.fencing.power_management_after_isolation,
    };
    let leader = raw.leader_election.unwrap_or_default();
    let lease_name = leader.lease_name.unwrap_or(d.leader.lease_name);
    if lease_name.is_empty() {
        return Err(RemediationConfigError::Invalid {
            field: "leaderElection.leaseName",
            value: lease_name,
            reason: "must not be empty",
        });
    }
    let lease_duration = duration_field(
        "leaderElection.leaseDuration",
        leader.lease_duration,
        d.leader.lease_duration,
    )?;
    let renew_deadline = duration_field(
        "leaderElection.renewDeadline",
        leader.renew_deadline,
        d.leader.renew_deadline,
    )?;
    let retry_period = duration_field(
        "leaderElection.retryPeriod",
        leader.retry_period,
        d.leader.retry_period,
    )?;
    // client-go's LeaderElectionConfig rules: leaseDuration > renewDeadline > retryPeriod × 1.2.
    if renew_deadline >= lease_duration {
        return Err(RemediationConfigError::Invalid {
            field: "leaderElection.renewDeadline",
            value: format!("{renew_deadline:?}"),
            reason: "must be shorter than leaderElection.leaseDuration",
        });
    }
    if mul_f64_saturating(retry_period, 1.2) >= renew_deadline {
        return Err(RemediationConfigError::Invalid {
            field: "leaderElection.retryPeriod",
            value: format!("{retry_period:?}"),
            reason: "× 1.2 must be shorter than leaderElection.renewDeadline",
        });
    }
    Ok(RemediationConfig {
        tick_interval: duration_field("tickInterval", raw.tick_interval, d.tick_interval)?,
        detection: DetectionConfig {
            missed_renewals,
            renew_interval,
            suspect_after_renewals,
            agent_heartbeat_timeout: duration_field(
                "agentHeartbeatTimeout",
                raw.agent_heartbeat_timeout,
                d.detection.agent_heartbeat_timeout,
            )?,
        },
        storm: StormConfig {
            unhealthy_zone_threshold: fraction_field(
                "unhealthyZoneThreshold",
                raw.unhealthy_zone_threshold,
                d.storm.unhealthy_zone_threshold,
            )?,
            large_cluster_size_threshold: raw
                .large_cluster_size_threshold
                .unwrap_or(d.storm.large_cluster_size_threshold),
            node_fence_rate: rate_field(
                "nodeFenceRate",
                raw.node_fence_rate,
                d.storm.node_fence_rate,
            )?,
            secondary_node_fence_rate: rate_field(
                "secondaryNodeFenceRate",
                raw.secondary_node_fence_rate,
                d.storm.secondary_node_fence_rate,
            )?,
            max_unhealthy_fraction: fraction_field(
                "maxUnhealthyFraction",
                raw.max_unhealthy_fraction,
                d.storm.max_unhealthy_fraction,
            )?,
            api_stale_after: duration_field(
                "apiStaleAfter",
                raw.api_stale_after,
                d.storm.api_stale_after,
            )?,
        },
        fencing: FencingPolicy {
            method_timeout: duration_field(
                "methodTimeout",
                raw.method_timeout,
                d.fencing.method_timeout,
            )?,
            step_retries,
            retry_backoff: duration_field(
                "retryBackoff",
                raw.retry_backoff,
                d.fencing.retry_backoff,
            )?,
            unconfirmed_retry_interval: duration_field(
                "unconfirmedRetryInterval",
                raw.unconfirmed_retry_interval,
                d.fencing.unconfirmed_retry_interval,
            )?,
            power_management_after_isolation,
        },
        leader: LeaderSettings {
            lease_name,
            lease_duration,
            renew_deadline,
            retry_period,
        },
        force_delete_pods: raw.force_delete_pods.unwrap_or(d.force_delete_pods),
        node_selector: raw.node_selector.unwrap_or_default(),
        dry_run: raw.dry_run.unwrap_or(d.dry_run),
    })
}

// ---------------------------------------------------------------------------------------------
// Liveness
// ---------------------------------------------------------------------------------------------

/// The node's `Ready` condition as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyStatus {
    True,
    False,
    /// `Unknown`, or no `Ready` condition at all.
    Unknown,
}

/// Where a node is, by its topology labels: the node lifecycle controller's zone key
/// (`GetZoneKey`, k8s.io/component-helpers/node/topology: the beta labels first, then the GA
/// ones; both empty is the zone `""`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ZoneKey {
    pub region: String,
    pub zone: String,
}

impl ZoneKey {
    pub fn from_labels(labels: &BTreeMap<String, String>) -> ZoneKey {
        let get = |beta: &str, ga: &str| {
            labels
                .get(beta)
                .or_else(|| labels.get(ga))
                .cloned()
                .unwrap_or_default()
        };
        ZoneKey {
            region: get(
                "failure-domain.beta.kubernetes.io/region",
                "topology.kubernetes.io/region",
            ),
            zone: get(
                "failure-domain.beta.kubernetes.io/zone",
                "topology.kubernetes.io/zone",
            ),
        }
    }

    /// For metric labels and messages: `region:zone`, or `zone` alone, or `""`.
    pub fn label(&self) -> String {
        match (self.region.is_empty(), self.zone.is_empty()) {
            (true, true) => String::new(),
            (true, false) => self.zone.clone(),
            _ => format!("{}:{}", self.region, self.zone),
        }
    }
}

/// A node's Lease as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseFacts {
    pub renew_time: Option<WallMicros>,
    pub duration_seconds: Option<i32>,
}

/// What the controller knows about one node at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub zone: ZoneKey,
    pub ready: ReadyStatus,
    pub lease: Option<LeaseFacts>,
    /// The newest `lastHeartbeatTime` of the node agent's `NodeMonitor*` conditions.
    pub agent_heartbeat: Option<WallMicros>,
    /// The agent's last gasp: [`LAST_GASP_ANNOTATION`], or [`SHUTTING_DOWN_CONDITION`] True with
    /// reason [`NON_GRACEFUL_SHUTDOWN_REASON`].
    pub last_gasp: Option<WallMicros>,
    /// Selected by `nodeSelector` and not opted out.
    pub eligible: bool,
    /// `status.nodeInfo.bootID`: changes when the machine reboots.
    pub boot_id: Option<String>,
    /// `lastHeartbeatTime` of the `Ready` condition while it is `True` (written by the kubelet,
    /// node clock); `None` when the node is not Ready.
    pub ready_heartbeat: Option<WallMicros>,
}

/// Why a node counts as alive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AliveBecause {
    LeaseRenewing,
    AgentReporting,
    /// No Lease: nothing to judge by, so never dead.
    NoLease,
}

/// The evidence a node is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathEvidence {
    /// The Lease missed `missed` renewals of `renew_interval` (observed silence `silent`).
    LeaseExpired {
        silent: Duration,
        renew_interval: Duration,
        missed: u32,
    },
    /// The node agent announced an inhibitor-bypassing power-off at `at`, and neither the
    /// kubelet nor the agent has written since.
    LastGasp { at: WallMicros },
}

impl DeathEvidence {
    pub fn describe(&self) -> String {
        match self {
            Self::LeaseExpired {
                silent,
                renew_interval,
                missed,
            } => format!(
                "lease not renewed for {:.1}s ({missed} renewals of {:.1}s missed)",
                silent.as_secs_f64(),
                renew_interval.as_secs_f64()
            ),
            Self::LastGasp { at } => {
                format!("last gasp from its node agent at {at} µs since the epoch (node clock)")
            }
        }
    }
}

/// A node's liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive(AliveBecause),
    /// Silent for more than `suspectAfterRenewals` intervals: unhealthy, not yet dead.
    Suspect {
        silent: Duration,
    },
    Dead(DeathEvidence),
}

impl Liveness {
    /// Counted as unhealthy by storm protection.
    pub fn is_unhealthy(&self) -> bool {
        !matches!(self, Liveness::Alive(_))
    }

    pub fn is_dead(&self) -> bool {
        matches!(self, Liveness::Dead(_))
    }

    pub fn label(&self) -> &'static str {
        match self {
            Liveness::Alive(_) => "alive",
            Liveness::Suspect { .. } => "suspect",
            Liveness::Dead(_) => "dead",
        }
    }
}

#[derive(Debug, Clone)]
struct Seen {
    lease: Option<WallMicros>,
    lease_changed: Timestamp,
    heartbeat: Option<WallMicros>,
    heartbeat_changed: Timestamp,
}

/// Remembers when each node's Lease and agent heartbeat last changed, on the controller's own
/// clock: like the node lifecycle controller's `probeTimestamp`, this keeps node clock skew out
/// of the decision. A node first seen counts as just renewed ("Missing timestamp for Node.
/// Assuming now"), so a restarted controller waits a full window before calling anything dead.
#[derive(Debug, Clone, Default)]
pub struct LivenessTracker {
    seen: BTreeMap<String, Seen>,
}

/// The renewal interval for a Lease: the configured one, else the kubelet's fraction of its
/// duration.
pub fn renew_interval(cfg: &DetectionConfig, lease: &LeaseFacts) -> Duration {
    cfg.renew_interval.unwrap_or_else(|| {
        let secs = lease
            .duration_seconds
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_LEASE_DURATION_SECONDS);
        Duration::from_secs_f64(f64::from(secs) * NODE_LEASE_RENEW_INTERVAL_FRACTION)
    })
}

/// Whether a last gasp at `gasp` is the latest thing the node said: neither its Lease nor its
/// agent's heartbeat is newer (both written by the node's clock, like the gasp).
pub fn last_gasp_stands(gasp: WallMicros, facts: &NodeFacts) -> bool {
    let lease_older = facts
        .lease
        .and_then(|l| l.renew_time)
        .is_none_or(|r| r <= gasp);
    let agent_older = facts.agent_heartbeat.is_none_or(|h| h <= gasp);
    lease_older && agent_older
}

impl LivenessTracker {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the facts and judges every node. Nodes no longer listed are forgotten.
    /// `lease_view_fresh`: the watched Leases are known to be current (see [`watch_caught_up`]);
    /// while they are not, a Lease that stopped changing may only be a watch that stopped
    /// delivering, so no node is judged dead (suspect at most).
    pub fn observe(
        &mut self,
        nodes: &[NodeFacts],
        now: Timestamp,
        cfg: &DetectionConfig,
        lease_view_fresh: bool,
    ) -> BTreeMap<String, Liveness> {
        self.seen
            .retain(|name, _| nodes.iter().any(|n| &n.name == name));
        let mut out = BTreeMap::new();
        for n in nodes {
            let lease_value = n.lease.and_then(|l| l.renew_time);
            let seen = self.seen.entry(n.name.clone()).or_insert_with(|| Seen {
                lease: lease_value,
                lease_changed: now,
                heartbeat: n.agent_heartbeat,
                heartbeat_changed: now,
            });
            if seen.lease != lease_value {
                seen.lease = lease_value;
                seen.lease_changed = now;
            }
            if seen.heartbeat != n.agent_heartbeat {
                seen.heartbeat = n.agent_heartbeat;
                seen.heartbeat_changed = now;
            }
            let judged = match judge(n, seen, now, cfg) {
                Liveness::Dead(_) if !lease_view_fresh => Liveness::Suspect {
                    silent: now.saturating_since(seen.lease_changed),
                },
                other => other,
            };
            out.insert(n.name.clone(), judged);
        }
        out
    }
}

/// Whether a watch cache has caught up with a fresh list: every listed object is cached at the
/// listed `resourceVersion` or a later one. Versions are compared as numbers when both are (etcd
/// revisions, as every API server writes them), else for equality. A watch that stopped
/// delivering (while its connection and every other request look healthy) never catches up, so
/// the time of the last list it caught up with bounds how old the cached view can be.
pub fn watch_caught_up<'a>(
    listed: impl IntoIterator<Item = (&'a str, &'a str)>,
    cached: impl Fn(&str) -> Option<String>,
) -> bool {
    listed.into_iter().all(|(name, listed_rv)| {
        cached(name).is_some_and(|c| match (c.parse::<u64>(), listed_rv.parse::<u64>()) {
            (Ok(c), Ok(l)) => c >= l,
            _ => c == listed_rv,
        })
    })
}

fn judge(n: &NodeFacts, seen: &Seen, now: Timestamp, cfg: &DetectionConfig) -> Liveness {
    if let Some(gasp) = n.last_gasp
        && last_gasp_stands(gasp, n)
    {
        return Liveness::Dead(DeathEvidence::LastGasp { at: gasp });
    }
    if n.agent_heartbeat.is_some()
        && now.saturating_since(seen.heartbeat_changed) < cfg.agent_heartbeat_timeout
    {
        return Liveness::Alive(AliveBecause::AgentReporting);
    }
    let Some(lease) = n.lease else {
        return Liveness::Alive(AliveBecause::NoLease);
    };
    let interval = renew_interval(cfg, &lease);
    let silent = now.saturating_since(seen.lease_changed);
    if silent >= interval.saturating_mul(cfg.missed_renewals) {
        Liveness::Dead(DeathEvidence::LeaseExpired {
            silent,
            renew_interval: interval,
            missed: cfg.missed_renewals,
        })
    } else if silent > mul_f64_saturating(interval, cfg.suspect_after_renewals) {
        Liveness::Suspect { silent }
    } else {
        Liveness::Alive(AliveBecause::LeaseRenewing)
    }
}

/// The node is back after a fencing decision: its kubelet renewed the Lease after the renewal
/// recorded when the node was found dead (a comparison of two times written by the node, so it
/// holds across controller restarts and clock skew).
pub fn node_is_back(recorded: Option<WallMicros>, lease: Option<&LeaseFacts>) -> bool {
    let now = lease.and_then(|l| l.renew_time);
    match (recorded, now) {
        (Some(r), Some(n)) => n > r,
        (None, Some(_)) => true,
        (_, None) => false,
    }
}

// ---------------------------------------------------------------------------------------------
// Zones and storm protection
// ---------------------------------------------------------------------------------------------

/// A zone's state (the node lifecycle controller's `ZoneState`, without its transient `Initial`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ZoneState {
    Normal,
    PartialDisruption,
    FullDisruption,
}

impl ZoneState {
    pub const ALL: [ZoneState; 3] = [
        ZoneState::Normal,
        ZoneState::PartialDisruption,
        ZoneState::FullDisruption,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ZoneState::Normal => "Normal",
            ZoneState::PartialDisruption => "PartialDisruption",
            ZoneState::FullDisruption => "FullDisruption",
        }
    }
}

/// `ComputeZoneState`: no healthy node → full disruption; more than two unhealthy nodes and
/// at least `threshold` of the zone unhealthy → partial disruption; else normal.
pub fn compute_zone_state(healthy: usize, unhealthy: usize, threshold: f64) -> ZoneState {
    #[expect(clippy::cast_precision_loss, reason = "node counts are far below 2^52")]
    let fraction = unhealthy as f64 / (healthy + unhealthy).max(1) as f64;
    if healthy == 0 && unhealthy > 0 {
        ZoneState::FullDisruption
    } else if unhealthy > 2 && fraction >= threshold {
        ZoneState::PartialDisruption
    } else {
        ZoneState::Normal
    }
}

/// The fencing rate of a zone (`setLimiterInZone`): normal and fully disrupted zones get the
/// normal rate (`HealthyQPSFunc`); a partially disrupted zone gets the secondary rate when it is
/// larger than the large-cluster threshold and none otherwise (`ReducedQPSFunc`).
pub fn zone_fence_rate(state: ZoneState, zone_size: usize, cfg: &StormConfig) -> f64 {
    match state {
        ZoneState::Normal | ZoneState::FullDisruption => cfg.node_fence_rate,
        ZoneState::PartialDisruption => {
            if zone_size > cfg.large_cluster_size_threshold as usize {
                cfg.secondary_node_fence_rate
            } else {
                0.0
            }
        }
    }
}

/// One zone's standing.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneStatus {
    pub size: usize,
    pub unhealthy: usize,
    pub state: ZoneState,
    pub rate: f64,
}

/// Why a node that looks dead is not being fenced (now).
#[derive(Debug, Clone, PartialEq)]
pub enum SkipReason {
    /// The controller cannot reach the API server reliably: its own view is suspect.
    ControllerPartitioned { api_silent: Duration },
    /// Every zone is fully disrupted: the management side is more likely cut off than every
    /// node dead (`handleDisruption` stops all evictions then).
    AllZonesDisrupted { nodes: usize },
    /// Too many nodes are unhealthy at once (the fencing proposal's storm rule).
    TooManyUnhealthy { unhealthy: usize, total: usize },
    /// The node's zone has a fencing rate of 0 (a small, partially disrupted zone).
    ZoneDisruption {
        zone: String,
        state: ZoneState,
        unhealthy: usize,
        size: usize,
    },
    /// The zone's rate limit has no token now.
    RateLimited { zone: String },
    /// No fencing configuration applies to the node: it can never be confirmed off.
    NoFenceConfig,
    /// The fencing configuration cannot be read or is invalid.
    FenceConfigError { error: String },
    /// Left out by `nodeSelector` or the opt-out annotation.
    NotEligible,
    /// Dry run: decided, not done.
    DryRun,
}

impl SkipReason {
    /// The `reason` label of `node_monitor_remediation_skips_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::ControllerPartitioned { .. } => "controller_partitioned",
            Self::AllZonesDisrupted { .. } => "all_zones_disrupted",
            Self::TooManyUnhealthy { .. } => "too_many_unhealthy",
            Self::ZoneDisruption { .. } => "zone_disruption",
            Self::RateLimited { .. } => "rate_limited",
            Self::NoFenceConfig => "no_fence_config",
            Self::FenceConfigError { .. } => "fence_config_error",
            Self::NotEligible => "not_eligible",
            Self::DryRun => "dry_run",
        }
    }

    pub const LABELS: [&'static str; 9] = [
        "controller_partitioned",
        "all_zones_disrupted",
        "too_many_unhealthy",
        "zone_disruption",
        "rate_limited",
        "no_fence_config",
        "fence_config_error",
        "not_eligible",
        "dry_run",
    ];

    pub fn message(&self) -> String {
        match self {
            Self::ControllerPartitioned { api_silent } => format!(
                "fencing skipped: the controller has not reached the API server for {:.1}s and may itself be partitioned",
                api_silent.as_secs_f64()
            ),
            Self::AllZonesDisrupted { nodes } => format!(
                "fencing skipped: all {nodes} nodes look unhealthy at once (every zone in FullDisruption); the management network is more likely at fault"
            ),
            Self::TooManyUnhealthy { unhealthy, total } => format!(
                "fencing skipped: {unhealthy} of {total} nodes are unhealthy, at or above maxUnhealthyFraction (fencing storm protection)"
            ),
            Self::ZoneDisruption {
                zone,
                state,
                unhealthy,
                size,
            } => format!(
                "fencing skipped: zone {zone:?} is in {} ({unhealthy} of {size} nodes unhealthy); its fencing rate is 0",
                state.as_str()
            ),
            Self::RateLimited { zone } => {
                format!("fencing deferred: the fencing rate limit of zone {zone:?} is exhausted")
            }
            Self::NoFenceConfig => "fencing skipped: no fencing configuration applies to this node (fence-config-<node> or fence-config-default); its workload is never released without confirmed fencing".to_owned(),
            Self::FenceConfigError { error } => {
                format!("fencing skipped: the fencing configuration is unusable: {error}")
            }
            Self::NotEligible => {
                "fencing skipped: the node is excluded by nodeSelector or the node-monitor.io/remediation annotation".to_owned()
            }
            Self::DryRun => "dry run: the node would be fenced now".to_owned(),
        }
    }
}

/// The cluster as storm protection sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Assessment {
    pub zones: BTreeMap<ZoneKey, ZoneStatus>,
    pub total: usize,
    pub unhealthy: usize,
    /// A cluster-wide reason to fence nothing now.
    pub blocked: Option<SkipReason>,
}

impl Assessment {
    /// Whether a node of `zone` may start (or continue) fencing, before its rate limit.
    pub fn admits(&self, zone: &ZoneKey) -> Result<(), SkipReason> {
        if let Some(b) = &self.blocked {
            return Err(b.clone());
        }
        match self.zones.get(zone) {
            Some(z) if z.rate <= 0.0 => Err(SkipReason::ZoneDisruption {
                zone: zone.label(),
                state: z.state,
                unhealthy: z.unhealthy,
                size: z.size,
            }),
            _ => Ok(()),
        }
    }
}

/// Zone states and cluster-wide storm rules from every node's zone and health (`unhealthy`:
/// suspect or dead by its Lease, or not Ready), and the time since the controller last reached
/// the API server.
pub fn assess(
    nodes: impl IntoIterator<Item = (ZoneKey, bool)>,
    api_silent: Duration,
    cfg: &StormConfig,
) -> Assessment {
    let mut counts: BTreeMap<ZoneKey, (usize, usize)> = BTreeMap::new();
    for (zone, unhealthy) in nodes {
        let c = counts.entry(zone).or_default();
        if unhealthy {
            c.1 += 1;
        } else {
            c.0 += 1;
        }
    }
    let mut zones = BTreeMap::new();
    let (mut total, mut unhealthy) = (0, 0);
    for (zone, (healthy, bad)) in counts {
        let state = compute_zone_state(healthy, bad, cfg.unhealthy_zone_threshold);
        let size = healthy + bad;
        total += size;
        unhealthy += bad;
        zones.insert(
            zone,
            ZoneStatus {
                size,
                unhealthy: bad,
                state,
                rate: zone_fence_rate(state, size, cfg),
            },
        );
    }
    #[expect(clippy::cast_precision_loss, reason = "node counts are far below 2^52")]
    let fraction = unhealthy as f64 / total.max(1) as f64;
    let blocked = if api_silent > cfg.api_stale_after {
        Some(SkipReason::ControllerPartitioned { api_silent })
    } else if total > 0 && zones.values().all(|z| z.state == ZoneState::FullDisruption) {
        Some(SkipReason::AllZonesDisrupted { nodes: total })
    } else if unhealthy >= 2 && fraction >= cfg.max_unhealthy_fraction {
        Some(SkipReason::TooManyUnhealthy { unhealthy, total })
    } else {
        None
    };
    Assessment {
        zones,
        total,
        unhealthy,
        blocked,
    }
}

// ---------------------------------------------------------------------------------------------
// Rate limiting
// ---------------------------------------------------------------------------------------------

/// A token bucket (client-go's `flowcontrol.NewTokenBucketRateLimiter`): `qps` tokens a second,
/// at most `burst`, full when made. A rate of 0 never gives a token.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Timestamp,
}

impl TokenBucket {
    pub fn new(qps: f64, burst: u32, now: Timestamp) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps,
            burst,
            tokens: if qps > 0.0 { burst } else { 0.0 },
            last: now,
        }
    }

    pub fn qps(&self) -> f64 {
        self.qps
    }

    fn refill(&mut self, now: Timestamp) {
        if now > self.last {
            if self.qps > 0.0 {
                let elapsed = now.saturating_since(self.last).as_secs_f64();
                self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
            }
            self.last = now;
        }
    }

    /// Takes a token if one is there.
    pub fn try_take(&mut self, now: Timestamp) -> bool {
        self.refill(now);
        if self.qps > 0.0 && self.tokens >= 1.0 - TOKEN_EPSILON {
            self.tokens = (self.tokens - 1.0).max(0.0);
            true
        } else {
            false
        }
    }

    /// Changes the rate (`RateLimitedTimedQueue.SwapLimiter`): a new bucket, drained by one
    /// token when the old one had none, so a state change never hands out a free token.
    pub fn swap_qps(&mut self, qps: f64, now: Timestamp) {
        // The same configured value, compared exactly as SwapLimiter does.
        if qps.to_bits() == self.qps.to_bits() {
            return;
        }
        self.refill(now);
        let had_token = self.qps > 0.0 && self.tokens >= 1.0 - TOKEN_EPSILON;
        let burst = self.burst;
        *self = TokenBucket {
            qps,
            burst,
            tokens: if qps > 0.0 { burst } else { 0.0 },
            last: now,
        };
        if qps > 0.0 && !had_token {
            self.tokens -= 1.0;
        }
    }
}

/// Rounding slack: 0.1 × 10 s must make a whole token.
const TOKEN_EPSILON: f64 = 1e-9;

/// One token bucket per zone, following the zones' rates.
#[derive(Debug, Clone, Default)]
pub struct ZoneLimiters {
    buckets: BTreeMap<ZoneKey, TokenBucket>,
}

impl ZoneLimiters {
    pub fn update(&mut self, assessment: &Assessment, now: Timestamp) {
        self.buckets.retain(|z, _| assessment.zones.contains_key(z));
        for (zone, status) in &assessment.zones {
            match self.buckets.get_mut(zone) {
                Some(b) => b.swap_qps(status.rate, now),
                None => {
                    self.buckets.insert(
                        zone.clone(),
                        TokenBucket::new(status.rate, FENCE_RATE_BURST, now),
                    );
                }
            }
        }
    }

    pub fn try_take(&mut self, zone: &ZoneKey, now: Timestamp) -> bool {
        self.buckets.get_mut(zone).is_some_and(|b| b.try_take(now))
    }
}

// ---------------------------------------------------------------------------------------------
// The fencing operation
// ---------------------------------------------------------------------------------------------

/// A fencing step (the proposal's three lists of methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Step {
    Isolation,
    PowerManagement,
    Recovery,
}

impl Step {
    pub const ALL: [Step; 3] = [Step::Isolation, Step::PowerManagement, Step::Recovery];

    /// The key in `config.properties` and the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Isolation => "isolation",
            Step::PowerManagement => "power_management",
            Step::Recovery => "recovery",
        }
    }
}

/// Where an operation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "name")]
pub enum Phase {
    /// Running, or about to run, the methods of a fencing step.
    Fencing { step: Step },
    /// No step confirmed the node off or isolated: nothing is released; the cycle starts again
    /// after `unconfirmedRetryInterval`.
    Unconfirmed,
    /// Fencing confirmed: taint the node and delete its pods.
    Releasing,
    /// The workload is released; waiting for the node to come back.
    Released,
    /// The node is back: run recovery, then remove the taint and forget the operation.
    Recovering { recovered: bool },
}

impl Phase {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Phase::Fencing { .. } => "fencing",
            Phase::Unconfirmed => "unconfirmed",
            Phase::Releasing => "releasing",
            Phase::Released => "released",
            Phase::Recovering { .. } => "recovering",
        }
    }

    pub const LABELS: [&'static str; 5] = [
        "fencing",
        "unconfirmed",
        "releasing",
        "released",
        "recovering",
    ];
}

/// One node's fencing operation: the proposal's NodeFence, kept in the API so a restarted or newly
/// elected controller carries on where the last one stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FenceOp {
    pub node: String,
    pub node_uid: String,
    pub phase: Phase,
    /// A step whose methods were started and whose outcome is not recorded. Written before they
    /// start: a controller that finds it set without running the step itself runs it again, so
    /// fence methods must be idempotent (fence agents are: `off` on an off machine succeeds).
    #[serde(default)]
    pub running: Option<Step>,
    /// Attempts of the current step.
    #[serde(default)]
    pub attempts: u32,
    /// Fencing cycles that ended unconfirmed.
    #[serde(default)]
    pub cycles: u32,
    /// Nothing new starts before this time.
    #[serde(default)]
    pub not_before: Option<UnixMillis>,
    pub detected_at: UnixMillis,
    pub evidence: String,
    /// The Lease's renewTime when the node was found dead: a newer one means it is back.
    pub lease_renew_time: Option<WallMicros>,
    #[serde(default)]
    pub confirmed_by: Option<Step>,
    #[serde(default)]
    pub released_at: Option<UnixMillis>,
    #[serde(default)]
    pub power_cycled: bool,
    #[serde(default)]
    pub last_error: Option<String>,
    /// The node's `bootID` when it was found dead: a different one later means it rebooted.
    #[serde(default)]
    pub boot_id: Option<String>,
    /// The `Ready` condition's heartbeat when the node was found dead: only a newer one says the
    /// kubelet is back.
    #[serde(default)]
    pub ready_heartbeat: Option<WallMicros>,
    /// Recovery is held until the kubelet confirms the released pods are gone (the hold was
    /// announced).
    #[serde(default)]
    pub recovery_held: bool,
}

impl FenceOp {
    /// A new operation for a node found dead, recording what the node last said (its Lease
    /// renewal, its Ready heartbeat, its bootID) to tell later whether it came back.
    pub fn new(
        facts: &NodeFacts,
        node_uid: &str,
        evidence: &DeathEvidence,
        now: UnixMillis,
    ) -> FenceOp {
        FenceOp {
            node: facts.name.clone(),
            node_uid: node_uid.to_owned(),
            phase: Phase::Fencing {
                step: Step::Isolation,
            },
            running: None,
            attempts: 0,
            cycles: 0,
            not_before: None,
            detected_at: now,
            evidence: evidence.describe(),
            lease_renew_time: facts.lease.and_then(|l| l.renew_time),
            confirmed_by: None,
            released_at: None,
            power_cycled: false,
            last_error: None,
            boot_id: facts.boot_id.clone().filter(|b| !b.is_empty()),
            ready_heartbeat: facts.ready_heartbeat,
            recovery_held: false,
        }
    }
}

/// Which steps have methods configured for the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConfiguredSteps {
    pub isolation: bool,
    pub power_management: bool,
    pub recovery: bool,
}

impl ConfiguredSteps {
    pub fn has(&self, step: Step) -> bool {
        match step {
            Step::Isolation => self.isolation,
            Step::PowerManagement => self.power_management,
            Step::Recovery => self.recovery,
        }
    }
}

/// What the node says about the pods of before the fence once it is back. A release
/// force-deletes pods whose containers may still run on the node (isolated, not stopped) while
/// their replacements run elsewhere; only the node's kubelet can stop them, and it does so once it
/// syncs with the API. Recovery (storage access back on, unfencing) must wait for that, or the old
/// containers write next to their replacements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KubeletReturn {
    /// The node's `bootID` differs from the one recorded at fencing: the machine rebooted, nothing
    /// of before runs on it.
    pub rebooted: bool,
    /// The kubelet posted `Ready=True` after the node was found dead (the Ready heartbeat is newer
    /// than both the Lease renewal and the Ready heartbeat recorded then; all written by the
    /// node's clock).
    pub ready_again: bool,
    /// Pods still bound to the node that a release would delete (none of them can have been
    /// scheduled there since: the taint keeps them off); `None`: not known.
    pub old_pods: Option<u32>,
}

impl KubeletReturn {
    /// From the node's facts now and the operation's record; `old_pods` counted by the caller.
    pub fn observe(op: &FenceOp, facts: &NodeFacts, old_pods: Option<u32>) -> KubeletReturn {
        let rebooted = match (op.boot_id.as_deref(), facts.boot_id.as_deref()) {
            (Some(then), Some(now)) => !now.is_empty() && now != then,
            _ => false,
        };
        // Newer than anything the node wrote before it was found dead (all node clock).
        let before = op.lease_renew_time.max(op.ready_heartbeat);
        let ready_again = facts.ready == ReadyStatus::True
            && match (facts.ready_heartbeat, before) {
                (Some(hb), Some(before)) => hb > before,
                (Some(_), None) => true,
                (None, _) => false,
            };
        KubeletReturn {
            rebooted,
            ready_again,
            old_pods,
        }
    }

    /// The released pods' containers are known to be gone: the machine rebooted, or its kubelet is
    /// Ready again and no pod of before the fence is left bound to it.
    pub fn confirms_old_pods_gone(&self) -> bool {
        self.rebooted || (self.ready_again && self.old_pods == Some(0))
    }

    fn describe_wait(&self) -> String {
        let mut missing = Vec::new();
        if !self.ready_again {
            missing.push("its kubelet has not reported Ready since".to_owned());
        }
        match self.old_pods {
            Some(0) => {}
            Some(n) => missing.push(format!(
                "{n} pods of before the fence are still bound to it"
            )),
            None => missing.push("its pods could not be listed".to_owned()),
        }
        missing.join("; ")
    }
}

/// The world around an operation at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpContext {
    pub now: UnixMillis,
    /// The Node object still exists.
    pub node_present: bool,
    /// The node renewed its Lease since it was found dead ([`node_is_back`]).
    pub node_back: bool,
    /// The step in `running` is executing in this process right now.
    pub executing: bool,
    /// Storm protection lets new fencing attempts start.
    pub may_fence: bool,
    pub configured: ConfiguredSteps,
    /// What the node says about the pods of before the fence (see [`KubeletReturn`]).
    pub kubelet: KubeletReturn,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpEvent {
    Tick,
    /// A step's methods finished: all succeeded, or the first failure.
    StepDone {
        step: Step,
        result: Result<(), String>,
    },
    /// The release (taint, then pod deletion) finished.
    ReleaseDone {
        result: Result<ReleaseSummary, String>,
    },
    /// The out-of-service taint was removed (or was not there).
    TaintRemoved {
        result: Result<(), String>,
    },
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReleaseSummary {
    pub pods_deleted: u32,
    /// VolumeAttachments of the node, left for the attach-detach controller to detach.
    pub volume_attachments: u32,
}

/// An Event to record on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// What the controller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpAction {
    /// Run the step's methods (after persisting the operation); report [`OpEvent::StepDone`].
    Run(Step),
    /// Stop the step executing now; its outcome no longer matters.
    Cancel,
    /// Apply the out-of-service taint, then delete the node's pods; report
    /// [`OpEvent::ReleaseDone`].
    Release,
    /// Remove the out-of-service taint; report [`OpEvent::TaintRemoved`].
    RemoveTaint,
    /// Delete the operation: nothing is left to do.
    Forget,
    Notify(Notice),
}

/// The next state of an operation and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub op: FenceOp,
    pub actions: Vec<OpAction>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn notice(warning: bool, reason: &'static str, message: String) -> OpAction {
    OpAction::Notify(Notice {
        warning,
        reason,
        message,
    })
}

/// Moves to the next fencing step, or to `Unconfirmed` when none is left.
fn next_step(
    op: &mut FenceOp,
    from: Step,
    ctx: &OpContext,
    policy: &FencingPolicy,
) -> Vec<OpAction> {
    op.attempts = 0;
    op.running = None;
    if from == Step::Isolation && ctx.configured.power_management {
        op.phase = Phase::Fencing {
            step: Step::PowerManagement,
        };
        op.not_before = None;
        return Vec::new();
    }
    op.phase = Phase::Unconfirmed;
    op.cycles = op.cycles.saturating_add(1);
    op.not_before = Some(
        ctx.now
            .saturating_add(millis(policy.unconfirmed_retry_interval)),
    );
    vec![notice(
        true,
        "FencingUnconfirmed",
        format!(
            "no fencing step confirmed the node off or isolated (cycle {}{}); its workload is not released; trying again in {:.0}s",
            op.cycles,
            op.last_error
                .as_deref()
                .map(|e| format!(", last error: {e}"))
                .unwrap_or_default(),
            policy.unconfirmed_retry_interval.as_secs_f64()
        ),
    )]
}

/// The fencing state machine: isolation, then power management; release only once a step
/// confirmed the node off or isolated; recovery when the node is back. Every branch that leads to
/// [`OpAction::Release`] passes through a successful [`OpEvent::StepDone`] of a fencing step.
#[expect(
    clippy::too_many_lines,
    reason = "one match arm per phase and event, read top to bottom"
)]
pub fn advance(
    op: &FenceOp,
    event: &OpEvent,
    ctx: &OpContext,
    policy: &FencingPolicy,
) -> Transition {
    let mut op = op.clone();
    let mut actions = Vec::new();
    let done = |op: FenceOp, actions: Vec<OpAction>| Transition { op, actions };

    if !ctx.node_present {
        if ctx.executing {
            actions.push(OpAction::Cancel);
        }
        actions.push(OpAction::Forget);
        return done(op, actions);
    }
    if ctx.node_back && !matches!(op.phase, Phase::Recovering { .. }) {
        if ctx.executing {
            actions.push(OpAction::Cancel);
        }
        actions.push(notice(
            false,
            "NodeBack",
            format!(
                "the node renewed its lease again (operation was {}); running recovery",
                op.phase.label()
            ),
        ));
        op.phase = Phase::Recovering { recovered: false };
        op.running = None;
        op.attempts = 0;
        op.not_before = None;
        return done(op, actions);
    }

    match event {
        OpEvent::StepDone { step, result } => {
            if op.running != Some(*step) {
                // A result for a step this operation no longer waits for.
                return done(op, actions);
            }
            op.running = None;
            match (op.phase, result) {
                (Phase::Fencing { step: s }, Ok(())) if s == *step => {
                    op.confirmed_by = Some(s);
                    op.phase = Phase::Releasing;
                    op.attempts = 0;
                    op.not_before = None;
                    op.last_error = None;
                    actions.push(notice(
                        true,
                        "FencingConfirmed",
                        format!(
                            "the {} step succeeded: the node is {}; releasing its workload",
                            s.as_str(),
                            if s == Step::Isolation {
                                "isolated"
                            } else {
                                "powered off"
                            }
                        ),
                    ));
                }
                (Phase::Fencing { step: s }, Err(e)) if s == *step => {
                    op.last_error = Some(e.clone());
                    actions.push(notice(
                        true,
                        "FenceStepFailed",
                        format!(
                            "the {} step failed (attempt {} of {}): {e}",
                            s.as_str(),
                            op.attempts,
                            policy.step_retries.saturating_add(1)
                        ),
                    ));
                    if op.attempts <= policy.step_retries {
                        op.not_before = Some(ctx.now.saturating_add(millis(policy.retry_backoff)));
                    } else {
                        actions.extend(next_step(&mut op, s, ctx, policy));
                    }
                }
                (Phase::Released, Ok(())) if *step == Step::PowerManagement => {
                    op.power_cycled = true;
                    op.last_error = None;
                    actions.push(notice(
                        false,
                        "PowerManagementDone",
                        "the node stayed dead after isolation; the power management step succeeded"
                            .to_owned(),
                    ));
                }
                (Phase::Released, Err(e)) if *step == Step::PowerManagement => {
                    op.last_error = Some(e.clone());
                    op.not_before = Some(
                        ctx.now
                            .saturating_add(millis(policy.unconfirmed_retry_interval)),
                    );
                    actions.push(notice(
                        true,
                        "FenceStepFailed",
                        format!("the power_management step after isolation failed: {e}"),
                    ));
                }
                (Phase::Recovering { .. }, Ok(())) if *step == Step::Recovery => {
                    op.phase = Phase::Recovering { recovered: true };
                    op.attempts = 0;
                    op.not_before = None;
                    op.last_error = None;
                }
                (Phase::Recovering { .. }, Err(e)) if *step == Step::Recovery => {
                    op.last_error = Some(e.clone());
                    let pause = if op.attempts <= policy.step_retries {
                        policy.retry_backoff
                    } else {
                        policy.unconfirmed_retry_interval
                    };
                    op.not_before = Some(ctx.now.saturating_add(millis(pause)));
                    actions.push(notice(
                        true,
                        "RecoveryFailed",
                        format!(
                            "the recovery step failed (attempt {}); the out-of-service taint stays until it succeeds: {e}",
                            op.attempts
                        ),
                    ));
                }
                _ => {}
            }
        }
        OpEvent::ReleaseDone { result } => {
            if op.phase != Phase::Releasing {
                return done(op, actions);
            }
            match result {
                Ok(s) => {
                    op.phase = Phase::Released;
                    op.released_at = Some(ctx.now);
                    op.not_before = None;
                    op.last_error = None;
                    actions.push(notice(
                        true,
                        "NodeReleased",
                        format!(
                            "out-of-service taint applied; {} pods deleted; {} volume attachments left for the attach-detach controller to detach",
                            s.pods_deleted, s.volume_attachments
                        ),
                    ));
                }
                Err(e) => {
                    op.last_error = Some(e.clone());
                    op.not_before = Some(ctx.now.saturating_add(millis(policy.retry_backoff)));
                    actions.push(notice(
                        true,
                        "ReleaseFailed",
                        format!("releasing the workload failed; retrying: {e}"),
                    ));
                }
            }
        }
        OpEvent::TaintRemoved { result } => {
            if op.phase != (Phase::Recovering { recovered: true }) {
                return done(op, actions);
            }
            match result {
                Ok(()) => {
                    actions.push(notice(
                        false,
                        "NodeRecovered",
                        "recovery done and the out-of-service taint removed".to_owned(),
                    ));
                    actions.push(OpAction::Forget);
                }
                Err(e) => {
                    op.last_error = Some(e.clone());
                    op.not_before = Some(ctx.now.saturating_add(millis(policy.retry_backoff)));
                }
            }
        }
        OpEvent::Tick => {
            if op.running.is_some() && ctx.executing {
                return done(op, actions);
            }
            // A step recorded as running that nothing runs: the controller restarted meanwhile.
            op.running = None;
            if op.not_before.is_some_and(|t| ctx.now < t) {
                return done(op, actions);
            }
            op.not_before = None;
            match op.phase {
                Phase::Fencing { step } => {
                    if !ctx.may_fence {
                        return done(op, actions);
                    }
                    if !ctx.configured.has(step) {
                        actions.extend(next_step(&mut op, step, ctx, policy));
                        return done(op, actions);
                    }
                    op.attempts = op.attempts.saturating_add(1);
                    op.running = Some(step);
                    actions.push(OpAction::Run(step));
                }
                Phase::Unconfirmed => {
                    if ctx.may_fence {
                        op.phase = Phase::Fencing {
                            step: Step::Isolation,
                        };
                        op.attempts = 0;
                    }
                }
                Phase::Releasing => {
                    // Re-checked before every release attempt: the stored state alone never
                    // releases anything.
                    if op.confirmed_by.is_none() {
                        op.phase = Phase::Fencing {
                            step: Step::Isolation,
                        };
                        op.attempts = 0;
                        actions.push(notice(
                            true,
                            "ReleaseRefused",
                            "the operation says releasing but records no confirmed fencing step; fencing again first".to_owned(),
                        ));
                        return done(op, actions);
                    }
                    if !ctx.may_fence {
                        return done(op, actions);
                    }
                    actions.push(OpAction::Release);
                }
                Phase::Released => {
                    let due = op.confirmed_by == Some(Step::Isolation)
                        && !op.power_cycled
                        && ctx.configured.power_management
                        && ctx.may_fence
                        && match (policy.power_management_after_isolation, op.released_at) {
                            (Some(d), Some(at)) => ctx.now >= at.saturating_add(millis(d)),
                            _ => false,
                        };
                    if due {
                        op.attempts = op.attempts.saturating_add(1);
                        op.running = Some(Step::PowerManagement);
                        actions.push(OpAction::Run(Step::PowerManagement));
                    }
                }
                Phase::Recovering { recovered: false } => {
                    // Pods may have been released (confirmed_by is set on the way to Releasing):
                    // their containers may still run on the node while their replacements run
                    // elsewhere. Nothing is undone before the node confirms they are gone.
                    if op.confirmed_by.is_some() && !ctx.kubelet.confirms_old_pods_gone() {
                        if !op.recovery_held {
                            op.recovery_held = true;
                            actions.push(notice(
                                false,
                                "RecoveryHeld",
                                format!(
                                    "the node is back but recovery waits until it rebooted or its kubelet confirms the released pods are gone: {}",
                                    ctx.kubelet.describe_wait()
                                ),
                            ));
                        }
                        return done(op, actions);
                    }
                    op.recovery_held = false;
                    if ctx.configured.recovery {
                        op.attempts = op.attempts.saturating_add(1);
                        op.running = Some(Step::Recovery);
                        actions.push(OpAction::Run(Step::Recovery));
                    } else {
                        op.phase = Phase::Recovering { recovered: true };
                    }
                }
                Phase::Recovering { recovered: true } => actions.push(OpAction::RemoveTaint),
            }
        }
    }
    done(op, actions)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn detection() -> DetectionConfig {
        DetectionConfig {
            missed_renewals: 3,
            renew_interval: None,
            suspect_after_renewals: 1.5,
            agent_heartbeat_timeout: Duration::from_secs(90),
        }
    }

    fn facts(name: &str, renew: Option<i64>) -> NodeFacts {
        NodeFacts {
            name: name.to_owned(),
            zone: ZoneKey::default(),
            ready: ReadyStatus::True,
            lease: Some(LeaseFacts {
                renew_time: renew,
                duration_seconds: Some(40),
            }),
            agent_heartbeat: None,
            last_gasp: None,
            eligible: true,
            boot_id: None,
            ready_heartbeat: None,
        }
    }

    #[test]
    fn config_defaults_and_overrides() {
        let d = parse_config("test", "").expect("empty is all defaults");
        assert_eq!(d, RemediationConfig::default());
        let c = parse_config(
            "test",
            "missedRenewals: 4\nrenewInterval: 1s\nnodeFenceRate: 1\npowerManagementAfterIsolation: never\n\
             leaderElection: {leaseDuration: 4s, renewDeadline: 3s, retryPeriod: 1s}\n\
             nodeSelector: {role: worker}\n",
        )
        .expect("valid");
        assert_eq!(c.detection.missed_renewals, 4);
        assert_eq!(c.detection.renew_interval, Some(Duration::from_secs(1)));
        assert_eq!(c.fencing.power_management_after_isolation, None);
        assert_eq!(c.leader.retry_period, Duration::from_secs(1));
        assert_eq!(
            c.node_selector.get("role").map(String::as_str),
            Some("worker")
        );
    }

    #[test]
    fn config_errors_name_the_field_and_value() {
        let cases = [
            ("missedRenewals: 0", "missedRenewals"),
            ("tickInterval: 5", "tickInterval"),
            ("tickInterval: 0s", "tickInterval"),
            ("unhealthyZoneThreshold: 1.5", "unhealthyZoneThreshold"),
            ("maxUnhealthyFraction: 0", "maxUnhealthyFraction"),
            ("nodeFenceRate: -1", "nodeFenceRate"),
            ("suspectAfterRenewals: 3", "suspectAfterRenewals"),
            ("renewInterval: -2s", "renewInterval"),
            (
                "leaderElection: {leaseDuration: 5s, renewDeadline: 5s}",
                "renewDeadline",
            ),
            (
                "leaderElection: {renewDeadline: 2s, retryPeriod: 2s}",
                "retryPeriod",
            ),
            ("bogusSetting: 1", "bogusSetting"),
            ("leaderElection: {leaseName: ''}", "leaseName"),
            // Absurd values are refused at load, naming the field and the value.
            (
                "missedRenewals: 4000000000",
                "missedRenewals: \"4000000000\"",
            ),
            ("missedRenewals: 1001", "1001"),
            ("renewInterval: 2562047h", "renewInterval: \"2562047h\""),
            (
                "renewInterval: 1h\nmissedRenewals: 25",
                "renewInterval: \"1h\"",
            ),
            ("tickInterval: 721h", "tickInterval: \"721h\""),
            ("agentHeartbeatTimeout: 2562047h", "agentHeartbeatTimeout"),
            ("leaderElection: {retryPeriod: 2562047h}", "retryPeriod"),
            (
                "powerManagementAfterIsolation: 100000h",
                "powerManagementAfterIsolation",
            ),
            ("stepRetries: 4294967295", "stepRetries: \"4294967295\""),
            ("suspectAfterRenewals: .nan", "suspectAfterRenewals"),
            ("suspectAfterRenewals: .inf", "suspectAfterRenewals"),
            ("nodeFenceRate: .inf", "nodeFenceRate"),
        ];
        for (text, field) in cases {
            let err = parse_config("remediate.yaml", text).expect_err(text);
            let msg = format!("{err}: {}", err_chain(&err));
            assert!(msg.contains(field), "{text}: {msg}");
        }
    }

    fn err_chain(e: &dyn std::error::Error) -> String {
        let mut s = String::new();
        let mut cur = e.source();
        while let Some(c) = cur {
            s.push_str(&c.to_string());
            cur = c.source();
        }
        s
    }

    #[test]
    fn zone_key_prefers_beta_labels_like_get_zone_key() {
        let l = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let cases = [
            (l(&[]), "", ""),
            (l(&[("topology.kubernetes.io/zone", "a")]), "", "a"),
            (
                l(&[
                    ("topology.kubernetes.io/zone", "a"),
                    ("failure-domain.beta.kubernetes.io/zone", "b"),
                    ("topology.kubernetes.io/region", "r"),
                ]),
                "r",
                "b",
            ),
        ];
        for (labels, region, zone) in cases {
            let k = ZoneKey::from_labels(&labels);
            assert_eq!(
                (k.region.as_str(), k.zone.as_str()),
                (region, zone),
                "{labels:?}"
            );
        }
        assert_eq!(
            ZoneKey {
                region: "r".into(),
                zone: "z".into()
            }
            .label(),
            "r:z"
        );
    }

    #[test]
    fn liveness_follows_observed_lease_changes_on_the_controller_clock() {
        // (seconds since origin, renew time written by the node, expected)
        let cfg = detection(); // 40 s leases: renew every 10 s, dead after 30 s, suspect after 15 s
        let steps: [(u64, Option<i64>, &str); 8] = [
            (0, Some(1_000), "alive"),  // first seen: assumed just renewed
            (10, Some(2_000), "alive"), // renewed
            (25, Some(2_000), "alive"), // 15 s silent: not yet beyond 1.5 intervals
            (26, Some(2_000), "suspect"),
            (39, Some(2_000), "suspect"),
            (40, Some(2_000), "dead"),  // 30 s silent: 3 renewals missed
            (41, Some(3_000), "alive"), // renewed again
            (41, None, "alive"),        // the value changed (cleared): counts as a change
        ];
        let mut t = LivenessTracker::new();
        for (secs, renew, want) in steps {
            let got = t.observe(&[facts("n", renew)], Timestamp::from_secs(secs), &cfg, true);
            assert_eq!(got["n"].label(), want, "at {secs}s renew={renew:?}");
        }
    }

    #[test]
    fn a_node_clock_far_behind_does_not_make_a_renewing_node_dead() {
        let cfg = detection();
        let mut t = LivenessTracker::new();
        // The node's clock is decades behind but it renews: only changes count.
        for (i, secs) in [0u64, 10, 20, 30, 40, 50].into_iter().enumerate() {
            let renew = Some(i64::try_from(i).expect("small"));
            let got = t.observe(&[facts("n", renew)], Timestamp::from_secs(secs), &cfg, true);
            assert_eq!(got["n"], Liveness::Alive(AliveBecause::LeaseRenewing));
        }
    }

    #[test]
    fn renew_interval_comes_from_config_or_lease() {
        let mut cfg = detection();
        let lease = |d| LeaseFacts {
            renew_time: None,
            duration_seconds: d,
        };
        let cases = [
            (None, Some(40), Duration::from_secs(10)),
            (None, Some(4), Duration::from_secs(1)),
            (None, None, Duration::from_secs(10)),
            (None, Some(0), Duration::from_secs(10)),
            (
                Some(Duration::from_secs(3)),
                Some(40),
                Duration::from_secs(3),
            ),
        ];
        for (configured, duration, want) in cases {
            cfg.renew_interval = configured;
            assert_eq!(
                renew_interval(&cfg, &lease(duration)),
                want,
                "{configured:?} {duration:?}"
            );
        }
    }

    #[test]
    fn agent_heartbeat_keeps_a_node_alive_and_last_gasp_kills_it_at_once() {
        let cfg = detection();
        // (renew, heartbeat, gasp, seconds, expected)
        type Row = (Option<i64>, Option<i64>, Option<i64>, u64, &'static str);
        let cases: [Row; 7] = [
            // Lease silent 40 s but the agent's heartbeat just changed: alive.
            (Some(100), Some(500), None, 40, "alive"),
            // Agent silent past its timeout too: dead.
            (Some(100), Some(500), None, 100, "dead"),
            // Last gasp newer than the last renewal and heartbeat: dead at once.
            (Some(100), Some(500), Some(600), 1, "dead"),
            // Last gasp older than the last renewal: the node came back since.
            (Some(700), Some(500), Some(600), 1, "alive"),
            // Last gasp older than the agent's heartbeat: the agent came back.
            (Some(100), Some(700), Some(600), 1, "alive"),
            // Gasp at the same instant as the heartbeat (written together): dead.
            (Some(100), Some(600), Some(600), 1, "dead"),
            // No lease at all and no agent: nothing to judge by.
            (None, None, None, 1000, "alive"),
        ];
        for (renew, hb, gasp, secs, want) in cases {
            let mut t = LivenessTracker::new();
            let mut f = facts("n", renew);
            if renew.is_none() {
                f.lease = None;
            }
            f.agent_heartbeat = hb;
            f.last_gasp = gasp;
            t.observe(std::slice::from_ref(&f), Timestamp::ZERO, &cfg, true);
            let got = t.observe(&[f], Timestamp::from_secs(secs), &cfg, true);
            assert_eq!(
                got["n"].label(),
                want,
                "renew={renew:?} hb={hb:?} gasp={gasp:?} t={secs}"
            );
        }
    }

    #[test]
    fn node_is_back_only_after_a_newer_renewal() {
        let l = |r| LeaseFacts {
            renew_time: r,
            duration_seconds: Some(40),
        };
        let cases = [
            (Some(10), Some(10), false),
            (Some(10), Some(9), false),
            (Some(10), Some(11), true),
            (None, Some(1), true),
            (Some(10), None, false),
        ];
        for (recorded, now, want) in cases {
            assert_eq!(
                node_is_back(recorded, Some(&l(now))),
                want,
                "{recorded:?} {now:?}"
            );
        }
        assert!(!node_is_back(Some(1), None));
    }

    #[test]
    fn zone_state_matches_compute_zone_state() {
        // (healthy, unhealthy, expected) with threshold 0.55
        let cases = [
            (3, 0, ZoneState::Normal),
            (0, 1, ZoneState::FullDisruption),
            (0, 5, ZoneState::FullDisruption),
            (0, 0, ZoneState::Normal),
            (1, 2, ZoneState::Normal), // 67 % but only two unhealthy
            (1, 3, ZoneState::PartialDisruption),
            (2, 3, ZoneState::PartialDisruption),  // 60 %
            (3, 3, ZoneState::Normal),             // 50 %
            (9, 11, ZoneState::PartialDisruption), // exactly 55 %
        ];
        for (h, u, want) in cases {
            assert_eq!(
                compute_zone_state(h, u, 0.55),
                want,
                "{h} healthy {u} unhealthy"
            );
        }
    }

    fn storm() -> StormConfig {
        RemediationConfig::default().storm
    }

    #[test]
    fn zone_rates_follow_set_limiter_in_zone() {
        let cfg = storm();
        let cases = [
            (ZoneState::Normal, 10, 0.1),
            (ZoneState::FullDisruption, 10, 0.1),
            (ZoneState::PartialDisruption, 50, 0.0), // not larger than the threshold
            (ZoneState::PartialDisruption, 51, 0.01),
        ];
        for (state, size, want) in cases {
            assert!(
                (zone_fence_rate(state, size, &cfg) - want).abs() < 1e-12,
                "{state:?} {size}"
            );
        }
    }

    fn z(name: &str) -> ZoneKey {
        ZoneKey {
            region: String::new(),
            zone: name.to_owned(),
        }
    }

    #[test]
    fn storm_protection_table() {
        let cfg = storm();
        let nodes = |spec: &[(&str, bool)]| -> Vec<(ZoneKey, bool)> {
            spec.iter().map(|(zn, u)| (z(zn), *u)).collect()
        };
        // (nodes, api silent s, blocked label, zone to ask about, admits?)
        type Row = (
            Vec<(ZoneKey, bool)>,
            u64,
            Option<&'static str>,
            &'static str,
            bool,
        );
        let cases: Vec<Row> = vec![
            // One dead node of three: fence.
            (
                nodes(&[("a", true), ("a", false), ("b", false)]),
                0,
                None,
                "a",
                true,
            ),
            // A single-node zone fully down while another zone is fine: the NLC's normal rate.
            (
                nodes(&[("a", false), ("a", false), ("b", true)]),
                0,
                None,
                "b",
                true,
            ),
            // Two of three unhealthy: cluster-wide storm rule.
            (
                nodes(&[("a", true), ("a", true), ("b", false)]),
                0,
                Some("too_many_unhealthy"),
                "a",
                false,
            ),
            // Every node unhealthy: the management side is suspect.
            (
                nodes(&[("a", true), ("b", true)]),
                0,
                Some("all_zones_disrupted"),
                "a",
                false,
            ),
            // The controller has not reached the API for 7 s (> 6 s).
            (
                nodes(&[("a", true), ("a", false), ("b", false)]),
                7,
                Some("controller_partitioned"),
                "a",
                false,
            ),
        ];
        for (n, silent, blocked, zone, admits) in cases {
            let a = assess(n.clone(), Duration::from_secs(silent), &cfg);
            assert_eq!(a.blocked.as_ref().map(SkipReason::label), blocked, "{n:?}");
            assert_eq!(a.admits(&z(zone)).is_ok(), admits, "{n:?}");
        }
    }

    #[test]
    fn a_partially_disrupted_small_zone_fences_nothing() {
        let mut cfg = storm();
        cfg.max_unhealthy_fraction = 0.9;
        // zone a: 3 of 4 unhealthy (75 %, more than two) → PartialDisruption, rate 0.
        let n = vec![
            (z("a"), true),
            (z("a"), true),
            (z("a"), true),
            (z("a"), false),
            (z("b"), false),
            (z("b"), false),
        ];
        let a = assess(n, Duration::ZERO, &cfg);
        assert_eq!(a.blocked, None);
        assert_eq!(a.zones[&z("a")].state, ZoneState::PartialDisruption);
        let err = a.admits(&z("a")).expect_err("rate 0");
        assert_eq!(err.label(), "zone_disruption");
        assert!(
            err.message().contains("PartialDisruption"),
            "{}",
            err.message()
        );
        assert!(a.admits(&z("b")).is_ok());
        // The same zone in a large cluster gets the secondary rate instead.
        cfg.large_cluster_size_threshold = 3;
        let n = vec![
            (z("a"), true),
            (z("a"), true),
            (z("a"), true),
            (z("a"), false),
        ];
        let a = assess(n, Duration::ZERO, &cfg);
        assert!((a.zones[&z("a")].rate - 0.01).abs() < 1e-12);
    }

    #[test]
    fn token_bucket_refills_at_qps_with_burst_one() {
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        // (seconds, expected take)
        let steps = [
            (0, true),
            (0, false),
            (5, false),
            (10, true),
            (19, false),
            (20, true),
        ];
        for (s, want) in steps {
            assert_eq!(b.try_take(Timestamp::from_secs(s)), want, "at {s}s");
        }
        let mut never = TokenBucket::new(0.0, 1, Timestamp::ZERO);
        assert!(!never.try_take(Timestamp::from_secs(1_000)));
    }

    #[test]
    fn swapping_the_rate_never_hands_out_a_free_token() {
        // Old bucket drained: the new one starts drained too.
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        assert!(b.try_take(Timestamp::ZERO));
        b.swap_qps(1.0, Timestamp::from_secs(1));
        assert!(!b.try_take(Timestamp::from_secs(1)));
        assert!(b.try_take(Timestamp::from_secs(2)));
        // Old bucket with a token: the new one is full.
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        b.swap_qps(0.5, Timestamp::from_secs(1));
        assert!(b.try_take(Timestamp::from_secs(1)));
        // To zero and back.
        let mut b = TokenBucket::new(0.1, 1, Timestamp::ZERO);
        b.swap_qps(0.0, Timestamp::from_secs(1));
        assert!(!b.try_take(Timestamp::from_secs(100)));
        b.swap_qps(0.1, Timestamp::from_secs(100));
        assert!(
            !b.try_take(Timestamp::from_secs(100)),
            "drained on the way back"
        );
        assert!(b.try_take(Timestamp::from_secs(110)));
    }

    #[test]
    fn zone_limiters_follow_the_assessment() {
        let cfg = storm();
        let mut l = ZoneLimiters::default();
        let healthy = assess(
            vec![(z("a"), false), (z("a"), true), (z("b"), false)],
            Duration::ZERO,
            &cfg,
        );
        l.update(&healthy, Timestamp::ZERO);
        assert!(l.try_take(&z("a"), Timestamp::ZERO));
        assert!(
            !l.try_take(&z("a"), Timestamp::from_secs(1)),
            "one node per 10 s"
        );
        assert!(
            l.try_take(&z("b"), Timestamp::from_secs(1)),
            "zones are independent"
        );
        assert!(!l.try_take(&z("unknown"), Timestamp::from_secs(1)));
    }

    // --- the fencing state machine -------------------------------------------------------------

    fn policy() -> FencingPolicy {
        FencingPolicy {
            method_timeout: Duration::from_secs(60),
            step_retries: 1,
            retry_backoff: Duration::from_secs(5),
            unconfirmed_retry_interval: Duration::from_secs(60),
            power_management_after_isolation: Some(Duration::from_secs(300)),
        }
    }

    fn ctx(now_s: i64) -> OpContext {
        OpContext {
            now: now_s * 1000,
            node_present: true,
            node_back: false,
            executing: false,
            may_fence: true,
            configured: ConfiguredSteps {
                isolation: true,
                power_management: true,
                recovery: true,
            },
            // The kubelet is back and no pod of before the fence is left.
            kubelet: KubeletReturn {
                rebooted: false,
                ready_again: true,
                old_pods: Some(0),
            },
        }
    }

    fn new_op() -> FenceOp {
        let mut f = facts("n1", Some(1_000));
        f.boot_id = Some("boot-1".to_owned());
        f.ready_heartbeat = Some(800);
        FenceOp::new(
            &f,
            "uid-1",
            &DeathEvidence::LeaseExpired {
                silent: Duration::from_secs(30),
                renew_interval: Duration::from_secs(10),
                missed: 3,
            },
            0,
        )
    }

    fn kinds(actions: &[OpAction]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                OpAction::Run(s) => format!("run:{}", s.as_str()),
                OpAction::Notify(n) => format!("event:{}", n.reason),
                other => format!("{other:?}").to_lowercase(),
            })
            .collect()
    }

    /// Drives an operation through a script of (event, context) and checks the phase and the
    /// actions after each.
    fn script(steps: &[(OpEvent, OpContext, &str, &[&str])]) -> FenceOp {
        let mut op = new_op();
        for (i, (ev, c, phase, want)) in steps.iter().enumerate() {
            let t = advance(&op, ev, c, &policy());
            assert_eq!(t.op.phase.label(), *phase, "step {i}: {ev:?} → {:?}", t.op);
            assert_eq!(kinds(&t.actions), *want, "step {i}: {ev:?}");
            op = t.op;
        }
        op
    }

    fn ok(step: Step) -> OpEvent {
        OpEvent::StepDone {
            step,
            result: Ok(()),
        }
    }

    fn fail(step: Step) -> OpEvent {
        OpEvent::StepDone {
            step,
            result: Err("exit status 1".into()),
        }
    }

    fn executing(mut c: OpContext) -> OpContext {
        c.executing = true;
        c
    }

    fn back(mut c: OpContext) -> OpContext {
        c.node_back = true;
        c
    }

    #[test]
    fn isolation_success_releases_then_recovery_when_the_node_is_back() {
        let released = OpEvent::ReleaseDone {
            result: Ok(ReleaseSummary {
                pods_deleted: 2,
                volume_attachments: 1,
            }),
        };
        let op = script(&[
            (OpEvent::Tick, ctx(0), "fencing", &["run:isolation"]),
            (OpEvent::Tick, executing(ctx(1)), "fencing", &[]),
            (
                ok(Step::Isolation),
                ctx(2),
                "releasing",
                &["event:FencingConfirmed"],
            ),
            (OpEvent::Tick, ctx(2), "releasing", &["release"]),
            (released, ctx(2), "released", &["event:NodeReleased"]),
            (OpEvent::Tick, ctx(100), "released", &[]),
            (
                OpEvent::Tick,
                back(ctx(120)),
                "recovering",
                &["event:NodeBack"],
            ),
            (
                OpEvent::Tick,
                back(ctx(120)),
                "recovering",
                &["run:recovery"],
            ),
            (ok(Step::Recovery), back(ctx(121)), "recovering", &[]),
            (
                OpEvent::Tick,
                back(ctx(121)),
                "recovering",
                &["removetaint"],
            ),
            (
                OpEvent::TaintRemoved { result: Ok(()) },
                back(ctx(121)),
                "recovering",
                &["event:NodeRecovered", "forget"],
            ),
        ]);
        assert_eq!(op.confirmed_by, Some(Step::Isolation));
        assert_eq!(op.released_at, Some(2_000));
    }

    #[test]
    fn failing_steps_never_release_and_end_unconfirmed() {
        let op = script(&[
            (OpEvent::Tick, ctx(0), "fencing", &["run:isolation"]),
            (
                fail(Step::Isolation),
                ctx(1),
                "fencing",
                &["event:FenceStepFailed"],
            ),
            (OpEvent::Tick, ctx(3), "fencing", &[]), // backoff: 5 s
            (OpEvent::Tick, ctx(6), "fencing", &["run:isolation"]),
            // Retries exhausted (1 retry): power management next.
            (
                fail(Step::Isolation),
                ctx(7),
                "fencing",
                &["event:FenceStepFailed"],
            ),
            (OpEvent::Tick, ctx(7), "fencing", &["run:power_management"]),
            (
                fail(Step::PowerManagement),
                ctx(8),
                "fencing",
                &["event:FenceStepFailed"],
            ),
            (OpEvent::Tick, ctx(13), "fencing", &["run:power_management"]),
            (
                fail(Step::PowerManagement),
                ctx(14),
                "unconfirmed",
                &["event:FenceStepFailed", "event:FencingUnconfirmed"],
            ),
            (OpEvent::Tick, ctx(30), "unconfirmed", &[]),
            // A new cycle after the unconfirmed pause.
            (OpEvent::Tick, ctx(74), "fencing", &[]),
            (OpEvent::Tick, ctx(74), "fencing", &["run:isolation"]),
        ]);
        assert_eq!(op.cycles, 1);
        assert_eq!(op.released_at, None);
        assert_eq!(op.confirmed_by, None);
    }

    #[test]
    fn power_management_confirms_when_isolation_is_not_configured() {
        let mut c = ctx(0);
        c.configured.isolation = false;
        script(&[
            (OpEvent::Tick, c, "fencing", &[]),
            (OpEvent::Tick, c, "fencing", &["run:power_management"]),
            (
                ok(Step::PowerManagement),
                c,
                "releasing",
                &["event:FencingConfirmed"],
            ),
        ]);
    }

    #[test]
    fn no_steps_configured_is_never_released() {
        let mut c = ctx(0);
        c.configured = ConfiguredSteps::default();
        let op = script(&[
            (
                OpEvent::Tick,
                c,
                "unconfirmed",
                &["event:FencingUnconfirmed"],
            ),
            (OpEvent::Tick, c, "unconfirmed", &[]),
        ]);
        assert_eq!(op.released_at, None);
    }

    #[test]
    fn storm_protection_holds_new_attempts_and_releases() {
        let mut hold = ctx(0);
        hold.may_fence = false;
        let mut hold8 = ctx(8);
        hold8.may_fence = false;
        script(&[
            (OpEvent::Tick, hold, "fencing", &[]),
            (OpEvent::Tick, ctx(1), "fencing", &["run:isolation"]),
            (
                ok(Step::Isolation),
                hold,
                "releasing",
                &["event:FencingConfirmed"],
            ),
            // Confirmed, but storm protection blocks now: the release waits.
            (OpEvent::Tick, hold, "releasing", &[]),
            (OpEvent::Tick, ctx(2), "releasing", &["release"]),
            // A failed release is retried only while storm protection allows it.
            (
                OpEvent::ReleaseDone {
                    result: Err("conflict".into()),
                },
                ctx(2),
                "releasing",
                &["event:ReleaseFailed"],
            ),
            (OpEvent::Tick, hold8, "releasing", &[]),
            (OpEvent::Tick, ctx(8), "releasing", &["release"]),
        ]);
    }

    #[test]
    fn a_stored_release_without_a_confirmed_step_is_refused() {
        // State written by someone else (or an older version): releasing, nothing confirmed.
        let mut op = new_op();
        op.phase = Phase::Releasing;
        op.confirmed_by = None;
        let t = advance(&op, &OpEvent::Tick, &ctx(0), &policy());
        assert_eq!(kinds(&t.actions), ["event:ReleaseRefused"]);
        assert_eq!(
            t.op.phase,
            Phase::Fencing {
                step: Step::Isolation
            }
        );
        let t = advance(&t.op, &OpEvent::Tick, &ctx(0), &policy());
        assert_eq!(kinds(&t.actions), ["run:isolation"]);
    }

    #[test]
    fn node_back_while_fencing_cancels_and_recovers_without_release() {
        let op = script(&[
            (OpEvent::Tick, ctx(0), "fencing", &["run:isolation"]),
            (
                OpEvent::Tick,
                executing(back(ctx(1))),
                "recovering",
                &["cancel", "event:NodeBack"],
            ),
            // The cancelled step's late result is ignored.
            (ok(Step::Isolation), back(ctx(2)), "recovering", &[]),
            (OpEvent::Tick, back(ctx(2)), "recovering", &["run:recovery"]),
            (
                fail(Step::Recovery),
                back(ctx(3)),
                "recovering",
                &["event:RecoveryFailed"],
            ),
            (OpEvent::Tick, back(ctx(4)), "recovering", &[]),
            (OpEvent::Tick, back(ctx(8)), "recovering", &["run:recovery"]),
        ]);
        assert_eq!(op.released_at, None);
    }

    #[test]
    fn a_step_interrupted_by_a_restart_runs_again() {
        let mut op = new_op();
        op.running = Some(Step::Isolation);
        op.attempts = 1;
        let t = advance(&op, &OpEvent::Tick, &ctx(10), &policy());
        assert_eq!(kinds(&t.actions), ["run:isolation"]);
        assert_eq!(t.op.attempts, 2);
        // Round trip through the stored form.
        let json = serde_json::to_string(&t.op).expect("serialize");
        let back: FenceOp = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, t.op);
        assert!(json.contains("\"phase\":{\"name\":\"fencing\""), "{json}");
    }

    #[test]
    fn power_management_follows_an_isolation_release_when_the_node_stays_dead() {
        let mut op = new_op();
        op.phase = Phase::Released;
        op.confirmed_by = Some(Step::Isolation);
        op.released_at = Some(0);
        let cases = [(299, false), (300, true)];
        for (s, runs) in cases {
            let t = advance(&op, &OpEvent::Tick, &ctx(s), &policy());
            assert_eq!(
                t.actions == [OpAction::Run(Step::PowerManagement)],
                runs,
                "at {s}s"
            );
        }
        op.running = Some(Step::PowerManagement);
        let t = advance(&op, &ok(Step::PowerManagement), &ctx(301), &policy());
        assert!(t.op.power_cycled);
        let t = advance(&t.op, &OpEvent::Tick, &ctx(1000), &policy());
        assert!(t.actions.is_empty(), "once only");
    }

    #[test]
    fn a_deleted_node_is_forgotten() {
        let mut c = executing(ctx(0));
        c.node_present = false;
        let t = advance(&new_op(), &OpEvent::Tick, &c, &policy());
        assert_eq!(kinds(&t.actions), ["cancel", "forget"]);
    }

    #[test]
    fn release_failure_is_retried_after_the_backoff() {
        let mut op = new_op();
        op.phase = Phase::Releasing;
        op.confirmed_by = Some(Step::Isolation);
        let t = advance(
            &op,
            &OpEvent::ReleaseDone {
                result: Err("forbidden".into()),
            },
            &ctx(0),
            &policy(),
        );
        assert_eq!(t.op.phase, Phase::Releasing);
        assert!(
            advance(&t.op, &OpEvent::Tick, &ctx(4), &policy())
                .actions
                .is_empty()
        );
        assert_eq!(
            advance(&t.op, &OpEvent::Tick, &ctx(5), &policy()).actions,
            [OpAction::Release]
        );
    }

    #[test]
    fn recovery_after_a_release_waits_until_the_kubelet_confirms_the_old_pods_gone() {
        let mut op = new_op();
        op.phase = Phase::Released;
        op.confirmed_by = Some(Step::Isolation);
        op.released_at = Some(0);
        let k = |rebooted, ready_again, old_pods| KubeletReturn {
            rebooted,
            ready_again,
            old_pods,
        };
        // (what the node says once its Lease renews again, recovery runs?)
        let cases = [
            // The Lease renews but the kubelet has not reported Ready since: hold.
            (k(false, false, Some(0)), false),
            // Ready again but a pod of before the fence is still bound to it: hold.
            (k(false, true, Some(1)), false),
            // Ready again, pods unknown (the list failed): hold.
            (k(false, true, None), false),
            // Ready again and no pod of before is left: recover.
            (k(false, true, Some(0)), true),
            // Rebooted: nothing of before runs, whatever else.
            (k(true, false, None), true),
            (k(true, false, Some(3)), true),
        ];
        for (kubelet, runs) in cases {
            let mut c = back(ctx(120));
            c.kubelet = kubelet;
            let t = advance(&op, &OpEvent::Tick, &c, &policy());
            assert_eq!(t.op.phase, Phase::Recovering { recovered: false });
            let t = advance(&t.op, &OpEvent::Tick, &c, &policy());
            assert_eq!(
                t.actions.contains(&OpAction::Run(Step::Recovery)),
                runs,
                "{kubelet:?}: {:?}",
                t.actions
            );
            if !runs {
                assert_eq!(kinds(&t.actions), ["event:RecoveryHeld"], "{kubelet:?}");
                assert!(t.op.recovery_held);
                // Announced once; the taint is never removed while held.
                let again = advance(&t.op, &OpEvent::Tick, &c, &policy());
                assert!(again.actions.is_empty(), "{kubelet:?}: {:?}", again.actions);
            }
        }
        // Without recovery methods the taint removal waits the same way.
        let mut c = back(ctx(120));
        c.configured.recovery = false;
        c.kubelet = k(false, false, Some(0));
        let t = advance(&op, &OpEvent::Tick, &c, &policy());
        let t = advance(&t.op, &OpEvent::Tick, &c, &policy());
        let t = advance(&t.op, &OpEvent::Tick, &c, &policy());
        assert!(
            !t.actions.contains(&OpAction::RemoveTaint),
            "{:?}",
            t.actions
        );
        // Nothing released (the node came back while a step was still failing): no hold.
        let mut unreleased = new_op();
        unreleased.phase = Phase::Recovering { recovered: false };
        let t = advance(&unreleased, &OpEvent::Tick, &c, &policy());
        assert_eq!(t.op.phase, Phase::Recovering { recovered: true });
    }

    #[test]
    fn the_kubelet_return_is_read_from_node_written_facts() {
        // Recorded when found dead: Lease renewal 1_000, Ready heartbeat 1_500, bootID "boot-1".
        let mut op = new_op();
        op.ready_heartbeat = Some(1_500);
        let f = |ready: ReadyStatus, hb: Option<i64>, boot: Option<&str>| {
            let mut n = facts("n1", Some(5_000));
            n.ready = ready;
            n.ready_heartbeat = hb;
            n.boot_id = boot.map(str::to_owned);
            n
        };
        // (facts, rebooted, ready_again)
        let cases = [
            // Ready, but its heartbeat predates the death: a stale condition.
            (
                f(ReadyStatus::True, Some(900), Some("boot-1")),
                false,
                false,
            ),
            // Newer than the last renewal, not newer than the heartbeat posted before the death.
            (
                f(ReadyStatus::True, Some(1_001), Some("boot-1")),
                false,
                false,
            ),
            (
                f(ReadyStatus::True, Some(1_500), Some("boot-1")),
                false,
                false,
            ),
            (
                f(ReadyStatus::True, Some(1_501), Some("boot-1")),
                false,
                true,
            ),
            (
                f(ReadyStatus::Unknown, Some(2_000), Some("boot-1")),
                false,
                false,
            ),
            (
                f(ReadyStatus::True, Some(2_000), Some("boot-2")),
                true,
                true,
            ),
            (f(ReadyStatus::False, None, Some("boot-2")), true, false),
            // An unknown or empty bootID is no reboot.
            (f(ReadyStatus::False, None, None), false, false),
            (f(ReadyStatus::False, None, Some("")), false, false),
        ];
        for (n, rebooted, ready_again) in cases {
            let k = KubeletReturn::observe(&op, &n, Some(0));
            assert_eq!(
                (k.rebooted, k.ready_again),
                (rebooted, ready_again),
                "{n:?}"
            );
        }
        // No bootID recorded at fencing: a reboot cannot be told.
        let mut old = op.clone();
        old.boot_id = None;
        let k = KubeletReturn::observe(&old, &f(ReadyStatus::False, None, Some("boot-2")), None);
        assert!(!k.rebooted && !k.confirms_old_pods_gone());
    }

    #[test]
    fn toleration_matching_follows_tolerates_taint() {
        let t = |key, operator, value, effect| TolerationRef {
            key,
            operator,
            value,
            effect,
        };
        let oos = Some(OUT_OF_SERVICE_TAINT);
        let cases = [
            // key, operator, value, effect
            (t(oos, Some("Exists"), None, None), true),
            (t(oos, Some("Exists"), None, Some("NoExecute")), true),
            (t(oos, Some("Exists"), None, Some("NoSchedule")), false),
            (t(oos, Some("Exists"), Some("ignored"), Some("")), true),
            (
                t(oos, Some("Equal"), Some("nodeshutdown"), Some("NoExecute")),
                true,
            ),
            (t(oos, None, Some("nodeshutdown"), None), true),
            (t(oos, Some(""), Some("nodeshutdown"), None), true),
            (t(oos, Some("Equal"), Some("other"), None), false),
            (t(oos, Some("Equal"), None, None), false),
            // Tolerates everything.
            (t(None, Some("Exists"), None, None), true),
            (t(Some(""), Some("Exists"), None, Some("NoExecute")), true),
            (t(None, Some("Exists"), None, Some("NoSchedule")), false),
            // Another key.
            (
                t(
                    Some("node.kubernetes.io/unreachable"),
                    Some("Exists"),
                    None,
                    None,
                ),
                false,
            ),
            // Numeric comparison operators only apply to numeric values.
            (t(oos, Some("Gt"), Some("1"), None), false),
            // A malformed empty key with Equal compares values ("" ≠ "nodeshutdown").
            (t(None, Some("Equal"), None, None), false),
        ];
        for (tol, want) in cases {
            assert_eq!(
                tolerates(
                    &tol,
                    OUT_OF_SERVICE_TAINT,
                    OUT_OF_SERVICE_VALUE,
                    "NoExecute"
                ),
                want,
                "{tol:?}"
            );
            assert_eq!(tolerates_out_of_service([tol]), want, "{tol:?}");
        }
        assert!(!tolerates_out_of_service([]));
    }

    #[test]
    fn absurd_detection_settings_never_panic() {
        // Settings built in code (not through parse_config) at the extremes of their types.
        let lease = |secs| LeaseFacts {
            renew_time: Some(1),
            duration_seconds: Some(secs),
        };
        let cfgs = [
            DetectionConfig {
                missed_renewals: u32::MAX,
                renew_interval: Some(Duration::from_secs(u64::MAX / 2)),
                suspect_after_renewals: 1e300,
                agent_heartbeat_timeout: Duration::MAX,
            },
            DetectionConfig {
                missed_renewals: u32::MAX,
                renew_interval: None,
                suspect_after_renewals: f64::MAX,
                agent_heartbeat_timeout: Duration::ZERO,
            },
            DetectionConfig {
                missed_renewals: 1,
                renew_interval: Some(Duration::MAX),
                suspect_after_renewals: 0.5,
                agent_heartbeat_timeout: Duration::ZERO,
            },
        ];
        for cfg in cfgs {
            for secs in [i32::MAX, 1, 0, -5] {
                let mut t = LivenessTracker::new();
                let mut f = facts("n", Some(1));
                f.lease = Some(lease(secs));
                for at in [0, 1, u64::MAX / 4] {
                    let got = t.observe(
                        std::slice::from_ref(&f),
                        Timestamp::from_secs(at),
                        &cfg,
                        true,
                    );
                    assert!(got.contains_key("n"), "{cfg:?}");
                }
            }
        }
        // The arithmetic itself.
        let cases = [
            (Duration::from_secs(10), 1.5, Duration::from_secs(15)),
            (Duration::MAX, 2.0, Duration::MAX),
            (Duration::from_secs(u64::MAX / 2), 1e300, Duration::MAX),
            (Duration::from_secs(1), f64::INFINITY, Duration::MAX),
            (Duration::from_secs(1), f64::NAN, Duration::ZERO),
            (Duration::from_secs(1), -1.0, Duration::ZERO),
        ];
        for (d, f, want) in cases {
            assert_eq!(mul_f64_saturating(d, f), want, "{d:?} × {f}");
        }
    }

    #[test]
    fn attempt_and_cycle_counters_saturate() {
        let mut op = new_op();
        op.attempts = u32::MAX;
        op.cycles = u32::MAX;
        let mut p = policy();
        p.step_retries = u32::MAX;
        let failed = fail_running(&mut op);
        let t = advance(&op, &failed, &ctx(0), &p);
        assert_eq!(t.op.attempts, u32::MAX);
        let t = advance(&t.op, &OpEvent::Tick, &ctx(100), &p);
        assert_eq!(t.op.attempts, u32::MAX);
        let mut c = ctx(0);
        c.configured = ConfiguredSteps::default();
        let t = advance(&new_op_with_cycles(u32::MAX), &OpEvent::Tick, &c, &p);
        assert_eq!(t.op.cycles, u32::MAX);
    }

    fn fail_running(op: &mut FenceOp) -> OpEvent {
        op.running = Some(Step::Isolation);
        fail(Step::Isolation)
    }

    fn new_op_with_cycles(cycles: u32) -> FenceOp {
        let mut op = new_op();
        op.cycles = cycles;
        op
    }

    #[test]
    fn a_stale_lease_watch_never_makes_a_node_dead() {
        let cfg = detection(); // dead after 30 s of silence
        let mut t = LivenessTracker::new();
        let f = facts("n", Some(1_000));
        // (seconds, lease view fresh, expected)
        let steps = [
            (0, true, "alive"),
            (29, true, "suspect"),
            // The watch is found stale: the silence may be the watch's, not the node's.
            (31, false, "suspect"),
            (300, false, "suspect"),
            // Fresh again and still no renewal: now it is dead.
            (301, true, "dead"),
        ];
        for (secs, fresh, want) in steps {
            let got = t.observe(
                std::slice::from_ref(&f),
                Timestamp::from_secs(secs),
                &cfg,
                fresh,
            );
            assert_eq!(got["n"].label(), want, "at {secs}s fresh={fresh}");
        }
        // A last gasp is held back too: a newer renewal may be what the watch missed.
        let mut gasp = facts("g", Some(1_000));
        gasp.last_gasp = Some(2_000);
        let got = LivenessTracker::new().observe(&[gasp], Timestamp::ZERO, &cfg, false);
        assert_eq!(got["g"].label(), "suspect");
    }

    #[test]
    fn watch_caught_up_compares_resource_versions() {
        let cache: BTreeMap<&str, &str> = [("a", "105"), ("b", "99"), ("c", "x1")].into();
        let cached = |n: &str| cache.get(n).map(|v| (*v).to_owned());
        let cases: [(&[(&str, &str)], bool); 8] = [
            (&[], true),
            (&[("a", "105"), ("b", "99")], true),
            (&[("a", "100")], true), // the cache is ahead: events after the list
            (&[("a", "106")], false), // the list saw a renewal the watch did not deliver
            (&[("b", "100"), ("a", "1")], false),
            (&[("d", "1")], false), // listed, never cached
            (&[("c", "x1")], true), // opaque versions: equality
            (&[("c", "x2")], false),
        ];
        for (listed, want) in cases {
            assert_eq!(
                watch_caught_up(listed.iter().copied(), cached),
                want,
                "{listed:?}"
            );
        }
    }
}
