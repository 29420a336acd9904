//! The real binary's `check-config`, `explain` and `cleanup` commands: output, exit codes and error
//! messages, as documented in docs/cli.md.

use std::{
    io::Write as _,
    process::{Command, Output},
};

use serde_json::{Value, json};

fn node_monitor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_node-monitor"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap_or_else(|e| panic!("cannot run node-monitor {args:?}: {e}"))
}

fn stdout_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn temp_file(contents: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(contents.as_bytes()).expect("write temp file");
    f
}

fn path(f: &tempfile::NamedTempFile) -> &str {
    f.path().to_str().expect("utf-8 temp path")
}

/// (signal, source, quantity or percentage, hard)
fn summary(v: &Value) -> Vec<(String, String, Value, bool)> {
    v.as_array()
        .expect("a JSON array")
        .iter()
        .map(|t| {
            let amount = t.get("quantity").or_else(|| t.get("percentage"));
            (
                t["signal"].as_str().expect("signal").to_owned(),
                t["source"].as_str().expect("source").to_owned(),
                amount.cloned().expect("quantity or percentage"),
                t["hard"].as_bool().expect("hard"),
            )
        })
        .collect()
}

fn s(signal: &str, source: &str, amount: Value, hard: bool) -> (String, String, Value, bool) {
    (signal.into(), source.into(), amount, hard)
}

/// An `evictionHard` threshold of `amount` (bytes, a percentage or a count).
fn hard(signal: &str, amount: u64) -> (String, String, Value, bool) {
    s(signal, "evictionHard", json!(amount), true)
}

/// The `allocatableMemory.available` copy of a `memory.available` hard threshold of `bytes`.
fn allocatable(bytes: u64) -> (String, String, Value, bool) {
    s(
        "allocatableMemory.available",
        "allocatable",
        json!(bytes),
        true,
    )
}

/// Asserts that the error `err` for the input `what` contains every one of `wants`.
fn assert_names(what: &str, err: &str, wants: &[&str]) {
    for want in wants {
        assert!(
            err.contains(want),
            "{what}: {err:?} should contain {want:?}"
        );
    }
}

/// Runs `check-config` on a file holding `yaml`; asserts it is rejected with nothing on stdout
/// and an error naming the file and each of `wants`. Returns the output and the file.
fn rejected_file(yaml: &str, wants: &[&str]) -> (Output, tempfile::NamedTempFile) {
    let f = temp_file(yaml);
    let out = node_monitor(&["check-config", "--config", path(&f)]);
    assert!(!out.status.success(), "{yaml:?} should be rejected");
    assert!(out.stdout.is_empty(), "nothing on stdout for {yaml:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_names(&format!("{yaml:?}"), &err, &[&[path(&f)], wants].concat());
    (out, f)
}

#[test]
fn check_config_defaults() {
    let v = stdout_json(&node_monitor(&["check-config"]));
    assert_eq!(
        summary(&v),
        [
            hard("memory.available", 104_857_600),
            hard("nodefs.available", 10),
            hard("nodefs.inodesFree", 5),
            hard("imagefs.available", 15),
            hard("imagefs.inodesFree", 5),
            allocatable(104_857_600),
        ]
    );
    for t in v.as_array().expect("array") {
        assert_eq!(t["operator"], "LessThan");
        assert_eq!(t["grace_period_seconds"], 0);
        assert_eq!(t["min_reclaim"], Value::Null);
    }
}

#[test]
fn check_config_flags() {
    let v = stdout_json(&node_monitor(&[
        "check-config",
        "--eviction-hard=memory.available<500Mi,nodefs.available<10%",
        "--eviction-soft=memory.available<1.5Gi",
        "--eviction-soft-grace-period=memory.available=1m30s",
        "--eviction-max-pod-grace-period=60",
        "--eviction-minimum-reclaim=memory.available=0Mi,nodefs.available=500Mi",
        "--eviction-pressure-transition-period=1m",
    ]));
    assert_eq!(
        summary(&v),
        [
            hard("memory.available", 524_288_000),
            hard("nodefs.available", 10),
            s(
                "memory.available",
                "evictionSoft",
                json!(1_610_612_736),
                false
            ),
            allocatable(524_288_000),
        ]
    );
    assert_eq!(v[1]["min_reclaim"], json!({"quantity": 524_288_000}));
    assert_eq!(v[2]["grace_period_seconds"], 90);
    assert_eq!(v[2]["min_reclaim"], json!({"quantity": 0}));
}

#[test]
fn check_config_file_and_flag_precedence() {
    let f = temp_file(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\n\
         evictionHard:\n  memory.available: 1Gi\n  nodefs.available: 20%\n\
         evictionMinimumReclaim:\n  nodefs.available: 5%\nnodeMonitor:\n  maxPodsPerCycle: 2\n",
    );
    let v = stdout_json(&node_monitor(&["check-config", "--config", path(&f)]));
    assert_eq!(
        summary(&v),
        [
            hard("memory.available", 1_073_741_824),
            hard("nodefs.available", 20),
            allocatable(1_073_741_824),
        ]
    );
    assert_eq!(v[1]["min_reclaim"], json!({"percentage": 5}));
    // A flag replaces the file's whole evictionHard map.
    let v = stdout_json(&node_monitor(&[
        "check-config",
        "--config",
        path(&f),
        "--eviction-hard=pid.available<1k",
    ]));
    assert_eq!(summary(&v), [hard("pid.available", 1000)]);
    // mergeDefaultEvictionSettings brings the unset defaults back.
    let f =
        temp_file("evictionHard:\n  memory.available: 1Gi\nmergeDefaultEvictionSettings: true\n");
    let v = stdout_json(&node_monitor(&["check-config", "--config", path(&f)]));
    assert_eq!(v.as_array().expect("array").len(), 6);
}

/// Every rejection exits non-zero and names the field and the value on stderr.
#[test]
fn check_config_rejections() {
    let file_cases: &[(&str, &[&str])] = &[
        (
            "evictionHard:\n  memory.free: 1Gi\n",
            &[
                "evictionHard[\"memory.free\"]",
                "unsupported eviction signal",
            ],
        ),
        (
            "evictionHard:\n  memory.available: -100Mi\n",
            &[
                "evictionHard[\"memory.available\"]",
                "\"-100Mi\"",
                "must be positive",
            ],
        ),
        (
            "evictionHard:\n  nodefs.available: 110%\n",
            &["evictionHard[\"nodefs.available\"]", "\"110%\""],
        ),
        (
            "evictionSoft:\n  memory.available: 1Gi\n",
            &[
                "evictionSoft[\"memory.available\"]",
                "grace period must be specified",
            ],
        ),
        (
            "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1x\n",
            &["evictionSoftGracePeriod[\"memory.available\"]", "\"1x\""],
        ),
        (
            "evictionMinimumReclaim:\n  disk.available: 1Gi\n",
            &[
                "evictionMinimumReclaim[\"disk.available\"]",
                "\"disk.available\"",
            ],
        ),
        (
            "evictionPressureTransitionPeriod: forever\n",
            &["evictionPressureTransitionPeriod", "\"forever\""],
        ),
        (
            "nodeMonitor:\n  dryrun: true\n",
            &["nodeMonitor", "unknown setting \"dryrun\""],
        ),
    ];
    for (yaml, wants) in file_cases {
        rejected_file(yaml, wants);
    }
    let flag_cases: &[(&str, &[&str])] = &[
        (
            "--eviction-hard=memory.available>100Mi",
            &["--eviction-hard", "unsupported operator \">\""],
        ),
        (
            "--eviction-hard=memory.available<1Gb",
            &["--eviction-hard memory.available", "\"1Gb\""],
        ),
        (
            "--eviction-soft=nodefs.available<10%",
            &[
                "--eviction-soft nodefs.available",
                "grace period must be specified",
            ],
        ),
        (
            "--eviction-max-pod-grace-period=thirty",
            &["--eviction-max-pod-grace-period", "\"thirty\""],
        ),
        (
            "--eviction-pressure-transition-period=5",
            &["--eviction-pressure-transition-period", "\"5\""],
        ),
        (
            "--eviction-minimum-reclaim=memory.available=-1Mi",
            &["--eviction-minimum-reclaim memory.available", "\"-1Mi\""],
        ),
    ];
    for (flag, wants) in flag_cases {
        let out = node_monitor(&["check-config", flag]);
        assert!(!out.status.success(), "{flag} should be rejected");
        assert_names(flag, &String::from_utf8_lossy(&out.stderr), wants);
    }
    let out = node_monitor(&["check-config", "--config", "/nonexistent/kubelet.yaml"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/kubelet.yaml"));
}

#[test]
fn check_config_warns_about_ignored_entries() {
    let f = temp_file("evictionSoftGracePeriod:\n  memory.available: 1m\n");
    let out = node_monitor(&["check-config", "--config", path(&f)]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no soft threshold"), "{err}");
}

/// The `node-monitor: …` line main prints for a failed command.
fn error_line(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .find(|l| l.starts_with("node-monitor: "))
        .unwrap_or_else(|| {
            panic!(
                "no error line in stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .to_owned()
}

/// Invalid graceful-shutdown settings, each with what the error must name.
const INVALID_SHUTDOWN_SETTINGS: &[(&str, &[&str])] = &[
    // The critical group is longer than the whole budget.
    (
        "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n",
        &[
            "shutdownGracePeriodCriticalPods: 20s",
            "exceeds shutdownGracePeriod: 10s",
        ],
    ),
    // The groups add up to more than logind can be asked to wait.
    (
        "shutdownGracePeriodByPodPriority:\n  - {priority: 0, shutdownGracePeriodSeconds: 9223372036854775807}\n  - {priority: 1000, shutdownGracePeriodSeconds: 9223372036854775807}\n",
        &[
            "shutdownGracePeriodByPodPriority",
            "18446744073709551614s",
            "InhibitDelayMaxSec",
        ],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - {priority: 0, shutdownGracePeriodSeconds: 18446744073709}\nnodeMonitor:\n  shutdown:\n    inhibitDelayMargin: 5s\n",
        &[
            "nodeMonitor.shutdown.inhibitDelayMargin",
            "\"5s\"",
            "InhibitDelayMaxSec",
        ],
    ),
    (
        "shutdownGracePeriod: -30s\n",
        &["shutdownGracePeriod: -30s is negative"],
    ),
    (
        "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: -1s\n",
        &["shutdownGracePeriodCriticalPods: -1s is negative"],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - {priority: 0, shutdownGracePeriodSeconds: -1}\n",
        &["shutdownGracePeriodSeconds: -1 is negative"],
    ),
    (
        "shutdownGracePeriod: 500ms\n",
        &["shutdownGracePeriod: 500ms", ">= 1s"],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - {priority: 1000, shutdownGracePeriodSeconds: 10}\n  - {priority: 1000, shutdownGracePeriodSeconds: 20}\n",
        &[
            "shutdownGracePeriodByPodPriority",
            "priority 1000 appears more than once",
        ],
    ),
    (
        "shutdownGracePeriod: 30s\nshutdownGracePeriodByPodPriority:\n  - {priority: 0, shutdownGracePeriodSeconds: 10}\n",
        &["shutdownGracePeriodByPodPriority", "both set"],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - {priority: 3000000000, shutdownGracePeriodSeconds: 10}\n",
        &["shutdownGracePeriodByPodPriority[0].priority", "3000000000"],
    ),
    (
        "shutdownGracePeriod: 30\n",
        &["shutdownGracePeriod", "duration string", "30"],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    lastGasp: shout\n",
        &["nodeMonitor.shutdown.lastGasp", "\"shout\""],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    kubeletInhibitorPolicy: ignore\n",
        &["nodeMonitor.shutdown.kubeletInhibitorPolicy", "\"ignore\""],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    inhibitDelayMargin: -1s\n",
        &[
            "nodeMonitor.shutdown.inhibitDelayMargin",
            "\"-1s\"",
            "negative",
        ],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    lastGaspTimeout: 10ms\n",
        &[
            "nodeMonitor.shutdown.lastGaspTimeout",
            "\"10ms\"",
            "at least 100ms",
        ],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    cordn: true\n",
        &["nodeMonitor.shutdown", "unknown setting \"cordn\""],
    ),
    (
        "nodeMonitor:\n  shutdown: true\n",
        &["nodeMonitor.shutdown", "a mapping"],
    ),
];

/// Invalid graceful-shutdown settings: `check-config` exits 1 naming the field and the value,
/// with the very message `node-monitor run` stops with at start (before it touches the API or
/// the node).
#[test]
fn check_config_rejects_invalid_shutdown_settings_as_the_agent_does() {
    let cases = INVALID_SHUTDOWN_SETTINGS;
    let dir = tempfile::tempdir().expect("tempdir");
    for (yaml, wants) in cases {
        let (out, f) = rejected_file(yaml, &[]);
        assert_eq!(out.status.code(), Some(1), "{yaml:?} should be rejected");
        let err = error_line(&out);
        assert_names(&format!("{yaml:?}"), &err, &[&[path(&f)], *wants].concat());
        // `--shutdown` changes only what is printed, not what is accepted.
        let shown = node_monitor(&["check-config", "--shutdown", "--config", path(&f)]);
        assert_eq!(error_line(&shown), err);
        // The agent stops at start with the same message. Should it get further, the unreachable
        // kubeconfig ends it without touching a cluster.
        let run = Command::new(env!("CARGO_BIN_EXE_node-monitor"))
            .args([
                "run",
                "--config",
                path(&f),
                "--node-name",
                "config-check",
                "--metrics-addr",
                "127.0.0.1:0",
                "--no-ebpf",
                "--no-mlock",
                "--kubeconfig",
            ])
            .arg(dir.path().join("no-such-kubeconfig"))
            .env("RUST_LOG", "warn")
            .output()
            .expect("run node-monitor run");
        assert!(!run.status.success(), "{yaml:?}: the agent must refuse it");
        assert_eq!(error_line(&run), err, "{yaml:?}");
    }
}

#[test]
fn check_config_shutdown_prints_the_groups() {
    let f = temp_file(
        "shutdownGracePeriodByPodPriority:\n  - {priority: 100000, shutdownGracePeriodSeconds: 10}\n  - {priority: 0, shutdownGracePeriodSeconds: 60}\n  - {priority: 1000, shutdownGracePeriodSeconds: 120}\nnodeMonitor:\n  shutdown:\n    manageInhibitDelay: false\n    lastGasp: annotation\n",
    );
    let out = node_monitor(&["check-config", "--shutdown", "--config", path(&f)]);
    let v = stdout_json(&out);
    assert_eq!(v["enabled"], true);
    assert_eq!(
        v["groups"],
        json!([
            {"priority": 0, "period_seconds": 60},
            {"priority": 1000, "period_seconds": 120},
            {"priority": 100_000, "period_seconds": 10},
        ])
    );
    assert_eq!(v["budget_seconds"], 190);
    assert_eq!(v["needed_inhibit_delay_seconds"], 195);
    assert_eq!(v["options"]["lastGasp"], "annotation");
    assert_eq!(v["options"]["manageInhibitDelay"], false);
    assert_eq!(v["options"]["inhibitDelayMargin"], "5s");
    // logind is left alone and the groups need more than its default 5s: say so.
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("manageInhibitDelay is false") && err.contains("need 195s"),
        "{err}"
    );
    // Without --shutdown the same file prints the eviction thresholds, as before.
    let thresholds = stdout_json(&node_monitor(&["check-config", "--config", path(&f)]));
    assert_eq!(summary(&thresholds).len(), 6);
    // No shutdown fields: off, no groups.
    let v = stdout_json(&node_monitor(&["check-config", "--shutdown"]));
    assert_eq!(v["enabled"], false);
    assert_eq!(v["groups"], json!([]));
    assert_eq!(v["budget_seconds"], 0);
}

fn pod(name: &str, namespace: &str, qos: &str, resources: Value, priority: i32) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
        "spec": {
            "containers": [{"name": "main", "image": "example", "resources": resources}],
            "priority": priority,
            "terminationGracePeriodSeconds": 30
        },
        "status": {"phase": "Running", "qosClass": qos}
    })
}

/// The `name` of each pod of an `explain` list (`ranked`, `evict`).
fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .expect("a list of pods")
        .iter()
        .map(|p| p["name"].as_str().expect("name"))
        .collect()
}

fn memory_usage(bytes: &str) -> Value {
    json!({"memory": bytes, "containers": {"main": {"memory": bytes}}})
}

/// BestEffort, Burstable over its request, Guaranteed, and a critical (mirror) pod; memory below
/// the default hard threshold.
fn pressure_snapshot(extra_config: Value, critical_priority: i32) -> String {
    let mut critical = pod(
        "kube-proxy",
        "kube-system",
        "BestEffort",
        json!({}),
        critical_priority,
    );
    critical["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
    json!({
        "pods": {"apiVersion": "v1", "kind": "List", "items": [
            pod("guaranteed", "default", "Guaranteed",
                json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}), 0),
            pod("burstable", "default", "Burstable", json!({"requests": {"memory": "256Mi"}}), 0),
            critical,
            pod("besteffort", "default", "BestEffort", json!({}), 0),
        ]},
        "usage": {
            "uid-guaranteed": memory_usage("900Mi"),
            "uid-burstable": memory_usage("768Mi"),
            "uid-kube-proxy": memory_usage("3Gi"),
            "uid-besteffort": memory_usage("1536Mi")
        },
        "observations": {
            "memory.available": {"available": "80Mi", "capacity": "8Gi"},
            "nodefs.available": {"available": "50Gi", "capacity": "100Gi"}
        },
        "config": extra_config
    })
    .to_string()
}

#[test]
fn explain_evicts_the_best_effort_pod_under_memory_pressure() {
    let f = temp_file(&pressure_snapshot(json!({}), 2_000_001_000));
    let v = stdout_json(&node_monitor(&["explain", "--input", path(&f)]));
    assert_eq!(v["reclaim"], "memory.available");
    assert_eq!(v["reclaim_details"]["resource"], "memory");
    assert_eq!(
        names(&v["ranked"]),
        ["besteffort", "burstable", "kube-proxy", "guaranteed"]
    );
    assert_eq!(v["ranked"][0]["qos"], "BestEffort");
    assert_eq!(v["ranked"][0]["exceeds_request"], true);
    assert_eq!(v["ranked"][3]["exceeds_request"], false);
    let evict = v["evict"].as_array().expect("evict");
    assert_eq!(evict.len(), 1);
    assert_eq!(evict[0]["namespace"], "default");
    assert_eq!(evict[0]["name"], "besteffort");
    assert_eq!(evict[0]["signal"], "memory.available");
    assert_eq!(evict[0]["grace_period_seconds"], 1);
    assert_eq!(
        evict[0]["message"],
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
         Container main was using 1536Mi, request is 0, has larger consumption of memory. "
    );
    let pressure = v["conditions"]
        .as_array()
        .expect("conditions")
        .iter()
        .find(|c| c["type"] == "MemoryPressure")
        .expect("MemoryPressure");
    assert_eq!(pressure["status"], true);
}

/// The snapshot's `filesystem` and `writableLayers`: on a dedicated image filesystem, nodefs
/// pressure evicts the pod with the large volume, imagefs pressure the one with the large
/// writable layer; on one filesystem the larger total goes first.
#[test]
fn explain_ranks_disk_pressure_by_the_signals_filesystem() {
    let explain = |signal: &str, dedicated: bool| {
        let snapshot = json!({
            "pods": [
                pod("volume", "default", "BestEffort", json!({}), 0),
                pod("layer", "default", "BestEffort", json!({}), 0),
            ],
            "usage": {
                "uid-volume": {"disk": "600Mi", "writableLayers": "10Mi"},
                "uid-layer": {"disk": "700Mi", "writableLayers": "500Mi"}
            },
            "observations": { signal: {"available": "1Mi", "capacity": "100Gi"} },
            "config": {"evictionHard": {signal: "1Gi"}},
            "filesystem": {"dedicatedImageFs": dedicated, "splitContainerImageFs": false}
        });
        let f = temp_file(&snapshot.to_string());
        let v = stdout_json(&node_monitor(&["explain", "--input", path(&f)]));
        names(&v["evict"])
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(explain("nodefs.available", false), ["layer"]);
    assert_eq!(explain("nodefs.available", true), ["volume"]);
    assert_eq!(explain("imagefs.available", true), ["layer"]);
}

#[test]
fn explain_never_evicts_critical_pods() {
    // The mirror pod (priority 0, the largest user) ranks first; room for every pod in one
    // cycle and a shortfall (7Gi threshold) that no set of evictions covers.
    let f = temp_file(&pressure_snapshot(
        json!({"evictionHard": {"memory.available": "7Gi"}, "nodeMonitor": {"maxPodsPerCycle": 10}}),
        0,
    ));
    let v = stdout_json(&node_monitor(&["explain", "--input", path(&f)]));
    assert_eq!(v["ranked"][0]["name"], "kube-proxy");
    assert_eq!(v["ranked"][0]["critical"], true);
    assert_eq!(
        names(&v["evict"]),
        ["besteffort", "burstable", "guaranteed"]
    );
}

#[test]
fn explain_soft_thresholds_wait_for_their_grace_period() {
    let snapshot = temp_file(&pressure_snapshot(
        json!({"evictionHard": {}}),
        2_000_001_000,
    ));
    let cfg = temp_file(
        "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 2m\nevictionMaxPodGracePeriod: 20\n",
    );
    let explain = |extra: &[&str]| {
        let args = [
            "explain",
            "--input",
            path(&snapshot),
            "--config",
            path(&cfg),
        ];
        stdout_json(&node_monitor(&[&args, extra].concat()))
    };
    let v = explain(&[]);
    assert_eq!(v["thresholds_met"][0]["grace_period_elapsed"], false);
    assert_eq!(v["thresholds_met"][0]["grace_remaining_seconds"], 120.0);
    assert_eq!(v["reclaim"], Value::Null);
    assert_eq!(v["evict"], json!([]));
    let v = explain(&["--held-for=2m"]);
    assert_eq!(v["evict"][0]["name"], "besteffort");
    assert_eq!(v["evict"][0]["grace_period_seconds"], 20);
    assert_eq!(v["evict"][0]["hard"], false);
}

#[test]
fn explain_rejects_bad_snapshots() {
    let f = temp_file(
        r#"{"pods": [], "observations": {"memory.avail": {"available": 1, "capacity": 2}}}"#,
    );
    let out = node_monitor(&["explain", "--input", path(&f)]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("memory.avail"), "{err}");
    let out = node_monitor(&["explain", "--input", "/nonexistent/snapshot.json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/snapshot.json"));
}

/// A reader that closes the pipe early (`check-config | head -c 1`) ends the command quietly: exit
/// 0, no panic, nothing on stderr.
#[test]
fn a_closed_output_pipe_is_not_a_crash() {
    use std::process::Stdio;
    for args in [&["check-config"][..], &["check-config", "--shutdown"][..]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_node-monitor"))
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        // Close the read end before the command writes: its write meets EPIPE.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !stderr.contains("panicked"),
            "{args:?}: exit {:?}, stderr: {stderr}",
            out.status
        );
    }
}

/// `/dev/zero`, a FIFO or a directory as the configuration or the snapshot: a clear error that
/// names the path, never an endless read or a hang on open.
#[test]
fn inputs_that_are_not_regular_files_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    let fifo = fifo.to_str().expect("utf-8");
    let dir_path = dir.path().to_str().expect("utf-8");
    // A conf.d whose `*.yaml` entry is a FIFO: refused as the file itself would be, not read.
    let conf_d_dir = tempfile::tempdir().expect("tempdir");
    let conf_d = conf_d_dir.path().join("conf.d");
    std::fs::create_dir(&conf_d).expect("mkdir");
    let status = Command::new("mkfifo")
        .arg(conf_d.join("10-fifo.yaml"))
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let conf_d = conf_d.to_str().expect("utf-8");
    for (args, want) in [
        (
            vec!["check-config", "--config", "/dev/zero"],
            "/dev/zero is not a regular file (a character device)",
        ),
        (
            vec!["check-config", "--config", fifo],
            "is not a regular file (a FIFO)",
        ),
        // A directory stands for its configuration files (a conf.d): one that holds anything
        // else is refused, naming the entry.
        (
            vec!["check-config", "--config", dir_path],
            "\"fifo\" is not a configuration file (*.yaml, *.yml or *.json)",
        ),
        (
            vec!["check-config", "--config", conf_d],
            "10-fifo.yaml is not a regular file (a FIFO)",
        ),
        (
            vec!["explain", "--input", "/dev/zero"],
            "the snapshot /dev/zero is not a regular file",
        ),
    ] {
        let out = node_monitor(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(want),
            "{args:?}: exit {:?}, stderr: {stderr}",
            out.status
        );
    }
}

/// Every loader of an operator-supplied file refuses what is not a regular file, naming the path:
/// the graceful-shutdown settings (read after the eviction settings by `run` and `check-config`)
/// and the kubelet's own configuration (a hint for the cgroup driver, ignored when unreadable).
/// remediate's are checked in its own crate.
#[test]
fn configuration_loaders_refuse_devices_and_fifos() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    let status = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(status.success());
    let dev_zero = std::path::Path::new("/dev/zero");
    for (path, kind) in [
        (dev_zero, "a character device"),
        (fifo.as_path(), "a FIFO"),
        (dir.path(), "a directory"),
    ] {
        let shown = path.display().to_string();
        let e = node_monitor::shutdown::load_shutdown_config(Some(path))
            .expect_err("shutdown settings");
        let msg = format!("{:#}", anyhow::Error::from(e));
        assert!(msg.contains(&shown) && msg.contains(kind), "{msg}");
        assert_eq!(node_monitor::sampler::kubelet_config_driver(path), None);
    }
}

/// An empty node name would select every unscheduled pod of the cluster: `run` refuses it from the
/// flag and from NODE_NAME, before it talks to any API server.
#[test]
fn an_empty_node_name_is_refused() {
    let flag = node_monitor(&["run", "--node-name", ""]);
    let stderr = String::from_utf8_lossy(&flag.stderr);
    assert!(
        !flag.status.success() && stderr.contains("the node name is empty"),
        "--node-name '': exit {:?}, stderr: {stderr}",
        flag.status
    );
    let env = Command::new(env!("CARGO_BIN_EXE_node-monitor"))
        .arg("run")
        .env("NODE_NAME", "")
        .env("RUST_LOG", "warn")
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&env.stderr);
    assert!(
        !env.status.success() && stderr.contains("--node-name"),
        "NODE_NAME='': exit {:?}, stderr: {stderr}",
        env.status
    );
    let bad = node_monitor(&["run", "--node-name", "Node_A"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && stderr.contains("\"Node_A\" is not a DNS subdomain"),
        "--node-name Node_A: exit {:?}, stderr: {stderr}",
        bad.status
    );
}

/// `cleanup` refuses a malformed node name before any API call, and names an unreadable
/// kubeconfig.
#[test]
fn cleanup_bad_input_is_named() {
    let out = node_monitor(&["cleanup", "--node-name", "Not_A_Node"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--node-name") && stderr.contains("Not_A_Node"),
        "{stderr}"
    );
    let out = node_monitor(&[
        "cleanup",
        "--node-name",
        "worker-1",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
    ]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/kubeconfig"), "{stderr}");
}

/// Every bounded flag refuses a value out of its bounds before anything runs, naming the flag and
/// the value: (binary's arguments, what the error must name).
#[test]
fn flags_out_of_bounds_are_refused_by_name() {
    let cases: [(Output, &[&str]); 5] = [
        (
            node_monitor(&[
                "cleanup",
                "--all-nodes",
                "--agent-namespace",
                "node-monitor",
                "--wait-for-agents",
                "18446744073709551615",
            ]),
            &["--wait-for-agents", "18446744073709551615", "0..=3600"],
        ),
        (
            node_monitor(&[
                "cleanup",
                "--all-nodes",
                "--agent-namespace",
                "Bad_NS",
                "--wait-for-agents",
                "5",
            ]),
            &["--agent-namespace", "\"Bad_NS\"", "DNS label"],
        ),
        (
            node_monitor(&["trace", "--duration", "1e19"]),
            &["--duration", "\"1e19\"", "at most 604800"],
        ),
        (
            node_monitor(&["run", "--node-name", "n1", "--oom-score-adj", "5000"]),
            &["--oom-score-adj", "5000", "-1000..=1000"],
        ),
        (
            node_monitor(&["run", "--node-name", "n1", "--namespace", "a b"]),
            &["--namespace", "\"a b\""],
        ),
    ];
    for (out, wants) in cases {
        assert!(!out.status.success(), "{wants:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        for want in wants {
            assert!(err.contains(want), "{want} not in: {err}");
        }
    }
}

/// `--version`: the version, the commit and its date, and the embedded eBPF object's SHA-256;
/// `-V` the version alone.
#[test]
fn version_names_the_commit_and_the_ebpf_object() {
    let out = node_monitor(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("node-monitor {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(text.starts_with(&want), "{text}");
    let hash = text
        .split("eBPF object sha256 ")
        .nth(1)
        .and_then(|r| r.strip_suffix(")\n"))
        .unwrap_or_else(|| panic!("no object hash: {text}"));
    assert_eq!(hash.len(), 64, "{text}");
    assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{text}");
    assert!(text.contains(", source date "), "{text}");
    // Built from a git checkout (CI's clone too): the commit is known.
    if std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.git")).exists() {
        assert!(!text.contains("(commit unknown"), "{text}");
    }
    let short = node_monitor(&["-V"]);
    assert_eq!(
        String::from_utf8_lossy(&short.stdout),
        format!("node-monitor {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// Shell completions and the man page come from the same definitions as the parser: every
/// subcommand is in them.
#[test]
fn completions_and_the_man_page_name_every_command() {
    let commands = ["run", "trace", "check-config", "explain", "cleanup"];
    for shell in ["bash", "zsh", "fish"] {
        let out = node_monitor(&["completion", shell]);
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        for c in commands {
            assert!(text.contains(c), "{shell}: no {c}");
        }
        assert!(text.contains("kubelet-root"), "{shell}: run's flags");
    }
    let bad = node_monitor(&["completion", "cmd.exe"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("cmd.exe"),
        "the refusal names the value"
    );
    let man = node_monitor(&["man"]);
    assert!(man.status.success());
    // roff writes a hyphen as `\-`.
    let text = String::from_utf8_lossy(&man.stdout).replace("\\-", "-");
    assert!(text.contains(".TH node-monitor"), "{text}");
    for c in commands {
        assert!(text.contains(c), "man: no {c}");
    }
}

/// A document states its version or is read as node-monitor.io/v1alpha1; another version is
/// refused by name; `--migrate` prints each document in the current form.
#[test]
fn check_config_reads_versions_and_migrates() {
    let implicit = temp_file("evictionHard:\n  memory.available: 300Mi\n");
    let stated = temp_file(
        "apiVersion: node-monitor.io/v1alpha1\nkind: NodeMonitorConfiguration\nnodeMonitor:\n  dryRun: true\n",
    );
    let out = node_monitor(&[
        "check-config",
        "--config",
        path(&implicit),
        "--config",
        path(&stated),
        "--migrate",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<&str> = text.split("---\n").collect();
    assert_eq!(docs.len(), 2, "{text}");
    assert!(
        docs[0].starts_with(&format!("# {}\n", path(&implicit)))
            && docs[0].contains(
                "apiVersion: node-monitor.io/v1alpha1\nkind: NodeMonitorConfiguration\nevictionHard:\n  memory.available: 300Mi"
            ),
        "{text}"
    );
    assert_eq!(docs[1].matches("apiVersion:").count(), 1, "{text}");
    // The migrated documents read back as the same configuration.
    let migrated = temp_file(docs[0]);
    let again = stdout_json(&node_monitor(&[
        "check-config",
        "--config",
        path(&migrated),
    ]));
    let before = stdout_json(&node_monitor(&[
        "check-config",
        "--config",
        path(&implicit),
    ]));
    assert_eq!(again, before);

    for (yaml, wants) in [
        (
            "apiVersion: node-monitor.io/v2\nkind: NodeMonitorConfiguration\n",
            &[
                "apiVersion",
                "node-monitor.io/v2",
                "node-monitor.io/v1alpha1",
            ][..],
        ),
        (
            "apiVersion: node-monitor.io/v1alpha1\nkind: ConfigMap\n",
            &["kind", "ConfigMap", "NodeMonitorConfiguration"][..],
        ),
    ] {
        let (out, _f) = rejected_file(yaml, wants);
        assert!(!out.status.success());
    }
}
