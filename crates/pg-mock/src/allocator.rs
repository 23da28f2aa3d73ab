//! A caching allocator with per-stream free lists, as PyTorch's: a freed block is reused by the next allocation
//! of its size on its stream at once, unless `record_stream` named other streams, whose work up to the free must
//! have finished first (checked when allocating).

use std::collections::{BTreeSet, HashMap};

use crate::clock::OpRef;
use crate::hazard::{History, VClock};
use crate::world::State;

/// One block of simulated device memory.
#[derive(Debug)]
pub(crate) struct Block {
    /// The stream it was allocated for (the free list it returns to).
    pub(crate) stream: usize,
    pub(crate) data: Vec<u8>,
    pub(crate) history: History,
    /// Streams named by `record_stream` since the block was allocated.
    pub(crate) recorded: BTreeSet<usize>,
    /// For a freed block: the last operation of each recorded stream at the free, and that stream's clock.
    pub(crate) pending: Vec<(OpRef, VClock)>,
    /// What the thread that freed it knew (the allocator's lock orders a free before the next allocation).
    pub(crate) freed_by: VClock,
    /// What the threads that dropped the buffer's other handles knew when they dropped them: the last drop, which
    /// frees the block, is ordered after every earlier one (a reference count is a release-acquire edge).
    pub(crate) released: VClock,
}

/// Every block, in use or cached.
#[derive(Debug, Default)]
pub(crate) struct Allocator {
    pub(crate) blocks: HashMap<u64, Block>,
    /// Free blocks by (stream, size in bytes), oldest first (the likeliest to be reusable).
    free: HashMap<(usize, usize), Vec<u64>>,
    next_block: u64,
    /// The last buffer number handed out on each device (numbers are per device, so they are deterministic).
    pub(crate) next_buffer: HashMap<usize, u64>,
}

impl State {
    /// Finds memory for buffer `buffer` of `bytes` bytes on `stream`, reusing a cached block when one is free.
    pub(crate) fn allocate(&mut self, tid: Option<usize>, stream: usize, bytes: usize, buffer: u64) -> u64 {
        let reusable = self.alloc.free.get(&(stream, bytes)).and_then(|list| {
            // Blocks free up in the order they were freed: looking at the oldest few is enough (and keeps an
            // allocation cheap when many blocks wait for their streams).
            list.iter()
                .take(4)
                .copied()
                .find(|id| self.alloc.blocks[id].pending.iter().all(|(op, _)| self.op_done_now(*op)))
        });
        if let Some(id) = reusable {
            if let Some(list) = self.alloc.free.get_mut(&(stream, bytes)) {
                list.retain(|b| *b != id);
            }
            let block = self.alloc.blocks.get_mut(&id).expect("free blocks exist");
            let pending = std::mem::take(&mut block.pending);
            let freed_by = std::mem::take(&mut block.freed_by);
            block.recorded.clear();
            block.released = VClock::default();
            // The allocator observed the recorded streams pass their points: the new owner is ordered after them.
            // What the freeing thread knew is known to the allocating one: a Work that kept its buffers alive
            // until a watchdog saw it complete frees them safely, whoever allocates next.
            let mut owner = self.streams[stream].clock.clone();
            owner.join(&freed_by);
            self.join_thread_clock(tid, &freed_by);
            for (_, clock) in &pending {
                owner.join(clock);
                self.join_thread_clock(tid, clock);
            }
            if let Some(thread) = tid.and_then(|t| self.threads.get(&t)) {
                owner.join(&thread.clock);
            }
            let stream_id = self.streams[stream].id;
            let device = self.streams[stream].device;
            self.check_reuse(id, &owner, device, buffer, stream_id);
            return id;
        }
        let id = self.alloc.next_block;
        self.alloc.next_block += 1;
        self.alloc.blocks.insert(
            id,
            Block {
                stream,
                data: vec![0; bytes],
                history: History::default(),
                recorded: BTreeSet::new(),
                pending: Vec::new(),
                freed_by: VClock::default(),
                released: VClock::default(),
            },
        );
        id
    }

    /// Notes that thread `tid` dropped one of several handles of the buffer in `block`: whoever drops the last one
    /// (and so frees the block) knows what `tid` knew then.
    pub(crate) fn release_handle(&mut self, block: u64, tid: Option<usize>) {
        let Some(known) = tid.and_then(|t| self.threads.get(&t)).map(|t| t.clock.clone()) else { return };
        if let Some(b) = self.alloc.blocks.get_mut(&block) {
            b.released.join(&known);
        }
    }

    /// Returns `block` to its stream's free list (the last handle of its buffer was dropped).
    pub(crate) fn free_block(&mut self, block: u64, tid: Option<usize>) {
        let Some(b) = self.alloc.blocks.get(&block) else { return };
        let (home, bytes) = (b.stream, b.data.len());
        let recorded: Vec<usize> = b.recorded.iter().copied().filter(|s| *s != home).collect();
        let mut pending = Vec::new();
        for stream in recorded {
            // No pin: the in-flight window keeps the finish time of an operation until it is done.
            if let Some(op) = self.last_op(stream) {
                pending.push((op, self.streams[stream].clock.clone()));
            }
        }
        let mut freed_by = tid.and_then(|t| self.threads.get(&t)).map(|t| t.clock.clone()).unwrap_or_default();
        if let Some(b) = self.alloc.blocks.get_mut(&block) {
            freed_by.join(&std::mem::take(&mut b.released));
            b.pending = pending;
            b.freed_by = freed_by;
        }
        self.alloc.free.entry((home, bytes)).or_default().push(block);
    }
}
