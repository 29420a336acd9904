//! `node-monitor check-config`: validate the eviction configuration and print the effective
//! thresholds as JSON. The contract is in docs/cli.md.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::core::{
    config::{ConfigSource, EvictionConfig, EvictionFlags, load_sources},
    threshold::{Threshold, ThresholdValue},
};

/// Validate the eviction configuration and print the effective thresholds as JSON.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// A KubeletConfiguration file (YAML or JSON); node-monitor's own settings go under
    /// `nodeMonitor:`. Other kubelet fields are ignored.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let config = load(args.config.as_deref(), &[], &args.eviction)?;
    for warning in &config.warnings {
        tracing::warn!(%warning, "eviction configuration");
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&thresholds_json(&config))?
    );
    Ok(ExitCode::SUCCESS)
}

/// Reads `--config` (if any) over the given earlier documents, then applies the flags.
pub(crate) fn load(
    config_path: Option<&std::path::Path>,
    earlier: &[ConfigSource<'_>],
    flags: &EvictionFlags,
) -> anyhow::Result<EvictionConfig> {
    let text = config_path
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the config file {}", p.display()))
        })
        .transpose()?;
    let name = config_path.map(|p| p.display().to_string());
    let mut sources = earlier.to_vec();
    if let (Some(text), Some(name)) = (&text, &name) {
        sources.push(ConfigSource { name, text });
    }
    Ok(load_sources(&sources, flags)?)
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
    use crate::core::config::load;

    #[test]
    fn json_shape() {
        let flags = EvictionFlags {
            eviction_hard: vec!["memory.available<100Mi,nodefs.available<7.5%".into()],
            eviction_soft: vec!["memory.available<1Gi".into()],
            eviction_soft_grace_period: vec!["memory.available=1.5s".into()],
            eviction_minimum_reclaim: vec!["nodefs.available=1%".into()],
            ..Default::default()
        };
        let v = thresholds_json(&load(None, &flags).expect("config"));
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
}
