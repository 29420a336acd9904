//! The eviction configuration: the kubelet's own fields and flags, read and validated the way the
//! kubelet reads them, plus node-monitor's settings under `nodeMonitor:`.
//!
//! Sources, in the kubelet's precedence:
//! - a KubeletConfiguration document (YAML or JSON). Unknown top-level fields are ignored, so a
//!   real kubelet config file can be passed; unknown keys under `nodeMonitor` are rejected.
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

use std::{collections::BTreeMap, time::Duration};

use serde::Serialize;
use serde_norway::Value;

use super::{
    duration::{DurationError, format_go_duration, parse_go_duration},
    quantity::{Quantity, QuantityError},
    signals::Signal,
    threshold::{Operator, Threshold, ThresholdSource, ThresholdValue},
};

/// The kubelet's Linux `DefaultEvictionHard` (`pkg/kubelet/eviction/defaults_linux.go`).
pub const DEFAULT_EVICTION_HARD: [(Signal, &str); 5] = [
    (Signal::MemoryAvailable, "100Mi"),
    (Signal::NodeFsAvailable, "10%"),
    (Signal::NodeFsInodesFree, "5%"),
    (Signal::ImageFsAvailable, "15%"),
    (Signal::ImageFsInodesFree, "5%"),
];

/// `evictionPressureTransitionPeriod` default (`SetDefaults_KubeletConfiguration`).
pub const DEFAULT_PRESSURE_TRANSITION_PERIOD: Duration = Duration::from_secs(300);

/// The top-level fields of a config document the eviction configuration reads: the
/// KubeletConfiguration eviction fields and `nodeMonitor`. The parser skips every other field (a
/// kubelet's own file can be passed as it is), so this list is exactly what it accepts;
/// docs/configuration.md documents each (checked by `node-monitor/tests/config_doc.rs`).
pub const EVICTION_FILE_FIELDS: [&str; 9] = [
    "evictionHard",
    "evictionSoft",
    "evictionSoftGracePeriod",
    "evictionMaxPodGracePeriod",
    "evictionMinimumReclaim",
    "evictionPressureTransitionPeriod",
    "mergeDefaultEvictionSettings",
    "enforceNodeAllocatable",
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
    /// The bound on every Kubernetes API call the agent makes (watches excepted: they have their
    /// own stall detection).
    #[serde(serialize_with = "ser_go_duration")]
    pub api_timeout: Duration,
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
            api_timeout: Duration::from_secs(30),
        }
    }
}

/// Serializes a duration as the Go duration string the configuration takes (`"2m30s"`), so what
/// `check-config` prints can be pasted back. Shared with the shutdown configuration.
pub(crate) fn ser_go_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format_go_duration(*d))
}

/// The filesystems the container runtime uses, as the kubelet discovers them at run time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FsLayout {
    /// Images live on a filesystem of their own (`HasDedicatedImageFs`).
    pub dedicated_image_fs: bool,
    /// Writable layers live apart from images (`IsContainerFsSeparateFromImageFs`).
    pub split_container_image_fs: bool,
}

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
    pub fn threshold(&self, key: super::threshold::ThresholdKey) -> Option<&Threshold> {
        self.thresholds.iter().find(|t| t.key() == key)
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
    /// A field holds the wrong kind of value (a number where a string is needed, …).
    #[error("{field}: expected {expected}, found {found}")]
    WrongType {
        /// Where: the document and field (`config.yaml: evictionHard["memory.available"]`) or the
        /// flag and key (`--eviction-hard memory.available`).
        field: String,
        /// What the field takes.
        expected: &'static str,
        /// What it holds instead.
        found: String,
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

/// Reads config documents (later ones override earlier ones field by field; maps are replaced
/// whole) and then the flags (which override every document).
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

/// One configuration document, parsed once: the eviction and the shutdown settings are both read
/// from it ([`crate::agent_config`]).
#[derive(Debug, Clone)]
pub struct Document {
    /// The name used for it in error messages (usually its path).
    pub name: String,
    /// The parsed YAML (or JSON) value.
    pub value: Value,
}

/// Parses one document's text (YAML, JSON included); the error names the document.
pub fn parse_document(source: ConfigSource<'_>) -> Result<Document, ConfigError> {
    let value = serde_norway::from_str(source.text).map_err(|e| ConfigError::Syntax {
        source_name: source.name.into(),
        source: e,
    })?;
    Ok(Document {
        name: source.name.to_owned(),
        value,
    })
}

/// [`load_sources`] over documents already parsed: each replaces the fields it names, then the
/// flags override them all.
pub fn load_documents(
    documents: &[Document],
    flags: &EvictionOverrides,
) -> Result<EvictionConfig, ConfigError> {
    let mut file = FileSettings::default();
    for document in documents {
        file.merge(FileSettings::from_document(document)?);
    }
    let mut warnings = Vec::new();

    // evictionHard: flag, else file (with defaults merged on request), else the defaults.
    let hard = if !flags.eviction_hard.is_empty() {
        Some(flag_map(&flags.eviction_hard, "--eviction-hard", '<')?)
    } else if let Some(mut m) = file.eviction_hard.clone() {
        if file.merge_default_eviction_settings.unwrap_or(false) {
            for (signal, value) in DEFAULT_EVICTION_HARD {
                m.entries
                    .entry(signal.as_str().to_owned())
                    .or_insert_with(|| Entry {
                        value: value.to_owned(),
                        field: "default evictionHard".into(),
                        explicit: false,
                    });
            }
        }
        Some(m)
    } else {
        None
    };
    let hard = hard.unwrap_or_else(default_hard);
    let soft = pick(
        &flags.eviction_soft,
        "--eviction-soft",
        '<',
        &file.eviction_soft,
    )?;
    let grace = pick(
        &flags.eviction_soft_grace_period,
        "--eviction-soft-grace-period",
        '=',
        &file.eviction_soft_grace_period,
    )?;
    let min_reclaim = pick(
        &flags.eviction_minimum_reclaim,
        "--eviction-minimum-reclaim",
        '=',
        &file.eviction_minimum_reclaim,
    )?;

    let mut hard_thresholds =
        parse_statements(&hard, ThresholdSource::EvictionHard, &mut warnings)?;
    let mut soft_thresholds =
        parse_statements(&soft, ThresholdSource::EvictionSoft, &mut warnings)?;
    let grace_periods = parse_grace_periods(&grace)?;
    let min_reclaims = parse_min_reclaims(&min_reclaim)?;

    for t in &mut soft_thresholds {
        let Some(period) = grace_periods.get(&t.signal) else {
            let field = soft
                .entries
                .get(t.signal.as_str())
                .map_or_else(|| "evictionSoft".to_owned(), |e| e.field.clone());
            return Err(ConfigError::MissingGracePeriod {
                field,
                signal: t.signal,
            });
        };
        t.grace_period = *period;
        if period.is_zero() {
            warnings.push(format!(
                "soft threshold {} has a zero grace period and acts as a hard threshold \
                 (as in the kubelet)",
                t.signal
            ));
        }
    }
    for signal in grace_periods.keys() {
        if !soft_thresholds.iter().any(|t| t.signal == *signal) {
            warnings.push(format!(
                "grace period for {signal} is ignored: there is no soft threshold for it"
            ));
        }
    }
    let mut thresholds = Vec::new();
    thresholds.append(&mut hard_thresholds);
    thresholds.append(&mut soft_thresholds);
    for t in &mut thresholds {
        t.min_reclaim = min_reclaims.get(&t.signal).cloned();
    }
    for signal in min_reclaims.keys() {
        if !thresholds.iter().any(|t| t.signal == *signal) {
            warnings.push(format!(
                "minimum reclaim for {signal} is ignored: there is no threshold for it"
            ));
        }
    }
    // addAllocatableThresholds: enforceNodeAllocatable defaults to ["pods"].
    let enforce_pods = file
        .enforce_node_allocatable
        .as_ref()
        .is_none_or(|v| v.iter().any(|k| k == "pods"));
    if enforce_pods {
        let copies: Vec<Threshold> = thresholds
            .iter()
            .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
            .map(|t| Threshold {
                signal: Signal::AllocatableMemoryAvailable,
                grace_period: Duration::ZERO,
                source: ThresholdSource::Allocatable,
                derived_from: Some(Signal::MemoryAvailable),
                ..t.clone()
            })
            // A soft memory threshold with a zero grace period would make a second copy with
            // the same key; the first (from the hard threshold) is kept.
            .take(1)
            .collect();
        thresholds.extend(copies);
    }
    if thresholds.iter().any(|t| {
        matches!(
            t.signal,
            Signal::ContainerFsAvailable | Signal::ContainerFsInodesFree
        )
    }) {
        warnings.push(
            "containerfs thresholds are replaced at run time by the nodefs (or imagefs) ones, \
             as the kubelet replaces them"
                .into(),
        );
    }

    let max_pod_grace_period_seconds = match &flags.eviction_max_pod_grace_period {
        Some(v) => v.trim().parse::<i32>().map_err(|_| ConfigError::Integer {
            field: "--eviction-max-pod-grace-period".into(),
            value: v.clone(),
        })?,
        None => file.eviction_max_pod_grace_period.unwrap_or(0),
    };
    if max_pod_grace_period_seconds < 0 {
        warnings.push(format!(
            "evictionMaxPodGracePeriod {max_pod_grace_period_seconds} is negative: the kubelet \
             then terminates soft-evicted pods with its minimum grace period of 1 second"
        ));
    }

    let pressure_transition_period = match &flags.eviction_pressure_transition_period {
        Some(v) => non_negative_duration("--eviction-pressure-transition-period", v)?,
        None => match &file.eviction_pressure_transition_period {
            Some((field, v)) => {
                let d = non_negative_duration(field, v)?;
                if d.is_zero() {
                    // SetDefaults_KubeletConfiguration treats a zero duration as unset.
                    warnings.push(format!(
                        "{field} {v:?} is zero, which the kubelet replaces with the default 5m0s"
                    ));
                    DEFAULT_PRESSURE_TRANSITION_PERIOD
                } else {
                    d
                }
            }
            None => DEFAULT_PRESSURE_TRANSITION_PERIOD,
        },
    };

    let node_monitor = parse_node_monitor(&file.node_monitor)?;

    Ok(EvictionConfig {
        thresholds,
        max_pod_grace_period_seconds,
        pressure_transition_period,
        node_monitor,
        warnings,
    })
}

/// A map entry with the field name used for it in messages.
#[derive(Debug, Clone)]
struct Entry {
    value: String,
    field: String,
    /// Written by the user (not a merged-in default).
    explicit: bool,
}

#[derive(Debug, Clone, Default)]
struct StatementMap {
    entries: BTreeMap<String, Entry>,
}

/// The eviction fields of one or more documents.
#[derive(Debug, Default)]
struct FileSettings {
    eviction_hard: Option<StatementMap>,
    eviction_soft: Option<StatementMap>,
    eviction_soft_grace_period: Option<StatementMap>,
    eviction_minimum_reclaim: Option<StatementMap>,
    eviction_max_pod_grace_period: Option<i32>,
    /// (field name, value)
    eviction_pressure_transition_period: Option<(String, String)>,
    merge_default_eviction_settings: Option<bool>,
    enforce_node_allocatable: Option<Vec<String>>,
    /// key → (field name, value)
    node_monitor: BTreeMap<String, (String, Value)>,
}

impl FileSettings {
    fn from_document(document: &Document) -> Result<Self, ConfigError> {
        let map = match document.value.clone() {
            Value::Null => return Ok(Self::default()),
            Value::Mapping(m) => m,
            other => {
                return Err(ConfigError::NotAMapping {
                    source_name: document.name.clone(),
                    found: describe(&other),
                });
            }
        };
        let mut out = Self::default();
        for (k, v) in map {
            let Value::String(key) = k else { continue };
            // Any other KubeletConfiguration field: not ours.
            if !EVICTION_FILE_FIELDS.contains(&key.as_str()) {
                continue;
            }
            let field = format!("{}: {key}", document.name);
            match key.as_str() {
                "evictionHard" => out.eviction_hard = string_map(&field, v)?,
                "evictionSoft" => out.eviction_soft = string_map(&field, v)?,
                "evictionSoftGracePeriod" => {
                    out.eviction_soft_grace_period = string_map(&field, v)?
                }
                "evictionMinimumReclaim" => out.eviction_minimum_reclaim = string_map(&field, v)?,
                "evictionMaxPodGracePeriod" => {
                    out.eviction_max_pod_grace_period = match v {
                        Value::Null => None,
                        Value::Number(n) => {
                            Some(n.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(
                                || ConfigError::Integer {
                                    field: field.clone(),
                                    value: n.to_string(),
                                },
                            )?)
                        }
                        other => {
                            return Err(wrong_type(&field, "an integer (seconds)", &other));
                        }
                    }
                }
                "evictionPressureTransitionPeriod" => {
                    out.eviction_pressure_transition_period = match v {
                        Value::Null => None,
                        Value::String(s) => Some((field, s)),
                        other => {
                            return Err(wrong_type(
                                &field,
                                "a duration string such as \"5m\"",
                                &other,
                            ));
                        }
                    }
                }
                "mergeDefaultEvictionSettings" => {
                    out.merge_default_eviction_settings = match v {
                        Value::Null => None,
                        Value::Bool(b) => Some(b),
                        other => return Err(wrong_type(&field, "a boolean", &other)),
                    }
                }
                "enforceNodeAllocatable" => {
                    out.enforce_node_allocatable = match v {
                        Value::Null => None,
                        Value::Sequence(items) => Some(
                            items
                                .into_iter()
                                .map(|item| match item {
                                    Value::String(s) => Ok(s),
                                    other => Err(wrong_type(&field, "a list of strings", &other)),
                                })
                                .collect::<Result<_, _>>()?,
                        ),
                        other => return Err(wrong_type(&field, "a list of strings", &other)),
                    }
                }
                "nodeMonitor" => match v {
                    Value::Null => {}
                    Value::Mapping(m) => {
                        for (k, v) in m {
                            let Value::String(k) = k else {
                                return Err(wrong_type(&field, "string keys", &k));
                            };
                            let f = format!("{field}.{k}");
                            out.node_monitor.insert(k, (f, v));
                        }
                    }
                    other => return Err(wrong_type(&field, "a mapping", &other)),
                },
                // Not in EVICTION_FILE_FIELDS: skipped above.
                _ => {}
            }
        }
        Ok(out)
    }

    fn merge(&mut self, later: FileSettings) {
        fn over<T>(a: &mut Option<T>, b: Option<T>) {
            if b.is_some() {
                *a = b;
            }
        }
        over(&mut self.eviction_hard, later.eviction_hard);
        over(&mut self.eviction_soft, later.eviction_soft);
        over(
            &mut self.eviction_soft_grace_period,
            later.eviction_soft_grace_period,
        );
        over(
            &mut self.eviction_minimum_reclaim,
            later.eviction_minimum_reclaim,
        );
        over(
            &mut self.eviction_max_pod_grace_period,
            later.eviction_max_pod_grace_period,
        );
        over(
            &mut self.eviction_pressure_transition_period,
            later.eviction_pressure_transition_period,
        );
        over(
            &mut self.merge_default_eviction_settings,
            later.merge_default_eviction_settings,
        );
        over(
            &mut self.enforce_node_allocatable,
            later.enforce_node_allocatable,
        );
        self.node_monitor.extend(later.node_monitor);
    }
}

fn default_hard() -> StatementMap {
    StatementMap {
        entries: DEFAULT_EVICTION_HARD
            .iter()
            .map(|(signal, value)| {
                (
                    signal.as_str().to_owned(),
                    Entry {
                        value: (*value).to_owned(),
                        field: "default evictionHard".into(),
                        explicit: false,
                    },
                )
            })
            .collect(),
    }
}

/// What a YAML value is, for a wrong-type error ("the string \"5s\"", "a list"). Shared with the
/// shutdown configuration, so both word their errors alike.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {s:?}"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "a mapping".into(),
        Value::Tagged(t) => format!("a value tagged {}", t.tag),
    }
}

fn wrong_type(field: &str, expected: &'static str, found: &Value) -> ConfigError {
    ConfigError::WrongType {
        field: field.into(),
        expected,
        found: describe(found),
    }
}

/// A `map[string]string` field; `null` counts as absent, as in the kubelet's decoder.
fn string_map(field: &str, v: Value) -> Result<Option<StatementMap>, ConfigError> {
    let m = match v {
        Value::Null => return Ok(None),
        Value::Mapping(m) => m,
        other => {
            return Err(wrong_type(
                field,
                "a mapping of signal names to strings",
                &other,
            ));
        }
    };
    let mut entries = BTreeMap::new();
    for (k, v) in m {
        let Value::String(key) = k else {
            return Err(wrong_type(field, "signal names as keys", &k));
        };
        let entry_field = format!("{field}[{key:?}]");
        let Value::String(value) = v else {
            return Err(wrong_type(
                &entry_field,
                "a string (quote numbers: \"0\", \"100Mi\")",
                &v,
            ));
        };
        entries.insert(
            key,
            Entry {
                value,
                field: entry_field,
                explicit: true,
            },
        );
    }
    Ok(Some(StatementMap { entries }))
}

/// A kubelet map flag (`LangleSeparatedMapStringString` for `<`, `MapStringString` for `=`):
/// comma-separated `key<value` / `key=value` pairs, spaces trimmed, later keys win.
fn flag_map(values: &[String], flag: &'static str, sep: char) -> Result<StatementMap, ConfigError> {
    let expected = if sep == '<' {
        "signal<quantity (the only operator is \"<\")"
    } else {
        "signal=value"
    };
    let mut entries = BTreeMap::new();
    for value in values {
        for item in value.split(',').filter(|s| !s.is_empty()) {
            let Some((k, v)) = item.split_once(sep) else {
                if sep == '<'
                    && let Some(op) = [">=", "<=", ">", "=", "!="]
                        .into_iter()
                        .find(|op| item.contains(op))
                {
                    return Err(ConfigError::UnsupportedOperator {
                        field: flag.into(),
                        statement: item.into(),
                        operator: op.into(),
                    });
                }
                return Err(ConfigError::MalformedFlag {
                    flag,
                    entry: item.into(),
                    expected,
                });
            };
            let (k, v) = (k.trim(), v.trim());
            if sep == '<' && v.starts_with('=') {
                return Err(ConfigError::UnsupportedOperator {
                    field: flag.into(),
                    statement: item.into(),
                    operator: "<=".into(),
                });
            }
            entries.insert(
                k.to_owned(),
                Entry {
                    value: v.to_owned(),
                    field: format!("{flag} {k}"),
                    explicit: true,
                },
            );
        }
    }
    Ok(StatementMap { entries })
}

fn pick(
    flag_values: &[String],
    flag: &'static str,
    sep: char,
    file: &Option<StatementMap>,
) -> Result<StatementMap, ConfigError> {
    if flag_values.is_empty() {
        Ok(file.clone().unwrap_or_default())
    } else {
        flag_map(flag_values, flag, sep)
    }
}

fn parse_signal(entry: &Entry, key: &str) -> Result<Signal, ConfigError> {
    key.parse::<Signal>()
        .map_err(|_| ConfigError::UnknownSignal {
            field: entry.field.clone(),
            signal: key.into(),
        })
}

/// `parsePercentage`: trailing `%` removed, parsed as a float32, divided by 100 in float32.
fn parse_percentage(entry: &Entry) -> Result<(f32, f64), ConfigError> {
    let bad = || ConfigError::Percentage {
        field: entry.field.clone(),
        value: entry.value.clone(),
    };
    let number = entry.value.trim_end_matches('%');
    let single: f32 = number.parse().map_err(|_| bad())?;
    let double: f64 = number.parse().map_err(|_| bad())?;
    if !single.is_finite() {
        return Err(bad());
    }
    Ok((single / 100.0, double))
}

/// `parseThresholdStatement` for each entry.
fn parse_statements(
    map: &StatementMap,
    source: ThresholdSource,
    warnings: &mut Vec<String>,
) -> Result<Vec<Threshold>, ConfigError> {
    let mut out = Vec::new();
    for (key, entry) in &map.entries {
        let signal = parse_signal(entry, key)?;
        let value = entry.value.as_str();
        let threshold_value = if value.ends_with('%') {
            // The kubelet ignores exactly these two spellings.
            if value == "0%" || value == "100%" {
                if entry.explicit {
                    warnings.push(format!(
                        "{} {value:?} disables the threshold (the kubelet ignores 0% and 100%)",
                        entry.field
                    ));
                }
                continue;
            }
            let (fraction, percent) = parse_percentage(entry)?;
            if !(0.0..=1.0).contains(&fraction) {
                return Err(ConfigError::PercentageRange {
                    field: entry.field.clone(),
                    value: value.into(),
                });
            }
            ThresholdValue::Percentage { fraction, percent }
        } else {
            let q = Quantity::parse(value).map_err(|e| ConfigError::Quantity {
                field: entry.field.clone(),
                value: value.into(),
                source: e,
            })?;
            if q.signum() <= 0 {
                return Err(ConfigError::NotPositive {
                    field: entry.field.clone(),
                    value: value.into(),
                });
            }
            ThresholdValue::Quantity(q)
        };
        out.push(Threshold {
            signal,
            operator: Operator::LessThan,
            value: threshold_value,
            grace_period: Duration::ZERO,
            min_reclaim: None,
            source,
            derived_from: None,
        });
    }
    out.sort_by_key(|t| t.signal);
    Ok(out)
}

fn parse_grace_periods(map: &StatementMap) -> Result<BTreeMap<Signal, Duration>, ConfigError> {
    let mut out = BTreeMap::new();
    for (key, entry) in &map.entries {
        let signal = parse_signal(entry, key)?;
        out.insert(signal, non_negative_duration(&entry.field, &entry.value)?);
    }
    Ok(out)
}

fn parse_min_reclaims(map: &StatementMap) -> Result<BTreeMap<Signal, ThresholdValue>, ConfigError> {
    let mut out = BTreeMap::new();
    for (key, entry) in &map.entries {
        let signal = parse_signal(entry, key)?;
        let value = if entry.value.ends_with('%') {
            let (fraction, percent) = parse_percentage(entry)?;
            if fraction <= 0.0 {
                return Err(ConfigError::NonPositiveMinReclaimPercentage {
                    field: entry.field.clone(),
                    value: entry.value.clone(),
                });
            }
            ThresholdValue::Percentage { fraction, percent }
        } else {
            let q = Quantity::parse(&entry.value).map_err(|e| ConfigError::Quantity {
                field: entry.field.clone(),
                value: entry.value.clone(),
                source: e,
            })?;
            if q.signum() < 0 {
                return Err(ConfigError::NegativeMinReclaim {
                    field: entry.field.clone(),
                    value: entry.value.clone(),
                });
            }
            ThresholdValue::Quantity(q)
        };
        out.insert(signal, value);
    }
    Ok(out)
}

fn non_negative_duration(field: &str, value: &str) -> Result<Duration, ConfigError> {
    let nanos = parse_go_duration(value).map_err(|e| ConfigError::Duration {
        field: field.into(),
        value: value.into(),
        source: e,
    })?;
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| ConfigError::NegativeDuration {
            field: field.into(),
            value: value.into(),
        })
}

/// The keys accepted under `nodeMonitor`; any other key is rejected with this list in the
/// message. `shutdown` is read by `shutdown::parse_shutdown_config`.
pub const NODE_MONITOR_KEYS: [&str; 12] = [
    "shutdown",
    "maxPodsPerCycle",
    "housekeepingInterval",
    "fastSamplingInterval",
    "pdbPolicy",
    "dryRun",
    "psiWindow",
    "psiThreshold",
    "reclaimStallBudget",
    "podCleanupTimeout",
    "taintOnPressure",
    "apiTimeout",
];

fn parse_node_monitor(
    entries: &BTreeMap<String, (String, Value)>,
) -> Result<NodeMonitorSettings, ConfigError> {
    let mut s = NodeMonitorSettings::default();
    let invalid = |field: &str, value: &str, reason: &str| ConfigError::Invalid {
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    };
    let duration = |field: &str, v: &Value| -> Result<(Duration, String), ConfigError> {
        match v {
            Value::String(text) => Ok((non_negative_duration(field, text)?, text.clone())),
            other => Err(wrong_type(
                field,
                "a duration string such as \"10s\"",
                other,
            )),
        }
    };
    let boolean = |field: &str, v: &Value| match v {
        Value::Bool(b) => Ok(*b),
        other => Err(wrong_type(field, "a boolean", other)),
    };
    for (key, (field, v)) in entries {
        if !NODE_MONITOR_KEYS.contains(&key.as_str()) {
            return Err(ConfigError::UnknownKey {
                field: field
                    .rsplit_once('.')
                    .map_or(field.as_str(), |(f, _)| f)
                    .into(),
                key: key.clone(),
                known: NODE_MONITOR_KEYS.join(", "),
            });
        }
        match key.as_str() {
            "maxPodsPerCycle" => {
                let n = match v {
                    Value::Number(n) => n.as_u64(),
                    other => return Err(wrong_type(field, "a positive integer", other)),
                };
                s.max_pods_per_cycle = n
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        invalid(field, &describe_plain(v), "must be between 1 and 1000")
                    })?;
            }
            "housekeepingInterval" => {
                let (d, text) = duration(field, v)?;
                if d < Duration::from_millis(100) {
                    return Err(invalid(field, &text, "must be at least 100ms"));
                }
                s.housekeeping_interval = d;
            }
            "fastSamplingInterval" => {
                let (d, text) = duration(field, v)?;
                if !d.is_zero() && d < Duration::from_millis(10) {
                    return Err(invalid(field, &text, "must be 0s (off) or at least 10ms"));
                }
                s.fast_sampling_interval = d;
            }
            "pdbPolicy" => {
                s.pdb_policy = match v {
                    Value::String(p) if p == "respect" => PdbPolicy::Respect,
                    Value::String(p) if p == "escalate" => PdbPolicy::Escalate,
                    Value::String(p) => {
                        return Err(invalid(field, p, "must be \"respect\" or \"escalate\""));
                    }
                    other => return Err(wrong_type(field, "\"respect\" or \"escalate\"", other)),
                }
            }
            // Graceful shutdown options: read and validated by `shutdown::parse_shutdown_config`.
            "shutdown" => {}
            "dryRun" => s.dry_run = boolean(field, v)?,
            "taintOnPressure" => s.taint_on_pressure = boolean(field, v)?,
            "psiWindow" => {
                let (d, text) = duration(field, v)?;
                // The kernel's PSI trigger window limits (kernel/sched/psi.c).
                if d < Duration::from_millis(500) || d > Duration::from_secs(10) {
                    return Err(invalid(field, &text, "must be between 500ms and 10s"));
                }
                s.psi_window = d;
            }
            "psiThreshold" => {
                let (d, text) = duration(field, v)?;
                if d.is_zero() {
                    return Err(invalid(field, &text, "must be positive"));
                }
                s.psi_threshold = d;
            }
            "reclaimStallBudget" => {
                let (d, text) = duration(field, v)?;
                if d.is_zero() || d > Duration::from_secs(1) {
                    return Err(invalid(field, &text, "must be positive and at most 1s"));
                }
                s.reclaim_stall_budget = d;
            }
            "podCleanupTimeout" => {
                let (d, text) = duration(field, v)?;
                if d.is_zero() {
                    return Err(invalid(field, &text, "must be positive"));
                }
                s.pod_cleanup_timeout = d;
            }
            "apiTimeout" => {
                let (d, text) = duration(field, v)?;
                if d < Duration::from_millis(100) || d > Duration::from_secs(300) {
                    return Err(invalid(field, &text, "must be between 100ms and 5m"));
                }
                s.api_timeout = d;
            }
            // Not in NODE_MONITOR_KEYS: rejected above.
            _ => {}
        }
    }
    if s.fast_sampling_interval > s.housekeeping_interval {
        let field = entries
            .get("fastSamplingInterval")
            .map_or("nodeMonitor.fastSamplingInterval", |(f, _)| f.as_str());
        return Err(invalid(
            field,
            &format_go_duration(s.fast_sampling_interval),
            &format!(
                "must not exceed housekeepingInterval ({})",
                format_go_duration(s.housekeeping_interval)
            ),
        ));
    }
    if s.psi_threshold > s.psi_window {
        let field = entries
            .get("psiThreshold")
            .map_or("nodeMonitor.psiThreshold", |(f, _)| f.as_str());
        return Err(invalid(
            field,
            &format_go_duration(s.psi_threshold),
            &format!(
                "must not exceed psiWindow ({})",
                format_go_duration(s.psi_window)
            ),
        ));
    }
    Ok(s)
}

/// A scalar as written (`5s`, `1000`, `true`), for an invalid-value error; anything else as
/// [`describe`] says it.
pub(crate) fn describe_plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => describe(other),
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop;
