//! Injected faults, as data: which rank misbehaves and how.
//!
//! A rank here is a device index (rank `i` of [`crate::World::run`] uses device `i`); faults on communicators
//! apply to every communicator that rank is part of, and operation numbers count per communicator from 0.

use std::time::Duration;

/// A fault the world injects.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// The rank never joins a communicator: a blocking `create_communicator` never returns, and a non-blocking one
    /// returns a communicator that never becomes ready (the other ranks' never do either).
    NeverJoin {
        /// The rank (device index).
        rank: usize,
    },
    /// Every collective the rank enqueues costs `extra` more host time.
    SlowRank {
        /// The rank (device index).
        rank: usize,
        /// The extra host time per operation.
        extra: Duration,
    },
    /// Once the rank's first `after_ops` operations on a communicator have finished, the communicator reports an
    /// asynchronous error, and its later operations never complete (until aborted).
    AsyncError {
        /// The rank (device index).
        rank: usize,
        /// How many operations finish normally first.
        after_ops: u64,
    },
    /// Operation `op` (0-based, per communicator) of the rank never completes, on any rank, until aborted.
    HangAt {
        /// The rank (device index).
        rank: usize,
        /// The operation number.
        op: u64,
    },
    /// The rank's communicator is aborted `after` its operation `op` (0-based, per communicator) was enqueued,
    /// while that operation runs (it never completes by itself): as if something outside the process group
    /// aborted it. The operation ends at the abort, without effect; the other ranks' parts hang until they abort.
    AbortDuringOp {
        /// The rank (device index).
        rank: usize,
        /// The operation number.
        op: u64,
        /// How long after the enqueue the abort comes.
        after: Duration,
    },
    /// The rank is killed during its operation `op` (0-based, per communicator), as a process that gets SIGKILL
    /// mid-collective: the operation never completes on any rank (the others wait for data that never comes,
    /// until they revoke or abort), and the dead rank's own part ends at once, without effect, its communicator
    /// gone (later calls on it fail with `Aborted` naming the kill). As on NCCL, the dead rank's two neighbours on
    /// the communicator's ring (ranks one below and one above, wrapping) see their connection to it close
    /// [`WorldConfig::peer_loss`](crate::WorldConfig::peer_loss) later: their communicator reports an asynchronous
    /// remote error; the other ranks see nothing until their ops time out. The rank's code is expected to stop there. It
    /// fires once: a thread that then plays the rank's replacement process (a new rank joining a grown group on
    /// that device) runs normally.
    KillAt {
        /// The rank (device index).
        rank: usize,
        /// The operation number.
        op: u64,
    },
    /// The rank's communicators take `duration` of host time to tear down: an abort or a revoke stops the
    /// communicator at once (its ops end) and then holds its caller that long, as NCCL's do while they join the
    /// proxy thread (over sockets, after a poll that sleeps up to 500 ms).
    SlowTeardown {
        /// The rank (device index).
        rank: usize,
        /// The host time an abort or a revoke takes.
        duration: Duration,
    },
    /// The store is hosted by the rank's process: when the rank is killed ([`Fault::KillAt`]) the store goes with
    /// it, and every later store operation fails at once with a network error (the connections closed), as a
    /// `TCPStore` server hosted by a rank that dies.
    StoreHostedBy {
        /// The rank (device index).
        rank: usize,
    },
    /// The store stops answering: every store operation fails with a network error, at once (`fail_fast`) or
    /// after the store's timeout of virtual time.
    StoreDown {
        /// Fail at once instead of after the timeout.
        fail_fast: bool,
    },
}
