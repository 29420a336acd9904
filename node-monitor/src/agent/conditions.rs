//! The after-cycle recorder of the node's conditions and taints: the agent-owned conditions
//! published when they change and as a heartbeat, and the optional NoSchedule taints.
use std::{collections::BTreeMap, time::Duration};

use node_monitor_core::{
    config::NodeMonitorSettings,
    eviction::Decision,
    eviction::conditions::{pressure_taints, published_conditions},
    signals::threshold::NodeConditionType,
};
use tokio::time::Instant;
use tracing::warn;

use super::ports::ClusterWrites;
use crate::{cluster::actuator::NodeConditionUpdate, http::Health, metrics::Metrics};

/// Agent-owned conditions are re-published at least this often, as a heartbeat.
pub(super) const CONDITION_HEARTBEAT: Duration = Duration::from_secs(60);
/// The heartbeat is lengthened by up to this share of it, drawn at each publish.
pub(super) const HEARTBEAT_JITTER: f64 = 0.25;
/// After a failed publish the next try waits this long, doubled at each failure up to
/// [`RETRY_MAX`]: a cycle every 100 ms near a threshold must not call an API server that is
/// down ten times a second from every node.
pub(super) const RETRY_FIRST: Duration = Duration::from_secs(1);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
pub(super) struct PublishedConditions {
    values: BTreeMap<NodeConditionType, bool>,
    at: Option<Instant>,
    /// How long after `at` the unchanged conditions are published again: the heartbeat, jittered
    /// per publish so that agents started together spread out.
    heartbeat: Duration,
    /// Failed publishes since the last one that went through.
    failures: u32,
    /// No publish before this, after a failure.
    retry_at: Option<Instant>,
}

/// The wait after the `failures`-th failed publish in a row (1 s, 2 s, 4 s, … 30 s).
pub(super) fn retry_delay(failures: u32) -> Duration {
    RETRY_FIRST
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(RETRY_MAX)
}

impl PublishedConditions {
    /// Publishes agent-owned conditions when they change (and as a heartbeat), and the optional
    /// NoSchedule taint. Failures are counted and retried after a growing wait ([`retry_delay`]).
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
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
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
                    failures: 0,
                    retry_at: None,
                };
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                let wait = retry_delay(self.failures);
                self.retry_at = Some(Instant::now() + wait);
                warn!(error = %e, failures = self.failures, retry_in = ?wait,
                      "could not publish node conditions; retrying");
                metrics
                    .api_errors
                    .get_or_create(&crate::metrics::OperationLabels {
                        operation: crate::metrics::ApiOperation::patch_conditions,
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
                            operation: crate::metrics::ApiOperation::patch_taint,
                        })
                        .inc();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_after_failed_publishes_doubles_up_to_its_bound() {
        let waits: Vec<u64> = (1..=7).map(|n| retry_delay(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(retry_delay(u32::MAX), RETRY_MAX);
        assert_eq!(retry_delay(0), RETRY_FIRST);
    }
}
