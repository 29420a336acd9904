//! Property tests of the graceful shutdown configuration parser (docs/testing.md): any document
//! parses to groups that fit logind's limit, lowest priority first, or fails naming the field.
use proptest::{collection::vec, prelude::*, sample::select};
use serde_norway::Value;

use super::*;

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        (-5_i64..400).prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|n| Value::Number(n.into())),
        "[+-]?[0-9]{0,5}(\\.[0-9]{0,2})?(ns|ms|s|m|h|)".prop_map(Value::String),
        select(vec![
            "condition",
            "annotation",
            "none",
            "wait",
            "ignore",
            "takeOver"
        ])
        .prop_map(|s| Value::String(s.into())),
        "\\PC{0,8}".prop_map(Value::String),
    ]
}

fn mapping(entries: Vec<(String, Value)>) -> Value {
    Value::Mapping(
        entries
            .into_iter()
            .map(|(k, v)| (Value::String(k), v))
            .collect(),
    )
}

/// `shutdownGracePeriodByPodPriority`: a list of entries, mostly well-formed.
fn priorities() -> impl Strategy<Value = Value> {
    let entry = vec(
        (
            prop_oneof![
                4 => select(PRIORITY_ENTRY_KEYS.to_vec()).prop_map(str::to_owned),
                1 => "[a-zA-Z]{0,8}",
            ],
            scalar(),
        ),
        0..3,
    )
    .prop_map(mapping);
    prop_oneof![4 => vec(entry, 0..5).prop_map(Value::Sequence), 1 => scalar()]
}

/// `nodeMonitor:` with a `shutdown:` mapping of known (and now and then unknown) keys.
fn node_monitor() -> impl Strategy<Value = Value> {
    let option = vec(
        (
            prop_oneof![
                6 => select(SHUTDOWN_OPTION_KEYS.to_vec()).prop_map(str::to_owned),
                1 => "[a-zA-Z]{0,8}",
            ],
            scalar(),
        ),
        0..5,
    )
    .prop_map(mapping);
    prop_oneof![
        4 => option.prop_map(|s| mapping(vec![("shutdown".into(), s)])),
        1 => scalar(),
    ]
}

fn document() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        3 => (select(vec!["shutdownGracePeriod", "shutdownGracePeriodCriticalPods"]), scalar())
            .prop_map(|(k, v)| (k.to_owned(), v)),
        2 => priorities().prop_map(|v| ("shutdownGracePeriodByPodPriority".to_owned(), v)),
        2 => node_monitor().prop_map(|v| ("nodeMonitor".to_owned(), v)),
        1 => ("[a-zA-Z]{0,10}", scalar()),
    ];
    vec(field, 0..5)
        .prop_map(|entries| serde_norway::to_string(&mapping(entries)).unwrap_or_default())
}

fn check(text: &str) -> Result<(), TestCaseError> {
    match parse_shutdown_config(Some(text)) {
        Ok(c) => {
            prop_assert!(c.budget() <= LOGIND_MAX_DELAY, "{c:?}");
            prop_assert!(
                c.groups.windows(2).all(|w| w[0].priority < w[1].priority),
                "groups not lowest priority first: {:?}",
                c.groups
            );
        }
        Err(e) => {
            let msg = e.to_string();
            let named = ["config file", "shutdownGracePeriod", "nodeMonitor"]
                .iter()
                .any(|p| msg.starts_with(p));
            prop_assert!(named, "{msg}\n--- document:\n{text}");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(crate::proptest_config())]

    #[test]
    fn prop_any_text_parses_or_names_the_document(text in "\\PC{0,200}") {
        check(&text)?;
    }

    #[test]
    fn prop_generated_documents_fit_logind_or_name_the_field(text in document()) {
        check(&text)?;
    }
}
