//! `node-monitor cleanup --node-name NODE` (or `--all-nodes`): removes every node-monitor mark
//! from a node through the API, for a node whose agent is gone without a clean stop (uninstalled
//! while its pod was killed, the node's agent crash-looping away), and, with `--all-nodes`, from
//! every node after an uninstall (the Helm chart's post-delete hook). Run by an operator with their own credentials:
//! the agent's token may not write a node other than its own.
//!
//! What goes ([`node_monitor_core::release::Release::Cleanup`]): taints `node-monitor.io/*`, conditions
//! `NodeMonitor*`, the annotations `node-monitor.io/cordoned-for-shutdown` and
//! `node-monitor.io/last-gasp`, and node-monitor's cordon (only when that annotation says
//! node-monitor made it). Host files (the logind drop-in) are out of its reach. The contract is in
//! docs/cli.md.
use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, api::ListParams};

use crate::cluster::{
    self as kube_adapter,
    actuator::{Actuator, ActuatorConfig, PdbPolicy},
};

use node_monitor_core::release::Release;

/// The label the shipped DaemonSet puts on the agent's pods.
pub const AGENT_POD_SELECTOR: &str = "app.kubernetes.io/name=node-monitor";

/// Remove every node-monitor mark (taints, conditions, annotations, its own cordon) from a node,
/// or from every node.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["node_name", "all_nodes"])))]
pub struct Args {
    /// The node to clean.
    #[arg(long, value_parser = node_monitor_core::kubelet::node_name::parse_node_name)]
    pub node_name: Option<String>,
    /// Clean every node of the cluster (after an uninstall: the Helm chart's post-delete hook).
    #[arg(long)]
    pub all_nodes: bool,
    /// First wait up to this many seconds until no agent pod runs in `--agent-namespace` (a
    /// stopping agent writes its conditions one last time); then clean anyway, with a warning.
    /// At most 3600.
    #[arg(
        long,
        value_name = "SECONDS",
        requires = "agent_namespace",
        value_parser = clap::value_parser!(u64).range(0..=MAX_WAIT_FOR_AGENTS_SECS)
    )]
    pub wait_for_agents: Option<u64>,
    /// The namespace of the agent's pods, for `--wait-for-agents`.
    #[arg(long, value_name = "NAMESPACE", value_parser = node_monitor_core::kubelet::node_name::parse_namespace)]
    pub agent_namespace: Option<String>,
    /// Kubeconfig; default: $KUBECONFIG, then the in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Print what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub async fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let client = kube_adapter::client(args.kubeconfig.as_deref()).await?;
    if let (Some(secs), Some(ns)) = (args.wait_for_agents, args.agent_namespace.as_deref()) {
        wait_for_agents(&client, ns, Duration::from_secs(secs)).await;
    }
    let nodes = match &args.node_name {
        Some(node) => {
            if let Some(pod) = running_agent(&client, node).await {
                tracing::warn!(%node, %pod,
                    "a node-monitor agent still runs on this node and will publish its marks again; delete the DaemonSet first");
            }
            vec![node.clone()]
        }
        None => Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .context("listing nodes")?
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect(),
    };
    let mut failed = 0usize;
    for node in &nodes {
        if let Err(e) = clean(&client, node, args.dry_run).await {
            if args.node_name.is_some() {
                return Err(e);
            }
            eprintln!("node-monitor: {e:#}");
            failed += 1;
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} nodes could not be cleaned", nodes.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// Cleans one node and prints what went.
async fn clean(client: &kube::Client, node: &str, dry_run: bool) -> anyhow::Result<()> {
    let actuator = Actuator::new(
        client.clone(),
        ActuatorConfig {
            node_name: node.to_owned(),
            pdb_policy: PdbPolicy::Respect,
            dry_run,
        },
    );
    let plan = actuator
        .release(Release::Cleanup, dry_run)
        .await
        .with_context(|| format!("cleaning node {node}"))?;
    let lines = plan.describe();
    if lines.is_empty() {
        println!("node {node}: no node-monitor marks");
    }
    let prefix = if dry_run { "would " } else { "" };
    for line in lines {
        println!("node {node}: {prefix}{line}");
    }
    Ok(())
}

/// The longest `--wait-for-agents`: an agent stops within its termination grace period, far less.
pub const MAX_WAIT_FOR_AGENTS_SECS: u64 = 3600;

/// Waits until no active agent pod is left in `namespace`, at most `limit`.
async fn wait_for_agents(client: &kube::Client, namespace: &str, limit: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let params = ListParams::default().labels(AGENT_POD_SELECTOR);
    let deadline = Instant::now() + limit;
    loop {
        let left = match pods.list(&params).await {
            Ok(list) => list
                .items
                .iter()
                // A terminating agent still writes its conditions once more: it counts until it
                // is gone.
                .filter(|p| {
                    !p.status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
                })
                .count(),
            Err(e) => {
                tracing::warn!(error = %e, namespace, "could not list the agent's pods; cleaning now");
                return;
            }
        };
        if left == 0 {
            return;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                pods = left,
                namespace,
                "agent pods still present; cleaning anyway"
            );
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A running agent pod on the node (`namespace/name`), when the caller may list pods.
async fn running_agent(client: &kube::Client, node: &str) -> Option<String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default()
        .labels(AGENT_POD_SELECTOR)
        .fields(&format!("spec.nodeName={node}"));
    let list = match pods.list(&params).await {
        Ok(list) => list,
        Err(e) => {
            tracing::debug!(error = %e, "could not list the node's pods");
            return None;
        }
    };
    list.items
        .iter()
        .find(|p| node_monitor_core::kubelet::pod::pod_is_active(p))
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
}
