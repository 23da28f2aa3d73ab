//! Repository checks that run under plain `cargo test` (and `cargo xtask tidy`).

use std::path::{Path, PathBuf};

mod code_map;
mod imports;

/// The patterns tidy looks for, spelled in pieces so that this file does not match them itself (nor the
/// repository's before-stop hook, which greps added lines for them).
const UNSAFE_CODE: [&str; 3] = [concat!("uns", "afe {"), concat!("uns", "afe fn"), concat!("uns", "afe impl")];
const IGNORE_ATTRIBUTE: &str = concat!("#[ig", "nore");
const STUBS: [&str; 2] = [concat!("to", "do!("), concat!("unimpl", "emented!(")];
const PATH_ATTRIBUTE: &str = concat!("#[pa", "th");
const LOCK_CALL: &str = concat!(".lo", "ck()");

/// pg-core takes its mutexes only through `locks::lock`, so that the testing build's count of locks taken (which
/// checks that the enqueue path takes none) misses none.
const COUNTED_LOCKS: (&str, &str) = ("crates/pg-core/src/", "crates/pg-core/src/locks.rs");

/// The crates allowed to contain `unsafe` code.
const UNSAFE_CRATES: [&str; 3] = ["crates/pg-cuda/", "crates/pg-nccl/", "crates/nccl-sys/"];

/// The crates whose files may not import each other in a circle (a file never `use`s, directly or through
/// others, a file that uses it back); each binary of theirs (`src/bin/NAME/`) is checked as a crate of its own.
const ACYCLIC_CRATES: [&str; 8] =
    ["nccl-sys", "pg-conformance", "pg-core", "pg-cuda", "pg-lab", "pg-mock", "pg-nccl", "pg-store"];

/// The repository root (the parent of the xtask crate).
pub fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "bundle" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// Every problem found, one line each.
pub fn problems() -> Vec<String> {
    let root = project_root();
    let mut files = Vec::new();
    for dir in ["crates", "examples", "xtask"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    let mut problems = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&root).unwrap_or(file).to_string_lossy().replace('\\', "/");
        let Ok(text) = std::fs::read_to_string(file) else {
            problems.push(format!("{relative}: not readable as UTF-8"));
            continue;
        };
        if !text.starts_with("//!") {
            problems.push(format!("{relative}: does not open with a `//!` line saying what the file is"));
        }
        let may_be_unsafe = UNSAFE_CRATES.iter().any(|c| relative.starts_with(c));
        for (number, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let at = format!("{relative}:{}", number + 1);
            if !may_be_unsafe && UNSAFE_CODE.iter().any(|pattern| code.contains(pattern)) {
                problems.push(format!("{at}: unsafe outside pg-cuda, pg-nccl and nccl-sys"));
            }
            if code.contains(IGNORE_ATTRIBUTE) {
                problems.push(format!("{at}: an ignored test; a test that cannot run says \"skipped: <why>\" instead"));
            }
            if code.contains(PATH_ATTRIBUTE) {
                problems.push(format!("{at}: a path attribute include; shared code is a module or a library item"));
            }
            let (counted, exempt) = COUNTED_LOCKS;
            if relative.starts_with(counted) && relative != exempt && code.contains(LOCK_CALL) {
                problems.push(format!("{at}: a mutex locked outside locks::lock, which the lock count would miss"));
            }
            if STUBS.iter().any(|pattern| code.contains(pattern)) {
                problems.push(format!("{at}: a stub macro; a stub is not done"));
            }
        }
        let is_root = relative.ends_with("src/lib.rs") || relative.ends_with("src/main.rs");
        if is_root && !may_be_unsafe && !text.contains("#![forbid(unsafe_code)]") {
            problems.push(format!("{relative}: crate root without #![forbid(unsafe_code)]"));
        }
    }
    problems.extend(code_map::check(&root, &files));
    for name in ACYCLIC_CRATES {
        let src = root.join("crates").join(name).join("src");
        for cycle in imports::cycles(&imports::read_crate(&src)) {
            problems.push(format!("crates/{name}: import circle {}", cycle.join(" -> ")));
        }
        for (bin, krate) in imports::read_bins(&src) {
            for cycle in imports::cycles(&krate) {
                problems.push(format!("crates/{name} (binary {bin}): import circle {}", cycle.join(" -> ")));
            }
        }
    }
    problems
}

/// `cargo xtask tidy`.
pub fn main() -> Result<(), String> {
    let problems = problems();
    match problems.is_empty() {
        true => {
            println!("tidy: ok");
            Ok(())
        }
        false => Err(format!("tidy found {} problems:\n{}", problems.len(), problems.join("\n"))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn tidy() {
        let problems = super::problems();
        assert!(problems.is_empty(), "tidy found problems:\n{}", problems.join("\n"));
    }
}
