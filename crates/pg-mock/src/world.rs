//! The simulated machine's public handle: `World`, which makes devices and the store, runs rank code on
//! registered host threads, and reports what happened (hazards, kernel logs, memory).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use pg_store::Store;

use crate::clock::dur;
use crate::config::WorldConfig;
use crate::device::MockDevice;
use crate::fault::Fault;
use crate::hazard::Hazard;
use crate::sched::{Enter, Inner};
use crate::state::KernelRecord;
use crate::store::SimStore;

/// The simulated machine: devices with streams and memory, communicators, a store, and a virtual clock.
///
/// Cloning gives another handle to the same world. Rank code runs on registered host threads
/// ([`World::run`], [`World::spawn`]); the clock moves only when all of them are blocked.
#[derive(Debug, Clone)]
pub struct World {
    pub(crate) inner: Arc<Inner>,
}

impl World {
    /// A new world, at virtual time zero.
    pub fn new(config: WorldConfig) -> Self {
        Self { inner: Arc::new(Inner::new(config)) }
    }

    /// The configuration the world was built with.
    pub fn config(&self) -> &WorldConfig {
        &self.inner.config
    }

    /// Device `index`.
    ///
    /// # Panics
    /// If the world has no such device (a test-setup mistake).
    pub fn device(&self, index: usize) -> MockDevice {
        assert!(
            index < self.inner.config.devices,
            "pg-mock: device {index} does not exist (the world has {} devices)",
            self.inner.config.devices
        );
        MockDevice::new(Arc::clone(&self.inner), index)
    }

    /// A handle on the world's store, whose blocking operations wait in virtual time.
    pub fn store(&self) -> Arc<dyn Store> {
        Arc::new(SimStore::new(Arc::clone(&self.inner)))
    }

    /// Runs `body(rank, device)` on `n` registered host threads (rank `i` on device `i`), joins them and returns
    /// their results in rank order.
    ///
    /// # Panics
    /// If `n` exceeds the number of devices, (re-raised) if a rank panicked, or if the simulation stalled or
    /// deadlocked while the ranks ran.
    pub fn run<T, F>(&self, n: usize, body: F) -> Vec<T>
    where
        T: Send,
        F: Fn(usize, MockDevice) -> T + Send + Sync,
    {
        assert!(
            n <= self.inner.config.devices,
            "pg-mock: run({n}) on a world of {} devices",
            self.inner.config.devices
        );
        // Register every rank before any runs, so that no rank sees a world without the others.
        let tids: Vec<usize> = (0..n).map(|rank| self.inner.register(&format!("rank{rank}"), false)).collect();
        {
            let mut state = self.inner.lock();
            for (rank, tid) in tids.iter().enumerate() {
                state.trace.set_thread_device(*tid, rank);
            }
        }
        let body = &body;
        std::thread::scope(|scope| {
            let mut handles = Vec::with_capacity(n);
            for (rank, tid) in tids.iter().copied().enumerate() {
                let device = self.device(rank);
                let inner = Arc::clone(&self.inner);
                let spawned = std::thread::Builder::new().name(format!("rank{rank}")).spawn_scoped(scope, move || {
                    let _enter = Enter::new(inner, tid);
                    body(rank, device)
                });
                match spawned {
                    Ok(handle) => handles.push(handle),
                    Err(e) => {
                        for later in &tids[rank..] {
                            self.inner.unregister(*later);
                        }
                        panic!("pg-mock: cannot spawn rank {rank}: {e}");
                    }
                }
            }
            let mut results = Vec::with_capacity(n);
            let mut panics = Vec::new();
            for (rank, handle) in handles.into_iter().enumerate() {
                match handle.join() {
                    Ok(value) => results.push(value),
                    Err(payload) => panics.push((tids[rank], payload)),
                }
            }
            // Re-raise the panic that happened first (a hazard, say), not a deadlock report it caused later.
            let order = self.inner.lock().panicked.iter().map(|(tid, _)| *tid).collect::<Vec<_>>();
            panics.sort_by_key(|(tid, _)| order.iter().position(|t| t == tid).unwrap_or(usize::MAX));
            if let Some((_, payload)) = panics.into_iter().next() {
                std::panic::resume_unwind(payload);
            }
            // A stall or deadlock report raised while the ranks ran fails the run, even when only a helper thread
            // (a watchdog woken by it) saw it: a rank blocked outside the simulation stalls it that way.
            if let Some(report) = self.inner.lock().failure.clone() {
                panic!("pg-mock: the simulation failed while the ranks ran: {report}");
            }
            results
        })
    }

    /// Spawns one more registered host thread (a helper that runs next to the ranks).
    ///
    /// # Panics
    /// If the operating system cannot spawn a thread.
    pub fn spawn<T: Send + 'static>(&self, name: &str, body: impl FnOnce() -> T + Send + 'static) -> JoinHandle<T> {
        self.inner.spawn(name, false, body).unwrap_or_else(|e| panic!("pg-mock: cannot spawn thread '{name}': {e}"))
    }

    /// The global virtual time.
    pub fn now(&self) -> Duration {
        dur(self.inner.lock().now)
    }

    /// Every hazard detected so far (in [`HazardMode::Record`](crate::HazardMode::Record); in panic mode, the one that panicked).
    pub fn hazards(&self) -> Vec<Hazard> {
        self.inner.lock().hazards.clone()
    }

    /// The kernels device `device` has run (oldest dropped beyond the log capacity), in start order.
    pub fn kernel_log(&self, device: usize) -> Vec<KernelRecord> {
        self.inner.lock().kernel_log(device)
    }

    /// The timeline so far, in virtual time: what every stream ran (kernels, copies, communication kernels, waits
    /// for events), the waits as arrows from the operation the event marked, when host threads were blocked, and
    /// the hazards found; what is unfinished now (a hung collective, a thread still blocked) has no end.
    /// [`Trace::to_chrome_json`](crate::Trace::to_chrome_json) makes it a file for Perfetto or chrome://tracing.
    ///
    /// The world keeps the latest [`WorldConfig::trace_capacity`](crate::WorldConfig::trace_capacity) records.
    pub fn trace(&self) -> crate::Trace {
        self.inner.lock().trace()
    }

    /// How many communicators (rank-local handles, as NCCL counts them) have been created.
    pub fn communicators_created(&self) -> usize {
        self.inner.lock().comms.created
    }

    /// Adds a fault from now on.
    pub fn inject(&self, fault: Fault) {
        self.inner.lock().faults.push(fault);
        self.inner.notify();
    }

    /// Removes every injected fault that `keep` rejects (the store comes back, a slow rank recovers).
    pub fn clear_faults(&self, keep: impl Fn(&Fault) -> bool) {
        self.inner.lock().faults.retain(keep);
        self.inner.notify();
    }

    /// How many operations the world still holds in its stream queues (for memory tests).
    pub fn retained_ops(&self) -> usize {
        self.inner.lock().streams.iter().map(|s| s.ops.len()).sum()
    }

    /// How many memory blocks the allocator holds (in use or cached).
    pub fn memory_blocks(&self) -> usize {
        self.inner.lock().alloc.blocks.len()
    }

    /// The names of the host threads that are running now: rank threads, threads of [`World::spawn`], and the
    /// process groups' helpers (a watchdog, a heartbeat monitor) until their bodies return.
    pub fn host_threads(&self) -> Vec<String> {
        self.inner.lock().threads.values().map(|thread| thread.name.clone()).collect()
    }

    /// Waits until no host thread of the world can run any more, and says what each one left waits for (empty
    /// when every one has ended). Call it once the ranks are done: a thread that is left parked for good (a
    /// helper of a group nobody let go, a host callback behind an op that never finishes) outlives the world's
    /// ranks, and the case that left it is the one to blame. Threads that can still run (a host callback whose
    /// op finishes later in virtual time, moving the clock as the device runs on) are waited for, in real time.
    pub fn leftover_threads(&self) -> Vec<String> {
        self.inner.settle()
    }

    /// A report of what every registered thread is doing (for debugging a test).
    pub fn report(&self) -> String {
        self.inner.lock().report("state")
    }
}

impl MockDevice {
    /// The world this device belongs to.
    pub fn world(&self) -> World {
        World { inner: Arc::clone(&self.inner) }
    }
}
