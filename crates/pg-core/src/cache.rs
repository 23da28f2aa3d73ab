//! The per-group communicator cache: keys, the in-initialisation map, and the unique-id exchange (S3-S8).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crate::backend::Device as _;
use crate::{Backend, Communicator as _, Error, Event as _, Result, Stream as _};

/// Which communicator an op needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommKey {
    /// The group's collective communicator on a sequence of devices: key `"0"` (or `"0,1"`, order kept).
    Collective(Vec<usize>),
    /// A two-rank communicator for a single point-to-point op: key `"lo:hi"` of the sorted rank pair.
    SingleP2p {
        /// This rank.
        rank: usize,
        /// The peer.
        peer: usize,
    },
}

impl CommKey {
    /// The cache key, as PyTorch writes it.
    pub fn cache_key(&self) -> String {
        match self {
            CommKey::Collective(devices) => devices.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
            CommKey::SingleP2p { rank, peer } => {
                let (lo, hi) = if rank <= peer { (rank, peer) } else { (peer, rank) };
                format!("{lo}:{hi}")
            }
        }
    }

    /// Whether this is a single point-to-point key (which does not advance the collective counter, S6).
    pub fn is_single_p2p(&self) -> bool {
        matches!(self, CommKey::SingleP2p { .. })
    }
}

impl fmt::Display for CommKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.cache_key())
    }
}

/// A ready communicator with its dedicated stream (S8), shared by the cache and every Work on it: a Work
/// holds one reference to all of it.
pub(crate) struct CommShared<B: Backend> {
    pub(crate) device: B::Device,
    pub(crate) comm: Arc<B::Communicator>,
    pub(crate) stream: B::Stream,
    /// The key's reusable input-ready events (PyTorch's `ncclEvents_[key]`, which is one), recorded in turn.
    pub(crate) input_ready: InputReady<B>,
    /// Set before the communicator is aborted through [`CommShared::abort`]: an op whose Work is made after
    /// this may have been drained by the abort without running, so the enqueue path fails it.
    pub(crate) aborting: AtomicBool,
    /// The group that owns the communicator, which settles its Works around an abort.
    owner: Weak<dyn CommOwner<B>>,
}

/// What aborting one communicator needs from its group: an aborted stream drains past the ops still queued on
/// it without running them (NCCL's kernels exit; the simulated backend models it), so the end event of such an
/// op passes although its output was never computed. The group fails every Work on the communicator whose end
/// event it had not seen pass before the abort.
pub(crate) trait CommOwner<B: Backend>: Send + Sync {
    /// Fails the unfinished Works on `entry` with `error` (those not seen finished before the abort) and
    /// aborts its communicator.
    fn abort_comm(&self, entry: &CommShared<B>, error: &Error);
}

impl<B: Backend> CommShared<B> {
    /// A ready communicator of the group `owner`, with its stream and `input_ready_events` input-ready events.
    pub(crate) fn new(
        device: &B::Device,
        comm: Arc<B::Communicator>,
        stream: B::Stream,
        input_ready_events: usize,
        owner: Weak<dyn CommOwner<B>>,
    ) -> Self {
        Self {
            device: device.clone(),
            comm,
            stream,
            input_ready: InputReady::new(device, input_ready_events),
            aborting: AtomicBool::new(false),
            owner,
        }
    }

    /// Aborts the communicator after a failure seen on it (`error`): its group first fails the Works on it that
    /// had not finished, so no Work reports the success of an op the abort drained. With the group gone, the
    /// communicator is aborted alone (its Works then hold no group to be settled by).
    pub(crate) fn abort(&self, error: &Error) {
        self.aborting.store(true, Ordering::SeqCst);
        match self.owner.upgrade() {
            Some(owner) => owner.abort_comm(self, error),
            None => {
                if let Err(abort_error) = self.comm.abort(&error.to_string()) {
                    tracing::warn!(target: "pg", %abort_error, "aborting a communicator failed");
                }
            }
        }
    }

    /// Whether an abort of the communicator has begun (through the group or the backend).
    pub(crate) fn is_aborting(&self) -> bool {
        self.aborting.load(Ordering::SeqCst) || self.comm.is_aborted()
    }
}

/// The input-ready events of one communicator, used in turn (`Options::input_ready_events`), without a lock: an
/// op claims a free event, records it on the caller's stream, makes the communication stream wait on it and frees
/// it, so that no other op records the event between one op's record and its wait.
pub(crate) struct InputReady<B: Backend> {
    slots: Box<[Slot<B>]>,
    /// The slot the next op tries first: the one recorded longest ago.
    next: AtomicUsize,
}

/// One input-ready event and whether an op holds it.
struct Slot<B: Backend> {
    claimed: AtomicBool,
    event: B::Event,
}

impl<B: Backend> InputReady<B> {
    /// `count` events (at least one), created lazily by the backend at their first record.
    pub(crate) fn new(device: &B::Device, count: usize) -> Self {
        let slot = |_| Slot { claimed: AtomicBool::new(false), event: device.create_event() };
        Self { slots: (0..count.max(1)).map(slot).collect(), next: AtomicUsize::new(0) }
    }

    /// Orders `comm_stream` after the work enqueued on `current` so far (S9), through one of the events. When
    /// every event is held by another thread's op at this instant, a new event is made for this op alone.
    pub(crate) fn order(&self, device: &B::Device, current: &B::Stream, comm_stream: &B::Stream) -> Result<()> {
        let record_and_wait = |event: &B::Event| {
            event.record(current)?;
            comm_stream.wait_event(event)
        };
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        for turn in 0..self.slots.len() {
            let slot = &self.slots[first.wrapping_add(turn) % self.slots.len()];
            if slot.claimed.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                let ordered = record_and_wait(&slot.event);
                slot.claimed.store(false, Ordering::Release);
                return ordered;
            }
        }
        record_and_wait(&device.create_event())
    }
}

/// A cache entry: a handle to the communicator, its stream and its input-ready events.
pub(crate) type CommEntry<B> = Arc<CommShared<B>>;

/// The cache proper: guarded by the group's mutex, never held across a communicator's creation.
pub(crate) struct CommCache<B: Backend> {
    /// Ready communicators by cache key (PyTorch's `devNCCLCommMap_`).
    pub(crate) ready: HashMap<String, CommEntry<B>>,
    /// Communicators being created, by cache key (PyTorch's `inInitializationCommMap_`, S7).
    pub(crate) initializing: HashMap<String, Option<Arc<B::Communicator>>>,
    /// The collective store-key counter (PyTorch's `ncclCommCounter_`, S6).
    pub(crate) counter: u64,
}

impl<B: Backend> Default for CommCache<B> {
    fn default() -> Self {
        Self { ready: HashMap::new(), initializing: HashMap::new(), counter: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::CommKey;

    #[test]
    fn a_key_displays_as_its_cache_key() {
        assert_eq!(CommKey::Collective(vec![0, 1]).to_string(), "0,1");
        assert_eq!(CommKey::SingleP2p { rank: 3, peer: 1 }.to_string(), "1:3");
    }
}
