//! The crate's layers are used in one direction only: a part uses the parts below it, never
//! one above or beside it. [`LAYERS`] is the table, lowest first; `scripts/module-graph` prints
//! the graph as the source has it.
//!
//! A *part* is a module directly under a layer (`kubelet::runtime`, `base::yaml`; `config` is
//! one part on its own). A file of part P that names a path of part Q (`crate::…` or
//! `super::…`, in a `use` or in code) makes P use Q. P may use Q when Q's layer is lower, or
//! when both share a layer and Q's tier in it is lower. Every production file is read (see
//! `shape`): test code is skipped only where it is a `#[cfg(test)]` item or a file declared
//! as one.

mod shape;

use std::collections::{BTreeMap, BTreeSet};

use shape::{SourceFile, production_files};

/// One layer: its directory under `src/` and its parts in tiers, lowest first. A part may use
/// the parts of lower tiers of its own layer, and every part of every lower layer.
struct Layer {
    name: &'static str,
    tiers: &'static [&'static [&'static str]],
}

/// The layers, lowest first.
const LAYERS: &[Layer] = &[
    Layer {
        name: "base",
        tiers: &[
            &[
                "clock",
                "health",
                "node_pressure",
                "observed",
                "podspec",
                "resync_queue",
                "safe_names",
                "yaml",
            ],
            &["cri_labels", "metrics", "restart_round"],
            &["supervisor"],
        ],
    },
    Layer {
        name: "clients",
        tiers: &[&["apiserver", "cri", "pod_http"]],
    },
    Layer {
        name: "config",
        tiers: &[&["config"]],
    },
    Layer {
        name: "kubelet",
        tiers: &[
            // Leaves: each talks to one client or none, and knows no other manager.
            &[
                "api_objects",
                "certificate",
                "cm",
                "devices",
                "events",
                "plugin_watcher",
                "pull_credentials",
                "userns",
            ],
            // The pod sources, and what a pod's sync needs below the runtime manager.
            &["dra", "prober", "shutdown", "source", "volume"],
            &["admission", "mirror_pods", "stats"],
            &["pod_status"],
            &["runtime"],
            &["gc", "pleg"],
            &["eviction", "node"],
            &["pod_workers"],
            &["sync_loop"],
        ],
    },
    Layer {
        name: "endpoints",
        // The connection machinery and the stats answers; the pages every server shares;
        // the servers, which know nothing of each other.
        tiers: &[
            &["listener", "stats"],
            &["routes"],
            &["node_api", "read_only"],
        ],
    },
    Layer {
        name: "app",
        tiers: &[&["heap_trim", "logging"], &["cli", "daemon"]],
    },
];

/// Where a part stands: (layer index, tier index).
fn rank(part: &str) -> Option<(usize, usize)> {
    let (layer, name) = part.split_once("::").unwrap_or((part, part));
    LAYERS.iter().enumerate().find_map(|(l, layer_def)| {
        (layer_def.name == layer).then_some(())?;
        layer_def
            .tiers
            .iter()
            .position(|tier| tier.contains(&name))
            .map(|t| (l, t))
    })
}

/// The part a module path belongs to: `kubelet::runtime::inspect` → `kubelet::runtime`,
/// `config::flags` → `config`; `None` for the crate root or a bare layer.
fn part_of(path: &[String]) -> Option<String> {
    match path {
        [first, ..] if first == "config" => Some("config".to_string()),
        [layer, name, ..] => Some(format!("{layer}::{name}")),
        _ => None,
    }
}

/// A use of another module: the full path named, and where.
struct Use {
    path: Vec<String>,
    offset: usize,
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every path that starts with `crate::` or `super::` in the file's code, resolved to a full
/// module path; a `{a, b::c}` group gives one path each.
fn uses_in(file: &SourceFile) -> Vec<Use> {
    let code = &file.code;
    let mut out = Vec::new();
    for prefix in ["crate::", "super::"] {
        for (at, _) in code.match_indices(prefix) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| is_ident(c) || c == ':') {
                continue;
            }
            let mut base: Vec<String> = Vec::new();
            let mut rest = &code[at..];
            if prefix == "super::" {
                // `super::super::x` from a file of module m climbs as many levels.
                let mut module = file.module.clone();
                while let Some(r) = rest.strip_prefix("super::") {
                    module.pop();
                    rest = r;
                }
                base = module;
            } else {
                rest = &rest["crate::".len()..];
            }
            for path in expand(rest, &base) {
                out.push(Use { path, offset: at });
            }
        }
    }
    out
}

/// The paths named at the start of `text` (after `crate::`), each prefixed by `base`:
/// `a::b::C` gives `[.., a, b, C]`; `a::{b, c::d}` gives both.
fn expand(text: &str, base: &[String]) -> Vec<Vec<String>> {
    let mut path = base.to_vec();
    let mut rest = text;
    loop {
        rest = rest.trim_start();
        if rest.starts_with('{') {
            let inner = &rest[1..shape::end_of_group(rest, '{', '}')];
            return split_top_level(inner)
                .into_iter()
                .flat_map(|item| expand(item, &path))
                .collect();
        }
        let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
        if name.is_empty() {
            return vec![path];
        }
        rest = &rest[name.len()..];
        if name != "self" {
            path.push(name);
        }
        match rest.trim_start().strip_prefix("::") {
            Some(r) => rest = r,
            None => return vec![path],
        }
    }
}

fn split_top_level(inner: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// One edge of the graph and the first line that makes it.
struct Edge {
    place: String,
    line: String,
}

type Graph = BTreeMap<String, BTreeMap<String, Edge>>;

fn graph(files: &[SourceFile]) -> Graph {
    let mut g = Graph::new();
    for file in files {
        let Some(from) = part_of(&file.module) else {
            continue;
        };
        let deps = g.entry(from.clone()).or_default();
        for u in uses_in(file) {
            let Some(to) = part_of(&u.path) else {
                continue;
            };
            if to != from {
                let n = file.line_of(u.offset);
                deps.entry(to).or_insert_with(|| Edge {
                    place: format!("src/{}:{n}", file.rel.display()),
                    line: file.line(n).to_string(),
                });
            }
        }
    }
    g
}

/// Why `from` may not use `to`, or `None` when it may.
fn wrong_way(from: &str, to: &str) -> Option<String> {
    let (Some(f), Some(t)) = (rank(from), rank(to)) else {
        return Some(format!(
            "{from} -> {to}: a part missing from the LAYERS table"
        ));
    };
    if t.0 > f.0 {
        return Some(format!("{from} -> {to}: uses a higher layer"));
    }
    if t.0 == f.0 && t.1 >= f.1 {
        let how = if t.1 == f.1 { "the same" } else { "a higher" };
        return Some(format!("{from} -> {to}: uses {how} tier of its layer"));
    }
    None
}

fn render(g: &Graph) -> String {
    let mut text = String::from("parts and the parts they use:\n");
    for (from, deps) in g {
        let list: Vec<&str> = deps.keys().map(String::as_str).collect();
        text.push_str(&format!("  {from} -> {}\n", list.join(", ")));
    }
    text
}

#[test]
fn no_part_uses_a_higher_layer_or_tier() {
    let files = production_files();
    let g = graph(&files);
    println!("{}", render(&g));
    let mut problems = Vec::new();
    for (from, deps) in &g {
        if rank(from).is_none() {
            problems.push(format!("{from}: a part missing from the LAYERS table"));
        }
        for (to, edge) in deps {
            if let Some(why) = wrong_way(from, to) {
                problems.push(format!("{why}\n    {}: {}", edge.place, edge.line));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "wrong-way uses (see LAYERS in tests/module_graph.rs):\n{}",
        problems.join("\n")
    );
}

/// A test helper shared by several modules' tests is declared with a visibility
/// (`#[cfg(test)] pub(crate) mod test_ca;`); its file is test code all the same.
#[test]
fn a_test_module_declared_with_a_visibility_is_test_code() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mod.rs");
    let code = "pub mod real;\n#[cfg(test)]\npub(crate) mod helper;\n#[cfg(test)]\npub mod other;\n#[cfg(test)]\nmod tests;\n";
    std::fs::write(&file, code).unwrap();
    let found = shape::test_module_files(&file, code);
    for name in ["helper.rs", "other.rs", "tests.rs"] {
        assert!(found.contains(&dir.path().join(name)), "{name}: {found:?}");
    }
    assert!(!found.contains(&dir.path().join("real.rs")), "{found:?}");
}

#[test]
fn the_reader_resolves_groups_and_super() {
    let text = "use crate::{base::yaml, kubelet::{runtime::X, pleg}};\nuse super::super::gc::Y;\nlet z = crate::config::Config::default();\n";
    let file = SourceFile {
        rel: "kubelet/runtime/inspect.rs".into(),
        module: vec!["kubelet".into(), "runtime".into(), "inspect".into()],
        text: text.into(),
        code: shape::blank_comments_and_literals(text),
    };
    let paths: BTreeSet<String> = uses_in(&file)
        .into_iter()
        .map(|u| u.path.join("::"))
        .collect();
    let want: BTreeSet<String> = [
        "base::yaml",
        "kubelet::runtime::X",
        "kubelet::pleg",
        "kubelet::gc::Y",
        "config::Config::default",
    ]
    .map(String::from)
    .into();
    assert_eq!(paths, want);
}

#[test]
fn the_table_refuses_upward_and_sideways_uses() {
    assert_eq!(wrong_way("kubelet::sync_loop", "kubelet::runtime"), None);
    assert_eq!(wrong_way("kubelet::runtime", "base::yaml"), None);
    assert!(wrong_way("base::yaml", "kubelet::runtime").is_some());
    assert!(wrong_way("kubelet::runtime", "kubelet::sync_loop").is_some());
    assert!(wrong_way("kubelet::gc", "kubelet::pleg").is_some());
    assert!(wrong_way("kubelet::nowhere", "base::yaml").is_some());
}
