//! `cargo xtask bench all-reduce`: the all_reduce benchmark (raw NCCL loop, pg's process group, PyTorch) on
//! this machine's GPUs, into `bench/results/`.

use std::process::Command;

use crate::gpu_test::{build_suite, find_gpus, root};

pub const HELP: &str = "\
cargo xtask bench all-reduce [--max-bytes N] [--trials N] [--out DIR]

all_reduce from 8 B to 1 GiB: a raw NCCL loop through nccl-sys, pg's process group (tracing off: pg, and
with the op timeline of PG_TRACE on: pg-traced, whose rank files go to PG_BENCH_TRACE_DIR, default
$TMPDIR/pg-bench-allreduce-trace), and PyTorch's dist.all_reduce (bench/torch_allreduce.py, where python3 has
torch), on the same GPUs and the same libnccl (PyTorch's when present, through PG_NCCL_LIBRARY); then the time
to the first all_reduce of a fresh group (pg lazy and eager, PyTorch without and with device_id), --trials fresh
launches each. Markdown and JSON into --out (default bench/results/allreduce).
";

pub fn run(args: &[String]) -> Result<(), String> {
    let (what, rest) = match args.split_first() {
        Some((first, rest)) if !first.starts_with('-') => (first.as_str(), rest),
        _ => ("all-reduce", args),
    };
    if what != "all-reduce" {
        return Err(format!("bench '{what}' is not the all-reduce benchmark\n{HELP}"));
    }
    let mut max_bytes = (1u64 << 30).to_string();
    let mut trials = "5".to_owned();
    let mut out = root().join("bench/results/allreduce");
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--max-bytes" => max_bytes = it.next().ok_or("--max-bytes needs a number")?.clone(),
            "--trials" => trials = it.next().ok_or("--trials needs a number")?.clone(),
            "--out" => out = it.next().ok_or("--out needs a directory")?.into(),
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            other => return Err(format!("unknown option {other}\n{HELP}")),
        }
    }
    let gpus = find_gpus().map_err(|why| format!("no GPU found, nothing to benchmark: {why}"))?;
    let binary = build_suite()?;
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let torch_nccl = crate::bench_exchange::torch_nccl();
    let mut rust = Command::new(&binary);
    rust.args(["run", "--tasks", "bench", "--out"])
        .arg(&out)
        .args(["--bench-max-bytes", &max_bytes, "--bench-trials", &trials])
        .env("NCCL_NVLS_ENABLE", "0");
    if let Some(path) = &torch_nccl {
        rust.env("PG_NCCL_LIBRARY", path);
    }
    let rust_ok = rust.status().map_err(|e| e.to_string())?.success();
    // Time to the first all_reduce: fresh processes per trial, lazy and eager.
    let mut first = Command::new(&binary);
    first.args(["run", "--tasks", "first", "--out"]).arg(&out).args(["--bench-trials", &trials]);
    first.env("NCCL_NVLS_ENABLE", "0");
    if let Some(path) = &torch_nccl {
        first.env("PG_NCCL_LIBRARY", path);
    }
    let first_ok = first.status().map_err(|e| e.to_string())?.success();
    let torchrun = |extra: &[&str]| -> Result<bool, String> {
        Command::new("torchrun")
            .args(["--standalone", "--nproc-per-node", &gpus.len().to_string()])
            .arg(root().join("bench/torch_allreduce.py"))
            .arg("--out")
            .arg(&out)
            .args(extra)
            .env("NCCL_NVLS_ENABLE", "0")
            .status()
            .map(|status| status.success())
            .map_err(|e| e.to_string())
    };
    let torch_ok = match torch_nccl {
        Some(_) => {
            let mut ok = torchrun(&["--max-bytes", &max_bytes, "--trials", &trials])?;
            let _ = std::fs::remove_file(out.join("torch-first.jsonl"));
            for _ in 0..trials.parse::<usize>().unwrap_or(5) {
                for mode in ["lazy", "eager"] {
                    ok &= torchrun(&["--first", mode])?;
                }
            }
            ok
        }
        None => {
            println!("no PyTorch here: the torch contestant is skipped");
            true
        }
    };
    let merged = Command::new(&binary).args(["merge-bench", "--out"]).arg(&out).status().map_err(|e| e.to_string())?;
    if rust_ok && first_ok && torch_ok && merged.success() {
        Ok(())
    } else {
        Err("the benchmark failed; see the output above".into())
    }
}
