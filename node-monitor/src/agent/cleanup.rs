//! The wait after an eviction, as the kubelet's: until the evicted pod's processes have left the
//! node or the API no longer has it, bounded by the pod cleanup timeout.
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::ports::{ClusterWrites, NodeSignals};
use crate::{cluster::actuator::EvictionRequest, http::Health, sampler::SampleKind};

/// Waits, as the kubelet does, until the evicted pod's processes have left the node (its
/// cgroup is gone) or the API no longer has it, bounded by the pod cleanup timeout. Returns
/// whether its processes were seen gone (the time that took is the predictor's lead).
pub(super) async fn wait_for_cleanup<N: NodeSignals, C: ClusterWrites>(
    sampler: &mut N,
    actuator: &C,
    health: &Health,
    timeout: Duration,
    req: &EvictionRequest,
) -> bool {
    let deadline = Instant::now() + timeout;
    let mut api_check = Instant::now();
    loop {
        health.progress();
        let obs = sampler.sample(SampleKind::Fast);
        if !obs.pods.contains_key(&req.uid) {
            info!(pod = %format!("{}/{}", req.namespace, req.name), "evicted pod's processes are gone");
            return true;
        }
        if api_check.elapsed() > Duration::from_secs(1) {
            api_check = Instant::now();
            if let Ok(false) = actuator
                .pod_present(&req.namespace, &req.name, &req.uid)
                .await
            {
                info!(pod = %format!("{}/{}", req.namespace, req.name), "evicted pod is gone from the API");
                return false;
            }
        }
        if Instant::now() > deadline {
            warn!(pod = %format!("{}/{}", req.namespace, req.name), timeout = ?timeout,
                  "evicted pod still present after the cleanup timeout; deciding again");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
