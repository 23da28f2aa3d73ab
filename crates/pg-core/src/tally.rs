//! What a group has done, counted without a lock: the sequence numbers of its ops (collectives and point-to-point
//! apart) and the counts [`Counters`] reports.
//!
//! An op's enqueue makes one atomic write here, its sequence number. The ops issued are the sequence numbers given
//! less the enqueues that failed after taking one (counted by [`Unissued`], on the error path), and the Works
//! reused are the ops issued less the Works made new (counted where the allocation happens).

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
    /// Enqueues that took a sequence number and failed before the op was issued.
    unissued: AtomicU64,
    /// Ops issued with a Work made new rather than reused.
    works_made: AtomicU64,
}

/// An op between its sequence number and its issue: dropped before [`Unissued::issued`] (an error returned on the
/// way), it counts the op as not issued.
pub(crate) struct Unissued<'a>(&'a Tally);

impl Unissued<'_> {
    /// The op was issued.
    pub(crate) fn issued(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unissued<'_> {
    fn drop(&mut self) {
        self.0.unissued.fetch_add(1, Ordering::Relaxed);
    }
}

impl Tally {
    /// The sequence number of a new op: collectives and point-to-point ops count apart, from 1.
    /// The op counts as issued once [`Unissued::issued`] is called.
    pub(crate) fn next_seq(&self, p2p: bool) -> (u64, Unissued<'_>) {
        let counter = if p2p { &self.seq_p2p } else { &self.seq_collective };
        (counter.fetch_add(1, Ordering::Relaxed) + 1, Unissued(self))
    }

    /// Counts a communicator created.
    pub(crate) fn comm_created(&self) {
        self.comms_created.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an issued op's Work made new (not reused).
    pub(crate) fn work_made(&self) {
        self.works_made.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn counters(&self) -> Counters {
        let given = self.seq_collective.load(Ordering::Relaxed) + self.seq_p2p.load(Ordering::Relaxed);
        let ops_issued = given.saturating_sub(self.unissued.load(Ordering::Relaxed));
        Counters {
            comms_created: self.comms_created.load(Ordering::Relaxed),
            ops_issued,
            works_reused: ops_issued.saturating_sub(self.works_made.load(Ordering::Relaxed)),
            intake_overflows: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn an_enqueue_that_fails_after_its_sequence_number_is_not_an_op_issued() {
        let tally = Tally::default();
        let (first, op) = tally.next_seq(false);
        op.issued();
        let (second, failed) = tally.next_seq(false);
        drop(failed);
        let (p2p, op) = tally.next_seq(true);
        tally.work_made();
        op.issued();
        assert_eq!((first, second, p2p), (1, 2, 1), "collectives and point-to-point ops count apart");
        let counters = tally.counters();
        assert_eq!(counters.ops_issued, 2, "the failed enqueue is not counted");
        assert_eq!(counters.works_reused, 1, "one of the two issued ops made its Work new");
    }
}
