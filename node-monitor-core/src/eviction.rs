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
//! 6. pods ranked for its resource ([`super::rank`]) and the evictions, critical pods skipped.
//!
//! Differences, all deliberate:
//! - The kubelet orders thresholds of equal eviction priority by Go map iteration (random);
//!   here memory comes first, then disk, then PIDs, hard before soft, then signal order.
//! - The kubelet evicts one pod per cycle. `maxPodsPerCycle` may allow more; extra pods are
//!   evicted only until their usage covers the shortfall to threshold plus minimum reclaim.
//! - Node-level reclaim (image and container garbage collection) is left to the kubelet, which
//!   still runs on the node; observation timestamps are not tracked (every sample counts as
//!   fresh, as the kubelet treats observations without a time).

use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;

use super::{
    clock::Timestamp,
    config::EvictionConfig,
    pod::PodInfo,
    quantity::{Format, Quantity},
    rank::{RankedPod, rank_pods},
    signals::{Observations, PodUsage, Signal, SignalObservation},
    threshold::{
        NodeConditionType, Operator, Resource, Threshold, ThresholdKey, ThresholdSource,
        signal_condition, signal_format, signal_resource,
    },
};

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
}

/// Why a threshold counts as met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MetReason {
    /// The signal is below the threshold.
    BelowThreshold,
    /// The signal is above the threshold but below threshold plus minimum reclaim, and the
    /// threshold was acted on last time.
    MinimumReclaimPending,
}

/// A threshold that is met, with its grace status.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ThresholdReport {
    /// The threshold's signal.
    pub signal: Signal,
    /// Where the threshold comes from.
    pub source: ThresholdSource,
    /// A hard threshold (zero grace period).
    pub hard: bool,
    /// The comparison (always `LessThan`).
    pub operator: Operator,
    /// As configured: `100Mi`, `10%`.
    pub value: String,
    /// The threshold for this observation's capacity, base units.
    pub quantity: i64,
    /// The observed value, base units.
    pub available: i64,
    /// The observed capacity, base units.
    pub capacity: i64,
    /// The minimum reclaim for this capacity, base units.
    pub min_reclaim: Option<i64>,
    /// Why the threshold counts as met.
    pub reason: MetReason,
    /// The configured grace period (0 for hard thresholds).
    pub grace_period_seconds: f64,
    /// Time since the threshold was first observed met.
    pub met_for_seconds: f64,
    /// The grace period has elapsed: the threshold drives eviction.
    pub grace_period_elapsed: bool,
    /// Time left before the grace period elapses (0 once it has).
    pub grace_remaining_seconds: f64,
}

/// A node condition the eviction manager owns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConditionReport {
    /// The condition's type.
    #[serde(rename = "type")]
    pub condition: NodeConditionType,
    /// Reported true: observed within the pressure transition period.
    pub status: bool,
    /// A threshold mapping to this condition is met in this observation.
    pub observed_now: bool,
    /// With `status` true and not observed now: time left before it turns false.
    pub transition_remaining_seconds: Option<f64>,
}

/// The threshold chosen for reclaim.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReclaimReport {
    /// The chosen threshold's signal.
    pub signal: Signal,
    /// The resource reclaimed for that signal.
    pub resource: Resource,
    /// Where the threshold comes from.
    pub source: ThresholdSource,
    /// A hard threshold (zero grace period).
    pub hard: bool,
    /// Threshold, base units.
    pub quantity: i64,
    /// The observed value, base units.
    pub available: i64,
    /// The minimum reclaim, base units.
    pub min_reclaim: Option<i64>,
    /// Threshold plus minimum reclaim minus available, base units.
    pub shortfall: i64,
}

/// One eviction to carry out.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Eviction {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (a precondition of the eviction, so a re-created pod of the same name is
    /// not hit).
    pub uid: String,
    /// Never 0 (a force delete through the API).
    pub grace_period_seconds: i64,
    /// The signal whose threshold drives the eviction.
    pub signal: Signal,
    /// The resource reclaimed.
    pub resource: Resource,
    /// Driven by a hard threshold.
    pub hard: bool,
    /// `Evicted`.
    pub reason: &'static str,
    /// Worded as the kubelet words it.
    pub message: String,
    /// The annotations the kubelet puts on its eviction event.
    pub annotations: BTreeMap<String, String>,
}

/// The outcome of one decision, with its reasons.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Decision {
    /// Every threshold met, grace period elapsed or not.
    pub thresholds_met: Vec<ThresholdReport>,
    /// Every pressure condition, reported or not.
    pub conditions: Vec<ConditionReport>,
    /// The threshold reclaimed for; `None` when no threshold's grace period has elapsed.
    pub reclaim: Option<ReclaimReport>,
    /// Eviction order for the reclaimed resource (empty when nothing is reclaimed).
    pub ranked: Vec<RankedPod>,
    /// The pods to evict, in order (at most `maxPodsPerCycle`; critical pods never).
    pub evict: Vec<Eviction>,
    /// Configured signals with no observation (their thresholds cannot be evaluated).
    pub unobserved_signals: Vec<Signal>,
}

/// One eviction-manager pass. Updates `state` and returns what to do and why.
pub fn synchronize(
    state: &mut EvictionState,
    config: &EvictionConfig,
    observations: &Observations,
    pods: &[PodInfo],
    now: Timestamp,
) -> Decision {
    // 1. Thresholds met, ignoring grace periods; then those not yet past their minimum reclaim.
    let (met, unobserved_signals) = thresholds_met(state, config, observations);

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
    let (report, reclaim) = reclaim_for(threshold, obs);
    decision.reclaim = Some(report);
    if pods.is_empty() {
        return decision;
    }

    // 6. Rank and evict.
    let ranked = rank_pods(reclaim.resource, pods, &observations.pods);
    decision.evict = evictions(config, &reclaim, &acting, &ranked, pods, observations);
    decision.ranked = ranked;
    decision
}

/// Step 1: the thresholds met by `observations` (ignoring grace periods), then those acted on
/// last time whose minimum reclaim is not yet reached; and the configured signals with no
/// observation.
fn thresholds_met<'c>(
    state: &EvictionState,
    config: &'c EvictionConfig,
    observations: &Observations,
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
        let (message, annotations) = eviction_message(resource, pod, usage, acting, observations);
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

/// `evictionMessage`: the kubelet's wording, and its event annotations.
pub fn eviction_message(
    resource: Resource,
    pod: &PodInfo,
    usage: Option<&PodUsage>,
    thresholds: &[&Threshold],
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut annotations = BTreeMap::new();
    let mut message = format!("The node was low on resource: {resource}. ");
    // getThresholdMetInfo: the first threshold for this resource that has an observation.
    if let Some((t, obs)) = thresholds.iter().find_map(|t| {
        (signal_resource(t.signal) == resource)
            .then(|| observations.signals.get(&t.signal).map(|o| (*t, o)))
            .flatten()
    }) {
        let available = Quantity::new(obs.available, signal_format(t.signal));
        message.push_str(&format!(
            "Threshold quantity: {}, available: {available}. ",
            t.quantity(obs.capacity)
        ));
    }
    let Some(usage) = usage else {
        return (message, annotations);
    };
    if resource == Resource::Memory
        && let (Some(request), Some(used)) = (&pod.pod_memory_request, usage.memory)
    {
        let used = bytes(used);
        message.push_str(&format!(
            "Pod {} was using {used}, request is {request}, has larger consumption of {resource}. ",
            pod.name
        ));
        annotations.insert(OFFENDING_POD_KEY.into(), pod.name.clone());
        annotations.insert(OFFENDING_POD_USAGE_KEY.into(), used.to_string());
    }
    let mut offending = Vec::new();
    let mut offending_usage = Vec::new();
    for c in &pod.containers {
        let (used, request) = match resource {
            Resource::Memory => (c.usage.memory, &c.memory_request),
            Resource::EphemeralStorage => (c.usage.disk, &c.ephemeral_storage_request),
            Resource::Inodes | Resource::Pids => (None, &c.memory_request),
        };
        let Some(used) = used.map(bytes) else {
            continue;
        };
        if used > *request {
            message.push_str(&format!(
                "Container {} was using {used}, request is {request}, has larger consumption of {resource}. ",
                c.name
            ));
            offending.push(c.name.clone());
            offending_usage.push(used.to_string());
        }
    }
    annotations.insert(OFFENDING_CONTAINERS_KEY.into(), offending.join(","));
    annotations.insert(
        OFFENDING_CONTAINERS_USAGE_KEY.into(),
        offending_usage.join(","),
    );
    annotations.insert(STARVED_RESOURCE_KEY.into(), resource.to_string());
    (message, annotations)
}

/// Nano-units to base units, rounded up.
fn ceil_units(nanos: i128) -> i64 {
    let units = nanos / 1_000_000_000 + i128::from(nanos % 1_000_000_000 > 0);
    i64::try_from(units).unwrap_or(if units > 0 { i64::MAX } else { i64::MIN })
}

fn bytes(v: u64) -> Quantity {
    Quantity::new(i64::try_from(v).unwrap_or(i64::MAX), Format::BinarySI)
}

/// The shortest delay between a decision and the next one a timer schedules: a timer that is due
/// (or overdue) wakes the loop this long after `now`, never at once, so no state in which every
/// timer stays due can make the loop spin.
pub const MIN_TIMER_INTERVAL: Duration = Duration::from_millis(100);

/// How often a dry run reports the same pod for the same signal (Event and log line): once per
/// this interval, however often the decision repeats.
pub const DRY_RUN_REPORT_INTERVAL: Duration = Duration::from_secs(5 * 60);

/// When the earliest soft threshold still waiting for its grace period will have waited it out,
/// for callers that schedule the next decision; `None` when no soft threshold is waiting. A
/// threshold whose grace period has elapsed is acting: the regular wake-ups (housekeeping,
/// headroom, notifications) decide for it, so it never schedules a timer in the past.
pub fn next_grace_deadline(
    state: &EvictionState,
    config: &EvictionConfig,
    now: Timestamp,
) -> Option<Timestamp> {
    state
        .first_observed
        .iter()
        .filter_map(|(key, at)| {
            let t = config.threshold(*key)?;
            (!t.is_hard()).then(|| *at + t.grace_period)
        })
        .filter(|deadline| *deadline > now)
        .min()
}

/// The next timer wake-up: the earliest of `timers`, never sooner than `min_interval` after
/// `now`. `None` when no timer is set.
pub fn next_timer(
    timers: impl IntoIterator<Item = Option<Timestamp>>,
    now: Timestamp,
    min_interval: Duration,
) -> Option<Timestamp> {
    timers
        .into_iter()
        .flatten()
        .min()
        .map(|t| t.max(now + min_interval))
}

/// Limits repeated reports of the same would-be eviction (a dry run decides the same pod on every
/// wake-up): one per pod and signal per interval. Bounded: entries older than the interval are
/// dropped by [`ReportLimiter::allow`].
#[derive(Debug, Clone)]
pub struct ReportLimiter {
    interval: Duration,
    last: BTreeMap<(String, Signal), Timestamp>,
}

impl ReportLimiter {
    /// A limiter that allows one report per pod and signal per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: BTreeMap::new(),
        }
    }

    /// Whether to report pod `uid` for `signal` at `now`; a `true` counts as the report.
    pub fn allow(&mut self, uid: &str, signal: Signal, now: Timestamp) -> bool {
        let interval = self.interval;
        self.last
            .retain(|_, at| now.saturating_since(*at) < interval);
        let key = (uid.to_owned(), signal);
        if self.last.contains_key(&key) {
            return false;
        }
        self.last.insert(key, now);
        true
    }

    /// The number of pod and signal pairs reported within the interval (as of the last
    /// [`ReportLimiter::allow`]).
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Nothing reported within the interval (as of the last [`ReportLimiter::allow`]).
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

#[cfg(test)]
mod tests;
