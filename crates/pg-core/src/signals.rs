//! What a group and its two host threads (the watchdog and the heartbeat monitor) share without holding the
//! group: the stop and wake flags, the threads themselves with their heartbeat, the state of the watchdog's
//! store link, and the store keys through which ranks signal each other.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::liveness::Hold;
use crate::locks::lock;
use crate::Device;

/// How long stopping a group waits for its watchdog to finish a store operation before detaching it: a
/// healthy store answers well within it; a dead one would hold the caller for the store's timeout.
const STORE_OP_STOP_WAIT: Duration = Duration::from_millis(200);

/// The store key through which a failing rank asks every rank to dump its flight recorder.
pub(crate) const EXCEPTION_DUMP_KEY: &str = "exception_dump";

/// The store key through which a failing rank tells its peers (`TORCH_NCCL_PROPAGATE_ERROR`).
pub(crate) fn remote_error_key(pg_uid: &str) -> String {
    format!("remote_error:{pg_uid}")
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

impl Signals {
    /// Asks the watchdog and the heartbeat monitor to stop, without waiting for them.
    pub(crate) fn stop<D: Device>(&self, device: &D) {
        self.terminate.store(true, Ordering::SeqCst);
        self.wake.store(true, Ordering::SeqCst);
        device.notify_host_threads();
    }

    /// Wakes an idle watchdog (a new Work to watch).
    pub(crate) fn wake_if_idle<D: Device>(&self, device: &D) {
        if self.idle.load(Ordering::SeqCst) {
            self.wake(device);
        }
    }

    /// Wakes the watchdog whether it idles or waits for its next pass (the intake is filling).
    pub(crate) fn wake<D: Device>(&self, device: &D) {
        self.wake.store(true, Ordering::SeqCst);
        device.notify_host_threads();
    }
}

/// The watchdog's use of the store: whether it still works, and whether an operation is under way.
#[derive(Debug, Default)]
pub(crate) struct StoreLink {
    /// A store operation of the watchdog failed: it stops signalling and tracing through the store.
    pub(crate) broken: AtomicBool,
    /// Store operations of the watchdog under way: a stopping group does not wait for one to time out.
    in_op: AtomicU64,
    /// The group's liveness hold, when [`crate::Options::liveness`] is on and the store acknowledged it.
    liveness: Mutex<Option<Hold>>,
}

impl StoreLink {
    /// Runs `op` marked as under way.
    pub(crate) fn run<R>(&self, op: impl FnOnce() -> R) -> R {
        self.in_op.fetch_add(1, Ordering::SeqCst);
        let result = op();
        self.in_op.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// Keeps the group's liveness hold until the group ends (its drop deletes the live key before the connection
    /// closes, so a group let go on purpose is not declared dead).
    pub(crate) fn hold_liveness(&self, hold: Hold) {
        *lock(&self.liveness) = Some(hold);
    }

    /// Whether the group holds liveness (the store publishes deaths).
    pub(crate) fn has_liveness(&self) -> bool {
        lock(&self.liveness).is_some()
    }

    fn busy(&self) -> bool {
        self.in_op.load(Ordering::SeqCst) > 0
    }
}

/// The group's host threads, with the watchdog's heartbeat and the state the monitor keeps of it.
#[derive(Debug, Default)]
pub(crate) struct Threads {
    handles: Mutex<Vec<JoinHandle<()>>>,
    /// Watchdog passes so far: what the heartbeat monitor compares between two looks.
    pub(crate) heartbeat: AtomicU64,
    /// The monitor found the watchdog stuck: nobody waits for it to stop.
    watchdog_stuck: AtomicBool,
}

impl Threads {
    /// Keeps a started thread, to be joined when the group stops.
    pub(crate) fn push(&self, thread: JoinHandle<()>) {
        lock(&self.handles).push(thread);
    }

    /// Marks the watchdog as stuck, so that no one waits for it to stop.
    pub(crate) fn mark_stuck(&self) {
        self.watchdog_stuck.store(true, Ordering::SeqCst);
    }

    /// Stops the threads and waits for them, except for the calling thread itself (the group may be dropped
    /// on its own watchdog thread) and for a watchdog found stuck (it may never return).
    ///
    /// A thread inside a store operation gets up to [`STORE_OP_STOP_WAIT`] to finish it: a healthy store
    /// answers in milliseconds, while a dead one may take the store's timeout, and then the thread ends on its
    /// own, detached. Never detaching a thread that is about to finish matters: a detached watchdog may hold
    /// the group's last reference and tear its communicators down while the process exits.
    pub(crate) fn stop<D: Device>(&self, signals: &Signals, store: &StoreLink, device: &D) {
        signals.stop(device);
        let threads = std::mem::take(&mut *lock(&self.handles));
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
            while store.busy() && !thread.is_finished() && device.now() < deadline {
                device.sleep(Duration::from_millis(1), &never);
            }
            if store.busy() && !thread.is_finished() {
                tracing::warn!(target: "pg", "a process-group thread is still inside a store operation; detaching it");
                continue;
            }
            if thread.join().is_err() {
                tracing::error!(target: "pg", "a process-group watchdog thread panicked");
            }
        }
    }
}
