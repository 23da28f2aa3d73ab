//! Injected faults: a rank that never joins, a slow rank, an async error, a hang, an abort during an op.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use pg_core::{CommConfig, Communicator as _, DType, Device as _, ErrorKind, Event as _, ReduceOp, Stream as _};
use pg_mock::{Fault, MockCommunicator, MockDevice, World, WorldConfig};

use crate::common::comm;

const MS: Duration = Duration::from_millis(1);

fn faulty(n: usize, faults: Vec<Fault>) -> World {
    World::new(WorldConfig { faults, ..WorldConfig::with_devices(n) })
}

/// A watchdog: polls `done` every millisecond and aborts `comm` once `timeout` has passed since it started.
fn watchdog(device: &MockDevice, comm: Arc<MockCommunicator>, done: Arc<pg_mock::MockEvent>, timeout: Duration) {
    let d = device.clone();
    let never = AtomicBool::new(false);
    let handle = device
        .spawn_host_thread(
            "watchdog",
            Box::new(move || {
                let start = d.now();
                while !done.query().unwrap() {
                    if d.now() - start >= timeout {
                        comm.abort("watchdog: timeout").unwrap();
                        return;
                    }
                    d.sleep(MS, &never);
                }
            }),
        )
        .unwrap();
    drop(handle);
}

#[test]
fn a_rank_that_never_joins_leaves_a_nonblocking_init_unready_until_abort() {
    let w = faulty(2, vec![Fault::NeverJoin { rank: 1 }]);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        let id = if rank == 0 {
            let id = device.new_unique_id().unwrap();
            store.set("id", &id.0).unwrap();
            id
        } else {
            pg_core::UniqueId(store.get("id").unwrap())
        };
        let config = CommConfig { nonblocking: true, description: "pg0".into(), ..Default::default() };
        let c = device.create_communicator(&id, 2, rank, &config).unwrap();
        let start = device.now();
        while !c.is_ready().unwrap() {
            if device.now() - start > Duration::from_secs(10) {
                c.abort("init timeout").unwrap();
                return (device.now() - start, c.is_ready().unwrap_err().kind());
            }
            device.sleep(10 * MS, &AtomicBool::new(false));
        }
        (Duration::ZERO, ErrorKind::Backend)
    });
    for (waited, kind) in got {
        assert_eq!(kind, ErrorKind::Aborted);
        assert!(waited > Duration::from_secs(10) && waited < Duration::from_secs(11), "{waited:?}");
    }
    assert_eq!(w.communicators_created(), 2);
}

/// The end time of the all-reduce on device 0, with `faults`.
fn all_reduce_end(faults: Vec<Fault>) -> Duration {
    let w = faulty(2, faults);
    let store = w.store();
    w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let b = device.alloc(DType::F32, 16).unwrap();
        c.all_reduce(&b, &b, ReduceOp::Sum, &device.current_stream()).unwrap();
        device.synchronize().unwrap();
    });
    w.kernel_log(0).iter().find(|k| k.name == "all_reduce").unwrap().end
}

#[test]
fn a_slow_rank_delays_everyone() {
    let normal = all_reduce_end(vec![]);
    let slow = all_reduce_end(vec![Fault::SlowRank { rank: 1, extra: 3 * MS }]);
    assert_eq!(slow - normal, 3 * MS);
}

#[test]
fn an_async_error_appears_after_k_ops_and_later_ops_hang_until_abort() {
    let w = faulty(2, vec![Fault::AsyncError { rank: 1, after_ops: 2 }]);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        let c = Arc::new(comm(&store, "id", &device, rank, 2));
        let s = device.current_stream();
        let b = device.alloc(DType::F32, 16).unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
            s.synchronize().unwrap();
            seen.push(c.async_error().is_ok());
        }
        c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
        let done = Arc::new(device.create_event());
        done.record(&s).unwrap();
        watchdog(&device, Arc::clone(&c), Arc::clone(&done), 100 * MS);
        s.synchronize().unwrap();
        let error = c.async_error();
        (seen, error.is_ok(), c.is_aborted(), c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap_err().kind())
    });
    assert_eq!(got[1].0, vec![true, false], "rank 1 sees the error once its 2nd op finished");
    assert_eq!(got[0].0, vec![true, true], "rank 0's communicator is healthy");
    for (_, _, aborted, later) in &got {
        assert!(aborted);
        assert_eq!(*later, ErrorKind::Aborted);
    }
}

#[test]
fn a_hung_collective_is_released_by_abort_from_another_thread() {
    let w = faulty(2, vec![Fault::HangAt { rank: 0, op: 1 }]);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        let c = Arc::new(comm(&store, "id", &device, rank, 2));
        let s = device.current_stream();
        let b = device.alloc(DType::F32, 16).unwrap();
        c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
        c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
        let done = Arc::new(device.create_event());
        done.record(&s).unwrap();
        let start = device.now();
        watchdog(&device, Arc::clone(&c), Arc::clone(&done), 500 * MS);
        s.synchronize().unwrap();
        (device.now() - start, c.is_aborted())
    });
    for (waited, aborted) in got {
        assert!(aborted);
        assert!(waited >= 500 * MS && waited < 510 * MS, "{waited:?}");
    }
}

#[test]
fn a_rank_that_never_arrives_times_out_in_the_store() {
    let w = faulty(2, vec![]);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        if rank == 1 {
            return None; // rank 1 exits without publishing anything
        }
        store.set_timeout(Duration::from_secs(60));
        Some((store.get("rank1/ready").unwrap_err().to_string(), device.now()))
    });
    let (message, now) = got[0].clone().unwrap();
    assert_eq!(message, "wait timeout after 60000ms, keys: rank1/ready");
    assert_eq!(now, Duration::from_secs(60));
}

#[test]
fn an_abort_during_an_op_ends_it_and_fails_later_ops() {
    let w = faulty(2, vec![Fault::AbortDuringOp { rank: 0, op: 0, after: 2 * MS }]);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        let c = Arc::new(comm(&store, "id", &device, rank, 2));
        let s = device.current_stream();
        let b = device.alloc(DType::F32, 16).unwrap();
        let before = (c.is_aborted(), device.now());
        c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
        let done = Arc::new(device.create_event());
        done.record(&s).unwrap();
        if rank == 1 {
            // Rank 1's part never completes: its own watchdog aborts it.
            watchdog(&device, Arc::clone(&c), Arc::clone(&done), 10 * MS);
        }
        s.synchronize().unwrap();
        let waited = device.now() - before.1;
        let later = c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap_err();
        (before.0, waited, c.is_aborted(), later.to_string())
    });
    let (aborted_before, waited, aborted_after, later) = &got[0];
    assert!(!aborted_before && *aborted_after);
    assert!(*waited >= 2 * MS && *waited < 3 * MS, "rank 0 is released by the injected abort: {waited:?}");
    assert!(later.contains("aborted during operation 0"), "{later}");
    assert!(got[1].1 >= 10 * MS, "rank 1 waits for its own watchdog: {:?}", got[1].1);
}
