//! Recording the timeline into the trace ring (see `trace.rs`) where the simulation decides what happens, and
//! reading it back as a [`Trace`] with what is unfinished at that moment.

use std::sync::Arc;

use crate::clock::{dur, OpRef, Time};
use crate::hazard::HazardKind;
use crate::state::{OpKind, SlotKey, State};
use crate::trace::{
    CommOp, CommSlot, EventWait, HazardMark, HostBlock, KernelKind, Record, SpanKind, StreamSpan, Trace, TraceStream,
    TraceThread,
};

/// What a stream operation was, for its span.
fn span_kind(kind: &OpKind) -> (SpanKind, Option<CommSlot>) {
    match kind {
        OpKind::Kernel { kind, .. } => (SpanKind::Kernel(*kind), None),
        OpKind::Wait => (SpanKind::Wait, None),
        OpKind::Comm { group, slot, .. } => {
            let (collective, message) = match *slot {
                SlotKey::Coll(k) => (Some(k), None),
                SlotKey::P2p { src, dst, n } => (None, Some((src, dst, n))),
            };
            (SpanKind::Kernel(KernelKind::Comm), Some(CommSlot { group: *group, collective, message }))
        }
    }
}

impl State {
    /// Records that `op` ran from `start` to `finish`; the operation before it on its stream ended at
    /// `previous_end`.
    pub(crate) fn trace_span(&mut self, op: OpRef, (start, finish): (Time, Time), previous_end: Time) {
        if !self.trace.on() {
            return;
        }
        let Some(o) = self.streams[op.stream].ops.get(&op.seq) else { return };
        let (kind, comm) = span_kind(&o.kind);
        // A wait spans from when the stream reached it to when it was over.
        let start = if kind == SpanKind::Wait { o.enqueue.max(previous_end).min(start) } else { start };
        let name = o.name.clone();
        self.trace.push(Record::Span { stream: op.stream, name, kind, enqueued: o.enqueue, start, end: finish, comm });
    }

    /// Records that the wait `op` is over at `ready`, for the operation `marked` an event recorded.
    pub(crate) fn trace_wait(&mut self, op: OpRef, marked: OpRef, ready: Time) {
        if !self.trace.on() {
            return;
        }
        let Some(m) = self.streams[marked.stream].ops.get(&marked.seq) else { return };
        let (Some(start), Some(end)) = (m.ready_at, m.finish) else { return };
        let s = &self.streams[op.stream];
        let reached = s.ops.get(&op.seq).map_or(ready, |o| o.enqueue.max(s.last_finish)).min(ready);
        self.trace.push(Record::Wait { from: marked.stream, marked: (start, end), stream: op.stream, reached, ready });
    }

    /// Records that thread `tid` was blocked from `start` to `end` (nothing for a wait that took no time).
    pub(crate) fn trace_blocked(&mut self, tid: usize, what: &str, start: Time, end: Time) {
        if self.trace.on() && end > start {
            let Some((name, device)) = self.trace.threads.get(&tid).cloned() else { return };
            self.trace.push(Record::Blocked { thread: tid, name, device, what: what.to_owned(), start, end });
        }
    }

    /// Records a hazard found by an access on stream `stream` launched at `at`: `access` and `earlier` name the
    /// two accesses.
    pub(crate) fn trace_hazard(
        &mut self,
        (stream, at): (usize, Time),
        kind: HazardKind,
        (access, earlier): (String, String),
        message: &str,
    ) {
        if self.trace.on() {
            self.trace.push(Record::Hazard { stream, at, kind, access, earlier, message: message.to_owned() });
        }
    }

    /// The trace: the ring's records, then what is unfinished now (the operation each stream is at, the threads
    /// still blocked).
    pub(crate) fn trace(&self) -> Trace {
        let stream = |index: usize| (self.streams[index].device, self.streams[index].id);
        let comm = |slot: CommSlot| {
            let g = &self.comms.groups[slot.group];
            CommOp {
                communicator: g.number,
                description: g.description.clone(),
                collective: slot.collective,
                message: slot.message,
            }
        };
        let mut trace = Trace {
            now: dur(self.now),
            devices: self.devices.len(),
            dropped: self.trace.dropped,
            streams: self
                .streams
                .iter()
                .map(|s| TraceStream { device: s.device, stream: s.id, high_priority: s.high_priority })
                .collect(),
            ..Trace::default()
        };
        let mut threads = self.trace.threads.clone();
        for record in &self.trace.records {
            match record {
                Record::Span { stream: index, name, kind, enqueued, start, end, comm: slot } => {
                    let (device, stream) = stream(*index);
                    trace.spans.push(StreamSpan {
                        device,
                        stream,
                        name: name.clone(),
                        kind: *kind,
                        enqueued: dur(*enqueued),
                        start: dur(*start),
                        end: Some(dur(*end)),
                        comm: slot.map(comm),
                    });
                }
                Record::Wait { from, marked, stream: index, reached, ready } => {
                    let (device, stream) = stream(*index);
                    trace.waits.push(EventWait {
                        device,
                        recorded_on: stream_of(self, *from),
                        marked: (dur(marked.0), dur(marked.1)),
                        stream,
                        reached: dur(*reached),
                        ready: dur(*ready),
                    });
                }
                Record::Blocked { thread, name, device, what, start, end } => {
                    threads.entry(*thread).or_insert_with(|| (Arc::clone(name), *device));
                    trace.blocked.push(HostBlock {
                        thread: *thread,
                        what: what.clone(),
                        start: dur(*start),
                        end: Some(dur(*end)),
                    });
                }
                Record::Hazard { stream: index, at, kind, access, earlier, message } => {
                    let (device, stream) = stream(*index);
                    trace.hazards.push(HazardMark {
                        device,
                        stream,
                        at: dur(*at),
                        kind: *kind,
                        access: access.clone(),
                        earlier: earlier.clone(),
                        message: message.clone(),
                    });
                }
            }
        }
        trace.spans.sort_by_key(|s| (s.start, s.device, s.stream));
        // Each stream's unfinished head: running, or waiting to start, with no end yet.
        for (index, s) in self.streams.iter().enumerate() {
            let Some(op) = s.ops.get(&s.first_unresolved) else { continue };
            let (kind, slot) = span_kind(&op.kind);
            let (device, stream) = stream(index);
            trace.spans.push(StreamSpan {
                device,
                stream,
                name: op.name.clone(),
                kind,
                enqueued: dur(op.enqueue),
                start: dur(op.ready_at.unwrap_or_else(|| op.enqueue.max(s.last_finish))),
                end: None,
                comm: slot.map(comm),
            });
        }
        trace.threads = threads
            .into_iter()
            .map(|(thread, (name, device))| TraceThread { thread, name: name.to_string(), device })
            .collect();
        for (tid, thread) in &self.threads {
            if let Some(park) = &thread.park {
                let what = park.what.clone();
                trace.blocked.push(HostBlock { thread: *tid, what, start: dur(park.since), end: None });
            }
        }
        trace
    }
}

/// The device and id of the stream with global index `index`.
fn stream_of(state: &State, index: usize) -> (usize, u64) {
    (state.streams[index].device, state.streams[index].id)
}
