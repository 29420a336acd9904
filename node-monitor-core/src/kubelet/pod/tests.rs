#[test]
fn blindness_needs_settled_running_pods_and_no_cgroup_found() {
    let p = |secs: Option<u64>, found: bool| PodPresence {
        running_for: secs.map(Duration::from_secs),
        cgroup_found: found,
    };
    let settle = POD_CGROUP_SETTLE;
    let cases: Vec<(&str, Vec<PodPresence>, Option<usize>)> = vec![
        ("no pods", vec![], None),
        (
            "only pods that just started",
            vec![p(Some(5), false), p(None, false)],
            None,
        ),
        (
            "settled pods, none found",
            vec![p(Some(60), false), p(Some(31), false)],
            Some(2),
        ),
        (
            "settled pods, none found; a new one found",
            vec![p(Some(60), false), p(Some(1), true)],
            Some(1),
        ),
        (
            "one settled pod found",
            vec![p(Some(60), false), p(Some(90), true)],
            None,
        ),
        (
            "exactly at the settle time",
            vec![p(Some(30), false)],
            Some(1),
        ),
        (
            "all found",
            vec![p(Some(60), true), p(Some(600), true)],
            None,
        ),
    ];
    for (what, pods, want) in cases {
        assert_eq!(blind_to_pods(&pods, settle), want, "{what}");
    }
}

use super::*;
use serde_json::json;

pub(crate) fn pod_from(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod json")
}

fn info(v: serde_json::Value) -> PodInfo {
    PodInfo::from_pod(&pod_from(v)).expect("pod info")
}

fn container(
    name: &str,
    requests: serde_json::Value,
    limits: serde_json::Value,
) -> serde_json::Value {
    json!({"name": name, "resources": {"requests": requests, "limits": limits}})
}

fn pod_with(containers: Vec<serde_json::Value>, init: Vec<serde_json::Value>) -> serde_json::Value {
    json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": containers, "initContainers": init}
    })
}

#[test]
fn qos_from_the_spec() {
    let g = container(
        "a",
        json!({"cpu": "1", "memory": "1Gi"}),
        json!({"cpu": "1", "memory": "1Gi"}),
    );
    let g_equal_values = container(
        "b",
        json!({"cpu": "1000m", "memory": "1024Mi"}),
        json!({"cpu": "1", "memory": "1Gi"}),
    );
    let be = json!({"name": "c"});
    let b_req_only = container("d", json!({"memory": "1Gi"}), json!({}));
    let b_cpu_only = container("e", json!({"cpu": "1"}), json!({"cpu": "1"}));
    let b_storage_only = container("f", json!({"ephemeral-storage": "1Gi"}), json!({}));
    let cases: Vec<(serde_json::Value, QosClass)> = vec![
        (pod_with(vec![g.clone()], vec![]), QosClass::Guaranteed),
        (
            pod_with(vec![g.clone(), g_equal_values], vec![]),
            QosClass::Guaranteed,
        ),
        (pod_with(vec![be.clone()], vec![]), QosClass::BestEffort),
        (pod_with(vec![b_storage_only], vec![]), QosClass::BestEffort),
        (pod_with(vec![b_req_only], vec![]), QosClass::Burstable),
        (pod_with(vec![b_cpu_only], vec![]), QosClass::Burstable),
        (
            pod_with(vec![g.clone(), be.clone()], vec![]),
            QosClass::Burstable,
        ),
        // Init containers count.
        (
            pod_with(vec![g.clone()], vec![be.clone()]),
            QosClass::Burstable,
        ),
        (
            pod_with(vec![be.clone()], vec![g.clone()]),
            QosClass::Burstable,
        ),
        (
            pod_with(vec![g.clone()], vec![g.clone()]),
            QosClass::Guaranteed,
        ),
    ];
    for (i, (pod, want)) in cases.into_iter().enumerate() {
        assert_eq!(info(pod).qos, want, "case {i}");
    }
}

#[test]
fn qos_from_pod_level_resources_and_status() {
    let mut p = pod_with(vec![json!({"name": "a"})], vec![]);
    p["spec"]["resources"] =
        json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}});
    assert_eq!(info(p.clone()).qos, QosClass::Guaranteed);
    p["spec"]["resources"] = json!({"requests": {"memory": "1Gi"}});
    assert_eq!(info(p.clone()).qos, QosClass::Burstable);
    // The API's status.qosClass wins over the spec.
    p["status"] = json!({"qosClass": "BestEffort"});
    assert_eq!(info(p).qos, QosClass::BestEffort);
}

#[test]
fn memory_request_aggregation() {
    let req = |m: &str| container("c", json!({"memory": m}), json!({}));
    let mut sidecar = req("100Mi");
    sidecar["name"] = json!("sidecar");
    sidecar["restartPolicy"] = json!("Always");
    let cases: Vec<(serde_json::Value, i64)> = vec![
        (
            pod_with(vec![req("100Mi"), req("200Mi")], vec![]),
            300 << 20,
        ),
        // An ordinary init container larger than the containers dominates.
        (pod_with(vec![req("100Mi")], vec![req("1Gi")]), 1 << 30),
        (pod_with(vec![req("1Gi")], vec![req("100Mi")]), 1 << 30),
        // A sidecar adds to the containers, and to init containers after it.
        (
            pod_with(vec![req("100Mi")], vec![sidecar.clone()]),
            200 << 20,
        ),
        (
            pod_with(vec![req("100Mi")], vec![sidecar.clone(), req("500Mi")]),
            600 << 20,
        ),
        (pod_with(vec![json!({"name": "x"})], vec![]), 0),
    ];
    for (i, (pod, want)) in cases.into_iter().enumerate() {
        assert_eq!(info(pod).memory_request.value(), want, "case {i}");
    }
    // Overhead is added to a non-zero request only.
    let mut p = pod_with(vec![req("100Mi")], vec![]);
    p["spec"]["overhead"] = json!({"memory": "10Mi"});
    assert_eq!(info(p).memory_request.value(), 110 << 20);
    let mut p = pod_with(vec![json!({"name": "x"})], vec![]);
    p["spec"]["overhead"] = json!({"memory": "10Mi"});
    assert_eq!(info(p).memory_request.value(), 0);
    // Pod-level resources replace the containers' requests (and carry no ephemeral storage).
    let mut p = pod_with(
        vec![container(
            "c",
            json!({"memory": "100Mi", "ephemeral-storage": "1Gi"}),
            json!({}),
        )],
        vec![],
    );
    p["spec"]["resources"] = json!({"requests": {"memory": "2Gi"}});
    let i = info(p);
    assert_eq!(i.memory_request.value(), 2 << 30);
    assert_eq!(i.ephemeral_storage_request.value(), 0);
    assert_eq!(
        i.pod_memory_request.map(|q| q.to_string()),
        Some("2Gi".into())
    );
}

#[test]
fn criticality_and_priority() {
    let base = || json!({"metadata": {"name": "p", "namespace": "kube-system", "uid": "u"}, "spec": {"containers": []}});
    let p = info(base());
    assert_eq!((p.priority, p.critical), (0, false));
    let mut v = base();
    v["spec"]["priority"] = json!(2_000_000_000);
    assert!(info(v).critical, "system-cluster-critical priority");
    let mut v = base();
    v["spec"]["priority"] = json!(1_999_999_999);
    assert!(!info(v).critical);
    let mut v = base();
    v["metadata"]["annotations"] = json!({"kubernetes.io/config.source": "file"});
    let p = info(v);
    assert!(p.static_pod && p.critical);
    let mut v = base();
    v["metadata"]["annotations"] = json!({"kubernetes.io/config.source": "api"});
    assert!(!info(v).critical);
    let mut v = base();
    v["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
    let p = info(v);
    assert!(p.mirror_pod && p.critical);
}

#[test]
fn bad_pods_are_errors_naming_the_field() {
    let err = PodInfo::from_pod(&pod_from(json!({"metadata": {"name": "p"}}))).expect_err("no uid");
    assert_eq!(err.to_string(), "pod default/p: metadata.uid is missing");
    let p = pod_with(
        vec![container("app", json!({"memory": "lots"}), json!({}))],
        vec![],
    );
    let err = PodInfo::from_pod(&pod_from(p)).expect_err("bad quantity");
    let msg = err.to_string();
    assert!(
        msg.contains("ns/p") && msg.contains("spec.containers[app].resources.requests.memory"),
        "{msg}"
    );
}

#[test]
fn activity() {
    let mut v = pod_with(vec![], vec![]);
    assert!(pod_is_active(&pod_from(v.clone())));
    v["status"] = json!({"phase": "Succeeded"});
    assert!(!pod_is_active(&pod_from(v.clone())));
    v["status"] = json!({"phase": "Running"});
    v["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    assert!(!pod_is_active(&pod_from(v)));
}

#[test]
fn container_names_come_from_the_pod_statuses() {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p"},
        "status": {
            "containerStatuses": [{"name": "app", "containerID": "containerd://abc", "image": "", "imageID": "", "ready": true, "restartCount": 0}],
            "initContainerStatuses": [{"name": "init", "containerID": "cri-o://def", "image": "", "imageID": "", "ready": false, "restartCount": 0}]
        }
    }))
    .expect("pod");
    assert_eq!(container_name(&pod, "abc").as_deref(), Some("app"));
    assert_eq!(container_name(&pod, "def").as_deref(), Some("init"));
    assert_eq!(container_name(&pod, "ab"), None, "whole ids only");
    assert_eq!(container_name(&pod, ""), None);
    assert_eq!(bare_container_id("containerd://abc"), "abc");
    assert_eq!(bare_container_id("abc"), "abc");
}
