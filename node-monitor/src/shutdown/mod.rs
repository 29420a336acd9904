//! The shutdown manager: graceful node shutdown through a systemd-logind delay inhibitor, with the
//! kubelet's priority-group semantics, acting through the Kubernetes API.
//!
//! Follows the kubelet's node shutdown manager
//! (`pkg/kubelet/nodeshutdown/nodeshutdown_manager_linux.go`):
//! 1. at start-up, raise logind's `InhibitDelayMaxSec` when it is shorter than the groups need
//!    (a drop-in and a reload) and take a `delay` inhibitor for `shutdown`;
//! 2. on `PrepareForShutdown(true)`, mark the node (condition, taint, optional cordon), then
//!    terminate its pods group by group, lowest priority first, each group until the API shows
//!    its pods gone or its period runs out; then release the lock (close the descriptor);
//! 3. on `PrepareForShutdown(false)` (cancelled), undo the marks and take the lock again.
//!
//! Unlike the kubelet it deletes pods through the API (a DaemonSet cannot kill containers
//! itself), waits for the API to confirm, and re-takes the lock when logind or the bus restarts.
//! A reboot(2) seen by the kernel probe without a preceding `PrepareForShutdown(true)` bypassed
//! every inhibitor: it is logged, counted and, when configured, announced to the API at once —
//! but only when the probe's verdict is `allowed` (a caller in the initial PID and user
//! namespaces with CAP_SYS_BOOT, valid magic numbers, a command that takes the machine down).
//! Requests the kernel refuses (a container's, an unprivileged process's) or whose caller could
//! not be checked are counted and logged at most once a minute per verdict, never announced; and
//! at most one last gasp goes out per [`core_shutdown::LAST_GASP_MIN_INTERVAL`].
//!
//! The decisions are pure and live in [`node_monitor_core::shutdown`]; this module is the adapter
//! around them (D-Bus in [`logind`], the API through [`crate::cluster::actuator`]).
pub mod logind;

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    sync::Arc,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use futures::{StreamExt as _, future::join_all};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use tokio::sync::{mpsc, watch};
use tracing::{debug, error, info, warn};

use self::logind::{InhibitorLock, Logind, LogindError};
use crate::{
    cluster::actuator::{Actuator, ActuatorConfig, DeleteOutcome, NodeConditionUpdate, PdbPolicy},
    ebpf::{RebootCmd, RebootEvent, RebootGate},
    http::Health,
    metrics::{Metrics, OperationLabels, PhaseLabels, ReasonLabels},
    telemetry::error_chain as chain,
};
pub use node_monitor_core::shutdown::config::{
    ConfigError, LastGasp, ShutdownConfig, ShutdownOptions, parse_shutdown_config,
};

use node_monitor_core::{
    clock::Timestamp,
    names::{
        CORDONED_ANNOTATION, LAST_GASP_ANNOTATION, NON_GRACEFUL_SHUTDOWN_REASON, SHUTDOWN_TAINT,
        SHUTTING_DOWN_CONDITION,
    },
    shutdown::{
        self as core_shutdown, DelayCheck, GroupOutcome, PHASE_TOTAL, RebootAction, RebootRequest,
        RebootRequests, Role, ShutdownPod, ShutdownRun, Step,
    },
};

/// `who` of node-monitor's inhibitor.
pub const INHIBITOR_WHO: &str = "node-monitor";
const INHIBITOR_WHY: &str = "node-monitor terminates the node's pods by priority before shutdown";
/// The kubelet's reconnect period to logind (`dbusReconnectPeriod`).
const RECONNECT: Duration = Duration::from_secs(1);
/// How often a quiet bus connection is checked.
const PING: Duration = Duration::from_secs(30);
/// A last gasp is taken back when the node is still up this long after it.
const GASP_RETRACT: Duration = Duration::from_secs(30);
/// API writes that failed at rest (the node not registered yet, the API down) are retried this often.
const RETRY: Duration = Duration::from_secs(2);
/// The pod list at the start of a shutdown is retried this long when the API fails.
const LIST_RETRY: Duration = Duration::from_secs(5);

/// A reboot(2) seen by the kernel probe (`syscalls/sys_enter_reboot`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebootSeen {
    pub cmd: RebootCmd,
    pub pid: u32,
    pub comm: String,
    /// cgroup v2 id of the caller (which pod, for a container's call).
    pub cgroup_id: u64,
    /// Whether the call can take the node down (see [`core_shutdown::effective_gate`]).
    pub gate: RebootGate,
    /// Calls with the same verdict the probe withheld before this one.
    pub suppressed: u32,
}

impl From<&RebootEvent> for RebootSeen {
    fn from(e: &RebootEvent) -> Self {
        Self {
            cmd: e.cmd,
            pid: e.task.pid,
            comm: e.task.comm.clone(),
            cgroup_id: e.task.cgroup_id,
            gate: core_shutdown::effective_gate(e.verdict, e.caller, e.magic1, e.magic2, e.cmd_raw),
            suppressed: e.suppressed,
        }
    }
}

/// What the shutdown manager runs with.
pub struct ShutdownContext {
    pub client: kube::Client,
    pub node_name: String,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub settings: ShutdownConfig,
    /// reboot(2) calls from the kernel probe; the sender lives with the eBPF adapter.
    pub reboots: mpsc::Receiver<RebootSeen>,
}

/// Why the shutdown configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading --config {path}")]
    Read {
        path: String,
        #[source]
        source: crate::io::InputError,
    },
    #[error("--config {path}")]
    Parse {
        path: String,
        #[source]
        source: ConfigError,
    },
}

/// Reads the agent's config file (if any) and parses its shutdown configuration.
pub fn load_shutdown_config(path: Option<&std::path::Path>) -> Result<ShutdownConfig, LoadError> {
    let Some(path) = path else {
        return Ok(ShutdownConfig::default());
    };
    let shown = path.display().to_string();
    let text = crate::io::read_file_bounded(path, "the config file", crate::io::MAX_INPUT_BYTES)
        .map_err(|source| LoadError::Read {
            path: shown.clone(),
            source,
        })?;
    parse_shutdown_config(Some(&text)).map_err(|source| LoadError::Parse {
        path: shown,
        source,
    })
}

/// How the shutdown manager stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// It stopped in the middle of a graceful node shutdown: the node's shutdown marks stay.
    pub shutting_down: bool,
}

/// How long a stop waits for logind to reload after the drop-in went.
const STOP_RELOAD_BOUND: Duration = Duration::from_secs(3);

/// Runs the shutdown manager until `stop` turns true. Never returns early on D-Bus or API
/// errors: it reconnects, and keeps reporting inhibitor bypasses meanwhile. On the stop it
/// releases the inhibitor and, outside a shutdown, removes its logind drop-in ([`Manager::on_stop`]).
pub async fn run(ctx: ShutdownContext, mut stop: watch::Receiver<bool>) -> Stopped {
    let mut m = Manager::new(ctx);
    m.init_metrics();
    for w in &m.cfg.warnings {
        warn!(warning = %w, "shutdown configuration");
    }
    info!(groups = ?m.cfg.groups.iter().map(|g| (g.priority, g.period.as_secs())).collect::<Vec<_>>(),
          budget_s = m.cfg.budget().as_secs(), policy = ?m.cfg.options.kubelet_inhibitor_policy,
          last_gasp = ?m.cfg.options.last_gasp, "shutdown manager starting");
    m.clear_stale_marks().await;
    'run: loop {
        if *stop.borrow() {
            break;
        }
        match m.session(&mut stop).await {
            Ok(()) => break,
            Err(e) => {
                m.lock = None;
                m.set_held(false);
                if m.preparing {
                    // The bus goes away as the machine shuts down: expected.
                    info!(error = %chain(&e), "system bus gone during the shutdown");
                } else {
                    warn!(error = %chain(&e), retry_in = ?RECONNECT, "logind unavailable; shutdowns are not delayed until it is back");
                    m.degraded(format!("shutdown inhibitor: {}", chain(&e)));
                }
                let until = tokio::time::Instant::now() + RECONNECT;
                loop {
                    tokio::select! {
                        () = tokio::time::sleep_until(until) => break,
                        r = recv_opt(&mut m.reboots) => m.on_reboot(r).await,
                        _ = stop.changed() => break 'run,
                    }
                }
            }
        }
    }
    m.on_stop().await;
    info!("shutdown manager stopped");
    Stopped {
        shutting_down: m.preparing,
    }
}

/// Which marks node-monitor set on the node, so a cancellation undoes only those.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Marks {
    condition: bool,
    taint: bool,
    cordoned: bool,
}

struct Manager {
    node: String,
    cfg: ShutdownConfig,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    actuator: Actuator,
    client: kube::Client,
    reboots: Option<mpsc::Receiver<RebootSeen>>,
    origin: Instant,
    lock: Option<InhibitorLock>,
    role: Role,
    /// logind announced a shutdown that was not cancelled since.
    preparing: bool,
    marks: Marks,
    reported: HashSet<String>,
    /// The condition at rest reached the API.
    armed_published: bool,
    /// Marks left from an earlier boot were cleared.
    stale_cleared: bool,
    /// When a last gasp went out: a node still up long after it was not going down after all.
    gasp_at: Option<Instant>,
    /// The rate limits on reboot requests (last gasps, log lines).
    requests: RebootRequests,
    /// The pod node-monitor runs in (downward API `POD_NAMESPACE`/`POD_NAME`), never deleted.
    own_pod: Option<(String, String)>,
}

impl Manager {
    fn new(ctx: ShutdownContext) -> Self {
        let actuator = Actuator::new(
            ctx.client.clone(),
            ActuatorConfig {
                node_name: ctx.node_name.clone(),
                pdb_policy: PdbPolicy::Respect,
                dry_run: false,
            },
        );
        let own_pod = match (std::env::var("POD_NAMESPACE"), std::env::var("POD_NAME")) {
            (Ok(ns), Ok(name)) if !ns.is_empty() && !name.is_empty() => Some((ns, name)),
            _ => None,
        };
        Self {
            node: ctx.node_name,
            cfg: ctx.settings,
            metrics: ctx.metrics,
            health: ctx.health,
            actuator,
            client: ctx.client,
            reboots: Some(ctx.reboots),
            origin: Instant::now(),
            lock: None,
            role: Role::Terminate,
            preparing: false,
            marks: Marks::default(),
            reported: HashSet::new(),
            armed_published: false,
            stale_cleared: false,
            gasp_at: None,
            requests: RebootRequests::default(),
            own_pod,
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_duration(self.origin.elapsed())
    }

    fn init_metrics(&self) {
        self.set_held(false);
        self.metrics
            .shutdown_budget_seconds
            .set(self.cfg.budget().as_secs_f64());
    }

    fn set_held(&self, held: bool) {
        self.metrics.shutdown_inhibitor_held.set(i64::from(held));
    }

    /// Reports a degradation once per distinct message.
    fn degraded(&mut self, what: String) {
        if self.reported.insert(what.clone()) {
            self.metrics.degraded.set(1);
            self.health.report_degraded(what);
        }
    }

    fn api_error(&self, operation: &str) {
        self.metrics
            .api_errors
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .inc();
    }

    fn wants_lock(&self) -> bool {
        self.role != Role::Passive && !self.cfg.groups.is_empty()
    }

    /// One connection to logind, until the bus connection ends (`Err`) or `stop` (`Ok`).
    async fn session(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), LogindError> {
        let logind = Logind::connect().await?;
        // Subscribe before taking the lock, so no announcement falls in between.
        let mut pfs = logind.prepare_for_shutdown().await?;
        let mut owners = logind.owner_changes().await?;
        self.check_inhibit_delay(&logind).await;
        let inhibitors = logind.list_inhibitors().await?;
        let kubelet = core_shutdown::kubelet_holds_inhibitor(&inhibitors);
        self.role = core_shutdown::role(self.cfg.options.kubelet_inhibitor_policy, kubelet);
        info!(kubelet_inhibitor = kubelet, role = ?self.role, "shutdown role");
        if self.wants_lock() && !self.preparing {
            self.take_lock(&logind).await?;
        }
        self.publish_armed().await;
        let mut ping = tokio::time::interval(PING);
        ping.tick().await;
        let mut retry = tokio::time::interval(RETRY);
        retry.tick().await;
        loop {
            tokio::select! {
                _ = stop.changed() => return Ok(()),
                r = recv_opt(&mut self.reboots) => self.on_reboot(r).await,
                s = pfs.next() => match s {
                    Some(Ok(true)) => {
                        let cancelled = self.on_shutdown(&mut pfs, stop).await;
                        if *stop.borrow() {
                            return Ok(());
                        }
                        if cancelled {
                            self.on_cancel(&logind).await?;
                        }
                    }
                    Some(Ok(false)) => self.on_cancel(&logind).await?,
                    Some(Err(e)) => warn!(error = %e, "malformed PrepareForShutdown signal ignored"),
                    None => return Err(LogindError::Disconnected),
                },
                o = owners.next() => match o {
                    Some(Ok(Some(owner))) => {
                        info!(%owner, "logind (re)started; taking the inhibitor again");
                        if self.wants_lock() && !self.preparing {
                            self.take_lock(&logind).await?;
                        }
                        self.check_inhibit_delay(&logind).await;
                    }
                    Some(Ok(None)) => warn!("logind left the bus; the inhibitor is re-taken when it is back"),
                    Some(Err(e)) => warn!(error = %e, "malformed NameOwnerChanged signal ignored"),
                    None => return Err(LogindError::Disconnected),
                },
                _ = ping.tick() => logind.ping().await?,
                _ = retry.tick() => {
                    if !self.stale_cleared && !self.preparing {
                        self.clear_stale_marks().await;
                    }
                    if !self.armed_published && !self.preparing {
                        self.publish_armed().await;
                    }
                    if self.gasp_at.is_some_and(|t| t.elapsed() > GASP_RETRACT) {
                        self.retract_last_gasp().await;
                    }
                }
            }
        }
    }

    /// The agent stops: the inhibitor goes, and the drop-in node-monitor wrote (unchanged since)
    /// is removed and logind reloaded, as after writing it — unless a shutdown is under way,
    /// which must not have its delay cut short.
    async fn on_stop(&mut self) {
        self.release_lock();
        if self.preparing {
            info!("stopping during a shutdown: the logind drop-in stays");
            return;
        }
        if !self.cfg.options.manage_inhibit_delay {
            return;
        }
        let dir = std::path::Path::new(logind::DROPIN_DIR);
        match logind::remove_dropin(dir) {
            Ok(logind::DropinRemoval::Removed) => {
                info!(path = %dir.join(logind::DROPIN_NAME).display(), "removed the logind drop-in");
                let reload = async { Logind::connect().await?.reload().await };
                match tokio::time::timeout(STOP_RELOAD_BOUND, reload).await {
                    Ok(Ok(())) => info!("logind reloaded without node-monitor's drop-in"),
                    Ok(Err(e)) => {
                        warn!(error = %chain(&e), "could not reload logind; its InhibitDelayMaxSec falls back at its next reload")
                    }
                    Err(_) => {
                        warn!(bound = ?STOP_RELOAD_BOUND, "logind did not reload in time; its InhibitDelayMaxSec falls back at its next reload")
                    }
                }
            }
            Ok(logind::DropinRemoval::Absent) => {}
            Ok(logind::DropinRemoval::Foreign) => {
                info!(path = %dir.join(logind::DROPIN_NAME).display(), "the logind drop-in was edited since node-monitor wrote it; kept")
            }
            Err(e) => warn!(error = %chain(&e), "could not remove the logind drop-in"),
        }
    }

    /// Takes a new lock, then drops the old one (if any): never a moment without one.
    async fn take_lock(&mut self, logind: &Logind) -> Result<(), LogindError> {
        let lock = logind.inhibit(INHIBITOR_WHO, INHIBITOR_WHY).await?;
        info!(fd = lock.raw_fd(), "shutdown delay inhibitor taken");
        self.lock = Some(lock);
        self.set_held(true);
        Ok(())
    }

    fn release_lock(&mut self) {
        if self.lock.take().is_some() {
            info!("shutdown delay inhibitor released");
        }
        self.set_held(false);
    }

    /// Reads logind's delay, raises it when allowed and needed, and reports what remains short.
    async fn check_inhibit_delay(&mut self, logind: &Logind) {
        let needed = self.cfg.needed_inhibit_delay();
        let current = match logind.inhibit_delay_max().await {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %chain(&e), "could not read logind's InhibitDelayMaxSec");
                return;
            }
        };
        self.metrics
            .shutdown_inhibit_delay_max_seconds
            .set(current.as_secs_f64());
        let check = core_shutdown::inhibit_delay_check(
            needed,
            current,
            self.cfg.options.manage_inhibit_delay,
        );
        let allowed = match check {
            DelayCheck::Sufficient => {
                debug!(?needed, ?current, "logind's InhibitDelayMaxSec suffices");
                return;
            }
            DelayCheck::TooLow { allowed, .. } => allowed,
            DelayCheck::Raise { seconds } => {
                match self.raise_inhibit_delay(logind, seconds).await {
                    Ok(now) if now >= needed => {
                        info!(
                            inhibit_delay_max_s = now.as_secs(),
                            "raised logind's InhibitDelayMaxSec"
                        );
                        self.metrics
                            .shutdown_inhibit_delay_max_seconds
                            .set(now.as_secs_f64());
                        return;
                    }
                    Ok(now) => {
                        self.metrics
                            .shutdown_inhibit_delay_max_seconds
                            .set(now.as_secs_f64());
                        now
                    }
                    Err(e) => {
                        warn!(error = %chain(&e), "could not raise logind's InhibitDelayMaxSec");
                        current
                    }
                }
            }
        };
        let err = core_shutdown::check_inhibit_delay(needed, allowed).err();
        if let Some(e) = err {
            error!(error = %e, "logind ends the shutdown delay before the pods' groups can finish");
            self.degraded(e.to_string());
        }
    }

    async fn raise_inhibit_delay(
        &self,
        logind: &Logind,
        seconds: u64,
    ) -> Result<Duration, LogindError> {
        let text = core_shutdown::logind_dropin(seconds);
        let path = logind::write_dropin(std::path::Path::new(logind::DROPIN_DIR), &text)?;
        info!(path = %path.display(), inhibit_delay_max_s = seconds, "wrote logind drop-in");
        logind.reload().await?;
        // logind re-reads its files asynchronously after SIGHUP.
        let want = Duration::from_secs(seconds);
        let mut now = logind.inhibit_delay_max().await?;
        for _ in 0..20 {
            if now >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            now = logind.inhibit_delay_max().await?;
        }
        Ok(now)
    }

    /// Publishes the condition at rest (False), saying whether shutdowns are delayed.
    async fn publish_armed(&mut self) {
        let (reason, message) = match (self.role, self.lock.is_some()) {
            (Role::Passive, _) => (
                "KubeletHandlesShutdown",
                "the kubelet holds a shutdown inhibitor; node-monitor only watches".to_owned(),
            ),
            (_, true) => (
                "InhibitorHeld",
                format!(
                    "node-monitor delays shutdowns up to {}s to terminate pods by priority",
                    self.cfg.budget().as_secs()
                ),
            ),
            (_, false) => (
                "NoInhibitor",
                "no shutdown groups configured; shutdowns are watched only".to_owned(),
            ),
        };
        self.armed_published = self.set_condition(false, reason, &message).await;
    }

    async fn set_condition(&mut self, status: bool, reason: &str, message: &str) -> bool {
        let update = NodeConditionUpdate {
            type_: SHUTTING_DOWN_CONDITION.into(),
            status,
            reason: reason.into(),
            message: message.into(),
        };
        match self.actuator.set_conditions(&[update]).await {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %chain(&e), reason, "could not set the shutdown condition");
                self.api_error("patch_conditions");
                false
            }
        }
    }

    /// After a reboot the node may still carry the marks of the shutdown that took it down.
    /// Until this succeeds (the node may not be registered yet), it is retried.
    async fn clear_stale_marks(&mut self) {
        self.stale_cleared = true;
        if let Err(e) = self
            .actuator
            .set_taint(SHUTDOWN_TAINT, "", "NoSchedule", false)
            .await
        {
            debug!(error = %chain(&e), "could not clear a stale shutdown taint; retrying");
            self.stale_cleared = false;
        }
        match self.actuator.node_annotation(CORDONED_ANNOTATION).await {
            Ok(Some(_)) => {
                self.marks.cordoned = true;
                self.uncordon().await;
            }
            Ok(None) => {}
            Err(e) => {
                debug!(error = %chain(&e), "could not read the node's annotations; retrying");
                self.stale_cleared = false;
            }
        }
    }

    async fn uncordon(&mut self) {
        if !self.marks.cordoned {
            return;
        }
        match self.actuator.set_unschedulable(false).await {
            Ok(_) => {
                self.marks.cordoned = false;
                if let Err(e) = self.actuator.annotate_node(CORDONED_ANNOTATION, None).await {
                    warn!(error = %chain(&e), "could not remove the cordon annotation");
                }
            }
            Err(e) => {
                warn!(error = %chain(&e), "could not uncordon the node");
                self.api_error("patch_unschedulable");
            }
        }
    }

    /// `PrepareForShutdown(true)`: marks, then the groups, then the release. Returns true when a
    /// `PrepareForShutdown(false)` cancelled it meanwhile.
    async fn on_shutdown<S>(&mut self, pfs: &mut S, stop: &mut watch::Receiver<bool>) -> bool
    where
        S: futures::Stream<Item = Result<bool, zbus::Error>> + Unpin,
    {
        self.preparing = true;
        let wall_start = unix_now();
        info!(role = ?self.role, "PrepareForShutdown(true): the node is shutting down");
        if self.role == Role::Passive {
            return false;
        }
        self.phase_start(PHASE_TOTAL, wall_start);
        let marking = tokio::spawn(mark_node(
            self.actuator.clone(),
            self.metrics.clone(),
            self.cfg.budget().as_secs(),
            self.cfg.options.cordon,
        ));
        let pods = self.list_pods_for_plan().await;
        let plan = core_shutdown::plan(&self.cfg.groups, &pods);
        info!(pods = plan.pod_count(), groups = ?core_shutdown::plan_summary(&plan), "shutdown plan");
        let mut run = ShutdownRun::new(plan, self.now());
        let mut deleted: BTreeSet<String> = BTreeSet::new();
        let mut bus_alive = true;
        let mut present = BTreeSet::new();
        loop {
            let steps = run.advance(self.now(), &present);
            for step in steps {
                match step {
                    Step::StartGroup { priority, pods, .. } => {
                        let phase = core_shutdown::group_phase(priority);
                        self.phase_start(&phase, unix_now());
                        info!(priority, pods = pods.len(), "shutdown group started");
                    }
                    Step::EndGroup {
                        priority, outcome, ..
                    } => {
                        self.phase_end(&core_shutdown::group_phase(priority), unix_now());
                        match &outcome {
                            GroupOutcome::AllGone => {
                                info!(priority, "shutdown group done: all pods gone")
                            }
                            GroupOutcome::PeriodElapsed { remaining } => {
                                warn!(
                                    priority,
                                    ?remaining,
                                    "shutdown group period elapsed with pods left"
                                );
                            }
                        }
                    }
                    Step::Release => {
                        // Metrics first: once the descriptor is closed the machine may go at once.
                        self.phase_end(PHASE_TOTAL, unix_now());
                        self.release_lock();
                        let total = self.now().saturating_since(run.started());
                        info!(
                            total_ms = total.as_millis() as u64,
                            "shutdown groups done; logind may proceed"
                        );
                    }
                }
            }
            if run.is_finished() {
                self.marks = marking.await.unwrap_or_default();
                self.actuator
                    .record_node_event("NodeShutdown", "Shutdown manager finished terminating pods")
                    .await;
                return false;
            }
            if self.role == Role::Terminate {
                self.delete_current(&run, &mut deleted).await;
            }
            let wake = tokio::time::Instant::from_std(
                self.origin
                    + run
                        .deadline()
                        .map_or(Duration::MAX, |d| d.since_origin())
                        .min(self.origin.elapsed() + self.cfg.options.poll_interval),
            );
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                s = pfs.next(), if bus_alive => match s {
                    Some(Ok(false)) => {
                        present = self.present(run.current_pods()).await;
                        if let Some(Step::EndGroup { priority, .. }) = run.abort(self.now(), &present) {
                            self.phase_end(&core_shutdown::group_phase(priority), unix_now());
                        }
                        self.phase_end(PHASE_TOTAL, unix_now());
                        info!("shutdown cancelled while terminating pods; no further group starts");
                        // The marks must be known to be undone.
                        self.marks = marking.await.unwrap_or_default();
                        return true;
                    }
                    Some(Ok(true)) => {}
                    Some(Err(e)) => warn!(error = %e, "malformed PrepareForShutdown signal ignored"),
                    // The lock is a descriptor: it holds without the bus; carry on.
                    None => bus_alive = false,
                },
                r = recv_opt(&mut self.reboots) => self.on_reboot(r).await,
                _ = stop.changed() => {
                    warn!("stopping during a shutdown; the lock is released as the process exits");
                    return false;
                }
            }
            present = self.present(run.current_pods()).await;
        }
    }

    /// Deletes the running group's pods not yet deleted (retrying failed deletions on each call).
    async fn delete_current(&self, run: &ShutdownRun, deleted: &mut BTreeSet<String>) {
        let todo: Vec<_> = run
            .current_pods()
            .iter()
            .filter(|p| !deleted.contains(&p.pod.uid))
            .collect();
        if todo.is_empty() {
            return;
        }
        let results = join_all(todo.iter().map(|p| {
            let grace = u32::try_from(p.grace_period_seconds).unwrap_or(u32::MAX);
            self.actuator
                .delete_pod(&p.pod.namespace, &p.pod.name, &p.pod.uid, grace)
        }))
        .await;
        for (p, r) in todo.iter().zip(results) {
            let pod = format!("{}/{}", p.pod.namespace, p.pod.name);
            match r {
                Ok(DeleteOutcome::Deleted) => {
                    info!(%pod, grace = p.grace_period_seconds, "pod deleted for shutdown");
                    deleted.insert(p.pod.uid.clone());
                }
                Ok(DeleteOutcome::Gone) => {
                    deleted.insert(p.pod.uid.clone());
                }
                Err(e) => {
                    warn!(%pod, error = %chain(&e), "pod deletion failed; retried while the group runs");
                    self.api_error("delete_pod");
                }
            }
        }
    }

    /// This node's pods as the plan needs them: active, not node-monitor's own, not mirror pods
    /// (static pods belong to the kubelet). Retried briefly; an API that stays down gives an
    /// empty plan (the kubelet, if configured, still acts locally).
    async fn list_pods_for_plan(&self) -> Vec<ShutdownPod> {
        let deadline = Instant::now() + LIST_RETRY;
        loop {
            match self.list_node_pods().await {
                Ok(pods) => {
                    return pods
                        .iter()
                        .filter(|p| self.plannable(p))
                        .filter_map(shutdown_pod)
                        .collect();
                }
                Err(e) if Instant::now() < deadline => {
                    debug!(error = %e, "listing the node's pods failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    error!(error = %e, "could not list the node's pods; no pod is terminated through the API");
                    self.api_error("list_pods");
                    return Vec::new();
                }
            }
        }
    }

    fn plannable(&self, p: &Pod) -> bool {
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let name = p.metadata.name.as_deref().unwrap_or_default();
        if self
            .own_pod
            .as_ref()
            .is_some_and(|(n, m)| n == ns && m == name)
        {
            return false;
        }
        if p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
        {
            return false;
        }
        !terminal(p)
    }

    async fn list_node_pods(&self) -> Result<Vec<Pod>, kube::Error> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        Ok(pods.list(&lp).await?.items)
    }

    /// UIDs of `planned` the API still shows (terminating or not; for the observing role, not
    /// finished either). When the API cannot answer, every pod counts as present.
    async fn present(&self, planned: &[core_shutdown::PlannedPod]) -> BTreeSet<String> {
        let all: BTreeSet<String> = planned.iter().map(|p| p.pod.uid.clone()).collect();
        if all.is_empty() {
            return all;
        }
        match self.list_node_pods().await {
            Ok(pods) => {
                let live: BTreeMap<String, bool> = pods
                    .iter()
                    .filter_map(|p| Some((p.metadata.uid.clone()?, terminal(p))))
                    .collect();
                all.into_iter()
                    .filter(|uid| match live.get(uid) {
                        None => false,
                        Some(&done) => !(self.role == Role::Observe && done),
                    })
                    .collect()
            }
            Err(e) => {
                debug!(error = %e, "could not list the node's pods; assuming all still present");
                self.api_error("list_pods");
                all
            }
        }
    }

    /// `PrepareForShutdown(false)`: undo what node-monitor marked and take the lock again.
    async fn on_cancel(&mut self, logind: &Logind) -> Result<(), LogindError> {
        info!("PrepareForShutdown(false): the shutdown was cancelled");
        self.preparing = false;
        // The lock first: the next shutdown may come at any moment.
        if self.wants_lock() {
            self.take_lock(logind).await?;
        }
        if self.role != Role::Passive {
            self.actuator
                .record_node_event(
                    "NodeShutdown",
                    "Shutdown manager detected shutdown cancellation",
                )
                .await;
            if self.marks.taint {
                match self
                    .actuator
                    .set_taint(SHUTDOWN_TAINT, "", "NoSchedule", false)
                    .await
                {
                    Ok(_) => self.marks.taint = false,
                    Err(e) => {
                        warn!(error = %chain(&e), "could not remove the shutdown taint");
                        self.api_error("patch_taint");
                    }
                }
            }
            self.uncordon().await;
        }
        self.publish_armed().await;
        self.marks.condition = false;
        Ok(())
    }

    /// A reboot(2) from the kernel probe.
    async fn on_reboot(&mut self, seen: Option<RebootSeen>) {
        let Some(seen) = seen else {
            // The probe's sender is gone: no more reboot events (no eBPF).
            self.reboots = None;
            return;
        };
        let req = RebootRequest {
            gate: seen.gate,
            suppressed: seen.suppressed,
        };
        let now = self.now();
        for action in self.requests.on_request(req, self.preparing, now) {
            match action {
                RebootAction::CountRefused { reason, n } => {
                    self.metrics
                        .reboot_requests_refused
                        .get_or_create(&ReasonLabels {
                            reason: reason.to_owned(),
                        })
                        .inc_by(n);
                }
                RebootAction::CountUnverified { n } => {
                    self.metrics.reboot_requests_unverified.inc_by(n);
                }
                RebootAction::Log { gate, unlogged } => match gate {
                    RebootGate::NotShutdown => {
                        debug!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, unlogged, "reboot(2) that does not shut down");
                    }
                    RebootGate::Unverified => {
                        warn!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, cgroup_id = seen.cgroup_id, unlogged,
                              "reboot(2) whose caller the probe cannot check (kernel offsets unavailable): not taken for a shutdown, no last gasp");
                    }
                    refused => {
                        info!(verdict = refused.as_str(), cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm,
                              cgroup_id = seen.cgroup_id, unlogged,
                              "reboot(2) the kernel refuses (or that only ends a container's PID namespace): not a shutdown");
                    }
                },
                RebootAction::Graceful => {
                    info!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, "reboot(2) at the end of a graceful shutdown");
                }
                RebootAction::Bypassed => {
                    self.metrics.shutdowns_bypassing_inhibitor.inc();
                }
                RebootAction::LastGasp => {
                    // The API first: the machine may be gone within milliseconds.
                    let sent = self.last_gasp(&seen).await;
                    self.gasp_at = Some(Instant::now());
                    warn!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm, last_gasp = ?self.cfg.options.last_gasp,
                          last_gasp_sent = sent, "reboot(2) bypassed the shutdown inhibitor: non-graceful shutdown");
                }
                RebootAction::LastGaspSuppressed { previous } => {
                    self.metrics.shutdown_last_gasps_suppressed.inc();
                    warn!(cmd = seen.cmd.as_str(), pid = seen.pid, comm = %seen.comm,
                          previous_s_ago = now.saturating_since(previous).as_secs(),
                          "reboot(2) bypassed the shutdown inhibitor again; no second last gasp this soon");
                }
            }
        }
    }

    /// Still running long after a last gasp: the reboot(2) call did not take the node down (the
    /// kernel refused it, or it came from a container's own PID namespace). Say so and restore
    /// the condition; the counter keeps the request.
    async fn retract_last_gasp(&mut self) {
        self.gasp_at = None;
        warn!(after = ?GASP_RETRACT, "the node is still up after a reboot(2) that bypassed the inhibitor; it did not shut the node down");
        if self.cfg.options.last_gasp == LastGasp::Annotation
            && let Err(e) = self
                .actuator
                .annotate_node(LAST_GASP_ANNOTATION, None)
                .await
        {
            warn!(error = %chain(&e), "could not remove the last-gasp annotation");
            self.api_error("patch_annotation");
        }
        self.publish_armed().await;
    }

    /// One bounded request telling the API the node is going down without a graceful shutdown.
    async fn last_gasp(&self, seen: &RebootSeen) -> bool {
        let message = format!(
            "reboot(2) {} by {} (pid {}) bypassed the shutdown inhibitor: pods were not terminated gracefully",
            seen.cmd.as_str(),
            seen.comm,
            seen.pid
        );
        let timeout = self.cfg.options.last_gasp_timeout;
        let result = match self.cfg.options.last_gasp {
            LastGasp::None => return false,
            LastGasp::Condition => {
                let update = NodeConditionUpdate {
                    type_: SHUTTING_DOWN_CONDITION.into(),
                    status: true,
                    reason: NON_GRACEFUL_SHUTDOWN_REASON.into(),
                    message,
                };
                tokio::time::timeout(
                    timeout,
                    self.actuator.set_conditions(std::slice::from_ref(&update)),
                )
                .await
            }
            LastGasp::Annotation => {
                let value = serde_json::json!({
                    "time": (unix_now() * 1e3).round() / 1e3,
                    "cmd": seen.cmd.as_str(),
                    "comm": seen.comm,
                    "pid": seen.pid,
                    "verdict": seen.gate.as_str(),
                })
                .to_string();
                tokio::time::timeout(
                    timeout,
                    self.actuator
                        .annotate_node(LAST_GASP_ANNOTATION, Some(&value)),
                )
                .await
            }
        };
        match result {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                warn!(error = %chain(&e), "last gasp failed");
                self.api_error("last_gasp");
                false
            }
            Err(_) => {
                warn!(?timeout, "last gasp timed out");
                self.api_error("last_gasp");
                false
            }
        }
    }

    fn phase_start(&self, phase: &str, at: f64) {
        let l = PhaseLabels {
            phase: phase.to_owned(),
        };
        self.metrics
            .shutdown_phase_start_time_seconds
            .get_or_create(&l)
            .set(at);
        // As the kubelet does for its end-time gauge: a new start clears the previous end.
        self.metrics
            .shutdown_phase_end_time_seconds
            .get_or_create(&l)
            .set(0.0);
    }

    fn phase_end(&self, phase: &str, at: f64) {
        let l = PhaseLabels {
            phase: phase.to_owned(),
        };
        self.metrics
            .shutdown_phase_end_time_seconds
            .get_or_create(&l)
            .set(at);
    }
}

/// Posts the node Event and sets the marks; returns which marks took. Runs beside the first
/// group (the kubelet, too, updates the node status asynchronously and starts killing at once).
async fn mark_node(
    actuator: Actuator,
    metrics: Arc<Metrics>,
    budget_s: u64,
    cordon: bool,
) -> Marks {
    actuator
        .record_node_event("NodeShutdown", "Shutdown manager detected shutdown event")
        .await;
    let api_error = |operation: &str| {
        metrics
            .api_errors
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .inc();
    };
    let mut marks = Marks::default();
    let message = format!(
        "systemd-logind announced a shutdown; node-monitor terminates pods by priority group within {}s",
        budget_s
    );
    // The condition, the taint and the cordon are independent: one request each, together.
    let cond = NodeConditionUpdate {
        type_: SHUTTING_DOWN_CONDITION.into(),
        status: true,
        reason: "NodeShuttingDown".into(),
        message,
    };
    let (c, t, k) = tokio::join!(
        actuator.set_conditions(std::slice::from_ref(&cond)),
        actuator.set_taint(SHUTDOWN_TAINT, "", "NoSchedule", true),
        async {
            if !cordon {
                return Ok(None);
            }
            // A cordon already there is someone else's: leave it, and claim nothing (the base's
            // admission policy refuses the claim on an unschedulable node anyway).
            if actuator.is_unschedulable().await? {
                return Ok(Some(true));
            }
            // Annotate first: a crash between the two leaves an annotation, never a stray cordon.
            actuator
                .annotate_node(CORDONED_ANNOTATION, Some("true"))
                .await?;
            actuator.set_unschedulable(true).await.map(Some)
        },
    );
    match c {
        Ok(()) => marks.condition = true,
        Err(e) => {
            warn!(error = %chain(&e), "could not set the shutdown condition");
            api_error("patch_conditions");
        }
    }
    match t {
        Ok(_) => marks.taint = true,
        Err(e) => {
            warn!(error = %chain(&e), "could not taint the node");
            api_error("patch_taint");
        }
    }
    match k {
        Ok(Some(was)) => {
            marks.cordoned = !was;
            if was {
                // Cordoned by someone else: leave it so after a cancellation.
                let _ = actuator.annotate_node(CORDONED_ANNOTATION, None).await;
            }
        }
        Ok(None) => {}
        Err(e) => {
            warn!(error = %chain(&e), "could not cordon the node");
            api_error("patch_unschedulable");
        }
    }
    marks
}

/// Waits for the next reboot event, or forever once there is no sender.
async fn recv_opt(rx: &mut Option<mpsc::Receiver<RebootSeen>>) -> Option<RebootSeen> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

fn terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn shutdown_pod(p: &Pod) -> Option<ShutdownPod> {
    let spec = p.spec.as_ref();
    Some(ShutdownPod {
        namespace: p.metadata.namespace.clone()?,
        name: p.metadata.name.clone()?,
        uid: p.metadata.uid.clone()?,
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        termination_grace_period_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::{
        api::core::v1::{PodSpec, PodStatus},
        apimachinery::pkg::apis::meta::v1::ObjectMeta,
    };

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
}
