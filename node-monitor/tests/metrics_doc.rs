//! docs/metrics.md and the registry agree: every exported family is documented with its type, and
//! every documented family is exported.
use std::collections::BTreeMap;

use node_monitor::metrics::Metrics;

fn exported() -> BTreeMap<String, String> {
    Metrics::new()
        .families()
        .iter()
        .map(|f| (f.name.clone(), f.kind.to_owned()))
        .collect()
}

fn documented() -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md"))
        .expect("docs/metrics.md");
    doc.lines()
        .filter(|l| l.starts_with("| `node_monitor_"))
        .map(|l| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            (cols[1].trim_matches('`').to_owned(), cols[2].to_owned())
        })
        .collect()
}

#[test]
fn docs_list_exactly_the_exported_families_with_their_types() {
    let exported = exported();
    let documented = documented();
    assert!(exported.len() >= 20, "registry looks empty: {exported:?}");
    for (name, ty) in &exported {
        assert_eq!(
            documented.get(name),
            Some(ty),
            "{name} ({ty}) is exported but docs/metrics.md says {:?}",
            documented.get(name)
        );
    }
    for name in documented.keys() {
        assert!(
            exported.contains_key(name),
            "docs/metrics.md lists {name}, which the agent does not export"
        );
    }
}
