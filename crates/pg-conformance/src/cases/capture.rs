//! Stream capture (CUDA graphs): the backend's capture primitives, and the process group's ops enqueued while
//! the current stream captures: recorded with their input-ready wait and end event, joined back, kept alive,
//! never watched, marked in the flight recorder, and replayed with correct results every time.

use std::time::Duration;

use pg_core::{
    Backend, CaptureMode, Device as _, ErrorKind, Event as _, Graph as _, Options, ReduceOp, Stream as _, StreamGuard,
};

use super::{all_equal, case, triangle};
use crate::case::{Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(capture_records_work_that_runs_only_when_the_graph_is_launched, 1),
        case!(a_stream_joined_into_a_capture_must_join_back_before_it_ends, 1),
        case!(querying_a_capturing_stream_is_refused_and_invalidates_the_capture, 1),
        case!(a_graph_of_collectives_replayed_many_times_gives_correct_results_every_time, 1),
        case!(blocking_calls_under_capture_are_refused_and_wait_only_orders_the_stream, 1),
        case!(wait_under_capture_orders_whichever_joined_stream_is_current, 1),
        case!(creating_a_communicator_under_capture_is_refused, 1),
        case!(captured_works_are_not_watched_and_the_flight_recorder_marks_them, 1),
        case!(a_graph_keeps_the_buffers_of_its_ops_alive, 1),
        case!(a_graph_launched_after_its_group_shut_down_is_refused_as_aborted, 1),
    ]
}

/// Whether the backend captures: a backend without capture makes the case not applicable.
fn begin<B: Backend>(stream: &B::Stream) -> Check<Option<Outcome>> {
    match stream.begin_capture(CaptureMode::ThreadLocal) {
        Ok(()) => Ok(None),
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            Ok(Some(Outcome::NotApplicable(format!("the backend does not capture streams: {e}"))))
        }
        Err(e) => Err(format!("begin_capture: {e}")),
    }
}

/// Runs `body` on every rank with a fresh pool stream made current; not applicable when the backend does not
/// capture (checked first on one stream of every rank, so that no rank goes on alone).
fn on_each_capturing_rank<H: Harness>(
    h: &H,
    body: impl Fn(&Rank<H::B>, &<H::B as Backend>::Stream) -> Check + Sync,
) -> Check<Outcome> {
    let probe = h.run(h.world_size(), |r| -> Check<Option<Outcome>> {
        let stream = r.device.stream_from_pool(false).ctx("stream_from_pool")?;
        let skip = begin::<H::B>(&stream)?;
        if skip.is_none() {
            stream.end_capture().ctx("ending an empty capture")?;
        }
        Ok(skip)
    })?;
    for (_, result) in probe.results {
        if let Some(outcome) = result? {
            return Ok(outcome);
        }
    }
    let ran = h.run(h.world_size(), |r| {
        let stream = r.device.stream_from_pool(false).ctx("stream_from_pool")?;
        // What was enqueued before (the buffers' fills) is done before the capture starts.
        r.device.synchronize().ctx("device synchronize")?;
        let _current = StreamGuard::<H::B>::new(&r.device, &stream);
        body(r, &stream)
    })?;
    // Replayed work is checked like any other: no unordered access, no memory reused while in use.
    ran.no_hazards()?;
    ran.all_ok()?;
    Ok(Outcome::Pass)
}

fn is_capture_error(error: &pg_core::Error) -> bool {
    error.kind() == ErrorKind::CaptureUnsupported
}

fn capture_records_work_that_runs_only_when_the_graph_is_launched<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, stream| {
        let b = r.device.alloc(pg_core::DType::F32, 64).ctx("alloc")?;
        r.device.fill(&b, -1.0, stream).ctx("fill")?;
        stream.synchronize().ctx("synchronize")?;
        ensure!(!stream.is_capturing().ctx("is_capturing")?, "a fresh stream is not capturing");
        begin::<H::B>(stream)?;
        ensure!(stream.is_capturing().ctx("is_capturing")?, "begin_capture makes the stream capturing");
        r.device.fill(&b, 3.0, stream).ctx("fill under capture")?;
        let graph = stream.end_capture().ctx("end_capture")?;
        ensure!(!stream.is_capturing().ctx("is_capturing")?, "end_capture ends the capture");
        all_equal(&r.read_on(&b, stream)?, -1.0).map_err(|e| format!("the captured fill ran at capture: {e}"))?;
        for launch in 0..3 {
            r.device.fill(&b, -1.0, stream).ctx("reset")?;
            graph.launch(stream).ctx("launch")?;
            all_equal(&r.read_on(&b, stream)?, 3.0).map_err(|e| format!("after launch {launch}: {e}"))?;
        }
        Ok(())
    })
}

fn a_stream_joined_into_a_capture_must_join_back_before_it_ends<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, origin| {
        let side = r.device.stream_from_pool(true).ctx("stream_from_pool")?;
        let b = r.device.alloc(pg_core::DType::F32, 16).ctx("alloc")?;
        r.device.fill(&b, 0.0, origin).ctx("fill")?;
        origin.synchronize().ctx("synchronize")?;
        let fork = r.device.create_event();
        begin::<H::B>(origin)?;
        fork.record(origin).ctx("record the fork")?;
        side.wait_event(&fork).ctx("the side stream waits on the fork")?;
        ensure!(side.is_capturing().ctx("is_capturing")?, "waiting on a captured event joins the capture");
        r.device.fill(&b, 5.0, &side).ctx("fill on the joined stream")?;
        let err = match origin.end_capture() {
            Ok(_) => return Err("a capture with an unjoined stream ended".into()),
            Err(e) => e,
        };
        ensure!(is_capture_error(&err), "ending with an unjoined stream: {err}");
        ensure!(err.to_string().to_lowercase().contains("unjoined"), "the error says unjoined: {err}");

        begin::<H::B>(origin)?;
        fork.record(origin).ctx("record the fork")?;
        side.wait_event(&fork).ctx("the side stream waits on the fork")?;
        r.device.fill(&b, 5.0, &side).ctx("fill on the joined stream")?;
        let join = r.device.create_event();
        join.record(&side).ctx("record the join")?;
        origin.wait_event(&join).ctx("the origin waits on the join")?;
        let graph = origin.end_capture().ctx("end_capture after the join")?;
        all_equal(&r.read_on(&b, origin)?, 0.0).map_err(|e| format!("before the launch: {e}"))?;
        graph.launch(origin).ctx("launch")?;
        all_equal(&r.read_on(&b, origin)?, 5.0).map_err(|e| format!("the launch stream waits for the joined work: {e}"))
    })
}

fn querying_a_capturing_stream_is_refused_and_invalidates_the_capture<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, stream| {
        let b = r.device.alloc(pg_core::DType::F32, 16).ctx("alloc")?;
        begin::<H::B>(stream)?;
        r.device.fill(&b, 1.0, stream).ctx("fill under capture")?;
        match stream.query() {
            Ok(done) => return Err(format!("Stream::query of a capturing stream answered {done}")),
            Err(e) => ensure!(is_capture_error(&e), "Stream::query of a capturing stream: {e}"),
        }
        match stream.end_capture() {
            Ok(_) => Err("a capture invalidated by a query ended with a graph".into()),
            Err(e) => {
                ensure!(is_capture_error(&e), "ending an invalidated capture: {e}");
                ensure!(!stream.is_capturing().ctx("is_capturing")?, "a failed end_capture still ends the capture");
                Ok(())
            }
        }
    })
}

/// An op enqueued while the current stream captures is captured with its input-ready wait and end event: the
/// communication stream joins the capture through the input-ready wait, and the current stream waits on the end
/// event, so the capture ends without a `wait()`. A graph of N collectives launched M times gives the right results
/// every time, and eager ops of the same group still work.
fn a_graph_of_collectives_replayed_many_times_gives_correct_results_every_time<H: Harness>(h: &H) -> Check<Outcome> {
    const COLLECTIVES: usize = 3;
    const LAUNCHES: usize = 4;
    on_each_capturing_rank(h, |r, stream| {
        let group = r.ready_group("0", Options::builder())?;
        let (n, me) = (r.size, r.rank);
        let buffers = (0..COLLECTIVES).map(|k| r.filled(0.0, 32 + k)).collect::<Check<Vec<_>>>()?;
        stream.synchronize().ctx("synchronize")?;
        begin::<H::B>(stream)?;
        for (k, b) in buffers.iter().enumerate() {
            // Rank r contributes (r + 1) * (k + 1): all_reduce gives triangle(n) * (k + 1).
            r.device.fill(b, ((me + 1) * (k + 1)) as f64, stream).ctx("fill under capture")?;
            let work = group.all_reduce(b, ReduceOp::Sum).ctx("all_reduce under capture")?;
            ensure!(work.is_captured(), "an op enqueued under capture is captured");
        }
        // No wait(): the op template joins the communication stream back into the capture by itself.
        let graph = stream.end_capture().ctx("end_capture without wait()")?;
        for (k, b) in buffers.iter().enumerate() {
            all_equal(&r.read_on(b, stream)?, 0.0).map_err(|e| format!("collective {k} ran at capture: {e}"))?;
        }
        for launch in 0..LAUNCHES {
            for b in &buffers {
                r.device.fill(b, -1.0, stream).ctx("reset")?;
            }
            graph.launch(stream).ctx("launch")?;
            for (k, b) in buffers.iter().enumerate() {
                all_equal(&r.read_on(b, stream)?, triangle(n) * (k + 1) as f64)
                    .map_err(|e| format!("launch {launch}, collective {k}: {e}"))?;
            }
        }
        // Eager ops still work after the capture, on the same group.
        let eager = r.filled((me + 1) as f64, 8)?;
        let work = group.all_reduce(&eager, ReduceOp::Sum).ctx("eager all_reduce after the capture")?;
        ensure!(!work.is_captured(), "an op enqueued after the capture ended says it is captured");
        work.wait().ctx("wait for the eager all_reduce")?;
        all_equal(&r.read(&eager)?, triangle(n)).map_err(|e| format!("eager all_reduce after the capture: {e}"))
    })
}

/// Under capture, `wait()` only adds the stream dependency; a blocking wait, `wait_timeout`,
/// `WorkHandle::synchronize` of a captured Work and `barrier` fail with `CaptureUnsupported` naming the op, before
/// anything touches the device (the capture stays valid). A captured Work is complete at once (`is_captured()`), its
/// op running only in the graph's launches.
fn blocking_calls_under_capture_are_refused_and_wait_only_orders_the_stream<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, stream| {
        let group = r.ready_group("0", Options::builder())?;
        let blocking = r.ready_group("blocking", Options::builder().blocking_wait(true))?;
        let b = r.filled((r.rank + 1) as f64, 16)?;
        stream.synchronize().ctx("synchronize")?;
        begin::<H::B>(stream)?;
        let work = group.all_reduce(&b, ReduceOp::Sum).ctx("all_reduce under capture")?;
        work.wait().ctx("wait() under capture (a stream dependency only)")?;
        let refused = |what: &str, result: pg_core::Result<()>, names: &str| -> Check {
            match result {
                Ok(()) => Err(format!("{what} under capture succeeded")),
                Err(e) => {
                    ensure!(is_capture_error(&e), "{what} under capture: {e}");
                    ensure!(e.to_string().contains(names), "{what}: the error names '{names}': {e}");
                    Ok(())
                }
            }
        };
        refused("Work::synchronize", work.synchronize(), "ALLREDUCE")?;
        refused("barrier", group.barrier().map(drop), "barrier")?;
        let blocking_work = blocking.all_reduce(&b, ReduceOp::Sum).ctx("all_reduce (blocking group) under capture")?;
        refused("a blocking wait", blocking_work.wait(), "ALLREDUCE")?;
        refused("wait_timeout", work.wait_timeout(Duration::from_secs(1)), "ALLREDUCE")?;
        // None of the refusals touched the device: the capture ends and its graph runs.
        let graph = stream.end_capture().ctx("end_capture after the refusals")?;
        r.device.fill(&b, (r.rank + 1) as f64, stream).ctx("reset")?;
        graph.launch(stream).ctx("launch")?;
        let n = r.size as f64;
        // Two all_reduces of the same buffer, one per group.
        all_equal(&r.read_on(&b, stream)?, triangle(r.size) * n).map_err(|e| format!("after the launch: {e}"))?;
        ensure!(work.is_completed(), "a captured Work is complete: it runs nothing by itself");
        // The host cannot block on what a graph runs, during the capture or after it.
        refused("a blocking wait of a captured Work after the capture", blocking_work.wait(), "ALLREDUCE")?;
        refused(
            "wait_timeout of a captured Work after the capture",
            work.wait_timeout(Duration::from_secs(1)),
            "ALLREDUCE",
        )?;
        work.wait().ctx("wait() of a captured Work after the capture")
    })
}

/// A captured Work's `wait()` orders the stream current at the wait, not the one current at the enqueue: a side
/// stream joined into the capture before the op, made current, waits on the op's end event, so a second group's
/// op enqueued from it reads the first op's result in every launch.
fn wait_under_capture_orders_whichever_joined_stream_is_current<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, origin| {
        let first = r.ready_group("0", Options::builder())?;
        let second = r.ready_group("1", Options::builder())?;
        let side = r.device.stream_from_pool(false).ctx("stream_from_pool")?;
        let b = r.filled(0.0, 16)?;
        origin.synchronize().ctx("synchronize")?;
        r.device.synchronize().ctx("device synchronize")?;
        begin::<H::B>(origin)?;
        r.device.fill(&b, (r.rank + 1) as f64, origin).ctx("fill under capture")?;
        // The side stream joins the capture here, before the op: only wait() can order it after the op.
        let fork = r.device.create_event();
        fork.record(origin).ctx("record the fork")?;
        side.wait_event(&fork).ctx("the side stream joins the capture")?;
        let work = first.all_reduce(&b, ReduceOp::Sum).ctx("all_reduce under capture")?;
        {
            let _side = StreamGuard::<H::B>::new(&r.device, &side);
            work.wait().ctx("wait() with the side stream current")?;
            second
                .all_reduce(&b, ReduceOp::Sum)
                .and_then(|w| w.wait())
                .ctx("the second group's all_reduce from the side stream")?;
        }
        let join = r.device.create_event();
        join.record(&side).ctx("record the join")?;
        origin.wait_event(&join).ctx("the origin waits on the join")?;
        let graph = origin.end_capture().ctx("end_capture")?;
        let expected = triangle(r.size) * r.size as f64;
        for launch in 0..2 {
            r.device.fill(&b, -1.0, origin).ctx("reset")?;
            graph.launch(origin).ctx("launch")?;
            all_equal(&r.read_on(&b, origin)?, expected).map_err(|e| format!("launch {launch}: {e}"))?;
        }
        Ok(())
    })
}

fn creating_a_communicator_under_capture_is_refused<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, stream| {
        let group = r.group("lazy", Options::builder())?;
        let b = r.filled((r.rank + 1) as f64, 8)?;
        stream.synchronize().ctx("synchronize")?;
        begin::<H::B>(stream)?;
        match group.all_reduce(&b, ReduceOp::Sum) {
            Ok(_) => return Err("the first op of a lazy group created its communicator under capture".into()),
            Err(e) => {
                ensure!(is_capture_error(&e), "the first op under capture: {e}");
                ensure!(e.to_string().contains("before the capture"), "the error says what to do: {e}");
            }
        }
        stream.end_capture().ctx("end_capture")?;
        ensure_eq!(group.comm_keys(), Vec::<String>::new(), "communicators created under capture");
        group.all_reduce(&b, ReduceOp::Sum).and_then(|w| w.wait()).ctx("the first op after the capture")?;
        all_equal(&r.read(&b)?, triangle(r.size)).map_err(|e| format!("after the capture: {e}"))
    })
}

fn captured_works_are_not_watched_and_the_flight_recorder_marks_them<H: Harness>(h: &H) -> Check<Outcome> {
    let timeout = Duration::from_millis(200);
    on_each_capturing_rank(h, |r, stream| {
        let options = Options::builder().timeout(timeout).watchdog_period(Duration::from_millis(20));
        let group = r.ready_group("0", options)?;
        let b = r.filled(1.0, 8)?;
        stream.synchronize().ctx("synchronize")?;
        begin::<H::B>(stream)?;
        let work = group.all_reduce(&b, ReduceOp::Sum).ctx("all_reduce under capture")?;
        // Past the timeout, still capturing: a watchdog that timed or queried the Work would fail it (or the
        // capture, whose event it would query).
        r.host_sleep(timeout * 3);
        ensure_eq!(group.status().in_flight, 0, "Works on the watchdog's list while the captured one exists");
        let graph = stream.end_capture().ctx("end_capture after the watchdog's passes")?;
        ensure!(work.exception().is_none(), "the captured Work failed: {:?}", work.exception());
        ensure!(group.error().is_none(), "the group failed: {:?}", group.error());
        graph.launch(stream).ctx("launch")?;
        stream.synchronize().ctx("synchronize after the launch")?;
        let eager = group.all_reduce(&b, ReduceOp::Sum).ctx("eager all_reduce")?;
        eager.wait().ctx("eager wait")?;
        let dump: serde_json::Value = serde_json::from_str(&group.flight_recorder_json()).ctx("the dump's JSON")?;
        let entries = dump["entries"].as_array().ok_or("the dump has no entries")?;
        let marks: Vec<(u64, bool)> = entries
            .iter()
            .filter(|e| e["profiling_name"] == "nccl:all_reduce")
            .map(|e| (e["collective_seq_id"].as_u64().unwrap_or(0), e["captured"].as_bool().unwrap_or(false)))
            .collect();
        let want = vec![(work.seq(), true), (eager.seq(), false)];
        ensure_eq!(marks, want, "the all_reduce entries (seq, captured)");
        Ok(())
    })
}

fn a_graph_keeps_the_buffers_of_its_ops_alive<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, stream| {
        let group = r.ready_group("0", Options::builder())?;
        // Allocated for the capturing stream, as `other` below: freed memory is reused on its stream at once.
        let b = r.filled((r.rank + 1) as f64, 256)?;
        stream.synchronize().ctx("synchronize")?;
        begin::<H::B>(stream)?;
        let work = group.all_reduce(&b, ReduceOp::Sum).ctx("all_reduce under capture")?;
        let graph = stream.end_capture().ctx("end_capture")?;
        // The caller lets go of everything but the graph; new memory of the same size may take the freed block.
        drop((work, b));
        let other = r.filled(7.0, 256)?;
        for launch in 0..3 {
            graph.launch(stream).ctx("launch after the caller dropped the op's buffer")?;
            all_equal(&r.read_on(&other, stream)?, 7.0)
                .map_err(|e| format!("launch {launch} wrote memory the caller's buffer no longer owned: {e}"))?;
        }
        drop(graph);
        Ok(())
    })
}

/// A graph holds the communicators of the ops it captured: once the group is shut down (its communicators
/// finalized), also after the group's last handle went, a launch fails with `Aborted` instead of replaying the
/// collectives on a finalized (and on NCCL destroyed) communicator; before that, launches run.
fn a_graph_launched_after_its_group_shut_down_is_refused_as_aborted<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_capturing_rank(h, |r, stream| {
        for dropped in [false, true] {
            let what = if dropped { "shut down and dropped" } else { "shut down" };
            let name = if dropped { "dropped" } else { "kept" };
            let group = if dropped {
                r.own_ready_group(name, Options::builder())?
            } else {
                r.ready_group(name, Options::builder())?
            };
            let b = r.filled((r.rank + 1) as f64, 64)?;
            stream.synchronize().ctx("synchronize")?;
            begin::<H::B>(stream)?;
            group.all_reduce(&b, ReduceOp::Sum).ctx("all_reduce under capture")?.wait().ctx("wait")?;
            let graph = stream.end_capture().ctx("end_capture")?;
            graph.launch(stream).ctx("launch while the group is live")?;
            all_equal(&r.read_on(&b, stream)?, triangle(r.size)).map_err(|e| format!("{what}: the launch: {e}"))?;
            group.shutdown().ctx("shutdown")?;
            if dropped {
                drop(group);
            }
            let error = graph.launch(stream).err().ok_or_else(|| format!("{what}: the graph launched its ops"))?;
            ensure_eq!(error.kind(), ErrorKind::Aborted, "{what}: the launch's error: {error}");
            ensure!(
                error.to_string().contains("finalized"),
                "{what}: the error does not say the communicator was finalized: {error}"
            );
            stream.synchronize().ctx("synchronize after the refused launch")?;
        }
        Ok(())
    })
}
