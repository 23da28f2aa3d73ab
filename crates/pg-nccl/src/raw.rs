//! A bare NCCL communicator for baselines: the "raw NCCL loop" contestant of the benchmark.
//!
//! It has none of [`crate::Communicator`]'s protection: no issue mutex, no abort handling, no checks beyond
//! the sizes. It exists so that the benchmark can compare the process group with a direct `ncclAllReduce`
//! loop through the same library, on the same buffers and streams.

use std::fmt;

use pg_core::{Buffer as _, Error, ReduceOp, UniqueId};

use crate::conv::{cuda_error, data_type, nccl_error, red_op};
use crate::{Buffer, Stream};

/// An NCCL communicator used by one thread only (it is neither `Send` nor `Sync`).
pub struct RawComm {
    library: &'static nccl_sys::Library,
    comm: nccl_sys::Comm,
    device: usize,
}

impl RawComm {
    /// `ncclCommInitRankConfig` (blocking) for `rank` of `size` on `device`.
    pub fn new(device: &crate::Device, id: &UniqueId, size: usize, rank: usize) -> pg_core::Result<Self> {
        let library = nccl_sys::library().map_err(nccl_error)?;
        let id = nccl_sys::UniqueId::from_bytes(&id.0).ok_or_else(|| Error::invalid("a unique id has 128 bytes"))?;
        device.cuda().bind_to_thread().map_err(cuda_error)?;
        let mut config = library.config(true);
        // SAFETY: the device's context is current on this thread, so NCCL uses that device.
        let (comm, _) = unsafe { library.comm_init_rank_config(size, &id, rank, &mut config) }.map_err(nccl_error)?;
        Ok(Self { library, comm, device: device.cuda().ordinal() })
    }

    /// Enqueues `ncclAllReduce` in place on `buffer`, on `stream`: one call, nothing else.
    ///
    /// The caller keeps `buffer` alive until the stream has passed the op (a baseline has no allocator guard).
    pub fn all_reduce_in_place(&self, buffer: &Buffer, op: ReduceOp, stream: &Stream) -> pg_core::Result<()> {
        if buffer.device_index() != self.device {
            return Err(Error::invalid("a buffer of another device"));
        }
        let op = red_op(op, buffer.dtype)?;
        // SAFETY: `buffer` holds `numel` elements of its dtype on this communicator's device; the handle is live
        // (only `Drop` destroys it) and used by this thread only (`RawComm` is neither Send nor Sync).
        unsafe {
            self.library.all_reduce(
                buffer.ptr(),
                buffer.ptr(),
                buffer.numel,
                data_type(buffer.dtype),
                op,
                self.comm,
                stream.0.raw() as _,
            )
        }
        .map(drop)
        .map_err(nccl_error)
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        // SAFETY: the handle is live and this is its last use.
        if let Err(err) = unsafe { self.library.comm_destroy(self.comm) } {
            tracing::warn!(%err, "ncclCommDestroy failed");
        }
    }
}

impl fmt::Debug for RawComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawComm(cuda:{})", self.device)
    }
}
