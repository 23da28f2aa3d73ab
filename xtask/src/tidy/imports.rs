//! Import circles between the files of a crate: which file names which through `crate::` (and `super::`) paths,
//! and the circles in that graph.
//!
//! A file is a node named by its module path (`stream`, `tcp::server`); the crate root (`lib.rs`, `main.rs`) is
//! not one: it declares the modules, and a backend crate's root holds the backend type whose `Backend` impl
//! names every concept type that names it back. A path that ends at a name the root re-exports
//! (`crate::MockStream`, `crate::{Event, Stream}`) counts as naming the file that defines it. Comment lines are
//! skipped, so doc links do not count.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::Path;

/// A crate's files: module path -> source text, and the root's text.
#[derive(Debug, Default)]
pub struct Crate {
    pub files: BTreeMap<String, String>,
    pub root: String,
}

/// Reads the crate whose sources are under `src` (binaries under `src/bin` are crates of their own: skipped).
pub fn read_crate(src: &Path) -> Crate {
    let mut krate = Crate::default();
    read_dir(src, src, &mut krate);
    krate
}

/// The binaries under `src/bin` that are folders (`src/bin/NAME/main.rs` and its modules), each as a crate: (NAME,
/// crate).
pub fn read_bins(src: &Path) -> Vec<(String, Crate)> {
    let Ok(entries) = std::fs::read_dir(src.join("bin")) else { return Vec::new() };
    let mut bins: Vec<(String, Crate)> = entries
        .flatten()
        .filter(|entry| entry.path().join("main.rs").is_file())
        .map(|entry| (entry.file_name().to_string_lossy().into_owned(), read_crate(&entry.path())))
        .collect();
    bins.sort_by(|a, b| a.0.cmp(&b.0));
    bins
}

fn read_dir(src: &Path, dir: &Path, krate: &mut Crate) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(relative) = path.strip_prefix(src) else { continue };
        let relative = relative.to_string_lossy().replace('\\', "/");
        if path.is_dir() {
            if relative != "bin" {
                read_dir(src, &path, krate);
            }
            continue;
        }
        let Some(module) = relative.strip_suffix(".rs") else { continue };
        let Ok(text) = std::fs::read_to_string(&path) else { continue };
        match module {
            "lib" | "main" => krate.root = text,
            _ => {
                let module = module.strip_suffix("/mod").unwrap_or(module);
                krate.files.insert(module.replace('/', "::"), text);
            }
        }
    }
}

/// The text without comment lines.
fn code(text: &str) -> String {
    text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n")
}

/// Parses a use tree (`a::b`, `a::{b, c::d}`, `{A, b::C as D}`, `a::*`) at the start of `s` into full paths.
fn use_tree(s: &str) -> Vec<Vec<String>> {
    let mut pos = 0;
    let mut out = Vec::new();
    parse_tree(s.as_bytes(), &mut pos, Vec::new(), &mut out);
    out
}

fn parse_tree(s: &[u8], pos: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    loop {
        skip_space(s, pos);
        if s.get(*pos) == Some(&b'{') {
            *pos += 1;
            loop {
                skip_space(s, pos);
                match s.get(*pos) {
                    Some(b'}') => {
                        *pos += 1;
                        return;
                    }
                    Some(b',') => *pos += 1,
                    None => return,
                    Some(_) => {
                        let before = *pos;
                        parse_tree(s, pos, prefix.clone(), out);
                        // Step over a rename (`as F`) or anything that is not a path, up to the next item.
                        while s.get(*pos).is_some_and(|c| *c != b',' && *c != b'}') || *pos == before {
                            *pos += 1;
                        }
                    }
                }
            }
        }
        let start = *pos;
        while s.get(*pos).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_') {
            *pos += 1;
        }
        if *pos == start {
            if !prefix.is_empty() {
                out.push(prefix);
            }
            return;
        }
        prefix.push(String::from_utf8_lossy(&s[start..*pos]).into_owned());
        if s[*pos..].starts_with(b"::") {
            *pos += 2;
            continue;
        }
        out.push(prefix);
        return;
    }
}

fn skip_space(s: &[u8], pos: &mut usize) {
    while s.get(*pos).is_some_and(u8::is_ascii_whitespace) {
        *pos += 1;
    }
}

/// The paths that follow `keyword` (`crate::` or `super::`) in `code`, where it starts a path.
fn paths_after(code: &str, keyword: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices(keyword) {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        out.extend(use_tree(&code[at + keyword.len()..]));
    }
    out
}

/// The module each name the root re-exports (`pub use a::B;`, `pub use a::{B, C as D};`) comes from.
fn root_exports(krate: &Crate) -> HashMap<String, String> {
    let mut exports = HashMap::new();
    let root = code(&krate.root);
    for (at, _) in root.match_indices("pub use ") {
        for path in use_tree(&root[at + "pub use ".len()..]) {
            let rest = &root[at..];
            // `pub use a::B as C;`: the exported name is C (only for a single path, the common case).
            let renamed = rest.split(';').next().and_then(|u| u.split(" as ").nth(1)).map(|n| n.trim().to_owned());
            if let (Some(module), Some(last)) = (module_of(krate, &path), path.last()) {
                let name = if rest.split(';').next().is_some_and(|u| !u.contains('{')) {
                    renamed.unwrap_or_else(|| last.clone())
                } else {
                    last.clone()
                };
                exports.insert(name, module);
            }
        }
    }
    exports
}

/// The longest prefix of `path` that is a file of the crate.
fn module_of(krate: &Crate, path: &[String]) -> Option<String> {
    (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| krate.files.contains_key(m))
}

/// Which files each file names.
pub fn graph(krate: &Crate) -> BTreeMap<String, BTreeSet<String>> {
    let exports = root_exports(krate);
    let mut graph = BTreeMap::new();
    for (module, text) in &krate.files {
        let code = code(text);
        let mut targets = BTreeSet::new();
        let parent: Vec<String> = module.split("::").map(str::to_owned).collect();
        let parent = &parent[..parent.len() - 1];
        let from_super = paths_after(&code, "super::").into_iter().map(|p| [parent, &p].concat());
        for path in paths_after(&code, "crate::").into_iter().chain(from_super) {
            let target = module_of(krate, &path).or_else(|| path.first().and_then(|n| exports.get(n).cloned()));
            if let Some(target) = target.filter(|t| t != module) {
                targets.insert(target);
            }
        }
        graph.insert(module.clone(), targets);
    }
    graph
}

/// One circle per group of files that reach each other, each as `a -> b -> ... -> a` (shortest from its
/// first file).
pub fn cycles(krate: &Crate) -> Vec<Vec<String>> {
    let graph = graph(krate);
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&str> = vec![from];
        while let Some(node) = todo.pop() {
            for next in graph.get(node).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next);
                }
            }
        }
        seen
    };
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for node in graph.keys() {
        if done.contains(node) || !reach(node).contains(node) {
            continue;
        }
        // Its group: the files it reaches that reach it back.
        let group: BTreeSet<String> =
            reach(node).into_iter().filter(|other| other == node || reach(other).contains(node)).collect();
        done.extend(group.iter().cloned());
        out.push(shortest_cycle(&graph, node));
    }
    out
}

fn shortest_cycle(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Vec<String> {
    let mut previous: HashMap<&str, &str> = HashMap::new();
    let mut queue: VecDeque<&str> = VecDeque::from([start]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(node).into_iter().flatten() {
            if next == start {
                let mut path = vec![start.to_owned()];
                let mut at = node;
                while at != start {
                    path.push(at.to_owned());
                    at = previous[at];
                }
                path.push(start.to_owned());
                path.reverse();
                return path;
            }
            if !previous.contains_key(next.as_str()) {
                previous.insert(next, node);
                queue.push_back(next);
            }
        }
    }
    vec![start.to_owned()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn krate(root: &str, files: &[(&str, &str)]) -> Crate {
        Crate { root: root.to_owned(), files: files.iter().map(|(m, t)| ((*m).to_owned(), (*t).to_owned())).collect() }
    }

    #[test]
    fn use_trees_expand_to_full_paths() {
        let paths = use_tree("a::{b, c::{D, e as F}}, x;");
        let want: Vec<Vec<&str>> = vec![vec!["a", "b"], vec!["a", "c", "D"], vec!["a", "c", "e"]];
        assert_eq!(paths, want);
        assert_eq!(use_tree("{Event, stream::Stream};"), vec![vec!["Event"], vec!["stream", "Stream"]]);
    }

    #[test]
    fn a_circle_through_a_module_path_is_named() {
        let k = krate("", &[("a", "use crate::b::B;"), ("b", "fn f() -> crate::a::A { g() }"), ("c", "")]);
        assert_eq!(cycles(&k), vec![vec!["a", "b", "a"]]);
    }

    #[test]
    fn a_circle_through_root_reexports_is_named() {
        let root = "mod event;\nmod stream;\npub use event::Event;\npub use stream::{Stream, Pool as StreamPool};";
        let k = krate(root, &[("event", "use crate::{Backend, Stream};"), ("stream", "use crate::Event;")]);
        assert_eq!(cycles(&k), vec![vec!["event", "stream", "event"]]);
    }

    #[test]
    fn longer_circles_and_super_paths_are_found() {
        let k = krate(
            "",
            &[("tcp::a", "use super::b::X;"), ("tcp::b", "use crate::tcp::c::Y;"), ("tcp::c", "use crate::tcp::a;")],
        );
        assert_eq!(cycles(&k), vec![vec!["tcp::a", "tcp::b", "tcp::c", "tcp::a"]]);
    }

    #[test]
    fn each_binary_folder_is_read_as_a_crate_of_its_own() {
        let src = std::env::temp_dir().join(format!("tidy-bins-{}", std::process::id())).join("src");
        let bin = src.join("bin/tool");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(src.join("lib.rs"), "pub mod a;").unwrap();
        std::fs::write(src.join("a.rs"), "").unwrap();
        std::fs::write(bin.join("main.rs"), "mod x;\nmod y;").unwrap();
        std::fs::write(bin.join("x.rs"), "use crate::y::Y;").unwrap();
        std::fs::write(bin.join("y.rs"), "use crate::x::X;").unwrap();
        assert_eq!(read_crate(&src).files.keys().collect::<Vec<_>>(), vec!["a"], "the library leaves the binary out");
        let bins = read_bins(&src);
        assert_eq!(bins.len(), 1);
        assert_eq!(bins[0].0, "tool");
        assert_eq!(cycles(&bins[0].1), vec![vec!["x", "y", "x"]]);
        let _ = std::fs::remove_dir_all(src.parent().unwrap());
    }

    #[test]
    fn layers_comments_and_root_items_are_no_circle() {
        let k = krate(
            "pub struct Mock;\npub use b::B;",
            &[
                ("a", "use crate::b::B;\nuse crate::Mock;\n/// See [`crate::a::A`].\nfn f() {}"),
                ("b", "//! Uses nothing; [`crate::a`] is a comment.\nimpl B { type X = crate::Mock; }"),
            ],
        );
        assert!(cycles(&k).is_empty(), "{:?}", cycles(&k));
        assert_eq!(graph(&k)["a"], BTreeSet::from(["b".to_owned()]));
    }
}
