//! Acts on decisions through the Kubernetes API: policy/v1 evictions (PDB-aware, with a metered
//! escalation), Kubernetes Events worded like the kubelet's, agent-owned node conditions and an
//! optional NoSchedule taint. It translates; it decides nothing.
use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::{Node, NodeCondition, ObjectReference, Pod, Taint},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde_json::json;

use super::events::{EventRecord, EventWriter, Reporter, pod_ref};
use tracing::{debug, info, warn};

pub use node_monitor_core::config::PdbPolicy;
pub use node_monitor_core::release::{Release, ReleasePlan};
use node_monitor_core::{
    names::STOPPED_REASON,
    release::{STOPPED_MESSAGE, release_plan},
};

/// The component name on Events and the field manager on patches.
pub const COMPONENT: &str = "node-monitor";

/// One eviction to carry out, as the plan describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvictionRequest {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// Never 0: a zero grace period through the API is a force delete that skips the kubelet.
    pub grace_period_seconds: u32,
    /// The threshold that drives it is hard (PDB escalation applies only then).
    pub hard: bool,
    /// The kubelet's signal name.
    pub signal: String,
    /// The kubelet-style eviction message.
    pub message: String,
    /// The kubelet's eviction Event annotations (`offending_containers`,
    /// `offending_containers_usage`, `starved_resource`, …): they go on the pod's Event, as the
    /// kubelet's `evictPod` records them (`recorder.AnnotatedEventf`).
    pub annotations: BTreeMap<String, String>,
}

/// What happened to an eviction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictOutcome {
    /// The API accepted the eviction.
    Evicted,
    /// Dry-run: decided and reported, nothing touched.
    DryRun,
    /// A PDB blocked it (429 with a `DisruptionBudget` cause) and the policy says respect, or the
    /// threshold is soft.
    PdbBlocked,
    /// The API server throttled the request (429 from API Priority and Fairness or the
    /// max-in-flight filter: no `DisruptionBudget` cause). Never escalated; every eviction waits
    /// `retry_after` (the server's `Retry-After`, bounded).
    Throttled { retry_after: Duration },
    /// A PDB blocked it under a hard threshold and the pod was deleted with the planned grace.
    Escalated,
    /// The pod (with this UID) no longer exists.
    Gone,
    /// Any other API answer, or none: the pod backs off and the next candidate is considered.
    Failed {
        code: Option<u16>,
        kind: FailureKind,
        reason: String,
    },
}

/// Why an eviction request failed, for `node_monitor_eviction_failures_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// 403: RBAC, an admission policy or a webhook refused it.
    Forbidden,
    /// 422: the request was invalid for this pod.
    Invalid,
    /// 500 because more than one PodDisruptionBudget selects the pod (the eviction API refuses
    /// such pods for ever; only a delete gets rid of them).
    MultiplePdbs,
    /// Another 5xx answer from the API server (a failing webhook, etcd trouble).
    ServerError,
    /// 502, 503, 504, or no answer at all (connection refused, reset, TLS): the API server is
    /// unavailable rather than refusing this pod.
    Unavailable,
    /// No answer within the API timeout.
    Timeout,
    /// Another 4xx answer.
    ClientError,
}

impl FailureKind {
    /// Every kind, for zero-initialised metric series.
    pub const ALL: [FailureKind; 7] = [
        Self::Forbidden,
        Self::Invalid,
        Self::MultiplePdbs,
        Self::ServerError,
        Self::Unavailable,
        Self::Timeout,
        Self::ClientError,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Forbidden => "forbidden",
            Self::Invalid => "invalid",
            Self::MultiplePdbs => "multiple_pdbs",
            Self::ServerError => "server_error",
            Self::Unavailable => "unavailable",
            Self::Timeout => "timeout",
            Self::ClientError => "client_error",
        }
    }

    /// The API server as a whole, not this pod, is the problem: retrying other pods at once would
    /// only fail the same way.
    pub fn api_unavailable(self) -> bool {
        matches!(self, Self::Unavailable | Self::Timeout)
    }

    /// The kind of an answered request, from its HTTP code and Status message.
    pub fn of_status(code: u16, message: &str) -> Self {
        match code {
            403 => Self::Forbidden,
            422 => Self::Invalid,
            500 if message.contains("more than one PodDisruptionBudget") => Self::MultiplePdbs,
            502..=504 => Self::Unavailable,
            500..=599 => Self::ServerError,
            _ => Self::ClientError,
        }
    }

    /// The kind of a failed request: its Status when the API answered, else whether the
    /// transport timed out.
    pub fn of_error(e: &kube::Error) -> (Option<u16>, Self) {
        if let kube::Error::Api(s) = e {
            return (Some(s.code), Self::of_status(s.code, &s.message));
        }
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
        while let Some(err) = cur {
            if let Some(io) = err.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::TimedOut
            {
                return (None, Self::Timeout);
            }
            if err.is::<tokio::time::error::Elapsed>() {
                return (None, Self::Timeout);
            }
            cur = err.source();
        }
        (None, Self::Unavailable)
    }
}

impl EvictOutcome {
    /// The metric label for this outcome.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::DryRun => "dry_run",
            Self::PdbBlocked => "pdb_blocked",
            Self::Throttled { .. } => "throttled",
            Self::Escalated => "escalated",
            Self::Gone => "gone",
            Self::Failed { .. } => "failed",
        }
    }

    /// The eviction took effect (the pod will terminate).
    pub fn took_effect(&self) -> bool {
        matches!(self, Self::Evicted | Self::Escalated)
    }
}

/// The cause type the eviction API puts on a refusal by a PodDisruptionBudget
/// (`policyv1.DisruptionBudgetCause`, k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go).
pub const DISRUPTION_BUDGET_CAUSE: &str = "DisruptionBudget";
/// Bounds on a throttled eviction path's wait: a `Retry-After` outside them is clamped, none means
/// the shortest.
pub const RETRY_AFTER_MIN: Duration = Duration::from_secs(1);
pub const RETRY_AFTER_MAX: Duration = Duration::from_secs(30);

/// What an eviction answer other than success means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A PodDisruptionBudget refused it: 429 whose Status carries a `DisruptionBudget` cause.
    DisruptionBudget { message: String },
    /// The server throttled the request: 429 without that cause (API Priority and Fairness,
    /// max-in-flight), with its `Retry-After` bounded to [`RETRY_AFTER_MIN`]..[`RETRY_AFTER_MAX`].
    Throttled { retry_after: Duration },
    /// 404, or 409 (the UID precondition failed): the pod meant is gone.
    Gone,
    /// Anything else.
    Failed {
        code: u16,
        kind: FailureKind,
        message: String,
    },
}

/// Classifies a non-2xx answer to an eviction: the HTTP code, the `Retry-After` header and the
/// body (a `Status` from the registry; plain text from the APF and max-in-flight filters). Only a
/// 429 whose Status names a `DisruptionBudget` cause is a PDB: a throttled request is never
/// mistaken for one, so it is never escalated to a delete.
pub fn classify_refusal(code: u16, retry_after: Option<&str>, body: &[u8]) -> Refusal {
    let status: Option<kube::core::Status> = serde_json::from_slice(body).ok();
    let message = status.as_ref().map_or_else(
        || String::from_utf8_lossy(body).trim().to_owned(),
        |s| s.message.clone(),
    );
    match code {
        429 => {
            let pdb = status.as_ref().is_some_and(|s| {
                s.details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == DISRUPTION_BUDGET_CAUSE))
            });
            if pdb {
                return Refusal::DisruptionBudget { message };
            }
            let header = retry_after.and_then(|v| v.trim().parse::<u64>().ok());
            let details = status
                .as_ref()
                .and_then(|s| s.details.as_ref())
                .map(|d| u64::from(d.retry_after_seconds))
                .filter(|s| *s > 0);
            let secs = header
                .or(details)
                .map_or(RETRY_AFTER_MIN, Duration::from_secs);
            Refusal::Throttled {
                retry_after: secs.clamp(RETRY_AFTER_MIN, RETRY_AFTER_MAX),
            }
        }
        404 | 409 => Refusal::Gone,
        _ => Refusal::Failed {
            code,
            kind: FailureKind::of_status(code, &message),
            message,
        },
    }
}

/// The actuator's settings.
#[derive(Debug, Clone)]
pub struct ActuatorConfig {
    pub node_name: String,
    pub pdb_policy: PdbPolicy,
    pub dry_run: bool,
}

/// An agent-owned node condition. Types the kubelet owns are refused by [`Actuator::set_conditions`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConditionUpdate {
    /// e.g. `NodeMonitorMemoryPressure`.
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// Conditions the kubelet (or the node lifecycle controller) writes: never touched.
const KUBELET_CONDITIONS: [&str; 5] = [
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];

/// Errors talking to the API for node status and taints.
#[derive(Debug, thiserror::Error)]
pub enum ActuatorError {
    #[error("refusing to write condition {0:?}: the kubelet owns it")]
    KubeletOwnedCondition(String),
    #[error("node {node}: {what}")]
    Api {
        node: String,
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("pod {pod}: {what}")]
    PodApi {
        pod: String,
        what: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// What a pod deletion did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The API accepted the deletion; the pod terminates with the grace period.
    Deleted,
    /// The pod (with this UID) no longer exists.
    Gone,
}

/// Executes actions through the API. Every call is bounded by the API timeout
/// ([`super::DEFAULT_API_TIMEOUT`] unless [`Actuator::with_timeout`] says otherwise): a black-holed
/// API server fails the call instead of wedging the caller.
#[derive(Clone)]
pub struct Actuator {
    client: Client,
    cfg: ActuatorConfig,
    timeout: Duration,
}

impl Actuator {
    pub fn new(client: Client, cfg: ActuatorConfig) -> Self {
        Self {
            client,
            cfg,
            timeout: super::DEFAULT_API_TIMEOUT,
        }
    }

    /// The bound on each API call.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Runs one API call within the timeout; running out of it is a [`kube::Error::Service`]
    /// wrapping [`tokio::time::error::Elapsed`] ([`FailureKind::Timeout`]).
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or_else(|elapsed| Err(kube::Error::Service(Box::new(elapsed))))
    }

    pub fn config(&self) -> &ActuatorConfig {
        &self.cfg
    }

    /// Evicts through policy/v1 `pods/eviction` with the planned grace period and a UID
    /// precondition (a re-created pod with the same name is never hit). When a PDB refuses it
    /// ([`classify_refusal`]), escalates to a plain delete only when the threshold is hard and the
    /// policy says so; a throttled request is never escalated.
    #[tracing::instrument(skip(self, req), fields(pod = %format!("{}/{}", req.namespace, req.name), signal = %req.signal))]
    pub async fn evict(&self, req: &EvictionRequest) -> EvictOutcome {
        if self.cfg.dry_run {
            debug!(grace = req.grace_period_seconds, message = %req.message, "dry-run: would evict");
            return EvictOutcome::DryRun;
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &req.namespace);
        let delete = DeleteParams {
            grace_period_seconds: Some(req.grace_period_seconds.max(1)),
            preconditions: Some(Preconditions {
                uid: Some(req.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let answer = self
            .bounded(post_eviction(
                &self.client,
                &req.namespace,
                &req.name,
                &req.uid,
                req.grace_period_seconds.max(1),
            ))
            .await;
        match answer {
            Ok(None) => {
                info!(grace = req.grace_period_seconds, "evicted");
                EvictOutcome::Evicted
            }
            Ok(Some(Refusal::DisruptionBudget { message })) => {
                if req.hard && self.cfg.pdb_policy == PdbPolicy::Escalate {
                    warn!(reason = %message, "eviction blocked by a disruption budget under a hard threshold; escalating to delete");
                    match self.bounded(pods.delete(&req.name, &delete)).await {
                        Ok(_) => EvictOutcome::Escalated,
                        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                            EvictOutcome::Gone
                        }
                        Err(kube::Error::Api(s)) if s.code == 429 => {
                            warn!(reason = %s.message, "the escalated delete was throttled");
                            EvictOutcome::Throttled {
                                retry_after: RETRY_AFTER_MIN,
                            }
                        }
                        Err(e) => failed(e),
                    }
                } else {
                    info!(reason = %message, "eviction blocked by a disruption budget");
                    EvictOutcome::PdbBlocked
                }
            }
            Ok(Some(Refusal::Throttled { retry_after })) => {
                warn!(
                    ?retry_after,
                    "eviction throttled by the API server (no disruption budget involved); every eviction waits"
                );
                EvictOutcome::Throttled { retry_after }
            }
            Ok(Some(Refusal::Gone)) => EvictOutcome::Gone,
            Ok(Some(Refusal::Failed {
                code,
                kind,
                message,
            })) => {
                warn!(code, kind = kind.label(), %message, "eviction refused");
                EvictOutcome::Failed {
                    code: Some(code),
                    kind,
                    reason: message,
                }
            }
            Err(e) => failed(e),
        }
    }

    /// Is the pod with this UID still present in the API?
    pub async fn pod_present(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        Ok(self
            .bounded(pods.get_opt(name))
            .await?
            .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid)))
    }

    /// Records a Warning Event on the pod and one on the node, with the kubelet's reason
    /// (`Evicted`) and message; the pod's carries the request's annotations, as the kubelet's
    /// does. Failures are logged: an Event is never worth a failed cycle.
    pub async fn record_eviction_events(&self, req: &EvictionRequest, outcome: &EvictOutcome) {
        let (reason, prefix) = match outcome {
            EvictOutcome::Evicted | EvictOutcome::Escalated => ("Evicted", ""),
            EvictOutcome::DryRun => ("EvictionDryRun", "dry-run, not evicted: "),
            EvictOutcome::PdbBlocked => ("EvictionBlocked", "blocked by a PodDisruptionBudget: "),
            EvictOutcome::Gone | EvictOutcome::Failed { .. } | EvictOutcome::Throttled { .. } => {
                return;
            }
        };
        let message = format!("{prefix}{}", req.message);
        let events = self.events();
        events
            .record(&EventRecord {
                namespace: req.namespace.clone(),
                involved: pod_ref(&req.namespace, &req.name, &req.uid),
                warning: true,
                reason: reason.to_owned(),
                message: message.clone(),
                annotations: req.annotations.clone(),
            })
            .await;
        let node_msg = format!("{}/{}: {message}", req.namespace, req.name);
        events.record(&self.node_event(reason, &node_msg)).await;
    }

    /// Posts a Warning Event about the node itself (shutdown, last gasp, …).
    pub async fn record_node_event(&self, reason: &str, message: &str) {
        self.events()
            .record(&self.node_event(reason, message))
            .await;
    }

    /// The agent's Events: its component, its node as the host and the instance.
    fn events(&self) -> EventWriter {
        EventWriter::new(
            self.client.clone(),
            Reporter {
                component: COMPONENT,
                instance: self.cfg.node_name.clone(),
                host: Some(self.cfg.node_name.clone()),
            },
            self.timeout,
        )
    }

    /// A Warning Event about the node, in `default`.
    fn node_event(&self, reason: &str, message: &str) -> EventRecord {
        // The kubelet references its node by name with the name as UID (pkg/kubelet/kubelet.go).
        let involved = ObjectReference {
            kind: Some("Node".into()),
            name: Some(self.cfg.node_name.clone()),
            uid: Some(self.cfg.node_name.clone()),
            ..ObjectReference::default()
        };
        EventRecord {
            namespace: "default".to_owned(),
            involved,
            warning: true,
            reason: reason.to_owned(),
            message: message.to_owned(),
            annotations: BTreeMap::new(),
        }
    }

    /// Sets agent-owned conditions on the node's status. A strategic merge patch keyed by `type`
    /// touches only these entries, so the kubelet's conditions are never rewritten. Reads the node
    /// first: `lastTransitionTime` moves only when a condition's status changes
    /// ([`condition_patch`]), as the kubelet's own conditions do.
    pub async fn set_conditions(
        &self,
        updates: &[NodeConditionUpdate],
    ) -> Result<(), ActuatorError> {
        if let Some(u) = updates
            .iter()
            .find(|u| KUBELET_CONDITIONS.contains(&u.type_.as_str()))
        {
            return Err(ActuatorError::KubeletOwnedCondition(u.type_.clone()));
        }
        if updates.is_empty() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.client.clone());
        let err = |what, source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what,
            source,
        };
        let node = self
            .bounded(nodes.get(&self.cfg.node_name))
            .await
            .map_err(|e| err("get node", e))?;
        let existing = node.status.and_then(|s| s.conditions).unwrap_or_default();
        let conditions = condition_patch(&existing, updates, Timestamp::now());
        self.bounded(nodes.patch_status(
            &self.cfg.node_name,
            &PatchParams::default(),
            &Patch::Strategic(json!({ "status": { "conditions": conditions } })),
        ))
        .await
        .map(|_| ())
        .map_err(|e| err("patch conditions", e))
    }

    /// Adds (`present`) or removes a taint of the agent's own, keyed by `key` and `effect`. Uses the
    /// node's resourceVersion for optimistic concurrency and retries on conflict.
    pub async fn set_taint(
        &self,
        key: &str,
        value: &str,
        effect: &str,
        present: bool,
    ) -> Result<bool, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let err = |what, source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what,
            source,
        };
        for attempt in 0..5u32 {
            let node = self
                .bounded(nodes.get(&self.cfg.node_name))
                .await
                .map_err(|e| err("get node", e))?;
            let mut taints = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            let has = taints.iter().any(|t| t.key == key && t.effect == effect);
            if has == present {
                return Ok(false);
            }
            if present {
                taints.push(Taint {
                    key: key.to_owned(),
                    value: Some(value.to_owned()),
                    effect: effect.to_owned(),
                    time_added: None,
                });
            } else {
                taints.retain(|t| !(t.key == key && t.effect == effect));
            }
            let patch = json!({
                "metadata": { "resourceVersion": node.metadata.resource_version },
                "spec": { "taints": taints },
            });
            match self
                .bounded(nodes.patch(
                    &self.cfg.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                ))
                .await
            {
                Ok(_) => {
                    info!(key, effect, present, "node taint updated");
                    return Ok(true);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    debug!(attempt, "node changed under us; retrying taint update");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
                }
                Err(e) => return Err(err("patch taints", e)),
            }
        }
        Err(err(
            "patch taints",
            kube::Error::Api(Box::new(conflict_status())),
        ))
    }

    /// Deletes a pod with a grace period and a UID precondition (a re-created pod with the same
    /// name is never hit). Never with 0: a zero grace period through the API is a force delete
    /// that removes the pod before its processes stop. Not the eviction API: like the kubelet's
    /// shutdown manager, a node going down terminates its pods whatever their disruption budgets.
    pub async fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        grace_period_seconds: u32,
    ) -> Result<DeleteOutcome, ActuatorError> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let dp = DeleteParams {
            grace_period_seconds: Some(grace_period_seconds.max(1)),
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.bounded(pods.delete(name, &dp)).await {
            Ok(_) => Ok(DeleteOutcome::Deleted),
            // 404: gone; 409: the UID precondition failed, so the pod we meant is gone.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(DeleteOutcome::Gone),
            Err(source) => Err(ActuatorError::PodApi {
                pod: format!("{namespace}/{name}"),
                what: "delete",
                source,
            }),
        }
    }

    /// Cordons (`true`) or uncordons the node (`spec.unschedulable`). Returns whether it was
    /// unschedulable before, so a caller can undo only what it did.
    pub async fn set_unschedulable(&self, unschedulable: bool) -> Result<bool, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let err = |what, source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what,
            source,
        };
        let node = self
            .bounded(nodes.get(&self.cfg.node_name))
            .await
            .map_err(|e| err("get node", e))?;
        let before = node
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        if before != unschedulable {
            self.bounded(nodes.patch(
                &self.cfg.node_name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "unschedulable": unschedulable } })),
            ))
            .await
            .map_err(|e| err("patch unschedulable", e))?;
            info!(unschedulable, "node schedulability updated");
        }
        Ok(before)
    }

    /// Sets (`Some`) or removes (`None`) one annotation on the node, with a single merge patch.
    pub async fn annotate_node(&self, key: &str, value: Option<&str>) -> Result<(), ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        self.bounded(nodes.patch(
            &self.cfg.node_name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { key: value } } })),
        ))
        .await
        .map(|_| ())
        .map_err(|source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what: "patch annotation",
            source,
        })
    }

    /// The value of one annotation on the node.
    pub async fn node_annotation(&self, key: &str) -> Result<Option<String>, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = self
            .bounded(nodes.get(&self.cfg.node_name))
            .await
            .map_err(|source| ActuatorError::Api {
                node: self.cfg.node_name.clone(),
                what: "get node",
                source,
            })?;
        Ok(node.metadata.annotations.and_then(|mut a| a.remove(key)))
    }

    /// Whether the node is cordoned (`spec.unschedulable`).
    pub async fn is_unschedulable(&self) -> Result<bool, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.cfg.node_name)
            .await
            .map_err(|source| ActuatorError::Api {
                node: self.cfg.node_name.clone(),
                what: "get node",
                source,
            })?;
        Ok(node.spec.and_then(|s| s.unschedulable).unwrap_or(false))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Takes back node-monitor's marks from the node as [`release_plan`] decides for `release`
    /// (a clean stop, or `node-monitor cleanup`), and returns what it wrote. With `dry_run`, only
    /// reads the node and returns the plan.
    ///
    /// Taints, annotations and the cordon go in one merge patch carrying the node's
    /// resourceVersion (a conflict re-reads the node and plans again); conditions in one strategic
    /// merge patch of the status keyed by `type`: `Unknown` entries keep their
    /// `lastHeartbeatTime`, removed ones are `$patch: delete`. Each call is bounded by the API
    /// timeout; callers bound the whole.
    pub async fn release(
        &self,
        release: Release,
        dry_run: bool,
    ) -> Result<ReleasePlan, ActuatorError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let err = |what, source| ActuatorError::Api {
            node: self.cfg.node_name.clone(),
            what,
            source,
        };
        let mut written = ReleasePlan::default();
        for attempt in 0..5u32 {
            let node = self
                .bounded(nodes.get(&self.cfg.node_name))
                .await
                .map_err(|e| err("get node", e))?;
            let plan = release_plan(&node, release);
            if dry_run {
                return Ok(plan);
            }
            if attempt == 0 && plan.has_conditions() {
                let conditions = release_conditions_patch(&plan, Timestamp::now());
                self.bounded(nodes.patch_status(
                    &self.cfg.node_name,
                    &PatchParams::default(),
                    &Patch::Strategic(json!({ "status": { "conditions": conditions } })),
                ))
                .await
                .map_err(|e| err("patch conditions", e))?;
                written.unknown_conditions = plan.unknown_conditions.clone();
                written.remove_conditions = plan.remove_conditions.clone();
            }
            if !plan.touches_spec() {
                return Ok(written);
            }
            let patch = release_spec_patch(&node, &plan);
            match self
                .bounded(nodes.patch(
                    &self.cfg.node_name,
                    &PatchParams::default(),
                    &Patch::Merge(patch),
                ))
                .await
            {
                Ok(_) => {
                    written.remove_taints = plan.remove_taints;
                    written.remove_annotations = plan.remove_annotations;
                    written.uncordon = plan.uncordon;
                    return Ok(written);
                }
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    debug!(attempt, "node changed under us; planning the release again");
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(attempt + 1))).await;
                }
                Err(e) => return Err(err("patch node", e)),
            }
        }
        Err(err(
            "patch node",
            kube::Error::Api(Box::new(conflict_status())),
        ))
    }
}

/// The `status.conditions` entries of a release: `Unknown` with [`STOPPED_REASON`] and
/// `lastTransitionTime` `now` (no `lastHeartbeatTime`: the strategic merge keeps the old one, as
/// the node lifecycle controller does for a silent kubelet), and `$patch: delete` for removals.
pub fn release_conditions_patch(plan: &ReleasePlan, now: Timestamp) -> Vec<serde_json::Value> {
    plan.unknown_conditions
        .iter()
        .map(|c| {
            json!({
                "type": c,
                "status": "Unknown",
                "reason": STOPPED_REASON,
                "message": STOPPED_MESSAGE,
                "lastTransitionTime": Time(now),
            })
        })
        .chain(
            plan.remove_conditions
                .iter()
                .map(|c| json!({ "type": c, "$patch": "delete" })),
        )
        .collect()
}

/// The merge patch of a release on the node object: the taints without the removed ones, the
/// removed annotations as `null`, `unschedulable: false` when uncordoning, and the node's
/// resourceVersion (the taint list is replaced whole).
pub fn release_spec_patch(node: &Node, plan: &ReleasePlan) -> serde_json::Value {
    let mut patch = json!({ "metadata": { "resourceVersion": node.metadata.resource_version } });
    if !plan.remove_taints.is_empty() {
        let taints: Vec<&Taint> = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_deref())
            .unwrap_or_default()
            .iter()
            .filter(|t| {
                !plan
                    .remove_taints
                    .iter()
                    .any(|r| r.key == t.key && r.effect == t.effect)
            })
            .collect();
        patch["spec"]["taints"] = json!(taints);
    }
    if plan.uncordon {
        patch["spec"]["unschedulable"] = json!(false);
    }
    if !plan.remove_annotations.is_empty() {
        let nulls: serde_json::Map<String, serde_json::Value> = plan
            .remove_annotations
            .iter()
            .map(|a| (a.clone(), serde_json::Value::Null))
            .collect();
        patch["metadata"]["annotations"] = serde_json::Value::Object(nulls);
    }
    patch
}

/// The `status.conditions` entries to patch for `updates`: `lastHeartbeatTime` is `now`;
/// `lastTransitionTime` is kept from the node's current condition of the same type when the status
/// does not change (the kubelet's `setNodeStatus` does the same), and `now` when it does or the
/// condition is new.
pub fn condition_patch(
    existing: &[NodeCondition],
    updates: &[NodeConditionUpdate],
    now: Timestamp,
) -> Vec<serde_json::Value> {
    updates
        .iter()
        .map(|u| {
            let status = if u.status { "True" } else { "False" };
            let transition = existing
                .iter()
                .find(|c| c.type_ == u.type_ && c.status == status)
                .and_then(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            json!({
                "type": u.type_,
                "status": status,
                "reason": u.reason,
                "message": u.message,
                "lastHeartbeatTime": Time(now),
                "lastTransitionTime": transition,
            })
        })
        .collect()
}

fn conflict_status() -> kube::core::Status {
    kube::core::Status::failure("node kept changing during the taint update", "Conflict")
        .with_code(409)
}

fn failed(e: kube::Error) -> EvictOutcome {
    let (code, kind) = FailureKind::of_error(&e);
    warn!(error = %e, kind = kind.label(), "eviction request failed");
    EvictOutcome::Failed {
        code,
        kind,
        reason: e.to_string(),
    }
}

/// `POST pods/<name>/eviction` with a policy/v1 Eviction whose `deleteOptions` carry the grace
/// period and the UID precondition. kube's `Api::evict` (kube-core 5) serialises the options
/// under `delete_options`, a field the API server ignores: the pod's own
/// terminationGracePeriodSeconds would apply and the UID precondition would be lost.
pub async fn evict_with_options(
    pods: &Api<Pod>,
    name: &str,
    uid: &str,
    grace_period_seconds: u32,
) -> Result<serde_json::Value, kube::Error> {
    let body = eviction_body(pods_namespace(pods), name, uid, grace_period_seconds);
    pods.create_subresource("eviction", name, &PostParams::default(), &body)
        .await
}

/// `POST pods/<name>/eviction` as [`evict_with_options`] does, keeping what kube's typed calls
/// drop: the `Retry-After` header. `Ok(None)`: accepted; `Ok(Some(_))`: refused, classified.
async fn post_eviction(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
    grace_period_seconds: u32,
) -> Result<Option<Refusal>, kube::Error> {
    use kube::Resource as _;
    let body = eviction_body(Some(namespace.to_owned()), name, uid, grace_period_seconds);
    let data = serde_json::to_vec(&body).map_err(kube::Error::SerdeError)?;
    let request = kube::core::Request::new(Pod::url_path(&(), Some(namespace)))
        .create_subresource("eviction", name, &PostParams::default(), data)
        .map_err(kube::Error::BuildRequest)?;
    let response = client.send(request.map(kube::client::Body::from)).await?;
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = response.into_body().collect_bytes().await?;
    if (200..300).contains(&code) {
        return Ok(None);
    }
    Ok(Some(classify_refusal(code, retry_after.as_deref(), &bytes)))
}

fn pods_namespace(pods: &Api<Pod>) -> Option<String> {
    pods.namespace().map(str::to_owned)
}

/// The policy/v1 Eviction for one pod.
pub fn eviction_body(
    namespace: Option<String>,
    name: &str,
    uid: &str,
    grace_period_seconds: u32,
) -> k8s_openapi::api::policy::v1::Eviction {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;
    k8s_openapi::api::policy::v1::Eviction {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace,
            ..Default::default()
        },
        delete_options: Some(meta::DeleteOptions {
            grace_period_seconds: Some(i64::from(grace_period_seconds)),
            preconditions: Some(meta::Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        }),
    }
}

#[cfg(test)]
mod tests;
