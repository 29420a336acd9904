//! What to arm: [`WakeupConfig`], chosen from the sampler's cgroup layout.

use std::time::Duration;

use crate::sampler::{CgroupVersion, Layout};

use super::vocab::{PsiTrigger, SourceSetting};

/// What to arm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WakeupConfig {
    /// Housekeeping tick; the kubelet's default housekeeping interval is 10 s.
    pub housekeeping: Duration,
    /// Pending wake-ups at most; beyond it wake-ups are coalesced (counted, not queued).
    pub queue: usize,
    /// cgroup v1 node memory cgroup: thresholds for `memory.available`, `memory.oom_control`.
    pub memcg_node: SourceSetting,
    /// cgroup v1 kubepods memory cgroup: thresholds for `allocatableMemory.available`.
    pub memcg_kubepods: SourceSetting,
    /// Watch `memory.oom_control` of the node cgroup (cgroup v1).
    pub oom_control: bool,
    /// cgroup v2 `memory.events` to watch.
    pub memory_events: SourceSetting,
    /// PSI file for the trigger.
    pub psi: SourceSetting,
    pub psi_trigger: PsiTrigger,
    /// Threshold moves smaller than this do not re-arm a memcg threshold (the kernel checks
    /// thresholds every 128 page events per CPU, so finer placement is noise).
    pub rearm_tolerance: u64,
}

/// The largest PSI window the kernel accepts (`WINDOW_MAX_US`, kernel/sched/psi.c).
const PSI_WINDOW_MAX: Duration = Duration::from_secs(10);

impl WakeupConfig {
    /// Sources for the sampler's layout:
    /// - cgroup v1: memcg thresholds and `memory.oom_control` on the node (and kubepods)
    ///   cgroups; `memory.events` does not exist;
    /// - cgroup v2: `memory.events` of the node cgroup (of kubepods when the node is the root,
    ///   which has none; it counts every pod's events); memcg thresholds do not exist;
    /// - PSI: the node cgroup's `memory.pressure` on a cgroup2 hierarchy (on a v1 host, the
    ///   hybrid `unified` mount when present). For the root, the root cgroup's own
    ///   `memory.pressure` (the system-wide PSI group, the same figures as
    ///   `/proc/pressure/memory`) when it exists, since a DaemonSet mounts the host's /proc
    ///   read-only and /sys/fs/cgroup read-write, and a trigger is armed by writing; else
    ///   `/proc/pressure/memory`.
    pub fn for_layout(layout: &Layout) -> Self {
        let (memcg_node, memcg_kubepods, memory_events) = match layout.version {
            CgroupVersion::V1 => (
                SourceSetting::Path(layout.node_memory.clone()),
                SourceSetting::Path(layout.kubepods_memory.clone()),
                SourceSetting::NotApplicable(
                    "the memory controller is on cgroup v1; memory.events is a cgroup v2 file"
                        .into(),
                ),
            ),
            CgroupVersion::V2 => {
                let not_v2 = || {
                    SourceSetting::NotApplicable(
                        "cgroup v2 has no memory thresholds (the kubelet disables its memcg \
                         notifier on v2 too); a crossing is seen by adaptive sampling near the \
                         threshold (fastSamplingInterval), since memory.events and PSI report \
                         only limits and stalls"
                            .into(),
                    )
                };
                let events_dir = if layout.node_is_root {
                    &layout.kubepods_memory
                } else {
                    &layout.node_memory
                };
                (
                    not_v2(),
                    not_v2(),
                    SourceSetting::Path(events_dir.join("memory.events")),
                )
            }
        };
        let psi = match (&layout.node_unified, layout.node_is_root) {
            (Some(dir), false) => SourceSetting::Path(dir.join("memory.pressure")),
            (Some(dir), true) if dir.join("memory.pressure").is_file() => {
                SourceSetting::Path(dir.join("memory.pressure"))
            }
            _ => SourceSetting::Path(layout.proc.pressure_memory.clone()),
        };
        Self {
            housekeeping: Duration::from_secs(10),
            queue: 64,
            memcg_node,
            memcg_kubepods,
            oom_control: true,
            memory_events,
            psi,
            psi_trigger: PsiTrigger::default(),
            rearm_tolerance: 1 << 20,
        }
    }

    pub(super) fn validate(&self) -> Result<(), WakeupError> {
        if self.housekeeping.is_zero() {
            return Err(WakeupError::Config {
                field: "housekeeping",
                value: format!("{:?}", self.housekeeping),
                expected: "a positive duration",
            });
        }
        if self.queue == 0 {
            return Err(WakeupError::Config {
                field: "queue",
                value: "0".into(),
                expected: "at least 1",
            });
        }
        let t = &self.psi_trigger;
        if t.window.is_zero() || t.window > PSI_WINDOW_MAX {
            return Err(WakeupError::Config {
                field: "psi_trigger.window",
                value: format!("{:?}", t.window),
                expected: "a positive duration of at most 10s",
            });
        }
        if t.stall.is_zero() || t.stall > t.window {
            return Err(WakeupError::Config {
                field: "psi_trigger.stall",
                value: format!("{:?}", t.stall),
                expected: "positive and at most the window",
            });
        }
        Ok(())
    }
}

/// Why [`super::Wakeups::start`] refused to start. Sources that cannot be armed are not errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WakeupError {
    #[error("wake-up sources need a tokio runtime (call Wakeups::start inside one)")]
    NoRuntime,
    #[error("wake-up config {field} is {value}, expected {expected}")]
    Config {
        field: &'static str,
        value: String,
        expected: &'static str,
    },
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_choose_sources() {
        use crate::sampler::SamplerConfig;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cgroup.controllers"), "memory\n").expect("write");
        let v2_root = SamplerConfig {
            cgroup_root: dir.path().to_path_buf(),
            ..SamplerConfig::default()
        }
        .resolve()
        .expect("resolves");
        let c = WakeupConfig::for_layout(&v2_root);
        assert_eq!(
            c.memory_events,
            SourceSetting::Path(dir.path().join("kubepods/memory.events"))
        );
        // The reason says what sees a crossing instead (measured in the guest: neither
        // memory.events nor PSI reports a plain climb).
        match &c.memcg_node {
            SourceSetting::NotApplicable(reason) => {
                assert!(reason.contains("adaptive sampling"), "{reason}");
            }
            other => panic!("memcg thresholds on cgroup v2: {other:?}"),
        }
        assert_eq!(c.psi, SourceSetting::Path("/proc/pressure/memory".into()));
        let v2_node = SamplerConfig {
            cgroup_root: dir.path().to_path_buf(),
            node_cgroup: "sim/node".into(),
            ..SamplerConfig::default()
        }
        .resolve()
        .expect("resolves");
        let c = WakeupConfig::for_layout(&v2_node);
        assert_eq!(
            c.memory_events,
            SourceSetting::Path(dir.path().join("sim/node/memory.events"))
        );
        assert_eq!(
            c.psi,
            SourceSetting::Path(dir.path().join("sim/node/memory.pressure"))
        );
    }
}
