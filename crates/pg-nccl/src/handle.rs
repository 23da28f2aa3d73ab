//! `RawComm`, an `ncclComm_t` that may move between threads (`communicator.rs` keeps one behind its locks;
//! `split.rs` hands one to its helper thread).

/// An `ncclComm_t` that may move between threads.
#[derive(Clone, Copy)]
pub(crate) struct RawComm(pub(crate) nccl_sys::Comm);

// SAFETY: an NCCL communicator is not tied to the thread that made it; NCCL only requires that calls on it
// are not issued by two threads at once, which `Communicator` enforces with its issue mutex (and the handle
// lock for the calls NCCL allows from any thread: async-error query and abort), and which a split's helper
// thread keeps while the caller holds that mutex or has retired the communicator.
unsafe impl Send for RawComm {}
// SAFETY: as above: shared references only reach the handle through `Communicator`'s locks.
unsafe impl Sync for RawComm {}
