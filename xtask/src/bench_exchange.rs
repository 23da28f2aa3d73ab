//! `cargo xtask bench all-to-all` and `cargo xtask bench p2p`: the all-to-all and point-to-point benchmarks
//! (raw NCCL loop, pg's process group, PyTorch) on this machine's GPUs, into `bench/results/`.

use std::path::PathBuf;
use std::process::Command;

use pg_lab::bench_exchange::{RING_NOT_APPLICABLE, SKEWED_DEFINITION};

use crate::gpu_test::{build_suite, find_gpus, root};

/// The smallest size the benchmarks run (bytes each rank sends per op).
const MIN_BYTES: u64 = 1 << 10;

/// The `--help` text of `op`.
pub fn help(op: Op) -> String {
    let (what, raw, pg, torch, busbw, extra) = match op {
        Op::AllToAll => (
            "all_to_all_single with equal and with skewed splits",
            "ncclSend/ncclRecv per peer inside one ncclGroupStart/ncclGroupEnd, as NCCL's own all-to-all\n\
             \x20        (zero-length chunks skipped)",
            "all_to_all_single (split lists for the skewed splits, none for the equal ones)",
            "dist.all_to_all_single (likewise)",
            "busbw = algbw * (n - 1) / n",
            format!("\n{SKEWED_DEFINITION}\n"),
        ),
        Op::P2p => (
            "a batched send/recv ring: each rank sends to rank + 1 and receives from rank - 1",
            "ncclSend + ncclRecv inside one ncclGroupStart/ncclGroupEnd",
            "batch_isend_irecv",
            "dist.batch_isend_irecv",
            "busbw = algbw",
            format!("\nWith one GPU: {RING_NOT_APPLICABLE}; the results say so and the command succeeds.\n"),
        ),
    };
    format!(
        "\
cargo xtask bench {name} [--max-bytes N] [--trials N] [--nproc N] [--out DIR]

{what}, 1 KiB to 1 GiB sent by each rank per op (f32).
Contestants, on the same GPUs and the same libnccl (PyTorch's when present, through PG_NCCL_LIBRARY):
  raw    {raw}
  pg     {pg}
  torch  PyTorch's {torch} (bench/torch_exchange.py, where python3 has torch)
Time per op from CUDA events over K back-to-back ops (median of --trials, slowest rank), algbw and busbw
({busbw}; algbw = bytes each rank sends per op / time per op), and the host time of the enqueue call alone
(raw, pg, torch) and of wait() (pg, torch).
{extra}
Results: DIR/{name}.md and DIR/{name}.json (merged), DIR/bench-{name}.{{md,json}} (raw and pg, every rank),
DIR/torch-{name}.json (PyTorch). Default DIR: bench/results/{name}.

  --max-bytes N   the largest size (default 1073741824; at least 1024)
  --trials N      timed trials per size and contestant (default 5)
  --nproc N       ranks, one per GPU (default: every GPU)
  --out DIR       where the results go
",
        name = op.name()
    )
}

/// The benchmark a command names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `all-to-all`
    AllToAll,
    /// `p2p`
    P2p,
}

impl Op {
    /// The name on the command line, in task and file names.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllToAll => "all-to-all",
            Op::P2p => "p2p",
        }
    }

    fn parse(text: &str) -> Option<Op> {
        [Op::AllToAll, Op::P2p].into_iter().find(|op| op.name() == text)
    }
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    pub op: Op,
    pub max_bytes: u64,
    pub trials: usize,
    pub nproc: Option<usize>,
    pub out: PathBuf,
    pub help: bool,
}

fn number<T: std::str::FromStr>(flag: &str, value: Option<&String>) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a number"))?;
    value.parse().map_err(|_| format!("{flag}: '{value}' is not a whole number"))
}

/// Parses `bench all-to-all|p2p [options]` (the arguments after `bench`).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let (first, rest) = args.split_first().ok_or("bench needs a benchmark: all-to-all or p2p")?;
    let op = Op::parse(first).ok_or_else(|| format!("bench '{first}' is neither all-to-all nor p2p"))?;
    let mut parsed = Args {
        op,
        max_bytes: 1 << 30,
        trials: 5,
        nproc: None,
        out: root().join("bench/results").join(op.name()),
        help: false,
    };
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--max-bytes" => parsed.max_bytes = number(arg, it.next())?,
            "--trials" => parsed.trials = number(arg, it.next())?,
            "--nproc" => parsed.nproc = Some(number(arg, it.next())?),
            "--out" => parsed.out = it.next().ok_or("--out needs a directory")?.into(),
            "-h" | "--help" => parsed.help = true,
            other => return Err(format!("unknown option {other}\n{}", help(op))),
        }
    }
    if parsed.help {
        return Ok(parsed);
    }
    if parsed.max_bytes < MIN_BYTES {
        return Err(format!("--max-bytes {} is below the smallest size, {MIN_BYTES} bytes", parsed.max_bytes));
    }
    if parsed.trials == 0 {
        return Err("--trials 0: at least one trial is needed".into());
    }
    if parsed.nproc == Some(0) {
        return Err("--nproc 0: at least one rank is needed".into());
    }
    Ok(parsed)
}

/// PyTorch's libnccl, where python3 has the nvidia-nccl wheel.
pub fn torch_nccl() -> Option<String> {
    Command::new("python3")
        .args([
            "-c",
            "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib', 'libnccl.so.2'))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|p| std::path::Path::new(p).exists())
}

fn capture(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .current_dir(root())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}

/// `cargo xtask bench all-to-all|p2p [options]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let args = parse(args)?;
    let op = args.op.name();
    if args.help {
        print!("{}", help(args.op));
        return Ok(());
    }
    let gpus = find_gpus().map_err(|why| format!("no GPU found, nothing to benchmark: {why}"))?;
    let nproc = args.nproc.unwrap_or(gpus.len());
    let binary = build_suite()?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let (max_bytes, trials) = (args.max_bytes.to_string(), args.trials.to_string());
    let torch_nccl = torch_nccl();
    let mut rust = Command::new(&binary);
    rust.args(["run", "--tasks", &format!("bench-{op}"), "--out"])
        .arg(&args.out)
        .args(["--bench-max-bytes", &max_bytes, "--bench-trials", &trials, "--nproc", &nproc.to_string()])
        .env("NCCL_NVLS_ENABLE", "0");
    if let Some(path) = &torch_nccl {
        rust.env("PG_NCCL_LIBRARY", path);
    }
    let rust_ok = rust.status().map_err(|e| e.to_string())?.success();
    // A torch result of an earlier run must not be merged as this run's.
    let _ = std::fs::remove_file(args.out.join(format!("torch-{op}.json")));
    let torch_ok = match &torch_nccl {
        Some(_) => Command::new("torchrun")
            .args(["--standalone", "--nproc-per-node", &nproc.to_string()])
            .arg(root().join("bench/torch_exchange.py"))
            .args(["--op", op, "--out"])
            .arg(&args.out)
            .args(["--max-bytes", &max_bytes, "--trials", &trials])
            .env("NCCL_NVLS_ENABLE", "0")
            .status()
            .map_err(|e| e.to_string())?
            .success(),
        None => {
            println!("no PyTorch here: the torch contestant is skipped");
            true
        }
    };
    let label = format!(
        "{}; commit {}; libnccl {}; command: cargo xtask bench {op} --max-bytes {max_bytes} --trials {trials} --nproc {nproc}",
        capture("nvidia-smi", &["--query-gpu=name,driver_version", "--format=csv,noheader"]),
        capture("git", &["rev-parse", "--short", "HEAD"]),
        torch_nccl.as_deref().unwrap_or("default loader"),
    );
    let merged = Command::new(&binary)
        .args([&format!("merge-{op}"), "--out"])
        .arg(&args.out)
        .env("PG_BENCH_LABEL", label)
        .status()
        .map_err(|e| e.to_string())?;
    if rust_ok && torch_ok && merged.success() {
        println!("results: {}", args.out.join(format!("{op}.md")).display());
        Ok(())
    } else {
        Err("the benchmark failed; see the output above".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn defaults_and_options_parse() {
        let parsed = parse(&args("all-to-all")).unwrap();
        assert_eq!(parsed.op, Op::AllToAll);
        assert_eq!((parsed.max_bytes, parsed.trials, parsed.nproc), (1 << 30, 5, None));
        assert!(parsed.out.ends_with("bench/results/all-to-all"));
        let parsed = parse(&args("p2p --max-bytes 4096 --trials 3 --nproc 2 --out /tmp/x")).unwrap();
        assert_eq!(parsed.op, Op::P2p);
        assert_eq!((parsed.max_bytes, parsed.trials, parsed.nproc), (4096, 3, Some(2)));
        assert_eq!(parsed.out, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn bad_arguments_are_named() {
        let err = |text: &str| parse(&args(text)).unwrap_err();
        assert!(err("all-to-all --max-bytes lots").contains("--max-bytes: 'lots' is not a whole number"));
        assert!(err("all-to-all --max-bytes 512").contains("below the smallest size, 1024"));
        assert!(err("p2p --trials 0").contains("--trials 0"));
        assert!(err("p2p --nproc 0").contains("--nproc 0"));
        assert!(err("p2p --trials").contains("--trials needs a number"));
        assert!(err("p2p --fast").contains("unknown option --fast"));
        assert!(err("broadcast").contains("'broadcast' is neither all-to-all nor p2p"));
        assert!(err("p2p --out").contains("--out needs a directory"));
    }

    #[test]
    fn help_is_asked_for_and_says_what_runs() {
        assert!(parse(&args("p2p --help")).unwrap().help);
        assert!(parse(&args("all-to-all --max-bytes 1 -h")).unwrap().help, "help wins over a bad value");
        let all_to_all = help(Op::AllToAll);
        assert!(all_to_all.contains("w(a,b) = (a + b) % n + 1"), "the skewed splits are defined");
        assert!(all_to_all.contains("busbw = algbw * (n - 1) / n"));
        assert!(all_to_all.contains("DIR/all-to-all.md"));
        let p2p = help(Op::P2p);
        assert!(p2p.contains(RING_NOT_APPLICABLE));
        assert!(p2p.contains("DIR/p2p.md"));
    }
}
