//! The one way pg-core takes a mutex: [`lock`], which carries on past a poisoned mutex (a panic elsewhere never
//! makes a group's state unreadable) and, in the `testing` build, counts the locks each thread takes, so that a
//! test can check that a path takes none (see [`locks_taken_on_this_thread`]).

use std::sync::{Mutex, MutexGuard, PoisonError};

#[cfg(feature = "testing")]
thread_local! {
    static TAKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Locks `mutex`, poisoned or not.
#[inline]
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    #[cfg(feature = "testing")]
    TAKEN.with(|taken| taken.set(taken.get() + 1));
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Locks `mutex` (poisoned or not) unless another thread holds it.
#[inline]
pub(crate) fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    #[cfg(feature = "testing")]
    TAKEN.with(|taken| taken.set(taken.get() + 1));
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// How many of pg-core's mutexes the calling thread has locked so far (`testing` feature).
#[cfg(feature = "testing")]
pub fn locks_taken_on_this_thread() -> u64 {
    TAKEN.with(std::cell::Cell::get)
}
