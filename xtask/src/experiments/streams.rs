//! The streams experiment: the communication kernels run on a dedicated stream, never the current one (S20).

use pg_conformance::KernelKind;
use pg_core::{Backend, DType, Device, Options, ReduceOp, Stream};
use serde::{Deserialize, Serialize};

use super::RankContext;

/// One rank's row.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamsRankRow {
    /// The rank.
    pub rank: usize,
    /// The id of the caller's current stream.
    pub current_stream: u64,
    /// The id of the group's communication stream.
    pub comm_stream: u64,
    /// Communication kernels seen on the communication stream during the experiment.
    pub comm_kernels: usize,
    /// Sleep kernels seen on the current stream during the experiment.
    pub sleep_kernels: usize,
    /// Communication kernels seen on the current stream (0 when they are disjoint).
    pub comm_kernels_on_current: usize,
    /// Whether the two streams differ and no communication kernel ran on the current stream.
    pub disjoint: bool,
}

/// All_reduce ops in the streams experiment (the reference profile showed four).
const OPS: usize = 4;

pub(super) fn run<B: Backend>(ctx: &RankContext<B>) -> pg_core::Result<StreamsRankRow> {
    let device = &ctx.device;
    let group = ctx.group("5", Options::builder())?;
    let buffer = device.alloc(DType::F32, 1024)?;
    let current = device.current_stream();
    device.fill(&buffer, 1.0, &current)?;
    // Warm up (the barrier's own all_reduce is not counted), then count from here.
    group.barrier_sync()?;
    // The kernel log is the conformance harness's capability (the mock's timeline, pg-nccl's launch log).
    let count = |stream: &B::Stream, kind| {
        let log = ctx.caps.kernel_log(ctx.rank).unwrap_or_default();
        log.iter().filter(|k| k.stream_id == stream.id() && k.kind == kind).count()
    };
    let comm_stream = group
        .comm_stream(&device.index().to_string())
        .ok_or_else(|| pg_core::Error::invalid("no communication stream after the barrier"))?;
    let sleeps_before = count(&current, KernelKind::Sleep);
    let comms_before = count(&current, KernelKind::Comm);
    let comms_on_comm_stream_before = count(&comm_stream, KernelKind::Comm);
    device.sleep_kernel(&current, ctx.config.sleep)?;
    for _ in 0..OPS {
        group.all_reduce(&buffer, ReduceOp::Sum)?.wait()?;
    }
    device.synchronize()?;
    let comm_kernels_on_current = count(&current, KernelKind::Comm) - comms_before;
    group.shutdown()?;
    Ok(StreamsRankRow {
        rank: ctx.rank,
        current_stream: current.id(),
        comm_stream: comm_stream.id(),
        comm_kernels: count(&comm_stream, KernelKind::Comm) - comms_on_comm_stream_before,
        sleep_kernels: count(&current, KernelKind::Sleep) - sleeps_before,
        comm_kernels_on_current,
        disjoint: comm_stream != current && comm_kernels_on_current == 0,
    })
}
