//! The state one process group shares between its handles, its enqueue path, its watchdog and its heartbeat
//! monitor: identity and options (set once), the communicator cache, and one part per concern, each with private
//! fields owned by its module (lifecycle, rounds, tally, in-flight list, error record, Work reuse pool, flight
//! recorder, threads and signals).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use pg_store::Store;

use crate::cache::{CommCache, CommEntry};
use crate::flight_recorder::FlightRecorder;
use crate::in_flight::{new_entry, InFlight, Pushed};
use crate::lifecycle::{Asker, Call, GroupState, Lifecycle};
use crate::locks::{lock, try_lock};
use crate::op_trace::Tracer;
use crate::reuse::WorkPool;
use crate::rounds::Rounds;
use crate::signals::{Signals, StoreLink, Threads};
use crate::status::{ErrorState, GroupStatus};
use crate::subgroup_call::SubgroupCall;
use crate::tally::Tally;
use crate::work::WorkState;
use crate::{Backend, Communicator, Device as _, Error, Event as _, Options};

/// Where a subgroup sits in the world (see `subgroups.rs`, which makes them).
pub(crate) struct Membership {
    /// The subgroup's members as ranks of the world, in group-rank order.
    pub(crate) global_ranks: Arc<[usize]>,
    /// The parent's subgroup call that made it, when the ranks' views of that call are still to be compared
    /// (before the subgroup's first communicator is created).
    pub(crate) call: Option<SubgroupCall>,
    /// The store the world group was made with (a grow announces itself there to its new ranks).
    pub(crate) root: Arc<dyn Store>,
}

/// What a group is and what it has done, for its handles and its threads.
pub(crate) struct Shared<B: Backend> {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) device: B::Device,
    pub(crate) options: Options,
    /// The process-wide id of the group (PyTorch's "PG ID").
    pub(crate) local_id: u64,
    /// This group's instance number on its store: the n-th group this rank created there (`None`: a group that
    /// speaks PyTorch's store keys alone, with no instance claims).
    pub(crate) instance: Option<i64>,
    /// Where the group sits in the world, for a subgroup (`None`: the group is its own world).
    pub(crate) membership: Option<Membership>,
    /// The numbers of the calls every rank numbers alike (subgroups, chunk checks, agreements, shrinks, grows).
    pub(crate) rounds: Rounds,
    /// Where the group is in its life (healthy, failed, revoked, ...): every public call is checked against it.
    pub(crate) lifecycle: Lifecycle,
    pub(crate) cache: Mutex<CommCache<B>>,
    /// This rank's collective communicator, also in the cache, for a lock-free hot path.
    pub(crate) collective: OnceLock<CommEntry<B>>,
    /// Sequence numbers and counts of what the group did.
    pub(crate) tally: Tally,
    /// The timeout set with [`Shared::set_timeout`], in nanoseconds (`u64::MAX`: none set).
    timeout_override: AtomicU64,
    /// The Works in flight.
    pub(crate) in_flight: InFlight<B>,
    /// The watchdog's record of errors and progress.
    pub(crate) errors: ErrorState,
    /// Completed Works kept for reuse.
    pub(crate) reuse: Arc<WorkPool<B>>,
    /// The flight recorder, shared with the in-flight list, which records each new Work as it takes it in.
    pub(crate) recorder: Arc<FlightRecorder>,
    /// The op timeline of a traced group (`Options::trace_dir`); `None`, the enqueue path's one check, when off.
    pub(crate) tracer: Option<Tracer<B>>,
    pub(crate) signals: Arc<Signals>,
    pub(crate) threads: Threads,
    pub(crate) store_link: StoreLink,
    /// Held by a watchdog pass for its length (see `watchdog::pass`).
    pub(crate) passes: Mutex<()>,
    /// An injected wedge for the watchdog's next pass (`ProcessGroup::inject_watchdog_stall`).
    #[cfg(feature = "testing")]
    pub(crate) stall: Mutex<Option<Duration>>,
    /// The watchdog held between passes (`ProcessGroup::hold_watchdog`): 0 free, 1 asked, 2 held.
    #[cfg(feature = "testing")]
    pub(crate) watchdog_hold: std::sync::atomic::AtomicU8,
}

impl<B: Backend> Shared<B> {
    /// The state of a new group, with nothing created or started yet.
    pub(crate) fn new(
        store: Arc<dyn Store>,
        (rank, size): (usize, usize),
        device: B::Device,
        options: Options,
        (local_id, instance): (u64, Option<i64>),
        membership: Option<Membership>,
        tracer: Option<Tracer<B>>,
    ) -> Self {
        let recorder = Arc::new(FlightRecorder::new(options.trace_buffer_size));
        let reuse = Arc::new(WorkPool::new(options.reuse_works));
        Self {
            store,
            rank,
            size,
            device,
            local_id,
            instance,
            membership,
            rounds: Rounds::default(),
            lifecycle: Lifecycle::default(),
            cache: Mutex::new(CommCache::default()),
            collective: OnceLock::new(),
            tally: Tally::default(),
            timeout_override: AtomicU64::new(u64::MAX),
            in_flight: InFlight::new(Arc::clone(&recorder), Arc::clone(&reuse), options.enable_watchdog),
            errors: ErrorState::default(),
            reuse,
            recorder,
            tracer,
            signals: Arc::new(Signals::default()),
            threads: Threads::default(),
            store_link: StoreLink::default(),
            passes: Mutex::new(()),
            #[cfg(feature = "testing")]
            stall: Mutex::new(None),
            #[cfg(feature = "testing")]
            watchdog_hold: std::sync::atomic::AtomicU8::new(0),
            options,
        }
    }

    pub(crate) fn lock_cache(&self) -> MutexGuard<'_, CommCache<B>> {
        lock(&self.cache)
    }

    /// Who asks, for the words of a refusal.
    pub(crate) fn asker(&self) -> Asker<'_> {
        Asker { rank: self.rank, group: &self.options.group_name, call: None }
    }

    /// The state of the group now.
    pub(crate) fn state(&self) -> GroupState {
        self.lifecycle.state()
    }

    /// The error the group's ops return now, if any.
    pub(crate) fn error(&self) -> Option<Error> {
        self.lifecycle.error()
    }

    /// Checks `call` against the group's state (see `lifecycle.rs`).
    pub(crate) fn check(&self, call: Call) -> crate::Result<()> {
        self.lifecycle.check(call, &self.asker())
    }

    /// [`Shared::check`] of a call that a refusal names as `called` (`new_group(ranks [0, 1])`).
    pub(crate) fn check_named(&self, call: Call, called: &str) -> crate::Result<()> {
        self.lifecycle.check(call, &Asker { call: Some(called), ..self.asker() })
    }

    /// Moves the group through `call` (see `lifecycle.rs`), `error` being what its ops return from then on when it is
    /// the group's first. Returns the state it is in afterwards, or the refusal.
    pub(crate) fn transition(&self, call: Call, error: Option<Error>) -> crate::Result<GroupState> {
        self.lifecycle.apply(call, error, &self.asker())
    }

    /// A fatal error found by the group's threads or checks: a healthy group fails with it (every later op returns
    /// it); a group already failed, revoked, shut down or aborted keeps what it has.
    pub(crate) fn fail(&self, error: Error) {
        // A failure is refused in no state.
        let _ = self.transition(Call::Fail, Some(error));
    }

    /// Every communicator of the group, ready or being created.
    pub(crate) fn all_comms(&self) -> Vec<Arc<B::Communicator>> {
        let cache = self.lock_cache();
        let ready = cache.ready.values().map(|entry| Arc::clone(&entry.comm));
        ready.chain(cache.initializing.values().flatten().cloned()).collect()
    }

    /// Aborts every communicator of the group and fails, with `error`, every Work in flight whose op had not
    /// been seen finished before the abort (an aborted stream drains past such an op without running it), then
    /// takes them all off the in-flight list. What `abort()`, `shutdown()` and dropping the group do.
    pub(crate) fn abort_all_and_settle(&self, reason: &str, error: &Error) {
        for entry in self.lock_cache().ready.values() {
            entry.aborting.store(true, Ordering::SeqCst);
        }
        // The Works fail before the abort: once it runs, an awaiting task woken as the stream drains must find
        // the error, not an end event that passed.
        self.fail_unfinished_in_flight(error);
        self.abort_comms(reason);
        self.retire_in_flight();
    }

    /// Revokes the group with `error` (an [`Error::Revoked`]): every later call returns it, every Work in flight
    /// whose op had not been seen finished fails with it (a Work that already failed keeps its error), and every
    /// communicator is revoked (`Communicator::revoke`), or aborted where the backend has no revoke (NCCL before
    /// 2.28.7). No host call blocks. The threads are told to stop; nothing waits for them.
    pub(crate) fn revoke(&self, error: &Error) {
        self.mark_revoked(error);
        tracing::debug!(target: "pg", pg_id = self.local_id, rank = self.rank, "revoke: group revoked, Works failed");
        self.revoke_comms(&error.to_string());
        tracing::debug!(target: "pg", pg_id = self.local_id, rank = self.rank, "revoke: communicators revoked");
        self.finish_revoke();
    }

    /// Revokes every communicator of the group not yet revoked or aborted (aborts it where the backend cannot
    /// revoke): the middle of a revoke.
    pub(crate) fn revoke_comms(&self, reason: &str) {
        let can_revoke = self.device.capabilities().revoke;
        if !can_revoke {
            tracing::warn!(target: "pg", pg_id = self.local_id, backend = B::NAME,
                "no revoke capability: aborting the communicators instead");
        }
        for comm in self.all_comms().into_iter().filter(|comm| !comm.is_aborted() && !comm.is_revoked()) {
            let revoked = match can_revoke {
                true => comm.revoke(reason),
                false => comm.abort(reason),
            };
            if let Err(failure) = revoked {
                tracing::warn!(target: "pg", pg_id = self.local_id, %failure, "revoking a communicator failed");
            }
        }
    }

    /// The group's half of a revoke, before its communicators are revoked (or shrunk with abort): every later call
    /// returns `error`, and the Works in flight whose op had not been seen finished fail with it.
    pub(crate) fn mark_revoked(&self, error: &Error) {
        // A revoke is refused in no state (a shut down or aborted group stays so).
        let _ = self.transition(Call::Revoke, Some(error.clone()));
        self.fail_revoked_works(error);
    }

    /// The Works' half of a revoke: every communicator is marked aborting and the Works in flight whose op had not
    /// been seen finished fail with `error`.
    pub(crate) fn fail_revoked_works(&self, error: &Error) {
        for entry in self.lock_cache().ready.values() {
            entry.aborting.store(true, Ordering::SeqCst);
        }
        // As for an abort: the Works fail first, so that a task woken as a stream drains finds the error.
        self.fail_unfinished_in_flight(error);
    }

    /// The end of a revoke, once the communicators stopped: the Works leave the in-flight list and the threads are
    /// told to stop.
    pub(crate) fn finish_revoke(&self) {
        self.retire_in_flight();
        self.signals.stop(&self.device);
    }

    /// Sets `error` on every in-flight Work whose end event has not passed ([`InFlight::finished`]), leaving them on
    /// the list.
    pub(crate) fn fail_unfinished_in_flight(&self, error: &Error) {
        let finished = self.in_flight.finished(|_| true);
        self.in_flight.fail_unfinished(|_| true, &finished, error);
    }

    /// Waits until the op of every Work in flight has ended on the device, each at most until its own timeout
    /// runs out (counted from its host start, as the watchdog counts), polling every `blocking_wait_poll`. Returns
    /// `None` when all ended; else the error of the first Work whose op has not ended and failed (a communicator
    /// error: its kernel may wait for a peer forever) or timed out (that Work fails with the timeout). What a
    /// shutdown does before it finalizes: a finalize waits for every op without a bound.
    pub(crate) fn drain_in_flight(&self) -> Option<Error> {
        let never = AtomicBool::new(false);
        let ended = |work: &Arc<WorkState<B>>| work.captured || work.end_event.query().unwrap_or(false);
        let mut running: Vec<_> = self.in_flight.snapshot().into_iter().filter(|work| !ended(work)).collect();
        while !running.is_empty() {
            let failed = running.iter().find(|work| work.is_completed() || work.check_timeout(work.timeout));
            if let Some(work) = failed {
                return work.exception();
            }
            self.device.sleep(self.options.blocking_wait_poll, &never);
            running.retain(|work| !ended(work));
        }
        None
    }

    /// Aborts every communicator of the group (their Works are not settled: see
    /// [`Shared::abort_all_and_settle`]).
    pub(crate) fn abort_comms(&self, reason: &str) {
        for comm in self.all_comms() {
            if let Err(error) = comm.abort(reason) {
                tracing::warn!(target: "pg", pg_id = self.local_id, %error, "aborting a communicator failed");
            }
        }
    }

    /// The timeout of a new op or communicator: the one set with [`Shared::set_timeout`], else the group's.
    pub(crate) fn timeout(&self) -> Duration {
        match self.timeout_override.load(Ordering::Relaxed) {
            u64::MAX => self.options.timeout,
            nanos => Duration::from_nanos(nanos),
        }
    }

    /// Overrides the group's timeout for the ops and communicators made from now on.
    pub(crate) fn set_timeout(&self, timeout: Duration) {
        // A timeout of 584 years or more is kept as the largest one that fits.
        let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX - 1).min(u64::MAX - 1);
        self.timeout_override.store(nanos, Ordering::Relaxed);
    }

    /// Hands a new Work to the group's bookkeeping (in-flight list and flight recorder) through the lock-free
    /// intake, waking the watchdog when it idles or when the intake fills.
    pub(crate) fn track(&self, work: &Arc<WorkState<B>>) {
        if !self.options.enable_watchdog {
            self.in_flight.push(work);
            return;
        }
        match self.in_flight.push(work) {
            // The intake filled to its mark: the Works already finished are retired here, on the thread whose cache
            // holds them, unless a watchdog pass is under way (or desync debugging writes trace keys to the store:
            // the watchdog's job); the watchdog is woken for the rest.
            Pushed::Wake => {
                if self.options.desync_debug || !self.retire_finished() {
                    self.signals.wake(&self.device);
                }
            }
            Pushed::Queued => self.signals.wake_if_idle(&self.device),
        }
    }

    /// Retires, on the calling (enqueuing) thread, the Works on the list seen finished without an error, as a
    /// watchdog pass would (stash released, recorder entries retired, the last completed sequence noted), and pools
    /// them; `false` when a watchdog pass is under way (it retires them itself).
    fn retire_finished(&self) -> bool {
        let Some(_one_pass) = try_lock(&self.passes) else { return false };
        // Their stash released and recorder entries retired already, under the list's lock.
        let finished = self.in_flight.take_finished();
        let newest = finished.iter().filter(|work| !work.op.is_p2p()).max_by_key(|work| work.seq);
        if let Some(work) = newest {
            let _ = self.errors.note_completed(work.seq, work.op, work.start_event.is_some());
        }
        self.reuse.put(finished);
        true
    }

    /// Records a captured Work in the flight recorder, marked captured and with no event to query (its events
    /// belong to the capture); it joins no in-flight list, so the watchdog neither times nor queries it.
    pub(crate) fn record_captured(&self, work: &Arc<WorkState<B>>) {
        // After the Works enqueued before it, so that the recorder keeps the enqueue order.
        self.in_flight.settle();
        if let Some(id) = self.recorder.record(new_entry(work, true)) {
            work.fr_id.store(id, Ordering::Relaxed);
        }
    }

    /// Sets `error` on every in-flight Work and stops tracking them (abort and tear down).
    pub(crate) fn fail_in_flight(&self, error: &Error) {
        self.in_flight.set_exception_all(error);
        self.retire_in_flight();
    }

    /// Stops tracking every in-flight Work (the group stops) and lets the pooled ones go.
    pub(crate) fn retire_in_flight(&self) {
        // Pooled Works hold the group's communicators: a stopping group lets them go.
        self.reuse.clear();
        // Their recorder entries retired in their last state as they leave.
        drop(self.in_flight.take_all());
    }

    /// The status as it is now (without the aborted-communicator count, which needs the cache).
    pub(crate) fn status(&self) -> GroupStatus {
        let mut status = self.errors.snapshot();
        (status.last_enqueued_seq, status.last_enqueued_op) = self.in_flight.last_enqueued().unzip();
        status.in_flight = self.in_flight.len();
        status.watchdog_passes = self.threads.heartbeat.load(Ordering::Relaxed);
        status
    }

    /// Runs a store operation for the watchdog unless the group is stopping; marked as under way meanwhile.
    ///
    /// It is marked before the stop flag is read, so a stopping group (which sets the flag, then looks for an
    /// operation under way) either finds it under way and waits for it, or it sees the flag and does not start:
    /// never a store operation that starts while the group joins the thread (a blocking join, which on the mock
    /// keeps virtual time from reaching the operation's turn).
    pub(crate) fn store_op<R>(&self, op: impl FnOnce(&dyn Store) -> R) -> Option<R> {
        self.store_link.run(|| (!self.signals.terminate.load(Ordering::SeqCst)).then(|| op(self.store.as_ref())))
    }

    /// Stops the group's threads (see [`Threads::stop`]).
    pub(crate) fn stop_threads(&self) {
        self.threads.stop(&self.signals, &self.store_link, &self.device);
    }

    /// Writes this rank's trace file, for a traced group (a failure is logged: shutdown and drop go on).
    pub(crate) fn flush_trace_logged(&self) {
        if let Some(Err(error)) = self.tracer.as_ref().map(Tracer::flush) {
            tracing::warn!(target: "pg", pg_id = self.local_id, rank = self.rank, %error, "writing the trace failed");
        }
    }
}

impl<B: Backend> Drop for Shared<B> {
    fn drop(&mut self) {
        let shut_down = self.state() == GroupState::ShutDown;
        // A group dropped without shutdown() aborts the communicators it still holds live, as PyTorch's
        // destructor does: an op of the group still waiting for a peer ends instead of holding its stream.
        if !shut_down && self.all_comms().iter().any(|comm| !comm.is_aborted()) {
            tracing::warn!(
                target: "pg",
                pg_id = self.local_id,
                rank = self.rank,
                "process group dropped without shutdown(); aborting its communicators"
            );
            // The Works a caller still holds fail unless their op had finished: the abort drains the rest.
            let reason = "the process group was dropped without shutdown()";
            self.abort_all_and_settle(reason, &Error::Aborted { reason: format!("rank {}: {reason}", self.rank) });
        }
        self.stop_threads();
        // A traced group's trace is written as its tracer is dropped, with this group's log rendered once.
    }
}
