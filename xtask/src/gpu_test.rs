//! `cargo xtask gpu-test`: builds the real-GPU suite (`pg-nccl-gpu`, release) and runs it, one process per
//! GPU; `--bundle DIR` instead puts the binaries, the PyTorch bench scripts and `run.sh` into DIR for a machine
//! without cargo.

use std::path::{Path, PathBuf};
use std::process::Command;

pub const HELP: &str = "\
cargo xtask gpu-test [--bundle DIR] [--nproc N] [--out DIR]

Without --bundle: finds the GPUs (nvidia-smi), builds pg-nccl-gpu (release) and runs the conformance suite,
the three experiments and the interop task, one process per GPU over loopback; results in --out (default
bench/results/gpu-test). Without GPUs it says so and fails.
With --bundle DIR: builds everything (release, stripped) into DIR with run.sh, to run where cargo is not: the
suite, the interop task, the benchmarks and the training example (ddp_mlp) with the PyTorch scripts.
run.sh [OUT_DIR] reads TASKS (default conformance,experiments,interop; none for none), BENCH (1 = every benchmark, the default;
0 = none; or a list of all-reduce, all-to-all, p2p), BENCH_MAX_BYTES, BENCH_TRIALS, NPROC, TRAIN (1 = run the
training example, the default), TRAIN_NPROC, TRAIN_STEPS and CUBLAS_DIR; the benchmarks write
OUT_DIR/allreduce.{md,json}, OUT_DIR/all-to-all.{md,json} and OUT_DIR/p2p.{md,json}.
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
        .args(["--example", "ddp_mlp"])
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

const RUN_SH: &str = r###"#!/usr/bin/env bash
# Runs pg's real-GPU suite from this bundle (no cargo needed): the conformance suite, the three experiments,
# the interop task, the benchmarks (raw NCCL loop, pg's process group, PyTorch) on the same libnccl, and the
# training example beside PyTorch DDP.
# Usage: run.sh [OUT_DIR]   (env: TASKS=conformance,experiments,interop  BENCH=1  BENCH_MAX_BYTES=1073741824
#                            BENCH_TRIALS=5  FIRST_TRIALS=5  NPROC=N  TRAIN=1  TRAIN_NPROC=1  TRAIN_STEPS=100
#                            CUBLAS_DIR=directory of libcublas.so.13 or .12 (else looked for under PyTorch and CUDA))
# BENCH: 1 = every benchmark, 0 = none, or a list of all-reduce, all-to-all, p2p (BENCH=all-to-all,p2p).
# The conformance results are OUT_DIR/conformance.{md,json}: {"backend", "world_size", "cases": [...]};
# the interop task's OUT_DIR/interop-nccl-N.{md,json}; the training runs' OUT_DIR/train-mlp-GPUxN.{md,json};
# the benchmarks' OUT_DIR/allreduce.{md,json}, OUT_DIR/all-to-all.{md,json} and OUT_DIR/p2p.{md,json}.
# With all-reduce among BENCH the bench also times the first all_reduce of a fresh group (pg lazy and eager,
# PyTorch without and with device_id, FIRST_TRIALS fresh launches each) and merges it into OUT_DIR/allreduce.{md,json}.
# stream_pairs.py (one GPU, PyTorch) measures the device cost of pg's two waits per op for each pair of streams.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
OUT="${1:-$HERE/results}"
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
NPROC_ARGS=()
if [ -n "${NPROC:-}" ]; then NPROC_ARGS=(--nproc "$NPROC"); fi
{ date -u; nvidia-smi; nvidia-smi topo -m; } > "$OUT/machine.txt" 2>&1
GPUS="$(nvidia-smi -L | grep -c '^GPU ')"
NP="${NPROC:-$GPUS}"
GPU_TAG="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')"
# "N ranks on G GPUs": ranks beyond the GPUs share them, each its own NCCL host over loopback sockets.
LAYOUT="$NP rank(s) on $(( NP < GPUS ? NP : GPUS )) GPU(s)"
if [ "$NP" -gt "$GPUS" ]; then LAYOUT="$LAYOUT, network transport (NCCL_HOSTID per rank, loopback sockets)"; fi
export PG_RUN_LABEL="$(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), $LAYOUT, commit $(cat "$HERE/COMMIT" 2>/dev/null || echo unknown), libnccl ${PG_NCCL_LIBRARY:-default}"
rc=0
TASK_LIST="${TASKS:-conformance,experiments,interop}"
if [ "$TASK_LIST" != none ]; then
  "$HERE/pg-nccl-gpu" run --tasks "$TASK_LIST" --out "$OUT" "${NPROC_ARGS[@]}" || rc=1
fi
if [ -f "$OUT/interop.json" ]; then
  cp "$OUT/interop.json" "$OUT/interop-nccl-$NP.json"; cp "$OUT/interop.md" "$OUT/interop-nccl-$NP.md"
fi
if [ "${XTASK_EXPERIMENTS:-1}" = "1" ]; then
  # The same generic experiment code as `cargo xtask experiments` on the mock, with the same JSON schema.
  "$HERE/pg-xtask" experiments --backend nccl --world-size "$NP" --json "$OUT/experiments-nccl.json" \
    > "$OUT/experiments-nccl.txt" 2>&1 || rc=1
  cat "$OUT/experiments-nccl.txt"
  # PyTorch's ProcessGroupNCCL in the same three experiments, in the same run: blocking wait is process-wide
  # there, so its config runs in a second launch.
  if python3 -c 'import torch' 2>/dev/null; then
    rm -f "$OUT/torch-experiments.jsonl"
    torchrun --standalone --nproc-per-node "$NP" "$HERE/torch_experiments.py" --out "$OUT" > "$OUT/torch-experiments.txt" 2>&1 || rc=1
    TORCH_NCCL_BLOCKING_WAIT=1 torchrun --standalone --nproc-per-node "$NP" "$HERE/torch_experiments.py" --out "$OUT" \
      --blocking >> "$OUT/torch-experiments.txt" 2>&1 || rc=1
    python3 "$HERE/torch_experiments.py" --out "$OUT" --report > /dev/null || rc=1
  fi
  { echo "# The three experiments (communicator cache, completion after each wait, kernel streams) on NCCL, world $NP"; echo; echo "$PG_RUN_LABEL; command: \`pg-xtask experiments --backend nccl --world-size $NP\` and torch_experiments.py (torchrun, same run)"; echo
    echo "## pg"; echo; echo '```text'; cat "$OUT/experiments-nccl.txt"; echo '```'; echo
    if [ -f "$OUT/experiments-torch.md" ]; then echo "## PyTorch"; echo; cat "$OUT/experiments-torch.md"; fi
  } > "$OUT/experiments-nccl-$NP.md"
  python3 -c 'import json, sys; pg = json.load(open(sys.argv[1])); t = sys.argv[2]
try: torch = json.load(open(t))
except OSError: torch = None
json.dump({"machine": sys.argv[3], "world_size": int(sys.argv[4]), "pg": pg, "torch": torch}, open(sys.argv[5], "w"), indent=1)' \
    "$OUT/experiments-nccl.json" "$OUT/experiments-torch.json" "$PG_RUN_LABEL" "$NP" "$OUT/experiments-nccl-$NP.json" || rc=1
fi
case "${BENCH:-1}" in
  1) BENCHES=all-reduce,all-to-all,p2p ;;
  0 | "") BENCHES= ;;
  *) BENCHES="$BENCH" ;;
esac
for b in ${BENCHES//,/ }; do
  case "$b" in all-reduce | all-to-all | p2p) ;; *) echo "BENCH: unknown benchmark '$b' (all-reduce, all-to-all, p2p)"; rc=1 ;; esac
done
wants() { case ",$BENCHES," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
if [ -n "$BENCHES" ]; then
  # One libnccl for all three contestants: PyTorch's when torch is here.
  TORCH_NCCL="$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null || true)"
  if [ -n "$TORCH_NCCL" ] && [ -f "$TORCH_NCCL" ]; then export PG_NCCL_LIBRARY="$TORCH_NCCL"; fi
  echo "bench libnccl: ${PG_NCCL_LIBRARY:-default loader (libnccl.so.2, libnccl.so)}"
fi
if wants all-reduce; then
  "$HERE/pg-nccl-gpu" run --tasks bench --out "$OUT" --bench-max-bytes "${BENCH_MAX_BYTES:-1073741824}" \
    --bench-trials "${BENCH_TRIALS:-5}" "${NPROC_ARGS[@]}" || rc=1
  "$HERE/pg-nccl-gpu" run --tasks first --out "$OUT" --bench-trials "${FIRST_TRIALS:-5}" "${NPROC_ARGS[@]}" || rc=1
  if python3 -c 'import torch' 2>/dev/null; then
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
for op in all-to-all p2p; do
  wants "$op" || continue
  # Each into OUT_DIR/<op>.{md,json}; a world of 1 runs the all-to-all as a self-exchange, and the p2p ring
  # (which needs two ranks) writes that it is not applicable.
  "$HERE/pg-nccl-gpu" run --tasks "bench-$op" --out "$OUT" --bench-max-bytes "${BENCH_MAX_BYTES:-1073741824}" \
    --bench-trials "${BENCH_TRIALS:-5}" "${NPROC_ARGS[@]}" || rc=1
  rm -f "$OUT/torch-$op.json"
  if python3 -c 'import torch' 2>/dev/null; then
    torchrun --standalone --nproc-per-node "$NP" "$HERE/torch_exchange.py" --op "$op" --out "$OUT" \
      --max-bytes "${BENCH_MAX_BYTES:-1073741824}" --trials "${BENCH_TRIALS:-5}" || rc=1
  else
    echo "no torch here: the PyTorch contestant of $op is skipped"
  fi
  PG_BENCH_LABEL="$(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), libnccl ${PG_NCCL_LIBRARY:-default}, commit $(cat "$HERE/COMMIT" 2>/dev/null || echo unknown), command: BENCH=${BENCH:-1} BENCH_MAX_BYTES=${BENCH_MAX_BYTES:-1073741824} BENCH_TRIALS=${BENCH_TRIALS:-5} run.sh" \
    "$HERE/pg-nccl-gpu" "merge-$op" --out "$OUT" || rc=1
done
if [ "${TRAIN:-1}" = "1" ]; then
  # The training example (cuBLAS loaded at run time) and PyTorch DDP on the same model, data and steps.
  CUBLAS_DIR="${CUBLAS_DIR:-$(dirname "$( { python3 -c 'import nvidia, os; print(*nvidia.__path__)' 2>/dev/null | xargs -r -I{} find {} -name 'libcublas.so.1[23]'; find /usr/local/cuda*/ -name 'libcublas.so.1[23]'; } 2>/dev/null | head -1)")}"
  if [ -n "$CUBLAS_DIR" ] && [ "$CUBLAS_DIR" != "." ]; then export LD_LIBRARY_PATH="$CUBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  echo "training example: libcublas from ${CUBLAS_DIR:-the default loader path}"
  TN="${TRAIN_NPROC:-1}"
  TRAIN_ARGS=(--backend nccl --world-size "$TN" --steps "${TRAIN_STEPS:-100}" --json "$OUT/train-pg.json")
  rm -f "$OUT/train-pg.json" "$OUT/train-torch.json"
  if [ "$TN" = "1" ]; then
    "$HERE/ddp_mlp" "${TRAIN_ARGS[@]}" > "$OUT/train-pg.txt" 2>&1 || rc=1
  else
    # One process per rank with torchrun's variables, rank r on GPU r % GPUS (ranks sharing a GPU each their
    # own NCCL host over loopback sockets, as pg's launchers place them).
    PIDS=()
    for r in $(seq 0 $((TN - 1))); do
      HOSTENV=()
      if [ "$TN" -gt "$GPUS" ]; then HOSTENV=(NCCL_HOSTID="pg-rank-host-$r" NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" NCCL_IB_DISABLE="${NCCL_IB_DISABLE:-1}"); fi
      env "${HOSTENV[@]}" RANK=$r LOCAL_RANK=$((r % GPUS)) WORLD_SIZE=$TN MASTER_ADDR=127.0.0.1 MASTER_PORT="${TRAIN_PORT:-29531}" \
        "$HERE/ddp_mlp" "${TRAIN_ARGS[@]}" > "$OUT/train-pg-rank$r.txt" 2>&1 & PIDS+=($!)
    done
    for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
    cp "$OUT/train-pg-rank0.txt" "$OUT/train-pg.txt"
  fi
  tail -3 "$OUT/train-pg.txt"
  if python3 -c 'import torch' 2>/dev/null; then
    torchrun --standalone --nproc-per-node "$TN" "$HERE/torch_ddp_mlp.py" --steps "${TRAIN_STEPS:-100}" \
      --json "$OUT/train-torch.json" > "$OUT/train-torch.txt" 2>&1 || rc=1
    tail -3 "$OUT/train-torch.txt"
  else
    echo "no torch here: the PyTorch DDP run is skipped"
  fi
  if [ -f "$OUT/train-pg.json" ]; then
    PG_RUN_LABEL="$PG_RUN_LABEL; command: ddp_mlp ${TRAIN_ARGS[*]}; torchrun --nproc-per-node $TN torch_ddp_mlp.py --steps ${TRAIN_STEPS:-100}" \
      "$HERE/pg-nccl-gpu" merge-train --out "$OUT" || rc=1
    cp "$OUT/train-mlp.json" "$OUT/train-mlp-${GPU_TAG}x$TN.json"; cp "$OUT/train-mlp.md" "$OUT/train-mlp-${GPU_TAG}x$TN.md"
  fi
fi
exit $rc
"###;

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
        std::fs::copy(root().join("target/release/examples/ddp_mlp"), dir.join("ddp_mlp"))
            .map_err(|e| format!("copying the training example: {e}"))?;
        for script in [
            "torch_allreduce.py",
            "torch_exchange.py",
            "torch_ddp_mlp.py",
            "torch_experiments.py",
            "torch_placement.py",
            "stream_pairs.py",
        ] {
            std::fs::copy(root().join("bench").join(script), dir.join(script))
                .map_err(|e| format!("copying {script}: {e}"))?;
        }
        std::fs::write(dir.join("COMMIT"), commit() + "\n").map_err(|e| format!("writing COMMIT: {e}"))?;
        let run_sh = dir.join("run.sh");
        std::fs::write(&run_sh, RUN_SH).map_err(|e| e.to_string())?;
        set_executable(&run_sh)?;
        println!(
            "bundle ready in {}: run.sh, pg-nccl-gpu, pg-xtask, ddp_mlp, torch_allreduce.py, torch_exchange.py, \
             torch_ddp_mlp.py, torch_experiments.py, torch_placement.py, stream_pairs.py, COMMIT",
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
    command.args(["run", "--tasks", "conformance,experiments,interop", "--out"]).arg(&out).env("NCCL_NVLS_ENABLE", "0");
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

/// The commit the bundle is built from (`-dirty` with uncommitted changes; `unknown` without git).
fn commit() -> String {
    let git =
        |args: &[&str]| Command::new("git").current_dir(root()).args(args).output().ok().filter(|o| o.status.success());
    let Some(head) = git(&["rev-parse", "HEAD"]) else { return "unknown".into() };
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    let dirty = git(&["status", "--porcelain"]).is_some_and(|o| !o.stdout.is_empty());
    if dirty {
        head + "-dirty"
    } else {
        head
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

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    /// Runs the bundle's run.sh with `bench` as BENCH, on stand-ins for the binaries, nvidia-smi and python3
    /// (no torch) that log their arguments; returns the exit status and the log.
    fn run_sh(bench: &str) -> (bool, String) {
        let dir = std::env::temp_dir().join(format!("pg-run-sh-{}-{bench}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let log = dir.join("log");
        let stub = |path: PathBuf, body: &str| {
            std::fs::write(&path, format!("#!/usr/bin/env bash\n{body}\n")).unwrap();
            set_executable(&path).unwrap();
        };
        stub(dir.join("run.sh"), RUN_SH);
        stub(dir.join("pg-nccl-gpu"), &format!("echo \"pg-nccl-gpu $*\" >> {}", log.display()));
        stub(bin.join("nvidia-smi"), "[ \"$1\" = -L ] && echo 'GPU 0: stand-in'; exit 0");
        stub(bin.join("python3"), "exit 1");
        stub(bin.join("torchrun"), &format!("echo \"torchrun $*\" >> {}", log.display()));
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let status = Command::new("bash")
            .arg(dir.join("run.sh"))
            .arg(dir.join("out"))
            .env("PATH", path)
            .env("BENCH", bench)
            .env("XTASK_EXPERIMENTS", "0")
            .env("TRAIN", "0")
            .status()
            .unwrap();
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        (status.success(), text)
    }

    #[test]
    fn run_sh_runs_the_benchmarks_bench_names() {
        let (ok, log) = run_sh("all-to-all,p2p");
        assert!(ok, "{log}");
        assert!(log.contains("run --tasks bench-all-to-all"), "{log}");
        assert!(log.contains("merge-all-to-all --out"), "{log}");
        assert!(log.contains("run --tasks bench-p2p"), "{log}");
        assert!(log.contains("merge-p2p --out"), "{log}");
        assert!(!log.contains("merge-bench"), "all-reduce was not asked for: {log}");
        assert!(!log.contains("torchrun"), "no torch here: {log}");

        let (ok, log) = run_sh("1");
        assert!(ok, "{log}");
        for want in ["run --tasks bench ", "merge-bench --out", "merge-all-to-all", "merge-p2p"] {
            assert!(log.contains(want), "BENCH=1 runs every benchmark; missing {want}: {log}");
        }

        let (ok, log) = run_sh("0");
        assert!(ok, "{log}");
        assert!(!log.contains("bench"), "BENCH=0 runs none: {log}");
        assert!(log.contains("run --tasks conformance,experiments"), "{log}");
    }

    #[test]
    fn run_sh_fails_on_an_unknown_benchmark() {
        let (ok, log) = run_sh("all-to-all,broadcast");
        assert!(!ok, "an unknown name fails the run");
        assert!(log.contains("merge-all-to-all"), "the known one still runs: {log}");
    }
}
