//! Starts a real control plane (etcd, kube-apiserver, kube-controller-manager) on loopback for the
//! demo and the guest-VM tier, prints where its kubeconfigs are, and stops everything on SIGINT or
//! SIGTERM.
//!
//! ```text
//! nm-control-plane --kubeconfig-out /tmp/nm.kubeconfig
//! KUBECONFIG=/tmp/nm.kubeconfig kubectl get nodes
//! ```
use std::{path::PathBuf, time::Duration};

use anyhow::{Context as _, Result};
use clap::Parser;
use node_monitor_tests::control_plane::{ControlPlane, ControlPlaneOptions, error_chain};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
#[command(about = "Run etcd + kube-apiserver + kube-controller-manager on loopback")]
struct Args {
    /// Directory holding etcd, kube-apiserver and kube-controller-manager (default:
    /// KUBEBUILDER_ASSETS, then the setup script's cache).
    #[arg(long, env = "KUBEBUILDER_ASSETS")]
    assets: Option<PathBuf>,
    /// Work directory to use and keep (default: a temporary directory removed on exit).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Copy the admin kubeconfig (server https://127.0.0.1:<port>) here.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Copy the guest kubeconfig (server https://10.0.2.2:<port>, for a qemu user-net guest) here.
    #[arg(long)]
    guest_kubeconfig_out: Option<PathBuf>,
    /// Do not start kube-controller-manager.
    #[arg(long)]
    no_controller_manager: bool,
    /// Extra kube-apiserver flag (repeatable), e.g. --apiserver-arg=--v=4.
    #[arg(long, allow_hyphen_values = true)]
    apiserver_arg: Vec<String>,
    /// Extra kube-controller-manager flag (repeatable), e.g.
    /// --controller-manager-arg=--node-monitor-grace-period=10s.
    #[arg(long, allow_hyphen_values = true)]
    controller_manager_arg: Vec<String>,
    /// Scale node failure handling down: node-monitor grace period in seconds (see
    /// ControlPlaneOptions::fast_node_failover); needs --toleration-seconds.
    #[arg(long, requires = "toleration_seconds")]
    node_grace_seconds: Option<u64>,
    /// Default not-ready/unreachable toleration for pods, in seconds.
    #[arg(long, requires = "node_grace_seconds")]
    toleration_seconds: Option<u64>,
    /// Startup timeout in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_seconds: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // The readiness polls log every refused connection at error level.
                .unwrap_or_else(|_| "info,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut opts = ControlPlaneOptions {
        assets_dir: args.assets,
        work_dir: args.dir,
        startup_timeout: Duration::from_secs(args.timeout_seconds),
        controller_manager: !args.no_controller_manager,
        apiserver_args: args.apiserver_arg,
        controller_manager_args: args.controller_manager_arg,
        ..ControlPlaneOptions::default()
    };
    if let (Some(g), Some(t)) = (args.node_grace_seconds, args.toleration_seconds) {
        opts = opts.fast_node_failover(Duration::from_secs(g), Duration::from_secs(t));
    }
    // Installed before the start so a signal during startup still tears everything down.
    let mut sigint = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let cp = tokio::select! {
        r = ControlPlane::start(opts) => r.map_err(|e| anyhow::anyhow!(error_chain(&e)))?,
        _ = sigint.recv() => return Ok(()),
        _ = sigterm.recv() => return Ok(()),
    };
    if let Some(p) = &args.kubeconfig_out {
        std::fs::copy(cp.kubeconfig_path(), p)
            .with_context(|| format!("copy the kubeconfig to {}", p.display()))?;
    }
    if let Some(p) = &args.guest_kubeconfig_out {
        std::fs::copy(cp.guest_kubeconfig_path(), p)
            .with_context(|| format!("copy the guest kubeconfig to {}", p.display()))?;
    }
    // One `KEY=value` per line on stdout, for scripts; everything else goes to stderr.
    println!("NM_SERVER={}", cp.server());
    println!("NM_GUEST_SERVER={}", cp.guest_server());
    println!(
        "NM_KUBECONFIG={}",
        args.kubeconfig_out
            .as_deref()
            .unwrap_or(cp.kubeconfig_path())
            .display()
    );
    println!(
        "NM_GUEST_KUBECONFIG={}",
        args.guest_kubeconfig_out
            .as_deref()
            .unwrap_or(cp.guest_kubeconfig_path())
            .display()
    );
    println!("NM_CONTROL_PLANE_DIR={}", cp.dir().display());
    println!("NM_READY=1");
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    tracing::info!("stopping the control plane");
    cp.stop().map_err(|e| anyhow::anyhow!(error_chain(&e)))
}
