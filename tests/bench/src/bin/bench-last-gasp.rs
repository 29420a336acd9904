//! How often the last gasp reaches the API server when the node is rebooted around logind's
//! inhibitor, with nothing slowing the kernel's restart path down (no md array, unlike the
//! `vm_shutdown` test).
//!
//! One control plane on the host; for each run a fresh qemu guest (Debian, systemd-logind 252,
//! cgroup v2) boots the kubelet stand-in and the agent (`lastGasp: annotation`), waits until the
//! agent holds its inhibitor, and reboots with one of the bypassing methods, in turn:
//!
//! - `reboot-f`: `reboot -f` (no logind, but systemd-shutdown kills every process, the agent
//!   included, before its reboot(2): a control, never delivered);
//! - `systemctl-ff`: `systemctl reboot -ff` (systemctl calls reboot(2));
//! - `direct`: a program calling reboot(2) at once (`perl -e 'syscall(169, …)'`: perl-base is
//!   in every Debian system; syscall 169 is reboot on x86_64).
//!
//! After qemu exits the host looks for `node-monitor.io/last-gasp` on the node for 5 s (the Node
//! is deleted before each run, so an annotation is this run's). Prints one line per run and a
//! table for docs/benchmarks.md.
//!
//! ```text
//! flock /tmp/nm-vm.lock target/debug/bench-last-gasp --runs 8 [--no-fast-path]
//! ```
//! Needs the workspace's binaries built (`cargo bins`) and the control-plane binaries
//! (`KUBEBUILDER_ASSETS`), like the guest tests.
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, ValueEnum};
use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{DeleteParams, PropagationPolicy},
};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions},
    vm::{ENTRY_PRELUDE, Guest, GuestOptions, Payload},
};

const NODE: &str = "vm-node";
const ANNOTATION: &str = "node-monitor.io/last-gasp";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Method {
    /// `reboot -f`.
    RebootF,
    /// `systemctl reboot -ff`.
    SystemctlFf,
    /// perl calling reboot(2) directly.
    Direct,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Self::RebootF => "reboot -f",
            Self::SystemctlFf => "systemctl reboot -ff",
            Self::Direct => "direct reboot(2)",
        }
    }

    fn command(self) -> &'static str {
        match self {
            Self::RebootF => "reboot -f",
            Self::SystemctlFf => "systemctl reboot -ff",
            Self::Direct => "perl -e 'syscall(169, 0xfee1dead, 672274793, 0x01234567)'",
        }
    }
}

#[derive(Debug, Parser)]
#[command(about = "Last gasp delivery over bypassing reboots of a qemu guest")]
struct Args {
    /// Guest runs (the methods take turns).
    #[arg(long, default_value_t = 8)]
    runs: usize,
    /// The methods to use, in turn (`reboot-f` cannot be seen: systemd-shutdown kills the agent
    /// before its reboot(2)).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Method::SystemctlFf, Method::Direct])]
    methods: Vec<Method>,
    /// Run the agent with its last gasp fast path off (`NODE_MONITOR_LAST_GASP_FAST_PATH=off`):
    /// the shutdown manager alone, as before the fast path.
    #[arg(long)]
    no_fast_path: bool,
}

/// The guest: the stand-in and the agent (as in tests/tests/vm/vm_shutdown.rs), then the reboot.
const SCRIPT: &str = r#"log "entry started; uptime $(uptime_s)"
for _ in $(seq 750); do [ -e /mnt/host/kubeconfig ] && break; sleep 0.2; done
[ -e /mnt/host/kubeconfig ] || { log "no kubeconfig from the host"; systemctl poweroff -ff; }
mkdir -p /sys/fs/cgroup/node-monitor-test/agent /var/lib/kubelet
/mnt/host/nm-kubelet-standin --kubeconfig /mnt/host/kubeconfig --node-name vm-node \
  --cgroup-root /node-monitor-test/vm-node --memory 512Mi > /mnt/out/standin.log 2>&1 &
(
  echo $BASHPID > /sys/fs/cgroup/node-monitor-test/agent/cgroup.procs
  export RUST_LOG=info NO_COLOR=1 NODE_MONITOR_LAST_GASP_FAST_PATH=$FAST_PATH
  exec /mnt/host/node-monitor run --config /mnt/host/config.yaml --node-name vm-node \
    --node-cgroup node-monitor-test/vm-node --kubeconfig /mnt/host/kubeconfig \
    --metrics-addr 127.0.0.1:9101 --no-mlock > /mnt/out/agent.log 2>&1
) &
until grep -q "eBPF programs ready" /mnt/out/agent.log 2>/dev/null; do sleep 0.2; done
wait_for /mnt/host/go-reboot
log "reboot: $REBOOT"
sync
date +%s.%N > /mnt/out/reboot-at
eval "$REBOOT"
sleep infinity
"#;

const CONFIG: &str = "evictionHard:
  memory.available: 1Mi
shutdownGracePeriod: 10s
shutdownGracePeriodCriticalPods: 5s
nodeMonitor:
  shutdown:
    lastGasp: annotation
    lastGaspTimeout: 2s
";

struct RunResult {
    method: Method,
    delivered: bool,
    /// reboot(2) request (the guest's clock before the command) to the gasp's time.
    gasp_ms: Option<f64>,
}

async fn node_annotation(client: &Client) -> Option<String> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .get_opt(NODE)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.metadata.annotations)
        .and_then(|mut a| a.remove(ANNOTATION))
}

async fn inhibitor_held(client: &Client) -> bool {
    let nodes: Api<Node> = Api::all(client.clone());
    let Ok(Some(n)) = nodes.get_opt(NODE).await else {
        return false;
    };
    n.status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| {
            c.type_ == "NodeMonitorShuttingDown"
                && c.status == "False"
                && c.reason.as_deref() == Some("InhibitorHeld")
        })
}

async fn one_run(cp: &ControlPlane, method: Method, fast: bool) -> Result<RunResult> {
    let client = cp.client();
    let nodes: Api<Node> = Api::all(client.clone());
    // A fresh Node: an annotation found later is this run's.
    if nodes.get_opt(NODE).await?.is_some() {
        nodes
            .delete(
                NODE,
                &DeleteParams {
                    propagation_policy: Some(PropagationPolicy::Background),
                    ..Default::default()
                },
            )
            .await?;
        while nodes.get_opt(NODE).await?.is_some() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let payload = Payload::new("nm-bench-gasp")?;
    payload.link_binaries(&["node-monitor", "nm-kubelet-standin"])?;
    payload.write("config.yaml", CONFIG)?;
    payload.entry(&format!(
        "{ENTRY_PRELUDE}REBOOT={}\nFAST_PATH={}\n{SCRIPT}",
        shell_quote(method.command()),
        if fast { "on" } else { "off" }
    ))?;
    let guest = Guest::boot(
        payload.path(),
        GuestOptions {
            timeout: Duration::from_secs(300),
            ..Default::default()
        },
    );
    payload.kubeconfig(cp)?;
    let deadline = Instant::now() + Duration::from_secs(240);
    while !inhibitor_held(&client).await {
        if !guest.running() {
            let run = guest.finish().await;
            bail!(
                "the guest ended before the agent held its inhibitor: {:?}",
                run.map(|r| r.read_out("agent.log"))
            );
        }
        if Instant::now() > deadline {
            guest
                .fail(
                    "the agent's inhibitor on the node",
                    &["entry.log", "agent.log"],
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The agent holds the inhibitor; give its fast path a moment to have its connection up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    payload.signal("go-reboot")?;
    let run = guest.finish().await.context("guest run")?;
    let deadline = Instant::now() + Duration::from_secs(5);
    let gasp = loop {
        let a = node_annotation(&client).await;
        if a.is_some() || Instant::now() > deadline {
            break a;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let reboot_at: Option<f64> = run
        .read_out("reboot-at")
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let gasp_ms = gasp.as_deref().and_then(|g| {
        let v: serde_json::Value = serde_json::from_str(g).ok()?;
        Some((v["time"].as_f64()? - reboot_at?) * 1e3)
    });
    let agent_log = run.read_out("agent.log").unwrap_or_default();
    if !agent_log.contains("eBPF programs ready") {
        bail!("the agent did not load its probes:\n{agent_log}");
    }
    // What the agent got to log before the machine went.
    for line in agent_log
        .lines()
        .filter(|l| l.contains("gasp") || l.contains("reboot") || l.contains("panicked"))
    {
        eprintln!("  agent: {line}");
    }
    Ok(RunResult {
        method,
        delivered: gasp.is_some(),
        gasp_ms,
    })
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.methods.is_empty() {
        bail!("--methods: at least one method");
    }
    let cp = ControlPlane::start(ControlPlaneOptions::default())
        .await
        .context("control plane")?;
    let mut results = Vec::new();
    for i in 0..args.runs {
        let method = args.methods[i % args.methods.len()];
        let started = Instant::now();
        let r = one_run(&cp, method, !args.no_fast_path).await?;
        eprintln!(
            "run {}: {:<22} delivered={} gasp_after_request={} ({:.0} s)",
            i + 1,
            method.name(),
            r.delivered,
            r.gasp_ms
                .map_or_else(|| "-".to_owned(), |m| format!("{m:.0} ms")),
            started.elapsed().as_secs_f64()
        );
        results.push(r);
    }
    cp.stop().context("stop control plane")?;
    println!(
        "\nfast path: {}",
        if args.no_fast_path { "off" } else { "on" }
    );
    println!(
        "| method | runs | last gasp reached the API | request → gasp sent (guest clock), each |"
    );
    println!("|---|---|---|---|");
    for m in &args.methods {
        let rs: Vec<&RunResult> = results.iter().filter(|r| r.method == *m).collect();
        if rs.is_empty() {
            continue;
        }
        let ok = rs.iter().filter(|r| r.delivered).count();
        let times: Vec<String> = rs
            .iter()
            .filter_map(|r| r.gasp_ms.map(|m| format!("{m:.0}")))
            .collect();
        println!(
            "| {} | {} | {} | {} ms |",
            m.name(),
            rs.len(),
            ok,
            if times.is_empty() {
                "-".to_owned()
            } else {
                times.join(", ")
            }
        );
    }
    let ok = results.iter().filter(|r| r.delivered).count();
    println!("| all | {} | {} | |", results.len(), ok);
    Ok(())
}
