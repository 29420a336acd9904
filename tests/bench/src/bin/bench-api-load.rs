//! API load per agent against one real API server: N real agent processes (`node-monitor run`),
//! each with its own Node and pods, against one control plane; the API server's own metrics give
//! requests by verb and resource, open watches, bytes sent and its latency, and /proc its CPU.
//!
//! Each run starts a fresh control plane (etcd and kube-apiserver), creates N Nodes (`sim-<i>`, Ready) with `--pods` Pending
//! pods bound to each, starts one agent per node (polling only, no eBPF, no mlock: the API
//! behaviour is the same as in the DaemonSet, and the host cannot host hundreds of probe sets),
//! waits `--warmup`, then measures a window of `--seconds`. A run with 0 agents measures the
//! control plane's own traffic, which the per-agent figures subtract.
//!
//! ```text
//! cargo bins && target/debug/bench-api-load --agents 0,10,50,200 --seconds 180
//! ```
use std::{
    collections::BTreeMap,
    fs,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    e2e::{binary, free_port},
    metrics::{self, Sample},
    pod::PodBuilder,
    procfs,
};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Agent counts to run, one fresh control plane each (0: the control plane alone).
    #[arg(long, value_delimiter = ',', default_value = "0,10,50,200")]
    agents: Vec<usize>,
    /// Pods bound to each simulated node.
    #[arg(long, default_value_t = 3)]
    pods: usize,
    /// Seconds after the last agent started before measuring.
    #[arg(long, default_value_t = 30)]
    warmup: u64,
    /// The measured window, seconds (at least two heartbeats and two watch renewals: 120 s).
    #[arg(long, default_value_t = 180)]
    seconds: u64,
}

/// What one window measured.
#[derive(Debug, Default)]
struct Window {
    seconds: f64,
    /// Requests by (verb, resource), the window's delta.
    requests: BTreeMap<(String, String), f64>,
    /// Response bytes by (verb, resource), the window's delta.
    bytes: BTreeMap<(String, String), f64>,
    /// Open watches at the end, by resource.
    watches: BTreeMap<String, f64>,
    /// p99 of non-watch request latency over the window, seconds.
    p99: f64,
    /// p99 by verb (GET, PATCH), seconds.
    p99_by_verb: BTreeMap<&'static str, f64>,
    /// The API server's CPU over the window, % of one core.
    cpu: f64,
}

fn by_verb_resource(samples: &[Sample], name: &str) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name) {
        let verb = s.labels.get("verb").cloned().unwrap_or_default();
        let mut resource = s.labels.get("resource").cloned().unwrap_or_default();
        if let Some(sub) = s.labels.get("subresource").filter(|v| !v.is_empty()) {
            resource = format!("{resource}/{sub}");
        }
        *out.entry((verb, resource)).or_default() += s.value;
    }
    out
}

fn delta(
    after: &BTreeMap<(String, String), f64>,
    before: &BTreeMap<(String, String), f64>,
) -> BTreeMap<(String, String), f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Cumulative buckets (le → count) of request durations: of `verb`, or of every verb but the
/// long-running ones.
fn latency_buckets(samples: &[Sample], verb: Option<&str>) -> BTreeMap<u64, f64> {
    let mut out = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.name == "apiserver_request_duration_seconds_bucket")
        .filter(|s| {
            let v = s.labels.get("verb").map(String::as_str);
            match verb {
                Some(want) => v == Some(want),
                None => !matches!(v, Some("WATCH" | "CONNECT")),
            }
        })
    {
        let le = match s.labels.get("le").map(String::as_str) {
            Some("+Inf") => f64::INFINITY,
            Some(v) => v.parse().unwrap_or(f64::INFINITY),
            None => continue,
        };
        // Keyed by microseconds so the map orders them.
        let key = if le.is_finite() {
            (le * 1e6) as u64
        } else {
            u64::MAX
        };
        *out.entry(key).or_default() += s.value;
    }
    out
}

fn p99(after: &BTreeMap<u64, f64>, before: &BTreeMap<u64, f64>) -> f64 {
    let d: Vec<(u64, f64)> = after
        .iter()
        .map(|(k, v)| (*k, v - before.get(k).copied().unwrap_or(0.0)))
        .collect();
    let total = d.last().map_or(0.0, |(_, c)| *c);
    if total <= 0.0 {
        return 0.0;
    }
    d.iter()
        .find(|(_, c)| *c >= total * 0.99)
        .map_or(f64::INFINITY, |(le, _)| *le as f64 / 1e6)
}

async fn scrape(cp: &ControlPlane) -> Result<Vec<Sample>> {
    let text = cp
        .apiserver_metrics()
        .await
        .context("the API server's /metrics")?;
    metrics::parse(&text)
}

async fn measure(cp: &ControlPlane, seconds: u64) -> Result<Window> {
    let apiserver = cp
        .pids()
        .into_iter()
        .find(|(n, _)| n == "kube-apiserver")
        .map(|(_, p)| p)
        .context("kube-apiserver pid")?;
    let before = scrape(cp).await?;
    let t0 = procfs::cpu_ticks(apiserver)?;
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after = scrape(cp).await?;
    let t1 = procfs::cpu_ticks(apiserver)?;
    let wall = w0.elapsed().as_secs_f64();
    let hz = procfs::ticks_per_second();
    let mut watches = BTreeMap::new();
    for s in after.iter().filter(|s| {
        s.name == "apiserver_longrunning_requests" && s.has_labels(&[("verb", "WATCH")])
    }) {
        let r = s.labels.get("resource").cloned().unwrap_or_default();
        *watches.entry(r).or_default() += s.value;
    }
    Ok(Window {
        seconds: wall,
        requests: delta(
            &by_verb_resource(&after, "apiserver_request_total"),
            &by_verb_resource(&before, "apiserver_request_total"),
        ),
        bytes: delta(
            &by_verb_resource(&after, "apiserver_response_sizes_sum"),
            &by_verb_resource(&before, "apiserver_response_sizes_sum"),
        ),
        watches,
        p99: p99(
            &latency_buckets(&after, None),
            &latency_buckets(&before, None),
        ),
        p99_by_verb: ["GET", "PATCH"]
            .into_iter()
            .map(|v| {
                let q = p99(
                    &latency_buckets(&after, Some(v)),
                    &latency_buckets(&before, Some(v)),
                );
                (v, q)
            })
            .collect(),
        cpu: (t1 - t0) as f64 / hz / wall * 100.0,
    })
}

/// A Ready node, as a kubelet registers it.
async fn create_node(nodes: &Api<Node>, name: &str) -> Result<()> {
    let node: Node = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "kubernetes.io/hostname": name } },
        "status": { "capacity": { "memory": "8Gi", "cpu": "4", "pods": "110" },
                    "allocatable": { "memory": "7Gi", "cpu": "4", "pods": "110" } },
    }))?;
    nodes.create(&PostParams::default(), &node).await?;
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": { "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "simulated", "lastHeartbeatTime": null,
            }]}})),
        )
        .await?;
    Ok(())
}

struct Agents {
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

fn spawn_agents(cp: &ControlPlane, n: usize) -> Result<Agents> {
    let dir = tempfile::Builder::new().prefix("nm-api-load").tempdir()?;
    let config = dir.path().join("config.yaml");
    fs::write(&config, "evictionHard:\n  memory.available: 100Mi\n")?;
    let mut children = Vec::with_capacity(n);
    for i in 0..n {
        let log = fs::File::create(dir.path().join(format!("agent-{i}.log")))?;
        let child = Command::new(binary("node-monitor"))
            .arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--kubeconfig")
            .arg(cp.kubeconfig_path())
            .args(["--node-name", &format!("sim-{i}")])
            .args(["--metrics-addr", &format!("127.0.0.1:{}", free_port()?)])
            .args(["--polling-only", "--no-ebpf", "--no-mlock"])
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting node-monitor")?;
        children.push(child);
    }
    Ok(Agents {
        children,
        _dir: dir,
    })
}

async fn run(n: usize, args: &Args) -> Result<Window> {
    // No controller manager: its node lifecycle controller would mark the simulated nodes (whose
    // kubelet never heartbeats) NotReady and taint them, and its writes would be counted as the
    // agents' (the API server's request metrics do not say who asked).
    let cp = ControlPlane::start(ControlPlaneOptions {
        controller_manager: false,
        ..ControlPlaneOptions::default()
    })
    .await?;
    let client = cp.client();
    // The agents' namespace: each keeps its liveness Lease there. (Created directly: without
    // the controller manager, nothing would make its default ServiceAccount.)
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "node-monitor" } }))?,
        )
        .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // Without the controller manager nobody makes the namespace's default ServiceAccount, which
    // pod admission looks up.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": "default" } }))?,
        )
        .await?;
    for i in 0..n {
        let name = format!("sim-{i}");
        create_node(&nodes, &name).await?;
        for p in 0..args.pods {
            let pod = PodBuilder::new(&format!("sim-{i}-p{p}"))
                .node(&name)
                .container_name("c")
                .image("none")
                .build();
            pods.create(&PostParams::default(), &pod).await?;
        }
    }
    let mut agents = spawn_agents(&cp, n)?;
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    for c in &mut agents.children {
        if let Some(status) = c.try_wait()? {
            bail!("an agent exited during the warm-up: {status}");
        }
    }
    let window = measure(&cp, args.seconds).await?;
    let mut exited = 0;
    for c in &mut agents.children {
        if c.try_wait()?.is_some() {
            exited += 1;
        }
    }
    if exited > 0 {
        bail!("{exited} agents exited during the window");
    }
    drop(agents);
    cp.stop()?;
    Ok(window)
}

fn report(n: usize, w: &Window, base: Option<&Window>) {
    let per = |total: f64, base_total: f64| {
        if n == 0 {
            total / w.seconds
        } else {
            (total / w.seconds - base_total) / n as f64
        }
    };
    println!(
        "api-load: agents={n} window={:.0}s apiserver_cpu={:.1}% p99={:.0}ms p99_get={:.0}ms p99_patch={:.0}ms",
        w.seconds,
        w.cpu,
        w.p99 * 1e3,
        w.p99_by_verb.get("GET").copied().unwrap_or(0.0) * 1e3,
        w.p99_by_verb.get("PATCH").copied().unwrap_or(0.0) * 1e3
    );
    for ((verb, resource), count) in &w.requests {
        let base_rate = base
            .and_then(|b| b.requests.get(&(verb.clone(), resource.clone())))
            .map_or(0.0, |c| c / base.map_or(1.0, |b| b.seconds));
        let bytes = w
            .bytes
            .get(&(verb.clone(), resource.clone()))
            .copied()
            .unwrap_or(0.0);
        let base_bytes = base
            .and_then(|b| b.bytes.get(&(verb.clone(), resource.clone())))
            .map_or(0.0, |c| c / base.map_or(1.0, |b| b.seconds));
        if n > 0 && per(*count, base_rate) < 0.0005 {
            continue;
        }
        println!(
            "api-load: agents={n} {verb} {resource}: {:.2}/s total, {:.4}/s per agent, {:.0} B/s per agent",
            count / w.seconds,
            per(*count, base_rate),
            per(bytes, base_bytes),
        );
    }
    for (resource, open) in &w.watches {
        let base_open = base
            .and_then(|b| b.watches.get(resource))
            .copied()
            .unwrap_or(0.0);
        if n == 0 || *open != base_open {
            println!(
                "api-load: agents={n} open watches {resource}: {open} ({} more than the control plane alone)",
                open - base_open
            );
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let mut base: Option<Window> = None;
    for &n in &args.agents {
        let w = run(n, &args).await?;
        report(n, &w, base.as_ref());
        if n == 0 {
            base = Some(w);
        }
    }
    Ok(())
}
