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

use k8s_openapi::api::{
    core::v1::{Event, Node, Pod},
    storage::v1::VolumeAttachment,
};
use kube::{
    Api, Client,
    api::{DynamicObject, ListParams, Patch, PatchParams},
};
use node_monitor_remediate::store::{node_fence_name, node_fence_resource};

use node_monitor_core::remediation::{OUT_OF_SERVICE_TAINT, OUT_OF_SERVICE_VALUE};
use node_monitor_tests::{
    cgroup::{TestCgroups, require_root},
    control_plane::{ControlPlane, ControlPlaneOptions, error_chain},
    e2e::{binary, free_port, http_get},
    manifests, metrics,
    standin::{StandIn, StandInConfig},
    wait::{self, must},
    workload::{self, APPS, ZONE_LABEL},
};
use serde_json::json;

/// Bound on every wait for the cluster to converge (a liveness bound, not a speed assertion).
const WAIT: Duration = Duration::from_secs(120);
const NS: &str = "node-monitor";

async fn eventually<T>(what: &str, check: impl AsyncFnMut() -> Option<T>) -> T {
    wait::eventually(what, WAIT, check).await
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

/// A running `node-monitor-remediate`.
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
        let child = Command::new(binary("node-monitor-remediate"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--namespace", NS, "--identity", identity])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            .arg("--config")
            .arg(&cfg)
            .env(
                "RUST_LOG",
                "info,node_monitor_remediate=debug,node_monitor_service=debug",
            )
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
        metrics::sum(&text, family, labels)
    }

    /// The value of an unlabelled metric (the sum over its label sets).
    async fn total(&self, family: &str) -> f64 {
        self.metric(family, &[]).await
    }

    /// Waits until the metric's sum satisfies `done`.
    async fn wait_metric(
        &self,
        what: &str,
        family: &str,
        labels: &[(&str, &str)],
        done: impl Fn(f64) -> bool,
    ) {
        eventually(what, async || {
            done(self.metric(family, labels).await).then_some(())
        })
        .await;
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
        must(
            manifests::install_remediate_crds(&cp.client()).await,
            "install the NodeFence CRD (deploy/remediate/crd.yaml)",
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

    /// Waits until the number of `phase` records of `step` on `node` satisfies `done`.
    async fn wait_count(
        &self,
        what: &str,
        (phase, step, node): (&str, &str, &str),
        done: impl Fn(usize) -> bool,
    ) {
        eventually(what, async || {
            done(self.count(phase, step, node)).then_some(())
        })
        .await;
    }

    async fn configmap(&self, name: &str, key: &str, text: &str) {
        must(
            workload::create_configmap(&self.client(), NS, name, key, text).await,
            "create a fence ConfigMap",
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
    async fn kill_node(&self, node: &str, pod_uid: &str) {
        // Its processes first reach the cgroup (a pod is Running as they start).
        self.standin(node).running_pod_pids(pod_uid).await;
        let killed = workload::power_off(self.standin(node), pod_uid);
        assert!(killed > 0, "pod {pod_uid} has no processes on {node}");
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

    /// Waits until `node` carries the out-of-service taint (`tainted`) or no longer does.
    async fn wait_out_of_service(&self, node: &str, tainted: bool) {
        let what = if tainted {
            "the out-of-service taint"
        } else {
            "the out-of-service taint to be removed"
        };
        eventually(what, async || {
            (self.out_of_service(node).await == tainted).then_some(())
        })
        .await;
    }

    /// Waits until recovery ran on `node` and its operation is forgotten.
    async fn wait_recovered(&self, node: &str) {
        self.wait_count("recovery to run", ("end", "recovery", node), |n| n > 0)
            .await;
        eventually("the operation to be forgotten", async || {
            self.operation(node).await.is_none().then_some(())
        })
        .await;
    }

    /// The node's NodeFence, if any.
    async fn node_fence(&self, node: &str) -> Option<DynamicObject> {
        let api: Api<DynamicObject> = Api::all_with(self.client(), &node_fence_resource());
        must(
            api.get_opt(&node_fence_name(node)).await,
            "get the NodeFence",
        )
    }

    /// The operation in the node's NodeFence status, if any.
    async fn operation(&self, node: &str) -> Option<serde_json::Value> {
        let nf = self.node_fence(node).await?;
        nf.data.pointer("/status/operation").cloned()
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

    /// The node's Events of `reason`, once there is one: the controller writes an Event after
    /// the state it reports, so a test that saw the state may ask a moment early.
    async fn node_events_soon(&self, node: &str, reason: &str) -> Vec<Event> {
        eventually(&format!("a {reason} event on {node}"), async || {
            let found = self.node_events(node, reason).await;
            (!found.is_empty()).then_some(found)
        })
        .await
    }

    async fn pods(&self, app: &str) -> Vec<Pod> {
        must(workload::app_pods(&self.client(), app).await, "list pods")
    }

    /// The app's single running pod: (name, uid, node).
    async fn running_pod(&self, app: &str, not_uid: Option<&str>) -> (String, String, String) {
        eventually(&format!("a Running pod of {app}"), async || {
            workload::running_pod(&self.pods(app).await, not_uid)
        })
        .await
    }

    async fn pod_by_uid(&self, uid: &str) -> Option<Pod> {
        self.pods_all()
            .await
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))
    }

    /// Asserts that the pod `uid` (named `pod`) is in the API and not terminating.
    async fn assert_not_deleted(&self, pod: &str, uid: &str, when: &str) {
        let p = self
            .pod_by_uid(uid)
            .await
            .unwrap_or_else(|| panic!("{pod} was deleted {when}"));
        assert!(
            p.metadata.deletion_timestamp.is_none(),
            "{pod} deleted {when}"
        );
    }

    async fn pods_all(&self) -> Vec<Pod> {
        let api: Api<Pod> = Api::namespaced(self.client(), APPS);
        must(api.list(&ListParams::default()).await, "list pods").items
    }
}

async fn create_deployment(client: &Client, app: &str, replicas: i32) {
    must(
        workload::create_deployment(client, app, replicas).await,
        "create the Deployment",
    );
}

async fn create_statefulset(client: &Client, app: &str, claim: Option<&str>) {
    must(
        workload::create_statefulset(client, app, claim).await,
        "create the StatefulSet",
    );
}

/// Kills the node running the app's pod, lets fencing (held by the hold file) start, checks that
/// nothing is released while it runs, then lets it finish. Returns (node, old pod uid).
async fn kill_and_check_the_fence_comes_first(fx: &Fixture, app: &str) -> (String, String) {
    let (pod, uid, node) = fx.running_pod(app, None).await;
    fx.kill_node(&node, &uid).await;
    fx.wait_count(
        "the isolation method to be called",
        ("start", "isolation", &node),
        |n| n > 0,
    )
    .await;
    // The fence method runs (held): nothing is released yet.
    assert!(
        !fx.out_of_service(&node).await,
        "the out-of-service taint must wait for confirmed fencing"
    );
    fx.assert_not_deleted(&pod, &uid, "before fencing was confirmed")
        .await;
    let op = fx.operation(&node).await.expect("the operation is stored");
    assert_eq!(op["phase"]["name"], "fencing", "{op}");
    assert_eq!(op["running"], "isolation", "{op}");
    // Fencing completes: now the node is released.
    fs::remove_file(fx.hold_file()).expect("release the hold");
    fx.wait_out_of_service(&node, true).await;
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

/// The node comes back rebooted (a new bootID): recovery runs, the taint goes, the operation is
/// forgotten.
async fn reboot_and_check_recovery(fx: &Fixture, node: &str) {
    fx.standin(node).reboot();
    fx.wait_recovered(node).await;
    fx.wait_out_of_service(node, false).await;
    assert!(
        !fx.node_events_soon(node, "NodeRecovered").await.is_empty(),
        "a NodeRecovered event"
    );
}

/// Whether one of `events` says `text`.
fn mentions(events: &[Event], text: &str) -> bool {
    events
        .iter()
        .any(|e| e.message.as_deref().unwrap_or("").contains(text))
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

    // No admission policy in this cluster: remediate says its operations are unprotected.
    fx.remediate()
        .wait_metric(
            "the NodeFence status policy seen missing",
            "node_monitor_remediation_admission_policy",
            &[("state", "policy_missing")],
            |v| v == 1.0,
        )
        .await;
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
            !fx.node_events_soon(&node, reason).await.is_empty(),
            "a {reason} event on {node}"
        );
    }
    let r = fx.remediate();
    assert_eq!(
        r.total("node_monitor_remediation_releases_total").await,
        1.0
    );
    assert!(r.total("node_monitor_remediation_pods_deleted_total").await >= 1.0);
    assert_eq!(
        r.metric(
            "node_monitor_remediation_fence_steps_total",
            &[("step", "isolation"), ("outcome", "success")]
        )
        .await,
        1.0
    );
    assert_eq!(fx.count("start", "isolation", &node), 1, "{:?}", fx.calls());

    reboot_and_check_recovery(&fx, &node).await;
    assert!(
        fx.remediate()
            .total("node_monitor_remediation_recoveries_total")
            .await
            >= 1.0
    );
}

/// A node released after storage isolation, whose Lease renews again before its kubelet has
/// synced (nothing says yet that the force-deleted pods' containers are gone, while their
/// replacements run elsewhere): recovery — the step that gives the node its storage back — and the
/// taint removal wait. Its kubelet Ready again without a reboot is no proof either (the pods were
/// force-deleted, so none is left bound to it whatever still runs): they wait for a new bootID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_waits_until_the_kubelet_is_back_not_just_the_lease() {
    let mut fx = Fixture::start("rem-held", ControlPlaneOptions::default(), &three_nodes()).await;
    fx.fence_config(false).await;
    fx.start_remediate("remediate-1", CONFIG).await;
    create_deployment(&fx.client(), "web", 1).await;
    let (_, old_uid, node) = fx.running_pod("web", None).await;
    fx.kill_node(&node, &old_uid).await;
    fx.wait_out_of_service(&node, true).await;
    let (_, _, new_node) = fx.running_pod("web", Some(&old_uid)).await;
    assert_ne!(new_node, node);

    // Only the Lease comes back (the stand-in stays frozen: its Ready condition is the one of
    // before the death).
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(fx.client(), "kube-node-lease");
    let renew = json!({"spec": {"renewTime":
        k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now())}});
    must(
        leases
            .patch(&node, &PatchParams::default(), &Patch::Merge(&renew))
            .await,
        "renew the node's Lease by hand",
    );
    eventually("a RecoveryHeld event", async || {
        (!fx.node_events(&node, "RecoveryHeld").await.is_empty()).then_some(())
    })
    .await;
    assert!(!fx.node_events_soon(&node, "NodeBack").await.is_empty());
    assert_eq!(
        fx.count("start", "recovery", &node),
        0,
        "recovery ran before the kubelet was back: {:?}",
        fx.calls()
    );
    assert!(
        fx.out_of_service(&node).await,
        "the taint stays while recovery waits"
    );
    let op = fx.operation(&node).await.expect("the operation is kept");
    assert_eq!(op["phase"]["name"], "recovering", "{op}");
    assert_eq!(op["recoveryHeld"], true, "{op}");

    let held = fx.node_events(&node, "RecoveryHeld").await;
    assert!(mentions(&held, "reboot the node"), "{held:?}");

    // The kubelet reports Ready again, with the bootID of before: still held.
    fx.standin(&node).resume();
    let nodes: Api<Node> = Api::all(fx.client());
    eventually("the kubelet's Ready=True back on the node", async || {
        let n = nodes.get(&node).await.ok()?;
        n.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
    // Eight of remediate's 250 ms ticks with the kubelet Ready.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        fx.count("start", "recovery", &node),
        0,
        "recovery ran without a reboot: {:?}",
        fx.calls()
    );
    assert!(fx.out_of_service(&node).await, "the taint stays");

    // Rebooted (a new bootID): recovery runs, then the taint goes.
    reboot_and_check_recovery(&fx, &node).await;
}

/// Also: remediate runs as the ServiceAccount of deploy/remediate, with exactly the shipped RBAC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_statefulset_pod_is_replaced_after_fencing() {
    let mut fx = Fixture::start("rem-sts", ControlPlaneOptions::default(), &three_nodes()).await;
    fx.fence_config(false).await;
    // Every shipped manifest applies; the CRD, the NodeFence status policy, the ServiceAccount and
    // its RBAC for real (remediate runs with that token, under that policy), the rest as a
    // server-side dry run (the stand-ins would otherwise run the Deployment's pods).
    let kustomization: serde_norway::Value = serde_norway::from_str(
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
        let objects = must(
            manifests::read_objects(&deploy_remediate(file)),
            "read a shipped manifest",
        );
        let applied = if [
            "crd.yaml",
            "validatingadmissionpolicy.yaml",
            "serviceaccount.yaml",
            "rbac.yaml",
        ]
        .contains(&file.as_str())
        {
            manifests::apply(&fx.client(), &objects).await
        } else {
            manifests::apply_dry_run(&fx.client(), &objects).await
        };
        must(applied, "apply a shipped manifest");
    }
    let kubeconfig = must(
        fx.cp
            .service_account_kubeconfig(NS, "node-monitor-remediate")
            .await,
        "a token for the remediate ServiceAccount",
    );
    fx.start_remediate_as("remediate-1", CONFIG, &kubeconfig)
        .await;
    // The shipped policy is in force for remediate's own ServiceAccount, and remediate says so.
    fx.remediate()
        .wait_metric(
            "the NodeFence status policy seen enforced",
            "node_monitor_remediation_admission_policy",
            &[("state", "enforced")],
            |v| v == 1.0,
        )
        .await;
    create_statefulset(&fx.client(), "db", None).await;
    let (pod, old_uid, node) = fx.running_pod("db", None).await;
    assert_eq!(pod, "db-0");
    fx.kill_node(&node, &old_uid).await;

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
    let released = fx.node_events_soon(&node, "NodeReleased").await;
    assert!(mentions(&released, "1 pods deleted"), "{released:?}");
    reboot_and_check_recovery(&fx, &node).await;
    let log = fx.remediate().log();
    assert!(
        !log.to_lowercase().contains("forbidden"),
        "the shipped RBAC must allow every call:\n{}",
        fx.remediate().tail()
    );
}

fn deploy_remediate(file: &str) -> PathBuf {
    manifests::deploy_dir().join("remediate").join(file)
}

/// The attach-detach controller needs a volume it manages: a PersistentVolume of a CSI driver,
/// bound to a claim, and nodes whose attachments it manages. The "external attacher" is this
/// test, which marks each VolumeAttachment of the driver attached, as a CSI external-attacher
/// would after ControllerPublishVolume; nothing is mounted anywhere, so the node's
/// `status.volumesInUse` (which the kubelet would report) is written by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statefulset_volume_moves_after_fencing() {
    let mut opts = ControlPlaneOptions::default();
    opts.controllers
        .push(workload::ATTACH_DETACH_CONTROLLER.to_owned());
    let mut fx = Fixture::start("rem-va", opts, &three_nodes()).await;
    let client = fx.client();
    must(
        workload::manage_attach_detach(&client, three_nodes().map(|(n, _)| n)).await,
        "let the attach-detach controller manage the nodes",
    );
    let pv_name = must(
        workload::create_bound_volume(&client, "data").await,
        "create the volume",
    );
    let attacher = tokio::spawn(workload::fake_external_attacher(client.clone()));

    fx.fence_config(true).await;
    fs::write(fx.hold_file(), "").expect("hold");
    fx.start_remediate("remediate-1", CONFIG).await;
    create_statefulset(&client, "db", Some("data")).await;
    let (_, old_uid, node) = fx.running_pod("db", None).await;
    let old_va = eventually("the volume attached to the pod's node", async || {
        attachment(&client, &pv_name, &node).await
    })
    .await;
    // The kubelet would report the volume mounted: without the out-of-service taint, the
    // attach-detach controller then waits 6 minutes before force-detaching.
    let patch = json!({"status": {"volumesInUse": [workload::volume_in_use_name()]}});
    must(
        Api::<Node>::all(client.clone())
            .patch_status(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await,
        "report the volume in use",
    );

    kill_and_check_the_fence_comes_first_with_volume(&fx, &node, &old_uid, &old_va).await;
    // Released: the pod is force-deleted; the attach-detach controller detaches at once (the
    // volume is still "in use" on the node, but the node is out of service) and attaches the
    // volume where the replacement runs.
    let old_name = old_va.metadata.name.clone().expect("name");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    eventually(
        "the dead node's VolumeAttachment to be deleted",
        async || vas.get_opt(&old_name).await.ok()?.is_none().then_some(()),
    )
    .await;
    let (name, _, new_node) = fx.running_pod("db", Some(&old_uid)).await;
    assert_eq!(name, "db-0");
    assert_ne!(new_node, node);
    eventually("the volume attached to the new node", async || {
        attachment(&client, &pv_name, &new_node).await
    })
    .await;
    let released = fx.node_events_soon(&node, "NodeReleased").await;
    assert!(mentions(&released, "1 volume attachments"), "{released:?}");
    attacher.abort();
    reboot_and_check_recovery(&fx, &node).await;
}

/// The attached VolumeAttachment of `pv` on `node`; `None` also while the API cannot say.
async fn attachment(client: &Client, pv: &str, node: &str) -> Option<VolumeAttachment> {
    workload::attachment(client, pv, node).await.ok().flatten()
}

/// As [`kill_and_check_the_fence_comes_first`], for a node known in advance, also checking that
/// the volume stays attached while fencing runs.
async fn kill_and_check_the_fence_comes_first_with_volume(
    fx: &Fixture,
    node: &str,
    uid: &str,
    va: &VolumeAttachment,
) {
    fx.kill_node(node, uid).await;
    fx.wait_count(
        "the isolation method to be called",
        ("start", "isolation", node),
        |n| n > 0,
    )
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
    fx.wait_out_of_service(node, true).await;
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
        &format!(
            "node_name={node}\ntemplate=fence-method-template-test\naction=off\nresult=fail\n"
        ),
    )
    .await;
    fx.start_remediate("remediate-1", CONFIG).await;
    let pids = fx.standin(&node).running_pod_pids(&uid).await;
    assert!(
        !pids.is_empty(),
        "the running pod's processes in its cgroup"
    );

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
    assert!(
        !fx.node_events_soon(&node, "FencingUnconfirmed")
            .await
            .is_empty()
    );
    assert!(
        !fx.out_of_service(&node).await,
        "an unconfirmed node is never tainted"
    );
    fx.assert_not_deleted(&pod, &uid, "while its node was alive")
        .await;
    for pid in &pids {
        assert!(
            Path::new(&format!("/proc/{pid}")).exists(),
            "the live node's pod process {pid} was killed"
        );
    }
    let r = fx.remediate();
    assert_eq!(
        r.total("node_monitor_remediation_releases_total").await,
        0.0
    );
    assert_eq!(
        r.total("node_monitor_remediation_pods_deleted_total").await,
        0.0
    );
    r.wait_metric(
        "the failures counted",
        "node_monitor_remediation_fence_steps_total",
        &[("step", "isolation"), ("outcome", "failure")],
        |v| v >= 4.0,
    )
    .await;
    let op = fx.operation(&node).await.expect("the operation is kept");
    assert!(op["cycles"].as_u64().unwrap_or(0) >= 1, "{op}");
    assert!(op["releasedAt"].is_null(), "{op}");

    // The partition heals: recovery undoes whatever isolation may have done; nothing was
    // released, so nothing is restored but the node.
    fx.standin(&node).resume_renewing();
    fx.wait_recovered(&node).await;
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
    r.wait_metric(
        "a zone_disruption skip",
        "node_monitor_remediation_skips_total",
        &[("reason", "zone_disruption")],
        |v| v >= 1.0,
    )
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
    assert!(mentions(&skipped, "PartialDisruption"), "{skipped:?}");
    // Every dead node of the zone is reported, none fenced.
    r.wait_metric(
        "all three dead nodes reported",
        "node_monitor_remediation_nodes",
        &[("state", "dead")],
        |v| v == 3.0,
    )
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
        r.total("node_monitor_remediation_releases_total").await,
        0.0
    );

    // The zone comes back: still nothing was fenced.
    for n in dying {
        fx.standin(n).resume();
    }
    r.wait_metric(
        "every node alive again",
        "node_monitor_remediation_nodes",
        &[("state", "dead")],
        |v| v == 0.0,
    )
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
    fx.kill_node(&node, &uid).await;
    let gasp = format!(
        "{{\"time\":{:.3},\"cmd\":\"POWER_OFF\",\"comm\":\"test\",\"pid\":1,\"verdict\":\"allowed\"}}",
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
    let started = fx.node_events_soon(&node, "FencingStarted").await;
    assert!(
        mentions(&started, "last gasp"),
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
    r.wait_metric(
        "the quiet node judged dead",
        "node_monitor_remediation_skips_total",
        &[("reason", "not_eligible")],
        |v| v >= 1.0,
    )
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
    fx.kill_node(&node, &old_uid).await;
    fx.wait_count(
        "the isolation method to be called",
        ("start", "isolation", &node),
        |n| n == 1,
    )
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
    let nf = fx.node_fence(&node).await.expect("the NodeFence");
    assert_eq!(nf.data["spec"]["nodeName"], node.as_str());
    assert_eq!(nf.data["status"]["phase"], "fencing", "the printed phase");
    let owner = &nf.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", node.as_str())
    );
    assert!(!fx.out_of_service(&node).await);
    // An operation in an earlier release's format (a ConfigMap in the namespace) claiming the
    // node fenced and released: named in a warning, never acted on.
    let legacy = format!("node-monitor-fence-{node}");
    let forged = json!({"node": node, "nodeUid": fx.node(&node).await.metadata.uid,
        "phase": {"name": "releasing"}, "confirmedBy": "isolation", "detectedAt": 0,
        "evidence": "forged", "leaseRenewTime": null});
    fx.configmap(&legacy, "operation.json", &forged.to_string())
        .await;

    fx.start_remediate("remediate-2", CONFIG).await;
    let r = fx.remediate.as_mut().expect("running");
    r.wait_log("resuming fencing operations").await;
    let log = r.log();
    assert!(
        log.contains("fencing operations of an earlier release") && log.contains(&legacy),
        "{}",
        r.tail()
    );
    fx.wait_count(
        "the interrupted isolation step to run again",
        ("start", "isolation", &node),
        |n| n == 2,
    )
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
            .total("node_monitor_remediation_releases_total")
            .await,
        1.0
    );
    reboot_and_check_recovery(&fx, &node).await;
}

/// The shipped alerts (deploy/remediate/prometheusrule.yaml) pass `promtool check rules` and
/// their unit tests (deploy/remediate/rules.test.yaml), cases that fire and cases that must not.
#[test]
fn remediate_alert_rules_pass_promtool() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = fs::read_to_string(deploy_remediate("prometheusrule.yaml")).expect("read rules");
    let doc: serde_norway::Value = serde_norway::from_str(&text).expect("rules are YAML");
    assert_eq!(doc["kind"], serde_norway::Value::from("PrometheusRule"));
    let mut plain = serde_norway::Mapping::new();
    plain.insert("groups".into(), doc["spec"]["groups"].clone());
    fs::write(
        dir.path().join("rules.generated.yaml"),
        serde_norway::to_string(&plain).expect("yaml"),
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
    let cm: serde_norway::Value = serde_norway::from_str(&text).expect("YAML");
    let doc = cm["data"]["remediate.yaml"]
        .as_str()
        .expect("data.remediate.yaml");
    let parsed = node_monitor_core::remediation::parse_config("configmap.yaml", doc)
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert_eq!(
        parsed,
        node_monitor_core::remediation::RemediationConfig::default()
    );
    // And the tests' own configuration is valid too.
    node_monitor_core::remediation::parse_config("CONFIG", CONFIG)
        .unwrap_or_else(|e| panic!("{}", error_chain(&e)));
}

/// The agent's liveness Lease of `node`, renewed every second (as the agent does at its
/// `nodeMonitor.livenessLeaseInterval`) until the returned sender says stop.
fn run_agent_lease(fx: &Fixture, node: &str) -> tokio::sync::watch::Sender<bool> {
    use node_monitor::cluster::liveness_lease::{LivenessLease, renew_until_stopped};
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(renew_until_stopped(
        LivenessLease::new(fx.client(), NS, node),
        Duration::from_secs(1),
        stopped,
    ));
    stop
}

/// Nodes running the agent: a node that goes silent is found dead from its agent's liveness Lease
/// once its kubelet's Lease corroborates, long before the kubelet Lease's own window (here 600
/// renewals, far beyond any wait of this test), then fenced before anything is released. A node
/// whose agent alone stops (its kubelet renews) stays alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_node_running_the_agent_is_found_dead_by_its_liveness_lease() {
    let mut fx = Fixture::start("rem-agent", ControlPlaneOptions::default(), &three_nodes()).await;
    fx.fence_config(true).await;
    fs::write(fx.hold_file(), "").expect("hold");
    let agents: BTreeMap<String, tokio::sync::watch::Sender<bool>> = three_nodes()
        .iter()
        .map(|(n, _)| ((*n).to_owned(), run_agent_lease(&fx, n)))
        .collect();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(fx.client(), NS);
    eventually("every agent's liveness Lease", async || {
        let list = leases.list(&ListParams::default()).await.ok()?;
        let agents = list
            .items
            .iter()
            .filter(|l| {
                l.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("node-monitor-agent-"))
            })
            .count();
        (agents == 3).then_some(())
    })
    .await;
    let config = format!(
        "{}agentLeaseTimeout: 3s\nagentKubeletCorroboration: 1.5\n",
        CONFIG.replace("missedRenewals: 4", "missedRenewals: 600")
    );
    fx.start_remediate("remediate-1", &config).await;
    create_deployment(&fx.client(), "web", 1).await;
    let (_, _, node) = fx.running_pod("web", None).await;
    let crashed = three_nodes()
        .iter()
        .map(|(n, _)| (*n).to_owned())
        .find(|n| *n != node)
        .expect("another node");

    // The agent of another node stops (a crash, a rollout); its kubelet keeps renewing.
    agents[&crashed].send_replace(true);
    // The pod's machine dies: its kubelet and its agent fall silent together.
    agents[&node].send_replace(true);
    let (killed, uid) = kill_and_check_the_fence_comes_first(&fx, "web").await;
    assert_eq!(killed, node);
    let started = fx.node_events_soon(&node, "FencingStarted").await;
    assert!(
        mentions(&started, "liveness Lease not renewed"),
        "found dead from its agent's liveness Lease, not the kubelet's 600-renewal window: {started:?}"
    );
    let (_, _, new_node) = fx.running_pod("web", Some(&uid)).await;
    assert_ne!(new_node, node, "the replacement runs on another node");

    // The node whose agent alone stopped: its liveness Lease has long been silent, and it is
    // alive, never fenced.
    let name = node_monitor_core::contract::names::agent_lease_name(&crashed);
    eventually("the stopped agent's Lease to be 6 s old", async || {
        let renew = leases.get(&name).await.ok()?.spec?.renew_time?.0;
        let age = k8s_openapi::jiff::Timestamp::now().duration_since(renew);
        (age.as_secs() >= 6).then_some(())
    })
    .await;
    let r = fx.remediate();
    assert_eq!(
        r.metric("node_monitor_remediation_nodes", &[("state", "dead")])
            .await,
        1.0,
        "only the silent node is dead:\n{}",
        r.tail()
    );
    for reason in ["FencingStarted", "FencingSkipped"] {
        assert!(
            fx.node_events(&crashed, reason).await.is_empty(),
            "no {reason} on {crashed}, whose kubelet renews"
        );
    }
    assert!(!fx.out_of_service(&crashed).await);
    assert!(fx.operation(&crashed).await.is_none());
}
