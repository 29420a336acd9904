use proptest::{collection::vec, prelude::*, sample::select};

use serde_json::json;

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
        "containerfs.inodesFree",
    ]);
    let usage = (
        0_u8..6,
        quantity(),
        quantity(),
        quantity(),
        quantity(),
        quantity(),
    )
        .prop_map(|(id, memory, disk, processes, container, inodes)| {
            (
                format!("u{id}"),
                json!({"memory": memory, "disk": disk, "processes": processes,
                           "inodes": inodes, "writableLayerInodes": inodes,
                           "containers": {"app": {"memory": container, "disk": container}}}),
            )
        });
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
            vec((key.clone(), inner), 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
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
