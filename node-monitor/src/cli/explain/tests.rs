use serde_json::json;

use super::*;

fn snapshot(observations: Value, extra: Value) -> String {
    let mut v = json!({
        "pods": {"apiVersion": "v1", "kind": "List", "items": [
            {"metadata": {"name": "a", "namespace": "default", "uid": "ua"},
             "spec": {"containers": [{"name": "app"}]}}
        ]},
        "usage": {"ua": {"memory": "700Mi", "containers": {"app": {"memory": "700Mi"}}}},
        "observations": observations
    });
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v.to_string()
}

#[test]
fn explains_a_hard_eviction() {
    let text = snapshot(
        json!({"memory.available": {"available": "50Mi", "capacity": "4Gi"}}),
        json!({}),
    );
    let out =
        explain("s", &text, None, &EvictionFlags::default(), Duration::ZERO).expect("explain");
    assert_eq!(out["reclaim"], "memory.available");
    assert_eq!(out["reclaim_details"]["resource"], "memory");
    assert_eq!(out["evict"][0]["name"], "a");
    assert_eq!(out["evict"][0]["grace_period_seconds"], 1);
    assert_eq!(
        out["evict"][0]["message"],
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container app was using 700Mi, request is 0, has larger consumption of memory. "
    );
}

/// The output names the working-set formula the memory signals use: the kubelet's unless the
/// configuration opts into leaving reclaimable active page cache out.
#[test]
fn the_memory_working_set_formula_is_shown() {
    let obs = json!({"memory.available": {"available": "500Mi", "capacity": "4Gi"}});
    let out = explain(
        "s",
        &snapshot(obs.clone(), json!({})),
        None,
        &EvictionFlags::default(),
        Duration::ZERO,
    )
    .expect("explain");
    assert_eq!(out["memory_working_set"]["setting"], "kubelet");
    assert_eq!(
        out["memory_working_set"]["formula"],
        "working_set = usage - inactive_file"
    );
    let text = snapshot(
        obs,
        json!({"config": {"nodeMonitor": {"memoryWorkingSet": "reclaimable"}}}),
    );
    let out =
        explain("s", &text, None, &EvictionFlags::default(), Duration::ZERO).expect("explain");
    assert_eq!(out["memory_working_set"]["setting"], "reclaimable");
    assert_eq!(
        out["memory_working_set"]["formula"],
        "working_set = usage - inactive_file - reclaimable_active_file; \
         reclaimable_active_file = min(active_file, file - shmem - inactive_file) - (dirty + \
         writeback)"
    );
}

#[test]
fn soft_thresholds_wait_unless_held() {
    let text = snapshot(
        json!({"memory.available": {"available": "500Mi", "capacity": "4Gi"}}),
        json!({"config": {"evictionSoft": {"memory.available": "1Gi"},
                              "evictionSoftGracePeriod": {"memory.available": "1m"}}}),
    );
    let out =
        explain("s", &text, None, &EvictionFlags::default(), Duration::ZERO).expect("explain");
    assert_eq!(out["thresholds_met"][0]["grace_period_elapsed"], false);
    assert_eq!(out["reclaim"], Value::Null);
    assert_eq!(out["evict"], json!([]));
    let out = explain(
        "s",
        &text,
        None,
        &EvictionFlags::default(),
        Duration::from_secs(60),
    )
    .expect("explain");
    assert_eq!(out["reclaim"], "memory.available");
    assert_eq!(
        out["evict"][0]["grace_period_seconds"], 1,
        "max pod grace 0: 1s"
    );
}

#[test]
fn bad_snapshots_name_the_field() {
    let cases: &[(String, &str)] = &[
        (
            snapshot(
                json!({"memory.free": {"available": 1, "capacity": 2}}),
                json!({}),
            ),
            "memory.free",
        ),
        (
            snapshot(
                json!({"memory.available": {"available": "lots", "capacity": 2}}),
                json!({}),
            ),
            "lots",
        ),
        (
            snapshot(
                json!({"memory.available": {"available": "3Gi", "capacity": "2Gi"}}),
                json!({}),
            ),
            "observations.memory.available.available 3221225472 is more than its capacity 2147483648",
        ),
        (snapshot(json!({}), json!({"podz": []})), "podz"),
        (
            snapshot(json!({}), json!({"pods": [{"metadata": {"name": 7}}]})),
            "pods[0]",
        ),
        (
            snapshot(json!({}), json!({"pods": [{"metadata": {"name": "x"}}]})),
            "metadata.uid is missing",
        ),
        (
            snapshot(json!({}), json!({"usage": {"ua": {"memory": "-1Mi"}}})),
            "usage.ua.memory",
        ),
        (
            snapshot(json!({}), json!({"usage": {"ua": {"inodes": -3}}})),
            "usage.ua.inodes: -3 is negative",
        ),
        (
            snapshot(
                json!({}),
                json!({"usage": {"ua": {"writableLayerInodes": "-1k"}}}),
            ),
            "usage.ua.writableLayerInodes",
        ),
        (
            snapshot(
                json!({}),
                json!({"config": {"evictionHard": {"memory.available": "1Gb"}}}),
            ),
            "1Gb",
        ),
    ];
    for (text, want) in cases {
        let err =
            explain("s", text, None, &EvictionFlags::default(), Duration::ZERO).expect_err(want);
        let msg = format!("{err:#}");
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    }
}

/// A snapshot's per-pod `inodes` rank inode pressure: the pod with many files goes first; on a
/// dedicated image filesystem nodefs counts them without the writable layer's.
#[test]
fn inode_pressure_ranks_by_the_snapshots_inodes() {
    let pods = json!({"pods": [
        {"metadata": {"name": "few", "namespace": "default", "uid": "u-few"},
         "spec": {"containers": [{"name": "app"}]}},
        {"metadata": {"name": "many", "namespace": "default", "uid": "u-many"},
         "spec": {"containers": [{"name": "app"}]}}
    ]});
    let run = |dedicated: bool| {
        let mut extra = pods.clone();
        if let Value::Object(m) = &mut extra {
            m.insert(
                "usage".into(),
                json!({
                    "u-few": {"disk": "5Gi", "inodes": 900, "writableLayerInodes": 100},
                    "u-many": {"disk": "10Mi", "inodes": 250000, "writableLayerInodes": 249000}
                }),
            );
            m.insert(
                "filesystem".into(),
                json!({"dedicatedImageFs": dedicated, "splitContainerImageFs": false}),
            );
        }
        let text = snapshot(
            json!({"nodefs.inodesFree": {"available": 1000, "capacity": 1000000}}),
            extra,
        );
        explain("s", &text, None, &EvictionFlags::default(), Duration::ZERO).expect("explain")
    };
    let out = run(false);
    assert_eq!(out["reclaim"], "nodefs.inodesFree");
    assert_eq!(out["evict"][0]["name"], "many");
    assert_eq!(out["ranked"][0]["usage"], 250_000);
    // Dedicated imagefs: nodefs counts 800 for "few" and 1000 for "many"'s logs and volumes.
    let out = run(true);
    assert_eq!(out["evict"][0]["name"], "many");
    assert_eq!(out["ranked"][0]["usage"], 1000);
    assert_eq!(out["ranked"][1]["usage"], 800);
}

/// A snapshot with no pressure names the pods over a local-storage limit, with the kubelet's
/// kind and message, apart from the pressure decision; `localStorageCapacityIsolation: false`
/// names none.
#[test]
fn local_storage_limit_evictions_are_explained_without_pressure() {
    let pods = json!({"items": [
        {"metadata": {"name": "filler", "namespace": "default", "uid": "uf"},
         "spec": {"containers": [{"name": "app"}, {"name": "side",
             "resources": {"limits": {"ephemeral-storage": "10Mi"}}}],
             "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "64Mi"}}]}},
        {"metadata": {"name": "logger", "namespace": "default", "uid": "ul"},
         "spec": {"containers": [{"name": "app", "resources": {"limits": {"ephemeral-storage": "1Gi"}}},
             {"name": "side", "resources": {"limits": {"ephemeral-storage": "10Mi"}}}]}},
    ]});
    let usage = json!({
        "uf": {"disk": "80Mi", "emptyDirs": {"cache": "65Mi"}},
        "ul": {"disk": "30Mi", "containers": {"side": {"logs": "8Mi", "rootfs": "4Mi"}}},
    });
    let obs = json!({"memory.available": {"available": "3Gi", "capacity": "4Gi"}});
    let text = |extra: Value| {
        let mut v = json!({"pods": pods, "usage": usage, "observations": obs});
        if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
            m.extend(e);
        }
        v.to_string()
    };
    let out = explain(
        "s",
        &text(json!({})),
        None,
        &EvictionFlags::default(),
        Duration::ZERO,
    )
    .expect("explain");
    assert_eq!(out["evict"], json!([]), "no pressure: {out}");
    let limited = &out["local_storage_evictions"];
    assert_eq!(limited[0]["name"], "filler", "{out}");
    assert_eq!(limited[0]["kind"], "emptydir");
    assert_eq!(
        limited[0]["message"],
        "Usage of EmptyDir volume \"cache\" exceeds the limit \"64Mi\". "
    );
    assert_eq!(limited[0]["grace_period_seconds"], 1);
    assert_eq!(limited[1]["name"], "logger");
    assert_eq!(limited[1]["kind"], "container");
    assert_eq!(
        limited[1]["message"],
        "Container side exceeded its local ephemeral storage limit \"10Mi\". "
    );
    assert_eq!(limited.as_array().map(Vec::len), Some(2));
    // With a dedicated imagefs the layer is not the container's to answer for.
    let out = explain(
        "s",
        &text(json!({"filesystem": {"dedicatedImageFs": true, "splitContainerImageFs": false}})),
        None,
        &EvictionFlags::default(),
        Duration::ZERO,
    )
    .expect("explain");
    assert_eq!(
        out["local_storage_evictions"].as_array().map(Vec::len),
        Some(1)
    );
    let out = explain(
        "s",
        &text(json!({"config": {"localStorageCapacityIsolation": false}})),
        None,
        &EvictionFlags::default(),
        Duration::ZERO,
    )
    .expect("explain");
    assert_eq!(out["local_storage_evictions"], json!([]));
}
