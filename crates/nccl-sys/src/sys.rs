//! The C level: NCCL's types, constants and the raw function-pointer table, as in `nccl.h`.
//!
//! Result codes, data types and reduction ops are plain integers here, never Rust enums: a library newer
//! than these bindings may return a code we do not know, and an out-of-range enum value would be undefined
//! behaviour.
#![allow(non_camel_case_types, non_upper_case_globals)] // A reason: the C names are kept so that the table reads like nccl.h.

use std::ffi::{c_char, c_int, c_void};

use crate::config::Config;

/// The opaque communicator object (`struct ncclComm`).
#[repr(C)]
#[derive(Debug)]
pub struct ncclComm {
    _private: [u8; 0],
}

/// A communicator handle (`ncclComm_t`).
pub type Comm = *mut ncclComm;

/// The raw result code (`ncclResult_t`), an `int`-sized C enum kept as an integer.
pub type ncclResult_t = u32;

/// A data type (`ncclDataType_t`).
pub type DataType = c_int;

/// A reduction op (`ncclRedOp_t`).
pub type RedOp = c_int;

/// CUDA stream handle as NCCL takes it (`cudaStream_t`, the same pointer as the driver's `CUstream`).
pub type cudaStream_t = *mut c_void;

/// Bytes in a unique id (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// The id that lets the ranks of one communicator find each other (`ncclUniqueId`).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    /// The opaque bytes.
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// An all-zero id (what `ncclGetUniqueId` overwrites).
    pub const fn zeroed() -> Self {
        Self { internal: [0; UNIQUE_ID_BYTES] }
    }

    /// The id's bytes.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        // `c_char` is `i8` or `u8` by platform: a bit-for-bit cast either way.
        self.internal.map(|c| c as u8)
    }

    /// An id from its bytes; `None` unless there are exactly [`UNIQUE_ID_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let bytes: [u8; UNIQUE_ID_BYTES] = bytes.try_into().ok()?;
        Some(Self { internal: bytes.map(|b| b as c_char) })
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let head: String = self.to_bytes().iter().take(8).map(|b| format!("{b:02x}")).collect();
        write!(f, "UniqueId({head}..)")
    }
}

/// `ncclSuccess`.
pub const ncclSuccess: ncclResult_t = 0;
/// `ncclUnhandledCudaError`.
pub const ncclUnhandledCudaError: ncclResult_t = 1;
/// `ncclSystemError`.
pub const ncclSystemError: ncclResult_t = 2;
/// `ncclInternalError`.
pub const ncclInternalError: ncclResult_t = 3;
/// `ncclInvalidArgument`.
pub const ncclInvalidArgument: ncclResult_t = 4;
/// `ncclInvalidUsage`.
pub const ncclInvalidUsage: ncclResult_t = 5;
/// `ncclRemoteError`.
pub const ncclRemoteError: ncclResult_t = 6;
/// `ncclInProgress`: a non-blocking communicator has not finished the call yet.
pub const ncclInProgress: ncclResult_t = 7;
/// `ncclTimeout` (NCCL 2.30 and later).
pub const ncclTimeout: ncclResult_t = 8;

/// `ncclInt8` (also `ncclChar`).
pub const ncclInt8: DataType = 0;
/// `ncclUint8`.
pub const ncclUint8: DataType = 1;
/// `ncclInt32` (also `ncclInt`).
pub const ncclInt32: DataType = 2;
/// `ncclUint32`.
pub const ncclUint32: DataType = 3;
/// `ncclInt64`.
pub const ncclInt64: DataType = 4;
/// `ncclUint64`.
pub const ncclUint64: DataType = 5;
/// `ncclFloat16` (also `ncclHalf`).
pub const ncclFloat16: DataType = 6;
/// `ncclFloat32` (also `ncclFloat`).
pub const ncclFloat32: DataType = 7;
/// `ncclFloat64` (also `ncclDouble`).
pub const ncclFloat64: DataType = 8;
/// `ncclBfloat16` (NCCL 2.10 and later, CUDA 11 and later).
pub const ncclBfloat16: DataType = 9;
/// `ncclFloat8e4m3` (NCCL 2.24 and later; reductions need sm_90 or newer).
pub const ncclFloat8e4m3: DataType = 10;
/// `ncclFloat8e5m2` (NCCL 2.24 and later; reductions need sm_90 or newer).
pub const ncclFloat8e5m2: DataType = 11;

/// `ncclSum`.
pub const ncclSum: RedOp = 0;
/// `ncclProd`.
pub const ncclProd: RedOp = 1;
/// `ncclMax`.
pub const ncclMax: RedOp = 2;
/// `ncclMin`.
pub const ncclMin: RedOp = 3;
/// `ncclAvg` (NCCL 2.10 and later).
pub const ncclAvg: RedOp = 4;

/// Where a `ncclRedOpCreatePreMulSum` scalar lives (`ncclScalarResidence_t`).
pub type ScalarResidence = c_int;
/// `ncclScalarDevice`: the scalar is in device memory, read when the op runs (one per rank may differ).
pub const ncclScalarDevice: ScalarResidence = 0;
/// `ncclScalarHostImmediate`: the scalar is in host memory, read during the create call.
pub const ncclScalarHostImmediate: ScalarResidence = 1;

pub use crate::config::{NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT};
/// `NCCL_SHRINK_DEFAULT`: shrink a healthy parent.
pub const NCCL_SHRINK_DEFAULT: c_int = 0x00;
/// `NCCL_SHRINK_ABORT`: stop the parent's ops in flight first, then shrink (the excluded ranks are dead).
pub const NCCL_SHRINK_ABORT: c_int = 0x01;
/// `NCCL_REVOKE_DEFAULT`, the only flag `ncclCommRevoke` takes.
pub const NCCL_REVOKE_DEFAULT: c_int = 0x00;
/// `NCCL_SPLIT_NOCOLOR`: this rank joins no communicator in a split.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `ncclGetVersion`.
pub type ncclGetVersion_t = unsafe extern "C" fn(version: *mut c_int) -> ncclResult_t;
/// `ncclGetUniqueId`.
pub type ncclGetUniqueId_t = unsafe extern "C" fn(id: *mut UniqueId) -> ncclResult_t;
/// `ncclCommInitRank`.
pub type ncclCommInitRank_t =
    unsafe extern "C" fn(comm: *mut Comm, nranks: c_int, id: UniqueId, rank: c_int) -> ncclResult_t;
/// `ncclCommInitRankConfig`.
pub type ncclCommInitRankConfig_t = unsafe extern "C" fn(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *mut Config,
) -> ncclResult_t;
/// `ncclCommSplit`.
pub type ncclCommSplit_t =
    unsafe extern "C" fn(comm: Comm, color: c_int, key: c_int, newcomm: *mut Comm, config: *mut Config) -> ncclResult_t;
/// `ncclCommShrink` (NCCL 2.27).
pub type ncclCommShrink_t = unsafe extern "C" fn(
    comm: Comm,
    exclude_ranks: *mut c_int,
    exclude_count: c_int,
    newcomm: *mut Comm,
    config: *mut Config,
    shrink_flags: c_int,
) -> ncclResult_t;
/// `ncclCommRevoke` (NCCL 2.28.7).
pub type ncclCommRevoke_t = unsafe extern "C" fn(comm: Comm, revoke_flags: c_int) -> ncclResult_t;
/// `ncclCommGrow` (NCCL 2.29).
pub type ncclCommGrow_t = unsafe extern "C" fn(
    comm: Comm,
    nranks: c_int,
    unique_id: *const UniqueId,
    rank: c_int,
    newcomm: *mut Comm,
    config: *mut Config,
) -> ncclResult_t;
/// `ncclCommGetUniqueId` (NCCL 2.29): the id new ranks join a grown communicator with.
pub type ncclCommGetUniqueId_t = unsafe extern "C" fn(comm: Comm, unique_id: *mut UniqueId) -> ncclResult_t;
/// `ncclCommFinalize`, `ncclCommDestroy`, `ncclCommAbort`.
pub type ncclCommOp_t = unsafe extern "C" fn(comm: Comm) -> ncclResult_t;
/// `ncclCommGetAsyncError`.
pub type ncclCommGetAsyncError_t = unsafe extern "C" fn(comm: Comm, async_error: *mut ncclResult_t) -> ncclResult_t;
/// `ncclCommCount`, `ncclCommUserRank`.
pub type ncclCommQuery_t = unsafe extern "C" fn(comm: Comm, out: *mut c_int) -> ncclResult_t;
/// `ncclGetErrorString`.
pub type ncclGetErrorString_t = unsafe extern "C" fn(result: ncclResult_t) -> *const c_char;
/// `ncclGetLastError`.
pub type ncclGetLastError_t = unsafe extern "C" fn(comm: Comm) -> *const c_char;
/// `ncclRedOpCreatePreMulSum`.
pub type ncclRedOpCreatePreMulSum_t = unsafe extern "C" fn(
    op: *mut RedOp,
    scalar: *mut c_void,
    datatype: DataType,
    residence: ScalarResidence,
    comm: Comm,
) -> ncclResult_t;
/// `ncclRedOpDestroy`.
pub type ncclRedOpDestroy_t = unsafe extern "C" fn(op: RedOp, comm: Comm) -> ncclResult_t;
/// `ncclGroupStart`, `ncclGroupEnd`.
pub type ncclGroup_t = unsafe extern "C" fn() -> ncclResult_t;
/// `ncclAllReduce`.
pub type ncclAllReduce_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataType,
    op: RedOp,
    comm: Comm,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclReduce`.
pub type ncclReduce_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataType,
    op: RedOp,
    root: c_int,
    comm: Comm,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclBroadcast`.
pub type ncclBroadcast_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataType,
    root: c_int,
    comm: Comm,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclAllGather`.
pub type ncclAllGather_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    sendcount: usize,
    datatype: DataType,
    comm: Comm,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclReduceScatter`.
pub type ncclReduceScatter_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    recvbuff: *mut c_void,
    recvcount: usize,
    datatype: DataType,
    op: RedOp,
    comm: Comm,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclSend`.
pub type ncclSend_t = unsafe extern "C" fn(
    sendbuff: *const c_void,
    count: usize,
    datatype: DataType,
    peer: c_int,
    comm: Comm,
    stream: cudaStream_t,
) -> ncclResult_t;
/// `ncclRecv`.
pub type ncclRecv_t = unsafe extern "C" fn(
    recvbuff: *mut c_void,
    count: usize,
    datatype: DataType,
    peer: c_int,
    comm: Comm,
    stream: cudaStream_t,
) -> ncclResult_t;

/// The entry points pg uses, resolved from one loaded library.
///
/// The required ones exist in every NCCL since [`crate::MIN_VERSION`]; the optional ones are `None` when the
/// library lacks them.
#[derive(Debug, Clone, Copy)]
pub struct Functions {
    /// `ncclGetVersion`.
    pub get_version: ncclGetVersion_t,
    /// `ncclGetUniqueId`.
    pub get_unique_id: ncclGetUniqueId_t,
    /// `ncclCommInitRank`.
    pub comm_init_rank: ncclCommInitRank_t,
    /// `ncclCommInitRankConfig`.
    pub comm_init_rank_config: ncclCommInitRankConfig_t,
    /// `ncclCommSplit` (NCCL 2.18 and later).
    pub comm_split: Option<ncclCommSplit_t>,
    /// `ncclCommShrink` (NCCL 2.27 and later).
    pub comm_shrink: Option<ncclCommShrink_t>,
    /// `ncclCommRevoke` (NCCL 2.28.7 and later).
    pub comm_revoke: Option<ncclCommRevoke_t>,
    /// `ncclCommGrow` (NCCL 2.29 and later).
    pub comm_grow: Option<ncclCommGrow_t>,
    /// `ncclCommGetUniqueId` (NCCL 2.29 and later).
    pub comm_get_unique_id: Option<ncclCommGetUniqueId_t>,
    /// `ncclCommFinalize`.
    pub comm_finalize: ncclCommOp_t,
    /// `ncclCommDestroy`.
    pub comm_destroy: ncclCommOp_t,
    /// `ncclCommAbort`.
    pub comm_abort: ncclCommOp_t,
    /// `ncclCommGetAsyncError`.
    pub comm_get_async_error: ncclCommGetAsyncError_t,
    /// `ncclCommCount`.
    pub comm_count: ncclCommQuery_t,
    /// `ncclCommUserRank`.
    pub comm_user_rank: ncclCommQuery_t,
    /// `ncclGetErrorString`.
    pub get_error_string: ncclGetErrorString_t,
    /// `ncclGetLastError`.
    pub get_last_error: Option<ncclGetLastError_t>,
    /// `ncclRedOpCreatePreMulSum` (NCCL 2.11 and later).
    pub red_op_create_pre_mul_sum: Option<ncclRedOpCreatePreMulSum_t>,
    /// `ncclRedOpDestroy` (NCCL 2.11 and later).
    pub red_op_destroy: Option<ncclRedOpDestroy_t>,
    /// `ncclGroupStart`.
    pub group_start: ncclGroup_t,
    /// `ncclGroupEnd`.
    pub group_end: ncclGroup_t,
    /// `ncclAllReduce`.
    pub all_reduce: ncclAllReduce_t,
    /// `ncclReduce`.
    pub reduce: ncclReduce_t,
    /// `ncclBroadcast`.
    pub broadcast: ncclBroadcast_t,
    /// `ncclAllGather`.
    pub all_gather: ncclAllGather_t,
    /// `ncclReduceScatter`.
    pub reduce_scatter: ncclReduceScatter_t,
    /// `ncclSend`.
    pub send: ncclSend_t,
    /// `ncclRecv`.
    pub recv: ncclRecv_t,
}
