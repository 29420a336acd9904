//! Graceful node shutdown on the real node (see `real_node.rs` and
//! `node_monitor_tests::real_node`): the real kubelet and containerd in the guest, systemd-logind
//! delivering PrepareForShutdown when the guest powers off, and the same pods and periods
//! (`shutdownGracePeriod: 30s`, `shutdownGracePeriodCriticalPods: 10s`) under each manager:
//!
//! 1. `node_monitor_drains_real_containers_by_priority_group_before_the_node_goes`: node-monitor
//!    installed from `deploy/kustomize/overlays/shutdown` exactly as shipped, the kubelet's own
//!    GracefulNodeShutdown off (its default). node-monitor's lock delays the power-off; the
//!    regular pods are deleted first and are gone from the API (the kubelet stopped their real
//!    containers and confirmed it) before a critical pod is touched; every pod is gone from the
//!    API when the lock is released, and none is left behind in Failed or Error.
//! 2. `the_kubelets_graceful_node_shutdown_on_the_same_pods`: the base manifests (no shutdown
//!    role for node-monitor) and the kubelet's GracefulNodeShutdown with the same periods, for
//!    the side-by-side figures: the kubelet kills the same containers by group but leaves every
//!    pod in the API in a terminal phase (Succeeded here, as the containers exit 0 on SIGTERM;
//!    Failed for one that does not), for its controller or the pod garbage collector.
//!
//! Every figure goes to stderr for docs/benchmarks.md ("Graceful shutdown on the real node").
//! Run under `flock /tmp/nm-vm.lock` like the real-node tier; fails, never skips.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, api::ListParams};
use node_monitor_tests::{
    metrics,
    real_node::{
        NODE, RealNode, RealNodeOptions,
        scenario::{Installed, NS, create_running, fail, guest_step, install, workload},
    },
};

/// The label on the scenario's pods.
const LABEL: (&str, &str) = ("nm-shutdown", "pod");
/// The kubelet's two shutdown fields, the same for both managers: regular pods get 20 s, then
/// critical pods 10 s.
const PERIODS: &str = "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s";
/// Seconds each pod takes to exit after SIGTERM, as a server finishing its requests.
const TERM_DELAY: &str = "3s";
/// The pods: (namespace, name, critical).
const PODS: [(&str, &str, bool); 3] = [
    (NS, "web-a", false),
    (NS, "web-b", false),
    ("kube-system", "node-agent", true),
];

/// What the host saw of the pods and the node while the guest shut down (host clock).
#[derive(Debug, Default)]
struct Seen {
    /// First time each pod had a deletionTimestamp.
    deleting: BTreeMap<String, Instant>,
    /// First time each pod was in a terminal phase (Failed, Succeeded), with the phase, its
    /// reason and message.
    terminal: BTreeMap<String, (Instant, String)>,
    /// First time each pod was missing from the API.
    gone: BTreeMap<String, Instant>,
    /// First time the node's Ready condition was not True, with its message.
    not_ready: Option<(Instant, String)>,
    /// First time node-monitor's NodeMonitorShuttingDown condition was True.
    marked: Option<Instant>,
}

/// Polls the pods and the node every 100 ms into `seen` until the task is aborted.
fn watch(client: Client, seen: Arc<Mutex<Seen>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::all(client.clone());
        let nodes: Api<Node> = Api::all(client);
        let lp = ListParams::default().labels(&format!("{}={}", LABEL.0, LABEL.1));
        loop {
            let now = Instant::now();
            if let Ok(list) = pods.list(&lp).await {
                let mut s = seen.lock().expect("seen");
                for (_, name, _) in PODS {
                    match list
                        .items
                        .iter()
                        .find(|p| p.metadata.name.as_deref() == Some(name))
                    {
                        None => {
                            s.gone.entry(name.to_owned()).or_insert(now);
                        }
                        Some(p) => {
                            if p.metadata.deletion_timestamp.is_some() {
                                s.deleting.entry(name.to_owned()).or_insert(now);
                            }
                            let status = p.status.as_ref();
                            let phase = status.and_then(|st| st.phase.as_deref());
                            if let Some(phase @ ("Failed" | "Succeeded")) = phase {
                                let why = format!(
                                    "{phase} {}: {}",
                                    status.and_then(|st| st.reason.clone()).unwrap_or_default(),
                                    status.and_then(|st| st.message.clone()).unwrap_or_default()
                                );
                                s.terminal.entry(name.to_owned()).or_insert((now, why));
                            }
                        }
                    }
                }
            }
            if let Ok(Some(n)) = nodes.get_opt(NODE).await {
                let conditions = n.status.and_then(|st| st.conditions).unwrap_or_default();
                let mut s = seen.lock().expect("seen");
                if let Some(c) = conditions.iter().find(|c| c.type_ == "Ready")
                    && c.status != "True"
                    && s.not_ready.is_none()
                {
                    s.not_ready = Some((now, c.message.clone().unwrap_or_default()));
                }
                if conditions
                    .iter()
                    .any(|c| c.type_ == "NodeMonitorShuttingDown" && c.status == "True")
                {
                    s.marked.get_or_insert(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// Creates the scenario's pods and waits until they all run.
async fn create_pods(client: &Client, node: &RealNode) {
    for (ns, name, critical) in PODS {
        let mut p = workload(
            name,
            &["nm-workload", "--sleep", "--term-delay", TERM_DELAY],
        )
        .namespace(ns)
        .label(LABEL.0, LABEL.1)
        .termination_grace(30);
        if critical {
            p = p.priority_class("system-node-critical");
        }
        create_running(client, node, p.build()).await;
    }
}

/// Waits in the guest until `who` holds a shutdown delay lock and logind's `InhibitDelayMaxSec`
/// covers the 30 s of the periods; returns logind's delay in seconds.
async fn lock_held(node: &mut RealNode, who: &str) -> f64 {
    let script = format!(
        r#"delay() {{ busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec | cut -d' ' -f2; }}
until systemd-inhibit --list --no-pager | grep -q '{who}' && [ "$(delay)" -ge 30000000 ]; do sleep 0.5; done
systemd-inhibit --list --no-pager > /mnt/out/inhibitors-{who} 2>&1
delay"#
    );
    let out = guest_step(
        node,
        &format!("{who}'s lock"),
        &script,
        Duration::from_secs(240),
    )
    .await;
    let usec: f64 = out
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("InhibitDelayMaxUSec {out:?}: {e}"));
    usec / 1e6
}

/// Powers the guest off through logind, as `systemctl poweroff` does on a node. In the guest,
/// in units without default dependencies (the power-off stops them last, when it kills every
/// process left): a watcher that writes `/mnt/out/released` when `who`'s lock is gone (logind's
/// state file under /run/systemd/inhibit, which it removes at the release: no D-Bus call, which
/// could wait on a logind that is stopping), and
/// (`metrics_ip`) a dump of the agent's metrics every 300 ms. Returns when logind took the
/// request.
async fn power_off(node: &mut RealNode, who: &str, metrics_ip: Option<&str>) {
    let dump = metrics_ip.map_or_else(String::new, |ip| {
        format!(
            "systemd-run --unit=nm-metrics-dump -p DefaultDependencies=no bash -c 'source /mnt/host/step-lib.sh; while true; do get {ip} 9101 /metrics /mnt/out/.m && mv /mnt/out/.m /mnt/out/shutdown-metrics.txt; sleep 0.3; done'\n"
        )
    });
    // The watcher may be starved, and then killed with the last processes, on a loaded TCG
    // guest; a unit stopped at the start of the shutdown transaction (which logind starts right
    // after the lock goes, or when its delay ran out) records the lock's state then, before
    // /mnt/out is unmounted.
    let script = format!(
        r#"systemd-run --unit=nm-lock-watch -p DefaultDependencies=no bash -c 'while grep -qs -D skip ^WHO={who}$ /run/systemd/inhibit/*; do sleep 0.05; done; date +%s.%N > /mnt/out/.released && mv /mnt/out/.released /mnt/out/released && sync'
systemd-run --unit=nm-lock-at-stop -p RemainAfterExit=yes -p RequiresMountsFor=/mnt/out -p "ExecStop=/bin/bash -c 'if grep -qsx -D skip WHO={who} /run/systemd/inhibit/*; then echo held; else echo released; fi > /mnt/out/lock-at-stop; sync'" true
{dump}systemctl poweroff"#
    );
    guest_step(node, "power off", &script, Duration::from_secs(60)).await;
}

/// Has the guest seen `who`'s lock released: by the watcher, or at the start of the shutdown
/// transaction ([`power_off`])?
fn release_seen(node: &RealNode) -> bool {
    node.out_dir().join("released").exists()
        || node
            .read_out("lock-at-stop")
            .is_ok_and(|s| s.trim() == "released")
}

/// Waits for the guest to power off; returns when it saw the lock released (host clock), if
/// it did, and when qemu exited.
async fn until_gone(node: &RealNode, limit: Duration) -> (Option<Instant>, Instant) {
    let deadline = Instant::now() + limit;
    let mut released = None;
    while node.running() {
        if released.is_none() && release_seen(node) {
            released = Some(Instant::now());
        }
        if Instant::now() > deadline {
            fail(
                node,
                &format!("the guest still up {limit:?} after the power-off"),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (released, Instant::now())
}

/// What the guest shows of a lock that was never seen released: when qemu exited against
/// logind's delay, and the agent's own lines about the shutdown.
fn lock_story(node: &RealNode, exited: Duration, delay: f64) -> String {
    let mut out = format!(
        "qemu exited {:.1}s after the power-off; logind's delay is {delay:.0}s{}\n",
        secs(exited),
        if secs(exited) >= delay {
            " (logind ran out its delay: the lock was held to the end)"
        } else {
            ""
        }
    );
    out.push_str(&format!(
        "the lock at the start of the shutdown transaction: {}\n",
        node.read_out("lock-at-stop")
            .map_or_else(|_| "not recorded".to_owned(), |s| s.trim().to_owned())
    ));
    let logs = node.agent_logs();
    if let Some(text) = logs.last().and_then(|p| std::fs::read_to_string(p).ok()) {
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                ["shutdown", "inhibitor", "group", "logind", "stop"]
                    .iter()
                    .any(|k| l.contains(k))
            })
            .collect();
        out.push_str(&format!(
            "--- the agent's shutdown lines ({} of {}):\n{}\n",
            lines.len().min(30),
            lines.len(),
            lines[lines.len().saturating_sub(30)..].join("\n")
        ));
    }
    out
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The test pods still in the API, with their phases.
async fn left_behind(client: &Client) -> Vec<String> {
    let pods: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{}={}", LABEL.0, LABEL.1));
    pods.list(&lp)
        .await
        .expect("list pods")
        .items
        .iter()
        .map(|p| {
            format!(
                "{}/{} {}",
                p.metadata.namespace.as_deref().unwrap_or_default(),
                p.metadata.name.as_deref().unwrap_or_default(),
                p.status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .unwrap_or("?")
            )
        })
        .collect()
}

/// `family{phase="…"}` from the agent's metrics, by phase label.
fn phases(text: &str, family: &str) -> BTreeMap<String, f64> {
    metrics::parse(text)
        .expect("the agent's metrics")
        .into_iter()
        .filter(|s| s.name == family)
        .filter_map(|s| Some((s.labels.get("phase")?.clone(), s.value)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_monitor_drains_real_containers_by_priority_group_before_the_node_goes() {
    let Installed {
        cp,
        client,
        mut node,
        agent_ip,
        ..
    } = install("overlays/shutdown", None, &RealNodeOptions::default()).await;
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
    power_off(&mut node, "node-monitor", Some(&agent_ip)).await;
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
    for (w, period) in groups.windows(2).zip([20.0, 10.0]) {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_graceful_node_shutdown_on_the_same_pods() {
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
    let _run = node.finish().await.expect("guest run");
    let seen = seen.lock().expect("seen");

    // What the comparison rests on: the kubelet's own manager ran. It marked the node and
    // terminated the pods, which stay in the API in a terminal phase.
    let (_, why) = seen
        .not_ready
        .clone()
        .unwrap_or_else(|| panic!("the node never turned NotReady\n{report}"));
    assert!(
        why.contains("shutting down"),
        "the node went NotReady for another reason: {why:?}\n{report}"
    );
    for (_, name, _) in PODS {
        assert!(
            seen.terminal.contains_key(name),
            "pod {name} never ended under the kubelet's shutdown manager: {:?} {left:?}\n{report}",
            seen.terminal
        );
    }
    assert_eq!(
        left.len(),
        PODS.len(),
        "the kubelet leaves its terminated pods in the API: {left:?}"
    );

    eprintln!("real node, graceful shutdown by the kubelet (host clock, API polled every 100 ms):");
    eprintln!("  logind InhibitDelayMaxSec {delay:.0}s (the kubelet's drop-in)");
    for (_, name, critical) in PODS {
        let (at, why) = &seen.terminal[name];
        eprintln!(
            "  {} {name}: {why}, {:.2}s after the power-off",
            if critical { "critical" } else { "regular" },
            secs(at.duration_since(requested))
        );
    }
    if let Some((at, why)) = &seen.not_ready {
        eprintln!(
            "  node NotReady {:.2}s after the power-off ({why})",
            secs(at.duration_since(requested))
        );
    }
    eprintln!(
        "  lock released {}; qemu exited {:.2}s after the power-off; pods left behind: {} ({left:?})",
        released.map_or("unseen".to_owned(), |r| format!(
            "{:.2}s after the power-off",
            secs(r.duration_since(requested))
        )),
        secs(exited.duration_since(requested)),
        left.len()
    );
    drop(seen);
    cp.stop().expect("stop control plane");
}
