//! What a group has done, counted without a lock: the sequence numbers of its ops (collectives and point-to-point
//! apart) and the counts [`Counters`] reports.

use std::sync::atomic::{AtomicU64, Ordering};

/// What a group has done, for tests and tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Communicators this group created (every cache miss that succeeded).
    pub comms_created: u64,
    /// Ops enqueued (collectives, point-to-point ops and barriers).
    pub ops_issued: u64,
    /// Ops whose Work reused a completed Work that nothing held any more (its memory and end event).
    pub works_reused: u64,
    /// Ops whose enqueue found the group's in-flight intake full (no watchdog pass or other reader took it for
    /// that many ops) and moved it onto the in-flight list itself, under the list's lock.
    pub intake_overflows: u64,
}

/// The counts of one group.
#[derive(Default)]
pub(crate) struct Tally {
    seq_collective: AtomicU64,
    seq_p2p: AtomicU64,
    comms_created: AtomicU64,
    ops_issued: AtomicU64,
    works_reused: AtomicU64,
}

impl Tally {
    /// The sequence number of a new op: collectives and point-to-point ops count apart, from 1.
    pub(crate) fn next_seq(&self, p2p: bool) -> u64 {
        let counter = if p2p { &self.seq_p2p } else { &self.seq_collective };
        counter.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Counts a communicator created.
    pub(crate) fn comm_created(&self) {
        self.comms_created.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an op enqueued.
    pub(crate) fn op_issued(&self) {
        self.ops_issued.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a Work that reused a completed one.
    pub(crate) fn work_reused(&self) {
        self.works_reused.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            comms_created: self.comms_created.load(Ordering::Relaxed),
            ops_issued: self.ops_issued.load(Ordering::Relaxed),
            works_reused: self.works_reused.load(Ordering::Relaxed),
            intake_overflows: 0,
        }
    }
}
