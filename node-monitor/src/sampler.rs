//! Turns the node into observations: cgroups, statvfs and procfs.
//!
//! - [`Sampler`] computes every kubelet eviction signal the way the kubelet does (see
//!   `docs/signals.md`) plus per-pod usage from the kubelet's cgroup layout.
//! - [`Sampler::observe`] / [`Sampler::observe_as`] run a pass for a [`Trigger`] (what started
//!   it: when, and which pass it asks for) and measure it, so the run loop can record the time
//!   from wake-up to decision. A [`SampleKind::Signals`] pass costs tens of microseconds
//!   whatever the pod count; read the pods ([`SampleKind::Fast`]) when a threshold is met and
//!   ranking needs them.
//!
//! The sampler observes at an instant: it does not know what woke the agent. The wake-up
//! sources live in the `wakeup` module, which uses this one, never the other way round.

mod compute;
mod config;
mod disk;
mod layers;
pub mod parse;
mod pods;
mod read;
mod sample;
mod walk;
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
pub use disk::PodDiskDetail;
pub use sample::{
    MemoryReading, SampleKind, Sampler, TimedObservations, Trigger, raise_nofile_limit,
};
pub(crate) use warn::ErrorChain;

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
