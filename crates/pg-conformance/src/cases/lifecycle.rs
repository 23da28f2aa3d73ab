//! The group's life cycle and error paths: non-blocking and racing communicator creation, wrong-device
//! buffers, abort and shutdown, asynchronous and remote errors, the watchdog's bookkeeping, and the Work,
//! Future and `dyn Work` interfaces, and the refusal of a call that needs a capability the backend lacks.

use std::future::IntoFuture as _;
use std::time::Duration;

use std::sync::Arc;

use pg_core::store::PrefixStore;
use pg_core::{
    Capability, CaptureMode, Device as _, ErrorHandling, ErrorKind, ErrorType, OpType, Options, ProcessGroup, ReduceOp,
    ShrinkOptions, Stream as _, Work, WorkHandle,
};
use pg_mock::RecordingStore;

use super::{all_equal, case, clock_of, held_all_reduce, need, needs_faults, on_each_rank, pair_p2p, triangle, SLEEP};
use crate::case::{not_applicable, Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Clock, Fault, Harness, Rank};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(non_blocking_init_through_the_group_gives_a_working_communicator, 1),
        case!(non_blocking_init_of_a_peer_that_never_joins_times_out, 2),
        case!(two_threads_of_a_rank_racing_to_create_a_communicator_create_one, 1),
        case!(a_thread_waiting_for_another_threads_creation_gives_up_at_its_timeout, 2),
        case!(a_buffer_on_another_device_is_refused_by_name, 1),
        case!(every_call_after_abort_returns_aborted, 1),
        case!(every_call_after_shutdown_returns_aborted, 1),
        case!(dropping_a_group_without_shutdown_aborts_its_communicators, 2),
        case!(dropping_a_group_fails_every_work_whose_op_never_ran, 2),
        case!(an_op_queued_behind_a_kernel_on_a_communicator_left_before_it_ran_runs_on_no_rank, 2),
        case!(shutdown_with_an_op_a_peer_never_joined_returns_its_timeout_instead_of_hanging, 2),
        case!(a_failed_wait_fails_every_unfinished_work_of_its_communicator_in_every_mode, 2),
        case!(abort_aborts_every_communicator_of_the_group, 1),
        case!(clean_up_after_a_timeout_aborts_every_communicator_of_the_group, 1),
        case!(an_async_error_with_nothing_in_flight_fails_the_group, 1),
        case!(an_async_error_before_any_op_fails_the_group, 1),
        case!(set_timeout_bounds_later_ops_up_to_the_largest_timeout, 1),
        case!(without_a_watchdog_the_in_flight_list_is_pruned, 1),
        case!(the_watchdog_retires_every_completed_work_however_long_its_list_grows, 1),
        case!(a_failing_rank_writes_the_remote_error_key_and_its_peers_fail_with_remote, 2),
        case!(desync_debug_writes_the_trace_keys_as_ops_start_and_complete, 1),
        case!(started_and_completed_are_counted_apart_from_enqueued, 1),
        case!(shutdown_stops_the_watchdog, 1),
        case!(future_gpu_completed_turns_true_when_the_device_finishes, 1),
        case!(is_success_and_seq_follow_each_work, 1),
        case!(works_are_usable_through_dyn_work, 1),
        case!(debug_output_names_the_group_and_its_works, 1),
        case!(a_work_whose_communicator_was_aborted_behind_the_group_never_reports_success, 1),
        case!(a_call_needing_a_capability_the_backend_lacks_is_refused_by_name_before_any_store_key, 1),
    ]
}

fn non_blocking_init_through_the_group_gives_a_working_communicator<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        for eager in [false, true] {
            let name = if eager { "eager" } else { "lazy" };
            let group = r.group(name, Options::builder().nonblocking_init(true).eager_init(eager))?;
            ensure_eq!(group.counters().comms_created, u64::from(eager), "{name}: communicators after creation");
            let buffer = r.filled((r.rank + 1) as f64, 64)?;
            group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
            all_equal(&r.read(&buffer)?, triangle(n)).map_err(|e| format!("{name}: {e}"))?;
            ensure_eq!(group.counters().comms_created, 1, "{name}: one communicator");
            ensure!(group.initializing_keys().is_empty(), "{name}: still initialising after its first op");
            group.shutdown().ctx("shutdown")?;
        }
        Ok(())
    })
}

fn non_blocking_init_of_a_peer_that_never_joins_times_out<H: Harness>(h: &H) -> Check<Outcome> {
    need!(clock_of(h));
    let n = h.world_size();
    let timeout = Duration::from_secs(2);
    on_each_rank(h, n, |r| {
        // The last rank never calls an op, so it never joins the lazily made communicator; a harness that can
        // also refuse its join outright (the simulated one) does.
        if r.rank == 0 {
            r.caps.inject(Fault::NeverJoin { rank: n - 1 });
        }
        let group = r.group("0", Options::builder().nonblocking_init(true).timeout(timeout))?;
        if r.rank == n - 1 {
            return Ok(());
        }
        let buffer = r.filled(1.0, 4)?;
        let start = r.device.now();
        let error = match group.all_reduce(&buffer, ReduceOp::Sum) {
            Ok(_) => return Err("the op was enqueued on a communicator that never became ready".into()),
            Err(error) => error,
        };
        let took = r.device.now() - start;
        ensure!(error.kind() != ErrorKind::InvalidArgument, "an init timeout is not a bad argument: {error}");
        ensure!(error.to_string().contains("timed out"), "the error does not say it timed out: {error}");
        ensure!(took >= timeout && took < timeout * 2, "gave up after {took:?}, not the group's {timeout:?}");
        Ok(())
    })
}

fn two_threads_of_a_rank_racing_to_create_a_communicator_create_one<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder())?;
        // Both buffers hold rank + 1: whichever op of another rank each one meets, the sum is the same.
        let first = r.filled((r.rank + 1) as f64, 16)?;
        let second = r.filled((r.rank + 1) as f64, 16)?;
        // A second host thread of this rank asks for the same communicator at the same time.
        let racer = {
            let (group, second) = (group.clone(), second.clone());
            r.spawn_host("racer", move || group.all_reduce(&second, ReduceOp::Sum).and_then(|w| w.wait()))?
        };
        let mine = group.all_reduce(&first, ReduceOp::Sum).and_then(|w| w.wait());
        let theirs = racer.finish(r)?;
        mine.ctx("all_reduce")?;
        theirs.ctx("the racing thread's all_reduce")?;
        all_equal(&r.read(&first)?, triangle(r.size))?;
        all_equal(&r.read(&second)?, triangle(r.size)).map_err(|e| format!("the racing thread's op: {e}"))?;
        ensure_eq!(group.counters().comms_created, 1, "both threads got the one communicator");
        ensure_eq!(group.counters().ops_issued, 2, "both ops ran");
        ensure_eq!(group.next_comm_counter(), 1, "one store key was used");
        Ok(())
    })
}

fn a_thread_waiting_for_another_threads_creation_gives_up_at_its_timeout<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    // Not a whole number of the 1 ms polls: the wait must notice a deadline it steps over, not only one it meets.
    let timeout = Duration::from_micros(1_500_500);
    // The creating thread's own timeout: long on a virtual clock, where waiting costs nothing.
    let creation = match clock {
        Clock::Virtual => Duration::from_secs(20),
        Clock::Wall => Duration::from_secs(5),
    };
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder().timeout(creation))?;
        if r.rank == n - 1 {
            // The last rank never joins: every other rank's creation blocks until the group's timeout runs out.
            return Ok(());
        }
        let buffer = r.filled(1.0, 4)?;
        let creator = {
            let (group, buffer) = (group.clone(), buffer.clone());
            r.spawn_host("creator", move || group.all_reduce(&buffer, ReduceOp::Sum).map(drop))?
        };
        // Let the creator get as far as waiting for the missing rank.
        let mut polls = 0;
        while group.initializing_keys().is_empty() && polls < 1000 {
            r.host_sleep(Duration::from_millis(1));
            polls += 1;
        }
        ensure_eq!(group.initializing_keys().len(), 1, "communicators being created");
        // This thread's op asks for the same communicator under a shorter timeout.
        group.set_timeout(timeout);
        let (result, took) = r.host_time(|| group.all_reduce(&buffer, ReduceOp::Sum).map(drop));
        let error = result.err().ok_or("an op was enqueued on a communicator that was never created")?;
        ensure_eq!(error.kind(), ErrorKind::InitTimeout, "the waiting thread's error: {error}");
        ensure!(error.to_string().contains("another thread"), "the error does not say what it waited for: {error}");
        ensure!(
            took >= timeout && took < timeout * 2,
            "the waiting thread gave up after {took:?}, not its {timeout:?}"
        );
        // The creator gives up at its own, longer timeout.
        let error =
            creator.finish(r)?.err().ok_or("the creating thread's op was enqueued on a communicator never created")?;
        ensure_eq!(error.kind(), ErrorKind::InitTimeout, "the creating thread's error: {error}");
        Ok(())
    })
}

fn a_buffer_on_another_device_is_refused_by_name<H: Harness>(h: &H) -> Check<Outcome> {
    if !h.offers().other_device {
        return not_applicable("the harness has no second device");
    }
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let other = r.caps.other_device(r.rank).ok_or("no other device")?;
        let group = r.group("0", Options::builder())?;
        let theirs = other.alloc(pg_core::DType::F32, 4 * n).ctx("alloc")?;
        let mine = r.filled(1.0, 4 * n)?;
        let small = r.filled(1.0, 4)?;
        let small_theirs = other.alloc(pg_core::DType::F32, 4).ctx("alloc")?;
        let calls: Vec<(&str, pg_core::Result<WorkHandle<H::B>>)> = vec![
            ("all_reduce", group.all_reduce(&theirs, ReduceOp::Sum)),
            ("broadcast", group.broadcast(&theirs, 0)),
            ("all_gather input", group.all_gather(&small_theirs, &mine)),
            ("all_gather output", group.all_gather(&small, &theirs)),
            ("reduce_scatter", group.reduce_scatter(&theirs, &small, ReduceOp::Sum)),
            ("send", group.send(&theirs, (r.rank + 1) % n)),
            ("recv", group.recv(&theirs, (r.rank + 1) % n)),
        ];
        for (what, result) in calls {
            let error = result.err().ok_or_else(|| format!("{what}: a buffer of another device was accepted"))?;
            ensure_eq!(error.kind(), ErrorKind::InvalidArgument, "{what}: {error}");
            ensure!(error.to_string().contains("device"), "{what}: the error does not name the device: {error}");
        }
        ensure_eq!(group.counters().ops_issued, 0, "a refused call enqueued something");
        ensure_eq!(group.counters().comms_created, 0, "a refused call created a communicator");
        Ok(())
    })
}

/// Every op of the group, each giving its result's error kind (Ok -> None).
fn every_call<B: pg_core::Backend>(
    r: &Rank<B>,
    group: &ProcessGroup<B>,
) -> Check<Vec<(&'static str, Option<ErrorKind>)>> {
    let n = r.size;
    let buffer = r.filled(1.0, 4)?;
    let gathered = r.filled(1.0, 4 * n)?;
    let kind = |result: pg_core::Result<WorkHandle<B>>| result.err().map(|e| e.kind());
    let mut calls = vec![
        ("all_reduce", kind(group.all_reduce(&buffer, ReduceOp::Sum))),
        ("all_reduce_sync", group.all_reduce_sync(&buffer, ReduceOp::Sum).err().map(|e| e.kind())),
        ("broadcast", kind(group.broadcast(&buffer, 0))),
        ("all_gather", kind(group.all_gather(&buffer, &gathered))),
        ("reduce_scatter", kind(group.reduce_scatter(&gathered, &buffer, ReduceOp::Sum))),
        ("barrier", kind(group.barrier())),
        ("barrier_sync", group.barrier_sync().err().map(|e| e.kind())),
    ];
    if n > 1 {
        calls.push(("send", kind(group.send(&buffer, (r.rank + 1) % n))));
        calls.push(("recv", kind(group.recv(&buffer, (r.rank + n - 1) % n))));
    }
    Ok(calls)
}

fn check_all_aborted(calls: Vec<(&'static str, Option<ErrorKind>)>) -> Check {
    for (what, kind) in calls {
        ensure_eq!(kind, Some(ErrorKind::Aborted), "{what}");
    }
    Ok(())
}

fn every_call_after_abort_returns_aborted<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 4)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        // No rank aborts while a peer's part of that all_reduce may still run (an abort closes the connections
        // under a peer's unfinished send, which would fail it with a remote error instead of Aborted).
        r.read(&buffer).ctx("reading the result")?;
        r.barrier("past the all_reduce")?;
        // An op still in flight when the group is aborted fails with Aborted too.
        r.sleep_current(SLEEP)?;
        let in_flight = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        group.abort("the case aborts");
        let error = in_flight.exception().ok_or("the in-flight Work has no error after abort")?;
        ensure_eq!(error.kind(), ErrorKind::Aborted, "the in-flight Work: {error}");
        ensure!(in_flight.is_completed() && !in_flight.is_success(), "a failed Work is completed, not successful");
        ensure_eq!(group.error().map(|e| e.kind()), Some(ErrorKind::Aborted), "the group's error");
        check_all_aborted(every_call(r, &group)?)?;
        // Aborting again or shutting down after the abort changes nothing.
        group.abort("again");
        let _ = group.shutdown();
        check_all_aborted(every_call(r, &group)?)
    })
}

fn every_call_after_shutdown_returns_aborted<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        for first_op in [true, false] {
            let name = if first_op { "used" } else { "unused" };
            let group = r.group(name, Options::builder())?;
            if first_op {
                let buffer = r.filled(1.0, 4)?;
                group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
            }
            group.shutdown().ctx("shutdown")?;
            ensure_eq!(group.state(), pg_core::GroupState::ShutDown, "{name} group's state");
            ensure_eq!(group.error().map(|e| e.kind()), Some(ErrorKind::Aborted), "{name} group's error");
            check_all_aborted(every_call(r, &group)?).map_err(|e| format!("{name} group: {e}"))?;
            ensure!(group.comm_keys().is_empty(), "{name} group: shutdown left communicators in the cache");
        }
        Ok(())
    })
}

/// A group dropped without `shutdown()` aborts its live communicators: an op of it that waits for a peer that
/// never joins ends, and the stream it held runs again.
fn dropping_a_group_without_shutdown_aborts_its_communicators<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, 2, |r| {
        let group = r.own_ready_group("0", Options::builder())?;
        let buffer = r.filled(1.0, 4)?;
        if r.rank == 0 {
            // Rank 1 never joins this all_reduce.
            drop(group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?);
        }
        drop(group);
        // Ok or the aborted op's error: what matters is that the device finishes its work.
        let _ = r.device.synchronize();
        let after = r.filled(2.0, 4)?;
        all_equal(&r.read(&after)?, 2.0).map_err(|e| format!("the device after the drop: {e}"))
    })
}

/// Checks that `work`, whose op never ran, failed, whichever way it is asked: exception, completion, `wait()`,
/// awaiting it.
fn check_never_ran<B: pg_core::Backend>(work: &WorkHandle<B>, what: &str) -> Check {
    let error = work.exception().ok_or_else(|| format!("{what}: the Work has no error"))?;
    ensure!(
        matches!(error.kind(), ErrorKind::Aborted | ErrorKind::WorkTimeout | ErrorKind::Communicator),
        "{what}: the error is neither the abort nor its cause: {error}"
    );
    ensure!(work.is_completed() && !work.is_success(), "{what}: a failed Work is completed, not successful");
    ensure!(work.wait().is_err(), "{what}: wait() returned Ok");
    let awaited = futures::executor::block_on(std::future::IntoFuture::into_future(work));
    ensure!(awaited.is_err(), "{what}: awaiting the Work gave Ok");
    Ok(())
}

/// A group dropped without `shutdown()` aborts its communicators, which drains the ops still queued without
/// running them: their Works fail (an op a peer never joined; ops of every rank queued behind a long kernel).
fn dropping_a_group_fails_every_work_whose_op_never_ran<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, 2, |r| {
        let group = r.own_ready_group("alone", Options::builder())?;
        let buffer = r.filled(1.0, 4)?;
        // Rank 1 never joins this all_reduce.
        let alone = match r.rank {
            0 => Some(group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?),
            _ => None,
        };
        drop(group);
        if let Some(work) = &alone {
            check_never_ran(work, "an op its peer never joined, after the drop")?;
        }
        // Both ranks are done letting go of the first group (its aborts close its connections) before the next.
        r.barrier("alone dropped")?;
        let group = r.own_ready_group("behind", Options::builder())?;
        let buffer = r.filled(1.0, 4)?;
        r.sleep_current(SLEEP)?;
        let behind = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        drop(group);
        check_never_ran(&behind, "an op queued behind a long kernel, after the drop")?;
        // The device finishes its work: the aborted stream drained.
        let _ = r.device.synchronize();
        Ok(())
    })
}

/// Rank 0's all_reduce waits on its communication stream behind a long kernel; rank 0 aborts, revokes or drops its
/// group before the kernel ends: rank 0's Work fails, and rank 1's all_reduce never reports success with a rank
/// that left: it fails at its timeout (or with the communicator's error).
fn an_op_queued_behind_a_kernel_on_a_communicator_left_before_it_ran_runs_on_no_rank<H: Harness>(
    h: &H,
) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let timeout = match clock {
        Clock::Virtual => Duration::from_secs(1),
        // An abort on NCCL's network transport can take seconds.
        Clock::Wall => Duration::from_secs(3),
    };
    on_each_rank(h, 2, |r| {
        for how in ["abort", "revoke", "drop"] {
            // The last round's group is gone, its watchdog joined: the error it recorded on the device (rank 1's
            // communicator lost its peer) concerns that group only, and would fail this round's barrier.
            let _ = r.device.poison().clear();
            let group = r.own_ready_group(&format!("left-{how}"), Options::builder())?;
            let own = (r.rank + 1) as f64;
            let buffer = r.filled(own, 4)?;
            // No rank leaves while its peer is still in the ready barrier.
            r.barrier(&format!("left-{how} ready"))?;
            if r.rank == 0 {
                r.sleep_current(SLEEP * 4)?;
                let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
                // Rank 1's part is queued too by now; the kernel is still running, so the op has not started.
                r.host_sleep(SLEEP / 2);
                match how {
                    "abort" => group.abort("rank 0 leaves before its queued op ran"),
                    "revoke" => group.revoke("rank 0 leaves before its queued op ran"),
                    _ => drop(group),
                }
                let error = work.exception().ok_or_else(|| format!("{how}: rank 0's Work has no error"))?;
                ensure!(
                    matches!(error.kind(), ErrorKind::Aborted | ErrorKind::Revoked),
                    "{how}: rank 0's Work failed with neither Aborted nor Revoked: {error}"
                );
                ensure!(!work.is_success() && work.wait().is_err(), "{how}: rank 0's Work reports success");
                // What the buffers hold is the backend's: the simulator drains the op unrun (its own test checks the
                // buffers keep their values), while NCCL's abort, which takes effect only once its proxy threads
                // stop, may still let a queued op run. The Works' outcomes are the process group's promise.
            } else {
                let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
                let waited = work.wait_timeout(timeout);
                ensure!(
                    waited.is_err(),
                    "{how}: rank 1's all_reduce completed although rank 0 left before its part ran"
                );
                ensure!(!work.is_success(), "{how}: rank 1's Work reports success");
                drop(group);
            }
            r.barrier(&format!("left-{how} done"))?;
        }
        Ok(())
    })
}

/// A shutdown waits for the ops in flight at most until their timeouts run out: an op a peer never joined fails
/// with its timeout, the communicators are aborted instead of finalized (a finalize would wait for the op without
/// a bound), and the call returns that error; the peer, with nothing in flight, shuts down cleanly.
fn shutdown_with_an_op_a_peer_never_joined_returns_its_timeout_instead_of_hanging<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let (timeout, slack) = match clock {
        Clock::Virtual => (Duration::from_secs(1), Duration::from_millis(50)),
        // An abort on NCCL's network transport can take seconds.
        Clock::Wall => (Duration::from_secs(2), Duration::from_secs(15)),
    };
    on_each_rank(h, 2, |r| {
        // No watchdog: only the shutdown acts on the op.
        let group = r.own_ready_group("stuck", Options::builder().timeout(timeout).enable_watchdog(false))?;
        if r.rank == 1 {
            // Rank 1 never joins rank 0's all_reduce; it keeps its communicator until rank 0 is done.
            r.barrier("rank 0 shut down")?;
            return group.shutdown().ctx("shutdown with nothing in flight");
        }
        let buffer = r.filled(1.0, 4)?;
        let start = r.device.now();
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let error = group.shutdown().err().ok_or("shutdown with an op that never ends returned Ok")?;
        let took = r.device.now().saturating_sub(start);
        r.barrier("rank 0 shut down")?;
        ensure!(
            matches!(error.kind(), ErrorKind::WorkTimeout | ErrorKind::Communicator | ErrorKind::Remote),
            "shutdown's error is neither the op's timeout nor its communicator's failure: {error}"
        );
        if error.kind() == ErrorKind::WorkTimeout {
            ensure!(took >= timeout, "the shutdown gave up after {took:?}, before the op's timeout {timeout:?}");
            ensure!(error.to_string().contains("ALLREDUCE"), "the error names the op: {error}");
        }
        ensure!(took <= timeout + slack, "the shutdown took {took:?} for an op whose timeout is {timeout:?}");
        check_never_ran(&work, "the op a peer never joined, after the shutdown")?;
        let after = group.all_reduce(&buffer, ReduceOp::Sum).err();
        ensure!(after.is_some_and(|e| e.kind() == ErrorKind::Aborted), "an op after the shutdown was not Aborted");
        Ok(())
    })
}

/// A `wait_timeout` that fails aborts the Work's communicator (as PyTorch's); every other Work of that
/// communicator whose op had not finished fails at once, in every error-handling mode, instead of completing
/// with data the drained op never wrote.
fn a_failed_wait_fails_every_unfinished_work_of_its_communicator_in_every_mode<H: Harness>(h: &H) -> Check<Outcome> {
    let modes =
        [ErrorHandling::NoHandling, ErrorHandling::CleanUpOnly, ErrorHandling::TearDown, ErrorHandling::SkipCleanUp];
    on_each_rank(h, 2, |r| {
        for mode in modes {
            let name = format!("{mode:?}");
            // The last mode's group is gone, its watchdog joined: the failure it recorded on the device, whenever
            // its watchdog saw the failed Work, concerns that group only.
            let _ = r.device.poison().clear();
            // The watchdog's timeout is long: only the failed wait acts.
            let group = r.ready_group(&name, Options::builder().error_handling(mode))?;
            if r.rank == 1 {
                // Rank 1 never joins the two ops.
                continue;
            }
            let first = r.filled(1.0, 4)?;
            let second = r.filled(1.0, 4)?;
            let a = group.all_reduce(&first, ReduceOp::Sum).ctx("first all_reduce")?;
            let b = group.all_reduce(&second, ReduceOp::Sum).ctx("second all_reduce")?;
            ensure!(a.wait_timeout(SLEEP).is_err(), "{name}: a wait_timeout of an op no peer joined returned Ok");
            let _ = r.device.synchronize();
            check_never_ran(&b, &format!("{name}: the second Work after the first one's failed wait"))?;
        }
        Ok(())
    })
}

/// `abort()` aborts every communicator of the group and fails the Works in flight; it returns once the group's
/// threads have stopped, so a program may exit right after it. On NCCL each communicator's abort waits at most
/// 10 s, and a second abort of the same communicator waits for the first.
fn abort_aborts_every_communicator_of_the_group<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 4)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let comms = 1 + usize::from(pair_p2p(r, &group, &buffer)?.is_some());
        ensure_eq!(group.status().aborted_comms, 0, "aborted communicators before the abort");
        // No rank aborts while a peer's part of the ops may still run: each waits for its own on the device, then
        // for every rank (an abort closes the connections under a peer's unfinished send).
        r.read(&buffer).ctx("reading the result")?;
        r.barrier("abort")?;
        group.abort("the case aborts");
        ensure_eq!(group.status().aborted_comms, comms, "aborted communicators after the abort");
        Ok(())
    })
}

fn clean_up_after_a_timeout_aborts_every_communicator_of_the_group<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let period = Duration::from_millis(5);
        let options = Options::builder()
            .error_handling(ErrorHandling::CleanUpOnly)
            .watchdog_period(period)
            .dump_on_timeout(false)
            .timeout(Duration::from_secs(60));
        let group = r.group("0", options)?;
        let buffer = r.filled(1.0, 4)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let comms = 1 + usize::from(pair_p2p(r, &group, &buffer)?.is_some());
        group.barrier_sync().ctx("barrier")?;
        // The next op times out behind a long kernel; the watchdog's clean-up aborts every communicator.
        group.set_timeout(Duration::from_millis(10));
        r.sleep_current(SLEEP * 5)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let waited = match clock {
            Clock::Virtual => SLEEP * 2,
            Clock::Wall => SLEEP * 4,
        };
        r.host_sleep(waited);
        ensure_eq!(group.error_type(), ErrorType::Timeout, "the group's error state");
        ensure_eq!(work.exception().map(|e| e.kind()), Some(ErrorKind::WorkTimeout), "the Work's error");
        // The clean-up aborts the communicators one after the other; on NCCL's network transport an abort takes
        // a while, so the count is watched up to a bound (in virtual time on the simulated backend).
        for _ in 0..200 {
            if group.status().aborted_comms >= comms {
                break;
            }
            r.host_sleep(period * 10);
        }
        ensure_eq!(group.status().aborted_comms, comms, "communicators aborted by the clean-up");
        // Clean-up only: the group is not torn down.
        ensure!(group.error().is_none(), "clean-up only tore the group down: {:?}", group.error());
        Ok(())
    })
}

fn an_async_error_with_nothing_in_flight_fails_the_group<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_faults(h));
    let clock = need!(clock_of(h));
    on_each_rank(h, h.world_size(), |r| {
        if !r.caps.inject(Fault::AsyncError { rank: r.rank, after_ops: 1 }) {
            return Err("the fault was refused".into());
        }
        let group = r.group("0", Options::builder().watchdog_period(Duration::from_millis(10)))?;
        let buffer = r.filled(1.0, 4)?;
        let synced = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?.synchronize();
        match synced {
            Ok(()) => {}
            // Over a real network a peer whose op ended first fails at once and its abort closes the connections
            // under this rank's last transfer: the op fails as a communicator error, which is what this case
            // expects next anyway. A virtual clock's backend ends every rank's op together.
            Err(error) if clock == Clock::Wall && error.kind() == ErrorKind::Communicator => {}
            Err(error) => return Err(format!("synchronize: {error}")),
        }
        // Nothing is in flight now; the communicator reports its error while the group idles.
        r.host_sleep(Duration::from_secs(1));
        ensure_eq!(group.status().in_flight, 0, "Works in flight");
        ensure_eq!(group.error_type(), ErrorType::CommError, "the group's error state");
        let next = group.all_reduce(&buffer, ReduceOp::Sum).err().ok_or("the next op was accepted")?;
        ensure_eq!(next.kind(), ErrorKind::Communicator, "the next op's error: {next}");
        Ok(())
    })
}

fn an_async_error_before_any_op_fails_the_group<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_faults(h));
    let clock = need!(clock_of(h));
    on_each_rank(h, h.world_size(), |r| {
        // Rank 0's communicator fails as soon as it exists: no Work ever sees the error, only the watchdog's look
        // at the group's communicators does.
        if r.rank == 0 && !r.caps.inject(Fault::AsyncError { rank: 0, after_ops: 0 }) {
            return Err("the fault was refused".into());
        }
        // Propagating errors, the watchdog polls every period even with nothing in flight.
        let options = Options::builder()
            .eager_init(true)
            .propagate_error(true)
            .dump_on_timeout(false)
            .watchdog_period(Duration::from_millis(10));
        let group = r.group("0", options)?;
        // On a wall clock the peers learn of rank 0's error through the store: a wider margin.
        r.host_sleep(match clock {
            Clock::Virtual => Duration::from_millis(500),
            Clock::Wall => Duration::from_secs(2),
        });
        let status = group.status();
        ensure_eq!((status.last_enqueued_seq, status.in_flight), (None, 0), "(last enqueued, in flight)");
        let want = if r.rank == 0 { ErrorType::CommError } else { ErrorType::RemoteError };
        ensure_eq!(group.error_type(), want, "the group's error state");
        Ok(())
    })
}

fn set_timeout_bounds_later_ops_up_to_the_largest_timeout<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let group = r.group("0", Options::builder().timeout(Duration::from_secs(60)))?;
        let buffer = r.filled(1.0, 4)?;
        let before = group.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?;
        group.set_timeout(Duration::from_secs(5));
        let after = group.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?;
        ensure_eq!(before.timeout(), Duration::from_secs(60), "an op enqueued before set_timeout");
        ensure_eq!(after.timeout(), Duration::from_secs(5), "an op enqueued after set_timeout");
        // A timeout beyond what u64 nanoseconds hold (584 years) is kept as the largest that fits, never dropped
        // for the group's own.
        let mut works = vec![before, after];
        for huge in [Duration::from_nanos(u64::MAX), Duration::MAX] {
            group.set_timeout(huge);
            let work = group.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?;
            ensure_eq!(work.timeout(), Duration::from_nanos(u64::MAX - 1), "an op after set_timeout({huge:?})");
            works.push(work);
        }
        for work in &works {
            work.wait().ctx("wait")?;
        }
        all_equal(&r.read(&buffer)?, 1.0)
    })
}

fn without_a_watchdog_the_in_flight_list_is_pruned<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let group = r.group("0", Options::builder().enable_watchdog(false))?;
        let buffer = r.filled(1.0, 4)?;
        for _ in 0..300 {
            group.all_reduce_sync(&buffer, ReduceOp::Max).ctx("all_reduce")?;
            r.device.synchronize().ctx("synchronize")?;
        }
        let in_flight = group.status().in_flight;
        ensure!(in_flight <= 128, "{in_flight} completed Works are still listed after 300 ops with no watchdog");
        all_equal(&r.read(&buffer)?, 1.0)?;
        // A Work nobody holds stays listed while its op runs (an abort must reach it; its stash may guard
        // buffers): 150 ops held back behind a kernel, each handle dropped at once, all pruned past.
        r.sleep_current(SLEEP)?;
        for _ in 0..150 {
            drop(group.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?);
        }
        let held_back = group.status().in_flight;
        ensure!(held_back >= 150, "{held_back} Works are listed while 150 ops nobody holds still run");
        r.device.synchronize().ctx("synchronize")?;
        // Once they are done, the list that grew shrinks again: a Work leaves when its op is done, held or not.
        let mut held = Vec::new();
        for _ in 0..300 {
            let work = group.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?;
            work.wait().ctx("wait")?;
            r.device.synchronize().ctx("synchronize")?;
            held.push(work);
        }
        let in_flight = group.status().in_flight;
        ensure!(in_flight <= 256, "{in_flight} Works are listed after 300 more ops with the earlier ones done");
        ensure!(held.iter().all(|w| w.is_success()), "a held Work failed");
        Ok(())
    })
}

fn the_watchdog_retires_every_completed_work_however_long_its_list_grows<H: Harness>(h: &H) -> Check<Outcome> {
    // A long period on a virtual clock, where waiting costs nothing; a wall clock's still dwarfs 100 small ops.
    let period = match need!(clock_of(h)) {
        Clock::Virtual => Duration::from_secs(30),
        Clock::Wall => Duration::from_secs(1),
    };
    on_each_rank(h, h.world_size(), |r| {
        let group = r.ready_group("0", Options::builder().watchdog_period(period))?;
        let buffer = r.filled(1.0, 4)?;
        // 100 ops between two passes: the list outgrows the length at which a group without a watchdog prunes.
        r.host_sleep(period * 2);
        let after_sleep = u64::try_from(r.device.now().as_nanos()).unwrap_or(u64::MAX);
        for _ in 0..100 {
            group.all_reduce_sync(&buffer, ReduceOp::Max).ctx("all_reduce")?;
            r.device.synchronize().ctx("synchronize")?;
        }
        r.host_sleep(period * 2);
        ensure_eq!(group.status().in_flight, 0, "Works listed after a pass with every op done");
        let dump: serde_json::Value = serde_json::from_str(&group.flight_recorder_json()).ctx("the dump's JSON")?;
        let entries = dump["entries"].as_array().ok_or("the dump has no entries")?;
        let unseen = entries.iter().filter(|e| e["time_discovered_completed_ns"].is_null()).count();
        ensure!(entries.len() >= 100, "{} flight-recorder entries for 100 ops", entries.len());
        ensure_eq!(unseen, 0, "entries the watchdog never saw complete, of {}", entries.len());
        // Times are the host clock's, in nanoseconds: every op was enqueued after the first sleep, and seen
        // complete no earlier than it was enqueued.
        let ns = |e: &serde_json::Value, key: &str| e[key].as_u64().unwrap_or(0);
        for e in entries.iter().filter(|e| e["profiling_name"] == "nccl:all_reduce") {
            let (created, completed) = (ns(e, "time_created_ns"), ns(e, "time_discovered_completed_ns"));
            ensure!(created >= after_sleep, "an entry created at {created} ns, before the {after_sleep} ns slept");
            ensure!(completed >= created, "an entry seen complete at {completed} ns, created at {created} ns");
        }
        Ok(())
    })
}

fn a_failing_rank_writes_the_remote_error_key_and_its_peers_fail_with_remote<H: Harness>(h: &H) -> Check<Outcome> {
    // Margins of a second and more around a 1 s timeout and a 100 ms watchdog: the same on a wall clock.
    need!(clock_of(h));
    let n = h.world_size();
    // The group's PrefixStore("0/") adds its own "/": the key is "0//remote_error:0" in the world's store.
    let key = "0//remote_error:0";
    on_each_rank(h, n, |r| {
        let options = Options::builder()
            .propagate_error(true)
            .dump_on_timeout(false)
            .timeout(Duration::from_secs(1))
            .watchdog_period(Duration::from_millis(100));
        let group = r.group("0", options)?;
        let buffer = r.filled(1.0, 4)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        r.device.synchronize().ctx("synchronize")?;
        r.host_sleep(Duration::from_millis(300));
        ensure!(!r.store.check(&[key]).ctx("store")?, "the key was written before any failure");
        // The last rank alone enqueues the next op: it times out; the others never joined it, and each learns
        // through the key which rank failed.
        let failing = n - 1;
        if r.rank == failing {
            let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
            r.host_sleep(Duration::from_secs(2));
            ensure_eq!(work.exception().map(|e| e.kind()), Some(ErrorKind::WorkTimeout), "the failing rank's Work");
            ensure_eq!(group.error_type(), ErrorType::Timeout, "the failing rank's error state");
            ensure!(r.store.check(&[key]).ctx("store")?, "the failing rank did not write {key}");
        } else {
            r.host_sleep(Duration::from_secs(3));
            ensure_eq!(group.error_type(), ErrorType::RemoteError, "a peer's error state");
            let error = group.error().ok_or("the peer's group has no error")?;
            ensure!(
                matches!(error, pg_core::Error::Remote { rank } if rank == failing),
                "the peer's error names rank {failing}: {error}"
            );
            // A peer that learnt of the failure does not signal it again: the key still names the failing rank.
            let value = r.store.get(key).ctx("the remote-error key")?;
            let named = value.get(..4).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
            ensure_eq!(named, Some(failing as i32), "the rank the remote-error key names");
        }
        Ok(())
    })
}

fn desync_debug_writes_the_trace_keys_as_ops_start_and_complete<H: Harness>(h: &H) -> Check<Outcome> {
    need!(clock_of(h));
    on_each_rank(h, h.world_size(), |r| {
        let options = Options::builder().desync_debug(true).watchdog_period(Duration::from_millis(2));
        let group = r.group("0", options)?;
        let (start_key, end_key) = (format!("0//NCCL_{}_trace_start", r.rank), format!("0//NCCL_{}_trace_end", r.rank));
        ensure!(!r.store.check(&[&start_key]).ctx("store")?, "a trace key before any op");
        let buffer = r.filled(1.0, 4)?;
        group.barrier_sync().ctx("barrier")?;
        r.sleep_current(SLEEP)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        r.host_sleep(SLEEP / 4);
        ensure!(!work.is_completed(), "the op finished while its input was still being held back");
        let end_before = r.store.get(&end_key).ctx("the end key after the barrier")?;
        work.synchronize().ctx("synchronize")?;
        r.host_sleep(Duration::from_millis(20));
        ensure!(r.store.check(&[&start_key]).ctx("store")?, "no start key once the op started");
        let end_after = r.store.get(&end_key).ctx("the end key")?;
        ensure!(end_before != end_after, "the end key was not rewritten when the second op completed");
        // Without desync debugging a group writes no trace keys.
        let quiet = r.group("1", Options::builder().watchdog_period(Duration::from_millis(2)))?;
        quiet.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce without desync debugging")?;
        r.device.synchronize().ctx("synchronize")?;
        r.host_sleep(Duration::from_millis(20));
        let quiet_keys = [format!("1//NCCL_{}_trace_start", r.rank), format!("1//NCCL_{}_trace_end", r.rank)];
        for key in &quiet_keys {
            ensure!(!r.store.check(&[key]).ctx("store")?, "{key} written without desync debugging");
        }
        Ok(())
    })
}

fn started_and_completed_are_counted_apart_from_enqueued<H: Harness>(h: &H) -> Check<Outcome> {
    need!(clock_of(h));
    on_each_rank(h, h.world_size(), |r| {
        let options = Options::builder().desync_debug(true).watchdog_period(Duration::from_millis(2));
        let group = r.group("0", options)?;
        let buffer = r.filled(1.0, 4)?;
        group.barrier_sync().ctx("barrier")?;
        r.device.synchronize().ctx("synchronize")?;
        r.host_sleep(Duration::from_millis(10));
        let status = group.status();
        ensure_eq!(
            (status.last_enqueued_seq, status.last_started_seq, status.last_completed_seq),
            (Some(1), Some(1), Some(1)),
            "after the barrier (enqueued, started, completed)"
        );
        r.sleep_current(SLEEP)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        r.host_sleep(SLEEP / 4);
        let status = group.status();
        ensure_eq!(
            (status.last_enqueued_seq, status.last_started_seq, status.last_completed_seq),
            (Some(2), Some(1), Some(1)),
            "while op 2 waits for its input (enqueued, started, completed)"
        );
        ensure_eq!(status.last_enqueued_op, Some(OpType::AllReduce), "the last enqueued op");
        work.synchronize().ctx("synchronize")?;
        r.host_sleep(Duration::from_millis(10));
        let status = group.status();
        ensure_eq!(
            (status.last_started_seq, status.last_completed_seq, status.last_completed_op),
            (Some(2), Some(2), Some(OpType::AllReduce)),
            "after op 2 (started, completed, op)"
        );
        // Without desync debugging no start events are recorded: nothing is known to have started.
        let plain = r.group("1", Options::builder().watchdog_period(Duration::from_millis(2)))?;
        plain.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce without desync debugging")?;
        r.device.synchronize().ctx("synchronize")?;
        r.host_sleep(Duration::from_millis(10));
        let status = plain.status();
        ensure_eq!(
            (status.last_started_seq, status.last_completed_seq),
            (None, Some(1)),
            "without desync debugging (started, completed)"
        );
        Ok(())
    })
}

fn shutdown_stops_the_watchdog<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    on_each_rank(h, h.world_size(), |r| {
        let period = Duration::from_millis(2);
        let group = r.group("0", Options::builder().watchdog_period(period).propagate_error(true))?;
        let buffer = r.filled(1.0, 4)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let before = group.status().watchdog_passes;
        r.host_sleep(period * 10);
        let running = group.status().watchdog_passes;
        ensure!(running > before, "the watchdog made no pass in 10 periods ({before} -> {running})");
        let (result, took) = r.host_time(|| group.shutdown());
        result.ctx("shutdown")?;
        if clock == Clock::Virtual {
            // Stopping joins the watchdog at once: it is in no store operation, so nothing is waited for.
            ensure!(took < Duration::from_millis(1), "shutdown took {took:?} of host time");
        }
        let stopped = group.status().watchdog_passes;
        r.host_sleep(period * 10);
        ensure_eq!(group.status().watchdog_passes, stopped, "watchdog passes after shutdown");
        Ok(())
    })
}

fn future_gpu_completed_turns_true_when_the_device_finishes<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let buffer = r.filled(1.0, 64)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        let future = work.future();
        ensure!(!future.gpu_completed().ctx("gpu_completed")?, "gpu_completed before the device finished");
        work.synchronize().ctx("synchronize")?;
        ensure!(future.gpu_completed().ctx("gpu_completed")?, "gpu_completed stayed false after the op finished");
        ensure!(work.is_completed(), "the Work is completed after its end event");
        Ok(())
    })
}

fn is_success_and_seq_follow_each_work<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 64)?;
        group.barrier_sync().ctx("barrier")?;
        r.sleep_current(SLEEP)?;
        let works: Vec<WorkHandle<H::B>> = (0..3)
            .map(|_| group.all_reduce(&buffer, ReduceOp::Max))
            .collect::<pg_core::Result<_>>()
            .ctx("all_reduce")?;
        let seqs: Vec<u64> = works.iter().map(WorkHandle::seq).collect();
        ensure_eq!(seqs, vec![2, 3, 4], "collective seqs after the barrier's 1");
        ensure!(works.iter().all(|w| !w.is_success()), "is_success before the device finished");
        for work in &works {
            work.synchronize().ctx("synchronize")?;
        }
        ensure!(works.iter().all(WorkHandle::is_success), "not is_success after the device finished");
        if let Some(p2p) = pair_p2p(r, &group, &buffer)? {
            ensure_eq!((p2p.seq(), p2p.op_type().is_p2p()), (1, true), "point-to-point ops count from 1 on their own");
        }
        // A Work that failed is completed but not a success.
        let timed = r.ready_group("1", Options::builder().blocking_wait(true).timeout(Duration::from_millis(5)))?;
        r.sleep_current(SLEEP)?;
        let failing = timed.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?;
        ensure!(failing.wait().is_err(), "the wait did not time out");
        ensure!(failing.is_completed() && !failing.is_success(), "a timed-out Work is completed, not a success");
        ensure_eq!(failing.seq(), 2, "the second group counts its own seqs");
        Ok(())
    })
}

fn works_are_usable_through_dyn_work<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        // No watchdog: the Work that times out below must not have the device's failure record set under the
        // second group's ops (what the watchdog does with an error is not this case's subject).
        let group = r.group("0", Options::builder().enable_watchdog(false))?;
        let buffer = r.filled((r.rank + 1) as f64, 64)?;
        group.barrier_sync().ctx("barrier")?;
        // Long enough on the wall clock that a host slowed by many ranks sharing a machine still finds the ops
        // running behind it.
        r.sleep_current(match clock {
            Clock::Virtual => SLEEP,
            Clock::Wall => SLEEP * 10,
        })?;
        let works: Vec<Box<dyn Work>> = vec![
            Box::new(group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?),
            Box::new(group.broadcast(&buffer, 0).ctx("broadcast")?),
        ];
        let described: Vec<(u64, OpType)> = works.iter().map(|w| (w.seq(), w.op_type())).collect();
        ensure_eq!(described, vec![(2, OpType::AllReduce), (3, OpType::Broadcast)], "(seq, op) through dyn Work");
        ensure!(works.iter().all(|w| !w.is_completed() && w.exception().is_none()), "completed at once");
        // wait() through the trait orders the current stream only; wait_timeout() also blocks the host.
        let (waited, host) = r.host_time(|| works[0].wait());
        waited.ctx("wait")?;
        ensure!(host < super::at_once(clock), "dyn Work::wait blocked the host for {host:?}");
        works[1].wait_timeout(Duration::from_secs(60)).ctx("wait_timeout")?;
        ensure!(works.iter().all(|w| w.is_completed()), "not completed after wait_timeout");
        all_equal(&r.read(&buffer)?, triangle(n))?;
        // A wait_timeout that runs out is a WorkTimeout (and aborts the communicator): every rank is done with the
        // ops above first.
        r.barrier("before the slow op")?;
        r.sleep_current(SLEEP)?;
        let slow: Box<dyn Work> = Box::new(group.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?);
        let error = slow.wait_timeout(Duration::from_millis(1)).err().ok_or("wait_timeout did not run out")?;
        ensure_eq!(error.kind(), ErrorKind::WorkTimeout, "{error}");
        ensure_eq!(slow.exception().map(|e| e.kind()), Some(ErrorKind::WorkTimeout), "the Work's own error");
        // With blocking wait, wait() through the trait returns the error of a Work that times out.
        let timed = r.ready_group("1", Options::builder().blocking_wait(true).timeout(Duration::from_millis(5)))?;
        r.sleep_current(SLEEP)?;
        let failing: Box<dyn Work> = Box::new(timed.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?);
        let error = failing.wait().err().ok_or("dyn Work::wait returned Ok for a Work that timed out")?;
        ensure_eq!(error.kind(), ErrorKind::WorkTimeout, "dyn Work::wait: {error}");
        Ok(())
    })
}

fn debug_output_names_the_group_and_its_works<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let group = r.group("debugged", Options::builder())?;
        let buffer = r.filled(1.0, 4)?;
        let work = group.all_reduce(&buffer, ReduceOp::Max).ctx("all_reduce")?;
        let (rank, size) = (format!("rank: {}", r.rank), format!("size: {}", r.size));
        let texts = [
            ("group", format!("{group:?}"), vec![rank.as_str(), size.as_str(), "\"debugged\""]),
            ("Work", format!("{work:?}"), vec!["seq: 1", "AllReduce"]),
            ("Future", format!("{:?}", work.future()), vec!["outputs: 1"]),
        ];
        // Every text is checked before failing, so that one failure names every text that is wrong.
        let mut wrong = Vec::new();
        for (what, text, wants) in &texts {
            if let Some(want) = wants.iter().find(|want| !text.contains(*want)) {
                wrong.push(format!("the {what}'s Debug text does not name `{want}`: {text:?}"));
            }
        }
        work.wait().ctx("wait")?;
        ensure!(wrong.is_empty(), "{}", wrong.join("; "));
        Ok(())
    })
}

/// A communicator aborted by something other than the group (the backend on its own, as after a split's timeout, or
/// a holder of the communicator) while an op waits on its stream behind a kernel: the op may be drained unrun (and its
/// end event pass all the same), so its Work reports `Aborted` through `exception()`, `is_success()`, `wait()` and
/// `.await`, once the kernel is over and again after the op's timeout, never success. The peers' ops, which rank 0's
/// never joins, fail by their timeout; their groups revoke instead of poisoning the device.
fn a_work_whose_communicator_was_aborted_behind_the_group_never_reports_success<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let timeout = Duration::from_millis(400);
        let options =
            Options::builder().revoke_on_error(true).dump_on_timeout(false).watchdog_period(Duration::from_millis(10));
        let group = r.group("0", options)?;
        let buffer = r.filled(1.0, 4)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("the first all_reduce")?;
        r.read(&buffer).ctx("reading the result")?;
        // The communicator exists (made under the group's default timeout); the op below times out quickly.
        group.set_timeout(timeout);
        r.barrier("past the first all_reduce")?;
        if r.rank == 0 {
            r.sleep_current(SLEEP)?;
        }
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("the second all_reduce")?;
        if r.rank == 0 {
            ensure!(group.abort_communicator_behind_the_group("0", "aborted behind the group"), "no communicator '0'");
            let outcomes = |when: &str| -> Check {
                ensure!(work.is_completed(), "{when}: a Work whose communicator was aborted is completed");
                let error = work.exception().ok_or_else(|| format!("{when}: the Work has no error"))?;
                ensure_eq!(error.kind(), ErrorKind::Aborted, "{when}: the Work's error: {error}");
                ensure!(!work.is_success(), "{when}: is_success");
                let waited = work.wait().err().map(|e| e.kind());
                ensure_eq!(waited, Some(ErrorKind::Aborted), "{when}: wait()");
                let awaited = futures::executor::block_on(work.clone().into_future()).err().map(|e| e.kind());
                ensure_eq!(awaited, Some(ErrorKind::Aborted), "{when}: .await");
                Ok(())
            };
            // Nothing asks about the Work until the kernel is over: the stream has drained (or run) the op by then.
            r.host_sleep(SLEEP + Duration::from_millis(60));
            outcomes("past the kernel")?;
            r.host_sleep(timeout);
            outcomes("past the op's timeout")?;
        } else {
            r.host_sleep(SLEEP + Duration::from_millis(60) + timeout);
        }
        r.barrier("rank 0 checked its Work")?;
        group.abort("the case is over");
        Ok(())
    })
}

/// Whether `result` is the refusal of a call needing `capability` on backend `B`: [`ErrorKind::Unsupported`]
/// naming both.
fn refused_for<B: pg_core::Backend, T>(result: pg_core::Result<T>, capability: Capability, what: &str) -> Check {
    let error = result.err().ok_or_else(|| format!("{what}: accepted without the capability '{capability}'"))?;
    ensure_eq!(error.kind(), ErrorKind::Unsupported, "{what}: {error}");
    let text = error.to_string();
    ensure!(text.contains(capability.name()), "{what}: the error does not name the capability: {text}");
    ensure!(text.contains(B::NAME), "{what}: the error does not name the backend: {text}");
    Ok(())
}

fn a_call_needing_a_capability_the_backend_lacks_is_refused_by_name_before_any_store_key<H: Harness>(
    h: &H,
) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let declared = r.device.capabilities();
        // A group of this rank alone, over a store that logs every call: nothing may reach it after creation.
        let prefix = format!("capabilities.{}", r.rank);
        let under = |name: &str| -> Arc<dyn pg_core::store::Store> {
            Arc::new(PrefixStore::new(format!("{prefix}.{name}/"), Arc::clone(&r.store)))
        };
        let log = Arc::new(RecordingStore::new(under("group")));
        let options = Options::builder().group_name(prefix.clone()).build();
        let store: Arc<dyn pg_core::store::Store> = log.clone();
        let group = ProcessGroup::<H::B>::new(store, 0, 1, r.device.clone(), options).ctx("creating a group")?;
        ensure_eq!(group.capabilities(), declared, "the group's capabilities are its device's");
        let mark = log.len();
        let buffer = r.filled(1.0, 4)?;
        let factor = r.filled(1.0, 1)?;
        for capability in Capability::ALL.into_iter().filter(|&c| !declared.has(c)) {
            let what = format!("without '{capability}'");
            match capability {
                Capability::Shrink => {
                    refused_for::<H::B, _>(group.shrink(&[], &ShrinkOptions::default()), capability, "shrink")?;
                }
                Capability::DevicePreMulSum => {
                    let all_reduce = group.all_reduce_pre_mul_sum(&buffer, &factor);
                    refused_for::<H::B, _>(all_reduce, capability, "all_reduce_pre_mul_sum")?;
                    let scatter = group.reduce_scatter_pre_mul_sum(&buffer, &buffer, &factor);
                    refused_for::<H::B, _>(scatter, capability, "reduce_scatter_pre_mul_sum")?;
                }
                Capability::TimingEvents => {
                    // A traced group needs timing events: refused before its store sees anything.
                    let traced = Arc::new(RecordingStore::new(under("traced")));
                    let dir = std::env::temp_dir().join(format!("pg-capabilities-{}-{}", std::process::id(), r.rank));
                    let options = Options::builder().trace_dir(Some(dir)).build();
                    let store: Arc<dyn pg_core::store::Store> = traced.clone();
                    let made = ProcessGroup::<H::B>::new(store, 0, 1, r.device.clone(), options);
                    refused_for::<H::B, _>(made, capability, "a traced group")?;
                    ensure!(traced.is_empty(), "{what}: the traced group touched its store: {:?}", traced.log());
                }
                Capability::Capture => {
                    let stream = r.device.stream_from_pool(false).ctx("a pool stream")?;
                    refused_for::<H::B, _>(
                        stream.begin_capture(CaptureMode::ThreadLocal),
                        capability,
                        "begin_capture",
                    )?;
                }
                Capability::HostCallbacks => {
                    let stream = r.device.current_stream();
                    refused_for::<H::B, _>(stream.launch_host_fn(Box::new(|| ())), capability, "launch_host_fn")?;
                }
                // Without split, grow or revoke the group takes another path (a rendezvous, an abort): nothing
                // is refused.
                _ => {}
            }
            ensure!(log.log_since(mark).is_empty(), "{what}: the store saw {:?}", log.log_since(mark));
        }
        ensure_eq!(group.counters().ops_issued, 0, "a refused call enqueued something");
        ensure_eq!(group.counters().comms_created, 0, "a refused call created a communicator");
        group.shutdown().ctx("shutdown")?;
        Ok(())
    })
}
