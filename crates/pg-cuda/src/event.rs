//! Events: created lazily at their first record and recycled through a per-device pool; timing events; a
//! stream's wait for an event.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cudarc::driver::safe::CudaEvent;
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::CudaContext;

use crate::error::{CudaError, DriverContext, Result};
use crate::stream::Stream;

/// Driver event objects (timing disabled) not in use, ready to be recorded again.
pub(crate) struct EventPool {
    ctx: Arc<CudaContext>,
    free: Mutex<Vec<CudaEvent>>,
}

impl fmt::Debug for EventPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventPool(cuda:{}, {} free)", self.ctx.ordinal(), self.free.lock().map(|v| v.len()).unwrap_or(0))
    }
}

impl EventPool {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Self {
        Self { ctx, free: Mutex::new(Vec::new()) }
    }

    /// A free event object, or a new one.
    pub(crate) fn take(&self) -> Result<CudaEvent> {
        if let Some(event) = self.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(event);
        }
        self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DISABLE_TIMING)).during("cuEventCreate")
    }

    /// Returns an event object for reuse. Re-recording a recycled event is safe even while earlier waits on
    /// it are pending: a wait captures the record it saw.
    pub(crate) fn give_back(&self, event: CudaEvent) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).push(event);
    }
}

/// A marker in a stream. The driver object is made at the first [`Event::record`] (a never-recorded event
/// counts as completed, as in CUDA) and returned to the device's pool when the handle is dropped.
pub struct Event {
    pool: Arc<EventPool>,
    cuda: OnceLock<CudaEvent>,
}

impl Event {
    pub(crate) fn new(pool: Arc<EventPool>) -> Self {
        Self { pool, cuda: OnceLock::new() }
    }

    /// Marks the point after all work enqueued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        let event = match self.cuda.get() {
            Some(event) => event,
            None => {
                let fresh = self.pool.take()?;
                if let Err(unused) = self.cuda.set(fresh) {
                    self.pool.give_back(unused);
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
            self.pool.give_back(event);
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
