//! The pool of completed Works for reuse: a Work that completed without error is kept when the watchdog retires it,
//! and an op overwrites it in place, end event included, once nothing else holds it (no handle, no `Future`)
//! (`Options::reuse_works`), so that a steady stream of ops allocates nothing.

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;

use crate::work::WorkState;
use crate::Backend;

/// The most completed Works kept for reuse per group. The watchdog retires Works whenever the in-flight intake
/// fills half way ([`crate::in_flight::WAKE_AT`]), so a steady stream of ops finds the pool stocked long before
/// it runs dry; the pool's slots are allocated with the group (16 bytes each).
const POOL_MAX: usize = 4096;

/// How many pooled Works an op tries before it makes a new one (the others are still held by their callers).
const TRIES: usize = 4;

/// Completed Works, for the enqueue path to reuse once nothing else holds them: a lock-free bounded queue.
pub(crate) struct WorkPool<B: Backend> {
    works: ArrayQueue<Arc<WorkState<B>>>,
    enabled: bool,
}

impl<B: Backend> WorkPool<B> {
    /// An empty pool that keeps Works only when `enabled`.
    pub(crate) fn new(enabled: bool) -> Self {
        Self { works: ArrayQueue::new(if enabled { POOL_MAX } else { 1 }), enabled }
    }

    /// Keeps the retired Works that completed without error, up to [`POOL_MAX`]; drops the others. A Work a caller
    /// still holds (its handle, a `Future`) is kept too: by the time an op takes it, the caller may have let go.
    pub(crate) fn put(&self, retired: Vec<Arc<WorkState<B>>>) {
        if !self.enabled {
            return;
        }
        for work in retired {
            if work.exception().is_none() {
                // A full pool drops the Work.
                let _ = self.works.push(work);
            }
        }
    }

    /// A Work to reuse, with its end event: only this pool held it, so the caller may overwrite it. The oldest
    /// pooled Works are tried first; one still held elsewhere goes back to the end of the pool.
    pub(crate) fn take(&self) -> Option<Arc<WorkState<B>>> {
        for _ in 0..TRIES {
            let mut work = self.works.pop()?;
            if Arc::get_mut(&mut work).is_some() && Arc::strong_count(&work.end_event) == 1 {
                return Some(work);
            }
            // A full pool drops it.
            let _ = self.works.push(work);
        }
        None
    }

    /// Drops every pooled Work (they hold the group's communicators: a stopping group lets them go).
    pub(crate) fn clear(&self) {
        while self.works.pop().is_some() {}
    }
}
