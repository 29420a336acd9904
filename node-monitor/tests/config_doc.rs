//! docs/configuration.md and the configuration parsers agree. The code side comes from the code:
//! the key lists the parsers gate on (`EVICTION_FILE_FIELDS`, `NODE_MONITOR_KEYS`,
//! `SHUTDOWN_FILE_FIELDS`, `SHUTDOWN_OPTION_KEYS`, `PRIORITY_ENTRY_KEYS`) and the defaults the
//! parsers produce from an empty document. The doc side is the reference tables. The test fails
//! when the parser reads a key the doc does not list, when the doc lists a key the parser rejects
//! or does not read, and when a documented default parses to something other than the default.
use std::collections::BTreeSet;

use node_monitor_core::shutdown::config::{
    PRIORITY_ENTRY_KEYS, SHUTDOWN_FILE_FIELDS, SHUTDOWN_OPTION_KEYS, ShutdownConfig,
    ShutdownOptions, parse_shutdown_config,
};

use node_monitor_core::config::{
    self, ConfigSource, DEFAULT_EVICTION_HARD, EVICTION_FILE_FIELDS, EvictionConfig,
    EvictionOverrides, NODE_MONITOR_KEYS, NodeMonitorSettings,
};

const KUBELET_EVICTION: &str = "## Kubelet eviction fields";
const KUBELET_SHUTDOWN: &str = "## Kubelet shutdown fields";
const PRIORITY_ENTRIES: &str = "### `shutdownGracePeriodByPodPriority` entries";
const NODE_MONITOR: &str = "## `nodeMonitor` settings";
const SHUTDOWN_OPTIONS: &str = "## `nodeMonitor.shutdown` settings";
const EVICTION_HARD_DETAIL: &str = "### `evictionHard` — map of signal to quantity or percentage";

fn doc() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/configuration.md"
    ))
    .expect("docs/configuration.md")
}

/// One documented key: its name and its default as YAML (`None`: documented as absent).
#[derive(Debug, Clone)]
struct Row {
    key: String,
    default: Option<String>,
}

/// Splits a Markdown table row into cells; `\|` inside a cell is not a separator.
fn cells(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = line.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cur.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cur).trim().to_owned()),
            _ => cur.push(c),
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_owned());
    }
    out
}

/// The first code span of a cell.
fn code_span(cell: &str) -> Option<&str> {
    let start = cell.find('`')? + 1;
    let len = cell[start..].find('`')?;
    Some(&cell[start..start + len])
}

/// The table right after `heading`, as rows of (first column, named column).
fn table(doc: &str, heading: &str, column: &str) -> Vec<(String, String)> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != heading);
    assert!(
        lines.next().is_some(),
        "docs/configuration.md has no heading {heading:?}"
    );
    let rows: Vec<&str> = lines
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(rows.len() > 2, "no table under {heading:?}");
    let header = cells(rows[0]);
    let col = header
        .iter()
        .position(|h| h == column)
        .unwrap_or_else(|| panic!("the table under {heading:?} has no {column:?} column"));
    rows[2..]
        .iter()
        .map(|l| {
            let c = cells(l);
            assert_eq!(c.len(), header.len(), "{heading:?}: malformed row {l:?}");
            let key = code_span(&c[0])
                .unwrap_or_else(|| panic!("{heading:?}: the key is not in backticks: {l:?}"))
                .to_owned();
            (key, c[col].clone())
        })
        .collect()
}

/// The keys and defaults of a reference table. A default is a code span, or `none`.
fn reference(doc: &str, heading: &str) -> Vec<Row> {
    table(doc, heading, "default")
        .into_iter()
        .map(|(key, cell)| {
            let default = if cell == "none" {
                None
            } else {
                Some(
                    code_span(&cell)
                        .unwrap_or_else(|| {
                            panic!(
                                "{heading:?} {key}: the default must be a `value` or none, \
                                 found {cell:?}"
                            )
                        })
                        .to_owned(),
                )
            };
            Row { key, default }
        })
        .collect()
}

fn keys(rows: &[Row]) -> BTreeSet<String> {
    rows.iter().map(|r| r.key.clone()).collect()
}

fn code_keys(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|k| (*k).to_owned()).collect()
}

/// Both directions, with messages that say which side is missing what.
fn assert_same_keys(what: &str, documented: &BTreeSet<String>, parsed: &BTreeSet<String>) {
    let undocumented: Vec<_> = parsed.difference(documented).collect();
    let unknown: Vec<_> = documented.difference(parsed).collect();
    assert!(
        undocumented.is_empty(),
        "{what}: the parser accepts {undocumented:?}, which docs/configuration.md does not document"
    );
    assert!(
        unknown.is_empty(),
        "{what}: docs/configuration.md documents {unknown:?}, which the parser does not accept"
    );
}

fn eviction(text: &str) -> Result<EvictionConfig, config::ConfigError> {
    config::load_sources(
        &[ConfigSource {
            name: "doc.yaml",
            text,
        }],
        &EvictionOverrides::default(),
    )
}

/// The agent's start-up: both parsers, as `node-monitor run` and `check-config` call them.
fn both(text: &str) -> Result<(EvictionConfig, ShutdownConfig), String> {
    let e = eviction(text).map_err(|e| e.to_string())?;
    let s = parse_shutdown_config(Some(text)).map_err(|e| e.to_string())?;
    Ok((e, s))
}

fn defaults() -> (EvictionConfig, ShutdownConfig) {
    both("").expect("an empty document is valid")
}

/// `key: value` nested under `path` (YAML block style), e.g. `nodeMonitor:\n  shutdown:\n    k: v`.
fn nested(path: &[&str], key: &str, value: &str) -> String {
    let mut out = String::new();
    for (depth, p) in path.iter().enumerate() {
        out.push_str(&format!("{}{p}:\n", "  ".repeat(depth)));
    }
    out.push_str(&format!("{}{key}: {value}\n", "  ".repeat(path.len())));
    out
}

#[test]
fn every_key_the_parsers_accept_is_documented_and_no_other() {
    let doc = doc();
    let mut top = keys(&reference(&doc, KUBELET_EVICTION));
    top.insert("nodeMonitor".into()); // its own section
    assert_same_keys(
        "top-level eviction fields",
        &top,
        &code_keys(&EVICTION_FILE_FIELDS),
    );
    assert_same_keys(
        "top-level shutdown fields",
        &keys(&reference(&doc, KUBELET_SHUTDOWN)),
        &code_keys(&SHUTDOWN_FILE_FIELDS),
    );
    assert_same_keys(
        "shutdownGracePeriodByPodPriority entries",
        &keys(&reference(&doc, PRIORITY_ENTRIES)),
        &code_keys(&PRIORITY_ENTRY_KEYS),
    );
    assert_same_keys(
        "nodeMonitor",
        &keys(&reference(&doc, NODE_MONITOR)),
        &code_keys(&NODE_MONITOR_KEYS),
    );
    assert_same_keys(
        "nodeMonitor.shutdown",
        &keys(&reference(&doc, SHUTDOWN_OPTIONS)),
        &code_keys(&SHUTDOWN_OPTION_KEYS),
    );
}

/// The lists are what the parsers read: a value of the wrong type under each listed key is
/// rejected, naming the key (a key the parser skipped would be accepted silently).
#[test]
fn the_parsers_read_every_listed_key() {
    let wrong = "[[1]]";
    let cases: Vec<(String, String)> = EVICTION_FILE_FIELDS
        .iter()
        .chain(&SHUTDOWN_FILE_FIELDS)
        .map(|k| (nested(&[], k, wrong), (*k).to_owned()))
        .chain(NODE_MONITOR_KEYS.iter().map(|k| {
            (
                nested(&["nodeMonitor"], k, wrong),
                format!("nodeMonitor.{k}"),
            )
        }))
        .chain(SHUTDOWN_OPTION_KEYS.iter().map(|k| {
            (
                nested(&["nodeMonitor", "shutdown"], k, wrong),
                format!("nodeMonitor.shutdown.{k}"),
            )
        }))
        .chain(PRIORITY_ENTRY_KEYS.iter().map(|k| {
            (
                format!("shutdownGracePeriodByPodPriority:\n  - {k}: {wrong}\n"),
                format!("shutdownGracePeriodByPodPriority[0].{k}"),
            )
        }))
        .collect();
    for (text, field) in cases {
        let err = both(&text).expect_err(&text);
        assert!(
            err.contains(&field),
            "{text:?}: {err:?} should name {field}"
        );
    }
    // And a key that is not listed: skipped at the top level, rejected below it.
    both("maxPods: [[1]]\n").expect("other KubeletConfiguration fields are skipped");
    for text in [
        nested(&["nodeMonitor"], "notASetting", "1"),
        nested(&["nodeMonitor", "shutdown"], "notASetting", "1"),
        "shutdownGracePeriodByPodPriority:\n  - notASetting: 1\n".to_owned(),
    ] {
        let err = both(&text).expect_err(&text);
        assert!(err.contains("unknown setting \"notASetting\""), "{err}");
    }
}

/// Each documented default, written into a document on its own, parses to the code's default;
/// so does a document holding every documented default at once.
#[test]
fn documented_defaults_are_the_code_defaults() {
    let doc = doc();
    let (eviction_default, shutdown_default) = defaults();
    let mut all = Vec::new();
    let sections: [(&str, &[&str]); 4] = [
        (KUBELET_EVICTION, &[]),
        (KUBELET_SHUTDOWN, &[]),
        (NODE_MONITOR, &["nodeMonitor"]),
        (SHUTDOWN_OPTIONS, &["nodeMonitor", "shutdown"]),
    ];
    let mut checked = 0;
    for (heading, path) in sections {
        for row in reference(&doc, heading) {
            let Some(default) = &row.default else {
                continue;
            };
            let text = nested(path, &row.key, default);
            let (e, s) = both(&text).unwrap_or_else(|err| {
                panic!(
                    "{heading} {}: the documented default {default:?} is rejected: {err}",
                    row.key
                )
            });
            assert_eq!(
                e, eviction_default,
                "{heading} {}: the documented default {default:?} is not the code's",
                row.key
            );
            assert_eq!(
                s, shutdown_default,
                "{heading} {}: the documented default {default:?} is not the code's",
                row.key
            );
            all.push((path, row.key, default.clone()));
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} documented defaults found");

    // All at once: top-level keys, then the nodeMonitor block with its shutdown block.
    let mut text = String::new();
    for (path, key, default) in all.iter().filter(|(p, ..)| p.is_empty()) {
        text.push_str(&nested(path, key, default));
    }
    text.push_str("nodeMonitor:\n");
    for (_, key, default) in all.iter().filter(|(p, ..)| p.len() == 1) {
        text.push_str(&format!("  {key}: {default}\n"));
    }
    text.push_str("  shutdown:\n");
    for (_, key, default) in all.iter().filter(|(p, ..)| p.len() == 2) {
        text.push_str(&format!("    {key}: {default}\n"));
    }
    let (e, s) = both(&text).unwrap_or_else(|err| panic!("{text}\nrejected: {err}"));
    assert_eq!(e, eviction_default, "{text}");
    assert_eq!(s, shutdown_default, "{text}");

    // The entry keys default to Go's zero values: documenting them is the same as leaving them out.
    for row in reference(&doc, PRIORITY_ENTRIES) {
        let default = row
            .default
            .unwrap_or_else(|| panic!("entry key {} needs a documented default", row.key));
        let with = parse_shutdown_config(Some(&format!(
            "shutdownGracePeriodByPodPriority:\n  - {}: {default}\n",
            row.key
        )))
        .unwrap_or_else(|e| panic!("entry key {}: {default:?} rejected: {e}", row.key));
        let without = parse_shutdown_config(Some("shutdownGracePeriodByPodPriority:\n  - {}\n"))
            .expect("an empty entry");
        assert_eq!(
            with.settings, without.settings,
            "entry key {}: the documented default {default:?} is not Go's zero value",
            row.key
        );
    }
}

/// The structs the agent runs with hold exactly the documented settings: a field added to
/// either without a key in the parser's list (and so in the doc) fails here.
#[test]
fn settings_structs_match_the_key_lists() {
    let fields = |v: serde_json::Value| -> BTreeSet<String> {
        v.as_object().expect("an object").keys().cloned().collect()
    };
    let mut node_monitor = code_keys(&NODE_MONITOR_KEYS);
    node_monitor.remove("shutdown");
    assert_eq!(
        fields(serde_json::to_value(NodeMonitorSettings::default()).expect("json")),
        node_monitor
    );
    assert_eq!(
        fields(serde_json::to_value(ShutdownOptions::default()).expect("json")),
        code_keys(&SHUTDOWN_OPTION_KEYS)
    );
}

#[test]
fn eviction_hard_default_table_is_the_kubelet_default() {
    let documented: Vec<(String, String)> = table(&doc(), EVICTION_HARD_DETAIL, "default")
        .into_iter()
        .map(|(signal, cell)| {
            let v = code_span(&cell)
                .unwrap_or_else(|| panic!("{signal}: no value"))
                .to_owned();
            (signal, v)
        })
        .collect();
    let code: Vec<(String, String)> = DEFAULT_EVICTION_HARD
        .iter()
        .map(|(s, v)| (s.as_str().to_owned(), (*v).to_owned()))
        .collect();
    assert_eq!(documented, code);
}

/// Every YAML example in the reference is a valid configuration.
#[test]
fn examples_in_the_reference_are_valid() {
    let doc = doc();
    let mut examples = 0;
    let mut rest = doc.as_str();
    while let Some(start) = rest.find("```yaml\n") {
        let body = &rest[start + 8..];
        let end = body.find("```").expect("closed code block");
        both(&body[..end]).unwrap_or_else(|e| panic!("example rejected: {e}\n{}", &body[..end]));
        examples += 1;
        rest = &body[end + 3..];
    }
    assert!(examples >= 1, "no YAML example found");
}
