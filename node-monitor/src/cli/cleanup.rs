//! `node-monitor cleanup --node-name NODE`: removes every node-monitor mark from a node through
//! the API, for a node whose agent is gone without a clean stop (uninstalled while its pod was
//! killed, the node's agent crash-looping away). Run by an operator with their own credentials:
//! the agent's token may not write a node other than its own.
//!
//! What goes ([`node_monitor_core::release::Release::Cleanup`]): taints `node-monitor.io/*`, conditions
//! `NodeMonitor*`, the annotations `node-monitor.io/cordoned-for-shutdown` and
//! `node-monitor.io/last-gasp`, and node-monitor's cordon (only when that annotation says
//! node-monitor made it). Host files (the logind drop-in) are out of its reach. The contract is in
//! docs/cli.md.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};

use crate::cluster::{
    self as kube_adapter,
    actuator::{Actuator, ActuatorConfig, PdbPolicy},
};

use node_monitor_core::release::Release;

/// The label the shipped DaemonSet puts on the agent's pods.
pub const AGENT_POD_SELECTOR: &str = "app.kubernetes.io/name=node-monitor";

/// Remove every node-monitor mark (taints, conditions, annotations, its own cordon) from a node.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The node to clean.
    #[arg(long, value_parser = node_monitor_core::node_name::parse_node_name)]
    pub node_name: String,
    /// Kubeconfig; default: $KUBECONFIG, then the in-cluster config.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Print what would be removed, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

pub async fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let client = kube_adapter::client(args.kubeconfig.as_deref()).await?;
    if let Some(pod) = running_agent(&client, &args.node_name).await {
        tracing::warn!(node = %args.node_name, %pod,
            "a node-monitor agent still runs on this node and will publish its marks again; delete the DaemonSet first");
    }
    let actuator = Actuator::new(
        client,
        ActuatorConfig {
            node_name: args.node_name.clone(),
            pdb_policy: PdbPolicy::Respect,
            dry_run: args.dry_run,
        },
    );
    let plan = actuator
        .release(Release::Cleanup, args.dry_run)
        .await
        .with_context(|| format!("cleaning node {}", args.node_name))?;
    let lines = plan.describe();
    if lines.is_empty() {
        println!("node {}: no node-monitor marks", args.node_name);
    }
    let prefix = if args.dry_run { "would " } else { "" };
    for line in lines {
        println!("node {}: {prefix}{line}", args.node_name);
    }
    Ok(ExitCode::SUCCESS)
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
        .find(|p| node_monitor_core::pod::pod_is_active(p))
        .map(|p| {
            format!(
                "{}/{}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default()
            )
        })
}
