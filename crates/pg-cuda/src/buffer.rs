//! Device buffers from the caching allocator.

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
    allocator: Arc<Allocator>,
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
                allocator,
            }),
        }
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
        self.allocator.free(self.ptr, self.block_size, &self.stream, &uses);
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Buffer(cuda:{}, {:#x}, {} bytes)", self.device_ordinal(), self.ptr(), self.len_bytes())
    }
}
