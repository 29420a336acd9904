//! Turns the node into observations: cgroups, statvfs, procfs, and the wake-up sources.
//!
//! - [`Sampler`] computes every kubelet eviction signal the way the kubelet does (see
//!   `docs/signals.md`) plus per-pod usage from the kubelet's cgroup layout.
//! - [`Wakeups`] merges the wake-up sources (eBPF events, memcg thresholds, `memory.events`,
//!   PSI, the housekeeping tick) into one queue.
//! - [`Sampler::observe`] / [`Sampler::observe_as`] run a pass for a [`Wakeup`] and measure it,
//!   so the run loop can record the time from wake-up to decision. A [`SampleKind::Signals`]
//!   pass costs tens of microseconds whatever the pod count; read the pods
//!   ([`SampleKind::Fast`]) when a threshold is met and ranking needs them.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use node_monitor::sampler::{Sampler, SamplerConfig, WakeupConfig, Wakeups};
//! let mut sampler = Sampler::new(SamplerConfig::default())?;
//! let mut wakeups = Wakeups::start(WakeupConfig::for_layout(sampler.layout()))?;
//! while let Some(wakeup) = wakeups.next().await {
//!     let timed = sampler.observe(wakeup);
//!     // core decides on timed.observations; record timed.since_wakeup.
//!     if let Some(m) = sampler.last_node_memory() {
//!         wakeups.arm_memory_thresholds(&[100 << 20], m.capacity, m.inactive_file);
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod compute;
mod config;
mod disk;
mod layers;
mod notify;
pub mod parse;
mod pods;
mod read;
mod sample;
mod wakeups;
mod warn;

use std::path::PathBuf;

pub use compute::{
    FsStat, cgroup_capacity, fs_observations, memcg_usage_threshold, memory_observation,
    pid_observation, working_set,
};
pub use config::{
    CgroupVersion, ConfigError, DEFAULT_FULL_SAMPLE_INTERVAL, IMAGE_FS_CANDIDATES, ImageFsSource,
    KUBEPODS_AUTO, KubepodsDetection, Layout, ProcPaths, SamplerConfig, discover_image_fs,
    kubelet_config_driver,
};
pub use notify::{ArmError, UNPRIVILEGED_PSI_WINDOW};
pub use sample::{MemoryReading, SampleKind, Sampler, TimedObservations, raise_nofile_limit};
pub use wakeups::{
    ArmedThreshold, KernelSender, KernelWakeKind, MemcgTarget, PsiKind, PsiTrigger, SourceKind,
    SourceSetting, SourceState, SourceStatus, WakeSource, Wakeup, WakeupConfig, WakeupError,
    Wakeups,
};

/// Why a value could not be sampled. The signal is then left out of the observations.
#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not valid UTF-8")]
    NotUtf8 { path: PathBuf },
    #[error("parsing {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: parse::ParseError,
    },
    #[error("statvfs {path}")]
    Statvfs {
        path: PathBuf,
        #[source]
        source: nix::Error,
    },
    #[error(
        "{path} has no memory limit and no allocatable memory is configured: \
         allocatableMemory.available has no capacity"
    )]
    NoAllocatable { path: PathBuf },
    #[error(
        "pods {uids:?}: more than {budget} directory entries in a volume or log tree; their disk \
         usage counts what was walked (a lower bound)"
    )]
    DiskBudget { uids: Vec<String>, budget: u64 },
}
