//! The node's side of a shutdown: marking it beside the run, and its pods as the plan takes them.
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::ports::NodeApi;
use crate::{
    cluster::actuator::NodeConditionUpdate,
    metrics::{Metrics, OperationLabels},
    telemetry::error_chain as chain,
};
use node_monitor_core::{
    contract::names::{CORDONED_ANNOTATION, SHUTTING_DOWN_CONDITION},
    shutdown::{
        ShutdownPod,
        lifecycle::{EVENT_DETECTED, Marks},
    },
};

pub(super) fn api_error(metrics: &Metrics, operation: crate::metrics::ApiOperation) {
    metrics
        .api_errors
        .get_or_create(&OperationLabels { operation })
        .inc();
}

/// Posts the node Event and sets the marks; returns which marks took. Runs beside the first
/// group (the kubelet, too, updates the node status asynchronously and starts killing at once).
pub(super) async fn mark_node<N: NodeApi>(
    api: N,
    metrics: Arc<Metrics>,
    message: String,
    cordon: bool,
) -> Marks {
    api.node_event(EVENT_DETECTED).await;
    let mut marks = Marks::default();
    // The condition, the taint and the cordon are independent: one request each, together.
    let cond = NodeConditionUpdate {
        type_: SHUTTING_DOWN_CONDITION.into(),
        status: true,
        reason: "NodeShuttingDown".into(),
        message,
    };
    let (c, t, k) = tokio::join!(api.set_condition(cond), api.set_taint(true), async {
        if !cordon {
            return Ok(None);
        }
        // A cordon already there is someone else's: leave it, and claim nothing (the base's
        // admission policy refuses the claim on an unschedulable node anyway).
        if api.is_unschedulable().await? {
            return Ok(Some(true));
        }
        // Annotate first: a crash between the two leaves an annotation, never a stray cordon.
        api.annotate_node(CORDONED_ANNOTATION, Some("true".to_owned()))
            .await?;
        api.set_unschedulable(true).await.map(Some)
    },);
    match c {
        Ok(()) => marks.condition = true,
        Err(e) => {
            warn!(error = %chain(&*e), "could not set the shutdown condition");
            api_error(&metrics, crate::metrics::ApiOperation::patch_conditions);
        }
    }
    match t {
        Ok(()) => marks.taint = true,
        Err(e) => {
            warn!(error = %chain(&*e), "could not taint the node");
            api_error(&metrics, crate::metrics::ApiOperation::patch_taint);
        }
    }
    match k {
        Ok(Some(was)) => {
            marks.cordoned = !was;
            if was {
                // Cordoned by someone else: leave it so after a cancellation.
                let _ = api.annotate_node(CORDONED_ANNOTATION, None).await;
            }
        }
        Ok(None) => {}
        Err(e) => {
            warn!(error = %chain(&*e), "could not cordon the node");
            api_error(&metrics, crate::metrics::ApiOperation::patch_unschedulable);
        }
    }
    marks
}

pub(super) fn plannable(p: &Pod, own_pod: Option<&(String, String)>) -> bool {
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    let name = p.metadata.name.as_deref().unwrap_or_default();
    if own_pod.is_some_and(|(n, m)| n == ns && m == name) {
        return false;
    }
    if p.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"))
    {
        return false;
    }
    !terminal(p)
}

pub(super) fn terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub(super) fn shutdown_pod(p: &Pod) -> Option<ShutdownPod> {
    let spec = p.spec.as_ref();
    Some(ShutdownPod {
        namespace: p.metadata.namespace.clone()?,
        name: p.metadata.name.clone()?,
        uid: p.metadata.uid.clone()?,
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        termination_grace_period_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
    })
}
