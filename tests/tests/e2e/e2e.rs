//! End to end: the real `node-monitor` binary as the agent of a stand-in node (pods are real
//! processes in kubelet-layout cgroups under a 1 GiB node cgroup), against a real etcd,
//! kube-apiserver and kube-controller-manager, under real memory pressure. Every scenario asserts on
//! the API server's state. Root only; fails loudly when it cannot run.
use std::time::{Duration, Instant};

use node_monitor_tests::{
    e2e::{Agent, Cluster},
    pod::PodBuilder,
};

const MI: u64 = 1 << 20;
const NODE_MEMORY: u64 = 1024 * MI;
const NS: &str = "default";

/// The node cgroup's kernel OOM kills: a scenario that reacts in time has none.
fn node_oom_kills(cluster: &Cluster) -> u64 {
    cluster.oom_kills().expect("oom_kill counter")
}

async fn running(cluster: &Cluster, pod: PodBuilder) -> String {
    cluster.run_pod(pod).await.expect("pod running")
}

/// A stand-in node named `node` with the agent running `config` (and `extra` arguments) as its
/// agent, deciding.
async fn with_agent(node: &str, config: &str, extra: &[&str]) -> (Cluster, Agent) {
    let cluster = Cluster::start(node, NODE_MEMORY).await.expect("cluster");
    let agent = Agent::start(&cluster, config, extra)
        .await
        .expect("agent up");
    (cluster, agent)
}

/// Asserts that the pod `name` leaves the API within `within`; says `why` with the agent's log
/// otherwise.
async fn assert_gone(cluster: &Cluster, agent: &Agent, name: &str, within: Duration, why: &str) {
    assert!(
        cluster
            .wait_gone(NS, name, within)
            .await
            .expect("watch")
            .is_some(),
        "{why}:\n{}",
        agent.log()
    );
}

/// Asserts that the pod `name` is still live; says `why` with the agent's log otherwise.
async fn assert_live(cluster: &Cluster, agent: &Agent, name: &str, why: &str) {
    assert!(
        cluster.is_live(NS, name).await.expect("get"),
        "{name}: {why}:\n{}",
        agent.log()
    );
}

/// `node_monitor_evictions_total` summed over the samples with all of `labels`.
async fn evictions(agent: &Agent, labels: &[(&str, &str)]) -> f64 {
    agent
        .metric_sum("node_monitor_evictions_total", labels)
        .await
        .expect("metrics")
}

/// Scenario 1: a climbing BestEffort pod is evicted before the OOM killer acts; the Guaranteed
/// pod is never touched; the eviction carries the kubelet's wording and the agent-owned
/// condition and taint are published. A SIGTERM while they hold takes them back: the taint goes,
/// the condition turns Unknown (NodeMonitorStopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn besteffort_climber_is_evicted_never_the_guaranteed_pod() {
    let (cluster, mut agent) = with_agent(
        "e2e-climb",
        "evictionHard:\n  memory.available: 300Mi\nevictionPressureTransitionPeriod: 30s\nnodeMonitor:\n  taintOnPressure: true\n",
        &["--no-mlock"],
    )
    .await;
    let node = cluster.node.clone();
    running(
        &cluster,
        PodBuilder::workload("guaranteed", &node, &["--hold", "150Mi"])
            .memory("200Mi", Some("200Mi")),
    )
    .await;
    running(
        &cluster,
        PodBuilder::ramping("climber", &node, "900Mi", "16Mi", "100ms"),
    )
    .await;

    assert_gone(
        &cluster,
        &agent,
        "climber",
        Duration::from_secs(60),
        "the climber was not evicted",
    )
    .await;
    assert_live(
        &cluster,
        &agent,
        "guaranteed",
        "the Guaranteed pod must stay",
    )
    .await;
    let events = cluster
        .events(NS, "climber", "Evicted")
        .await
        .expect("events");
    let msg = events
        .first()
        .and_then(|e| e.message.clone())
        .expect("an Evicted event on the pod");
    assert!(
        msg.starts_with(
            "The node was low on resource: memory. Threshold quantity: 300Mi, available: "
        ),
        "{msg}"
    );
    assert_eq!(
        events[0]
            .source
            .as_ref()
            .and_then(|s| s.component.as_deref()),
        Some("node-monitor")
    );
    assert_eq!(
        node_oom_kills(&cluster),
        0,
        "the kernel OOM killer acted first:\n{}",
        agent.log()
    );
    let evicted = evictions(
        &agent,
        &[
            ("eviction_signal", "memory.available"),
            ("outcome", "evicted"),
        ],
    )
    .await;
    assert!(evicted >= 1.0, "evictions_total={evicted}");

    // The agent-owned condition was published (and the kubelet's own conditions were left alone).
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(cluster.client());
    let n = nodes.get(&cluster.node).await.expect("node");
    let conds = n
        .status
        .clone()
        .and_then(|s| s.conditions)
        .unwrap_or_default();
    let mine = conds
        .iter()
        .find(|c| c.type_ == "NodeMonitorMemoryPressure")
        .expect("agent condition");
    assert_eq!(
        mine.status, "True",
        "pressure persists for the transition period: {mine:?}"
    );
    assert!(
        conds
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True"),
        "Ready untouched: {conds:?}"
    );
    let pressure_taint = |n: &k8s_openapi::api::core::v1::Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "node-monitor.io/memory-pressure"))
    };
    assert!(
        pressure_taint(&n),
        "the pressure taint is set: {:?}",
        n.spec
    );

    assert!(
        agent.terminate().expect("SIGTERM").success(),
        "clean exit on SIGTERM"
    );
    let n = nodes.get(&cluster.node).await.expect("node");
    assert!(
        !pressure_taint(&n),
        "a clean stop removes the pressure taint: {:?}\n{}",
        n.spec,
        agent.log()
    );
    let conds = n.status.and_then(|s| s.conditions).unwrap_or_default();
    let stopped = conds
        .iter()
        .find(|c| c.type_ == "NodeMonitorMemoryPressure")
        .expect("agent condition");
    assert_eq!(
        (stopped.status.as_str(), stopped.reason.as_deref()),
        ("Unknown", Some("NodeMonitorStopped")),
        "{stopped:?}"
    );
    cluster.stop().await.expect("stop");
}

/// Scenario 2: a Burstable pod over its request outranks one under its request; among pods over
/// their requests, the lower priority goes first even when it uses less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranking_exceeds_request_then_priority() {
    let (cluster, agent) = with_agent(
        "e2e-rank",
        "evictionHard:\n  memory.available: 400Mi\n",
        &["--no-mlock"],
    )
    .await;
    cluster
        .create_priority_class("high", 1000)
        .await
        .expect("priority class");
    let node = cluster.node.clone();
    running(
        &cluster,
        PodBuilder::workload("over", &node, &["--hold", "150Mi"]).memory("50Mi", None),
    )
    .await;
    running(
        &cluster,
        PodBuilder::workload("under", &node, &["--hold", "100Mi"]).memory("400Mi", None),
    )
    .await;
    running(
        &cluster,
        PodBuilder::workload("filler", &node, &["--hold", "400Mi"]).memory("450Mi", Some("450Mi")),
    )
    .await;

    assert_gone(
        &cluster,
        &agent,
        "over",
        Duration::from_secs(40),
        "the pod over its request goes first",
    )
    .await;
    for p in ["under", "filler"] {
        assert_live(&cluster, &agent, p, "must stay").await;
    }

    // Both new pods exceed their requests; priority decides, not usage.
    running(
        &cluster,
        PodBuilder::workload("low-prio", &node, &["--hold", "60Mi"]).memory("10Mi", None),
    )
    .await;
    running(
        &cluster,
        PodBuilder::workload("high-prio", &node, &["--hold", "110Mi"])
            .memory("10Mi", None)
            .priority_class("high"),
    )
    .await;
    assert_gone(
        &cluster,
        &agent,
        "low-prio",
        Duration::from_secs(40),
        "the lower-priority pod goes first",
    )
    .await;
    for p in ["high-prio", "under", "filler"] {
        assert!(
            cluster.is_live(NS, p).await.expect("get"),
            "{p} must stay:\n{}",
            agent.log()
        );
    }
    assert_eq!(node_oom_kills(&cluster), 0);
    cluster.stop().await.expect("stop");
}

async fn pdb_scenario(policy: &str) -> (Cluster, Agent) {
    let (cluster, agent) = with_agent(
        &format!("e2e-pdb-{policy}"),
        &format!("evictionHard:\n  memory.available: 300Mi\nnodeMonitor:\n  pdbPolicy: {policy}\n"),
        &["--no-mlock"],
    )
    .await;
    let node = cluster.node.clone();
    running(
        &cluster,
        PodBuilder::workload("guarded", &node, &["--hold", "300Mi"]),
    )
    .await;
    running(
        &cluster,
        PodBuilder::workload("other", &node, &["--hold", "100Mi"]),
    )
    .await;
    cluster.create_pdb(NS, "guarded", 1).await.expect("pdb");
    // Cross the 300Mi threshold by 50Mi, measured from the ground truth, so evicting "other"
    // (100Mi) alone relieves the pressure whatever the node's baseline usage.
    let available = cluster
        .settled_memory_available()
        .await
        .expect("node memory")
        / MI as i64;
    let trigger = available - 300 + 50;
    assert!(
        trigger > 0,
        "the node is already under pressure: {available}Mi available"
    );
    let (hold, limit) = (format!("{trigger}Mi"), format!("{}Mi", trigger + 32));
    running(
        &cluster,
        PodBuilder::workload("trigger", &node, &["--hold", &hold]).memory(&limit, Some(&limit)),
    )
    .await;
    (cluster, agent)
}

/// Scenario 3a: `pdbPolicy: respect` — the PDB blocks the top-ranked pod (429), the agent backs
/// off and evicts the next candidate; the guarded pod stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_respected_next_candidate_evicted() {
    let (cluster, agent) = pdb_scenario("respect").await;
    assert_gone(
        &cluster,
        &agent,
        "other",
        Duration::from_secs(40),
        "the next candidate is evicted while the guarded pod backs off",
    )
    .await;
    assert_live(&cluster, &agent, "guarded", "the PDB is respected").await;
    let blocked = evictions(&agent, &[("outcome", "pdb_blocked"), ("threshold", "hard")]).await;
    assert!(blocked >= 1.0, "pdb_blocked={blocked}");
    assert!(
        !cluster
            .events(NS, "guarded", "EvictionBlocked")
            .await
            .expect("events")
            .is_empty()
    );
    assert_eq!(evictions(&agent, &[("outcome", "escalated")]).await, 0.0);
    cluster.stop().await.expect("stop");
}

/// Scenario 3b: `pdbPolicy: escalate` — under a hard threshold the blocked pod is deleted with the
/// minimal grace period (never a force delete) and the escalation is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pdb_escalated_under_hard_threshold() {
    let (cluster, agent) = pdb_scenario("escalate").await;
    assert_gone(
        &cluster,
        &agent,
        "guarded",
        Duration::from_secs(40),
        "the blocked pod is deleted under hard pressure",
    )
    .await;
    assert_live(&cluster, &agent, "other", "one pod was enough").await;
    let escalated = evictions(&agent, &[("outcome", "escalated")]).await;
    assert!(escalated >= 1.0, "escalated={escalated}");
    cluster.stop().await.expect("stop");
}

/// Scenario 4: a soft threshold — nothing happens before its grace period ends; then the pod is
/// evicted with min(its terminationGracePeriodSeconds, evictionMaxPodGracePeriod). Predictive
/// eviction is off here: a 700 MiB climb at over 1 GiB/s on a 1 GiB node is, if it lasts more
/// than a second on a loaded host, a runaway by the predictor's rule, and would meet the hard
/// threshold before the soft one's grace period ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_threshold_waits_for_its_grace_period() {
    const GRACE: Duration = Duration::from_secs(8);
    let (cluster, agent) = with_agent(
        "e2e-soft",
        "evictionHard:\n  memory.available: 50Mi\nevictionSoft:\n  memory.available: 400Mi\nevictionSoftGracePeriod:\n  memory.available: 8s\nevictionMaxPodGracePeriod: 3\nnodeMonitor:\n  predictiveEviction: false\n",
        &["--no-mlock"],
    )
    .await;
    let node = cluster.node.clone();
    running(
        &cluster,
        PodBuilder::ramping("soft", &node, "700Mi", "64Mi", "50ms").termination_grace(30),
    )
    .await;

    // Ground truth: when memory.available truly crossed 400Mi, read from the cgroup files.
    let deadline = Instant::now() + Duration::from_secs(20);
    let crossed = loop {
        if cluster.memory_available().expect("read node cgroup") < 400 * MI as i64 {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "memory.available never crossed 400Mi"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    tokio::time::sleep(GRACE / 2).await;
    assert!(
        cluster.is_live(NS, "soft").await.expect("get"),
        "evicted before the grace period ended:\n{}",
        agent.log()
    );
    let gone = cluster
        .wait_gone(NS, "soft", Duration::from_secs(40))
        .await
        .expect("watch")
        .expect("evicted after grace");
    // Semantics, not speed: the eviction cannot precede the grace period (less the sampling skew
    // between the ground-truth sampler and the agent).
    assert!(
        gone.duration_since(crossed) >= GRACE - Duration::from_millis(500),
        "evicted {:?} after the crossing",
        gone.duration_since(crossed)
    );
    let log = agent.log();
    let line = log
        .lines()
        .find(|l| l.contains("evicting") && l.contains("default/soft"))
        .expect("eviction logged");
    assert!(
        line.contains("hard=false") && line.contains("grace=3"),
        "soft eviction uses min(30, evictionMaxPodGracePeriod=3): {line}"
    );
    cluster.stop().await.expect("stop");
}

/// Scenario 6: dry-run decides, logs and counts, and touches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_touches_nothing() {
    let (cluster, mut agent) = with_agent(
        "e2e-dry",
        "evictionHard:\n  memory.available: 300Mi\n",
        &["--no-mlock", "--dry-run"],
    )
    .await;
    let node = cluster.node.clone();
    running(
        &cluster,
        PodBuilder::workload("hog", &node, &["--hold", "800Mi"]),
    )
    .await;
    agent
        .wait_log("dry-run: would evict", Duration::from_secs(30))
        .await
        .expect("decision logged");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_live(&cluster, &agent, "hog", "dry-run must not evict").await;
    assert!(
        cluster
            .events(NS, "hog", "Evicted")
            .await
            .expect("events")
            .is_empty()
    );
    assert!(
        !cluster
            .events(NS, "hog", "EvictionDryRun")
            .await
            .expect("events")
            .is_empty(),
        "the would-be eviction is reported"
    );
    let dry = evictions(&agent, &[("outcome", "dry_run")]).await;
    assert!(dry >= 1.0, "dry_run={dry}");
    assert_eq!(evictions(&agent, &[("outcome", "evicted")]).await, 0.0);
    cluster.stop().await.expect("stop");
}

/// Scenario 5: the API server is stopped mid-pressure and restarted. The agent keeps sampling
/// and deciding, fails its eviction requests without crashing, and evicts once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_outage_mid_pressure_is_survived() {
    let (mut cluster, mut agent) = with_agent(
        "e2e-outage",
        "evictionHard:\n  memory.available: 300Mi\n",
        &["--no-mlock"],
    )
    .await;
    let node = cluster.node.clone();
    running(
        &cluster,
        PodBuilder::workload("steady", &node, &["--hold", "100Mi"]).memory("150Mi", Some("150Mi")),
    )
    .await;
    // Crosses 300Mi available a few seconds from now, and stops below the node's limit.
    running(
        &cluster,
        PodBuilder::ramping("climber", &node, "800Mi", "32Mi", "250ms"),
    )
    .await;
    cluster.cp.stop_apiserver().expect("stop apiserver");
    agent
        .wait_log("eviction request failed", Duration::from_secs(60))
        .await
        .expect("evictions fail while the API is down");
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster
        .cp
        .restart_apiserver()
        .await
        .expect("restart apiserver");

    assert_gone(
        &cluster,
        &agent,
        "climber",
        Duration::from_secs(60),
        "the agent catches up once the API server is back",
    )
    .await;
    assert_live(&cluster, &agent, "steady", "one eviction was enough").await;
    let errors = agent
        .metric_sum("node_monitor_api_errors_total", &[("operation", "evict")])
        .await
        .expect("metrics");
    assert!(
        errors >= 1.0,
        "api_errors_total{{operation=evict}}={errors}"
    );
    assert_eq!(node_oom_kills(&cluster), 0, "{}", agent.log());
    assert!(
        agent.terminate().expect("SIGTERM").success(),
        "the agent survived the outage and exits cleanly"
    );
    cluster.stop().await.expect("stop");
}

/// A capped container OOM-killed twice (killed, restarted at once, killed again; the next
/// restart waits out a long back-off): exactly one `OOMKilling` Warning Event on the pod, naming
/// the container and its limit, whose count is 2 after the second kill.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_oom_kills_make_one_oomkilling_event_with_a_count() {
    let long = Duration::from_secs(600);
    let cluster = Cluster::start_with("e2e-oom", NODE_MEMORY, |c| c.restart_backoff(long, long))
        .await
        .expect("cluster");
    let config = "evictionHard:\n  memory.available: 100Mi\n";
    let mut agent = Agent::start(&cluster, config, &["--no-mlock"])
        .await
        .expect("agent up");
    // The record must hold samples from before the kill: the agent's first pass, which starts
    // once it logs `deciding`, has to be over first (on a loaded machine it can outlast the
    // pod's start and kill).
    node_monitor_tests::wait::eventually(
        "the flight recorder's first sample",
        Duration::from_secs(60),
        async || {
            agent
                .metric_sum("node_monitor_flight_recorder_bytes", &[])
                .await
                .ok()
                .filter(|b| *b > 0.0)
        },
    )
    .await;
    let node = cluster.node.clone();
    let pod = cluster
        .create_pod(
            PodBuilder::workload("capped", &node, &["--hold", "64Mi"])
                .memory("32Mi", Some("32Mi"))
                .build(),
        )
        .await
        .expect("capped pod");
    let uid = pod.metadata.uid.clone().expect("uid");
    let event = node_monitor_tests::wait::eventually(
        "an OOMKilling Event with count 2",
        Duration::from_secs(60),
        async || {
            let events = cluster
                .events(NS, "capped", "OOMKilling")
                .await
                .expect("list events");
            events.iter().find(|e| e.count == Some(2)).cloned()
        },
    )
    .await;
    let all = cluster
        .events(NS, "capped", "OOMKilling")
        .await
        .expect("list events");
    assert_eq!(
        all.len(),
        1,
        "one Event for the series: {all:#?}\n{}",
        agent.log()
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.involved_object.uid.as_deref(), Some(uid.as_str()));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(
        event.involved_object.field_path.as_deref(),
        Some("spec.containers{main}")
    );
    assert_eq!(event.reporting_component.as_deref(), Some("node-monitor"));
    assert_eq!(event.reporting_instance.as_deref(), Some(node.as_str()));
    let message = event.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("Memory cgroup out of memory: Killed process ")
            && message.contains(" in container main: limit 32Mi, RSS "),
        "{message}"
    );
    assert!(event.last_timestamp >= event.first_timestamp, "{event:#?}");
    let kill = flight_record_holds_the_kill(&cluster, &agent).await;
    flight_record_survives_a_restart(&cluster, &mut agent, config, &kill).await;
}

/// A process in no pod (a system daemon under its own memory limit) OOM-killed by the kernel:
/// no pod carries an Event for it, so the agent writes node-problem-detector's `OOMKilling` on
/// the Node, in `default`, in the kernel's wording.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_kill_outside_any_pod_is_an_oomkilling_event_on_the_node() {
    let cluster = Cluster::start("e2e-oom-node", NODE_MEMORY)
        .await
        .expect("cluster");
    let agent = Agent::start(
        &cluster,
        "evictionHard:\n  memory.available: 100Mi\n",
        &["--no-mlock"],
    )
    .await
    .expect("agent up");
    // A daemon in a cgroup of its own with a 32 MiB limit, touching 256 MiB.
    let mut cg = node_monitor_tests::cgroup::TestCgroups::new("e2e-oom-daemon");
    cg.create("daemon").expect("daemon cgroup");
    cg.set_memory_limit("daemon", 32 * MI).expect("limit");
    let status = cg
        .spawn_in(
            "daemon",
            std::process::Command::new(node_monitor_tests::e2e::binary("nm-memhog"))
                .args(["anon", "256"])
                .stdout(std::process::Stdio::null()),
        )
        .expect("spawn the daemon")
        .wait()
        .expect("wait for the daemon");
    assert!(!status.success(), "the daemon was OOM-killed: {status:?}");
    let node = cluster.node.clone();
    let event = node_monitor_tests::wait::eventually(
        "an OOMKilling Event on the Node",
        Duration::from_secs(60),
        async || {
            cluster
                .events(NS, &node, "OOMKilling")
                .await
                .expect("list events")
                .into_iter()
                .find(|e| {
                    e.message
                        .as_deref()
                        .is_some_and(|m| m.contains("(nm-memhog)"))
                })
        },
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(event.involved_object.name.as_deref(), Some(node.as_str()));
    assert_eq!(event.reporting_component.as_deref(), Some("node-monitor"));
    let message = event.message.clone().unwrap_or_default();
    assert!(
        message.starts_with("Memory cgroup out of memory: Killed process ")
            && message.contains(" (nm-memhog)"),
        "{message}\n{}",
        agent.log()
    );
    eprintln!("the Node's OOMKilling Event: {message}");
    // node-problem-detector's pattern: the memory figures, when the probe read them.
    if message.contains("total-vm:") {
        assert!(
            message.contains("kB, anon-rss:") && message.contains("kB, file-rss:"),
            "{message}"
        );
    }
    drop(agent);
    cluster.stop().await.expect("stop");
}

/// The agent's flight records of the node's `/node-monitor/v1/flight`, newest first.
async fn flight_records(
    cluster: &Cluster,
    agent: &Agent,
) -> Vec<node_monitor::flight::FlightRecord> {
    let body = agent
        .node_api_get(cluster, node_monitor::http::FLIGHT_PATH)
        .await
        .unwrap_or_else(|e| panic!("GET flight: {e:#}\n{}", agent.log()));
    let answer: serde_json::Value = serde_json::from_str(&body).expect("flight JSON");
    node_monitor::flight::records_of(&answer).expect("flight records")
}

/// A restarted agent (SIGTERM, then a new process over the same `nodeMonitor.stateDir`) serves
/// the record of the kill the previous one froze, as it was.
async fn flight_record_survives_a_restart(
    cluster: &Cluster,
    agent: &mut Agent,
    config: &str,
    kill: &node_monitor::flight::FlightRecord,
) {
    agent.terminate().expect("SIGTERM");
    let file = agent.state_dir.join(node_monitor::flight::store::FILE);
    assert!(
        file.is_file(),
        "{} written\n{}",
        file.display(),
        agent.log()
    );
    let mut again = Agent::spawn_in(
        cluster,
        config,
        &["--no-mlock"],
        "127.0.0.1",
        Some(&agent.state_dir),
    )
    .expect("agent respawned");
    again
        .wait_log("deciding", Duration::from_secs(30))
        .await
        .expect("agent up again");
    assert!(
        again
            .log()
            .contains("flight records of an earlier run restored"),
        "{}",
        again.log()
    );
    let records = flight_records(cluster, &again).await;
    let restored = records
        .iter()
        .find(|r| r.id == kill.id)
        .unwrap_or_else(|| panic!("the kill's record after the restart: {records:#?}"));
    assert_eq!(restored.trigger, kill.trigger);
    assert_eq!(restored.samples.first(), kill.samples.first());
    assert_eq!(
        again
            .metric_sum("node_monitor_flight_store_errors_total", &[])
            .await
            .expect("metrics"),
        0.0
    );
}

/// The agent's flight recorder kept the kill (`/node-monitor/v1/flight`): a record triggered by
/// the OOM kill of the capped pod's process, the samples of the seconds before it (the agent's
/// own passes, with the node's memory signal and its threshold), the verdict that the kill was
/// in the pod's own limit, and its SVG timeline with the kill's marker. On this calm node no
/// threshold is near, yet the record shows the killed pod's working set (read by the pass the
/// kill woke). Returns the record.
async fn flight_record_holds_the_kill(
    cluster: &Cluster,
    agent: &Agent,
) -> node_monitor::flight::FlightRecord {
    let body = agent
        .node_api_get(cluster, node_monitor::http::FLIGHT_PATH)
        .await
        .unwrap_or_else(|e| panic!("GET flight: {e:#}\n{}", agent.log()));
    let answer: serde_json::Value = serde_json::from_str(&body).expect("flight JSON");
    let records = node_monitor::flight::records_of(&answer).expect("flight records");
    let kill = records
        .iter()
        .find(|r| {
            matches!(&r.trigger.kind, node_monitor::flight::EventKind::OomKill { pod, .. }
                     if pod == "default/capped")
        })
        .unwrap_or_else(|| panic!("a record of the kill: {body}\n{}", agent.log()));
    let before: Vec<_> = kill
        .samples
        .iter()
        .filter(|s| s.at_ms <= kill.trigger.at_ms)
        .collect();
    assert!(!before.is_empty(), "samples before the kill: {body}");
    assert!(
        before
            .iter()
            .all(|s| kill.trigger.at_ms - s.at_ms <= node_monitor_core::flight::WINDOW_MS),
        "{body}"
    );
    let signal = before[0]
        .signals
        .iter()
        .find(|p| p.signal == "memory.available")
        .unwrap_or_else(|| panic!("memory.available sampled: {body}"));
    assert_eq!(signal.hard, Some(100 << 20), "{body}");
    assert!(signal.available > 0 && signal.capacity > 0, "{body}");
    assert!(
        kill.verdict().contains("in a cgroup's own limit"),
        "{}",
        kill.verdict()
    );
    assert!(
        kill.samples.iter().any(|s| s
            .top_pods
            .iter()
            .any(|p| p.pod == "default/capped" && p.working_set > 0)),
        "the killed pod's working set in the record: {body}"
    );
    let svg = node_monitor::flight::svg::render(kill, &cluster.node).expect("SVG");
    assert!(svg.contains("OOM kill: cgroup OOM kill of"), "{svg}");
    assert!(svg.contains("memory.available available"), "{svg}");
    kill.clone()
}

/// Scenario 6: coexisting with the kubelet. The kubelet's own configuration file (under the
/// agent's `--kubelet-root`) sets `memory.available<500Mi`, above the agent's 300Mi, and
/// `nodefs.available<5%`, below the agent's 10%: the agent warns that the kubelet acts first for
/// `memory.available` and exports it. A second agent finds the file malformed: it warns naming
/// the file, the field and the value, and keeps deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_thresholds_above_the_agents_are_reported() {
    let kubelet_root = tempfile::tempdir().expect("tempdir");
    let kubelet_config = kubelet_root.path().join("config.yaml");
    std::fs::write(
        &kubelet_config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         cgroupDriver: cgroupfs\nevictionHard:\n  memory.available: 500Mi\n  nodefs.available: 5%\n",
    )
    .expect("kubelet config");
    let root_arg = kubelet_root.path().display().to_string();
    let config = format!(
        "evictionHard:\n  memory.available: 300Mi\n  nodefs.available: 10%\n\
         nodeMonitor:\n  kubeletConfigPath: {}\n",
        kubelet_config.display()
    );
    let (cluster, mut agent) = with_agent(
        "e2e-kubelet-cfg",
        &config,
        &["--no-mlock", "--kubelet-root", &root_arg],
    )
    .await;
    agent
        .wait_log("the kubelet acts first", Duration::from_secs(30))
        .await
        .expect("the kubelet-first warning");
    let log = agent.log();
    let warning = log
        .lines()
        .find(|l| l.contains("the kubelet acts first"))
        .expect("warning line");
    assert!(
        warning.contains("WARN") && warning.contains("signal=memory.available"),
        "{warning}"
    );
    assert_eq!(
        log.matches("the kubelet acts first").count(),
        1,
        "warned once, not per cycle:\n{log}"
    );
    assert_eq!(
        agent
            .metric_sum("node_monitor_kubelet_config_read", &[])
            .await
            .expect("metrics"),
        1.0
    );
    let preempts = "node_monitor_kubelet_threshold_preempts";
    let text = agent.metrics().await.expect("metrics");
    for (signal, want) in [("memory.available", 1.0), ("nodefs.available", 0.0)] {
        let labels = [("eviction_signal", signal), ("kind", "hard")];
        assert!(
            node_monitor_tests::metrics::has_series(&text, preempts, &labels),
            "{signal}: no series:\n{text}"
        );
        assert_eq!(
            node_monitor_tests::metrics::sum(&text, preempts, &labels),
            want,
            "{signal}"
        );
    }
    assert!(agent.terminate().expect("SIGTERM").success());

    std::fs::write(
        &kubelet_config,
        "kind: KubeletConfiguration\nevictionHard:\n  memory.available: lots\n",
    )
    .expect("kubelet config");
    let mut agent = Agent::start(
        &cluster,
        &config,
        &["--no-mlock", "--kubelet-root", &root_arg],
    )
    .await
    .expect("agent up with a malformed kubelet config");
    agent
        .wait_log("malformed eviction setting", Duration::from_secs(30))
        .await
        .expect("the malformed-file warning");
    let log = agent.log();
    let warning = log
        .lines()
        .find(|l| l.contains("malformed eviction setting"))
        .expect("warning line");
    for needle in [
        "WARN",
        kubelet_config.to_str().expect("utf-8 path"),
        "evictionHard",
        "lots",
    ] {
        assert!(warning.contains(needle), "{needle:?} missing: {warning}");
    }
    assert_eq!(
        agent
            .metric_sum("node_monitor_kubelet_config_read", &[])
            .await
            .expect("metrics"),
        0.0
    );
    assert!(
        !node_monitor_tests::metrics::has_series(
            &agent.metrics().await.expect("metrics"),
            preempts,
            &[]
        ),
        "no verdicts without the kubelet's thresholds"
    );
    assert!(agent.terminate().expect("SIGTERM").success());
    cluster.stop().await.expect("stop");
}

/// The agent as the DaemonSet runs it, with its memory locked: its own executable (code and
/// read-only data) locked and resident in full, so that no code path waits on a disk read under
/// pressure; everything else locked only as touched (`MCL_ONFAULT`), so that untouched thread
/// stacks and library pages are not made resident.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_locks_its_executable_in_full_and_the_rest_as_touched() {
    let (_cluster, mut agent) = with_agent(
        "e2e-mlock",
        "evictionHard:\n  memory.available: 100Mi\n",
        &[],
    )
    .await;
    agent
        .wait_log("start-up done", Duration::from_secs(30))
        .await
        .expect("start-up");
    let log = agent.log();
    assert!(
        log.contains("memory locked (mlockall)") && log.contains("on_fault=true"),
        "{log}"
    );
    let pid = agent.pid().expect("running");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("exe");
    let exe = exe.to_string_lossy().into_owned();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    // (header, size kB, locked kB) per mapping.
    let mut mappings: Vec<(String, u64, u64)> = Vec::new();
    for line in smaps.lines() {
        let field = |name: &str| {
            line.strip_prefix(name)
                .and_then(|v| v.trim().strip_suffix(" kB"))
                .and_then(|v| v.parse::<u64>().ok())
        };
        if let Some(size) = field("Size:") {
            if let Some(m) = mappings.last_mut() {
                m.1 = size;
            }
        } else if let Some(locked) = field("Locked:") {
            if let Some(m) = mappings.last_mut() {
                m.2 = locked;
            }
        } else if line.split_whitespace().next().is_some_and(|r| {
            r.contains('-') && r.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        }) {
            mappings.push((line.to_owned(), 0, 0));
        }
    }
    let own: Vec<_> = mappings
        .iter()
        .filter(|(h, _, _)| {
            h.ends_with(&exe)
                && h.split_whitespace()
                    .nth(1)
                    .is_some_and(|p| !p.contains('w'))
        })
        .collect();
    assert!(
        own.iter()
            .any(|(h, _, _)| h.split_whitespace().nth(1) == Some("r-xp")),
        "no code mapping of {exe}: {own:?}"
    );
    for (header, size, locked) in &own {
        // In full: every page the file backs. A few pages of a segment may have no file page
        // behind them (the end of the file, a hole), and cannot be populated.
        assert!(
            *locked + 64 >= *size,
            "the executable's mapping is not locked in full ({locked} of {size} kB): {header}"
        );
    }
    assert!(
        mappings
            .iter()
            .any(|(_, size, locked)| *locked > 0 && locked < size),
        "no mapping locked only in part: everything was populated, not locked as touched"
    );
}

/// A pod with an emptyDir `cache` limited to 4 MiB, created and Running.
async fn with_cache_volume(cluster: &Cluster, name: &str) -> k8s_openapi::api::core::v1::Pod {
    let node = cluster.node.clone();
    let mut pod = PodBuilder::workload(name, &node, &["--hold", "8Mi"]).build();
    pod.spec.as_mut().expect("spec").volumes = Some(vec![
        serde_json::from_value(serde_json::json!(
            {"name": "cache", "emptyDir": {"sizeLimit": "4Mi"}}
        ))
        .expect("volume"),
    ]);
    cluster.create_pod(pod).await.expect("create");
    cluster
        .wait_running(NS, name, Duration::from_secs(30))
        .await
        .expect("running")
}

/// The kubelet's local-storage limit eviction with no pressure at all: a pod whose emptyDir
/// (under the agent's `--kubelet-root`) holds more than its `sizeLimit` is evicted through
/// policy/v1 with the kubelet's reason and message, counted by kind; a pod within its limit
/// stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_over_its_empty_dir_size_limit_is_evicted_without_pressure() {
    let kubelet_root = tempfile::tempdir_in("/var/tmp").expect("tempdir");
    let root_arg = kubelet_root.path().display().to_string();
    let (cluster, agent) = with_agent(
        "e2e-sizelimit",
        "evictionHard:\n  memory.available: 100Mi\n",
        &["--no-mlock", "--kubelet-root", &root_arg],
    )
    .await;
    for (name, mib) in [("filler", 8usize), ("tidy", 1)] {
        let pod = with_cache_volume(&cluster, name).await;
        let uid = pod.metadata.uid.expect("uid");
        let cache = kubelet_root
            .path()
            .join("pods")
            .join(&uid)
            .join("volumes/kubernetes.io~empty-dir/cache");
        std::fs::create_dir_all(&cache).expect("mkdir");
        std::fs::write(cache.join("blob"), vec![1u8; mib * MI as usize]).expect("write");
    }
    let written = Instant::now();

    assert_gone(
        &cluster,
        &agent,
        "filler",
        Duration::from_secs(60),
        "the pod over its emptyDir's sizeLimit is evicted",
    )
    .await;
    // Bounded by the full-sample interval (10 s) and the walk; reported, not asserted.
    eprintln!(
        "over its sizeLimit: gone from the API {:?} after the write",
        written.elapsed()
    );
    assert!(
        cluster.is_live(NS, "tidy").await.expect("get"),
        "{}",
        agent.log()
    );
    let events = cluster
        .events(NS, "filler", "Evicted")
        .await
        .expect("events");
    assert!(
        events.iter().any(|e| e.message.as_deref()
            == Some("Usage of EmptyDir volume \"cache\" exceeds the limit \"4Mi\". ")),
        "{events:?}"
    );
    assert_eq!(
        agent
            .metric_sum(
                "node_monitor_local_storage_limit_evictions_total",
                &[("kind", "emptydir"), ("outcome", "evicted")]
            )
            .await
            .expect("metrics"),
        1.0
    );
    assert_eq!(
        evictions(&agent, &[("eviction_signal", "emptydirfs.limit")]).await,
        1.0
    );
    cluster.stop().await.expect("stop");
}
