//! The interop task: memory and streams another library made, on a real GPU. cudarc `CudaSlice` memory and a range
//! of it (`Buffer::from_cuda_slice`, `from_cuda_slice_range`), a raw device pointer (`Buffer::from_raw`), cudarc
//! streams made current (`Device::wrap_stream`) so that an op orders after the caller's kernels and `wait()`
//! orders another caller stream after the op, Works awaited under `futures::executor` and tokio, and bad input
//! refused with a typed error before anything is enqueued.
//!
//! What the conformance suite already checks on NCCL is not repeated here: its interop cases run the awaitable
//! Work, `Future::then` and abort/timeout resolution through the generic harness.

use std::future::IntoFuture as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_core::{Buffer as _, ErrorKind, Options, ReduceOp, StreamGuard};
#[cfg(test)]
use pg_lab::results::checks::InteropResult;
use pg_lab::results::checks::{self, InteropCheck, InteropRank};
use pg_nccl::interop_probe as probe;
use pg_nccl::pg_cuda::cudarc::driver::{CudaContext, CudaStream, DevicePtr};
use pg_nccl::{Buffer, Nccl};
use serde_json::Value;

use crate::util::{self, Group};
use crate::Rank;

/// A check's outcome: passed with evidence, failed with why, or not applicable here with why.
enum Outcome {
    Pass(String),
    Fail(String),
    NotApplicable(String),
}

type Checked = Result<Outcome, String>;

fn cuda<T>(what: &str) -> impl Fn(T) -> String + '_
where
    T: std::fmt::Debug,
{
    move |e| format!("{what}: {e:?}")
}

/// Runs every check on this rank; the result is `{"checks": [{"name", "result", "detail"}]}`.
pub fn run(ctx: &Rank) -> Result<Value, String> {
    let theirs = CudaContext::new(ctx.device.cuda().ordinal()).map_err(cuda("CudaContext::new"))?;
    let group = util::group(ctx, "interop", Options::builder())?;
    let checks: [(&str, &dyn Fn() -> Checked); 11] = [
        ("cuda_slice_all_reduce", &|| cuda_slice(ctx, &group, &theirs)),
        ("cuda_slice_range_all_reduce", &|| cuda_slice_range(ctx, &group, &theirs)),
        ("raw_pointer_all_reduce", &|| raw_pointer(ctx, &group, &theirs)),
        ("caller_streams_order_the_op_and_wait", &|| caller_streams(ctx, &group, &theirs)),
        ("awaited_work_futures_executor", &|| awaited_futures(ctx, &group, &theirs)),
        ("awaited_works_tokio", &|| awaited_tokio(ctx, &group, &theirs)),
        ("bad_null_pointer", &|| bad_null(ctx)),
        ("bad_misaligned_pointer", &|| bad_misaligned(ctx, &theirs)),
        ("bad_range_of_a_slice", &|| bad_range(ctx, &theirs)),
        ("bad_length_or_dtype", &|| bad_length_or_dtype(ctx, &group, &theirs)),
        ("bad_device", &|| bad_device(ctx)),
    ];
    let mut results = Vec::new();
    for (name, check) in checks {
        let (result, detail) = match check() {
            Ok(Outcome::Pass(detail)) => ("pass", detail),
            Ok(Outcome::Fail(detail)) | Err(detail) => ("fail", detail),
            Ok(Outcome::NotApplicable(detail)) => ("not_applicable", detail),
        };
        eprintln!("rank {}: {name} {result}: {detail}", ctx.rank);
        results.push(checks::Outcome { detail, name: name.to_owned(), result: result.to_owned() });
    }
    group.shutdown().map_err(|e| e.to_string())?;
    serde_json::to_value(InteropRank { checks: results, versions: None }).map_err(|e| e.to_string())
}

/// `numel` f32 values `value` in cudarc memory, copied on `stream`.
fn slice_of(
    stream: &Arc<CudaStream>,
    numel: usize,
    value: f32,
) -> Result<pg_nccl::pg_cuda::cudarc::driver::CudaSlice<f32>, String> {
    stream.clone_htod(&vec![value; numel]).map_err(cuda("clone_htod"))
}

/// The slice's device address (no cudarc stream ordering is recorded).
fn address(slice: &pg_nccl::pg_cuda::cudarc::driver::CudaSlice<f32>) -> u64 {
    let (ptr, record) = slice.device_ptr(slice.stream());
    drop(record);
    ptr
}

/// Whether the buffer holds `want` in every element (read on the current stream).
fn expect_all(ctx: &Rank, buffer: &Buffer, want: f64) -> Checked {
    let values = util::read(ctx, buffer)?;
    Ok(match util::all_equal(&values, want) {
        Ok(()) => Outcome::Pass(format!("{} elements hold {want}", values.len())),
        Err(why) => Outcome::Fail(why),
    })
}

/// A refusal must be an `InvalidArgument` whose message names `naming`.
fn refused<T>(result: pg_core::Result<T>, naming: &str) -> Checked {
    Ok(match result {
        Ok(_) => Outcome::Fail("accepted".into()),
        Err(err) if err.kind() == ErrorKind::InvalidArgument && err.to_string().contains(naming) => {
            Outcome::Pass(format!("InvalidArgument: {err}"))
        }
        Err(err) => Outcome::Fail(format!("{:?} instead of an InvalidArgument naming {naming:?}: {err}", err.kind())),
    })
}

fn cuda_slice(ctx: &Rank, group: &Group, theirs: &Arc<CudaContext>) -> Checked {
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    let buffer = Buffer::from_cuda_slice(&ctx.device, slice_of(&stream, 4096, (ctx.rank + 1) as f32)?)
        .map_err(|e| e.to_string())?;
    if !buffer.is_foreign() {
        return Ok(Outcome::Fail("the buffer does not say it is foreign".into()));
    }
    let wrapped = ctx.device.wrap_stream(stream).map_err(|e| e.to_string())?;
    let _guard = StreamGuard::<Nccl>::new(&ctx.device, &wrapped);
    group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).map_err(|e| e.to_string())?;
    expect_all(ctx, &buffer, util::rank_sum(ctx.world))
}

fn cuda_slice_range(ctx: &Rank, group: &Group, theirs: &Arc<CudaContext>) -> Checked {
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    let slice = slice_of(&stream, 1024, 7.0)?;
    let base = address(&slice);
    // The range's buffer, and the whole slice through a raw-pointer buffer that keeps the range's buffer alive.
    let (part, whole) = probe::range_and_whole(&ctx.device, slice, 256..512).map_err(|e| e.to_string())?;
    if part.numel() != 256 || part.cuda().ptr() != base + 256 * 4 {
        return Ok(Outcome::Fail(format!("the range buffer is {} elements at {:#x}", part.numel(), part.cuda().ptr())));
    }
    let wrapped = ctx.device.wrap_stream(stream).map_err(|e| e.to_string())?;
    let _guard = StreamGuard::<Nccl>::new(&ctx.device, &wrapped);
    group.all_reduce(&part, ReduceOp::Sum).and_then(|w| w.wait()).map_err(|e| e.to_string())?;
    let values = util::read(ctx, &whole)?;
    let sum = 7.0 * ctx.world as f64;
    for (index, value) in values.iter().enumerate() {
        let want = if (256..512).contains(&index) { sum } else { 7.0 };
        if *value != want {
            return Ok(Outcome::Fail(format!("element {index} of the slice is {value} instead of {want}")));
        }
    }
    Ok(Outcome::Pass(format!("elements 256..512 hold {sum}, the other 768 stay 7")))
}

fn raw_pointer(ctx: &Rank, group: &Group, theirs: &Arc<CudaContext>) -> Checked {
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    let slice = slice_of(&stream, 2048, (ctx.rank + 1) as f32)?;
    stream.synchronize().map_err(cuda("synchronize"))?;
    let buffer = probe::raw_over(&ctx.device, slice).map_err(|e| e.to_string())?;
    group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).map_err(|e| e.to_string())?;
    expect_all(ctx, &buffer, util::rank_sum(ctx.world))
}

/// A caller's kernels on its stream A (a 200 ms spin, then a fill) precede an all_gather enqueued with A current;
/// `wait()` is called with the caller's stream B current, and B then reads the output. The output holds the
/// fill only if the op ordered after A's kernels and B's read after the op (B has no other tie to A).
fn caller_streams(ctx: &Rank, group: &Group, theirs: &Arc<CudaContext>) -> Checked {
    const WORDS: usize = 1 << 18;
    let (a, b) = (theirs.new_stream().map_err(cuda("new_stream"))?, theirs.new_stream().map_err(cuda("new_stream"))?);
    let input = a.alloc_zeros::<f32>(2 * WORDS).map_err(cuda("alloc_zeros"))?;
    let output = a.alloc_zeros::<f32>(2 * WORDS * ctx.world).map_err(cuda("alloc_zeros"))?;
    a.synchronize().map_err(cuda("synchronize"))?;
    let value = (ctx.rank + 1) as f32;
    let pattern = (u64::from(value.to_bits()) << 32) | u64::from(value.to_bits());
    let cycles = ctx.device.cuda().cycles_for(Duration::from_millis(200));
    probe::spin_then_fill(theirs, &a, cycles, &input, pattern)?;
    let input = Buffer::from_cuda_slice(&ctx.device, input).map_err(|e| e.to_string())?;
    let output = Buffer::from_cuda_slice(&ctx.device, output).map_err(|e| e.to_string())?;
    let (wrapped_a, wrapped_b) =
        (ctx.device.wrap_stream(a).map_err(|e| e.to_string())?, ctx.device.wrap_stream(b).map_err(|e| e.to_string())?);
    let began = Instant::now();
    let work = {
        let _current = StreamGuard::<Nccl>::new(&ctx.device, &wrapped_a);
        group.all_gather(&input, &output).map_err(|e| e.to_string())?
    };
    let _current = StreamGuard::<Nccl>::new(&ctx.device, &wrapped_b);
    work.wait().map_err(|e| e.to_string())?;
    let waited = began.elapsed();
    let values = util::read(ctx, &output)?;
    let read = began.elapsed();
    let per_rank = 2 * WORDS;
    for (index, v) in values.iter().enumerate() {
        let want = (index / per_rank + 1) as f64;
        if *v != want {
            return Ok(Outcome::Fail(format!(
                "output element {index} is {v} instead of {want} (read {read:?} after the enqueue)"
            )));
        }
    }
    Ok(Outcome::Pass(format!(
        "{} outputs right; enqueue + wait() took {waited:?} on the host, B's read returned after {read:?} (the caller's spin is 200 ms)",
        values.len()
    )))
}

fn awaited_futures(ctx: &Rank, group: &Group, theirs: &Arc<CudaContext>) -> Checked {
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    let buffer = Buffer::from_cuda_slice(&ctx.device, slice_of(&stream, 1 << 16, (ctx.rank + 1) as f32)?)
        .map_err(|e| e.to_string())?;
    let wrapped = ctx.device.wrap_stream(stream).map_err(|e| e.to_string())?;
    let _guard = StreamGuard::<Nccl>::new(&ctx.device, &wrapped);
    let work = group.all_reduce(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
    let began = Instant::now();
    futures::executor::block_on(work.into_future()).map_err(|e| format!("the awaited Work: {e}"))?;
    let took = began.elapsed();
    match expect_all(ctx, &buffer, util::rank_sum(ctx.world))? {
        Outcome::Pass(detail) => Ok(Outcome::Pass(format!("resolved after {took:?}; {detail}"))),
        other => Ok(other),
    }
}

fn awaited_tokio(ctx: &Rank, group: &Group, theirs: &Arc<CudaContext>) -> Checked {
    const JOINED: usize = 4;
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    let buffers = (0..JOINED)
        .map(|i| {
            Buffer::from_cuda_slice(&ctx.device, slice_of(&stream, 1 << 14, (ctx.rank + i) as f32)?)
                .map_err(|e| e.to_string())
        })
        .collect::<Result<Vec<_>, _>>()?;
    let wrapped = ctx.device.wrap_stream(stream).map_err(|e| e.to_string())?;
    let _guard = StreamGuard::<Nccl>::new(&ctx.device, &wrapped);
    let works = buffers
        .iter()
        .map(|b| group.all_reduce(b, ReduceOp::Sum))
        .collect::<pg_core::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().map_err(|e| e.to_string())?;
    let began = Instant::now();
    let results = runtime.block_on(async move {
        let tasks: Vec<_> = works.into_iter().map(|w| tokio::spawn(w.into_future())).collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.map_err(|e| format!("a task: {e}"))?);
        }
        Ok::<_, String>(results)
    })?;
    let took = began.elapsed();
    for (i, (result, buffer)) in results.into_iter().zip(&buffers).enumerate() {
        result.map_err(|e| format!("Work {i}: {e}"))?;
        let want = (0..ctx.world).map(|r| (r + i) as f64).sum::<f64>();
        if let Outcome::Fail(why) = expect_all(ctx, buffer, want)? {
            return Ok(Outcome::Fail(format!("buffer {i}: {why}")));
        }
    }
    Ok(Outcome::Pass(format!("{JOINED} Works awaited as tokio tasks resolved after {took:?}, each buffer right")))
}

fn bad_null(ctx: &Rank) -> Checked {
    refused(probe::raw_null(&ctx.device), "null device pointer")
}

fn bad_misaligned(ctx: &Rank, theirs: &Arc<CudaContext>) -> Checked {
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    refused(probe::raw_misaligned(&ctx.device, slice_of(&stream, 64, 0.0)?), "not aligned to its dtype")
}

fn bad_range(ctx: &Rank, theirs: &Arc<CudaContext>) -> Checked {
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    refused(
        Buffer::from_cuda_slice_range(&ctx.device, slice_of(&stream, 16, 0.0)?, 8..32),
        "elements 8..32 of a slice of 16",
    )
}

/// An all_gather whose foreign output is one element long, then one of the wrong dtype: each refused before
/// anything is enqueued (the group's sequence number does not move).
fn bad_length_or_dtype(ctx: &Rank, group: &Group, theirs: &Arc<CudaContext>) -> Checked {
    let stream = theirs.new_stream().map_err(cuda("new_stream"))?;
    let input = Buffer::from_cuda_slice(&ctx.device, slice_of(&stream, 16, 1.0)?).map_err(|e| e.to_string())?;
    let long =
        Buffer::from_cuda_slice(&ctx.device, slice_of(&stream, 16 * ctx.world + 1, 0.0)?).map_err(|e| e.to_string())?;
    let ints = stream.alloc_zeros::<i32>(16 * ctx.world).map_err(cuda("alloc_zeros"))?;
    let ints = Buffer::from_cuda_slice(&ctx.device, ints).map_err(|e| e.to_string())?;
    let before = group.status().last_enqueued_seq;
    let mut details = Vec::new();
    for (what, output) in [("length", &long), ("dtype", &ints)] {
        match refused(group.all_gather(&input, output), "")? {
            Outcome::Pass(detail) => details.push(format!("{what}: {detail}")),
            other => return Ok(other),
        }
    }
    let after = group.status().last_enqueued_seq;
    if after != before {
        return Ok(Outcome::Fail(format!("the refused ops moved the sequence number from {before:?} to {after:?}")));
    }
    Ok(Outcome::Pass(details.join("; ")))
}

fn bad_device(ctx: &Rank) -> Checked {
    let count = CudaContext::device_count().map_err(cuda("device_count"))? as usize;
    let ordinal = ctx.device.cuda().ordinal();
    if count < 2 {
        return Ok(Outcome::NotApplicable(format!("{count} GPU: no other device to take memory or a stream from")));
    }
    let other = CudaContext::new((ordinal + 1) % count).map_err(cuda("CudaContext::new"))?;
    let stream = other.new_stream().map_err(cuda("new_stream"))?;
    let slice = match refused(Buffer::from_cuda_slice(&ctx.device, slice_of(&stream, 16, 0.0)?), "")? {
        Outcome::Pass(detail) => detail,
        other => return Ok(other),
    };
    match refused(ctx.device.wrap_stream(stream), "")? {
        Outcome::Pass(detail) => Ok(Outcome::Pass(format!("slice: {slice}; stream: {detail}"))),
        other => Ok(other),
    }
}

/// The ranks' checks merged (a check passes if it passed on every rank, and does not apply if it applied on
/// none), as the table and the merged checks, and whether none failed.
pub fn merge(ranks: &[InteropRank]) -> (bool, String, Vec<InteropCheck>) {
    let names: Vec<&str> =
        ranks.first().map(|r| r.checks.iter().map(|c| c.name.as_str()).collect()).unwrap_or_default();
    let merged: Vec<InteropCheck> = names
        .iter()
        .map(|&name| {
            let results: Vec<checks::Outcome> =
                ranks.iter().filter_map(|r| r.checks.iter().find(|c| c.name == name)).cloned().collect();
            let result = if results.len() != ranks.len() || results.iter().any(|c| c.result == checks::FAIL) {
                checks::FAIL
            } else if results.iter().all(|c| c.result == checks::NOT_APPLICABLE) {
                checks::NOT_APPLICABLE
            } else {
                checks::PASS
            };
            InteropCheck { name: name.to_owned(), ranks: results, result: result.to_owned() }
        })
        .collect();
    let ok = !merged.is_empty() && merged.iter().all(|c| c.result != checks::FAIL);
    (ok, table(&merged), merged)
}

/// The merged checks as a markdown table, with the first reporting rank's detail.
pub fn table(merged: &[InteropCheck]) -> String {
    use std::fmt::Write as _;
    let mut md = String::from("\n| check | result | detail (rank 0) |\n|---|---|---|\n");
    for check in merged {
        let detail = check.ranks.first().map_or("", |c| c.detail.as_str());
        let _ = writeln!(md, "| {} | {} | {} |", check.name, check.result, detail.replace('|', "/"));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A check fails when a rank failed it or did not report it, and does not apply only where it applied on no
    /// rank.
    #[test]
    fn a_check_passes_only_where_every_rank_passed_it() {
        let outcome = |name: &str, result: &str| checks::Outcome {
            detail: format!("{name} {result}"),
            name: name.to_owned(),
            result: result.to_owned(),
        };
        let rank = |checks: Vec<checks::Outcome>| InteropRank { checks, versions: None };
        let ranks = [
            rank(vec![
                outcome("a", "pass"),
                outcome("b", "pass"),
                outcome("c", "not_applicable"),
                outcome("d", "pass"),
            ]),
            rank(vec![outcome("a", "pass"), outcome("b", "fail"), outcome("c", "not_applicable")]),
        ];
        let (ok, md, merged) = merge(&ranks);
        assert!(!ok);
        let words: Vec<(&str, &str)> = merged.iter().map(|c| (c.name.as_str(), c.result.as_str())).collect();
        assert_eq!(words, [("a", "pass"), ("b", "fail"), ("c", "not_applicable"), ("d", "fail")]);
        assert_eq!(merged[3].ranks.len(), 1, "rank 1 did not report d");
        assert!(md.contains("| b | fail | b pass |"), "{md}");
        assert!(merge(&ranks[..1]).0, "rank 0 alone passed or did not apply everywhere");
    }

    /// The table of every committed interop result, rendered from its JSON alone, is the committed table.
    #[test]
    fn the_committed_tables_render_from_the_committed_json() {
        let mut seen = 0;
        for pg_lab::results::Committed { name, json, md } in pg_lab::results::committed("interop-") {
            let result: InteropResult = serde_json::from_str(&json).expect("an interop result");
            let rendered = table(&result.checks);
            assert!(md.contains(&rendered), "{name}: the rendered table\n{rendered}\nis not in its .md");
            seen += 1;
        }
        assert!(seen > 0, "no committed interop result");
    }
}
