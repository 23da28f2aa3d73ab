//! Streams: the default stream, the per-device round-robin pools, and the per-thread current stream.

use std::cell::RefCell;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::safe::CudaStream;
use cudarc::driver::sys::CUstream;

use crate::error::{DriverContext, Result};
use crate::STREAMS_PER_POOL;

/// An ordered queue of device work. Cloning gives another handle to the same stream.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

struct StreamInner {
    cuda: Arc<CudaStream>,
    id: u64,
    ordinal: usize,
    high_priority: bool,
}

impl Stream {
    pub(crate) fn new(cuda: Arc<CudaStream>, id: u64, ordinal: usize, high_priority: bool) -> Self {
        Self { inner: Arc::new(StreamInner { cuda, id, ordinal, high_priority }) }
    }

    /// An id unique on its device: 0 for the default stream, then in order of creation.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The device ordinal.
    pub fn device_ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// Whether this stream came from the high-priority pool.
    pub fn is_high_priority(&self) -> bool {
        self.inner.high_priority
    }

    /// The cudarc stream.
    pub fn cuda(&self) -> &Arc<CudaStream> {
        &self.inner.cuda
    }

    /// The raw driver handle (for NCCL, which takes a `cudaStream_t`: the same pointer).
    pub fn raw(&self) -> CUstream {
        self.inner.cuda.cu_stream()
    }

    /// Whether this is the legacy default stream (the null handle or `CU_STREAM_LEGACY`), which implicitly
    /// synchronises with the blocking streams of its context and can take no part in a capture.
    pub fn is_legacy_default(&self) -> bool {
        // cuda.h's `CU_STREAM_LEGACY`, a handle value rather than a stream.
        const CU_STREAM_LEGACY: usize = 0x1;
        let raw = self.raw() as usize;
        raw == 0 || raw == CU_STREAM_LEGACY
    }

    /// Whether all work enqueued so far has finished.
    pub fn query(&self) -> Result<bool> {
        crate::ffi::bind(self.inner.cuda.context())?;
        crate::ffi::stream_query(&self.inner.cuda)
    }

    /// Blocks the host until all work enqueued so far has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.cuda.synchronize().during("cuStreamSynchronize")
    }

    /// Enqueues `callback` (`cuLaunchHostFunc`): a driver thread runs it once all work enqueued so far has
    /// finished, and later work on the stream waits for it to return. It must be short and make no CUDA call.
    pub fn launch_host_fn(&self, callback: Box<dyn FnOnce() + Send + 'static>) -> Result<()> {
        crate::ffi::bind(self.inner.cuda.context())?;
        crate::ffi::launch_host_fn(&self.inner.cuda, callback)
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.inner.ordinal == other.inner.ordinal && self.inner.id == other.inner.id
    }
}

impl Eq for Stream {}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.inner.id == 0 {
            "default"
        } else if self.inner.high_priority {
            "high"
        } else {
            "normal"
        };
        write!(f, "Stream(cuda:{}, id {}, {kind})", self.inner.ordinal, self.inner.id)
    }
}

/// One priority's pool: streams made at first use of their slot, handed out round-robin.
#[derive(Default)]
pub(crate) struct StreamPool {
    slots: [OnceLock<Stream>; STREAMS_PER_POOL],
    next: AtomicUsize,
}

impl fmt::Debug for StreamPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let made = self.slots.iter().filter(|s| s.get().is_some()).count();
        write!(f, "StreamPool({made}/{STREAMS_PER_POOL} made)")
    }
}

impl StreamPool {
    /// The next stream, creating it with `make` if its slot is empty.
    pub(crate) fn next(&self, make: impl FnOnce() -> Result<Stream>) -> Result<Stream> {
        let slot = &self.slots[self.next.fetch_add(1, Ordering::Relaxed) % STREAMS_PER_POOL];
        if let Some(stream) = slot.get() {
            return Ok(stream.clone());
        }
        let made = make()?;
        // Two threads may race to fill the slot; the loser's stream is dropped (destroyed) unused.
        Ok(slot.get_or_init(|| made).clone())
    }
}

/// Stream ids per process: 0 is every device's default stream.
pub(crate) fn next_stream_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

thread_local! {
    /// The calling thread's current stream per device ordinal (absent: the default stream).
    static CURRENT: RefCell<Vec<Option<Stream>>> = const { RefCell::new(Vec::new()) };
}

/// The calling thread's current stream on `ordinal`, if one was set.
pub(crate) fn current(ordinal: usize) -> Option<Stream> {
    CURRENT.with(|current| current.borrow().get(ordinal).cloned().flatten())
}

/// Sets the calling thread's current stream on `ordinal`; returns the previous one, if set.
pub(crate) fn set_current(ordinal: usize, stream: Stream) -> Option<Stream> {
    CURRENT.with(|current| {
        let mut current = current.borrow_mut();
        if current.len() <= ordinal {
            current.resize(ordinal + 1, None);
        }
        current[ordinal].replace(stream)
    })
}
