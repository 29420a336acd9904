//! node-monitor's own settings (`nodeMonitor:` of the configuration model), every key validated.
use super::*;

/// The keys accepted under `nodeMonitor`; any other key is rejected with this list in the
/// message. `shutdown` is validated by `shutdown::config::shutdown_config`.
pub const NODE_MONITOR_KEYS: [&str; 20] = [
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
    "kubeletConfigPath",
    "livenessLeaseInterval",
    "memoryWorkingSet",
    "memoryPush",
    "rebootProbeFallback",
    "stateDir",
    "predictiveEviction",
    "predictionLead",
];

/// A `nodeMonitor` value with the field name its errors use (`config.yaml: nodeMonitor.psiWindow`).
type Named<T> = Option<(String, T)>;

/// The `nodeMonitor` keys of one or more documents, each from the last document that sets it.
#[derive(Debug, Default)]
pub(super) struct NodeMonitorFields {
    max_pods_per_cycle: Named<serde_norway::Number>,
    housekeeping_interval: Named<String>,
    fast_sampling_interval: Named<String>,
    pdb_policy: Named<PdbPolicy>,
    dry_run: Named<bool>,
    psi_window: Named<String>,
    psi_threshold: Named<String>,
    reclaim_stall_budget: Named<String>,
    pod_cleanup_timeout: Named<String>,
    taint_on_pressure: Named<bool>,
    memory_push: Named<bool>,
    reboot_probe_fallback: Named<bool>,
    api_timeout: Named<String>,
    kubelet_config_path: Named<String>,
    liveness_lease_interval: Named<String>,
    memory_working_set: Named<MemoryWorkingSet>,
    state_dir: Named<String>,
    predictive_eviction: Named<bool>,
    prediction_lead: Named<String>,
}

/// Sets `to` from `from` when the document sets the key, naming the field as it was written.
fn over<T: Clone, U>(
    to: &mut Named<U>,
    from: Option<&T>,
    get: impl Fn(&T) -> U,
    doc: &str,
    key: &str,
) {
    if let Some(v) = from {
        *to = Some((format!("{doc}: nodeMonitor.{key}"), get(v)));
    }
}

impl NodeMonitorFields {
    /// Takes the keys `section` (of the document `doc`) sets.
    pub(super) fn merge(&mut self, doc: &str, section: &NodeMonitorSection) {
        let s = section;
        let d = doc;
        self.merge_flags(d, s);
        for (to, from, key) in [
            (
                &mut self.housekeeping_interval,
                &s.housekeeping_interval,
                "housekeepingInterval",
            ),
            (
                &mut self.fast_sampling_interval,
                &s.fast_sampling_interval,
                "fastSamplingInterval",
            ),
            (&mut self.psi_window, &s.psi_window, "psiWindow"),
            (&mut self.psi_threshold, &s.psi_threshold, "psiThreshold"),
            (
                &mut self.reclaim_stall_budget,
                &s.reclaim_stall_budget,
                "reclaimStallBudget",
            ),
            (
                &mut self.pod_cleanup_timeout,
                &s.pod_cleanup_timeout,
                "podCleanupTimeout",
            ),
            (&mut self.api_timeout, &s.api_timeout, "apiTimeout"),
            (
                &mut self.liveness_lease_interval,
                &s.liveness_lease_interval,
                "livenessLeaseInterval",
            ),
            (
                &mut self.prediction_lead,
                &s.prediction_lead,
                "predictionLead",
            ),
        ] {
            over(to, from.as_ref(), |t: &DurationText| t.0.clone(), d, key);
        }
        over(
            &mut self.max_pods_per_cycle,
            s.max_pods_per_cycle.as_ref(),
            |n| n.0.clone(),
            d,
            "maxPodsPerCycle",
        );
        over(
            &mut self.pdb_policy,
            s.pdb_policy.as_ref(),
            |p| *p,
            d,
            "pdbPolicy",
        );
        over(
            &mut self.kubelet_config_path,
            s.kubelet_config_path.as_ref(),
            |p: &PathText| p.0.clone(),
            d,
            "kubeletConfigPath",
        );
        over(
            &mut self.state_dir,
            s.state_dir.as_ref(),
            |p: &PathText| p.0.clone(),
            d,
            "stateDir",
        );
        over(
            &mut self.memory_working_set,
            s.memory_working_set.as_ref(),
            |m| *m,
            d,
            "memoryWorkingSet",
        );
    }

    /// Takes the boolean keys `section` sets.
    fn merge_flags(&mut self, d: &str, s: &NodeMonitorSection) {
        let flag = |f: &Flag| f.0;
        for (to, from, key) in [
            (&mut self.dry_run, &s.dry_run, "dryRun"),
            (
                &mut self.taint_on_pressure,
                &s.taint_on_pressure,
                "taintOnPressure",
            ),
            (&mut self.memory_push, &s.memory_push, "memoryPush"),
            (
                &mut self.reboot_probe_fallback,
                &s.reboot_probe_fallback,
                "rebootProbeFallback",
            ),
            (
                &mut self.predictive_eviction,
                &s.predictive_eviction,
                "predictiveEviction",
            ),
        ] {
            over(to, from.as_ref(), flag, d, key);
        }
    }
}

/// A duration setting to fill in: where it goes, the value written (if any), the bound it must
/// meet and what to say when it does not.
type DurationSetting<'a> = (
    &'a mut Duration,
    &'a Named<String>,
    fn(Duration) -> bool,
    &'static str,
);

/// Validates every key set and fills in the defaults of the others.
pub(super) fn parse_node_monitor(
    f: &NodeMonitorFields,
) -> Result<NodeMonitorSettings, ConfigError> {
    let mut s = NodeMonitorSettings::default();
    if let Some((field, n)) = &f.max_pods_per_cycle {
        s.max_pods_per_cycle = max_pods_per_cycle(field, n)?;
    }
    if let Some((_, p)) = f.pdb_policy {
        s.pdb_policy = p;
    }
    if let Some((_, b)) = f.dry_run {
        s.dry_run = b;
    }
    if let Some((_, m)) = f.memory_working_set {
        s.memory_working_set = m;
    }
    if let Some((_, b)) = f.taint_on_pressure {
        s.taint_on_pressure = b;
    }
    if let Some((_, b)) = f.memory_push {
        s.memory_push = b;
    }
    if let Some((_, b)) = f.reboot_probe_fallback {
        s.reboot_probe_fallback = b;
    }
    if let Some((_, b)) = f.predictive_eviction {
        s.predictive_eviction = b;
    }
    if let Some((field, path)) = &f.kubelet_config_path {
        if !path.is_empty() && path != KUBELET_CONFIG_AUTO && !path.starts_with('/') {
            return Err(invalid(
                field,
                path,
                "must be an absolute path, \"auto\" (found from the kubelet's command line and \
                 the distributions' paths), or empty (off)",
            ));
        }
        s.kubelet_config_path.clone_from(path);
    }
    if let Some((field, path)) = &f.state_dir {
        if !path.is_empty() && !path.starts_with('/') {
            return Err(invalid(
                field,
                path,
                "must be an absolute path, or empty (off)",
            ));
        }
        s.state_dir.clone_from(path);
    }
    parse_durations(&mut s, f)?;
    check_against_each_other(&s, f)?;
    Ok(s)
}

/// Validates every duration key set, each against its bound.
fn parse_durations(s: &mut NodeMonitorSettings, f: &NodeMonitorFields) -> Result<(), ConfigError> {
    let durations: [DurationSetting<'_>; 9] = [
        (
            &mut s.housekeeping_interval,
            &f.housekeeping_interval,
            |d| d >= Duration::from_millis(100),
            "must be at least 100ms",
        ),
        (
            &mut s.fast_sampling_interval,
            &f.fast_sampling_interval,
            |d| d.is_zero() || d >= Duration::from_millis(10),
            "must be 0s (off) or at least 10ms",
        ),
        // The kernel's PSI trigger window limits (kernel/sched/psi.c).
        (
            &mut s.psi_window,
            &f.psi_window,
            |d| d >= Duration::from_millis(500) && d <= Duration::from_secs(10),
            "must be between 500ms and 10s",
        ),
        (
            &mut s.psi_threshold,
            &f.psi_threshold,
            |d| !d.is_zero(),
            "must be positive",
        ),
        (
            &mut s.reclaim_stall_budget,
            &f.reclaim_stall_budget,
            |d| !d.is_zero() && d <= Duration::from_secs(1),
            "must be positive and at most 1s",
        ),
        (
            &mut s.pod_cleanup_timeout,
            &f.pod_cleanup_timeout,
            |d| !d.is_zero(),
            "must be positive",
        ),
        (
            &mut s.api_timeout,
            &f.api_timeout,
            |d| d >= Duration::from_millis(100) && d <= Duration::from_secs(300),
            "must be between 100ms and 5m",
        ),
        (
            &mut s.liveness_lease_interval,
            &f.liveness_lease_interval,
            |d| d.is_zero() || (d >= Duration::from_secs(1) && d <= Duration::from_secs(60)),
            "must be 0s (off) or between 1s and 1m",
        ),
        (
            &mut s.prediction_lead,
            &f.prediction_lead,
            |d| d >= Duration::from_millis(100) && d <= Duration::from_secs(10),
            "must be between 100ms and 10s",
        ),
    ];
    for (to, from, ok, reason) in durations {
        if let Some((field, text)) = from {
            *to = duration_where(field, text, ok, reason)?;
        }
    }
    Ok(())
}

/// The settings bounded by another one: the fast sampling interval by the housekeeping
/// interval, the PSI threshold by the PSI window.
fn check_against_each_other(
    s: &NodeMonitorSettings,
    f: &NodeMonitorFields,
) -> Result<(), ConfigError> {
    if s.fast_sampling_interval > s.housekeeping_interval {
        let field = f
            .fast_sampling_interval
            .as_ref()
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
        let field = f
            .psi_threshold
            .as_ref()
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

/// A non-negative duration for which `ok` holds; otherwise an error giving `reason`.
fn duration_where(
    field: &str,
    text: &str,
    ok: fn(Duration) -> bool,
    reason: &str,
) -> Result<Duration, ConfigError> {
    let d = non_negative_duration(field, text)?;
    if !ok(d) {
        return Err(invalid(field, text, reason));
    }
    Ok(d)
}

fn max_pods_per_cycle(field: &str, n: &serde_norway::Number) -> Result<u32, ConfigError> {
    n.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| invalid(field, &n.to_string(), "must be between 1 and 1000"))
}
