//! Property tests of remediate's configuration parser (docs/testing.md): any document parses to
//! a configuration that keeps every rule between its settings, or fails naming the document or
//! the field.
use proptest::{collection::vec, prelude::*, sample::select};
use serde_norway::Value;

use super::*;

/// Every key the parser knows, at the top level.
const KEYS: [&str; 22] = [
    "tickInterval",
    "missedRenewals",
    "renewInterval",
    "suspectAfterRenewals",
    "agentHeartbeatTimeout",
    "agentLeaseTimeout",
    "agentKubeletCorroboration",
    "unhealthyZoneThreshold",
    "largeClusterSizeThreshold",
    "nodeFenceRate",
    "secondaryNodeFenceRate",
    "maxUnhealthyFraction",
    "apiStaleAfter",
    "methodTimeout",
    "stepRetries",
    "retryBackoff",
    "unconfirmedRetryInterval",
    "powerManagementAfterIsolation",
    "forceDeletePods",
    "nodeSelector",
    "dryRun",
    "leaderElection",
];

const LEADER_KEYS: [&str; 4] = ["leaseName", "leaseDuration", "renewDeadline", "retryPeriod"];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0_u64..2_000).prop_map(|n| Value::Number(n.into())),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|n| Value::Number(n.into())),
        (-1.0_f64..3.0).prop_map(|n| Value::Number(n.into())),
        "[+-]?[0-9]{0,5}(\\.[0-9]{0,2})?(ns|ms|s|m|h|)".prop_map(Value::String),
        select(vec!["never", "", "lease", "1h30m", "9999999h"])
            .prop_map(|s| Value::String(s.into())),
        "\\PC{0,8}".prop_map(Value::String),
    ]
}

fn leader() -> impl Strategy<Value = Value> {
    vec((select(LEADER_KEYS.to_vec()), scalar()), 0..4).prop_map(|entries| {
        Value::Mapping(
            entries
                .into_iter()
                .map(|(k, v)| (Value::String(k.into()), v))
                .collect(),
        )
    })
}

/// A document of known (and now and then unknown) keys with generated values.
fn document() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        8 => select(KEYS.to_vec()).prop_map(str::to_owned),
        1 => "[a-zA-Z]{0,10}",
    ];
    let value = prop_oneof![4 => scalar(), 1 => leader()];
    vec((key, value), 0..8).prop_map(|entries| {
        let map: serde_norway::Mapping = entries
            .into_iter()
            .map(|(k, v)| (Value::String(k), v))
            .collect();
        serde_norway::to_string(&Value::Mapping(map)).unwrap_or_default()
    })
}

/// What a parsed configuration must keep, and what an error must name.
fn check(text: &str) -> Result<(), TestCaseError> {
    match parse_config("remediate.yaml", text) {
        Ok(c) => {
            let d = &c.detection;
            prop_assert!(
                (1..=MAX_MISSED_RENEWALS).contains(&d.missed_renewals),
                "{d:?}"
            );
            prop_assert!(
                d.suspect_after_renewals > 0.0
                    && d.suspect_after_renewals < f64::from(d.missed_renewals),
                "{d:?}"
            );
            if let Some(r) = d.renew_interval {
                prop_assert!(r.saturating_mul(d.missed_renewals) <= MAX_DETECTION_WINDOW);
            }
            prop_assert!(c.fencing.step_retries <= MAX_STEP_RETRIES);
            let l = &c.leader;
            prop_assert!(!l.lease_name.is_empty());
            prop_assert!(l.renew_deadline < l.lease_duration, "{l:?}");
            prop_assert!(
                mul_f64_saturating(l.retry_period, 1.2) < l.renew_deadline,
                "{l:?}"
            );
            let s = &c.storm;
            for f in [s.unhealthy_zone_threshold, s.max_unhealthy_fraction] {
                prop_assert!(f > 0.0 && f <= 1.0, "{s:?}");
            }
            for r in [s.node_fence_rate, s.secondary_node_fence_rate] {
                prop_assert!(r.is_finite() && r >= 0.0, "{s:?}");
            }
        }
        Err(e) => {
            let msg = e.to_string();
            let named = msg.starts_with("remediate.yaml")
                || KEYS.iter().any(|k| msg.starts_with(k))
                || LEADER_KEYS
                    .iter()
                    .any(|k| msg.starts_with(&format!("leaderElection.{k}")));
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
    fn prop_generated_documents_keep_the_rules_or_name_the_field(text in document()) {
        check(&text)?;
    }
}
