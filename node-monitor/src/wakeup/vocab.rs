//! The wake-up vocabulary: what woke the agent, which sources there are and what state each is
//! in, and the PSI trigger to arm.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use serde::Serialize;

use crate::sampler::{SampleKind, Trigger, parse::MemoryEvents};

/// What the eBPF adapter saw (the kinds of its kernel events).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelWakeKind {
    OomKill,
    ReclaimStall,
    KswapdWake,
    Reboot,
    /// The memory push: a CPU's page growth reached the batch armed near a memory threshold.
    MemoryGrowth,
}

impl KernelWakeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OomKill => "oom_kill",
            Self::ReclaimStall => "reclaim_stall",
            Self::KswapdWake => "kswapd_wake",
            Self::Reboot => "reboot",
            Self::MemoryGrowth => "memory_growth",
        }
    }
}

/// Which memory cgroup a memcg threshold watches (the core's arming vocabulary).
pub use node_monitor_core::arming::MemcgTarget;

/// What woke the sampler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WakeSource {
    Kernel(KernelWakeKind),
    /// A cgroup v1 memory threshold was crossed (either way) at `usage_bytes`.
    MemcgThreshold {
        target: MemcgTarget,
        usage_bytes: u64,
    },
    /// The node cgroup hit its memory limit and went OOM (cgroup v1 `memory.oom_control`).
    MemcgOom,
    /// cgroup v2 `memory.events` changed; the counter increases since the previous change.
    MemoryEvents(MemoryEvents),
    /// A PSI memory trigger fired.
    Psi,
    Housekeeping,
}

impl WakeSource {
    pub fn kind(&self) -> SourceKind {
        match self {
            Self::Kernel(_) => SourceKind::Kernel,
            Self::MemcgThreshold { .. } => SourceKind::MemcgThreshold,
            Self::MemcgOom => SourceKind::MemcgOom,
            Self::MemoryEvents(_) => SourceKind::MemoryEvents,
            Self::Psi => SourceKind::Psi,
            Self::Housekeeping => SourceKind::Housekeeping,
        }
    }

    /// A metric label: the source kind, with the kernel event kind for eBPF wake-ups
    /// (`kernel_oom_kill`, `memcg_threshold`, `psi`, …).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Kernel(KernelWakeKind::OomKill) => "kernel_oom_kill",
            Self::Kernel(KernelWakeKind::ReclaimStall) => "kernel_reclaim_stall",
            Self::Kernel(KernelWakeKind::KswapdWake) => "kernel_kswapd_wake",
            Self::Kernel(KernelWakeKind::Reboot) => "kernel_reboot",
            Self::Kernel(KernelWakeKind::MemoryGrowth) => "kernel_memory_growth",
            other => other.kind().as_str(),
        }
    }
}

/// One wake-up: its source and when it was delivered (monotonic clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wakeup {
    pub source: WakeSource,
    pub at: Instant,
}

/// The kinds of wake-up source, for [`super::Wakeups::source_states`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Kernel,
    MemcgThreshold,
    MemcgOom,
    MemoryEvents,
    Psi,
    Housekeeping,
}

impl SourceKind {
    pub const ALL: [SourceKind; 6] = [
        Self::Kernel,
        Self::MemcgThreshold,
        Self::MemcgOom,
        Self::MemoryEvents,
        Self::Psi,
        Self::Housekeeping,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::MemcgThreshold => "memcg_threshold",
            Self::MemcgOom => "memcg_oom",
            Self::MemoryEvents => "memory_events",
            Self::Psi => "psi",
            Self::Housekeeping => "housekeeping",
        }
    }
}

/// Whether a source is working.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SourceState {
    /// Armed and delivering; `detail` says what is watched.
    Armed { detail: String },
    /// Not working (cannot be armed here, or stopped); `reason` says why.
    Unavailable { reason: String },
    /// Turned off by configuration.
    Disabled,
}

impl SourceState {
    pub fn is_armed(&self) -> bool {
        matches!(self, Self::Armed { .. })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceStatus {
    pub source: SourceKind,
    #[serde(flatten)]
    pub state: SourceState,
}

/// Where a file-backed source reads from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceSetting {
    Path(PathBuf),
    /// This host cannot have the source; the reason is reported as the source's state.
    NotApplicable(String),
    Disabled,
}

/// PSI stall kind: `some` (at least one task stalled) or `full` (all non-idle tasks stalled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PsiKind {
    Some,
    Full,
}

/// A PSI trigger: fire when tasks stalled on memory for `stall` within a `window`
/// (<https://docs.kernel.org/accounting/psi.html#monitoring-for-pressure-thresholds>).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PsiTrigger {
    pub kind: PsiKind,
    pub stall: Duration,
    /// At most 10 s (kernels before 6.4 also want at least 500 ms). Without CAP_SYS_RESOURCE
    /// the kernel accepts only multiples of 2 s; another window falls back to 2 s with a
    /// warning.
    pub window: Duration,
}

impl Default for PsiTrigger {
    /// The kernel documentation's example: 150 ms of partial stall within 1 s.
    fn default() -> Self {
        Self {
            kind: PsiKind::Some,
            stall: Duration::from_millis(150),
            window: Duration::from_secs(1),
        }
    }
}
impl Trigger for Wakeup {
    fn at(&self) -> Instant {
        self.at
    }

    /// Housekeeping wake-ups ask for a full pass (the disk cadence); the others for a fast one,
    /// which the sampler promotes to full once its full-sample interval has passed.
    fn pass(&self) -> SampleKind {
        match self.source {
            WakeSource::Housekeeping => SampleKind::Full,
            _ => SampleKind::Fast,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn housekeeping_asks_for_a_full_pass_the_others_for_a_fast_one() {
        let at = Instant::now();
        let wake = |source| Wakeup { source, at };
        assert_eq!(wake(WakeSource::Housekeeping).pass(), SampleKind::Full);
        assert_eq!(wake(WakeSource::Housekeeping).at(), at);
        for source in [
            WakeSource::Kernel(KernelWakeKind::OomKill),
            WakeSource::MemcgThreshold {
                target: MemcgTarget::Allocatable,
                usage_bytes: 1,
            },
            WakeSource::MemcgOom,
            WakeSource::MemoryEvents(MemoryEvents::default()),
            WakeSource::Psi,
        ] {
            assert_eq!(wake(source).pass(), SampleKind::Fast, "{source:?}");
        }
    }
}
