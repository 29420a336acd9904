//! The Helm lifecycle, run by helm against the real node (`helm install` by
//! `node_monitor_tests::real_node::pair::boot_pair`): `helm test`, whose pod runs the
//! release's image in the guest and passes; `helm upgrade` with a changed threshold, after which
//! the agent's pod is replaced and the new one runs with it; `helm rollback` to the first
//! revision, and the pod rolls back; `helm uninstall`, whose post-delete hook runs in the guest
//! and removes every node-monitor mark from the Node, and after which the hook's own account is
//! gone too. The last phase of the failover pair's boot (`real_node_failover.rs`), on its kind
//! node, after the ranking scenario (`real_node.rs`).
use std::time::Duration;

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    batch::v1::Job,
    core::v1::{ConfigMap, Node, Pod, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use kube::{Api, Client};
use node_monitor_tests::{
    control_plane::ControlPlane,
    helm, metrics,
    real_node::{
        RealNode,
        scenario::{AGENT_NS, agent_pod_on, fail, until},
    },
};

use crate::real_node::scrape;

/// The name of the chart's cleanup hook's Job, ServiceAccount and cluster roles.
const CLEANUP: &str = "node-monitor-cleanup";

/// node-monitor's marks on the Node: its conditions, taints and annotations.
fn marks(node: &Node) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(conditions) = node.status.as_ref().and_then(|s| s.conditions.as_ref()) {
        out.extend(
            conditions
                .iter()
                .filter(|c| c.type_.starts_with("NodeMonitor"))
                .map(|c| format!("condition {}={}", c.type_, c.status)),
        );
    }
    if let Some(taints) = node.spec.as_ref().and_then(|s| s.taints.as_ref()) {
        out.extend(
            taints
                .iter()
                .filter(|t| t.key.starts_with("node-monitor.io/"))
                .map(|t| format!("taint {}", t.key)),
        );
    }
    if let Some(annotations) = &node.metadata.annotations {
        out.extend(
            annotations
                .keys()
                .filter(|k| k.starts_with("node-monitor.io/"))
                .map(|k| format!("annotation {k}")),
        );
    }
    out
}

/// The agent's pod on the node once it is Ready and is not `old` (a UID).
async fn replaced(node: &RealNode, client: &Client, old: &str, what: &str) -> Pod {
    until(node, what, Duration::from_secs(420), || {
        let client = client.clone();
        async move {
            agent_pod_on(&client, node.name)
                .await
                .filter(|p| p.metadata.uid.as_deref() != Some(old))
        }
    })
    .await
}

/// The agent's configured hard `memory.available` threshold in bytes, from its metrics.
async fn threshold_bytes(node: &mut RealNode, agent: &Pod, name: &str) -> f64 {
    let ip = agent
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_else(|| fail(node, "the agent's pod has no IP"));
    let m = scrape(node, &ip, name).await;
    metrics::sum(
        &m,
        "node_monitor_eviction_threshold_bytes",
        &[("eviction_signal", "memory.available"), ("kind", "hard")],
    )
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

/// Runs a release command, failing with its output and the guest's logs.
fn helm_release(node: &RealNode, cp: &ControlPlane, args: &[&str]) -> String {
    match helm::release(cp.kubeconfig_path(), args) {
        Ok((stdout, _)) => stdout,
        Err(e) => fail(node, &format!("helm {args:?}: {e:#}")),
    }
}

/// The lifecycle after `helm install`, with the agent's hard `memory.available` threshold at
/// `installed_mib` (MiB) in the first revision.
pub async fn helm_lifecycle(
    cp: &ControlPlane,
    client: &Client,
    node: &mut RealNode,
    installed_mib: u64,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let chart = helm::chart_dir().to_string_lossy().into_owned();
    const MI: f64 = 1024.0 * 1024.0;
    let name = node.name;

    // Marks for the uninstall to remove: the agent has published its conditions and guarantees.
    let before = until(
        node,
        "node-monitor's marks on the Node",
        Duration::from_secs(120),
        || {
            let nodes = nodes.clone();
            async move {
                let m = marks(&nodes.get(name).await.ok()?);
                (!m.is_empty()).then_some(m)
            }
        },
    )
    .await;

    // helm test: the chart's test pod checks the release's configuration with its own image,
    // often on a node the ranking left with the kubelet's memory-pressure taint (its 5-minute
    // transition period), which the pod tolerates.
    let taints: Vec<String> = nodes
        .get(node.name)
        .await
        .ok()
        .and_then(|n| n.spec?.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect();
    eprintln!("real node: helm test on a node with the taints {taints:?}");
    let out = match helm::release(
        cp.kubeconfig_path(),
        &["test", helm::RELEASE, "--timeout", "300s"],
    ) {
        Ok((stdout, _)) => stdout,
        Err(e) => {
            // The failed test pod stays (its hook-succeeded policy): say why it failed.
            let status = Api::<Pod>::namespaced(client.clone(), AGENT_NS)
                .get_opt("node-monitor-test-config")
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status);
            fail(
                node,
                &format!(
                    "helm test: {e:#}
the test pod's status: {status:?}"
                ),
            )
        }
    };
    assert!(
        out.contains("node-monitor-test-config") && out.contains("Succeeded"),
        "helm test: the test pod did not succeed:\n{out}"
    );

    // helm upgrade with a changed threshold: the ConfigMap's checksum rolls the pod, and the new
    // pod runs with the new threshold.
    let first = agent_pod_on(client, node.name)
        .await
        .unwrap_or_else(|| fail(node, "no Ready agent pod before the upgrade"));
    let upgraded_mib = installed_mib - 50;
    let set = format!("config.evictionHard.memory\\.available={upgraded_mib}Mi");
    helm_release(
        node,
        cp,
        &[
            "upgrade",
            helm::RELEASE,
            &chart,
            "--reuse-values",
            "--set",
            &set,
            "--timeout",
            "120s",
        ],
    );
    let cm = Api::<ConfigMap>::namespaced(client.clone(), AGENT_NS)
        .get("node-monitor-config")
        .await
        .expect("the agent's ConfigMap");
    let config = cm
        .data
        .and_then(|d| d.get("config.yaml").cloned())
        .unwrap_or_default();
    assert!(
        config.contains(&format!("memory.available: {upgraded_mib}Mi")),
        "the upgrade's threshold is not in the ConfigMap:\n{config}"
    );
    let second = replaced(
        node,
        client,
        &uid(&first),
        "the agent's pod rolled by the upgrade",
    )
    .await;
    let t = threshold_bytes(node, &second, "metrics-helm-upgrade.txt").await;
    assert_eq!(
        t,
        upgraded_mib as f64 * MI,
        "the upgraded agent's memory.available threshold"
    );

    // helm rollback to the first revision: the pod rolls back to the installed threshold.
    helm_release(
        node,
        cp,
        &["rollback", helm::RELEASE, "1", "--timeout", "120s"],
    );
    let third = replaced(node, client, &uid(&second), "the agent's pod rolled back").await;
    let t = threshold_bytes(node, &third, "metrics-helm-rollback.txt").await;
    assert_eq!(
        t,
        installed_mib as f64 * MI,
        "the rolled-back agent's memory.available threshold"
    );

    // helm uninstall: the release goes, the post-delete hook's Job runs in the guest and removes
    // every mark, and helm deletes the hook's Job and account once it succeeded.
    helm_release(node, cp, &["uninstall", helm::RELEASE, "--timeout", "300s"]);
    let left = marks(&nodes.get(name).await.expect("the Node"));
    assert!(
        left.is_empty(),
        "node-monitor's marks left on the Node after uninstall: {left:?} (before: {before:?})"
    );
    let ds = Api::<DaemonSet>::namespaced(client.clone(), AGENT_NS)
        .get_opt("node-monitor")
        .await
        .expect("get DaemonSet");
    assert!(ds.is_none(), "the DaemonSet outlived the uninstall");
    let job = Api::<Job>::namespaced(client.clone(), AGENT_NS)
        .get_opt(CLEANUP)
        .await
        .expect("get Job");
    assert!(job.is_none(), "the succeeded cleanup Job was kept: {job:?}");
    let sa = Api::<ServiceAccount>::namespaced(client.clone(), AGENT_NS)
        .get_opt(CLEANUP)
        .await
        .expect("get ServiceAccount");
    let role = Api::<ClusterRole>::all(client.clone())
        .get_opt(CLEANUP)
        .await
        .expect("get ClusterRole");
    let binding = Api::<ClusterRoleBinding>::all(client.clone())
        .get_opt(CLEANUP)
        .await
        .expect("get ClusterRoleBinding");
    assert!(
        sa.is_none() && role.is_none() && binding.is_none(),
        "the cleanup hook's account outlived it: ServiceAccount {}, ClusterRole {}, \
         ClusterRoleBinding {}",
        sa.is_some(),
        role.is_some(),
        binding.is_some()
    );
    eprintln!(
        "real node: helm lifecycle: test passed, upgrade to {upgraded_mib}Mi and rollback to \
         {installed_mib}Mi each rolled the agent's pod, uninstall removed {before:?}"
    );
}
