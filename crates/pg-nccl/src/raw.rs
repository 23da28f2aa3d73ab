//! A bare NCCL communicator for baselines: the "raw NCCL loop" contestant of the benchmark.
//!
//! It has none of [`crate::Communicator`]'s protection: no issue mutex, no abort handling, no checks beyond
//! the sizes. It exists so that the benchmark can compare the process group with a direct `ncclAllReduce`
//! loop through the same library, on the same buffers and streams. Its all-to-all and point-to-point calls are
//! what NCCL's own all-to-all does: `ncclSend`/`ncclRecv` per peer inside one `ncclGroupStart`/`ncclGroupEnd`.

use std::fmt;

use pg_core::{Buffer as _, Error, ReduceOp, UniqueId};

use crate::conv::{cuda_error, data_type, nccl_error, red_op};
use crate::exchange::{self, Call};
use crate::{Buffer, Stream};

/// An NCCL communicator used by one thread only (it is neither `Send` nor `Sync`).
pub struct RawComm {
    library: &'static nccl_sys::Library,
    comm: nccl_sys::Comm,
    device: usize,
    size: usize,
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
        Ok(Self { library, comm, device: device.cuda().ordinal(), size })
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

    /// Enqueues an all-to-all of `input` into `output` cut by the splits (elements, one per rank): for each
    /// peer an `ncclSend` of its input chunk and an `ncclRecv` into its output chunk (none for an empty chunk),
    /// inside one NCCL group, on `stream`.
    ///
    /// The caller keeps both buffers alive until the stream has passed the op.
    pub fn all_to_all_single(
        &self,
        input: &Buffer,
        output: &Buffer,
        input_splits: &[usize],
        output_splits: &[usize],
        stream: &Stream,
    ) -> pg_core::Result<()> {
        self.check_buffers(&[input, output])?;
        let calls =
            exchange::all_to_all_calls("raw all_to_all_single", input, output, input_splits, output_splits, self.size)?;
        self.grouped(input.dtype, &calls, stream)
    }

    /// Enqueues an `ncclSend` of `send` to `to` and an `ncclRecv` into `recv` from `from`, inside one NCCL
    /// group, on `stream`.
    ///
    /// The caller keeps both buffers alive until the stream has passed the op.
    pub fn send_recv(
        &self,
        send: &Buffer,
        to: usize,
        recv: &Buffer,
        from: usize,
        stream: &Stream,
    ) -> pg_core::Result<()> {
        self.check_buffers(&[send, recv])?;
        if to >= self.size || from >= self.size {
            return Err(Error::invalid(format!(
                "raw send_recv: peers {to} and {from} in a communicator of {} ranks",
                self.size
            )));
        }
        let calls: Vec<Call> = exchange::send(send, to).into_iter().chain(exchange::recv(recv, from)).collect();
        self.grouped(send.dtype, &calls, stream)
    }

    fn check_buffers(&self, buffers: &[&Buffer]) -> pg_core::Result<()> {
        if buffers.iter().any(|b| b.device_index() != self.device) {
            return Err(Error::invalid("a buffer of another device"));
        }
        if buffers.windows(2).any(|pair| pair[0].dtype != pair[1].dtype) {
            return Err(Error::invalid("buffers of different dtypes"));
        }
        Ok(())
    }

    fn grouped(&self, dtype: pg_core::DType, calls: &[Call], stream: &Stream) -> pg_core::Result<()> {
        // SAFETY: the handle is live and used by this thread only (`RawComm` is neither Send nor Sync); every
        // call's pointer lies inside a buffer of this communicator's device (`exchange::chunk`, `send`, `recv`
        // check the ranges), which the caller keeps alive until `stream`, a stream of that device, passes it.
        unsafe { exchange::grouped(self.library, self.comm, stream.0.raw() as _, data_type(dtype), calls) }
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
