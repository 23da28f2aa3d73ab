//! Streams and events: pools, the per-thread current stream, ordering through events, lazy event creation,
//! and which stream ran which kernel.

use std::time::Duration;

use pg_core::{Communicator as _, DType, Device as _, Event as _, ReduceOp, Stream as _, StreamGuard};
use pg_mock::{KernelKind, Mock};

use crate::common::{comm, world};

const MS: Duration = Duration::from_millis(1);

#[test]
fn pools_hand_out_streams_round_robin() {
    let w = world(1);
    let got = w.run(1, |_, d| {
        let default = d.current_stream();
        let normal: Vec<(u64, bool)> =
            (0..34).map(|_| d.stream_from_pool(false).unwrap()).map(|s| (s.id(), s.is_high_priority())).collect();
        let high = d.stream_from_pool(true).unwrap();
        (default.id(), normal, high.id(), high.is_high_priority())
    });
    let (default, normal, high, is_high) = &got[0];
    assert_eq!(*default, 0);
    assert_eq!(normal[0], (1, false));
    assert_eq!(normal[31], (32, false));
    assert_eq!(normal[32], (1, false), "the 33rd stream is the first again");
    assert_eq!((*high, *is_high), (33, true));
}

#[test]
fn the_current_stream_is_per_thread_and_guarded() {
    let w = world(1);
    w.run(1, |_, d| {
        let pool = d.stream_from_pool(false).unwrap();
        {
            let _guard = StreamGuard::<Mock>::new(&d, &pool);
            assert_eq!(d.current_stream(), pool);
            let other = d.clone();
            let seen =
                d.spawn_host_thread("other", Box::new(move || assert_eq!(other.current_stream().id(), 0))).unwrap();
            seen.join().unwrap();
        }
        assert_eq!(d.current_stream().id(), 0);
    });
}

#[test]
fn events_are_created_at_first_record_and_order_streams() {
    let w = world(1);
    let got = w.run(1, |_, d| {
        let a = d.current_stream();
        let b = d.stream_from_pool(false).unwrap();
        let e = d.create_event();
        let never_recorded = (e.is_created(), e.query().unwrap());
        d.sleep_kernel(&a, 10 * MS).unwrap();
        e.record(&a).unwrap();
        let recorded = (e.is_created(), e.query().unwrap());
        b.wait_event(&e).unwrap();
        d.sleep_kernel(&b, MS).unwrap();
        b.synchronize().unwrap();
        let after_b = d.now();
        let done = e.query().unwrap();
        let empty = d.create_event();
        empty.record(&d.stream_from_pool(true).unwrap()).unwrap();
        (never_recorded, recorded, after_b, done, empty.query().unwrap())
    });
    let (never_recorded, recorded, after_b, done, empty) = got[0];
    assert_eq!(never_recorded, (false, true), "an event never recorded is complete and not created");
    assert_eq!(recorded, (true, false));
    // b's kernel starts after a's 10 ms kernel (launched at 5.25 us, after a 0.25 us query), then runs 1 ms.
    assert_eq!(after_b, 11 * MS + Duration::from_nanos(5_250));
    assert!(done && empty);
}

#[test]
fn timing_events_give_the_device_time_between_their_points_and_nothing_before() {
    let w = world(1);
    let got = w.run(1, |_, d| {
        let a = d.current_stream();
        let start = d.create_timing_event().unwrap();
        let end = d.create_timing_event().unwrap();
        let plain = d.create_event();
        let unrecorded = end.nanos_since(&start).unwrap_err().kind();
        start.record(&a).unwrap();
        d.sleep_kernel(&a, 10 * MS).unwrap();
        end.record(&a).unwrap();
        plain.record(&a).unwrap();
        // The kernel is still running: no answer yet, and asking does not wait for it.
        let before = (end.nanos_since(&start).unwrap(), d.now());
        a.synchronize().unwrap();
        let forward = end.nanos_since(&start).unwrap();
        let backward = start.nanos_since(&end).unwrap();
        let not_timed = end.nanos_since(&plain).unwrap_err().kind();
        (unrecorded, before, forward, backward, not_timed)
    });
    let (unrecorded, (pending, asked_at), forward, backward, not_timed) = got[0];
    assert_eq!(unrecorded, pg_core::ErrorKind::InvalidArgument, "an event never recorded has no time");
    assert_eq!(pending, None, "an event that has not passed has no time");
    assert!(asked_at < 10 * MS, "asking blocked until {asked_at:?}");
    // From the start event (recorded on the idle stream: it passes at its record) to the end of the 10 ms kernel,
    // which starts when the host has enqueued it, after its 5 us launch cost.
    let span = i64::try_from((10 * MS + Duration::from_micros(5)).as_nanos()).unwrap();
    assert_eq!(forward, Some(span));
    assert_eq!(backward, Some(-span), "the time back from a later event is negative");
    assert_eq!(not_timed, pg_core::ErrorKind::InvalidArgument, "a plain event cannot be timed");
}

#[test]
fn event_synchronize_blocks_until_the_marked_point_only() {
    let w = world(1);
    let t = w.run(1, |_, d| {
        let a = d.current_stream();
        d.sleep_kernel(&a, 10 * MS).unwrap();
        let e = d.create_event();
        e.record(&a).unwrap();
        d.sleep_kernel(&a, 50 * MS).unwrap();
        e.synchronize().unwrap();
        let t = d.now();
        (t, a.query().unwrap())
    });
    assert_eq!(t[0], (10 * MS + Duration::from_micros(5), false));
}

#[test]
fn comm_kernels_run_on_the_comm_stream_and_sleep_on_the_current_one() {
    let w = world(2);
    let store = w.store();
    w.run(2, move |rank, d| {
        let c = comm(&store, "id", &d, rank, 2);
        let current = d.current_stream();
        let comm_stream = d.stream_from_pool(false).unwrap();
        let b = d.alloc(DType::F32, 1024).unwrap();
        d.sleep_kernel(&current, 50 * MS).unwrap();
        let ready = d.create_event();
        ready.record(&current).unwrap();
        comm_stream.wait_event(&ready).unwrap();
        c.all_reduce(&b, &b, ReduceOp::Sum, &comm_stream).unwrap();
        d.synchronize().unwrap();
    });
    for device in 0..2 {
        let log = w.kernel_log(device);
        let kinds: Vec<(KernelKind, u64)> = log.iter().map(|k| (k.kind, k.stream_id)).collect();
        assert_eq!(kinds, vec![(KernelKind::Sleep, 0), (KernelKind::Comm, 1)]);
        assert!(log[1].start >= log[0].end, "the collective waited for the input-ready event");
    }
}
