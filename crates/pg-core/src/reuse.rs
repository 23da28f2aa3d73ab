//! The pool of completed Works for reuse: a Work that completed without error and that nothing else holds (no
//! handle, no `Future`, no flight-recorder entry) is kept, and the next op overwrites it in place, end event
//! included (`Options::reuse_works`), so that a steady stream of ops allocates nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::work::WorkState;
use crate::Backend;

/// The most completed Works kept for reuse per group: about one default watchdog period (100 ms) of ops at
/// 1.5 us per op, the rate of back-to-back small collectives on one GPU. A smaller pool makes every op beyond it
/// in a period allocate a Work and take an event that the watchdog frees and returns from its own thread.
const POOL_MAX: usize = 65536;

/// Completed Works that nothing else holds, for the enqueue path to reuse.
pub(crate) struct WorkPool<B: Backend> {
    works: Mutex<Vec<Arc<WorkState<B>>>>,
    /// The pool's length as of its last change, read without the lock: an empty pool (no watchdog, or none
    /// retired yet) costs the enqueue path one load. A stale read only makes one op allocate or lock in vain.
    len: AtomicUsize,
    enabled: bool,
}

impl<B: Backend> WorkPool<B> {
    /// An empty pool that keeps Works only when `enabled`.
    pub(crate) fn new(enabled: bool) -> Self {
        Self { works: Mutex::new(Vec::new()), len: AtomicUsize::new(0), enabled }
    }

    /// Keeps the retired Works that completed without error and that nothing else holds, up to [`POOL_MAX`];
    /// drops the others.
    pub(crate) fn put(&self, retired: Vec<Arc<WorkState<B>>>) {
        if !self.enabled {
            return;
        }
        let reusable = |work: &Arc<WorkState<B>>| {
            Arc::strong_count(work) == 1 && Arc::strong_count(&work.end_event) == 1 && work.exception().is_none()
        };
        // The others are dropped after the lock is released: the enqueue path takes it too.
        let mut others = Vec::new();
        let mut pool = self.works.lock().unwrap_or_else(PoisonError::into_inner);
        for work in retired {
            match reusable(&work) && pool.len() < POOL_MAX {
                true => pool.push(work),
                false => others.push(work),
            }
        }
        self.len.store(pool.len(), Ordering::Relaxed);
        drop(pool);
        drop(others);
    }

    /// A Work to reuse, with its end event: only this pool held it, so the caller may overwrite it.
    pub(crate) fn take(&self) -> Option<Arc<WorkState<B>>> {
        if self.len.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut pool = self.works.lock().unwrap_or_else(PoisonError::into_inner);
        let work = pool.pop();
        self.len.store(pool.len(), Ordering::Relaxed);
        drop(pool);
        let mut work = work?;
        (Arc::get_mut(&mut work).is_some() && Arc::strong_count(&work.end_event) == 1).then_some(work)
    }

    /// Drops every pooled Work (they hold the group's communicators: a stopping group lets them go).
    pub(crate) fn clear(&self) {
        let mut pool = self.works.lock().unwrap_or_else(PoisonError::into_inner);
        self.len.store(0, Ordering::Relaxed);
        let works = std::mem::take(&mut *pool);
        drop(pool);
        drop(works);
    }
}
