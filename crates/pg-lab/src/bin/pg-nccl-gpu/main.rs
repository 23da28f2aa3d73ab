//! `pg-nccl-gpu`: the real-GPU suite of pg, one process per GPU.
//!
//! `pg-nccl-gpu run [--nproc N] [--tasks conformance,experiments,interop,bench,bench-all-to-all,bench-p2p,first]
//! [--out DIR] [bench options]` finds the GPUs, starts one rank process per GPU for each task (the `first` task: a
//! fresh set per trial; environment as torchrun sets it: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `MASTER_ADDR=127.0.0.1`, `MASTER_PORT`; and `NCCL_NVLS_ENABLE=0`), waits for them, then merges their results into
//! `DIR/<task>.json` and prints the tables. It exits non-zero if a check failed, a rank failed, or there is no GPU.
//!
//! `pg-nccl-gpu rank --task T --out DIR` is one rank (started by `run`, or by torchrun: rank and world from
//! torchrun's variables, the store torchrun's agent hosts when it says so, the GPU `LOCAL_RANK % GPUs`);
//! `pg-nccl-gpu merge --task T --out DIR` reports the ranks' results when another launcher started them.
//!
//! The ranks rendezvous over env:// (pg-store's TCP store, hosted by rank 0) on 127.0.0.1 and a free port.
#![deny(unsafe_code)]

mod bench;
mod bench_exchange;
mod conformance;
mod experiments;
mod first;
#[allow(unsafe_code)] // A reason: raw device pointers from elsewhere are an unsafe constructor by design.
mod interop;
mod mixed;
mod procs;
mod profile;
mod report;
mod report_exchange;
mod report_train;
mod util;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_core::store::Store;
use serde_json::{json, Value};

const USAGE: &str = "\
usage: pg-nccl-gpu run [--nproc N] [--tasks conformance,experiments,interop,bench,first,...] [--out DIR]
                       [--bench-max-bytes N] [--bench-trials N] [--bench-profile nvlink|network] [--timeout-s N]
                       [--stall-s N]   (conformance: ranks that finish no case for N s, default 180, are stopped
                       with their stacks in DIR/stalls/ and started again at the furthest case reached)
       pg-nccl-gpu rank --task TASK --out DIR [same bench options]   (one rank; torchrun can start it too:
                       torchrun ... --no-python pg-nccl-gpu rank --task conformance --out DIR)
       pg-nccl-gpu merge --task TASK --out DIR [--nproc N]   (the report of ranks another launcher started)
       pg-nccl-gpu mixed --out DIR   (one rank of PyTorch's default group beside PyTorch ranks running
                       torch_mixed.py: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them)
       pg-nccl-gpu merge-mixed --out DIR   (DIR/mixed-N-pgR/mixed-rank*.json into DIR/mixed-nccl-N.{md,json})
       pg-nccl-gpu merge-bench --out DIR   (joins DIR/bench.json and DIR/torch.json into DIR/allreduce.{md,json})
       pg-nccl-gpu merge-all-to-all --out DIR   (DIR/bench-all-to-all.json and DIR/torch-all-to-all.json
                                                 into DIR/all-to-all.{md,json})
       pg-nccl-gpu merge-p2p --out DIR   (DIR/bench-p2p.json and DIR/torch-p2p.json into DIR/p2p.{md,json})
       pg-nccl-gpu merge-train --out DIR [--buckets 1,2]   (joins DIR/train-pg.json and DIR/train-torch.json, or per
                       layout K DIR/train-pg-bK.json and DIR/train-torch-bK.json, into DIR/train-mlp.{md,json})
tasks: conformance, experiments, interop, bench (all_reduce), bench-all-to-all (all_to_all_single, equal and skewed
splits), bench-p2p (batch_isend_irecv ring: send to rank + 1, receive from rank - 1; needs 2 ranks)
";

/// Settings shared by the launcher and the ranks.
#[derive(Debug, Clone)]
pub struct Settings {
    pub nproc: Option<usize>,
    pub tasks: Vec<String>,
    pub out: PathBuf,
    pub bench_max_bytes: usize,
    pub bench_trials: usize,
    /// What the benchmarks are sized for (`--bench-profile nvlink|network`).
    pub bench_profile: profile::Profile,
    /// The gradient-bucket layouts `merge-train --buckets 1,2` joins (empty: the one pair of runs).
    pub train_buckets: Vec<usize>,
    pub timeout: Duration,
    /// How long the conformance task's ranks may go without finishing a case before they are stopped
    /// (`--stall-s`).
    pub stall: Duration,
}

fn parse(args: &[String]) -> Result<(String, Settings, Option<String>), String> {
    let mut settings = Settings {
        nproc: None,
        tasks: vec!["conformance".into(), "experiments".into()],
        out: PathBuf::from("gpu-results"),
        bench_max_bytes: 1 << 30,
        bench_trials: 5,
        bench_profile: profile::Profile::Nvlink,
        train_buckets: Vec::new(),
        timeout: Duration::from_secs(600),
        stall: Duration::from_secs(180),
    };
    let (command, rest) = args.split_first().ok_or_else(|| USAGE.to_owned())?;
    let mut task = None;
    let mut it = rest.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"));
        let number = |v: String| v.parse::<usize>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--nproc" => settings.nproc = Some(number(value()?)?),
            "--tasks" => settings.tasks = value()?.split(',').map(str::to_owned).collect(),
            "--task" => task = Some(value()?),
            "--out" => settings.out = PathBuf::from(value()?),
            "--bench-max-bytes" => settings.bench_max_bytes = number(value()?)?,
            "--bench-trials" => settings.bench_trials = number(value()?)?.max(1),
            "--buckets" => {
                settings.train_buckets = value()?.split(',').map(|k| number(k.to_owned())).collect::<Result<_, _>>()?
            }
            "--bench-profile" => settings.bench_profile = profile::Profile::parse(&value()?)?,
            "--timeout-s" => settings.timeout = Duration::from_secs(number(value()?)? as u64),
            "--stall-s" => settings.stall = Duration::from_secs(number(value()?)?.max(1) as u64),
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    Ok((command.clone(), settings, task))
}

fn main() -> ExitCode {
    // pg's log (an abort, a watchdog's finding) on standard error, when RUST_LOG names what to show.
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG") {
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, settings, task) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    let result = match command.as_str() {
        "run" => launch(&settings),
        "rank" => match task {
            Some(task) => run_rank(&task, &settings),
            None => Err(format!("rank needs --task\n{USAGE}")),
        },
        "ptx" => {
            print!("{}", pg_nccl::pg_cuda::kernels_ptx());
            Ok(())
        }
        "merge" => match task {
            Some(task) => merge_ranks(&settings, &task),
            None => Err(format!("merge needs --task\n{USAGE}")),
        },
        "mixed" => env_usize("RANK").and_then(|rank| {
            if std::env::var("NCCL_NVLS_ENABLE").as_deref() != Ok("0") {
                return Err("NCCL_NVLS_ENABLE=0 must be set (NVLink multicast stays off)".into());
            }
            placed_gpu(rank).and_then(|gpu| mixed::run_nccl(&settings.out, rank, gpu))
        }),
        "merge-mixed" => {
            let label = std::env::var("PG_RUN_LABEL").unwrap_or_default();
            mixed::merge(&settings.out, &label).and_then(|passed| match passed {
                true => Ok(()),
                false => Err("a mixed-group check failed (see mixed-nccl-N.md)".into()),
            })
        }
        "merge-bench" => {
            let label = std::env::var("PG_BENCH_LABEL").unwrap_or_default();
            report::merge_bench(&settings.out, &label).map(drop)
        }
        "merge-all-to-all" | "merge-p2p" => {
            let label = std::env::var("PG_BENCH_LABEL").unwrap_or_default();
            let op = command.trim_start_matches("merge-");
            match report_exchange::merge(&settings.out, op, &label) {
                Ok(true) => Ok(()),
                Ok(false) => Err(format!("the {op} results miss a contestant at some size")),
                Err(message) => Err(message),
            }
        }
        "merge-train" => {
            let label = std::env::var("PG_RUN_LABEL").unwrap_or_default();
            let merged = match settings.train_buckets.is_empty() {
                true => report_train::merge_train(&settings.out, &label),
                false => report_train::merge_train_layouts(&settings.out, &label, &settings.train_buckets),
            };
            merged.and_then(|passed| match passed {
                true => Ok(()),
                false => Err("the training runs did not pass (see train-mlp.md)".into()),
            })
        }
        other => Err(format!("unknown command {other}\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("pg-nccl-gpu: {message}");
            ExitCode::FAILURE
        }
    }
}

// ===== the launcher =====

fn launch(settings: &Settings) -> Result<(), String> {
    let gpus = pg_nccl::available().map_err(|err| format!("no GPU to test on: {err}"))?;
    let nproc = settings.nproc.unwrap_or(gpus);
    if nproc == 0 {
        return Err("--nproc 0: a job needs at least one rank".into());
    }
    std::fs::create_dir_all(&settings.out).map_err(|e| format!("{}: {e}", settings.out.display()))?;
    println!(
        "Found {gpus} GPU(s); {}; tasks: {}",
        pg_nccl::placement::describe(nproc, gpus),
        settings.tasks.join(", ")
    );
    let mut failed = Vec::new();
    for task in &settings.tasks {
        let started = Instant::now();
        let launched = match task.as_str() {
            // Each trial of the first collective is a fresh set of processes.
            "first" => first::launch(settings, nproc, launch_task),
            _ => launch_task(settings, task, nproc),
        };
        match launched {
            // A report that cannot be made (a rank's result that does not parse) fails its task, not the tasks
            // after it.
            Ok(ranks) => match report::task(settings, task, &ranks) {
                Ok(ok) => {
                    println!(
                        "[{task}] {} in {:.1} s",
                        if ok { "passed" } else { "FAILED" },
                        started.elapsed().as_secs_f64()
                    );
                    if !ok {
                        failed.push(task.clone());
                    }
                }
                Err(message) => {
                    println!("[{task}] FAILED: its report: {message}");
                    failed.push(task.clone());
                }
            },
            Err(message) => {
                println!("[{task}] FAILED: {message}");
                failed.push(task.clone());
            }
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failed.join(", ")))
    }
}

/// Runs one task on `nproc` rank processes; returns each rank's result.
fn launch_task(settings: &Settings, task: &str, nproc: usize) -> Result<Vec<Value>, String> {
    if task == "conformance" {
        return conformance::launch(settings, nproc);
    }
    let mut children = procs::start_ranks(settings, task, nproc, &[])?;
    match procs::wait_ranks(&mut children, Instant::now() + settings.timeout, None)? {
        procs::Ended::Exited(statuses) => procs::collect_ranks(settings, task, statuses),
        _ => {
            procs::stop(&mut children);
            Err(format!("timed out after {} s", settings.timeout.as_secs()))
        }
    }
}

fn rank_file(out: &Path, task: &str, rank: usize) -> PathBuf {
    out.join(format!("{task}-rank{rank}.json"))
}

// ===== one rank =====

/// What a rank knows about itself.
#[derive(Debug)]
pub struct Rank {
    pub rank: usize,
    pub world: usize,
    pub device: pg_nccl::Device,
    pub store: Arc<dyn Store>,
    pub settings: Settings,
}

fn env_usize(name: &str) -> Result<usize, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set"))?.parse().map_err(|e| format!("{name}: {e}"))
}

fn run_rank(task: &str, settings: &Settings) -> Result<(), String> {
    let rank = env_usize("RANK")?;
    let outcome = placed_gpu(rank).and_then(|gpu| rank_body(task, rank, gpu, settings));
    let value = match &outcome {
        Ok(value) => value.clone(),
        Err(message) => json!({ "rank": rank, "error": message }),
    };
    std::fs::create_dir_all(&settings.out).map_err(|e| e.to_string())?;
    let path = rank_file(&settings.out, task, rank);
    std::fs::write(&path, serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    outcome.map(drop)
}

/// This rank's GPU: `LOCAL_RANK % GPUs`. Under a launcher that put more local ranks than GPUs on this machine
/// (torchrun with `--nproc-per-node` above the GPU count, as in a multi-node rehearsal on one GPU), the process
/// first starts itself again with a host id of its own for NCCL ([`pg_nccl::placement::place_launched`]), before
/// anything has joined the store; pg's own launcher has placed its ranks already, and nothing changes for them.
fn placed_gpu(rank: usize) -> Result<usize, String> {
    let var = |name: &str| std::env::var(name).ok();
    let local_rank = var("LOCAL_RANK").map(|_| env_usize("LOCAL_RANK")).transpose()?.unwrap_or(rank);
    let local_world = var("LOCAL_WORLD_SIZE").map(|_| env_usize("LOCAL_WORLD_SIZE")).transpose()?.unwrap_or(1);
    let gpus = pg_nccl::available().map_err(|err| format!("no GPU here: {err}"))?;
    let placement = pg_nccl::placement::place_launched(rank, local_rank, local_world, gpus, &var);
    if placement.env.is_empty() {
        return Ok(placement.gpu);
    }
    restart_with(&placement.env)
}

#[cfg(unix)]
fn restart_with(vars: &[(&'static str, String)]) -> Result<usize, String> {
    use std::os::unix::process::CommandExt as _;
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    println!("rank {}: restarting with {vars:?}", std::env::var("RANK").unwrap_or_default());
    // `exec` returns only when it failed.
    let err = Command::new(exe).args(std::env::args_os().skip(1)).envs(vars.iter().cloned()).exec();
    Err(format!("restarting with {vars:?}: {err}"))
}

#[cfg(not(unix))]
fn restart_with(vars: &[(&'static str, String)]) -> Result<usize, String> {
    Err(format!("set {vars:?} for this rank: several local ranks share a GPU"))
}

/// `merge --task T --out DIR [--nproc N]`: reports a task whose ranks another launcher started (torchrun), from
/// their `DIR/T-rankR.json` (ranks 0..N; without `--nproc`, every consecutive rank file from rank 0; the
/// conformance task with `--nproc` also from the progress of ranks that left no result).
fn merge_ranks(settings: &Settings, task: &str) -> Result<(), String> {
    let ranks = match (settings.nproc, task) {
        // A conformance rank that left no result still left what it finished.
        (Some(nproc), "conformance") => conformance::read_ranks(settings, nproc)?,
        _ => read_rank_files(settings, task)?,
    };
    match report::task(settings, task, &ranks)? {
        true => Ok(()),
        false => Err(format!("{task} failed (see {}/{task}.md)", settings.out.display())),
    }
}

/// The result files `DIR/T-rankR.json` of ranks 0..N (without `--nproc`, every consecutive one from rank 0).
fn read_rank_files(settings: &Settings, task: &str) -> Result<Vec<Value>, String> {
    let mut ranks = Vec::new();
    for rank in 0.. {
        if settings.nproc.is_some_and(|n| rank >= n) {
            break;
        }
        let path = rank_file(&settings.out, task, rank);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(_) if settings.nproc.is_none() && rank > 0 => break,
            Err(e) => return Err(format!("rank {rank} left no result at {}: {e}", path.display())),
        };
        let value: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if !value["error"].is_null() {
            return Err(format!("rank {rank} failed: {}", value["error"]));
        }
        ranks.push(value);
    }
    Ok(ranks)
}

fn rank_body(task: &str, rank: usize, gpu: usize, settings: &Settings) -> Result<Value, String> {
    if std::env::var("NCCL_NVLS_ENABLE").as_deref() != Ok("0") {
        return Err("NCCL_NVLS_ENABLE=0 must be set (NVLink multicast stays off)".into());
    }
    let rendezvous = pg_core::store::rendezvous::env_rendezvous(Duration::from_secs(120))
        .map_err(|e| format!("env:// rendezvous: {e}"))?;
    if rendezvous.rank != rank {
        return Err(format!("RANK {rank} but the rendezvous says {}", rendezvous.rank));
    }
    let world = rendezvous.world_size;
    let store: Arc<dyn Store> = rendezvous.store;
    let device = pg_nccl::Device::new(gpu).map_err(|e| e.to_string())?;
    let ctx = Rank { rank, world, device, store, settings: settings.clone() };
    let mut value = match task {
        "conformance" => conformance::run(&ctx),
        "experiments" => experiments::run(&ctx),
        "bench" => bench::run(&ctx),
        "bench-all-to-all" => bench_exchange::run_all_to_all(&ctx),
        "bench-p2p" => bench_exchange::run_p2p(&ctx),
        "interop" => interop::run(&ctx),
        "first-lazy" | "first-eager" => first::run(&ctx, task == "first-eager"),
        other => return Err(format!("unknown task {other}")),
    }?;
    value["rank"] = json!(rank);
    value["world_size"] = json!(world);
    value["versions"] =
        json!(pg_core::Device::versions(&ctx.device).into_iter().collect::<std::collections::BTreeMap<_, _>>());
    Ok(value)
}
