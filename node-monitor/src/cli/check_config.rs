//! `node-monitor check-config`: validate the configuration exactly as `node-monitor run` does at
//! start (the eviction fields and flags, then the graceful-shutdown fields and
//! `nodeMonitor.shutdown`), and print the effective thresholds, or with `--shutdown` the shutdown
//! groups, as JSON. The contract is in docs/cli.md.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::shutdown::ShutdownConfig;

use crate::settings::EvictionFlags;
use node_monitor_core::{
    config::{ConfigSource, EvictionConfig, load_sources},
    signals::threshold::{Threshold, ThresholdValue},
};

/// Validate the configuration as the agent does at start and print the effective thresholds (or,
/// with `--shutdown`, the graceful-shutdown groups) as JSON.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A KubeletConfiguration file (YAML or JSON); node-monitor's own settings go under
    /// `nodeMonitor:`. Other kubelet fields are ignored. Repeatable, read in order as `run`
    /// reads them; a directory stands for its `*.yaml`, `*.yml` and `*.json` files in name order.
    #[arg(long, value_name = "FILE|DIR")]
    pub config: Vec<PathBuf>,
    #[command(flatten)]
    pub eviction: EvictionFlags,
    /// Print the validated graceful-shutdown configuration (groups, budget, options) instead of
    /// the eviction thresholds.
    #[arg(long)]
    pub shutdown: bool,
    /// Print every `--config` document in node-monitor's current form instead (YAML, one
    /// document each, in the order read): a document that states no version gets `apiVersion:
    /// node-monitor.io/v1alpha1` and `kind: NodeMonitorConfiguration`; the others are printed as
    /// they are. The configuration is validated first.
    #[arg(long, conflicts_with = "shutdown")]
    pub migrate: bool,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    // The same loader as `node-monitor run`: what fails here fails there.
    let node_monitor_core::agent_config::AgentConfig {
        eviction: config,
        shutdown,
    } = crate::settings::load_config(&args.config, &args.eviction)?;
    for warning in &config.warnings {
        tracing::warn!(%warning, "eviction configuration");
    }
    for warning in &shutdown.warnings {
        tracing::warn!(%warning, "shutdown configuration");
    }
    if args.migrate {
        crate::io::print_line(&migrated(&args.config)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let out = if args.shutdown {
        shutdown_json(&shutdown)
    } else {
        thresholds_json(&config)
    };
    crate::io::print_line(&serde_json::to_string_pretty(&out)?)?;
    Ok(ExitCode::SUCCESS)
}

/// `--migrate`'s output: each document of `paths` in the current form, with its name as a comment.
fn migrated(paths: &[PathBuf]) -> anyhow::Result<String> {
    let mut docs = Vec::new();
    for path in paths {
        for file in crate::settings::config_files(path)? {
            let text = crate::io::read_file_bounded(&file, "--config", crate::io::MAX_INPUT_BYTES)?;
            let version = node_monitor_core::config::ConfigFile::read(&text)
                .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
                .version;
            docs.push(format!(
                "# {}\n{}",
                file.display(),
                node_monitor_core::config::file::version::migrated(&text, version)
            ));
        }
    }
    Ok(docs.join("---\n").trim_end().to_owned())
}

/// The JSON object `check-config --shutdown` prints.
pub(crate) fn shutdown_json(config: &ShutdownConfig) -> Value {
    json!({
        "enabled": config.options.enabled,
        "groups": config.groups.iter().map(|g| json!({
            "priority": g.priority,
            "period_seconds": g.period.as_secs(),
        })).collect::<Vec<_>>(),
        "budget_seconds": config.budget().as_secs(),
        "needed_inhibit_delay_seconds": config.needed_inhibit_delay().as_secs(),
        "options": config.options,
    })
}

/// Reads `--config` (if any) over the given earlier documents, then applies the flags.
pub(crate) fn load(
    config_path: Option<&std::path::Path>,
    earlier: &[ConfigSource<'_>],
    flags: &EvictionFlags,
) -> anyhow::Result<EvictionConfig> {
    let text = config_path
        .map(|p| {
            crate::io::read_file_bounded(p, "the config file", crate::io::MAX_INPUT_BYTES)
                .context("cannot read the configuration")
        })
        .transpose()?;
    let name = config_path.map(|p| p.display().to_string());
    let mut sources = earlier.to_vec();
    if let (Some(text), Some(name)) = (&text, &name) {
        sources.push(ConfigSource { name, text });
    }
    Ok(load_sources(&sources, &flags.overrides())?)
}

/// The JSON array `check-config` prints.
pub(crate) fn thresholds_json(config: &EvictionConfig) -> Value {
    Value::Array(config.thresholds.iter().map(threshold_json).collect())
}

fn threshold_json(t: &Threshold) -> Value {
    let mut v = json!({
        "signal": t.signal,
        "operator": t.operator,
        "hard": t.is_hard(),
        "grace_period_seconds": number(t.grace_period.as_secs_f64()),
        "min_reclaim": t.min_reclaim.as_ref().map(amount),
        "source": t.source,
        "derived_from": t.derived_from,
    });
    if let (Value::Object(map), Value::Object(value)) = (&mut v, amount(&t.value)) {
        map.extend(value);
    }
    v
}

/// `{"quantity": <base units>}` or `{"percentage": <0-100>}`.
fn amount(v: &ThresholdValue) -> Value {
    match v {
        ThresholdValue::Quantity(q) => json!({ "quantity": q.value() }),
        ThresholdValue::Percentage { percent, .. } => json!({ "percentage": number(*percent) }),
    }
}

/// Whole numbers print without a fraction.
fn number(x: f64) -> Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        json!(x as i64)
    } else {
        json!(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use node_monitor_core::config::load;

    #[test]
    fn json_shape() {
        let flags = EvictionFlags {
            eviction_hard: vec!["memory.available<100Mi,nodefs.available<7.5%".into()],
            eviction_soft: vec!["memory.available<1Gi".into()],
            eviction_soft_grace_period: vec!["memory.available=1.5s".into()],
            eviction_minimum_reclaim: vec!["nodefs.available=1%".into()],
            ..Default::default()
        };
        let v = thresholds_json(&load(None, &flags.overrides()).expect("config"));
        assert_eq!(
            v[0],
            json!({"signal": "memory.available", "operator": "LessThan", "quantity": 104857600,
                   "hard": true, "grace_period_seconds": 0, "min_reclaim": null,
                   "source": "evictionHard", "derived_from": null})
        );
        assert_eq!(v[1]["percentage"], json!(7.5));
        assert_eq!(v[1]["min_reclaim"], json!({"percentage": 1}));
        assert_eq!(v[2]["grace_period_seconds"], json!(1.5));
        assert_eq!(v[2]["hard"], json!(false));
        assert_eq!(v[3]["source"], "allocatable");
        assert_eq!(v[3]["derived_from"], "memory.available");
    }

    #[test]
    fn shutdown_json_shape() {
        let cases: &[(&str, Value)] = &[
            (
                "",
                json!({"enabled": false, "groups": [], "budget_seconds": 0,
                       "needed_inhibit_delay_seconds": 0}),
            ),
            (
                "shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n",
                json!({"enabled": true,
                       "groups": [{"priority": 0, "period_seconds": 20},
                                  {"priority": 2_000_000_000, "period_seconds": 10}],
                       "budget_seconds": 30, "needed_inhibit_delay_seconds": 35}),
            ),
            (
                "shutdownGracePeriodByPodPriority:\n  - {priority: 1000, shutdownGracePeriodSeconds: 7}\n  - {priority: 0, shutdownGracePeriodSeconds: 3}\nnodeMonitor:\n  shutdown:\n    inhibitDelayMargin: 0s\n",
                json!({"enabled": true,
                       "groups": [{"priority": 0, "period_seconds": 3},
                                  {"priority": 1000, "period_seconds": 7}],
                       "budget_seconds": 10, "needed_inhibit_delay_seconds": 10}),
            ),
        ];
        for (text, want) in cases {
            let c = crate::shutdown::parse_shutdown_config(Some(text)).expect(text);
            let mut got = shutdown_json(&c);
            let options = got
                .as_object_mut()
                .and_then(|o| o.remove("options"))
                .expect("options");
            assert_eq!(&got, want, "{text:?}");
            assert_eq!(options, serde_json::to_value(&c.options).expect("json"));
            assert_eq!(options["kubeletInhibitorPolicy"], "cooperate");
        }
    }
}
