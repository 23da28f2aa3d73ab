//! `cargo xtask recovery --backend nccl [--world-size N]`: a lost rank survived on real GPUs. N ranks (several on a
//! GPU over NCCL's network transport where there are fewer GPUs) run a loop of 64 MiB all_reduces in a group that
//! revokes itself on a failed peer (`Options::revoke_on_error`); the last rank SIGKILLs itself in the middle of one.
//! Each survivor measures from the kill (the victim's wall-clock time in the store) to its group's revoke
//! (detection), then from there through the survivors' agreement and the shrink to the first correct all_reduce of
//! the shrunk group (recovery). With `--liveness` the group holds liveness in the store (`Options::liveness`: pg's
//! store server publishes the victim's closed connection, and the agreement waits for no dead rank).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pg_core::store::{PrefixStore, Store};
use pg_core::{AgreeOptions, DType, Device as _, Options, ProcessGroup, ReduceOp, ShrinkOptions};
use pg_nccl::Nccl;
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The hidden subcommand a rank process runs.
pub const RANK_TASK: &str = "__recovery-rank";

const HELP: &str = "\
cargo xtask recovery --backend nccl [--world-size N] [--liveness] [--json PATH] [--md PATH]

N ranks (default 4; rank r on GPU r % GPUs, ranks sharing a GPU over NCCL's network transport) all-reduce 64 MiB
in a loop in a group that revokes itself on a failed peer; the last rank SIGKILLs itself during its sixth op. Every
survivor reports detection (kill to revoke), recovery (revoke to the first correct all_reduce of the group shrunk
to the survivors: agreement, ncclCommShrink, the op until it has run on the device; the result is read back and
checked after) and the total, in ms of wall-clock time. --liveness turns
Options::liveness on: the store (hosted by rank 0) tells every survivor of the victim's closed connection.
";

/// Elements of the all_reduce (64 MiB of f32).
const NUMEL: usize = 16 << 20;
/// The op during which the victim dies.
const KILL_AT: usize = 5;

/// What one survivor saw.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Its rank in the original group.
    pub rank: usize,
    /// Its rank in the shrunk group.
    pub new_rank: Option<usize>,
    /// The survivors the ranks agreed on.
    pub survivors: Vec<usize>,
    /// From the kill to the revoke of its group, in ms.
    pub detect_ms: f64,
    /// From the revoke to the first correct all_reduce of the shrunk group, in ms.
    pub recover_ms: f64,
    /// Of which the agreement, in ms.
    pub agree_ms: f64,
    /// Of which the shrink, in ms.
    pub shrink_ms: f64,
    /// Whether the shrunk group's all_reduce gave the survivors' sum.
    pub correct: bool,
    /// What the first failed op said.
    pub error: String,
    /// The group's first error: what revoked it (a dead rank seen in the store, a peer's report, the communicator's
    /// own error).
    #[serde(default)]
    pub cause: String,
    /// From the kill to the first failed op's return, in ms (`None`: no op failed, the group was found revoked
    /// after one that succeeded).
    #[serde(default)]
    pub op_failed_ms: Option<f64>,
    /// The median wall time of one all_reduce (enqueue and wait) of the group before the kill, in ms: what the op
    /// that ends the recovery costs by itself.
    #[serde(default)]
    pub healthy_op_ms: Option<f64>,
    /// Of the recovery, the shrunk group's first all_reduce and the copy of its result to the host, in ms (its
    /// first collective also connects its ranks).
    #[serde(default)]
    pub first_op_ms: Option<f64>,
}

/// Runs the task: parses the arguments, launches the ranks, writes the report.
pub fn run(args: &[String]) -> Result<(), String> {
    let (mut world, mut json_path, mut md_path, mut backend) = (4, None::<PathBuf>, None::<PathBuf>, None);
    let mut liveness = false;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value\n\n{HELP}"));
        match flag.as_str() {
            "--backend" => backend = Some(value()?),
            "--world-size" => world = value()?.parse().map_err(|e| format!("--world-size: {e}"))?,
            "--json" => json_path = Some(PathBuf::from(value()?)),
            "--md" => md_path = Some(PathBuf::from(value()?)),
            "--liveness" => liveness = true,
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            other => return Err(format!("unknown option {other}\n\n{HELP}")),
        }
    }
    match backend.as_deref() {
        Some("nccl") => {}
        Some(other) => {
            return Err(format!(
                "--backend {other}: the GPU run is nccl (the mock's recovery cases are in the conformance suite)"
            ))
        }
        None => return Err(format!("--backend nccl is required\n\n{HELP}")),
    }
    if world < 2 {
        return Err(format!("a lost rank needs a world of two or more, not {world}"));
    }
    let victim = world - 1;
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    for (rank, end) in
        crate::gpu::launch_ranks(RANK_TASK, liveness_arg(liveness), world, &[victim])?.into_iter().enumerate()
    {
        if let Some(failure) = end.failure {
            failures.push(failure);
        }
        if rank == victim {
            continue;
        }
        match end.output.as_deref().map(serde_json::from_str::<Result<Row, String>>) {
            Some(Ok(Ok(row))) => rows.push(row),
            Some(Ok(Err(why))) => failures.push(format!("rank {rank}: {why}")),
            Some(Err(e)) => failures.push(format!("rank {rank}'s row: {e}")),
            None => failures.push(format!("rank {rank} wrote no row")),
        }
    }
    let gpus = pg_nccl::available().unwrap_or(0);
    let layout = pg_nccl::placement::describe(world, gpus);
    let median = |f: fn(&Row) -> f64| {
        let mut values: Vec<f64> = rows.iter().map(f).collect();
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied()
    };
    let mut md = format!(
        "# A lost rank survived on NCCL, world {world}\n\n{layout}; the last rank SIGKILLed during all_reduce {} of \
         64 MiB; group with `revoke_on_error`{}, op timeout 2 s, watchdog period 50 ms; ms of wall-clock time\n\n\
         | rank | new rank | survivors | detect | recover | of which agree | of which shrink | of which first op | \
         total | healthy op | correct | revoked by |\n\
         | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n",
        KILL_AT + 1,
        if liveness { " and `liveness`" } else { "" }
    );
    for row in &rows {
        md.push_str(&format!(
            "| {} | {} | {:?} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {:.1} | {} | {} | {} |\n",
            row.rank,
            row.new_rank.map_or("-".to_owned(), |r| r.to_string()),
            row.survivors,
            row.detect_ms,
            row.recover_ms,
            row.agree_ms,
            row.shrink_ms,
            row.first_op_ms.map_or("-".to_owned(), |ms| format!("{ms:.1}")),
            row.detect_ms + row.recover_ms,
            row.healthy_op_ms.map_or("-".to_owned(), |ms| format!("{ms:.1}")),
            row.correct,
            row.cause.replace('|', "/")
        ));
    }
    for failure in &failures {
        md.push_str(&format!("\nfailure: {failure}\n"));
    }
    print!("{md}");
    let doc = json!({
        "backend": "nccl",
        "world_size": world,
        "layout": layout,
        "victim": victim,
        "liveness": liveness,
        "rows": rows,
        "median_detect_ms": median(|r| r.detect_ms),
        "median_recover_ms": median(|r| r.recover_ms),
        "failures": failures,
    });
    if let Some(path) = &json_path {
        write(path, &serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?)?;
    }
    if let Some(path) = &md_path {
        write(path, &md)?;
    }
    let all_correct = rows.len() == world - 1 && rows.iter().all(|r| r.correct);
    match (failures.is_empty(), all_correct) {
        (true, true) => Ok(()),
        _ => Err(format!(
            "{} failure(s); {} of {} survivors correct",
            failures.len(),
            rows.iter().filter(|r| r.correct).count(),
            world - 1
        )),
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Milliseconds since the Unix epoch: the one clock every rank process of the machine shares.
fn wall_ms() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e3)
}

/// The rank task's argument saying whether liveness is on.
fn liveness_arg(liveness: bool) -> &'static str {
    match liveness {
        true => "liveness",
        false => "no-liveness",
    }
}

/// `xtask __recovery-rank OUT LIVENESS`: one rank of [`run`]; writes its row (or why it has none) as JSON.
pub fn rank_main(args: &[String]) -> Result<(), String> {
    let [out, live] = args else {
        return Err(format!("usage: {RANK_TASK} OUT_JSON liveness|no-liveness"));
    };
    let liveness = live == liveness_arg(true);
    let mut phases = Phases::default();
    let (rendezvous, device) = crate::gpu::join_job(Duration::from_secs(120))?;
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new("recovery/", Arc::clone(&rendezvous.store)));
    let (rank, world) = (rendezvous.rank, rendezvous.world_size);
    let result = rank_body(rank, world, liveness, &store, &device, &mut phases).map_err(|why| {
        // Where the rank got to, from the kill: what a failure needs to be understood.
        let killed_at = store.get("killed_at").ok().and_then(|v| String::from_utf8_lossy(&v).parse::<f64>().ok());
        let times: Vec<String> = phases
            .0
            .iter()
            .map(|(what, at)| format!("{what} {:+.1} ms", killed_at.map_or(f64::NAN, |k| at - k)))
            .collect();
        format!("{why} (from the kill: {})", times.join(", "))
    });
    let json = serde_json::to_string(&result).map_err(|e| e.to_string())?;
    std::fs::write(out, json).map_err(|e| format!("{out}: {e}"))?;
    // Rank 0 hosts the store: it stays until every survivor is done with it (or a minute has passed).
    let _ = store.add("done", 1);
    if rank == 0 {
        let start = std::time::Instant::now();
        while store.add("done", 0).is_ok_and(|done| done < (world - 1) as i64) && start.elapsed().as_secs() < 60 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(())
}

/// The wall-clock times (ms since the epoch) a rank reached each step of its recovery.
#[derive(Default)]
struct Phases(Vec<(&'static str, f64)>);

impl Phases {
    fn mark(&mut self, what: &'static str) {
        self.0.push((what, wall_ms()));
    }
}

fn rank_body(
    rank: usize,
    world: usize,
    liveness: bool,
    store: &Arc<dyn Store>,
    device: &pg_nccl::Device,
    phases: &mut Phases,
) -> Result<Row, String> {
    let e = |e: pg_core::Error| e.to_string();
    let device = device.clone();
    let victim = world - 1;
    let options = Options::builder()
        .group_name("recovery".to_owned())
        .revoke_on_error(true)
        .liveness(liveness)
        .timeout(Duration::from_secs(2))
        .watchdog_period(Duration::from_millis(50))
        .dump_on_timeout(false)
        .build();
    let group: ProcessGroup<Nccl> =
        ProcessGroup::new(store.clone(), rank, world, device.clone(), options).map_err(e)?;
    let buffer = device.alloc(DType::F32, NUMEL).map_err(e)?;
    let current = device.current_stream();
    let mut op = 0;
    let mut op_failed = None;
    let mut healthy = Vec::new();
    let error = loop {
        device.fill(&buffer, (rank + 1) as f64, &current).map_err(e)?;
        if rank == victim && op == KILL_AT {
            // Enqueued, then killed while the peers' kernels wait for this rank's data.
            let _work = group.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
            store.set("killed_at", wall_ms().to_string().as_bytes()).map_err(|e| e.to_string())?;
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill").args(["-9", &pid]).status();
            return Err("the victim survived its own SIGKILL".to_owned());
        }
        let op_start = std::time::Instant::now();
        let result =
            group.all_reduce(&buffer, ReduceOp::Sum).and_then(|work| work.wait_timeout(Duration::from_secs(10)));
        match result {
            Err(error) => {
                phases.mark("op failed");
                op_failed = Some(wall_ms());
                break error.to_string();
            }
            Ok(()) if group.is_revoked() => break "the group was revoked".to_owned(),
            Ok(()) => {
                // The first op also connects the ranks: not a healthy op's cost.
                if op > 0 {
                    healthy.push(op_start.elapsed().as_secs_f64() * 1e3);
                }
                op += 1;
            }
        }
        if op > KILL_AT + 20 {
            return Err(format!("{op} ops ran after the victim's death"));
        }
    };
    // The revoke happens on the watchdog's thread: wait (briefly) until it has, so detection is measured to it.
    let mut polls = 0;
    while !group.is_revoked() && polls < 5000 {
        std::thread::sleep(Duration::from_millis(1));
        polls += 1;
    }
    let detected = wall_ms();
    phases.mark("revoked");
    let cause = group.error().map_or_else(|| "none recorded".to_owned(), |error| error.to_string());
    let agree_start = std::time::Instant::now();
    let survivors = group
        .agree_survivors(&AgreeOptions { timeout: Duration::from_millis(500), ..AgreeOptions::default() })
        .map_err(e)?;
    let agree_ms = agree_start.elapsed().as_secs_f64() * 1e3;
    phases.mark("agreed");
    let shrink_start = std::time::Instant::now();
    let shrunk = group.shrink(&survivors.excluded, &ShrinkOptions::default()).map_err(e)?;
    let shrink_ms = shrink_start.elapsed().as_secs_f64() * 1e3;
    phases.mark("shrunk");
    // A fresh device record: the failed group's buffers are not read again.
    device.poison().clear();
    device.fill(&buffer, (rank + 1) as f64, &current).map_err(e)?;
    let first_op_start = std::time::Instant::now();
    // Ready when the op has run on the device, waited for as the healthy ops were (a blocking wait that polls:
    // seven host threads spinning in a CUDA synchronize would take the cores NCCL's proxy threads move the data
    // with). Reading the result back to check it is the harness's work, not the recovery's.
    shrunk.all_reduce(&buffer, ReduceOp::Sum).and_then(|work| work.wait_timeout(Duration::from_secs(10))).map_err(e)?;
    let ready = wall_ms();
    let first_op_ms = first_op_start.elapsed().as_secs_f64() * 1e3;
    let bytes = device.copy_to_host(&buffer, &current).map_err(e)?;
    healthy.sort_by(f64::total_cmp);
    let healthy_op_ms = healthy.get(healthy.len() / 2).copied();
    let want: f64 = survivors.ranks.iter().map(|&r| (r + 1) as f64).sum();
    let correct = bytes.chunks_exact(4).all(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])) == want);
    let killed_at: f64 = String::from_utf8_lossy(&store.get("killed_at").map_err(|e| e.to_string())?)
        .parse()
        .map_err(|e| format!("the kill time: {e}"))?;
    Ok(Row {
        rank,
        new_rank: survivors.new_rank(rank),
        survivors: survivors.ranks.clone(),
        detect_ms: detected - killed_at,
        recover_ms: ready - detected,
        agree_ms,
        shrink_ms,
        correct,
        error,
        cause,
        op_failed_ms: op_failed.map(|at| at - killed_at),
        healthy_op_ms,
        first_op_ms: Some(first_op_ms),
    })
}
