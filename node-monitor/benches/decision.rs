//! Decision-core benchmark: one `synchronize` pass over 110, 250 and 500 pods, under memory
//! pressure (rank, plan and message) and with no pressure; plus converting the API pods. A plain
//! timing harness: warm-up, then timed samples, reporting min / median / p95 / p99 per call.
//!
//! `cargo bench -p node-monitor --bench decision` (figures in docs/benchmarks.md).

mod harness;

use harness::{Stats, measure};
use std::{
    collections::{BTreeMap, HashMap},
    hint::black_box,
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use node_monitor_core::{
    config::{ConfigSource, EvictionConfig, EvictionOverrides, load_sources},
    eviction::{EvictionState, synchronize},
    kubelet::pod::{ContainerUsage, PodInfo},
    signals::{Observations, PodUsage, Signal, SignalObservation},
    units::clock::Timestamp,
};
use serde_json::json;

/// The pod counts measured: the kubelet's default `maxPods`, and two denser nodes.
const POD_COUNTS: [usize; 3] = [110, 250, 500];
const GI: i64 = 1 << 30;
const MI: u64 = 1 << 20;

/// A deterministic spread of pods: a third BestEffort, a third Burstable, a third Guaranteed,
/// a few critical, priorities in several bands, two containers each.
fn api_pods(count: usize) -> Vec<Pod> {
    (0..count)
        .map(|i| {
            let request = format!("{}Mi", 64 + (i % 7) * 64);
            let resources = match i % 3 {
                0 => json!({}),
                1 => json!({"requests": {"memory": request, "cpu": "100m"}}),
                _ => json!({"requests": {"memory": request, "cpu": "1"},
                            "limits": {"memory": request, "cpu": "1"}}),
            };
            let mut pod = json!({
                "metadata": {"name": format!("pod-{i}"), "namespace": format!("ns-{}", i % 10),
                             "uid": format!("uid-{i}")},
                "spec": {
                    "containers": [
                        {"name": "app", "resources": resources},
                        {"name": "sidecar", "resources": resources}
                    ],
                    "priority": (i % 5) as i32 * 1000,
                    "terminationGracePeriodSeconds": 30
                },
                "status": {"phase": "Running"}
            });
            if i % 50 == 0 {
                pod["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "x"});
            }
            serde_json::from_value(pod).expect("pod json")
        })
        .collect()
}

fn usage(count: usize) -> HashMap<String, PodUsage> {
    (0..count)
        .map(|i| {
            let memory = (32 + (i as u64 * 37) % 900) * MI;
            (
                format!("uid-{i}"),
                PodUsage {
                    memory: Some(memory),
                    disk: Some(memory / 2),
                    processes: Some(1 + i as u64 % 40),
                    writable_layers: None,
                    inodes: None,
                    writable_layer_inodes: None,
                },
            )
        })
        .collect()
}

fn pod_infos(pods: &[Pod], usage: &HashMap<String, PodUsage>) -> Vec<PodInfo> {
    pods.iter()
        .map(|p| {
            let mut info = PodInfo::from_pod(p).expect("pod info");
            let total = usage[&info.uid].memory.unwrap_or(0);
            for c in &mut info.containers {
                c.usage = ContainerUsage {
                    memory: Some(total / 2),
                    disk: Some(total / 4),
                };
            }
            info
        })
        .collect()
}

fn config() -> EvictionConfig {
    let yaml = "evictionSoft:\n  memory.available: 1Gi\nevictionSoftGracePeriod:\n  memory.available: 1m\nevictionMinimumReclaim:\n  memory.available: 200Mi\nmergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 500Mi\n";
    load_sources(
        &[ConfigSource {
            name: "bench",
            text: yaml,
        }],
        &EvictionOverrides::default(),
    )
    .expect("config")
}

fn observations(memory_available: i64, usage: HashMap<String, PodUsage>) -> Observations {
    let signals: BTreeMap<Signal, SignalObservation> = [
        (Signal::MemoryAvailable, memory_available, 64 * GI),
        (
            Signal::AllocatableMemoryAvailable,
            memory_available,
            63 * GI,
        ),
        (Signal::NodeFsAvailable, 200 * GI, 500 * GI),
        (Signal::NodeFsInodesFree, 20_000_000, 32_000_000),
        (Signal::ImageFsAvailable, 200 * GI, 500 * GI),
        (Signal::ImageFsInodesFree, 20_000_000, 32_000_000),
        (Signal::PidAvailable, 4_000_000, 4_194_304),
    ]
    .into_iter()
    .map(|(s, available, capacity)| {
        (
            s,
            SignalObservation {
                available,
                capacity,
            },
        )
    })
    .collect();
    Observations {
        signals,
        pods: usage,
        ..Default::default()
    }
}

fn report(name: &str, s: &Stats) {
    println!(
        "{name:<48} min {:>9.2} µs   median {:>9.2} µs   p95 {:>9.2} µs   p99 {:>9.2} µs",
        s.min.as_secs_f64() * 1e6,
        s.median.as_secs_f64() * 1e6,
        s.p95.as_secs_f64() * 1e6,
        s.p99.as_secs_f64() * 1e6
    );
}

fn main() {
    // `cargo test --benches` runs this with --bench absent: keep that run short.
    let quick = !std::env::args().any(|a| a == "--bench");
    // Batched samples for the calm case (far below the clock's resolution per call); one call per
    // sample for the pressure case, so its percentiles are per decision.
    let (per_sample, samples, single_samples) = if quick { (2, 5, 5) } else { (200, 101, 2001) };
    for count in POD_COUNTS {
        bench_pods(count, per_sample, samples, single_samples);
    }
}

fn bench_pods(count: usize, per_sample: u32, samples: usize, single_samples: usize) {
    let api = api_pods(count);
    let usage = usage(count);
    let pods = pod_infos(&api, &usage);
    let config = config();
    let pressure = observations(300 * MI as i64, usage.clone());
    let calm = observations(20 * GI, usage);

    // Sanity: the pressure case ranks every pod and evicts one.
    let mut state = EvictionState::new();
    let d = synchronize(&mut state, &config, &pressure, &pods, Timestamp::ZERO);
    assert_eq!(d.ranked.len(), count);
    assert_eq!(d.evict.len(), 1);

    println!("decision core, {count} pods");
    let mut now = Timestamp::ZERO;
    for (label, observed, per_sample, samples) in [
        (
            "synchronize, memory pressure (rank+plan), per call",
            &pressure,
            1,
            single_samples,
        ),
        ("synchronize, no pressure", &calm, per_sample, samples),
    ] {
        let mut state = EvictionState::new();
        let s = measure(
            || {
                now = now + Duration::from_secs(1);
                black_box(synchronize(
                    &mut state,
                    &config,
                    black_box(observed),
                    black_box(&pods),
                    now,
                ));
            },
            per_sample,
            samples,
        );
        report(label, &s);
    }

    let s = measure(
        || {
            for p in black_box(&api) {
                black_box(PodInfo::from_pod(p).ok());
            }
        },
        per_sample.div_ceil(10),
        samples,
    );
    report(&format!("PodInfo::from_pod x {count}"), &s);
}
