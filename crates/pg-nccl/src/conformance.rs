//! The conformance harness of the NCCL backend (with the `testing` feature): one process per GPU, so a world is
//! this process's rank plus its peers in other processes, and [`NcclHarness::run`] runs the closure for this
//! rank only. Worlds are told apart by store prefixes that every process derives the same way.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pg_conformance::{Capabilities, Clock, Harness, KernelLaunch, Offers, Ran, Rank};
use pg_core::store::{PrefixStore, Store};

use crate::launches;
use crate::{Device, Nccl};

/// The capabilities of a world on real GPUs: the launch log of this process, the wall clock, and another GPU
/// of the machine where there is one.
#[derive(Debug)]
pub struct NcclCapabilities {
    device: Device,
    other: Option<Device>,
}

/// The capabilities of `device` (opening the next GPU, if the machine has two or more, for the wrong-device
/// checks). The process's launch log is turned on: the kernel-log capability reads it.
pub fn capabilities(device: &Device) -> Arc<dyn Capabilities<Nccl>> {
    launches::set_enabled(true);
    let count = pg_cuda::device_count().unwrap_or(1);
    let ordinal = pg_core::Device::index(device);
    let other = (count > 1).then(|| Device::new((ordinal + 1) % count).ok()).flatten();
    Arc::new(NcclCapabilities { device: device.clone(), other })
}

impl Capabilities<Nccl> for NcclCapabilities {
    fn kernel_log(&self, _rank: usize) -> Option<Vec<KernelLaunch>> {
        let launches = launches::for_device(pg_core::Device::index(&self.device));
        Some(launches.into_iter().collect())
    }

    fn clock(&self) -> Option<Clock> {
        Some(Clock::Wall)
    }

    fn other_device(&self, _rank: usize) -> Option<Device> {
        self.other.clone()
    }
}

/// How long a rank waits at the end of a world for its peers before it lets go of the world's groups.
const WORLD_END_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// This process's rank of a job of `world_size` processes, one GPU each.
pub struct NcclHarness {
    rank: usize,
    world_size: usize,
    device: Device,
    store: Arc<dyn Store>,
    caps: Arc<dyn Capabilities<Nccl>>,
    /// The current case's name and how many worlds it has made: the store prefix of its next world.
    case: Mutex<String>,
    worlds: AtomicU64,
}

impl std::fmt::Debug for NcclHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclHarness").field("rank", &self.rank).field("world_size", &self.world_size).finish()
    }
}

impl NcclHarness {
    /// The harness of rank `rank` of `world_size`, on `device`, rendezvousing through the job's `store`.
    pub fn new(rank: usize, world_size: usize, device: Device, store: Arc<dyn Store>) -> Self {
        let caps = capabilities(&device);
        Self { rank, world_size, device, store, caps, case: Mutex::new(String::new()), worlds: AtomicU64::new(0) }
    }

    /// Starts a case: its worlds get store prefixes under its name, so that a case that ended early on one
    /// rank cannot pair its peers' next worlds with the wrong ones.
    pub fn begin_case(&self, name: &str) {
        *self.case.lock().unwrap_or_else(PoisonError::into_inner) = name.to_owned();
        self.worlds.store(0, Ordering::SeqCst);
    }
}

impl Harness for NcclHarness {
    type B = Nccl;

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn offers(&self) -> Offers {
        Offers {
            kernel_log: true,
            kernel_spans: false,
            clock: Some(Clock::Wall),
            hazards: false,
            faults: false,
            other_device: self.caps.other_device(self.rank).is_some(),
        }
    }

    fn run<T: Send>(&self, n: usize, body: impl Fn(&Rank<Nccl>) -> T + Sync) -> Result<Ran<Nccl, T>, String> {
        if n == 0 || n > self.world_size {
            return Err(format!("a world of {n} ranks asked of a job of {}", self.world_size));
        }
        let world = self.worlds.fetch_add(1, Ordering::SeqCst);
        let case = self.case.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let mut results = Vec::new();
        // Every world starts on a healthy device: a case that timed out on purpose left the device's failure
        // record set (the mock gives each world a device of its own; here the process keeps one).
        pg_core::Device::poison(&self.device).clear();
        if self.rank < n {
            let store = Arc::new(PrefixStore::new(format!("conformance/{case}/{world}"), Arc::clone(&self.store)));
            let rank = Rank::new(self.rank, n, self.device.clone(), store, Arc::clone(&self.caps));
            let result = body(&rank);
            // The world's groups go only once every rank is done with them; a barrier that fails is logged,
            // the case's own result stands.
            if let Err(error) = rank.finish_world(WORLD_END_TIMEOUT) {
                tracing::warn!(target: "pg", case = %case, "{error}");
            }
            results.push((self.rank, result));
        }
        Ok(Ran { results, caps: Arc::clone(&self.caps) })
    }
}
