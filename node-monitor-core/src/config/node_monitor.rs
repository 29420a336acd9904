//! node-monitor's own settings (`nodeMonitor:`), every key validated.
use super::*;

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

pub(super) fn parse_node_monitor(
    entries: &BTreeMap<String, (String, Value)>,
) -> Result<NodeMonitorSettings, ConfigError> {
    let mut s = NodeMonitorSettings::default();
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
        set_key(&mut s, key, field, v)?;
    }
    check_against_each_other(&s, entries)?;
    Ok(s)
}

/// Validates one key of [`NODE_MONITOR_KEYS`] (written as `field`) and sets it in `s`.
fn set_key(
    s: &mut NodeMonitorSettings,
    key: &str,
    field: &str,
    v: &Value,
) -> Result<(), ConfigError> {
    match key {
        "maxPodsPerCycle" => s.max_pods_per_cycle = max_pods_per_cycle(field, v)?,
        "housekeepingInterval" => {
            s.housekeeping_interval = duration_where(
                field,
                v,
                |d| d >= Duration::from_millis(100),
                "must be at least 100ms",
            )?;
        }
        "fastSamplingInterval" => {
            s.fast_sampling_interval = duration_where(
                field,
                v,
                |d| d.is_zero() || d >= Duration::from_millis(10),
                "must be 0s (off) or at least 10ms",
            )?;
        }
        "pdbPolicy" => s.pdb_policy = pdb_policy(field, v)?,
        // Graceful shutdown options: read and validated by `shutdown::parse_shutdown_config`.
        "shutdown" => {}
        "dryRun" => s.dry_run = boolean(field, v)?,
        "taintOnPressure" => s.taint_on_pressure = boolean(field, v)?,
        "psiWindow" => {
            // The kernel's PSI trigger window limits (kernel/sched/psi.c).
            s.psi_window = duration_where(
                field,
                v,
                |d| d >= Duration::from_millis(500) && d <= Duration::from_secs(10),
                "must be between 500ms and 10s",
            )?;
        }
        "psiThreshold" => {
            s.psi_threshold = duration_where(field, v, |d| !d.is_zero(), "must be positive")?;
        }
        "reclaimStallBudget" => {
            s.reclaim_stall_budget = duration_where(
                field,
                v,
                |d| !d.is_zero() && d <= Duration::from_secs(1),
                "must be positive and at most 1s",
            )?;
        }
        "podCleanupTimeout" => {
            s.pod_cleanup_timeout = duration_where(field, v, |d| !d.is_zero(), "must be positive")?;
        }
        "apiTimeout" => {
            s.api_timeout = duration_where(
                field,
                v,
                |d| d >= Duration::from_millis(100) && d <= Duration::from_secs(300),
                "must be between 100ms and 5m",
            )?;
        }
        // Not in NODE_MONITOR_KEYS: rejected by the caller.
        _ => {}
    }
    Ok(())
}

/// The settings bounded by another one: the fast sampling interval by the housekeeping
/// interval, the PSI threshold by the PSI window.
fn check_against_each_other(
    s: &NodeMonitorSettings,
    entries: &BTreeMap<String, (String, Value)>,
) -> Result<(), ConfigError> {
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
    Ok(())
}

fn invalid(field: &str, value: &str, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

/// A non-negative duration string for which `ok` holds; otherwise an error giving `reason`.
fn duration_where(
    field: &str,
    v: &Value,
    ok: impl Fn(Duration) -> bool,
    reason: &str,
) -> Result<Duration, ConfigError> {
    let (d, text) = match v {
        Value::String(text) => (non_negative_duration(field, text)?, text),
        other => {
            return Err(wrong_type(
                field,
                "a duration string such as \"10s\"",
                other,
            ));
        }
    };
    if !ok(d) {
        return Err(invalid(field, text, reason));
    }
    Ok(d)
}

fn boolean(field: &str, v: &Value) -> Result<bool, ConfigError> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(wrong_type(field, "a boolean", other)),
    }
}

fn max_pods_per_cycle(field: &str, v: &Value) -> Result<u32, ConfigError> {
    let n = match v {
        Value::Number(n) => n.as_u64(),
        other => return Err(wrong_type(field, "a positive integer", other)),
    };
    n.and_then(|n| u32::try_from(n).ok())
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| invalid(field, &describe_plain(v), "must be between 1 and 1000"))
}

fn pdb_policy(field: &str, v: &Value) -> Result<PdbPolicy, ConfigError> {
    match v {
        Value::String(p) if p == "respect" => Ok(PdbPolicy::Respect),
        Value::String(p) if p == "escalate" => Ok(PdbPolicy::Escalate),
        Value::String(p) => Err(invalid(field, p, "must be \"respect\" or \"escalate\"")),
        other => Err(wrong_type(field, "\"respect\" or \"escalate\"", other)),
    }
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
