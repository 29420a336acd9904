//! Runs the kubelet stand-in against a cluster until SIGINT/SIGTERM: registers a node, runs the
//! pods bound to it as real processes in kubelet-layout cgroups, and kills them when the API
//! deletes them. For the demo and the guest-VM tier.
//!
//! ```text
//! nm-kubelet-standin --kubeconfig /tmp/nm.kubeconfig --node-name demo-a \
//!     --cgroup-root /node-monitor-test/demo-a --memory 2Gi --label topology.kubernetes.io/zone=a
//! ```
use std::{collections::BTreeMap, path::PathBuf, time::Duration};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Parser;
use node_monitor_tests::{
    control_plane::{client_from_kubeconfig, error_chain},
    standin::{CgroupDriver, StandIn, StandInConfig, cgroups::TEST_SUBTREE, decide::parse_bytes},
};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser, Debug)]
#[command(about = "A kubelet stand-in: pods as real processes in kubelet-layout cgroups")]
struct Args {
    /// Kubeconfig of a user allowed to manage nodes, leases and pods.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    #[arg(long)]
    node_name: String,
    /// The node cgroup as the kernel names it (`/node-monitor-test/<node>`), the same path in
    /// every hierarchy; it must lie under /node-monitor-test/.
    #[arg(long)]
    cgroup_root: PathBuf,
    /// Memory capacity (a quantity, e.g. 2Gi), written as the node cgroup's limit. Default: the
    /// node cgroup's existing limit.
    #[arg(long, value_parser = bytes)]
    memory: Option<u64>,
    /// System + kube reserved memory (a quantity).
    #[arg(long, value_parser = bytes, default_value = "0")]
    memory_reserved: u64,
    /// The kubelet's hard memory.available threshold, subtracted from allocatable.
    #[arg(long, value_parser = bytes, default_value = "0")]
    eviction_hard_memory: u64,
    /// CPU capacity (a quantity).
    #[arg(long, default_value = "2")]
    cpu: String,
    #[arg(long, default_value_t = 110)]
    max_pods: u32,
    /// Node label KEY=VALUE (repeatable).
    #[arg(long = "label", value_parser = key_value)]
    labels: Vec<(String, String)>,
    /// Taint KEY[=VALUE]:EFFECT to register with (repeatable).
    #[arg(long = "taint")]
    taints: Vec<String>,
    /// Use the systemd cgroup naming instead of cgroupfs.
    #[arg(long)]
    systemd_cgroups: bool,
    /// Lease renewal interval in seconds.
    #[arg(long, default_value_t = 2)]
    lease_interval_seconds: u64,
    /// Node status interval in seconds.
    #[arg(long, default_value_t = 10)]
    status_interval_seconds: u64,
    /// CrashLoopBackOff base, in seconds.
    #[arg(long, default_value_t = 10)]
    restart_backoff_seconds: u64,
    /// Do not bind unscheduled pods to this node.
    #[arg(long)]
    no_bind: bool,
    /// The node's InternalIP.
    #[arg(long, default_value = "127.0.0.1")]
    node_ip: String,
    /// Keep container logs in this directory (default: a temporary one removed on exit).
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

fn bytes(s: &str) -> Result<u64, String> {
    parse_bytes(s).ok_or_else(|| format!("{s:?} is not a byte quantity (e.g. 2Gi)"))
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    // The kernel's name for the cgroup (`/node-monitor-test/x`) is relative to each hierarchy root.
    let rel = args
        .cgroup_root
        .strip_prefix("/")
        .unwrap_or(&args.cgroup_root)
        .to_owned();
    if !rel.starts_with(TEST_SUBTREE) {
        bail!(
            "--cgroup-root {} must lie under /{TEST_SUBTREE}/",
            args.cgroup_root.display()
        );
    }
    let mut cfg = StandInConfig::new(args.node_name.clone(), rel)
        .lease_interval(Duration::from_secs(args.lease_interval_seconds.max(1)))
        .status_interval(Duration::from_secs(args.status_interval_seconds.max(1)))
        .restart_backoff(
            Duration::from_secs(args.restart_backoff_seconds),
            Duration::from_secs(300),
        );
    cfg.memory_capacity = args.memory;
    cfg.memory_reserved = args.memory_reserved;
    cfg.eviction_hard_memory = args.eviction_hard_memory;
    cfg.cpu = args.cpu;
    cfg.max_pods = args.max_pods;
    cfg.labels = args.labels.into_iter().collect::<BTreeMap<_, _>>();
    cfg.bind_pods = !args.no_bind;
    cfg.node_ip = args.node_ip;
    cfg.state_dir = args.state_dir;
    if args.systemd_cgroups {
        cfg = cfg.driver(CgroupDriver::Systemd);
    }
    for t in &args.taints {
        let (kv, effect) = t
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("--taint {t:?} is not KEY[=VALUE]:EFFECT"))?;
        let (key, value) = match kv.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (kv, None),
        };
        cfg = cfg.taint(key, value, effect);
    }

    let mut sigint = signal(SignalKind::interrupt()).context("install the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("install the SIGTERM handler")?;
    let client = client_from_kubeconfig(&args.kubeconfig)
        .await
        .map_err(|e| anyhow!(error_chain(&e)))?;
    let standin = StandIn::start(client, cfg)
        .await
        .map_err(|e| anyhow!(error_chain(&e)))?;
    println!("NM_NODE={}", standin.node_name());
    if let Some(d) = standin.state_dir() {
        println!("NM_STANDIN_LOGS={}", d.join("pods").display());
    }
    println!("NM_READY=1");
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    tracing::info!("stopping the stand-in");
    standin.stop().await.map_err(|e| anyhow!(error_chain(&e)))
}
