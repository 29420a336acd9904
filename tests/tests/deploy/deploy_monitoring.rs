//! The monitoring manifests against a real API server with the prometheus-operator CRDs
//! (fetched by `scripts/setup.sh --with-control-plane`): the ServiceMonitor and both
//! PrometheusRules apply server-side with strict field validation, so a field the CRD schema does
//! not have, or a value of the wrong type, fails here rather than in a cluster. The rules the API
//! server stored are the ones promtool tests (alerts.rs, remediate.rs).
use kube::{Api, Client, api::DynamicObject, core::GroupVersionKind, discovery::pinned_kind};
use node_monitor_tests::{
    control_plane::{ControlPlane, ControlPlaneOptions, error_chain},
    manifests::{self, Manifest},
};
use serde_json::{Value, json};

/// The shipped monitoring manifests: the agent's ServiceMonitor and PrometheusRule, and
/// remediate's PrometheusRule and ServiceMonitor.
const MONITORING: [&str; 4] = [
    "kustomize/base/servicemonitor.yaml",
    "prometheus/node-monitor-rules.yaml",
    "remediate/prometheusrule.yaml",
    "remediate/servicemonitor.yaml",
];

fn objects(rel: &str) -> Vec<Manifest> {
    manifests::read_objects(&manifests::deploy_dir().join(rel))
        .unwrap_or_else(|e| panic!("{rel}: {}", error_chain(&e)))
}

/// Every field of `shipped` is in `stored` with the same value (the schema may add defaults, such
/// as a relabeling's `action: replace`; it must not drop anything).
fn missing(shipped: &Value, stored: &Value, path: &str) -> Vec<String> {
    match (shipped, stored) {
        (Value::Object(a), Value::Object(b)) => a
            .iter()
            .flat_map(|(k, v)| match b.get(k) {
                Some(w) => missing(v, w, &format!("{path}.{k}")),
                None => vec![format!("{path}.{k}")],
            })
            .collect(),
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .flat_map(|(i, (v, w))| missing(v, w, &format!("{path}[{i}]")))
            .collect(),
        (a, b) if a == b => Vec::new(),
        (a, b) => vec![format!("{path}: {a} became {b}")],
    }
}

async fn stored(client: &Client, kind: &str, namespace: &str, name: &str) -> DynamicObject {
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind);
    let (resource, _) = pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discover {kind}: {e}"));
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("get {kind} {namespace}/{name}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servicemonitor_and_prometheusrules_apply_server_side() {
    node_monitor_tests::cgroup::require_root("the control-plane tier");
    // Fail before starting anything when the CRDs were never fetched.
    let crd_dir = manifests::crd_dir().unwrap_or_else(|e| panic!("{}", error_chain(&e)));
    let cp = ControlPlane::start(ControlPlaneOptions {
        controller_manager: false,
        ..ControlPlaneOptions::default()
    })
    .await
    .unwrap_or_else(|e| panic!("control plane: {}", error_chain(&e)));
    let client = cp.client();

    let crds = manifests::install_monitoring_crds(&client)
        .await
        .unwrap_or_else(|e| panic!("CRDs from {}: {}", crd_dir.display(), error_chain(&e)));
    assert_eq!(
        crds,
        [
            "servicemonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com"
        ]
    );
    // The namespace the manifests live in (the base's first object).
    let base = manifests::render(&manifests::kustomize_dir("base")).expect("render base");
    let namespace: Vec<Manifest> = base
        .into_iter()
        .filter(|m| m.kind() == "Namespace")
        .collect();
    manifests::apply(&client, &namespace)
        .await
        .unwrap_or_else(|e| panic!("namespace: {}", error_chain(&e)));

    for rel in MONITORING {
        let objs = objects(rel);
        assert!(!objs.is_empty(), "{rel} holds no object");
        let applied = manifests::apply(&client, &objs)
            .await
            .unwrap_or_else(|e| panic!("{rel} is refused: {}", error_chain(&e)));
        assert_eq!(applied.len(), objs.len(), "{rel}");
    }

    // What the API server stored is what was shipped: nothing pruned by the schema.
    for (rel, name) in [
        (MONITORING[0], "node-monitor"),
        (MONITORING[3], "node-monitor-remediate"),
    ] {
        let sm = stored(&client, "ServiceMonitor", "node-monitor", name).await;
        let shipped = &objects(rel)[0].object;
        assert_eq!(
            missing(&shipped["spec"], &sm.data["spec"], "spec"),
            Vec::<String>::new(),
            "{rel}"
        );
        assert_eq!(sm.data["spec"]["endpoints"][0]["port"], "metrics", "{rel}");
    }
    // remediate's selects its Service, whose port it names.
    let service = &objects("remediate/service.yaml")[0].object;
    let sm = &objects(MONITORING[3])[0].object;
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"],
        service["metadata"]["labels"]
    );
    assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
    for (rel, name, count) in [
        (MONITORING[1], "node-monitor", 14),
        (MONITORING[2], "node-monitor-remediate", 5),
    ] {
        let rule = stored(&client, "PrometheusRule", "node-monitor", name).await;
        let shipped = &objects(rel)[0].object;
        assert_eq!(
            missing(&shipped["spec"], &rule.data["spec"], "spec"),
            Vec::<String>::new(),
            "{rel}"
        );
        let alerts: Vec<&str> = rule.data["spec"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .filter_map(|r| r["alert"].as_str())
            .collect();
        assert_eq!(alerts.len(), count, "{rel}: {alerts:?}");
        // Every stored alert keeps its severity and runbook link (alerts.rs checks the links).
        for rule in rule.data["spec"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .filter(|r| r.get("alert").is_some())
        {
            assert!(
                rule["labels"]["severity"].is_string()
                    && rule["annotations"]["runbook_url"].is_string(),
                "{rel}: {rule}"
            );
        }
    }

    // The schema is enforced: a misspelt field and a wrong type are refused, not dropped.
    let mut bad_field = objects(MONITORING[1]).remove(0);
    bad_field.object["metadata"]["name"] = json!("bad-field");
    bad_field.object["spec"]["groups"][0]["rules"][0]["expresion"] = json!("up == 0");
    let mut bad_type = objects(MONITORING[0]).remove(0);
    bad_type.object["metadata"]["name"] = json!("bad-type");
    bad_type.object["spec"]["endpoints"] = Value::String("metrics".into());
    // Server-side apply reports a field outside the schema while building the typed patch (500),
    // a wrong type in validation (422): either way the request fails naming the field.
    for (bad, field) in [(bad_field, "expresion"), (bad_type, "endpoints")] {
        let name = bad.name().to_owned();
        match manifests::apply(&client, &[bad]).await {
            Err(manifests::Error::Apply { source, .. }) if matches!(&*source, kube::Error::Api(s) if s.message.contains(field)) =>
                {}
            other => {
                panic!("{name} must be refused by the CRD schema naming {field}, got {other:?}")
            }
        }
    }
    cp.stop().expect("stop");
}
