use proptest::{collection::vec, prelude::*, sample::select};
use serde_norway::Value;

use super::*;

/// A threshold statement as an operator may write it, valid or not:
/// `memory.available<100Mi`, `nodefs.available <= 10%`, `x=`, `pid.available<-1`.
fn statement() -> impl Strategy<Value = String> {
    let signal = prop_oneof![
        select(Signal::ALL.map(|s| s.as_str()).to_vec()).prop_map(str::to_owned),
        "[a-zA-Z.]{0,16}",
    ];
    let operator = select(vec!["<", "=", "<=", ">", ">=", "!=", "", "<<", "=<"]);
    let amount = prop_oneof![
        "[+-]?[0-9]{0,8}(\\.[0-9]{0,4})?(Mi|Gi|Ki|k|m|M|e3|E-2|%|s|ms|h|m30s|)",
        "[0-9]{0,3}(\\.[0-9]*)?%",
        "\\PC{0,12}",
    ];
    (signal, " ?", operator, " ?", amount).prop_map(|(s, a, o, b, v)| format!("{s}{a}{o}{b}{v}"))
}

/// A flag value: statements joined by commas.
fn flag_value() -> impl Strategy<Value = String> {
    vec(statement(), 0..4).prop_map(|v| v.join(","))
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        select(EVICTION_FILE_FIELDS.to_vec()).prop_map(str::to_owned),
        select(NODE_MONITOR_KEYS.to_vec()).prop_map(str::to_owned),
        select(Signal::ALL.map(|s| s.as_str()).to_vec()).prop_map(str::to_owned),
        "[a-zA-Z.]{0,10}",
    ]
}

/// YAML values built from the words the parser knows, nested a few levels.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|n| Value::Number(n.into())),
        statement().prop_map(Value::String),
        "[+-]?[0-9]{0,6}(\\.[0-9]{0,3})?(ns|ms|s|m|h|)".prop_map(Value::String),
        select(vec!["respect", "escalate", "pods", "true"]).prop_map(|s| Value::String(s.into())),
        "\\PC{0,10}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 5, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Sequence),
            vec((key(), inner), 0..5).prop_map(|entries| Value::Mapping(
                entries
                    .into_iter()
                    .map(|(k, v)| (Value::String(k), v))
                    .collect()
            )),
        ]
    })
}

/// A config document: a mapping of known and unknown fields to generated values.
fn document() -> impl Strategy<Value = String> {
    vec((key(), value()), 0..6).prop_map(|entries| {
        let map: serde_norway::Mapping = entries
            .into_iter()
            .map(|(k, v)| (Value::String(k), v))
            .collect();
        serde_norway::to_string(&Value::Mapping(map)).unwrap_or_default()
    })
}

/// A failed load names where the bad value is: every message from a document starts with its
/// name (`config file: evictionHard["memory.available"]: …`).
fn assert_names_the_document(text: &str) -> Result<(), TestCaseError> {
    if let Err(e) = load(Some(text), &EvictionOverrides::default()) {
        let msg = e.to_string();
        prop_assert!(
            msg.starts_with("config file"),
            "{msg}\n--- document:\n{text}"
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::proptest_config())]

    #[test]
    fn prop_any_text_loads_or_names_the_document(text in "\\PC{0,200}") {
        assert_names_the_document(&text)?;
    }

    #[test]
    fn prop_yaml_like_text_loads_or_names_the_document(
        text in "[a-zA-Z:{}\\[\\],\"' \n\t<%0-9.#&*!|>-]{0,200}"
    ) {
        assert_names_the_document(&text)?;
    }

    #[test]
    fn prop_generated_documents_load_or_name_the_field(text in document()) {
        assert_names_the_document(&text)?;
    }

    /// Any flag value: a configuration or an error that names the flag.
    #[test]
    fn prop_flags_load_or_name_the_flag(
        value in flag_value(),
        scalar in prop_oneof!["[+-]?[0-9]{0,12}(\\.[0-9]{0,3})?(ns|s|m|h|)", "\\PC{0,12}"],
        which in 0_usize..6,
    ) {
        let mut flags = EvictionOverrides::default();
        let name = match which {
            0 => { flags.eviction_hard = vec![value]; "--eviction-hard" }
            1 => { flags.eviction_soft = vec![value]; "--eviction-soft" }
            2 => { flags.eviction_soft_grace_period = vec![value]; "--eviction-soft-grace-period" }
            3 => { flags.eviction_minimum_reclaim = vec![value]; "--eviction-minimum-reclaim" }
            4 => { flags.eviction_max_pod_grace_period = Some(scalar); "--eviction-max-pod-grace-period" }
            _ => { flags.eviction_pressure_transition_period = Some(scalar); "--eviction-pressure-transition-period" }
        };
        match load(None, &flags) {
            Ok(config) => {
                // Thresholds are unique per signal and kind.
                let mut keys: Vec<_> = config.thresholds.iter().map(|t| t.key()).collect();
                let n = keys.len();
                keys.sort();
                keys.dedup();
                prop_assert_eq!(keys.len(), n, "{:?}", flags);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.starts_with(name), "{msg} ({flags:?})");
            }
        }
    }

    /// A valid hard threshold from the flag is taken (`0%` and `100%` disable one, as in the
    /// kubelet).
    #[test]
    fn prop_valid_hard_thresholds_are_kept(
        signal in select(
            Signal::ALL
                .into_iter()
                .filter(|s| *s != Signal::AllocatableMemoryAvailable)
                .collect::<Vec<_>>()
        ),
        bytes in 1_i64..=i64::MAX,
        percent in 1_u32..100,
        as_percentage in any::<bool>(),
    ) {
        let amount = if as_percentage { format!("{percent}%") } else { bytes.to_string() };
        let flags = EvictionOverrides {
            eviction_hard: vec![format!("{signal}<{amount}")],
            ..EvictionOverrides::default()
        };
        let config = load(None, &flags);
        prop_assert!(config.is_ok(), "{signal}<{amount}: {:?}", config.err());
        let config = config.unwrap_or_else(|_| unreachable!());
        let t = config.thresholds.iter().find(|t| t.signal == signal && t.is_hard());
        prop_assert!(t.is_some(), "{signal}<{amount}: {:?}", config.thresholds);
    }
}
