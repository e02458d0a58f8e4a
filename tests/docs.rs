//! The documentation as a reader meets it: the README stays a short entry
//! point, every relative link in the Markdown pages resolves (files and
//! `#anchors`), code comments cite this repository's own design notes
//! (`docs/decisions.md#` and a heading, an incident by its number) and
//! nothing else, no tracked
//! file reads like a work diary, and `compose/README.md` names every
//! service and published port of the compose file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Tracked files (git), or every file under the root but `target/` when
/// the tree is not a git checkout.
fn tracked() -> Vec<PathBuf> {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(root())
        .output();
    if let Ok(o) = out {
        if o.status.success() {
            return String::from_utf8_lossy(&o.stdout)
                .split('\0')
                .filter(|s| !s.is_empty())
                .map(|s| root().join(s))
                .filter(|p| p.exists())
                .collect();
        }
    }
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name();
            if name == "target" || name == ".git" {
                continue;
            }
            if p.is_dir() {
                walk(&p, out);
            } else {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    out
}

fn text(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root())
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// GitHub's anchor for a heading: lowercase, spaces to hyphens, only
/// letters, digits, `-` and `_` kept.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown page (headings outside code blocks).
fn anchors(page: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

/// `[text](target)` links of a Markdown page, outside code blocks.
fn links(page: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in page.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

fn markdown_pages() -> Vec<PathBuf> {
    tracked()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect()
}

#[test]
fn the_readme_is_a_short_entry_point_with_the_two_commands() {
    let readme = text(&root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines (at most 300)");
    assert!(readme.contains("cargo run --release -- demo"));
    assert!(readme.contains("bash .ci/run"));
    for page in [
        "operating",
        "integration",
        "configuration",
        "decisions",
        "scenarios",
        "performance",
        "architecture",
    ] {
        assert!(
            readme.contains(&format!("(docs/{page}.md)")),
            "README links docs/{page}.md"
        );
    }
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for page in markdown_pages() {
        let body = text(&page).unwrap();
        for link in links(&body) {
            if link.starts_with("http://") || link.starts_with("https://") {
                continue;
            }
            let (file, anchor) = match link.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (link.as_str(), None),
            };
            let target = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !target.exists() {
                broken.push(format!("{}: {link} (no such file)", rel(&page)));
                continue;
            }
            if let Some(a) = anchor {
                let t = text(&target).unwrap_or_default();
                if !anchors(&t).contains(a) {
                    broken.push(format!("{}: {link} (no such heading)", rel(&page)));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn code_cites_the_design_notes_of_this_repository() {
    let decisions = text(&root().join("docs/decisions.md")).unwrap();
    let have = anchors(&decisions);
    let mut bad = Vec::new();
    let spec = ["SPEC", " §"].concat();
    for f in tracked() {
        let r = rel(&f);
        if r.starts_with("tests/goldens/") || r.starts_with("schemas/released/") {
            continue;
        }
        let Some(body) = text(&f) else { continue };
        for (n, line) in body.lines().enumerate() {
            if line.contains(spec.as_str()) {
                bad.push(format!(
                    "{r}:{}: cites {spec}, not in this repository",
                    n + 1
                ));
            }
            let mut rest = line;
            while let Some(i) = rest.find("decisions.md#") {
                let a: String = rest[i + "decisions.md#".len()..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '_')
                    .collect();
                if !a.is_empty() && !have.contains(&a) {
                    bad.push(format!("{r}:{}: decisions.md#{a} is no heading", n + 1));
                }
                rest = &rest[i + 1..];
            }
            let lower = line.to_lowercase();
            let mut rest = lower.as_str();
            let cited = ["incident ", "00"].concat();
            while let Some(i) = rest.find(cited.as_str()) {
                let id: String = rest[i + "incident ".len()..].chars().take(3).collect();
                if !have.contains(&format!("incident-{id}")) {
                    bad.push(format!(
                        "{r}:{}: incident {id} is not in docs/decisions.md",
                        n + 1
                    ));
                }
                rest = &rest[i + 1..];
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A tracked file describes the product; how it was made lives in git.
#[test]
fn no_tracked_file_reads_like_a_work_diary() {
    // Assembled so that this file does not match itself.
    let words = [["sess", "ion"].concat(), ["Sess", "ion"].concat()];
    let mut hits = Vec::new();
    for f in tracked() {
        let r = rel(&f);
        if r.starts_with("tests/goldens/") {
            continue;
        }
        let Some(body) = text(&f) else { continue };
        for (n, line) in body.lines().enumerate() {
            for w in &words {
                let mut rest = line;
                while let Some(i) = rest.find(w.as_str()) {
                    let after = rest[i + w.len()..].trim_start_matches('s');
                    let numbered = after
                        .strip_prefix(' ')
                        .and_then(|a| a.chars().next())
                        .is_some_and(|c| c.is_ascii_digit());
                    let worked = rest[..i].ends_with("work ") || rest[..i].ends_with("coding ");
                    if numbered || worked {
                        hits.push(format!("{r}:{}: {}", n + 1, line.trim()));
                    }
                    rest = &rest[i + w.len()..];
                }
            }
        }
    }
    assert!(
        hits.is_empty(),
        "work-diary references:\n{}",
        hits.join("\n")
    );
}

/// Tests and benchmarks cite the design (docs/, incidents), never the
/// tracker's issue numbers: an issue closes, the test stays.
#[test]
fn tests_and_benchmarks_cite_no_issue_numbers() {
    let mut hits = Vec::new();
    for f in tracked() {
        let r = rel(&f);
        let code = r.starts_with("tests/") || r.starts_with("benches/");
        if !code || r.starts_with("tests/goldens/") {
            continue;
        }
        let Some(body) = text(&f) else { continue };
        for (n, line) in body.lines().enumerate() {
            let lower = line.to_lowercase();
            // The word followed by a number (with or without a hash), or a
            // hash, digits, then a possessive or "item".
            let cited = lower.match_indices("issue").any(|(i, w)| {
                let after = lower[i + w.len()..].trim_start_matches(['s', ' ', '#']);
                after.chars().next().is_some_and(|c| c.is_ascii_digit())
            }) || lower.match_indices('#').any(|(i, _)| {
                let after = &lower[i + 1..];
                let digits = after.chars().take_while(|c| c.is_ascii_digit()).count();
                digits > 0
                    && (after[digits..].starts_with("'s") || after[digits..].starts_with(" item"))
            });
            if cited {
                hits.push(format!("{r}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "issue numbers in tests:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_compose_readme_names_every_service_and_port() {
    let compose = text(&root().join("compose/docker-compose.yml")).unwrap();
    let readme = text(&root().join("compose/README.md")).unwrap();
    let services = compose
        .split("\nservices:\n")
        .nth(1)
        .unwrap()
        .split("\nvolumes:\n")
        .next()
        .unwrap();
    let mut names = Vec::new();
    for line in services.lines() {
        if let Some(name) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(':')) {
            if !name.starts_with(' ') && !name.starts_with('#') {
                names.push(name.to_string());
            }
        }
        let t = line.trim().trim_start_matches("- ").trim_matches('"');
        if let Some(port) = t
            .strip_prefix("127.0.0.1:")
            .and_then(|p| p.split(':').next())
        {
            assert!(
                readme.contains(&format!("127.0.0.1:{port}")),
                "compose/README.md does not name the published port {port}"
            );
        }
    }
    assert!(names.len() >= 8, "services found: {names:?}");
    for n in &names {
        assert!(
            readme.contains(&format!("`{n}`")),
            "compose/README.md does not name the service `{n}`"
        );
    }
}
