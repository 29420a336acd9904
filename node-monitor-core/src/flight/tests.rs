use super::*;

const MI: i64 = 1 << 20;

fn sample(at_ms: u64, available: i64, met: &[&str]) -> Sample {
    Sample {
        at_ms,
        signals: vec![SignalPoint {
            signal: "memory.available".into(),
            available,
            capacity: 1024 * MI,
            hard: Some(100 * MI),
            soft: None,
        }],
        top_pods: (0..8)
            .map(|i| PodPoint {
                pod: format!("default/p{i}"),
                working_set: i * 10,
            })
            .collect(),
        pod_figures_age_ms: Some(0),
        psi: None,
        thresholds_met: met.iter().map(|s| (*s).to_owned()).collect(),
        evict: Vec::new(),
        prediction: None,
    }
}

fn oom(at_ms: u64, global: Option<bool>) -> FlightEvent {
    FlightEvent {
        at_ms,
        kind: EventKind::OomKill {
            pod: "default/hog".into(),
            comm: "hog".into(),
            pid: 42,
            global,
        },
    }
}

fn eviction(at_ms: u64, outcome: &str) -> FlightEvent {
    FlightEvent {
        at_ms,
        kind: EventKind::Eviction {
            pod: "default/hog".into(),
            signal: "memory.available".into(),
            outcome: outcome.into(),
        },
    }
}

fn stall(at_ms: u64) -> FlightEvent {
    FlightEvent {
        at_ms,
        kind: EventKind::ReclaimStall {
            pod: String::new(),
            stall_ns: 1_000_000,
        },
    }
}

/// A kill freezes the samples and events of the window before it, and nothing older; the top
/// pods are the largest five, largest first.
#[test]
fn a_kill_keeps_the_window_before_it() {
    let mut r = FlightRecorder::new();
    for s in 0..100u64 {
        r.sample(sample(
            s * 1000,
            500 * MI - i64::try_from(s).expect("small") * MI,
            &[],
        ));
    }
    r.event(stall(95_000));
    r.event(stall(50_000));
    r.event(oom(99_500, Some(true)));
    let rec: Vec<&FlightRecord> = r.records().collect();
    assert_eq!(rec.len(), 1);
    let rec = rec[0];
    assert_eq!(rec.id, 0);
    assert_eq!(rec.trigger, oom(99_500, Some(true)));
    assert_eq!(rec.until_ms, 99_500 + TAIL_MS);
    let times: Vec<u64> = rec.samples.iter().map(|s| s.at_ms).collect();
    assert_eq!(times.first(), Some(&70_000));
    assert_eq!(times.last(), Some(&99_000));
    assert_eq!(times.len(), 30);
    let pods: Vec<&str> = rec.samples[0]
        .top_pods
        .iter()
        .map(|p| p.pod.as_str())
        .collect();
    assert_eq!(
        pods,
        [
            "default/p7",
            "default/p6",
            "default/p5",
            "default/p4",
            "default/p3"
        ]
    );
    // The stall at 50 s is older than the window (it was dropped), the one at 95 s is kept.
    let kinds: Vec<u64> = rec.events.iter().map(|e| e.at_ms).collect();
    assert_eq!(kinds, [95_000, 99_500]);
}

/// Samples and events within the tail join the record; a second trigger in the tail joins it
/// rather than starting a record; after the tail, a trigger starts a new one.
#[test]
fn the_tail_joins_the_record_and_later_triggers_start_another() {
    let mut r = FlightRecorder::new();
    r.sample(sample(1_000, 50 * MI, &["memory.available hard"]));
    r.event(eviction(1_100, "evicted"));
    r.sample(sample(2_000, 40 * MI, &["memory.available hard"]));
    r.event(oom(3_000, Some(true)));
    r.sample(sample(6_100, 400 * MI, &[]));
    r.sample(sample(7_000, 400 * MI, &[]));
    r.event(oom(7_000, Some(false)));
    let recs: Vec<&FlightRecord> = r.records().collect();
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0].trigger, eviction(1_100, "evicted"));
    let times: Vec<u64> = recs[0].samples.iter().map(|s| s.at_ms).collect();
    assert_eq!(times, [1_000, 2_000, 6_100]);
    assert!(recs[0].events.contains(&oom(3_000, Some(true))));
    // The threshold's return under it, at 6.1 s, is in the tail.
    assert!(recs[0].events.iter().any(|e| e.kind
        == EventKind::Threshold {
            threshold: "memory.available hard".into(),
            met: false
        }));
    assert_eq!(recs[1].id, 1);
    assert_eq!(recs[1].trigger, oom(7_000, Some(false)));
    assert_eq!(recs[1].samples.len(), 4);
}

/// Threshold crossings become events at the sample's time, both ways.
#[test]
fn threshold_crossings_are_events() {
    let mut r = FlightRecorder::new();
    r.sample(sample(1_000, 500 * MI, &[]));
    r.sample(sample(2_000, 90 * MI, &["memory.available hard"]));
    r.sample(sample(3_000, 80 * MI, &["memory.available hard"]));
    r.event(oom(3_500, Some(true)));
    let rec = r.records().next().expect("a record");
    let crossings: Vec<(u64, bool)> = rec
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Threshold { met, .. } => Some((e.at_ms, *met)),
            _ => None,
        })
        .collect();
    assert_eq!(crossings, [(2_000, true)]);
}

/// The records, samples and events are bounded whatever comes in.
#[test]
fn everything_is_bounded() {
    let mut r = FlightRecorder::new();
    // 10 samples per ms: far more than SAMPLES_KEPT within the window.
    for i in 0..(SAMPLES_KEPT as u64 * 3) {
        r.sample(sample(i / 10, 50 * MI, &[]));
        r.event(stall(i / 10));
    }
    assert!(r.samples.len() <= SAMPLES_KEPT);
    assert!(r.events.len() <= EVENTS_KEPT);
    for k in 0..(RECORDS_KEPT as u64 * 2) {
        let at = 1_000_000 + k * (TAIL_MS + 1);
        r.event(oom(at, Some(true)));
        for i in 0..(SAMPLES_KEPT as u64 * 2) {
            r.sample(sample(at + i % TAIL_MS, 50 * MI, &[]));
            r.event(stall(at + i % TAIL_MS));
        }
    }
    assert_eq!(r.record_count(), RECORDS_KEPT);
    let ids: Vec<u64> = r.records().map(|x| x.id).collect();
    assert_eq!(ids.first(), Some(&(RECORDS_KEPT as u64)));
    for rec in r.records() {
        assert!(rec.samples.len() <= RECORD_SAMPLES_BEFORE + RECORD_SAMPLES_AFTER);
        assert!(rec.events.len() <= RECORD_EVENTS);
    }
    assert!(r.approx_bytes() > 0);
}

/// Events that trigger nothing (stalls, kswapd) make no record.
#[test]
fn kernel_pressure_alone_makes_no_record() {
    let mut r = FlightRecorder::new();
    r.sample(sample(1_000, 500 * MI, &[]));
    r.event(stall(1_500));
    r.event(FlightEvent {
        at_ms: 1_600,
        kind: EventKind::KswapdWake { suppressed: 3 },
    });
    assert_eq!(r.record_count(), 0);
}

/// The verdict says why the agent did or did not act.
#[test]
fn the_verdict_names_what_the_agent_did() {
    type Step = (u64, Option<&'static str>, Option<FlightEvent>);
    let met = Some("memory.available hard");
    let cases: Vec<(&str, Vec<Step>, bool, &str)> = vec![
        (
            "no threshold",
            vec![
                (1_000, None, None),
                (2_000, None, Some(oom(2_000, Some(true)))),
            ],
            false,
            "no threshold was met",
        ),
        (
            "memcg kill",
            vec![
                (1_000, None, None),
                (2_000, None, Some(oom(2_000, Some(false)))),
            ],
            false,
            "in a cgroup's own limit",
        ),
        (
            "met, not evicted",
            vec![
                (1_000, met, None),
                (2_000, met, Some(oom(2_000, Some(true)))),
            ],
            false,
            "a threshold was met but no pod was evicted",
        ),
        (
            "dry run",
            vec![(1_000, met, Some(eviction(1_000, "dry_run")))],
            true,
            "dry run: node-monitor would have evicted default/hog",
        ),
        (
            "pdb",
            vec![(1_000, met, Some(eviction(1_000, "pdb_blocked")))],
            false,
            "PodDisruptionBudget refused it",
        ),
        (
            "evicted",
            vec![(1_000, met, Some(eviction(1_000, "evicted")))],
            false,
            "node-monitor evicted default/hog",
        ),
        (
            "no sample",
            vec![(2_000, None, Some(oom(1_000, Some(true))))],
            false,
            "no sample before the kill",
        ),
    ];
    for (name, steps, dry_run, want) in cases {
        let mut r = FlightRecorder::new();
        r.set_dry_run(dry_run);
        for (at, m, ev) in steps {
            let m: Vec<&str> = m.into_iter().collect();
            if let Some(ev) = ev {
                if ev.at_ms < at {
                    r.event(ev);
                    r.sample(sample(at, 50 * MI, &m));
                    continue;
                }
                r.sample(sample(at, 50 * MI, &m));
                r.event(ev);
            } else {
                r.sample(sample(at, 50 * MI, &m));
            }
        }
        let rec = r.records().next().expect(name);
        assert_eq!(rec.dry_run, dry_run, "{name}");
        let v = rec.verdict();
        assert!(v.contains(want), "{name}: {v}");
    }
}

/// A record survives JSON both ways (the node API's answer, the plugin's input).
#[test]
fn a_record_round_trips_through_json() {
    let mut r = FlightRecorder::new();
    let mut s = sample(1_000, 50 * MI, &["memory.available hard"]);
    s.psi = Some(PsiPoint {
        some_avg10: 12.5,
        full_avg10: 3.0,
        some_total_us: 10,
        full_total_us: 5,
    });
    r.sample(s);
    r.event(oom(1_500, Some(true)));
    let rec = r.records().next().expect("record").clone();
    let json = serde_json::to_string(&rec).expect("json");
    assert!(json.contains("\"kind\":\"oom_kill\""), "{json}");
    let back: FlightRecord = serde_json::from_str(&json).expect("parse");
    assert_eq!(back, rec);
}

/// A window sampled faster than a record keeps is thinned: the newest half as sampled, the
/// older part evenly, the oldest kept, in order.
#[test]
fn a_fast_window_is_thinned_into_the_record() {
    let mut r = FlightRecorder::new();
    for i in 0..SAMPLES_KEPT as u64 {
        r.sample(sample(100_000 + i * 100, 500 * MI, &[]));
    }
    let last = 100_000 + (SAMPLES_KEPT as u64 - 1) * 100;
    r.event(oom(last + 50, Some(true)));
    let rec = r.records().next().expect("a record");
    let times: Vec<u64> = rec.samples.iter().map(|s| s.at_ms).collect();
    assert_eq!(times.len(), RECORD_SAMPLES_BEFORE);
    assert_eq!(times[0], 100_000, "the oldest is kept");
    assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
    let newest: Vec<u64> = (0..RECORD_SAMPLES_BEFORE as u64 / 2)
        .rev()
        .map(|i| last - i * 100)
        .collect();
    assert_eq!(times[RECORD_SAMPLES_BEFORE / 2..], newest[..]);
    // The tail takes at most RECORD_SAMPLES_AFTER samples.
    for i in 0..(RECORD_SAMPLES_AFTER as u64 * 2) {
        r.sample(sample(last + 100 + i * 100, 500 * MI, &[]));
    }
    let rec = r.records().next().expect("a record");
    assert_eq!(
        rec.samples.len(),
        RECORD_SAMPLES_BEFORE + RECORD_SAMPLES_AFTER
    );
    assert_eq!(thin(Vec::new(), 4), Vec::<Sample>::new());
}

/// Passes closer than the spacing share a sample (the latest stands), so a window at any pace
/// spans its 30 s; a reader's shared record is not changed under it by the tail.
#[test]
fn fast_passes_share_a_sample_and_readers_keep_their_copy() {
    let mut r = FlightRecorder::new();
    // 40 s of passes every 10 ms.
    for i in 0..4000u64 {
        r.sample(sample(100_000 + i * 10, 500 * MI, &[]));
    }
    assert!(r.samples.len() <= SAMPLES_KEPT);
    let first = r.samples.front().map(|s| s.at_ms).expect("samples");
    let last = r.samples.back().map(|s| s.at_ms).expect("samples");
    assert_eq!(last, 100_000 + 3999 * 10, "the latest pass stands");
    assert!(
        last - first >= WINDOW_MS - 2 * MIN_SPACING_MS,
        "{first}..{last}"
    );
    r.event(oom(last + 1, Some(true)));
    let shared = r.shared_records();
    let before = shared[0].samples.len();
    for i in 1..=20u64 {
        r.sample(sample(last + i * 10, 500 * MI, &[]));
    }
    assert_eq!(
        shared[0].samples.len(),
        before,
        "the reader's copy is unchanged"
    );
    let now = r.records().next().expect("record");
    // 200 ms of tail at 10 ms: two or three spaced samples, not twenty.
    let tail = now.samples.len() - before;
    assert!((1..=3).contains(&tail), "{tail}");
}

/// A record is due for persisting when it freezes and once more when its tail ends; nothing is
/// due while nothing happens, and a trigger that joins an open record adds no write.
#[test]
fn persisting_is_due_at_the_freeze_and_at_the_end_of_the_tail() {
    let mut r = FlightRecorder::new();
    r.sample(sample(1_000, 500 * MI, &[]));
    assert!(!r.persist_due(1_000), "no record");
    assert!(!r.tail_unwritten(), "no record");
    r.event(oom(2_000, Some(false)));
    assert!(r.persist_due(2_000), "frozen");
    assert!(!r.persist_due(2_000));
    r.event(oom(3_000, Some(false)));
    r.sample(sample(3_500, 500 * MI, &[]));
    assert!(
        !r.persist_due(3_500),
        "joined the open record, tail still open"
    );
    assert!(r.tail_unwritten(), "a stop now would lose the tail");
    r.sample(sample(2_000 + TAIL_MS + 1, 500 * MI, &[]));
    assert!(r.persist_due(2_000 + TAIL_MS + 1), "tail ended");
    assert!(!r.tail_unwritten(), "the whole record is due already");
    assert!(!r.persist_due(60_000), "nothing new");
    r.event(eviction(70_000, "evicted"));
    assert!(r.persist_due(70_000), "a second record");
}

/// Records of an earlier run come first, the newest 16 of all are kept, numbering continues
/// after the highest restored id, and restoring them does not make them due again.
#[test]
fn restored_records_come_first_and_numbering_continues() {
    let mut earlier = FlightRecorder::new();
    for i in 0..20u64 {
        earlier.sample(sample(i * 60_000, 500 * MI, &[]));
        earlier.event(oom(i * 60_000 + 1, Some(false)));
    }
    let saved: Vec<FlightRecord> = earlier.records().cloned().collect();
    assert_eq!(saved.len(), RECORDS_KEPT);
    assert_eq!(saved.last().map(|r| r.id), Some(19));

    let mut r = FlightRecorder::new();
    r.restore(saved.iter().rev().cloned().collect());
    assert!(
        !r.persist_due(2_000_000),
        "restored records are on disk already"
    );
    assert!(!r.tail_unwritten(), "restored records are whole");
    let ids: Vec<u64> = r.records().map(|x| x.id).collect();
    assert_eq!(ids, (4..20).collect::<Vec<_>>(), "oldest first, as saved");
    r.event(oom(3_000_000, Some(true)));
    assert!(r.persist_due(3_000_000));
    let ids: Vec<u64> = r.records().map(|x| x.id).collect();
    assert_eq!(
        ids,
        (5..21).collect::<Vec<_>>(),
        "the oldest goes, numbering continues"
    );
}

/// The pod of an OOM kill stays in the samples of its open record whatever its rank; once the
/// record closes, samples keep the top pods only.
#[test]
fn the_pod_of_an_open_oom_kill_is_kept_beyond_the_top_pods() {
    let mut r = FlightRecorder::new();
    r.sample(sample(1_000, 500 * MI, &[]));
    // `sample()`'s pods are p0..p7, p0 the smallest.
    r.event(FlightEvent {
        at_ms: 1_500,
        kind: EventKind::OomKill {
            pod: "default/p0".into(),
            comm: "app".into(),
            pid: 1,
            global: Some(false),
        },
    });
    assert_eq!(r.open_oom_pods(2_000), ["default/p0"]);
    r.sample(sample(2_000, 500 * MI, &[]));
    let rec = r.records().next().expect("record");
    let tail = rec.samples.last().expect("tail sample");
    let names: Vec<&str> = tail.top_pods.iter().map(|p| p.pod.as_str()).collect();
    assert_eq!(
        names,
        [
            "default/p7",
            "default/p6",
            "default/p5",
            "default/p4",
            "default/p3",
            "default/p0"
        ]
    );
    let before = &rec.samples[0];
    assert_eq!(before.top_pods.len(), TOP_PODS, "sampled before the kill");
    // Closed: back to the top pods.
    assert!(r.open_oom_pods(1_500 + TAIL_MS + 1).is_empty());
    r.sample(sample(1_500 + TAIL_MS + 1, 500 * MI, &[]));
    assert_eq!(r.samples.back().map(|s| s.top_pods.len()), Some(TOP_PODS));
}

/// A kill reported after the pass that read the pods: that pass's sample gets the killed pod's
/// figure, in the window and in the record, once.
#[test]
fn a_pod_figure_is_added_to_the_sample_of_the_pass_that_read_it() {
    let mut r = FlightRecorder::new();
    r.sample(sample(1_000, 500 * MI, &[]));
    r.event(oom(1_050, Some(false)));
    let hog = PodPoint {
        pod: "default/hog".into(),
        working_set: 300 << 20,
    };
    assert!(r.add_pod_to_sample(1_000, &hog));
    assert!(!r.add_pod_to_sample(1_000, &hog), "once");
    assert!(!r.add_pod_to_sample(999, &hog), "no such sample");
    let rec = r.records().next().expect("record");
    assert!(rec.samples[0].top_pods.contains(&hog));
    assert!(r.samples[0].top_pods.contains(&hog));
}
