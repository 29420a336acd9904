//! The after-cycle recorder of the node's conditions and taints: the agent-owned conditions
//! published when they change and as a heartbeat, and the optional NoSchedule taints.
use std::{collections::BTreeMap, time::Duration};

use node_monitor_core::{
    conditions::{pressure_taints, published_conditions},
    config::NodeMonitorSettings,
    eviction::Decision,
    threshold::NodeConditionType,
};
use tokio::time::Instant;
use tracing::warn;

use super::ports::ClusterWrites;
use crate::{cluster::actuator::NodeConditionUpdate, http::Health, metrics::Metrics};

/// Agent-owned conditions are re-published at least this often, as a heartbeat.
pub(super) const CONDITION_HEARTBEAT: Duration = Duration::from_secs(60);
/// The heartbeat is lengthened by up to this share of it, drawn at each publish.
pub(super) const HEARTBEAT_JITTER: f64 = 0.25;

#[derive(Debug, Default)]
pub(super) struct PublishedConditions {
    values: BTreeMap<NodeConditionType, bool>,
    at: Option<Instant>,
    /// How long after `at` the unchanged conditions are published again: the heartbeat, jittered
    /// per publish so that agents started together spread out.
    heartbeat: Duration,
}

impl PublishedConditions {
    /// Publishes agent-owned conditions when they change (and as a heartbeat), and the optional
    /// NoSchedule taint. Failures are counted and retried on the next cycle.
    pub(super) async fn publish<C: ClusterWrites>(
        &mut self,
        decision: &Decision,
        actuator: &C,
        health: &Health,
        metrics: &Metrics,
        settings: &NodeMonitorSettings,
    ) {
        let values: BTreeMap<NodeConditionType, bool> = decision
            .conditions
            .iter()
            .map(|c| (c.condition, c.status))
            .collect();
        let stale = self.at.is_none_or(|at| at.elapsed() > self.heartbeat);
        if values == self.values && !stale {
            return;
        }
        let updates: Vec<NodeConditionUpdate> = published_conditions(decision)
            .into_iter()
            .map(|c| NodeConditionUpdate {
                type_: c.type_.to_owned(),
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect();
        let published = actuator.set_conditions(&updates).await;
        health.progress();
        match published {
            Ok(()) => {
                *self = PublishedConditions {
                    values: values.clone(),
                    at: Some(Instant::now()),
                    heartbeat: crate::jitter::jittered(CONDITION_HEARTBEAT, HEARTBEAT_JITTER),
                };
            }
            Err(e) => {
                warn!(error = %e, "could not publish node conditions; retrying next cycle");
                metrics
                    .api_errors
                    .get_or_create(&crate::metrics::OperationLabels {
                        operation: "patch_conditions".into(),
                    })
                    .inc();
                return;
            }
        }
        if settings.taint_on_pressure && !settings.dry_run {
            for (key, on) in pressure_taints(decision) {
                let tainted = actuator.set_taint(key, "", "NoSchedule", on).await;
                health.progress();
                if let Err(e) = tainted {
                    warn!(error = %e, %key, "could not update taint");
                    metrics
                        .api_errors
                        .get_or_create(&crate::metrics::OperationLabels {
                            operation: "patch_taint".into(),
                        })
                        .inc();
                }
            }
        }
    }
}
