use super::*;

/// Asserts that `parse` rejects every input of `cases` with an error that names each of its
/// wants (the field, the value, the reason).
pub(crate) fn assert_rejections<C: std::fmt::Debug, T: std::fmt::Debug, E: std::fmt::Display>(
    cases: &[(C, &[&str])],
    parse: impl Fn(&C) -> Result<T, E>,
) {
    for (input, wants) in cases {
        let err = match parse(input) {
            Ok(accepted) => panic!("{input:?} should be rejected, got {accepted:?}"),
            Err(e) => e.to_string(),
        };
        for want in *wants {
            assert!(
                err.contains(want),
                "{input:?}: {err:?} should contain {want:?}"
            );
        }
    }
}

fn flags() -> EvictionOverrides {
    EvictionOverrides::default()
}

fn load_yaml(yaml: &str, flags: &EvictionOverrides) -> Result<EvictionConfig, ConfigError> {
    load_sources(
        &[ConfigSource {
            name: "kubelet.yaml",
            text: yaml,
        }],
        flags,
    )
}

fn summary(c: &EvictionConfig) -> Vec<String> {
    c.thresholds
        .iter()
        .map(|t| {
            let kind = if t.is_hard() { "hard" } else { "soft" };
            let reclaim = t
                .min_reclaim
                .as_ref()
                .map(|m| format!(" reclaim={m}"))
                .unwrap_or_default();
            format!(
                "{}<{} {kind} {:?} grace={}s{reclaim}",
                t.signal,
                t.value,
                t.source,
                t.grace_period.as_secs_f64()
            )
        })
        .collect()
}

#[test]
fn defaults_with_nothing_configured() {
    let c = load(None, &flags()).expect("defaults");
    assert_eq!(
        summary(&c),
        [
            "memory.available<100Mi hard EvictionHard grace=0s",
            "nodefs.available<10% hard EvictionHard grace=0s",
            "nodefs.inodesFree<5% hard EvictionHard grace=0s",
            "imagefs.available<15% hard EvictionHard grace=0s",
            "imagefs.inodesFree<5% hard EvictionHard grace=0s",
            "allocatableMemory.available<100Mi hard Allocatable grace=0s",
        ]
    );
    assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
    assert_eq!(c.max_pod_grace_period_seconds, 0);
    assert_eq!(c.node_monitor, NodeMonitorSettings::default());
    assert_eq!(c.node_monitor.max_pods_per_cycle, 1);
    // The memory push: attached only near a memory threshold, so on by default.
    assert!(c.node_monitor.memory_push);
    assert_eq!(c, EvictionConfig::default());
    // A KubeletConfiguration without eviction fields changes nothing.
    let c = load_yaml(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 110\n",
        &flags(),
    )
    .expect("plain kubelet config");
    assert_eq!(c.thresholds.len(), 6);
}

/// Setting any hard threshold drops the other defaults, unless
/// mergeDefaultEvictionSettings is true.
#[test]
fn setting_one_hard_threshold_drops_the_defaults() {
    let c = load_yaml("evictionHard:\n  memory.available: 500Mi\n", &flags()).expect("ok");
    assert_eq!(
        summary(&c),
        [
            "memory.available<500Mi hard EvictionHard grace=0s",
            "allocatableMemory.available<500Mi hard Allocatable grace=0s",
        ]
    );
    let c = load_yaml(
            "evictionHard:\n  memory.available: 500Mi\n  nodefs.available: 5%\nmergeDefaultEvictionSettings: true\n",
            &flags(),
        )
        .expect("merge");
    assert_eq!(
        summary(&c),
        [
            "memory.available<500Mi hard EvictionHard grace=0s",
            "nodefs.available<5% hard EvictionHard grace=0s",
            "nodefs.inodesFree<5% hard EvictionHard grace=0s",
            "imagefs.available<15% hard EvictionHard grace=0s",
            "imagefs.inodesFree<5% hard EvictionHard grace=0s",
            "allocatableMemory.available<500Mi hard Allocatable grace=0s",
        ]
    );
    // An explicit empty map means no hard thresholds at all; null means unset.
    let c = load_yaml("evictionHard: {}\n", &flags()).expect("empty");
    assert!(c.thresholds.is_empty());
    let c = load_yaml("evictionHard: null\n", &flags()).expect("null");
    assert_eq!(c.thresholds.len(), 6);
    // "0%" disables one signal; with merge it keeps the default from coming back.
    let c = load_yaml(
        "evictionHard:\n  imagefs.available: \"0%\"\nmergeDefaultEvictionSettings: true\n",
        &flags(),
    )
    .expect("disable");
    assert!(
        !c.thresholds
            .iter()
            .any(|t| t.signal == Signal::ImageFsAvailable)
    );
    assert_eq!(c.thresholds.len(), 5);
    assert!(
        c.warnings.iter().any(|w| w.contains("0%")),
        "{:?}",
        c.warnings
    );
}

/// The docs' example of minimum reclaim.
#[test]
fn docs_minimum_reclaim_example() {
    let yaml = r#"
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
evictionHard:
  memory.available: "500Mi"
  nodefs.available: "1Gi"
  imagefs.available: "100Gi"
evictionMinimumReclaim:
  memory.available: "0Mi"
  nodefs.available: "500Mi"
  imagefs.available: "2Gi"
"#;
    let c = load_yaml(yaml, &flags()).expect("docs example");
    assert_eq!(
        summary(&c),
        [
            "memory.available<500Mi hard EvictionHard grace=0s reclaim=0",
            "nodefs.available<1Gi hard EvictionHard grace=0s reclaim=500Mi",
            "imagefs.available<100Gi hard EvictionHard grace=0s reclaim=2Gi",
            "allocatableMemory.available<500Mi hard Allocatable grace=0s reclaim=0",
        ]
    );
}

#[test]
fn soft_thresholds_take_their_grace_periods() {
    let yaml = "evictionSoft:\n  memory.available: 1.5Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n  nodefs.available: 2m\nevictionMaxPodGracePeriod: 60\n";
    let c = load_yaml(yaml, &flags()).expect("soft");
    let soft: Vec<_> = c
        .thresholds
        .iter()
        .filter(|t| t.source == ThresholdSource::EvictionSoft)
        .collect();
    assert_eq!(soft.len(), 1);
    assert_eq!(soft[0].grace_period, Duration::from_secs(90));
    assert!(!soft[0].is_hard());
    assert_eq!(soft[0].value.to_string(), "1536Mi");
    assert_eq!(c.max_pod_grace_period_seconds, 60);
    // The kubelet accepts a grace period with no soft threshold and ignores it.
    assert!(
        c.warnings.iter().any(|w| w.contains("nodefs.available")),
        "{:?}",
        c.warnings
    );
    // Soft thresholds do not touch the hard defaults.
    assert_eq!(
        c.thresholds
            .iter()
            .filter(|t| t.source == ThresholdSource::EvictionHard)
            .count(),
        5
    );
}

#[test]
fn flags_override_the_file_field_by_field() {
    let yaml = "evictionHard:\n  memory.available: 1Gi\n  nodefs.available: 20%\nevictionMaxPodGracePeriod: 30\nevictionPressureTransitionPeriod: 1m\n";
    let f = EvictionOverrides {
        eviction_hard: vec!["memory.available<200Mi".into()],
        eviction_pressure_transition_period: Some("30s".into()),
        ..flags()
    };
    let c = load_yaml(yaml, &f).expect("flags");
    // The flag replaces the whole map: nodefs.available from the file is gone.
    assert_eq!(
        summary(&c),
        [
            "memory.available<200Mi hard EvictionHard grace=0s",
            "allocatableMemory.available<200Mi hard Allocatable grace=0s",
        ]
    );
    assert_eq!(c.max_pod_grace_period_seconds, 30, "untouched by flags");
    assert_eq!(c.pressure_transition_period, Duration::from_secs(30));

    let f = EvictionOverrides {
        eviction_hard: vec![
            "memory.available<100Mi, nodefs.available<10%".into(),
            "nodefs.available<12%".into(),
        ],
        eviction_soft: vec!["memory.available<1.5Gi".into()],
        eviction_soft_grace_period: vec!["memory.available=1m30s".into()],
        eviction_max_pod_grace_period: Some("60".into()),
        eviction_minimum_reclaim: vec!["memory.available=0Mi,nodefs.available=500Mi".into()],
        eviction_pressure_transition_period: Some("5m".into()),
    };
    let c = load(None, &f).expect("all flags");
    assert_eq!(
        summary(&c),
        [
            "memory.available<100Mi hard EvictionHard grace=0s reclaim=0",
            "nodefs.available<12% hard EvictionHard grace=0s reclaim=500Mi",
            "memory.available<1536Mi soft EvictionSoft grace=90s reclaim=0",
            "allocatableMemory.available<100Mi hard Allocatable grace=0s reclaim=0",
        ]
    );
    assert_eq!(c.max_pod_grace_period_seconds, 60);
    // An empty flag value clears the field, as the kubelet's map flags do.
    let f = EvictionOverrides {
        eviction_hard: vec![String::new()],
        ..flags()
    };
    assert!(load(None, &f).expect("empty flag").thresholds.is_empty());
}

#[test]
fn later_documents_override_earlier_ones() {
    let a = ConfigSource {
        name: "a",
        text: "evictionHard:\n  memory.available: 1Gi\nevictionMaxPodGracePeriod: 10\n",
    };
    let b = ConfigSource {
        name: "b",
        text: "evictionMaxPodGracePeriod: 20\nnodeMonitor:\n  dryRun: true\n",
    };
    let c = load_sources(&[a, b], &flags()).expect("layers");
    assert_eq!(c.max_pod_grace_period_seconds, 20);
    assert_eq!(c.thresholds[0].value.to_string(), "1Gi");
    assert!(c.node_monitor.dry_run);
}

/// A drop-in that sets one threshold keeps the thresholds of the documents before it: the signal
/// maps are merged key by key, as the kubelet merges its drop-ins; a key set again is replaced
/// alone, an empty map changes nothing, and an error still names the document that set the value.
#[test]
fn drop_ins_merge_the_signal_maps_key_by_key() {
    let base = ConfigSource {
        name: "config.yaml",
        text: "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 10%\nevictionSoft:\n  memory.available: 300Mi\nevictionSoftGracePeriod:\n  memory.available: 1m\n",
    };
    let disk = ConfigSource {
        name: "10-disk.yaml",
        text: "evictionHard:\n  nodefs.available: 15%\n  imagefs.available: 20%\nevictionSoft: {}\n",
    };
    let c = load_sources(&[base, disk], &flags()).expect("merged");
    let mut got: Vec<String> = c
        .thresholds
        .iter()
        .filter(|t| !t.signal.as_str().starts_with("containerfs"))
        .map(|t| {
            let kind = if t.is_hard() { "hard" } else { "soft" };
            format!("{kind} {}<{}", t.signal, t.value)
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            // The allocatable copy of the memory threshold (enforceNodeAllocatable: pods).
            "hard allocatableMemory.available<100Mi",
            "hard imagefs.available<20%",
            "hard memory.available<100Mi",
            "hard nodefs.available<15%",
            "soft memory.available<300Mi",
        ]
    );
    let bad = ConfigSource {
        name: "20-bad.yaml",
        text: "evictionHard:\n  memory.available: lots\n",
    };
    let e = load_sources(&[base, bad], &flags()).expect_err("a bad value in a drop-in");
    assert!(e.to_string().contains("20-bad.yaml"), "{e}");
}

#[test]
fn allocatable_copies_follow_enforce_node_allocatable() {
    let c = load_yaml("enforceNodeAllocatable: [\"none\"]\n", &flags()).expect("none");
    assert!(
        !c.thresholds
            .iter()
            .any(|t| t.signal == Signal::AllocatableMemoryAvailable)
    );
    let c = load_yaml(
        "enforceNodeAllocatable: [pods, system-reserved]\n",
        &flags(),
    )
    .expect("pods");
    let copy = c
        .threshold(crate::signals::threshold::ThresholdKey {
            signal: Signal::AllocatableMemoryAvailable,
            source: ThresholdSource::Allocatable,
        })
        .expect("copy");
    assert_eq!(copy.derived_from, Some(Signal::MemoryAvailable));
}

/// Documents the kubelet rejects, each with what its error must name.
const KUBELET_REJECTIONS: &[(&str, &[&str])] = &[
    (
        "evictionHard:\n  memory.free: 1Gi\n",
        &[
            "evictionHard[\"memory.free\"]",
            "unsupported eviction signal \"memory.free\"",
        ],
    ),
    (
        "evictionHard:\n  memory.available: -1Gi\n",
        &[
            "evictionHard[\"memory.available\"]",
            "\"-1Gi\"",
            "must be positive",
        ],
    ),
    (
        "evictionHard:\n  memory.available: \"0\"\n",
        &["\"0\"", "must be positive"],
    ),
    (
        "evictionHard:\n  memory.available: 1Gb\n",
        &[
            "evictionHard[\"memory.available\"]",
            "invalid quantity \"1Gb\"",
        ],
    ),
    (
        "evictionHard:\n  nodefs.available: 101%\n",
        &[
            "evictionHard[\"nodefs.available\"]",
            "\"101%\"",
            "between 0% and 100%",
        ],
    ),
    (
        "evictionHard:\n  nodefs.available: -5%\n",
        &["\"-5%\"", "between 0% and 100%"],
    ),
    (
        "evictionHard:\n  nodefs.available: ten%\n",
        &["\"ten%\"", "not a valid percentage"],
    ),
    (
        "evictionHard:\n  memory.available: 100\n",
        &[
            "evictionHard[\"memory.available\"]",
            "expected a string",
            "100",
        ],
    ),
    (
        "evictionSoft:\n  memory.available: 1Gi\n",
        &[
            "evictionSoft[\"memory.available\"]",
            "grace period must be specified",
            "memory.available",
        ],
    ),
    (
        "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 90\n",
        &[
            "evictionSoftGracePeriod[\"memory.available\"]",
            "expected a string",
        ],
    ),
    (
        "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m30\n",
        &[
            "evictionSoftGracePeriod[\"memory.available\"]",
            "invalid duration \"1m30\"",
        ],
    ),
    (
        "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: -1m\n",
        &["\"-1m\"", "must not be negative"],
    ),
    (
        "evictionSoftGracePeriod:\n  pid.free: 1m\n",
        &["evictionSoftGracePeriod[\"pid.free\"]", "\"pid.free\""],
    ),
    (
        "evictionMinimumReclaim:\n  memory.free: 1Gi\n",
        &[
            "evictionMinimumReclaim[\"memory.free\"]",
            "unsupported eviction signal \"memory.free\"",
        ],
    ),
    (
        "evictionMinimumReclaim:\n  memory.available: -1Mi\n",
        &[
            "evictionMinimumReclaim[\"memory.available\"]",
            "\"-1Mi\"",
            "must not be negative",
        ],
    ),
    (
        "evictionMinimumReclaim:\n  nodefs.available: 0%\n",
        &["\"0%\"", "must be positive"],
    ),
    (
        "evictionPressureTransitionPeriod: 5 minutes\n",
        &["evictionPressureTransitionPeriod", "\"5 minutes\""],
    ),
    (
        "evictionPressureTransitionPeriod: -5m\n",
        &["evictionPressureTransitionPeriod", "\"-5m\"", "negative"],
    ),
    (
        "evictionMaxPodGracePeriod: 1.5\n",
        &["evictionMaxPodGracePeriod", "1.5"],
    ),
    (
        "evictionMaxPodGracePeriod: 9999999999\n",
        &["evictionMaxPodGracePeriod", "9999999999"],
    ),
    (
        "nodeMonitor:\n  maxPodsPerCylce: 2\n",
        &["nodeMonitor", "unknown setting \"maxPodsPerCylce\""],
    ),
    (
        "nodeMonitor:\n  maxPodsPerCycle: 0\n",
        &["nodeMonitor.maxPodsPerCycle", "\"0\""],
    ),
    (
        "nodeMonitor:\n  pdbPolicy: ignore\n",
        &["nodeMonitor.pdbPolicy", "\"ignore\""],
    ),
    (
        "nodeMonitor:\n  livenessLeaseInterval: 500ms\n",
        &[
            "nodeMonitor.livenessLeaseInterval",
            "\"500ms\"",
            "0s (off) or between 1s and 1m",
        ],
    ),
    (
        "nodeMonitor:\n  livenessLeaseInterval: 2m\n",
        &["nodeMonitor.livenessLeaseInterval", "\"2m\""],
    ),
    (
        "nodeMonitor:\n  memoryWorkingSet: cache\n",
        &[
            "nodeMonitor.memoryWorkingSet",
            "\"cache\"",
            "\"kubelet\" or \"reclaimable\"",
        ],
    ),
    (
        "nodeMonitor:\n  memoryWorkingSet: true\n",
        &["nodeMonitor.memoryWorkingSet", "found the boolean true"],
    ),
    (
        "nodeMonitor:\n  psiWindow: 20s\n",
        &["nodeMonitor.psiWindow", "\"20s\"", "between 500ms and 10s"],
    ),
    (
        "nodeMonitor:\n  psiThreshold: 3s\n",
        &["nodeMonitor.psiThreshold", "3s", "psiWindow"],
    ),
    (
        "nodeMonitor:\n  housekeepingInterval: soon\n",
        &["nodeMonitor.housekeepingInterval", "\"soon\""],
    ),
    (
        "nodeMonitor:\n  fastSamplingInterval: 5ms\n",
        &[
            "nodeMonitor.fastSamplingInterval",
            "\"5ms\"",
            "at least 10ms",
        ],
    ),
    (
        "nodeMonitor:\n  housekeepingInterval: 1s\n  fastSamplingInterval: 2s\n",
        &[
            "nodeMonitor.fastSamplingInterval",
            "2s",
            "housekeepingInterval (1s)",
        ],
    ),
    (
        "nodeMonitor:\n  dryRun: maybe\n",
        &["nodeMonitor.dryRun", "expected a boolean", "\"maybe\""],
    ),
    (
        "evictionHard: [memory.available]\n",
        &["evictionHard", "expected a mapping"],
    ),
    (
        "- just\n- a list\n",
        &["kubelet.yaml", "expected a mapping"],
    ),
    (
        "evictionHard:\n  memory.available: 1Gi\n  bad: [\n",
        &["kubelet.yaml", "not a valid YAML"],
    ),
];

/// Every rejection names the field and the value.
#[test]
fn rejects_what_the_kubelet_rejects() {
    let cases = KUBELET_REJECTIONS;
    assert_rejections(cases, |yaml| load_yaml(yaml, &flags()));
}

#[test]
fn rejects_bad_flags_naming_flag_and_value() {
    let cases: &[(EvictionOverrides, &[&str])] = &[
        (
            EvictionOverrides {
                eviction_hard: vec!["memory.available>100Mi".into()],
                ..flags()
            },
            &[
                "--eviction-hard",
                "unsupported operator \">\"",
                "memory.available>100Mi",
            ],
        ),
        (
            EvictionOverrides {
                eviction_hard: vec!["memory.available<=100Mi".into()],
                ..flags()
            },
            &["--eviction-hard", "\"<=\""],
        ),
        (
            EvictionOverrides {
                eviction_hard: vec!["memory.available".into()],
                ..flags()
            },
            &["--eviction-hard", "malformed entry \"memory.available\""],
        ),
        (
            EvictionOverrides {
                eviction_hard: vec!["memory.free<1Gi".into()],
                ..flags()
            },
            &["--eviction-hard memory.free", "\"memory.free\""],
        ),
        (
            EvictionOverrides {
                eviction_hard: vec!["nodefs.available<150%".into()],
                ..flags()
            },
            &["--eviction-hard nodefs.available", "\"150%\""],
        ),
        (
            EvictionOverrides {
                eviction_soft: vec!["memory.available<1Gi".into()],
                ..flags()
            },
            &[
                "--eviction-soft memory.available",
                "grace period must be specified",
            ],
        ),
        (
            EvictionOverrides {
                eviction_soft_grace_period: vec!["memory.available:1m".into()],
                ..flags()
            },
            &["--eviction-soft-grace-period", "\"memory.available:1m\""],
        ),
        (
            EvictionOverrides {
                eviction_soft_grace_period: vec!["memory.available=ninety".into()],
                ..flags()
            },
            &[
                "--eviction-soft-grace-period memory.available",
                "\"ninety\"",
            ],
        ),
        (
            EvictionOverrides {
                eviction_max_pod_grace_period: Some("1m".into()),
                ..flags()
            },
            &["--eviction-max-pod-grace-period", "\"1m\""],
        ),
        (
            EvictionOverrides {
                eviction_minimum_reclaim: vec!["disk.available=1Gi".into()],
                ..flags()
            },
            &[
                "--eviction-minimum-reclaim disk.available",
                "\"disk.available\"",
            ],
        ),
        (
            EvictionOverrides {
                eviction_pressure_transition_period: Some("5".into()),
                ..flags()
            },
            &["--eviction-pressure-transition-period", "\"5\""],
        ),
    ];
    assert_rejections(cases, |f| load(None, f));
}

#[test]
fn kubelet_quirks_are_kept_and_reported() {
    // A zero transition period in the file becomes the default 5m (SetDefaults), a flag
    // keeps it.
    let c = load_yaml("evictionPressureTransitionPeriod: 0s\n", &flags()).expect("zero");
    assert_eq!(c.pressure_transition_period, Duration::from_secs(300));
    assert!(!c.warnings.is_empty());
    let f = EvictionOverrides {
        eviction_pressure_transition_period: Some("0s".into()),
        ..flags()
    };
    assert_eq!(
        load(None, &f).expect("flag").pressure_transition_period,
        Duration::ZERO
    );
    // A soft threshold with a zero grace period is hard.
    let yaml =
        "evictionSoft:\n  pid.available: 10%\nevictionSoftGracePeriod:\n  pid.available: 0s\n";
    let c = load_yaml(yaml, &flags()).expect("zero grace");
    let t = c
        .thresholds
        .iter()
        .find(|t| t.signal == Signal::PidAvailable)
        .expect("pid");
    assert!(t.is_hard());
    // 0.0% is accepted (only the exact strings 0% and 100% are ignored).
    let c = load_yaml("evictionHard:\n  pid.available: 0.0%\n", &flags()).expect("0.0%");
    assert_eq!(c.thresholds.len(), 1);
}

#[test]
fn node_monitor_settings_parse() {
    let yaml = "nodeMonitor:\n  maxPodsPerCycle: 3\n  housekeepingInterval: 5s\n  fastSamplingInterval: 50ms\n  pdbPolicy: escalate\n  dryRun: true\n  psiWindow: 4s\n  psiThreshold: 200ms\n  reclaimStallBudget: 50ms\n  podCleanupTimeout: 1m\n  taintOnPressure: true\n  apiTimeout: 3s\n  kubeletConfigPath: /etc/kubernetes/kubelet.yaml\n  livenessLeaseInterval: 7s\n  memoryWorkingSet: reclaimable\n  memoryPush: false\n  rebootProbeFallback: false\n  stateDir: /data/node-monitor\n  predictiveEviction: false\n  predictionLead: 3s\n";
    let c = load_yaml(yaml, &flags()).expect("settings");
    assert_eq!(
        c.node_monitor,
        NodeMonitorSettings {
            max_pods_per_cycle: 3,
            housekeeping_interval: Duration::from_secs(5),
            fast_sampling_interval: Duration::from_millis(50),
            pdb_policy: PdbPolicy::Escalate,
            dry_run: true,
            psi_window: Duration::from_secs(4),
            psi_threshold: Duration::from_millis(200),
            reclaim_stall_budget: Duration::from_millis(50),
            pod_cleanup_timeout: Duration::from_secs(60),
            taint_on_pressure: true,
            memory_push: false,
            reboot_probe_fallback: false,
            api_timeout: Duration::from_secs(3),
            kubelet_config_path: "/etc/kubernetes/kubelet.yaml".into(),
            liveness_lease_interval: Duration::from_secs(7),
            memory_working_set: MemoryWorkingSet::Reclaimable,
            state_dir: "/data/node-monitor".into(),
            predictive_eviction: false,
            prediction_lead: Duration::from_secs(3),
        }
    );
    let json = serde_json::to_value(&c.node_monitor).expect("json");
    assert_eq!(json["housekeepingInterval"], "5s");
    assert_eq!(json["pdbPolicy"], "escalate");
    assert_eq!(json["memoryWorkingSet"], "reclaimable");
    // Unset: the kubelet's formula.
    let c = load_yaml("nodeMonitor:\n  dryRun: true\n", &flags()).expect("default");
    assert_eq!(c.node_monitor.memory_working_set, MemoryWorkingSet::Kubelet);
}

#[test]
fn json_documents_are_accepted() {
    let c = load_yaml(
        r#"{"evictionHard": {"memory.available": "300Mi"}, "unknownField": 1}"#,
        &flags(),
    )
    .expect("json");
    assert_eq!(c.thresholds[0].value.to_string(), "300Mi");
}

#[test]
fn container_fs_thresholds_follow_the_layout() {
    let yaml = "evictionHard:\n  nodefs.available: 10%\n  imagefs.available: 15%\n  containerfs.available: 50%\n";
    let c = load_yaml(yaml, &flags()).expect("containerfs");
    assert!(c.warnings.iter().any(|w| w.contains("containerfs")));
    let find = |c: &EvictionConfig| {
        c.thresholds
            .iter()
            .filter(|t| t.signal == Signal::ContainerFsAvailable)
            .map(|t| (t.value.to_string(), t.derived_from))
            .collect::<Vec<_>>()
    };
    let single = c.with_fs_layout(FsLayout::default());
    assert_eq!(
        find(&single),
        [("10%".to_owned(), Some(Signal::NodeFsAvailable))]
    );
    let image = c.with_fs_layout(FsLayout {
        dedicated_image_fs: true,
        split_container_image_fs: false,
    });
    assert_eq!(
        find(&image),
        [("15%".to_owned(), Some(Signal::ImageFsAvailable))]
    );
    let odd = c.with_fs_layout(FsLayout {
        dedicated_image_fs: false,
        split_container_image_fs: true,
    });
    assert_eq!(find(&odd), [("50%".to_owned(), None)]);
}

/// The agent's copy follows each layout change once: the first layout, a change, and back.
#[test]
fn the_layout_config_is_rebuilt_only_when_the_layout_changes() {
    let yaml = "evictionHard:\n  nodefs.available: 10%\n  imagefs.available: 15%\n";
    let mut lc = LayoutConfig::new(load_yaml(yaml, &flags()).expect("config"));
    let containerfs = |c: &EvictionConfig| {
        c.thresholds
            .iter()
            .filter(|t| t.signal == Signal::ContainerFsAvailable)
            .map(|t| t.value.to_string())
            .collect::<Vec<_>>()
    };
    let image = FsLayout {
        dedicated_image_fs: true,
        split_container_image_fs: false,
    };
    let first = lc.update(FsLayout::default()).expect("first layout");
    assert_eq!(containerfs(&first), ["10%"]);
    assert!(lc.update(FsLayout::default()).is_none());
    let changed = lc.update(image).expect("changed layout");
    assert_eq!(containerfs(&changed), ["15%"]);
    assert!(lc.update(image).is_none());
    let back = lc.update(FsLayout::default()).expect("back");
    assert_eq!(containerfs(&back), ["10%"]);
}

#[test]
fn kubelet_config_path_defaults_turns_off_and_must_be_absolute() {
    let c = load_yaml("{}", &flags()).expect("default");
    assert_eq!(c.node_monitor.kubelet_config_path, "auto");
    let c = load_yaml(
        "nodeMonitor:\n  kubeletConfigPath: /var/lib/kubelet/config.yaml\n",
        &flags(),
    )
    .expect("a path");
    assert_eq!(
        c.node_monitor.kubelet_config_path,
        "/var/lib/kubelet/config.yaml"
    );
    for off in [
        "nodeMonitor:\n  kubeletConfigPath: \"\"\n",
        "nodeMonitor:\n  kubeletConfigPath: null\n",
    ] {
        let c = load_yaml(off, &flags()).expect(off);
        assert_eq!(c.node_monitor.kubelet_config_path, "", "{off}");
    }
    let err = load_yaml(
        "nodeMonitor:\n  kubeletConfigPath: kubelet.yaml\n",
        &flags(),
    )
    .expect_err("relative")
    .to_string();
    assert!(
        err.contains("nodeMonitor.kubeletConfigPath") && err.contains("kubelet.yaml"),
        "{err}"
    );
    let err = load_yaml("nodeMonitor:\n  kubeletConfigPath: 3\n", &flags())
        .expect_err("number")
        .to_string();
    assert!(
        err.contains("kubeletConfigPath") && err.contains("the number 3"),
        "{err}"
    );
}

#[test]
fn state_dir_defaults_turns_off_and_must_be_absolute() {
    let c = load_yaml("{}", &flags()).expect("default");
    assert_eq!(c.node_monitor.state_dir, "/var/lib/node-monitor");
    for off in [
        "nodeMonitor:\n  stateDir: \"\"\n",
        "nodeMonitor:\n  stateDir: null\n",
    ] {
        let c = load_yaml(off, &flags()).expect("off");
        assert_eq!(c.node_monitor.state_dir, "", "{off}");
    }
    let err = load_yaml("nodeMonitor:\n  stateDir: state\n", &flags())
        .expect_err("relative")
        .to_string();
    assert!(
        err.contains("nodeMonitor.stateDir") && err.contains("state"),
        "{err}"
    );
}

#[test]
fn local_storage_capacity_isolation_defaults_on_and_is_read() {
    let load = |text: &str| {
        load_sources(
            &[ConfigSource {
                name: "config.yaml",
                text,
            }],
            &EvictionOverrides::default(),
        )
        .expect("config")
    };
    assert!(load("").local_storage_capacity_isolation);
    assert!(EvictionConfig::default().local_storage_capacity_isolation);
    assert!(!load("localStorageCapacityIsolation: false\n").local_storage_capacity_isolation);
    let err = load_sources(
        &[ConfigSource {
            name: "config.yaml",
            text: "localStorageCapacityIsolation: sometimes\n",
        }],
        &EvictionOverrides::default(),
    )
    .expect_err("not a boolean");
    assert!(
        err.to_string().contains("localStorageCapacityIsolation"),
        "{err}"
    );
}
