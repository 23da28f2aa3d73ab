//! The loader and the result level: one method per NCCL call, each returning `Result`.

use std::ffi::{c_int, CStr, OsString};
use std::path::PathBuf;
use std::sync::OnceLock;

use crate::config::{Config, ConfigLayout};
use crate::error::{Error, Result};
use crate::status::Status;
use crate::sys::{self, cudaStream_t, Comm, DataType, Functions, RedOp, UniqueId};
use crate::version::{Version, GROW_VERSION, MIN_VERSION, REVOKE_VERSION, SHRINK_VERSION};

/// The environment variable naming an explicit NCCL library path; when set, only that path is tried.
pub const LIBRARY_ENV: &str = "PG_NCCL_LIBRARY";

/// The names tried, in order, when [`LIBRARY_ENV`] is not set.
pub const LIBRARY_CANDIDATES: [&str; 2] = ["libnccl.so.2", "libnccl.so"];

/// A loaded NCCL library: its function table, version and config layout.
///
/// The library stays loaded for the life of this value; [`library`] keeps one for the whole process.
#[derive(Debug)]
pub struct Library {
    path: PathBuf,
    version: Version,
    layout: ConfigLayout,
    fns: Functions,
    // The function pointers in `fns` point into this library, so it must outlive them (it is dropped last).
    _library: libloading::Library,
}

/// The process-wide NCCL library, loaded at the first call (by [`Library::load`]); the same result after.
pub fn library() -> Result<&'static Library> {
    static LIBRARY: OnceLock<Result<Library>> = OnceLock::new();
    LIBRARY.get_or_init(Library::load).as_ref().map_err(Clone::clone)
}

impl Library {
    /// Loads NCCL from [`LIBRARY_ENV`] if set, else from [`LIBRARY_CANDIDATES`], and checks its version.
    pub fn load() -> Result<Self> {
        Self::load_with_env(std::env::var_os(LIBRARY_ENV))
    }

    /// [`Library::load`] with the environment variable's value passed in (for tests).
    pub fn load_with_env(explicit: Option<OsString>) -> Result<Self> {
        match explicit.filter(|path| !path.is_empty()) {
            Some(path) => Self::load_from(&[PathBuf::from(path)]),
            None => Self::load_from(&LIBRARY_CANDIDATES.map(PathBuf::from)),
        }
    }

    /// Opens the first of `candidates` that loads, resolves the entry points and checks the version.
    pub fn load_from(candidates: &[PathBuf]) -> Result<Self> {
        let mut tried = Vec::new();
        for candidate in candidates {
            // SAFETY: opening a shared library runs its initialisers; libnccl's only set up its own state.
            match unsafe { libloading::Library::new(candidate.clone()) } {
                Ok(library) => return Self::from_library(candidate.clone(), library),
                Err(err) => tried.push((candidate.clone(), err.to_string())),
            }
        }
        Err(Error::LibraryNotFound { tried })
    }

    fn from_library(path: PathBuf, library: libloading::Library) -> Result<Self> {
        let fns = resolve(&path, &library)?;
        let mut code: c_int = 0;
        // SAFETY: `get_version` is `ncclGetVersion` from this library; it writes one int through the pointer.
        let status = Status(unsafe { (fns.get_version)(&mut code) });
        if !status.is_success() {
            return Err(Error::Call { call: "ncclGetVersion", status, detail: String::new() });
        }
        let version = Version::from_code(code.max(0) as u32);
        let layout = ConfigLayout::for_version(version)
            .filter(|_| version >= MIN_VERSION)
            .ok_or(Error::VersionTooOld { library: path.clone(), found: version, min: MIN_VERSION })?;
        Ok(Self { path, version, layout, fns, _library: library })
    }

    /// The path or name the library was opened by.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// The library's version (`ncclGetVersion`).
    pub fn version(&self) -> Version {
        self.version
    }

    /// The config layout used with this library.
    pub fn config_layout(&self) -> ConfigLayout {
        self.layout
    }

    /// A config for this library (`NCCL_CONFIG_INITIALIZER`), blocking or not.
    pub fn config(&self, blocking: bool) -> Config {
        Config::new(self.layout).with_blocking(blocking)
    }

    /// The raw function table, for callers that need an entry point directly.
    pub fn functions(&self) -> &Functions {
        &self.fns
    }

    /// `ncclGetErrorString` for a code.
    pub fn error_string(&self, status: Status) -> String {
        // SAFETY: ncclGetErrorString returns a pointer to a static string (or null) for any code.
        let text = unsafe { (self.fns.get_error_string)(status.0) };
        // SAFETY: a non-null result is a NUL-terminated static C string.
        unsafe { c_text(text) }
    }

    /// `ncclGetLastError`'s text for `comm` (null for the last error of any communicator); empty if none.
    ///
    /// # Safety
    /// `comm` must be null or a live communicator of this library.
    pub unsafe fn last_error(&self, comm: Comm) -> String {
        let Some(get_last_error) = self.fns.get_last_error else { return String::new() };
        // SAFETY: the caller guarantees `comm` is null or live; the result is a string NCCL owns.
        let text = unsafe { get_last_error(comm) };
        // SAFETY: a non-null result is NUL-terminated and lives until the next NCCL call on this thread.
        unsafe { c_text(text) }
    }

    /// Turns a raw code into `Ok(status)` (success or in-progress) or [`Error::Call`] with its text.
    ///
    /// # Safety
    /// `comm` must be null or a live communicator of this library (its last error is read).
    pub unsafe fn check(&self, call: &'static str, raw: sys::ncclResult_t, comm: Comm) -> Result<Status> {
        let status = Status(raw);
        if !status.is_error() {
            return Ok(status);
        }
        // SAFETY: forwarded from this function's contract.
        let last = unsafe { self.last_error(comm) };
        let mut detail = self.error_string(status);
        if !last.is_empty() {
            detail = format!("{detail}; last error: {last}");
        }
        Err(Error::Call { call, status, detail })
    }

    /// `ncclGetUniqueId`.
    pub fn get_unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId::zeroed();
        // SAFETY: writes 128 bytes into `id`, which is exactly that size.
        let raw = unsafe { (self.fns.get_unique_id)(&mut id) };
        // SAFETY: null comm.
        unsafe { self.check("ncclGetUniqueId", raw, std::ptr::null_mut()) }?;
        Ok(id)
    }

    /// `ncclCommInitRankConfig`: joins `id` as `rank` of `nranks` on the calling thread's current CUDA device.
    /// Returns the handle and `Status::IN_PROGRESS` for a non-blocking init still running.
    ///
    /// # Safety
    /// The calling thread's current CUDA context must be the device's the communicator is meant for.
    pub unsafe fn comm_init_rank_config(
        &self,
        nranks: usize,
        id: &UniqueId,
        rank: usize,
        config: &mut Config,
    ) -> Result<(Comm, Status)> {
        let call = "ncclCommInitRankConfig";
        let nranks = to_int(call, "nranks", nranks)?;
        let rank = to_int(call, "rank", rank)?;
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` and `config` are valid for writes/reads; `config` has this library's layout.
        let raw = unsafe { (self.fns.comm_init_rank_config)(&mut comm, nranks, *id, rank, config) };
        // SAFETY: `comm` is null or the handle NCCL just made.
        let status = unsafe { self.check(call, raw, std::ptr::null_mut()) }?;
        Ok((comm, status))
    }

    /// `ncclCommSplit` (NCCL 2.18 and later). NCCL writes the new communicator (null for no color) to `newcomm`
    /// once the split has finished: before returning when `comm` is blocking; later, from NCCL's own thread, when
    /// `comm` is non-blocking, whose split returns in-progress and whose async state (`comm_get_async_error` of
    /// `comm`) stays in-progress until then.
    ///
    /// # Safety
    /// `comm` must be live and used by no other thread during the call. `newcomm` must stay valid for writes until
    /// the split has finished, or until `comm` was aborted (NCCL's abort of a non-blocking communicator waits
    /// for the split's thread).
    pub unsafe fn comm_split(
        &self,
        comm: Comm,
        color: i32,
        key: i32,
        newcomm: *mut Comm,
        config: &mut Config,
    ) -> Result<Status> {
        let split = self.fns.comm_split.ok_or(Error::Unavailable { call: "ncclCommSplit", version: self.version })?;
        // SAFETY: the caller guarantees `comm` and `newcomm`; `config` is valid.
        let raw = unsafe { split(comm, color, key, newcomm, config) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclCommSplit", raw, comm) }
    }

    /// `ncclCommShrink` (NCCL 2.27 and later): a new communicator of every rank of `comm` but `excluded` (ranks of
    /// `comm`; every rank not excluded calls with the same list, the excluded ones do not), ranked in their order,
    /// made with `config`. `flags` is [`sys::NCCL_SHRINK_DEFAULT`] or [`sys::NCCL_SHRINK_ABORT`] (stop `comm`'s
    /// ops in flight first). NCCL writes the new handle to `newcomm` as [`Library::comm_split`] does (later, from
    /// its own thread, for a non-blocking `comm`).
    ///
    /// # Safety
    /// As [`Library::comm_split`].
    pub unsafe fn comm_shrink(
        &self,
        comm: Comm,
        excluded: &[usize],
        newcomm: *mut Comm,
        config: &mut Config,
        flags: c_int,
    ) -> Result<Status> {
        let call = "ncclCommShrink";
        let shrink = self.gated(call, self.fns.comm_shrink, SHRINK_VERSION)?;
        let mut ranks = excluded.iter().map(|&rank| to_int(call, "excluded rank", rank)).collect::<Result<Vec<_>>>()?;
        let count = to_int(call, "excluded count", ranks.len())?;
        let list = if ranks.is_empty() { std::ptr::null_mut() } else { ranks.as_mut_ptr() };
        // SAFETY: the caller guarantees `comm` and `newcomm`; `list` holds `count` ints for the call (NCCL copies
        // them); `config` has this library's layout.
        let raw = unsafe { shrink(comm, list, count, newcomm, config, flags) };
        // SAFETY: `comm` is live.
        unsafe { self.check(call, raw, comm) }
    }

    /// `ncclCommRevoke` (NCCL 2.28.7 and later) with [`sys::NCCL_REVOKE_DEFAULT`]: stops `comm`'s ops in flight
    /// without freeing it (in-progress on a non-blocking communicator until its async state turns success). After
    /// it `comm` may only be shrunk, split, destroyed or aborted: a finalize or an op is `ncclInvalidUsage`.
    ///
    /// # Safety
    /// `comm` must be live; no other thread may start a call on it during this one.
    pub unsafe fn comm_revoke(&self, comm: Comm) -> Result<Status> {
        let call = "ncclCommRevoke";
        let revoke = self.gated(call, self.fns.comm_revoke, REVOKE_VERSION)?;
        // SAFETY: the caller guarantees `comm`.
        let raw = unsafe { revoke(comm, sys::NCCL_REVOKE_DEFAULT) };
        // SAFETY: `comm` is live.
        unsafe { self.check(call, raw, comm) }
    }

    /// `ncclCommGetUniqueId` (NCCL 2.29 and later): the id the new ranks of a grow of `comm` join with (rank 0 of
    /// `comm` makes it).
    ///
    /// # Safety
    /// `comm` must be live and used by no other issuing thread.
    pub unsafe fn comm_get_unique_id(&self, comm: Comm) -> Result<UniqueId> {
        let call = "ncclCommGetUniqueId";
        let get = self.gated(call, self.fns.comm_get_unique_id, GROW_VERSION)?;
        let mut id = UniqueId::zeroed();
        // SAFETY: the caller guarantees `comm`; `id` is valid for a write of its size.
        let raw = unsafe { get(comm, &mut id) };
        // SAFETY: `comm` is live.
        unsafe { self.check(call, raw, comm) }?;
        Ok(id)
    }

    /// `ncclCommGrow` (NCCL 2.29 and later): existing ranks pass `comm` and `rank = None` (rank 0 of `comm` also
    /// the `id`), new ranks a null `comm`, the `id` and their new rank; the grown communicator of `nranks` ranks is
    /// written to `newcomm`. `comm` must have no op in flight.
    ///
    /// # Safety
    /// `comm` must be null (a new rank) or live and used by no other issuing thread; `newcomm` as in
    /// [`Library::comm_split`]. The calling thread's current CUDA context must be the device's.
    pub unsafe fn comm_grow(
        &self,
        comm: Comm,
        nranks: usize,
        id: Option<&UniqueId>,
        rank: Option<usize>,
        newcomm: *mut Comm,
    ) -> Result<Status> {
        let call = "ncclCommGrow";
        let grow = self.gated(call, self.fns.comm_grow, GROW_VERSION)?;
        let nranks = to_int(call, "nranks", nranks)?;
        let rank = match rank {
            Some(rank) => to_int(call, "rank", rank)?,
            None => -1,
        };
        let id = id.map_or(std::ptr::null(), |id| id as *const UniqueId);
        // SAFETY: forwarded from this function's contract; `id` is null or valid for the call; a null config
        // inherits `comm`'s (a new rank gets NCCL's defaults).
        let raw = unsafe { grow(comm, nranks, id, rank, newcomm, std::ptr::null_mut()) };
        // SAFETY: `comm` is live or null.
        unsafe { self.check(call, raw, comm) }
    }

    /// `entry` when the loaded library has it and is at least `needs`, else why not.
    fn gated<T>(&self, call: &'static str, entry: Option<T>, needs: Version) -> Result<T> {
        gate(call, entry, self.version, needs)
    }

    /// `ncclCommGetAsyncError`: the communicator's asynchronous state (success, in-progress or an error code).
    ///
    /// # Safety
    /// `comm` must be live. NCCL allows this call from any thread, concurrently with calls on `comm`.
    pub unsafe fn comm_get_async_error(&self, comm: Comm) -> Result<Status> {
        let mut state: sys::ncclResult_t = 0;
        // SAFETY: the caller guarantees `comm`; `state` is valid for a write.
        let raw = unsafe { (self.fns.comm_get_async_error)(comm, &mut state) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclCommGetAsyncError", raw, comm) }?;
        Ok(Status(state))
    }

    /// `ncclCommFinalize`: flushes issued operations (returns in-progress on a non-blocking communicator).
    ///
    /// # Safety
    /// `comm` must be live and used by no other thread during the call.
    pub unsafe fn comm_finalize(&self, comm: Comm) -> Result<Status> {
        // SAFETY: the caller guarantees `comm`.
        let raw = unsafe { (self.fns.comm_finalize)(comm) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclCommFinalize", raw, comm) }
    }

    /// `ncclCommDestroy`: frees the communicator. The handle is dead after the call, whatever it returns.
    ///
    /// # Safety
    /// `comm` must be live and used by no thread during or after the call.
    pub unsafe fn comm_destroy(&self, comm: Comm) -> Result<Status> {
        // SAFETY: the caller guarantees `comm`.
        let raw = unsafe { (self.fns.comm_destroy)(comm) };
        // SAFETY: the handle is gone: read the global last error only.
        unsafe { self.check("ncclCommDestroy", raw, std::ptr::null_mut()) }
    }

    /// `ncclCommAbort`: stops pending operations and frees the communicator; the handle is dead after.
    ///
    /// # Safety
    /// `comm` must be live; NCCL allows the call while another thread is blocked in a call on `comm`, but no
    /// thread may start a call on it after this one has begun.
    pub unsafe fn comm_abort(&self, comm: Comm) -> Result<Status> {
        // SAFETY: the caller guarantees `comm`.
        let raw = unsafe { (self.fns.comm_abort)(comm) };
        // SAFETY: the handle is gone: read the global last error only.
        unsafe { self.check("ncclCommAbort", raw, std::ptr::null_mut()) }
    }

    /// `ncclCommCount`.
    ///
    /// # Safety
    /// `comm` must be live.
    pub unsafe fn comm_count(&self, comm: Comm) -> Result<usize> {
        let mut count: c_int = 0;
        // SAFETY: the caller guarantees `comm`; `count` is valid for a write.
        let raw = unsafe { (self.fns.comm_count)(comm, &mut count) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclCommCount", raw, comm) }?;
        Ok(count.max(0) as usize)
    }

    /// `ncclCommUserRank`.
    ///
    /// # Safety
    /// `comm` must be live.
    pub unsafe fn comm_user_rank(&self, comm: Comm) -> Result<usize> {
        let mut rank: c_int = 0;
        // SAFETY: the caller guarantees `comm`; `rank` is valid for a write.
        let raw = unsafe { (self.fns.comm_user_rank)(comm, &mut rank) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclCommUserRank", raw, comm) }?;
        Ok(rank.max(0) as usize)
    }

    /// `ncclRedOpCreatePreMulSum`: a reduction that multiplies each rank's input by `scalar` before summing
    /// (PyTorch's `PREMUL_SUM`). With [`sys::ncclScalarHostImmediate`] NCCL copies the scalar during the call;
    /// with [`sys::ncclScalarDevice`] it reads it from device memory when each op using the returned op runs.
    ///
    /// # Safety
    /// `comm` must be live and used by no other issuing thread; `scalar` must point to one element of `dtype`, in
    /// host memory valid for the call (host-immediate) or in device memory of `comm`'s device that stays valid
    /// and unchanged until every op using the result has run (device).
    pub unsafe fn red_op_create_pre_mul_sum(
        &self,
        scalar: *mut std::ffi::c_void,
        dtype: DataType,
        residence: sys::ScalarResidence,
        comm: Comm,
    ) -> Result<RedOp> {
        let call = "ncclRedOpCreatePreMulSum";
        let create = self.fns.red_op_create_pre_mul_sum.ok_or(Error::Unavailable { call, version: self.version })?;
        let mut op: RedOp = 0;
        // SAFETY: forwarded from this function's contract; `op` is valid for a write.
        let raw = unsafe { create(&mut op, scalar, dtype, residence, comm) };
        // SAFETY: `comm` is live.
        unsafe { self.check(call, raw, comm) }?;
        Ok(op)
    }

    /// `ncclRedOpDestroy`: frees an op made by [`Library::red_op_create_pre_mul_sum`].
    ///
    /// # Safety
    /// `comm` must be live and the communicator `op` was made for; no op using `op` may be issued afterwards
    /// (ops already enqueued may still run: NCCL keeps what they need).
    pub unsafe fn red_op_destroy(&self, op: RedOp, comm: Comm) -> Result<Status> {
        let call = "ncclRedOpDestroy";
        let destroy = self.fns.red_op_destroy.ok_or(Error::Unavailable { call, version: self.version })?;
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { destroy(op, comm) };
        // SAFETY: `comm` is live.
        unsafe { self.check(call, raw, comm) }
    }

    /// `ncclGroupStart`.
    pub fn group_start(&self) -> Result<Status> {
        // SAFETY: takes no arguments; it only opens a group on the calling thread.
        let raw = unsafe { (self.fns.group_start)() };
        // SAFETY: null comm.
        unsafe { self.check("ncclGroupStart", raw, std::ptr::null_mut()) }
    }

    /// `ncclGroupEnd`: launches the operations issued since the matching start.
    ///
    /// # Safety
    /// The buffers, streams and communicators of the group's operations must still be valid.
    pub unsafe fn group_end(&self) -> Result<Status> {
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.group_end)() };
        // SAFETY: null comm.
        unsafe { self.check("ncclGroupEnd", raw, std::ptr::null_mut()) }
    }

    /// `ncclAllReduce` of `count` elements.
    ///
    /// # Safety
    /// `comm` must be live and not used by another issuing thread; `send` and `recv` must be device memory of
    /// the communicator's device holding `count` elements of `dtype`; `stream` a stream of that device.
    pub unsafe fn all_reduce(
        &self,
        send: *const std::ffi::c_void,
        recv: *mut std::ffi::c_void,
        count: usize,
        dtype: DataType,
        op: RedOp,
        comm: Comm,
        stream: cudaStream_t,
    ) -> Result<Status> {
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.all_reduce)(send, recv, count, dtype, op, comm, stream) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclAllReduce", raw, comm) }
    }

    /// `ncclReduce` of `count` elements into `root`'s `recv`.
    ///
    /// # Safety
    /// As [`Library::all_reduce`].
    pub unsafe fn reduce(
        &self,
        send: *const std::ffi::c_void,
        recv: *mut std::ffi::c_void,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
        comm: Comm,
        stream: cudaStream_t,
    ) -> Result<Status> {
        let root = to_int("ncclReduce", "root", root)?;
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.reduce)(send, recv, count, dtype, op, root, comm, stream) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclReduce", raw, comm) }
    }

    /// `ncclBroadcast` of `count` elements from `root`.
    ///
    /// # Safety
    /// As [`Library::all_reduce`].
    pub unsafe fn broadcast(
        &self,
        send: *const std::ffi::c_void,
        recv: *mut std::ffi::c_void,
        count: usize,
        dtype: DataType,
        root: usize,
        comm: Comm,
        stream: cudaStream_t,
    ) -> Result<Status> {
        let root = to_int("ncclBroadcast", "root", root)?;
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.broadcast)(send, recv, count, dtype, root, comm, stream) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclBroadcast", raw, comm) }
    }

    /// `ncclAllGather`: `send_count` elements from each rank into `recv` (`nranks * send_count`).
    ///
    /// # Safety
    /// As [`Library::all_reduce`], with `recv` holding `nranks * send_count` elements.
    pub unsafe fn all_gather(
        &self,
        send: *const std::ffi::c_void,
        recv: *mut std::ffi::c_void,
        send_count: usize,
        dtype: DataType,
        comm: Comm,
        stream: cudaStream_t,
    ) -> Result<Status> {
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.all_gather)(send, recv, send_count, dtype, comm, stream) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclAllGather", raw, comm) }
    }

    /// `ncclReduceScatter`: `send` holds `nranks * recv_count` elements, `recv` gets `recv_count`.
    ///
    /// # Safety
    /// As [`Library::all_reduce`], with the sizes above.
    pub unsafe fn reduce_scatter(
        &self,
        send: *const std::ffi::c_void,
        recv: *mut std::ffi::c_void,
        recv_count: usize,
        dtype: DataType,
        op: RedOp,
        comm: Comm,
        stream: cudaStream_t,
    ) -> Result<Status> {
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.reduce_scatter)(send, recv, recv_count, dtype, op, comm, stream) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclReduceScatter", raw, comm) }
    }

    /// `ncclSend` of `count` elements to `peer`.
    ///
    /// # Safety
    /// As [`Library::all_reduce`].
    pub unsafe fn send(
        &self,
        send: *const std::ffi::c_void,
        count: usize,
        dtype: DataType,
        peer: usize,
        comm: Comm,
        stream: cudaStream_t,
    ) -> Result<Status> {
        let peer = to_int("ncclSend", "peer", peer)?;
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.send)(send, count, dtype, peer, comm, stream) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclSend", raw, comm) }
    }

    /// `ncclRecv` of `count` elements from `peer`.
    ///
    /// # Safety
    /// As [`Library::all_reduce`].
    pub unsafe fn recv(
        &self,
        recv: *mut std::ffi::c_void,
        count: usize,
        dtype: DataType,
        peer: usize,
        comm: Comm,
        stream: cudaStream_t,
    ) -> Result<Status> {
        let peer = to_int("ncclRecv", "peer", peer)?;
        // SAFETY: forwarded from this function's contract.
        let raw = unsafe { (self.fns.recv)(recv, count, dtype, peer, comm, stream) };
        // SAFETY: `comm` is live.
        unsafe { self.check("ncclRecv", raw, comm) }
    }
}

/// `entry` when the library of `version` has it and `version` is at least `needs`: [`Error::TooOld`] for an older
/// library (a symbol there may be a preview with another signature), [`Error::Unavailable`] for a newer one
/// without the symbol.
fn gate<T>(call: &'static str, entry: Option<T>, version: Version, needs: Version) -> Result<T> {
    if version < needs {
        return Err(Error::TooOld { call, version, needs });
    }
    entry.ok_or(Error::Unavailable { call, version })
}

fn to_int(call: &'static str, what: &str, value: usize) -> Result<c_int> {
    c_int::try_from(value)
        .map_err(|_| Error::InvalidArgument { call, message: format!("{what} = {value} does not fit a C int") })
}

/// Copies a C string NCCL returned; empty for null.
///
/// # Safety
/// `text` must be null or point to a NUL-terminated string valid for the call.
unsafe fn c_text(text: *const std::ffi::c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: non-null and NUL-terminated by the contract.
    unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
}

/// Resolves every entry point of [`Functions`] from `library`.
fn resolve(path: &std::path::Path, library: &libloading::Library) -> Result<Functions> {
    fn required<T: Copy>(path: &std::path::Path, library: &libloading::Library, symbol: &'static str) -> Result<T> {
        // SAFETY: `T` is the function-pointer type nccl.h declares for `symbol` (the table in sys.rs).
        let found = unsafe { library.get::<T>(symbol.as_bytes()) };
        found.map(|s| *s).map_err(|err| Error::MissingSymbol {
            library: path.to_path_buf(),
            symbol,
            message: err.to_string(),
        })
    }
    fn optional<T: Copy>(library: &libloading::Library, symbol: &'static str) -> Option<T> {
        // SAFETY: as in `required`.
        unsafe { library.get::<T>(symbol.as_bytes()) }.ok().map(|s| *s)
    }
    Ok(Functions {
        get_version: required(path, library, "ncclGetVersion")?,
        get_unique_id: required(path, library, "ncclGetUniqueId")?,
        comm_init_rank: required(path, library, "ncclCommInitRank")?,
        comm_init_rank_config: required(path, library, "ncclCommInitRankConfig")?,
        comm_split: optional(library, "ncclCommSplit"),
        comm_shrink: optional(library, "ncclCommShrink"),
        comm_revoke: optional(library, "ncclCommRevoke"),
        comm_grow: optional(library, "ncclCommGrow"),
        comm_get_unique_id: optional(library, "ncclCommGetUniqueId"),
        comm_finalize: required(path, library, "ncclCommFinalize")?,
        comm_destroy: required(path, library, "ncclCommDestroy")?,
        comm_abort: required(path, library, "ncclCommAbort")?,
        comm_get_async_error: required(path, library, "ncclCommGetAsyncError")?,
        comm_count: required(path, library, "ncclCommCount")?,
        comm_user_rank: required(path, library, "ncclCommUserRank")?,
        get_error_string: required(path, library, "ncclGetErrorString")?,
        get_last_error: optional(library, "ncclGetLastError"),
        red_op_create_pre_mul_sum: optional(library, "ncclRedOpCreatePreMulSum"),
        red_op_destroy: optional(library, "ncclRedOpDestroy"),
        group_start: required(path, library, "ncclGroupStart")?,
        group_end: required(path, library, "ncclGroupEnd")?,
        all_reduce: required(path, library, "ncclAllReduce")?,
        reduce: required(path, library, "ncclReduce")?,
        broadcast: required(path, library, "ncclBroadcast")?,
        all_gather: required(path, library, "ncclAllGather")?,
        reduce_scatter: required(path, library, "ncclReduceScatter")?,
        send: required(path, library, "ncclSend")?,
        recv: required(path, library, "ncclRecv")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_of_a_later_nccl_are_refused_naming_both_versions() {
        let old = Version::new(2, 26, 5);
        let err = gate("ncclCommShrink", Some(()), old, SHRINK_VERSION).expect_err("2.26 has no shrink");
        assert_eq!(err.to_string(), "ncclCommShrink needs NCCL 2.27.0 or newer; the loaded NCCL is 2.26.5");
        let err = gate("ncclCommRevoke", Some(()), Version::new(2, 28, 6), REVOKE_VERSION).expect_err("2.28.6");
        assert!(err.to_string().contains("needs NCCL 2.28.7"), "{err}");
        let err = gate::<()>("ncclCommGrow", None, Version::new(2, 29, 1), GROW_VERSION).expect_err("no symbol");
        assert_eq!(err.to_string(), "ncclCommGrow is not available in NCCL 2.29.1");
        assert!(gate("ncclCommRevoke", Some(7), Version::new(2, 28, 9), REVOKE_VERSION).is_ok_and(|f| f == 7));
    }

    #[test]
    fn a_missing_library_is_a_typed_error() {
        let err = Library::load_from(&[PathBuf::from("/nonexistent/libnccl.so.2"), PathBuf::from("libnope.so")])
            .expect_err("no such library");
        match &err {
            Error::LibraryNotFound { tried } => {
                assert_eq!(tried.len(), 2);
                assert_eq!(tried[0].0, PathBuf::from("/nonexistent/libnccl.so.2"));
            }
            other => panic!("wrong error: {other}"),
        }
        assert!(err.to_string().starts_with("NCCL library not found (tried /nonexistent/libnccl.so.2: "));
    }

    #[test]
    fn an_explicit_path_is_the_only_candidate() {
        let err = Library::load_with_env(Some("/nonexistent/explicit/libnccl.so".into())).expect_err("missing");
        let Error::LibraryNotFound { tried } = err else { panic!("wrong error") };
        assert_eq!(
            tried.iter().map(|t| t.0.clone()).collect::<Vec<_>>(),
            [PathBuf::from("/nonexistent/explicit/libnccl.so")]
        );
    }

    #[test]
    fn without_the_variable_the_soname_comes_first_then_the_dev_symlink() {
        assert_eq!(LIBRARY_CANDIDATES, ["libnccl.so.2", "libnccl.so"]);
        match Library::load_with_env(None) {
            Ok(lib) => println!(
                "skipped: NCCL is installed here ({}), the fallback order is not exercised",
                lib.path().display()
            ),
            Err(Error::LibraryNotFound { tried }) => {
                let names: Vec<PathBuf> = tried.into_iter().map(|t| t.0).collect();
                assert_eq!(names, [PathBuf::from("libnccl.so.2"), PathBuf::from("libnccl.so")]);
            }
            Err(other) => println!("skipped: an NCCL here that cannot be used: {other}"),
        }
        // An empty variable counts as unset.
        assert!(
            !matches!(Library::load_with_env(Some("".into())), Err(Error::LibraryNotFound { ref tried }) if tried.len() == 1)
        );
    }

    #[test]
    fn a_library_without_nccl_symbols_is_a_typed_error() {
        // The C library loads everywhere this test runs and has no NCCL entry points.
        let err = Library::load_from(&[PathBuf::from("libc.so.6")]).expect_err("libc is not NCCL");
        match err {
            Error::MissingSymbol { symbol, .. } => assert_eq!(symbol, "ncclGetVersion"),
            other => panic!("wrong error: {other}"),
        }
    }

    #[test]
    fn the_process_library_is_loaded_or_explains_why_not() {
        match library() {
            Ok(lib) => {
                assert!(lib.version() >= MIN_VERSION);
                let id = lib.get_unique_id().expect("unique id");
                assert_ne!(id.to_bytes(), [0; sys::UNIQUE_ID_BYTES]);
            }
            Err(err) => println!("skipped: NCCL not loadable here: {err}"),
        }
    }
}
