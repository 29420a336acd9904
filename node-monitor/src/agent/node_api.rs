//! The agent's endpoint at start-up: `/metrics`, `/healthz`, `/readyz` and the node API, whose
//! authorizer is set once the API client exists (until then the node API answers 503).
use std::sync::Arc;

use node_monitor_core::config;

use super::Args;
use crate::{
    http::{
        self, Health, NodeApi,
        auth::{AuthSlot, Authorizer, KubeReviews},
    },
    live::LiveView,
    metrics::Metrics,
};

/// The HTTP endpoint, with the node API (which answers 503 until the API client exists to
/// authorize its callers); the live view it shows and the slot of its authorizer.
pub(super) fn start_http(
    args: &Args,
    config: &config::EvictionConfig,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    stop_rx: &tokio::sync::watch::Receiver<bool>,
) -> (tokio::task::JoinHandle<()>, Arc<LiveView>, Arc<AuthSlot>) {
    let live = Arc::new(LiveView::new(&args.node_name));
    live.set_config(config);
    let auth = Arc::new(AuthSlot::default());
    let api = NodeApi {
        live: live.clone(),
        auth: auth.clone(),
    };
    let routes = http::router(api, health.clone());
    let task = http::spawn(
        args.metrics_addr,
        metrics.clone(),
        health.clone(),
        routes,
        stop_rx.clone(),
    );
    (task, live, auth)
}

/// The node API's authorizer: TokenReview and SubjectAccessReview through `client`.
pub(super) fn set_authorizer(auth: &AuthSlot, client: &kube::Client, args: &Args) {
    let audiences: Vec<String> = args
        .api_token_audience
        .iter()
        .filter(|a| !a.is_empty())
        .cloned()
        .collect();
    auth.set(Arc::new(
        Authorizer::new(
            Arc::new(KubeReviews::new(client.clone(), audiences.clone())),
            args.node_name.clone(),
        )
        .expecting(audiences),
    ));
}
