//! Translates Node and Lease objects into the facts the pure core judges: zone, Ready, the Lease's
//! renewal, the node agent's heartbeat and its last gasp. Malformed values (an unparsable last
//! gasp) are reported and ignored, never trusted.
use std::collections::BTreeMap;

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node};
use tracing::warn;

use node_monitor_core::{
    contract::names::{
        CONDITION_PREFIX, LAST_GASP_ANNOTATION, NON_GRACEFUL_SHUTDOWN_REASON, OPT_OUT_ANNOTATION,
        SHUTTING_DOWN_CONDITION,
    },
    remediation::{
        AgentLeaseFacts, LeaseFacts, NodeFacts, ReadyStatus, WallMicros, ZoneKey,
        liveness::gasp_not_in_future,
    },
};

/// A malformed last gasp: the annotation's value names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "node {node}: annotation {LAST_GASP_ANNOTATION}={value:?} is not the agent's last gasp: JSON with a numeric \"time\" (Unix seconds) and \"verdict\": \"allowed\""
)]
pub struct LastGaspError {
    pub node: String,
    pub value: String,
}

/// Parses the last-gasp annotation as the agent writes it: JSON with the call's `time` (Unix
/// seconds) and the probe's `verdict`, which must be `allowed` (a reboot(2) the kernel would
/// carry out; the agent writes no other). Anything else, an RFC 3339 time alone included, is not
/// a last gasp.
pub fn parse_last_gasp(node: &str, value: &str) -> Result<WallMicros, LastGaspError> {
    let err = || LastGaspError {
        node: node.to_owned(),
        value: value.to_owned(),
    };
    let json: serde_json::Value = serde_json::from_str(value.trim()).map_err(|_| err())?;
    if json.get("verdict").and_then(serde_json::Value::as_str) != Some("allowed") {
        return Err(err());
    }
    let secs = json
        .get("time")
        .and_then(serde_json::Value::as_f64)
        .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e11)
        .ok_or_else(err)?;
    #[expect(
        clippy::cast_possible_truncation,
        reason = "bounded above: below 1e17 microseconds"
    )]
    Ok((secs * 1e6).round() as i64)
}

/// Whether the last gasp dated `gasp` is believed at `wall_now`; a future one is logged.
fn believed(node: &str, gasp: WallMicros, wall_now: WallMicros) -> bool {
    let ok = gasp_not_in_future(gasp, wall_now);
    if !ok {
        warn!(
            node,
            gasp_us = gasp,
            now_us = wall_now,
            "last gasp ignored: dated in the future, beyond the clock skew allowed"
        );
    }
    ok
}

fn labels(node: &Node) -> BTreeMap<String, String> {
    node.metadata.labels.clone().unwrap_or_default()
}

/// Whether `node` is remediated: all of `selector`'s labels match and it has not opted out.
pub fn eligible(node: &Node, selector: &BTreeMap<String, String>) -> bool {
    let l = labels(node);
    let opted_out = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OPT_OUT_ANNOTATION))
        .is_some_and(|v| v == "disabled");
    !opted_out && selector.iter().all(|(k, v)| l.get(k) == Some(v))
}

/// The facts of one node (its Lease may be missing).
/// A last gasp dated later than `wall_now` allows ([`gasp_not_in_future`]) is left out, with a
/// warning.
pub fn node_facts(
    node: &Node,
    lease: Option<&Lease>,
    agent_lease: Option<&Lease>,
    selector: &BTreeMap<String, String>,
    wall_now: WallMicros,
) -> NodeFacts {
    let name = node.metadata.name.clone().unwrap_or_default();
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let ready_condition = conditions.iter().find(|c| c.type_ == "Ready");
    let ready = match ready_condition.map(|c| c.status.as_str()) {
        Some("True") => ReadyStatus::True,
        Some("False") => ReadyStatus::False,
        _ => ReadyStatus::Unknown,
    };
    let ready_heartbeat = ready_condition
        .filter(|c| c.status == "True")
        .and_then(|c| c.last_heartbeat_time.as_ref())
        .map(|t| t.0.as_microsecond());
    let boot_id = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .filter(|b| !b.is_empty());
    let agent_heartbeat = conditions
        .iter()
        .filter(|c| c.type_.starts_with(CONDITION_PREFIX))
        .filter_map(|c| c.last_heartbeat_time.as_ref().map(|t| t.0.as_microsecond()))
        .max();
    let gasp_condition = conditions
        .iter()
        .find(|c| {
            c.type_ == SHUTTING_DOWN_CONDITION
                && c.status == "True"
                && c.reason.as_deref() == Some(NON_GRACEFUL_SHUTDOWN_REASON)
        })
        .and_then(|c| {
            c.last_transition_time
                .as_ref()
                .or(c.last_heartbeat_time.as_ref())
                .map(|t| t.0.as_microsecond())
        });
    let gasp_annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(LAST_GASP_ANNOTATION))
        .and_then(|v| match parse_last_gasp(&name, v) {
            Ok(t) => Some(t),
            Err(e) => {
                warn!(error = %e, "last gasp ignored");
                None
            }
        });
    let lease = lease.map(|l| {
        let spec = l.spec.as_ref();
        LeaseFacts {
            renew_time: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.as_microsecond()),
            duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
        }
    });
    let agent_lease = agent_lease.map(|l| {
        let spec = l.spec.as_ref();
        AgentLeaseFacts {
            renew_time: spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.as_microsecond()),
            holder: spec.and_then(|s| s.holder_identity.clone()),
        }
    });
    NodeFacts {
        agent_lease,
        zone: ZoneKey::from_labels(&labels(node)),
        ready,
        lease,
        agent_heartbeat,
        last_gasp: gasp_condition
            .max(gasp_annotation)
            .filter(|&gasp| believed(&name, gasp, wall_now)),
        eligible: eligible(node, selector),
        boot_id,
        ready_heartbeat,
        name,
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::{
            coordination::v1::LeaseSpec,
            core::v1::{NodeCondition, NodeStatus, NodeSystemInfo},
        },
        apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time},
    };

    use k8s_openapi::jiff::Timestamp;

    use super::*;

    /// The controller's clock in the tests: well after every time they write.
    const NOW_US: WallMicros = 1_800_000_000_000_000;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).expect("valid")
    }

    fn cond(type_: &str, status: &str, reason: &str, at: i64) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some(reason.into()),
            last_heartbeat_time: Some(Time(ts(at))),
            last_transition_time: Some(Time(ts(at))),
            ..NodeCondition::default()
        }
    }

    fn node(conditions: Vec<NodeCondition>, annotations: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n1".into()),
                labels: Some(BTreeMap::from([
                    ("topology.kubernetes.io/zone".to_owned(), "a".to_owned()),
                    ("role".to_owned(), "worker".to_owned()),
                ])),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(conditions),
                node_info: Some(NodeSystemInfo {
                    boot_id: "b1".into(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    #[test]
    fn last_gasp_is_the_agents_json_with_an_allowed_verdict() {
        let cases = [
            (
                r#"{"time":1700000000.250,"cmd":"POWER_OFF","comm":"kill","pid":1,"verdict":"allowed"}"#,
                Some(1_700_000_000_250_000),
            ),
            // Only a reboot(2) the kernel carries out is a last gasp.
            (
                r#"{"time":1700000000.250,"cmd":"POWER_OFF","verdict":"refused_cap"}"#,
                None,
            ),
            (r#"{"time":1700000000.250,"cmd":"POWER_OFF"}"#, None),
            ("2023-11-14T22:13:20Z", None),
            (r#"{"cmd":"POWER_OFF"}"#, None),
            (r#"{"time":"soon"}"#, None),
            ("yesterday", None),
        ];
        for (value, want) in cases {
            assert_eq!(parse_last_gasp("n1", value).ok(), want, "{value}");
        }
        let err = parse_last_gasp("n1", "yesterday").expect_err("bad");
        assert!(err.to_string().contains("yesterday") && err.to_string().contains("n1"));
    }

    #[test]
    fn facts_from_node_and_lease() {
        let n = node(
            vec![
                cond("Ready", "True", "KubeletReady", 10),
                cond(
                    "NodeMonitorMemoryPressure",
                    "False",
                    "NodeMonitorNoMemoryPressure",
                    50,
                ),
                cond("NodeMonitorShuttingDown", "True", "NonGracefulShutdown", 60),
            ],
            &[],
        );
        let lease = Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(ts(55))),
                lease_duration_seconds: Some(40),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        let agent = Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(ts(58))),
                holder_identity: Some("n1".to_owned()),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        let f = node_facts(&n, Some(&lease), Some(&agent), &BTreeMap::new(), NOW_US);
        assert_eq!(
            f.agent_lease,
            Some(AgentLeaseFacts {
                renew_time: Some(58_000_000),
                holder: Some("n1".to_owned()),
            })
        );
        assert_eq!(f.name, "n1");
        assert_eq!(f.zone.zone, "a");
        assert_eq!(f.ready, ReadyStatus::True);
        assert_eq!(f.ready_heartbeat, Some(10_000_000));
        assert_eq!(f.boot_id.as_deref(), Some("b1"));
        assert_eq!(f.agent_heartbeat, Some(60_000_000));
        assert_eq!(f.last_gasp, Some(60_000_000));
        assert_eq!(f.lease.and_then(|l| l.renew_time), Some(55_000_000));
        assert!(f.eligible);
    }

    #[test]
    fn a_last_gasp_dated_in_the_future_is_left_out() {
        let n = node(
            vec![cond(
                "NodeMonitorShuttingDown",
                "True",
                "NonGracefulShutdown",
                60,
            )],
            &[],
        );
        // At 60 s (the gasp's time) and 60 s of skew later: believed.
        for now in [60_000_000, 120_000_000] {
            let f = node_facts(&n, None, None, &BTreeMap::new(), now);
            assert_eq!(f.last_gasp, Some(60_000_000), "at {now}");
        }
        // More than the skew before it (60 s and 1 µs): a gasp from the future, left out.
        let f = node_facts(&n, None, None, &BTreeMap::new(), -1);
        assert_eq!(f.last_gasp, None);
    }

    #[test]
    fn a_graceful_shutdown_is_no_last_gasp() {
        let n = node(
            vec![cond(
                "NodeMonitorShuttingDown",
                "True",
                "GracefulShutdown",
                60,
            )],
            &[],
        );
        let f = node_facts(&n, None, None, &BTreeMap::new(), NOW_US);
        assert_eq!(f.agent_lease, None);
        assert_eq!(f.last_gasp, None);
        assert_eq!(f.ready, ReadyStatus::Unknown);
        assert_eq!(f.lease, None);
    }

    #[test]
    fn eligibility_by_selector_and_opt_out() {
        let sel = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let n = node(vec![], &[]);
        assert!(eligible(&n, &sel(&[("role", "worker")])));
        assert!(!eligible(&n, &sel(&[("role", "db")])));
        let out = node(vec![], &[(OPT_OUT_ANNOTATION, "disabled")]);
        assert!(!eligible(&out, &sel(&[])));
    }
}
