//! The kubelet's own graceful node shutdown on the real node, on the pods and periods of
//! node-monitor's drain in the real-node tier (`node_monitor_tests::real_node::shutdown`): two
//! regular pods and a `system-node-critical` one, each exiting 3 s after SIGTERM, and
//! `shutdownGracePeriod: 120s`, `shutdownGracePeriodCriticalPods: 30s` in the kubelet's
//! configuration (`shutdown::PERIODS`). node-monitor is installed from `deploy/kustomize/base` (no shutdown role), so
//! the kubelet's manager alone acts when the guest powers off through logind.
//!
//! Per run, one boot of the real node (`--runs`). Printed: logind's `InhibitDelayMaxSec` (the
//! kubelet's drop-in), when each pod reached a terminal phase and why, when the node went
//! NotReady, when the kubelet's lock was released and qemu exited (the host's clock, the API
//! polled every 100 ms), and the pods the kubelet leaves in the API. The run fails if the
//! comparison's premise does not hold: the node never went NotReady for the shutdown, or a pod
//! never ended.
//!
//! ```sh
//! cargo bins && cargo xtask image workload --profile debug && cargo xtask image node-monitor \
//!   --profile debug && cargo xtask image pause --binary ~/.cache/node-monitor/node/current/pause
//! KUBEBUILDER_ASSETS=~/.cache/node-monitor/control-plane/current \
//!   flock /tmp/nm-vm.lock target/debug/bench-real-shutdown --runs 1
//! ```
//! (`cargo xtask bench real-shutdown` does the same.) node-monitor's side of the table comes from
//! the real-node tier's drain (`real_node_shutdown.rs`). Results: docs/benchmarks.md, "Graceful
//! shutdown on the real node".
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Result, bail, ensure};
use clap::Parser;
use node_monitor_tests::real_node::{
    RealNodeOptions,
    scenario::{Installed, install},
    shutdown::{
        PERIODS, PODS, Seen, create_pods, left_behind, lock_held, power_off, secs, until_gone,
        watch,
    },
};

#[derive(Parser, Debug)]
#[command(about = "The kubelet's graceful node shutdown on the real node")]
struct Args {
    /// Boots of the real node, one shutdown each (1–20).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
}

/// One boot: install, create the pods, wait for the kubelet's lock, power off, and report.
async fn run(i: u32) -> Result<()> {
    let Installed {
        cp,
        client,
        mut node,
        ..
    } = install(
        "base",
        None,
        &RealNodeOptions {
            kubelet_config_extra: PERIODS.to_owned(),
            ..RealNodeOptions::default()
        },
    )
    .await;
    create_pods(&client, &node).await;
    let delay = lock_held(&mut node, "kubelet").await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let watcher = watch(client.clone(), seen.clone());
    let requested = Instant::now();
    power_off(&mut node, "kubelet", None).await;
    let (released, exited) = until_gone(&node, Duration::from_secs(240)).await;
    // The API's last word on the pods, after the node is gone.
    tokio::time::sleep(Duration::from_secs(1)).await;
    watcher.abort();
    let left = left_behind(&client).await;
    let report = node.report();
    node.finish().await?;
    let seen = seen
        .lock()
        .map_err(|_| anyhow::anyhow!("the watch panicked"))?;

    // What the comparison rests on: the kubelet's own manager ran. It marked the node and
    // terminated the pods.
    let Some((_, why)) = seen.not_ready.clone() else {
        bail!("run {i}: the node never turned NotReady\n{report}");
    };
    ensure!(
        why.contains("shutting down"),
        "run {i}: the node went NotReady for another reason: {why:?}\n{report}"
    );
    for (_, name, _) in PODS {
        ensure!(
            seen.terminal.contains_key(name),
            "run {i}: pod {name} never ended under the kubelet's shutdown manager: {:?} \
             {left:?}\n{report}",
            seen.terminal
        );
    }

    println!("run {i}: graceful shutdown by the kubelet (host clock, API polled every 100 ms):");
    println!("  logind InhibitDelayMaxSec {delay:.0}s (the kubelet's drop-in)");
    for (_, name, critical) in PODS {
        let (at, why) = &seen.terminal[name];
        println!(
            "  {} {name}: {why}, {:.2}s after the power-off",
            if critical { "critical" } else { "regular" },
            secs(at.duration_since(requested))
        );
    }
    if let Some((at, why)) = &seen.not_ready {
        println!(
            "  node NotReady {:.2}s after the power-off ({why})",
            secs(at.duration_since(requested))
        );
    }
    println!(
        "  lock released {}; qemu exited {:.2}s after the power-off; pods left behind: {} \
         ({left:?})",
        released.map_or("unseen".to_owned(), |r| format!(
            "{:.2}s after the power-off",
            secs(r.duration_since(requested))
        )),
        secs(exited.duration_since(requested)),
        left.len()
    );
    drop(seen);
    cp.stop()?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    for i in 1..=args.runs {
        run(i).await?;
    }
    Ok(())
}
