//! The Helm chart deploy/helm/node-monitor, with helm itself (built by `cargo xtask setup
//! --with-control-plane`): `helm lint`, `helm template` with the defaults and with every toggle
//! on, the same objects as deploy/kustomize for the same choices (so the two ways to install
//! cannot drift), the alerts and the dashboard straight from deploy/prometheus and
//! deploy/grafana, what each toggle changes, and the rendered objects applied server-side to a
//! real API server, where the post-delete hook's own ServiceAccount cleans every node with
//! `node-monitor cleanup --all-nodes`.
use std::{collections::BTreeMap, process::Command};

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::{
    Api,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions, error_chain},
    helm,
    manifests::{self, Manifest, find, kustomize_dir, render},
};
use serde_json::{Value, json};

/// Every toggle on, and the non-default choices.
const ALL_ON: [&str; 9] = [
    "createNamespace=true",
    "shutdown.enabled=true",
    "escalate.enabled=true",
    "remediate.enabled=true",
    "serviceMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "dashboard.enabled=true",
    "runtime=crio",
    "cgroupDriver=systemd",
];

fn template(set: &[&str]) -> Vec<Manifest> {
    helm::template(set).unwrap_or_else(|e| panic!("helm template {set:?}: {}", error_chain(&e)))
}

fn kustomized(rel: &str) -> Vec<Manifest> {
    render(&kustomize_dir(rel)).unwrap_or_else(|e| panic!("render {rel}: {}", error_chain(&e)))
}

fn is_hook(m: &Manifest) -> bool {
    m.object["metadata"]["annotations"]
        .get("helm.sh/hook")
        .is_some()
}

fn daemonset(objects: &[Manifest]) -> &Value {
    &find(objects, "DaemonSet", "node-monitor")
        .expect("the DaemonSet")
        .object
}

fn container(objects: &[Manifest]) -> &Value {
    &daemonset(objects)["spec"]["template"]["spec"]["containers"][0]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// An object without what only Helm adds (its release labels, the config checksum, the default
/// pull policy), with ConfigMap data parsed, so that formatting does not count.
fn normalized(m: &Manifest) -> Value {
    let mut o = m.object.clone();
    if let Some(labels) = o["metadata"]
        .get_mut("labels")
        .and_then(Value::as_object_mut)
    {
        for k in [
            "app.kubernetes.io/instance",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/part-of",
            "helm.sh/chart",
        ] {
            labels.remove(k);
        }
        if labels.is_empty() {
            o["metadata"]
                .as_object_mut()
                .map(|meta| meta.remove("labels"));
        }
    }
    if let Some(tmpl) = o.pointer_mut("/spec/template/metadata")
        && let Some(ann) = tmpl.get_mut("annotations").and_then(Value::as_object_mut)
    {
        ann.remove("checksum/config");
        if ann.is_empty() {
            tmpl.as_object_mut().map(|t| t.remove("annotations"));
        }
    }
    if let Some(containers) = o
        .pointer_mut("/spec/template/spec/containers")
        .and_then(Value::as_array_mut)
    {
        for c in containers {
            c.as_object_mut().map(|c| c.remove("imagePullPolicy"));
        }
    }
    if m.kind() == "ConfigMap"
        && let Some(data) = o.get_mut("data").and_then(Value::as_object_mut)
    {
        for v in data.values_mut() {
            let text = v.as_str().unwrap_or_default().to_owned();
            *v = serde_norway::from_str(&text).unwrap_or(Value::String(text));
        }
    }
    o
}

fn by_name(objects: &[Manifest]) -> BTreeMap<(String, String), Value> {
    objects
        .iter()
        .filter(|m| !is_hook(m) && m.kind() != "Namespace")
        .map(|m| ((m.kind().to_owned(), m.name().to_owned()), normalized(m)))
        .collect()
}

#[test]
fn helm_lint_passes_with_defaults_and_every_toggle() {
    let chart = helm::chart_dir();
    let chart = chart.to_string_lossy();
    let (out, _) =
        helm::run(&["lint", "--strict", &chart]).unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
    let mut args = vec!["lint", "--strict", &*chart];
    for s in ALL_ON {
        args.extend(["--set", s]);
    }
    let (out, _) = helm::run(&args).unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    assert!(out.contains("0 chart(s) failed"), "{out}");
}

/// For each Kustomize variant, the chart with the matching values renders the same objects, field
/// for field (ConfigMap data compared as parsed YAML): one set of manifests, two ways to install.
#[test]
fn chart_renders_what_kustomize_renders() {
    let cases: [(&str, &[&str]); 5] = [
        ("base", &[]),
        ("overlays/shutdown", &["shutdown.enabled=true"]),
        ("overlays/escalate", &["escalate.enabled=true"]),
        (
            "overlays/shutdown-escalate",
            &["shutdown.enabled=true", "escalate.enabled=true"],
        ),
        ("overlays/crio", &["runtime=crio"]),
    ];
    for (rel, set) in cases {
        let chart = by_name(&template(set));
        let kustomize = by_name(&kustomized(rel));
        let chart_keys: Vec<_> = chart.keys().collect();
        let kustomize_keys: Vec<_> = kustomize.keys().collect();
        assert_eq!(chart_keys, kustomize_keys, "{rel} vs {set:?}: the objects");
        for (key, want) in &kustomize {
            assert_eq!(&chart[key], want, "{rel} vs {set:?}: {key:?} differs");
        }
    }
}

/// The chart's alerts and dashboard are deploy/'s files themselves (links under files/ that helm
/// follows), so they cannot drift from the ones promtool and the dashboard tests check.
#[test]
fn alerts_and_dashboard_come_from_the_shipped_files() {
    let deploy = manifests::deploy_dir();
    let files = helm::chart_dir().join("files");
    for (link, target) in [
        (
            "node-monitor-rules.yaml",
            "prometheus/node-monitor-rules.yaml",
        ),
        (
            "node-monitor-dashboard.json",
            "grafana/node-monitor-dashboard.json",
        ),
        ("kustomize", "kustomize"),
        ("remediate", "remediate"),
    ] {
        let p = files.join(link);
        assert!(
            std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()),
            "{} must be a link into deploy/, not a copy",
            p.display()
        );
        assert_eq!(
            std::fs::canonicalize(&p).expect("resolve link"),
            std::fs::canonicalize(deploy.join(target)).expect("resolve target"),
            "{link}"
        );
    }
    let objects = template(&["prometheusRule.enabled=true", "dashboard.enabled=true"]);
    let shipped = manifests::read_objects(&deploy.join("prometheus/node-monitor-rules.yaml"))
        .expect("rules file");
    let rule = find(&objects, "PrometheusRule", "node-monitor").expect("PrometheusRule");
    assert_eq!(rule.object["spec"], shipped[0].object["spec"]);
    let dashboard = find(&objects, "ConfigMap", "node-monitor-dashboard").expect("dashboard");
    assert_eq!(
        dashboard.object["metadata"]["labels"]["grafana_dashboard"],
        "1"
    );
    let json_text = std::fs::read_to_string(deploy.join("grafana/node-monitor-dashboard.json"))
        .expect("dashboard file");
    assert_eq!(
        dashboard.object["data"]["node-monitor-dashboard.json"],
        Value::String(json_text)
    );
}

/// What each toggle adds, and that the defaults add none of it.
#[test]
fn toggles_change_what_they_name() {
    let default = template(&[]);
    let all = template(&ALL_ON);
    let has = |objects: &[Manifest], kind: &str, name: &str| find(objects, kind, name).is_some();
    for (kind, name) in [
        ("Namespace", "node-monitor"),
        ("ServiceMonitor", "node-monitor"),
        ("ServiceMonitor", "node-monitor-remediate"),
        ("PrometheusRule", "node-monitor"),
        ("PrometheusRule", "node-monitor-remediate"),
        ("ConfigMap", "node-monitor-dashboard"),
        ("Deployment", "node-monitor-remediate"),
        ("CustomResourceDefinition", "nodefences.node-monitor.io"),
        ("ClusterRole", "node-monitor-shutdown"),
        ("ClusterRole", "node-monitor-escalate"),
    ] {
        assert!(!has(&default, kind, name), "default renders {kind} {name}");
        assert!(has(&all, kind, name), "all toggles: no {kind} {name}");
    }
    // API Priority and Fairness: on by default, off when asked.
    let no_apf = template(&["flowControl.enabled=false"]);
    for (kind, name) in [
        ("PriorityLevelConfiguration", "node-monitor-agents"),
        ("PriorityLevelConfiguration", "node-monitor-reviews"),
        ("FlowSchema", "node-monitor-agents"),
        ("FlowSchema", "node-monitor-reviews"),
    ] {
        assert!(has(&default, kind, name), "default lacks {kind} {name}");
        assert!(
            !has(&no_apf, kind, name),
            "flowControl off renders {kind} {name}"
        );
    }
    // The NodeFence CRD survives an uninstall (its objects are the fencing state).
    assert_eq!(
        find(
            &all,
            "CustomResourceDefinition",
            "nodefences.node-monitor.io"
        )
        .expect("crd")
        .object["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
}

/// The shutdown toggle's capabilities and bus, and the runtime and cgroup driver toggles, in the
/// DaemonSet.
#[test]
fn shutdown_runtime_and_cgroup_driver_toggles_change_the_daemonset() {
    let default = template(&[]);
    let all = template(&ALL_ON);
    // Shutdown: the capabilities, the bus and the drop-in directory.
    let caps = |o: &[Manifest]| strings(&container(o)["securityContext"]["capabilities"]["add"]);
    // CAP_SYS_NICE: the last gasp's thread at SCHED_FIFO priority, only where shutdown is on.
    for cap in ["SYS_BOOT", "KILL", "SYS_NICE"] {
        assert!(
            !caps(&default).contains(&cap.to_owned()),
            "default adds {cap}"
        );
        assert!(caps(&all).contains(&cap.to_owned()), "shutdown lacks {cap}");
    }
    let mounts = |o: &[Manifest]| -> Vec<String> {
        container(o)["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| m["mountPath"].as_str().map(str::to_owned))
            .collect()
    };
    assert!(!mounts(&default).contains(&"/run/dbus/system_bus_socket".to_owned()));
    assert!(mounts(&all).contains(&"/run/dbus/system_bus_socket".to_owned()));
    // Runtime and cgroup driver.
    assert!(mounts(&default).contains(&"/var/lib/containerd".to_owned()));
    assert!(mounts(&all).contains(&"/var/lib/containers".to_owned()));
    assert!(!mounts(&all).contains(&"/var/lib/containerd".to_owned()));
    let args = |o: &[Manifest]| strings(&container(o)["args"]);
    assert!(
        !args(&default)
            .iter()
            .any(|a| a.starts_with("--kubepods-cgroup"))
    );
    assert!(args(&all).contains(&"--kubepods-cgroup=kubepods.slice".to_owned()));
    assert!(
        args(&template(&["cgroupDriver=cgroupfs"]))
            .contains(&"--kubepods-cgroup=kubepods".to_owned())
    );
}

/// The host paths and the state directory mounted where the values name them; the config
/// checksum follows the configuration only.
#[test]
fn host_paths_and_the_config_checksum_follow_their_values() {
    let default = template(&[]);
    let mounts = |o: &[Manifest]| -> Vec<String> {
        container(o)["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .filter_map(|m| m["mountPath"].as_str().map(str::to_owned))
            .collect()
    };
    let args = |o: &[Manifest]| strings(&container(o)["args"]);
    // Host paths: the kubelet root is mounted where it is and named to the agent.
    let custom = template(&[
        "hostPaths.kubeletRoot=/data/kubelet",
        "hostPaths.podLogs=/data/pod-logs",
        "hostPaths.stateDir=/data/node-monitor",
    ]);
    assert!(args(&custom).contains(&"--kubelet-root=/data/kubelet".to_owned()));
    // The state directory: mounted read-write where `nodeMonitor.stateDir` defaults, from the
    // host directory the value names.
    assert!(mounts(&default).contains(&node_monitor_core::config::DEFAULT_STATE_DIR.to_owned()));
    let volumes = &daemonset(&custom)["spec"]["template"]["spec"]["volumes"];
    let host = |name: &str| {
        volumes
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == name))
            .map(|v| v["hostPath"]["path"].clone())
    };
    assert_eq!(host("kubelet"), Some(json!("/data/kubelet")));
    assert_eq!(host("pod-logs"), Some(json!("/data/pod-logs")));
    assert_eq!(host("state"), Some(json!("/data/node-monitor")));
    assert!(mounts(&custom).contains(&"/data/kubelet".to_owned()));
    // The config checksum follows the configuration and nothing else.
    let checksum = |o: &[Manifest]| {
        daemonset(o)["spec"]["template"]["metadata"]["annotations"]["checksum/config"].clone()
    };
    assert!(checksum(&default).is_string());
    assert_eq!(checksum(&default), checksum(&template(&["logFormat=text"])));
    assert_ne!(
        checksum(&default),
        checksum(&template(&["config.nodeMonitor.dryRun=true"]))
    );
    assert_ne!(
        checksum(&default),
        checksum(&template(&["escalate.enabled=true"]))
    );
}

/// A pinned image digest, the test hook and the cleanup hook.
#[test]
fn the_image_digest_and_the_hooks() {
    let default = template(&[]);
    // A pinned digest wins over the tag, in the DaemonSet and the hook.
    let digest = format!("sha256:{}", "a".repeat(64));
    let pinned = template(&[&format!("image.digest={digest}")]);
    let want = format!("ghcr.io/node-monitor/node-monitor@{digest}");
    assert_eq!(container(&pinned)["image"], want.as_str());
    let job = find(&pinned, "Job", "node-monitor-cleanup").expect("cleanup job");
    assert_eq!(
        job.object["spec"]["template"]["spec"]["containers"][0]["image"],
        want.as_str()
    );
    // The test hook checks the release's configuration with the release's image.
    let test_pod = find(&default, "Pod", "node-monitor-test-config").expect("helm test pod");
    assert_eq!(
        test_pod.object["metadata"]["annotations"]["helm.sh/hook"],
        "test"
    );
    assert_eq!(
        strings(&test_pod.object["spec"]["containers"][0]["args"])[..3],
        [
            "check-config",
            "--config=/etc/node-monitor/config.yaml",
            "--config=/etc/node-monitor.d"
        ]
    );
    // No cleanup hook when it is turned off.
    assert!(
        find(
            &template(&["cleanup.enabled=false"]),
            "Job",
            "node-monitor-cleanup"
        )
        .is_none()
    );
    // The hook runs on a cluster whose nodes are all tainted, never on a node that is not ready.
    let job = find(&default, "Job", "node-monitor-cleanup").expect("cleanup job");
    let tolerations = job.object["spec"]["template"]["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let effects: Vec<&str> = tolerations
        .iter()
        .filter(|t| t["operator"] == "Exists" && t.get("key").is_none())
        .filter_map(|t| t["effect"].as_str())
        .collect();
    assert_eq!(
        effects,
        ["NoSchedule", "PreferNoSchedule"],
        "{tolerations:?}"
    );
    // A namespace the chart renders is kept on uninstall while the hook must run in it.
    let ns = |set: &[&str]| {
        find(&template(set), "Namespace", helm::NAMESPACE)
            .map(|m| m.object["metadata"]["annotations"]["helm.sh/resource-policy"].clone())
    };
    assert_eq!(ns(&["createNamespace=true"]), Some(json!("keep")));
    assert_eq!(
        ns(&["createNamespace=true", "cleanup.enabled=false"]),
        Some(Value::Null)
    );
}

/// The schema refuses a value the chart cannot honour, naming it.
#[test]
fn schema_refuses_unknown_choices() {
    for (set, field) in [
        ("runtime=docker", "/runtime"),
        ("cgroupDriver=v1", "/cgroupDriver"),
        ("shutdown.enable=true", "enable"),
        ("image.digest=latest", "/image/digest"),
        ("distribution=minikube", "/distribution"),
        ("extraArgs[0]=run", "/extraArgs/0"),
        ("kubepodsCgroup=../x", "/kubepodsCgroup"),
        (
            "hostPaths.kubeletConfig[0].path=relative",
            "/hostPaths/kubeletConfig/0/path",
        ),
        ("logLevel=debug;rm", "/logLevel"),
        ("podLabels.app\\.kubernetes\\.io/name=other", "/podLabels"),
        ("extraVolumeMounts[0].name=x", "/extraVolumeMounts/0"),
    ] {
        let e = helm::template(&[set]).expect_err(set);
        let shown = error_chain(&e);
        assert!(shown.contains(field), "{set}: {shown}");
    }
}

/// Every toggle on, applied server-side with strict field validation (the prometheus-operator
/// CRDs installed first), hooks and test pod included; then the post-delete hook's own
/// ServiceAccount runs `node-monitor cleanup --all-nodes` and every node loses node-monitor's
/// marks, while the account may do nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_applies_server_side_and_its_cleanup_hook_cleans_every_node() {
    node_monitor_tests::cgroup::require_root("the control-plane tier");
    let node_monitor = node_monitor_tests::e2e::binary("node-monitor");
    let objects = template(&ALL_ON);
    let cp = ControlPlane::start(ControlPlaneOptions {
        controller_manager: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane: {}", error_chain(&e)));
    let admin = cp.client();
    manifests::install_monitoring_crds(&admin)
        .await
        .unwrap_or_else(|e| panic!("CRDs: {}", error_chain(&e)));
    // The chart's own CRD first, as helm installs CRDs before what uses them.
    let (crds, rest): (Vec<Manifest>, Vec<Manifest>) = objects
        .into_iter()
        .partition(|m| m.kind() == "CustomResourceDefinition");
    manifests::install_crds(&admin, &crds)
        .await
        .unwrap_or_else(|e| panic!("chart CRDs: {}", error_chain(&e)));
    // The `helm test` pod runs as the namespace's `default` ServiceAccount, which the
    // controller manager (not started here) creates in a real cluster.
    let (pods, rest): (Vec<Manifest>, Vec<Manifest>) =
        rest.into_iter().partition(|m| m.kind() == "Pod");
    let applied = manifests::apply(&admin, &rest)
        .await
        .unwrap_or_else(|e| panic!("apply the chart: {}", error_chain(&e)));
    assert_eq!(applied.len(), rest.len());
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), helm::NAMESPACE)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("sa"),
        )
        .await
        .expect("the default ServiceAccount");
    manifests::apply(&admin, &pods)
        .await
        .unwrap_or_else(|e| panic!("apply the helm test pod: {}", error_chain(&e)));

    let nodes: Api<Node> = Api::all(admin.clone());
    create_marked_nodes(&nodes).await;

    // The hook's account: it may clean nodes and nothing else.
    let kubeconfig = cp
        .service_account_kubeconfig(helm::NAMESPACE, "node-monitor-cleanup")
        .await
        .unwrap_or_else(|e| panic!("cleanup account: {}", error_chain(&e)));
    let hook = cp
        .service_account_client(helm::NAMESPACE, "node-monitor-cleanup")
        .await
        .unwrap_or_else(|e| panic!("cleanup client: {}", error_chain(&e)));
    assert!(
        Api::<Secret>::namespaced(hook.clone(), helm::NAMESPACE)
            .list(&Default::default())
            .await
            .is_err(),
        "the cleanup account reads secrets"
    );
    assert!(
        Api::<Node>::all(hook.clone())
            .delete("worker-1", &Default::default())
            .await
            .is_err(),
        "the cleanup account deletes nodes"
    );

    let job = find(&rest, "Job", "node-monitor-cleanup").expect("the post-delete Job");
    assert_eq!(
        job.object["metadata"]["annotations"]["helm.sh/hook"],
        "post-delete"
    );
    let mut args = strings(&job.object["spec"]["template"]["spec"]["containers"][0]["args"]);
    assert_eq!(args.first().map(String::as_str), Some("cleanup"));
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    let out = Command::new(&node_monitor)
        .args(&args)
        .output()
        .expect("run node-monitor cleanup");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{args:?}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["worker-1", "worker-2"] {
        assert!(
            stdout.contains(&format!(
                "node {name}: remove taint node-monitor.io/memory-pressure"
            )),
            "{stdout}"
        );
        let n = nodes.get(name).await.expect("node");
        let taints: Vec<String> = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        assert!(
            taints.contains(&"operator/dedicated".to_owned())
                && !taints.iter().any(|t| t.starts_with("node-monitor.io/")),
            "{name}: {taints:?}"
        );
        let conditions: Vec<String> = n
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.type_)
            .filter(|t| t.starts_with("NodeMonitor"))
            .collect();
        assert!(conditions.is_empty(), "{name}: {conditions:?}");
        let annotations = n.metadata.annotations.unwrap_or_default();
        assert!(
            !annotations.contains_key("node-monitor.io/last-gasp"),
            "{name}"
        );
        assert_eq!(
            annotations.get("operator/keep").map(String::as_str),
            Some("yes")
        );
    }
}

/// Two nodes an agent left marked (a taint, a condition, an annotation), beside an operator's
/// own taint and annotation.
async fn create_marked_nodes(nodes: &Api<Node>) {
    for name in ["worker-1", "worker-2"] {
        let mut annotations = BTreeMap::new();
        annotations.insert("node-monitor.io/last-gasp".to_owned(), "{}".to_owned());
        annotations.insert("operator/keep".to_owned(), "yes".to_owned());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                taints: Some(vec![
                    k8s_openapi::api::core::v1::Taint {
                        key: "node-monitor.io/memory-pressure".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                    k8s_openapi::api::core::v1::Taint {
                        key: "operator/dedicated".into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        nodes
            .create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("create node {name}: {e}"));
        nodes
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Strategic(json!({"status": {"conditions": [
                    {"type": "NodeMonitorMemoryPressure", "status": "True", "reason": "Test", "message": "left"}
                ]}})),
            )
            .await
            .unwrap_or_else(|e| panic!("condition on {name}: {e}"));
    }
}

/// `hostPaths.containerFs`: the writable-layer filesystem is named to the agent
/// (`--container-fs`) and mounted read-only at its own path, unless the runtime's directory,
/// mounted already, holds it; off by default; a relative path is refused.
#[test]
fn container_fs_is_named_to_the_agent_and_mounted_where_it_is() {
    let args = |o: &[Manifest]| strings(&container(o)["args"]);
    let mount = |o: &[Manifest], name: &str| {
        container(o)["volumeMounts"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["name"] == name).cloned())
    };
    let volume = |o: &[Manifest], name: &str| {
        daemonset(o)["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == name).cloned())
    };
    let default = template(&[]);
    assert!(
        !args(&default)
            .iter()
            .any(|a| a.starts_with("--container-fs")),
        "{:?}",
        args(&default)
    );
    assert_eq!(mount(&default, "container-fs"), None);
    assert_eq!(volume(&default, "container-fs"), None);

    let apart = template(&["hostPaths.containerFs=/mnt/layers"]);
    assert!(args(&apart).contains(&"--container-fs=/mnt/layers".to_owned()));
    assert_eq!(
        mount(&apart, "container-fs"),
        Some(json!({"name": "container-fs", "mountPath": "/mnt/layers", "readOnly": true}))
    );
    assert_eq!(
        volume(&apart, "container-fs"),
        Some(
            json!({"name": "container-fs", "hostPath": {"path": "/mnt/layers", "type": "Directory"}})
        )
    );

    // CRI-O's graph root with images in an imagestore: under the runtime's directory.
    let crio = template(&[
        "runtime=crio",
        "hostPaths.containerFs=/var/lib/containers/storage",
    ]);
    assert!(args(&crio).contains(&"--container-fs=/var/lib/containers/storage".to_owned()));
    assert_eq!(mount(&crio, "container-fs"), None);
    assert_eq!(volume(&crio, "container-fs"), None);
    // A sibling that only starts with the runtime's directory's name is not under it.
    let sibling = template(&[
        "runtime=crio",
        "hostPaths.containerFs=/var/lib/containers-layers",
    ]);
    assert!(mount(&sibling, "container-fs").is_some());

    let e = helm::template(&["hostPaths.containerFs=layers"]).expect_err("a relative path");
    assert!(
        error_chain(&e).contains("/hostPaths/containerFs"),
        "{}",
        error_chain(&e)
    );
}

/// Volume name → (host path, hostPath type).
type Mounts<'a> = Vec<(&'a str, (String, String))>;

/// The runtime-state and kubelet-config volumes of the DaemonSet rendered with `set`, by name:
/// (host path, hostPath type); each mounted read-only at its host path.
fn preset_mounts(set: &[&str]) -> BTreeMap<String, (String, String)> {
    let objects = template(set);
    let ds = daemonset(&objects);
    let spec = &ds["spec"]["template"]["spec"];
    let volumes: BTreeMap<String, (String, String)> = spec["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| {
            let hp = v.get("hostPath")?;
            Some((
                v["name"].as_str()?.to_owned(),
                (
                    hp["path"].as_str()?.to_owned(),
                    hp["type"].as_str().unwrap_or_default().to_owned(),
                ),
            ))
        })
        .collect();
    for m in spec["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
    {
        let name = m["name"].as_str().expect("name");
        if name == "runtime-state" || name.starts_with("kubelet-config-") {
            assert_eq!(m["readOnly"], json!(true), "{set:?}: {name} read-only");
            assert_eq!(
                m["mountPath"].as_str(),
                volumes.get(name).map(|(p, _)| p.as_str()),
                "{set:?}: {name} at its host path"
            );
        }
    }
    volumes
        .into_iter()
        .filter(|(n, _)| n == "runtime-state" || n.starts_with("kubelet-config-"))
        .collect()
}

/// Each distribution preset mounts its runtime's state and its kubelet's configuration, read-only,
/// and changes nothing else of the DaemonSet's.
#[test]
fn distribution_presets_mount_their_layouts() {
    let one = |p: &str, t: &str| (p.to_owned(), t.to_owned());
    let cases: Vec<(&[&str], Mounts<'_>)> = vec![
        (
            &[],
            vec![("runtime-state", one("/var/lib/containerd", "Directory"))],
        ),
        (
            &["distribution=kind"],
            vec![("runtime-state", one("/var/lib/containerd", "Directory"))],
        ),
        (
            &["distribution=k3s"],
            vec![
                (
                    "kubelet-config-0",
                    one(
                        "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d",
                        "DirectoryOrCreate",
                    ),
                ),
                (
                    "runtime-state",
                    one("/var/lib/rancher/k3s/agent/containerd", "Directory"),
                ),
            ],
        ),
        (
            &["distribution=rke2"],
            vec![
                (
                    "kubelet-config-0",
                    one(
                        "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d",
                        "DirectoryOrCreate",
                    ),
                ),
                (
                    "runtime-state",
                    one("/var/lib/rancher/rke2/agent/containerd", "Directory"),
                ),
            ],
        ),
        (
            &["distribution=eks"],
            vec![
                (
                    "kubelet-config-0",
                    one("/etc/kubernetes/kubelet", "DirectoryOrCreate"),
                ),
                ("runtime-state", one("/var/lib/containerd", "Directory")),
            ],
        ),
        (
            &["distribution=gke"],
            vec![
                (
                    "kubelet-config-0",
                    one("/home/kubernetes/kubelet-config.yaml", "File"),
                ),
                ("runtime-state", one("/var/lib/containerd", "Directory")),
            ],
        ),
        (
            &[
                "distribution=aks",
                "hostPaths.runtimeState=/data/containerd",
                "hostPaths.kubeletConfig[0].path=/etc/default/kubeletconfig.json",
                "hostPaths.kubeletConfig[0].type=File",
            ],
            vec![
                (
                    "kubelet-config-0",
                    one("/etc/default/kubeletconfig.json", "File"),
                ),
                ("runtime-state", one("/data/containerd", "Directory")),
            ],
        ),
    ];
    for (set, want) in cases {
        let want: BTreeMap<String, (String, String)> =
            want.into_iter().map(|(n, v)| (n.to_owned(), v)).collect();
        assert_eq!(preset_mounts(set), want, "{set:?}");
    }
    // Only gke renders the quota by itself.
    assert!(
        find(
            &template(&["distribution=gke"]),
            "ResourceQuota",
            "node-monitor-critical-pods"
        )
        .is_some()
    );
    assert!(
        find(
            &template(&["distribution=eks"]),
            "ResourceQuota",
            "node-monitor-critical-pods"
        )
        .is_none()
    );
}

/// The values operators set on any DaemonSet reach the agent's pods: its log filter, pod labels
/// (not the selector), affinity, extra volumes and their mounts; an umbrella chart's `global`
/// is accepted; and none of them renders anything at its default.
#[test]
fn operator_values_reach_the_agents_pods() {
    let default = template(&[]);
    let set = template(&[
        "logLevel=info\\,node_monitor::agent=debug",
        "podLabels.team=sre",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
        "extraVolumes[0].name=extra",
        "extraVolumes[0].hostPath.path=/opt/extra",
        "extraVolumeMounts[0].name=extra",
        "extraVolumeMounts[0].mountPath=/opt/extra",
        "extraVolumeMounts[0].readOnly=true",
        "global.imageRegistry=registry.example",
    ]);
    let ds = daemonset(&set);
    let pod = &ds["spec"]["template"];
    assert_eq!(pod["metadata"]["labels"]["team"], "sre");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        json!({"app.kubernetes.io/name": "node-monitor"}),
        "the selector stays the chart's"
    );
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "pool"
    );
    let env = container(&set)["env"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        env.iter()
            .any(|e| e["name"] == "RUST_LOG" && e["value"] == "info,node_monitor::agent=debug"),
        "{env:?}"
    );
    assert!(
        pod["spec"]["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == "extra" && v["hostPath"]["path"] == "/opt/extra")
    );
    assert!(
        container(&set)["volumeMounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["name"] == "extra"
                && m["mountPath"] == "/opt/extra"
                && m["readOnly"] == true)
    );
    // At their defaults: nothing of them.
    let pod = &daemonset(&default)["spec"]["template"];
    assert!(pod["spec"].get("affinity").is_none());
    assert_eq!(
        pod["metadata"]["labels"],
        json!({"app.kubernetes.io/name": "node-monitor"})
    );
    assert!(
        !container(&default)["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "RUST_LOG")
    );
}

/// extraArgs and extraEnv reach the agent's container; kubepodsCgroup wins over cgroupDriver.
#[test]
fn extra_args_and_env_reach_the_agent() {
    let objects = template(&[
        "extraArgs[0]=--no-mlock",
        "extraEnv[0].name=RUST_LOG",
        "extraEnv[0].value=debug",
        "cgroupDriver=systemd",
        "kubepodsCgroup=kubelet.slice/kubelet-kubepods.slice",
    ]);
    let c = container(&objects);
    let args = strings(&c["args"]);
    assert!(args.contains(&"--no-mlock".to_owned()), "{args:?}");
    assert!(
        args.contains(&"--kubepods-cgroup=kubelet.slice/kubelet-kubepods.slice".to_owned())
            && !args.contains(&"--kubepods-cgroup=kubepods.slice".to_owned()),
        "{args:?}"
    );
    assert!(
        c["env"]
            .as_array()
            .expect("env")
            .iter()
            .any(|e| e["name"] == "RUST_LOG" && e["value"] == "debug"),
        "{}",
        c["env"]
    );
}

/// GKE's API server admits pods of the critical priority classes outside kube-system only in a
/// namespace with a ResourceQuota scoped to the class (the ResourceQuota admission plugin's
/// `limitedResources`, as GKE configures it). The agent's pod (the chart's DaemonSet pod
/// template, created as the DaemonSet controller creates it) is refused without the chart's
/// quota and admitted with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_class_quota_admits_the_agent() {
    use k8s_openapi::api::core::v1::{Namespace, Pod, ResourceQuota};
    node_monitor_tests::cgroup::require_root("the control-plane tier");
    let work = tempfile::tempdir().expect("tempdir");
    let admission = work.path().join("admission.yaml");
    std::fs::write(
        &admission,
        "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n\
         - name: ResourceQuota\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    \
         kind: ResourceQuotaConfiguration\n    limitedResources:\n    - resource: pods\n      \
         matchScopes:\n      - scopeName: PriorityClass\n        operator: In\n        \
         values: [system-node-critical, system-cluster-critical]\n",
    )
    .expect("admission configuration");
    let cp = ControlPlane::start(
        ControlPlaneOptions {
            controllers: node_monitor_tests::control_plane::DEFAULT_CONTROLLERS
                .iter()
                .map(|c| (*c).to_owned())
                .chain(["resourcequota-controller".to_owned()])
                .collect(),
            ..ControlPlaneOptions::default()
        }
        .apiserver_arg(format!(
            "--admission-control-config-file={}",
            admission.display()
        )),
    )
    .await
    .unwrap_or_else(|e| panic!("control plane: {}", error_chain(&e)));
    let admin = cp.client();
    let objects = template(&["distribution=gke"]);
    let ns = helm::NAMESPACE;
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
        )
        .await
        .expect("namespace");
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "node-monitor"}})).expect("sa"),
        )
        .await
        .expect("the agent's ServiceAccount");
    // The DaemonSet's pod as its controller would create it.
    let ds = daemonset(&objects);
    let mut pod_json = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "node-monitor-agent", "namespace": ns},
        "spec": ds["spec"]["template"]["spec"].clone(),
    });
    pod_json["spec"]["nodeName"] = json!("worker-1");
    let pod: Pod = serde_json::from_value(pod_json).expect("pod");
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let refused = pods
        .create(&PostParams::default(), &pod)
        .await
        .expect_err("no quota: refused");
    assert!(
        refused
            .to_string()
            .contains("insufficient quota to match these scopes"),
        "GKE's refusal: {refused}"
    );
    let quota = find(&objects, "ResourceQuota", "node-monitor-critical-pods")
        .expect("the chart's quota with distribution=gke");
    manifests::apply(&admin, std::slice::from_ref(quota))
        .await
        .unwrap_or_else(|e| panic!("apply the quota: {}", error_chain(&e)));
    // The quota admits pods once its controller has written its status.
    let quotas: Api<ResourceQuota> = Api::namespaced(admin.clone(), ns);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let q = quotas
            .get("node-monitor-critical-pods")
            .await
            .expect("quota");
        if q.status.as_ref().and_then(|s| s.hard.as_ref()).is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the quota controller never wrote the quota's status"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("the quota admits the agent's pod: {e}"));
}

/// A real `helm install` and `helm uninstall` against a real API server. No kubelet or Job
/// controller runs here, so the post-delete cleanup Job never completes: uninstall deletes the
/// release's objects, waits for the hook until its timeout and fails. That is the failure path
/// an operator meets when the Job fails or cannot be scheduled: the hook's cluster-wide
/// node-patch account (ServiceAccount, ClusterRole, ClusterRoleBinding) must not be left behind,
/// the failed Job stays for its logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_uninstall_leaves_no_cleanup_account_when_its_job_fails() {
    use k8s_openapi::api::{
        apps::v1::DaemonSet,
        batch::v1::Job,
        core::v1::ServiceAccount,
        rbac::v1::{ClusterRole, ClusterRoleBinding},
    };
    node_monitor_tests::cgroup::require_root("the control-plane tier");
    let cp = ControlPlane::start(ControlPlaneOptions {
        controller_manager: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane: {}", error_chain(&e)));
    let kubeconfig = cp.kubeconfig_path().to_string_lossy().into_owned();
    let chart = helm::chart_dir().to_string_lossy().into_owned();
    let base = [
        "--kubeconfig",
        kubeconfig.as_str(),
        "--namespace",
        helm::NAMESPACE,
    ];
    let mut install = vec!["install", "node-monitor", chart.as_str()];
    install.extend(base);
    install.extend(["--create-namespace", "--timeout", "60s"]);
    helm::run(&install).unwrap_or_else(|e| panic!("helm install: {}", error_chain(&e)));
    let admin = cp.client();
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), helm::NAMESPACE);
    assert!(
        daemonsets
            .get_opt("node-monitor")
            .await
            .expect("get")
            .is_some(),
        "installed"
    );
    let mut uninstall = vec!["uninstall", "node-monitor"];
    uninstall.extend(base);
    uninstall.extend(["--timeout", "20s"]);
    let failed = helm::run(&uninstall).expect_err("the hook's Job cannot complete here");
    let shown = error_chain(&failed);
    // helm reports the hook's wait: the Job never completes without a Job controller.
    assert!(
        shown.contains("timed out waiting for the condition"),
        "{shown}"
    );
    // The release's objects are gone; the hook's account and roles too.
    assert!(
        daemonsets
            .get_opt("node-monitor")
            .await
            .expect("get")
            .is_none()
    );
    let gone_or_going = |deletion: Option<bool>| deletion.is_none_or(|terminating| terminating);
    let sa = Api::<ServiceAccount>::namespaced(admin.clone(), helm::NAMESPACE)
        .get_opt("node-monitor-cleanup")
        .await
        .expect("get");
    assert!(
        gone_or_going(sa.map(|o| o.metadata.deletion_timestamp.is_some())),
        "the cleanup ServiceAccount was left behind"
    );
    let role = Api::<ClusterRole>::all(admin.clone())
        .get_opt("node-monitor-cleanup")
        .await
        .expect("get");
    assert!(
        gone_or_going(role.map(|o| o.metadata.deletion_timestamp.is_some())),
        "the cleanup ClusterRole (patch every node) was left behind"
    );
    let binding = Api::<ClusterRoleBinding>::all(admin.clone())
        .get_opt("node-monitor-cleanup")
        .await
        .expect("get");
    assert!(
        gone_or_going(binding.map(|o| o.metadata.deletion_timestamp.is_some())),
        "the cleanup ClusterRoleBinding was left behind"
    );
    // The failed Job stays for its logs.
    assert!(
        Api::<Job>::namespaced(admin.clone(), helm::NAMESPACE)
            .get_opt("node-monitor-cleanup")
            .await
            .expect("get")
            .is_some(),
        "the failed Job stays for its logs"
    );
}
