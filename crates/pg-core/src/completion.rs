//! Waking the tasks that await an op: the wakers registered on a Work, and the trait through which a Future
//! awaits the Work it came from.
//!
//! Nothing here polls or blocks: a task registers its waker, and it is woken either by a host callback that the
//! backend runs once the op's stream has passed the op ([`crate::Stream::launch_host_fn`]) or by whoever records
//! the Work's error (the watchdog on a timeout, an abort, a failed query).

use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

use crate::locks::lock;
use crate::Result;

/// The wakers of the tasks that await one Work, and whether its wake-up callback is enqueued.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    inner: Mutex<WaitersInner>,
}

#[derive(Debug, Default)]
struct WaitersInner {
    wakers: Vec<Waker>,
    /// Whether the host callback that wakes the wakers has been enqueued (once per Work).
    armed: bool,
}

impl Waiters {
    /// Registers `waker` unless an equivalent one is there already.
    pub(crate) fn register(&self, waker: &Waker) {
        let mut inner = lock(&self.inner);
        if !inner.wakers.iter().any(|w| w.will_wake(waker)) {
            inner.wakers.push(waker.clone());
        }
    }

    /// Wakes every registered waker (outside the lock) and forgets them: a task polled again registers anew.
    pub(crate) fn wake_all(&self) {
        let wakers = std::mem::take(&mut lock(&self.inner).wakers);
        for waker in wakers {
            waker.wake();
        }
    }

    /// Marks the wake-up callback as enqueued; true for the one caller that must enqueue it.
    pub(crate) fn arm(&self) -> bool {
        let mut inner = lock(&self.inner);
        !std::mem::replace(&mut inner.armed, true)
    }

    /// Undoes [`Waiters::arm`] after the callback could not be enqueued, so that a later poll tries again.
    pub(crate) fn disarm(&self) {
        lock(&self.inner).armed = false;
    }
}

/// An op that a task can await: ready once the op has finished on the device or failed.
pub(crate) trait Completion: Send + Sync {
    /// `Ready(Ok)` once the op has finished on the device, `Ready(Err)` with its error (timeout, abort, a
    /// communicator error); otherwise registers the task's waker and returns `Pending`.
    fn poll_completion(&self, cx: &mut Context<'_>) -> Poll<Result<()>>;
}
