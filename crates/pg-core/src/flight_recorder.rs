//! The flight recorder: a bounded ring of a group's recent ops, dumped as JSON with PyTorch's field names (S24).
//!
//! Every op the group enqueues gets an entry; the watchdog (or the enqueue path's own retirement) marks it started
//! and completed as it observes the op's events, and retires it. An entry holds no event: the state of one not yet
//! retired is asked of its op's events at dump time through the in-flight list, which holds the op's Work until
//! the entry is retired ([`Progress`]), so that recording and retiring an op touch no reference count.
//! A dump lists the entries oldest first with their state (`scheduled`, `started` or `completed`), next to
//! the group's configuration and its last enqueued, started and completed sequence numbers, in the layout of
//! PyTorch's `_dump_nccl_trace_json` (version `2.10`), so that PyTorch's own tools can read it too.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use crate::json::{Object, Value};
use crate::json_object;
use crate::locks::lock;
use crate::{DType, Error, OpType, Result};

/// The dump format version, as PyTorch writes it.
pub const FR_VERSION: &str = "2.10";

/// What an op's events say at dump time, for an entry not yet retired: read from the op's Work on the in-flight
/// list (which holds the Work, and so its events, until the entry is retired), so that an entry holds no event and
/// recording an op touches no reference count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// The start event has passed (only ops with a start event: desync debugging).
    pub(crate) started: bool,
    /// The end event has passed.
    pub(crate) completed: bool,
}

/// What the caller knows about an op when it records it.
pub(crate) struct NewEntry {
    /// The op's sequence number: its collective one, or its point-to-point one for a point-to-point op.
    pub(crate) seq: u64,
    pub(crate) op: OpType,
    pub(crate) time_created_ns: u64,
    /// The input's element count and dtype (every op has one input and one output).
    pub(crate) input: (usize, DType),
    /// The output's element count and dtype.
    pub(crate) output: (usize, DType),
    /// Every buffer's element count and dtype, for an op with lists of buffers (then `input` and `output`
    /// are totals); `None` for a one-buffer op.
    pub(crate) lists: Option<std::sync::Arc<ListSizes>>,
    pub(crate) timeout_ms: u64,
    /// Enqueued under stream capture: the op is nodes of a graph and never runs by itself (`captured` in the dump).
    pub(crate) captured: bool,
    /// The number of the thread that enqueued the op ([`current_thread_number`]; its name is looked up when
    /// dumped).
    pub(crate) thread: u64,
}

/// The element count and dtype of every input and every output buffer of a list op, in order.
#[derive(Debug, Default)]
pub(crate) struct ListSizes {
    pub(crate) inputs: Vec<(usize, DType)>,
    pub(crate) outputs: Vec<(usize, DType)>,
}

/// One recorded op.
struct Entry {
    record_id: u64,
    new: NewEntry,
    time_discovered_started_ns: Option<u64>,
    time_discovered_completed_ns: Option<u64>,
    retired: bool,
}

impl Entry {
    /// Retires the entry: completed at `completed_ns` when given (a failed op keeps its last state). From then on
    /// its state is what the recorder saw, whatever the op's events say.
    fn retire(&mut self, completed_ns: Option<u64>) {
        if let Some(now) = completed_ns {
            self.time_discovered_started_ns.get_or_insert(now);
            self.time_discovered_completed_ns = Some(now);
        }
        self.retired = true;
    }

    /// The entry's state: what the recorder saw, and for an entry not yet retired what its op's events say now
    /// (`progress`; a captured op has none to ask).
    fn state(&self, progress: Progress) -> &'static str {
        let progress = match self.retired || self.new.captured {
            true => Progress::default(),
            false => progress,
        };
        if self.time_discovered_completed_ns.is_some() || progress.completed {
            "completed"
        } else if self.time_discovered_started_ns.is_some() || progress.started {
            "started"
        } else {
            "scheduled"
        }
    }

    fn to_json(&self, pg_id: u64, name: &str, desc: &str, thread_name: &str, progress: Progress) -> Value {
        // PyTorch writes one list entry per tensor: one each for a one-buffer op, every buffer of a list op.
        let sizes = |list: &[(usize, DType)]| list.iter().map(|&(numel, _)| [numel]).collect::<Value>();
        let dtypes = |list: &[(usize, DType)]| list.iter().map(|(_, d)| d.torch_name()).collect::<Value>();
        let new = &self.new;
        let (inputs, outputs) = match &new.lists {
            Some(lists) => (lists.inputs.as_slice(), lists.outputs.as_slice()),
            None => (std::slice::from_ref(&new.input), std::slice::from_ref(&new.output)),
        };
        let is_p2p = new.op.is_p2p();
        let (collective_seq_id, p2p_seq_id) = if is_p2p { (0, new.seq) } else { (new.seq, 0) };
        json_object! {
            "record_id": self.record_id,
            "pg_id": pg_id,
            "process_group": [name, desc],
            "collective_seq_id": collective_seq_id,
            "p2p_seq_id": p2p_seq_id,
            "op_id": new.seq,
            "profiling_name": new.op.profiling_name(),
            "time_created_ns": new.time_created_ns,
            "input_sizes": sizes(inputs),
            "input_dtypes": dtypes(inputs),
            "output_sizes": sizes(outputs),
            "output_dtypes": dtypes(outputs),
            "state": self.state(progress),
            "time_discovered_started_ns": self.time_discovered_started_ns,
            "time_discovered_completed_ns": self.time_discovered_completed_ns,
            "retired": self.retired,
            "timeout_ms": new.timeout_ms,
            "is_p2p": is_p2p,
            "captured": new.captured,
            "frames": Vec::<Value>::new(),
            "thread_id": new.thread,
            "thread_name": thread_name,
        }
        .into()
    }
}

/// The ring proper: the entries in record order from slot `oldest`, wrapping around; once the ring is full, a new
/// record is written in place over the oldest (no division on the way: the slots are counted, not computed).
#[derive(Default)]
struct Ring {
    slots: Vec<Entry>,
    /// The slot of the oldest entry (0 until the ring is full).
    oldest: usize,
    next_id: u64,
}

impl Ring {
    /// Adds `entry` (numbered `next_id`) to a ring of `capacity` (at least 1), over the oldest entry when full.
    #[inline]
    fn push(&mut self, entry: Entry, capacity: usize) {
        self.next_id += 1;
        if self.slots.len() < capacity {
            self.slots.push(entry);
            return;
        }
        self.slots[self.oldest] = entry;
        self.oldest += 1;
        if self.oldest == self.slots.len() {
            self.oldest = 0;
        }
    }

    /// The entry of record `id`, if the ring still holds it.
    fn get_mut(&mut self, id: u64) -> Option<&mut Entry> {
        let held = self.slots.len();
        let first = self.next_id - u64::try_from(held).ok()?;
        let offset = usize::try_from(id.checked_sub(first)?).ok().filter(|&offset| offset < held)?;
        let index = self.oldest + offset;
        self.slots.get_mut(if index >= held { index - held } else { index })
    }

    /// The entries oldest first.
    fn oldest_first(&self) -> impl Iterator<Item = &Entry> {
        let (newer, older) = self.slots.split_at(self.oldest);
        older.iter().chain(newer)
    }
}

/// Who the group is, for the dump's `pg_config` and `pg_status` sections.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct DumpHeader {
    pub(crate) pg_id: u64,
    pub(crate) name: String,
    pub(crate) desc: String,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) comm_lib_version: String,
    pub(crate) last_enqueued: Option<u64>,
    pub(crate) last_started: Option<u64>,
    pub(crate) last_completed: Option<u64>,
}

/// A group's flight recorder: the last `capacity` ops (0 turns it off).
pub(crate) struct FlightRecorder {
    capacity: usize,
    ring: Mutex<Ring>,
}

impl fmt::Debug for FlightRecorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FlightRecorder").field("capacity", &self.capacity).field("len", &self.len()).finish()
    }
}

impl FlightRecorder {
    /// A recorder keeping the last `capacity` entries.
    pub(crate) fn new(capacity: usize) -> Self {
        Self { capacity, ring: Mutex::new(Ring::default()) }
    }

    fn ring(&self) -> MutexGuard<'_, Ring> {
        lock(&self.ring)
    }

    /// Whether the recorder keeps anything (a capacity of 0 turns it off): when it does not, the enqueue path
    /// builds no entry at all.
    pub(crate) fn is_on(&self) -> bool {
        self.capacity != 0
    }

    /// Records an op and returns its record id, or `None` when the recorder is off.
    pub(crate) fn record(&self, new: NewEntry) -> Option<u64> {
        let mut id = None;
        self.record_all(std::iter::once(new), |record_id| id = Some(record_id));
        id
    }

    /// Records ops in order under one lock, handing each one's record id to `recorded` (nothing when the recorder
    /// is off): the in-flight list records a batch of new Works at once.
    pub(crate) fn record_all(&self, entries: impl IntoIterator<Item = NewEntry>, mut recorded: impl FnMut(u64)) {
        if !self.is_on() {
            return;
        }
        let mut ring = self.ring();
        for new in entries {
            let record_id = ring.next_id;
            let entry = Entry {
                record_id,
                new,
                time_discovered_started_ns: None,
                time_discovered_completed_ns: None,
                retired: false,
            };
            ring.push(entry, self.capacity);
            recorded(record_id);
        }
    }

    /// Notes the time the watchdog saw the op start (a no-op once the entry has left the ring).
    pub(crate) fn mark_started(&self, id: u64, now_ns: u64) {
        if let Some(entry) = self.ring().get_mut(id) {
            entry.time_discovered_started_ns.get_or_insert(now_ns);
        }
    }

    /// Retires the entry: completed at `completed_ns` when given (a failed op keeps its last state); from then on
    /// the dump no longer asks the op's events.
    pub(crate) fn retire(&self, id: u64, completed_ns: Option<u64>) {
        if let Some(entry) = self.ring().get_mut(id) {
            entry.retire(completed_ns);
        }
    }

    /// Retires the entries of ops seen completed at `completed_ns`, under one lock: a watchdog pass retires
    /// all it found at once instead of taking the lock the enqueue path records under once per op.
    pub(crate) fn retire_completed(&self, ids: &[u64], completed_ns: u64) {
        if ids.is_empty() {
            return;
        }
        let mut ring = self.ring();
        for &id in ids {
            if let Some(entry) = ring.get_mut(id) {
                entry.retire(Some(completed_ns));
            }
        }
    }

    /// The number of entries held.
    pub(crate) fn len(&self) -> usize {
        self.ring().slots.len()
    }

    /// The dump as a JSON value, oldest entry first. `progress` says what the events of the ops whose entries are
    /// not yet retired say now, by record id (the in-flight list's Works; an entry it does not name is taken as
    /// neither started nor completed).
    pub(crate) fn dump(&self, header: &DumpHeader, progress: &HashMap<u64, Progress>) -> Value {
        let entries: Vec<Value> = {
            let (ring, threads) = (self.ring(), thread_names());
            ring.oldest_first()
                .map(|e| {
                    let now = progress.get(&e.record_id).copied().unwrap_or_default();
                    e.to_json(header.pg_id, &header.name, &header.desc, threads.name(e.new.thread), now)
                })
                .collect()
        };
        let seq = |s: Option<u64>| s.map_or(-1, |s| i64::try_from(s).unwrap_or(i64::MAX));
        let ranks: Vec<String> = (0..header.size).map(|r| r.to_string()).collect();
        let mut pg_config = Object::new();
        pg_config.insert(
            header.name.as_str(),
            json_object! { "name": &header.name, "desc": &header.desc, "ranks": format!("[{}]", ranks.join(", ")) },
        );
        let mut pg_status = Object::new();
        pg_status.insert(
            header.name.as_str(),
            json_object! {
                "last_enqueued_collective": seq(header.last_enqueued),
                "last_started_collective": seq(header.last_started),
                "last_completed_collective": seq(header.last_completed),
            },
        );
        json_object! {
            "version": FR_VERSION,
            "comm_lib_version": &header.comm_lib_version,
            "rank": header.rank,
            "pg_config": pg_config,
            "pg_status": pg_status,
            "entries": entries,
        }
        .into()
    }
}

/// The file a rank's dump goes to: the prefix with the rank appended (`/tmp/nccl_trace_rank_3`).
pub(crate) fn dump_path(prefix: &str, rank: usize) -> PathBuf {
    PathBuf::from(format!("{prefix}{rank}"))
}

/// Writes `dump` to `path` (creating its directory), through a temporary file so that a reader never sees half.
pub(crate) fn write_dump(path: &Path, dump: &Value) -> Result<()> {
    let failed = |what: &str, error: std::io::Error| {
        Error::Backend(format!("flight recorder: could not {what} {}: {error}", path.display()))
    };
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| failed("create the directory of", e))?;
    }
    let text = dump.to_pretty_string();
    let temporary = path.with_extension("partial");
    std::fs::write(&temporary, text).map_err(|e| failed("write", e))?;
    std::fs::rename(&temporary, path).map_err(|e| failed("rename into", e))
}

thread_local! {
    /// The calling thread's number, worked out (and its name registered) once per thread.
    static CURRENT_THREAD: RegisteredThread = RegisteredThread::register();
}

/// The names of the threads that enqueued ops, by number, for the dumps: an entry carries only the number, so
/// that recording an op touches no reference count. A thread's name stays after it ends (its entries may still be
/// dumped) until more than [`KEPT_EXITED_THREADS`] ended threads are kept.
static THREAD_NAMES: std::sync::OnceLock<Mutex<ThreadNames>> = std::sync::OnceLock::new();

/// How many ended threads' names are kept at most.
const KEPT_EXITED_THREADS: usize = 1024;

#[derive(Default)]
struct ThreadNames {
    names: HashMap<u64, (std::sync::Arc<str>, bool)>,
    exited: usize,
}

impl ThreadNames {
    /// The name of the thread numbered `number`, or `unnamed`.
    fn name(&self, number: u64) -> &str {
        self.names.get(&number).map_or("unnamed", |(name, _)| name)
    }
}

fn thread_names() -> MutexGuard<'static, ThreadNames> {
    lock(THREAD_NAMES.get_or_init(Mutex::default))
}

/// A thread's entry in [`THREAD_NAMES`], marked ended when the thread ends.
struct RegisteredThread(u64);

impl RegisteredThread {
    fn register() -> Self {
        let thread = std::thread::current();
        let number = thread_number(&thread.id());
        let name = std::sync::Arc::from(thread.name().unwrap_or("unnamed"));
        thread_names().names.insert(number, (name, true));
        Self(number)
    }
}

impl Drop for RegisteredThread {
    fn drop(&mut self) {
        let mut registry = thread_names();
        if let Some((_, alive)) = registry.names.get_mut(&self.0) {
            *alive = false;
            registry.exited += 1;
        }
        if registry.exited > KEPT_EXITED_THREADS {
            registry.names.retain(|_, (_, alive)| *alive);
            registry.exited = 0;
        }
    }
}

/// The calling thread's number (no lock and no counter touched after the thread's first call).
pub(crate) fn current_thread_number() -> u64 {
    CURRENT_THREAD.with(|thread| thread.0)
}

/// The name of the thread numbered `number` ([`current_thread_number`]), or `unnamed`.
#[cfg(test)]
fn thread_name(number: u64) -> String {
    thread_names().name(number).to_owned()
}

/// A stable number for a thread id (the standard library gives no integer view of it).
fn thread_number(id: &std::thread::ThreadId) -> u64 {
    let text = format!("{id:?}");
    text.chars().filter(char::is_ascii_digit).collect::<String>().parse().unwrap_or(0)
}

/// Nanoseconds of `time`, saturating (the recorder's time fields).
pub(crate) fn nanos(time: std::time::Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;

    /// The dump of `fr` as serde_json reads its text back, with no op's events to ask.
    fn dump_of(fr: &FlightRecorder) -> serde_json::Value {
        dump_with(fr, &HashMap::new())
    }

    /// The dump of `fr`, the ops of the entries in `progress` having got as far as it says.
    fn dump_with(fr: &FlightRecorder, progress: &HashMap<u64, Progress>) -> serde_json::Value {
        serde_json::from_str(&fr.dump(&header(), progress).to_pretty_string()).expect("valid JSON")
    }

    fn entry(seq: u64, op: OpType) -> NewEntry {
        NewEntry {
            seq,
            op,
            time_created_ns: seq * 1000,
            input: (16, DType::F32),
            output: (16, DType::F32),
            lists: None,
            timeout_ms: 600_000,
            captured: false,
            thread: current_thread_number(),
        }
    }

    fn header() -> DumpHeader {
        DumpHeader {
            pg_id: 7,
            name: "0".into(),
            desc: "default_pg".into(),
            rank: 1,
            size: 2,
            comm_lib_version: "mock".into(),
            last_enqueued: Some(3),
            last_started: None,
            last_completed: Some(2),
        }
    }

    /// Records `n` ops in a ring of `capacity` and returns the record ids the dump lists.
    fn ids_after(capacity: usize, n: u64) -> Vec<u64> {
        let fr = FlightRecorder::new(capacity);
        for seq in 1..=n {
            fr.record(entry(seq, OpType::AllReduce));
        }
        let dump = dump_of(&fr);
        dump["entries"].as_array().unwrap().iter().map(|e| e["record_id"].as_u64().unwrap()).collect()
    }

    #[test]
    fn the_ring_keeps_the_last_entries() {
        let cases: &[(usize, u64, &[u64])] =
            &[(0, 5, &[]), (4, 0, &[]), (4, 3, &[0, 1, 2]), (4, 4, &[0, 1, 2, 3]), (4, 6, &[2, 3, 4, 5]), (1, 9, &[8])];
        for &(capacity, n, expected) in cases {
            assert_eq!(ids_after(capacity, n), expected, "capacity {capacity}, {n} ops");
        }
    }

    #[test]
    fn states_follow_the_watchdog_and_the_events_of_entries_not_yet_retired() {
        let fr = FlightRecorder::new(8);
        let a = fr.record(entry(1, OpType::AllReduce)).unwrap();
        let b = fr.record(entry(2, OpType::Broadcast)).unwrap();
        let c = fr.record(entry(3, OpType::Send)).unwrap();
        let mut captured = entry(4, OpType::AllReduce);
        captured.captured = true;
        let d = fr.record(captured).unwrap();
        fr.mark_started(b, 50);
        fr.retire(c, Some(90));
        let states = |progress: &[(u64, Progress)]| -> Vec<String> {
            let dump = dump_with(&fr, &progress.iter().copied().collect());
            dump["entries"].as_array().unwrap().iter().map(|e| e["state"].as_str().unwrap().to_owned()).collect()
        };
        let (started, done) =
            (Progress { started: true, completed: false }, Progress { started: true, completed: true });
        assert_eq!(states(&[]), ["scheduled", "started", "completed", "scheduled"]);
        assert_eq!(states(&[(a, started)]), ["started", "started", "completed", "scheduled"]);
        assert_eq!(
            states(&[(a, done), (b, done), (d, done)]),
            ["completed", "completed", "completed", "scheduled"],
            "the events of an entry not yet retired say how far its op got; a captured op has none to ask"
        );
        fr.retire(a, None);
        assert_eq!(states(&[(a, done)])[0], "scheduled", "a retired entry keeps what the recorder saw");
    }

    #[test]
    fn completed_entries_retire_together() {
        let fr = FlightRecorder::new(2);
        fr.record(entry(1, OpType::AllReduce)).unwrap();
        let b = fr.record(entry(2, OpType::AllReduce)).unwrap();
        fr.record(entry(3, OpType::AllReduce)).unwrap();
        let d = fr.record(entry(4, OpType::AllReduce)).unwrap();
        fr.retire_completed(&[b, d, 999], 7_000);
        let dump = dump_of(&fr);
        let entries = dump["entries"].as_array().unwrap();
        let ids: Vec<u64> = entries.iter().map(|e| e["record_id"].as_u64().unwrap()).collect();
        assert_eq!(ids, [2, 3]);
        let last = entries.last().unwrap();
        assert_eq!(last["retired"], true);
        assert_eq!(last["state"], "completed");
        assert_eq!(last["time_discovered_completed_ns"], 7_000);
        assert_eq!(last["time_discovered_started_ns"], 7_000);
        assert_eq!(entries[0]["retired"], false, "record 2 was not in the list; record {b} had left the ring");
    }

    #[test]
    fn a_full_ring_overwrites_its_oldest_slot_and_finds_entries_by_record_id() {
        let fr = FlightRecorder::new(3);
        let ids: Vec<u64> = (1..=7).map(|seq| fr.record(entry(seq, OpType::AllReduce)).unwrap()).collect();
        assert_eq!(fr.len(), 3);
        // Records 0 to 3 left the ring: retiring them changes nothing; 4 to 6 are found in their slots.
        fr.retire_completed(&ids, 1_000);
        fr.mark_started(ids[3], 500);
        let dump = dump_of(&fr);
        let entries = dump["entries"].as_array().unwrap();
        let seen: Vec<(u64, u64, bool)> = entries
            .iter()
            .map(|e| {
                let (id, seq) = (e["record_id"].as_u64().unwrap(), e["collective_seq_id"].as_u64().unwrap());
                (id, seq, e["retired"].as_bool().unwrap())
            })
            .collect();
        assert_eq!(seen, [(4, 5, true), (5, 6, true), (6, 7, true)]);
        assert!(entries.iter().all(|e| e["time_discovered_completed_ns"] == 1_000));
        fr.record(entry(8, OpType::AllReduce)).unwrap();
        let dump = dump_of(&fr);
        let ids: Vec<u64> =
            dump["entries"].as_array().unwrap().iter().map(|e| e["record_id"].as_u64().unwrap()).collect();
        assert_eq!(ids, [5, 6, 7]);
    }

    #[test]
    fn the_dump_has_pytorch_field_names() {
        let fr = FlightRecorder::new(8);
        let id = fr.record(entry(1, OpType::AllReduce)).unwrap();
        fr.retire(id, Some(5_000));
        fr.record(entry(1, OpType::Recv)).unwrap();
        let dump = dump_of(&fr);
        assert_eq!(dump["version"], "2.10");
        assert_eq!(dump["pg_config"]["0"]["desc"], "default_pg");
        assert_eq!(dump["pg_config"]["0"]["ranks"], "[0, 1]");
        assert_eq!(dump["pg_status"]["0"]["last_enqueued_collective"], 3);
        assert_eq!(dump["pg_status"]["0"]["last_started_collective"], -1);
        let first = &dump["entries"][0];
        for field in [
            "record_id",
            "pg_id",
            "process_group",
            "collective_seq_id",
            "p2p_seq_id",
            "op_id",
            "profiling_name",
            "time_created_ns",
            "input_sizes",
            "input_dtypes",
            "output_sizes",
            "output_dtypes",
            "state",
            "time_discovered_started_ns",
            "time_discovered_completed_ns",
            "retired",
            "timeout_ms",
            "is_p2p",
            "captured",
            "frames",
            "thread_id",
            "thread_name",
        ] {
            assert!(first.get(field).is_some(), "missing field {field}");
        }
        assert_eq!(first["profiling_name"], "nccl:all_reduce");
        assert_eq!(first["captured"], false);
        assert_eq!(first["input_sizes"], json!([[16]]));
        assert_eq!(first["input_dtypes"], json!(["Float"]));
        assert_eq!(first["time_discovered_completed_ns"], 5_000);
        assert_eq!(first["retired"], true);
        let second = &dump["entries"][1];
        assert_eq!((second["is_p2p"].as_bool(), second["p2p_seq_id"].as_u64()), (Some(true), Some(1)));
        assert!(second["time_discovered_completed_ns"].is_null());
    }

    #[test]
    fn the_dump_is_pytorchs_layout_field_for_field() {
        let fr = FlightRecorder::new(4);
        let id = fr.record(entry(1, OpType::AllReduce)).unwrap();
        fr.mark_started(id, 1_500);
        let mut list = entry(2, OpType::AllGather);
        list.lists = Some(Arc::new(ListSizes {
            inputs: vec![(3, DType::F16)],
            outputs: vec![(3, DType::F16), (5, DType::I64)],
        }));
        list.captured = true;
        fr.record(list).unwrap();
        let (thread_id, thread_name) = (current_thread_number(), thread_name(current_thread_number()));
        let entry = |record_id: u64, seq: u64, name: &str, sizes: serde_json::Value, started: Option<u64>| {
            json!({
                "record_id": record_id, "pg_id": 7, "process_group": ["0", "default_pg"], "collective_seq_id": seq,
                "p2p_seq_id": 0, "op_id": seq, "profiling_name": name, "time_created_ns": seq * 1000,
                "input_sizes": sizes["in"], "input_dtypes": sizes["in_types"], "output_sizes": sizes["out"],
                "output_dtypes": sizes["out_types"], "state": if started.is_some() { "started" } else { "scheduled" },
                "time_discovered_started_ns": started, "time_discovered_completed_ns": null, "retired": false,
                "timeout_ms": 600_000, "is_p2p": false, "captured": record_id == 1, "frames": [],
                "thread_id": thread_id, "thread_name": &*thread_name,
            })
        };
        let one = json!({"in": [[16]], "in_types": ["Float"], "out": [[16]], "out_types": ["Float"]});
        let lists = json!({"in": [[3]], "in_types": ["Half"], "out": [[3], [5]], "out_types": ["Half", "Long"]});
        let expected = json!({
            "version": "2.10",
            "comm_lib_version": "mock",
            "rank": 1,
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {"0": {
                "last_enqueued_collective": 3, "last_started_collective": -1, "last_completed_collective": 2,
            }},
            "entries": [
                entry(0, 1, "nccl:all_reduce", one, Some(1_500)),
                entry(1, 2, "nccl:all_gather", lists, None),
            ],
        });
        assert_eq!(dump_of(&fr), expected);
        let compact: serde_json::Value =
            serde_json::from_str(&fr.dump(&header(), &HashMap::new()).to_string()).unwrap();
        assert_eq!(compact, expected);
    }

    #[test]
    fn dumps_are_written_per_rank() {
        let dir = std::env::temp_dir().join(format!("pg-fr-test-{}", std::process::id()));
        let prefix = format!("{}/trace_rank_", dir.display());
        let fr = FlightRecorder::new(2);
        fr.record(entry(1, OpType::AllReduce));
        let path = dump_path(&prefix, 3);
        assert!(path.ends_with("trace_rank_3"));
        write_dump(&path, &fr.dump(&header(), &HashMap::new())).unwrap();
        let read: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(read["entries"].as_array().map(Vec::len), Some(1));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
