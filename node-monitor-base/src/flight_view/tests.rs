use super::*;
use node_monitor_core::flight::PredictionPoint as Prediction;
use node_monitor_core::flight::{FlightEvent, FlightRecorder, PodPoint, PsiPoint, SignalPoint};

const MI: i64 = 1 << 20;

/// A recorder's record of a climb to a node-wide OOM kill: samples every second with PSI, a
/// threshold crossing, a dry-run eviction, reclaim stalls and a kswapd wake-up.
pub(crate) fn climb() -> FlightRecord {
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
            // The pass before the crossing predicted it.
            prediction: (i == 16).then_some(Prediction {
                rate_bytes_per_second: 18 * MI,
                headroom_bytes: 30 * MI,
                exhaustion_ms: 1700,
                lead_ms: 2000,
            }),
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
        "predicted at -3.3 s: falling 18Mi/s, 30Mi left, exhaustion in 1.7 s, lead 2.0 s",
    ] {
        assert!(t.contains(want), "{want:?} in:\n{t}");
    }
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
