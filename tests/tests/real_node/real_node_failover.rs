//! Failover on two real nodes (`node_monitor_tests::real_node::pair`): a node that loses power is
//! found dead by remediate as shipped (installed by `helm install` with `remediate.enabled`), fenced through its machine's QMP socket by `fence_qmp`
//! from remediate's image (off, confirmed off, on), its workload released with the out-of-service
//! taint, and its Deployment and StatefulSet pods run Ready on the other node; the node boots
//! again, rejoins, recovers and loses the taint.
//!
//! Nothing is written on the agents' or remediate's behalf: the liveness Leases are the agent
//! pods', the fencing and the release remediate's. The death is the machine's CPUs stopped
//! (QMP `stop`), the way a power loss stops them, with its hypervisor still there for the fence
//! device to ask. The timings go to stderr for docs/benchmarks.md; none is asserted.
use std::time::{Duration, Instant};

use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ListParams, PostParams},
};
use node_monitor_core::remediation::out_of_service::OUT_OF_SERVICE_TAINT;
use node_monitor_remediate::store::{node_fence_name, node_fence_resource};
use node_monitor_tests::{
    real_node::{
        NodeLayout, RealNodeOptions, WORKLOAD_IMAGE,
        pair::{NODES, Pair, boot_pair},
        scenario::{agent_pod_on, fail, node_ready, until},
    },
    vm::GuestKernel,
};
use serde_json::json;

/// The node that dies, and the one its pods move to.
const DEAD: &str = NODES[0];
const OTHER: &str = NODES[1];
const NS: &str = "default";

/// A pod template running the workload image, preferring the node that will die.
fn template(app: &str) -> serde_json::Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [DEAD]}
                ]}}
            ]}},
            "containers": [{
                "name": "main",
                "image": WORKLOAD_IMAGE,
                "command": ["nm-workload", "--sleep"],
                "resources": {"requests": {"memory": "16Mi", "cpu": "10m"}}
            }]
        }
    })
}

async fn create_workloads(client: &Client) {
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": template("web")
        }
    }))
    .expect("Deployment");
    let stateful: StatefulSet = serde_json::from_value(json!({
        "metadata": {"name": "db", "namespace": NS},
        "spec": {
            "replicas": 1,
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": template("db")
        }
    }))
    .expect("StatefulSet");
    Api::<Deployment>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the Deployment");
    Api::<StatefulSet>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &stateful)
        .await
        .expect("create the StatefulSet");
}

/// The Ready pod of `app` and the node it runs on.
async fn ready_pod(client: &Client, app: &str) -> Option<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let list = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .ok()?;
    list.items.into_iter().find_map(|p| {
        let ready = p.metadata.deletion_timestamp.is_none()
            && p.status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
        if !ready {
            return None;
        }
        Some((p.metadata.uid.clone()?, p.spec?.node_name?))
    })
}

fn has_out_of_service_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

fn boot_id(n: &Node) -> String {
    n.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.boot_id.clone())
        .unwrap_or_default()
}

/// The reasons of the Events on the Node `node`, oldest first.
async fn node_event_reasons(client: &Client, node: &str) -> Vec<String> {
    let events: Api<Event> = Api::all(client.clone());
    let mut list: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.involved_object.kind.as_deref() == Some("Node")
                && e.involved_object.name.as_deref() == Some(node)
        })
        .collect();
    list.sort_by_key(|e| e.metadata.creation_timestamp.clone());
    list.into_iter().filter_map(|e| e.reason).collect()
}

/// When each step of the failover was first seen, in seconds after the power loss.
#[derive(Debug, Default)]
struct Seen {
    detected: Option<f64>,
    fenced: Option<f64>,
    tainted: Option<f64>,
    deployment: Option<f64>,
    stateful: Option<f64>,
}

impl Seen {
    fn done(&self) -> bool {
        self.detected.is_some()
            && self.fenced.is_some()
            && self.tainted.is_some()
            && self.deployment.is_some()
            && self.stateful.is_some()
    }
}

/// Watches the failover after the power loss at `t0`, until the pods run elsewhere.
async fn watch_failover(pair: &Pair, t0: Instant) -> Seen {
    let fences: Api<DynamicObject> = Api::all_with(pair.client.clone(), &node_fence_resource());
    let nodes: Api<Node> = Api::all(pair.client.clone());
    let mut seen = Seen::default();
    let limit = Duration::from_secs(420);
    while !seen.done() {
        let at = t0.elapsed().as_secs_f64();
        if t0.elapsed() > limit {
            fail(
                pair.node(OTHER),
                &format!("the failover did not complete within {limit:?}: {seen:?}"),
            );
        }
        if let Ok(Some(nf)) = fences.get_opt(&node_fence_name(DEAD)).await {
            let phase = nf.data.pointer("/status/phase").and_then(|p| p.as_str());
            seen.detected.get_or_insert(at);
            if matches!(phase, Some("releasing" | "released")) {
                seen.fenced.get_or_insert(at);
            }
        }
        if let Ok(n) = nodes.get(DEAD).await
            && has_out_of_service_taint(&n)
        {
            seen.tainted.get_or_insert(at);
        }
        if let Some((_, node)) = ready_pod(&pair.client, "web").await
            && node == OTHER
        {
            seen.deployment.get_or_insert(at);
        }
        if let Some((_, node)) = ready_pod(&pair.client, "db").await
            && node == OTHER
        {
            seen.stateful.get_or_insert(at);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen
}

/// The power loss of [`DEAD`], with its Deployment and StatefulSet pods on it
/// ([`create_workloads`]), up to both pods running Ready on [`OTHER`]; returns the time of the
/// power loss and the node's boot ID before.
async fn power_loss(pair: &Pair) -> (Instant, String) {
    let client = &pair.client;
    let nodes: Api<Node> = Api::all(client.clone());
    let mut before = Vec::new();
    for app in ["web", "db"] {
        let (uid, node) = until(
            pair.node(DEAD),
            &format!("{app} Ready"),
            Duration::from_secs(300),
            || ready_pod(client, app),
        )
        .await;
        assert_eq!(node, DEAD, "{app} runs on the node that will die");
        before.push(uid);
    }
    let boot_before = boot_id(&nodes.get(DEAD).await.expect("node"));

    let t0 = Instant::now();
    pair.qmp(DEAD, "stop").expect("QMP stop");
    let seen = watch_failover(pair, t0).await;
    eprintln!(
        "failover (power loss, agent's liveness Lease, fence_qmp): detected {:.1} s, fence \
         confirmed {:.1} s, out-of-service taint {:.1} s, Deployment pod Ready elsewhere {:.1} s, \
         StatefulSet pod Ready elsewhere {:.1} s",
        seen.detected.unwrap_or_default(),
        seen.fenced.unwrap_or_default(),
        seen.tainted.unwrap_or_default(),
        seen.deployment.unwrap_or_default(),
        seen.stateful.unwrap_or_default()
    );
    for (app, old) in ["web", "db"].iter().zip(&before) {
        let (uid, _) = ready_pod(client, app).await.expect("Ready pod");
        assert_ne!(&uid, old, "{app}: a new pod runs on {OTHER}");
    }
    // Gone before the ranking on the other node, whose pressure they would take part in.
    let _ = Api::<Deployment>::namespaced(client.clone(), NS)
        .delete("web", &DeleteParams::default())
        .await;
    let _ = Api::<StatefulSet>::namespaced(client.clone(), NS)
        .delete("db", &DeleteParams::default())
        .await;
    (t0, boot_before)
}

/// The fence device powered [`DEAD`] off and on: it boots again, rejoins, recovers, and the
/// operation is forgotten.
async fn recovered(pair: &Pair, t0: Instant, boot_before: &str) {
    let client = &pair.client;
    let nodes: Api<Node> = Api::all(client.clone());
    until(
        pair.node(OTHER),
        &format!("{DEAD} back Ready on a new boot, without the out-of-service taint"),
        Duration::from_secs(600),
        || {
            let nodes = nodes.clone();
            async move {
                let n = nodes.get(DEAD).await.ok()?;
                (node_ready(&n) && boot_id(&n) != boot_before && !has_out_of_service_taint(&n))
                    .then_some(())
            }
        },
    )
    .await;
    eprintln!(
        "failover: {DEAD} back Ready, recovered, taint removed {:.1} s after the power loss",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(
        pair.qmp(DEAD, "query-status").expect("QMP query-status")["running"],
        json!(true),
        "the machine runs again"
    );
    let reasons = node_event_reasons(client, DEAD).await;
    for reason in ["FencingConfirmed", "NodeReleased", "NodeRecovered"] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "a {reason} Event on {DEAD}: {reasons:?}"
        );
    }
    let fences: Api<DynamicObject> = Api::all_with(client.clone(), &node_fence_resource());
    until(
        pair.node(OTHER),
        "the operation forgotten",
        Duration::from_secs(120),
        || {
            let fences = fences.clone();
            async move {
                let gone = fences.get_opt(&node_fence_name(DEAD)).await.ok()?.is_none();
                gone.then_some(())
            }
        },
    )
    .await;
}

/// The pair's one boot: [`DEAD`] on kubeadm's layout and bookworm's 6.1, [`OTHER`] on kind's
/// layout and bullseye's 5.10 with the kubelet at the ranking's thresholds; node-monitor and
/// remediate installed by a real `helm install` (`distribution=kind`, the agent in dry run at the
/// ranking's thresholds). In order: the power loss and the failover; the ranking parity on the
/// kind node while the dead node boots again after its power cycle; its recovery; the Helm
/// lifecycle (`real_node_helm.rs`) and the kernel probes on the kind node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_loses_power_is_fenced_through_qmp_and_released_beside_a_kind_node() {
    let config = crate::real_node::agent_config(true);
    let mut pair = boot_pair(
        [
            // Two guests on the machine's two cores, one CPU each (two CPUs for the kind node
            // made the boot 100 s longer: the guests' boots and reboots contend).
            RealNodeOptions {
                memory_mib: 1536,
                cpus: 1,
                ..RealNodeOptions::default()
            },
            RealNodeOptions {
                kubelet_config_extra: crate::real_node::KUBELET_SAME_THRESHOLDS.to_owned(),
                layout: NodeLayout::Kind,
                kernel: GuestKernel::Bullseye,
                cpus: 1,
                ..RealNodeOptions::default()
            },
        ],
        &["distribution=kind"],
        Some(&config),
    )
    .await;
    create_workloads(&pair.client).await;
    pair.installed().await;
    let (t0, boot_before) = power_loss(&pair).await;

    let client = pair.client.clone();
    let agent = agent_pod_on(&client, OTHER)
        .await
        .unwrap_or_else(|| fail(pair.node(OTHER), "no Ready agent pod on the kind node"));
    let agent_ip = agent
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("agent pod IP");
    crate::real_node::the_kubelet_and_node_monitor_rank_the_same_pod_first(
        &client,
        pair.node_mut(OTHER),
        &agent,
        &agent_ip,
    )
    .await;
    recovered(&pair, t0, &boot_before).await;

    crate::real_node_helm::helm_lifecycle(
        &pair.cp,
        &client,
        pair.nodes
            .iter_mut()
            .find(|n| n.name == OTHER)
            .expect("the kind node"),
        crate::real_node::AGENT_MIB,
    )
    .await;
    crate::real_node_probes::the_kernel_probes_on_this_nodes_kernel(
        pair.node_mut(OTHER),
        GuestKernel::Bullseye,
    )
    .await;
    pair.finish().await;
}
