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
//! Root and the control-plane binaries are required. See docs/benchmarks.md ("Failover").
//!
//! ```sh
//! cargo build --bins && sudo target/debug/bench-failover --scenario all --mode both --timeouts both
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
use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec},
        core::v1::{
            CSIPersistentVolumeSource, ConfigMap, Container, Node, ObjectReference,
            PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
            PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, PodTemplateSpec,
            Volume, VolumeResourceRequirements,
        },
        storage::v1::VolumeAttachment,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta},
    },
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use node_monitor_tests::{
    cgroup::{TestCgroups, require_root},
    control_plane::{ControlPlane, ControlPlaneOptions, DEFAULT_CONTROLLERS},
    e2e::{binary, free_port},
    standin::{StandIn, StandInConfig},
};
use serde_json::json;

const NS: &str = "node-monitor";
const APPS: &str = "default";
const DRIVER: &str = "csi.node-monitor.test";

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
}

/// The `node-monitor` binary under test, copied once at start so a rebuild during a long run
/// cannot change it half-way.
static NODE_MONITOR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

#[derive(Debug, Clone, Copy)]
struct Setup {
    scenario: Scenario,
    remediate: bool,
    scaled: bool,
}

impl Setup {
    fn label(&self) -> String {
        format!(
            "{:<15} {:<13} {:<7}",
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
        )
    }
}

const FENCE_AGENT: &str = "#!/bin/sh\ncat > /dev/null\nexit 0\n";

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
            opts.controllers = DEFAULT_CONTROLLERS
                .iter()
                .map(|s| (*s).to_owned())
                .chain(["persistentvolume-attach-detach-controller".to_owned()])
                .collect();
        }
        if setup.scaled {
            opts = opts.fast_node_failover(Duration::from_secs(10), Duration::from_secs(10));
        }
        let cp = ControlPlane::start(opts).await?;
        cp.create_namespace(NS).await?;
        let mut cgroups = TestCgroups::new("bench-failover");
        let mut standins = BTreeMap::new();
        for (name, zone) in NODES {
            cgroups.create(name)?;
            let mut cfg = StandInConfig::new(name, cgroups.rel_root().join(name))
                .memory(256 << 20)
                .label("topology.kubernetes.io/zone", zone);
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
        let mut bench = Bench {
            remediate: None,
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
        let api: Api<ConfigMap> = Api::namespaced(self.client(), NS);
        let cms = [
            (
                "fence-method-template-bench",
                "template.properties",
                format!("agent_name={}\n", agent.display()),
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
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([(key.to_owned(), text)])),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm)
                .await
                .with_context(|| format!("create ConfigMap {name}"))?;
        }
        Ok(())
    }

    async fn spawn_remediate(&mut self) -> Result<()> {
        let cfg = self.dir.path().join("remediate.yaml");
        fs::write(&cfg, REMEDIATE_CONFIG)?;
        let log = self.dir.path().join("remediate.log");
        let out = fs::File::create(&log)?;
        let program = NODE_MONITOR.get().context("the node-monitor copy")?;
        let child = Command::new(program)
            .arg("remediate")
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
            .context("start node-monitor remediate")?;
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

    async fn pods(&self, app: &str) -> Result<Vec<Pod>> {
        let api: Api<Pod> = Api::namespaced(self.client(), APPS);
        Ok(api
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await?
            .items)
    }

    /// (uid, node) of a Running pod of `app` other than `not_uid`.
    async fn running(&self, app: &str, not_uid: Option<&str>) -> Result<Option<(String, String)>> {
        Ok(self.pods(app).await?.into_iter().find_map(|p| {
            let uid = p.metadata.uid.clone()?;
            let node = p.spec.as_ref()?.node_name.clone()?;
            let running = p.status.as_ref()?.phase.as_deref() == Some("Running")
                && p.metadata.deletion_timestamp.is_none();
            (running && not_uid != Some(uid.as_str())).then_some((uid, node))
        }))
    }
}

fn template(app: &str, claim: Option<&str>) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(5),
            containers: vec![Container {
                name: "main".to_owned(),
                image: Some("nm-workload".to_owned()),
                command: Some(vec![
                    binary("nm-workload").display().to_string(),
                    "--sleep".to_owned(),
                ]),
                ..Container::default()
            }],
            volumes: claim.map(|c| {
                vec![Volume {
                    name: "data".to_owned(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: c.to_owned(),
                        read_only: None,
                    }),
                    ..Volume::default()
                }]
            }),
            ..PodSpec::default()
        }),
    }
}

fn selector(app: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([("app".to_owned(), app.to_owned())])),
        ..LabelSelector::default()
    }
}

async fn create_workload(client: &Client, scenario: Scenario) -> Result<&'static str> {
    match scenario {
        Scenario::Deployment => {
            let api: Api<Deployment> = Api::namespaced(client.clone(), APPS);
            let d = Deployment {
                metadata: ObjectMeta {
                    name: Some("web".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(DeploymentSpec {
                    replicas: Some(1),
                    selector: selector("web"),
                    template: template("web", None),
                    ..DeploymentSpec::default()
                }),
                ..Deployment::default()
            };
            api.create(&PostParams::default(), &d).await?;
            Ok("web")
        }
        Scenario::Statefulset | Scenario::StatefulsetVa => {
            let claim = (scenario == Scenario::StatefulsetVa).then_some("data");
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), APPS);
            let s = StatefulSet {
                metadata: ObjectMeta {
                    name: Some("db".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(StatefulSetSpec {
                    replicas: Some(1),
                    service_name: Some("db".to_owned()),
                    selector: selector("db"),
                    template: template("db", claim),
                    ..StatefulSetSpec::default()
                }),
                ..StatefulSet::default()
            };
            api.create(&PostParams::default(), &s).await?;
            Ok("db")
        }
        Scenario::All => bail!("not a single scenario"),
    }
}

/// The CSI volume of the volume scenario, as in tests/tests/remediate.rs: a PV pre-bound to the
/// claim, both marked Bound, every node managed by the attach-detach controller.
async fn create_volume(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, _) in NODES {
        let patch = json!({"metadata": {"annotations": {
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}});
        nodes
            .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), APPS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let storage = BTreeMap::from([("storage".to_owned(), Quantity("1Gi".to_owned()))]);
    let pvc = pvcs
        .create(
            &PostParams::default(),
            &PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("data".to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
                    storage_class_name: Some(String::new()),
                    volume_name: Some("data-pv".to_owned()),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some(storage.clone()),
                        ..VolumeResourceRequirements::default()
                    }),
                    ..PersistentVolumeClaimSpec::default()
                }),
                ..PersistentVolumeClaim::default()
            },
        )
        .await?;
    pvs.create(
        &PostParams::default(),
        &PersistentVolume {
            metadata: ObjectMeta {
                name: Some("data-pv".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some(storage),
                access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
                persistent_volume_reclaim_policy: Some("Retain".to_owned()),
                storage_class_name: Some(String::new()),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".to_owned()),
                    kind: Some("PersistentVolumeClaim".to_owned()),
                    namespace: Some(APPS.to_owned()),
                    name: Some("data".to_owned()),
                    uid: pvc.metadata.uid.clone(),
                    ..ObjectReference::default()
                }),
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_owned(),
                    volume_handle: "vol-1".to_owned(),
                    ..CSIPersistentVolumeSource::default()
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        },
    )
    .await?;
    pvs.patch_status(
        "data-pv",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
    )
    .await?;
    pvcs.patch_status(
        "data",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                        "capacity": {"storage": "1Gi"}}}),
        ),
    )
    .await?;
    Ok(())
}

/// Marks the fake driver's VolumeAttachments attached, as a CSI external-attacher would.
async fn fake_external_attacher(client: Client) {
    let vas: Api<VolumeAttachment> = Api::all(client);
    loop {
        if let Ok(list) = vas.list(&ListParams::default()).await {
            for va in list.items {
                let pending = va.spec.attacher == DRIVER
                    && va.metadata.deletion_timestamp.is_none()
                    && !va.status.as_ref().is_some_and(|s| s.attached);
                if let (true, Some(name)) = (pending, va.metadata.name.as_deref()) {
                    let _ = vas
                        .patch_status(
                            name,
                            &PatchParams::default(),
                            &Patch::Merge(json!({"status": {"attached": true}})),
                        )
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn volume_attached(client: &Client, node: &str) -> Result<bool> {
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    Ok(vas
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|va| va.spec.node_name == node && va.status.as_ref().is_some_and(|s| s.attached)))
}

/// One run: the seconds until the replacement runs (and, with a volume, has it attached), or
/// `None` when the cap passed first.
async fn run_once(setup: Setup, cap: Duration) -> Result<Option<f64>> {
    let bench = Bench::start(setup).await?;
    let client = bench.client();
    let attacher = if setup.scenario == Scenario::StatefulsetVa {
        create_volume(&client).await?;
        Some(tokio::spawn(fake_external_attacher(client.clone())))
    } else {
        None
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
    if setup.scenario == Scenario::StatefulsetVa {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !volume_attached(&client, &node).await? {
            if Instant::now() > deadline {
                bail!("the volume was never attached to {node}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let nodes: Api<Node> = Api::all(client.clone());
        let patch =
            json!({"status": {"volumesInUse": [format!("kubernetes.io/csi/{DRIVER}^vol-1")]}});
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
    let pids = standin.pod_pids(&uid);
    let t0 = Instant::now();
    standin.pause();
    for pid in pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let result = loop {
        if let Some((_, new_node)) = bench.running(app, Some(&uid)).await?
            && new_node != node
            && (setup.scenario != Scenario::StatefulsetVa
                || volume_attached(&client, &new_node).await?)
        {
            break Some(t0.elapsed().as_secs_f64());
        }
        if t0.elapsed() > cap {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if let Some(a) = attacher {
        a.abort();
    }
    drop(bench);
    Ok(result)
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
    let copy = keep.path().join("node-monitor");
    fs::copy(binary("node-monitor"), &copy).context("copy the node-monitor binary")?;
    let _ = NODE_MONITOR.set(copy);
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
    println!("scenario        controller    timeouts  seconds to a replacement Running elsewhere");
    let mut summary = Vec::new();
    for &scaled in &timeouts {
        for &remediate in &modes {
            for &scenario in &scenarios {
                let setup = Setup {
                    scenario,
                    remediate,
                    scaled,
                };
                let cap = Duration::from_secs(if scaled {
                    args.scaled_cap_secs
                } else {
                    args.cap_secs
                });
                let runs = if remediate { args.runs.max(1) } else { 1 };
                let mut results = Vec::new();
                for _ in 0..runs {
                    let r = run_once(setup, cap).await?;
                    let text = r.map_or_else(
                        || format!("not within {} s", cap.as_secs()),
                        |s| format!("{s:.1}"),
                    );
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
