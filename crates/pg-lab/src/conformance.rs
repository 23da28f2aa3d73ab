//! The conformance harness of the NCCL backend (on pg-nccl's `testing` hooks): one process per GPU, so a world is
//! this process's rank plus its peers in other processes, and [`NcclHarness::run`] runs the closure for this
//! rank only. Worlds are told apart by store prefixes that every process derives the same way.
//!
//! Each world's kernel log holds the launches made since the world began, with device times from its start
//! (timing events around each launch), and a world can inject an asynchronous error or this rank's death into its
//! communicators ([`pg_nccl::fault`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use pg_conformance::{Capabilities, Clock, Fault, Harness, KernelLaunch, Offers, Ran, Rank};
use pg_core::store::{PrefixStore, Store};
use pg_nccl::{fault, launches};
use pg_nccl::{Device, Nccl};

/// The capabilities of a world on real GPUs: the launches of this process since the world began (with device
/// times), the wall clock, faults injected into this rank's communicators, and another GPU of the machine where
/// there is one.
#[derive(Debug)]
pub struct NcclCapabilities {
    rank: usize,
    device: Device,
    other: Option<Device>,
    since: launches::Mark,
}

/// The capabilities of rank `rank`'s world on `device` (opening the next GPU, if the machine has two or more, for
/// the wrong-device checks), beginning now. The process's launch log and its device times are turned on: the
/// kernel-log capability reads them.
pub fn capabilities(rank: usize, device: &Device) -> Arc<NcclCapabilities> {
    launches::set_enabled(true);
    launches::set_spans(true);
    let count = pg_cuda::device_count().unwrap_or(1);
    let ordinal = pg_core::Device::index(device);
    let other = (count > 1).then(|| Device::new((ordinal + 1) % count).ok()).flatten();
    let since = launches::mark(device.cuda());
    Arc::new(NcclCapabilities { rank, device: device.clone(), other, since })
}

impl Capabilities<Nccl> for NcclCapabilities {
    fn kernel_log(&self, _rank: usize) -> Option<Vec<KernelLaunch>> {
        let log = launches::since(&self.since, pg_core::Device::index(&self.device));
        Some(log)
    }

    fn clock(&self) -> Option<Clock> {
        Some(Clock::Wall)
    }

    fn other_device(&self, _rank: usize) -> Option<Device> {
        self.other.clone()
    }

    /// An asynchronous error, or this rank's death during an op (its communicator aborted in place of the op: its
    /// peers see its connections close, as a killed process's), is injected into this process's communicators when
    /// it names this rank; a fault naming another rank is that rank's process's to inject (each process runs the
    /// case's body for itself). A rank that never joins is not offered.
    fn inject(&self, fault: Fault) -> bool {
        match fault {
            Fault::AsyncError { rank, after_ops } => {
                if rank == self.rank {
                    fault::arm_async_error(after_ops);
                }
                true
            }
            Fault::KillAt { rank, op } => {
                if rank == self.rank {
                    fault::arm_kill(op);
                }
                true
            }
            // A rank process reports its cases to the end: it is not killed whole mid-case, and the store lives in
            // the launcher.
            // NCCL's own teardown takes what it takes: the recovery benchmark measures it.
            Fault::NeverJoin { .. }
            | Fault::KillProcessAt { .. }
            | Fault::StoreHostedBy { .. }
            | Fault::SlowTeardown { .. } => false,
        }
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
        Self { rank, world_size, device, store, case: Mutex::new(String::new()), worlds: AtomicU64::new(0) }
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
            kernel_spans: true,
            clock: Some(Clock::Wall),
            hazards: false,
            faults: true,
            process_kills: false,
            // NCCL's own teardown takes what it takes (up to 500 ms over sockets; the recovery benchmark shows it).
            slow_teardown: false,
            other_device: pg_cuda::device_count().unwrap_or(1) > 1,
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
        // Each world starts without a fault and with a kernel log of its own.
        fault::disarm();
        let caps: Arc<dyn Capabilities<Nccl>> = capabilities(self.rank, &self.device);
        if self.rank < n {
            let store = Arc::new(PrefixStore::new(format!("conformance/{case}/{world}"), Arc::clone(&self.store)));
            let rank = Rank::new(self.rank, n, self.device.clone(), store, Arc::clone(&caps));
            let result = body(&rank);
            // The world's groups go only once every rank is done with them; a barrier that fails is logged,
            // the case's own result stands.
            if let Err(error) = rank.finish_world(WORLD_END_TIMEOUT) {
                tracing::warn!(target: "pg", case = %case, "{error}");
            }
            results.push((self.rank, result));
        }
        fault::disarm();
        Ok(Ran { results, caps })
    }
}
