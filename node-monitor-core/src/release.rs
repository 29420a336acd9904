//! What node-monitor takes back from its node: at a clean stop of the agent ([`Release::Stop`]),
//! and for `node-monitor cleanup` after an agent that died without a clean stop
//! ([`Release::Cleanup`]). The node in, the writes out; no I/O.
//!
//! At a stop the agent behaves like the node lifecycle controller does for a kubelet that went
//! silent: its own conditions turn `Unknown` (reason [`STOPPED_REASON`]) instead of keeping a
//! `True` nobody maintains, and its pressure taints go, so no pod is kept off a node for ever by
//! an agent that is no longer there. `lastHeartbeatTime` is left as it was: a stopped agent sends
//! no heartbeat. The marks of a shutdown in progress (or of a last gasp) stay: the node is going
//! down, and the next start clears them.
use k8s_openapi::api::core::v1::Node;

use crate::contract::names::{
    CONDITION_PREFIX, CORDONED_ANNOTATION, GUARANTEES_ANNOTATION, LAST_GASP_ANNOTATION,
    PRESSURE_TAINTS, SHUTDOWN_TAINT, SHUTTING_DOWN_CONDITION, STOPPED_REASON, TAINT_PREFIX,
};

/// The message that goes with [`STOPPED_REASON`].
pub const STOPPED_MESSAGE: &str =
    "node-monitor stopped on this node; this condition is no longer maintained";

/// Which release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The agent stops cleanly (SIGTERM/SIGINT). `shutting_down`: the shutdown manager is in the
    /// middle of a graceful node shutdown.
    Stop {
        /// A graceful node shutdown is in progress.
        shutting_down: bool,
    },
    /// `node-monitor cleanup`: every node-monitor mark goes.
    Cleanup,
}

/// A taint to remove, by key and effect.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TaintRef {
    /// The taint's key (`node-monitor.io/…`).
    pub key: String,
    /// The taint's effect (`NoSchedule`, …).
    pub effect: String,
}

/// The writes a release makes on the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleasePlan {
    /// Taints to remove.
    pub remove_taints: Vec<TaintRef>,
    /// Conditions to set to `Unknown` with [`STOPPED_REASON`].
    pub unknown_conditions: Vec<String>,
    /// Conditions to delete.
    pub remove_conditions: Vec<String>,
    /// Annotations to delete.
    pub remove_annotations: Vec<String>,
    /// Set `spec.unschedulable` to false: node-monitor's own cordon ([`CORDONED_ANNOTATION`]).
    pub uncordon: bool,
}

impl ReleasePlan {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.remove_taints.is_empty()
            && self.unknown_conditions.is_empty()
            && self.remove_conditions.is_empty()
            && self.remove_annotations.is_empty()
            && !self.uncordon
    }

    /// Conditions to write (the node's status).
    pub fn has_conditions(&self) -> bool {
        !self.unknown_conditions.is_empty() || !self.remove_conditions.is_empty()
    }

    /// Something to write on the node object (`metadata`/`spec`, not `status`).
    pub fn touches_spec(&self) -> bool {
        !self.remove_taints.is_empty() || !self.remove_annotations.is_empty() || self.uncordon
    }

    /// One line per write, for logs and the cleanup command's output.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for t in &self.remove_taints {
            out.push(format!("remove taint {}:{}", t.key, t.effect));
        }
        for c in &self.unknown_conditions {
            out.push(format!("set condition {c} to Unknown ({STOPPED_REASON})"));
        }
        for c in &self.remove_conditions {
            out.push(format!("remove condition {c}"));
        }
        if self.uncordon {
            out.push("uncordon (node-monitor's own cordon)".to_owned());
        }
        for a in &self.remove_annotations {
            out.push(format!("remove annotation {a}"));
        }
        out
    }
}

/// What `release` writes on `node`.
///
/// [`Release::Stop`]: the pressure taints go; every `NodeMonitor*` condition that is not already
/// `Unknown` turns `Unknown`; node-monitor's own cordon is undone. A shutdown in progress — the
/// shutdown manager says so, or the node's `NodeMonitorShuttingDown` is `True` (a graceful
/// shutdown, or the last gasp of one that bypassed the inhibitor) — keeps its marks: the
/// shutdown taint, that condition, the cordon; the last-gasp annotation is never touched.
///
/// [`Release::Cleanup`]: every `node-monitor.io/*` taint, every `NodeMonitor*` condition, its
/// three annotations (the cordon's, the last gasp, the guarantees), and node-monitor's cordon (a cordon without [`CORDONED_ANNOTATION`] is someone
/// else's and stays).
pub fn release_plan(node: &Node, release: Release) -> ReleasePlan {
    let taints = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default();
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let annotations = node.metadata.annotations.as_ref();
    let has_annotation = |k: &str| annotations.is_some_and(|a| a.contains_key(k));
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let mut plan = ReleasePlan::default();
    match release {
        Release::Stop { shutting_down } => {
            let shutting_down = shutting_down
                || conditions
                    .iter()
                    .any(|c| c.type_ == SHUTTING_DOWN_CONDITION && c.status == "True");
            plan.remove_taints = taints
                .iter()
                .filter(|t| {
                    PRESSURE_TAINTS.contains(&t.key.as_str())
                        || (!shutting_down && t.key == SHUTDOWN_TAINT)
                })
                .map(|t| TaintRef {
                    key: t.key.clone(),
                    effect: t.effect.clone(),
                })
                .collect();
            plan.unknown_conditions = conditions
                .iter()
                .filter(|c| c.type_.starts_with(CONDITION_PREFIX) && c.status != "Unknown")
                .filter(|c| !(shutting_down && c.type_ == SHUTTING_DOWN_CONDITION))
                .map(|c| c.type_.clone())
                .collect();
            if !shutting_down && has_annotation(CORDONED_ANNOTATION) {
                plan.uncordon = unschedulable;
                plan.remove_annotations.push(CORDONED_ANNOTATION.to_owned());
            }
        }
        Release::Cleanup => {
            plan.remove_taints = taints
                .iter()
                .filter(|t| t.key.starts_with(TAINT_PREFIX))
                .map(|t| TaintRef {
                    key: t.key.clone(),
                    effect: t.effect.clone(),
                })
                .collect();
            plan.remove_conditions = conditions
                .iter()
                .filter(|c| c.type_.starts_with(CONDITION_PREFIX))
                .map(|c| c.type_.clone())
                .collect();
            plan.uncordon = unschedulable && has_annotation(CORDONED_ANNOTATION);
            plan.remove_annotations = [
                CORDONED_ANNOTATION,
                LAST_GASP_ANNOTATION,
                GUARANTEES_ANNOTATION,
            ]
            .into_iter()
            .filter(|a| has_annotation(a))
            .map(str::to_owned)
            .collect();
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::{
        api::core::v1::{NodeCondition, NodeSpec, NodeStatus, Taint},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

    use super::*;

    const MEM: &str = "node-monitor.io/memory-pressure";
    const DISK: &str = "node-monitor.io/disk-pressure";
    const FOREIGN_TAINT: &str = "dedicated";
    const OOS: &str = "node.kubernetes.io/out-of-service";

    /// A node with these taints (key, effect), conditions (type, status), annotations and cordon.
    fn node(
        taints: &[(&str, &str)],
        conditions: &[(&str, &str)],
        annotations: &[&str],
        unschedulable: bool,
    ) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|a| ((*a).to_owned(), "x".to_owned()))
                        .chain([(
                            "node-monitor.io/remediation".to_owned(),
                            "disabled".to_owned(),
                        )])
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(NodeSpec {
                taints: Some(
                    taints
                        .iter()
                        .map(|(k, e)| Taint {
                            key: (*k).into(),
                            effect: (*e).into(),
                            ..Taint::default()
                        })
                        .collect(),
                ),
                unschedulable: Some(unschedulable),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s)| NodeCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            ..NodeCondition::default()
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        }
    }

    fn taints(keys: &[(&str, &str)]) -> Vec<TaintRef> {
        keys.iter()
            .map(|(k, e)| TaintRef {
                key: (*k).into(),
                effect: (*e).into(),
            })
            .collect()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    struct StopCase {
        name: &'static str,
        node: Node,
        shutting_down: bool,
        want: ReleasePlan,
    }

    /// Nodes with pressure marks, as a stop finds them, with what it takes back.
    fn stop_cases_with_pressure() -> Vec<StopCase> {
        let busy_taints: &[(&str, &str)] = &[
            (MEM, "NoSchedule"),
            (FOREIGN_TAINT, "NoSchedule"),
            (DISK, "NoSchedule"),
            (OOS, "NoExecute"),
        ];
        let pressure_conditions: &[(&str, &str)] = &[
            ("Ready", "True"),
            ("MemoryPressure", "False"),
            ("NodeMonitorMemoryPressure", "True"),
            ("NodeMonitorDiskPressure", "False"),
            ("NodeMonitorPIDPressure", "Unknown"),
            ("NodeMonitorShuttingDown", "False"),
        ];
        vec![
            StopCase {
                name: "pressure taints go, conditions turn Unknown, foreign marks stay",
                node: node(busy_taints, pressure_conditions, &[], false),
                shutting_down: false,
                want: ReleasePlan {
                    remove_taints: taints(&[(MEM, "NoSchedule"), (DISK, "NoSchedule")]),
                    unknown_conditions: strings(&[
                        "NodeMonitorMemoryPressure",
                        "NodeMonitorDiskPressure",
                        "NodeMonitorShuttingDown",
                    ]),
                    ..ReleasePlan::default()
                },
            },
            StopCase {
                name: "nothing of node-monitor's: nothing to write",
                node: node(
                    &[(FOREIGN_TAINT, "NoSchedule")],
                    &[("Ready", "True"), ("NodeMonitorMemoryPressure", "Unknown")],
                    &[],
                    true,
                ),
                shutting_down: false,
                want: ReleasePlan::default(),
            },
        ]
    }

    /// Nodes with shutdown or cordon marks, or bare, as a stop finds them, with what it takes
    /// back.
    fn stop_cases_with_marks() -> Vec<StopCase> {
        vec![
            StopCase {
                name: "a shutdown in progress keeps its taint, condition and cordon",
                node: node(
                    &[(SHUTDOWN_TAINT, "NoSchedule"), (MEM, "NoSchedule")],
                    &[
                        ("NodeMonitorShuttingDown", "True"),
                        ("NodeMonitorMemoryPressure", "True"),
                    ],
                    &[CORDONED_ANNOTATION],
                    true,
                ),
                shutting_down: true,
                want: ReleasePlan {
                    remove_taints: taints(&[(MEM, "NoSchedule")]),
                    unknown_conditions: strings(&["NodeMonitorMemoryPressure"]),
                    ..ReleasePlan::default()
                },
            },
            StopCase {
                name: "the manager says shutting down before its condition reached the API",
                node: node(
                    &[(SHUTDOWN_TAINT, "NoSchedule")],
                    &[("NodeMonitorShuttingDown", "False")],
                    &[CORDONED_ANNOTATION],
                    true,
                ),
                shutting_down: true,
                want: ReleasePlan::default(),
            },
            StopCase {
                name: "a last gasp (ShuttingDown True) is kept even when the manager is not preparing",
                node: node(
                    &[],
                    &[
                        ("NodeMonitorShuttingDown", "True"),
                        ("NodeMonitorMemoryPressure", "False"),
                    ],
                    &[LAST_GASP_ANNOTATION],
                    false,
                ),
                shutting_down: false,
                want: ReleasePlan {
                    unknown_conditions: strings(&["NodeMonitorMemoryPressure"]),
                    ..ReleasePlan::default()
                },
            },
            StopCase {
                name: "stale shutdown marks at rest go; the last gasp stays",
                node: node(
                    &[(SHUTDOWN_TAINT, "NoSchedule")],
                    &[("NodeMonitorShuttingDown", "False")],
                    &[CORDONED_ANNOTATION, LAST_GASP_ANNOTATION],
                    true,
                ),
                shutting_down: false,
                want: ReleasePlan {
                    remove_taints: taints(&[(SHUTDOWN_TAINT, "NoSchedule")]),
                    unknown_conditions: strings(&["NodeMonitorShuttingDown"]),
                    remove_annotations: strings(&[CORDONED_ANNOTATION]),
                    uncordon: true,
                    ..ReleasePlan::default()
                },
            },
            StopCase {
                name: "a cordon annotation on a schedulable node: only the annotation goes",
                node: node(&[], &[], &[CORDONED_ANNOTATION], false),
                shutting_down: false,
                want: ReleasePlan {
                    remove_annotations: strings(&[CORDONED_ANNOTATION]),
                    ..ReleasePlan::default()
                },
            },
            StopCase {
                name: "a node with no spec, status or annotations",
                node: Node::default(),
                shutting_down: false,
                want: ReleasePlan::default(),
            },
        ]
    }

    #[test]
    fn what_a_stop_takes_back() {
        for c in stop_cases_with_pressure()
            .into_iter()
            .chain(stop_cases_with_marks())
        {
            let got = release_plan(
                &c.node,
                Release::Stop {
                    shutting_down: c.shutting_down,
                },
            );
            assert_eq!(got, c.want, "{}", c.name);
            assert_eq!(
                got.is_empty(),
                c.want == ReleasePlan::default(),
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn what_a_cleanup_removes() {
        struct Case {
            name: &'static str,
            node: Node,
            want: ReleasePlan,
        }
        let cases = [
            Case {
                name: "every node-monitor mark, nothing else",
                node: node(
                    &[
                        (MEM, "NoSchedule"),
                        (FOREIGN_TAINT, "NoSchedule"),
                        (SHUTDOWN_TAINT, "NoSchedule"),
                        ("node-monitor.io/custom", "NoExecute"),
                        (OOS, "NoExecute"),
                    ],
                    &[
                        ("Ready", "Unknown"),
                        ("NodeMonitorMemoryPressure", "True"),
                        ("NodeMonitorShuttingDown", "True"),
                        ("NodeMonitorPIDPressure", "Unknown"),
                    ],
                    &[
                        CORDONED_ANNOTATION,
                        LAST_GASP_ANNOTATION,
                        GUARANTEES_ANNOTATION,
                    ],
                    true,
                ),
                want: ReleasePlan {
                    remove_taints: taints(&[
                        (MEM, "NoSchedule"),
                        (SHUTDOWN_TAINT, "NoSchedule"),
                        ("node-monitor.io/custom", "NoExecute"),
                    ]),
                    unknown_conditions: vec![],
                    remove_conditions: strings(&[
                        "NodeMonitorMemoryPressure",
                        "NodeMonitorShuttingDown",
                        "NodeMonitorPIDPressure",
                    ]),
                    remove_annotations: strings(&[
                        CORDONED_ANNOTATION,
                        LAST_GASP_ANNOTATION,
                        GUARANTEES_ANNOTATION,
                    ]),
                    uncordon: true,
                },
            },
            Case {
                name: "someone else's cordon (no annotation) stays",
                node: node(&[], &[("Ready", "True")], &[LAST_GASP_ANNOTATION], true),
                want: ReleasePlan {
                    remove_annotations: strings(&[LAST_GASP_ANNOTATION]),
                    ..ReleasePlan::default()
                },
            },
            Case {
                name: "a clean node",
                node: node(
                    &[(FOREIGN_TAINT, "NoSchedule")],
                    &[("Ready", "True")],
                    &[],
                    false,
                ),
                want: ReleasePlan::default(),
            },
        ];
        for c in cases {
            assert_eq!(
                release_plan(&c.node, Release::Cleanup),
                c.want,
                "{}",
                c.name
            );
        }
    }

    #[test]
    fn the_plan_describes_each_write() {
        let plan = ReleasePlan {
            remove_taints: taints(&[(MEM, "NoSchedule")]),
            unknown_conditions: strings(&["NodeMonitorMemoryPressure"]),
            remove_conditions: strings(&["NodeMonitorDiskPressure"]),
            remove_annotations: strings(&[CORDONED_ANNOTATION]),
            uncordon: true,
        };
        assert_eq!(
            plan.describe(),
            [
                "remove taint node-monitor.io/memory-pressure:NoSchedule",
                "set condition NodeMonitorMemoryPressure to Unknown (NodeMonitorStopped)",
                "remove condition NodeMonitorDiskPressure",
                "uncordon (node-monitor's own cordon)",
                "remove annotation node-monitor.io/cordoned-for-shutdown",
            ]
        );
        assert!(plan.touches_spec());
        let status_only = ReleasePlan {
            unknown_conditions: strings(&["NodeMonitorMemoryPressure"]),
            ..ReleasePlan::default()
        };
        assert!(!status_only.touches_spec() && !status_only.is_empty());
    }
}
