//! `node-monitor run`: the agent. Wake-ups → sampler → pure core → actuator, in the kubelet
//! eviction manager's order (observe → thresholds → conditions → reclaim → rank → evict → wait for
//! cleanup), but driven by kernel notifications instead of a 10 s poll.
//!
//! The loop keeps sampling and deciding when the API server is unreachable: API calls fail, are
//! counted and retried on later cycles, and the pod reflector catches up on reconnect. Nothing the
//! API answers can end the loop; only SIGTERM/SIGINT do.
pub mod backoff;
pub mod kernel;
pub mod memcg;
pub mod protect;
pub mod sources;

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, runtime::reflector::Store};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{debug, error, info, warn};

use crate::{
    cluster::{
        self as kube_adapter,
        actuator::{Actuator, ActuatorConfig, EvictOutcome, EvictionRequest, NodeConditionUpdate},
    },
    http::{self, Health},
    metrics::{ConditionLabels, EvictionLabels, Metrics, SignalLabels, ThresholdLabels},
    sampler::{SampleKind, Sampler, SamplerConfig},
    wakeup::{SourceKind, SourceSetting, SourceState, WakeSource, Wakeup, WakeupConfig, Wakeups},
};

use crate::cli::flags::EvictionFlags;
use node_monitor_core::{
    agent_config::{AgentConfig, load_agent_config},
    clock::Timestamp,
    config::{self, ConfigSource, EvictionConfig, PdbPolicy},
    eviction::{
        DRY_RUN_REPORT_INTERVAL, Decision, EvictionState, MIN_TIMER_INTERVAL, ReportLimiter,
        next_grace_deadline, next_timer, synchronize,
    },
    headroom::{Headroom, HeadroomPolicy},
    pod::{POD_CGROUP_SETTLE, PodInfo, PodPresence, blind_to_pods},
    threshold::NodeConditionType,
};

use self::backoff::Backoff;

use node_monitor_core::names::{pressure_condition, pressure_taint};
/// Agent-owned conditions are re-published at least this often, as a heartbeat.
const CONDITION_HEARTBEAT: Duration = Duration::from_secs(60);

/// `node-monitor run`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Configuration file: KubeletConfiguration eviction fields plus `nodeMonitor:` settings.
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub eviction: EvictionFlags,
    /// Kubeconfig; default: in-cluster config, then $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (the DaemonSet passes spec.nodeName through the downward API).
    #[arg(long, env = "NODE_NAME", value_parser = node_monitor_core::node_name::parse_node_name)]
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
    #[arg(long, default_value_t = protect::DEFAULT_OOM_SCORE_ADJ, allow_hyphen_values = true)]
    pub oom_score_adj: i32,
    /// Do not lock the agent's memory.
    #[arg(long)]
    pub no_mlock: bool,
}

/// Reads `--config` once and loads the eviction and the graceful shutdown configuration from it,
/// with the eviction flags over the file.
pub fn load_config(
    path: Option<&std::path::Path>,
    flags: &EvictionFlags,
) -> anyhow::Result<AgentConfig> {
    let text = match path {
        Some(p) => Some(crate::cli::io::read_file_bounded(
            p,
            "--config",
            crate::cli::io::MAX_INPUT_BYTES,
        )?),
        None => None,
    };
    let name = path.map(|p| p.display().to_string()).unwrap_or_default();
    let source = text.as_deref().map(|t| ConfigSource {
        name: &name,
        text: t,
    });
    Ok(load_agent_config(source, &flags.overrides())?)
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: &Args) -> anyhow::Result<std::process::ExitCode> {
    let AgentConfig {
        eviction: mut config,
        shutdown: shutdown_config,
    } = load_config(args.config.as_deref(), &args.eviction)?;
    if args.dry_run {
        config.node_monitor.dry_run = true;
    }
    for w in &config.warnings {
        warn!(warning = %w, "configuration");
    }
    let protection = protect::protect_self(args.oom_score_adj, !args.no_mlock);
    info!(node = %args.node_name, dry_run = config.node_monitor.dry_run, polling_only = args.polling_only,
          thresholds = config.thresholds.len(), ?protection, "node-monitor starting");

    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);

    // Metrics and health first, so a stuck start-up is visible.
    let http_task = http::spawn(
        args.metrics_addr,
        metrics.clone(),
        health.clone(),
        stop_rx.clone(),
    );

    let api_timeout = config.node_monitor.api_timeout;
    let clients = kube_adapter::clients(
        kube_adapter::load_config(args.kubeconfig.as_deref()).await?,
        api_timeout,
    )?;
    let client = clients.api.clone();
    let (store, reflector) = kube_adapter::pod_reflector(clients.watch.clone(), &args.node_name);
    let reflector_task = tokio::spawn(reflector);
    {
        let (store, health) = (store.clone(), health.clone());
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                info!("pod cache synced");
                health.pods_synced.store(true, Ordering::Relaxed);
            }
        });
    }

    let allocatable = node_allocatable_memory(&client, &args.node_name).await;
    let sampler_config = SamplerConfig {
        cgroup_root: args.cgroup_root.clone(),
        node_cgroup: args.node_cgroup.clone(),
        kubepods_cgroup: args.kubepods_cgroup.clone(),
        kubelet_config: args.kubelet_config.clone(),
        proc_root: args.proc_root.clone(),
        kubelet_root: args.kubelet_root.clone(),
        image_fs: args.image_fs.clone(),
        allocatable_memory: allocatable,
        ..SamplerConfig::default()
    };
    match crate::sampler::raise_nofile_limit() {
        Ok(n) => debug!(
            nofile = n,
            "open-file limit raised for per-pod cgroup files"
        ),
        Err(e) => {
            warn!(error = %e, "could not raise the open-file limit; pod files are reopened per pass")
        }
    }
    let mut sampler = Sampler::new(sampler_config).context("sampler configuration")?;
    let mut wake_config = WakeupConfig::for_layout(sampler.layout());
    wake_config.housekeeping = config.node_monitor.housekeeping_interval;
    wake_config.psi_trigger.window = config.node_monitor.psi_window;
    wake_config.psi_trigger.stall = config.node_monitor.psi_threshold;
    if args.polling_only {
        wake_config.memcg_node = SourceSetting::Disabled;
        wake_config.memcg_kubepods = SourceSetting::Disabled;
        wake_config.oom_control = false;
        wake_config.memory_events = SourceSetting::Disabled;
        wake_config.psi = SourceSetting::Disabled;
    }
    // Sources this host cannot have (memory.events on cgroup v1, thresholds and oom_control on
    // v2) are not a degradation; sources that should work and do not are.
    let not_applicable = sources::not_applicable(&wake_config);
    let mut wakeups = Wakeups::start(wake_config).context("wake-up sources")?;
    for s in wakeups.source_states() {
        // Reported below, once the probes that feed it are loaded.
        if s.source == SourceKind::Kernel {
            continue;
        }
        let (state, degraded) = sources::report(s.source, &s.state, &not_applicable);
        if let SourceState::Unavailable { reason } = &s.state
            && degraded
        {
            warn!(source = s.source.as_str(), %reason, "wake-up source unavailable");
        }
        metrics.set_source_state(s.source.as_str(), state);
        if degraded {
            health.report_degraded(format!("wake-up source {} unavailable", s.source.as_str()));
        }
    }
    // Kernel probes: each event wakes the sampler at once. Reboot requests go to the shutdown
    // manager (`reboot_rx`). Polling-only mode runs without them, like the kubelet.
    let (reboot_tx, reboot_rx) = tokio::sync::mpsc::channel::<kernel::RebootSeen>(16);
    let probes = if args.no_ebpf || args.polling_only {
        info!("eBPF programs not loaded (--no-ebpf or --polling-only)");
        None
    } else {
        let probe_config = crate::ebpf::ProbeConfig {
            stall_budget: config.node_monitor.reclaim_stall_budget,
            ..crate::ebpf::ProbeConfig::default()
        };
        kernel::start(
            probe_config,
            store.clone(),
            metrics.clone(),
            health.clone(),
            wakeups.kernel_sender(),
            reboot_tx.clone(),
            stop_rx.clone(),
        )
        .await
        .map(Arc::new)
    };
    metrics.set_source_state(
        SourceKind::Kernel.as_str(),
        sources::kernel_state(
            !(args.no_ebpf || args.polling_only),
            probes.as_ref().map(|p| p.attached()),
        ),
    );
    if let Some(p) = &probes {
        tokio::spawn(kernel::mirror_counters(
            p.clone(),
            metrics.clone(),
            stop_rx.clone(),
        ));
    }
    health.probes_loaded.store(true, Ordering::Relaxed);
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
    init_metrics(&metrics, &config);

    // Adaptive sampling near a threshold; off in polling mode, which is the kubelet's fixed tick.
    let headroom_policy = (!args.polling_only
        && !config.node_monitor.fast_sampling_interval.is_zero())
    .then_some(HeadroomPolicy {
        fast: config.node_monitor.fast_sampling_interval,
        slow: config.node_monitor.housekeeping_interval,
    });
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut agent = Loop {
        start: Instant::now(),
        config,
        state: EvictionState::new(),
        metrics: metrics.clone(),
        actuator,
        store,
        backoff: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        published: PublishedConditions::default(),
        retry_at: None,
        evictions_held_until: None,
        retry_delay: RETRY_INITIAL,
        dry_run_reports: ReportLimiter::new(DRY_RUN_REPORT_INTERVAL),
        headroom: Headroom::new(),
        headroom_policy,
        next_sample_at: None,
        health: health.clone(),
        blind: None,
        sight_checked: None,
        kubepods_reported: None,
    };
    info!("deciding");
    // From here on /healthz fails when the loop stops making progress.
    let bound = liveness_bound(&agent.config.node_monitor);
    health.track_progress(bound);
    info!(?bound, ?api_timeout, "liveness follows the decision loop");
    // A first pass at once: it arms the memcg thresholds and catches pressure that predates the agent.
    agent.count_wakeup(WakeSource::Housekeeping.label());
    let first = Wakeup {
        source: WakeSource::Housekeeping,
        at: Instant::now(),
    };
    let mut stopping = agent
        .cycles(
            &mut sampler,
            &mut wakeups,
            first,
            WakeSource::Housekeeping.label(),
            &mut sigterm,
            &mut sigint,
        )
        .await;
    while !stopping {
        let now = agent.now();
        // Never in the past: a due timer wakes the loop after MIN_TIMER_INTERVAL, not at once.
        let grace = next_timer(
            [
                next_grace_deadline(&agent.state, &agent.config, now),
                agent.backoff.next_expiry(now),
                agent.retry_at.filter(|t| *t > now),
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
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
        };
        agent.health.progress();
        agent.count_wakeup(label);
        stopping = agent
            .cycles(
                &mut sampler,
                &mut wakeups,
                wakeup,
                label,
                &mut sigterm,
                &mut sigint,
            )
            .await;
    }
    let _ = stop_tx.send(true);
    reflector_task.abort();
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
        release_on_stop(&agent.actuator, shutting_down, STOP_RELEASE_BOUND).await;
    };
    tokio::join!(drain, release);
    info!("stopped");
    Ok(std::process::ExitCode::SUCCESS)
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
pub async fn release_on_stop(actuator: &Actuator, shutting_down: bool, bound: Duration) -> bool {
    let release = node_monitor_core::release::Release::Stop { shutting_down };
    match tokio::time::timeout(bound, actuator.release(release, false)).await {
        Ok(Ok(written)) => {
            if written.is_empty() {
                debug!("nothing of node-monitor's to take back from the node");
            }
            for line in written.describe() {
                info!(node = %actuator.config().node_name, "stop: {line}");
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

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// `status.allocatable.memory` of this node, when the API answers; `None` otherwise (the sampler
/// then uses the kubepods cgroup's limit, as the kubelet's own stats do).
async fn node_allocatable_memory(client: &kube::Client, node: &str) -> Option<u64> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = match tokio::time::timeout(Duration::from_secs(5), nodes.get(node)).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            warn!(error = %e, node, "could not read the node's allocatable memory");
            return None;
        }
        Err(_) => {
            warn!(
                node,
                "API server did not answer within 5 s; allocatable memory from cgroups"
            );
            return None;
        }
    };
    let q = n.status?.allocatable?.get("memory")?.0.clone();
    match node_monitor_core::quantity::Quantity::parse(&q) {
        Ok(q) => u64::try_from(q.value()).ok(),
        Err(e) => {
            warn!(value = %q, error = %e, "node status.allocatable.memory is not a quantity");
            None
        }
    }
}

/// Zero-initialises the series the dashboard and alerts read, so they exist before anything happens.
fn init_metrics(m: &Metrics, config: &EvictionConfig) {
    for t in &config.thresholds {
        for outcome in ["evicted", "pdb_blocked", "escalated", "dry_run"] {
            let _ = m.evictions.get_or_create(&EvictionLabels {
                eviction_signal: t.signal.as_str().to_owned(),
                threshold: if t.is_hard() { "hard" } else { "soft" }.to_owned(),
                outcome: outcome.to_owned(),
            });
        }
    }
    for reason in backoff::failure_labels() {
        let _ = m
            .eviction_failures
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: reason.to_owned(),
            });
    }
    for operation in ["evict", "patch_conditions", "patch_taint"] {
        let _ = m
            .api_errors
            .get_or_create(&crate::metrics::OperationLabels {
                operation: operation.to_owned(),
            });
    }
    // 0 until a graceful shutdown happens, like the kubelet's graceful_shutdown_*_time_seconds.
    let total = crate::metrics::PhaseLabels {
        phase: "total".to_owned(),
    };
    m.shutdown_phase_start_time_seconds
        .get_or_create(&total)
        .set(0.0);
    m.shutdown_phase_end_time_seconds
        .get_or_create(&total)
        .set(0.0);
    for c in NodeConditionType::ALL {
        m.node_condition
            .get_or_create(&ConditionLabels {
                condition: c.as_str().to_owned(),
            })
            .set(0);
    }
}

/// How a cycle ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CycleEnd {
    Done,
    /// An eviction did not take effect and its pod backs off (a PDB or another refusal, a
    /// failure, a stale "gone"): the next candidate should be considered now.
    Refused,
}

#[derive(Debug, Default)]
struct PublishedConditions {
    values: BTreeMap<NodeConditionType, bool>,
    at: Option<Instant>,
}

struct Loop {
    start: Instant,
    config: EvictionConfig,
    state: EvictionState,
    metrics: Arc<Metrics>,
    actuator: Actuator,
    store: Store<Pod>,
    backoff: Backoff,
    published: PublishedConditions,
    /// After a failed API call under pressure: decide again then, not at the next tick.
    retry_at: Option<Timestamp>,
    /// The API server throttled an eviction: no eviction request before this (its Retry-After).
    evictions_held_until: Option<Timestamp>,
    /// A dry run decides the same pods on every wake-up: report each once per interval.
    dry_run_reports: ReportLimiter,
    retry_delay: Duration,
    /// Adaptive sampling: the headroom seen per threshold, and when to look again.
    headroom: Headroom,
    headroom_policy: Option<HeadroomPolicy>,
    next_sample_at: Option<Timestamp>,
    health: Arc<Health>,
    /// Whether the last look found the agent blind to the pods' cgroups, and when it looked.
    blind: Option<usize>,
    sight_checked: Option<Instant>,
    kubepods_reported: Option<(String, String)>,
}

/// How often the agent checks that it sees the cgroups of the pods the API lists.
const SIGHT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Retry delays after failed eviction requests (API server unreachable, 5xx): 250 ms doubling to 5 s.
const RETRY_INITIAL: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(5);

impl Loop {
    fn now(&self) -> Timestamp {
        Timestamp::from_duration(self.start.elapsed())
    }

    fn instant_of(&self, t: Timestamp) -> Instant {
        self.start + t.since_origin()
    }

    /// One wake-up received, by source (`timer` and `headroom` for the agent's own timers).
    fn count_wakeup(&self, label: &str) {
        self.metrics
            .wakeups
            .get_or_create(&crate::metrics::SourceLabels {
                source: label.to_owned(),
            })
            .inc();
    }

    /// Cycles for one wake-up: a refusal or failure makes the next candidate eligible at once, so
    /// the loop decides again without waiting for the next wake-up (bounded: each refusal puts
    /// one more pod into backoff). SIGTERM and SIGINT end it mid-cycle; returns whether one did.
    async fn cycles(
        &mut self,
        sampler: &mut Sampler,
        wakeups: &mut Wakeups,
        mut wakeup: Wakeup,
        label: &'static str,
        sigterm: &mut tokio::signal::unix::Signal,
        sigint: &mut tokio::signal::unix::Signal,
    ) -> bool {
        loop {
            let end = tokio::select! {
                end = self.cycle(sampler, wakeups, wakeup, label) => Some(end),
                _ = sigterm.recv() => { info!("SIGTERM during a decision: stopping"); None }
                _ = sigint.recv() => { info!("SIGINT during a decision: stopping"); None }
            };
            let Some(end) = end else {
                return true;
            };
            self.health.progress();
            if end != CycleEnd::Refused {
                return false;
            }
            wakeup = Wakeup {
                source: wakeup.source,
                at: Instant::now(),
            };
        }
    }

    /// One pass: observe, decide, act, wait for cleanup.
    async fn cycle(
        &mut self,
        sampler: &mut Sampler,
        wakeups: &mut Wakeups,
        wakeup: Wakeup,
        // What woke the agent, as in `node_monitor_wakeups_total` (`headroom`, `timer`, …).
        label: &'static str,
    ) -> CycleEnd {
        let mut end = CycleEnd::Done;
        // A wake-up that arrived while the previous cycle was still running (acting, waiting for
        // an evicted pod to go) has queued since; reported apart from this cycle's own work.
        let started = Instant::now();
        // Signals first (tens of µs whatever the pod count); per-pod usage only when a threshold
        // is met or a condition still holds, since ranking is the only thing that needs it.
        let mut timed =
            tokio::task::block_in_place(|| sampler.observe_as(wakeup, SampleKind::Signals));
        let pressure = !self.state.conditions().is_empty()
            || self.config.thresholds.iter().any(|t| {
                timed
                    .observations
                    .signals
                    .get(&t.signal)
                    .is_some_and(|o| t.is_met(o, true))
            });
        if pressure {
            tokio::task::block_in_place(|| {
                sampler.sample_into(SampleKind::Fast, &mut timed.observations)
            });
        }
        self.rearm(sampler, wakeups);

        let now = self.now();
        if let Some(policy) = self.headroom_policy {
            self.next_sample_at = self
                .headroom
                .observe(now, &timed.observations, &self.config.thresholds, policy)
                .map(|d| now + d);
        }
        self.backoff.prune(now);
        self.check_pod_sight(sampler);
        let pods = self.candidate_pods(now);
        let mut decision = synchronize(
            &mut self.state,
            &self.config,
            &timed.observations,
            &pods,
            now,
        );
        // Pod disk usage comes from a meter that walks the pods' directories off the critical
        // path, so its figures can predate the pressure (a pod that filled the disk since the
        // last walk ranks as small). Before a disk-ranked eviction, measure now and decide again
        // on the figures of this instant, as a ranking by stale usage could pick a bystander.
        if decision
            .evict
            .iter()
            .any(|e| node_monitor_core::threshold::ranks_by_disk(e.signal))
        {
            tokio::task::block_in_place(|| {
                sampler.measure_pod_disk_now();
                sampler.sample_into(SampleKind::Fast, &mut timed.observations);
            });
            decision = synchronize(
                &mut self.state,
                &self.config,
                &timed.observations,
                &pods,
                now,
            );
        }
        if self.blind.is_some() && !decision.evict.is_empty() {
            warn!(
                held = decision.evict.len(),
                "eviction held: the agent sees none of the pods' cgroups, so ranking has no usage"
            );
            decision.evict.clear();
        }
        let decided = wakeup.at.elapsed();
        self.metrics
            .wakeup_to_decision_seconds
            .observe(decided.as_secs_f64());
        debug!(
            source = label,
            decided_us = decided.as_micros() as u64,
            queued_us = started.saturating_duration_since(wakeup.at).as_micros() as u64,
            processing_us = started.elapsed().as_micros() as u64,
            sampling_us = timed.sampling.as_micros() as u64,
            "decision"
        );
        self.record_observations(&timed.observations, &decision);

        // Eviction requests first: the node conditions, the Events and the wait for cleanup
        // follow, so no API round trip of theirs delays an eviction (the kubelet too updates the
        // node status apart from its eviction loop).
        if let Some(until) = self.evictions_held_until.filter(|t| *t > now)
            && !decision.evict.is_empty()
        {
            debug!(held = decision.evict.len(), resume_in = ?until.saturating_since(now),
                   "evictions held: the API server throttled the last one");
            decision.evict.clear();
        }
        let mut answered = Vec::with_capacity(decision.evict.len());
        for e in &decision.evict {
            let req = EvictionRequest {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
                uid: e.uid.clone(),
                grace_period_seconds: u32::try_from(e.grace_period_seconds.max(1))
                    .unwrap_or(u32::MAX),
                hard: e.hard,
                signal: e.signal.as_str().to_owned(),
                message: e.message.clone(),
                annotations: e.annotations.clone(),
            };
            // A dry run repeats the same decision on every wake-up: its log line, Event and
            // count are reported once per pod and signal per DRY_RUN_REPORT_INTERVAL.
            let report = !self.config.node_monitor.dry_run
                || self.dry_run_reports.allow(&e.uid, e.signal, now);
            if report {
                info!(pod = %format!("{}/{}", e.namespace, e.name), signal = %e.signal, hard = e.hard,
                      grace = e.grace_period_seconds, wake_source = label,
                      message = %e.message, dry_run = self.config.node_monitor.dry_run, "evicting");
            }
            let outcome = self.actuator.evict(&req).await;
            self.health.progress();
            let reaction_time = wakeup.at.elapsed();
            if !report {
                continue;
            }
            self.metrics
                .evictions
                .get_or_create(&EvictionLabels {
                    eviction_signal: req.signal.clone(),
                    threshold: if req.hard { "hard" } else { "soft" }.to_owned(),
                    outcome: outcome.label().to_owned(),
                })
                .inc();
            info!(pod = %format!("{}/{}", e.namespace, e.name), outcome = outcome.label(),
                  reaction_ms = reaction_time.as_secs_f64() * 1e3, "eviction answered");
            let reaction = backoff::react(&outcome);
            if let Some(reason) = reaction.failure {
                self.metrics
                    .eviction_failures
                    .get_or_create(&crate::metrics::ReasonLabels {
                        reason: reason.to_owned(),
                    })
                    .inc();
            }
            if let EvictOutcome::Failed { .. } = &outcome {
                self.metrics
                    .api_errors
                    .get_or_create(&crate::metrics::OperationLabels {
                        operation: "evict".into(),
                    })
                    .inc();
            }
            if reaction.back_off_pod {
                let delay = self.backoff.refused(&req.uid, self.now());
                debug!(uid = %req.uid, outcome = outcome.label(), ?delay,
                       "pod backs off; the next candidate is considered meanwhile");
            }
            if reaction.next_candidate_now {
                end = CycleEnd::Refused;
            }
            if reaction.retry_later {
                self.retry_at = Some(self.now() + self.retry_delay);
                self.retry_delay = (self.retry_delay * 2).min(RETRY_MAX);
                debug!(delay = ?self.retry_delay, "API server unavailable; deciding again later");
            }
            if let Some(hold) = reaction.hold_evictions {
                self.evictions_held_until = Some(self.now() + hold);
            }
            if reaction.took_effect {
                self.retry_at = None;
                self.retry_delay = RETRY_INITIAL;
                self.metrics
                    .detection_to_eviction_seconds
                    .observe(reaction_time.as_secs_f64());
                self.backoff.forget(&req.uid);
            }
            let stop = reaction.retry_later || reaction.hold_evictions.is_some();
            answered.push((req, outcome));
            if stop {
                // The rest of this decision would fail the same way.
                break;
            }
        }
        self.publish_conditions(&decision).await;
        self.health.progress();
        for (req, outcome) in &answered {
            self.actuator.record_eviction_events(req, outcome).await;
            self.health.progress();
        }
        for (req, outcome) in &answered {
            if outcome.took_effect() {
                self.wait_for_cleanup(sampler, req).await;
            }
        }
        end
    }

    /// Checks, at most every [`SIGHT_CHECK_INTERVAL`], that the sampler finds the cgroups of the
    /// pods the API lists as running here; while it finds none, the agent is not ready and holds
    /// its evictions ([`blind_to_pods`]).
    fn check_pod_sight(&mut self, sampler: &mut Sampler) {
        if self
            .sight_checked
            .is_some_and(|t| t.elapsed() < SIGHT_CHECK_INTERVAL)
        {
            return;
        }
        self.sight_checked = Some(Instant::now());
        if let Err(e) = tokio::task::block_in_place(|| sampler.refresh_pod_cgroups()) {
            debug!(error = %e, "listing the pod cgroups failed");
        }
        let layout = sampler.layout();
        let reported = (
            layout
                .kubepods_detection
                .driver_label(&layout.kubepods_name)
                .to_owned(),
            layout.kubepods_memory.display().to_string(),
        );
        if self.kubepods_reported.as_ref() != Some(&reported) {
            info!(driver = %reported.0, kubepods = %reported.1, detection = ?layout.kubepods_detection,
                  "reading pods from this kubepods cgroup");
            self.metrics.kubepods_layout.clear();
            self.metrics
                .kubepods_layout
                .get_or_create(&crate::metrics::KubepodsLabels {
                    driver: reported.0.clone(),
                    path: reported.1.clone(),
                })
                .set(1);
            self.kubepods_reported = Some(reported);
        }
        let wall_now = k8s_openapi::jiff::Timestamp::now();
        let presence: Vec<PodPresence> = self
            .store
            .state()
            .iter()
            .filter(|p| node_monitor_core::pod::pod_is_active(p))
            .map(|p| PodPresence {
                running_for: running_for(p, wall_now),
                cgroup_found: p
                    .metadata
                    .uid
                    .as_deref()
                    .is_some_and(|uid| sampler.has_pod_cgroup(uid)),
            })
            .collect();
        let blind = blind_to_pods(&presence, POD_CGROUP_SETTLE);
        match (self.blind, blind) {
            (None, Some(n)) => {
                let reason = format!(
                    "no cgroup found for any of the {n} pods running on this node (kubepods: {});                      check --kubepods-cgroup, the cgroup driver and the /sys/fs/cgroup mount",
                    sampler.layout().kubepods_memory.display()
                );
                warn!(%reason, "blind to the pods: evictions held");
                self.health.set_blind(Some(reason));
                self.metrics.pod_cgroups_missing.set(1);
            }
            (Some(_), None) => {
                info!("the pods' cgroups are found again: evictions resume");
                self.health.set_blind(None);
                self.metrics.pod_cgroups_missing.set(0);
            }
            _ => {}
        }
        self.blind = blind;
    }

    /// Pods the core may rank: this node's active pods, less those backing off after a refused or
    /// failed eviction.
    fn candidate_pods(&self, now: Timestamp) -> Vec<PodInfo> {
        let mut out = Vec::new();
        for pod in self.store.state() {
            if !node_monitor_core::pod::pod_is_active(&pod) {
                continue;
            }
            match PodInfo::from_pod(&pod) {
                Ok(info) if !self.backoff.active(&info.uid, now) => out.push(info),
                Ok(_) => {}
                Err(e) => warn!(error = %e, "pod skipped: cannot derive its eviction facts"),
            }
        }
        out
    }

    /// Re-arms the memcg thresholds for `memory.available` (node cgroup) and
    /// `allocatableMemory.available` (kubepods) at the fresh inactive_file, as the kubelet does
    /// on each synchronize.
    fn rearm(&self, sampler: &Sampler, wakeups: &mut Wakeups) {
        memcg::rearm(
            wakeups,
            &self.config.thresholds,
            sampler.last_node_memory(),
            sampler.last_kubepods_memory(),
        );
    }

    fn record_observations(
        &self,
        obs: &node_monitor_core::signals::Observations,
        decision: &Decision,
    ) {
        for (signal, o) in &obs.signals {
            let l = SignalLabels {
                eviction_signal: signal.as_str().to_owned(),
            };
            self.metrics
                .signal_available
                .get_or_create(&l)
                .set(o.available);
            self.metrics
                .signal_capacity
                .get_or_create(&l)
                .set(o.capacity);
        }
        for t in &self.config.thresholds {
            let Some(o) = obs.signals.get(&t.signal) else {
                continue;
            };
            let l = ThresholdLabels {
                eviction_signal: t.signal.as_str().to_owned(),
                kind: if t.is_hard() { "hard" } else { "soft" }.to_owned(),
            };
            self.metrics
                .eviction_threshold
                .get_or_create(&l)
                .set(t.quantity(o.capacity).value());
            let met = decision
                .thresholds_met
                .iter()
                .any(|m| m.signal == t.signal && m.hard == t.is_hard());
            self.metrics
                .threshold_met
                .get_or_create(&l)
                .set(i64::from(met));
        }
        for c in &decision.conditions {
            self.metrics
                .node_condition
                .get_or_create(&ConditionLabels {
                    condition: c.condition.as_str().to_owned(),
                })
                .set(i64::from(c.status));
        }
    }

    /// Publishes agent-owned conditions when they change (and as a heartbeat), and the optional
    /// NoSchedule taint. Failures are counted and retried on the next cycle.
    async fn publish_conditions(&mut self, decision: &Decision) {
        let values: BTreeMap<NodeConditionType, bool> = decision
            .conditions
            .iter()
            .map(|c| (c.condition, c.status))
            .collect();
        let stale = self
            .published
            .at
            .is_none_or(|at| at.elapsed() > CONDITION_HEARTBEAT);
        if values == self.published.values && !stale {
            return;
        }
        let reasons: HashMap<NodeConditionType, String> = decision
            .thresholds_met
            .iter()
            .map(|m| {
                (
                    node_monitor_core::threshold::signal_condition(m.signal),
                    format!(
                        "{} available {} below threshold {}",
                        m.signal, m.available, m.quantity
                    ),
                )
            })
            .collect();
        let updates: Vec<NodeConditionUpdate> = NodeConditionType::ALL
            .iter()
            .map(|c| {
                let status = values.get(c).copied().unwrap_or(false);
                NodeConditionUpdate {
                    type_: pressure_condition(*c).to_owned(),
                    status,
                    reason: if status {
                        format!("NodeMonitorHas{}", c.as_str())
                    } else {
                        format!("NodeMonitorNo{}", c.as_str())
                    },
                    message: if status {
                        reasons
                            .get(c)
                            .cloned()
                            .unwrap_or_else(|| format!("node-monitor observes {}", c.as_str()))
                    } else {
                        format!("node-monitor observes no {}", c.as_str())
                    },
                }
            })
            .collect();
        let published = self.actuator.set_conditions(&updates).await;
        self.health.progress();
        match published {
            Ok(()) => {
                self.published = PublishedConditions {
                    values: values.clone(),
                    at: Some(Instant::now()),
                };
            }
            Err(e) => {
                warn!(error = %e, "could not publish node conditions; retrying next cycle");
                self.metrics
                    .api_errors
                    .get_or_create(&crate::metrics::OperationLabels {
                        operation: "patch_conditions".into(),
                    })
                    .inc();
                return;
            }
        }
        if self.config.node_monitor.taint_on_pressure && !self.config.node_monitor.dry_run {
            for c in NodeConditionType::ALL {
                let key = pressure_taint(c);
                let on = values.get(&c).copied().unwrap_or(false);
                let tainted = self.actuator.set_taint(key, "", "NoSchedule", on).await;
                self.health.progress();
                if let Err(e) = tainted {
                    warn!(error = %e, %key, "could not update taint");
                    self.metrics
                        .api_errors
                        .get_or_create(&crate::metrics::OperationLabels {
                            operation: "patch_taint".into(),
                        })
                        .inc();
                }
            }
        }
    }

    /// Waits, as the kubelet does, until the evicted pod's processes have left the node (its
    /// cgroup is gone) or the API no longer has it, bounded by the pod cleanup timeout.
    async fn wait_for_cleanup(&self, sampler: &mut Sampler, req: &EvictionRequest) {
        let deadline = Instant::now() + self.config.node_monitor.pod_cleanup_timeout;
        let mut api_check = Instant::now();
        loop {
            self.health.progress();
            let obs = tokio::task::block_in_place(|| sampler.sample(SampleKind::Fast));
            if !obs.pods.contains_key(&req.uid) {
                info!(pod = %format!("{}/{}", req.namespace, req.name), "evicted pod's processes are gone");
                return;
            }
            if api_check.elapsed() > Duration::from_secs(1) {
                api_check = Instant::now();
                if let Ok(false) = self
                    .actuator
                    .pod_present(&req.namespace, &req.name, &req.uid)
                    .await
                {
                    info!(pod = %format!("{}/{}", req.namespace, req.name), "evicted pod is gone from the API");
                    return;
                }
            }
            if Instant::now() > deadline {
                warn!(pod = %format!("{}/{}", req.namespace, req.name), timeout = ?self.config.node_monitor.pod_cleanup_timeout,
                      "evicted pod still present after the cleanup timeout; deciding again");
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// How long the pod's longest-running container has been running, from its status.
fn running_for(pod: &Pod, now: k8s_openapi::jiff::Timestamp) -> Option<Duration> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .filter_map(|t| now.duration_since(t.0).try_into().ok())
        .max()
}

/// The policy an eviction applies when a PDB blocks it.
pub fn pdb_policy_label(p: PdbPolicy) -> &'static str {
    match p {
        PdbPolicy::Respect => "respect",
        PdbPolicy::Escalate => "escalate",
    }
}
