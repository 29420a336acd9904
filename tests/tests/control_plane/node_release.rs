//! What node-monitor leaves on a node when it goes, against a real kube-apiserver: a clean stop
//! of the agent (its pressure taints removed, its conditions `Unknown` with reason
//! `NodeMonitorStopped`, a shutdown under way left alone), and `node-monitor cleanup` for a node
//! whose agent died without one (every node-monitor mark removed, nothing else touched).
//!
//! No kubelet runs: the node and its kubelet-owned fields are written by the test. The stop is
//! exercised through the agent's own stop routine on its actuator; the cleanup through the
//! `node-monitor` binary (build it first: `cargo bins`).
//!
//! Needs the binaries from `scripts/setup.sh --with-control-plane` (KUBEBUILDER_ASSETS); without
//! them every test fails naming what is missing.
use std::{process::Command, time::Duration};

use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::{
    Api, Client,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use node_monitor::{
    agent::{STOP_RELEASE_BOUND, release_on_stop},
    cluster::actuator::{Actuator, ActuatorConfig, NodeConditionUpdate, PdbPolicy},
};
use node_monitor_core::contract::names::{
    CORDONED_ANNOTATION, LAST_GASP_ANNOTATION, SHUTDOWN_TAINT, SHUTTING_DOWN_CONDITION,
};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    e2e::binary,
    wait::must,
};
use serde_json::json;

const MEMORY_TAINT: &str = "node-monitor.io/memory-pressure";
const DISK_TAINT: &str = "node-monitor.io/disk-pressure";

async fn start() -> ControlPlane {
    must(
        ControlPlane::start(ControlPlaneOptions::default()).await,
        "start the control plane",
    )
}

/// A node with the kubelet's Ready condition (an old heartbeat) and an operator's taint.
async fn node(client: &Client, name: &str) -> Api<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(
                [(
                    "node-monitor.io/remediation".to_owned(),
                    "disabled".to_owned(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(vec![k8s_openapi::api::core::v1::Taint {
                key: "dedicated".into(),
                value: Some("db".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        ..Node::default()
    };
    must(
        nodes.create(&PostParams::default(), &node).await,
        "create node",
    );
    must(
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }]}})),
            )
            .await,
        "kubelet's Ready",
    );
    nodes
}

fn actuator(client: Client, node: &str) -> Actuator {
    Actuator::new(
        client,
        ActuatorConfig {
            node_name: node.into(),
            pdb_policy: PdbPolicy::Respect,
            dry_run: false,
        },
    )
}

fn update(type_: &str, status: bool) -> NodeConditionUpdate {
    NodeConditionUpdate {
        type_: type_.into(),
        status,
        reason: format!("R{status}"),
        message: "m".into(),
    }
}

fn condition<'a>(node: &'a Node, type_: &str) -> &'a NodeCondition {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no condition {type_}"))
}

/// The node's taints but those the node lifecycle controller adds and removes on its own
/// (`node.kubernetes.io/not-ready`, `…/unschedulable`, …).
fn taint_keys(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .map(|t| t.key.clone())
                .filter(|k| !k.starts_with("node.kubernetes.io/"))
                .collect()
        })
        .unwrap_or_default()
}

/// What node-monitor may have written on a node, with the timestamps (the controller manager
/// keeps writing the node meanwhile, so its resourceVersion says nothing).
fn marks(node: &Node) -> String {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.clone());
    format!(
        "taints {:?}; conditions {}; annotations {:?}; unschedulable {:?}",
        taint_keys(node),
        serde_json::to_string(&conditions).expect("json"),
        node.metadata.annotations,
        node.spec.as_ref().and_then(|s| s.unschedulable),
    )
}

/// The agent under pressure publishes True and its taint; a clean stop removes the taint and
/// turns its conditions Unknown (NodeMonitorStopped) without a fresh heartbeat; the kubelet's
/// condition and the operator's taint stay. A restarted agent republishes as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_stop_removes_pressure_taints_and_leaves_conditions_unknown() {
    let cp = start().await;
    let nodes = node(&cp.client(), "pressured").await;
    let agent = actuator(cp.client(), "pressured");
    must(
        agent
            .set_conditions(&[
                update("NodeMonitorMemoryPressure", true),
                update("NodeMonitorDiskPressure", false),
            ])
            .await,
        "publish pressure",
    );
    must(
        agent.set_taint(MEMORY_TAINT, "", "NoSchedule", true).await,
        "taint",
    );
    let before = must(nodes.get("pressured").await, "get node");
    assert_eq!(taint_keys(&before), ["dedicated", MEMORY_TAINT]);
    // Timestamps have a one-second resolution: the stop's transition must be later.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    assert!(
        release_on_stop(&agent, false, STOP_RELEASE_BOUND).await,
        "the stop reached the API"
    );

    let after = must(nodes.get("pressured").await, "get node");
    assert_eq!(
        taint_keys(&after),
        ["dedicated"],
        "only the agent's taint goes"
    );
    for type_ in ["NodeMonitorMemoryPressure", "NodeMonitorDiskPressure"] {
        let (was, now) = (condition(&before, type_), condition(&after, type_));
        assert_eq!(now.status, "Unknown", "{type_}");
        assert_eq!(now.reason.as_deref(), Some("NodeMonitorStopped"), "{type_}");
        assert_eq!(
            now.last_heartbeat_time, was.last_heartbeat_time,
            "{type_}: a stopped agent sends no heartbeat"
        );
        assert!(
            now.last_transition_time > was.last_transition_time,
            "{type_}: {now:?}"
        );
    }
    assert_eq!(
        condition(&after, "Ready"),
        condition(&before, "Ready"),
        "the kubelet's condition is untouched"
    );

    // A second stop has nothing left to write.
    assert!(release_on_stop(&agent, false, STOP_RELEASE_BOUND).await);
    let again = must(nodes.get("pressured").await, "get node");
    assert_eq!(
        condition(&again, "NodeMonitorMemoryPressure"),
        condition(&after, "NodeMonitorMemoryPressure")
    );

    // The restarted agent re-evaluates and republishes.
    must(
        agent
            .set_conditions(&[update("NodeMonitorMemoryPressure", true)])
            .await,
        "republish",
    );
    must(
        agent.set_taint(MEMORY_TAINT, "", "NoSchedule", true).await,
        "taint again",
    );
    let restarted = must(nodes.get("pressured").await, "get node");
    assert_eq!(
        condition(&restarted, "NodeMonitorMemoryPressure").status,
        "True"
    );
    assert_eq!(taint_keys(&restarted), ["dedicated", MEMORY_TAINT]);
}

/// A stop in the middle of a node shutdown leaves the shutdown's marks (taint, True condition,
/// cordon) for the next start to clear; the pressure taint still goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_during_a_shutdown_keeps_the_shutdown_marks() {
    let cp = start().await;
    let nodes = node(&cp.client(), "going-down").await;
    let agent = actuator(cp.client(), "going-down");
    must(
        agent
            .set_conditions(&[
                update(SHUTTING_DOWN_CONDITION, true),
                update("NodeMonitorMemoryPressure", true),
            ])
            .await,
        "conditions",
    );
    must(
        agent
            .set_taint(SHUTDOWN_TAINT, "", "NoSchedule", true)
            .await,
        "shutdown taint",
    );
    must(
        agent.set_taint(DISK_TAINT, "", "NoSchedule", true).await,
        "pressure taint",
    );
    must(
        agent.annotate_node(CORDONED_ANNOTATION, Some("true")).await,
        "annotate",
    );
    must(agent.set_unschedulable(true).await, "cordon");

    assert!(release_on_stop(&agent, true, STOP_RELEASE_BOUND).await);

    let after = must(nodes.get("going-down").await, "get node");
    assert_eq!(taint_keys(&after), ["dedicated", SHUTDOWN_TAINT]);
    assert_eq!(condition(&after, SHUTTING_DOWN_CONDITION).status, "True");
    assert_eq!(
        condition(&after, "NodeMonitorMemoryPressure").status,
        "Unknown"
    );
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true)
    );
    assert!(
        after
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(CORDONED_ANNOTATION))
    );
}

/// `node-monitor cleanup` on a node an agent left marked (it died during a shutdown): every
/// node-monitor mark goes, the operator's and the kubelet's stay; `--dry-run` changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_removes_every_node_monitor_mark() {
    let node_monitor = binary("node-monitor");
    let cp = start().await;
    let nodes = node(&cp.client(), "abandoned").await;
    let agent = actuator(cp.client(), "abandoned");
    must(
        agent
            .set_conditions(&[
                update(SHUTTING_DOWN_CONDITION, true),
                update("NodeMonitorMemoryPressure", true),
                update("NodeMonitorPIDPressure", false),
            ])
            .await,
        "conditions",
    );
    for key in [SHUTDOWN_TAINT, MEMORY_TAINT] {
        must(agent.set_taint(key, "", "NoSchedule", true).await, key);
    }
    must(
        agent.annotate_node(CORDONED_ANNOTATION, Some("true")).await,
        "annotate",
    );
    must(agent.set_unschedulable(true).await, "cordon");
    must(
        agent
            .annotate_node(LAST_GASP_ANNOTATION, Some("{\"time\":1}"))
            .await,
        "last gasp",
    );
    let before = must(nodes.get("abandoned").await, "get node");

    let run = |extra: &[&str]| {
        let out = Command::new(&node_monitor)
            .args(["cleanup", "--node-name", "abandoned", "--kubeconfig"])
            .arg(cp.kubeconfig_path())
            .args(extra)
            .output()
            .expect("run node-monitor cleanup");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "cleanup failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let dry = run(&["--dry-run"]);
    assert!(
        dry.contains("would remove taint node-monitor.io/shutdown:NoSchedule"),
        "{dry}"
    );
    let unchanged = must(nodes.get("abandoned").await, "get node");
    assert_eq!(
        marks(&unchanged),
        marks(&before),
        "a dry run writes nothing"
    );

    let out = run(&[]);
    for line in [
        "remove taint node-monitor.io/shutdown:NoSchedule",
        "remove taint node-monitor.io/memory-pressure:NoSchedule",
        "remove condition NodeMonitorShuttingDown",
        "uncordon (node-monitor's own cordon)",
        "remove annotation node-monitor.io/last-gasp",
    ] {
        assert!(out.contains(line), "missing {line:?} in:\n{out}");
    }
    let after = must(nodes.get("abandoned").await, "get node");
    assert_eq!(taint_keys(&after), ["dedicated"]);
    let conditions: Vec<&str> = after
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|c| c.iter().map(|c| c.type_.as_str()).collect())
        .unwrap_or_default();
    assert_eq!(conditions, ["Ready"]);
    assert_eq!(
        condition(&after, "Ready"),
        condition(&before, "Ready"),
        "the kubelet's condition is untouched"
    );
    assert!(
        !after
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        "node-monitor's cordon is undone"
    );
    let annotations = after.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.keys().collect::<Vec<_>>(),
        ["node-monitor.io/remediation"],
        "only the operator's annotation stays"
    );

    // Nothing left: a second run says so and writes nothing.
    let again = run(&[]);
    assert!(again.contains("no node-monitor marks"), "{again}");
    let last = must(nodes.get("abandoned").await, "get node");
    assert_eq!(marks(&last), marks(&after));
}

/// A cordon without node-monitor's annotation is someone else's: cleanup leaves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_leaves_someone_elses_cordon() {
    let node_monitor = binary("node-monitor");
    let cp = start().await;
    let nodes = node(&cp.client(), "maintenance").await;
    must(
        nodes
            .patch(
                "maintenance",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await,
        "operator's cordon",
    );
    let out = Command::new(&node_monitor)
        .args(["cleanup", "--node-name", "maintenance", "--kubeconfig"])
        .arg(cp.kubeconfig_path())
        .output()
        .expect("run node-monitor cleanup");
    assert!(out.status.success(), "{out:?}");
    let after = must(nodes.get("maintenance").await, "get node");
    assert_eq!(
        after.spec.as_ref().and_then(|s| s.unschedulable),
        Some(true)
    );
}
