//! The process: flags, the configuration, the caches the controller reads, leader election, and
//! the controller's passes until SIGTERM or SIGINT.
use std::{
    net::SocketAddr,
    path::PathBuf,
    process::ExitCode,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Node},
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt as _, reflector, watcher},
};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing::{error, info, warn};

use crate::metrics::RemediateMetrics;
use node_monitor_service::{
    client as kube_adapter,
    http::{self, Health},
};

use node_monitor_core::remediation::{RemediationConfig, parse_config};

use crate::{
    controller::Controller,
    kube_ports::{self, KubePorts},
    leader::{self, LeaderElector},
    ports, store,
    watch_health::{ApiHealth, NODE_LEASE_NAMESPACE, WatchFreshness, confirm_lease_watch},
};

/// `node-monitor-remediate`'s flags.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Configuration file (YAML; see docs/remediate.md). Default: every default.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Kubeconfig; default: in-cluster config, then $KUBECONFIG.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the leader Lease, the fence configuration and the fencing operations.
    #[arg(
        long,
        env = "POD_NAMESPACE",
        default_value = "node-monitor",
        value_parser = node_monitor_core::kubelet::node_name::parse_namespace
    )]
    pub namespace: String,
    /// This replica's identity in the leader Lease (default: $POD_NAME, else hostname and pid).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Address for /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:9102")]
    pub metrics_addr: SocketAddr,
    /// Decide and report, but fence, taint and delete nothing (overrides the configuration).
    #[arg(long)]
    pub dry_run: bool,
}

/// Loads the configuration from `--config` (or the defaults).
pub fn load_config(path: Option<&std::path::Path>) -> anyhow::Result<RemediationConfig> {
    match path {
        None => Ok(RemediationConfig::default()),
        Some(p) => {
            let text = node_monitor_base::io::read_file_bounded(
                p,
                "the config file",
                node_monitor_base::io::MAX_INPUT_BYTES,
            )
            .with_context(|| format!("reading --config {}", p.display()))?;
            Ok(parse_config(&p.display().to_string(), &text)?)
        }
    }
}

/// How often the Lease watch is checked against a list: three times within `apiStaleAfter` (the
/// age beyond which the view counts as stale), at least every 10 s, at most every second.
pub fn lease_check_interval(cfg: &RemediationConfig) -> Duration {
    (cfg.storm.api_stale_after / 3).clamp(Duration::from_secs(1), Duration::from_secs(10))
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "remediate".to_owned());
    format!("{host}-{}", std::process::id())
}

/// A reflector whose every event (and error) is reported to `health`; it never ends.
fn reflect<K>(
    api: Api<K>,
    cfg: watcher::Config,
    health: Arc<ApiHealth>,
    what: &'static str,
) -> (
    reflector::Store<K>,
    impl Future<Output = ()> + Send + 'static,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    // The server ends each watch after this; a watch silent for longer (plus the watcher's idle
    // margin) is dropped and resumed, instead of after kube's default 290 s.
    let cfg = cfg.timeout(kube_adapter::WATCH_TIMEOUT_SECS);
    let stream = reflector(writer, watcher(api, cfg)).default_backoff();
    let task = async move {
        let mut stream = std::pin::pin!(stream);
        let mut healthy = true;
        while let Some(item) = stream.next().await {
            match item {
                Ok(_) => {
                    health.ok();
                    if !healthy {
                        info!(what, "watch recovered");
                        healthy = true;
                    }
                }
                Err(e) => {
                    if healthy {
                        warn!(what, error = %e, "watch failed; retrying with backoff");
                    }
                    healthy = false;
                }
            }
        }
    };
    (store, task)
}

/// Runs the controller until SIGTERM or SIGINT.
pub async fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let mut cfg = load_config(args.config.as_deref())?;
    if args.dry_run {
        cfg.dry_run = true;
    }
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    info!(%identity, namespace = %args.namespace, dry_run = cfg.dry_run,
          missed_renewals = cfg.detection.missed_renewals, "node-monitor remediate starting");

    let metrics = Arc::new(RemediateMetrics::new());
    let health = Arc::new(Health::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let http_task = http::spawn(
        args.metrics_addr,
        metrics.clone(),
        health.clone(),
        axum::Router::new(),
        stop_rx.clone(),
    );

    let client: Client = kube_adapter::client(args.kubeconfig.as_deref()).await?;
    let api_health = Arc::new(ApiHealth::default());
    let (caches, tasks) = start_caches(&client, &args.namespace, &cfg, &api_health);
    let admission_task = crate::admission_check::spawn(client.clone(), metrics.clone());

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let synced = async {
        let _ = caches.nodes.wait_until_ready().await;
        let _ = caches.leases.wait_until_ready().await;
        let _ = caches.configmaps.wait_until_ready().await;
    };
    let stopped_early = tokio::select! {
        () = synced => false,
        _ = sigterm.recv() => true,
        _ = sigint.recv() => true,
    };
    if !stopped_early {
        warn_legacy_operations(&caches.configmaps.state());
    }
    let elector = LeaderElector::new(
        client.clone(),
        &args.namespace,
        &identity,
        cfg.leader.clone(),
    );
    let ports = KubePorts::new(client, &args.namespace, &identity, caches);
    let mut controller = Controller::new(ports, cfg.clone(), metrics.clone(), api_health.clone());
    if !stopped_early {
        info!("caches synced");
        health.pods_synced.store(true, Ordering::Relaxed);
        health.probes_loaded.store(true, Ordering::Relaxed);
        // Renewal runs beside the passes, never between them: a long pass cannot outlive the
        // lease, and a pass in flight is abandoned the moment leadership is lost.
        let renewal = leader::spawn(elector, api_health.clone());
        let mut signals = (&mut sigterm, &mut sigint);
        pass_until_stopped(&mut controller, &renewal, &cfg, &metrics, &mut signals).await;
        controller.stand_down();
        renewal.stop().await;
    } else {
        controller.stand_down();
    }
    let _ = stop_tx.send(true);
    for t in &tasks {
        t.abort();
    }
    admission_task.abort();
    let _ = http_task.await;
    info!("stopped");
    Ok(ExitCode::SUCCESS)
}

/// Earlier releases kept operations in ConfigMaps `node-monitor-fence-<node>` of the namespace;
/// they are not read (anyone with ConfigMap write there could forge them): finish or delete
/// in-flight operations before upgrading (docs/remediate.md).
fn warn_legacy_operations(configmaps: &[Arc<ConfigMap>]) {
    let legacy =
        store::legacy_operations(configmaps.iter().filter_map(|c| c.metadata.name.as_deref()));
    if !legacy.is_empty() {
        warn!(configmaps = ?legacy, "fencing operations of an earlier release (ConfigMaps) are \
              ignored: operations now live in NodeFences; check these nodes and delete the \
              ConfigMaps");
    }
}

/// Starts the caches the controller reads (nodes, node Leases, the fence configuration and the
/// agents' liveness Leases in `namespace`) and the check that the Lease watch is current.
fn start_caches(
    client: &Client,
    namespace: &str,
    cfg: &RemediationConfig,
    api_health: &Arc<ApiHealth>,
) -> (kube_ports::Caches, [tokio::task::JoinHandle<()>; 5]) {
    let (nodes, nodes_task) = reflect(
        Api::<Node>::all(client.clone()),
        watcher::Config::default(),
        api_health.clone(),
        "nodes",
    );
    let (leases, leases_task) = reflect(
        Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
        watcher::Config::default(),
        api_health.clone(),
        "node leases",
    );
    let (configmaps, configmaps_task) = reflect(
        Api::<ConfigMap>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
        api_health.clone(),
        "fence configuration",
    );
    // The agents' liveness Leases: no freshness check of their own. A stalled watch only makes
    // agents look silent, and a silent agent makes its node dead only once the kubelet's Lease,
    // whose view is confirmed current, corroborates.
    let (agent_leases, agent_leases_task) = reflect(
        Api::<Lease>::namespaced(client.clone(), namespace),
        watcher::Config::default(),
        api_health.clone(),
        "agent liveness leases",
    );
    let lease_freshness = Arc::new(WatchFreshness::default());
    let tasks = [
        tokio::spawn(agent_leases_task),
        tokio::spawn(nodes_task),
        tokio::spawn(leases_task),
        tokio::spawn(configmaps_task),
        tokio::spawn(confirm_lease_watch(
            Api::<Lease>::namespaced(client.clone(), NODE_LEASE_NAMESPACE),
            leases.clone(),
            lease_freshness.clone(),
            lease_check_interval(cfg),
        )),
    ];
    let caches = kube_ports::Caches {
        nodes,
        leases,
        agent_leases,
        configmaps,
        lease_freshness,
    };
    (caches, tasks)
}

/// A pass every tick while `renewal` says this replica leads (a controller that does not lead
/// only keeps its view), until SIGTERM or SIGINT. A pass in flight when leadership is lost is
/// abandoned and the controller stands down.
async fn pass_until_stopped<P: ports::Ports>(
    controller: &mut Controller<P>,
    renewal: &leader::Renewal,
    cfg: &RemediationConfig,
    metrics: &RemediateMetrics,
    (sigterm, sigint): &mut (&mut Signal, &mut Signal),
) {
    let mut leading_rx = renewal.leading.clone();
    loop {
        tokio::select! {
            () = tokio::time::sleep(cfg.tick_interval) => {}
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
        }
        let leading = *leading_rx.borrow_and_update();
        metrics.leader.set(i64::from(leading));
        if leading {
            let pass = controller.tick(true);
            if leader::run_while_leading(pass, &mut leading_rx)
                .await
                .is_none()
            {
                error!("leadership lost during a pass: abandoning it and standing down");
                metrics.leader.set(0);
                controller.stand_down();
            }
        } else {
            controller.tick(false).await;
        }
    }
}
