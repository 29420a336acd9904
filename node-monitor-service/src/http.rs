//! The endpoint every product serves: `/metrics`, `/healthz` and `/readyz`, and beside them a
//! product's own routes (the agent's node API). One accept loop bounds what any client may hold
//! ([`ServeLimits`]): the endpoint is reachable by anything that reaches the port.
//!
//! Ready means the pod cache is synced and the probes are loaded, or the agent runs in an
//! explicitly reported degraded state (some probes or wake-up sources unavailable): a degraded
//! agent still protects the node by polling, so it stays in service and says why.
//!
//! Live means the process answers and, once a loop has asked for it ([`Health::track_progress`]),
//! that the loop has made progress within its bound: a loop wedged on a call that never returns
//! fails `/healthz`, and the liveness probe restarts the agent.
use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use prometheus_client::metrics::gauge::Gauge;

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{
    net::TcpListener,
    sync::{Semaphore, watch},
    task::{JoinHandle, JoinSet},
};
use tracing::{debug, error, info};

use crate::metrics::Exposition;

/// What readiness depends on.
#[derive(Debug, Default)]
pub struct Health {
    pub pods_synced: AtomicBool,
    pub probes_loaded: AtomicBool,
    degraded: Mutex<Vec<String>>,
    /// Why the agent cannot act, when it cannot (it sees none of the pods' cgroups).
    blind: Mutex<Option<String>>,
    /// The main loop's heartbeat: when it last made progress, and the longest it may go without.
    progress: Mutex<Option<Progress>>,
    /// Where the heartbeat is exported, once set ([`Health::export_progress`]).
    progress_gauges: OnceLock<ProgressGauges>,
    /// Since when the pod watch has been failing, and its last error.
    pod_watch: Mutex<Option<(Instant, String)>>,
}

/// How long the pod watch may fail before the agent reports itself not ready: longer than one
/// reconnect after a stalled watch (the watch timeout and its margin, then kube's backoff), so a
/// single stall or an API server's restart does not flap readiness.
pub const POD_WATCH_UNREADY_AFTER: Duration = Duration::from_secs(120);

/// The heartbeat's gauges: the Unix time of the last progress and the bound, in seconds.
#[derive(Debug)]
struct ProgressGauges {
    last: Gauge<f64, AtomicU64>,
    bound: Gauge<f64, AtomicU64>,
}

/// The Unix time, in seconds, of the monotonic instant `at` (in the past or now).
fn unix_seconds(at: Instant) -> f64 {
    let ago = Instant::now().saturating_duration_since(at);
    SystemTime::now()
        .checked_sub(ago)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0.0, |d| d.as_secs_f64())
}

#[derive(Debug, Clone, Copy)]
struct Progress {
    at: Instant,
    bound: Duration,
}

impl Health {
    /// Reports a degraded source (e.g. an eBPF program that failed to load).
    pub fn report_degraded(&self, what: impl Into<String>) {
        if let Ok(mut d) = self.degraded.lock() {
            d.push(what.into());
        }
    }

    /// Sets or clears the reason the agent cannot act; readiness fails while one is set.
    pub fn set_blind(&self, reason: Option<String>) {
        if let Ok(mut b) = self.blind.lock() {
            *b = reason;
        }
    }

    /// Makes liveness depend on the loop's progress: from now on, `/healthz` fails when
    /// [`Health::progress`] has not been called for longer than `bound`.
    pub fn track_progress(&self, bound: Duration) {
        let at = Instant::now();
        if let Ok(mut p) = self.progress.lock() {
            *p = Some(Progress { at, bound });
        }
        if let Some(g) = self.progress_gauges.get() {
            g.bound.set(bound.as_secs_f64());
            g.last.set(unix_seconds(at));
        }
    }

    /// Exports the heartbeat once tracked: `last` follows the Unix time of the last progress,
    /// `bound` the bound of [`Health::track_progress`] (both stay 0 until then). Only the first
    /// call takes effect.
    pub fn export_progress(&self, last: Gauge<f64, AtomicU64>, bound: Gauge<f64, AtomicU64>) {
        let _ = self.progress_gauges.set(ProgressGauges { last, bound });
    }

    /// The loop made progress now.
    pub fn progress(&self) {
        self.progress_at(Instant::now());
    }

    /// The loop made progress at `at` (tests set a past heartbeat this way).
    pub fn progress_at(&self, at: Instant) {
        if let Ok(mut p) = self.progress.lock()
            && let Some(p) = p.as_mut()
        {
            p.at = at;
            if let Some(g) = self.progress_gauges.get() {
                g.last.set(unix_seconds(at));
            }
        }
    }

    /// The pod watch failed at `at` with `error`; the first failure of a run starts its clock.
    pub fn pod_watch_failed(&self, error: String, at: Instant) {
        if let Ok(mut w) = self.pod_watch.lock() {
            let since = w.as_ref().map_or(at, |(since, _)| *since);
            *w = Some((since, error));
        }
    }

    /// The pod watch delivers again.
    pub fn pod_watch_recovered(&self) {
        if let Ok(mut w) = self.pod_watch.lock() {
            *w = None;
        }
    }

    /// (live, explanation) at `now`.
    pub fn liveness_at(&self, now: Instant) -> (bool, String) {
        let progress = self.progress.lock().ok().and_then(|p| *p);
        match progress {
            Some(p) if now.saturating_duration_since(p.at) > p.bound => (
                false,
                format!(
                    "the decision loop has made no progress for {:.0?} (bound {:.0?}): an API call or a read hangs",
                    now.saturating_duration_since(p.at),
                    p.bound
                ),
            ),
            _ => (true, "ok".to_owned()),
        }
    }

    /// (live, explanation).
    pub fn liveness(&self) -> (bool, String) {
        self.liveness_at(Instant::now())
    }

    pub fn degraded(&self) -> Vec<String> {
        self.degraded.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// (ready, explanation).
    pub fn readiness(&self) -> (bool, String) {
        self.readiness_at(Instant::now())
    }

    /// (ready, explanation) at `now`.
    pub fn readiness_at(&self, now: Instant) -> (bool, String) {
        let synced = self.pods_synced.load(Ordering::Relaxed);
        let probes = self.probes_loaded.load(Ordering::Relaxed);
        let degraded = self.degraded();
        if let Some(reason) = self.blind.lock().ok().and_then(|b| b.clone()) {
            return (false, reason);
        }
        if let Some((since, error)) = self.pod_watch.lock().ok().and_then(|w| w.clone()) {
            let failing = now.saturating_duration_since(since);
            if failing >= POD_WATCH_UNREADY_AFTER {
                return (
                    false,
                    format!(
                        "the pod watch has failed for {:.0?} (last error: {error}); the pod cache may be stale",
                        failing
                    ),
                );
            }
        }
        match (synced, probes, degraded.is_empty()) {
            (false, _, _) => (false, "pod cache not synced".to_owned()),
            (true, true, true) => (true, "ok".to_owned()),
            (true, _, false) => (true, format!("ok (degraded: {})", degraded.join("; "))),
            (true, false, true) => (false, "probes not loaded".to_owned()),
        }
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
}

/// What the endpoint allows a client. It is reachable by anything that reaches the node's port,
/// tenants included: a client cannot hold more than one of `max_connections` slots, nor hold one
/// for longer than `header_read_timeout` without sending a request, and one peer address (a pod)
/// holds at most `max_per_peer` of them, so the kubelet's probes, which come from another
/// address, always find a slot free.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections served at once; one more is answered 503 and closed at once, never queued.
    pub max_connections: usize,
    /// Connections one peer address may hold at once; one more from it is answered 503 and
    /// closed. Below `max_connections`, so no single pod can take every slot.
    pub max_per_peer: usize,
    /// A request's headers must arrive within this, and an idle keep-alive connection is closed
    /// after it (hyper's `header_read_timeout`): a slowloris client loses its slot.
    pub header_read_timeout: Duration,
    /// On stop, open connections finish their request within this, then are closed.
    pub drain: Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 32,
            max_per_peer: 8,
            header_read_timeout: Duration::from_secs(5),
            drain: Duration::from_secs(2),
        }
    }
}

/// What a connection over the cap gets before it is closed.
const OVERLOADED: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// The connections each peer address holds: a slot taken for a peer is given back when its
/// [`PeerSlot`] drops.
#[derive(Debug, Default)]
struct Peers(Mutex<HashMap<IpAddr, usize>>);

/// One connection's share of its peer's count.
struct PeerSlot {
    peers: Arc<Peers>,
    ip: IpAddr,
}

impl Peers {
    /// A slot for `ip`, unless it already holds `max`.
    fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut held = self.0.lock().ok()?;
        let n = held.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            peers: self.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Ok(mut held) = self.peers.0.lock()
            && let Some(n) = held.get_mut(&self.ip)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.ip);
            }
        }
    }
}

/// Binds and serves `/metrics`, `/healthz`, `/readyz` and `routes` until `shutdown` resolves,
/// with the default [`ServeLimits`].
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    routes: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    serve_with(
        listener,
        metrics,
        health,
        routes,
        ServeLimits::default(),
        shutdown,
    )
    .await
}

/// Serves `/metrics`, `/healthz` and `/readyz` on a bound listener until `shutdown` resolves,
/// within `limits`.
pub async fn serve_on(
    listener: TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, metrics, health, Router::new(), limits, shutdown).await
}

/// [`serve_on`], with `routes` (a product's own API, e.g. the agent's node API) beside them.
pub async fn serve_with(
    listener: TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    routes: Router,
    limits: ServeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(health_handler))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, health })
        .merge(routes);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let peers = Arc::new(Peers::default());
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            a = listener.accept() => a,
        };
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors and the like: pause rather than spin on the error.
                debug!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(peer_slot) = peers.take(peer.ip(), limits.max_per_peer) else {
            let _ = stream.try_write(OVERLOADED);
            debug!(peer = %peer.ip(), max = limits.max_per_peer, "connection refused: its peer holds too many");
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over the cap: nothing is read or kept for it.
            let _ = stream.try_write(OVERLOADED);
            debug!(
                max = limits.max_connections,
                "metrics connection refused: too many open"
            );
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let mut drain = drain_rx.clone();
        connections.spawn(async move {
            let _slots = (slot, peer_slot);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            let stopping = async move {
                let _ = drain.wait_for(|d| *d).await;
            };
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        debug!(error = %e, "metrics connection ended");
                    }
                }
                () = stopping => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    let _ = drain_tx.send(true);
    let drained = tokio::time::timeout(limits.drain, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        debug!(
            open = connections.len(),
            "metrics connections still open after the drain; closed"
        );
    }
    connections.abort_all();
    Ok(())
}

/// [`serve`] in a task of its own, until `stop` turns true. A failure to serve is logged: the
/// process goes on without its endpoint rather than stop over it.
pub fn spawn(
    addr: SocketAddr,
    metrics: Arc<dyn Exposition>,
    health: Arc<Health>,
    routes: Router,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = serve(addr, metrics, health, routes, stopped).await {
            error!(error = %e, %addr, "metrics endpoint failed");
        }
    })
}

async fn metrics_handler(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn health_handler(State(s): State<AppState>) -> impl IntoResponse {
    let (live, why) = s.health.liveness();
    let code = if live {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, why)
}

async fn ready_handler(State(s): State<AppState>) -> impl IntoResponse {
    let (ready, why) = s.health.readiness();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, why)
}

#[cfg(test)]
mod tests;
