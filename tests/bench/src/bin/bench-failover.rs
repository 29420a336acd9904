//! Failover benchmark: how long after a node dies is a replacement pod Running on another node?
//!
//! For each scenario (a Deployment pod, a StatefulSet pod, a StatefulSet pod with a CSI volume)
//! a real control plane and three kubelet stand-ins in two zones are started, the pod's node is
//! killed (its stand-in paused, its pod's processes killed), and the time until the replacement
//! runs elsewhere is measured — with and without `node-monitor remediate`, under the stock
//! node lifecycle timeouts (50 s grace, 300 s tolerations, kubelet Leases of 40 s renewed every
//! 10 s) and under scaled ones (10 s grace, 10 s tolerations, 4 s Leases renewed every second).
//! A run that does not recover within the cap is reported as such.
//!
//! `--agent lease` runs the node agent's liveness Lease on every node (the agent's own renewer,
//! at its default `nodeMonitor.livenessLeaseInterval`), which stops when the node dies;
//! `--agent last-gasp` also writes the agent's last gasp as the node dies; `--agent both` runs
//! both. Each run prints the seconds from the death to remediate's `node is dead`, to the fence
//! call, to the out-of-service taint and to the replacement Running elsewhere.
//!
//! Root and the control-plane binaries are required. See docs/benchmarks.md ("Failover").
//!
//! ```sh
//! cargo bins && sudo target/debug/bench-failover --scenario all --mode both --timeouts both
//! ```
use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use node_monitor::cluster::liveness_lease::{LivenessLease, renew_until_stopped};
use node_monitor_core::config::NodeMonitorSettings;
use node_monitor_tests::{
    cgroup::{TestCgroups, require_root},
    control_plane::{ControlPlane, ControlPlaneOptions},
    e2e::{binary, free_port},
    standin::{StandIn, StandInConfig},
    workload::{self, ZONE_LABEL},
};
use serde_json::json;

const NS: &str = "node-monitor";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Deployment,
    Statefulset,
    StatefulsetVa,
    All,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Remediate,
    Stock,
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Timeouts {
    Stock,
    Scaled,
    Both,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AgentArg {
    /// No agent on the nodes (the stand-ins alone).
    None,
    /// The agent's liveness Lease on every node.
    Lease,
    /// The liveness Lease, and a last gasp as the node dies.
    LastGasp,
    /// Both of the above, one after the other.
    Both,
}

/// What the agent does on the nodes of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Agent {
    None,
    Lease,
    LastGasp,
}

#[derive(Debug, Parser)]
#[command(about = "Time from a node's death to a replacement pod Running on another node")]
struct Args {
    #[arg(long, value_enum, default_value = "all")]
    scenario: Scenario,
    #[arg(long, value_enum, default_value = "both")]
    mode: Mode,
    #[arg(long, value_enum, default_value = "both")]
    timeouts: Timeouts,
    /// Give up after this many seconds with stock timeouts.
    #[arg(long, default_value_t = 420)]
    cap_secs: u64,
    /// Give up after this many seconds with scaled timeouts.
    #[arg(long, default_value_t = 120)]
    scaled_cap_secs: u64,
    /// Runs of each combination with remediate (the runs without it are long and deterministic:
    /// one each).
    #[arg(long, default_value_t = 3)]
    runs: u32,
    /// The node agent on the nodes: its liveness Lease, and its last gasp.
    #[arg(long, value_enum, default_value = "none")]
    agent: AgentArg,
}

/// The `node-monitor` binary under test, copied once at start so a rebuild during a long run
/// cannot change it half-way.
static REMEDIATE_BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

#[derive(Debug, Clone, Copy)]
struct Setup {
    scenario: Scenario,
    remediate: bool,
    scaled: bool,
    agent: Agent,
}

impl Setup {
    fn label(&self) -> String {
        format!(
            "{:<15} {:<13} {:<7} {:<14}",
            match self.scenario {
                Scenario::Deployment => "deployment",
                Scenario::Statefulset => "statefulset",
                Scenario::StatefulsetVa => "statefulset+va",
                Scenario::All => "all",
            },
            if self.remediate {
                "remediate"
            } else {
                "no remediate"
            },
            if self.scaled { "scaled" } else { "stock" },
            match self.agent {
                Agent::None => "no agent",
                Agent::Lease => "agent",
                Agent::LastGasp => "agent+gasp",
            },
        )
    }
}

/// The fence agent: succeeds at once, recording the time of each call (Unix seconds) in the
/// file named by its `log` parameter.
const FENCE_AGENT: &str =
    "#!/bin/sh\nlog=$(sed -n 's/^log=//p')\n[ -n \"$log\" ] && date +%s.%N >> \"$log\"\nexit 0\n";

/// remediate's defaults (3 missed renewals of the Lease's interval: 10 s stock, 1 s scaled),
/// with a shorter leader lease so a run starts sooner.
const REMEDIATE_CONFIG: &str = "tickInterval: 500ms\nleaderElection: {leaseDuration: 4s, renewDeadline: 3s, retryPeriod: 1s}\n";

struct Remediate(Child);

impl Drop for Remediate {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Bench {
    remediate: Option<Remediate>,
    /// The agents' liveness Lease renewers, by node: sending `true` stops one.
    agents: BTreeMap<String, tokio::sync::watch::Sender<bool>>,
    standins: BTreeMap<String, StandIn>,
    _cgroups: TestCgroups,
    cp: ControlPlane,
    dir: tempfile::TempDir,
}

const NODES: [(&str, &str); 3] = [
    ("node-a1", "zone-a"),
    ("node-a2", "zone-a"),
    ("node-b1", "zone-b"),
];

impl Bench {
    async fn start(setup: Setup) -> Result<Bench> {
        let mut opts = ControlPlaneOptions::default();
        if setup.scenario == Scenario::StatefulsetVa {
            opts.controllers
                .push(workload::ATTACH_DETACH_CONTROLLER.to_owned());
        }
        if setup.scaled {
            opts = opts.fast_node_failover(Duration::from_secs(10), Duration::from_secs(10));
        }
        let cp = ControlPlane::start(opts).await?;
        cp.create_namespace(NS).await?;
        // remediate keeps its fencing operations in NodeFence objects.
        node_monitor_tests::manifests::install_remediate_crds(&cp.client()).await?;
        let mut cgroups = TestCgroups::new("bench-failover");
        let mut standins = BTreeMap::new();
        for (name, zone) in NODES {
            cgroups.create(name)?;
            let mut cfg = StandInConfig::new(name, cgroups.rel_root().join(name))
                .memory(256 << 20)
                .label(ZONE_LABEL, zone);
            if setup.scaled {
                cfg = cfg
                    .lease_interval(Duration::from_secs(1))
                    .status_interval(Duration::from_secs(1));
                cfg.lease_duration_seconds = 4;
            } else {
                // The kubelet's defaults: a 40 s Lease renewed every 10 s.
                cfg = cfg
                    .lease_interval(Duration::from_secs(10))
                    .status_interval(Duration::from_secs(10));
                cfg.lease_duration_seconds = 40;
            }
            let s = StandIn::start(cp.client(), cfg).await?;
            s.wait_ready(Duration::from_secs(60)).await?;
            standins.insert(name.to_owned(), s);
        }
        let dir = tempfile::Builder::new()
            .prefix("nm-bench-failover-")
            .tempdir()?;
        let agent = dir.path().join("fence-agent");
        fs::write(&agent, FENCE_AGENT)?;
        fs::set_permissions(&agent, fs::Permissions::from_mode(0o755))?;
        let mut agents = BTreeMap::new();
        if setup.agent != Agent::None {
            let interval = NodeMonitorSettings::default().liveness_lease_interval;
            for (name, _) in NODES {
                let (stop, stopped) = tokio::sync::watch::channel(false);
                tokio::spawn(renew_until_stopped(
                    LivenessLease::new(cp.client(), NS, name),
                    interval,
                    stopped,
                ));
                agents.insert(name.to_owned(), stop);
            }
        }
        let mut bench = Bench {
            remediate: None,
            agents,
            standins,
            _cgroups: cgroups,
            cp,
            dir,
        };
        if setup.remediate {
            bench.fence_config(&agent).await?;
            bench.spawn_remediate().await?;
        }
        Ok(bench)
    }

    fn client(&self) -> Client {
        self.cp.client()
    }

    async fn fence_config(&self, agent: &Path) -> Result<()> {
        let cms = [
            (
                "fence-method-template-bench",
                "template.properties",
                format!(
                    "agent_name={}\nlog={}\n",
                    agent.display(),
                    self.fence_log().display()
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
        ];
        for (name, key, text) in cms {
            workload::create_configmap(&self.client(), NS, name, key, &text).await?;
        }
        Ok(())
    }

    fn fence_log(&self) -> std::path::PathBuf {
        self.dir.path().join("fence-calls")
    }

    fn remediate_log(&self) -> std::path::PathBuf {
        self.dir.path().join("remediate.log")
    }

    /// Seconds from `t0` (Unix seconds) to the first fence call.
    fn fenced_after(&self, t0: f64) -> Option<f64> {
        let text = fs::read_to_string(self.fence_log()).ok()?;
        let first: f64 = text.lines().next()?.trim().parse().ok()?;
        Some(first - t0)
    }

    /// Seconds from `t0` (Unix seconds) to remediate's `node is dead` for `node` (its log's
    /// timestamp).
    fn dead_after(&self, node: &str, t0: f64) -> Option<f64> {
        let text = fs::read_to_string(self.remediate_log()).ok()?;
        let line = text
            .lines()
            .find(|l| l.contains("node is dead") && l.contains(node))?;
        let stamp: k8s_openapi::jiff::Timestamp = line.split_whitespace().next()?.parse().ok()?;
        Some(stamp.as_microsecond() as f64 / 1e6 - t0)
    }

    async fn out_of_service(&self, node: &str) -> Result<bool> {
        let n = Api::<Node>::all(self.client()).get(node).await?;
        Ok(n.spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service"))
    }

    async fn spawn_remediate(&mut self) -> Result<()> {
        let cfg = self.dir.path().join("remediate.yaml");
        fs::write(&cfg, REMEDIATE_CONFIG)?;
        let log = self.remediate_log();
        let out = fs::File::create(&log)?;
        let program = REMEDIATE_BIN
            .get()
            .context("the node-monitor-remediate copy")?;
        let child = Command::new(program)
            .arg("--kubeconfig")
            .arg(self.cp.kubeconfig_path())
            .args(["--namespace", NS, "--identity", "bench"])
            .args(["--metrics-addr", &format!("127.0.0.1:{}", free_port()?)])
            .arg("--config")
            .arg(&cfg)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start node-monitor-remediate")?;
        self.remediate = Some(Remediate(child));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("leading")
        {
            if Instant::now() > deadline {
                bail!(
                    "remediate did not lead within 60 s:\n{}",
                    fs::read_to_string(&log).unwrap_or_default()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// (uid, node) of a Running pod of `app` other than `not_uid`.
    async fn running(&self, app: &str, not_uid: Option<&str>) -> Result<Option<(String, String)>> {
        let pods = workload::app_pods(&self.client(), app).await?;
        Ok(workload::running_pod(&pods, not_uid).map(|(_, uid, node)| (uid, node)))
    }
}

async fn create_workload(client: &Client, scenario: Scenario) -> Result<&'static str> {
    match scenario {
        Scenario::Deployment => {
            workload::create_deployment(client, "web", 1).await?;
            Ok("web")
        }
        Scenario::Statefulset | Scenario::StatefulsetVa => {
            let claim = (scenario == Scenario::StatefulsetVa).then_some("data");
            workload::create_statefulset(client, "db", claim).await?;
            Ok("db")
        }
        Scenario::All => bail!("not a single scenario"),
    }
}

/// The CSI volume of the volume scenario, as in tests/tests/control_plane/remediate.rs: a PV pre-bound to the
/// claim, both marked Bound, every node managed by the attach-detach controller. Returns the PV's
/// name.
async fn create_volume(client: &Client) -> Result<String> {
    workload::manage_attach_detach(client, NODES.map(|(n, _)| n)).await?;
    Ok(workload::create_bound_volume(client, "data").await?)
}

/// Seconds from the death to each step; `None`: not seen within the cap.
#[derive(Debug, Default)]
struct Times {
    dead: Option<f64>,
    fenced: Option<f64>,
    tainted: Option<f64>,
    /// The replacement runs elsewhere (and, with a volume, has it attached).
    running: Option<f64>,
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One run: the seconds until each step.
async fn run_once(setup: Setup, cap: Duration) -> Result<Times> {
    let bench = Bench::start(setup).await?;
    let client = bench.client();
    let volume = if setup.scenario == Scenario::StatefulsetVa {
        let pv = create_volume(&client).await?;
        Some((
            pv,
            tokio::spawn(workload::fake_external_attacher(client.clone())),
        ))
    } else {
        None
    };
    let attached = async |pv: &str, node: &str| -> Result<bool> {
        Ok(workload::attachment(&client, pv, node).await?.is_some())
    };
    let app = create_workload(&client, setup.scenario).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let (uid, node) = loop {
        if let Some(p) = bench.running(app, None).await? {
            break p;
        }
        if Instant::now() > deadline {
            bail!("{app} never ran");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if let Some((pv, _)) = &volume {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !attached(pv, &node).await? {
            if Instant::now() > deadline {
                bail!("the volume was never attached to {node}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let patch = json!({"status": {"volumesInUse": [workload::volume_in_use_name()]}});
        nodes
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    // Kill the node at a random point of its Lease renewal interval: detection time depends on
    // how long before the death the last renewal was (10 s interval stock, 1 s scaled).
    let interval = if setup.scaled { 1_000 } else { 10_000 };
    let jitter = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
        % interval;
    tokio::time::sleep(Duration::from_millis(2 * interval + jitter)).await;

    let standin = bench
        .standins
        .get(&node)
        .with_context(|| format!("no stand-in {node}"))?;
    if setup.agent == Agent::LastGasp {
        // What the agent writes when it sees the machine go down past the inhibitor (the
        // `annotation` form of nodeMonitor.shutdown.lastGasp), just before the power goes.
        let gasp = format!("{{\"time\":{:.3},\"cmd\":\"POWER_OFF\"}}", unix_now());
        Api::<Node>::all(client.clone())
            .patch(
                &node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "node-monitor.io/last-gasp": gasp}}})),
            )
            .await?;
    }
    let t0 = Instant::now();
    let t0_unix = unix_now();
    // The machine dies: its kubelet, its pods and its agent.
    workload::power_off(standin, &uid);
    if let Some(agent) = bench.agents.get(&node) {
        agent.send_replace(true);
    }
    let mut times = Times::default();
    loop {
        if times.tainted.is_none() && setup.remediate && bench.out_of_service(&node).await? {
            times.tainted = Some(t0.elapsed().as_secs_f64());
        }
        if let Some((_, new_node)) = bench.running(app, Some(&uid)).await?
            && new_node != node
            && match &volume {
                Some((pv, _)) => attached(pv, &new_node).await?,
                None => true,
            }
        {
            times.running = Some(t0.elapsed().as_secs_f64());
            break;
        }
        if t0.elapsed() > cap {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if setup.remediate {
        times.dead = bench.dead_after(&node, t0_unix);
        times.fenced = bench.fenced_after(t0_unix);
    }
    if let Some((_, attacher)) = volume {
        attacher.abort();
    }
    drop(bench);
    Ok(times)
}

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
    require_root("bench-failover (kubelet stand-ins run pods as processes in cgroups)");
    let keep = tempfile::Builder::new()
        .prefix("nm-bench-failover-bin-")
        .tempdir()?;
    let copy = keep.path().join("node-monitor-remediate");
    fs::copy(binary("node-monitor-remediate"), &copy)
        .context("copy the node-monitor-remediate binary")?;
    let _ = REMEDIATE_BIN.set(copy);
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => vec![
            Scenario::Deployment,
            Scenario::Statefulset,
            Scenario::StatefulsetVa,
        ],
        s => vec![s],
    };
    let modes: Vec<bool> = match args.mode {
        Mode::Remediate => vec![true],
        Mode::Stock => vec![false],
        Mode::Both => vec![true, false],
    };
    let timeouts: Vec<bool> = match args.timeouts {
        Timeouts::Stock => vec![false],
        Timeouts::Scaled => vec![true],
        Timeouts::Both => vec![true, false],
    };
    let agents: Vec<Agent> = match args.agent {
        AgentArg::None => vec![Agent::None],
        AgentArg::Lease => vec![Agent::Lease],
        AgentArg::LastGasp => vec![Agent::LastGasp],
        AgentArg::Both => vec![Agent::Lease, Agent::LastGasp],
    };
    println!(
        "scenario        controller    timeouts agent          seconds to a replacement Running elsewhere (dead / fenced / tainted)"
    );
    let mut summary = Vec::new();
    for &scaled in &timeouts {
        for &remediate in &modes {
            for (&scenario, &agent) in scenarios
                .iter()
                .flat_map(|s| agents.iter().map(move |a| (s, a)))
            {
                let setup = Setup {
                    scenario,
                    remediate,
                    scaled,
                    agent,
                };
                let cap = Duration::from_secs(if scaled {
                    args.scaled_cap_secs
                } else {
                    args.cap_secs
                });
                let runs = if remediate { args.runs.max(1) } else { 1 };
                let mut results = Vec::new();
                for _ in 0..runs {
                    let t = run_once(setup, cap).await?;
                    let secs =
                        |s: Option<f64>| s.map_or_else(|| "–".to_owned(), |s| format!("{s:.1}"));
                    let text = t.running.map_or_else(
                        || format!("not within {} s", cap.as_secs()),
                        |s| format!("{s:.1}"),
                    );
                    let text = if remediate {
                        format!(
                            "{text} ({} / {} / {})",
                            secs(t.dead),
                            secs(t.fenced),
                            secs(t.tainted)
                        )
                    } else {
                        text
                    };
                    println!("{}   {text}", setup.label());
                    results.push(text);
                }
                summary.push(format!("| {} | {} |", setup.label(), results.join(" / ")));
            }
        }
    }
    println!("\n| scenario / controller / timeouts | seconds (each run) |\n|---|---|");
    for line in summary {
        println!("{line}");
    }
    Ok(())
}
