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
