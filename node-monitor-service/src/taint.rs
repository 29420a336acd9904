//! A node taint written safely by either product: the agent's own taints (pressure,
//! shutting down) and remediate's out-of-service taint. One read-modify-write of
//! `spec.taints` under the node's resourceVersion, retried on conflict, so another writer's
//! taints (the kubelet's, the node lifecycle controller's, an operator's) are never lost.
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tracing::{debug, info};

/// The taint to add or remove, keyed by `key` and `effect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaintSpec<'a> {
    pub key: &'a str,
    pub value: &'a str,
    pub effect: &'a str,
}

/// A failed node read or write: which one, and the API's answer.
#[derive(Debug, thiserror::Error)]
#[error("node {node}: {what}")]
pub struct NodeWriteError {
    pub node: String,
    pub what: &'static str,
    #[source]
    pub source: kube::Error,
}

/// How many times a write is retried when the node changes under it.
pub const CONFLICT_ATTEMPTS: u32 = 5;

/// The error of a write that lost every attempt to other writers.
pub fn conflict_status() -> kube::core::Status {
    kube::core::Status::failure("node kept changing during the taint update", "Conflict")
        .with_code(409)
}

/// `call`, failed as a service error when it takes longer than `timeout`: one API call bounded
/// as a whole (the agent's actuator bounds every call this way too).
pub async fn bounded<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    tokio::time::timeout(timeout, call)
        .await
        .unwrap_or_else(|elapsed| Err(kube::Error::Service(Box::new(elapsed))))
}

/// Adds (`present`) or removes `taint` on `node`; whether the node changed. Each call is bounded
/// by `timeout`; a conflict is retried [`CONFLICT_ATTEMPTS`] times.
pub async fn set_taint(
    client: &Client,
    node: &str,
    taint: TaintSpec<'_>,
    present: bool,
    timeout: Duration,
) -> Result<bool, NodeWriteError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let err = |what, source| NodeWriteError {
        node: node.to_owned(),
        what,
        source,
    };
    let TaintSpec { key, value, effect } = taint;
    for attempt in 0..CONFLICT_ATTEMPTS {
        let current = bounded(timeout, nodes.get(node))
            .await
            .map_err(|e| err("get node", e))?;
        let mut taints = current
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
            "metadata": { "resourceVersion": current.metadata.resource_version },
            "spec": { "taints": taints },
        });
        match bounded(
            timeout,
            nodes.patch(node, &PatchParams::default(), &Patch::Merge(patch)),
        )
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
