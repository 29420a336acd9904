//! The shutdown manager's ports: what it needs from logind ([`LogindPort`], [`LogindConn`]) and
//! from the API ([`NodeApi`]), with the real adapters behind them (D-Bus through [`Logind`], the
//! API through the [`Actuator`]). The unit tests put fakes in their place.
use std::{future::Future, path::Path, time::Duration};

use futures::{StreamExt as _, stream::BoxStream};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};
use tracing::{info, warn};

use super::logind::{self, DropinRemoval, InhibitorLock, Logind, LogindError};
use crate::{
    cluster::actuator::{Actuator, DeleteOutcome, NodeConditionUpdate},
    telemetry::error_chain as chain,
};
use node_monitor_core::{contract::names::SHUTDOWN_TAINT, shutdown::Inhibitor};

/// `who` of node-monitor's inhibitor.
pub const INHIBITOR_WHO: &str = "node-monitor";
const INHIBITOR_WHY: &str = "node-monitor terminates the node's pods by priority before shutdown";
/// How long a stop waits for logind to reload after the drop-in went.
const STOP_RELOAD_BOUND: Duration = Duration::from_secs(3);

/// An API error, as the manager logs it.
pub type ApiError = Box<dyn std::error::Error + Send + Sync>;

/// A held delay inhibitor: dropping it releases the lock.
pub struct HeldLock {
    /// The descriptor, for the log.
    pub fd: i32,
    _guard: Box<dyn Send + Sync>,
}

impl HeldLock {
    /// A lock kept alive by `guard` (the descriptor, or a test's token).
    pub fn new(fd: i32, guard: impl Send + Sync + 'static) -> Self {
        Self {
            fd,
            _guard: Box::new(guard),
        }
    }
}

/// logind's signals on one connection; both end when the connection does.
pub struct Signals {
    /// `PrepareForShutdown`'s argument (an error: a malformed signal).
    pub prepare: BoxStream<'static, Result<bool, LogindError>>,
    /// logind's new bus owner (`NameOwnerChanged`), `None` when it left the bus.
    pub owners: BoxStream<'static, Result<Option<String>, LogindError>>,
}

/// The way to logind.
pub trait LogindPort: Send + Sync + 'static {
    /// One connection.
    type Conn: LogindConn;
    /// Connects and subscribes to the signals (before any lock is taken, so no announcement
    /// falls in between).
    fn connect(&self) -> impl Future<Output = Result<(Self::Conn, Signals), LogindError>> + Send;
    /// The agent stops outside a shutdown: remove node-monitor's drop-in when unchanged and
    /// reload logind (bounded).
    fn remove_dropin(&self) -> impl Future<Output = ()> + Send;
}

/// One connection to logind.
pub trait LogindConn: Send + Sync {
    /// Takes a `delay` inhibitor for `shutdown`.
    fn inhibit(&self) -> impl Future<Output = Result<HeldLock, LogindError>> + Send;
    /// logind's `InhibitDelayMaxSec`.
    fn inhibit_delay_max(&self) -> impl Future<Output = Result<Duration, LogindError>> + Send;
    /// Writes the drop-in, reloads logind and reads the delay back.
    fn raise_inhibit_delay(
        &self,
        seconds: u64,
    ) -> impl Future<Output = Result<Duration, LogindError>> + Send;
    /// `ListInhibitors`.
    fn list_inhibitors(&self) -> impl Future<Output = Result<Vec<Inhibitor>, LogindError>> + Send;
    /// A round trip telling a live connection from a dead one.
    fn ping(&self) -> impl Future<Output = Result<(), LogindError>> + Send;
}

/// The node and its pods, through the API.
pub trait NodeApi: Clone + Send + Sync + 'static {
    /// Sets the shutdown condition.
    fn set_condition(
        &self,
        update: NodeConditionUpdate,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Adds or removes the shutdown taint.
    fn set_taint(&self, present: bool) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Sets `spec.unschedulable`; returns whether the node was unschedulable before.
    fn set_unschedulable(&self, value: bool)
    -> impl Future<Output = Result<bool, ApiError>> + Send;
    /// Reads `spec.unschedulable`.
    fn is_unschedulable(&self) -> impl Future<Output = Result<bool, ApiError>> + Send;
    /// Sets (`Some`) or removes an annotation of the node.
    fn annotate_node(
        &self,
        key: &'static str,
        value: Option<String>,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Reads an annotation of the node.
    fn node_annotation(
        &self,
        key: &'static str,
    ) -> impl Future<Output = Result<Option<String>, ApiError>> + Send;
    /// Posts a `NodeShutdown` node Event (best effort).
    fn node_event(&self, message: &'static str) -> impl Future<Output = ()> + Send;
    /// Deletes a pod with a grace period, on the precondition of its UID.
    fn delete_pod(
        &self,
        namespace: String,
        name: String,
        uid: String,
        grace_period_seconds: u32,
    ) -> impl Future<Output = Result<DeleteOutcome, ApiError>> + Send;
    /// The node's pods.
    fn list_node_pods(&self) -> impl Future<Output = Result<Vec<Pod>, ApiError>> + Send;
}

/// logind on the system bus.
pub struct SystemLogind {
    /// `manageInhibitDelay`: the drop-in is node-monitor's to remove.
    pub manage: bool,
}

impl LogindPort for SystemLogind {
    type Conn = Logind;

    async fn connect(&self) -> Result<(Logind, Signals), LogindError> {
        let logind = Logind::connect().await?;
        let prepare = logind
            .prepare_for_shutdown()
            .await?
            .map(|s| s.map_err(LogindError::signal("PrepareForShutdown")))
            .boxed();
        let owners = logind
            .owner_changes()
            .await?
            .map(|s| s.map_err(LogindError::signal("NameOwnerChanged")))
            .boxed();
        Ok((logind, Signals { prepare, owners }))
    }

    async fn remove_dropin(&self) {
        if !self.manage {
            return;
        }
        let dir = Path::new(logind::DROPIN_DIR);
        match logind::remove_dropin(dir) {
            Ok(DropinRemoval::Removed) => {
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
            Ok(DropinRemoval::Absent) => {}
            Ok(DropinRemoval::Foreign) => {
                info!(path = %dir.join(logind::DROPIN_NAME).display(), "the logind drop-in was edited since node-monitor wrote it; kept")
            }
            Err(e) => warn!(error = %chain(&e), "could not remove the logind drop-in"),
        }
    }
}

impl LogindConn for Logind {
    async fn inhibit(&self) -> Result<HeldLock, LogindError> {
        let lock: InhibitorLock = Logind::inhibit(self, INHIBITOR_WHO, INHIBITOR_WHY).await?;
        Ok(HeldLock::new(lock.raw_fd(), lock))
    }

    async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        Logind::inhibit_delay_max(self).await
    }

    async fn raise_inhibit_delay(&self, seconds: u64) -> Result<Duration, LogindError> {
        let text = node_monitor_core::shutdown::logind_dropin(seconds);
        let path = logind::write_dropin(Path::new(logind::DROPIN_DIR), &text)?;
        info!(path = %path.display(), inhibit_delay_max_s = seconds, "wrote logind drop-in");
        self.reload().await?;
        // logind re-reads its files asynchronously after SIGHUP.
        let want = Duration::from_secs(seconds);
        let mut now = Logind::inhibit_delay_max(self).await?;
        for _ in 0..20 {
            if now >= want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            now = Logind::inhibit_delay_max(self).await?;
        }
        Ok(now)
    }

    async fn list_inhibitors(&self) -> Result<Vec<Inhibitor>, LogindError> {
        Logind::list_inhibitors(self).await
    }

    async fn ping(&self) -> Result<(), LogindError> {
        Logind::ping(self).await
    }
}

/// The node and its pods through the [`Actuator`].
#[derive(Clone)]
pub struct ClusterNode {
    /// The actuator for this node.
    pub actuator: Actuator,
    /// The client, for the pod list.
    pub client: kube::Client,
    /// The node's name.
    pub node: String,
}

impl NodeApi for ClusterNode {
    async fn set_condition(&self, update: NodeConditionUpdate) -> Result<(), ApiError> {
        Ok(self
            .actuator
            .set_conditions(std::slice::from_ref(&update))
            .await?)
    }

    async fn set_taint(&self, present: bool) -> Result<(), ApiError> {
        self.actuator
            .set_taint(SHUTDOWN_TAINT, "", "NoSchedule", present)
            .await?;
        Ok(())
    }

    async fn set_unschedulable(&self, value: bool) -> Result<bool, ApiError> {
        Ok(self.actuator.set_unschedulable(value).await?)
    }

    async fn is_unschedulable(&self) -> Result<bool, ApiError> {
        Ok(self.actuator.is_unschedulable().await?)
    }

    async fn annotate_node(
        &self,
        key: &'static str,
        value: Option<String>,
    ) -> Result<(), ApiError> {
        Ok(self.actuator.annotate_node(key, value.as_deref()).await?)
    }

    async fn node_annotation(&self, key: &'static str) -> Result<Option<String>, ApiError> {
        Ok(self.actuator.node_annotation(key).await?)
    }

    async fn node_event(&self, message: &'static str) {
        self.actuator
            .record_node_event("NodeShutdown", message)
            .await;
    }

    async fn delete_pod(
        &self,
        namespace: String,
        name: String,
        uid: String,
        grace_period_seconds: u32,
    ) -> Result<DeleteOutcome, ApiError> {
        Ok(self
            .actuator
            .delete_pod(&namespace, &name, &uid, grace_period_seconds)
            .await?)
    }

    async fn list_node_pods(&self) -> Result<Vec<Pod>, ApiError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={}", self.node));
        Ok(pods.list(&lp).await?.items)
    }
}
