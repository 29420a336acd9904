use super::*;
use serde_json::json;

fn pod(name: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}")},
        "spec": spec,
    }))
    .expect("pod json")
}

/// A pod of one container named after it (the kubelet test's `newPod(name, newContainer(...))`),
/// with an ephemeral-storage limit if given, and `volumes`.
fn one_container(name: &str, limit: Option<&str>, volumes: serde_json::Value) -> Pod {
    let mut c = json!({"name": name});
    if let Some(l) = limit {
        c["resources"] =
            json!({"requests": {"ephemeral-storage": l}, "limits": {"ephemeral-storage": l}});
    }
    pod(name, json!({"containers": [c], "volumes": volumes}))
}

fn prepared(p: &Pod) -> (PodInfo, StorageLimits) {
    (
        PodInfo::from_pod(p).expect("pod info"),
        StorageLimits::from_pod(p).expect("limits"),
    )
}

const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

/// The kubelet's `newPodDiskStats`: the container's rootfs and logs, every volume of the pod
/// using `per_volume`, and the pod's total the sum of them all.
fn disk_stats(p: &Pod, rootfs: u64, logs: u64, per_volume: u64) -> StorageUsage {
    let spec = p.spec.as_ref().expect("spec");
    let mut volumes = BTreeMap::new();
    for v in spec.volumes.as_deref().unwrap_or(&[]) {
        volumes.insert(v.name.clone(), per_volume);
    }
    // The kubelet's helper always reports one local volume, even for pods without one.
    let local = if volumes.is_empty() {
        per_volume
    } else {
        per_volume * volumes.len() as u64
    };
    StorageUsage {
        pod: Some(rootfs + logs + local),
        volumes,
        containers: spec
            .containers
            .iter()
            .map(|c| ContainerStorage {
                name: c.name.clone(),
                logs: Some(logs),
                rootfs: Some(rootfs),
            })
            .collect(),
    }
}

fn decide(p: &Pod, usage: StorageUsage, dedicated: bool) -> Vec<LimitEviction> {
    let pods = vec![prepared(p)];
    let usage = HashMap::from([(pods[0].0.uid.clone(), usage)]);
    limit_evictions(&pods, &usage, dedicated)
}

/// Modelled on the kubelet's `TestStorageLimitEvictions`: each pod is evicted, with no node
/// pressure at all, with the immediate grace period.
#[test]
fn kubelet_storage_limit_evictions() {
    let empty_dir = json!([{"name": "emptyDirVolume", "emptyDir": {"sizeLimit": "1Gi"}}]);
    type Case = (&'static str, Pod, (u64, u64, u64), LimitKind, &'static str);
    let cases: Vec<Case> = vec![
        (
            "eviction due to rootfs above limit",
            one_container("rootfs-above-limits", Some("1Gi"), json!([])),
            (2 * GI, 0, 0),
            LimitKind::Pod,
            "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
        ),
        (
            "eviction due to logsfs above limit",
            one_container("logsfs-above-limits", Some("1Gi"), json!([])),
            (0, 2 * GI, 0),
            LimitKind::Pod,
            "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
        ),
        (
            "eviction due to local volume above limit",
            one_container("localvolume-above-limits", Some("1Gi"), json!([])),
            (0, 0, 2 * GI),
            LimitKind::Pod,
            "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
        ),
        (
            "eviction due to aggregate above limit",
            one_container("aggregate-above-limits", Some("1Gi"), json!([])),
            (500 * MI, 500 * MI, 500 * MI),
            LimitKind::Pod,
            "Pod ephemeral local storage usage exceeds the total limit of containers 1Gi. ",
        ),
        (
            "eviction due to emptyDir above limit",
            one_container("emptydir-above-limits", None, empty_dir),
            (0, 0, 2 * GI),
            LimitKind::EmptyDir,
            "Usage of EmptyDir volume \"emptyDirVolume\" exceeds the limit \"1Gi\". ",
        ),
    ];
    for (what, p, (rootfs, logs, volume), kind, message) in cases {
        let got = decide(&p, disk_stats(&p, rootfs, logs, volume), false);
        assert_eq!(got.len(), 1, "{what}: {got:?}");
        let e = &got[0];
        assert_eq!(e.name, p.metadata.name.clone().expect("name"), "{what}");
        assert_eq!(e.kind, kind, "{what}");
        assert_eq!(e.message, message, "{what}");
        assert_eq!(e.reason, "Evicted", "{what}");
        assert_eq!(e.grace_period_seconds, 1, "{what}");
    }
}

#[test]
fn within_limits_nothing_is_evicted() {
    let cases: Vec<(&str, Pod, StorageUsage)> = vec![
        (
            "exactly at the pod limit",
            one_container("at-limit", Some("1Gi"), json!([])),
            StorageUsage {
                pod: Some(GI),
                ..StorageUsage::default()
            },
        ),
        (
            "emptyDir at its sizeLimit",
            one_container(
                "ed-at",
                None,
                json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}]),
            ),
            StorageUsage {
                pod: Some(5 * GI),
                volumes: BTreeMap::from([("scratch".into(), GI)]),
                containers: vec![],
            },
        ),
        (
            "emptyDir without a sizeLimit, no limits anywhere",
            one_container(
                "ed-nolimit",
                None,
                json!([{"name": "scratch", "emptyDir": {}}]),
            ),
            StorageUsage {
                pod: Some(50 * GI),
                volumes: BTreeMap::from([("scratch".into(), 50 * GI)]),
                containers: vec![],
            },
        ),
        (
            "a zero sizeLimit is no limit",
            one_container(
                "ed-zero",
                None,
                json!([{"name": "scratch", "emptyDir": {"sizeLimit": "0"}}]),
            ),
            StorageUsage {
                pod: Some(GI),
                volumes: BTreeMap::from([("scratch".into(), GI)]),
                containers: vec![],
            },
        ),
        (
            "the emptyDir not measured",
            one_container(
                "ed-unmeasured",
                None,
                json!([{"name": "scratch", "emptyDir": {"sizeLimit": "1Mi"}}]),
            ),
            StorageUsage {
                pod: Some(GI),
                ..StorageUsage::default()
            },
        ),
    ];
    for (what, p, usage) in cases {
        assert_eq!(decide(&p, usage, false), vec![], "{what}");
    }
}

#[test]
fn container_limit_counts_the_writable_layer_only_without_a_dedicated_imagefs() {
    // Two containers of 1Gi each: the pod limit is 2Gi, so one container at 1.5Gi is caught
    // only by its own limit.
    let p = pod(
        "two",
        json!({"containers": [
            {"name": "a", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
            {"name": "b", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
        ]}),
    );
    let usage = StorageUsage {
        pod: Some(1536 * MI),
        volumes: BTreeMap::new(),
        containers: vec![
            ContainerStorage {
                name: "a".into(),
                logs: Some(10 * MI),
                rootfs: Some(10 * MI),
            },
            ContainerStorage {
                name: "b".into(),
                logs: Some(512 * MI),
                rootfs: Some(1004 * MI),
            },
        ],
    };
    let got = decide(&p, usage.clone(), false);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].kind, LimitKind::Container);
    assert_eq!(
        got[0].message,
        "Container b exceeded its local ephemeral storage limit \"1Gi\". "
    );
    // With a dedicated imagefs the layer is not the container's to answer for: 512Mi of logs
    // are within 1Gi.
    assert_eq!(decide(&p, usage, true), vec![]);
}

#[test]
fn checks_run_in_the_kubelets_order_and_critical_pods_are_refused() {
    // Over both its emptyDir's sizeLimit and its pod limit: the emptyDir message wins.
    let p = one_container(
        "both",
        Some("1Gi"),
        json!([{"name": "cache", "emptyDir": {"sizeLimit": "100Mi"}}]),
    );
    let got = decide(&p, disk_stats(&p, GI, 0, 200 * MI), false);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].kind, LimitKind::EmptyDir);
    assert_eq!(
        got[0].message,
        "Usage of EmptyDir volume \"cache\" exceeds the limit \"100Mi\". "
    );

    let mut critical = p.clone();
    critical.spec.as_mut().expect("spec").priority = Some(2_000_000_000);
    assert_eq!(
        decide(&critical, disk_stats(&critical, GI, 0, 200 * MI), false),
        vec![]
    );
}

#[test]
fn every_pod_over_a_limit_is_evicted_in_one_pass_and_unmeasured_pods_are_not_judged() {
    let a = one_container("a", Some("1Mi"), json!([]));
    let b = one_container("b", Some("1Mi"), json!([]));
    let c = one_container("c", Some("1Mi"), json!([]));
    let pods = vec![prepared(&a), prepared(&b), prepared(&c)];
    let usage = HashMap::from([
        ("uid-a".to_owned(), disk_stats(&a, 2 * MI, 0, 0)),
        ("uid-c".to_owned(), disk_stats(&c, 2 * MI, 0, 0)),
    ]);
    let names: Vec<String> = limit_evictions(&pods, &usage, false)
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["a", "c"]);
}

#[test]
fn pod_limit_follows_pod_limits() {
    let lim = |p: serde_json::Value| {
        StorageLimits::from_pod(&pod("p", p))
            .expect("limits")
            .pod
            .map(|q| q.to_string())
    };
    let c = |name: &str, l: Option<&str>| match l {
        Some(l) => json!({"name": name, "resources": {"limits": {"ephemeral-storage": l}}}),
        None => json!({"name": name}),
    };
    let cases: Vec<(&str, serde_json::Value, Option<&str>)> = vec![
        ("no limits", json!({"containers": [c("a", None)]}), None),
        (
            "one container keeps its form",
            json!({"containers": [c("a", Some("1G")), c("b", None)]}),
            Some("1G"),
        ),
        (
            "containers summed",
            json!({"containers": [c("a", Some("1Gi")), c("b", Some("512Mi"))]}),
            Some("1536Mi"),
        ),
        (
            "an init container larger than the sum",
            json!({"containers": [c("a", Some("1Gi"))], "initContainers": [c("i", Some("3Gi"))]}),
            Some("3Gi"),
        ),
        (
            "only an init container sets it",
            json!({"containers": [c("a", None)], "initContainers": [c("i", Some("2Gi"))]}),
            Some("2Gi"),
        ),
        (
            "a sidecar adds to the containers and to later init containers",
            json!({
                "containers": [c("a", Some("1Gi"))],
                "initContainers": [
                    {"name": "s", "restartPolicy": "Always", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
                    c("i", Some("1536Mi")),
                ]
            }),
            Some("2560Mi"),
        ),
        (
            "overhead added to a non-zero limit",
            json!({"containers": [c("a", Some("1Gi"))], "overhead": {"ephemeral-storage": "1Gi"}}),
            Some("2Gi"),
        ),
        (
            "overhead alone sets no limit",
            json!({"containers": [c("a", None)], "overhead": {"ephemeral-storage": "1Gi"}}),
            None,
        ),
        (
            "a zero limit is a limit",
            json!({"containers": [c("a", Some("0"))]}),
            Some("0"),
        ),
    ];
    for (what, spec, want) in cases {
        assert_eq!(lim(spec).as_deref(), want, "{what}");
    }
}

#[test]
fn a_zero_pod_limit_evicts_any_usage_but_a_zero_container_limit_is_none() {
    // PodLimits keeps a zero limit (found), and any usage exceeds it; the container check skips
    // a zero limit.
    let p = one_container("zero", Some("0"), json!([]));
    let limits = StorageLimits::from_pod(&p).expect("limits");
    assert!(limits.containers.is_empty());
    let got = decide(&p, disk_stats(&p, 1, 0, 0), false);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].kind, LimitKind::Pod);
    assert_eq!(
        got[0].message,
        "Pod ephemeral local storage usage exceeds the total limit of containers 0. "
    );
}

#[test]
fn a_malformed_limit_is_an_error_naming_the_field() {
    let p = pod(
        "bad",
        json!({"containers": [], "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "lots"}}]}),
    );
    let err = StorageLimits::from_pod(&p).expect_err("malformed");
    assert!(
        err.to_string()
            .contains("spec.volumes[v].emptyDir.sizeLimit"),
        "{err}"
    );
    let p = pod(
        "bad",
        json!({"containers": [{"name": "c", "resources": {"limits": {"ephemeral-storage": "x1"}}}]}),
    );
    let err = StorageLimits::from_pod(&p).expect_err("malformed");
    assert!(
        err.to_string()
            .contains("spec.containers[c].resources.limits.ephemeral-storage"),
        "{err}"
    );
}

#[test]
fn go_quoting() {
    assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
    assert_eq!(go_quote("1Gi"), "\"1Gi\"");
}
