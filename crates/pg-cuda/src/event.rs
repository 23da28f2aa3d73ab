//! Events: created lazily at their first record and recycled through a per-device pool (plain ones and, apart,
//! timing ones); timing events created at once; a stream's wait for an event.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::safe::CudaEvent;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaContext;

use crate::error::{CudaError, DriverContext, Result};
use crate::stream::Stream;

/// Driver event objects not in use, ready to be recorded again: those with timing disabled (every event of the
/// process group's semantics) and, apart, those with timing enabled (a traced group's, `Event::timed`).
pub(crate) struct EventPool {
    ctx: Arc<CudaContext>,
    free: Mutex<Vec<CudaEvent>>,
    free_timed: Mutex<Vec<CudaEvent>>,
}

impl fmt::Debug for EventPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventPool(cuda:{}, {} free)", self.ctx.ordinal(), self.free.lock().map(|v| v.len()).unwrap_or(0))
    }
}

impl EventPool {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Self {
        Self { ctx, free: Mutex::new(Vec::new()), free_timed: Mutex::new(Vec::new()) }
    }

    /// A free event object with timing disabled, or a new one.
    pub(crate) fn take(&self) -> Result<CudaEvent> {
        self.take_kind(false)
    }

    /// A free event object with timing enabled (`timed`) or disabled, or a new one.
    fn take_kind(&self, timed: bool) -> Result<CudaEvent> {
        let (list, flags) = match timed {
            true => (&self.free_timed, CUevent_flags::CU_EVENT_DEFAULT),
            false => (&self.free, CUevent_flags::CU_EVENT_DISABLE_TIMING),
        };
        if let Some(event) = list.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(event);
        }
        self.ctx.new_event(Some(flags)).during("cuEventCreate")
    }

    /// Returns an event object with timing disabled for reuse. Re-recording a recycled event is safe even while
    /// earlier waits on it are pending: a wait captures the record it saw.
    pub(crate) fn give_back(&self, event: CudaEvent) {
        self.give_back_kind(event, false);
    }

    fn give_back_kind(&self, event: CudaEvent, timed: bool) {
        let list = if timed { &self.free_timed } else { &self.free };
        list.lock().unwrap_or_else(|e| e.into_inner()).push(event);
    }
}

/// A marker in a stream. The driver object is made at the first [`Event::record`] (a never-recorded event
/// counts as completed, as in CUDA) and returned to the device's pool when the handle is dropped.
pub struct Event {
    pool: Arc<EventPool>,
    cuda: OnceLock<CudaEvent>,
    /// Whether its driver object has timing enabled ([`Event::nanos_since`]); plain events disable it, which
    /// makes their record cheaper.
    timed: bool,
}

impl Event {
    pub(crate) fn new(pool: Arc<EventPool>) -> Self {
        Self { pool, cuda: OnceLock::new(), timed: false }
    }

    /// An event whose driver object (made at its first record, from the pool's timing-enabled objects) can be
    /// timed against another such event ([`Event::nanos_since`]).
    pub(crate) fn timed(pool: Arc<EventPool>) -> Self {
        Self { pool, cuda: OnceLock::new(), timed: true }
    }

    /// Whether it is a timing event.
    pub fn is_timed(&self) -> bool {
        self.timed
    }

    /// The device time from `start`'s recorded point to this event's in nanoseconds (negative when this one
    /// passed first), or `None` while either has not passed; never blocks. Both must be timing events of one
    /// context, each recorded at least once. `cuEventElapsedTime` gives milliseconds as an `f32` with a
    /// resolution of about half a microsecond, and fewer significant digits the further apart the two are.
    pub fn nanos_since(&self, start: &Event) -> Result<Option<i64>> {
        if !self.timed || !start.timed {
            return Err(CudaError::InvalidArgument("nanos_since: both events must be timing events".to_owned()));
        }
        let (Some(end), Some(begin)) = (self.cuda.get(), start.cuda.get()) else {
            return Err(CudaError::InvalidArgument("nanos_since: both events must have been recorded".to_owned()));
        };
        if !start.query()? || !self.query()? {
            return Ok(None);
        }
        // Both have passed: the synchronisations inside `elapsed_ms` return at once.
        let ms = begin.elapsed_ms(end).during("cuEventElapsedTime")?;
        if !ms.is_finite() {
            return Err(CudaError::InvalidArgument(format!("events gave an invalid time: {ms} ms")));
        }
        Ok(Some((f64::from(ms) * 1e6).round() as i64))
    }

    /// Marks the point after all work enqueued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let event = match self.cuda.get() {
            Some(event) => event,
            None => {
                let fresh = self.pool.take_kind(self.timed)?;
                if let Err(unused) = self.cuda.set(fresh) {
                    self.pool.give_back_kind(unused, self.timed);
                }
                self.cuda.get().expect("set just above")
            }
        };
        event.record(stream.cuda()).during("cuEventRecord")
    }

    /// Whether the driver object exists (the event was recorded at least once).
    pub fn is_created(&self) -> bool {
        self.cuda.get().is_some()
    }

    /// Whether the recorded point has passed (true if never recorded).
    pub fn query(&self) -> Result<bool> {
        match self.cuda.get() {
            None => Ok(true),
            Some(event) => {
                crate::ffi::bind(event.context())?;
                event.try_is_complete().during("cuEventQuery")
            }
        }
    }

    /// Blocks the host until the recorded point has passed.
    pub fn synchronize(&self) -> Result<()> {
        match self.cuda.get() {
            None => Ok(()),
            Some(event) => event.synchronize().during("cuEventSynchronize"),
        }
    }
}

/// Waiting is defined with events, which are recorded on streams: streams know nothing of events.
impl Stream {
    /// Makes later work on this stream wait for `event`'s recorded point (a never-recorded event: no wait).
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        match event.cuda.get() {
            None => Ok(()),
            Some(cuda) => self.cuda().wait(cuda).during("cuStreamWaitEvent"),
        }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(event) = self.cuda.take() {
            self.pool.give_back_kind(event, self.timed);
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Event(cuda:{}, {})", self.pool.ctx.ordinal(), if self.is_created() { "created" } else { "lazy" })
    }
}

/// An event with timing enabled, created at once, for measurements (`CU_EVENT_DEFAULT`).
pub struct TimingEvent {
    cuda: CudaEvent,
}

impl TimingEvent {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Self { cuda: ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).during("cuEventCreate")? })
    }

    /// Marks the point after all work enqueued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.cuda.record(stream.cuda()).during("cuEventRecord")
    }

    /// Blocks until both events have passed, then returns the device time from `start` to `self`.
    pub fn elapsed_since(&self, start: &TimingEvent) -> Result<Duration> {
        let ms = start.cuda.elapsed_ms(&self.cuda).during("cuEventElapsedTime")?;
        if !ms.is_finite() || ms < 0.0 {
            return Err(CudaError::InvalidArgument(format!("events gave a negative or invalid time: {ms} ms")));
        }
        Ok(Duration::from_secs_f64(f64::from(ms) / 1e3))
    }

    /// Blocks the host until the recorded point has passed.
    pub fn synchronize(&self) -> Result<()> {
        self.cuda.synchronize().during("cuEventSynchronize")
    }

    /// Whether the recorded point has passed, without blocking (a benchmark asks whether the device already
    /// got there while the host was still enqueuing).
    pub fn query(&self) -> Result<bool> {
        crate::ffi::bind(self.cuda.context())?;
        self.cuda.try_is_complete().during("cuEventQuery")
    }
}

impl fmt::Debug for TimingEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TimingEvent(cuda:{})", self.cuda.context().ordinal())
    }
}
