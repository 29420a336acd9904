//! The shipped PrometheusRules: the agent's groups pass `promtool check rules`, and
//! `promtool test rules` runs cases that fire and cases that must not
//! (deploy/prometheus/rules.test.yaml; remediate's in tests/tests/control_plane/remediate.rs). The agent's rules
//! are the template rendered with the shipped thresholds (`cargo xtask alerts`), and every alert of
//! both products has a severity and a runbook_url that links an existing section of
//! docs/runbook.md.
use std::{collections::BTreeSet, path::Path, process::Command};

/// The renderer `cargo xtask alerts` uses, as it is (standard library only).
#[path = "../../../xtask/src/alert_rules.rs"]
mod alert_rules;

/// The base every `runbook_url` starts with; the anchor follows.
const RUNBOOK: &str = "https://github.com/node-monitor/node-monitor/blob/main/docs/runbook.md#";

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn deploy() -> std::path::PathBuf {
    root().join("deploy/prometheus")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Writes the PrometheusRule's `spec.groups` as a plain rules file next to a copy of the unit tests.
fn extract_rules(dir: &Path) {
    let text = read(&deploy().join("node-monitor-rules.yaml"));
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

/// Every alerting rule of a PrometheusRule manifest.
fn alerts_of(rel: &str) -> Vec<serde_norway::Value> {
    let text = read(&root().join(rel));
    let doc: serde_norway::Value = serde_norway::from_str(&text).expect("YAML");
    doc["spec"]["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").clone())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of every heading of docs/runbook.md.
fn runbook_anchors() -> BTreeSet<String> {
    read(&root().join("docs/runbook.md"))
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn anchors_are_githubs() {
    let cases = [
        ("NodeMonitorDown", "nodemonitordown"),
        (
            " The agent restarts (liveness probe)",
            "the-agent-restarts-liveness-probe",
        ),
        ("node-monitor remediate", "node-monitor-remediate"),
        (
            "node-monitor conditions `Unknown`, or taints",
            "node-monitor-conditions-unknown-or-taints",
        ),
    ];
    for (heading, want) in cases {
        assert_eq!(anchor(heading), want, "{heading}");
    }
}

#[test]
fn rules_pass_promtool_check_and_unit_tests() {
    let dir = tempfile::tempdir().expect("tempdir");
    extract_rules(dir.path());
    let check = promtool(dir.path(), &["check", "rules", "rules.generated.yaml"]);
    // 14 alerts and 4 recording rules.
    assert!(check.contains("SUCCESS: 18 rules found"), "{check}");
    let test = promtool(dir.path(), &["test", "rules", "rules.test.yaml"]);
    assert!(test.contains("SUCCESS"), "{test}");
}

/// The shipped rules are the template rendered with the shipped thresholds: a threshold changed
/// in one place only, or a rules file edited by hand, fails here.
#[test]
fn shipped_rules_are_the_template_rendered_with_the_shipped_thresholds() {
    let thresholds = alert_rules::parse_thresholds(&read(&deploy().join("thresholds.yaml")))
        .unwrap_or_else(|e| panic!("thresholds.yaml: {e}"));
    assert!(thresholds.len() >= 15, "{thresholds:?}");
    let rendered = alert_rules::render(
        &read(&deploy().join("node-monitor-rules.template.yaml")),
        &thresholds,
    )
    .unwrap_or_else(|e| panic!("template: {e}"));
    assert!(
        rendered == read(&deploy().join("node-monitor-rules.yaml")),
        "deploy/prometheus/node-monitor-rules.yaml is not the template rendered with \
         thresholds.yaml: run `cargo xtask alerts`"
    );
    // A site's own value reaches its rule.
    let changed: Vec<(String, String)> = thresholds
        .iter()
        .map(|(n, v)| {
            let v = if n == "evictionsHighCount" { "12" } else { v };
            (n.clone(), v.to_owned())
        })
        .collect();
    let site = alert_rules::render(
        &read(&deploy().join("node-monitor-rules.template.yaml")),
        &changed,
    )
    .expect("renders");
    assert!(
        site.contains("[30m])) > 12\n"),
        "evictionsHighCount did not reach NodeMonitorEvictionsHigh:\n{site}"
    );
}

/// Both products' alerts: a severity, a runbook_url into an existing section of docs/runbook.md,
/// a section titled with the alert's name, and a promtool case.
#[test]
fn every_alert_has_a_severity_a_runbook_url_and_a_firing_case() {
    let anchors = runbook_anchors();
    let mut names = BTreeSet::new();
    for (rules, tests, want) in [
        (
            "deploy/prometheus/node-monitor-rules.yaml",
            "deploy/prometheus/rules.test.yaml",
            14,
        ),
        (
            "deploy/remediate/prometheusrule.yaml",
            "deploy/remediate/rules.test.yaml",
            5,
        ),
    ] {
        let rules_of = alerts_of(rules);
        let tests = read(&root().join(tests));
        assert_eq!(rules_of.len(), want, "{rules}");
        for rule in rules_of {
            let name = rule["alert"].as_str().expect("alert name");
            names.insert(name.to_owned());
            let severity = rule["labels"]["severity"].as_str();
            assert!(
                matches!(severity, Some("critical" | "warning" | "info")),
                "{rules}: {name} has severity {severity:?}"
            );
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .unwrap_or_else(|| panic!("{rules}: {name} has no runbook_url"));
            let target = url
                .strip_prefix(RUNBOOK)
                .unwrap_or_else(|| panic!("{rules}: {name}: runbook_url {url} is not {RUNBOOK}…"));
            assert!(
                anchors.contains(target),
                "{rules}: {name}: runbook_url {url}: docs/runbook.md has no heading with anchor #{target}"
            );
            assert_eq!(
                target,
                anchor(name),
                "{rules}: {name} links another alert's section"
            );
            assert!(
                rule["annotations"]["summary"].as_str().is_some()
                    && rule["annotations"]["description"].as_str().is_some(),
                "{rules}: {name} lacks a summary or a description"
            );
            assert!(
                tests.contains(&format!("alertname: {name}")),
                "{rules}: no promtool case for {name}"
            );
        }
    }
    for new in [
        "NodeMonitorDown",
        "NodeMonitorDaemonSetUnavailable",
        "NodeMonitorLoopStalled",
        "NodeMonitorAPIErrors",
        "NodeMonitorRingBufferDrops",
    ] {
        assert!(names.contains(new), "{new} is missing: {names:?}");
    }
}

/// Each alert's promtool cases include one where it must not fire (`exp_alerts: []`, or another
/// series in the same case that is left out of the expected alerts).
#[test]
fn every_agent_alert_has_a_case_where_it_stays_silent() {
    let tests: serde_norway::Value =
        serde_norway::from_str(&read(&deploy().join("rules.test.yaml"))).expect("YAML");
    let mut silent = BTreeSet::new();
    for case in tests["tests"].as_sequence().expect("tests") {
        let series = case["input_series"].as_sequence().map_or(0, Vec::len);
        // A case of the recording rules has no alert checks.
        for check in case["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = check["alertname"].as_str().expect("alertname");
            let fired = check["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if fired == 0 || fired < series {
                silent.insert(name.to_owned());
            }
        }
    }
    for rule in alerts_of("deploy/prometheus/node-monitor-rules.yaml") {
        let name = rule["alert"].as_str().expect("alert name");
        assert!(
            silent.contains(name),
            "rules.test.yaml has no case where {name} stays silent"
        );
    }
}
