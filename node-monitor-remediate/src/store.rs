//! Fencing operations kept in the API: one cluster-scoped NodeFence (`nodefences.node-monitor.io`,
//! shipped in `deploy/remediate/crd.yaml`) per node, named after the node and owned by it, so
//! deleting the Node lets the garbage collector delete the operation. The object's spec names the
//! node (name and UID, immutable); the operation itself lives in its status, written only through
//! the status subresource — which only `node-monitor remediate` is granted — before every step
//! starts and after every step ends, with the resourceVersion as a precondition, so a restarted or
//! newly elected controller resumes exactly where the previous one stopped.
use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, ListParams, PostParams},
};
use serde_json::{Value, json};

use node_monitor_core::remediation::{FenceOp, Phase};

/// The API group of NodeFence.
pub const GROUP: &str = "node-monitor.io";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
pub const KIND: &str = "NodeFence";
pub const PLURAL: &str = "nodefences";
/// The CustomResourceDefinition's name.
pub const CRD_NAME: &str = "nodefences.node-monitor.io";
/// Where earlier releases kept operations: ConfigMaps with this prefix in the controller's
/// namespace. They are no longer read (see [`legacy_operations`]).
pub const LEGACY_OP_PREFIX: &str = "node-monitor-fence-";
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "node-monitor-remediate");
/// Every API request of the store is bounded by this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// NodeFence as a dynamic resource (no derive: the schema is the shipped CRD).
pub fn node_fence_resource() -> ApiResource {
    ApiResource {
        group: GROUP.to_owned(),
        version: VERSION.to_owned(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: KIND.to_owned(),
        plural: PLURAL.to_owned(),
    }
}

/// Errors reading or writing operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{action} NodeFence {name}")]
    Api {
        action: &'static str,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{action} NodeFence {name}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout { action: &'static str, name: String },
    #[error("NodeFence {name} changed meanwhile (resourceVersion conflict)")]
    Conflict { name: String },
    #[error("NodeFence {name} status.operation: not a fencing operation")]
    Decode {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "NodeFence {name}: not the operation of node {node:?} it claims to be ({reason}); ignored"
    )]
    Mismatch {
        name: String,
        node: String,
        reason: &'static str,
    },
    #[error(
        "the API server does not serve NodeFences ({GROUP}/{VERSION}): install the \
         CustomResourceDefinition {CRD_NAME} (deploy/remediate/crd.yaml)"
    )]
    NotInstalled,
    #[error("encode the operation of node {node}")]
    Encode {
        node: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The NodeFence name for a node's operation: the node's own name (both are DNS subdomains of at
/// most 253 characters).
pub fn node_fence_name(node: &str) -> String {
    node.to_owned()
}

/// The names of operation ConfigMaps left by an earlier release among `configmaps` (the
/// controller namespace's ConfigMap names). They are not read: in-flight operations are finished
/// or deleted before upgrading (docs/remediate.md).
pub fn legacy_operations<'a>(configmaps: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    configmaps
        .into_iter()
        .filter(|n| n.starts_with(LEGACY_OP_PREFIX))
        .map(str::to_owned)
        .collect()
}

/// `status.phase`: the printed phase ([`Phase::label`]); `status.step`: the fencing step, if any.
fn status_of(op: &FenceOp) -> Result<Value, StoreError> {
    let operation = serde_json::to_value(op).map_err(|source| StoreError::Encode {
        node: op.node.clone(),
        source,
    })?;
    let mut status = json!({ "phase": op.phase.label(), "operation": operation });
    if let Phase::Fencing { step } = op.phase {
        status["step"] = json!(step.as_str());
    }
    if let Some(step) = op.confirmed_by {
        status["confirmedBy"] = json!(step.as_str());
    }
    Ok(status)
}

/// The NodeFence holding `op`: metadata and spec (what a create sets) and status (what the status
/// subresource sets).
pub fn op_object(
    op: &FenceOp,
    resource_version: Option<String>,
) -> Result<DynamicObject, StoreError> {
    let mut obj = DynamicObject::new(&node_fence_name(&op.node), &node_fence_resource());
    obj.metadata = ObjectMeta {
        name: Some(node_fence_name(&op.node)),
        resource_version,
        labels: Some(BTreeMap::from([(
            MANAGED_BY.0.to_owned(),
            MANAGED_BY.1.to_owned(),
        )])),
        owner_references: Some(vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: op.node.clone(),
            uid: op.node_uid.clone(),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    };
    obj.data = json!({
        "spec": { "nodeName": op.node, "nodeUID": op.node_uid },
        "status": status_of(op)?,
    });
    Ok(obj)
}

/// Decodes one stored operation, verifying it is what it claims to be. `None`: a NodeFence whose
/// status holds no operation yet (created, its status not written).
pub fn decode_op(obj: &DynamicObject) -> Result<Option<StoredOp>, StoreError> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let Some(operation) = obj.data.pointer("/status/operation") else {
        return Ok(None);
    };
    let op: FenceOp =
        serde::Deserialize::deserialize(operation).map_err(|source| StoreError::Decode {
            name: name.clone(),
            source,
        })?;
    if let Err(reason) = verify_identity(obj, &op) {
        return Err(StoreError::Mismatch {
            name,
            node: op.node,
            reason,
        });
    }
    Ok(Some(StoredOp {
        op,
        resource_version: obj.metadata.resource_version.clone(),
    }))
}

/// An operation is keyed by its object, never by its status alone: the NodeFence must be the one
/// this controller writes for that node — named [`node_fence_name`] of the node, with the node's
/// name and UID in its spec and the Node (by name and UID) as its owner. A NodeFence that says
/// otherwise (an operation copied onto another node's object) is refused.
pub fn verify_identity(obj: &DynamicObject, op: &FenceOp) -> Result<(), &'static str> {
    if obj.metadata.name.as_deref() != Some(node_fence_name(&op.node).as_str()) {
        return Err("its name is not the one for that node");
    }
    if obj.data.pointer("/spec/nodeName").and_then(Value::as_str) != Some(op.node.as_str()) {
        return Err("its spec.nodeName names another node");
    }
    if obj.data.pointer("/spec/nodeUID").and_then(Value::as_str) != Some(op.node_uid.as_str()) {
        return Err("its spec.nodeUID is another Node's");
    }
    let owned = obj
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|o| o.kind == "Node" && o.name == op.node && o.uid == op.node_uid);
    if !owned {
        return Err("it is not owned by that Node");
    }
    Ok(())
}

/// An operation and the resourceVersion it was read or written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredOp {
    pub op: FenceOp,
    pub resource_version: Option<String>,
}

/// Reads and writes operations.
#[derive(Clone)]
pub struct OpStore {
    api: Api<DynamicObject>,
}

/// `fut` within [`REQUEST_TIMEOUT`]; a 409 is a [`StoreError::Conflict`].
async fn bounded<T>(
    fut: impl Future<Output = Result<T, kube::Error>>,
    action: &'static str,
    name: &str,
) -> Result<T, StoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => Err(StoreError::Conflict {
            name: name.to_owned(),
        }),
        Ok(Err(source)) => Err(StoreError::Api {
            action,
            name: name.to_owned(),
            source: Box::new(source),
        }),
        Err(_) => Err(StoreError::Timeout {
            action,
            name: name.to_owned(),
        }),
    }
}

/// A 404 on the collection: the CRD is not installed.
fn not_installed(e: StoreError) -> StoreError {
    match e {
        StoreError::Api { source, .. } if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 404) => {
            StoreError::NotInstalled
        }
        e => e,
    }
}

impl OpStore {
    pub fn new(client: Client) -> Self {
        Self {
            api: Api::all_with(client, &node_fence_resource()),
        }
    }

    /// Every stored operation; ones that cannot be decoded come back as errors, for the caller
    /// to report (they are left in place for an operator to inspect). A NodeFence without an
    /// operation in its status (its creation interrupted) is no operation.
    pub async fn list(&self) -> Result<Vec<Result<StoredOp, StoreError>>, StoreError> {
        let list = bounded(self.api.list(&ListParams::default()), "list", "*")
            .await
            .map_err(not_installed)?;
        Ok(list
            .items
            .iter()
            .filter_map(|obj| decode_op(obj).transpose())
            .collect())
    }

    /// The stored operation of `node`, as the API has it now.
    pub async fn get(&self, node: &str) -> Result<Option<StoredOp>, StoreError> {
        let name = node_fence_name(node);
        let obj = bounded(self.api.get_opt(&name), "get", &name).await?;
        Ok(obj.map(|o| decode_op(&o)).transpose()?.flatten())
    }

    /// Creates the NodeFence, then writes the operation into its status. A NodeFence of the same
    /// Node left without an operation (a create interrupted between the two writes) is taken
    /// over; any other existing one is a conflict.
    pub async fn create(&self, op: &FenceOp) -> Result<StoredOp, StoreError> {
        let name = node_fence_name(&op.node);
        let obj = op_object(op, None)?;
        let created = match bounded(
            self.api.create(&PostParams::default(), &obj),
            "create",
            &name,
        )
        .await
        {
            Ok(created) => created,
            Err(StoreError::Conflict { .. }) => self.empty_of(op).await?,
            Err(e) => return Err(e),
        };
        let stored = StoredOp {
            op: op.clone(),
            resource_version: created.metadata.resource_version,
        };
        self.update(&stored, op).await
    }

    /// The existing NodeFence of `op`'s node, if it holds no operation and is that Node's.
    async fn empty_of(&self, op: &FenceOp) -> Result<DynamicObject, StoreError> {
        let name = node_fence_name(&op.node);
        let conflict = || StoreError::Conflict { name: name.clone() };
        let existing = bounded(self.api.get_opt(&name), "get", &name)
            .await?
            .ok_or_else(conflict)?;
        if existing.data.pointer("/status/operation").is_some()
            || verify_identity(&existing, op).is_err()
        {
            return Err(conflict());
        }
        Ok(existing)
    }

    /// Replaces the stored operation through the status subresource, on the condition that
    /// nobody else wrote the NodeFence since.
    pub async fn update(&self, stored: &StoredOp, op: &FenceOp) -> Result<StoredOp, StoreError> {
        let name = node_fence_name(&op.node);
        let obj = op_object(op, stored.resource_version.clone())?;
        let written = bounded(
            self.api.replace_status(&name, &PostParams::default(), &obj),
            "replace the status of",
            &name,
        )
        .await?;
        Ok(StoredOp {
            op: op.clone(),
            resource_version: written.metadata.resource_version,
        })
    }

    pub async fn delete(&self, node: &str) -> Result<(), StoreError> {
        let name = node_fence_name(node);
        match bounded(
            self.api.delete(&name, &DeleteParams::default()),
            "delete",
            &name,
        )
        .await
        {
            Ok(_) => Ok(()),
            Err(StoreError::Api { source, .. }) if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 404) => {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests;
