//! `Poison`: a device's record that a process group failed while its ops may still be pending, so that reads
//! and host synchronisations through the device fail with the group's error instead of returning data that the
//! failed op never wrote (or blocking forever behind it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::locks::lock;
use crate::{Error, Result};

/// The failure record of one device, shared by every handle of the device.
///
/// A process group sets it when its watchdog (or heartbeat monitor) finds an error, in every error-handling
/// mode, before it aborts anything: from then on the backend's `copy_to_host`, `Device::synchronize`,
/// `Stream::synchronize` and `Event::synchronize` on this device return that error, and a call already blocked
/// in one of them wakes up and returns it. The record stays until [`Poison::clear`]: clear it once the buffers
/// the failed group wrote are discarded, before going on with a new group.
#[derive(Debug, Default)]
pub struct Poison {
    /// Set exactly when `error` holds an error: what a backend's blocked wait looks at.
    flag: AtomicBool,
    error: Mutex<Option<Error>>,
}

impl Poison {
    /// A clear record.
    pub const fn new() -> Self {
        Self { flag: AtomicBool::new(false), error: Mutex::new(None) }
    }

    /// Records `error` unless an error is recorded already; returns whether it was the first.
    ///
    /// A backend's blocked wait sees it once [`crate::Device::notify_host_threads`] is called.
    pub fn set(&self, error: &Error) -> bool {
        let mut slot = lock(&self.error);
        let first = slot.is_none();
        if first {
            *slot = Some(error.clone());
            self.flag.store(true, Ordering::SeqCst);
        }
        first
    }

    /// The recorded error, if any.
    pub fn get(&self) -> Option<Error> {
        match self.flag.load(Ordering::SeqCst) {
            true => lock(&self.error).clone(),
            false => None,
        }
    }

    /// `Err` with the recorded error, if any: what a backend calls before and after a read or a synchronisation.
    pub fn check(&self) -> Result<()> {
        match self.get() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Clears the record and returns what it held.
    pub fn clear(&self) -> Option<Error> {
        let mut slot = lock(&self.error);
        self.flag.store(false, Ordering::SeqCst);
        slot.take()
    }

    /// The flag that is set while an error is recorded, for a backend that parks a thread with an interrupt flag.
    pub fn flag(&self) -> &AtomicBool {
        &self.flag
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_stays_until_cleared() {
        let poison = Poison::new();
        assert!(poison.check().is_ok() && !poison.flag().load(Ordering::SeqCst));
        assert!(poison.set(&Error::invalid("first")));
        assert!(!poison.set(&Error::invalid("second")));
        assert!(poison.flag().load(Ordering::SeqCst));
        assert!(poison.check().unwrap_err().to_string().contains("first"));
        assert!(poison.clear().unwrap().to_string().contains("first"));
        assert!(poison.get().is_none() && poison.check().is_ok());
    }
}
