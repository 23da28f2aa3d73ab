//! Failure and recovery: a rank killed mid-op, the survivors' revoke, their agreement on who is left, the shrink,
//! the grow that brings a replacement in, and every misuse of a revoked, superseded or growing group refused by
//! name; and liveness from the store: a dead rank known to every survivor at once, the agreement that waits for no
//! dead rank, a slow rank never declared dead, and a store that dies with its host; the cases with a dead rank run
//! with and without liveness.

use std::sync::Arc;
use std::time::Duration;

use pg_core::store::{PrefixStore, Store};
use pg_core::{
    AgreeOptions, Backend, DeviceMesh, ErrorKind, GroupState, GrowOptions, Options, OptionsBuilder, ProcessGroup,
    ReduceOp, ShrinkMode, ShrinkOptions,
};

use super::{all_equal, at_once, case, clock_of, communicator, need, needs_faults, on_each_rank, triangle};
use crate::case::{Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Clock, Fault, Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(a_rank_killed_mid_all_reduce_is_survived_by_revoke_agree_and_shrink, 2),
        case!(a_rank_killed_mid_all_reduce_is_survived_with_liveness, 2),
        case!(a_dead_rank_is_known_to_every_survivor_at_once_and_the_agreement_waits_for_no_window, 2),
        case!(without_the_heartbeat_monitor_the_watchdog_reads_dead_ranks_as_soon, 2),
        case!(a_slow_rank_is_never_declared_dead, 2),
        case!(a_store_that_dies_with_its_host_is_a_clear_error, 2),
        case!(a_communicator_error_revokes_the_group_with_revoke_on_error, 2),
        case!(a_communicator_error_revokes_the_group_with_liveness, 2),
        case!(a_wait_that_finds_its_communicators_error_returns_without_the_backends_teardown, 2),
        case!(survivors_agree_on_one_list_and_a_late_or_reported_rank_is_excluded, 2),
        case!(a_group_shrinks_twice_and_maps_its_ranks_to_the_world, 3),
        case!(a_mesh_is_rebuilt_over_the_shrunk_world_or_refused_by_name, 4),
        case!(misuse_of_a_revoked_or_shrunk_group_is_refused_by_name, 2),
        case!(a_lost_rank_is_replaced_by_a_new_process_and_the_shrunk_group_grows_back, 2),
        case!(a_lost_rank_is_replaced_with_liveness, 2),
        case!(grow_of_no_ranks_or_of_a_busy_revoked_or_shut_down_group_is_refused_by_name, 1),
        case!(ranks_that_ask_for_different_sizes_fail_by_name_then_grow, 2),
        case!(a_failed_shrink_with_abort_leaves_the_group_revoked_and_shrinkable_again, 2),
        case!(sibling_subgroups_that_grow_into_the_same_new_rank_at_once_both_grow, 6),
    ]
}

/// How long a new rank waits for the grow that needs it (the survivors first detect, agree and shrink).
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// The timeout of the ops in these cases: a dead peer shows as a Work timeout after it.
const OP_TIMEOUT: Duration = Duration::from_secs(2);

/// How long survivors wait for each other to check in.
const AGREE_TIMEOUT: Duration = Duration::from_secs(1);

/// The bound on a shrink that waits for a late survivor (and the shrunk group's timeout).
const SHRINK_TIMEOUT: Duration = Duration::from_secs(20);

/// Options of a group that revokes itself when a peer fails, with a watchdog quick enough for short timeouts.
fn revoking() -> OptionsBuilder {
    Options::builder()
        .timeout(OP_TIMEOUT)
        .revoke_on_error(true)
        .dump_on_timeout(false)
        .watchdog_period(Duration::from_millis(10))
}

/// Waits (in host time) until `group` is revoked, at most `limit`; the host time it took.
fn until_revoked<B: pg_core::Backend>(r: &Rank<B>, group: &ProcessGroup<B>, limit: Duration) -> Check<Duration> {
    let (revoked, took) = r.host_time(|| {
        let start = now(r);
        while !group.is_revoked() && now(r) - start < limit {
            r.host_sleep(Duration::from_millis(10));
        }
        group.is_revoked()
    });
    ensure!(revoked, "rank {}: the group was not revoked within {limit:?}", r.rank);
    Ok(took)
}

/// A rank is killed mid-all_reduce: on the mock a killed thread whose ring neighbours see its connections close, on
/// NCCL a rank whose communicator is aborted in place of the op. A blocking wait on the dying op fails typed within
/// the op's timeout (the neighbours' with the remote error, at once, and their wait revokes the group; the
/// others' revoked by a neighbour's report); the watchdog revokes; the op queued behind fails (`Revoked`, or
/// `Aborted` unrun); every later op is `Revoked`; the device is still readable. The survivors, one of them late,
/// agree on every rank but the dead one and shrink (by one path, whichever communicators were aborted); their next
/// ops give the survivors' sums, with no hang, at worlds 2 to 8.
fn a_rank_killed_mid_all_reduce_is_survived_by_revoke_agree_and_shrink<H: Harness>(h: &H) -> Check<Outcome> {
    killed_mid_all_reduce(h, false)
}

/// The same with [`Options::liveness`]: where the kill closes the rank's store connections (the mock) every survivor
/// also learns of it from the store; the recovery is the same.
fn a_rank_killed_mid_all_reduce_is_survived_with_liveness<H: Harness>(h: &H) -> Check<Outcome> {
    killed_mid_all_reduce(h, true)
}

fn killed_mid_all_reduce<H: Harness>(h: &H, liveness: bool) -> Check<Outcome> {
    need!(needs_faults(h));
    let clock = need!(clock_of(h));
    let n = h.world_size();
    let victim = 1;
    let late = if n > 2 { n - 1 } else { 0 };
    on_each_rank(h, n, |r| {
        // Op 0 of the communicator is ready_group's barrier; op 1 is the all_reduce the victim dies in.
        if !r.caps.inject(Fault::KillAt { rank: victim, op: 1 }) {
            return Err("the fault was refused".into());
        }
        let group = r.ready_group("0", revoking().liveness(liveness))?;
        let dying = r.filled((r.rank + 1) as f64, 256)?;
        let work = group.all_reduce(&dying, ReduceOp::Sum).ctx("the all_reduce the victim dies in")?;
        if r.rank == victim {
            // A killed process does nothing more, and nothing of it lives on: its group's threads (its watchdog
            // would check it in to the survivors' agreement) stop with it.
            group.abort("the process was killed");
            return Ok(());
        }
        let behind = r.filled(1.0, 16)?;
        let queued = group.all_reduce(&behind, ReduceOp::Sum).ctx("an all_reduce queued behind it")?;
        // A blocking wait on the op the victim died in returns its error: at once on the victim's ring neighbours,
        // whose connections to it closed (NCCL's remote error; such a wait revokes the group, and the watchdog then
        // revokes the communicator it failed on), at
        // the next watchdog pass on the others, revoked by a neighbour's report through the store (a revoking
        // group tells its peers), and at the op's timeout at the latest.
        let (waited, took) = r.host_time(|| work.wait_timeout(OP_TIMEOUT + Duration::from_secs(1)));
        let first = waited.err().ok_or("the wait on the op the victim died in succeeded")?;
        ensure!(took <= OP_TIMEOUT + Duration::from_millis(500), "the wait returned after {took:?}");
        ensure!(
            matches!(
                first.kind(),
                ErrorKind::WorkTimeout | ErrorKind::Revoked | ErrorKind::Communicator | ErrorKind::Remote
            ),
            "the dying op's error: {first}"
        );
        until_revoked(r, &group, OP_TIMEOUT + Duration::from_secs(1))?;
        // Nothing of the group runs any more, and no host blocks: the op behind fails typed (revoked, or aborted
        // unrun where the failed wait aborted its communicator), and so does every later call.
        let second = queued.exception().ok_or("the op queued behind it reports no error")?;
        ensure!(matches!(second.kind(), ErrorKind::Revoked | ErrorKind::Aborted), "the queued op's error: {second}");
        let later = group.all_reduce(&behind, ReduceOp::Sum).err().ok_or("an op of the revoked group was accepted")?;
        ensure_eq!(later.kind(), ErrorKind::Revoked, "a later op's error ({later})");
        // The device is not poisoned: the rank can read its memory (the failed op's output is whatever was there).
        r.read(&dying).ctx("reading after the revoke")?;

        // One survivor comes to the agreement after the others' window has closed: its watchdog checked it in when
        // it found the failure, so it is on the list all the same.
        if r.rank == late {
            r.host_sleep(AGREE_TIMEOUT * 2);
        }
        let (survivors, agreed) =
            r.host_time(|| group.agree_survivors(&AgreeOptions { timeout: AGREE_TIMEOUT, ..AgreeOptions::default() }));
        let survivors = survivors.ctx("agree_survivors")?;
        let others: Vec<usize> = (0..n).filter(|&rank| rank != victim).collect();
        ensure_eq!(survivors.ranks, others, "the survivors");
        ensure_eq!(survivors.excluded, vec![victim], "the excluded ranks");
        ensure!(agreed <= AGREE_TIMEOUT + at_once(clock), "the agreement took {agreed:?}");

        // The others wait in the shrink for the late survivor (the shrink's own timeout is well past its lateness).
        let options = ShrinkOptions { timeout: Some(SHRINK_TIMEOUT), ..ShrinkOptions::default() };
        let (shrunk, shrinking) = r.host_time(|| group.shrink(&survivors.excluded, &options));
        let shrunk = shrunk.ctx("shrink")?;
        let bound =
            AGREE_TIMEOUT * 2 + if clock == Clock::Virtual { Duration::from_secs(1) } else { SHRINK_TIMEOUT / 2 };
        ensure!(shrinking < bound, "the shrink took {shrinking:?}");
        ensure_eq!(shrunk.size(), n - 1, "the shrunk group's size");
        ensure_eq!(Some(shrunk.rank()), survivors.new_rank(r.rank), "this rank in the shrunk group");
        ensure_eq!(shrunk.global_ranks(), others, "the shrunk group's world ranks");
        ensure_eq!(shrunk.group_rank(victim), None, "the victim's rank in the shrunk group");
        // The survivors' next ops are right, twice over.
        for round in 0..2 {
            let buffer = r.filled((r.rank + 1) as f64, 256)?;
            shrunk.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the shrunk group")?;
            all_equal(&r.read(&buffer)?, triangle(n) - (victim + 1) as f64)
                .map_err(|e| format!("round {round}: {e}"))?;
        }
        ensure!(group.is_revoked(), "the parent is still revoked");
        shrunk.barrier_sync().ctx("barrier")?;
        shrunk.shutdown().ctx("shutdown of the shrunk group")
    })
}

/// In a group that revokes on error, a blocking wait that finds its communicator's error itself (a ring neighbour of
/// a killed rank) returns as soon as the group is revoked: its error, the group refusing ops and the rank checked in
/// to the agreement, without waiting for the backend to tear the communicator down (NCCL's abort and revoke hold
/// their caller up to half a second over sockets); the watchdog revokes the communicator meanwhile, and the
/// survivors agree and shrink as usual.
fn a_wait_that_finds_its_communicators_error_returns_without_the_backends_teardown<H: Harness>(
    h: &H,
) -> Check<Outcome> {
    need!(needs_faults(h));
    need!(clock_of(h));
    if !h.offers().slow_teardown {
        return Ok(Outcome::NotApplicable("the harness cannot make the backend's teardown slow".into()));
    }
    const TEARDOWN: Duration = Duration::from_secs(5);
    let n = h.world_size();
    let victim = 1;
    let neighbour = |rank: usize| rank == (victim + 1) % n || rank == (victim + n - 1) % n;
    on_each_rank(h, n, |r| {
        let faults = [Fault::KillAt { rank: victim, op: 1 }, Fault::SlowTeardown { rank: r.rank, duration: TEARDOWN }];
        if !faults.into_iter().all(|fault| r.caps.inject(fault)) {
            return Err("the fault was refused".into());
        }
        // A watchdog that passes seldom: the waiting thread is the one that finds the communicator's error.
        let group = r.ready_group("0", revoking().watchdog_period(Duration::from_secs(60)))?;
        let dying = r.filled((r.rank + 1) as f64, 256)?;
        let work = group.all_reduce(&dying, ReduceOp::Sum).ctx("the all_reduce the victim dies in")?;
        if r.rank == victim {
            group.abort("the process was killed");
            return Ok(());
        }
        let (waited, took) = r.host_time(|| work.wait_timeout(OP_TIMEOUT + Duration::from_secs(1)));
        let error = waited.err().ok_or("the wait on the op the victim died in succeeded")?;
        if neighbour(r.rank) {
            ensure!(matches!(error.kind(), ErrorKind::Communicator | ErrorKind::Remote), "a neighbour's wait: {error}");
            ensure!(took < TEARDOWN / 2, "the wait returned after {took:?}: it waited for the communicator's teardown");
            ensure!(group.is_revoked(), "the group was not revoked when the wait returned");
        }
        until_revoked(r, &group, OP_TIMEOUT + TEARDOWN)?;
        let later = group.all_reduce(&dying, ReduceOp::Sum).err().ok_or("an op of the revoked group was accepted")?;
        ensure_eq!(later.kind(), ErrorKind::Revoked, "a later op's error ({later})");
        // The ranks further round the ring learn of the death only at their wait's timeout: the agreement waits
        // for them (the victim reported dead).
        let agree = AgreeOptions { timeout: OP_TIMEOUT + TEARDOWN, dead: vec![victim], ..AgreeOptions::default() };
        let survivors = group.agree_survivors(&agree).ctx("agree_survivors")?;
        let others: Vec<usize> = (0..n).filter(|&rank| rank != victim).collect();
        ensure_eq!(survivors.ranks, others, "the survivors");
        let options = ShrinkOptions { timeout: Some(SHRINK_TIMEOUT), ..ShrinkOptions::default() };
        let shrunk = group.shrink(&survivors.excluded, &options).ctx("shrink")?;
        let buffer = r.filled((r.rank + 1) as f64, 256)?;
        shrunk.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the shrunk group")?;
        all_equal(&r.read(&buffer)?, triangle(n) - (victim + 1) as f64)?;
        shrunk.shutdown().ctx("shutdown of the shrunk group")
    })
}

/// How soon every survivor must know of a dead rank with liveness: the store's publication and a watchdog pass.
const LIVENESS_DETECTION: Duration = Duration::from_millis(100);

/// Options of a revoking group with liveness whose ops would otherwise wait long for a dead peer: nothing but the
/// store can tell the survivors quickly.
fn live() -> OptionsBuilder {
    revoking().liveness(true).timeout(LONG_OP_TIMEOUT)
}

/// Whether the harness kills a rank's whole process (its store connections with it).
fn needs_process_kills<H: Harness>(h: &H) -> Result<(), Outcome> {
    match h.offers().process_kills {
        true => Ok(()),
        false => Err(Outcome::NotApplicable("the harness cannot kill a rank's process whole".into())),
    }
}

/// An op timeout far above the liveness bound, so that a case passing within it cannot have timed out.
const LONG_OP_TIMEOUT: Duration = Duration::from_secs(30);

/// A 1-rank group of `r`'s own, in which it runs ops alone (its death there is seen by no communicator of its
/// peers: only the store can tell them).
fn alone<B: Backend>(r: &Rank<B>) -> Check<ProcessGroup<B>> {
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(format!("alone.{}/", r.rank), Arc::clone(&r.store)));
    let options = Options::builder().dump_on_timeout(false).group_name(format!("alone.{}", r.rank)).build();
    Ok(r.keep(ProcessGroup::new(store, 0, 1, r.device.clone(), options).ctx("a group of one")?))
}

fn a_dead_rank_is_known_to_every_survivor_at_once_and_the_agreement_waits_for_no_window<H: Harness>(
    h: &H,
) -> Check<Outcome> {
    // The heartbeat monitor reads the store for deaths (it makes no device call).
    dead_rank_known_at_once(h, live)
}

/// With monitoring off, the watchdog reads the store for deaths itself, as soon.
fn without_the_heartbeat_monitor_the_watchdog_reads_dead_ranks_as_soon<H: Harness>(h: &H) -> Check<Outcome> {
    dead_rank_known_at_once(h, || live().enable_monitoring(false))
}

/// A rank killed outside its peers' ops is known dead to every survivor within [`LIVENESS_DETECTION`], with the
/// group's `options`, and the agreement waits for no window.
fn dead_rank_known_at_once<H: Harness>(h: &H, options: fn() -> OptionsBuilder) -> Check<Outcome> {
    need!(needs_process_kills(h));
    let clock = need!(clock_of(h));
    let n = h.world_size();
    let victim = n - 1;
    let agree_timeout = Duration::from_secs(5);
    on_each_rank(h, n, |r| {
        // The victim dies in its second op of a group of its own (op 0 of every communicator is the world group's
        // barrier or its own first op), while its peers wait for it in an all_reduce of the world group: no
        // communicator of theirs loses a connection.
        if !r.caps.inject(Fault::KillProcessAt { rank: victim, op: 1 }) {
            return Err("the fault was refused".into());
        }
        let group = r.ready_group("0", options())?;
        if r.rank == victim {
            let solo = alone(r)?;
            let ones = r.filled(1.0, 8)?;
            solo.all_reduce_sync(&ones, ReduceOp::Sum).ctx("the victim's first op alone")?;
            let _dies_in = solo.all_reduce(&ones, ReduceOp::Sum);
            group.abort("the process was killed");
            solo.abort("the process was killed");
            return Ok(());
        }
        let waiting = r.filled(1.0, 256)?;
        let work = group.all_reduce(&waiting, ReduceOp::Sum).ctx("the all_reduce the victim never joins")?;
        let (waited, took) = r.host_time(|| work.wait_timeout(LONG_OP_TIMEOUT));
        let error = waited.err().ok_or("the all_reduce without the victim succeeded")?;
        ensure!(took <= LIVENESS_DETECTION, "rank {}: the dead rank was known after {took:?}", r.rank);
        ensure!(group.is_revoked(), "the group was not revoked");
        let sticky = group.error().ok_or("the revoked group has no error")?.to_string();
        ensure!(
            sticky.contains(&format!("rank {victim} of group '0' is dead")),
            "the revoke does not name the dead rank: {sticky} (the op's error: {error})"
        );
        let status = group.status();
        ensure_eq!(status.error.map(|e| e.kind()), Some(ErrorKind::RankDead), "the watchdog's first error");
        ensure_eq!(status.error_type, pg_core::ErrorType::RemoteError, "the error type of a dead peer");
        // Every survivor checked in when it learned of the death and the victim is known dead: the agreement ends
        // at once instead of waiting out its window for the victim.
        let (survivors, agreed) =
            r.host_time(|| group.agree_survivors(&AgreeOptions { timeout: agree_timeout, ..AgreeOptions::default() }));
        let survivors = survivors.ctx("agree_survivors")?;
        ensure_eq!(survivors.excluded, vec![victim], "the excluded ranks");
        ensure!(
            agreed <= LIVENESS_DETECTION + at_once(clock),
            "the agreement took {agreed:?} (window {agree_timeout:?})"
        );
        let shrunk = group.shrink(&survivors.excluded, &ShrinkOptions::default()).ctx("shrink")?;
        let buffer = r.filled((r.rank + 1) as f64, 64)?;
        shrunk.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the shrunk group")?;
        all_equal(&r.read(&buffer)?, triangle(n) - (victim + 1) as f64)?;
        shrunk.barrier_sync().ctx("barrier")?;
        shrunk.shutdown().ctx("shutdown of the shrunk group")
    })
}

fn a_slow_rank_is_never_declared_dead<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let slow = n - 1;
    // Far longer than any liveness poll, and well within the op timeout.
    let pause = Duration::from_secs(3);
    on_each_rank(h, n, |r| {
        let group = r.ready_group("0", live())?;
        let buffer = r.filled((r.rank + 1) as f64, 64)?;
        if r.rank == slow {
            // A long kernel before its part of the op, then a host thread paused: alive all along.
            r.sleep_current(pause)?;
            r.host_sleep(pause);
        }
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("the all_reduce the slow rank is late to")?;
        all_equal(&r.read(&buffer)?, triangle(n))?;
        ensure!(!group.is_revoked(), "rank {}: the group was revoked while every rank was alive", r.rank);
        ensure!(group.error().is_none(), "rank {}: the group failed: {:?}", r.rank, group.error());
        // The agreement of live ranks, the slow one coming late, lists everyone.
        if r.rank == slow {
            r.host_sleep(pause / 3);
        }
        let survivors = group
            .agree_survivors(&AgreeOptions { timeout: pause, ..AgreeOptions::default() })
            .ctx("agree_survivors")?;
        ensure_eq!(survivors.ranks, (0..n).collect::<Vec<_>>(), "a live rank was left out");
        group.barrier_sync().ctx("barrier")
    })
}

fn a_store_that_dies_with_its_host_is_a_clear_error<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_process_kills(h));
    let n = h.world_size();
    let host = 0;
    on_each_rank(h, n, |r| {
        if !r.caps.inject(Fault::StoreHostedBy { rank: host })
            || !r.caps.inject(Fault::KillProcessAt { rank: host, op: 1 })
        {
            return Err("the fault was refused".into());
        }
        let group = r.ready_group("0", revoking().liveness(true))?;
        let buffer = r.filled(1.0, 64)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("the all_reduce the store's host dies in")?;
        if r.rank == host {
            group.abort("the process was killed");
            return Ok(());
        }
        // No death can be published by a store that is gone: the survivors learn of the failure from their
        // communicators or the op's timeout, and the group is revoked without hanging.
        let waited = work.wait_timeout(OP_TIMEOUT + Duration::from_secs(1));
        ensure!(waited.is_err(), "the all_reduce without the store's host succeeded");
        until_revoked(r, &group, OP_TIMEOUT + Duration::from_secs(1))?;
        let error = group
            .agree_survivors(&AgreeOptions { timeout: AGREE_TIMEOUT, ..AgreeOptions::default() })
            .err()
            .ok_or("the agreement succeeded without a store")?;
        ensure!(
            matches!(error, pg_core::Error::StoreLost { .. })
                && error.kind() == ErrorKind::StoreNetwork
                && error.to_string().contains("pgstore"),
            "the agreement's error does not say the store was lost: {error}"
        );
        Ok(())
    })
}

fn a_communicator_error_revokes_the_group_with_revoke_on_error<H: Harness>(h: &H) -> Check<Outcome> {
    communicator_error_revokes(h, false)
}

/// The same with [`Options::liveness`]: no rank dies, so nobody is declared dead and every rank is on the list.
fn a_communicator_error_revokes_the_group_with_liveness<H: Harness>(h: &H) -> Check<Outcome> {
    communicator_error_revokes(h, true)
}

fn communicator_error_revokes<H: Harness>(h: &H, liveness: bool) -> Check<Outcome> {
    need!(needs_faults(h));
    on_each_rank(h, h.world_size(), |r| {
        // Rank 0's communicator fails after the barrier and the first all_reduce.
        if r.rank == 0 && !r.caps.inject(Fault::AsyncError { rank: 0, after_ops: 2 }) {
            return Err("the fault was refused".into());
        }
        // The failing rank writes its `remote_error` key, so its peers revoke at their next watchdog pass instead of
        // at the op's timeout, and every rank comes to the agreement at about the same time.
        let group = r.ready_group("0", revoking().propagate_error(true).liveness(liveness))?;
        let buffer = r.filled(1.0, 8)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("the all_reduce before the error")?;
        if r.rank == 0 {
            // Rank 0 reads its result: by then its communicator reports the error.
            r.read(&buffer).ctx("reading the result before the error")?;
        }
        // The next all_reduce: the failed communicator takes no more work (NCCL refuses it; the group may have
        // revoked itself already) or takes it and never runs it; the others' part waits for rank 0 until revoked.
        let work = match group.all_reduce(&buffer, ReduceOp::Sum) {
            Err(error) if r.rank == 0 => {
                ensure!(
                    matches!(error.kind(), ErrorKind::Communicator | ErrorKind::Revoked),
                    "rank 0's all_reduce on its failed communicator: {error}"
                );
                None
            }
            work => Some(work.ctx("the all_reduce the error hits")?),
        };
        until_revoked(r, &group, OP_TIMEOUT + Duration::from_secs(1))?;
        if let Some(work) = work {
            let error = work.exception().ok_or("the op the error hit reports no error")?;
            ensure!(
                matches!(error.kind(), ErrorKind::Communicator | ErrorKind::Remote | ErrorKind::Revoked),
                "the op's error: {error}"
            );
        }
        let sticky = group.error().ok_or("the revoked group has no error")?;
        ensure_eq!(sticky.kind(), ErrorKind::Revoked, "the group's error ({sticky})");
        r.read(&buffer).ctx("the device is not poisoned by a revoke")?;
        let survivors = group.agree_survivors(&AgreeOptions { timeout: AGREE_TIMEOUT, ..AgreeOptions::default() });
        let survivors = survivors.ctx("agree_survivors")?;
        ensure_eq!(survivors.ranks, (0..r.size).collect::<Vec<_>>(), "every rank is alive and agreed");
        // A shrink that excludes nobody makes a working group of everyone, from the revoked one.
        // Kept until every rank is done with it: a rank that let go of it while its peer was still in its barrier
        // would close the connections under it.
        let again = r.keep(group.shrink(&[], &ShrinkOptions::default()).ctx("shrink excluding nobody")?);
        let ones = r.filled(1.0, 8)?;
        again.all_reduce_sync(&ones, ReduceOp::Sum).ctx("all_reduce on the new group")?;
        all_equal(&r.read(&ones)?, r.size as f64)?;
        again.barrier_sync().ctx("barrier")
    })
}

fn survivors_agree_on_one_list_and_a_late_or_reported_rank_is_excluded<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let late = n - 1;
    // Each rank's timeout runs from its own call and the first rank to time out decides: a rank that called later
    // sees the decision that much sooner. On a wall clock the ranks leave the store barrier below up to this far
    // apart; on a virtual clock, at once.
    let skew = match clock_of(h) {
        Ok(Clock::Wall) => AGREE_TIMEOUT / 4,
        _ => Duration::ZERO,
    };
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder())?;
        r.barrier("agree round 0")?;
        // Round 0: the last rank calls after everyone else's timeout: the others decide without it.
        if r.rank == late {
            r.host_sleep(AGREE_TIMEOUT * 3);
            let error = group.agree_survivors(&AgreeOptions { timeout: AGREE_TIMEOUT, ..AgreeOptions::default() });
            let error = error.err().ok_or("a rank that checked in after the decision was let in")?;
            ensure_eq!(error.kind(), ErrorKind::Excluded, "the late rank's error ({error})");
            ensure!(error.to_string().contains(&format!("rank {late}")), "the error names the rank: {error}");
        } else {
            let (agreed, took) = r.host_time(|| {
                group.agree_survivors(&AgreeOptions { timeout: AGREE_TIMEOUT, ..AgreeOptions::default() })
            });
            let agreed = agreed.ctx("agree_survivors")?;
            ensure_eq!(agreed.ranks, (0..late).collect::<Vec<_>>(), "round 0's survivors");
            ensure_eq!(agreed.round, 0, "the round");
            ensure!(took + skew >= AGREE_TIMEOUT, "decided after {took:?}, before the timeout ({skew:?} allowed)");
        }
        // Round 1: rank 0 reports rank 1 dead; nobody waits for it, and it is out even though it checks in.
        let options = AgreeOptions {
            timeout: Duration::from_secs(30),
            dead: if r.rank == 0 { vec![1] } else { Vec::new() },
            ..AgreeOptions::default()
        };
        if r.rank == 1 {
            r.host_sleep(Duration::from_millis(100));
        }
        let (agreed, took) = r.host_time(|| group.agree_survivors(&options));
        match (r.rank, agreed) {
            (1, Err(error)) => ensure_eq!(error.kind(), ErrorKind::Excluded, "the reported rank's error ({error})"),
            (1, Ok(list)) => return Err(format!("the rank reported dead was let in: {list:?}")),
            (_, agreed) => {
                let agreed = agreed.ctx("agree_survivors, round 1")?;
                let want: Vec<usize> = (0..n).filter(|&rank| rank != 1).collect();
                ensure_eq!(agreed.ranks, want, "round 1's survivors");
                // The last rank comes to round 1 late (it slept through round 0), but nobody waits out the 30 s
                // timeout for the rank reported dead.
                ensure!(took < Duration::from_secs(5), "round 1 waited {took:?} for a rank reported dead");
            }
        }
        // Bad input is refused by name.
        let error = group.agree_survivors(&AgreeOptions { dead: vec![n], ..AgreeOptions::default() }).err();
        ensure!(
            error
                .as_ref()
                .is_some_and(|e| e.kind() == ErrorKind::InvalidArgument && e.to_string().contains("dead rank")),
            "an out-of-range dead rank: {error:?}"
        );
        Ok(())
    })
}

/// The ranks that leave at each of two shrinks of a world of `n`: the last quarter (at least one) each time.
fn leaving(n: usize) -> usize {
    (n / 4).max(1)
}

fn a_group_shrinks_twice_and_maps_its_ranks_to_the_world<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let k = leaving(n);
    on_each_rank(h, n, |r| {
        let world = r.ready_group("0", Options::builder())?;
        let healthy = ShrinkOptions { mode: ShrinkMode::Default, ..ShrinkOptions::default() };
        // First shrink: the last k ranks leave (they do not call it).
        let first: Vec<usize> = (n - k..n).collect();
        // Every group is kept until every rank is done with it: a rank whose barrier on a group is over may drop the
        // group (an abort) while a peer still finishes that barrier over the same connections.
        let once = match r.rank < n - k {
            true => Some(r.keep(world.shrink(&first, &healthy).ctx("the first shrink")?)),
            false => None,
        };
        // Second shrink: the last k ranks of the shrunk group leave too (8 -> 6 -> 4 at world 8).
        let mut twice = None;
        if let Some(once) = &once {
            ensure_eq!(once.size(), n - k, "the first shrink's size");
            let second: Vec<usize> = (n - 2 * k..n - k).collect();
            if once.rank() < n - 2 * k {
                let group = r.keep(once.shrink(&second, &healthy).ctx("the second shrink")?);
                ensure_eq!(group.size(), n - 2 * k, "the second shrink's size");
                ensure_eq!(group.rank(), r.rank, "this rank in the twice-shrunk group");
                ensure_eq!(group.global_ranks(), (0..n - 2 * k).collect::<Vec<_>>(), "its world ranks");
                let buffer = r.filled((r.rank + 1) as f64, 64)?;
                group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the twice-shrunk group")?;
                all_equal(&r.read(&buffer)?, triangle(n - 2 * k))?;
                twice = Some(group);
            }
            let buffer = r.filled(1.0, 8)?;
            once.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the once-shrunk group")?;
            all_equal(&r.read(&buffer)?, (n - k) as f64)?;
        }
        // A shrink of a healthy group with ShrinkMode::Default leaves it usable by every rank.
        let buffer = r.filled(1.0, 8)?;
        world.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the world after the shrinks")?;
        all_equal(&r.read(&buffer)?, n as f64)?;
        for group in [twice, once].into_iter().flatten() {
            group.barrier_sync().ctx("barrier")?;
        }
        Ok(())
    })
}

/// Keeps every group of `mesh` until every rank is done with them ([`Rank::keep`]).
fn keep_mesh<B: Backend>(r: &Rank<B>, mesh: &DeviceMesh<B>) -> Check {
    for dim in 0..mesh.shape().len() {
        r.keep(mesh.group(dim).ctx("a group of the mesh")?.clone());
    }
    Ok(())
}

fn a_mesh_is_rebuilt_over_the_shrunk_world_or_refused_by_name<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    if n % 2 != 0 {
        return Ok(Outcome::NotApplicable(format!("a mesh with a dimension of 2 needs an even world, not {n}")));
    }
    on_each_rank(h, n, |r| {
        let world = r.ready_group("0", Options::builder())?;
        let mesh = DeviceMesh::new(&world, &[("dp", n / 2), ("tp", 2)], &Options::builder().build()).ctx("mesh")?;
        keep_mesh(r, &mesh)?;
        let healthy = ShrinkOptions { mode: ShrinkMode::Default, ..ShrinkOptions::default() };
        // The last two ranks (one dp index) leave: the mesh keeps tp = 2 and loses one dp index.
        let (first, second) = (caller_of(r.rank, &[n - 2, n - 1]), caller_of(r.rank, &[n - 1]));
        if let Some(excluded) = first {
            // Kept until every rank is done with them: a rank that let go of a group while its peers were still
            // in its barrier would close the connections under them.
            let shrunk = r.keep(world.shrink(&excluded, &healthy).ctx("shrink by two")?);
            let rebuilt = mesh.after_shrink(&shrunk, &Options::builder().build()).ctx("after_shrink")?;
            ensure_eq!(rebuilt.shape(), &[n / 2 - 1, 2][..], "the rebuilt mesh's shape");
            keep_mesh(r, &rebuilt)?;
            let tp = rebuilt.group_named("tp").ctx("tp group")?;
            let buffer = r.filled((r.rank + 1) as f64, 8)?;
            tp.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce over tp")?;
            let pair = r.rank - r.rank % 2;
            all_equal(&r.read(&buffer)?, (2 * pair + 3) as f64)?;
            shrunk.barrier_sync().ctx("barrier")?;
        }
        // One rank leaves: tp = 2 does not divide the n - 1 left, and the mesh refuses by name.
        if let Some(excluded) = second {
            let shrunk = r.keep(world.shrink(&excluded, &healthy).ctx("shrink by one")?);
            let refused = mesh.after_shrink(&shrunk, &Options::builder().build()).err();
            ensure!(
                refused
                    .as_ref()
                    .is_some_and(|e| e.kind() == ErrorKind::InvalidArgument && e.to_string().contains("'dp'")),
                "a mesh that cannot hold the survivors: {refused:?}"
            );
            shrunk.barrier_sync().ctx("barrier")?;
        }
        Ok(())
    })
}

/// Refused by name: a shrink excluding the caller, a rank out of range or twice; after a revoke an op, `new_group`
/// and `shutdown` (which would finalize: `Revoked`, naming the finalize); a second shrink of a parent already shrunk
/// with abort; an op of a live parent after its aborting shrink; on the backend's communicator, a finalize and an op
/// after `revoke`.
fn misuse_of_a_revoked_or_shrunk_group_is_refused_by_name<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        // Bad shrink arguments, before anything happens.
        let group = r.ready_group("0", Options::builder())?;
        let bad: [(Vec<usize>, &str); 4] = [
            (vec![r.rank], "own excluded list"),
            (vec![n], "out of range"),
            (vec![(r.rank + 1) % n, (r.rank + 1) % n], "listed twice"),
            ((0..n).filter(|&x| x != r.rank).chain([r.rank]).collect(), "own excluded list"),
        ];
        for (excluded, says) in bad {
            let error = group.shrink(&excluded, &ShrinkOptions::default()).err();
            ensure!(
                error.as_ref().is_some_and(|e| e.kind() == ErrorKind::InvalidArgument && e.to_string().contains(says)),
                "shrink excluding {excluded:?}: {error:?}"
            );
        }
        // A revoked group: ops, subgroups and shutdown (a finalize) are refused by name. A revoke tears the
        // communicator down on this rank at once: on NCCL's network transport a rank whose part of the ready
        // barrier is done may still have that barrier's last bytes to send, so no rank revokes before every rank
        // is past it.
        let buffer = r.filled(1.0, 8)?;
        r.barrier("past the ready barrier")?;
        group.revoke("the case revokes it");
        ensure!(group.is_revoked(), "is_revoked after revoke");
        let op = group.all_reduce(&buffer, ReduceOp::Sum).err();
        ensure!(op.as_ref().is_some_and(|e| e.kind() == ErrorKind::Revoked), "an op after revoke: {op:?}");
        let sub = group.new_group(&[0], Options::builder().build()).err();
        ensure!(
            sub.as_ref().is_some_and(|e| e.kind() == ErrorKind::Revoked && e.to_string().contains("new_group")),
            "new_group of a revoked group: {sub:?}"
        );
        // An aborting shrink of it supersedes it: a second shrink of the parent is refused; the child works.
        // The groups made here are kept until every rank is done with them (a rank that let go of one while its
        // peers were still in its barrier would close the connections under them).
        let child = r.keep(group.shrink(&[], &ShrinkOptions::default()).ctx("shrink of the revoked group")?);
        let again = group.shrink(&[], &ShrinkOptions::default()).err();
        ensure!(
            again.as_ref().is_some_and(|e| e.kind() == ErrorKind::Revoked && e.to_string().contains("already shrunk")),
            "a second shrink of a superseded parent: {again:?}"
        );
        child.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the child")?;
        all_equal(&r.read(&buffer)?, n as f64)?;
        // A live parent shrunk with abort is revoked by it (once every rank is past its all_reduce, as above).
        r.barrier("past the child's all_reduce")?;
        let parent = child;
        let grandchild =
            r.keep(parent.shrink(&[], &ShrinkOptions::default()).ctx("an aborting shrink of a live group")?);
        let op = parent.all_reduce(&buffer, ReduceOp::Sum).err();
        ensure!(op.as_ref().is_some_and(|e| e.kind() == ErrorKind::Revoked), "an op of a superseded parent: {op:?}");
        grandchild.barrier_sync().ctx("barrier on the grandchild")?;
        let shut = group.shutdown().err();
        ensure!(
            shut.as_ref().is_some_and(|e| e.kind() == ErrorKind::Revoked && e.to_string().contains("finalize")),
            "shutdown (finalize) of a revoked group: {shut:?}"
        );
        // The backend's rule under the group's: a revoked communicator refuses a finalize and every op.
        let comm = communicator(r, "raw_revoke")?;
        r.barrier("the raw communicator made")?;
        match pg_core::Communicator::revoke(&comm, "the case revokes the communicator") {
            Err(error) if error.kind() == ErrorKind::Unsupported => return Ok(()),
            other => other.ctx("revoke")?,
        }
        ensure!(pg_core::Communicator::is_revoked(&comm), "the communicator says it is revoked");
        let finalize = pg_core::Communicator::finalize(&comm).err();
        ensure!(
            finalize.as_ref().is_some_and(|e| e.kind() == ErrorKind::Revoked),
            "finalize after revoke: {finalize:?}"
        );
        let stream = pg_core::Device::current_stream(&r.device);
        let op = pg_core::Communicator::all_reduce(&comm, &buffer, &buffer, ReduceOp::Sum, &stream).err();
        ensure!(op.as_ref().is_some_and(|e| e.kind() == ErrorKind::Revoked), "an op after revoke: {op:?}");
        Ok(())
    })
}

/// The store a group named `name` of [`Rank::group`] was made with: what a new rank of its grow joins through.
fn group_store<B: Backend>(r: &Rank<B>, name: &str) -> Arc<dyn Store> {
    Arc::new(PrefixStore::new(format!("{name}/"), Arc::clone(&r.store)))
}

/// Checks the group of `n` ranks a grow gave rank `r` (a member or the new rank): its ranks and world ranks, and
/// two all_reduces over every rank, old and new; then shuts it down.
fn check_grown<B: Backend>(r: &Rank<B>, grown: &ProcessGroup<B>, n: usize) -> Check {
    ensure_eq!(grown.size(), n, "the grown group's size");
    ensure_eq!(grown.rank(), r.rank, "this rank in the grown group");
    ensure_eq!(grown.global_ranks(), (0..n).collect::<Vec<_>>(), "the grown group's world ranks");
    for round in 0..2 {
        let buffer = r.filled((r.rank + 1) as f64, 256)?;
        grown.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the grown group")?;
        all_equal(&r.read(&buffer)?, triangle(n)).map_err(|e| format!("round {round}: {e}"))?;
    }
    grown.barrier_sync().ctx("barrier on the grown group")?;
    grown.shutdown().ctx("shutdown of the grown group")
}

/// A rank killed mid-all_reduce is replaced: the survivors revoke, agree, shrink to the others and grow the shrunk
/// group by one, while the dead rank's replacement (a new process on its device, knowing only the store, its rank
/// and the size) joins it. Every rank keeps its number, the new one takes the last, the world ranks are 0..n again,
/// the next all_reduces over all n are right and the group that grew still works, whether the communicator grew
/// (`ncclCommGrow`) or was made by the rendezvous (NCCL before 2.29; the mock runs both).
fn a_lost_rank_is_replaced_by_a_new_process_and_the_shrunk_group_grows_back<H: Harness>(h: &H) -> Check<Outcome> {
    lost_rank_replaced(h, false)
}

/// The same with [`Options::liveness`] on every group, the replacement's included.
fn a_lost_rank_is_replaced_with_liveness<H: Harness>(h: &H) -> Check<Outcome> {
    lost_rank_replaced(h, true)
}

fn lost_rank_replaced<H: Harness>(h: &H, liveness: bool) -> Check<Outcome> {
    let n = h.world_size();
    let victim = n - 1;
    // Where the harness kills, the victim dies in the all_reduce; elsewhere it stops issuing ops, which its peers
    // see the same way (an op that never completes).
    let kill = h.offers().faults;
    on_each_rank(h, n, |r| {
        if kill && !r.caps.inject(Fault::KillAt { rank: victim, op: 1 }) {
            return Err("the fault was refused".into());
        }
        let group = r.ready_group("0", revoking().liveness(liveness))?;
        let dying = r.filled((r.rank + 1) as f64, 256)?;
        // The victim dies only once every rank is past the ready barrier: a rank done with its part of an op may
        // still be sending it, and a death then would fail a peer's barrier instead of the all_reduce below.
        r.barrier("every rank past the ready barrier")?;
        if r.rank == victim {
            if kill {
                let _dies_in = group.all_reduce(&dying, ReduceOp::Sum).ctx("the all_reduce the victim dies in")?;
            }
            // Nothing of the dead process lives on: its group's threads (its watchdog would check it in to the
            // survivors' agreement) stop with it.
            group.abort("the process was killed");
            // The victim's process is gone. This thread now plays its replacement, a new process on the same device,
            // which joins the survivors' group once they have shrunk it and grow it back; it knows only the store,
            // its rank and the size.
            let options = Options::builder().timeout(JOIN_TIMEOUT).dump_on_timeout(false).liveness(liveness).build();
            let joined = ProcessGroup::join_grown(group_store(r, "0"), victim, n, r.device.clone(), options);
            let grown = joined.ctx("join_grown")?;
            return check_grown(r, &grown, n);
        }
        let work = group.all_reduce(&dying, ReduceOp::Sum).ctx("the all_reduce the victim dies in")?;
        work.wait().ctx("wait (orders the stream, does not block)")?;
        until_revoked(r, &group, OP_TIMEOUT + Duration::from_secs(1))?;
        let survivors = group.agree_survivors(&AgreeOptions { timeout: AGREE_TIMEOUT, ..AgreeOptions::default() });
        let survivors = survivors.ctx("agree_survivors")?;
        ensure_eq!(survivors.excluded, vec![victim], "the excluded ranks");
        let shrunk = group.shrink(&survivors.excluded, &ShrinkOptions::default()).ctx("shrink")?;
        ensure_eq!(shrunk.size(), n - 1, "the shrunk group's size");
        let grown = shrunk.grow(1, &GrowOptions::default()).ctx("grow by one")?;
        // The group that grew stays usable by its members.
        let ones = r.filled(1.0, 8)?;
        shrunk.all_reduce_sync(&ones, ReduceOp::Sum).ctx("all_reduce on the shrunk group after the grow")?;
        all_equal(&r.read(&ones)?, (n - 1) as f64)?;
        check_grown(r, &grown, n)?;
        shrunk.barrier_sync().ctx("barrier on the shrunk group")
    })
}

/// Whether `error` is of `kind` and its message says `says`.
fn refused(error: Option<&pg_core::Error>, kind: ErrorKind, says: &str) -> bool {
    error.is_some_and(|e| e.kind() == kind && e.to_string().contains(says))
}

/// Grows refused by name before anything is exchanged: by 0 ranks or onto a member's world rank
/// (`InvalidArgument`), while an op of the group has not finished (`InvalidArgument`, "not finished"), of a revoked
/// group or of the parent of an aborting shrink (`Revoked`), of a group shut down (`Aborted`), and with a new rank
/// out of range (`InvalidArgument`).
fn grow_of_no_ranks_or_of_a_busy_revoked_or_shut_down_group_is_refused_by_name<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.ready_group("0", Options::builder())?;
        let grow = |group: &ProcessGroup<_>| group.grow(1, &GrowOptions::default()).err();
        let zero = group.grow(0, &GrowOptions::default()).err();
        ensure!(refused(zero.as_ref(), ErrorKind::InvalidArgument, "added is 0"), "a grow by 0: {zero:?}");
        let taken = GrowOptions { world_ranks: Some(vec![r.rank]), ..GrowOptions::default() };
        let taken = group.grow(1, &taken).err();
        ensure!(refused(taken.as_ref(), ErrorKind::InvalidArgument, "world_ranks"), "a member's world rank: {taken:?}");
        // An op that has not finished (it waits behind a sleep kernel on the current stream).
        r.sleep_current(Duration::from_millis(500))?;
        let buffer = r.filled(1.0, 8)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("the all_reduce in flight")?;
        let busy = grow(&group);
        ensure!(
            refused(busy.as_ref(), ErrorKind::InvalidArgument, "not finished"),
            "a grow with an op in flight: {busy:?}"
        );
        work.wait().ctx("wait")?;
        all_equal(&r.read(&buffer)?, n as f64)?;
        // A revoked group, then the parent of an aborting shrink; no rank revokes before every rank is past the
        // all_reduce (a revoke tears the communicator down under a peer still in it).
        r.barrier("past the all_reduce")?;
        group.revoke("the case revokes it");
        let revoked = grow(&group);
        ensure!(refused(revoked.as_ref(), ErrorKind::Revoked, "revoked"), "a grow of a revoked group: {revoked:?}");
        let child = group.shrink(&[], &ShrinkOptions::default()).ctx("shrink of the revoked group")?;
        let superseded = grow(&group);
        ensure!(
            refused(superseded.as_ref(), ErrorKind::Revoked, "already shrunk"),
            "a grow of a superseded parent: {superseded:?}"
        );
        // A group shut down.
        child.barrier_sync().ctx("barrier")?;
        child.shutdown().ctx("shutdown")?;
        let shut = grow(&child);
        ensure!(refused(shut.as_ref(), ErrorKind::Aborted, "shut down"), "a grow of a group shut down: {shut:?}");
        // A new rank out of range, before it waits for anything.
        let options = Options::builder().build();
        let out = ProcessGroup::<H::B>::join_grown(group_store(r, "0"), n, n, r.device.clone(), options).err();
        ensure!(
            refused(out.as_ref(), ErrorKind::InvalidArgument, "out of range"),
            "join_grown of rank {n} of {n}: {out:?}"
        );
        Ok(())
    })
}

fn ranks_that_ask_for_different_sizes_fail_by_name_then_grow<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    // The first n - 1 ranks are a group that grows; the last rank is the new process.
    let (members, joiner) = (n - 1, n - 1);
    let options = || Options::builder().timeout(Duration::from_secs(30)).dump_on_timeout(false).group_name("m".into());
    on_each_rank(h, n, |r| {
        let group = match r.rank < members {
            true => {
                let group =
                    ProcessGroup::new(group_store(r, "m"), r.rank, members, r.device.clone(), options().build());
                Some(r.keep(group.ctx("the members' group")?))
            }
            false => None,
        };
        // Members that disagree fail by name, every one of them, without waiting for new ranks.
        if let (Some(group), true) = (&group, members >= 2) {
            let added = if r.rank == 0 { 1 } else { 2 };
            let error = group.grow(added, &GrowOptions::default()).err();
            ensure!(
                refused(error.as_ref(), ErrorKind::InvalidArgument, "grows the group to"),
                "members asking for different sizes: {error:?}"
            );
        }
        r.barrier("members disagree")?;
        // A new rank that asks for another size fails, and so does every member.
        match &group {
            Some(group) => {
                let error = group.grow(1, &GrowOptions::default()).err();
                let says = format!("new rank {joiner} to {}", n + 1);
                ensure!(
                    refused(error.as_ref(), ErrorKind::InvalidArgument, &says),
                    "a new rank's other size: {error:?}"
                );
            }
            None => {
                let joined = ProcessGroup::<H::B>::join_grown(
                    group_store(r, "m"),
                    joiner,
                    n + 1,
                    r.device.clone(),
                    options().build(),
                );
                let error = joined.err();
                ensure!(
                    refused(error.as_ref(), ErrorKind::InvalidArgument, &format!("grows the group to {}", n + 1)),
                    "a new rank asking for another size: {error:?}"
                );
            }
        }
        r.barrier("a new rank disagrees")?;
        // Then they agree, and grow.
        let grown = match &group {
            Some(group) => group.grow(1, &GrowOptions::default()).ctx("grow")?,
            None => ProcessGroup::join_grown(group_store(r, "m"), joiner, n, r.device.clone(), options().build())
                .ctx("join_grown")?,
        };
        check_grown(r, &grown, n)?;
        if let Some(group) = &group {
            let ones = r.filled(1.0, 8)?;
            group.all_reduce_sync(&ones, ReduceOp::Sum).ctx("all_reduce on the group that grew")?;
            all_equal(&r.read(&ones)?, members as f64)?;
        }
        Ok(())
    })
}

/// Sibling subgroups [0, 1] and [2, 3] of one world of four grow by one each at the same time, into the same new
/// rank 2 (world ranks 4 and 5 chosen for it); the spare world ranks 4 and 5 are the new processes, each calling
/// `join_grown` for rank 2 of 3. Both grow: each new process takes one grow's ticket, and each grown group reduces
/// over its three ranks.
fn sibling_subgroups_that_grow_into_the_same_new_rank_at_once_both_grow<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let options = || Options::builder().timeout(Duration::from_secs(20)).dump_on_timeout(false);
    on_each_rank(h, n, |r| {
        let grown = match r.rank {
            0..=3 => {
                let world = ProcessGroup::new(
                    group_store(r, "siblings"),
                    r.rank,
                    4,
                    r.device.clone(),
                    options().group_name("siblings".into()).build(),
                );
                let world = r.keep(world.ctx("the members' world")?);
                let mut mine = None;
                for (i, pair) in [[0, 1], [2, 3]].iter().enumerate() {
                    if let Some(group) = world.new_group(pair, options().build()).ctx("new_group")? {
                        mine = Some((i, group));
                    }
                }
                let (i, pair) = mine.ok_or("a member of neither pair")?;
                let grow = GrowOptions { world_ranks: Some(vec![4 + i]), ..GrowOptions::default() };
                let grown = pair.grow(1, &grow).map_err(|e| format!("grow of pair {i}: {e}"))?;
                ensure_eq!(grown.global_ranks(), vec![2 * i, 2 * i + 1, 4 + i], "pair {i}'s grown group's world ranks");
                grown
            }
            4 | 5 => {
                let grown =
                    ProcessGroup::join_grown(group_store(r, "siblings"), 2, 3, r.device.clone(), options().build())
                        .ctx("join_grown of rank 2 of 3")?;
                let world = grown.global_ranks();
                ensure!(
                    world == [0, 1, 4] || world == [2, 3, 5],
                    "the new process joined a group of world ranks {world:?}, neither pair's"
                );
                grown
            }
            _ => return Ok(()),
        };
        // The members keep their ranks in their pair; the new process is the third.
        let rank = if r.rank >= 4 { 2 } else { r.rank % 2 };
        ensure_eq!((grown.rank(), grown.size()), (rank, 3), "rank and size in the grown group");
        let ones = r.filled(1.0, 64)?;
        grown.all_reduce_sync(&ones, ReduceOp::Sum).ctx("all_reduce on the grown group")?;
        all_equal(&r.read(&ones)?, 3.0)?;
        grown.barrier_sync().ctx("barrier on the grown group")?;
        grown.shutdown().ctx("shutdown of the grown group")
    })
}

/// The rank's host clock.
/// The last rank stops taking part (it never calls shrink); the others shrink with abort excluding nobody, which
/// waits for it and fails at its timeout. The group is then revoked, not superseded: the survivors shrink it again
/// with the right list and the shrunk group computes.
fn a_failed_shrink_with_abort_leaves_the_group_revoked_and_shrinkable_again<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let gone = n - 1;
    on_each_rank(h, n, |r| {
        let group = r.ready_group("0", Options::builder())?;
        // No rank shrinks (which revokes) before every rank is past the ready barrier.
        r.barrier("past the ready barrier")?;
        if r.rank != gone {
            let quick = ShrinkOptions { mode: ShrinkMode::Abort, timeout: Some(AGREE_TIMEOUT), ..Default::default() };
            let failed = group.shrink(&[], &quick).err().ok_or("a shrink that waited for a rank that never came")?;
            ensure_eq!(group.state(), GroupState::Revoked, "the group after the failed shrink ({failed})");
            let op = group.all_reduce(&r.filled(1.0, 4)?, ReduceOp::Sum).err().map(|e| e.kind());
            ensure_eq!(op, Some(ErrorKind::Revoked), "an op of the group after the failed shrink");
            let options =
                ShrinkOptions { mode: ShrinkMode::Abort, timeout: Some(SHRINK_TIMEOUT), ..Default::default() };
            let child = r.keep(group.shrink(&[gone], &options).ctx("the second shrink, without the lost rank")?);
            ensure_eq!(group.state(), GroupState::Superseded, "the group after the shrink that succeeded");
            let buffer = r.filled((r.rank + 1) as f64, 8)?;
            child.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce on the shrunk group")?;
            all_equal(&r.read(&buffer)?, triangle(n - 1))?;
            child.barrier_sync().ctx("barrier on the shrunk group")?;
        }
        r.barrier("the survivors are done")
    })
}

fn now<B: pg_core::Backend>(r: &Rank<B>) -> Duration {
    pg_core::Device::now(&r.device)
}

/// `excluded` when `rank` is not among them (it calls the shrink), else `None`.
fn caller_of(rank: usize, excluded: &[usize]) -> Option<Vec<usize>> {
    (!excluded.contains(&rank)).then(|| excluded.to_vec())
}
