//! The kubelet's local-storage limit evictions ([`node_monitor_core::local_storage`]), on each
//! new per-pod disk measurement: pods over an emptyDir `sizeLimit` or an ephemeral-storage
//! limit are evicted whatever the node's pressure, without ranking, with the immediate grace
//! period.
use std::collections::HashMap;

use k8s_openapi::api::core::v1::Pod;
use tracing::{info, warn};

use node_monitor_core::{
    config::FsLayout,
    local_storage::{ContainerStorage, StorageLimits, StorageUsage, limit_evictions},
    pod::{PodInfo, pod_is_active},
};

use super::Loop;
use crate::{
    agent::ports::{ClusterWrites, NodeView, PodSource},
    cluster::actuator::EvictionRequest,
    live::EvictionRecord,
    sampler::PodDiskDetail,
};

impl<C: ClusterWrites, P: PodSource> Loop<C, P> {
    /// Judges the pods against their local-storage limits when the disk meter has finished a
    /// measurement since the last look, and evicts those over one. Returns how many evictions
    /// were requested.
    pub(super) async fn enforce_storage_limits<N: NodeView>(
        &mut self,
        sampler: &mut N,
        layout: FsLayout,
    ) -> usize {
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
                usage.insert(info.uid.clone(), storage_usage(&pod, d));
            }
            pods.push((info, limits));
        }
        let evictions = limit_evictions(&pods, &usage, layout.dedicated_image_fs);
        for e in &evictions {
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
                .local_storage_limit_evictions
                .get_or_create(&crate::metrics::LimitKindLabels {
                    kind: e.kind.as_str().to_owned(),
                    outcome: outcome.label().to_owned(),
                })
                .inc();
            self.live.record_eviction(EvictionRecord {
                at_ms: crate::live::unix_ms(),
                namespace: req.namespace.clone(),
                name: req.name.clone(),
                signal: req.signal.clone(),
                hard: req.hard,
                outcome: outcome.label().to_owned(),
                message: req.message.clone(),
            });
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

/// A pod's measured disk as the kubelet's summary has it: the pod's total, its emptyDir volumes
/// by name, and per container (regular, init and ephemeral, by name) its logs and writable layer,
/// the layer found by the container ID its status reports.
pub(super) fn storage_usage(pod: &Pod, detail: &PodDiskDetail) -> StorageUsage {
    let mut containers: Vec<ContainerStorage> = Vec::new();
    let status = pod.status.as_ref();
    let statuses = status
        .into_iter()
        .flat_map(|s| {
            [
                s.container_statuses.as_deref(),
                s.init_container_statuses.as_deref(),
                s.ephemeral_container_statuses.as_deref(),
            ]
        })
        .flatten()
        .flatten();
    for cs in statuses {
        let id = cs
            .container_id
            .as_deref()
            .map(|id| id.split_once("://").map_or(id, |(_, id)| id));
        let rootfs = id.and_then(|id| detail.layers.get(id).copied());
        let logs = detail.logs.get(&cs.name).copied();
        if rootfs.is_none() && logs.is_none() {
            continue;
        }
        containers.push(ContainerStorage {
            name: cs.name.clone(),
            logs,
            rootfs,
        });
    }
    // Containers with logs but no status yet.
    for (name, bytes) in &detail.logs {
        if !containers.iter().any(|c| c.name == *name) {
            containers.push(ContainerStorage {
                name: name.clone(),
                logs: Some(*bytes),
                rootfs: None,
            });
        }
    }
    StorageUsage {
        pod: Some(detail.total),
        volumes: detail.empty_dirs.clone().into_iter().collect(),
        containers,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;

    #[test]
    fn containers_get_their_logs_by_name_and_their_layer_by_the_id_their_status_reports() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": {"containers": [{"name": "app"}], "initContainers": [{"name": "init"}]},
            "status": {
                "containerStatuses": [{"name": "app", "containerID": "containerd://abc123",
                    "ready": true, "restartCount": 0, "image": "", "imageID": ""}],
                "initContainerStatuses": [{"name": "init", "containerID": "cri-o://def456",
                    "ready": false, "restartCount": 0, "image": "", "imageID": ""}],
            },
        }))
        .expect("pod");
        let detail = PodDiskDetail {
            total: 1000,
            empty_dirs: BTreeMap::from([("cache".to_owned(), 300)]),
            logs: BTreeMap::from([("app".to_owned(), 40), ("starting".to_owned(), 5)]),
            // The sandbox's layer (no container status) belongs to no container.
            layers: BTreeMap::from([
                ("abc123".to_owned(), 200),
                ("def456".to_owned(), 7),
                ("sandbox".to_owned(), 1),
            ]),
        };
        let u = storage_usage(&pod, &detail);
        assert_eq!(u.pod, Some(1000));
        assert_eq!(u.volumes, BTreeMap::from([("cache".to_owned(), 300)]));
        let c = |name: &str, logs: Option<u64>, rootfs: Option<u64>| ContainerStorage {
            name: name.into(),
            logs,
            rootfs,
        };
        assert_eq!(
            u.containers,
            vec![
                c("app", Some(40), Some(200)),
                c("init", None, Some(7)),
                c("starting", Some(5), None),
            ]
        );
    }
}
