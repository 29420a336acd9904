use super::*;
use crate::{config::tests::assert_rejections, kubelet::pod::SYSTEM_CRITICAL_PRIORITY};

#[test]
fn no_file_or_no_fields_means_off() {
    for text in [
        None,
        Some(""),
        Some("evictionHard:\n  memory.available: 100Mi\n"),
    ] {
        let c = parse_shutdown_config(text).expect("valid");
        assert!(!c.options.enabled, "{text:?}");
        assert!(c.groups.is_empty());
        assert_eq!(c.needed_inhibit_delay(), Duration::ZERO);
    }
}

/// A real KubeletConfiguration document, with fields node-monitor does not read.
#[test]
fn kubelet_fields_at_the_top_level() {
    let text = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                    cgroupDriver: systemd\nshutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n";
    let c = parse_shutdown_config(Some(text)).expect("legacy form");
    assert!(c.options.enabled);
    let got: Vec<(i32, u64)> = c
        .groups
        .iter()
        .map(|g| (g.priority, g.period.as_secs()))
        .collect();
    assert_eq!(got, vec![(0, 20), (SYSTEM_CRITICAL_PRIORITY, 10)]);
    assert_eq!(c.budget(), Duration::from_secs(30));
    assert_eq!(c.needed_inhibit_delay(), Duration::from_secs(35));

    let text = "shutdownGracePeriodByPodPriority:\n  - priority: 100000\n    shutdownGracePeriodSeconds: 10\n  - priority: 0\n    shutdownGracePeriodSeconds: 60\n  - shutdownGracePeriodSeconds: 5\n    priority: 1000\n";
    let c = parse_shutdown_config(Some(text)).expect("priority form");
    let got: Vec<(i32, u64)> = c
        .groups
        .iter()
        .map(|g| (g.priority, g.period.as_secs()))
        .collect();
    assert_eq!(got, vec![(0, 60), (1_000, 5), (100_000, 10)]);
}

#[test]
fn node_monitor_options() {
    let text = "shutdownGracePeriod: 20s\nnodeMonitor:\n  dryRun: false\n  shutdown:\n    enabled: true\n    manageInhibitDelay: false\n    inhibitDelayMargin: 2s\n    kubeletInhibitorPolicy: takeOver\n    cordon: true\n    lastGasp: annotation\n    lastGaspTimeout: 500ms\n    pollInterval: 100ms\n";
    let c = parse_shutdown_config(Some(text)).expect("options");
    assert_eq!(
        c.options,
        ShutdownOptions {
            enabled: true,
            manage_inhibit_delay: false,
            inhibit_delay_margin: Duration::from_secs(2),
            kubelet_inhibitor_policy: KubeletInhibitorPolicy::TakeOver,
            cordon: true,
            last_gasp: LastGasp::Annotation,
            last_gasp_timeout: Duration::from_millis(500),
            poll_interval: Duration::from_millis(100),
        }
    );
    assert_eq!(c.needed_inhibit_delay(), Duration::from_secs(22));
    let json = serde_json::to_value(&c.options).expect("json");
    assert_eq!(json["kubeletInhibitorPolicy"], "takeOver");
    assert_eq!(json["lastGaspTimeout"], "500ms");
    // Explicitly off, with groups configured.
    let c = parse_shutdown_config(Some(
        "shutdownGracePeriod: 20s\nnodeMonitor:\n  shutdown:\n    enabled: false\n",
    ))
    .expect("off");
    assert!(!c.options.enabled);
    // On without groups: watched only, with a warning.
    let c = parse_shutdown_config(Some("nodeMonitor:\n  shutdown:\n    enabled: true\n"))
        .expect("watch");
    assert!(c.options.enabled && c.groups.is_empty());
    assert!(
        c.warnings.iter().any(|w| w.contains("no inhibitor")),
        "{:?}",
        c.warnings
    );
}

/// Bad shutdown settings, each with what its error must name.
const BAD_INPUT: &[(&str, &[&str])] = &[
    (
        "shutdownGracePeriod: 30\n",
        &["shutdownGracePeriod", "duration string", "30"],
    ),
    (
        "shutdownGracePeriod: 30 seconds\n",
        &["shutdownGracePeriod", "\"30 seconds\""],
    ),
    (
        "shutdownGracePeriod: -30s\n",
        &["shutdownGracePeriod", "-30s", "negative"],
    ),
    (
        "shutdownGracePeriod: 300ms\n",
        &["shutdownGracePeriod", "300ms", ">= 1s"],
    ),
    (
        "shutdownGracePeriod: 10s\nshutdownGracePeriodCriticalPods: 20s\n",
        &["shutdownGracePeriodCriticalPods", "20s", "10s"],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 0\n    shutdownGracePeriodSeconds: 10\n  - priority: 0\n    shutdownGracePeriodSeconds: 5\n",
        &[
            "shutdownGracePeriodByPodPriority",
            "priority 0",
            "more than once",
        ],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 0\n    shutdownGracePeriodSeconds: -1\n",
        &["shutdownGracePeriodSeconds", "-1", "negative"],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 0\n    shutdownGracePeriodSecond: 10\n",
        &[
            "shutdownGracePeriodByPodPriority[0]",
            "\"shutdownGracePeriodSecond\"",
        ],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 3000000000\n",
        &[
            "shutdownGracePeriodByPodPriority[0].priority",
            "3000000000",
            "32-bit",
        ],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: high\n",
        &["shutdownGracePeriodByPodPriority[0].priority", "high"],
    ),
    (
        "shutdownGracePeriodByPodPriority: 10\n",
        &["shutdownGracePeriodByPodPriority", "a list"],
    ),
    (
        "shutdownGracePeriod: 10s\nshutdownGracePeriodByPodPriority:\n  - priority: 0\n    shutdownGracePeriodSeconds: 10\n",
        &["both set"],
    ),
    (
        "nodeMonitor:\n  shutdown: yes\n",
        &["nodeMonitor.shutdown", "a mapping"],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    cordn: true\n",
        &[
            "nodeMonitor.shutdown",
            "unknown setting \"cordn\"",
            "cordon",
        ],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    cordon: sometimes\n",
        &["nodeMonitor.shutdown.cordon", "a boolean", "\"sometimes\""],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    kubeletInhibitorPolicy: fight\n",
        &[
            "nodeMonitor.shutdown.kubeletInhibitorPolicy",
            "\"fight\"",
            "takeOver",
        ],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    lastGasp: scream\n",
        &["nodeMonitor.shutdown.lastGasp", "\"scream\""],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    lastGaspTimeout: 1ms\n",
        &[
            "nodeMonitor.shutdown.lastGaspTimeout",
            "\"1ms\"",
            "at least 100ms",
        ],
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
        "nodeMonitor:\n  shutdown:\n    pollInterval: soon\n",
        &["nodeMonitor.shutdown.pollInterval", "\"soon\""],
    ),
    (
        "shutdownGracePeriodCriticalPods: -5s\nshutdownGracePeriod: 10s\n",
        &["shutdownGracePeriodCriticalPods", "-5s", "negative"],
    ),
    // Go's zero values for a left-out priority: two entries at priority 0.
    (
        "shutdownGracePeriodByPodPriority:\n  - shutdownGracePeriodSeconds: 5\n  - {}\n",
        &[
            "shutdownGracePeriodByPodPriority",
            "priority 0",
            "more than once",
        ],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 0\n    shutdownGracePeriodSeconds: ten\n",
        &[
            "shutdownGracePeriodByPodPriority[0].shutdownGracePeriodSeconds",
            "\"ten\"",
            "integer",
        ],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - [priority, 0]\n",
        &["shutdownGracePeriodByPodPriority[0]", "a mapping", "a list"],
    ),
    // Each period is a valid int64, their sum is more than logind can wait for.
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 0\n    shutdownGracePeriodSeconds: 9223372036854775807\n  - priority: 1\n    shutdownGracePeriodSeconds: 9223372036854775807\n",
        &[
            "shutdownGracePeriodByPodPriority",
            "need 18446744073709551614s in total",
            "InhibitDelayMaxSec",
        ],
    ),
    (
        "shutdownGracePeriodByPodPriority:\n  - priority: 0\n    shutdownGracePeriodSeconds: 18446744073709\nnodeMonitor:\n  shutdown:\n    inhibitDelayMargin: 1s\n",
        &[
            "nodeMonitor.shutdown.inhibitDelayMargin",
            "\"1s\"",
            "(18446744073710s)",
            "InhibitDelayMaxSec",
        ],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    pollInterval: 10ms\n",
        &[
            "nodeMonitor.shutdown.pollInterval",
            "\"10ms\"",
            "at least 50ms",
        ],
    ),
    (
        "nodeMonitor:\n  shutdown:\n    enabled: 1\n",
        &["nodeMonitor.shutdown.enabled", "a boolean", "the number 1"],
    ),
    ("- a\n- list\n", &["config file", "expected a mapping"]),
    (
        "shutdownGracePeriod: [\n",
        &["config file", "not a valid YAML"],
    ),
];

/// Every rejection names the field and the value.
#[test]
fn rejects_bad_input_naming_field_and_value() {
    let cases = BAD_INPUT;
    assert_rejections(cases, |text| parse_shutdown_config(Some(text)));
}

/// Without `manageInhibitDelay`, a budget above logind's default delay is accepted with a
/// warning naming what the nodes' logind must allow; with it, or within 5s, no warning.
#[test]
fn unmanaged_inhibit_delay_warns_when_above_logind_default() {
    let cases: &[(&str, Option<&str>)] = &[
        (
            "shutdownGracePeriod: 30s\nnodeMonitor:\n  shutdown:\n    manageInhibitDelay: false\n",
            Some("need 35s"),
        ),
        ("shutdownGracePeriod: 30s\n", None),
        (
            "shutdownGracePeriod: 3s\nnodeMonitor:\n  shutdown:\n    manageInhibitDelay: false\n    inhibitDelayMargin: 2s\n",
            None,
        ),
        (
            "shutdownGracePeriod: 30s\nnodeMonitor:\n  shutdown:\n    manageInhibitDelay: false\n    enabled: false\n",
            None,
        ),
    ];
    for (text, want) in cases {
        let c = parse_shutdown_config(Some(text)).expect(text);
        let warning = c.warnings.iter().find(|w| w.contains("manageInhibitDelay"));
        match want {
            Some(w) => assert!(
                warning.is_some_and(|got| got.contains(w) && got.contains("default 5s")),
                "{text:?}: {:?}",
                c.warnings
            ),
            None => assert!(warning.is_none(), "{text:?}: {:?}", c.warnings),
        }
    }
}

/// The key lists are the parser's: every listed key is read (a wrong type is rejected naming
/// it), and other top-level fields are skipped.
#[test]
fn key_lists_are_what_the_parser_reads() {
    for key in SHUTDOWN_FILE_FIELDS {
        let err = parse_shutdown_config(Some(&format!("{key}: [[1]]\n")))
            .expect_err(key)
            .to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
    for key in SHUTDOWN_OPTION_KEYS {
        let err = parse_shutdown_config(Some(&format!(
            "nodeMonitor:\n  shutdown:\n    {key}: [[1]]\n"
        )))
        .expect_err(key)
        .to_string();
        assert!(
            err.contains(&format!("nodeMonitor.shutdown.{key}")),
            "{err}"
        );
    }
    for key in PRIORITY_ENTRY_KEYS {
        let err = parse_shutdown_config(Some(&format!(
            "shutdownGracePeriodByPodPriority:\n  - {key}: [[1]]\n"
        )))
        .expect_err(key)
        .to_string();
        assert!(
            err.contains(&format!("shutdownGracePeriodByPodPriority[0].{key}")),
            "{err}"
        );
    }
    let c = parse_shutdown_config(Some("shutdownGracePeriods: [[1]]\nmaxPods: 110\n"))
        .expect("other fields are skipped");
    assert!(c.groups.is_empty());
}

/// The eviction parser accepts the `shutdown` block and leaves it to this one.
#[test]
fn eviction_config_accepts_the_shutdown_block() {
    let text = "nodeMonitor:\n  dryRun: true\n  shutdown:\n    cordon: true\n";
    let c = crate::config::load(Some(text), &crate::config::EvictionOverrides::default())
        .expect("eviction config");
    assert!(c.node_monitor.dry_run);
    assert!(
        parse_shutdown_config(Some(text))
            .expect("shutdown")
            .options
            .cordon
    );
}
