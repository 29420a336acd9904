//! Reaction on cgroup v1 and v2 side by side, in one guest: the same Debian guest (kernel 6.1,
//! systemd 252) booted once with `systemd.unified_cgroup_hierarchy=0` (v1 controllers, the
//! memcg threshold eventfd) and once with v2 (the memory push), the same ramps, the same ground
//! truth and the release agent, with N idle pods on the node.
//!
//! Each boot: the kubelet stand-in (systemd driver) with its node cgroup at 700 MiB plus 4 MiB per
//! idle pod, the release agent with `memory.available<350Mi` (predictive eviction off unless
//! `--predictive`: this measures what reports the crossing), against the host's control plane.
//! The host starts the idle pods (`sleep`, one process each, in its own pod cgroup: every pass
//! samples them and every decision ranks them), then BestEffort climbers one at a time, each
//! ramping 8 MiB every 500 ms until evicted. Ground truth: `bench-v2-crossing truth` in the guest,
//! reading the node cgroup every 200 µs and printing the time of each fall below the threshold.
//! The end point is the agent's `evicting` log line (the eviction request follows at once), on
//! the same clock. The agent's `decision` line before each eviction splits the figure into the
//! wait for the wake-up, the time queued behind another cycle and the pass itself.
//!
//! ```sh
//! cargo xtask bench guest-reaction -- --cgroup v1,v2 --pods 0,110 --climbs 10
//! ```
//!
//! Root, qemu, the guest image and the control-plane binaries are required. See
//! docs/benchmarks.md ("cgroup v1 and v2 in one guest").
use std::{
    fmt::Write as _,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::Parser;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};
use node_monitor_tests::{
    cgroup::require_root,
    control_plane::{ControlPlane, ControlPlaneOptions},
    pod::PodBuilder,
    reaction::{self, Reaction},
    vm::{ENTRY_PRELUDE, Guest, GuestOptions, GuestRun, Payload, report},
};

const NODE: &str = "vm-node";
const NS: &str = "default";
const NODE_MEMORY_MI: u64 = 700;
const THRESHOLD_MI: u64 = 350;
/// The node's memory per idle pod, so that the crossing is still the climber's.
const PER_POD_MI: u64 = 4;
const REPORT_FILES: &[&str] = &["entry.log", "standin.log", "agent.log", "truth.stderr"];

#[derive(Parser, Debug)]
#[command(about = "Crossing → eviction on cgroup v1 and v2 in one guest, with N idle pods")]
struct Args {
    /// The hierarchies to boot, in order: `v1`, `v2` or both (`v1,v2`).
    #[arg(long, value_delimiter = ',', default_values = ["v1", "v2"], value_parser = parse_cgroup)]
    cgroup: Vec<Cgroup>,
    /// Idle pods on the node, one boot per count (at most 500).
    #[arg(long, value_delimiter = ',', default_values_t = [0u32], value_parser = parse_pods)]
    pods: Vec<u32>,
    /// Climbers per boot, one after the other (1–50).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=50))]
    climbs: u32,
    /// Leave predictive eviction on (the default agent's): the fall may be acted on before
    /// the crossing, which this measurement is not about.
    #[arg(long)]
    predictive: bool,
    /// Where each boot's guest files are kept.
    #[arg(long, default_value = "/tmp/bench-guest-reaction")]
    out: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cgroup {
    V1,
    V2,
}

impl Cgroup {
    fn label(self) -> &'static str {
        match self {
            Self::V1 => "v1",
            Self::V2 => "v2",
        }
    }

    /// The kernel command line that selects it (the image boots v2 otherwise).
    fn cmdline(self) -> &'static str {
        match self {
            Self::V1 => "systemd.unified_cgroup_hierarchy=0",
            Self::V2 => "",
        }
    }

    /// The node cgroup's directory in the guest.
    fn node_cgroup(self) -> &'static str {
        match self {
            Self::V1 => "/sys/fs/cgroup/memory/node-monitor-test/vm-node",
            Self::V2 => "/sys/fs/cgroup/node-monitor-test/vm-node",
        }
    }
}

fn parse_cgroup(s: &str) -> Result<Cgroup, String> {
    match s {
        "v1" => Ok(Cgroup::V1),
        "v2" => Ok(Cgroup::V2),
        other => Err(format!("--cgroup: {other:?} is neither v1 nor v2")),
    }
}

fn parse_pods(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n <= 500 => Ok(n),
        Ok(n) => Err(format!("--pods: {n} is over 500")),
        Err(e) => Err(format!("--pods: {s:?}: {e}")),
    }
}

/// The guest: the stand-in, the release agent and the ground truth, until the host says finish.
const SCRIPT: &str = r#"
log "entry started; uptime $(uptime_s); $(uname -r)"
stat -fc %T /sys/fs/cgroup > /mnt/out/cgroup-fs
for _ in $(seq 750); do [ -e /mnt/host/kubeconfig ] && break; sleep 0.2; done
[ -e /mnt/host/kubeconfig ] || { log "no kubeconfig from the host"; systemctl poweroff -ff; }
mkdir -p /var/lib/kubelet
ready() {
  ( exec 4<>/dev/tcp/127.0.0.1/9101 && printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&4 \
      && read -r _ status _ <&4 && [ "$status" = 200 ] ) 2>/dev/null
}
metrics() {
  ( exec 3<>/dev/tcp/127.0.0.1/9101 && printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 \
      && cat <&3 > /mnt/out/.metrics.tmp && mv /mnt/out/.metrics.tmp /mnt/out/metrics.txt ) 2>/dev/null
}
/mnt/host/nm-kubelet-standin --kubeconfig /mnt/host/kubeconfig --node-name vm-node \
  --cgroup-root /node-monitor-test/vm-node --memory @NODE_MEMORY@Mi --systemd-cgroups \
  > /mnt/out/standin.log 2>&1 &
within 120 grep -q NM_READY=1 /mnt/out/standin.log || log "the stand-in did not start"
RUST_LOG=info,node_monitor=debug NO_COLOR=1 /mnt/host/node-monitor run \
  --config /mnt/host/config.yaml --node-name vm-node --kubeconfig /mnt/host/kubeconfig \
  --node-cgroup node-monitor-test/vm-node --kubepods-cgroup kubepods.slice \
  --metrics-addr 127.0.0.1:9101 --no-mlock > /mnt/out/agent.log 2>&1 &
until ready; do sleep 0.5; done
log "agent ready; uptime $(uptime_s)"
/mnt/host/bench-v2-crossing truth --node @NODE_CG@ --threshold-mi @THRESHOLD@ \
  > /mnt/out/crossings 2> /mnt/out/truth.stderr &
wait_for /mnt/host/go-finish
metrics
log "done; uptime $(uptime_s)"
sync
systemctl poweroff -ff
"#;

fn config(predictive: bool) -> String {
    format!(
        "evictionHard:\n  memory.available: {THRESHOLD_MI}Mi\nnodeMonitor:\n  predictiveEviction: {predictive}\n"
    )
}

fn pod(name: &str, command: &[&str]) -> Pod {
    PodBuilder::new(name)
        .namespace(NS)
        .node(NODE)
        .termination_grace(5)
        .image("nm-workload")
        .command(command)
        .build()
}

/// Waits until every pod in `names` runs, or fails with the guest's files.
async fn wait_running(api: &Api<Pod>, names: &[String], guest: &Guest) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120 + 2 * names.len() as u64);
    for name in names {
        loop {
            let phase = api
                .get_opt(name)
                .await?
                .and_then(|p| p.status)
                .and_then(|s| s.phase);
            if phase.as_deref() == Some("Running") {
                break;
            }
            if !guest.running() {
                bail!("the guest ended before {name} ran");
            }
            if Instant::now() > deadline {
                bail!("{name} not Running in time ({phase:?})");
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    Ok(())
}

/// One climber, created and watched until it is gone from the API.
async fn climb(api: &Api<Pod>, name: &str, guest: &Guest) -> Result<()> {
    let command = [
        "/mnt/host/nm-workload",
        "--ramp-to",
        "900Mi",
        "--step",
        "8Mi",
        "--interval",
        "500ms",
    ];
    api.create(&PostParams::default(), &pod(name, &command))
        .await
        .with_context(|| format!("create {name}"))?;
    wait_running(api, &[name.to_owned()], guest).await?;
    let deadline = Instant::now() + Duration::from_secs(240);
    while api.get_opt(name).await?.is_some() {
        if !guest.running() {
            bail!("the guest ended before {name} was evicted");
        }
        if Instant::now() > deadline {
            bail!("{name} was not evicted within 240 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Memory back above the threshold's re-arm level before the next climb.
    tokio::time::sleep(Duration::from_secs(3)).await;
    Ok(())
}

/// The host's part of one boot: the idle pods, then the climbs.
async fn drive(client: &Client, pods: u32, climbs: u32, guest: &Guest) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(300);
    let nodes: Api<Node> = Api::all(client.clone());
    while nodes.get_opt(NODE).await.ok().flatten().is_none() {
        if !guest.running() || Instant::now() > deadline {
            bail!("the stand-in never registered its node");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let idle: Vec<String> = (0..pods).map(|i| format!("idle-{i}")).collect();
    for name in &idle {
        api.create(
            &PostParams::default(),
            &pod(name, &["/bin/sleep", "infinity"]),
        )
        .await
        .with_context(|| format!("create {name}"))?;
    }
    wait_running(&api, &idle, guest).await?;
    eprintln!("  {pods} idle pods running");
    for i in 1..=climbs {
        let started = Instant::now();
        climb(&api, &format!("climber-{i}"), guest).await?;
        eprintln!(
            "  climber-{i} evicted and gone in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    for name in &idle {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    Ok(())
}

/// One boot's figures.
struct BootResult {
    cgroup: Cgroup,
    pods: u32,
    reactions: Vec<Reaction>,
    /// Climbers evicted on a prediction, before any crossing.
    predicted: usize,
    /// Evictions at a crossing the ground truth did not see.
    unseen: usize,
}

async fn boot(args: &Args, cgroup: Cgroup, pods: u32) -> Result<BootResult> {
    let node_memory = NODE_MEMORY_MI + PER_POD_MI * u64::from(pods);
    let script = SCRIPT
        .replace("@NODE_MEMORY@", &node_memory.to_string())
        .replace("@THRESHOLD@", &THRESHOLD_MI.to_string())
        .replace("@NODE_CG@", cgroup.node_cgroup());
    let payload = Payload::new("nm-guest-reaction")?;
    payload.link_binaries(&[
        "node-monitor",
        "nm-kubelet-standin",
        "nm-workload",
        "bench-v2-crossing",
    ])?;
    payload.write("config.yaml", config(args.predictive))?;
    payload.entry(&format!("{ENTRY_PRELUDE}{script}"))?;
    let memory_mib = u32::try_from(node_memory + 900).context("guest memory")?;
    let guest = Guest::boot(
        payload.path(),
        GuestOptions {
            memory_mib,
            cmdline: cgroup.cmdline().to_owned(),
            timeout: Duration::from_secs(600 + 300 * u64::from(args.climbs) / 10 + u64::from(pods)),
            ..Default::default()
        },
    );
    let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
    payload.kubeconfig(&cp)?;
    let driven = drive(&cp.client(), pods, args.climbs, &guest).await;
    payload.signal("go-finish")?;
    let run = guest.finish().await;
    cp.stop()?;
    let run = run?;
    keep(&run, &args.out.join(format!("{}-{pods}", cgroup.label())));
    if let Err(e) = driven {
        bail!("{e:#}\n{}", report(&run, REPORT_FILES));
    }
    let fs = run.read_out("cgroup-fs").unwrap_or_default();
    let expected = if cgroup == Cgroup::V1 {
        "tmpfs"
    } else {
        "cgroup2fs"
    };
    if fs.trim() != expected {
        bail!(
            "booted for cgroup {} but /sys/fs/cgroup is {fs:?}",
            cgroup.label()
        );
    }
    let crossings = run.read_out("crossings").unwrap_or_default();
    let agent_log = run.read_out("agent.log").unwrap_or_default();
    let reactions = reaction::reaction_times(&crossings, &agent_log, "climber");
    if reactions.at_crossing.is_empty() {
        bail!(
            "no eviction pairs with a crossing:\n{crossings}\n{}",
            report(&run, REPORT_FILES)
        );
    }
    Ok(BootResult {
        cgroup,
        pods,
        predicted: reactions.predicted,
        unseen: reactions.unseen.len(),
        reactions: reactions.at_crossing,
    })
}

fn keep(run: &GuestRun, dir: &std::path::Path) {
    let _ = std::fs::create_dir_all(dir);
    for f in [
        "entry.log",
        "standin.log",
        "agent.log",
        "crossings",
        "metrics.txt",
    ] {
        if let Ok(text) = run.read_out(f) {
            let _ = std::fs::write(dir.join(f), text);
        }
    }
}

/// The milliseconds a `decision` line's field gives (`name_us=N`).
fn field_ms(line: &str, name: &str) -> Option<f64> {
    line.split_whitespace()
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.trim_matches('"').parse::<f64>().ok())
        .map(|us| us / 1e3)
}

fn summary(results: &[BootResult]) -> String {
    let mut out = String::from(
        "| cgroup | idle pods | climbs at a crossing | predicted | unseen by the ground truth | crossing → evicting p50 | p99 (= max) | min | woken by | the pass (wake-up's cycle start → decision) p50 / max |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let mut ms: Vec<f64> = r.reactions.iter().map(|x| x.ms).collect();
        ms.sort_by(f64::total_cmp);
        let mut sources: Vec<(String, usize)> = Vec::new();
        for x in &r.reactions {
            match sources.iter_mut().find(|(s, _)| *s == x.source) {
                Some((_, n)) => *n += 1,
                None => sources.push((x.source.clone(), 1)),
            }
        }
        let woken: Vec<String> = sources
            .iter()
            .map(|(s, n)| format!("`{s}` {n}/{}", r.reactions.len()))
            .collect();
        let mut pass: Vec<f64> = r
            .reactions
            .iter()
            .filter_map(|x| field_ms(&x.decision, "processing_us"))
            .collect();
        pass.sort_by(f64::total_cmp);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {} | {} |",
            r.cgroup.label(),
            r.pods,
            ms.len(),
            r.predicted,
            r.unseen,
            reaction::percentile(&ms, 50.0),
            reaction::percentile(&ms, 99.0),
            ms.first().copied().unwrap_or_default(),
            woken.join(", "),
            if pass.is_empty() {
                "-".to_owned()
            } else {
                format!(
                    "{:.1} / {:.1} ms",
                    reaction::percentile(&pass, 50.0),
                    pass[pass.len() - 1]
                )
            }
        );
    }
    out
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    require_root("bench-guest-reaction");
    let mut results = Vec::new();
    for &pods in &args.pods {
        for &cgroup in &args.cgroup {
            eprintln!("boot: cgroup {} with {pods} idle pods", cgroup.label());
            let r = boot(&args, cgroup, pods).await?;
            for x in &r.reactions {
                eprintln!("  {:.1} ms ({}) {}", x.ms, x.source, x.decision);
            }
            results.push(r);
        }
    }
    println!("{}", summary(&results));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_arguments_are_named() {
        assert!(parse_cgroup("v3").unwrap_err().contains("\"v3\""));
        assert!(parse_pods("501").unwrap_err().contains("501"));
        assert!(parse_pods("x").unwrap_err().contains("--pods"));
        assert_eq!(parse_pods("500"), Ok(500));
    }

    #[test]
    fn the_decision_line_is_split_into_milliseconds() {
        let l =
            "2026-11-29T10:00:00Z DEBUG decision decided_us=1500 queued_us=20 processing_us=830";
        assert_eq!(field_ms(l, "processing_us"), Some(0.83));
        assert_eq!(field_ms(l, "queued_us"), Some(0.02));
        assert_eq!(field_ms(l, "other_us"), None);
    }
}
