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
    contract::names::STOPPED_REASON,
    release::{STOPPED_MESSAGE, release_plan},
};

mod node;
mod outcome;

pub use self::{
    node::{condition_patch, release_conditions_patch, release_spec_patch},
    outcome::*,
};

/// The component name on Events and the field manager on patches.
pub const COMPONENT: &str = "node-monitor";

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
        node_monitor_service::taint::bounded(self.timeout, call).await
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
