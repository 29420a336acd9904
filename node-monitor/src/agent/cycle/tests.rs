//! The agent cycle against fakes of its ports, in the style of the kubelet's eviction manager
//! tests: a fake node (the summary provider), pods, and a fake cluster that records every write
//! (the `killPodFunc`). Time is tokio's, paused.
use std::{
    cell::RefCell,
    collections::{BTreeSet, HashMap, VecDeque},
    rc::Rc,
    sync::Arc,
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use node_monitor_core::{
    config::{ConfigSource, EvictionOverrides, load_sources},
    signals::{Observations, PodUsage, Signal, SignalObservation},
    threshold::Threshold,
};
use serde_json::json;

use super::*;
use crate::{
    agent::ports::KubepodsSight,
    cluster::actuator::{ActuatorError, FailureKind},
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
}

struct FakeNode(Rc<RefCell<NodeState>>);

impl NodeView for FakeNode {
    fn observe(&mut self, wakeup: Wakeup, kind: SampleKind) -> TimedObservations<Wakeup> {
        TimedObservations {
            wakeup,
            kind,
            observations: self.0.borrow().observations.clone(),
            sampling: Duration::ZERO,
            since_wakeup: Duration::ZERO,
        }
    }
    fn sample_into(&mut self, _kind: SampleKind, out: &mut Observations) {
        out.pods = self.0.borrow().observations.pods.clone();
    }
    fn sample(&mut self, _kind: SampleKind) -> Observations {
        self.0.borrow().observations.clone()
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
    fn last_node_memory(&self) -> Option<MemoryReading> {
        None
    }
    fn last_kubepods_memory(&self) -> Option<MemoryReading> {
        None
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
        self.writes.borrow_mut().push(Write::Evict {
            name: req.name.clone(),
            hard: req.hard,
            signal: req.signal.clone(),
        });
        let outcome = self
            .answers
            .borrow_mut()
            .get_mut(&req.name)
            .and_then(VecDeque::pop_front)
            .unwrap_or(EvictOutcome::Evicted);
        if outcome == EvictOutcome::Evicted {
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
        Ok(())
    }
    async fn set_taint(
        &self,
        key: &str,
        _value: &str,
        _effect: &str,
        present: bool,
    ) -> Result<bool, ActuatorError> {
        self.writes.borrow_mut().push(Write::Taint {
            key: key.to_owned(),
            on: present,
        });
        Ok(true)
    }
    async fn pod_present(&self, _ns: &str, _name: &str, uid: &str) -> Result<bool, kube::Error> {
        Ok(self.node.borrow().observations.pods.contains_key(uid))
    }
}

struct FakePods(Vec<Arc<Pod>>);

impl PodSource for FakePods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.0.clone()
    }
}

#[derive(Default)]
struct FakeArming(usize);

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
        let wakeup = Wakeup {
            source: WakeSource::Housekeeping,
            at: std::time::Instant::now(),
        };
        self.agent
            .cycle(&mut self.node, &mut self.arming, wakeup, "timer")
            .await
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
    rig.cluster().answer(
        "besteffort",
        EvictOutcome::Failed {
            code: Some(503),
            kind: FailureKind::Unavailable,
            reason: "unavailable".into(),
        },
    );
    rig.cycle().await;
    assert_eq!(
        rig.cluster().evicted(),
        ["besteffort"],
        "the rest of the decision would fail the same way"
    );
    let retry_at = rig.agent.retry_at.expect("a retry is scheduled");
    assert!(retry_at <= rig.agent.now() + RETRY_INITIAL, "{retry_at:?}");
    assert_eq!(
        rig.agent
            .metrics
            .api_errors
            .get_or_create(&crate::metrics::OperationLabels {
                operation: "evict".into()
            })
            .get(),
        1
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
    assert_eq!(rig.agent.metrics.pod_cgroups_missing.get(), 1);
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
    tokio::time::advance(CONDITION_HEARTBEAT + Duration::from_secs(1)).await;
    rig.cycle().await;
    assert_eq!(rig.cluster().condition_writes().len(), 3, "the heartbeat");
}

#[tokio::test(start_paused = true)]
async fn a_failed_condition_write_is_counted_and_written_again_next_cycle() {
    let mut rig = Rig::new(HARD_1GI, 5 * GI, &three_pods());
    *rig.cluster().conditions_fail.borrow_mut() = true;
    rig.cycle().await;
    assert!(rig.cluster().condition_writes().is_empty());
    *rig.cluster().conditions_fail.borrow_mut() = false;
    rig.cycle().await;
    assert_eq!(rig.cluster().condition_writes().len(), 1);
    assert_eq!(
        rig.agent
            .metrics
            .api_errors
            .get_or_create(&crate::metrics::OperationLabels {
                operation: "patch_conditions".into()
            })
            .get(),
        1
    );
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
