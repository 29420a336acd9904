//! Publishes what holds on this node (`node_monitor_core::guarantees`): every
//! [`PUBLISH_INTERVAL`], the assessment of the agent's facts (`live::guarantees`) goes to
//! `node_monitor_guarantee` and, when it changed, to the node's `node-monitor.io/guarantees`
//! annotation (`kubectl node-monitor status` sums those over the nodes). A guarantee that stops
//! holding is logged once, with why. The annotation stays through a restart (the next start
//! writes it again) and goes with `node-monitor cleanup`.
use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tracing::{info, warn};

use node_monitor_core::{
    contract::names::GUARANTEES_ANNOTATION,
    guarantees::{Assessment, Guarantee, Holds, encode},
};

use crate::{
    cluster::actuator::Actuator,
    live::LiveView,
    metrics::{GuaranteeLabels, Metrics},
};

/// How often the assessment is made again.
pub(super) const PUBLISH_INTERVAL: Duration = Duration::from_secs(30);
/// The first one waits for the decision loop's first passes, which read the kubelet's
/// configuration.
const FIRST_AFTER: Duration = Duration::from_secs(15);

/// Starts publishing, until `stop` turns true.
pub(super) fn spawn(
    actuator: &Actuator,
    live: &Arc<LiveView>,
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
) {
    tokio::spawn(publish_until_stopped(
        actuator.clone(),
        live.clone(),
        metrics.clone(),
        stop.clone(),
    ));
}

/// Publishes until `stop` turns true.
async fn publish_until_stopped(
    actuator: Actuator,
    live: Arc<LiveView>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut written: Option<String> = None;
    let mut last: Option<Assessment> = None;
    let mut delay = FIRST_AFTER;
    loop {
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        delay = PUBLISH_INTERVAL;
        let a = live.guarantees.assessment();
        set_metric(&metrics, &a);
        log_changes(last.as_ref(), &a);
        let text = encode(&a);
        if written.as_deref() != Some(text.as_str()) {
            match actuator
                .annotate_node(GUARANTEES_ANNOTATION, Some(&text))
                .await
            {
                Ok(()) => written = Some(text),
                Err(e) => warn!(
                    error = %e,
                    "publishing what holds on this node ({GUARANTEES_ANNOTATION}) failed; \
                     tried again in {PUBLISH_INTERVAL:?}"
                ),
            }
        }
        last = Some(a);
    }
}

/// 1 at each guarantee's current verdict, 0 at the others.
fn set_metric(metrics: &Metrics, a: &Assessment) {
    for (g, h) in a {
        for label in ["yes", "no", "not_applicable"] {
            metrics
                .guarantee
                .get_or_create(&GuaranteeLabels {
                    guarantee: g.as_str().to_owned(),
                    holds: label.to_owned(),
                })
                .set(i64::from(h.label() == label));
        }
    }
}

/// Logs each guarantee whose verdict changed (all of them the first time).
fn log_changes(before: Option<&Assessment>, now: &Assessment) {
    for g in Guarantee::ALL {
        let Some(h) = now.get(&g) else { continue };
        if before.and_then(|b| b.get(&g)) == Some(h) {
            continue;
        }
        match h {
            Holds::Yes => info!(guarantee = g.as_str(), "holds on this node"),
            Holds::NotApplicable(why) => {
                info!(guarantee = g.as_str(), why = %why, "does not apply on this node");
            }
            Holds::No(why) => warn!(
                guarantee = g.as_str(),
                why = %why,
                "does not hold on this node: the agent {}",
                g.without()
            ),
        }
    }
}
