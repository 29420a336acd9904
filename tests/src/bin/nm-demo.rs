//! The self-contained demo (`scripts/demo.sh`): a real control plane on loopback, this machine
//! registered as a 1 GiB node through the kubelet stand-in, pods of every QoS class and two
//! priorities, the real agent, and one pod whose memory climbs. It shows what the agent saw and did,
//! what the API server recorded, and how fast, then removes everything it started.
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use node_monitor_tests::{
    e2e::{Agent, Cluster},
    pod::PodBuilder,
};

const MI: i64 = 1 << 20;
const THRESHOLD_MI: i64 = 300;

fn say(s: &str) {
    println!("\n\x1b[1m== {s}\x1b[0m");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("warn,kube_client=off"))
        .init();
    say(
        "1. control plane (etcd, kube-apiserver, kube-controller-manager) on loopback, and this machine as node `demo-node` (1 GiB)",
    );
    let started = Instant::now();
    let cluster = Cluster::start("demo-node", 1 << 30)
        .await
        .context("starting the cluster")?;
    println!(
        "   ready in {:.1} s; API server {}",
        started.elapsed().as_secs_f64(),
        cluster.cp.server()
    );
    let result = run(&cluster).await;
    say("6. cleaning up");
    cluster.stop().await?;
    println!("   stopped every process and removed every cgroup the demo created");
    result
}

async fn run(cluster: &Cluster) -> Result<()> {
    start_pods(cluster).await?;
    let node = cluster.node.clone();

    say("3. the agent: `node-monitor run` with evictionHard memory.available<300Mi");
    let mut agent = Agent::start(
        cluster,
        &format!(
            "evictionHard:\n  memory.available: {THRESHOLD_MI}Mi\nevictionPressureTransitionPeriod: 30s\n"
        ),
        &["--no-mlock"],
    )
    .await?;
    for line in agent
        .log()
        .lines()
        .filter(|l| l.contains("eBPF programs ready") || l.contains("eBPF program unavailable"))
    {
        println!("     {}", line.trim());
    }
    let available = cluster.settled_memory_available().await? / MI;
    println!(
        "   memory.available = {available}Mi of 1024Mi; metrics on 127.0.0.1:{}",
        agent.metrics_port
    );

    say(
        "4a. `capped` has a 32 MiB limit and touches 64 MiB: the kernel OOM-kills it inside its own limit",
    );
    cluster
        .create_pod(
            PodBuilder::workload("capped", &node, &["--hold", "64Mi"])
                .memory("32Mi", Some("32Mi"))
                .build(),
        )
        .await?;
    match agent
        .wait_log("kernel event: OOM kill", Duration::from_secs(30))
        .await
    {
        Ok(()) => {
            for line in agent
                .log()
                .lines()
                .filter(|l| l.contains("kernel event: OOM kill"))
                .take(1)
            {
                println!("     {}", line.trim());
            }
        }
        Err(e) => println!("   no OOM event from the kernel probe: {e:#}"),
    }

    say("4b. `leaky` (BestEffort) allocates 32 MiB every 100 ms");
    cluster
        .create_pod(PodBuilder::ramping("leaky", &node, "900Mi", "32Mi", "100ms").build())
        .await?;
    // Ground truth, independent of the agent: poll the node cgroup until memory.available
    // crosses the threshold, or leaky is gone before it does (a predicted eviction).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut lowest = i64::MAX;
    let mut looked = Instant::now();
    let crossed = loop {
        let available = cluster.memory_available()?;
        lowest = lowest.min(available);
        if available < THRESHOLD_MI * MI {
            break Some(SystemTime::now());
        }
        if looked.elapsed() > Duration::from_millis(100) {
            looked = Instant::now();
            if !cluster.is_live("default", "leaky").await? {
                break None;
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "memory.available never crossed the threshold and leaky was not evicted"
        );
        tokio::time::sleep(Duration::from_micros(500)).await;
    };
    match crossed {
        Some(_) => println!(
            "   memory.available crossed {THRESHOLD_MI}Mi (ground truth from the cgroup files)"
        ),
        None => println!(
            "   leaky was evicted before memory.available crossed {THRESHOLD_MI}Mi (lowest seen: \
             {}Mi): the agent predicted that the node would run out first",
            lowest / MI
        ),
    }
    let gone = cluster
        .wait_gone("default", "leaky", Duration::from_secs(60))
        .await?;
    anyhow::ensure!(gone.is_some(), "leaky was not evicted:\n{}", agent.log());

    what_happened(cluster, &agent, crossed).await?;
    agent.terminate()?;
    Ok(())
}

/// Step 2: pods through the stand-in, one per QoS class, two priorities.
async fn start_pods(cluster: &Cluster) -> Result<()> {
    say("2. pods through the stand-in: one per QoS class, two priorities");
    cluster
        .create_priority_class("business-critical", 100_000)
        .await?;
    let node = cluster.node.clone();
    let pods = [
        (
            PodBuilder::workload("database", &node, &["--hold", "150Mi"])
                .memory("200Mi", Some("200Mi"))
                .priority_class("business-critical"),
            "Guaranteed, priority 100000",
        ),
        (
            PodBuilder::workload("api", &node, &["--hold", "60Mi"]).memory("100Mi", None),
            "Burstable, under its request",
        ),
        (
            PodBuilder::workload("batch", &node, &["--hold", "40Mi"]),
            "BestEffort, steady",
        ),
    ];
    for (pod, what) in pods {
        let name = cluster.run_pod(pod).await?;
        println!("   {name:<10} Running   {what}");
    }
    Ok(())
}

/// Step 5: what the agent logged, the Event, the node's conditions, the pods left, the
/// reaction time from the ground truth's crossing, and the kernel's OOM kills.
async fn what_happened(
    cluster: &Cluster,
    agent: &Agent,
    crossed: Option<SystemTime>,
) -> Result<()> {
    say("5. what happened");
    let log = agent.log();
    println!("   the agent's log (wake-up, decision, eviction):");
    for line in log.lines().filter(|l| {
        l.contains("evicting")
            || l.contains("eviction answered")
            || l.contains("kernel event")
            || l.contains("processes are gone")
    }) {
        println!("     {}", line.trim());
    }
    let events = cluster.events("default", "leaky", "Evicted").await?;
    if let Some(e) = events.first() {
        println!(
            "   Event on pod default/leaky: reason=Evicted source={:?}",
            e.source
                .as_ref()
                .and_then(|s| s.component.clone())
                .unwrap_or_default()
        );
        println!("     \"{}\"", e.message.clone().unwrap_or_default());
    }
    let nodes: Api<Node> = Api::all(cluster.client());
    let n = nodes.get(&cluster.node).await?;
    for c in n.status.and_then(|s| s.conditions).unwrap_or_default() {
        if c.type_.starts_with("NodeMonitor") || c.type_ == "Ready" {
            println!(
                "   node condition {:<28} {}  {}",
                c.type_,
                c.status,
                c.message.unwrap_or_default()
            );
        }
    }
    for name in ["database", "api", "batch"] {
        let live = cluster.is_live("default", name).await?;
        println!(
            "   {name:<10} {}",
            if live { "still Running" } else { "GONE" }
        );
    }
    // Reaction time: ground-truth crossing → the agent sending the eviction (its log timestamp).
    if let Some(ts) = log
        .lines()
        .find(|l| l.contains("evicting"))
        .and_then(|l| l.split_whitespace().next())
        && let Ok(t) = ts.parse::<jiff_ts::Timestamp>()
        && let Some(crossed) = crossed
    {
        let sent = SystemTime::from(t);
        match sent.duration_since(crossed) {
            Ok(d) => println!(
                "   reaction: eviction sent {:.1} ms after memory.available crossed the threshold (the kubelet polls every 10 s)",
                d.as_secs_f64() * 1e3
            ),
            Err(e) => println!(
                "   reaction: eviction sent {:.1} ms before the ground-truth sampler saw the crossing",
                e.duration().as_secs_f64() * 1e3
            ),
        }
    }
    let kills = cluster
        .oom_kills()
        .map_or_else(|e| format!("? ({e:#})"), |n| n.to_string());
    println!("   kernel OOM kills in the node: {kills}");
    let evicted = agent
        .metric_sum("node_monitor_evictions_total", &[("outcome", "evicted")])
        .await?;
    println!("   node_monitor_evictions_total{{outcome=\"evicted\"}} = {evicted}");
    Ok(())
}

/// Timestamps in the agent's log are RFC 3339 (tracing's default formatter, UTC).
mod jiff_ts {
    pub use k8s_openapi::jiff::Timestamp;
}
