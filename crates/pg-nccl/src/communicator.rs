//! `Communicator`: one NCCL communicator, owned, with NCCL's threading rules enforced (see the crate docs).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, TryLockError};
use std::time::{Duration, Instant};

use nccl_sys::{Library, Status};
use pg_core::{args, Capability, CommConfig, Error, ReduceOp, ShrinkMode, UniqueId};

use crate::abort_end::AbortEnd;
use crate::conv::{cuda_error, data_type, nccl_error, red_op};
use crate::exchange::{self, Call};
use crate::handle::RawComm;
#[cfg(feature = "testing")]
use crate::launches::{self, KernelKind};
use crate::premul::{self, OpPlan};
use crate::split::{self, Ended, SplitCall, SplitKind};
use crate::{Buffer, Nccl, Stream};

/// An NCCL call of a communicator that takes longer than this is logged ([`Communicator::note_slow`]).
const SLOW_CALL: Duration = Duration::from_millis(20);

/// How long [`Communicator::abort`] waits for an issuing thread to leave NCCL before aborting under it.
const ABORT_LOCK_WAIT: Duration = Duration::from_millis(100);

/// How long [`Communicator::abort`] waits for `ncclCommAbort` to return before leaving it to its own thread.
const ABORT_WAIT: Duration = Duration::from_secs(10);

/// A handle NCCL just made, with what came with it, before a [`Communicator`] owns it.
struct OwnedComm {
    library: &'static Library,
    device: pg_cuda::Device,
    comm: nccl_sys::Comm,
    status: Status,
    nonblocking: bool,
}

/// NCCL's form of a unique id pg passes around as bytes; any other length than NCCL's is refused by name.
fn nccl_id(id: &UniqueId) -> pg_core::Result<nccl_sys::UniqueId> {
    nccl_sys::UniqueId::from_bytes(&id.0)
        .ok_or_else(|| Error::invalid(format!("an NCCL unique id has 128 bytes, not {}", id.0.len())))
}

/// `Ok` when `library` can grow communicators (`ncclCommGrow` and `ncclCommGetUniqueId`, NCCL 2.29), else
/// [`Error::Unsupported`] naming the call, the loaded version and the one needed.
pub(crate) fn grow_support(library: &Library) -> pg_core::Result<()> {
    let functions = library.functions();
    let symbols = (functions.comm_grow.is_some(), functions.comm_get_unique_id.is_some());
    grow_refusal(library.version(), symbols).map_or(Ok(()), |refusal| Err(nccl_error(refusal)))
}

/// What a device can do with `library` ([`pg_core::Device::capabilities`]): split where it has `ncclCommSplit`,
/// shrink from 2.27, revoke from 2.28.7 and grow from 2.29 where the library has the calls, a device `PREMUL_SUM`
/// where it has `ncclRedOpCreatePreMulSum`; capture, timing events and host callbacks are CUDA's, always there.
pub(crate) fn capabilities(library: &Library) -> pg_core::Capabilities {
    let (functions, version) = (library.functions(), library.version());
    pg_core::Capabilities::all()
        .set(Capability::Split, functions.comm_split.is_some())
        .set(Capability::Shrink, version >= nccl_sys::SHRINK_VERSION && functions.comm_shrink.is_some())
        .set(Capability::Revoke, version >= nccl_sys::REVOKE_VERSION && functions.comm_revoke.is_some())
        .set(Capability::Grow, grow_support(library).is_ok())
        .set(Capability::DevicePreMulSum, functions.red_op_create_pre_mul_sum.is_some())
}

/// Why an NCCL of `version`, with or without the symbols `(ncclCommGrow, ncclCommGetUniqueId)`, cannot grow.
fn grow_refusal(version: nccl_sys::Version, (grow, get_id): (bool, bool)) -> Option<nccl_sys::Error> {
    let needs = nccl_sys::GROW_VERSION;
    if version < needs {
        return Some(nccl_sys::Error::TooOld { call: "ncclCommGrow", version, needs });
    }
    match (grow, get_id) {
        (true, true) => None,
        (false, _) => Some(nccl_sys::Error::Unavailable { call: "ncclCommGrow", version }),
        (true, false) => Some(nccl_sys::Error::Unavailable { call: "ncclCommGetUniqueId", version }),
    }
}

/// One NCCL communicator of this process: a rank of `size`, on one device.
///
/// Every call that issues work (collectives, P2P, finalize) holds the issue mutex; the handle sits behind a
/// read-write lock that [`pg_core::Communicator::abort`] empties, so no call can start on an aborted
/// communicator. Dropping destroys it (`ncclCommDestroy`) unless it was aborted.
pub struct Communicator {
    library: &'static Library,
    device: pg_cuda::Device,
    rank: usize,
    size: usize,
    nonblocking: bool,
    description: String,
    handle: RwLock<Option<RawComm>>,
    issue: Mutex<()>,
    ready: AtomicBool,
    aborted: AtomicBool,
    /// Set once the communicator was finalized (`ncclCommFinalize`, or deferred while graphs hold it): nothing
    /// may be issued afterwards (graphs that captured its ops check it).
    finalized: AtomicBool,
    /// How many live CUDA graphs hold captured ops of this communicator ([`crate::Graph`]). NCCL's finalize,
    /// abort and destroy wait until every such graph is destroyed, so while one lives a finalize is deferred to
    /// the destroy and an abort runs on a thread of its own.
    graphs: AtomicUsize,
    abort_reason: Mutex<Option<String>>,
    /// Whether NCCL's abort of this communicator, once called, has returned.
    abort_end: Arc<AbortEnd>,
    /// The fault the conformance harness injected when this communicator was made.
    #[cfg(feature = "testing")]
    injected: Option<crate::fault::Injected>,
    /// Why the communicator was revoked (`ncclCommRevoke`, or shrunk with `NCCL_SHRINK_ABORT`), once it was: no op
    /// and no finalize may follow, a shrink, split or destroy may.
    revoked: AtomicBool,
    revoke_reason: Mutex<Option<String>>,
}

impl Communicator {
    /// Joins `id` as `rank` of `size` on `device` (`ncclCommInitRankConfig`); a blocking init with a timeout
    /// gives up after it with [`Error::InitTimeout`].
    pub(crate) fn init(
        device: pg_cuda::Device,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> pg_core::Result<Self> {
        match (config.nonblocking, config.timeout) {
            (false, Some(timeout)) => {
                Self::bounded(Self::init_here, (device, id, size, rank), config, timeout, "ncclCommInitRankConfig")
            }
            _ => Self::init_here(device, id, size, rank, config),
        }
    }

    /// Joins the grow that `id` names as new rank `rank` of `size` on `device` (`ncclCommGrow` with no parent, NCCL
    /// 2.29), bounded by `config.timeout` ([`Error::InitTimeout`] past it). The new rank's communicator is blocking
    /// (NCCL's defaults: a grow gives a new rank no config of its parent to inherit).
    pub(crate) fn join_grown(
        device: pg_cuda::Device,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> pg_core::Result<Self> {
        match config.timeout {
            Some(timeout) => Self::bounded(Self::join_here, (device, id, size, rank), config, timeout, "ncclCommGrow"),
            None => Self::join_here(device, id, size, rank, config),
        }
    }

    /// A blocking `make` (an init or a join, calling `call`) bounded by `timeout`. NCCL's blocking calls cannot be
    /// interrupted, so it runs on a helper thread while the caller waits at most `timeout`; a communicator NCCL
    /// makes after the caller gave up is destroyed on that thread.
    fn bounded(
        make: fn(pg_cuda::Device, &UniqueId, usize, usize, &CommConfig) -> pg_core::Result<Self>,
        (device, id, size, rank): (pg_cuda::Device, &UniqueId, usize, usize),
        config: &CommConfig,
        timeout: Duration,
        call: &str,
    ) -> pg_core::Result<Self> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let (id, helper_config) = (id.clone(), config.clone());
        std::thread::Builder::new()
            .name(format!("pg-nccl-init rank {rank}"))
            .spawn(move || {
                // A refused send hands the communicator back, and dropping it destroys it.
                let _ = sender.send(make(device, &id, size, rank, &helper_config));
            })
            .map_err(|err| Error::Backend(format!("spawning the communicator init thread: {err}")))?;
        match receiver.recv_timeout(timeout) {
            Ok(result) => result,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(Error::InitTimeout {
                cache_key: config.description.clone(),
                timeout,
                what: format!("rank {rank} of {size} called {call}, which did not return in time"),
            }),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                Err(Error::Backend("the communicator init thread ended without a result".to_owned()))
            }
        }
    }

    /// Joins `id` on the calling thread.
    fn init_here(
        device: pg_cuda::Device,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> pg_core::Result<Self> {
        if rank >= size {
            return Err(Error::invalid(format!("rank {rank} of a communicator of {size}")));
        }
        let library = nccl_sys::library().map_err(nccl_error)?;
        let id = nccl_id(id)?;
        let mut nccl_config = library.config(!config.nonblocking);
        device.bind_to_thread().map_err(cuda_error)?;
        // SAFETY: the device's context is current on this thread (just bound), so NCCL picks that device.
        let (comm, status) =
            unsafe { library.comm_init_rank_config(size, &id, rank, &mut nccl_config) }.map_err(nccl_error)?;
        tracing::debug!(rank, size, device = device.ordinal(), nonblocking = config.nonblocking, %status,
            description = %config.description, "NCCL communicator created");
        let owned = OwnedComm { library, device, comm, status, nonblocking: config.nonblocking };
        Ok(Self::owning(owned, (rank, size), config.description.clone()))
    }

    /// Joins a grow on the calling thread ([`Communicator::join_grown`]).
    fn join_here(
        device: pg_cuda::Device,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> pg_core::Result<Self> {
        if rank >= size {
            return Err(Error::invalid(format!("join_grown: rank {rank} of a communicator of {size}")));
        }
        let library = nccl_sys::library().map_err(nccl_error)?;
        grow_support(library)?;
        let id = nccl_id(id)?;
        device.bind_to_thread().map_err(cuda_error)?;
        let mut comm: nccl_sys::Comm = std::ptr::null_mut();
        // SAFETY: a null parent is a new rank's form of the call; `comm` is valid for NCCL's write of the handle; the
        // device's context is current on this thread (just bound), so NCCL picks that device.
        let status = unsafe { library.comm_grow(std::ptr::null_mut(), size, Some(&id), Some(rank), &mut comm) }
            .map_err(nccl_error)?;
        tracing::info!(rank, size, device = device.ordinal(), %status, description = %config.description,
            "NCCL communicator joined by a grow");
        let owned = OwnedComm { library, device, comm, status, nonblocking: false };
        let joined = Self::owning(owned, (rank, size), config.description.clone());
        if status.is_in_progress() {
            // NCCL's defaults made it non-blocking (NCCL_COMM_BLOCKING=0): wait here, as a blocking join does.
            joined.wait_while_in_progress()?;
            joined.ready.store(true, Ordering::Release);
        }
        Ok(joined)
    }

    /// The communicator of a handle NCCL just made (an init or a join), which it owns from now on.
    fn owning(owned: OwnedComm, (rank, size): (usize, usize), description: String) -> Self {
        Self {
            library: owned.library,
            device: owned.device,
            rank,
            size,
            nonblocking: owned.nonblocking,
            description,
            handle: RwLock::new(Some(RawComm(owned.comm))),
            issue: Mutex::new(()),
            ready: AtomicBool::new(owned.status.is_success()),
            aborted: AtomicBool::new(false),
            finalized: AtomicBool::new(false),
            graphs: AtomicUsize::new(0),
            abort_reason: Mutex::new(None),
            abort_end: Arc::default(),
            #[cfg(feature = "testing")]
            injected: crate::fault::for_new_communicator(),
            revoked: AtomicBool::new(false),
            revoke_reason: Mutex::new(None),
        }
    }

    /// The communicator `kind` makes of this one's live handle `parent` (a split, shrink or grow), bounded by
    /// `config`'s timeout as [`Self::split_with_timeout`] says; `None` when NCCL gives this rank none (a split
    /// color of no group). Described by `config` or else by `description`.
    fn derive(
        &self,
        parent: RawComm,
        kind: SplitKind,
        config: &CommConfig,
        (reason, what): (&str, &str),
        description: impl FnOnce() -> String,
    ) -> pg_core::Result<Option<Self>> {
        let call = SplitCall { library: self.library, device: self.device.clone(), parent, kind };
        let handle = self.split_with_timeout(call, config, reason, what)?;
        if handle.0.is_null() {
            return Ok(None);
        }
        let description = match config.description.is_empty() {
            true => description(),
            false => config.description.clone(),
        };
        self.child(handle, description).map(Some)
    }

    /// Runs `call` (a split or a shrink of this communicator) bounded by `config`'s timeout: blocking on a helper
    /// thread, or polled where the communicator is non-blocking. One that times out aborts this communicator (for
    /// `reason`) and is an [`Error::InitTimeout`] saying this rank called `what`.
    fn split_with_timeout(
        &self,
        call: SplitCall,
        config: &CommConfig,
        reason: &str,
        what: &str,
    ) -> pg_core::Result<RawComm> {
        let ended = match self.nonblocking {
            false => split::split_bounded(call, config.timeout, || self.retire(reason))?,
            true => {
                let deadline = config.timeout.map(|timeout| Instant::now() + timeout);
                // The abort waits briefly for the issue mutex, which the caller holds, then aborts under it.
                let abort = || pg_core::Communicator::abort(self, reason);
                split::split_nonblocking(&call, deadline, || self.async_state(), abort, |s| self.state_error(s))?
            }
        };
        match ended {
            Ended::Finished(result) => result,
            Ended::TimedOut => Err(Error::InitTimeout {
                cache_key: config.description.clone(),
                timeout: config.timeout.unwrap_or_default(),
                what: format!("rank {} of {} called {what}; the parent communicator was aborted", self.rank, self.size),
            }),
        }
    }

    /// A child NCCL just made (by a split or a shrink) from this communicator, on its device, blocking.
    fn child(&self, handle: RawComm, description: String) -> pg_core::Result<Self> {
        let mut child = Self {
            library: self.library,
            device: self.device.clone(),
            rank: 0,
            size: 0,
            nonblocking: false,
            description,
            handle: RwLock::new(Some(handle)),
            issue: Mutex::new(()),
            ready: AtomicBool::new(true),
            aborted: AtomicBool::new(false),
            finalized: AtomicBool::new(false),
            graphs: AtomicUsize::new(0),
            abort_reason: Mutex::new(None),
            abort_end: Arc::default(),
            revoked: AtomicBool::new(false),
            revoke_reason: Mutex::new(None),
            #[cfg(feature = "testing")]
            injected: crate::fault::for_new_communicator(),
        };
        // SAFETY: `handle` is the live communicator NCCL just made, used by this thread only; a failure drops
        // `child`, which destroys it.
        child.rank = unsafe { self.library.comm_user_rank(handle.0) }.map_err(nccl_error)?;
        // SAFETY: as above.
        child.size = unsafe { self.library.comm_count(handle.0) }.map_err(nccl_error)?;
        Ok(child)
    }

    /// Marks the communicator revoked for `reason`; whether it was not already.
    fn mark_revoked(&self, reason: &str) -> bool {
        self.revoke_reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| reason.to_owned());
        !self.revoked.swap(true, Ordering::AcqRel)
    }

    /// The error of a call on a revoked communicator.
    fn revoked_error(&self, what: &str) -> Error {
        let reason = self.revoke_reason.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
        Error::Revoked { reason: format!("{what} on a revoked communicator: {reason}") }
    }

    /// The issue mutex, waiting at most [`ABORT_LOCK_WAIT`] for a thread inside NCCL; `None` past it.
    fn lock_issue_briefly(&self) -> Option<MutexGuard<'_, ()>> {
        let deadline = Instant::now() + ABORT_LOCK_WAIT;
        loop {
            match self.issue.try_lock() {
                Ok(guard) => return Some(guard),
                Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// The loaded NCCL library.
    pub fn library(&self) -> &'static Library {
        self.library
    }

    /// Whether the communicator was created non-blocking.
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// Counts a live graph that holds captured ops of this communicator ([`crate::Graph`]).
    pub(crate) fn graph_created(&self) {
        self.graphs.fetch_add(1, Ordering::AcqRel);
    }

    /// Uncounts a graph once it is destroyed.
    pub(crate) fn graph_destroyed(&self) {
        self.graphs.fetch_sub(1, Ordering::AcqRel);
    }

    fn aborted_error(&self) -> Error {
        let reason = self.abort_reason.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Error::Aborted { reason: reason.unwrap_or_else(|| "the communicator was aborted".into()) }
    }

    /// Waits for an abort another caller runs, at most [`ABORT_WAIT`] and not while graphs hold the communicator.
    fn wait_for_abort(&self) {
        if self.graphs.load(Ordering::Acquire) == 0 && !self.abort_end.wait(ABORT_WAIT) {
            tracing::error!(
                rank = self.rank,
                size = self.size,
                "ncclCommAbort has not returned within {ABORT_WAIT:?}; it goes on on its own thread"
            );
        }
    }

    /// Marks the communicator aborted for `reason` and takes its handle out, without calling NCCL: whoever
    /// holds the handle now (a split that did not finish) aborts it once NCCL lets go of it.
    /// Returns whether it took the handle (`false`: an abort had taken it already).
    fn retire(&self, reason: &str) -> bool {
        self.abort_reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| reason.to_owned());
        self.aborted.store(true, Ordering::Release);
        let taken = self.handle.write().unwrap_or_else(|e| e.into_inner()).take();
        tracing::warn!(rank = self.rank, size = self.size, reason, "retiring NCCL communicator");
        taken.is_some()
    }

    /// Marks the communicator aborted for `reason` (the first reason stays): no call gets through from now on.
    fn mark_aborted(&self, reason: &str) {
        self.abort_reason.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| reason.to_owned());
        self.aborted.store(true, Ordering::Release);
    }

    /// The live handle, or the aborted error.
    fn live(&self) -> pg_core::Result<RawComm> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(self.aborted_error());
        }
        let handle = *self.handle.read().unwrap_or_else(|e| e.into_inner());
        handle.ok_or_else(|| self.aborted_error())
    }

    fn lock_issue(&self) -> MutexGuard<'_, ()> {
        self.issue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The asynchronous state: success, in-progress, or an error.
    fn async_state(&self) -> pg_core::Result<Status> {
        let handle = self.handle.read().unwrap_or_else(|e| e.into_inner());
        let Some(comm) = *handle else { return Err(self.aborted_error()) };
        let start = Instant::now();
        // SAFETY: the handle is live while the read lock is held (abort and drop take it under the write
        // lock), and NCCL allows this query concurrently with calls on the communicator.
        let state = unsafe { self.library.comm_get_async_error(comm.0) }.map_err(nccl_error);
        self.note_slow("ncclCommGetAsyncError", start);
        state
    }

    /// Logs an NCCL call of this communicator that held its thread for longer than [`SLOW_CALL`]: where a host
    /// thread waited on the library (a peer's death, a revoke) shows in the log.
    fn note_slow(&self, call: &str, start: Instant) {
        let took = start.elapsed();
        if took > SLOW_CALL {
            tracing::warn!(
                rank = self.rank,
                size = self.size,
                call,
                took_ms = took.as_millis() as u64,
                "slow NCCL call"
            );
        }
    }

    /// Waits while the communicator reports in-progress (a non-blocking init or call); fails on its error or
    /// an abort.
    fn wait_while_in_progress(&self) -> pg_core::Result<()> {
        let mut pause = Duration::from_micros(1);
        loop {
            let state = self.async_state()?;
            if state.is_success() {
                return Ok(());
            }
            if state.is_error() {
                return Err(self.state_error(state));
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }

    fn state_error(&self, state: Status) -> Error {
        let comm = self.live().map(|c| c.0).unwrap_or(std::ptr::null_mut());
        // SAFETY: `comm` is live or null; reading the last error is allowed from this thread.
        let last = unsafe { self.library.last_error(comm) };
        let text = self.library.error_string(state);
        Error::communicator(format!(
            "NCCL async error {state}: {text}{}",
            if last.is_empty() { String::new() } else { format!("; last error: {last}") }
        ))
    }

    /// Issues one call under the issue mutex, on the device's context, and finishes an in-progress return;
    /// `name` goes to the launch log (with the `testing` feature).
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    fn issue(
        &self,
        name: &'static str,
        stream: &Stream,
        call: impl FnOnce(&Library, nccl_sys::Comm) -> nccl_sys::Result<Status>,
    ) -> pg_core::Result<()> {
        #[cfg(feature = "testing")]
        if let Some(op) = self.injected.as_ref().and_then(crate::fault::Injected::kills_now) {
            // Dead at once, quietly: no call gets through any more; the connections close when the dead rank's
            // group lets go of the communicator (the slow `ncclCommAbort`), as a process's die with it.
            self.mark_aborted(&format!("injected fault: rank {} killed during operation {op}", self.rank));
            return Ok(());
        }
        let _issuing = self.lock_issue();
        let comm = self.live()?;
        #[cfg(feature = "testing")]
        if let Some(error) = self.injected.as_ref().and_then(|fault| fault.error(self.rank)) {
            return Err(error);
        }
        if self.revoked.load(Ordering::Acquire) {
            return Err(self.revoked_error(name));
        }
        if !self.ready.load(Ordering::Acquire) {
            self.wait_while_in_progress()?;
            self.ready.store(true, Ordering::Release);
        }
        self.device.bind_to_thread().map_err(cuda_error)?;
        #[cfg(feature = "testing")]
        let before = launches::before(&self.device, &stream.0);
        #[cfg(feature = "testing")]
        let timed = call_timing::enabled().then(std::time::Instant::now);
        let status = call(self.library, comm.0).map_err(nccl_error);
        #[cfg(feature = "testing")]
        if let Some(started) = timed {
            call_timing::add(started.elapsed());
        }
        let status = status?;
        if status.is_in_progress() {
            self.wait_while_in_progress()?;
        }
        #[cfg(feature = "testing")]
        launches::log(&self.device, &stream.0, KernelKind::Comm, name, before);
        #[cfg(feature = "testing")]
        if let Some(fault) = &self.injected {
            fault.issued(&self.device, &stream.0);
        }
        Ok(())
    }

    /// `buffers` are on this communicator's device ([`args::on_device`]).
    fn check_device(&self, what: &str, buffers: &[&Buffer]) -> pg_core::Result<()> {
        buffers.iter().try_for_each(|buffer| args::on_device(what, *buffer, self.device.ordinal()))
    }

    /// `input` and `output` on this device, of one dtype, sized as `out_per_in` says ([`args::scaled`]).
    fn check_pair(
        &self,
        what: &str,
        input: &Buffer,
        output: &Buffer,
        out_per_in: (usize, usize),
    ) -> pg_core::Result<()> {
        self.check_device(what, &[input, output])?;
        args::scaled(what, input, output, out_per_in, self.size)
    }

    /// Gather's outputs or scatter's inputs (`which`): a root in range, on the root one buffer per rank like `like`,
    /// none elsewhere ([`args::root_list`]), every buffer on this device.
    fn check_root_list(
        &self,
        (what, which): (&str, &str),
        list: &[Buffer],
        root: usize,
        like: &Buffer,
    ) -> pg_core::Result<()> {
        args::rank_in_range(what, "root", root, self.size)?;
        self.check_device(what, &[like])?;
        args::root_list(what, which, list, (root, self.rank, self.size), like)?;
        list.iter().try_for_each(|buffer| self.check_device(what, &[buffer]))
    }

    /// Lists (each named) of one buffer per rank (a list of one is a single buffer), all of one dtype on this
    /// device; the dtype.
    fn check_lists(&self, what: &str, lists: &[(&str, &[Buffer])]) -> pg_core::Result<pg_core::DType> {
        let first = lists
            .iter()
            .find_map(|(_, list)| list.first())
            .ok_or_else(|| Error::invalid(format!("{what}: no buffers")))?;
        for (which, list) in lists {
            if list.len() != 1 {
                args::per_rank(what, which, list.len(), self.size)?;
            }
            for buffer in *list {
                self.check_device(what, &[buffer])?;
                args::same_dtype(what, first.dtype, buffer.dtype)?;
            }
        }
        Ok(first.dtype)
    }

    /// Issues `calls` as one NCCL group under the issue mutex (see [`exchange::grouped`]).
    fn issue_grouped(
        &self,
        name: &'static str,
        stream: &Stream,
        dtype: pg_core::DType,
        calls: &[Call],
    ) -> pg_core::Result<()> {
        self.issue(name, stream, |lib, comm| {
            // SAFETY: every call's pointer is a buffer of this device holding its count of `dtype` (checked by
            // the callers), kept alive by the process group until the stream passes the op; the issue mutex is
            // held.
            unsafe { exchange::grouped(lib, comm, stream.0.raw() as _, data_type(dtype), calls) }
        })
    }

    /// Enqueues a reduce of `input` into `root`'s `output`.
    pub fn reduce(
        &self,
        input: &Buffer,
        output: &Buffer,
        op: ReduceOp,
        root: usize,
        stream: &Stream,
    ) -> pg_core::Result<()> {
        self.check_pair("reduce", input, output, (1, 1))?;
        let plan = premul::plan(op, input.dtype)?;
        self.issue("reduce", stream, |lib, comm| {
            // SAFETY: both buffers hold `numel` elements of the dtype on the communicator's device (checked), and
            // stay allocated until the stream passes this op (the process group records them on the stream);
            // the issue mutex is held.
            unsafe {
                premul::with_op(lib, comm, &plan, input.dtype, |op| {
                    lib.reduce(
                        input.ptr(),
                        output.ptr(),
                        input.numel,
                        data_type(input.dtype),
                        op,
                        root,
                        comm,
                        stream.0.raw() as _,
                    )
                })
            }
        })
    }
}

impl Communicator {
    /// The plan of a `PREMUL_SUM` whose factor is `scalar`: one element of `input`'s dtype on this device.
    fn device_factor(&self, what: &str, input: &Buffer, scalar: &Buffer) -> pg_core::Result<OpPlan> {
        self.check_device(what, &[scalar])?;
        args::pre_mul_sum_factor(what, input, scalar)?;
        premul::device_plan(scalar.ptr(), input.dtype)
    }

    /// Enqueues an all-reduce with `plan`'s reduction (checked by the caller, as are the buffers).
    fn all_reduce_with(&self, input: &Buffer, output: &Buffer, plan: &OpPlan, stream: &Stream) -> pg_core::Result<()> {
        self.issue("all_reduce", stream, |lib, comm| {
            // SAFETY: as in `reduce`; a device factor is one element of the dtype on this device (checked), kept
            // allocated by the process group until the stream passes this op.
            unsafe {
                premul::with_op(lib, comm, plan, input.dtype, |op| {
                    lib.all_reduce(
                        input.ptr(),
                        output.ptr(),
                        input.numel,
                        data_type(input.dtype),
                        op,
                        comm,
                        stream.0.raw() as _,
                    )
                })
            }
        })
    }

    /// Enqueues a reduce-scatter with `plan`'s reduction (checked by the caller, as are the buffers).
    fn reduce_scatter_with(
        &self,
        input: &Buffer,
        output: &Buffer,
        plan: &OpPlan,
        stream: &Stream,
    ) -> pg_core::Result<()> {
        self.issue("reduce_scatter", stream, |lib, comm| {
            // SAFETY: as in `reduce`; the input holds `size` times the output (checked); a device factor as in
            // `all_reduce_with`.
            unsafe {
                premul::with_op(lib, comm, plan, input.dtype, |op| {
                    lib.reduce_scatter(
                        input.ptr(),
                        output.ptr(),
                        output.numel,
                        data_type(input.dtype),
                        op,
                        comm,
                        stream.0.raw() as _,
                    )
                })
            }
        })
    }
}

impl pg_core::Communicator for Communicator {
    type B = Nccl;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce(&self, input: &Buffer, output: &Buffer, op: ReduceOp, stream: &Stream) -> pg_core::Result<()> {
        self.check_pair("all_reduce", input, output, (1, 1))?;
        let plan = premul::plan(op, input.dtype)?;
        self.all_reduce_with(input, output, &plan, stream)
    }

    fn all_reduce_pre_mul_sum(
        &self,
        input: &Buffer,
        output: &Buffer,
        scalar: &Buffer,
        stream: &Stream,
    ) -> pg_core::Result<()> {
        self.check_pair("all_reduce", input, output, (1, 1))?;
        let plan = self.device_factor("all_reduce", input, scalar)?;
        self.all_reduce_with(input, output, &plan, stream)
    }

    fn broadcast(&self, input: &Buffer, output: &Buffer, root: usize, stream: &Stream) -> pg_core::Result<()> {
        self.check_pair("broadcast", input, output, (1, 1))?;
        args::rank_in_range("broadcast", "root", root, self.size)?;
        self.issue("broadcast", stream, |lib, comm| {
            // SAFETY: as in `reduce`.
            unsafe {
                lib.broadcast(
                    input.ptr(),
                    output.ptr(),
                    input.numel,
                    data_type(input.dtype),
                    root,
                    comm,
                    stream.0.raw() as _,
                )
            }
        })
    }

    fn all_gather(&self, input: &Buffer, output: &Buffer, stream: &Stream) -> pg_core::Result<()> {
        self.check_pair("all_gather", input, output, (self.size, 1))?;
        self.issue("all_gather", stream, |lib, comm| {
            // SAFETY: as in `reduce`; the output holds `size` times the input (checked).
            unsafe {
                lib.all_gather(
                    input.ptr(),
                    output.ptr(),
                    input.numel,
                    data_type(input.dtype),
                    comm,
                    stream.0.raw() as _,
                )
            }
        })
    }

    fn reduce_scatter(&self, input: &Buffer, output: &Buffer, op: ReduceOp, stream: &Stream) -> pg_core::Result<()> {
        self.check_pair("reduce_scatter", input, output, (1, self.size))?;
        let plan = premul::plan(op, input.dtype)?;
        self.reduce_scatter_with(input, output, &plan, stream)
    }

    fn reduce_scatter_pre_mul_sum(
        &self,
        input: &Buffer,
        output: &Buffer,
        scalar: &Buffer,
        stream: &Stream,
    ) -> pg_core::Result<()> {
        self.check_pair("reduce_scatter", input, output, (1, self.size))?;
        let plan = self.device_factor("reduce_scatter", input, scalar)?;
        self.reduce_scatter_with(input, output, &plan, stream)
    }

    fn send(&self, buffer: &Buffer, peer: usize, stream: &Stream) -> pg_core::Result<()> {
        self.check_device("send", &[buffer])?;
        args::peer("send", peer, self.rank, self.size)?;
        self.issue("send", stream, |lib, comm| {
            // SAFETY: as in `reduce`.
            unsafe { lib.send(buffer.ptr(), buffer.numel, data_type(buffer.dtype), peer, comm, stream.0.raw() as _) }
        })
    }

    fn recv(&self, buffer: &Buffer, peer: usize, stream: &Stream) -> pg_core::Result<()> {
        self.check_device("recv", &[buffer])?;
        args::peer("recv", peer, self.rank, self.size)?;
        self.issue("recv", stream, |lib, comm| {
            // SAFETY: as in `reduce`.
            unsafe { lib.recv(buffer.ptr(), buffer.numel, data_type(buffer.dtype), peer, comm, stream.0.raw() as _) }
        })
    }

    fn reduce(
        &self,
        input: &Buffer,
        output: &Buffer,
        root: usize,
        op: ReduceOp,
        stream: &Stream,
    ) -> pg_core::Result<()> {
        args::rank_in_range("reduce", "root", root, self.size)?;
        Communicator::reduce(self, input, output, op, root, stream)
    }

    fn gather(&self, input: &Buffer, outputs: &[Buffer], root: usize, stream: &Stream) -> pg_core::Result<()> {
        self.check_root_list(("gather", "outputs"), outputs, root, input)?;
        let mut calls: Vec<Call> = exchange::send(input, root).into_iter().collect();
        calls.extend(outputs.iter().enumerate().filter_map(|(peer, out)| exchange::recv(out, peer)));
        self.issue_grouped("gather", stream, input.dtype, &calls)
    }

    fn scatter(&self, inputs: &[Buffer], output: &Buffer, root: usize, stream: &Stream) -> pg_core::Result<()> {
        self.check_root_list(("scatter", "inputs"), inputs, root, output)?;
        let mut calls: Vec<Call> =
            inputs.iter().enumerate().filter_map(|(peer, inp)| exchange::send(inp, peer)).collect();
        calls.extend(exchange::recv(output, root));
        self.issue_grouped("scatter", stream, output.dtype, &calls)
    }

    fn all_to_all_single(
        &self,
        input: &Buffer,
        output: &Buffer,
        input_splits: &[usize],
        output_splits: &[usize],
        stream: &Stream,
    ) -> pg_core::Result<()> {
        // Sizes may differ; the dtype and the device must agree.
        self.check_lists(
            "all_to_all_single",
            &[("input", std::slice::from_ref(input)), ("output", std::slice::from_ref(output))],
        )?;
        let calls =
            exchange::all_to_all_calls("all_to_all_single", input, output, input_splits, output_splits, self.size)?;
        self.issue_grouped("all_to_all_single", stream, input.dtype, &calls)
    }

    fn all_to_all(&self, inputs: &[Buffer], outputs: &[Buffer], stream: &Stream) -> pg_core::Result<()> {
        let dtype = self.check_lists("all_to_all", &[("inputs", inputs), ("outputs", outputs)])?;
        let mut calls = Vec::with_capacity(2 * self.size);
        for peer in 0..self.size {
            calls.extend(exchange::send(&inputs[peer], peer));
            calls.extend(exchange::recv(&outputs[peer], peer));
        }
        self.issue_grouped("all_to_all", stream, dtype, &calls)
    }

    fn all_gather_v(&self, input: &Buffer, outputs: &[Buffer], stream: &Stream) -> pg_core::Result<()> {
        self.check_lists("all_gather_v", &[("outputs", outputs), ("input", std::slice::from_ref(input))])?;
        // One broadcast per rank, as PyTorch gathers tensors of different sizes.
        let calls: Vec<Call> = outputs
            .iter()
            .enumerate()
            .filter(|(_, out)| out.numel > 0)
            .map(|(root, out)| {
                let send = if root == self.rank { input.ptr() } else { out.ptr() };
                Call::Broadcast { send, recv: out.ptr(), count: out.numel, root }
            })
            .collect();
        self.issue_grouped("all_gather_v", stream, input.dtype, &calls)
    }

    fn reduce_scatter_v(
        &self,
        inputs: &[Buffer],
        output: &Buffer,
        op: ReduceOp,
        stream: &Stream,
    ) -> pg_core::Result<()> {
        self.check_lists("reduce_scatter_v", &[("inputs", inputs), ("output", std::slice::from_ref(output))])?;
        let nccl_op = red_op(op, output.dtype)?;
        // One reduce per rank, as PyTorch reduce-scatters tensors of different sizes.
        let calls: Vec<Call> = inputs
            .iter()
            .enumerate()
            .filter(|(_, inp)| inp.numel > 0)
            .map(|(root, inp)| {
                let recv = if root == self.rank { output.ptr() } else { inp.ptr() };
                Call::Reduce { send: inp.ptr(), recv, count: inp.numel, root, op: nccl_op }
            })
            .collect();
        self.issue_grouped("reduce_scatter_v", stream, output.dtype, &calls)
    }

    fn group_start(&self) -> pg_core::Result<()> {
        self.library.group_start().map(|_| ()).map_err(nccl_error)?;
        #[cfg(feature = "testing")]
        launches::group_opened();
        Ok(())
    }

    fn group_end(&self) -> pg_core::Result<()> {
        #[cfg(feature = "testing")]
        launches::group_closed();
        let _issuing = self.lock_issue();
        self.device.bind_to_thread().map_err(cuda_error)?;
        // SAFETY: the group's operations were issued by this thread through this communicator, whose process
        // group keeps their buffers alive (record_stream or stash) until the stream passes them.
        let status = unsafe { self.library.group_end() }.map_err(nccl_error)?;
        if status.is_in_progress() {
            self.wait_while_in_progress()?;
        }
        Ok(())
    }

    fn split(&self, color: Option<u32>, key: usize, config: &CommConfig) -> pg_core::Result<Option<Self>> {
        let nccl_color = match color {
            Some(color) => i32::try_from(color)
                .map_err(|_| Error::invalid(format!("split color {color} is above NCCL's int range")))?,
            None => nccl_sys::sys::NCCL_SPLIT_NOCOLOR,
        };
        let nccl_key =
            i32::try_from(key).map_err(|_| Error::invalid(format!("split key {key} is above NCCL's int range")))?;
        let _issuing = self.lock_issue();
        let comm = self.live()?;
        let call_name = "ncclCommSplit, which did not finish in time (not every rank of the parent called it)";
        let kind = SplitKind::Split { color: nccl_color, key: nccl_key };
        let reasons = ("a split of this communicator timed out", call_name);
        let description = || format!("{} split color {nccl_color}", self.description);
        let Some(child) = self.derive(comm, kind, config, reasons, description)? else {
            return Ok(None);
        };
        tracing::debug!(rank = child.rank, size = child.size, color = nccl_color, key, "NCCL communicator split");
        Ok(Some(child))
    }

    fn shrink(&self, excluded: &[usize], mode: ShrinkMode, config: &CommConfig) -> pg_core::Result<Self> {
        let sorted = ShrinkMode::checked_exclusion(excluded, self.size, self.rank)?;
        let _issuing = self.lock_issue();
        let comm = self.live()?;
        let flags = match mode {
            ShrinkMode::Default => nccl_sys::sys::NCCL_SHRINK_DEFAULT,
            ShrinkMode::Abort => nccl_sys::sys::NCCL_SHRINK_ABORT,
        };
        if mode == ShrinkMode::Abort {
            // NCCL stops the parent's ops; nothing may be issued on it afterwards.
            self.mark_revoked("the communicator was shrunk with NCCL_SHRINK_ABORT");
        }
        let what = format!(
            "ncclCommShrink excluding {sorted:?}, which did not finish in time (not every other rank called it)"
        );
        let kind = SplitKind::Shrink { excluded: sorted.clone(), flags };
        let reasons = ("a shrink of this communicator timed out", what.as_str());
        let description = || format!("{} shrunk without {sorted:?}", self.description);
        let child = self
            .derive(comm, kind, config, reasons, description)?
            .ok_or_else(|| Error::Backend("ncclCommShrink returned no communicator for a rank it keeps".to_owned()))?;
        tracing::info!(rank = child.rank, size = child.size, excluded = ?sorted, ?mode, "NCCL communicator shrunk");
        Ok(child)
    }

    fn grow_unique_id(&self) -> pg_core::Result<UniqueId> {
        grow_support(self.library)?;
        if self.is_revoked() {
            return Err(self.revoked_error("grow_unique_id"));
        }
        let _issuing = self.lock_issue();
        let comm = self.live()?;
        self.device.bind_to_thread().map_err(cuda_error)?;
        // SAFETY: the handle is live and this thread holds the issue mutex.
        let id = unsafe { self.library.comm_get_unique_id(comm.0) }.map_err(nccl_error)?;
        Ok(UniqueId(id.to_bytes().to_vec()))
    }

    fn grow(&self, added: usize, id: Option<&UniqueId>, config: &CommConfig) -> pg_core::Result<Self> {
        grow_support(self.library)?;
        if added == 0 {
            return Err(Error::invalid("grow: added is 0; a grow adds at least one rank"));
        }
        let nranks =
            self.size.checked_add(added).filter(|&n| i32::try_from(n).is_ok()).ok_or_else(|| {
                Error::invalid(format!("grow: {} + {added} ranks is above NCCL's int range", self.size))
            })?;
        if self.is_revoked() {
            return Err(self.revoked_error("grow"));
        }
        let id = id.map(nccl_id).transpose()?;
        let _issuing = self.lock_issue();
        let comm = self.live()?;
        let what = format!(
            "ncclCommGrow to {nranks} ranks, which did not finish in time (not every rank, old and new, called it)"
        );
        let kind = SplitKind::Grow { nranks, id };
        let reasons = ("a grow of this communicator timed out", what.as_str());
        let description = || format!("{} grown to {nranks}", self.description);
        let child = self
            .derive(comm, kind, config, reasons, description)?
            .ok_or_else(|| Error::Backend("ncclCommGrow returned no communicator".to_owned()))?;
        tracing::info!(rank = child.rank, size = child.size, added, "NCCL communicator grown");
        Ok(child)
    }

    fn revoke(&self, reason: &str) -> pg_core::Result<()> {
        let comm = self.live()?;
        // Checked before anything changes: an NCCL without revoke leaves the communicator as it was, and the
        // process group aborts it instead.
        if self.library.version() < nccl_sys::REVOKE_VERSION || self.library.functions().comm_revoke.is_none() {
            return Err(nccl_error(nccl_sys::Error::TooOld {
                call: "ncclCommRevoke",
                version: self.library.version(),
                needs: nccl_sys::REVOKE_VERSION,
            }));
        }
        if !self.mark_revoked(reason) {
            return Ok(());
        }
        // As abort: prefer the issue mutex, but revoke under a thread that stays inside NCCL.
        let _issuing = self.lock_issue_briefly();
        tracing::warn!(rank = self.rank, size = self.size, reason, "revoking NCCL communicator");
        self.device.bind_to_thread().map_err(cuda_error)?;
        let start = Instant::now();
        // SAFETY: the handle is live (it is only taken out by abort and drop, and the revoked mark keeps every new
        // call away); NCCL's revoke is meant to be called while ops of the communicator are stuck.
        let status = unsafe { self.library.comm_revoke(comm.0) }.map_err(nccl_error)?;
        self.note_slow("ncclCommRevoke", start);
        if status.is_in_progress() {
            self.wait_while_in_progress()?;
            self.note_slow("ncclCommRevoke (until done)", start);
        }
        Ok(())
    }

    fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    fn is_ready(&self) -> pg_core::Result<bool> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(true);
        }
        let state = self.async_state()?;
        if state.is_error() {
            return Err(self.state_error(state));
        }
        let ready = state.is_success();
        if ready {
            self.ready.store(true, Ordering::Release);
        }
        Ok(ready)
    }

    fn async_error(&self) -> pg_core::Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(self.aborted_error());
        }
        #[cfg(feature = "testing")]
        if let Some(error) = self.injected.as_ref().and_then(|fault| fault.error(self.rank)) {
            return Err(error);
        }
        let state = self.async_state()?;
        if state.is_error() {
            Err(self.state_error(state))
        } else {
            Ok(())
        }
    }

    fn abort(&self, reason: &str) -> pg_core::Result<()> {
        self.mark_aborted(reason);
        // No call can start after this: every call reads the handle under the lock first.
        let taken = {
            let mut handle = self.handle.write().unwrap_or_else(|e| e.into_inner());
            let taken = handle.take();
            if taken.is_some() {
                self.abort_end.start();
            }
            taken
        };
        let Some(comm) = taken else {
            // Another caller's abort (the watchdog's, say) is under way: this one returns once NCCL's has, waiting
            // as long as that caller does, so that a program that aborts and then exits does not tear CUDA down
            // under it. Graphs that hold the communicator keep NCCL's abort from returning: nobody waits then.
            self.wait_for_abort();
            return Ok(());
        };
        // Prefer aborting with the issue mutex held; if a thread stays inside NCCL (blocked on a peer), abort
        // under it, which is what NCCL's abort is for.
        let deadline = Instant::now() + ABORT_LOCK_WAIT;
        let _issuing = loop {
            match self.issue.try_lock() {
                Ok(guard) => break Some(guard),
                Err(TryLockError::Poisoned(poisoned)) => break Some(poisoned.into_inner()),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(TryLockError::WouldBlock) => break None,
            }
        };
        tracing::warn!(rank = self.rank, size = self.size, reason, "aborting NCCL communicator");
        // NCCL's abort runs on a thread of its own, which the caller waits for at most ABORT_WAIT: it returns only
        // once every graph holding captured ops of the communicator is destroyed (the program may keep one; the
        // graph refuses to launch, the communicator being marked aborted), and it can hang outright when peers
        // went away mid-transfer. No host call of pg blocks on it past the bound.
        let with_graphs = self.graphs.load(Ordering::Acquire) > 0;
        let (library, device, end) = (self.library, self.device.clone(), Arc::clone(&self.abort_end));
        let (done, finished) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new().name("pg-nccl abort".into()).spawn(move || {
            // The whole handle moves here (it may cross threads), not its raw pointer alone.
            let comm = comm;
            // Bind the device so NCCL's teardown runs in the right context; a failure here does not stop the abort.
            let _ = device.bind_to_thread();
            // SAFETY: `comm` was live and is now out of the handle, so no new call can reach it; a thread already
            // inside a call is allowed by NCCL's abort contract.
            let result = unsafe { library.comm_abort(comm.0) };
            end.finish();
            // A caller that still waits gets the result; else (graphs held it, or it stopped waiting) it is logged.
            if let Err(std::sync::mpsc::SendError(Err(error))) = done.send(result.map(drop)) {
                tracing::warn!(%error, "ncclCommAbort failed");
            }
        });
        spawned.map_err(|e| Error::Backend(format!("cannot start the abort thread: {e}")))?;
        if with_graphs {
            return Ok(());
        }
        match finished.recv_timeout(ABORT_WAIT) {
            Ok(result) => result.map_err(nccl_error),
            Err(_) => {
                tracing::error!(
                    rank = self.rank,
                    size = self.size,
                    "ncclCommAbort has not returned within {ABORT_WAIT:?}; it goes on on its own thread (the \
                     communicator takes no call, and its resources are freed only if it returns)"
                );
                Ok(())
            }
        }
    }

    fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    fn finalize(&self) -> pg_core::Result<()> {
        let _issuing = self.lock_issue();
        let comm = self.live()?;
        if self.revoked.load(Ordering::Acquire) {
            // NCCL answers ncclInvalidUsage: the revoked communicator has nothing to flush; dropping destroys it.
            return Err(self.revoked_error("ncclCommFinalize (invalid after ncclCommRevoke; destroy it instead)"));
        }
        if self.graphs.load(Ordering::Acquire) > 0 {
            // NCCL's finalize would wait for the graphs to be destroyed: the communicator is marked finalized (no
            // op and no launch of those graphs runs on it), and the destroy that follows the last graph finalizes.
            self.finalized.store(true, Ordering::Release);
            tracing::info!(rank = self.rank, "finalize deferred to the destroy: CUDA graphs hold the communicator");
            return Ok(());
        }
        self.device.bind_to_thread().map_err(cuda_error)?;
        // SAFETY: the handle is live and the issue mutex is held.
        let status = unsafe { self.library.comm_finalize(comm.0) }.map_err(nccl_error)?;
        self.finalized.store(true, Ordering::Release);
        if status.is_in_progress() {
            self.wait_while_in_progress()?;
        }
        Ok(())
    }

    fn is_finalized(&self) -> bool {
        self.finalized.load(Ordering::Acquire)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let taken = self.handle.get_mut().unwrap_or_else(|e| e.into_inner()).take();
        let Some(comm) = taken else {
            // An abort took the handle: the last owner lets go only once NCCL's abort returned (see `abort`).
            self.wait_for_abort();
            return;
        };
        let _ = self.device.bind_to_thread();
        // SAFETY: `&mut self`: no other thread can hold the handle; it was live (not aborted).
        if let Err(err) = unsafe { self.library.comm_destroy(comm.0) } {
            tracing::warn!(rank = self.rank, %err, "ncclCommDestroy failed");
        }
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device.ordinal())
            .field("nonblocking", &self.nonblocking)
            .field("description", &self.description)
            .field("aborted", &self.aborted.load(Ordering::Acquire))
            .finish()
    }
}

/// Host time spent inside NCCL's enqueue calls, for telling the process group's own overhead from NCCL's
/// (the benchmark reads it). Only with the `testing` feature, and then off unless `PG_NCCL_TIME_CALLS=1`, so the
/// enqueue path pays one branch.
#[cfg(feature = "testing")]
pub mod call_timing {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    use std::time::Duration;

    static CALLS: AtomicU64 = AtomicU64::new(0);
    static NANOS: AtomicU64 = AtomicU64::new(0);

    /// Whether `PG_NCCL_TIME_CALLS=1` (read once).
    pub fn enabled() -> bool {
        static ENABLED: OnceLock<bool> = OnceLock::new();
        *ENABLED.get_or_init(|| std::env::var("PG_NCCL_TIME_CALLS").as_deref() == Ok("1"))
    }

    pub(crate) fn add(elapsed: Duration) {
        CALLS.fetch_add(1, Ordering::Relaxed);
        NANOS.fetch_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Calls timed so far and their total host time (process-wide).
    pub fn totals() -> (u64, Duration) {
        (CALLS.load(Ordering::Relaxed), Duration::from_nanos(NANOS.load(Ordering::Relaxed)))
    }
}

#[cfg(test)]
mod tests {
    use pg_core::ErrorKind;

    use super::*;

    #[test]
    fn grow_is_refused_by_name_before_nccl_2_29_and_without_its_symbols() {
        let old = grow_refusal(nccl_sys::Version::new(2, 28, 9), (true, true)).map(nccl_error).expect("2.28.9");
        assert_eq!(old.kind(), ErrorKind::Unsupported);
        let text = old.to_string();
        assert!(text.contains("ncclCommGrow needs NCCL 2.29.0 or newer; the loaded NCCL is 2.28.9"), "{text}");
        let missing =
            grow_refusal(nccl_sys::Version::new(2, 29, 2), (true, false)).map(nccl_error).expect("no id call");
        assert_eq!(missing.kind(), ErrorKind::Unsupported);
        assert!(missing.to_string().contains("ncclCommGetUniqueId is not available in NCCL 2.29.2"), "{missing}");
        let no_grow = grow_refusal(nccl_sys::Version::new(2, 30, 0), (false, true)).map(nccl_error).expect("no grow");
        assert!(no_grow.to_string().contains("ncclCommGrow is not available in NCCL 2.30.0"), "{no_grow}");
        assert!(grow_refusal(nccl_sys::Version::new(2, 29, 2), (true, true)).is_none());
    }
}
