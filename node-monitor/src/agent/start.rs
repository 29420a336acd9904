//! The agent's start-up: the pod reflector, the sampler, the wake-up sources, the eBPF probes and
//! the metrics that exist from the start.
use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tracing::{debug, info, warn};

use super::{Args, backoff, kernel, sources};
use crate::{
    cluster as kube_adapter,
    http::Health,
    metrics::{ConditionLabels, EvictionLabels, Metrics},
    sampler::{Sampler, SamplerConfig},
    wakeup::{SourceKind, SourceSetting, SourceState, WakeupConfig, Wakeups},
};
use node_monitor_core::{
    config::EvictionConfig, eviction::headroom::HeadroomPolicy,
    signals::threshold::NodeConditionType,
};

/// Starts the reflector of this node's pods; /readyz reports the pod cache synced once it is, and
/// a watch that keeps failing (`node_monitor_pod_watch_failing`, readiness after
/// [`crate::http::POD_WATCH_UNREADY_AFTER`]).
pub(super) fn start_pod_reflector(
    clients: &kube_adapter::Clients,
    node_name: &str,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
) -> (
    kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    tokio::task::JoinHandle<()>,
) {
    let observe = {
        let (health, metrics) = (health.clone(), metrics.clone());
        move |event: kube_adapter::PodWatchEvent| match event {
            kube_adapter::PodWatchEvent::Failed(error) => {
                metrics.pods.watch_errors.inc();
                metrics.pods.watch_failing.set(1);
                health.pod_watch_failed(error, std::time::Instant::now());
            }
            kube_adapter::PodWatchEvent::Recovered => {
                metrics.pods.watch_failing.set(0);
                health.pod_watch_recovered();
            }
        }
    };
    let (store, reflector) = kube_adapter::pod_reflector(clients.watch.clone(), node_name, observe);
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
    (store, reflector_task)
}

/// The sampler for the paths `args` name, with the open-file limit raised for its per-pod files.
pub(super) fn new_sampler(
    args: &Args,
    allocatable_memory: Option<u64>,
    memory_working_set: node_monitor_core::signals::MemoryWorkingSet,
) -> anyhow::Result<Sampler> {
    let sampler_config = SamplerConfig {
        cgroup_root: args.cgroup_root.clone(),
        node_cgroup: args.node_cgroup.clone(),
        kubepods_cgroup: args.kubepods_cgroup.clone(),
        kubelet_config: args.kubelet_config.clone(),
        proc_root: args.proc_root.clone(),
        kubelet_root: args.kubelet_root.clone(),
        image_fs: args.image_fs.clone(),
        container_fs: args.container_fs.clone(),
        allocatable_memory,
        memory_working_set,
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
    Sampler::new(sampler_config).context("sampler configuration")
}

/// Adaptive sampling near a threshold; off in polling mode, which is the kubelet's fixed tick.
pub(super) fn headroom_policy(args: &Args, config: &EvictionConfig) -> Option<HeadroomPolicy> {
    (!args.polling_only && !config.node_monitor.fast_sampling_interval.is_zero()).then_some(
        HeadroomPolicy {
            fast: config.node_monitor.fast_sampling_interval,
            slow: config.node_monitor.housekeeping_interval,
            lead: config
                .node_monitor
                .predictive_eviction
                .then_some(config.node_monitor.prediction_lead),
        },
    )
}

/// OOM kills waiting for the Event writer; more are dropped (and counted).
const OOM_EVENT_QUEUE: usize = 64;

/// Loads and attaches the eBPF programs (not in `--no-ebpf` or polling-only mode); a program
/// that cannot load degrades the agent. Their counters are mirrored into the metrics.
#[expect(
    clippy::too_many_arguments,
    reason = "the start-up wiring: each argument is one of the agent's shared parts"
)]
pub(super) async fn start_probes(
    args: &Args,
    config: &EvictionConfig,
    store: &kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Pod>,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    wakeups: &Wakeups,
    live: &Arc<crate::live::LiveView>,
    reboot_tx: tokio::sync::mpsc::Sender<kernel::RebootSeen>,
    client: &kube::Client,
    fast_gasp: Option<crate::shutdown::gasp::FastStart>,
    stop_rx: tokio::sync::watch::Receiver<bool>,
) -> Option<Arc<crate::ebpf::Probes>> {
    let probes = if args.no_ebpf || args.polling_only {
        info!("eBPF programs not loaded (--no-ebpf or --polling-only)");
        None
    } else {
        let mut probe_config = crate::ebpf::ProbeConfig {
            stall_budget: config.node_monitor.reclaim_stall_budget,
            ..crate::ebpf::ProbeConfig::default()
        };
        if !config.node_monitor.memory_push {
            probe_config.disable.insert("mem_push".to_owned());
        }
        if !config.node_monitor.reboot_probe_fallback {
            probe_config
                .disable
                .insert(crate::ebpf::prog::REBOOT_RAW.to_owned());
        }
        // OOMKilling Events on the pods and the Node: one writer task, fed without waiting.
        let (oom_tx, oom_rx) = tokio::sync::mpsc::channel(OOM_EVENT_QUEUE);
        tokio::spawn(crate::cluster::oom_events::run(
            client.clone(),
            crate::cluster::events::Reporter {
                component: crate::cluster::actuator::COMPONENT,
                instance: args.node_name.clone(),
                host: Some(args.node_name.clone()),
            },
            config.node_monitor.api_timeout,
            metrics.clone(),
            oom_rx,
        ));
        kernel::start(
            probe_config,
            store.clone(),
            metrics.clone(),
            health.clone(),
            wakeups.kernel_sender(),
            live.clone(),
            reboot_tx,
            Some(crate::cluster::oom_events::OomEvents {
                tx: oom_tx,
                node: args.node_name.clone(),
            }),
            fast_gasp,
            stop_rx.clone(),
        )
        .await
        .map(Arc::new)
    };
    metrics.wakeups.set_source_state(
        SourceKind::Kernel.as_str(),
        sources::kernel_state(
            !(args.no_ebpf || args.polling_only),
            probes.as_ref().map(|p| p.attached()),
        ),
    );
    live.guarantees.set_ebpf(
        probes.as_deref(),
        if args.no_ebpf || args.polling_only {
            "not loaded (--no-ebpf or --polling-only)"
        } else {
            "the eBPF programs did not load"
        },
    );
    if let Some(p) = &probes {
        tokio::spawn(kernel::mirror_counters(
            p.clone(),
            metrics.clone(),
            stop_rx.clone(),
        ));
    }
    health.probes_loaded.store(true, Ordering::Relaxed);
    probes
}

/// The wake-up sources for this host and configuration (push sources off in polling-only mode),
/// each reported as a metric; one that should work and does not degrades the agent.
pub(super) fn start_wakeups(
    args: &Args,
    config: &EvictionConfig,
    sampler: &Sampler,
    metrics: &Metrics,
    health: &Health,
    live: &crate::live::LiveView,
) -> anyhow::Result<Wakeups> {
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
    let wakeups = Wakeups::start(wake_config).context("wake-up sources")?;
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
        metrics.wakeups.set_source_state(s.source.as_str(), state);
        if degraded {
            health.report_degraded(format!("wake-up source {} unavailable", s.source.as_str()));
        }
    }
    let states = wakeups.source_states();
    let state_of = |kind: SourceKind| {
        let state = states.iter().find(|s| s.source == kind).map(|s| &s.state);
        sources::guarantee_source(kind, state, &not_applicable)
    };
    live.guarantees.set_sources(
        state_of(SourceKind::MemcgThreshold),
        state_of(SourceKind::Psi),
    );
    Ok(wakeups)
}

/// `status.allocatable.memory` of this node, when the API answers; `None` otherwise (the sampler
/// then uses the kubepods cgroup's limit, as the kubelet's own stats do).
pub(super) async fn node_allocatable_memory(client: &kube::Client, node: &str) -> Option<u64> {
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
    match node_monitor_core::units::quantity::Quantity::parse(&q) {
        Ok(q) => u64::try_from(q.value()).ok(),
        Err(e) => {
            warn!(value = %q, error = %e, "node status.allocatable.memory is not a quantity");
            None
        }
    }
}

/// Zero-initialises the series the dashboard and alerts read, so they exist before anything happens.
pub(super) fn init_metrics(m: &Metrics, config: &EvictionConfig) {
    for t in &config.thresholds {
        for outcome in ["evicted", "pdb_blocked", "escalated", "dry_run"] {
            let _ = m.eviction.evictions.get_or_create(&EvictionLabels {
                eviction_signal: t.signal.as_str().to_owned(),
                threshold: if t.is_hard() { "hard" } else { "soft" }.to_owned(),
                outcome: outcome.to_owned(),
            });
        }
    }
    for reason in backoff::failure_labels() {
        let _ = m
            .eviction
            .eviction_failures
            .get_or_create(&crate::metrics::ReasonLabels {
                reason: reason.to_owned(),
            });
    }
    for operation in crate::metrics::ApiOperation::ALL {
        let _ = m
            .api_errors
            .get_or_create(&crate::metrics::OperationLabels { operation });
    }
    // 0 until a graceful shutdown happens, like the kubelet's graceful_shutdown_*_time_seconds.
    let total = crate::metrics::PhaseLabels {
        phase: "total".to_owned(),
    };
    m.shutdown
        .phase_start_time_seconds
        .get_or_create(&total)
        .set(0.0);
    m.shutdown
        .phase_end_time_seconds
        .get_or_create(&total)
        .set(0.0);
    for c in NodeConditionType::ALL {
        m.eviction
            .node_condition
            .get_or_create(&ConditionLabels {
                condition: c.as_str().to_owned(),
            })
            .set(0);
    }
}
