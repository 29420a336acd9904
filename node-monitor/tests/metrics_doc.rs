//! docs/metrics.md and the registries agree: every exported family is documented with its type, and
//! every documented family is exported, for each product: the agent's table (before the
//! `node-monitor remediate` section) against the agent's registry, remediate's table against
//! remediate's.
use std::collections::BTreeMap;

use node_monitor::metrics::{Family_, Metrics};

/// The heading of remediate's section; everything above it is the agent's.
const REMEDIATE_SECTION: &str = "\n## `node-monitor remediate`\n";
/// The heading of the agent's table of renamed families (old → new), within the agent's part.
const RENAMED_SECTION: &str = "\n### Renamed in this release\n";

fn exported(families: &[Family_]) -> BTreeMap<String, String> {
    families
        .iter()
        .map(|f| (f.name.clone(), f.kind.to_owned()))
        .collect()
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

/// The agent's part of docs/metrics.md and remediate's.
fn sections() -> (String, String) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .expect("docs/metrics.md");
    let (agent, remediate) = doc
        .split_once(REMEDIATE_SECTION)
        .expect("docs/metrics.md has a `node-monitor remediate` section");
    let agent = agent.split_once(RENAMED_SECTION).map_or(agent, |(a, _)| a);
    (agent.to_owned(), remediate.to_owned())
}

/// (old, new names) of each row of the agent's "Renamed in this release" table.
fn renamed() -> Vec<(String, Vec<String>)> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .expect("docs/metrics.md");
    let (_, rest) = doc
        .split_once(RENAMED_SECTION)
        .expect("docs/metrics.md has a \"Renamed in this release\" section");
    let section = rest.split("\n#").next().unwrap_or(rest);
    let names = |col: &str| -> Vec<String> {
        col.split(',')
            .map(|n| n.trim().trim_matches('`').to_owned())
            .filter(|n| n.starts_with("node_monitor_"))
            .collect()
    };
    section
        .lines()
        .filter(|l| l.starts_with("| `node_monitor_"))
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            let old = names(cols[1]);
            assert_eq!(old.len(), 1, "one old name per row: {l}");
            (old[0].clone(), names(cols[2]))
        })
        .collect()
}

fn check(
    product: &str,
    exported: &BTreeMap<String, String>,
    documented: &BTreeMap<String, String>,
) {
    for (name, ty) in exported {
        assert_eq!(
            documented.get(name),
            Some(ty),
            "{name} ({ty}) is exported by {product} but its table in docs/metrics.md says {:?}",
            documented.get(name)
        );
    }
    for name in documented.keys() {
        assert!(
            exported.contains_key(name),
            "docs/metrics.md lists {name} for {product}, which does not export it"
        );
    }
}

#[test]
fn docs_list_exactly_the_exported_families_with_their_types() {
    let (agent_doc, remediate_doc) = sections();
    let agent = exported(Metrics::new().families());
    assert!(agent.len() >= 20, "registry looks empty: {agent:?}");
    check("the agent", &agent, &documented(&agent_doc));
    // remediate's section is checked against its registry in its own crate
    // (node-monitor-remediate/tests/metrics_doc.rs); none of its families is the agent's.
    for name in documented(&remediate_doc).keys() {
        assert!(
            !agent.contains_key(name) || name == "node_monitor_build_info",
            "{name} is in remediate's section of docs/metrics.md, but the agent exports it"
        );
    }
}

/// The rename table is true of this build: no old name is exported any more, every new one is.
#[test]
fn renamed_families_are_gone_and_their_successors_exported() {
    let agent = exported(Metrics::new().families());
    let rows = renamed();
    assert!(rows.len() >= 3, "{rows:?}");
    for (old, new) in rows {
        assert!(
            !agent.contains_key(&old),
            "docs/metrics.md says {old} was renamed, but the agent still exports it"
        );
        assert!(!new.is_empty(), "{old} is renamed to nothing");
        for name in new {
            assert!(
                agent.contains_key(&name),
                "docs/metrics.md says {old} became {name}, which the agent does not export"
            );
        }
    }
}
