//! The eviction decision: the kubelet's `synchronize` (`pkg/kubelet/eviction/eviction_manager.go`)
//! as a pure function over a small state, observations, pods and `now`.
//!
//! The pipeline, step by step as in the kubelet:
//! 1. thresholds met by the observations (`thresholdsMet`, ignoring minimum reclaim), merged
//!    with the thresholds acted on last time whose minimum reclaim is not yet reached;
//! 2. when each was first observed (`thresholdsFirstObservedAt`);
//! 3. node conditions, held for the pressure transition period after they were last observed
//!    (`nodeConditionsLastObservedAt`, `nodeConditionsObservedSince`);
//! 4. thresholds whose grace period has elapsed (`thresholdsMetGracePeriod`);
//! 5. the threshold to reclaim for (`byEvictionPriority`, `getReclaimableThreshold`);
//! 6. pods ranked for its resource ([`rank`]) and the evictions, critical pods skipped.
//!
//! Differences, all deliberate:
//! - The kubelet orders thresholds of equal eviction priority by Go map iteration (random);
//!   here memory comes first, then disk, then PIDs, hard before soft, then signal order.
//! - The kubelet evicts one pod per cycle. `maxPodsPerCycle` may allow more; extra pods are
//!   evicted only until their usage covers the shortfall to threshold plus minimum reclaim.
//! - Node-level reclaim (image and container garbage collection) is left to the kubelet, which
//!   still runs on the node; observation timestamps are not tracked (every sample counts as
//!   fresh, as the kubelet treats observations without a time). The disk a pod evicted for disk
//!   pressure still holds until that collection is credited back by the caller
//!   ([`reclaim`]), so no second pod is evicted for it.

pub mod conditions;
pub mod headroom;
pub mod local_storage;
pub mod pod_figures;
pub mod predict;
pub mod rank;
pub mod reclaim;

use std::{collections::BTreeMap, time::Duration};

use crate::{
    config::EvictionConfig,
    eviction::predict::{Prediction, Trend},
    eviction::rank::{DiskShare, RankedPod, rank_pods_by},
    kubelet::pod::PodInfo,
    signals::threshold::{
        NodeConditionType, Resource, Threshold, ThresholdKey, ThresholdSource, signal_condition,
        signal_resource,
    },
    signals::{Observations, Signal, SignalObservation},
    units::clock::Timestamp,
    units::quantity::Quantity,
};

pub use self::{
    message::eviction_message,
    report::{
        ConditionReport, Decision, Eviction, MetReason, ReclaimReport, ThresholdReport,
        explain_json,
    },
    schedule::{
        DRY_RUN_REPORT_INTERVAL, MIN_TIMER_INTERVAL, ReportLimiter, next_grace_deadline, next_timer,
    },
};

mod message;
mod report;
mod schedule;

/// The kubelet's grace period for hard evictions (`immediateEvictionGracePeriodSeconds`). Never
/// zero: through the API a zero grace period is a force delete.
pub const HARD_EVICTION_GRACE_PERIOD_SECONDS: i64 = 1;
/// The status reason of an evicted pod.
pub const EVICTION_REASON: &str = "Evicted";
/// Event annotation (`OffendingContainersKey`): the containers using more than their request,
/// comma-separated.
pub const OFFENDING_CONTAINERS_KEY: &str = "offending_containers";
/// Event annotation (`OffendingContainersUsageKey`): their usage, comma-separated, in the same
/// order.
pub const OFFENDING_CONTAINERS_USAGE_KEY: &str = "offending_containers_usage";
/// Event annotation (`OffendingPodKey`): the pod's name, when a pod-level memory request is set.
pub const OFFENDING_POD_KEY: &str = "offending_pod";
/// Event annotation (`OffendingPodUsageKey`): the pod's memory usage, with the pod-level request.
pub const OFFENDING_POD_USAGE_KEY: &str = "offending_pod_usage";
/// Event annotation (`StarvedResourceKey`): the resource reclaimed (`memory`, …).
pub const STARVED_RESOURCE_KEY: &str = "starved_resource";
/// Event annotation of node-monitor's own: a predicted eviction's rate, headroom, time to
/// exhaustion and lead ([`predict::Prediction::annotation`]).
pub const PREDICTED_KEY: &str = "node-monitor.io/predicted";

/// What the eviction manager remembers between decisions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvictionState {
    /// `thresholdsFirstObservedAt`.
    first_observed: BTreeMap<ThresholdKey, Timestamp>,
    /// `nodeConditionsLastObservedAt`.
    conditions_last_observed: BTreeMap<NodeConditionType, Timestamp>,
    /// `nodeConditions`: the conditions currently reported.
    conditions: Vec<NodeConditionType>,
    /// `thresholdsMet`: thresholds acted on last time (grace periods elapsed), kept until their
    /// minimum reclaim is reached.
    thresholds_met: Vec<ThresholdKey>,
    /// The kernel headroom's recent fall, for predictive eviction.
    trend: Trend,
}

impl EvictionState {
    /// The state of a fresh start: nothing observed, no condition reported.
    pub fn new() -> Self {
        Self::default()
    }

    /// The pressure conditions currently reported.
    pub fn conditions(&self) -> &[NodeConditionType] {
        &self.conditions
    }

    /// Whether `condition` is currently reported.
    pub fn has_condition(&self, condition: NodeConditionType) -> bool {
        self.conditions.contains(&condition)
    }

    /// Whether `observations` at `now` would meet a threshold by prediction (without recording
    /// them): the caller reads the pods' figures for the ranking that follows.
    pub fn predicts(
        &self,
        config: &EvictionConfig,
        observations: &Observations,
        now: Timestamp,
    ) -> bool {
        let mut trend = self.trend.clone();
        trend.observe(
            now,
            observations.kernel_headroom,
            memory_capacity(observations),
        );
        trend
            .predict(predict::PredictionPolicy::of(&config.node_monitor))
            .is_some()
    }

    /// The predictor's lead now: the configured one, or the median of the recent evictions.
    pub fn prediction_lead(&self, config: &EvictionConfig) -> Duration {
        self.trend
            .lead(predict::PredictionPolicy::of(&config.node_monitor))
    }

    /// Records that an eviction took effect, and how long it took from its request to the pod's
    /// cgroup gone when that was seen (`None`: the wait ended otherwise). The fall it answered is
    /// over: the predictor starts again from the next sample, so that a fall measured before the
    /// victim's memory came back never predicts another eviction ([`predict::Trend::restart`]).
    /// The lead follows the median of the measured times ([`predict::Trend::lead`]).
    pub fn note_eviction(&mut self, took: Option<Duration>) {
        if let Some(took) = took {
            self.trend.note_exit(took);
        }
        self.trend.restart();
    }
}

/// One eviction-manager pass. Updates `state` and returns what to do and why.
pub fn synchronize(
    state: &mut EvictionState,
    config: &EvictionConfig,
    observations: &Observations,
    pods: &[PodInfo],
    now: Timestamp,
) -> Decision {
    // 0. The prediction: is the kernel's OOM point nearer than an eviction's lead?
    state.trend.observe(
        now,
        observations.kernel_headroom,
        memory_capacity(observations),
    );
    let prediction = state
        .trend
        .predict(predict::PredictionPolicy::of(&config.node_monitor));

    // 1. Thresholds met, ignoring grace periods; then those not yet past their minimum reclaim;
    // then the hard `memory.available` thresholds a prediction meets.
    let (met, unobserved_signals) = thresholds_met(state, config, observations, prediction);
    let prediction = prediction.filter(|_| {
        met.iter()
            .any(|(_, reason)| *reason == MetReason::Predicted)
    });

    // 2. First observed.
    let first_observed: BTreeMap<ThresholdKey, Timestamp> = met
        .iter()
        .map(|(t, _)| {
            let key = t.key();
            (key, state.first_observed.get(&key).copied().unwrap_or(now))
        })
        .collect();

    // 3. Conditions, with the transition period.
    let conditions = ConditionObservation::new(
        &state.conditions_last_observed,
        config.pressure_transition_period,
        &met,
        now,
    );

    // 4. Grace periods.
    let elapsed = |t: &Threshold| {
        let at = first_observed.get(&t.key()).copied().unwrap_or(now);
        now.saturating_since(at) >= t.grace_period
    };
    let mut acting: Vec<&Threshold> = met.iter().map(|(t, _)| *t).filter(|t| elapsed(t)).collect();

    let mut decision = Decision {
        thresholds_met: threshold_reports(&met, &first_observed, observations, now),
        conditions: conditions.reports(now),
        reclaim: None,
        ranked: Vec::new(),
        evict: Vec::new(),
        unobserved_signals,
        prediction,
    };

    // Update the state.
    state.first_observed = first_observed;
    state.conditions_last_observed = conditions.last_observed;
    state.conditions = conditions.reported;
    state.thresholds_met = acting.iter().map(|t| t.key()).collect();

    // 5. The threshold to reclaim for.
    acting.sort_by_key(|t| eviction_priority(t));
    let Some(threshold) = acting.first().copied() else {
        return decision;
    };
    let Some(obs) = observations.signals.get(&threshold.signal) else {
        return decision;
    };
    // A predicted threshold reclaims for `memory.available` one lead from now.
    let predicted = met
        .iter()
        .any(|(t, r)| t.key() == threshold.key() && *r == MetReason::Predicted);
    let projected = SignalObservation {
        available: prediction
            .filter(|_| predicted)
            .map_or(obs.available, |p| p.projected(obs.available)),
        capacity: obs.capacity,
    };
    let (report, mut reclaim) = reclaim_for(threshold, &projected);
    reclaim.prediction = prediction.filter(|_| predicted);
    decision.reclaim = Some(report);
    if pods.is_empty() {
        return decision;
    }

    // 6. Rank and evict.
    let disk = DiskShare::for_signal(threshold.signal, observations.filesystem);
    let ranked = rank_pods_by(reclaim.resource, disk, pods, &observations.pods);
    decision.evict = evictions(config, &reclaim, &acting, &ranked, pods, observations);
    decision.ranked = ranked;
    decision
}

/// The capacity `memory.available` is a share of (0 when not observed).
fn memory_capacity(observations: &Observations) -> i64 {
    observations
        .signals
        .get(&Signal::MemoryAvailable)
        .map_or(0, |o| o.capacity)
}

/// Step 1: the thresholds met by `observations` (ignoring grace periods), then those acted on
/// last time whose minimum reclaim is not yet reached; and the configured signals with no
/// observation.
fn thresholds_met<'c>(
    state: &EvictionState,
    config: &'c EvictionConfig,
    observations: &Observations,
    prediction: Option<Prediction>,
) -> (Vec<(&'c Threshold, MetReason)>, Vec<Signal>) {
    let mut unobserved_signals: Vec<Signal> = Vec::new();
    let mut met: Vec<(&Threshold, MetReason)> = Vec::new();
    for t in &config.thresholds {
        match observations.signals.get(&t.signal) {
            Some(obs) if t.is_met(obs, false) => met.push((t, MetReason::BelowThreshold)),
            Some(_) => {}
            None => {
                if !unobserved_signals.contains(&t.signal) {
                    unobserved_signals.push(t.signal);
                }
            }
        }
    }
    for key in &state.thresholds_met {
        let Some(t) = config.threshold(*key) else {
            continue;
        };
        if met.iter().any(|(m, _)| m.key() == *key) {
            continue;
        }
        if let Some(obs) = observations.signals.get(&t.signal)
            && t.is_met(obs, true)
        {
            met.push((t, MetReason::MinimumReclaimPending));
        }
    }
    if prediction.is_some() {
        for t in &config.thresholds {
            if t.signal == Signal::MemoryAvailable
                && t.is_hard()
                && observations.signals.contains_key(&t.signal)
                && !met.iter().any(|(m, _)| m.key() == t.key())
            {
                met.push((t, MetReason::Predicted));
            }
        }
    }
    (met, unobserved_signals)
}

/// Step 3: the pressure conditions observed now, when each was last observed, and those reported
/// (observed within the pressure transition period).
struct ConditionObservation {
    observed_now: Vec<NodeConditionType>,
    last_observed: BTreeMap<NodeConditionType, Timestamp>,
    reported: Vec<NodeConditionType>,
    period: Duration,
}

impl ConditionObservation {
    fn new(
        last_observed: &BTreeMap<NodeConditionType, Timestamp>,
        period: Duration,
        met: &[(&Threshold, MetReason)],
        now: Timestamp,
    ) -> Self {
        let mut observed_now: Vec<NodeConditionType> = Vec::new();
        // A predicted threshold counts: the node was within one eviction of the OOM killer.
        for (t, _) in met {
            let c = signal_condition(t.signal);
            if !observed_now.contains(&c) {
                observed_now.push(c);
            }
        }
        let mut last_observed = last_observed.clone();
        for c in &observed_now {
            last_observed.insert(*c, now);
        }
        let reported: Vec<NodeConditionType> = NodeConditionType::ALL
            .into_iter()
            .filter(|c| {
                last_observed
                    .get(c)
                    .is_some_and(|at| now.saturating_since(*at) < period)
            })
            .collect();
        Self {
            observed_now,
            last_observed,
            reported,
            period,
        }
    }

    /// Every condition the eviction manager owns, reported or not.
    fn reports(&self, now: Timestamp) -> Vec<ConditionReport> {
        NodeConditionType::ALL
            .into_iter()
            .map(|c| {
                let status = self.reported.contains(&c);
                let now_seen = self.observed_now.contains(&c);
                let remaining = (status && !now_seen)
                    .then(|| self.last_observed.get(&c))
                    .flatten()
                    .map(|at| {
                        self.period
                            .saturating_sub(now.saturating_since(*at))
                            .as_secs_f64()
                    });
                ConditionReport {
                    condition: c,
                    status,
                    observed_now: now_seen,
                    transition_remaining_seconds: remaining,
                }
            })
            .collect()
    }
}

/// Every threshold met, with its grace status.
fn threshold_reports(
    met: &[(&Threshold, MetReason)],
    first_observed: &BTreeMap<ThresholdKey, Timestamp>,
    observations: &Observations,
    now: Timestamp,
) -> Vec<ThresholdReport> {
    met.iter()
        .filter_map(|(t, reason)| {
            let obs = observations.signals.get(&t.signal)?;
            let since = first_observed.get(&t.key()).copied().unwrap_or(now);
            let met_for = now.saturating_since(since);
            Some(ThresholdReport {
                signal: t.signal,
                source: t.source,
                hard: t.is_hard(),
                operator: t.operator,
                value: t.value.to_string(),
                quantity: t.quantity(obs.capacity).value(),
                available: obs.available,
                capacity: obs.capacity,
                min_reclaim: t.min_reclaim_quantity(obs.capacity).map(|q| q.value()),
                reason: *reason,
                grace_period_seconds: t.grace_period.as_secs_f64(),
                met_for_seconds: met_for.as_secs_f64(),
                grace_period_elapsed: met_for >= t.grace_period,
                grace_remaining_seconds: t.grace_period.saturating_sub(met_for).as_secs_f64(),
            })
        })
        .collect()
}

/// The threshold reclaimed for, with what is to be reclaimed.
struct Reclaim<'c> {
    threshold: &'c Threshold,
    resource: Resource,
    /// Threshold plus minimum reclaim minus available, nano-units.
    shortfall_nanos: i128,
    /// The prediction the threshold is met by, if it is not crossed yet.
    prediction: Option<Prediction>,
}

/// Step 5: what reclaiming for `threshold` takes, given its observation.
fn reclaim_for<'c>(
    threshold: &'c Threshold,
    obs: &SignalObservation,
) -> (ReclaimReport, Reclaim<'c>) {
    let resource = signal_resource(threshold.signal);
    let quantity = threshold.quantity(obs.capacity);
    let min_reclaim = threshold.min_reclaim_quantity(obs.capacity);
    let mut target = quantity.clone();
    if let Some(m) = &min_reclaim {
        target.add(m);
    }
    let shortfall_nanos = target.nanos() - i128::from(obs.available) * 1_000_000_000;
    let report = ReclaimReport {
        signal: threshold.signal,
        resource,
        source: threshold.source,
        hard: threshold.is_hard(),
        quantity: quantity.value(),
        available: obs.available,
        min_reclaim: min_reclaim.as_ref().map(Quantity::value),
        shortfall: ceil_units(shortfall_nanos),
    };
    let reclaim = Reclaim {
        threshold,
        resource,
        shortfall_nanos,
        prediction: None,
    };
    (report, reclaim)
}

/// Step 6: the pods to evict, in rank order: critical pods skipped, at most `maxPodsPerCycle`,
/// and beyond the first only until their usage covers the shortfall.
fn evictions(
    config: &EvictionConfig,
    reclaim: &Reclaim<'_>,
    acting: &[&Threshold],
    ranked: &[RankedPod],
    pods: &[PodInfo],
    observations: &Observations,
) -> Vec<Eviction> {
    let Reclaim {
        threshold,
        resource,
        shortfall_nanos,
        prediction,
    } = *reclaim;
    let max = config.node_monitor.max_pods_per_cycle.max(1) as usize;
    let mut evict = Vec::new();
    let mut reclaimed_nanos: i128 = 0;
    for r in ranked {
        if evict.len() >= max {
            break;
        }
        let pod = &pods[r.index];
        // evictPod refuses critical pods; the kubelet then tries the next one.
        if pod.critical {
            continue;
        }
        let usage = observations.pods.get(&pod.uid);
        let (mut message, mut annotations) =
            eviction_message(resource, pod, usage, acting, observations);
        if let Some(p) = prediction {
            message.push_str(&p.sentence());
            annotations.insert(PREDICTED_KEY.into(), p.annotation());
        }
        evict.push(Eviction {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            grace_period_seconds: eviction_grace_period(
                threshold,
                pod,
                config.max_pod_grace_period_seconds,
            ),
            signal: threshold.signal,
            resource,
            hard: threshold.is_hard(),
            reason: EVICTION_REASON,
            message,
            annotations,
        });
        if max > 1 {
            let freed = usage.and_then(|u| match resource {
                Resource::Memory => u.memory,
                Resource::EphemeralStorage => u.disk,
                Resource::Pids => u.processes,
                // No per-pod inode counts: no estimate, so up to maxPodsPerCycle pods.
                Resource::Inodes => None,
            });
            reclaimed_nanos += i128::from(freed.unwrap_or(0)) * 1_000_000_000;
            if resource != Resource::Inodes && reclaimed_nanos >= shortfall_nanos {
                break;
            }
        }
    }
    evict
}

/// `byEvictionPriority` made total: memory, then disk, then PIDs; hard before soft; signal and
/// source order last.
fn eviction_priority(t: &Threshold) -> (u8, bool, Signal, ThresholdSource) {
    let group = match signal_resource(t.signal) {
        Resource::Memory => 0,
        Resource::EphemeralStorage | Resource::Inodes => 1,
        Resource::Pids => 2,
    };
    (group, !t.is_hard(), t.signal, t.source)
}

/// The grace period the eviction asks for. Hard: the kubelet's immediate 1 s. Soft: the lesser
/// of the pod's `terminationGracePeriodSeconds` and `evictionMaxPodGracePeriod` (current
/// `eviction_manager.go`); the kubelet's pod workers then raise anything below 1 s to 1 s
/// (`calculateEffectiveGracePeriod`), so a zero or negative maximum yields 1 s.
pub fn eviction_grace_period(threshold: &Threshold, pod: &PodInfo, max_pod_grace: i32) -> i64 {
    if threshold.is_hard() {
        return HARD_EVICTION_GRACE_PERIOD_SECONDS;
    }
    let mut grace = i64::from(max_pod_grace);
    if let Some(pod_grace) = pod.termination_grace_period_seconds {
        grace = grace.min(pod_grace);
    }
    grace.max(1)
}

/// Nano-units to base units, rounded up.
fn ceil_units(nanos: i128) -> i64 {
    let units = nanos / 1_000_000_000 + i128::from(nanos % 1_000_000_000 > 0);
    i64::try_from(units).unwrap_or(if units > 0 { i64::MAX } else { i64::MIN })
}

#[cfg(test)]
mod predicted_tests;
#[cfg(test)]
mod tests;
