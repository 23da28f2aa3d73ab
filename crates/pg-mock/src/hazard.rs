//! Hazard detection with vector clocks: a race detector for streams.
//!
//! Every stream is an actor with a vector clock. Launching an operation joins the launching host thread's clock
//! into the stream's and ticks the stream; an event record snapshots the stream's clock, `wait_event` joins it,
//! and host synchronisation (stream/event/device synchronize, a query that returns true, `copy_to_host`) joins
//! it into the host thread. Every memory block keeps its last write and the reads since; an access that is not
//! ordered after a conflicting one is a hazard, checked at launch, so detection does not depend on timing.

use std::fmt;

use crate::world::State;

/// What a detected hazard does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HazardMode {
    /// Panic with the first hazard's message (the mock is assertive).
    #[default]
    Panic,
    /// Keep hazards in [`crate::World::hazards`] and go on.
    Record,
}

/// The kind of a hazard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HazardKind {
    /// A read not ordered after the write before it (a missing or wrong-stream wait, or trusting `Future::is_done`).
    ReadAfterWrite,
    /// A write not ordered after the write before it.
    WriteAfterWrite,
    /// A write not ordered after a read before it (the reader may still be using the old contents).
    WriteAfterRead,
    /// Freed memory handed to a new allocation while another stream may still use it (a missing `record_stream`).
    ReuseWhileInUse,
}

/// A detected hazard, with a message that says what is wrong and the likely fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hazard {
    /// What kind of hazard it is.
    pub kind: HazardKind,
    /// The device (the rank, in [`crate::World::run`]) on which it happened.
    pub device: usize,
    /// The buffer whose memory was accessed (the new one, for a reuse).
    pub buffer: u64,
    /// The readable report.
    pub message: String,
}

impl fmt::Display for Hazard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A vector clock indexed by stream (actor) index.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct VClock(Vec<u64>);

impl VClock {
    pub(crate) fn get(&self, actor: usize) -> u64 {
        self.0.get(actor).copied().unwrap_or(0)
    }

    pub(crate) fn join(&mut self, other: &VClock) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        for (mine, theirs) in self.0.iter_mut().zip(&other.0) {
            *mine = (*mine).max(*theirs);
        }
    }

    pub(crate) fn tick(&mut self, actor: usize) -> u64 {
        if self.0.len() <= actor {
            self.0.resize(actor + 1, 0);
        }
        self.0[actor] += 1;
        self.0[actor]
    }
}

/// One access to a memory block.
#[derive(Debug, Clone)]
pub(crate) struct Access {
    /// The stream (actor) that made it, and its epoch then.
    pub(crate) actor: usize,
    pub(crate) epoch: u64,
    pub(crate) buffer: u64,
    pub(crate) stream_id: u64,
    /// The operation, e.g. `all_reduce (op 2 on communicator 0)`.
    pub(crate) op: String,
    /// Whether a collective made it (the Future hint applies).
    pub(crate) collective: bool,
}

impl Access {
    fn ordered_before(&self, clock: &VClock) -> bool {
        self.epoch <= clock.get(self.actor)
    }
}

/// A block's access history since its last write.
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    pub(crate) write: Option<Access>,
    /// The latest read by each actor since the last write.
    pub(crate) reads: Vec<Access>,
}

/// Whether an access reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Read,
    Write,
}

/// Describes the access being made, for messages.
#[derive(Debug, Clone)]
pub(crate) struct Accessor {
    pub(crate) actor: usize,
    pub(crate) clock: VClock,
    pub(crate) device: usize,
    pub(crate) buffer: u64,
    pub(crate) stream_id: u64,
    pub(crate) op: String,
    pub(crate) collective: bool,
}

const FUTURE_HINT: &str =
    "(if a Future said done: Future::is_done() only means the outputs were marked, not that the GPU finished)";

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

    /// Checks that every earlier access to `block` is ordered before its new owner (clock `owner`); then forgets
    /// the history (the memory now belongs to buffer `buffer`).
    pub(crate) fn check_reuse(&mut self, block: u64, owner: &VClock, device: usize, buffer: u64, stream_id: u64) {
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
            self.hazard(Hazard { kind: HazardKind::ReuseWhileInUse, device, buffer, message });
        }
    }
}

fn conflict_message(kind: HazardKind, who: &Accessor, prior: &Access) -> String {
    let (verb, prior_verb) = match kind {
        HazardKind::ReadAfterWrite => ("read", "write"),
        HazardKind::WriteAfterWrite => ("write", "write"),
        HazardKind::WriteAfterRead | HazardKind::ReuseWhileInUse => ("write", "read"),
    };
    let mut message = format!(
        "hazard on rank {}: {verb} of buffer #{} by {} on stream {} is not ordered after its {prior_verb} by {} on \
         stream {}",
        who.device, who.buffer, who.op, who.stream_id, prior.op, prior.stream_id
    );
    match kind {
        HazardKind::WriteAfterRead => {
            message.push_str(": the reader may still be using the old contents (make this stream wait for it");
            message.push_str(if prior.collective { ", e.g. Work::wait on this stream)" } else { ")" });
        }
        _ if prior.collective && !who.collective => {
            message.push_str(": missing Work::wait on this stream, or wait on the wrong stream ");
            message.push_str(FUTURE_HINT);
        }
        _ => message
            .push_str(": make this stream wait for the earlier operation (an event, or Work::wait on this stream)"),
    }
    message
}
