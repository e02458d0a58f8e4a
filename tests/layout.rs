//! The layout rules, checked from the tree itself so they cannot drift:
//! every module is declared core (pure, event time) or shell; core modules
//! import no tokio, Kafka or Redis and read no wall clock; modules do not
//! import each other in a cycle; docs/architecture.md's layout names every file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The functional core: synchronous, deterministic, on event time.
const CORE: &[&str] = &[
    "alert",
    "board",
    "clock",
    "codec",
    "composition",
    "config",
    "dedup",
    "digest",
    "engine",
    "event",
    "health",
    "id_table",
    "prefetch",
    "present",
    "publish",
    "redis_keys",
    "replay",
    "routing",
    "safety",
    "schedule",
    "score",
    "signals",
    "short_str",
    "sim",
    "state",
    "window",
];

/// The imperative shell: I/O, threads, wall time.
const SHELL: &[&str] = &[
    "allocator",
    "backoff",
    "bench",
    "channel_report",
    "client",
    "demo",
    "service",
    "wall_clock",
];

/// Shell files inside a core module's directory.
const SHELL_FILES: &[&str] = &["src/publish/redis.rs"];

const FORBIDDEN_IN_CORE: &[&str] = &[
    "tokio::",
    "use tokio",
    "rdkafka",
    "redis::",
    "use redis",
    "SystemTime",
    "Instant::now",
    "wall_clock",
    "thread::sleep",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn modules() -> Vec<String> {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| {
            let l = l.trim();
            l.strip_prefix("pub mod ")
                .or_else(|| l.strip_prefix("pub(crate) mod "))
        })
        .map(|m| m.trim_end_matches(';').to_string())
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The files of a top-level module, relative to the crate root.
fn files_of(module: &str) -> Vec<String> {
    let mut out = Vec::new();
    let file = root().join(format!("src/{module}.rs"));
    if file.exists() {
        out.push(file);
    }
    let dir = root().join(format!("src/{module}"));
    if dir.is_dir() {
        rust_files(&dir, &mut out);
    }
    let mut rel: Vec<String> = out
        .iter()
        .map(|p| {
            p.strip_prefix(root())
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    rel.sort();
    rel
}

/// The file's code before its unit tests, without comment lines.
fn code(path: &str) -> String {
    // A module's tests, in their own file or inline at its end, are not
    // its code (a `mod tests;` declaration is, and what follows it).
    if path.ends_with("/tests.rs") {
        return String::new();
    }
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let inline_tests = text.match_indices("#[cfg(test)]\n").find(|(i, m)| {
        let next = text[i + m.len()..].lines().next().unwrap_or("");
        next.ends_with("mod tests {")
    });
    let body = &text[..inline_tests.map_or(text.len(), |(i, _)| i)];
    body.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_module_is_declared_core_or_shell() {
    for m in modules() {
        assert!(
            CORE.contains(&m.as_str()) ^ SHELL.contains(&m.as_str()),
            "src/lib.rs declares `{m}`: list it in CORE or SHELL in tests/layout.rs"
        );
    }
    for m in CORE.iter().chain(SHELL) {
        assert!(
            modules().iter().any(|x| x == m),
            "`{m}` is not in src/lib.rs"
        );
    }
}

#[test]
fn the_core_imports_no_io_and_reads_no_wall_clock() {
    let mut found = Vec::new();
    for m in CORE {
        for f in files_of(m) {
            if SHELL_FILES.contains(&f.as_str()) {
                continue;
            }
            let code = code(&f);
            for (n, line) in code.lines().enumerate() {
                for bad in FORBIDDEN_IN_CORE {
                    if line.contains(bad) {
                        found.push(format!("{f}:{}: `{bad}`: {}", n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "the core must stay pure:\n{}",
        found.join("\n")
    );
}

/// Top-level module → the top-level modules its code names.
/// `core_files_only` leaves out the shell files of core modules.
fn imports(core_files_only: bool) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    let mut graph = BTreeMap::new();
    for m in &mods {
        let mut uses = BTreeSet::new();
        for f in files_of(m) {
            if core_files_only && SHELL_FILES.contains(&f.as_str()) {
                continue;
            }
            let code = code(&f);
            for (i, _) in code.match_indices("crate::") {
                let rest = &code[i + "crate::".len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if mods.contains(&name) && &name != m {
                    uses.insert(name);
                }
            }
            // `use crate::{a, b::c}` groups.
            for (i, _) in code.match_indices("crate::{") {
                let rest = &code[i + "crate::{".len()..];
                let group = rest.split('}').next().unwrap_or("");
                for part in group.split(',') {
                    let name = part.trim().split("::").next().unwrap_or("").to_string();
                    if mods.contains(&name) && &name != m {
                        uses.insert(name);
                    }
                }
            }
        }
        graph.insert(m.clone(), uses);
    }
    graph
}

#[test]
fn modules_do_not_import_each_other_in_a_cycle() {
    let graph = imports(false);
    // Depth-first search; a back edge is a cycle.
    fn visit(
        m: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        cycles: &mut Vec<String>,
    ) {
        if let Some(i) = path.iter().position(|p| p == m) {
            let mut c = path[i..].to_vec();
            c.push(m.to_string());
            cycles.push(c.join(" -> "));
            return;
        }
        if done.contains(m) {
            return;
        }
        path.push(m.to_string());
        for next in graph.get(m).into_iter().flatten() {
            visit(next, graph, path, done, cycles);
        }
        path.pop();
        done.insert(m.to_string());
    }
    let mut cycles = Vec::new();
    let mut done = BTreeSet::new();
    for m in graph.keys() {
        visit(m, &graph, &mut Vec::new(), &mut done, &mut cycles);
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_core_never_imports_the_shell() {
    let graph = imports(true);
    for m in CORE {
        for used in &graph[*m] {
            assert!(
                !SHELL.contains(&used.as_str()),
                "core module `{m}` imports shell module `{used}`"
            );
        }
    }
}

#[test]
fn the_architecture_layout_names_every_file_and_only_files_that_exist() {
    let page = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let block = page
        .split("## Layout")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("a ``` block under ## Layout");
    let named: Vec<&str> = block
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.contains('/') || w.ends_with(".md") || w.ends_with(".toml"))
        .collect();
    for n in &named {
        assert!(
            root().join(n).exists(),
            "docs/architecture.md's layout names `{n}`, which does not exist"
        );
    }
    let mut files = Vec::new();
    for dir in ["src", "benches", "examples", "tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    for e in std::fs::read_dir(root().join("docs")).unwrap().flatten() {
        files.push(e.path());
    }
    for f in files {
        let rel = f
            .strip_prefix(root())
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let covered = named.iter().any(|n| {
            rel == *n || (n.ends_with('/') && rel.starts_with(n) && !rel[n.len()..].contains('/'))
        });
        assert!(
            covered,
            "docs/architecture.md's layout does not name `{rel}`"
        );
    }
}
