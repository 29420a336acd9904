//! The agent's settings from its command line: the kubelet's eviction flags, and the
//! configuration file read once (`run` and `check-config` share this reader, so what fails in one
//! fails in the other).
use node_monitor_core::{
    agent_config::{AgentConfig, load_agent_config_sources},
    config::{ConfigSource, EvictionOverrides},
};

/// The kubelet's eviction flags, flattened by `run`, `check-config` and `explain`; they become the
/// core's [`EvictionOverrides`].
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EvictionFlags {
    /// Hard eviction thresholds, e.g. `memory.available<100Mi,nodefs.available<10%`. Replaces
    /// `evictionHard` from the config file. Repeatable.
    #[arg(long = "eviction-hard", value_name = "SIGNAL<QUANTITY,...")]
    pub eviction_hard: Vec<String>,
    /// Soft eviction thresholds, e.g. `memory.available<1.5Gi`. Replaces `evictionSoft`.
    #[arg(long = "eviction-soft", value_name = "SIGNAL<QUANTITY,...")]
    pub eviction_soft: Vec<String>,
    /// Grace periods for the soft thresholds, e.g. `memory.available=1m30s`. Replaces
    /// `evictionSoftGracePeriod`.
    #[arg(
        long = "eviction-soft-grace-period",
        value_name = "SIGNAL=DURATION,..."
    )]
    pub eviction_soft_grace_period: Vec<String>,
    /// Maximum grace period in seconds for pods evicted by a soft threshold. Replaces
    /// `evictionMaxPodGracePeriod`.
    #[arg(
        long = "eviction-max-pod-grace-period",
        value_name = "SECONDS",
        allow_hyphen_values = true
    )]
    pub eviction_max_pod_grace_period: Option<String>,
    /// Minimum amounts to reclaim once a threshold is met, e.g. `memory.available=0Mi`.
    /// Replaces `evictionMinimumReclaim`.
    #[arg(long = "eviction-minimum-reclaim", value_name = "SIGNAL=QUANTITY,...")]
    pub eviction_minimum_reclaim: Vec<String>,
    /// How long a pressure condition stays true after its threshold stops being met. Replaces
    /// `evictionPressureTransitionPeriod`.
    #[arg(
        long = "eviction-pressure-transition-period",
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub eviction_pressure_transition_period: Option<String>,
}

impl EvictionFlags {
    /// The flags as the core's overrides (validated when the configuration is loaded).
    pub fn overrides(&self) -> EvictionOverrides {
        EvictionOverrides {
            eviction_hard: self.eviction_hard.clone(),
            eviction_soft: self.eviction_soft.clone(),
            eviction_soft_grace_period: self.eviction_soft_grace_period.clone(),
            eviction_max_pod_grace_period: self.eviction_max_pod_grace_period.clone(),
            eviction_minimum_reclaim: self.eviction_minimum_reclaim.clone(),
            eviction_pressure_transition_period: self.eviction_pressure_transition_period.clone(),
        }
    }
}

/// Reads every `--config` once and loads the eviction and the graceful shutdown configuration
/// from them, in order (each document replaces the fields it sets), with the eviction flags over
/// them all. A directory stands for its configuration files ([`config_files`]).
pub fn load_config(
    paths: &[std::path::PathBuf],
    flags: &EvictionFlags,
) -> anyhow::Result<AgentConfig> {
    let mut files = Vec::new();
    for p in paths {
        files.extend(config_files(p)?);
    }
    let texts = files
        .iter()
        .map(|p| {
            Ok((
                p.display().to_string(),
                crate::io::read_file_bounded(p, "--config", crate::io::MAX_INPUT_BYTES)?,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let sources: Vec<ConfigSource<'_>> = texts
        .iter()
        .map(|(name, text)| ConfigSource { name, text })
        .collect();
    if !files.is_empty() {
        tracing::info!(files = ?texts.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), "configuration");
    }
    Ok(load_agent_config_sources(&sources, &flags.overrides())?)
}

/// The configuration files `path` stands for: itself when it is not a directory; for a directory
/// (a `conf.d`, or a ConfigMap volume), its entries named `*.yaml`, `*.yml` or `*.json` in byte
/// order of their names, skipping names that start with `.` (a ConfigMap volume's `..data`
/// and timestamped directories). Another entry is an error, so a stray file is not silently
/// ignored.
pub fn config_files(path: &std::path::Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    use anyhow::Context as _;
    let meta = std::fs::metadata(path).with_context(|| format!("--config {}", path.display()))?;
    if !meta.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut entries = Vec::new();
    for entry in
        std::fs::read_dir(path).with_context(|| format!("--config {}: list", path.display()))?
    {
        let entry = entry.with_context(|| format!("--config {}: list", path.display()))?;
        entries.push((
            entry.file_name().to_string_lossy().into_owned(),
            entry.path(),
        ));
    }
    // Name order, so that both the documents and the first refused entry are the same on every
    // file system.
    entries.sort();
    let mut out = Vec::new();
    for (name, p) in entries {
        if name.starts_with('.') {
            continue;
        }
        if !(name.ends_with(".yaml") || name.ends_with(".yml") || name.ends_with(".json")) {
            anyhow::bail!(
                "--config {}: {name:?} is not a configuration file (*.yaml, *.yml or *.json); \
                 move it out of the directory",
                path.display()
            );
        }
        out.push(p);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory is its configuration files in name order, hidden entries skipped; each
    /// document's fields replace the earlier ones'; an error names the file.
    #[test]
    fn a_directory_is_read_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("config.yaml");
        std::fs::write(
            &base,
            "evictionHard:\n  memory.available: 100Mi\nnodeMonitor:\n  pdbPolicy: respect\n",
        )
        .expect("write");
        let d = dir.path().join("config.d");
        std::fs::create_dir_all(d.join("..2026_01_01")).expect("mkdir");
        std::fs::write(
            d.join("escalate.yaml"),
            "nodeMonitor:\n  pdbPolicy: escalate\n",
        )
        .expect("write");
        std::fs::write(
            d.join("shutdown.yaml"),
            "shutdownGracePeriod: 30s\nnodeMonitor:\n  shutdown:\n    enabled: true\n",
        )
        .expect("write");
        std::fs::write(d.join("..data"), "not: read\n").expect("write");
        assert_eq!(
            config_files(&d).expect("listed"),
            [d.join("escalate.yaml"), d.join("shutdown.yaml")]
        );
        let c = load_config(&[base.clone(), d.clone()], &EvictionFlags::default()).expect("loads");
        assert_eq!(
            c.eviction.node_monitor.pdb_policy,
            node_monitor_core::config::PdbPolicy::Escalate
        );
        assert!(c.shutdown.options.enabled);
        // The base alone: neither drop-in.
        let c = load_config(std::slice::from_ref(&base), &EvictionFlags::default()).expect("loads");
        assert!(!c.shutdown.options.enabled);

        std::fs::write(d.join("zz.yaml"), "nodeMonitor:\n  pdbPolicy: never\n").expect("write");
        let e = format!(
            "{:#}",
            load_config(&[base.clone(), d.clone()], &EvictionFlags::default())
                .expect_err("bad value")
        );
        assert!(e.contains("zz.yaml") && e.contains("never"), "{e}");
        std::fs::remove_file(d.join("zz.yaml")).expect("rm");
        std::fs::write(d.join("notes.txt"), "").expect("write");
        let e = format!("{:#}", config_files(&d).expect_err("stray file"));
        assert!(e.contains("notes.txt"), "{e}");
    }
}
