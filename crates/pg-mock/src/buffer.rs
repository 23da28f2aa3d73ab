//! Simulated device memory: a buffer of one dtype holding real bytes, freed to the caching allocator on drop.

use std::fmt;
use std::sync::Arc;

use pg_core::DType;

use crate::sched::Inner;
use crate::Mock;

/// The shared part of a buffer; the block returns to the allocator when the last handle goes.
pub(crate) struct BufferHandle {
    pub(crate) inner: Arc<Inner>,
    /// The allocation's number on its device (`buffer #N` in hazard reports).
    pub(crate) id: u64,
    /// The memory block it lives in.
    pub(crate) block: u64,
    pub(crate) dtype: DType,
    pub(crate) numel: usize,
    pub(crate) device: usize,
    /// Memory made elsewhere (another framework's allocator): `record_stream` cannot hold it back, so only a
    /// handle kept until the streams are done with it makes its release safe.
    pub(crate) foreign: bool,
}

impl Drop for BufferHandle {
    fn drop(&mut self) {
        let tid = self.inner.current();
        let mut state = self.inner.lock();
        state.free_block(self.block, tid);
        self.inner.release(state);
    }
}

/// A buffer as a captured operation holds it: weakly, as a CUDA graph holds a raw pointer.
pub(crate) struct WeakBuffer {
    id: u64,
    handle: std::sync::Weak<BufferHandle>,
}

impl WeakBuffer {
    pub(crate) fn new(buffer: &MockBuffer) -> Self {
        Self { id: buffer.handle.id, handle: Arc::downgrade(&buffer.handle) }
    }

    /// The buffer, or an error naming it and the replayed op `op` when its memory was freed after the capture.
    pub(crate) fn get(&self, op: &str) -> pg_core::Result<MockBuffer> {
        match self.handle.upgrade() {
            Some(handle) => Ok(MockBuffer { handle }),
            None => Err(pg_core::Error::invalid(format!(
                "Graph::launch: buffer #{} that the captured '{op}' uses was freed after the capture; a graph does \
                 not own the memory its operations use (keep it alive with Stream::capture_keep_alive)",
                self.id
            ))),
        }
    }
}

/// A simulated device buffer. Cloning gives another handle to the same memory, like a tensor.
#[derive(Clone)]
pub struct MockBuffer {
    pub(crate) handle: Arc<BufferHandle>,
}

impl fmt::Debug for MockBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockBuffer")
            .field("id", &self.handle.id)
            .field("dtype", &self.handle.dtype)
            .field("numel", &self.handle.numel)
            .field("device", &self.handle.device)
            .finish()
    }
}

impl Drop for MockBuffer {
    fn drop(&mut self) {
        // Dropping one of several handles hands what this thread knows to the thread that drops the last one, as
        // the reference count of a shared tensor does: a Work that keeps its buffers until it observes completion
        // makes the caller's later free safe, whichever of the two lets go last.
        if Arc::strong_count(&self.handle) > 1 {
            let inner = &self.handle.inner;
            let tid = inner.current();
            inner.lock().release_handle(self.handle.block, tid);
        }
    }
}

impl MockBuffer {
    /// The allocation's number on its device, as hazard reports name it (`buffer #N`).
    pub fn id(&self) -> u64 {
        self.handle.id
    }

    /// Which memory block the buffer lives in, like a data pointer: equal for a buffer that reuses freed memory.
    pub fn address(&self) -> u64 {
        self.handle.block
    }

    pub(crate) fn block(&self) -> u64 {
        self.handle.block
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }
}

impl pg_core::Buffer for MockBuffer {
    type B = Mock;

    fn dtype(&self) -> DType {
        self.handle.dtype
    }

    fn numel(&self) -> usize {
        self.handle.numel
    }

    fn device_index(&self) -> usize {
        self.handle.device
    }

    fn is_foreign(&self) -> bool {
        self.handle.foreign
    }
}
