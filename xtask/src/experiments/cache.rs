//! The cache experiment: three groups of identical membership never share a communicator (S5).

use pg_core::{Backend, Buffer, DType, Device, Options, ReduceOp};
use serde::{Deserialize, Serialize};

use super::RankContext;

/// What one rank saw for one group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheRankRow {
    /// `world`, `standard clone` or `high-priority clone`.
    pub group: String,
    /// Whether the group asked for high-priority streams.
    pub high_priority: bool,
    /// Whether the communication stream really came from the high-priority pool.
    pub comm_stream_high_priority: bool,
    /// Ops run on this rank.
    pub operations: usize,
    /// Communicators this rank's group created in all.
    pub creations: u64,
    /// Communicators created after the first op (0 when the cache was reused).
    pub creations_after_first: u64,
    /// Whether every op's result was right.
    pub correct: bool,
}

/// The elements of each all_reduce in the cache experiment.
const NUMEL: usize = 1024;

pub(super) fn run<B: Backend>(ctx: &RankContext<B>) -> pg_core::Result<Vec<CacheRankRow>> {
    let groups = [("world", "0", false), ("standard clone", "1", false), ("high-priority clone", "2", true)];
    let mut rows = Vec::new();
    for (label, name, high_priority) in groups {
        let group = ctx.group(name, Options::builder().high_priority_stream(high_priority))?;
        let mut correct = true;
        let mut created_after_first_op = 0;
        for op in 0..ctx.config.ops_per_group {
            let value = (ctx.rank + 1 + op) as f64;
            let expected = (0..ctx.config.world_size).map(|r| (r + 1 + op) as f64).sum::<f64>();
            let buffer = ctx.device.alloc(DType::F32, NUMEL)?;
            ctx.device.fill(&buffer, value, &ctx.device.current_stream())?;
            group.all_reduce_sync(&buffer, ReduceOp::Sum)?;
            correct &= all_equal(ctx, &buffer, expected)?;
            if op == 0 {
                created_after_first_op = group.counters().comms_created;
            }
        }
        let counters = group.counters();
        let comm_stream = group.comm_stream(&ctx.device.index().to_string());
        rows.push(CacheRankRow {
            group: label.to_owned(),
            high_priority,
            comm_stream_high_priority: comm_stream.is_some_and(|s| pg_core::Stream::is_high_priority(&s)),
            operations: ctx.config.ops_per_group,
            creations: counters.comms_created,
            creations_after_first: counters.comms_created - created_after_first_op,
            correct,
        });
        group.shutdown()?;
    }
    Ok(rows)
}

/// Reads `buffer` back on the current stream and checks that every f32 element equals `expected`.
pub(super) fn all_equal<B: Backend>(ctx: &RankContext<B>, buffer: &B::Buffer, expected: f64) -> pg_core::Result<bool> {
    debug_assert_eq!(buffer.dtype(), DType::F32);
    let bytes = ctx.device.copy_to_host(buffer, &ctx.device.current_stream())?;
    Ok(bytes.chunks_exact(4).all(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])) == expected))
}
