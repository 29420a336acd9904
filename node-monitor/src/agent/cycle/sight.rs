//! Whether the agent sees the pods' cgroups: the sampler must find the cgroups of the pods the
//! API lists as running here, or the agent is blind, not ready, and holds its evictions.
use super::*;

impl<C: ClusterWrites, P: PodSource> Loop<C, P> {
    /// Checks, at most every [`SIGHT_CHECK_INTERVAL`], that the sampler finds the cgroups of the
    /// pods the API lists as running here; while it finds none, the agent is not ready and holds
    /// its evictions ([`blind_to_pods`]).
    pub(super) fn check_pod_sight<N: PodView>(&mut self, sampler: &mut N) {
        if self
            .sight_checked
            .is_some_and(|t| t.elapsed() < SIGHT_CHECK_INTERVAL)
        {
            return;
        }
        self.sight_checked = Some(Instant::now());
        if let Err(e) = sampler.refresh_pod_cgroups() {
            debug!(error = %e, "listing the pod cgroups failed");
        }
        let sight = sampler.kubepods();
        let reported = (sight.driver.clone(), sight.path.clone());
        if self.kubepods_reported.as_ref() != Some(&reported) {
            info!(driver = %reported.0, kubepods = %reported.1, detection = %sight.detection,
                  "reading pods from this kubepods cgroup");
            self.metrics.pods.kubepods_layout.clear();
            self.metrics
                .pods
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
            .pods()
            .iter()
            .filter(|p| node_monitor_core::kubelet::pod::pod_is_active(p))
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
                    sight.path
                );
                warn!(%reason, "blind to the pods: evictions held");
                self.health.set_blind(Some(reason));
                self.metrics.pods.cgroups_missing.set(1);
            }
            (Some(_), None) => {
                info!("the pods' cgroups are found again: evictions resume");
                self.health.set_blind(None);
                self.metrics.pods.cgroups_missing.set(0);
            }
            _ => {}
        }
        self.blind = blind;
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
