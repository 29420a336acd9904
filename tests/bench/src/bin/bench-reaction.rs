//! Reaction-time benchmark: from the moment memory.available truly crosses the hard threshold
//! (ground truth: an independent sampler thread reading the node cgroup every 200 µs) to the
//! eviction request arriving at the API server (`requestReceivedTimestamp` in kube-apiserver's own
//! audit log). The same agent binary runs in two modes, alternating in one run: push (kernel and
//! cgroup wake-ups) and `--polling-only` (the kubelet's 10 s housekeeping poll).
//!
//! ```text
//! cargo bins && target/debug/bench-reaction --runs 20
//! # with 250 idle pods beside the ramp, push mode only:
//! target/debug/bench-reaction --runs 10 --pods 250 --push-only
//! ```
use std::{
    fs,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use k8s_openapi::jiff::Timestamp;
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    e2e::{Agent, Cluster},
    pod::PodBuilder,
    standin::{StandIn, StandInConfig},
};

#[derive(Parser)]
struct Args {
    /// Runs per mode.
    #[arg(long, default_value_t = 20)]
    runs: usize,
    /// Hard threshold (MiB) on a 1 GiB node.
    #[arg(long, default_value_t = 300)]
    threshold_mi: i64,
    /// Print the agent's log of every push run slower than this (ms), to see where the time went.
    #[arg(long)]
    show_log_over_ms: Option<f64>,
    /// Idle pods on the node besides the one that ramps (each a process holding 1 MiB): the
    /// decision ranks them all, and the sampler reads each one's cgroup.
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// Skip the polling runs (the kubelet's 10 s tick does not depend on the pod count).
    #[arg(long)]
    push_only: bool,
}

/// Node memory per idle pod: its 1 MiB, the workload process and the pod cgroup's overhead,
/// with room, so the crossing is still the ramp's.
const NODE_MEMORY_PER_IDLE_POD: u64 = 4 << 20;

const MI: i64 = 1 << 20;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    node_monitor_tests::cgroup::require_root("bench-reaction");
    let dir = tempfile::tempdir()?;
    let policy = dir.path().join("audit-policy.yaml");
    fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [ResponseStarted, ResponseComplete, Panic]\nrules:\n- level: Metadata\n  resources:\n  - group: \"\"\n    resources: [\"pods/eviction\"]\n- level: None\n",
    )?;
    let audit = dir.path().join("audit.log");
    let cp = ControlPlane::start(
        ControlPlaneOptions::default()
            .apiserver_arg(format!("--audit-policy-file={}", policy.display()))
            .apiserver_arg(format!("--audit-log-path={}", audit.display())),
    )
    .await?;
    let node = "bench-node";
    let node_cgroup = format!("node-monitor-test/{node}-{}", std::process::id());
    let mut standin_config = StandInConfig::new(node, &node_cgroup)
        .memory((1 << 30) + NODE_MEMORY_PER_IDLE_POD * u64::try_from(args.pods)?);
    standin_config.max_pods = u32::try_from(args.pods + 10)?;
    let standin = StandIn::start(cp.client(), standin_config).await?;
    standin.wait_ready(Duration::from_secs(60)).await?;
    let cluster = Cluster {
        cp,
        standin: Some(standin),
        node: node.into(),
        node_cgroup: node_cgroup.into(),
    };
    let result = match start_idle_pods(&cluster, args.pods).await {
        Ok(()) => bench(&cluster, &args, &audit).await,
        Err(e) => Err(e),
    };
    cluster.stop().await?;
    result
}

/// `n` BestEffort pods that each hold 1 MiB: ranked behind the ramp, which uses far more.
async fn start_idle_pods(cluster: &Cluster, n: usize) -> Result<()> {
    let started = std::time::Instant::now();
    for i in 0..n {
        let pod =
            PodBuilder::workload(&format!("idle{i:03}"), &cluster.node, &["--hold", "1Mi"]).build();
        cluster.create_pod(pod).await?;
    }
    for i in 0..n {
        cluster
            .wait_running("default", &format!("idle{i:03}"), Duration::from_secs(300))
            .await?;
    }
    if n > 0 {
        println!(
            "{n} idle pods running after {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

async fn bench(cluster: &Cluster, args: &Args, audit: &std::path::Path) -> Result<()> {
    let config = format!(
        "evictionHard:\n  memory.available: {}Mi\n",
        args.threshold_mi
    );
    let mut push = Vec::new();
    let mut polling = Vec::new();
    // The agent's own wake-up → decision times (its `decided_us` log field), split into the time a
    // wake-up queued behind the previous cycle (`queued_us`) and the cycle's own work, from its start
    // to the decision (`processing_us`); in ms.
    let mut decided = Vec::new();
    let mut queued = Vec::new();
    let mut processing = Vec::new();
    for run in 0..args.runs {
        for (mode, extra, out) in [
            ("push", &["--no-mlock"][..], &mut push),
            (
                "polling",
                &["--no-mlock", "--polling-only"][..],
                &mut polling,
            ),
        ] {
            if mode == "polling" && args.push_only {
                continue;
            }
            let mut agent = Agent::spawn(cluster, &config, extra)?;
            agent.wait_log("deciding", Duration::from_secs(30)).await?;
            let name = format!("ramp-{mode}-{run}");
            let ms = one_run(cluster, &name, args.threshold_mi, audit)
                .await
                .with_context(|| format!("{name}:\n{}", agent.log()))?;
            println!("{mode:>8} run {run:>2}: {ms:>9.2} ms");
            if mode == "push" && args.show_log_over_ms.is_some_and(|limit| ms > limit) {
                println!("{}", agent.log());
            }
            out.push(ms);
            if mode == "push" {
                let log = agent.log();
                for (field, out) in [
                    ("decided_us=", &mut decided),
                    ("queued_us=", &mut queued),
                    ("processing_us=", &mut processing),
                ] {
                    out.extend(log.lines().filter_map(|l| log_field_ms(l, field)));
                }
            }
            agent.terminate()?;
        }
    }
    report("push (node-monitor)", &mut push);
    report("polling (10 s)", &mut polling);
    report("wake-up -> decision", &mut decided);
    report("  queued behind a cycle", &mut queued);
    report("  cycle start -> decision", &mut processing);
    Ok(())
}

/// A `field=<µs>` value of one of the agent's log lines, in ms.
fn log_field_ms(line: &str, field: &str) -> Option<f64> {
    let v = line.split(field).nth(1)?.split_whitespace().next()?;
    v.parse::<f64>().ok().map(|us| us / 1e3)
}

/// One crossing: a BestEffort pod ramps to 150 MiB past the threshold and holds (it never reaches
/// the node's limit, so polling mode is measured, not OOM-killed).
async fn one_run(
    cluster: &Cluster,
    name: &str,
    threshold_mi: i64,
    audit: &std::path::Path,
) -> Result<f64> {
    let available = cluster.settled_memory_available().await? / MI;
    let target = available - threshold_mi + 150;
    if target < 32 {
        bail!("node already near the threshold: {available}Mi available");
    }
    // Ground truth on its own thread, so the async runtime's scheduling does not skew it.
    let stop = Arc::new(AtomicBool::new(false));
    let dir = cluster.node_memory_dir();
    let limit = threshold_mi * MI;
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || -> Option<SystemTime> {
            let read = |f: &str| fs::read_to_string(dir.join(f)).ok();
            while !stop.load(Ordering::Relaxed) {
                let (Some(l), Some(u), Some(st)) = (
                    read("memory.limit_in_bytes"),
                    read("memory.usage_in_bytes"),
                    read("memory.stat"),
                ) else {
                    return None;
                };
                let l: i64 = l.trim().parse().ok()?;
                let u: i64 = u.trim().parse().ok()?;
                let inactive: i64 = st
                    .lines()
                    .find_map(|x| x.strip_prefix("total_inactive_file "))?
                    .trim()
                    .parse()
                    .ok()?;
                if l - (u - inactive).max(0) < limit {
                    return Some(SystemTime::now());
                }
                std::thread::sleep(Duration::from_micros(200));
            }
            None
        })
    };
    let pod = PodBuilder::workload(
        name,
        &cluster.node,
        &[
            "--ramp-to",
            &format!("{target}Mi"),
            "--step",
            "16Mi",
            "--interval",
            "20ms",
        ],
    )
    .build();
    cluster.create_pod(pod).await?;
    let gone = cluster
        .wait_gone("default", name, Duration::from_secs(40))
        .await?;
    stop.store(true, Ordering::Relaxed);
    let crossed = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("sampler panicked"))?
        .context("the crossing was not observed")?;
    if gone.is_none() {
        bail!("{name} was not evicted within 40 s");
    }
    let received = audit_received(audit, name)?.context("no eviction in the audit log")?;
    let d = match received.duration_since(crossed) {
        Ok(d) => d.as_secs_f64() * 1e3,
        Err(e) => -e.duration().as_secs_f64() * 1e3,
    };
    // Let the node settle before the next run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(d)
}

/// `requestReceivedTimestamp` of the eviction of `pod` in the audit log.
fn audit_received(audit: &std::path::Path, pod: &str) -> Result<Option<SystemTime>> {
    let text = fs::read_to_string(audit).context("audit log")?;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        let obj = &v["objectRef"];
        if obj["subresource"] == "eviction" && obj["name"] == pod {
            let ts: Timestamp = v["requestReceivedTimestamp"]
                .as_str()
                .context("timestamp")?
                .parse()?;
            return Ok(Some(SystemTime::from(ts)));
        }
    }
    Ok(None)
}

fn report(label: &str, v: &mut [f64]) {
    if v.is_empty() {
        println!("{label:<26} no samples");
        return;
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "{label:<26} n={:>3}  p50={:>9.2} ms  p99={:>9.2} ms  min={:>9.2} ms  max={:>9.2} ms",
        v.len(),
        q(0.5),
        q(0.99),
        v[0],
        v[v.len() - 1]
    );
}
