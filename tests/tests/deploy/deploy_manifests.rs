//! The kustomizations in deploy/kustomize, rendered (no cluster needed): the configuration each
//! ships is accepted by the agent's own parsers, the DaemonSet's command line starts the agent up
//! to its first API call, and the shutdown overlay carries exactly what the shutdown manager
//! needs beyond the base (the logind drop-in directory, read-write, and the shutdown fields).
//! RBAC and admission are checked against a real API server in deploy_rbac.rs.
use std::process::Command;

use node_monitor::shutdown::logind::DROPIN_DIR;

use node_monitor_core::{
    agent_config::{AgentConfig, load_agent_config_sources},
    config::{ConfigSource, EvictionOverrides, PdbPolicy},
};
use node_monitor_tests::manifests::{Manifest, find, kustomize_dir, render};
use serde_json::Value;

const KUSTOMIZATIONS: [&str; 5] = [
    "base",
    "overlays/escalate",
    "overlays/shutdown",
    "overlays/shutdown-escalate",
    "overlays/crio",
];

fn rendered(rel: &str) -> Vec<Manifest> {
    render(&kustomize_dir(rel)).unwrap_or_else(|e| panic!("render {rel}: {e}"))
}

/// The agent's configuration documents as the DaemonSet passes them: config.yaml of
/// node-monitor-config, then the drop-ins of node-monitor-config-d in name order.
fn config_documents(objects: &[Manifest]) -> Vec<(String, String)> {
    let base = find(objects, "ConfigMap", "node-monitor-config")
        .and_then(|m| m.object["data"]["config.yaml"].as_str())
        .expect("ConfigMap node-monitor-config with data.config.yaml")
        .to_owned();
    let mut out = vec![("config.yaml".to_owned(), base)];
    let drop_ins = find(objects, "ConfigMap", "node-monitor-config-d")
        .and_then(|m| m.object["data"].as_object())
        .expect("ConfigMap node-monitor-config-d with data");
    let mut keys: Vec<&String> = drop_ins.keys().collect();
    keys.sort();
    for k in keys {
        out.push((
            format!("node-monitor.d/{k}"),
            drop_ins[k].as_str().expect("a text value").to_owned(),
        ));
    }
    out
}

/// The configuration the agent loads from a rendered kustomization.
fn agent_config(rel: &str, objects: &[Manifest]) -> AgentConfig {
    let docs = config_documents(objects);
    let sources: Vec<ConfigSource<'_>> = docs
        .iter()
        .map(|(name, text)| ConfigSource { name, text })
        .collect();
    load_agent_config_sources(&sources, &EvictionOverrides::default())
        .unwrap_or_else(|e| panic!("{rel}: the configuration is rejected: {e}"))
}

fn container(objects: &[Manifest]) -> Value {
    find(objects, "DaemonSet", "node-monitor")
        .map(|m| m.object["spec"]["template"]["spec"]["containers"][0].clone())
        .expect("DaemonSet node-monitor with a container")
}

fn pod_spec(objects: &[Manifest]) -> Value {
    find(objects, "DaemonSet", "node-monitor")
        .map(|m| m.object["spec"]["template"]["spec"].clone())
        .expect("DaemonSet node-monitor")
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

/// The mount of the logind drop-in directory, if any: (read-only, hostPath).
fn dropin_mount(objects: &[Manifest]) -> Option<(bool, String)> {
    let c = container(objects);
    let spec = pod_spec(objects);
    let mount = c["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["mountPath"] == DROPIN_DIR)?
        .clone();
    let volume = spec["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])?
        .clone();
    Some((
        mount["readOnly"].as_bool().unwrap_or(false),
        volume["hostPath"]["path"].as_str()?.to_owned(),
    ))
}

#[test]
fn every_shipped_configuration_is_accepted_by_the_agent() {
    for rel in KUSTOMIZATIONS {
        let AgentConfig { eviction, shutdown } = agent_config(rel, &rendered(rel));
        assert!(!eviction.thresholds.is_empty(), "{rel}: no thresholds");
        assert!(
            shutdown.warnings.is_empty(),
            "{rel}: {:?}",
            shutdown.warnings
        );
        let escalate = rel.contains("escalate");
        assert_eq!(
            eviction.node_monitor.pdb_policy == PdbPolicy::Escalate,
            escalate,
            "{rel}"
        );
        // Only the shutdown component turns the shutdown manager on.
        let shutdown_on = rel.contains("shutdown");
        assert_eq!(shutdown.options.enabled, shutdown_on, "{rel}");
        assert_eq!(!shutdown.groups.is_empty(), shutdown_on, "{rel}");
    }
}

/// The components compose: each adds its own drop-in and leaves config.yaml as the base ships
/// it, so the shutdown and escalate components together carry both features' configuration and
/// the base's thresholds, with no hand-merged file.
#[test]
fn components_compose_without_merging_the_configuration() {
    let base = rendered("base");
    let both = rendered("overlays/shutdown-escalate");
    let docs = config_documents(&both);
    let names: Vec<&str> = docs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "config.yaml",
            "node-monitor.d/escalate.yaml",
            "node-monitor.d/shutdown.yaml"
        ]
    );
    assert_eq!(
        docs[0],
        config_documents(&base)[0],
        "config.yaml is the base's"
    );
    let c = agent_config("overlays/shutdown-escalate", &both);
    assert_eq!(c.eviction.node_monitor.pdb_policy, PdbPolicy::Escalate);
    assert!(c.shutdown.options.enabled);
    assert_eq!(
        c.eviction.thresholds,
        agent_config("base", &base).eviction.thresholds,
        "the base's thresholds stay"
    );
    // Both components' roles, the shutdown mounts and capabilities.
    for role in ["node-monitor-shutdown", "node-monitor-escalate"] {
        assert!(find(&both, "ClusterRole", role).is_some(), "{role}");
        assert!(find(&both, "ClusterRoleBinding", role).is_some(), "{role}");
    }
    assert_eq!(dropin_mount(&both), Some((false, DROPIN_DIR.to_owned())));
    // Applied in either order, the components give the same objects.
    let dir = tempfile::tempdir().expect("tempdir");
    // kustomize refuses an absolute root: the shipped tree, relative to the temporary one.
    let k = node_monitor_tests::manifests::relative_path(dir.path(), &kustomize_dir(""));
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!(
            "resources:\n  - {k}/base\ncomponents:\n  - {k}/components/escalate\n  - {k}/components/shutdown\n",
            k = k.display()
        ),
    )
    .expect("write kustomization");
    let swapped = render(dir.path()).expect("render swapped");
    let sorted = |objects: &[Manifest]| {
        let mut v: Vec<String> = objects.iter().map(|m| m.object.to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(sorted(&swapped), sorted(&both));
}

/// The DaemonSet runs on Linux nodes only, and mounts the container runtime's state read-only
/// from a host path that must exist: containerd's in the base, CRI-O's with the crio component,
/// never both, and never created on a host that lacks it (a created empty directory would be
/// taken for the runtime's image filesystem).
#[test]
fn daemonset_selects_linux_and_mounts_one_existing_runtime_directory() {
    let host_paths = |objects: &[Manifest]| -> Vec<(String, String, String)> {
        let spec = pod_spec(objects);
        let mounts = container(objects)["volumeMounts"].clone();
        spec["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .filter_map(|v| {
                let hp = v.get("hostPath")?;
                let mount = mounts.as_array()?.iter().find(|m| m["name"] == v["name"])?;
                Some((
                    hp["path"].as_str()?.to_owned(),
                    hp["type"].as_str().unwrap_or_default().to_owned(),
                    mount["mountPath"].as_str()?.to_owned(),
                ))
            })
            .collect()
    };
    for rel in KUSTOMIZATIONS {
        let objects = rendered(rel);
        assert_eq!(
            pod_spec(&objects)["nodeSelector"],
            serde_json::json!({"kubernetes.io/os": "linux"}),
            "{rel}"
        );
        let paths = host_paths(&objects);
        let runtime: Vec<&(String, String, String)> = paths
            .iter()
            .filter(|(p, _, _)| p.starts_with("/var/lib/container"))
            .collect();
        let want = if rel.contains("crio") {
            "/var/lib/containers"
        } else {
            "/var/lib/containerd"
        };
        assert_eq!(
            runtime,
            [&(want.to_owned(), "Directory".to_owned(), want.to_owned())],
            "{rel}: one runtime state directory, which must exist"
        );
        // The system bus only where shutdown is on.
        let bus = paths
            .iter()
            .any(|(p, _, _)| p == "/run/dbus/system_bus_socket");
        assert_eq!(bus, rel.contains("shutdown"), "{rel}");
    }
}

#[test]
fn shutdown_overlay_adds_what_the_shutdown_manager_needs() {
    let base = rendered("base");
    let overlay = rendered("overlays/shutdown");

    // The configuration: the kubelet's two-group form and the drop-in managed.
    let shutdown = agent_config("overlays/shutdown", &overlay).shutdown;
    let groups: Vec<(i32, u64)> = shutdown
        .groups
        .iter()
        .map(|g| (g.priority, g.period.as_secs()))
        .collect();
    assert_eq!(groups, [(0, 20), (2_000_000_000, 10)]);
    assert!(shutdown.options.manage_inhibit_delay);

    // The drop-in directory the code writes to, mounted read-write from the host; the base
    // mounts nothing there.
    assert_eq!(
        dropin_mount(&overlay),
        Some((false, DROPIN_DIR.to_owned())),
        "the shutdown overlay mounts the host's {DROPIN_DIR} read-write"
    );
    assert_eq!(dropin_mount(&base), None);
    // The root filesystem stays read-only: the drop-in goes only to the mount.
    assert_eq!(
        container(&overlay)["securityContext"]["readOnlyRootFilesystem"],
        true
    );

    // Capabilities: the base's plus the two systemd checks on the D-Bus calls and SCHED_FIFO for
    // the last gasp's thread, nothing else.
    let caps = |objects: &[Manifest]| {
        let mut c = strings(&container(objects)["securityContext"]["capabilities"]["add"]);
        c.sort();
        c
    };
    let mut want = caps(&base);
    want.extend([
        "KILL".to_owned(),
        "SYS_BOOT".to_owned(),
        "SYS_NICE".to_owned(),
    ]);
    want.sort();
    assert_eq!(caps(&overlay), want);
    assert_eq!(
        strings(&container(&overlay)["securityContext"]["capabilities"]["drop"]),
        ["ALL"]
    );
    // The system bus: the inhibitor and the reload go through it, so the overlay mounts it; the
    // base, where shutdown is off, does not reach logind at all.
    let bus = |objects: &[Manifest]| {
        container(objects)["volumeMounts"]
            .as_array()
            .is_some_and(|m| {
                m.iter()
                    .any(|m| m["mountPath"] == "/run/dbus/system_bus_socket")
            })
    };
    assert!(
        bus(&overlay),
        "the shutdown overlay mounts the system bus socket"
    );
    assert!(!bus(&base), "the base mounts no system bus socket");

    // RBAC: the overlay's extra role grants pods/delete and nothing else (the base's admission
    // policy limits it to the agent's own node).
    let extra: Vec<&Manifest> = overlay
        .iter()
        .filter(|m| find(&base, m.kind(), m.name()).is_none())
        .collect();
    let mut kinds: Vec<(&str, &str)> = extra.iter().map(|m| (m.kind(), m.name())).collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        [
            ("ClusterRole", "node-monitor-shutdown"),
            ("ClusterRoleBinding", "node-monitor-shutdown"),
        ]
    );
    let role = find(&overlay, "ClusterRole", "node-monitor-shutdown").expect("role");
    assert_eq!(
        role.object["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["delete"]}])
    );
}

/// Whatever grants the agent `pods: delete` (the escalate and shutdown overlays), the base's
/// admission policy limits it to pods bound to the agent's own node: every kustomization renders
/// the policy and its denying binding. deploy_rbac.rs checks that the API server enforces it.
#[test]
fn every_kustomization_limits_pod_deletion_to_the_agents_own_node() {
    let grants_delete = |m: &Manifest| {
        m.kind() == "ClusterRole"
            && m.object["rules"].as_array().is_some_and(|rules| {
                rules.iter().any(|r| {
                    strings(&r["resources"]).contains(&"pods".to_owned())
                        && strings(&r["verbs"]).contains(&"delete".to_owned())
                })
            })
    };
    for rel in KUSTOMIZATIONS {
        let objects = rendered(rel);
        let policy = find(
            &objects,
            "ValidatingAdmissionPolicy",
            "node-monitor-own-node-pods",
        )
        .unwrap_or_else(|| panic!("{rel}: no pod-deletion policy"));
        assert_eq!(
            strings(&policy.object["spec"]["matchConstraints"]["resourceRules"][0]["operations"]),
            ["DELETE"],
            "{rel}"
        );
        let binding = find(
            &objects,
            "ValidatingAdmissionPolicyBinding",
            "node-monitor-own-node-pods",
        )
        .unwrap_or_else(|| panic!("{rel}: no binding of the pod-deletion policy"));
        assert_eq!(
            binding.object["spec"]["policyName"], "node-monitor-own-node-pods",
            "{rel}"
        );
        assert_eq!(
            strings(&binding.object["spec"]["validationActions"]),
            ["Deny"],
            "{rel}"
        );
        // The base itself grants no deletion; each of the shutdown and escalate components
        // grants it once.
        let grants = objects.iter().filter(|m| grants_delete(m)).count();
        let want = usize::from(rel.contains("shutdown")) + usize::from(rel.contains("escalate"));
        assert_eq!(grants, want, "{rel}");
    }
}

/// The DaemonSet's command line, with its ConfigMap's configuration, gets the agent through
/// argument parsing and configuration loading to its first API call: what a node runs parses.
#[test]
fn daemonset_command_line_starts_the_agent() {
    let bin = node_monitor_tests::e2e::binary("node-monitor");
    let dir = tempfile::tempdir().expect("tempdir");
    for rel in KUSTOMIZATIONS {
        let objects = rendered(rel);
        // The two ConfigMaps as the kubelet projects them: config.yaml, and the drop-ins'
        // directory.
        let root = dir.path().join(rel.replace('/', "-"));
        let drop_ins = root.join("node-monitor.d");
        std::fs::create_dir_all(&drop_ins).expect("mkdir");
        for (name, text) in config_documents(&objects) {
            std::fs::write(root.join(&name), text).expect("write config");
        }
        let c = container(&objects);
        let args: Vec<String> = strings(&c["args"])
            .into_iter()
            .map(|a| {
                if a == "--config=/etc/node-monitor/config.yaml" {
                    format!("--config={}", root.join("config.yaml").display())
                } else if a == "--config=/etc/node-monitor.d" {
                    format!("--config={}", drop_ins.display())
                } else if a.starts_with("--metrics-addr=") {
                    // Any free port: the test must not collide with an agent on this host.
                    "--metrics-addr=127.0.0.1:0".to_owned()
                } else {
                    // The kubelet expands $(VAR) from the container's environment.
                    a.replace("$(NODE_NAME)", "deploy-test-node")
                }
            })
            .collect();
        assert!(
            !args.iter().any(|a| a.contains("/etc/node-monitor")),
            "{rel}: a --config this test does not map: {args:?}"
        );
        assert_eq!(args.first().map(String::as_str), Some("run"), "{rel}");
        let out = Command::new(&bin)
            .args(&args)
            // No in-cluster environment and no kubeconfig: the first API step fails, cleanly.
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
            .env("RUST_LOG", "warn")
            .output()
            .expect("run node-monitor");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{rel}: {stderr}");
        let error = stderr
            .lines()
            .find(|l| l.starts_with("node-monitor: "))
            .unwrap_or_else(|| panic!("{rel}: no error line in {stderr}"));
        assert!(
            error.starts_with("node-monitor: no in-cluster config and no kubeconfig"),
            "{rel} {args:?}: stopped before the API client: {error}"
        );
    }
}

/// remediate's Deployment, with its ConfigMap's configuration, gets `node-monitor-remediate`
/// (its own image and binary) through argument parsing and configuration loading to its first
/// API call: the shipped command line is the binary's.
#[test]
fn remediate_command_line_starts_remediate() {
    let bin = node_monitor_tests::e2e::binary("node-monitor-remediate");
    let dir = tempfile::tempdir().expect("tempdir");
    let objects = render(&node_monitor_tests::manifests::deploy_dir().join("remediate"))
        .unwrap_or_else(|e| panic!("render deploy/remediate: {e}"));
    let config = find(&objects, "ConfigMap", "node-monitor-remediate-config")
        .and_then(|m| m.object["data"]["remediate.yaml"].as_str())
        .expect("ConfigMap node-monitor-remediate-config with data.remediate.yaml");
    let config_path = dir.path().join("remediate.yaml");
    std::fs::write(&config_path, config).expect("write config");
    let deployment = find(&objects, "Deployment", "node-monitor-remediate").expect("deployment");
    let c = &deployment.object["spec"]["template"]["spec"]["containers"][0];
    assert!(
        c["image"]
            .as_str()
            .is_some_and(|i| i.starts_with("ghcr.io/node-monitor/node-monitor-remediate:")),
        "{}",
        c["image"]
    );
    let args: Vec<String> = strings(&c["args"])
        .into_iter()
        .map(|a| {
            if a == "--config=/etc/node-monitor-remediate/remediate.yaml" {
                format!("--config={}", config_path.display())
            } else if a.starts_with("--metrics-addr=") {
                "--metrics-addr=127.0.0.1:0".to_owned()
            } else {
                a.replace("$(POD_NAMESPACE)", "node-monitor")
                    .replace("$(POD_NAME)", "remediate-0")
            }
        })
        .collect();
    assert!(
        !args
            .iter()
            .any(|a| a.contains("/etc/node-monitor-remediate")),
        "a --config this test does not map: {args:?}"
    );
    let out = Command::new(&bin)
        .args(&args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("KUBECONFIG", dir.path().join("no-kubeconfig"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("run node-monitor-remediate");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        !stderr.contains("no longer needed"),
        "the shipped arguments still start with the old subcommand: {args:?}"
    );
    let error = stderr
        .lines()
        .find(|l| l.starts_with("node-monitor-remediate: "))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(
        error.contains("no in-cluster config and no kubeconfig"),
        "{args:?}: stopped before the API client: {error}"
    );
}

/// The base runs under the runtime's default seccomp filter, with no host namespace, no privilege
/// escalation, every capability dropped but the five the probes and the sampler need, and only
/// the cgroup tree mounted read-write.
#[test]
fn base_daemonset_runs_confined() {
    let base = rendered("base");
    let ds = find(&base, "DaemonSet", "node-monitor").expect("daemonset");
    let pod = &ds.object["spec"]["template"]["spec"];
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    for ns in ["hostNetwork", "hostPID", "hostIPC"] {
        assert_ne!(pod[ns], true, "{ns}");
    }
    let c = container(&base);
    let sc = &c["securityContext"];
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    let mut caps = strings(&sc["capabilities"]["add"]);
    caps.sort();
    assert_eq!(
        caps,
        [
            "BPF",
            "DAC_READ_SEARCH",
            "IPC_LOCK",
            "PERFMON",
            "SYS_RESOURCE"
        ]
    );
    let writable: Vec<String> = c["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter(|m| m["readOnly"] != true)
        .map(|m| m["mountPath"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        writable,
        ["/sys/fs/cgroup", "/var/lib/node-monitor"],
        "only the cgroup tree and the agent's state directory are writable"
    );
    // The state directory is `nodeMonitor.stateDir`'s default, a host directory of its own.
    let volumes = &ds.object["spec"]["template"]["spec"]["volumes"];
    let state = volumes
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "state"))
        .expect("state volume");
    assert_eq!(
        state["hostPath"]["path"],
        node_monitor_core::config::DEFAULT_STATE_DIR
    );
    assert_eq!(state["hostPath"]["type"], "DirectoryOrCreate");
}

/// Fencing state is held by cluster RBAC on `nodefences/status`, not by namespace ConfigMap
/// access: remediate's kustomization ships the NodeFence CRD and the policy that keeps its status
/// to remediate, grants remediate the status subresource, and no longer lets it (or need it to)
/// write ConfigMaps; the agent's roles, in every kustomization, grant nothing on NodeFences. (When
/// operations were ConfigMaps, remediate's Role wrote ConfigMaps and no CRD was shipped.)
#[test]
fn only_remediate_is_granted_the_fencing_state() {
    let remediate = render(&node_monitor_tests::manifests::deploy_dir().join("remediate"))
        .unwrap_or_else(|e| panic!("render deploy/remediate: {e}"));
    let crd = find(
        &remediate,
        "CustomResourceDefinition",
        "nodefences.node-monitor.io",
    )
    .expect("the NodeFence CRD is shipped");
    assert_eq!(crd.object["spec"]["scope"], "Cluster");
    let policy = find(
        &remediate,
        "ValidatingAdmissionPolicy",
        "node-monitor-nodefence-status",
    )
    .expect("the NodeFence status policy is shipped");
    assert_eq!(
        strings(&policy.object["spec"]["matchConstraints"]["resourceRules"][0]["resources"]),
        ["nodefences/status"]
    );
    assert!(
        find(
            &remediate,
            "ValidatingAdmissionPolicyBinding",
            "node-monitor-nodefence-status"
        )
        .is_some(),
        "the policy is bound"
    );
    let grants = |m: &Manifest, resource: &str, verb: &str| {
        m.object["rules"].as_array().is_some_and(|rules| {
            rules.iter().any(|r| {
                let res = strings(&r["resources"]);
                let verbs = strings(&r["verbs"]);
                (res.contains(&resource.to_owned()) || res.contains(&"*".to_owned()))
                    && (verbs.contains(&verb.to_owned()) || verbs.contains(&"*".to_owned()))
            })
        })
    };
    let cluster_role = find(&remediate, "ClusterRole", "node-monitor-remediate").expect("role");
    for verb in ["update", "patch"] {
        assert!(grants(cluster_role, "nodefences/status", verb), "{verb}");
    }
    let role = find(&remediate, "Role", "node-monitor-remediate").expect("namespace role");
    for verb in ["create", "update", "patch", "delete"] {
        assert!(
            !grants(role, "configmaps", verb),
            "remediate may {verb} ConfigMaps"
        );
    }
    for rel in KUSTOMIZATIONS {
        for m in rendered(rel)
            .iter()
            .filter(|m| m.kind() == "ClusterRole" || m.kind() == "Role")
        {
            for r in m.object["rules"].as_array().into_iter().flatten() {
                let groups = strings(&r["apiGroups"]);
                assert!(
                    !groups.iter().any(|g| g == "node-monitor.io" || g == "*"),
                    "{rel}: {} {} grants {groups:?}",
                    m.kind(),
                    m.name()
                );
            }
        }
    }
}

/// The container-fs component names CRI-O's graph root as the writable-layer filesystem, on top
/// of the crio component (whose mount covers it), and refuses to render without it.
#[test]
fn container_fs_component_names_the_writable_layer_filesystem() {
    let compose = |components: &[&str]| {
        let dir = tempfile::tempdir().expect("tempdir");
        let k = node_monitor_tests::manifests::relative_path(dir.path(), &kustomize_dir(""));
        let mut text = format!("resources:\n  - {}/base\ncomponents:\n", k.display());
        for c in components {
            text.push_str(&format!("  - {}/components/{c}\n", k.display()));
        }
        std::fs::write(dir.path().join("kustomization.yaml"), text).expect("write kustomization");
        render(dir.path())
    };
    let objects = compose(&["crio", "container-fs"])
        .unwrap_or_else(|e| panic!("render crio + container-fs: {e:#}"));
    let args = strings(&container(&objects)["args"]);
    assert!(
        args.contains(&"--container-fs=/var/lib/containers/storage".to_owned()),
        "{args:?}"
    );
    let base_args = strings(&container(&rendered("base"))["args"]);
    assert!(
        !base_args.iter().any(|a| a.starts_with("--container-fs")),
        "{base_args:?}"
    );
    // Without the crio component the path is not mounted: the render fails.
    assert!(compose(&["container-fs"]).is_err());
}
