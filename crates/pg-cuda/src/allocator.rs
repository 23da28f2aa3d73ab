//! The caching device allocator and its lifetime guard (`record_stream`).
//!
//! Blocks are cached per (allocation stream, rounded size). Freeing a block that only its allocation stream
//! used makes it reusable at once by later allocations on that stream: stream order runs the new user after
//! the old one. A block that [`crate::Device::record_stream`] marked as used by other streams is parked
//! instead: at free time an event is recorded on each of those streams, and the block goes back to the cache
//! only when every such event has completed (checked at each allocation). This is PyTorch's
//! `recordStream` contract; it orders nothing, it only keeps the memory from being reused too early.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::safe::CudaEvent;
use cudarc::driver::CudaContext;

use crate::error::{CudaError, DriverContext, Result};
use crate::event::EventPool;
use crate::ffi;
use crate::stream::Stream;

/// Small requests are rounded up to this many bytes.
const SMALL_ROUND: usize = 512;
/// Requests above [`SMALL_LIMIT`] are rounded up to this many bytes.
const LARGE_ROUND: usize = 2 << 20;
/// The largest small request.
const SMALL_LIMIT: usize = 1 << 20;

/// Counters of one device's allocator (`torch.cuda.memory_stats`, in brief).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorStats {
    /// Bytes in blocks handed out and not yet freed (rounded sizes).
    pub allocated_bytes: usize,
    /// The most `allocated_bytes` ever was.
    pub peak_allocated_bytes: usize,
    /// Bytes obtained from the driver and not returned (allocated, cached and parked).
    pub reserved_bytes: usize,
    /// Allocations served from the cache.
    pub cache_hits: u64,
    /// Allocations that called `cuMemAlloc`.
    pub driver_allocs: u64,
    /// Blocks returned to the driver (`cuMemFree`).
    pub driver_frees: u64,
    /// Blocks freed by their last handle.
    pub frees: u64,
    /// `record_stream` calls that added a stream to a block.
    pub record_stream_calls: u64,
    /// Events recorded at free time on the streams that used a block.
    pub free_events_recorded: u64,
    /// Blocks freed but parked until other streams pass their recorded point.
    pub blocks_awaiting_streams: usize,
}

struct Parked {
    ptr: u64,
    size: usize,
    stream_id: u64,
    events: Vec<CudaEvent>,
}

#[derive(Default)]
struct State {
    cached: HashMap<(u64, usize), Vec<u64>>,
    parked: Vec<Parked>,
    stats: AllocatorStats,
    /// An error from a free (in a `Drop`, where it cannot be returned), returned by the next allocation.
    deferred: Option<CudaError>,
}

/// One device's caching allocator.
pub(crate) struct Allocator {
    ctx: Arc<CudaContext>,
    events: Arc<EventPool>,
    state: Mutex<State>,
}

impl fmt::Debug for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Allocator(cuda:{}, {:?})", self.ctx.ordinal(), self.stats())
    }
}

/// Rounds a request to the block size it is served with.
pub(crate) fn round_size(bytes: usize) -> usize {
    let bytes = bytes.max(1);
    if bytes <= SMALL_LIMIT {
        bytes.div_ceil(SMALL_ROUND) * SMALL_ROUND
    } else {
        bytes.div_ceil(LARGE_ROUND) * LARGE_ROUND
    }
}

impl Allocator {
    pub(crate) fn new(ctx: Arc<CudaContext>, events: Arc<EventPool>) -> Self {
        Self { ctx, events, state: Mutex::new(State::default()) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of at least `bytes` for use on `stream`: `(pointer, block size)`.
    pub(crate) fn allocate(&self, bytes: usize, stream: &Stream) -> Result<(u64, usize)> {
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        let size = round_size(bytes);
        let mut state = self.lock();
        if let Some(err) = state.deferred.take() {
            return Err(err);
        }
        self.unpark_finished(&mut state)?;
        let reused = state.cached.get_mut(&(stream.id(), size)).and_then(Vec::pop);
        let ptr = match reused {
            Some(ptr) => {
                state.stats.cache_hits += 1;
                ptr
            }
            None => {
                let ptr = match ffi::mem_alloc(size) {
                    Ok(ptr) => ptr,
                    Err(_) => {
                        // Out of memory, or fragmented by the cache: give back what we can and try once more.
                        self.release_cached(&mut state, true)?;
                        ffi::mem_alloc(size)?
                    }
                };
                state.stats.driver_allocs += 1;
                state.stats.reserved_bytes += size;
                ptr
            }
        };
        let stats = &mut state.stats;
        stats.allocated_bytes += size;
        stats.peak_allocated_bytes = stats.peak_allocated_bytes.max(stats.allocated_bytes);
        Ok((ptr, size))
    }

    /// Takes back a block whose last handle is gone. `uses` are the other streams recorded on it.
    pub(crate) fn free(&self, ptr: u64, size: usize, stream: &Stream, uses: &[Stream]) {
        let mut events = Vec::with_capacity(uses.len());
        let mut failure = None;
        for used in uses {
            let recorded = self.events.take().and_then(|event| {
                event.record(used.cuda()).during("cuEventRecord")?;
                Ok(event)
            });
            match recorded {
                Ok(event) => events.push(event),
                Err(err) => failure = Some(err),
            }
        }
        let mut state = self.lock();
        state.stats.frees += 1;
        state.stats.allocated_bytes -= size;
        if let Some(err) = failure {
            // Without an event we cannot tell when the other streams are done: leak the block rather than
            // risk reusing memory a stream still reads, and report the error at the next allocation.
            tracing::warn!(ptr, size, %err, "recording a free-time event failed; the block is leaked");
            state.deferred.get_or_insert(err);
            return;
        }
        if events.is_empty() {
            state.cached.entry((stream.id(), size)).or_default().push(ptr);
        } else {
            state.stats.free_events_recorded += events.len() as u64;
            state.parked.push(Parked { ptr, size, stream_id: stream.id(), events });
            state.stats.blocks_awaiting_streams = state.parked.len();
        }
    }

    pub(crate) fn note_record_stream(&self) {
        self.lock().stats.record_stream_calls += 1;
    }

    /// Moves parked blocks whose events have all completed back to the cache.
    fn unpark_finished(&self, state: &mut State) -> Result<()> {
        let mut index = 0;
        while index < state.parked.len() {
            let mut done = true;
            for event in &state.parked[index].events {
                if !event.try_is_complete().during("cuEventQuery")? {
                    done = false;
                    break;
                }
            }
            if done {
                let parked = state.parked.swap_remove(index);
                for event in parked.events {
                    self.events.give_back(event);
                }
                state.cached.entry((parked.stream_id, parked.size)).or_default().push(parked.ptr);
            } else {
                index += 1;
            }
        }
        state.stats.blocks_awaiting_streams = state.parked.len();
        Ok(())
    }

    /// Returns every cached block to the driver (after a device synchronize, so parked blocks finish too).
    fn release_cached(&self, state: &mut State, include_parked: bool) -> Result<()> {
        self.ctx.synchronize().during("cuCtxSynchronize")?;
        if include_parked {
            self.unpark_finished(state)?;
        }
        for (&(_, size), blocks) in state.cached.iter_mut() {
            for ptr in blocks.drain(..) {
                // SAFETY: the block is cached (no handle left) and the device is idle, so no work uses it.
                unsafe { ffi::mem_free(ptr) }?;
                state.stats.driver_frees += 1;
                state.stats.reserved_bytes -= size;
            }
        }
        state.cached.clear();
        Ok(())
    }

    /// Returns every cached block to the driver (`torch.cuda.empty_cache`).
    pub(crate) fn empty_cache(&self) -> Result<()> {
        self.ctx.bind_to_thread().during("cuCtxSetCurrent")?;
        let mut state = self.lock();
        self.release_cached(&mut state, true)
    }

    pub(crate) fn stats(&self) -> AllocatorStats {
        self.lock().stats
    }
}

#[cfg(test)]
mod tests {
    use super::round_size;

    #[test]
    fn rounding() {
        assert_eq!(round_size(0), 512);
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(512), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(round_size(1 << 20), 1 << 20);
        assert_eq!(round_size((1 << 20) + 1), 2 << 20);
        assert_eq!(round_size(64 << 20), 64 << 20);
        assert_eq!(round_size((64 << 20) + 1), 66 << 20);
    }
}
