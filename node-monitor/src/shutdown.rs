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
//! Every decision is the core's ([`node_monitor_core::shutdown::lifecycle`]): this module turns
//! logind's signals, the kernel's reboot requests, its timers and the API's answers into
//! [`Event`]s, and carries the [`Action`]s out through its ports ([`ports`]: logind over D-Bus in
//! [`logind`], the API through [`crate::cluster::actuator`]).
pub mod logind;
pub mod ports;

mod execute;
pub mod gasp;
mod node;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use futures::{StreamExt as _, stream::BoxStream};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
    time::Instant,
};
use tracing::{debug, info, warn};

use self::{
    logind::LogindError,
    ports::{ClusterNode, HeldLock, LogindConn, LogindPort, NodeApi, SystemLogind},
};
use crate::{
    cluster::actuator::{Actuator, ActuatorConfig, PdbPolicy},
    ebpf::{RebootCmd, RebootEvent, RebootGate},
    http::Health,
    metrics::Metrics,
    telemetry::error_chain as chain,
};
pub use node_monitor_core::shutdown::config::{
    ConfigError, LastGasp, ShutdownConfig, ShutdownOptions, parse_shutdown_config,
};
pub use ports::INHIBITOR_WHO;

use node_monitor_core::{
    shutdown::{
        self as core_shutdown, RebootRequest,
        lifecycle::{Action, Event, Lifecycle, Marks},
    },
    units::clock::Timestamp,
};

/// The kubelet's reconnect period to logind (`dbusReconnectPeriod`).
const RECONNECT: Duration = Duration::from_secs(1);
/// How often a quiet bus connection is checked.
const PING: Duration = Duration::from_secs(30);
/// API writes that failed at rest (the node not registered yet, the API down) are retried this often.
const RETRY: Duration = Duration::from_secs(2);

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
    /// The last gasp's fast path ([`gasp`]), when it runs.
    pub fast: Option<Arc<gasp::FastGasp>>,
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

/// Runs the shutdown manager until `stop` turns true. Never returns early on D-Bus or API
/// errors: it reconnects, and keeps reporting inhibitor bypasses meanwhile. On the stop it
/// releases the inhibitor and, outside a shutdown, removes its logind drop-in.
pub async fn run(ctx: ShutdownContext, stop: watch::Receiver<bool>) -> Stopped {
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
    let logind = SystemLogind {
        manage: ctx.settings.options.manage_inhibit_delay,
    };
    let api = ClusterNode {
        actuator,
        client: ctx.client,
        node: ctx.node_name,
    };
    let m = Manager::new(
        logind,
        api,
        ctx.settings,
        Runtime {
            metrics: ctx.metrics,
            health: ctx.health,
            reboots: ctx.reboots,
            own_pod,
            fast: ctx.fast,
        },
    );
    m.run(stop).await
}

/// The manager's surroundings besides its ports.
struct Runtime {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    reboots: mpsc::Receiver<RebootSeen>,
    /// The pod node-monitor runs in (downward API `POD_NAMESPACE`/`POD_NAME`), never deleted.
    own_pod: Option<(String, String)>,
    /// The last gasp's fast path, armed by the manager.
    fast: Option<Arc<gasp::FastGasp>>,
}

/// The adapter around [`Lifecycle`]: events in, actions carried out through the ports.
struct Manager<L: LogindPort, N: NodeApi> {
    lc: Lifecycle,
    logind: L,
    api: N,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    reboots: Option<mpsc::Receiver<RebootSeen>>,
    origin: Instant,
    lock: Option<HeldLock>,
    /// Degradations reported so far (each once).
    reported: HashSet<String>,
    own_pod: Option<(String, String)>,
    /// The marking of the node beside the run ([`Action::MarkNode`]).
    marking: Option<JoinHandle<Marks>>,
    /// The reboot request whose actions are being carried out.
    seen: Option<RebootSeen>,
    /// The last gasp's fast path: armed while the manager would send a last gasp.
    fast: Option<Arc<gasp::FastGasp>>,
}

impl<L: LogindPort, N: NodeApi> Manager<L, N> {
    fn new(logind: L, api: N, cfg: ShutdownConfig, rt: Runtime) -> Self {
        Self {
            lc: Lifecycle::new(cfg),
            logind,
            api,
            metrics: rt.metrics,
            health: rt.health,
            reboots: Some(rt.reboots),
            origin: Instant::now(),
            lock: None,
            reported: HashSet::new(),
            own_pod: rt.own_pod,
            fast: rt.fast,
            marking: None,
            seen: None,
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_duration(self.origin.elapsed())
    }

    fn cfg(&self) -> &ShutdownConfig {
        self.lc.config()
    }

    async fn run(mut self, mut stop: watch::Receiver<bool>) -> Stopped {
        self.arm_fast();
        self.set_held(false);
        self.metrics
            .shutdown
            .budget_seconds
            .set(self.cfg().budget().as_secs_f64());
        for w in &self.cfg().warnings {
            warn!(warning = %w, "shutdown configuration");
        }
        info!(groups = ?self.cfg().groups.iter().map(|g| (g.priority, g.period.as_secs())).collect::<Vec<_>>(),
              budget_s = self.cfg().budget().as_secs(), policy = ?self.cfg().options.kubelet_inhibitor_policy,
              last_gasp = ?self.cfg().options.last_gasp, "shutdown manager starting");
        self.dispatch_offline(Event::Started).await;
        'run: loop {
            if *stop.borrow() {
                break;
            }
            match self.session(&mut stop).await {
                Ok(()) => break,
                Err(e) => {
                    if self.lc.preparing() {
                        // The bus goes away as the machine shuts down: expected.
                        info!(error = %chain(&e), "system bus gone during the shutdown");
                    } else {
                        warn!(error = %chain(&e), kind = e.metric_label(), retry_in = ?RECONNECT,
                              "logind unavailable; shutdowns are not delayed until it is back");
                    }
                    self.dispatch_offline(Event::LogindLost { error: chain(&e) })
                        .await;
                    let until = Instant::now() + RECONNECT;
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep_until(until) => break,
                            r = recv_opt(&mut self.reboots) => {
                                if let Err(e) = self.on_reboot(r, None).await {
                                    warn!(error = %chain(&e), "logind is not connected");
                                }
                            }
                            _ = stop.changed() => break 'run,
                        }
                    }
                }
            }
        }
        if self.lc.preparing() {
            info!("stopping during a shutdown: the logind drop-in stays");
        }
        self.dispatch_offline(Event::StopRequested).await;
        info!("shutdown manager stopped");
        Stopped {
            shutting_down: self.lc.preparing(),
        }
    }

    /// One connection to logind, until the bus connection ends (`Err`) or `stop` (`Ok`).
    async fn session(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), LogindError> {
        let (conn, mut signals) = self.logind.connect().await?;
        let conn = &conn;
        self.dispatch(Event::LogindConnected, Some(conn)).await?;
        let mut ping = tokio::time::interval(PING);
        ping.tick().await;
        let mut retry = tokio::time::interval(RETRY);
        retry.tick().await;
        loop {
            tokio::select! {
                _ = stop.changed() => return Ok(()),
                r = recv_opt(&mut self.reboots) => self.on_reboot(r, Some(conn)).await?,
                s = signals.prepare.next() => match s {
                    Some(Ok(true)) if self.lc.preparing() => {
                        debug!("PrepareForShutdown(true) again during the shutdown; ignored");
                    }
                    Some(Ok(true)) => {
                        info!(role = ?self.lc.role(), "PrepareForShutdown(true): the node is shutting down");
                        self.dispatch(Event::PrepareForShutdown(true), Some(conn)).await?;
                        let cancelled = self.run_groups(&mut signals.prepare, stop, conn).await;
                        if *stop.borrow() {
                            return Ok(());
                        }
                        if cancelled {
                            self.on_cancel(conn).await?;
                        }
                    }
                    Some(Ok(false)) => self.on_cancel(conn).await?,
                    Some(Err(e)) => warn!(error = %chain(&e), "malformed PrepareForShutdown signal ignored"),
                    None => return Err(LogindError::Disconnected),
                },
                o = signals.owners.next() => match o {
                    Some(Ok(Some(owner))) => {
                        info!(%owner, "logind (re)started; taking the inhibitor again");
                        self.dispatch(Event::LogindRestarted, Some(conn)).await?;
                    }
                    Some(Ok(None)) => warn!("logind left the bus; the inhibitor is re-taken when it is back"),
                    Some(Err(e)) => warn!(error = %chain(&e), "malformed NameOwnerChanged signal ignored"),
                    None => return Err(LogindError::Disconnected),
                },
                _ = ping.tick() => conn.ping().await?,
                _ = retry.tick() => self.dispatch(Event::RetryTick, Some(conn)).await?,
            }
        }
    }

    /// `PrepareForShutdown(false)`: undo what node-monitor marked and take the lock again.
    async fn on_cancel(&mut self, conn: &L::Conn) -> Result<(), LogindError> {
        info!("PrepareForShutdown(false): the shutdown was cancelled");
        self.dispatch(Event::PrepareForShutdown(false), Some(conn))
            .await
    }

    /// The groups of a shutdown run, each looked at when the API may have news and at the
    /// latest at its end. Returns true when a `PrepareForShutdown(false)` cancelled the run.
    async fn run_groups(
        &mut self,
        prepare: &mut BoxStream<'static, Result<bool, LogindError>>,
        stop: &mut watch::Receiver<bool>,
        conn: &L::Conn,
    ) -> bool {
        let mut bus_alive = true;
        loop {
            let Some(wake) = self.lc.next_wake(self.now()) else {
                return false;
            };
            let wake = self.origin + wake.since_origin();
            let event = tokio::select! {
                () = tokio::time::sleep_until(wake) => Event::Wake,
                s = prepare.next(), if bus_alive => match s {
                    Some(Ok(false)) => {
                        self.run_event(Event::PrepareForShutdown(false), conn).await;
                        return true;
                    }
                    Some(Ok(true)) => Event::PrepareForShutdown(true),
                    Some(Err(e)) => {
                        warn!(error = %chain(&e), "malformed PrepareForShutdown signal ignored");
                        Event::Wake
                    }
                    // The lock is a descriptor: it holds without the bus; carry on.
                    None => {
                        bus_alive = false;
                        Event::Wake
                    }
                },
                r = recv_opt(&mut self.reboots) => match r {
                    Some(seen) => {
                        self.seen = Some(seen.clone());
                        Event::Reboot(reboot_request(&seen))
                    }
                    None => {
                        self.reboots = None;
                        Event::Wake
                    }
                },
                _ = stop.changed() => {
                    warn!("stopping during a shutdown; the lock is released as the process exits");
                    return false;
                }
            };
            self.run_event(event, conn).await;
        }
    }

    /// An event during a run: no logind call is among its actions.
    async fn run_event(&mut self, event: Event, conn: &L::Conn) {
        if let Err(e) = self.dispatch(event, Some(conn)).await {
            warn!(error = %chain(&e), "logind call failed during the shutdown");
        }
    }

    /// A reboot(2) from the kernel probe.
    async fn on_reboot(
        &mut self,
        seen: Option<RebootSeen>,
        conn: Option<&L::Conn>,
    ) -> Result<(), LogindError> {
        let Some(seen) = seen else {
            // The probe's sender is gone: no more reboot events (no eBPF).
            self.reboots = None;
            return Ok(());
        };
        let req = reboot_request(&seen);
        self.seen = Some(seen);
        self.dispatch(Event::Reboot(req), conn).await
    }

    /// Steps the lifecycle with `event` and carries its actions out in order; an action's
    /// answer is stepped at once and its actions run before the rest. A failed logind call
    /// ends the connection: the rest is dropped.
    async fn dispatch(&mut self, event: Event, conn: Option<&L::Conn>) -> Result<(), LogindError> {
        let now = self.now();
        let mut queue: VecDeque<Action> = self.lc.step(event, now).into();
        while let Some(action) = queue.pop_front() {
            if let Some(answer) = self.execute(action, conn).await? {
                let now = self.now();
                for a in self.lc.step(answer, now).into_iter().rev() {
                    queue.push_front(a);
                }
            }
        }
        self.arm_fast();
        Ok(())
    }

    /// Arms the last gasp's fast path when the manager would send a last gasp for an allowed
    /// reboot(2) now: one is configured and no graceful shutdown is under way (its own rate
    /// limit mirrors the manager's).
    fn arm_fast(&self) {
        if let Some(f) = &self.fast {
            f.set_armed(self.cfg().options.last_gasp != LastGasp::None && !self.lc.preparing());
        }
    }

    /// [`Self::dispatch`] without a logind connection.
    async fn dispatch_offline(&mut self, event: Event) {
        if let Err(e) = self.dispatch(event, None).await {
            warn!(error = %chain(&e), "logind is not connected");
        }
    }
}

fn reboot_request(seen: &RebootSeen) -> RebootRequest {
    RebootRequest {
        gate: seen.gate,
        suppressed: seen.suppressed,
    }
}

/// Waits for the next reboot event, or forever once there is no sender.
async fn recv_opt(rx: &mut Option<mpsc::Receiver<RebootSeen>>) -> Option<RebootSeen> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
