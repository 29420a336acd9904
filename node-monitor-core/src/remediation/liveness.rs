//! Liveness: whether a node is alive, suspect or dead, judged from when its Lease and its
//! agent's heartbeat last changed on the controller's clock, and from its agent's last gasp.
use std::{collections::BTreeMap, time::Duration};

use super::{DetectionConfig, WallMicros, ZoneKey, mul_f64_saturating};
#[cfg(doc)]
use crate::contract::names::{
    LAST_GASP_ANNOTATION, NON_GRACEFUL_SHUTDOWN_REASON, SHUTTING_DOWN_CONDITION,
};
use crate::units::clock::Timestamp;

/// The kubelet renews its Lease every `nodeLeaseDurationSeconds × 0.25`
/// (`nodeLeaseRenewIntervalFraction`, pkg/kubelet/kubelet.go).
pub const NODE_LEASE_RENEW_INTERVAL_FRACTION: f64 = 0.25;
/// The kubelet's default `nodeLeaseDurationSeconds`, used when a Lease does not say.
pub const DEFAULT_LEASE_DURATION_SECONDS: i32 = 40;

/// The node's `Ready` condition as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadyStatus {
    /// `True`: the kubelet reports the node Ready.
    True,
    /// `False`: the kubelet reports the node not Ready.
    False,
    /// `Unknown`, or no `Ready` condition at all.
    Unknown,
}

/// A node's Lease as the API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseFacts {
    /// `spec.renewTime`, on the node's clock.
    pub renew_time: Option<WallMicros>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: Option<i32>,
}

/// The node agent's liveness Lease (`node-monitor-agent-<node>` in the agent's namespace, written
/// only by the agent's ServiceAccount for its own node): renewed every few seconds, so that a
/// node running the agent that goes silent is found dead in seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLeaseFacts {
    /// `spec.renewTime`, on the node's clock.
    pub renew_time: Option<WallMicros>,
    /// `spec.holderIdentity`: must name the node, or the record is ignored.
    pub holder: Option<String>,
}

/// What the controller knows about one node at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// The Node's name.
    pub name: String,
    /// Its zone, by its topology labels.
    pub zone: ZoneKey,
    /// Its `Ready` condition.
    pub ready: ReadyStatus,
    /// Its Lease in `kube-node-lease`; `None` when it has none.
    pub lease: Option<LeaseFacts>,
    /// The newest `lastHeartbeatTime` of the node agent's `NodeMonitor*` conditions.
    pub agent_heartbeat: Option<WallMicros>,
    /// The node agent's liveness Lease, when there is one.
    pub agent_lease: Option<AgentLeaseFacts>,
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
    /// The Lease was renewed within the detection window.
    LeaseRenewing,
    /// The node agent's heartbeat changed within `agentHeartbeatTimeout`, or its liveness Lease
    /// within `agentLeaseTimeout`.
    AgentReporting,
    /// No Lease: nothing to judge by, so never dead.
    NoLease,
}

/// The evidence a node is dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathEvidence {
    /// The Lease missed `missed` renewals of `renew_interval` (observed silence `silent`).
    LeaseExpired {
        /// How long the Lease has not changed, on the controller's clock.
        silent: Duration,
        /// The renewal interval it was judged by.
        renew_interval: Duration,
        /// The renewals missed (`missedRenewals`).
        missed: u32,
    },
    /// The node agent's liveness Lease stopped changing for `agentLeaseTimeout` and the
    /// kubelet's Lease corroborates: it missed a renewal too (silent for
    /// `agentKubeletCorroboration` of its intervals).
    AgentSilent {
        /// How long the agent's Lease has not changed, on the controller's clock.
        agent_silent: Duration,
        /// How long the kubelet's Lease has not changed.
        lease_silent: Duration,
    },
    /// The node agent announced an inhibitor-bypassing power-off at `at`, and neither the
    /// kubelet nor the agent has written since.
    LastGasp {
        /// When the node said it went down (node clock).
        at: WallMicros,
    },
}

impl DeathEvidence {
    /// A sentence for Events and logs, kept with the operation as its evidence.
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
            Self::AgentSilent {
                agent_silent,
                lease_silent,
            } => format!(
                "node agent's liveness Lease not renewed for {:.1}s, and the kubelet's Lease not for {:.1}s",
                agent_silent.as_secs_f64(),
                lease_silent.as_secs_f64()
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
    /// Alive, and why.
    Alive(AliveBecause),
    /// Silent for more than `suspectAfterRenewals` intervals: unhealthy, not yet dead.
    Suspect {
        /// How long the Lease has not changed.
        silent: Duration,
    },
    /// Dead, and the evidence.
    Dead(DeathEvidence),
}

impl Liveness {
    /// Counted as unhealthy by storm protection.
    pub fn is_unhealthy(&self) -> bool {
        !matches!(self, Liveness::Alive(_))
    }

    /// Dead: a fencing candidate.
    pub fn is_dead(&self) -> bool {
        matches!(self, Liveness::Dead(_))
    }

    /// The `state` label of `node_monitor_remediation_nodes`: `alive`, `suspect` or `dead`.
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
    agent_lease: Option<WallMicros>,
    agent_lease_changed: Timestamp,
}

/// Remembers when each node's Lease and agent heartbeat last changed, on the controller's own
/// clock: like the node lifecycle controller's `probeTimestamp`, this keeps node clock skew out
/// of the decision. A node first seen counts as just renewed ("Missing timestamp for Node.
/// Assuming now"), so a restarted controller waits a full window before calling anything dead.
#[derive(Debug, Clone, Default)]
pub struct LivenessTracker {
    seen: BTreeMap<String, Seen>,
}

/// The longest `leaseDurationSeconds` believed: a node's Lease is written by that node, and a
/// duration of years would keep a dead node "alive" (its workload never released) for as long.
/// An hour is far above any kubelet's (40 s by default).
pub const MAX_LEASE_DURATION_SECONDS: i32 = 3600;

/// The renewal interval for a Lease: the configured one, else the kubelet's fraction of its
/// duration (at most [`MAX_LEASE_DURATION_SECONDS`]).
pub fn renew_interval(cfg: &DetectionConfig, lease: &LeaseFacts) -> Duration {
    cfg.renew_interval.unwrap_or_else(|| {
        let secs = lease
            .duration_seconds
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_LEASE_DURATION_SECONDS)
            .min(MAX_LEASE_DURATION_SECONDS);
        Duration::from_secs_f64(f64::from(secs) * NODE_LEASE_RENEW_INTERVAL_FRACTION)
    })
}

/// How far ahead of the controller's clock a last gasp may be dated: the clock skew between a
/// node and the controller. A gasp dated further ahead is not believed: it would stand against
/// every renewal until that time, keeping a live node "dead" (and fenced again) for as long.
pub const GASP_MAX_AHEAD: Duration = Duration::from_secs(60);

/// Whether a last gasp dated `gasp` (the node's clock) can have happened by `wall_now` (the
/// controller's clock, both in µs since the epoch), within [`GASP_MAX_AHEAD`] of skew.
pub fn gasp_not_in_future(gasp: WallMicros, wall_now: WallMicros) -> bool {
    let ahead = i64::try_from(GASP_MAX_AHEAD.as_micros()).unwrap_or(i64::MAX);
    gasp <= wall_now.saturating_add(ahead)
}

/// Whether a last gasp at `gasp` is the latest thing the node said: neither its Lease nor its
/// agent's heartbeat is newer (both written by the node's clock, like the gasp). The agent's
/// liveness Lease is not asked: it renews every few seconds, and a renewal in the moments
/// between the gasp and the power going must not void the gasp; a node that really came back
/// renews its kubelet's Lease.
pub fn last_gasp_stands(gasp: WallMicros, facts: &NodeFacts) -> bool {
    let lease_older = facts
        .lease
        .and_then(|l| l.renew_time)
        .is_none_or(|r| r <= gasp);
    let agent_older = facts.agent_heartbeat.is_none_or(|h| h <= gasp);
    lease_older && agent_older
}

/// The agent's liveness Lease, when it is the node's own: held by the node's name. A record held
/// by anything else (a forgery, or a copy left by another node) is ignored.
pub fn own_agent_lease(facts: &NodeFacts) -> Option<&AgentLeaseFacts> {
    facts
        .agent_lease
        .as_ref()
        .filter(|a| a.holder.as_deref() == Some(facts.name.as_str()))
}

fn agent_lease_renewal(facts: &NodeFacts) -> Option<WallMicros> {
    own_agent_lease(facts).and_then(|a| a.renew_time)
}

impl LivenessTracker {
    /// A tracker that has seen no node yet.
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
            let agent_lease_value = agent_lease_renewal(n);
            let seen = self.seen.entry(n.name.clone()).or_insert_with(|| Seen {
                lease: lease_value,
                lease_changed: now,
                heartbeat: n.agent_heartbeat,
                heartbeat_changed: now,
                agent_lease: agent_lease_value,
                agent_lease_changed: now,
            });
            if seen.agent_lease != agent_lease_value {
                seen.agent_lease = agent_lease_value;
                seen.agent_lease_changed = now;
            }
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
    if let Some(judged) = judge_by_agent_lease(n, seen, now, cfg) {
        return judged;
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

/// The fast rule for nodes running the agent: its liveness Lease, renewed every few seconds,
/// keeps the node alive while it changes; once it has been silent for `agentLeaseTimeout` the
/// node is dead only if the kubelet's Lease corroborates (silent for more than one of its
/// renewal intervals: a live kubelet renews within one). An agent that stopped while its kubelet
/// renews (an agent crash, a rollout, a broken agent connection) decides nothing: the node is
/// judged by the other rules. `None`: no rule of the agent Lease applies.
fn judge_by_agent_lease(
    n: &NodeFacts,
    seen: &Seen,
    now: Timestamp,
    cfg: &DetectionConfig,
) -> Option<Liveness> {
    own_agent_lease(n)?;
    let agent_silent = now.saturating_since(seen.agent_lease_changed);
    if agent_silent < cfg.agent_lease_timeout {
        return Some(Liveness::Alive(AliveBecause::AgentReporting));
    }
    let lease = n.lease?;
    let lease_silent = now.saturating_since(seen.lease_changed);
    let corroborated = lease_silent
        >= mul_f64_saturating(renew_interval(cfg, &lease), cfg.agent_kubelet_corroboration);
    corroborated.then_some(Liveness::Dead(DeathEvidence::AgentSilent {
        agent_silent,
        lease_silent,
    }))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remediation::{test_support::*, *};

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
            (None, Some(-5), Duration::from_secs(10)),
            // A node's own Lease cannot make it undying: an hour at most.
            (None, Some(i32::MAX), Duration::from_secs(900)),
            (None, Some(3600), Duration::from_secs(900)),
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
    fn a_gasp_dated_in_the_future_is_not_believed() {
        let now = 1_700_000_000_000_000;
        let s = 1_000_000;
        // (gasp, believed)
        let cases = [
            (now - 3600 * s, true),
            (now, true),
            (now + 59 * s, true),
            (now + 60 * s, true),
            (now + 61 * s, false),
            (now + 86_400 * s, false),
            (i64::MAX, false),
        ];
        for (gasp, want) in cases {
            assert_eq!(gasp_not_in_future(gasp, now), want, "gasp {gasp}");
        }
        assert!(gasp_not_in_future(i64::MAX, i64::MAX), "no overflow");
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

    /// What the node writes, second by second, in the agent Lease tables.
    #[derive(Clone, Copy)]
    struct Node {
        /// The kubelet renews at 2 s, 12 s, 22 s… up to and including this second.
        kubelet_until: Option<u64>,
        /// The agent renews every 5 s (0, 5, 10…) up to and including this second.
        agent_until: Option<u64>,
        /// The agent Lease's holderIdentity.
        holder: &'static str,
        /// Added to every agent renewTime (the node clock's skew, in seconds).
        agent_skew: i64,
    }

    const SECOND: i64 = 1_000_000;

    /// Feeds the tracker one observation a second up to `until` and returns the last judgement.
    fn agent_lease_run(node: Node, until: u64, fresh_from: u64) -> Liveness {
        let cfg = detection(); // agent Lease 8 s; kubelet corroborates after 1.2 × 10 s = 12 s
        let mut t = LivenessTracker::new();
        let mut kubelet = 0i64;
        let mut agent = None;
        let mut last = Liveness::Alive(AliveBecause::NoLease);
        for secs in 0..=until {
            let s = i64::try_from(secs).expect("small");
            if secs % 10 == 2 && node.kubelet_until.is_none_or(|u| secs <= u) {
                kubelet = s * SECOND;
            }
            if secs % 5 == 0 && node.agent_until.is_none_or(|u| secs <= u) {
                agent = Some((s + node.agent_skew) * SECOND);
            }
            let mut f = facts("n", Some(kubelet));
            f.agent_lease = Some(AgentLeaseFacts {
                renew_time: agent,
                holder: Some(node.holder.to_owned()),
            });
            last = t.observe(&[f], Timestamp::from_secs(secs), &cfg, secs >= fresh_from)["n"];
        }
        last
    }

    #[test]
    #[expect(clippy::too_many_lines, reason = "one table of cases")]
    fn agent_lease_makes_a_silent_node_dead_in_seconds_only_when_the_kubelet_corroborates() {
        let node = |kubelet_until, agent_until| Node {
            kubelet_until,
            agent_until,
            holder: "n",
            agent_skew: 0,
        };
        let dead_agent = |a: u64, k: u64| {
            Liveness::Dead(DeathEvidence::AgentSilent {
                agent_silent: Duration::from_secs(a),
                lease_silent: Duration::from_secs(k),
            })
        };
        let alive = |why| Liveness::Alive(why);
        // (what, node, at second, the Lease view confirmed from second, expected)
        let cases: [(&str, Node, u64, u64, Liveness); 16] = [
            // The node dies at 22 s, just after both renewed: the agent's silence alone is not
            // enough while the kubelet's could still be a gap between renewals...
            (
                "both renewing",
                node(None, None),
                60,
                0,
                alive(AliveBecause::AgentReporting),
            ),
            (
                "died at 22 s: agent 7 s silent",
                node(Some(22), Some(20)),
                27,
                0,
                alive(AliveBecause::AgentReporting),
            ),
            (
                "died at 22 s: agent 8 s, kubelet 6 s",
                node(Some(22), Some(20)),
                28,
                0,
                alive(AliveBecause::LeaseRenewing),
            ),
            (
                "died at 22 s: kubelet 11 s",
                node(Some(22), Some(20)),
                33,
                0,
                alive(AliveBecause::LeaseRenewing),
            ),
            // ...until the kubelet missed its renewal too: dead 12 s after its last one.
            (
                "died at 22 s: kubelet 12 s",
                node(Some(22), Some(20)),
                34,
                0,
                dead_agent(14, 12),
            ),
            // Dies at 30 s, the kubelet 8 s after its renewal: dead when the agent is 8 s silent.
            (
                "died at 30 s",
                node(Some(22), Some(30)),
                38,
                0,
                dead_agent(8, 16),
            ),
            (
                "died at 30 s, a second earlier",
                node(Some(22), Some(30)),
                37,
                0,
                alive(AliveBecause::AgentReporting),
            ),
            // Partition of the agent alone (crashed, rolled out, cut from the API): the kubelet
            // renews, the node is alive whatever the agent's silence.
            (
                "agent stopped, kubelet renewing",
                node(None, Some(20)),
                200,
                0,
                alive(AliveBecause::LeaseRenewing),
            ),
            // The kubelet is down, the agent renews: alive.
            (
                "kubelet stopped, agent renewing",
                node(Some(22), None),
                200,
                0,
                alive(AliveBecause::AgentReporting),
            ),
            // Both silent long enough: the fast rule gives the evidence.
            (
                "both silent for long",
                node(Some(22), Some(20)),
                200,
                0,
                dead_agent(180, 178),
            ),
            // A Lease view not confirmed current judges nothing dead.
            (
                "stale Lease view",
                node(Some(22), Some(30)),
                38,
                39,
                Liveness::Suspect {
                    silent: Duration::from_secs(16),
                },
            ),
            // A skewed node clock: only changes count. Decades behind and renewing: alive.
            (
                "agent clock far behind",
                Node {
                    agent_skew: -1_000_000_000,
                    ..node(None, None)
                },
                60,
                0,
                alive(AliveBecause::AgentReporting),
            ),
            // Far ahead and stopped: a future renewTime keeps nothing alive.
            (
                "agent clock far ahead, stopped",
                Node {
                    agent_skew: 1_000_000_000,
                    ..node(Some(22), Some(30))
                },
                38,
                0,
                dead_agent(8, 16),
            ),
            // A record held by another name is ignored: it keeps no node alive...
            (
                "forged record renewing on a dead node",
                Node {
                    holder: "other",
                    ..node(Some(22), None)
                },
                52,
                0,
                Liveness::Dead(DeathEvidence::LeaseExpired {
                    silent: Duration::from_secs(30),
                    renew_interval: Duration::from_secs(10),
                    missed: 3,
                }),
            ),
            // ...and makes no node dead early.
            (
                "forged record stopped",
                Node {
                    holder: "other",
                    ..node(Some(22), Some(20))
                },
                40,
                0,
                Liveness::Suspect {
                    silent: Duration::from_secs(18),
                },
            ),
            (
                "forged record, no holder",
                Node {
                    holder: "",
                    ..node(Some(22), Some(20))
                },
                34,
                0,
                alive(AliveBecause::LeaseRenewing),
            ),
        ];
        for (what, n, at, fresh_from, want) in cases {
            assert_eq!(agent_lease_run(n, at, fresh_from), want, "{what}");
        }
    }

    #[test]
    fn agent_lease_rules_at_their_edges() {
        let cfg = detection();
        let agent = |r| AgentLeaseFacts {
            renew_time: Some(r),
            holder: Some("n".to_owned()),
        };
        // A restarted controller counts the silent agent Lease as just renewed.
        let mut f = facts("n", Some(5));
        f.agent_lease = Some(agent(7));
        let mut t = LivenessTracker::new();
        let first = t.observe(
            std::slice::from_ref(&f),
            Timestamp::from_secs(1_000),
            &cfg,
            true,
        );
        assert_eq!(first["n"], Liveness::Alive(AliveBecause::AgentReporting));
        let later = t.observe(
            std::slice::from_ref(&f),
            Timestamp::from_secs(1_012),
            &cfg,
            true,
        );
        assert!(later["n"].is_dead(), "{later:?}");
        // No kubelet Lease: nothing corroborates, never dead by the agent Lease.
        f.lease = None;
        let mut t = LivenessTracker::new();
        t.observe(std::slice::from_ref(&f), Timestamp::ZERO, &cfg, true);
        let got = t.observe(
            std::slice::from_ref(&f),
            Timestamp::from_secs(500),
            &cfg,
            true,
        );
        assert_eq!(got["n"], Liveness::Alive(AliveBecause::NoLease));
        // A liveness Lease renewed after the gasp (in the moments before the power went) does not
        // void it; the kubelet's renewal after it does.
        let mut g = facts("n", Some(100));
        g.agent_lease = Some(agent(700));
        g.last_gasp = Some(600);
        assert!(last_gasp_stands(600, &g));
        let mut t = LivenessTracker::new();
        let got = t.observe(std::slice::from_ref(&g), Timestamp::ZERO, &cfg, true);
        assert_eq!(
            got["n"],
            Liveness::Dead(DeathEvidence::LastGasp { at: 600 })
        );
        g.lease = Some(LeaseFacts {
            renew_time: Some(700),
            duration_seconds: Some(40),
        });
        assert!(!last_gasp_stands(600, &g));
        assert!(
            DeathEvidence::AgentSilent {
                agent_silent: Duration::from_secs(8),
                lease_silent: Duration::from_secs(12),
            }
            .describe()
            .contains("8.0s")
        );
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
                agent_lease_timeout: Duration::MAX,
                agent_kubelet_corroboration: 1e300,
            },
            DetectionConfig {
                missed_renewals: u32::MAX,
                renew_interval: None,
                suspect_after_renewals: f64::MAX,
                agent_heartbeat_timeout: Duration::ZERO,
                agent_lease_timeout: Duration::ZERO,
                agent_kubelet_corroboration: f64::NAN,
            },
            DetectionConfig {
                missed_renewals: 1,
                renew_interval: Some(Duration::MAX),
                suspect_after_renewals: 0.5,
                agent_heartbeat_timeout: Duration::ZERO,
                agent_lease_timeout: Duration::from_secs(1),
                agent_kubelet_corroboration: f64::INFINITY,
            },
        ];
        for cfg in cfgs {
            for secs in [i32::MAX, 1, 0, -5] {
                let mut t = LivenessTracker::new();
                let mut f = facts("n", Some(1));
                f.lease = Some(lease(secs));
                f.agent_lease = Some(AgentLeaseFacts {
                    renew_time: Some(1),
                    holder: Some("n".to_owned()),
                });
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
