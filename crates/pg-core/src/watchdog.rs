//! The watchdog (S21): one host thread per group that polls the in-flight Works every `watchdog_period`,
//! turns hangs and asynchronous communicator errors into typed errors, and does the completion bookkeeping.
//!
//! Each pass, for every in-flight Work: read the communicator's asynchronous error, check the Work's timeout,
//! note when it started and completed (flight recorder, last started and completed sequence numbers, desync
//! trace keys), release its stashed buffers once complete, and drop it from the list.
//! On the first error it records the group's sticky [`ErrorType`], writes the desync report, tells the peers
//! through the store (`remote_error:{pg_uid}`, `exception_dump`), dumps the flight recorder, and applies the
//! error-handling mode: clean up aborts the communicators, tear down makes every later call of the group
//! return the error (the process is never killed).
//!
//! The watchdog never makes a blocking device call: it only queries events and asynchronous errors.
//! It sleeps and reads time only through the [`Device`], so it runs in virtual time on the simulated backend.
//! It holds the group weakly between passes, so dropping the last handle of the group stops it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use pg_store::Store;

use crate::desync::{encode_trace, trace_end_key, trace_start_key, DesyncReport};
use crate::flight_recorder::{dump_path, write_dump, DumpHeader, FlightRecorder, NewEntry};
use crate::work::WorkState;
use crate::{Backend, Communicator, Device, Error, ErrorKind, Event, OpType, Options, Result};

/// How often the watchdog looks for an `exception_dump` signal from a peer (`TORCH_NCCL_COORD_CHECK_MILSEC`).
const COORD_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// How long an idle watchdog with nothing to poll sleeps, unless a new Work wakes it first.
const IDLE_SLEEP: Duration = Duration::from_secs(3600);

/// How long stopping a group waits for its watchdog to finish a store operation before detaching it: a
/// healthy store answers well within it; a dead one would hold the caller for the store's timeout.
const STORE_OP_STOP_WAIT: Duration = Duration::from_millis(200);

/// The most completed Works kept for reuse per group (about one watchdog period of ops at 10 us per op).
const RECYCLED_MAX: usize = 8192;

/// Without a watchdog, the enqueue path prunes the in-flight list once it holds this many Works (or twice as
/// many as the last pruning kept).
const MIN_PRUNE_LEN: usize = 64;

/// The store key through which a failing rank asks every rank to dump its flight recorder.
pub(crate) const EXCEPTION_DUMP_KEY: &str = "exception_dump";

/// The store key through which a failing rank tells its peers (`TORCH_NCCL_PROPAGATE_ERROR`).
pub(crate) fn remote_error_key(pg_uid: &str) -> String {
    format!("remote_error:{pg_uid}")
}

/// The group's sticky error state (PyTorch's `ErrorType`, read with `getError()`): the first error wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ErrorType {
    /// No error so far.
    #[default]
    Success,
    /// A Work timed out.
    Timeout,
    /// The communicator reported an error.
    CommError,
    /// A peer reported an error through the store.
    RemoteError,
    /// The watchdog stopped making progress (PyTorch kills the process here; this library reports it).
    HeartbeatTimeout,
}

impl ErrorType {
    fn of(error: &Error) -> Self {
        match error.kind() {
            ErrorKind::WorkTimeout => ErrorType::Timeout,
            ErrorKind::Remote => ErrorType::RemoteError,
            ErrorKind::HeartbeatTimeout => ErrorType::HeartbeatTimeout,
            _ => ErrorType::CommError,
        }
    }
}

/// What the watchdog knows about the group: its error state and how far its ops got.
#[derive(Debug, Clone, Default)]
pub struct GroupStatus {
    /// The sticky error state.
    pub error_type: ErrorType,
    /// The first error the watchdog (or heartbeat monitor) found.
    pub error: Option<Error>,
    /// The host time at which that error was found (the device clock, virtual on the simulated backend).
    pub error_detected_at: Option<Duration>,
    /// The sequence number of the last collective enqueued.
    pub last_enqueued_seq: Option<u64>,
    /// The last collective enqueued.
    pub last_enqueued_op: Option<OpType>,
    /// The sequence number of the last collective seen started (needs start events: desync debugging).
    pub last_started_seq: Option<u64>,
    /// The sequence number of the last collective seen completed.
    pub last_completed_seq: Option<u64>,
    /// The last collective seen completed.
    pub last_completed_op: Option<OpType>,
    /// Works the watchdog still tracks.
    pub in_flight: usize,
    /// Communicators of the group that are aborted.
    pub aborted_comms: usize,
    /// Watchdog passes so far (the heartbeat).
    pub watchdog_passes: u64,
    /// Flight-recorder dumps written to files.
    pub dumps_written: u64,
}

/// The flags the group and its two threads share without holding the group.
#[derive(Debug, Default)]
pub(crate) struct Signals {
    /// The group is stopping: both threads exit.
    pub(crate) terminate: AtomicBool,
    /// Ends the watchdog's sleep early (a new Work while it idles, or `terminate`).
    pub(crate) wake: AtomicBool,
    /// The watchdog sleeps with nothing in flight: its heartbeat may pause without it being stuck.
    pub(crate) idle: AtomicBool,
}

/// The mutable part of the status.
#[derive(Default)]
struct StatusCell {
    status: GroupStatus,
    desync: Option<DesyncReport>,
    dumped: bool,
    next_coord_check: Duration,
}

/// The reliability state of one group: the in-flight list, the status, the flight recorder and the threads.
pub(crate) struct Reliability<B: Backend> {
    works: Mutex<Vec<Arc<WorkState<B>>>>,
    status: Mutex<StatusCell>,
    pub(crate) recorder: FlightRecorder,
    signals: Arc<Signals>,
    heartbeat: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    watchdog_stuck: AtomicBool,
    stall: Mutex<Option<Duration>>,
    /// The timeout set with [`Reliability::set_timeout`], in nanoseconds (`u64::MAX`: none set).
    timeout: AtomicU64,
    store_broken: AtomicBool,
    /// The last collective enqueued, packed as `seq << 8 | op as u8` (0: none yet), so that the enqueue path
    /// takes no lock for it.
    last_enqueued: AtomicU64,
    /// Completed Works that nothing else holds, for the enqueue path to reuse (their memory and end event).
    recycled: Mutex<Vec<Arc<WorkState<B>>>>,
    reuse_works: bool,
    /// Without a watchdog, the in-flight list's length at which the enqueue path next prunes it.
    prune_at: AtomicUsize,
    /// Store operations of the watchdog under way: a stopping group does not wait for one to time out.
    in_store_op: AtomicU64,
}

impl<B: Backend> Reliability<B> {
    pub(crate) fn new(options: &Options) -> Self {
        Self {
            works: Mutex::new(Vec::new()),
            status: Mutex::new(StatusCell::default()),
            recorder: FlightRecorder::new(options.trace_buffer_size),
            signals: Arc::new(Signals::default()),
            heartbeat: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            watchdog_stuck: AtomicBool::new(false),
            stall: Mutex::new(None),
            timeout: AtomicU64::new(u64::MAX),
            store_broken: AtomicBool::new(false),
            last_enqueued: AtomicU64::new(0),
            prune_at: AtomicUsize::new(MIN_PRUNE_LEN),
            recycled: Mutex::new(Vec::new()),
            reuse_works: options.reuse_works,
            in_store_op: AtomicU64::new(0),
        }
    }

    fn lock_works(&self) -> MutexGuard<'_, Vec<Arc<WorkState<B>>>> {
        self.works.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_status(&self) -> MutexGuard<'_, StatusCell> {
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a new Work in the flight recorder and the status, and puts it on the in-flight list.
    pub(crate) fn track(&self, work: &Arc<WorkState<B>>, watched: bool) {
        let device = &work.entry.device;
        let probe = |event: &Arc<B::Event>| Arc::clone(event) as crate::flight_recorder::EventProbe;
        let is_p2p = work.op.is_p2p();
        let id = self.recorder.record(NewEntry {
            collective_seq_id: if is_p2p { 0 } else { work.seq },
            p2p_seq_id: if is_p2p { work.seq } else { 0 },
            op: work.op,
            time_created_ns: nanos(work.start_time),
            input: work.input,
            output: work.output,
            timeout_ms: u64::try_from(work.timeout.as_millis()).unwrap_or(u64::MAX),
            started: work.start_event.as_ref().map(probe),
            completed: Some(probe(&work.end_event)),
        });
        if let Some(id) = id {
            work.fr_id.store(id, Ordering::Relaxed);
        }
        if !is_p2p {
            // Collectives are enqueued in sequence order; a racing thread never moves the mark backwards.
            self.last_enqueued.fetch_max(work.seq << 8 | work.op as u64, Ordering::AcqRel);
        }
        let mut works = self.lock_works();
        if !watched && works.len() >= self.prune_at.load(Ordering::Relaxed) {
            // With no watchdog (blocking wait) the list serves abort only: it keeps the Works a caller still
            // holds, so that an abort from another thread reaches a blocked wait.
            // A Work whose handles are all gone leaves once its op is done (its stash may guard its buffers).
            // Pruning runs when the list has doubled since the last time, so it costs O(1) per op.
            works.retain(|work| Arc::strong_count(work) > 1 || !work.end_event.query().unwrap_or(true));
            self.prune_at.store((2 * works.len()).max(MIN_PRUNE_LEN), Ordering::Relaxed);
        }
        works.push(Arc::clone(work));
        drop(works);
        if watched && self.signals.idle.load(Ordering::SeqCst) {
            self.signals.wake.store(true, Ordering::SeqCst);
            device.notify_host_threads();
        }
    }

    /// Sets `error` on every in-flight Work and stops tracking them (abort and tear down).
    pub(crate) fn fail_in_flight(&self, error: &Error) {
        // Recycled Works hold the group's communicators: a stopping group lets them go.
        drop(std::mem::take(&mut *self.recycled.lock().unwrap_or_else(PoisonError::into_inner)));
        let works = std::mem::take(&mut *self.lock_works());
        for work in works {
            work.set_exception(error.clone());
            if let Some(id) = work.fr_id() {
                self.recorder.retire(id, None);
            }
        }
    }

    /// Keeps the retired Works that completed without error and that nothing else holds (no handle, no Future,
    /// no flight-recorder entry), up to [`RECYCLED_MAX`], for the enqueue path to reuse; drops the others.
    fn recycle(&self, retired: Vec<Arc<WorkState<B>>>) {
        if !self.reuse_works {
            return;
        }
        let reusable = |work: &Arc<WorkState<B>>| {
            Arc::strong_count(work) == 1 && Arc::strong_count(&work.end_event) == 1 && work.exception().is_none()
        };
        // The others are dropped after the lock is released: the enqueue path takes it too.
        let mut others = Vec::new();
        let mut pool = self.recycled.lock().unwrap_or_else(PoisonError::into_inner);
        for work in retired {
            match reusable(&work) && pool.len() < RECYCLED_MAX {
                true => pool.push(work),
                false => others.push(work),
            }
        }
        drop(pool);
        drop(others);
    }

    /// A Work to reuse, with its end event: only this pool held it, so the caller may overwrite it.
    pub(crate) fn take_recycled(&self) -> Option<Arc<WorkState<B>>> {
        let mut work = self.recycled.lock().unwrap_or_else(PoisonError::into_inner).pop()?;
        (Arc::get_mut(&mut work).is_some() && Arc::strong_count(&work.end_event) == 1).then_some(work)
    }

    /// The status as it is now.
    pub(crate) fn status(&self) -> GroupStatus {
        let mut status = self.lock_status().status.clone();
        (status.last_enqueued_seq, status.last_enqueued_op) = self.last_enqueued().unzip();
        status.in_flight = self.lock_works().len();
        status.watchdog_passes = self.heartbeat.load(Ordering::Relaxed);
        status
    }

    /// The desync report written at the first timeout, if any.
    pub(crate) fn desync_report(&self) -> Option<DesyncReport> {
        self.lock_status().desync.clone()
    }

    /// The timeout of a new op: the one set with [`Reliability::set_timeout`], else the group's.
    pub(crate) fn timeout(&self, group_timeout: Duration) -> Duration {
        match self.timeout.load(Ordering::Relaxed) {
            u64::MAX => group_timeout,
            nanos => Duration::from_nanos(nanos),
        }
    }

    /// Overrides the group's timeout for the ops enqueued from now on.
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        // A timeout of 584 years or more is kept as the largest one that fits.
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX - 1).min(u64::MAX - 1);
        self.timeout.store(nanos, Ordering::Relaxed);
    }

    /// The sequence number and type of the last collective enqueued.
    pub(crate) fn last_enqueued(&self) -> Option<(u64, OpType)> {
        match self.last_enqueued.load(Ordering::Acquire) {
            0 => None,
            packed => Some((packed >> 8, OpType::ALL[(packed & 0xff) as usize])),
        }
    }

    /// Makes the watchdog's next pass block for `duration` (a fault-injection hook for the heartbeat monitor).
    pub(crate) fn stall_watchdog(&self, duration: Duration) {
        *self.stall.lock().unwrap_or_else(PoisonError::into_inner) = Some(duration);
    }

    /// Asks the watchdog and the heartbeat monitor to stop, without waiting for them.
    pub(crate) fn signal_stop(&self, device: &B::Device) {
        self.signals.terminate.store(true, Ordering::SeqCst);
        self.signals.wake.store(true, Ordering::SeqCst);
        device.notify_host_threads();
    }

    /// Stops the threads and waits for them, except for the calling thread itself (the group may be dropped
    /// on its own watchdog thread) and for a watchdog found stuck (it may never return).
    ///
    /// A thread inside a store operation gets up to [`STORE_OP_STOP_WAIT`] to finish it: a healthy store
    /// answers in milliseconds, while a dead one may take the store's timeout, and then the thread ends on its
    /// own, detached. Never detaching a thread that is about to finish matters: a detached watchdog may hold
    /// the group's last reference and tear its communicators down while the process exits.
    pub(crate) fn stop_threads(&self, device: &B::Device) {
        self.signal_stop(device);
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        let me = std::thread::current().id();
        if self.watchdog_stuck.load(Ordering::SeqCst) {
            return;
        }
        let never = AtomicBool::new(false);
        let deadline = device.now() + STORE_OP_STOP_WAIT;
        for thread in threads {
            if thread.thread().id() == me {
                continue;
            }
            let in_store_op = || self.in_store_op.load(Ordering::SeqCst) > 0;
            while in_store_op() && !thread.is_finished() && device.now() < deadline {
                device.sleep(Duration::from_millis(1), &never);
            }
            if in_store_op() && !thread.is_finished() {
                tracing::warn!(target: "pg", "a process-group thread is still inside a store operation; detaching it");
                continue;
            }
            if thread.join().is_err() {
                tracing::error!(target: "pg", "a process-group watchdog thread panicked");
            }
        }
    }
}

/// What the watchdog needs from its group; implemented by the group's shared state.
pub(crate) trait GroupView<B: Backend>: Send + Sync + 'static {
    /// The reliability state.
    fn rel(&self) -> &Reliability<B>;
    /// The group's store.
    fn store(&self) -> &dyn Store;
    /// The group's options.
    fn options(&self) -> &Options;
    /// The rank's device.
    fn device(&self) -> &B::Device;
    /// This rank.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// The process-wide id of the group.
    fn local_id(&self) -> u64;
    /// Every communicator of the group.
    fn comms(&self) -> Vec<Arc<B::Communicator>>;
    /// Aborts every communicator of the group.
    fn abort_comms(&self, reason: &str);
    /// Makes every later call of the group return `error` (the first such error stays).
    fn tear_down(&self, error: Error);
}

/// Starts the watchdog and, when monitoring is on, the heartbeat monitor of `group`.
pub(crate) fn start<B: Backend, G: GroupView<B>>(group: &Arc<G>) -> Result<()> {
    let options = group.options();
    if !options.enable_watchdog {
        return Ok(());
    }
    let device = group.device().clone();
    let signals = Arc::clone(&group.rel().signals);
    let tag = format!("pg{} rank {}", group.local_id(), group.rank());
    let (weak, period) = (Arc::downgrade(group), options.watchdog_period);
    let (d, s) = (device.clone(), Arc::clone(&signals));
    let watchdog = device.spawn_host_thread(
        &format!("pt_nccl_watchdg ({tag})"),
        Box::new(move || watchdog_loop(&weak, &d, &s, period)),
    )?;
    group.rel().threads.lock().unwrap_or_else(PoisonError::into_inner).push(watchdog);
    if options.enable_monitoring {
        let (weak, timeout) = (Arc::downgrade(group), options.heartbeat_timeout);
        let d = device.clone();
        let monitor = device.spawn_host_thread(
            &format!("pt_nccl_heartbt ({tag})"),
            Box::new(move || crate::heartbeat::monitor_loop(&weak, &d, &signals, timeout)),
        )?;
        group.rel().threads.lock().unwrap_or_else(PoisonError::into_inner).push(monitor);
    }
    Ok(())
}

fn watchdog_loop<B: Backend, G: GroupView<B>>(
    group: &Weak<G>,
    device: &B::Device,
    signals: &Signals,
    period: Duration,
) {
    while !signals.terminate.load(Ordering::SeqCst) {
        let sleep = match group.upgrade() {
            Some(group) => {
                pass(group.as_ref());
                idle_sleep(group.as_ref(), signals).unwrap_or(period)
            }
            None => break,
        };
        device.sleep(sleep, &signals.wake);
        signals.idle.store(false, Ordering::SeqCst);
        if !signals.terminate.load(Ordering::SeqCst) {
            signals.wake.store(false, Ordering::SeqCst);
        }
    }
}

/// How long the watchdog may sleep when it is idle (nothing in flight, no peer to listen to every period), or
/// `None` when it is not: the coordination period while a peer's dump request may come, else [`IDLE_SLEEP`].
/// A new Work wakes it ([`Reliability::track`]); on the simulated backend, an idle watchdog lets the clock jump.
fn idle_sleep<B: Backend, G: GroupView<B>>(group: &G, signals: &Signals) -> Option<Duration> {
    let options = group.options();
    if options.propagate_error {
        return None;
    }
    // Announce idleness before looking at the list, so that a Work pushed meanwhile sees it and wakes us.
    signals.idle.store(true, Ordering::SeqCst);
    let rel = group.rel();
    if !rel.lock_works().is_empty() {
        signals.idle.store(false, Ordering::SeqCst);
        return None;
    }
    let cell = rel.lock_status();
    let dump_request_possible = options.dump_on_timeout && !cell.dumped && rel.last_enqueued().is_some();
    Some(if dump_request_possible { options.watchdog_period.max(COORD_CHECK_PERIOD) } else { IDLE_SLEEP })
}

/// One watchdog pass over the in-flight Works.
fn pass<B: Backend, G: GroupView<B>>(group: &G) {
    let rel = group.rel();
    rel.heartbeat.fetch_add(1, Ordering::Relaxed);
    let stall = rel.stall.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(stall) = stall {
        // The injected wedge: as a watchdog stuck in a driver call, it holds the group and makes no progress.
        group.device().sleep(stall, &rel.signals.terminate);
    }
    let options = group.options();
    if options.propagate_error {
        check_remote_error(group);
    }
    if options.dump_on_timeout {
        check_dump_signal(group);
    }
    let works: Vec<Arc<WorkState<B>>> = rel.lock_works().clone();
    // Whether any Work is to leave the list (each is marked `retired`; the list may have grown meanwhile).
    let mut any_done = false;
    for work in &works {
        if !rel.signals.terminate.load(Ordering::SeqCst) {
            work.check_and_set_exception();
        }
        let timed_out = work.exception().is_none() && work.check_timeout(work.timeout);
        if let Some(error) = work.exception() {
            work.retired.store(true, Ordering::Relaxed);
            any_done = true;
            if let Some(id) = work.fr_id() {
                rel.recorder.retire(id, None);
            }
            tracing::error!(
                target: "pg",
                pg_id = group.local_id(),
                rank = group.rank(),
                seq = work.seq,
                op = %work.op,
                %error,
                "failure detected by watchdog at work sequence id: {}",
                work.seq
            );
            on_error(group, error, timed_out.then_some(work.as_ref()), Some(&work.entry.comm));
            continue;
        }
        note_started(group, work);
        if work.is_completed() {
            work.retired.store(true, Ordering::Relaxed);
            any_done = true;
            note_completed(group, work);
        }
    }
    let mut removed = Vec::new();
    if any_done {
        // One linear pass reading a flag, so that the enqueue path never waits behind a long scan.
        let mut list = rel.lock_works();
        let kept;
        (removed, kept) = std::mem::take(&mut *list).into_iter().partition(|work| work.retired.load(Ordering::Relaxed));
        *list = kept;
    }
    drop(works);
    rel.recycle(removed);
    // An asynchronous error with no Work in flight is still an error of the group.
    if rel.lock_status().status.error_type == ErrorType::Success {
        for comm in group.comms() {
            if comm.is_aborted() {
                continue;
            }
            if let Err(error) = comm.async_error() {
                on_error(group, error, None, Some(&comm));
                break;
            }
        }
    }
    rel.heartbeat.fetch_add(1, Ordering::Relaxed);
}

/// Notes that `work` started, when its start event says so (only with start events: desync debugging).
fn note_started<B: Backend, G: GroupView<B>>(group: &G, work: &WorkState<B>) {
    let Some(start) = &work.start_event else { return };
    if work.op.is_p2p() || !start.query().unwrap_or(false) {
        return;
    }
    let rel = group.rel();
    let newer = {
        let mut cell = rel.lock_status();
        let newer = cell.status.last_started_seq < Some(work.seq);
        if newer {
            cell.status.last_started_seq = Some(work.seq);
        }
        newer
    };
    if newer {
        if let Some(id) = work.fr_id() {
            rel.recorder.mark_started(id, nanos(group.device().now()));
        }
        trace_update(group, &trace_start_key(group.rank()), work);
    }
}

/// The bookkeeping of a completed Work: stash released, flight recorder retired, status and trace keys.
fn note_completed<B: Backend, G: GroupView<B>>(group: &G, work: &WorkState<B>) {
    let rel = group.rel();
    work.stash.lock().unwrap_or_else(PoisonError::into_inner).clear();
    if let Some(id) = work.fr_id() {
        rel.recorder.retire(id, Some(nanos(group.device().now())));
    }
    if work.op.is_p2p() {
        return;
    }
    let (newer_start, newer_end) = {
        let mut cell = rel.lock_status();
        let status = &mut cell.status;
        let newer_start = work.start_event.is_some() && status.last_started_seq < Some(work.seq);
        if newer_start {
            status.last_started_seq = Some(work.seq);
        }
        let newer_end = status.last_completed_seq < Some(work.seq);
        if newer_end {
            status.last_completed_seq = Some(work.seq);
            status.last_completed_op = Some(work.op);
        }
        (newer_start, newer_end)
    };
    if newer_start {
        trace_update(group, &trace_start_key(group.rank()), work);
    }
    if newer_end {
        trace_update(group, &trace_end_key(group.rank()), work);
    }
}

/// Runs a store operation for the watchdog unless the group is stopping; marked as under way meanwhile.
fn store_op<B: Backend, G: GroupView<B>, R>(group: &G, op: impl FnOnce(&dyn Store) -> R) -> Option<R> {
    let rel = group.rel();
    if rel.signals.terminate.load(Ordering::SeqCst) {
        return None;
    }
    rel.in_store_op.fetch_add(1, Ordering::SeqCst);
    let result = op(group.store());
    rel.in_store_op.fetch_sub(1, Ordering::SeqCst);
    Some(result)
}

/// Writes a desync trace key; the first store failure turns desync tracing off, as in PyTorch.
fn trace_update<B: Backend, G: GroupView<B>>(group: &G, key: &str, work: &WorkState<B>) {
    let rel = group.rel();
    if !group.options().desync_debug || rel.store_broken.load(Ordering::Relaxed) {
        return;
    }
    if let Some(Err(error)) = store_op(group, |store| store.set(key, &encode_trace(work.seq, work.op))) {
        tracing::warn!(target: "pg", pg_id = group.local_id(), %error, "desync trace update failed; turning it off");
        rel.store_broken.store(true, Ordering::Relaxed);
    }
}

/// Handles an error the watchdog or the heartbeat monitor found: sticky state, desync report, signals to the
/// peers, flight-recorder dump, then the error-handling mode.
pub(crate) fn on_error<B: Backend, G: GroupView<B>>(
    group: &G,
    error: Error,
    timed_out: Option<&WorkState<B>>,
    comm: Option<&Arc<B::Communicator>>,
) {
    let rel = group.rel();
    let options = group.options();
    let first = record_first_error(group, &error);
    if let (Some(work), true) = (timed_out, options.desync_debug) {
        match store_op(group, |store| DesyncReport::retrieve(store, group.rank(), group.size(), work.seq, work.op)) {
            None => {}
            Some(Ok(report)) => {
                tracing::error!(target: "pg", pg_id = group.local_id(), rank = group.rank(), "{report}");
                rel.lock_status().desync.get_or_insert(report);
            }
            Some(Err(error)) => tracing::warn!(target: "pg", %error, "could not read the desync report from the store"),
        }
    }
    if first && !rel.store_broken.load(Ordering::Relaxed) {
        let rank = i32::try_from(group.rank()).unwrap_or(i32::MAX).to_ne_bytes();
        if options.propagate_error && error.kind() != ErrorKind::Remote {
            signal(group, &remote_error_key(&options.group_name), &rank);
        }
        if options.dump_on_timeout {
            signal(group, EXCEPTION_DUMP_KEY, &rank);
        }
    }
    if first && options.dump_on_timeout {
        dump_once(group);
    }
    let mode = options.error_handling;
    if options.end_process_on_error && mode.should_tear_down() {
        // As PyTorch: nothing of the failed group runs on, so no thread gets to see or use its data.
        end_process(group.rank(), &error);
    }
    // The failure is made visible before any data can be read: the group is torn down and the device poisoned
    // first, then the streams blocked behind the failed op are drained by the aborts (a read they wake fails).
    if mode.should_tear_down() {
        group.tear_down(error.clone());
    }
    poison_device(group.device(), &error);
    if mode.aborts_communicators() {
        // The in-flight Works fail with the error that makes their communicators go, not with a bare abort.
        for work in rel.lock_works().iter() {
            work.set_exception(error.clone());
        }
        let reason = format!("rank {}: {error}", group.rank());
        if let Some(comm) = comm {
            if let Err(abort_error) = comm.abort(&reason) {
                tracing::warn!(target: "pg", %abort_error, "aborting the failed communicator failed");
            }
        }
        group.abort_comms(&reason);
    }
    if mode.should_tear_down() {
        rel.fail_in_flight(&error);
    }
}

/// Records `error` in the device's failure record and wakes host threads blocked on the device.
pub(crate) fn poison_device<D: Device>(device: &D, error: &Error) {
    if device.poison().set(error) {
        tracing::error!(target: "pg", %error, "reads and synchronisations on {} now fail with this error", device.describe());
    }
    device.notify_host_threads();
}

/// Ends the process as PyTorch does after a fatal error of a process group (`Options::end_process_on_error`).
pub(crate) fn end_process(rank: usize, error: &Error) -> ! {
    tracing::error!(
        target: "pg",
        rank,
        %error,
        "to avoid data inconsistency, the process is ended (end_process_on_error is set)"
    );
    eprintln!("pg: rank {rank}: {error}; to avoid data inconsistency, ending the process (end_process_on_error)");
    std::process::abort()
}

/// Records `error` as the group's sticky error unless one is there; returns whether it was the first.
pub(crate) fn record_first_error<B: Backend, G: GroupView<B>>(group: &G, error: &Error) -> bool {
    let now = group.device().now();
    let mut cell = group.rel().lock_status();
    let first = cell.status.error_type == ErrorType::Success;
    if first {
        cell.status.error_type = ErrorType::of(error);
        cell.status.error = Some(error.clone());
        cell.status.error_detected_at = Some(now);
    }
    first
}

fn signal<B: Backend, G: GroupView<B>>(group: &G, key: &str, value: &[u8]) {
    if let Some(Err(error)) = store_op(group, |store| store.set(key, value)) {
        tracing::warn!(target: "pg", pg_id = group.local_id(), key, %error, "could not signal the peers");
        group.rel().store_broken.store(true, Ordering::Relaxed);
    }
}

fn read_rank(value: &[u8]) -> Option<usize> {
    let bytes: [u8; 4] = value.get(..4)?.try_into().ok()?;
    usize::try_from(i32::from_ne_bytes(bytes)).ok()
}

/// Reads the `remote_error:{pg_uid}` key: a peer that failed makes this group fail too.
fn check_remote_error<B: Backend, G: GroupView<B>>(group: &G) {
    let rel = group.rel();
    if rel.store_broken.load(Ordering::Relaxed) || rel.lock_status().status.error_type != ErrorType::Success {
        return;
    }
    let key = remote_error_key(&group.options().group_name);
    let read = |store: &dyn Store| match store.check(&[&key]) {
        Ok(true) => Ok(store.get(&key).ok().as_deref().and_then(read_rank)),
        Ok(false) => Ok(None),
        Err(error) => Err(error),
    };
    let failed = match store_op(group, read) {
        None | Some(Ok(None)) => None,
        Some(Ok(rank)) => rank,
        Some(Err(error)) => {
            tracing::warn!(target: "pg", %error, "could not check for a remote error; no longer checking");
            rel.store_broken.store(true, Ordering::Relaxed);
            None
        }
    };
    if let Some(rank) = failed.filter(|rank| *rank != group.rank()) {
        tracing::error!(target: "pg", pg_id = group.local_id(), rank = group.rank(), failed = rank, "a peer failed");
        on_error(group, Error::Remote { rank }, None, None);
    }
}

/// Looks for a peer's request to dump (the `exception_dump` key), at most once per coordination period.
fn check_dump_signal<B: Backend, G: GroupView<B>>(group: &G) {
    let rel = group.rel();
    let now = group.device().now();
    {
        let mut cell = rel.lock_status();
        if cell.dumped || rel.last_enqueued().is_none() || now < cell.next_coord_check {
            return;
        }
        cell.next_coord_check = now + COORD_CHECK_PERIOD;
    }
    if rel.store_broken.load(Ordering::Relaxed) {
        return;
    }
    let read = |store: &dyn Store| match store.check(&[EXCEPTION_DUMP_KEY]) {
        Ok(true) => Some(store.get(EXCEPTION_DUMP_KEY).ok().as_deref().and_then(read_rank)),
        _ => None,
    };
    if let Some(Some(from)) = store_op(group, read) {
        tracing::error!(target: "pg", pg_id = group.local_id(), rank = group.rank(), ?from, "a peer asked for a dump");
        dump_once(group);
    }
}

/// Dumps the flight recorder to this rank's file unless this group already did.
pub(crate) fn dump_once<B: Backend, G: GroupView<B>>(group: &G) {
    let first = !std::mem::replace(&mut group.rel().lock_status().dumped, true);
    if first {
        if let Err(error) = dump(group) {
            tracing::error!(target: "pg", %error, "flight recorder dump failed");
        }
    }
}

/// The flight recorder of `group` as JSON.
pub(crate) fn dump_json<B: Backend, G: GroupView<B>>(group: &G) -> serde_json::Value {
    let status = group.rel().status();
    let options = group.options();
    let versions = group.device().versions();
    let comm_lib_version = versions
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("nccl"))
        .map_or_else(|| B::NAME.to_owned(), |(_, version)| version.clone());
    group.rel().recorder.dump(&DumpHeader {
        pg_id: group.local_id(),
        name: options.group_name.clone(),
        desc: options.group_desc.clone(),
        rank: group.rank(),
        size: group.size(),
        comm_lib_version,
        last_enqueued: status.last_enqueued_seq,
        last_started: status.last_started_seq,
        last_completed: status.last_completed_seq,
    })
}

/// Writes the flight recorder to `{dump_path_prefix}{rank}` and returns the path.
pub(crate) fn dump<B: Backend, G: GroupView<B>>(group: &G) -> Result<std::path::PathBuf> {
    let path = dump_path(&group.options().dump_path_prefix, group.rank());
    write_dump(&path, &dump_json(group))?;
    group.rel().lock_status().status.dumps_written += 1;
    tracing::info!(target: "pg", pg_id = group.local_id(), rank = group.rank(), path = %path.display(), "flight recorder dumped");
    Ok(path)
}

/// A heartbeat the monitor compares between two looks.
pub(crate) fn heartbeat<B: Backend, G: GroupView<B>>(group: &G) -> u64 {
    group.rel().heartbeat.load(Ordering::Relaxed)
}

/// Marks the watchdog as stuck, so that no one waits for it to stop.
pub(crate) fn mark_stuck<B: Backend>(rel: &Reliability<B>) {
    rel.watchdog_stuck.store(true, Ordering::SeqCst);
}

fn nanos(time: Duration) -> u64 {
    u64::try_from(time.as_nanos()).unwrap_or(u64::MAX)
}
