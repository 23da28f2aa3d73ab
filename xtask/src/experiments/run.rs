//! Running the experiments: the per-rank driver and the `cargo xtask experiments` command.

use std::path::{Path, PathBuf};
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
cargo xtask experiments [--backend mock|nccl] [--world-size N] [--json PATH] [--trace DIR] [--sleep-ms MS]
                        [--cycles N]

The three experiments (communicator cache, completion semantics, streams), printed as tables and written as JSON:
  cache      world + a same-membership group + a same-membership high-priority group, 3 all_reduce each
  semantics  a sleep kernel on the current stream, then a 16 MiB all_reduce, under four wait configurations
  streams    which stream ran the communication kernels and which the sleep kernel, per rank

Options:
  --backend mock|nccl  the simulated backend (default) or real GPUs (one process per GPU; see gpu-test)
  --world-size N       ranks (default 4)
  --json PATH          also write the results as JSON to PATH
  --trace DIR          (mock) write each experiment's simulated timeline to DIR/{cache,semantics,streams}.json,
                       Chrome trace-event files for Perfetto or chrome://tracing: per rank, every stream's kernels
                       and waits (arrows from the event's record), blocked host threads, each communicator's ops
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
    trace: Option<PathBuf>,
    config: ExperimentConfig,
}

fn parse(args: &[String]) -> Result<Option<Args>, String> {
    let mut parsed = Args { backend: "mock".to_owned(), json: None, trace: None, config: ExperimentConfig::default() };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(None),
            "--backend" => parsed.backend = value("--backend")?,
            "--json" => parsed.json = Some(PathBuf::from(value("--json")?)),
            "--trace" => parsed.trace = Some(PathBuf::from(value("--trace")?)),
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
        "mock" => run_mock(&args.config, args.trace.as_deref())?,
        "nccl" if args.trace.is_some() => {
            return Err("--trace is for the mock; on GPUs set PG_TRACE=DIR (see docs/timelines.md)".to_owned())
        }
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

/// The experiments on the mock, each in a world of its own; with `trace`, each world's timeline goes to
/// `trace/{cache,semantics,streams}.json`.
fn run_mock(config: &ExperimentConfig, trace: Option<&Path>) -> Result<Vec<RankResults>, String> {
    if let Some(dir) = trace {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let write = |name: &str, timeline: &pg_mock::Trace| match trace {
        None => Ok(()),
        Some(dir) => crate::mock_trace::write(&dir.join(format!("{name}.json")), &timeline.to_chrome_json()),
    };
    let (cache, timeline) = run_mock_experiment(config, cache::run)?;
    write("cache", &timeline)?;
    let (semantics, timeline) = run_mock_experiment(config, semantics::run)?;
    write("semantics", &timeline)?;
    let (streams, timeline) = run_mock_experiment(config, streams::run)?;
    write("streams", &timeline)?;
    let world = pg_mock::World::new(pg_mock::WorldConfig::with_devices(config.world_size));
    let device = |rank: usize| world.device(rank).describe();
    let versions = world.device(0).versions();
    Ok(cache
        .into_iter()
        .zip(semantics)
        .zip(streams)
        .enumerate()
        .map(|(rank, ((cache, semantics), streams))| RankResults {
            rank,
            device: device(rank),
            versions: versions.clone(),
            cache,
            semantics,
            streams,
        })
        .collect())
}

/// Runs `experiment` on every rank of a fresh simulated world; returns each rank's result and the world's trace.
pub fn run_mock_experiment<T: Send>(
    config: &ExperimentConfig,
    experiment: impl Fn(&RankContext<pg_mock::Mock>) -> pg_core::Result<T> + Send + Sync,
) -> Result<(Vec<T>, pg_mock::Trace), String> {
    let world = pg_mock::World::new(pg_mock::WorldConfig {
        devices: config.world_size,
        trace_capacity: crate::mock_trace::CAPACITY,
        ..Default::default()
    });
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
        experiment(&ctx)
    });
    let results = results.into_iter().enumerate().map(|(rank, r)| r.map_err(|e| format!("rank {rank}: {e}")));
    Ok((results.collect::<Result<_, _>>()?, world.trace()))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::Value;

    use super::*;

    /// The reference experiment's trace on 2 ranks, one cycle per order: a sleep kernel on the current stream,
    /// then a 16 MiB all_reduce, under each wait.
    fn semantics_trace() -> Value {
        let config = ExperimentConfig { world_size: 2, cycles: 1, ..ExperimentConfig::default() };
        let (samples, trace) = run_mock_experiment(&config, semantics::run).expect("the semantics experiment");
        assert!(samples.iter().flatten().all(|s| s.correct));
        pg_conformance::traces::to_serde(&trace.to_chrome_json())
    }

    #[test]
    fn the_seed_experiment_runs_the_comm_kernel_on_another_stream_after_the_input_ready_wait() {
        let json = semantics_trace();
        let events = json["traceEvents"].as_array().expect("traceEvents");
        for event in events {
            for field in ["ph", "pid", "tid", "name"] {
                assert!(event.get(field).is_some(), "{field} missing in {event}");
            }
            assert!(event["ph"] == "M" || event["ts"].is_number(), "ts missing in {event}");
        }
        let track_names: HashMap<(u64, u64), &str> = events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
            .map(|e| ((e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()), e["args"]["name"].as_str().unwrap()))
            .collect();
        let key = |e: &Value| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let slices = |name: &str| -> Vec<&Value> {
            events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "stream" && e["name"] == name).collect()
        };
        let (sleeps, ops) = (slices("sleep"), slices("all_reduce"));
        // Per rank: the barrier's and the experiment's all_reduces (2 + 8 cycles), the sleeps (2 per cycle).
        assert_eq!((sleeps.len(), ops.len()), (2 * 16, 2 * (2 + 8 + 8)), "{sleeps:?}");
        for sleep in &sleeps {
            assert_eq!(track_names[&key(sleep)], "stream 0 (default)", "a sleep off the current stream: {sleep}");
        }
        let end = |e: &Value| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
        for op in &ops {
            assert_ne!(track_names[&key(op)], "stream 0 (default)", "a comm kernel on the current stream: {op}");
            // On its stream, the slice before it is the input-ready wait, over before the kernel starts, and an
            // arrow from the current stream ends at it.
            let before = events
                .iter()
                .rev()
                .find(|e| e["ph"] == "X" && key(e) == key(op) && e["ts"].as_f64() <= op["ts"].as_f64() && *e != *op)
                .expect("a slice before the op on its stream");
            assert_eq!(before["name"], "wait_event", "{before}");
            assert!(end(before) <= op["ts"].as_f64().unwrap());
            let arrow = events
                .iter()
                .find(|e| e["ph"] == "f" && key(e) == key(before) && e["ts"] == before["ts"])
                .expect("an arrow into the wait");
            let from = events.iter().find(|e| e["ph"] == "s" && e["id"] == arrow["id"]).expect("the arrow's start");
            assert_eq!(track_names[&key(from)], "stream 0 (default)");
        }
        // After a sleep on the current stream, the next all_reduce of the rank starts once the sleep has ended.
        for sleep in &sleeps {
            let next = ops
                .iter()
                .filter(|op| op["pid"] == sleep["pid"] && op["ts"].as_f64() >= sleep["ts"].as_f64())
                .min_by(|a, b| a["ts"].as_f64().partial_cmp(&b["ts"].as_f64()).unwrap());
            if let Some(next) = next {
                assert!(next["ts"].as_f64().unwrap() >= end(sleep), "{next} starts before {sleep} ends");
            }
        }
    }
}
