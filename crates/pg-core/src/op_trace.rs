//! Real-run timelines (`Options::trace_dir`, `PG_TRACE=DIR`): each op's host enqueue and its device start and end
//! from timing events, written per rank as `DIR/rank{r}.json` in Chrome's trace-event format and lined up across
//! ranks on the wall clock.
//!
//! A traced group records, at its creation, one reference timing event on an idle stream and reads the host's
//! monotonic and wall clocks beside it: that is the group's time origin. Each op (not captured) then records one
//! timing event on its communication stream right before the launch and one right after it, and its host start
//! and end around the whole call. Nothing blocks on them: the device times are resolved later, once both events
//! have passed (by the watchdog every pass, by the enqueue path when many are waiting, or at a flush), as device
//! time since the reference, and the ops and their times land in the group's log.
//!
//! A flush ([`crate::ProcessGroup::flush_trace`], shutdown, dropping the group) writes this rank's file with the
//! logs of the traced groups of the rank in this process: one process (`pid` = the world rank), a host track
//! per group (its enqueue calls) and a track per communication stream of it (the ops' device spans), each op a
//! complete slice (`ph: "X"`) named by its profiling name (`nccl:all_reduce`), with the group, sequence number,
//! sizes and dtypes in its args and an arrow from the enqueue to the device span.
//!
//! A live group's log is rendered at each flush. A dropped group's is rendered once, when it is dropped, and
//! kept as text; the file keeps the newest `KEEP_DROPPED_GROUPS` (64) dropped groups, with at most
//! `KEEP_DROPPED_OPS` (65,536) ops among them, and counts the groups and ops it let go (`groups_released`,
//! `ops_released`). So a rank's memory for groups that are gone is bounded, and a drop renders only its own
//! group (and the live ones), whatever number of groups came before.
//!
//! Times are microseconds since the UNIX epoch: a host time is the reference's wall-clock reading plus the
//! monotonic time since the reference; a device time is the same reading plus the device time from the reference
//! event. The approximations: the reference event is taken to pass when the host recorded it (it is recorded on
//! an idle stream, and again up to twice when recording and synchronising took long, as when the stream was
//! busy; what remains is written as the group's `reference_uncertainty_us`); the ranks' wall clocks are taken to
//! agree (one machine: exactly; several: as well as NTP or PTP keeps them); the device and host clocks are taken
//! not to drift apart over the run. The device time between two events far apart loses precision (CUDA gives it
//! as an `f32` of milliseconds), so the origin moves on to an op's start event once an op starts more than a
//! second away from it: each step adds at most about a microsecond of error.
//!
//! With tracing off the group holds no tracer: the enqueue path checks one `Option` and does nothing else.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::flight_recorder::ListSizes;
use crate::json::{Object, Value};
use crate::json_object;
use crate::locks::lock;
use crate::trace_event::{TraceEvents, Track};
use crate::{Backend, DType, Device, Error, Event, OpType, Result};

/// Ops kept per group (the newest); older ones are dropped and counted in the file (about 1 KB each in it).
const KEEP: usize = 65_536;

/// Dropped groups a rank file keeps (the newest by creation); older ones are released and counted in the file.
pub(crate) const KEEP_DROPPED_GROUPS: usize = 64;

/// Ops the dropped groups a rank file keeps may hold together; the oldest groups beyond it are released.
pub(crate) const KEEP_DROPPED_OPS: usize = KEEP;

/// Track numbers a group's tracks take (its host track, then one per stream).
const TRACKS_PER_GROUP: u64 = 1000;

/// Unresolved ops at which the enqueue path first resolves the finished ones itself (a group without a watchdog,
/// or a device far behind); the mark then doubles past what is left, so that this costs O(1) per op.
const RESOLVE_AT: usize = 1024;

/// How far (ns) from the current origin an op may start before the origin moves on to it.
const REANCHOR_NS: i64 = 1_000_000_000;

/// A reference whose record and synchronisation took longer than this is recorded again (up to twice).
const IDLE_SPREAD: Duration = Duration::from_micros(100);

/// What is known of one traced op when it is enqueued.
#[derive(Clone)]
pub(crate) struct OpInfo {
    pub(crate) seq: u64,
    pub(crate) op: OpType,
    /// The peer of a single point-to-point op (its pair's communicator), else `None`.
    pub(crate) peer: Option<usize>,
    /// The id of the communication stream it ran on.
    pub(crate) stream: u64,
    pub(crate) input: (usize, DType),
    pub(crate) output: (usize, DType),
    pub(crate) lists: Option<Arc<ListSizes>>,
    /// Host monotonic times ([`Device::now`]) at the start and the end of the enqueue call.
    pub(crate) host_start: Duration,
    pub(crate) host_end: Duration,
}

/// An op whose device times are not known yet, with the two timing events around its launch.
struct Pending<B: Backend> {
    info: OpInfo,
    start: B::Event,
    end: B::Event,
}

/// An op as it is written: device start and end in ns from the group's reference event, when known.
#[derive(Clone)]
struct Done {
    info: OpInfo,
    device: Option<(i64, i64)>,
}

/// One traced group's part of its rank's file.
struct GroupLog {
    name: String,
    desc: String,
    pg_id: u64,
    rank: usize,
    size: usize,
    /// The rank in the world: the file's process.
    world_rank: usize,
    /// The wall clock (ns since the UNIX epoch) when the reference event was recorded.
    wall_ns: u64,
    /// The host monotonic time of that moment.
    host: Duration,
    /// How long the reference's record and synchronisation took: the bound on its error.
    uncertainty: Duration,
    /// Ops with their device times resolved (or given up on), oldest first.
    done: VecDeque<Done>,
    /// Ops still running at the last flush: written with host times only.
    unresolved: Vec<OpInfo>,
    /// Ops dropped from the front because the group kept [`KEEP`].
    dropped: u64,
}

impl GroupLog {
    fn push(&mut self, done: Done) {
        if self.done.len() == KEEP {
            self.done.pop_front();
            self.dropped += 1;
        }
        self.done.push_back(done);
    }
}

/// The ops still waiting for their device times, and the current time origin.
struct PendingOps<B: Backend> {
    ops: VecDeque<Pending<B>>,
    /// Where device times are measured from once the reference is far behind: an op's start event, with its
    /// time in ns from the reference.
    anchor: Option<(B::Event, i64)>,
    /// The length at which the enqueue path next resolves.
    resolve_at: usize,
}

/// A traced group's recorder.
pub(crate) struct Tracer<B: Backend> {
    path: PathBuf,
    /// The group's place among its file's groups, in creation order: its track numbers and flow ids.
    slot: u64,
    reference: B::Event,
    pending: Mutex<PendingOps<B>>,
    log: Arc<Mutex<GroupLog>>,
}

/// A dropped group as its file writes it, rendered once.
struct Rendered {
    /// Its trace events, each JSON text, joined by commas.
    events: String,
    /// Its entry in `otherData.groups`.
    summary: Value,
    /// The ops it holds.
    ops: usize,
    world_rank: usize,
}

/// One rank file's groups: the live ones' logs and the dropped ones rendered (see the module docs).
#[derive(Default)]
struct RankFile {
    /// The slot of the next group made for this file.
    next_slot: u64,
    live: BTreeMap<u64, Arc<Mutex<GroupLog>>>,
    dropped: BTreeMap<u64, Rendered>,
    /// The ops of `dropped`, together.
    dropped_ops: usize,
    released_groups: u64,
    released_ops: u64,
    /// Ops rendered for this file so far (what the file's writes cost).
    rendered_ops: u64,
}

impl RankFile {
    /// Keeps `rendered` (slot `slot`), then releases the oldest dropped groups beyond the bounds.
    fn keep_dropped(&mut self, slot: u64, rendered: Rendered) {
        self.dropped_ops += rendered.ops;
        self.dropped.insert(slot, rendered);
        while self.dropped.len() > KEEP_DROPPED_GROUPS
            || (self.dropped_ops > KEEP_DROPPED_OPS && self.dropped.len() > 1)
        {
            let Some((_, oldest)) = self.dropped.pop_first() else { break };
            self.dropped_ops -= oldest.ops;
            self.released_groups += 1;
            self.released_ops += oldest.ops as u64;
        }
    }

    /// The file's text: every kept group in creation order, live ones rendered now.
    fn text(&mut self) -> String {
        let mut parts: Vec<(u64, Rendered)> = Vec::with_capacity(self.live.len());
        for (&slot, log) in &self.live {
            let rendered = render_group(&lock(log), slot);
            self.rendered_ops += rendered.ops as u64;
            parts.push((slot, rendered));
        }
        let mut groups: Vec<(u64, &Rendered)> = parts.iter().map(|(slot, r)| (*slot, r)).collect();
        groups.extend(self.dropped.iter().map(|(slot, r)| (*slot, r)));
        groups.sort_by_key(|(slot, _)| *slot);
        // Every group of the file is on one world rank; its number is the file's.
        let world = groups.first().map_or(0, |(_, r)| r.world_rank as u64);
        let mut process = TraceEvents::new();
        process.process(world, &format!("rank {world}"), world as i64);
        let mut text = String::from("{\"traceEvents\":[");
        let mut first = true;
        let process_events: Vec<String> = process.into_events().iter().map(Value::to_string).collect();
        for events in groups.iter().map(|(_, r)| r.events.as_str()).chain(process_events.iter().map(String::as_str)) {
            if events.is_empty() {
                continue;
            }
            if !first {
                text.push(',');
            }
            first = false;
            text.push_str(events);
        }
        let other: Value = json_object! {
            "pg_trace": 1,
            "rank": world,
            "clock": "ts in microseconds since the UNIX epoch: each group's wall clock at its reference event, plus \
                      host monotonic time (enqueue tracks) or device time from timing events (stream tracks) since it",
            "groups": groups.iter().map(|(_, r)| r.summary.clone()).collect::<Value>(),
            "groups_released": self.released_groups,
            "ops_released": self.released_ops,
            "keeps_dropped_groups": KEEP_DROPPED_GROUPS,
            "keeps_dropped_ops": KEEP_DROPPED_OPS,
        }
        .into();
        text.push_str("],\"displayTimeUnit\":\"ms\",\"otherData\":");
        other.write_compact(&mut text);
        text.push('}');
        text
    }
}

/// Every traced group, by the rank file it goes to (groups of one rank share a file).
static FILES: Mutex<Option<HashMap<PathBuf, RankFile>>> = Mutex::new(None);

/// What a rank file keeps, for tests: the bounds on dropped groups hold however many groups came and went.
#[cfg(feature = "testing")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceFileState {
    /// Traced groups of the file still alive.
    pub live_groups: usize,
    /// Dropped groups the file still writes, and their ops together.
    pub kept_groups: usize,
    pub kept_ops: usize,
    /// Dropped groups (and their ops) let go past the bounds.
    pub released_groups: u64,
    pub released_ops: u64,
    /// Ops rendered for the file's writes so far: a drop adds its own group's and the live groups', never the
    /// kept ones'.
    pub rendered_ops: u64,
}

/// What the rank file at `path` keeps, if a traced group ever wrote to it in this process.
#[cfg(feature = "testing")]
pub fn trace_file_state(path: &Path) -> Option<TraceFileState> {
    let files = lock(&FILES);
    let file = files.as_ref()?.get(path)?;
    Some(TraceFileState {
        live_groups: file.live.len(),
        kept_groups: file.dropped.len(),
        kept_ops: file.dropped_ops,
        released_groups: file.released_groups,
        released_ops: file.released_ops,
        rendered_ops: file.rendered_ops,
    })
}

/// Writes `text` as the file `path` (beside, then renamed, so that a reader never sees half a file).
fn write_file(path: &Path, text: &str) -> Result<()> {
    let partial = path.with_extension("json.partial");
    let write = std::fs::write(&partial, text).and_then(|()| std::fs::rename(&partial, path));
    write.map_err(|error| Error::invalid(format!("trace_dir (PG_TRACE): cannot write {}: {error}", path.display())))
}

/// Who a traced group is, for its file and its tracks.
pub(crate) struct Identity<'a> {
    pub(crate) name: &'a str,
    pub(crate) desc: &'a str,
    pub(crate) pg_id: u64,
    /// The rank in the group, and the group's size.
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The rank in the world: the file's name and process.
    pub(crate) world_rank: usize,
}

impl<B: Backend> Tracer<B> {
    /// The tracer of a new group writing to `dir`: creates the directory and records the reference event (on an
    /// idle stream from the pool, synchronised: this is group creation, not an op).
    pub(crate) fn new(dir: &Path, device: &B::Device, who: Identity<'_>) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|error| {
            Error::invalid(format!("trace_dir (PG_TRACE): cannot create {}: {error}", dir.display()))
        })?;
        let stream = device.stream_from_pool(false)?;
        let reference = device.create_timing_event()?;
        let (mut host, mut wall, mut uncertainty) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..3 {
            let before = device.now();
            reference.record(&stream)?;
            (host, wall) = (device.now(), device.wall_clock());
            reference.synchronize()?;
            uncertainty = device.now().saturating_sub(before);
            if uncertainty <= IDLE_SPREAD {
                break;
            }
        }
        let log = GroupLog {
            name: who.name.to_owned(),
            desc: who.desc.to_owned(),
            pg_id: who.pg_id,
            rank: who.rank,
            size: who.size,
            world_rank: who.world_rank,
            wall_ns: u64::try_from(wall.as_nanos()).unwrap_or(u64::MAX),
            host,
            uncertainty,
            done: VecDeque::new(),
            unresolved: Vec::new(),
            dropped: 0,
        };
        let log = Arc::new(Mutex::new(log));
        let path = dir.join(format!("rank{}.json", who.world_rank));
        let slot = {
            let mut files = lock(&FILES);
            let file = files.get_or_insert_with(HashMap::new).entry(path.clone()).or_default();
            let slot = file.next_slot;
            file.next_slot += 1;
            file.live.insert(slot, Arc::clone(&log));
            slot
        };
        let pending = Mutex::new(PendingOps { ops: VecDeque::new(), anchor: None, resolve_at: RESOLVE_AT });
        Ok(Self { path, slot, reference, pending, log })
    }

    /// Takes a just enqueued op with the timing events recorded around its launch.
    pub(crate) fn push(&self, info: OpInfo, start: B::Event, end: B::Event) {
        let mut pending = lock(&self.pending);
        pending.ops.push_back(Pending { info, start, end });
        if pending.ops.len() >= pending.resolve_at {
            // Without a watchdog nothing else resolves them before a flush: queries only, nothing blocks.
            self.resolve_locked(&mut pending);
            if pending.ops.len() >= KEEP {
                // The device is far behind (or stuck): the oldest ops are written without device times.
                let mut log = lock(&self.log);
                while pending.ops.len() >= KEEP / 2 {
                    let Some(oldest) = pending.ops.pop_front() else { break };
                    log.push(Done { info: oldest.info, device: None });
                }
            }
            pending.resolve_at = RESOLVE_AT.max(2 * pending.ops.len());
        }
    }

    /// Resolves the device times of every op whose events have passed (event queries only: the watchdog's
    /// pass calls it).
    pub(crate) fn resolve(&self) {
        let mut pending = lock(&self.pending);
        if !pending.ops.is_empty() {
            self.resolve_locked(&mut pending);
        }
    }

    fn resolve_locked(&self, pending: &mut PendingOps<B>) {
        let mut still = VecDeque::new();
        let mut resolved = Vec::new();
        // A stream runs its ops in order: once one of its ops has not finished, its later ones are not asked.
        let mut running: Vec<u64> = Vec::new();
        while let Some(op) = pending.ops.pop_front() {
            if running.contains(&op.info.stream) {
                still.push_back(op);
                continue;
            }
            let (base, base_ns) = match &pending.anchor {
                Some((event, ns)) => (event, *ns),
                None => (&self.reference, 0),
            };
            let times = op.start.nanos_since(base).and_then(|start| match start {
                Some(start) => Ok(op.end.nanos_since(&op.start)?.map(|length| (start, length))),
                None => Ok(None),
            });
            match times {
                Ok(None) => {
                    running.push(op.info.stream);
                    still.push_back(op);
                }
                // A device error (the communicator aborted, the context lost): the op keeps its host times.
                Err(_) => resolved.push(Done { info: op.info, device: None }),
                Ok(Some((from_base, length))) => {
                    let start = base_ns.saturating_add(from_base);
                    resolved.push(Done { info: op.info, device: Some((start, start.saturating_add(length))) });
                    if from_base.abs() > REANCHOR_NS {
                        pending.anchor = Some((op.start, start));
                    }
                }
            }
        }
        pending.ops = still;
        if !resolved.is_empty() {
            let mut log = lock(&self.log);
            for done in resolved {
                log.push(done);
            }
        }
    }

    /// Resolves what has finished and writes this rank's file (every traced group of the rank in this
    /// process); returns its path.
    pub(crate) fn flush(&self) -> Result<PathBuf> {
        self.settle();
        let mut files = lock(&FILES);
        let file = files.get_or_insert_with(HashMap::new).entry(self.path.clone()).or_default();
        write_file(&self.path, &file.text())?;
        Ok(self.path.clone())
    }

    /// Resolves what has finished; the ops still running are written with their host times.
    fn settle(&self) {
        let mut pending = lock(&self.pending);
        self.resolve_locked(&mut pending);
        lock(&self.log).unresolved = pending.ops.iter().map(|op| op.info.clone()).collect();
    }
}

impl<B: Backend> Drop for Tracer<B> {
    /// The group is gone: its log is rendered once and kept as text (within the file's bounds), and the file is
    /// written with it.
    fn drop(&mut self) {
        self.settle();
        let mut files = lock(&FILES);
        let file = files.get_or_insert_with(HashMap::new).entry(self.path.clone()).or_default();
        file.live.remove(&self.slot);
        let rendered = render_group(&lock(&self.log), self.slot);
        file.rendered_ops += rendered.ops as u64;
        file.keep_dropped(self.slot, rendered);
        if let Err(error) = write_file(&self.path, &file.text()) {
            tracing::warn!(target: "pg", path = %self.path.display(), %error, "writing the trace failed");
        }
    }
}

/// The sizes and dtypes of one side of an op, as the flight recorder lists them.
fn sides(info: &OpInfo) -> Object {
    let list = |each: &[(usize, DType)]| -> (Value, Value) {
        (each.iter().map(|&(n, _)| [n]).collect(), each.iter().map(|(_, d)| d.to_string()).collect())
    };
    let ((input_sizes, input_dtypes), (output_sizes, output_dtypes)) = match &info.lists {
        Some(lists) => (list(&lists.inputs), list(&lists.outputs)),
        None => (list(&[info.input]), list(&[info.output])),
    };
    json_object! {"input_sizes": input_sizes, "input_dtypes": input_dtypes, "output_sizes": output_sizes,
    "output_dtypes": output_dtypes}
}

/// Nanoseconds since the epoch of a time `offset` ns from `base` (saturating at 0).
fn at(base: u64, offset: i64) -> u64 {
    match offset >= 0 {
        true => base.saturating_add(offset as u64),
        false => base.saturating_sub(offset.unsigned_abs()),
    }
}

/// One group's tracks and ops (its slot numbers its tracks and flows apart from the file's other groups), and its
/// entry in `otherData.groups`.
fn render_group(log: &GroupLog, slot: u64) -> Rendered {
    let mut events = TraceEvents::with_first_flow_id(slot << 32);
    let world = log.world_rank as u64;
    let label = format!("{} ({})", log.desc, log.name);
    // The host track first, then one per stream as ops name them.
    let base = 1 + slot * TRACKS_PER_GROUP;
    let host = Track::new(world, base);
    events.thread(host, &format!("{label} enqueue"), base as i64);
    let mut streams: Vec<(u64, Option<usize>)> = Vec::new();
    let ops =
        log.done.iter().cloned().chain(log.unresolved.iter().map(|info| Done { info: info.clone(), device: None }));
    let wall_of_host = |time: Duration| {
        let offset =
            i64::try_from(time.as_nanos()).unwrap_or(i64::MAX) - i64::try_from(log.host.as_nanos()).unwrap_or(i64::MAX);
        at(log.wall_ns, offset)
    };
    let (mut timed, mut untimed) = (0u64, 0u64);
    for done in ops {
        let info = &done.info;
        let name = info.op.profiling_name();
        let mut args = sides(info);
        args.insert("group", &log.name);
        args.insert("group_desc", &log.desc);
        args.insert("seq", info.seq);
        args.insert("is_p2p", info.op.is_p2p());
        if let Some(peer) = info.peer {
            args.insert("peer", peer);
        }
        args.insert("side", "host enqueue");
        let host_start = wall_of_host(info.host_start);
        let host_end = wall_of_host(info.host_end);
        let Some((start, end)) = done.device else {
            untimed += 1;
            args.insert("device", "not timed: the op had not finished at the flush, or its events failed");
            events.slice(host, name, "op", host_start, host_end, args);
            continue;
        };
        timed += 1;
        let slot = match streams.iter().position(|(id, _)| *id == info.stream) {
            Some(slot) => slot,
            None => {
                streams.push((info.stream, info.peer));
                let track = Track::new(world, base + streams.len() as u64);
                let what = match info.peer {
                    None => "comm stream".to_owned(),
                    Some(peer) => format!("p2p stream {}:{}", log.rank.min(peer), log.rank.max(peer)),
                };
                events.thread(track, &format!("{label} {what}"), track.tid as i64);
                streams.len() - 1
            }
        };
        let stream = Track::new(world, base + 1 + slot as u64);
        let (start, end) = (at(log.wall_ns, start), at(log.wall_ns, end));
        events.slice(host, name, "op", host_start, host_end, args);
        // The device span names its op; the sizes are on the enqueue it comes from.
        let device_args = json_object! {
            "group": &log.name, "seq": info.seq, "is_p2p": info.op.is_p2p(), "side": "device",
            "enqueue_to_start_us": (start as f64 - host_start as f64) / 1e3,
        };
        events.slice(stream, name, "op", start, end, device_args);
        events.flow("launch", "op", (host, host_start), (stream, start));
    }
    let summary = json_object! {
        "group": &log.name, "desc": &log.desc, "pg_id": log.pg_id, "rank": log.rank, "size": log.size,
        "reference_wall_us": log.wall_ns as f64 / 1e3,
        "reference_uncertainty_us": log.uncertainty.as_nanos() as f64 / 1e3,
        "ops_timed": timed, "ops_untimed": untimed, "ops_dropped": log.dropped,
    }
    .into();
    let mut text = String::new();
    for (index, event) in events.into_events().iter().enumerate() {
        if index > 0 {
            text.push(',');
        }
        event.write_compact(&mut text);
    }
    let ops = usize::try_from(timed + untimed).unwrap_or(usize::MAX);
    Rendered { events: text, summary, ops, world_rank: log.world_rank }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn op(seq: u64, op: OpType, peer: Option<usize>, stream: u64, numel: usize, host_us: (u64, u64)) -> OpInfo {
        OpInfo {
            seq,
            op,
            peer,
            stream,
            input: (numel, DType::F32),
            output: (numel, DType::F32),
            lists: None,
            host_start: Duration::from_micros(host_us.0),
            host_end: Duration::from_micros(host_us.1),
        }
    }

    #[test]
    fn a_rank_file_is_the_trace_event_format_field_for_field() {
        // The reference at 1 s on the wall clock and 10 us on the host's; an all_reduce timed on the device 15 to
        // 40 us after the reference, and a send still running at the flush.
        let log = GroupLog {
            name: "0".to_owned(),
            desc: "default_pg".to_owned(),
            pg_id: 0,
            rank: 0,
            size: 2,
            world_rank: 0,
            wall_ns: 1_000_000_000,
            host: Duration::from_micros(10),
            uncertainty: Duration::from_micros(2),
            done: VecDeque::from([Done {
                info: op(1, OpType::AllReduce, None, 5, 4, (20, 30)),
                device: Some((15_000, 40_000)),
            }]),
            unresolved: vec![op(1, OpType::Send, Some(1), 6, 8, (50, 60))],
            dropped: 0,
        };
        let mut file = RankFile::default();
        file.live.insert(0, Arc::new(Mutex::new(log)));
        let read: serde_json::Value = serde_json::from_str(&file.text()).expect("valid JSON");
        let clock = read["otherData"]["clock"].as_str().unwrap_or_default();
        assert!(clock.starts_with("ts in microseconds since the UNIX epoch"), "{clock}");
        let sides = |numel: usize| {
            json!({"input_sizes": [[numel]], "input_dtypes": ["Float"], "output_sizes": [[numel]],
                   "output_dtypes": ["Float"]})
        };
        let mut enqueue = sides(4);
        enqueue.as_object_mut().unwrap().extend(
            json!({"group": "0", "group_desc": "default_pg", "seq": 1, "is_p2p": false, "side": "host enqueue"})
                .as_object()
                .unwrap()
                .clone(),
        );
        let mut untimed = sides(8);
        untimed.as_object_mut().unwrap().extend(
            json!({"group": "0", "group_desc": "default_pg", "seq": 1, "is_p2p": true, "peer": 1,
                   "side": "host enqueue",
                   "device": "not timed: the op had not finished at the flush, or its events failed"})
            .as_object()
            .unwrap()
            .clone(),
        );
        let expected = json!({
            "traceEvents": [
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "default_pg (0) enqueue"}},
                {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": 1, "args": {"sort_index": 1}},
                {"ph": "M", "name": "thread_name", "pid": 0, "tid": 2, "args": {"name": "default_pg (0) comm stream"}},
                {"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": 2, "args": {"sort_index": 2}},
                {"ph": "X", "name": "nccl:all_reduce", "cat": "op", "pid": 0, "tid": 1, "ts": 1_000_010.0, "dur": 10.0,
                 "args": enqueue},
                {"ph": "X", "name": "nccl:all_reduce", "cat": "op", "pid": 0, "tid": 2, "ts": 1_000_015.0, "dur": 25.0,
                 "args": {"group": "0", "seq": 1, "is_p2p": false, "side": "device", "enqueue_to_start_us": 5.0}},
                {"ph": "s", "name": "launch", "cat": "op", "id": 1, "pid": 0, "tid": 1, "ts": 1_000_010.0},
                {"ph": "f", "bp": "e", "name": "launch", "cat": "op", "id": 1, "pid": 0, "tid": 2, "ts": 1_000_015.0},
                {"ph": "X", "name": "nccl:send", "cat": "op", "pid": 0, "tid": 1, "ts": 1_000_040.0, "dur": 10.0,
                 "args": untimed},
                {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "rank 0"}},
                {"ph": "M", "name": "process_sort_index", "pid": 0, "tid": 0, "args": {"sort_index": 0}},
            ],
            "displayTimeUnit": "ms",
            "otherData": {
                "pg_trace": 1, "rank": 0, "clock": clock,
                "groups": [{
                    "group": "0", "desc": "default_pg", "pg_id": 0, "rank": 0, "size": 2,
                    "reference_wall_us": 1_000_000.0, "reference_uncertainty_us": 2.0,
                    "ops_timed": 1, "ops_untimed": 1, "ops_dropped": 0,
                }],
                "groups_released": 0, "ops_released": 0, "keeps_dropped_groups": 64, "keeps_dropped_ops": 65_536,
            },
        });
        assert_eq!(read, expected);
    }
}
