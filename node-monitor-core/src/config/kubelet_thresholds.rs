//! Coexisting with the kubelet's own eviction manager: which of the two acts first for each
//! signal.
//!
//! node-monitor decides evictions as the kubelet would, but earlier. Where the kubelet's own
//! threshold for a signal is at or above node-monitor's, the kubelet acts at or before
//! node-monitor and node-monitor adds nothing for that signal. [`parse_kubelet_config`] reads the
//! kubelet's KubeletConfiguration (its eviction fields only, with the same kubelet-compatible
//! parsing and defaults as node-monitor's own configuration); [`compare`] sets the two sets of
//! thresholds side by side.
//!
//! Pure: callers read the file and pass its contents and the node's capacities.
use std::{collections::BTreeMap, fmt, time::Duration};

use serde::Serialize;
use serde_norway::{Mapping, Value};

use crate::{
    config::{self, ConfigError, ConfigSource, EvictionOverrides},
    signals::threshold::{Threshold, ThresholdSource, ThresholdValue},
    signals::{Signal, SignalObservation},
};

/// The kubelet's effective eviction configuration, as its configuration file sets it.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletEviction {
    /// Its `evictionHard` (or the Linux defaults when the file has none) and `evictionSoft`
    /// thresholds, with their grace periods and minimum reclaims; no derived thresholds.
    pub thresholds: Vec<Threshold>,
    /// Its `evictionPressureTransitionPeriod`.
    pub pressure_transition_period: Duration,
    /// What the parser accepted but is worth knowing (as for node-monitor's own file).
    pub warnings: Vec<String>,
}

/// Reads the eviction fields of the kubelet's configuration file (`name` is used in errors,
/// usually the path): `evictionHard`, `evictionSoft`, `evictionSoftGracePeriod`,
/// `evictionMinimumReclaim`, `evictionPressureTransitionPeriod` (and
/// `mergeDefaultEvictionSettings`), with the kubelet's defaults. Every other field is ignored; a
/// `nodeMonitor` section, which a kubelet's file does not have, is ignored too. A malformed value
/// is an error naming the file, the field and the value.
pub fn parse_kubelet_config(name: &str, text: &str) -> Result<KubeletEviction, ConfigError> {
    parse_kubelet_sources(
        &[ConfigSource { name, text }],
        &EvictionOverrides::default(),
    )
}

/// The kubelet's effective eviction settings from everything that sets them, in the kubelet's
/// order (`cmd/kubelet/app/server.go`): its configuration file (`--config`), defaulted; then
/// each drop-in (`--config-dir`, in name order) applied as a JSON merge patch, so a drop-in that
/// sets one `evictionHard` entry keeps the others; then its command-line flags, which replace
/// what they name. No source at all gives the kubelet's defaults. Errors name the source, the
/// field (or flag) and the value.
pub fn parse_kubelet_layers(
    file: Option<ConfigSource<'_>>,
    drop_ins: &[ConfigSource<'_>],
    flags: &EvictionOverrides,
) -> Result<KubeletEviction, ConfigError> {
    if drop_ins.is_empty() {
        return parse_kubelet_sources(file.as_slice(), flags);
    }
    // The file is read (and its errors named) on its own first.
    let base_name = file.map_or("the kubelet's defaults", |f| f.name);
    let mut merged = match file {
        Some(f) => {
            parse_kubelet_sources(&[f], &EvictionOverrides::default())?;
            yaml(f)?
        }
        None => Value::Mapping(Mapping::new()),
    };
    if let Value::Mapping(m) = &mut merged {
        // The kubelet defaults the file before it merges the drop-ins.
        let key = Value::from("evictionHard");
        if m.get(&key).is_none_or(Value::is_null) {
            let defaults: Mapping = config::DEFAULT_EVICTION_HARD
                .iter()
                .map(|(s, v)| (Value::from(s.as_str()), Value::from(*v)))
                .collect();
            m.insert(key, Value::Mapping(defaults));
        }
    }
    let mut names = vec![base_name.to_owned()];
    for d in drop_ins {
        // Each drop-in is read (and its errors named) on its own, without the `null`s that
        // only remove entries, then merged.
        let patch = yaml(*d)?;
        let mut values = patch.clone();
        strip_nulls(&mut values);
        let text = serde_norway::to_string(&values).map_err(|source| ConfigError::Syntax {
            source_name: d.name.to_owned(),
            source,
        })?;
        let mut alone = config::parse_document(ConfigSource {
            name: d.name,
            text: &text,
        })?;
        alone.file.node_monitor = None;
        config::load_documents(&[alone], &EvictionOverrides::default())?;
        merge_patch(&mut merged, patch);
        names.push(d.name.to_owned());
    }
    let text = serde_norway::to_string(&merged).map_err(|source| ConfigError::Syntax {
        source_name: names.join(" + "),
        source,
    })?;
    let name = names.join(" + ");
    parse_kubelet_sources(
        &[ConfigSource {
            name: &name,
            text: &text,
        }],
        flags,
    )
}

/// A document's YAML, `null` read as an empty mapping.
fn yaml(source: ConfigSource<'_>) -> Result<Value, ConfigError> {
    let v: Value =
        serde_norway::from_str(source.text).map_err(|source_err| ConfigError::Syntax {
            source_name: source.name.to_owned(),
            source: source_err,
        })?;
    Ok(if v.is_null() {
        Value::Mapping(Mapping::new())
    } else {
        v
    })
}

/// Removes every `null` entry of every mapping.
fn strip_nulls(v: &mut Value) {
    if let Value::Mapping(m) = v {
        m.retain(|_, v| !v.is_null());
        for (_, v) in m.iter_mut() {
            strip_nulls(v);
        }
    }
}

/// RFC 7386 JSON merge patch: mappings merge key by key, `null` removes a key, anything else
/// replaces.
fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Mapping(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_mapping() {
        *target = Value::Mapping(Mapping::new());
    }
    if let Value::Mapping(t) = target {
        for (k, v) in patch {
            if v.is_null() {
                t.remove(&k);
            } else {
                merge_patch(t.entry(k).or_insert(Value::Null), v);
            }
        }
    }
}

/// The kubelet's effective eviction settings from documents that each replace the fields they
/// set (a configuration file, or an already merged one), then its command-line flags, which
/// override them all. No source at all gives the kubelet's defaults.
pub fn parse_kubelet_sources(
    sources: &[ConfigSource<'_>],
    flags: &EvictionOverrides,
) -> Result<KubeletEviction, ConfigError> {
    let mut docs = Vec::with_capacity(sources.len());
    for s in sources {
        let mut doc = config::parse_document(*s)?;
        doc.file.node_monitor = None;
        docs.push(doc);
    }
    let cfg = config::load_documents(&docs, flags)?;
    Ok(KubeletEviction {
        thresholds: own_thresholds(&cfg.thresholds).cloned().collect(),
        pressure_transition_period: cfg.pressure_transition_period,
        warnings: cfg.warnings,
    })
}

/// The configured hard and soft thresholds: not the allocatable or containerfs copies.
fn own_thresholds(ts: &[Threshold]) -> impl Iterator<Item = &Threshold> {
    ts.iter().filter(|t| {
        t.derived_from.is_none()
            && matches!(
                t.source,
                ThresholdSource::EvictionHard | ThresholdSource::EvictionSoft
            )
    })
}

/// Who acts first for one of node-monitor's thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Precedence {
    /// The kubelet's threshold is at or above node-monitor's (and, for a soft one, its grace
    /// period no longer): the kubelet acts at or before node-monitor.
    KubeletFirst,
    /// node-monitor's threshold is above every kubelet threshold that could act as early.
    NodeMonitorFirst,
    /// The kubelet has no threshold for the signal.
    KubeletUnset,
}

impl Precedence {
    /// The name used in logs and docs (`kubelet_first`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KubeletFirst => "kubelet_first",
            Self::NodeMonitorFirst => "node_monitor_first",
            Self::KubeletUnset => "kubelet_unset",
        }
    }
}

impl fmt::Display for Precedence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a comparison is of node-monitor's hard or soft threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A threshold with no grace period.
    Hard,
    /// A threshold with a grace period.
    Soft,
}

impl Kind {
    /// `hard` or `soft`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hard => "hard",
            Self::Soft => "soft",
        }
    }
}

/// One of node-monitor's thresholds set against the kubelet's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Comparison {
    /// The signal.
    pub signal: Signal,
    /// node-monitor's threshold is hard or soft.
    pub kind: Kind,
    /// The verdict.
    pub precedence: Precedence,
    /// node-monitor's threshold, as configured and, when resolved, in base units
    /// (`"100Mi (104857600)"`).
    pub node_monitor: String,
    /// The kubelet threshold that decided (the highest one that could act as early), if any.
    pub kubelet: Option<String>,
}

/// Compares each of node-monitor's hard and soft thresholds with the kubelet's for the same
/// signal. Amounts are compared in the signal's base units, percentages resolved against the
/// signal's capacity in `observed` as the kubelet resolves them; when the capacity is not
/// observed, two percentages are compared as fractions and two quantities as quantities (like
/// with like), and a percentage against a quantity cannot be decided: that threshold is left out
/// of the result.
///
/// node-monitor's hard threshold is preempted by a kubelet threshold that acts without delay
/// (a hard one, or a soft one with a zero grace period) at or above it. node-monitor's soft
/// threshold is preempted by such a threshold too, or by a kubelet soft threshold at or above it
/// whose grace period is no longer than node-monitor's.
pub fn compare(
    kubelet: &[Threshold],
    node_monitor: &[Threshold],
    observed: &BTreeMap<Signal, SignalObservation>,
) -> Vec<Comparison> {
    let mut out = Vec::new();
    for nm in own_thresholds(node_monitor) {
        let capacity = observed.get(&nm.signal).map(|o| o.capacity);
        let kind = if nm.is_hard() { Kind::Hard } else { Kind::Soft };
        let candidates: Vec<&Threshold> = own_thresholds(kubelet)
            .filter(|k| k.signal == nm.signal)
            .collect();
        let node_monitor_text = describe(&nm.value, capacity);
        if candidates.is_empty() {
            out.push(Comparison {
                signal: nm.signal,
                kind,
                precedence: Precedence::KubeletUnset,
                node_monitor: node_monitor_text,
                kubelet: None,
            });
            continue;
        }
        // The kubelet thresholds that act no later than node-monitor's once crossed.
        let as_early = candidates
            .iter()
            .filter(|k| k.is_hard() || (!nm.is_hard() && k.grace_period <= nm.grace_period));
        let mut undecided = false;
        let mut first: Option<&Threshold> = None;
        for k in as_early {
            match at_or_above(&k.value, &nm.value, capacity) {
                Some(true) => {
                    first = Some(k);
                    break;
                }
                Some(false) => {}
                None => undecided = true,
            }
        }
        let (precedence, decided_by) = match first {
            Some(k) => (Precedence::KubeletFirst, Some(k)),
            None if undecided => continue,
            None => (
                Precedence::NodeMonitorFirst,
                candidates
                    .iter()
                    .copied()
                    .max_by_key(|k| u8::from(k.is_hard())),
            ),
        };
        out.push(Comparison {
            signal: nm.signal,
            kind,
            precedence,
            node_monitor: node_monitor_text,
            kubelet: decided_by.map(|k| {
                let text = describe(&k.value, capacity);
                if k.is_hard() {
                    text
                } else {
                    format!(
                        "{text}, soft, grace period {}",
                        crate::units::duration::format_go_duration(k.grace_period)
                    )
                }
            }),
        });
    }
    out.sort();
    out
}

/// Is the kubelet's amount `k` at or above node-monitor's `nm`? `None` when a percentage meets a
/// quantity and the capacity is unknown.
fn at_or_above(k: &ThresholdValue, nm: &ThresholdValue, capacity: Option<i64>) -> Option<bool> {
    match (k, nm, capacity) {
        (ThresholdValue::Quantity(a), ThresholdValue::Quantity(b), _) => {
            Some(a.nanos() >= b.nanos())
        }
        (_, _, Some(c)) => Some(k.resolve(c).nanos() >= nm.resolve(c).nanos()),
        (
            ThresholdValue::Percentage { fraction: a, .. },
            ThresholdValue::Percentage { fraction: b, .. },
            None,
        ) => Some(a >= b),
        _ => None,
    }
}

/// A threshold as configured and, for a percentage with a known capacity, resolved.
fn describe(v: &ThresholdValue, capacity: Option<i64>) -> String {
    match (v, capacity) {
        (ThresholdValue::Percentage { .. }, Some(c)) => format!("{v} ({})", v.resolve(c).value()),
        _ => v.to_string(),
    }
}

#[cfg(test)]
mod tests;
