//! Spike survival on the real node: allocation ramps of several speeds in a real container, with
//! the kubelet alone and with node-monitor beside it.
//!
//! Each contender gets its own boot of the real node (`node_monitor_tests::real_node`: the real
//! kubelet and containerd in the guest, 2 GiB, cgroup v2, no swap) with node-monitor installed
//! from `deploy/kustomize/base`:
//!
//! - `kubelet`: node-monitor in dry run (it decides, evicts nothing), so the kubelet's own
//!   eviction manager (its defaults: `memory.available<100Mi`, a 10 s housekeeping poll) and the
//!   kernel's OOM killer are all that act;
//! - `node-monitor`: node-monitor evicting at `memory.available<500Mi` (the threshold the
//!   real-node tier uses on this 2 GiB node), the kubelet unchanged beside it.
//!
//! For each speed, one BestEffort pod ramps its resident memory by `step` every 100 ms up to
//! 3 GiB (more than the node has), and the host watches the API: who evicted it and when, when
//! its container ended (OOMKilled by the kernel or stopped after an eviction), and the guest's
//! kernel OOM kill count before and after. Times are from the pod's start (Running) on the host
//! clock, the API polled every 200 ms.
//!
//! ```sh
//! cargo bins && cargo xtask image workload --profile debug && cargo xtask image node-monitor \
//!   && cargo xtask image pause --binary ~/.cache/node-monitor/node/current/pause
//! KUBEBUILDER_ASSETS=~/.cache/node-monitor/control-plane/current \
//!   flock /tmp/nm-vm.lock target/debug/bench-real-spike
//! ```
//! (`cargo xtask bench real-spike` does the same.) Results: docs/benchmarks.md, "Spike survival
//! on the real node".
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Parser;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use node_monitor_tests::real_node::{
    RealNode, RealNodeOptions,
    scenario::{Installed, NS, evictions_of, guest_oom_kills, install, workload},
};

#[derive(Parser, Debug)]
#[command(
    about = "Spike survival on the real node: the kubelet alone against the kubelet and node-monitor"
)]
struct Args {
    /// Ramp steps per 100 ms (quantities), one run each.
    #[arg(long, value_delimiter = ',', default_values = ["16Mi", "64Mi", "256Mi"])]
    steps: Vec<String>,
    /// Contenders: `kubelet`, `node-monitor`.
    #[arg(long, value_delimiter = ',', default_values = ["kubelet", "node-monitor"])]
    contenders: Vec<String>,
}

/// node-monitor's configuration for a contender.
fn config(contender: &str) -> String {
    let dry_run = contender == "kubelet";
    format!(
        "evictionHard:\n  memory.available: \"500Mi\"\n  nodefs.available: \"10%\"\n  \
         imagefs.available: \"15%\"\nnodeMonitor:\n  maxPodsPerCycle: 1\n  dryRun: {dry_run}\n"
    )
}

/// One ramp's outcome.
#[derive(Debug)]
struct Outcome {
    contender: String,
    step: String,
    evicted_by: Vec<String>,
    evicted_at: Option<f64>,
    ended_at: Option<f64>,
    end_reason: String,
    oom_kills: u64,
}

/// How the ramp pod's container ended, once it has: (reason, exit code).
fn ended(p: &Pod) -> Option<String> {
    let status = p.status.as_ref()?;
    let c = status.container_statuses.as_ref()?.first()?;
    let t = c.state.as_ref()?.terminated.as_ref()?;
    Some(format!(
        "{} (exit {})",
        t.reason.clone().unwrap_or_default(),
        t.exit_code
    ))
}

async fn ramp(
    client: &Client,
    node: &mut RealNode,
    contender: &str,
    step: &str,
    n: usize,
) -> Result<Outcome> {
    let name = format!("spike-{n}");
    let before = guest_oom_kills(node).await;
    let p = workload(
        &name,
        &[
            "/usr/local/bin/nm-workload",
            "--ramp-to",
            "3Gi",
            "--step",
            step,
            "--interval",
            "100ms",
        ],
    )
    .build();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &p).await?;
    // From the moment the host sees the container run (or end: a fast ramp can be killed
    // before a poll sees it running).
    let created = Instant::now();
    loop {
        let phase = pods
            .get(&name)
            .await?
            .status
            .and_then(|s| s.phase)
            .unwrap_or_default();
        if phase != "Pending" && !phase.is_empty() {
            break;
        }
        anyhow::ensure!(
            created.elapsed() < Duration::from_secs(300) && node.running(),
            "pod {name} never started"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let started = Instant::now();
    let mut evicted_at = None;
    let mut evicted_by = Vec::new();
    let mut ended_at = None;
    let mut end_reason = String::from("still running");
    while started.elapsed() < Duration::from_secs(180) {
        if evicted_at.is_none() {
            let by = evictions_of(client, &name).await;
            if !by.is_empty() {
                evicted_at = Some(started.elapsed().as_secs_f64());
                evicted_by = by;
            }
        }
        match pods.get_opt(&name).await? {
            None => {
                ended_at.get_or_insert(started.elapsed().as_secs_f64());
                end_reason = "gone from the API".into();
            }
            Some(p) => {
                if let Some(r) = ended(&p) {
                    ended_at.get_or_insert(started.elapsed().as_secs_f64());
                    end_reason = r;
                }
            }
        }
        if ended_at.is_some()
            && (evicted_at.is_some() || started.elapsed() > Duration::from_secs(30))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Settle: the pod deleted, memory back, before the next ramp.
    let _ = pods.delete(&name, &DeleteParams::default()).await;
    while pods.get_opt(&name).await?.is_some() && started.elapsed() < Duration::from_secs(300) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after = guest_oom_kills(node).await;
    Ok(Outcome {
        contender: contender.to_owned(),
        step: step.to_owned(),
        evicted_by,
        evicted_at,
        ended_at,
        end_reason,
        oom_kills: after.saturating_sub(before),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let mut outcomes = Vec::new();
    let mut n = 0;
    for contender in &args.contenders {
        anyhow::ensure!(
            matches!(contender.as_str(), "kubelet" | "node-monitor"),
            "--contenders: unknown contender {contender:?} (kubelet, node-monitor)"
        );
        let Installed {
            cp,
            client,
            mut node,
            ..
        } = install(
            "base",
            Some(&config(contender)),
            &RealNodeOptions::default(),
        )
        .await;
        for step in &args.steps {
            n += 1;
            let o = ramp(&client, &mut node, contender, step, n)
                .await
                .with_context(|| format!("{contender}, step {step}"))?;
            eprintln!("{o:?}");
            outcomes.push(o);
        }
        node.finish().await.context("guest run")?;
        cp.stop().context("stop control plane")?;
    }
    let secs = |v: Option<f64>| v.map_or("-".to_owned(), |s| format!("{s:.1} s"));
    println!(
        "| contender | step / 100 ms | evicted by | evicted at | container ended | how | kernel OOM kills |"
    );
    println!("|---|---|---|---|---|---|---|");
    for o in &outcomes {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            o.contender,
            o.step,
            if o.evicted_by.is_empty() {
                "-".to_owned()
            } else {
                o.evicted_by.join(", ")
            },
            secs(o.evicted_at),
            secs(o.ended_at),
            o.end_reason,
            o.oom_kills
        );
    }
    Ok(())
}
