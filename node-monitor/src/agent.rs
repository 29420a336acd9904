//! `node-monitor run`: the agent. Wake-ups → sampler → pure core → actuator, in the kubelet
//! eviction manager's order (observe → thresholds → conditions → reclaim → rank → evict → wait for
//! cleanup), but driven by kernel notifications instead of a 10 s poll.
//!
//! The loop keeps sampling and deciding when the API server is unreachable: API calls fail, are
//! counted and retried on later cycles, and the pod reflector catches up on reconnect. Nothing the
//! API answers can end the loop; only SIGTERM/SIGINT do.
pub mod backoff;
mod cleanup;
mod conditions;
mod cycle;
mod cycle_metrics;
mod disk_reclaim;
mod flight;
mod guarantees;
pub mod kernel;
mod kubelet_config;
mod kubelet_source;
mod mem_push;
pub mod memcg;
mod node_api;
pub mod ports;
pub mod protect;
mod recorders;
mod report;
pub mod sources;
mod start;

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use tracing::{debug, error, info, warn};

use crate::{
    cluster::{
        self as kube_adapter,
        actuator::{Actuator, ActuatorConfig},
    },
    http::Health,
    live::LiveView,
    metrics::Metrics,
    wakeup::{WakeSource, Wakeup},
};

use crate::settings::{EvictionFlags, load_config};
use node_monitor_core::{
    agent_config::AgentConfig,
    config::{self, PdbPolicy},
    eviction::{MIN_TIMER_INTERVAL, next_grace_deadline, next_timer},
};

use self::{
    cycle::Loop,
    start::{
        headroom_policy, init_metrics, new_sampler, node_allocatable_memory, start_pod_reflector,
        start_probes, start_wakeups,
    },
};

/// `node-monitor run`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Configuration file: KubeletConfiguration eviction fields plus `nodeMonitor:` settings.
    /// Repeatable; later files replace the fields they set. A directory stands for its `*.yaml`,
    /// `*.yml` and `*.json` files in name order (a `conf.d` of drop-ins).
    #[arg(long)]
    pub config: Vec<PathBuf>,
    #[command(flatten)]
    pub eviction: EvictionFlags,
    /// Kubeconfig; default: in-cluster config, then $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (the DaemonSet passes spec.nodeName through the downward API).
    #[arg(long, env = "NODE_NAME", value_parser = node_monitor_core::kubelet::node_name::parse_node_name)]
    pub node_name: String,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9101")]
    pub metrics_addr: SocketAddr,
    /// Where the cgroup hierarchies are mounted.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// The cgroup that stands for the node, relative to each hierarchy (default: the root). A
    /// nested or simulated node names its cgroup here; capacity is then its memory limit.
    // `/` and not "": clap's path parser refuses an empty value, default included.
    #[arg(long, default_value = "/")]
    pub node_cgroup: PathBuf,
    /// The kubepods cgroup under the node cgroup: `auto` (detected from the cgroup tree and the
    /// kubelet's configuration), `kubepods` (cgroupfs driver) or `kubepods.slice` (systemd).
    #[arg(long, default_value = crate::sampler::KUBEPODS_AUTO)]
    pub kubepods_cgroup: String,
    /// The kubelet's configuration file, read for `cgroupDriver` by `--kubepods-cgroup auto`
    /// (default: `<kubelet-root>/config.yaml`, where kubeadm writes it).
    #[arg(long)]
    pub kubelet_config: Option<PathBuf>,
    /// procfs of the host (a DaemonSet mounts the host's /proc here).
    #[arg(long, default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The kubelet's root directory (nodefs).
    #[arg(long, default_value = "/var/lib/kubelet")]
    pub kubelet_root: PathBuf,
    /// The image filesystem (default: discovered for containerd and CRI-O).
    #[arg(long)]
    pub image_fs: Option<PathBuf>,
    /// The containers' writable-layer filesystem when the runtime keeps it apart from images
    /// (KEP-4191; CRI-O with an `imagestore`: `--image-fs` the image store,
    /// `--container-fs /var/lib/containers/storage`). Default: the image filesystem.
    #[arg(long)]
    pub container_fs: Option<PathBuf>,
    /// Decide and report, but evict nothing (overrides the configuration).
    #[arg(long)]
    pub dry_run: bool,
    /// Turn every push wake-up off and sample on the housekeeping tick only, like the kubelet's
    /// 10 s poll. For comparisons; never for production.
    #[arg(long)]
    pub polling_only: bool,
    /// Do not load the eBPF programs.
    #[arg(long)]
    pub no_ebpf: bool,
    /// The agent's own oom_score_adj.
    #[arg(
        long,
        default_value_t = protect::DEFAULT_OOM_SCORE_ADJ,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(i32).range(-1000..=1000)
    )]
    pub oom_score_adj: i32,
    /// Do not lock the agent's memory.
    #[arg(long)]
    pub no_mlock: bool,
    /// The audiences a caller's token must be valid for on the node API (`/node-monitor/v1/`),
    /// comma-separated: `node-monitor` by default, the tokens `kubectl node-monitor` mints,
    /// which the API server accepts for nothing else; empty (`--api-token-audience=`): the API
    /// server's own, so a caller's API token works, and an agent could replay it
    /// (docs/security.md).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "AUDIENCE",
        default_value = node_monitor_core::contract::names::NODE_API_AUDIENCE
    )]
    pub api_token_audience: Vec<String>,
    /// The agent's namespace, where it keeps its liveness Lease (the DaemonSet passes
    /// metadata.namespace through the downward API).
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "node-monitor",
        value_parser = node_monitor_core::kubelet::node_name::parse_namespace
    )]
    pub namespace: String,
}

/// `off` turns the last gasp's fast path off (docs/shutdown.md).
const FAST_GASP_ENV: &str = "NODE_MONITOR_LAST_GASP_FAST_PATH";

/// The last gasp's fast path (a thread with its own warm API connection), when shutdown
/// handling and a last gasp are configured.
fn fast_gasp(
    args: &Args,
    shutdown: &crate::shutdown::ShutdownConfig,
    kube_config: &kube::Config,
    metrics: &Metrics,
) -> (
    Option<crate::shutdown::gasp::FastStart>,
    Option<Arc<crate::shutdown::gasp::FastGasp>>,
) {
    if !shutdown.options.enabled {
        return (None, None);
    }
    // For measuring the fast path against the manager alone (docs/benchmarks.md).
    if std::env::var(FAST_GASP_ENV).is_ok_and(|v| v == "off") {
        info!("{FAST_GASP_ENV}=off: the last gasp's fast path is off");
        return (None, None);
    }
    let fast = crate::shutdown::gasp::FastStart::new(
        shutdown.options.last_gasp,
        &args.node_name,
        kube_config.clone(),
        shutdown.options.last_gasp_timeout,
    )
    .map(|f| f.with_realtime_gauge(metrics.shutdown.last_gasp_realtime.clone()));
    let shared = fast.as_ref().map(|f| f.shared.clone());
    (fast, shared)
}

/// The agent's configuration from its files and flags (`--dry-run` wins), its warnings logged.
fn agent_config(args: &Args) -> anyhow::Result<AgentConfig> {
    let mut config = load_config(&args.config, &args.eviction)?;
    if args.dry_run {
        config.eviction.node_monitor.dry_run = true;
    }
    for w in &config.eviction.warnings {
        warn!(warning = %w, "configuration");
    }
    Ok(config)
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: &Args) -> anyhow::Result<std::process::ExitCode> {
    protect::tune_allocator();
    let AgentConfig {
        eviction: config,
        shutdown: shutdown_config,
    } = agent_config(args)?;
    let oom_score_adj = protect::protect_self(args.oom_score_adj);
    info!(node = %args.node_name, dry_run = config.node_monitor.dry_run, polling_only = args.polling_only,
          thresholds = config.thresholds.len(), ?oom_score_adj, "node-monitor starting");

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    // Metrics and health first, so a stuck start-up is visible.
    let (http_task, live, auth) = node_api::start_http(args, &config, &metrics, &health, &stop_rx);
    flight::persist_flight(&live, &config.node_monitor.state_dir, &metrics);

    let api_timeout = config.node_monitor.api_timeout;
    let kube_config = kube_adapter::load_config(args.kubeconfig.as_deref()).await?;
    let (fast_gasp, fast_gasp_shared) = fast_gasp(args, &shutdown_config, &kube_config, &metrics);
    let clients = kube_adapter::clients(kube_config, api_timeout)?;
    let client = clients.api.clone();
    node_api::set_authorizer(&auth, &client, args);
    let (store, reflector_task) = start_pod_reflector(&clients, &args.node_name, &health, &metrics);
    let liveness_task = start_liveness_lease(args, &config, &client, &stop_rx, &metrics);

    let allocatable = node_allocatable_memory(&client, &args.node_name).await;
    let mut sampler = new_sampler(args, allocatable, config.node_monitor.memory_working_set)?;
    let mut wakeups = start_wakeups(args, &config, &sampler, &metrics, &health, &live)?;
    live.set_psi_path(flight::psi_path(sampler.layout()));
    // Kernel probes: each event wakes the sampler at once. Reboot requests go to the shutdown
    // manager (`reboot_rx`). Polling-only mode runs without them, like the kubelet.
    let (reboot_tx, reboot_rx) = tokio::sync::mpsc::channel::<kernel::RebootSeen>(16);
    // Held for the agent's lifetime: dropping the probes detaches the programs.
    let _probes = start_probes(
        args,
        &config,
        &store,
        &metrics,
        &health,
        &wakeups,
        &live,
        reboot_tx.clone(),
        &client,
        fast_gasp,
        stop_rx.clone(),
    )
    .await;
    release_startup_heap();
    let memory_locked = !args.no_mlock && protect::lock_memory();
    info!(memory_locked, "start-up done");
    // Graceful node shutdown through a logind inhibitor, when the configuration enables it.
    let shutdown_task = shutdown_config.options.enabled.then(|| {
        tokio::spawn(crate::shutdown::run(
            crate::shutdown::ShutdownContext {
                client: client.clone(),
                node_name: args.node_name.clone(),
                metrics: metrics.clone(),
                health: health.clone(),
                settings: shutdown_config,
                reboots: reboot_rx,
                fast: fast_gasp_shared,
            },
            stop_rx.clone(),
        ))
    });

    let actuator = Actuator::new(
        client.clone(),
        ActuatorConfig {
            node_name: args.node_name.clone(),
            pdb_policy: config.node_monitor.pdb_policy,
            dry_run: config.node_monitor.dry_run,
        },
    )
    .with_timeout(api_timeout);
    guarantees::spawn(&actuator, &live, &metrics, &stop_rx);
    let mut agent = decision_loop(args, config, &metrics, actuator, store, &health, live);
    if let Some(control) = _probes.as_ref().and_then(|p| p.mem_push()) {
        agent = agent.with_mem_push(Box::new(control), mem_push_policy());
    }
    info!("deciding");
    // From here on /healthz fails when the loop stops making progress.
    let bound = liveness_bound(&agent.config.node_monitor);
    health.export_progress(
        metrics.loop_last_progress_timestamp_seconds.clone(),
        metrics.loop_liveness_bound_seconds.clone(),
    );
    health.track_progress(bound);
    info!(?bound, ?api_timeout, "liveness follows the decision loop");
    // A first pass at once: it arms the memcg thresholds and catches pressure that predates the agent.
    agent.count_wakeup(WakeSource::Housekeeping.label());
    let first = Wakeup {
        source: WakeSource::Housekeeping,
        at: Instant::now(),
    };
    let mut stop = ports::UnixSignals::new()?;
    decide_until_stopped(&mut agent, &mut sampler, &mut wakeups, first, &mut stop).await;
    let _ = stop_tx.send(true);
    reflector_task.abort();
    liveness_task.abort();
    let flight = flight::flush_on_stop(agent.recorders.live.clone());
    stop_cleanly(&agent.actuator, http_task, shutdown_task, flight).await;
    info!("stopped");
    Ok(std::process::ExitCode::SUCCESS)
}

/// The memory push's batch sizing for this node: its page size and online CPUs.
fn mem_push_policy() -> node_monitor_core::arming::mem_push::PushPolicy {
    use nix::unistd::{SysconfVar, sysconf};
    let read = |v| {
        sysconf(v)
            .ok()
            .flatten()
            .and_then(|n| u64::try_from(n).ok())
            .filter(|n| *n > 0)
    };
    let policy = node_monitor_core::arming::mem_push::PushPolicy::new(
        read(SysconfVar::PAGE_SIZE).unwrap_or(4096),
        read(SysconfVar::_NPROCESSORS_ONLN)
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(1),
    );
    info!(
        cpus = policy.cpus,
        floor_pages = policy.floor_pages,
        "memory push ready: armed near memory thresholds"
    );
    policy
}

/// Renews the agent's liveness Lease in the background (a task that ends at once when
/// `nodeMonitor.livenessLeaseInterval` is `0s`).
fn start_liveness_lease(
    args: &Args,
    config: &config::EvictionConfig,
    client: &kube::Client,
    stop_rx: &tokio::sync::watch::Receiver<bool>,
    metrics: &Metrics,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(crate::cluster::liveness_lease::renew_until_stopped(
        crate::cluster::liveness_lease::LivenessLease::new(
            client.clone(),
            &args.namespace,
            &args.node_name,
        )
        .with_metrics(metrics.liveness_lease.clone()),
        config.node_monitor.liveness_lease_interval,
        stop_rx.clone(),
    ))
}

/// The decision loop over `actuator` and `store`, its metrics initialised, reading the
/// kubelet's configuration file as `nodeMonitor.kubeletConfigPath` says.
fn decision_loop<C: ports::ClusterWrites, P: ports::PodSource>(
    args: &Args,
    config: config::EvictionConfig,
    metrics: &Arc<Metrics>,
    actuator: C,
    store: P,
    health: &Arc<Health>,
    live: Arc<LiveView>,
) -> Loop<C, P> {
    init_metrics(metrics, &config);
    let headroom_policy = headroom_policy(args, &config);
    let kubelet_config_path = config.node_monitor.kubelet_config_path.clone();
    Loop::new(
        config,
        metrics.clone(),
        actuator,
        store,
        health.clone(),
        headroom_policy,
    )
    .with_live(live)
    .with_kubelet_config(&kubelet_config_path, &args.proc_root)
}

/// The decision loop: a cycle for each wake-up, grace-period timer or adaptive-sampling timer,
/// until `stop` (SIGTERM or SIGINT, also mid-cycle) or the end of the wake-up sources.
async fn decide_until_stopped<C, P, N, W, S>(
    agent: &mut Loop<C, P>,
    sampler: &mut N,
    wakeups: &mut W,
    first: Wakeup,
    stop: &mut S,
) where
    C: ports::ClusterWrites,
    P: ports::PodSource,
    N: ports::NodeView,
    W: ports::Arming + ports::WakeupStream,
    S: ports::StopSignal,
{
    let mut stopping = agent
        .cycles(
            sampler,
            wakeups,
            first,
            WakeSource::Housekeeping.label(),
            stop,
        )
        .await;
    while !stopping {
        // Between wake-ups: the pod figures' refresh the last pass asked for, if any.
        agent.refresh_pods_beside(sampler, wakeups);
        let now = agent.now();
        // Never in the past: a due timer wakes the loop after MIN_TIMER_INTERVAL, not at once.
        let grace = next_timer(
            [
                next_grace_deadline(&agent.state, &agent.config, now),
                agent.backoff.next_expiry(now),
                agent.evictions_held_until.filter(|t| *t > now),
            ],
            now,
            MIN_TIMER_INTERVAL,
        )
        .map(|t| agent.instant_of(t));
        let next_sample = agent.next_sample_at.map(|t| agent.instant_of(t));
        let (wakeup, label) = tokio::select! {
            w = wakeups.next() => match w {
                Some(w) => (w, w.source.label()),
                None => { error!("wake-up sources ended"); break; }
            },
            () = sleep_until_opt(grace) => {
                (Wakeup { source: WakeSource::Housekeeping, at: Instant::now() }, "timer")
            },
            () = sleep_until_opt(next_sample) => {
                (Wakeup { source: WakeSource::Housekeeping, at: Instant::now() }, "headroom")
            },
            signal = stop.stopped() => { info!(signal, "stopping"); break; }
        };
        agent.health.progress();
        agent.count_wakeup(label);
        stopping = agent.cycles(sampler, wakeups, wakeup, label, stop).await;
    }
}

/// The clean stop: the metrics endpoint drains while the shutdown manager stops and the agent's
/// marks are taken back from the node (a node shutdown's marks stay), each within its bound.
async fn stop_cleanly(
    actuator: &Actuator,
    http_task: tokio::task::JoinHandle<()>,
    shutdown_task: Option<tokio::task::JoinHandle<crate::shutdown::Stopped>>,
    flight: tokio::task::JoinHandle<()>,
) {
    // The endpoint drains its connections within its own bound; this one only guards the exit.
    let drain = async {
        if tokio::time::timeout(HTTP_DRAIN_BOUND, http_task)
            .await
            .is_err()
        {
            warn!("the metrics endpoint did not stop in time; exiting anyway");
        }
    };
    let release = async {
        // The shutdown manager first: it says whether a node shutdown is under way.
        let shutting_down = match shutdown_task {
            None => false,
            Some(task) => match tokio::time::timeout(SHUTDOWN_STOP_BOUND, task).await {
                Ok(Ok(stopped)) => stopped.shutting_down,
                Ok(Err(e)) => {
                    warn!(error = %e, "the shutdown manager ended abnormally");
                    false
                }
                Err(_) => {
                    warn!(bound = ?SHUTDOWN_STOP_BOUND, "the shutdown manager did not stop in time");
                    false
                }
            },
        };
        release_on_stop(actuator, shutting_down, STOP_RELEASE_BOUND).await;
    };
    // The flight records' flush is bounded by its own, shorter bound.
    let flush = async {
        let _ = flight.await;
    };
    tokio::join!(drain, release, flush);
}

/// How long the exit waits for the metrics endpoint to stop.
const HTTP_DRAIN_BOUND: Duration = Duration::from_secs(5);
/// How long the exit waits for the shutdown manager (its inhibitor, its logind drop-in).
const SHUTDOWN_STOP_BOUND: Duration = Duration::from_secs(5);
/// How long the exit spends taking the agent's marks back from the node. With the bounds above,
/// a stop ends within 10 s, well inside the DaemonSet's 30 s termination grace period.
pub const STOP_RELEASE_BOUND: Duration = Duration::from_secs(5);

/// On a clean stop: the agent's pressure taints go and its conditions turn `Unknown` (reason
/// `NodeMonitorStopped`), as [`node_monitor_core::release::release_plan`] decides; the marks of a node
/// shutdown under way stay. Bounded by `bound`: a stop never waits on an unreachable API server
/// longer than that (the marks then stay until the next start, or `node-monitor cleanup`).
/// Returns whether the release reached the API.
pub async fn release_on_stop<C: ports::ClusterWrites>(
    actuator: &C,
    shutting_down: bool,
    bound: Duration,
) -> bool {
    let release = node_monitor_core::release::Release::Stop { shutting_down };
    match tokio::time::timeout(bound, actuator.release(release)).await {
        Ok(Ok(written)) => {
            if written.is_empty() {
                debug!("nothing of node-monitor's to take back from the node");
            }
            for line in written.describe() {
                info!("stop: {line}");
            }
            true
        }
        Ok(Err(e)) => {
            warn!(error = %crate::telemetry::error_chain(&e), "could not take the agent's marks back from the node; they stay until the next start or `node-monitor cleanup`");
            false
        }
        Err(_) => {
            warn!(
                ?bound,
                "taking the agent's marks back from the node did not finish in time; they stay until the next start or `node-monitor cleanup`"
            );
            false
        }
    }
}

/// The longest the decision loop may go without progress before `/healthz` fails. The loop
/// records progress on every wake-up (at least every housekeeping interval), every decision,
/// every API answer and every cleanup poll; between two of them lie at most a housekeeping
/// interval and two API calls, each bounded by `apiTimeout`. Twice that, and at least a minute.
pub fn liveness_bound(s: &config::NodeMonitorSettings) -> Duration {
    (2 * s.housekeeping_interval + 4 * s.api_timeout).max(Duration::from_secs(60))
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The policy an eviction applies when a PDB blocks it.
pub fn pdb_policy_label(p: PdbPolicy) -> &'static str {
    match p {
        PdbPolicy::Respect => "respect",
        PdbPolicy::Escalate => "escalate",
    }
}

/// Gives the heap that start-up used and freed (the kernel's BTF, parsed to load and relocate the
/// probes, is the largest part) back to the kernel. glibc keeps freed memory in its arenas, and
/// under `mlockall` every such page stays resident and charged to the container.
fn release_startup_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory at the top of glibc's arenas to the kernel;
    // no live allocation is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}
