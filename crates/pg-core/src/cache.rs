//! The per-group communicator cache: keys, the in-initialisation map, and the unique-id exchange (S3-S8).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use crate::backend::Device as _;
use crate::Backend;

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
    /// The key's reusable input-ready events (PyTorch's `ncclEvents_[key]`, which is one), recorded in turn;
    /// the mutex keeps one op's record and wait together.
    pub(crate) input_ready: Mutex<InputReady<B>>,
}

/// The input-ready events of one communicator, used in turn (`Options::input_ready_events`).
pub(crate) struct InputReady<B: Backend> {
    events: Vec<B::Event>,
    next: usize,
}

impl<B: Backend> InputReady<B> {
    /// `count` events (at least one), created lazily by the backend at their first record.
    pub(crate) fn new(device: &B::Device, count: usize) -> Self {
        Self { events: (0..count.max(1)).map(|_| device.create_event()).collect(), next: 0 }
    }

    /// The event to record for the next op: the one recorded longest ago.
    pub(crate) fn next(&mut self) -> &B::Event {
        let index = self.next;
        self.next = (index + 1) % self.events.len();
        &self.events[index]
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
