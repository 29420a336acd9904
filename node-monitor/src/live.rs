//! What the agent shows of itself on its authorized endpoints (docs/cli.md): the last decision
//! with the observations it was made on, the recent evictions, and a bounded buffer of recent
//! attributed kernel events. The decision loop and the kernel-event task write here; the HTTP
//! handlers read. Every buffer is bounded; a poisoned lock loses the view, never the agent.
use std::{
    collections::VecDeque,
    path::PathBuf,
    sync::Mutex,
    time::{SystemTime, UNIX_EPOCH},
};

use serde_json::{Value, json};

use node_monitor_core::{
    config::EvictionConfig,
    contract::{
        ConditionStatus, EvictionEntry, FlightAnswer, StatusAnswer, ThresholdStatus, TraceAnswer,
    },
    eviction::Decision,
    flight::{EventKind, FlightEvent, FlightRecord, FlightRecorder, PodPoint, Sample, WINDOW_MS},
    signals::Observations,
    signals::threshold::Threshold,
};

/// Recent evictions kept for `status`.
pub const EVICTIONS_KEPT: usize = 32;
/// This agent's version and commit, as its status answer reports them.
pub const AGENT_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("NODE_MONITOR_COMMIT"),
    ")"
);
/// Recent kernel events kept for `trace`.
pub const TRACE_EVENTS_KEPT: usize = 1024;
/// The most events one `trace` answer carries (the contract).
pub use node_monitor_core::contract::TRACE_PAGE_MAX;

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One threshold with the signal it watches, as last observed.
#[derive(Debug, Clone, PartialEq)]
struct ThresholdSeen {
    signal: String,
    hard: bool,
    value: String,
    grace_period_seconds: f64,
    /// `None`: the signal was not observed.
    observed: Option<(i64, i64, i64, bool)>,
}

/// The last cycle, as the endpoints show it.
#[derive(Debug, Clone)]
struct LastCycle {
    at_ms: u64,
    thresholds: Vec<ThresholdSeen>,
    decision: Decision,
}

/// One eviction request and its answer.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionRecord {
    pub at_ms: u64,
    pub namespace: String,
    pub name: String,
    pub signal: String,
    pub hard: bool,
    /// The answer, as in `node_monitor_evictions_total{outcome}`.
    pub outcome: String,
    pub message: String,
}

impl EvictionRecord {
    /// The record of `req` answered with `outcome`, now.
    pub fn answered(
        req: &crate::cluster::actuator::EvictionRequest,
        outcome: &crate::cluster::actuator::EvictOutcome,
    ) -> Self {
        Self {
            at_ms: unix_ms(),
            namespace: req.namespace.clone(),
            name: req.name.clone(),
            signal: req.signal.clone(),
            hard: req.hard,
            outcome: outcome.label().to_owned(),
            message: req.message.clone(),
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Shared with readers: an answer is built after the lock is released, so the decision
    /// loop never waits on a node-API reader.
    last: Option<std::sync::Arc<LastCycle>>,
    warnings: Vec<String>,
    memory_working_set: node_monitor_core::signals::MemoryWorkingSet,
    dry_run: bool,
    evictions: VecDeque<EvictionRecord>,
    trace: TraceBuffer,
    /// The OOM flight recorder: the trajectory before each OOM kill and eviction.
    flight: FlightRecorder,
    /// The PSI file the flight recorder's samples read.
    psi_path: Option<PathBuf>,
    /// Where frozen flight records go to survive a restart (`nodeMonitor.stateDir`).
    flight_writer: Option<crate::flight::store::FlightWriter>,
    /// Every pod's working set as read by the latest pass that read the pods, with that pass's
    /// sample time: the figure of a pod an OOM kill reports after that pass.
    flight_pass_pods: Option<(u64, Vec<PodPoint>)>,
}

impl Inner {
    /// Hands the flight records to the writer when a record froze or its tail ended.
    fn persist_flight(&mut self, now_ms: u64) {
        if let Some(w) = &self.flight_writer
            && self.flight.persist_due(now_ms)
        {
            w.submit(self.flight.shared_records());
        }
    }
}

/// The agent's live view; shared between the loop and the HTTP handlers.
#[derive(Debug)]
pub struct LiveView {
    node: String,
    inner: Mutex<Inner>,
    /// What holds on this node.
    pub guarantees: guarantees::GuaranteeBoard,
}

/// A bounded ring of kernel events, each numbered in arrival order.
#[derive(Debug)]
pub struct TraceBuffer {
    events: VecDeque<(u64, Value)>,
    next: u64,
    capacity: usize,
}

impl Default for TraceBuffer {
    fn default() -> Self {
        Self::with_capacity(TRACE_EVENTS_KEPT)
    }
}

/// A page of the trace buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePage {
    /// The events numbered `since` and after, oldest first, at most the page size.
    pub events: Vec<Value>,
    /// The number to ask from next time.
    pub next: u64,
    /// Events after `since` that the buffer no longer holds (overwritten before this read).
    pub missed: u64,
}

impl TraceBuffer {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            events: VecDeque::with_capacity(capacity.min(64)),
            next: 0,
            capacity: capacity.max(1),
        }
    }

    /// Adds an event (the oldest goes when full); returns its number.
    pub fn push(&mut self, event: Value) -> u64 {
        if self.events.len() >= self.capacity {
            self.events.pop_front();
        }
        let seq = self.next;
        self.events.push_back((seq, event));
        self.next += 1;
        seq
    }

    /// The events numbered `since` and after, at most `limit` of them.
    pub fn page(&self, since: u64, limit: usize) -> TracePage {
        let oldest = self.events.front().map_or(self.next, |(s, _)| *s);
        // A number beyond the buffer's (a reader of an earlier run of the agent) missed nothing.
        let missed = if since > self.next {
            0
        } else {
            oldest.saturating_sub(since)
        };
        let events: Vec<Value> = self
            .events
            .iter()
            .filter(|(s, _)| *s >= since)
            .take(limit)
            .map(|(s, e)| {
                let mut e = e.clone();
                if let Value::Object(m) = &mut e {
                    m.insert("seq".into(), json!(s));
                }
                e
            })
            .collect();
        let next = events
            .last()
            .and_then(|e| e.get("seq"))
            .and_then(Value::as_u64)
            .map_or(self.next, |s| s + 1);
        TracePage {
            events,
            next,
            missed,
        }
    }
}

impl LiveView {
    pub fn new(node: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            inner: Mutex::new(Inner::default()),
            guarantees: guarantees::GuaranteeBoard::default(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// The configuration's warnings and mode, once at start.
    pub fn set_config(&self, config: &EvictionConfig) {
        if let Ok(mut i) = self.inner.lock() {
            i.warnings.clone_from(&config.warnings);
            i.dry_run = config.node_monitor.dry_run;
            i.memory_working_set = config.node_monitor.memory_working_set;
            i.flight.set_dry_run(config.node_monitor.dry_run);
        }
    }

    /// A cycle's observations and decision.
    pub fn record_cycle(&self, config: &EvictionConfig, obs: &Observations, decision: &Decision) {
        let thresholds = config
            .thresholds
            .iter()
            .map(|t| threshold_seen(t, obs))
            .collect();
        let last = LastCycle {
            at_ms: unix_ms(),
            thresholds,
            decision: decision.clone(),
        };
        if let Ok(mut i) = self.inner.lock() {
            i.last = Some(std::sync::Arc::new(last));
        }
    }

    /// An eviction request and its answer.
    pub fn record_eviction(&self, record: EvictionRecord) {
        if let Ok(mut i) = self.inner.lock() {
            let at_ms = record.at_ms;
            i.flight.event(FlightEvent {
                at_ms: record.at_ms,
                kind: EventKind::Eviction {
                    pod: format!("{}/{}", record.namespace, record.name),
                    signal: record.signal.clone(),
                    outcome: record.outcome.clone(),
                },
            });
            i.persist_flight(at_ms);
            if i.evictions.len() >= EVICTIONS_KEPT {
                i.evictions.pop_front();
            }
            i.evictions.push_back(record);
        }
    }

    /// An attributed kernel event (a `node-monitor trace` JSON object).
    pub fn record_event(&self, mut event: Value) {
        if let Value::Object(m) = &mut event {
            m.insert("received_at_ms".into(), json!(unix_ms()));
        }
        if let Ok(mut i) = self.inner.lock() {
            i.trace.push(event);
        }
    }

    /// The PSI file the flight recorder's samples read (`None`: none).
    pub fn set_psi_path(&self, path: Option<PathBuf>) {
        if let Ok(mut i) = self.inner.lock() {
            i.psi_path = path;
        }
    }

    /// The PSI file the flight recorder's samples read.
    pub fn psi_path(&self) -> Option<PathBuf> {
        self.inner.lock().ok().and_then(|i| i.psi_path.clone())
    }

    /// One pass of the loop for the flight recorder; returns the records kept and the bytes the
    /// recorder holds.
    pub fn flight_sample(&self, sample: Sample) -> (usize, usize) {
        self.flight_sample_with_pods(sample, None)
    }

    /// [`LiveView::flight_sample`] for a pass that read every pod (`read_now`: each pod's
    /// working set): the pods of OOM kills in open records are kept in the sample whatever their
    /// rank, and the figures are held for a kill reported after this pass.
    pub fn flight_sample_with_pods(
        &self,
        mut sample: Sample,
        read_now: Option<Vec<PodPoint>>,
    ) -> (usize, usize) {
        self.inner.lock().map_or((0, 0), |mut i| {
            let at_ms = sample.at_ms;
            if let Some(all) = &read_now {
                let keep = i.flight.open_oom_pods(at_ms);
                for p in all.iter().filter(|p| keep.contains(&p.pod)) {
                    if !sample.top_pods.iter().any(|q| q.pod == p.pod) {
                        sample.top_pods.push(p.clone());
                    }
                }
            }
            i.flight.sample(sample);
            if let Some(all) = read_now {
                i.flight_pass_pods = Some((at_ms, all));
            }
            i.persist_flight(at_ms);
            (i.flight.record_count(), i.flight.approx_bytes())
        })
    }

    /// A kernel event for the flight recorder (an OOM kill freezes a record).
    pub fn flight_event(&self, event: FlightEvent) {
        if let Ok(mut i) = self.inner.lock() {
            let at_ms = event.at_ms;
            // The pass woken by this kill may have read the pods before the kill was reported
            // here: its sample gets the killed pod's figure if it did not make the top pods.
            let read = match (&event.kind, &i.flight_pass_pods) {
                (EventKind::OomKill { pod, .. }, Some((read_ms, all)))
                    if !pod.is_empty() && *read_ms + WINDOW_MS >= at_ms =>
                {
                    all.iter()
                        .find(|p| &p.pod == pod)
                        .map(|p| (*read_ms, p.clone()))
                }
                _ => None,
            };
            i.flight.event(event);
            if let Some((read_ms, p)) = read {
                i.flight.add_pod_to_sample(read_ms, &p);
            }
            i.persist_flight(at_ms);
        }
    }

    /// Restores the flight records of an earlier run (oldest first) and hands the records to
    /// `writer` from now on, whenever one freezes or its tail ends.
    pub fn persist_flight(
        &self,
        restored: Vec<FlightRecord>,
        writer: crate::flight::store::FlightWriter,
    ) {
        if let Ok(mut i) = self.inner.lock() {
            i.flight.restore(restored);
            i.flight_writer = Some(writer);
        }
    }

    /// At a stop: writes the records once more when the newest one's tail is still open (its
    /// frozen part alone is on disk), and waits, at most `bound`, for the writer. Blocking.
    /// `None` without a state directory; otherwise whether everything reached the disk.
    pub fn flush_flight(&self, bound: std::time::Duration) -> Option<bool> {
        let writer = {
            let i = self.inner.lock().ok()?;
            let w = i.flight_writer.clone()?;
            if i.flight.tail_unwritten() {
                w.submit(i.flight.shared_records());
            }
            w
        };
        Some(writer.flush(bound))
    }

    /// The `flight` answer: the records, newest first, each with its verdict.
    pub fn flight(&self) -> Value {
        serde_json::to_value(self.flight_answer()).unwrap_or(Value::Null)
    }

    /// The `flight` answer, typed ([`FlightAnswer`]).
    pub fn flight_answer(&self) -> FlightAnswer {
        // Shared, not copied, and serialized after the lock is released: the loop's next
        // eviction record never waits on a reader.
        let shared = self
            .inner
            .lock()
            .map(|i| i.flight.shared_records())
            .unwrap_or_default();
        FlightAnswer {
            node: self.node.clone(),
            window_seconds: WINDOW_MS / 1000,
            tail_seconds: node_monitor_core::flight::TAIL_MS / 1000,
            capacity: node_monitor_core::flight::RECORDS_KEPT,
            records: shared
                .iter()
                .rev()
                .map(|r| crate::flight::record_json(r, &self.node))
                .collect(),
        }
    }

    /// The trace buffer's events from `since`, at most `limit` (capped at [`TRACE_PAGE_MAX`]).
    pub fn trace(&self, since: u64, limit: usize) -> Value {
        serde_json::to_value(self.trace_answer(since, limit)).unwrap_or(Value::Null)
    }

    /// The `trace` answer, typed ([`TraceAnswer`]).
    pub fn trace_answer(&self, since: u64, limit: usize) -> TraceAnswer {
        let page = self
            .inner
            .lock()
            .map(|i| i.trace.page(since, limit.min(TRACE_PAGE_MAX)))
            .unwrap_or(TracePage {
                events: Vec::new(),
                next: since,
                missed: 0,
            });
        TraceAnswer {
            node: self.node.clone(),
            next: page.next,
            missed: page.missed,
            capacity: TRACE_EVENTS_KEPT,
            events: page.events,
        }
    }

    /// The `status` answer; `ready`, `readiness` and `degraded` come from the health state.
    pub fn status(&self, ready: bool, readiness: &str, degraded: &[String]) -> Value {
        serde_json::to_value(self.status_answer(ready, readiness, degraded)).unwrap_or(Value::Null)
    }

    /// The `status` answer, typed ([`StatusAnswer`]).
    pub fn status_answer(&self, ready: bool, readiness: &str, degraded: &[String]) -> StatusAnswer {
        // What the answer needs, taken under the lock (an Arc and the small lists); the answer
        // is built after it is released.
        let Ok((last, evictions, warnings, dry_run)) = self.inner.lock().map(|i| {
            (
                i.last.clone(),
                i.evictions.clone(),
                i.warnings.clone(),
                i.dry_run,
            )
        }) else {
            return StatusAnswer {
                node: self.node.clone(),
                error: Some("the agent's view is unavailable".to_owned()),
                ..StatusAnswer::default()
            };
        };
        let (observed_at_ms, thresholds, conditions) = match &last {
            Some(last) => (
                Some(last.at_ms),
                last.thresholds.iter().map(threshold_status).collect(),
                last.decision
                    .conditions
                    .iter()
                    .map(|c| ConditionStatus {
                        type_: c.condition.as_str().to_owned(),
                        status: c.status,
                        observed_now: c.observed_now,
                        transition_remaining_seconds: c.transition_remaining_seconds,
                    })
                    .collect(),
            ),
            None => (None, Vec::new(), Vec::new()),
        };
        StatusAnswer {
            node: self.node.clone(),
            error: None,
            dry_run,
            ready,
            readiness: readiness.to_owned(),
            degraded: degraded.to_vec(),
            observed_at_ms,
            thresholds,
            conditions,
            recent_evictions: evictions.iter().rev().map(eviction_entry).collect(),
            warnings,
            guarantees: node_monitor_core::guarantees::to_json(&self.guarantees.assessment()),
            agent_version: AGENT_VERSION.to_owned(),
        }
    }

    /// The `explain` answer: the last decision, worded as `node-monitor explain` words it, with
    /// the node and when it was observed; `None` before the first cycle.
    pub fn explain(&self) -> Option<Value> {
        // Taken under the lock, built after it.
        let (last, warnings, memory_working_set, dry_run) = {
            let i = self.inner.lock().ok()?;
            (
                i.last.clone()?,
                i.warnings.clone(),
                i.memory_working_set,
                i.dry_run,
            )
        };
        let mut out = node_monitor_core::eviction::explain_json(
            &last.decision,
            std::time::Duration::ZERO,
            &[],
            &warnings,
            memory_working_set,
        )
        .ok()?;
        if let Value::Object(m) = &mut out {
            m.insert("node".into(), json!(self.node));
            m.insert("observed_at_ms".into(), json!(last.at_ms));
            m.insert("dry_run".into(), json!(dry_run));
        }
        Some(out)
    }
}

fn threshold_seen(t: &Threshold, obs: &Observations) -> ThresholdSeen {
    ThresholdSeen {
        signal: t.signal.as_str().to_owned(),
        hard: t.is_hard(),
        value: t.value.to_string(),
        grace_period_seconds: t.grace_period.as_secs_f64(),
        observed: obs.signals.get(&t.signal).map(|o| {
            let quantity = t.quantity(o.capacity).value();
            (o.available, o.capacity, quantity, t.is_met(o, false))
        }),
    }
}

fn threshold_status(t: &ThresholdSeen) -> ThresholdStatus {
    let mut out = ThresholdStatus {
        signal: t.signal.clone(),
        kind: if t.hard { "hard" } else { "soft" }.to_owned(),
        value: t.value.clone(),
        grace_period_seconds: t.grace_period_seconds,
        ..ThresholdStatus::default()
    };
    if let Some((available, capacity, quantity, met)) = t.observed {
        out.available = Some(available);
        out.capacity = Some(capacity);
        out.threshold = Some(quantity);
        out.headroom = Some(available.saturating_sub(quantity));
        out.met = Some(met);
    }
    out
}

fn eviction_entry(e: &EvictionRecord) -> EvictionEntry {
    EvictionEntry {
        at_ms: e.at_ms,
        namespace: e.namespace.clone(),
        name: e.name.clone(),
        signal: e.signal.clone(),
        kind: if e.hard { "hard" } else { "soft" }.to_owned(),
        outcome: e.outcome.clone(),
        message: e.message.clone(),
    }
}

pub mod guarantees;

#[cfg(test)]
mod tests;
