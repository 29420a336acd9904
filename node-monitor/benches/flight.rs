//! OOM flight recorder benchmark: what the agent's loop pays per pass for the recorder (building
//! the sample from the pod figures it holds, PSI read from its file, the recorder's push with
//! a full window and open records), the memory the recorder holds at its bounds, and, for scale,
//! drawing a full record as SVG. A plain timing harness, as `decision`.
//!
//! `cargo bench -p node-monitor --bench flight` (figures in docs/benchmarks.md).

mod harness;

use harness::{Stats, measure};
use std::{collections::HashMap, hint::black_box};

use k8s_openapi::api::core::v1::Pod;
use node_monitor::flight::{
    EventKind, FlightEvent, FlightRecorder, PodPoint, PsiPoint, Sample, SignalPoint, read_psi,
    sample_of,
};
use node_monitor_core::{
    config::{ConfigSource, EvictionOverrides, load_sources},
    eviction::{EvictionState, synchronize},
    flight::{RECORDS_KEPT, SAMPLES_KEPT, TAIL_MS},
    kubelet::pod::PodInfo,
    signals::{Observations, PodUsage, Signal, SignalObservation},
    units::clock::Timestamp,
};
use serde_json::json;

const MI: i64 = 1 << 20;

fn sample(at_ms: u64) -> Sample {
    Sample {
        at_ms,
        signals: vec![SignalPoint {
            signal: "memory.available".into(),
            available: 300 * MI,
            capacity: 8192 * MI,
            hard: Some(100 * MI),
            soft: Some(500 * MI),
        }],
        top_pods: (0..5u64)
            .map(|i| PodPoint {
                pod: format!("namespace-{i}/a-typical-pod-name-{i}-7d9f8b6c4d-x2x9z"),
                working_set: (i + 1) << 28,
            })
            .collect(),
        pod_figures_age_ms: Some(100),
        psi: Some(PsiPoint {
            some_avg10: 12.5,
            full_avg10: 3.0,
            some_total_us: 1,
            full_total_us: 1,
        }),
        thresholds_met: vec!["memory.available soft".into()],
        evict: Vec::new(),
        prediction: None,
    }
}

fn oom(at_ms: u64) -> FlightEvent {
    FlightEvent {
        at_ms,
        kind: EventKind::OomKill {
            pod: "namespace-1/a-typical-pod-name-1-7d9f8b6c4d-x2x9z".into(),
            comm: "java".into(),
            pid: 4242,
            global: Some(true),
        },
    }
}

/// A recorder at its bounds: 16 records of full windows, a full window of samples, every
/// sample at the agent's fastest pace (100 ms).
fn full_recorder() -> (FlightRecorder, u64) {
    let mut r = FlightRecorder::new();
    let mut at = 1_000_000u64;
    for _ in 0..RECORDS_KEPT {
        for _ in 0..SAMPLES_KEPT {
            r.sample(sample(at));
            at += 100;
        }
        r.event(oom(at));
        at += TAIL_MS + 1;
    }
    for _ in 0..SAMPLES_KEPT {
        r.sample(sample(at));
        at += 100;
    }
    (r, at)
}

fn report(name: &str, s: &Stats) {
    println!(
        "{name:<52} min {:>10.0} ns   median {:>10.0} ns   p95 {:>10.0} ns   p99 {:>10.0} ns",
        s.min.as_secs_f64() * 1e9,
        s.median.as_secs_f64() * 1e9,
        s.p95.as_secs_f64() * 1e9,
        s.p99.as_secs_f64() * 1e9
    );
}

/// 250 pods' figures, their `PodInfo`s, a configuration and a decision under pressure.
fn agent_pass() -> (
    node_monitor_core::config::EvictionConfig,
    Observations,
    Vec<PodInfo>,
    HashMap<String, PodUsage>,
) {
    let config = load_sources(
        &[ConfigSource {
            name: "bench",
            text: "evictionHard:\n  memory.available: 500Mi\n",
        }],
        &EvictionOverrides::default(),
    )
    .expect("config");
    let figures: HashMap<String, PodUsage> = (0..250u64)
        .map(|i| {
            (
                format!("uid-{i}"),
                PodUsage {
                    memory: Some((i % 97 + 1) << 22),
                    ..PodUsage::default()
                },
            )
        })
        .collect();
    let pods = (0..250)
        .map(|i| {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("pod-{i}"), "namespace": "ns", "uid": format!("uid-{i}")},
                "spec": {"containers": [{"name": "app"}]}
            }))
            .expect("pod");
            PodInfo::from_pod(&pod).expect("pod info")
        })
        .collect();
    let mut obs = Observations::default();
    obs.signals.insert(
        Signal::MemoryAvailable,
        SignalObservation {
            available: 300 * MI,
            capacity: 8192 * MI,
        },
    );
    obs.pods = figures.clone();
    (config, obs, pods, figures)
}

/// The record file at its bounds: written whole by its own thread when a record freezes and when
/// its tail ends, read back at start.
fn store_at_bounds(
    shared: &[std::sync::Arc<node_monitor_core::flight::FlightRecord>],
    quick: bool,
) {
    let dir = std::env::temp_dir().join(format!("nm-flight-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("bench dir");
    let store = node_monitor::flight::store::FlightStore::new(&dir);
    let written = store.save(shared).expect("save");
    let bytes = std::fs::metadata(store.path()).map_or(0, |m| m.len());
    println!("record file at its bounds: {written} records, {bytes} bytes");
    report(
        "FlightStore::save, 16 records (write, fsync, rename)",
        &measure(
            || {
                black_box(store.save(shared).expect("save"));
            },
            1,
            if quick { 2 } else { 21 },
        ),
    );
    report(
        "FlightStore::load, 16 records",
        &measure(
            || {
                black_box(store.load().expect("load"));
            },
            1,
            if quick { 2 } else { 21 },
        ),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    // `cargo test --benches` runs this with --bench absent: keep that run short.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (per_sample, samples) = if quick { (2, 5) } else { (1000, 101) };

    let (mut r, mut at) = full_recorder();
    let held = RECORDS_KEPT * node_monitor_core::flight::RECORD_SAMPLES_BEFORE + SAMPLES_KEPT;
    println!(
        "recorder at its bounds ({RECORDS_KEPT} records, a full window of {SAMPLES_KEPT} samples; {held} samples held): {} bytes, {} bytes per sample held",
        r.approx_bytes(),
        r.approx_bytes() / held
    );
    report(
        "FlightRecorder::sample, full window",
        &measure(
            || {
                at += 100;
                r.sample(black_box(sample(at)));
            },
            per_sample,
            samples,
        ),
    );
    // A record open (in its tail): the sample is also copied into it.
    r.event(oom(at));
    let tail_start = at;
    report(
        "FlightRecorder::sample, full window, a record open",
        &measure(
            || {
                at = tail_start + (at + 1 - tail_start) % TAIL_MS;
                r.sample(black_box(sample(at)));
            },
            per_sample,
            samples,
        ),
    );

    let (config, obs, pods, figures) = agent_pass();
    let decision = synchronize(
        &mut EvictionState::new(),
        &config,
        &obs,
        &pods,
        Timestamp::ZERO,
    );
    report(
        "sample_of, 250 pods' figures (top 5)",
        &measure(
            || {
                black_box(sample_of(
                    1,
                    &config.thresholds,
                    &obs,
                    &decision,
                    &pods,
                    Some((100, &figures)),
                    None,
                ));
            },
            per_sample,
            samples,
        ),
    );
    report(
        "read_psi (/proc/pressure/memory)",
        &measure(
            || {
                black_box(read_psi(std::path::Path::new("/proc/pressure/memory")));
            },
            per_sample,
            samples,
        ),
    );
    report(
        "named_figures, 250 pods (a pass that read the pods)",
        &measure(
            || {
                black_box(node_monitor::flight::named_figures(&pods, &figures));
            },
            per_sample,
            samples,
        ),
    );
    store_at_bounds(&r.shared_records(), quick);
    let record = r.records().last().expect("a record").clone();
    report(
        "svg::render, one full record",
        &measure(
            || {
                black_box(node_monitor::flight::svg::render(&record, "node").expect("svg"));
            },
            1,
            if quick { 2 } else { 21 },
        ),
    );
}
