//! One configuration model: the agent's configuration file as typed structs, read once.
//!
//! A document is deserialized into [`ConfigFile`]: the KubeletConfiguration fields the agent
//! reads (eviction and graceful shutdown), as the kubelet writes them, and the `nodeMonitor`
//! section. Every other KubeletConfiguration field is skipped, so a kubelet's own file can be
//! passed as it is; a key under `nodeMonitor` (or `nodeMonitor.shutdown`, or a
//! `shutdownGracePeriodByPodPriority` entry) that the model does not know is refused. A value of
//! the wrong kind is refused here, naming its path and what it holds; what the value means
//! (thresholds, durations, ranges, the settings against each other) is checked by one validation
//! pass over the model: [`super::load_documents`] for eviction, [`crate::shutdown::config`] for
//! graceful shutdown.
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, de::IgnoredAny};
use serde_norway::Value;

use self::de::{Section, describe, describe_plain, leaf, present, wrong_type};
use super::shutdown_model::{
    KubeletInhibitorPolicy, LastGasp, PRIORITY_ENTRY_KEYS, SHUTDOWN_OPTION_KEYS,
};
use super::{MemoryWorkingSet, NODE_MONITOR_KEYS, PdbPolicy};

pub(crate) mod de;
pub mod version;

pub use self::version::{API_VERSION, DocumentVersion, KIND};

/// One configuration document (a KubeletConfiguration, YAML or JSON), as read.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFile {
    /// `evictionHard`: signal → threshold as written (`"100Mi"`, `"10%"`).
    pub eviction_hard: Option<SignalMap>,
    /// `evictionSoft`: signal → threshold as written.
    pub eviction_soft: Option<SignalMap>,
    /// `evictionSoftGracePeriod`: signal → Go duration as written.
    pub eviction_soft_grace_period: Option<SignalMap>,
    /// `evictionMinimumReclaim`: signal → quantity or percentage as written.
    pub eviction_minimum_reclaim: Option<SignalMap>,
    /// `evictionMaxPodGracePeriod`, seconds.
    pub eviction_max_pod_grace_period: Option<Int32>,
    /// `evictionPressureTransitionPeriod`.
    pub eviction_pressure_transition_period: Option<DurationText>,
    /// `mergeDefaultEvictionSettings`.
    pub merge_default_eviction_settings: Option<Flag>,
    /// `enforceNodeAllocatable`.
    pub enforce_node_allocatable: Option<StringList>,
    /// `localStorageCapacityIsolation`.
    pub local_storage_capacity_isolation: Option<Flag>,
    /// `shutdownGracePeriod`.
    pub shutdown_grace_period: Option<DurationText>,
    /// `shutdownGracePeriodCriticalPods`.
    pub shutdown_grace_period_critical_pods: Option<DurationText>,
    /// `shutdownGracePeriodByPodPriority`.
    pub shutdown_grace_period_by_pod_priority: Option<PriorityList>,
    /// node-monitor's own settings.
    #[serde(default, deserialize_with = "de::optional_section")]
    pub node_monitor: Option<NodeMonitorSection>,
    /// Its form, from `apiVersion` and `kind` ([`version`]).
    #[serde(skip)]
    pub version: DocumentVersion,
}

/// `nodeMonitor:`, each key as written (validated by [`super::load_documents`]).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMonitorSection {
    /// `maxPodsPerCycle`.
    #[serde(default, deserialize_with = "present")]
    pub max_pods_per_cycle: Option<Number>,
    /// `housekeepingInterval`.
    #[serde(default, deserialize_with = "present")]
    pub housekeeping_interval: Option<DurationText>,
    /// `fastSamplingInterval`.
    #[serde(default, deserialize_with = "present")]
    pub fast_sampling_interval: Option<DurationText>,
    /// `pdbPolicy`.
    #[serde(default, deserialize_with = "present")]
    pub pdb_policy: Option<PdbPolicy>,
    /// `dryRun`.
    #[serde(default, deserialize_with = "present")]
    pub dry_run: Option<Flag>,
    /// `psiWindow`.
    #[serde(default, deserialize_with = "present")]
    pub psi_window: Option<DurationText>,
    /// `psiThreshold`.
    #[serde(default, deserialize_with = "present")]
    pub psi_threshold: Option<DurationText>,
    /// `reclaimStallBudget`.
    #[serde(default, deserialize_with = "present")]
    pub reclaim_stall_budget: Option<DurationText>,
    /// `podCleanupTimeout`.
    #[serde(default, deserialize_with = "present")]
    pub pod_cleanup_timeout: Option<DurationText>,
    /// `taintOnPressure`.
    #[serde(default, deserialize_with = "present")]
    pub taint_on_pressure: Option<Flag>,
    /// `memoryPush`.
    #[serde(default, deserialize_with = "present")]
    pub memory_push: Option<Flag>,
    /// `rebootProbeFallback`.
    #[serde(default, deserialize_with = "present")]
    pub reboot_probe_fallback: Option<Flag>,
    /// `apiTimeout`.
    #[serde(default, deserialize_with = "present")]
    pub api_timeout: Option<DurationText>,
    /// `livenessLeaseInterval`.
    #[serde(default, deserialize_with = "present")]
    pub liveness_lease_interval: Option<DurationText>,
    /// `kubeletConfigPath` (`null` reads as empty: off).
    #[serde(default, deserialize_with = "present")]
    pub kubelet_config_path: Option<PathText>,
    /// `stateDir` (`null` reads as empty: off).
    #[serde(default, deserialize_with = "present")]
    pub state_dir: Option<PathText>,
    /// `memoryWorkingSet`.
    #[serde(default, deserialize_with = "present")]
    pub memory_working_set: Option<MemoryWorkingSet>,
    /// `predictiveEviction`.
    #[serde(default, deserialize_with = "present")]
    pub predictive_eviction: Option<Flag>,
    /// `predictionLead`.
    #[serde(default, deserialize_with = "present")]
    pub prediction_lead: Option<DurationText>,
    /// `shutdown:` (validated by [`crate::shutdown::config`]).
    #[serde(default, deserialize_with = "de::optional_section")]
    pub shutdown: Option<ShutdownSection>,
    /// Keys the model does not know: refused by [`ConfigFile::read`].
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

impl Section for NodeMonitorSection {
    const EXPECTED: &'static str = "a mapping";
}

/// `nodeMonitor.shutdown:`, each key as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownSection {
    /// `enabled`.
    #[serde(default, deserialize_with = "present")]
    pub enabled: Option<Flag>,
    /// `manageInhibitDelay`.
    #[serde(default, deserialize_with = "present")]
    pub manage_inhibit_delay: Option<Flag>,
    /// `inhibitDelayMargin`.
    #[serde(default, deserialize_with = "present")]
    pub inhibit_delay_margin: Option<DurationText>,
    /// `kubeletInhibitorPolicy`.
    #[serde(default, deserialize_with = "present")]
    pub kubelet_inhibitor_policy: Option<KubeletInhibitorPolicy>,
    /// `cordon`.
    #[serde(default, deserialize_with = "present")]
    pub cordon: Option<Flag>,
    /// `lastGasp`.
    #[serde(default, deserialize_with = "present")]
    pub last_gasp: Option<LastGasp>,
    /// `lastGaspTimeout`.
    #[serde(default, deserialize_with = "present")]
    pub last_gasp_timeout: Option<DurationText>,
    /// `pollInterval`.
    #[serde(default, deserialize_with = "present")]
    pub poll_interval: Option<DurationText>,
    /// Keys the model does not know: refused by [`ConfigFile::read`].
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

impl ShutdownSection {
    /// Each key `later` sets replaces this section's (documents read in order).
    pub(crate) fn overlay(&mut self, later: &Self) {
        fn over<T: Clone>(a: &mut Option<T>, b: &Option<T>) {
            if b.is_some() {
                a.clone_from(b);
            }
        }
        over(&mut self.enabled, &later.enabled);
        over(&mut self.manage_inhibit_delay, &later.manage_inhibit_delay);
        over(&mut self.inhibit_delay_margin, &later.inhibit_delay_margin);
        over(
            &mut self.kubelet_inhibitor_policy,
            &later.kubelet_inhibitor_policy,
        );
        over(&mut self.cordon, &later.cordon);
        over(&mut self.last_gasp, &later.last_gasp);
        over(&mut self.last_gasp_timeout, &later.last_gasp_timeout);
        over(&mut self.poll_interval, &later.poll_interval);
    }
}

impl Section for ShutdownSection {
    const EXPECTED: &'static str = "a mapping";
}

/// One `shutdownGracePeriodByPodPriority` entry; a key left out is Go's zero value.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorityEntry {
    /// `priority` (int32).
    #[serde(default, deserialize_with = "present")]
    pub priority: Option<Priority>,
    /// `shutdownGracePeriodSeconds` (int64).
    #[serde(default, deserialize_with = "present")]
    pub shutdown_grace_period_seconds: Option<Seconds>,
    /// Keys the model does not know: refused by [`ConfigFile::read`].
    #[serde(flatten)]
    unknown: BTreeMap<String, IgnoredAny>,
}

impl Section for PriorityEntry {
    const EXPECTED: &'static str = "a mapping {priority, shutdownGracePeriodSeconds}";
}

/// `shutdownGracePeriodByPodPriority`: a list of entries.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PriorityList(pub Vec<PriorityEntry>);

impl<'de> Deserialize<'de> for PriorityList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let entries: Vec<de::Mapped<PriorityEntry>> =
            de::list(d, "a list of {priority, shutdownGracePeriodSeconds}")?;
        Ok(Self(entries.into_iter().map(|e| e.0).collect()))
    }
}

/// A map from eviction signal names to values as written (`map[string]string`); the keys are
/// checked against the signals by validation, which names the entry.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SignalMap(pub BTreeMap<String, String>);

impl<'de> Deserialize<'de> for SignalMap {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map: BTreeMap<String, Statement> =
            de::mapping(d, "a mapping of signal names to strings")?;
        Ok(Self(map.into_iter().map(|(k, v)| (k, v.0)).collect()))
    }
}

/// A value of a [`SignalMap`]: a string (a YAML number is refused, as the kubelet refuses it).
struct Statement(String);

impl<'de> Deserialize<'de> for Statement {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| match v {
            Value::String(s) => Ok(Self(s)),
            other => Err(wrong_type(
                "a string (quote numbers: \"0\", \"100Mi\")",
                &describe(&other),
            )),
        })
    }
}

/// A list of strings (`enforceNodeAllocatable`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StringList(pub Vec<String>);

impl<'de> Deserialize<'de> for StringList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let items: Vec<ListItem> = de::list(d, "a list of strings")?;
        Ok(Self(items.into_iter().map(|i| i.0).collect()))
    }
}

/// An item of a [`StringList`].
struct ListItem(String);

impl<'de> Deserialize<'de> for ListItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| match v {
            Value::String(s) => Ok(Self(s)),
            other => Err(wrong_type("a list of strings", &describe(&other))),
        })
    }
}

/// A Go duration as written (`"1m30s"`): a string, parsed and bounded by validation, whose
/// errors quote it as written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DurationText(pub String);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| match v {
            Value::String(s) => Ok(Self(s)),
            other => Err(wrong_type(
                "a duration string such as \"30s\"",
                &describe(&other),
            )),
        })
    }
}

/// A file path as written; `null` is the empty path (the setting is off).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathText(pub String);

impl<'de> Deserialize<'de> for PathText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| match v {
            Value::String(s) => Ok(Self(s)),
            Value::Null => Ok(Self(String::new())),
            other => Err(wrong_type("a path string", &describe(&other))),
        })
    }
}

/// A boolean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| match v {
            Value::Bool(b) => Ok(Self(b)),
            other => Err(wrong_type("a boolean", &describe(&other))),
        })
    }
}

/// A number as written (`maxPodsPerCycle`), bounded by validation, whose errors quote it.
#[derive(Debug, Clone, PartialEq)]
pub struct Number(pub serde_norway::Number);

impl<'de> Deserialize<'de> for Number {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| match v {
            Value::Number(n) => Ok(Self(n)),
            other => Err(wrong_type("a positive integer", &describe(&other))),
        })
    }
}

/// A 32-bit integer (`evictionMaxPodGracePeriod`, seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Int32(pub i32);

impl<'de> Deserialize<'de> for Int32 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| match v {
            Value::Number(n) => n
                .as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Self)
                .ok_or_else(|| format!("{:?} is not a 32-bit integer", n.to_string())),
            other => Err(wrong_type("an integer (seconds)", &describe(&other))),
        })
    }
}

/// A pod priority (int32) of a `shutdownGracePeriodByPodPriority` entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Priority(pub i32);

impl<'de> Deserialize<'de> for Priority {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| {
            v.as_i64()
                .and_then(|n| i32::try_from(n).ok())
                .map(Self)
                .ok_or_else(|| format!("{:?} is not a 32-bit integer", describe_plain(&v)))
        })
    }
}

/// Whole seconds (int64) of a `shutdownGracePeriodByPodPriority` entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seconds(pub i64);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        leaf(d, |v| {
            v.as_i64()
                .map(Self)
                .ok_or_else(|| format!("{:?} is not an integer (seconds)", describe_plain(&v)))
        })
    }
}

/// One of the words `all` spells; another string is refused with `reason`, another kind of
/// value as a wrong type.
fn choice<'de, D: Deserializer<'de>, T: Copy>(
    d: D,
    all: &[(&str, T)],
    expected: &str,
    reason: &str,
) -> Result<T, D::Error> {
    leaf(d, |v| match v {
        Value::String(s) => all
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, t)| *t)
            .ok_or_else(|| format!("{s:?} {reason}")),
        other => Err(wrong_type(expected, &describe(&other))),
    })
}

impl<'de> Deserialize<'de> for PdbPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        choice(
            d,
            &[("respect", Self::Respect), ("escalate", Self::Escalate)],
            "\"respect\" or \"escalate\"",
            "must be \"respect\" or \"escalate\"",
        )
    }
}

impl<'de> Deserialize<'de> for MemoryWorkingSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        choice(
            d,
            &Self::ALL,
            "\"kubelet\" or \"reclaimable\"",
            "must be \"kubelet\" or \"reclaimable\"",
        )
    }
}

impl<'de> Deserialize<'de> for KubeletInhibitorPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        choice(
            d,
            &Self::ALL,
            "takeOver, cooperate or standAside",
            "must be \"takeOver\", \"cooperate\" or \"standAside\"",
        )
    }
}

impl<'de> Deserialize<'de> for LastGasp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        choice(
            d,
            &[
                ("none", Self::None),
                ("condition", Self::Condition),
                ("annotation", Self::Annotation),
            ],
            "none, condition or annotation",
            "must be \"none\", \"condition\" or \"annotation\"",
        )
    }
}

/// Why a document does not read into the model. `field` is the value's path in the document
/// (`nodeMonitor.shutdown.pollInterval`, `evictionHard["memory.available"]`); the readers of the
/// eviction and the shutdown settings add the document's name their own way.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The document does not parse as YAML (JSON included).
    #[error("not a valid YAML or JSON document")]
    Syntax(#[source] serde_norway::Error),
    /// The document is a scalar or a list, not a KubeletConfiguration mapping.
    #[error("expected a mapping of KubeletConfiguration fields, found {found}")]
    NotAMapping {
        /// What the document is instead (`a list`, `the string "x"`).
        found: String,
    },
    /// A value the model refuses: of the wrong kind, or not one of the values its type has.
    #[error("{field}: {message}")]
    Value {
        /// The value's path.
        field: String,
        /// What is wrong, naming the value ("expected a boolean, found the string \"maybe\"").
        message: String,
    },
    /// A key under `nodeMonitor`, `nodeMonitor.shutdown` or in a
    /// `shutdownGracePeriodByPodPriority` entry that the model does not know.
    #[error("{field}: unknown setting {key:?}; known settings: {known}")]
    UnknownKey {
        /// The path of the mapping that holds the key.
        field: String,
        /// The unknown key.
        key: String,
        /// The keys accepted there, comma-separated.
        known: String,
    },
}

impl ConfigFile {
    /// Reads one document's text (YAML, JSON included) into the model.
    pub fn read(text: &str) -> Result<Self, ReadError> {
        let value: Value = serde_norway::from_str(text).map_err(ReadError::Syntax)?;
        let map = match value {
            Value::Null => return Ok(Self::default()),
            Value::Mapping(m) => m,
            other => {
                return Err(ReadError::NotAMapping {
                    found: describe(&other),
                });
            }
        };
        // Only a string key can name a KubeletConfiguration field; any other is skipped, as
        // every field the model does not read is.
        let fields: serde_norway::Mapping =
            map.into_iter().filter(|(k, _)| k.is_string()).collect();
        let version = version::document_version(&fields)?;
        let mut file: Self =
            serde_path_to_error::deserialize(Value::Mapping(fields)).map_err(|e| {
                ReadError::Value {
                    field: de::field_path(e.path()),
                    message: e.into_inner().to_string(),
                }
            })?;
        file.refuse_unknown_keys()?;
        file.version = version;
        Ok(file)
    }

    /// The first key the model does not know under `nodeMonitor`, `nodeMonitor.shutdown` or in
    /// a `shutdownGracePeriodByPodPriority` entry, refused with the keys known there.
    fn refuse_unknown_keys(&self) -> Result<(), ReadError> {
        let unknown = |field: String, keys: &BTreeMap<String, IgnoredAny>, known: &[&str]| {
            keys.keys().next().map_or(Ok(()), |key| {
                Err(ReadError::UnknownKey {
                    field,
                    key: key.clone(),
                    known: known.join(", "),
                })
            })
        };
        if let Some(nm) = &self.node_monitor {
            unknown("nodeMonitor".into(), &nm.unknown, &NODE_MONITOR_KEYS)?;
            if let Some(s) = &nm.shutdown {
                unknown(
                    "nodeMonitor.shutdown".into(),
                    &s.unknown,
                    &SHUTDOWN_OPTION_KEYS,
                )?;
            }
        }
        let entries = self.shutdown_grace_period_by_pod_priority.iter();
        for (i, entry) in entries.flat_map(|l| l.0.iter()).enumerate() {
            unknown(
                format!("shutdownGracePeriodByPodPriority[{i}]"),
                &entry.unknown,
                &PRIORITY_ENTRY_KEYS,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
