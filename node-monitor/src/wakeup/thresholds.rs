//! cgroup v1 memcg thresholds: eventfds on `memory.usage_in_bytes` of the node and kubepods
//! cgroups, re-armed as the page cache outside the working set moves (`inactive_file`, as the
//! kubelet's `memoryThresholdNotifier`; plus reclaimable active file pages with
//! `memoryWorkingSet: reclaimable`).

use std::{collections::BTreeMap, path::Path, time::Instant};

use serde::Serialize;
use tokio::{io::Interest, task::JoinHandle};

use crate::sampler::{ErrorChain, memcg_usage_threshold};

use super::{
    notify,
    sink::Sink,
    vocab::{MemcgTarget, SourceKind, SourceSetting, SourceState, WakeSource},
};

/// An armed memcg threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArmedThreshold {
    pub target: MemcgTarget,
    /// The eviction threshold on `available`, in bytes.
    pub available_threshold: u64,
    /// Where it sits on `memory.usage_in_bytes`.
    pub usage_bytes: u64,
    #[serde(skip)]
    pub armed_at: Instant,
}

#[derive(Debug)]
struct ArmedTask {
    view: ArmedThreshold,
    task: JoinHandle<()>,
}

/// The armed memcg thresholds of both targets. Dropping it disarms them.
#[derive(Debug)]
pub(super) struct MemcgThresholds {
    node: SourceSetting,
    kubepods: SourceSetting,
    /// Threshold moves smaller than this do not re-arm.
    tolerance: u64,
    armed: Vec<ArmedTask>,
    /// Why the last arming of a target failed, by target.
    arm_errors: BTreeMap<MemcgTarget, String>,
}

impl MemcgThresholds {
    pub(super) fn new(node: SourceSetting, kubepods: SourceSetting, tolerance: u64) -> Self {
        Self {
            node,
            kubepods,
            tolerance,
            armed: Vec::new(),
            arm_errors: BTreeMap::new(),
        }
    }

    /// The source's state before anything was armed.
    pub(super) fn initial_state(&self) -> SourceState {
        match (&self.node, &self.kubepods) {
            (SourceSetting::NotApplicable(r), _) => SourceState::Unavailable { reason: r.clone() },
            (SourceSetting::Disabled, SourceSetting::Disabled) => SourceState::Disabled,
            _ => SourceState::Unavailable {
                reason: "no memory thresholds armed yet".into(),
            },
        }
    }

    pub(super) fn armed(&self) -> Vec<ArmedThreshold> {
        self.armed.iter().map(|a| a.view).collect()
    }

    /// Arms `thresholds` (on `available`, in bytes) on `target`'s cgroup; see
    /// [`super::Wakeups::arm_memory_thresholds`]. Must run inside the tokio runtime. Updates the
    /// source's state in `sink`.
    pub(super) fn arm(
        &mut self,
        sink: &Sink,
        target: MemcgTarget,
        thresholds: &[u64],
        capacity: u64,
        outside: u64,
    ) {
        let setting = match target {
            MemcgTarget::Node => &self.node,
            MemcgTarget::Allocatable => &self.kubepods,
        };
        let SourceSetting::Path(dir) = setting else {
            return;
        };
        let tolerance = self.tolerance;
        let level = |t: u64| memcg_usage_threshold(capacity, t, outside);
        // The common case on every pass: nothing moved. Checked without allocating.
        let mine = || self.armed.iter().filter(|a| a.view.target == target);
        let unchanged = !self.arm_errors.contains_key(&target)
            && thresholds.iter().all(|&t| {
                mine().any(|a| {
                    a.view.available_threshold == t
                        && a.view.usage_bytes.abs_diff(level(t)) <= tolerance
                })
            })
            && mine().all(|a| thresholds.contains(&a.view.available_threshold));
        if unchanged {
            return;
        }

        let dir = dir.clone();
        let mut keep: Vec<ArmedTask> = Vec::new();
        let mut error = None;
        let (mine, others): (Vec<ArmedTask>, Vec<ArmedTask>) = std::mem::take(&mut self.armed)
            .into_iter()
            .partition(|a| a.view.target == target);
        let mut mine: Vec<Option<ArmedTask>> = mine.into_iter().map(Some).collect();
        let mut wanted: Vec<u64> = thresholds.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        for t in wanted {
            let level = level(t);
            let existing = mine
                .iter_mut()
                .find(|a| a.as_ref().is_some_and(|a| a.view.available_threshold == t))
                .and_then(Option::take);
            match existing {
                Some(a) if a.view.usage_bytes.abs_diff(level) <= tolerance => keep.push(a),
                old => match arm_one(sink, &dir, target, t, level) {
                    Ok(new) => {
                        if let Some(old) = old {
                            old.task.abort();
                        }
                        keep.push(new);
                    }
                    Err(e) => {
                        // Keep the old registration (if any): a stale level still wakes.
                        if let Some(old) = old {
                            keep.push(old);
                        }
                        error.get_or_insert(e);
                    }
                },
            }
        }
        for a in mine.into_iter().flatten() {
            a.task.abort();
        }
        self.armed = others;
        self.armed.extend(keep);
        match error {
            Some(e) => {
                let reason = ErrorChain(&e).to_string();
                // Logged when it starts failing or fails differently, not on every pass.
                if self.arm_errors.get(&target) != Some(&reason) {
                    tracing::warn!(target_cgroup = ?target, %reason, "memcg threshold not armed");
                }
                self.arm_errors.insert(target, reason);
            }
            None => {
                if self.arm_errors.remove(&target).is_some() {
                    tracing::info!(target_cgroup = ?target, "memcg thresholds armed again");
                }
            }
        }
        sink.set_state(SourceKind::MemcgThreshold, self.threshold_state());
    }

    /// The memcg threshold source's state: armed when any threshold is, with the failures of
    /// the other target (if any) in the detail.
    fn threshold_state(&self) -> SourceState {
        let errors = self
            .arm_errors
            .iter()
            .map(|(t, r)| format!("{t:?}: {r}"))
            .collect::<Vec<_>>()
            .join("; ");
        if self.armed.is_empty() {
            return SourceState::Unavailable {
                reason: if errors.is_empty() {
                    "no memory thresholds armed".into()
                } else {
                    errors
                },
            };
        }
        let mut detail = self
            .armed
            .iter()
            .map(|a| {
                format!(
                    "{:?}: usage {} (available < {})",
                    a.view.target, a.view.usage_bytes, a.view.available_threshold
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        if !errors.is_empty() {
            detail.push_str("; not armed: ");
            detail.push_str(&errors);
        }
        SourceState::Armed { detail }
    }
}

fn arm_one(
    sink: &Sink,
    dir: &Path,
    target: MemcgTarget,
    available_threshold: u64,
    usage_bytes: u64,
) -> Result<ArmedTask, notify::ArmError> {
    let efd = notify::memcg_eventfd(dir, "memory.usage_in_bytes", Some(usage_bytes))?;
    let fd = notify::async_fd(efd, Interest::READABLE)?;
    let source = WakeSource::MemcgThreshold {
        target,
        usage_bytes,
    };
    let task = tokio::spawn(notify::eventfd_task(fd, source, sink.clone()));
    tracing::debug!(
        ?target,
        usage_bytes,
        available_threshold,
        "memcg threshold armed"
    );
    Ok(ArmedTask {
        view: ArmedThreshold {
            target,
            available_threshold,
            usage_bytes,
            armed_at: Instant::now(),
        },
        task,
    })
}

impl Drop for MemcgThresholds {
    fn drop(&mut self) {
        for a in &self.armed {
            a.task.abort();
        }
    }
}
