//! `cargo xtask bench store`: builds pg-store's benchmark and `pgstore` in release mode and runs our TCP store
//! server and PyTorch's side by side, writing `bench/results/store.{json,md}`.

use std::process::Command;

use crate::interop::workspace_root;

const HELP: &str = "\
cargo xtask bench store [--python PATH] [--clients 1,8,64,1024] [--ops N] [--reps R] [--only set,get,add,wait-wakeup]
                        [--pgstore-threads N] [--pgstore-busy-poll-us N] [--pgstore-coalesce-us N]
                        [--pgstore-flood-rcvbuf-bytes N] [--pin-cpus on|off] [--fresh-connections on|off] [--out DIR]

Measures set, get, add and wait-wakeup (p50/p99 latency, throughput) with each client count against
`pgstore serve` and, when a Python with torch is found, PyTorch's TCPStore server, in one run.
Python: --python, else target/interop-venv/bin/python (made by `cargo xtask interop`), else python3;
without torch only our server is measured, and the results say so.
Each configuration runs R times (default 5), the servers taking turns to go first; N operations per run
(default 10000). --only measures a subset of the operations. --pgstore-threads, --pgstore-busy-poll-us,
--pgstore-coalesce-us and --pgstore-flood-rcvbuf-bytes are passed to `pgstore serve` as --threads,
--busy-poll-us, --coalesce-us and --flood-rcvbuf-bytes (default: its own defaults for this machine). --pin-cpus on runs both servers' threads on CPUs 0-3 and each client thread on
a CPU of its own after those, the same placement in every run. Every run opens new client connections
(--fresh-connections on, the default), so that runs are independent samples; --fresh-connections off keeps one
pool per server and client count for all its runs (a run's place in the order is then its connections' age).
Results: bench/results/store.json and bench/results/store.md (or --out DIR). They name the host's TCP congestion
control: SET floods depend on it (with cubic each SET tends to leave as a TCP segment of its own, for both servers).
";

fn imports_torch(python: &str) -> bool {
    Command::new(python)
        .args(["-W", "ignore", "-c", "import torch.distributed"])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Runs the task with the arguments after `bench store`.
pub fn main(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{HELP}");
        return Ok(());
    }
    let root = workspace_root();
    let mut forwarded: Vec<String> = Vec::new();
    let mut python = None;
    let mut out = root.join("bench/results").display().to_string();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let value = iter.next().ok_or_else(|| format!("{arg} needs a value"))?.clone();
        match arg.as_str() {
            "--python" => python = Some(value),
            "--out" => out = value,
            "--clients"
            | "--ops"
            | "--reps"
            | "--only"
            | "--pgstore-threads"
            | "--pgstore-busy-poll-us"
            | "--pgstore-coalesce-us"
            | "--pgstore-flood-rcvbuf-bytes"
            | "--pin-cpus"
            | "--fresh-connections" => forwarded.extend([arg.clone(), value]),
            other => return Err(format!("unknown argument {other}\n\n{HELP}")),
        }
    }
    let venv_python = root.join("target/interop-venv/bin/python").display().to_string();
    let python = python.or_else(|| [venv_python, "python3".to_owned()].into_iter().find(|p| imports_torch(p)));
    if python.is_none() {
        eprintln!(
            "bench store: no Python with torch found; measuring our server only (run `cargo xtask interop` first)"
        );
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--release", "-p", "pg-store", "--bin", "pgstore", "--example", "store_bench"])
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building the benchmark failed with {status}"));
    }
    let release = root.join("target/release");
    let mut bench = Command::new(release.join("examples/store_bench"));
    bench.arg("--pgstore").arg(release.join("pgstore")).args(["--out", &out]).args(&forwarded);
    if let Some(python) = &python {
        bench.args(["--python", python]);
    }
    let status = bench.status().map_err(|e| format!("cannot run the benchmark: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("the benchmark failed with {status}")),
    }
}
