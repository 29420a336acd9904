//! The layering check (`cargo xtask layers`, run with the lints): the product crates' modules
//! import each other without a circle, no module imports one of a higher layer than its own,
//! as docs/architecture.md ("Layers") draws them, and no product file is over [`MAX_LINES`]
//! lines (its test module, inline or in `tests.rs`, apart).
//!
//! Imports are read from the source: `use` trees and paths that start with `crate::`, `super::`
//! or `self::`, each resolved to the deepest module that has a file. Test-only modules
//! (`#[cfg(test)] mod …;` and their files, inline `#[cfg(test)] mod … { … }`) and comments are
//! left out. An import between a module and its own ancestor is part of being nested, not an
//! edge; any other import counts between the two modules' branches under their common parent,
//! so a circle is found at every depth (`agent::cycle` ↔ `agent::flight`, `cluster` ↔ `agent`).
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt, fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// A module's path inside its crate (`[]` is the crate root).
type ModPath = Vec<String>;

/// One import: where it is written and the module it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Import {
    pub from: ModPath,
    pub to: ModPath,
    pub file: PathBuf,
    pub line: usize,
}

/// What the check finds wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// Modules under one parent that import each other, directly or around a circle.
    Circle {
        parent: String,
        modules: Vec<String>,
    },
    /// An import from a module to one of a higher layer.
    Upward {
        from: String,
        from_layer: usize,
        to: String,
        to_layer: usize,
        at: String,
    },
    /// A top-level module the layer table does not place.
    Unplaced { module: String },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Circle { parent, modules } => {
                write!(f, "import circle under {parent}: {}", modules.join(" ↔ "))
            }
            Self::Upward {
                from,
                from_layer,
                to,
                to_layer,
                at,
            } => write!(
                f,
                "upward import: {from} (layer {from_layer}) imports {to} (layer {to_layer}) at {at}"
            ),
            Self::Unplaced { module } => write!(
                f,
                "module {module} has no layer in docs/architecture.md (\"Layers\")"
            ),
        }
    }
}

/// The most lines a product file may have, before its inline test module.
pub const MAX_LINES: usize = 600;

/// The product crates checked, with their column in the layer table.
pub const CRATES: [(&str, &str); 6] = [
    ("node-monitor-core", "node-monitor-core/src"),
    ("node-monitor-base", "node-monitor-base/src"),
    ("node-monitor-service", "node-monitor-service/src"),
    ("node-monitor", "node-monitor/src"),
    ("node-monitor-remediate", "node-monitor-remediate/src"),
    ("kubectl-node-monitor", "node-monitor-plugin/src"),
];

/// `cargo xtask layers`: checks every crate of [`CRATES`] against docs/architecture.md.
pub fn check(root: &Path) -> Result<()> {
    let doc = fs::read_to_string(root.join("docs/architecture.md"))
        .context("reading docs/architecture.md")?;
    let mut findings = Vec::new();
    for (name, src) in CRATES {
        let layers = layer_table(&doc, name)?;
        let imports = crate_imports(&root.join(src))?;
        let mut found = findings_of(name, &imports, &layers);
        found.extend(unplaced(&root.join(src), &layers, &found)?);
        eprintln!(
            "layers: {name}: {} imports between modules, {} finding(s)",
            imports.len(),
            found.len()
        );
        findings.extend(found.into_iter().map(|f| format!("{name}: {f}")));
        for (file, lines) in long_files(&root.join(src))? {
            findings.push(format!(
                "{name}: {} has {lines} product lines, over {MAX_LINES}",
                file.display()
            ));
        }
    }
    if !findings.is_empty() {
        bail!("the layering check failed:\n  {}", findings.join("\n  "));
    }
    Ok(())
}

/// Crates a product without the agent must not build: the agent, its eBPF object and the
/// toolchain it needs (nightly, bpf-linker, through aya-build), its kernel and D-Bus clients.
pub const AGENT_ONLY: [&str; 7] = [
    "node-monitor",
    "node-monitor-ebpf",
    "aya",
    "aya-build",
    "aya-obj",
    "libbpf-sys",
    "zbus",
];

/// The products that build apart from the agent, checked against [`AGENT_ONLY`].
pub const APART: [&str; 4] = [
    "kubectl-node-monitor",
    "node-monitor-base",
    "node-monitor-remediate",
    "node-monitor-service",
];

/// Checks that each crate of [`APART`] has none of [`AGENT_ONLY`] among its normal and build
/// dependencies (`cargo tree`), so it builds on stable Rust without the eBPF toolchain.
pub fn check_apart(root: &Path) -> Result<()> {
    for krate in APART {
        let out =
            std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
                .current_dir(root)
                .args([
                    "tree",
                    "--locked",
                    "-e",
                    "normal,build",
                    "--prefix",
                    "none",
                    "-p",
                    krate,
                ])
                .output()
                .context("running cargo tree")?;
        if !out.status.success() {
            bail!(
                "cargo tree -p {krate}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let found = agent_only_in(&String::from_utf8_lossy(&out.stdout));
        if !found.is_empty() {
            bail!(
                "{krate} depends on the agent's crates: {}",
                found.join(", ")
            );
        }
        eprintln!("layers: {krate} builds without the agent and its eBPF toolchain");
    }
    Ok(())
}

/// The crates of [`AGENT_ONLY`] in a `cargo tree --prefix none` listing.
fn agent_only_in(tree: &str) -> Vec<String> {
    let mut out: Vec<String> = tree
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| AGENT_ONLY.contains(name))
        .map(str::to_owned)
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The layer of each top-level module of `krate`, from the table under docs/architecture.md's
/// "## Layers": `| layer | node-monitor-core | node-monitor |`, modules in backquotes.
pub fn layer_table(doc: &str, krate: &str) -> Result<BTreeMap<String, usize>> {
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Layers"))
        .context("docs/architecture.md has no \"## Layers\" section")?;
    let mut rows = section.lines().filter(|l| l.starts_with('|'));
    let header: Vec<&str> = rows
        .next()
        .context("no layer table")?
        .split('|')
        .map(|c| c.trim().trim_matches('`'))
        .collect();
    let column = header
        .iter()
        .position(|c| *c == krate)
        .with_context(|| format!("the layer table has no column {krate}"))?;
    let mut out = BTreeMap::new();
    for row in rows {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Ok(layer) = cells.get(1).unwrap_or(&"").parse::<usize>() else {
            continue;
        };
        for module in cells
            .get(column)
            .unwrap_or(&"")
            .split('`')
            .skip(1)
            .step_by(2)
        {
            if out.insert(module.to_owned(), layer).is_some() {
                bail!("{krate}: module {module} is in two layers");
            }
        }
    }
    Ok(out)
}

/// What is wrong with a crate's imports against its layers.
pub fn findings_of(
    _krate: &str,
    imports: &[Import],
    layers: &BTreeMap<String, usize>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    // Edges lifted to siblings under their common parent.
    let mut edges: BTreeMap<ModPath, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut tops = BTreeSet::new();
    for i in imports {
        if let Some(t) = i.from.first() {
            tops.insert(t.clone());
        }
        let common = i.from.iter().zip(&i.to).take_while(|(a, b)| a == b).count();
        if common == i.from.len() || common == i.to.len() {
            continue; // a module and its ancestor
        }
        let (a, b) = (i.from[common].clone(), i.to[common].clone());
        edges
            .entry(i.from[..common].to_vec())
            .or_default()
            .entry(a.clone())
            .or_default()
            .insert(b.clone());
        if common == 0 {
            let (la, lb) = (layers.get(&a), layers.get(&b));
            if let (Some(&la), Some(&lb)) = (la, lb)
                && lb > la
                && !out.iter().any(
                    |f| matches!(f, Finding::Upward { from, to, .. } if *from == a && *to == b),
                )
            {
                out.push(Finding::Upward {
                    from: a,
                    from_layer: la,
                    to: b,
                    to_layer: lb,
                    at: format!("{}:{}", i.file.display(), i.line),
                });
            }
        }
    }
    for module in tops {
        if !layers.contains_key(&module) {
            out.push(Finding::Unplaced { module });
        }
    }
    for (parent, graph) in &edges {
        for circle in circles(graph) {
            out.push(Finding::Circle {
                parent: if parent.is_empty() {
                    "the crate root".to_owned()
                } else {
                    parent.join("::")
                },
                modules: circle,
            });
        }
    }
    out
}

/// The top-level modules of the crate at `src` that the layer table does not place and that
/// `found` does not name yet: also a module that imports nothing of the crate and that nothing
/// imports.
fn unplaced(
    src: &Path,
    layers: &BTreeMap<String, usize>,
    found: &[Finding],
) -> Result<Vec<Finding>> {
    let (_, files) = product_files(src)?;
    let tops: BTreeSet<&String> = files.keys().filter_map(|m| m.first()).collect();
    Ok(tops
        .into_iter()
        .filter(|m| !layers.contains_key(*m))
        .filter(|m| {
            !found
                .iter()
                .any(|f| matches!(f, Finding::Unplaced { module } if module == *m))
        })
        .map(|m| Finding::Unplaced { module: m.clone() })
        .collect())
}

/// The strongly connected components of more than one node (Tarjan's algorithm).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                let lw = s.low[w.as_str()];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.stack.contains(&w.as_str()) {
                let iw = s.index[w.as_str()];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Every import between modules of the crate whose source is `src` (the library's `lib.rs` tree;
/// `main.rs` and `bin/` are the binaries' own roots).
pub fn crate_imports(src: &Path) -> Result<Vec<Import>> {
    let (modules, files) = product_files(src)?;
    let mut out = Vec::new();
    for (path, file) in &files {
        let text = strip(&fs::read_to_string(file)?);
        for (line, reference) in references(&text) {
            let Some(absolute) = resolve(path, &reference) else {
                continue;
            };
            let Some(to) = deepest(&modules, &absolute) else {
                continue;
            };
            if to != *path {
                out.push(Import {
                    from: path.clone(),
                    to,
                    file: file.strip_prefix(src).unwrap_or(file).to_path_buf(),
                    line,
                });
            }
        }
    }
    Ok(out)
}

/// The crate's product files over [`MAX_LINES`] lines before their first `#[cfg(test)]`, with
/// that count; test-only files left out.
pub fn long_files(src: &Path) -> Result<Vec<(PathBuf, usize)>> {
    let mut out = Vec::new();
    for file in product_files(src)?.1.values() {
        let lines = product_lines(&fs::read_to_string(file)?);
        if lines > MAX_LINES {
            out.push((file.strip_prefix(src).unwrap_or(file).to_path_buf(), lines));
        }
    }
    Ok(out)
}

/// The lines before the first top-level `#[cfg(test)]`.
fn product_lines(text: &str) -> usize {
    text.lines()
        .position(|l| l.starts_with("#[cfg(test)]"))
        .unwrap_or_else(|| text.lines().count())
}

/// Every module of the crate whose source is `src`, and the product ones with their files:
/// test-only files (declared `#[cfg(test)] mod x;` by their parent, and what is under them) left
/// out.
fn product_files(src: &Path) -> Result<(BTreeSet<ModPath>, BTreeMap<ModPath, PathBuf>)> {
    let mut files = BTreeMap::new();
    collect(src, src, &mut files)?;
    let modules: BTreeSet<ModPath> = files.keys().cloned().collect();
    let mut test_only: BTreeSet<ModPath> = BTreeSet::new();
    for (path, file) in &files {
        for name in test_modules(&fs::read_to_string(file)?) {
            let mut p = path.clone();
            p.push(name);
            test_only.insert(p);
        }
    }
    files.retain(|path, _| !test_only.iter().any(|t| path.starts_with(t)));
    Ok((modules, files))
}

fn collect(src: &Path, dir: &Path, out: &mut BTreeMap<ModPath, PathBuf>) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let rel = path.strip_prefix(src).unwrap_or(&path);
        if path.is_dir() {
            if rel != Path::new("bin") {
                collect(src, &path, out)?;
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || rel == Path::new("main.rs") {
            continue;
        }
        let mut segments: ModPath = rel
            .with_extension("")
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        if segments.last().is_some_and(|s| s == "mod" || s == "lib") {
            segments.pop();
        }
        out.insert(segments, path);
    }
    Ok(())
}

/// The names of the `#[cfg(test)] mod name;` declarations in a file.
fn test_modules(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cfg_test = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with("#[cfg(test)]") {
            cfg_test = true;
            continue;
        }
        if cfg_test {
            let decl = line
                .strip_prefix("pub(crate) ")
                .or_else(|| line.strip_prefix("pub "))
                .unwrap_or(line);
            if let Some(name) = decl.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                out.push(name.trim().to_owned());
            }
        }
        if !line.starts_with("#[") {
            cfg_test = false;
        }
    }
    out
}

/// The text without comments and without inline `#[cfg(test)] mod … { … }` blocks; lines kept
/// (blanked), so that line numbers stay true.
fn strip(text: &str) -> String {
    let mut lines: Vec<String> = text
        .lines()
        .map(|l| match l.find("//") {
            // `//` inside a string literal (a URL) is rare in a `use` or a path; cut anyway.
            Some(i) => l[..i].to_owned(),
            None => l.to_owned(),
        })
        .collect();
    let mut i = 0;
    while i < lines.len() {
        let is_test_block = lines[i].trim_start().starts_with("#[cfg(test)]")
            && lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("mod ") && n.trim_end().ends_with('{'));
        if !is_test_block {
            i += 1;
            continue;
        }
        let mut depth = 0i64;
        let mut j = i + 1;
        while j < lines.len() {
            depth += lines[j].matches('{').count() as i64 - lines[j].matches('}').count() as i64;
            lines[j].clear();
            j += 1;
            if depth <= 0 {
                break;
            }
        }
        lines[i].clear();
        i = j;
    }
    lines.join("\n")
}

/// Every path the text names that starts with `crate`, `super` or `self`, as segments, with its
/// line; `use` trees are expanded.
fn references(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    // `use` trees (possibly over several lines), expanded.
    let mut spans = Vec::new();
    let mut rest = 0;
    while let Some(found) = find_word(&text[rest..], "use") {
        let start = rest + found + 3;
        let Some(end) = text[start..].find(';') else {
            break;
        };
        // Whitespace out, a renaming `as` kept as `@`.
        let tree: String = text[start..start + end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace(" as ", "@")
            .replace(' ', "");
        let mut paths = Vec::new();
        expand("", &tree, &mut paths);
        for p in paths {
            let segments: Vec<String> = p.split("::").map(str::to_owned).collect();
            if matches!(
                segments.first().map(String::as_str),
                Some("crate" | "super" | "self")
            ) {
                out.push((line_of(start), segments));
            }
        }
        spans.push(start..start + end);
        rest = start + end;
    }
    // Paths written in place: `crate::a::b`, `super::super::x`.
    let bytes = text.as_bytes();
    for head in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(found) = text[from..].find(head) {
            let at = from + found;
            from = at + head.len();
            if spans.iter().any(|s| s.contains(&at)) {
                continue;
            }
            let before = at.checked_sub(1).map(|i| bytes[i]);
            if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
                continue;
            }
            let path: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            let segments: Vec<String> = path
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            out.push((line_of(at), segments));
        }
    }
    out
}

/// The position of `word` as a whole word followed by whitespace.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(found) = text[from..].find(word) {
        let at = from + found;
        let before_ok =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let after_ok = bytes
            .get(at + word.len())
            .is_some_and(u8::is_ascii_whitespace);
        if before_ok && after_ok {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Expands a `use` tree without whitespace (`a::{b,c::{d,e@f}}`, `@` for ` as `) into full
/// paths.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let join = |p: &str, s: &str| {
        if p.is_empty() {
            s.to_owned()
        } else {
            format!("{p}::{s}")
        }
    };
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim_end_matches("::");
        let inner = tree[open + 1..]
            .strip_suffix('}')
            .unwrap_or(&tree[open + 1..]);
        let base = join(prefix, head);
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&base, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&base, &inner[start..], out);
    } else if !tree.is_empty() {
        let path = tree.split('@').next().unwrap_or(tree);
        out.push(join(prefix, path.trim_end_matches("::*")));
    }
}

/// A path's absolute module segments, from the module `at` that names it; `None` for a path
/// outside the crate.
fn resolve(at: &[String], path: &[String]) -> Option<ModPath> {
    let mut segments = path.iter().peekable();
    let mut base: ModPath = match segments.next()?.as_str() {
        "crate" => Vec::new(),
        "self" => at.to_vec(),
        "super" => at[..at.len().checked_sub(1)?].to_vec(),
        _ => return None,
    };
    while segments.peek().is_some_and(|s| *s == "super") {
        segments.next();
        base.pop();
    }
    base.extend(segments.filter(|s| *s != "self").cloned());
    Some(base)
}

/// The deepest module among `modules` that `path` starts with (the crate root when none).
fn deepest(modules: &BTreeSet<ModPath>, path: &[String]) -> Option<ModPath> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
}

#[cfg(test)]
mod tests;
