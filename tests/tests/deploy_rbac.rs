//! The shipped manifests (deploy/kustomize/base) against a real API server: they apply server-side,
//! and with the agent's own ServiceAccount token (bound to a pod on its node, as in the DaemonSet)
//! the calls the agent makes succeed, while everything else is forbidden: secrets, pods in other
//! namespaces, deleting pods (unless the escalate overlay is applied), deleting nodes, and writing
//! any node but its own (the ValidatingAdmissionPolicy).
use std::path::Path;

use k8s_openapi::api::{
    authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
    core::v1::{Container, Event, Node, Pod, PodSpec, Secret, ServiceAccount},
};
use kube::{
    Api, Client,
    api::{DeleteParams, DynamicObject, EvictParams, ObjectMeta, Patch, PatchParams, PostParams},
    config::AuthInfo,
    core::GroupVersionKind,
    discovery::{Scope, pinned_kind},
};
use node_monitor_tests::control_plane::{ControlPlane, ControlPlaneOptions};
use serde_json::json;

fn deploy(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kustomize")
        .join(rel)
}

/// Server-side applies every document of every resource file listed in a kustomization.
async fn apply_kustomization(client: &Client, dir: &Path) -> usize {
    let k: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(dir.join("kustomization.yaml")).expect("kustomization"),
    )
    .expect("yaml");
    let mut applied = 0;
    for res in k["resources"].as_sequence().expect("resources") {
        let rel = res.as_str().expect("resource path");
        let path = dir.join(rel);
        if path.is_dir() {
            continue; // a base, applied by its own call
        }
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize_from(doc);
            let obj: DynamicObject =
                serde_json::from_value(serde_json::to_value(&value).expect("json"))
                    .expect("object");
            let tm = obj.types.clone().expect("apiVersion/kind");
            let gvk = GroupVersionKind::try_from(&tm).expect("gvk");
            let (ar, caps) = pinned_kind(client, &gvk)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", tm.kind));
            let name = obj.metadata.name.clone().expect("name");
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => Api::namespaced_with(
                    client.clone(),
                    obj.metadata.namespace.as_deref().unwrap_or("default"),
                    &ar,
                ),
                Scope::Cluster => Api::all_with(client.clone(), &ar),
            };
            api.patch(
                &name,
                &PatchParams::apply("node-monitor-tests").force(),
                &Patch::Apply(&obj),
            )
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "server-side apply of {} {name} from {}: {e}",
                    tm.kind,
                    path.display()
                )
            });
            applied += 1;
        }
    }
    applied
}

trait DeserializeFrom {
    fn deserialize_from(d: serde_yaml::Deserializer<'_>) -> Self;
}

impl DeserializeFrom for serde_yaml::Value {
    fn deserialize_from(d: serde_yaml::Deserializer<'_>) -> Self {
        serde::Deserialize::deserialize(d).expect("YAML document")
    }
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
    let p = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.into()),
            service_account_name: sa.map(Into::into),
            containers: vec![Container {
                name: "c".into(),
                image: Some("x".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &p)
        .await
        .expect("create pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_apply_and_grant_least_privilege() {
    node_monitor_tests::cgroup::require_root("the control-plane tier");
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let admin = cp.client();
    assert!(apply_kustomization(&admin, &deploy("base")).await >= 9);

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
    let victim = pod(&admin, "default", "victim", "node-a", None).await;

    // The token the kubelet would mount into the DaemonSet pod on node-a: bound to that pod.
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
    let agent = Client::try_from(config).expect("agent client");

    // The admission policy is loaded asynchronously after it is created: wait until it denies a
    // write to another node, so the checks below run with it in force.
    let nodes: Api<Node> = Api::all(agent.clone());
    let other = json!({"metadata": {"labels": {"probe": "x"}}});
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match nodes
            .patch("node-b", &PatchParams::default(), &Patch::Merge(&other))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 403 || s.code == 422 => {
                assert!(
                    s.message
                        .contains("node-monitor may only modify the node it runs on"),
                    "{s:?}"
                );
                break;
            }
            r => assert!(
                std::time::Instant::now() < deadline,
                "the own-node policy never took effect: {r:?}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    // What the agent does.
    let pods: Api<Pod> = Api::all(agent.clone());
    allowed(
        "list pods on its node",
        pods.list(&kube::api::ListParams::default().fields("spec.nodeName=node-a"))
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
    allowed(
        "taint its own node",
        nodes
            .patch("node-a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": [{"key": "node-monitor.io/memory-pressure", "effect": "NoSchedule"}]}})))
            .await,
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

    // The escalate overlay adds exactly pods/delete.
    assert!(apply_kustomization(&admin, &deploy("overlays/escalate")).await >= 2);
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
    forbidden(
        "read secrets with the escalate overlay",
        Api::<Secret>::namespaced(agent.clone(), "default")
            .list(&Default::default())
            .await,
    );
    cp.stop().expect("stop");
}
