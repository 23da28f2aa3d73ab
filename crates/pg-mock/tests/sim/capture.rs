//! Stream capture on the simulated backend, with the backend's primitives alone: recorded work does not run,
//! a launch replays it with real data in virtual time, cross-stream capture joins and must join back, forbidden
//! calls are refused and invalidate the capture, and the hazard detector sees replayed accesses.

use std::time::Duration;

use pg_core::Stream as _;
use pg_core::{CaptureMode, Communicator as _, DType, Device as _, ErrorKind, Event as _, Graph as _, ReduceOp};
use pg_mock::{HazardKind, HazardMode, World, WorldConfig};

use crate::common::{buffer, comm, read};

#[test]
fn captured_work_runs_only_when_launched_and_every_launch_replays_it() {
    let w = World::new(WorldConfig { hazard_mode: HazardMode::Panic, ..WorldConfig::with_devices(2) });
    let store = w.store();
    let results = w.run(2, move |rank, device| {
        let c = comm(&store, "id", &device, rank, 2);
        let stream = device.stream_from_pool(false).unwrap();
        let b = buffer(&device, DType::F32, &[1.0 + rank as f64; 4]);
        stream.synchronize().unwrap();
        device.current_stream().synchronize().unwrap();
        stream.begin_capture(CaptureMode::ThreadLocal).unwrap();
        assert!(stream.is_capturing().unwrap());
        c.all_reduce(&b, &b, ReduceOp::Sum, &stream).unwrap();
        device.sleep_kernel(&stream, Duration::from_millis(1)).unwrap();
        let graph = stream.end_capture().unwrap();
        assert!(!stream.is_capturing().unwrap());
        assert_eq!(graph.node_count(), 2);
        let before = read(&device, &b, &stream);
        let mut after = Vec::new();
        for _ in 0..3 {
            let t0 = device.now();
            graph.launch(&stream).unwrap();
            after.push(read(&device, &b, &stream)[0]);
            assert!(device.now() - t0 >= Duration::from_millis(1), "the replayed sleep kernel takes device time");
        }
        (before[0], after)
    });
    // 1 + 2 = 3, then 6, then 12: each launch all-reduces again; the capture itself changed nothing.
    assert_eq!(results, vec![(1.0, vec![3.0, 6.0, 12.0]), (2.0, vec![3.0, 6.0, 12.0])]);
}

#[test]
fn a_joined_stream_must_join_back_before_the_capture_ends() {
    let w = World::new(WorldConfig::with_devices(1));
    w.run(1, |_, device| {
        let origin = device.stream_from_pool(false).unwrap();
        let side = device.stream_from_pool(true).unwrap();
        let b = device.alloc(DType::F32, 8).unwrap();
        origin.begin_capture(CaptureMode::Relaxed).unwrap();
        let fork = device.create_event();
        fork.record(&origin).unwrap();
        side.wait_event(&fork).unwrap();
        assert!(side.is_capturing().unwrap(), "waiting on a captured event joins the capture");
        device.fill(&b, 5.0, &side).unwrap();
        let err = origin.end_capture().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::CaptureUnsupported);
        assert!(err.to_string().contains("unjoined"), "{err}");
        assert!(!side.is_capturing().unwrap() && !origin.is_capturing().unwrap(), "a failed end still ends it");

        // Joined back: the origin waits on an event recorded on the side stream after its work.
        origin.begin_capture(CaptureMode::Relaxed).unwrap();
        fork.record(&origin).unwrap();
        side.wait_event(&fork).unwrap();
        device.fill(&b, 5.0, &side).unwrap();
        let join = device.create_event();
        join.record(&side).unwrap();
        origin.wait_event(&join).unwrap();
        let graph = origin.end_capture().unwrap();
        assert_eq!(graph.node_count(), 1);
        assert_eq!(read(&device, &b, &origin), vec![0.0; 8], "captured, not run");
        graph.launch(&origin).unwrap();
        assert_eq!(read(&device, &b, &origin), vec![5.0; 8], "the launch stream waits for the joined work");
    });
}

#[test]
fn synchronizing_or_querying_a_capturing_stream_fails_and_invalidates_the_capture() {
    let w = World::new(WorldConfig::with_devices(1));
    w.run(1, |_, device| {
        let s = device.stream_from_pool(false).unwrap();
        let b = device.alloc(DType::F32, 2).unwrap();
        type Forbidden = fn(&pg_mock::MockDevice, &pg_mock::MockStream, &pg_mock::MockBuffer) -> pg_core::Result<()>;
        let calls: [(&str, Forbidden); 5] = [
            ("Stream::synchronize", |_, s, _| s.synchronize()),
            ("Stream::query", |_, s, _| s.query().map(drop)),
            ("Device::synchronize", |d, _, _| d.synchronize()),
            ("copy_to_host", |d, s, b| d.copy_to_host(b, s).map(drop)),
            ("Event::query", |d, s, _| {
                let e = d.create_event();
                e.record(s)?;
                e.query().map(drop)
            }),
        ];
        for (name, call) in calls {
            s.begin_capture(CaptureMode::Global).unwrap();
            device.fill(&b, 1.0, &s).unwrap();
            let err = call(&device, &s, &b).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::CaptureUnsupported, "{name}: {err}");
            assert!(err.to_string().contains(name), "{name}: {err}");
            let end = s.end_capture().unwrap_err();
            assert!(end.to_string().contains("invalidated"), "{name}: {end}");
        }
        assert_eq!(read(&device, &b, &s), vec![0.0; 2], "nothing captured ever ran");
    });
}

#[test]
fn a_replay_on_a_buffer_freed_after_the_capture_fails_unless_the_graph_keeps_it() {
    let w = World::new(WorldConfig::with_devices(1));
    w.run(1, |_, device| {
        let s = device.current_stream();
        let kept = device.alloc(DType::F32, 4).unwrap();
        let dropped = device.alloc(DType::F32, 4).unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        device.fill(&kept, 2.0, &s).unwrap();
        device.fill(&dropped, 2.0, &s).unwrap();
        s.capture_keep_alive(&kept).unwrap();
        let graph = s.end_capture().unwrap();
        drop(kept);
        drop(dropped);
        let err = graph.launch(&s).unwrap_err();
        assert!(err.to_string().contains("freed after the capture"), "{err}");
        let err = s.capture_keep_alive(&device.alloc(DType::F32, 1).unwrap()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    });
}

#[test]
fn the_hazard_detector_sees_replayed_accesses() {
    let w = World::new(WorldConfig { hazard_mode: HazardMode::Record, ..WorldConfig::with_devices(1) });
    w.run(1, |_, device| {
        let s = device.stream_from_pool(false).unwrap();
        let other = device.stream_from_pool(true).unwrap();
        let b = device.alloc(DType::F32, 1 << 16).unwrap();
        device.current_stream().synchronize().unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        device.fill(&b, 1.0, &s).unwrap();
        let graph = s.end_capture().unwrap();
        graph.launch(&s).unwrap();
        // Unordered after the replayed write: a race the detector must report.
        device.fill(&b, 2.0, &other).unwrap();
        other.synchronize().unwrap();
        s.synchronize().unwrap();
    });
    let hazards = w.hazards();
    assert!(hazards.iter().any(|h| h.kind == HazardKind::WriteAfterWrite), "{hazards:?}");
}
