//! `cargo xtask bench store`: pg-store's TCP store server and PyTorch's side by side under the same Rust
//! client load, and `cargo xtask bench store-hostile`: what hostile clients cost the server.
//!
//! Both tasks build `pgstore` and this program in release mode and re-run this program's release build (the
//! hidden tasks below), so that the client load is optimised code whatever profile `cargo xtask` runs in.

mod hostile;
mod load;
mod report;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::interop::workspace_root;

/// The hidden task that runs the comparison in the release build.
pub const RUN_TASK: &str = "__bench-store-run";
/// The hidden task that runs the hostile-client measurements in the release build.
pub const HOSTILE_TASK: &str = "__bench-store-hostile-run";

const HELP: &str = "\
cargo xtask bench store [--python PATH] [--clients 1,8,64,1024] [--ops N] [--reps R] [--only set,get,add,wait-wakeup]
                        [--pgstore-threads N] [--pgstore-busy-poll-us N] [--pgstore-coalesce-us N] [--out DIR]

Measures set, get, add and wait-wakeup (throughput, p50/p99 latency) with each client count against
`pgstore serve` and, when a Python with torch is found, PyTorch's TCPStore server (libuv), each its own process
on 127.0.0.1. The clients are threads of one process, one blocking pg-store TcpStore connection each, the same
for both servers; every run opens new connections.
Python: --python, else target/interop-venv/bin/python (made by `cargo xtask interop`), else python3; without
torch only pg's server is measured, and the results say so.
Each configuration runs R times (default 5), the servers taking turns to go first; ops/s is the median run.
N operations per run (default 10000; at least 20 per client, ten times as many for set). --only measures a
subset. --pgstore-threads, --pgstore-busy-poll-us and --pgstore-coalesce-us are passed to `pgstore serve` as
--threads, --busy-poll-us and --coalesce-us (default: its own defaults for this machine).
Results: bench/results/store.json and bench/results/store.md (or --out DIR).
";

const HOSTILE_HELP: &str = "\
cargo xtask bench store-hostile [--waits N] [--readers N] [--keys N] [--out DIR]

Against `pgstore serve` with its default limits, measures:
  wait clean-up: one connection queues N WAITs on one key (default 200000) and closes; another client
    pings the server throughout, and the longest ping round trip is the stall every client saw;
  reply amplification: one 8 MiB value; N connections (default 6) each send one MULTI_GET naming it
    --keys times (default 30) and never read; the server's resident memory before and after.
Results: bench/results/store-hostile.json and .md (or --out DIR).
";

/// What a comparison run measures.
#[derive(Debug, Clone)]
pub struct Options {
    pub clients: Vec<usize>,
    pub ops: usize,
    pub reps: usize,
    pub only: Vec<&'static str>,
    /// `pgstore serve` flags given on the command line, as (flag, value).
    pub pgstore_flags: Vec<(&'static str, String)>,
    pub out: PathBuf,
}

/// The operations measured, in table order.
pub const OPS: [&str; 4] = ["set", "get", "add", "wait-wakeup"];

fn numbers(flag: &str, text: &str) -> Result<Vec<usize>, String> {
    let parsed: Vec<usize> = text
        .split(',')
        .map(|n| n.trim().parse().map_err(|_| format!("{flag}: bad number {n:?}")))
        .collect::<Result<_, _>>()?;
    match parsed.contains(&0) {
        true => Err(format!("{flag}: every number must be at least 1")),
        false => Ok(parsed),
    }
}

fn number(flag: &str, text: &str) -> Result<usize, String> {
    Ok(numbers(flag, text)?.into_iter().next().unwrap_or(1))
}

/// Parses the comparison's flags; `--python` is returned apart (the launcher resolves it).
pub fn parse(args: &[String]) -> Result<(Options, Option<String>), String> {
    let mut options = Options {
        clients: vec![1, 8, 64, 1024],
        ops: 10_000,
        reps: 5,
        only: OPS.to_vec(),
        pgstore_flags: Vec::new(),
        out: workspace_root().join("bench/results"),
    };
    let mut python = None;
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let value = iter.next().ok_or_else(|| format!("{arg} needs a value"))?;
        match arg.as_str() {
            "--python" => python = Some(value.clone()),
            "--out" => options.out = PathBuf::from(value),
            "--clients" => options.clients = numbers(arg, value)?,
            "--ops" => options.ops = number(arg, value)?,
            "--reps" => options.reps = number(arg, value)?,
            "--only" => {
                options.only = value
                    .split(',')
                    .map(|name| {
                        OPS.into_iter()
                            .find(|op| *op == name.trim())
                            .ok_or_else(|| format!("--only: unknown operation {name:?} (one of {})", OPS.join(", ")))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--pgstore-threads" => options.pgstore_flags.push(("--threads", number(arg, value)?.to_string())),
            "--pgstore-busy-poll-us" | "--pgstore-coalesce-us" => {
                let micros: u64 = value.parse().map_err(|_| format!("{arg}: bad number {value:?}"))?;
                let flag = if arg == "--pgstore-busy-poll-us" { "--busy-poll-us" } else { "--coalesce-us" };
                options.pgstore_flags.push((flag, micros.to_string()));
            }
            other => return Err(format!("unknown argument {other}\n\n{HELP}")),
        }
    }
    Ok((options, python))
}

fn imports_torch(python: &str) -> bool {
    Command::new(python)
        .args(["-W", "ignore", "-c", "import torch.distributed"])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Builds `pgstore` and xtask in release mode and runs `task` in the release xtask with `args` and the
/// server's path.
fn run_released(task: &str, args: &[String]) -> Result<(), String> {
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--release", "-p", "pg-store", "--features", "pg-store/cli", "--bin", "pgstore", "-p", "xtask"])
        .args(["--bin", "xtask"])
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !status.success() {
        return Err(format!("building the benchmark failed with {status}"));
    }
    let release = root.join("target/release");
    let status = Command::new(release.join("xtask"))
        .arg(task)
        .arg(release.join("pgstore"))
        .args(args)
        .status()
        .map_err(|e| format!("cannot run the benchmark: {e}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("the benchmark failed with {status}")),
    }
}

/// `cargo xtask bench store`.
pub fn main(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{HELP}");
        return Ok(());
    }
    let (_, python) = parse(args)?;
    let venv_python = workspace_root().join("target/interop-venv/bin/python").display().to_string();
    let python = python.or_else(|| [venv_python, "python3".to_owned()].into_iter().find(|p| imports_torch(p)));
    let mut forwarded: Vec<String> = Vec::new();
    let mut iter = args.iter();
    while let (Some(flag), Some(value)) = (iter.next(), iter.next()) {
        if flag != "--python" {
            forwarded.extend([flag.clone(), value.clone()]);
        }
    }
    match &python {
        Some(python) => forwarded.extend(["--python".to_owned(), python.clone()]),
        None => {
            eprintln!("bench store: no Python with torch found; measuring pg's server only (see `cargo xtask interop`)")
        }
    }
    run_released(RUN_TASK, &forwarded)
}

/// `cargo xtask bench store-hostile`.
pub fn hostile_main(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{HOSTILE_HELP}");
        return Ok(());
    }
    hostile::parse(args)?;
    run_released(HOSTILE_TASK, args)
}

/// The hidden comparison task: `RUN_TASK PGSTORE [flags]`.
pub fn run_main(args: &[String]) -> Result<(), String> {
    let (pgstore, rest) = args.split_first().ok_or("usage: __bench-store-run PGSTORE [flags]")?;
    let (options, python) = parse(rest)?;
    let mut command = "cargo xtask bench store".to_owned();
    for pair in rest.chunks(2) {
        if let [flag, value] = pair {
            if flag != "--python" && flag != "--out" {
                command.push_str(&format!(" {flag} {value}"));
            }
        }
    }
    let measured = load::measure_all(Path::new(pgstore), python.as_deref(), &options)?;
    report::write(&options, &command, &measured)
}

/// The hidden hostile-client task: `HOSTILE_TASK PGSTORE [flags]`.
pub fn hostile_run_main(args: &[String]) -> Result<(), String> {
    let (pgstore, rest) = args.split_first().ok_or("usage: __bench-store-hostile-run PGSTORE [flags]")?;
    hostile::run(Path::new(pgstore), &hostile::parse(rest)?)
}

#[cfg(test)]
mod tests {
    use super::parse;

    /// Parses `command` and checks the error's first words, or `Ok` for none.
    fn check(command: &str, expected: Result<(), &str>) {
        let args: Vec<String> = command.split_whitespace().map(String::from).collect();
        assert_eq!(
            parse(&args).map(drop).map_err(|message| message
                .lines()
                .next()
                .unwrap()
                .split(':')
                .next()
                .unwrap()
                .to_owned()),
            expected.map_err(String::from),
            "{command}"
        );
    }

    #[test]
    fn flags_out_of_range_are_refused_by_name() {
        check("", Ok(()));
        check("--clients 1,8 --ops 1 --reps 1 --only set,get --pgstore-threads 2", Ok(()));
        check("--clients 0", Err("--clients"));
        check("--clients 8,x", Err("--clients"));
        check("--ops 0", Err("--ops"));
        check("--reps 0", Err("--reps"));
        check("--only put", Err("--only"));
        check("--pgstore-coalesce-us soon", Err("--pgstore-coalesce-us"));
        check("--reps", Err("--reps needs a value"));
        check("--flood-rcvbuf-bytes 1", Err("unknown argument --flood-rcvbuf-bytes"));
    }
}
