//! The controller on an in-memory cluster, in the style of the node lifecycle controller's
//! tests: nodes renew their Leases (or stop), the clock is moved by hand, every pass runs the
//! real controller, and the effects (fence runs, taints, deletions, Events, operation records)
//! are read back from the fake.
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{Node, NodeCondition, NodeStatus, NodeSystemInfo, Pod, PodSpec},
    },
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time},
    jiff::Timestamp as Wall,
};
use kube::api::DynamicObject;
use tokio::sync::watch;

use node_monitor_core::{
    contract::names::agent_lease_name,
    remediation::{FenceOp, RemediationConfig, Step},
    units::clock::Timestamp,
};

use super::Controller;
use crate::{
    ApiHealth,
    methods::MethodSpec,
    metrics::RemediateMetrics,
    ports::{
        ApiError, Clock, ClusterView, Events, FenceRunner, NodePods, OpRecords, PodDeletion,
        StepError, Taints,
    },
    store::{StoreError, StoredOp, decode_op, node_fence_name, op_object},
};
use node_monitor_service::{events::EventRecord, metrics::ReasonLabels};

/// The wall clock at the controller's start (Unix ms).
const UNIX0: i64 = 1_700_000_000_000;

/// The cluster as the API server would hold it.
#[derive(Default)]
struct World {
    nodes: BTreeMap<String, Node>,
    leases: BTreeMap<String, Lease>,
    agent_leases: BTreeMap<String, Lease>,
    configmaps: BTreeMap<String, BTreeMap<String, String>>,
    /// The operation records, as the NodeFences the store writes.
    ops: BTreeMap<String, DynamicObject>,
    version: u64,
    pods: Vec<Pod>,
    tainted: BTreeSet<String>,
    /// Fence steps that fail (`node/step`).
    failing: BTreeSet<String>,
    events: Vec<EventRecord>,
    /// Every effect, in order: `run n1 isolation`, `taint n1`, `untaint n1`, `delete ns/p`.
    log: Vec<String>,
}

#[derive(Clone)]
struct Fake {
    world: Arc<Mutex<World>>,
    /// Milliseconds since the controller's start.
    millis: Arc<AtomicI64>,
    /// While true, fence steps are held in flight.
    held: watch::Sender<bool>,
    /// A stalled Lease watch.
    stalled: Arc<Mutex<Option<StalledWatch>>>,
}

/// Since when (ms) the Lease watch is stalled, and the Leases it last delivered.
type StalledWatch = (i64, BTreeMap<String, Lease>);

impl Fake {
    fn new() -> Self {
        Self {
            world: Arc::default(),
            millis: Arc::default(),
            held: watch::Sender::new(false),
            stalled: Arc::default(),
        }
    }

    /// The Lease watch stops delivering (its connection open and silent, or black-holed): the
    /// cache keeps the Leases of now, and no list confirms it current from now on.
    fn stall_lease_watch(&self) {
        let leases = self.w().leases.clone();
        *self.stalled.lock().expect("stalled") = Some((self.millis.load(Ordering::SeqCst), leases));
    }

    /// The watch reconnects and catches up; a list confirms it current.
    fn resume_lease_watch(&self) {
        *self.stalled.lock().expect("stalled") = None;
    }

    fn w(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().expect("world")
    }

    fn wall(&self) -> Wall {
        Wall::from_millisecond(UNIX0 + self.millis.load(Ordering::SeqCst)).expect("valid")
    }

    fn log(&self) -> Vec<String> {
        self.w().log.clone()
    }

    fn events(&self, node: &str, reason: &str) -> usize {
        self.w()
            .events
            .iter()
            .filter(|e| e.involved.name.as_deref() == Some(node) && e.reason == reason)
            .count()
    }

    /// A node in `zone`, Ready now, booted as `boot`, with its Lease renewed now.
    fn add_node(&self, name: &str, zone: &str, boot: &str) {
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                uid: Some(format!("uid-{name}")),
                labels: Some(BTreeMap::from([(
                    "topology.kubernetes.io/zone".to_owned(),
                    zone.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(vec![]),
                node_info: Some(NodeSystemInfo {
                    boot_id: boot.to_owned(),
                    ..NodeSystemInfo::default()
                }),
                ..NodeStatus::default()
            }),
            ..Node::default()
        };
        self.w().nodes.insert(name.to_owned(), node);
        self.kubelet_ready(name, "True");
        self.renew(name);
    }

    /// The kubelet posts its Ready condition now.
    fn kubelet_ready(&self, name: &str, status: &str) {
        let now = self.wall();
        let mut w = self.w();
        let status_ = w
            .nodes
            .get_mut(name)
            .and_then(|n| n.status.as_mut())
            .expect("node");
        status_.conditions = Some(vec![NodeCondition {
            type_: "Ready".to_owned(),
            status: status.to_owned(),
            last_heartbeat_time: Some(Time(now)),
            last_transition_time: Some(Time(now)),
            ..NodeCondition::default()
        }]);
    }

    fn reboot(&self, name: &str, boot: &str) {
        let mut w = self.w();
        let info = w
            .nodes
            .get_mut(name)
            .and_then(|n| n.status.as_mut())
            .and_then(|s| s.node_info.as_mut())
            .expect("node");
        info.boot_id = boot.to_owned();
    }

    /// The node renews its Lease now (40 s Leases: renewed every 10 s, dead after 30 s).
    fn renew(&self, name: &str) {
        let now = self.wall();
        self.w().leases.insert(
            name.to_owned(),
            Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    renew_time: Some(MicroTime(now)),
                    lease_duration_seconds: Some(40),
                    ..LeaseSpec::default()
                }),
            },
        );
    }

    /// The node's agent renews its liveness Lease now.
    fn renew_agent_lease(&self, name: &str) {
        let now = self.wall();
        let lease = agent_lease_name(name);
        self.w().agent_leases.insert(
            lease.clone(),
            Lease {
                metadata: ObjectMeta {
                    name: Some(lease),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(name.to_owned()),
                    renew_time: Some(MicroTime(now)),
                    ..LeaseSpec::default()
                }),
            },
        );
    }

    /// A pod bound to `node`, owned by `owner_kind`.
    fn add_pod(&self, name: &str, node: &str, owner_kind: &str) {
        self.w().pods.push(Pod {
            metadata: ObjectMeta {
                namespace: Some("apps".to_owned()),
                name: Some(name.to_owned()),
                uid: Some(format!("uid-{name}")),
                owner_references: Some(vec![OwnerReference {
                    kind: owner_kind.to_owned(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.to_owned()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        });
    }

    /// One fence configuration for every node: isolation, then recovery.
    fn configure_fencing(&self) {
        self.configure_fencing_with("isolation=fc-off\nrecovery=fc-on\n");
    }

    /// One fence configuration for every node, with the plan `config` (`config.properties`).
    fn configure_fencing_with(&self, config: &str) {
        let mut w = self.w();
        w.configmaps.insert(
            "fence-config-default".to_owned(),
            BTreeMap::from([("config.properties".to_owned(), config.to_owned())]),
        );
        for m in ["fc-off", "fc-on"] {
            w.configmaps.insert(
                format!("fence-method-{m}"),
                BTreeMap::from([(
                    "method.properties".to_owned(),
                    format!("agent_name=/bin/{m}\n"),
                )]),
            );
        }
    }

    fn stored_op(&self, node: &str) -> Option<FenceOp> {
        self.w()
            .ops
            .get(node)
            .and_then(|o| decode_op(o).expect("a valid record"))
            .map(|s| s.op)
    }
}

impl Clock for Fake {
    fn now(&self) -> Timestamp {
        let ms = u64::try_from(self.millis.load(Ordering::SeqCst)).expect("positive");
        Timestamp::from_duration(Duration::from_millis(ms))
    }

    fn unix_millis(&self) -> i64 {
        UNIX0 + self.millis.load(Ordering::SeqCst)
    }
}

impl ClusterView for Fake {
    fn nodes(&self) -> Vec<Arc<Node>> {
        self.w().nodes.values().cloned().map(Arc::new).collect()
    }

    fn leases(&self) -> Vec<Arc<Lease>> {
        if let Some((_, leases)) = &*self.stalled.lock().expect("stalled") {
            return leases.values().cloned().map(Arc::new).collect();
        }
        self.w().leases.values().cloned().map(Arc::new).collect()
    }

    fn agent_leases(&self) -> Vec<Arc<Lease>> {
        self.w()
            .agent_leases
            .values()
            .cloned()
            .map(Arc::new)
            .collect()
    }

    fn lease_view_age(&self) -> Option<Duration> {
        let since = self.stalled.lock().expect("stalled").as_ref().map(|s| s.0);
        let now = self.millis.load(Ordering::SeqCst);
        Some(Duration::from_millis(
            u64::try_from(since.map_or(0, |s| now - s)).expect("positive"),
        ))
    }

    fn configmaps(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.w().configmaps.clone()
    }

    fn configmap(&self, name: &str) -> Option<BTreeMap<String, String>> {
        self.w().configmaps.get(name).cloned()
    }
}

impl Fake {
    fn conflict(node: &str) -> StoreError {
        StoreError::Conflict {
            name: node_fence_name(node),
        }
    }

    fn write(&self, op: &FenceOp) -> Result<StoredOp, StoreError> {
        let mut w = self.w();
        w.version += 1;
        let version = Some(w.version.to_string());
        let obj = op_object(op, version.clone())?;
        w.ops.insert(op.node.clone(), obj);
        Ok(StoredOp {
            op: op.clone(),
            resource_version: version,
        })
    }
}

impl OpRecords for Fake {
    async fn list_ops(&self) -> Result<Vec<Result<StoredOp, StoreError>>, StoreError> {
        Ok(self
            .w()
            .ops
            .values()
            .filter_map(|o| decode_op(o).transpose())
            .collect())
    }

    async fn get_op(&self, node: &str) -> Result<Option<StoredOp>, StoreError> {
        self.w()
            .ops
            .get(node)
            .map(decode_op)
            .transpose()
            .map(Option::flatten)
    }

    async fn create_op(&self, op: &FenceOp) -> Result<StoredOp, StoreError> {
        if self.w().ops.contains_key(&op.node) {
            return Err(Self::conflict(&op.node));
        }
        self.write(op)
    }

    async fn update_op(&self, stored: &StoredOp, op: &FenceOp) -> Result<StoredOp, StoreError> {
        let current = self
            .w()
            .ops
            .get(&op.node)
            .and_then(|o| o.metadata.resource_version.clone());
        if current.is_none() || current != stored.resource_version {
            return Err(Self::conflict(&op.node));
        }
        self.write(op)
    }

    async fn delete_op(&self, node: &str) -> Result<(), StoreError> {
        self.w().ops.remove(node);
        Ok(())
    }
}

impl Taints for Fake {
    async fn set_out_of_service(&self, node: &str, present: bool) -> Result<(), ApiError> {
        let mut w = self.w();
        if present {
            w.tainted.insert(node.to_owned());
            w.log.push(format!("taint {node}"));
        } else {
            w.tainted.remove(node);
            w.log.push(format!("untaint {node}"));
        }
        Ok(())
    }
}

impl NodePods for Fake {
    async fn node_pods(&self, node: &str) -> Result<Vec<Pod>, ApiError> {
        Ok(self
            .w()
            .pods
            .iter()
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
            .cloned()
            .collect())
    }

    async fn force_delete_pod(&self, pod: &Pod) -> Result<PodDeletion, ApiError> {
        let mut w = self.w();
        let before = w.pods.len();
        w.pods.retain(|p| p.metadata.uid != pod.metadata.uid);
        if w.pods.len() == before {
            return Ok(PodDeletion::Gone);
        }
        let name = pod.metadata.name.clone().unwrap_or_default();
        w.log.push(format!("delete apps/{name}"));
        Ok(PodDeletion::Deleted)
    }

    async fn node_volume_attachments(&self, _node: &str) -> Result<Vec<String>, ApiError> {
        Ok(Vec::new())
    }
}

impl FenceRunner for Fake {
    fn run_step(
        &self,
        node: String,
        step: Step,
        specs: Vec<MethodSpec>,
    ) -> impl Future<Output = Result<(), StepError>> + Send + 'static {
        let agents: Vec<String> = specs.iter().map(|s| s.agent.clone()).collect();
        self.w()
            .log
            .push(format!("run {node} {} {}", step.as_str(), agents.join(",")));
        let mut held = self.held.subscribe();
        let world = self.world.clone();
        async move {
            let _ = held.wait_for(|h| !*h).await;
            let key = format!("{node}/{}", step.as_str());
            if world.lock().expect("world").failing.contains(&key) {
                Err(StepError::Method(format!("{key} failed")))
            } else {
                Ok(())
            }
        }
    }
}

impl Events for Fake {
    async fn record(&self, rec: EventRecord) {
        self.w().events.push(rec);
    }
}

/// A controller on the fake, and the time it lives in.
struct Harness {
    fake: Fake,
    ctl: Controller<Fake>,
    metrics: Arc<RemediateMetrics>,
    api_health: Arc<ApiHealth>,
    /// Nodes that renew their Lease on every pass.
    live: BTreeSet<String>,
    /// Nodes whose agent renews its liveness Lease on every pass.
    agents: BTreeSet<String>,
}

impl Harness {
    fn new(fake: &Fake, cfg: RemediationConfig) -> Self {
        let metrics = Arc::new(RemediateMetrics::new());
        let api_health = Arc::new(ApiHealth::default());
        let ctl = Controller::new(fake.clone(), cfg, metrics.clone(), api_health.clone());
        let live = fake.w().nodes.keys().cloned().collect();
        Self {
            fake: fake.clone(),
            ctl,
            metrics,
            api_health,
            live,
            agents: BTreeSet::new(),
        }
    }

    /// One second passes; the live nodes renew; the leader's pass runs; the fence steps it
    /// started get to run.
    async fn pass(&mut self) {
        self.fake.millis.fetch_add(1000, Ordering::SeqCst);
        for n in &self.live {
            self.fake.renew(n);
        }
        for n in &self.agents {
            self.fake.renew_agent_lease(n);
        }
        self.ctl.tick(true).await;
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    async fn passes(&mut self, n: usize) {
        for _ in 0..n {
            self.pass().await;
        }
    }

    /// Passes until `done` holds (at most `n`); whether it did.
    async fn until(&mut self, n: usize, done: impl Fn(&Fake) -> bool) -> bool {
        for _ in 0..n {
            if done(&self.fake) {
                return true;
            }
            self.pass().await;
        }
        done(&self.fake)
    }

    fn kill(&mut self, node: &str) {
        self.live.remove(node);
    }

    fn revive(&mut self, node: &str) {
        self.live.insert(node.to_owned());
    }

    /// Nodes the last pass judged `state` (`alive`, `suspect`, `dead`).
    fn judged(&self, state: &str) -> i64 {
        self.metrics
            .nodes
            .get_or_create(&crate::metrics::StateLabels {
                state: state.to_owned(),
            })
            .get()
    }

    fn skips(&self, reason: &str) -> u64 {
        self.metrics
            .skips
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .get()
    }
}

/// Three nodes in one zone, fencing configured, a ReplicaSet pod and a DaemonSet pod on `n1`.
fn cluster() -> Fake {
    let fake = Fake::new();
    for n in ["n1", "n2", "n3"] {
        fake.add_node(n, "a", &format!("boot-{n}"));
    }
    fake.configure_fencing();
    fake.add_pod("web-1", "n1", "ReplicaSet");
    fake.add_pod("agent-1", "n1", "DaemonSet");
    fake.add_pod("web-2", "n2", "ReplicaSet");
    fake
}

fn position(log: &[String], prefix: &str) -> usize {
    log.iter()
        .position(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in {log:?}"))
}

/// A node whose Lease goes silent is fenced first; only once the fence step confirmed is it
/// tainted out-of-service and its pods (not its DaemonSet pods) deleted. Nothing else is touched.
#[tokio::test]
async fn a_dead_node_is_fenced_then_tainted_out_of_service() {
    let fake = cluster();
    let mut h = Harness::new(&fake, RemediationConfig::default());
    h.passes(5).await;
    fake.held.send_replace(true);
    h.kill("n1");
    assert!(
        h.until(40, |f| f
            .log()
            .iter()
            .any(|l| l.starts_with("run n1 isolation")))
            .await,
        "the dead node is fenced: {:?}",
        fake.log()
    );
    assert_eq!(fake.log(), ["run n1 isolation /bin/fc-off"]);
    // Held in flight: nothing released, however long it takes.
    h.passes(20).await;
    assert_eq!(fake.log(), ["run n1 isolation /bin/fc-off"]);
    assert!(fake.w().tainted.is_empty());
    assert_eq!(fake.w().pods.len(), 3);
    assert_eq!(fake.events("n1", "FencingStarted"), 1);
    let op = fake
        .stored_op("n1")
        .expect("the operation is recorded before the step runs");
    assert_eq!(op.running, Some(Step::Isolation));

    fake.held.send_replace(false);
    assert!(
        h.until(10, |f| f
            .stored_op("n1")
            .is_some_and(|op| op.phase.label() == "released"))
            .await
    );
    let log = fake.log();
    assert!(position(&log, "run n1 isolation") < position(&log, "taint n1"));
    assert!(position(&log, "taint n1") < position(&log, "delete apps/web-1"));
    assert!(!log.iter().any(|l| l.contains("agent-1")), "{log:?}");
    assert!(
        !log.iter()
            .any(|l| l.contains("n2") || l.contains("n3") || l.contains("web-2"))
    );
    assert_eq!(fake.w().tainted, BTreeSet::from(["n1".to_owned()]));
    for reason in ["FencingConfirmed", "NodeReleased"] {
        assert_eq!(fake.events("n1", reason), 1, "{reason}");
    }
    assert_eq!(fake.events("web-1", "DeletedAfterFencing"), 1);
    assert_eq!(h.metrics.releases.get(), 1);
    assert_eq!(h.metrics.pods_deleted.get(), 1);
}

/// A fence step whose method does not confirm is a failure of the fence runner port, counted
/// by its kind (`method_failed`) and retried; nothing is released while it fails.
#[tokio::test]
async fn a_failing_fence_step_is_counted_by_kind_and_releases_nothing() {
    let fake = cluster();
    fake.world
        .lock()
        .expect("world")
        .failing
        .insert("n1/isolation".to_owned());
    let mut h = Harness::new(&fake, RemediationConfig::default());
    h.passes(5).await;
    h.kill("n1");
    let label = |reason: &'static str| crate::metrics::PortErrorLabels {
        port: crate::metrics::Port::fence_runner,
        reason,
    };
    let failed = |h: &Harness| {
        h.metrics
            .port_errors
            .get_or_create(&label("method_failed"))
            .get()
    };
    for _ in 0..40 {
        if failed(&h) > 0 {
            break;
        }
        h.pass().await;
    }
    assert!(failed(&h) >= 1, "{:?}", fake.log());
    assert_eq!(
        h.metrics.port_errors.get_or_create(&label("config")).get(),
        0,
        "the configuration is usable: the method itself failed"
    );
    assert!(fake.w().tainted.is_empty(), "released after a failed step");
    let text = h.metrics.encode();
    assert!(
        text.contains(
            r#"node_monitor_remediation_port_errors_total{port="fence_runner",reason="method_failed"}"#
        ),
        "{text}"
    );
}

/// Nodes running the agent: a node whose kubelet and agent fall silent together is fenced from
/// the agent's liveness Lease once the kubelet's Lease corroborates (1.2 of its 10 s intervals),
/// long before the kubelet Lease's own 30 s; a node whose agent alone stops is never fenced.
#[tokio::test]
async fn a_silent_node_running_the_agent_is_fenced_from_its_liveness_lease() {
    let fake = cluster();
    let mut h = Harness::new(&fake, RemediationConfig::default());
    h.agents = ["n1", "n2", "n3"].map(str::to_owned).into();
    h.passes(5).await;
    // n1 dies (kubelet and agent); n2's agent alone stops.
    h.kill("n1");
    h.agents.remove("n1");
    h.agents.remove("n2");
    assert!(
        h.until(15, |f| f
            .log()
            .iter()
            .any(|l| l.starts_with("run n1 isolation")))
            .await,
        "fenced before the kubelet Lease's 30 s: {:?}",
        fake.log()
    );
    let op = fake.stored_op("n1").expect("recorded");
    assert!(
        op.evidence.contains("liveness Lease not renewed"),
        "{}",
        op.evidence
    );
    // Long after: n2, whose kubelet renews, is untouched.
    h.passes(60).await;
    assert!(fake.stored_op("n2").is_none());
    assert!(
        !fake.log().iter().any(|l| l.contains("n2")),
        "{:?}",
        fake.log()
    );
    assert_eq!(fake.events("n2", "FencingSkipped"), 0);
}

/// Three of a zone's four nodes die at once (the other zone stays healthy): a partial
/// disruption of a small zone fences nothing; each dead node gets one `FencingSkipped` Event.
#[tokio::test]
async fn a_storm_in_a_zone_fences_nothing() {
    let fake = Fake::new();
    for i in 1..=4 {
        fake.add_node(&format!("a{i}"), "a", "b");
        fake.add_node(&format!("b{i}"), "b", "b");
        fake.add_pod(&format!("web-a{i}"), &format!("a{i}"), "ReplicaSet");
    }
    fake.configure_fencing();
    let mut h = Harness::new(&fake, RemediationConfig::default());
    h.passes(5).await;
    for n in ["a1", "a2", "a3"] {
        h.kill(n);
    }
    h.passes(60).await;
    assert_eq!(fake.log(), Vec::<String>::new());
    assert!(fake.w().tainted.is_empty());
    assert!(fake.w().ops.is_empty());
    assert_eq!(fake.w().pods.len(), 4);
    for n in ["a1", "a2", "a3"] {
        assert_eq!(fake.events(n, "FencingSkipped"), 1, "{n}");
    }
    assert_eq!(fake.events("a4", "FencingSkipped"), 0);
    assert_eq!(h.skips("zone_disruption"), 3);
}

/// Fences `n1` and waits until its workload is released.
async fn released(h: &mut Harness) {
    h.passes(5).await;
    h.kill("n1");
    assert!(
        h.until(60, |f| f
            .stored_op("n1")
            .is_some_and(|op| op.phase.label() == "released"))
            .await,
        "{:?}",
        h.fake.log()
    );
}

/// After a release confirmed by powering the node off, the node's Lease renews but its kubelet
/// stays silent: recovery is held, the taint stays; once the kubelet reports Ready again (no old
/// pod left), recovery runs, then the taint comes off and the operation is forgotten.
#[tokio::test]
async fn recovery_waits_until_the_kubelet_is_ready_not_just_the_lease() {
    let fake = cluster();
    // Powered off (the power management step confirms): only its kubelet can tell.
    fake.configure_fencing_with("power_management=fc-off\nrecovery=fc-on\n");
    let mut h = Harness::new(&fake, RemediationConfig::default());
    released(&mut h).await;
    h.revive("n1");
    h.passes(15).await;
    assert!(fake.events("n1", "NodeBack") >= 1);
    assert!(fake.events("n1", "RecoveryHeld") >= 1);
    assert!(
        !fake.log().iter().any(|l| l.starts_with("run n1 recovery")),
        "{:?}",
        fake.log()
    );
    assert!(fake.w().tainted.contains("n1"));

    fake.kubelet_ready("n1", "True");
    assert!(h.until(10, |f| f.stored_op("n1").is_none()).await);
    let log = fake.log();
    assert!(
        position(&log, "run n1 recovery") < position(&log, "untaint n1"),
        "{log:?}"
    );
    assert!(fake.w().tainted.is_empty());
    assert_eq!(fake.events("n1", "NodeRecovered"), 1);
    assert_eq!(h.metrics.recoveries.get(), 1);
}

/// Without pod deletion, a powered-off node whose kubelet is Ready again still has pods from
/// before the fence bound to it: recovery waits until they are gone.
#[tokio::test]
async fn recovery_waits_until_the_old_pods_are_gone() {
    let fake = cluster();
    // Powered off (the power management step confirms): only its kubelet can tell.
    fake.configure_fencing_with("power_management=fc-off\nrecovery=fc-on\n");
    let cfg = RemediationConfig {
        force_delete_pods: false,
        ..RemediationConfig::default()
    };
    let mut h = Harness::new(&fake, cfg);
    released(&mut h).await;
    h.revive("n1");
    fake.kubelet_ready("n1", "True");
    h.passes(15).await;
    assert!(fake.events("n1", "RecoveryHeld") >= 1);
    assert!(
        !fake.log().iter().any(|l| l.starts_with("run n1 recovery")),
        "{:?}",
        fake.log()
    );
    assert!(fake.w().tainted.contains("n1"));

    fake.w()
        .pods
        .retain(|p| p.metadata.name.as_deref() != Some("web-1"));
    assert!(
        h.until(10, |f| f.stored_op("n1").is_none()).await,
        "{:?}",
        fake.log()
    );
    assert!(fake.log().iter().any(|l| l.starts_with("run n1 recovery")));
    assert!(fake.w().tainted.is_empty());
}

/// After a release confirmed by storage isolation alone, the force-deleted pods are gone from
/// the API whatever still runs on the node: a Ready kubelet with no pod left bound is no proof.
/// Recovery (the storage back) and the taint removal wait for a new bootID.
#[tokio::test]
async fn after_isolation_alone_recovery_waits_for_a_reboot() {
    let fake = cluster();
    let mut h = Harness::new(&fake, RemediationConfig::default());
    released(&mut h).await;
    h.revive("n1");
    fake.kubelet_ready("n1", "True");
    h.passes(15).await;
    assert!(fake.events("n1", "RecoveryHeld") >= 1);
    assert!(
        !fake.log().iter().any(|l| l.starts_with("run n1 recovery")),
        "{:?}",
        fake.log()
    );
    assert!(fake.w().tainted.contains("n1"));
    let op = fake.stored_op("n1").expect("the operation is kept");
    assert!(op.recovery_held, "{op:?}");

    fake.reboot("n1", "boot-n1-2");
    assert!(
        h.until(15, |f| f.stored_op("n1").is_none()).await,
        "{:?}",
        fake.log()
    );
    let log = fake.log();
    assert!(
        position(&log, "run n1 recovery") < position(&log, "untaint n1"),
        "{log:?}"
    );
    assert!(fake.w().tainted.is_empty());
}

/// A node that rebooted (new bootID) ran nothing of before: recovery does not wait for its
/// kubelet or its old pods.
#[tokio::test]
async fn a_rebooted_node_recovers_without_waiting_for_its_kubelet() {
    let fake = cluster();
    let cfg = RemediationConfig {
        force_delete_pods: false,
        ..RemediationConfig::default()
    };
    let mut h = Harness::new(&fake, cfg);
    released(&mut h).await;
    fake.reboot("n1", "boot-n1-2");
    h.revive("n1");
    assert!(
        h.until(15, |f| f.stored_op("n1").is_none()).await,
        "{:?}",
        fake.log()
    );
    assert!(fake.log().iter().any(|l| l.starts_with("run n1 recovery")));
    assert!(fake.w().tainted.is_empty());
    assert_eq!(fake.events("n1", "RecoveryHeld"), 0);
}

/// The controller stops while a fence step is in flight; a new one (a fresh process: no
/// liveness history) reads the operation record back, runs the step again and completes the
/// failover, without waiting a detection window and without fencing twice at once.
#[tokio::test]
async fn a_new_controller_resumes_the_recorded_operation() {
    let fake = cluster();
    let mut h = Harness::new(&fake, RemediationConfig::default());
    h.passes(5).await;
    fake.held.send_replace(true);
    h.kill("n1");
    assert!(
        h.until(40, |f| f
            .stored_op("n1")
            .is_some_and(|op| op.running.is_some()))
            .await
    );
    h.ctl.stand_down();
    let recorded = fake.stored_op("n1").expect("recorded");
    drop(h);

    fake.held.send_replace(false);
    let mut h = Harness::new(&fake, RemediationConfig::default());
    h.kill("n1");
    h.passes(3).await;
    let log = fake.log();
    assert_eq!(
        log.iter()
            .filter(|l| l.starts_with("run n1 isolation"))
            .count(),
        2,
        "{log:?}"
    );
    assert!(position(&log, "taint n1") > 1, "{log:?}");
    assert!(log.contains(&"delete apps/web-1".to_owned()), "{log:?}");
    let now = fake.stored_op("n1").expect("still recorded until recovery");
    assert_eq!(now.detected_at, recorded.detected_at, "the same operation");
    assert_eq!(now.phase.label(), "released");
    assert_eq!(fake.events("n1", "FencingStarted"), 1);
}

/// The Lease watch stalls while every node keeps renewing: the cached Leases stop changing, so
/// they look like dead nodes, but the view is not confirmed current, so no node is judged dead
/// and nothing is fenced, however long the stall. A node that really dies meanwhile is judged on
/// fresh data once the watch catches up, and only then fenced.
#[tokio::test]
async fn a_stalled_lease_watch_judges_no_node_dead() {
    let fake = cluster();
    let cfg = RemediationConfig::default();
    let dead_after = Duration::from_secs(10) * cfg.detection.missed_renewals;
    let mut h = Harness::new(&fake, cfg);
    h.passes(5).await;
    fake.stall_lease_watch();
    // Four times the detection window; the Leases renew in the API all along.
    let stall = 4 * dead_after.as_secs();
    for _ in 0..stall {
        h.pass().await;
        assert_eq!(h.judged("dead"), 0, "judged on a stale view");
    }
    assert_eq!(h.judged("suspect"), 3, "every node looks silent");
    h.kill("n1");
    h.passes(usize::try_from(stall).expect("small")).await;
    assert_eq!(h.judged("dead"), 0);
    assert_eq!(fake.log(), Vec::<String>::new());
    assert!(fake.w().ops.is_empty());
    assert!(fake.w().tainted.is_empty());

    fake.resume_lease_watch();
    h.pass().await;
    assert_eq!(h.judged("dead"), 0, "the caught-up Leases changed: alive");
    assert!(
        h.until(60, |f| f
            .log()
            .iter()
            .any(|l| l.starts_with("run n1 isolation")))
            .await,
        "the dead node is fenced once the view is current: {:?}",
        fake.log()
    );
    assert!(
        !fake
            .log()
            .iter()
            .any(|l| l.contains("n2") || l.contains("n3")),
        "{:?}",
        fake.log()
    );
}

/// The API server goes silent for the controller (no watch event, no answer: a black hole or a
/// partition of the controller itself) while a node's Lease stops: the controller cannot tell a
/// dead node from its own isolation, so it fences nothing; once the API answers again it does.
#[tokio::test]
async fn a_silent_api_server_fences_nothing() {
    let fake = cluster();
    let cfg = RemediationConfig::default();
    let stale_after = cfg.storm.api_stale_after;
    let mut h = Harness::new(&fake, cfg);
    h.passes(5).await;
    h.kill("n1");
    let silent_since = std::time::Instant::now()
        .checked_sub(2 * stale_after)
        .expect("the clock is past the start");
    for _ in 0..60 {
        h.api_health.ok_at(silent_since);
        h.pass().await;
    }
    assert!(h.judged("dead") >= 1, "n1's Lease stopped on a fresh view");
    assert_eq!(fake.log(), Vec::<String>::new());
    assert!(fake.w().ops.is_empty());
    assert!(h.skips("controller_partitioned") >= 1);

    h.api_health.ok();
    assert!(
        h.until(10, |f| f
            .log()
            .iter()
            .any(|l| l.starts_with("run n1 isolation")))
            .await,
        "{:?}",
        fake.log()
    );
}
