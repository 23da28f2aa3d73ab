//! What a group does once its watchdog or heartbeat monitor found an error: the sticky error state, the desync
//! report, signals to the peers through the store, the flight-recorder dump, the device's failure record, and
//! the error-handling mode.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::cache::{CommOwner, CommShared};
use crate::desync::DesyncReport;
use crate::flight_recorder::{dump_path, write_dump, DumpHeader};
use crate::lifecycle::GroupState;
use crate::shared::Shared;
use crate::signals::{remote_error_key, EXCEPTION_DUMP_KEY};
use crate::work::WorkState;
use crate::{Backend, Communicator, Device, Error, ErrorKind, Result};

/// Handles an error the watchdog or the heartbeat monitor found: sticky state, desync report, signals to the
/// peers, flight-recorder dump, then the error-handling mode.
pub(crate) fn on_error<B: Backend>(
    group: &Shared<B>,
    error: Error,
    timed_out: Option<&WorkState<B>>,
    comm: Option<&Arc<B::Communicator>>,
) {
    handle(group, error, timed_out, comm, RevokeComms::Now);
}

/// Who revokes the communicators of a group that revokes on error.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RevokeComms {
    /// The thread that found the error (the watchdog, the heartbeat monitor).
    Now,
    /// The group's watchdog, woken for it: the error was found by a caller waiting on a Work, which gets it as soon
    /// as the group is revoked (its Works failed, its later calls refused), without waiting for the backend's
    /// revoke, which may take long (NCCL's waits for its proxy thread, whose poll sleeps up to 500 ms).
    ByWatchdog,
}

fn handle<B: Backend>(
    group: &Shared<B>,
    error: Error,
    timed_out: Option<&WorkState<B>>,
    comm: Option<&Arc<B::Communicator>>,
    revoke_comms: RevokeComms,
) {
    if matches!(group.state(), GroupState::ShutDown | GroupState::Aborted) {
        let aborted = group.state();
        // The group's user aborted it or shut it down: its communicators are going, and what its threads see
        // meanwhile (its own aborted ops, its peers' reports of losing it) is no failure to act on: such a rank must
        // not report errors, check in to the survivors' agreement or revoke as if it were a live one.
        tracing::debug!(target: "pg", pg_id = group.local_id, rank = group.rank, %error, %aborted, "ignored: the group was aborted");
        return;
    }
    // A dead peer (known from the store, maybe before the communicator reports its closed connections) leaves the
    // communicators that were connected to it unshrinkable too: the shrink then takes the rendezvous path.
    if matches!(error.kind(), ErrorKind::Communicator | ErrorKind::RankDead) {
        group.lifecycle.note_comm_failed();
    }
    let options = &group.options;
    let first = record_first_error(group, &error);
    if let (Some(work), true) = (timed_out, options.desync_debug) {
        match group.store_op(|store| DesyncReport::retrieve(store, group.rank, group.size, work.seq, work.op)) {
            None => {}
            Some(Ok(report)) => {
                tracing::error!(target: "pg", pg_id = group.local_id, rank = group.rank, "{report}");
                group.errors.set_desync_report(report);
            }
            Some(Err(error)) => tracing::warn!(target: "pg", %error, "could not read the desync report from the store"),
        }
    }
    if first && !group.store_link.broken.load(Ordering::Relaxed) {
        let rank = i32::try_from(group.rank).unwrap_or(i32::MAX).to_ne_bytes();
        // A peer's report or death is known to every rank already: only this rank's own failure is signalled.
        if options.signals_peers() && !matches!(error.kind(), ErrorKind::Remote | ErrorKind::RankDead) {
            signal(group, &remote_error_key(&options.group_name), &rank);
        }
        if options.dump_on_timeout {
            signal(group, EXCEPTION_DUMP_KEY, &rank);
        }
    }
    if first && options.dump_on_timeout {
        dump_once(group);
    }
    if options.revoke_on_error {
        // The rank checks in to the agreement now, whether it found the failure itself or was told by a peer's
        // report: its revoke may wait on a dead peer's connections, and its caller may be busy elsewhere until
        // after the others' window.
        check_in_early(group);
        tracing::debug!(target: "pg", pg_id = group.local_id, rank = group.rank, "revoke: checked in to the agreement");
        // The group is left for the survivors' agreement and a shrink: nothing of it runs on, no host blocks, and
        // the device stays usable for the group that follows (it is not poisoned).
        let reason = format!("rank {}: revoked after a failure: {error}", group.rank);
        if let Some(work) = timed_out {
            work.set_exception(error.clone());
        }
        let revoked = Error::Revoked { reason };
        match revoke_comms {
            RevokeComms::Now => group.revoke(&revoked),
            RevokeComms::ByWatchdog => {
                // The watchdog's next pass finds the failed Work and revokes the communicators.
                group.mark_revoked(&revoked);
                group.signals.wake(&group.device);
            }
        }
        return;
    }
    let mode = options.error_handling;
    if options.end_process_on_error && mode.should_tear_down() {
        // As PyTorch: nothing of the failed group runs on, so no thread gets to see or use its data.
        end_process(group.rank, &error);
    }
    // The failure is made visible before any data can be read: the group is torn down and the device poisoned
    // first, then the streams blocked behind the failed op are drained by the aborts (a read they wake fails).
    if mode.should_tear_down() {
        group.fail(error.clone());
    }
    poison_device(&group.device, &error);
    if mode.aborts_communicators() {
        // The in-flight Works fail with the error that makes their communicators go, not with a bare abort.
        group.in_flight.set_exception_all(&error);
        let reason = format!("rank {}: {error}", group.rank);
        if let Some(comm) = comm {
            if let Err(abort_error) = comm.abort(&reason) {
                tracing::warn!(target: "pg", %abort_error, "aborting the failed communicator failed");
            }
        }
        group.abort_comms(&reason);
    }
    if mode.should_tear_down() {
        group.fail_in_flight(&error);
    }
}

/// Records `error` as the group's sticky error unless one is there; returns whether it was the first.
pub(crate) fn record_first_error<B: Backend>(group: &Shared<B>, error: &Error) -> bool {
    group.errors.record_first(error, group.device.now())
}

/// Records `error` in the device's failure record and wakes host threads blocked on the device.
pub(crate) fn poison_device<D: Device>(device: &D, error: &Error) {
    if device.poison().set(error) {
        tracing::error!(target: "pg", %error, "reads and synchronisations on {} now fail with this error", device.describe());
    }
    device.notify_host_threads();
}

/// Ends the process as PyTorch does after a fatal error of a process group (`Options::end_process_on_error`).
pub(crate) fn end_process(rank: usize, error: &Error) -> ! {
    tracing::error!(target: "pg", rank, %error, "to avoid data inconsistency, the process is ended (end_process_on_error)");
    eprintln!("pg: rank {rank}: {error}; to avoid data inconsistency, ending the process (end_process_on_error)");
    std::process::abort()
}

/// Writes `value` under `key` for the peers; the first store failure stops all signalling.
fn signal<B: Backend>(group: &Shared<B>, key: &str, value: &[u8]) {
    if let Some(Err(error)) = group.store_op(|store| store.set(key, value)) {
        tracing::warn!(target: "pg", pg_id = group.local_id, key, %error, "could not signal the peers");
        group.store_link.broken.store(true, Ordering::Relaxed);
    }
}

/// Dumps the flight recorder to this rank's file unless this group already did.
pub(crate) fn dump_once<B: Backend>(group: &Shared<B>) {
    if group.errors.mark_dumped() {
        if let Err(error) = dump(group) {
            tracing::error!(target: "pg", %error, "flight recorder dump failed");
        }
    }
}

/// The flight recorder of `group` as JSON.
pub(crate) fn dump_json<B: Backend>(group: &Shared<B>) -> crate::json::Value {
    // Every Work enqueued so far, recorded: the recorder takes new Works in from the in-flight list's intake.
    group.in_flight.settle();
    let status = group.status();
    let options = &group.options;
    let versions = group.device.versions();
    let comm_lib_version = versions
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("nccl"))
        .map_or_else(|| B::NAME.to_owned(), |(_, version)| version.clone());
    group.in_flight.dump(&DumpHeader {
        pg_id: group.local_id,
        name: options.group_name.clone(),
        desc: options.group_desc.clone(),
        rank: group.rank,
        size: group.size,
        comm_lib_version,
        last_enqueued: status.last_enqueued_seq,
        last_started: status.last_started_seq,
        last_completed: status.last_completed_seq,
    })
}

/// Writes the flight recorder to `{dump_path_prefix}{rank}` and returns the path.
pub(crate) fn dump<B: Backend>(group: &Shared<B>) -> Result<std::path::PathBuf> {
    let path = dump_path(&group.options.dump_path_prefix, group.rank);
    write_dump(&path, &dump_json(group))?;
    group.errors.count_dump();
    tracing::info!(target: "pg", pg_id = group.local_id, rank = group.rank, path = %path.display(), "flight recorder dumped");
    Ok(path)
}

/// The store key of `rank`'s `what` (`alive`, `dead`) in agreement round `round`.
pub(crate) fn round_key(round: u64, what: &str, rank: usize) -> String {
    format!("recovery.{round}/{what}/{rank}")
}

/// Checks this rank in to the group's next agreement as soon as its revoking watchdog learned of the failure, before
/// the revoke itself (which may wait on a dead peer's connections) and before the caller gets to
/// [`crate::ProcessGroup::agree_survivors`]: ranks learn of a failure at different times (a dead rank's neighbours from
/// its sockets, the others through the store), and a live rank must not miss the others' window for being late.
pub(crate) fn check_in_early<B: Backend>(group: &crate::shared::Shared<B>) {
    let round = group.rounds.coming_agreement();
    let key = round_key(round, "alive", group.rank);
    if let Some(Err(error)) = group.store_op(|store| store.set(&key, b"1")) {
        tracing::warn!(target: "pg", pg_id = group.local_id, %error, "could not check in to the agreement early");
    }
}

/// A communicator's abort after an op on it failed under a caller (a Work's `wait` saw the error first).
impl<B: Backend> CommOwner<B> for Shared<B> {
    fn abort_comm(&self, entry: &CommShared<B>, error: &Error) {
        // A group that revokes on error is revoked here (its Works fail, its later calls are refused, the rank checks
        // in to the agreement) and its running watchdog revokes the communicators: the caller gets its error at
        // once and goes on to the agreement while the backend's revoke runs.
        let watched = self.options.enable_watchdog && !self.signals.terminate.load(Ordering::SeqCst);
        if self.options.revoke_on_error && watched {
            handle(self, error.clone(), None, None, RevokeComms::ByWatchdog);
            return;
        }
        let on = |work: &WorkState<B>| std::ptr::eq(Arc::as_ptr(&work.entry), entry);
        let finished = self.in_flight.finished(on);
        let drained = Error::Aborted {
            reason: format!(
                "rank {}: the communicator was aborted after an op on it failed ({error}) before this op had run",
                self.rank
            ),
        };
        // Failed before the abort, so that nothing woken by the draining stream sees a passed end event alone.
        self.in_flight.fail_unfinished(on, &finished, &drained);
        if let Err(abort_error) = entry.comm.abort(&error.to_string()) {
            tracing::warn!(target: "pg", pg_id = self.local_id, %abort_error, "aborting a communicator failed");
        }
    }
}
