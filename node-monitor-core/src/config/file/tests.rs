use super::*;
use crate::{
    config::{ConfigSource, EvictionOverrides, load_sources},
    shutdown::config::parse_shutdown_config,
};

/// Documents the model refuses, each with its whole message: the field's path and the value.
const REFUSED: &[(&str, &str)] = &[
    (
        "evictionHard:\n  memory.available: 100\n",
        "evictionHard[\"memory.available\"]: expected a string (quote numbers: \"0\", \"100Mi\"), \
         found the number 100",
    ),
    (
        "evictionHard:\n  1: 100Mi\n",
        "evictionHard: expected string keys, found the number 1",
    ),
    (
        "evictionSoft: [memory.available]\n",
        "evictionSoft: expected a mapping of signal names to strings, found a list",
    ),
    (
        "evictionMaxPodGracePeriod: 1.5\n",
        "evictionMaxPodGracePeriod: \"1.5\" is not a 32-bit integer",
    ),
    (
        "evictionPressureTransitionPeriod: 300\n",
        "evictionPressureTransitionPeriod: expected a duration string such as \"30s\", found the \
         number 300",
    ),
    (
        "enforceNodeAllocatable: [pods, 1]\n",
        "enforceNodeAllocatable[1]: expected a list of strings, found the number 1",
    ),
    (
        "nodeMonitor: 5\n",
        "nodeMonitor: expected a mapping, found the number 5",
    ),
    (
        "nodeMonitor:\n  1: 2\n",
        "nodeMonitor: expected string keys, found the number 1",
    ),
    (
        "nodeMonitor:\n  dryRun: null\n",
        "nodeMonitor.dryRun: expected a boolean, found null",
    ),
    (
        "nodeMonitor:\n  pdbPolicy: ignore\n",
        "nodeMonitor.pdbPolicy: \"ignore\" must be \"respect\" or \"escalate\"",
    ),
    (
        "nodeMonitor:\n  maxPodsPerCycle: two\n",
        "nodeMonitor.maxPodsPerCycle: expected a positive integer, found the string \"two\"",
    ),
    (
        "nodeMonitor:\n  shutdown:\n    lastGasp: !loud scream\n",
        "nodeMonitor.shutdown.lastGasp: expected none, condition or annotation, found a value \
         tagged !loud",
    ),
    (
        "nodeMonitor:\n  shutdown:\n    kubeletInhibitorPolicy: fight\n",
        "nodeMonitor.shutdown.kubeletInhibitorPolicy: \"fight\" must be \"takeOver\", \
         \"cooperate\" or \"standAside\"",
    ),
    (
        "nodeMonitor:\n  shutdown:\n    cordn: true\n",
        "nodeMonitor.shutdown: unknown setting \"cordn\"; known settings: enabled, \
         manageInhibitDelay, inhibitDelayMargin, kubeletInhibitorPolicy, cordon, lastGasp, \
         lastGaspTimeout, pollInterval",
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 0\n  - priority: null\n",
        "shutdownGracePeriodByPodPriority[1].priority: \"null\" is not a 32-bit integer",
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - {1: 2}\n",
        "shutdownGracePeriodByPodPriority[0]: expected string keys, found the number 1",
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - {}\n  - prio: 1\n",
        "shutdownGracePeriodByPodPriority[1]: unknown setting \"prio\"; known settings: priority, \
         shutdownGracePeriodSeconds",
    ),
    (
        "true\n",
        "expected a mapping of KubeletConfiguration fields, found the boolean true",
    ),
];

#[test]
fn refusals_name_the_path_and_the_value() {
    for (text, want) in REFUSED {
        match ConfigFile::read(text) {
            Ok(file) => panic!("{text:?} should be refused, got {file:?}"),
            Err(e) => assert_eq!(e.to_string(), *want, "{text:?}"),
        }
    }
}

/// A kubelet's own file reads as it is: the fields the model does not read, and keys that are
/// not strings, are skipped; `null` at the top level is an absent field.
#[test]
fn a_kubelet_file_reads_into_the_model() {
    let text = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
1: not a field
cgroupDriver: systemd
evictionHard:
  memory.available: 200Mi
evictionSoft: null
evictionMaxPodGracePeriod: 30
mergeDefaultEvictionSettings: true
enforceNodeAllocatable: [pods]
shutdownGracePeriod: 30s
shutdownGracePeriodByPodPriority:
  - priority: 1000
    shutdownGracePeriodSeconds: 20
  - shutdownGracePeriodSeconds: 5
nodeMonitor:
  dryRun: true
  pdbPolicy: escalate
  shutdown:
    lastGasp: annotation
";
    let file = ConfigFile::read(text).expect("a kubelet file");
    let hard = file.eviction_hard.as_ref().expect("evictionHard");
    assert_eq!(
        hard.0.get("memory.available").map(String::as_str),
        Some("200Mi")
    );
    assert_eq!(file.eviction_soft, None);
    assert_eq!(file.eviction_max_pod_grace_period, Some(Int32(30)));
    assert_eq!(file.merge_default_eviction_settings, Some(Flag(true)));
    assert_eq!(
        file.enforce_node_allocatable,
        Some(StringList(vec!["pods".into()]))
    );
    assert_eq!(file.shutdown_grace_period, Some(DurationText("30s".into())));
    let priorities = file
        .shutdown_grace_period_by_pod_priority
        .as_ref()
        .expect("list");
    let got: Vec<_> = priorities
        .0
        .iter()
        .map(|e| (e.priority, e.shutdown_grace_period_seconds))
        .collect();
    assert_eq!(
        got,
        [
            (Some(Priority(1000)), Some(Seconds(20))),
            (None, Some(Seconds(5)))
        ]
    );
    let nm = file.node_monitor.as_ref().expect("nodeMonitor");
    assert_eq!(nm.dry_run, Some(Flag(true)));
    assert_eq!(nm.pdb_policy, Some(PdbPolicy::Escalate));
    assert_eq!(nm.max_pods_per_cycle, None);
    let shutdown = nm.shutdown.as_ref().expect("shutdown");
    assert_eq!(shutdown.last_gasp, Some(LastGasp::Annotation));
    assert_eq!(ConfigFile::read("").expect("empty"), ConfigFile::default());
}

/// One reader for the whole file: the eviction settings refuse what the file's shutdown part
/// holds wrongly, and the shutdown settings what its eviction part holds wrongly, each naming
/// the field and the value.
#[test]
fn both_settings_refuse_a_bad_value_anywhere_in_the_file() {
    let eviction = |text: &str| {
        load_sources(
            &[ConfigSource {
                name: "node-monitor.yaml",
                text,
            }],
            &EvictionOverrides::default(),
        )
        .expect_err(text)
        .to_string()
    };
    let shutdown = |text: &str| {
        parse_shutdown_config(Some(text))
            .expect_err(text)
            .to_string()
    };
    let cases: [(String, &str); 4] = [
        (
            eviction("nodeMonitor:\n  shutdown:\n    cordn: true\n"),
            "node-monitor.yaml: nodeMonitor.shutdown: unknown setting \"cordn\"",
        ),
        (
            eviction("shutdownGracePeriod: 30\n"),
            "node-monitor.yaml: shutdownGracePeriod: expected a duration string such as \"30s\", \
             found the number 30",
        ),
        (
            shutdown("nodeMonitor:\n  dryRun: maybe\n"),
            "nodeMonitor.dryRun: expected a boolean, found the string \"maybe\"",
        ),
        (
            shutdown("evictionHard:\n  memory.available: 100\n"),
            "evictionHard[\"memory.available\"]: expected a string",
        ),
    ];
    for (got, want) in cases {
        assert!(got.starts_with(want), "{got:?} should start with {want:?}");
    }
}

/// With several documents, each `nodeMonitor` key comes from the last document that sets it, and
/// its error names that document.
#[test]
fn a_merged_key_is_named_with_its_document() {
    let load = |a: &str, b: &str| {
        load_sources(
            &[
                ConfigSource { name: "a", text: a },
                ConfigSource { name: "b", text: b },
            ],
            &EvictionOverrides::default(),
        )
    };
    let e = load(
        "nodeMonitor:\n  psiWindow: 20s\n",
        "nodeMonitor:\n  dryRun: true\n",
    )
    .expect_err("psiWindow out of range")
    .to_string();
    assert!(e.starts_with("a: nodeMonitor.psiWindow: \"20s\""), "{e}");
    let c = load(
        "nodeMonitor:\n  psiWindow: 20s\n",
        "nodeMonitor:\n  psiWindow: 4s\n",
    )
    .expect("the later document replaces the key");
    assert_eq!(c.node_monitor.psi_window, std::time::Duration::from_secs(4));
}
