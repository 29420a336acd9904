//! Remediate at cluster size: what `node-monitor remediate` costs and how fast it acts when it
//! watches thousands of Nodes and node Leases.
//!
//! One real control plane (etcd and kube-apiserver; no kube-controller-manager, so its node
//! lifecycle controller neither marks silent nodes `Unknown` nor taints them: every change to a
//! Node is the benchmark's or remediate's), `--nodes` Nodes spread over `--zones` zones
//! (`topology.kubernetes.io/zone`), Ready as a kubelet registers them, and one Lease each in
//! `kube-node-lease`, renewed by one task at the kubelet's cadence (`--renew-interval`, 10 s; the
//! Lease lasts four intervals as the kubelet's 40 s one does). The real `node-monitor remediate`
//! (`NODE_MONITOR_PROFILE=release` for the release build) runs as leader with its default
//! configuration and a fence method that succeeds at once and records each call.
//!
//! Phases, each printing `remediate-scale:` lines:
//! 1. idle: the leader's CPU and RSS over `--seconds`, with every Lease renewing;
//! 2. detection: `--kill` nodes (one per zone) stop renewing; the time from each one's last
//!    renewal to remediate's `node is dead` log line, to its fence call, and to the
//!    out-of-service taint on the Node;
//! 3. churn: `--churn-fraction` of the nodes flap Ready every `--churn-period` (their Leases keep
//!    renewing) for `--seconds`: the leader's CPU, the zone states, and whether any of them is
//!    fenced;
//! 4. zone kill: every Lease of the last zone stops (`--zone-fraction` of it): the fence calls
//!    in that zone must follow the configured zone rate, never the whole zone at once — the one
//!    hard check (PASS/FAIL, exit status 1 on FAIL);
//! 5. failover: a second replica starts, the leader is SIGKILLed, and the time until the second
//!    one leads is measured (its log and the leader Lease's holder).
//!
//! Root and the control-plane binaries are required. See docs/benchmarks.md ("Remediate at
//! cluster size").
//!
//! ```sh
//! cargo build --release -p node-monitor -p node-monitor-bench --bin node-monitor --bin bench-remediate-scale
//! KUBEBUILDER_ASSETS=$HOME/.cache/node-monitor/control-plane/current NODE_MONITOR_PROFILE=release \
//!   target/release/bench-remediate-scale --nodes 1000
//! ```
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use k8s_openapi::{
    api::{
        coordination::v1::Lease,
        core::v1::{Namespace, Node},
    },
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use node_monitor_core::{contract::names::agent_lease_name, remediation::OUT_OF_SERVICE_TAINT};
use node_monitor_tests::{
    cgroup::require_root,
    control_plane::{ControlPlane, ControlPlaneOptions},
    e2e::{binary, free_port, http_get},
    metrics, procfs,
    workload::ZONE_LABEL,
};
use serde_json::json;
use tokio::{sync::Semaphore, task::JoinSet};

const NS: &str = "node-monitor";
const LEASE_NS: &str = "kube-node-lease";
const LEADER_LEASE: &str = "node-monitor-remediate";
/// remediate's defaults the checks depend on (docs/remediate.md, "Configuration").
const NODE_FENCE_RATE: f64 = 0.1;
const SECONDARY_NODE_FENCE_RATE: f64 = 0.01;
const LARGE_CLUSTER_SIZE_THRESHOLD: usize = 50;
const UNHEALTHY_ZONE_THRESHOLD: f64 = 0.55;

#[derive(Debug, Parser)]
#[command(about = "node-monitor remediate watching thousands of Nodes and Leases")]
struct Args {
    /// Nodes (each with its Lease).
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Zones the nodes are spread over (round robin).
    #[arg(long, default_value_t = 5)]
    zones: usize,
    /// Length of the idle and churn measurement windows.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Lease renewal interval (the kubelet: 10 s); the Lease lasts four intervals.
    #[arg(long, default_value_t = 10)]
    renew_interval: u64,
    /// Concurrent requests of the renewer (and of the creation).
    #[arg(long, default_value_t = 32)]
    parallelism: usize,
    /// Nodes killed one by one (one per zone, never in the last zone) for the detection figures.
    #[arg(long, default_value_t = 3)]
    kill: usize,
    /// Fraction of the nodes whose Ready condition flaps during the churn phase.
    #[arg(long, default_value_t = 0.05)]
    churn_fraction: f64,
    /// Each flapping node changes Ready every this many seconds.
    #[arg(long, default_value_t = 4)]
    churn_period: u64,
    /// Fraction of the last zone killed at once (1: the whole zone).
    #[arg(long, default_value_t = 1.0)]
    zone_fraction: f64,
    /// How long the zone kill is watched (from the moment the Leases stop); default: the
    /// detection window (3 renewal intervals) plus 90 s.
    #[arg(long)]
    zone_seconds: Option<u64>,
    #[arg(long)]
    skip_churn: bool,
    #[arg(long)]
    skip_zone_kill: bool,
    #[arg(long)]
    skip_failover: bool,
    /// Keep the work directory (remediate's logs, the fence calls).
    #[arg(long)]
    keep: bool,
    /// Every node also runs the agent's liveness Lease (`node-monitor-agent-<node>` in the
    /// controller's namespace), renewed as the agent renews it (`--agent-interval`); a killed
    /// node stops both.
    #[arg(long)]
    agent_leases: bool,
    /// The agents' renewal interval (the agent's `livenessLeaseInterval`: 5 s).
    #[arg(long, default_value_t = 5)]
    agent_interval: u64,
}

fn node_name(i: usize) -> String {
    format!("node-{i:05}")
}

fn zone_name(z: usize) -> String {
    format!("zone-{z}")
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

// ---------------------------------------------------------------------------------------------
// Process figures from /proc.

/// CPU and RSS of a set of processes over a window.
struct Usage {
    cpu_pct: f64,
    rss_max_kib: u64,
    hwm_kib: u64,
}

/// Samples `pids` every second for `window`; returns their CPU share (percent of one core) and
/// their largest RSS. `tick` runs once a second (checks that must hold during the window).
async fn observe(
    pids: &[u32],
    window: Duration,
    mut tick: impl AsyncFnMut() -> Result<()>,
) -> Result<Vec<Usage>> {
    let t0 = Instant::now();
    let start: Vec<u64> = pids
        .iter()
        .map(|p| procfs::figures(*p).map(|f| f.0))
        .collect::<Result<_>>()?;
    let mut rss_max = vec![0u64; pids.len()];
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (i, p) in pids.iter().enumerate() {
            rss_max[i] = rss_max[i].max(procfs::figures(*p)?.1);
        }
        tick().await?;
    }
    let secs = t0.elapsed().as_secs_f64();
    pids.iter()
        .enumerate()
        .map(|(i, p)| {
            let (ticks, rss, hwm) = procfs::figures(*p)?;
            Ok(Usage {
                cpu_pct: (ticks - start[i]) as f64 / procfs::ticks_per_second() / secs * 100.0,
                rss_max_kib: rss_max[i].max(rss),
                hwm_kib: hwm,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The kubelets' side: Nodes, Leases, the renewer, the flapper.

fn node_object(name: &str, zone: &str, boot_id: &str) -> Result<Node> {
    let now = Timestamp::now().to_string();
    let cond = |ty: &str, status: &str, reason: &str, message: &str| {
        json!({"type": ty, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let resources =
        json!({"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            ZONE_LABEL: zone,
            "topology.kubernetes.io/region": "bench",
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
        }},
        "status": {
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "capacity": resources,
            "allocatable": resources,
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64", "bootID": boot_id, "containerRuntimeVersion": "containerd://bench",
                "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.36.3",
                "machineID": name, "operatingSystem": "linux", "osImage": "bench", "systemUUID": name,
            },
        },
    }))?)
}

fn lease_object(name: &str, node_uid: &str, duration: i32) -> Result<Lease> {
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "namespace": LEASE_NS,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}],
        },
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration,
            "renewTime": MicroTime(Timestamp::now()),
        },
    }))?)
}

/// The agent's liveness Lease of node `name`, as the agent creates it.
fn agent_lease_object(name: &str) -> Result<Lease> {
    Ok(serde_json::from_value(json!({
        "metadata": {
            "name": agent_lease_name(name),
            "namespace": NS,
            "labels": {"app.kubernetes.io/name": "node-monitor"},
        },
        "spec": {
            "holderIdentity": name,
            "renewTime": MicroTime(Timestamp::now()),
        },
    }))?)
}

/// Creates every Node (Ready) and its Lease (and the agent's, with `--agent-leases`),
/// `parallelism` requests at a time.
async fn create_nodes(client: &Client, args: &Args, lease_duration: i32) -> Result<()> {
    let sem = Arc::new(Semaphore::new(args.parallelism));
    let mut set = JoinSet::new();
    for i in 0..args.nodes {
        let permit = sem.clone().acquire_owned().await?;
        let client = client.clone();
        let zone = zone_name(i % args.zones);
        let agent_leases = args.agent_leases;
        set.spawn(async move {
            let _permit = permit;
            let name = node_name(i);
            let nodes: Api<Node> = Api::all(client.clone());
            let node = nodes
                .create(
                    &PostParams::default(),
                    &node_object(&name, &zone, &format!("boot-{i}"))?,
                )
                .await
                .with_context(|| format!("create node {name}"))?;
            let uid = node.metadata.uid.context("a created node without a UID")?;
            let leases: Api<Lease> = Api::namespaced(client, LEASE_NS);
            leases
                .create(
                    &PostParams::default(),
                    &lease_object(&name, &uid, lease_duration)?,
                )
                .await
                .with_context(|| format!("create the Lease of {name}"))?;
            if agent_leases {
                let agents: Api<Lease> = Api::namespaced(leases.into_client(), NS);
                agents
                    .create(&PostParams::default(), &agent_lease_object(&name)?)
                    .await
                    .with_context(|| format!("create the agent's Lease of {name}"))?;
            }
            anyhow::Ok(())
        });
        while let Some(r) = set.try_join_next() {
            r??;
        }
    }
    while let Some(r) = set.join_next().await {
        r??;
    }
    Ok(())
}

/// Which Leases a [`Renewer`] renews.
#[derive(Clone, Copy)]
enum Leases {
    /// The kubelets' node Leases: a merge patch of `renewTime`.
    Kubelet,
    /// The agents' liveness Leases: a merge patch of `holderIdentity` and `renewTime`, as the
    /// agent's renewer sends it.
    Agent,
}

/// Renews every Lease once per interval, spread evenly over it, as N kubelets (or agents) would.
struct Renewer {
    paused: Vec<AtomicBool>,
    /// Unix milliseconds of each Lease's last successful renewal (the response received).
    last_ok_ms: Vec<AtomicU64>,
    ok: AtomicU64,
    errors: AtomicU64,
    /// Since the last [`Renewer::take_window`]: the largest gap between two renewals of one Lease,
    /// and the largest delay of a renewal behind its schedule.
    max_gap_ms: AtomicU64,
    max_lag_ms: AtomicU64,
    stop: AtomicBool,
}

struct RenewWindow {
    ok: u64,
    errors: u64,
    max_gap_ms: u64,
    max_lag_ms: u64,
}

impl Renewer {
    fn new(n: usize) -> Arc<Renewer> {
        let now = unix_ms();
        Arc::new(Renewer {
            paused: (0..n).map(|_| AtomicBool::new(false)).collect(),
            last_ok_ms: (0..n).map(|_| AtomicU64::new(now)).collect(),
            ok: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            max_gap_ms: AtomicU64::new(0),
            max_lag_ms: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        })
    }

    fn take_window(&self) -> RenewWindow {
        RenewWindow {
            ok: self.ok.swap(0, Ordering::Relaxed),
            errors: self.errors.swap(0, Ordering::Relaxed),
            max_gap_ms: self.max_gap_ms.swap(0, Ordering::Relaxed),
            max_lag_ms: self.max_lag_ms.swap(0, Ordering::Relaxed),
        }
    }

    async fn run(
        self: Arc<Self>,
        client: Client,
        interval: Duration,
        parallelism: usize,
        kind: Leases,
    ) {
        let n = self.paused.len();
        let leases: Api<Lease> = Api::namespaced(
            client,
            match kind {
                Leases::Kubelet => LEASE_NS,
                Leases::Agent => NS,
            },
        );
        let sem = Arc::new(Semaphore::new(parallelism));
        let start = tokio::time::Instant::now();
        let step = interval / u32::try_from(n).unwrap_or(u32::MAX).max(1);
        for round in 0u32.. {
            for i in 0..n {
                if self.stop.load(Ordering::Relaxed) {
                    return;
                }
                let due = start + interval * round + step * u32::try_from(i).unwrap_or(0);
                tokio::time::sleep_until(due).await;
                if self.paused[i].load(Ordering::Relaxed) {
                    continue;
                }
                let Ok(permit) = sem.clone().acquire_owned().await else {
                    return;
                };
                let lag = u64::try_from(due.elapsed().as_millis()).unwrap_or(u64::MAX);
                self.max_lag_ms.fetch_max(lag, Ordering::Relaxed);
                let me = self.clone();
                let leases = leases.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    let (name, patch) = match kind {
                        Leases::Kubelet => (
                            node_name(i),
                            json!({"spec": {"renewTime": MicroTime(Timestamp::now())}}),
                        ),
                        Leases::Agent => (
                            agent_lease_name(&node_name(i)),
                            json!({"spec": {
                                "holderIdentity": node_name(i),
                                "renewTime": MicroTime(Timestamp::now()),
                            }}),
                        ),
                    };
                    match leases
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => {
                            let now = unix_ms();
                            let prev = me.last_ok_ms[i].swap(now, Ordering::Relaxed);
                            me.max_gap_ms
                                .fetch_max(now.saturating_sub(prev), Ordering::Relaxed);
                            me.ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => {
                            me.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        }
    }
}

fn ready_patch(ready: bool) -> serde_json::Value {
    let now = Timestamp::now().to_string();
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "False",
            "KubeletNotReady",
            "container runtime network not ready",
        )
    };
    json!({"status": {"conditions": [{"type": "Ready", "status": status, "reason": reason,
        "message": message, "lastHeartbeatTime": now, "lastTransitionTime": now}]}})
}

/// Flaps the Ready condition of `nodes` (each every `period`, spread over it) until stopped.
/// Returns the number of status writes.
async fn flap(
    client: Client,
    nodes: Vec<usize>,
    period: Duration,
    parallelism: usize,
    stop: Arc<AtomicBool>,
) -> (u64, u64) {
    if nodes.is_empty() {
        // Nothing flaps (too few nodes for the fraction): no rounds to wait for.
        return (0, 0);
    }
    let api: Api<Node> = Api::all(client);
    let sem = Arc::new(Semaphore::new(parallelism));
    let ok = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = tokio::time::Instant::now();
    let step = period / u32::try_from(nodes.len()).unwrap_or(u32::MAX).max(1);
    let mut set = JoinSet::new();
    'rounds: for round in 0u32.. {
        for (k, &i) in nodes.iter().enumerate() {
            if stop.load(Ordering::Relaxed) {
                break 'rounds;
            }
            tokio::time::sleep_until(start + period * round + step * u32::try_from(k).unwrap_or(0))
                .await;
            let Ok(permit) = sem.clone().acquire_owned().await else {
                break 'rounds;
            };
            let (api, ok, errors) = (api.clone(), ok.clone(), errors.clone());
            // Even rounds: NotReady; odd rounds: Ready again.
            let ready = round % 2 == 1;
            set.spawn(async move {
                let _permit = permit;
                let r = api
                    .patch_status(
                        &node_name(i),
                        &PatchParams::default(),
                        &Patch::Strategic(ready_patch(ready)),
                    )
                    .await;
                if r.is_ok() { &ok } else { &errors }.fetch_add(1, Ordering::Relaxed);
            });
            while set.try_join_next().is_some() {}
        }
    }
    while set.join_next().await.is_some() {}
    // Every flapping node ends Ready.
    for &i in &nodes {
        let r = api
            .patch_status(
                &node_name(i),
                &PatchParams::default(),
                &Patch::Strategic(ready_patch(true)),
            )
            .await;
        if r.is_ok() { &ok } else { &errors }.fetch_add(1, Ordering::Relaxed);
    }
    (ok.load(Ordering::Relaxed), errors.load(Ordering::Relaxed))
}

// ---------------------------------------------------------------------------------------------
// remediate.

/// remediate's configuration: its defaults (3 missed renewals of the Lease's own interval, zone
/// rates 0.1 and 0.01 per second, leader Lease 15 s / 10 s / 2 s), stated.
const REMEDIATE_CONFIG: &str = "\
tickInterval: 1s
missedRenewals: 3
suspectAfterRenewals: 1.5
unhealthyZoneThreshold: 0.55
largeClusterSizeThreshold: 50
nodeFenceRate: 0.1
secondaryNodeFenceRate: 0.01
maxUnhealthyFraction: 0.55
powerManagementAfterIsolation: never
leaderElection:
  leaseDuration: 15s
  renewDeadline: 10s
  retryPeriod: 2s
";

/// The fence agent: records `<unix time> <step> <node>` in the file its `log` parameter names and
/// succeeds.
const FENCE_AGENT: &str = r#"#!/bin/sh
log=
for kv in $(cat); do
  case "$kv" in log=*) log=${kv#log=} ;; esac
done
echo "$(date +%s.%N) $NODE_MONITOR_FENCE_STEP $NODE_MONITOR_FENCE_NODE" >> "$log"
"#;

struct Remediate {
    child: Option<Child>,
    pid: u32,
    log: PathBuf,
    port: u16,
}

impl Remediate {
    fn spawn(kubeconfig: &Path, dir: &Path, identity: &str) -> Result<Remediate> {
        let cfg = dir.join("remediate.yaml");
        fs::write(&cfg, REMEDIATE_CONFIG)?;
        let log = dir.join(format!("{identity}.log"));
        let out = fs::File::create(&log)?;
        let port = free_port()?;
        let child = Command::new(binary("node-monitor-remediate"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", NS, "--identity", identity])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .arg("--config")
            .arg(&cfg)
            .env("RUST_LOG", "info")
            .env("NODE_MONITOR_LOG_FORMAT", "json")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start node-monitor remediate")?;
        Ok(Remediate {
            pid: child.id(),
            child: Some(child),
            log,
            port,
        })
    }

    /// Every JSON log line with the given message: (unix seconds, fields).
    fn log_entries(&self, message: &str) -> Vec<(f64, serde_json::Value)> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["fields"]["message"] == message)
            .filter_map(|v| {
                let ts: Timestamp = v["timestamp"].as_str()?.parse().ok()?;
                Some((ts.as_millisecond() as f64 / 1000.0, v["fields"].clone()))
            })
            .collect()
    }

    fn tail(&self) -> String {
        let log = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn check_running(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut()
            && let Some(status) = c.try_wait()?
        {
            bail!("remediate exited ({status}):\n{}", self.tail());
        }
        Ok(())
    }

    /// Waits until the log has `message` and `/readyz` answers.
    async fn wait_ready(&mut self, message: &str, timeout: Duration) -> Result<f64> {
        let t0 = Instant::now();
        loop {
            self.check_running()?;
            if let Some((ts, _)) = self.log_entries(message).first()
                && http_get(self.port, "/readyz").await.is_ok()
            {
                return Ok(*ts);
            }
            if t0.elapsed() > timeout {
                bail!(
                    "remediate did not log {message:?} and answer /readyz within {timeout:?}:\n{}",
                    self.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn metrics(&self) -> Result<String> {
        http_get(self.port, "/metrics").await
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Remediate {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The fence calls recorded so far: (unix seconds, step, node).
fn fence_calls(log: &Path) -> Vec<(f64, String, String)> {
    fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                (*f.get(1)?).to_owned(),
                (*f.get(2)?).to_owned(),
            ))
        })
        .collect()
}

/// The first isolation call per node: node → unix seconds.
fn first_isolations(log: &Path) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (t, step, node) in fence_calls(log) {
        if step == "isolation" {
            out.entry(node).or_insert(t);
        }
    }
    out
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT))
}

/// Zone states with a non-zero gauge: zone → state.
fn zone_states(text: &str) -> Result<BTreeMap<String, String>> {
    Ok(metrics::parse(text)?
        .into_iter()
        .filter(|s| s.name == "node_monitor_remediation_zone_state" && s.value > 0.0)
        .filter_map(|s| {
            Some((
                s.labels.get("zone")?.clone(),
                s.labels.get("state")?.clone(),
            ))
        })
        .collect())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn print_renewer(phase: &str, w: &RenewWindow, secs: f64, target: f64) {
    println!(
        "remediate-scale: renewer {phase}: {:.0} renewals/s achieved of {target:.0}/s target, {} errors, max lag behind schedule {} ms, max gap between renewals of one Lease {:.1} s",
        w.ok as f64 / secs,
        w.errors,
        w.max_lag_ms,
        w.max_gap_ms as f64 / 1000.0
    );
}

// ---------------------------------------------------------------------------------------------

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    require_root("bench-remediate-scale (the control plane's etcd and kube-apiserver)");
    if args.zones < 2 || args.nodes < 4 * args.zones {
        bail!(
            "--zones {} with --nodes {}: need at least 2 zones and 4 nodes per zone",
            args.zones,
            args.nodes
        );
    }
    if args.kill >= args.zones {
        bail!(
            "--kill {}: at most --zones - 1 ({}) (one per zone, never the last)",
            args.kill,
            args.zones - 1
        );
    }
    if !(0.0..=1.0).contains(&args.zone_fraction) || !(0.0..=1.0).contains(&args.churn_fraction) {
        bail!("--zone-fraction and --churn-fraction are fractions (0 to 1)");
    }
    let verdict = run(&args).await?;
    if !verdict {
        std::process::exit(1);
    }
    Ok(())
}

async fn run(args: &Args) -> Result<bool> {
    let n = args.nodes;
    let interval = Duration::from_secs(args.renew_interval.max(1));
    let lease_duration = i32::try_from(args.renew_interval.max(1) * 4)?;
    let target_rate = n as f64 / interval.as_secs_f64();
    let dir = tempfile::Builder::new()
        .prefix("nm-bench-remediate-scale-")
        .tempdir()?;
    println!(
        "remediate-scale: {n} nodes in {} zones, Leases of {lease_duration} s renewed every {} s{}, remediate {}",
        args.zones,
        interval.as_secs(),
        if args.agent_leases {
            format!(
                ", agents' liveness Leases renewed every {} s",
                args.agent_interval.max(1)
            )
        } else {
            String::new()
        },
        binary("node-monitor-remediate").display()
    );

    let opts = ControlPlaneOptions {
        controller_manager: false,
        ..ControlPlaneOptions::default()
    };
    let cp = ControlPlane::start(opts).await?;
    let client = cp.client();
    let cp_pids: Vec<(String, u32)> = cp.pids();
    let ns_api: Api<Namespace> = Api::all(client.clone());
    ns_api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
        )
        .await
        .context("create the remediate namespace")?;
    // remediate keeps its fencing operations in NodeFence objects.
    node_monitor_tests::manifests::install_remediate_crds(&client).await?;

    let t = Instant::now();
    create_nodes(&client, args, lease_duration).await?;
    let secs = t.elapsed().as_secs_f64();
    println!(
        "remediate-scale: created {n} Nodes and {n} Leases in {secs:.1} s ({:.0} objects/s, {} in flight)",
        2.0 * n as f64 / secs,
        args.parallelism
    );

    let renewer = Renewer::new(n);
    let renew_task = tokio::spawn(renewer.clone().run(
        client.clone(),
        interval,
        args.parallelism,
        Leases::Kubelet,
    ));
    // The agents' liveness Leases, with `--agent-leases`.
    let agent_interval = Duration::from_secs(args.agent_interval.max(1));
    let agent_target_rate = n as f64 / agent_interval.as_secs_f64();
    let agents = Renewer::new(n);
    let agent_task = args.agent_leases.then(|| {
        tokio::spawn(agents.clone().run(
            client.clone(),
            agent_interval,
            args.parallelism,
            Leases::Agent,
        ))
    });
    let calls_log = configure_fencing(&client, dir.path()).await?;
    let s = Scale {
        args,
        n,
        interval,
        window: Duration::from_secs(args.seconds),
        target_rate,
        agent_target_rate,
        client: client.clone(),
        cp_pids,
        calls_log,
        renewer: renewer.clone(),
        agents: agents.clone(),
    };

    // The leader.
    let spawned = unix_now();
    let mut leader = Remediate::spawn(cp.kubeconfig_path(), dir.path(), "remediate-1")?;
    let led = leader
        .wait_ready("leading", Duration::from_secs(300))
        .await?;
    let ready = unix_now();
    println!(
        "remediate-scale: leader started: leading after {:.1} s, caches synced (/readyz) after {:.1} s",
        led - spawned,
        ready - spawned
    );
    let _ = renewer.take_window();

    idle(&s, &mut leader).await?;

    let killed: Vec<usize> = (0..args.kill).collect();
    let mut dead_set: BTreeSet<String> = BTreeSet::new();
    detection(&s, &mut leader, &killed, &mut dead_set).await?;

    churn(&s, &mut leader, &killed).await?;

    let verdict = zone_kill(&s, &mut leader, &mut dead_set).await?;

    // Healthy nodes fenced (over the whole run so far).
    let wrong: Vec<String> = first_isolations(&s.calls_log)
        .into_keys()
        .filter(|node| !dead_set.contains(node))
        .collect();
    println!(
        "remediate-scale: live nodes fenced during the run: {}",
        if wrong.is_empty() {
            "none".to_owned()
        } else {
            format!("{} {wrong:?}", wrong.len())
        }
    );

    failover(&s, &cp, dir.path(), &mut leader).await?;

    renewer.stop.store(true, Ordering::Relaxed);
    renew_task.abort();
    agents.stop.store(true, Ordering::Relaxed);
    if let Some(task) = agent_task {
        task.abort();
    }
    if args.keep {
        let kept = dir.keep();
        println!("remediate-scale: work directory kept: {}", kept.display());
    }
    drop(cp);
    println!(
        "remediate-scale: storm protection check: {}",
        if verdict { "PASS" } else { "FAIL" }
    );
    Ok(verdict)
}

/// What every phase of the run shares.
struct Scale<'a> {
    args: &'a Args,
    n: usize,
    interval: Duration,
    /// Each measuring window (`--seconds`).
    window: Duration,
    /// The kubelets' Lease renewals a second.
    target_rate: f64,
    /// The agents' Lease renewals a second.
    agent_target_rate: f64,
    client: Client,
    cp_pids: Vec<(String, u32)>,
    /// The fence agent's log of its calls.
    calls_log: PathBuf,
    renewer: Arc<Renewer>,
    agents: Arc<Renewer>,
}

impl Scale<'_> {
    /// Stops node `i`: its kubelet's Lease and its agent's.
    fn stop_node(&self, i: usize) {
        self.renewer.paused[i].store(true, Ordering::Relaxed);
        self.agents.paused[i].store(true, Ordering::Relaxed);
    }

    fn print_agents(&self, phase: &str, w: &RenewWindow, secs: f64) {
        if self.args.agent_leases {
            print_renewer(
                &format!("{phase} (agents' liveness Leases)"),
                w,
                secs,
                self.agent_target_rate,
            );
        }
    }

    /// The processes measured: the leader, the control plane's, and the bench's own.
    fn pids(&self, leader: &Remediate) -> Vec<u32> {
        let mut pids = vec![leader.pid];
        pids.extend(self.cp_pids.iter().map(|(_, p)| *p));
        pids.push(std::process::id());
        pids
    }
}

/// The fence configuration: a template naming the bench's fence agent, which logs each call to
/// the returned file, an isolate method and the default config.
async fn configure_fencing(client: &Client, dir: &Path) -> Result<PathBuf> {
    let agent = dir.join("fence-agent");
    fs::write(&agent, FENCE_AGENT)?;
    fs::set_permissions(&agent, fs::Permissions::from_mode(0o755))?;
    let calls_log = dir.join("calls.log");
    for (name, key, text) in [
        (
            "fence-method-template-bench",
            "template.properties",
            format!(
                "agent_name={}\nlog={}\n",
                agent.display(),
                calls_log.display()
            ),
        ),
        (
            "fence-method-isolate",
            "method.properties",
            "template=fence-method-template-bench\naction=off\n".to_owned(),
        ),
        (
            "fence-config-default",
            "config.properties",
            "isolation=isolate\n".to_owned(),
        ),
    ] {
        node_monitor_tests::workload::create_configmap(client, NS, name, key, &text).await?;
    }
    Ok(calls_log)
}

/// Phase 1, idle: the leader's, the control plane's and the renewers' load over the window, and what
/// the leader judges of the nodes and zones.
async fn idle(s: &Scale<'_>, leader: &mut Remediate) -> Result<()> {
    let n = s.n;
    // 1. Idle. remediate counts a node first seen as just renewed: wait a whole detection window
    // (and more) before measuring or killing anything.
    tokio::time::sleep(s.interval * 4).await;
    let _ = s.renewer.take_window();
    let _ = s.agents.take_window();
    let mut pids = vec![leader.pid];
    pids.extend(s.cp_pids.iter().map(|(_, p)| *p));
    pids.push(std::process::id());
    let window = Duration::from_secs(s.args.seconds);
    let u = observe(&pids, window, async || leader.check_running()).await?;
    let rw = s.renewer.take_window();
    let aw = s.agents.take_window();
    println!(
        "remediate-scale: idle leader at {n} nodes: CPU {:.1} % of a core, RSS {:.1} MiB (max over {} s; peak since start {:.1} MiB)",
        u[0].cpu_pct,
        mib(u[0].rss_max_kib),
        window.as_secs(),
        mib(u[0].hwm_kib)
    );
    let names: Vec<&str> = s
        .cp_pids
        .iter()
        .map(|(name, _)| name.as_str())
        .chain(["bench (renewer)"])
        .collect();
    println!(
        "remediate-scale: idle load: {}",
        names
            .iter()
            .zip(&u[1..])
            .map(|(name, u)| format!(
                "{name} CPU {:.0} % RSS {:.0} MiB",
                u.cpu_pct,
                mib(u.rss_max_kib)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    print_renewer("idle", &rw, window.as_secs_f64(), s.target_rate);
    s.print_agents("idle", &aw, window.as_secs_f64());
    let text = leader.metrics().await?;
    println!(
        "remediate-scale: idle: nodes judged alive {}, suspect {}, dead {}; zones not Normal: {:?}",
        metrics::try_sum(
            &text,
            "node_monitor_remediation_nodes",
            &[("state", "alive")]
        )?,
        metrics::try_sum(
            &text,
            "node_monitor_remediation_nodes",
            &[("state", "suspect")]
        )?,
        metrics::try_sum(
            &text,
            "node_monitor_remediation_nodes",
            &[("state", "dead")]
        )?,
        zone_states(&text)?
            .into_iter()
            .filter(|(_, s)| s != "Normal")
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// Phase 2, detection: `kill` nodes, one in each of the first zones, stopped; the time from each one's
/// last renewal to its death, its fence call and its out-of-service taint.
async fn detection(
    s: &Scale<'_>,
    leader: &mut Remediate,
    killed: &[usize],
    dead_set: &mut BTreeSet<String>,
) -> Result<()> {
    let n = s.n;
    let nodes_api: Api<Node> = Api::all(s.client.clone());
    // 2. Detection: `kill` nodes, one in each of the first zones.
    if !killed.is_empty() {
        for &i in killed.iter() {
            s.stop_node(i);
            dead_set.insert(node_name(i));
        }
        let t0 = Instant::now();
        let mut taint_at: BTreeMap<String, f64> = BTreeMap::new();
        while taint_at.len() < killed.len() {
            leader.check_running()?;
            for &i in killed.iter() {
                let name = node_name(i);
                if !taint_at.contains_key(&name) && tainted(&nodes_api.get(&name).await?) {
                    taint_at.insert(name, unix_now());
                }
            }
            if t0.elapsed() > Duration::from_secs(30) + s.interval * 6 {
                bail!(
                    "killed nodes not all tainted within {:?} (tainted: {:?}):\n{}",
                    t0.elapsed(),
                    taint_at.keys().collect::<Vec<_>>(),
                    leader.tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let dead_logs = leader.log_entries("node is dead");
        let fences = first_isolations(&s.calls_log);
        let (mut to_dead, mut to_fence, mut to_taint) = (Vec::new(), Vec::new(), Vec::new());
        for &i in killed.iter() {
            let name = node_name(i);
            // The death: the last renewal of either Lease.
            let mut last_ms = s.renewer.last_ok_ms[i].load(Ordering::Relaxed);
            if s.args.agent_leases {
                last_ms = last_ms.max(s.agents.last_ok_ms[i].load(Ordering::Relaxed));
            }
            let last = last_ms as f64 / 1000.0;
            let dead = dead_logs
                .iter()
                .find(|(_, f)| f["node"] == name.as_str())
                .map(|(t, _)| *t)
                .context("no `node is dead` line for a killed node")?;
            let fenced = *fences
                .get(&name)
                .context("no fence call for a killed node")?;
            to_dead.push(dead - last);
            to_fence.push(fenced - last);
            to_taint.push(taint_at[&name] - last);
        }
        let show = |v: &[f64]| {
            v.iter()
                .map(|s| format!("{s:.1}"))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        println!(
            "remediate-scale: detection at {n} nodes ({} nodes, s after the last renewal): judged dead {}, fence call {}, out-of-service taint {}",
            killed.len(),
            show(&to_dead),
            show(&to_fence),
            show(&to_taint)
        );
    }
    Ok(())
}

/// Phase 3, churn: a share of every zone flapping Ready; the leader's and the API server's load, the
/// zone states seen, and no node fenced.
async fn churn(s: &Scale<'_>, leader: &mut Remediate, killed: &[usize]) -> Result<()> {
    let n = s.n;
    // 3. Churn.
    if !s.args.skip_churn && s.args.churn_fraction > 0.0 {
        // The same share of every zone: by the node's index within its zone.
        let every = (1.0 / s.args.churn_fraction).round().max(1.0) as usize;
        let flapping: Vec<usize> = (0..n)
            .filter(|i| (i / s.args.zones) % every == every / 2 && !killed.contains(i))
            .collect();
        let fences_before = fence_calls(&s.calls_log).len();
        let stop = Arc::new(AtomicBool::new(false));
        let flapper = tokio::spawn(flap(
            s.client.clone(),
            flapping.clone(),
            Duration::from_secs(s.args.churn_period.max(1)),
            s.args.parallelism.min(16),
            stop.clone(),
        ));
        let _ = s.renewer.take_window();
        let _ = s.agents.take_window();
        let mut seen_states: BTreeSet<(String, String)> = BTreeSet::new();
        let mut max_unhealthy = 0.0f64;
        let u = observe(&s.pids(leader), s.window, async || {
            leader.check_running()?;
            let text = leader.metrics().await?;
            for (z, s) in zone_states(&text)? {
                seen_states.insert((z, s));
            }
            max_unhealthy = max_unhealthy.max(metrics::try_sum(
                &text,
                "node_monitor_remediation_zone_unhealthy_nodes",
                &[],
            )?);
            Ok(())
        })
        .await?;
        let rw = s.renewer.take_window();
        let aw = s.agents.take_window();
        stop.store(true, Ordering::Relaxed);
        let (writes, errors) = flapper.await?;
        let new_fences: Vec<String> = fence_calls(&s.calls_log)[fences_before..]
            .iter()
            .map(|(_, _, node)| node.clone())
            .collect();
        let states: BTreeSet<&str> = seen_states.iter().map(|(_, s)| s.as_str()).collect();
        println!(
            "remediate-scale: churn at {n} nodes ({} nodes flapping Ready every {} s, {} status writes, {errors} errors): leader CPU {:.1} % of a core, RSS {:.1} MiB; apiserver CPU {:.0} %; zone states seen {:?}; unhealthy nodes at most {max_unhealthy}; nodes fenced during churn: {}",
            flapping.len(),
            s.args.churn_period,
            writes,
            u[0].cpu_pct,
            mib(u[0].rss_max_kib),
            s.cp_pids
                .iter()
                .position(|(name, _)| name == "kube-apiserver")
                .and_then(|k| u.get(k + 1))
                .map_or(0.0, |u| u.cpu_pct),
            states,
            if new_fences.is_empty() {
                "none".to_owned()
            } else {
                format!("{new_fences:?}")
            }
        );
        print_renewer("churn", &rw, s.window.as_secs_f64(), s.target_rate);
        s.print_agents("churn", &aw, s.window.as_secs_f64());
    }
    Ok(())
}

/// Phase 4, zone kill: most of the last zone stopped at once; the fence calls in the zone held to the
/// storm protection's rate. Whether they were.
async fn zone_kill(
    s: &Scale<'_>,
    leader: &mut Remediate,
    dead_set: &mut BTreeSet<String>,
) -> Result<bool> {
    let n = s.n;
    let mut within_rate = true;
    if !s.args.skip_zone_kill {
        let zone_seconds = s.args.zone_seconds.unwrap_or(3 * s.interval.as_secs() + 90);
        let z = s.args.zones - 1;
        let zone = zone_name(z);
        let members: Vec<usize> = (0..n).filter(|i| i % s.args.zones == z).collect();
        let count = ((members.len() as f64) * s.args.zone_fraction).round() as usize;
        let victims: Vec<usize> = members.iter().copied().take(count).collect();
        let partial = count < members.len()
            && count > 2
            && count as f64 >= UNHEALTHY_ZONE_THRESHOLD * members.len() as f64;
        let allowed_rate = if partial {
            if members.len() > LARGE_CLUSTER_SIZE_THRESHOLD {
                SECONDARY_NODE_FENCE_RATE
            } else {
                0.0
            }
        } else {
            NODE_FENCE_RATE
        };
        let _ = s.renewer.take_window();
        let _ = s.agents.take_window();
        let killed_at = unix_now();
        for &i in &victims {
            s.stop_node(i);
            dead_set.insert(node_name(i));
        }
        let victim_names: BTreeSet<String> = victims.iter().map(|&i| node_name(i)).collect();
        let mut seen_states: BTreeSet<String> = BTreeSet::new();
        let mut max_dead = 0.0f64;
        let usage = observe(
            &[leader.pid],
            Duration::from_secs(zone_seconds),
            async || {
                leader.check_running()?;
                let text = leader.metrics().await?;
                // remediate names a zone `<region>:<zone>` (the node lifecycle controller's key).
                if let Some(s) = zone_states(&text)?.get(&format!("bench:{zone}")) {
                    seen_states.insert(s.clone());
                }
                max_dead = max_dead.max(metrics::try_sum(
                    &text,
                    "node_monitor_remediation_nodes",
                    &[("state", "dead")],
                )?);
                Ok(())
            },
        )
        .await?;
        let rw = s.renewer.take_window();
        let aw = s.agents.take_window();
        let mut calls: Vec<f64> = first_isolations(&s.calls_log)
            .into_iter()
            .filter(|(node, t)| victim_names.contains(node) && *t >= killed_at)
            .map(|(_, t)| t)
            .collect();
        calls.sort_by(f64::total_cmp);
        // Token bucket of burst 1: at most 1 + rate × (t − first) calls by time t; one more
        // for the sampling of the clock by the script.
        let mut worst_excess = 0.0f64;
        for (k, t) in calls.iter().enumerate() {
            let allowed = 2.0 + allowed_rate * (t - calls[0]);
            worst_excess = worst_excess.max((k + 1) as f64 - allowed);
        }
        let whole = victims.len() > 2 && calls.len() >= victims.len();
        let pass = worst_excess <= 0.0 && !whole;
        within_rate = pass;
        let skips = metrics::parse(&leader.metrics().await?)?
            .into_iter()
            .filter(|s| s.name == "node_monitor_remediation_skips_total" && s.value > 0.0)
            .map(|s| {
                format!(
                    "{}={}",
                    s.labels.get("reason").cloned().unwrap_or_default(),
                    s.value
                )
            })
            .collect::<Vec<_>>();
        let first = calls
            .first()
            .map_or("-".to_owned(), |t| format!("{:.1}", t - killed_at));
        let last = calls
            .last()
            .map_or("-".to_owned(), |t| format!("{:.1}", t - killed_at));
        println!(
            "remediate-scale: zone kill at {n} nodes: {count} of {} nodes of {zone} stopped; zone states {:?}; nodes judged dead at most {max_dead}; fence calls in the zone within {} s: {} (first at {first} s, last at {last} s after the kill), allowed ≤ 2 + {allowed_rate}/s × t; skips {skips:?}: {}",
            members.len(),
            seen_states,
            zone_seconds,
            calls.len(),
            if pass { "PASS" } else { "FAIL" }
        );
        println!(
            "remediate-scale: zone kill: leader CPU {:.1} % of a core, RSS {:.1} MiB over the {} s",
            usage[0].cpu_pct,
            mib(usage[0].rss_max_kib),
            zone_seconds
        );
        print_renewer(
            "zone kill",
            &rw,
            zone_seconds as f64,
            s.target_rate * (1.0 - count as f64 / n as f64),
        );
        if s.args.agent_leases {
            print_renewer(
                "zone kill (agents' liveness Leases)",
                &aw,
                zone_seconds as f64,
                s.agent_target_rate * (1.0 - count as f64 / n as f64),
            );
        }
    }
    Ok(within_rate)
}

/// Phase 5, failover: a second replica follows, then leads once the leader is killed.
async fn failover(
    s: &Scale<'_>,
    cp: &ControlPlane,
    dir: &Path,
    leader: &mut Remediate,
) -> Result<()> {
    let n = s.n;
    // 5. Failover.
    if !s.args.skip_failover {
        let mut second = Remediate::spawn(cp.kubeconfig_path(), dir, "remediate-2")?;
        let t0 = Instant::now();
        let follower_ready = loop {
            second.check_running()?;
            if http_get(second.port, "/readyz").await.is_ok() {
                break t0.elapsed().as_secs_f64();
            }
            if t0.elapsed() > Duration::from_secs(300) {
                bail!("the second replica never became ready:\n{}", second.tail());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let u = observe(&[second.pid], Duration::from_secs(20), async || Ok(())).await?;
        println!(
            "remediate-scale: follower at {n} nodes: ready after {follower_ready:.1} s, then over 20 s CPU {:.1} % of a core, RSS {:.1} MiB",
            u[0].cpu_pct,
            mib(u[0].rss_max_kib)
        );
        let leases: Api<Lease> = Api::namespaced(s.client.clone(), NS);
        let holder = async || -> Result<String> {
            Ok(leases
                .get(LEADER_LEASE)
                .await?
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default())
        };
        if holder().await? != "remediate-1" {
            bail!("the leader Lease is not held by remediate-1 before the kill");
        }
        let killed_at = unix_now();
        leader.kill();
        let t0 = Instant::now();
        let lease_at = loop {
            if holder().await? == "remediate-2" {
                break unix_now();
            }
            if t0.elapsed() > Duration::from_secs(120) {
                bail!("no takeover within 120 s:\n{}", second.tail());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let led = second
            .wait_ready("leading", Duration::from_secs(30))
            .await?;
        println!(
            "remediate-scale: failover at {n} nodes: leader SIGKILLed, the second replica leads after {:.1} s (its log), holds the leader Lease after {:.1} s (seen by polling every 100 ms); leaderElection 15s/10s/2s",
            led - killed_at,
            lease_at - killed_at
        );
    }
    Ok(())
}
