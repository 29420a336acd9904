//! Agent overhead with a full node: RSS and CPU of `node-monitor run` with N pods (real processes
//! in kubelet-layout cgroups) on a stand-in node, measured from /proc over a steady window.
//!
//! ```text
//! cargo bins && target/debug/bench-agent-load --pods 250 --seconds 60
//! # the release agent, with the debug harness:
//! cargo build --release -p node-monitor --bin node-monitor
//! NODE_MONITOR_AGENT_PROFILE=release target/debug/bench-agent-load --pods 250 --seconds 60
//! ```
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Parser;
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    e2e::{Agent, Cluster},
    pod::PodBuilder,
    procfs,
    standin::{StandIn, StandInConfig},
};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 250)]
    pods: usize,
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Run the agent as the DaemonSet does, with its memory locked (`mlockall`): every mapped
    /// page is then resident, which is what the container's memory limit must hold.
    #[arg(long)]
    mlock: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    node_monitor_tests::cgroup::require_root("bench-agent-load");
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let node = "load-node";
    let node_cgroup = format!("node-monitor-test/{node}-{}", std::process::id());
    let mut cfg = StandInConfig::new(node, &node_cgroup).memory(8 << 30);
    cfg.max_pods = u32::try_from(args.pods + 10)?;
    let standin = StandIn::start(cp.client(), cfg).await?;
    standin.wait_ready(Duration::from_secs(60)).await?;
    let cluster = Cluster {
        cp,
        standin: Some(standin),
        node: node.into(),
        node_cgroup: node_cgroup.into(),
    };
    let result = run(&cluster, &args).await;
    cluster.stop().await?;
    result
}

async fn run(cluster: &Cluster, args: &Args) -> Result<()> {
    let started = Instant::now();
    for i in 0..args.pods {
        let pod =
            PodBuilder::workload(&format!("p{i:03}"), &cluster.node, &["--hold", "1Mi"]).build();
        cluster.create_pod(pod).await?;
    }
    for i in 0..args.pods {
        cluster
            .wait_running("default", &format!("p{i:03}"), Duration::from_secs(300))
            .await?;
    }
    println!(
        "{} pods running after {:.1} s",
        args.pods,
        started.elapsed().as_secs_f64()
    );
    let mut agent = Agent::spawn(
        cluster,
        "evictionHard:\n  memory.available: 100Mi\n",
        if args.mlock { &[] } else { &["--no-mlock"] },
    )?;
    agent.wait_log("deciding", Duration::from_secs(60)).await?;
    let pid = agent.pid().context("agent pid")?;
    // Let start-up (program load, first full sample) pass, then measure a steady window.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (t0, _, _) = procfs::figures(pid)?;
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    let (t1, rss, hwm) = procfs::figures(pid)?;
    let wall = w0.elapsed().as_secs_f64();
    let hz = procfs::ticks_per_second();
    let cpu = (t1 - t0) as f64 / hz / wall * 100.0;
    let wakeups = agent.metric_sum("node_monitor_wakeups_total", &[]).await?;
    println!(
        "pods={} mlock={} window={wall:.0}s cpu={cpu:.2}% of one core rss={:.1}MiB peak_rss={:.1}MiB wakeups_total={wakeups}",
        args.pods,
        args.mlock,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    agent.terminate()?;
    Ok(())
}
