//! The all_reduce benchmark's Rust contestants: a raw NCCL loop (nccl-sys) and the process group.
//!
//! Per size, interleaved contestants, for each trial: align the ranks (a one-element all_reduce and a stream
//! synchronize), queue a spin kernel (100 us per op, at least 5 ms) so the host runs ahead, record a timing event,
//! enqueue K in-place all_reduces (the process group: `all_reduce` then `wait()` each, the synchronous form), record
//! an event, synchronise. Device time per op = elapsed / K, counted only for trials in which the GPU was still
//! spinning when the host had enqueued every op (the event after the spin not yet passed): otherwise the host set
//! the pace and the events timed it, not the device. Host enqueue and `wait()` times are host clocks around each
//! call. Host throughput is K back-to-back ops with no spin, timed on the host from the first call to the return of
//! the last. Medians over trials (device) and over every op (host). Results are checked once per size.
//!
//! `pg-traced` is the default process group with the op timeline on (`Options::trace_dir`, what `PG_TRACE=DIR`
//! sets), beside `pg` in the same run; its rank files go to `PG_BENCH_TRACE_DIR` (default
//! `$TMPDIR/pg-bench-allreduce-trace`), and the results say what they hold (`trace`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pg_core::{DType, Device as _, Event as _, Options, OptionsBuilder, ReduceOp, Stream as _, StreamGuard};
use pg_lab::results::bench::{BenchRank, BenchRankRow, HostCosts, TraceSummary};
use pg_nccl::raw::RawComm;
use pg_nccl::{Buffer, Nccl, Stream};
use serde_json::Value;

use crate::util::{all_equal, filled, group, rank_sum, read, Group};
use crate::Rank;

pub use pg_lab::results::median;

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// The spin queued before a trial: long enough for the host to enqueue every op before the GPU reaches them
/// (PyTorch needs 30-45 us per op), so that events time the device, not the host.
pub fn spin_for(ops: usize) -> Duration {
    Duration::from_micros((ops as u64 * 100).max(5_000))
}

struct Sample {
    device_us: f64,
    /// Whether the spin was still running when the host had enqueued the last op (see [`device_time_us`]).
    gpu_ahead: bool,
    enqueue_us: Vec<f64>,
    wait_us: Vec<f64>,
    /// Per op, the host time inside `ncclAllReduce` (pg contestants, with `PG_NCCL_TIME_CALLS=1`).
    nccl_us: Vec<f64>,
    /// Per op, the host time of each step of the collective template (pg contestants, `PG_TIME_ENQUEUE=1`).
    steps_us: Vec<[f64; 7]>,
}

enum Contestant<'a> {
    /// `ncclAllReduce` on a pool stream, nothing else.
    Raw { comm: &'a RawComm, stream: &'a Stream },
    /// The raw loop plus the driver calls the process group's semantics need and nothing else: an input-ready
    /// event recorded on the current stream and waited on by the communication stream, and a fresh end event
    /// recorded after the op. Its distance from `Raw` is the floor any implementation of those semantics pays.
    ///
    /// With one input-ready event it is re-recorded every op, as PyTorch and the process group do; with a ring of
    /// them (`PG_BENCH_EVENT_RING=1`, contestant `raw-with-event-ring`), each op records one whose last record
    /// is long complete, to see whether re-recording a pending event costs the driver more.
    ///
    /// `raw-with-events-pg-stream` is the same on the process group's own communication stream: the driver's cost
    /// of a record or a wait depends on the stream (the hardware queue the driver gave it), so that the difference
    /// from `pg` leaves only pg's own work.
    RawWithEvents { comm: &'a RawComm, stream: &'a Stream, input_ready: &'a [pg_nccl::Event], pg_stream: bool },
    /// A process group, the caller's current stream being the legacy default stream (as in PyTorch). `pg` is
    /// the default options; `pg-traced` the default options with the op timeline on (`Options::trace_dir`, as
    /// `PG_TRACE=DIR` sets it), beside `pg` in every run so that the cost of tracing shows against tracing off;
    /// the other names are [`GROUPS`] of one setting changed each, to tell which part of the default
    /// configuration costs what.
    Pg { pg: &'a Group, name: &'static str },
    /// The default process group with a pool stream made current (a `StreamGuard`), to see what the legacy
    /// stream costs.
    PgOnStream { pg: &'a Group, stream: &'a Stream },
}

/// How a variant group's options differ from the default ones.
type Variant = fn(OptionsBuilder) -> OptionsBuilder;

/// The process-group contestants besides `pg` itself, in creation order after it: each differs from the
/// default options in one setting, except `pg-twin`, which is the default options again. Every group has its own
/// communicator and communication stream, and the device time of the two waits per op between the current
/// stream and the communication stream depends on the hardware queues the driver gave that pair of streams
/// (nothing for a shared queue, over a microsecond per op more for some pairs than for others on an H200;
/// `bench/results/stream-pairs-h200x1.md`). `pg-twin` differs from `pg`
/// in nothing but its stream: when the two differ in device time, so may a variant and `pg` without the
/// variant's setting costing anything.
const GROUPS: [(&str, Variant); 4] = [
    ("pg-no-watchdog-no-fr", |o| o.enable_watchdog(false).trace_buffer_size(0)),
    ("pg-no-watchdog", |o| o.enable_watchdog(false)),
    ("pg-no-reuse", |o| o.reuse_works(false)),
    ("pg-twin", |o| o),
];

impl Contestant<'_> {
    fn name(&self) -> &'static str {
        match self {
            Contestant::Raw { .. } => "raw",
            Contestant::RawWithEvents { input_ready, .. } if input_ready.len() > 1 => "raw-with-event-ring",
            Contestant::RawWithEvents { pg_stream: true, .. } => "raw-with-events-pg-stream",
            Contestant::RawWithEvents { .. } => "raw-with-events",
            Contestant::Pg { name, .. } => name,
            Contestant::PgOnStream { .. } => "pg-current-pool-stream",
        }
    }

    fn group(&self) -> Option<&Group> {
        match self {
            Contestant::Raw { .. } | Contestant::RawWithEvents { .. } => None,
            Contestant::Pg { pg, .. } | Contestant::PgOnStream { pg, .. } => Some(pg),
        }
    }

    /// The stream the contestant's timing events and spin go on.
    fn timed_stream(&self, device: &pg_nccl::Device) -> Stream {
        match self {
            Contestant::Raw { stream, .. } | Contestant::RawWithEvents { stream, .. } => (*stream).clone(),
            _ => device.current_stream(),
        }
    }

    /// Aligns the ranks with a one-element all_reduce on the contestant's path, then drains `stream`.
    fn align(&self, tiny: &Buffer, stream: &Stream) -> Result<(), String> {
        match (self, self.group()) {
            (Contestant::Raw { comm, stream } | Contestant::RawWithEvents { comm, stream, .. }, _) => {
                comm.all_reduce_in_place(tiny, ReduceOp::Sum, stream).map_err(e)?
            }
            (_, Some(pg)) => pg.all_reduce_sync(tiny, ReduceOp::Sum).map_err(e)?,
            (_, None) => unreachable!("only the raw contestants have no group"),
        }
        stream.cuda().synchronize().map_err(e)
    }
}

/// The device time per op of a contestant at one size: the median over the trials in which the GPU was ahead of
/// the host (`(us per op, gpu ahead)` per trial), or `None` when it never was: then every trial timed the host.
pub fn device_time_us(trials: &[(f64, bool)]) -> Option<f64> {
    let mut ahead: Vec<f64> = trials.iter().filter(|(_, ahead)| *ahead).map(|(us, _)| *us).collect();
    (!ahead.is_empty()).then(|| median(&mut ahead))
}

/// Host throughput: `ops` back-to-back ops of `who` with no spin ahead of them (the process group: `all_reduce`
/// then `wait()`, as in a trial), in ops per second of host time from the first call to the last return.
fn throughput(ctx: &Rank, who: &Contestant<'_>, buffer: &Buffer, tiny: &Buffer, ops: usize) -> Result<f64, String> {
    let device = &ctx.device;
    let _guard = match who {
        Contestant::PgOnStream { stream, .. } => Some(StreamGuard::<Nccl>::new(device, stream)),
        _ => None,
    };
    let stream = who.timed_stream(device);
    who.align(tiny, &stream)?;
    let started = Instant::now();
    for op in 0..ops {
        match (who, who.group()) {
            (Contestant::Raw { comm, stream }, _) => {
                comm.all_reduce_in_place(buffer, ReduceOp::Sum, stream).map_err(e)?
            }
            (Contestant::RawWithEvents { comm, stream, input_ready, .. }, _) => {
                let input_ready = &input_ready[op % input_ready.len()];
                input_ready.record(&device.current_stream()).map_err(e)?;
                stream.wait_event(input_ready).map_err(e)?;
                comm.all_reduce_in_place(buffer, ReduceOp::Sum, stream).map_err(e)?;
                let end = std::sync::Arc::new(device.create_event());
                end.record(stream).map_err(e)?;
                device.current_stream().wait_event(&end).map_err(e)?;
            }
            (_, Some(pg)) => pg.all_reduce(buffer, ReduceOp::Sum).and_then(|work| work.wait()).map_err(e)?,
            (_, None) => unreachable!("only the raw contestants have no group"),
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    stream.cuda().synchronize().map_err(e)?;
    device.synchronize().map_err(e)?;
    Ok(ops as f64 / seconds)
}

fn trial(ctx: &Rank, who: &Contestant<'_>, buffer: &Buffer, tiny: &Buffer, ops: usize) -> Result<Sample, String> {
    let device = &ctx.device;
    let cuda = device.cuda();
    let _guard = match who {
        Contestant::PgOnStream { stream, .. } => Some(StreamGuard::<Nccl>::new(device, stream)),
        _ => None,
    };
    let stream = who.timed_stream(device);
    who.align(tiny, &stream)?;
    let start = cuda.timing_event().map_err(e)?;
    let end = cuda.timing_event().map_err(e)?;
    cuda.sleep_kernel(stream.cuda(), spin_for(ops)).map_err(e)?;
    start.record(stream.cuda()).map_err(e)?;
    let mut enqueue_us = Vec::with_capacity(ops);
    let mut wait_us = Vec::with_capacity(ops);
    let mut nccl_us = Vec::new();
    let mut steps_us = Vec::new();
    let step_totals = || pg_core::enqueue_step_totals().map(|(_, total)| total.as_secs_f64() * 1e6);
    for op in 0..ops {
        match (who, who.group()) {
            (Contestant::Raw { comm, stream }, _) => {
                let t = Instant::now();
                comm.all_reduce_in_place(buffer, ReduceOp::Sum, stream).map_err(e)?;
                enqueue_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            (Contestant::RawWithEvents { comm, stream, input_ready, .. }, _) => {
                let input_ready = &input_ready[op % input_ready.len()];
                let t = Instant::now();
                input_ready.record(&device.current_stream()).map_err(e)?;
                stream.wait_event(input_ready).map_err(e)?;
                comm.all_reduce_in_place(buffer, ReduceOp::Sum, stream).map_err(e)?;
                let end = std::sync::Arc::new(device.create_event());
                end.record(stream).map_err(e)?;
                enqueue_us.push(t.elapsed().as_secs_f64() * 1e6);
                // What `wait()` does: the current stream waits for the end event.
                let t = Instant::now();
                device.current_stream().wait_event(&end).map_err(e)?;
                wait_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            (_, Some(pg)) => {
                let (_, before) = pg_nccl::call_timing::totals();
                let steps_before = step_totals();
                let t = Instant::now();
                let work = pg.all_reduce(buffer, ReduceOp::Sum).map_err(e)?;
                enqueue_us.push(t.elapsed().as_secs_f64() * 1e6);
                if pg_nccl::call_timing::enabled() {
                    let (_, after) = pg_nccl::call_timing::totals();
                    nccl_us.push((after - before).as_secs_f64() * 1e6);
                }
                let steps_after = step_totals();
                if steps_after.iter().sum::<f64>() > 0.0 {
                    steps_us.push(std::array::from_fn(|i| steps_after[i] - steps_before[i]));
                }
                let t = Instant::now();
                work.wait().map_err(e)?;
                wait_us.push(t.elapsed().as_secs_f64() * 1e6);
            }
            (_, None) => unreachable!("only the raw contestants have no group"),
        }
    }
    // The event after the spin not yet passed: the GPU was still spinning when the host was done enqueuing.
    let gpu_ahead = !start.query().map_err(e)?;
    end.record(stream.cuda()).map_err(e)?;
    let elapsed = end.elapsed_since(&start).map_err(e)?;
    let device_us = elapsed.as_secs_f64() * 1e6 / ops as f64;
    Ok(Sample { device_us, gpu_ahead, enqueue_us, wait_us, nccl_us, steps_us })
}

pub fn run(ctx: &Rank) -> Result<Value, String> {
    let device = &ctx.device;
    let world = ctx.world;
    let me = (ctx.rank + 1) as f64;
    // The raw communicator: its own unique id through the store, its own stream from the pool.
    let id = if ctx.rank == 0 {
        let id = device.new_unique_id().map_err(e)?;
        ctx.store.set("bench-raw-id", &id.0).map_err(e)?;
        id
    } else {
        pg_core::UniqueId(ctx.store.get("bench-raw-id").map_err(e)?)
    };
    let raw = RawComm::new(device, &id, world, ctx.rank).map_err(e)?;
    let raw_stream = device.stream_from_pool(false).map_err(e)?;
    let user_stream = device.stream_from_pool(false).map_err(e)?;
    let pg = group(ctx, "bench", Options::builder())?;
    let trace_dir = bench_trace_dir();
    let traced = traced_group(ctx, "bench-traced", &trace_dir)?;
    // The network profile measures the raw contestants, pg and pg without its watchdog and flight recorder only
    // (the large sizes' ops there cost milliseconds): what pg's threads and recorder cost over sockets.
    let variant_groups: &[(&str, Variant)] =
        if ctx.settings.bench_profile.full_breakdown() { &GROUPS } else { &GROUPS[..1] };
    let variants: Vec<(&'static str, Group)> = variant_groups
        .iter()
        .map(|(name, options)| Ok((*name, group(ctx, &format!("bench-{name}"), options(Options::builder()))?)))
        .collect::<Result<_, String>>()?;
    let input_ready = device.create_event();
    // More events than ops per trial: each one's last record completed long before it is recorded again.
    let event_ring: Vec<pg_nccl::Event> = match std::env::var("PG_BENCH_EVENT_RING").as_deref() {
        Ok("1") => (0..512).map(|_| device.create_event()).collect(),
        _ => Vec::new(),
    };
    let one_event = match event_ring.is_empty() {
        true => None,
        false => Some(group(ctx, "bench-one-event", Options::builder().input_ready_events(1))?),
    };
    let tiny = filled(ctx, DType::F32, 1, 1.0)?;
    pg.all_reduce_sync(&tiny, ReduceOp::Sum).map_err(e)?;
    let pg_comm_stream = pg.comm_stream(&device.index().to_string()).ok_or("pg has no communication stream")?;
    traced.all_reduce_sync(&tiny, ReduceOp::Sum).map_err(e)?;
    for (_, variant) in &variants {
        variant.all_reduce_sync(&tiny, ReduceOp::Sum).map_err(e)?;
    }
    if let Some(one_event) = &one_event {
        one_event.all_reduce_sync(&tiny, ReduceOp::Sum).map_err(e)?;
    }

    let mut rows = Vec::new();
    let profile = ctx.settings.bench_profile;
    for bytes in profile.all_reduce_sizes(ctx.settings.bench_max_bytes) {
        let numel = (bytes / 4).max(1);
        let ops = profile.ops_per_trial(bytes);
        let buffer = filled(ctx, DType::F32, numel, me)?;
        // Check once per size, outside timing: raw, then pg.
        raw.all_reduce_in_place(&buffer, ReduceOp::Sum, &raw_stream).map_err(e)?;
        raw_stream.cuda().synchronize().map_err(e)?;
        all_equal(&read(ctx, &buffer)?, rank_sum(world)).map_err(|m| format!("raw {bytes} B: {m}"))?;
        let buffer = filled(ctx, DType::F32, numel, me)?;
        pg.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
        all_equal(&read(ctx, &buffer)?, rank_sum(world)).map_err(|m| format!("pg {bytes} B: {m}"))?;

        let mut contestants = vec![
            Contestant::Raw { comm: &raw, stream: &raw_stream },
            Contestant::Pg { pg: &pg, name: "pg" },
            Contestant::RawWithEvents {
                comm: &raw,
                stream: &raw_stream,
                input_ready: std::slice::from_ref(&input_ready),
                pg_stream: false,
            },
            Contestant::RawWithEvents {
                comm: &raw,
                stream: &pg_comm_stream,
                input_ready: std::slice::from_ref(&input_ready),
                pg_stream: true,
            },
        ];
        if profile.full_breakdown() {
            contestants.insert(2, Contestant::PgOnStream { pg: &pg, stream: &user_stream });
        }
        contestants.extend(variants.iter().map(|(name, pg)| Contestant::Pg { pg, name }));
        if let Some(one_event) = &one_event {
            contestants.push(Contestant::RawWithEvents {
                comm: &raw,
                stream: &raw_stream,
                input_ready: &event_ring,
                pg_stream: false,
            });
            contestants.push(Contestant::Pg { pg: one_event, name: "pg-one-input-event" });
        }
        contestants.push(Contestant::Pg { pg: &traced, name: TRACED });
        let mut samples: Vec<Vec<Sample>> = contestants.iter().map(|_| Vec::new()).collect();
        // Warm-up trial per contestant (lazy connection, registration), then interleaved trials.
        for who in &contestants {
            trial(ctx, who, &buffer, &tiny, ops.min(20))?;
        }
        for _ in 0..ctx.settings.bench_trials {
            for (index, who) in contestants.iter().enumerate() {
                let buffer = filled(ctx, DType::F32, numel, 1.0)?;
                samples[index].push(trial(ctx, who, &buffer, &tiny, ops)?);
            }
        }
        let mut host_ops_per_s = Vec::with_capacity(contestants.len());
        for who in &contestants {
            host_ops_per_s.push(throughput(ctx, who, &buffer, &tiny, ops)?);
        }
        for ((who, samples), host_ops_per_s) in contestants.iter().zip(samples).zip(host_ops_per_s) {
            let trials: Vec<(f64, bool)> = samples.iter().map(|s| (s.device_us, s.gpu_ahead)).collect();
            let device_us: Vec<f64> = trials.iter().map(|(us, _)| *us).collect();
            let gpu_ahead: Vec<bool> = trials.iter().map(|(_, ahead)| *ahead).collect();
            let mut enqueue: Vec<f64> = samples.iter().flat_map(|s| s.enqueue_us.iter().copied()).collect();
            let mut wait: Vec<f64> = samples.iter().flat_map(|s| s.wait_us.iter().copied()).collect();
            let mut nccl: Vec<f64> = samples.iter().flat_map(|s| s.nccl_us.iter().copied()).collect();
            // The process group's own host time per op: enqueue minus the time inside ncclAllReduce.
            let mut own: Vec<f64> = samples
                .iter()
                .flat_map(|s| s.enqueue_us.iter().zip(&s.nccl_us).map(|(total, inside)| total - inside))
                .collect();
            // The median of each step of the template over every op (with `PG_TIME_ENQUEUE=1`).
            let steps: BTreeMap<String, f64> = pg_core::EnqueueStep::ALL
                .iter()
                .enumerate()
                .filter_map(|(i, step)| {
                    let mut values: Vec<f64> =
                        samples.iter().flat_map(|s| s.steps_us.iter().map(move |op| op[i])).collect();
                    (!values.is_empty()).then(|| (step.name().to_owned(), median(&mut values)))
                })
                .collect();
            // NaN (null in the JSON) when no trial had the GPU ahead: the events timed the host.
            let time_us = device_time_us(&trials).unwrap_or(f64::NAN);
            let algbw = bytes as f64 / (time_us * 1e-6) / 1e9;
            let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
            let median_of = |values: &mut Vec<f64>| (!values.is_empty()).then(|| median(values));
            rows.push(BenchRankRow {
                algbw_gbps: Some(algbw),
                busbw_gbps: Some(busbw),
                bytes: bytes as u64,
                contestant: who.name().to_owned(),
                device_us_trials: device_us,
                gpu_ahead: Some(gpu_ahead.iter().all(|ahead| *ahead)),
                gpu_ahead_trials: gpu_ahead,
                graph_launch_us: None,
                graph_nodes: None,
                host_enqueue_us: Some(median(&mut enqueue)),
                host_ops_per_s: Some(host_ops_per_s),
                nccl_call_us: median_of(&mut nccl),
                ops_per_trial: ops as u64,
                own_host_us: median_of(&mut own),
                steps_us: (!steps.is_empty()).then_some(steps),
                time_us: Some(time_us),
                trials: ctx.settings.bench_trials as u64,
                wait_us: median_of(&mut wait),
            });
        }
        println!("  rank {} {bytes} B done", ctx.rank);
    }
    // A capture the driver or NCCL refuses leaves the eager rows standing; the error says why.
    let graphs = match profile.full_breakdown() {
        true => graph_rows(ctx, &raw, &raw_stream, &pg, &user_stream, &tiny),
        false => Ok(Vec::new()),
    };
    let graph_error = match graphs {
        Ok(graph) => {
            rows.extend(graph);
            None
        }
        Err(error) => {
            println!("  rank {}: the graph contestants failed: {error}", ctx.rank);
            device.synchronize().map_err(e)?;
            Some(error)
        }
    };
    let host_costs = host_costs(ctx, &pg)?;
    device.synchronize().map_err(e)?;
    pg.shutdown().map_err(e)?;
    // Shutting down writes the traced group's file: what it holds goes into the results.
    traced.shutdown().map_err(e)?;
    let trace = trace_summary(&trace_dir, ctx.rank);
    for (_, variant) in &variants {
        variant.shutdown().map_err(e)?;
    }
    if let Some(one_event) = &one_event {
        one_event.shutdown().map_err(e)?;
    }
    drop(raw);
    let result = BenchRank {
        graph_error,
        host_costs_us: Some(host_costs),
        profile: Some(profile.name().to_owned()),
        rows,
        task: "bench".to_owned(),
        trace: Some(trace),
        ..BenchRank::default()
    };
    serde_json::to_value(result).map_err(e)
}

/// The contestant with the op timeline on.
const TRACED: &str = "pg-traced";

/// Where `pg-traced` writes its rank files: `PG_BENCH_TRACE_DIR`, else `pg-bench-allreduce-trace` in the temporary
/// directory (not the results directory: a file holds up to 65,536 ops, tens of MB).
fn bench_trace_dir() -> std::path::PathBuf {
    match std::env::var_os("PG_BENCH_TRACE_DIR") {
        Some(dir) if !dir.is_empty() => dir.into(),
        _ => std::env::temp_dir().join("pg-bench-allreduce-trace"),
    }
}

/// The default options with tracing into `dir`, whatever `PG_TRACE` says (the environment is applied first, as
/// for every group of the bench, then the directory set).
fn traced_group(ctx: &Rank, name: &str, dir: &std::path::Path) -> Result<Group, String> {
    let store = std::sync::Arc::new(pg_core::store::PrefixStore::new(name.to_owned(), ctx.store.clone()));
    let mut options =
        Options::builder().group_name(name.to_owned()).group_desc(name.to_owned()).build_with_env().map_err(e)?;
    options.trace_dir = Some(dir.to_owned());
    pg_core::ProcessGroup::new(store, ctx.rank, ctx.world, ctx.device.clone(), options).map_err(e)
}

/// What this rank's trace file holds once `pg-traced` shut down: its path and size, and per group the ops with
/// device times, without them, and dropped (the newest 65,536 are kept).
fn trace_summary(dir: &std::path::Path, rank: usize) -> TraceSummary {
    let path = dir.join(format!("rank{rank}.json"));
    let read =
        std::fs::read_to_string(&path).map_err(e).and_then(|text| serde_json::from_str::<Value>(&text).map_err(e));
    match read {
        Ok(trace) => TraceSummary::Read {
            bytes: std::fs::metadata(&path).map(|m| m.len()).ok(),
            file: path.display().to_string(),
            groups: trace["otherData"]["groups"].clone(),
        },
        Err(error) => TraceSummary::Unread { error, file: path.display().to_string() },
    }
}

/// The largest size the graph contestants run: capture pays off where the host's per-op cost matters.
const GRAPH_MAX_BYTES: usize = 1 << 20;

/// Enqueues one all_reduce of a buffer (while the contestant's stream captures).
type Enqueue<'a> = Box<dyn Fn(&Buffer) -> Result<(), String> + 'a>;

/// A graph contestant: K all_reduces captured once on `stream`, the graph then replayed there.
struct GraphContestant<'a> {
    name: &'static str,
    stream: &'a Stream,
    enqueue: Enqueue<'a>,
    /// Aligns the ranks and drains `stream`.
    align: Box<dyn Fn() -> Result<(), String> + 'a>,
}

/// Captures `ops` all_reduces of `buffer` by `who` on its stream (thread-local mode: the process group's
/// watchdog thread may query events meanwhile).
fn capture(who: &GraphContestant<'_>, buffer: &Buffer, ops: usize) -> Result<pg_nccl::Graph, String> {
    who.stream.begin_capture(pg_core::CaptureMode::ThreadLocal).map_err(e)?;
    let captured = (0..ops).try_for_each(|_| (who.enqueue)(buffer));
    // End the capture whatever happened, so that the stream is usable again.
    let graph = who.stream.end_capture().map_err(e);
    captured?;
    graph
}

/// The graph contestants, 8 B to [`GRAPH_MAX_BYTES`]: raw NCCL captured on its pool stream (`raw-graph`) and the
/// default process group captured with a pool stream current (`pg-graph`; the legacy default stream cannot be
/// captured). Per size: a check (a graph of two all_reduces replayed twice gives world x the rank sum each time),
/// then per trial a spin, one replay of K ops between timing events (device time per op = elapsed / K, under the
/// same GPU-ahead rule as the eager trials), and the host time of the launch (host cost per replayed op =
/// launch / K).
fn graph_rows(
    ctx: &Rank,
    raw: &RawComm,
    raw_stream: &Stream,
    pg: &Group,
    user_stream: &Stream,
    tiny: &Buffer,
) -> Result<Vec<BenchRankRow>, String> {
    let device = &ctx.device;
    let world = ctx.world;
    let _guard = StreamGuard::<Nccl>::new(device, user_stream);
    let contestants = [
        GraphContestant {
            name: "raw-graph",
            stream: raw_stream,
            enqueue: Box::new(|buffer| raw.all_reduce_in_place(buffer, ReduceOp::Sum, raw_stream).map_err(e)),
            align: Box::new(|| {
                raw.all_reduce_in_place(tiny, ReduceOp::Sum, raw_stream).map_err(e)?;
                raw_stream.cuda().synchronize().map_err(e)
            }),
        },
        GraphContestant {
            name: "pg-graph",
            stream: user_stream,
            enqueue: Box::new(|buffer| pg.all_reduce(buffer, ReduceOp::Sum).and_then(|work| work.wait()).map_err(e)),
            align: Box::new(|| {
                pg.all_reduce_sync(tiny, ReduceOp::Sum).map_err(e)?;
                user_stream.cuda().synchronize().map_err(e)
            }),
        },
    ];
    let mut rows = Vec::new();
    let profile = ctx.settings.bench_profile;
    for bytes in profile.all_reduce_sizes(ctx.settings.bench_max_bytes.min(GRAPH_MAX_BYTES)) {
        let numel = (bytes / 4).max(1);
        let ops = profile.ops_per_trial(bytes);
        for who in &contestants {
            // Replays give the right sums, every time.
            let check = device.alloc(DType::F32, numel).map_err(e)?;
            let graph = capture(who, &check, 2)?;
            for replay in 0..2 {
                pg_core::Device::fill(device, &check, (ctx.rank + 1) as f64, who.stream).map_err(e)?;
                graph.cuda().launch(who.stream.cuda()).map_err(e)?;
                who.stream.cuda().synchronize().map_err(e)?;
                let values = pg_core::Device::copy_to_host(device, &check, who.stream).map_err(e)?;
                let values: Vec<f64> =
                    values.chunks(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect();
                all_equal(&values, rank_sum(world) * world as f64)
                    .map_err(|m| format!("{} {bytes} B, replay {replay}: {m}", who.name))?;
            }
            drop(graph);
            // Zeros: replaying the sums keeps them finite.
            let buffer = device.alloc(DType::F32, numel).map_err(e)?;
            pg_core::Device::fill(device, &buffer, 0.0, who.stream).map_err(e)?;
            let graph = capture(who, &buffer, ops)?;
            // Warm-up replay (the first launch uploads the graph).
            graph.cuda().launch(who.stream.cuda()).map_err(e)?;
            who.stream.cuda().synchronize().map_err(e)?;
            let mut trials = Vec::new();
            let mut launch_us = Vec::new();
            for _ in 0..ctx.settings.bench_trials {
                (who.align)()?;
                let cuda = device.cuda();
                let start = cuda.timing_event().map_err(e)?;
                let end = cuda.timing_event().map_err(e)?;
                cuda.sleep_kernel(who.stream.cuda(), spin_for(ops)).map_err(e)?;
                start.record(who.stream.cuda()).map_err(e)?;
                let t = Instant::now();
                graph.cuda().launch(who.stream.cuda()).map_err(e)?;
                launch_us.push(t.elapsed().as_secs_f64() * 1e6);
                let gpu_ahead = !start.query().map_err(e)?;
                end.record(who.stream.cuda()).map_err(e)?;
                let elapsed = end.elapsed_since(&start).map_err(e)?;
                trials.push((elapsed.as_secs_f64() * 1e6 / ops as f64, gpu_ahead));
            }
            let launch = median(&mut launch_us);
            let time_us = device_time_us(&trials).unwrap_or(f64::NAN);
            let algbw = bytes as f64 / (time_us * 1e-6) / 1e9;
            let gpu_ahead: Vec<bool> = trials.iter().map(|(_, ahead)| *ahead).collect();
            rows.push(BenchRankRow {
                algbw_gbps: Some(algbw),
                busbw_gbps: Some(algbw * 2.0 * (world as f64 - 1.0) / world as f64),
                bytes: bytes as u64,
                contestant: who.name.to_owned(),
                device_us_trials: trials.iter().map(|(us, _)| *us).collect(),
                gpu_ahead: Some(gpu_ahead.iter().all(|ahead| *ahead)),
                gpu_ahead_trials: gpu_ahead,
                graph_launch_us: Some(launch),
                graph_nodes: Some(pg_core::Graph::node_count(&graph) as u64),
                // The host cost of one replayed op: the graph's launch over its ops.
                host_enqueue_us: Some(launch / ops as f64),
                host_ops_per_s: Some(ops as f64 / (launch * 1e-6)),
                nccl_call_us: None,
                ops_per_trial: ops as u64,
                own_host_us: None,
                steps_us: None,
                time_us: Some(time_us),
                trials: ctx.settings.bench_trials as u64,
                wait_us: None,
            });
        }
        println!("  rank {} {bytes} B graphs done", ctx.rank);
    }
    device.synchronize().map_err(e)?;
    Ok(rows)
}

/// Medians of the host cost of the primitives the process group calls per op (20,000 calls each).
fn host_costs(ctx: &Rank, pg: &Group) -> Result<HostCosts, String> {
    const N: usize = 20_000;
    let device = &ctx.device;
    let current = device.current_stream();
    let key = device.index().to_string();
    let comm_stream = pg.comm_stream(&key).ok_or("no comm stream")?;
    let pool_stream = device.stream_from_pool(false).map_err(e)?;
    let buffer = filled(ctx, DType::F32, 2, 1.0)?;
    let measure_n = |count: usize, body: &mut dyn FnMut() -> Result<(), String>| -> Result<f64, String> {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let t = Instant::now();
            body()?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(median(&mut samples))
    };
    let measure = |body: &mut dyn FnMut() -> Result<(), String>| measure_n(N, body);
    let timer = measure(&mut || Ok(()))?;
    let record_default = measure(&mut || device.create_event().record(&current).map_err(e))?;
    let record_pool = measure(&mut || device.create_event().record(&pool_stream).map_err(e))?;
    let marker = device.create_event();
    marker.record(&current).map_err(e)?;
    let wait = measure(&mut || comm_stream.wait_event(&marker).map_err(e))?;
    let record_stream = measure(&mut || device.record_stream(&buffer, &comm_stream).map_err(e))?;
    let current_stream = measure(&mut || {
        let _ = device.current_stream();
        Ok(())
    })?;
    let clock_read = measure(&mut || {
        std::hint::black_box(device.now());
        Ok(())
    })?;
    let context_bind = measure(&mut || device.cuda().bind_to_thread().map_err(e))?;
    let is_capturing_default_stream = measure(&mut || current.is_capturing().map(drop).map_err(e))?;
    let is_capturing_pool_stream = measure(&mut || pool_stream.is_capturing().map(drop).map_err(e))?;
    // One event re-recorded (its driver state hot) against a ring of them (each record touches another event),
    // with the GPU idle and with every record pending behind a spin on the comm stream.
    let ring: Vec<pg_nccl::Event> = (0..256).map(|_| device.create_event()).collect();
    let wide: Vec<pg_nccl::Event> = (0..4096).map(|_| device.create_event()).collect();
    let one = device.create_event();
    let mut record_ring = ring_recorder(&ring, &comm_stream);
    let rerecord_idle = measure(&mut || one.record(&comm_stream).map_err(e))?;
    let ring_idle = measure(&mut record_ring)?;
    let ring_4096_idle = measure(&mut ring_recorder(&wide, &comm_stream))?;
    device.synchronize().map_err(e)?;
    // Behind the spin, one record per event of the ring, few enough that none waits for room in the stream's queue.
    const BEHIND_SPIN: usize = 256;
    device.cuda().sleep_kernel(comm_stream.cuda(), Duration::from_millis(50)).map_err(e)?;
    let rerecord_spin = measure_n(BEHIND_SPIN, &mut || one.record(&comm_stream).map_err(e))?;
    let ring_spin = measure_n(BEHIND_SPIN, &mut record_ring)?;
    device.synchronize().map_err(e)?;
    Ok(HostCosts {
        clock_read: Some(clock_read),
        context_bind: Some(context_bind),
        is_capturing_default_stream: Some(is_capturing_default_stream),
        is_capturing_pool_stream: Some(is_capturing_pool_stream),
        event_rerecord_one_on_comm_stream: Some(rerecord_idle),
        event_record_ring_on_comm_stream: Some(ring_idle),
        event_record_ring_4096_on_comm_stream: Some(ring_4096_idle),
        event_rerecord_one_behind_spin: Some(rerecord_spin),
        event_record_ring_behind_spin: Some(ring_spin),
        current_stream,
        event_create_record_drop_on_default_stream: record_default,
        event_create_record_drop_on_pool_stream: record_pool,
        record_stream,
        stream_wait_event: wait,
        timer,
    })
}

/// Records each of `events` in turn on `stream`, one per call.
fn ring_recorder<'a>(events: &'a [pg_nccl::Event], stream: &'a Stream) -> impl FnMut() -> Result<(), String> + 'a {
    let mut next = 0;
    move || {
        next = (next + 1) % events.len();
        events[next].record(stream).map_err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_time_counts_only_the_trials_the_gpu_was_ahead_in() {
        // The host-bound trials (false) are the slow ones: they would move the median if counted.
        let trials = [(6.0, true), (9.0, false), (6.2, true), (9.5, false), (6.1, true)];
        assert_eq!(device_time_us(&trials), Some(6.1));
        assert_eq!(device_time_us(&[(9.0, false), (9.5, false)]), None, "every trial timed the host");
        assert_eq!(device_time_us(&[]), None);
    }

    #[test]
    fn the_variant_groups_have_names_of_their_own() {
        let mut names: Vec<&str> = GROUPS.iter().map(|(name, _)| *name).collect();
        names.extend(["pg", TRACED]);
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        // The watchdog-off variant keeps the flight recorder; the bare one turns both off.
        let options = |name: &str| GROUPS.iter().find(|(n, _)| *n == name).map(|(_, f)| f(Options::builder()).build());
        let no_watchdog = options("pg-no-watchdog").unwrap();
        assert!(!no_watchdog.enable_watchdog && no_watchdog.trace_buffer_size > 0);
        assert_eq!(GROUPS[0].0, "pg-no-watchdog-no-fr", "the network profile's one variant is the bare group");
        let bare = options("pg-no-watchdog-no-fr").unwrap();
        assert!(!bare.enable_watchdog && bare.trace_buffer_size == 0);
        assert!(!options("pg-no-reuse").unwrap().reuse_works);
        let twin = options("pg-twin").unwrap();
        assert!(twin.enable_watchdog && twin.reuse_works && twin.trace_buffer_size > 0);
    }
}
