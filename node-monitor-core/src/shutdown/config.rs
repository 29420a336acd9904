//! The graceful shutdown configuration: the kubelet's own fields at the top level of the agent's
//! config file (`shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
//! `shutdownGracePeriodByPodPriority`, as in a KubeletConfiguration, so the kubelet's file can be
//! passed as it is), plus node-monitor's options under `nodeMonitor.shutdown`.
//!
//! Pure: the caller reads the file and passes its text.
use std::time::Duration;

use serde::Serialize;
use serde_norway::Value;

use super::{
    GoDuration, Group, KubeletInhibitorPolicy, LOGIND_MAX_DELAY, PriorityPeriod,
    ShutdownConfigError, ShutdownSettings,
};
use crate::{
    config::{describe, describe_plain, ser_go_duration},
    duration::{DurationError, format_go_duration},
};

/// logind's `InhibitDelayMaxSec` when nothing configures it (logind.conf(5)).
pub const LOGIND_DEFAULT_INHIBIT_DELAY: Duration = Duration::from_secs(5);

/// What to tell the API when a reboot or power-off bypassed the inhibitor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum LastGasp {
    /// Nothing: log and count only.
    None,
    /// Set the `NodeMonitorShuttingDown` condition to True with reason `NonGracefulShutdown`.
    #[default]
    Condition,
    /// Set the `node-monitor.io/last-gasp` annotation on the node.
    Annotation,
}

/// node-monitor's own shutdown options (`nodeMonitor.shutdown`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownOptions {
    /// Run the shutdown manager. Default: on when the kubelet fields configure any group.
    pub enabled: bool,
    /// Raise logind's `InhibitDelayMaxSec` with a drop-in when it is shorter than needed.
    pub manage_inhibit_delay: bool,
    /// Added to the groups' budget for marking the node and the API's confirmations.
    #[serde(serialize_with = "ser_go_duration")]
    pub inhibit_delay_margin: Duration,
    /// What node-monitor does when the kubelet holds its own shutdown inhibitor.
    pub kubelet_inhibitor_policy: KubeletInhibitorPolicy,
    /// Also cordon the node (`spec.unschedulable`) while it shuts down.
    pub cordon: bool,
    /// What to tell the API when a reboot or power-off bypassed the inhibitor.
    pub last_gasp: LastGasp,
    /// The last gasp is one API request bounded by this.
    #[serde(serialize_with = "ser_go_duration")]
    pub last_gasp_timeout: Duration,
    /// How often the API is asked which pods of the running group are still there.
    #[serde(serialize_with = "ser_go_duration")]
    pub poll_interval: Duration,
}

impl Default for ShutdownOptions {
    fn default() -> Self {
        Self {
            enabled: false,
            manage_inhibit_delay: true,
            inhibit_delay_margin: Duration::from_secs(5),
            kubelet_inhibitor_policy: KubeletInhibitorPolicy::default(),
            cordon: false,
            last_gasp: LastGasp::default(),
            last_gasp_timeout: Duration::from_secs(2),
            poll_interval: Duration::from_millis(250),
        }
    }
}

/// The validated shutdown configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownConfig {
    /// The kubelet's shutdown fields as read.
    pub settings: ShutdownSettings,
    /// The groups, lowest priority first (validated from `settings`).
    pub groups: Vec<Group>,
    /// node-monitor's own options (`nodeMonitor.shutdown`).
    pub options: ShutdownOptions,
    /// Accepted but worth knowing.
    pub warnings: Vec<String>,
}

impl ShutdownConfig {
    /// The sum of the groups' periods (validated to fit [`LOGIND_MAX_DELAY`]; saturating for a
    /// value built by hand).
    pub fn budget(&self) -> Duration {
        self.groups
            .iter()
            .fold(Duration::ZERO, |sum, g| sum.saturating_add(g.period))
    }

    /// What logind must allow: the budget plus the margin. Zero without groups.
    pub fn needed_inhibit_delay(&self) -> Duration {
        if self.groups.is_empty() {
            Duration::ZERO
        } else {
            self.budget()
                .saturating_add(self.options.inhibit_delay_margin)
        }
    }
}

/// A shutdown configuration that cannot be used; every message names the field and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The document does not parse as YAML (JSON included); the parser's error, with its
    /// position.
    #[error("config file: not a valid YAML or JSON document")]
    Syntax(#[source] serde_norway::Error),
    /// The document is a scalar or a list, not a KubeletConfiguration mapping.
    #[error("config file: expected a mapping of KubeletConfiguration fields, found {found}")]
    NotAMapping {
        /// What the document is instead (`a list`, `the string "x"`).
        found: String,
    },
    /// A field holds the wrong kind of value.
    #[error("{field}: expected {expected}, found {found}")]
    WrongType {
        /// The setting's path (`nodeMonitor.shutdown.pollInterval`, `shutdownGracePeriod`).
        field: String,
        /// What the field takes.
        expected: &'static str,
        /// What it holds instead.
        found: String,
    },
    /// A value that does not parse as a Go duration.
    #[error("{field}: invalid duration {value:?}")]
    Duration {
        /// The setting's path (`nodeMonitor.shutdown.pollInterval`, `shutdownGracePeriod`).
        field: String,
        /// The value as written.
        value: String,
        /// Why it does not parse.
        #[source]
        source: DurationError,
    },
    /// A key under `nodeMonitor.shutdown`, or in a `shutdownGracePeriodByPodPriority` entry, that
    /// is not known there.
    #[error("{field}: unknown setting {key:?}; known settings: {known}")]
    UnknownKey {
        /// The setting's path (`nodeMonitor.shutdown.pollInterval`, `shutdownGracePeriod`).
        field: String,
        /// The unknown key.
        key: String,
        /// The keys accepted there, comma-separated.
        known: String,
    },
    /// A value of the right type that is out of range or not one of the allowed words; `reason`
    /// says why.
    #[error("{field}: {value:?} {reason}")]
    Invalid {
        /// The setting's path (`nodeMonitor.shutdown.pollInterval`, `shutdownGracePeriod`).
        field: String,
        /// The value as written.
        value: String,
        /// What is wrong with it, worded to follow the value.
        reason: String,
    },
    /// The kubelet's shutdown fields are ones the kubelet would refuse, or need more than logind
    /// can wait.
    #[error(transparent)]
    Settings(#[from] ShutdownConfigError),
}

/// The KubeletConfiguration shutdown fields read at the top level of the config document (every
/// other top-level field but `nodeMonitor` is skipped); docs/configuration.md documents each.
pub const SHUTDOWN_FILE_FIELDS: [&str; 3] = [
    "shutdownGracePeriod",
    "shutdownGracePeriodCriticalPods",
    "shutdownGracePeriodByPodPriority",
];

/// The keys accepted under `nodeMonitor.shutdown`; any other key is rejected with this list.
pub const SHUTDOWN_OPTION_KEYS: [&str; 8] = [
    "enabled",
    "manageInhibitDelay",
    "inhibitDelayMargin",
    "kubeletInhibitorPolicy",
    "cordon",
    "lastGasp",
    "lastGaspTimeout",
    "pollInterval",
];

/// The keys of one `shutdownGracePeriodByPodPriority` entry; any other key is rejected.
pub const PRIORITY_ENTRY_KEYS: [&str; 2] = ["priority", "shutdownGracePeriodSeconds"];

/// Reads the shutdown configuration from the agent's config file (`None`: no file, shutdown
/// handling off).
pub fn parse_shutdown_config(
    config_file_text: Option<&str>,
) -> Result<ShutdownConfig, ConfigError> {
    let Some(text) = config_file_text else {
        return Ok(ShutdownConfig::default());
    };
    let doc: Value = serde_norway::from_str(text).map_err(ConfigError::Syntax)?;
    parse_shutdown_document(&doc)
}

/// The shutdown configuration of a document already parsed (the agent parses its file once and
/// reads both the eviction and the shutdown settings from it, [`crate::agent_config`]).
pub fn parse_shutdown_document(doc: &Value) -> Result<ShutdownConfig, ConfigError> {
    let map = match doc.clone() {
        Value::Null => return Ok(ShutdownConfig::default()),
        Value::Mapping(m) => m,
        other => {
            return Err(ConfigError::NotAMapping {
                found: describe(&other),
            });
        }
    };
    let mut settings = ShutdownSettings::default();
    let mut options_map = None;
    for (k, v) in &map {
        let Value::String(key) = k else { continue };
        if key == "nodeMonitor" {
            // Anything but a mapping is rejected by the eviction configuration's parser.
            if let Value::Mapping(nm) = v
                && let Some(s) = nm.get("shutdown")
            {
                options_map = Some(s.clone());
            }
            continue;
        }
        // Any other KubeletConfiguration field: not read here.
        if !SHUTDOWN_FILE_FIELDS.contains(&key.as_str()) {
            continue;
        }
        match key.as_str() {
            "shutdownGracePeriod" => settings.shutdown_grace_period = go_duration(key, v)?,
            "shutdownGracePeriodCriticalPods" => {
                settings.shutdown_grace_period_critical_pods = go_duration(key, v)?;
            }
            "shutdownGracePeriodByPodPriority" => {
                settings.shutdown_grace_period_by_pod_priority = priority_list(key, v)?;
            }
            // Not in SHUTDOWN_FILE_FIELDS: skipped above.
            _ => {}
        }
    }
    let groups = settings.groups()?;
    let mut options = ShutdownOptions {
        enabled: !groups.is_empty(),
        ..ShutdownOptions::default()
    };
    let mut warnings = Vec::new();
    match options_map {
        None | Some(Value::Null) => {}
        Some(Value::Mapping(m)) => parse_options(&m, &mut options)?,
        Some(other) => {
            return Err(wrong_type("nodeMonitor.shutdown", "a mapping", &other));
        }
    }
    if options.enabled && groups.is_empty() {
        warnings.push(
            "nodeMonitor.shutdown.enabled is true but no shutdownGracePeriod or \
             shutdownGracePeriodByPodPriority is set: no inhibitor is taken; shutdowns are only \
             watched and inhibitor bypasses reported"
                .to_owned(),
        );
    }
    if groups.iter().any(|g| g.period.is_zero()) {
        warnings.push(
            "a shutdown group has a zero period: its pods are deleted with the API's minimum \
             grace period of 1s and not waited for"
                .to_owned(),
        );
    }
    let mut config = ShutdownConfig {
        settings,
        groups,
        options,
        warnings,
    };
    let needed = config.needed_inhibit_delay();
    if needed > LOGIND_MAX_DELAY {
        return Err(ConfigError::Invalid {
            field: "nodeMonitor.shutdown.inhibitDelayMargin".into(),
            value: format_go_duration(config.options.inhibit_delay_margin),
            reason: format!(
                "makes the delay logind must grant ({}s) longer than its InhibitDelayMaxSec can \
                 hold ({}s)",
                needed.as_secs(),
                LOGIND_MAX_DELAY.as_secs()
            ),
        });
    }
    if config.options.enabled
        && !config.options.manage_inhibit_delay
        && needed > LOGIND_DEFAULT_INHIBIT_DELAY
    {
        config.warnings.push(format!(
            "nodeMonitor.shutdown.manageInhibitDelay is false and the shutdown groups need {}s \
             (their periods plus inhibitDelayMargin): logind's InhibitDelayMaxSec (default {}s) \
             must be at least that on every node, or logind ends the delay early",
            needed.as_secs(),
            LOGIND_DEFAULT_INHIBIT_DELAY.as_secs()
        ));
    }
    Ok(config)
}

fn parse_options(m: &serde_norway::Mapping, o: &mut ShutdownOptions) -> Result<(), ConfigError> {
    for (k, v) in m {
        let Value::String(key) = k else {
            return Err(wrong_type("nodeMonitor.shutdown", "string keys", k));
        };
        if !SHUTDOWN_OPTION_KEYS.contains(&key.as_str()) {
            return Err(ConfigError::UnknownKey {
                field: "nodeMonitor.shutdown".into(),
                key: key.clone(),
                known: SHUTDOWN_OPTION_KEYS.join(", "),
            });
        }
        let field = format!("nodeMonitor.shutdown.{key}");
        match key.as_str() {
            "enabled" => o.enabled = boolean(&field, v)?,
            "manageInhibitDelay" => o.manage_inhibit_delay = boolean(&field, v)?,
            "cordon" => o.cordon = boolean(&field, v)?,
            "inhibitDelayMargin" => o.inhibit_delay_margin = duration(&field, v, Duration::ZERO)?,
            "lastGaspTimeout" => {
                o.last_gasp_timeout = duration(&field, v, Duration::from_millis(100))?;
            }
            "pollInterval" => o.poll_interval = duration(&field, v, Duration::from_millis(50))?,
            "kubeletInhibitorPolicy" => {
                let s = string(&field, v, "takeOver, cooperate or standAside")?;
                o.kubelet_inhibitor_policy = KubeletInhibitorPolicy::ALL
                    .iter()
                    .find(|(name, _)| *name == s)
                    .map(|(_, p)| *p)
                    .ok_or_else(|| ConfigError::Invalid {
                        field: field.clone(),
                        value: s.to_owned(),
                        reason: "must be \"takeOver\", \"cooperate\" or \"standAside\"".into(),
                    })?;
            }
            "lastGasp" => {
                let s = string(&field, v, "none, condition or annotation")?;
                o.last_gasp = match s {
                    "none" => LastGasp::None,
                    "condition" => LastGasp::Condition,
                    "annotation" => LastGasp::Annotation,
                    other => {
                        return Err(ConfigError::Invalid {
                            field,
                            value: other.to_owned(),
                            reason: "must be \"none\", \"condition\" or \"annotation\"".into(),
                        });
                    }
                };
            }
            // Not in SHUTDOWN_OPTION_KEYS: rejected above.
            _ => {}
        }
    }
    Ok(())
}

fn go_duration(field: &str, v: &Value) -> Result<GoDuration, ConfigError> {
    match v {
        Value::Null => Ok(GoDuration::ZERO),
        Value::String(s) => GoDuration::parse(s).map_err(|source| ConfigError::Duration {
            field: field.into(),
            value: s.clone(),
            source,
        }),
        other => Err(wrong_type(
            field,
            "a duration string such as \"30s\"",
            other,
        )),
    }
}

fn priority_list(field: &str, v: &Value) -> Result<Vec<PriorityPeriod>, ConfigError> {
    let items = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Sequence(items) => items,
        other => {
            return Err(wrong_type(
                field,
                "a list of {priority, shutdownGracePeriodSeconds}",
                other,
            ));
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let entry = format!("{field}[{i}]");
        let Value::Mapping(m) = item else {
            return Err(wrong_type(
                &entry,
                "a mapping {priority, shutdownGracePeriodSeconds}",
                item,
            ));
        };
        // Go's zero values for fields left out.
        let mut p = PriorityPeriod {
            priority: 0,
            shutdown_grace_period_seconds: 0,
        };
        for (k, v) in m {
            let key = k.as_str().unwrap_or_default();
            if !PRIORITY_ENTRY_KEYS.contains(&key) {
                return Err(ConfigError::UnknownKey {
                    field: entry,
                    key: describe_plain(k),
                    known: PRIORITY_ENTRY_KEYS.join(", "),
                });
            }
            let f = format!("{entry}.{key}");
            match key {
                "priority" => {
                    p.priority = v
                        .as_i64()
                        .and_then(|n| i32::try_from(n).ok())
                        .ok_or_else(|| invalid_number(&f, v, "is not a 32-bit integer"))?;
                }
                "shutdownGracePeriodSeconds" => {
                    p.shutdown_grace_period_seconds = v
                        .as_i64()
                        .ok_or_else(|| invalid_number(&f, v, "is not an integer (seconds)"))?;
                }
                // Not in PRIORITY_ENTRY_KEYS: rejected above.
                _ => {}
            }
        }
        out.push(p);
    }
    Ok(out)
}

fn invalid_number(field: &str, v: &Value, reason: &str) -> ConfigError {
    ConfigError::Invalid {
        field: field.into(),
        value: describe_plain(v),
        reason: reason.into(),
    }
}

fn boolean(field: &str, v: &Value) -> Result<bool, ConfigError> {
    match v {
        Value::Bool(b) => Ok(*b),
        other => Err(wrong_type(field, "a boolean", other)),
    }
}

fn string<'a>(field: &str, v: &'a Value, expected: &'static str) -> Result<&'a str, ConfigError> {
    match v {
        Value::String(s) => Ok(s),
        other => Err(wrong_type(field, expected, other)),
    }
}

fn duration(field: &str, v: &Value, min: Duration) -> Result<Duration, ConfigError> {
    let Value::String(text) = v else {
        return Err(wrong_type(field, "a duration string such as \"5s\"", v));
    };
    let d = GoDuration::parse(text).map_err(|source| ConfigError::Duration {
        field: field.into(),
        value: text.clone(),
        source,
    })?;
    let d = u64::try_from(d.0)
        .map(Duration::from_nanos)
        .map_err(|_| ConfigError::Invalid {
            field: field.into(),
            value: text.clone(),
            reason: "must not be negative".into(),
        })?;
    if d < min {
        return Err(ConfigError::Invalid {
            field: field.into(),
            value: text.clone(),
            reason: format!("must be at least {}", format_go_duration(min)),
        });
    }
    Ok(d)
}

fn wrong_type(field: &str, expected: &'static str, found: &Value) -> ConfigError {
    ConfigError::WrongType {
        field: field.into(),
        expected,
        found: describe(found),
    }
}

#[cfg(test)]
mod tests;

/// Property tests (docs/testing.md): `cargo test -p node-monitor-core prop`.
#[cfg(test)]
mod prop;
