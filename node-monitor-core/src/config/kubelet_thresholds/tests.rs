use super::*;
use crate::config::EvictionConfig;

const GI: i64 = 1 << 30;

fn kubelet(text: &str) -> Vec<Threshold> {
    parse_kubelet_config("/var/lib/kubelet/config.yaml", text)
        .expect("valid kubelet config")
        .thresholds
}

/// The kubelet's defaults, without the allocatable copy.
fn default_hard() -> Vec<Threshold> {
    own_thresholds(&EvictionConfig::default().thresholds)
        .cloned()
        .collect()
}

fn ours(text: &str) -> Vec<Threshold> {
    config::load(Some(text), &EvictionOverrides::default())
        .expect("valid config")
        .thresholds
}

fn capacities(pairs: &[(Signal, i64)]) -> BTreeMap<Signal, SignalObservation> {
    pairs
        .iter()
        .map(|&(s, capacity)| {
            (
                s,
                SignalObservation {
                    available: capacity,
                    capacity,
                },
            )
        })
        .collect()
}

fn verdicts(c: &[Comparison]) -> Vec<(Signal, Kind, Precedence)> {
    c.iter().map(|c| (c.signal, c.kind, c.precedence)).collect()
}

#[test]
fn a_file_without_eviction_fields_gets_the_kubelet_defaults() {
    let k = parse_kubelet_config(
        "config.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n",
    )
    .expect("valid");
    assert_eq!(k.thresholds, default_hard());
    assert_eq!(
        k.pressure_transition_period,
        config::DEFAULT_PRESSURE_TRANSITION_PERIOD
    );
}

#[test]
fn the_eviction_fields_are_read() {
    let k = parse_kubelet_config(
        "config.yaml",
        "evictionHard:\n  memory.available: 500Mi\nevictionSoft:\n  memory.available: 1Gi\n\
         evictionSoftGracePeriod:\n  memory.available: 1m30s\n\
         evictionMinimumReclaim:\n  memory.available: 200Mi\n\
         evictionPressureTransitionPeriod: 1m\n",
    )
    .expect("valid");
    assert_eq!(k.pressure_transition_period, Duration::from_secs(60));
    assert_eq!(k.thresholds.len(), 2);
    let soft = k
        .thresholds
        .iter()
        .find(|t| t.source == ThresholdSource::EvictionSoft)
        .expect("soft");
    assert_eq!(soft.grace_period, Duration::from_secs(90));
    assert_eq!(
        soft.value,
        ThresholdValue::Quantity("1Gi".parse().expect("quantity"))
    );
    assert!(k.thresholds.iter().all(|t| t.min_reclaim.is_some()));
}

#[test]
fn a_nodemonitor_section_in_the_kubelet_file_is_ignored() {
    let k = parse_kubelet_config("config.yaml", "nodeMonitor:\n  bogus: 1\n");
    // `ConfigFile::read` refuses unknown nodeMonitor keys before the section is dropped: a
    // kubelet's own file never has one, so that refusal is acceptable and named.
    let err = k.expect_err("refused").to_string();
    assert!(err.contains("config.yaml"), "{err}");
    let k = parse_kubelet_config("config.yaml", "nodeMonitor:\n  dryRun: true\n").expect("ok");
    assert_eq!(k.thresholds, default_hard());
}

#[test]
fn malformed_values_name_the_file_field_and_value() {
    for (text, field, value) in [
        (
            "evictionHard:\n  memory.available: lots\n",
            "evictionHard",
            "lots",
        ),
        (
            "evictionSoft:\n  nodefs.available: 150%\n",
            "evictionSoft",
            "150%",
        ),
        (
            "evictionPressureTransitionPeriod: soon\n",
            "evictionPressureTransitionPeriod",
            "soon",
        ),
        (
            "evictionMinimumReclaim:\n  memory.available: -1Mi\n",
            "evictionMinimumReclaim",
            "-1Mi",
        ),
    ] {
        let err = parse_kubelet_config("/var/lib/kubelet/config.yaml", text)
            .expect_err(text)
            .to_string();
        for needle in ["/var/lib/kubelet/config.yaml", field, value] {
            assert!(err.contains(needle), "{text:?}: {err:?} lacks {needle:?}");
        }
    }
}

#[test]
fn kubelet_defaults_against_node_monitor_defaults_kubelet_acts_first_everywhere() {
    let k = kubelet("{}");
    let nm = ours("{}");
    let c = compare(
        &k,
        &nm,
        &capacities(&[
            (Signal::MemoryAvailable, 8 * GI),
            (Signal::NodeFsAvailable, 100 * GI),
        ]),
    );
    assert_eq!(c.len(), 5);
    assert!(
        c.iter()
            .all(|c| c.precedence == Precedence::KubeletFirst && c.kind == Kind::Hard),
        "{c:?}"
    );
}

/// A comparison case: name, the kubelet's file, node-monitor's, capacities, verdicts.
type Case = (
    &'static str,
    &'static str,
    &'static str,
    &'static [(Signal, i64)],
    &'static [(Signal, Kind, Precedence)],
);

const MEM: Signal = Signal::MemoryAvailable;
const NODEFS: Signal = Signal::NodeFsAvailable;

const CASES: &[Case] = &[
    (
        "kubelet 500Mi above ours 100Mi",
        "evictionHard:\n  memory.available: 500Mi\n",
        "evictionHard:\n  memory.available: 100Mi\n",
        &[],
        &[(MEM, Kind::Hard, Precedence::KubeletFirst)],
    ),
    (
        "equal thresholds: the kubelet acts at the same point",
        "evictionHard:\n  memory.available: 300Mi\n",
        "evictionHard:\n  memory.available: 300Mi\n",
        &[],
        &[(MEM, Kind::Hard, Precedence::KubeletFirst)],
    ),
    (
        "ours above the kubelet's",
        "evictionHard:\n  memory.available: 100Mi\n",
        "evictionHard:\n  memory.available: 300Mi\n",
        &[],
        &[(MEM, Kind::Hard, Precedence::NodeMonitorFirst)],
    ),
    (
        "kubelet without the signal",
        "evictionHard:\n  nodefs.available: 10%\n",
        "evictionHard:\n  memory.available: 300Mi\n",
        &[],
        &[(MEM, Kind::Hard, Precedence::KubeletUnset)],
    ),
    (
        "percentage against quantity, resolved: 10% of 8Gi is above 500Mi",
        "evictionHard:\n  memory.available: 10%\n",
        "evictionHard:\n  memory.available: 500Mi\n",
        &[(MEM, 8 * GI)],
        &[(MEM, Kind::Hard, Precedence::KubeletFirst)],
    ),
    (
        "percentage against quantity, resolved: 10% of 2Gi is below 500Mi",
        "evictionHard:\n  memory.available: 10%\n",
        "evictionHard:\n  memory.available: 500Mi\n",
        &[(MEM, 2 * GI)],
        &[(MEM, Kind::Hard, Precedence::NodeMonitorFirst)],
    ),
    (
        "percentage against quantity, capacity unknown: undecided, left out",
        "evictionHard:\n  memory.available: 10%\n",
        "evictionHard:\n  memory.available: 500Mi\n",
        &[],
        &[],
    ),
    (
        "percentages, capacity unknown: like with like",
        "evictionHard:\n  nodefs.available: 15%\n",
        "evictionHard:\n  nodefs.available: 10%\n",
        &[],
        &[(NODEFS, Kind::Hard, Precedence::KubeletFirst)],
    ),
    (
        "a kubelet soft threshold does not preempt our hard one",
        "evictionHard:\n  memory.available: 50Mi\nevictionSoft:\n  memory.available: 1Gi\n\
             evictionSoftGracePeriod:\n  memory.available: 30s\n",
        "evictionHard:\n  memory.available: 300Mi\n",
        &[],
        &[(MEM, Kind::Hard, Precedence::NodeMonitorFirst)],
    ),
    (
        "our soft one: a kubelet soft threshold above it with a shorter grace period",
        "evictionHard:\n  memory.available: 50Mi\nevictionSoft:\n  memory.available: 1Gi\n\
             evictionSoftGracePeriod:\n  memory.available: 30s\n",
        "evictionHard:\n  memory.available: 100Mi\nevictionSoft:\n  memory.available: 800Mi\n\
             evictionSoftGracePeriod:\n  memory.available: 1m\n",
        &[],
        &[
            (MEM, Kind::Hard, Precedence::NodeMonitorFirst),
            (MEM, Kind::Soft, Precedence::KubeletFirst),
        ],
    ),
    (
        "our soft one: a kubelet soft threshold above it but waiting longer",
        "evictionHard:\n  memory.available: 50Mi\nevictionSoft:\n  memory.available: 1Gi\n\
             evictionSoftGracePeriod:\n  memory.available: 5m\n",
        "evictionHard:\n  memory.available: 100Mi\nevictionSoft:\n  memory.available: 800Mi\n\
             evictionSoftGracePeriod:\n  memory.available: 1m\n",
        &[],
        &[
            (MEM, Kind::Hard, Precedence::NodeMonitorFirst),
            (MEM, Kind::Soft, Precedence::NodeMonitorFirst),
        ],
    ),
    (
        "our soft one: the kubelet's hard threshold above it acts first",
        "evictionHard:\n  memory.available: 1Gi\n",
        "evictionHard:\n  memory.available: 100Mi\nevictionSoft:\n  memory.available: 800Mi\n\
             evictionSoftGracePeriod:\n  memory.available: 1m\n",
        &[],
        &[
            (MEM, Kind::Hard, Precedence::KubeletFirst),
            (MEM, Kind::Soft, Precedence::KubeletFirst),
        ],
    ),
];

#[test]
fn table() {
    for &(name, k, nm, caps, want) in CASES {
        let got = compare(&kubelet(k), &ours(nm), &capacities(caps));
        assert_eq!(verdicts(&got), want, "{name}: {got:?}");
    }
}

#[test]
fn the_comparison_names_both_thresholds_resolved() {
    let got = compare(
        &kubelet("evictionHard:\n  memory.available: 10%\n"),
        &ours("evictionHard:\n  memory.available: 500Mi\n"),
        &capacities(&[(Signal::MemoryAvailable, 8 * GI)]),
    );
    assert_eq!(got[0].node_monitor, "500Mi");
    assert_eq!(got[0].kubelet.as_deref(), Some("10% (858993472)"));
}

#[test]
fn a_file_then_drop_ins_then_flags_as_the_kubelet_reads_them() {
    let hard = |k: &KubeletEviction| -> Vec<(Signal, String)> {
        k.thresholds
            .iter()
            .filter(|t| t.source == ThresholdSource::EvictionHard)
            .map(|t| (t.signal, t.value.to_string()))
            .collect()
    };
    let file = ConfigSource {
        name: "/etc/kubernetes/kubelet/config.json",
        text: r#"{"apiVersion":"kubelet.config.k8s.io/v1beta1","kind":"KubeletConfiguration",
                  "evictionHard":{"memory.available":"100Mi"},"evictionPressureTransitionPeriod":"1m"}"#,
    };
    let drop_in = ConfigSource {
        name: "/etc/kubernetes/kubelet/config.json.d/40-eviction.conf",
        text: "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
               evictionHard:\n  nodefs.available: 7%\n",
    };
    let none = EvictionOverrides::default();
    // The drop-in merges into the file's evictionHard key by key (a JSON merge patch) and
    // keeps its other fields.
    let k = parse_kubelet_layers(Some(file), &[drop_in], &none).expect("valid");
    assert_eq!(
        hard(&k),
        vec![
            (Signal::MemoryAvailable, "100Mi".to_owned()),
            (Signal::NodeFsAvailable, "7%".to_owned())
        ]
    );
    assert_eq!(k.pressure_transition_period, Duration::from_secs(60));
    // A file without evictionHard is defaulted before the drop-ins merge: one drop-in entry
    // keeps the other four defaults (where a file with that one entry would drop them).
    let bare = ConfigSource {
        name: "config.yaml",
        text: "kind: KubeletConfiguration\ncgroupDriver: systemd\n",
    };
    let mem = ConfigSource {
        name: "10-mem.conf",
        text: "kind: KubeletConfiguration\nevictionHard:\n  memory.available: 300Mi\n",
    };
    let k = parse_kubelet_layers(Some(bare), &[mem], &none).expect("valid");
    assert_eq!(hard(&k).len(), 5);
    assert!(hard(&k).contains(&(Signal::MemoryAvailable, "300Mi".to_owned())));
    // Drop-ins alone (k3s), a later one removing an entry with null.
    let drop = ConfigSource {
        name: "20-drop.conf",
        text: "kind: KubeletConfiguration\nevictionHard:\n  imagefs.inodesFree: null\n",
    };
    let k = parse_kubelet_layers(None, &[mem, drop], &none).expect("valid");
    assert_eq!(hard(&k).len(), 4);
    // The flags override everything.
    let flags = EvictionOverrides {
        eviction_hard: vec!["memory.available<750Mi,pid.available<1000".into()],
        eviction_pressure_transition_period: Some("30s".into()),
        ..EvictionOverrides::default()
    };
    let k = parse_kubelet_layers(Some(file), &[drop_in], &flags).expect("valid");
    assert_eq!(
        hard(&k),
        vec![
            (Signal::MemoryAvailable, "750Mi".to_owned()),
            (Signal::PidAvailable, "1k".to_owned())
        ]
    );
    assert_eq!(k.pressure_transition_period, Duration::from_secs(30));
    // Flags alone (a kubelet configured by flags, as AKS's is).
    let k = parse_kubelet_layers(None, &[], &flags).expect("valid");
    assert_eq!(hard(&k).len(), 2);
    // Nothing at all: the kubelet's defaults.
    let k = parse_kubelet_layers(None, &[], &none).expect("valid");
    assert_eq!(k.thresholds, default_hard());
    // A malformed flag, or a malformed drop-in, is named.
    let bad = EvictionOverrides {
        eviction_hard: vec!["memory.available<lots".into()],
        ..EvictionOverrides::default()
    };
    let e = parse_kubelet_layers(None, &[], &bad)
        .expect_err("malformed")
        .to_string();
    assert!(e.contains("--eviction-hard") && e.contains("lots"), "{e}");
    let broken = ConfigSource {
        name: "30-broken.conf",
        text: "evictionHard:\n  memory.available: plenty\n",
    };
    let e = parse_kubelet_layers(Some(file), &[broken], &none)
        .expect_err("malformed")
        .to_string();
    assert!(e.contains("30-broken.conf") && e.contains("plenty"), "{e}");
}
