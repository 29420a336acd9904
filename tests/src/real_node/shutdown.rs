//! Graceful node shutdown on the real node, what its scenarios share: the pods (two regular, one
//! critical, each taking 3 s to exit after SIGTERM), the kubelet's two shutdown periods, a host
//! watch of the pods and the node every 100 ms, the power-off through logind with a watcher of
//! the delay lock in the guest, and what is left in the API afterwards. Used by the real-node
//! tier (node-monitor's drain, `tests/tests/real_node/real_node_shutdown.rs`) and by
//! `bench-real-shutdown` (the kubelet's own manager on the same pods, for the side-by-side
//! figures).
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, api::ListParams};

use super::{
    NODE, RealNode,
    scenario::{NS, create_running, fail, guest_step, workload},
};
use crate::metrics;

/// The label on the scenario's pods.
pub const LABEL: (&str, &str) = ("nm-shutdown", "pod");
/// The kubelet's two shutdown fields, the same for both managers: regular pods get 90 s, then
/// critical pods 30 s. Each group ends as soon as its pods are gone, so periods this long cost
/// nothing where the kubelet is quick; they keep a slow emulated guest (a container stopped and
/// its pod confirmed gone in 10–25 s here, three times that on a slower machine) inside them, so
/// that the order asserted is node-monitor's, not a race with the period.
pub const PERIODS: &str = "shutdownGracePeriod: 120s\nshutdownGracePeriodCriticalPods: 30s";
/// The same, as the chart's `--set` values.
pub const PERIODS_SET: [&str; 2] = [
    "shutdown.config.shutdownGracePeriod=120s",
    "shutdown.config.shutdownGracePeriodCriticalPods=30s",
];
/// Each group's period in seconds: regular, then critical.
pub const GROUP_PERIODS_S: [f64; 2] = [90.0, 30.0];
/// Seconds each pod takes to exit after SIGTERM, as a server finishing its requests.
pub const TERM_DELAY: &str = "3s";
/// The pods: (namespace, name, critical).
pub const PODS: [(&str, &str, bool); 3] = [
    (NS, "web-a", false),
    (NS, "web-b", false),
    ("kube-system", "node-agent", true),
];

/// What the host saw of the pods and the node while the guest shut down (host clock).
#[derive(Debug, Default)]
pub struct Seen {
    /// First time each pod had a deletionTimestamp.
    pub deleting: BTreeMap<String, Instant>,
    /// First time each pod was in a terminal phase (Failed, Succeeded), with the phase, its
    /// reason and message.
    pub terminal: BTreeMap<String, (Instant, String)>,
    /// First time each pod was missing from the API.
    pub gone: BTreeMap<String, Instant>,
    /// First time the node's Ready condition was not True, with its message.
    pub not_ready: Option<(Instant, String)>,
    /// First time node-monitor's NodeMonitorShuttingDown condition was True.
    pub marked: Option<Instant>,
}

/// Polls the pods and the node every 100 ms into `seen` until the task is aborted.
pub fn watch(client: Client, seen: Arc<Mutex<Seen>>) -> tokio::task::JoinHandle<()> {
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
pub async fn create_pods(client: &Client, node: &RealNode) {
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
/// covers the 120 s of the periods; returns logind's delay in seconds.
pub async fn lock_held(node: &mut RealNode, who: &str) -> f64 {
    let script = format!(
        r#"delay() {{ busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec | cut -d' ' -f2; }}
until systemd-inhibit --list --no-pager | grep -q '{who}' && [ "$(delay)" -ge 120000000 ]; do sleep 0.5; done
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
pub async fn power_off(node: &mut RealNode, who: &str, metrics_ip: Option<&str>) {
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
pub fn release_seen(node: &RealNode) -> bool {
    node.out_dir().join("released").exists()
        || node
            .read_out("lock-at-stop")
            .is_ok_and(|s| s.trim() == "released")
}

/// Waits for the guest to power off; returns when it saw the lock released (host clock), if
/// it did, and when qemu exited.
pub async fn until_gone(node: &RealNode, limit: Duration) -> (Option<Instant>, Instant) {
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
pub fn lock_story(node: &RealNode, exited: Duration, delay: f64) -> String {
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

pub fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The test pods still in the API, with their phases.
pub async fn left_behind(client: &Client) -> Vec<String> {
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
pub fn phases(text: &str, family: &str) -> BTreeMap<String, f64> {
    metrics::parse(text)
        .expect("the agent's metrics")
        .into_iter()
        .filter(|s| s.name == family)
        .filter_map(|s| Some((s.labels.get("phase")?.clone(), s.value)))
        .collect()
}
