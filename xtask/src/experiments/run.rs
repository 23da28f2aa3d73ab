//! Running the experiments: the per-rank driver and the `cargo xtask experiments` command.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pg_core::store::{PrefixStore, Store};
use pg_core::{Backend, Device, Options, ProcessGroup};
use serde::{Deserialize, Serialize};

use super::cache::CacheRankRow;
use super::semantics::SemanticsSample;
use super::streams::StreamsRankRow;
use super::{aggregate, cache, semantics, streams};

const HELP: &str = "\
cargo xtask experiments [--backend mock|nccl] [--world-size N] [--json PATH] [--sleep-ms MS] [--cycles N]

The three experiments (communicator cache, completion semantics, streams), printed as tables and written as JSON:
  cache      world + a same-membership group + a same-membership high-priority group, 3 all_reduce each
  semantics  a sleep kernel on the current stream, then a 16 MiB all_reduce, under four wait configurations
  streams    which stream ran the communication kernels and which the sleep kernel, per rank

Options:
  --backend mock|nccl  the simulated backend (default) or real GPUs (one process per GPU; see gpu-test)
  --world-size N       ranks (default 4)
  --json PATH          also write the results as JSON to PATH
  --sleep-ms MS        the sleep kernel's duration (default 40.4, an 80M-cycle sleep on an H200)
  --cycles N           cycles per order in the semantics experiment (default 5)
";

/// What the experiments are run with.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExperimentConfig {
    /// The number of ranks.
    pub world_size: usize,
    /// The sleep kernel's duration in the semantics and streams experiments.
    pub sleep: Duration,
    /// Cycles per order in the semantics experiment.
    pub cycles: usize,
    /// The all_reduce size in the semantics experiment, in bytes.
    pub message_bytes: usize,
    /// All_reduce ops per group in the cache experiment.
    pub ops_per_group: usize,
}

impl Default for ExperimentConfig {
    fn default() -> Self {
        Self {
            world_size: 4,
            sleep: Duration::from_micros(40_400),
            cycles: 5,
            message_bytes: 16 << 20,
            ops_per_group: 3,
        }
    }
}

/// One rank's view: its device, the job's store, and the kernel log (through the conformance capabilities).
pub struct RankContext<B: Backend> {
    /// This rank.
    pub rank: usize,
    /// The device this rank runs on.
    pub device: B::Device,
    /// The job's store (the root of every group's prefix).
    pub store: Arc<dyn Store>,
    /// The experiments' settings.
    pub config: ExperimentConfig,
    /// The world's capabilities: the streams experiment reads the kernel log through them.
    pub caps: Arc<dyn pg_conformance::Capabilities<B>>,
}

impl<B: Backend> std::fmt::Debug for RankContext<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RankContext").field("rank", &self.rank).field("config", &self.config).finish_non_exhaustive()
    }
}

impl<B: Backend> RankContext<B> {
    /// A group over every rank, named like PyTorch's `new_group` names them, under `default_pg/{name}/`.
    pub fn group(&self, name: &str, options: pg_core::OptionsBuilder) -> pg_core::Result<ProcessGroup<B>> {
        let default_pg: Arc<dyn Store> = Arc::new(PrefixStore::new("default_pg", Arc::clone(&self.store)));
        let store = Arc::new(PrefixStore::new(format!("{name}/"), default_pg));
        let options: Options = options.group_name(name.to_owned()).build();
        ProcessGroup::new(store, self.rank, self.config.world_size, self.device.clone(), options)
    }
}

/// Everything one rank measured: serialisable, so rank processes can hand it to the launcher.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankResults {
    /// This rank.
    pub rank: usize,
    /// The device's description.
    pub device: String,
    /// The backend's versions.
    pub versions: Vec<(String, String)>,
    /// Per group, what this rank saw in the cache experiment.
    pub cache: Vec<CacheRankRow>,
    /// Every sample of the semantics experiment.
    pub semantics: Vec<SemanticsSample>,
    /// This rank's row of the streams experiment.
    pub streams: StreamsRankRow,
}

/// Runs the three experiments on one rank.
pub fn run_rank<B: Backend>(ctx: &RankContext<B>) -> pg_core::Result<RankResults> {
    Ok(RankResults {
        rank: ctx.rank,
        device: ctx.device.describe(),
        versions: ctx.device.versions(),
        cache: cache::run(ctx)?,
        semantics: semantics::run(ctx)?,
        streams: streams::run(ctx)?,
    })
}

struct Args {
    backend: String,
    json: Option<PathBuf>,
    config: ExperimentConfig,
}

fn parse(args: &[String]) -> Result<Option<Args>, String> {
    let mut parsed = Args { backend: "mock".to_owned(), json: None, config: ExperimentConfig::default() };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--backend" => parsed.backend = value("--backend")?,
            "--json" => parsed.json = Some(PathBuf::from(value("--json")?)),
            "--world-size" => {
                let n = value("--world-size")?;
                parsed.config.world_size = n.parse().map_err(|_| format!("--world-size {n}: not a number"))?;
                if parsed.config.world_size == 0 {
                    return Err("--world-size must be at least 1".to_owned());
                }
            }
            "--sleep-ms" => {
                let ms = value("--sleep-ms")?;
                let ms: f64 = ms.parse().map_err(|_| format!("--sleep-ms {ms}: not a number"))?;
                if !(0.0..=60_000.0).contains(&ms) {
                    return Err("--sleep-ms must be between 0 and 60000".to_owned());
                }
                parsed.config.sleep = Duration::from_secs_f64(ms / 1000.0);
            }
            "--cycles" => {
                let n = value("--cycles")?;
                parsed.config.cycles = n.parse().map_err(|_| format!("--cycles {n}: not a number"))?;
            }
            other => return Err(format!("unknown option '{other}'\n\n{HELP}")),
        }
    }
    Ok(Some(parsed))
}

/// `cargo xtask experiments`.
pub fn main(args: &[String]) -> Result<(), String> {
    let Some(args) = parse(args)? else {
        print!("{HELP}");
        return Ok(());
    };
    let ranks = match args.backend.as_str() {
        "mock" => run_mock(&args.config)?,
        "nccl" => crate::gpu::run_experiments(&args.config)?,
        other => return Err(format!("unknown backend '{other}' (expected mock or nccl)")),
    };
    let report = aggregate(&args.backend, &args.config, ranks)?;
    print!("{}", report.tables());
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| format!("serialising the report: {e}"))?;
        std::fs::write(path, json + "\n").map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    match report.all_correct() {
        true => Ok(()),
        false => Err("some rank operations gave wrong results (see the tables)".to_owned()),
    }
}

fn run_mock(config: &ExperimentConfig) -> Result<Vec<RankResults>, String> {
    let world = pg_mock::World::new(pg_mock::WorldConfig { devices: config.world_size, ..Default::default() });
    let store = world.store();
    let caps = pg_conformance::mock::capabilities(&world);
    let results = world.run(config.world_size, |rank, device| {
        let ctx = RankContext::<pg_mock::Mock> {
            rank,
            device,
            store: Arc::clone(&store),
            config: config.clone(),
            caps: Arc::clone(&caps),
        };
        run_rank(&ctx)
    });
    results.into_iter().enumerate().map(|(rank, r)| r.map_err(|e| format!("rank {rank}: {e}"))).collect()
}
