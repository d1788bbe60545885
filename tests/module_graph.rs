//! The library's modules depend on each other in one direction only: no cycles between the
//! top-level modules, nor between the modules inside `runtime` and inside `runtime::translate`.
//!
//! The graph is read from the source: a file in module `a` that names `crate::b` (in a `use`
//! or a path) depends on `b`; inside `runtime`, `super::b` and `crate::runtime::b` count too.
//! `scripts/module-graph` prints it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments and without `#[cfg(test)]` modules at its end (tests
/// may reach anywhere).
fn code_of(text: &str) -> String {
    let cut = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..cut]
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers that follow each occurrence of `prefix` (e.g. `crate::`).
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before_ok = i == 0
            || !rest[..i]
                .chars()
                .last()
                .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        rest = &rest[i + prefix.len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if before_ok && !name.is_empty() {
            out.insert(name);
        }
        // `use crate::{a, b}` names several at once.
        if rest.starts_with('{') {
            let end = rest.find('}').unwrap_or(rest.len());
            for part in rest[1..end].split(',') {
                let n: String = part
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !n.is_empty() {
                    out.insert(n);
                }
            }
        }
    }
    out
}

/// The graph of modules under `root` (a directory of the crate), each file belonging to the
/// module named by its first path component below `root`.
fn graph(src: &Path, root: &Path, prefixes: &[&str]) -> Graph {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeSet<String> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let name = p.file_stem()?.to_str()?.to_string();
            (p.is_dir() || p.extension().is_some_and(|x| x == "rs")).then_some(name)
        })
        .filter(|n| !["lib", "main", "mod"].contains(&n.as_str()))
        .collect();
    let mut g = Graph::new();
    for file in files {
        let rel = file.strip_prefix(root).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        if !modules.contains(&module) {
            continue;
        }
        let code = code_of(&std::fs::read_to_string(&file).unwrap());
        // How many `super::` reach the modules beside this file's module: one from `a.rs` or
        // `a/mod.rs`, two from `a/b.rs`, and so on.
        let depth = rel.components().count() - usize::from(rel.ends_with("mod.rs"));
        let siblings = "super::".repeat(depth);
        for prefix in prefixes {
            let prefix = if *prefix == "super::" {
                siblings.as_str()
            } else {
                prefix
            };
            for name in names_after(&code, prefix) {
                if name != module && modules.contains(&name) {
                    g.entry(module.clone()).or_default().insert(name);
                }
            }
        }
        g.entry(module).or_default();
    }
    let _ = src;
    g
}

/// The cycles of the graph: its strongly connected components with more than one module.
fn cycles(g: &Graph) -> Vec<BTreeSet<String>> {
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(n) = stack.pop() {
            for m in g.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for a in g.keys() {
        let from_a = reach(a);
        let scc: BTreeSet<String> = g
            .keys()
            .filter(|b| *b == a || (from_a.contains(*b) && reach(b).contains(a)))
            .cloned()
            .collect();
        if scc.len() > 1 && !out.contains(&scc) {
            out.push(scc);
        }
    }
    out
}

fn render(title: &str, g: &Graph) -> String {
    let mut text = format!("{title}\n");
    for (m, deps) in g {
        let list: Vec<&str> = deps.iter().map(String::as_str).collect();
        text.push_str(&format!("  {m} -> {}\n", list.join(", ")));
    }
    text
}

#[test]
fn no_module_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let top = graph(&src, &src, &["crate::"]);
    let runtime = graph(&src, &src.join("runtime"), &["crate::runtime::", "super::"]);
    let translate = graph(
        &src,
        &src.join("runtime/translate"),
        &["crate::runtime::translate::", "super::"],
    );
    let text = format!(
        "{}{}{}",
        render("top-level modules (src/*):", &top),
        render("inside runtime (src/runtime/*):", &runtime),
        render("inside translate (src/runtime/translate/*):", &translate)
    );
    println!("{text}");
    let mut problems = Vec::new();
    for (what, g) in [
        ("top level", &top),
        ("runtime", &runtime),
        ("translate", &translate),
    ] {
        for c in cycles(g) {
            problems.push(format!("{what}: {c:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "module cycles:\n{}\n\n{text}",
        problems.join("\n")
    );
}

#[test]
fn the_reader_finds_names_in_uses_and_paths() {
    let code = "use crate::{cri, pleg::X};\nlet x = crate::node::f();\nfoo_crate::bar;";
    let names = names_after(code, "crate::");
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        vec!["cri", "node", "pleg"]
    );
    let g: Graph = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["a".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(
        cycles(&g),
        vec![BTreeSet::from(["a".to_string(), "b".to_string()])]
    );
}
