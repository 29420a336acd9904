use super::*;

use k8s_openapi::api::core::v1::Pod;
use node_monitor_core::{
    config::ConfigSource,
    eviction::{EvictionState, synchronize},
    kubelet::pod::PodInfo,
    signals::{PodUsage, Signal, SignalObservation},
    units::clock::Timestamp,
};

use crate::settings::EvictionFlags;

const MI: i64 = 1 << 20;

fn config(yaml: &str) -> EvictionConfig {
    crate::cli::check_config::load(
        None,
        &[ConfigSource {
            name: "test",
            text: yaml,
        }],
        &EvictionFlags::default(),
    )
    .expect("config")
}

/// A flight recorder sample at `at_ms` with nothing in it.
fn empty_sample(at_ms: u64) -> Sample {
    Sample {
        at_ms,
        signals: Vec::new(),
        top_pods: Vec::new(),
        pod_figures_age_ms: None,
        psi: None,
        thresholds_met: Vec::new(),
        evict: Vec::new(),
        prediction: None,
    }
}

fn pod(name: &str, uid: &str) -> PodInfo {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "app"}]}
    }))
    .expect("pod");
    PodInfo::from_pod(&pod).expect("pod info")
}

/// 1 GiB of memory with `available` MiB left, and a pod using 600 MiB.
fn observations(available: i64) -> Observations {
    let mut obs = Observations::default();
    obs.signals.insert(
        Signal::MemoryAvailable,
        SignalObservation {
            available: available * MI,
            capacity: 1024 * MI,
        },
    );
    obs.pods.insert(
        "u-hog".into(),
        PodUsage {
            memory: Some(600 << 20),
            ..PodUsage::default()
        },
    );
    obs
}

#[test]
fn status_reports_thresholds_with_their_headroom() {
    let live = LiveView::new("n1");
    let config = config("evictionHard:\n  memory.available: 300Mi\n");
    let obs = observations(400);
    let decision = synchronize(
        &mut EvictionState::new(),
        &config,
        &obs,
        &[pod("hog", "u-hog")],
        Timestamp::ZERO,
    );
    live.record_cycle(&config, &obs, &decision);
    let v = live.status(true, "ok", &["eBPF program x failed".to_owned()]);
    assert_eq!(v["node"], "n1");
    let t = &v["thresholds"][0];
    assert_eq!(t["signal"], "memory.available");
    assert_eq!(t["kind"], "hard");
    assert_eq!(t["value"], "300Mi");
    assert_eq!(t["available"], 400 * MI);
    assert_eq!(t["threshold"], 300 * MI);
    assert_eq!(t["headroom"], 100 * MI);
    assert_eq!(t["met"], false);
    assert_eq!(v["degraded"][0], "eBPF program x failed");
    assert!(v["observed_at_ms"].as_u64().is_some(), "{v}");
}

#[test]
fn an_unobserved_signal_has_no_headroom() {
    let live = LiveView::new("n1");
    let config = config("evictionHard:\n  nodefs.available: 10%\n");
    let obs = observations(400);
    let decision = synchronize(
        &mut EvictionState::new(),
        &config,
        &obs,
        &[],
        Timestamp::ZERO,
    );
    live.record_cycle(&config, &obs, &decision);
    let v = live.status(true, "ok", &[]);
    assert_eq!(v["thresholds"][0]["signal"], "nodefs.available");
    assert_eq!(v["thresholds"][0]["headroom"], Value::Null);
    assert_eq!(v["thresholds"][0]["met"], Value::Null);
}

/// The live explain is the decision as `node-monitor explain` words it, plus where and when.
#[test]
fn explain_words_the_decision_as_the_cli_does() {
    let live = LiveView::new("n1");
    assert_eq!(live.explain(), None, "nothing decided yet");
    let config = config("evictionHard:\n  memory.available: 500Mi\n");
    let obs = observations(400);
    let decision = synchronize(
        &mut EvictionState::new(),
        &config,
        &obs,
        &[pod("hog", "u-hog")],
        Timestamp::ZERO,
    );
    live.record_cycle(&config, &obs, &decision);
    let v = live.explain().expect("explain");
    assert_eq!(v["evict"][0]["name"], "hog");
    assert_eq!(v["reclaim"], "memory.available");
    assert_eq!(v["node"], "n1");
    let mut cli = node_monitor_core::eviction::explain_json(
        &decision,
        std::time::Duration::ZERO,
        &[],
        &config.warnings,
        config.node_monitor.memory_working_set,
    )
    .expect("json");
    if let Value::Object(m) = &mut cli {
        m.insert("node".into(), json!("n1"));
        m.insert("observed_at_ms".into(), v["observed_at_ms"].clone());
        m.insert("dry_run".into(), json!(false));
    }
    assert_eq!(v, cli);
}

#[test]
fn evictions_are_bounded_newest_first() {
    let live = LiveView::new("n1");
    for i in 0..EVICTIONS_KEPT + 5 {
        live.record_eviction(EvictionRecord {
            at_ms: i as u64,
            namespace: "default".into(),
            name: format!("p{i}"),
            signal: "memory.available".into(),
            hard: true,
            outcome: "evicted".into(),
            message: String::new(),
        });
    }
    let v = live.status(true, "ok", &[]);
    let e = v["recent_evictions"].as_array().expect("array");
    assert_eq!(e.len(), EVICTIONS_KEPT);
    assert_eq!(e[0]["name"], format!("p{}", EVICTIONS_KEPT + 4));
    assert_eq!(e[EVICTIONS_KEPT - 1]["name"], "p5");
}

#[test]
fn the_trace_buffer_is_a_bounded_ring_read_in_pages() {
    let mut b = TraceBuffer::with_capacity(3);
    for i in 0..5 {
        b.push(json!({"i": i}));
    }
    // Holds 2, 3, 4; a reader from 0 missed 0 and 1.
    let p = b.page(0, 10);
    assert_eq!(p.missed, 2);
    assert_eq!(
        p.events.iter().map(|e| e["i"].clone()).collect::<Vec<_>>(),
        vec![json!(2), json!(3), json!(4)]
    );
    assert_eq!(p.events[0]["seq"], 2);
    assert_eq!(p.next, 5);
    // Pages of one, then nothing new.
    let p = b.page(3, 1);
    assert_eq!((p.events.len(), p.next, p.missed), (1, 4, 0));
    let p = b.page(5, 10);
    assert_eq!((p.events.len(), p.next, p.missed), (0, 5, 0));
    // A reader of an earlier run of the agent (a number beyond the buffer's) starts again.
    let p = b.page(99, 10);
    assert_eq!((p.events.len(), p.next, p.missed), (0, 5, 0));
}

#[test]
fn recorded_events_carry_their_arrival_and_are_capped_per_answer() {
    let live = LiveView::new("n1");
    for _ in 0..TRACE_EVENTS_KEPT + 10 {
        live.record_event(json!({"kind": "oom_kill"}));
    }
    let v = live.trace(0, usize::MAX);
    assert_eq!(v["events"].as_array().map(Vec::len), Some(TRACE_PAGE_MAX));
    assert_eq!(v["missed"], 10);
    assert!(v["events"][0]["received_at_ms"].as_u64().is_some(), "{v}");
}

/// The flight recorder in the live view: the loop's samples before an OOM kill the kernel task
/// reports are in the `flight` answer's record, with its verdict; the dry run is noted.
#[test]
fn flight_records_a_kill_with_the_samples_before_it() {
    use node_monitor_core::flight::{EventKind, FlightEvent};
    let live = LiveView::new("n1");
    live.set_config(&config(
        "evictionHard:\n  memory.available: 300Mi\nnodeMonitor:\n  dryRun: true\n",
    ));
    let now = unix_ms();
    for i in 0..3u64 {
        let (records, bytes) = live.flight_sample(empty_sample(now + i * 100));
        assert_eq!(records, 0);
        assert!(bytes > 0);
    }
    live.flight_event(FlightEvent {
        at_ms: now + 250,
        kind: EventKind::OomKill {
            pod: "default/hog".into(),
            comm: "hog".into(),
            pid: 1,
            global: Some(false),
        },
    });
    let v = live.flight();
    assert_eq!(v["node"], "n1");
    let records = v["records"].as_array().expect("records");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["samples"].as_array().map(Vec::len), Some(3));
    assert_eq!(records[0]["trigger"]["kind"], "oom_kill");
    assert_eq!(records[0]["dry_run"], true);
    assert!(
        records[0]["verdict"]
            .as_str()
            .is_some_and(|s| s.contains("cgroup's own limit")),
        "{v}"
    );
}

/// Flight records survive a restart: a record frozen in one run is written to the state
/// directory (its open tail too, at the stop's flush), and a new live view over the same directory shows it, with the next record
/// numbered after it.
#[test]
fn flight_records_survive_a_restart_through_the_state_directory() {
    use crate::flight::store::{FlightStore, FlightWriter};
    use node_monitor_core::flight::{EventKind, FlightEvent};
    let dir = tempfile::tempdir().expect("tempdir");
    let errors = prometheus_client::metrics::family::Family::default();
    let sample = empty_sample;
    let kill = |live: &LiveView, at_ms: u64| {
        live.flight_sample(sample(at_ms - 100));
        live.flight_event(FlightEvent {
            at_ms,
            kind: EventKind::OomKill {
                pod: "default/hog".into(),
                comm: "hog".into(),
                pid: 1,
                global: Some(false),
            },
        });
    };
    let start = |store: &FlightStore| {
        let live = LiveView::new("n1");
        let writer = FlightWriter::spawn(store.clone(), errors.clone()).expect("writer");
        live.persist_flight(store.restore(&errors), writer);
        live
    };
    let store = FlightStore::new(dir.path());
    let first = start(&store);
    let now = unix_ms();
    kill(&first, now);
    // A sample in the record's tail, then a stop: the flush writes the tail as far as it got.
    first.flight_sample(sample(now + 1_000));
    assert_eq!(
        first.flush_flight(std::time::Duration::from_secs(30)),
        Some(true)
    );
    let on_disk = store.load().expect("load");
    assert_eq!(on_disk.len(), 1, "written when it froze");
    assert!(
        on_disk[0].samples.iter().any(|s| s.at_ms == now + 1_000),
        "the open tail written at the stop: {:?}",
        on_disk[0]
            .samples
            .iter()
            .map(|s| s.at_ms)
            .collect::<Vec<_>>()
    );
    drop(first);

    let second = start(&store);
    let v = second.flight();
    let records = v["records"].as_array().expect("records");
    assert_eq!(records.len(), 1, "{v}");
    assert_eq!(records[0]["trigger"]["pod"], "default/hog");
    kill(&second, now + 600_000);
    let v = second.flight();
    let ids: Vec<u64> = v["records"]
        .as_array()
        .expect("records")
        .iter()
        .filter_map(|r| r["id"].as_u64())
        .collect();
    assert_eq!(ids, [1, 0], "newest first, numbered after the restored one");
}

/// The killed pod's figure reaches its flight record whether the kill is reported before or
/// after the pass that read the pods, though it is not among the largest.
#[test]
fn the_killed_pods_figure_reaches_the_record_in_either_order() {
    use node_monitor_core::flight::{EventKind, FlightEvent, PodPoint, Sample};
    let pods: Vec<PodPoint> = (0..8u64)
        .map(|i| PodPoint {
            pod: format!("default/p{i}"),
            working_set: (i + 1) << 20,
        })
        .collect();
    let sample = |at_ms: u64| Sample {
        top_pods: pods[3..].to_vec(),
        pod_figures_age_ms: Some(0),
        ..empty_sample(at_ms)
    };
    let kill = |at_ms: u64| FlightEvent {
        at_ms,
        kind: EventKind::OomKill {
            pod: "default/p0".into(),
            comm: "app".into(),
            pid: 1,
            global: Some(false),
        },
    };
    let has_p0 = |live: &LiveView| {
        let v = live.flight();
        v["records"][0]["samples"]
            .as_array()
            .expect("samples")
            .iter()
            .any(|s| {
                s["top_pods"]
                    .as_array()
                    .is_some_and(|p| p.iter().any(|p| p["pod"] == "default/p0"))
            })
    };
    let now = unix_ms();
    // The pass read the pods, then the kill was reported.
    let live = LiveView::new("n1");
    live.flight_sample_with_pods(sample(now), Some(pods.clone()));
    live.flight_event(kill(now + 10));
    assert!(has_p0(&live), "{}", live.flight());
    // The kill was reported, then the pass it woke read the pods.
    let live = LiveView::new("n1");
    live.flight_sample(Sample {
        top_pods: Vec::new(),
        pod_figures_age_ms: None,
        ..sample(now - 1_000)
    });
    live.flight_event(kill(now));
    live.flight_sample_with_pods(sample(now + 10), Some(pods.clone()));
    assert!(has_p0(&live), "{}", live.flight());
    // Without the pod read of the pass, neither.
    let live = LiveView::new("n1");
    live.flight_sample(sample(now));
    live.flight_event(kill(now + 10));
    assert!(!has_p0(&live));
}
