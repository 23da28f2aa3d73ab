//! Regression tests for defects found by using the process group the way a careless or hostile caller would:
//! a timed-out collective whose output is read anyway, a peer that never joins a blocking creation, two groups
//! sharing one store prefix, and an absurd world size. Each case is a small self-contained function.

use std::sync::Arc;
use std::time::Duration;

use pg_core::{
    CommConfig, DType, Device as _, Error, ErrorHandling, ErrorKind, Options, OptionsBuilder, ProcessGroup, ReduceOp,
    Stream as _,
};
use pg_mock::{Mock, MockBuffer, MockDevice, World, WorldConfig};
use pg_store::{PrefixStore, Store};

/// The group timeout of these cases.
const TIMEOUT: Duration = Duration::from_secs(1);

/// A world of `devices` devices that gives up (panics with a report) after 2 minutes of virtual time, so that
/// a hang turns into a quick test failure.
fn world(devices: usize) -> World {
    World::new(WorldConfig { time_limit: Duration::from_secs(120), ..WorldConfig::with_devices(devices) })
}

fn options() -> OptionsBuilder {
    Options::builder().timeout(TIMEOUT).dump_on_timeout(false)
}

fn group(
    store: &Arc<dyn Store>,
    prefix: &str,
    rank: usize,
    size: usize,
    device: &MockDevice,
    options: Options,
) -> Result<ProcessGroup<Mock>, Error> {
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(prefix, Arc::clone(store)));
    ProcessGroup::new(store, rank, size, device.clone(), options)
}

fn filled(device: &MockDevice, numel: usize, value: f64) -> MockBuffer {
    let buffer = device.alloc(DType::F32, numel).expect("alloc");
    device.fill(&buffer, value, &device.current_stream()).expect("fill");
    buffer
}

fn read(device: &MockDevice, buffer: &MockBuffer) -> Result<Vec<f64>, Error> {
    device.copy_to_host(buffer, &device.current_stream()).map(|bytes| pg_mock::decode(DType::F32, &bytes))
}

// ===== a timed-out collective whose output is read =====

/// What rank 0 saw: rank 1 skips an all_reduce, rank 0 waits on it (which returns at once) and reads the output
/// on its current stream, as the README's example does.
#[derive(Debug)]
struct ReadAfterTimeout {
    wait: Result<(), ErrorKind>,
    read: Result<Vec<f64>, Error>,
    /// When the read returned, from the op's enqueue.
    read_after: Duration,
    /// The Work's own host synchronisation (its end event), after the read.
    event_sync: Result<(), ErrorKind>,
    stream_sync: Result<(), ErrorKind>,
    device_sync: Result<(), ErrorKind>,
    aborted_comms: usize,
    torn_down: bool,
}

fn read_after_timeout(mode: ErrorHandling, end_process: bool) -> ReadAfterTimeout {
    let world = world(2);
    let store = world.store();
    let opts = options().error_handling(mode).end_process_on_error(end_process).build();
    let mut ranks = world.run(2, move |rank, device| {
        let pg = group(&store, "read", rank, 2, &device, opts.clone()).expect("group");
        let buffer = filled(&device, 4, 1.0);
        pg.all_reduce_sync(&buffer, ReduceOp::Sum).expect("a first all_reduce");
        if rank == 1 {
            // Rank 1 finishes the first all_reduce, then skips the next one, keeping its group until rank 0 is done
            // (dropping it would abort its communicator).
            read(&device, &buffer).expect("rank 1's read");
            store.wait(&["read-done"], Some(Duration::from_secs(100))).expect("rank 0 is done");
            return None;
        }
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).expect("the all_reduce rank 1 skips");
        let wait = work.wait().map_err(|e| e.kind());
        let read = read(&device, &buffer);
        let read_after = device.now().saturating_sub(work.start_time());
        let event_sync = work.synchronize().map_err(|e| e.kind());
        let stream_sync = device.current_stream().synchronize().map_err(|e| e.kind());
        // A device synchronisation would wait for the comm stream too: it must not block where nothing drains it.
        let device_sync = device.synchronize().map_err(|e| e.kind());
        // The watchdog finishes handling the error before virtual time moves on.
        device.sleep(Duration::from_millis(1), &std::sync::atomic::AtomicBool::new(false));
        let status = pg.status();
        let torn_down = pg.error().is_some();
        pg.abort("end of the case");
        store.set("read-done", b"1").expect("set");
        Some(ReadAfterTimeout {
            wait,
            read,
            read_after,
            event_sync,
            stream_sync,
            device_sync,
            aborted_comms: status.aborted_comms,
            torn_down,
        })
    });
    ranks.swap_remove(0).expect("rank 0's view")
}

/// In every mode the read fails with the work timeout, at the timeout (within a watchdog period), instead of
/// blocking forever (modes 0 and 3) or returning the un-reduced input (modes 1 and 2).
fn check_read_after_timeout(mode: ErrorHandling, aborts: bool, tears_down: bool) {
    let seen = read_after_timeout(mode, false);
    assert_eq!(seen.wait, Ok(()), "{mode:?}: wait() only orders the stream");
    match &seen.read {
        Err(Error::WorkTimeout { seq: 2, .. }) => {}
        other => panic!("{mode:?}: the read after a timed-out all_reduce gave {other:?}, not its WorkTimeout"),
    }
    let period = Duration::from_millis(100);
    assert!(
        seen.read_after >= TIMEOUT && seen.read_after <= TIMEOUT + 2 * period,
        "{mode:?}: the read returned {:?} after the op",
        seen.read_after
    );
    for (what, result) in [("event", seen.event_sync), ("stream", seen.stream_sync), ("device", seen.device_sync)] {
        assert_eq!(result, Err(ErrorKind::WorkTimeout), "{mode:?}: {what} synchronize on the poisoned device");
    }
    assert_eq!(seen.aborted_comms > 0, aborts, "{mode:?}: {} communicators aborted", seen.aborted_comms);
    assert_eq!(seen.torn_down, tears_down, "{mode:?}: torn down");
}

#[test]
fn a1_mode0_no_handling_read_after_timeout_fails_instead_of_hanging() {
    check_read_after_timeout(ErrorHandling::NoHandling, false, false);
}

#[test]
fn a1_mode1_tear_down_read_after_timeout_fails_instead_of_returning_the_input() {
    check_read_after_timeout(ErrorHandling::TearDown, true, true);
}

#[test]
fn a1_mode2_clean_up_only_read_after_timeout_fails_instead_of_returning_the_input() {
    check_read_after_timeout(ErrorHandling::CleanUpOnly, true, false);
}

#[test]
fn a1_mode3_default_read_after_timeout_fails_and_the_streams_drain() {
    check_read_after_timeout(ErrorHandling::SkipCleanUp, true, true);
}

#[test]
fn a1_a_cleared_failure_record_lets_a_new_group_read_again() {
    let world = world(2);
    let store = world.store();
    let opts = options().error_handling(ErrorHandling::SkipCleanUp).build();
    let results = world.run(2, move |rank, device| {
        let first = group(&store, "first", rank, 2, &device, opts.clone()).expect("group");
        let buffer = filled(&device, 4, 1.0);
        first.all_reduce_sync(&buffer, ReduceOp::Sum).expect("a first all_reduce");
        if rank == 0 {
            first.all_reduce_sync(&buffer, ReduceOp::Sum).expect("the all_reduce rank 1 skips");
            assert!(read(&device, &buffer).is_err(), "the failed op's output is not readable");
            store.set("failed", b"1").expect("set");
        } else {
            store.wait(&["failed"], None).expect("rank 0 failed");
        }
        drop(first);
        let record = device.poison().clear();
        let second = group(&store, "second", rank, 2, &device, opts.clone()).expect("group");
        let values = filled(&device, 4, (rank + 1) as f64);
        second.all_reduce_sync(&values, ReduceOp::Sum).expect("the new group's all_reduce");
        let read = read(&device, &values).expect("reads work again");
        second.shutdown().expect("shutdown");
        (record.map(|e| e.kind()), read)
    });
    assert_eq!(results[0].0, Some(ErrorKind::WorkTimeout), "rank 0's device held the timeout");
    assert_eq!(results[1].0, None, "rank 1's device never failed");
    for (rank, (_, read)) in results.iter().enumerate() {
        assert_eq!(read, &vec![3.0; 4], "rank {rank}");
    }
}

/// The child half of [`a1_end_process_on_error_ends_the_process_like_pytorch`]: set in its environment.
const END_PROCESS_CHILD: &str = "PG_DEFECTS_END_PROCESS_CHILD";

#[test]
fn a1_end_process_on_error_ends_the_process_like_pytorch() {
    if std::env::var_os(END_PROCESS_CHILD).is_some() {
        let seen = read_after_timeout(ErrorHandling::SkipCleanUp, true);
        panic!("the process should have ended at the timeout; it went on and saw {seen:?}");
    }
    let exe = std::env::current_exe().expect("the test binary");
    let output = std::process::Command::new(exe)
        .args(["a1_end_process_on_error_ends_the_process_like_pytorch", "--exact", "--nocapture", "--test-threads=1"])
        .env(END_PROCESS_CHILD, "1")
        .output()
        .expect("running the child");
    let stderr = String::from_utf8_lossy(&output.stderr);
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(output.status.signal(), Some(6), "ended by SIGABRT, as PyTorch's watchdog does: {stderr}");
    }
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("collective operation timeout"), "the error is printed before the end: {stderr}");
    assert!(!stderr.contains("should have ended"), "{stderr}");
}

// ===== blocking communicator creation with a peer that never joins =====

#[test]
fn a2_blocking_creation_times_out_when_a_peer_never_joins() {
    // Rank 0 publishes the unique id and joins; rank 1 never does.
    let world = world(2);
    let store = world.store();
    let opts = options().build();
    let results = world.run(2, move |rank, device| {
        let pg = group(&store, "join", rank, 2, &device, opts.clone()).expect("group");
        if rank == 1 {
            return None;
        }
        let buffer = filled(&device, 4, 1.0);
        let start = device.now();
        let error = pg.all_reduce(&buffer, ReduceOp::Sum).map(drop).expect_err("no peer, no communicator");
        Some((error, device.now().saturating_sub(start), pg.initializing_keys()))
    });
    let (error, after, initializing) = results[0].clone().expect("rank 0");
    assert_eq!(error.kind(), ErrorKind::InitTimeout, "{error}");
    assert!(error.is_timeout());
    assert!(after >= TIMEOUT && after <= TIMEOUT + Duration::from_millis(10), "failed after {after:?}");
    assert!(error.to_string().contains("communicator '0'"), "{error}");
    assert!(initializing.is_empty(), "nothing left initializing: {initializing:?}");
}

#[test]
fn a2_waiting_for_a_unique_id_that_never_comes_times_out_at_the_group_timeout() {
    // Rank 1 waits for the id that rank 0, which never runs the op, would publish; the store's own timeout is
    // far longer than the group's.
    let world = world(2);
    let store = world.store();
    store.set_timeout(Duration::from_secs(60));
    let opts = options().build();
    let results = world.run(2, move |rank, device| {
        let pg = group(&store, "id", rank, 2, &device, opts.clone()).expect("group");
        if rank == 0 {
            return None;
        }
        let buffer = filled(&device, 4, 1.0);
        let start = device.now();
        let error = pg.all_reduce(&buffer, ReduceOp::Sum).map(drop).expect_err("no id, no communicator");
        Some((error, device.now().saturating_sub(start)))
    });
    let (error, after) = results[1].clone().expect("rank 1");
    assert_eq!(error.kind(), ErrorKind::InitTimeout, "{error}");
    assert!(after >= TIMEOUT && after <= TIMEOUT + Duration::from_millis(10), "failed after {after:?}");
    assert!(error.to_string().contains("unique id never appeared"), "{error}");
}

#[test]
fn a2_the_mock_bounds_a_blocking_join_by_the_config_timeout() {
    let world = world(2);
    let results = world.run(1, |_, device| {
        let id = device.new_unique_id().expect("id");
        let config = CommConfig { timeout: Some(TIMEOUT), ..CommConfig::default() };
        let start = device.now();
        let error = device.create_communicator(&id, 2, 0, &config).map(drop).expect_err("rank 1 never joins");
        (error.kind(), device.now().saturating_sub(start))
    });
    assert_eq!(results[0].0, ErrorKind::InitTimeout);
    assert!(results[0].1 >= TIMEOUT && results[0].1 <= TIMEOUT + Duration::from_millis(1), "{:?}", results[0].1);
}

// ===== two groups on one store prefix =====

#[test]
fn a3_two_groups_on_one_store_prefix_fail_instead_of_pairing_across_groups() {
    // Every rank creates groups A then B on the same prefix; rank 0 uses A first, rank 1 uses B first.
    let world = world(2);
    let store = world.store();
    let opts = options().build();
    let results = world.run(2, move |rank, device| {
        let a = group(&store, "shared", rank, 2, &device, opts.clone()).expect("group A");
        let b = group(&store, "shared", rank, 2, &device, opts.clone()).expect("group B");
        let in_a = filled(&device, 4, (rank + 1) as f64);
        let in_b = filled(&device, 4, 100.0 * (rank + 1) as f64);
        let run = |pg: &ProcessGroup<Mock>, buffer: &MockBuffer| {
            pg.all_reduce_sync(buffer, ReduceOp::Sum).and_then(|()| read(&device, buffer))
        };
        let (a_result, b_result) = match rank {
            0 => {
                let a = run(&a, &in_a);
                (a, run(&b, &in_b))
            }
            _ => {
                let b = run(&b, &in_b);
                (run(&a, &in_a), b)
            }
        };
        // The colliding group is torn down: a later op fails at once with the same error.
        let again = b.all_reduce(&in_b, ReduceOp::Sum).map(drop).map_err(|e| e.kind());
        (a_result, b_result, again)
    });
    for (rank, (a, b, again)) in results.into_iter().enumerate() {
        assert_eq!(again, Err(ErrorKind::PrefixCollision), "rank {rank}: group B after the collision");
        assert_eq!(a.expect("group A, whose id was published first, works"), vec![3.0; 4], "rank {rank}");
        let error = b.expect_err("group B shares A's prefix");
        assert_eq!(error.kind(), ErrorKind::PrefixCollision, "rank {rank}: {error}");
        let message = error.to_string();
        assert!(message.contains("store prefix 'shared/'"), "the prefix is named: {message}");
        assert!(message.contains("store key '0'"), "rank {rank}: {message}");
    }
}

// ===== absurd sizes =====

#[test]
fn a4_an_absurd_world_size_is_refused_by_name() {
    let world = world(1);
    let store = world.store();
    let results = world.run(1, move |_, device| {
        [1usize << 62, i32::MAX as usize + 1, usize::MAX]
            .map(|size| group(&store, "huge", 0, size, &device, options().build()).map(drop).map_err(|e| e.to_string()))
    });
    for result in &results[0] {
        let message = result.as_ref().expect_err("an absurd size is refused");
        assert!(message.starts_with("invalid argument") && message.contains("size"), "{message}");
    }
}

#[test]
fn a4_the_largest_world_size_a_communicator_can_have_is_accepted() {
    let world = world(1);
    let store = world.store();
    let results = world.run(1, move |_, device| {
        // NCCL's int holds i32::MAX ranks: a group that large is made (lazily: no communicator yet).
        let group = group(&store, "largest", 0, i32::MAX as usize, &device, options().build());
        group.map(|group| (group.size(), group.shutdown())).map_err(|e| e.to_string())
    });
    let (size, shutdown) = results[0].as_ref().expect("a group of i32::MAX ranks is made");
    assert_eq!(*size, i32::MAX as usize);
    assert!(shutdown.is_ok(), "{shutdown:?}");
}

#[test]
fn a4_the_mock_refuses_a_communicator_of_absurd_size() {
    let world = world(1);
    let kinds = world.run(1, |_, device| {
        let id = device.new_unique_id().expect("id");
        device.create_communicator(&id, 1 << 62, 0, &CommConfig::default()).map(drop).map_err(|e| e.kind())
    });
    assert_eq!(kinds[0], Err(ErrorKind::InvalidArgument));
}

#[test]
fn a3_the_groups_of_one_split_rendezvous_under_keys_of_their_own() {
    // Two colors, each group running an all_reduce at once: they must not meet on one unique-id key.
    let world = world(4);
    let store = world.store();
    let sums = world.run(4, move |rank, device| {
        let all = group(&store, "split", rank, 4, &device, options().build()).expect("group");
        let color = if rank == 0 || rank == 3 { 7 } else { 1 };
        let split = all.split_by_color(Some(color), options().build()).expect("split").expect("a member");
        let buffer = filled(&device, 4, (rank + 1) as f64);
        split.all_reduce_sync(&buffer, ReduceOp::Sum).expect("the split group's all_reduce");
        read(&device, &buffer).expect("read")[0]
    });
    assert_eq!(sums, vec![5.0, 5.0, 5.0, 5.0], "ranks 0+3 give 1+4, ranks 1+2 give 2+3");
}
