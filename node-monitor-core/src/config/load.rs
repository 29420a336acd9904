//! Reading the documents: each replaces the fields it names, the flags override them all, and the
//! thresholds, grace periods and node-monitor settings are validated.
use super::*;

/// [`load_sources`] over documents already parsed: each replaces the fields it names, then the
/// flags override them all.
pub fn load_documents(
    documents: &[Document],
    flags: &EvictionOverrides,
) -> Result<EvictionConfig, ConfigError> {
    let file = FileSettings::from_documents(documents);
    let mut warnings = Vec::new();
    let thresholds = thresholds(&file, flags, &mut warnings)?;
    let max_pod_grace_period_seconds = max_pod_grace_period(&file, flags, &mut warnings)?;
    let pressure_transition_period = pressure_transition_period(&file, flags, &mut warnings)?;
    let node_monitor = parse_node_monitor(&file.node_monitor)?;
    Ok(EvictionConfig {
        thresholds,
        max_pod_grace_period_seconds,
        pressure_transition_period,
        node_monitor,
        local_storage_capacity_isolation: file.local_storage_capacity_isolation.unwrap_or(true),
        warnings,
    })
}

/// `evictionHard`: the flag, else the file (with the defaults merged in on request), else the
/// kubelet's defaults.
fn hard_statements(
    file: &FileSettings,
    flags: &EvictionOverrides,
) -> Result<StatementMap, ConfigError> {
    if !flags.eviction_hard.is_empty() {
        return flag_map(&flags.eviction_hard, "--eviction-hard", '<');
    }
    let Some(mut m) = file.eviction_hard.clone() else {
        return Ok(default_hard());
    };
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
    Ok(m)
}

/// Every threshold: hard, then soft (each with its grace period), each with its minimum reclaim,
/// then the allocatable copies (`addAllocatableThresholds`).
fn thresholds(
    file: &FileSettings,
    flags: &EvictionOverrides,
    warnings: &mut Vec<String>,
) -> Result<Vec<Threshold>, ConfigError> {
    let hard = hard_statements(file, flags)?;
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

    let mut hard_thresholds = parse_statements(&hard, ThresholdSource::EvictionHard, warnings)?;
    let mut soft_thresholds = parse_statements(&soft, ThresholdSource::EvictionSoft, warnings)?;
    // Parsed in this order, so the first error reported stays the same.
    let grace_periods = parse_grace_periods(&grace)?;
    let min_reclaims = parse_min_reclaims(&min_reclaim)?;
    apply_grace_periods(&mut soft_thresholds, &soft, &grace_periods, warnings)?;
    let mut thresholds = Vec::new();
    thresholds.append(&mut hard_thresholds);
    thresholds.append(&mut soft_thresholds);
    apply_min_reclaims(&mut thresholds, &min_reclaims, warnings);
    let copies = allocatable_copies(&thresholds, file);
    thresholds.extend(copies);
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
    Ok(thresholds)
}

/// Every soft threshold needs a grace period; a grace period without a soft threshold is
/// ignored with a warning.
fn apply_grace_periods(
    soft_thresholds: &mut [Threshold],
    soft: &StatementMap,
    grace_periods: &BTreeMap<Signal, Duration>,
    warnings: &mut Vec<String>,
) -> Result<(), ConfigError> {
    for t in soft_thresholds.iter_mut() {
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
    Ok(())
}

/// Each threshold gets the minimum reclaim of its signal; one without a threshold is ignored
/// with a warning.
fn apply_min_reclaims(
    thresholds: &mut [Threshold],
    min_reclaims: &BTreeMap<Signal, ThresholdValue>,
    warnings: &mut Vec<String>,
) {
    for t in thresholds.iter_mut() {
        t.min_reclaim = min_reclaims.get(&t.signal).cloned();
    }
    for signal in min_reclaims.keys() {
        if !thresholds.iter().any(|t| t.signal == *signal) {
            warnings.push(format!(
                "minimum reclaim for {signal} is ignored: there is no threshold for it"
            ));
        }
    }
}

/// `addAllocatableThresholds`: with `pods` enforced (`enforceNodeAllocatable` defaults to
/// `["pods"]`), the hard `memory.available` threshold is copied to `allocatableMemory.available`.
fn allocatable_copies(thresholds: &[Threshold], file: &FileSettings) -> Vec<Threshold> {
    let enforce_pods = file
        .enforce_node_allocatable
        .as_ref()
        .is_none_or(|v| v.iter().any(|k| k == "pods"));
    if !enforce_pods {
        return Vec::new();
    }
    thresholds
        .iter()
        .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
        .map(|t| Threshold {
            signal: Signal::AllocatableMemoryAvailable,
            grace_period: Duration::ZERO,
            source: ThresholdSource::Allocatable,
            derived_from: Some(Signal::MemoryAvailable),
            ..t.clone()
        })
        // A soft memory threshold with a zero grace period would make a second copy with the
        // same key; the first (from the hard threshold) is kept.
        .take(1)
        .collect()
}

/// `evictionMaxPodGracePeriod`: the flag, else the file, else 0.
fn max_pod_grace_period(
    file: &FileSettings,
    flags: &EvictionOverrides,
    warnings: &mut Vec<String>,
) -> Result<i32, ConfigError> {
    let seconds = match &flags.eviction_max_pod_grace_period {
        Some(v) => v.trim().parse::<i32>().map_err(|_| ConfigError::Integer {
            field: "--eviction-max-pod-grace-period".into(),
            value: v.clone(),
        })?,
        None => file.eviction_max_pod_grace_period.unwrap_or(0),
    };
    if seconds < 0 {
        warnings.push(format!(
            "evictionMaxPodGracePeriod {seconds} is negative: the kubelet \
             then terminates soft-evicted pods with its minimum grace period of 1 second"
        ));
    }
    Ok(seconds)
}

/// `evictionPressureTransitionPeriod`: the flag, else the file (zero meaning the default, as
/// `SetDefaults_KubeletConfiguration` treats it), else 5m.
fn pressure_transition_period(
    file: &FileSettings,
    flags: &EvictionOverrides,
    warnings: &mut Vec<String>,
) -> Result<Duration, ConfigError> {
    if let Some(v) = &flags.eviction_pressure_transition_period {
        return non_negative_duration("--eviction-pressure-transition-period", v);
    }
    let Some((field, v)) = &file.eviction_pressure_transition_period else {
        return Ok(DEFAULT_PRESSURE_TRANSITION_PERIOD);
    };
    let d = non_negative_duration(field, v)?;
    if d.is_zero() {
        warnings.push(format!(
            "{field} {v:?} is zero, which the kubelet replaces with the default 5m0s"
        ));
        return Ok(DEFAULT_PRESSURE_TRANSITION_PERIOD);
    }
    Ok(d)
}

/// A map entry with the field name used for it in messages.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub(super) value: String,
    pub(super) field: String,
    /// Written by the user (not a merged-in default).
    pub(super) explicit: bool,
}

#[derive(Debug, Clone, Default)]
pub(super) struct StatementMap {
    pub(super) entries: BTreeMap<String, Entry>,
}

/// The eviction fields of one or more documents, each value with the field name its errors use
/// (`config.yaml: evictionPressureTransitionPeriod`).
#[derive(Debug, Default)]
pub(super) struct FileSettings {
    pub(super) eviction_hard: Option<StatementMap>,
    pub(super) eviction_soft: Option<StatementMap>,
    pub(super) eviction_soft_grace_period: Option<StatementMap>,
    pub(super) eviction_minimum_reclaim: Option<StatementMap>,
    pub(super) eviction_max_pod_grace_period: Option<i32>,
    /// (field name, value)
    pub(super) eviction_pressure_transition_period: Option<(String, String)>,
    pub(super) merge_default_eviction_settings: Option<bool>,
    pub(super) enforce_node_allocatable: Option<Vec<String>>,
    pub(super) local_storage_capacity_isolation: Option<bool>,
    pub(super) node_monitor: NodeMonitorFields,
}

impl FileSettings {
    /// Every document in order: each replaces the fields it sets; the signal maps and
    /// `nodeMonitor` are merged key by key, as the kubelet merges its drop-ins (a drop-in that
    /// sets one disk threshold keeps the memory threshold of the file before it).
    fn from_documents(documents: &[Document]) -> Self {
        fn over<T>(a: &mut Option<T>, b: Option<T>) {
            if b.is_some() {
                *a = b;
            }
        }
        fn merge(a: &mut Option<StatementMap>, b: Option<StatementMap>) {
            match (a.as_mut(), b) {
                (Some(a), Some(b)) => a.entries.extend(b.entries),
                (None, b) => *a = b,
                (Some(_), None) => {}
            }
        }
        let mut out = Self::default();
        for Document { name, file } in documents {
            let map = |field: &str, m: &Option<SignalMap>| {
                m.as_ref()
                    .map(|m| statement_map(&format!("{name}: {field}"), m))
            };
            merge(
                &mut out.eviction_hard,
                map("evictionHard", &file.eviction_hard),
            );
            merge(
                &mut out.eviction_soft,
                map("evictionSoft", &file.eviction_soft),
            );
            merge(
                &mut out.eviction_soft_grace_period,
                map("evictionSoftGracePeriod", &file.eviction_soft_grace_period),
            );
            merge(
                &mut out.eviction_minimum_reclaim,
                map("evictionMinimumReclaim", &file.eviction_minimum_reclaim),
            );
            over(
                &mut out.eviction_max_pod_grace_period,
                file.eviction_max_pod_grace_period.map(|n| n.0),
            );
            over(
                &mut out.eviction_pressure_transition_period,
                file.eviction_pressure_transition_period.as_ref().map(|d| {
                    (
                        format!("{name}: evictionPressureTransitionPeriod"),
                        d.0.clone(),
                    )
                }),
            );
            over(
                &mut out.merge_default_eviction_settings,
                file.merge_default_eviction_settings.map(|b| b.0),
            );
            over(
                &mut out.enforce_node_allocatable,
                file.enforce_node_allocatable.as_ref().map(|l| l.0.clone()),
            );
            over(
                &mut out.local_storage_capacity_isolation,
                file.local_storage_capacity_isolation.map(|b| b.0),
            );
            if let Some(nm) = &file.node_monitor {
                out.node_monitor.merge(name, nm);
            }
        }
        out
    }
}

/// A signal map of a document, each entry named `config.yaml: evictionHard["memory.available"]`.
fn statement_map(field: &str, m: &SignalMap) -> StatementMap {
    StatementMap {
        entries: m
            .0
            .iter()
            .map(|(key, value)| {
                (
                    key.clone(),
                    Entry {
                        value: value.clone(),
                        field: format!("{field}[{key:?}]"),
                        explicit: true,
                    },
                )
            })
            .collect(),
    }
}

pub(super) fn default_hard() -> StatementMap {
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
