//! Wake-ups: what makes the agent look at the node now rather than at the next tick.
//!
//! - `vocab`: the words ([`WakeSource`], [`Wakeup`], [`SourceKind`], [`SourceState`], …).
//! - `notify`: the kernel notifiers (cgroup v1 memcg eventfds, PSI triggers, inotify on
//!   cgroup v2 `memory.events`), each a tokio task delivering through a shared sink.
//! - [`Wakeups`]: the sources merged into one queue, with the housekeeping tick and the memcg
//!   thresholds the agent re-arms after every pass.
//!
//! The sampler does not know what woke it: a [`Wakeup`] is a [`crate::sampler::Trigger`] (when,
//! and which pass it asks for). Imports point one way: this module uses the sampler's layout,
//! parsers and formulas; the sampler never uses this module.
//!
//! ```no_run
//! # async fn run() -> anyhow::Result<()> {
//! use node_monitor::{
//!     sampler::{Sampler, SamplerConfig},
//!     wakeup::{WakeupConfig, Wakeups},
//! };
//! let mut sampler = Sampler::new(SamplerConfig::default())?;
//! let mut wakeups = Wakeups::start(WakeupConfig::for_layout(sampler.layout()))?;
//! while let Some(wakeup) = wakeups.next().await {
//!     let timed = sampler.observe(wakeup);
//!     // core decides on timed.observations; record timed.since_wakeup.
//!     if let Some(m) = sampler.last_node_memory() {
//!         wakeups.arm_memory_thresholds(&[100 << 20], m.capacity, m.file_outside_working_set());
//!     }
//! }
//! # Ok(())
//! # }
//! ```

mod config;
mod notify;
mod sink;
mod sources;
mod thresholds;
mod vocab;

pub use config::{WakeupConfig, WakeupError};
pub use notify::{ArmError, UNPRIVILEGED_PSI_WINDOW};
pub use sources::{KernelSender, Wakeups};
pub use thresholds::ArmedThreshold;
pub use vocab::{
    KernelWakeKind, MemcgTarget, PsiKind, PsiTrigger, SourceKind, SourceSetting, SourceState,
    SourceStatus, WakeSource, Wakeup,
};
