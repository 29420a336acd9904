//! `/metrics`, `/healthz` and `/readyz`.
//!
//! Ready means the pod cache is synced and the probes are loaded, or the agent runs in an
//! explicitly reported degraded state (some probes or wake-up sources unavailable): a degraded
//! agent still protects the node by polling, so it stays in service and says why.
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{Router, extract::State, http::StatusCode, response::IntoResponse, routing::get};
use tokio::{net::TcpListener, sync::watch, task::JoinHandle};
use tracing::{error, info};

use crate::metrics::Metrics;

/// What readiness depends on.
#[derive(Debug, Default)]
pub struct Health {
    pub pods_synced: AtomicBool,
    pub probes_loaded: AtomicBool,
    degraded: Mutex<Vec<String>>,
    /// Why the agent cannot act, when it cannot (it sees none of the pods' cgroups).
    blind: Mutex<Option<String>>,
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

    pub fn degraded(&self) -> Vec<String> {
        self.degraded.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// (ready, explanation).
    pub fn readiness(&self) -> (bool, String) {
        let synced = self.pods_synced.load(Ordering::Relaxed);
        let probes = self.probes_loaded.load(Ordering::Relaxed);
        let degraded = self.degraded();
        if let Some(reason) = self.blind.lock().ok().and_then(|b| b.clone()) {
            return (false, reason);
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
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Binds and serves until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready_handler))
        .with_state(AppState { metrics, health });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// [`serve`] in a task of its own, until `stop` turns true. A failure to serve is logged: the
/// process goes on without its endpoint rather than stop over it.
pub fn spawn(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = serve(addr, metrics, health, stopped).await {
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
mod tests {
    use super::*;

    #[test]
    fn readiness_table() {
        let cases = [
            (false, false, false, false),
            (false, true, false, false),
            (true, false, false, false),
            (true, true, false, true),
            (true, false, true, true),
            (true, true, true, true),
        ];
        for (synced, probes, degraded, want) in cases {
            let h = Health::default();
            h.pods_synced.store(synced, Ordering::Relaxed);
            h.probes_loaded.store(probes, Ordering::Relaxed);
            if degraded {
                h.report_degraded("oom_mark_victim: attach failed");
            }
            assert_eq!(
                h.readiness().0,
                want,
                "synced={synced} probes={probes} degraded={degraded}"
            );
        }
    }

    #[test]
    fn blindness_fails_readiness_until_cleared() {
        let h = Health::default();
        h.pods_synced.store(true, Ordering::Relaxed);
        h.probes_loaded.store(true, Ordering::Relaxed);
        h.set_blind(Some(
            "no cgroup found for the 3 pods running on this node".into(),
        ));
        let (ready, why) = h.readiness();
        assert!(!ready);
        assert!(why.contains("3 pods"), "{why}");
        h.set_blind(None);
        assert_eq!(h.readiness(), (true, "ok".to_owned()));
    }
}
