//! Graceful node shutdown on the real node (see `real_node.rs` and
//! `node_monitor_tests::real_node::shutdown`): the real kubelet and containerd in the guest,
//! systemd-logind delivering PrepareForShutdown when the guest powers off, node-monitor draining
//! the pods by priority group with the kubelet's periods (`shutdownGracePeriod: 120s`,
//! `shutdownGracePeriodCriticalPods: 30s`: `shutdown::PERIODS`).
//!
//! The drain is the last phase of a scenario that installed node-monitor with graceful shutdown
//! on (`real_node::a_k3s_node_under_disk_and_pid_pressure_then_powered_off`, whose boot it shares:
//! a power-off ends a guest). The kubelet's own GracefulNodeShutdown on the same pods, for the
//! side-by-side figures, is `bench-real-shutdown` (`cargo xtask bench real-shutdown`): it tests
//! the kubelet, not node-monitor.
//!
//! Every figure goes to stderr for docs/benchmarks.md ("Graceful shutdown on the real node").
//! Run under `flock /tmp/nm-vm.lock` like the real-node tier; fails, never skips.
use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use kube::Client;
use node_monitor_tests::{
    control_plane::ControlPlane,
    real_node::{
        RealNode,
        scenario::fail,
        shutdown::{
            GROUP_PERIODS_S, PODS, Seen, create_pods, left_behind, lock_held, lock_story, phases,
            power_off, release_seen, secs, watch,
        },
    },
};

/// The last phase of a real-node scenario whose agent runs with graceful shutdown on (the
/// chart's `shutdown.enabled`, or `deploy/kustomize/overlays/shutdown`) and whose kubelet's
/// GracefulNodeShutdown is off (its default): the pods are created, the guest powers off, and
/// node-monitor's lock delays the power-off while it drains them by priority group. The regular
/// pods are gone from the API (the kubelet stopped their real containers and confirmed it)
/// before a critical pod is touched; every pod is gone from the API when the lock is released,
/// and none is left behind in Failed or Error. Prints the figures for docs/benchmarks.md
/// ("Graceful shutdown on the real node").
pub async fn node_monitor_drains_real_containers_by_priority_group_before_the_node_goes(
    cp: ControlPlane,
    client: &Client,
    mut node: RealNode,
    agent_ip: &str,
) {
    let client = client.clone();
    create_pods(&client, &node).await;
    let delay = lock_held(&mut node, "node-monitor").await;
    let inhibitors = node.read_out("inhibitors-node-monitor").unwrap_or_default();
    assert!(
        !inhibitors.contains("kubelet"),
        "the kubelet's GracefulNodeShutdown is off here, yet it holds a lock:\n{inhibitors}"
    );

    let seen = Arc::new(Mutex::new(Seen::default()));
    let watcher = watch(client.clone(), seen.clone());
    let requested = Instant::now();
    power_off(&mut node, "node-monitor", Some(agent_ip)).await;
    let deadline = Instant::now() + Duration::from_secs(240);
    // At the release, before the host can be late: no scenario pod may be left in the API.
    let mut released = None;
    let mut at_release = Vec::new();
    while node.running() {
        if released.is_none() && release_seen(&node) {
            released = Some(Instant::now());
            at_release = left_behind(&client).await;
        }
        if Instant::now() > deadline {
            fail(&node, "the guest still up 240 s after the power-off");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let exited = Instant::now();
    watcher.abort();
    let left = left_behind(&client).await;
    // The watcher may write its file in the last poll interval before qemu exits: then the
    // release is known only to have come before the exit, with the pods left at the exit.
    if released.is_none() && release_seen(&node) {
        released = Some(exited);
        at_release.clone_from(&left);
    }
    let report = node.report();
    let lock_story = lock_story(&node, exited.duration_since(requested), delay);
    let run = node.finish().await.expect("guest run");
    let m = run.read_out("shutdown-metrics.txt").unwrap_or_default();
    let seen = seen.lock().expect("seen");

    let released = released.unwrap_or_else(|| {
        panic!("node-monitor's lock was never seen released\n{lock_story}\n{report}")
    });
    assert!(
        at_release.is_empty(),
        "pods still in the API when node-monitor released its lock: {at_release:?}\n{report}"
    );
    assert!(
        left.is_empty(),
        "pods left behind after the node went: {left:?}\n{report}"
    );
    assert!(
        seen.marked.is_some(),
        "NodeMonitorShuttingDown=True never seen\n{report}"
    );
    // The regular pods are gone before a critical pod is deleted.
    let group_end = |critical: bool| {
        PODS.iter()
            .filter(|p| p.2 == critical)
            .map(|p| {
                *seen
                    .gone
                    .get(p.1)
                    .unwrap_or_else(|| panic!("pod {} never seen gone\n{report}", p.1))
            })
            .max()
            .expect("pods")
    };
    let group_start = |critical: bool| {
        PODS.iter()
            .filter(|p| p.2 == critical)
            .map(|p| *seen.deleting.get(p.1).or(seen.gone.get(p.1)).expect("seen"))
            .min()
            .expect("pods")
    };
    let (regular_end, critical_start) = (group_end(false), group_start(true));
    assert!(
        regular_end <= critical_start,
        "a critical pod was deleted before the regular pods were gone"
    );
    // The agent's record of its phases: each group within its period, in order.
    let starts = phases(&m, "node_monitor_shutdown_phase_start_time_seconds");
    let ends = phases(&m, "node_monitor_shutdown_phase_end_time_seconds");
    let mut groups: Vec<(String, f64, f64)> = starts
        .iter()
        .filter(|(p, _)| p.starts_with("priority_"))
        .filter_map(|(p, s)| Some((p.clone(), *s, *ends.get(p)?)))
        .collect();
    groups.sort_by(|a, b| a.1.total_cmp(&b.1));
    assert!(
        groups.len() >= 2,
        "the agent's metrics lack the two groups' phases: {starts:?} {ends:?}\n{m}"
    );
    for (w, period) in groups.windows(2).zip(GROUP_PERIODS_S) {
        assert!(w[0].2 <= w[1].1, "groups overlap: {groups:?}");
        assert!(
            w[0].2 - w[0].1 <= period,
            "{} took {:.1}s, past its {period}s",
            w[0].0,
            w[0].2 - w[0].1
        );
    }

    eprintln!(
        "real node, graceful shutdown by node-monitor (host clock, API polled every 100 ms):"
    );
    eprintln!("  logind InhibitDelayMaxSec {delay:.0}s (node-monitor's drop-in)");
    for critical in [false, true] {
        let (start, end) = (group_start(critical), group_end(critical));
        eprintln!(
            "  {} pods: deleted {:.2}s after the power-off, gone {:.2}s after (group {:.2}s)",
            if critical { "critical" } else { "regular" },
            secs(start.duration_since(requested)),
            secs(end.duration_since(requested)),
            secs(end.duration_since(start))
        );
    }
    for (p, s, e) in groups.iter().filter(|g| g.2 > 0.0) {
        eprintln!("  agent metrics {p}: {:.2}s", e - s);
    }
    eprintln!(
        "  lock released {:.2}s after the power-off; qemu exited {:.2}s after; pods left behind: {}",
        secs(released.duration_since(requested)),
        secs(exited.duration_since(requested)),
        left.len()
    );
    drop(seen);
    cp.stop().expect("stop control plane");
}
