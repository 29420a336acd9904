//! The cycle's metrics: the signals' gauges after a pass, and each eviction's answer.
use node_monitor_core::{
    eviction::Decision,
    signals::threshold::{Resource, Threshold, signal_resource},
    signals::{Observations, Signal},
};

use super::backoff::Reaction;
use crate::{
    cluster::actuator::{EvictOutcome, EvictionRequest},
    metrics::{
        ConditionLabels, EvictionLabels, Metrics, OperationLabels, OutcomeLabels, ReasonLabels,
        SignalLabels, SignalUnit, ThresholdLabels,
    },
};

/// The signals' gauges after a pass: each signal's available amount and capacity, each
/// threshold's quantity and whether it is met, each condition's status.
pub(super) fn record(
    metrics: &Metrics,
    thresholds: &[Threshold],
    obs: &Observations,
    decision: &Decision,
) {
    for (signal, o) in &obs.signals {
        let l = SignalLabels {
            eviction_signal: signal.as_str().to_owned(),
        };
        let unit = signal_unit(*signal);
        metrics
            .eviction
            .signal_available
            .unit(unit)
            .get_or_create(&l)
            .set(o.available);
        metrics
            .eviction
            .signal_capacity
            .unit(unit)
            .get_or_create(&l)
            .set(o.capacity);
    }
    for t in thresholds {
        let Some(o) = obs.signals.get(&t.signal) else {
            continue;
        };
        let l = ThresholdLabels {
            eviction_signal: t.signal.as_str().to_owned(),
            kind: if t.is_hard() { "hard" } else { "soft" }.to_owned(),
        };
        metrics
            .eviction
            .eviction_threshold
            .unit(signal_unit(t.signal))
            .get_or_create(&l)
            .set(t.quantity(o.capacity).value());
        let met = decision
            .thresholds_met
            .iter()
            .any(|m| m.signal == t.signal && m.hard == t.is_hard());
        metrics
            .eviction
            .threshold_met
            .get_or_create(&l)
            .set(i64::from(met));
    }
    for c in &decision.conditions {
        metrics
            .eviction
            .node_condition
            .get_or_create(&ConditionLabels {
                condition: c.condition.as_str().to_owned(),
            })
            .set(i64::from(c.status));
    }
}

/// The unit of `signal`'s amounts, which picks its metric families.
pub(crate) fn signal_unit(signal: Signal) -> SignalUnit {
    match signal_resource(signal) {
        Resource::Memory | Resource::EphemeralStorage => SignalUnit::Bytes,
        Resource::Inodes => SignalUnit::Inodes,
        Resource::Pids => SignalUnit::Pids,
    }
}

/// Counts an eviction's answer: by signal, threshold kind and outcome; its failure reason; an
/// API error.
pub(super) fn eviction_answered(
    metrics: &Metrics,
    req: &EvictionRequest,
    outcome: &EvictOutcome,
    reaction: &Reaction,
) {
    metrics
        .eviction
        .evictions
        .get_or_create(&EvictionLabels {
            eviction_signal: req.signal.clone(),
            threshold: if req.hard { "hard" } else { "soft" }.to_owned(),
            outcome: outcome.label().to_owned(),
        })
        .inc();
    if req
        .annotations
        .contains_key(node_monitor_core::eviction::PREDICTED_KEY)
    {
        metrics
            .eviction
            .predicted_evictions
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label().to_owned(),
            })
            .inc();
    }
    if let Some(reason) = reaction.failure {
        metrics
            .eviction
            .eviction_failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }
    if let EvictOutcome::Failed { .. } = outcome {
        metrics
            .api_errors
            .get_or_create(&OperationLabels {
                operation: crate::metrics::ApiOperation::evict,
            })
            .inc();
    }
}

/// The decision's latency, observed and logged.
pub(super) fn decided(
    metrics: &Metrics,
    timed: &crate::sampler::TimedObservations<crate::wakeup::Wakeup>,
    figures: Option<node_monitor_core::eviction::pod_figures::RankFigures>,
    wakeup: crate::wakeup::Wakeup,
    label: &'static str,
    started: std::time::Instant,
) {
    use node_monitor_core::eviction::pod_figures::RankFigures;
    let decided = wakeup.at.elapsed();
    metrics
        .wakeups
        .to_decision_seconds
        .observe(decided.as_secs_f64());
    tracing::debug!(
        source = label,
        decided_us = decided.as_micros() as u64,
        queued_us = started.saturating_duration_since(wakeup.at).as_micros() as u64,
        processing_us = started.elapsed().as_micros() as u64,
        sampling_us = timed.sampling.as_micros() as u64,
        pod_figures_age_ms = match figures {
            Some(RankFigures::Earlier { age }) => age.as_millis() as u64,
            _ => 0,
        },
        "decision"
    );
}
