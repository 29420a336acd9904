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
use serde_json::{Value, json};

use super::check_config;
use crate::settings::EvictionFlags;
use node_monitor_core::{
    clock::Timestamp,
    config::{ConfigSource, FsLayout},
    duration::parse_go_duration,
    eviction::{EvictionState, synchronize},
    pod::{ContainerUsage, PodInfo, pod_is_active},
    quantity::Quantity,
    signals::{Observations, PodUsage, Signal, SignalObservation},
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
    processes: Option<Quantity>,
    #[serde(default)]
    containers: BTreeMap<String, ContainerUsageIn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContainerUsageIn {
    memory: Option<Quantity>,
    disk: Option<Quantity>,
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

    // The snapshot's own config, then --config, then the flags.
    let embedded = snapshot
        .config
        .as_ref()
        .map(serde_json::to_string)
        .transpose()?;
    let embedded_name = format!("{name}: config");
    let earlier: Vec<ConfigSource<'_>> = embedded
        .as_deref()
        .map(|text| ConfigSource {
            name: &embedded_name,
            text,
        })
        .into_iter()
        .collect();
    let config = check_config::load(config_path, &earlier, flags)?
        .with_fs_layout(snapshot.filesystem.unwrap_or_default());
    for warning in &config.warnings {
        tracing::warn!(%warning, "eviction configuration");
    }

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
        observations.signals.insert(
            signal,
            SignalObservation {
                available,
                capacity,
            },
        );
    }
    let mut container_usage: HashMap<&str, &BTreeMap<String, ContainerUsageIn>> = HashMap::new();
    for (uid, u) in &snapshot.usage {
        let field = |f: &str| format!("snapshot {name}: usage.{uid}.{f}");
        observations.pods.insert(
            uid.clone(),
            PodUsage {
                memory: non_negative(u.memory.as_ref(), &field("memory"))?,
                disk: non_negative(u.disk.as_ref(), &field("disk"))?,
                processes: non_negative(u.processes.as_ref(), &field("processes"))?,
            },
        );
        container_usage.insert(uid.as_str(), &u.containers);
    }

    let no_pods = Vec::new();
    let items = match &snapshot.pods {
        Value::Array(items) => items,
        Value::Object(list) => match list.get("items") {
            Some(Value::Array(items)) => items,
            Some(Value::Null) | None => &no_pods,
            Some(_) => bail!("snapshot {name}: pods.items must be an array of pods"),
        },
        _ => bail!("snapshot {name}: pods must be a PodList or an array of pods"),
    };
    let mut pods = Vec::new();
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
        pods.push(info);
    }

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

    let mut out = serde_json::to_value(&decision)?;
    if let Value::Object(map) = &mut out {
        let details = map.remove("reclaim").unwrap_or(Value::Null);
        map.insert(
            "reclaim".into(),
            details.get("signal").cloned().unwrap_or(Value::Null),
        );
        map.insert("reclaim_details".into(), details);
        map.insert("held_for_seconds".into(), json!(held_for.as_secs_f64()));
        map.insert("inactive_pods".into(), json!(inactive));
        map.insert("warnings".into(), json!(config.warnings));
    }
    Ok(out)
}

fn non_negative(q: Option<&Quantity>, field: &str) -> anyhow::Result<Option<u64>> {
    q.map(|q| u64::try_from(q.value()).with_context(|| format!("{field}: {q} is negative")))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(observations: Value, extra: Value) -> String {
        let mut v = json!({
            "pods": {"apiVersion": "v1", "kind": "List", "items": [
                {"metadata": {"name": "a", "namespace": "default", "uid": "ua"},
                 "spec": {"containers": [{"name": "app"}]}}
            ]},
            "usage": {"ua": {"memory": "700Mi", "containers": {"app": {"memory": "700Mi"}}}},
            "observations": observations
        });
        if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
            m.extend(e);
        }
        v.to_string()
    }

    #[test]
    fn explains_a_hard_eviction() {
        let text = snapshot(
            json!({"memory.available": {"available": "50Mi", "capacity": "4Gi"}}),
            json!({}),
        );
        let out =
            explain("s", &text, None, &EvictionFlags::default(), Duration::ZERO).expect("explain");
        assert_eq!(out["reclaim"], "memory.available");
        assert_eq!(out["reclaim_details"]["resource"], "memory");
        assert_eq!(out["evict"][0]["name"], "a");
        assert_eq!(out["evict"][0]["grace_period_seconds"], 1);
        assert_eq!(
            out["evict"][0]["message"],
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. \
             Container app was using 700Mi, request is 0, has larger consumption of memory. "
        );
    }

    #[test]
    fn soft_thresholds_wait_unless_held() {
        let text = snapshot(
            json!({"memory.available": {"available": "500Mi", "capacity": "4Gi"}}),
            json!({"config": {"evictionSoft": {"memory.available": "1Gi"},
                              "evictionSoftGracePeriod": {"memory.available": "1m"}}}),
        );
        let out =
            explain("s", &text, None, &EvictionFlags::default(), Duration::ZERO).expect("explain");
        assert_eq!(out["thresholds_met"][0]["grace_period_elapsed"], false);
        assert_eq!(out["reclaim"], Value::Null);
        assert_eq!(out["evict"], json!([]));
        let out = explain(
            "s",
            &text,
            None,
            &EvictionFlags::default(),
            Duration::from_secs(60),
        )
        .expect("explain");
        assert_eq!(out["reclaim"], "memory.available");
        assert_eq!(
            out["evict"][0]["grace_period_seconds"], 1,
            "max pod grace 0: 1s"
        );
    }

    #[test]
    fn bad_snapshots_name_the_field() {
        let cases: &[(String, &str)] = &[
            (
                snapshot(
                    json!({"memory.free": {"available": 1, "capacity": 2}}),
                    json!({}),
                ),
                "memory.free",
            ),
            (
                snapshot(
                    json!({"memory.available": {"available": "lots", "capacity": 2}}),
                    json!({}),
                ),
                "lots",
            ),
            (snapshot(json!({}), json!({"podz": []})), "podz"),
            (
                snapshot(json!({}), json!({"pods": [{"metadata": {"name": 7}}]})),
                "pods[0]",
            ),
            (
                snapshot(json!({}), json!({"pods": [{"metadata": {"name": "x"}}]})),
                "metadata.uid is missing",
            ),
            (
                snapshot(json!({}), json!({"usage": {"ua": {"memory": "-1Mi"}}})),
                "usage.ua.memory",
            ),
            (
                snapshot(
                    json!({}),
                    json!({"config": {"evictionHard": {"memory.available": "1Gb"}}}),
                ),
                "1Gb",
            ),
        ];
        for (text, want) in cases {
            let err = explain("s", text, None, &EvictionFlags::default(), Duration::ZERO)
                .expect_err(want);
            let msg = format!("{err:#}");
            assert!(msg.contains(want), "{msg:?} should contain {want:?}");
        }
    }
}

/// Property tests (docs/testing.md): `cargo test -p node-monitor --lib prop`.
#[cfg(test)]
mod prop {
    use proptest::{collection::vec, prelude::*, sample::select};

    use super::*;

    /// Quantities from the ordinary to the absurd (the cap, tiny fractions, above the cap), and
    /// now and then a negative or malformed one.
    fn quantity() -> impl Strategy<Value = Value> {
        let suffix = select(vec!["", "Mi", "Gi", "Ki", "Ei", "m", "n", "k", "E", "e9"]);
        prop_oneof![
            4 => (0..=i64::MAX, suffix).prop_map(|(v, s)| json!(format!("{v}{s}"))),
            4 => (0_u32..63).prop_map(|bits| json!(1_u64 << bits)),
            2 => select(vec!["0", "1", "1e30", "8Ei", "100Mi", "1n", "0.5", "9223372036854775807"])
                .prop_map(|s| json!(s)),
            1 => select(vec!["-1", "-9Ei", "x", "-1n"]).prop_map(|s| json!(s)),
            1 => any::<i64>().prop_map(|v| json!(v)),
        ]
    }

    /// A resource map with some of `keys`.
    fn resources(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
        vec((select(keys), quantity()), 0..3)
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()))
    }

    fn pod() -> impl Strategy<Value = Value> {
        (
            0_u8..6,
            any::<i32>(),
            select(vec!["Running", "Pending", "Succeeded", "Failed", ""]),
            vec(
                (
                    select(vec!["app", "side", "init"]),
                    resources(&["memory", "ephemeral-storage", "cpu"]),
                    resources(&["memory", "ephemeral-storage"]),
                ),
                0..3,
            ),
            proptest::option::of(select(vec!["system-node-critical", "x"])),
        )
            .prop_map(|(id, priority, phase, containers, class)| {
                json!({
                    "metadata": {"name": format!("p{id}"), "namespace": "default",
                                 "uid": format!("u{id}")},
                    "spec": {
                        "priority": priority,
                        "priorityClassName": class,
                        "containers": containers.iter().map(|(name, req, lim)| json!({
                            "name": name,
                            "resources": {"requests": req, "limits": lim}
                        })).collect::<Vec<_>>()
                    },
                    "status": {"phase": phase}
                })
            })
    }

    fn snapshot() -> impl Strategy<Value = String> {
        let signal = select(vec![
            "memory.available",
            "allocatableMemory.available",
            "nodefs.available",
            "nodefs.inodesFree",
            "imagefs.available",
            "imagefs.inodesFree",
            "pid.available",
            "containerfs.available",
        ]);
        let usage = (0_u8..6, quantity(), quantity(), quantity(), quantity()).prop_map(
            |(id, memory, disk, processes, container)| {
                (
                    format!("u{id}"),
                    json!({"memory": memory, "disk": disk, "processes": processes,
                           "containers": {"app": {"memory": container, "disk": container}}}),
                )
            },
        );
        let config = prop_oneof![
            Just(Value::Null),
            (signal.clone(), quantity()).prop_map(|(s, q)| json!({
                "evictionHard": {s: q.as_str().unwrap_or("1").to_owned()},
                "evictionSoft": {s: "50%"},
                "evictionSoftGracePeriod": {s: "10s"},
                "evictionMinimumReclaim": {s: q.as_str().unwrap_or("1").to_owned()},
            })),
        ];
        (
            vec(pod(), 0..5),
            vec(usage, 0..5),
            vec((signal, quantity(), quantity()), 0..5),
            config,
            any::<bool>(),
        )
            .prop_map(|(pods, usage, observations, config, list)| {
                let pods = if list {
                    json!({"kind": "List", "items": pods})
                } else {
                    json!(pods)
                };
                let observations: serde_json::Map<String, Value> = observations
                    .into_iter()
                    .map(|(s, a, c)| (s.to_owned(), json!({"available": a, "capacity": c})))
                    .collect();
                let mut v = json!({
                    "pods": pods,
                    "usage": usage.into_iter().collect::<serde_json::Map<_, _>>(),
                    "observations": observations,
                });
                if !config.is_null() {
                    v["config"] = config;
                }
                v.to_string()
            })
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_map(|n| json!(n)),
            "\\PC{0,12}".prop_map(Value::String),
        ];
        let key = prop_oneof![
            select(vec![
                "pods",
                "usage",
                "observations",
                "config",
                "filesystem",
                "items",
                "metadata",
                "spec",
                "memory",
                "available",
                "capacity",
                "containers",
            ])
            .prop_map(str::to_owned),
            "[a-z.]{0,8}",
        ];
        leaf.prop_recursive(4, 32, 6, move |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(Value::Array),
                vec((key.clone(), inner), 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn run(text: &str, held_for: Duration) -> anyhow::Result<Value> {
        explain("s", text, None, &EvictionFlags::default(), held_for)
    }

    proptest! {
        #![proptest_config(crate::proptest_config())]

        #[test]
        fn prop_any_text_is_explained_or_refused(text in "\\PC{0,200}") {
            let _ = run(&text, Duration::ZERO);
        }

        #[test]
        fn prop_any_json_is_explained_or_refused(v in json_value()) {
            let _ = run(&v.to_string(), Duration::ZERO);
        }

        /// Snapshots with any quantities: a decision (evicting only listed, active pods) or an
        /// error naming the snapshot, never a panic.
        #[test]
        fn prop_snapshots_are_explained_or_refused(text in snapshot(), held in 0_u64..600) {
            match run(&text, Duration::from_secs(held)) {
                Ok(out) => {
                    let evict = out["evict"].as_array().cloned().unwrap_or_default();
                    for e in &evict {
                        let name = e["name"].as_str().unwrap_or_default();
                        prop_assert!(text.contains(&format!("\"name\":\"{name}\"")), "{e}");
                    }
                }
                Err(e) => {
                    let msg = format!("{e:#}");
                    prop_assert!(msg.contains("snapshot s") || msg.contains("s: config"), "{msg}");
                }
            }
        }
    }
}
