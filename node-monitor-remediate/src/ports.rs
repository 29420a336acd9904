//! The controller's effects, each behind a small port: what it reads (the watched Nodes, Leases
//! and ConfigMaps; the pods bound to a node), what it writes (the operation records, the
//! out-of-service taint, pod deletions, Events), the fence methods it runs, and the clock. The
//! controller ([`super::controller`]) is written against these alone; [`super::kube_ports`]
//! implements them on the API server, the controller's tests on an in-memory cluster.
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, Pod},
};

use node_monitor_core::{
    remediation::{FenceOp, Step},
    units::clock::Timestamp,
};

use super::{
    methods::MethodSpec,
    store::{StoreError, StoredOp},
};
use node_monitor_service::events::EventRecord;

/// A failed call of an API port ([`Taints`], [`NodePods`]), by kind: its `metric_label` is the
/// `reason` of `node_monitor_remediation_port_errors_total`, its text what the logs, Events and
/// the operation record say.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// No answer within the request's bound.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API server answered with an error status.
    #[error("{message} (HTTP {code})")]
    Status { code: u16, message: String },
    /// No answer could be had (connection, TLS, a body that does not decode).
    #[error("{0}")]
    Transport(String),
}

impl ApiError {
    /// From a client error.
    pub fn of(e: &kube::Error) -> Self {
        match e {
            kube::Error::Api(s) => Self::Status {
                code: s.code,
                message: s.message.clone(),
            },
            other => Self::Transport(node_monitor_service::telemetry::error_chain(other)),
        }
    }

    /// The error's kind, as a metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Timeout(_) => "timeout",
            Self::Status { code: 403, .. } => "forbidden",
            Self::Status { code: 404, .. } => "not_found",
            Self::Status { code: 409, .. } => "conflict",
            Self::Status { code: 429, .. } => "throttled",
            Self::Status { code, .. } if *code >= 500 => "server_error",
            Self::Status { .. } => "refused",
            Self::Transport(_) => "transport",
        }
    }
}

/// Why a fence step's run did not confirm ([`FenceRunner`]); its `metric_label` is the `reason`
/// of `node_monitor_remediation_port_errors_total`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The step has no method in the node's fence configuration.
    #[error("no {0} methods configured")]
    NoMethods(&'static str),
    /// The fence configuration, or a Secret it names, could not be used.
    #[error("{0}")]
    Config(String),
    /// A method ran and did not confirm (failed, timed out, could not be started).
    #[error("{0}")]
    Method(String),
}

impl StepError {
    /// The error's kind, as a metric label.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::NoMethods(_) => "no_methods",
            Self::Config(_) => "config",
            Self::Method(_) => "method_failed",
        }
    }
}

/// The controller's clock: monotonic time for liveness and rate limits (never compared with a
/// node's clock), wall time for what the operation record says.
pub trait Clock {
    /// Monotonic, from the controller's start.
    fn now(&self) -> Timestamp;
    /// Unix milliseconds.
    fn unix_millis(&self) -> i64;
}

/// The watched objects, as cached now.
pub trait ClusterView {
    fn nodes(&self) -> Vec<Arc<Node>>;
    /// The node Leases (`kube-node-lease`).
    fn leases(&self) -> Vec<Arc<Lease>>;
    /// The node agents' liveness Leases (`node-monitor-agent-<node>` in the controller's
    /// namespace, which is the agent's); other Leases of the namespace may be listed too.
    fn agent_leases(&self) -> Vec<Arc<Lease>>;
    /// How long ago the Lease view was last confirmed current; `None`: never.
    fn lease_view_age(&self) -> Option<Duration>;
    /// The controller namespace's ConfigMaps (fence configuration and methods), by name.
    fn configmaps(&self) -> BTreeMap<String, BTreeMap<String, String>>;
    /// One of them.
    fn configmap(&self, name: &str) -> Option<BTreeMap<String, String>>;
}

/// The fencing operations, one NodeFence per node ([`super::store`]): every write carries the
/// version it read as a precondition.
pub trait OpRecords {
    /// Every stored operation; those that cannot be decoded as errors.
    fn list_ops(
        &self,
    ) -> impl Future<Output = Result<Vec<Result<StoredOp, StoreError>>, StoreError>> + Send;
    fn get_op(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Option<StoredOp>, StoreError>> + Send;
    fn create_op(&self, op: &FenceOp) -> impl Future<Output = Result<StoredOp, StoreError>> + Send;
    fn update_op(
        &self,
        stored: &StoredOp,
        op: &FenceOp,
    ) -> impl Future<Output = Result<StoredOp, StoreError>> + Send;
    /// Gone already counts as deleted.
    fn delete_op(&self, node: &str) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The node's `node.kubernetes.io/out-of-service` taint.
pub trait Taints {
    fn set_out_of_service(
        &self,
        node: &str,
        present: bool,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
}

/// What a forced deletion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodDeletion {
    Deleted,
    /// Gone already, or replaced by another pod of the same name (UID precondition).
    Gone,
}

/// The pods bound to a node, and its VolumeAttachments (only counted: the attach-detach
/// controller detaches them). Errors are what went wrong, without the action.
pub trait NodePods {
    fn node_pods(&self, node: &str) -> impl Future<Output = Result<Vec<Pod>, ApiError>> + Send;
    /// Deletes the pod with a zero grace period, on the condition of its UID.
    fn force_delete_pod(
        &self,
        pod: &Pod,
    ) -> impl Future<Output = Result<PodDeletion, ApiError>> + Send;
    /// The names of the VolumeAttachments on the node.
    fn node_volume_attachments(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Vec<String>, ApiError>> + Send;
}

/// Runs one fence step's methods, in order, until one confirms; the run outlives the pass that
/// starts it (it is spawned, and aborted to cancel).
pub trait FenceRunner {
    fn run_step(
        &self,
        node: String,
        step: Step,
        specs: Vec<MethodSpec>,
    ) -> impl Future<Output = Result<(), StepError>> + Send + 'static;
}

/// Kubernetes Events (the `node_monitor_service::events` writer).
pub trait Events {
    fn record(&self, rec: EventRecord) -> impl Future<Output = ()> + Send;
}

/// Every port the controller needs, on one value.
pub trait Ports:
    Clock + ClusterView + OpRecords + Taints + NodePods + FenceRunner + Events + Send + Sync + 'static
{
}

impl<T> Ports for T where
    T: Clock
        + ClusterView
        + OpRecords
        + Taints
        + NodePods
        + FenceRunner
        + Events
        + Send
        + Sync
        + 'static
{
}
