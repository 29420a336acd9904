//! The graceful shutdown configuration: the kubelet's own fields at the top level of the agent's
//! config file (`shutdownGracePeriod`, `shutdownGracePeriodCriticalPods`,
//! `shutdownGracePeriodByPodPriority`, as in a KubeletConfiguration, so the kubelet's file can be
//! passed as it is), plus node-monitor's options under `nodeMonitor.shutdown`.
//!
//! Pure: the caller reads the file and passes its text.
use std::time::Duration;

use serde::Serialize;

use super::{
    GoDuration, Group, KubeletInhibitorPolicy, LOGIND_MAX_DELAY, PriorityPeriod,
    ShutdownConfigError, ShutdownSettings,
};
use crate::{
    config::{
        ConfigFile, ReadError,
        file::{DurationText, PriorityList, ShutdownSection},
        ser_go_duration,
    },
    units::duration::{DurationError, format_go_duration},
};

pub use crate::config::shutdown_model::{LastGasp, PRIORITY_ENTRY_KEYS, SHUTDOWN_OPTION_KEYS};

/// logind's `InhibitDelayMaxSec` when nothing configures it (logind.conf(5)).
pub const LOGIND_DEFAULT_INHIBIT_DELAY: Duration = Duration::from_secs(5);

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
    /// A value the configuration model refuses: of the wrong kind, or not one of the values its
    /// type has.
    #[error("{field}: {message}")]
    Refused {
        /// The setting's path (`nodeMonitor.shutdown.pollInterval`, `shutdownGracePeriod`).
        field: String,
        /// What is wrong, naming the value ("expected a boolean, found the number 1").
        message: String,
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

/// Reads the shutdown configuration from the agent's config file (`None`: no file, shutdown
/// handling off).
pub fn parse_shutdown_config(
    config_file_text: Option<&str>,
) -> Result<ShutdownConfig, ConfigError> {
    let Some(text) = config_file_text else {
        return Ok(ShutdownConfig::default());
    };
    let file = ConfigFile::read(text).map_err(ConfigError::from)?;
    shutdown_config(&file)
}

impl From<ReadError> for ConfigError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Syntax(source) => ConfigError::Syntax(source),
            ReadError::NotAMapping { found } => ConfigError::NotAMapping { found },
            ReadError::Value { field, message } => ConfigError::Refused { field, message },
            ReadError::UnknownKey { field, key, known } => {
                ConfigError::UnknownKey { field, key, known }
            }
        }
    }
}

/// The shutdown configuration of a document already read (the agent reads its file once and
/// validates both the eviction and the shutdown settings from it, [`crate::agent_config`]).
pub fn shutdown_config(file: &ConfigFile) -> Result<ShutdownConfig, ConfigError> {
    let settings = ShutdownSettings {
        shutdown_grace_period: go_duration(
            "shutdownGracePeriod",
            file.shutdown_grace_period.as_ref(),
        )?,
        shutdown_grace_period_critical_pods: go_duration(
            "shutdownGracePeriodCriticalPods",
            file.shutdown_grace_period_critical_pods.as_ref(),
        )?,
        shutdown_grace_period_by_pod_priority: priority_periods(
            file.shutdown_grace_period_by_pod_priority.as_ref(),
        ),
    };
    let groups = settings.groups()?;
    let mut options = ShutdownOptions {
        enabled: !groups.is_empty(),
        ..ShutdownOptions::default()
    };
    let mut warnings = Vec::new();
    if let Some(section) = file
        .node_monitor
        .as_ref()
        .and_then(|nm| nm.shutdown.as_ref())
    {
        parse_options(section, &mut options)?;
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

/// `nodeMonitor.shutdown` over the defaults, each duration bounded.
fn parse_options(s: &ShutdownSection, o: &mut ShutdownOptions) -> Result<(), ConfigError> {
    let field = |key: &str| format!("nodeMonitor.shutdown.{key}");
    if let Some(b) = s.enabled {
        o.enabled = b.0;
    }
    if let Some(b) = s.manage_inhibit_delay {
        o.manage_inhibit_delay = b.0;
    }
    if let Some(b) = s.cordon {
        o.cordon = b.0;
    }
    if let Some(p) = s.kubelet_inhibitor_policy {
        o.kubelet_inhibitor_policy = p;
    }
    if let Some(g) = s.last_gasp {
        o.last_gasp = g;
    }
    if let Some(d) = &s.inhibit_delay_margin {
        o.inhibit_delay_margin = duration(&field("inhibitDelayMargin"), d, Duration::ZERO)?;
    }
    if let Some(d) = &s.last_gasp_timeout {
        o.last_gasp_timeout = duration(&field("lastGaspTimeout"), d, Duration::from_millis(100))?;
    }
    if let Some(d) = &s.poll_interval {
        o.poll_interval = duration(&field("pollInterval"), d, Duration::from_millis(50))?;
    }
    Ok(())
}

/// A KubeletConfiguration duration; absent (or `null`) is zero.
fn go_duration(field: &str, v: Option<&DurationText>) -> Result<GoDuration, ConfigError> {
    let Some(DurationText(text)) = v else {
        return Ok(GoDuration::ZERO);
    };
    GoDuration::parse(text).map_err(|source| ConfigError::Duration {
        field: field.into(),
        value: text.clone(),
        source,
    })
}

/// The entries as the kubelet reads them: a key left out is Go's zero value.
fn priority_periods(list: Option<&PriorityList>) -> Vec<PriorityPeriod> {
    list.map(|l| l.0.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|e| PriorityPeriod {
            priority: e.priority.map_or(0, |p| p.0),
            shutdown_grace_period_seconds: e.shutdown_grace_period_seconds.map_or(0, |s| s.0),
        })
        .collect()
}

fn duration(field: &str, v: &DurationText, min: Duration) -> Result<Duration, ConfigError> {
    let text = &v.0;
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

#[cfg(test)]
mod tests;

/// Property tests (docs/testing.md): `cargo test -p node-monitor-core prop`.
#[cfg(test)]
mod prop;
