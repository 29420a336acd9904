//! `node-monitor explain`: read a snapshot (pods, usage, observations) and print the eviction
//! decision, with its reasons, as JSON. The contract is in docs/cli.md.

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::{Context as _, bail};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize;
use serde_json::Value;

use super::check_config;
use crate::settings::EvictionFlags;
use node_monitor_core::{
    config::{ConfigSource, EvictionConfig, FsLayout},
    eviction::local_storage::{ContainerStorage, StorageLimits, StorageUsage, limit_evictions},
    eviction::{EvictionState, synchronize},
    kubelet::pod::{ContainerUsage, PodInfo, pod_is_active},
    signals::{Observations, PodUsage, Signal, SignalObservation},
    units::clock::Timestamp,
    units::duration::parse_go_duration,
    units::quantity::Quantity,
};

/// Read a snapshot (pods, usage, observations) and print the eviction decision as JSON.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The snapshot, a JSON file (`-` reads standard input).
    #[arg(long, value_name = "FILE")]
    pub input: PathBuf,
    /// A KubeletConfiguration file; overrides the snapshot's `config` field by field.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Treat the thresholds met in the snapshot as met for this long (a Go duration such as
    /// `2m`), so that soft thresholds whose grace period is shorter act.
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub held_for: String,
    #[command(flatten)]
    pub eviction: EvictionFlags,
}

/// The snapshot file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Snapshot {
    /// A PodList as `kubectl get pods -o json` prints it, or a plain array of pods.
    pods: Value,
    #[serde(default)]
    usage: BTreeMap<String, UsageIn>,
    observations: BTreeMap<String, ObservationIn>,
    #[serde(default)]
    config: Option<Value>,
    #[serde(default)]
    filesystem: Option<FsLayout>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsageIn {
    memory: Option<Quantity>,
    disk: Option<Quantity>,
    #[serde(default, rename = "writableLayers")]
    writable_layers: Option<Quantity>,
    #[serde(default)]
    inodes: Option<Quantity>,
    #[serde(default, rename = "writableLayerInodes")]
    writable_layer_inodes: Option<Quantity>,
    processes: Option<Quantity>,
    #[serde(default)]
    containers: BTreeMap<String, ContainerUsageIn>,
    /// Bytes used per emptyDir volume, by volume name (for the local-storage limits).
    #[serde(default, rename = "emptyDirs")]
    empty_dirs: BTreeMap<String, Quantity>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainerUsageIn {
    memory: Option<Quantity>,
    disk: Option<Quantity>,
    /// The container's logs and its writable layer apart (for its ephemeral-storage limit).
    #[serde(default)]
    logs: Option<Quantity>,
    #[serde(default)]
    rootfs: Option<Quantity>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ObservationIn {
    available: Quantity,
    capacity: Quantity,
}

pub fn run(args: &Args) -> anyhow::Result<ExitCode> {
    let name = args.input.display().to_string();
    let text = if name == "-" {
        crate::io::read_stdin_bounded("the snapshot", crate::io::MAX_INPUT_BYTES)?
    } else {
        crate::io::read_file_bounded(&args.input, "the snapshot", crate::io::MAX_INPUT_BYTES)?
    };
    let held_for = parse_go_duration(&args.held_for)
        .ok()
        .and_then(|n| u64::try_from(n).ok())
        .map(Duration::from_nanos)
        .with_context(|| {
            format!(
                "--held-for: {:?} is not a non-negative duration such as \"90s\"",
                args.held_for
            )
        })?;
    let output = explain(
        &name,
        &text,
        args.config.as_deref(),
        &args.eviction,
        held_for,
    )?;
    crate::io::print_line(&serde_json::to_string_pretty(&output)?)?;
    Ok(ExitCode::SUCCESS)
}

/// The per-container usage of the snapshot, by pod UID.
type ContainerUsages<'s> = HashMap<&'s str, &'s BTreeMap<String, ContainerUsageIn>>;

/// The whole command minus the I/O of reading the snapshot and printing.
fn explain(
    name: &str,
    text: &str,
    config_path: Option<&std::path::Path>,
    flags: &EvictionFlags,
    held_for: Duration,
) -> anyhow::Result<Value> {
    let snapshot: Snapshot =
        serde_json::from_str(text).with_context(|| format!("snapshot {name}: invalid"))?;

    let config = load_config(name, snapshot.config.as_ref(), config_path, flags)?
        .with_fs_layout(snapshot.filesystem.unwrap_or_default());
    for warning in &config.warnings {
        tracing::warn!(%warning, "eviction configuration");
    }
    let (mut observations, container_usage) = observations(name, &snapshot)?;
    observations.filesystem = snapshot.filesystem.unwrap_or_default();
    let (pods, limits, inactive) = active_pods(name, &snapshot.pods, &container_usage)?;

    let mut state = EvictionState::new();
    let mut decision = synchronize(&mut state, &config, &observations, &pods, Timestamp::ZERO);
    if !held_for.is_zero() {
        decision = synchronize(
            &mut state,
            &config,
            &observations,
            &pods,
            Timestamp::from_duration(held_for),
        );
    }

    let mut out = node_monitor_core::eviction::explain_json(
        &decision,
        held_for,
        &inactive,
        &config.warnings,
        config.node_monitor.memory_working_set,
    )?;
    let limited = if config.local_storage_capacity_isolation {
        let usage = storage_usage(name, &snapshot)?;
        let pods: Vec<(PodInfo, StorageLimits)> = pods.into_iter().zip(limits).collect();
        limit_evictions(&pods, &usage, observations.filesystem.dedicated_image_fs)
    } else {
        Vec::new()
    };
    if let Value::Object(map) = &mut out {
        map.insert(
            "local_storage_evictions".into(),
            serde_json::to_value(limited)?,
        );
    }
    Ok(out)
}

/// The snapshot's local-storage usage by pod UID: `disk`, `emptyDirs` and each container's
/// `logs` and `rootfs`.
fn storage_usage(name: &str, snapshot: &Snapshot) -> anyhow::Result<HashMap<String, StorageUsage>> {
    let mut out = HashMap::new();
    for (uid, u) in &snapshot.usage {
        let field = |f: &str| format!("snapshot {name}: usage.{uid}.{f}");
        let mut volumes = BTreeMap::new();
        for (v, q) in &u.empty_dirs {
            if let Some(b) = non_negative(Some(q), &field(&format!("emptyDirs.{v}")))? {
                volumes.insert(v.clone(), b);
            }
        }
        let mut containers = Vec::new();
        for (c, cu) in &u.containers {
            containers.push(ContainerStorage {
                name: c.clone(),
                logs: non_negative(cu.logs.as_ref(), &field(&format!("containers.{c}.logs")))?,
                rootfs: non_negative(
                    cu.rootfs.as_ref(),
                    &field(&format!("containers.{c}.rootfs")),
                )?,
            });
        }
        out.insert(
            uid.clone(),
            StorageUsage {
                pod: non_negative(u.disk.as_ref(), &field("disk"))?,
                volumes,
                containers,
            },
        );
    }
    Ok(out)
}

/// The eviction configuration: the snapshot's own `config`, then `--config`, then the flags.
fn load_config(
    name: &str,
    embedded: Option<&Value>,
    config_path: Option<&std::path::Path>,
    flags: &EvictionFlags,
) -> anyhow::Result<EvictionConfig> {
    let embedded = embedded.map(serde_json::to_string).transpose()?;
    let embedded_name = format!("{name}: config");
    let earlier: Vec<ConfigSource<'_>> = embedded
        .as_deref()
        .map(|text| ConfigSource {
            name: &embedded_name,
            text,
        })
        .into_iter()
        .collect();
    check_config::load(config_path, &earlier, flags)
}

/// The snapshot's signal observations and per-pod usage, each checked; and its per-container
/// usage, for [`active_pods`].
fn observations<'s>(
    name: &str,
    snapshot: &'s Snapshot,
) -> anyhow::Result<(Observations, ContainerUsages<'s>)> {
    let mut observations = Observations::default();
    for (signal_name, obs) in &snapshot.observations {
        let signal: Signal = signal_name
            .parse()
            .with_context(|| format!("snapshot {name}: observations"))?;
        let available = obs.available.value();
        let capacity = obs.capacity.value();
        if capacity < 0 {
            bail!("snapshot {name}: observations.{signal_name}.capacity {capacity} is negative");
        }
        // More available than there is: no node can report it. (Less than nothing can happen:
        // the kubelet's memory.available is negative when the working set exceeds capacity.)
        if available > capacity {
            bail!(
                "snapshot {name}: observations.{signal_name}.available {available} is more than \
                 its capacity {capacity}"
            );
        }
        observations.signals.insert(
            signal,
            SignalObservation {
                available,
                capacity,
            },
        );
    }
    let mut container_usage: ContainerUsages<'s> = HashMap::new();
    for (uid, u) in &snapshot.usage {
        let field = |f: &str| format!("snapshot {name}: usage.{uid}.{f}");
        observations.pods.insert(
            uid.clone(),
            PodUsage {
                memory: non_negative(u.memory.as_ref(), &field("memory"))?,
                disk: non_negative(u.disk.as_ref(), &field("disk"))?,
                writable_layers: non_negative(
                    u.writable_layers.as_ref(),
                    &field("writableLayers"),
                )?,
                inodes: non_negative(u.inodes.as_ref(), &field("inodes"))?,
                writable_layer_inodes: non_negative(
                    u.writable_layer_inodes.as_ref(),
                    &field("writableLayerInodes"),
                )?,
                processes: non_negative(u.processes.as_ref(), &field("processes"))?,
            },
        );
        container_usage.insert(uid.as_str(), &u.containers);
    }
    Ok((observations, container_usage))
}

/// The snapshot's active pods, with their containers' usage; and the inactive ones, as
/// `namespace/name`.
fn active_pods(
    name: &str,
    pods: &Value,
    container_usage: &ContainerUsages<'_>,
) -> anyhow::Result<(Vec<PodInfo>, Vec<StorageLimits>, Vec<String>)> {
    let no_pods = Vec::new();
    let items = match pods {
        Value::Array(items) => items,
        Value::Object(list) => match list.get("items") {
            Some(Value::Array(items)) => items,
            Some(Value::Null) | None => &no_pods,
            Some(_) => bail!("snapshot {name}: pods.items must be an array of pods"),
        },
        _ => bail!("snapshot {name}: pods must be a PodList or an array of pods"),
    };
    let mut pods = Vec::new();
    let mut limits = Vec::new();
    let mut inactive = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let pod = Pod::deserialize(item).with_context(|| format!("snapshot {name}: pods[{i}]"))?;
        let pod = &pod;
        let mut info =
            PodInfo::from_pod(pod).with_context(|| format!("snapshot {name}: pods[{i}]"))?;
        if !pod_is_active(pod) {
            inactive.push(format!("{}/{}", info.namespace, info.name));
            continue;
        }
        if let Some(per_container) = container_usage.get(info.uid.as_str()) {
            for c in &mut info.containers {
                if let Some(u) = per_container.get(&c.name) {
                    let field = |f: &str| {
                        format!(
                            "snapshot {name}: usage.{}.containers.{}.{f}",
                            info.uid, c.name
                        )
                    };
                    c.usage = ContainerUsage {
                        memory: non_negative(u.memory.as_ref(), &field("memory"))?,
                        disk: non_negative(u.disk.as_ref(), &field("disk"))?,
                    };
                }
            }
        }
        limits.push(
            StorageLimits::from_pod(pod).with_context(|| format!("snapshot {name}: pods[{i}]"))?,
        );
        pods.push(info);
    }
    Ok((pods, limits, inactive))
}

fn non_negative(q: Option<&Quantity>, field: &str) -> anyhow::Result<Option<u64>> {
    q.map(|q| u64::try_from(q.value()).with_context(|| format!("{field}: {q} is negative")))
        .transpose()
}

#[cfg(test)]
mod tests;

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop;
