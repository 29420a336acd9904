//! Predictive eviction's false positives on the real node: workloads that allocate fast without
//! exhausting the node are never evicted by the shipped agent (`memory.available<100Mi`,
//! predictive eviction on). Run by `real_node::a_real_kubelet_and_containerd_with_node_monitor_from_its_manifests`
//! on its boot, after the ramp that prediction must evict.
use std::time::{Duration, Instant};

use super::real_node::scrape;
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, PostParams},
};
use node_monitor_tests::{
    metrics,
    real_node::{
        RealNode,
        scenario::{NS, fail, workload},
    },
};

/// The three workloads, each (name, nm-workload arguments, what it is):
/// - a sawtooth: 64 MiB every 100 ms up to 512 MiB, all freed, three times;
/// - page cache from reads: a 512 MiB file written, then read twice;
/// - a burst: 512 MiB at 256 MiB per 100 ms, then held 4 s and ended.
///
/// Each is short (its own run a few seconds; the pod's start and end under emulation dominate):
/// the guest tiers' time is what bounds CI on a slow machine.
const LOADS: [(&str, &[&str], &str); 3] = [
    (
        "sawtooth",
        &[
            "--ramp-to",
            "512Mi",
            "--step",
            "64Mi",
            "--interval",
            "100ms",
            "--cycles",
            "3",
            "--sleep",
            "1s",
        ],
        "allocate and free",
    ),
    (
        "cache-reader",
        &[
            "--cache-file",
            "/tmp/cache",
            "--cache-size",
            "512Mi",
            "--cache-passes",
            "2",
            "--sleep",
            "1s",
        ],
        "page cache filled by reads",
    ),
    (
        "burst",
        &[
            "--ramp-to",
            "512Mi",
            "--step",
            "256Mi",
            "--interval",
            "100ms",
            "--sleep",
            "4s",
        ],
        "a burst that stops",
    ),
];

/// Events on pods of the test namespace with `reason`, by pod name.
async fn events_on(client: &Client, name: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter_map(|e| e.reason)
        .filter(|r| r == "Evicted" || r == "EvictionDryRun")
        .collect()
}

/// Runs `name` until it ends by itself (Succeeded), failing the test if it is evicted or
/// fails; deletes it after.
async fn run_to_completion(client: &Client, node: &RealNode, name: &str, args: &[&str]) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut command = vec!["/usr/local/bin/nm-workload"];
    command.extend_from_slice(args);
    pods.create(&PostParams::default(), &workload(name, &command).build())
        .await
        .expect("create the workload");
    let started = Instant::now();
    let phase = loop {
        let phase = pods
            .get_opt(name)
            .await
            .expect("get the workload")
            .and_then(|p| p.status)
            .and_then(|s| s.phase)
            .unwrap_or_default();
        if phase == "Succeeded" || phase == "Failed" {
            break phase;
        }
        if started.elapsed() > Duration::from_secs(300) || !node.running() {
            fail(
                node,
                &format!("{name} did not end within 300 s (phase {phase:?})"),
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(phase, "Succeeded", "{name} ran to its end");
    let _ = pods.delete(name, &DeleteParams::default()).await;
    while pods.get_opt(name).await.ok().flatten().is_some() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Each workload runs to its own end, with no eviction and no prediction.
pub(crate) async fn fast_allocations_that_do_not_exhaust_the_node_are_left_alone(
    client: &Client,
    node: &mut RealNode,
    agent_ip: &str,
) {
    let predicted = |m: &str| metrics::sum(m, "node_monitor_predicted_evictions_total", &[]);
    let before = predicted(&scrape(node, agent_ip, "metrics-before-workloads.txt").await);
    for (name, args, what) in LOADS {
        let started = Instant::now();
        run_to_completion(client, node, name, args).await;
        assert_eq!(
            events_on(client, name).await,
            Vec::<String>::new(),
            "{what} ({name}) is not evicted"
        );
        eprintln!(
            "real node: {what} ({name}) ran to its end in {:.1} s, not evicted",
            started.elapsed().as_secs_f64()
        );
    }
    let after = predicted(&scrape(node, agent_ip, "metrics-after-workloads.txt").await);
    assert_eq!(after, before, "no predicted eviction during the workloads");
}
