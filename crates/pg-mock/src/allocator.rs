//! A caching allocator with per-stream free lists, as PyTorch's: a freed block is reused by the next allocation
//! of its size on its stream at once, unless `record_stream` named other streams, whose work up to the free must
//! have finished first (checked when allocating); and the memory side of hazard detection: each access and each
//! reuse of a block is checked against the block's history (the clocks and messages are in `hazard.rs`).

use std::collections::BTreeSet;

use crate::hazard::{conflict_message, Access, Accessor, Hazard, HazardKind, History, Mode, VClock};
use crate::state::{Block, State};

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
            let at = self.local(tid);
            self.check_reuse(id, &owner, (stream, at), buffer);
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

impl State {
    /// Launch bookkeeping: the stream learns what the launching thread knows, then ticks.
    /// Returns the stream's clock for the new operation.
    pub(crate) fn launch_clock(&mut self, tid: Option<usize>, stream: usize) -> VClock {
        if let Some(thread) = tid.and_then(|t| self.threads.get(&t)) {
            let known = thread.clock.clone();
            self.streams[stream].clock.join(&known);
        }
        self.streams[stream].clock.tick(stream);
        self.streams[stream].clock.clone()
    }

    /// Checks and records an access to `block`.
    pub(crate) fn access(&mut self, block: u64, mode: Mode, who: &Accessor) {
        let Some(history) = self.alloc.blocks.get(&block).map(|b| b.history.clone()) else { return };
        let mut found = Vec::new();
        if let Some(w) = history.write.as_ref().filter(|w| !w.ordered_before(&who.clock)) {
            let kind = match mode {
                Mode::Read => HazardKind::ReadAfterWrite,
                Mode::Write => HazardKind::WriteAfterWrite,
            };
            found.push((kind, w.clone()));
        }
        if mode == Mode::Write {
            for r in history.reads.iter().filter(|r| r.actor != who.actor && !r.ordered_before(&who.clock)) {
                found.push((HazardKind::WriteAfterRead, r.clone()));
            }
        }
        for (kind, prior) in found {
            let message = conflict_message(kind, who, &prior);
            self.trace_hazard((who.actor, who.at), kind, who.describe(kind, &prior), &message);
            self.hazard(Hazard { kind, device: who.device, buffer: who.buffer, message });
        }
        let access = Access {
            actor: who.actor,
            epoch: who.clock.get(who.actor),
            buffer: who.buffer,
            stream_id: who.stream_id,
            op: who.op.clone(),
            collective: who.collective,
        };
        let b = self.alloc.blocks.get_mut(&block).expect("checked above");
        match mode {
            Mode::Write => b.history = History { write: Some(access), reads: Vec::new() },
            Mode::Read => {
                b.history.reads.retain(|r| r.actor != access.actor);
                b.history.reads.push(access);
            }
        }
    }

    /// Checks that every earlier access to `block` is ordered before its new owner (clock `owner`, allocating on
    /// `stream` at `at`); then forgets the history (the memory now belongs to buffer `buffer`).
    pub(crate) fn check_reuse(&mut self, block: u64, owner: &VClock, (stream, at): (usize, u64), buffer: u64) {
        let (device, stream_id) = (self.streams[stream].device, self.streams[stream].id);
        let Some(b) = self.alloc.blocks.get_mut(&block) else { return };
        let history = std::mem::take(&mut b.history);
        let unordered = history.write.iter().chain(&history.reads).find(|a| !a.ordered_before(owner));
        if let Some(prior) = unordered {
            let message = format!(
                "hazard on rank {device}: memory of buffer #{} was reused by a new allocation (buffer #{buffer}) on \
                 stream {stream_id} while {} on stream {} may still use it: missing record_stream (or keep the \
                 buffer alive until the Work completes)",
                prior.buffer, prior.op, prior.stream_id
            );
            let kind = HazardKind::ReuseWhileInUse;
            let access = format!("allocation of buffer #{buffer} on stream {stream_id}");
            let earlier = format!("use of buffer #{} by {} on stream {}", prior.buffer, prior.op, prior.stream_id);
            self.trace_hazard((stream, at), kind, (access, earlier), &message);
            self.hazard(Hazard { kind, device, buffer, message });
        }
    }
}
