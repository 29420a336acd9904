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
    load_agent_config_sources(file.as_slice(), overrides)
}

/// Reads several documents once each, in order, and validates both configurations from them:
/// a later document replaces each field an earlier one set (a `nodeMonitor` or
/// `nodeMonitor.shutdown` key one by one; a map such as `evictionHard` whole), then the flags
/// override them all. No document: the kubelet's defaults and no shutdown handling.
pub fn load_agent_config_sources(
    files: &[ConfigSource<'_>],
    overrides: &EvictionOverrides,
) -> Result<AgentConfig, AgentConfigError> {
    let documents = files
        .iter()
        .map(|s| config::parse_document(*s))
        .collect::<Result<Vec<_>, _>>()
        .map_err(AgentConfigError::File)?;
    let eviction = config::load_documents(&documents, overrides)?;
    if documents.is_empty() {
        return Ok(AgentConfig {
            eviction,
            shutdown: ShutdownConfig::default(),
        });
    }
    let (merged, names) = shutdown_fields(&documents);
    let shutdown =
        shutdown_config::shutdown_config(&merged).map_err(|source| AgentConfigError::Shutdown {
            name: names.join(", "),
            source,
        })?;
    Ok(AgentConfig { eviction, shutdown })
}

/// The shutdown fields of every document, later ones over earlier ones, and the names of the
/// documents that set any (the first document's when none does): a shutdown error names them.
fn shutdown_fields(documents: &[config::Document]) -> (config::ConfigFile, Vec<String>) {
    let mut merged = config::ConfigFile::default();
    let mut names = Vec::new();
    for config::Document { name, file } in documents {
        let section = file
            .node_monitor
            .as_ref()
            .and_then(|nm| nm.shutdown.as_ref());
        let sets_any = file.shutdown_grace_period.is_some()
            || file.shutdown_grace_period_critical_pods.is_some()
            || file.shutdown_grace_period_by_pod_priority.is_some()
            || section.is_some();
        if !sets_any {
            continue;
        }
        names.push(name.clone());
        if file.shutdown_grace_period.is_some() {
            merged
                .shutdown_grace_period
                .clone_from(&file.shutdown_grace_period);
        }
        if file.shutdown_grace_period_critical_pods.is_some() {
            merged
                .shutdown_grace_period_critical_pods
                .clone_from(&file.shutdown_grace_period_critical_pods);
        }
        if file.shutdown_grace_period_by_pod_priority.is_some() {
            merged
                .shutdown_grace_period_by_pod_priority
                .clone_from(&file.shutdown_grace_period_by_pod_priority);
        }
        if let Some(section) = section {
            merged
                .node_monitor
                .get_or_insert_with(Default::default)
                .shutdown
                .get_or_insert_with(Default::default)
                .overlay(section);
        }
    }
    if names.is_empty() {
        names.extend(documents.first().map(|d| d.name.clone()));
    }
    (merged, names)
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

    /// Several documents (a base and drop-ins): each field comes from the last document that
    /// sets it, the shutdown keys one by one, and an error names the document.
    #[test]
    fn drop_ins_add_their_keys_to_the_base() {
        let base = ConfigSource {
            name: "config.yaml",
            text: "evictionHard:\n  memory.available: 100Mi\nnodeMonitor:\n  pdbPolicy: respect\n  dryRun: true\n",
        };
        let escalate = ConfigSource {
            name: "config.d/escalate.yaml",
            text: "nodeMonitor:\n  pdbPolicy: escalate\n",
        };
        let shutdown = ConfigSource {
            name: "config.d/shutdown.yaml",
            text: "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\nnodeMonitor:\n  shutdown:\n    enabled: true\n    cordon: false\n",
        };
        let later = ConfigSource {
            name: "config.d/zz-local.yaml",
            text: "nodeMonitor:\n  shutdown:\n    cordon: true\n",
        };
        let c = load_agent_config_sources(
            &[base, escalate, shutdown, later],
            &EvictionOverrides::default(),
        )
        .expect("valid documents");
        assert_eq!(
            c.eviction.node_monitor.pdb_policy,
            config::PdbPolicy::Escalate
        );
        assert!(c.eviction.node_monitor.dry_run, "the base's key stays");
        assert!(!c.eviction.thresholds.is_empty());
        let groups: Vec<u64> = c
            .shutdown
            .groups
            .iter()
            .map(|g| g.period.as_secs())
            .collect();
        assert_eq!(groups, [20, 10]);
        assert!(c.shutdown.options.enabled);
        assert!(c.shutdown.options.cordon, "the later document's key wins");

        // One document alone is what it was.
        let alone =
            load_agent_config_sources(&[base], &EvictionOverrides::default()).expect("base alone");
        assert_eq!(
            alone.eviction.node_monitor.pdb_policy,
            config::PdbPolicy::Respect
        );
        assert!(!alone.shutdown.options.enabled);

        // Errors name the document, the field and the value.
        let bad = ConfigSource {
            name: "config.d/bad.yaml",
            text: "nodeMonitor:\n  pdbPolicy: sometimes\n",
        };
        let e = load_agent_config_sources(&[base, bad], &EvictionOverrides::default())
            .expect_err("bad policy");
        let chain = error_chain(&e);
        assert!(chain.contains("config.d/bad.yaml"), "{chain}");
        assert!(chain.contains("sometimes"), "{chain}");
        let bad = ConfigSource {
            name: "config.d/bad-shutdown.yaml",
            text: "shutdownGracePeriod: 30 seconds\n",
        };
        let e = load_agent_config_sources(&[base, escalate, bad], &EvictionOverrides::default())
            .expect_err("bad duration");
        let chain = error_chain(&e);
        assert!(
            chain.starts_with("--config config.d/bad-shutdown.yaml"),
            "{chain}"
        );
        assert!(chain.contains("\"30 seconds\""), "{chain}");
    }
}
