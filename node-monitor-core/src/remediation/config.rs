//! The settings of `node-monitor remediate` ([`RemediationConfig`]) and their parser
//! ([`parse_config`]): every field checked at load, every error naming the field and the value.
use std::{collections::BTreeMap, time::Duration};

use serde::Deserialize;

use crate::units::duration::{DurationError, parse_non_negative};

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
    /// A node agent's liveness Lease unchanged for this long is silent (`agentLeaseTimeout`).
    pub agent_lease_timeout: Duration,
    /// A silent agent Lease makes its node dead only once the kubelet's Lease has been silent
    /// for this many of its renewal intervals too (`agentKubeletCorroboration`): more than one,
    /// so that a live kubelet between two renewals never corroborates.
    pub agent_kubelet_corroboration: f64,
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
    /// The Lease's name (in the controller's namespace).
    pub lease_name: String,
    /// How long a leader's claim holds without renewal (`leaseDuration`).
    pub lease_duration: Duration,
    /// How long the leader keeps trying to renew before it gives up leading (`renewDeadline`).
    pub renew_deadline: Duration,
    /// Pause between attempts to acquire or renew (`retryPeriod`).
    pub retry_period: Duration,
}

/// Every setting of `node-monitor remediate`.
#[derive(Debug, Clone, PartialEq)]
pub struct RemediationConfig {
    /// How often every replica judges the nodes (`tickInterval`).
    pub tick_interval: Duration,
    /// How a dead node is recognised.
    pub detection: DetectionConfig,
    /// When fencing is held back (storm protection) and how fast it may go.
    pub storm: StormConfig,
    /// Timeouts and retries of the fencing steps.
    pub fencing: FencingPolicy,
    /// Leader election: only the leader acts.
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
                agent_lease_timeout: Duration::from_secs(8),
                agent_kubelet_corroboration: 1.2,
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
    /// The document is not valid YAML/JSON or has an unknown or mistyped field.
    Syntax {
        /// The document's name (its file path).
        source_name: String,
        #[source]
        /// The parser's error.
        source: serde_norway::Error,
    },
    #[error("{field}: invalid duration {value:?}")]
    /// A duration setting does not parse.
    Duration {
        /// The setting's name as written in the document.
        field: &'static str,
        /// The value as written.
        value: String,
        #[source]
        /// Why it does not parse.
        source: DurationError,
    },
    #[error("{field}: {value:?} {reason}")]
    /// A setting parses but its value is out of range or contradicts another.
    Invalid {
        /// The setting's name as written in the document.
        field: &'static str,
        /// The value.
        value: String,
        /// What a valid value is.
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
    agent_lease_timeout: Option<String>,
    agent_kubelet_corroboration: Option<f64>,
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

/// The shortest period of a loop that calls the API server (`tickInterval`,
/// `leaderElection.retryPeriod`): shorter would be a tight loop on the API server.
pub const MIN_LOOP_PERIOD: Duration = Duration::from_millis(100);

/// [`duration_field`] for a loop's period: at least [`MIN_LOOP_PERIOD`].
fn period_field(
    field: &'static str,
    value: Option<String>,
    default: Duration,
) -> Result<Duration, RemediationConfigError> {
    let text = value.clone();
    let d = duration_field(field, value, default)?;
    if d < MIN_LOOP_PERIOD {
        return Err(RemediationConfigError::Invalid {
            field,
            value: text.unwrap_or_default(),
            reason: "must be at least 100ms: a shorter period is a tight loop on the API server",
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
    let mut raw: RawConfig = if text.trim().is_empty() {
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
    let detection = parse_detection(&mut raw, &d.detection)?;
    let step_retries = raw.step_retries.unwrap_or(d.fencing.step_retries);
    if step_retries > MAX_STEP_RETRIES {
        return Err(RemediationConfigError::Invalid {
            field: "stepRetries",
            value: step_retries.to_string(),
            reason: "must be at most 100",
        });
    }
    let power_management_after_isolation = match raw.power_management_after_isolation.take() {
        Some(v) if v == "never" => None,
        Some(v) => Some(duration_field(
            "powerManagementAfterIsolation",
            Some(v),
            Duration::ZERO,
        )?),
        None => d.fencing.power_management_after_isolation,
    };
    let leader = parse_leader(raw.leader_election.take().unwrap_or_default(), d.leader)?;
    Ok(RemediationConfig {
        tick_interval: period_field("tickInterval", raw.tick_interval.take(), d.tick_interval)?,
        detection,
        storm: parse_storm(&mut raw, &d.storm)?,
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
        leader,
        force_delete_pods: raw.force_delete_pods.unwrap_or(d.force_delete_pods),
        node_selector: raw.node_selector.unwrap_or_default(),
        dry_run: raw.dry_run.unwrap_or(d.dry_run),
    })
}

/// The detection settings, with their rules between them.
fn parse_detection(
    raw: &mut RawConfig,
    d: &DetectionConfig,
) -> Result<DetectionConfig, RemediationConfigError> {
    let missed_renewals = raw.missed_renewals.unwrap_or(d.missed_renewals);
    if missed_renewals == 0 || missed_renewals > MAX_MISSED_RENEWALS {
        return Err(RemediationConfigError::Invalid {
            field: "missedRenewals",
            value: missed_renewals.to_string(),
            reason: "must be between 1 and 1000",
        });
    }
    let suspect_after_renewals = raw
        .suspect_after_renewals
        .unwrap_or(d.suspect_after_renewals);
    if !(suspect_after_renewals > 0.0 && suspect_after_renewals < f64::from(missed_renewals)) {
        return Err(RemediationConfigError::Invalid {
            field: "suspectAfterRenewals",
            value: suspect_after_renewals.to_string(),
            reason: "must be positive and below missedRenewals",
        });
    }
    let renew_interval = match raw.renew_interval.take() {
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
    let agent_kubelet_corroboration = raw
        .agent_kubelet_corroboration
        .unwrap_or(d.agent_kubelet_corroboration);
    if !(agent_kubelet_corroboration > 1.0
        && agent_kubelet_corroboration < f64::from(missed_renewals))
    {
        return Err(RemediationConfigError::Invalid {
            field: "agentKubeletCorroboration",
            value: agent_kubelet_corroboration.to_string(),
            reason: "must be above 1 (a live kubelet between two renewals must never corroborate) and below missedRenewals",
        });
    }
    let agent_lease_timeout = duration_field(
        "agentLeaseTimeout",
        raw.agent_lease_timeout.take(),
        d.agent_lease_timeout,
    )?;
    Ok(DetectionConfig {
        missed_renewals,
        renew_interval,
        suspect_after_renewals,
        agent_heartbeat_timeout: duration_field(
            "agentHeartbeatTimeout",
            raw.agent_heartbeat_timeout.take(),
            d.agent_heartbeat_timeout,
        )?,
        agent_lease_timeout,
        agent_kubelet_corroboration,
    })
}

/// The leader election settings, with client-go's rules between them.
fn parse_leader(
    leader: RawLeader,
    d: LeaderSettings,
) -> Result<LeaderSettings, RemediationConfigError> {
    let lease_name = leader.lease_name.unwrap_or(d.lease_name);
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
        d.lease_duration,
    )?;
    let renew_deadline = duration_field(
        "leaderElection.renewDeadline",
        leader.renew_deadline,
        d.renew_deadline,
    )?;
    let retry_period = period_field(
        "leaderElection.retryPeriod",
        leader.retry_period,
        d.retry_period,
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
    Ok(LeaderSettings {
        lease_name,
        lease_duration,
        renew_deadline,
        retry_period,
    })
}

/// The storm protection settings.
fn parse_storm(
    raw: &mut RawConfig,
    d: &StormConfig,
) -> Result<StormConfig, RemediationConfigError> {
    Ok(StormConfig {
        unhealthy_zone_threshold: fraction_field(
            "unhealthyZoneThreshold",
            raw.unhealthy_zone_threshold,
            d.unhealthy_zone_threshold,
        )?,
        large_cluster_size_threshold: raw
            .large_cluster_size_threshold
            .unwrap_or(d.large_cluster_size_threshold),
        node_fence_rate: rate_field("nodeFenceRate", raw.node_fence_rate, d.node_fence_rate)?,
        secondary_node_fence_rate: rate_field(
            "secondaryNodeFenceRate",
            raw.secondary_node_fence_rate,
            d.secondary_node_fence_rate,
        )?,
        max_unhealthy_fraction: fraction_field(
            "maxUnhealthyFraction",
            raw.max_unhealthy_fraction,
            d.max_unhealthy_fraction,
        )?,
        api_stale_after: duration_field(
            "apiStaleAfter",
            raw.api_stale_after.take(),
            d.api_stale_after,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let a = parse_config(
            "test",
            "agentLeaseTimeout: 12s\nagentKubeletCorroboration: 1.5\n",
        )
        .expect("valid");
        assert_eq!(a.detection.agent_lease_timeout, Duration::from_secs(12));
        assert_eq!(a.detection.agent_kubelet_corroboration, 1.5);
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
            // A loop's period has a floor: 1ns would be a tight loop on the API server.
            ("tickInterval: 1ns", "tickInterval: \"1ns\""),
            ("tickInterval: 99ms", "tickInterval: \"99ms\""),
            (
                "leaderElection: {retryPeriod: 1ns}",
                "leaderElection.retryPeriod: \"1ns\"",
            ),
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
            ("agentLeaseTimeout: 0s", "agentLeaseTimeout: \"0s\""),
            (
                "agentLeaseTimeout: 8",
                "agentLeaseTimeout: invalid duration \"8\"",
            ),
            (
                "agentKubeletCorroboration: 1",
                "agentKubeletCorroboration: \"1\"",
            ),
            (
                "agentKubeletCorroboration: 3",
                "agentKubeletCorroboration: \"3\"",
            ),
            (
                "agentKubeletCorroboration: .nan",
                "agentKubeletCorroboration: \"NaN\"",
            ),
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
}

/// Property tests (docs/testing.md): `cargo test -p node-monitor-core prop`.
#[cfg(test)]
mod prop;
