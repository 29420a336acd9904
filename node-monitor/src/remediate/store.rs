//! Fencing operations kept in the API: one ConfigMap per node (`node-monitor-fence-<node>`) in the
//! controller's namespace, holding the operation as JSON. Written before every step starts and
//! after every step ends, with the resourceVersion as a precondition, so a restarted or newly
//! elected controller resumes exactly where the previous one stopped. The ConfigMap is owned by
//! the Node: deleting the Node lets the garbage collector delete the operation.
use std::{collections::BTreeMap, time::Duration};

use k8s_openapi::{
    api::core::v1::ConfigMap,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};

use node_monitor_core::{names::FENCE_NODE_ANNOTATION, remediation::FenceOp};

pub const OP_PREFIX: &str = "node-monitor-fence-";
pub const OP_KEY: &str = "operation.json";
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "node-monitor-remediate");
pub const COMPONENT: (&str, &str) = ("app.kubernetes.io/component", "fence-operation");
/// Every API request of the store is bounded by this.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors reading or writing operations.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{action} ConfigMap {namespace}/{name}")]
    Api {
        action: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("{action} ConfigMap {namespace}/{name}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout {
        action: &'static str,
        namespace: String,
        name: String,
    },
    #[error("ConfigMap {namespace}/{name} changed meanwhile (resourceVersion conflict)")]
    Conflict { namespace: String, name: String },
    #[error("ConfigMap {namespace}/{name} key {OP_KEY}: not a fencing operation")]
    Decode {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "ConfigMap {namespace}/{name}: not the operation of node {node:?} it claims to be ({reason}); ignored"
    )]
    Mismatch {
        namespace: String,
        name: String,
        node: String,
        reason: &'static str,
    },
    #[error("encode the operation of node {node}")]
    Encode {
        node: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The ConfigMap name for a node's operation: the prefix and the node name, shortened with a
/// hash when the result would exceed the 253 characters of an object name.
pub fn op_configmap_name(node: &str) -> String {
    let full = format!("{OP_PREFIX}{node}");
    if full.len() <= 253 {
        return full;
    }
    // FNV-1a: stable across releases, no dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let keep: String = node.chars().take(253 - OP_PREFIX.len() - 17).collect();
    format!("{OP_PREFIX}{}-{h:016x}", keep.trim_end_matches(['.', '-']))
}

/// Decodes one stored operation of `namespace`, verifying it is what it claims to be.
pub fn decode_op(namespace: &str, cm: &ConfigMap) -> Result<StoredOp, StoreError> {
    let name = cm.metadata.name.clone().unwrap_or_default();
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(OP_KEY))
        .map_or("", String::as_str);
    let op: FenceOp = serde_json::from_str(text).map_err(|source| StoreError::Decode {
        namespace: namespace.to_owned(),
        name: name.clone(),
        source,
    })?;
    if let Err(reason) = verify_identity(cm, &op) {
        return Err(StoreError::Mismatch {
            namespace: namespace.to_owned(),
            name,
            node: op.node,
            reason,
        });
    }
    Ok(StoredOp {
        op,
        resource_version: cm.metadata.resource_version.clone(),
    })
}

/// The ConfigMap holding `op`.
pub fn op_object(
    namespace: &str,
    op: &FenceOp,
    resource_version: Option<String>,
) -> Result<ConfigMap, StoreError> {
    let json = serde_json::to_string_pretty(op).map_err(|source| StoreError::Encode {
        node: op.node.clone(),
        source,
    })?;
    Ok(ConfigMap {
        metadata: ObjectMeta {
            name: Some(op_configmap_name(&op.node)),
            namespace: Some(namespace.to_owned()),
            resource_version,
            labels: Some(BTreeMap::from([
                (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
                (COMPONENT.0.to_owned(), COMPONENT.1.to_owned()),
            ])),
            annotations: Some(BTreeMap::from([(
                FENCE_NODE_ANNOTATION.to_owned(),
                op.node.clone(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Node".to_owned(),
                name: op.node.clone(),
                uid: op.node_uid.clone(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(OP_KEY.to_owned(), json)])),
        ..ConfigMap::default()
    })
}

/// An operation is keyed by its object's name, never by its JSON alone: the ConfigMap must be
/// the one this controller writes for that node — named [`op_configmap_name`] of the node, with
/// the node's full name in [`FENCE_NODE_ANNOTATION`] and the Node (by name and UID) as its owner. A
/// ConfigMap that says otherwise (copied, renamed, or edited to point at another node) is refused.
pub fn verify_identity(cm: &ConfigMap, op: &FenceOp) -> Result<(), &'static str> {
    if cm.metadata.name.as_deref() != Some(op_configmap_name(&op.node).as_str()) {
        return Err("its name is not the one for that node");
    }
    let annotated = cm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FENCE_NODE_ANNOTATION));
    if annotated != Some(&op.node) {
        return Err("its node annotation names another node");
    }
    let owned = cm
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
    api: Api<ConfigMap>,
    namespace: String,
}

async fn bounded<T>(
    fut: impl Future<Output = Result<T, kube::Error>>,
    action: &'static str,
    namespace: &str,
    name: &str,
) -> Result<T, StoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => Err(StoreError::Conflict {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
        Ok(Err(source)) => Err(StoreError::Api {
            action,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source: Box::new(source),
        }),
        Err(_) => Err(StoreError::Timeout {
            action,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        }),
    }
}

impl OpStore {
    pub fn new(client: Client, namespace: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
        }
    }

    fn object(
        &self,
        op: &FenceOp,
        resource_version: Option<String>,
    ) -> Result<ConfigMap, StoreError> {
        op_object(&self.namespace, op, resource_version)
    }

    /// Decodes one stored operation.
    pub fn decode(&self, cm: &ConfigMap) -> Result<StoredOp, StoreError> {
        decode_op(&self.namespace, cm)
    }

    /// Every stored operation; ones that cannot be decoded come back as errors, for the caller
    /// to report (they are left in place for an operator to inspect).
    pub async fn list(&self) -> Result<Vec<Result<StoredOp, StoreError>>, StoreError> {
        let lp = ListParams::default().labels(&format!("{}={}", COMPONENT.0, COMPONENT.1));
        let list = bounded(self.api.list(&lp), "list", &self.namespace, "*").await?;
        Ok(list.items.iter().map(|cm| self.decode(cm)).collect())
    }

    /// The stored operation of `node`, as the API has it now.
    pub async fn get(&self, node: &str) -> Result<Option<StoredOp>, StoreError> {
        let name = op_configmap_name(node);
        let cm = bounded(self.api.get_opt(&name), "get", &self.namespace, &name).await?;
        cm.map(|cm| self.decode(&cm)).transpose()
    }

    pub async fn create(&self, op: &FenceOp) -> Result<StoredOp, StoreError> {
        let name = op_configmap_name(&op.node);
        let obj = self.object(op, None)?;
        let cm = bounded(
            self.api.create(&PostParams::default(), &obj),
            "create",
            &self.namespace,
            &name,
        )
        .await?;
        Ok(StoredOp {
            op: op.clone(),
            resource_version: cm.metadata.resource_version,
        })
    }

    /// Replaces the stored operation, on the condition that nobody else wrote it since.
    pub async fn update(&self, stored: &StoredOp, op: &FenceOp) -> Result<StoredOp, StoreError> {
        let name = op_configmap_name(&op.node);
        let obj = self.object(op, stored.resource_version.clone())?;
        let cm = bounded(
            self.api.replace(&name, &PostParams::default(), &obj),
            "replace",
            &self.namespace,
            &name,
        )
        .await?;
        Ok(StoredOp {
            op: op.clone(),
            resource_version: cm.metadata.resource_version,
        })
    }

    pub async fn delete(&self, node: &str) -> Result<(), StoreError> {
        let name = op_configmap_name(node);
        match bounded(
            self.api.delete(&name, &DeleteParams::default()),
            "delete",
            &self.namespace,
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
mod tests {
    use super::*;

    #[test]
    fn names_fit_an_object_name() {
        assert_eq!(op_configmap_name("node-a"), "node-monitor-fence-node-a");
        let long = "n".repeat(300);
        let name = op_configmap_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(
            name,
            op_configmap_name(&"n".repeat(301)),
            "distinct nodes, distinct names"
        );
        assert_eq!(name, op_configmap_name(&long), "stable");
    }

    fn op(node: &str) -> FenceOp {
        let facts = node_monitor_core::remediation::NodeFacts {
            name: node.to_owned(),
            zone: node_monitor_core::remediation::ZoneKey::default(),
            ready: node_monitor_core::remediation::ReadyStatus::Unknown,
            lease: None,
            agent_heartbeat: None,
            last_gasp: None,
            eligible: true,
            boot_id: None,
            ready_heartbeat: None,
        };
        FenceOp::new(
            &facts,
            "uid-a",
            &node_monitor_core::remediation::DeathEvidence::LastGasp { at: 1 },
            0,
        )
    }

    #[test]
    fn operations_are_keyed_by_their_object_not_their_json() {
        let written = op_object("ns", &op("node-a"), None).expect("encode");
        assert!(
            decode_op("ns", &written).is_ok(),
            "what the store writes reads back"
        );
        // (what is changed, the reason)
        type Edit = fn(&mut ConfigMap);
        let cases: [(Edit, &str); 5] = [
            // Renamed to another node's operation.
            (
                |cm| cm.metadata.name = Some(op_configmap_name("node-b")),
                "name",
            ),
            // The JSON points at another node than the object.
            (
                |cm| {
                    let d = cm.data.as_mut().expect("data");
                    let text = d[OP_KEY].replace("\"node\": \"node-a\"", "\"node\": \"node-b\"");
                    d.insert(OP_KEY.to_owned(), text);
                },
                "name",
            ),
            (
                |cm| {
                    cm.metadata
                        .annotations
                        .as_mut()
                        .expect("annotations")
                        .insert(FENCE_NODE_ANNOTATION.to_owned(), "node-b".to_owned());
                },
                "annotation",
            ),
            (|cm| cm.metadata.owner_references = None, "owned"),
            (
                |cm| {
                    cm.metadata.owner_references.as_mut().expect("owner")[0].uid =
                        "uid-other".to_owned();
                },
                "owned",
            ),
        ];
        for (edit, needle) in cases {
            let mut cm = written.clone();
            edit(&mut cm);
            let err = decode_op("ns", &cm).expect_err(needle);
            assert!(
                matches!(err, StoreError::Mismatch { .. }) && err.to_string().contains(needle),
                "{err}"
            );
        }
    }
}
