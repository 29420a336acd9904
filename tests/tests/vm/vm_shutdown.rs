//! Graceful node shutdown with the real systemd-logind, in the Debian guest (systemd 252, kernel
//! 6.1, cgroup v2), against a real control plane on the host.
//!
//! In the guest: the kubelet stand-in registers `vm-node` and runs its pods as processes; the
//! `node-monitor` agent holds a logind delay inhibitor. The host creates pods in three priority
//! groups and watches the API while the guest shuts down.
//!
//! One boot, `a_cancelled_shutdown_is_undone_then_a_reboot_bypassing_the_inhibitor_sends_a_last_gasp`:
//! - logind's `InhibitDelayMaxSec` (default 5 s) is raised by the agent's drop-in to the groups'
//!   budget;
//! - a cancelled shutdown: systemd 252 has no way to cancel a delayed shutdown from the command
//!   line (`shutdown -c` only cancels a *scheduled* one, before any PrepareForShutdown), but logind
//!   emits `PrepareForShutdown(false)` when the delayed shutdown job cannot be started
//!   (`execute_shutdown_or_sleep` in logind-dbus.c). The guest masks poweroff.target at runtime
//!   during the delay, so the real signal arrives; the agent must undo its marks (condition,
//!   taint, cordon) and take the lock again;
//! - then `systemctl reboot -ff` calls reboot(2) directly; the kernel probe sees it without a
//!   PrepareForShutdown, and the agent's last gasp (`lastGasp: annotation`) reaches the API
//!   before the machine is gone, sent by the fast path (its own ring buffer, `SCHED_FIFO` thread
//!   and warm connection), whose answer the shutdown manager takes instead of writing again. The
//!   guest has an md array, whose reboot notifier gives the restart path one second, as on a
//!   server with software RAID (see `SCRIPT`): without it the gasp wins the race only part of the
//!   time in this TCG guest (`bench-last-gasp`, docs/benchmarks.md), and a test must not depend
//!   on a race.
//!
//! The drain itself (groups in order, each within its period, every pod gone before the lock is
//! released, the phases in the agent's metrics) runs on the real node, with the real kubelet
//! stopping real containers (`real_node_shutdown`); a power-off ends a guest, so one boot holds
//! one drain or one bypass, and this one holds the bypass.
//!
//! The tests fail (never skip) when qemu, the guest image or the control-plane binaries are
//! missing. Timings are reported on stderr for docs/benchmarks.md ("Graceful shutdown").
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{
    api::{
        core::v1::{Node, Pod},
        scheduling::v1::PriorityClass,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client,
    api::{ListParams, PostParams},
};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    pod::PodBuilder,
    vm::{ENTRY_PRELUDE, Guest, GuestOptions, GuestRun, Payload, report},
};

const NODE: &str = "vm-node";
const NS: &str = "default";
/// Seconds a test pod takes to exit after SIGTERM (its bash trap).
const EXIT_DELAY: u64 = 3;
/// The canary's PriorityClass: the lowest of the configuration's three groups.
const CANARY_CLASS: (&str, i32) = ("nm-low", 0);

/// What every guest script runs after [`ENTRY_PRELUDE`] and `AGENT_FLAGS`: the stand-in and the
/// agent.
const GUEST_PRELUDE: &str = r#"log "entry started; uptime $(uptime_s)"
# The host boots the guest while its control plane starts, and hands the kubeconfig over last.
# A host that never does (its control plane failed) must not leave the guest running.
for _ in $(seq 750); do [ -e /mnt/host/kubeconfig ] && break; sleep 0.2; done
[ -e /mnt/host/kubeconfig ] || { log "no kubeconfig from the host"; systemctl poweroff -ff; }
# The agent and the metrics dumper live in a cgroup of their own, outside nm-guest.service:
# systemd stops the service at the start of the power-off, and the agent must outlive it (a
# DaemonSet's agent lives in the kubepods tree, not in a systemd service either).
mkdir -p /sys/fs/cgroup/node-monitor-test/agent /var/lib/kubelet
# HTTP over bash's /dev/tcp (the guest has no curl); each in a subshell, so a refused
# connection fails the function, not the script.
dump_metrics() {
  ( exec 3<>/dev/tcp/127.0.0.1/9101 && printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 \
      && cat <&3 > "/mnt/out/.$1.tmp" && mv "/mnt/out/.$1.tmp" "/mnt/out/$1" ) 2>/dev/null
}
ready() {
  ( exec 4<>/dev/tcp/127.0.0.1/9101 && printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&4 \
      && read -r _ status _ <&4 && [ "$status" = 200 ] ) 2>/dev/null
}
/mnt/host/nm-kubelet-standin --kubeconfig /mnt/host/kubeconfig --node-name vm-node \
  --cgroup-root /node-monitor-test/vm-node --memory 512Mi > /mnt/out/standin.log 2>&1 &
(
  echo $BASHPID > /sys/fs/cgroup/node-monitor-test/agent/cgroup.procs
  export RUST_LOG=info NO_COLOR=1
  exec /mnt/host/node-monitor run --config /mnt/host/config.yaml --node-name vm-node \
    --node-cgroup node-monitor-test/vm-node --kubeconfig /mnt/host/kubeconfig \
    --metrics-addr 127.0.0.1:9101 $AGENT_FLAGS > /mnt/out/agent.log 2>&1
) &
until ready; do sleep 0.5; done
log "agent ready; uptime $(uptime_s)"
"#;

/// The scenario, after the prelude. The guest gets an (empty) md array first: md's reboot
/// notifier holds every restart for one second (`md_notify_reboot` in drivers/md/md.c), as on any
/// server with software RAID. Without such a delay the kernel's restart path in this TCG guest
/// takes milliseconds, and the last gasp wins the race only part of the time (docs/benchmarks.md,
/// "Last gasp delivery"); with the delay the test checks what the fast path did, not its luck.
const SCRIPT: &str = r#"
modprobe md_mod && echo md0 > /sys/module/md_mod/parameters/new_array
ls -d /sys/block/md0 > /mnt/out/md 2>&1
until systemd-inhibit --list --no-pager | grep -q node-monitor; do sleep 0.2; done
busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager InhibitDelayMaxUSec > /mnt/out/inhibit-delay-usec
cat /etc/systemd/logind.conf.d/99-node-monitor.conf > /mnt/out/dropin 2>&1
systemd-inhibit --list --no-pager > /mnt/out/inhibitors-start 2>&1

# A cancelled shutdown: power off, then make the delayed start of poweroff.target fail. A delay
# lock of the script's own keeps logind from starting the target before the masked state is
# loaded (a daemon-reload takes seconds here), however soon the agent releases its lock.
wait_for /mnt/host/go-cancel
systemd-inhibit --what=shutdown --mode=delay --who=nm-test --why="masking poweroff.target" sleep 300 &
guard=$!
until systemd-inhibit --list --no-pager | grep -q nm-test; do sleep 0.2; done
log "poweroff (to be cancelled)"
systemctl poweroff
systemctl mask --runtime poweroff.target
systemctl daemon-reload
log "poweroff.target masked"
kill $guard
# logind gives up on the masked target once the agent releases its lock, and emits
# PrepareForShutdown(false); the agent takes its lock again.
until [ "$(busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager PreparingForShutdown)" = "b false" ] \
      && systemd-inhibit --list --no-pager | grep -q node-monitor; do sleep 0.2; done
log "cancelled; inhibitor held again"
systemd-inhibit --list --no-pager > /mnt/out/inhibitors-after-cancel 2>&1

# The bypass: reboot(2) with no PrepareForShutdown.
until grep -q "eBPF programs ready" /mnt/out/agent.log; do sleep 0.2; done
wait_for /mnt/host/go-reboot
log "reboot -ff"
date +%s.%N > /mnt/out/reboot-at
systemctl reboot -ff
sleep infinity
"#;

/// Three priority groups (their budget sets logind's delay), the node cordoned during a
/// shutdown, and the last gasp as an annotation.
const CONFIG: &str = "evictionHard:
  memory.available: 1Mi
shutdownGracePeriodByPodPriority:
  - priority: 0
    shutdownGracePeriodSeconds: 8
  - priority: 1000
    shutdownGracePeriodSeconds: 8
  - priority: 100000
    shutdownGracePeriodSeconds: 8
nodeMonitor:
  shutdown:
    cordon: true
    lastGasp: annotation
    lastGaspTimeout: 2s
";
/// A payload: the binaries (hard links into target/, the same filesystem), the agent's config
/// and the entry script; the host hands the guest kubeconfig over later, and drops flag files
/// into it to step the guest along.
fn payload(config: &str, script: &str, agent_flags: &str) -> Payload {
    let payload = Payload::new("nm-vm-shutdown").expect("payload dir");
    payload
        .link_binaries(&["node-monitor", "nm-kubelet-standin"])
        .expect("binaries");
    payload.write("config.yaml", config).expect("config");
    payload
        .entry(&format!(
            "{ENTRY_PRELUDE}AGENT_FLAGS='{agent_flags}'\n{GUEST_PRELUDE}{script}"
        ))
        .expect("entry script");
    payload
}

fn boot(payload: &Payload) -> Guest {
    Guest::boot(
        payload.path(),
        GuestOptions {
            timeout: Duration::from_secs(300),
            ..Default::default()
        },
    )
}

/// The guest's files a failure message shows.
const REPORT_FILES: &[&str] = &["entry.log", "agent.log", "standin.log"];

/// Waits for qemu to exit; returns the run and when it ended.
async fn finish(guest: Guest) -> (GuestRun, Instant) {
    let run = guest
        .finish()
        .await
        .unwrap_or_else(|e| panic!("guest run failed: {e:#}"));
    (run, Instant::now())
}

/// Panics with the guest's files when the guest is gone (it never stops on its own before the
/// host signals it, so an early exit is a failure).
async fn fail_with_guest(guest: Guest, what: &str) -> ! {
    guest.fail(what, REPORT_FILES).await
}

async fn node(client: &Client) -> Option<Node> {
    Api::<Node>::all(client.clone())
        .get_opt(NODE)
        .await
        .ok()
        .flatten()
}

/// (status, reason) of the agent's shutdown condition.
fn shutdown_condition(n: &Node) -> Option<(String, String)> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NodeMonitorShuttingDown")
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
}

fn has_shutdown_taint(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == "node-monitor.io/shutdown" && t.effect == "NoSchedule")
        })
}

fn unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Waits until `check` holds for the node, failing when the guest ends first.
async fn wait_node(
    client: &Client,
    guest: Guest,
    timeout: Duration,
    what: &str,
    check: impl Fn(&Node) -> bool,
) -> Guest {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(n) = node(client).await
            && check(&n)
        {
            return guest;
        }
        if !guest.running() {
            fail_with_guest(guest, &format!("the guest ended before: {what}")).await;
        }
        if Instant::now() > deadline {
            eprintln!(
                "node: {:?}",
                node(client)
                    .await
                    .map(|n| (shutdown_condition(&n), has_shutdown_taint(&n)))
            );
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn create_priority_classes(client: &Client) {
    let api: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [CANARY_CLASS] {
        let pc = PriorityClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            value: Some(value),
            ..Default::default()
        };
        api.create(&PostParams::default(), &pc)
            .await
            .unwrap_or_else(|e| panic!("priority class {name}: {e}"));
    }
}

/// A pod on the guest node whose process takes `exit_delay` seconds to exit after SIGTERM.
fn slow_pod(name: &str, class: &str, exit_delay: u64) -> Pod {
    let script = format!("trap 'sleep {exit_delay}; exit 0' TERM; while :; do sleep 0.2; done");
    PodBuilder::new(name)
        .namespace(NS)
        .node(NODE)
        .priority_class(class)
        .termination_grace(30)
        .image("bash")
        .command(["/bin/bash", "-c", &script])
        .build()
}

async fn create_running(client: &Client, pods: Vec<Pod>, guest: Guest) -> Guest {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let names: Vec<String> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    for p in pods {
        api.create(&PostParams::default(), &p)
            .await
            .expect("create pod");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = api.list(&ListParams::default()).await.expect("list pods");
        let running = names.iter().all(|n| {
            list.items.iter().any(|p| {
                p.metadata.name.as_deref() == Some(n.as_str())
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
        });
        if running {
            return guest;
        }
        if !guest.running() {
            fail_with_guest(guest, "the guest ended before the pods ran").await;
        }
        if Instant::now() > deadline {
            let what = format!("pods {names:?} not Running within 60 s");
            guest.abort(&what, REPORT_FILES).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the host saw of each pod and of the node while the guest shut down.
#[derive(Debug, Default)]
struct Observed {
    /// Pod name → first poll that showed a deletionTimestamp.
    deleting: BTreeMap<String, Instant>,
    /// Pod name → first poll that no longer showed it.
    gone: BTreeMap<String, Instant>,
    condition_true: Option<Instant>,
    taint: Option<Instant>,
    cordoned: Option<Instant>,
}

/// Polls the API every 100 ms until `stop`, recording what changed.
fn watch_api(
    client: Client,
    names: Vec<String>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (Arc<Mutex<Observed>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Observed::default()));
    let out = seen.clone();
    let handle = tokio::spawn(async move {
        let api: Api<Pod> = Api::namespaced(client.clone(), NS);
        while !*stop.borrow() {
            let now = Instant::now();
            if let Ok(list) = api.list(&ListParams::default()).await {
                let mut o = seen.lock().expect("observations");
                for n in &names {
                    match list
                        .items
                        .iter()
                        .find(|p| p.metadata.name.as_deref() == Some(n.as_str()))
                    {
                        Some(p) if p.metadata.deletion_timestamp.is_some() => {
                            o.deleting.entry(n.clone()).or_insert(now);
                        }
                        Some(_) => {}
                        None => {
                            o.gone.entry(n.clone()).or_insert(now);
                        }
                    }
                }
            }
            if let Some(n) = node(&client).await {
                let mut o = seen.lock().expect("observations");
                if shutdown_condition(&n).is_some_and(|(s, _)| s == "True") {
                    o.condition_true.get_or_insert(now);
                }
                if has_shutdown_taint(&n) {
                    o.taint.get_or_insert(now);
                }
                if unschedulable(&n) {
                    o.cordoned.get_or_insert(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    (out, handle)
}

/// The guest's uptime logged with a step of the entry script (NaN when missing).
fn uptime_at(entry_log: &str, step: &str) -> f64 {
    entry_log
        .lines()
        .find(|l| l.contains(step))
        .and_then(|l| l.rsplit_once("uptime "))
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// A cancelled shutdown: the node marked, then unmarked, and the lock taken again; the canary
/// pod the cancelled shutdown terminated before logind gave up on it.
async fn cancel_a_shutdown(client: &Client, payload: &Payload, guest: Guest) -> Guest {
    let guest = create_running(
        client,
        vec![slow_pod("canary", CANARY_CLASS.0, EXIT_DELAY)],
        guest,
    )
    .await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (cancel_seen, cancel_watch) = watch_api(client.clone(), vec!["canary".into()], stop_rx);
    payload.signal("go-cancel").expect("flag file");
    let guest = wait_node(
        client,
        guest,
        Duration::from_secs(60),
        "the node marked, then unmarked after the cancellation",
        |n| {
            let o = cancel_seen.lock().expect("observations");
            o.condition_true.is_some()
                && o.taint.is_some()
                && o.cordoned.is_some()
                && !has_shutdown_taint(n)
                && !unschedulable(n)
                && shutdown_condition(n).is_some_and(|(s, r)| s == "False" && r == "InhibitorHeld")
        },
    )
    .await;
    let _ = stop_tx.send(true);
    cancel_watch.await.expect("cancel watcher");
    assert!(
        cancel_seen
            .lock()
            .expect("observations")
            .gone
            .contains_key("canary"),
        "the canary pod was terminated by the cancelled shutdown before logind gave up on it"
    );
    guest
}

/// From the guest's side: the inhibitor held again after the cancellation, and logind's delay
/// raised by the drop-in to the budget (3 × 8 s) plus the margin (5 s).
fn assert_logind_delay_raised_and_the_lock_taken_again(run: &GuestRun, report: &str) {
    let after_cancel = run.read_out("inhibitors-after-cancel").unwrap_or_default();
    assert!(
        after_cancel.contains("node-monitor"),
        "inhibitor after the cancellation:\n{after_cancel}\n{report}"
    );
    let delay = run.read_out("inhibit-delay-usec").unwrap_or_default();
    assert_eq!(
        delay.trim(),
        "t 29000000",
        "InhibitDelayMaxUSec after the drop-in\n{report}"
    );
    let dropin = run.read_out("dropin").unwrap_or_default();
    assert!(
        dropin.contains("InhibitDelayMaxSec=29"),
        "drop-in:\n{dropin}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_shutdown_is_undone_then_a_reboot_bypassing_the_inhibitor_sends_a_last_gasp() {
    // The guest boots while the control plane starts.
    let payload = payload(CONFIG, SCRIPT, "--no-mlock");
    let guest = boot(&payload);
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .expect("control plane");
    let client = cp.client();
    create_priority_classes(&client).await;
    payload.kubeconfig(&cp).expect("kubeconfig");
    // The agent holds its inhibitor and says so on the node.
    let guest = wait_node(
        &client,
        guest,
        Duration::from_secs(180),
        "the agent's inhibitor on the node",
        |n| shutdown_condition(n).is_some_and(|(s, r)| s == "False" && r == "InhibitorHeld"),
    )
    .await;
    let armed = guest.started.elapsed();
    let guest = cancel_a_shutdown(&client, &payload, guest).await;

    let reboot = Instant::now();
    payload.signal("go-reboot").expect("flag file");
    let (run, exited) = finish(guest).await;
    let report = report(&run, REPORT_FILES);
    assert_logind_delay_raised_and_the_lock_taken_again(&run, &report);
    // The last gasp was sent before the machine went; give the API a moment to show it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let gasp = loop {
        let a = node(&client).await.and_then(|n| {
            n.metadata
                .annotations
                .and_then(|mut a| a.remove("node-monitor.io/last-gasp"))
        });
        if a.is_some() || Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let md = run.read_out("md").unwrap_or_default();
    assert!(
        md.contains("/sys/block/md0"),
        "the guest's md array: {md}\n{report}"
    );
    let gasp = gasp.unwrap_or_else(|| panic!("the last gasp did not reach the API\n{report}"));
    let v: serde_json::Value =
        serde_json::from_str(&gasp).unwrap_or_else(|e| panic!("last gasp {gasp:?}: {e}"));
    assert_eq!(v["cmd"], "restart", "{gasp}");
    assert_eq!(v["comm"], "systemctl", "{gasp}");
    // systemctl runs as root in the guest's initial namespaces: the probe's caller checks pass.
    assert_eq!(v["verdict"], "allowed", "{gasp}");
    // The graceful path did not run: no PrepareForShutdown, so the node was never marked.
    let n = node(&client).await.expect("node");
    assert!(
        !has_shutdown_taint(&n),
        "a bypass must not look like a graceful shutdown"
    );
    assert_eq!(
        shutdown_condition(&n).map(|(s, _)| s),
        Some("False".to_owned())
    );
    let agent_log = run.read_out("agent.log").unwrap_or_default();
    assert!(
        agent_log.contains("program=\"reboot_enter\""),
        "the reboot probe must be attached\n{report}"
    );
    // The gasp went out on the fast path (its own ring buffer, thread and warm connection), and
    // the shutdown manager took its answer instead of writing again.
    assert!(
        agent_log.contains("last gasp fast path ready (SCHED_FIFO)"),
        "the fast path must be running at SCHED_FIFO priority (root in the guest)\n{report}"
    );
    assert!(
        agent_log
            .lines()
            .any(|l| l.contains("last gasp sent by the fast path") && l.contains(" sent=true")),
        "the fast path must have sent the last gasp\n{report}"
    );
    let reboot_at: f64 = run
        .read_out("reboot-at")
        .unwrap_or_default()
        .trim()
        .parse()
        .expect("reboot time");
    let gasp_at = v["time"].as_f64().expect("last gasp time");
    let entry = run.read_out("entry.log").unwrap_or_default();
    eprintln!(
        "vm_shutdown: guest uptime at nm-guest.service start {:.1}s, at agent ready {:.1}s; guest boot to agent armed {:.1}s",
        uptime_at(&entry, "entry started"),
        uptime_at(&entry, "agent ready"),
        secs(armed)
    );
    eprintln!(
        "vm_shutdown bypass: reboot(2) to last gasp sent {:.0} ms (guest clock); reboot request to qemu exit {:.2}s; guest run {:.1}s",
        (gasp_at - reboot_at) * 1e3,
        secs(exited.duration_since(reboot)),
        secs(run.elapsed)
    );
    cp.stop().expect("stop control plane");
}
