//! `cargo xtask interop`: sets up a virtual environment with PyTorch from PyPI and runs pg-store's interop
//! tests against it.

use std::path::{Path, PathBuf};
use std::process::Command;

const HELP: &str = "\
cargo xtask interop [--venv DIR] [--python PATH]

Creates a virtual environment (default target/interop-venv) with `python3 -m venv`, installs torch from
PyPI into it when `import torch` fails there (several GB: the Linux wheels pull nvidia-* packages), then
runs `cargo test -p pg-store --test interop` with PG_INTEROP_PYTHON pointing at it and PG_INTEROP_REQUIRE=1,
so a missing torch fails instead of skipping.

  --venv DIR       where the virtual environment lives
  --python PATH    use this interpreter as it is (no venv, no install)
";

/// The workspace root (xtask sits one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives inside the workspace").to_path_buf()
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    eprintln!("$ {shown}");
    let status = command.status().map_err(|e| format!("cannot run {shown}: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("{shown} failed with {status}")),
    }
}

fn imports_torch(python: &Path) -> bool {
    Command::new(python)
        .args(["-W", "ignore", "-c", "import torch.distributed"])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Returns a Python interpreter that can import torch, creating and filling the venv when needed.
pub fn ensure_python(venv: Option<&str>, python: Option<&str>) -> Result<PathBuf, String> {
    if let Some(python) = python {
        let python = PathBuf::from(python);
        return match imports_torch(&python) {
            true => Ok(python),
            false => Err(format!("{} cannot import torch.distributed", python.display())),
        };
    }
    let venv = venv.map_or_else(|| workspace_root().join("target/interop-venv"), PathBuf::from);
    let python = venv.join("bin/python");
    if !python.exists() {
        run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
    }
    if !imports_torch(&python) {
        eprintln!("installing torch from PyPI into {} (large download)", venv.display());
        run(Command::new(&python).args(["-m", "pip", "install", "--upgrade", "pip"]))?;
        run(Command::new(&python).args(["-m", "pip", "install", "torch"]))?;
        if !imports_torch(&python) {
            return Err(format!("torch was installed but {} still cannot import it", python.display()));
        }
    }
    Ok(python)
}

/// Runs the task with the arguments after `interop`.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut venv = None;
    let mut python = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            "--venv" => venv = Some(iter.next().ok_or("--venv needs a value")?.clone()),
            "--python" => python = Some(iter.next().ok_or("--python needs a value")?.clone()),
            other => return Err(format!("unknown argument {other}\n\n{HELP}")),
        }
    }
    let python = ensure_python(venv.as_deref(), python.as_deref())?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo)
        .current_dir(workspace_root())
        .args(["test", "-p", "pg-store", "--features", "cli", "--test", "interop", "--", "--nocapture"])
        .env("PG_INTEROP_PYTHON", &python)
        .env("PG_INTEROP_REQUIRE", "1"))
}
