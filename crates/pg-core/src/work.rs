//! Work: the handle of one enqueued operation, with PyTorch's `WorkNCCL` semantics (S11, S13-S15).

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::cache::CommEntry;
use crate::completion::{Completion, Waiters};
use crate::locks::lock;
use crate::{Backend, Buffer, Communicator, DType, Device, Error, Event, Future, OpType, Result, Stream};

/// The object-safe face of a Work, for code that holds Works of several backends or groups.
pub trait Work: Send + Sync + fmt::Debug {
    /// Orders the caller's current stream after the op (and, with blocking wait, blocks the host until done).
    fn wait(&self) -> Result<()>;
    /// Like [`Work::wait`], but blocks the host until the op completes or `timeout` passes.
    fn wait_timeout(&self, timeout: Duration) -> Result<()>;
    /// Whether the op has finished on the device or failed; never just "the host call returned".
    fn is_completed(&self) -> bool;
    /// The error this Work failed with, if any.
    fn exception(&self) -> Option<Error>;
    /// The sequence number in its group.
    fn seq(&self) -> u64;
    /// What the op is.
    fn op_type(&self) -> OpType;
}

/// What the Work of one op knows; shared between the caller's handle and the watchdog.
pub(crate) struct WorkState<B: Backend> {
    /// The device, communicator and communication stream the op runs on.
    pub(crate) entry: CommEntry<B>,
    pub(crate) end_event: Arc<B::Event>,
    /// Recorded before the op when desync debugging is on, so the watchdog can tell started from scheduled.
    pub(crate) start_event: Option<Arc<B::Event>>,
    /// The op's flight-recorder entry (`u64::MAX`: none, the recorder being off).
    pub(crate) fr_id: std::sync::atomic::AtomicU64,
    /// Set by the watchdog when it is done with the Work (completed or failed): it leaves the in-flight list.
    pub(crate) retired: std::sync::atomic::AtomicBool,
    pub(crate) seq: u64,
    pub(crate) op: OpType,
    /// The input's element count and dtype.
    pub(crate) input: (usize, DType),
    /// The output's element count and dtype.
    pub(crate) output: (usize, DType),
    /// Every buffer's size and dtype, for an op with lists of buffers (`input` and `output` are then totals).
    pub(crate) lists: Option<Arc<crate::flight_recorder::ListSizes>>,
    /// Host time at creation: the base of the timeout (S13), not the device start of the op.
    pub(crate) start_time: Duration,
    pub(crate) timeout: Duration,
    pub(crate) blocking_wait: bool,
    pub(crate) blocking_wait_poll: Duration,
    pub(crate) is_barrier: bool,
    /// Enqueued while the current stream was capturing: the op is a graph's nodes, run by the graph's launches.
    pub(crate) captured: bool,
    pub(crate) exception: Mutex<Option<Error>>,
    /// Set (after the slot) once `exception` holds an error, so that the checks of a Work that has none, on the
    /// enqueue path, in `wait()` and in every watchdog pass, take no lock.
    pub(crate) failed: std::sync::atomic::AtomicBool,
    /// Set once a query saw the end event passed while the communicator was neither aborted nor revoked: the op
    /// ran to its end, and a later abort changes nothing about it (see [`WorkState::observe_end`]).
    pub(crate) ended: std::sync::atomic::AtomicBool,
    /// Buffers kept alive until the Work is waited on (avoid-record-streams mode, S12).
    pub(crate) stash: Mutex<Vec<B::Buffer>>,
    /// Whether the Work was made with a non-empty stash (nothing is added later): a Work without one takes no
    /// stash lock when waited on or completed.
    pub(crate) stashed: bool,
    /// The tasks that await the Work; made at the first poll that finds the op still running, so an op that is
    /// never awaited allocates nothing for it.
    pub(crate) waiters: OnceLock<Arc<Waiters>>,
    /// The number of the thread that enqueued the op: for its flight-recorder entry, which is made later, off the
    /// enqueue path, and for [`WorkState::observe_ends`] (one thread's Works are on the list in its program order).
    pub(crate) thread: u64,
}

impl<B: Backend> WorkState<B> {
    /// The op's flight-recorder entry, if it has one.
    pub(crate) fn fr_id(&self) -> Option<u64> {
        match self.fr_id.load(std::sync::atomic::Ordering::Relaxed) {
            u64::MAX => None,
            id => Some(id),
        }
    }

    pub(crate) fn exception(&self) -> Option<Error> {
        if !self.failed.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        lock(&self.exception).clone()
    }

    /// Records `error` unless an earlier one is there: the first error is the one reported.
    pub(crate) fn set_exception(&self, error: Error) {
        let mut slot = lock(&self.exception);
        if slot.is_none() {
            *slot = Some(error);
        }
        self.failed.store(true, std::sync::atomic::Ordering::Release);
        drop(slot);
        // A task awaiting the Work learns of the error now: the op itself may never finish.
        if let Some(waiters) = self.waiters.get() {
            waiters.wake_all();
        }
    }

    /// What every retirer of a completed Work does with it (a watchdog pass, the enqueue path's own retirement):
    /// releases its stash and queues its flight-recorder entry in `completed`, to be retired in one batch.
    pub(crate) fn release_completed(&self, completed: &mut Vec<u64>) {
        if self.stashed {
            lock(&self.stash).clear();
        }
        if let Some(id) = self.fr_id() {
            completed.push(id);
        }
    }

    /// Reads the communicator's async error into this Work (PyTorch's `checkAndSetException`).
    pub(crate) fn check_and_set_exception(&self) {
        if let Err(error) = self.entry.comm.async_error() {
            self.set_exception(error);
        }
    }

    /// Whether the op is known to have run to its end: the one rule that decides a Work's success, whoever aborts
    /// its communicator (the group, the backend on its own, as after a split's timeout, or a caller of the
    /// communicator from outside the group).
    ///
    /// An aborted (or revoked) communicator's stream drains past the ops still queued on it without running them,
    /// and their end events pass all the same: a passed end event proves the op ran only if the communicator was
    /// not stopped when it was seen. So the event is queried first and the communicator read after: passed and not
    /// stopped means the op ended before any abort, and the Work remembers it; stopped before that was seen means
    /// the op may not have run, and the Work fails with [`Error::Aborted`] (unless it failed already).
    pub(crate) fn observe_end(&self) -> bool {
        use std::sync::atomic::Ordering;
        if self.ended.load(Ordering::Acquire) {
            return true;
        }
        let passed = self.end_event.query();
        let stopped = self.entry.comm.is_aborted() || self.entry.comm.is_revoked();
        match passed {
            Ok(true) if !stopped => {
                self.ended.store(true, Ordering::Release);
                true
            }
            Ok(_) if stopped => {
                self.set_exception(Error::Aborted {
                    reason: format!(
                        "the communicator was aborted before {} (seq {}) was seen finished: its stream drains past                          the ops queued on it without running them",
                        self.op, self.seq
                    ),
                });
                false
            }
            Ok(_) => false,
            Err(error) => {
                self.set_exception(error);
                false
            }
        }
    }

    /// Observes the ends of `works`, a list in enqueue order (the in-flight list), with one event query per
    /// communication stream and enqueuing thread where their ops have passed, rather than one per Work: a
    /// stream runs its work in the order it was enqueued, and one thread enqueues in its program order, which is
    /// its order on the list; so once a Work's end is observed ([`WorkState::observe_end`]), every earlier Work
    /// of the same thread on the same communicator entry has ended too, before any abort (which is sticky: not
    /// stopped at the later query means not stopped before). Walks the list from its newest Work back; every Work
    /// is either queried once or inferred, so that [`WorkState::is_completed_observed`] needs no query after it.
    /// Failed and captured Works are left as they are.
    pub(crate) fn observe_ends(works: &[Arc<WorkState<B>>]) {
        use std::sync::atomic::Ordering;
        // The (communicator entry, thread) pairs with a later Work seen ended: a handful per group, kept on the
        // stack (a pruning enqueue path allocates nothing); pairs beyond them are queried Work by Work.
        const KEPT: usize = 16;
        let mut passed = [(std::ptr::null::<crate::cache::CommShared<B>>(), 0u64); KEPT];
        let mut known = 0;
        for work in works.iter().rev() {
            if work.captured || work.failed.load(Ordering::Acquire) {
                continue;
            }
            let key = (Arc::as_ptr(&work.entry), work.thread);
            if passed[..known].contains(&key) {
                work.ended.store(true, Ordering::Release);
            } else if work.observe_end() && known < KEPT {
                passed[known] = key;
                known += 1;
            }
        }
    }

    /// PyTorch's `isCompleted`: an exception, or the op ran to its end ([`WorkState::observe_end`]).
    ///
    /// An op still pending on an aborted communicator will never finish: it completes with
    /// [`Error::Aborted`], so that a wait blocked on it returns (abort from another thread, S26).
    pub(crate) fn is_completed(&self) -> bool {
        self.completed_given(WorkState::observe_end)
    }

    /// [`WorkState::is_completed`] after [`WorkState::observe_ends`] looked at the Work: its end is not queried
    /// again.
    pub(crate) fn is_completed_observed(&self) -> bool {
        self.completed_given(|work| work.ended.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Whether the Work completed, `ended` telling whether its op is known to have ended.
    fn completed_given(&self, ended: impl FnOnce(&Self) -> bool) -> bool {
        if self.captured {
            // Its end event belongs to the capture and cannot be queried; the Work itself ran nothing.
            return true;
        }
        if self.exception().is_some() {
            return true;
        }
        if ended(self) {
            return true;
        }
        if self.exception().is_none() {
            self.check_and_set_exception();
        }
        self.exception().is_some()
    }

    /// Sets the timeout error if the Work has run longer than `timeout` since its host start time.
    pub(crate) fn check_timeout(&self, timeout: Duration) -> bool {
        let elapsed = self.entry.device.now().saturating_sub(self.start_time);
        if elapsed <= timeout {
            return false;
        }
        self.set_exception(Error::WorkTimeout {
            seq: self.seq,
            op: self.op,
            numel_in: self.input.0,
            numel_out: self.output.0,
            timeout,
            elapsed,
        });
        true
    }

    /// Makes the caller's current stream wait for the end event, then releases the stash (S11, S12) except its
    /// foreign buffers, which stay until the watchdog sees the end event pass (their owner may free them on
    /// any stream, or at once).
    fn synchronize_stream(&self) -> Result<()> {
        let current = self.entry.device.current_stream();
        if self.captured && !current.is_capturing()? {
            // Outside the capture there is nothing to order after: the op runs in the graph's launches, and work
            // after a launch on its stream is ordered after the whole graph.
            return Ok(());
        }
        current.wait_event(&self.end_event)?;
        if self.stashed {
            lock(&self.stash).retain(Buffer::is_foreign);
        }
        Ok(())
    }

    fn wait(&self, timeout: Option<Duration>) -> Result<()> {
        let blocks = self.blocking_wait || timeout.is_some() || self.is_barrier;
        if blocks && (self.captured || self.entry.device.current_stream().is_capturing()?) {
            return Err(Error::capture(format!(
                "a blocking wait of {} (seq {}) while the current stream is capturing, or of an op that was \
                 captured: the host cannot wait for work a graph runs; use wait() without blocking wait under \
                 capture, and synchronize the stream a graph was launched on",
                self.op, self.seq
            )));
        }
        self.synchronize_stream()?;
        if self.blocking_wait || timeout.is_some() {
            let timeout = timeout.unwrap_or(self.timeout);
            let never = std::sync::atomic::AtomicBool::new(false);
            while !self.is_completed() {
                if self.check_timeout(timeout) {
                    tracing::error!(target: "pg", seq = self.seq, op = %self.op, "timed out in blocking wait");
                    break;
                }
                self.entry.device.sleep(self.blocking_wait_poll, &never);
            }
        } else if self.is_barrier {
            // A barrier is a host barrier: the current stream is synchronised, not the device (S16).
            self.entry.device.current_stream().synchronize()?;
        }
        if !self.captured {
            // A wait that returns at once still reports an op whose communicator was stopped before it was seen
            // finished: its outputs may never have been written.
            self.observe_end();
        }
        match self.exception() {
            None => Ok(()),
            Some(error) => {
                // As PyTorch: the failed Work's communicator is aborted before the error reaches the caller. The
                // group first fails the other Works on it that had not finished: the abort drains them unrun.
                if !self.entry.is_aborting() {
                    self.entry.abort(&error);
                }
                Err(error)
            }
        }
    }
}

impl<B: Backend> Completion for WorkState<B> {
    fn poll_completion(&self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let waiters = self.waiters.get_or_init(Arc::default);
        // Registered before the check, so that a completion or an error recorded in between wakes this task.
        waiters.register(cx.waker());
        if self.is_completed() {
            return Poll::Ready(self.exception().map_or(Ok(()), Err));
        }
        if waiters.arm() {
            // The callback runs once the communication stream has passed everything enqueued on it so far, the
            // end event included. It holds the wakers only: dropping it releases no buffer, event or Work.
            let wake = Arc::clone(waiters);
            if let Err(error) = self.entry.stream.launch_host_fn(Box::new(move || wake.wake_all())) {
                waiters.disarm();
                return Poll::Ready(Err(error));
            }
        }
        Poll::Pending
    }
}

/// The future of an awaited Work ([`WorkHandle`]'s `IntoFuture`).
///
/// It resolves with `Ok(())` once the op has finished on the device, or with the Work's error: a
/// [`Error::WorkTimeout`] when the watchdog times it out, [`Error::Aborted`] when the group is aborted, a
/// communicator error. No host thread blocks for it and nothing polls: the first poll that finds the op running
/// enqueues a host callback on the communication stream ([`crate::Stream::launch_host_fn`]) that wakes the task,
/// and whoever records the Work's error wakes it too. Dropping the future cancels nothing; the op runs on.
///
/// Unlike [`WorkHandle::wait`], awaiting orders no stream (the op is over when it resolves) and aborts no
/// communicator on an error (the group's error handling does what its mode says).
///
/// ```
/// use pg_core::{Backend, ProcessGroup, ReduceOp, Result};
///
/// /// Averages gradients across ranks from async code; resolves once the device has finished.
/// async fn average<B: Backend>(pg: &ProcessGroup<B>, grads: &B::Buffer) -> Result<()> {
///     pg.all_reduce(grads, ReduceOp::Avg)?.await
/// }
/// ```
#[must_use = "a future does nothing unless awaited"]
pub struct WorkFuture<B: Backend> {
    state: Arc<WorkState<B>>,
}

impl<B: Backend> fmt::Debug for WorkFuture<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkFuture").field("seq", &self.state.seq).field("op", &self.state.op).finish()
    }
}

impl<B: Backend> std::future::Future for WorkFuture<B> {
    type Output = Result<()>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        self.state.poll_completion(cx)
    }
}

impl<B: Backend> std::future::IntoFuture for WorkHandle<B> {
    type Output = Result<()>;
    type IntoFuture = WorkFuture<B>;

    fn into_future(self) -> WorkFuture<B> {
        WorkFuture { state: self.state }
    }
}

impl<B: Backend> std::future::IntoFuture for &WorkHandle<B> {
    type Output = Result<()>;
    type IntoFuture = WorkFuture<B>;

    fn into_future(self) -> WorkFuture<B> {
        WorkFuture { state: Arc::clone(&self.state) }
    }
}

/// The handle of one enqueued collective or point-to-point op.
///
/// Returned by every process-group op; the synchronous form of an op is exactly this followed by
/// [`WorkHandle::wait`].
///
/// `wait()` orders the caller's current stream after the op: later work on that stream sees the results.
/// It does not block the host (unless blocking wait is on) and it orders no other stream.
/// `is_completed()` is the truthful completion signal; a returned host call is never completion.
#[must_use = "a Work that is never waited on leaves the current stream unordered after the op"]
pub struct WorkHandle<B: Backend> {
    pub(crate) state: Arc<WorkState<B>>,
    /// The output lives on the caller's handles only: as in PyTorch, the watchdog's reference to the Work does
    /// not keep it alive (the allocator's `record_stream` guard protects its memory instead).
    pub(crate) output: B::Buffer,
}

impl<B: Backend> Clone for WorkHandle<B> {
    fn clone(&self) -> Self {
        Self { state: Arc::clone(&self.state), output: self.output.clone() }
    }
}

impl<B: Backend> fmt::Debug for WorkHandle<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkHandle")
            .field("seq", &self.state.seq)
            .field("op", &self.state.op)
            .field("numel_in", &self.state.input.0)
            .field("numel_out", &self.state.output.0)
            .finish_non_exhaustive()
    }
}

impl<B: Backend> WorkHandle<B> {
    /// Orders the caller's current stream after the op; with blocking wait, also blocks the host until the op
    /// completes, fails or times out (then the communicator is aborted and the error returned).
    pub fn wait(&self) -> Result<()> {
        self.state.wait(None)
    }

    /// Orders the current stream after the op and blocks the host until it completes or `timeout` passes.
    pub fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        self.state.wait(Some(timeout))
    }

    /// Whether the op finished on the device (its end event passed) or failed.
    pub fn is_completed(&self) -> bool {
        self.state.is_completed()
    }

    /// Whether the op finished without an error.
    pub fn is_success(&self) -> bool {
        self.is_completed() && self.exception().is_none()
    }

    /// The error this Work failed with.
    pub fn exception(&self) -> Option<Error> {
        self.state.exception()
    }

    /// The sequence number in its group (collectives and point-to-point ops count separately, from 1).
    pub fn seq(&self) -> u64 {
        self.state.seq
    }

    /// What the op is.
    pub fn op_type(&self) -> OpType {
        self.state.op
    }

    /// The host time at which the Work was created: the base of its timeout (S13).
    pub fn start_time(&self) -> Duration {
        self.state.start_time
    }

    /// The timeout this Work runs under.
    pub fn timeout(&self) -> Duration {
        self.state.timeout
    }

    /// The stream the op was enqueued on (the group's communication stream for its device key).
    pub fn comm_stream(&self) -> &B::Stream {
        &self.state.entry.stream
    }

    /// Whether the end event's backend object exists (it is made when it is first recorded, S13; `testing`
    /// feature).
    #[cfg(feature = "testing")]
    pub fn end_event_created(&self) -> bool {
        self.state.end_event.is_created()
    }

    /// The output buffers (every op has one).
    pub fn outputs(&self) -> &[B::Buffer] {
        std::slice::from_ref(&self.output)
    }

    /// The CUDA-aware Future of the op: done at once, with the outputs (S17).
    pub fn future(&self) -> Future<B> {
        let completion: Arc<dyn Completion> = Arc::clone(&self.state) as Arc<dyn Completion>;
        let device = self.state.entry.device.clone();
        Future::new(device, Arc::clone(&self.state.end_event), vec![self.output.clone()], completion)
    }

    /// Blocks the host until the op has finished on the device (the end event's synchronize), whatever the
    /// blocking-wait setting; does not order any stream.
    pub fn synchronize(&self) -> Result<()> {
        if self.state.captured {
            return Err(Error::capture(format!(
                "synchronize of {} (seq {}), which was captured: it runs in the graph's launches; synchronize the \
                 stream a graph was launched on",
                self.state.op, self.state.seq
            )));
        }
        self.state.end_event.synchronize()
    }

    /// Whether the op was enqueued while the current stream was capturing: it is then nodes of the capture's
    /// graph, run by each launch of the graph; the Work itself completes at once and is not watched.
    pub fn is_captured(&self) -> bool {
        self.state.captured
    }
}

impl<B: Backend> Work for WorkHandle<B> {
    fn wait(&self) -> Result<()> {
        WorkHandle::wait(self)
    }

    fn wait_timeout(&self, timeout: Duration) -> Result<()> {
        WorkHandle::wait_timeout(self, timeout)
    }

    fn is_completed(&self) -> bool {
        WorkHandle::is_completed(self)
    }

    fn exception(&self) -> Option<Error> {
        WorkHandle::exception(self)
    }

    fn seq(&self) -> u64 {
        WorkHandle::seq(self)
    }

    fn op_type(&self) -> OpType {
        WorkHandle::op_type(self)
    }
}
