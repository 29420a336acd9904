//! Simulated pods: every container is one real process (plus whatever it forks) in its own
//! kubelet-layout cgroup, started, watched, restarted and killed the way the kubelet and containerd
//! would, and reported back as pod status.
//!
//! [`Runtime::sync`] is one pass of the kubelet's pod workers over the pods bound to the node: it
//! does the process and cgroup work at once (all of it fast, local and synchronous) and returns the
//! API writes to make, which the caller performs without holding the runtime's lock.
use std::{
    collections::{BTreeMap, HashMap},
    fs,
    io::{self, Read as _, Write as _},
    os::unix::process::{CommandExt as _, ExitStatusExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::core::v1::{
        Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
        ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodSpec,
        PodStatus,
    },
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::Timestamp,
};
use nix::{sys::signal::Signal, unistd::Pid};
use node_monitor_core::kubelet::layout::{CgroupDriver, QosClass};
use tracing::{debug, info, warn};

use super::{
    cgroups::Cgroups,
    decide::{self, ContainerPhase},
};
use crate::control_plane::process::Spawner;

/// What the runtime needs to know about its node.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub node_name: String,
    pub node_ip: String,
    pub driver: CgroupDriver,
    /// The node cgroup, relative to the hierarchy roots.
    pub node_cgroup: PathBuf,
    /// For `oom_score_adj` of Burstable containers.
    pub memory_capacity: u64,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Container logs: `<log_dir>/<namespace>_<name>_<uid>/<container>/<restart>.log`, like
    /// `/var/log/pods`.
    pub log_dir: PathBuf,
}

/// An API write the sync pass asks for.
#[derive(Debug, Clone)]
pub enum ApiAction {
    /// Strategic-merge `{"status": status}` into the pod.
    Status {
        namespace: String,
        name: String,
        uid: String,
        status: serde_json::Value,
    },
    /// Delete with `gracePeriodSeconds=0` and a UID precondition: the processes are gone.
    Finalize {
        namespace: String,
        name: String,
        uid: String,
    },
}

/// Where a running container lives, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    pub name: String,
    /// 64 hex digits; the status reports `containerd://<id>`.
    pub id: String,
    /// Relative to the hierarchy roots.
    pub cgroup: PathBuf,
    /// The container's main process.
    pub pid: u32,
    pub log: PathBuf,
}

/// A pod as the runtime runs it, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub qos: QosClass,
    /// Relative to the hierarchy roots.
    pub cgroup: PathBuf,
    /// Running containers (init and regular).
    pub containers: Vec<ContainerInfo>,
    pub terminating: bool,
}

pub struct Runtime {
    cfg: RuntimeConfig,
    cgroups: Cgroups,
    spawner: Spawner,
    pods: HashMap<String, PodRuntime>,
    /// Set by [`Runtime::shutdown`]: a sync pass racing the stand-in's teardown starts nothing.
    closed: bool,
    /// Deletions completed for pods that never ran here (terminal, or deleted before they
    /// started), by UID: when last asked, so a pod held by a finalizer is not asked every pass.
    finalize_only: HashMap<String, Instant>,
}

struct PodRuntime {
    namespace: String,
    name: String,
    uid: String,
    qos: QosClass,
    cgroup: PathBuf,
    log_dir: PathBuf,
    restart_policy: String,
    node_critical: bool,
    spec: PodSpec,
    start_time: Timestamp,
    init: Vec<ContainerRuntime>,
    containers: Vec<ContainerRuntime>,
    init_done: bool,
    init_failed: bool,
    terminating: Option<Terminating>,
    /// The processes are gone and the deletion was requested (when) — retried until the pod
    /// leaves the API.
    finalized: Option<Instant>,
    conditions: BTreeMap<&'static str, (bool, Timestamp)>,
    last_sent: Option<serde_json::Value>,
}

struct Terminating {
    deadline: Instant,
    killed: bool,
}

struct ContainerRuntime {
    spec: Container,
    /// An init container (`spec.initContainers`).
    init: bool,
    /// An init container with `restartPolicy: Always` (a sidecar): started in order with the init
    /// containers, then kept running like a regular container.
    sidecar: bool,
    restart_count: i32,
    state: CState,
    last: Option<Terminated>,
}

enum CState {
    Waiting {
        reason: String,
        message: Option<String>,
        not_before: Instant,
    },
    Running(Running),
    /// Exited for good (no restart).
    Terminated(Terminated),
}

struct Running {
    child: Child,
    id: String,
    cgroup: PathBuf,
    started_at: Timestamp,
    log: PathBuf,
}

#[derive(Clone)]
struct Terminated {
    exit_code: i32,
    reason: String,
    message: Option<String>,
    started_at: Option<Timestamp>,
    finished_at: Timestamp,
    id: Option<String>,
}

impl ContainerRuntime {
    fn new(spec: &Container, init: bool, sidecar: bool, now: Instant) -> Self {
        Self {
            spec: spec.clone(),
            init,
            sidecar,
            restart_count: 0,
            state: CState::Waiting {
                reason: "ContainerCreating".to_owned(),
                message: None,
                not_before: now,
            },
            last: None,
        }
    }

    /// What a slot holds while its container is taken out to be worked on.
    fn placeholder(now: Instant) -> Self {
        Self::new(&Container::default(), false, false, now)
    }

    fn phase(&self) -> ContainerPhase {
        match &self.state {
            CState::Running(_) => ContainerPhase::Running,
            CState::Waiting { .. } if self.last.is_some() => ContainerPhase::Restarting,
            CState::Waiting { .. } => ContainerPhase::Waiting,
            CState::Terminated(t) => ContainerPhase::Exited(t.exit_code),
        }
    }

    fn running(&self) -> Option<&Running> {
        match &self.state {
            CState::Running(r) => Some(r),
            _ => None,
        }
    }
}

static ID_SEQ: AtomicU64 = AtomicU64::new(0);

/// 64 random hex digits, like a containerd container ID.
fn container_id() -> String {
    let mut bytes = [0u8; 32];
    let random = fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if random.is_err() {
        // Unique anyway: time, pid and a counter.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let seq = u128::from(ID_SEQ.fetch_add(1, Ordering::Relaxed));
        let a = nanos ^ (u128::from(std::process::id()) << 64);
        bytes[..16].copy_from_slice(&a.to_le_bytes());
        bytes[16..].copy_from_slice(&seq.to_le_bytes());
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The program to run, as a runtime resolves `command[0]` (a path, or a name on `PATH`).
fn resolve(program: &str) -> Result<PathBuf, String> {
    if program.contains('/') {
        let p = PathBuf::from(program);
        if is_executable(&p) {
            Ok(p)
        } else {
            Err(format!(
                "exec: \"{program}\": stat {program}: no such file or directory"
            ))
        }
    } else {
        which::which(program)
            .map_err(|_| format!("exec: \"{program}\": executable file not found in $PATH"))
    }
}

fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

impl Runtime {
    pub fn new(cfg: RuntimeConfig, cgroups: Cgroups, spawner: Spawner) -> Self {
        Self {
            cfg,
            cgroups,
            spawner,
            pods: HashMap::new(),
            closed: false,
            finalize_only: HashMap::new(),
        }
    }

    /// Pods the runtime currently runs (or is terminating).
    pub fn pods(&self) -> Vec<PodInfo> {
        let mut out: Vec<PodInfo> = self.pods.values().map(PodRuntime::info).collect();
        out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        out
    }

    /// Every process in the pod's cgroup.
    pub fn pod_pids(&self, uid: &str) -> Vec<i32> {
        self.pods
            .get(uid)
            .map(|p| self.cgroups.pids(&p.cgroup))
            .unwrap_or_default()
    }

    /// The status write for `uid` failed: send it again next pass.
    pub fn status_failed(&mut self, uid: &str) {
        if let Some(p) = self.pods.get_mut(uid) {
            p.last_sent = None;
        }
    }

    /// One pass over the pods bound to the node.
    pub fn sync(&mut self, bound: &[Arc<Pod>], now: Instant, wall: Timestamp) -> Vec<ApiAction> {
        let mut actions = Vec::new();
        if self.closed {
            return actions;
        }
        let mut seen = Vec::with_capacity(bound.len());
        for pod in bound {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            seen.push(uid.clone());
            if !self.pods.contains_key(&uid) {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                let terminal = matches!(phase, Some("Succeeded" | "Failed"));
                if terminal || pod.metadata.deletion_timestamp.is_some() {
                    // Nothing of it runs here (a terminal pod, or one deleted before it started,
                    // e.g. after a stand-in restart): only the deletion needs completing.
                    let due = self
                        .finalize_only
                        .get(&uid)
                        .is_none_or(|at| now.duration_since(*at) >= Duration::from_secs(2));
                    if pod.metadata.deletion_timestamp.is_some() && due {
                        self.finalize_only.insert(uid.clone(), now);
                        actions.push(finalize_action(pod, &uid));
                    }
                    continue;
                }
                match self.admit(pod, &uid, now, wall) {
                    Ok(rt) => {
                        info!(pod = %format!("{}/{}", rt.namespace, rt.name), %uid, qos = %rt.qos,
                              cgroup = %rt.cgroup.display(), "pod admitted");
                        self.pods.insert(uid.clone(), rt);
                    }
                    Err(e) => {
                        warn!(%uid, error = %e, "cannot create the pod's cgroups; retrying");
                        continue;
                    }
                }
            }
            let Some(mut rt) = self.pods.remove(&uid) else {
                continue;
            };
            if pod.metadata.deletion_timestamp.is_some() && rt.terminating.is_none() {
                let grace = pod
                    .metadata
                    .deletion_grace_period_seconds
                    .or(rt.spec.termination_grace_period_seconds)
                    .unwrap_or(30)
                    .max(0);
                let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                info!(pod = %format!("{}/{}", rt.namespace, rt.name), grace_s = grace.as_secs(),
                      "pod deleted; stopping its containers");
                rt.begin_termination(now + grace);
            }
            self.step(&mut rt, now, wall, &mut actions);
            self.pods.insert(uid, rt);
        }
        self.finalize_only.retain(|uid, _| seen.contains(uid));
        // Pods gone from the API (finalized, force-deleted, or bound elsewhere): nothing of them
        // may remain, as the kubelet's HandlePodRemoves.
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|k| !seen.contains(k))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(mut rt) = self.pods.remove(&uid) {
                debug!(pod = %format!("{}/{}", rt.namespace, rt.name), "pod left the API");
                self.kill_pod(&mut rt, wall);
            }
        }
        actions
    }

    fn admit(
        &mut self,
        pod: &Pod,
        uid: &str,
        now: Instant,
        wall: Timestamp,
    ) -> io::Result<PodRuntime> {
        let spec = pod.spec.clone().unwrap_or_default();
        let qos = decide::qos_from_status(
            pod.status.as_ref().and_then(|s| s.qos_class.as_deref()),
            &spec,
        );
        let cgroup = self
            .cfg
            .node_cgroup
            .join(decide::pod_cgroup(self.cfg.driver, qos, uid));
        self.cgroups.create(&cgroup)?;
        if let Some(limit) = decide::pod_memory_limit(&spec) {
            self.cgroups.set_memory_limit(&cgroup, limit)?;
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let log_dir = self.cfg.log_dir.join(format!("{namespace}_{name}_{uid}"));
        fs::create_dir_all(&log_dir)?;
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| {
                ContainerRuntime::new(c, true, c.restart_policy.as_deref() == Some("Always"), now)
            })
            .collect();
        let containers = spec
            .containers
            .iter()
            .map(|c| ContainerRuntime::new(c, false, false, now))
            .collect();
        let node_critical = spec.priority_class_name.as_deref() == Some("system-node-critical");
        let mut conditions = BTreeMap::new();
        conditions.insert("PodReadyToStartContainers", (true, wall));
        Ok(PodRuntime {
            namespace,
            name,
            uid: uid.to_owned(),
            qos,
            cgroup,
            log_dir,
            restart_policy: spec
                .restart_policy
                .clone()
                .unwrap_or_else(|| "Always".to_owned()),
            node_critical,
            spec,
            start_time: wall,
            init,
            containers,
            init_done: false,
            init_failed: false,
            terminating: None,
            finalized: None,
            conditions,
            last_sent: None,
        })
    }

    fn step(
        &mut self,
        rt: &mut PodRuntime,
        now: Instant,
        wall: Timestamp,
        actions: &mut Vec<ApiAction>,
    ) {
        self.reap(rt, now, wall);
        if rt.terminating.is_some() {
            self.step_terminating(rt, now, wall, actions);
            return;
        }
        self.start_due(rt, now, wall);
        // A container that failed to start (exec error) has exited already.
        self.reap(rt, now, wall);
        // A pod that ran to completion keeps its status but not its cgroups, as the kubelet's
        // pod cgroup cleanup for terminated pods.
        let phases: Vec<ContainerPhase> = rt.containers.iter().map(|c| c.phase()).collect();
        let phase = decide::pod_phase(&rt.restart_policy, rt.init_done, rt.init_failed, &phases);
        if matches!(phase, "Succeeded" | "Failed")
            && rt.init.iter().all(|c| c.running().is_none())
            && self.cgroups.layout().memory_dir(&rt.cgroup).exists()
            && let Err(e) = self.cgroups.remove_tree(&rt.cgroup)
        {
            warn!(pod = %format!("{}/{}", rt.namespace, rt.name), error = %e,
                  "cannot remove the cgroup of a finished pod");
        }
        if let Some(status) = rt.status_value(&self.cfg, wall)
            && rt.last_sent.as_ref() != Some(&status)
        {
            rt.last_sent = Some(status.clone());
            actions.push(rt.status_action(status));
        }
    }

    fn step_terminating(
        &mut self,
        rt: &mut PodRuntime,
        now: Instant,
        wall: Timestamp,
        actions: &mut Vec<ApiAction>,
    ) {
        let any_running = rt
            .init
            .iter()
            .chain(&rt.containers)
            .any(|c| c.running().is_some());
        if any_running {
            let Some(t) = rt.terminating.as_mut() else {
                return;
            };
            if now >= t.deadline && !t.killed {
                info!(pod = %format!("{}/{}", rt.namespace, rt.name),
                      "grace period over; killing the pod's processes");
                t.killed = true;
                self.cgroups.signal_all(&rt.cgroup, Signal::SIGKILL);
            }
            return;
        }
        if let Some(at) = rt.finalized {
            // Asked already; ask again if the pod is still there a while later.
            if now.duration_since(at) < Duration::from_secs(2) {
                return;
            }
        } else {
            // Every container has exited: tear down the pod cgroup, report, finalize.
            self.cgroups.kill_all(&rt.cgroup, Duration::from_secs(5));
            if let Err(e) = self.cgroups.remove_tree(&rt.cgroup) {
                warn!(pod = %format!("{}/{}", rt.namespace, rt.name), error = %e,
                      "cannot remove the pod cgroup");
            }
            if let Some(status) = rt.status_value(&self.cfg, wall) {
                rt.last_sent = Some(status.clone());
                actions.push(rt.status_action(status));
            }
        }
        rt.finalized = Some(now);
        actions.push(ApiAction::Finalize {
            namespace: rt.namespace.clone(),
            name: rt.name.clone(),
            uid: rt.uid.clone(),
        });
    }

    /// Starts the containers that are due: init containers in order, then (once they are done)
    /// the regular ones.
    fn start_due(&mut self, rt: &mut PodRuntime, now: Instant, wall: Timestamp) {
        if !rt.init_done && !rt.init_failed {
            let mut all_done = true;
            for i in 0..rt.init.len() {
                let c = &rt.init[i];
                let done = match &c.state {
                    CState::Running(_) => c.sidecar,
                    CState::Terminated(t) => t.exit_code == 0 && !c.sidecar,
                    CState::Waiting { .. } => false,
                };
                if done {
                    continue;
                }
                all_done = false;
                if let CState::Terminated(_) = c.state {
                    // Failed for good (restartPolicy Never).
                    rt.init_failed = true;
                    break;
                }
                if matches!(c.state, CState::Waiting { not_before, .. } if not_before <= now) {
                    let mut c =
                        std::mem::replace(&mut rt.init[i], ContainerRuntime::placeholder(now));
                    self.start(rt, &mut c, wall);
                    rt.init[i] = c;
                }
                break;
            }
            if all_done {
                rt.init_done = true;
                rt.set_condition("Initialized", true, wall);
            }
        }
        if rt.init_done {
            let due: Vec<usize> = (0..rt.containers.len())
                .filter(|i| {
                    matches!(rt.containers[*i].state,
                             CState::Waiting { not_before, .. } if not_before <= now)
                })
                .collect();
            for i in due {
                let mut c =
                    std::mem::replace(&mut rt.containers[i], ContainerRuntime::placeholder(now));
                self.start(rt, &mut c, wall);
                rt.containers[i] = c;
            }
            // Sidecars restart like regular containers once the pod is initialized.
            let due: Vec<usize> = (0..rt.init.len())
                .filter(|i| {
                    rt.init[*i].sidecar
                        && matches!(rt.init[*i].state,
                                    CState::Waiting { not_before, .. } if not_before <= now)
                })
                .collect();
            for i in due {
                let mut c = std::mem::replace(&mut rt.init[i], ContainerRuntime::placeholder(now));
                self.start(rt, &mut c, wall);
                rt.init[i] = c;
            }
        }
    }

    /// Starts one container: a fresh ID and cgroup, its memory limit, its process.
    fn start(&mut self, rt: &PodRuntime, c: &mut ContainerRuntime, wall: Timestamp) {
        if c.last.is_some() {
            c.restart_count += 1;
        }
        let id = container_id();
        let cgroup = rt
            .cgroup
            .join(decide::container_cgroup(self.cfg.driver, &id));
        let log = rt
            .log_dir
            .join(&c.spec.name)
            .join(format!("{}.log", c.restart_count));
        match self.spawn_container(rt, c, &cgroup, &log) {
            Ok(child) => {
                debug!(pod = %format!("{}/{}", rt.namespace, rt.name), container = %c.spec.name,
                       pid = child.id(), %id, "container started");
                c.state = CState::Running(Running {
                    child,
                    id,
                    cgroup,
                    started_at: wall,
                    log,
                });
            }
            Err(message) => {
                warn!(pod = %format!("{}/{}", rt.namespace, rt.name), container = %c.spec.name,
                      %message, "container failed to start");
                let _ = self.cgroups.remove(&cgroup);
                // containerd reports a failed exec as a terminated container, exit code 128.
                let t = Terminated {
                    exit_code: 128,
                    reason: "StartError".to_owned(),
                    message: Some(message),
                    started_at: None,
                    finished_at: wall,
                    id: Some(id),
                };
                self.after_exit(rt, c, t, Instant::now());
            }
        }
    }

    fn spawn_container(
        &self,
        rt: &PodRuntime,
        c: &ContainerRuntime,
        cgroup: &Path,
        log: &Path,
    ) -> Result<Child, String> {
        let env = container_env(rt, &c.spec, &self.cfg);
        let command: Vec<String> = c.spec.command.clone().unwrap_or_default();
        let args: Vec<String> = c.spec.args.clone().unwrap_or_default();
        let argv: Vec<String> = if command.is_empty() {
            // No command: the image's entrypoint would run, which does not exist here. A sleeper
            // stands in for it so the container still has a process in its cgroup.
            vec!["sleep".to_owned(), "infinity".to_owned()]
        } else {
            command
                .iter()
                .chain(&args)
                .map(|a| decide::expand(a, &env))
                .collect()
        };
        let program = resolve(&argv[0])?;
        self.cgroups
            .create(cgroup)
            .map_err(|e| format!("create cgroup: {e}"))?;
        if let Some(limit) = decide::memory_limit(&c.spec) {
            self.cgroups
                .set_memory_limit(cgroup, limit)
                .map_err(|e| format!("set memory limit: {e}"))?;
        }
        if let Some(dir) = log.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        }
        let out = fs::File::create(log).map_err(|e| format!("create {}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| format!("dup log fd: {e}"))?;
        let procs = self
            .cgroups
            .procs_files(cgroup)
            .map_err(|e| format!("cgroup: {e}"))?;
        let oom_adj = decide::oom_score_adj(
            rt.qos,
            rt.node_critical,
            decide::memory_request(&c.spec),
            self.cfg.memory_capacity,
        )
        .to_string();
        let mut cmd = Command::new(&program);
        cmd.args(&argv[1..])
            .env_clear()
            .envs(&env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(wd) = c
            .spec
            .working_dir
            .as_deref()
            .filter(|d| Path::new(d).is_dir())
        {
            cmd.current_dir(wd);
        }
        // SAFETY: only open/write/setsid between fork and exec; paths and values were built
        // before the fork (short paths use std's stack buffer for the C string).
        unsafe {
            cmd.pre_exec(move || {
                for p in &procs {
                    let mut f = fs::OpenOptions::new().write(true).open(p)?;
                    f.write_all(b"0")?;
                }
                // Lowering below the current value needs CAP_SYS_RESOURCE, which the host may
                // withhold; the container then keeps the inherited score.
                if let Ok(mut f) = fs::OpenOptions::new()
                    .write(true)
                    .open("/proc/self/oom_score_adj")
                {
                    let _ = f.write_all(oom_adj.as_bytes());
                }
                // Its own session and process group, like a container's init.
                libc::setsid();
                Ok(())
            });
        }
        let child = self
            .spawner
            .spawn(cmd)
            .map_err(|e| format!("start {}: {e}", program.display()))?;
        Ok(child)
    }

    /// Collects containers whose main process exited.
    fn reap(&mut self, rt: &mut PodRuntime, now: Instant, wall: Timestamp) {
        for which in [true, false] {
            let n = if which {
                rt.init.len()
            } else {
                rt.containers.len()
            };
            for i in 0..n {
                let c = if which {
                    &mut rt.init[i]
                } else {
                    &mut rt.containers[i]
                };
                let CState::Running(r) = &mut c.state else {
                    continue;
                };
                let status = match r.child.try_wait() {
                    Ok(Some(s)) => s,
                    Ok(None) => continue,
                    Err(e) => {
                        warn!(error = %e, "wait for a container process");
                        continue;
                    }
                };
                // Read before the cgroup goes: did the OOM killer act in this container?
                let oom = self.cgroups.oom_kills(&r.cgroup) > 0;
                // The main process is the container's init: when it exits, the rest goes too.
                self.cgroups.kill_all(&r.cgroup, Duration::from_secs(5));
                if let Err(e) = self.cgroups.remove(&r.cgroup) {
                    warn!(error = %e, "cannot remove a container cgroup");
                }
                let code = exit_code(status);
                let reason = if oom {
                    "OOMKilled"
                } else if code == 0 {
                    "Completed"
                } else {
                    "Error"
                };
                info!(pod = %format!("{}/{}", rt.namespace, rt.name), container = %c.spec.name,
                      exit_code = code, reason, "container exited");
                let t = Terminated {
                    exit_code: code,
                    reason: reason.to_owned(),
                    message: None,
                    started_at: Some(r.started_at),
                    finished_at: wall,
                    id: Some(r.id.clone()),
                };
                let mut c = std::mem::replace(c, ContainerRuntime::placeholder(now));
                self.after_exit(rt, &mut c, t, now);
                if which {
                    rt.init[i] = c;
                } else {
                    rt.containers[i] = c;
                }
            }
        }
    }

    /// Restart or not, per the restart policy and the back-off.
    fn after_exit(&self, rt: &PodRuntime, c: &mut ContainerRuntime, t: Terminated, now: Instant) {
        let restart = if rt.terminating.is_some() {
            false
        } else if c.sidecar {
            true
        } else if c.init {
            // Init containers are retried on failure unless the pod never restarts.
            t.exit_code != 0 && rt.restart_policy != "Never"
        } else {
            decide::should_restart(&rt.restart_policy, t.exit_code)
        };
        if restart {
            let n = u32::try_from(c.restart_count + 1).unwrap_or(u32::MAX);
            let delay = decide::restart_delay(n, self.cfg.backoff_base, self.cfg.backoff_max);
            c.state = CState::Waiting {
                reason: if delay.is_zero() {
                    "ContainerCreating".to_owned()
                } else {
                    "CrashLoopBackOff".to_owned()
                },
                message: (!delay.is_zero()).then(|| {
                    format!(
                        "back-off {}s restarting failed container={} pod={}_{}({})",
                        delay.as_secs(),
                        c.spec.name,
                        rt.name,
                        rt.namespace,
                        rt.uid
                    )
                }),
                not_before: now + delay,
            };
            c.last = Some(t);
        } else {
            c.state = CState::Terminated(t);
        }
    }

    /// Kills everything of a pod at once and removes its cgroups (the pod left the API, or the
    /// stand-in stops).
    fn kill_pod(&mut self, rt: &mut PodRuntime, wall: Timestamp) {
        self.cgroups.kill_all(&rt.cgroup, Duration::from_secs(5));
        for c in rt.init.iter_mut().chain(rt.containers.iter_mut()) {
            if let CState::Running(r) = &mut c.state {
                let _ = r.child.kill();
                let _ = r.child.wait();
                c.state = CState::Terminated(Terminated {
                    exit_code: 137,
                    reason: "Error".to_owned(),
                    message: None,
                    started_at: Some(r.started_at),
                    finished_at: wall,
                    id: Some(r.id.clone()),
                });
            }
        }
        if let Err(e) = self.cgroups.remove_tree(&rt.cgroup) {
            warn!(pod = %format!("{}/{}", rt.namespace, rt.name), error = %e,
                  "cannot remove the pod cgroup");
        }
    }

    /// Kills every pod's processes and removes their cgroups.
    pub fn shutdown(&mut self) {
        self.closed = true;
        let wall = Timestamp::now();
        let uids: Vec<String> = self.pods.keys().cloned().collect();
        for uid in uids {
            if let Some(mut rt) = self.pods.remove(&uid) {
                self.kill_pod(&mut rt, wall);
            }
        }
    }
}

fn finalize_action(pod: &Pod, uid: &str) -> ApiAction {
    ApiAction::Finalize {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        name: pod.metadata.name.clone().unwrap_or_default(),
        uid: uid.to_owned(),
    }
}

/// The container's environment: a default `PATH` and `HOSTNAME`, then `env` in order with `value`
/// (expanded against what came before) or the supported `fieldRef`s. `envFrom`, ConfigMap and
/// Secret references are not resolved.
fn container_env(rt: &PodRuntime, c: &Container, cfg: &RuntimeConfig) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        (
            "PATH".to_owned(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned(),
        ),
        ("HOSTNAME".to_owned(), rt.name.clone()),
    ]);
    for e in c.env.iter().flatten() {
        let value = if let Some(v) = &e.value {
            Some(decide::expand(v, &env))
        } else if let Some(f) = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()) {
            match f.field_path.as_str() {
                "metadata.name" => Some(rt.name.clone()),
                "metadata.namespace" => Some(rt.namespace.clone()),
                "metadata.uid" => Some(rt.uid.clone()),
                "spec.nodeName" => Some(cfg.node_name.clone()),
                "spec.serviceAccountName" => rt.spec.service_account_name.clone(),
                "status.podIP" | "status.hostIP" => Some(cfg.node_ip.clone()),
                _ => None,
            }
        } else {
            None
        };
        env.insert(e.name.clone(), value.unwrap_or_default());
    }
    env
}

impl PodRuntime {
    fn info(&self) -> PodInfo {
        PodInfo {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            qos: self.qos,
            cgroup: self.cgroup.clone(),
            containers: self
                .init
                .iter()
                .chain(&self.containers)
                .filter_map(|c| {
                    c.running().map(|r| ContainerInfo {
                        name: c.spec.name.clone(),
                        id: r.id.clone(),
                        cgroup: r.cgroup.clone(),
                        pid: r.child.id(),
                        log: r.log.clone(),
                    })
                })
                .collect(),
            terminating: self.terminating.is_some(),
        }
    }

    fn begin_termination(&mut self, deadline: Instant) {
        self.terminating = Some(Terminating {
            deadline,
            killed: false,
        });
        for c in self.init.iter().chain(&self.containers) {
            if let Some(r) = c.running()
                && let Ok(pid) = i32::try_from(r.child.id())
            {
                // SIGTERM to the container's init, as the runtime's StopContainer does.
                let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        // Containers that never started will not start any more.
        for c in self.init.iter_mut().chain(self.containers.iter_mut()) {
            if let CState::Waiting { not_before, .. } = &mut c.state {
                *not_before = deadline + Duration::from_secs(365 * 24 * 3600);
            }
        }
    }

    fn set_condition(&mut self, ty: &'static str, status: bool, wall: Timestamp) {
        match self.conditions.get(ty) {
            Some((s, _)) if *s == status => {}
            _ => {
                self.conditions.insert(ty, (status, wall));
            }
        }
    }

    fn status_action(&self, status: serde_json::Value) -> ApiAction {
        ApiAction::Status {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            status,
        }
    }

    /// The pod status the kubelet would report now (`kubelet_pods.go`, `generateAPIPodStatus`).
    fn status_value(&mut self, cfg: &RuntimeConfig, wall: Timestamp) -> Option<serde_json::Value> {
        let terminating = self.terminating.is_some();
        let all_stopped = self
            .init
            .iter()
            .chain(&self.containers)
            .all(|c| c.running().is_none());
        let phases: Vec<ContainerPhase> = self.containers.iter().map(|c| c.phase()).collect();
        let phase = if terminating && all_stopped {
            let codes: Vec<i32> = self
                .containers
                .iter()
                .filter_map(|c| match &c.state {
                    CState::Terminated(t) => Some(t.exit_code),
                    _ => None,
                })
                .collect();
            decide::terminal_phase(&codes)
        } else {
            decide::pod_phase(
                &self.restart_policy,
                self.init_done,
                self.init_failed,
                &phases,
            )
        };
        let ready = !terminating
            && self.init_done
            && self.containers.iter().all(|c| c.running().is_some())
            && self
                .init
                .iter()
                .filter(|c| c.sidecar)
                .all(|c| c.running().is_some());
        let sandbox = !(terminating && all_stopped);
        self.set_condition("PodReadyToStartContainers", sandbox, wall);
        self.set_condition("Initialized", self.init_done, wall);
        self.set_condition("ContainersReady", ready, wall);
        self.set_condition("Ready", ready, wall);
        let conditions = self
            .conditions
            .iter()
            .map(|(ty, (s, at))| PodCondition {
                type_: (*ty).to_owned(),
                status: if *s { "True" } else { "False" }.to_owned(),
                last_transition_time: Some(Time(*at)),
                ..PodCondition::default()
            })
            .collect();
        let status = PodStatus {
            phase: Some(phase.to_owned()),
            conditions: Some(conditions),
            host_ip: Some(cfg.node_ip.clone()),
            host_ips: Some(vec![HostIP {
                ip: cfg.node_ip.clone(),
            }]),
            pod_ip: Some(cfg.node_ip.clone()),
            pod_ips: Some(vec![PodIP {
                ip: cfg.node_ip.clone(),
            }]),
            start_time: Some(Time(self.start_time)),
            init_container_statuses: (!self.init.is_empty())
                .then(|| self.init.iter().map(|c| c.status(ready)).collect()),
            container_statuses: Some(self.containers.iter().map(|c| c.status(ready)).collect()),
            ..PodStatus::default()
        };
        serde_json::to_value(status).ok()
    }
}

impl ContainerRuntime {
    fn status(&self, pod_ready: bool) -> ContainerStatus {
        let terminated = |t: &Terminated| ContainerState {
            terminated: Some(ContainerStateTerminated {
                exit_code: t.exit_code,
                reason: Some(t.reason.clone()),
                message: t.message.clone(),
                started_at: t.started_at.map(Time),
                finished_at: Some(Time(t.finished_at)),
                container_id: t.id.as_ref().map(|id| format!("containerd://{id}")),
                ..ContainerStateTerminated::default()
            }),
            ..ContainerState::default()
        };
        let (state, id) = match &self.state {
            CState::Waiting {
                reason, message, ..
            } => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(reason.clone()),
                        message: message.clone(),
                    }),
                    ..ContainerState::default()
                },
                self.last.as_ref().and_then(|t| t.id.clone()),
            ),
            CState::Running(r) => (
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(r.started_at)),
                    }),
                    ..ContainerState::default()
                },
                Some(r.id.clone()),
            ),
            CState::Terminated(t) => (terminated(t), t.id.clone()),
        };
        let running = self.running().is_some();
        let image = self.spec.image.clone().unwrap_or_default();
        ContainerStatus {
            name: self.spec.name.clone(),
            image: image.clone(),
            image_id: image,
            container_id: id.map(|id| format!("containerd://{id}")),
            ready: running && (pod_ready || self.sidecar),
            started: Some(running),
            restart_count: self.restart_count,
            state: Some(state),
            last_state: Some(self.last.as_ref().map(terminated).unwrap_or_default()),
            ..ContainerStatus::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_64_hex_digits_and_distinct() {
        let a = container_id();
        let b = container_id();
        assert_eq!(a.len(), 64);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn programs_resolve_like_a_runtime() {
        assert!(resolve("sh").is_ok());
        assert_eq!(
            resolve("no-such-program-anywhere").expect_err("missing"),
            "exec: \"no-such-program-anywhere\": executable file not found in $PATH"
        );
        assert!(
            resolve("/no/such/file")
                .expect_err("missing")
                .contains("no such file")
        );
    }
}
