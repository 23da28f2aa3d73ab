//! The simulated machine's state, under the world's one lock: host threads, devices and their streams of
//! operations, events, memory blocks, communicators, the store's contents, faults and hazards.
//!
//! This file holds the data; what changes it lives with each concern (`stream.rs` resolves operations,
//! `communicator.rs` matches collectives, `allocator.rs` hands out memory and checks accesses, `sched.rs`
//! moves the clock), and those files depend on this one, never the other way round.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use pg_core::{DType, ReduceOp};

use crate::clock::{ns, OpRef, Park, Time};
use crate::config::WorldConfig;
use crate::fault::Fault;
use crate::hazard::{Hazard, HazardMode, History, VClock};
use crate::trace::{KernelKind, TraceLog};

/// One registered host thread.
#[derive(Debug)]
pub(crate) struct ThreadState {
    pub(crate) name: String,
    /// Its local time: the global time plus the host costs run up since it last woke.
    pub(crate) local: Time,
    /// What it knows has happened (streams it synchronised with), for hazard detection.
    pub(crate) clock: VClock,
    /// Its registered wait, while parked.
    pub(crate) park: Option<Park>,
    /// A helper of the process group (`Device::spawn_host_thread`: a watchdog, a heartbeat monitor) or a host
    /// callback: helpers alone do not move the clock, so a helper left behind by its ranks waits instead of
    /// spinning through time; only one waiting for the store or for device work that ends at a known time moves it
    /// that far.
    pub(crate) helper: bool,
    /// Where it comes from: the order of its parent, then its number among the threads that parent registered
    /// (a thread registered by an unregistered one: its number among those). Unlike the thread id, which follows
    /// the real order in which threads register, it follows only what each thread did, so it orders store
    /// operations that fall on one virtual instant the same way in every run ([`crate::clock::Cond::StoreTurn`]).
    pub(crate) order: Vec<u32>,
    /// How many threads it registered.
    pub(crate) registered: u32,
}

/// All simulated state, under the world's one lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) now: Time,
    /// Bumped on every change, for the stall detector.
    pub(crate) version: u64,
    pub(crate) threads: BTreeMap<usize, ThreadState>,
    pub(crate) next_thread: usize,
    /// How many threads unregistered threads registered (the first element of their [`ThreadState::order`]).
    pub(crate) top_threads: u32,
    pub(crate) interrupt_epoch: u64,
    /// A deadlock or limit report: every parked thread panics with it.
    pub(crate) failure: Option<String>,
    /// Registered threads that ended by a panic, in order (the first is the likely root cause).
    pub(crate) panicked: Vec<(usize, String)>,
    pub(crate) devices: Vec<DeviceState>,
    pub(crate) streams: Vec<StreamState>,
    /// Streams with operations not yet resolved.
    pub(crate) active: BTreeSet<usize>,
    /// Start times of matched collectives waiting for the clock to reach them (see `State::try_fire`): the clock
    /// stops at each, so that the collective starts then unless a rank aborted or revoked its part first.
    pub(crate) pending_starts: BTreeSet<Time>,
    pub(crate) events: HashMap<u64, EventState>,
    pub(crate) next_event: u64,
    pub(crate) alloc: Allocator,
    pub(crate) comms: Comms,
    pub(crate) store: StoreState,
    pub(crate) hazards: Vec<Hazard>,
    /// A hazard to panic with once the lock is released (in [`HazardMode::Panic`]).
    pub(crate) pending_panic: Option<String>,
    pub(crate) faults: Vec<Fault>,
    /// Bytes read by finished device-to-host copies, until their caller takes them.
    pub(crate) to_host: HashMap<OpRef, Vec<u8>>,
    /// Device-to-host copies whose caller gave up before they ran (the device was poisoned): nobody takes their
    /// bytes, so none are kept.
    pub(crate) abandoned_to_host: std::collections::HashSet<OpRef>,
    pub(crate) kernel_log_capacity: usize,
    /// The timeline's record ring ([`crate::World::trace`]).
    pub(crate) trace: TraceLog,
    pub(crate) hazard_mode: HazardMode,
    /// A copy of the world's configuration (the cost model).
    pub(crate) config: WorldConfig,
}

impl State {
    /// A world at virtual time zero: no threads yet, each device with its default stream.
    pub(crate) fn new(config: &WorldConfig) -> Self {
        let mut state = Self {
            now: 0,
            version: 0,
            threads: BTreeMap::new(),
            next_thread: 0,
            top_threads: 0,
            interrupt_epoch: 0,
            failure: None,
            panicked: Vec::new(),
            devices: Vec::new(),
            streams: Vec::new(),
            active: BTreeSet::new(),
            pending_starts: BTreeSet::new(),
            events: HashMap::new(),
            next_event: 0,
            alloc: Allocator::default(),
            comms: Comms::default(),
            store: StoreState::default(),
            hazards: Vec::new(),
            pending_panic: None,
            faults: config.faults.clone(),
            to_host: HashMap::new(),
            abandoned_to_host: std::collections::HashSet::new(),
            kernel_log_capacity: config.kernel_log_capacity,
            trace: TraceLog::new(config.trace_capacity),
            hazard_mode: config.hazard_mode,
            config: config.clone(),
        };
        for device in 0..config.devices {
            let default = state.add_stream(device, 0, false);
            state.devices.push(DeviceState::new(default));
        }
        state
    }

    /// The local time of thread `tid` (the global time for an unregistered caller).
    pub(crate) fn local(&self, tid: Option<usize>) -> Time {
        tid.and_then(|t| self.threads.get(&t)).map_or(self.now, |t| t.local.max(self.now))
    }

    /// Adds `cost` to thread `tid`'s local time.
    pub(crate) fn charge(&mut self, tid: Option<usize>, cost: Duration) {
        if let Some(thread) = tid.and_then(|t| self.threads.get_mut(&t)) {
            thread.local = thread.local.max(self.now) + ns(cost);
        }
    }

    /// Moves thread `tid`'s local time to at least `time` (it observed something that happened then).
    pub(crate) fn observe(&mut self, tid: Option<usize>, time: Time) {
        if let Some(thread) = tid.and_then(|t| self.threads.get_mut(&t)) {
            thread.local = thread.local.max(time);
        }
    }

    /// The calling thread's vector clock joined with `other` (it synchronised with it).
    pub(crate) fn join_thread_clock(&mut self, tid: Option<usize>, other: &VClock) {
        if let Some(thread) = tid.and_then(|t| self.threads.get_mut(&t)) {
            thread.clock.join(other);
        }
    }

    pub(crate) fn add_thread(&mut self, name: String, parent: Option<usize>, helper: bool) -> usize {
        let tid = self.next_thread;
        self.next_thread += 1;
        let (local, clock, order) = match parent.and_then(|p| self.threads.get_mut(&p)) {
            Some(p) => {
                let mut order = p.order.clone();
                order.push(p.registered);
                p.registered += 1;
                (p.local.max(self.now), p.clock.clone(), order)
            }
            None => {
                self.top_threads += 1;
                (self.now, VClock::default(), vec![self.top_threads - 1])
            }
        };
        // A thread works for the device of the thread that started it (a rank's watchdog for that rank).
        let device = parent.and_then(|p| self.trace.thread_device(p));
        self.trace.thread(tid, &name, device);
        self.threads.insert(tid, ThreadState { name, local, clock, park: None, helper, order, registered: 0 });
        self.version += 1;
        tid
    }

    /// Records a hazard: kept, and in panic mode raised once the lock is released.
    pub(crate) fn hazard(&mut self, hazard: Hazard) {
        tracing::warn!(target: "pg_mock::hazard", "{}", hazard.message);
        if self.hazard_mode == HazardMode::Panic && self.pending_panic.is_none() {
            self.pending_panic = Some(hazard.message.clone());
        }
        self.hazards.push(hazard);
    }

    /// The kernels device `device` has run (the oldest dropped beyond the log capacity), in start order.
    pub(crate) fn kernel_log(&self, device: usize) -> Vec<KernelRecord> {
        let mut log: Vec<KernelRecord> =
            self.devices.get(device).map(|d| d.log.iter().cloned().collect()).unwrap_or_default();
        log.sort_by(|a, b| (a.start, a.end, a.stream_id, &a.name).cmp(&(b.start, b.end, b.stream_id, &b.name)));
        log
    }
}

// ===== Streams and operations =====

/// One kernel a device ran, as a profiler would show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelRecord {
    /// The id of the stream it ran on.
    pub stream_id: u64,
    /// What it was.
    pub kind: KernelKind,
    /// Its name (`all_reduce`, `sleep`, `fill`, `copy_to_host`, ...).
    pub name: String,
    /// When it started (virtual time).
    pub start: Duration,
    /// When it finished (virtual time).
    pub end: Duration,
}

/// The streams of one device.
#[derive(Debug)]
pub(crate) struct DeviceState {
    pub(crate) default_stream: usize,
    pub(crate) normal_pool: Vec<usize>,
    pub(crate) high_pool: Vec<usize>,
    pub(crate) next_normal: usize,
    pub(crate) next_high: usize,
    pub(crate) log: VecDeque<KernelRecord>,
}

impl DeviceState {
    pub(crate) fn new(default_stream: usize) -> Self {
        Self {
            default_stream,
            normal_pool: Vec::new(),
            high_pool: Vec::new(),
            next_normal: 0,
            next_high: 0,
            log: VecDeque::new(),
        }
    }
}

/// A data effect applied when an operation resolves.
#[derive(Debug, Clone)]
pub(crate) enum Effect {
    None,
    Fill { block: u64, dtype: DType, value: f64 },
    FromHost { block: u64, bytes: Vec<u8> },
    ToHost { block: u64 },
}

/// What an operation does.
#[derive(Debug)]
pub(crate) enum OpKind {
    /// A kernel of a known duration.
    Kernel { kind: KernelKind, duration: Time, effect: Effect },
    /// A `wait_event`: nothing, once its dependency has finished.
    Wait,
    /// This rank's part of a collective or point-to-point operation.
    Comm { group: usize, slot: SlotKey, abort_at: Option<Time> },
}

/// One operation on a stream.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) name: String,
    pub(crate) enqueue: Time,
    /// The operation on another stream it waits for (a `Wait`).
    pub(crate) dep: Option<OpRef>,
    /// When it could start as far as its own stream and dependency go.
    pub(crate) ready_at: Option<Time>,
    pub(crate) finish: Option<Time>,
    /// How many events, waits and parked threads refer to it (it is kept while pinned).
    pub(crate) pins: u32,
}

/// One stream.
#[derive(Debug)]
pub(crate) struct StreamState {
    pub(crate) device: usize,
    pub(crate) id: u64,
    pub(crate) high_priority: bool,
    pub(crate) clock: VClock,
    pub(crate) ops: BTreeMap<u64, Op>,
    pub(crate) next_seq: u64,
    pub(crate) first_unresolved: u64,
    pub(crate) last_finish: Time,
    /// The finish times (once known) of the operations from `inflight_base` on: those not yet known to be done
    /// at the global time. Bounded by the launch-queue depth, it keeps finish times of pruned operations exact.
    pub(crate) inflight: VecDeque<Option<Time>>,
    pub(crate) inflight_base: u64,
}

// ===== Events =====

/// What an event's last record captured.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    /// The operation it marks (none: the stream was empty, so the event is complete).
    pub(crate) op: Option<OpRef>,
    /// The recording thread's local time at the record: the event cannot pass before it (the stream reaches it
    /// then at the earliest), which a timing event's time needs when `op` finished earlier.
    pub(crate) at: Time,
    /// The stream's vector clock at the record.
    pub(crate) clock: VClock,
    pub(crate) stream_id: u64,
    /// The device of that stream (whose failure record a synchronisation looks at).
    pub(crate) device: usize,
}

/// One event's state.
#[derive(Debug, Default)]
pub(crate) struct EventState {
    pub(crate) recorded: Option<Recorded>,
}

// ===== Memory =====

/// One block of simulated device memory.
#[derive(Debug)]
pub(crate) struct Block {
    /// The stream it was allocated for (the free list it returns to).
    pub(crate) stream: usize,
    pub(crate) data: Vec<u8>,
    pub(crate) history: History,
    /// Streams named by `record_stream` since the block was allocated.
    pub(crate) recorded: BTreeSet<usize>,
    /// For a freed block: the last operation of each recorded stream at the free, and that stream's clock.
    pub(crate) pending: Vec<(OpRef, VClock)>,
    /// What the thread that freed it knew (the allocator's lock orders a free before the next allocation).
    pub(crate) freed_by: VClock,
    /// What the threads that dropped the buffer's other handles knew when they dropped them: the last drop, which
    /// frees the block, is ordered after every earlier one (a reference count is a release-acquire edge).
    pub(crate) released: VClock,
}

/// Every block, in use or cached.
#[derive(Debug, Default)]
pub(crate) struct Allocator {
    pub(crate) blocks: HashMap<u64, Block>,
    /// Free blocks by (stream, size in bytes), oldest first (the likeliest to be reusable).
    pub(crate) free: HashMap<(usize, usize), Vec<u64>>,
    pub(crate) next_block: u64,
    /// The last buffer number handed out on each device (numbers are per device, so they are deterministic).
    pub(crate) next_buffer: HashMap<usize, u64>,
}

// ===== Communicators =====

/// Where a part belongs: the k-th collective, or the n-th message from `src` to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum SlotKey {
    Coll(u64),
    P2p { src: usize, dst: usize, n: u64 },
}

/// What a part asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum CollKind {
    AllReduce(ReduceOp),
    Broadcast {
        root: usize,
    },
    AllGather,
    ReduceScatter(ReduceOp),
    Send {
        peer: usize,
    },
    Recv {
        peer: usize,
    },
    /// Reduce into the root's output.
    Reduce {
        root: usize,
        op: ReduceOp,
    },
    /// The root's output views receive every rank's input view.
    Gather {
        root: usize,
    },
    /// Every rank's output view receives the root's input view of its rank.
    Scatter {
        root: usize,
    },
    /// Rank `j`'s output view `i` receives rank `i`'s input view `j` (both all-to-all forms).
    AllToAll,
    /// Every rank's output view `i` receives rank `i`'s input view (sizes may differ by rank).
    AllGatherV,
    /// Rank `j`'s output view receives the reduction of every rank's input view `j`.
    ReduceScatterV(ReduceOp),
}

impl CollKind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CollKind::AllReduce(_) => "all_reduce",
            CollKind::Broadcast { .. } => "broadcast",
            CollKind::AllGather => "all_gather",
            CollKind::ReduceScatter(_) => "reduce_scatter",
            CollKind::Send { .. } => "send",
            CollKind::Recv { .. } => "recv",
            CollKind::Reduce { .. } => "reduce",
            CollKind::Gather { .. } => "gather",
            CollKind::Scatter { .. } => "scatter",
            CollKind::AllToAll => "all_to_all",
            CollKind::AllGatherV => "all_gather_v",
            CollKind::ReduceScatterV(_) => "reduce_scatter_v",
        }
    }
}

/// One rank's part of an operation.
#[derive(Debug, Clone)]
pub(crate) struct Part {
    pub(crate) op: OpRef,
    pub(crate) kind: CollKind,
    pub(crate) dtype: DType,
    pub(crate) numel_in: usize,
    pub(crate) numel_out: usize,
    pub(crate) input: u64,
    pub(crate) output: u64,
    pub(crate) enqueue: Time,
    /// The input and output views of an op over lists or chunks of buffers (`None`: `input` and `output`).
    pub(crate) views: Option<std::sync::Arc<Views>>,
    /// This rank's `PREMUL_SUM` factor; `None` for every other op.
    pub(crate) scale: Option<Scale>,
}

/// A `PREMUL_SUM` factor: from the host, or read from a one-element device block when the op runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scale {
    Host(f64),
    Device(u64),
}

/// A run of elements in a memory block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) block: u64,
    /// The first element.
    pub(crate) offset: usize,
    pub(crate) numel: usize,
}

/// The input and output views of one rank's part, in rank order where the op has one per rank.
#[derive(Debug, Clone, Default)]
pub(crate) struct Views {
    pub(crate) inputs: Vec<View>,
    pub(crate) outputs: Vec<View>,
}

impl Views {
    fn numels(list: &[View]) -> String {
        list.iter().map(|v| v.numel.to_string()).collect::<Vec<_>>().join(", ")
    }
}

impl Part {
    pub(crate) fn describe(&self) -> String {
        let extra = match self.kind {
            CollKind::AllReduce(op) | CollKind::ReduceScatter(op) => format!(", {}", op.torch_name()),
            CollKind::Broadcast { root } | CollKind::Gather { root } | CollKind::Scatter { root } => {
                format!(", root {root}")
            }
            CollKind::Reduce { root, op } => format!(", root {root}, {}", op.torch_name()),
            CollKind::ReduceScatterV(op) => format!(", {}", op.torch_name()),
            CollKind::Send { peer } | CollKind::Recv { peer } => format!(", peer {peer}"),
            CollKind::AllGather | CollKind::AllToAll | CollKind::AllGatherV => String::new(),
        };
        if let Some(views) = &self.views {
            return format!(
                "{}({}, inputs [{}] -> outputs [{}] elements{extra})",
                self.kind.name(),
                self.dtype,
                Views::numels(&views.inputs),
                Views::numels(&views.outputs)
            );
        }
        format!("{}({}, {} -> {} elements{extra})", self.kind.name(), self.dtype, self.numel_in, self.numel_out)
    }
}

/// One matched operation, filling up with parts.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) parts: BTreeMap<usize, Part>,
    /// Why it never completes (an injected fault, a mismatch), if it does not.
    pub(crate) stuck: Option<String>,
}

/// One rank's view of a communicator.
#[derive(Debug, Default)]
pub(crate) struct RankComm {
    pub(crate) device: Option<usize>,
    pub(crate) joined: Option<Time>,
    pub(crate) next_coll: u64,
    pub(crate) sent: HashMap<usize, u64>,
    pub(crate) received: HashMap<usize, u64>,
    pub(crate) completed: u64,
    /// The last operation this rank enqueued on each stream (what `finalize` waits for).
    pub(crate) last_ops: HashMap<usize, u64>,
    /// How many splits this rank has made of the communicator.
    pub(crate) splits: u64,
    pub(crate) aborted: Option<String>,
    /// Why the rank revoked its communicator (or shrank it with abort): its ops stopped, later ops and a finalize
    /// are refused, a shrink or a split may follow.
    pub(crate) revoked: Option<String>,
    /// How many shrinks this rank has made of the communicator, by excluded list (ranks that were excluded from a
    /// shrink did not take part in it, so shrinks are matched by their list and their number among those).
    pub(crate) shrinks: HashMap<Vec<usize>, u64>,
    /// How many grows this rank has made of the communicator (every rank takes part in each).
    pub(crate) grows: u64,
    /// Whether the rank finalized its communicator: nothing may be issued on it afterwards.
    pub(crate) finalized: bool,
    /// An injected abort and the time it happens ([`Fault::AbortDuringOp`]).
    pub(crate) scheduled_abort: Option<(Time, String)>,
    /// The asynchronous error and the time from which it is visible.
    pub(crate) error: Option<(Time, String)>,
}

/// The ranks that joined one unique id.
#[derive(Debug)]
pub(crate) struct CommGroup {
    /// The communicator's number in messages: the counter of the mock unique id it was made from (so it does
    /// not depend on which rank joined first), or its creation order for a foreign id.
    pub(crate) number: u64,
    pub(crate) size: usize,
    pub(crate) description: String,
    pub(crate) ready_time: Option<Time>,
    pub(crate) ranks: Vec<RankComm>,
    pub(crate) slots: BTreeMap<SlotKey, Slot>,
}

/// Every communicator of a world.
#[derive(Debug, Default)]
pub(crate) struct Comms {
    pub(crate) groups: Vec<CommGroup>,
    pub(crate) by_id: HashMap<Vec<u8>, usize>,
    pub(crate) next_unique: u64,
    /// Rank-local communicators created (what NCCL's logs count).
    pub(crate) created: usize,
    /// Splits by (parent group, split number): what each rank asked for and the children made.
    pub(crate) splits: HashMap<(usize, u64), SplitRound>,
    /// Shrinks by (parent group, excluded ranks, number among the shrinks with that list): who called, and the
    /// child made.
    pub(crate) shrinks: HashMap<crate::clock::ShrinkKey, ShrinkRound>,
    /// Grows by (group, number among its grows): who called, and the grown communicator.
    pub(crate) grows: HashMap<crate::clock::GrowKey, GrowRound>,
    /// The ids `grow_unique_id` made, by the grow they name, until that grow has made its communicator.
    pub(crate) grow_ids: HashMap<Vec<u8>, crate::clock::GrowKey>,
}

/// One grow of a communicator: the ranks that called, the new ranks that joined, and once all have, the grown
/// communicator.
#[derive(Debug, Default)]
pub(crate) struct GrowRound {
    /// The grown size, as the first caller asked.
    pub(crate) size: Option<usize>,
    /// The ranks of the communicator that called.
    pub(crate) asked: BTreeSet<usize>,
    /// The new ranks that joined, with their devices.
    pub(crate) joined: BTreeMap<usize, usize>,
    /// The latest local time of a caller so far.
    pub(crate) latest: Time,
    /// The grown communicator's group, once made.
    pub(crate) child: Option<usize>,
    /// When it is ready.
    pub(crate) done: Option<Time>,
}

/// One shrink of a communicator: the callers, and once every rank not excluded has called, the child.
#[derive(Debug, Default)]
pub(crate) struct ShrinkRound {
    /// The parent ranks that called.
    pub(crate) asked: std::collections::BTreeSet<usize>,
    /// The latest local time of a caller so far.
    pub(crate) latest: Time,
    /// By parent rank: (child group, rank in it, its size).
    pub(crate) children: HashMap<usize, (usize, usize, usize)>,
    /// When the child is ready.
    pub(crate) done: Option<Time>,
}

/// One split of a communicator: every rank's color and key, and once all have called, the children.
#[derive(Debug, Default)]
pub(crate) struct SplitRound {
    /// By parent rank: (color, key, device).
    pub(crate) asked: BTreeMap<usize, (Option<u32>, usize, usize)>,
    /// The latest local time of a caller so far.
    pub(crate) latest: Time,
    /// By parent rank: (child group, rank in it, its size), for the ranks that got a color.
    pub(crate) children: HashMap<usize, (usize, usize, usize)>,
    /// When every child is ready (set once the last rank called).
    pub(crate) done: Option<Time>,
}

impl Comms {
    /// A fresh, deterministic 128-byte unique id.
    pub(crate) fn new_unique_id(&mut self) -> Vec<u8> {
        self.next_unique += 1;
        let mut id = vec![0u8; 128];
        id[..8].copy_from_slice(b"pg-mock\0");
        id[8..16].copy_from_slice(&self.next_unique.to_le_bytes());
        id
    }
}

// ===== The store =====

/// A value with the time it was set.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) value: Vec<u8>,
    pub(crate) time: Time,
}

/// The store's contents, inside the world's state.
#[derive(Debug, Default)]
pub(crate) struct StoreState {
    pub(crate) values: HashMap<String, Entry>,
    pub(crate) queues: HashMap<String, VecDeque<Entry>>,
    /// Liveness holds ([`pg_store::liveness`]): the process (its top thread's order) and the live key it set.
    pub(crate) holds: Vec<(u32, String)>,
    /// Deaths not yet visible: the live key of a killed process's hold and when its death is published.
    pub(crate) deaths: Vec<(Time, String)>,
}

impl StoreState {
    /// When every key is set (the latest set time), if they all are.
    pub(crate) fn keys_time(&self, keys: &[String]) -> Option<Time> {
        keys.iter().try_fold(0, |acc, k| self.values.get(k).map(|e| acc.max(e.time)))
    }

    /// When the queue's front element was pushed, if there is one.
    pub(crate) fn queue_time(&self, key: &str) -> Option<Time> {
        self.queues.get(key).and_then(|q| q.front()).map(|e| e.time)
    }
}
