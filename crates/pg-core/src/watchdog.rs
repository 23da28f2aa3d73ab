//! The watchdog (S21): one host thread per group that polls the in-flight Works every `watchdog_period`,
//! turns hangs and asynchronous communicator errors into typed errors, and does the completion bookkeeping.
//!
//! Each pass, for every in-flight Work: read the communicator's asynchronous error, check the Work's timeout,
//! note when it started and completed (flight recorder, last started and completed sequence numbers, desync
//! trace keys), release its stashed buffers once complete, and drop it from the list.
//! On the first error it hands over to [`crate::failure`]: sticky error state, desync report, signals to the
//! peers, flight-recorder dump, the device's failure record, and the error-handling mode.
//!
//! The watchdog never makes a blocking device call: it only queries events and asynchronous errors.
//! It sleeps and reads time only through the [`Device`], so it runs in virtual time on the simulated backend.
//! It holds the group weakly between passes, so dropping the last handle of the group stops it.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use pg_store::Store;

use crate::desync::{encode_trace, trace_end_key, trace_start_key};
use crate::failure::{dump_once, on_error};
use crate::flight_recorder::nanos;
use crate::locks::lock;
use crate::shared::Shared;
use crate::signals::{remote_error_key, Signals, EXCEPTION_DUMP_KEY};
use crate::status::ErrorType;
use crate::work::WorkState;
use crate::{Backend, Communicator, Device, Error, Event};

/// How often the watchdog looks for an `exception_dump` signal from a peer (`TORCH_NCCL_COORD_CHECK_MILSEC`).
const COORD_CHECK_PERIOD: Duration = Duration::from_secs(1);

/// How long an idle watchdog with nothing to poll sleeps, unless a new Work wakes it first.
const IDLE_SLEEP: Duration = Duration::from_secs(3600);

/// The watchdog's thread body: it holds the group only weakly while it sleeps.
///
/// A pass every `period` is a full one. The enqueue path also wakes the watchdog when the in-flight intake fills half
/// way ([`crate::in_flight::WAKE_AT`]); such an early pass only takes the intake in and retires the Works
/// that finished (the store is read at most once a period), and the next full pass keeps its time.
pub(crate) fn watchdog_loop<B: Backend>(
    group: &Weak<Shared<B>>,
    device: &B::Device,
    signals: &Signals,
    period: Duration,
) {
    // When the next full pass is due (`None`: the next pass is a full one, as after an idle sleep).
    let mut due: Option<Duration> = None;
    while !signals.terminate.load(Ordering::SeqCst) {
        let (sleep, idle) = match group.upgrade() {
            Some(group) => {
                #[cfg(feature = "testing")]
                stay_held(group.as_ref(), device, signals);
                let full = due.is_none_or(|due| device.now() >= due);
                pass(group.as_ref(), full);
                match idle_sleep(group.as_ref(), signals) {
                    Some(idle) => {
                        due = None;
                        (idle, true)
                    }
                    None if full => {
                        due = Some(device.now().saturating_add(period));
                        (period, false)
                    }
                    None => (due.map_or(period, |due| due.saturating_sub(device.now())), false),
                }
            }
            None => break,
        };
        let woken = sleep_until_woken(device, signals, sleep);
        if idle && woken {
            // The first Work after an idle spell woke the watchdog: its first pass comes a period later, as a
            // running watchdog's would, rather than at once beside the burst of ops that woke it (an intake filling
            // half way, or a stop, still cuts this short).
            sleep_until_woken(device, signals, period);
        }
    }
}

/// Sleeps for `duration` or until woken (a new Work for an idle watchdog, an intake filling, a stop); whether it was
/// woken. The wake is consumed, unless it is a stop.
fn sleep_until_woken<D: Device>(device: &D, signals: &Signals, duration: Duration) -> bool {
    device.sleep(duration, &signals.wake);
    signals.idle.store(false, Ordering::SeqCst);
    let woken = signals.wake.load(Ordering::SeqCst);
    if !signals.terminate.load(Ordering::SeqCst) {
        signals.wake.store(false, Ordering::SeqCst);
    }
    woken && !signals.terminate.load(Ordering::SeqCst)
}

/// The values of `Shared::watchdog_hold` (`testing` feature).
#[cfg(feature = "testing")]
pub(crate) mod hold {
    /// No hold.
    pub(crate) const FREE: u8 = 0;
    /// A test asked for the watchdog to stop between passes.
    pub(crate) const ASKED: u8 = 1;
    /// The watchdog stopped between passes, and stays so until the hold is let go or the group stops.
    pub(crate) const HELD: u8 = 2;
}

/// Stays between two passes while a test holds the watchdog (`ProcessGroup::hold_watchdog`), woken by whatever
/// would have woken it, running no pass.
#[cfg(feature = "testing")]
fn stay_held<B: Backend>(group: &Shared<B>, device: &B::Device, signals: &Signals) {
    let state = &group.watchdog_hold;
    if state.compare_exchange(hold::ASKED, hold::HELD, Ordering::SeqCst, Ordering::SeqCst).is_err() {
        return;
    }
    while state.load(Ordering::SeqCst) == hold::HELD && !signals.terminate.load(Ordering::SeqCst) {
        device.sleep(Duration::from_millis(10), &signals.wake);
        // As the loop itself: a stop's wake stays set for the sleep that follows.
        if !signals.terminate.load(Ordering::SeqCst) {
            signals.wake.store(false, Ordering::SeqCst);
        }
    }
}

/// How long the watchdog may sleep when it is idle (nothing in flight, no peer to listen to every period), or
/// `None` when it is not: the coordination period while a peer's dump request may come, else [`IDLE_SLEEP`].
/// A new Work wakes it ([`Shared::track`]); on the simulated backend, an idle watchdog lets the clock jump.
fn idle_sleep<B: Backend>(group: &Shared<B>, signals: &Signals) -> Option<Duration> {
    let options = &group.options;
    if options.signals_peers() || reads_liveness(group) {
        return None;
    }
    // Announce idleness before looking at the list, so that a Work pushed meanwhile sees it and wakes us.
    signals.idle.store(true, Ordering::SeqCst);
    if group.in_flight.len() > 0 {
        signals.idle.store(false, Ordering::SeqCst);
        return None;
    }
    let dump_request_possible =
        options.dump_on_timeout && !group.errors.dumped() && group.in_flight.last_enqueued().is_some();
    Some(if dump_request_possible { options.watchdog_period.max(COORD_CHECK_PERIOD) } else { IDLE_SLEEP })
}

/// Whether the watchdog reads the store for dead ranks: with liveness on, unless the heartbeat monitor does (it makes
/// no device call, so a watchdog held in a query of a communicator that lost its peer does not delay the news).
pub(crate) fn reads_liveness<B: Backend>(group: &Shared<B>) -> bool {
    group.store_link.has_liveness() && !group.options.enable_monitoring
}

/// One watchdog pass over the in-flight Works; a `full` one also reads the store for the peers' signals and the
/// communicators for asynchronous errors.
pub(crate) fn pass<B: Backend>(group: &Shared<B>, full: bool) {
    // One pass at a time (the watchdog's and a test's `watchdog_pass_now`): a Work is retired by the pass that
    // looked at it, with no other pass's snapshot holding it, so the pool can take it.
    let _one_pass = lock(&group.passes);
    group.threads.heartbeat.fetch_add(1, Ordering::Relaxed);
    #[cfg(feature = "testing")]
    {
        let stall = lock(&group.stall).take();
        if let Some(stall) = stall {
            // The injected wedge: as a watchdog stuck in a driver call, it holds the group and makes no progress,
            // and stopping the group does not end it.
            group.device.sleep(stall, &std::sync::atomic::AtomicBool::new(false));
        }
    }
    let options = &group.options;
    if full && options.signals_peers() {
        check_remote_error(group);
    }
    if full && reads_liveness(group) {
        check_dead_ranks(group);
    }
    if full && options.dump_on_timeout {
        check_dump_signal(group);
    }
    let works = group.in_flight.snapshot();
    // One event query per stream and thread for the Works whose ops have passed.
    WorkState::observe_ends(&works);
    // Whether any Work is to leave the list (each is marked `retired`; the list may have grown meanwhile).
    let mut any_done = false;
    // The flight-recorder entries of the Works seen completed, retired together (one lock for the pass).
    let mut completed = Vec::new();
    let retire_completed = |ids: &mut Vec<u64>| {
        group.recorder.retire_completed(ids, nanos(group.device.now()));
        ids.clear();
    };
    for work in &works {
        // One rule decides the outcome (`WorkState::is_completed`): an op seen finished is a success whatever its
        // communicator reports later (an asynchronous error then concerns the ops after it); one not yet finished
        // takes the communicator's asynchronous error, or fails once its communicator was stopped.
        let done = work.is_completed_observed();
        let timed_out = !done && work.check_timeout(work.timeout);
        if let Some(error) = work.exception() {
            work.retired.store(true, Ordering::Relaxed);
            any_done = true;
            if let Some(id) = work.fr_id() {
                group.recorder.retire(id, None);
            }
            tracing::error!(
                target: "pg",
                pg_id = group.local_id,
                rank = group.rank,
                seq = work.seq,
                op = %work.op,
                %error,
                "failure detected by watchdog at work sequence id: {}",
                work.seq
            );
            // An `Aborted` Work failed because its communicator was aborted on purpose (abort(), shutdown(), the
            // group's drop, a failed wait, an earlier error's clean-up), a `Revoked` one because the group was
            // revoked: that already did what an error calls for, so it is no new failure of the group (handling it
            // would poison the device again).
            if matches!(error.kind(), crate::ErrorKind::Aborted | crate::ErrorKind::Revoked) {
                continue;
            }
            // A dump on the error shows the completions seen so far.
            retire_completed(&mut completed);
            on_error(group, error, timed_out.then_some(work.as_ref()), Some(&work.entry.comm));
            continue;
        }
        note_started(group, work);
        if done {
            work.retired.store(true, Ordering::Relaxed);
            any_done = true;
            note_completed(group, work, &mut completed);
        }
    }
    // Before the retired Works leave the list: a dump, made under the list's lock, never finds an entry open whose
    // Work has left it.
    retire_completed(&mut completed);
    let removed = match any_done {
        true => group.in_flight.take_retired(),
        false => Vec::new(),
    };
    drop(works);
    group.reuse.put(removed);
    if let Some(tracer) = &group.tracer {
        // The device times of the ops that finished: event queries only.
        tracer.resolve();
    }
    // An asynchronous error with no Work in flight is still an error of the group.
    if full && group.errors.error_type() == ErrorType::Success {
        for comm in group.all_comms() {
            if comm.is_aborted() {
                continue;
            }
            if let Err(error) = comm.async_error() {
                on_error(group, error, None, Some(&comm));
                break;
            }
        }
    }
    group.threads.heartbeat.fetch_add(1, Ordering::Relaxed);
}

/// Notes that `work` started, when its start event says so (only with start events: desync debugging).
fn note_started<B: Backend>(group: &Shared<B>, work: &WorkState<B>) {
    let Some(start) = &work.start_event else { return };
    if work.op.is_p2p() || !start.query().unwrap_or(false) {
        return;
    }
    if group.errors.note_started(work.seq) {
        if let Some(id) = work.fr_id() {
            group.recorder.mark_started(id, nanos(group.device.now()));
        }
        trace_update(group, &trace_start_key(group.rank), work);
    }
}

/// The bookkeeping of a completed Work: stash released, its flight-recorder entry queued in `completed` for
/// retirement, status and trace keys.
fn note_completed<B: Backend>(group: &Shared<B>, work: &WorkState<B>, completed: &mut Vec<u64>) {
    work.release_completed(completed);
    if work.op.is_p2p() {
        return;
    }
    let (newer_start, newer_end) = group.errors.note_completed(work.seq, work.op, work.start_event.is_some());
    if !group.options.desync_debug {
        // No trace keys to write: nothing to name.
        return;
    }
    if newer_start {
        trace_update(group, &trace_start_key(group.rank), work);
    }
    if newer_end {
        trace_update(group, &trace_end_key(group.rank), work);
    }
}

/// Writes a desync trace key; the first store failure turns desync tracing off, as in PyTorch.
fn trace_update<B: Backend>(group: &Shared<B>, key: &str, work: &WorkState<B>) {
    if !group.options.desync_debug || group.store_link.broken.load(Ordering::Relaxed) {
        return;
    }
    if let Some(Err(error)) = group.store_op(|store| store.set(key, &encode_trace(work.seq, work.op))) {
        tracing::warn!(target: "pg", pg_id = group.local_id, %error, "desync trace update failed; turning it off");
        group.store_link.broken.store(true, Ordering::Relaxed);
    }
}

fn read_rank(value: &[u8]) -> Option<usize> {
    let bytes: [u8; 4] = value.get(..4)?.try_into().ok()?;
    usize::try_from(i32::from_ne_bytes(bytes)).ok()
}

/// Reads the `remote_error:{pg_uid}` key: a peer that failed makes this group fail too.
fn check_remote_error<B: Backend>(group: &Shared<B>) {
    if group.store_link.broken.load(Ordering::Relaxed) || group.errors.error_type() != ErrorType::Success {
        return;
    }
    let key = remote_error_key(&group.options.group_name);
    let read = |store: &dyn Store| match store.check(&[&key]) {
        Ok(true) => Ok(store.get(&key).ok().as_deref().and_then(read_rank)),
        Ok(false) => Ok(None),
        Err(error) => Err(error),
    };
    let failed = match group.store_op(read) {
        None | Some(Ok(None)) => None,
        Some(Ok(rank)) => rank,
        Some(Err(error)) => {
            tracing::warn!(target: "pg", %error, "could not check for a remote error; no longer checking");
            group.store_link.broken.store(true, Ordering::Relaxed);
            None
        }
    };
    if let Some(rank) = failed.filter(|rank| *rank != group.rank) {
        tracing::error!(target: "pg", pg_id = group.local_id, rank = group.rank, failed = rank, "a peer failed");
        on_error(group, Error::Remote { rank }, None, None);
    }
}

/// Reads the store for a rank whose liveness connection closed ([`crate::Options::liveness`]): such a rank is dead,
/// and the group fails as with a peer's remote error (revoking with `revoke_on_error`).
pub(crate) fn check_dead_ranks<B: Backend>(group: &Shared<B>) {
    if group.store_link.broken.load(Ordering::Relaxed) || group.errors.error_type() != ErrorType::Success {
        return;
    }
    let dead = match group.store_op(|store| crate::liveness::dead_ranks(store, group.size, group.rank)) {
        None => return,
        Some(Ok(dead)) => dead,
        Some(Err(error)) => {
            tracing::warn!(target: "pg", %error, "could not read the store for dead ranks; no longer reading it");
            group.store_link.broken.store(true, Ordering::Relaxed);
            return;
        }
    };
    if let Some(&rank) = dead.first() {
        tracing::error!(target: "pg", pg_id = group.local_id, rank = group.rank, ?dead, "a peer's liveness connection closed");
        on_error(group, Error::RankDead { group: group.options.group_name.clone(), rank }, None, None);
    }
}

/// Looks for a peer's request to dump (the `exception_dump` key), at most once per coordination period.
fn check_dump_signal<B: Backend>(group: &Shared<B>) {
    if group.in_flight.last_enqueued().is_none()
        || !group.errors.coord_check_due(group.device.now(), COORD_CHECK_PERIOD)
    {
        return;
    }
    if group.store_link.broken.load(Ordering::Relaxed) {
        return;
    }
    let read = |store: &dyn Store| match store.check(&[EXCEPTION_DUMP_KEY]) {
        Ok(true) => Some(store.get(EXCEPTION_DUMP_KEY).ok().as_deref().and_then(read_rank)),
        _ => None,
    };
    if let Some(Some(from)) = group.store_op(read) {
        tracing::error!(target: "pg", pg_id = group.local_id, rank = group.rank, ?from, "a peer asked for a dump");
        dump_once(group);
    }
}
