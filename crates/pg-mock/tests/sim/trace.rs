//! The world's trace: what each stream ran, waits as arrows between streams, blocked host threads, hazards,
//! unfinished work, the ring's bound, and the Chrome trace-event form of all of it.

use std::sync::Arc;
use std::time::Duration;

use pg_core::{DType, Device as _, Event as _, Options, ProcessGroup, ReduceOp, Stream as _};
use pg_mock::{Fault, HazardKind, HazardMode, KernelKind, Mock, SpanKind, StreamSpan, Trace, World, WorldConfig};
use serde_json::Value;

const MS: Duration = Duration::from_millis(1);

/// The spans of `trace` on `device` named `name`.
fn spans<'a>(trace: &'a Trace, device: usize, name: &str) -> Vec<&'a StreamSpan> {
    trace.spans.iter().filter(|s| s.device == device && s.name == name).collect()
}

/// The Chrome form of `trace`, as serde_json reads its text back.
fn chrome_json(trace: &Trace) -> Value {
    serde_json::from_str(&trace.to_chrome_json().to_string()).expect("the Chrome form is JSON")
}

/// Every trace event of `json`, checking the fields every event must have.
fn events(json: &Value) -> &Vec<Value> {
    let events = json["traceEvents"].as_array().expect("a traceEvents list");
    for event in events {
        for field in ["ph", "pid", "tid", "name"] {
            assert!(event.get(field).is_some(), "{field} missing in {event}");
        }
        if event["ph"] != "M" {
            assert!(event["ts"].is_number(), "ts missing in {event}");
        }
        if event["ph"] == "X" {
            assert!(event["dur"].as_f64().is_some_and(|d| d >= 0.0), "dur missing in {event}");
        }
    }
    events
}

/// The track number the Chrome form gives stream `id` of `device`, from its name.
fn stream_tid(json: &Value, device: u64, id: u64) -> u64 {
    events(json)
        .iter()
        .find(|e| {
            e["name"] == "thread_name"
                && e["pid"] == device
                && e["args"]["name"].as_str().is_some_and(|n| n.split(' ').nth(1) == Some(&id.to_string()))
        })
        .and_then(|e| e["tid"].as_u64())
        .unwrap_or_else(|| panic!("no track for stream {id} of device {device}"))
}

#[test]
fn a_wait_is_an_arrow_from_the_marked_kernel_and_the_waiting_stream_starts_after_it() {
    let world = World::new(WorldConfig::with_devices(1));
    world.run(1, |_, device| {
        let first = device.stream_from_pool(false).unwrap();
        let second = device.stream_from_pool(false).unwrap();
        let buffer = device.alloc(DType::F32, 1024).unwrap();
        device.sleep_kernel(&first, 3 * MS).unwrap();
        let event = device.create_event();
        event.record(&first).unwrap();
        second.wait_event(&event).unwrap();
        device.fill(&buffer, 1.0, &second).unwrap();
        device.synchronize().unwrap();
    });
    let trace = world.trace();
    let sleep = spans(&trace, 0, "sleep");
    let wait = spans(&trace, 0, "wait_event");
    let fill = spans(&trace, 0, "fill");
    assert_eq!((sleep.len(), wait.len(), fill.len()), (1, 1, 1), "{trace:#?}");
    let (sleep, wait, fill) = (sleep[0], wait[0], fill[0]);
    assert_eq!(sleep.kind, SpanKind::Kernel(KernelKind::Sleep));
    assert_eq!(wait.kind, SpanKind::Wait);
    assert_ne!(sleep.stream, wait.stream);
    assert_eq!(wait.stream, fill.stream);
    let sleep_end = sleep.end.expect("the sleep finished");
    assert_eq!(sleep_end - sleep.start, 3 * MS);
    // The second stream reached the wait at once and waited for the sleep to end.
    assert!(wait.start < sleep_end, "{wait:?}");
    assert_eq!(wait.end, Some(sleep_end));
    assert!(fill.start >= sleep_end);
    assert_eq!(trace.waits.len(), 1);
    let arrow = &trace.waits[0];
    assert_eq!(arrow.recorded_on, (0, sleep.stream));
    assert_eq!(arrow.marked, (sleep.start, sleep_end));
    assert_eq!((arrow.stream, arrow.reached, arrow.ready), (wait.stream, wait.start, sleep_end));

    let json = chrome_json(&trace);
    let all = events(&json);
    let flows: Vec<&Value> = all.iter().filter(|e| e["ph"] == "s" || e["ph"] == "f").collect();
    assert_eq!(flows.len(), 2, "{flows:?}");
    assert_eq!(flows[0]["id"], flows[1]["id"]);
    let micros = |d: Duration| d.as_nanos() as f64 / 1000.0;
    assert_eq!(flows[0]["tid"].as_u64(), Some(stream_tid(&json, 0, sleep.stream)));
    assert_eq!(flows[0]["ts"].as_f64(), Some(micros(sleep.start)));
    assert_eq!(flows[1]["tid"].as_u64(), Some(stream_tid(&json, 0, wait.stream)));
    assert_eq!(flows[1]["ts"].as_f64(), Some(micros(wait.start)));
    // Each end of the arrow binds to a slice that starts where it is, on its track, in its category.
    for end in flows {
        assert!(
            all.iter()
                .any(|e| e["ph"] == "X" && e["tid"] == end["tid"] && e["ts"] == end["ts"] && e["cat"] == end["cat"]),
            "no slice under {end}"
        );
    }
}

#[test]
fn a_process_group_op_runs_on_the_comm_stream_after_the_input_ready_wait() {
    let world = World::new(WorldConfig::with_devices(2));
    let store = world.store();
    let current_ids = world.run(2, |rank, device| {
        let pg =
            ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 2, device.clone(), Options::builder().build()).unwrap();
        let buffer = device.alloc(DType::F32, 1024).unwrap();
        let current = device.current_stream();
        device.fill(&buffer, 1.0, &current).unwrap();
        // Longer than the communicator's creation (50 ms), which the op's enqueue waits for.
        device.sleep_kernel(&current, 100 * MS).unwrap();
        pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
        device.synchronize().unwrap();
        pg.shutdown().unwrap();
        current.id()
    });
    let trace = world.trace();
    for (rank, current) in current_ids.into_iter().enumerate() {
        let sleep = spans(&trace, rank, "sleep")[0];
        let op = spans(&trace, rank, "all_reduce");
        assert_eq!(op.len(), 1, "{op:?}");
        let op = op[0];
        assert_eq!(sleep.stream, current);
        assert_ne!(op.stream, current, "the communication kernel ran on the current stream");
        let comm = op.comm.as_ref().expect("a communicator op");
        assert_eq!(comm.collective, Some(0));
        // The comm stream's wait for the input-ready event ends when the sleep does; the kernel starts after it.
        let wait = trace
            .spans
            .iter()
            .find(|s| s.device == rank && s.stream == op.stream && s.kind == SpanKind::Wait && s.start <= op.start)
            .expect("the input-ready wait on the comm stream");
        assert_eq!(wait.end, sleep.end);
        assert!(op.start >= sleep.end.unwrap());
        assert!(trace
            .waits
            .iter()
            .any(|w| w.device == rank && w.recorded_on == (rank, current) && w.stream == op.stream));
        // wait() did not block the rank's thread; Device::synchronize did, until the op ended.
        let thread = trace.threads.iter().find(|t| t.name == format!("rank{rank}")).expect("the rank's thread");
        assert_eq!(thread.device, Some(rank));
        assert!(trace.blocked.iter().any(|b| b.thread == thread.thread && b.end == op.end), "{:?}", trace.blocked);
    }
    // The communicator's track shows each rank's op from its issue to its end.
    let json = chrome_json(&trace);
    let comm_slices: Vec<&Value> = events(&json).iter().filter(|e| e["ph"] == "X" && e["cat"] == "comm").collect();
    assert_eq!(comm_slices.len(), 2, "{comm_slices:?}");
    assert!(comm_slices.iter().all(|e| e["name"] == "all_reduce #0"));
    // Helper threads (the watchdog) work for the rank that started them.
    assert!(trace.threads.iter().filter(|t| t.name != "rank0" && t.name != "rank1").all(|t| t.device.is_some()));
}

#[test]
fn a_hazard_is_an_instant_naming_both_accesses() {
    let world = World::new(WorldConfig { hazard_mode: HazardMode::Record, ..WorldConfig::with_devices(1) });
    world.run(1, |_, device| {
        let first = device.stream_from_pool(false).unwrap();
        let second = device.stream_from_pool(false).unwrap();
        let buffer = device.alloc(DType::F32, 64).unwrap();
        device.fill(&buffer, 1.0, &first).unwrap();
        // No wait: the second fill is not ordered after the first.
        device.fill(&buffer, 2.0, &second).unwrap();
        device.synchronize().unwrap();
    });
    let trace = world.trace();
    assert_eq!(trace.hazards.len(), 1, "{:?}", trace.hazards);
    let hazard = &trace.hazards[0];
    assert_eq!(hazard.kind, HazardKind::WriteAfterWrite);
    let fills = spans(&trace, 0, "fill");
    assert_eq!(hazard.stream, fills[1].stream);
    assert!(
        hazard.access.starts_with("write of buffer #")
            && hazard.access.contains(&format!("stream {}", fills[1].stream))
    );
    assert!(hazard.earlier.contains(&format!("stream {}", fills[0].stream)), "{}", hazard.earlier);
    assert_eq!(hazard.message, world.hazards()[0].message);
    let json = chrome_json(&trace);
    let instants: Vec<&Value> = events(&json).iter().filter(|e| e["ph"] == "i").collect();
    assert_eq!(instants.len(), 1);
    assert_eq!(instants[0]["name"], "hazard: WriteAfterWrite");
    assert_eq!(instants[0]["tid"].as_u64(), Some(stream_tid(&json, 0, fills[1].stream)));
    assert!(instants[0]["args"]["earlier access"].as_str().is_some_and(|a| a.contains("fill")));
}

#[test]
fn a_hung_collective_and_its_waiters_have_no_end() {
    let world =
        World::new(WorldConfig { faults: vec![Fault::HangAt { rank: 1, op: 0 }], ..WorldConfig::with_devices(2) });
    let store = world.store();
    world.run(2, |rank, device| {
        let comm = crate::common::comm(&store, "id", &device, rank, 2);
        let buffer = device.alloc(DType::F32, 16).unwrap();
        let stream = device.current_stream();
        pg_core::Communicator::all_reduce(&comm, &buffer, &buffer, ReduceOp::Sum, &stream).unwrap();
        let never = std::sync::atomic::AtomicBool::new(false);
        device.sleep(10 * MS, &never);
    });
    let trace = world.trace();
    for rank in 0..2 {
        let op = spans(&trace, rank, "all_reduce");
        assert_eq!(op.len(), 1, "{op:?}");
        assert_eq!(op[0].end, None, "the hung op has an end");
    }
    // The hung ops last to the end of the trace in the Chrome form.
    let json = chrome_json(&trace);
    let end = trace.now.as_nanos() as f64 / 1000.0;
    let hung: Vec<&Value> = events(&json).iter().filter(|e| e["ph"] == "X" && e["name"] == "all_reduce").collect();
    assert_eq!(hung.len(), 2);
    for slice in hung {
        assert_eq!(slice["args"]["unfinished"], true);
        let (ts, dur) = (slice["ts"].as_f64().unwrap(), slice["dur"].as_f64().unwrap());
        assert!((ts + dur - end).abs() < 1e-6, "{slice} ends before {end}");
    }
}

#[test]
fn the_ring_keeps_the_latest_records_and_capacity_zero_records_nothing() {
    let run = |capacity: usize| {
        let world = World::new(WorldConfig { trace_capacity: capacity, ..WorldConfig::with_devices(1) });
        world.run(1, |_, device| {
            for _ in 0..10 {
                device.sleep_kernel(&device.current_stream(), MS).unwrap();
            }
            device.synchronize().unwrap();
        });
        world.trace()
    };
    let off = run(0);
    assert!(off.spans.is_empty() && off.blocked.is_empty() && off.threads.is_empty(), "{off:?}");
    let full = run(1024);
    assert_eq!(full.spans.len(), 10);
    assert_eq!(full.dropped, 0);
    let small = run(4);
    assert_eq!(small.spans.len() + small.blocked.len(), 4);
    assert_eq!(small.dropped, (full.spans.len() + full.blocked.len() - 4) as u64);
    // The latest records are the ones kept: the last sleep's.
    assert_eq!(small.spans.last(), full.spans.last());
}

/// A fresh directory for one test's rank files.
fn trace_dir(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pg-mock-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The (track name, slice) pairs of the slices of a `PG_TRACE` rank file on the side `side`.
fn op_slices(json: &Value, side: &str) -> Vec<(String, Value)> {
    let names: std::collections::HashMap<u64, String> = events(json)
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].as_str().unwrap().to_owned()))
        .collect();
    let slices = events(json).iter().filter(|e| e["ph"] == "X" && e["args"]["side"] == side);
    slices.map(|e| (names[&e["tid"].as_u64().unwrap()].clone(), e.clone())).collect()
}

#[test]
fn pg_trace_writes_each_ranks_ops_with_the_simulated_device_spans_and_its_subgroups_beside() {
    let dir = trace_dir("pg-trace");
    let world = World::new(WorldConfig::with_devices(2));
    let store = world.store();
    let env_dir = dir.to_string_lossy().into_owned();
    world.run(2, move |rank, device| {
        // PG_TRACE=DIR, as a process reads it from its environment.
        let lookup = |name: &str| (name == "PG_TRACE").then(|| env_dir.clone());
        let options = Options::builder().build_with_env_from(lookup).unwrap();
        let group = ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 2, device.clone(), options.clone()).unwrap();
        let buffer = device.alloc(DType::F32, 1024).unwrap();
        for _ in 0..3 {
            group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            // Ops seconds apart: the tracer's origin moves on to a later op (as it does on CUDA to keep the
            // precision of its f32 milliseconds), and the times stay exact.
            device.sleep(1500 * MS, &std::sync::atomic::AtomicBool::new(false));
        }
        let mut sub = options.clone();
        sub.group_desc = "pair".to_owned();
        let pair = group.new_group(&[0, 1], sub).unwrap().expect("both ranks are members");
        pair.broadcast(&buffer, 1).unwrap().wait().unwrap();
        device.synchronize().unwrap();
        pair.shutdown().unwrap();
        group.shutdown().unwrap();
    });
    let trace = world.trace();
    let mut ends_by_rank = Vec::new();
    for rank in 0..2u64 {
        let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(format!("rank{rank}.json"))).unwrap())
            .expect("the rank file is JSON");
        assert!(events(&json).iter().all(|e| e["pid"] == rank), "rank {rank}'s file holds only its process");
        let groups: Vec<&str> =
            json["otherData"]["groups"].as_array().unwrap().iter().map(|g| g["desc"].as_str().unwrap()).collect();
        assert_eq!(groups, ["default_pg", "pair"], "both groups of the rank, in creation order");
        let device_ops = op_slices(&json, "device");
        let found: Vec<(&str, &str)> =
            device_ops.iter().map(|(track, e)| (track.as_str(), e["name"].as_str().unwrap())).collect();
        assert_eq!(
            found,
            [
                ("default_pg (0) comm stream", "nccl:all_reduce"),
                ("default_pg (0) comm stream", "nccl:all_reduce"),
                ("default_pg (0) comm stream", "nccl:all_reduce"),
                ("pair (0.0) comm stream", "nccl:broadcast"),
            ]
        );
        // Each device slice ends exactly when the simulator's communication kernel ended: the timing events
        // measure the device, not the host.
        let kernels: Vec<Duration> = trace
            .spans
            .iter()
            .filter(|s| s.device == rank as usize && s.kind == SpanKind::Kernel(KernelKind::Comm))
            .map(|s| s.end.expect("every op finished"))
            .collect();
        // In whole nanoseconds: the file's microseconds are floating point.
        let ns = |us: f64| (us * 1e3).round() as u64;
        let ends: Vec<u64> =
            device_ops.iter().map(|(_, e)| ns(e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())).collect();
        let kernel_ends: Vec<u64> = kernels.iter().map(|t| t.as_nanos() as u64).collect();
        assert_eq!(ends, kernel_ends, "rank {rank}: device ends against the simulated kernels");
        let host_ops = op_slices(&json, "host enqueue");
        assert_eq!(host_ops.len(), 4);
        assert!(host_ops.iter().all(|(track, _)| track.ends_with(" enqueue")));
        ends_by_rank.push(ends);
    }
    assert_eq!(ends_by_rank[0], ends_by_rank[1], "a collective ends at one virtual instant on both ranks");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn without_pg_trace_a_group_writes_nothing() {
    let dir = trace_dir("no-trace");
    let world = World::new(WorldConfig::with_devices(1));
    let store = world.store();
    world.run(1, move |rank, device| {
        let options = Options::builder().build_with_env_from(|_| None).unwrap();
        assert_eq!(options.trace_dir, None);
        let group = ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 1, device.clone(), options).unwrap();
        let buffer = device.alloc(DType::F32, 16).unwrap();
        group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
        assert_eq!(group.flush_trace().unwrap(), None);
        group.shutdown().unwrap();
    });
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "nothing was written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Many traced groups made and dropped, one after the other: the rank file keeps the newest dropped groups up to
/// its bound (and counts the others), and each drop renders its own group's ops only, not those of every group
/// before it.
#[test]
fn a_rank_file_keeps_a_bounded_number_of_dropped_groups() {
    let dir = trace_dir("many-groups");
    let world = World::new(WorldConfig::with_devices(1));
    let store = world.store();
    let options = Options::builder().trace_dir(Some(dir.clone())).build();
    const GROUPS: usize = 100;
    const OPS: usize = 5;
    let path = dir.join("rank0.json");
    world.run(1, move |rank, device| {
        let buffer = device.alloc(DType::F32, 16).unwrap();
        let mut rendered = 0;
        for g in 0..GROUPS {
            let prefixed = Arc::new(pg_store::PrefixStore::new(format!("g{g}"), Arc::clone(&store)));
            let group = ProcessGroup::<Mock>::new(prefixed, rank, 1, device.clone(), options.clone()).unwrap();
            for _ in 0..OPS {
                group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            }
            device.synchronize().unwrap();
            drop(group);
            let state = pg_core::trace_file_state(&path).expect("the group wrote the file");
            assert_eq!(state.live_groups, 0);
            assert_eq!(state.kept_groups, (g + 1).min(64), "after group {g}: {state:?}");
            assert_eq!(state.kept_ops, state.kept_groups * OPS);
            assert_eq!(state.released_groups as usize, g + 1 - state.kept_groups);
            assert_eq!(state.rendered_ops - rendered, OPS as u64, "group {g}'s drop rendered only its own ops");
            rendered = state.rendered_ops;
        }
    });
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("rank0.json")).unwrap()).unwrap();
    let groups = json["otherData"]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 64, "the rank file keeps the newest 64 of {GROUPS} dropped groups");
    assert_eq!(json["otherData"]["groups_released"], GROUPS - 64);
    assert_eq!(json["otherData"]["ops_released"], (GROUPS - 64) * OPS);
    assert_eq!(op_slices(&json, "device").len(), 64 * OPS, "every kept op's device span");
    assert_eq!(op_slices(&json, "host enqueue").len(), 64 * OPS);
    // Each kept group's tracks and arrows are its own.
    let flows: std::collections::HashSet<u64> =
        events(&json).iter().filter(|e| e["ph"] == "s").map(|e| e["id"].as_u64().unwrap()).collect();
    assert_eq!(flows.len(), 64 * OPS, "flow ids are distinct across the file's groups");
    let _ = std::fs::remove_dir_all(&dir);
}
