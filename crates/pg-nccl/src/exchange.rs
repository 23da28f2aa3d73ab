//! The ops NCCL has no single call for (gather, scatter, both all-to-all forms, the list all-gather and
//! reduce-scatter), issued as PyTorch issues them: several point-to-point, broadcast or reduce calls inside one
//! `ncclGroupStart`/`ncclGroupEnd`, so that they run together and never wait on each other's issue order.

use std::ffi::c_void;

use nccl_sys::{Comm, DataType, Library, RedOp, Status};
use pg_core::Buffer as _;

use crate::Buffer;

/// One call of a grouped op. Pointers are device pointers of the communicator's device.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Call {
    /// `ncclSend` of `count` elements at `ptr` to `peer`.
    Send { ptr: *mut c_void, count: usize, peer: usize },
    /// `ncclRecv` of `count` elements into `ptr` from `peer`.
    Recv { ptr: *mut c_void, count: usize, peer: usize },
    /// `ncclBroadcast` of `count` elements from `root` (`send` is read on the root only).
    Broadcast { send: *mut c_void, recv: *mut c_void, count: usize, root: usize },
    /// `ncclReduce` of `count` elements into `root`'s `recv`.
    Reduce { send: *mut c_void, recv: *mut c_void, count: usize, root: usize, op: RedOp },
}

/// The device pointer of element `offset` of `buffer`, checked to leave `count` elements inside it (`what` names
/// the op in the error).
pub(crate) fn chunk(what: &str, buffer: &Buffer, offset: usize, count: usize) -> pg_core::Result<*mut c_void> {
    pg_core::args::chunk_inside(what, offset, count, buffer.numel())?;
    // Pointer arithmetic only: the address is passed to NCCL, never dereferenced here.
    Ok((buffer.ptr() as *mut u8).wrapping_add(offset * buffer.dtype().size()) as *mut c_void)
}

/// The calls that send `buffer` whole to `peer` (none for an empty buffer, as PyTorch skips them).
pub(crate) fn send(buffer: &Buffer, peer: usize) -> Option<Call> {
    (buffer.numel() > 0).then(|| Call::Send { ptr: buffer.ptr(), count: buffer.numel(), peer })
}

/// The call that receives into `buffer` whole from `peer` (none for an empty buffer).
pub(crate) fn recv(buffer: &Buffer, peer: usize) -> Option<Call> {
    (buffer.numel() > 0).then(|| Call::Recv { ptr: buffer.ptr(), count: buffer.numel(), peer })
}

/// The calls of an all-to-all with splits (elements per peer, `size` of each): a send and a receive per peer,
/// zero-length chunks skipped as PyTorch skips them. `what` names the op in errors.
pub(crate) fn all_to_all_calls(
    what: &str,
    input: &Buffer,
    output: &Buffer,
    input_splits: &[usize],
    output_splits: &[usize],
    size: usize,
) -> pg_core::Result<Vec<Call>> {
    pg_core::args::split_count(what, "input", input_splits.len(), size)?;
    pg_core::args::split_count(what, "output", output_splits.len(), size)?;
    let mut calls = Vec::with_capacity(2 * size);
    let (mut at_in, mut at_out) = (0usize, 0usize);
    for (peer, (&send, &recv)) in input_splits.iter().zip(output_splits).enumerate() {
        if send > 0 {
            calls.push(Call::Send { ptr: chunk(what, input, at_in, send)?, count: send, peer });
        }
        if recv > 0 {
            calls.push(Call::Recv { ptr: chunk(what, output, at_out, recv)?, count: recv, peer });
        }
        at_in = at_in.saturating_add(send);
        at_out = at_out.saturating_add(recv);
    }
    Ok(calls)
}

/// Issues `calls` inside one NCCL group; the group is closed even when a call fails, and the first failure is
/// returned.
///
/// # Safety
/// `comm` must be live and issued on by this thread alone (the caller holds the issue mutex); every pointer
/// must be device memory of the communicator's device holding `count` elements of `dtype`, valid until
/// `stream` passes the group; `stream` a stream of that device.
pub(crate) unsafe fn grouped(
    lib: &Library,
    comm: Comm,
    stream: nccl_sys::sys::cudaStream_t,
    dtype: DataType,
    calls: &[Call],
) -> nccl_sys::Result<Status> {
    lib.group_start()?;
    let mut failed = None;
    for call in calls {
        // SAFETY: forwarded from this function's contract.
        let result = unsafe {
            match *call {
                Call::Send { ptr, count, peer } => lib.send(ptr, count, dtype, peer, comm, stream),
                Call::Recv { ptr, count, peer } => lib.recv(ptr, count, dtype, peer, comm, stream),
                Call::Broadcast { send, recv, count, root } => {
                    lib.broadcast(send, recv, count, dtype, root, comm, stream)
                }
                Call::Reduce { send, recv, count, root, op } => {
                    lib.reduce(send, recv, count, dtype, op, root, comm, stream)
                }
            }
        };
        if let Err(error) = result {
            failed = Some(error);
            break;
        }
    }
    // SAFETY: forwarded from this function's contract: the calls' memory stays valid until the stream passes.
    let ended = unsafe { lib.group_end() };
    match failed {
        Some(error) => Err(error),
        None => ended,
    }
}
