//! The hardware S-tests: every semantic of the core issue that a real GPU can show, on 1..N ranks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pg_core::store::PrefixStore;
use pg_core::{
    Buffer as _, DType, Device as _, Event as _, KernelKind, Options, OptionsBuilder, ProcessGroup, ReduceOp,
    Stream as _,
};
use pg_nccl::{Buffer, Nccl};
use serde_json::{json, Value};

use crate::Rank;

pub type Group = ProcessGroup<Nccl>;

/// A group named `name` whose store keys live under `name/` (so groups never read each other's ids).
pub fn group(ctx: &Rank, name: &str, options: OptionsBuilder) -> Result<Group, String> {
    let store = Arc::new(PrefixStore::new(name.to_owned(), ctx.store.clone()));
    // PyTorch's environment variables (and PG_REUSE_WORKS) apply, as they would in a user's program.
    let options: Options =
        options.group_name(name.to_owned()).group_desc(name.to_owned()).build_with_env().map_err(|e| e.to_string())?;
    ProcessGroup::new(store, ctx.rank, ctx.world, ctx.device.clone(), options).map_err(|e| e.to_string())
}

/// `numel` elements of `dtype` set to `value`, on the current stream.
pub fn filled(ctx: &Rank, dtype: DType, numel: usize, value: f64) -> Result<Buffer, String> {
    let device = &ctx.device;
    let buffer = device.alloc(dtype, numel).map_err(|e| e.to_string())?;
    device.fill(&buffer, value, &device.current_stream()).map_err(|e| e.to_string())?;
    Ok(buffer)
}

/// The buffer's elements as f64, read on the current stream (waits for it).
pub fn read(ctx: &Rank, buffer: &Buffer) -> Result<Vec<f64>, String> {
    let device = &ctx.device;
    let bytes = device.copy_to_host(buffer, &device.current_stream()).map_err(|e| e.to_string())?;
    let values = match buffer.dtype() {
        DType::F32 => bytes.chunks(4).map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap()))).collect(),
        DType::F64 => bytes.chunks(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        DType::I64 => bytes.chunks(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::I32 => bytes.chunks(4).map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap()))).collect(),
        DType::BF16 => bytes
            .chunks(2)
            .map(|c| f64::from(f32::from_bits(u32::from(u16::from_le_bytes(c.try_into().unwrap())) << 16)))
            .collect(),
        other => return Err(format!("read of {other} not supported here")),
    };
    Ok(values)
}

/// Whether every element equals `want`.
pub fn all_equal(values: &[f64], want: f64) -> Result<(), String> {
    match values.iter().position(|v| *v != want) {
        None => Ok(()),
        Some(i) => Err(format!("element {i} is {} instead of {want} ({} elements)", values[i], values.len())),
    }
}

/// The sum of rank + 1 over the world.
pub fn rank_sum(world: usize) -> f64 {
    (world * (world + 1) / 2) as f64
}

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

fn ensure(condition: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(message())
    }
}

struct Checks {
    results: Vec<Value>,
}

impl Checks {
    fn run(&mut self, name: &str, body: impl FnOnce() -> Result<Value, String>) {
        let started = Instant::now();
        let outcome = body();
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let (passed, detail) = match outcome {
            Ok(detail) => (true, detail),
            Err(message) => (false, json!(message)),
        };
        println!("  {} {name}", if passed { "ok  " } else { "FAIL" });
        self.results.push(json!({ "name": name, "passed": passed, "detail": detail, "ms": ms }));
    }
}

pub fn run(ctx: &Rank) -> Result<Value, String> {
    let device = &ctx.device;
    let world = ctx.world;
    let want = rank_sum(world);
    let me = (ctx.rank + 1) as f64;
    let mut checks = Checks { results: Vec::new() };
    let pg = group(ctx, "smoke", Options::builder())?;

    checks.run("S3 creating a group creates no communicator", || {
        ensure(pg.counters().comms_created == 0 && pg.comm_keys().is_empty(), || format!("{:?}", pg.counters()))?;
        Ok(json!(pg.counters().comms_created))
    });

    checks.run("S1 all_reduce (sync form) sums across ranks", || {
        let buffer = filled(ctx, DType::F32, 1 << 20, me)?;
        pg.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
        all_equal(&read(ctx, &buffer)?, want)?;
        Ok(json!({ "numel": 1 << 20, "sum": want }))
    });

    checks.run("S3 first op creates the communicator, later ops reuse it", || {
        let after_first = pg.counters().comms_created;
        let buffer = filled(ctx, DType::F32, 1024, me)?;
        pg.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
        all_equal(&read(ctx, &buffer)?, want)?;
        let after_second = pg.counters().comms_created;
        ensure(after_first == 1 && after_second == 1, || format!("creations {after_first} then {after_second}"))?;
        Ok(json!({ "keys": pg.comm_keys() }))
    });

    checks.run("S6 the unique id went through the store under the group's counter key", || {
        let found = ctx.store.check(&["smoke/0"]).map_err(e)?;
        ensure(found, || "no key smoke/0 in the store".into())?;
        Ok(json!("smoke/0"))
    });

    checks.run("S8/S20 the comm stream is a pool stream, not the current stream", || {
        let key = device.index().to_string();
        let comm = pg.comm_stream(&key).ok_or_else(|| format!("no comm stream for key {key}"))?;
        let current = device.current_stream();
        ensure(comm != current && comm.id() != 0, || format!("comm {comm:?} current {current:?}"))?;
        ensure(!comm.is_high_priority(), || "normal group got a high-priority stream".into())?;
        Ok(json!({ "comm_stream": comm.id(), "current_stream": current.id() }))
    });

    checks.run("S8 high-priority option picks the high-priority pool", || {
        let hp = group(ctx, "smoke-hp", Options::builder().high_priority_stream(true))?;
        let buffer = filled(ctx, DType::F32, 256, me)?;
        hp.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
        all_equal(&read(ctx, &buffer)?, want)?;
        let comm = hp.comm_stream(&device.index().to_string()).ok_or("no comm stream")?;
        ensure(comm.is_high_priority(), || format!("{comm:?}"))?;
        hp.shutdown().map_err(e)?;
        Ok(json!(comm.id()))
    });

    checks.run("S9/S11/S14 default wait returns at once; the op waits for the current stream", || {
        let buffer = filled(ctx, DType::F32, 1 << 22, me)?;
        let current = device.current_stream();
        let sleep = Duration::from_millis(200);
        device.sleep_kernel(&current, sleep).map_err(e)?;
        let enqueued = Instant::now();
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        let t = Instant::now();
        work.wait().map_err(e)?;
        let wait_us = t.elapsed().as_secs_f64() * 1e6;
        let completed_after_wait = work.is_completed();
        while !work.is_completed() {
            std::thread::sleep(Duration::from_micros(200));
        }
        let completed_after = enqueued.elapsed();
        current.synchronize().map_err(e)?;
        all_equal(&read(ctx, &buffer)?, want)?;
        ensure(wait_us < 5_000.0, || format!("wait() took {wait_us:.0} us"))?;
        ensure(!completed_after_wait, || "complete right after wait() despite the 200 ms sleep".into())?;
        ensure(completed_after >= sleep.mul_f64(0.8), || {
            format!("completed after {completed_after:?}: before the sleep")
        })?;
        Ok(json!({ "wait_us": wait_us, "completed_after_ms": completed_after.as_secs_f64() * 1e3 }))
    });

    checks.run("S13 the end event exists once recorded; start time is host time", || {
        let buffer = filled(ctx, DType::F32, 1024, me)?;
        let before = device.now();
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        work.wait().map_err(e)?;
        ensure(work.end_event_created(), || "end event not created".into())?;
        ensure(work.start_time() >= before && work.start_time() <= device.now(), || "start time off".into())?;
        work.synchronize().map_err(e)?;
        all_equal(&read(ctx, &buffer)?, want)?;
        Ok(json!(work.seq()))
    });

    checks.run("S15 blocking wait returns only when done (host time = the sleep)", || {
        let bw = group(ctx, "smoke-bw", Options::builder().blocking_wait(true))?;
        let buffer = filled(ctx, DType::F32, 1 << 20, me)?;
        bw.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?; // create the communicator first
        let buffer = filled(ctx, DType::F32, 1 << 20, me)?;
        device.sleep_kernel(&device.current_stream(), Duration::from_millis(100)).map_err(e)?;
        let work = bw.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        let t = Instant::now();
        work.wait().map_err(e)?;
        let wait_ms = t.elapsed().as_secs_f64() * 1e3;
        let completed = work.is_completed();
        all_equal(&read(ctx, &buffer)?, want)?;
        bw.shutdown().map_err(e)?;
        ensure(completed, || "not complete after a blocking wait".into())?;
        ensure(wait_ms >= 80.0, || format!("blocking wait took only {wait_ms:.1} ms"))?;
        Ok(json!({ "wait_ms": wait_ms }))
    });

    checks.run("S16 barrier", || {
        let t = Instant::now();
        pg.barrier_sync().map_err(e)?;
        Ok(json!({ "us": t.elapsed().as_secs_f64() * 1e6 }))
    });

    checks.run("S17 the Future is done at enqueue while the GPU op still runs", || {
        let buffer = filled(ctx, DType::F32, 1 << 20, me)?;
        device.sleep_kernel(&device.current_stream(), Duration::from_millis(100)).map_err(e)?;
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        let future = work.future();
        let done = future.is_done();
        let gpu_done = future.gpu_completed().map_err(e)?;
        let t = Instant::now();
        let outputs = future.wait().map_err(e)?;
        let wait_us = t.elapsed().as_secs_f64() * 1e6;
        all_equal(&read(ctx, &outputs[0])?, want)?;
        ensure(done && !gpu_done, || format!("done {done}, gpu completed {gpu_done}"))?;
        Ok(json!({ "future_wait_us": wait_us }))
    });

    checks.run("S19 default wait orders only the current stream", || {
        let buffer = filled(ctx, DType::F32, 1 << 20, me)?;
        let current = device.current_stream();
        device.sleep_kernel(&current, Duration::from_millis(150)).map_err(e)?;
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        work.wait().map_err(e)?;
        let unrelated = device.cuda().new_stream(false).map_err(e)?;
        let unrelated = pg_nccl::Stream::from_cuda(unrelated);
        let on_unrelated = device.create_event();
        on_unrelated.record(&unrelated).map_err(e)?;
        let on_current = device.create_event();
        on_current.record(&current).map_err(e)?;
        on_unrelated.synchronize().map_err(e)?;
        let current_done = on_current.query().map_err(e)?;
        current.synchronize().map_err(e)?;
        all_equal(&read(ctx, &buffer)?, want)?;
        ensure(!current_done, || "the current stream was done as early as an unrelated one".into())?;
        Ok(json!("unrelated stream finished while the current stream still waited"))
    });

    checks.run("S20 the comm kernel was launched on the comm stream", || {
        let buffer = filled(ctx, DType::F32, 4096, me)?;
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        work.wait().map_err(e)?;
        let launches = device.kernel_launches();
        let last = launches.iter().rev().find(|l| l.kind == KernelKind::Comm).ok_or("no comm launch logged")?;
        let current = device.current_stream().id();
        ensure(last.stream_id == work.comm_stream().id() && last.stream_id != current, || {
            format!(
                "comm kernel on stream {}, comm stream {}, current {current}",
                last.stream_id,
                work.comm_stream().id()
            )
        })?;
        all_equal(&read(ctx, &buffer)?, want)?;
        Ok(json!({ "comm_kernel_stream": last.stream_id, "current_stream": current }))
    });

    checks.run("S12 record_stream parks a freed buffer until the comm stream passes", || {
        let before = device.cuda().memory_stats();
        {
            let buffer = filled(ctx, DType::F32, 1 << 16, me)?;
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
            work.wait().map_err(e)?;
        }
        // The watchdog holds in-flight Works (and their outputs) until it sees them complete: the block is freed
        // (with an event recorded on the comm stream) once it lets go, within a few watchdog periods.
        device.current_stream().synchronize().map_err(e)?;
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut after = device.cuda().memory_stats();
        while after.free_events_recorded <= before.free_events_recorded && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            after = device.cuda().memory_stats();
        }
        ensure(after.record_stream_calls > before.record_stream_calls, || format!("{before:?} -> {after:?}"))?;
        ensure(after.free_events_recorded > before.free_events_recorded, || format!("{before:?} -> {after:?}"))?;
        Ok(json!({ "record_stream_calls": after.record_stream_calls, "free_events": after.free_events_recorded }))
    });

    checks.run("S12 avoid-record-streams keeps buffers on the Work instead", || {
        let ar = group(ctx, "smoke-ars", Options::builder().avoid_record_streams(true))?;
        let warm = filled(ctx, DType::F32, 16, me)?;
        ar.all_reduce_sync(&warm, ReduceOp::Sum).map_err(e)?;
        let before = device.cuda().memory_stats();
        let buffer = filled(ctx, DType::F32, 1 << 16, me)?;
        let work = ar.all_reduce(&buffer, ReduceOp::Sum).map_err(e)?;
        work.wait().map_err(e)?;
        let after = device.cuda().memory_stats();
        all_equal(&read(ctx, &buffer)?, want)?;
        ar.shutdown().map_err(e)?;
        ensure(after.record_stream_calls == before.record_stream_calls, || format!("{before:?} -> {after:?}"))?;
        Ok(json!("no record_stream"))
    });

    checks.run("collectives: broadcast, all_gather, reduce_scatter, avg, max, bf16, f64, i64", || {
        let b = filled(ctx, DType::F32, 1000, me)?;
        pg.broadcast(&b, 0).map_err(e)?.wait().map_err(e)?;
        all_equal(&read(ctx, &b)?, 1.0)?;

        let input = filled(ctx, DType::F32, 1000, me)?;
        let output = filled(ctx, DType::F32, 1000 * world, -1.0)?;
        pg.all_gather(&input, &output).map_err(e)?.wait().map_err(e)?;
        let gathered = read(ctx, &output)?;
        for r in 0..world {
            all_equal(&gathered[r * 1000..(r + 1) * 1000], (r + 1) as f64)?;
        }

        let input = filled(ctx, DType::F32, 1000 * world, me)?;
        let output = filled(ctx, DType::F32, 1000, -1.0)?;
        pg.reduce_scatter(&input, &output, ReduceOp::Sum).map_err(e)?.wait().map_err(e)?;
        all_equal(&read(ctx, &output)?, want)?;

        let a = filled(ctx, DType::F32, 1000, me)?;
        pg.all_reduce_sync(&a, ReduceOp::Avg).map_err(e)?;
        all_equal(&read(ctx, &a)?, want / world as f64)?;
        let m = filled(ctx, DType::F32, 1000, me)?;
        pg.all_reduce_sync(&m, ReduceOp::Max).map_err(e)?;
        all_equal(&read(ctx, &m)?, world as f64)?;
        for dtype in [DType::BF16, DType::F64, DType::I64] {
            let x = filled(ctx, dtype, 1000, me)?;
            pg.all_reduce_sync(&x, ReduceOp::Sum).map_err(e)?;
            all_equal(&read(ctx, &x)?, want).map_err(|m| format!("{dtype}: {m}"))?;
        }
        Ok(json!("all correct"))
    });

    checks.run("send/recv between ranks 0 and 1", || {
        if world < 2 {
            return Ok(json!("skipped: world of 1"));
        }
        let buffer = filled(ctx, DType::F32, 4096, if ctx.rank == 0 { 7.0 } else { 0.0 })?;
        match ctx.rank {
            0 => pg.send(&buffer, 1).map_err(e)?.wait().map_err(e)?,
            1 => pg.recv(&buffer, 0).map_err(e)?.wait().map_err(e)?,
            _ => {}
        }
        if ctx.rank <= 1 {
            all_equal(&read(ctx, &buffer)?, 7.0)?;
        }
        Ok(json!("7.0 arrived"))
    });

    checks.run("non-blocking communicator init", || {
        let nb = group(ctx, "smoke-nb", Options::builder().nonblocking_init(true))?;
        let buffer = filled(ctx, DType::F32, 4096, me)?;
        nb.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
        all_equal(&read(ctx, &buffer)?, want)?;
        nb.shutdown().map_err(e)?;
        Ok(json!("ok"))
    });

    checks.run("eager init creates the communicator with the group", || {
        let t = Instant::now();
        let eager = group(ctx, "smoke-eager", Options::builder().eager_init(true))?;
        let init_ms = t.elapsed().as_secs_f64() * 1e3;
        let created = eager.counters().comms_created;
        let buffer = filled(ctx, DType::F32, 8, me)?;
        let t = Instant::now();
        eager.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
        device.current_stream().synchronize().map_err(e)?;
        let first_op_ms = t.elapsed().as_secs_f64() * 1e3;
        all_equal(&read(ctx, &buffer)?, want)?;
        eager.shutdown().map_err(e)?;
        ensure(created == 1, || format!("{created} communicators after eager creation"))?;
        Ok(json!({ "init_ms": init_ms, "first_op_ms": first_op_ms }))
    });

    checks.run("S26 abort: later ops fail with Aborted, nothing hangs", || {
        let ab = group(ctx, "smoke-abort", Options::builder())?;
        let buffer = filled(ctx, DType::F32, 4096, me)?;
        ab.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(e)?;
        device.current_stream().synchronize().map_err(e)?;
        let t = Instant::now();
        ab.abort("smoke test abort");
        let abort_ms = t.elapsed().as_secs_f64() * 1e3;
        let after = ab.all_reduce(&buffer, ReduceOp::Sum).err().ok_or("an op after abort succeeded")?;
        ensure(after.kind() == pg_core::ErrorKind::Aborted, || format!("error after abort: {after}"))?;
        Ok(json!({ "abort_ms": abort_ms, "error": after.to_string() }))
    });

    device.current_stream().synchronize().map_err(e)?;
    pg.shutdown().map_err(e)?;
    let passed = checks.results.iter().all(|c| c["passed"] == json!(true));
    Ok(json!({ "task": "smoke", "passed": passed, "checks": checks.results }))
}
