//! `ddp_mlp`: a data-parallel training loop written as a downstream crate would, with only pg's public API and
//! cudarc. A 2-layer MLP learns a teacher network on synthetic data; its gradients are all-reduced in two
//! DDP-style buckets while backward goes on, or in one after it (`--buckets 1`; see `train.rs`).
//!
//! ```text
//! ddp_mlp --backend mock|nccl --world-size N [--steps S] [--batch B] [--lr LR] [--buckets 1|2] [--json PATH]
//!         [--kill RANK:STEP [--grow RANK:STEP]]
//! ```
//!
//! `--kill RANK:STEP` runs the elastic loop (`elastic.rs`): world rank RANK dies at the start of step STEP (on the
//! mock its thread stops; on NCCL its process aborts), the others revoke, agree, shrink and go on with the global
//! batch redistributed; the JSON gains `"recoveries"` (step, from, to, detect_ms, recover_ms). `--grow RANK:STEP`
//! (the same RANK, a later STEP) brings that rank's replacement back at the start of step STEP: it joins with
//! `ProcessGroup::join_grown` (on the mock the dead rank's thread plays it; on NCCL the process does: with
//! `ncclCommGrow` on NCCL 2.29, by a rendezvous before) while the survivors grow the group back; the JSON gains `"growths"` (step, from, to, ms).
//!
//! `mock` runs N simulated ranks as threads of this process (host arithmetic on the mock's buffers). `nccl` is
//! one process per GPU: at world size 1 it runs alone; otherwise start it as torchrun would (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`; env:// rendezvous), on GPU `LOCAL_RANK`. cuBLAS
//! is loaded at run time (`libcublas.so.13`, or `.12`, on the library path).
//! Prints each step's loss and time; `--json` writes
//! `{"backend", "world_size", "global_batch", "model", "steps": [{"step", "loss", "ms"}]}` (rank 0 only).
#![deny(unsafe_code)]

#[allow(unsafe_code)] // A reason: cuBLAS calls and kernel launches through cudarc are unsafe by signature.
mod cuda;
mod elastic;
mod host;
#[cfg(test)]
mod tests;
mod train;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use pg_core::{Options, ProcessGroup, StreamGuard};
use serde_json::json;
use train::{Config, StepRecord};

/// A run's result on the rank that reports: its curve, recoveries, grows, and its rank.
type Outcome = (Vec<StepRecord>, Vec<elastic::Recovery>, Vec<elastic::Growth>, usize);

const USAGE: &str =
    "usage: ddp_mlp --backend mock|nccl --world-size N [--steps S] [--batch B] [--lr LR] [--seed N] [--buckets 1|2] \
     [--json PATH] [--kill RANK:STEP [--grow RANK:STEP]]";

#[derive(Debug)]
struct Args {
    backend: String,
    world_size: usize,
    config: Config,
    json: Option<String>,
    /// The elastic loop's death: world rank and step.
    kill: Option<(usize, usize)>,
    /// The step at which the dead rank's replacement joins (`--grow RANK:STEP`, RANK the dead one).
    grow: Option<usize>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed =
        Args { backend: "mock".into(), world_size: 1, config: Config::default(), json: None, kill: None, grow: None };
    let mut grow = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |v: &str| v.parse::<usize>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--backend" => parsed.backend = value.clone(),
            "--world-size" => parsed.world_size = number(value)?,
            "--steps" => parsed.config.steps = number(value)?,
            "--batch" => parsed.config.batch = number(value)?,
            "--seed" => parsed.config.seed = number(value)? as u64,
            "--buckets" => parsed.config.buckets = number(value)?,
            "--lr" => parsed.config.lr = value.parse().map_err(|e| format!("--lr {value}: {e}"))?,
            "--json" => parsed.json = Some(value.clone()),
            "--kill" => {
                let (rank, step) =
                    value.split_once(':').ok_or_else(|| format!("--kill {value}: expected RANK:STEP"))?;
                parsed.kill = Some((number(rank)?, number(step)?));
            }
            "--grow" => {
                let (rank, step) =
                    value.split_once(':').ok_or_else(|| format!("--grow {value}: expected RANK:STEP"))?;
                grow = Some((number(rank)?, number(step)?));
            }
            other => return Err(format!("unknown option {other}\n{USAGE}")),
        }
    }
    if parsed.world_size == 0 {
        return Err("--world-size must be at least 1".into());
    }
    if let Some((rank, step)) = grow {
        match parsed.kill {
            Some((dead, death)) if dead == rank && death < step => parsed.grow = Some(step),
            _ => {
                return Err(format!(
                    "--grow {rank}:{step} brings back a rank that --kill killed before that step (--kill is {:?})",
                    parsed.kill
                ))
            }
        }
    }
    if !matches!(parsed.backend.as_str(), "mock" | "nccl") {
        return Err(format!("--backend {}: expected mock or nccl", parsed.backend));
    }
    Ok(parsed)
}

/// Runs `body` on each of `world_size` simulated ranks, each with its host arithmetic and a group made with
/// `options`; the ranks' results, rank 0's first.
fn on_mock_ranks<T: Send>(
    world_size: usize,
    options: &Options,
    body: impl Fn(&host::HostMath, &ProcessGroup<pg_mock::Mock>) -> pg_core::Result<T> + Sync,
) -> pg_core::Result<Vec<T>> {
    let world = pg_mock::World::new(pg_mock::WorldConfig { devices: world_size, ..Default::default() });
    let store = world.store();
    world
        .run(world_size, |rank, device| {
            let pg = ProcessGroup::<pg_mock::Mock>::new(
                Arc::clone(&store),
                rank,
                world_size,
                device.clone(),
                options.clone(),
            )?;
            body(&host::HostMath::new(device), &pg)
        })
        .into_iter()
        .collect()
}

/// Every simulated rank's curve (they must agree), rank 0's first. The group reads the environment as a user's
/// program would (`PG_TRACE=DIR` writes each rank's timeline, in virtual time).
fn run_mock(world_size: usize, config: &Config) -> pg_core::Result<Vec<Vec<StepRecord>>> {
    on_mock_ranks(world_size, &Options::builder().build_with_env()?, |math, pg| {
        let records = train::train(math, pg, config);
        pg.shutdown()?;
        records
    })
}

/// The elastic group's op timeout on the mock, where a dead rank's peers find it by this timeout.
const MOCK_OP_TIMEOUT: Duration = Duration::from_secs(2);

/// The elastic group's op timeout on NCCL. It also bounds the creation of the communicator, which over sockets
/// on a loaded machine can take seconds; a dead rank is found long before it (its neighbours' sockets close, and
/// they tell the others through the store).
const NCCL_OP_TIMEOUT: Duration = Duration::from_secs(10);

/// Options of a group that revokes itself on a dead peer (found by its sockets, a peer's report, or `timeout`; with
/// `liveness`, by the store server seeing the dead process's connection close). The mock's elastic run keeps
/// liveness off: its store is in-process, and its dead rank is found by the timeout.
fn elastic_options(timeout: Duration, liveness: bool) -> Options {
    Options::builder()
        .timeout(timeout)
        .liveness(liveness)
        .revoke_on_error(true)
        .dump_on_timeout(false)
        .watchdog_period(Duration::from_millis(10))
        .build()
}

/// The elastic loop's settings for a death at `kill`, and the replacement's rejoin at step `grow`.
fn elastic(kill: (usize, usize), grow: Option<usize>) -> elastic::Elastic {
    elastic::Elastic { agree_timeout: Duration::from_millis(500), death: Some(kill), rejoin: grow }
}

/// Every simulated rank's elastic run, rank by rank.
fn run_mock_elastic(
    world_size: usize,
    config: &Config,
    (kill, grow): ((usize, usize), Option<usize>),
) -> pg_core::Result<Vec<elastic::ElasticRun>> {
    let settings = elastic(kill, grow);
    on_mock_ranks(world_size, &elastic_options(MOCK_OP_TIMEOUT, false), |math, pg| {
        elastic::train_elastic(math, pg, config, &settings)
    })
}

/// This process's rank of an NCCL job: its curve, its recoveries and grows (elastic loop only), and its rank.
fn run_nccl(
    world_size: usize,
    config: &Config,
    (kill, grow): (Option<(usize, usize)>, Option<usize>),
) -> pg_core::Result<Outcome> {
    let (store, rank, size, ordinal) = if std::env::var_os("RANK").is_some() {
        let rendezvous = pg_core::store::rendezvous::env_rendezvous(Duration::from_secs(300))
            .map_err(|e| pg_core::Error::invalid(format!("env:// rendezvous: {e}")))?;
        let ordinal = rendezvous.local_rank.unwrap_or(rendezvous.rank);
        (rendezvous.store, rendezvous.rank, rendezvous.world_size, ordinal)
    } else if world_size == 1 {
        let store: Arc<dyn pg_core::store::Store> = Arc::new(pg_core::store::HashStore::new());
        (store, 0, 1, 0)
    } else {
        return Err(pg_core::Error::invalid(format!(
            "--world-size {world_size} on nccl is one process per GPU: start it with torchrun's variables (RANK, ...)"
        )));
    };
    if size != world_size {
        return Err(pg_core::Error::invalid(format!("--world-size {world_size} but WORLD_SIZE={size}")));
    }
    let device = pg_nccl::Device::new(ordinal)?;
    let (math, stream) = cuda::CudaMath::new(&device)?;
    // The caller's stream is the current one: collectives order after its kernels, `wait()` orders it after them.
    let _guard = StreamGuard::<pg_nccl::Nccl>::new(&device, &stream);
    if let Some(kill) = kill {
        let pg = ProcessGroup::<pg_nccl::Nccl>::new(
            store,
            rank,
            size,
            device.clone(),
            elastic_options(NCCL_OP_TIMEOUT, true),
        )?;
        let run = elastic::train_elastic(&math, &pg, config, &elastic(kill, grow))?;
        if run.died && grow.is_none() {
            eprintln!("ddp_mlp: rank {rank} dies at step {} (--kill)", kill.1);
            std::process::abort();
        }
        return Ok((run.records, run.recoveries, run.growths, rank));
    }
    // PyTorch's variables and pg's own apply, as in a user's program (`PG_TRACE=DIR`: each rank's op timeline).
    let options = Options::builder().build_with_env()?;
    let pg = ProcessGroup::<pg_nccl::Nccl>::new(store, rank, size, device.clone(), options)?;
    let records = train::train(&math, &pg, config)?;
    pg.shutdown()?;
    Ok((records, Vec::new(), Vec::new(), rank))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::FAILURE;
        }
    };
    let result = match (args.backend.as_str(), args.kill) {
        ("mock", None) => run_mock(args.world_size, &args.config).and_then(|curves| {
            let first = curves[0].clone();
            match curves.iter().all(|c| c.iter().map(|r| r.loss).eq(first.iter().map(|r| r.loss))) {
                true => Ok((first, Vec::new(), Vec::new(), 0)),
                false => Err(pg_core::Error::Backend("the simulated ranks' loss curves differ".into())),
            }
        }),
        ("mock", Some(kill)) => run_mock_elastic(args.world_size, &args.config, (kill, args.grow)).map(|runs| {
            // The first survivor's run (world rank 0 unless it is the one that dies).
            let run = runs.into_iter().find(|run| !run.died).unwrap_or_default();
            (run.records, run.recoveries, run.growths, 0)
        }),
        _ => run_nccl(args.world_size, &args.config, (args.kill, args.grow)),
    };
    let (records, recoveries, growths, rank) = match result {
        Ok(done) => done,
        Err(err) => {
            eprintln!("ddp_mlp: {err}");
            return ExitCode::FAILURE;
        }
    };
    if rank != 0 {
        return ExitCode::SUCCESS;
    }
    for record in &records {
        println!("step {:4}  loss {:.6}  {:.3} ms", record.step, record.loss, record.ms);
    }
    for r in &recoveries {
        println!(
            "recovered at step {}: world {} -> {}, detection {:.1} ms, recovery {:.1} ms",
            r.step, r.from, r.to, r.detect_ms, r.recover_ms
        );
    }
    for g in &growths {
        println!("grew at step {}: world {} -> {}, {:.1} ms", g.step, g.from, g.to, g.ms);
    }
    if let Some(path) = &args.json {
        let c = &args.config;
        let report = json!({
            "backend": args.backend,
            "world_size": args.world_size,
            "global_batch": c.batch,
            "model": {"input": c.input, "hidden": c.hidden, "output": c.output, "teacher_hidden": c.teacher_hidden,
                      "lr": c.lr, "seed": c.seed, "buckets": c.buckets},
            "steps": records.iter().map(|r| json!({"step": r.step, "loss": r.loss, "ms": r.ms})).collect::<Vec<_>>(),
            "recoveries": recoveries.iter().map(|r| json!({"step": r.step, "from": r.from, "to": r.to,
                "detect_ms": r.detect_ms, "recover_ms": r.recover_ms})).collect::<Vec<_>>(),
            "growths": growths.iter().map(|g| json!({"step": g.step, "from": g.from, "to": g.to, "ms": g.ms}))
                .collect::<Vec<_>>(),
        });
        if let Err(err) = std::fs::write(path, serde_json::to_string_pretty(&report).unwrap_or_default() + "\n") {
            eprintln!("ddp_mlp: {path}: {err}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
