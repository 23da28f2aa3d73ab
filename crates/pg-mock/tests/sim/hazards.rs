//! Hazard detection: each detectable mistake (a missing or wrong-stream wait, trusting `Future::is_done`, a
//! missing `record_stream`) is reported with its own message, and the correct programs are not.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use pg_core::{Communicator as _, DType, Device as _, Event as _, ReduceOp, Stream as _};
use pg_mock::{HazardKind, HazardMode, MockDevice, MockStream, World, WorldConfig};

use crate::common::comm;

/// What a rank does after the all-reduce on the comm stream (the process group's protocol up to the end event).
type Tail = fn(&mut Setup);

/// The state a case's tail works with.
struct Setup {
    device: MockDevice,
    current: MockStream,
    other: MockStream,
    buffer: Option<pg_mock::MockBuffer>,
    end: pg_mock::MockEvent,
}

/// Runs the protocol on 2 ranks with `record_stream` or not, then `tail`; returns rank 0's hazards (kind, message).
fn run(record_stream: bool, tail: Tail) -> Vec<(HazardKind, String)> {
    let w = World::new(WorldConfig { hazard_mode: HazardMode::Record, ..WorldConfig::with_devices(2) });
    let store = w.store();
    w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let current = device.current_stream();
        let comm_stream = device.stream_from_pool(false).unwrap();
        let other = device.stream_from_pool(false).unwrap();
        let buffer = device.alloc(DType::F32, 256).unwrap();
        device.fill(&buffer, rank as f64, &current).unwrap();
        device.sleep_kernel(&current, Duration::from_millis(5)).unwrap();
        let ready = device.create_event();
        ready.record(&current).unwrap();
        comm_stream.wait_event(&ready).unwrap();
        c.all_reduce(&buffer, &buffer, ReduceOp::Sum, &comm_stream).unwrap();
        if record_stream {
            device.record_stream(&buffer, &comm_stream).unwrap();
        }
        let end = device.create_event();
        end.record(&comm_stream).unwrap();
        let mut setup = Setup { device, current, other, buffer: Some(buffer), end };
        tail(&mut setup);
        setup.device.synchronize().unwrap();
    });
    w.hazards().into_iter().filter(|h| h.device == 0).map(|h| (h.kind, h.message)).collect()
}

fn buffer(s: &Setup) -> &pg_mock::MockBuffer {
    s.buffer.as_ref().unwrap()
}

/// Checks that `tail` yields exactly the hazard kinds `expected`, each message containing its fragments.
fn check(name: &str, record_stream: bool, tail: Tail, expected: &[(HazardKind, &[&str])]) {
    let got = run(record_stream, tail);
    assert_eq!(got.len(), expected.len(), "case '{name}': {got:#?}");
    for ((kind, message), (want_kind, fragments)) in got.iter().zip(expected) {
        assert_eq!(kind, want_kind, "case '{name}': {message}");
        for f in *fragments {
            assert!(message.contains(f), "case '{name}': {message:?} lacks {f:?}");
        }
    }
}

#[test]
fn correct_programs_are_not_reported() {
    check(
        "wait on the current stream, read there",
        true,
        |s| {
            s.current.wait_event(&s.end).unwrap();
            s.device.copy_to_host(buffer(s), &s.current).unwrap();
        },
        &[],
    );
    check(
        "wait on the stream that reads",
        true,
        |s| {
            s.other.wait_event(&s.end).unwrap();
            s.device.copy_to_host(buffer(s), &s.other).unwrap();
        },
        &[],
    );
    check(
        "host synchronises with the end event, then any stream reads",
        true,
        |s| {
            s.end.synchronize().unwrap();
            s.device.copy_to_host(buffer(s), &s.other).unwrap();
        },
        &[],
    );
    check(
        "blocking wait: poll the end event, then any stream reads",
        true,
        |s| {
            while !s.end.query().unwrap() {
                s.device.sleep(Duration::from_millis(1), &AtomicBool::new(false));
            }
            s.device.copy_to_host(buffer(s), &s.other).unwrap();
        },
        &[],
    );
    check(
        "device synchronize (too broad, but correct)",
        false,
        |s| {
            s.device.synchronize().unwrap();
            s.device.fill(buffer(s), 3.0, &s.other).unwrap();
        },
        &[],
    );
    check(
        "write on the current stream after waiting",
        true,
        |s| {
            s.current.wait_event(&s.end).unwrap();
            s.device.fill(buffer(s), 1.0, &s.current).unwrap();
        },
        &[],
    );
}

const WAIT_HINT: &str = "missing Work::wait on this stream, or wait on the wrong stream";
const FUTURE_HINT: &str = "Future::is_done() only means the outputs were marked, not that the GPU finished";

#[test]
fn unordered_accesses_are_reported() {
    check("read on another stream after waiting on the current one", true, |s| {
        s.current.wait_event(&s.end).unwrap();
        s.device.copy_to_host(buffer(s), &s.other).unwrap();
    }, &[(HazardKind::ReadAfterWrite, &[
        "hazard on rank 0: read of buffer #1 by copy_to_host on stream 2 is not ordered after its write by all_reduce \
         (op 0 on communicator 0) on stream 1",
        WAIT_HINT,
    ])]);
    check(
        "no wait at all (trusting Future::is_done)",
        true,
        |s| {
            s.device.copy_to_host(buffer(s), &s.current).unwrap();
        },
        &[(HazardKind::ReadAfterWrite, &["read of buffer #1 by copy_to_host on stream 0", FUTURE_HINT])],
    );
    check(
        "overwriting the input while the collective may still read it",
        true,
        |s| {
            s.device.fill(buffer(s), 7.0, &s.other).unwrap();
        },
        &[(HazardKind::WriteAfterWrite, &["write of buffer #1 by fill on stream 2", WAIT_HINT])],
    );
    check(
        "a stream synchronize orders only that stream's work",
        true,
        |s| {
            s.current.synchronize().unwrap();
            s.device.copy_to_host(buffer(s), &s.other).unwrap();
        },
        &[(HazardKind::ReadAfterWrite, &["copy_to_host on stream 2"])],
    );
}

#[test]
fn overwriting_an_input_still_being_read_is_reported() {
    let w = World::new(WorldConfig { hazard_mode: HazardMode::Record, ..WorldConfig::with_devices(2) });
    let store = w.store();
    w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let current = device.current_stream();
        let comm_stream = device.stream_from_pool(false).unwrap();
        let input = device.alloc(DType::F32, 16).unwrap();
        let output = device.alloc(DType::F32, 16).unwrap();
        device.fill(&input, 1.0, &current).unwrap();
        let ready = device.create_event();
        ready.record(&current).unwrap();
        comm_stream.wait_event(&ready).unwrap();
        c.all_reduce(&input, &output, ReduceOp::Sum, &comm_stream).unwrap();
        // The next step's producer writes the input on the current stream without waiting for the collective.
        device.fill(&input, 2.0, &current).unwrap();
        device.synchronize().unwrap();
    });
    let hazards: Vec<_> = w.hazards().into_iter().filter(|h| h.device == 0).collect();
    assert_eq!(hazards.len(), 1, "{hazards:#?}");
    assert_eq!(hazards[0].kind, HazardKind::WriteAfterRead);
    let expected = "write of buffer #1 by fill on stream 0 is not ordered after its read by all_reduce (op 0 on \
                    communicator 0) on stream 1: the reader may still be using the old contents";
    assert!(hazards[0].message.contains(expected), "{}", hazards[0].message);
}

#[test]
fn reusing_memory_a_stream_may_still_use_is_reported() {
    check(
        "free without record_stream",
        false,
        |s| {
            assert!(reuse_after_free(s), "the block is reused at once");
        },
        &[(
            HazardKind::ReuseWhileInUse,
            &["hazard on rank 0: memory of buffer #1 was reused by a new allocation (buffer #2) on stream 0 while \
         all_reduce (op 0 on communicator 0) on stream 1 may still use it: missing record_stream (or keep the buffer \
         alive until the Work completes)"],
        )],
    );
    check(
        "free with record_stream: not reused while the collective runs",
        true,
        |s| {
            assert!(!reuse_after_free(s), "a fresh block is allocated");
        },
        &[],
    );
    check(
        "free with record_stream after the collective finished: reused",
        true,
        |s| {
            s.end.synchronize().unwrap();
            assert!(reuse_after_free(s), "the block is reused");
        },
        &[],
    );
}

/// Drops the last handle of the setup's buffer and allocates the same size on the current stream; returns
/// whether the allocator reused the memory (the new buffer has the old one's address).
fn reuse_after_free(s: &mut Setup) -> bool {
    let old = s.buffer.take().unwrap();
    let address = old.address();
    drop(old);
    let fresh = s.device.alloc(DType::F32, 256).unwrap();
    s.device.fill(&fresh, 9.0, &s.current).unwrap();
    fresh.address() == address
}

#[test]
fn panic_mode_panics_with_the_message() {
    let w = World::new(WorldConfig::with_devices(1));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        w.run(1, |_, d| {
            let a = d.current_stream();
            let b = d.stream_from_pool(false).unwrap();
            let buf = d.alloc(DType::I32, 8).unwrap();
            d.fill(&buf, 1.0, &a).unwrap();
            d.fill(&buf, 2.0, &b).unwrap();
        });
    }));
    let payload = result.unwrap_err();
    let message = payload.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("write of buffer #1 by fill on stream 1 is not ordered after its write by fill on stream 0"),
        "{message}"
    );
}

/// Runs an all-reduce on a buffer without `record_stream` and hands a handle of it to a keeper thread, which
/// drops it after it `observes` the end event complete (or at once). The rank, which never observes the op, drops
/// its own handle before the keeper lets go, or after it (`caller_drops_last`, the stash pattern: the Work's
/// stash is released by the watchdog and the caller's handle goes later); then it allocates the same size.
/// Returns rank 0's hazard kinds and whether the memory was reused.
fn free_with_a_keeper(observes: bool, caller_drops_last: bool) -> (Vec<HazardKind>, bool) {
    let w = World::new(WorldConfig { hazard_mode: HazardMode::Record, ..WorldConfig::with_devices(2) });
    let store = w.store();
    let reused = w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let current = device.current_stream();
        let comm_stream = device.stream_from_pool(false).unwrap();
        let buffer = device.alloc(DType::F32, 64).unwrap();
        let address = buffer.address();
        c.all_reduce(&buffer, &buffer, ReduceOp::Sum, &comm_stream).unwrap();
        let end = device.create_event();
        end.record(&comm_stream).unwrap();
        let kept = buffer.clone();
        let caller = caller_drops_last.then_some(buffer);
        let helper = {
            let device = device.clone();
            let store = Arc::clone(&store);
            device.clone().spawn_host_thread(
                "keeper",
                Box::new(move || {
                    while observes && !end.query().unwrap() {
                        device.sleep(Duration::from_micros(100), &AtomicBool::new(false));
                    }
                    drop(kept);
                    store.set(&format!("freed{rank}"), b"1").unwrap();
                }),
            )
        }
        .unwrap();
        // Wait inside the simulation (a real join would stop the clock while the keeper polls); the store
        // carries no ordering of device work.
        store.get(&format!("freed{rank}")).unwrap();
        helper.join().unwrap();
        drop(caller);
        let fresh = device.alloc(DType::F32, 64).unwrap();
        device.fill(&fresh, 1.0, &current).unwrap();
        device.synchronize().unwrap();
        fresh.address() == address
    });
    (w.hazards().into_iter().filter(|h| h.device == 0).map(|h| h.kind).collect(), reused[0])
}

#[test]
fn a_free_after_observed_completion_is_safe_for_any_allocating_thread() {
    assert_eq!(free_with_a_keeper(true, false), (vec![], true));
    assert_eq!(free_with_a_keeper(false, false), (vec![HazardKind::ReuseWhileInUse], true));
}

#[test]
fn the_last_handle_dropped_after_an_observer_let_go_frees_safely() {
    // The observer's drop is ordered before the caller's last drop (a reference count orders them): safe.
    assert_eq!(free_with_a_keeper(true, true), (vec![], true));
    // Nobody observed the op: the reuse is still a hazard.
    assert_eq!(free_with_a_keeper(false, true), (vec![HazardKind::ReuseWhileInUse], true));
}
