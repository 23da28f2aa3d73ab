//! The all-to-all and point-to-point benchmarks' Rust contestants (tasks `bench-all-to-all`, `bench-p2p`): a
//! raw NCCL loop (`ncclSend`/`ncclRecv` per peer inside one NCCL group, through nccl-sys) and the process group
//! (`all_to_all_single`, `batch_isend_irecv`), on the buffers of `pg_lab::bench_exchange`.
//!
//! The procedure is the all_reduce benchmark's: per size, interleaved raw / pg, for each trial align the ranks
//! (a one-element all_reduce and a stream synchronize), queue a spin kernel so the host runs ahead, record a
//! timing event, enqueue K ops (the process group: the call, then `wait()`), record an event, synchronise.
//! Device time per op = elapsed / K; host enqueue and `wait()` times are host clocks around each call. Medians
//! over trials (device) and over every op (host). What arrived is checked once per size and contestant.

use std::time::Instant;

use pg_core::{DType, Device as _, Options, P2POp, ReduceOp};
use pg_lab::bench_exchange::{pg_loop, AllToAll, Exchange as _, Ring, Split, RING_NOT_APPLICABLE};
use pg_lab::results::exchange::{ExchangeRank, ExchangeRankRow};
use pg_nccl::raw::RawComm;
use pg_nccl::{Buffer, Nccl, Stream};
use serde_json::Value;

use crate::bench::{median, spin_for};
use crate::util::{filled, group, Group};
use crate::Rank;

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// What one op exchanges.
#[derive(Clone, Copy)]
enum Exchange<'a> {
    AllToAll(&'a AllToAll<Nccl>),
    Ring(&'a Ring<Nccl>),
}

/// Who enqueues it.
#[derive(Clone, Copy)]
enum Contestant<'a> {
    /// The raw loop on its own communicator and pool stream.
    Raw { comm: &'a RawComm, stream: &'a Stream },
    /// The process group, the caller's current stream being the legacy default stream (as in PyTorch).
    Pg { pg: &'a Group },
}

impl Contestant<'_> {
    fn name(&self) -> &'static str {
        match self {
            Contestant::Raw { .. } => "raw",
            Contestant::Pg { .. } => "pg",
        }
    }
}

fn raw_op(comm: &RawComm, stream: &Stream, op: Exchange<'_>) -> Result<(), String> {
    match op {
        Exchange::AllToAll(case) => {
            comm.all_to_all_single(&case.input, &case.output, &case.input_splits, &case.output_splits, stream)
        }
        Exchange::Ring(ring) => comm.send_recv(&ring.send, ring.next, &ring.recv, ring.prev, stream),
    }
    .map_err(e)
}

impl<'a> Exchange<'a> {
    /// The exchange as the process group contestant's loop takes it.
    fn generic(self) -> &'a dyn pg_lab::bench_exchange::Exchange<Nccl> {
        match self {
            Exchange::AllToAll(case) => case,
            Exchange::Ring(ring) => ring,
        }
    }
}

/// Runs one op outside timing, waits for it, and checks what arrived.
fn check(ctx: &Rank, who: Contestant<'_>, op: Exchange<'_>) -> Result<(), String> {
    let device = &ctx.device;
    op.generic().clear(device).map_err(e)?;
    match who {
        Contestant::Raw { comm, stream } => {
            // The raw stream is ordered after the clear by a device synchronize, then the host after it.
            device.synchronize().map_err(e)?;
            raw_op(comm, stream, op)?;
            stream.cuda().synchronize().map_err(e)?;
        }
        Contestant::Pg { pg } => op.generic().enqueue(pg).and_then(|work| work.wait()).map_err(e)?,
    }
    op.generic().check(device).map_err(|err| format!("{}: {err}", who.name()))
}

struct Sample {
    device_us: f64,
    enqueue_us: Vec<f64>,
    wait_us: Vec<f64>,
}

fn trial(ctx: &Rank, who: Contestant<'_>, op: Exchange<'_>, tiny: &Buffer, ops: usize) -> Result<Sample, String> {
    let device = &ctx.device;
    let cuda = device.cuda();
    let stream = match who {
        Contestant::Raw { stream, .. } => stream.clone(),
        Contestant::Pg { .. } => device.current_stream(),
    };
    // Align the ranks.
    match who {
        Contestant::Raw { comm, stream } => comm.all_reduce_in_place(tiny, ReduceOp::Sum, stream).map_err(e)?,
        Contestant::Pg { pg } => pg.all_reduce_sync(tiny, ReduceOp::Sum).map_err(e)?,
    }
    stream.cuda().synchronize().map_err(e)?;
    let start = cuda.timing_event().map_err(e)?;
    let end = cuda.timing_event().map_err(e)?;
    cuda.sleep_kernel(stream.cuda(), spin_for(ops)).map_err(e)?;
    start.record(stream.cuda()).map_err(e)?;
    let (enqueue_us, wait_us) = match who {
        Contestant::Raw { comm, stream } => {
            let mut enqueue_us = Vec::with_capacity(ops);
            for _ in 0..ops {
                let t = Instant::now();
                raw_op(comm, stream, op)?;
                enqueue_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            (enqueue_us, Vec::new())
        }
        // The loop the simulated backend's tests run too.
        Contestant::Pg { pg } => {
            let times = pg_loop(pg, op.generic(), ops).map_err(e)?;
            (times.enqueue_us, times.wait_us)
        }
    };
    end.record(stream.cuda()).map_err(e)?;
    let elapsed = end.elapsed_since(&start).map_err(e)?;
    Ok(Sample { device_us: elapsed.as_secs_f64() * 1e6 / ops as f64, enqueue_us, wait_us })
}

/// busbw from algbw: nccl-tests' definitions (all-to-all moves (n-1)/n of its bytes over links; a ring of
/// send/recv pairs moves all of them).
pub fn busbw(op: &str, algbw: f64, world: usize) -> f64 {
    match op {
        "all-to-all" => algbw * (world as f64 - 1.0) / world as f64,
        _ => algbw,
    }
}

/// The timed rows of one exchange at one size: one per contestant.
fn measure(
    ctx: &Rank,
    contestants: &[Contestant<'_>],
    op: Exchange<'_>,
    tiny: &Buffer,
    bytes: usize,
    fields: &ExchangeRankRow,
) -> Result<Vec<ExchangeRankRow>, String> {
    let ops = ctx.settings.bench_profile.ops_per_trial(bytes);
    for &who in contestants {
        check(ctx, who, op)?;
    }
    // Warm-up trial per contestant (lazy connection, registration), then interleaved trials.
    for &who in contestants {
        trial(ctx, who, op, tiny, ops.min(20))?;
    }
    let mut samples: Vec<Vec<Sample>> = contestants.iter().map(|_| Vec::new()).collect();
    for _ in 0..ctx.settings.bench_trials {
        for (index, &who) in contestants.iter().enumerate() {
            samples[index].push(trial(ctx, who, op, tiny, ops)?);
        }
    }
    let name = match op {
        Exchange::AllToAll(_) => "all-to-all",
        Exchange::Ring(_) => "p2p",
    };
    let mut rows = Vec::new();
    for (who, samples) in contestants.iter().zip(samples) {
        let mut device_us: Vec<f64> = samples.iter().map(|s| s.device_us).collect();
        let mut enqueue: Vec<f64> = samples.iter().flat_map(|s| s.enqueue_us.iter().copied()).collect();
        let mut wait: Vec<f64> = samples.iter().flat_map(|s| s.wait_us.iter().copied()).collect();
        let time_us = median(&mut device_us);
        let algbw = bytes as f64 / (time_us * 1e-6) / 1e9;
        rows.push(ExchangeRankRow {
            algbw_gbps: Some(algbw),
            busbw_gbps: Some(busbw(name, algbw, ctx.world)),
            bytes: bytes as u64,
            contestant: who.name().to_owned(),
            device_us_trials: device_us,
            host_enqueue_us: Some(median(&mut enqueue)),
            ops_per_trial: ops as u64,
            time_us: Some(time_us),
            trials: ctx.settings.bench_trials as u64,
            wait_us: (!wait.is_empty()).then(|| median(&mut wait)),
            ..fields.clone()
        });
    }
    Ok(rows)
}

/// The raw communicator: its own unique id through the store under `key`.
fn raw_comm(ctx: &Rank, key: &str) -> Result<RawComm, String> {
    let device = &ctx.device;
    let id = if ctx.rank == 0 {
        let id = device.new_unique_id().map_err(e)?;
        ctx.store.set(key, &id.0).map_err(e)?;
        id
    } else {
        pg_core::UniqueId(ctx.store.get(key).map_err(e)?)
    };
    RawComm::new(device, &id, ctx.world, ctx.rank).map_err(e)
}

/// Task `bench-all-to-all`: equal and skewed splits, every size, raw and pg.
pub fn run_all_to_all(ctx: &Rank) -> Result<Value, String> {
    let device = &ctx.device;
    let raw = raw_comm(ctx, "bench-all-to-all-raw-id")?;
    let raw_stream = device.stream_from_pool(false).map_err(e)?;
    let pg = group(ctx, "bench-all-to-all", Options::builder())?;
    let tiny = filled(ctx, DType::F32, 1, 1.0)?;
    pg.all_reduce_sync(&tiny, ReduceOp::Sum).map_err(e)?;
    let contestants = [Contestant::Raw { comm: &raw, stream: &raw_stream }, Contestant::Pg { pg: &pg }];
    let mut rows = Vec::new();
    for bytes in ctx.settings.bench_profile.exchange_sizes(ctx.settings.bench_max_bytes) {
        for split in Split::ALL {
            let case = AllToAll::<Nccl>::new(device, split, bytes, ctx.rank, ctx.world).map_err(e)?;
            let fields = ExchangeRankRow {
                input_splits: Some(case.input_splits.iter().map(|&n| n as u64).collect()),
                split: Some(split.name().to_owned()),
                ..ExchangeRankRow::default()
            };
            let bytes = case.bytes();
            rows.extend(measure(ctx, &contestants, Exchange::AllToAll(&case), &tiny, bytes, &fields)?);
            device.synchronize().map_err(e)?;
        }
        println!("  rank {} all-to-all {bytes} B done", ctx.rank);
    }
    device.synchronize().map_err(e)?;
    pg.shutdown().map_err(e)?;
    drop(raw);
    rank_value("bench-all-to-all", Some(ctx.settings.bench_profile.name()), rows, None, None)
}

/// Task `bench-p2p`: the batched send/recv ring at every size, raw and pg; at world size 1 no ring exists, and
/// the result says so, with the process group's refusal of the self-send a ring of one would be.
pub fn run_p2p(ctx: &Rank) -> Result<Value, String> {
    let device = &ctx.device;
    let pg = group(ctx, "bench-p2p", Options::builder())?;
    let tiny = filled(ctx, DType::F32, 1, 1.0)?;
    pg.all_reduce_sync(&tiny, ReduceOp::Sum).map_err(e)?;
    if ctx.world < 2 {
        let refused = match pg.batch_isend_irecv(&[P2POp::send(&tiny, ctx.rank), P2POp::recv(&tiny, ctx.rank)]) {
            Ok(_) => return Err("the process group accepted a send to itself".into()),
            Err(err) => err.to_string(),
        };
        pg.shutdown().map_err(e)?;
        return rank_value("bench-p2p", None, Vec::new(), Some(RING_NOT_APPLICABLE), Some(refused));
    }
    let raw = raw_comm(ctx, "bench-p2p-raw-id")?;
    let raw_stream = device.stream_from_pool(false).map_err(e)?;
    let contestants = [Contestant::Raw { comm: &raw, stream: &raw_stream }, Contestant::Pg { pg: &pg }];
    let mut rows = Vec::new();
    for bytes in ctx.settings.bench_profile.exchange_sizes(ctx.settings.bench_max_bytes) {
        let ring = Ring::<Nccl>::new(device, bytes, ctx.rank, ctx.world).map_err(e)?;
        let fields = ExchangeRankRow::default();
        let bytes = ring.bytes();
        rows.extend(measure(ctx, &contestants, Exchange::Ring(&ring), &tiny, bytes, &fields)?);
        device.synchronize().map_err(e)?;
        println!("  rank {} p2p {bytes} B done", ctx.rank);
    }
    device.synchronize().map_err(e)?;
    pg.shutdown().map_err(e)?;
    drop(raw);
    rank_value("bench-p2p", Some(ctx.settings.bench_profile.name()), rows, None, None)
}

/// This rank's result of `task` as the JSON the launcher collects.
fn rank_value(
    task: &str,
    profile: Option<&str>,
    rows: Vec<ExchangeRankRow>,
    not_applicable: Option<&str>,
    self_send_refused: Option<String>,
) -> Result<Value, String> {
    let rank = ExchangeRank {
        not_applicable: not_applicable.map(str::to_owned),
        profile: profile.map(str::to_owned),
        rows,
        self_send_refused,
        task: task.to_owned(),
        ..ExchangeRank::default()
    };
    serde_json::to_value(rank).map_err(e)
}
