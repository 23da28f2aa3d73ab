//! The world's timeline in virtual time: what every stream ran, which waits crossed streams, when host threads
//! were blocked and where hazards were found, kept as records in a bounded ring ([`WorldConfig::trace_capacity`])
//! and handed out as a [`Trace`] by [`World::trace`](crate::World::trace).
//!
//! Recording happens where the simulation already knows the answer (an operation's resolution, a parked thread's
//! wake-up, a hazard check), under the world's lock, and costs one push of a small record; with a capacity of 0
//! nothing is recorded. The Chrome trace-event form of a [`Trace`] is in `trace_json.rs`.
//!
//! [`WorldConfig::trace_capacity`]: crate::WorldConfig::trace_capacity

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Time;
use crate::hazard::HazardKind;

/// What kind of kernel a [`KernelRecord`](crate::KernelRecord) or a [`StreamSpan`] is.
pub use pg_core::KernelKind;

/// What a stream span was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpanKind {
    /// A kernel, a copy or a communication kernel.
    Kernel(KernelKind),
    /// A `wait_event`: the stream waited, from its previous operation's end, for an event recorded elsewhere.
    Wait,
}

/// Which operation of a communicator a communication kernel was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommOp {
    /// The communicator's number (as hazard and deadlock reports name it).
    pub communicator: u64,
    /// The communicator's description (the process group's, when a group made it).
    pub description: String,
    /// The collective's index on the communicator (the k-th collective of every rank), if it is one.
    pub collective: Option<u64>,
    /// For a point-to-point message: (sender, receiver, the message's index between them).
    pub message: Option<(usize, usize, u64)>,
}

/// One operation a stream ran, or still runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpan {
    /// The device (the rank, in [`World::run`](crate::World::run)).
    pub device: usize,
    /// The stream's id ([`pg_core::Stream::id`]).
    pub stream: u64,
    /// Its name (`sleep`, `fill`, `all_reduce`, `wait_event`, ...).
    pub name: String,
    /// What it was.
    pub kind: SpanKind,
    /// When the host enqueued it.
    pub enqueued: Duration,
    /// When it started (for a wait: when the stream reached it).
    pub start: Duration,
    /// When it finished; `None`: it had not when the trace was taken (a hung collective, a wait for one).
    pub end: Option<Duration>,
    /// The communicator operation, for a communication kernel.
    pub comm: Option<CommOp>,
}

/// A stream that waited for an event: the arrow from the operation the event marked to the wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventWait {
    /// The device of the waiting stream.
    pub device: usize,
    /// The device and stream the event was recorded on.
    pub recorded_on: (usize, u64),
    /// When the marked operation (the last one on that stream at the record) started and finished.
    pub marked: (Duration, Duration),
    /// The waiting stream.
    pub stream: u64,
    /// When the waiting stream reached the wait.
    pub reached: Duration,
    /// When the wait was over (the later of `reached` and the marked operation's end).
    pub ready: Duration,
}

/// A host thread blocked in the simulation (a synchronize, a blocking store read, a sleep, a full launch queue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostBlock {
    /// The thread's number in the world.
    pub thread: usize,
    /// What it waited for.
    pub what: String,
    /// When it blocked.
    pub start: Duration,
    /// When it went on; `None`: it was still blocked when the trace was taken.
    pub end: Option<Duration>,
}

/// A registered host thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceThread {
    /// Its number in the world.
    pub thread: usize,
    /// Its name (`rank0`, `pg-watchdog`, ...).
    pub name: String,
    /// The device it works for: a rank's thread, and the threads it started; `None` for others.
    pub device: Option<usize>,
}

/// A stream of the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceStream {
    /// Its device.
    pub device: usize,
    /// Its id ([`pg_core::Stream::id`]; 0 is the default stream).
    pub stream: u64,
    /// Whether it came from the high-priority pool.
    pub high_priority: bool,
}

/// A hazard, where and when the access that found it was launched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HazardMark {
    /// The device.
    pub device: usize,
    /// The stream of the access that found it.
    pub stream: u64,
    /// When that access was launched (host time).
    pub at: Duration,
    /// What kind of hazard.
    pub kind: HazardKind,
    /// The access that found it: the operation and its stream.
    pub access: String,
    /// The earlier access it is not ordered after.
    pub earlier: String,
    /// The hazard report ([`crate::Hazard::message`]).
    pub message: String,
}

/// What a [`World`](crate::World) recorded, in virtual time: [`World::trace`](crate::World::trace).
///
/// Spans come from the world's bounded record ring: a long run keeps its latest records (`dropped` counts the
/// others). [`Trace::to_chrome_json`] gives Chrome's trace-event JSON, for Perfetto or chrome://tracing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    /// The global virtual time when the trace was taken.
    pub now: Duration,
    /// How many devices the world has.
    pub devices: usize,
    /// Records the ring dropped (oldest first) to stay within its capacity.
    pub dropped: u64,
    /// Every stream of the world.
    pub streams: Vec<TraceStream>,
    /// The host threads running when the trace was taken, and those its records name.
    pub threads: Vec<TraceThread>,
    /// What the streams ran, by start time; the operation each stream was at when the trace was taken is last,
    /// without an end.
    pub spans: Vec<StreamSpan>,
    /// Waits for events recorded on another stream (or earlier on the same one).
    pub waits: Vec<EventWait>,
    /// Host threads blocked in the simulation.
    pub blocked: Vec<HostBlock>,
    /// Hazards found.
    pub hazards: Vec<HazardMark>,
}

/// One record of the ring.
#[derive(Debug, Clone)]
pub(crate) enum Record {
    /// An operation finished on a stream (`start` is when a wait was reached).
    Span { stream: usize, name: String, kind: SpanKind, enqueued: Time, start: Time, end: Time, comm: Option<CommSlot> },
    /// A wait on `stream`, reached at `reached` and over at `ready`, for `marked` (start, end) on `from`.
    Wait { from: usize, marked: (Time, Time), stream: usize, reached: Time, ready: Time },
    /// Thread `thread` (`name`, working for `device`) was blocked from `start` to `end`.
    Blocked { thread: usize, name: Arc<str>, device: Option<usize>, what: String, start: Time, end: Time },
    /// A hazard found by an access on `stream` launched at `at`.
    Hazard { stream: usize, at: Time, kind: HazardKind, access: String, earlier: String, message: String },
}

/// A communicator operation as a record keeps it: the communicator's index in the world and the operation's
/// index on it (a collective's, or a message's between two ranks).
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommSlot {
    pub(crate) group: usize,
    pub(crate) collective: Option<u64>,
    pub(crate) message: Option<(usize, usize, u64)>,
}

/// The ring of records and the names of the running threads (a record keeps the name of its own).
#[derive(Debug)]
pub(crate) struct TraceLog {
    capacity: usize,
    pub(crate) records: VecDeque<Record>,
    pub(crate) dropped: u64,
    /// Every running thread: its name and device.
    pub(crate) threads: BTreeMap<usize, (Arc<str>, Option<usize>)>,
}

impl TraceLog {
    pub(crate) fn new(capacity: usize) -> Self {
        Self { capacity, records: VecDeque::new(), dropped: 0, threads: BTreeMap::new() }
    }

    /// Whether anything is recorded (checked before a record is built).
    pub(crate) fn on(&self) -> bool {
        self.capacity > 0
    }

    pub(crate) fn push(&mut self, record: Record) {
        if self.capacity == 0 {
            return;
        }
        if self.records.len() >= self.capacity {
            self.records.pop_front();
            self.dropped += 1;
        }
        self.records.push_back(record);
    }

    /// Names thread `tid` (at its registration).
    pub(crate) fn thread(&mut self, tid: usize, name: &str, device: Option<usize>) {
        if self.on() {
            self.threads.insert(tid, (Arc::from(name), device));
        }
    }

    /// The device thread `tid` works for.
    pub(crate) fn thread_device(&self, tid: usize) -> Option<usize> {
        self.threads.get(&tid).and_then(|(_, device)| *device)
    }

    /// Forgets thread `tid`, which ended (the records that name it keep its name).
    pub(crate) fn forget_thread(&mut self, tid: usize) {
        self.threads.remove(&tid);
    }

    /// Sets the device of thread `tid` (a rank's thread).
    pub(crate) fn set_thread_device(&mut self, tid: usize, device: usize) {
        if let Some(entry) = self.threads.get_mut(&tid) {
            entry.1 = Some(device);
        }
    }
}
