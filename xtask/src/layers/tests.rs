use super::*;

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn use_trees_expand_to_every_path() {
    let mut out = Vec::new();
    expand("", "crate::{a::{b,c@d},e::*,self}", &mut out);
    assert_eq!(
        out,
        strings(&["crate::a::b", "crate::a::c", "crate::e", "crate::self"])
    );
}

#[test]
fn references_read_use_trees_and_paths_in_place() {
    let text = "use std::fmt;\nuse crate::{\n    a::X as Y,\n    b,\n};\nfn f() { super::c::g(); x::crate::no(); }\n";
    let refs = references(text);
    assert_eq!(
        refs,
        vec![
            (2, strings(&["crate", "a", "X"])),
            (2, strings(&["crate", "b"])),
            (6, strings(&["super", "c", "g"])),
        ]
    );
}

#[test]
fn paths_resolve_from_the_module_that_names_them() {
    let at = strings(&["agent", "cycle"]);
    assert_eq!(
        resolve(&at, &strings(&["super", "flight", "F"])),
        Some(strings(&["agent", "flight", "F"]))
    );
    assert_eq!(
        resolve(&at, &strings(&["super", "super", "io"])),
        Some(strings(&["io"]))
    );
    assert_eq!(
        resolve(&at, &strings(&["crate", "io", "read"])),
        Some(strings(&["io", "read"]))
    );
    assert_eq!(resolve(&at, &strings(&["std", "fmt"])), None);
    assert_eq!(resolve(&[], &strings(&["super", "x"])), None);
}

#[test]
fn comments_and_inline_test_modules_are_left_out() {
    let text = "use crate::a; // crate::b\n/// [`crate::c`]\n#[cfg(test)]\nmod tests {\n    use crate::d;\n    fn f() { if x { } }\n}\nuse crate::e;\n";
    let refs: Vec<Vec<String>> = references(&strip(text))
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        refs,
        vec![strings(&["crate", "a"]), strings(&["crate", "e"])]
    );
    assert_eq!(
        test_modules(
            "#[cfg(test)]\nmod tests;\n#[cfg(test)]\n#[allow(x)]\npub(crate) mod prop;\nmod real;\n"
        ),
        strings(&["tests", "prop"])
    );
}

fn import(from: &[&str], to: &[&str]) -> Import {
    Import {
        from: strings(from),
        to: strings(to),
        file: PathBuf::from("f.rs"),
        line: 1,
    }
}

/// (imports, layers, findings as printed)
#[test]
fn findings_by_case() {
    let layers: BTreeMap<String, usize> = [("io", 0), ("sampler", 1), ("agent", 2)]
        .into_iter()
        .map(|(m, l)| (m.to_owned(), l))
        .collect();
    let cases: Vec<(Vec<Import>, Vec<&str>)> = vec![
        (
            vec![
                import(&["agent"], &["sampler"]),
                import(&["sampler"], &["io"]),
            ],
            vec![],
        ),
        (
            vec![import(&["sampler", "disk"], &["agent", "kernel"])],
            vec!["upward import: sampler (layer 1) imports agent (layer 2) at f.rs:1"],
        ),
        (
            // Siblings at depth: a circle under their parent.
            vec![
                import(&["agent", "cycle"], &["agent", "flight"]),
                import(&["agent", "flight", "store"], &["agent", "cycle"]),
            ],
            vec!["import circle under agent: cycle ↔ flight"],
        ),
        (
            // A module and its ancestor: nesting, not an edge.
            vec![
                import(&["agent", "cycle"], &["agent"]),
                import(&["agent"], &["agent", "cycle"]),
            ],
            vec![],
        ),
        (
            vec![import(&["trace"], &["io"])],
            vec!["module trace has no layer in docs/architecture.md (\"Layers\")"],
        ),
    ];
    for (imports, want) in cases {
        let got: Vec<String> = findings_of("c", &imports, &layers)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(got, want, "{imports:?}");
    }
}

#[test]
fn the_layer_table_is_read_per_crate() {
    let doc = "# A\n\n## Layers\n\n| layer | `node-monitor-core` | `node-monitor` |\n|---|---|---|\n| 0 | `units` | `io`, `jitter` |\n| 1 | | `agent` |\n\n## Next\n| 9 | `x` | `y` |\n";
    let t = layer_table(doc, "node-monitor").expect("table");
    assert_eq!(
        t.into_iter().collect::<Vec<_>>(),
        vec![
            ("agent".to_owned(), 1),
            ("io".to_owned(), 0),
            ("jitter".to_owned(), 0)
        ]
    );
    let core = layer_table(doc, "node-monitor-core").expect("table");
    assert_eq!(core.len(), 1);
    assert!(layer_table(doc, "nope").is_err());
}

#[test]
fn product_lines_stop_at_the_test_module() {
    assert_eq!(product_lines("a\nb\n#[cfg(test)]\nmod tests;\n"), 2);
    assert_eq!(product_lines("a\nb\nc"), 3);
    assert_eq!(
        product_lines("a\n    #[cfg(test)]\nb"),
        3,
        "only a top-level test module"
    );
}

#[test]
fn the_agents_crates_are_found_in_a_dependency_listing() {
    let tree = "kubectl-node-monitor v0.1.0 (/w/node-monitor-plugin)\nkube v3.0.0\nnode-monitor-core v0.1.0 (/w/node-monitor-core)\n";
    assert!(agent_only_in(tree).is_empty());
    let tree = "x v0.1.0\nnode-monitor v0.1.0 (/w/node-monitor)\naya v0.16.0\naya v0.16.0\nnode-monitor-ebpf v0.1.0\n";
    assert_eq!(
        agent_only_in(tree),
        ["aya", "node-monitor", "node-monitor-ebpf"]
    );
}

/// A top-level module that imports nothing of its crate and that nothing imports is still a module
/// the table must place; one in the table, a test module and the binary's `main.rs` are not
/// findings.
#[test]
fn a_module_outside_every_import_is_still_placed() {
    let dir = std::env::temp_dir().join(format!("nm-layers-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("a")).expect("mkdir");
    for (file, text) in [
        ("lib.rs", "pub mod a;\npub mod leaf;\n"),
        ("main.rs", "fn main() {}\n"),
        ("a.rs", "#[cfg(test)]\nmod tests;\n"),
        ("a/tests.rs", "use crate::leaf;\n"),
        ("leaf.rs", "pub const X: u8 = 1;\n"),
    ] {
        fs::write(dir.join(file), text).expect("write");
    }
    let layers = BTreeMap::from([("a".to_owned(), 0)]);
    let found = unplaced(&dir, &layers, &[]).expect("read");
    assert_eq!(
        found,
        [Finding::Unplaced {
            module: "leaf".to_owned()
        }]
    );
    let named = unplaced(&dir, &layers, &found).expect("read");
    assert!(named.is_empty(), "named once: {named:?}");
    let _ = fs::remove_dir_all(&dir);
}
