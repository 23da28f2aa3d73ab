//! `cargo xtask gpu-test`: builds the real-GPU suite (`pg-nccl-gpu`, release) and runs it, one process per
//! GPU; `--bundle DIR` instead puts the binaries, the PyTorch bench scripts and `run.sh` into DIR for a machine
//! without cargo.

use std::path::{Path, PathBuf};
use std::process::Command;

use pg_lab::RUN_SH;

pub const HELP: &str = "\
cargo xtask gpu-test [--bundle DIR] [--nproc N] [--out DIR]

Without --bundle: finds the GPUs (nvidia-smi), builds pg-nccl-gpu (release) and runs the conformance suite,
the three experiments and the interop task, one process per GPU over loopback; results in --out (default
bench/results/gpu-test). Without GPUs it says so and fails.
With --bundle DIR: builds everything (release, no debug info, function names kept for the stacks of a stalled
run) into DIR with run.sh, to run where cargo is not: the suite, the interop task, the benchmarks and the training
example (ddp_mlp) with the PyTorch scripts.
run.sh [OUT_DIR] reads TASKS (default conformance,experiments,interop; none for none), STALL_S (conformance ranks
that finish no case for that long are stopped with their stacks in OUT_DIR/stalls/ and started again at the
furthest case reached; default 180), TASK_TIMEOUT_S (each task of a world, default 600), BENCH (1 = every
benchmark, the default; 0 = none; or a list of all-reduce, all-to-all, p2p), BENCH_MAX_BYTES, BENCH_TRIALS, NPROC, TRAIN (1 = run the
training example, the default), TRAIN_NPROC, TRAIN_STEPS and CUBLAS_DIR; the benchmarks write
OUT_DIR/allreduce.{md,json}, OUT_DIR/all-to-all.{md,json} and OUT_DIR/p2p.{md,json}.
Worlds and transports (any number of ranks on one GPU: NCCL's network transport over loopback sockets):
TASK_WORLDS, BENCH_WORLDS and TRAIN_WORLDS (\"2 4\": each world in turn), BENCH_PROFILE=network (sizes to 16 MiB,
10 ops per trial: OUT_DIR/allreduce-nccl-N-net.{md,json}, all-to-all-nccl-N-net, p2p-nccl-N-net),
TRAIN_BUCKETS=\"1 2\" (pg's example and DDP with one gradient bucket and with two, one report per world),
MIXED=1 (a pg rank joined with the code of docs/torch-job.md beside PyTorch ranks, MIXED_RUNS=\"2:0 2:1 3:1 3:0\" as world:pg rank:
OUT_DIR/mixed-nccl-N.{md,json}), TORCHRUN=1 (two torchrun agents, c10d rendezvous, --nproc-per-node 2, start the
conformance ranks: OUT_DIR/conformance-torchrun-4.{md,json}), FAULTS=1 (pg-xtask faults --backend nccl at each world
of FAULT_WORLDS, default \"2 4\": OUT_DIR/faults-nccl-N.{md,json}).
SUITE=network runs all of that on one GPU in one command (TASK_WORLDS, BENCH_WORLDS, TRAIN_WORLDS and FAULT_WORLDS
\"2 4\", TRAIN_BUCKETS \"1 2\", BENCH_PROFILE=network, MIXED=1, TORCHRUN=1, FAULTS=1; about 15 minutes on one H200, the fault matrix under a minute of it);
ONLY=PART[,PART] (tasks, bench, train, mixed, torchrun, faults) runs those parts alone (SUITE=network ONLY=bench: the network benchmarks at
worlds 2 and 4).
";

/// The workspace root (xtask's parent).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace").to_path_buf()
}

/// Where cargo puts release builds: `CARGO_TARGET_DIR/release` when set (relative to the workspace root when
/// relative), else `target/release` in the workspace.
pub fn release_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root().join(dir).join("release"),
        None => root().join("target/release"),
    }
}

/// Builds `pg-nccl-gpu` in release mode and returns its path.
pub fn build_suite() -> Result<PathBuf, String> {
    let root = root();
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .current_dir(&root)
        // pg-lab builds pg-nccl with its test and benchmark hooks (raw baseline, launch log, timer), which the suite
        // and the benchmark read; the training example is pg-nccl's.
        .args([
            "build",
            "--release",
            "-p",
            "pg-lab",
            "-p",
            "pg-nccl",
            "-p",
            "xtask",
            "--bin",
            "pg-nccl-gpu",
            "--bin",
            "xtask",
        ])
        .args(["--example", "ddp_mlp"])
        // Function names stay (a megabyte or two): the stacks of a stalled run name pg's frames.
        .env("CARGO_PROFILE_RELEASE_STRIP", "debuginfo")
        .status()
        .map_err(|e| format!("cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build failed: {status}"));
    }
    Ok(release_dir().join("pg-nccl-gpu"))
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
        std::fs::copy(release_dir().join("xtask"), dir.join("pg-xtask"))
            .map_err(|e| format!("copying the xtask binary: {e}"))?;
        std::fs::copy(release_dir().join("examples/ddp_mlp"), dir.join("ddp_mlp"))
            .map_err(|e| format!("copying the training example: {e}"))?;
        for script in [
            "torch_allreduce.py",
            "torch_exchange.py",
            "torch_ddp_mlp.py",
            "torch_experiments.py",
            "torch_placement.py",
            "torch_profile.py",
            "torch_mixed.py",
            "torch_recovery.py",
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
             torch_ddp_mlp.py, torch_experiments.py, torch_placement.py, torch_profile.py, torch_mixed.py, torch_recovery.py, \
             stream_pairs.py, COMMIT",
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
        run_sh_with(&[("BENCH", bench), ("XTASK_EXPERIMENTS", "0"), ("TRAIN", "0")])
    }

    /// As [`run_sh`], with the environment `vars` (and stand-ins for torchrun and the training example).
    fn run_sh_with(vars: &[(&str, &str)]) -> (bool, String) {
        let tag: String = vars.iter().map(|(k, v)| format!("{k}{v}")).collect::<String>().replace([' ', ',', ':'], "_");
        let dir = std::env::temp_dir().join(format!("pg-run-sh-{}-{tag}", std::process::id()));
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
        stub(dir.join("ddp_mlp"), &format!("echo \"ddp_mlp $* NCCL_HOSTID=${{NCCL_HOSTID:-}}\" >> {}", log.display()));
        stub(bin.join("nvidia-smi"), "[ \"$1\" = -L ] && echo 'GPU 0: stand-in'; exit 0");
        stub(bin.join("python3"), "exit 1");
        stub(bin.join("torchrun"), &format!("echo \"torchrun $*\" >> {}", log.display()));
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
        let status = Command::new("bash")
            .arg(dir.join("run.sh"))
            .arg(dir.join("out"))
            .env("PATH", path)
            .envs(vars.iter().copied())
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
    fn run_sh_bounds_the_tasks_by_stall_s_and_task_timeout_s() {
        let (ok, log) = run_sh_with(&[("ONLY", "tasks"), ("XTASK_EXPERIMENTS", "0")]);
        assert!(ok, "{log}");
        assert!(log.contains("--stall-s 180 --timeout-s 600"), "the defaults: {log}");
        let vars = [("ONLY", "tasks"), ("XTASK_EXPERIMENTS", "0"), ("STALL_S", "90"), ("TASK_TIMEOUT_S", "560")];
        let (ok, log) = run_sh_with(&vars);
        assert!(ok, "{log}");
        assert!(log.contains("--stall-s 90 --timeout-s 560"), "{log}");
    }

    #[test]
    fn run_sh_network_benches_run_at_each_world_with_the_network_profile() {
        let (ok, log) = run_sh_with(&[("SUITE", "network"), ("ONLY", "bench")]);
        assert!(ok, "{log}");
        for world in ["2", "4"] {
            for task in ["bench ", "bench-all-to-all ", "bench-p2p "] {
                let want = format!(
                    "run --tasks {task}--out {} --bench-max-bytes 16777216 --bench-trials 3 --bench-profile network --nproc {world}",
                    log.split("--out ").nth(1).and_then(|rest| rest.split(' ').next()).unwrap_or("?")
                );
                assert!(log.contains(&want), "missing {want}: {log}");
            }
        }
        assert!(!log.contains("--tasks first"), "no first-collective launches over sockets: {log}");
        assert!(!log.contains("conformance"), "ONLY=bench: {log}");
        assert!(!log.contains("torchrun"), "{log}");
    }

    #[test]
    fn run_sh_torchrun_rehearsal_launches_two_agents_and_merges_world_4() {
        let (ok, log) = run_sh_with(&[("ONLY", "torchrun")]);
        assert!(ok, "{log}");
        let agents: Vec<&str> = log.lines().filter(|l| l.starts_with("torchrun ")).collect();
        assert_eq!(agents.len(), 2, "{log}");
        for node in 0..2 {
            // The agents run side by side: their lines come in either order.
            let agent = agents.iter().find(|a| a.contains(&format!("--node-rank {node} "))).expect("an agent per node");
            for want in [
                "--nnodes 2".to_owned(),
                format!("--rdzv-conf is_host={}", usize::from(node == 0)),
                "--nproc-per-node 2".into(),
                "--rdzv-backend c10d".into(),
                "--no-python".into(),
                "rank --task conformance".into(),
            ] {
                assert!(agent.contains(&want), "agent {node} misses {want}: {agent}");
            }
        }
        assert!(log.contains("merge --task conformance --nproc 4"), "{log}");
        assert!(!log.contains("bench"), "{log}");
    }

    #[test]
    fn run_sh_trains_each_world_and_layout_with_a_host_id_per_rank_beyond_the_gpus() {
        let (ok, log) =
            run_sh_with(&[("ONLY", "train"), ("TRAIN_WORLDS", "2"), ("TRAIN_BUCKETS", "1 2"), ("TRAIN_STEPS", "3")]);
        assert!(ok, "{log}");
        for k in ["1", "2"] {
            assert!(log.contains(&format!("--buckets {k} NCCL_HOSTID=pg-rank-host-1")), "{log}");
        }
        assert!(log.contains("merge-train --out") && log.contains("--buckets 1,2"), "{log}");
        let (ok, log) = run_sh_with(&[("ONLY", "mixed")]);
        assert!(!ok, "no torch here: the mixed groups cannot run, and the run says so by failing: {log}");
        let (ok, _) = run_sh_with(&[("ONLY", "train,everything")]);
        assert!(!ok, "an unknown part is refused");
        let (ok, log) = run_sh_with(&[("SUITE", "network"), ("ONLY", "torchrun,train"), ("TRAIN_STEPS", "3")]);
        assert!(ok, "{log}");
        assert!(log.contains("merge --task conformance") && log.contains("merge-train"), "{log}");
        assert!(!log.contains("bench") && !log.contains("run --tasks conformance"), "{log}");
    }

    #[test]
    fn run_sh_fails_on_an_unknown_benchmark() {
        let (ok, log) = run_sh("all-to-all,broadcast");
        assert!(!ok, "an unknown name fails the run");
        assert!(log.contains("merge-all-to-all"), "the known one still runs: {log}");
    }
}
