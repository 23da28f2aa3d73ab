//! The semantics experiment: what `wait()`, `Future::wait()` and blocking wait do to the host (S18, S19).

use std::time::Duration;

use pg_core::{Backend, DType, Device, Options, ReduceOp, Stream, WorkHandle};
use serde::{Deserialize, Serialize};

use super::cache::all_equal;
use super::RankContext;

/// The four configurations, in the order of the reference experiment.
pub const CONFIGS: [&str; 4] =
    ["no_wait_device_sync", "future_wait_nonblocking", "work_wait_blocking", "work_wait_nonblocking"];

/// One sample: one rank, one cycle, one configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SemanticsSample {
    /// One of [`CONFIGS`].
    pub config: String,
    /// `forward` or `reverse`: the order the configurations ran in.
    pub order: String,
    /// The cycle.
    pub cycle: usize,
    /// The rank.
    pub rank: usize,
    /// Host time of the sleep kernel alone (launch, then synchronise its stream), in us.
    pub sleep_gpu_us: f64,
    /// Host time of the action after enqueue, in us.
    pub action_host_us: f64,
    /// Host time of the device synchronize after the action, in us.
    pub device_sync_host_us: f64,
    /// `Work::is_completed()` right after enqueue.
    pub completed_after_enqueue: bool,
    /// `Work::is_completed()` right after the action.
    pub completed_after_action: bool,
    /// `Future::is_done()` right after enqueue.
    pub future_done_after_enqueue: bool,
    /// Whether a small kernel on an unrelated stream finished while the Work was not yet complete.
    pub free_stream_done_first: bool,
    /// Whether the all_reduce result was right.
    pub correct: bool,
}

fn micros(d: Duration) -> f64 {
    (d.as_nanos() as f64 / 1000.0 * 10.0).round() / 10.0
}

pub(super) fn run<B: Backend>(ctx: &RankContext<B>) -> pg_core::Result<Vec<SemanticsSample>> {
    let device = &ctx.device;
    let nonblocking = ctx.group("3", Options::builder())?;
    let blocking = ctx.group("4", Options::builder().blocking_wait(true))?;
    let numel = ctx.config.message_bytes / DType::F32.size();
    let buffer = device.alloc(DType::F32, numel)?;
    let marker = device.alloc(DType::F32, 1)?;
    let expected = (0..ctx.config.world_size).map(|r| (r + 1) as f64).sum::<f64>();
    // Warm up both groups so communicator creation is not measured.
    nonblocking.barrier_sync()?;
    blocking.barrier_sync()?;
    let free_stream = loop {
        let stream = device.stream_from_pool(false)?;
        let comm_streams =
            [nonblocking.comm_stream(&device.index().to_string()), blocking.comm_stream(&device.index().to_string())];
        if stream != device.current_stream() && !comm_streams.iter().flatten().any(|s| *s == stream) {
            break stream;
        }
    };

    let mut samples = Vec::new();
    for (order, configs) in [("forward", CONFIGS.to_vec()), ("reverse", CONFIGS.iter().rev().copied().collect())] {
        for cycle in 0..ctx.config.cycles {
            for config in &configs {
                let group = if *config == "work_wait_blocking" { &blocking } else { &nonblocking };
                nonblocking.barrier_sync()?;
                let current = device.current_stream();

                let t = device.now();
                device.sleep_kernel(&current, ctx.config.sleep)?;
                current.synchronize()?;
                let sleep_gpu = device.now() - t;

                device.fill(&buffer, (ctx.rank + 1) as f64, &current)?;
                device.sleep_kernel(&current, ctx.config.sleep)?;
                let work: WorkHandle<B> = group.all_reduce(&buffer, ReduceOp::Sum)?;
                let completed_after_enqueue = work.is_completed();
                let future = work.future();
                let future_done_after_enqueue = future.is_done();

                let t = device.now();
                match *config {
                    "no_wait_device_sync" => {}
                    "future_wait_nonblocking" => drop(future.wait()?),
                    _ => work.wait()?,
                }
                let action = device.now() - t;
                let completed_after_action = work.is_completed();

                device.fill(&marker, 1.0, &free_stream)?;
                free_stream.synchronize()?;
                let free_stream_done_first = !work.is_completed();

                let t = device.now();
                device.synchronize()?;
                let device_sync = device.now() - t;

                samples.push(SemanticsSample {
                    config: (*config).to_owned(),
                    order: order.to_owned(),
                    cycle,
                    rank: ctx.rank,
                    sleep_gpu_us: micros(sleep_gpu),
                    action_host_us: micros(action),
                    device_sync_host_us: micros(device_sync),
                    completed_after_enqueue,
                    completed_after_action,
                    future_done_after_enqueue,
                    free_stream_done_first,
                    correct: all_equal(ctx, &buffer, expected)?,
                });
            }
        }
    }
    nonblocking.shutdown()?;
    blocking.shutdown()?;
    Ok(samples)
}
