//! The OOM flight recorder: the trajectory of the node's memory in the seconds before each OOM
//! kill and each eviction, kept cheaply in memory.
//!
//! The agent hands the recorder one [`Sample`] per pass of its loop (the signals and thresholds
//! it observed, the top pods' working sets from the pod figures it already holds, PSI, the
//! kernel's reclaim stalls and kswapd wake-ups since the previous pass, what it decided) and
//! each [`FlightEvent`] as it happens. Samples and events older than [`WINDOW`] are dropped;
//! an OOM kill or an eviction freezes the window into a [`FlightRecord`], which keeps taking
//! samples and events for [`TAIL`] after its trigger (how the node recovered, what the agent
//! did next). A trigger while a record is still open joins that record. Everything is bounded:
//! [`SAMPLES_KEPT`] samples and [`EVENTS_KEPT`] events in the window, [`RECORDS_KEPT`] records of
//! at most [`RECORD_SAMPLES_BEFORE`] + [`RECORD_SAMPLES_AFTER`] samples and [`RECORD_EVENTS`]
//! events.
//!
//! Pure: time comes in as milliseconds since the Unix epoch, with each sample and event.
use std::{collections::VecDeque, sync::Arc};

use serde::{Deserialize, Serialize};

pub use self::sample::{PodPoint, PredictionPoint, PsiPoint, Sample, SignalPoint};

mod sample;

/// How far back a record reaches before its trigger, in milliseconds.
pub const WINDOW_MS: u64 = 30_000;
/// [`WINDOW_MS`] as a duration, for the docs.
pub const WINDOW: std::time::Duration = std::time::Duration::from_millis(WINDOW_MS);
/// How long a record keeps taking samples and events after its trigger, in milliseconds.
pub const TAIL_MS: u64 = 5_000;
/// [`TAIL_MS`] as a duration.
pub const TAIL: std::time::Duration = std::time::Duration::from_millis(TAIL_MS);
/// Samples kept in the window (the agent samples at most every 100 ms under pressure: 30 s of
/// them at that pace; slower paces keep the whole window).
pub const SAMPLES_KEPT: usize = 300;
/// Events kept in the window (kernel events are rate-limited in the kernel).
pub const EVENTS_KEPT: usize = 256;
/// Records kept; the oldest goes first.
pub const RECORDS_KEPT: usize = 16;
/// Passes within the same slot of this many milliseconds (since the epoch) share one sample:
/// the latest stands for the slot, so the window spans [`WINDOW_MS`] whatever the loop's pace
/// (at most [`SAMPLES_KEPT`] samples).
pub const MIN_SPACING_MS: u64 = 100;

fn same_slot(a_ms: u64, b_ms: u64) -> bool {
    a_ms / MIN_SPACING_MS == b_ms / MIN_SPACING_MS
}
/// Samples a record keeps from before its trigger: the newest half of them as sampled, the
/// older ones thinned evenly over the rest of the window (see [`thin`]).
pub const RECORD_SAMPLES_BEFORE: usize = 120;
/// Samples a record takes in its tail: at least this many, and no more than bring it to
/// [`RECORD_SAMPLES_BEFORE`] + [`RECORD_SAMPLES_AFTER`].
pub const RECORD_SAMPLES_AFTER: usize = 50;
/// Events a record keeps, at most (those of the window, then those of the tail).
pub const RECORD_EVENTS: usize = EVENTS_KEPT + 64;
/// Pods kept per sample, largest working set first.
pub const TOP_PODS: usize = 5;

/// What happened, as the recorder keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventKind {
    /// The kernel's OOM killer killed a process.
    OomKill {
        /// `namespace/name` (or the pod UID, or empty when not a pod's).
        pod: String,
        /// The victim's command.
        comm: String,
        /// The victim's pid.
        pid: u32,
        /// A node-wide OOM (`true`), one in a cgroup's limit (`false`), unknown (`None`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        global: Option<bool>,
    },
    /// The agent asked for an eviction, and the answer.
    Eviction {
        /// `namespace/name`.
        pod: String,
        /// The signal that drove it.
        signal: String,
        /// As in `node_monitor_evictions_total{outcome}`: `evicted`, `dry_run`, `pdb_blocked`…
        outcome: String,
    },
    /// A task stalled in direct reclaim beyond the probe's budget.
    ReclaimStall {
        /// The cgroup's pod, or empty.
        pod: String,
        /// Time stalled in the probe's window, nanoseconds.
        stall_ns: u64,
    },
    /// kswapd was woken.
    KswapdWake {
        /// Wake-ups the kernel's rate limit withheld before this one.
        suppressed: u32,
    },
    /// A threshold turned met (`true`) or no longer met (`false`).
    Threshold {
        /// `memory.available hard`.
        threshold: String,
        /// Met from now on.
        met: bool,
    },
}

/// An event with its time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlightEvent {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

impl FlightEvent {
    /// An OOM kill or an eviction: freezes a record.
    pub fn triggers(&self) -> bool {
        matches!(
            self.kind,
            EventKind::OomKill { .. } | EventKind::Eviction { .. }
        )
    }
}

/// One OOM kill or eviction (and those that joined it), with the trajectory before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlightRecord {
    /// Numbered from 0, continued across the agent's restarts when records are restored
    /// ([`FlightRecorder::restore`]).
    pub id: u64,
    /// The first trigger (an `oom_kill` or `eviction` event).
    pub trigger: FlightEvent,
    /// The record takes samples and events until then (the trigger plus [`TAIL_MS`]).
    pub until_ms: u64,
    /// Samples from [`WINDOW_MS`] before the trigger to `until_ms`, oldest first.
    pub samples: Vec<Sample>,
    /// Events in the same span, oldest first (the trigger and any that joined it included).
    pub events: Vec<FlightEvent>,
    /// Whether the agent was in dry run.
    #[serde(default)]
    pub dry_run: bool,
}

impl FlightRecord {
    /// Why the agent did or did not act before the trigger, in one sentence.
    pub fn verdict(&self) -> String {
        verdict(self)
    }
}

/// The recorder's state.
#[derive(Debug, Clone, Default)]
pub struct FlightRecorder {
    samples: VecDeque<Sample>,
    events: VecDeque<FlightEvent>,
    /// Shared with readers ([`FlightRecorder::shared_records`]): a record still in its tail is
    /// copied on write only while a reader holds it.
    records: VecDeque<Arc<FlightRecord>>,
    next_id: u64,
    /// The thresholds met in the last sample, to record their crossings.
    met: Vec<String>,
    dry_run: bool,
    /// The newest record as last reported due for persisting, and whether its tail had closed.
    persisted: Option<(u64, bool)>,
}

impl FlightRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the agent runs in dry run (noted in the records).
    pub fn set_dry_run(&mut self, dry_run: bool) {
        self.dry_run = dry_run;
    }

    /// One pass of the agent's loop. A threshold that turns met or no longer met is recorded
    /// as an event at the sample's time. Beyond the [`TOP_PODS`] largest, the sample keeps the
    /// pods whose OOM kills a record still open at its time holds ([`Self::open_oom_pods`]).
    pub fn sample(&mut self, mut sample: Sample) {
        sample
            .top_pods
            .sort_by_key(|p| std::cmp::Reverse(p.working_set));
        if sample.top_pods.len() > TOP_PODS {
            let keep = self.open_oom_pods(sample.at_ms);
            let mut rank = 0;
            sample.top_pods.retain(|p| {
                rank += 1;
                rank <= TOP_PODS || keep.contains(&p.pod)
            });
        }
        let at = sample.at_ms;
        let crossed: Vec<FlightEvent> = sample
            .thresholds_met
            .iter()
            .filter(|t| !self.met.contains(t))
            .map(|t| (t, true))
            .chain(
                self.met
                    .iter()
                    .filter(|t| !sample.thresholds_met.contains(t))
                    .map(|t| (t, false)),
            )
            .map(|(t, met)| FlightEvent {
                at_ms: at,
                kind: EventKind::Threshold {
                    threshold: t.clone(),
                    met,
                },
            })
            .collect();
        self.met.clone_from(&sample.thresholds_met);
        for e in crossed {
            self.event(e);
        }
        for r in self.records.iter_mut().filter(|r| at <= r.until_ms) {
            let r = Arc::make_mut(r);
            let (trigger, room) = (
                r.trigger.at_ms,
                r.samples.len() < RECORD_SAMPLES_BEFORE + RECORD_SAMPLES_AFTER,
            );
            match r.samples.last_mut() {
                // Within the spacing of a tail sample: the latest stands (one before the
                // trigger is kept as it was frozen).
                Some(last) if same_slot(last.at_ms, at) && last.at_ms > trigger => {
                    *last = sample.clone();
                }
                _ if room => r.samples.push(sample.clone()),
                _ => {}
            }
        }
        match self.samples.back_mut() {
            // Faster than the spacing: the latest pass stands for the interval.
            Some(last) if same_slot(last.at_ms, at) => *last = sample,
            _ => {
                if self.samples.len() >= SAMPLES_KEPT {
                    self.samples.pop_front();
                }
                self.samples.push_back(sample);
            }
        }
        self.forget_before(at);
    }

    /// An event: an OOM kill or an eviction freezes the window into a record, or joins the
    /// record still open.
    pub fn event(&mut self, event: FlightEvent) {
        let at = event.at_ms;
        let open = self.records.iter_mut().rev().find(|r| at <= r.until_ms);
        match open {
            Some(r) => {
                if r.events.len() < RECORD_EVENTS {
                    Arc::make_mut(r).events.push(event.clone());
                }
            }
            None if event.triggers() => {
                let from = at.saturating_sub(WINDOW_MS);
                let mut events: Vec<FlightEvent> = self
                    .events
                    .iter()
                    .filter(|e| e.at_ms >= from)
                    .cloned()
                    .collect();
                events.push(event.clone());
                let record = FlightRecord {
                    id: self.next_id,
                    trigger: event.clone(),
                    until_ms: at + TAIL_MS,
                    samples: thin(
                        self.samples.iter().filter(|s| s.at_ms >= from).collect(),
                        RECORD_SAMPLES_BEFORE,
                    ),
                    events,
                    dry_run: self.dry_run,
                };
                self.next_id += 1;
                if self.records.len() >= RECORDS_KEPT {
                    self.records.pop_front();
                }
                self.records.push_back(Arc::new(record));
            }
            None => {}
        }
        if self.events.len() >= EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back(event);
        self.forget_before(at);
    }

    /// The pods (`namespace/name` or UID) of the OOM kills that records still open at `at_ms`
    /// hold (their triggers and the kills that joined them).
    pub fn open_oom_pods(&self, at_ms: u64) -> Vec<String> {
        let mut pods: Vec<String> = Vec::new();
        for r in self.records.iter().filter(|r| at_ms <= r.until_ms) {
            for e in &r.events {
                if let EventKind::OomKill { pod, .. } = &e.kind
                    && !pod.is_empty()
                    && !pods.contains(pod)
                {
                    pods.push(pod.clone());
                }
            }
        }
        pods
    }

    /// Adds `pod`'s working set, read in the pass of the sample at `sample_ms`, to that sample
    /// where it did not make the [`TOP_PODS`] (the pod an OOM kill reported after the pass that
    /// read the pods): in the window and in every record holding that sample. Returns whether
    /// the sample was found without it.
    pub fn add_pod_to_sample(&mut self, sample_ms: u64, pod: &PodPoint) -> bool {
        let add = |s: &mut Sample| {
            if s.at_ms == sample_ms && !s.top_pods.iter().any(|p| p.pod == pod.pod) {
                s.top_pods.push(pod.clone());
                true
            } else {
                false
            }
        };
        let mut added = false;
        if let Some(s) = self.samples.iter_mut().rev().find(|s| s.at_ms == sample_ms) {
            added |= add(s);
        }
        for r in &mut self.records {
            if r.samples.iter().any(|s| s.at_ms == sample_ms) {
                for s in &mut Arc::make_mut(r).samples {
                    added |= add(s);
                }
            }
        }
        added
    }

    /// The records, oldest first.
    pub fn records(&self) -> impl DoubleEndedIterator<Item = &FlightRecord> {
        self.records.iter().map(|r| &**r)
    }

    /// The records, oldest first, shared: a reader that serializes them holds no lock of the
    /// recorder's owner meanwhile, and copies nothing.
    pub fn shared_records(&self) -> Vec<Arc<FlightRecord>> {
        self.records.iter().cloned().collect()
    }

    /// Records of an earlier run (oldest first), put before the records of this one; the
    /// newest [`RECORDS_KEPT`] of all are kept and numbering continues after the highest id.
    /// Restored records are not reported by [`FlightRecorder::persist_due`] again.
    pub fn restore(&mut self, mut records: Vec<FlightRecord>) {
        records.sort_by_key(|r| (r.trigger.at_ms, r.id));
        if let Some(max) = records.iter().map(|r| r.id).max() {
            self.next_id = self.next_id.max(max + 1);
        }
        let mut all: VecDeque<Arc<FlightRecord>> = records.into_iter().map(Arc::new).collect();
        all.extend(self.records.drain(..));
        while all.len() > RECORDS_KEPT {
            all.pop_front();
        }
        self.records = all;
        if self.persisted.is_none() {
            self.persisted = self.records.back().map(|r| (r.id, true));
        }
    }

    /// Whether the records changed in a way worth writing to disk since the last time this
    /// said so: a record was frozen, or the newest record's tail has ended by `now_ms` (so at
    /// most two writes per record, none while nothing happens).
    pub fn persist_due(&mut self, now_ms: u64) -> bool {
        let Some(newest) = self.records.back() else {
            return false;
        };
        let current = (newest.id, now_ms > newest.until_ms);
        if self.persisted == Some(current) {
            return false;
        }
        self.persisted = Some(current);
        true
    }

    /// Whether the newest record's tail is still open after its frozen part was reported due:
    /// a stop now would lose the tail's samples unless the records are written once more.
    pub fn tail_unwritten(&self) -> bool {
        match (self.records.back(), self.persisted) {
            (Some(newest), Some((id, false))) => newest.id == id,
            _ => false,
        }
    }

    /// How many records are kept.
    pub fn record_count(&self) -> usize {
        self.records.len()
    }

    /// The heap the recorder holds, approximately, in bytes (for its gauge and the benchmarks).
    pub fn approx_bytes(&self) -> usize {
        let samples = |s: &Sample| {
            size_of::<Sample>()
                + s.signals
                    .iter()
                    .map(|p| size_of::<SignalPoint>() + p.signal.len())
                    .sum::<usize>()
                + s.top_pods
                    .iter()
                    .map(|p| size_of::<PodPoint>() + p.pod.len())
                    .sum::<usize>()
                + s.thresholds_met
                    .iter()
                    .chain(&s.evict)
                    .map(|t| size_of::<String>() + t.len())
                    .sum::<usize>()
        };
        let events = |_: &FlightEvent| size_of::<FlightEvent>() + 64;
        self.samples.iter().map(samples).sum::<usize>()
            + self.events.iter().map(events).sum::<usize>()
            + self
                .records
                .iter()
                .map(|r| {
                    size_of::<FlightRecord>()
                        + r.samples.iter().map(samples).sum::<usize>()
                        + r.events.iter().map(events).sum::<usize>()
                })
                .sum::<usize>()
    }

    /// Drops samples and events that no record could reach back to any more.
    fn forget_before(&mut self, now_ms: u64) {
        let from = now_ms.saturating_sub(WINDOW_MS);
        while self.samples.front().is_some_and(|s| s.at_ms < from) {
            self.samples.pop_front();
        }
        while self.events.front().is_some_and(|e| e.at_ms < from) {
            self.events.pop_front();
        }
    }
}

/// At most `max` of `samples` (oldest first): the newest `max / 2` as they are, and the older
/// ones thinned evenly (the oldest kept), so that a record covers its whole window at a bounded
/// size whatever the sampling pace. Pure.
pub fn thin(samples: Vec<&Sample>, max: usize) -> Vec<Sample> {
    if samples.len() <= max {
        return samples.into_iter().cloned().collect();
    }
    let recent = max / 2;
    let (older, newest) = samples.split_at(samples.len() - recent);
    let picks = max - recent;
    (0..picks)
        .map(|i| older[i * older.len() / picks])
        .chain(newest.iter().copied())
        .cloned()
        .collect()
}

/// Why the agent did or did not act before the record's trigger.
fn verdict(r: &FlightRecord) -> String {
    let at = r.trigger.at_ms;
    let before: Vec<&FlightEvent> = r.events.iter().filter(|e| e.at_ms <= at).collect();
    let evictions: Vec<(&str, &str)> = before
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Eviction { pod, outcome, .. } => Some((pod.as_str(), outcome.as_str())),
            _ => None,
        })
        .collect();
    let crossed = before
        .iter()
        .find(|e| matches!(&e.kind, EventKind::Threshold { met: true, .. }));
    let met_in_samples = r
        .samples
        .iter()
        .filter(|s| s.at_ms <= at)
        .any(|s| !s.thresholds_met.is_empty());
    if let EventKind::Eviction { pod, outcome, .. } = &r.trigger.kind {
        return match outcome.as_str() {
            "evicted" => format!("node-monitor evicted {pod}"),
            "dry_run" => format!("dry run: node-monitor would have evicted {pod}"),
            "pdb_blocked" => {
                format!("node-monitor tried to evict {pod}; a PodDisruptionBudget refused it")
            }
            other => format!("node-monitor tried to evict {pod}: {other}"),
        };
    }
    let global = match &r.trigger.kind {
        EventKind::OomKill { global, .. } => *global,
        _ => None,
    };
    if let Some((pod, outcome)) = evictions.last() {
        return match *outcome {
            "evicted" => format!("node-monitor evicted {pod} before the kill, not in time"),
            "dry_run" => format!("dry run: node-monitor would have evicted {pod} before the kill"),
            "pdb_blocked" => {
                format!("node-monitor tried to evict {pod}; a PodDisruptionBudget refused it")
            }
            other => format!("node-monitor tried to evict {pod}: {other}"),
        };
    }
    if crossed.is_some() || met_in_samples {
        return "a threshold was met but no pod was evicted (grace period not elapsed, no \
                candidate, or evictions held)"
            .to_owned();
    }
    if global == Some(false) {
        return "the kill was in a cgroup's own limit: no node threshold was met, node-level \
                eviction does not apply"
            .to_owned();
    }
    if r.samples.iter().all(|s| s.at_ms > at) {
        return "no sample before the kill: the agent had not observed the node yet".to_owned();
    }
    "no threshold was met before the kill: the node's memory never fell below a threshold"
        .to_owned()
}

/// `2026-11-26T20:15:03.123Z` for milliseconds since the epoch: the node API's time format.
pub fn utc(ms: u64) -> String {
    let ts = i64::try_from(ms)
        .ok()
        .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    ts.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

#[cfg(test)]
mod tests;
