//! The in-flight list: the Works a group still watches (or, without a watchdog, keeps for abort), fed by the
//! enqueue path through a lock-free bounded intake, with their flight-recorder entries, and the last collective
//! enqueued.
//!
//! The enqueue path only pushes a new Work onto the intake (a bounded lock-free queue) and bumps an atomic mark.
//! Whoever reads the list next (the watchdog's pass, an abort, a status or flight-recorder read) first moves the
//! intake onto the list under the list's lock and records those Works in the flight recorder under one lock for
//! the batch. So the list, the recorder's ring and their locks belong to the readers; the enqueue path takes a
//! lock only when the intake is full (no reader came for [`INTAKE_CAPACITY`] ops), and then moves the batch itself.
//!
//! A recorder entry holds no event: until it is retired, its op's Work stays on the list (every path that takes
//! Works off retires their entries first, or under the list's lock), and a dump, made under the list's lock, asks
//! the Works' events for the state of the entries not yet retired.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_queue::ArrayQueue;

use crate::flight_recorder::{nanos, DumpHeader, FlightRecorder, NewEntry, Progress};
use crate::json::Value;
use crate::locks::lock;
use crate::reuse::WorkPool;
use crate::work::WorkState;
use crate::{Backend, Device as _, Error, Event as _, OpType};

/// Without a watchdog, the list is pruned once it holds this many Works (or twice as many as the last pruning
/// kept).
const MIN_PRUNE_LEN: usize = 64;

/// The Works the intake holds at most: beyond it, the enqueue path moves the intake onto the list itself.
pub(crate) const INTAKE_CAPACITY: usize = 4096;

/// The intake's length at which the enqueue path wakes a watchdog to take it: half the capacity, so that
/// a watchdog woken on a busy host has the other half of the intake's time left to come, and a busy group wakes
/// it once per half an intake of ops.
pub(crate) const WAKE_AT: usize = INTAKE_CAPACITY / 2;

/// The Works in flight of one group.
pub(crate) struct InFlight<B: Backend> {
    /// New Works not yet on the list (nor in the flight recorder): the enqueue path's only shared write.
    intake: ArrayQueue<Arc<WorkState<B>>>,
    works: Mutex<Vec<Arc<WorkState<B>>>>,
    recorder: Arc<FlightRecorder>,
    /// Where Works pruned without a watchdog go, for reuse.
    pool: Arc<WorkPool<B>>,
    /// Whether a watchdog takes Works off the list; without one, moving the intake prunes the list.
    watched: bool,
    /// Without a watchdog, the list's length at which the next move of the intake prunes it.
    prune_at: AtomicUsize,
    /// The last collective enqueued, packed as `seq << 8 | op as u8` (0: none yet), so that the enqueue path
    /// takes no lock for it.
    last_enqueued: AtomicU64,
    /// How often the enqueue path found the intake full and moved it itself.
    overflows: AtomicU64,
}

/// Whether the enqueue path should wake the watchdog after a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// The intake is below [`WAKE_AT`] (or past it already): an idle watchdog is still woken.
    Queued,
    /// The intake reached [`WAKE_AT`] with this push: the watchdog should come and take it.
    Wake,
}

impl<B: Backend> InFlight<B> {
    /// An empty list whose new Works are recorded in `recorder`; `watched` says whether a watchdog takes them off
    /// (without one, the Works pruned go to `pool`).
    pub(crate) fn new(recorder: Arc<FlightRecorder>, pool: Arc<WorkPool<B>>, watched: bool) -> Self {
        Self {
            intake: ArrayQueue::new(INTAKE_CAPACITY),
            works: Mutex::new(Vec::new()),
            recorder,
            pool,
            watched,
            prune_at: AtomicUsize::new(MIN_PRUNE_LEN),
            last_enqueued: AtomicU64::new(0),
            overflows: AtomicU64::new(0),
        }
    }

    /// The list, with the intake moved onto it first (and recorded in the flight recorder): every reader of the
    /// list sees every Work enqueued before it looked.
    fn list(&self) -> MutexGuard<'_, Vec<Arc<WorkState<B>>>> {
        let mut works = lock(&self.works);
        self.take_intake(&mut works);
        works
    }

    /// Moves the intake onto `works`, recording the moved Works in the flight recorder in their enqueue order.
    fn take_intake(&self, works: &mut Vec<Arc<WorkState<B>>>) {
        let first = works.len();
        while let Some(work) = self.intake.pop() {
            works.push(work);
        }
        let new = &works[first..];
        if !new.is_empty() && self.recorder.is_on() {
            let mut recorded = new.iter();
            self.recorder.record_all(new.iter().map(|work| new_entry(work, false)), |id| {
                if let Some(work) = recorded.next() {
                    work.fr_id.store(id, Ordering::Relaxed);
                }
            });
        }
        if !self.watched && works.len() >= self.prune_at.load(Ordering::Relaxed) {
            self.prune(works);
        }
    }

    /// Without a watchdog the list serves abort only: it keeps the Works whose op still runs, so that an abort
    /// from another thread fails them and reaches a blocked wait; a Work leaves once its op is done (until then its
    /// stash may guard its buffers), as the watchdog retires it, its flight-recorder entry retired and the Work
    /// offered to the reuse pool. Pruning runs when the list has doubled since the last time, so it costs O(1) per
    /// op.
    fn prune(&self, works: &mut Vec<Arc<WorkState<B>>>) {
        WorkState::observe_ends(works);
        let left = self.split_off(works, |work| work.ended.load(Ordering::Acquire) || work.exception().is_some());
        let Some(now) = left.first().map(|work| nanos(work.entry.device.now())) else { return };
        // The completed ones under one lock of the recorder, as a watchdog pass retires them; a failed one keeps
        // its last state.
        let mut completed = Vec::with_capacity(left.len());
        for work in &left {
            match (work.fr_id(), work.exception().is_none()) {
                (Some(id), true) => completed.push(id),
                (Some(id), false) => self.recorder.retire(id, None),
                (None, _) => {}
            }
        }
        self.recorder.retire_completed(&completed, now);
        self.pool.put(left);
    }

    /// With a watchdog: moves the intake onto the list and, once the list has doubled since the last time, takes
    /// off it the Works whose op was seen finished without an error, releases their stash and retires their
    /// recorder entries as completed now (under the list's lock, so that a dump never finds an entry open whose
    /// Work has left the list), and returns them for the rest of the caller's bookkeeping
    /// (`Shared::retire_finished`); failed and running Works stay for the watchdog.
    pub(crate) fn take_finished(&self) -> Vec<Arc<WorkState<B>>> {
        let mut works = self.list();
        if works.len() < self.prune_at.load(Ordering::Relaxed) {
            return Vec::new();
        }
        WorkState::observe_ends(&works);
        let finished =
            self.split_off(&mut works, |work| work.exception().is_none() && work.ended.load(Ordering::Acquire));
        if let Some(now) = finished.first().map(|work| nanos(work.entry.device.now())) {
            let mut completed = Vec::with_capacity(finished.len());
            for work in &finished {
                work.release_completed(&mut completed);
            }
            self.recorder.retire_completed(&completed, now);
        }
        finished
    }

    /// Takes the Works for which `leaves` holds off `works`, and sets the next pruning mark at twice what stays (so
    /// that pruning costs O(1) per op).
    fn split_off(
        &self,
        works: &mut Vec<Arc<WorkState<B>>>,
        leaves: impl FnMut(&Arc<WorkState<B>>) -> bool,
    ) -> Vec<Arc<WorkState<B>>> {
        let (left, kept): (Vec<_>, Vec<_>) = std::mem::take(works).into_iter().partition(leaves);
        *works = kept;
        self.prune_at.store((2 * works.len()).max(MIN_PRUNE_LEN), Ordering::Relaxed);
        left
    }

    /// Adds a new Work. Takes no lock unless the intake is full.
    pub(crate) fn push(&self, work: &Arc<WorkState<B>>) -> Pushed {
        if !work.op.is_p2p() {
            // Collectives are enqueued in sequence order; a racing thread never moves the mark backwards.
            self.last_enqueued.fetch_max(work.seq << 8 | work.op as u64, Ordering::AcqRel);
        }
        let mut work = Arc::clone(work);
        while let Err(back) = self.intake.push(work) {
            work = back;
            self.overflows.fetch_add(1, Ordering::Relaxed);
            self.settle();
        }
        match self.watched && self.intake.len() == WAKE_AT {
            true => Pushed::Wake,
            false => Pushed::Queued,
        }
    }

    /// How often the enqueue path found the intake full (and took the list's lock to move it).
    pub(crate) fn overflows(&self) -> u64 {
        self.overflows.load(Ordering::Relaxed)
    }

    /// Moves the intake onto the list (and into the flight recorder), so that a reader of the recorder sees every
    /// Work enqueued so far.
    pub(crate) fn settle(&self) {
        drop(self.list());
    }

    /// The Works on the list now.
    pub(crate) fn snapshot(&self) -> Vec<Arc<WorkState<B>>> {
        self.list().clone()
    }

    /// How many Works are in flight (on the list or in the intake).
    pub(crate) fn len(&self) -> usize {
        self.list().len()
    }

    /// Sets `error` on every Work on the list, leaving them there.
    pub(crate) fn set_exception_all(&self, error: &Error) {
        for work in self.list().iter() {
            work.set_exception(error.clone());
        }
    }

    /// The Works on the list for which `on` holds and whose end event has passed. Taken before an abort, this
    /// is what the abort cannot drain: after it, an end event that passes says nothing about the op. (An op that
    /// ends between this look and the abort is failed with the rest: a false failure, never a false success.)
    pub(crate) fn finished(&self, on: impl Fn(&WorkState<B>) -> bool) -> Vec<Arc<WorkState<B>>> {
        let mut works: Vec<_> = self.list().iter().filter(|work| on(work)).cloned().collect();
        WorkState::observe_ends(&works);
        works.retain(|work| work.ended.load(Ordering::Acquire));
        works
    }

    /// Sets `error` on every Work on the list for which `on` holds, except those in `finished` (see
    /// [`InFlight::finished`]), leaving them on the list.
    pub(crate) fn fail_unfinished(
        &self,
        on: impl Fn(&WorkState<B>) -> bool,
        finished: &[Arc<WorkState<B>>],
        error: &Error,
    ) {
        // A set of the finished Works' addresses: one pass over the list whatever its length (a list that grew
        // long, a watchdog that passes seldom, must not make an abort or a shutdown quadratic).
        let finished: HashSet<*const WorkState<B>> = finished.iter().map(Arc::as_ptr).collect();
        for work in self.list().iter() {
            if on(work) && !finished.contains(&Arc::as_ptr(work)) {
                work.set_exception(error.clone());
            }
        }
    }

    /// Takes every Work off the list, retiring their recorder entries in their last state (under the list's lock:
    /// a dump never finds an entry open whose Work has left the list).
    pub(crate) fn take_all(&self) -> Vec<Arc<WorkState<B>>> {
        let mut works = self.list();
        for id in works.iter().filter_map(|work| work.fr_id()) {
            self.recorder.retire(id, None);
        }
        std::mem::take(&mut *works)
    }

    /// The flight recorder's dump, made under the list's lock (the intake moved in first): the entries not yet
    /// retired take their state from their Works' events, queried now (a start event only with desync debugging).
    pub(crate) fn dump(&self, header: &DumpHeader) -> Value {
        let works = self.list();
        let progress: HashMap<u64, Progress> = works
            .iter()
            .filter_map(|work| {
                let passed = |event: &B::Event| event.query().unwrap_or(false);
                let started = work.start_event.as_deref().is_some_and(passed);
                Some((work.fr_id()?, Progress { started, completed: passed(&work.end_event) }))
            })
            .collect();
        self.recorder.dump(header, &progress)
    }

    /// Takes the Works marked `retired` off the list, in one linear pass reading a flag. The intake is not moved:
    /// the Works in it are new, and the enqueue path never waits behind this pass.
    pub(crate) fn take_retired(&self) -> Vec<Arc<WorkState<B>>> {
        let mut list = lock(&self.works);
        let (retired, kept) =
            std::mem::take(&mut *list).into_iter().partition(|work| work.retired.load(Ordering::Relaxed));
        *list = kept;
        retired
    }

    /// The sequence number and type of the last collective enqueued.
    pub(crate) fn last_enqueued(&self) -> Option<(u64, OpType)> {
        match self.last_enqueued.load(Ordering::Acquire) {
            0 => None,
            packed => Some((packed >> 8, OpType::ALL[(packed & 0xff) as usize])),
        }
    }
}

/// The flight-recorder entry of a Work: a captured one is marked so (its events belong to the capture, and the
/// watchdog never sees it); another's state is asked of its events at dump time while it is not retired.
#[inline]
pub(crate) fn new_entry<B: Backend>(work: &WorkState<B>, captured: bool) -> NewEntry {
    NewEntry {
        seq: work.seq,
        op: work.op,
        time_created_ns: nanos(work.start_time),
        input: work.input,
        output: work.output,
        lists: work.lists.clone(),
        timeout_ms: u64::try_from(work.timeout.as_millis()).unwrap_or(u64::MAX),
        captured,
        thread: work.thread,
    }
}
