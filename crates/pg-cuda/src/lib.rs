//! Real CUDA for pg, on cudarc's driver API, loaded at run time (it builds with no CUDA toolkit).
//!
//! What the process group needs from a GPU, and nothing else:
//! - [`Device`]: one per ordinal per process (handles share it), with its host clock;
//! - [`Stream`]s: the legacy default stream, and per-device pools of normal and high priority streams handed
//!   out round-robin (32 each, as PyTorch's `getStreamFromPool`); a per-thread *current stream* per device;
//! - [`Event`]s whose driver object is made at the first record and recycled when the handle is dropped;
//!   [`TimingEvent`]s for measurements;
//! - [`Buffer`]s from a caching allocator: freed memory is reused by later allocations on the same stream at
//!   once (stream order makes that safe), and a block that [`Device::record_stream`] marked as used by other
//!   streams is held back until every one of them has passed the point recorded when the block was freed;
//! - kernels: a fill and a spin (sleep) kernel in hand-written PTX loaded through the driver.
//!
//! Every call into the driver below cudarc's safe layer lives in `ffi.rs`; no other module has `unsafe`
//! except where a block carries its own `// SAFETY:` line.
//!
//! Without a driver, [`Device::new`] returns [`CudaError::DriverNotFound`] instead of panicking (cudarc panics
//! on the first call into a library it cannot load, so we check for the library first).

mod allocator;
mod buffer;
mod device;
mod error;
mod event;
mod ffi;
mod graph;
mod host;
mod kernels;
mod stream;

pub use allocator::AllocatorStats;
pub use buffer::Buffer;
pub use device::{device_count, driver_available, Device};
pub use error::{CudaError, Result};
pub use event::{Event, TimingEvent};
pub use graph::{CaptureMode, CaptureStatus, Graph};
pub use host::{notify_host_threads, now, sleep};
pub use stream::Stream;

/// The cudarc pg builds with: foreign memory and streams are taken in its types.
pub use cudarc;

/// The PTX of pg's kernels (for checking it with `ptxas` on a machine with the toolkit).
pub fn kernels_ptx() -> &'static str {
    kernels::PTX
}

/// Streams per priority in a device's pool (PyTorch's `kStreamsPerPool`).
pub const STREAMS_PER_POOL: usize = 32;
