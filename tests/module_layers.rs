//! The modules of each crate depend one way: no top-level module of `src/` or `shim/src/`
//! reaches, through `crate::` paths, a module that reaches it back, only the binary
//! reaches the transport (`server`), and the shim's folders import only the ones below. Read from the source, so a new import that closes a
//! circle fails here rather than in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level module → the top-level modules it names, each with a file that names it.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`cri` for `src/cri/sandbox.rs`).
fn top_module(root: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(root).expect("file under its root");
    let first = rel.components().next().expect("a path component");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_string()
}

/// The code of a file without comments and without its `#[cfg(test)] mod tests` block
/// (unit tests may reach anything).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules a piece of code names: `crate::x::…` paths and the heads of
/// `use crate::{x::…, y};` groups.
fn named_modules(code: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let ident_at = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find("};").unwrap_or(group.len())];
            // Only the heads of the group's items: `a::b` names `a`, nested groups skipped.
            let mut depth = 0;
            let mut head = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => head = true,
                    c if head && depth == 0 && (c.is_ascii_alphanumeric() || c == '_') => {
                        named.insert(ident_at(&group[i..]));
                        head = false;
                    }
                    c if !c.is_whitespace() => head = false,
                    _ => {}
                }
            }
        } else {
            named.insert(ident_at(rest));
        }
    }
    named.retain(|m| modules.contains(m));
    named
}

fn module_graph(root: &Path) -> Graph {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(root, f))
        .filter(|m| m != "main" && m != "lib")
        .collect();
    let mut graph = Graph::new();
    for file in &files {
        let from = top_module(root, file);
        if from == "main" || from == "lib" {
            continue;
        }
        let text = std::fs::read_to_string(file).expect("read a source file");
        for to in named_modules(&code_of(&text), &modules) {
            if to != from {
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| file.display().to_string());
            }
        }
    }
    graph
}

/// A path of edges from `from` back to `to`, if there is one.
fn path_between(graph: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![vec![from.to_string()]];
    while let Some(path) = stack.pop() {
        let last = path.last().expect("a non-empty path");
        if last == to {
            return Some(path);
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        for next in graph.get(last).into_iter().flat_map(|e| e.keys()) {
            let mut longer = path.clone();
            longer.push(next.clone());
            stack.push(longer);
        }
    }
    None
}

/// Every edge that closes a circle, described with the file that makes each step.
fn circles(graph: &Graph) -> Vec<String> {
    let mut found = Vec::new();
    for (from, edges) in graph {
        for (to, file) in edges {
            if let Some(back) = path_between(graph, to, from) {
                let steps: Vec<String> = back
                    .windows(2)
                    .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]]))
                    .collect();
                found.push(format!(
                    "{from} -> {to} ({file}), back: {}",
                    steps.join(", ")
                ));
            }
        }
    }
    found
}

fn crate_root(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn the_daemon_modules_import_no_circle() {
    let graph = module_graph(&crate_root("src"));
    assert!(graph.len() > 10, "too few modules read: {graph:?}");
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles in src/:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_shim_modules_import_no_circle() {
    let graph = module_graph(&crate_root("shim/src"));
    assert!(graph.len() >= 4, "too few modules read: {graph:?}");
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles in shim/src/:\n{}",
        found.join("\n")
    );
}

/// The shim's folders stack: the entry points on the services and their state (`task`), on
/// the pod, on errors, on running processes (`runtime`); each imports only those below it.
#[test]
fn the_shim_groups_import_only_the_ones_below() {
    const ORDER: [&str; 5] = ["entry", "task", "pod", "error", "runtime"];
    let rank = |m: &str| ORDER.iter().position(|o| *o == m);
    let graph = module_graph(&crate_root("shim/src"));
    for group in ORDER {
        let seen = graph.contains_key(group) || graph.values().any(|e| e.contains_key(group));
        assert!(seen, "no {group} in {graph:?}");
    }
    let upward: Vec<String> = graph
        .iter()
        .flat_map(|(from, edges)| edges.iter().map(move |(to, file)| (from, to, file)))
        .filter(|(from, to, _)| match (rank(from), rank(to)) {
            (Some(f), Some(t)) => t <= f,
            _ => false,
        })
        .map(|(from, to, file)| format!("{from} -> {to} ({file})"))
        .collect();
    assert!(upward.is_empty(), "shim imports upward: {upward:?}");
}

#[test]
fn only_the_binary_reaches_the_transport() {
    let graph = module_graph(&crate_root("src"));
    let reaching: Vec<String> = graph
        .iter()
        .filter_map(|(from, edges)| edges.get("server").map(|file| format!("{from} ({file})")))
        .collect();
    assert!(
        reaching.is_empty(),
        "modules below the transport import server/: {reaching:?}"
    );
}

#[test]
fn the_checker_sees_a_circle_through_a_use_group() {
    let modules: BTreeSet<String> = ["a", "b", "c"].iter().map(|m| m.to_string()).collect();
    let named = named_modules(
        "use crate::{b::{x, y}, c};\n// crate::a in a comment\nfn f() { crate::a::g(); }",
        &modules,
    );
    assert_eq!(named, modules);
    let mut graph = Graph::new();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a")] {
        graph
            .entry(from.to_string())
            .or_default()
            .insert(to.to_string(), format!("{from}.rs"));
    }
    assert_eq!(circles(&graph).len(), 3, "{:?}", circles(&graph));
    graph.get_mut("c").expect("c").clear();
    assert!(circles(&graph).is_empty());
}

/// What only `sys` may call: mounts, namespaces, ownership changes and raw system calls.
const OS_MECHANICS: &[&str] = &[
    "unsafe ",
    "libc::",
    "nix::mount",
    "nix::sched",
    "nix::unistd",
    "fs::chown(",
    "fs::lchown(",
    "fs::symlink(",
];

#[test]
fn the_cri_handlers_reach_the_os_only_through_sys() {
    let root = crate_root("src/cri");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 30, "too few handler files: {files:?}");
    let mut found = Vec::new();
    for file in &files {
        let code = code_of(&std::fs::read_to_string(file).expect("read a handler"));
        for call in OS_MECHANICS {
            if code.contains(call) {
                found.push(format!("{} names {call}", file.display()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "OS mechanics outside sys/:\n{}",
        found.join("\n")
    );
}
