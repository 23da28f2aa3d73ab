//! The enqueue path's steady state (the communicator cached, no capture, a healthy group, the watchdog and the
//! flight recorder on) takes none of pg-core's locks and allocates nothing on the calling thread: ARCHITECTURE's
//! invariant, checked on the no-op backend with the testing build's lock count and a per-thread allocation count.

use std::sync::Arc;
use std::time::Duration;

use pg_core::noop::{Noop, NoopBuffer};
use pg_core::store::HashStore;
use pg_core::{locks_taken_on_this_thread, DType, Device as _, Options, ProcessGroup, ReduceOp, WorkHandle};

/// Ops in the measured window: fewer than the in-flight intake holds, so that no op can find it full whatever
/// the watchdog thread does meanwhile.
const WINDOW: usize = 512;

fn group(options: Options) -> (ProcessGroup<Noop>, NoopBuffer) {
    let device = pg_core::noop::NoopDevice::default();
    let group = ProcessGroup::<Noop>::new(Arc::new(HashStore::new()), 0, 1, device.clone(), options).unwrap();
    let buffer = device.alloc(DType::F32, 1024).unwrap();
    (group, buffer)
}

/// `WINDOW` ops whose Works are all alive at once (so that they are `WINDOW` distinct Works), then let go and
/// retired into the reuse pool by one watchdog pass: the steady state after a burst.
fn warm_up(group: &ProcessGroup<Noop>, buffer: &NoopBuffer) {
    let works: Vec<WorkHandle<Noop>> = (0..WINDOW).map(|_| group.all_reduce(buffer, ReduceOp::Sum).unwrap()).collect();
    for work in &works {
        work.wait().unwrap();
    }
    drop(works);
    group.watchdog_pass_now();
}

fn one_op(group: &ProcessGroup<Noop>, buffer: &NoopBuffer) {
    group.all_reduce(buffer, ReduceOp::Sum).and_then(|work| work.wait()).unwrap();
}

fn options(watchdog: bool, trace_buffer: usize) -> Options {
    Options::builder()
        .enable_watchdog(watchdog)
        // Passes of its own only when the intake fills: the window is all the enqueue path's.
        .watchdog_period(Duration::from_secs(3600))
        .trace_buffer_size(trace_buffer)
        .build()
}

#[test]
fn the_steady_state_enqueue_path_takes_no_lock_and_allocates_nothing() {
    for (watchdog, trace_buffer) in [(true, 2000), (false, 2000), (true, 0)] {
        let (group, buffer) = group(options(watchdog, trace_buffer));
        warm_up(&group, &buffer);
        let reused = group.counters().works_reused;
        let locks = locks_taken_on_this_thread();
        let allocations = allocation_counter::measure(|| {
            for _ in 0..WINDOW {
                one_op(&group, &buffer);
            }
        });
        let config = format!("watchdog {watchdog}, flight recorder {trace_buffer}");
        assert_eq!(locks_taken_on_this_thread() - locks, 0, "{config}: locks taken by {WINDOW} ops");
        assert_eq!(allocations.count_total, 0, "{config}: heap allocations by {WINDOW} ops");
        assert_eq!(group.counters().works_reused - reused, WINDOW as u64, "{config}: every op reused a Work");
        assert_eq!(group.counters().intake_overflows, 0, "{config}");
        group.shutdown().unwrap();
    }
}

/// The check above can fail: the path with the flight recorder's record made at enqueue time, or a Work made
/// fresh, shows up in the counts. A group without reuse allocates each op's Work and end event.
#[test]
fn an_op_without_a_pooled_work_is_seen_allocating() {
    let options = Options::builder().reuse_works(false).watchdog_period(Duration::from_secs(3600)).build();
    let (group, buffer) = group(options);
    warm_up(&group, &buffer);
    let allocations = allocation_counter::measure(|| one_op(&group, &buffer));
    assert!(allocations.count_total >= 2, "a fresh Work and its end event: {allocations:?}");
    group.shutdown().unwrap();
}

/// A path that takes a lock is seen taking it: reading the group's flight recorder locks the in-flight list and
/// the recorder's ring.
#[test]
fn a_path_that_locks_is_seen_locking() {
    let (group, buffer) = group(options(true, 2000));
    one_op(&group, &buffer);
    let locks = locks_taken_on_this_thread();
    let _ = group.flight_recorder_json();
    assert!(locks_taken_on_this_thread() - locks >= 2);
    group.shutdown().unwrap();
}

/// Without any reader for longer than the intake holds, the enqueue path moves the intake onto the in-flight list
/// itself, and the flight recorder still lists every op in enqueue order.
#[test]
fn a_full_intake_is_moved_by_the_enqueue_path_and_nothing_is_lost() {
    // More ops than the intake holds (4,096), all of them in the recorder.
    let (group, buffer) = group(options(false, 10_000));
    let ops = 9000;
    for _ in 0..ops {
        one_op(&group, &buffer);
    }
    assert!(group.counters().intake_overflows >= 1);
    let dump: serde_json::Value = serde_json::from_str(&group.flight_recorder_json()).unwrap();
    let seqs: Vec<u64> =
        dump["entries"].as_array().unwrap().iter().map(|entry| entry["collective_seq_id"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=ops).collect::<Vec<u64>>());
    group.shutdown().unwrap();
}

/// With a watchdog, the enqueue path retires the Works already finished itself whenever the intake reaches its
/// mark: a watchdog that runs no pass meanwhile (held) leaves no finished Work tracked, no recorder entry open
/// and the group's last completed collective current. Without it, nothing would be retired until a pass.
#[test]
fn the_enqueue_path_retires_finished_works_while_the_watchdog_runs_no_pass() {
    // Three times the intake (4,096): the mark is reached six times.
    let ops: u64 = 3 * 4096;
    let (group, buffer) = group(options(true, ops as usize));
    let hold = group.hold_watchdog();
    for _ in 0..ops {
        one_op(&group, &buffer);
    }
    let status = group.status();
    let completed = status.last_completed_seq.unwrap_or(0);
    // The ops since the last mark are still in the intake: at most half of it.
    assert!(completed >= ops - 2048, "last completed seq {completed} of {ops}");
    assert!(status.in_flight <= 2048 + 1, "{} Works still tracked", status.in_flight);
    assert_eq!(group.counters().intake_overflows, 0, "the intake never filled");
    let dump: serde_json::Value = serde_json::from_str(&group.flight_recorder_json()).unwrap();
    let entries = dump["entries"].as_array().unwrap();
    let done = entries.iter().filter(|entry| entry["state"] == "completed").count() as u64;
    assert!(done >= ops - 2048, "{done} of {ops} recorder entries completed");
    drop(hold);
    group.shutdown().unwrap();
}
