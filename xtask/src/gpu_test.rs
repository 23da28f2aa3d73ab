//! `cargo xtask gpu-test`: builds the real-GPU suite (`pg-nccl-gpu`, release) and runs it, one process per
//! GPU; `--bundle DIR` instead puts the binary, the PyTorch bench script and `run.sh` into DIR for a machine
//! without cargo.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const HELP: &str = "\
cargo xtask gpu-test [--bundle DIR] [--nproc N] [--out DIR]

Without --bundle: finds the GPUs (nvidia-smi), builds pg-nccl-gpu (release) and runs the conformance suite
and the three experiments, one process per GPU over loopback; results in --out (default
bench/results/gpu-test). Without GPUs it says so and fails.
With --bundle DIR: builds everything (release, stripped) into DIR with run.sh, to run where cargo is not.
";

/// The workspace root (xtask's parent).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

/// Builds `pg-nccl-gpu` in release mode and returns its path.
pub fn build_suite() -> Result<PathBuf, String> {
    let root = root();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        .args(["build", "--release", "-p", "pg-nccl", "-p", "xtask", "--bin", "pg-nccl-gpu", "--bin", "xtask"])
        // The suite and the benchmark read pg-nccl's test and benchmark hooks (raw baseline, launch log, timer).
        .args(["--features", "pg-nccl/testing,xtask/testing"])
        .status()
        .map_err(|e| format!("cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build failed: {status}"));
    }
    Ok(root.join("target/release/pg-nccl-gpu"))
}

/// The GPUs nvidia-smi lists, or why there are none.
pub fn find_gpus() -> Result<Vec<String>, String> {
    let output = Command::new("nvidia-smi").arg("-L").output().map_err(|e| format!("nvidia-smi: {e}"))?;
    if !output.status.success() {
        return Err(format!("nvidia-smi -L failed: {}", String::from_utf8_lossy(&output.stderr).trim()));
    }
    let gpus: Vec<String> =
        String::from_utf8_lossy(&output.stdout).lines().filter(|l| l.starts_with("GPU ")).map(str::to_owned).collect();
    if gpus.is_empty() {
        return Err("nvidia-smi lists no GPU".into());
    }
    Ok(gpus)
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs pg's real-GPU suite from this bundle (no cargo needed): the conformance suite, the three experiments,
# and the all_reduce benchmark (raw NCCL loop, pg's process group, PyTorch) on the same libnccl.
# Usage: run.sh [OUT_DIR]   (env: TASKS=conformance,experiments  BENCH=1  BENCH_MAX_BYTES=1073741824
#                            BENCH_TRIALS=5  FIRST_TRIALS=5  NPROC=N)
# With BENCH=1 the bench also times the first all_reduce of a fresh group (pg lazy and eager, PyTorch without
# and with device_id, FIRST_TRIALS fresh launches each) and merges everything into OUT_DIR/allreduce.{md,json}.
# The conformance results are OUT_DIR/conformance.{md,json}: {"backend", "world_size", "cases": [...]}.
# stream_pairs.py (one GPU, PyTorch) measures the device cost of pg's two waits per op for each pair of streams.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-$HERE/results}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
NPROC_ARGS=()
if [ -n "${NPROC:-}" ]; then NPROC_ARGS=(--nproc "$NPROC"); fi
{ date -u; nvidia-smi; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
rc=0
"$HERE/pg-nccl-gpu" run --tasks "${TASKS:-conformance,experiments}" --out "$OUT" "${NPROC_ARGS[@]}" || rc=1
if [ "${XTASK_EXPERIMENTS:-1}" = "1" ]; then
  # The same generic experiment code as `cargo xtask experiments` on the mock, with the same JSON schema.
  NP="${NPROC:-$(nvidia-smi -L | grep -c '^GPU ')}"
  "$HERE/pg-xtask" experiments --backend nccl --world-size "$NP" --json "$OUT/experiments-nccl.json" \
    > "$OUT/experiments-nccl.txt" 2>&1 || rc=1
  cat "$OUT/experiments-nccl.txt"
fi
if [ "${BENCH:-1}" = "1" ]; then
  # One libnccl for all three contestants: PyTorch's when torch is here.
  TORCH_NCCL="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
  if [ -n "$TORCH_NCCL" ] && [ -f "$TORCH_NCCL" ]; then export PG_NCCL_LIBRARY="$TORCH_NCCL"; fi
  echo "bench libnccl: ${PG_NCCL_LIBRARY:-default loader (libnccl.so.2, libnccl.so)}"
  "$HERE/pg-nccl-gpu" run --tasks bench --out "$OUT" --bench-max-bytes "${BENCH_MAX_BYTES:-1073741824}" \
    --bench-trials "${BENCH_TRIALS:-5}" "${NPROC_ARGS[@]}" || rc=1
  "$HERE/pg-nccl-gpu" run --tasks first --out "$OUT" --bench-trials "${FIRST_TRIALS:-5}" "${NPROC_ARGS[@]}" || rc=1
  if python3 -c 'import torch' 2>/dev/null; then
    NP="${NPROC:-$(nvidia-smi -L | grep -c '^GPU ')}"
    torchrun --standalone --nproc-per-node "$NP" "$HERE/torch_allreduce.py" --out "$OUT" --max-bytes "${BENCH_MAX_BYTES:-1073741824}" \
      --trials "${BENCH_TRIALS:-5}" || rc=1
    rm -f "$OUT/torch-first.jsonl"
    for _ in $(seq "${FIRST_TRIALS:-5}"); do
      for MODE in lazy eager; do
        torchrun --standalone --nproc-per-node "$NP" "$HERE/torch_allreduce.py" --out "$OUT" --first "$MODE" || rc=1
      done
    done
  else
    echo "no torch here: the PyTorch contestant is skipped"
  fi
  PG_BENCH_LABEL="$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), libnccl ${PG_NCCL_LIBRARY:-default}" \
    "$HERE/pg-nccl-gpu" merge-bench --out "$OUT" || rc=1
fi
exit $rc
"#;

pub fn run(args: &[String]) -> Result<(), String> {
    let mut bundle = None;
    let mut nproc = None;
    let mut out = root().join("bench/results/gpu-test");
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--bundle" => bundle = Some(PathBuf::from(it.next().ok_or("--bundle needs a directory")?)),
            "--nproc" => nproc = Some(it.next().ok_or("--nproc needs a number")?.clone()),
            "--out" => out = PathBuf::from(it.next().ok_or("--out needs a directory")?),
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            other => return Err(format!("unknown option {other}\n{HELP}")),
        }
    }
    if let Some(dir) = bundle {
        let binary = build_suite()?;
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        std::fs::copy(&binary, dir.join("pg-nccl-gpu")).map_err(|e| format!("copying the binary: {e}"))?;
        std::fs::copy(root().join("target/release/xtask"), dir.join("pg-xtask"))
            .map_err(|e| format!("copying the xtask binary: {e}"))?;
        std::fs::copy(root().join("bench/torch_allreduce.py"), dir.join("torch_allreduce.py"))
            .map_err(|e| format!("copying the torch script: {e}"))?;
        std::fs::copy(root().join("bench/stream_pairs.py"), dir.join("stream_pairs.py"))
            .map_err(|e| format!("copying the stream-pair script: {e}"))?;
        let run_sh = dir.join("run.sh");
        std::fs::write(&run_sh, RUN_SH).map_err(|e| e.to_string())?;
        set_executable(&run_sh)?;
        println!(
            "bundle ready in {}: run.sh, pg-nccl-gpu, pg-xtask, torch_allreduce.py, stream_pairs.py",
            dir.display()
        );
        return Ok(());
    }
    let gpus = find_gpus().map_err(|why| format!("no GPU found, nothing to test: {why}"))?;
    println!("Found {} GPU(s):", gpus.len());
    for gpu in &gpus {
        println!("  {gpu}");
    }
    let binary = build_suite()?;
    let mut command = Command::new(binary);
    command.args(["run", "--tasks", "conformance,experiments", "--out"]).arg(&out).env("NCCL_NVLS_ENABLE", "0");
    if let Some(n) = nproc {
        command.args(["--nproc", &n]);
    }
    let status = command.status().map_err(|e| format!("pg-nccl-gpu: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("the GPU suite failed ({status}); results in {}", out.display()))
    }
}

#[cfg(unix)]
fn set_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(|e| e.to_string())
}

#[cfg(not(unix))]
fn set_executable(_path: &Path) -> Result<(), String> {
    Ok(())
}
