//! Virtual time: auto-advance, host debt, interrupts, determinism, deadlock and misuse reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_core::{Communicator as _, DType, Device as _, Event as _, ReduceOp, Stream as _};
use pg_mock::{MockDevice, World};

use crate::common::{buffer, comm, world};

const US: Duration = Duration::from_micros(1);
const MS: Duration = Duration::from_millis(1);

/// Runs `body` on one rank and compares the times it returns with `expected`.
fn check(name: &str, body: fn(&MockDevice) -> Vec<Duration>, expected: &[Duration]) {
    let w = world(1);
    let got = w.run(1, move |_, device| body(&device)).remove(0);
    assert_eq!(got, expected, "case '{name}'");
}

#[test]
fn single_rank_timelines() {
    check(
        "a kernel launch only costs host time",
        |d| {
            let s = d.current_stream();
            d.sleep_kernel(&s, 50 * MS).unwrap();
            vec![d.now()]
        },
        &[5 * US],
    );
    check(
        "stream synchronize waits for the kernel's end",
        |d| {
            let s = d.current_stream();
            d.sleep_kernel(&s, 50 * MS).unwrap();
            s.synchronize().unwrap();
            vec![d.now()]
        },
        &[50 * MS + 5 * US],
    );
    check(
        "kernels on one stream run back to back; launches overlap them",
        |d| {
            let s = d.current_stream();
            d.sleep_kernel(&s, 10 * MS).unwrap();
            d.sleep_kernel(&s, 10 * MS).unwrap();
            let launched = d.now();
            s.synchronize().unwrap();
            vec![launched, d.now()]
        },
        &[10 * US, 20 * MS + 5 * US],
    );
    check(
        "kernels on two streams overlap; the device waits for both",
        |d| {
            let a = d.current_stream();
            let b = d.stream_from_pool(false).unwrap();
            d.sleep_kernel(&a, 10 * MS).unwrap();
            d.sleep_kernel(&b, 30 * MS).unwrap();
            a.synchronize().unwrap();
            let first = d.now();
            d.synchronize().unwrap();
            vec![first, d.now()]
        },
        &[10 * MS + 5 * US, 30 * MS + 10 * US],
    );
    check(
        "a host sleep moves local time",
        |d| {
            d.sleep(7 * MS, &AtomicBool::new(false));
            vec![d.now()]
        },
        &[7 * MS],
    );
    check(
        "queries answer at global time and cost host time",
        |d| {
            let s = d.current_stream();
            d.sleep_kernel(&s, MS).unwrap();
            let before = s.query().unwrap();
            d.sleep(2 * MS, &AtomicBool::new(false));
            let after = s.query().unwrap();
            vec![Duration::from_secs(u64::from(before)), Duration::from_secs(u64::from(after)), d.now()]
        },
        &[
            Duration::ZERO,
            Duration::from_secs(1),
            5 * US + 250 * Duration::from_nanos(1) + 2 * MS + 250 * Duration::from_nanos(1),
        ],
    );
}

#[test]
fn an_interrupt_ends_a_sleep_early() {
    let w = world(2);
    let flag = Arc::new(AtomicBool::new(false));
    let times = w.run(2, move |rank, device| {
        if rank == 0 {
            device.sleep(Duration::from_secs(100), &flag);
            (device.now(), flag.load(Ordering::SeqCst))
        } else {
            device.sleep(3 * MS, &AtomicBool::new(false));
            flag.store(true, Ordering::SeqCst);
            device.notify_host_threads();
            (device.now(), true)
        }
    });
    assert!(times[0].1);
    assert_eq!(times[0].0, 3 * MS, "the sleeper wakes when the flag is set, not after 100 s");
}

/// A busy multi-rank scenario: store exchange, collectives, sleeps of different lengths, a polling helper.
/// Per rank: the times it saw, and its device's kernels as (stream id, name, start, end).
type Timeline = (Vec<Vec<Duration>>, Vec<Vec<(u64, String, Duration, Duration)>>);

fn scenario(w: &World) -> Timeline {
    let store = w.store();
    let times = w.run(4, move |rank, device| {
        let mut times = Vec::new();
        let c = comm(&store, "id", &device, rank, 4);
        times.push(device.now());
        let s = device.current_stream();
        let comm_stream = device.stream_from_pool(false).unwrap();
        device.sleep_kernel(&s, (rank as u32 + 1) * 3 * MS).unwrap();
        let b = buffer(&device, DType::F32, &vec![rank as f64; 1 << 16]);
        let ready = device.create_event();
        ready.record(&s).unwrap();
        comm_stream.wait_event(&ready).unwrap();
        c.all_reduce(&b, &b, ReduceOp::Sum, &comm_stream).unwrap();
        let done = device.create_event();
        done.record(&comm_stream).unwrap();
        times.push(device.now());
        let stop = Arc::new(AtomicBool::new(false));
        let poller = {
            let device = device.clone();
            let stop = Arc::clone(&stop);
            device.clone().spawn_host_thread(
                "poller",
                Box::new(move || {
                    while !stop.load(Ordering::SeqCst) {
                        device.sleep(MS, &stop);
                    }
                }),
            )
        }
        .unwrap();
        while !done.query().unwrap() {
            device.sleep(Duration::from_micros(700), &AtomicBool::new(false));
        }
        times.push(device.now());
        store.set(&format!("done{rank}"), b"1").unwrap();
        store.wait(&["done0", "done1", "done2", "done3"], None).unwrap();
        times.push(device.now());
        stop.store(true, Ordering::SeqCst);
        device.notify_host_threads();
        poller.join().unwrap();
        times
    });
    let logs =
        (0..4).map(|d| w.kernel_log(d).into_iter().map(|k| (k.stream_id, k.name, k.start, k.end)).collect()).collect();
    (times, logs)
}

#[test]
fn the_same_program_gives_the_same_timeline() {
    let first = scenario(&world(4));
    for _ in 0..5 {
        assert_eq!(scenario(&world(4)), first);
    }
    // The collective waits for the slowest rank's 12 ms kernel on every rank.
    let ends: Vec<Duration> = first.1.iter().map(|log| log.iter().find(|k| k.1 == "all_reduce").unwrap().3).collect();
    assert!(ends.iter().all(|e| *e == ends[0] && *e > 12 * MS), "{ends:?}");
}

fn panic_message(result: std::thread::Result<()>) -> String {
    let payload = result.expect_err("it should panic");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn a_deadlock_is_reported_not_hung() {
    let w = world(2);
    let store = w.store();
    let message = panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        w.run(2, move |rank, device| {
            let c = comm(&store, "id", &device, rank, 2);
            let b = device.alloc(DType::F32, 4).unwrap();
            let s = device.current_stream();
            if rank == 0 {
                c.all_reduce(&b, &b, ReduceOp::Sum, &s).unwrap();
                s.synchronize().unwrap();
            }
        });
    })));
    assert!(message.contains("deadlock"), "{message}");
    assert!(message.contains("thread 'rank0'"), "{message}");
    assert!(message.contains("waits for rank(s) 1 to enqueue their part"), "{message}");
}

#[test]
fn unregistered_threads_are_refused() {
    let w = world(1);
    let device = w.device(0);
    let message = panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let s = device.current_stream();
        device.sleep_kernel(&s, MS).unwrap();
    })));
    assert!(message.contains("not registered"), "{message}");
    assert_eq!(w.now(), Duration::ZERO);
}

#[test]
fn a_livelock_stops_at_the_time_limit() {
    let w = World::new(pg_mock::WorldConfig {
        time_limit: Duration::from_secs(1),
        ..pg_mock::WorldConfig::with_devices(1)
    });
    let message = panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        w.run(1, |_, device| loop {
            device.sleep(100 * MS, &AtomicBool::new(false));
        });
    })));
    assert!(message.contains("virtual time limit of 1.000 s reached"), "{message}");
    assert!(message.contains("thread 'rank0' (local time 1.000 s): sleeping for 100.000 ms"), "{message}");
}

#[test]
fn an_unregistered_caller_reads_global_time() {
    let w = world(1);
    let device = w.device(0);
    w.run(1, |_, d| d.sleep(3 * MS, &AtomicBool::new(false)));
    assert_eq!(device.now(), 3 * MS);
    assert_eq!(w.now(), 3 * MS);
}

#[test]
fn the_first_panic_is_reraised_not_the_deadlock_it_causes() {
    let w = world(2);
    let store = w.store();
    let message = panic_message(std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        w.run(2, move |rank, device| {
            let c = comm(&store, "id", &device, rank, 2);
            if rank == 1 {
                panic!("rank 1 failed on its own");
            }
            let b = device.alloc(DType::F32, 4).unwrap();
            c.all_reduce(&b, &b, ReduceOp::Sum, &device.current_stream()).unwrap();
            device.synchronize().unwrap();
        });
    })));
    assert_eq!(message, "rank 1 failed on its own");
}

#[test]
fn helpers_left_alone_do_not_spin_through_time() {
    // A helper (a watchdog) outlives its rank. Alone it must not move the clock: with a 1 s time limit and
    // 100 ms sleeps it would otherwise hit the limit within a few iterations.
    let w = World::new(pg_mock::WorldConfig {
        time_limit: Duration::from_secs(1),
        ..pg_mock::WorldConfig::with_devices(1)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    let helper = w
        .run(1, move |_, device| {
            let d = device.clone();
            let flag = Arc::clone(&flag);
            device
                .spawn_host_thread(
                    "watchdog",
                    Box::new(move || {
                        while !flag.load(Ordering::SeqCst) {
                            d.sleep(100 * MS, &flag);
                        }
                    }),
                )
                .unwrap()
        })
        .remove(0);
    let at_exit = w.now();
    stop.store(true, Ordering::SeqCst);
    w.device(0).notify_host_threads();
    helper.join().expect("the helper stops when told, without reaching the time limit");
    assert!(w.now() <= at_exit + 100 * MS, "{:?} -> {:?}", at_exit, w.now());
}
