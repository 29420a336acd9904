//! The shipped manifests (deploy/kustomize/base and its overlays) against a real API server: they
//! apply server-side, and with the agent's own ServiceAccount token (bound to a pod on its node,
//! as in the DaemonSet) the calls the agent makes succeed, while everything else is forbidden:
//! secrets, pods in other namespaces, deleting pods (unless the escalate or shutdown overlay is
//! applied, and then only pods on its own node), deleting nodes, and writing any node but its own
//! (the base's ValidatingAdmissionPolicies). [`nodefence`]: only remediate's ServiceAccount writes
//! fencing state (deploy/remediate). [`liveness`]: only the agent writes its node's liveness Lease.
use k8s_openapi::{
    api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{Event, Node, Pod, Secret, ServiceAccount},
        policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec},
    },
    apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString},
};
use kube::{
    Api, Client,
    api::{DeleteParams, EvictParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::AuthInfo,
};
use node_monitor::{
    agent::{STOP_RELEASE_BOUND, release_on_stop},
    cluster::actuator::{
        Actuator, ActuatorConfig, ActuatorError, DeleteOutcome, EvictOutcome, EvictionRequest,
        NodeConditionUpdate, PdbPolicy,
    },
};
use node_monitor_core::contract::names::{
    CORDONED_ANNOTATION, SHUTDOWN_TAINT, SHUTTING_DOWN_CONDITION,
};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions, error_chain},
    manifests,
    pod::PodBuilder,
};
use serde_json::json;

#[path = "deploy_rbac/liveness.rs"]
mod liveness;
#[path = "deploy_rbac/nodefence.rs"]
mod nodefence;

/// The base's denial of a pod deletion on another node.
const OWN_PODS_ONLY: &str = "node-monitor may only delete pods on the node it runs on";
/// The base's denial of an eviction on another node.
const OWN_EVICTIONS_ONLY: &str = "node-monitor may only evict pods on the node it runs on";

/// Renders a kustomization under deploy/kustomize and server-side applies it; the number of
/// objects applied.
async fn apply_kustomization(client: &Client, rel: &str) -> usize {
    let objects = manifests::render(&manifests::kustomize_dir(rel))
        .unwrap_or_else(|e| panic!("render {rel}: {}", error_chain(&e)));
    manifests::apply(client, &objects)
        .await
        .unwrap_or_else(|e| panic!("apply {rel}: {}", error_chain(&e)))
        .len()
}

fn forbidden<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {}
        other => panic!("{what} must be forbidden, got {other:?}"),
    }
}

fn allowed<T>(what: &str, r: Result<T, kube::Error>) -> T {
    r.unwrap_or_else(|e| panic!("{what} must be allowed: {e}"))
}

async fn node(client: &Client, name: &str) {
    let n = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await
        .expect("create node");
}

async fn pod(client: &Client, ns: &str, name: &str, node: &str, sa: Option<&str>) -> Pod {
    let mut p = PodBuilder::new(name)
        .namespace(ns)
        .node(node)
        .container_name("c")
        .image("x");
    if let Some(sa) = sa {
        p = p.service_account(sa);
    }
    let p = p.build();
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .expect("create pod")
}

/// A client with the token the kubelet would mount into the DaemonSet pod `agent_pod`: the
/// agent's ServiceAccount, bound to that pod (and so to its node).
async fn agent_client(cp: &ControlPlane, admin: &Client, agent_pod: &Pod) -> Client {
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "node-monitor");
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: agent_pod.metadata.name.clone(),
                uid: agent_pod.metadata.uid.clone(),
            }),
        }),
        ..Default::default()
    };
    let token = sas
        .create_token_request("node-monitor", &PostParams::default(), &req)
        .await
        .expect("token request")
        .status
        .expect("status")
        .token
        .expect("token");
    let mut config = cp.config().clone();
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    Client::try_from(config).expect("agent client")
}

/// Admission policies are loaded asynchronously after they are created: waits until `probe`
/// is denied with `message`, so the checks that follow run with the policy in force.
async fn wait_for_denial<T, F, Fut>(what: &str, message: &str, mut probe: F)
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match probe().await {
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                if s.message.contains(message) {
                    return;
                }
                // RBAC may answer first; the policy's own message is what is awaited.
                assert!(
                    std::time::Instant::now() < deadline,
                    "{what}: denied, but never by the policy: {s:?}"
                );
            }
            r => assert!(
                std::time::Instant::now() < deadline,
                "{what}: the policy never took effect: {r:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

async fn wait_for_own_node_policy(nodes: &Api<Node>) {
    let other = Patch::Merge(json!({"metadata": {"labels": {"probe": "x"}}}));
    let params = PatchParams::default();
    wait_for_denial(
        "writing another node",
        "node-monitor may only modify the node it runs on",
        || nodes.patch("node-b", &params, &other),
    )
    .await;
}

/// A control plane with the base applied, the nodes `node-a` and `node-b`, and the agent's
/// DaemonSet pod on node-a.
struct Base {
    cp: ControlPlane,
    admin: Client,
    /// The agent's pod-bound token: its ServiceAccount, on node-a.
    agent: Client,
}

impl Base {
    /// Returns once the base's own-node policy is in force for the agent's token.
    async fn start() -> Base {
        node_monitor_tests::cgroup::require_root("the control-plane tier");
        let cp = ControlPlane::start(ControlPlaneOptions::default())
            .await
            .expect("control plane");
        let admin = cp.client();
        assert!(apply_kustomization(&admin, "base").await >= 9);
        node(&admin, "node-a").await;
        node(&admin, "node-b").await;
        let agent_pod = pod(
            &admin,
            "node-monitor",
            "agent-on-a",
            "node-a",
            Some("node-monitor"),
        )
        .await;
        let agent = agent_client(&cp, &admin, &agent_pod).await;
        wait_for_own_node_policy(&Api::all(agent.clone())).await;
        Base { cp, admin, agent }
    }

    /// The agent's own actuator on node-a.
    fn actuator(&self, pdb_policy: PdbPolicy) -> Actuator {
        Actuator::new(
            self.agent.clone(),
            ActuatorConfig {
                node_name: "node-a".into(),
                pdb_policy,
                dry_run: false,
            },
        )
    }
}

/// The eviction the agent sends under a hard threshold, for `pod` in `default`.
fn hard_eviction(pod: &Pod) -> EvictionRequest {
    EvictionRequest {
        namespace: "default".into(),
        name: pod.metadata.name.clone().expect("name"),
        uid: pod.metadata.uid.clone().expect("uid"),
        grace_period_seconds: 1,
        hard: true,
        signal: "memory.available".into(),
        message: "test".into(),
        annotations: Default::default(),
    }
}

/// Makes the eviction API answer 429 for `pods` (all in `default`): they run (no kubelet here, so
/// their status is written directly) and a PodDisruptionBudget over the namespace wants them all.
async fn block_evictions(admin: &Client, pods: &[&Pod]) {
    let api: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for p in pods {
        api.patch_status(
            p.metadata.name.as_deref().expect("name"),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("mark the pod Running");
    }
    let pdb = PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some("everything".into()),
            ..Default::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(
                i32::try_from(pods.len()).expect("a few pods"),
            )),
            // policy/v1: an empty selector selects every pod of the namespace.
            selector: Some(LabelSelector::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<PodDisruptionBudget>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pdb)
        .await
        .expect("create the PDB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_apply_and_grant_least_privilege() {
    let base = Base::start().await;
    let (admin, agent) = (&base.admin, &base.agent);
    let victim = pod(admin, "default", "victim", "node-a", None).await;
    let elsewhere = pod(admin, "default", "elsewhere", "node-b", None).await;
    let nodes: Api<Node> = Api::all(agent.clone());

    // What the agent does.
    let pods: Api<Pod> = Api::all(agent.clone());
    allowed(
        "list pods on its node",
        pods.list(&ListParams::default().fields("spec.nodeName=node-a"))
            .await,
    );
    let victims: Api<Pod> = Api::namespaced(agent.clone(), "default");
    let dry = EvictParams {
        delete_options: Some(DeleteParams {
            dry_run: true,
            ..Default::default()
        }),
        post_options: PostParams {
            dry_run: true,
            ..Default::default()
        },
    };
    allowed("evict a pod", victims.evict("victim", &dry).await);
    allowed("get its node", nodes.get("node-a").await);
    let condition = |n: &str| json!({"status": {"conditions": [{"type": "NodeMonitorMemoryPressure", "status": "False", "reason": n, "message": "test"}]}});
    allowed(
        "patch its own node's status",
        nodes
            .patch_status(
                "node-a",
                &PatchParams::default(),
                &Patch::Strategic(condition("Own")),
            )
            .await,
    );
    // Its taint added to those the node has (the node lifecycle controller may have tainted this
    // kubelet-less node meanwhile: a list without its taint would rightly be refused), at the
    // node's resourceVersion, read again after a conflict.
    let mut tainted = None;
    for _ in 0..5 {
        let current = allowed("get its node", nodes.get("node-a").await);
        let mut taints = current
            .spec
            .and_then(|s| s.taints)
            .map(|t| serde_json::to_value(t).expect("taints"))
            .unwrap_or_else(|| json!([]));
        if let Some(list) = taints.as_array_mut() {
            list.push(json!({"key": "node-monitor.io/memory-pressure", "effect": "NoSchedule"}));
        }
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": {"taints": taints},
        });
        match nodes
            .patch("node-a", &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            r => {
                tainted = Some(r);
                break;
            }
        }
    }
    allowed(
        "taint its own node",
        tainted.expect("the node stopped changing within five tries"),
    );
    let ev = Event {
        metadata: ObjectMeta {
            generate_name: Some("victim.".into()),
            namespace: Some("default".into()),
            ..Default::default()
        },
        involved_object: k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("Pod".into()),
            name: Some("victim".into()),
            namespace: Some("default".into()),
            uid: victim.metadata.uid.clone(),
            ..Default::default()
        },
        reason: Some("Evicted".into()),
        message: Some("test".into()),
        type_: Some("Warning".into()),
        ..Default::default()
    };
    allowed(
        "create events",
        Api::<Event>::namespaced(agent.clone(), "default")
            .create(&PostParams::default(), &ev)
            .await,
    );

    // What it must not do.
    forbidden(
        "patch another node's status",
        nodes
            .patch_status(
                "node-b",
                &PatchParams::default(),
                &Patch::Strategic(condition("Other")),
            )
            .await,
    );
    forbidden(
        "taint another node",
        nodes
            .patch(
                "node-b",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await,
    );
    forbidden(
        "delete a node",
        nodes.delete("node-a", &DeleteParams::default()).await,
    );
    forbidden(
        "read secrets",
        Api::<Secret>::namespaced(agent.clone(), "node-monitor")
            .list(&Default::default())
            .await,
    );
    forbidden(
        "read secrets elsewhere",
        Api::<Secret>::namespaced(agent.clone(), "kube-system")
            .list(&Default::default())
            .await,
    );
    let delete_dry = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    forbidden(
        "delete pods without the escalate overlay",
        victims.delete("victim", &delete_dry).await,
    );
    let mut p = victim.clone();
    p.metadata = ObjectMeta {
        name: Some("intruder".into()),
        namespace: Some("kube-system".into()),
        ..Default::default()
    };
    forbidden(
        "create pods in another namespace",
        Api::<Pod>::namespaced(agent.clone(), "kube-system")
            .create(&PostParams::default(), &p)
            .await,
    );

    the_escalate_overlay_deletes_on_its_own_node_only(&base, &victim, &elsewhere).await;
    base.cp.stop().expect("stop");
}

/// The escalate overlay adds exactly pods/delete, for pods on the agent's own node; the agent's
/// actuator escalates a blocked eviction there and is refused on another node.
async fn the_escalate_overlay_deletes_on_its_own_node_only(
    base: &Base,
    victim: &Pod,
    elsewhere: &Pod,
) {
    let (admin, agent) = (&base.admin, &base.agent);
    let victims: Api<Pod> = Api::namespaced(agent.clone(), "default");
    let delete_dry = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    assert!(apply_kustomization(admin, "overlays/escalate").await >= 11);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match victims.delete("victim", &delete_dry).await {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => panic!("delete with the escalate overlay must be allowed: {e}"),
        }
    }
    // Authorisation comes before admission: RBAC lets it through now, the policy stops it.
    wait_for_denial(
        "deleting a pod on another node with the escalate overlay",
        OWN_PODS_ONLY,
        || victims.delete("elsewhere", &delete_dry),
    )
    .await;
    // The escalation itself, by the agent's own actuator: a PDB blocks the eviction on its own
    // node (429) and the delete that follows goes through; on another node the eviction policy
    // refuses the eviction first, so no delete is ever tried.
    block_evictions(admin, &[victim, elsewhere]).await;
    let actuator = base.actuator(PdbPolicy::Escalate);
    match actuator.evict(&hard_eviction(elsewhere)).await {
        EvictOutcome::Failed {
            code: Some(403 | 422),
            reason,
            ..
        } if reason.contains(OWN_EVICTIONS_ONLY) => {}
        other => panic!("escalating on another node must be denied by the policy, got {other:?}"),
    }
    assert_eq!(
        actuator.evict(&hard_eviction(victim)).await,
        EvictOutcome::Escalated
    );
    let pods_as_admin = Api::<Pod>::namespaced(admin.clone(), "default");
    let gone = pods_as_admin
        .get("victim")
        .await
        .expect("the pod terminates (no kubelet confirms it)");
    assert!(gone.metadata.deletion_timestamp.is_some());
    let kept = pods_as_admin.get("elsewhere").await.expect("elsewhere");
    assert!(kept.metadata.deletion_timestamp.is_none());
    forbidden(
        "read secrets with the escalate overlay",
        Api::<Secret>::namespaced(agent.clone(), "default")
            .list(&Default::default())
            .await,
    );
}

fn forbidden_by_actuator<T: std::fmt::Debug>(
    what: &str,
    r: Result<T, ActuatorError>,
    message: Option<&str>,
) {
    match r {
        Err(ActuatorError::PodApi {
            source: kube::Error::Api(s),
            ..
        }) if (s.code == 403 || s.code == 422) && message.is_none_or(|m| s.message.contains(m)) => {
        }
        other => panic!("{what} must be forbidden (message {message:?}), got {other:?}"),
    }
}

/// The graceful-shutdown drain through the agent's own actuator and its own pod-bound token:
/// marking the node works with the base; deleting pods is forbidden until the shutdown overlay is
/// applied, and then only for pods on the agent's own node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_overlay_grants_the_drain_on_its_own_node_only() {
    let base = Base::start().await;
    let (admin, agent) = (&base.admin, &base.agent);
    let drained = pod(admin, "default", "drained", "node-a", None).await;
    let elsewhere = pod(admin, "default", "elsewhere", "node-b", None).await;
    let uid = |p: &Pod| p.metadata.uid.clone().expect("uid");

    // The shutdown manager's calls, made by its own actuator.
    let actuator = base.actuator(PdbPolicy::Respect);

    marking_the_node_needs_nothing_beyond_the_base(&actuator, agent, admin).await;
    // Undone as after a cancellation.
    assert!(actuator.set_unschedulable(false).await.expect("uncordon"));
    actuator
        .annotate_node(CORDONED_ANNOTATION, None)
        .await
        .expect("remove the annotation");
    assert!(
        actuator
            .set_taint(SHUTDOWN_TAINT, "", "NoSchedule", false)
            .await
            .expect("remove the taint")
    );
    // Another node stays out of reach.
    let other = Actuator::new(
        agent.clone(),
        ActuatorConfig {
            node_name: "node-b".into(),
            pdb_policy: PdbPolicy::Respect,
            dry_run: false,
        },
    );
    assert!(
        other.set_unschedulable(true).await.is_err(),
        "cordoning another node must be forbidden"
    );

    // The base forbids deleting pods, even on its own node.
    forbidden_by_actuator(
        "deleting a pod with the base",
        actuator
            .delete_pod("default", "drained", &uid(&drained), 20)
            .await,
        None,
    );

    // The shutdown overlay: pods/delete, for pods on its own node only.
    assert!(apply_kustomization(admin, "overlays/shutdown").await >= 13);
    let pods: Api<Pod> = Api::namespaced(agent.clone(), "default");
    let dry = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    // Authorisation comes before admission: the policy's denial means RBAC now lets it through.
    wait_for_denial("deleting a pod on another node", OWN_PODS_ONLY, || {
        pods.delete("elsewhere", &dry)
    })
    .await;
    assert_eq!(
        actuator
            .delete_pod("default", "drained", &uid(&drained), 20)
            .await
            .expect("the drain deletes its own node's pod"),
        DeleteOutcome::Deleted
    );
    let gone = Api::<Pod>::namespaced(admin.clone(), "default")
        .get("drained")
        .await
        .expect("the pod terminates (no kubelet confirms it)");
    assert!(gone.metadata.deletion_timestamp.is_some());
    assert_eq!(gone.metadata.deletion_grace_period_seconds, Some(20));
    forbidden_by_actuator(
        "deleting a pod on another node with the overlay",
        actuator
            .delete_pod("default", "elsewhere", &uid(&elsewhere), 20)
            .await,
        Some(OWN_PODS_ONLY),
    );

    // Nothing else came with it.
    forbidden(
        "read secrets with the shutdown overlay",
        Api::<Secret>::namespaced(agent.clone(), "default")
            .list(&Default::default())
            .await,
    );
    forbidden(
        "delete a node with the shutdown overlay",
        Api::<Node>::all(agent.clone())
            .delete("node-b", &DeleteParams::default())
            .await,
    );
    let mut p = elsewhere.clone();
    p.metadata = ObjectMeta {
        name: Some("intruder".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    forbidden(
        "create pods with the shutdown overlay",
        pods.create(&PostParams::default(), &p).await,
    );
    base.cp.stop().expect("stop");
}

/// Marking the node (condition, taint, cordon and its annotation, an Event) and listing its
/// pods need nothing beyond the base.
async fn marking_the_node_needs_nothing_beyond_the_base(
    actuator: &Actuator,
    agent: &Client,
    admin: &Client,
) {
    let admin_nodes: Api<Node> = Api::all(admin.clone());
    allowed(
        "list the node's pods",
        Api::<Pod>::all(agent.clone())
            .list(&ListParams::default().fields("spec.nodeName=node-a"))
            .await,
    );
    actuator
        .set_conditions(&[NodeConditionUpdate {
            type_: SHUTTING_DOWN_CONDITION.into(),
            status: true,
            reason: "NodeShuttingDown".into(),
            message: "test".into(),
        }])
        .await
        .expect("the shutdown condition");
    assert!(
        actuator
            .set_taint(SHUTDOWN_TAINT, "", "NoSchedule", true)
            .await
            .expect("the shutdown taint")
    );
    actuator
        .annotate_node(CORDONED_ANNOTATION, Some("true"))
        .await
        .expect("the cordon annotation");
    assert!(
        !actuator.set_unschedulable(true).await.expect("cordon"),
        "node-a was schedulable before"
    );
    assert_eq!(
        actuator
            .node_annotation(CORDONED_ANNOTATION)
            .await
            .expect("read the annotation"),
        Some("true".to_owned())
    );
    actuator
        .record_node_event("NodeShutdown", "Shutdown manager detected shutdown event")
        .await;
    let n = admin_nodes.get("node-a").await.expect("node-a");
    let spec = n.spec.clone().unwrap_or_default();
    assert_eq!(spec.unschedulable, Some(true));
    assert!(
        spec.taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == SHUTDOWN_TAINT && t.effect == "NoSchedule")
    );
    assert!(
        n.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == SHUTTING_DOWN_CONDITION && c.status == "True")
    );
    let events = Api::<Event>::namespaced(admin.clone(), "default")
        .list(&ListParams::default().fields("involvedObject.name=node-a"))
        .await
        .expect("events");
    assert!(
        events
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("NodeShutdown")),
        "the node Event was posted"
    );
}

/// The eviction the agent's token may send: only for pods bound to its own node. The eviction's
/// internal delete skips pod DELETE admission, so without the base's eviction policy the token
/// could evict any pod of the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_token_evicts_only_pods_on_its_own_node() {
    let base = Base::start().await;
    let (admin, agent) = (&base.admin, &base.agent);
    pod(admin, "default", "mine", "node-a", None).await;
    pod(admin, "default", "theirs", "node-b", None).await;
    // A pod no node runs yet: the empty node name matches no token.
    let mut pending = pod(admin, "default", "template", "node-a", None).await;
    pending.metadata = ObjectMeta {
        name: Some("unscheduled".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    if let Some(spec) = pending.spec.as_mut() {
        spec.node_name = None;
    }
    pending.status = None;
    Api::<Pod>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &pending)
        .await
        .expect("create an unscheduled pod");
    let victims: Api<Pod> = Api::namespaced(agent.clone(), "default");
    let dry = EvictParams {
        delete_options: Some(DeleteParams {
            dry_run: true,
            ..Default::default()
        }),
        post_options: PostParams {
            dry_run: true,
            ..Default::default()
        },
    };
    let own_evictions = OWN_EVICTIONS_ONLY;
    wait_for_denial("evicting a pod on another node", own_evictions, || {
        victims.evict("theirs", &dry)
    })
    .await;
    wait_for_denial("evicting an unscheduled pod", own_evictions, || {
        victims.evict("unscheduled", &dry)
    })
    .await;
    allowed(
        "evict a pod on its own node",
        victims.evict("mine", &dry).await,
    );
    // In a namespace with other pods too, only the evicted pod's node matters.
    pod(admin, "kube-system", "system-on-b", "node-b", None).await;
    pod(admin, "kube-system", "system-on-a", "node-a", None).await;
    let system: Api<Pod> = Api::namespaced(agent.clone(), "kube-system");
    wait_for_denial(
        "evicting a system pod on another node",
        own_evictions,
        || system.evict("system-on-b", &dry),
    )
    .await;
    allowed(
        "evict a system pod on its own node",
        system.evict("system-on-a", &dry).await,
    );
    // The agent's own actuator, for real: the pod on node-b is refused and stays.
    let actuator = base.actuator(PdbPolicy::Respect);
    let theirs = Api::<Pod>::namespaced(admin.clone(), "default")
        .get("theirs")
        .await
        .expect("get");
    match actuator.evict(&hard_eviction(&theirs)).await {
        EvictOutcome::Failed {
            code: Some(403 | 422),
            reason,
            ..
        } if reason.contains(own_evictions) => {}
        other => panic!("evicting a pod on node-b must be refused by the policy, got {other:?}"),
    }
    assert!(
        Api::<Pod>::namespaced(admin.clone(), "default")
            .get_opt("theirs")
            .await
            .expect("get")
            .is_some(),
        "the pod on node-b must survive"
    );
}

/// On its own node the agent's token writes only what node-monitor owns: its conditions, its
/// taints, its annotations and its own cordon. The kubelet's conditions, capacity, labels
/// (node-restriction.kubernetes.io/* included), other taints (the out-of-service taint included)
/// and other annotations stay out of reach.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_token_writes_only_its_own_fields_of_its_node() {
    let base = Base::start().await;
    let (admin, agent) = (&base.admin, &base.agent);
    let admin_nodes: Api<Node> = Api::all(admin.clone());
    let nodes: Api<Node> = Api::all(agent.clone());
    kubelet_and_operator_marks(&admin_nodes).await;
    its_own_fields_allowed(&nodes).await;
    other_writes_denied(&nodes).await;
    an_operators_cordon_stays_the_operators(&admin_nodes, &nodes).await;
    the_clean_stop_takes_back_its_own(&admin_nodes, &base).await;
}

/// What the kubelet and an operator put on `node-a`.
async fn kubelet_and_operator_marks(admin_nodes: &Api<Node>) {
    let pp = PatchParams::default();
    // What the kubelet and an operator put there.
    admin_nodes
        .patch_status(
            "node-a",
            &pp,
            &Patch::Merge(json!({"status": {
                "capacity": {"memory": "4Gi", "cpu": "2"},
                "allocatable": {"memory": "3Gi", "cpu": "2"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
            }})),
        )
        .await
        .expect("kubelet status");
    admin_nodes
        .patch(
            "node-a",
            &pp,
            &Patch::Merge(json!({
                "metadata": {
                    "labels": {"topology.kubernetes.io/zone": "z1"},
                    "annotations": {"node-monitor.io/remediation": "disabled"},
                },
                "spec": {"taints": [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]},
            })),
        )
        .await
        .expect("operator's marks");
}

/// Allowed: its own condition, taint, annotation, and a cordon it claims on a schedulable node.
async fn its_own_fields_allowed(nodes: &Api<Node>) {
    let pp = PatchParams::default();
    // Allowed: its own condition, taint, annotation, and a cordon it claims on a schedulable node.
    allowed(
        "write its own condition",
        nodes
            .patch_status(
                "node-a",
                &pp,
                &Patch::Strategic(json!({"status": {"conditions": [{"type": "NodeMonitorMemoryPressure", "status": "True", "reason": "R", "message": "m"}]}})),
            )
            .await,
    );
    allowed(
        "add its own taint",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"spec": {"taints": [
                    {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
                    {"key": "node-monitor.io/memory-pressure", "effect": "NoSchedule"},
                ]}})),
            )
            .await,
    );
    allowed(
        "write its last-gasp annotation",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(
                    json!({"metadata": {"annotations": {"node-monitor.io/last-gasp": "x"}}}),
                ),
            )
            .await,
    );
    allowed(
        "publish what holds on its node",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"metadata": {"annotations": {
                    "node-monitor.io/guarantees": "{\"reboot-probe\":\"yes\"}"
                }}})),
            )
            .await,
    );
    allowed(
        "claim its cordon",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"metadata": {"annotations": {CORDONED_ANNOTATION: "true"}}})),
            )
            .await,
    );
    allowed(
        "cordon for its drain",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"spec": {"unschedulable": true}})),
            )
            .await,
    );
    allowed(
        "uncordon its own cordon",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"spec": {"unschedulable": false}})),
            )
            .await,
    );
    allowed(
        "drop its cordon annotation",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"metadata": {"annotations": {CORDONED_ANNOTATION: null}}})),
            )
            .await,
    );
}

/// Denied, each with the policy's own reason.
async fn other_writes_denied(nodes: &Api<Node>) {
    let pp = PatchParams::default();
    // Denied, each with the policy's own reason.
    let cases: Vec<(&str, &str, bool, serde_json::Value)> = vec![
        (
            "a node-restriction label",
            "may not change node labels",
            false,
            json!({"metadata": {"labels": {"node-restriction.kubernetes.io/trusted": "yes"}}}),
        ),
        (
            "removing an operator's label",
            "may not change node labels",
            false,
            json!({"metadata": {"labels": {"topology.kubernetes.io/zone": null}}}),
        ),
        (
            "removing the out-of-service taint",
            "may only add or remove its own taints",
            false,
            json!({"spec": {"taints": [{"key": "node-monitor.io/memory-pressure", "effect": "NoSchedule"}]}}),
        ),
        (
            "adding a foreign taint",
            "may only add or remove its own taints",
            false,
            json!({"spec": {"taints": [
                {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"},
                {"key": "node-monitor.io/memory-pressure", "effect": "NoSchedule"},
                {"key": "dedicated", "value": "attacker", "effect": "NoSchedule"},
            ]}}),
        ),
        (
            "the remediation opt-out annotation",
            "may only change its own node annotations",
            false,
            json!({"metadata": {"annotations": {"node-monitor.io/remediation": null}}}),
        ),
        (
            "a cordon it did not claim",
            "may only cordon or uncordon for its own shutdown drain",
            false,
            json!({"spec": {"unschedulable": true}}),
        ),
        (
            "the providerID",
            "may not change the node's spec",
            false,
            json!({"spec": {"providerID": "fake://elsewhere"}}),
        ),
        (
            "a finalizer, which would hold the node's deletion",
            "may not change the node's owner references or finalizers",
            false,
            json!({"metadata": {"finalizers": ["attacker.example/hold"]}}),
        ),
        (
            "an owner reference, which would hand the node to a garbage collector",
            "may not change the node's owner references or finalizers",
            false,
            json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Namespace", "name": "default", "uid": "00000000-0000-0000-0000-000000000001"}]}}),
        ),
        (
            "the kubelet's Ready condition",
            "may only write its own node conditions",
            true,
            json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Forged", "message": "m"}]}}),
        ),
        (
            "allocatable",
            "not the node's capacity, allocatable",
            true,
            json!({"status": {"allocatable": {"memory": "64Gi"}}}),
        ),
    ];
    for (what, message, status, patch) in cases {
        let r = if status {
            nodes
                .patch_status("node-a", &pp, &Patch::Strategic(patch))
                .await
        } else {
            nodes.patch("node-a", &pp, &Patch::Strategic(patch)).await
        };
        match r {
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => assert!(
                s.message.contains(message),
                "{what}: denied, but not by the policy's rule ({message}): {}",
                s.message
            ),
            other => panic!("{what} must be denied, got {other:?}"),
        }
    }
}

/// An operator's cordon cannot be claimed, and so cannot be undone by the agent; the kubelet's
/// status and the operator's taint stay.
async fn an_operators_cordon_stays_the_operators(admin_nodes: &Api<Node>, nodes: &Api<Node>) {
    let pp = PatchParams::default();
    // An operator's cordon cannot be claimed, and so cannot be undone by the agent.
    admin_nodes
        .patch(
            "node-a",
            &pp,
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("operator cordons");
    match nodes
        .patch(
            "node-a",
            &pp,
            &Patch::Merge(json!({"metadata": {"annotations": {CORDONED_ANNOTATION: "true"}}})),
        )
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
            assert!(
                s.message.contains("may not claim a cordon it did not make"),
                "{s:?}"
            )
        }
        other => panic!("claiming an operator's cordon must be denied, got {other:?}"),
    }
    forbidden(
        "uncordon an operator's cordon",
        nodes
            .patch(
                "node-a",
                &pp,
                &Patch::Merge(json!({"spec": {"unschedulable": false}})),
            )
            .await,
    );
    let n = admin_nodes.get("node-a").await.expect("get");
    let spec = n.spec.expect("spec");
    assert_eq!(
        spec.unschedulable,
        Some(true),
        "the operator's cordon stays"
    );
    assert!(
        spec.taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "node.kubernetes.io/out-of-service"),
        "the out-of-service taint stays"
    );
    let status = n.status.expect("status");
    assert_eq!(
        status.allocatable.expect("allocatable")["memory"].0,
        "3Gi",
        "allocatable stays the kubelet's"
    );
    assert!(
        status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "Ready stays the kubelet's"
    );
}

/// The agent's clean stop goes through with its own token: its pressure taint goes and its
/// condition turns Unknown; the operator's cordon and taint stay.
async fn the_clean_stop_takes_back_its_own(admin_nodes: &Api<Node>, base: &Base) {
    assert!(
        release_on_stop(
            &base.actuator(PdbPolicy::Respect),
            false,
            STOP_RELEASE_BOUND
        )
        .await,
        "the stop's writes must be allowed"
    );
    let n = admin_nodes.get("node-a").await.expect("get");
    let spec = n.spec.expect("spec");
    let keys: Vec<String> = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert!(
        keys.iter()
            .any(|k| k == "node.kubernetes.io/out-of-service")
            && !keys.iter().any(|k| k == "node-monitor.io/memory-pressure"),
        "{keys:?}"
    );
    assert_eq!(
        spec.unschedulable,
        Some(true),
        "the operator's cordon stays"
    );
    assert!(
        n.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "NodeMonitorMemoryPressure"
                && c.status == "Unknown"
                && c.reason.as_deref() == Some("NodeMonitorStopped")),
        "the agent's condition is Unknown"
    );
}

/// The node API's model with the shipped roles: the agent's own token may review callers
/// (TokenReview, SubjectAccessReview); a ServiceAccount bound to the shipped `node-monitor-viewer`
/// ClusterRole and Role is authorized by the agent and may find the agents' pods in node-monitor,
/// not elsewhere; one without the ClusterRole is refused by the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_are_authorized_by_the_agents_own_token() {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject};
    use node_monitor::http::auth::{Authorizer, Denied, KubeReviews, TOKEN_HEADER};

    let base = Base::start().await;
    let (admin, agent) = (&base.admin, &base.agent);
    let token = |path: &std::path::Path| -> String {
        let yaml = std::fs::read_to_string(path).expect("kubeconfig");
        let v: serde_json::Value = serde_norway::from_str(&yaml).expect("YAML");
        v["users"][0]["user"]["token"]
            .as_str()
            .expect("token")
            .to_owned()
    };
    let viewer_kc = base
        .cp
        .service_account_kubeconfig("default", "viewer")
        .await
        .expect("viewer");
    let stranger_kc = base
        .cp
        .service_account_kubeconfig("default", "stranger")
        .await
        .expect("stranger");
    let role_ref = |kind: &str| RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: "node-monitor-viewer".into(),
    };
    let viewer = Subject {
        kind: "ServiceAccount".into(),
        name: "viewer".into(),
        namespace: Some("default".into()),
        ..Subject::default()
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some("viewer".into()),
                    ..Default::default()
                },
                role_ref: role_ref("ClusterRole"),
                subjects: Some(vec![viewer.clone()]),
            },
        )
        .await
        .expect("ClusterRoleBinding");
    Api::<RoleBinding>::namespaced(admin.clone(), "node-monitor")
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some("viewer".into()),
                    ..Default::default()
                },
                role_ref: role_ref("Role"),
                subjects: Some(vec![viewer]),
            },
        )
        .await
        .expect("RoleBinding");

    let authorizer = Authorizer::new(
        std::sync::Arc::new(KubeReviews::new(agent.clone(), Vec::new())),
        "node-a",
    );
    let headers = |t: &str| {
        let mut h = http::HeaderMap::new();
        h.insert(
            TOKEN_HEADER,
            http::HeaderValue::from_str(&format!("Bearer {t}")).expect("header"),
        );
        h
    };
    assert_eq!(
        authorizer.check(&headers(&token(&viewer_kc))).await,
        Ok("system:serviceaccount:default:viewer".to_owned()),
        "the agent's own token reviews and authorizes the viewer"
    );
    match authorizer.check(&headers(&token(&stranger_kc))).await {
        Err(Denied::Forbidden(m)) => assert!(m.contains("nodes/node-monitor"), "{m}"),
        other => panic!("the stranger must be forbidden, got {other:?}"),
    }
    assert!(matches!(
        authorizer.check(&headers("not-a-token")).await,
        Err(Denied::Unauthenticated(_))
    ));

    let viewer_client = node_monitor_tests::control_plane::client_from_kubeconfig(&viewer_kc)
        .await
        .expect("viewer client");
    allowed(
        "list the agents' pods",
        Api::<Pod>::namespaced(viewer_client.clone(), "node-monitor")
            .list(&ListParams::default())
            .await,
    );
    forbidden(
        "list pods outside node-monitor",
        Api::<Pod>::namespaced(viewer_client.clone(), "default")
            .list(&ListParams::default())
            .await,
    );
    // The Role lets it mint the viewer ServiceAccount's token (what `kubectl node-monitor` sends
    // to the agents), and no other ServiceAccount's, the agent's least of all.
    use k8s_openapi::api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::ServiceAccount,
    };
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec!["node-monitor".into()]),
            expiration_seconds: Some(600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let accounts: Api<ServiceAccount> = Api::namespaced(viewer_client, "node-monitor");
    allowed(
        "mint the viewer ServiceAccount's token",
        accounts
            .create_token_request("node-monitor-viewer", &PostParams::default(), &request)
            .await,
    );
    forbidden(
        "mint the agent's token",
        accounts
            .create_token_request("node-monitor", &PostParams::default(), &request)
            .await,
    );
    base.cp.stop().expect("stop");
}

/// The shutdown and escalate components composed on the base (overlays/shutdown-escalate) apply
/// server-side with strict field validation, and the API server stores both features'
/// configuration (each its own drop-in next to the base's config.yaml) and both roles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composed_components_apply_with_both_configurations() {
    node_monitor_tests::cgroup::require_root("the control-plane tier");
    let cp = ControlPlane::start(ControlPlaneOptions {
        controller_manager: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane: {}", error_chain(&e)));
    let admin = cp.client();
    let applied = apply_kustomization(&admin, "overlays/shutdown-escalate").await;
    assert_eq!(
        applied,
        apply_count("base") + 4,
        "the base and two roles with bindings"
    );

    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(admin.clone(), "node-monitor");
    let drop_ins = cms
        .get("node-monitor-config-d")
        .await
        .expect("node-monitor-config-d stored")
        .data
        .unwrap_or_default();
    let keys: Vec<&str> = drop_ins.keys().map(String::as_str).collect();
    assert_eq!(keys, ["escalate.yaml", "shutdown.yaml"]);
    assert!(drop_ins["escalate.yaml"].contains("pdbPolicy: escalate"));
    assert!(drop_ins["shutdown.yaml"].contains("shutdownGracePeriod: 30s"));
    let base = cms
        .get("node-monitor-config")
        .await
        .expect("node-monitor-config stored")
        .data
        .unwrap_or_default();
    assert!(
        !base["config.yaml"].contains("escalate") && !base["config.yaml"].contains("shutdown"),
        "config.yaml stays the base's"
    );
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(admin.clone());
    for role in ["node-monitor-shutdown", "node-monitor-escalate"] {
        allowed(role, roles.get(role).await);
    }
    let ds: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(admin.clone(), "node-monitor");
    let spec = ds
        .get("node-monitor")
        .await
        .expect("DaemonSet stored")
        .spec
        .and_then(|s| s.template.spec)
        .expect("pod spec");
    assert_eq!(
        spec.node_selector
            .unwrap_or_default()
            .get("kubernetes.io/os"),
        Some(&"linux".to_owned())
    );
}

/// The number of objects a kustomization renders.
fn apply_count(rel: &str) -> usize {
    manifests::render(&manifests::kustomize_dir(rel))
        .unwrap_or_else(|e| panic!("render {rel}: {}", error_chain(&e)))
        .len()
}
