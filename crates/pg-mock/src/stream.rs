//! Simulated streams and events: FIFO queues of operations resolved lazily in virtual time, and the `MockStream`
//! and `MockEvent` handles (an event marks a point of a stream; a stream waits for an event), and `MockGraph`, what
//! a stream capture recorded (see `capture.rs`), replayed through these same handles.
//!
//! An operation starts at the latest of its enqueue time (the caller's local time), the finish of the previous
//! operation on its stream and the finish of the operation it waits for (`wait_event`); a collective starts when
//! every rank's part can start. An operation is resolved (its finish known) as soon as its dependencies are;
//! its data effect is applied then, so effects run in dependency order. Resolved operations nobody refers to
//! any more are pruned at once, so a long run keeps memory flat.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use pg_core::{CaptureMode, Error, Result};

use crate::capture::{Ended, Kept, Step};
use crate::clock::{dur, Cond, OpRef, Time};
use crate::hazard::VClock;
use crate::sched::Inner;
use crate::state::{Effect, KernelRecord, Op, OpKind, Recorded, State, StreamState};
use crate::trace::KernelKind;
use crate::Mock;

impl State {
    /// Adds a stream; returns its global index (also its actor index in vector clocks).
    pub(crate) fn add_stream(&mut self, device: usize, id: u64, high_priority: bool) -> usize {
        self.streams.push(StreamState {
            device,
            id,
            high_priority,
            clock: VClock::default(),
            ops: BTreeMap::new(),
            next_seq: 0,
            first_unresolved: 0,
            last_finish: 0,
            inflight: VecDeque::new(),
            inflight_base: 0,
        });
        self.streams.len() - 1
    }

    /// The last operation enqueued on `stream`, if any.
    pub(crate) fn last_op(&self, stream: usize) -> Option<OpRef> {
        let s = &self.streams[stream];
        s.next_seq.checked_sub(1).map(|seq| OpRef { stream, seq })
    }

    /// When `op` finishes, once known (a pruned operation finished long ago).
    pub(crate) fn op_finish(&self, op: OpRef) -> Option<Time> {
        let s = &self.streams[op.stream];
        if let Some(o) = s.ops.get(&op.seq) {
            return o.finish;
        }
        if op.seq < s.inflight_base {
            return Some(0); // Done before the global time when it left the in-flight window.
        }
        let index = usize::try_from(op.seq - s.inflight_base).ok()?;
        s.inflight.get(index).copied().flatten()
    }

    /// Drops the operations known to be done at the global time from the front of `stream`'s in-flight window;
    /// returns how many operations stay in flight.
    pub(crate) fn trim_inflight(&mut self, stream: usize) -> usize {
        let now = self.now;
        let s = &mut self.streams[stream];
        while s.inflight.front().is_some_and(|f| f.is_some_and(|t| t <= now)) {
            s.inflight.pop_front();
            s.inflight_base += 1;
        }
        s.inflight.len()
    }

    /// Whether `op` has finished at the global time (queries answer at global time, so they are deterministic).
    pub(crate) fn op_done_now(&self, op: OpRef) -> bool {
        self.op_finish(op).is_some_and(|t| t <= self.now)
    }

    /// Whether `op` (none: nothing to wait for) has finished at the global time; if so, thread `tid` has seen it
    /// finish and learns `clock`, what its stream knew then (a query that returns true orders the host after it).
    pub(crate) fn observe_done(&mut self, tid: Option<usize>, op: Option<OpRef>, clock: &VClock) -> bool {
        let done = op.is_none_or(|op| self.op_done_now(op));
        if done {
            self.join_thread_clock(tid, clock);
        }
        done
    }

    pub(crate) fn pin(&mut self, op: OpRef) {
        if let Some(o) = self.streams[op.stream].ops.get_mut(&op.seq) {
            o.pins += 1;
        }
    }

    pub(crate) fn unpin(&mut self, op: OpRef) {
        if let Some(o) = self.streams[op.stream].ops.get_mut(&op.seq) {
            o.pins = o.pins.saturating_sub(1);
        }
        self.maybe_prune(op);
    }

    /// Drops `op` if it is resolved, not the last on its stream and nobody refers to it.
    fn maybe_prune(&mut self, op: OpRef) {
        let s = &mut self.streams[op.stream];
        if op.seq + 1 >= s.next_seq {
            return;
        }
        if s.ops.get(&op.seq).is_some_and(|o| o.finish.is_some() && o.pins == 0) {
            s.ops.remove(&op.seq);
        }
    }

    /// Enqueues an operation on `stream` at the caller's local time.
    pub(crate) fn enqueue(
        &mut self,
        tid: Option<usize>,
        stream: usize,
        kind: OpKind,
        name: impl Into<String>,
        dep: Option<OpRef>,
    ) -> OpRef {
        let enqueue = self.local(tid);
        self.trim_inflight(stream);
        let s = &mut self.streams[stream];
        let seq = s.next_seq;
        s.next_seq += 1;
        s.inflight.push_back(None);
        s.ops.insert(seq, Op { kind, name: name.into(), enqueue, dep, ready_at: None, finish: None, pins: 0 });
        if let Some(d) = dep {
            self.pin(d);
        }
        if let Some(prev) = seq.checked_sub(1) {
            self.maybe_prune(OpRef { stream, seq: prev });
        }
        self.active.insert(stream);
        OpRef { stream, seq }
    }

    /// Resolves every operation whose dependencies are resolved, to a fixpoint.
    pub(crate) fn resolve(&mut self) {
        loop {
            let active: Vec<usize> = self.active.iter().copied().collect();
            let mut progressed = false;
            for stream in active {
                progressed |= self.step_stream(stream);
            }
            if !progressed {
                return;
            }
        }
    }

    fn step_stream(&mut self, stream: usize) -> bool {
        let mut progressed = false;
        loop {
            let s = &self.streams[stream];
            let seq = s.first_unresolved;
            if seq >= s.next_seq {
                self.active.remove(&stream);
                return progressed;
            }
            let r = OpRef { stream, seq };
            let last_finish = s.last_finish;
            let op = s.ops.get(&seq).expect("unresolved operations are never pruned");
            let ready = match op.ready_at {
                Some(t) => t,
                None => {
                    let dep_time = match op.dep {
                        None => 0,
                        Some(d) => match self.op_finish(d) {
                            Some(t) => t,
                            None => return progressed,
                        },
                    };
                    let ready = op.enqueue.max(last_finish).max(dep_time);
                    let dep = op.dep;
                    self.streams[stream].ops.get_mut(&seq).expect("present").ready_at = Some(ready);
                    if let Some(d) = dep {
                        self.trace_wait(r, d, ready);
                        self.unpin(d);
                    }
                    progressed = true;
                    ready
                }
            };
            let op = &self.streams[stream].ops[&seq];
            match &op.kind {
                OpKind::Wait => self.complete_op(r, ready, ready),
                OpKind::Kernel { duration, .. } => {
                    let duration = *duration;
                    self.apply_effect(r);
                    self.complete_op(r, ready, ready + duration);
                }
                OpKind::Comm { abort_at: Some(t), .. } => {
                    let finish = ready.max(*t);
                    self.complete_op(r, finish, finish);
                }
                OpKind::Comm { group, slot, .. } => {
                    let (group, slot) = (*group, *slot);
                    if !self.try_fire(group, slot) {
                        return progressed;
                    }
                }
            }
            progressed = true;
        }
    }

    /// Marks the head operation `op` of its stream finished.
    pub(crate) fn complete_op(&mut self, op: OpRef, start: Time, finish: Time) {
        let capacity = self.kernel_log_capacity;
        let s = &mut self.streams[op.stream];
        debug_assert_eq!(s.first_unresolved, op.seq, "operations resolve in stream order");
        s.first_unresolved = op.seq + 1;
        let previous_finish = std::mem::replace(&mut s.last_finish, finish);
        if let Some(slot) = op.seq.checked_sub(s.inflight_base).and_then(|i| usize::try_from(i).ok()) {
            if let Some(entry) = s.inflight.get_mut(slot) {
                *entry = Some(finish);
            }
        }
        let (device, stream_id) = (s.device, s.id);
        self.trace_span(op, (start, finish), previous_finish);
        let s = &mut self.streams[op.stream];
        let o = s.ops.get_mut(&op.seq).expect("present");
        o.ready_at.get_or_insert(start);
        o.finish = Some(finish);
        let kind = match &o.kind {
            OpKind::Wait => None,
            OpKind::Kernel { kind, .. } => Some(*kind),
            OpKind::Comm { .. } => Some(KernelKind::Comm),
        };
        if let Some(kind) = kind.filter(|_| capacity > 0) {
            let record = KernelRecord { stream_id, kind, name: o.name.clone(), start: dur(start), end: dur(finish) };
            let log = &mut self.devices[device].log;
            if log.len() >= capacity {
                log.pop_front();
            }
            log.push_back(record);
        }
        self.maybe_prune(op);
    }

    fn apply_effect(&mut self, op: OpRef) {
        let o = self.streams[op.stream].ops.get_mut(&op.seq).expect("present");
        let OpKind::Kernel { effect, .. } = &mut o.kind else { return };
        match std::mem::replace(effect, Effect::None) {
            Effect::None => {}
            Effect::Fill { block, dtype, value } => {
                if let Some(b) = self.alloc.blocks.get_mut(&block) {
                    crate::conv::fill(dtype, value, &mut b.data);
                }
            }
            Effect::FromHost { block, bytes } => {
                if let Some(b) = self.alloc.blocks.get_mut(&block) {
                    let n = b.data.len().min(bytes.len());
                    b.data[..n].copy_from_slice(&bytes[..n]);
                }
            }
            Effect::ToHost { block } => {
                if !self.abandoned_to_host.remove(&op) {
                    let bytes = self.alloc.blocks.get(&block).map(|b| b.data.clone()).unwrap_or_default();
                    self.to_host.insert(op, bytes);
                }
            }
        }
    }

    /// Why an unfinished operation cannot finish yet, for deadlock reports.
    pub(crate) fn blocked_reason(&self, op: OpRef) -> Option<String> {
        if self.op_finish(op).is_some() {
            return None;
        }
        let s = &self.streams[op.stream];
        let head = OpRef { stream: op.stream, seq: s.first_unresolved };
        let o = s.ops.get(&head.seq)?;
        let at = format!("stream {} of device {} is at '{}' (op {})", s.id, s.device, o.name, head.seq);
        Some(match &o.kind {
            OpKind::Comm { group, slot, .. } => format!("{at}, {}", self.slot_status(*group, *slot)),
            OpKind::Wait => match o.dep {
                Some(d) if d.stream != op.stream => {
                    let inner = self.blocked_reason(d).unwrap_or_default();
                    format!("{at}, waiting for an event on stream {}: {inner}", self.streams[d.stream].id)
                }
                _ => at,
            },
            OpKind::Kernel { .. } => at,
        })
    }

    /// The description of the condition "all work on `stream` so far is done", for reports.
    pub(crate) fn describe_stream(&self, stream: usize) -> String {
        let s = &self.streams[stream];
        format!("stream {} of device {}", s.id, s.device)
    }
}

/// A simulated stream. Cloning gives another handle to the same stream.
#[derive(Clone)]
pub struct MockStream {
    pub(crate) inner: Arc<Inner>,
    /// The global stream index (also its actor index in vector clocks).
    pub(crate) index: usize,
    pub(crate) device: usize,
    pub(crate) id: u64,
    pub(crate) high_priority: bool,
}

impl fmt::Debug for MockStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockStream")
            .field("device", &self.device)
            .field("id", &self.id)
            .field("high_priority", &self.high_priority)
            .finish()
    }
}

impl PartialEq for MockStream {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner) && self.index == other.index
    }
}

impl MockStream {
    pub(crate) fn from_index(inner: &Arc<Inner>, state: &State, index: usize) -> Self {
        let s = &state.streams[index];
        Self { inner: Arc::clone(inner), index, device: s.device, id: s.id, high_priority: s.high_priority }
    }

    /// A handle of the stream with global index `index`.
    pub(crate) fn at(inner: &Arc<Inner>, index: usize) -> Self {
        let state = inner.lock();
        Self::from_index(inner, &state, index)
    }

    /// How messages name it.
    pub(crate) fn label(&self) -> String {
        format!("stream {} of device {}", self.id, self.device)
    }

    /// The ordinal of the device this stream belongs to.
    pub fn device_index(&self) -> usize {
        self.device
    }

    /// Checks that `self` belongs to `inner`'s world and to device `device`.
    pub(crate) fn check(&self, inner: &Arc<Inner>, device: usize, what: &str) -> Result<()> {
        if !Arc::ptr_eq(&self.inner, inner) {
            return Err(Error::invalid(format!("{what}: the stream belongs to another simulated world")));
        }
        if self.device != device {
            return Err(Error::invalid(format!(
                "{what}: stream {} belongs to device {}, not device {device}",
                self.id, self.device
            )));
        }
        Ok(())
    }
}

impl pg_core::Stream for MockStream {
    type B = Mock;

    fn id(&self) -> u64 {
        self.id
    }

    fn is_high_priority(&self) -> bool {
        self.high_priority
    }

    fn wait_event(&self, event: &MockEvent) -> Result<()> {
        let tid = self.inner.require("Stream::wait_event");
        if !Arc::ptr_eq(&self.inner, &event.inner) {
            return Err(Error::invalid("Stream::wait_event: the event belongs to another simulated world"));
        }
        let cost = self.inner.config.host.stream_wait;
        if self.inner.captures().wait_event(self.index, self.device, event.id, &self.label())? {
            self.inner.with(|st| st.charge(Some(tid), cost));
            return Ok(());
        }
        self.inner.with(|st| {
            st.charge(Some(tid), cost);
            let Some(recorded) = st.events.get(&event.id).and_then(|e| e.recorded.clone()) else { return };
            st.streams[self.index].clock.join(&recorded.clock);
            if let Some(op) = recorded.op {
                st.enqueue(Some(tid), self.index, OpKind::Wait, "wait_event", Some(op));
                st.resolve();
            }
        });
        self.inner.throttle(tid, self.index);
        Ok(())
    }

    fn query(&self) -> Result<bool> {
        let tid = self.inner.current();
        self.inner
            .captures()
            .refuse_on_stream(self.index, || format!("Stream::query of capturing {}", self.label()))?;
        let cost = self.inner.config.host.query;
        self.inner.with(|st| {
            st.charge(tid, cost);
            st.resolve();
            let clock = st.streams[self.index].clock.clone();
            Ok(st.observe_done(tid, st.last_op(self.index), &clock))
        })
    }

    fn synchronize(&self) -> Result<()> {
        let tid = self.inner.require("Stream::synchronize");
        self.inner
            .captures()
            .refuse_on_stream(self.index, || format!("Stream::synchronize of capturing {}", self.label()))?;
        let poison = &self.inner.poison[self.device];
        poison.check()?;
        let state = self.inner.lock();
        let state = sync_streams(&self.inner, state, tid, &[self.index], poison);
        self.inner.raise(state);
        poison.check()
    }

    /// Runs `callback` on a registered helper thread of the world once the stream's last operation at the call
    /// has finished in virtual time (at once when the stream is idle). Unlike CUDA, later work on the stream
    /// does not wait for the callback. Callable from any thread, registered or not (an async executor's).
    fn launch_host_fn(&self, callback: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::HostCallbacks, "launch_host_fn")?;
        if self.inner.captures().is_capturing(self.index) {
            return Err(Error::capture(format!("launch_host_fn on capturing {}", self.label())));
        }
        let op = self.inner.with(|st| {
            st.resolve();
            let op = st.last_op(self.index);
            if let Some(op) = op {
                st.pin(op);
            }
            op
        });
        let inner = Arc::clone(&self.inner);
        let what = format!("running a host callback after stream {} of device {}", self.id, self.device);
        let body = move || {
            if let Some(op) = op {
                let tid = inner.require("Stream::launch_host_fn");
                let state = inner.lock();
                let (mut state, _) = inner.park(state, tid, Cond::OpsDone(vec![op]), None, None, what);
                state.unpin(op);
                inner.release(state);
            }
            callback();
        };
        match self.inner.spawn("pg-mock host callback", true, body) {
            Ok(_detached) => Ok(()),
            Err(e) => {
                if let Some(op) = op {
                    self.inner.lock().unpin(op);
                }
                Err(Error::Backend(format!("cannot start the host callback thread: {e}")))
            }
        }
    }

    fn is_capturing(&self) -> Result<bool> {
        Ok(self.inner.captures().is_capturing(self.index))
    }

    /// Starts recording: later work on this stream, and on streams that join through an event recorded here, is
    /// recorded instead of run. The mode is kept for the record: the simulated backend refuses the forbidden
    /// calls on the capturing streams and their events (and `Device::synchronize` of their device) from any
    /// thread, whatever the mode.
    fn begin_capture(&self, _mode: CaptureMode) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::Capture, "begin_capture")?;
        self.inner.captures().begin(self.index, self.device, &self.label())
    }

    fn end_capture(&self) -> Result<MockGraph> {
        self.inner.require_capability(pg_core::Capability::Capture, "end_capture")?;
        let ended = self.inner.captures().end(self.index, &self.label())?;
        MockGraph::new(&self.inner, ended)
    }

    fn capture_keep_alive(&self, buffer: &crate::MockBuffer) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::Capture, "capture_keep_alive")?;
        if !Arc::ptr_eq(&self.inner, buffer.inner()) {
            return Err(Error::invalid("capture_keep_alive: the buffer belongs to another simulated world"));
        }
        let kept = Kept { block: buffer.block(), _alive: Box::new(buffer.clone()) };
        self.inner.captures().keep(self.index, kept, &self.label())
    }

    /// Nothing to hold: a simulated communicator's state lives in the world, and a replayed op on it is issued
    /// again, so a launch after the communicator was aborted or finalized fails as an eager op would. Refused,
    /// as on CUDA, when the stream is not capturing.
    fn capture_keep_communicator(&self, _comm: &Arc<<crate::Mock as pg_core::Backend>::Communicator>) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::Capture, "capture_keep_communicator")?;
        match self.inner.captures().is_capturing(self.index) {
            true => Ok(()),
            false => Err(Error::invalid(format!("capture_keep_communicator: {} is not capturing", self.label()))),
        }
    }
}

/// What a capture on a simulated stream recorded: launching it re-issues every recorded operation, event record
/// and wait, in the order they were captured, on the launch stream (the origin's steps) and on streams of the
/// graph's own (one per stream that joined the capture), so the recorded dependencies hold again; the data
/// effects are real and the hazard detector sees every replayed access.
///
/// A recorded operation holds its buffers weakly, as a CUDA graph holds raw pointers: a launch after the last
/// handle of one went (and [`pg_core::Stream::capture_keep_alive`] did not keep it) fails with an error naming
/// the buffer instead of writing freed memory.
pub struct MockGraph {
    inner: Arc<Inner>,
    device: usize,
    steps: Vec<(usize, Step)>,
    nodes: usize,
    /// The streams of the joined slots (slot `k` runs on `side[k - 1]`).
    side: Vec<usize>,
    events: Vec<MockEvent>,
    kept: Vec<Kept>,
    /// Streams it was launched on; held under the lock while a launch issues.
    launched: std::sync::Mutex<Vec<usize>>,
}

impl fmt::Debug for MockGraph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockGraph").field("device", &self.device).field("nodes", &self.nodes).finish()
    }
}

impl MockGraph {
    fn new(inner: &Arc<Inner>, ended: Ended) -> Result<Self> {
        let side = {
            let mut st = inner.lock();
            (1..ended.slots)
                .map(|_| {
                    let id = u64::try_from(st.streams.len()).unwrap_or(u64::MAX) | (1 << 32);
                    st.add_stream(ended.device, id, false)
                })
                .collect()
        };
        let events = (0..ended.events).map(|_| MockEvent::new(Arc::clone(inner))).collect();
        Ok(Self {
            inner: Arc::clone(inner),
            device: ended.device,
            steps: ended.steps,
            nodes: ended.nodes,
            side,
            events,
            kept: ended.kept,
            launched: std::sync::Mutex::new(Vec::new()),
        })
    }
}

impl pg_core::Graph for MockGraph {
    type B = Mock;

    fn launch(&self, stream: &MockStream) -> Result<()> {
        stream.check(&self.inner, self.device, "Graph::launch")?;
        let mut launched = self.launched.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !launched.contains(&stream.index) {
            launched.push(stream.index);
        }
        let on = |slot: usize| if slot == 0 { stream.index } else { self.side[slot - 1] };
        for (slot, step) in &self.steps {
            let index = on(*slot);
            match step {
                Step::Op { run, .. } => run(index)?,
                Step::Record(e) => pg_core::Event::record(&self.events[*e], &MockStream::at(&self.inner, index))?,
                Step::Wait(e) => pg_core::Stream::wait_event(&MockStream::at(&self.inner, index), &self.events[*e])?,
            }
        }
        Ok(())
    }

    fn node_count(&self) -> usize {
        self.nodes
    }
}

impl Drop for MockGraph {
    /// The kept buffers go back to the allocator only after the streams the graph ran on are done with them.
    fn drop(&mut self) {
        let launched = std::mem::take(self.launched.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner));
        {
            let mut st = self.inner.lock();
            for kept in &self.kept {
                if let Some(block) = st.alloc.blocks.get_mut(&kept.block) {
                    block.recorded.extend(launched.iter().copied().chain(self.side.iter().copied()));
                }
            }
        }
        drop(std::mem::take(&mut self.kept));
    }
}

/// Parks `tid` until every operation enqueued so far on `streams` has finished, then joins their clocks into it;
/// returns early, joining nothing, once the device's failure record `poison` is set.
pub(crate) fn sync_streams<'a>(
    inner: &'a Inner,
    mut state: std::sync::MutexGuard<'a, State>,
    tid: usize,
    streams: &[usize],
    poison: &pg_core::Poison,
) -> std::sync::MutexGuard<'a, State> {
    state.resolve();
    let ops: Vec<OpRef> = streams.iter().filter_map(|s| state.last_op(*s)).collect();
    let clocks: Vec<VClock> = streams.iter().map(|s| state.streams[*s].clock.clone()).collect();
    let what = match streams {
        [one] => format!("synchronizing {}", state.describe_stream(*one)),
        _ => format!("synchronizing device {}", streams.first().map_or(0, |s| state.streams[*s].device)),
    };
    for op in &ops {
        state.pin(*op);
    }
    let (mut state, woke) = inner.park(state, tid, Cond::OpsDone(ops.clone()), None, Some(poison.flag()), what);
    for op in &ops {
        state.unpin(*op);
    }
    if woke == crate::clock::Wake::Interrupted {
        return state;
    }
    for clock in &clocks {
        state.join_thread_clock(Some(tid), clock);
    }
    state
}

/// A simulated event; it exists in the world from its first record until the handle is dropped.
pub struct MockEvent {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: u64,
    /// Made by `create_timing_event`: only such events can be timed ([`pg_core::Event::nanos_since`]), as on
    /// CUDA, where an event created with timing disabled gives no elapsed time.
    pub(crate) timing: bool,
}

impl fmt::Debug for MockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockEvent").field("id", &self.id).finish()
    }
}

impl MockEvent {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        Self::made(inner, false)
    }

    /// A timing event ([`pg_core::Device::create_timing_event`]).
    pub(crate) fn timed(inner: Arc<Inner>) -> Self {
        Self::made(inner, true)
    }

    fn made(inner: Arc<Inner>, timing: bool) -> Self {
        let id = {
            let mut state = inner.lock();
            state.next_event += 1;
            state.next_event
        };
        Self { inner, id, timing }
    }
}

impl State {
    /// When event `id`'s recorded point passes, if known: the later of its record and the end of the operation
    /// it marks (a stream reaches an event once its earlier work is done and the event is on it); `Err` when it
    /// was never recorded.
    fn event_time(&self, id: u64) -> Result<Option<Time>> {
        let recorded = self.events.get(&id).and_then(|e| e.recorded.as_ref());
        let recorded = recorded.ok_or_else(|| Error::invalid("Event::nanos_since: an event was never recorded"))?;
        Ok(match recorded.op {
            None => Some(recorded.at),
            Some(op) => self.op_finish(op).map(|finish| finish.max(recorded.at)),
        })
    }
}

impl Drop for MockEvent {
    fn drop(&mut self) {
        let mut state = self.inner.lock();
        if let Some(op) = state.events.remove(&self.id).and_then(|e| e.recorded).and_then(|r| r.op) {
            state.unpin(op);
        }
    }
}

impl pg_core::Event for MockEvent {
    type B = Mock;

    fn record(&self, stream: &MockStream) -> Result<()> {
        let tid = self.inner.require("Event::record");
        if !Arc::ptr_eq(&self.inner, &stream.inner) {
            return Err(Error::invalid("Event::record: the stream belongs to another simulated world"));
        }
        let cost = self.inner.config.host.event_record;
        if self.inner.captures().record_event(stream.index, self.id) {
            self.inner.with(|st| st.charge(Some(tid), cost));
            return Ok(());
        }
        self.inner.with(|st| {
            st.charge(Some(tid), cost);
            let op = st.last_op(stream.index);
            if let Some(op) = op {
                st.pin(op);
            }
            let at = st.local(Some(tid));
            let s = &st.streams[stream.index];
            let recorded = Recorded { op, at, clock: s.clock.clone(), stream_id: s.id, device: s.device };
            let previous = st.events.entry(self.id).or_default().recorded.replace(recorded);
            if let Some(old) = previous.and_then(|r| r.op) {
                st.unpin(old);
            }
            Ok(())
        })
    }

    fn query(&self) -> Result<bool> {
        let tid = self.inner.current();
        self.inner.captures().refuse_on_event(self.id, || "Event::query of an event recorded in a capture".into())?;
        let cost = self.inner.config.host.query;
        self.inner.with(|st| {
            st.charge(tid, cost);
            st.resolve();
            let Some(recorded) = st.events.get(&self.id).and_then(|e| e.recorded.clone()) else { return Ok(true) };
            Ok(st.observe_done(tid, recorded.op, &recorded.clock))
        })
    }

    fn synchronize(&self) -> Result<()> {
        let tid = self.inner.require("Event::synchronize");
        self.inner
            .captures()
            .refuse_on_event(self.id, || "Event::synchronize of an event recorded in a capture".into())?;
        let mut state = self.inner.lock();
        let Some(recorded) = state.events.get(&self.id).and_then(|e| e.recorded.clone()) else { return Ok(()) };
        let poison = &self.inner.poison[recorded.device];
        if let Err(error) = poison.check() {
            drop(state);
            return Err(error);
        }
        if let Some(op) = recorded.op {
            // The event pins `op`; pin it again in case the event is re-recorded while this thread waits.
            state.pin(op);
            let what = format!("synchronizing an event on stream {}", recorded.stream_id);
            let (s, woke) = self.inner.park(state, tid, Cond::OpsDone(vec![op]), None, Some(poison.flag()), what);
            state = s;
            state.unpin(op);
            if woke == crate::clock::Wake::Interrupted {
                self.inner.raise(state);
                return poison.check();
            }
        }
        state.join_thread_clock(Some(tid), &recorded.clock);
        self.inner.raise(state);
        poison.check()
    }

    fn is_created(&self) -> bool {
        self.inner.lock().events.get(&self.id).is_some_and(|e| e.recorded.is_some())
    }

    /// Virtual device time between the two recorded points, answered at the global time (as queries are, so
    /// the answer is the same on every run): `None` until both have passed.
    fn nanos_since(&self, start: &MockEvent) -> Result<Option<i64>> {
        self.inner.require_capability(pg_core::Capability::TimingEvents, "nanos_since")?;
        if !self.timing || !start.timing {
            return Err(Error::invalid("Event::nanos_since: both events must be timing events"));
        }
        if !Arc::ptr_eq(&self.inner, &start.inner) {
            return Err(Error::invalid("Event::nanos_since: the events belong to different simulated worlds"));
        }
        for event in [start, self] {
            let refuse = || "Event::nanos_since of an event recorded in a capture".into();
            self.inner.captures().refuse_on_event(event.id, refuse)?;
        }
        let tid = self.inner.current();
        let cost = self.inner.config.host.query;
        self.inner.with(|st| {
            st.charge(tid, cost);
            st.resolve();
            let (from, to) = (st.event_time(start.id)?, st.event_time(self.id)?);
            Ok(match (from, to) {
                (Some(from), Some(to)) if from <= st.now && to <= st.now => Some(to as i64 - from as i64),
                _ => None,
            })
        })
    }
}
