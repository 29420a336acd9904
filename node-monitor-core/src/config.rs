//! The eviction configuration: the kubelet's own fields and flags, read and validated the way the
//! kubelet reads them, plus node-monitor's settings under `nodeMonitor:`.
//!
//! Sources, in the kubelet's precedence:
//! - a KubeletConfiguration document (YAML or JSON), read once into the configuration model
//!   ([`file::ConfigFile`]). Unknown top-level fields are ignored, so a real kubelet config file
//!   can be passed; unknown keys under `nodeMonitor` are rejected.
//! - the kubelet-style flags ([`EvictionOverrides`]). A flag replaces the whole field it names, as
//!   the kubelet's re-parse of its command line over the config file does
//!   (`kubeletConfigFlagPrecedence` in `cmd/kubelet/app/server.go`).
//!
//! The `evictionHard` defaulting follows `loadConfigFile` in `cmd/kubelet/app/server.go`: the
//! Linux defaults apply when no `evictionHard` is given at all; once one is given, only the
//! signals it names exist, unless `mergeDefaultEvictionSettings: true` fills in the missing
//! defaults. Threshold parsing and validation follow `ParseThresholdConfig` in
//! `pkg/kubelet/eviction/helpers.go`.
//!
//! Pure: callers read files and pass their contents.

pub mod kubelet_invocation;
pub mod kubelet_thresholds;

use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;

use crate::{
    signals::Signal,
    signals::threshold::{Operator, Threshold, ThresholdSource, ThresholdValue},
    units::duration::{DurationError, format_go_duration, parse_go_duration},
    units::quantity::{Quantity, QuantityError},
};

/// The kubelet's Linux `DefaultEvictionHard` (`pkg/kubelet/eviction/defaults_linux.go`).
pub const DEFAULT_EVICTION_HARD: [(Signal, &str); 5] = [
    (Signal::MemoryAvailable, "100Mi"),
    (Signal::NodeFsAvailable, "10%"),
    (Signal::NodeFsInodesFree, "5%"),
    (Signal::ImageFsAvailable, "15%"),
    (Signal::ImageFsInodesFree, "5%"),
];

/// The default of `nodeMonitor.kubeletConfigPath`: find the kubelet's configuration from its
/// command line, else in the places the distributions write it
/// ([`crate::config::kubelet_invocation`]).
pub const DEFAULT_KUBELET_CONFIG_PATH: &str = KUBELET_CONFIG_AUTO;
/// The `nodeMonitor.kubeletConfigPath` value that finds the kubelet's configuration.
pub const KUBELET_CONFIG_AUTO: &str = "auto";

/// The agent's state directory on the host: the default of `nodeMonitor.stateDir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/node-monitor";

/// `evictionPressureTransitionPeriod` default (`SetDefaults_KubeletConfiguration`).
pub const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);

/// The top-level fields of a config document the eviction configuration reads: the
/// KubeletConfiguration eviction fields and `nodeMonitor`. The configuration model
/// ([`ConfigFile`]) skips every field it does not read (a kubelet's own file can be passed as it
/// is), so this list and [`crate::shutdown::config::SHUTDOWN_FILE_FIELDS`] are exactly what it
/// accepts;
/// docs/configuration.md documents each (checked by `node-monitor/tests/config_doc.rs`).
pub const EVICTION_FILE_FIELDS: [&str; 10] = [
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "mergeDefaultEvictionSettings",
    "enforceNodeAllocatable",
    "localStorageCapacityIsolation",
    "nodeMonitor",
];

/// The kubelet's eviction flags, as plain overrides: each one that is set replaces the whole
/// field it names in the configuration file. The command line (`node-monitor run`, `check-config`,
/// `explain`) fills this from `--eviction-*` flags; the strings are parsed and validated here,
/// with errors that name the flag and the value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvictionOverrides {
    /// `--eviction-hard`: replaces `evictionHard`. Each entry is a comma-separated list.
    pub eviction_hard: Vec<String>,
    /// `--eviction-soft`: replaces `evictionSoft`.
    pub eviction_soft: Vec<String>,
    /// `--eviction-soft-grace-period`: replaces `evictionSoftGracePeriod`.
    pub eviction_soft_grace_period: Vec<String>,
    /// `--eviction-max-pod-grace-period`: replaces `evictionMaxPodGracePeriod`.
    pub eviction_max_pod_grace_period: Option<String>,
    /// `--eviction-minimum-reclaim`: replaces `evictionMinimumReclaim`.
    pub eviction_minimum_reclaim: Vec<String>,
    /// `--eviction-pressure-transition-period`: replaces `evictionPressureTransitionPeriod`.
    pub eviction_pressure_transition_period: Option<String>,
}

/// One configuration document and the name used for it in error messages (usually its path).
#[derive(Debug, Clone, Copy)]
pub struct ConfigSource<'a> {
    /// The name errors and warnings use for the document (usually its path).
    pub name: &'a str,
    /// The document's contents.
    pub text: &'a str,
}

/// What to do when a PodDisruptionBudget blocks an eviction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PdbPolicy {
    /// Retry the API eviction later; never bypass the budget.
    #[default]
    Respect,
    /// For hard thresholds only: when the budget blocks, delete the pod instead (same grace
    /// period and UID precondition), as the kubelet kills it regardless of budgets; counted and
    /// logged as an escalation.
    Escalate,
}

/// node-monitor's own settings (`nodeMonitor:` in the config file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMonitorSettings {
    /// Pods evicted per decision at most. The kubelet evicts one.
    pub max_pods_per_cycle: u32,
    /// The fallback sampling period when no kernel notification arrives (the kubelet's 10 s).
    #[serde(serialize_with = "ser_go_duration")]
    pub housekeeping_interval: Duration,
    /// The shortest delay between samples while a signal nears or falls towards a threshold
    /// (`core::headroom`); zero turns adaptive sampling off.
    #[serde(serialize_with = "ser_go_duration")]
    pub fast_sampling_interval: Duration,
    /// What to do when a PodDisruptionBudget blocks an eviction.
    pub pdb_policy: PdbPolicy,
    /// Decide and report, never act.
    pub dry_run: bool,
    /// PSI trigger window for memory stalls (the kernel accepts 500ms to 10s; without
    /// CAP_SYS_RESOURCE only multiples of 2s).
    #[serde(serialize_with = "ser_go_duration")]
    pub psi_window: Duration,
    /// Stall time within `psiWindow` that wakes the sampler.
    #[serde(serialize_with = "ser_go_duration")]
    pub psi_threshold: Duration,
    /// Direct and memcg reclaim stall time, summed by the eBPF probes over one second, that
    /// wakes the sampler.
    #[serde(serialize_with = "ser_go_duration")]
    pub reclaim_stall_budget: Duration,
    /// How long to wait for evicted pods to go before deciding again (the kubelet's 30 s).
    #[serde(serialize_with = "ser_go_duration")]
    pub pod_cleanup_timeout: Duration,
    /// Also taint the node `NoSchedule` while an agent-owned pressure condition is true.
    pub taint_on_pressure: bool,
    /// Load the eBPF memory push (`core::mem_push`): page-allocator tracepoints that wake the
    /// agent as memory grows near a memory threshold. On by default: the programs are attached
    /// only near a memory threshold, and cost nothing elsewhere.
    pub memory_push: bool,
    /// Attach the reboot probe's fallback on the raw tracepoint `sys_enter` (run on every system
    /// call) where its syscall tracepoint cannot attach (a perf event refused: Debian's and
    /// Ubuntu's `kernel.perf_event_paranoid` above 2). Off: no reboot probe on such nodes.
    pub reboot_probe_fallback: bool,
    /// The bound on every Kubernetes API call the agent makes (watches excepted: they have their
    /// own stall detection).
    #[serde(serialize_with = "ser_go_duration")]
    pub api_timeout: Duration,
    /// The kubelet's own configuration file, read for its eviction thresholds to tell which
    /// signals the kubelet acts on first (`kubelet_thresholds`); empty: not read.
    pub kubelet_config_path: String,
    /// How often the agent renews its liveness Lease (`node-monitor-agent-<node>`), which lets
    /// `node-monitor remediate` find the node dead in seconds; zero: no liveness Lease.
    #[serde(serialize_with = "ser_go_duration")]
    pub liveness_lease_interval: Duration,
    /// How `memory.available` and `allocatableMemory.available` count the working set:
    /// the kubelet's formula, or with reclaimable active page cache left out.
    pub memory_working_set: MemoryWorkingSet,
    /// The agent's directory on the host for what survives a restart (the frozen flight
    /// records); empty: nothing is kept.
    pub state_dir: String,
    /// Predictive eviction on `memory.available` ([`crate::eviction::predict`]).
    pub predictive_eviction: bool,
    /// The least time an eviction takes to free the victim's memory (the predictor's lead).
    #[serde(serialize_with = "ser_go_duration")]
    pub prediction_lead: Duration,
}

impl Default for NodeMonitorSettings {
    fn default() -> Self {
        Self {
            max_pods_per_cycle: 1,
            housekeeping_interval: Duration::from_secs(10),
            fast_sampling_interval: Duration::from_millis(100),
            pdb_policy: PdbPolicy::Respect,
            dry_run: false,
            psi_window: Duration::from_secs(2),
            psi_threshold: Duration::from_millis(150),
            reclaim_stall_budget: Duration::from_millis(100),
            pod_cleanup_timeout: Duration::from_secs(30),
            taint_on_pressure: false,
            memory_push: true,
            reboot_probe_fallback: true,
            api_timeout: Duration::from_secs(30),
            kubelet_config_path: DEFAULT_KUBELET_CONFIG_PATH.to_owned(),
            liveness_lease_interval: Duration::from_secs(5),
            memory_working_set: MemoryWorkingSet::Kubelet,
            state_dir: DEFAULT_STATE_DIR.to_owned(),
            predictive_eviction: true,
            prediction_lead: DEFAULT_PREDICTION_LEAD,
        }
    }
}

/// The predictor's default least lead: the hard eviction's 1 s grace period, plus a second for
/// the request, the kubelet's stop and the cgroup's removal.
pub const DEFAULT_PREDICTION_LEAD: Duration = Duration::from_secs(2);

/// Serializes a duration as the Go duration string the configuration takes (`"2m30s"`), so what
/// `check-config` prints can be pasted back. Shared with the shutdown configuration.
pub(crate) fn ser_go_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_go_duration(*d))
}

pub use crate::signals::{FsLayout, MemoryWorkingSet};

/// The validated eviction configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct EvictionConfig {
    /// Hard thresholds, soft thresholds, then derived ones; each group in signal order.
    pub thresholds: Vec<Threshold>,
    /// `evictionMaxPodGracePeriod`, seconds.
    pub max_pod_grace_period_seconds: i32,
    /// `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// node-monitor's own settings (`nodeMonitor:`).
    pub node_monitor: NodeMonitorSettings,
    /// `localStorageCapacityIsolation` (default `true`): pods over an emptyDir `sizeLimit` or an
    /// ephemeral-storage limit are evicted ([`crate::eviction::local_storage`]).
    pub local_storage_capacity_isolation: bool,
    /// Accepted but worth knowing: ignored entries, kubelet quirks that apply.
    pub warnings: Vec<String>,
}

impl Default for EvictionConfig {
    /// The configuration with no file and no flags: the kubelet's defaults.
    fn default() -> Self {
        // The defaults are valid by construction; the fallback keeps this infallible.
        load_sources(&[], &EvictionOverrides::default()).unwrap_or_else(|_| EvictionConfig {
            thresholds: Vec::new(),
            max_pod_grace_period_seconds: 0,
            pressure_transition_period: DEFAULT_PRESSURE_TRANSITION_PERIOD,
            node_monitor: NodeMonitorSettings::default(),
            local_storage_capacity_isolation: true,
            warnings: Vec::new(),
        })
    }
}

impl EvictionConfig {
    /// `UpdateContainerFsThresholds`: the `containerfs.*` thresholds follow the nodefs ones on a
    /// single filesystem or a split writable-layer filesystem, and the imagefs ones when images
    /// and writable layers share a dedicated filesystem. Configured `containerfs.*` thresholds
    /// are replaced, as the kubelet replaces them.
    pub fn with_fs_layout(&self, layout: FsLayout) -> EvictionConfig {
        let (avail, inodes) = match (layout.dedicated_image_fs, layout.split_container_image_fs) {
            (true, true) | (false, false) => (Signal::NodeFsAvailable, Signal::NodeFsInodesFree),
            (true, false) => (Signal::ImageFsAvailable, Signal::ImageFsInodesFree),
            // No dedicated imagefs but a split writable-layer filesystem: the kubelet leaves the
            // configured thresholds as they are.
            (false, true) => return self.clone(),
        };
        let mut out = self.clone();
        out.thresholds.retain(|t| {
            !matches!(
                t.signal,
                Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
            )
        });
        let derived: Vec<Threshold> = self
            .thresholds
            .iter()
            .filter(|t| t.derived_from.is_none() && (t.signal == avail || t.signal == inodes))
            .map(|t| Threshold {
                signal: if t.signal == avail {
                    Signal::ContainerFsAvailable
                } else {
                    Signal::ContainerFsInodesFree
                },
                derived_from: Some(t.signal),
                ..t.clone()
            })
            .collect();
        out.thresholds.extend(derived);
        out
    }

    /// The threshold with this key, if configured.
    pub fn threshold(&self, key: crate::signals::threshold::ThresholdKey) -> Option<&Threshold> {
        self.thresholds.iter().find(|t| t.key() == key)
    }
}

/// The configuration as loaded and its copy for the filesystem layout last seen
/// ([`EvictionConfig::with_fs_layout`]): the kubelet derives its `containerfs.*` thresholds
/// once it knows the layout, and so does the agent, from each sample's layout. The copy is
/// rebuilt only when the layout changes (a filesystem mounted or found after start).
#[derive(Debug, Clone)]
pub struct LayoutConfig {
    configured: EvictionConfig,
    layout: Option<FsLayout>,
}

impl LayoutConfig {
    /// The configuration as loaded; no layout seen yet.
    pub fn new(configured: EvictionConfig) -> Self {
        Self {
            configured,
            layout: None,
        }
    }

    /// The configuration for `layout` if it is not the layout of the last call (always on the
    /// first call); `None` when the configuration in use stays right.
    pub fn update(&mut self, layout: FsLayout) -> Option<EvictionConfig> {
        if self.layout == Some(layout) {
            return None;
        }
        self.layout = Some(layout);
        Some(self.configured.with_fs_layout(layout))
    }
}

/// A configuration that cannot be used; every message names the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The document does not parse as YAML (JSON included).
    #[error("{source_name}: not a valid YAML or JSON document")]
    Syntax {
        /// The document's name (usually its path).
        source_name: String,
        /// The parser's error, with its position.
        #[source]
        source: serde_norway::Error,
    },
    /// The document is a scalar or a list, not a KubeletConfiguration mapping.
    #[error("{source_name}: expected a mapping of KubeletConfiguration fields, found {found}")]
    NotAMapping {
        /// The document's name (usually its path).
        source_name: String,
        /// What the document is instead (`a list`, `the string "x"`).
        found: String,
    },
    /// A value the configuration model refuses: of the wrong kind (a number where a string is
    /// needed, …) or not one of the values its type has.
    #[error("{field}: {message}")]
    Refused {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`).
        field: String,
        /// What is wrong, naming the value ("expected a string, found the number 100").
        message: String,
    },
    /// A key that is not one of the kubelet's eviction signals.
    #[error("{field}: unsupported eviction signal {signal:?}")]
    UnknownSignal {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The key as written.
        signal: String,
    },
    /// A threshold or minimum reclaim that does not parse as a quantity.
    #[error("{field}: invalid quantity {value:?}")]
    Quantity {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        #[source]
        source: QuantityError,
    },
    /// A threshold quantity of zero or less (`ParseThresholdConfig` refuses it).
    #[error("{field}: eviction threshold {value:?} must be positive")]
    NotPositive {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
    },
    /// A threshold percentage outside 0–100 %.
    #[error("{field}: percentage {value:?} must be between 0% and 100%")]
    PercentageRange {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
    },
    /// A value ending in `%` whose number does not parse.
    #[error("{field}: {value:?} is not a valid percentage")]
    Percentage {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
    },
    /// A negative minimum reclaim quantity.
    #[error("{field}: minimum reclaim {value:?} must not be negative")]
    NegativeMinReclaim {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
    },
    /// A minimum reclaim percentage of zero or less.
    #[error("{field}: minimum reclaim percentage {value:?} must be positive")]
    NonPositiveMinReclaimPercentage {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
    },
    /// A value that does not parse as a Go duration.
    #[error("{field}: invalid duration {value:?}")]
    Duration {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        #[source]
        source: DurationError,
    },
    /// A negative duration where only zero or more makes sense.
    #[error("{field}: duration {value:?} must not be negative")]
    NegativeDuration {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
    },
    /// A soft threshold without an `evictionSoftGracePeriod` entry for its signal.
    #[error(
        "{field}: a grace period must be specified for the soft eviction threshold {signal} \
         (evictionSoftGracePeriod or --eviction-soft-grace-period)"
    )]
    MissingGracePeriod {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The soft threshold's signal.
        signal: Signal,
    },
    /// A flag entry that is not `key<value` (or `key=value`).
    #[error("{flag}: malformed entry {entry:?}, expected {expected}")]
    MalformedFlag {
        /// The flag (`--eviction-hard`, …).
        flag: &'static str,
        /// The comma-separated entry as given.
        entry: String,
        /// The form the flag takes.
        expected: &'static str,
    },
    /// A threshold with an operator other than `<` (`>`, `<=`, …).
    #[error(
        "{field}: unsupported operator {operator:?} in {statement:?}; \
         eviction thresholds support only \"<\""
    )]
    UnsupportedOperator {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The whole statement (`memory.available<=100Mi`).
        statement: String,
        /// The operator found.
        operator: String,
    },
    /// A grace period that is not a 32-bit integer (`evictionMaxPodGracePeriod`).
    #[error("{field}: {value:?} is not a 32-bit integer")]
    Integer {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
    },
    /// A key under `nodeMonitor` that node-monitor does not know.
    #[error("{field}: unknown setting {key:?}; known settings: {known}")]
    UnknownKey {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The unknown key.
        key: String,
        /// The keys accepted there, comma-separated.
        known: String,
    },
    /// A value of the right type that is out of range or inconsistent; `reason` says why.
    #[error("{field}: {value:?} {reason}")]
    Invalid {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong with it, worded to follow the value.
        reason: String,
    },
}

/// Reads one optional config document and the flags.
pub fn load(
    config_file: Option<&str>,
    flags: &EvictionOverrides,
) -> Result<EvictionConfig, ConfigError> {
    let sources: Vec<ConfigSource<'_>> = config_file
        .map(|text| ConfigSource {
            name: "config file",
            text,
        })
        .into_iter()
        .collect();
    load_sources(&sources, flags)
}

/// Reads config documents (later ones override earlier ones field by field; the signal maps key
/// by key) and then the flags (which override every document, each the whole field it names).
pub fn load_sources(
    sources: &[ConfigSource<'_>],
    flags: &EvictionOverrides,
) -> Result<EvictionConfig, ConfigError> {
    let documents = sources
        .iter()
        .map(|s| parse_document(*s))
        .collect::<Result<Vec<_>, _>>()?;
    load_documents(&documents, flags)
}

/// One configuration document, read once into the configuration model: the eviction and the
/// shutdown settings are both validated from it ([`crate::agent_config`]).
#[derive(Debug, Clone)]
pub struct Document {
    /// The name used for it in error messages (usually its path).
    pub name: String,
    /// The document as read.
    pub file: ConfigFile,
}

/// Reads one document's text (YAML, JSON included) into the model; the error names the
/// document.
pub fn parse_document(source: ConfigSource<'_>) -> Result<Document, ConfigError> {
    let file = ConfigFile::read(source.text).map_err(|e| ConfigError::read(source.name, e))?;
    Ok(Document {
        name: source.name.to_owned(),
        file,
    })
}

impl ConfigError {
    /// A document's read error, every field prefixed with the document's name.
    fn read(name: &str, e: ReadError) -> Self {
        let source_name = name.to_owned();
        match e {
            ReadError::Syntax(source) => ConfigError::Syntax {
                source_name,
                source,
            },
            ReadError::NotAMapping { found } => ConfigError::NotAMapping { source_name, found },
            ReadError::Value { field, message } => ConfigError::Refused {
                field: format!("{name}: {field}"),
                message,
            },
            ReadError::UnknownKey { field, key, known } => ConfigError::UnknownKey {
                field: format!("{name}: {field}"),
                key,
                known,
            },
        }
    }
}

pub mod file;
mod load;
mod node_monitor;
pub mod shutdown_model;
mod statements;

use self::{file::*, load::*, node_monitor::*, statements::*};
pub use self::{
    file::{ConfigFile, ReadError},
    load::load_documents,
    node_monitor::NODE_MONITOR_KEYS,
};

#[cfg(test)]
pub(crate) mod tests;

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop;
