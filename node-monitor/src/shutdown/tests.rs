//! The manager with fake ports (logind, the API) on paused time: what reaches the node and
//! logind, in what order, at what (virtual) time.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use futures::channel::mpsc as fmpsc;
use k8s_openapi::{
    api::core::v1::{Pod, PodSpec, PodStatus},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use node_monitor_core::shutdown::{Group, Inhibitor, ShutdownPod};

use super::{
    node::{shutdown_pod, terminal},
    ports::{ApiError, Signals},
    *,
};
use crate::cluster::actuator::{DeleteOutcome, NodeConditionUpdate};

fn api_pod(name: &str, priority: Option<i32>, tgp: Option<i64>, phase: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            priority,
            termination_grace_period_seconds: tgp,
            ..PodSpec::default()
        }),
        status: Some(PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        }),
    }
}

#[test]
fn api_pods_become_plan_input() {
    let p = shutdown_pod(&api_pod("a", Some(1000), Some(7), "Running")).expect("complete");
    assert_eq!(
        p,
        ShutdownPod {
            namespace: "ns".into(),
            name: "a".into(),
            uid: "uid-a".into(),
            priority: 1000,
            termination_grace_period_seconds: Some(7),
        }
    );
    // No priority admitted yet: 0, as the kubelet reads a nil priority.
    assert_eq!(
        shutdown_pod(&api_pod("b", None, None, "Pending"))
            .expect("complete")
            .priority,
        0
    );
    let mut nameless = api_pod("c", None, None, "Running");
    nameless.metadata.uid = None;
    assert!(shutdown_pod(&nameless).is_none());
    assert!(terminal(&api_pod("d", None, None, "Failed")));
    assert!(terminal(&api_pod("e", None, None, "Succeeded")));
    assert!(!terminal(&api_pod("f", None, None, "Running")));
}

#[test]
fn reboot_seen_from_the_kernel_event() {
    use crate::ebpf::RebootCaller;
    let root = RebootCaller {
        cap_effective: 0x1ff_ffff_ffff,
        pid_ns_level: 0,
        user_ns_level: 0,
    };
    let ev = RebootEvent {
        ts_ns: 1,
        task: crate::ebpf::TaskInfo {
            pid: 77,
            tid: 77,
            comm: "systemctl".into(),
            cgroup_id: 9,
        },
        cmd: RebootCmd::Restart,
        cmd_raw: 0x0123_4567,
        magic1: 0xfee1_dead,
        magic2: 672_274_793,
        verdict: RebootGate::Allowed,
        caller: Some(root),
        suppressed: 0,
    };
    assert_eq!(
        RebootSeen::from(&ev),
        RebootSeen {
            cmd: RebootCmd::Restart,
            pid: 77,
            comm: "systemctl".into(),
            cgroup_id: 9,
            gate: RebootGate::Allowed,
            suppressed: 0,
        }
    );
    // A container's call, as the probe reports it.
    let refused = RebootEvent {
        verdict: RebootGate::RefusedPidNs,
        caller: Some(RebootCaller {
            pid_ns_level: 1,
            ..root
        }),
        suppressed: 12,
        ..ev.clone()
    };
    let seen = RebootSeen::from(&refused);
    assert_eq!((seen.gate, seen.suppressed), (RebootGate::RefusedPidNs, 12));
    // An `allowed` the reported fields contradict (bad magic) is not trusted.
    let bad = RebootEvent { magic2: 7, ..ev };
    assert_eq!(RebootSeen::from(&bad).gate, RebootGate::RefusedMagic);
}

#[test]
fn error_chain_joins_causes() {
    let e = LogindError::Call {
        method: "Inhibit",
        source: Box::new(zbus::Error::Failure("denied".into())),
    };
    assert_eq!(chain(&e), "logind Inhibit: denied");
}

// ---- fakes ----

/// What the fakes saw, with the virtual time since the test started.
#[derive(Default)]
struct Journal {
    entries: Vec<(Duration, String)>,
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().expect("not poisoned")
}

#[derive(Clone)]
struct Clock {
    start: Instant,
    journal: Shared<Journal>,
}

impl Clock {
    fn note(&self, what: impl Into<String>) {
        lock(&self.journal)
            .entries
            .push((self.start.elapsed(), what.into()));
    }

    fn entries(&self) -> Vec<(Duration, String)> {
        lock(&self.journal).entries.clone()
    }

    fn lines(&self) -> Vec<String> {
        self.entries().into_iter().map(|(_, l)| l).collect()
    }

    /// When `line` was noted first.
    fn at(&self, line: &str) -> Duration {
        self.entries()
            .into_iter()
            .find(|(_, l)| l == line)
            .unwrap_or_else(|| panic!("{line:?} not in {:?}", self.lines()))
            .0
    }
}

#[derive(Default)]
struct BusState {
    down: bool,
    delay: Duration,
    kubelet_lock: bool,
    locks_held: usize,
    /// logind's `PreparingForShutdown` at a connection.
    preparing: bool,
    prepare: Option<fmpsc::UnboundedSender<Result<bool, LogindError>>>,
    owners: Option<fmpsc::UnboundedSender<Result<Option<String>, LogindError>>>,
}

/// logind: connections, locks, `InhibitDelayMaxSec`, the signals the test sends.
#[derive(Clone)]
struct Bus {
    state: Shared<BusState>,
    clock: Clock,
}

struct LockToken(Bus);

impl Drop for LockToken {
    fn drop(&mut self) {
        lock(&self.0.state).locks_held -= 1;
        self.0.clock.note("logind: lock released");
    }
}

impl Bus {
    fn prepare(&self, start: bool) {
        let tx = lock(&self.state).prepare.clone();
        tx.expect("connected")
            .unbounded_send(Ok(start))
            .expect("manager listens");
    }

    /// The bus connection ends (logind or dbus restarted, or gone).
    fn disconnect(&self, down: bool) {
        let mut s = lock(&self.state);
        s.down = down;
        s.prepare = None;
        s.owners = None;
    }

    fn locks_held(&self) -> usize {
        lock(&self.state).locks_held
    }
}

impl LogindPort for Bus {
    type Conn = Bus;

    async fn connect(&self) -> Result<(Bus, Signals), LogindError> {
        let mut s = lock(&self.state);
        if s.down {
            return Err(LogindError::Connect(Box::new(zbus::Error::Failure(
                "no system bus".into(),
            ))));
        }
        let (ptx, prx) = fmpsc::unbounded();
        let (otx, orx) = fmpsc::unbounded();
        s.prepare = Some(ptx);
        s.owners = Some(otx);
        let pending = s.preparing;
        drop(s);
        self.clock.note("logind: connected");
        Ok((
            self.clone(),
            Signals {
                prepare: logind::led_by_pending(pending, prx).boxed(),
                owners: orx.boxed(),
            },
        ))
    }

    async fn remove_dropin(&self) {
        self.clock.note("logind: drop-in removed");
    }
}

impl LogindConn for Bus {
    async fn inhibit(&self) -> Result<HeldLock, LogindError> {
        lock(&self.state).locks_held += 1;
        self.clock.note("logind: lock taken");
        Ok(HeldLock::new(-1, LockToken(self.clone())))
    }

    async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        Ok(lock(&self.state).delay)
    }

    async fn raise_inhibit_delay(&self, seconds: u64) -> Result<Duration, LogindError> {
        self.clock.note(format!("logind: raised to {seconds}s"));
        lock(&self.state).delay = Duration::from_secs(seconds);
        Ok(Duration::from_secs(seconds))
    }

    async fn list_inhibitors(&self) -> Result<Vec<Inhibitor>, LogindError> {
        let kubelet = lock(&self.state).kubelet_lock;
        Ok(kubelet
            .then(|| Inhibitor {
                what: "shutdown".into(),
                who: "kubelet".into(),
                why: "kubelet needs time".into(),
                mode: "delay".into(),
                uid: 0,
                pid: 1,
            })
            .into_iter()
            .collect())
    }

    async fn ping(&self) -> Result<(), LogindError> {
        if lock(&self.state).prepare.is_none() {
            return Err(LogindError::Disconnected);
        }
        Ok(())
    }
}

#[derive(Default)]
struct NodeState {
    pods: Vec<Pod>,
    /// Pods that stay in the API after their deletion (still terminating).
    linger: Vec<String>,
    unschedulable: bool,
    annotations: BTreeMap<String, String>,
}

/// The API: the node, its pods, and the writes in order.
#[derive(Clone)]
struct Cluster {
    state: Shared<NodeState>,
    clock: Clock,
}

impl NodeApi for Cluster {
    async fn set_condition(&self, u: NodeConditionUpdate) -> Result<(), ApiError> {
        self.clock
            .note(format!("condition {} {}", u.status, u.reason));
        Ok(())
    }

    async fn set_taint(&self, present: bool) -> Result<(), ApiError> {
        self.clock.note(if present {
            "taint added"
        } else {
            "taint removed"
        });
        Ok(())
    }

    async fn set_unschedulable(&self, value: bool) -> Result<bool, ApiError> {
        let before = std::mem::replace(&mut lock(&self.state).unschedulable, value);
        if before != value {
            self.clock
                .note(if value { "cordoned" } else { "uncordoned" });
        }
        Ok(before)
    }

    async fn is_unschedulable(&self) -> Result<bool, ApiError> {
        Ok(lock(&self.state).unschedulable)
    }

    async fn annotate_node(
        &self,
        key: &'static str,
        value: Option<String>,
    ) -> Result<(), ApiError> {
        let mut s = lock(&self.state);
        match value {
            Some(v) => s.annotations.insert(key.into(), v),
            None => s.annotations.remove(key),
        };
        Ok(())
    }

    async fn node_annotation(&self, key: &'static str) -> Result<Option<String>, ApiError> {
        Ok(lock(&self.state).annotations.get(key).cloned())
    }

    async fn node_event(&self, message: &'static str) {
        self.clock.note(format!("event {message}"));
    }

    async fn delete_pod(
        &self,
        _namespace: String,
        name: String,
        _uid: String,
        grace: u32,
    ) -> Result<DeleteOutcome, ApiError> {
        self.clock.note(format!("delete {name} grace={grace}"));
        let mut s = lock(&self.state);
        if !s.linger.contains(&name) {
            s.pods
                .retain(|p| p.metadata.name.as_deref() != Some(name.as_str()));
        }
        Ok(DeleteOutcome::Deleted)
    }

    async fn list_node_pods(&self) -> Result<Vec<Pod>, ApiError> {
        Ok(lock(&self.state).pods.clone())
    }
}

struct Harness {
    bus: Bus,
    api: Cluster,
    clock: Clock,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    reboots: mpsc::Sender<RebootSeen>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Stopped>,
}

/// Groups: priority 0 for 20s, priority 1000 for 10s (budget 30s, logind must allow 35s).
fn config(options: ShutdownOptions) -> ShutdownConfig {
    ShutdownConfig {
        groups: vec![
            Group {
                priority: 0,
                period: Duration::from_secs(20),
            },
            Group {
                priority: 1000,
                period: Duration::from_secs(10),
            },
        ],
        options: ShutdownOptions {
            enabled: true,
            ..options
        },
        ..ShutdownConfig::default()
    }
}

fn start(cfg: ShutdownConfig, node: NodeState, logind_delay: Duration) -> Harness {
    let clock = Clock {
        start: Instant::now(),
        journal: Arc::default(),
    };
    start_with(cfg, node, logind_delay, false, clock)
}

/// [`start`], with logind already preparing for a shutdown when `preparing`.
fn start_with(
    cfg: ShutdownConfig,
    node: NodeState,
    logind_delay: Duration,
    preparing: bool,
    clock: Clock,
) -> Harness {
    let bus = Bus {
        state: Arc::new(Mutex::new(BusState {
            delay: logind_delay,
            preparing,
            ..BusState::default()
        })),
        clock: clock.clone(),
    };
    let api = Cluster {
        state: Arc::new(Mutex::new(node)),
        clock: clock.clone(),
    };
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let (reboots, rx) = mpsc::channel(8);
    let (stop, stop_rx) = watch::channel(false);
    let m = Manager::new(
        bus.clone(),
        api.clone(),
        cfg,
        Runtime {
            metrics: metrics.clone(),
            health: health.clone(),
            reboots: rx,
            own_pod: None,
            fast: None,
        },
    );
    let task = tokio::spawn(m.run(stop_rx));
    Harness {
        bus,
        api,
        clock,
        metrics,
        health,
        reboots,
        stop,
        task,
    }
}

async fn settle(d: Duration) {
    tokio::time::sleep(d).await;
}

const AT_REST: &str = "condition false InhibitorHeld";

#[tokio::test(start_paused = true)]
async fn start_up_raises_the_delay_takes_the_lock_and_a_stop_removes_the_dropin() {
    let h = start(
        config(ShutdownOptions::default()),
        NodeState::default(),
        Duration::from_secs(5),
    );
    settle(Duration::from_millis(10)).await;
    assert_eq!(
        h.clock.lines(),
        [
            "taint removed",
            "logind: connected",
            "logind: raised to 35s",
            "logind: lock taken",
            AT_REST
        ]
    );
    assert_eq!(h.bus.locks_held(), 1);
    assert_eq!(h.metrics.shutdown.inhibitor_held.get(), 1);
    assert_eq!(h.metrics.shutdown.inhibit_delay_max_seconds.get(), 35.0);
    h.stop.send(true).expect("manager runs");
    let stopped = h.task.await.expect("manager ends");
    assert_eq!(
        stopped,
        Stopped {
            shutting_down: false
        }
    );
    assert_eq!(h.bus.locks_held(), 0);
    assert!(h.clock.lines().ends_with(&[
        "logind: lock released".to_owned(),
        "logind: drop-in removed".to_owned()
    ]));
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_deletes_groups_in_priority_order_and_waits_each_period() {
    let node = NodeState {
        pods: vec![
            api_pod("crit", Some(2000), None, "Running"),
            api_pod("a", Some(0), Some(5), "Running"),
            api_pod("slow", Some(10), None, "Running"),
            api_pod("done", Some(0), None, "Succeeded"),
        ],
        // Terminates longer than its group's period.
        linger: vec!["slow".into()],
        ..NodeState::default()
    };
    let h = start(
        config(ShutdownOptions::default()),
        node,
        Duration::from_secs(60),
    );
    settle(Duration::from_secs(1)).await;
    let t0 = h.clock.start.elapsed();
    h.bus.prepare(true);
    settle(Duration::from_secs(40)).await;
    let lines = h.clock.lines();
    let from = lines
        .iter()
        .position(|l| l == "delete a grace=5")
        .expect("deleted");
    // The marks go out beside the first group's deletions.
    assert_eq!(
        lines[from..],
        [
            "delete a grace=5",
            "delete slow grace=20",
            "event Shutdown manager detected shutdown event",
            "condition true NodeShuttingDown",
            "taint added",
            "delete crit grace=10",
            "logind: lock released",
            "event Shutdown manager finished terminating pods",
        ],
        "{lines:?}"
    );
    // The critical group starts when the first one's period ran out (`slow` stayed), and the
    // lock goes as soon as the API shows `crit` gone (the next poll).
    assert_eq!(h.clock.at("delete a grace=5") - t0, Duration::ZERO);
    assert_eq!(
        h.clock.at("delete crit grace=10") - t0,
        Duration::from_secs(20)
    );
    assert_eq!(
        h.clock.at("logind: lock released") - t0,
        Duration::from_millis(20_250)
    );
    assert_eq!(h.bus.locks_held(), 0);
    assert_eq!(h.metrics.shutdown.inhibitor_held.get(), 0);
    // Stopping now keeps the drop-in and the marks for the next boot.
    h.stop.send(true).expect("manager runs");
    assert_eq!(
        h.task.await.expect("manager ends"),
        Stopped {
            shutting_down: true
        }
    );
    assert!(
        !h.clock
            .lines()
            .contains(&"logind: drop-in removed".to_owned())
    );
}

/// The agent (re)started after logind announced a shutdown: the lock it takes would only hold the
/// machine up, so it drains as if it had seen the signal, and releases the lock.
#[tokio::test(start_paused = true)]
async fn a_shutdown_already_pending_at_start_is_drained_and_released() {
    let node = NodeState {
        pods: vec![
            api_pod("crit", Some(2000), None, "Running"),
            api_pod("a", Some(0), Some(5), "Running"),
        ],
        ..NodeState::default()
    };
    let cfg = config(ShutdownOptions::default());
    let clock = Clock {
        start: Instant::now(),
        journal: Arc::default(),
    };
    let h = start_with(cfg, node, Duration::from_secs(60), true, clock);
    settle(Duration::from_secs(1)).await;
    // A repeated signal, during the run and after it, starts nothing more.
    h.bus.prepare(true);
    settle(Duration::from_secs(40)).await;
    h.bus.prepare(true);
    settle(Duration::from_secs(40)).await;
    let lines = h.clock.lines();
    let deletions: Vec<&String> = lines.iter().filter(|l| l.starts_with("delete ")).collect();
    assert_eq!(
        deletions,
        ["delete a grace=5", "delete crit grace=10"],
        "{lines:?}"
    );
    let taken = lines.iter().position(|l| l == "logind: lock taken");
    let released = lines.iter().position(|l| l == "logind: lock released");
    assert!(
        matches!((taken, released), (Some(t), Some(r)) if t < r),
        "{lines:?}"
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| *l == "event Shutdown manager finished terminating pods")
            .count(),
        1,
        "{lines:?}"
    );
    assert_eq!(h.bus.locks_held(), 0);
    assert_eq!(h.metrics.shutdown.inhibitor_held.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_shutdown_uncordons_only_what_it_cordoned() {
    for already_cordoned in [false, true] {
        let node = NodeState {
            pods: vec![api_pod("slow", Some(0), None, "Running")],
            linger: vec!["slow".into()],
            unschedulable: already_cordoned,
            ..NodeState::default()
        };
        let h = start(
            config(ShutdownOptions {
                cordon: true,
                ..ShutdownOptions::default()
            }),
            node,
            Duration::from_secs(60),
        );
        settle(Duration::from_secs(1)).await;
        h.bus.prepare(true);
        settle(Duration::from_secs(5)).await;
        h.bus.prepare(false);
        settle(Duration::from_secs(30)).await;
        let lines = h.clock.lines();
        let cancel = lines
            .iter()
            .position(|l| l == "event Shutdown manager detected shutdown cancellation")
            .expect("cancelled");
        let mut want = vec![
            "event Shutdown manager detected shutdown cancellation",
            "taint removed",
        ];
        if !already_cordoned {
            want.push("uncordoned");
        }
        want.push(AT_REST);
        assert_eq!(lines[cancel..], want, "{lines:?}");
        // The lock is taken again (the new one before the old goes) before the marks go, and
        // no later group started.
        assert_eq!(
            lines[cancel - 2..cancel],
            ["logind: lock taken", "logind: lock released"]
        );
        assert!(
            !lines
                .iter()
                .any(|l| l.starts_with("event Shutdown manager finished"))
        );
        assert_eq!(lock(&h.api.state).unschedulable, already_cordoned);
        assert_eq!(h.bus.locks_held(), 1);
        assert!(lock(&h.api.state).annotations.is_empty());
    }
}

fn allowed_reboot() -> RebootSeen {
    RebootSeen {
        cmd: RebootCmd::Restart,
        pid: 1,
        comm: "systemctl".into(),
        cgroup_id: 1,
        gate: RebootGate::Allowed,
        suppressed: 0,
    }
}

#[tokio::test(start_paused = true)]
async fn a_bypassing_reboot_sends_one_last_gasp_and_takes_it_back_when_the_node_stays_up() {
    let h = start(
        config(ShutdownOptions::default()),
        NodeState::default(),
        Duration::from_secs(60),
    );
    settle(Duration::from_secs(1)).await;
    for _ in 0..3 {
        h.reboots
            .send(allowed_reboot())
            .await
            .expect("manager runs");
        settle(Duration::from_millis(100)).await;
    }
    let gasps = |h: &Harness| {
        h.clock
            .lines()
            .iter()
            .filter(|l| *l == "condition true NonGracefulShutdown")
            .count()
    };
    assert_eq!(gasps(&h), 1, "{:?}", h.clock.lines());
    assert_eq!(h.metrics.shutdown.bypassing_inhibitor.get(), 3);
    assert_eq!(h.metrics.shutdown.last_gasps_suppressed.get(), 2);
    let gasp = h.clock.at("condition true NonGracefulShutdown");
    settle(Duration::from_secs(35)).await;
    // Still up after 30s: the condition goes back to False, once.
    let lines = h.clock.lines();
    let back: Vec<_> = h
        .clock
        .entries()
        .into_iter()
        .filter(|(t, l)| *t > gasp && l == AT_REST)
        .collect();
    assert_eq!(back.len(), 1, "{lines:?}");
    assert!(back[0].0 - gasp > GASP_RETRACT_FOR_TEST);
}

const GASP_RETRACT_FOR_TEST: Duration = node_monitor_core::shutdown::lifecycle::GASP_RETRACT;

#[tokio::test(start_paused = true)]
async fn logind_loss_degrades_and_the_lock_comes_back_with_logind() {
    let h = start(
        config(ShutdownOptions::default()),
        NodeState::default(),
        Duration::from_secs(60),
    );
    settle(Duration::from_secs(1)).await;
    assert_eq!(h.bus.locks_held(), 1);
    h.bus.disconnect(true);
    settle(Duration::from_secs(5)).await;
    assert_eq!(h.bus.locks_held(), 0);
    assert_eq!(h.metrics.shutdown.inhibitor_held.get(), 0);
    // Each distinct cause once: the connection that ended, then the bus that is not there.
    assert_eq!(
        h.health.degraded(),
        [
            "shutdown inhibitor: the system bus connection ended",
            "shutdown inhibitor: connecting to the system bus: no system bus"
        ]
    );
    // Bypasses are still reported while logind is away.
    h.reboots
        .send(allowed_reboot())
        .await
        .expect("manager runs");
    settle(Duration::from_millis(10)).await;
    assert_eq!(h.metrics.shutdown.bypassing_inhibitor.get(), 1);
    // logind is back: reconnected within the reconnect period, the lock taken again.
    h.bus.disconnect(false);
    settle(Duration::from_secs(2)).await;
    assert_eq!(h.bus.locks_held(), 1);
    assert_eq!(h.metrics.shutdown.inhibitor_held.get(), 1);
    let connects = h
        .clock
        .lines()
        .iter()
        .filter(|l| *l == "logind: connected")
        .count();
    assert_eq!(connects, 2);
}

#[tokio::test(start_paused = true)]
async fn the_observer_takes_the_lock_but_leaves_the_pods_to_the_kubelet() {
    let node = NodeState {
        pods: vec![api_pod("a", Some(0), None, "Running")],
        ..NodeState::default()
    };
    let h = start(
        config(ShutdownOptions::default()),
        node,
        Duration::from_secs(60),
    );
    lock(&h.bus.state).kubelet_lock = true;
    settle(Duration::from_secs(1)).await;
    assert_eq!(h.bus.locks_held(), 1);
    h.bus.prepare(true);
    settle(Duration::from_secs(2)).await;
    // The kubelet killed it: Failed in the API.
    lock(&h.api.state).pods[0].status = Some(PodStatus {
        phase: Some("Failed".into()),
        ..PodStatus::default()
    });
    settle(Duration::from_secs(1)).await;
    let lines = h.clock.lines();
    assert!(!lines.iter().any(|l| l.starts_with("delete")), "{lines:?}");
    assert_eq!(h.bus.locks_held(), 0, "{lines:?}");
    assert!(h.clock.at("logind: lock released") < Duration::from_secs(4));
}
