//! What the controller reports: the metrics of every pass (liveness, zones, operations), and
//! Events on nodes and pods (through the [`crate::cluster::events`] writer).
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use tracing::{info, warn};

use node_monitor_core::remediation::{Assessment, Liveness, Phase, SkipReason, ZoneState};

use super::Controller;
use crate::{
    metrics::{StateLabels, ZoneLabels, ZoneStateLabels},
    ports::Ports,
};
use node_monitor_service::{
    events::{EventRecord, pod_ref},
    metrics::ReasonLabels,
};

impl<P: Ports> Controller<P> {
    pub(super) fn record_liveness(&mut self, liveness: &BTreeMap<String, Liveness>) {
        let mut counts: BTreeMap<&'static str, i64> =
            [("alive", 0), ("suspect", 0), ("dead", 0)].into();
        for (node, l) in liveness {
            *counts.entry(l.label()).or_default() += 1;
            let prev = self.last_liveness.insert(node.clone(), l.label());
            if prev != Some(l.label()) {
                match l {
                    Liveness::Dead(e) => {
                        warn!(%node, evidence = %e.describe(), "node is dead");
                    }
                    Liveness::Suspect { silent } => {
                        info!(%node, silent_s = silent.as_secs_f64(), "node is suspect");
                    }
                    Liveness::Alive(why) if prev.is_some() => {
                        info!(%node, because = ?why, "node is alive");
                    }
                    Liveness::Alive(_) => {}
                }
            }
        }
        self.last_liveness
            .retain(|node, _| liveness.contains_key(node));
        for (state, n) in counts {
            self.metrics
                .nodes
                .get_or_create(&StateLabels {
                    state: state.to_owned(),
                })
                .set(n);
        }
    }

    pub(super) fn record_zones(&self, a: &Assessment) {
        for (zone, status) in &a.zones {
            for s in ZoneState::ALL {
                self.metrics
                    .zone_state
                    .get_or_create(&ZoneStateLabels {
                        zone: zone.label(),
                        state: s.as_str().to_owned(),
                    })
                    .set(i64::from(s == status.state));
            }
            self.metrics
                .zone_unhealthy_nodes
                .get_or_create(&ZoneLabels { zone: zone.label() })
                .set(i64::try_from(status.unhealthy).unwrap_or(i64::MAX));
        }
    }

    pub(super) fn record_ops(&self) {
        for label in Phase::LABELS {
            let n = self
                .ops
                .values()
                .filter(|s| s.op.phase.label() == label)
                .count();
            self.metrics
                .operations
                .get_or_create(&StateLabels {
                    state: label.to_owned(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(super) async fn note_skip(&mut self, node: &str, uid: &str, reason: &SkipReason) {
        let label = reason.label();
        if self.skips.get(node) == Some(&label) {
            return;
        }
        self.skips.insert(node.to_owned(), label);
        self.metrics
            .skips
            .get_or_create(&ReasonLabels {
                reason: label.to_owned(),
            })
            .inc();
        warn!(%node, reason = label, message = %reason.message(), "dead node not fenced");
        self.node_event(node, uid, true, "FencingSkipped", &reason.message())
            .await;
    }

    /// An Event about a node (in `default`, where the kubelet and the node lifecycle controller
    /// record theirs).
    pub(super) async fn node_event(
        &self,
        node: &str,
        uid: &str,
        warning: bool,
        reason: &str,
        message: &str,
    ) {
        let involved = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(node.to_owned()),
            uid: (!uid.is_empty()).then(|| uid.to_owned()),
            ..ObjectReference::default()
        };
        self.ports
            .record(EventRecord {
                namespace: "default".to_owned(),
                involved,
                warning,
                reason: reason.to_owned(),
                message: message.to_owned(),
                annotations: BTreeMap::new(),
            })
            .await;
    }

    pub(super) async fn pod_event(&self, pod: &Pod, message: &str) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let mut involved = pod_ref(&ns, "", "");
        involved.name = pod.metadata.name.clone();
        involved.uid = pod.metadata.uid.clone();
        self.ports
            .record(EventRecord {
                namespace: ns,
                involved,
                warning: true,
                reason: "DeletedAfterFencing".to_owned(),
                message: message.to_owned(),
                annotations: BTreeMap::new(),
            })
            .await;
    }
}
