use std::collections::HashMap;

use serde_json::json;

use super::*;

const MI: i64 = 1 << 20;

/// A pass's sample: memory signals only, their thresholds for the capacity, the top pods by
/// working set with their names, the decision's thresholds and pods.
#[test]
fn a_sample_keeps_memory_signals_top_pods_and_the_decision() {
    use node_monitor_core::{
        config::{ConfigSource, EvictionOverrides, load_sources},
        eviction::{EvictionState, synchronize},
        signals::{Signal, SignalObservation},
        units::clock::Timestamp,
    };
    let config = load_sources(
        &[ConfigSource {
            name: "test",
            text: "evictionHard:\n  memory.available: 400Mi\n  nodefs.available: 10%\n\
                   evictionSoft:\n  memory.available: 25%\n\
                   evictionSoftGracePeriod:\n  memory.available: 30s\n",
        }],
        &EvictionOverrides::default(),
    )
    .expect("config");
    let mut obs = Observations::default();
    obs.signals.insert(
        Signal::MemoryAvailable,
        SignalObservation {
            available: 300 * MI,
            capacity: 1000 * MI,
        },
    );
    obs.signals.insert(
        Signal::NodeFsAvailable,
        SignalObservation {
            available: 1 << 40,
            capacity: 2 << 40,
        },
    );
    let figures: HashMap<String, PodUsage> = (0..8u64)
        .map(|i| {
            (
                format!("uid-{i}"),
                PodUsage {
                    memory: Some(i << 20),
                    ..PodUsage::default()
                },
            )
        })
        .chain([("uid-none".to_owned(), PodUsage::default())])
        .collect();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "seven", "namespace": "default", "uid": "uid-7"},
        "spec": {"containers": [{"name": "app"}]}
    }))
    .expect("pod");
    let pods = vec![PodInfo::from_pod(&pod).expect("pod info")];
    obs.pods = figures.clone();
    let decision = synchronize(
        &mut EvictionState::new(),
        &config,
        &obs,
        &pods,
        Timestamp::ZERO,
    );
    let s = sample_of(
        5,
        &config.thresholds,
        &obs,
        &decision,
        &pods,
        Some((250, &figures)),
        None,
    );
    assert_eq!(s.at_ms, 5);
    assert_eq!(
        s.signals,
        [SignalPoint {
            signal: "memory.available".into(),
            available: 300 * MI,
            capacity: 1000 * MI,
            hard: Some(400 * MI),
            soft: Some(250 * MI),
        }]
    );
    let top: Vec<&str> = s.top_pods.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(top, ["default/seven", "uid-6", "uid-5", "uid-4", "uid-3"]);
    assert_eq!(s.pod_figures_age_ms, Some(250));
    assert_eq!(s.thresholds_met, ["memory.available hard"]);
    assert_eq!(s.evict, ["default/seven"]);
    let none = sample_of(5, &config.thresholds, &obs, &decision, &pods, None, None);
    assert!(none.top_pods.is_empty() && none.pod_figures_age_ms.is_none());
}

/// PSI from a pressure file; an unreadable or malformed one gives none.
#[test]
fn psi_is_read_from_its_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("memory.pressure");
    std::fs::write(
        &path,
        "some avg10=12.50 avg60=1.00 avg300=0.00 total=777\nfull avg10=3.25 avg60=0.00 avg300=0.00 total=55\n",
    )
    .expect("write");
    assert_eq!(
        read_psi(&path),
        Some(PsiPoint {
            some_avg10: 12.5,
            full_avg10: 3.25,
            some_total_us: 777,
            full_total_us: 55
        })
    );
    std::fs::write(&path, "garbage").expect("write");
    assert_eq!(read_psi(&path), None);
    assert_eq!(read_psi(&dir.path().join("missing")), None);
}

/// Every pod with a memory figure, named as the samples name it (the UID when unknown).
#[test]
fn named_figures_name_every_pod_with_a_memory_figure() {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "seven", "namespace": "default", "uid": "uid-7"},
        "spec": {"containers": [{"name": "app"}]}
    }))
    .expect("pod");
    let pods = vec![PodInfo::from_pod(&pod).expect("pod info")];
    let figures: HashMap<String, PodUsage> = [
        ("uid-7", Some(7 << 20)),
        ("uid-8", Some(8 << 20)),
        ("uid-9", None),
    ]
    .into_iter()
    .map(|(uid, memory)| {
        (
            uid.to_owned(),
            PodUsage {
                memory,
                ..PodUsage::default()
            },
        )
    })
    .collect();
    let mut named = named_figures(&pods, &figures);
    named.sort_by(|a, b| a.pod.cmp(&b.pod));
    assert_eq!(
        named,
        [
            PodPoint {
                pod: "default/seven".into(),
                working_set: 7 << 20
            },
            PodPoint {
                pod: "uid-8".into(),
                working_set: 8 << 20
            },
        ]
    );
}
