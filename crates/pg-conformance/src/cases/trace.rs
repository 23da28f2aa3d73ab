//! Timelines of a real run (S28; `Options::trace_dir`, `PG_TRACE=DIR`): each rank's file holds its ops with the
//! host enqueue and the device span from timing events, in the trace-event schema, and the ranks' files line up on
//! one clock once merged.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pg_core::{Device as _, OpType, Options, ProcessGroup, ReduceOp};
use serde_json::Value;

use super::{case, on_each_rank, SLEEP};
use crate::case::{Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Clock, Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(traced_ops_are_written_per_rank_with_device_spans_after_their_enqueue, 1),
        case!(traced_ranks_line_up_on_one_clock_once_merged, 2),
    ]
}

/// Trace directories made by this process: one per world.
static DIRS: AtomicU64 = AtomicU64::new(0);

/// The world's trace directory: rank 0 makes a fresh one and publishes it; the others read it.
fn trace_dir<B: pg_core::Backend>(r: &Rank<B>) -> Check<PathBuf> {
    const KEY: &str = "pg_conformance/trace_dir";
    if r.rank == 0 {
        let n = DIRS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pg-conformance-trace-{}-{n}", std::process::id()));
        // A directory left by an earlier process of the same id would add its files.
        let _ = std::fs::remove_dir_all(&dir);
        r.store.set(KEY, dir.to_string_lossy().as_bytes()).ctx("publishing the trace directory")?;
        return Ok(dir);
    }
    let value = r.store.get(KEY).ctx("reading the trace directory")?;
    Ok(PathBuf::from(String::from_utf8_lossy(&value).into_owned()))
}

/// The ops each rank traces, in issue order (the send/recv pair only between ranks 0 and 1).
fn expected_ops(rank: usize, size: usize) -> Vec<OpType> {
    let mut ops = vec![OpType::Barrier, OpType::AllReduce, OpType::AllReduce, OpType::Broadcast, OpType::AllGatherBase];
    match (rank, size >= 2) {
        (0, true) => ops.push(OpType::Send),
        (1, true) => ops.push(OpType::Recv),
        _ => {}
    }
    ops
}

/// Elements of the buffers the traced ops move.
const NUMEL: usize = 1024;

/// How much longer than the default sleep the held all_reduce waits on the device: long enough that a flush
/// right after its enqueue comes before it ends on any machine.
const HELD: u32 = 4;

/// Runs the traced ops on `group`: the second all_reduce is held behind a sleep kernel on the current stream, and
/// the group is flushed right after it is enqueued (before it can have run). Returns that early file.
fn traced_ops<B: pg_core::Backend>(r: &Rank<B>, group: &ProcessGroup<B>) -> Check<Value> {
    group.barrier_sync().ctx("barrier")?;
    let buffer = r.filled(1.0, NUMEL)?;
    group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?.wait().ctx("wait")?;
    r.sleep_current(SLEEP * HELD)?;
    let held = group.all_reduce(&buffer, ReduceOp::Sum).ctx("held all_reduce")?;
    let path = group.flush_trace().ctx("early flush")?.ok_or("a traced group's flush_trace gave no path")?;
    let early = read(&path)?;
    held.wait().ctx("wait")?;
    group.broadcast(&buffer, 0).ctx("broadcast")?.wait().ctx("wait")?;
    let gathered = r.device.alloc(pg_core::DType::F32, NUMEL * r.size).ctx("alloc")?;
    group.all_gather(&buffer, &gathered).ctx("all_gather")?.wait().ctx("wait")?;
    let peer = match r.rank {
        0 if r.size >= 2 => Some(group.send(&buffer, 1).ctx("send")?),
        1 => Some(group.recv(&buffer, 0).ctx("recv")?),
        _ => None,
    };
    if let Some(work) = peer {
        work.wait().ctx("p2p wait")?;
    }
    // Every op has run before the group shuts down, which writes the file with every device span.
    r.device.synchronize().ctx("synchronize")?;
    group.shutdown().ctx("shutdown")?;
    Ok(early)
}

fn read(path: &std::path::Path) -> Check<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("parsing {}: {e}", path.display()))
}

/// The slices (`ph: "X"`) of a trace whose `args.side` is `side`, sorted by start.
fn slices<'a>(trace: &'a Value, side: &str) -> Vec<&'a Value> {
    let events = trace["traceEvents"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut found: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X" && e["args"]["side"] == side).collect();
    found.sort_by(|a, b| a["ts"].as_f64().partial_cmp(&b["ts"].as_f64()).unwrap_or(std::cmp::Ordering::Equal));
    found
}

/// The start and end of a slice, in microseconds.
fn span(slice: &Value) -> (f64, f64) {
    let ts = slice["ts"].as_f64().unwrap_or(f64::NAN);
    (ts, ts + slice["dur"].as_f64().unwrap_or(f64::NAN))
}

/// Whether `a >= b` (false when either is NaN: a missing time fails the check).
fn ge(a: f64, b: f64) -> bool {
    a >= b
}

/// The op of a slice: (is p2p, sequence number).
fn op_id(slice: &Value) -> (bool, u64) {
    (slice["args"]["is_p2p"] == true, slice["args"]["seq"].as_u64().unwrap_or(u64::MAX))
}

/// Every event has the fields of its kind: `ph`, `pid`, `tid` and `name`; a slice also `ts`, `dur`, `cat` and
/// `args`; the process is `rank` and every track it uses is named.
fn check_schema(trace: &Value, rank: usize) -> Check {
    let events = trace["traceEvents"].as_array().ok_or("no traceEvents list")?;
    ensure!(!events.is_empty(), "the trace holds no event");
    let mut named = std::collections::BTreeSet::new();
    for event in events {
        ensure!(event["ph"].is_string() && event["name"].is_string(), "an event without ph or name: {event}");
        ensure_eq!(event["pid"].as_u64(), Some(rank as u64), "the process of {event}");
        ensure!(event["tid"].is_u64(), "an event without tid: {event}");
        match event["ph"].as_str() {
            Some("M") if event["name"] == "thread_name" => {
                named.insert(event["tid"].as_u64());
            }
            Some("M") => {}
            Some("X") => ensure!(event["ts"].is_f64() || event["ts"].is_u64(), "a slice without ts: {event}"),
            Some("s" | "f") => ensure!(event["id"].is_u64(), "a flow without id: {event}"),
            other => return Err(format!("an event of unexpected kind {other:?}: {event}")),
        }
        if event["ph"] == "X" {
            ensure!(event["dur"].as_f64().is_some_and(|d| d >= 0.0), "a slice without a duration: {event}");
            ensure!(event["cat"].is_string() && event["args"].is_object(), "a slice without cat or args: {event}");
        }
    }
    let process = events.iter().find(|e| e["ph"] == "M" && e["name"] == "process_name");
    ensure_eq!(
        process.map(|p| p["args"]["name"].clone()),
        Some(Value::from(format!("rank {rank}"))),
        "the process name"
    );
    for event in events.iter().filter(|e| e["ph"] == "X") {
        ensure!(named.contains(&event["tid"].as_u64()), "a slice on an unnamed track: {event}");
    }
    Ok(())
}

/// How far (us) a device time may sit before the host time it follows: nothing on a virtual clock; on the wall
/// clock the group's reference uncertainty (written in the file) plus 100 us.
fn slack(trace: &Value, clock: Option<Clock>) -> f64 {
    match clock {
        Some(Clock::Virtual) => 0.0,
        _ => 100.0 + trace["otherData"]["groups"][0]["reference_uncertainty_us"].as_f64().unwrap_or(f64::INFINITY),
    }
}

/// One rank's final file: schema, every op once on the host track in issue order and once on a stream track,
/// each device span after its enqueue began, one stream's spans in sequence order without overlap, the held op's
/// device start after the sleep kernel, sizes and names.
fn check_rank_file(trace: &Value, r: usize, size: usize, group: &str, clock: Option<Clock>) -> Check {
    check_schema(trace, r)?;
    let expected = expected_ops(r, size);
    let host = slices(trace, "host enqueue");
    let device = slices(trace, "device");
    let names: Vec<&str> = host.iter().map(|s| s["name"].as_str().unwrap_or("?")).collect();
    let want: Vec<&str> = expected.iter().map(|op| op.profiling_name()).collect();
    ensure_eq!(names, want, "the host enqueue slices, in order");
    ensure_eq!(device.len(), expected.len(), "device slices (every op ran before the flush at shutdown)");
    let seqs: Vec<u64> = host.iter().filter(|s| !op_id(s).0).map(|s| op_id(s).1).collect();
    ensure_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "collective sequence numbers on the host track");
    let slack = slack(trace, clock);
    for slice in &host {
        ensure_eq!(slice["args"]["group"].as_str(), Some(group), "the group of {slice}");
        let op = slice["name"].as_str().unwrap_or_default();
        if op == "nccl:all_reduce" || op == "nccl:broadcast" {
            ensure_eq!(slice["args"]["input_sizes"], serde_json::json!([[NUMEL]]), "the sizes of {op}");
            ensure_eq!(slice["args"]["input_dtypes"], serde_json::json!(["Float"]), "the dtypes of {op}");
        }
        let on_device =
            device.iter().find(|d| op_id(d) == op_id(slice)).ok_or(format!("no device slice for {slice}"))?;
        ensure_eq!(on_device["name"], slice["name"], "the device slice's name");
        let ((host_start, _), (device_start, device_end)) = (span(slice), span(on_device));
        ensure!(
            device_start + slack >= host_start && device_end >= device_start,
            "{op} (seq {}) ran on the device from {device_start} to {device_end} us, before its enqueue began at \
             {host_start} us",
            op_id(slice).1
        );
        ensure!(on_device["tid"] != slice["tid"], "{op}: the device slice is on the host track");
    }
    // The held all_reduce (collective seq 3) waited for the sleep kernel: its device start is long after its
    // enqueue.
    let held = device.iter().find(|d| op_id(d) == (false, 3)).ok_or("no device slice for the held all_reduce")?;
    let held_host = host.iter().find(|h| op_id(h) == (false, 3)).ok_or("no host slice for the held all_reduce")?;
    let waited = span(held).0 - span(held_host).0;
    let kernel = (SLEEP * HELD).as_secs_f64() * 1e6;
    ensure!(
        ge(waited + slack, kernel / 2.0),
        "the held all_reduce started {waited} us after its enqueue, not after the {kernel} us kernel"
    );
    // The collectives share one stream: their spans follow each other in sequence order.
    let collective: Vec<&&Value> = device.iter().filter(|d| !op_id(d).0).collect();
    for pair in collective.windows(2) {
        let (before, after) = (pair[0], pair[1]);
        ensure_eq!(before["tid"], after["tid"], "the collectives' stream track");
        ensure!(op_id(before).1 < op_id(after).1, "seq {} ran before seq {}", op_id(after).1, op_id(before).1);
        ensure!(
            ge(span(after).0 + slack, span(before).1),
            "seq {} started before seq {} ended",
            op_id(after).1,
            op_id(before).1
        );
    }
    let flows = trace["traceEvents"].as_array().map_or(0, |e| e.iter().filter(|e| e["ph"] == "s").count());
    ensure_eq!(flows, expected.len(), "launch arrows from the enqueues to the device spans");
    Ok(())
}

/// A traced group writes each rank's ops to `rank{r}.json`: every op once on its host track in issue order, with
/// its sequence number, group, sizes and dtypes, and once on its communication stream's track with its device span,
/// which starts after its enqueue began (after a kernel it waited for on the current stream) and follows the
/// previous op of the stream; an op still running at a flush is written with its host times only; an untraced group
/// records and writes nothing.
fn traced_ops_are_written_per_rank_with_device_spans_after_their_enqueue<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size().min(4);
    let clock = h.offers().clock;
    on_each_rank(h, n, |r| {
        let dir = trace_dir(r)?;
        // Tracing off: nothing is recorded, so nothing is written.
        let plain = r.group("plain", Options::builder())?;
        let buffer = r.filled(1.0, NUMEL)?;
        plain.all_reduce(&buffer, ReduceOp::Sum).ctx("untraced all_reduce")?.wait().ctx("wait")?;
        ensure_eq!(plain.flush_trace().ctx("untraced flush")?, None, "an untraced group's flush_trace");
        let group = r.group("traced", Options::builder().trace_dir(Some(dir.clone())))?;
        let early = traced_ops(r, &group)?;
        // The early flush came right after the held op's enqueue: it is there, on the host side only.
        let untimed = early["otherData"]["groups"][0]["ops_untimed"].as_u64().unwrap_or(0);
        ensure!(
            untimed >= 1,
            "the held all_reduce had a device span before it could have run (early flush: {})",
            early["otherData"]
        );
        let path = dir.join(format!("rank{}.json", r.rank));
        let trace = read(&path)?;
        check_rank_file(&trace, r.rank, n, "traced", clock).map_err(|e| format!("{}: {e}", path.display()))?;
        let groups = trace["otherData"]["groups"].as_array().map_or(0, Vec::len);
        ensure_eq!(groups, 1, "groups in the file (the untraced one recorded nothing)");
        r.barrier("trace files read")?;
        if r.rank == 0 {
            let _ = std::fs::remove_dir_all(&dir);
        }
        Ok(())
    })
}

fn traced_ranks_line_up_on_one_clock_once_merged<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size().min(4);
    let clock = h.offers().clock;
    on_each_rank(h, n, |r| {
        let dir = trace_dir(r)?;
        let group = r.group("traced", Options::builder().trace_dir(Some(dir.clone())))?;
        traced_ops(r, &group)?;
        let path = dir.join(format!("rank{}.json", r.rank));
        let text = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        r.store.set(&format!("pg_conformance/trace/{}", r.rank), &text).ctx("publishing the trace")?;
        r.barrier("traces published")?;
        if r.rank != 0 {
            return Ok(());
        }
        let _ = std::fs::remove_dir_all(&dir);
        let mut files = Vec::new();
        for rank in 0..n {
            let bytes = r.store.get(&format!("pg_conformance/trace/{rank}")).ctx("reading a rank's trace")?;
            files.push(serde_json::from_slice::<Value>(&bytes).map_err(|e| format!("rank {rank}'s trace: {e}"))?);
        }
        let merged = crate::traces::merge(&files)?;
        let events = merged["traceEvents"].as_array().ok_or("the merge has no traceEvents")?;
        let pids: std::collections::BTreeSet<u64> = events.iter().filter_map(|e| e["pid"].as_u64()).collect();
        ensure_eq!(pids, (0..n as u64).collect(), "the processes of the merged trace");
        // A collective ends at about one moment on every rank (exactly on the virtual clock): its device ends
        // line up once each rank's times are on the wall clock. Ranks that share a GPU over sockets time-slice it,
        // so one's kernel may end milliseconds after another's; a clock put on the wall clock wrongly is off by
        // far more.
        let tolerance = match clock {
            Some(Clock::Virtual) => 0.0,
            _ => Duration::from_millis(50).as_secs_f64() * 1e6,
        };
        for seq in 1..=5u64 {
            let ends: Vec<(u64, f64)> = events
                .iter()
                .filter(|e| e["ph"] == "X" && e["args"]["side"] == "device" && op_id(e) == (false, seq))
                .map(|e| (e["pid"].as_u64().unwrap_or(u64::MAX), span(e).1))
                .collect();
            ensure_eq!(ends.len(), n, "ranks with a device span of collective seq {seq}");
            let (low, high) =
                ends.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), (_, t)| (l.min(*t), h.max(*t)));
            ensure!(
                ge(tolerance, high - low),
                "collective seq {seq} ends {} us apart across ranks: {ends:?}",
                high - low
            );
        }
        Ok(())
    })
}
