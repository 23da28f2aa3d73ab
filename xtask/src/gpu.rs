//! Real-GPU runs of the experiments: one process per GPU over env:// on loopback, each running the same generic
//! experiment code as the simulated backend, the launcher joining their results.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pg_lab::launch::{self, Job};

use super::experiments::{run_rank, ExperimentConfig, RankContext, RankResults};

/// The hidden subcommand a rank process runs.
pub const RANK_TASK: &str = "__experiments-rank";

/// How long the launcher lets the rank processes run before it stops them.
const JOB_TIMEOUT: Duration = Duration::from_secs(600);

/// Runs the experiments on the NCCL backend, one process per GPU, and collects every rank's results.
pub fn run_experiments(config: &ExperimentConfig) -> Result<Vec<RankResults>, String> {
    let payload = serde_json::to_string(config).map_err(|e| e.to_string())?;
    let outputs = launch(RANK_TASK, &payload, config.world_size, &[])?;
    outputs.iter().map(|text| serde_json::from_str(text).map_err(|e| format!("a rank's results: {e}"))).collect()
}

/// Starts `world_size` copies of this executable running `task OUT_PATH PAYLOAD` through pg-lab's launcher (rank r
/// on GPU r % gpus, several ranks on a GPU over NCCL's network transport, [`pg_nccl::placement`], with torchrun's
/// environment on 127.0.0.1), waits for them, and returns what each wrote to its out path (empty for a rank in
/// `may_die`, which is allowed to exit abnormally).
pub fn launch(task: &str, payload: &str, world_size: usize, may_die: &[usize]) -> Result<Vec<String>, String> {
    let ranks = launch_ranks(task, payload, world_size, may_die)?;
    let failed: Vec<String> = ranks.iter().filter_map(|r| r.failure.clone()).collect();
    if !failed.is_empty() {
        return Err(failed.join("; "));
    }
    ranks
        .into_iter()
        .enumerate()
        .map(|(rank, r)| match r.output {
            Some(text) => Ok(text),
            None if may_die.contains(&rank) => Ok(String::new()),
            None => Err(format!("rank {rank} wrote no results")),
        })
        .collect()
}

/// How one rank process of [`launch_ranks`] ended.
#[derive(Debug, Clone)]
pub struct RankEnd {
    /// What it wrote to its out path, if anything.
    pub output: Option<String>,
    /// Why it counts as failed (an exit status or signal it was not allowed, or still running at the job's
    /// timeout); `None` if it ended as allowed.
    pub failure: Option<String>,
}

/// [`launch`], giving each rank's output and how it ended rather than failing the whole job for one rank.
pub fn launch_ranks(task: &str, payload: &str, world_size: usize, may_die: &[usize]) -> Result<Vec<RankEnd>, String> {
    let gpus = pg_nccl::available().map_err(|e| format!("the nccl backend cannot run here: {e}"))?;
    if world_size == 0 {
        return Err("a world of 0 ranks".into());
    }
    println!("{}", pg_nccl::placement::describe(world_size, gpus));
    let port = launch::free_port()?;
    let dir = std::env::temp_dir().join(format!("pg-{task}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
    // `PG_RANK_WRAPPER` (e.g. `gdb -batch -ex run -ex bt --args`) runs each rank under a tool, for a crash's
    // backtrace.
    let wrapper: Vec<String> =
        std::env::var("PG_RANK_WRAPPER").unwrap_or_default().split_whitespace().map(str::to_owned).collect();
    let job = Job { exe, wrapper, world: world_size, gpus, port };
    let args = |rank: usize| -> Vec<OsString> { vec![task.into(), out_path(&dir, rank).into(), payload.into()] };
    let mut children = job.start(&args, &[])?;
    // Every rank exited, or the job's time ran out: each child's own state says which.
    launch::wait_ranks(&mut children, Instant::now() + JOB_TIMEOUT, None)?;
    let mut failures: Vec<Option<String>> = vec![None; world_size];
    for (rank, child) in children.iter_mut().enumerate() {
        match child.try_wait() {
            Ok(Some(status)) if status.success() || may_die.contains(&rank) => {}
            Ok(Some(status)) => failures[rank] = Some(format!("rank {rank} exited with {status}")),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                failures[rank] = Some(format!("rank {rank} still running after {JOB_TIMEOUT:?}: killed"));
            }
            Err(e) => failures[rank] = Some(format!("rank {rank}: {e}")),
        }
    }
    let ends = failures
        .into_iter()
        .enumerate()
        .map(|(rank, failure)| RankEnd { output: std::fs::read_to_string(out_path(&dir, rank)).ok(), failure })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(ends)
}

/// A rank process's start: env:// rendezvous (rank 0 hosts the store), then the GPU `LOCAL_RANK` names.
pub fn join_job(timeout: Duration) -> Result<(pg_core::store::rendezvous::Rendezvous, pg_nccl::Device), String> {
    let rendezvous = pg_core::store::rendezvous::env_rendezvous(timeout).map_err(|e| e.to_string())?;
    let local_rank = rendezvous.local_rank.unwrap_or(rendezvous.rank);
    let device = pg_nccl::Device::new(local_rank).map_err(|e| format!("device {local_rank}: {e}"))?;
    Ok((rendezvous, device))
}

fn out_path(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank{rank}.json"))
}

/// `xtask __experiments-rank OUT CONFIG_JSON`: one rank of `run_experiments`, rendezvousing through env://.
pub fn rank_main(args: &[String]) -> Result<(), String> {
    let [out, config] = args else {
        return Err(format!("usage: {RANK_TASK} OUT_JSON CONFIG_JSON"));
    };
    let config: ExperimentConfig = serde_json::from_str(config).map_err(|e| format!("config: {e}"))?;
    let (rendezvous, device) = join_job(Duration::from_secs(300))?;
    let caps = pg_lab::conformance::capabilities(rendezvous.rank, &device);
    let ctx = RankContext::<pg_nccl::Nccl> { rank: rendezvous.rank, device, store: rendezvous.store, config, caps };
    let results = run_rank(&ctx).map_err(|e| format!("rank {}: {e}", ctx.rank))?;
    let json = serde_json::to_string(&results).map_err(|e| e.to_string())?;
    std::fs::write(out, json).map_err(|e| format!("{out}: {e}"))
}
