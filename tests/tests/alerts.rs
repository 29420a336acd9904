//! The shipped PrometheusRule: its groups pass `promtool check rules`, and `promtool test rules`
//! runs cases that fire and cases that must not (deploy/prometheus/rules.test.yaml).
use std::{path::Path, process::Command};

fn deploy() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus"))
}

/// Writes the PrometheusRule's `spec.groups` as a plain rules file next to a copy of the unit tests.
fn extract_rules(dir: &Path) {
    let text =
        std::fs::read_to_string(deploy().join("node-monitor-rules.yaml")).expect("read rules");
    let doc: serde_norway::Value = serde_norway::from_str(&text).expect("rules are YAML");
    assert_eq!(doc["kind"], serde_norway::Value::from("PrometheusRule"));
    let groups = doc["spec"]["groups"].clone();
    assert!(
        groups.as_sequence().is_some_and(|g| !g.is_empty()),
        "no rule groups"
    );
    let mut plain = serde_norway::Mapping::new();
    plain.insert("groups".into(), groups);
    std::fs::write(
        dir.join("rules.generated.yaml"),
        serde_norway::to_string(&plain).expect("yaml"),
    )
    .expect("write generated rules");
    std::fs::copy(
        deploy().join("rules.test.yaml"),
        dir.join("rules.test.yaml"),
    )
    .expect("copy tests");
}

fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("promtool is installed by scripts/setup.sh (Debian package prometheus)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn rules_pass_promtool_check_and_unit_tests() {
    let dir = tempfile::tempdir().expect("tempdir");
    extract_rules(dir.path());
    let check = promtool(dir.path(), &["check", "rules", "rules.generated.yaml"]);
    assert!(check.contains("SUCCESS: 8 rules found"), "{check}");
    let test = promtool(dir.path(), &["test", "rules", "rules.test.yaml"]);
    assert!(test.contains("SUCCESS"), "{test}");
}

#[test]
fn every_alert_has_a_runbook_section_and_a_firing_case() {
    let text =
        std::fs::read_to_string(deploy().join("node-monitor-rules.yaml")).expect("read rules");
    let tests = std::fs::read_to_string(deploy().join("rules.test.yaml")).expect("read tests");
    let runbook =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/runbook.md"))
            .expect("docs/runbook.md exists");
    let doc: serde_norway::Value = serde_norway::from_str(&text).expect("YAML");
    let mut alerts = 0;
    for group in doc["spec"]["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name");
            alerts += 1;
            assert!(
                runbook.contains(&format!("## {name}")),
                "docs/runbook.md has no section for {name}"
            );
            assert!(
                tests.contains(&format!("alertname: {name}")),
                "rules.test.yaml has no case for {name}"
            );
        }
    }
    assert_eq!(alerts, 8);
}
