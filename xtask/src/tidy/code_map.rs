//! Keeps ARCHITECTURE.md's code map true: every module file of the crates and xtask is named there (by its file
//! name, or a path ending in it, between backticks), and every `.rs` file named there exists in the tree.

use std::collections::BTreeSet;
use std::path::Path;

/// Files that need no entry of their own: crate roots and module roots are the crate or folder the map names.
const ROOTS: [&str; 3] = ["lib.rs", "main.rs", "mod.rs"];

/// The `.rs` names between backticks in `text` (`a.rs`, `dir/b.rs`).
fn named(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| span.ends_with(".rs") && !span.contains(' '))
        .map(str::to_owned)
        .collect()
}

/// Whether `file` (relative to the root) is what `name` names: the same file name, or a path the file ends with.
fn names(name: &str, file: &str) -> bool {
    file == name || file.ends_with(&format!("/{name}"))
}

/// The problems of the map in `text` against `files` (paths relative to the root).
pub fn problems(text: &str, files: &[String]) -> Vec<String> {
    let named = named(text);
    let mut problems = Vec::new();
    for file in files {
        let base = file.rsplit('/').next().unwrap_or(file);
        let is_module = file.contains("/src/") && !ROOTS.contains(&base);
        if is_module && !named.iter().any(|name| names(name, file)) {
            problems.push(format!("{file}: a module ARCHITECTURE.md's code map does not name"));
        }
    }
    for name in &named {
        if !files.iter().any(|file| names(name, file)) {
            problems.push(format!("ARCHITECTURE.md names `{name}`, which is no file of the tree"));
        }
    }
    problems
}

/// The problems of the repository's map (`root/ARCHITECTURE.md` against `files`, absolute paths under `root`).
pub fn check(root: &Path, files: &[std::path::PathBuf]) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(root.join("ARCHITECTURE.md")) else {
        return vec!["ARCHITECTURE.md: not readable".to_owned()];
    };
    let relative: Vec<String> =
        files.iter().map(|file| file.strip_prefix(root).unwrap_or(file).to_string_lossy().replace('\\', "/")).collect();
    problems(&text, &relative)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unnamed_module_and_a_named_file_that_is_gone_are_both_reported() {
        let files = vec![
            "crates/a/src/lib.rs".to_owned(),
            "crates/a/src/one.rs".to_owned(),
            "crates/a/src/x/two.rs".to_owned(),
        ];
        let map = "`one.rs` and `x/two.rs`; `gone.rs` was here";
        assert_eq!(problems(map, &files), vec!["ARCHITECTURE.md names `gone.rs`, which is no file of the tree"]);
        let problems = problems("`one.rs`", &files);
        assert_eq!(problems, vec!["crates/a/src/x/two.rs: a module ARCHITECTURE.md's code map does not name"]);
    }
}
