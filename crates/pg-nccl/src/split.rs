//! `ncclCommSplit`, `ncclCommShrink` and an existing rank's `ncclCommGrow` bounded by a timeout. All make a child
//! from a parent the same way (NCCL writes the child's handle when the call has finished), so one machinery runs
//! them; they follow the parent's blocking mode (not the child's config).
//!
//! NCCL cannot interrupt the split of a blocking communicator, so it runs on a helper thread while the caller
//! waits at most the timeout; a caller that gives up retires the parent (no call can reach it any more) and hands
//! it to the helper, which aborts it, and any child NCCL made, once the split returns. A non-blocking parent's
//! split returns at once and finishes on NCCL's own thread, writing the child's handle only at the end: the
//! caller polls the parent's state and, at the timeout, aborts the parent (NCCL's abort waits for that thread).
//! Either way NCCL may write the child's handle after the caller has left, so its slot is never freed (one
//! pointer per split).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use nccl_sys::{Library, Status};
use pg_core::Error;

use crate::conv::{cuda_error, nccl_error};
use crate::handle::RawComm;

/// One split, shrink or grow: the parent and what to make of it.
pub(crate) struct SplitCall {
    pub(crate) library: &'static Library,
    pub(crate) device: pg_cuda::Device,
    /// The parent's handle, live, which no other thread issues on while the call runs.
    pub(crate) parent: RawComm,
    pub(crate) kind: SplitKind,
}

/// What a [`SplitCall`] makes of its parent.
pub(crate) enum SplitKind {
    /// `ncclCommSplit` by color (`NCCL_SPLIT_NOCOLOR` for none) and key.
    Split { color: i32, key: i32 },
    /// `ncclCommShrink` without these ranks, with these flags (`NCCL_SHRINK_DEFAULT` or `NCCL_SHRINK_ABORT`).
    Shrink { excluded: Vec<usize>, flags: i32 },
    /// `ncclCommGrow` of an existing rank to `nranks` ranks; rank 0 passes the grow's id, the others none.
    Grow { nranks: usize, id: Option<nccl_sys::UniqueId> },
}

impl SplitCall {
    /// Issues the call, NCCL writing the child's handle to `newcomm`.
    ///
    /// # Safety
    /// The parent is live and only this thread issues on it; `newcomm` stays valid for good.
    unsafe fn issue(&self, newcomm: *mut nccl_sys::Comm) -> nccl_sys::Result<Status> {
        match &self.kind {
            SplitKind::Split { color, key } => {
                let mut config = self.library.config(true);
                // SAFETY: forwarded from this function's contract; `config` is valid for the call.
                unsafe { self.library.comm_split(self.parent.0, *color, *key, newcomm, &mut config) }
            }
            SplitKind::Shrink { excluded, flags } => {
                let mut config = self.library.config(true);
                // The shrunk communicator gets connections of its own, whatever NCCL_COMM_SPLIT_SHARE_RESOURCES says:
                // a rank that leaves drops the parent, and the survivors' group must not go with it.
                config.split_share = 0;
                config.shrink_share = 0;
                // SAFETY: forwarded from this function's contract; `config` is valid for the call.
                unsafe { self.library.comm_shrink(self.parent.0, excluded, newcomm, &mut config, *flags) }
            }
            SplitKind::Grow { nranks, id } => {
                // SAFETY: forwarded from this function's contract (an existing rank: a live parent, no rank); the
                // null config inherits the parent's.
                unsafe { self.library.comm_grow(self.parent.0, *nranks, id.as_ref(), None, newcomm) }
            }
        }
    }
}

/// How a bounded split ended, for the caller.
pub(crate) enum Ended {
    /// The split finished: the child's handle (null for no color), or NCCL's error.
    Finished(pg_core::Result<RawComm>),
    /// The timeout ran out first: the parent is aborted (non-blocking), or retired and left to the helper to
    /// abort (blocking).
    TimedOut,
}

/// What the caller and the helper agree on, under one lock.
enum Handoff {
    /// The split runs and the caller waits.
    Waiting,
    /// The split finished and the caller has not taken its result yet.
    Done(pg_core::Result<RawComm>),
    /// The caller gave up: the helper aborts any child, and the parent when the caller handed it over (it had not
    /// been aborted already).
    Abandoned { owns_parent: bool },
}

type Shared = Arc<(Mutex<Handoff>, Condvar)>;

fn lock(shared: &Shared) -> MutexGuard<'_, Handoff> {
    shared.0.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Splits the blocking `call.parent` on a helper thread and waits for it at most `timeout` (`None`: without
/// bound). When the timeout runs out first, `retire` runs (under the hand-off lock, so the split cannot finish in
/// between): it must make the parent unreachable for every other call, and say whether it took the parent's
/// handle (`false` when an abort had taken it already); only then may the helper abort the parent.
pub(crate) fn split_bounded(
    call: SplitCall,
    timeout: Option<Duration>,
    retire: impl FnOnce() -> bool,
) -> pg_core::Result<Ended> {
    let shared: Shared = Arc::new((Mutex::new(Handoff::Waiting), Condvar::new()));
    let helper = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("pg-nccl-split".to_owned())
        .spawn(move || run(&call, &helper))
        .map_err(|err| Error::Backend(format!("spawning the communicator split thread: {err}")))?;
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let mut state = lock(&shared);
    loop {
        match std::mem::replace(&mut *state, Handoff::Waiting) {
            Handoff::Done(result) => return Ok(Ended::Finished(result)),
            other => *state = other,
        }
        let wait = match deadline {
            None => None,
            Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => {
                    *state = Handoff::Abandoned { owns_parent: retire() };
                    return Ok(Ended::TimedOut);
                }
            },
        };
        state = match wait {
            None => shared.1.wait(state).unwrap_or_else(PoisonError::into_inner),
            Some(left) => shared.1.wait_timeout(state, left).unwrap_or_else(PoisonError::into_inner).0,
        };
    }
}

/// The helper: splits, then hands the result to the caller, or cleans up after a caller that gave up.
fn run(call: &SplitCall, shared: &Shared) {
    let result = split_here(call);
    let mut state = lock(shared);
    let owns_parent = match &*state {
        Handoff::Waiting => {
            *state = Handoff::Done(result);
            shared.1.notify_all();
            return;
        }
        Handoff::Abandoned { owns_parent } => *owns_parent,
        Handoff::Done(_) => false,
    };
    drop(state);
    tracing::warn!("a communicator split ended after its caller gave up: aborting what it left");
    let _ = call.device.bind_to_thread();
    if let Ok(child) = result {
        if !child.0.is_null() {
            // SAFETY: NCCL made `child` for this split and nobody else holds it.
            let _ = unsafe { call.library.comm_abort(child.0) };
        }
    }
    if owns_parent {
        // SAFETY: the caller retired the parent before giving up, so no other call can reach it, and the split on
        // it has returned.
        let _ = unsafe { call.library.comm_abort(call.parent.0) };
    }
}

/// A slot for the child's handle that outlives every write NCCL may make to it.
fn slot() -> &'static AtomicPtr<nccl_sys::sys::ncclComm> {
    Box::leak(Box::new(AtomicPtr::new(std::ptr::null_mut())))
}

/// Aborts the child NCCL left in `slot` after a split that failed or was abandoned, if it made one.
fn abort_child(library: &Library, slot: &AtomicPtr<nccl_sys::sys::ncclComm>) {
    let child = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !child.is_null() {
        // SAFETY: NCCL made `child` for a split that has ended, and nobody else holds it.
        let _ = unsafe { library.comm_abort(child) };
    }
}

/// The split of a blocking parent, on the helper thread: the child's handle (null for no color).
fn split_here(call: &SplitCall) -> pg_core::Result<RawComm> {
    call.device.bind_to_thread().map_err(cuda_error)?;
    let newcomm = slot();
    // SAFETY: the parent is live and only this thread issues on it while the caller holds its issue mutex (or,
    // once the caller gave up, while the parent is retired); `newcomm` is valid for good.
    let status = unsafe { call.issue(newcomm.as_ptr()) };
    if let Err(err) = status {
        abort_child(call.library, newcomm);
        return Err(nccl_error(err));
    }
    Ok(RawComm(newcomm.load(Ordering::Acquire)))
}

/// The split of a non-blocking parent, on the caller's thread (which holds the parent's issue mutex): issues it,
/// then polls `state` (the parent's async state, read under the communicator's lock, so an abort elsewhere is
/// seen) until it is no longer in progress. Past `deadline`, `abort` aborts the parent, which waits for NCCL's
/// thread, and the split ends as [`Ended::TimedOut`].
pub(crate) fn split_nonblocking(
    call: &SplitCall,
    deadline: Option<Instant>,
    state: impl Fn() -> pg_core::Result<Status>,
    abort: impl FnOnce() -> pg_core::Result<()>,
    state_error: impl Fn(Status) -> Error,
) -> pg_core::Result<Ended> {
    call.device.bind_to_thread().map_err(cuda_error)?;
    let newcomm = slot();
    // SAFETY: the parent is live and the caller holds its issue mutex; `newcomm` is valid for good.
    let status = unsafe { call.issue(newcomm.as_ptr()) };
    let mut status = match status {
        Ok(status) => status,
        Err(err) => {
            abort_child(call.library, newcomm);
            return Ok(Ended::Finished(Err(nccl_error(err))));
        }
    };
    let mut pause = Duration::from_micros(1);
    while status.is_in_progress() {
        if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            abort()?;
            abort_child(call.library, newcomm);
            return Ok(Ended::TimedOut);
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
        status = match state() {
            Ok(status) => status,
            Err(error) => return Ok(Ended::Finished(Err(error))),
        };
    }
    if status.is_error() {
        abort_child(call.library, newcomm);
        return Ok(Ended::Finished(Err(state_error(status))));
    }
    Ok(Ended::Finished(Ok(RawComm(newcomm.load(Ordering::Acquire)))))
}
