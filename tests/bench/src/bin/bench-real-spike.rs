//! Spike survival on the real node: allocation ramps of several speeds in a real container,
//! the kubelet alone against the kubelet with node-monitor, at the shipped defaults and at an
//! equal higher threshold; and the workloads predictive eviction must leave alone.
//!
//! Each contender gets its own boot of the real node (`node_monitor_tests::real_node`: the real
//! kubelet and containerd in the guest, 2 GiB, cgroup v2, no swap) with node-monitor installed
//! from `deploy/kustomize/base`:
//!
//! - `kubelet`: the kubelet at its defaults (`memory.available<100Mi`, a 10 s housekeeping
//!   poll); node-monitor as shipped but in dry run (it decides, evicts nothing);
//! - `node-monitor`: the kubelet at its defaults, node-monitor exactly as shipped (the same
//!   100Mi, predictive eviction on);
//! - `threshold-only`: the same with `predictiveEviction: false`: what the threshold alone does;
//! - `kubelet@500Mi`, `node-monitor@500Mi`: the same pair with both at `memory.available<500Mi`.
//!
//! For each run and speed, one BestEffort pod ramps its resident memory by `step` every 100 ms
//! toward 3 GiB (more than the node has). A sampler in the guest reads, every 100 ms on the
//! guest's clock, `memory.available` as the kubelet computes it (MemTotal minus the root's
//! `anon + file − inactive_file`), the kernel's `MemAvailable`, the OOM kill count and whether
//! the workload's process is alive (an `nm-workload` in a BestEffort pod's container cgroup;
//! shell builtins only, so that the sampler keeps its pace on the starved node). From it: the crossing (the first sample below the
//! contender's threshold), when the process was gone, the lowest `memory.available`; the
//! evictions (who, and the Event's time on the guest's clock: microseconds for node-monitor's
//! `eventTime`, whole seconds for the kubelet's `firstTimestamp`) from the API; the kernel's OOM
//! kills from the sampler's count.
//!
//! `--false-positives` adds, per run, three workloads that must not be evicted: a sawtooth
//! (64 MiB every 100 ms up to 640 MiB, all freed, ten times), page cache from reads (a 768 MiB
//! file written and read five times) and a burst (512 MiB at 256 MiB per 100 ms, then held).
//!
//! ```sh
//! cargo bins && cargo xtask image workload --profile debug && cargo xtask image node-monitor \
//!   --profile release && cargo xtask image pause --binary ~/.cache/node-monitor/node/current/pause
//! KUBEBUILDER_ASSETS=~/.cache/node-monitor/control-plane/current \
//!   flock /tmp/nm-vm.lock target/debug/bench-real-spike --runs 5 --false-positives
//! ```
//! (`cargo xtask bench real-spike` does the same.) Results: docs/benchmarks.md, "Spike survival
//! on the real node".
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use clap::Parser;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use node_monitor_tests::real_node::{
    RealNode, RealNodeOptions,
    scenario::{Installed, NS, guest_step, install, workload},
};

#[derive(Parser, Debug)]
#[command(
    about = "Spike survival on the real node: the kubelet alone against the kubelet and node-monitor"
)]
struct Args {
    /// Ramp steps per 100 ms (quantities).
    #[arg(long, value_delimiter = ',', default_values = ["16Mi", "64Mi", "256Mi"])]
    steps: Vec<String>,
    /// Contenders: `kubelet`, `node-monitor`, `threshold-only`, `kubelet@500Mi`,
    /// `node-monitor@500Mi`.
    #[arg(long, value_delimiter = ',', default_values = ["kubelet", "node-monitor"])]
    contenders: Vec<String>,
    /// Runs of every step per contender.
    #[arg(long, default_value_t = 1)]
    runs: u32,
    /// Also run the sawtooth, page-cache and burst workloads, once per run.
    #[arg(long)]
    false_positives: bool,
}

/// A contender: node-monitor's configuration and the kubelet's extra configuration.
struct Contender {
    name: String,
    threshold_mib: i64,
    agent: String,
    kubelet_extra: String,
}

impl Contender {
    fn parse(name: &str) -> Result<Self> {
        let (who, threshold_mib) = match name.split_once('@') {
            None => (name, 100),
            Some((who, "500Mi")) => (who, 500),
            Some(_) => anyhow::bail!("--contenders: {name:?}: the threshold must be 500Mi"),
        };
        let (dry_run, predictive) = match who {
            "kubelet" => (true, true),
            "node-monitor" => (false, true),
            "threshold-only" if threshold_mib == 100 => (false, false),
            _ => anyhow::bail!(
                "--contenders: unknown contender {name:?} (kubelet, node-monitor, \
                 threshold-only, kubelet@500Mi, node-monitor@500Mi)"
            ),
        };
        // The shipped ConfigMap's config.yaml, with the contender's changes.
        let agent = format!(
            "apiVersion: node-monitor.io/v1alpha1\nkind: NodeMonitorConfiguration\n\
             evictionHard:\n  memory.available: \"{threshold_mib}Mi\"\n  nodefs.available: \
             \"10%\"\n  nodefs.inodesFree: \"5%\"\n  imagefs.available: \"15%\"\n  \
             imagefs.inodesFree: \"5%\"\nevictionPressureTransitionPeriod: 5m\nnodeMonitor:\n  \
             maxPodsPerCycle: 1\n  pdbPolicy: respect\n  dryRun: {dry_run}\n  \
             predictiveEviction: {predictive}\n"
        );
        // Setting one hard threshold drops the kubelet's other defaults: all are given.
        let kubelet_extra = if threshold_mib == 100 {
            String::new()
        } else {
            format!(
                "evictionHard:\n  memory.available: \"{threshold_mib}Mi\"\n  nodefs.available: \
                 \"10%\"\n  nodefs.inodesFree: \"5%\"\n  imagefs.available: \"15%\"\n"
            )
        };
        Ok(Self {
            name: name.to_owned(),
            threshold_mib,
            agent,
            kubelet_extra,
        })
    }
}

/// The guest's sampler: every 100 ms, one line of `EPOCHREALTIME memory.available MemAvailable
/// oom_kill workload-alive` (bytes) to /mnt/out/mem.log.
const SAMPLER: &str = r#"cat > /tmp/nm-sampler.sh <<'EOF'
# Never the kernel's OOM victim: the sampler must outlive the kills it counts.
echo -1000 > /proc/self/oom_score_adj
while :; do
  t=$EPOCHREALTIME
  while read -r k v _; do
    case $k in MemTotal:) total=$v ;; MemAvailable:) avail=$v ;; esac
  done < /proc/meminfo
  anon=0; file=0; inactive=0
  while read -r k v; do
    case $k in anon) anon=$v ;; file) file=$v ;; inactive_file) inactive=$v ;; esac
  done < /sys/fs/cgroup/memory.stat
  while read -r k v; do [ "$k" = oom_kill ] && oom=$v; done < /proc/vmstat
  alive=0
  for f in /sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod*.slice/cri-containerd-*.scope/cgroup.procs; do
    [ -e "$f" ] || continue
    while read -r p; do read -r c < /proc/$p/comm && [ "$c" = nm-workload ] && alive=1; done < "$f" 2>/dev/null
  done
  echo "$t $(( total * 1024 - (anon + file - inactive) )) $(( avail * 1024 )) $oom $alive" >> /mnt/out/mem.log
  sleep 0.1
done
EOF
setsid nohup bash /tmp/nm-sampler.sh > /dev/null 2>&1 < /dev/null &
echo started"#;

/// One line of the sampler.
#[derive(Debug, Clone, Copy)]
struct Point {
    at: f64,
    available: i64,
    mem_available: i64,
    oom_kills: u64,
    alive: bool,
}

fn points(node: &RealNode) -> Vec<Point> {
    let text = node.read_out("mem.log").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(Point {
                at: f.first()?.parse().ok()?,
                available: f.get(1)?.parse().ok()?,
                mem_available: f.get(2)?.parse().ok()?,
                oom_kills: f.get(3)?.parse().ok()?,
                alive: *f.get(4)? == "1",
            })
        })
        .collect()
}

/// A workload the bench runs.
#[derive(Debug, Clone)]
struct Load {
    label: String,
    args: Vec<String>,
    /// A ramp that would exhaust the node (an eviction is right); otherwise evicting is needless.
    exhausts: bool,
}

fn loads(args: &Args) -> Vec<Load> {
    let mut v: Vec<Load> = args
        .steps
        .iter()
        .map(|step| Load {
            label: format!("ramp {step}"),
            args: vec![
                "--ramp-to".into(),
                "3Gi".into(),
                "--step".into(),
                step.clone(),
            ],
            exhausts: true,
        })
        .collect();
    if args.false_positives {
        let s = |v: &[&str]| v.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
        v.push(Load {
            label: "sawtooth".into(),
            args: s(&[
                "--ramp-to",
                "640Mi",
                "--step",
                "64Mi",
                "--cycles",
                "10",
                "--sleep",
                "5s",
            ]),
            exhausts: false,
        });
        v.push(Load {
            label: "page cache".into(),
            args: s(&[
                "--cache-file",
                "/tmp/cache",
                "--cache-size",
                "768Mi",
                "--cache-passes",
                "5",
                "--sleep",
                "5s",
            ]),
            exhausts: false,
        });
        v.push(Load {
            label: "burst".into(),
            args: s(&["--ramp-to", "512Mi", "--step", "256Mi", "--sleep", "15s"]),
            exhausts: false,
        });
    }
    v
}

/// One workload's outcome.
#[derive(Debug)]
struct Outcome {
    contender: String,
    load: String,
    exhausts: bool,
    evicted_by: Vec<String>,
    /// Crossing → first eviction Event, seconds (guest clock).
    crossing_to_eviction: Option<f64>,
    /// Crossing → the workload's process gone, seconds.
    crossing_to_gone: Option<f64>,
    /// Start → first eviction Event, seconds.
    evicted_at: Option<f64>,
    lowest_available_mib: i64,
    lowest_mem_available_mib: i64,
    predicted: bool,
    oom_kills: u64,
}

/// `Evicted` Events on `name`: (component, guest time in seconds since the epoch, message).
async fn evicted_events(client: &Client, name: &str) -> Vec<(String, f64, String)> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let Ok(list) = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
    else {
        return Vec::new();
    };
    let mut v: Vec<(String, f64, String)> = list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("Evicted"))
        .map(|e| {
            let by = e
                .reporting_component
                .clone()
                .filter(|c| !c.is_empty())
                .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                .unwrap_or_default();
            let at = e
                .event_time
                .as_ref()
                .map(|t| t.0.as_microsecond() as f64 / 1e6)
                .or(e.first_timestamp.as_ref().map(|t| t.0.as_second() as f64))
                .unwrap_or(0.0);
            (by, at, e.message.unwrap_or_default())
        })
        .collect();
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    v
}

/// Waits until the kubelet reports no `MemoryPressure`: for its transition period (5 minutes)
/// after an eviction of its own it refuses BestEffort pods at admission, so a ramp started then
/// would never run.
async fn until_no_memory_pressure(client: &Client, node: &RealNode) -> Result<()> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let started = Instant::now();
    loop {
        let n = nodes.get(node_monitor_tests::real_node::NODE).await?;
        let pressure = n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "MemoryPressure" && c.status == "True");
        if !pressure {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(420) && node.running(),
            "the kubelet still reports MemoryPressure after 420 s"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Runs `load` as pod `name` until its process is gone (or `limit`), then deletes it.
async fn run_load(client: &Client, node: &RealNode, name: &str, load: &Load) -> Result<()> {
    until_no_memory_pressure(client, node).await?;
    let mut command = vec!["/usr/local/bin/nm-workload"];
    command.extend(load.args.iter().map(String::as_str));
    command.extend(["--interval", "100ms"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &workload(name, &command).build())
        .await?;
    let started = Instant::now();
    loop {
        let done = match pods.get_opt(name).await? {
            None => true,
            Some(p) => p
                .status
                .and_then(|s| s.phase)
                .is_some_and(|ph| ph == "Succeeded" || ph == "Failed"),
        };
        if done || started.elapsed() > Duration::from_secs(240) || !node.running() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Give a late eviction by either side time to show, then settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let _ = pods.delete(name, &DeleteParams::default()).await;
    while pods.get_opt(name).await?.is_some() && started.elapsed() < Duration::from_secs(420) {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    Ok(())
}

/// What the samples from `from` on say about the load run as `name`.
async fn outcome(
    client: &Client,
    node: &RealNode,
    c: &Contender,
    load: &Load,
    name: &str,
    from: usize,
) -> Outcome {
    let all = points(node);
    let window = &all[from.min(all.len())..];
    let start = window.iter().find(|p| p.alive).map_or(0.0, |p| p.at);
    let threshold = c.threshold_mib << 20;
    let crossing = window
        .iter()
        .find(|p| p.at >= start && p.available < threshold)
        .map(|p| p.at);
    let gone = window
        .iter()
        .find(|p| p.at > start && !p.alive)
        .map(|p| p.at);
    let events = evicted_events(client, name).await;
    let first = events.first();
    let since = |a: Option<f64>, b: Option<f64>| Some(b? - a?);
    Outcome {
        contender: c.name.clone(),
        load: load.label.clone(),
        exhausts: load.exhausts,
        evicted_by: events.iter().map(|(by, _, _)| by.clone()).collect(),
        crossing_to_eviction: since(crossing, first.map(|e| e.1)),
        crossing_to_gone: since(crossing, gone),
        evicted_at: first.map(|e| e.1 - start),
        lowest_available_mib: window.iter().map(|p| p.available).min().unwrap_or(0) >> 20,
        lowest_mem_available_mib: window.iter().map(|p| p.mem_available).min().unwrap_or(0) >> 20,
        predicted: events.iter().any(|(_, _, m)| m.contains("Predicted:")),
        oom_kills: match (window.first(), window.last()) {
            (Some(a), Some(b)) => b.oom_kills.saturating_sub(a.oom_kills),
            _ => 0,
        },
    }
}

async fn contender(args: &Args, c: &Contender, n: &mut usize) -> Result<Vec<Outcome>> {
    let options = RealNodeOptions {
        kubelet_config_extra: c.kubelet_extra.clone(),
        ..RealNodeOptions::default()
    };
    let Installed {
        cp,
        client,
        mut node,
        ..
    } = install("base", Some(&c.agent), &options).await;
    guest_step(
        &mut node,
        "memory sampler",
        SAMPLER,
        Duration::from_secs(30),
    )
    .await;
    let mut outcomes = Vec::new();
    for run in 1..=args.runs {
        for load in loads(args) {
            *n += 1;
            let name = format!("spike-{n}");
            let from = points(&node).len();
            run_load(&client, &node, &name, &load)
                .await
                .with_context(|| format!("{}, {}, run {run}", c.name, load.label))?;
            let o = outcome(&client, &node, c, &load, &name, from).await;
            eprintln!("{o:?}");
            outcomes.push(o);
        }
    }
    node.finish().await.context("guest run")?;
    cp.stop().context("stop control plane")?;
    Ok(outcomes)
}

fn print(outcomes: &[Outcome]) {
    let secs = |v: Option<f64>| v.map_or("-".to_owned(), |s| format!("{s:.1} s"));
    println!(
        "| contender | workload | evicted by | predicted | evicted at | crossing → eviction | \
         crossing → gone | lowest memory.available | lowest MemAvailable | kernel OOM kills | \
         needless |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for o in outcomes {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} MiB | {} MiB | {} | {} |",
            o.contender,
            o.load,
            if o.evicted_by.is_empty() {
                "-".to_owned()
            } else {
                o.evicted_by.join(", ")
            },
            if o.predicted { "yes" } else { "-" },
            secs(o.evicted_at),
            secs(o.crossing_to_eviction),
            secs(o.crossing_to_gone),
            o.lowest_available_mib,
            o.lowest_mem_available_mib,
            o.oom_kills,
            if !o.exhausts && !o.evicted_by.is_empty() {
                "yes"
            } else {
                "-"
            },
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let contenders = args
        .contenders
        .iter()
        .map(|c| Contender::parse(c))
        .collect::<Result<Vec<_>>>()?;
    let mut outcomes = Vec::new();
    let mut n = 0;
    for c in &contenders {
        outcomes.extend(contender(&args, c, &mut n).await?);
    }
    print(&outcomes);
    Ok(())
}
