//! The typed error every process-group call returns.

use std::time::Duration;

use pg_store::StoreError;

use crate::OpType;

/// The result type of pg-core.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, with the kinds kept apart the way PyTorch keeps its logs apart:
/// a work timeout, a communicator-creation timeout, a stuck watchdog and a store timeout are different failures.
///
/// New variants may be added: match on [`Error::kind`] with a wildcard arm.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A collective did not complete within its timeout (PyTorch's "Watchdog caught collective operation timeout").
    #[error(
        "collective operation timeout: Work(SeqNum={seq}, OpType={op}, NumelIn={numel_in}, NumelOut={numel_out}, \
         Timeout(ms)={}) ran for {} milliseconds before timing out",
        .timeout.as_millis(),
        .elapsed.as_millis()
    )]
    WorkTimeout {
        /// The Work's sequence number in its group.
        seq: u64,
        /// What the Work was.
        op: OpType,
        /// Elements in.
        numel_in: usize,
        /// Elements out.
        numel_out: usize,
        /// The timeout that ran out.
        timeout: Duration,
        /// How long it had run, from its host start time.
        elapsed: Duration,
    },
    /// Creating a communicator did not finish within the group's timeout: a peer never joined, the root never
    /// published the unique id, a non-blocking init never became ready, or another thread of this rank never
    /// finished creating it.
    #[error("creating communicator '{cache_key}' timed out after {} ms: {what}", .timeout.as_millis())]
    InitTimeout {
        /// The communicator's cache key.
        cache_key: String,
        /// The timeout that ran out (the group's).
        timeout: Duration,
        /// What was being waited for.
        what: String,
    },
    /// The communicator reported an error (NCCL's async error, or a failed NCCL call).
    #[error("communicator error: {message}")]
    Communicator {
        /// The backend's description.
        message: String,
        /// The communication library's result code (NCCL's `ncclResult_t`), where it reported one.
        code: Option<u32>,
    },
    /// Another rank of the group reported a failure through the store.
    #[error("rank {rank} of the group reported an error through the store")]
    Remote {
        /// The rank that failed first.
        rank: usize,
    },
    /// A rank of the group died: the store saw its liveness connection close ([`crate::Options::liveness`]).
    #[error(
        "rank {rank} of group '{group}' is dead: its liveness connection to the store closed (the process ended or \
         was killed)"
    )]
    RankDead {
        /// The group's name.
        group: String,
        /// The dead rank, in the group.
        rank: usize,
    },
    /// The store stopped answering during a recovery step: a store hosted by a process that died goes with it (run a
    /// standalone `pgstore`, or host it on a process that outlives the ranks).
    #[error(
        "the store of group '{group}' stopped answering during {during}: {source}; a store hosted by a rank that \
         died goes with it (host it in a standalone `pgstore`)"
    )]
    StoreLost {
        /// The group's name.
        group: String,
        /// The step (`agree_survivors`).
        during: String,
        /// What the store said.
        source: Box<StoreError>,
    },
    /// The group or the communicator was aborted; the reason says by whom and why.
    #[error("process group aborted: {reason}")]
    Aborted {
        /// Why it was aborted.
        reason: String,
    },
    /// The group was revoked ([`crate::ProcessGroup::revoke`], or the watchdog's revoke on a failed peer with
    /// `Options::revoke_on_error`), or it is the parent of an aborting shrink: its Works in flight failed, and
    /// every later op, finalize and shutdown is refused. What is left to do with it is agreeing on the
    /// survivors and shrinking it.
    #[error("process group revoked: {reason}")]
    Revoked {
        /// Who revoked it, and why.
        reason: String,
    },
    /// The survivors' agreement after a failure ([`crate::ProcessGroup::agree_survivors`]) left this rank out:
    /// it did not check in before the list was decided, or another rank reported it dead. Every survivor acts
    /// on the one decided list; this rank must not take part in the shrink.
    #[error(
        "rank {rank} is not among the survivors agreed in recovery round {round} of group '{group}' (survivors: \
         {survivors:?}): it checked in too late or was reported dead"
    )]
    Excluded {
        /// The group's name.
        group: String,
        /// The recovery round (from 0, counting this group's agreements).
        round: u64,
        /// This rank, in the group.
        rank: usize,
        /// The survivors decided, as ranks of the group.
        survivors: Vec<usize>,
    },
    /// The watchdog stopped making progress (PyTorch's heartbeat monitor).
    #[error("the watchdog made no progress for {} s (heartbeat timeout)", .elapsed.as_secs())]
    HeartbeatTimeout {
        /// How long the watchdog had been stuck.
        elapsed: Duration,
    },
    /// A store operation failed: a timeout or a network error while rendezvousing.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A rank could not get a communicator's unique id through the store.
    #[error(
        "rank {rank} could not get the unique id of communicator '{cache_key}' from its root via store key \
         '{store_key}': {source}; the root rank may have crashed, skipped this op, or the store is unreachable"
    )]
    Rendezvous {
        /// The rank that waited.
        rank: usize,
        /// The communicator's cache key.
        cache_key: String,
        /// The store key it read.
        store_key: String,
        /// What the store said.
        source: Box<StoreError>,
    },
    /// Two process groups rendezvous under the same store keys (they share one store prefix), so their ranks
    /// would pair across groups: each group needs a store prefix of its own.
    #[error(
        "process group '{group}' (rank {rank}) shares its store prefix '{prefix}' with another process group: \
         store key '{store_key}': {detail}; give each group its own store prefix (a PrefixStore per group)"
    )]
    PrefixCollision {
        /// The group's name.
        group: String,
        /// This rank.
        rank: usize,
        /// The group's store prefix, as the underlying store sees it (`Store::key_prefix`).
        prefix: String,
        /// The unique-id key (under the group's store) where the collision was seen.
        store_key: String,
        /// What was found there.
        detail: String,
    },
    /// The ranks of a group made different subgroup calls at the same place in their order: one called
    /// `new_group` with other ranks than another, or `new_group` where another called `split_by_color`. A rank's
    /// n-th subgroup call names the subgroup on every rank, so ranks that disagree would pair with the wrong
    /// peers; no data moves.
    #[error(
        "subgroup call {call} of group '{group}' differs between ranks: rank {rank} called {mine}, but rank {peer} \
         called {theirs}; every rank must call new_group and split_by_color in the same order, with the same \
         ranks (as in torch.distributed)"
    )]
    SubgroupMismatch {
        /// The parent group's name.
        group: String,
        /// The call's number among the parent's subgroup calls (from 0).
        call: u64,
        /// This rank, in the parent group.
        rank: usize,
        /// What this rank called.
        mine: String,
        /// The first rank (in the parent group) whose call differs.
        peer: usize,
        /// What that rank called.
        theirs: String,
    },
    /// The caller passed something wrong: a size, a dtype, a rank, an environment value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The backend cannot do this (a reduction on a dtype, an op it lacks).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The device runtime failed (a CUDA driver error, a missing library).
    #[error("backend error: {0}")]
    Backend(String),
    /// A call that stream capture forbids (CUDA's `cudaErrorStreamCaptureUnsupported`): synchronising or
    /// querying a capturing stream or an event recorded in a capture, a blocking wait, barrier or communicator
    /// creation under capture, or a capture that cannot end (a joined stream not joined back, an invalidated
    /// capture). The message names the call.
    #[error("not permitted while a stream is capturing: {0}")]
    CaptureUnsupported(String),
}

/// The kind of an [`Error`], for matching without the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// [`Error::WorkTimeout`].
    WorkTimeout,
    /// [`Error::InitTimeout`].
    InitTimeout,
    /// [`Error::Communicator`].
    Communicator,
    /// [`Error::Remote`].
    Remote,
    /// [`Error::RankDead`].
    RankDead,
    /// [`Error::Aborted`].
    Aborted,
    /// [`Error::Revoked`].
    Revoked,
    /// [`Error::Excluded`].
    Excluded,
    /// [`Error::HeartbeatTimeout`].
    HeartbeatTimeout,
    /// A [`StoreError::Timeout`].
    StoreTimeout,
    /// Any other [`Error::Store`]: the store could not be reached or answered wrongly.
    StoreNetwork,
    /// [`Error::PrefixCollision`].
    PrefixCollision,
    /// [`Error::SubgroupMismatch`].
    SubgroupMismatch,
    /// [`Error::InvalidArgument`].
    InvalidArgument,
    /// [`Error::Unsupported`].
    Unsupported,
    /// [`Error::Backend`].
    Backend,
    /// [`Error::CaptureUnsupported`].
    CaptureUnsupported,
}

impl Error {
    /// This error's kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::WorkTimeout { .. } => ErrorKind::WorkTimeout,
            Error::InitTimeout { .. } => ErrorKind::InitTimeout,
            Error::Communicator { .. } => ErrorKind::Communicator,
            Error::Remote { .. } => ErrorKind::Remote,
            Error::RankDead { .. } => ErrorKind::RankDead,
            Error::StoreLost { .. } => ErrorKind::StoreNetwork,
            Error::Aborted { .. } => ErrorKind::Aborted,
            Error::Revoked { .. } => ErrorKind::Revoked,
            Error::Excluded { .. } => ErrorKind::Excluded,
            Error::HeartbeatTimeout { .. } => ErrorKind::HeartbeatTimeout,
            Error::Store(error) if error.is_timeout() => ErrorKind::StoreTimeout,
            Error::Rendezvous { source, .. } if source.is_timeout() => ErrorKind::StoreTimeout,
            Error::Store(_) | Error::Rendezvous { .. } => ErrorKind::StoreNetwork,
            Error::PrefixCollision { .. } => ErrorKind::PrefixCollision,
            Error::SubgroupMismatch { .. } => ErrorKind::SubgroupMismatch,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::Unsupported(_) => ErrorKind::Unsupported,
            Error::Backend(_) => ErrorKind::Backend,
            Error::CaptureUnsupported(_) => ErrorKind::CaptureUnsupported,
        }
    }

    /// Whether this is one of the timeout kinds: a work, communicator-creation, heartbeat or store timeout.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self.kind(),
            ErrorKind::WorkTimeout | ErrorKind::InitTimeout | ErrorKind::HeartbeatTimeout | ErrorKind::StoreTimeout
        )
    }

    /// A communicator error with this message and no result code.
    pub fn communicator(message: impl Into<String>) -> Self {
        Error::Communicator { message: message.into(), code: None }
    }

    /// A communicator error with the communication library's result code (NCCL's `ncclResult_t`).
    pub fn communicator_code(code: u32, message: impl Into<String>) -> Self {
        Error::Communicator { message: message.into(), code: Some(code) }
    }

    /// The communication library's result code, for a [`Error::Communicator`] that has one.
    pub fn result_code(&self) -> Option<u32> {
        match self {
            Error::Communicator { code, .. } => *code,
            _ => None,
        }
    }

    /// An invalid-argument error with this message.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::InvalidArgument(message.into())
    }

    /// An unsupported-operation error with this message.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Error::Unsupported(message.into())
    }

    /// A stream-capture error naming the call that capture forbids.
    pub fn capture(message: impl Into<String>) -> Self {
        Error::CaptureUnsupported(message.into())
    }
}
