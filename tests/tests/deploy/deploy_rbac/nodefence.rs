//! Who can write fencing state, with the shipped manifests (deploy/remediate) on a real API
//! server.
use k8s_openapi::api::{
    core::v1::{ConfigMap, Node},
    rbac::v1::{RoleBinding, RoleRef, Subject},
};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams},
};
use node_monitor_core::remediation::{
    DeathEvidence, FenceOp, NodeFacts, Phase, ReadyStatus, Step, ZoneKey,
};
use node_monitor_remediate::store::{OpStore, node_fence_resource, op_object};
use node_monitor_tests::{
    control_plane::{ControlPlane, client_from_kubeconfig},
    manifests, wait,
};
use serde_json::json;
use std::time::Duration;

use super::{Base, allowed, forbidden, wait_for_denial};

const NS: &str = "node-monitor";
/// The shipped policy's denial of a status write by anyone but remediate.
const ONLY_REMEDIATE: &str = "only node-monitor remediate";

/// The operation remediate would start for `node` (UID `uid`).
fn operation(node: &str, uid: &str) -> FenceOp {
    let facts = NodeFacts {
        name: node.to_owned(),
        zone: ZoneKey::default(),
        ready: ReadyStatus::Unknown,
        lease: None,
        agent_heartbeat: None,
        agent_lease: None,
        last_gasp: None,
        eligible: true,
        boot_id: None,
        ready_heartbeat: None,
    };
    FenceOp::new(&facts, uid, &DeathEvidence::LastGasp { at: 1 }, 0)
}

/// Applies remediate's CRD, admission policy, ServiceAccount and RBAC (deploy/remediate) for real.
async fn apply_remediate_access(admin: &Client) {
    allowed_m(
        "install the NodeFence CRD",
        manifests::install_remediate_crds(admin).await,
    );
    let objects = manifests::render(&manifests::deploy_dir().join("remediate"))
        .unwrap_or_else(|e| panic!("render deploy/remediate: {e}"));
    let access: Vec<_> = objects
        .into_iter()
        .filter(|m| {
            [
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
                "ServiceAccount",
                "ClusterRole",
                "ClusterRoleBinding",
                "Role",
                "RoleBinding",
            ]
            .contains(&m.kind())
        })
        .collect();
    allowed_m(
        "apply remediate's access",
        manifests::apply(admin, &access).await,
    );
}

fn allowed_m<T>(what: &str, r: manifests::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// A user who administers the remediate namespace: the built-in `admin` ClusterRole bound there
/// (every ConfigMap, Secret, Role and workload of the namespace is theirs to write).
async fn namespace_admin(cp: &ControlPlane, admin: &Client) -> Client {
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("ns-admin".to_owned()),
            namespace: Some(NS.to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "ClusterRole".to_owned(),
            name: "admin".to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "User".to_owned(),
            name: "ns-admin".to_owned(),
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            namespace: None,
        }]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the namespace admin");
    let path = cp
        .user_kubeconfig("ns-admin", None)
        .expect("a namespace admin's kubeconfig");
    client_from_kubeconfig(&path)
        .await
        .expect("a namespace admin's client")
}

/// Every write of a NodeFence and of its status, by `who`, is refused.
async fn cannot_write_node_fences(who: &str, client: &Client, forged: &DynamicObject) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &node_fence_resource());
    let pp = PostParams::default();
    let mut other = forged.clone();
    other.metadata.name = Some("node-b".to_owned());
    other.data["spec"] = json!({"nodeName": "node-b", "nodeUID": "uid-b"});
    forbidden(
        &format!("{who}: create a NodeFence"),
        api.create(&pp, &other).await,
    );
    forbidden(
        &format!("{who}: replace a NodeFence"),
        api.replace("node-a", &pp, forged).await,
    );
    let merge = Patch::Merge(json!({"metadata": {"labels": {"forged": "yes"}}}));
    forbidden(
        &format!("{who}: patch a NodeFence"),
        api.patch("node-a", &PatchParams::default(), &merge).await,
    );
    forbidden(
        &format!("{who}: replace a NodeFence's status"),
        api.replace_status("node-a", &pp, forged).await,
    );
    let status = Patch::Merge(json!({"status": forged.data["status"]}));
    forbidden(
        &format!("{who}: patch a NodeFence's status"),
        api.patch_status("node-a", &PatchParams::default(), &status)
            .await,
    );
    forbidden(
        &format!("{who}: delete a NodeFence"),
        api.delete("node-a", &DeleteParams::default()).await,
    );
}

/// The trust boundary of fencing state is cluster RBAC on `nodefences/status` (and the shipped
/// policy that keeps that subresource to remediate), not write access to the remediate namespace.
/// A namespace admin — who may write every ConfigMap there, which is where operations used to
/// live, so they could forge a confirmed fencing and release a live node — and the node agent's
/// token cannot create, change or delete a NodeFence or its status; remediate's ServiceAccount
/// can, and an operation forged in the old place (a ConfigMap exactly as earlier releases wrote
/// it) is not what the store reads. With operations in namespace ConfigMaps this test fails: the
/// namespace admin's forged ConfigMap would be the node's operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_remediate_writes_fencing_state() {
    let base = Base::start().await;
    let (admin, agent) = (&base.admin, &base.agent);
    apply_remediate_access(admin).await;
    let remediate = base
        .cp
        .service_account_client(NS, "node-monitor-remediate")
        .await
        .expect("remediate's ServiceAccount client");
    let ns_admin = namespace_admin(&base.cp, admin).await;
    let uid = Api::<Node>::all(admin.clone())
        .get("node-a")
        .await
        .expect("node-a")
        .metadata
        .uid
        .expect("uid");

    // remediate starts, advances and reads an operation through its own store. A create
    // interrupted before its status write leaves a NodeFence without an operation: no operation,
    // and the next create takes it over.
    let store = OpStore::new(remediate.clone());
    let mut op = operation("node-a", &uid);
    let mut bare = op_object(&op, None).expect("encode");
    bare.data.as_object_mut().expect("object").remove("status");
    allowed(
        "remediate creates a NodeFence",
        Api::<DynamicObject>::all_with(remediate.clone(), &node_fence_resource())
            .create(&PostParams::default(), &bare)
            .await,
    );
    assert!(allowed_store("read it", store.get("node-a").await).is_none());
    let stored = allowed_store("remediate creates an operation", store.create(&op).await);
    op.phase = Phase::Fencing {
        step: Step::PowerManagement,
    };
    let stored = allowed_store(
        "remediate writes its status",
        store.update(&stored, &op).await,
    );
    let status = Patch::Merge(json!({"status": {"step": "power_management"}}));
    allowed(
        "remediate patches its status",
        Api::<DynamicObject>::all_with(remediate.clone(), &node_fence_resource())
            .patch_status("node-a", &PatchParams::default(), &status)
            .await,
    );

    // Even a cluster admin's status write is refused once the policy is in force.
    let mut forged_op = op.clone();
    forged_op.phase = Phase::Releasing;
    forged_op.confirmed_by = Some(Step::Isolation);
    let forged = op_object(&forged_op, None).expect("encode");
    let admin_api: Api<DynamicObject> = Api::all_with(admin.clone(), &node_fence_resource());
    let params = PatchParams::default();
    let forged_status = Patch::Merge(json!({"status": forged.data["status"]}));
    wait_for_denial("a cluster admin's status write", ONLY_REMEDIATE, || {
        admin_api.patch_status("node-a", &params, &forged_status)
    })
    .await;
    // The node a NodeFence names never changes.
    let moved = Patch::Merge(json!({"spec": {"nodeUID": "uid-other"}}));
    forbidden(
        "change a NodeFence's node",
        admin_api
            .patch("node-a", &PatchParams::default(), &moved)
            .await,
    );

    cannot_write_node_fences("the namespace admin", &ns_admin, &forged).await;
    cannot_write_node_fences("the node agent", agent, &forged).await;
    namespace_admin_acts_as_remediate(&base.cp).await;

    // Where operations used to live, the namespace admin writes freely: a forged confirmed
    // operation, as earlier releases stored it (name, node annotation, owner).
    forge_legacy_operation(&ns_admin, &forged_op, &uid).await;
    let now = allowed_store("remediate reads the operation", store.get("node-a").await)
        .expect("an operation");
    assert_eq!(
        now.op.phase,
        Phase::Fencing {
            step: Step::PowerManagement
        },
        "the operation is remediate's, not the forged one"
    );
    assert_eq!(now.op.confirmed_by, None);
    let all = allowed_store("remediate lists operations", store.list().await);
    assert_eq!(all.len(), 1, "{all:?}");
    assert_ne!(stored.resource_version, None);

    allowed_store(
        "remediate deletes the operation",
        store.delete("node-a").await,
    );
    assert!(
        allowed_store("read it back", store.get("node-a").await).is_none(),
        "deleted"
    );
    deleting_the_node_deletes_its_operation(admin, &store).await;
}

/// The boundary as it is (docs/security.md, "Remediation state"): Kubernetes' built-in `admin`
/// (and `edit`) role lets its holder impersonate the namespace's ServiceAccounts, so a namespace
/// admin may act as remediate and write fencing state in its name. The agents' namespace is a
/// cluster-admin boundary; this test fails, and the document must change, the day it is not.
async fn namespace_admin_acts_as_remediate(cp: &ControlPlane) {
    let path = cp
        .user_kubeconfig("ns-admin", None)
        .expect("a namespace admin's kubeconfig");
    let text = std::fs::read_to_string(&path).expect("read the kubeconfig");
    let kc = kube::config::Kubeconfig::from_yaml(&text).expect("parse the kubeconfig");
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
    config.auth_info.impersonate =
        Some(format!("system:serviceaccount:{NS}:node-monitor-remediate"));
    let as_remediate = Client::try_from(config).expect("client");
    // The same display field remediate itself wrote above, so the stored operation is unchanged.
    let status = Patch::Merge(json!({"status": {"step": "power_management"}}));
    allowed(
        "a namespace admin, impersonating remediate, patches a NodeFence's status",
        Api::<DynamicObject>::all_with(as_remediate, &node_fence_resource())
            .patch_status("node-a", &PatchParams::default(), &status)
            .await,
    );
}

/// A NodeFence is owned by its Node: the garbage collector deletes it with the Node.
async fn deleting_the_node_deletes_its_operation(admin: &Client, store: &OpStore) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let uid = nodes
        .get("node-b")
        .await
        .expect("node-b")
        .metadata
        .uid
        .expect("uid");
    allowed_store(
        "remediate creates an operation for node-b",
        store.create(&operation("node-b", &uid)).await,
    );
    allowed(
        "delete node-b",
        nodes.delete("node-b", &DeleteParams::default()).await,
    );
    let fences: Api<DynamicObject> = Api::all_with(admin.clone(), &node_fence_resource());
    wait::eventually(
        "the garbage collector to delete node-b's NodeFence",
        Duration::from_secs(120),
        async || match fences.get_opt("node-b").await {
            Ok(None) => Some(()),
            _ => None,
        },
    )
    .await;
}

fn allowed_store<T>(what: &str, r: Result<T, node_monitor_remediate::store::StoreError>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e:?}"))
}

/// The ConfigMap an earlier release would have taken as `op`.
async fn forge_legacy_operation(ns_admin: &Client, op: &FenceOp, uid: &str) {
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("node-monitor-fence-node-a".to_owned()),
            namespace: Some(NS.to_owned()),
            labels: Some(
                [(
                    "app.kubernetes.io/component".to_owned(),
                    "fence-operation".to_owned(),
                )]
                .into(),
            ),
            annotations: Some(
                [("node-monitor.io/fence-node".to_owned(), "node-a".to_owned())].into(),
            ),
            owner_references: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: "node-a".to_owned(),
                    uid: uid.to_owned(),
                    ..Default::default()
                },
            ]),
            ..ObjectMeta::default()
        },
        data: Some(
            [(
                "operation.json".to_owned(),
                serde_json::to_string(op).expect("encode"),
            )]
            .into(),
        ),
        ..ConfigMap::default()
    };
    allowed(
        "the namespace admin writes a ConfigMap",
        Api::<ConfigMap>::namespaced(ns_admin.clone(), NS)
            .create(&PostParams::default(), &cm)
            .await,
    );
}
