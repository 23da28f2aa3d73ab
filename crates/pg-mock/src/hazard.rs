//! Hazard detection with vector clocks: a race detector for streams.
//!
//! Every stream is an actor with a vector clock. Launching an operation joins the launching host thread's clock
//! into the stream's and ticks the stream; an event record snapshots the stream's clock, `wait_event` joins it,
//! and host synchronisation (stream/event/device synchronize, a query that returns true, `copy_to_host`) joins
//! it into the host thread. Every memory block keeps its last write and the reads since; an access that is not
//! ordered after a conflicting one is a hazard, checked at launch, so detection does not depend on timing.
//! The last drop of a buffer's handles is ordered after the earlier drops (as a reference count orders them), so
//! whichever thread lets go last frees the memory with what the others knew.
//!
//! This file holds the clocks, the access history and the reports; `allocator.rs` runs the checks on the state.

use std::fmt;

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
    pub(crate) fn ordered_before(&self, clock: &VClock) -> bool {
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
    /// When the access was launched (the launching thread's local time), for the trace.
    pub(crate) at: u64,
}

impl Accessor {
    /// The access and the earlier one it conflicts with, in words (for the trace).
    pub(crate) fn describe(&self, kind: HazardKind, prior: &Access) -> (String, String) {
        let (verb, prior_verb) = verbs(kind);
        (
            format!("{verb} of buffer #{} by {} on stream {}", self.buffer, self.op, self.stream_id),
            format!("{prior_verb} of buffer #{} by {} on stream {}", prior.buffer, prior.op, prior.stream_id),
        )
    }
}

/// What the access of a hazard of `kind` and the earlier access did.
fn verbs(kind: HazardKind) -> (&'static str, &'static str) {
    match kind {
        HazardKind::ReadAfterWrite => ("read", "write"),
        HazardKind::WriteAfterWrite => ("write", "write"),
        HazardKind::WriteAfterRead | HazardKind::ReuseWhileInUse => ("write", "read"),
    }
}

const FUTURE_HINT: &str =
    "(if a Future said done: Future::is_done() only means the outputs were marked, not that the GPU finished)";

pub(crate) fn conflict_message(kind: HazardKind, who: &Accessor, prior: &Access) -> String {
    let (verb, prior_verb) = verbs(kind);
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
