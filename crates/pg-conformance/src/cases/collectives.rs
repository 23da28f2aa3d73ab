//! The collectives beyond the one-buffer set, through the process group: reduce, gather, scatter, both
//! all-to-all forms, the list all-gather and reduce-scatter, batched point-to-point and coalesced blocks; their
//! results for every dtype, uneven and empty chunks, their bad-input errors and what a cross-rank size mismatch
//! becomes.

use std::time::Duration;

use pg_core::{Backend, DType, Device as _, ErrorKind, OpType, Options, P2POp, ProcessGroup, ReduceOp, WorkHandle};

use super::{at_once, case, clock_of, need, needs_hazards, on_each_rank, SLEEP};
use crate::case::{pass, Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(reduce_gather_and_scatter_move_the_right_data_for_every_dtype, 1),
        case!(all_to_all_single_moves_equal_and_uneven_chunks_with_empty_ones, 1),
        case!(all_to_all_of_lists_moves_buffers_of_every_size, 1),
        case!(list_all_gather_and_reduce_scatter_take_sizes_that_differ_by_rank, 1),
        case!(batch_isend_irecv_in_any_order_does_not_deadlock, 2),
        case!(coalesced_block_runs_its_collectives_as_one_work, 1),
        case!(list_ops_refuse_bad_input_before_enqueueing, 1),
        case!(list_ops_record_every_buffer_in_the_flight_recorder, 1),
        case!(all_to_all_with_splits_two_ranks_disagree_on_fails_on_every_rank_when_chunk_sizes_are_checked, 2),
        case!(a_checked_op_of_a_revoked_aborted_or_shut_down_group_fails_at_once_with_its_error, 2),
        case!(a_checked_op_one_rank_refuses_fails_on_every_rank_and_later_checked_ops_stay_in_step, 2),
        case!(list_op_buffers_outlive_the_op_through_record_stream_or_the_stash, 1),
    ]
}

/// Every dtype the data-moving ops take.
const DTYPES: [DType; 9] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::U8, DType::I32, DType::I64, DType::Bool];

/// A small value every dtype holds exactly, distinct for distinct `x` except on bool (0 or 1).
fn val(dtype: DType, x: usize) -> f64 {
    match dtype {
        DType::Bool => (x % 2) as f64,
        _ => (x % 100) as f64,
    }
}

/// A list of `values(i)` buffers of `dtype`, one per `i` in `0..n`.
fn list<B: Backend>(r: &Rank<B>, dtype: DType, n: usize, values: impl Fn(usize) -> Vec<f64>) -> Check<Vec<B::Buffer>> {
    (0..n).map(|i| r.holding(dtype, &values(i))).collect()
}

/// Waits for `work` and checks that each buffer holds what `want(i)` says.
fn expect_all<B: Backend>(
    r: &Rank<B>,
    what: &str,
    work: pg_core::Result<WorkHandle<B>>,
    buffers: &[B::Buffer],
    want: impl Fn(usize) -> Vec<f64>,
) -> Check {
    work.and_then(|w| w.wait()).ctx(what)?;
    for (i, buffer) in buffers.iter().enumerate() {
        let got = r.read(buffer)?;
        ensure!(got == want(i), "{what}: buffer {i} holds {got:?}, want {:?}", want(i));
    }
    Ok(())
}

/// A world of `n` ranks each with a group; `body` runs on every rank; every rank must pass and the hazard
/// detector must report nothing.
fn on_each_group<H: Harness>(h: &H, body: impl Fn(&Rank<H::B>, &ProcessGroup<H::B>) -> Check + Sync) -> Check<Outcome> {
    let ran = h.run(h.world_size(), |r| {
        let group = r.group("0", Options::builder())?;
        body(r, &group)
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

fn reduce_gather_and_scatter_move_the_right_data_for_every_dtype<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        for dtype in DTYPES {
            for root in [0, n - 1] {
                // Reduce in place: only the root's buffer changes. Max keeps every dtype exact; sum where it is.
                let op = match dtype {
                    DType::F32 | DType::F64 | DType::I32 | DType::I64 => ReduceOp::Sum,
                    _ => ReduceOp::Max,
                };
                let mine = |rank: usize| vec![val(dtype, rank + 1), val(dtype, 2 * rank), 0.0];
                let buffer = r.holding(dtype, &mine(me))?;
                let want = match (me == root, op) {
                    (false, _) => mine(me),
                    (true, ReduceOp::Sum) => (0..3).map(|c| (0..n).map(|k| mine(k)[c]).sum()).collect(),
                    (true, _) => (0..3).map(|c| (0..n).map(|k| mine(k)[c]).fold(f64::MIN, f64::max)).collect(),
                };
                let what = format!("reduce {dtype} to root {root}");
                expect_all(r, &what, group.reduce(&buffer, root, op), std::slice::from_ref(&buffer), |_| want.clone())?;
                // Gather: the root's outputs[k] holds rank k's input.
                let input = r.holding(dtype, &[val(dtype, 10 * me + 1), val(dtype, 10 * me + 2)])?;
                let outputs = match me == root {
                    true => list(r, dtype, n, |_| vec![0.0; 2])?,
                    false => Vec::new(),
                };
                let what = format!("gather {dtype} to root {root}");
                let work = group.gather(&input, &outputs, root);
                expect_all(r, &what, work, &outputs, |k| vec![val(dtype, 10 * k + 1), val(dtype, 10 * k + 2)])?;
                // Scatter: rank k's output holds the root's inputs[k].
                let output = r.holding(dtype, &[0.0; 3])?;
                let inputs = match me == root {
                    true => list(r, dtype, n, |k| vec![val(dtype, k + 3); 3])?,
                    false => Vec::new(),
                };
                let what = format!("scatter {dtype} from root {root}");
                let work = group.scatter(&output, &inputs, root);
                expect_all(r, &what, work, std::slice::from_ref(&output), |_| vec![val(dtype, me + 3); 3])?;
            }
        }
        Ok(())
    })
}

/// The elements rank `from` sends rank `to` in the uneven all-to-all: `(from + to) % 3` of them, so that some
/// chunks are empty (and at one rank, the only one is).
fn uneven(from: usize, to: usize) -> usize {
    (from + 2 * to) % 3
}

fn all_to_all_single_moves_equal_and_uneven_chunks_with_empty_ones<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        for dtype in DTYPES {
            // Equal chunks of 2: chunk j of rank i is [i*10 + j, j].
            let input: Vec<f64> = (0..n).flat_map(|j| [val(dtype, me * 10 + j), val(dtype, j)]).collect();
            let input = r.holding(dtype, &input)?;
            let output = r.holding(dtype, &vec![0.0; 2 * n])?;
            let work = group.all_to_all_single(&output, &input, None, None);
            let want: Vec<f64> = (0..n).flat_map(|i| [val(dtype, i * 10 + me), val(dtype, me)]).collect();
            expect_all(r, &format!("all_to_all_single {dtype}, equal"), work, std::slice::from_ref(&output), |_| {
                want.clone()
            })?;
            // Uneven chunks, some empty: element e of the chunk from i to j is i*10 + j + e.
            let input_splits: Vec<usize> = (0..n).map(|j| uneven(me, j)).collect();
            let output_splits: Vec<usize> = (0..n).map(|i| uneven(i, me)).collect();
            let chunk = |i: usize, j: usize| (0..uneven(i, j)).map(move |e| val(dtype, i * 10 + j + e));
            let input: Vec<f64> = (0..n).flat_map(|j| chunk(me, j)).collect();
            let want: Vec<f64> = (0..n).flat_map(|i| chunk(i, me)).collect();
            let input = r.holding(dtype, &input)?;
            let output = r.device.alloc(dtype, want.len()).ctx("alloc")?;
            let work = group.all_to_all_single(&output, &input, Some(&output_splits), Some(&input_splits));
            expect_all(r, &format!("all_to_all_single {dtype}, uneven"), work, std::slice::from_ref(&output), |_| {
                want.clone()
            })?;
        }
        Ok(())
    })
}

fn all_to_all_of_lists_moves_buffers_of_every_size<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        for dtype in DTYPES {
            let chunk = |i: usize, j: usize| (0..uneven(i, j)).map(|e| val(dtype, i * 10 + j + e)).collect::<Vec<_>>();
            let inputs = list(r, dtype, n, |j| chunk(me, j))?;
            let outputs = list(r, dtype, n, |i| vec![0.0; uneven(i, me)])?;
            let work = group.all_to_all(&outputs, &inputs);
            ensure!(work.as_ref().is_ok_and(|w| w.op_type() == OpType::AllToAll), "all_to_all's Work: {work:?}");
            expect_all(r, &format!("all_to_all {dtype}"), work, &outputs, |i| chunk(i, me))?;
        }
        Ok(())
    })
}

fn list_all_gather_and_reduce_scatter_take_sizes_that_differ_by_rank<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        // Rank k's share has k % 3 elements: rank 0's is empty.
        let len = |k: usize| k % 3;
        for dtype in DTYPES {
            let share = |k: usize| (0..len(k)).map(|e| val(dtype, k * 10 + e + 1)).collect::<Vec<_>>();
            let input = r.holding(dtype, &share(me))?;
            let outputs = list(r, dtype, n, |k| vec![0.0; len(k)])?;
            let work = group.all_gather_into(&outputs, &input);
            expect_all(r, &format!("all_gather_into {dtype}"), work, &outputs, share)?;
        }
        for (dtype, op) in [(DType::F32, ReduceOp::Sum), (DType::I64, ReduceOp::Sum), (DType::U8, ReduceOp::Max)] {
            // Rank i's inputs[j] holds [i + j + e]; rank j gets the reduction over i.
            let inputs = list(r, dtype, n, |j| (0..len(j)).map(|e| val(dtype, me + j + e)).collect())?;
            let output = r.holding(dtype, &vec![0.0; len(me)])?;
            let want: Vec<f64> = (0..len(me))
                .map(|e| {
                    let values = (0..n).map(|i| val(dtype, i + me + e));
                    match op {
                        ReduceOp::Sum => values.sum(),
                        _ => values.fold(f64::MIN, f64::max),
                    }
                })
                .collect();
            let work = group.reduce_scatter_from(&output, &inputs, op);
            expect_all(r, &format!("reduce_scatter_from {dtype}"), work, std::slice::from_ref(&output), |_| {
                want.clone()
            })?;
        }
        Ok(())
    })
}

fn batch_isend_irecv_in_any_order_does_not_deadlock<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
        // A ring both ways, two messages per neighbour; even ranks list receives first, odd ranks sends first.
        let send_next = r.holding(DType::F32, &[me as f64; 3])?;
        let send_prev = r.holding(DType::F32, &[me as f64 + 100.0; 2])?;
        let from_prev = r.holding(DType::F32, &[-1.0; 3])?;
        let from_next = r.holding(DType::F32, &[-1.0; 2])?;
        let sends = [P2POp::send(&send_next, next), P2POp::send(&send_prev, prev)];
        let recvs = [P2POp::recv(&from_prev, prev), P2POp::recv(&from_next, next)];
        let ops: Vec<P2POp<H::B>> = match me % 2 {
            0 => recvs.into_iter().chain(sends).collect(),
            _ => sends.into_iter().chain(recvs).collect(),
        };
        let work = group.batch_isend_irecv(&ops).ctx("batch_isend_irecv")?;
        ensure_eq!(work.op_type(), OpType::BatchP2p, "the batch's op type");
        work.wait().ctx("wait")?;
        // With two ranks, prev and next are one rank: its messages arrive in the order it sent them.
        let (got_prev, got_next) = (r.read(&from_prev)?, r.read(&from_next)?);
        ensure_eq!(got_prev, vec![prev as f64; 3], "from the previous rank");
        ensure_eq!(got_next, vec![next as f64 + 100.0; 2], "from the next rank");
        ensure_eq!(group.counters().ops_issued, 1, "ops issued for one batch");
        Ok(())
    })
}

fn coalesced_block_runs_its_collectives_as_one_work<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        let a = r.holding(DType::F32, &[me as f64 + 1.0; 4])?;
        let b = r.holding(DType::I64, &[me as f64; 2])?;
        let shard = r.holding(DType::F32, &[me as f64 * 2.0])?;
        let gathered = r.device.alloc(DType::F32, n).ctx("alloc")?;
        let work = group
            .coalesced(|c| {
                c.all_reduce(&a, ReduceOp::Sum)?;
                c.broadcast(&b, n - 1)?;
                c.all_gather(&shard, &gathered)
            })
            .ctx("coalesced")?;
        ensure_eq!(work.op_type(), OpType::Coalesced, "the block's op type");
        ensure_eq!(work.seq(), 1, "one sequence number for the block");
        work.wait().ctx("wait")?;
        ensure_eq!(r.read(&a)?, vec![(n * (n + 1) / 2) as f64; 4], "the coalesced all_reduce");
        ensure_eq!(r.read(&b)?, vec![(n - 1) as f64; 2], "the coalesced broadcast");
        ensure_eq!(r.read(&gathered)?, (0..n).map(|k| k as f64 * 2.0).collect::<Vec<_>>(), "the coalesced all_gather");
        ensure_eq!(group.counters().ops_issued, 1, "ops issued for one block");
        // A block whose op is refused enqueues nothing.
        let refused = group.coalesced(|c| {
            c.all_reduce(&a, ReduceOp::Sum)?;
            c.broadcast(&a, n)
        });
        ensure_eq!(refused.err().map(|e| e.kind()), Some(ErrorKind::InvalidArgument), "a block with a bad root");
        ensure_eq!(group.counters().ops_issued, 1, "ops issued after the refused block");
        ensure_eq!(r.read(&a)?, vec![(n * (n + 1) / 2) as f64; 4], "the refused block's all_reduce did not run");
        Ok(())
    })
}

/// Expects an `InvalidArgument` whose message contains `names`.
fn refused<T: std::fmt::Debug>(what: &str, names: &str, result: pg_core::Result<T>) -> Check {
    match result {
        Ok(work) => Err(format!("{what}: accepted ({work:?})")),
        Err(error) if error.kind() == ErrorKind::InvalidArgument && error.to_string().contains(names) => Ok(()),
        Err(error) => Err(format!("{what}: {:?} without '{names}': {error}", error.kind())),
    }
}

fn list_ops_refuse_bad_input_before_enqueueing<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        let f = |numel: usize| r.device.alloc(DType::F32, numel).ctx("alloc");
        let four = f(4 * n)?;
        let per_rank = (0..n).map(|_| f(4)).collect::<Check<Vec<_>>>()?;
        let one_short = &per_rank[..n - 1];
        let ints = (0..n).map(|_| r.device.alloc(DType::I32, 4).ctx("alloc")).collect::<Check<Vec<_>>>()?;
        let peer = (me + 1) % n;
        refused("reduce to a root out of range", "root", group.reduce(&four, n, ReduceOp::Sum))?;
        refused("reduce with BAND", "BAND", group.reduce(&four, 0, ReduceOp::BitAnd))?;
        refused("gather to a root out of range", "root", group.gather(&per_rank[0], &per_rank, n))?;
        let (root_list, other) = if me == 0 { (one_short, "outputs has") } else { (&per_rank[..], "must be empty") };
        refused("gather with a wrong list", other, group.gather(&per_rank[0], root_list, 0))?;
        if me == 0 {
            refused("gather into outputs of another size", "elements", group.gather(&f(5)?, &per_rank, 0))?;
            refused("gather into outputs of another dtype", "dtypes", group.gather(&per_rank[0], &ints, 0))?;
            refused("scatter from inputs of another dtype", "dtypes", group.scatter(&per_rank[0], &ints, 0))?;
        }
        refused("scatter from a root out of range", "root", group.scatter(&per_rank[0], &[], n + 3))?;
        let splits: Vec<usize> = vec![4; n];
        let mut short = splits.clone();
        short[0] = 3;
        let a2a = |s: Option<&[usize]>, t: Option<&[usize]>| group.all_to_all_single(&four, &four, s, t);
        refused("all_to_all_single with splits that do not sum", "sum to", a2a(None, Some(&short)))?;
        refused("all_to_all_single with output splits that do not sum", "sum to", a2a(Some(&short), None))?;
        refused("all_to_all_single with a split per rank missing", "entries", a2a(Some(&splits[1..]), None))?;
        if n > 1 {
            let odd = f(4 * n + 1)?;
            let work = group.all_to_all_single(&odd, &odd, None, None);
            refused("all_to_all_single not divisible", "equal chunks", work)?;
        }
        let i_out = r.device.alloc(DType::I32, 4 * n).ctx("alloc")?;
        refused("all_to_all_single across dtypes", "dtypes", group.all_to_all_single(&i_out, &four, None, None))?;
        refused("all_to_all with a short list", "inputs has", group.all_to_all(&per_rank, one_short))?;
        refused("all_to_all across dtypes", "dtypes", group.all_to_all(&ints, &per_rank))?;
        let mut own_wrong: Vec<_> = per_rank.clone();
        own_wrong[me] = f(5)?;
        refused("all_to_all whose own chunk differs", "sends itself", group.all_to_all(&own_wrong, &per_rank))?;
        refused("all_gather_into a short list", "outputs has", group.all_gather_into(one_short, &per_rank[0]))?;
        refused("all_gather_into an own output too small", "own buffer", group.all_gather_into(&per_rank, &f(5)?))?;
        refused("all_gather_into across dtypes", "dtypes", group.all_gather_into(&ints, &per_rank[0]))?;
        let rs = |inputs: &[<H::B as Backend>::Buffer], out: &<H::B as Backend>::Buffer, op| {
            group.reduce_scatter_from(out, inputs, op)
        };
        refused("reduce_scatter_from a short list", "inputs has", rs(one_short, &per_rank[0], ReduceOp::Sum))?;
        refused(
            "reduce_scatter_from an own input of another size",
            "own buffer",
            rs(&per_rank, &f(3)?, ReduceOp::Sum),
        )?;
        refused("reduce_scatter_from with BXOR", "BXOR", rs(&per_rank, &per_rank[0], ReduceOp::BitXor))?;
        refused("an empty batch", "empty", group.batch_isend_irecv(&[]))?;
        refused("a batch with a peer out of range", "out of range", group.batch_isend_irecv(&[P2POp::send(&four, n)]))?;
        refused("a batch sending to itself", "itself", group.batch_isend_irecv(&[P2POp::recv(&four, me)]))?;
        refused("an empty coalesced block", "no collective", group.coalesced(|_| Ok(())))?;
        if let Some(other) = r.caps.other_device(me) {
            let theirs = other.alloc(DType::F32, 4).ctx("alloc")?;
            refused(
                "a batch of another device's buffer",
                "device",
                group.batch_isend_irecv(&[P2POp::send(&theirs, peer)]),
            )?;
            refused("reduce of another device's buffer", "device", group.reduce(&theirs, 0, ReduceOp::Sum))?;
        }
        ensure_eq!(group.counters().ops_issued, 0, "ops issued by refused calls");
        ensure_eq!(group.counters().comms_created, 0, "communicators created by refused calls");
        // The group still works after every refusal.
        let buffer = r.holding(DType::F32, &[1.0; 4])?;
        group.reduce(&buffer, 0, ReduceOp::Sum).and_then(|w| w.wait()).ctx("reduce after the refusals")?;
        let want = if me == 0 { n as f64 } else { 1.0 };
        ensure_eq!(r.read(&buffer)?, vec![want; 4], "reduce after the refusals");
        Ok(())
    })
}

fn list_ops_record_every_buffer_in_the_flight_recorder<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_group(h, |r, group| {
        let (n, me) = (r.size, r.rank);
        let input = r.holding(DType::F32, &vec![1.0; me + 1])?;
        let outputs = (0..n).map(|k| r.device.alloc(DType::F32, k + 1).ctx("alloc")).collect::<Check<Vec<_>>>()?;
        group.all_gather_into(&outputs, &input).and_then(|w| w.wait()).ctx("all_gather_into")?;
        let a = r.holding(DType::I64, &[0.0; 4])?;
        group.coalesced(|c| c.all_reduce(&a, ReduceOp::Sum)).and_then(|w| w.wait()).ctx("coalesced")?;
        let dump: serde_json::Value = serde_json::from_str(&group.flight_recorder_json()).ctx("the dump's JSON")?;
        let entries = dump["entries"].as_array().ok_or("the dump has no entries")?;
        let gather = entries.iter().find(|e| e["profiling_name"] == "nccl:all_gather").ok_or("no nccl:all_gather")?;
        let want: Vec<Vec<usize>> = (0..n).map(|k| vec![k + 1]).collect();
        ensure_eq!(gather["output_sizes"], serde_json::json!(want), "the list all_gather's output sizes");
        ensure_eq!(gather["input_sizes"], serde_json::json!([[me + 1]]), "the list all_gather's input sizes");
        ensure_eq!(gather["output_dtypes"], serde_json::json!(vec!["Float"; n]), "its output dtypes");
        let block = entries.iter().find(|e| e["profiling_name"] == "nccl:coalesced").ok_or("no nccl:coalesced")?;
        ensure_eq!(block["output_sizes"], serde_json::json!([[4]]), "the coalesced block's output sizes");
        ensure_eq!(block["output_dtypes"], serde_json::json!(["Long"]), "the coalesced block's dtypes");
        Ok(())
    })
}

/// Rank 0 sends rank 1 three chunks' worth where rank 1 expects two (and expects three where rank 1 sends two):
/// each rank's own splits are valid, only the pair disagrees. NCCL cannot see it (it leaves one rank waiting and may
/// complete the other with a truncated chunk); with chunk sizes checked, every rank of the group fails before
/// anything is enqueued, naming the pair, and agreeing sizes still move.
fn all_to_all_with_splits_two_ranks_disagree_on_fails_on_every_rank_when_chunk_sizes_are_checked<H: Harness>(
    h: &H,
) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder().check_chunk_sizes(true))?;
        // Rank 0 sends 1 + 3 and expects 1 + 3 from ranks 0 and 1; rank 1 sends and expects 2 + 2; other ranks
        // exchange one element with everyone.
        let splits: Vec<usize> = match r.rank {
            0 => [vec![1, 3], vec![1; n - 2]].concat(),
            1 => [vec![2, 2], vec![1; n - 2]].concat(),
            _ => vec![1; n],
        };
        let total: usize = splits.iter().sum();
        let input = r.holding(DType::F32, &vec![1.0; total])?;
        let output = r.holding(DType::F32, &vec![0.0; total])?;
        let error = match group.all_to_all_single(&output, &input, Some(&splits), Some(&splits)) {
            Ok(_) => return Err("the mismatched all_to_all_single was enqueued".into()),
            Err(error) => error,
        };
        ensure_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
        let message = error.to_string();
        ensure!(
            message.contains("chunk sizes disagree") && message.contains("rank 0 sends rank 1 3 elements"),
            "the error does not name the pair: {message}"
        );
        // The list form is checked the same way.
        let lists = |sizes: &[usize], value: f64| -> Check<Vec<_>> {
            sizes.iter().map(|&k| r.holding(DType::F32, &vec![value; k])).collect()
        };
        let (inputs, outputs) = (lists(&splits, 1.0)?, lists(&splits, 0.0)?);
        let error = group.all_to_all(&outputs, &inputs).err().ok_or("the mismatched all_to_all was enqueued")?;
        ensure!(error.to_string().contains("chunk sizes disagree"), "the list form's error: {error}");
        ensure_eq!(group.counters().ops_issued, 0, "ops enqueued");
        ensure_eq!(group.counters().comms_created, 0, "communicators created for refused ops");
        // Sizes that agree pass the check and move: rank i sends rank j i + 1 elements.
        let sends: Vec<usize> = vec![r.rank + 1; n];
        let recvs: Vec<usize> = (1..=n).collect();
        let input = r.holding(DType::F32, &vec![r.rank as f64; sends.iter().sum()])?;
        let output = r.holding(DType::F32, &vec![-1.0; recvs.iter().sum()])?;
        group
            .all_to_all_single(&output, &input, Some(&recvs), Some(&sends))
            .ctx("all_to_all_single")?
            .wait()
            .ctx("wait")?;
        let want: Vec<f64> = (0..n).flat_map(|k| vec![k as f64; k + 1]).collect();
        ensure_eq!(r.read(&output)?, want, "the agreeing all_to_all_single's output");
        Ok(())
    })
}

/// A checked op on a group that can run no op (revoked, aborted, shut down) fails at once with the group's error,
/// instead of waiting for chunk sizes no rank will publish (only rank 0 makes the ops).
fn a_checked_op_of_a_revoked_aborted_or_shut_down_group_fails_at_once_with_its_error<H: Harness>(
    h: &H,
) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let input = r.holding(DType::F32, &vec![1.0; n])?;
        let output = r.holding(DType::F32, &vec![0.0; n])?;
        let outputs = (0..n).map(|_| r.holding(DType::F32, &[0.0])).collect::<Check<Vec<_>>>()?;
        let one = r.holding(DType::F32, &[1.0])?;
        let ends = ["revoke", "abort", "shutdown"];
        for (at, end) in ends.iter().enumerate() {
            // A long group timeout: a checked op that waited for rows would take it.
            let options = Options::builder().check_chunk_sizes(true).timeout(Duration::from_secs(600));
            let group = r.group(&format!("{at}"), options)?;
            match *end {
                "revoke" => group.revoke("the case revokes it"),
                "abort" => group.abort("the case aborts it"),
                _ => group.shutdown().ctx("shutdown")?,
            }
            if r.rank != 0 {
                continue;
            }
            let want = if *end == "revoke" { ErrorKind::Revoked } else { ErrorKind::Aborted };
            let (single, took) = r.host_time(|| group.all_to_all_single(&output, &input, None, None).err());
            ensure_eq!(single.map(|e| e.kind()), Some(want), "all_to_all_single after {end}");
            ensure!(took < at_once(clock), "all_to_all_single after {end} took {took:?}");
            let (list, took) = r.host_time(|| group.all_gather_into(&outputs, &one).err());
            ensure_eq!(list.map(|e| e.kind()), Some(want), "all_gather_into after {end}");
            ensure!(took < at_once(clock), "all_gather_into after {end} took {took:?}");
        }
        Ok(())
    })
}

/// Rank 0 refuses its checked op on its own arguments (its splits do not sum to its buffer's length); the other
/// ranks' identical valid ops fail too, naming rank 0's refusal, instead of going ahead; the checked ops that follow
/// stay in step and move.
fn a_checked_op_one_rank_refuses_fails_on_every_rank_and_later_checked_ops_stay_in_step<H: Harness>(
    h: &H,
) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder().check_chunk_sizes(true))?;
        let input = r.holding(DType::F32, &vec![r.rank as f64; n])?;
        let output = r.holding(DType::F32, &vec![-1.0; n])?;
        let mut splits = vec![1; n];
        if r.rank == 0 {
            splits[0] += 2;
        }
        let refused = group.all_to_all_single(&output, &input, Some(&splits), Some(&splits)).err();
        let refused = refused.ok_or("the op of rank 0's refusal was enqueued")?;
        ensure_eq!(refused.kind(), ErrorKind::InvalidArgument, "{refused}");
        if r.rank != 0 {
            ensure!(refused.to_string().contains("rank 0 refused"), "the error does not name rank 0: {refused}");
        }
        for round in 0..3 {
            let work =
                group.all_to_all_single(&output, &input, None, None).map_err(|e| format!("checked op {round}: {e}"))?;
            work.wait().ctx("wait")?;
            let want: Vec<f64> = (0..n).map(|k| k as f64).collect();
            ensure_eq!(r.read(&output)?, want, "round {round}'s output");
        }
        Ok(())
    })
}

fn list_op_buffers_outlive_the_op_through_record_stream_or_the_stash<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_hazards(h));
    for avoid_record_streams in [false, true] {
        let ran = h.run(h.world_size(), |r| -> Check {
            let group = r.group("0", Options::builder().avoid_record_streams(avoid_record_streams))?;
            let n = r.size;
            let inputs = (0..n).map(|_| r.filled(1.0, 1024)).collect::<Check<Vec<_>>>()?;
            let outputs = (0..n).map(|_| r.filled(0.0, 1024)).collect::<Check<Vec<_>>>()?;
            r.sleep_current(SLEEP)?;
            let work = group.all_to_all(&outputs, &inputs).ctx("all_to_all")?;
            // The caller lets go of every buffer of both lists: only the lifetime guard keeps them from reuse.
            drop((work, inputs, outputs));
            // New allocations of the same size on the current stream, written at once.
            let reused = (0..2 * n).map(|_| r.filled(2.0, 1024)).collect::<Check<Vec<_>>>()?;
            for buffer in &reused {
                ensure_eq!(r.read(buffer)?, vec![2.0; 1024], "a new buffer");
            }
            Ok(())
        })?;
        ran.no_hazards().map_err(|e| format!("avoid_record_streams={avoid_record_streams}: {e}"))?;
        ran.all_ok()?;
    }
    pass()
}
