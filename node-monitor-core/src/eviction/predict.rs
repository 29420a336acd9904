//! Predictive eviction: acting on `memory.available` before its threshold is crossed, when an
//! eviction made at the crossing would come too late to beat the kernel's OOM killer.
//!
//! A threshold is the wrong tool against a fast ramp. The kubelet's default `memory.available<100Mi`
//! sits, on a small node, at or below the point where the kernel OOM-kills (the kernel's own
//! memory, its watermarks and the page cache it cannot drop are all outside the pods' working
//! sets), and even a threshold above that point is reached too late when the node fills faster
//! than an evicted pod can exit. So, on each pass:
//!
//! - **the headroom** is what the node can still allocate before the kernel must OOM-kill: the
//!   kernel's own `MemAvailable` (free memory above the low watermarks, plus the page cache and
//!   slab it can reclaim), bounded by the node cgroup's headroom where its limit binds
//!   ([`crate::signals::Observations::kernel_headroom`]), less [`oom_floor`];
//! - **the rate** is the headroom's fall, fitted (least squares) over the last [`WINDOW`], and the
//!   peak of those fits since the fall began: near exhaustion the kernel's reclaim slows the
//!   allocator down, which is no reason to wait longer. It counts only a sustained fall: one that
//!   began at least [`MIN_SPAN`] ago, with [`MIN_SAMPLES`] samples in the window, falling by
//!   [`MIN_FALL`] at least and still falling at the newest sample; a rise of more than
//!   [`rise_tolerance`] (memory freed: a sawtooth) or a [`PLATEAU`] ends the fall;
//! - **the lead** is how long an eviction takes to free memory: the request, the kubelet's stop,
//!   the victim's own exit. The configured `predictionLead` at least, or the median of the last
//!   [`EXITS_KEPT`] evictions on this node as the agent measured them (decision to the pod's
//!   cgroup gone), at most [`MAX_LEAD`]: the median, so that one eviction slowed by something
//!   else (a stuck container runtime) does not make every prediction for the next ones earlier.
//!
//! When the time to exhaustion (`headroom / rate`) is at most the lead, waiting any longer lets
//! the kernel act first: the hard `memory.available` thresholds count as met, with the reason
//! `predicted`. The victim is still chosen by the kubelet's ranking; the eviction's message and
//! Event say that it was predicted, with the rate and the estimate. A predicted threshold sets
//! node-monitor's memory pressure condition as a crossing does: the node was within one eviction
//! of the kernel's OOM killer.
//!
//! What is not a fall of the headroom causes nothing: page cache filled by reads is reclaimable,
//! so it is in `MemAvailable`; a burst that stops leaves no rate once it stops; a sawtooth resets
//! the trend on each free. Pure: samples and `now` in, a prediction out.
use std::{collections::VecDeque, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{config::NodeMonitorSettings, units::clock::Timestamp};

/// The span of samples the rate is fitted over.
pub const WINDOW: Duration = Duration::from_secs(2);
/// How long the fall must have lasted before it counts: a burst shorter than this (a process
/// touching its heap at start) predicts nothing, whatever its rate.
pub const MIN_SPAN: Duration = Duration::from_secs(1);
/// The least samples in the window before the fall counts.
pub const MIN_SAMPLES: usize = 3;
/// The lead learnt from past evictions never exceeds this: an eviction made too late, on a node
/// already thrashing, exits slowly, and must not make every later prediction seconds earlier.
pub const MAX_LEAD: Duration = Duration::from_secs(5);
/// How many past evictions' exit times are kept.
pub const EXITS_KEPT: usize = 8;
/// The least fall over the window that counts as a fall, bytes: noise below it is not a trend.
pub const MIN_FALL: i64 = 8 << 20;
/// Over this long, a fall of less than [`PLATEAU_FALL`] is a plateau: the fall has ended.
pub const PLATEAU: Duration = Duration::from_millis(500);
/// See [`PLATEAU`].
pub const PLATEAU_FALL: i64 = 1 << 20;

/// The headroom the kernel does not give to the allocator in practice: where its OOM killer acts
/// while `MemAvailable` still counts some page cache (the mapped pages of running programs,
/// which reclaim only thrashes). A sixty-fourth of the capacity, at least 64 MiB and at most
/// 256 MiB (on a 2 GiB node the kernel OOM-killed with 22–29 MiB of `MemAvailable` left).
pub fn oom_floor(capacity: i64) -> i64 {
    (capacity / 64).clamp(64 << 20, 256 << 20)
}

/// The configured policy (`nodeMonitor.predictiveEviction`, `nodeMonitor.predictionLead`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PredictionPolicy {
    /// Predictive eviction on (the default).
    pub enabled: bool,
    /// The least lead: how long an eviction takes at best to free the victim's memory.
    pub lead: Duration,
}

impl Default for PredictionPolicy {
    fn default() -> Self {
        Self::of(&NodeMonitorSettings::default())
    }
}

impl PredictionPolicy {
    /// The policy `nodeMonitor` sets.
    pub fn of(settings: &NodeMonitorSettings) -> Self {
        Self {
            enabled: settings.predictive_eviction,
            lead: settings.prediction_lead,
        }
    }
}

/// A rise of the headroom larger than this between two samples is memory freed, and ends the
/// trend: a thirty-second of the capacity, at least 4 MiB.
pub fn rise_tolerance(capacity: i64) -> i64 {
    (capacity / 32).max(4 << 20)
}

/// What the predictor remembers between passes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trend {
    /// (time, headroom in bytes), oldest first, within [`WINDOW`] of the newest.
    samples: VecDeque<(Timestamp, i64)>,
    /// Recent evictions' time from the request to the pod's cgroup gone, newest last.
    exits: VecDeque<Duration>,
    /// The fastest fall fitted since this fall began, bytes per second (0: none yet).
    peak: i64,
    /// When this fall began: the sample before its first falling step.
    falling_since: Option<Timestamp>,
    /// The capacity of the last sample.
    capacity: i64,
}

/// A prediction that the kernel's OOM point is nearer than an eviction's lead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prediction {
    /// The headroom's fall, bytes per second.
    pub rate_bytes_per_second: i64,
    /// What the node can still allocate before the kernel must OOM-kill, bytes: the kernel's
    /// headroom less [`oom_floor`].
    pub headroom_bytes: i64,
    /// `headroom / rate`, milliseconds.
    pub exhaustion_ms: u64,
    /// The lead it was compared with, milliseconds.
    pub lead_ms: u64,
}

impl Prediction {
    /// `memory.available` one lead from now at this rate: what the reclaim is sized against.
    pub fn projected(&self, available: i64) -> i64 {
        let fall = i128::from(self.rate_bytes_per_second) * i128::from(self.lead_ms) / 1000;
        i64::try_from(i128::from(available) - fall).unwrap_or(i64::MIN)
    }

    /// The Event annotation's value: `rate=…B/s headroom=…B exhaustion=…ms lead=…ms`.
    pub fn annotation(&self) -> String {
        format!(
            "rate={}B/s headroom={}B exhaustion={}ms lead={}ms",
            self.rate_bytes_per_second, self.headroom_bytes, self.exhaustion_ms, self.lead_ms
        )
    }

    /// The sentence the eviction's message ends with.
    pub fn sentence(&self) -> String {
        format!(
            "Predicted: memory falling at {} MiB/s would reach the kernel's OOM point ({} MiB \
             left) in {:.1}s, within the {:.1}s an eviction takes. ",
            self.rate_bytes_per_second >> 20,
            self.headroom_bytes >> 20,
            self.exhaustion_ms as f64 / 1000.0,
            self.lead_ms as f64 / 1000.0
        )
    }
}

impl Trend {
    /// No sample, no exit time.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one pass's headroom (`None`: not observed, which ends the trend). A sample not
    /// later than the last is ignored (a pass that decides twice on one observation).
    pub fn observe(&mut self, now: Timestamp, headroom: Option<i64>, capacity: i64) {
        let Some(h) = headroom else {
            self.restart();
            return;
        };
        self.capacity = capacity;
        if let Some(&(t, last)) = self.samples.back() {
            if now <= t {
                return;
            }
            if h.saturating_sub(last) > rise_tolerance(capacity) || now.saturating_since(t) > WINDOW
            {
                // Memory freed, or nothing seen for longer than the window (an eviction's wait
                // for cleanup): a new trend from this sample, with no peak from before.
                self.restart();
            } else if h < last && self.falling_since.is_none() {
                self.falling_since = Some(t);
            }
        }
        self.samples.push_back((now, h));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.saturating_since(*t) > WINDOW)
        {
            self.samples.pop_front();
        }
        if self.plateau() {
            self.peak = 0;
            self.falling_since = None;
        } else if let Some(rate) = self.fitted() {
            self.peak = self.peak.max(rate);
        }
    }

    /// Forgets the fall: an eviction took effect, so the fall it answered is over. A fall that
    /// goes on (another pod climbing) counts again once it has lasted [`MIN_SPAN`] from here.
    pub fn restart(&mut self) {
        self.samples.clear();
        self.peak = 0;
        self.falling_since = None;
    }

    /// The headroom fell by less than [`PLATEAU_FALL`] over the last [`PLATEAU`] or more.
    fn plateau(&self) -> bool {
        let Some(&(now, h)) = self.samples.back() else {
            return false;
        };
        self.samples
            .iter()
            .rev()
            .find(|(t, _)| now.saturating_since(*t) >= PLATEAU)
            .is_some_and(|&(_, before)| before.saturating_sub(h) < PLATEAU_FALL)
    }

    /// Records how long an eviction took, from the request to the pod's cgroup gone.
    pub fn note_exit(&mut self, took: Duration) {
        self.exits.push_back(took.min(MAX_LEAD));
        while self.exits.len() > EXITS_KEPT {
            self.exits.pop_front();
        }
    }

    /// The lead: the configured one at least, or the median of the recent exits (the upper
    /// one of an even count), at most [`MAX_LEAD`].
    pub fn lead(&self, policy: PredictionPolicy) -> Duration {
        let mut exits: Vec<Duration> = self.exits.iter().copied().collect();
        exits.sort_unstable();
        let learnt = exits
            .get(exits.len() / 2)
            .copied()
            .unwrap_or(Duration::ZERO);
        policy.lead.max(learnt).min(MAX_LEAD.max(policy.lead))
    }

    /// The headroom's sustained fall in bytes per second, if it is falling now: the fastest
    /// fitted since the fall began.
    pub fn rate(&self) -> Option<i64> {
        self.fitted().map(|r| r.max(self.peak))
    }

    /// The headroom's sustained fall in bytes per second over the window, if there is one.
    fn fitted(&self) -> Option<i64> {
        let (&(first_t, first_h), &(last_t, last_h)) =
            (self.samples.front()?, self.samples.back()?);
        // Still falling at the newest sample: a burst that stopped leaves no rate.
        let previous = self.samples.iter().rev().nth(1).map(|(_, h)| *h)?;
        let lasted = self
            .falling_since
            .is_some_and(|since| last_t.saturating_since(since) >= MIN_SPAN);
        if self.samples.len() < MIN_SAMPLES
            || !lasted
            || first_h.saturating_sub(last_h) < MIN_FALL
            || last_h >= previous
        {
            return None;
        }
        // Least squares over (seconds since the first sample, bytes).
        let n = self.samples.len() as f64;
        let xs = self
            .samples
            .iter()
            .map(|(t, h)| (t.saturating_since(first_t).as_secs_f64(), *h as f64));
        let (sx, sy, sxx, sxy) = xs.fold((0.0, 0.0, 0.0, 0.0), |(sx, sy, sxx, sxy), (x, y)| {
            (sx + x, sy + y, sxx + x * x, sxy + x * y)
        });
        let denominator = n * sxx - sx * sx;
        if denominator <= f64::EPSILON {
            return None;
        }
        let slope = (n * sxy - sx * sy) / denominator;
        // A fall is a negative slope; the cast saturates.
        (slope < 0.0).then(|| (-slope) as i64).filter(|r| *r > 0)
    }

    /// The prediction at the newest sample, when the OOM point is within one lead.
    pub fn predict(&self, policy: PredictionPolicy) -> Option<Prediction> {
        if !policy.enabled {
            return None;
        }
        let rate = self.rate()?;
        let &(_, observed) = self.samples.back()?;
        // What is left before the kernel acts.
        let headroom = observed.saturating_sub(oom_floor(self.capacity));
        let lead = self.lead(policy);
        let exhaustion_ms = if headroom <= 0 {
            0
        } else {
            u64::try_from(i128::from(headroom) * 1000 / i128::from(rate)).unwrap_or(u64::MAX)
        };
        let lead_ms = u64::try_from(lead.as_millis()).unwrap_or(u64::MAX);
        (exhaustion_ms <= lead_ms).then_some(Prediction {
            rate_bytes_per_second: rate,
            headroom_bytes: headroom,
            exhaustion_ms,
            lead_ms,
        })
    }
}

#[cfg(test)]
mod tests;
