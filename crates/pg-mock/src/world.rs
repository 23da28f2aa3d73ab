//! The simulated machine: its configuration, the one lock over all simulated state, and registered host threads.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pg_store::Store;

use crate::allocator::Allocator;
use crate::clock::{dur, ns, show, Advance, Cond, Park, Time, Wake};
use crate::communicator::Comms;
use crate::device::MockDevice;
use crate::event::EventState;
use crate::fault::Fault;
use crate::hazard::{Hazard, HazardMode, VClock};
use crate::store::{SimStore, StoreState};
use crate::stream::{DeviceState, KernelRecord, StreamState};

/// The host-side costs of API calls, charged to the calling thread's local time (they never force lockstep).
#[derive(Debug, Clone)]
pub struct HostCosts {
    /// Launching a kernel or a copy (`fill`, `sleep_kernel`, `copy_*`).
    pub kernel_launch: Duration,
    /// Recording an event.
    pub event_record: Duration,
    /// Making a stream wait for an event.
    pub stream_wait: Duration,
    /// Querying an event, a stream or a communicator.
    pub query: Duration,
    /// Enqueuing a collective or a point-to-point operation.
    pub collective_enqueue: Duration,
    /// One store operation.
    pub store_op: Duration,
}

impl Default for HostCosts {
    fn default() -> Self {
        Self {
            kernel_launch: Duration::from_micros(5),
            event_record: Duration::from_nanos(250),
            stream_wait: Duration::from_nanos(250),
            query: Duration::from_nanos(250),
            collective_enqueue: Duration::from_micros(5),
            store_op: Duration::from_micros(10),
        }
    }
}

/// How a [`World`] is built: its devices, cost model, hazard mode and faults.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// The number of simulated devices (device `i` is used by rank `i` in [`World::run`]).
    pub devices: usize,
    /// The fixed latency of every collective.
    pub collective_latency: Duration,
    /// The bus bandwidth of collectives, in bytes per second: an all-reduce of `b` bytes on `n` ranks takes
    /// `latency + 2(n-1)/n * b / bandwidth`.
    pub bus_bandwidth: f64,
    /// The bandwidth of a fill kernel, in bytes per second.
    pub fill_bandwidth: f64,
    /// The bandwidth of host-device copies, in bytes per second.
    pub copy_bandwidth: f64,
    /// The virtual time a communicator takes to initialise once every rank has joined.
    pub comm_init: Duration,
    /// Host-side costs of API calls.
    pub host: HostCosts,
    /// What a detected hazard does.
    pub hazard_mode: HazardMode,
    /// How many operations a stream holds in flight before a launch blocks the host until the oldest finishes
    /// (CUDA's launch queue; it also bounds the simulation's memory when the host runs far ahead).
    pub launch_queue_depth: usize,
    /// Streams per priority in each device's pool (PyTorch has 32).
    pub streams_per_pool: usize,
    /// How many kernel records each device keeps (the oldest are dropped).
    pub kernel_log_capacity: usize,
    /// Virtual time after which the world stops with a report (a livelock guard).
    pub time_limit: Duration,
    /// Real time with no simulated progress after which a parked thread stops with a report (a registered
    /// thread blocked outside the simulation, on a real lock or a join, stops the clock).
    pub stall_limit: Duration,
    /// Injected faults.
    pub faults: Vec<Fault>,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            devices: 4,
            collective_latency: Duration::from_micros(10),
            bus_bandwidth: 300e9,
            fill_bandwidth: 1e12,
            copy_bandwidth: 25e9,
            comm_init: Duration::from_millis(50),
            host: HostCosts::default(),
            hazard_mode: HazardMode::Panic,
            launch_queue_depth: 1024,
            streams_per_pool: 32,
            kernel_log_capacity: 4096,
            time_limit: Duration::from_secs(24 * 3600),
            stall_limit: Duration::from_secs(30),
            faults: Vec::new(),
        }
    }
}

impl WorldConfig {
    /// The default configuration with `devices` devices.
    pub fn with_devices(devices: usize) -> Self {
        Self { devices, ..Self::default() }
    }
}

/// One registered host thread.
#[derive(Debug)]
pub(crate) struct ThreadState {
    pub(crate) name: String,
    /// Its local time: the global time plus the host costs run up since it last woke.
    pub(crate) local: Time,
    /// What it knows has happened (streams it synchronised with), for hazard detection.
    pub(crate) clock: VClock,
    /// Its registered wait, while parked.
    pub(crate) park: Option<Park>,
    /// A helper of the process group (`Device::spawn_host_thread`: a watchdog, a heartbeat monitor): helpers
    /// alone do not move the clock, so a helper left behind by its ranks waits instead of spinning through time.
    pub(crate) helper: bool,
}

/// All simulated state, under the world's one lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) now: Time,
    /// Bumped on every change, for the stall detector.
    pub(crate) version: u64,
    pub(crate) threads: BTreeMap<usize, ThreadState>,
    next_thread: usize,
    pub(crate) interrupt_epoch: u64,
    /// A deadlock or limit report: every parked thread panics with it.
    pub(crate) failure: Option<String>,
    /// Registered threads that ended by a panic, in order (the first is the likely root cause).
    pub(crate) panicked: Vec<(usize, String)>,
    pub(crate) devices: Vec<DeviceState>,
    pub(crate) streams: Vec<StreamState>,
    /// Streams with operations not yet resolved.
    pub(crate) active: BTreeSet<usize>,
    pub(crate) events: HashMap<u64, EventState>,
    pub(crate) next_event: u64,
    pub(crate) alloc: Allocator,
    pub(crate) comms: Comms,
    pub(crate) store: StoreState,
    pub(crate) hazards: Vec<Hazard>,
    /// A hazard to panic with once the lock is released (in [`HazardMode::Panic`]).
    pub(crate) pending_panic: Option<String>,
    pub(crate) faults: Vec<Fault>,
    /// Bytes read by finished device-to-host copies, until their caller takes them.
    pub(crate) to_host: HashMap<crate::clock::OpRef, Vec<u8>>,
    pub(crate) kernel_log_capacity: usize,
    pub(crate) hazard_mode: HazardMode,
    /// A copy of the world's configuration (the cost model).
    pub(crate) config: WorldConfig,
}

impl State {
    fn new(config: &WorldConfig) -> Self {
        let mut state = Self {
            now: 0,
            version: 0,
            threads: BTreeMap::new(),
            next_thread: 0,
            interrupt_epoch: 0,
            failure: None,
            panicked: Vec::new(),
            devices: Vec::new(),
            streams: Vec::new(),
            active: BTreeSet::new(),
            events: HashMap::new(),
            next_event: 0,
            alloc: Allocator::default(),
            comms: Comms::default(),
            store: StoreState::default(),
            hazards: Vec::new(),
            pending_panic: None,
            faults: config.faults.clone(),
            to_host: HashMap::new(),
            kernel_log_capacity: config.kernel_log_capacity,
            hazard_mode: config.hazard_mode,
            config: config.clone(),
        };
        for device in 0..config.devices {
            let default = state.add_stream(device, 0, false);
            state.devices.push(DeviceState::new(default));
        }
        state
    }

    /// The local time of thread `tid` (the global time for an unregistered caller).
    pub(crate) fn local(&self, tid: Option<usize>) -> Time {
        tid.and_then(|t| self.threads.get(&t)).map_or(self.now, |t| t.local.max(self.now))
    }

    /// Adds `cost` to thread `tid`'s local time.
    pub(crate) fn charge(&mut self, tid: Option<usize>, cost: Duration) {
        if let Some(thread) = tid.and_then(|t| self.threads.get_mut(&t)) {
            thread.local = thread.local.max(self.now) + ns(cost);
        }
    }

    /// Moves thread `tid`'s local time to at least `time` (it observed something that happened then).
    pub(crate) fn observe(&mut self, tid: Option<usize>, time: Time) {
        if let Some(thread) = tid.and_then(|t| self.threads.get_mut(&t)) {
            thread.local = thread.local.max(time);
        }
    }

    /// The calling thread's vector clock joined with `other` (it synchronised with it).
    pub(crate) fn join_thread_clock(&mut self, tid: Option<usize>, other: &VClock) {
        if let Some(thread) = tid.and_then(|t| self.threads.get_mut(&t)) {
            thread.clock.join(other);
        }
    }

    fn add_thread(&mut self, name: String, parent: Option<usize>, helper: bool) -> usize {
        let tid = self.next_thread;
        self.next_thread += 1;
        let (local, clock) = match parent.and_then(|p| self.threads.get(&p)) {
            Some(p) => (p.local.max(self.now), p.clock.clone()),
            None => (self.now, VClock::default()),
        };
        self.threads.insert(tid, ThreadState { name, local, clock, park: None, helper });
        self.version += 1;
        tid
    }

    /// Whether a parked thread can proceed now (or must look at its interrupt flag).
    pub(crate) fn someone_ready(&mut self) -> bool {
        self.resolve();
        self.threads.values().any(|t| match &t.park {
            None => false,
            Some(park) => {
                park.interrupt_epoch.is_some_and(|seen| seen < self.interrupt_epoch)
                    || self.wake_time(park, t.local).is_some_and(|(at, _)| at <= self.now)
            }
        })
    }

    /// Records a hazard: kept, and in panic mode raised once the lock is released.
    pub(crate) fn hazard(&mut self, hazard: Hazard) {
        tracing::warn!(target: "pg_mock::hazard", "{}", hazard.message);
        if self.hazard_mode == HazardMode::Panic && self.pending_panic.is_none() {
            self.pending_panic = Some(hazard.message.clone());
        }
        self.hazards.push(hazard);
    }
}

/// The shared part of a world; every handle holds an `Arc` of it.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) id: u64,
    pub(crate) config: WorldConfig,
    /// Each device's failure record ([`pg_core::Device::poison`]), outside the lock: a blocked wait parks with
    /// its flag as interrupt.
    pub(crate) poison: Vec<pg_core::Poison>,
    state: Mutex<State>,
    changed: Condvar,
}

static NEXT_WORLD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The worlds this thread is registered in, with its thread id in each.
    static REGISTERED: RefCell<Vec<(u64, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Marks the current thread as registered thread `tid` of a world until dropped (at thread exit, even on panic).
struct Enter {
    inner: Arc<Inner>,
    tid: usize,
}

impl Enter {
    fn new(inner: Arc<Inner>, tid: usize) -> Self {
        REGISTERED.with(|r| r.borrow_mut().push((inner.id, tid)));
        Self { inner, tid }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        let id = self.inner.id;
        let _ = REGISTERED.try_with(|r| r.borrow_mut().retain(|(w, _)| *w != id));
        let mut state = self.inner.lock();
        if let Some(thread) = state.threads.remove(&self.tid) {
            if std::thread::panicking() {
                state.panicked.push((self.tid, thread.name));
            }
        }
        state.version += 1;
        drop(state);
        self.inner.changed.notify_all();
    }
}

impl Inner {
    /// Locks the state (a panic elsewhere does not poison the simulation).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes every parked thread to re-evaluate its wait.
    pub(crate) fn notify(&self) {
        self.changed.notify_all();
    }

    /// The calling thread's id in this world, if it is registered.
    pub(crate) fn current(&self) -> Option<usize> {
        REGISTERED.with(|r| r.borrow().iter().find(|(w, _)| *w == self.id).map(|(_, t)| *t))
    }

    /// The calling thread's id, or a panic that explains how to register it (the mock is assertive).
    pub(crate) fn require(&self, api: &str) -> usize {
        match self.current() {
            Some(tid) => tid,
            None => panic!(
                "pg-mock: {api} called from a thread that is not registered with the simulated world: run rank code \
                 in World::run or World::spawn (or Device::spawn_host_thread), so that virtual time knows about it"
            ),
        }
    }

    /// Runs `f` under the lock, then raises a pending hazard panic once the lock is released.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut state = self.lock();
        let result = f(&mut state);
        state.version += 1;
        self.raise(state);
        result
    }

    /// Releases the lock after a change, waking parked threads only if one of them can now proceed (any
    /// running thread re-evaluates the clock when it parks or exits, so nothing else needs a wake-up).
    pub(crate) fn release(&self, mut state: MutexGuard<'_, State>) {
        let wake = state.someone_ready();
        drop(state);
        if wake {
            self.notify();
        }
    }

    /// Raises a pending hazard panic after the caller released the lock.
    pub(crate) fn raise(&self, state: MutexGuard<'_, State>) {
        let mut state = state;
        let panic = state.pending_panic.take();
        self.release(state);
        if let Some(message) = panic {
            panic!("{message}");
        }
    }

    /// Parks thread `tid` until `cond` holds (or `deadline`, or its `interrupt` flag): see [`crate::clock`].
    ///
    /// Returns the guard and why it woke; the thread's local time is then the global time.
    pub(crate) fn park<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        tid: usize,
        cond: Cond,
        deadline: Option<Time>,
        interrupt: Option<&AtomicBool>,
        what: String,
    ) -> (MutexGuard<'a, State>, Wake) {
        let time_limit = ns(self.config.time_limit);
        let mut park = Park { cond, deadline, interrupt_epoch: None, what };
        let mut last_version = state.version;
        let mut last_change = Instant::now();
        loop {
            if let Some(report) = state.failure.clone() {
                if let Some(t) = state.threads.get_mut(&tid) {
                    t.park = None;
                }
                drop(state);
                panic!("{report}");
            }
            state.resolve();
            let local = state.local(Some(tid));
            let now = state.now;
            let wake = match interrupt {
                Some(flag) if flag.load(Ordering::SeqCst) => Some(Wake::Interrupted),
                _ => state.wake_time(&park, local).filter(|(t, _)| *t <= now).map(|(_, why)| why),
            };
            if let Some(why) = wake {
                let thread = state.threads.get_mut(&tid).expect("a parked thread is registered");
                thread.park = None;
                if why != Wake::Interrupted {
                    thread.local = now;
                }
                state.version += 1;
                return (state, why);
            }
            if interrupt.is_some() {
                park.interrupt_epoch = Some(state.interrupt_epoch);
            }
            state.threads.get_mut(&tid).expect("a parked thread is registered").park = Some(park.clone());
            match state.try_advance(time_limit) {
                Advance::Advanced | Advance::SomeoneReady => {
                    self.changed.notify_all();
                    let local = state.local(Some(tid));
                    if state.wake_time(&park, local).is_some_and(|(t, _)| t <= state.now) {
                        // The clock moved to this thread's own wake-up: look again before sleeping.
                        continue;
                    }
                }
                Advance::Deadlock(report) | Advance::TimeLimit(report) => {
                    tracing::error!(target: "pg_mock", "{report}");
                    state.failure = Some(report);
                    self.changed.notify_all();
                    continue;
                }
                Advance::Busy => {}
                Advance::Quiescent => {
                    // Only helpers are left: wait for an interrupt (a shutdown) without the stall detector.
                    last_change = Instant::now();
                }
            }
            if state.version != last_version {
                last_version = state.version;
                last_change = Instant::now();
            }
            let (guard, _) = self
                .changed
                .wait_timeout(state, self.config.stall_limit.max(Duration::from_millis(1)))
                .unwrap_or_else(PoisonError::into_inner);
            state = guard;
            if state.version == last_version && last_change.elapsed() >= self.config.stall_limit {
                let report = state.report(&format!(
                    "stall: no simulated progress for {:?} of real time; a registered thread that is 'running' may be \
                     blocked outside the simulation (a real lock, channel or join)",
                    self.config.stall_limit
                ));
                state.failure = Some(report);
                self.changed.notify_all();
            }
        }
    }

    /// Registers a host thread that is about to be spawned (by the parent, so the count is right at once).
    fn register(&self, name: &str, helper: bool) -> usize {
        let parent = self.current();
        self.lock().add_thread(name.to_owned(), parent, helper)
    }

    /// Forgets a registered thread that could not be spawned.
    fn unregister(&self, tid: usize) {
        let mut state = self.lock();
        state.threads.remove(&tid);
        state.version += 1;
        drop(state);
        self.notify();
    }

    /// Spawns the host thread registered as `tid`.
    fn spawn_registered<T: Send + 'static>(
        self: &Arc<Self>,
        tid: usize,
        name: &str,
        body: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<JoinHandle<T>> {
        let inner = Arc::clone(self);
        let spawned = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            let _enter = Enter::new(inner, tid);
            body()
        });
        if spawned.is_err() {
            self.unregister(tid);
        }
        spawned
    }

    /// Blocks the launching thread while `stream` has more operations in flight than the launch queue holds,
    /// until half of them have finished.
    pub(crate) fn throttle(&self, tid: usize, stream: usize) {
        let depth = self.config.launch_queue_depth.max(1);
        let mut state = self.lock();
        if state.trim_inflight(stream) <= depth {
            return;
        }
        // Wait until half the queue has drained (a low watermark: the host then runs ahead again for a while
        // instead of parking at every launch).
        let s = &state.streams[stream];
        let oldest = s.next_seq - 1 - u64::try_from(depth / 2).unwrap_or(u64::MAX);
        let op = crate::clock::OpRef { stream, seq: oldest };
        let what = format!("launching on stream {} of device {}: its launch queue is full", s.id, s.device);
        let (state, _) = self.park(state, tid, Cond::OpsDone(vec![op]), None, None, what);
        drop(state);
    }

    /// Spawns a registered host thread (registered here, in the parent, before it runs).
    pub(crate) fn spawn<T: Send + 'static>(
        self: &Arc<Self>,
        name: &str,
        helper: bool,
        body: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<JoinHandle<T>> {
        let tid = self.register(name, helper);
        self.spawn_registered(tid, name, body)
    }
}

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
        let state = State::new(&config);
        let id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
        let poison = (0..config.devices).map(|_| pg_core::Poison::new()).collect();
        Self { inner: Arc::new(Inner { id, config, poison, state: Mutex::new(state), changed: Condvar::new() }) }
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
    /// If `n` exceeds the number of devices, or (re-raised) if a rank panicked.
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

    /// Every hazard detected so far (in [`HazardMode::Record`]; in panic mode, the one that panicked).
    pub fn hazards(&self) -> Vec<Hazard> {
        self.inner.lock().hazards.clone()
    }

    /// The kernels device `device` has run (oldest dropped beyond the log capacity), in start order.
    pub fn kernel_log(&self, device: usize) -> Vec<KernelRecord> {
        let state = self.inner.lock();
        let mut log: Vec<KernelRecord> =
            state.devices.get(device).map(|d| d.log.iter().cloned().collect()).unwrap_or_default();
        log.sort_by(|a, b| (a.start, a.end, a.stream_id, &a.name).cmp(&(b.start, b.end, b.stream_id, &b.name)));
        log
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

    /// A report of what every registered thread is doing (for debugging a test).
    pub fn report(&self) -> String {
        self.inner.lock().report("state")
    }
}

/// Formats a virtual time for messages.
pub(crate) fn show_duration(d: Duration) -> String {
    show(ns(d))
}
