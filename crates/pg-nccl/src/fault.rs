//! Faults the conformance harness injects into this process's communicators (with the `testing` feature): an
//! asynchronous error once a communicator's first N ops have finished on the device, as a failing NCCL reports
//! one through `ncclCommGetAsyncError`; or the death of this rank during an op, as its peers see a killed process.
//! Communicators made while a fault is armed carry it; disarming leaves them as they are and spares the next ones.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use pg_core::Error;

/// A fault new communicators carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Armed {
    /// An asynchronous error once the first `after_ops` ops have finished.
    AsyncError { after_ops: u64 },
    /// This rank dies as it issues the op numbered `op`.
    Kill { op: u64 },
}

/// The armed fault.
static ARMED: Mutex<Option<Armed>> = Mutex::new(None);

/// Whether the armed kill has fired: a process dies once.
static KILLED: AtomicBool = AtomicBool::new(false);

/// From now on, every new communicator of this process reports an asynchronous error once its first
/// `after_ops` ops have finished (0: as soon as it exists).
pub fn arm_async_error(after_ops: u64) {
    *ARMED.lock().unwrap_or_else(PoisonError::into_inner) = Some(Armed::AsyncError { after_ops });
}

/// From now on, this rank dies as a new communicator of this process issues its op numbered `op` (from 0): the op
/// is not launched, the call returns as if it had been enqueued, and later calls on the communicator fail with
/// `Aborted` naming the kill. Its connections close when the rank's process group lets go of the communicator
/// (the case aborts it at once, as the process's death ends everything of it): NCCL's peers on the ring then see
/// `ncclRemoteError`, the others wait until their timeout or a peer's report. It fires once.
pub fn arm_kill(op: u64) {
    KILLED.store(false, Ordering::SeqCst);
    *ARMED.lock().unwrap_or_else(PoisonError::into_inner) = Some(Armed::Kill { op });
}

/// New communicators carry no fault.
pub fn disarm() {
    *ARMED.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

/// The fault a communicator carries.
#[derive(Debug)]
pub(crate) struct Injected {
    armed: Armed,
    issued: AtomicU64,
    /// Recorded after the op numbered `after_ops` of an asynchronous error.
    marker: Mutex<Option<pg_cuda::Event>>,
}

/// The fault a communicator made now carries, if one is armed.
pub(crate) fn for_new_communicator() -> Option<Injected> {
    let armed = (*ARMED.lock().unwrap_or_else(PoisonError::into_inner))?;
    Some(Injected { armed, issued: AtomicU64::new(0), marker: Mutex::new(None) })
}

impl Injected {
    /// Whether the op about to be issued is the one this rank dies in: its number, once (the kill then fires no
    /// more, on this communicator or any other).
    pub(crate) fn kills_now(&self) -> Option<u64> {
        let Armed::Kill { op } = self.armed else { return None };
        let fires = self.issued.load(Ordering::Acquire) == op && !KILLED.swap(true, Ordering::SeqCst);
        fires.then_some(op)
    }

    /// Counts an op issued on `stream`; for an asynchronous error, the one numbered `after_ops` gets the marker
    /// recorded after it.
    pub(crate) fn issued(&self, device: &pg_cuda::Device, stream: &pg_cuda::Stream) {
        let count = self.issued.fetch_add(1, Ordering::AcqRel) + 1;
        if self.armed == (Armed::AsyncError { after_ops: count }) {
            let event = device.event();
            if event.record(stream).is_ok() {
                *self.marker.lock().unwrap_or_else(PoisonError::into_inner) = Some(event);
            }
        }
    }

    /// The injected asynchronous error, once the fault has fired.
    pub(crate) fn error(&self, rank: usize) -> Option<Error> {
        let Armed::AsyncError { after_ops } = self.armed else { return None };
        let fired = after_ops == 0
            || self
                .marker
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .is_some_and(|marker| marker.query().unwrap_or(false));
        fired.then(|| {
            Error::communicator(format!(
                "NCCL async error: unhandled system error (injected fault: rank {rank}'s communicator failed after \
                 {after_ops} operations)"
            ))
        })
    }
}
