//! `node-monitor remediate` against a real control plane: three (or five) kubelet stand-ins in
//! two zones, the real binary as the controller, and fence "agents" that are small scripts
//! recording their calls. A node dies by pausing its stand-in (no heartbeats, nothing finalized)
//! and killing its pods' processes, as a machine that lost power.
//!
//! The control plane runs with the stock node lifecycle timeouts (50 s grace, 300 s
//! tolerations) unless a test says otherwise: every scenario ends well within them, so what
//! happens is remediate's doing, not the node lifecycle controller's.
//!
//! Stand-in Leases last 4 s, so the kubelet's renewal fraction (0.25) gives a 1 s renewal
//! interval; remediate declares a node dead after 4 missed renewals.
//!
//! Root and the control-plane binaries are required; without them every test fails with a
//! message saying what is missing.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        apps::v1::{Deployment, DeploymentSpec, StatefulSet, StatefulSetSpec},
        core::v1::{
            ConfigMap, Container, Event, Node, PersistentVolume, PersistentVolumeClaim,
            PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, PersistentVolumeSpec,
            Pod, PodSpec, PodTemplateSpec, Volume, VolumeResourceRequirements,
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
use node_monitor::{
    core::remediation::{OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE},
    remediate::store::{OP_KEY, op_configmap_name},
};
use node_monitor_tests::{
    cgroup::{TestCgroups, require_root},
    control_plane::{ControlPlane, ControlPlaneOptions, DEFAULT_CONTROLLERS, error_chain},
    e2e::{binary, free_port, http_get, sum_samples},
    standin::{StandIn, StandInConfig},
};
use serde_json::json;

/// Bound on every wait for the cluster to converge (a liveness bound, not a speed assertion).
const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "node-monitor";
const APPS: &str = "default";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The fake CSI driver of the volume scenario.
const DRIVER: &str = "csi.node-monitor.test";

fn must<T, E: std::error::Error>(r: Result<T, E>, what: &str) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", error_chain(&e)))
}

async fn eventually<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "gave up after {WAIT:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// remediate's configuration for these tests: fast ticks, 4 missed 1 s renewals, short retries
/// and a short leader lease.
const CONFIG: &str = "\
tickInterval: 250ms
missedRenewals: 4
suspectAfterRenewals: 1.5
nodeFenceRate: 1
stepRetries: 1
retryBackoff: 1s
unconfirmedRetryInterval: 3s
methodTimeout: 60s
powerManagementAfterIsolation: never
leaderElection:
  leaseDuration: 4s
  renewDeadline: 3s
  retryPeriod: 1s
";

/// The test fence agent: records each call (`start`, then `end` with its result) in the file
/// named by its `log` parameter, waits while the file named by `hold` exists, and fails when
/// `result=fail`.
const FENCE_AGENT: &str = r#"#!/bin/sh
params=$(cat)
log=; hold=; result=ok
for kv in $params; do
  case "$kv" in
    log=*) log=${kv#log=} ;;
    hold=*) hold=${kv#hold=} ;;
    result=*) result=${kv#result=} ;;
  esac
done
echo "start $NODE_MONITOR_FENCE_STEP $NODE_MONITOR_FENCE_METHOD $NODE_MONITOR_FENCE_NODE" >> "$log"
if [ -n "$hold" ]; then
  while [ -e "$hold" ]; do sleep 0.1; done
fi
echo "end $NODE_MONITOR_FENCE_STEP $NODE_MONITOR_FENCE_METHOD $NODE_MONITOR_FENCE_NODE $result" >> "$log"
[ "$result" = ok ]
"#;

/// One line of the fence agent's log.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    phase: String,
    step: String,
    method: String,
    node: String,
    result: Option<String>,
}

/// A running `node-monitor remediate`.
struct Remediate {
    child: Option<Child>,
    log: PathBuf,
    port: u16,
}

impl Remediate {
    fn spawn(kubeconfig: &Path, dir: &Path, identity: &str, config: &str) -> Remediate {
        let cfg = dir.join(format!("{identity}.yaml"));
        fs::write(&cfg, config).expect("write the remediate config");
        let log = dir.join(format!("{identity}.log"));
        let out = fs::File::create(&log).expect("create the remediate log");
        let port = free_port().expect("a free port");
        let child = Command::new(binary("node-monitor"))
            .arg("remediate")
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", NS, "--identity", identity])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .arg("--config")
            .arg(&cfg)
            .env("RUST_LOG", "info,node_monitor=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log fd"))
            .stderr(out)
            .spawn()
            .expect("start node-monitor remediate");
        Remediate {
            child: Some(child),
            log,
            port,
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    async fn wait_log(&mut self, needle: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            if self.log().contains(needle) {
                return;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "remediate exited ({status}) before logging {needle:?}:\n{}",
                    self.tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "remediate did not log {needle:?} within {WAIT:?}:\n{}",
                self.tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn metric(&self, family: &str, labels: &[(&str, &str)]) -> f64 {
        let text = http_get(self.port, "/metrics")
            .await
            .unwrap_or_else(|e| panic!("scrape remediate's /metrics: {e:#}\n{}", self.tail()));
        sum_samples(&text, family, labels)
    }

    /// SIGKILL: a crash, nothing cleaned up.
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

/// A control plane, stand-in nodes and the fence agent. Fields drop in order: the controller,
/// then the stand-ins, then their cgroups, then the control plane.
struct Fixture {
    remediate: Option<Remediate>,
    standins: BTreeMap<String, StandIn>,
    _cgroups: TestCgroups,
    cp: ControlPlane,
    dir: tempfile::TempDir,
}

impl Fixture {
    /// `nodes`: (name, zone).
    async fn start(test: &str, opts: ControlPlaneOptions, nodes: &[(&str, &str)]) -> Fixture {
        require_root("the remediate tests (kubelet stand-ins run pods as processes in cgroups)");
        let cp = must(ControlPlane::start(opts).await, "start the control plane");
        must(
            cp.create_namespace(NS).await,
            "create the remediate namespace",
        );
        let mut cgroups = TestCgroups::new(test);
        let mut standins = BTreeMap::new();
        for (name, zone) in nodes {
            cgroups
                .create(name)
                .unwrap_or_else(|e| panic!("create the cgroup of {name}: {e:#}"));
            let mut cfg = StandInConfig::new(*name, cgroups.rel_root().join(name))
                .memory(256 << 20)
                .label(ZONE_LABEL, *zone)
                .lease_interval(Duration::from_secs(1))
                .status_interval(Duration::from_secs(2))
                .restart_backoff(Duration::from_secs(1), Duration::from_secs(5));
            cfg.lease_duration_seconds = 4;
            let s = must(
                StandIn::start(cp.client(), cfg).await,
                &format!("start the stand-in {name}"),
            );
            must(s.wait_ready(WAIT).await, &format!("{name} Ready"));
            standins.insert((*name).to_owned(), s);
        }
        let dir = tempfile::Builder::new()
            .prefix("nm-remediate-")
            .tempdir()
            .expect("temporary directory");
        let agent = dir.path().join("fence-test-agent");
        fs::write(&agent, FENCE_AGENT).expect("write the fence agent");
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&agent, fs::Permissions::from_mode(0o755)).expect("chmod");
        Fixture {
            remediate: None,
            standins,
            _cgroups: cgroups,
            cp,
            dir,
        }
    }

    fn client(&self) -> Client {
        self.cp.client()
    }

    fn calls_log(&self) -> PathBuf {
        self.dir.path().join("calls.log")
    }

    fn hold_file(&self) -> PathBuf {
        self.dir.path().join("hold")
    }

    fn calls(&self) -> Vec<Call> {
        fs::read_to_string(self.calls_log())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 4).then(|| Call {
                    phase: f[0].to_owned(),
                    step: f[1].to_owned(),
                    method: f[2].to_owned(),
                    node: f[3].to_owned(),
                    result: f.get(4).map(|s| (*s).to_owned()),
                })
            })
            .collect()
    }

    fn count(&self, phase: &str, step: &str, node: &str) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.phase == phase && c.step == step && c.node == node)
            .count()
    }

    async fn configmap(&self, name: &str, key: &str, text: &str) {
        let api: Api<ConfigMap> = Api::namespaced(self.client(), NS);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([(key.to_owned(), text.to_owned())])),
            ..ConfigMap::default()
        };
        must(
            api.create(&PostParams::default(), &cm).await,
            &format!("create ConfigMap {name}"),
        );
    }

    /// The proposal's layout: a template for the test agent, an `isolate` and an `unisolate`
    /// method, and a default plan (isolation, then recovery). `hold`: isolation waits while the
    /// hold file exists.
    async fn fence_config(&self, hold: bool) {
        let agent = self.dir.path().join("fence-test-agent");
        self.configmap(
            "fence-method-template-test",
            "template.properties",
            &format!(
                "name=test\nagent_name={}\nlog={}\n",
                agent.display(),
                self.calls_log().display()
            ),
        )
        .await;
        let hold_line = if hold {
            format!("hold={}\n", self.hold_file().display())
        } else {
            String::new()
        };
        self.configmap(
            "fence-method-isolate",
            "method.properties",
            &format!("template=fence-method-template-test\naction=off\n{hold_line}"),
        )
        .await;
        self.configmap(
            "fence-method-unisolate",
            "method.properties",
            "template=fence-method-template-test\naction=on\n",
        )
        .await;
        self.configmap(
            "fence-config-default",
            "config.properties",
            "isolation=isolate\nrecovery=unisolate\n",
        )
        .await;
    }

    async fn start_remediate(&mut self, identity: &str, config: &str) {
        let admin = self.cp.kubeconfig_path().to_owned();
        self.start_remediate_as(identity, config, &admin).await;
    }

    async fn start_remediate_as(&mut self, identity: &str, config: &str, kubeconfig: &Path) {
        let mut r = Remediate::spawn(kubeconfig, self.dir.path(), identity, config);
        r.wait_log("leading").await;
        self.remediate = Some(r);
    }

    fn remediate(&self) -> &Remediate {
        self.remediate.as_ref().expect("remediate running")
    }

    fn standin(&self, node: &str) -> &StandIn {
        self.standins
            .get(node)
            .unwrap_or_else(|| panic!("no stand-in {node}"))
    }

    /// A dead machine: the stand-in stops (no heartbeats, nothing finalized) and the pod's
    /// processes die.
    fn kill_node(&self, node: &str, pod_uid: &str) {
        let s = self.standin(node);
        s.pause();
        let pids = s.pod_pids(pod_uid);
        assert!(!pids.is_empty(), "pod {pod_uid} has no processes on {node}");
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    async fn node(&self, name: &str) -> Node {
        let nodes: Api<Node> = Api::all(self.client());
        must(nodes.get(name).await, &format!("get node {name}"))
    }

    async fn out_of_service(&self, name: &str) -> bool {
        self.node(name)
            .await
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .iter()
            .any(|t| {
                t.key == OUT_OF_SERVICE_TAINT
                    && t.effect == "NoExecute"
                    && t.value.as_deref() == Some(OUT_OF_SERVICE_VALUE)
            })
    }

    async fn operation(&self, node: &str) -> Option<serde_json::Value> {
        let api: Api<ConfigMap> = Api::namespaced(self.client(), NS);
        let cm = must(
            api.get_opt(&op_configmap_name(node)).await,
            "get the fencing operation",
        )?;
        let text = cm.data?.get(OP_KEY)?.clone();
        Some(serde_json::from_str(&text).expect("the operation is JSON"))
    }

    async fn node_events(&self, node: &str, reason: &str) -> Vec<Event> {
        let api: Api<Event> = Api::namespaced(self.client(), "default");
        must(api.list(&ListParams::default()).await, "list events")
            .items
            .into_iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some("Node")
                    && e.involved_object.name.as_deref() == Some(node)
                    && e.reason.as_deref() == Some(reason)
            })
            .collect()
    }

    async fn pods(&self, app: &str) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client(), APPS);
        must(
            api.list(&ListParams::default().labels(&format!("app={app}")))
                .await,
            "list pods",
        )
        .items
    }

    /// The app's single running pod: (name, uid, node).
    async fn running_pod(&self, app: &str, not_uid: Option<&str>) -> (String, String, String) {
        eventually(&format!("a Running pod of {app}"), async || {
            self.pods(app).await.into_iter().find_map(|p| {
                let uid = p.metadata.uid.clone()?;
                let node = p.spec.as_ref()?.node_name.clone()?;
                let running = p.status.as_ref()?.phase.as_deref() == Some("Running")
                    && p.metadata.deletion_timestamp.is_none();
                (running && not_uid != Some(uid.as_str()))
                    .then(|| (p.metadata.name.clone().unwrap_or_default(), uid, node))
            })
        })
        .await
    }

    async fn pod_by_uid(&self, uid: &str) -> Option<Pod> {
        self.pods_all()
            .await
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
    }

    async fn pods_all(&self) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client(), APPS);
        must(api.list(&ListParams::default()).await, "list pods").items
    }
}

fn workload_template(app: &str, volume_claim: Option<&str>) -> PodTemplateSpec {
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
            volumes: volume_claim.map(|claim| {
                vec![Volume {
                    name: "data".to_owned(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim.to_owned(),
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

async fn create_deployment(client: &Client, app: &str, replicas: i32) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), APPS);
    let d = Deployment {
        metadata: ObjectMeta {
            name: Some(app.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(DeploymentSpec {
            replicas: Some(replicas),
            selector: selector(app),
            template: workload_template(app, None),
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    };
    must(
        api.create(&PostParams::default(), &d).await,
        "create the Deployment",
    );
}

async fn create_statefulset(client: &Client, app: &str, claim: Option<&str>) {
    let api: Api<StatefulSet> = Api::namespaced(client.clone(), APPS);
    let s = StatefulSet {
        metadata: ObjectMeta {
            name: Some(app.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(app.to_owned()),
            selector: selector(app),
            template: workload_template(app, claim),
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    };
    must(
        api.create(&PostParams::default(), &s).await,
        "create the StatefulSet",
    );
}

/// Kills the node running the app's pod, lets fencing (held by the hold file) start, checks that
/// nothing is released while it runs, then lets it finish. Returns (node, old pod uid).
async fn kill_and_check_the_fence_comes_first(fx: &Fixture, app: &str) -> (String, String) {
    let (pod, uid, node) = fx.running_pod(app, None).await;
    fx.kill_node(&node, &uid);
    eventually("the isolation method to be called", async || {
        (fx.count("start", "isolation", &node) > 0).then_some(())
    })
    .await;
    // The fence method runs (held): nothing is released yet.
    assert!(
        !fx.out_of_service(&node).await,
        "the out-of-service taint must wait for confirmed fencing"
    );
    let p = fx
        .pod_by_uid(&uid)
        .await
        .unwrap_or_else(|| panic!("{pod} was deleted before fencing was confirmed"));
    assert!(
        p.metadata.deletion_timestamp.is_none(),
        "{pod} deleted before fencing confirmed"
    );
    let op = fx.operation(&node).await.expect("the operation is stored");
    assert_eq!(op["phase"]["name"], "fencing", "{op}");
    assert_eq!(op["running"], "isolation", "{op}");
    // Fencing completes: now the node is released.
    fs::remove_file(fx.hold_file()).expect("release the hold");
    eventually("the out-of-service taint", async || {
        fx.out_of_service(&node).await.then_some(())
    })
    .await;
    assert!(
        fx.calls().iter().any(|c| c.phase == "end"
            && c.step == "isolation"
            && c.node == node
            && c.result.as_deref() == Some("ok")),
        "the taint came before the fence method finished: {:?}",
        fx.calls()
    );
    (node, uid)
}

/// The node resumes: recovery runs, the taint goes, the operation is forgotten.
async fn resume_and_check_recovery(fx: &Fixture, node: &str) {
    fx.standin(node).resume();
    eventually("recovery to run", async || {
        (fx.count("end", "recovery", node) > 0).then_some(())
    })
    .await;
    eventually("the out-of-service taint to be removed", async || {
        (!fx.out_of_service(node).await).then_some(())
    })
    .await;
    eventually("the operation to be forgotten", async || {
        fx.operation(node).await.is_none().then_some(())
    })
    .await;
    assert!(
        !fx.node_events(node, "NodeRecovered").await.is_empty(),
        "a NodeRecovered event"
    );
}

fn three_nodes() -> [(&'static str, &'static str); 3] {
    [
        ("node-a1", "zone-a"),
        ("node-a2", "zone-a"),
        ("node-b1", "zone-b"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_deployment_pod_is_replaced_after_fencing_and_the_node_recovers() {
    let mut fx = Fixture::start("rem-deploy", ControlPlaneOptions::default(), &three_nodes()).await;
    fx.fence_config(true).await;
    fs::write(fx.hold_file(), "").expect("hold");
    fx.start_remediate("remediate-1", CONFIG).await;
    create_deployment(&fx.client(), "web", 1).await;

    let (node, old_uid) = kill_and_check_the_fence_comes_first(&fx, "web").await;
    let (_, new_uid, new_node) = fx.running_pod("web", Some(&old_uid)).await;
    assert_ne!(new_node, node, "the replacement runs on another node");
    assert_ne!(new_uid, old_uid);
    assert!(
        fx.pod_by_uid(&old_uid).await.is_none(),
        "the dead node's pod is gone from the API"
    );
    for reason in ["FencingStarted", "FencingConfirmed", "NodeReleased"] {
        assert!(
            !fx.node_events(&node, reason).await.is_empty(),
            "a {reason} event on {node}"
        );
    }
    let r = fx.remediate();
    assert_eq!(
        r.metric("node_monitor_remediation_releases_total", &[])
            .await,
        1.0
    );
    assert!(
        r.metric("node_monitor_remediation_pods_deleted_total", &[])
            .await
            >= 1.0
    );
    assert_eq!(
        r.metric(
            "node_monitor_remediation_fence_steps_total",
            &[("step", "isolation"), ("outcome", "success")]
        )
        .await,
        1.0
    );
    assert_eq!(fx.count("start", "isolation", &node), 1, "{:?}", fx.calls());

    resume_and_check_recovery(&fx, &node).await;
    assert!(
        fx.remediate()
            .metric("node_monitor_remediation_recoveries_total", &[])
            .await
            >= 1.0
    );
}

/// Also: remediate runs as the ServiceAccount of deploy/remediate, with exactly the shipped RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_statefulset_pod_is_replaced_after_fencing() {
    let mut fx = Fixture::start("rem-sts", ControlPlaneOptions::default(), &three_nodes()).await;
    fx.fence_config(false).await;
    // Every shipped manifest applies; the ServiceAccount and its RBAC for real, the rest as a
    // server-side dry run (the stand-ins would otherwise run the Deployment's pods).
    let kustomization: serde_yaml::Value = serde_yaml::from_str(
        &fs::read_to_string(deploy_remediate("kustomization.yaml")).expect("kustomization"),
    )
    .expect("kustomization is YAML");
    let files: Vec<String> = kustomization["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    assert!(files.len() >= 5, "{files:?}");
    for file in &files {
        let real = file == "serviceaccount.yaml" || file == "rbac.yaml";
        apply_manifest(&fx.client(), &deploy_remediate(file), !real).await;
    }
    let kubeconfig = must(
        fx.cp
            .service_account_kubeconfig(NS, "node-monitor-remediate")
            .await,
        "a token for the remediate ServiceAccount",
    );
    fx.start_remediate_as("remediate-1", CONFIG, &kubeconfig)
        .await;
    create_statefulset(&fx.client(), "db", None).await;
    let (pod, old_uid, node) = fx.running_pod("db", None).await;
    assert_eq!(pod, "db-0");
    fx.kill_node(&node, &old_uid);

    // Without remediate this pod stays: the StatefulSet controller waits for the kubelet to
    // confirm db-0 stopped, and the paused stand-in never will. With it, db-0 comes back
    // elsewhere, under the same name.
    let (name, new_uid, new_node) = fx.running_pod("db", Some(&old_uid)).await;
    assert_eq!(name, "db-0");
    assert_ne!(new_uid, old_uid, "a new db-0");
    assert_ne!(new_node, node);
    assert!(fx.out_of_service(&node).await);
    assert!(
        fx.count("end", "isolation", &node) >= 1,
        "fencing ran: {:?}",
        fx.calls()
    );
    let released = fx.node_events(&node, "NodeReleased").await;
    assert!(
        released.iter().any(|e| e
            .message
            .as_deref()
            .unwrap_or("")
            .contains("1 pods deleted")),
        "{released:?}"
    );
    resume_and_check_recovery(&fx, &node).await;
    let log = fx.remediate().log();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the shipped RBAC must allow every call:\n{}",
        fx.remediate().tail()
    );
}

fn deploy_remediate(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/remediate")
        .join(file)
}

/// Server-side applies every document of a manifest file (or validates it with a dry run).
async fn apply_manifest(client: &Client, path: &Path, dry_run: bool) {
    use kube::{
        api::DynamicObject,
        core::GroupVersionKind,
        discovery::{Scope, pinned_kind},
    };
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(doc)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let obj: DynamicObject =
            serde_json::from_value(serde_json::to_value(&value).expect("YAML is JSON-compatible"))
                .unwrap_or_else(|e| panic!("{}: not an object: {e}", path.display()));
        let tm = obj.types.clone().expect("apiVersion and kind");
        let gvk = GroupVersionKind::try_from(&tm).expect("a group/version/kind");
        let (ar, caps) = pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", tm.kind));
        let name = obj.metadata.name.clone().expect("name");
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                client.clone(),
                obj.metadata.namespace.as_deref().unwrap_or("default"),
                &ar,
            ),
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let mut pp = PatchParams::apply("node-monitor-tests").force();
        pp.dry_run = dry_run;
        must(
            api.patch(&name, &pp, &Patch::Apply(&obj)).await,
            &format!("apply {} {name} from {}", tm.kind, path.display()),
        );
    }
}

/// The attach-detach controller needs a volume it manages: a PersistentVolume of a CSI driver,
/// bound to a claim, and nodes whose attachments it manages. The "external attacher" is this
/// test, which marks each VolumeAttachment of the driver attached, as a CSI external-attacher
/// would after ControllerPublishVolume; nothing is mounted anywhere, so the node's
/// `status.volumesInUse` (which the kubelet would report) is written by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_volume_moves_after_fencing() {
    let opts = ControlPlaneOptions {
        controllers: DEFAULT_CONTROLLERS
            .iter()
            .map(|s| (*s).to_owned())
            .chain(["persistentvolume-attach-detach-controller".to_owned()])
            .collect(),
        ..ControlPlaneOptions::default()
    };
    let mut fx = Fixture::start("rem-va", opts, &three_nodes()).await;
    let client = fx.client();
    let nodes: Api<Node> = Api::all(client.clone());
    for (n, _) in three_nodes() {
        let patch = json!({"metadata": {"annotations": {
            "volumes.kubernetes.io/controller-managed-attach-detach": "true"}}});
        must(
            nodes
                .patch(n, &PatchParams::default(), &Patch::Merge(&patch))
                .await,
            "let the attach-detach controller manage the node",
        );
    }
    let pv_name = create_bound_volume(&client, "data").await;
    let attacher = tokio::spawn(fake_external_attacher(client.clone()));

    fx.fence_config(true).await;
    fs::write(fx.hold_file(), "").expect("hold");
    fx.start_remediate("remediate-1", CONFIG).await;
    create_statefulset(&client, "db", Some("data")).await;
    let (_, old_uid, node) = fx.running_pod("db", None).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let old_va = eventually("the volume attached to the pod's node", async || {
        attachment(&vas, &pv_name, &node).await
    })
    .await;
    // The kubelet would report the volume mounted: without the out-of-service taint, the
    // attach-detach controller then waits 6 minutes before force-detaching.
    let unique = format!("kubernetes.io/csi/{DRIVER}^vol-1");
    let patch = json!({"status": {"volumesInUse": [unique]}});
    must(
        nodes
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
        "report the volume in use",
    );

    kill_and_check_the_fence_comes_first_with_volume(&fx, &node, &old_uid, &old_va).await;
    // Released: the pod is force-deleted; the attach-detach controller detaches at once (the
    // volume is still "in use" on the node, but the node is out of service) and attaches the
    // volume where the replacement runs.
    let old_name = old_va.metadata.name.clone().expect("name");
    eventually(
        "the dead node's VolumeAttachment to be deleted",
        async || vas.get_opt(&old_name).await.ok()?.is_none().then_some(()),
    )
    .await;
    let (name, _, new_node) = fx.running_pod("db", Some(&old_uid)).await;
    assert_eq!(name, "db-0");
    assert_ne!(new_node, node);
    eventually("the volume attached to the new node", async || {
        attachment(&vas, &pv_name, &new_node).await
    })
    .await;
    let released = fx.node_events(&node, "NodeReleased").await;
    assert!(
        released.iter().any(|e| e
            .message
            .as_deref()
            .unwrap_or("")
            .contains("1 volume attachments")),
        "{released:?}"
    );
    attacher.abort();
    resume_and_check_recovery(&fx, &node).await;
}

/// The attached VolumeAttachment of `pv` on `node`, if any.
async fn attachment(vas: &Api<VolumeAttachment>, pv: &str, node: &str) -> Option<VolumeAttachment> {
    vas.list(&ListParams::default())
        .await
        .ok()?
        .items
        .into_iter()
        .find(|va| {
            va.spec.node_name == node
                && va.spec.source.persistent_volume_name.as_deref() == Some(pv)
                && va.status.as_ref().is_some_and(|s| s.attached)
        })
}

/// As [`kill_and_check_the_fence_comes_first`], for a node known in advance, also checking that
/// the volume stays attached while fencing runs.
async fn kill_and_check_the_fence_comes_first_with_volume(
    fx: &Fixture,
    node: &str,
    uid: &str,
    va: &VolumeAttachment,
) {
    fx.kill_node(node, uid);
    eventually("the isolation method to be called", async || {
        (fx.count("start", "isolation", node) > 0).then_some(())
    })
    .await;
    assert!(!fx.out_of_service(node).await);
    let vas: Api<VolumeAttachment> = Api::all(fx.client());
    let name = va.metadata.name.clone().expect("name");
    assert!(
        must(vas.get_opt(&name).await, "get the VolumeAttachment").is_some(),
        "the volume must stay attached until fencing is confirmed"
    );
    assert!(fx.pod_by_uid(uid).await.is_some());
    fs::remove_file(fx.hold_file()).expect("release the hold");
    eventually("the out-of-service taint", async || {
        fx.out_of_service(node).await.then_some(())
    })
    .await;
}

/// A PersistentVolume of the fake CSI driver, pre-bound to claim `claim` in `default`; both
/// marked Bound (no binder controller runs). Returns the PV's name.
async fn create_bound_volume(client: &Client, claim: &str) -> String {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), APPS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv_name = format!("{claim}-pv");
    let storage = BTreeMap::from([("storage".to_owned(), Quantity("1Gi".to_owned()))]);
    let pvc = PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(claim.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some(String::new()),
            volume_name: Some(pv_name.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(storage.clone()),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    let pvc = must(
        pvcs.create(&PostParams::default(), &pvc).await,
        "create the claim",
    );
    let pv = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(storage.clone()),
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            persistent_volume_reclaim_policy: Some("Retain".to_owned()),
            storage_class_name: Some(String::new()),
            claim_ref: Some(k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some(APPS.to_owned()),
                name: Some(claim.to_owned()),
                uid: pvc.metadata.uid.clone(),
                ..Default::default()
            }),
            csi: Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: DRIVER.to_owned(),
                volume_handle: "vol-1".to_owned(),
                ..Default::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    };
    must(
        pvs.create(&PostParams::default(), &pv).await,
        "create the volume",
    );
    must(
        pvs.patch_status(
            &pv_name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound"}})),
        )
        .await,
        "mark the volume Bound",
    );
    must(
        pvcs.patch_status(
            claim,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": "Bound",
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "1Gi"}
            }})),
        )
        .await,
        "mark the claim Bound",
    );
    pv_name
}

/// Marks every VolumeAttachment of the fake driver attached, as the CSI external-attacher does.
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

/// A node cut off from the API server but alive (its pods keep running), whose fence method
/// fails: remediate keeps trying and never releases it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_node_whose_fencing_fails_is_never_released() {
    let mut fx = Fixture::start("rem-part", ControlPlaneOptions::default(), &three_nodes()).await;
    fx.fence_config(false).await;
    create_deployment(&fx.client(), "web", 1).await;
    let (pod, uid, node) = fx.running_pod("web", None).await;
    // This node's own isolation method (per-node override of the shared one) cannot reach its
    // fence device.
    fx.configmap(
        &format!("fence-method-isolate-{node}"),
        "method.properties",
        "template=fence-method-template-test\naction=off\nresult=fail\n",
    )
    .await;
    fx.start_remediate("remediate-1", CONFIG).await;
    let pids = fx.standin(&node).pod_pids(&uid);
    assert!(!pids.is_empty());

    fx.standin(&node).stop_renewing();
    // Two cycles of (1 + 1 retry) failed isolation attempts, with a FencingUnconfirmed between.
    eventually("four failed isolation attempts", async || {
        (fx.calls()
            .iter()
            .filter(|c| {
                c.phase == "end"
                    && c.step == "isolation"
                    && c.node == node
                    && c.result.as_deref() == Some("fail")
            })
            .count()
            >= 4)
            .then_some(())
    })
    .await;
    assert!(!fx.node_events(&node, "FencingUnconfirmed").await.is_empty());
    assert!(
        !fx.out_of_service(&node).await,
        "an unconfirmed node is never tainted"
    );
    let p = fx
        .pod_by_uid(&uid)
        .await
        .unwrap_or_else(|| panic!("{pod} was deleted"));
    assert!(p.metadata.deletion_timestamp.is_none(), "{pod} was deleted");
    for pid in &pids {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "the live node's pod process {pid} was killed"
        );
    }
    let r = fx.remediate();
    assert_eq!(
        r.metric("node_monitor_remediation_releases_total", &[])
            .await,
        0.0
    );
    assert_eq!(
        r.metric("node_monitor_remediation_pods_deleted_total", &[])
            .await,
        0.0
    );
    eventually("the failures counted", async || {
        (r.metric(
            "node_monitor_remediation_fence_steps_total",
            &[("step", "isolation"), ("outcome", "failure")],
        )
        .await
            >= 4.0)
            .then_some(())
    })
    .await;
    let op = fx.operation(&node).await.expect("the operation is kept");
    assert!(op["cycles"].as_u64().unwrap_or(0) >= 1, "{op}");
    assert!(op["releasedAt"].is_null(), "{op}");

    // The partition heals: recovery undoes whatever isolation may have done; nothing was
    // released, so nothing is restored but the node.
    fx.standin(&node).resume_renewing();
    eventually("recovery to run", async || {
        (fx.count("end", "recovery", &node) > 0).then_some(())
    })
    .await;
    eventually("the operation to be forgotten", async || {
        fx.operation(&node).await.is_none().then_some(())
    })
    .await;
    assert!(!fx.out_of_service(&node).await);
    assert!(fx.pod_by_uid(&uid).await.is_some(), "the pod survived");
}

/// Three of four nodes of a zone die at once: the zone is in PartialDisruption, its fencing
/// rate is 0, nothing is fenced or released, and an Event and a metric say why.
/// (`maxUnhealthyFraction` is raised so the zone rule, not the cluster-wide one, decides.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn most_of_a_zone_dying_at_once_releases_nothing() {
    let nodes = [
        ("node-a1", "zone-a"),
        ("node-a2", "zone-a"),
        ("node-a3", "zone-a"),
        ("node-a4", "zone-a"),
        ("node-b1", "zone-b"),
    ];
    let mut fx = Fixture::start("rem-storm", ControlPlaneOptions::default(), &nodes).await;
    fx.fence_config(false).await;
    fx.start_remediate(
        "remediate-1",
        &format!("{CONFIG}maxUnhealthyFraction: 0.9\n"),
    )
    .await;
    create_deployment(&fx.client(), "web", 3).await;
    eventually("three Running pods", async || {
        let pods = fx.pods("web").await;
        (pods
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count()
            == 3)
            .then_some(())
    })
    .await;
    let before: Vec<String> = fx
        .pods("web")
        .await
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();

    let dying = ["node-a1", "node-a2", "node-a3"];
    for n in dying {
        fx.standin(n).pause();
    }
    let r = fx.remediate();
    eventually("a zone_disruption skip", async || {
        (r.metric(
            "node_monitor_remediation_skips_total",
            &[("reason", "zone_disruption")],
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;
    let zone_state = r
        .metric(
            "node_monitor_remediation_zone_state",
            &[("zone", "zone-a"), ("state", "PartialDisruption")],
        )
        .await;
    assert_eq!(zone_state, 1.0);
    let mut skipped = Vec::new();
    for n in dying {
        skipped.extend(fx.node_events(n, "FencingSkipped").await);
    }
    assert!(
        skipped.iter().any(|e| e
            .message
            .as_deref()
            .unwrap_or("")
            .contains("PartialDisruption")),
        "{skipped:?}"
    );
    // Every dead node of the zone is reported, none fenced.
    eventually("all three dead nodes reported", async || {
        (r.metric("node_monitor_remediation_nodes", &[("state", "dead")])
            .await
            == 3.0)
            .then_some(())
    })
    .await;
    assert!(
        fx.calls().is_empty(),
        "no fence method ran: {:?}",
        fx.calls()
    );
    for n in dying {
        assert!(!fx.out_of_service(n).await, "{n} tainted");
        assert!(fx.operation(n).await.is_none(), "{n} has an operation");
    }
    let after: Vec<String> = fx
        .pods("web")
        .await
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    assert_eq!(after.len(), before.len(), "no pod deleted");
    assert_eq!(
        r.metric("node_monitor_remediation_releases_total", &[])
            .await,
        0.0
    );

    // The zone comes back: still nothing was fenced.
    for n in dying {
        fx.standin(n).resume();
    }
    eventually("every node alive again", async || {
        (r.metric("node_monitor_remediation_nodes", &[("state", "dead")])
            .await
            == 0.0)
            .then_some(())
    })
    .await;
    assert!(fx.calls().is_empty());
}

/// Immediate evidence and a second liveness signal: a node whose agent announces a last gasp is
/// fenced at once (the evidence is the gasp, not the Lease), while a node whose Lease stopped but
/// whose agent keeps reporting is alive — until its agent falls silent too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_last_gasp_is_immediate_and_a_reporting_agent_keeps_its_node_alive() {
    let mut fx = Fixture::start("rem-gasp", ControlPlaneOptions::default(), &three_nodes()).await;
    fx.fence_config(false).await;
    fx.start_remediate(
        "remediate-1",
        &format!("{CONFIG}agentHeartbeatTimeout: 5s\n"),
    )
    .await;
    create_deployment(&fx.client(), "web", 1).await;
    let (_, uid, node) = fx.running_pod("web", None).await;
    let quiet = three_nodes()
        .iter()
        .map(|(n, _)| (*n).to_owned())
        .find(|n| *n != node)
        .expect("another node");
    let nodes: Api<Node> = Api::all(fx.client());
    // The quiet node is never fenced in this test (opted out): what matters is how it is judged.
    must(
        nodes
            .patch(
                &quiet,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "node-monitor.io/remediation": "disabled"}}})),
            )
            .await,
        "opt the quiet node out",
    );
    // Its agent keeps publishing its conditions (a heartbeat every second) while its kubelet's
    // Lease stops.
    let heartbeat = {
        let nodes = nodes.clone();
        let quiet = quiet.clone();
        tokio::spawn(async move {
            loop {
                let now = k8s_openapi::jiff::Timestamp::now();
                let patch = json!({"status": {"conditions": [{
                    "type": "NodeMonitorMemoryPressure", "status": "False",
                    "reason": "NodeMonitorNoMemoryPressure", "message": "agent heartbeat",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
                let _ = nodes
                    .patch_status(&quiet, &PatchParams::default(), &Patch::Strategic(patch))
                    .await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    fx.standin(&quiet).stop_renewing();

    // The pod's node goes down with a last gasp, as the agent writes it.
    fx.kill_node(&node, &uid);
    let gasp = format!(
        "{{\"time\":{:.3},\"cmd\":\"POWER_OFF\",\"comm\":\"test\",\"pid\":1}}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64()
    );
    must(
        nodes
            .patch(
                &node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "node-monitor.io/last-gasp": gasp}}})),
            )
            .await,
        "write the last gasp",
    );
    let (_, _, new_node) = fx.running_pod("web", Some(&uid)).await;
    assert_ne!(new_node, node);
    let started = fx.node_events(&node, "FencingStarted").await;
    assert!(
        started
            .iter()
            .any(|e| e.message.as_deref().unwrap_or("").contains("last gasp")),
        "fenced on the last gasp, not on the Lease: {started:?}"
    );

    // The quiet node's Lease has now been silent for well over the 4 s window: still alive.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(fx.client(), "kube-node-lease");
    eventually("the quiet node's Lease to be 8 s old", async || {
        let l = leases.get(&quiet).await.ok()?;
        let renew = l.spec?.renew_time?.0;
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(renew);
        (age.as_secs() >= 8).then_some(())
    })
    .await;
    let r = fx.remediate();
    assert_eq!(
        r.metric("node_monitor_remediation_nodes", &[("state", "dead")])
            .await,
        1.0,
        "only the gasping node is dead:\n{}",
        r.tail()
    );
    assert!(fx.node_events(&quiet, "FencingSkipped").await.is_empty());

    // The agent falls silent too: now the node is dead (and skipped, being opted out).
    heartbeat.abort();
    eventually("the quiet node judged dead", async || {
        (r.metric(
            "node_monitor_remediation_skips_total",
            &[("reason", "not_eligible")],
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;
    assert!(!fx.out_of_service(&quiet).await);
    assert!(fx.operation(&quiet).await.is_none());
}

/// The controller is killed while a fence method runs; a new replica (another identity) takes
/// the leader Lease over once it expires, finds the stored operation, runs the interrupted step
/// again and completes the failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_resumes_after_a_controller_restart() {
    let mut fx = Fixture::start(
        "rem-restart",
        ControlPlaneOptions::default(),
        &three_nodes(),
    )
    .await;
    fx.fence_config(true).await;
    fs::write(fx.hold_file(), "").expect("hold");
    fx.start_remediate("remediate-1", CONFIG).await;
    create_deployment(&fx.client(), "web", 1).await;
    let (_, old_uid, node) = fx.running_pod("web", None).await;
    fx.kill_node(&node, &old_uid);
    eventually("the isolation method to be called", async || {
        (fx.count("start", "isolation", &node) == 1).then_some(())
    })
    .await;
    // Crash mid-fence.
    if let Some(mut r) = fx.remediate.take() {
        r.kill();
    }
    let op = fx
        .operation(&node)
        .await
        .expect("the operation survives the crash");
    assert_eq!(op["phase"]["name"], "fencing", "{op}");
    assert_eq!(op["running"], "isolation", "{op}");
    assert!(!fx.out_of_service(&node).await);

    fx.start_remediate("remediate-2", CONFIG).await;
    fx.remediate
        .as_mut()
        .expect("running")
        .wait_log("resuming fencing operations")
        .await;
    eventually("the interrupted isolation step to run again", async || {
        (fx.count("start", "isolation", &node) == 2).then_some(())
    })
    .await;
    assert!(
        !fx.out_of_service(&node).await,
        "still nothing released while the step runs"
    );
    fs::remove_file(fx.hold_file()).expect("release the hold");
    let (_, _, new_node) = fx.running_pod("web", Some(&old_uid)).await;
    assert_ne!(new_node, node);
    assert!(fx.out_of_service(&node).await);
    assert_eq!(
        fx.remediate()
            .metric("node_monitor_remediation_releases_total", &[])
            .await,
        1.0
    );
    resume_and_check_recovery(&fx, &node).await;
}

/// The shipped alerts (deploy/remediate/prometheusrule.yaml) pass `promtool check rules` and
/// their unit tests (deploy/remediate/rules.test.yaml), cases that fire and cases that must not.
#[test]
fn remediate_alert_rules_pass_promtool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = fs::read_to_string(deploy_remediate("prometheusrule.yaml")).expect("read rules");
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).expect("rules are YAML");
    assert_eq!(doc["kind"], serde_yaml::Value::from("PrometheusRule"));
    let mut plain = serde_yaml::Mapping::new();
    plain.insert("groups".into(), doc["spec"]["groups"].clone());
    fs::write(
        dir.path().join("rules.generated.yaml"),
        serde_yaml::to_string(&plain).expect("yaml"),
    )
    .expect("write the rules");
    fs::copy(
        deploy_remediate("rules.test.yaml"),
        dir.path().join("rules.test.yaml"),
    )
    .expect("copy the rule tests");
    for args in [
        ["check", "rules", "rules.generated.yaml"],
        ["test", "rules", "rules.test.yaml"],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(dir.path())
            .output()
            .expect("promtool is installed by scripts/setup.sh (Debian package prometheus)");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The shipped configuration (deploy/remediate/configmap.yaml) parses and states the defaults.
#[test]
fn shipped_configuration_is_the_default_one() {
    let text = fs::read_to_string(deploy_remediate("configmap.yaml")).expect("configmap");
    let cm: serde_yaml::Value = serde_yaml::from_str(&text).expect("YAML");
    let doc = cm["data"]["remediate.yaml"]
        .as_str()
        .expect("data.remediate.yaml");
    let parsed = node_monitor::core::remediation::parse_config("configmap.yaml", doc)
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(
        parsed,
        node_monitor::core::remediation::RemediationConfig::default()
    );
    // And the tests' own configuration is valid too.
    node_monitor::core::remediation::parse_config("CONFIG", CONFIG)
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
}
