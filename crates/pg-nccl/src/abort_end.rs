//! Whether a communicator's `ncclCommAbort` has returned: what a second caller of an abort, or the communicator's
//! drop, waits for.
//!
//! The watchdog and the program often abort the same failed communicator. Only the first caller runs NCCL's
//! abort (on a thread of its own); a later one that returned at once would let the program go on to exit while
//! NCCL still tears the communicator down, and CUDA's exit-time teardown under it crashes the process.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// Where a communicator's abort stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No abort has called NCCL.
    #[default]
    NotStarted,
    /// `ncclCommAbort` was called and has not returned.
    Running,
    /// `ncclCommAbort` returned.
    Returned,
}

/// The state of one communicator's abort, shared with the thread that runs it.
#[derive(Debug, Default)]
pub(crate) struct AbortEnd {
    state: Mutex<State>,
    changed: Condvar,
}

impl AbortEnd {
    /// The abort that took the communicator's handle is about to call NCCL.
    pub(crate) fn start(&self) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = State::Running;
    }

    /// NCCL's abort returned.
    pub(crate) fn finish(&self) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = State::Returned;
        self.changed.notify_all();
    }

    /// Waits until no abort is running, at most `limit`: `true` when none is (none started, or it returned).
    pub(crate) fn wait(&self, limit: Duration) -> bool {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (state, _) = self
            .changed
            .wait_timeout_while(state, limit, |state| *state == State::Running)
            .unwrap_or_else(PoisonError::into_inner);
        *state != State::Running
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn nothing_to_wait_for_before_an_abort_starts_or_after_it_returns() {
        let end = AbortEnd::default();
        assert!(end.wait(Duration::ZERO), "no abort started");
        end.start();
        end.finish();
        assert!(end.wait(Duration::ZERO), "the abort returned");
    }

    #[test]
    fn a_running_abort_is_waited_for_until_the_limit() {
        let end = AbortEnd::default();
        end.start();
        assert!(!end.wait(Duration::from_millis(1)), "an abort that never returns outlasts the limit");
    }

    #[test]
    fn a_waiter_returns_once_the_abort_finishes_on_another_thread() {
        let end = Arc::new(AbortEnd::default());
        end.start();
        let finisher = Arc::clone(&end);
        let thread = std::thread::spawn(move || finisher.finish());
        assert!(end.wait(Duration::from_secs(600)), "the finished abort ends the wait");
        thread.join().unwrap();
    }
}
