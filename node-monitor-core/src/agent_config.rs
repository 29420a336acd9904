//! The agent's configuration file, read once into the configuration model
//! ([`config::ConfigFile`]) and validated in one pass: the eviction settings (the
//! KubeletConfiguration eviction fields and `nodeMonitor`) and the graceful shutdown settings
//! (`shutdownGracePeriod*` and `nodeMonitor.shutdown`). The kubelet's eviction flags override the
//! file, as on the kubelet's command line.
//!
//! Pure: the caller reads the file and passes its text.
use crate::{
    config::{self, ConfigSource, EvictionConfig, EvictionOverrides},
    shutdown::config::{self as shutdown_config, ShutdownConfig},
};

/// Everything the agent's configuration file configures.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Thresholds, grace periods and node-monitor's own eviction settings.
    pub eviction: EvictionConfig,
    /// Graceful node shutdown (off when the file configures no grace period).
    pub shutdown: ShutdownConfig,
}

/// Why the configuration cannot be used; the message names the document, the field and the
/// value.
#[derive(Debug, thiserror::Error)]
pub enum AgentConfigError {
    /// The document does not read into the configuration model (not YAML, or a value of the
    /// wrong kind, or an unknown key under `nodeMonitor`).
    #[error(transparent)]
    File(config::ConfigError),
    /// The eviction settings of the document, or a flag.
    #[error(transparent)]
    Eviction(#[from] config::ConfigError),
    /// The shutdown settings of the document.
    #[error("--config {name}")]
    Shutdown {
        /// The document's name (usually its path).
        name: String,
        /// What is wrong, with the field and the value.
        #[source]
        source: shutdown_config::ConfigError,
    },
}

/// Reads the file once (`None`: no file) and validates both configurations from it.
pub fn load_agent_config(
    file: Option<ConfigSource<'_>>,
    overrides: &EvictionOverrides,
) -> Result<AgentConfig, AgentConfigError> {
    let Some(source) = file else {
        return Ok(AgentConfig {
            eviction: config::load_documents(&[], overrides)?,
            shutdown: ShutdownConfig::default(),
        });
    };
    let document = config::parse_document(source).map_err(AgentConfigError::File)?;
    let eviction = config::load_documents(std::slice::from_ref(&document), overrides)?;
    let shutdown = shutdown_config::shutdown_config(&document.file).map_err(|source| {
        AgentConfigError::Shutdown {
            name: document.name.clone(),
            source,
        }
    })?;
    Ok(AgentConfig { eviction, shutdown })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "\
evictionHard:
  memory.available: 300Mi
evictionSoft:
  memory.available: 1Gi
evictionSoftGracePeriod:
  memory.available: 30s
shutdownGracePeriod: 60s
shutdownGracePeriodCriticalPods: 20s
nodeMonitor:
  dryRun: true
  shutdown:
    cordon: false
";

    /// The error and its source, as one line.
    fn error_chain(e: &AgentConfigError) -> String {
        format!(
            "{e}: {}",
            std::error::Error::source(e)
                .map(ToString::to_string)
                .unwrap_or_default()
        )
    }

    fn source(text: &str) -> ConfigSource<'_> {
        ConfigSource {
            name: "node-monitor.yaml",
            text,
        }
    }

    #[test]
    fn one_read_gives_what_the_two_readers_give() {
        let overrides = EvictionOverrides {
            eviction_hard: vec!["memory.available<500Mi".into()],
            ..EvictionOverrides::default()
        };
        let both = load_agent_config(Some(source(FILE)), &overrides).expect("valid file");
        let eviction = config::load_sources(&[source(FILE)], &overrides).expect("eviction");
        let shutdown = shutdown_config::parse_shutdown_config(Some(FILE)).expect("shutdown");
        assert_eq!(both.eviction, eviction);
        assert_eq!(both.shutdown, shutdown);
        assert!(!both.shutdown.groups.is_empty(), "{:?}", both.shutdown);
        assert!(both.eviction.node_monitor.dry_run);
    }

    #[test]
    fn no_file_is_the_kubelets_defaults_and_no_shutdown_handling() {
        let c = load_agent_config(None, &EvictionOverrides::default()).expect("defaults");
        assert_eq!(c.eviction, EvictionConfig::default());
        assert_eq!(c.shutdown, ShutdownConfig::default());
    }

    #[test]
    fn errors_name_the_document_and_the_field() {
        let e = load_agent_config(
            Some(source("evictionHard:\n  memory.available: lots\n")),
            &EvictionOverrides::default(),
        )
        .expect_err("bad threshold");
        let shown = e.to_string();
        assert!(shown.contains("node-monitor.yaml"), "{shown}");
        assert!(shown.contains("lots"), "{shown}");

        let e = load_agent_config(
            Some(source("shutdownGracePeriod: 30\n")),
            &EvictionOverrides::default(),
        )
        .expect_err("a number is not a duration");
        assert!(matches!(e, AgentConfigError::File(_)), "{e:?}");
        let chain = error_chain(&e);
        assert!(chain.contains("node-monitor.yaml"), "{chain}");
        assert!(chain.contains("shutdownGracePeriod"), "{chain}");

        // A string that is not a duration is refused by the shutdown settings' validation.
        let e = load_agent_config(
            Some(source(
                "shutdownGracePeriod: 30 seconds
",
            )),
            &EvictionOverrides::default(),
        )
        .expect_err("not a duration");
        assert!(matches!(e, AgentConfigError::Shutdown { .. }), "{e:?}");
        let chain = error_chain(&e);
        assert!(chain.contains("node-monitor.yaml"), "{chain}");
        assert!(chain.contains("shutdownGracePeriod"), "{chain}");
        assert!(chain.contains("\"30 seconds\""), "{chain}");

        let e = load_agent_config(Some(source("[1, 2]\n")), &EvictionOverrides::default())
            .expect_err("a list is not a configuration");
        assert!(e.to_string().contains("node-monitor.yaml"), "{e}");
    }
}
