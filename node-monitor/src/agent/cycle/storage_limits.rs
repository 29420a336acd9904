//! The kubelet's local-storage limit evictions ([`node_monitor_core::eviction::local_storage`]), on each
//! new per-pod disk measurement (asked for at least once per full-sample interval, pressure or
//! not): pods over an emptyDir `sizeLimit` or an ephemeral-storage
//! limit are evicted whatever the node's pressure, without ranking, with the immediate grace
//! period.
use std::collections::HashMap;

use tracing::{info, warn};

use node_monitor_core::{
    config::FsLayout,
    eviction::local_storage::{StorageLimits, limit_evictions},
    kubelet::pod::{PodInfo, pod_is_active},
};

use super::Loop;
use crate::{
    agent::ports::{ClusterWrites, PodSource, PodView},
    cluster::actuator::EvictionRequest,
    live::EvictionRecord,
};

impl<C: ClusterWrites, P: PodSource> Loop<C, P> {
    /// Judges the pods against their local-storage limits when the disk meter has finished a
    /// measurement since the last look, and evicts those over one. Returns how many evictions
    /// were requested.
    pub(super) async fn enforce_storage_limits<N: PodView>(
        &mut self,
        sampler: &mut N,
        layout: FsLayout,
    ) -> usize {
        if !self.config.local_storage_capacity_isolation {
            return 0;
        }
        // The walk runs apart: this pass judges the last finished measurement, if new.
        sampler.request_pod_disk();
        let Some(detail) = sampler.take_pod_disk_detail() else {
            return 0;
        };
        let now = self.now();
        if self.blind.is_some() || self.evictions_held_until.is_some_and(|t| t > now) {
            return 0;
        }
        let mut pods = Vec::new();
        let mut usage = HashMap::new();
        for pod in self.store.pods() {
            if !pod_is_active(&pod) {
                continue;
            }
            let limits = match StorageLimits::from_pod(&pod) {
                Ok(l) if l.any() => l,
                Ok(_) => continue,
                Err(e) => {
                    warn!(error = %e, "pod skipped for its local-storage limits");
                    continue;
                }
            };
            let Ok(info) = PodInfo::from_pod(&pod) else {
                continue;
            };
            if self.backoff.active(&info.uid, now) {
                continue;
            }
            if let Some(d) = detail.get(&info.uid) {
                usage.insert(info.uid.clone(), d.storage_usage(&pod));
            }
            pods.push((info, limits));
        }
        let evictions = limit_evictions(&pods, &usage, layout.dedicated_image_fs);
        for e in &evictions {
            // A dry run finds the same pods on every measurement: reported once per pod and
            // limit per DRY_RUN_REPORT_INTERVAL, as the pressure evictions are.
            if self.config.node_monitor.dry_run
                && !self
                    .dry_run_reports
                    .allow_named(&e.uid, e.kind.signal(), now)
            {
                continue;
            }
            let req = EvictionRequest {
                namespace: e.namespace.clone(),
                name: e.name.clone(),
                uid: e.uid.clone(),
                grace_period_seconds: u32::try_from(e.grace_period_seconds.max(1))
                    .unwrap_or(u32::MAX),
                hard: true,
                signal: e.kind.signal().to_owned(),
                message: e.message.clone(),
                annotations: Default::default(),
            };
            info!(pod = %format!("{}/{}", e.namespace, e.name), limit = %e.kind,
                  grace = e.grace_period_seconds, message = %e.message,
                  dry_run = self.config.node_monitor.dry_run, "evicting: over a local-storage limit");
            let started = std::time::Instant::now();
            let outcome = self.actuator.evict(&req).await;
            self.health.progress();
            self.metrics
                .eviction
                .local_storage_limit_evictions
                .get_or_create(&crate::metrics::LimitKindLabels {
                    kind: e.kind.as_str().to_owned(),
                    outcome: outcome.label().to_owned(),
                })
                .inc();
            self.recorders
                .live
                .record_eviction(EvictionRecord::answered(&req, &outcome));
            let reaction = self.take_answer(&req, &outcome, started.elapsed());
            self.actuator.record_eviction_events(&req, &outcome).await;
            self.health.progress();
            if reaction.retry_later || reaction.hold_evictions.is_some() {
                break;
            }
        }
        evictions.len()
    }
}
