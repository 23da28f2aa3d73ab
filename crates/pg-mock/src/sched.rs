//! The world's lock and its scheduler: registered host threads, parking a thread until its condition holds, and
//! the rule that moves the virtual clock (see `clock.rs`).

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::clock::{ns, show, Advance, Cond, OpRef, Park, Time, Wake};
use crate::config::WorldConfig;
use crate::state::State;

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
    /// Stream captures in progress; locked before `state`, never while holding it.
    pub(crate) captures: Mutex<crate::capture::Captures>,
}

static NEXT_WORLD: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

thread_local! {
    /// The worlds this thread is registered in, with its thread id in each.
    static REGISTERED: RefCell<Vec<(u64, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Marks the current thread as registered thread `tid` of a world until dropped (at thread exit, even on panic).
pub(crate) struct Enter {
    inner: Arc<Inner>,
    tid: usize,
}

impl Enter {
    pub(crate) fn new(inner: Arc<Inner>, tid: usize) -> Self {
        REGISTERED.with(|r| r.borrow_mut().push((inner.id, tid)));
        Self { inner, tid }
    }
}

impl Drop for Enter {
    fn drop(&mut self) {
        let id = self.inner.id;
        let _ = REGISTERED.try_with(|r| r.borrow_mut().retain(|(w, _)| *w != id));
        let mut state = self.inner.lock();
        state.trace.forget_thread(self.tid);
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
    /// A new world's shared part, at virtual time zero.
    pub(crate) fn new(config: WorldConfig) -> Self {
        let state = State::new(&config);
        let id = NEXT_WORLD.fetch_add(1, Ordering::Relaxed);
        let poison = (0..config.devices).map(|_| pg_core::Poison::new()).collect();
        Self { id, config, poison, state: Mutex::new(state), changed: Condvar::new(), captures: Mutex::default() }
    }

    /// Locks the state (a panic elsewhere does not poison the simulation).
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks the stream captures (a panic elsewhere does not poison them). Never called with the state locked.
    pub(crate) fn captures(&self) -> MutexGuard<'_, crate::capture::Captures> {
        self.captures.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes every parked thread to re-evaluate its wait.
    pub(crate) fn notify(&self) {
        self.changed.notify_all();
    }

    /// The calling thread's id in this world, if it is registered.
    pub(crate) fn current(&self) -> Option<usize> {
        REGISTERED.with(|r| r.borrow().iter().find(|(w, _)| *w == self.id).map(|(_, t)| *t))
    }

    /// The capabilities the world's devices declare: [`WorldConfig::capabilities`], less grow without
    /// [`WorldConfig::native_grow`].
    pub(crate) fn capabilities(&self) -> pg_core::Capabilities {
        let declared = self.config.capabilities;
        declared.set(pg_core::Capability::Grow, declared.grow && self.config.native_grow)
    }

    /// `Ok` when the world's devices declare `capability`, else the refusal of `call` that names it.
    pub(crate) fn require_capability(&self, capability: pg_core::Capability, call: &str) -> pg_core::Result<()> {
        self.capabilities().require(<crate::Mock as pg_core::Backend>::NAME, capability, call)
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
        let since = state.local(Some(tid));
        let mut park = Park { cond, deadline, interrupt_epoch: None, what, since };
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
                state.trace_blocked(tid, &park.what, since, now);
                return (state, why);
            }
            if interrupt.is_some() {
                park.interrupt_epoch = Some(state.interrupt_epoch);
            }
            let mut quiescent = false;
            state.threads.get_mut(&tid).expect("a parked thread is registered").park = Some(park.clone());
            match state.try_advance(time_limit) {
                Advance::Advanced => {
                    // The clock moved: to this thread's own wake-up, to another's (notified), or to a collective's
                    // start (which may leave every thread waiting still, for a later time): look again.
                    self.changed.notify_all();
                    continue;
                }
                Advance::SomeoneReady => {
                    self.changed.notify_all();
                    let local = state.local(Some(tid));
                    if state.wake_time(&park, local).is_some_and(|(t, _)| t <= state.now) {
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
                    quiescent = true;
                }
            }
            if state.version != last_version || quiescent {
                last_version = state.version;
                last_change = Instant::now();
            }
            let (guard, _) = self
                .changed
                .wait_timeout(state, self.config.stall_limit.max(Duration::from_millis(1)))
                .unwrap_or_else(PoisonError::into_inner);
            state = guard;
            if !quiescent && state.version == last_version && last_change.elapsed() >= self.config.stall_limit {
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

    /// Waits (in real time) until no registered host thread can run any more: each has ended, or is parked with
    /// nothing that will wake it (the clock cannot move for it). Returns what each one left waits for, empty when
    /// every thread ended.
    pub(crate) fn settle(&self) -> Vec<String> {
        let mut state = self.lock();
        let mut last_version = state.version;
        let mut last_change = Instant::now();
        loop {
            if state.threads.is_empty() {
                return Vec::new();
            }
            if state.settled() || last_change.elapsed() >= self.config.stall_limit {
                return state.thread_lines();
            }
            let (guard, _) =
                self.changed.wait_timeout(state, Duration::from_millis(1)).unwrap_or_else(PoisonError::into_inner);
            state = guard;
            if state.version != last_version {
                last_version = state.version;
                last_change = Instant::now();
            }
        }
    }

    /// Registers a host thread that is about to be spawned (by the parent, so the count is right at once).
    pub(crate) fn register(&self, name: &str, helper: bool) -> usize {
        let parent = self.current();
        self.lock().add_thread(name.to_owned(), parent, helper)
    }

    /// Forgets a registered thread that could not be spawned.
    pub(crate) fn unregister(&self, tid: usize) {
        let mut state = self.lock();
        state.threads.remove(&tid);
        state.trace.forget_thread(tid);
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
        let op = OpRef { stream, seq: oldest };
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

impl State {
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

    /// The time at which `cond` holds, if it is known to hold at some time.
    pub(crate) fn cond_time(&self, cond: &Cond) -> Option<Time> {
        match cond {
            Cond::OpsDone(ops) => ops.iter().try_fold(0, |acc, op| self.op_finish(*op).map(|t| acc.max(t))),
            Cond::CommReady(group) => self.comms.groups.get(*group).and_then(|g| g.ready_time),
            Cond::StoreKeys(keys) => self.store.keys_time(keys),
            Cond::QueueNonEmpty(key) => self.store.queue_time(key),
            Cond::SplitDone(group, n) => self.comms.splits.get(&(*group, *n)).and_then(|round| round.done),
            Cond::ShrinkDone(key) => self.comms.shrinks.get(key).and_then(|round| round.done),
            Cond::GrowDone(key) => self.comms.grows.get(key).and_then(|round| round.done),
            Cond::StoreTurn { tid, at } => self.store_turn(*tid, *at).then_some(*at),
            Cond::Never => None,
        }
    }

    /// Whether thread `tid`'s store operation at `at` comes first among those waiting to run: no other thread
    /// waits to run one at an earlier time, or at the same time with a lower order.
    fn store_turn(&self, tid: usize, at: Time) -> bool {
        let Some(me) = self.threads.get(&tid) else { return true };
        self.threads.iter().all(|(&other, thread)| match &thread.park {
            Some(Park { cond: Cond::StoreTurn { at: theirs, .. }, .. }) if other != tid => {
                (*theirs, &thread.order) > (at, &me.order)
            }
            _ => true,
        })
    }

    /// When a thread at `local` with wait `park` may proceed, and why.
    pub(crate) fn wake_time(&self, park: &Park, local: Time) -> Option<(Time, Wake)> {
        let ready = self.cond_time(&park.cond).map(|t| (t.max(local), Wake::Ready));
        let deadline = park.deadline.map(|d| (d.max(local), Wake::Deadline));
        match (ready, deadline) {
            (Some(r), Some(d)) => Some(if r.0 <= d.0 { r } else { d }),
            (r, d) => r.or(d),
        }
    }

    /// Where the clock may go now, without moving it: `Err` with what stops it (a running thread, or only helpers
    /// left), else the earliest time at which a parked thread can proceed or a matched collective starts (`None`:
    /// no thread ever can).
    fn next_time(&self) -> Result<Option<Time>, Advance> {
        let mut best: Option<Time> = None;
        let mut helpers_only = true;
        for thread in self.threads.values() {
            helpers_only &= thread.helper;
            let Some(park) = &thread.park else { return Err(Advance::Busy) };
            // A helper's store operation waits for the clock: let it move that far. So does a helper waiting for
            // device work that finishes at a known time (a host callback behind a kernel): the device runs on
            // after the ranks have gone, as a real one does, so the helper is not left parked for ever.
            helpers_only &= !matches!(park.cond, Cond::StoreTurn { .. });
            helpers_only &= !matches!(park.cond, Cond::OpsDone(_) if self.cond_time(&park.cond).is_some());
            if park.interrupt_epoch.is_some_and(|seen| seen < self.interrupt_epoch) {
                // It has not looked at its interrupt flag since the last notify: it counts as running.
                return Err(Advance::Busy);
            }
            if let Some((t, _)) = self.wake_time(park, thread.local) {
                best = Some(best.map_or(t, |b| b.min(t)));
            }
        }
        // A matched collective starts when the clock reaches its start: the clock stops there.
        if let Some(&start) = self.pending_starts.range(self.now + 1..).next() {
            best = Some(best.map_or(start, |b| b.min(start)));
        }
        if helpers_only && best.is_none_or(|t| t > self.now) {
            return Err(Advance::Quiescent);
        }
        Ok(best)
    }

    /// Moves the clock when every registered thread is parked (see the module docs).
    pub(crate) fn try_advance(&mut self, time_limit: Time) -> Advance {
        let best = match self.next_time() {
            Ok(best) => best,
            Err(stopped) => return stopped,
        };
        self.pending_starts = self.pending_starts.split_off(&(self.now + 1));
        match best {
            None => {
                Advance::Deadlock(self.report("deadlock: every simulated host thread is blocked and none can proceed"))
            }
            Some(t) if t <= self.now => Advance::SomeoneReady,
            Some(t) if t > time_limit => Advance::TimeLimit(self.report(&format!(
                "virtual time limit of {} reached: the next wake-up is at {} (livelock, or a wait that never ends)",
                show(time_limit),
                show(t)
            ))),
            Some(t) => {
                self.now = t;
                self.version += 1;
                // Collectives that start now fire, so that the threads waiting for them see their ends.
                self.resolve();
                Advance::Advanced
            }
        }
    }

    /// Whether no registered thread can run any more: every one is parked, none can proceed at the current time
    /// and the clock cannot move for any (only helpers are left, none waiting for the clock; or none ever wakes).
    pub(crate) fn settled(&mut self) -> bool {
        if self.someone_ready() {
            return false;
        }
        matches!(self.next_time(), Err(Advance::Quiescent) | Ok(None))
    }

    /// One line per registered thread: its name, local time and what it waits for.
    pub(crate) fn thread_lines(&self) -> Vec<String> {
        self.threads.values().map(|thread| self.thread_line(thread)).collect()
    }

    /// A report of what every registered thread waits for.
    pub(crate) fn report(&self, headline: &str) -> String {
        let mut out = format!("pg-mock {headline} (virtual time {})", show(self.now));
        for (_, name) in &self.panicked {
            let _ = write!(out, "\n  thread '{name}' panicked earlier (look at its message first)");
        }
        for thread in self.threads.values() {
            let _ = write!(out, "\n  {}", self.thread_line(thread));
        }
        out
    }

    /// What `thread` is doing, for reports.
    fn thread_line(&self, thread: &crate::state::ThreadState) -> String {
        let mut out = format!("thread '{}' (local time {}): ", thread.name, show(thread.local));
        {
            match &thread.park {
                None => out.push_str("running"),
                Some(park) => {
                    out.push_str(&park.what);
                    match &park.cond {
                        Cond::OpsDone(ops) => {
                            for op in ops {
                                if let Some(why) = self.blocked_reason(*op) {
                                    let _ = write!(out, "; {why}");
                                }
                            }
                        }
                        Cond::CommReady(group) => {
                            let _ = write!(out, "; {}", self.comm_status(*group));
                        }
                        Cond::SplitDone(group, n) => {
                            let _ = write!(out, "; {}", self.split_status(*group, *n));
                        }
                        Cond::ShrinkDone(key) => {
                            let _ = write!(out, "; {}", self.shrink_status(key));
                        }
                        Cond::GrowDone(key) => {
                            let _ = write!(out, "; {}", self.grow_status(key));
                        }
                        _ => {}
                    }
                    if let Some(d) = park.deadline {
                        let _ = write!(out, " (gives up at {})", show(d));
                    }
                }
            }
        }
        out
    }
}
