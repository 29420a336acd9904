//! Page-cache benchmark: a cache-heavy node with the kubelet's working set
//! (`nodeMonitor.memoryWorkingSet: kubelet`, the default) and with reclaimable active page cache
//! left out (`reclaimable`). Evictions, kernel OOM kills and the lowest free memory of each.
//!
//! A stand-in node with real cgroup v1 memory cgroups (root, the host's v1 hierarchy, under
//! `node-monitor-test/`) and the agent (`NODE_MONITOR_AGENT_PROFILE=release` runs the release
//! build). Each run starts a fresh agent with `memory.available<THRESHOLD` and one of the two
//! settings, then:
//!
//! - a `reader` pod (Burstable, 64Mi request) writes a file set larger than the threshold's
//!   margin (synced, so clean) and reads it again and again: its page cache goes active;
//! - once the node's `total_active_file` holds most of the set, a BestEffort `ramp` pod allocates
//!   anonymous memory in 16 MiB steps every 100 ms, up to `--ramp-mi` (scenario `cache`: it fits
//!   beside the cache, which the kernel can drop) or `--pressure-ramp-mi` (scenario `pressure`:
//!   more than the node has; only an eviction prevents an OOM kill);
//! - for `--hold-s` seconds after the ramp started, a thread reads the node cgroup every 10 ms:
//!   the lowest free memory (`limit − usage_in_bytes`) and the lowest `memory.available` under
//!   each formula, computed here from `memory.stat`.
//!
//! Evictions are the agent's `node_monitor_evictions_total{outcome="evicted"}`; OOM kills the
//! node cgroup's `memory.oom_control` `oom_kill` and `/proc/vmstat` `oom_kill` (no dmesg), as
//! deltas over the run. See docs/benchmarks.md ("Page cache").
//!
//! ```sh
//! cargo bins
//! cargo build --release -p node-monitor --bin node-monitor
//! NODE_MONITOR_AGENT_PROFILE=release target/debug/bench-pagecache --runs 2
//! ```
use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use kube::api::DeleteParams;
use node_monitor_tests::{
    e2e::{Agent, Cluster},
    pod::PodBuilder,
};

const MIB: u64 = 1 << 20;
const MI: i64 = 1 << 20;
const NS: &str = "default";

#[derive(Parser)]
struct Args {
    /// Rounds; each runs both scenarios with both settings.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// The node's memory (its cgroup's limit), MiB.
    #[arg(long, default_value_t = 1024)]
    node_mi: u64,
    /// The hard threshold `memory.available<N Mi`.
    #[arg(long, default_value_t = 150)]
    threshold_mi: u64,
    /// The reader's file set, MiB (written in 32 MiB files).
    #[arg(long, default_value_t = 512)]
    cache_mi: u64,
    /// Where the reader's files go: a disk filesystem (on tmpfs they would be shmem).
    #[arg(long, default_value = "/var/tmp")]
    scratch: PathBuf,
    /// Scenario `cache`: the ramp pod's anonymous memory, MiB.
    #[arg(long, default_value_t = 400)]
    ramp_mi: u64,
    /// Scenario `pressure`: the ramp pod's anonymous memory, MiB (more than the node).
    #[arg(long, default_value_t = 1200)]
    pressure_ramp_mi: u64,
    /// How long each run watches after the ramp starts, seconds.
    #[arg(long, default_value_t = 20)]
    hold_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Cache,
    Pressure,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Cache => "cache",
            Self::Pressure => "pressure",
        }
    }
}

/// One run's figures.
#[derive(Debug, Clone)]
struct Row {
    scenario: Scenario,
    setting: &'static str,
    evictions: f64,
    evicted: Vec<String>,
    oom_node: u64,
    oom_host: u64,
    active_file_at_ramp: u64,
    min: Minima,
}

/// The lowest values seen by the watcher, bytes.
#[derive(Debug, Clone, Copy)]
struct Minima {
    free: i64,
    kubelet_available: i64,
    reclaimable_available: i64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    node_monitor_tests::cgroup::require_root("bench-pagecache");
    if fs::read_to_string("/proc/self/mountinfo")?
        .lines()
        .any(|l| l.split_whitespace().nth(4) == args.scratch.to_str() && l.contains(" - tmpfs "))
    {
        bail!(
            "--scratch {}: a tmpfs; the cache would be shmem",
            args.scratch.display()
        );
    }
    let cluster = Cluster::start("pagecache-node", args.node_mi * MIB).await?;
    let mut rows = Vec::new();
    let mut result = Ok(());
    'all: for run in 0..args.runs {
        for scenario in [Scenario::Cache, Scenario::Pressure] {
            for setting in ["kubelet", "reclaimable"] {
                match one_run(&cluster, &args, run, scenario, setting).await {
                    Ok(row) => {
                        print_row(&row);
                        rows.push(row);
                    }
                    Err(e) => {
                        result = Err(e.context(format!("{} {setting} run {run}", scenario.name())));
                        break 'all;
                    }
                }
            }
        }
    }
    summary(&rows);
    cluster.stop().await?;
    result
}

async fn one_run(
    cluster: &Cluster,
    args: &Args,
    run: usize,
    scenario: Scenario,
    setting: &'static str,
) -> Result<Row> {
    let config = format!(
        "evictionHard:\n  memory.available: {}Mi\nnodeMonitor:\n  memoryWorkingSet: {setting}\n",
        args.threshold_mi
    );
    let mut agent = Agent::start(cluster, &config, &["--no-mlock"]).await?;
    let tag = format!("{}-{setting}-{run}", scenario.name());
    let dir = args
        .scratch
        .join(format!("nm-pagecache-{}-{tag}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| dir.display().to_string())?;
    let reader = format!("reader-{tag}");
    let ramp = format!("ramp-{tag}");
    let out = watched_run(
        cluster, args, scenario, setting, &agent, &dir, &reader, &ramp,
    )
    .await;
    let stopped = agent.terminate();
    // Whatever happened: no pod left, no file left (deleting the files uncharges their cache).
    for name in [&reader, &ramp] {
        let _ = cluster
            .pods(NS)
            .delete(name, &DeleteParams::default().grace_period(0))
            .await;
        cluster.wait_gone(NS, name, Duration::from_secs(30)).await?;
    }
    fs::remove_dir_all(&dir).with_context(|| format!("remove {}", dir.display()))?;
    stopped?;
    let row = out.with_context(|| format!("agent log:\n{}", agent.log()))?;
    // Let the node's memory settle before the next run.
    cluster.settled_memory_available().await?;
    Ok(row)
}

#[expect(clippy::too_many_arguments, reason = "one run's parts, each used once")]
async fn watched_run(
    cluster: &Cluster,
    args: &Args,
    scenario: Scenario,
    setting: &'static str,
    agent: &Agent,
    dir: &Path,
    reader: &str,
    ramp: &str,
) -> Result<Row> {
    let files = args.cache_mi.div_ceil(32);
    let script = format!(
        "set -e; d={d}; for i in $(seq 1 {files}); do \
         dd if=/dev/zero of=$d/f$i bs=1M count=32 conv=fsync status=none; done; \
         while true; do cat $d/* > /dev/null; sleep 0.2; done",
        d = dir.display()
    );
    let pod = PodBuilder::new(reader)
        .namespace(NS)
        .label("app", reader)
        .node(&cluster.node)
        .termination_grace(1)
        .image("sh")
        .command(["/bin/sh", "-c", &script])
        .memory("64Mi", None)
        .build();
    cluster.create_pod(pod).await?;
    cluster
        .wait_running(NS, reader, Duration::from_secs(60))
        .await?;
    let node = cluster.node_memory_dir();
    let want = args.cache_mi * MIB * 85 / 100;
    let deadline = Instant::now() + Duration::from_secs(120);
    let active_file_at_ramp = loop {
        let active = stat_field(
            &fs::read_to_string(node.join("memory.stat"))?,
            "total_active_file",
        )
        .context("total_active_file")?;
        if active >= want {
            break active;
        }
        if Instant::now() > deadline {
            bail!("the reader's cache did not go active: total_active_file {active} < {want}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let oom_node = cluster.oom_kills()?;
    let oom_host = vmstat_oom_kills()?;
    let stop = Arc::new(AtomicBool::new(false));
    let minima = Arc::new(Mutex::new(None::<Minima>));
    let watcher = {
        let (stop, minima, node) = (stop.clone(), minima.clone(), node.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(now) = read_node(&node) {
                    let mut m = minima.lock().unwrap_or_else(|e| e.into_inner());
                    *m = Some(match *m {
                        None => now,
                        Some(m) => Minima {
                            free: m.free.min(now.free),
                            kubelet_available: m.kubelet_available.min(now.kubelet_available),
                            reclaimable_available: m
                                .reclaimable_available
                                .min(now.reclaimable_available),
                        },
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let to = match scenario {
        Scenario::Cache => args.ramp_mi,
        Scenario::Pressure => args.pressure_ramp_mi,
    };
    cluster
        .create_pod(
            PodBuilder::ramping(ramp, &cluster.node, &format!("{to}Mi"), "16Mi", "100ms").build(),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(args.hold_s)).await;
    stop.store(true, Ordering::Relaxed);
    watcher
        .join()
        .map_err(|_| anyhow::anyhow!("the watcher panicked"))?;

    let evictions = agent
        .metric_sum("node_monitor_evictions_total", &[("outcome", "evicted")])
        .await?;
    let mut evicted = Vec::new();
    for name in [reader, ramp] {
        if !cluster.is_live(NS, name).await? {
            evicted.push(name.split('-').next().unwrap_or(name).to_owned());
        }
    }
    let min = minima
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .context("the watcher read nothing")?;
    Ok(Row {
        scenario,
        setting,
        evictions,
        evicted,
        oom_node: cluster.oom_kills()? - oom_node,
        oom_host: vmstat_oom_kills()?.saturating_sub(oom_host),
        active_file_at_ramp,
        min,
    })
}

/// Free memory and `memory.available` under both formulas, now.
fn read_node(node: &Path) -> Option<Minima> {
    let read = |f: &str| fs::read_to_string(node.join(f)).ok();
    let limit: i64 = read("memory.limit_in_bytes")?.trim().parse().ok()?;
    let usage: u64 = read("memory.usage_in_bytes")?.trim().parse().ok()?;
    let stat = read("memory.stat")?;
    let f = |k| stat_field(&stat, k);
    let figures = node_monitor_core::signals::MemoryStatFigures {
        usage,
        inactive_file: f("total_inactive_file")?,
        active_file: f("total_active_file")?,
        file: f("total_cache")?,
        shmem: f("total_shmem")?,
        dirty: f("total_dirty")?,
        writeback: f("total_writeback")?,
    };
    let ws = |mode| {
        i64::try_from(node_monitor_core::signals::memory_working_set(
            mode, &figures,
        ))
        .unwrap_or(i64::MAX)
    };
    use node_monitor_core::signals::MemoryWorkingSet::{Kubelet, Reclaimable};
    Some(Minima {
        free: limit - i64::try_from(usage).ok()?,
        kubelet_available: limit - ws(Kubelet),
        reclaimable_available: limit - ws(Reclaimable),
    })
}

fn stat_field(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// OOM kills on the whole host (`/proc/vmstat` `oom_kill`).
fn vmstat_oom_kills() -> Result<u64> {
    stat_field(&fs::read_to_string("/proc/vmstat")?, "oom_kill").context("oom_kill in /proc/vmstat")
}

fn print_row(r: &Row) {
    println!(
        "{:<9} {:<12} evictions {:>2} ({:<12}) oom_kill node {} host {}  active_file at ramp {:>4} MiB  \
         min free {:>5} MiB  min memory.available kubelet {:>5} MiB reclaimable {:>5} MiB",
        r.scenario.name(),
        r.setting,
        r.evictions,
        r.evicted.join(","),
        r.oom_node,
        r.oom_host,
        r.active_file_at_ramp / MIB,
        r.min.free / MI,
        r.min.kubelet_available / MI,
        r.min.reclaimable_available / MI,
    );
}

/// The Markdown table of docs/benchmarks.md: totals over the runs, per scenario and setting.
fn summary(rows: &[Row]) {
    println!();
    println!(
        "| scenario | memoryWorkingSet | runs | evictions | pods evicted | OOM kills (node / host) | min free MiB | min memory.available MiB (kubelet / reclaimable formula) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for scenario in [Scenario::Cache, Scenario::Pressure] {
        for setting in ["kubelet", "reclaimable"] {
            let rs: Vec<&Row> = rows
                .iter()
                .filter(|r| r.scenario == scenario && r.setting == setting)
                .collect();
            if rs.is_empty() {
                continue;
            }
            let mut evicted = std::collections::BTreeMap::<&str, usize>::new();
            for name in rs.iter().flat_map(|r| r.evicted.iter()) {
                *evicted.entry(name).or_default() += 1;
            }
            let evicted: Vec<String> = evicted
                .into_iter()
                .map(|(name, n)| format!("{name} ×{n}"))
                .collect();
            let min = |f: fn(&Minima) -> i64| rs.iter().map(|r| f(&r.min)).min().unwrap_or(0) / MI;
            println!(
                "| {} | `{setting}` | {} | {} | {} | {} / {} | {} | {} / {} |",
                scenario.name(),
                rs.len(),
                rs.iter().map(|r| r.evictions).sum::<f64>(),
                if evicted.is_empty() {
                    "none".to_owned()
                } else {
                    evicted.join(", ")
                },
                rs.iter().map(|r| r.oom_node).sum::<u64>(),
                rs.iter().map(|r| r.oom_host).sum::<u64>(),
                min(|m| m.free),
                min(|m| m.kubelet_available),
                min(|m| m.reclaimable_available),
            );
        }
    }
}
