//! The in-flight list: the Works a group still watches (or, without a watchdog, keeps for abort), and the last
//! collective enqueued.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::work::WorkState;
use crate::{Backend, Error, OpType};

/// Without a watchdog, the enqueue path prunes the in-flight list once it holds this many Works (or twice as
/// many as the last pruning kept).
const MIN_PRUNE_LEN: usize = 64;

/// The Works in flight of one group.
pub(crate) struct InFlight<B: Backend> {
    works: Mutex<Vec<Arc<WorkState<B>>>>,
    /// Without a watchdog, the list's length at which the enqueue path next prunes it.
    prune_at: AtomicUsize,
    /// The last collective enqueued, packed as `seq << 8 | op as u8` (0: none yet), so that the enqueue path
    /// takes no lock for it.
    last_enqueued: AtomicU64,
}

impl<B: Backend> Default for InFlight<B> {
    fn default() -> Self {
        Self {
            works: Mutex::new(Vec::new()),
            prune_at: AtomicUsize::new(MIN_PRUNE_LEN),
            last_enqueued: AtomicU64::new(0),
        }
    }
}

impl<B: Backend> InFlight<B> {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<WorkState<B>>>> {
        self.works.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a new Work; `watched` says whether a watchdog will take it off the list.
    pub(crate) fn push(&self, work: &Arc<WorkState<B>>, watched: bool) {
        if !work.op.is_p2p() {
            // Collectives are enqueued in sequence order; a racing thread never moves the mark backwards.
            self.last_enqueued.fetch_max(work.seq << 8 | work.op as u64, Ordering::AcqRel);
        }
        let mut works = self.lock();
        if !watched && works.len() >= self.prune_at.load(Ordering::Relaxed) {
            // With no watchdog (blocking wait) the list serves abort only: it keeps the Works whose op still runs,
            // so that an abort from another thread fails them and reaches a blocked wait; a Work leaves once its
            // op is done (until then its stash may guard its buffers), as the watchdog retires it.
            // Pruning runs when the list has doubled since the last time, so it costs O(1) per op.
            works.retain(|work| !work.observe_end() && work.exception().is_none());
            self.prune_at.store((2 * works.len()).max(MIN_PRUNE_LEN), Ordering::Relaxed);
        }
        works.push(Arc::clone(work));
    }

    /// The Works on the list now.
    pub(crate) fn snapshot(&self) -> Vec<Arc<WorkState<B>>> {
        self.lock().clone()
    }

    /// How many Works are on the list.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Sets `error` on every Work on the list, leaving them there.
    pub(crate) fn set_exception_all(&self, error: &Error) {
        for work in self.lock().iter() {
            work.set_exception(error.clone());
        }
    }

    /// The Works on the list for which `on` holds and whose end event has passed. Taken before an abort, this
    /// is what the abort cannot drain: after it, an end event that passes says nothing about the op. (An op that
    /// ends between this look and the abort is failed with the rest: a false failure, never a false success.)
    pub(crate) fn finished(&self, on: impl Fn(&WorkState<B>) -> bool) -> Vec<Arc<WorkState<B>>> {
        let works = self.lock();
        works.iter().filter(|work| on(work) && work.observe_end()).cloned().collect()
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
        for work in self.lock().iter() {
            if on(work) && !finished.contains(&Arc::as_ptr(work)) {
                work.set_exception(error.clone());
            }
        }
    }

    /// Takes every Work off the list.
    pub(crate) fn take_all(&self) -> Vec<Arc<WorkState<B>>> {
        std::mem::take(&mut *self.lock())
    }

    /// Takes the Works marked `retired` off the list, in one linear pass reading a flag, so that the enqueue
    /// path never waits behind a long scan.
    pub(crate) fn take_retired(&self) -> Vec<Arc<WorkState<B>>> {
        let mut list = self.lock();
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
