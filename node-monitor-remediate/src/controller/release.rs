//! The release of a fenced node's workload (the out-of-service taint, then the pods still bound
//! to it force-deleted), and the count of old pods a recovery waits on.
use k8s_openapi::api::core::v1::Pod;
use tracing::{debug, info, warn};

use node_monitor_core::remediation::{
    Phase, ReleaseSummary, TolerationRef, tolerates_out_of_service,
};

use super::{Controller, chain};
use crate::metrics::Port;
use crate::{
    ports::{PodDeletion, Ports},
    store::StoredOp,
};

impl<P: Ports> Controller<P> {
    /// The pods still bound to `node` that a release would delete; `None` when they cannot be
    /// listed.
    pub(super) async fn old_pods(&self, node: &str) -> Option<u32> {
        match self.ports.node_pods(node).await {
            Ok(pods) => {
                self.api_health.ok();
                let n = pods.iter().filter(|p| keep_pod(p).is_none()).count();
                Some(u32::try_from(n).unwrap_or(u32::MAX))
            }
            Err(e) => {
                self.port_error(Port::node_pods, e.metric_label());
                warn!(%node, error = %e, "could not list the node's pods");
                None
            }
        }
    }

    /// Releases a fenced node's workload: the out-of-service taint first, then every pod still
    /// bound to it is deleted with a zero grace period (force). Only ever called once fencing
    /// confirmed the node off or isolated: a force deletion skips the kubelet's confirmation
    /// that the containers stopped, which is exactly what fencing provides instead.
    pub(super) async fn release(
        &mut self,
        node: &str,
        stored: &StoredOp,
    ) -> Result<ReleaseSummary, String> {
        let mut summary = ReleaseSummary::default();
        // The stored operation is what authorises the release: it must still be this one, in
        // the API, unchanged since this controller wrote or read it.
        match self.ports.get_op(node).await {
            Ok(Some(now))
                if now.resource_version == stored.resource_version
                    && now.op == stored.op
                    && now.op.phase == Phase::Releasing
                    && now.op.confirmed_by.is_some() => {}
            Ok(Some(_)) => {
                self.loaded = false;
                return Err("the stored operation changed meanwhile; reading it again".to_owned());
            }
            Ok(None) => {
                self.loaded = false;
                return Err("the stored operation is gone".to_owned());
            }
            Err(e) => return Err(format!("re-read the operation: {}", chain(&e))),
        }
        self.release_check(node, stored)?;
        // Counted first: once the pods are gone the attach-detach controller detaches at once.
        match self.ports.node_volume_attachments(node).await {
            Ok(on_node) => {
                summary.volume_attachments = u32::try_from(on_node.len()).unwrap_or(u32::MAX);
                if !on_node.is_empty() {
                    info!(%node, volume_attachments = ?on_node,
                          "left for the attach-detach controller, which detaches at once from a node with the out-of-service taint");
                }
            }
            // Only reported: the attach-detach controller does the detaching either way.
            Err(e) => {
                self.port_error(Port::node_pods, e.metric_label());
                warn!(%node, error = %e, "could not list VolumeAttachments");
            }
        }
        self.set_taint(node, true).await?;
        if self.cfg.force_delete_pods {
            let pods = self.ports.node_pods(node).await.map_err(|e| {
                self.port_error(Port::node_pods, e.metric_label());
                format!("list the node's pods: {e}")
            })?;
            for pod in pods {
                if let Some(why) = keep_pod(&pod) {
                    debug!(%node, pod = ?pod.metadata.name, why, "pod left in place");
                    continue;
                }
                // Before every deletion: storm protection and the node's state, as of now.
                self.release_check(node, stored)?;
                let ns = pod.metadata.namespace.clone().unwrap_or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                match self.ports.force_delete_pod(&pod).await {
                    Ok(PodDeletion::Deleted) => {
                        summary.pods_deleted += 1;
                        info!(%node, pod = %format!("{ns}/{name}"), "pod deleted after fencing");
                        self.pod_event(
                            &pod,
                            &format!("deleted after node {node} was fenced (confirmed off or isolated); its controller recreates it elsewhere"),
                        )
                        .await;
                    }
                    Ok(PodDeletion::Gone) => {}
                    Err(e) => {
                        self.port_error(Port::node_pods, e.metric_label());
                        return Err(format!("delete pod {ns}/{name}: {e}"));
                    }
                }
            }
        }
        Ok(summary)
    }
}

/// Pods a release leaves alone, as the node lifecycle controller's `deletePods` does: DaemonSet
/// pods (their controller would recreate them on the same node) and mirror pods of static pods
/// (the kubelet owns those); and pods that tolerate the out-of-service taint, which its rules keep
/// on the node (or evict after their `tolerationSeconds`).
pub fn keep_pod(pod: &Pod) -> Option<&'static str> {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    let tolerating = tolerates_out_of_service(tolerations.iter().map(|t| TolerationRef {
        key: t.key.as_deref(),
        operator: t.operator.as_deref(),
        value: t.value.as_deref(),
        effect: t.effect.as_deref(),
    }));
    if tolerating {
        return Some("tolerates the out-of-service taint");
    }
    let daemonset = pod
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
    if daemonset {
        return Some("DaemonSet pod");
    }
    let mirror = pod
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    if mirror {
        return Some("mirror pod");
    }
    None
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{
        api::core::v1::{PodSpec, Toleration},
        apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    };

    use std::collections::BTreeMap;

    use node_monitor_core::remediation::OUT_OF_SERVICE_TAINT;

    use super::*;

    #[test]
    fn releases_leave_daemonset_and_mirror_pods() {
        let pod = |owner: Option<(&str, bool)>, mirror: bool| Pod {
            metadata: ObjectMeta {
                owner_references: owner.map(|(kind, controller)| {
                    vec![OwnerReference {
                        kind: kind.into(),
                        controller: Some(controller),
                        ..OwnerReference::default()
                    }]
                }),
                annotations: mirror.then(|| {
                    BTreeMap::from([("kubernetes.io/config.mirror".to_owned(), "x".to_owned())])
                }),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        let cases = [
            (pod(None, false), None),
            (pod(Some(("ReplicaSet", true)), false), None),
            (pod(Some(("StatefulSet", true)), false), None),
            (pod(Some(("DaemonSet", true)), false), Some("DaemonSet pod")),
            (pod(Some(("DaemonSet", false)), false), None),
            (pod(None, true), Some("mirror pod")),
        ];
        for (p, want) in cases {
            assert_eq!(keep_pod(&p), want, "{:?}", p.metadata);
        }
    }

    #[test]
    fn releases_leave_pods_that_tolerate_the_out_of_service_taint() {
        let pod = |tolerations: Vec<Toleration>| Pod {
            spec: Some(PodSpec {
                tolerations: Some(tolerations),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let t = |key: &str, operator: &str, value: &str, effect: &str| Toleration {
            key: (!key.is_empty()).then(|| key.to_owned()),
            operator: (!operator.is_empty()).then(|| operator.to_owned()),
            value: (!value.is_empty()).then(|| value.to_owned()),
            effect: (!effect.is_empty()).then(|| effect.to_owned()),
            toleration_seconds: None,
        };
        let kept = Some("tolerates the out-of-service taint");
        let cases = [
            // The default tolerations of every pod (DefaultTolerationSeconds): deleted.
            (
                pod(vec![
                    t("node.kubernetes.io/not-ready", "Exists", "", "NoExecute"),
                    t("node.kubernetes.io/unreachable", "Exists", "", "NoExecute"),
                ]),
                None,
            ),
            (pod(vec![t(OUT_OF_SERVICE_TAINT, "Exists", "", "")]), kept),
            (
                pod(vec![t(
                    OUT_OF_SERVICE_TAINT,
                    "Equal",
                    "nodeshutdown",
                    "NoExecute",
                )]),
                kept,
            ),
            (
                pod(vec![t(OUT_OF_SERVICE_TAINT, "Equal", "other", "NoExecute")]),
                None,
            ),
            (
                pod(vec![t(OUT_OF_SERVICE_TAINT, "Exists", "", "NoSchedule")]),
                None,
            ),
            // Tolerates every taint.
            (pod(vec![t("", "Exists", "", "")]), kept),
        ];
        for (p, want) in cases {
            assert_eq!(keep_pod(&p), want, "{:?}", p.spec);
        }
        // With tolerationSeconds too: the taint evicts it in its own time.
        let mut timed = t(OUT_OF_SERVICE_TAINT, "Exists", "", "NoExecute");
        timed.toleration_seconds = Some(30);
        assert_eq!(keep_pod(&pod(vec![timed])), kept);
    }
}
