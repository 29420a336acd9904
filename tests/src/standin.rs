//! A kubelet stand-in (KWOK-style, but with real processes) for the control-plane and end-to-end
//! tiers.
//!
//! [`StandIn::start`] registers a Node whose memory capacity is its node cgroup's memory limit,
//! keeps the kubelet-owned conditions and the node Lease fresh, binds unscheduled pods to its node
//! when they fit (the scheduler's basic filters), runs each bound pod's containers as real
//! processes in kubelet-layout cgroups under the node cgroup, reports their status (OOMKilled
//! included) and restarts them per the restart policy, and — when the API deletes a pod, e.g.
//! after an eviction — stops its processes within the grace period and completes the deletion.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), node_monitor_tests::standin::Error> {
//! use node_monitor_tests::{cgroup::TestCgroups, standin::{StandIn, StandInConfig}};
//! let mut cgroups = TestCgroups::new("e2e"); // drop it after the stand-in
//! cgroups.create("node-a").expect("node cgroup");
//! let cfg = StandInConfig::new("node-a", cgroups.rel_root().join("node-a"))
//!     .memory(1 << 30)
//!     .label("topology.kubernetes.io/zone", "zone-a");
//! let standin = StandIn::start(client, cfg).await?;
//! standin.wait_ready(std::time::Duration::from_secs(30)).await?;
//! // ... create pods; standin.pods() shows where their processes run ...
//! standin.stop().await?;
//! # Ok(()) }
//! ```
pub mod cgroups;
pub mod decide;
pub mod node;
pub mod pods;

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use k8s_openapi::{
    api::core::v1::{Binding, Node, ObjectReference, Pod, Taint},
    apimachinery::pkg::api::resource::Quantity,
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions},
    runtime::{
        WatchStreamExt as _,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
pub use node_monitor_core::kubelet::layout::{CgroupDriver, QosClass};
use serde_json::json;
use tokio::{sync::Notify, task::JoinHandle};
use tracing::{debug, info, warn};

pub use self::pods::{ContainerInfo, PodInfo};
use self::{
    cgroups::{Cgroups, Layout},
    node::{ConditionState, NodeFacts, Resources},
    pods::{ApiAction, Runtime, RuntimeConfig},
};
use crate::control_plane::process::Spawner;

/// Errors of the kubelet stand-in.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid stand-in configuration: {field} = {value:?}: {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: String,
    },
    #[error("cgroups of node {node}")]
    Cgroup {
        node: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{action}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("the registered node {node} has no uid")]
    MissingUid { node: String },
    #[error("start the process spawner of node {node}")]
    Spawner {
        node: String,
        #[source]
        source: std::io::Error,
    },
    #[error("state directory {path}")]
    StateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("node {node} is not {what} after {timeout:?}")]
    Timeout {
        node: String,
        what: &'static str,
        timeout: Duration,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the stand-in presents its node. Fields are public; [`StandInConfig::new`] sets the
/// defaults and the builder methods cover the common changes.
#[derive(Debug, Clone)]
pub struct StandInConfig {
    pub node_name: String,
    /// The node cgroup, relative to the hierarchy roots (e.g. `TestCgroups::rel_root()` joined
    /// with a node directory); must lie under `node-monitor-test/`. Created when missing.
    pub cgroup_root: PathBuf,
    /// cgroupfs (default) or systemd naming of the kubelet layout.
    pub cgroup_driver: CgroupDriver,
    /// Node memory capacity in bytes: written as the node cgroup's limit. `None`: read the node
    /// cgroup's existing limit (which must be set).
    pub memory_capacity: Option<u64>,
    /// `--system-reserved` + `--kube-reserved` memory: subtracted from allocatable and from the
    /// `kubepods` cgroup limit (enforce-node-allocatable=pods).
    pub memory_reserved: u64,
    /// The kubelet's hard `memory.available` threshold, subtracted from allocatable only
    /// (`pkg/kubelet/cm/node_container_manager_linux.go`, `GetNodeAllocatableAbsolute`).
    pub eviction_hard_memory: u64,
    /// CPU capacity (a quantity, e.g. `"2"`).
    pub cpu: String,
    /// Pod capacity.
    pub max_pods: u32,
    /// Ephemeral-storage capacity (a quantity).
    pub ephemeral_storage: String,
    /// Node labels, added to `kubernetes.io/hostname`, `kubernetes.io/os`, `kubernetes.io/arch`.
    pub labels: BTreeMap<String, String>,
    /// Taints to register with (`--register-with-taints`).
    pub taints: Vec<Taint>,
    /// How often the Lease is renewed (the kubelet: 10 s).
    pub lease_interval: Duration,
    /// `spec.leaseDurationSeconds` (the kubelet: 40).
    pub lease_duration_seconds: i32,
    /// How often the node status (conditions, heartbeat) is pushed (the kubelet: 10 s).
    pub status_interval: Duration,
    /// CrashLoopBackOff base and cap (the kubelet: 10 s, 300 s).
    pub restart_backoff: Duration,
    pub restart_backoff_max: Duration,
    /// Bind unscheduled pods to this node when they fit.
    pub bind_pods: bool,
    /// How often running pods are checked for exits and terminations when nothing else wakes
    /// the stand-in.
    pub sync_interval: Duration,
    /// The node's InternalIP (also every pod's IP: pods share the host network).
    pub node_ip: String,
    /// `status.nodeInfo.kubeletVersion`.
    pub kubelet_version: String,
    /// Container logs go here (`<namespace>_<name>_<uid>/<container>/<n>.log`). `None`: a
    /// temporary directory removed on stop.
    pub state_dir: Option<PathBuf>,
}

impl StandInConfig {
    /// Defaults: cgroupfs naming, capacity from the node cgroup's limit, 2 CPUs, 110 pods, 10 Gi
    /// ephemeral storage, lease renewed every 2 s, status every 10 s, back-off 10 s…300 s.
    pub fn new(node_name: impl Into<String>, cgroup_root: impl Into<PathBuf>) -> Self {
        Self {
            node_name: node_name.into(),
            cgroup_root: cgroup_root.into(),
            cgroup_driver: CgroupDriver::Cgroupfs,
            memory_capacity: None,
            memory_reserved: 0,
            eviction_hard_memory: 0,
            cpu: "2".to_owned(),
            max_pods: 110,
            ephemeral_storage: "10Gi".to_owned(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            lease_interval: Duration::from_secs(2),
            lease_duration_seconds: 40,
            status_interval: Duration::from_secs(10),
            restart_backoff: Duration::from_secs(10),
            restart_backoff_max: Duration::from_secs(300),
            bind_pods: true,
            sync_interval: Duration::from_millis(100),
            node_ip: "127.0.0.1".to_owned(),
            kubelet_version: crate::control_plane::K8S_VERSION.to_owned(),
            state_dir: None,
        }
    }

    /// Sets the memory capacity (bytes), written as the node cgroup's limit.
    pub fn memory(mut self, bytes: u64) -> Self {
        self.memory_capacity = Some(bytes);
        self
    }

    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn taint(mut self, key: &str, value: Option<&str>, effect: &str) -> Self {
        self.taints.push(Taint {
            key: key.to_owned(),
            value: value.map(str::to_owned),
            effect: effect.to_owned(),
            ..Taint::default()
        });
        self
    }

    pub fn driver(mut self, driver: CgroupDriver) -> Self {
        self.cgroup_driver = driver;
        self
    }

    pub fn lease_interval(mut self, every: Duration) -> Self {
        self.lease_interval = every;
        self
    }

    pub fn status_interval(mut self, every: Duration) -> Self {
        self.status_interval = every;
        self
    }

    pub fn restart_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.restart_backoff = base;
        self.restart_backoff_max = max;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |field, value: String, reason: &str| Error::Config {
            field,
            value,
            reason: reason.to_owned(),
        };
        let name_ok = !self.node_name.is_empty()
            && self.node_name.len() <= 253
            && self
                .node_name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && self
                .node_name
                .starts_with(|c: char| c.is_ascii_alphanumeric())
            && self
                .node_name
                .ends_with(|c: char| c.is_ascii_alphanumeric());
        if !name_ok {
            return Err(bad(
                "node_name",
                self.node_name.clone(),
                "must be a DNS subdomain (lower-case letters, digits, '-' and '.')",
            ));
        }
        cgroups::check_rel(&self.cgroup_root).map_err(|e| {
            bad(
                "cgroup_root",
                self.cgroup_root.display().to_string(),
                &e.to_string(),
            )
        })?;
        for (field, d) in [
            ("lease_interval", self.lease_interval),
            ("status_interval", self.status_interval),
            ("sync_interval", self.sync_interval),
        ] {
            if d.is_zero() {
                return Err(bad(field, format!("{d:?}"), "must be positive"));
            }
        }
        if decide::parse_quantity_milli(&self.cpu).is_none() {
            return Err(bad("cpu", self.cpu.clone(), "not a quantity"));
        }
        if decide::parse_quantity(&self.ephemeral_storage).is_none() {
            return Err(bad(
                "ephemeral_storage",
                self.ephemeral_storage.clone(),
                "not a quantity",
            ));
        }
        if self.memory_capacity == Some(0) {
            return Err(bad("memory_capacity", "0".to_owned(), "must be positive"));
        }
        Ok(())
    }
}

/// Bytes as the kubelet writes memory quantities (`…Ki` when whole kibibytes).
fn bytes_quantity(b: u64) -> Quantity {
    if b.is_multiple_of(1024) {
        Quantity(format!("{}Ki", b / 1024))
    } else {
        Quantity(b.to_string())
    }
}

struct Shared {
    cfg: StandInConfig,
    client: Client,
    facts: NodeFacts,
    resources: Resources,
    node_uid: String,
    runtime: Mutex<Runtime>,
    conditions: Mutex<BTreeMap<String, ConditionState>>,
    renewing: AtomicBool,
    paused: AtomicBool,
    wake: Notify,
    status_wake: Notify,
    bound: Store<Pod>,
    pending: Store<Pod>,
    node: Store<Node>,
}

impl Shared {
    fn runtime(&self) -> MutexGuard<'_, Runtime> {
        // A panic while the lock was held leaves the runtime usable: its state is per pod.
        self.runtime.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn conditions(&self) -> MutexGuard<'_, BTreeMap<String, ConditionState>> {
        self.conditions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn active(&self) -> bool {
        !self.paused.load(Ordering::Relaxed)
    }

    fn heartbeating(&self) -> bool {
        self.active() && self.renewing.load(Ordering::Relaxed)
    }
}

enum StateDir {
    Temp(tempfile::TempDir),
    Kept(PathBuf),
}

impl StateDir {
    fn path(&self) -> &Path {
        match self {
            Self::Temp(t) => t.path(),
            Self::Kept(p) => p,
        }
    }
}

/// A running kubelet stand-in. [`StandIn::stop`] or dropping it kills every pod process and
/// removes the cgroups it created; the Node object stays in the API, as a stopped kubelet's does.
pub struct StandIn {
    shared: Arc<Shared>,
    tasks: Vec<JoinHandle<()>>,
    cgroups: Cgroups,
    /// Node-cgroup directories this stand-in created (removed on stop), parents first.
    created: Vec<PathBuf>,
    memory_capacity: u64,
    memory_allocatable: u64,
    state_dir: Option<StateDir>,
    stopped: bool,
}

impl StandIn {
    /// Registers the node and starts the stand-in's loops. Returns once the node, its Lease and
    /// the pod watches are in place.
    pub async fn start(client: Client, cfg: StandInConfig) -> Result<StandIn> {
        cfg.validate()?;
        let name = cfg.node_name.clone();
        let cg_err = |source| Error::Cgroup {
            node: name.clone(),
            source,
        };
        let layout = Layout::detect().map_err(cg_err)?;
        let cgroups = Cgroups::new(layout);
        let mut created = cgroups.create(&cfg.cgroup_root).map_err(cg_err)?;
        // From here on, dropping `guard` undoes what was created if the start fails.
        let mut guard = CreatedGuard {
            cgroups: &cgroups,
            created: &mut created,
            armed: true,
        };
        let memory_capacity = memory_capacity(&cgroups, &cfg)?;
        let pods_limit = memory_capacity.saturating_sub(cfg.memory_reserved);
        let memory_allocatable = pods_limit.saturating_sub(cfg.eviction_hard_memory);
        if memory_allocatable == 0 {
            return Err(Error::Config {
                field: "memory_reserved",
                value: format!(
                    "{} + eviction_hard_memory {}",
                    cfg.memory_reserved, cfg.eviction_hard_memory
                ),
                reason: format!("leaves no allocatable memory of the capacity {memory_capacity}"),
            });
        }
        let kubepods = cfg
            .cgroup_root
            .join(decide::kubepods_cgroup(cfg.cgroup_driver));
        guard
            .created
            .extend(cgroups.create(&kubepods).map_err(cg_err)?);
        cgroups
            .set_memory_limit(&kubepods, pods_limit)
            .map_err(cg_err)?;

        let state_dir = state_dir(&cfg)?;

        let labels = node_labels(&cfg);
        let resources = node_resources(&cfg, memory_capacity, memory_allocatable);
        let facts = NodeFacts {
            name: name.clone(),
            ip: cfg.node_ip.clone(),
            kubelet_version: cfg.kubelet_version.clone(),
            reboots: Arc::default(),
        };
        let now = Timestamp::now();
        let conditions = node::kubelet_conditions(now);
        let node_obj = node::node(&facts, &labels, &cfg.taints, &resources, &conditions, now);
        let node_uid = node::register(&client, &node_obj, &facts, &resources, &conditions).await?;
        node::renew_lease(&client, &name, &node_uid, cfg.lease_duration_seconds, now).await?;
        info!(node = %name, memory_capacity, memory_allocatable,
              cgroup = %cfg.cgroup_root.display(), "node registered");

        let spawner =
            Spawner::new(&format!("nm-standin-{name}")).map_err(|source| Error::Spawner {
                node: name.clone(),
                source,
            })?;
        let runtime = Runtime::new(
            RuntimeConfig {
                node_name: name.clone(),
                node_ip: cfg.node_ip.clone(),
                driver: cfg.cgroup_driver,
                node_cgroup: cfg.cgroup_root.clone(),
                memory_capacity,
                backoff_base: cfg.restart_backoff,
                backoff_max: cfg.restart_backoff_max,
                log_dir: state_dir.path().join("pods"),
            },
            cgroups.clone(),
            spawner,
        );

        let (bound, bound_writer) = reflector::store::<Pod>();
        let (pending, pending_writer) = reflector::store::<Pod>();
        let (node_store, node_writer) = reflector::store::<Node>();
        let shared = Arc::new(Shared {
            cfg: cfg.clone(),
            client: client.clone(),
            facts,
            resources,
            node_uid,
            runtime: Mutex::new(runtime),
            conditions: Mutex::new(conditions),
            renewing: AtomicBool::new(true),
            paused: AtomicBool::new(false),
            wake: Notify::new(),
            status_wake: Notify::new(),
            bound: bound.clone(),
            pending: pending.clone(),
            node: node_store.clone(),
        });

        let tasks = spawn_watches(
            &shared,
            &client,
            Writers {
                bound: bound_writer,
                node: node_writer,
                pending: pending_writer,
            },
        );
        let mut standin = StandIn {
            shared: shared.clone(),
            tasks,
            cgroups: cgroups.clone(),
            created: Vec::new(),
            memory_capacity,
            memory_allocatable,
            state_dir: Some(state_dir),
            stopped: false,
        };
        // The stand-in owns the created cgroups now; its stop/Drop removes them.
        guard.armed = false;
        drop(guard);
        standin.created = created;

        let ready = async {
            bound.wait_until_ready().await.ok();
            node_store.wait_until_ready().await.ok();
            if cfg.bind_pods {
                pending.wait_until_ready().await.ok();
            }
        };
        if tokio::time::timeout(Duration::from_secs(30), ready)
            .await
            .is_err()
        {
            return Err(Error::Timeout {
                node: name,
                what: "watching its pods",
                timeout: Duration::from_secs(30),
            });
        }
        standin.tasks.push(tokio::spawn(lease_loop(shared.clone())));
        standin
            .tasks
            .push(tokio::spawn(status_loop(shared.clone())));
        standin.tasks.push(tokio::spawn(sync_loop(shared)));
        Ok(standin)
    }

    pub fn node_name(&self) -> &str {
        &self.shared.cfg.node_name
    }

    /// The node cgroup, relative to the hierarchy roots.
    pub fn cgroup_root(&self) -> &Path {
        &self.shared.cfg.cgroup_root
    }

    /// The cgroup hierarchies in use (for reading a pod's files: `layout().memory_dir(rel)`).
    pub fn layout(&self) -> &Layout {
        self.cgroups.layout()
    }

    /// The node's memory capacity in bytes (the node cgroup's limit).
    pub fn memory_capacity(&self) -> u64 {
        self.memory_capacity
    }

    /// The node's allocatable memory in bytes.
    pub fn memory_allocatable(&self) -> u64 {
        self.memory_allocatable
    }

    /// The node's UID in the API.
    pub fn node_uid(&self) -> &str {
        &self.shared.node_uid
    }

    /// Where container logs are written.
    pub fn state_dir(&self) -> Option<&Path> {
        self.state_dir.as_ref().map(StateDir::path)
    }

    /// Stops renewing the Lease and pushing node status (a kubelet cut off from the API); pods keep
    /// running and being handled.
    pub fn stop_renewing(&self) {
        self.shared.renewing.store(false, Ordering::Relaxed);
    }

    /// Renews the Lease and pushes the node status again, at once.
    pub fn resume_renewing(&self) {
        self.shared.renewing.store(true, Ordering::Relaxed);
        self.shared.status_wake.notify_one();
    }

    /// Freezes the whole stand-in, as if the kubelet died: no heartbeats, no pod starts, no
    /// deletions completed, no bindings. Processes already running keep running.
    pub fn pause(&self) {
        self.shared.paused.store(true, Ordering::Relaxed);
    }

    /// Resumes a paused stand-in as a rebooted node: the status it reports from now on carries a
    /// new `bootID`. (Its processes are not killed: pods force-deleted meanwhile are stopped by
    /// its sync as they would be by a kubelet after a reboot.)
    pub fn reboot(&self) {
        self.shared.facts.reboots.fetch_add(1, Ordering::Relaxed);
        self.resume();
    }

    /// Undoes [`StandIn::pause`].
    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::Relaxed);
        self.shared.wake.notify_one();
        self.shared.status_wake.notify_one();
    }

    /// Sets one of the conditions the stand-in reports (e.g. the kubelet's own `MemoryPressure`)
    /// and pushes the status at once.
    pub fn set_node_condition(&self, type_: &str, status: bool, reason: &str, message: &str) {
        let mut conds = self.shared.conditions();
        let since = match conds.get(type_) {
            Some(c) if c.status == status => c.since,
            _ => Timestamp::now(),
        };
        conds.insert(
            type_.to_owned(),
            ConditionState {
                status,
                reason: reason.to_owned(),
                message: message.to_owned(),
                since,
            },
        );
        drop(conds);
        self.shared.status_wake.notify_one();
    }

    /// The pods whose containers the stand-in runs or is stopping, with where each container's
    /// processes live.
    pub fn pods(&self) -> Vec<PodInfo> {
        self.shared.runtime().pods()
    }

    /// One pod by UID.
    pub fn pod(&self, uid: &str) -> Option<PodInfo> {
        self.pods().into_iter().find(|p| p.uid == uid)
    }

    /// Every process in the pod's cgroup (all containers, and what they forked).
    pub fn pod_pids(&self, uid: &str) -> Vec<i32> {
        self.shared.runtime().pod_pids(uid)
    }

    /// The pod's processes once its cgroup holds any, waiting up to 10 s: a pod is reported
    /// Running as its processes start, and they reach the cgroup's `cgroup.procs` a moment
    /// later under load. Empty when none arrived in time.
    pub async fn running_pod_pids(&self, uid: &str) -> Vec<i32> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let pids = self.pod_pids(uid);
            if !pids.is_empty() || Instant::now() > deadline {
                return pids;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the API shows the node Ready and its Lease exists.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.shared.client.clone());
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.shared.client.clone(), node::LEASE_NAMESPACE);
        let name = self.node_name();
        let deadline = Instant::now() + timeout;
        loop {
            let ready = nodes.get_opt(name).await.ok().flatten().is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            let lease = matches!(leases.get_opt(name).await, Ok(Some(_)));
            if ready && lease {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    node: name.to_owned(),
                    what: "Ready",
                    timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the loops, kills every pod process, removes the pod and node cgroups it created and
    /// its temporary state directory.
    pub async fn stop(mut self) -> Result<()> {
        for t in &self.tasks {
            t.abort();
        }
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        self.teardown()
    }

    fn teardown(&mut self) -> Result<()> {
        if self.stopped {
            return Ok(());
        }
        self.stopped = true;
        for t in &self.tasks {
            t.abort();
        }
        self.shared.runtime().shutdown();
        let node = self.node_name().to_owned();
        let mut first_err = None;
        let kubepods = self
            .shared
            .cfg
            .cgroup_root
            .join(decide::kubepods_cgroup(self.shared.cfg.cgroup_driver));
        if let Err(source) = self.cgroups.remove_tree(&kubepods) {
            first_err.get_or_insert(Error::Cgroup {
                node: node.clone(),
                source,
            });
        }
        for dir in self.created.iter().rev() {
            if let Err(source) = self.cgroups.remove(dir) {
                first_err.get_or_insert(Error::Cgroup {
                    node: node.clone(),
                    source,
                });
            }
        }
        self.cgroups.remove_shared_parent();
        if let Some(StateDir::Temp(t)) = self.state_dir.take() {
            let path = t.path().to_owned();
            if let Err(source) = t.close() {
                first_err.get_or_insert(Error::StateDir { path, source });
            }
        }
        info!(node = %node, "stand-in stopped");
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!(
                "stopping the kubelet stand-in: {}",
                crate::control_plane::error_chain(&e)
            );
        }
    }
}

/// Removes freshly created cgroups when the start fails half-way.
struct CreatedGuard<'a> {
    cgroups: &'a Cgroups,
    created: &'a mut Vec<PathBuf>,
    armed: bool,
}

impl Drop for CreatedGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            for dir in self.created.iter().rev() {
                let _ = self.cgroups.remove_tree(dir);
            }
            self.cgroups.remove_shared_parent();
        }
    }
}

/// The node's memory capacity: the configured one, set as the node cgroup's limit, or the node
/// cgroup's own limit.
fn memory_capacity(cgroups: &Cgroups, cfg: &StandInConfig) -> Result<u64> {
    let cg_err = |source| Error::Cgroup {
        node: cfg.node_name.clone(),
        source,
    };
    Ok(match cfg.memory_capacity {
        Some(m) => {
            cgroups
                .set_memory_limit(&cfg.cgroup_root, m)
                .map_err(cg_err)?;
            m
        }
        None => cgroups
            .memory_limit(&cfg.cgroup_root)
            .map_err(cg_err)?
            .ok_or_else(|| Error::Config {
                field: "memory_capacity",
                value: "None".to_owned(),
                reason: format!(
                    "the node cgroup {} has no memory limit to read the capacity from; set \
                     one or StandInConfig::memory",
                    cfg.cgroup_root.display()
                ),
            })?,
    })
}

/// The stand-in's state directory: the configured one, or a temporary one removed at the end.
fn state_dir(cfg: &StandInConfig) -> Result<StateDir> {
    let name = &cfg.node_name;
    let state_dir = match &cfg.state_dir {
        Some(p) => {
            std::fs::create_dir_all(p).map_err(|source| Error::StateDir {
                path: p.clone(),
                source,
            })?;
            StateDir::Kept(p.clone())
        }
        None => StateDir::Temp(
            tempfile::Builder::new()
                .prefix(&format!("nm-standin-{name}-"))
                .tempdir()
                .map_err(|source| Error::StateDir {
                    path: std::env::temp_dir(),
                    source,
                })?,
        ),
    };
    Ok(state_dir)
}

/// The node's labels: the kubelet's own (hostname, os, arch) and the configured ones.
fn node_labels(cfg: &StandInConfig) -> BTreeMap<String, String> {
    let name = &cfg.node_name;
    let mut labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), name.clone()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        (
            "kubernetes.io/arch".to_owned(),
            std::env::consts::ARCH
                .replace("x86_64", "amd64")
                .replace("aarch64", "arm64"),
        ),
    ]);
    labels.extend(cfg.labels.clone());
    labels
}

/// The node's capacity and allocatable: the configured CPU, pods and ephemeral storage, and
/// memory.
fn node_resources(cfg: &StandInConfig, memory_capacity: u64, memory_allocatable: u64) -> Resources {
    let quantities = |memory: u64| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cfg.cpu.clone())),
            ("memory".to_owned(), bytes_quantity(memory)),
            ("pods".to_owned(), Quantity(cfg.max_pods.to_string())),
            (
                "ephemeral-storage".to_owned(),
                Quantity(cfg.ephemeral_storage.clone()),
            ),
        ])
    };
    Resources {
        capacity: quantities(memory_capacity),
        allocatable: quantities(memory_allocatable),
    }
}

/// The reflectors' writers of the stand-in's stores.
struct Writers {
    bound: reflector::store::Writer<Pod>,
    node: reflector::store::Writer<Node>,
    pending: reflector::store::Writer<Pod>,
}

/// The watches that fill the stand-in's stores: its node's pods, its Node, and the
/// unscheduled pods when it binds them.
fn spawn_watches(shared: &Arc<Shared>, client: &Client, writers: Writers) -> Vec<JoinHandle<()>> {
    let name = &shared.cfg.node_name;
    let pods_api: Api<Pod> = Api::all(client.clone());
    let nodes_api: Api<Node> = Api::all(client.clone());
    let mut tasks = vec![
        spawn_watch(
            shared,
            "pods on the node",
            watcher(
                pods_api.clone(),
                watcher::Config::default().fields(&format!("spec.nodeName={name}")),
            )
            .default_backoff()
            .reflect(writers.bound),
        ),
        spawn_watch(
            shared,
            "nodes",
            watcher(
                nodes_api,
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            )
            .default_backoff()
            .reflect(writers.node),
        ),
    ];
    if shared.cfg.bind_pods {
        tasks.push(spawn_watch(
            shared,
            "unscheduled pods",
            watcher(
                pods_api,
                watcher::Config::default().fields("spec.nodeName="),
            )
            .default_backoff()
            .reflect(writers.pending),
        ));
    }
    tasks
}

fn spawn_watch<K, S>(shared: &Arc<Shared>, what: &'static str, stream: S) -> JoinHandle<()>
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                debug!(node = %shared.cfg.node_name, what, error = %e, "watch error; retrying");
            }
            shared.wake.notify_one();
        }
    })
}

async fn lease_loop(shared: Arc<Shared>) {
    loop {
        tokio::time::sleep(shared.cfg.lease_interval).await;
        if !shared.heartbeating() {
            continue;
        }
        if let Err(e) = node::renew_lease(
            &shared.client,
            &shared.cfg.node_name,
            &shared.node_uid,
            shared.cfg.lease_duration_seconds,
            Timestamp::now(),
        )
        .await
        {
            warn!(node = %shared.cfg.node_name, error = %crate::control_plane::error_chain(&e),
                  "lease renewal failed");
        }
    }
}

async fn status_loop(shared: Arc<Shared>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.cfg.status_interval) => {}
            () = shared.status_wake.notified() => {}
        }
        if !shared.heartbeating() {
            continue;
        }
        observe_transitions(&shared);
        let conds = shared.conditions().clone();
        if let Err(e) = node::push_status(
            &shared.client,
            &shared.facts,
            &shared.resources,
            &conds,
            Timestamp::now(),
        )
        .await
        {
            warn!(node = %shared.cfg.node_name, error = %crate::control_plane::error_chain(&e),
                  "node status update failed");
        }
    }
}

/// When the API shows one of the stand-in's conditions with another status (the node lifecycle
/// controller sets `Ready=Unknown` when heartbeats stop), reporting ours again is a transition:
/// the kubelet's setters compare with the node it read (`pkg/kubelet/nodestatus/setters.go`).
fn observe_transitions(shared: &Shared) {
    let Some(node) = shared.node.get(&ObjectRef::new(&shared.cfg.node_name)) else {
        return;
    };
    let api_conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut conds = shared.conditions();
    for c in api_conditions {
        if let Some(ours) = conds.get_mut(&c.type_) {
            let ours_str = if ours.status { "True" } else { "False" };
            if c.status != ours_str {
                ours.since = Timestamp::now();
            }
        }
    }
}

async fn sync_loop(shared: Arc<Shared>) {
    let mut bind_attempts: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(shared.cfg.sync_interval) => {}
            () = shared.wake.notified() => {}
        }
        if !shared.active() {
            continue;
        }
        let bound = shared.bound.state();
        let actions = shared
            .runtime()
            .sync(&bound, Instant::now(), Timestamp::now());
        for a in actions {
            execute(&shared, a).await;
        }
        if shared.cfg.bind_pods {
            schedule(&shared, &bound, &mut bind_attempts).await;
        }
    }
}

async fn execute(shared: &Shared, action: ApiAction) {
    match action {
        ApiAction::Status {
            namespace,
            name,
            uid,
            status,
        } => {
            let api: Api<Pod> = Api::namespaced(shared.client.clone(), &namespace);
            // The UID in the patch is a precondition, as in the kubelet's status manager: a pod
            // recreated under the same name is never written with another pod's status.
            let patch = json!({ "metadata": { "uid": uid }, "status": status });
            match api
                .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    warn!(pod = %format!("{namespace}/{name}"), error = %e,
                          "pod status update failed; retrying");
                    shared.runtime().status_failed(&uid);
                }
            }
        }
        ApiAction::Finalize {
            namespace,
            name,
            uid,
        } => {
            let api: Api<Pod> = Api::namespaced(shared.client.clone(), &namespace);
            let dp = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => info!(pod = %format!("{namespace}/{name}"), "pod deletion completed"),
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => warn!(pod = %format!("{namespace}/{name}"), error = %e,
                                "completing the pod deletion failed; retrying"),
            }
        }
    }
}

/// Binds unscheduled pods that fit this node, through the `pods/binding` subresource; the
/// apiserver rejects a second binding (409), so among several stand-ins the first one wins.
async fn schedule(shared: &Shared, bound: &[Arc<Pod>], attempts: &mut HashMap<String, Instant>) {
    let name = &shared.cfg.node_name;
    let Some(node) = shared.node.get(&ObjectRef::new(name)) else {
        return;
    };
    let mut view = node_view(&node, bound);
    let now = Instant::now();
    attempts.retain(|_, at| now.duration_since(*at) < Duration::from_secs(60));
    for pod in shared.pending.state() {
        let (Some(uid), Some(spec)) = (pod.metadata.uid.as_deref(), pod.spec.as_ref()) else {
            continue;
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if spec.node_name.as_deref().is_some_and(|n| !n.is_empty())
            || pod.metadata.deletion_timestamp.is_some()
            || matches!(phase, Some("Succeeded" | "Failed"))
            || spec
                .scheduler_name
                .as_deref()
                .is_some_and(|s| s != "default-scheduler")
        {
            continue;
        }
        if attempts
            .get(uid)
            .is_some_and(|at| now.duration_since(*at) < Duration::from_secs(1))
        {
            continue;
        }
        if let Err(why) = decide::fits(spec, &view) {
            debug!(node = %name, pod = ?pod.metadata.name, ?why, "pod does not fit");
            continue;
        }
        attempts.insert(uid.to_owned(), now);
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(pod_name.clone()),
                namespace: Some(namespace.clone()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(name.clone()),
                ..ObjectReference::default()
            },
        };
        let api: Api<Pod> = Api::namespaced(shared.client.clone(), &namespace);
        match api
            .create_subresource::<_, kube::core::Status>(
                "binding",
                &pod_name,
                &PostParams::default(),
                &binding,
            )
            .await
        {
            Ok(_) => {
                info!(node = %name, pod = %format!("{namespace}/{pod_name}"), "pod bound");
                let r = decide::pod_requests(spec);
                view.requested.cpu_milli += r.cpu_milli;
                view.requested.memory += r.memory;
                view.pod_count += 1;
            }
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                debug!(node = %name, pod = %format!("{namespace}/{pod_name}"),
                       "bound elsewhere or gone");
            }
            Err(e) => warn!(node = %name, pod = %format!("{namespace}/{pod_name}"), error = %e,
                            "binding failed"),
        }
    }
}

/// What the scheduler filters look at, from the node as the API shows it (taints and cordons
/// made by others included) and the pods already bound to it.
fn node_view(node: &Node, bound: &[Arc<Pod>]) -> decide::NodeView {
    let status = node.status.as_ref();
    let alloc = status.and_then(|s| s.allocatable.as_ref());
    let get = |k: &str| {
        alloc
            .and_then(|a| a.get(k))
            .and_then(|q| decide::parse_quantity_milli(&q.0))
            .unwrap_or(0)
    };
    let mut requested = decide::Requests::default();
    let mut pod_count = 0;
    for p in bound {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        if let Some(spec) = &p.spec {
            let r = decide::pod_requests(spec);
            requested.cpu_milli += r.cpu_milli;
            requested.memory += r.memory;
        }
        pod_count += 1;
    }
    decide::NodeView {
        name: node.metadata.name.clone().unwrap_or_default(),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        taints: node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
        unschedulable: node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        allocatable: decide::Requests {
            cpu_milli: get("cpu"),
            memory: (get("memory") + 999) / 1000,
        },
        max_pods: get("pods") / 1000,
        requested,
        pod_count,
    }
}
