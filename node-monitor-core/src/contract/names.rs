//! The names node-monitor writes on a Node and reads back: the contract between the node agent
//! (the eviction loop, the shutdown manager, the clean stop and `node-monitor cleanup`) and
//! `node-monitor remediate`. Each is defined here once; both sides use these constants, so a
//! renamed condition or annotation cannot leave one side reading what the other no longer writes.
//!
//! Conditions are `NodeMonitor*`; taints and annotations are `node-monitor.io/*`. The agent
//! re-publishes its conditions at least every 60 s: their `lastHeartbeatTime` is the agent's
//! heartbeat, which remediate reads by [`CONDITION_PREFIX`].
use crate::signals::threshold::NodeConditionType;

/// Prefix of every agent-owned node condition (`NodeMonitorMemoryPressure`, …,
/// [`SHUTTING_DOWN_CONDITION`]). remediate takes the newest `lastHeartbeatTime` among the
/// conditions with this prefix as the agent's heartbeat; `node-monitor cleanup` removes them all.
pub const CONDITION_PREFIX: &str = "NodeMonitor";

/// The pressure conditions the agent publishes, [`CONDITION_PREFIX`] followed by the kubelet's
/// condition type, in the order of [`NodeConditionType::ALL`].
pub const PRESSURE_CONDITIONS: [&str; 3] = [
    "NodeMonitorMemoryPressure",
    "NodeMonitorDiskPressure",
    "NodeMonitorPIDPressure",
];

/// The agent's condition for a kubelet pressure condition (`NodeMonitorMemoryPressure`, …).
pub fn pressure_condition(c: NodeConditionType) -> &'static str {
    match c {
        NodeConditionType::MemoryPressure => PRESSURE_CONDITIONS[0],
        NodeConditionType::DiskPressure => PRESSURE_CONDITIONS[1],
        NodeConditionType::PidPressure => PRESSURE_CONDITIONS[2],
    }
}

/// The agent-owned condition that says the node is shutting down. With reason
/// [`NON_GRACEFUL_SHUTDOWN_REASON`] it is a last gasp (`nodeMonitor.shutdown.lastGasp:
/// condition`).
pub const SHUTTING_DOWN_CONDITION: &str = "NodeMonitorShuttingDown";

/// The reason of [`SHUTTING_DOWN_CONDITION`] when the shutdown bypassed the inhibitor: only this
/// one is a last gasp (a graceful shutdown terminates the pods itself); the condition's
/// `lastTransitionTime` is the moment.
pub const NON_GRACEFUL_SHUTDOWN_REASON: &str = "NonGracefulShutdown";

/// The reason on the agent's conditions after a clean stop (they turn `Unknown`).
pub const STOPPED_REASON: &str = "NodeMonitorStopped";

/// Key prefix of node-monitor's taints (its annotations share it): `node-monitor cleanup`
/// removes every taint with it.
pub const TAINT_PREFIX: &str = "node-monitor.io/";

/// The NoSchedule taints the agent sets under pressure (`nodeMonitor.taintOnPressure`), in the
/// order of [`NodeConditionType::ALL`].
pub const PRESSURE_TAINTS: [&str; 3] = [
    "node-monitor.io/memory-pressure",
    "node-monitor.io/disk-pressure",
    "node-monitor.io/pid-pressure",
];

/// The pressure taint for a condition.
pub fn pressure_taint(c: NodeConditionType) -> &'static str {
    match c {
        NodeConditionType::MemoryPressure => PRESSURE_TAINTS[0],
        NodeConditionType::DiskPressure => PRESSURE_TAINTS[1],
        NodeConditionType::PidPressure => PRESSURE_TAINTS[2],
    }
}

/// The NoSchedule taint set while the node shuts down.
pub const SHUTDOWN_TAINT: &str = "node-monitor.io/shutdown";

/// Set when node-monitor cordoned the node for a shutdown, so the next start (after the reboot)
/// or a cancellation uncordons it; a node cordoned by someone else stays cordoned.
pub const CORDONED_ANNOTATION: &str = "node-monitor.io/cordoned-for-shutdown";

/// The last gasp of a shutdown that bypassed the inhibitor (`nodeMonitor.shutdown.lastGasp:
/// annotation`): JSON whose `time` is the Unix time in seconds of the reboot/power-off call (an
/// RFC 3339 string is accepted too). The agent writes it; remediate reads it as proof the node
/// went down.
pub const LAST_GASP_ANNOTATION: &str = "node-monitor.io/last-gasp";

/// What holds on the node (`crate::guarantees`): JSON, one key per guarantee, `yes`, `no: <why>`
/// or `n/a: <why>`. The agent writes it when it changes; `kubectl node-monitor status` sums it
/// over the nodes.
pub const GUARANTEES_ANNOTATION: &str = "node-monitor.io/guarantees";

/// The audience of the tokens the agents accept on their node API (`--api-token-audience`), and
/// of the ones `kubectl node-monitor` mints: the API server takes such a token for nothing else.
pub const NODE_API_AUDIENCE: &str = "node-monitor";

/// Node annotation that takes a node out of remediation when set to `disabled`.
pub const OPT_OUT_ANNOTATION: &str = "node-monitor.io/remediation";

/// The node agent's liveness Lease is `<AGENT_LEASE_PREFIX><node name>`, in the agent's
/// namespace (coordination.k8s.io/v1, `holderIdentity` the node's name). The agent renews it every
/// few seconds; `node-monitor remediate` finds a silent node running the agent dead from it.
pub const AGENT_LEASE_PREFIX: &str = "node-monitor-agent-";

/// The name of `node`'s agent liveness Lease.
pub fn agent_lease_name(node: &str) -> String {
    format!("{AGENT_LEASE_PREFIX}{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_conditions_carry_the_prefix_remediate_reads_heartbeats_by() {
        for c in NodeConditionType::ALL {
            assert_eq!(
                pressure_condition(c),
                format!("{CONDITION_PREFIX}{}", c.as_str()),
                "{c:?}"
            );
        }
        assert!(SHUTTING_DOWN_CONDITION.starts_with(CONDITION_PREFIX));
        assert!(STOPPED_REASON.starts_with(CONDITION_PREFIX));
    }

    #[test]
    fn taints_carry_the_prefix_cleanup_removes_by() {
        for t in PRESSURE_TAINTS.iter().chain(&[SHUTDOWN_TAINT]) {
            assert!(t.starts_with(TAINT_PREFIX), "{t}");
        }
    }
}
