//! docs/metrics.md and remediate's registry agree: every family remediate exports is in its
//! section (`## \`node-monitor remediate\``) with its type, every family listed there is exported,
//! and remediate exports nothing of the agent's (only `node_monitor_remediation_*` and the build
//! information).
use std::collections::BTreeMap;

use node_monitor_remediate::metrics::RemediateMetrics;

/// The heading of remediate's section; everything above it is the agent's.
const REMEDIATE_SECTION: &str = "\n## `node-monitor remediate`\n";

fn section() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .expect("docs/metrics.md");
    let (_, remediate) = doc
        .split_once(REMEDIATE_SECTION)
        .expect("docs/metrics.md has a `node-monitor remediate` section");
    remediate.to_owned()
}

fn documented(section: &str) -> BTreeMap<String, String> {
    section
        .lines()
        .filter(|l| l.starts_with("| `node_monitor_"))
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            (cols[1].trim_matches('`').to_owned(), cols[2].to_owned())
        })
        .collect()
}

#[test]
fn docs_list_exactly_the_exported_families_with_their_types() {
    let exported: BTreeMap<String, String> = RemediateMetrics::new()
        .families()
        .iter()
        .map(|f| (f.name.clone(), f.kind.to_owned()))
        .collect();
    assert!(exported.len() >= 10, "registry looks empty: {exported:?}");
    let documented = documented(&section());
    for (name, ty) in &exported {
        assert_eq!(
            documented.get(name),
            Some(ty),
            "{name} ({ty}) is exported by remediate but its table in docs/metrics.md says {:?}",
            documented.get(name)
        );
    }
    for name in documented.keys() {
        assert!(
            exported.contains_key(name),
            "docs/metrics.md lists {name} for remediate, which does not export it"
        );
    }
}

/// remediate's endpoint exposes only its own families and the build information.
#[test]
fn remediate_exposes_only_its_own_families() {
    let text = RemediateMetrics::new().encode();
    let exposed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(exposed.len() >= 5, "{exposed:?}");
    for name in exposed {
        assert!(
            name.starts_with("node_monitor_remediation_") || name == "node_monitor_build",
            "remediate's /metrics exposes {name}"
        );
    }
}
