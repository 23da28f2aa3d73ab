//! Device buffers: from the caching allocator, or foreign memory another framework made (kept alive by its
//! owner's handle, never freed by pg).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::allocator::Allocator;
use crate::stream::Stream;

/// Device memory: raw bytes from the caching allocator. Cloning gives another handle to the same memory;
/// the block returns to the allocator when the last handle is dropped.
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<Block>,
}

struct Block {
    ptr: u64,
    bytes: usize,
    block_size: usize,
    stream: Stream,
    uses: Mutex<Vec<Stream>>,
    /// The id of the stream last recorded in `uses` (`u64::MAX`: none): recording the same stream again, as
    /// every op on a reused buffer does, returns without the lock.
    last_use: AtomicU64,
    owner: Owner,
}

/// Who frees a block's memory when the last handle goes.
enum Owner {
    /// pg's caching allocator, honouring the recorded streams.
    Allocator(Arc<Allocator>),
    /// Another framework: its handle is dropped then, and its own rules free the memory.
    Foreign(Option<Box<dyn std::any::Any + Send + Sync>>),
}

impl Buffer {
    pub(crate) fn new(ptr: u64, bytes: usize, block_size: usize, stream: Stream, allocator: Arc<Allocator>) -> Self {
        Self {
            inner: Arc::new(Block {
                ptr,
                bytes,
                block_size,
                stream,
                uses: Mutex::new(Vec::new()),
                last_use: AtomicU64::new(u64::MAX),
                owner: Owner::Allocator(allocator),
            }),
        }
    }

    /// Wraps memory another framework made, zero copy: `keep_alive` (the owner's handle, e.g. a cudarc
    /// `CudaSlice`) is kept until the last handle of the buffer goes, then dropped. `stream` is the stream
    /// the owner orders its use of the memory on (reported as the allocation stream).
    ///
    /// pg's allocator never frees or reuses this memory, and `record_stream` on it records nothing: its lifetime
    /// across streams is kept by holding the buffer (the process group keeps it on the Work until the op's end
    /// event has passed).
    ///
    /// # Safety
    /// `ptr..ptr + bytes` must be device memory of `stream`'s context that stays valid while `keep_alive` lives.
    pub unsafe fn foreign(
        ptr: u64,
        bytes: usize,
        stream: Stream,
        keep_alive: Box<dyn std::any::Any + Send + Sync>,
    ) -> Self {
        Self {
            inner: Arc::new(Block {
                ptr,
                bytes,
                block_size: bytes,
                stream,
                uses: Mutex::new(Vec::new()),
                last_use: AtomicU64::new(u64::MAX),
                owner: Owner::Foreign(Some(keep_alive)),
            }),
        }
    }

    /// Whether the memory was made elsewhere ([`Buffer::foreign`]).
    pub fn is_foreign(&self) -> bool {
        matches!(self.inner.owner, Owner::Foreign(_))
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.inner.ptr
    }

    /// The size asked for, in bytes.
    pub fn len_bytes(&self) -> usize {
        self.inner.bytes
    }

    /// The size of the block serving it (rounded up).
    pub fn block_size(&self) -> usize {
        self.inner.block_size
    }

    /// The device ordinal.
    pub fn device_ordinal(&self) -> usize {
        self.inner.stream.device_ordinal()
    }

    /// The stream it was allocated for.
    pub fn allocation_stream(&self) -> &Stream {
        &self.inner.stream
    }

    /// The other streams recorded as users so far.
    pub fn recorded_streams(&self) -> Vec<Stream> {
        self.inner.uses.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records `stream` as a user; returns whether it was new.
    pub(crate) fn add_use(&self, stream: &Stream) -> bool {
        if self.is_foreign() {
            // Not the allocator's memory: there is no free for a recorded stream to hold back.
            return false;
        }
        // Stream ids are unique on a device, and a buffer's streams are all on its device.
        if *stream == self.inner.stream || self.inner.last_use.load(Ordering::Acquire) == stream.id() {
            return false;
        }
        let mut uses = self.inner.uses.lock().unwrap_or_else(|e| e.into_inner());
        self.inner.last_use.store(stream.id(), Ordering::Release);
        if uses.contains(stream) {
            return false;
        }
        uses.push(stream.clone());
        true
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|e| e.into_inner()));
        match &mut self.owner {
            Owner::Allocator(allocator) => allocator.free(self.ptr, self.block_size, &self.stream, &uses),
            Owner::Foreign(keep_alive) => drop(keep_alive.take()),
        }
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer(cuda:{}, {:#x}, {} bytes)", self.device_ordinal(), self.ptr(), self.len_bytes())
    }
}
