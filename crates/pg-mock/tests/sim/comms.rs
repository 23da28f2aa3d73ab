//! Communicator life cycle: blocking and non-blocking init in virtual time, point-to-point matching in order,
//! finalize, and the creation counter.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use pg_core::{CommConfig, Communicator as _, DType, Device as _, Event as _, ReduceOp};

use crate::common::{buffer, comm, read, world};

const INIT: Duration = Duration::from_millis(50);

#[test]
fn blocking_init_returns_when_the_last_rank_joined_plus_the_init_cost() {
    let w = world(3);
    let store = w.store();
    let got = w.run(3, move |rank, device| {
        // Ranks arrive 0, 10 and 20 ms late.
        device.sleep(Duration::from_millis(10 * rank as u64), &AtomicBool::new(false));
        let id = match rank {
            0 => {
                let id = device.new_unique_id().unwrap();
                store.set("id", &id.0).unwrap();
                id
            }
            _ => pg_core::UniqueId(store.get("id").unwrap()),
        };
        assert_eq!(id.0.len(), 128);
        let joined = device.now();
        device.create_communicator(&id, 3, rank, &CommConfig::default()).unwrap();
        (joined, device.now())
    });
    let last_join = got.iter().map(|(j, _)| *j).max().unwrap();
    for (_, ready) in &got {
        assert_eq!(*ready, last_join + INIT);
    }
    assert_eq!(w.communicators_created(), 3);
}

#[test]
fn nonblocking_init_becomes_ready_after_the_init_cost() {
    let w = world(2);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        let id = match rank {
            0 => {
                let id = device.new_unique_id().unwrap();
                store.set("id", &id.0).unwrap();
                id
            }
            _ => pg_core::UniqueId(store.get("id").unwrap()),
        };
        let config = CommConfig { nonblocking: true, description: "test".into(), ..Default::default() };
        let c = device.create_communicator(&id, 2, rank, &config).unwrap();
        let start = device.now();
        let mut polls = 0;
        while !c.is_ready().unwrap() {
            polls += 1;
            device.sleep(Duration::from_millis(1), &AtomicBool::new(false));
        }
        (device.now() - start, polls)
    });
    for (waited, polls) in got {
        assert!(waited >= INIT - Duration::from_millis(1) && waited <= INIT + Duration::from_millis(1), "{waited:?}");
        assert!(polls >= 49, "{polls}");
    }
}

#[test]
fn point_to_point_messages_match_in_order_per_pair() {
    let w = world(3);
    let store = w.store();
    let got = w.run(3, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 3);
        let s = device.current_stream();
        match rank {
            0 => {
                for v in [1.0, 2.0] {
                    c.send(&buffer(&device, DType::I32, &[v, v]), 2, &s).unwrap();
                }
                vec![]
            }
            1 => {
                c.send(&buffer(&device, DType::I32, &[9.0, 9.0]), 2, &s).unwrap();
                vec![]
            }
            _ => {
                // Receive from rank 1 first: matching is per pair, so no deadlock and no mix-up.
                let from1 = device.alloc(DType::I32, 2).unwrap();
                c.recv(&from1, 1, &s).unwrap();
                let first = device.alloc(DType::I32, 2).unwrap();
                let second = device.alloc(DType::I32, 2).unwrap();
                c.recv(&first, 0, &s).unwrap();
                c.recv(&second, 0, &s).unwrap();
                [read(&device, &from1, &s), read(&device, &first, &s), read(&device, &second, &s)].concat()
            }
        }
    });
    assert_eq!(got[2], vec![9.0, 9.0, 1.0, 1.0, 2.0, 2.0]);
}

#[test]
fn finalize_waits_for_this_ranks_pending_operations() {
    let w = world(2);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let s = device.current_stream();
        device.sleep_kernel(&s, Duration::from_millis(5 * (rank as u64 + 1))).unwrap();
        let b = device.alloc(DType::F64, 8).unwrap();
        c.all_reduce(&b, &b, ReduceOp::Max, &s).unwrap();
        let before = device.now();
        c.finalize().unwrap();
        (before, device.now())
    });
    for (before, after) in got {
        assert!(after - before >= Duration::from_millis(9), "finalize waited for the all-reduce: {before:?} {after:?}");
    }
}

#[test]
fn joining_twice_or_with_another_size_is_an_error() {
    let w = world(2);
    let store = w.store();
    let got = w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let id = pg_core::UniqueId(store.get("id").unwrap());
        let twice = device.create_communicator(&id, 2, rank, &CommConfig::default()).unwrap_err();
        let size = device.create_communicator(&id, 3, rank, &CommConfig::default()).unwrap_err();
        drop(c);
        (twice.to_string(), size.to_string())
    });
    assert!(got[0].0.contains("rank 0 already joined"), "{}", got[0].0);
    assert!(got[0].1.contains("joined with size 3, but the communicator has size 2"), "{}", got[0].1);
}

/// Rank 0's all_reduce waits behind a 90 ms kernel; rank 0 aborts (or revokes) its communicator at 50 ms. The
/// op runs on neither rank: rank 0's stream drains past it, and rank 1's part never completes.
#[test]
fn an_op_queued_behind_a_kernel_on_an_aborted_or_revoked_communicator_never_runs_on_any_rank() {
    for revoke in [false, true] {
        let w = world(2);
        let store = w.store();
        let got = w.run(2, move |rank, device| {
            let c = comm(&store, "id", &device, rank, 2);
            let s = device.current_stream();
            let b = buffer(&device, DType::F32, &[rank as f64 + 1.0; 4]);
            if rank == 0 {
                device.sleep_kernel(&s, Duration::from_millis(90)).unwrap();
            }
            c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
            let end = device.create_event();
            end.record(&s).unwrap();
            let passed = if rank == 0 {
                // Rank 0 leaves at 50 ms, while its part still waits behind the 90 ms kernel.
                device.sleep(Duration::from_millis(50), &AtomicBool::new(false));
                match revoke {
                    true => c.revoke("leaving").unwrap(),
                    false => c.abort("leaving").unwrap(),
                }
                false
            } else {
                // Rank 1 waits as a watchdog would: its op never ends, so it aborts at its timeout.
                device.sleep(Duration::from_millis(200), &AtomicBool::new(false));
                let passed = end.query().unwrap();
                c.abort("timeout").unwrap();
                passed
            };
            device.synchronize().unwrap();
            (passed, read(&device, &b, &s))
        });
        assert!(!got[1].0, "revoke {revoke}: rank 1's all_reduce completed with an aborted rank 0");
        assert_eq!(got[0].1, vec![1.0; 4], "revoke {revoke}: rank 0's buffer after its abort");
        assert_eq!(got[1].1, vec![2.0; 4], "revoke {revoke}: rank 1's buffer");
    }
}
