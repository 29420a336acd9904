//! The agent cycle against fakes of its ports, in the style of the kubelet's eviction manager
//! tests: a fake node (the summary provider), pods, and a fake cluster that records every write
//! (the `killPodFunc`). Time is tokio's, paused.
use std::{
    cell::{Cell, RefCell},
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    rc::Rc,
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::{Node, Pod};
use node_monitor_core::{
    config::{ConfigSource, EvictionOverrides, load_sources},
    signals::threshold::Threshold,
    signals::{Observations, PodUsage, Signal, SignalObservation},
};
use serde_json::json;

use super::*;
use crate::{
    agent::{
        STOP_RELEASE_BOUND,
        conditions::{CONDITION_HEARTBEAT, HEARTBEAT_JITTER},
        decide_until_stopped,
        ports::{KubepodsSight, StopSignal},
        release_on_stop,
    },
    cluster::actuator::{ActuatorError, FailureKind, NodeConditionUpdate, Release, ReleasePlan},
    metrics::EvictionLabels,
    sampler::{MemoryReading, SamplerError, TimedObservations},
    wakeup::WakeSource,
};

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

/// What the fake node shows: signals, per-pod usage, the pods whose cgroups exist.
#[derive(Default)]
struct NodeState {
    observations: Observations,
    cgroups: BTreeSet<String>,
    /// The passes that read the pods and the eviction requests, in order.
    log: Vec<String>,
    /// A finished per-pod disk measurement in parts, not yet taken.
    disk_detail: Option<HashMap<String, crate::sampler::PodDiskDetail>>,
}

struct FakeNode(Rc<RefCell<NodeState>>);

impl NodeSignals for FakeNode {
    fn observe(&mut self, wakeup: Wakeup, kind: SampleKind) -> TimedObservations<Wakeup> {
        let mut observations = self.0.borrow().observations.clone();
        if kind == SampleKind::Signals {
            // As the sampler's signals pass: the node's signals, no pod read.
            observations.pods.clear();
        } else {
            self.0.borrow_mut().log.push("read pods".into());
        }
        TimedObservations {
            wakeup,
            kind,
            observations,
            sampling: Duration::ZERO,
            since_wakeup: Duration::ZERO,
        }
    }
    fn sample(&mut self, _kind: SampleKind) -> Observations {
        self.0.borrow().observations.clone()
    }
    fn last_node_memory(&self) -> Option<MemoryReading> {
        None
    }
    fn last_kubepods_memory(&self) -> Option<MemoryReading> {
        None
    }
}

impl PodView for FakeNode {
    fn sample_into(&mut self, _kind: SampleKind, out: &mut Observations) {
        out.pods = self.0.borrow().observations.pods.clone();
        self.0.borrow_mut().log.push("read pods".into());
    }
    /// As the sampler: `give_up` asked before each pod; the log says where it stopped.
    fn read_pods_unless(
        &mut self,
        out: &mut Observations,
        give_up: &mut dyn FnMut() -> bool,
    ) -> bool {
        let pods = self.0.borrow().observations.pods.clone();
        for (i, (uid, usage)) in pods.into_iter().enumerate() {
            if give_up() {
                self.0
                    .borrow_mut()
                    .log
                    .push(format!("read pods given up after {i}"));
                return false;
            }
            out.pods.insert(uid, usage);
        }
        self.0.borrow_mut().log.push("read pods".into());
        true
    }
    fn measure_pod_disk_now(&mut self) {}
    fn refresh_pod_cgroups(&mut self) -> Result<(), SamplerError> {
        Ok(())
    }
    fn has_pod_cgroup(&self, uid: &str) -> bool {
        self.0.borrow().cgroups.contains(uid)
    }
    fn kubepods(&self) -> KubepodsSight {
        KubepodsSight {
            driver: "systemd".into(),
            path: "/sys/fs/cgroup/kubepods.slice".into(),
            detection: "Configured".into(),
        }
    }
    fn take_pod_disk_detail(&mut self) -> Option<HashMap<String, crate::sampler::PodDiskDetail>> {
        self.0.borrow_mut().disk_detail.take()
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Write {
    Evict {
        name: String,
        hard: bool,
        signal: String,
    },
    Events {
        name: String,
        outcome: EvictOutcome,
    },
    Conditions(Vec<NodeConditionUpdate>),
    Taint {
        key: String,
        on: bool,
    },
}

/// Records every write; answers evictions from a script (default: accepted), and an accepted
/// eviction kills the pod on the fake node, as the kubelet would.
struct FakeCluster {
    node: Rc<RefCell<NodeState>>,
    writes: RefCell<Vec<Write>>,
    answers: RefCell<HashMap<String, VecDeque<EvictOutcome>>>,
    conditions_fail: RefCell<bool>,
    /// The agent's marks on the node as the API holds them: condition type → (status, reason);
    /// taint keys.
    marks: RefCell<Marks>,
    /// Calls that never answer (a black-holed API server): evictions after this many answered,
    /// taint writes of these keys, the release.
    evictions_before_hang: Cell<Option<usize>>,
    hang_taints: RefCell<BTreeSet<String>>,
    hang_release: Cell<bool>,
    /// An accepted eviction leaves the pod's processes on the node (it is slow to go).
    pods_linger: Cell<bool>,
    /// Calls started and not yet answered or dropped.
    in_flight: Rc<Cell<usize>>,
}

#[derive(Debug, Default, Clone, PartialEq)]
struct Marks {
    conditions: BTreeMap<String, (String, String)>,
    taints: BTreeSet<String>,
}

/// Counts a call in flight until it answers or is dropped.
struct InFlight(Rc<Cell<usize>>);

impl InFlight {
    fn new(count: &Rc<Cell<usize>>) -> Self {
        count.set(count.get() + 1);
        Self(count.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.set(self.0.get() - 1);
    }
}

impl FakeCluster {
    fn answer(&self, pod: &str, outcome: EvictOutcome) {
        self.answers
            .borrow_mut()
            .entry(pod.to_owned())
            .or_default()
            .push_back(outcome);
    }
    fn evicted(&self) -> Vec<String> {
        self.writes
            .borrow()
            .iter()
            .filter_map(|w| match w {
                Write::Evict { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }
    fn condition_writes(&self) -> Vec<Vec<NodeConditionUpdate>> {
        self.writes
            .borrow()
            .iter()
            .filter_map(|w| match w {
                Write::Conditions(c) => Some(c.clone()),
                _ => None,
            })
            .collect()
    }
}

impl ClusterWrites for FakeCluster {
    async fn evict(&self, req: &EvictionRequest) -> EvictOutcome {
        let _call = InFlight::new(&self.in_flight);
        let answered = self.evicted().len();
        self.node
            .borrow_mut()
            .log
            .push(format!("evict {}", req.name));
        self.writes.borrow_mut().push(Write::Evict {
            name: req.name.clone(),
            hard: req.hard,
            signal: req.signal.clone(),
        });
        if self
            .evictions_before_hang
            .get()
            .is_some_and(|n| answered >= n)
        {
            std::future::pending::<()>().await;
        }
        let outcome = self
            .answers
            .borrow_mut()
            .get_mut(&req.name)
            .and_then(VecDeque::pop_front)
            .unwrap_or(EvictOutcome::Evicted);
        if outcome == EvictOutcome::Evicted && !self.pods_linger.get() {
            let mut node = self.node.borrow_mut();
            node.observations.pods.remove(&req.uid);
            node.cgroups.remove(&req.uid);
        }
        outcome
    }
    async fn record_eviction_events(&self, req: &EvictionRequest, outcome: &EvictOutcome) {
        self.writes.borrow_mut().push(Write::Events {
            name: req.name.clone(),
            outcome: outcome.clone(),
        });
    }
    async fn set_conditions(&self, updates: &[NodeConditionUpdate]) -> Result<(), ActuatorError> {
        if *self.conditions_fail.borrow() {
            return Err(ActuatorError::KubeletOwnedCondition(
                "a refused write".into(),
            ));
        }
        self.writes
            .borrow_mut()
            .push(Write::Conditions(updates.to_vec()));
        let mut marks = self.marks.borrow_mut();
        for u in updates {
            let status = if u.status { "True" } else { "False" };
            marks
                .conditions
                .insert(u.type_.clone(), (status.to_owned(), u.reason.clone()));
        }
        Ok(())
    }
    async fn set_taint(
        &self,
        key: &str,
        _value: &str,
        _effect: &str,
        present: bool,
    ) -> Result<bool, ActuatorError> {
        let _call = InFlight::new(&self.in_flight);
        self.writes.borrow_mut().push(Write::Taint {
            key: key.to_owned(),
            on: present,
        });
        if self.hang_taints.borrow().contains(key) {
            std::future::pending::<()>().await;
        }
        let mut marks = self.marks.borrow_mut();
        if present {
            marks.taints.insert(key.to_owned());
        } else {
            marks.taints.remove(key);
        }
        Ok(true)
    }
    async fn pod_present(&self, _ns: &str, _name: &str, uid: &str) -> Result<bool, kube::Error> {
        Ok(self.node.borrow().observations.pods.contains_key(uid))
    }
    /// The product's release plan, on the node as the fake API holds it.
    async fn release(&self, release: Release) -> Result<ReleasePlan, ActuatorError> {
        let _call = InFlight::new(&self.in_flight);
        if self.hang_release.get() {
            std::future::pending::<()>().await;
        }
        let node: Node = {
            let marks = self.marks.borrow();
            serde_json::from_value(json!({
                "metadata": {"name": "node-a"},
                "spec": {"taints": marks.taints.iter()
                    .map(|k| json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>()},
                "status": {"conditions": marks.conditions.iter()
                    .map(|(t, (status, reason))| json!({"type": t, "status": status, "reason": reason}))
                    .collect::<Vec<_>>()},
            }))
            .expect("a node")
        };
        let plan = node_monitor_core::release::release_plan(&node, release);
        let mut marks = self.marks.borrow_mut();
        for t in &plan.remove_taints {
            marks.taints.remove(&t.key);
        }
        for c in &plan.unknown_conditions {
            marks.conditions.insert(
                c.clone(),
                (
                    "Unknown".to_owned(),
                    node_monitor_core::contract::names::STOPPED_REASON.to_owned(),
                ),
            );
        }
        Ok(plan)
    }
}

struct FakePods(Vec<Arc<Pod>>);

impl PodSource for FakePods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.0.clone()
    }
}

/// Counts the re-armings; wakes the loop at the instants given, then never again.
#[derive(Default)]
struct FakeArming(usize, VecDeque<Instant>);

impl super::super::ports::WakeupStream for FakeArming {
    fn pending(&self) -> bool {
        self.1.front().is_some_and(|at| *at <= Instant::now())
    }
    async fn next(&mut self) -> Option<Wakeup> {
        let Some(at) = self.1.front().copied() else {
            return std::future::pending().await;
        };
        tokio::time::sleep_until(at).await;
        self.1.pop_front();
        Some(Wakeup {
            source: WakeSource::Housekeeping,
            at: std::time::Instant::now(),
        })
    }
}

/// SIGTERM at an instant of the paused clock.
struct FakeStop(Instant);

impl StopSignal for FakeStop {
    async fn stopped(&mut self) -> &'static str {
        tokio::time::sleep_until(self.0).await;
        "SIGTERM"
    }
}

impl Arming for FakeArming {
    fn rearm(
        &mut self,
        _thresholds: &[Threshold],
        _node: Option<MemoryReading>,
        _kubepods: Option<MemoryReading>,
    ) {
        self.0 += 1;
    }
}

/// A running pod; `memory` is (request, limit), equal for a Guaranteed pod.
fn pod(name: &str, priority: i32, memory: Option<(&str, &str)>) -> Pod {
    let resources = match memory {
        Some((request, limit)) => json!({
            "requests": {"memory": request, "cpu": "100m"},
            "limits": {"memory": limit, "cpu": "100m"},
        }),
        None => json!({}),
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": {
            "nodeName": "node-a",
            "priority": priority,
            "containers": [{"name": "main", "image": "workload", "resources": resources}],
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [{
                "name": "main", "ready": true, "restartCount": 0, "image": "workload",
                "imageID": "", "state": {"running": {"startedAt": "2020-01-01T00:00:00Z"}},
            }],
        },
    }))
    .expect("a pod")
}

struct Rig {
    agent: Loop<FakeCluster, FakePods>,
    node: FakeNode,
    arming: FakeArming,
    state: Rc<RefCell<NodeState>>,
}

impl Rig {
    /// A node of 10 GiB with `available` bytes of memory available, running `pods` with the
    /// working sets given, all with their cgroups found.
    fn new(config: &str, available: u64, pods: &[(Pod, u64)]) -> Rig {
        let config = load_sources(
            &[ConfigSource {
                name: "test",
                text: config,
            }],
            &EvictionOverrides::default(),
        )
        .expect("config");
        let state = Rc::new(RefCell::new(NodeState::default()));
        {
            let mut s = state.borrow_mut();
            s.observations.signals.insert(
                Signal::MemoryAvailable,
                SignalObservation {
                    available: available as i64,
                    capacity: (10 * GI) as i64,
                },
            );
            for (p, working_set) in pods {
                let uid = p.metadata.uid.clone().expect("uid");
                s.observations.pods.insert(
                    uid.clone(),
                    PodUsage {
                        memory: Some(*working_set),
                        disk: Some(0),
                        processes: Some(1),
                        ..PodUsage::default()
                    },
                );
                s.cgroups.insert(uid);
            }
        }
        let cluster = FakeCluster {
            node: state.clone(),
            writes: RefCell::default(),
            answers: RefCell::default(),
            conditions_fail: RefCell::new(false),
            marks: RefCell::default(),
            evictions_before_hang: Cell::new(None),
            hang_taints: RefCell::default(),
            hang_release: Cell::new(false),
            pods_linger: Cell::new(false),
            in_flight: Rc::default(),
        };
        let agent = Loop::new(
            config,
            Arc::new(Metrics::new()),
            cluster,
            FakePods(pods.iter().map(|(p, _)| Arc::new(p.clone())).collect()),
            Arc::new(Health::default()),
            None,
        );
        Rig {
            agent,
            node: FakeNode(state.clone()),
            arming: FakeArming::default(),
            state,
        }
    }

    async fn cycle(&mut self) -> CycleEnd {
        self.report().await.end
    }

    /// One housekeeping pass, then the pod figures' refresh it asked for, as the loop makes it
    /// before its next wait (no wake-up pending unless the rig's arming has one due); the pass's
    /// report.
    async fn report(&mut self) -> CycleReport {
        let wakeup = Wakeup {
            source: WakeSource::Housekeeping,
            at: std::time::Instant::now(),
        };
        let report = self
            .agent
            .cycle(&mut self.node, &mut self.arming, wakeup, "timer")
            .await;
        self.agent.refresh_pods_beside(&mut self.node, &self.arming);
        report
    }

    /// Runs the agent's loop (a first housekeeping pass, then its wake-ups and timers) with
    /// wake-ups at `wakes` and SIGTERM at `stop`, offsets from now on the paused clock, as
    /// `node-monitor run` does; returns how long it ran on that clock.
    async fn run_until_stopped(&mut self, wakes: &[Duration], stop: Duration) -> Duration {
        let start = Instant::now();
        self.arming.1 = wakes.iter().map(|d| start + *d).collect();
        let mut sigterm = FakeStop(start + stop);
        let first = Wakeup {
            source: WakeSource::Housekeeping,
            at: std::time::Instant::now(),
        };
        tokio::time::timeout(
            Duration::from_secs(3600),
            decide_until_stopped(
                &mut self.agent,
                &mut self.node,
                &mut self.arming,
                first,
                &mut sigterm,
            ),
        )
        .await
        .expect("the loop stops on SIGTERM, whatever call or wait is in flight");
        start.elapsed()
    }

    fn marks(&self) -> Marks {
        self.cluster().marks.borrow().clone()
    }

    fn cluster(&self) -> &FakeCluster {
        &self.agent.actuator
    }

    fn set_available(&self, available: u64) {
        if let Some(o) = self
            .state
            .borrow_mut()
            .observations
            .signals
            .get_mut(&Signal::MemoryAvailable)
        {
            o.available = available as i64;
        }
    }
}

const HARD_1GI: &str = "evictionHard:\n  memory.available: 1Gi\n";

fn three_pods() -> Vec<(Pod, u64)> {
    vec![
        (pod("besteffort", 0, None), 2 * GI),
        (pod("burstable", 0, Some(("256Mi", "4Gi"))), GI),
        (pod("guaranteed", 0, Some(("1Gi", "1Gi"))), 900 * MI),
    ]
}

/// A cycle returns one report of what it saw, decided and did: the recorders' only input.
#[tokio::test(start_paused = true)]
async fn the_cycle_reports_what_it_observed_decided_and_sent() {
    let mut rig = Rig::new(HARD_1GI, 500 * MI, &three_pods());
    let report = rig.report().await;
    assert_eq!(report.end, CycleEnd::Done);
    assert_eq!(report.pods.len(), 3);
    assert_eq!(
        report.observations.signals[&Signal::MemoryAvailable].available,
        500 * MI as i64
    );
    let evicted: Vec<&str> = report
        .decision
        .evict
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(evicted, ["besteffort"]);
    let answered: Vec<(&str, &EvictOutcome)> = report
        .answered
        .iter()
        .map(|(req, outcome)| (req.name.as_str(), outcome))
        .collect();
    assert_eq!(answered, [("besteffort", &EvictOutcome::Evicted)]);
    // The ranking read the pods in this pass: the report holds their figures, age 0.
    let (age, figures) = report.figures_by_age().expect("pod figures");
    assert_eq!(age, 0);
    assert_eq!(figures.len(), 3);
    // Calm, the next pass decides nothing, sends nothing, and reads no pod.
    rig.set_available(4 * GI);
    let calm = rig.report().await;
    assert!(calm.decision.evict.is_empty() && calm.answered.is_empty());
}

#[tokio::test(start_paused = true)]
async fn memory_pressure_evicts_the_besteffort_pod_and_publishes_the_condition() {
    let mut rig = Rig::new(HARD_1GI, 500 * MI, &three_pods());
    assert_eq!(rig.cycle().await, CycleEnd::Done);

    let writes = rig.cluster().writes.borrow().clone();
    assert_eq!(
        writes[0],
        Write::Evict {
            name: "besteffort".into(),
            hard: true,
            signal: "memory.available".into()
        },
        "the eviction goes first: {writes:?}"
    );
    assert_eq!(rig.cluster().evicted(), ["besteffort"], "{writes:?}");
    let conditions = &rig.cluster().condition_writes()[0];
    let memory = conditions
        .iter()
        .find(|c| c.type_ == "NodeMonitorMemoryPressure")
        .expect("memory condition");
    assert!(memory.status);
    assert_eq!(memory.reason, "NodeMonitorHasMemoryPressure");
    assert!(
        writes.contains(&Write::Events {
            name: "besteffort".into(),
            outcome: EvictOutcome::Evicted
        }),
        "{writes:?}"
    );
    // No taint unless asked for.
    assert!(!writes.iter().any(|w| matches!(w, Write::Taint { .. })));
    assert_eq!(
        rig.arming.0, 1,
        "the memcg thresholds are re-armed every pass"
    );
}

#[tokio::test(start_paused = true)]
async fn a_pdb_refusal_backs_the_pod_off_and_the_next_candidate_goes_next() {
    let mut rig = Rig::new(HARD_1GI, 500 * MI, &three_pods());
    rig.cluster().answer("besteffort", EvictOutcome::PdbBlocked);
    assert_eq!(
        rig.cycle().await,
        CycleEnd::Refused,
        "a refusal asks for the next candidate at once"
    );
    assert_eq!(rig.cycle().await, CycleEnd::Done);
    assert_eq!(rig.cluster().evicted(), ["besteffort", "burstable"]);
    assert_eq!(
        rig.agent
            .metrics
            .eviction
            .evictions
            .get_or_create(&EvictionLabels {
                eviction_signal: "memory.available".into(),
                threshold: "hard".into(),
                outcome: "pdb_blocked".into(),
            })
            .get(),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn a_throttled_eviction_holds_every_eviction_until_retry_after() {
    let mut rig = Rig::new(HARD_1GI, 500 * MI, &three_pods());
    rig.cluster().answer(
        "besteffort",
        EvictOutcome::Throttled {
            retry_after: Duration::from_secs(10),
        },
    );
    rig.cycle().await;
    rig.cycle().await;
    assert_eq!(
        rig.cluster().evicted(),
        ["besteffort"],
        "nothing is sent while the API server asked to wait"
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    rig.cycle().await;
    assert_eq!(rig.cluster().evicted(), ["besteffort", "besteffort"]);
}

#[tokio::test(start_paused = true)]
async fn an_unavailable_api_server_is_counted_and_retried_soon() {
    let mut rig = Rig::new(HARD_1GI, 500 * MI, &three_pods());
    for _ in 0..2 {
        rig.cluster().answer(
            "besteffort",
            EvictOutcome::Failed {
                code: Some(503),
                kind: FailureKind::Unavailable,
                reason: "unavailable".into(),
            },
        );
    }
    rig.cycle().await;
    assert_eq!(
        rig.cluster().evicted(),
        ["besteffort"],
        "the rest of the decision would fail the same way"
    );
    let retry_at = rig
        .agent
        .evictions_held_until
        .expect("a retry is scheduled");
    assert!(retry_at <= rig.agent.now() + RETRY_INITIAL, "{retry_at:?}");
    assert_eq!(
        rig.agent
            .metrics
            .api_errors
            .get_or_create(&crate::metrics::OperationLabels {
                operation: crate::metrics::ApiOperation::evict
            })
            .get(),
        1
    );
    // Nothing is sent again before the retry delay, whatever wakes the agent meanwhile.
    rig.cycle().await;
    assert_eq!(
        rig.cluster().evicted(),
        ["besteffort"],
        "no request before the retry delay"
    );
    // The outage is no pod's fault: the same pod is asked again, and again once the server is
    // back, never the next candidate.
    for _ in 0..2 {
        tokio::time::advance(RETRY_MAX).await;
        rig.cycle().await;
    }
    assert_eq!(
        rig.cluster().evicted(),
        ["besteffort", "besteffort", "besteffort"],
        "the ranking holds through the outage"
    );
}

#[tokio::test(start_paused = true)]
async fn blind_to_the_pods_cgroups_it_holds_evictions_and_is_not_ready() {
    let mut rig = Rig::new(HARD_1GI, 500 * MI, &three_pods());
    rig.state.borrow_mut().cgroups.clear();
    rig.cycle().await;
    assert!(
        rig.cluster().evicted().is_empty(),
        "no eviction ranked without usage"
    );
    assert_eq!(rig.agent.metrics.pods.cgroups_missing.get(), 1);
    let (ready, why) = rig.agent.health.readiness();
    assert!(!ready, "{why}");
    assert!(why.contains("no cgroup found"), "{why}");
    // The conditions are still published: the pressure is real.
    assert!(
        rig.cluster().condition_writes()[0]
            .iter()
            .any(|c| c.type_ == "NodeMonitorMemoryPressure" && c.status)
    );
}

#[tokio::test(start_paused = true)]
async fn conditions_are_written_on_a_change_and_as_a_heartbeat() {
    let mut rig = Rig::new(HARD_1GI, 5 * GI, &three_pods());
    rig.cycle().await;
    rig.cycle().await;
    assert_eq!(
        rig.cluster().condition_writes().len(),
        1,
        "unchanged conditions are not written again within the heartbeat"
    );
    rig.set_available(500 * MI);
    rig.cycle().await;
    assert_eq!(
        rig.cluster().condition_writes().len(),
        2,
        "a change is written at once"
    );
    // Not before the heartbeat's shortest draw; at the latest after its longest.
    tokio::time::advance(CONDITION_HEARTBEAT - Duration::from_secs(1)).await;
    rig.cycle().await;
    assert_eq!(
        rig.cluster().condition_writes().len(),
        2,
        "no heartbeat yet"
    );
    tokio::time::advance(CONDITION_HEARTBEAT.mul_f64(HEARTBEAT_JITTER) + Duration::from_secs(2))
        .await;
    rig.cycle().await;
    assert_eq!(rig.cluster().condition_writes().len(), 3, "the heartbeat");
}

#[tokio::test(start_paused = true)]
async fn a_failed_condition_write_is_counted_and_tried_again_after_a_growing_wait() {
    use super::super::conditions::retry_delay;
    let mut rig = Rig::new(HARD_1GI, 5 * GI, &three_pods());
    let failed = |rig: &Rig| {
        rig.agent
            .metrics
            .api_errors
            .get_or_create(&crate::metrics::OperationLabels {
                operation: crate::metrics::ApiOperation::patch_conditions,
            })
            .get()
    };
    *rig.cluster().conditions_fail.borrow_mut() = true;
    rig.cycle().await;
    assert_eq!(failed(&rig), 1);
    // Cycles within the wait do not call the API again.
    for _ in 0..5 {
        tokio::time::advance(Duration::from_millis(100)).await;
        rig.cycle().await;
    }
    assert_eq!(failed(&rig), 1, "no call within the first wait");
    tokio::time::advance(retry_delay(1)).await;
    rig.cycle().await;
    assert_eq!(failed(&rig), 2, "tried again after the first wait");
    tokio::time::advance(retry_delay(1)).await;
    rig.cycle().await;
    assert_eq!(failed(&rig), 2, "the second wait is longer");
    *rig.cluster().conditions_fail.borrow_mut() = false;
    tokio::time::advance(retry_delay(2)).await;
    rig.cycle().await;
    assert_eq!(
        rig.cluster().condition_writes().len(),
        1,
        "written once the API answers"
    );
    assert_eq!(failed(&rig), 2);
}

#[tokio::test(start_paused = true)]
async fn taint_on_pressure_puts_the_pressure_taints_on_and_off() {
    let config = format!("{HARD_1GI}nodeMonitor:\n  taintOnPressure: true\n");
    let mut rig = Rig::new(&config, 500 * MI, &three_pods());
    rig.cycle().await;
    let taints: Vec<Write> = rig
        .cluster()
        .writes
        .borrow()
        .iter()
        .filter(|w| matches!(w, Write::Taint { .. }))
        .cloned()
        .collect();
    assert_eq!(
        taints,
        [
            Write::Taint {
                key: "node-monitor.io/memory-pressure".into(),
                on: true
            },
            Write::Taint {
                key: "node-monitor.io/disk-pressure".into(),
                on: false
            },
            Write::Taint {
                key: "node-monitor.io/pid-pressure".into(),
                on: false
            },
        ]
    );
}

const TAINT_1GI: &str =
    "evictionHard:\n  memory.available: 1Gi\nnodeMonitor:\n  taintOnPressure: true\n";
const MEMORY_CONDITION: &str = "NodeMonitorMemoryPressure";
const MEMORY_TAINT: &str = "node-monitor.io/memory-pressure";

/// After the release on stop: no pressure taint, every published condition `Unknown` with the
/// stop's reason.
fn assert_released(marks: &Marks) {
    assert!(marks.taints.is_empty(), "{marks:?}");
    assert!(!marks.conditions.is_empty(), "{marks:?}");
    for (c, (status, reason)) in &marks.conditions {
        assert_eq!(
            (status.as_str(), reason.as_str()),
            (
                "Unknown",
                node_monitor_core::contract::names::STOPPED_REASON
            ),
            "{c}: {marks:?}"
        );
    }
}

/// SIGTERM while an eviction request hangs (a black-holed API server, before the call's own
/// timeout): the loop stops at that instant, drops the call, and the release on stop takes back
/// the condition and taint the earlier pass published.
#[tokio::test(start_paused = true)]
async fn sigterm_while_an_eviction_hangs_stops_at_once_and_takes_the_marks_back() {
    let mut rig = Rig::new(TAINT_1GI, 500 * MI, &three_pods());
    rig.cluster().evictions_before_hang.set(Some(1));
    let ran = rig
        .run_until_stopped(&[Duration::from_secs(1)], Duration::from_secs(5))
        .await;
    assert_eq!(ran, Duration::from_secs(5), "stopped at SIGTERM");
    assert_eq!(
        rig.cluster().evicted().len(),
        2,
        "the second pass's eviction was in flight: {:?}",
        rig.cluster().writes.borrow()
    );
    assert_eq!(rig.cluster().in_flight.get(), 0, "the hung call is dropped");
    let marks = rig.marks();
    assert_eq!(
        marks.conditions.get(MEMORY_CONDITION).map(|c| c.0.as_str()),
        Some("True"),
        "{marks:?}"
    );
    assert!(marks.taints.contains(MEMORY_TAINT), "{marks:?}");

    assert!(release_on_stop(&rig.agent.actuator, false, STOP_RELEASE_BOUND).await);
    assert_released(&rig.marks());
}

/// SIGTERM while the loop waits for an evicted pod to go (it lingers): the wait ends at once,
/// not at `podCleanupTimeout`.
#[tokio::test(start_paused = true)]
async fn sigterm_during_the_cleanup_wait_stops_before_the_cleanup_timeout() {
    let mut rig = Rig::new(TAINT_1GI, 500 * MI, &three_pods());
    rig.cluster().pods_linger.set(true);
    let cleanup = rig.agent.config.node_monitor.pod_cleanup_timeout;
    let stop = Duration::from_secs(3);
    assert!(stop < cleanup, "{cleanup:?}");
    let ran = rig.run_until_stopped(&[], stop).await;
    assert_eq!(ran, stop, "stopped at SIGTERM, not after {cleanup:?}");
    assert_eq!(rig.cluster().evicted(), ["besteffort"]);
    assert_eq!(rig.cluster().in_flight.get(), 0);
    assert!(rig.marks().taints.contains(MEMORY_TAINT));

    assert!(release_on_stop(&rig.agent.actuator, false, STOP_RELEASE_BOUND).await);
    assert_released(&rig.marks());
}

/// SIGTERM between two taint writes of one pass (the second hangs): the node holds a half
/// published set of marks, which the release on stop, planned on the node as the API holds it,
/// takes back whole.
#[tokio::test(start_paused = true)]
async fn sigterm_between_taint_writes_leaves_no_taint_after_the_release() {
    let mut rig = Rig::new(TAINT_1GI, 500 * MI, &three_pods());
    rig.cluster()
        .hang_taints
        .borrow_mut()
        .insert("node-monitor.io/disk-pressure".into());
    let ran = rig.run_until_stopped(&[], Duration::from_secs(2)).await;
    assert_eq!(ran, Duration::from_secs(2));
    assert_eq!(rig.cluster().in_flight.get(), 0);
    let half = rig.marks();
    assert!(
        half.taints.contains(MEMORY_TAINT),
        "half published: {half:?}"
    );

    assert!(release_on_stop(&rig.agent.actuator, false, STOP_RELEASE_BOUND).await);
    assert_released(&rig.marks());
}

/// The release on stop against an API server that never answers ends at its bound and says it
/// did not reach the API; the marks stay (for the next start or `node-monitor cleanup`).
#[tokio::test(start_paused = true)]
async fn the_release_on_stop_ends_at_its_bound_when_the_api_hangs() {
    let mut rig = Rig::new(TAINT_1GI, 500 * MI, &three_pods());
    rig.run_until_stopped(&[], Duration::from_secs(1)).await;
    rig.cluster().hang_release.set(true);
    let start = Instant::now();
    assert!(!release_on_stop(&rig.agent.actuator, false, STOP_RELEASE_BOUND).await);
    assert_eq!(start.elapsed(), STOP_RELEASE_BOUND);
    assert_eq!(rig.cluster().in_flight.get(), 0);
    assert!(rig.marks().taints.contains(MEMORY_TAINT));
}

/// The kubelet reclaims dead containers before it ranks pods for disk: a pod evicted for
/// `nodefs.available` keeps its writable layer on disk until the kubelet's container garbage
/// collection, and no bystander is evicted for that space meanwhile.
#[tokio::test(start_paused = true)]
async fn an_evicted_pods_disk_is_not_blamed_on_a_bystander_until_the_kubelet_collects_it() {
    let pods = [
        (pod("filler", 0, None), 10 * MI),
        (pod("bystander", 0, None), 10 * MI),
    ];
    let mut rig = Rig::new("evictionHard:\n  nodefs.available: 1Gi\n", 8 * GI, &pods);
    let set_nodefs = |rig: &Rig, available: u64| {
        rig.state.borrow_mut().observations.signals.insert(
            Signal::NodeFsAvailable,
            SignalObservation {
                available: available as i64,
                capacity: (10 * GI) as i64,
            },
        );
    };
    {
        let mut s = rig.state.borrow_mut();
        for (uid, disk) in [("uid-filler", 2 * GI), ("uid-bystander", 100 * MI)] {
            s.observations.pods.get_mut(uid).expect("pod").disk = Some(disk);
        }
    }
    set_nodefs(&rig, 500 * MI);
    rig.cycle().await;
    assert_eq!(rig.cluster().evicted(), ["filler"]);
    assert_eq!(
        rig.agent.metrics.eviction.disk_reclaim_pending_bytes.get(),
        0
    );

    // The filler is gone from the API and its processes too, but not its layer: the disk is as
    // low as before.
    rig.agent
        .store
        .0
        .retain(|p| p.metadata.name.as_deref() != Some("filler"));
    tokio::time::advance(Duration::from_secs(10)).await;
    rig.cycle().await;
    assert_eq!(
        rig.cluster().evicted(),
        ["filler"],
        "the bystander is not evicted for the filler's uncollected layer"
    );
    assert_eq!(
        rig.agent.metrics.eviction.disk_reclaim_pending_bytes.get(),
        (2 * GI) as i64
    );

    // Half collected: still nothing to evict.
    set_nodefs(&rig, 1_500 * MI);
    tokio::time::advance(Duration::from_secs(10)).await;
    rig.cycle().await;
    assert_eq!(rig.cluster().evicted(), ["filler"]);

    // Past the window, the disk is taken as it is: still short, so the next pod goes.
    set_nodefs(&rig, 500 * MI);
    tokio::time::advance(Duration::from_secs(90)).await;
    rig.cycle().await;
    assert_eq!(rig.cluster().evicted(), ["filler", "bystander"]);
}

/// Each signal's amounts go to the families of its unit: bytes, inodes and PIDs never share a
/// family, and the thresholds follow their signal.
#[tokio::test(start_paused = true)]
async fn signal_amounts_are_exported_in_one_family_per_unit() {
    let config = "evictionHard:\n  memory.available: 1Gi\n  nodefs.inodesFree: 5%\n  pid.available: \"1000\"\n";
    let mut rig = Rig::new(config, 5 * GI, &three_pods());
    {
        let mut s = rig.state.borrow_mut();
        s.observations.signals.insert(
            Signal::NodeFsInodesFree,
            SignalObservation {
                available: 900_000,
                capacity: 1_000_000,
            },
        );
        s.observations.signals.insert(
            Signal::PidAvailable,
            SignalObservation {
                available: 30_000,
                capacity: 32_768,
            },
        );
    }
    assert_eq!(rig.cycle().await, CycleEnd::Done);
    let text = rig.agent.metrics.encode();
    for want in [
        format!("node_monitor_signal_available_bytes{{eviction_signal=\"memory.available\"}} {}", 5 * GI),
        format!("node_monitor_signal_capacity_bytes{{eviction_signal=\"memory.available\"}} {}", 10 * GI),
        "node_monitor_signal_available_inodes{eviction_signal=\"nodefs.inodesFree\"} 900000".to_owned(),
        "node_monitor_signal_capacity_inodes{eviction_signal=\"nodefs.inodesFree\"} 1000000".to_owned(),
        "node_monitor_signal_available_pids{eviction_signal=\"pid.available\"} 30000".to_owned(),
        "node_monitor_signal_capacity_pids{eviction_signal=\"pid.available\"} 32768".to_owned(),
        format!("node_monitor_eviction_threshold_bytes{{eviction_signal=\"memory.available\",kind=\"hard\"}} {GI}"),
        "node_monitor_eviction_threshold_inodes{eviction_signal=\"nodefs.inodesFree\",kind=\"hard\"} 50000".to_owned(),
        "node_monitor_eviction_threshold_pids{eviction_signal=\"pid.available\",kind=\"hard\"} 1000".to_owned(),
    ] {
        assert!(text.contains(&want), "{want} missing from:\n{text}");
    }
    // No signal shows in another unit's family.
    for line in text.lines().filter(|l| l.starts_with("node_monitor_")) {
        let memory = line.contains("\"memory.available\"");
        let inodes = line.contains("\"nodefs.inodesFree\"");
        let pids = line.contains("\"pid.available\"");
        if line.contains("_bytes{") {
            assert!(!inodes && !pids, "{line}");
        }
        if line.contains("_inodes{") {
            assert!(!memory && !pids, "{line}");
        }
        if line.contains("_pids{") {
            assert!(!memory && !inodes, "{line}");
        }
    }
}

/// The rig with adaptive sampling on, at its defaults (a look every 100 ms near a threshold).
fn with_headroom(mut rig: Rig) -> Rig {
    rig.agent.headroom_policy = Some(HeadroomPolicy {
        fast: Duration::from_millis(100),
        slow: Duration::from_secs(10),
        lead: None,
    });
    rig
}

fn take_log(rig: &Rig) -> Vec<String> {
    std::mem::take(&mut rig.state.borrow_mut().log)
}

#[tokio::test(start_paused = true)]
async fn near_a_threshold_the_crossing_ranks_from_the_last_looks_pod_figures_and_reads_after() {
    // 1.05 GiB available against a 1 GiB threshold: within the near band.
    let mut rig = with_headroom(Rig::new(HARD_1GI, GI + 50 * MI, &three_pods()));
    rig.cycle().await;
    assert_eq!(
        take_log(&rig),
        ["read pods"],
        "the look that finds a threshold near reads the pods after its decision"
    );
    tokio::time::advance(Duration::from_millis(100)).await;
    rig.cycle().await;
    assert_eq!(
        take_log(&rig),
        Vec::<String>::new(),
        "at most one read per 250 ms"
    );
    tokio::time::advance(Duration::from_millis(200)).await;
    rig.cycle().await;
    assert_eq!(take_log(&rig), ["read pods"], "300 ms later: read again");
    // The crossing, 200 ms later: ranked from the figures of 200 ms ago, read again after.
    tokio::time::advance(Duration::from_millis(200)).await;
    rig.set_available(500 * MI);
    rig.cycle().await;
    assert_eq!(
        take_log(&rig),
        ["evict besteffort", "read pods"],
        "the eviction request goes before any pod read"
    );
    let metrics = rig.agent.metrics.encode();
    assert!(
        metrics.contains("node_monitor_rank_pod_figures_age_seconds_count 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("node_monitor_rank_pod_figures_age_seconds_bucket{le=\"0.256\"} 1")
            && metrics.contains("node_monitor_rank_pod_figures_age_seconds_bucket{le=\"0.128\"} 0"),
        "the figures were 200 ms old: {metrics}"
    );
}

/// The refresh of the pod figures near a threshold runs beside the decisions and gives way to a
/// wake-up that arrives meanwhile: the crossing that wake-up brings ranks from the figures of
/// the last complete refresh, with no pod read before its request, and the figures stay as
/// they were until a refresh completes.
#[tokio::test(start_paused = true)]
async fn a_wake_up_interrupts_the_pod_figures_refresh_and_the_crossing_waits_for_no_read() {
    let mut rig = with_headroom(Rig::new(HARD_1GI, GI + 50 * MI, &three_pods()));
    rig.cycle().await;
    assert_eq!(
        take_log(&rig),
        ["read pods"],
        "the first near look's refresh completes"
    );
    let first = rig.agent.pod_figures.as_ref().map(|(t, _)| *t);
    // 300 ms later a refresh is due, and a wake-up is already queued when it starts.
    tokio::time::advance(Duration::from_millis(300)).await;
    rig.arming.1.push_back(Instant::now());
    rig.cycle().await;
    assert_eq!(
        take_log(&rig),
        ["read pods given up after 0"],
        "the refresh gives way at once"
    );
    assert_eq!(
        rig.agent.pod_figures.as_ref().map(|(t, _)| *t),
        first,
        "a refresh given up keeps the last complete figures"
    );
    assert!(
        rig.agent
            .metrics
            .encode()
            .contains("node_monitor_pod_figures_refreshes_given_up_total 1"),
        "counted"
    );
    // The crossing the wake-up brings: ranked from the 300 ms old figures, no read before.
    rig.arming.1.clear();
    rig.set_available(500 * MI);
    rig.cycle().await;
    assert_eq!(take_log(&rig), ["evict besteffort", "read pods"]);
}

#[tokio::test(start_paused = true)]
async fn pod_figures_older_than_a_second_are_read_again_before_ranking() {
    let mut rig = with_headroom(Rig::new(HARD_1GI, GI + 50 * MI, &three_pods()));
    rig.cycle().await;
    assert_eq!(take_log(&rig), ["read pods"]);
    tokio::time::advance(Duration::from_millis(1_001)).await;
    rig.set_available(500 * MI);
    rig.cycle().await;
    assert_eq!(take_log(&rig), ["read pods", "evict besteffort"]);
}

#[tokio::test(start_paused = true)]
async fn far_from_every_threshold_no_look_reads_the_pods() {
    // 8 GiB available against 1 GiB: the next look is the housekeeping tick's.
    let mut rig = with_headroom(Rig::new(HARD_1GI, 8 * GI, &three_pods()));
    for _ in 0..5 {
        rig.cycle().await;
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert_eq!(take_log(&rig), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn earlier_figures_that_miss_a_pod_to_rank_are_read_again_before_ranking() {
    let mut rig = with_headroom(Rig::new(HARD_1GI, GI + 50 * MI, &three_pods()));
    // The pods' cgroups appear only after the near look: its figures hold none of them.
    let pods = std::mem::take(&mut rig.state.borrow_mut().observations.pods);
    rig.cycle().await;
    assert_eq!(take_log(&rig), ["read pods"]);
    rig.state.borrow_mut().observations.pods = pods;
    tokio::time::advance(Duration::from_millis(100)).await;
    rig.set_available(500 * MI);
    rig.cycle().await;
    assert_eq!(
        take_log(&rig),
        ["read pods", "evict besteffort"],
        "a pod without a figure would rank first, as the kubelet ranks a pod without stats"
    );
}

/// The agent derives the `containerfs.*` thresholds from the layout the sampler found, as the
/// kubelet does (`UpdateContainerFsThresholds`): with writable layers on a filesystem of their
/// own, a full containerfs evicts under the nodefs thresholds, ranked by the whole pod (the
/// kubelet's nodefs ranking in that layout), while nodefs itself is fine.
#[tokio::test(start_paused = true)]
async fn a_split_container_filesystem_gets_the_nodefs_thresholds() {
    let config = "evictionHard:\n  nodefs.available: 1Gi\n";
    let pods = [(pod("small", 0, None), MI), (pod("layer", 0, None), MI)];
    let mut rig = Rig::new(config, 5 * GI, &pods);
    {
        let mut s = rig.state.borrow_mut();
        let fs = |available: u64| SignalObservation {
            available: available as i64,
            capacity: (100 * GI) as i64,
        };
        s.observations
            .signals
            .insert(Signal::NodeFsAvailable, fs(50 * GI));
        s.observations
            .signals
            .insert(Signal::ImageFsAvailable, fs(50 * GI));
        s.observations
            .signals
            .insert(Signal::ContainerFsAvailable, fs(500 * MI));
        s.observations.filesystem = FsLayout {
            dedicated_image_fs: true,
            split_container_image_fs: true,
        };
        for (name, disk, layers) in [("small", 10 * MI, 0), ("layer", 3 * GI, 3 * GI)] {
            if let Some(u) = s.observations.pods.get_mut(&format!("uid-{name}")) {
                u.disk = Some(disk);
                u.writable_layers = Some(layers);
            }
        }
    }
    assert_eq!(rig.cycle().await, CycleEnd::Done);
    assert_eq!(rig.cluster().evicted(), ["layer"]);
    assert!(
        rig.agent
            .config
            .thresholds
            .iter()
            .any(|t| t.signal == Signal::ContainerFsAvailable
                && t.derived_from == Some(Signal::NodeFsAvailable)),
        "{:?}",
        rig.agent.config.thresholds
    );
}

use super::PushArm;
use node_monitor_core::arming::mem_push::{FLOOR_PAGES, PushPolicy};

/// Records every batch the loop writes to the memory push, and every attach (`true`) and
/// detach it asks for.
#[derive(Clone, Default)]
struct FakePush(
    Arc<std::sync::Mutex<Vec<u64>>>,
    Arc<std::sync::Mutex<Vec<bool>>>,
);

impl PushArm for FakePush {
    fn arm(&self, pages: u64) -> Result<(), crate::ebpf::ProbeError> {
        self.0.lock().expect("not poisoned").push(pages);
        Ok(())
    }

    fn set_attached(&self, attached: bool) {
        self.1.lock().expect("not poisoned").push(attached);
    }
}

#[tokio::test(start_paused = true)]
async fn the_memory_push_is_armed_near_a_memory_threshold_and_disarmed_far_from_it() {
    let push = FakePush::default();
    let mut rig = Rig::new(HARD_1GI, 8 * GI, &three_pods());
    rig.agent = rig
        .agent
        .with_mem_push(Box::new(push.clone()), PushPolicy::new(4096, 2));
    // Far: disarmed, written once.
    rig.cycle().await;
    rig.cycle().await;
    // Near (50 MiB above 1 GiB): a quarter of 50 MiB over 2 CPUs, 1600 pages; unchanged, not
    // written again.
    rig.set_available(GI + 50 * MI);
    rig.cycle().await;
    rig.cycle().await;
    // Closer: the floor.
    rig.set_available(GI + MI);
    rig.cycle().await;
    // Far again: disarmed.
    rig.set_available(8 * GI);
    rig.cycle().await;
    assert_eq!(
        *push.0.lock().expect("not poisoned"),
        [0, 1600, FLOOR_PAGES, 0]
    );
}

/// On a calm node no pass reads the pods, so a flight record of an OOM kill in a pod's own limit
/// had no pod figures; the pass the kill wakes reads them, and the record shows the pods'
/// working sets, the killed pod among them.
#[tokio::test(start_paused = true)]
async fn an_oom_kill_wake_up_reads_the_pods_for_its_flight_record() {
    use node_monitor_core::flight::{EventKind, FlightEvent};
    let mut rig = with_headroom(Rig::new(HARD_1GI, 8 * GI, &three_pods()));
    rig.cycle().await;
    assert_eq!(take_log(&rig), Vec::<String>::new(), "calm: no pod read");
    let wakeup = Wakeup {
        source: WakeSource::Kernel(crate::wakeup::KernelWakeKind::OomKill),
        at: std::time::Instant::now(),
    };
    rig.agent
        .cycle(&mut rig.node, &mut rig.arming, wakeup, "kernel_oom_kill")
        .await;
    assert_eq!(take_log(&rig), ["read pods"]);
    rig.agent.recorders.live.flight_event(FlightEvent {
        at_ms: crate::live::unix_ms() + 1,
        kind: EventKind::OomKill {
            pod: "default/guaranteed".into(),
            comm: "app".into(),
            pid: 7,
            global: Some(false),
        },
    });
    let v = rig.agent.recorders.live.flight();
    let pods: Vec<(String, u64)> = v["records"][0]["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .flat_map(|s| s["top_pods"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| Some((p["pod"].as_str()?.to_owned(), p["working_set"].as_u64()?)))
        .collect();
    assert!(
        pods.contains(&("default/guaranteed".to_owned(), 900 * MI)),
        "{v}"
    );
    assert!(
        pods.contains(&("default/besteffort".to_owned(), 2 * GI)),
        "{v}"
    );
}

/// A pod whose container `main` has an ephemeral-storage limit of 1Gi and an emptyDir `cache`
/// with a sizeLimit of 64Mi.
fn storage_limited_pod(name: &str) -> Pod {
    let mut p = pod(name, 0, None);
    let spec = p.spec.as_mut().expect("spec");
    spec.containers[0].resources = Some(
        serde_json::from_value(json!({"limits": {"ephemeral-storage": "1Gi"}})).expect("resources"),
    );
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "cache", "emptyDir": {"sizeLimit": "64Mi"}}))
            .expect("volume"),
    ]);
    p
}

#[tokio::test(start_paused = true)]
async fn a_pod_over_its_empty_dir_size_limit_is_evicted_without_pressure_once_per_measurement() {
    let pods = vec![
        (storage_limited_pod("filler"), GI),
        (storage_limited_pod("tidy"), GI),
    ];
    // Plenty of memory: no threshold is met.
    let mut rig = Rig::new(HARD_1GI, 8 * GI, &pods);
    let detail = |cache: u64| crate::sampler::PodDiskDetail {
        total: cache + MI,
        empty_dirs: BTreeMap::from([("cache".to_owned(), cache)]),
        ..Default::default()
    };
    rig.state.borrow_mut().disk_detail = Some(HashMap::from([
        ("uid-filler".to_owned(), detail(65 * MI)),
        ("uid-tidy".to_owned(), detail(64 * MI)),
    ]));
    assert_eq!(rig.cycle().await, CycleEnd::Done);
    let writes = rig.cluster().writes.borrow().clone();
    assert!(
        writes.contains(&Write::Evict {
            name: "filler".into(),
            hard: true,
            signal: "emptydirfs.limit".into()
        }),
        "{writes:?}"
    );
    assert_eq!(rig.cluster().evicted(), ["filler"], "{writes:?}");
    assert!(
        writes.contains(&Write::Events {
            name: "filler".into(),
            outcome: EvictOutcome::Evicted
        }),
        "{writes:?}"
    );
    let status = rig.agent.recorders.live.status(true, "", &[]);
    assert_eq!(
        status["recent_evictions"][0]["message"],
        "Usage of EmptyDir volume \"cache\" exceeds the limit \"64Mi\". ",
        "{status}"
    );
    let text = rig.agent.metrics.encode();
    assert!(
        text.contains(
            "node_monitor_local_storage_limit_evictions_total{kind=\"emptydir\",outcome=\"evicted\"} 1"
        ),
        "{text}"
    );
    // No new measurement: nothing judged again.
    assert_eq!(rig.cycle().await, CycleEnd::Done);
    assert_eq!(rig.cluster().evicted(), ["filler"]);
}

#[tokio::test(start_paused = true)]
async fn local_storage_capacity_isolation_off_evicts_no_pod_over_its_limits() {
    let pods = vec![(storage_limited_pod("filler"), GI)];
    let mut rig = Rig::new(
        &format!("{HARD_1GI}localStorageCapacityIsolation: false\n"),
        8 * GI,
        &pods,
    );
    rig.state.borrow_mut().disk_detail = Some(HashMap::from([(
        "uid-filler".to_owned(),
        crate::sampler::PodDiskDetail {
            total: 2 * GI,
            empty_dirs: BTreeMap::from([("cache".to_owned(), GI)]),
            ..Default::default()
        },
    )]));
    assert_eq!(rig.cycle().await, CycleEnd::Done);
    assert_eq!(rig.cluster().evicted(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_reports_a_pod_over_its_limits_once_per_interval() {
    let pods = vec![(storage_limited_pod("filler"), GI)];
    let mut rig = Rig::new(
        &format!("{HARD_1GI}nodeMonitor:\n  dryRun: true\n"),
        8 * GI,
        &pods,
    );
    let over = || {
        Some(HashMap::from([(
            "uid-filler".to_owned(),
            crate::sampler::PodDiskDetail {
                total: 2 * GI,
                empty_dirs: BTreeMap::from([("cache".to_owned(), GI)]),
                ..Default::default()
            },
        )]))
    };
    for _ in 0..3 {
        rig.state.borrow_mut().disk_detail = over();
        rig.cycle().await;
        tokio::time::advance(Duration::from_secs(10)).await;
    }
    let asked = rig
        .cluster()
        .writes
        .borrow()
        .iter()
        .filter(|w| matches!(w, Write::Evict { .. }))
        .count();
    assert_eq!(asked, 1, "three measurements, one report");
}

#[tokio::test(start_paused = true)]
async fn the_memory_push_is_attached_only_while_armed_and_detached_5_s_after() {
    let push = FakePush::default();
    let mut rig = Rig::new(HARD_1GI, 8 * GI, &three_pods());
    rig.agent = rig
        .agent
        .with_mem_push(Box::new(push.clone()), PushPolicy::new(4096, 2));
    let asked = || push.1.lock().expect("not poisoned").clone();
    // Far from the threshold: never attached.
    rig.cycle().await;
    rig.cycle().await;
    assert_eq!(asked(), [] as [bool; 0]);
    // Near: attached, once.
    rig.set_available(GI + 50 * MI);
    rig.cycle().await;
    rig.cycle().await;
    assert_eq!(asked(), [true]);
    // Far again: disarmed at once, still attached for the hold.
    rig.set_available(8 * GI);
    rig.cycle().await;
    tokio::time::advance(Duration::from_secs(4)).await;
    rig.cycle().await;
    assert_eq!(asked(), [true]);
    assert_eq!(push.0.lock().expect("not poisoned").last(), Some(&0));
    // Back near within the hold: the new batch asks again (a no-op while attached, a retry
    // after a failed attach); then far for longer than the hold: detached.
    rig.set_available(GI + 50 * MI);
    rig.cycle().await;
    assert_eq!(asked(), [true, true]);
    rig.set_available(8 * GI);
    rig.cycle().await;
    tokio::time::advance(Duration::from_secs(6)).await;
    rig.cycle().await;
    rig.cycle().await;
    assert_eq!(asked(), [true, true, false]);
}

/// At the shipped `memory.available<100Mi`, a ramp that leaves the kernel less headroom than an
/// eviction's lead is evicted before the crossing: the pass that predicts it reads the pods
/// first, ranks as the kubelet does, and counts the eviction as predicted.
#[tokio::test(start_paused = true)]
async fn a_predicted_crossing_reads_the_pods_and_evicts_the_kubelets_choice_early() {
    let mut rig = with_headroom(Rig::new("", 4 * GI, &three_pods()));
    let mut evicted_at = None;
    // 500 MiB/s from 3 GiB of kernel headroom; memory.available 100 MiB above it.
    for step in 0..60u64 {
        let headroom = (3 * GI).saturating_sub(step * 50 * MI);
        rig.set_available(headroom + 100 * MI);
        rig.state.borrow_mut().observations.kernel_headroom = Some(headroom as i64);
        let report = rig.report().await;
        if !report.decision.evict.is_empty() {
            evicted_at = Some((headroom, report));
            break;
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    let (headroom, report) = evicted_at.expect("a predicted eviction");
    // 2 s at 500 MiB/s: within 1 GiB of the 160 MiB floor of a 10 GiB node, long before the
    // 100Mi crossing.
    assert!(
        (1110 * MI..=1160 * MI).contains(&headroom),
        "evicted with {} MiB of headroom",
        headroom / MI
    );
    assert_eq!(report.decision.evict[0].name, "besteffort");
    assert!(report.decision.prediction.is_some());
    assert!(
        report.decision.evict[0].message.contains("Predicted:"),
        "{}",
        report.decision.evict[0].message
    );
    let log = take_log(&rig);
    let evict = log.iter().position(|l| l == "evict besteffort");
    let read = log.iter().position(|l| l == "read pods");
    assert!(
        read.is_some() && read < evict,
        "the pods are read before the predicted ranking: {log:?}"
    );
    let predicted = rig
        .agent
        .metrics
        .eviction
        .predicted_evictions
        .get_or_create(&crate::metrics::OutcomeLabels {
            outcome: "evicted".into(),
        })
        .get();
    assert_eq!(predicted, 1);
    // Memory pressure, as at a crossing.
    assert!(report.decision.conditions.iter().any(|c| c.status));
}
