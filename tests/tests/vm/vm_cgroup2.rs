//! The agent on a pure cgroup v2 node with the systemd cgroup driver, in the Debian guest (kernel 6.1, systemd 252, cgroup v2 with the memory
//! controller); the host runs on 6.18 with the memory controller on cgroup v1.
//!
//! 1. `memory_pressure_under_cgroup_v2_with_the_systemd_driver`: the kubelet stand-in runs its
//!    pods under the systemd driver's slices (`kubepods.slice/kubepods-burstable.slice/…`) in a
//!    node cgroup limited by `memory.max`; `node-monitor run` (eBPF on) is its agent, against a
//!    real control plane on the host. A Guaranteed pod holds memory, a Burstable pod's process is
//!    OOM-killed inside the pod's own limit, and a BestEffort pod climbs until `memory.available`
//!    crosses the hard threshold. The API shows the climber evicted with the kubelet's wording and
//!    the other two untouched; the agent's metrics (dumped by the guest) show the signal read from
//!    cgroup v2 files, wake-ups from `memory.events`, and the kernel OOM kill attributed to its
//!    pod through the systemd layout.
//!
//! What reports a `memory.available` crossing on cgroup v2 (PSI, `memory.low`, `memory.high`,
//! sampling, the memory push) is a benchmark that fails when its facts do not hold
//! (`cargo xtask bench v2-crossing`, `node_monitor_tests::v2_crossing`); the v2 root's
//! `memory.available` against the kubelet's is the real node's signal parity. The kernel probes
//! on each of the image's kernels run on the real nodes (`real_node_probes.rs`).
//!
//! Run them under `flock /tmp/nm-vm.lock` (one guest at a time on a shared machine), after `cargo
//! build --bins` (the guest runs the workspace's binaries from /mnt/host). The tests fail (never skip) when qemu, the guest image or the control-plane
//! binaries are missing. Timings are printed on stderr for docs/benchmarks.md ("Guest VM tier").
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    metrics::{self, has_series},
    pod::PodBuilder,
    reaction,
    vm::{ENTRY_PRELUDE, Guest, GuestOptions, GuestRun, Payload, report},
};

const NODE: &str = "vm-node";
const NS: &str = "default";
/// The node cgroup's `memory.max` (the stand-in's `--memory`).
const NODE_MEMORY_MI: u64 = 700;
/// The agent's hard `memory.available` threshold.
const THRESHOLD_MI: u64 = 350;
const MI: f64 = 1024.0 * 1024.0;

/// The start of both guest scripts after [`ENTRY_PRELUDE`]: shell helpers, and what every run
/// records.
const COMMON: &str = r#"log "entry started; uptime $(uptime_s)"
uname -r > /mnt/out/uname
cat /sys/fs/cgroup/cgroup.subtree_control > /mnt/out/root-subtree-control
"#;

/// The cgroup v2 pressure scenario, after [`COMMON`]. The agent runs in `nm-guest.service`'s
/// cgroup, outside the node cgroup, like a DaemonSet's agent outside the pods it watches.
const PRESSURE_SCRIPT: &str = r#"
for _ in $(seq 750); do [ -e /mnt/host/kubeconfig ] && break; sleep 0.2; done
[ -e /mnt/host/kubeconfig ] || { log "no kubeconfig from the host"; systemctl poweroff -ff; }
NODE_CG=/sys/fs/cgroup/node-monitor-test/vm-node
mkdir -p /var/lib/kubelet
# HTTP over bash's /dev/tcp (the guest has no curl); each in a subshell, so a refused
# connection fails the function, not the script.
get() {
  ( exec 3<>/dev/tcp/127.0.0.1/9101 && printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$1" >&3 \
      && cat <&3 > "/mnt/out/.$2.tmp" && mv "/mnt/out/.$2.tmp" "/mnt/out/$2" ) 2>/dev/null
}
dump_metrics() { get /metrics "$1"; }
ready() {
  ( exec 4<>/dev/tcp/127.0.0.1/9101 && printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&4 \
      && read -r _ status _ <&4 && [ "$status" = 200 ] ) 2>/dev/null
}
/mnt/host/nm-kubelet-standin --kubeconfig /mnt/host/kubeconfig --node-name vm-node \
  --cgroup-root /node-monitor-test/vm-node --memory @NODE_MEMORY@Mi --systemd-cgroups \
  > /mnt/out/standin.log 2>&1 &
within 120 grep -q NM_READY=1 /mnt/out/standin.log || log "the stand-in did not start"
log "stand-in ready; uptime $(uptime_s)"
RUST_LOG=info,node_monitor=debug NO_COLOR=1 /mnt/host/node-monitor run \
  --config /mnt/host/config.yaml --node-name vm-node --kubeconfig /mnt/host/kubeconfig \
  --node-cgroup node-monitor-test/vm-node --kubepods-cgroup kubepods.slice \
  --metrics-addr 127.0.0.1:9101 --no-mlock > /mnt/out/agent.log 2>&1 &
until ready; do sleep 0.5; done
log "agent ready; uptime $(uptime_s)"
# Ground truth for the reaction time: every fall of the node's memory.available below the threshold.
/mnt/host/bench-v2-crossing truth --node $NODE_CG --threshold-mi @THRESHOLD@ \
  > /mnt/out/crossings 2> /mnt/out/truth.stderr &
( while true; do dump_metrics metrics.txt; sleep 1; done ) &

wait_for /mnt/host/go-finish
log "finishing"
# The pod's OOM kill is counted in the node cgroup (memory.events is hierarchical on cgroup v2),
# and the agent attributes it asynchronously: wait for both before the last dump.
oom_counted() { grep -q '^oom_kill [1-9]' $NODE_CG/memory.events; }
attributed() { dump_metrics metrics-final.txt && grep -q '^node_monitor_oom_kills_total{scope="pod"' /mnt/out/metrics-final.txt; }
within 60 oom_counted || log "no OOM kill counted in the node cgroup"
within 60 attributed || log "no attributed OOM kill in the metrics"
dump_metrics metrics-final.txt
get /readyz readyz
cat $NODE_CG/memory.events > /mnt/out/node-memory.events
cat $NODE_CG/memory.pressure > /mnt/out/node-memory.pressure
cat $NODE_CG/memory.max > /mnt/out/node-memory.max
find $NODE_CG -type d | sed "s|^/sys/fs/cgroup||" > /mnt/out/node-cgroups
log "done; uptime $(uptime_s)"
sync
systemctl poweroff -ff
"#;

/// The memory push is left to its default (on).
fn pressure_config() -> String {
    format!("evictionHard:\n  memory.available: {THRESHOLD_MI}Mi\n")
}

/// The guest's payload: binaries (hard links into target/ when on the same file system), the
/// agent's config, the entry script. The host drops flag files into it to step the guest along,
/// and hands the kubeconfig over last.
fn payload(bins: &[&str], config: &str, script: &str) -> Payload {
    let payload = Payload::new("nm-vm-cgroup2").expect("payload dir");
    payload.link_binaries(bins).expect("binaries");
    payload.write("config.yaml", config).expect("config");
    payload
        .entry(&format!("{ENTRY_PRELUDE}{COMMON}{script}"))
        .expect("entry script");
    payload
}

/// Boots the guest with `memory_mib`.
fn boot(payload: &Payload, memory_mib: u32) -> Guest {
    Guest::boot(
        payload.path(),
        GuestOptions {
            memory_mib,
            // Bounds the whole run under TCG: boot, control plane, pods, pressure.
            timeout: Duration::from_secs(600),
            ..Default::default()
        },
    )
}

/// The guest's files a failure message shows.
const REPORT_FILES: &[&str] = &["entry.log", "agent.log", "standin.log", "trace.stderr"];

/// Waits for the guest to power off.
async fn finish(guest: Guest) -> GuestRun {
    guest
        .finish()
        .await
        .unwrap_or_else(|e| panic!("guest run failed: {e:#}"))
}

/// The guest ends only when the host tells it to: an early end is a failure, with its files.
async fn fail_with_guest(guest: Guest, what: &str) -> ! {
    guest.fail(what, REPORT_FILES).await
}

/// A pod on the guest node running `command`; `memory` is (request, limit), Guaranteed when both
/// are equal.
fn pod(name: &str, command: &[&str], memory: Option<(&str, &str)>) -> Pod {
    let pod = PodBuilder::new(name)
        .namespace(NS)
        .node(NODE)
        .termination_grace(5)
        .image("nm-workload")
        .command(command);
    match memory {
        Some((request, limit)) => pod.memory(request, Some(limit)),
        None => pod,
    }
    .build()
}

/// Creates the pod and waits until it runs; returns its UID.
async fn create_running(client: &Client, pod: Pod, guest: Guest) -> (String, Guest) {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let name = pod.metadata.name.clone().expect("pod name");
    let created = api
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
    let uid = created.metadata.uid.expect("pod uid");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = api.get(&name).await.expect("get pod");
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            return (uid, guest);
        }
        if !guest.running() {
            fail_with_guest(guest, &format!("the guest ended before {name} ran")).await;
        }
        if Instant::now() > deadline {
            let what = format!("pod {name} not Running within 120 s: {:?}", p.status);
            guest.abort(&what, REPORT_FILES).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn is_live(client: &Client, name: &str) -> bool {
    Api::<Pod>::namespaced(client.clone(), NS)
        .get_opt(name)
        .await
        .expect("get pod")
        .is_some_and(|p| p.metadata.deletion_timestamp.is_none())
}

fn agent_condition(n: &Node) -> Option<String> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NodeMonitorMemoryPressure")
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_under_cgroup_v2_with_the_systemd_driver() {
    let script = PRESSURE_SCRIPT
        .replace("@NODE_MEMORY@", &NODE_MEMORY_MI.to_string())
        .replace("@THRESHOLD@", &THRESHOLD_MI.to_string());
    let payload = payload(
        &[
            "node-monitor",
            "nm-kubelet-standin",
            "nm-workload",
            "nm-memhog",
            "bench-v2-crossing",
        ],
        &pressure_config(),
        &script,
    );
    // The node cgroup (700 MiB) fits in the guest with room for the system, the stand-in and
    // the agent outside it.
    let guest = boot(&payload, 1536);
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client();
    payload.kubeconfig(&cp).expect("kubeconfig");

    let guest = until_conditions_published(&client, guest).await;
    let armed = guest.started.elapsed();
    let (oom_uid, guest) = start_bystanders(&client, guest).await;
    // BestEffort, climbing 16 MiB/s: between crossing the threshold and reaching the node's
    // limit it takes about 20 s, longer than the 10 s housekeeping tick, which is the one wake-up
    // cgroup v2 guarantees before the limit (there are no memory thresholds on v2).
    let climb_started = Instant::now();
    let mut guest = climb_until_evicted(&client, "climber", guest, &payload).await;
    let evicted_after = climb_started.elapsed();
    // More climbs, one at a time, for the reaction time (crossing → eviction) on cgroup v2.
    for i in 2..=CLIMBS {
        guest = climb_until_evicted(&client, &format!("climber-{i}"), guest, &payload).await;
    }
    let guaranteed_live = is_live(&client, "guaranteed").await;
    let oom_pod_live = is_live(&client, "oom-victim").await;
    let evicted_events = evicted_events_of(&client, "climber").await;

    payload.signal("go-finish").expect("flag file");
    let run = finish(guest).await;
    let report = report(&run, REPORT_FILES);

    // --- The API: the climber evicted with the kubelet's wording, the others untouched.
    assert!(guaranteed_live, "the Guaranteed pod must stay\n{report}");
    assert!(
        oom_pod_live,
        "the Burstable pod under its request must stay\n{report}"
    );
    assert_evicted_with_the_kubelets_wording(&evicted_events, &report);
    let oom_slice = assert_a_v2_node_with_one_pod_oom_kill(&run, &oom_uid, &report);
    let m = run
        .read_out("metrics-final.txt")
        .unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert_signal_and_sources_of_cgroup_v2(&m, &run, &report);
    assert_woken_by_memory_events_and_the_push(&m, &report);
    let agent_log = run.read_out("agent.log").unwrap_or_default();
    let oom_line = assert_the_oom_kill_attributed(&m, &agent_log, &oom_uid, &oom_slice, &report);
    print_reaction_times(&run, &agent_log, &report);

    eprintln!(
        "vm_cgroup2 pressure: guest kernel {}",
        run.read_out("uname").unwrap_or_default().trim()
    );
    eprintln!("  guest boot to agent conditions published: {armed:.1?}");
    eprintln!("  climber created to gone from the API: {evicted_after:.1?}");
    print_pressure_figures(&run, &m, &agent_log);
    eprintln!("  {oom_line}");
    eprintln!(
        "  entry log:\n{}",
        run.read_out("entry.log").unwrap_or_default()
    );
    eprintln!("  guest run total: {:.1?}", run.elapsed);
    cp.stop().expect("stop control plane");
}

/// Waits until the agent decided and published its conditions (its first pass ran).
async fn until_conditions_published(client: &Client, guest: Guest) -> Guest {
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Ok(Some(n)) = nodes.get_opt(NODE).await
            && agent_condition(&n).is_some()
        {
            return guest;
        }
        if !guest.running() {
            fail_with_guest(
                guest,
                "the guest ended before the agent published its conditions",
            )
            .await;
        }
        if Instant::now() > deadline {
            guest
                .abort(
                    "the agent published no NodeMonitorMemoryPressure condition within 300 s",
                    REPORT_FILES,
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The two pods that must stay: a Guaranteed pod holding memory, and a Burstable pod whose
/// process the kernel OOM-kills inside the pod's own limit; the latter's UID.
async fn start_bystanders(client: &Client, guest: Guest) -> (String, Guest) {
    let (_, guest) = create_running(
        client,
        pod(
            "guaranteed",
            &["/mnt/host/nm-workload", "--hold", "100Mi"],
            Some(("128Mi", "128Mi")),
        ),
        guest,
    )
    .await;
    // Burstable: its process is OOM-killed by the kernel inside the pod's own 48 MiB limit; the
    // container's shell survives (the victim is the largest process), so the cgroup is still
    // there when the agent resolves the kernel event's cgroup id.
    create_running(
        client,
        pod(
            "oom-victim",
            &[
                "/bin/bash",
                "-c",
                "/mnt/host/nm-memhog anon 256; exec sleep infinity",
            ],
            Some(("32Mi", "48Mi")),
        ),
        guest,
    )
    .await
}

/// The `Evicted` Events of the pod `name`.
async fn evicted_events_of(client: &Client, name: &str) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(name)
                && e.reason.as_deref() == Some("Evicted")
        })
        .collect()
}

fn assert_evicted_with_the_kubelets_wording(evicted_events: &[Event], report: &str) {
    let event = evicted_events
        .first()
        .unwrap_or_else(|| panic!("no Evicted event on the climber\n{report}"));
    let msg = event.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with(&format!(
            "The node was low on resource: memory. Threshold quantity: {THRESHOLD_MI}Mi, available: "
        )),
        "{msg}"
    );
    assert_eq!(
        event.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("node-monitor")
    );
    assert_eq!(event.type_.as_deref(), Some("Warning"));
}

/// The guest: a cgroup v2 node, pods in the systemd driver's slices, one kernel OOM kill (the
/// pod's, inside its own limit): the climber was evicted before the kernel acted. The Burstable
/// pod's slice.
fn assert_a_v2_node_with_one_pod_oom_kill(run: &GuestRun, oom_uid: &str, report: &str) -> String {
    let uname = run.read_out("uname").expect("uname");
    assert!(uname.starts_with("6.1."), "guest kernel {uname}");
    let node_max = run.read_out("node-memory.max").expect("node memory.max");
    assert_eq!(
        node_max.trim(),
        (NODE_MEMORY_MI << 20).to_string(),
        "the node cgroup's memory.max"
    );
    let oom_slice = format!(
        "/node-monitor-test/vm-node/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        oom_uid.replace('-', "_")
    );
    let tree = run.read_out("node-cgroups").expect("node cgroup tree");
    assert!(
        tree.lines().any(
            |l| l.starts_with(&format!("{oom_slice}/cri-containerd-")) && l.ends_with(".scope")
        ),
        "the Burstable pod's container under the systemd driver's slices:\n{tree}"
    );
    let node_events = run
        .read_out("node-memory.events")
        .expect("node memory.events");
    let oom_kills = node_events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("oom_kill missing from memory.events:\n{node_events}"));
    assert_eq!(
        oom_kills, 1,
        "only the Burstable pod's process was OOM-killed (the climber was evicted first)\n{report}"
    );
    oom_slice
}

/// The signal read from the cgroup v2 files, the climber evicted, the wake-up sources of a
/// cgroup v2 node, and a ready agent that is not degraded.
fn assert_signal_and_sources_of_cgroup_v2(m: &str, run: &GuestRun, report: &str) {
    let ma = [("eviction_signal", "memory.available")];
    // The signal comes from the cgroup v2 files: capacity is the node cgroup's memory.max.
    assert_eq!(
        metrics::sum(m, "node_monitor_signal_capacity_bytes", &ma),
        (NODE_MEMORY_MI << 20) as f64,
        "memory.available capacity from memory.max"
    );
    assert!(
        has_series(m, "node_monitor_signal_available_bytes", &ma),
        "{m}"
    );
    let available = metrics::sum(m, "node_monitor_signal_available_bytes", &ma);
    assert!(
        available > 0.0 && available < (NODE_MEMORY_MI << 20) as f64,
        "memory.available {available}"
    );
    assert!(
        metrics::sum(
            m,
            "node_monitor_evictions_total",
            &[
                ("eviction_signal", "memory.available"),
                ("outcome", "evicted")
            ]
        ) >= 1.0,
        "{m}"
    );
    // The wake-up sources of a cgroup v2 node: memory.events, PSI and the eBPF events armed; the
    // cgroup v1 interfaces (memory thresholds, memory.oom_control) not applicable, which is no
    // degradation.
    for (source, state) in [
        ("memory_events", "active"),
        ("psi", "active"),
        ("kernel", "active"),
        ("memcg_threshold", "not_applicable"),
        ("memcg_oom", "not_applicable"),
    ] {
        assert_eq!(
            metrics::sum(
                m,
                "node_monitor_wakeup_source_state",
                &[("source", source), ("state", state)]
            ),
            1.0,
            "{source} {state} on cgroup v2\n{m}\n{report}"
        );
    }
    let readyz = run.read_out("readyz").expect("readyz");
    let (head, body) = readyz.split_once("\r\n\r\n").unwrap_or_default();
    assert!(
        head.lines().next().is_some_and(|l| l.contains(" 200 ")) && body == "ok",
        "a cgroup v2 node with every probe attached is ready and not degraded: {readyz:?}\n{report}"
    );
    assert_eq!(metrics::sum(m, "node_monitor_degraded", &[]), 0.0, "{m}");
}

/// The wake-ups of `source` in the agent's metrics.
fn wakeups(m: &str, source: &str) -> f64 {
    metrics::sum(m, "node_monitor_wakeups_total", &[("source", source)])
}

/// The agent was woken by memory.events, the eBPF OOM event, adaptive sampling and the memory
/// push.
fn assert_woken_by_memory_events_and_the_push(m: &str, report: &str) {
    // memory.events must have woken the agent: the pod's charges past its limit raise `max`,
    // `oom` and `oom_kill` in the pod's memcg and, memory.events being hierarchical on cgroup v2
    // (`memcg_memory_event()` in mm/memcontrol.c walks up to the root unless the hierarchy is
    // mounted with memory_localevents), in the node cgroup's file the agent watches. The eBPF
    // OOM event must have woken it too. PSI is not asserted: a stall of 150 ms in the 2 s window
    // depends on how long reclaim takes, which nothing here forces.
    assert!(
        wakeups(m, "memory_events") >= 1.0,
        "no memory.events wake-up\n{m}\n{report}"
    );
    assert!(
        wakeups(m, "kernel_oom_kill") >= 1.0,
        "no kernel OOM-kill wake-up\n{m}\n{report}"
    );
    // No notification reports a climb towards a threshold on a cgroup v2 node cgroup (no
    // threshold eventfd on v2); adaptive sampling must have looked again as the climber's
    // headroom fell, between the 10 s housekeeping ticks (docs/signals.md, "Adaptive sampling").
    assert!(
        wakeups(m, "headroom") >= 1.0,
        "no adaptive-sampling pass while the climber approached the threshold\n{m}\n{report}"
    );
    // The memory push (`nodeMonitor.memoryPush`, on by default), armed near the threshold, must have woken the
    // agent as the climbers' pages grew: the page-allocator tracepoints of the guest's 6.1.
    // Its programs are loaded (attached or not, depending on how near the threshold the node
    // is when the metrics are read) and were attached at least once, never failing to.
    let state = |program: &str, state: &str| {
        metrics::sum(
            m,
            "node_monitor_ebpf_program_state",
            &[("program", program), ("state", state)],
        )
    };
    for program in ["mem_push_alloc", "mem_push_free"] {
        assert_eq!(
            state(program, "attached") + state(program, "loaded"),
            1.0,
            "{program} loaded\n{m}"
        );
    }
    let switches = |outcome: &str| {
        metrics::sum(
            m,
            "node_monitor_memory_push_switches_total",
            &[("outcome", outcome)],
        )
    };
    assert!(
        switches("attached") >= 1.0,
        "the memory push never attached\n{m}"
    );
    assert_eq!(
        switches("failed"),
        0.0,
        "the memory push failed to attach\n{m}"
    );
    assert!(
        wakeups(m, "kernel_memory_growth") >= 1.0,
        "no memory push wake-up while the climbers approached the threshold\n{m}\n{report}"
    );
    assert_eq!(
        state("oom_victim_raw", "attached") + state("oom_victim_tp", "attached"),
        1.0,
        "one OOM program attached"
    );
}

/// The kernel OOM kill, attributed to its pod through the systemd layout (cgroup id → path
/// under kubepods.slice → pod UID → namespace/name from the agent's pod cache), and kept by the
/// flight recorder. The agent's log line of the kill.
fn assert_the_oom_kill_attributed(
    m: &str,
    agent_log: &str,
    oom_uid: &str,
    oom_slice: &str,
    report: &str,
) -> String {
    assert_eq!(
        metrics::sum(
            m,
            "node_monitor_oom_kills_total",
            &[
                ("scope", "pod"),
                ("pod_namespace", NS),
                ("pod_name", "oom-victim")
            ]
        ),
        1.0,
        "the OOM kill attributed to default/oom-victim\n{m}\n{report}"
    );
    // The flight recorder kept the climber's eviction and the kill (one record, or two when the
    // kill came more than 5 s after the eviction), and reports what it holds.
    assert!(
        metrics::sum(m, "node_monitor_flight_records", &[]) >= 1.0,
        "no flight record of the eviction and the kill\n{m}"
    );
    assert!(
        metrics::sum(m, "node_monitor_flight_recorder_bytes", &[]) > 0.0,
        "{m}"
    );
    let oom_line = agent_log
        .lines()
        .find(|l| l.contains("kernel event: OOM kill"))
        .unwrap_or_else(|| panic!("no OOM kill in the agent's log\n{report}"));
    assert!(
        oom_line.contains(&format!("pod_uid=\"{oom_uid}\""))
            && oom_line.contains(&format!("cgroup=\"{oom_slice}/cri-containerd-"))
            && oom_line.contains("global=false")
            && oom_line.contains("comm=\"nm-memhog\""),
        "{oom_line}"
    );
    oom_line.to_owned()
}

/// Reaction time on cgroup v2: the ground truth's crossings against the agent's `evicting`
/// lines, both on the guest's clock (printed, not asserted; one pair per climber asserted).
fn print_reaction_times(run: &GuestRun, agent_log: &str, report: &str) {
    let crossings = run.read_out("crossings").unwrap_or_default();
    let climbers: Vec<&str> = agent_log
        .lines()
        .filter(|l| l.contains("evicting") && l.contains("pod=default/climber"))
        .collect();
    let paired = reaction::reaction_times(&crossings, agent_log, "climber");
    // One eviction per climber: at its crossing, or before it on a prediction (a slow guest's
    // allocator catching up after a stall makes a fall steep enough to predict).
    assert_eq!(
        paired.evictions(),
        CLIMBS,
        "one eviction per climber: {paired:?}\ncrossings:\n{crossings}\nevictions:\n{}\n{report}",
        climbers.join("\n")
    );
    // An eviction whose crossing the ground truth did not see (its sampler starved through the
    // dip) still reports, in the kubelet's wording, a node below the threshold: the agent
    // evicted at a crossing, not above it.
    for line in &paired.unseen {
        let (threshold, available) = reaction::reported_memory(line)
            .unwrap_or_else(|| panic!("no threshold and available in {line}"));
        assert!(
            available < threshold,
            "evicted above the threshold with no prediction: {line}\ncrossings:\n{crossings}\n{report}"
        );
    }
    assert!(
        !paired.at_crossing.is_empty() || paired.predicted == CLIMBS,
        "the ground truth saw none of the crossings\ncrossings:\n{crossings}\nevictions:\n{}\n{report}",
        climbers.join("\n")
    );
    let reaction = paired.at_crossing;
    if reaction.is_empty() {
        eprintln!(
            "vm_cgroup2 reaction: every climber was evicted on a prediction, before its crossing"
        );
        return;
    }
    let mut ms: Vec<f64> = reaction.iter().map(|r| r.ms).collect();
    ms.sort_by(f64::total_cmp);
    let each: Vec<(f64, &str)> = reaction.iter().map(|r| (r.ms, r.source.as_str())).collect();
    eprintln!(
        "vm_cgroup2 reaction (crossing → `evicting`), {} climbs at a crossing, {} predicted, {} unseen by the ground truth: p50 {:.1} ms, max {:.1} ms; each: {each:?}",
        ms.len(),
        paired.predicted,
        paired.unseen.len(),
        reaction::percentile(&ms, 50.0),
        ms[ms.len() - 1]
    );
    // Where each reaction went: the agent's `decision` line (wake-up → decision, time queued
    // behind the previous cycle, the pass itself) before each climber's `evicting` line.
    for r in &reaction {
        eprintln!("  before an eviction: {}", r.decision);
    }
}

/// The first eviction, the wake-ups by source, the last reading and the node's memory files.
fn print_pressure_figures(run: &GuestRun, m: &str, agent_log: &str) {
    let evict_line = agent_log
        .lines()
        .find(|l| l.contains("evicting") && l.contains("default/climber"))
        .unwrap_or_default();
    eprintln!("  eviction: {evict_line}");
    let w = |source| wakeups(m, source);
    eprintln!(
        "  wake-ups: memory_events {} psi {} kernel_oom_kill {} kernel_reclaim_stall {} housekeeping {} headroom {} kernel_memory_growth {}",
        w("memory_events"),
        w("psi"),
        w("kernel_oom_kill"),
        w("kernel_reclaim_stall"),
        w("housekeeping"),
        w("headroom"),
        w("kernel_memory_growth")
    );
    let available = metrics::sum(
        m,
        "node_monitor_signal_available_bytes",
        &[("eviction_signal", "memory.available")],
    );
    eprintln!(
        "  last memory.available observed {:.0} MiB of {:.0} MiB",
        available / MI,
        (NODE_MEMORY_MI << 20) as f64 / MI
    );
    eprintln!(
        "  node memory.events: {}",
        run.read_out("node-memory.events")
            .unwrap_or_default()
            .replace('\n', " ")
    );
    eprintln!(
        "  node memory.pressure: {}",
        run.read_out("node-memory.pressure")
            .unwrap_or_default()
            .replace('\n', " | ")
    );
}

/// Climbers in the pressure scenario: the first, then `CLIMBS − 1` more for the reaction time.
const CLIMBS: usize = 3;

/// Creates a BestEffort climber `name` (the first climber's ramp) and waits until it is gone from
/// the API.
async fn climb_until_evicted(
    client: &Client,
    name: &str,
    guest: Guest,
    payload: &Payload,
) -> Guest {
    let command = [
        "/mnt/host/nm-workload",
        "--ramp-to",
        "900Mi",
        "--step",
        "8Mi",
        "--interval",
        "500ms",
    ];
    let (_, guest) = create_running(client, pod(name, &command, None), guest).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        if pods.get_opt(name).await.expect("get climber").is_none() {
            return guest;
        }
        if !guest.running() {
            fail_with_guest(guest, &format!("the guest ended before {name} was evicted")).await;
        }
        if Instant::now() > deadline {
            payload.signal("go-finish").expect("flag file");
            let run = finish(guest).await;
            panic!(
                "{name} was not evicted within 240 s\n{}",
                report(&run, REPORT_FILES)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
