//! Simulated events: a marker after the last operation of a stream, created at its first record (S13).

use std::fmt;
use std::sync::Arc;

use pg_core::{Error, Result};

use crate::backend::Mock;
use crate::clock::{Cond, OpRef};
use crate::hazard::VClock;
use crate::stream::MockStream;
use crate::world::Inner;

/// What an event's last record captured.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    /// The operation it marks (none: the stream was empty, so the event is complete).
    pub(crate) op: Option<OpRef>,
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

/// A simulated event; it exists in the world from its first record until the handle is dropped.
pub struct MockEvent {
    pub(crate) inner: Arc<Inner>,
    pub(crate) id: u64,
}

impl fmt::Debug for MockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockEvent").field("id", &self.id).finish()
    }
}

impl MockEvent {
    pub(crate) fn new(inner: Arc<Inner>) -> Self {
        let id = {
            let mut state = inner.lock();
            state.next_event += 1;
            state.next_event
        };
        Self { inner, id }
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
        self.inner.with(|st| {
            st.charge(Some(tid), cost);
            let op = st.last_op(stream.index);
            if let Some(op) = op {
                st.pin(op);
            }
            let s = &st.streams[stream.index];
            let recorded = Recorded { op, clock: s.clock.clone(), stream_id: s.id, device: s.device };
            let previous = st.events.entry(self.id).or_default().recorded.replace(recorded);
            if let Some(old) = previous.and_then(|r| r.op) {
                st.unpin(old);
            }
            Ok(())
        })
    }

    fn query(&self) -> Result<bool> {
        let tid = self.inner.current();
        let cost = self.inner.config.host.query;
        self.inner.with(|st| {
            st.charge(tid, cost);
            st.resolve();
            let Some(recorded) = st.events.get(&self.id).and_then(|e| e.recorded.clone()) else { return Ok(true) };
            let done = recorded.op.is_none_or(|op| st.op_done_now(op));
            if done {
                st.join_thread_clock(tid, &recorded.clock);
            }
            Ok(done)
        })
    }

    fn synchronize(&self) -> Result<()> {
        let tid = self.inner.require("Event::synchronize");
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
}
