//! The real node: a real kubelet and containerd in the guest VM (cgroup v2, systemd cgroup
//! driver, kernel 6.1) joined to a real control plane on the host, and node-monitor installed
//! from `deploy/kustomize/base` as the DaemonSet pod on it. See `node_monitor_tests::real_node`
//! for how the node is built, and docs/testing.md ("The real-node tier").
//!
//! One guest boot carries the scenarios, in order (each asserted on the API and on the node):
//!
//! 1. The node joins (NodeRestriction on) and node-monitor's DaemonSet pod, scheduled by the
//!    real scheduler and run by containerd from the imported image, becomes Ready with no
//!    hand edit to the manifests: it finds the pods' cgroups under the systemd driver's
//!    `kubepods.slice` by itself.
//! 2. Signal parity: node-monitor's `memory.available`, `nodefs.*`, `imagefs.*` and
//!    `pid.available`, against the kubelet's `/stats/summary` read at the same moment.
//! 3. OOM attribution on real containerd paths: a container exceeding its limit is named by
//!    namespace, pod and container id in `node-monitor trace --json` and in the agent's metrics.
//! 4. Memory pressure from a container, with node-monitor as shipped (the kubelet's own
//!    `memory.available<100Mi`, predictive eviction on) beside the kubelet at its defaults:
//!    node-monitor evicts the BestEffort pod, by prediction, before the kubelet's eviction manager
//!    acts and before the kernel OOM killer; the kubelet then stops the real container; the
//!    Guaranteed pod is untouched; no pod is evicted twice.
//! 5. Fast allocations that do not exhaust the node (a sawtooth, page cache from reads, a burst
//!    that stops) run to their end, never evicted (`real_node_predict`).
//!
//! Run it under `flock /tmp/nm-vm.lock` after `cargo bins` and the image archives
//! (`scripts/test.sh` does both). It fails, never skips, when qemu, the guest image, the node
//! binaries or the images are missing. Timings go to stderr for docs/benchmarks.md.
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use node_monitor_tests::{
    metrics,
    real_node::{
        CgroupDriver, K3S_KUBELET_EVICTION_FLAG, NODE, NodeLayout, RealNode, RealNodeOptions,
        Release,
        scenario::{
            Installed, Manifests, NS, agent_log, condition, create_running, evictions_of, fail,
            guest_oom_kills, guest_step, install, install_from, until, workload,
        },
    },
    vm::GuestKernel,
};
use serde_json::Value;

const MI: f64 = 1024.0 * 1024.0;
/// The hard `memory.available` threshold of the ranking comparison, the kubelet's and
/// node-monitor's alike ([`KUBELET_SAME_THRESHOLDS`]): above the kernel's OOM point on this 2 GiB
/// node, so that the kubelet's own eviction manager acts. The other scenarios run node-monitor
/// as shipped (the kubelet's 100Mi, predictive eviction on).
const AGENT_THRESHOLD: &str = "500Mi";
/// [`AGENT_THRESHOLD`] in MiB.
pub(crate) const AGENT_MIB: u64 = 500;

pub(crate) fn agent_config(dry_run: bool) -> String {
    format!(
        "evictionHard:\n  memory.available: \"{AGENT_THRESHOLD}\"\n  nodefs.available: \"10%\"\n  \
         nodefs.inodesFree: \"5%\"\n  imagefs.available: \"15%\"\n  imagefs.inodesFree: \"5%\"\n\
         evictionPressureTransitionPeriod: 5m\nnodeMonitor:\n  maxPodsPerCycle: 1\n  pdbPolicy: respect\n  \
         dryRun: {dry_run}\n"
    )
}

/// A [`workload`] pod; `memory` is (request, limit), Guaranteed when both are equal.
fn pod(name: &str, command: &[&str], memory: Option<(&str, &str)>) -> Pod {
    let pod = workload(name, command);
    match memory {
        Some((request, limit)) => pod.memory(request, Some(limit)),
        None => pod,
    }
    .build()
}

/// The agent's metrics, as the guest reads them from its pod IP, written to /mnt/out/`name`.
pub(crate) async fn scrape(node: &mut RealNode, ip: &str, name: &str) -> String {
    let r = node
        .step(
            &format!("scrape {name}"),
            &format!("get {ip} 9101 /metrics /mnt/out/{name}"),
            Duration::from_secs(60),
        )
        .await;
    if let Err(e) = r {
        fail(node, &format!("{e:#}"));
    }
    node.read_out(name).expect("metrics")
}

fn num(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64()
        .unwrap_or_else(|| panic!("/stats/summary has no number at {}", path.join(".")))
}

/// One signal read by both sides at about the same moment, in base units.
#[derive(Debug, Clone, Copy)]
struct Pair {
    agent: f64,
    kubelet: f64,
    capacity: f64,
}

/// Each signal from one `/stats/summary` and one scrape of the agent's metrics. The kubelet's
/// definitions (pkg/kubelet/eviction/helpers.go `makeSignalObservations`): memory.available is the
/// node's `availableBytes`; nodefs is `node.fs`; imagefs is `node.runtime.imageFs`;
/// pid.available is `rlimit.maxpid − rlimit.curproc`.
fn signal_pairs(summary: &Value, metrics: &str) -> Vec<(&'static str, Pair)> {
    let n = &summary["node"];
    // One family per unit: inodes and PIDs have their own.
    let agent = |s: &str| {
        let family = if s.ends_with(".inodesFree") {
            "node_monitor_signal_available_inodes"
        } else if s == "pid.available" {
            "node_monitor_signal_available_pids"
        } else {
            "node_monitor_signal_available_bytes"
        };
        metrics::sum(metrics, family, &[("eviction_signal", s)])
    };
    let maxpid = num(n, &["rlimit", "maxpid"]);
    vec![
        (
            "memory.available",
            Pair {
                agent: agent("memory.available"),
                kubelet: num(n, &["memory", "availableBytes"]),
                capacity: num(n, &["memory", "availableBytes"])
                    + num(n, &["memory", "workingSetBytes"]),
            },
        ),
        (
            "nodefs.available",
            Pair {
                agent: agent("nodefs.available"),
                kubelet: num(n, &["fs", "availableBytes"]),
                capacity: num(n, &["fs", "capacityBytes"]),
            },
        ),
        (
            "nodefs.inodesFree",
            Pair {
                agent: agent("nodefs.inodesFree"),
                kubelet: num(n, &["fs", "inodesFree"]),
                capacity: num(n, &["fs", "inodes"]),
            },
        ),
        (
            "imagefs.available",
            Pair {
                agent: agent("imagefs.available"),
                kubelet: num(n, &["runtime", "imageFs", "availableBytes"]),
                capacity: num(n, &["runtime", "imageFs", "capacityBytes"]),
            },
        ),
        (
            "pid.available",
            Pair {
                agent: agent("pid.available"),
                kubelet: maxpid - num(n, &["rlimit", "curproc"]),
                capacity: maxpid,
            },
        ),
    ]
}

/// The report line for one signal over its pairs, and whether the median difference is within
/// the stated tolerance: 2 % of capacity for memory (it moves between two reads), 1 % for file
/// systems and PIDs.
fn parity(signal: &str, pairs: &[Pair]) -> (String, bool) {
    let (unit, name) = if signal.contains("inodes") {
        (1.0, "inodes")
    } else if signal.starts_with("pid") {
        (1.0, "pids")
    } else {
        (MI, "MiB")
    };
    let tolerance = if signal.starts_with("memory") {
        0.02
    } else {
        0.01
    };
    let mut diffs: Vec<f64> = pairs.iter().map(|p| p.agent - p.kubelet).collect();
    diffs.sort_by(f64::total_cmp);
    let median = diffs[diffs.len() / 2];
    let capacity = pairs[0].capacity;
    let each: Vec<String> = pairs
        .iter()
        .map(|p| format!("{:.1}/{:.1}", p.agent / unit, p.kubelet / unit))
        .collect();
    let line = format!(
        "{signal:<18} median difference {:>+9.1} {name} ({:+.2} % of capacity; tolerance {:.0} %); \
         node-monitor/kubelet: {}",
        median / unit,
        100.0 * median / capacity,
        tolerance * 100.0,
        each.join(" ")
    );
    (line, median.abs() <= tolerance * capacity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kubelet_and_containerd_with_node_monitor_from_its_manifests() {
    // The control plane lives as long as its binding.
    let Installed {
        cp: _cp,
        client,
        mut node,
        agent,
        agent_ip,
    } = install("base", None, &RealNodeOptions::default()).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let first = scrape(&mut node, &agent_ip, "metrics-start.txt").await;
    layout_and_wakeups_seen(&first).await;
    let reboot_probe = probes_attached_in_the_pod(&mut node, &first).await;
    the_reboot_probe_sees_a_container(&client, &mut node, &agent_ip, reboot_probe).await;
    guarantees_published(&mut node, &nodes).await;
    signal_parity_with_the_kubelet(&mut node, &agent_ip).await;
    let oom_before = oom_attribution_on_containerds_paths(&client, &mut node, &agent_ip).await;
    memory_pressure_from_a_container(&client, &mut node, &agent_ip, &nodes, oom_before).await;
    super::real_node_predict::fast_allocations_that_do_not_exhaust_the_node_are_left_alone(
        &client, &mut node, &agent_ip,
    )
    .await;
    agent_footprint(&mut node, &agent).await;
    crate::real_node_probes::the_kernel_probes_on_this_nodes_kernel(
        &mut node,
        GuestKernel::Bookworm,
    )
    .await;
    let run = node.finish().await.expect("guest run");
    eprintln!("real node: guest run {:.1} s", run.elapsed.as_secs_f64());
}

/// The agent as shipped finds the systemd driver's kubepods slice, sees the pods'
/// cgroups and arms its PSI trigger under the read-only /host/proc.
async fn layout_and_wakeups_seen(first: &str) {
    // As shipped, with no --kubepods-cgroup: the systemd driver's slice is found by itself.
    assert_eq!(
        metrics::sum(
            first,
            "node_monitor_kubepods_layout",
            &[
                ("driver", "systemd"),
                ("path", "/sys/fs/cgroup/kubepods.slice")
            ]
        ),
        1.0,
        "the agent reads pods from the systemd driver's kubepods.slice:\n{}",
        first
            .lines()
            .filter(|l| l.contains("kubepods"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        first
            .lines()
            .any(|l| l == "node_monitor_pod_cgroups_missing 0"),
        "the agent sees the running pods' cgroups"
    );
    // The PSI trigger is armed under the DaemonSet's read-only /host/proc.
    assert!(
        first
            .lines()
            .any(|l| l.starts_with("node_monitor_wakeup_source_state{")
                && l.contains("source=\"psi\"")
                && l.contains("state=\"active\"")
                && l.ends_with(" 1")),
        "PSI is an active wake-up source in the DaemonSet pod:\n{}",
        first
            .lines()
            .filter(|l| l.contains("wakeup_source_state"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The kernel probes attach in the DaemonSet pod, the reboot probe by the path
/// `perf_event_paranoid` leaves it.
/// Returns `perf_event_paranoid` and the reboot program that attached.
async fn probes_attached_in_the_pod(node: &mut RealNode, first: &str) -> (i32, &'static str) {
    // The kernel probes in the DaemonSet pod (CAP_BPF and CAP_PERFMON, no CAP_SYS_ADMIN). The
    // raw tracepoint programs (OOM, reclaim, kswapd, the memory push) attach through bpf(2)
    // alone, whatever perf_event_paranoid says. The reboot probe's syscall tracepoint goes
    // through perf_event_open, which Debian's kernel (perf_event_paranoid 3 by default) allows
    // only to CAP_SYS_ADMIN: there its fallback on the raw tracepoint sys_enter attaches
    // instead, and the log says why.
    let in_state = |p: &str, state: &str| {
        metrics::sum(
            first,
            "node_monitor_ebpf_program_state",
            &[("program", p), ("state", state)],
        ) == 1.0
    };
    let attached = |p: &str| in_state(p, "attached");
    for p in [
        "oom_victim_raw",
        "direct_rcl_beg",
        "direct_rcl_end",
        "memcg_rcl_beg",
        "memcg_rcl_end",
        "kswapd_wake",
    ] {
        assert!(attached(p), "{p} is attached in the pod");
    }
    // The memory push attaches only near a memory threshold: loaded and detached here.
    for p in ["mem_push_alloc", "mem_push_free"] {
        assert!(in_state(p, "loaded"), "{p} is loaded in the pod");
    }
    let paranoid: i32 = guest_step(
        node,
        "perf_event_paranoid",
        "cat /proc/sys/kernel/perf_event_paranoid",
        Duration::from_secs(30),
    )
    .await
    .trim()
    .parse()
    .expect("perf_event_paranoid");
    let (probe, standby) = if paranoid > 2 {
        ("reboot_raw", "reboot_enter")
    } else {
        ("reboot_enter", "reboot_raw")
    };
    assert!(
        attached(probe) && !attached(standby),
        "{probe} attached, {standby} not, with perf_event_paranoid {paranoid}:\n{}",
        first
            .lines()
            .filter(|l| l.contains("program=\"reboot_"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    if paranoid > 2 {
        let agent_log = agent_log(node);
        assert!(
            agent_log.lines().any(|l| l.contains("reboot_enter")
                && l.contains(&format!("kernel.perf_event_paranoid is {paranoid}"))
                && l.contains("fallback")),
            "the agent says why reboot_enter failed and that reboot_raw took over:\n{agent_log}"
        );
    }
    (paranoid, probe)
}

/// A container's refused reboot(2) reaches the agent through the probe.
async fn the_reboot_probe_sees_a_container(
    client: &Client,
    node: &mut RealNode,
    agent_ip: &str,
    (paranoid, probe): (i32, &str),
) {
    // The probe sees a container's reboot(2): a pod holding no capability calls it three times,
    // the kernel refuses each call (EPERM), and the agent receives the probe's event (the first
    // call; the others are withheld by the per-verdict rate limit until the next event of that
    // verdict). The base install runs no shutdown manager, which would count them refused
    // (the k3s scenario installs it, `real_node_shutdown.rs`).
    let caller = workload(
        "reboot-caller",
        &["/usr/local/bin/nm-reboot-caller", "unprivileged", "3"],
    )
    .build();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(&PostParams::default(), &caller)
        .await
        .expect("create the reboot-caller pod");
    until(
        node,
        "the reboot-caller pod Succeeded (every call refused with EPERM)",
        Duration::from_secs(180),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("reboot-caller").await.ok()?;
                match p.status.as_ref()?.phase.as_deref() {
                    Some("Succeeded") => Some(()),
                    Some("Failed") => panic!("nm-reboot-caller failed: {:?}", p.status),
                    _ => None,
                }
            }
        },
    )
    .await;
    let mut seen = 0.0;
    for i in 0..10 {
        let text = scrape(node, agent_ip, &format!("metrics-reboot-{i}.txt")).await;
        seen = metrics::sum(
            &text,
            "node_monitor_kernel_events_total",
            &[("kind", "reboot")],
        );
        if seen >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        seen >= 1.0,
        "{probe} saw the pod's reboot(2) calls: kernel_events_total{{kind=reboot}} {seen}"
    );
    let agent_log = agent_log(node);
    assert!(
        agent_log
            .lines()
            .any(|l| l.contains("reboot requested") && l.contains("nm-reboot-calle")),
        "the agent logs the pod's reboot(2) request with its caller:\n{agent_log}"
    );
    assert!(
        !agent_log.contains("eBPF program unavailable"),
        "a primary replaced by its fallback is not reported unavailable:\n{agent_log}"
    );
    eprintln!(
        "real node: perf_event_paranoid {paranoid}; raw tracepoint programs attached; the \
         reboot probe attached as {probe}; reboot events from a pod's refused calls: {seen}"
    );
}

/// What holds on this node, as the agent publishes it on the Node.
async fn guarantees_published(node: &mut RealNode, nodes: &Api<Node>) {
    // What holds on this node, as the agent publishes it on the Node: on Debian's cgroup v2
    // node every guarantee holds but the cgroup v1 thresholds, which cannot apply.
    let published = until(
        node,
        "the node-monitor.io/guarantees annotation",
        Duration::from_secs(90),
        || {
            let nodes = nodes.clone();
            async move {
                let n = nodes.get(NODE).await.ok()?;
                n.metadata
                    .annotations?
                    .get("node-monitor.io/guarantees")
                    .cloned()
            }
        },
    )
    .await;
    let holds = node_monitor_core::guarantees::decode(&published).expect("the annotation decodes");
    for (g, want) in [
        ("reboot-probe", "yes"),
        ("core-reads", "yes"),
        ("memcg-thresholds", "not_applicable"),
        ("psi-trigger", "yes"),
        ("memory-push", "yes"),
        ("kubelet-config", "yes"),
    ] {
        let g = node_monitor_core::guarantees::Guarantee::parse(g).expect("a guarantee");
        assert_eq!(
            holds.get(&g).map(|h| h.label()),
            Some(want),
            "{g:?} on the real node: {published}"
        );
    }
    eprintln!("real node: published guarantees {published}");
}

/// Signal parity with the kubelet's /stats/summary.
async fn signal_parity_with_the_kubelet(node: &mut RealNode, agent_ip: &str) {
    // --- 2. signal parity with the kubelet's /stats/summary ------------------------------------
    // Both sides sample on their own clocks (the kubelet's cadvisor housekeeping and the agent's
    // 10 s tick), so one pair of reads can straddle a change; three pairs 11 s apart, each
    // signal judged on the median difference (one straddling pair cannot move it), every pair
    // recorded.
    guest_step(
        node,
        "signals side by side",
        &format!(
            "for i in 1 2 3; do\n\
               get 127.0.0.1 10255 /stats/summary /mnt/out/summary-$i.json || exit 1\n\
               get {agent_ip} 9101 /metrics /mnt/out/metrics-parity-$i.txt || exit 1\n\
               [ $i = 3 ] || sleep 11\n\
             done"
        ),
        Duration::from_secs(180),
    )
    .await;
    let mut pairs: BTreeMap<&str, Vec<Pair>> = BTreeMap::new();
    for i in 1..=3 {
        let summary: Value = serde_json::from_str(
            &node
                .read_out(&format!("summary-{i}.json"))
                .expect("summary"),
        )
        .expect("summary JSON");
        let ours = node
            .read_out(&format!("metrics-parity-{i}.txt"))
            .expect("metrics");
        for (signal, pair) in signal_pairs(&summary, &ours) {
            pairs.entry(signal).or_default().push(pair);
        }
    }
    let mut report = Vec::new();
    let mut off = Vec::new();
    for (signal, ps) in &pairs {
        let (line, within) = parity(signal, ps);
        if !within {
            off.push(line.clone());
        }
        report.push(line);
    }
    eprintln!(
        "real node: signal parity (node-monitor − kubelet)\n  {}",
        report.join("\n  ")
    );
    assert_eq!(pairs.len(), 5, "every signal compared: {report:?}");
    assert!(off.is_empty(), "signals off parity:\n{}", off.join("\n"));
}

/// OOM attribution on containerd's paths.
/// Returns the kernel's OOM kill count before the kill.
async fn oom_attribution_on_containerds_paths(
    client: &Client,
    node: &mut RealNode,
    agent_ip: &str,
) -> u64 {
    // --- 3. OOM attribution on containerd's paths ----------------------------------------------
    node.step(
        "node-monitor trace",
        "RUST_LOG=info NO_COLOR=1 setsid /mnt/host/node-monitor trace --json \
         --kubeconfig /mnt/host/admin.kubeconfig > /mnt/out/trace.jsonl 2> /mnt/out/trace.stderr &\n\
         for _ in $(seq 600); do grep -q listening /mnt/out/trace.stderr && exit 0; sleep 0.5; done\n\
         echo 'trace did not start'; cat /mnt/out/trace.stderr; exit 1",
        Duration::from_secs(360),
    )
    .await
    .unwrap_or_else(|e| fail(node, &format!("{e:#}")));
    let oom_before = guest_oom_kills(node).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    pods.create(
        &PostParams::default(),
        &pod(
            "oom-victim",
            &["/usr/local/bin/nm-memhog", "anon", "256"],
            Some(("32Mi", "48Mi")),
        ),
    )
    .await
    .expect("create oom-victim");
    let container_id = until(
        node,
        "oom-victim's container terminated by SIGKILL",
        Duration::from_secs(300),
        || {
            let pods = pods.clone();
            async move {
                let p = pods.get("oom-victim").await.ok()?;
                let cs = p.status?.container_statuses?.into_iter().next()?;
                let t = cs.state?.terminated?;
                // `OOMKilled` when containerd's OOM event reached the kubelet before the exit,
                // else `Error` with the SIGKILL's 137 (seen once under TCG); the kernel's kill
                // itself is asserted below, from the trace's `oom_kill` line naming the pod.
                (t.reason.as_deref() == Some("OOMKilled") || t.exit_code == 137)
                    .then_some(cs.container_id?)
            }
        },
    )
    .await;
    let container_id = container_id
        .strip_prefix("containerd://")
        .expect("a containerd container id")
        .to_owned();
    guest_step(
        node,
        "the trace's OOM line",
        "for _ in $(seq 240); do grep -q '\"kind\":\"oom_kill\"' /mnt/out/trace.jsonl && break; sleep 0.5; done\n\
         sleep 2; pkill -TERM -f 'node-monitor trace'; sleep 1; true",
        Duration::from_secs(180),
    )
    .await;
    let trace = node.read_out("trace.jsonl").expect("trace.jsonl");
    let line: Value = trace
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["kind"] == "oom_kill" && v["pod_name"] == "oom-victim")
        .unwrap_or_else(|| {
            fail(
                node,
                &format!("no oom_kill line names default/oom-victim in the trace:\n{trace}"),
            )
        });
    assert_eq!(line["pod_namespace"], NS, "{line}");
    assert_eq!(line["container_id"], container_id.as_str(), "{line}");
    assert_eq!(line["qos_class"], "Burstable", "{line}");
    let path = line["cgroup_path"].as_str().unwrap_or_default();
    assert!(
        path.starts_with("/kubepods.slice/kubepods-burstable.slice/")
            && path.ends_with(&format!("cri-containerd-{container_id}.scope")),
        "the victim's cgroup is containerd's systemd scope: {line}"
    );
    eprintln!("real node: trace attributed the OOM kill: {line}");
    // The kill must also have woken the agent twice over: the eBPF OOM event, and memory.events
    // (cgroup v2's counters are hierarchical, so the pod's `oom_kill` reaches kubepods.slice's
    // file, which the agent watches on a node whose root is the node cgroup).
    let wakeups = |m: &str, source: &str| {
        metrics::sum(m, "node_monitor_wakeups_total", &[("source", source)])
    };
    let mut metrics = String::new();
    for _ in 0..60 {
        metrics = scrape(node, agent_ip, "metrics-oom.txt").await;
        let labels = [
            ("scope", "pod"),
            ("pod_namespace", NS),
            ("pod_name", "oom-victim"),
        ];
        if metrics::sum(&metrics, "node_monitor_oom_kills_total", &labels) >= 1.0
            && wakeups(&metrics, "kernel_oom_kill") >= 1.0
            && wakeups(&metrics, "memory_events") >= 1.0
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        wakeups(&metrics, "kernel_oom_kill") >= 1.0 && wakeups(&metrics, "memory_events") >= 1.0,
        "the OOM kill woke the agent through its eBPF event and kubepods.slice's memory.events:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("wakeup"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        metrics::sum(
            &metrics,
            "node_monitor_oom_kills_total",
            &[
                ("scope", "pod"),
                ("pod_namespace", NS),
                ("pod_name", "oom-victim")
            ]
        ) >= 1.0,
        "the agent's metrics count the OOM kill for default/oom-victim:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("oom"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    pods.delete("oom-victim", &Default::default())
        .await
        .expect("delete oom-victim");
    oom_before
}

/// Memory pressure from a container: the agent evicts the climber, with the kubelet's
/// wording, before the kernel OOM-kills anything.
async fn memory_pressure_from_a_container(
    client: &Client,
    node: &mut RealNode,
    agent_ip: &str,
    nodes: &Api<Node>,
    oom_before: u64,
) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    // --- 4. memory pressure from a container ---------------------------------------------------
    let oom_before_pressure = guest_oom_kills(node).await;
    assert!(
        oom_before_pressure > oom_before,
        "the kernel counted the OOM kill"
    );
    let database = create_running(
        client,
        node,
        pod(
            "database",
            &["/usr/local/bin/nm-workload", "--hold", "64Mi"],
            Some(("96Mi", "96Mi")),
        ),
    )
    .await;
    let ramp_started = Instant::now();
    create_running(
        client,
        node,
        pod(
            "leaky",
            &[
                "/usr/local/bin/nm-workload",
                "--ramp-to",
                "3Gi",
                "--step",
                "16Mi",
                "--interval",
                "100ms",
            ],
            None,
        ),
    )
    .await;
    let evicted_by = until(
        node,
        "an Evicted Event on default/leaky",
        Duration::from_secs(300),
        || {
            let client = client.clone();
            async move {
                let by = evictions_of(&client, "leaky").await;
                (!by.is_empty()).then_some(by)
            }
        },
    )
    .await;
    let evicted_after = ramp_started.elapsed();
    until(
        node,
        "the kubelet stopped leaky's container and removed the pod",
        Duration::from_secs(180),
        || {
            let pods = pods.clone();
            async move { pods.get_opt("leaky").await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    let gone_after = ramp_started.elapsed();
    // Give a second eviction, by either side, time to show.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let evicted_by = {
        let again = evictions_of(client, "leaky").await;
        if again.len() > evicted_by.len() {
            again
        } else {
            evicted_by
        }
    };
    assert_eq!(
        evicted_by,
        ["node-monitor"],
        "leaky is evicted once, by node-monitor, before the kubelet's eviction manager acts"
    );
    // At the kubelet's own 100Mi, which sits at the kernel's OOM point on this 2 GiB node, only
    // a prediction can come first.
    let message = eviction_message(client, "leaky").await.unwrap_or_default();
    assert!(
        message.contains("Predicted: memory falling at"),
        "the eviction was predicted: {message:?}"
    );
    let db = pods.get("database").await.expect("database");
    let db_status = db.status.as_ref().expect("database status");
    assert_eq!(
        db_status.phase.as_deref(),
        Some("Running"),
        "the Guaranteed pod still runs"
    );
    assert_eq!(
        db.metadata.uid, database.metadata.uid,
        "the Guaranteed pod is the same pod"
    );
    assert_eq!(
        db_status
            .container_statuses
            .as_ref()
            .and_then(|c| c.first())
            .map(|c| c.restart_count),
        Some(0),
        "the Guaranteed pod's container never restarted"
    );
    assert!(
        evictions_of(client, "database").await.is_empty(),
        "the Guaranteed pod was never evicted"
    );
    let oom_after = guest_oom_kills(node).await;
    assert_eq!(
        oom_after, oom_before_pressure,
        "no kernel OOM kill during the pressure"
    );
    let n = nodes.get(NODE).await.expect("node");
    assert_eq!(
        condition(&n, "MemoryPressure").as_deref(),
        Some("False"),
        "the kubelet's eviction manager never saw memory pressure"
    );
    let final_metrics = scrape(node, agent_ip, "metrics-final.txt").await;
    assert_eq!(
        metrics::sum(
            &final_metrics,
            "node_monitor_evictions_total",
            &[
                ("eviction_signal", "memory.available"),
                ("outcome", "evicted")
            ]
        ),
        1.0,
        "the agent counts one eviction"
    );
    eprintln!(
        "real node: leaky evicted {:.1} s after its ramp started, gone from the API {:.1} s after; \
         kernel OOM kills during the pressure: {}",
        evicted_after.as_secs_f64(),
        gone_after.as_secs_f64(),
        oom_after - oom_before_pressure
    );
}

/// The agent container's footprint in its real pod: figures for docs/benchmarks.md, not
/// assertions.
async fn agent_footprint(node: &mut RealNode, agent: &Pod) {
    // The agent container's footprint in its real pod (release build): figures for
    // docs/benchmarks.md, not assertions.
    let agent_cid = agent
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_owned))
        .expect("the agent's container id");
    let footprint = guest_step(
        node,
        "the agent container's CPU and memory",
        &format!(
            "cg=$(find /sys/fs/cgroup/kubepods.slice -type d -name 'cri-containerd-{agent_cid}.scope' | head -1)\n\
             [ -n \"$cg\" ] || {{ echo 'no cgroup for the agent container'; exit 1; }}\n\
             u0=$(awk '$1 == \"usage_usec\" {{ print $2 }}' $cg/cpu.stat); t0=$(cut -d' ' -f1 /proc/uptime)\n\
             sleep 30\n\
             u1=$(awk '$1 == \"usage_usec\" {{ print $2 }}' $cg/cpu.stat); t1=$(cut -d' ' -f1 /proc/uptime)\n\
             echo \"cpu_usec $((u1 - u0)) over $t0 $t1\"\n\
             echo \"memory.current $(cat $cg/memory.current)\"\n\
             echo \"memory.peak $(cat $cg/memory.peak 2>/dev/null || echo n/a)\"\n\
             grep -E '^(anon|file) ' $cg/memory.stat"
        ),
        Duration::from_secs(120),
    )
    .await;
    eprintln!("real node: the agent container, idle after the scenarios:\n{footprint}");
}

/// The kubelet's thresholds for the ranking comparison: its defaults with `memory.available` at
/// node-monitor's level, so both act on the same pressure (setting one hard threshold drops the
/// other defaults, so all are given).
pub(crate) const KUBELET_SAME_THRESHOLDS: &str = "evictionHard:\n  memory.available: \"500Mi\"\n  \
     nodefs.available: \"10%\"\n  nodefs.inodesFree: \"5%\"\n  imagefs.available: \"15%\"\n";

/// Events with `reason` on pods of the test namespace, oldest first: (pod, reporting component).
async fn events_with_reason(client: &Client, reason: &str) -> Vec<(String, String)> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let mut list: Vec<Event> = events
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect();
    list.sort_by_key(|e| {
        e.event_time
            .as_ref()
            .map(|t| t.0)
            .or(e.first_timestamp.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    list.into_iter()
        .map(|e| {
            let by = e
                .reporting_component
                .clone()
                .filter(|c| !c.is_empty())
                .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                .unwrap_or_default();
            (e.involved_object.name.unwrap_or_default(), by)
        })
        .collect()
}

/// Ranking parity: the kubelet and node-monitor face the same memory pressure with the same
/// threshold; node-monitor runs in dry-run mode (it decides and reports `EvictionDryRun`, and
/// evicts nothing) and the kubelet's eviction manager really evicts. The pod the kubelet evicts
/// first is the pod node-monitor chose first. The pods make the choice depend on the comparator
/// chain, not on usage alone: a low-priority BestEffort pod holding 200 MiB and a Burstable pod
/// climbing far past its request both exceed their requests; priority ranks the BestEffort pod
/// first although the climber uses more (pkg/kubelet/eviction/helpers.go `rankMemoryPressure`).
/// Run on the failover pair's kind node (`real_node_failover.rs`), whose kubelet has
/// [`KUBELET_SAME_THRESHOLDS`] and whose agent [`agent_config`]`(true)`, installed by a real
/// `helm install` with `distribution=kind` and nothing else about the layout; the pods are bound
/// to `node`.
pub(crate) async fn the_kubelet_and_node_monitor_rank_the_same_pod_first(
    client: &Client,
    node: &mut RealNode,
    agent: &Pod,
    agent_ip: &str,
) {
    // On kind's node layout: the kubelet's `cgroupRoot: /kubelet` with the systemd driver, so
    // the pods live under kubelet.slice/kubelet-kubepods.slice.
    let args = agent
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.args.clone())
        .unwrap_or_default();
    assert!(
        !args.iter().any(|a| a.starts_with("--kubepods-cgroup")),
        "the chart's agent detects the layout itself: {args:?}"
    );
    let classes: Api<k8s_openapi::api::scheduling::v1::PriorityClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": { "name": "nm-low" },
                "value": -10,
                "description": "below the default 0: ranked first by both eviction managers",
            }))
            .expect("PriorityClass"),
        )
        .await
        .expect("create PriorityClass nm-low");
    let low = workload(
        "low-steady",
        &["/usr/local/bin/nm-workload", "--hold", "200Mi"],
    )
    .node(node.name)
    .priority_class("nm-low")
    .build();
    create_running(client, node, low).await;
    let mut database = pod(
        "database",
        &["/usr/local/bin/nm-workload", "--hold", "64Mi"],
        Some(("96Mi", "96Mi")),
    );
    database.spec.as_mut().expect("spec").node_name = Some(node.name.to_owned());
    create_running(client, node, database).await;
    kind_layout_seen(node, agent_ip).await;
    let climber = workload(
        "climber",
        &[
            "/usr/local/bin/nm-workload",
            // Past its request and the low-priority pod's usage from the start, then climbing.
            "--hold",
            "320Mi",
            "--ramp-to",
            "3Gi",
            "--step",
            "24Mi",
            "--interval",
            "1s",
        ],
    )
    .node(node.name)
    // Burstable: a request and no limit.
    .memory("64Mi", None)
    .build();
    let started = Instant::now();
    create_running(client, node, climber).await;

    let kubelet_first = until(
        node,
        "the kubelet's first eviction",
        Duration::from_secs(420),
        || {
            let client = client.clone();
            async move {
                events_with_reason(&client, "Evicted")
                    .await
                    .into_iter()
                    .find(|(_, by)| by == "kubelet")
                    .map(|(pod, _)| pod)
            }
        },
    )
    .await;
    let kubelet_after = started.elapsed();
    let ours = events_with_reason(client, "EvictionDryRun").await;
    let ours_first = ours
        .iter()
        .find(|(_, by)| by == "node-monitor")
        .map(|(pod, _)| pod.clone());
    eprintln!(
        "real node: ranking parity: the kubelet evicted {kubelet_first} first ({:.1} s into the \
         climb); node-monitor (dry run) chose {ours_first:?} first; its dry-run Events: {ours:?}",
        kubelet_after.as_secs_f64()
    );
    assert_eq!(
        kubelet_first, "low-steady",
        "the kubelet ranks by priority before usage"
    );
    assert_eq!(
        ours_first.as_deref(),
        Some("low-steady"),
        "node-monitor's first choice is the kubelet's"
    );
    assert!(
        evictions_of(client, "database").await.is_empty(),
        "neither evicts the Guaranteed pod"
    );
    assert!(
        !events_with_reason(client, "Evicted")
            .await
            .iter()
            .any(|(_, by)| by == "node-monitor"),
        "node-monitor in dry run evicts nothing"
    );
    // The climber climbs on until the kubelet evicts it too: gone before the lifecycle, whose
    // pods the kubelet would otherwise evict under the pressure it keeps making.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let _ = pods
        .delete(
            "climber",
            &kube::api::DeleteParams::default().grace_period(0),
        )
        .await;
    until(node, "the climber gone", Duration::from_secs(180), || {
        let pods = pods.clone();
        async move { pods.get_opt("climber").await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// On kind's layout the agent reads every pod from kubelet.slice/kubelet-kubepods.slice, found
/// by itself, and the kubelet's thresholds from kubeadm's file.
async fn kind_layout_seen(node: &mut RealNode, agent_ip: &str) {
    let m = scrape(node, agent_ip, "metrics-kind.txt").await;
    bullseye_probes_seen(&m);
    let kubepods: Vec<&str> = m
        .lines()
        .filter(|l| l.contains("kubepods_layout"))
        .collect();
    assert_eq!(
        metrics::sum(
            &m,
            "node_monitor_kubepods_layout",
            &[
                ("driver", "systemd"),
                (
                    "path",
                    "/sys/fs/cgroup/kubelet.slice/kubelet-kubepods.slice"
                )
            ]
        ),
        1.0,
        "the agent reads pods from kind's kubelet.slice/kubelet-kubepods.slice: {kubepods:?}"
    );
    assert!(
        m.lines().any(|l| l == "node_monitor_pod_cgroups_missing 0"),
        "the agent sees every running pod's cgroup under kind's layout"
    );
    assert_eq!(
        metrics::sum(&m, "node_monitor_kubelet_config_read", &[]),
        1.0,
        "the kubelet's configuration was read"
    );
    assert!(
        metrics::has_series(
            &m,
            "node_monitor_kubelet_config_source",
            &[("kind", "file"), ("source", "/var/lib/kubelet/config.yaml")]
        ) && metrics::has_series(
            &m,
            "node_monitor_kubelet_config_source",
            &[("kind", "command_line")]
        ),
        "the kubelet found through its command line and kubeadm's file:\n{}",
        m.lines()
            .filter(|l| l.contains("kubelet_config"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!("real node: kind's layout: pods under kubelet.slice/kubelet-kubepods.slice, read");
}

/// This scenario's node boots Debian 11's 5.10 (`GuestKernel::Bullseye`), whose
/// `perf_event_paranoid` is 3: in the DaemonSet pod (CAP_BPF and CAP_PERFMON) no perf event
/// attaches, so the OOM probe is the pid-only raw tracepoint (5.10's `mark_victim` passes the pid
/// alone) and the reboot probe the raw `sys_enter`.
fn bullseye_probes_seen(m: &str) {
    let states: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("node_monitor_ebpf_program_state{") && l.ends_with(" 1"))
        .collect();
    for (program, state) in [
        ("oom_victim_raw", "failed"),
        ("oom_victim_pid", "attached"),
        ("oom_victim_tp", "disabled"),
        ("reboot_enter", "failed"),
        ("reboot_raw", "attached"),
        ("memcg_rcl_beg", "attached"),
        ("direct_rcl_beg", "attached"),
        ("kswapd_wake", "attached"),
    ] {
        assert_eq!(
            metrics::sum(
                m,
                "node_monitor_ebpf_program_state",
                &[("program", program), ("state", state)]
            ),
            1.0,
            "{program} {state} in the DaemonSet pod on 5.10: {states:#?}"
        );
    }
    assert_eq!(
        metrics::sum(m, "node_monitor_degraded", &[]),
        0.0,
        "no required probe missing on 5.10: {states:#?}"
    );
}

/// On k3s's layout the agent reads the kubelet's thresholds from its command line and k3s's
/// drop-in directory (no configuration file), and its imagefs from containerd's root under
/// /var/lib/rancher.
fn k3s_layout_seen(m: &str) {
    let kubelet: Vec<&str> = m.lines().filter(|l| l.contains("kubelet_")).collect();
    assert_eq!(
        metrics::sum(m, "node_monitor_kubelet_config_read", &[]),
        1.0,
        "the kubelet's configuration was read: {kubelet:?}"
    );
    assert!(
        metrics::has_series(
            m,
            "node_monitor_kubelet_config_source",
            &[("kind", "command_line")]
        ) && metrics::has_series(
            m,
            "node_monitor_kubelet_config_source",
            &[
                ("kind", "drop_in"),
                (
                    "source",
                    "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf"
                )
            ]
        ),
        "the kubelet's command line and k3s's drop-in were read: {kubelet:?}"
    );
    // pid.available is set only by the kubelet's --eviction-hard flag: the flag was read.
    assert!(
        metrics::has_series(
            m,
            "node_monitor_kubelet_threshold_preempts",
            &[("eviction_signal", "pid.available"), ("kind", "hard")]
        ),
        "the kubelet's {K3S_KUBELET_EVICTION_FLAG} was read: {kubelet:?}"
    );
    eprintln!("real node: k3s's layout: the kubelet's flags and drop-in read");
}

/// node-monitor's configuration for disk and PID pressure: `nodefs.available` and `pid.available`
/// thresholds a container can cross on this node (3 GiB root file system with about 1.5 GiB free;
/// about 15 000 PIDs free), memory as shipped.
fn disk_and_pid_config() -> String {
    "evictionHard:\n  memory.available: \"100Mi\"\n  nodefs.available: \"40%\"\n  \
     nodefs.inodesFree: \"5%\"\n  imagefs.available: \"15%\"\n  imagefs.inodesFree: \"5%\"\n  \
     pid.available: \"13000\"\nevictionPressureTransitionPeriod: 30s\n\
     nodeMonitor:\n  maxPodsPerCycle: 1\n  pdbPolicy: respect\n"
        .to_owned()
}

/// Creates `p` and waits until it runs, then until node-monitor evicts it for `signal` with the
/// kubelet's wording for `resource`, then until it has left the API; prints how long the eviction
/// took (`since`: what the time counts from).
async fn evicted_and_gone(
    client: &Client,
    node: &RealNode,
    p: Pod,
    signal: &str,
    resource: &str,
    since: &str,
) {
    let name = p.metadata.name.clone().expect("pod name");
    let started = Instant::now();
    create_running(client, node, p).await;
    let message = until(
        node,
        &format!("{name} evicted for {signal}"),
        Duration::from_secs(420),
        || {
            let (client, name) = (client.clone(), name.clone());
            async move { eviction_message(&client, &name).await }
        },
    )
    .await;
    eprintln!(
        "real node: {name} evicted {:.1} s {since}: {message}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        message.contains(&format!("The node was low on resource: {resource}.")),
        "the kubelet's wording for {signal}: {message}"
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    until(
        node,
        &format!("{name} gone from the API"),
        Duration::from_secs(180),
        || {
            let (pods, name) = (pods.clone(), name.clone());
            async move { pods.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
}

/// Disk and PID pressure from containers (scenario 6), on a node with the **cgroupfs** driver
/// (the kubelet's `cgroupDriver: cgroupfs`, containerd's `SystemdCgroup = false`), which the agent
/// must find by itself: a pod filling an emptyDir crosses `nodefs.available`, a pod forking
/// thousands of processes crosses `pid.available`, and a pod filling its own writable layer
/// crosses `nodefs.available` again. Each is evicted by node-monitor with the kubelet's wording
/// for the resource, the bystanders are not, and the kubelet (whose defaults neither crosses)
/// evicts nothing.
/// Then the node powers off through logind and node-monitor (the chart's `shutdown.enabled`)
/// drains the pods by priority group before its lock lets the power-off go on
/// (`real_node_shutdown.rs`): one boot for both, since a power-off ends the guest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_k3s_node_under_disk_and_pid_pressure_then_powered_off() {
    let Installed {
        cp,
        client,
        mut node,
        agent: _,
        agent_ip,
    } = install_from(
        // k3s's layout, with the chart's documented `distribution=k3s`, and graceful node
        // shutdown on (the scenario's last phase).
        Manifests::Helm(&[
            "createNamespace=true",
            "distribution=k3s",
            "shutdown.enabled=true",
            node_monitor_tests::real_node::shutdown::PERIODS_SET[0],
            node_monitor_tests::real_node::shutdown::PERIODS_SET[1],
        ]),
        Some(&disk_and_pid_config()),
        &RealNodeOptions {
            cgroup_driver: CgroupDriver::Cgroupfs,
            layout: NodeLayout::K3s,
            release: Release::Skew,
            // Trixie's kernel series (bookworm-backports' 6.12): the third kernel of the tier.
            kernel: GuestKernel::Backports,
            ..RealNodeOptions::default()
        },
    )
    .await;
    cgroupfs_layout_found(&mut node, &agent_ip).await;
    create_running(
        &client,
        &node,
        pod(
            "database",
            &["/usr/local/bin/nm-workload", "--hold", "64Mi"],
            Some(("96Mi", "96Mi")),
        ),
    )
    .await;
    create_running(
        &client,
        &node,
        pod(
            "bystander",
            &["/usr/local/bin/nm-workload", "--hold", "16Mi"],
            None,
        ),
    )
    .await;

    evicted_and_gone(
        &client,
        &node,
        filler_pod(),
        "nodefs",
        "ephemeral-storage",
        "after it started writing",
    )
    .await;

    // pid.available: 3 000 sleeping processes in one container.
    let forker = pod(
        "forker",
        &["/usr/local/bin/nm-workload", "--procs", "3000"],
        None,
    );
    evicted_and_gone(
        &client,
        &node,
        forker,
        "pid.available",
        "pids",
        "after it started",
    )
    .await;

    // nodefs again, from a container's writable layer: 600 MiB written to its root file
    // system (the image's /tmp, writable by its non-root user), which only the overlay upper
    // directory under /var/lib/containerd holds.
    let layer_filler = pod(
        "layer-filler",
        &[
            "/usr/local/bin/nm-memhog",
            "pagecache",
            "/tmp/fill",
            "600",
            "600",
        ],
        None,
    );
    evicted_and_gone(
        &client,
        &node,
        layer_filler,
        "nodefs",
        "ephemeral-storage",
        "after it started writing",
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);

    layer_credited_until_freed(&mut node, &agent_ip).await;

    for name in ["database", "bystander"] {
        let by = evictions_of(&client, name).await;
        assert!(
            by.is_empty(),
            "{name} is not evicted; evicted by {by:?}: {:?}",
            eviction_message(&client, name).await
        );
        let p = pods.get(name).await.expect("bystander pod");
        assert_eq!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Running"),
            "{name} still runs"
        );
    }
    for name in ["filler", "forker", "layer-filler"] {
        assert_eq!(
            evictions_of(&client, name).await,
            ["node-monitor"],
            "{name} is evicted once, by node-monitor"
        );
    }
    crate::real_node_probes::the_kernel_probes_on_this_nodes_kernel(
        &mut node,
        GuestKernel::Backports,
    )
    .await;
    // A power-off ends the guest: graceful shutdown is this boot's last phase.
    crate::real_node_shutdown::node_monitor_drains_real_containers_by_priority_group_before_the_node_goes(
        cp, &client, node, &agent_ip,
    )
    .await;
}

/// The cgroupfs driver's `kubepods` tree, found by the agent itself, and k3s's layout seen.
async fn cgroupfs_layout_found(node: &mut RealNode, agent_ip: &str) {
    let m = scrape(node, agent_ip, "metrics-cgroupfs.txt").await;
    let layout = metrics::parse(&m)
        .expect("the agent's metrics")
        .into_iter()
        .filter(|s| s.name == "node_monitor_kubepods_layout" && s.value == 1.0)
        .map(|s| s.labels)
        .collect::<Vec<_>>();
    assert!(
        layout
            .iter()
            .any(|l| l.get("driver").map(String::as_str) == Some("cgroupfs")
                && l.get("path").is_some_and(|p| p.ends_with("/kubepods"))),
        "the agent reads pods from the cgroupfs driver's kubepods tree: {layout:?}"
    );
    k3s_layout_seen(&m);
}

/// nodefs: 600 MiB written into an emptyDir (its re-reads keep memory.available far above the
/// memory threshold).
fn filler_pod() -> Pod {
    let mut filler = pod(
        "filler",
        &[
            "/usr/local/bin/nm-memhog",
            "pagecache",
            "/data/fill",
            "600",
            "600",
        ],
        None,
    );
    let spec = filler.spec.as_mut().expect("spec");
    spec.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
        name: "data".into(),
        empty_dir: Some(Default::default()),
        ..Default::default()
    }]);
    spec.containers[0].volume_mounts = Some(vec![k8s_openapi::api::core::v1::VolumeMount {
        name: "data".into(),
        mount_path: "/data".into(),
        ..Default::default()
    }]);
    filler
}

/// The layer stays on disk until the kubelet's container garbage collection (every minute): the
/// agent credits it meanwhile, and says so in its log.
async fn layer_credited_until_freed(node: &mut RealNode, agent_ip: &str) {
    let credited_from = Instant::now();
    let mut credited_max = 0.0_f64;
    loop {
        let m = scrape(node, agent_ip, "metrics-reclaim.txt").await;
        let pending = metrics::sum(&m, "node_monitor_disk_reclaim_pending_bytes", &[]);
        credited_max = credited_max.max(pending);
        if pending == 0.0 {
            break;
        }
        if credited_from.elapsed() > Duration::from_secs(240) {
            fail(
                node,
                "the evicted layer-filler's disk still credited after 240 s",
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    eprintln!(
        "real node: layer-filler's disk credited (at most {:.0} MiB) until {:.1} s after it left the API",
        credited_max / MI,
        credited_from.elapsed().as_secs_f64()
    );
    assert!(
        agent_log(node).lines().any(
            |l| l.contains("evicted pod's disk credited") && l.contains("default/layer-filler")
        ),
        "the layer-filler's disk was not credited at its eviction"
    );
}

/// The message of node-monitor's `Evicted` Event on pod `name`, once there is one.
async fn eviction_message(client: &Client, name: &str) -> Option<String> {
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .ok()?;
    list.items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("Evicted"))
        .and_then(|e| e.message)
}
