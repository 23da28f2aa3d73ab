//! The three reference experiments on real GPUs: the communicator cache, the completion semantics, the streams
//! (the same as `cargo xtask experiments` on the mock, with PyTorch's settings).

use std::time::Instant;

use pg_core::{DType, Device as _, Options, ReduceOp, Stream as _};
use pg_lab::results::experiments::{
    CacheExperiment, CacheOp, ExperimentsRank, SemanticsExperiment, SemanticsRow, StreamsExperiment,
};
use pg_nccl::launches::{self, KernelKind};
use serde_json::Value;

use crate::util::{all_equal, filled, group, rank_sum, read};
use crate::Rank;

/// The sleep: 80,000,000 SM cycles (`torch.cuda._sleep(80000000)`, 40.4 ms on an H200).
const SLEEP_CYCLES: u64 = 80_000_000;
/// The tensor: 16 MiB of f32.
const NUMEL: usize = 4 << 20;

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

pub fn run(ctx: &Rank) -> Result<Value, String> {
    let cache = cache_experiment(ctx)?;
    let semantics = semantics_experiment(ctx)?;
    let streams = streams_experiment(ctx)?;
    let rank = ExperimentsRank {
        backend: "nccl".to_owned(),
        cache,
        semantics,
        streams,
        task: "experiments".to_owned(),
        ..ExperimentsRank::default()
    };
    serde_json::to_value(rank).map_err(e)
}

/// Experiment 1 (communicator cache): the world group and two clones of the same membership, three all_reduces each.
fn cache_experiment(ctx: &Rank) -> Result<CacheExperiment, String> {
    let want = rank_sum(ctx.world);
    let me = (ctx.rank + 1) as f64;
    let mut groups = Vec::new();
    for name in ["world", "clone-1", "clone-2"] {
        groups.push((name, group(ctx, &format!("exp-cache-{name}"), Options::builder())?));
    }
    let mut rows = Vec::new();
    let (mut creations, mut correct, mut creations_after_first) = (0, 0, 0);
    for (name, pg) in &groups {
        for op in 0..3 {
            let before = pg.counters().comms_created;
            let buffer = filled(ctx, DType::F32, 1024, me)?;
            pg.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
            let ok = all_equal(&read(ctx, &buffer)?, want).is_ok();
            let created = pg.counters().comms_created - before;
            creations += created;
            correct += u64::from(ok);
            if op > 0 {
                creations_after_first += created;
            }
            rows.push(CacheOp { correct: ok, created, group: (*name).to_owned(), op });
        }
    }
    for (_, pg) in &groups {
        pg.shutdown().map_err(e)?;
    }
    Ok(CacheExperiment {
        comm_creations: creations,
        correct_ops: correct,
        creations_after_first_op: creations_after_first,
        groups: 3,
        ops_per_group: 3,
        rows,
    })
}

/// Experiment 2 (completion semantics): a long sleep on the current stream, then a 16 MiB all_reduce; four ways to wait.
fn semantics_experiment(ctx: &Rank) -> Result<SemanticsExperiment, String> {
    let device = &ctx.device;
    let want = rank_sum(ctx.world);
    let me = (ctx.rank + 1) as f64;
    let plain = group(ctx, "exp-sem", Options::builder())?;
    let blocking = group(ctx, "exp-sem-blocking", Options::builder().blocking_wait(true))?;
    // Create both communicators (and warm the kernels) outside the measurement.
    for pg in [&plain, &blocking] {
        let warm = filled(ctx, DType::F32, NUMEL, me)?;
        pg.all_reduce_sync(&warm, ReduceOp::Sum).map_err(e)?;
    }
    device.synchronize().map_err(e)?;
    let mut rows = Vec::new();
    for config in ["no wait + device sync", "Future.wait", "blocking Work.wait", "non-blocking Work.wait"] {
        let pg = if config == "blocking Work.wait" { &blocking } else { &plain };
        let buffer = filled(ctx, DType::F32, NUMEL, me)?;
        device.synchronize().map_err(e)?;
        pg.barrier_sync().map_err(e)?;
        device.synchronize().map_err(e)?;
        device.cuda().spin_cycles(device.current_stream().cuda(), SLEEP_CYCLES).map_err(e)?;
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        let future = work.future();
        let future_done_after_enqueue = future.is_done();
        let t = Instant::now();
        match config {
            "no wait + device sync" => {}
            "Future.wait" => drop(future.wait().map_err(e)?),
            _ => work.wait().map_err(e)?,
        }
        let action_us = t.elapsed().as_secs_f64() * 1e6;
        let completed_after_action = work.is_completed();
        device.synchronize().map_err(e)?;
        let correct = all_equal(&read(ctx, &buffer)?, want).is_ok();
        rows.push(SemanticsRow {
            completed_after_action: u64::from(completed_after_action),
            config: config.to_owned(),
            correct,
            future_done_after_enqueue,
            host_action_us: Some(action_us),
        });
    }
    plain.shutdown().map_err(e)?;
    blocking.shutdown().map_err(e)?;
    let sleep_ms = SLEEP_CYCLES as f64 / device.cuda().clock_rate_khz() as f64;
    Ok(SemanticsExperiment { numel: NUMEL as u64, rows, sleep_cycles: SLEEP_CYCLES, sleep_ms_nominal: Some(sleep_ms) })
}

/// Experiment 3 (streams): on which stream the comm kernels run, against the caller's current stream.
fn streams_experiment(ctx: &Rank) -> Result<StreamsExperiment, String> {
    let device = &ctx.device;
    let pg = group(ctx, "exp-streams", Options::builder())?;
    launches::set_enabled(true);
    let before = launches::for_device(device.index()).len();
    let buffer = filled(ctx, DType::F32, NUMEL, (ctx.rank + 1) as f64)?;
    let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
    work.wait().map_err(e)?;
    device.synchronize().map_err(e)?;
    let current = device.current_stream().id();
    let launches = launches::for_device(device.index());
    let comm: Vec<u64> = launches
        .iter()
        .skip(before.min(launches.len()))
        .filter(|l| l.kind == KernelKind::Comm)
        .map(|l| l.stream_id)
        .collect();
    let on_other = !comm.is_empty() && comm.iter().all(|&s| s != current);
    pg.shutdown().map_err(e)?;
    Ok(StreamsExperiment {
        comm_kernel_streams: comm,
        comm_kernels_on_other_stream: on_other,
        comm_stream: work.comm_stream().id(),
        current_stream: current,
    })
}
