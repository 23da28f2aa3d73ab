//! The simulated store: blocking operations wait in virtual time, timeouts cost no real time.

use std::time::{Duration, Instant};

use pg_core::Device as _;
use pg_mock::{Fault, World, WorldConfig};
use pg_store::{Store, StoreError};

use crate::common::world;

/// Runs `body(rank, store)` on `n` ranks and returns each rank's (result text, local time at the end).
fn check(n: usize, body: fn(usize, &dyn Store) -> String, expected: &[(&str, Duration)]) {
    let w = world(n);
    let store = w.store();
    let got = w.run(n, move |rank, device| (body(rank, store.as_ref()), device.now()));
    let got: Vec<(&str, Duration)> = got.iter().map(|(s, t)| (s.as_str(), *t)).collect();
    assert_eq!(got, expected);
}

const STORE_OP: Duration = Duration::from_micros(10);

#[test]
fn blocking_operations_wait_in_virtual_time() {
    let started = Instant::now();
    check(
        2,
        |rank, store| match rank {
            0 => format!("{:?}", store.get("never")),
            _ => "idle".to_owned(),
        },
        &[(r#"Err(Timeout { keys: ["never"], timeout: 300s })"#, Duration::from_secs(300)), ("idle", Duration::ZERO)],
    );
    assert!(started.elapsed() < Duration::from_secs(5), "a 300 s timeout takes no real time");
    check(
        2,
        |rank, store| match rank {
            0 => {
                std::thread::sleep(Duration::from_millis(20)); // real time does not matter
                store.set("k", b"v").unwrap();
                "set".to_owned()
            }
            _ => String::from_utf8(store.get("k").unwrap()).unwrap(),
        },
        // The getter wakes at the set time (10 us), and its get costs 10 us more.
        &[("set", STORE_OP), ("v", 2 * STORE_OP)],
    );
    check(
        1,
        |_, store| {
            store.set_timeout(Duration::from_millis(5));
            format!("{:?}", store.wait(&["a", "b"], Some(Duration::from_millis(2))))
        },
        &[(r#"Err(Timeout { keys: ["a", "b"], timeout: 2ms })"#, Duration::from_millis(2))],
    );
    check(
        3,
        |_, store| format!("{:?}", store.barrier("b", 3, None)),
        // add, then the last arriver's set of the done key, then every rank's wait: three store operations.
        &[("Ok(())", 3 * STORE_OP), ("Ok(())", 3 * STORE_OP), ("Ok(())", 3 * STORE_OP)],
    );
    check(
        2,
        |rank, store| match rank {
            0 => {
                store.queue_push("q", b"x").unwrap();
                "pushed".to_owned()
            }
            _ => format!("{:?}", store.queue_pop("q", true).map(String::from_utf8)),
        },
        &[("pushed", STORE_OP), (r#"Ok(Ok("x"))"#, 2 * STORE_OP)],
    );
}

#[test]
fn plain_operations_behave_like_a_hash_store() {
    check(
        1,
        |_, store| {
            let mut out = Vec::new();
            out.push(format!("{:?}", store.add("c", 2)));
            out.push(format!("{:?}", store.add("c", 3)));
            out.push(format!("{:?}", store.compare_set("c", b"5", b"x").map(String::from_utf8)));
            out.push(format!("{:?}", store.check(&["c", "d"])));
            out.push(format!("{:?}", store.delete_key("c")));
            out.push(format!("{:?}", store.num_keys()));
            out.push(format!("{:?}", store.queue_pop("q", false)));
            store.append("a", b"1").unwrap();
            store.append("a", b"2").unwrap();
            out.push(format!("{:?}", store.get("a").map(String::from_utf8)));
            out.push(format!("{:?}", store.list_keys()));
            out.join("; ")
        },
        &[(
            r#"Ok(2); Ok(5); Ok(Ok("x")); Ok(false); Ok(true); Ok(0); Err(QueueEmpty { key: "q" }); Ok(Ok("12")); Ok(["a"])"#,
            Duration::from_micros(110),
        )],
    );
}

#[test]
fn a_store_that_stops_answering_fails_with_a_network_error() {
    for fail_fast in [true, false] {
        let w =
            World::new(WorldConfig { faults: vec![Fault::StoreDown { fail_fast }], ..WorldConfig::with_devices(1) });
        let store = w.store();
        let got = w.run(1, move |_, device| {
            store.set_timeout(Duration::from_secs(30));
            (store.get("k").unwrap_err(), store.set("k", b"v").unwrap_err(), device.now())
        });
        let (get, set, now) = &got[0];
        assert!(matches!(get, StoreError::Network(m) if m.contains("stopped answering")), "{get:?}");
        assert!(matches!(set, StoreError::Network(_)), "{set:?}");
        let expected = if fail_fast { STORE_OP } else { Duration::from_secs(60) + STORE_OP };
        assert_eq!(*now, expected, "fail_fast = {fail_fast}");
    }
}

#[test]
fn two_blocked_pops_share_the_queue_without_a_spurious_error() {
    // Which consumer gets which element depends on real-time order (as with any queue), so only the values are
    // compared.
    let w = world(3);
    let store = w.store();
    let mut got = w.run(3, move |rank, _| match rank {
        0 => {
            for v in [b"a", b"b"] {
                store.queue_push("q", v).unwrap();
            }
            None
        }
        _ => Some(String::from_utf8(store.queue_pop("q", true).unwrap()).unwrap()),
    });
    got.sort();
    assert_eq!(got, vec![None, Some("a".to_owned()), Some("b".to_owned())]);
}

/// Liveness as pg's TCP store server publishes it: a live key is held by the setting thread's process; when that
/// process is killed mid-op, its death appears `WorldConfig::liveness_latency` after the kill in virtual time (a
/// poll before that sees nothing, in every run), and the live process is never declared dead.
#[test]
fn a_killed_process_liveness_hold_is_published_after_the_latency_in_virtual_time() {
    use pg_core::{Communicator as _, DType, ReduceOp};
    use pg_store::liveness::{dead_key, live_key, watched_key, DEATHS_KEY};
    let latency = Duration::from_millis(3);
    let w = World::new(WorldConfig {
        faults: vec![Fault::KillAt { rank: 1, op: 0 }],
        liveness_latency: latency,
        ..WorldConfig::with_devices(2)
    });
    let store: std::sync::Arc<dyn Store> = w.store();
    let seen = w.run(2, |rank, device| {
        let group = pg_store::PrefixStore::new("g", std::sync::Arc::clone(&store));
        group.set(&live_key(&rank.to_string()), b"pid").unwrap();
        assert!(group.check(&[&watched_key(&rank.to_string())]).unwrap(), "the hold is acknowledged");
        let comm = crate::common::comm(&store, "id", &device, rank, 2);
        if rank == 1 {
            device.sleep(Duration::from_millis(5), &std::sync::atomic::AtomicBool::new(false));
            let killed_at = device.now();
            let b = crate::common::buffer(&device, DType::F32, &[1.0]);
            let _ = comm.all_reduce(&b, &b, ReduceOp::Sum, &device.current_stream());
            return (killed_at, Duration::ZERO);
        }
        let never = std::sync::atomic::AtomicBool::new(false);
        while !group.check(&[&dead_key("1")]).unwrap() {
            device.sleep(Duration::from_micros(500), &never);
        }
        assert!(!group.check(&[&dead_key("0")]).unwrap(), "the live rank was declared dead");
        assert_eq!(group.get(DEATHS_KEY).unwrap(), b"1");
        (Duration::ZERO, device.now())
    });
    let (killed_at, seen_at) = (seen[1].0, seen[0].1);
    assert!(
        seen_at >= killed_at + latency,
        "the death was seen at {seen_at:?}, before the kill {killed_at:?} + {latency:?}"
    );
    assert!(seen_at <= killed_at + latency + Duration::from_millis(1), "seen at {seen_at:?}, killed at {killed_at:?}");
}
