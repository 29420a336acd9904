//! The Node object, its kubelet-owned status and its Lease, as the kubelet writes them
//! (`pkg/kubelet/kubelet_node_status.go`, `pkg/kubelet/nodestatus/setters.go`,
//! `component-helpers/apimachinery/lease`).
use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        coordination::v1::{Lease, LeaseSpec},
        core::v1::{
            DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec,
            NodeStatus, NodeSystemInfo,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time},
    },
    jiff::Timestamp,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;

use super::Error;

/// The namespace the kubelet keeps node leases in.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";

/// One kubelet-owned node condition, with the time its status last changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionState {
    pub status: bool,
    pub reason: String,
    pub message: String,
    pub since: Timestamp,
}

/// The conditions the kubelet owns (`Ready` and the three pressure conditions). node-monitor's own
/// conditions are never written here: status patches merge conditions by `type`.
pub fn kubelet_conditions(now: Timestamp) -> BTreeMap<String, ConditionState> {
    let c = |status, reason: &str, message: &str| ConditionState {
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
        since: now,
    };
    BTreeMap::from([
        (
            "MemoryPressure".to_owned(),
            c(
                false,
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
        ),
        (
            "DiskPressure".to_owned(),
            c(
                false,
                "KubeletHasNoDiskPressure",
                "kubelet has no disk pressure",
            ),
        ),
        (
            "PIDPressure".to_owned(),
            c(
                false,
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
        ),
        (
            "Ready".to_owned(),
            c(true, "KubeletReady", "kubelet is posting ready status"),
        ),
    ])
}

/// Capacity and allocatable, already as API quantities.
#[derive(Debug, Clone)]
pub struct Resources {
    pub capacity: BTreeMap<String, Quantity>,
    pub allocatable: BTreeMap<String, Quantity>,
}

/// Static facts the status carries.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub name: String,
    pub ip: String,
    pub kubelet_version: String,
    /// Reboots simulated so far ([`crate::standin::StandIn::reboot`]): each one gives the node a
    /// new `bootID`.
    pub reboots: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

fn conditions(
    states: &BTreeMap<String, ConditionState>,
    heartbeat: Timestamp,
) -> Vec<NodeCondition> {
    states
        .iter()
        .map(|(ty, s)| NodeCondition {
            type_: ty.clone(),
            status: if s.status { "True" } else { "False" }.to_owned(),
            reason: Some(s.reason.clone()),
            message: Some(s.message.clone()),
            last_heartbeat_time: Some(Time(heartbeat)),
            last_transition_time: Some(Time(s.since)),
        })
        .collect()
}

fn system_info(facts: &NodeFacts) -> NodeSystemInfo {
    let uname = nix::sys::utsname::uname().ok();
    let kernel = uname
        .as_ref()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let host_boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    let boot_id = match facts.reboots.load(std::sync::atomic::Ordering::Relaxed) {
        0 => host_boot_id,
        n => format!("{host_boot_id}-reboot-{n}"),
    };
    let machine_id = std::fs::read_to_string("/etc/machine-id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default();
    NodeSystemInfo {
        architecture: std::env::consts::ARCH
            .replace("x86_64", "amd64")
            .replace("aarch64", "arm64"),
        boot_id,
        container_runtime_version: "containerd://node-monitor-standin".to_owned(),
        kernel_version: kernel,
        kube_proxy_version: String::new(),
        kubelet_version: facts.kubelet_version.clone(),
        machine_id,
        operating_system: "linux".to_owned(),
        os_image: "node-monitor kubelet stand-in".to_owned(),
        system_uuid: facts.name.clone(),
        ..NodeSystemInfo::default()
    }
}

/// The full status, as the kubelet sends it when it registers.
pub fn status(
    facts: &NodeFacts,
    res: &Resources,
    states: &BTreeMap<String, ConditionState>,
    now: Timestamp,
) -> NodeStatus {
    NodeStatus {
        addresses: Some(vec![
            NodeAddress {
                type_: "InternalIP".to_owned(),
                address: facts.ip.clone(),
            },
            NodeAddress {
                type_: "Hostname".to_owned(),
                address: facts.name.clone(),
            },
        ]),
        capacity: Some(res.capacity.clone()),
        allocatable: Some(res.allocatable.clone()),
        conditions: Some(conditions(states, now)),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: 10250 }),
        }),
        node_info: Some(system_info(facts)),
        ..NodeStatus::default()
    }
}

/// The Node to register.
pub fn node(
    facts: &NodeFacts,
    labels: &BTreeMap<String, String>,
    taints: &[k8s_openapi::api::core::v1::Taint],
    res: &Resources,
    states: &BTreeMap<String, ConditionState>,
    now: Timestamp,
) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(facts.name.clone()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then(|| taints.to_vec()),
            ..NodeSpec::default()
        }),
        status: Some(status(facts, res, states, now)),
    }
}

/// Registers the node (or, when it exists — a restarted stand-in — updates its labels) and
/// pushes its status. Returns the node's UID.
pub async fn register(
    client: &Client,
    node_obj: &Node,
    facts: &NodeFacts,
    res: &Resources,
    states: &BTreeMap<String, ConditionState>,
) -> Result<String, Error> {
    let api: Api<Node> = Api::all(client.clone());
    let name = &facts.name;
    let api_err = |action: String| move |source| Error::Api { action, source };
    let created = match api.create(&PostParams::default(), node_obj).await {
        Ok(n) => n,
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch = json!({ "metadata": { "labels": node_obj.metadata.labels } });
            api.patch(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map_err(api_err(format!("update the labels of node {name}")))?
        }
        Err(source) => {
            return Err(Error::Api {
                action: format!("register node {name}"),
                source,
            });
        }
    };
    // The create keeps the status the kubelet sends, but an existing node needs it refreshed.
    push_status(client, facts, res, states, Timestamp::now()).await?;
    created
        .metadata
        .uid
        .ok_or_else(|| Error::MissingUid { node: name.clone() })
}

/// Patches the node status. A strategic-merge patch merges `conditions` by `type`, so conditions
/// other components own (node-monitor's, the node lifecycle controller's) are left alone.
pub async fn push_status(
    client: &Client,
    facts: &NodeFacts,
    res: &Resources,
    states: &BTreeMap<String, ConditionState>,
    now: Timestamp,
) -> Result<(), Error> {
    let api: Api<Node> = Api::all(client.clone());
    let st = status(facts, res, states, now);
    let patch = json!({ "status": st });
    api.patch_status(
        &facts.name,
        &PatchParams::default(),
        &Patch::Strategic(patch),
    )
    .await
    .map_err(|source| Error::Api {
        action: format!("update the status of node {}", facts.name),
        source,
    })?;
    Ok(())
}

/// Renews (creating it when missing) the node's Lease in `kube-node-lease`, owned by the Node so
/// it goes with it (`pkg/kubelet/nodelease`, `setNodeOwnerFunc`).
pub async fn renew_lease(
    client: &Client,
    name: &str,
    node_uid: &str,
    duration_seconds: i32,
    now: Timestamp,
) -> Result<(), Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let patch = json!({
        "spec": {
            "holderIdentity": name,
            "leaseDurationSeconds": duration_seconds,
            "renewTime": MicroTime(now),
        }
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(LEASE_NAMESPACE.to_owned()),
                    owner_references: Some(vec![OwnerReference {
                        api_version: "v1".to_owned(),
                        kind: "Node".to_owned(),
                        name: name.to_owned(),
                        uid: node_uid.to_owned(),
                        ..OwnerReference::default()
                    }]),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(name.to_owned()),
                    lease_duration_seconds: Some(duration_seconds),
                    renew_time: Some(MicroTime(now)),
                    ..LeaseSpec::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(()),
                // Created meanwhile: the next renewal patches it.
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                Err(source) => Err(Error::Api {
                    action: format!("create the lease of node {name}"),
                    source,
                }),
            }
        }
        Err(source) => Err(Error::Api {
            action: format!("renew the lease of node {name}"),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_carries_every_kubelet_condition_with_its_transition_time() {
        let t0 = Timestamp::from_second(1_700_000_000).expect("valid time");
        let t1 = Timestamp::from_second(1_700_000_100).expect("valid time");
        let mut states = kubelet_conditions(t0);
        states.get_mut("MemoryPressure").expect("present").status = true;
        let facts = NodeFacts {
            name: "n1".to_owned(),
            ip: "127.0.0.1".to_owned(),
            kubelet_version: "v1.36.3".to_owned(),
            reboots: Default::default(),
        };
        let res = Resources {
            capacity: BTreeMap::from([("memory".to_owned(), Quantity("1Gi".to_owned()))]),
            allocatable: BTreeMap::from([("memory".to_owned(), Quantity("900Mi".to_owned()))]),
        };
        let st = status(&facts, &res, &states, t1);
        let conds = st.conditions.expect("conditions");
        let types: Vec<&str> = conds.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            ["DiskPressure", "MemoryPressure", "PIDPressure", "Ready"]
        );
        let mem = conds
            .iter()
            .find(|c| c.type_ == "MemoryPressure")
            .expect("memory pressure");
        assert_eq!(mem.status, "True");
        assert_eq!(mem.last_transition_time, Some(Time(t0)));
        assert_eq!(mem.last_heartbeat_time, Some(Time(t1)));
        assert_eq!(
            st.allocatable.expect("allocatable")["memory"],
            Quantity("900Mi".to_owned())
        );
        assert!(
            conds.iter().all(|c| !c.type_.starts_with("NodeMonitor")),
            "the stand-in must never write node-monitor's conditions"
        );
    }
}
