//! The fault matrix on the simulated backend, one test per scenario (`cargo xtask faults` prints
//! the same scenarios as a table).
#![forbid(unsafe_code)]

use pg_conformance::fault_matrix as matrix;

/// Runs scenario `id` in its own dump directory and fails with every check that did not hold.
fn check(id: &str) {
    let scenario = matrix::scenarios().into_iter().find(|s| s.id == id).expect("a scenario with this id");
    let dir = std::env::temp_dir().join(format!("pg-faults-test-{}-{id}", std::process::id()));
    // The debug-built mock runs a few thousand collectives a second: the test issues 5,000 unwaited ops per
    // variant (enough for 50 watchdog passes and about 50 stash releases racing the caller's drops),
    // `cargo xtask faults` 50,000.
    let outcome = (scenario.run)(&matrix::Env { dir: dir.clone(), unwaited_ops: 5_000 });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        outcome.pass(),
        "scenario {id} ({}): expected {}\nobserved: {}\nlatency: {:?}\nfailed checks:\n  {}",
        scenario.name,
        scenario.expected,
        outcome.observed,
        outcome.latency,
        outcome.failures.join("\n  ")
    );
}

/// A group of `size` on `device` whose store (a prefix `name` of `shared`) logs every call.
fn recorded_group(
    shared: &std::sync::Arc<dyn pg_core::store::Store>,
    name: &str,
    (rank, size): (usize, usize),
    device: &pg_mock::MockDevice,
    options: pg_core::Options,
) -> (std::sync::Arc<pg_mock::RecordingStore>, pg_core::ProcessGroup<pg_mock::Mock>) {
    use std::sync::Arc;
    let prefixed = Arc::new(pg_core::store::PrefixStore::new(name, Arc::clone(shared)));
    let recording = Arc::new(pg_mock::RecordingStore::new(prefixed));
    let store: Arc<dyn pg_core::store::Store> = Arc::clone(&recording) as Arc<dyn pg_core::store::Store>;
    let group = pg_core::ProcessGroup::new(store, rank, size, device.clone(), options).expect("creating a group");
    (recording, group)
}

#[test]
fn s1_a_rank_skips_one_collective() {
    check("1");
}

#[test]
fn s1b_the_error_propagates_through_the_store() {
    check("1b");
}

#[test]
fn s2_an_async_communicator_error_under_each_error_handling_mode() {
    check("2");
}

#[test]
fn s3_blocking_wait_on_a_hung_op_times_out_and_aborts() {
    check("3");
}

#[test]
fn s4_the_store_dies_during_rendezvous() {
    check("4");
}

#[test]
fn s5_a_wedged_watchdog_is_a_heartbeat_timeout() {
    check("5");
}

#[test]
fn s6_abort_from_a_second_thread_releases_the_waiter() {
    check("6");
}

#[test]
fn s7_fifty_thousand_unwaited_ops_keep_the_books_flat() {
    check("7");
}

#[test]
fn s8_is_gpu_only() {
    let scenario = matrix::scenarios().into_iter().find(|s| s.id == "8").expect("scenario 8");
    let outcome = (scenario.run)(&matrix::Env { dir: std::env::temp_dir(), unwaited_ops: 0 });
    assert!(outcome.not_applicable && !outcome.pass(), "the mock must not claim the GPU scenario");
}

#[test]
fn s9_a_new_group_on_a_fresh_prefix_works_after_an_error() {
    check("9");
}

/// The reliability layer's behaviour on healthy runs and around shutdown, next to the fault matrix.
mod healthy {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use pg_core::{DType, Device as _, ErrorType, Options, ReduceOp, Stream as _};
    use pg_mock::{World, WorldConfig};

    use super::matrix::group;

    fn dir(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("pg-faults-healthy-{}-{name}", std::process::id()))
    }

    #[test]
    fn long_healthy_ops_raise_no_alarm_and_the_sequence_numbers_advance() {
        // Ops that each take 3 s of device time, under a 10 s timeout and a 2 s heartbeat timeout: the watchdog
        // keeps beating while it waits, and nothing times out.
        let world = World::new(WorldConfig::with_devices(2));
        let store = world.store();
        let options = Options::builder()
            .timeout(Duration::from_secs(10))
            .heartbeat_timeout(Duration::from_secs(2))
            .desync_debug(true)
            .dump_path_prefix(format!("{}/trace_", dir("long").display()))
            .build();
        let seen = world.run(2, move |rank, device| {
            let pg = group(&store, "long", rank, 2, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            for _ in 0..5 {
                // The timeout runs from the host's enqueue, so the host keeps pace with the device.
                device.sleep_kernel(&device.current_stream(), Duration::from_secs(3)).unwrap();
                pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
                device.current_stream().synchronize().unwrap();
            }
            device.sleep(Duration::from_millis(300), &AtomicBool::new(false));
            let status = pg.status();
            let values = pg_mock::decode(DType::F32, &device.copy_to_host(&buffer, &device.current_stream()).unwrap());
            pg.shutdown().unwrap();
            (status, values)
        });
        for (rank, (status, values)) in seen.iter().enumerate() {
            assert_eq!(status.error_type, ErrorType::Success, "rank {rank}: {status:?}");
            assert_eq!(
                (status.last_enqueued_seq, status.last_started_seq, status.last_completed_seq),
                (Some(5), Some(5), Some(5)),
                "rank {rank}"
            );
            assert_eq!(status.in_flight, 0, "rank {rank}");
            assert!(status.watchdog_passes > 100, "rank {rank}: the watchdog ran {} passes", status.watchdog_passes);
            assert_eq!(status.dumps_written, 0, "rank {rank}: nothing to dump on a healthy run");
            assert_eq!(values, &[32.0; 8], "rank {rank}: five in-place sums of two ranks");
        }
    }

    #[test]
    fn a_dump_on_request_lists_the_ops_with_their_states() {
        let world = World::new(WorldConfig::with_devices(2));
        let store = world.store();
        let prefix = format!("{}/trace_", dir("request").display());
        let options = Options::builder().trace_buffer_size(3).dump_path_prefix(prefix.clone()).build();
        let dumps = world.run(2, move |rank, device| {
            let pg = group(&store, "request", rank, 2, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            for _ in 0..4 {
                pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            }
            device.current_stream().synchronize().unwrap();
            device.sleep(Duration::from_millis(300), &AtomicBool::new(false));
            // One more, still running when the dump is taken.
            device.sleep_kernel(&device.current_stream(), Duration::from_secs(1)).unwrap();
            let _running = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            let path = pg.dump_flight_recorder().unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            let inline = pg.flight_recorder_json();
            assert!(inline.contains("\"profiling_name\":\"nccl:all_reduce\""), "{inline}");
            (path, text)
        });
        for (rank, (path, text)) in dumps.iter().enumerate() {
            assert!(path.ends_with(format!("trace_{rank}")), "{}", path.display());
            // The ring keeps the last 3 of 5 ops: seqs 3 and 4 completed, 5 scheduled.
            for gone in [1, 2] {
                assert!(!text.contains(&format!("\"collective_seq_id\": {gone},")), "rank {rank}: seq {gone} kept");
            }
            assert_eq!(text.matches("\"state\": \"completed\"").count(), 2, "rank {rank}:\n{text}");
            assert_eq!(text.matches("\"state\": \"scheduled\"").count(), 1, "rank {rank}:\n{text}");
            assert!(text.contains("\"last_completed_collective\": 4"), "rank {rank}:\n{text}");
            assert!(text.contains("\"last_enqueued_collective\": 5"), "rank {rank}:\n{text}");
        }
        let _ = std::fs::remove_dir_all(dir("request"));
    }

    #[test]
    fn a_dump_asks_the_events_of_the_ops_whose_entries_are_not_retired() {
        // No watchdog and fewer ops than the in-flight list is pruned at: no entry is retired, so each one's state
        // comes from its op's events, asked through the in-flight list at dump time. Rank 1's second op waits for a
        // second of its current stream: rank 0's has started (its start event, desync debugging's, passed) and
        // waits for rank 1's part; rank 1's is scheduled.
        let world = World::new(WorldConfig::with_devices(2));
        let store = world.store();
        let options = Options::builder().enable_watchdog(false).desync_debug(true).build();
        let states = world.run(2, move |rank, device| {
            let pg = group(&store, "progress", rank, 2, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            device.current_stream().synchronize().unwrap();
            if rank == 1 {
                device.sleep_kernel(&device.current_stream(), Duration::from_secs(1)).unwrap();
            }
            let second = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            device.sleep(Duration::from_millis(100), &AtomicBool::new(false));
            let states = |pg: &pg_core::ProcessGroup<pg_mock::Mock>| -> Vec<(String, bool)> {
                let dump: serde_json::Value = serde_json::from_str(&pg.flight_recorder_json()).unwrap();
                let entries = dump["entries"].as_array().unwrap().iter();
                entries.map(|e| (e["state"].as_str().unwrap().to_owned(), e["retired"].as_bool().unwrap())).collect()
            };
            let during = states(&pg);
            second.wait().unwrap();
            device.current_stream().synchronize().unwrap();
            let after = states(&pg);
            pg.shutdown().unwrap();
            (during, after)
        });
        let entry = |state: &str| (state.to_owned(), false);
        assert_eq!(states[0].0, [entry("completed"), entry("started")], "rank 0 while rank 1's part waits");
        assert_eq!(states[1].0, [entry("completed"), entry("scheduled")], "rank 1 while its stream sleeps");
        for (rank, (_, after)) in states.iter().enumerate() {
            assert_eq!(after, &[entry("completed"), entry("completed")], "rank {rank} once both ended");
        }
    }

    #[test]
    fn dropping_a_group_with_a_hung_op_neither_hangs_nor_leaves_its_communicator_running() {
        // Rank 1 never joins op 1, and neither rank waits or shuts down: dropping the groups must return, and
        // the dropped group's communicator is aborted (its pending op released).
        let world = World::new(WorldConfig::with_devices(2));
        let store = world.store();
        let options = Options::builder().dump_on_timeout(false).build();
        let retained = world.run(2, move |rank, device| {
            let pg = group(&store, "drop", rank, 2, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            let hung = (rank == 0).then(|| pg.all_reduce(&buffer, ReduceOp::Sum).unwrap());
            device.sleep(Duration::from_millis(500), &AtomicBool::new(false));
            let completed_before = hung.as_ref().map(|w| w.is_completed());
            drop(pg);
            (completed_before, hung.map(|w| w.is_completed()))
        });
        assert_eq!(retained[0], (Some(false), Some(true)), "the hung op ends once its group is dropped");
    }

    #[test]
    fn shutting_down_while_the_watchdog_waits_on_a_dead_store_waits_only_briefly() {
        // With error propagation on, the watchdog reads the store every pass; once the store stops answering,
        // a read waits for the store's timeout (300 s). Shutdown gives the watchdog 200 ms to finish its store
        // operation (a healthy store answers well within that, and a watchdog detached just before it
        // finishes could tear the group down while the process exits), then detaches it: it never waits for
        // the store's timeout. (A plain drop never waits: the watchdog holds the group while it reads, so the
        // group is dropped by the watchdog afterwards.)
        let world = World::new(WorldConfig::with_devices(1));
        let store = world.store();
        let options = Options::builder().propagate_error(true).dump_on_timeout(false).build();
        let took = world.run(1, move |rank, device| {
            let pg = group(&store, "dead-store", rank, 1, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            device.world().inject(pg_mock::Fault::StoreDown { fail_fast: false });
            device.sleep(Duration::from_millis(250), &AtomicBool::new(false));
            // The world's clock, which a join outside the simulation cannot hold back as it holds this thread's.
            let before = device.world().now();
            pg.shutdown().unwrap();
            drop(pg);
            device.world().now() - before
        });
        // The watchdog gets its 200 ms to finish the store operation before it is detached, and no more.
        assert!(
            took[0] >= Duration::from_millis(200) && took[0] <= Duration::from_millis(210),
            "shutdown took {:?}",
            took[0]
        );
    }

    #[test]
    fn set_timeout_applies_to_the_ops_enqueued_after_it() {
        let world = World::new(WorldConfig::with_devices(2));
        let store = world.store();
        let options = Options::builder().dump_on_timeout(false).build();
        let seen = world.run(2, move |rank, device| {
            let pg = group(&store, "set-timeout", rank, 2, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            let before = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            before.wait().unwrap();
            pg.set_timeout(Duration::from_millis(300));
            if rank == 1 {
                // Rank 1 skips the next collective and waits for rank 0 to give up on it.
                store.wait(&["set-timeout-failed"], Some(Duration::from_secs(60))).unwrap();
                return None;
            }
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            while pg.status().error.is_none() {
                device.sleep(Duration::from_millis(1), &AtomicBool::new(false));
            }
            store.set("set-timeout-failed", b"1").unwrap();
            let detected = pg.status().error_detected_at.unwrap() - work.start_time();
            Some((before.timeout(), work.timeout(), detected))
        });
        let (before, after, detected) = seen[0].unwrap();
        assert_eq!((before, after), (pg_core::DEFAULT_TIMEOUT, Duration::from_millis(300)));
        assert!(detected > after && detected <= after + Duration::from_millis(200), "detected after {detected:?}");
    }

    #[test]
    fn an_idle_watchdog_sleeps_until_a_new_op_wakes_it() {
        // After an hour with nothing in flight the watchdog has made a handful of passes, not 36,000 (so the
        // mock's clock can jump and a stuck test still ends quickly); the next op wakes it, and its timeout is
        // caught on time.
        let world = World::new(WorldConfig::with_devices(2));
        let store = world.store();
        let options = Options::builder().timeout(Duration::from_secs(1)).dump_on_timeout(false).build();
        let seen = world.run(2, move |rank, device| {
            let pg = group(&store, "idle", rank, 2, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            device.sleep(Duration::from_secs(3600), &AtomicBool::new(false));
            let passes = pg.status().watchdog_passes;
            if rank == 1 {
                store.wait(&["idle-failed"], Some(Duration::from_secs(60))).unwrap();
                return (passes, None);
            }
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            while pg.status().error.is_none() {
                device.sleep(Duration::from_millis(1), &AtomicBool::new(false));
            }
            store.set("idle-failed", b"1").unwrap();
            (passes, Some(pg.status().error_detected_at.unwrap() - work.start_time()))
        });
        for (rank, (passes, _)) in seen.iter().enumerate() {
            assert!(*passes < 20, "rank {rank}: {passes} watchdog passes in an idle hour");
        }
        let detected = seen[0].1.unwrap();
        assert!(detected <= Duration::from_millis(1200), "the timeout was caught after {detected:?}");
    }

    #[test]
    fn a_watchdog_pass_queries_one_end_event_per_thread_for_the_ops_that_passed() {
        // Every event query costs the caller 1 ms of host time and nothing else on the host costs anything: a pass
        // over 200 finished Works of one thread queries the newest one's end event only (a stream runs its work in
        // order), and takes 1 ms, not 200; every Work is retired all the same, its completion noted.
        const OPS: u64 = 200;
        let mut config = WorldConfig::with_devices(1);
        let zero = Duration::ZERO;
        config.host = pg_mock::HostCosts {
            kernel_launch: zero,
            event_record: zero,
            stream_wait: zero,
            query: Duration::from_millis(1),
            collective_enqueue: zero,
            store_op: zero,
        };
        let world = World::new(config);
        let store = world.store();
        let options = Options::builder().watchdog_period(Duration::from_secs(3600)).dump_on_timeout(false).build();
        let seen = world.run(1, move |rank, device| {
            let pg = group(&store, "one-query", rank, 1, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            let hold = pg.hold_watchdog();
            for _ in 0..OPS {
                pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            }
            device.current_stream().synchronize().unwrap();
            let before = device.now();
            pg.watchdog_pass_now();
            let took = device.now() - before;
            let status = pg.status();
            drop(hold);
            (took, status.in_flight, status.last_completed_seq)
        });
        let (took, in_flight, last_completed) = seen[0];
        assert!(took < Duration::from_millis(3), "the pass took {took:?} of host time: a query per Work");
        assert_eq!((in_flight, last_completed), (0, Some(OPS)), "every Work retired, the last one's completion noted");
    }

    #[test]
    fn the_op_that_wakes_an_idle_watchdog_gets_its_first_pass_a_period_later() {
        // The first op after an idle spell wakes the watchdog, which then passes a period later, as a running one
        // would, rather than at once beside the burst of ops that op starts.
        let world = World::new(WorldConfig::with_devices(1));
        let store = world.store();
        let period = Duration::from_millis(100);
        let options = Options::builder().watchdog_period(period).dump_on_timeout(false).build();
        let seen = world.run(1, move |rank, device| {
            let pg = group(&store, "idle-wake", rank, 1, &device, options.clone());
            let buffer = device.alloc(DType::F32, 8).unwrap();
            device.fill(&buffer, 1.0, &device.current_stream()).unwrap();
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            let never = AtomicBool::new(false);
            device.sleep(Duration::from_secs(60), &never);
            let idle = pg.status().watchdog_passes;
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            device.sleep(period / 2, &never);
            let half_a_period = pg.status().watchdog_passes;
            device.sleep(period, &never);
            let a_period_and_a_half = pg.status().watchdog_passes;
            work.wait().unwrap();
            (idle, half_a_period, a_period_and_a_half)
        });
        let (idle, half_a_period, a_period_and_a_half) = seen[0];
        assert_eq!(half_a_period, idle, "a pass ran at once after the op that woke the idle watchdog");
        assert!(a_period_and_a_half > idle, "no pass a period after the op that woke the watchdog");
    }
}

/// How a group stops its host threads, and when it stops using the store.
mod stopping {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use pg_core::{Device as _, ErrorKind, Options, ReduceOp};
    use pg_mock::{Fault, MockDevice, World, WorldConfig};

    use super::matrix::group;

    /// Eight elements set to `value`.
    fn filled(device: &MockDevice, value: f64) -> pg_mock::MockBuffer {
        super::matrix::filled(device, 8, value)
    }

    /// The names of the running threads that belong to a group's helpers (the watchdog, the heartbeat monitor).
    fn helpers(world: &World) -> Vec<String> {
        let names = world.host_threads();
        names.into_iter().filter(|name| name.starts_with("pt_nccl_")).collect()
    }

    #[test]
    fn shutdown_returns_after_the_watchdog_and_the_monitor_have_ended() {
        // Twenty groups in turn: a shutdown that did not wait for its threads would leave one running at least
        // once (a thread told to stop ends soon, but not at once).
        let world = World::new(WorldConfig::with_devices(1));
        let store = world.store();
        let seen = world.run(1, move |rank, device| {
            let mut seen = Vec::new();
            for round in 0..20 {
                let name = format!("threads-{round}");
                let pg = group(&store, &name, rank, 1, &device, Options::builder().enable_monitoring(true).build());
                pg.all_reduce(&filled(&device, 1.0), ReduceOp::Sum).unwrap().wait().unwrap();
                let running = helpers(&device.world());
                pg.shutdown().unwrap();
                // Nothing of the group runs once shutdown has returned, though the caller still holds the group.
                let after = helpers(&device.world());
                drop(pg);
                seen.push((running, after));
            }
            seen
        });
        for (round, (running, after)) in seen[0].iter().enumerate() {
            assert_eq!(running.len(), 2, "round {round}: the watchdog and the heartbeat monitor run: {running:?}");
            assert!(after.is_empty(), "round {round}: still running after shutdown: {after:?}");
        }
    }

    #[test]
    fn shutting_down_a_group_whose_watchdog_is_wedged_does_not_wait_for_it() {
        // The watchdog is stuck in a call that stopping cannot end (as in a driver call that never returns): once
        // the heartbeat monitor has declared it stuck, shutdown returns at once instead of joining it.
        let world = World::new(WorldConfig::with_devices(1));
        let store = world.store();
        let heartbeat = Duration::from_secs(2);
        let options = Options::builder()
            .heartbeat_timeout(heartbeat)
            .watchdog_period(Duration::from_millis(100))
            .dump_on_timeout(false);
        let seen = world.run(1, move |rank, device| {
            let pg = group(&store, "wedged", rank, 1, &device, options.clone().build());
            pg.all_reduce(&filled(&device, 1.0), ReduceOp::Sum).unwrap().wait().unwrap();
            pg.inject_watchdog_stall(Duration::from_secs(3600));
            while pg.error().is_none() {
                device.sleep(Duration::from_millis(10), &AtomicBool::new(false));
            }
            let before = device.world().now();
            let _ = pg.shutdown();
            drop(pg);
            device.world().now() - before
        });
        let took = seen[0];
        assert!(took < Duration::from_secs(1), "shutdown waited {took:?} for a wedged watchdog");
    }

    #[test]
    fn the_watchdog_looks_for_a_dump_request_once_a_second_and_only_after_an_op() {
        // A peer's request to dump arrives through the store; with a watchdog pass every 10 ms, reading it every
        // pass would be a store round trip per pass. Before the group's first op there is nothing to dump.
        let world = World::new(WorldConfig::with_devices(1));
        let shared = world.store();
        let seen = world.run(1, move |rank, device| {
            let options = Options::builder().watchdog_period(Duration::from_millis(10)).propagate_error(false).build();
            let (recording, pg) = super::recorded_group(&shared, "dump", (rank, 1), &device, options);
            let reads = || recording.log().iter().filter(|(op, key)| *op == "check" && key == "exception_dump").count();
            device.sleep(Duration::from_secs(3), &AtomicBool::new(false));
            let before_any_op = reads();
            let buffer = filled(&device, 1.0);
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            // Keep an op in flight so that the watchdog keeps passing every period.
            let mut works = Vec::new();
            for _ in 0..300 {
                works.push(pg.all_reduce(&buffer, ReduceOp::Sum).unwrap());
                device.sleep(Duration::from_millis(10), &AtomicBool::new(false));
            }
            let over_three_seconds = reads();
            drop(pg);
            (before_any_op, over_three_seconds)
        });
        let (before_any_op, over_three_seconds) = seen[0];
        assert_eq!(before_any_op, 0, "read the dump key before the group's first op");
        assert!((2..=4).contains(&over_three_seconds), "{over_three_seconds} reads of the dump key in 3 s");
    }

    #[test]
    fn once_a_store_operation_failed_the_watchdog_no_longer_uses_the_store() {
        // Error propagation reads the peers' error key every pass. The store then fails: the watchdog notes it
        // once and stops reading it, and a later timeout does not try to signal the peers through it.
        let world =
            World::new(WorldConfig { faults: vec![Fault::HangAt { rank: 0, op: 1 }], ..WorldConfig::with_devices(1) });
        let shared = world.store();
        let seen = world.run(1, move |rank, device| {
            let options = Options::builder()
                .propagate_error(true)
                .dump_on_timeout(false)
                .timeout(Duration::from_secs(2))
                .watchdog_period(Duration::from_millis(100))
                .build();
            let (recording, pg) = super::recorded_group(&shared, "broken", (rank, 1), &device, options);
            let buffer = filled(&device, 1.0);
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            device.world().inject(Fault::StoreDown { fail_fast: true });
            let mark = recording.len();
            // Op 1 hangs: its timeout is found after the store has failed.
            let _work = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            while pg.error().is_none() {
                device.sleep(Duration::from_millis(10), &AtomicBool::new(false));
            }
            let error = pg.error().map(|e| e.kind());
            device.sleep(Duration::from_secs(1), &AtomicBool::new(false));
            let after = recording.log_since(mark);
            let dumps = pg.status().dumps_written;
            drop(pg);
            (error, after, dumps)
        });
        let (error, after, dumps) = &seen[0];
        assert_eq!(*error, Some(ErrorKind::WorkTimeout), "the hung op times out");
        let reads = after.iter().filter(|(op, key)| *op == "check" && key.starts_with("remote_error")).count();
        assert_eq!(reads, 1, "one failed read of the error key, then none: {after:?}");
        let writes: Vec<_> = after.iter().filter(|(op, _)| *op == "set").collect();
        assert!(writes.is_empty(), "signalled through a failed store: {writes:?}");
        assert_eq!(*dumps, 0, "dumped the flight recorder with dump_on_timeout off");
    }
}

/// Which error a failure surfaces as, and who publishes a unique id.
mod errors {
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    use pg_core::{Device as _, ErrorKind, Options, ProcessGroup, ReduceOp};
    use pg_mock::{Fault, Mock, MockDevice, World, WorldConfig};

    use super::matrix::group;

    /// Eight elements set to 1.
    fn filled(device: &MockDevice) -> pg_mock::MockBuffer {
        super::matrix::filled(device, 8, 1.0)
    }

    #[test]
    fn a_store_that_fails_during_the_id_exchange_is_a_store_error_not_an_init_timeout() {
        // The store fails at once (a network error) when rank 1 waits for rank 0's unique id, while the group has
        // less time left than the store's own timeout: rank 1's op says the store failed; it is not reported as
        // the communicator's init running out of time.
        let world = World::new(WorldConfig::with_devices(2));
        let store = world.store();
        let kinds = world.run(2, move |rank, device| {
            let options = Options::builder().timeout(Duration::from_secs(1)).dump_on_timeout(false).build();
            let pg = group(&store, "id-exchange", rank, 2, &device, options);
            // Both groups exist by 50 ms of virtual time; the store fails then, and rank 1's first op comes after.
            device.sleep(Duration::from_millis(50 * (rank as u64 + 1)), &AtomicBool::new(false));
            match rank {
                0 => {
                    device.world().inject(Fault::StoreDown { fail_fast: true });
                    None
                }
                _ => pg.all_reduce(&filled(&device), ReduceOp::Sum).err().map(|e| e.kind()),
            }
        });
        assert_eq!(kinds[1], Some(ErrorKind::StoreNetwork));
    }

    #[test]
    fn the_lower_rank_of_a_pair_publishes_the_pair_s_unique_id() {
        // As PyTorch: in a point-to-point communicator the lower rank is rank 0 and makes the id, so that a pg
        // rank and a PyTorch rank agree on who publishes it.
        let world = World::new(WorldConfig::with_devices(2));
        let shared = world.store();
        let logs = world.run(2, move |rank, device| {
            let (recording, pg) =
                super::recorded_group(&shared, "pair", (rank, 2), &device, Options::builder().build());
            let buffer = filled(&device);
            let work = match rank {
                0 => pg.send(&buffer, 1).unwrap(),
                _ => pg.recv(&buffer, 0).unwrap(),
            };
            work.wait().unwrap();
            device.synchronize().unwrap();
            recording.log().into_iter().filter(|(_, key)| key == "0:1").map(|(op, _)| op).collect::<Vec<_>>()
        });
        assert!(logs[0].contains(&"compare_set"), "rank 0 did not publish the pair's id: {:?}", logs[0]);
        assert!(!logs[1].contains(&"compare_set"), "rank 1 published the pair's id: {:?}", logs[1]);
    }

    /// A group on a communicator that reports an asynchronous error once its first op has finished; its second
    /// op never completes. Returns what `probe` sees.
    fn after_an_async_error<T: Send>(
        watchdog_period: Duration,
        probe: impl Fn(&ProcessGroup<Mock>, &pg_core::WorkHandle<Mock>, &MockDevice) -> T + Send + Sync,
    ) -> T {
        let world = World::new(WorldConfig {
            faults: vec![Fault::AsyncError { rank: 0, after_ops: 1 }],
            ..WorldConfig::with_devices(1)
        });
        let store = world.store();
        let mut seen = world.run(1, move |rank, device| {
            let options = Options::builder()
                .timeout(Duration::from_secs(1))
                .watchdog_period(watchdog_period)
                .dump_on_timeout(false)
                .build();
            let pg = group(&store, "async", rank, 1, &device, options);
            let buffer = filled(&device);
            pg.all_reduce(&buffer, ReduceOp::Sum).unwrap().synchronize().unwrap();
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            probe(&pg, &work, &device)
        });
        seen.remove(0)
    }

    #[test]
    fn is_completed_reports_an_asynchronous_error_without_waiting_for_the_watchdog() {
        // The watchdog passes once a minute: the caller's own is_completed() reads the communicator's error.
        let seen = after_an_async_error(Duration::from_secs(60), |_, work, device| {
            device.sleep(Duration::from_millis(10), &AtomicBool::new(false));
            (work.is_completed(), work.exception().map(|e| e.kind()))
        });
        assert_eq!(seen, (true, Some(ErrorKind::Communicator)));
    }

    #[test]
    fn an_asynchronous_error_found_after_the_timeout_is_reported_as_itself() {
        // The watchdog's next pass comes after both the communicator's error and the op's timeout: the group's
        // error is the communicator's, the cause, not the timeout it led to.
        let seen = after_an_async_error(Duration::from_secs(3), |pg, _, device| {
            while pg.error_type() == pg_core::ErrorType::Success {
                device.sleep(Duration::from_millis(100), &AtomicBool::new(false));
            }
            pg.status().error.map(|e| e.kind())
        });
        assert_eq!(seen, Some(ErrorKind::Communicator));
    }
}
