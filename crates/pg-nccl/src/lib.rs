//! The NCCL backend of pg: [`Nccl`] implements pg-core's [`pg_core::Backend`] with real CUDA devices,
//! streams, events and memory (from `pg-cuda`) and NCCL communicators (through `nccl-sys`).
//!
//! The generic process group of pg-core runs on it unchanged, one process per GPU.
//!
//! # Threading rules (what [`Communicator`] relies on and enforces)
//! NCCL's rules (user guide, "Thread safety"): a communicator is not thread safe, so one thread at a time
//! issues calls on it; `ncclCommGetAsyncError` and `ncclCommAbort` may be called from another thread while a
//! thread is inside a call on the communicator (that is how a blocked call is unblocked).
//! [`Communicator`] enforces them: every issuing call (collectives, P2P, finalize) holds the communicator's
//! issue mutex; [`pg_core::Communicator::async_error`] takes only a short read lock on the handle; and
//! [`pg_core::Communicator::abort`] marks the communicator aborted, takes the handle out under the write lock
//! (so no later call can reach it), waits briefly for the issue mutex, and calls `ncclCommAbort` with the
//! mutex if it got it, or without it if a thread is blocked inside NCCL (the case NCCL allows it for).
//! [`pg_core::Communicator::split`] of a blocking communicator issues `ncclCommSplit` from a helper thread while
//! the caller holds the issue mutex, so that the caller can give up at the split's timeout; one that gives up
//! retires the communicator (aborted, handle taken out, no NCCL call) and leaves the abort to the helper
//! (`split.rs`).

mod abort_end;
mod buffer;
mod communicator;
mod conv;
mod device;
mod exchange;
#[cfg(feature = "testing")]
pub mod fault;
mod foreign;
mod handle;
#[cfg(feature = "testing")]
pub mod interop_probe;
#[cfg(feature = "testing")]
pub mod launches;
pub mod placement;
mod premul;
#[cfg(feature = "testing")]
pub mod raw;
mod split;
mod stream;

pub use buffer::Buffer;
#[cfg(feature = "testing")]
pub use communicator::call_timing;
pub use communicator::Communicator;
pub use device::Device;
pub use foreign::Element;
pub use stream::{Event, Graph, Stream};

pub use nccl_sys;
pub use pg_cuda;

/// The NCCL backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct Nccl;

impl pg_core::Backend for Nccl {
    const NAME: &'static str = "nccl";
    type Device = Device;
    type Stream = Stream;
    type Event = Event;
    type Buffer = Buffer;
    type Communicator = Communicator;
    type Graph = Graph;
}

/// Whether this machine can run the backend: a CUDA driver with at least one device, and a loadable NCCL.
/// The error says what is missing.
pub fn available() -> pg_core::Result<usize> {
    let count = pg_cuda::device_count().map_err(conv::cuda_error)?;
    if count == 0 {
        return Err(pg_core::Error::Backend("no CUDA device".into()));
    }
    nccl_sys::library().map_err(conv::nccl_error)?;
    Ok(count)
}

/// The test and benchmark hooks exist only with the `testing` feature. Without it each of these lines fails to
/// compile, and for that reason alone: with the feature the same lines compile. Each block is a `compile_fail`
/// doctest or a plain one as the feature says, so the workspace's `cargo test` (where pg-lab turns `testing` on)
/// compiles them, and a build without the feature (`cargo test -p pg-nccl --doc`, or the downstream crate in
/// `examples/downstream`, whose docs hold the same lines) sees them fail.
///
#[cfg_attr(feature = "testing", doc = "```no_run")]
#[cfg_attr(not(feature = "testing"), doc = "```compile_fail")]
/// let _launches: Vec<pg_nccl::launches::KernelLaunch> = pg_nccl::launches::for_device(0);
/// ```
///
#[cfg_attr(feature = "testing", doc = "```no_run")]
#[cfg_attr(not(feature = "testing"), doc = "```compile_fail")]
/// let (_calls, _time) = pg_nccl::call_timing::totals();
/// ```
///
#[cfg_attr(feature = "testing", doc = "```no_run")]
#[cfg_attr(not(feature = "testing"), doc = "```compile_fail")]
/// let _: Option<pg_nccl::raw::RawComm> = None;
/// ```
///
/// The same crate and paths otherwise resolve:
///
/// ```
/// let _: Option<pg_nccl::Communicator> = None;
/// let _ = pg_nccl::available;
/// ```
#[cfg(doctest)]
struct TheHooksNeedTesting;

#[cfg(test)]
mod tests {
    use pg_core::{Buffer as _, Communicator as _, Device as _, Event as _, ReduceOp};

    use super::*;

    fn gpu() -> Option<Device> {
        match available() {
            Ok(_) => Some(Device::new(0).expect("device 0")),
            Err(err) => {
                println!("skipped: {err}");
                None
            }
        }
    }

    #[test]
    fn without_gpu_or_nccl_everything_is_an_error() {
        if available().is_err() {
            let err = Device::new(0).err();
            if let Some(err) = err {
                assert_eq!(err.kind(), pg_core::ErrorKind::Backend);
            }
        }
    }

    #[test]
    fn world_of_one_all_reduce() {
        let Some(device) = gpu() else { return };
        let id = device.new_unique_id().unwrap();
        assert_eq!(id.0.len(), 128);
        let comm = device.create_communicator(&id, 1, 0, &pg_core::CommConfig::default()).unwrap();
        let stream = device.stream_from_pool(false).unwrap();
        let buffer = device.alloc_on(pg_core::DType::F32, 1024, &stream).unwrap();
        device.fill(&buffer, 3.0, &stream).unwrap();
        comm.all_reduce(&buffer, &buffer, ReduceOp::Sum, &stream).unwrap();
        let end = device.create_event();
        end.record(&stream).unwrap();
        end.synchronize().unwrap();
        let bytes = device.copy_to_host(&buffer, &stream).unwrap();
        assert!(bytes.chunks(4).all(|c| f32::from_le_bytes(c.try_into().unwrap()) == 3.0));
        assert_eq!(buffer.numel(), 1024);
        comm.async_error().unwrap();
        comm.abort("test").unwrap();
        assert!(comm.is_aborted());
        assert_eq!(comm.async_error().unwrap_err().kind(), pg_core::ErrorKind::Aborted);
        assert_eq!(
            comm.all_reduce(&buffer, &buffer, ReduceOp::Sum, &stream).unwrap_err().kind(),
            pg_core::ErrorKind::Aborted
        );
    }
}
