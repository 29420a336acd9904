//! The agent's settings from its command line: the kubelet's eviction flags, and the
//! configuration file read once (`run` and `check-config` share this reader, so what fails in one
//! fails in the other).
use node_monitor_core::{
    agent_config::{AgentConfig, load_agent_config},
    config::{ConfigSource, EvictionOverrides},
};

/// The kubelet's eviction flags, flattened by `run`, `check-config` and `explain`; they become the
/// core's [`EvictionOverrides`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EvictionFlags {
    /// Hard eviction thresholds, e.g. `memory.available<100Mi,nodefs.available<10%`. Replaces
    /// `evictionHard` from the config file. Repeatable.
    #[arg(long = "eviction-hard", value_name = "SIGNAL<QUANTITY,...")]
    pub eviction_hard: Vec<String>,
    /// Soft eviction thresholds, e.g. `memory.available<1.5Gi`. Replaces `evictionSoft`.
    #[arg(long = "eviction-soft", value_name = "SIGNAL<QUANTITY,...")]
    pub eviction_soft: Vec<String>,
    /// Grace periods for the soft thresholds, e.g. `memory.available=1m30s`. Replaces
    /// `evictionSoftGracePeriod`.
    #[arg(
        long = "eviction-soft-grace-period",
        value_name = "SIGNAL=DURATION,..."
    )]
    pub eviction_soft_grace_period: Vec<String>,
    /// Maximum grace period in seconds for pods evicted by a soft threshold. Replaces
    /// `evictionMaxPodGracePeriod`.
    #[arg(
        long = "eviction-max-pod-grace-period",
        value_name = "SECONDS",
        allow_hyphen_values = true
    )]
    pub eviction_max_pod_grace_period: Option<String>,
    /// Minimum amounts to reclaim once a threshold is met, e.g. `memory.available=0Mi`.
    /// Replaces `evictionMinimumReclaim`.
    #[arg(long = "eviction-minimum-reclaim", value_name = "SIGNAL=QUANTITY,...")]
    pub eviction_minimum_reclaim: Vec<String>,
    /// How long a pressure condition stays true after its threshold stops being met. Replaces
    /// `evictionPressureTransitionPeriod`.
    #[arg(
        long = "eviction-pressure-transition-period",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub eviction_pressure_transition_period: Option<String>,
}

impl EvictionFlags {
    /// The flags as the core's overrides (validated when the configuration is loaded).
    pub fn overrides(&self) -> EvictionOverrides {
        EvictionOverrides {
            eviction_hard: self.eviction_hard.clone(),
            eviction_soft: self.eviction_soft.clone(),
            eviction_soft_grace_period: self.eviction_soft_grace_period.clone(),
            eviction_max_pod_grace_period: self.eviction_max_pod_grace_period.clone(),
            eviction_minimum_reclaim: self.eviction_minimum_reclaim.clone(),
            eviction_pressure_transition_period: self.eviction_pressure_transition_period.clone(),
        }
    }
}

/// Reads `--config` once and loads the eviction and the graceful shutdown configuration from it,
/// with the eviction flags over the file.
pub fn load_config(
    path: Option<&std::path::Path>,
    flags: &EvictionFlags,
) -> anyhow::Result<AgentConfig> {
    let text = match path {
        Some(p) => Some(crate::io::read_file_bounded(
            p,
            "--config",
            crate::io::MAX_INPUT_BYTES,
        )?),
        None => None,
    };
    let name = path.map(|p| p.display().to_string()).unwrap_or_default();
    let source = text.as_deref().map(|t| ConfigSource {
        name: &name,
        text: t,
    });
    Ok(load_agent_config(source, &flags.overrides())?)
}
