//! The harness trait through which a backend runs the suite, and the optional capabilities it may offer.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use pg_core::store::{PrefixStore, Store};
use pg_core::{Backend, DType, Device, OptionsBuilder, ProcessGroup};

use crate::check::{Check, Context};
use crate::{ensure, values};

/// What kind of kernel a launch was (the simulator's kinds, which every harness reports).
pub use pg_core::{KernelKind, KernelLaunch};

/// The host clock the ranks' [`pg_core::Device::now`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Virtual time: deterministic, so cases may compare host durations exactly.
    Virtual,
    /// The wall clock: cases compare host durations only against wide bounds.
    Wall,
}

/// The kind of a detected stream hazard (the simulator's detector is the one there is).
pub use pg_mock::HazardKind;

/// A stream hazard a backend detected during a world's run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hazard {
    /// What kind it is.
    pub kind: HazardKind,
    /// The rank on which it happened.
    pub rank: usize,
    /// The backend's readable report.
    pub message: String,
}

/// A fault a case asks the harness to inject.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Once `rank`'s first `after_ops` ops on a communicator have finished, the communicator reports an
    /// asynchronous error.
    AsyncError {
        /// The rank.
        rank: usize,
        /// Ops that finish normally first.
        after_ops: u64,
    },
    /// `rank` never joins a communicator.
    NeverJoin {
        /// The rank.
        rank: usize,
    },
    /// `rank` is killed during its op number `op` (from 0) on a communicator: that op never completes on any rank,
    /// the dead rank's own part ends at once without effect, and its case body stops there (or goes on as the
    /// rank's replacement, a new process on the same device: the kill fires once).
    KillAt {
        /// The rank.
        rank: usize,
        /// The op number on the communicator.
        op: u64,
    },
    /// As [`Fault::KillAt`], and the rank's whole process goes with it: its store connections close too, so a
    /// store that publishes closed liveness connections ([`pg_core::Options::liveness`]) tells every rank. A
    /// harness that cannot end a rank's process in the middle of a case refuses it.
    KillProcessAt {
        /// The rank.
        rank: usize,
        /// The op number on the communicator.
        op: u64,
    },
    /// `rank`'s communicators take `duration` of host time to tear down: an abort or a revoke stops the communicator
    /// at once and then holds its caller that long (as NCCL's do over sockets, up to half a second).
    SlowTeardown {
        /// The rank.
        rank: usize,
        /// The host time an abort or a revoke takes.
        duration: std::time::Duration,
    },
    /// The world's store is hosted by `rank`'s process: when that process is killed ([`Fault::KillProcessAt`]),
    /// the store goes with it and every later store operation fails.
    StoreHostedBy {
        /// The rank.
        rank: usize,
    },
}

/// The optional capabilities of one world; every method's default says "not offered".
pub trait Capabilities<B: Backend>: Send + Sync {
    /// The kernels `rank`'s device launched so far, oldest first.
    fn kernel_log(&self, _rank: usize) -> Option<Vec<KernelLaunch>> {
        None
    }

    /// The host clock the ranks live by (`None`: host durations must not be measured).
    fn clock(&self) -> Option<Clock> {
        None
    }

    /// A device that is not `rank`'s, for the wrong-device checks.
    fn other_device(&self, _rank: usize) -> Option<B::Device> {
        None
    }

    /// Injects `fault` from now on; `false` if this harness cannot.
    fn inject(&self, _fault: Fault) -> bool {
        false
    }

    /// The stream hazards detected so far (`None`: the backend has no detector).
    fn hazards(&self) -> Option<Vec<Hazard>> {
        None
    }

    /// A buffer of `numel` elements of `dtype` on `device` whose memory another framework made and frees at once
    /// when its last handle goes ([`pg_core::Buffer::is_foreign`]); `None` if this harness cannot make one.
    fn foreign_buffer(&self, _device: &B::Device, _dtype: DType, _numel: usize) -> Option<pg_core::Result<B::Buffer>> {
        None
    }
}

/// The optional capabilities a harness's worlds offer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Offers {
    /// [`Capabilities::kernel_log`] gives each rank's launches.
    pub kernel_log: bool,
    /// The kernel log has device start and end times ([`KernelLaunch::span`]).
    pub kernel_spans: bool,
    /// The ranks' host clock, if host durations may be measured.
    pub clock: Option<Clock>,
    /// [`Capabilities::hazards`] reports stream hazards.
    pub hazards: bool,
    /// [`Capabilities::inject`] works.
    pub faults: bool,
    /// [`Capabilities::inject`] takes [`Fault::KillProcessAt`] and [`Fault::StoreHostedBy`]: a rank's whole process
    /// dies, its store connections (or the store it hosts) with it.
    pub process_kills: bool,
    /// [`Capabilities::inject`] takes [`Fault::SlowTeardown`]: the harness can make the backend's abort and revoke
    /// slow.
    pub slow_teardown: bool,
    /// [`Capabilities::other_device`] gives a second device.
    pub other_device: bool,
}

/// A world with no optional capability.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCapabilities;

impl<B: Backend> Capabilities<B> for NoCapabilities {}

/// How a backend takes part in the suite: it makes worlds of ranks and runs a closure on each.
pub trait Harness: Sync {
    /// The backend under test.
    type B: Backend;

    /// The ranks of the world the suite runs at (a case may use fewer).
    fn world_size(&self) -> usize;

    /// Which optional capabilities this harness's worlds offer (cases check before they run).
    fn offers(&self) -> Offers;

    /// Makes a fresh world of `n <= world_size()` ranks (its own store namespace, no communicator shared with
    /// earlier worlds), runs `body` on each of its ranks, and returns the results of the ranks this process
    /// ran (every rank on a simulated backend, its own on a one-process-per-GPU backend), in rank order.
    fn run<T: Send>(&self, n: usize, body: impl Fn(&Rank<Self::B>) -> T + Sync) -> Result<Ran<Self::B, T>, String>;
}

/// The results of one world's run, with the world's capabilities for checks made after it.
pub struct Ran<B: Backend, T> {
    /// (rank, result) for each rank this process ran.
    pub results: Vec<(usize, T)>,
    /// The world's capabilities.
    pub caps: Arc<dyn Capabilities<B>>,
}

impl<B: Backend, T> std::fmt::Debug for Ran<B, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ran").field("ranks", &self.results.iter().map(|(r, _)| *r).collect::<Vec<_>>()).finish()
    }
}

impl<B: Backend, V> Ran<B, Check<V>> {
    /// Fails with the first rank's error, else gives each rank's value.
    pub fn all_ok(self) -> Check<Vec<(usize, V)>> {
        let mut out = Vec::with_capacity(self.results.len());
        for (rank, result) in self.results {
            out.push((rank, result.map_err(|e| format!("rank {rank}: {e}"))?));
        }
        Ok(out)
    }
}

impl<B: Backend, T> Ran<B, T> {
    /// Fails if the backend's hazard detector reported anything.
    pub fn no_hazards(&self) -> Check {
        match self.caps.hazards() {
            Some(hazards) if !hazards.is_empty() => Err(format!(
                "{} stream hazard(s); first: {}",
                hazards.len(),
                hazards.first().map(|h| h.message.as_str()).unwrap_or_default()
            )),
            _ => Ok(()),
        }
    }
}

/// A second host thread of a rank and the value its body returns ([`Rank::spawn_host`]).
#[derive(Debug)]
pub struct HostThread<T> {
    name: String,
    handle: JoinHandle<()>,
    value: Arc<Mutex<Option<T>>>,
}

impl<T> HostThread<T> {
    /// Waits for the body's value in steps of the device's host clock (a plain join would stop a virtual clock
    /// while the thread still needs it to move), then joins the thread.
    pub fn finish<B: Backend>(self, rank: &Rank<B>) -> Check<T> {
        let taken = || self.value.lock().unwrap_or_else(PoisonError::into_inner).take();
        let mut polls = 0;
        let value = loop {
            if let Some(value) = taken() {
                break value;
            }
            ensure!(polls < 100_000, "the thread '{}' never finished", self.name);
            polls += 1;
            rank.host_sleep(Duration::from_millis(1));
        };
        self.handle.join().map_err(|_| format!("the thread '{}' panicked", self.name))?;
        Ok(value)
    }
}

/// One rank of a world, as a case sees it: its device, the world's store and the world's capabilities.
pub struct Rank<B: Backend> {
    /// This rank.
    pub rank: usize,
    /// The ranks of this world.
    pub size: usize,
    /// This rank's device.
    pub device: B::Device,
    /// The world's store (a namespace no other world uses).
    pub store: Arc<dyn Store>,
    /// The world's capabilities.
    pub caps: Arc<dyn Capabilities<B>>,
    /// The groups made through [`Rank::group`], let go only once every rank of the world has finished
    /// ([`Rank::finish_world`]).
    kept: Mutex<Vec<ProcessGroup<B>>>,
}

impl<B: Backend> std::fmt::Debug for Rank<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rank").field("rank", &self.rank).field("size", &self.size).finish_non_exhaustive()
    }
}

/// How long [`Rank::ready_group`] gives the communicator's creation.
const READY_GROUP_CREATION: std::time::Duration = std::time::Duration::from_secs(60);

impl<B: Backend> Rank<B> {
    /// Rank `rank` of a world of `size` on `device`, with the world's `store` and capabilities.
    pub fn new(
        rank: usize,
        size: usize,
        device: B::Device,
        store: Arc<dyn Store>,
        caps: Arc<dyn Capabilities<B>>,
    ) -> Self {
        Self { rank, size, device, store, caps, kept: Mutex::new(Vec::new()) }
    }

    /// A group of every rank named `name`, whose store keys live under `name/` (groups never read each other's
    /// ids). The rank keeps a handle until every rank of the world has finished ([`Rank::finish_world`]): a
    /// rank that finishes first must not abort a communicator its peers still use (on NCCL's network transport
    /// a peer's pending traffic then fails with "connection closed").
    pub fn group(&self, name: &str, options: OptionsBuilder) -> Check<ProcessGroup<B>> {
        Ok(self.keep(self.own_group(name, options)?))
    }

    /// Keeps a handle of `group`, made some other way than [`Rank::group`], until every rank of the world has
    /// finished ([`Rank::finish_world`]); returns the group.
    pub fn keep(&self, group: ProcessGroup<B>) -> ProcessGroup<B> {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner).push(group.clone());
        group
    }

    /// [`Rank::group`] without the rank's handle: dropping the returned group (and its clones) drops it, for
    /// cases about what dropping a group does.
    pub fn own_group(&self, name: &str, options: OptionsBuilder) -> Check<ProcessGroup<B>> {
        let store = Arc::new(PrefixStore::new(format!("{name}/"), Arc::clone(&self.store)));
        let options = options.group_name(name.to_owned()).build();
        ProcessGroup::new(store, self.rank, self.size, self.device.clone(), options).ctx("creating a group")
    }

    /// A group whose communicator exists (created under a generous timeout, then a barrier) and whose ops from now
    /// on get the timeout `options` asked for: a short op timeout must not also bound the communicator's
    /// creation, which the group timeout does.
    pub fn ready_group(&self, name: &str, options: OptionsBuilder) -> Check<ProcessGroup<B>> {
        self.ready(self.group(name, Self::for_creation(&options))?, &options)
    }

    /// [`Rank::ready_group`] without the rank's handle (see [`Rank::own_group`]).
    pub fn own_ready_group(&self, name: &str, options: OptionsBuilder) -> Check<ProcessGroup<B>> {
        self.ready(self.own_group(name, Self::for_creation(&options))?, &options)
    }

    /// `options` with a timeout long enough for a communicator's creation.
    fn for_creation(options: &OptionsBuilder) -> OptionsBuilder {
        let op_timeout = options.clone().build().timeout;
        options.clone().timeout(op_timeout.max(READY_GROUP_CREATION))
    }

    /// Creates `group`'s communicator (a barrier), then gives its later ops the timeout `options` asked for.
    fn ready(&self, group: ProcessGroup<B>, options: &OptionsBuilder) -> Check<ProcessGroup<B>> {
        group.barrier_sync().ctx("barrier")?;
        group.set_timeout(options.clone().build().timeout);
        Ok(group)
    }

    /// Ends this rank's part of a world: waits until every rank of the world has got here (a store barrier,
    /// at most `timeout`), then lets go of the groups made with [`Rank::group`]. A harness calls it after a case's
    /// body; a rank whose peers never arrive lets go after the timeout.
    ///
    /// Once every rank is here, nothing more runs on the world's groups: each healthy one with nothing in flight is
    /// shut down (its communicators finalized and destroyed, the last made first), as a program ends its groups,
    /// and only the others are dropped, which aborts their communicators (a finalize would wait for an op a peer
    /// never joined). An abort on NCCL's network transport while peers abort the same communicator can take long; a
    /// finalize with nothing in flight does not.
    pub fn finish_world(&self, timeout: Duration) -> Check {
        let waited = self.store.barrier("pg_conformance/world_end", self.size as i64, Some(timeout));
        let kept = std::mem::take(&mut *self.kept.lock().unwrap_or_else(PoisonError::into_inner));
        if waited.is_ok() {
            let idle = |group: &&ProcessGroup<B>| {
                let status = group.status();
                let healthy = group.error().is_none() && status.error.is_none() && !group.is_revoked();
                healthy && status.in_flight == 0 && status.aborted_comms == 0
            };
            for group in kept.iter().rev().filter(idle) {
                if let Err(error) = group.shutdown() {
                    tracing::warn!(target: "pg", rank = self.rank, group = %group.options().group_name,
                        "the end of a world: shutdown of a kept group: {error}");
                }
            }
        }
        // The rest are let go in the same order, the last made first (a subgroup before the group it came from).
        for group in kept.into_iter().rev() {
            drop(group);
        }
        waited.map_err(|e| format!("rank {}: the end-of-world barrier: {e}", self.rank))
    }

    /// Waits until every rank of the world has got here (a store barrier named `name`, at most a minute): for a case
    /// in which a rank is about to abort a communicator on purpose, so that no peer is still in an earlier op on it.
    pub fn barrier(&self, name: &str) -> Check {
        let key = format!("pg_conformance/barrier/{name}");
        self.store
            .barrier(&key, self.size as i64, Some(Duration::from_secs(60)))
            .map_err(|e| format!("rank {}: the barrier '{name}': {e}", self.rank))
    }

    /// `numel` f32 elements set to `value` on the current stream.
    pub fn filled(&self, value: f64, numel: usize) -> Check<B::Buffer> {
        self.filled_as(DType::F32, value, numel)
    }

    /// `numel` elements of `dtype` set to `value` on the current stream.
    pub fn filled_as(&self, dtype: DType, value: f64, numel: usize) -> Check<B::Buffer> {
        let buffer = self.device.alloc(dtype, numel).ctx("alloc")?;
        self.device.fill(&buffer, value, &self.device.current_stream()).ctx("fill")?;
        Ok(buffer)
    }

    /// A buffer of `dtype` holding `values`, written on the current stream.
    pub fn holding(&self, dtype: DType, values: &[f64]) -> Check<B::Buffer> {
        let buffer = self.device.alloc(dtype, values.len()).ctx("alloc")?;
        let bytes = values::encode(dtype, values);
        self.device.copy_from_host(&buffer, &bytes, &self.device.current_stream()).ctx("copy_from_host")?;
        Ok(buffer)
    }

    /// The buffer's elements, read on the current stream.
    pub fn read(&self, buffer: &B::Buffer) -> Check<Vec<f64>> {
        self.read_on(buffer, &self.device.current_stream())
    }

    /// The buffer's elements, read on `stream`.
    pub fn read_on(&self, buffer: &B::Buffer, stream: &<B as Backend>::Stream) -> Check<Vec<f64>> {
        let bytes = self.device.copy_to_host(buffer, stream).ctx("copy_to_host")?;
        Ok(values::decode(pg_core::Buffer::dtype(buffer), &bytes))
    }

    /// Enqueues a sleep kernel of `duration` on the current stream.
    pub fn sleep_current(&self, duration: Duration) -> Check {
        self.device.sleep_kernel(&self.device.current_stream(), duration).ctx("sleep kernel")
    }

    /// Blocks this host thread for `duration` of the device's host clock.
    pub fn host_sleep(&self, duration: Duration) {
        self.device.sleep(duration, &AtomicBool::new(false));
    }

    /// Runs `body` on a second host thread of this rank (`Device::spawn_host_thread`); [`HostThread::finish`]
    /// collects its value.
    pub fn spawn_host<T: Send + 'static>(
        &self,
        name: &str,
        body: impl FnOnce() -> T + Send + 'static,
    ) -> Check<HostThread<T>> {
        let value = Arc::new(Mutex::new(None));
        let slot = Arc::clone(&value);
        let handle = self
            .device
            .spawn_host_thread(
                name,
                Box::new(move || *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(body())),
            )
            .ctx(name)?;
        Ok(HostThread { name: name.to_owned(), handle, value })
    }

    /// The value `f` returns and the host time it took.
    pub fn host_time<T>(&self, f: impl FnOnce() -> T) -> (T, Duration) {
        let start = self.device.now();
        let value = f();
        (value, self.device.now() - start)
    }

    /// This rank's kernel log, if the harness keeps one.
    pub fn kernel_log(&self) -> Option<Vec<KernelLaunch>> {
        self.caps.kernel_log(self.rank)
    }
}
