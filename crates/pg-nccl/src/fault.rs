//! Faults the conformance harness injects into this process's communicators (with the `testing` feature): an
//! asynchronous error once a communicator's first N ops have finished on the device, as a failing NCCL reports
//! one through `ncclCommGetAsyncError`. Communicators made while a fault is armed carry it; disarming leaves
//! them as they are and spares the next ones.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use pg_core::Error;

/// The armed fault: ops that finish normally first.
static ARMED: Mutex<Option<u64>> = Mutex::new(None);

/// From now on, every new communicator of this process reports an asynchronous error once its first
/// `after_ops` ops have finished (0: as soon as it exists).
pub fn arm_async_error(after_ops: u64) {
    *ARMED.lock().unwrap_or_else(PoisonError::into_inner) = Some(after_ops);
}

/// New communicators carry no fault.
pub fn disarm() {
    *ARMED.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

/// The fault a communicator carries: it fires once the op numbered `after_ops` has passed on its stream.
#[derive(Debug)]
pub(crate) struct Injected {
    after_ops: u64,
    issued: AtomicU64,
    /// Recorded after the op numbered `after_ops`.
    marker: Mutex<Option<pg_cuda::Event>>,
}

/// The fault a communicator made now carries, if one is armed.
pub(crate) fn for_new_communicator() -> Option<Injected> {
    let after_ops = (*ARMED.lock().unwrap_or_else(PoisonError::into_inner))?;
    Some(Injected { after_ops, issued: AtomicU64::new(0), marker: Mutex::new(None) })
}

impl Injected {
    /// Counts an op issued on `stream`; the one numbered `after_ops` gets the marker recorded after it.
    pub(crate) fn issued(&self, device: &pg_cuda::Device, stream: &pg_cuda::Stream) {
        if self.issued.fetch_add(1, Ordering::AcqRel) + 1 == self.after_ops {
            let event = device.event();
            if event.record(stream).is_ok() {
                *self.marker.lock().unwrap_or_else(PoisonError::into_inner) = Some(event);
            }
        }
    }

    /// The injected error, once the fault has fired.
    pub(crate) fn error(&self, rank: usize) -> Option<Error> {
        let fired = self.after_ops == 0
            || self
                .marker
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .as_ref()
                .is_some_and(|marker| marker.query().unwrap_or(false));
        fired.then(|| {
            Error::communicator(format!(
                "NCCL async error: unhandled system error (injected fault: rank {rank}'s communicator failed after \
                 {} operations)",
                self.after_ops
            ))
        })
    }
}
