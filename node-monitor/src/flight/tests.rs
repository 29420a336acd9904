use std::collections::HashMap;

use super::*;

const MI: i64 = 1 << 20;

/// A recorder's record of a climb to a node-wide OOM kill: samples every second with PSI, a
/// threshold crossing, a dry-run eviction, reclaim stalls and a kswapd wake-up.
pub(super) fn climb() -> FlightRecord {
    let mut r = FlightRecorder::new();
    r.set_dry_run(true);
    for i in 0..20u64 {
        let available = (400 - 18 * i64::try_from(i).expect("small")) * MI;
        let met = available < 100 * MI;
        r.sample(Sample {
            at_ms: 1_000_000 + i * 1000,
            signals: vec![SignalPoint {
                signal: "memory.available".into(),
                available,
                capacity: 1024 * MI,
                hard: Some(100 * MI),
                soft: Some(200 * MI),
            }],
            top_pods: vec![
                PodPoint {
                    pod: "default/hog".into(),
                    working_set: (100 + 18 * i) << 20,
                },
                PodPoint {
                    pod: "default/steady".into(),
                    working_set: 200 << 20,
                },
            ],
            pod_figures_age_ms: Some(0),
            psi: Some(PsiPoint {
                some_avg10: 2.0 * i as f64,
                full_avg10: i as f64,
                some_total_us: i * 1000,
                full_total_us: i * 500,
            }),
            thresholds_met: if met {
                vec!["memory.available hard".into()]
            } else {
                Vec::new()
            },
            evict: Vec::new(),
        });
        if i == 18 {
            r.event(FlightEvent {
                at_ms: 1_018_100,
                kind: EventKind::ReclaimStall {
                    pod: "default/hog".into(),
                    stall_ns: 150_000_000,
                },
            });
            r.event(FlightEvent {
                at_ms: 1_018_200,
                kind: EventKind::KswapdWake { suppressed: 2 },
            });
        }
    }
    r.event(FlightEvent {
        at_ms: 1_019_300,
        kind: EventKind::OomKill {
            pod: "default/hog".into(),
            comm: "hog".into(),
            pid: 4242,
            global: Some(true),
        },
    });
    r.records().next().expect("a record").clone()
}

/// The text names the trigger, the verdict, the lowest memory with its threshold, PSI, the
/// top pods, the reclaim activity and the crossing.
#[test]
fn the_text_summarizes_a_record() {
    let t = record_text(&climb(), "node-a");
    for want in [
        "node-a record 0",
        "node-wide OOM kill of hog (4242) of default/hog",
        "verdict: a threshold was met but no pod was evicted",
        "samples: 20 in the 30 s before, 0 after",
        "lowest memory.available: 58Mi (threshold 100Mi) at -0.3 s",
        "peak PSI memory: some avg10 38.0%, full avg10 19.0%",
        "top pods: default/hog 442Mi, default/steady 200Mi",
        "reclaim: 1 stalls, 3 kswapd wake-ups",
        "threshold memory.available hard met",
    ] {
        assert!(t.contains(want), "{want:?} in:\n{t}");
    }
}

/// A pass's sample: memory signals only, their thresholds for the capacity, the top pods by
/// working set with their names, the decision's thresholds and pods.
#[test]
fn a_sample_keeps_memory_signals_top_pods_and_the_decision() {
    use node_monitor_core::{
        clock::Timestamp,
        config::{ConfigSource, EvictionOverrides, load_sources},
        eviction::{EvictionState, synchronize},
        signals::{Signal, SignalObservation},
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

/// The node API's JSON parses back into the record; a malformed one is an error naming it.
#[test]
fn records_round_trip_through_the_node_api_answer() {
    let rec = climb();
    let answer = serde_json::json!({"records": [record_json(&rec, "node-a")]});
    assert_eq!(answer["records"][0]["verdict"], rec.verdict());
    assert_eq!(records_of(&answer).expect("records"), [rec]);
    let bad = serde_json::json!({"records": [{"id": "x"}]});
    let e = records_of(&bad).expect_err("malformed");
    assert!(e.to_string().contains("flight record 0"), "{e}");
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
