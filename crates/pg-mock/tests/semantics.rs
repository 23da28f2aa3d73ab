//! The semantics S1-S20 and S27 of DESIGN.md, each a test named after it, run by the generic process group
//! on the simulated backend.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_core::store::Store;
use pg_core::{
    CommKey, DType, Device, ErrorKind, Event, KernelKind, Options, OptionsBuilder, ProcessGroup, ReduceOp, Stream,
    StreamGuard,
};
use pg_mock::{HazardMode, Mock, MockBuffer, MockDevice, World, WorldConfig};

const SLEEP: Duration = Duration::from_millis(40);

/// One simulated rank, with helpers to make groups and buffers.
struct Rank {
    rank: usize,
    size: usize,
    device: MockDevice,
    store: Arc<dyn Store>,
}

impl Rank {
    fn group(&self, name: &str, options: OptionsBuilder) -> ProcessGroup<Mock> {
        let store = Arc::new(pg_core::store::PrefixStore::new(format!("{name}/"), Arc::clone(&self.store)));
        let options = options.group_name(name.to_owned()).build();
        ProcessGroup::new(store, self.rank, self.size, self.device.clone(), options).expect("group")
    }

    fn filled(&self, value: f64, numel: usize) -> MockBuffer {
        let buffer = self.device.alloc(DType::F32, numel).expect("alloc");
        self.device.fill(&buffer, value, &self.device.current_stream()).expect("fill");
        buffer
    }

    fn read(&self, buffer: &MockBuffer) -> Vec<f32> {
        let bytes = self.device.copy_to_host(buffer, &self.device.current_stream()).expect("copy_to_host");
        bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    fn sleep_current(&self, duration: Duration) {
        self.device.sleep_kernel(&self.device.current_stream(), duration).expect("sleep kernel");
    }

    /// Host time taken by `f`, on this rank's (virtual) host clock.
    fn host_time<T>(&self, f: impl FnOnce() -> T) -> (T, Duration) {
        let start = self.device.now();
        let value = f();
        (value, self.device.now() - start)
    }
}

fn world_with(n: usize, hazards: HazardMode) -> World {
    World::new(WorldConfig { devices: n, hazard_mode: hazards, ..Default::default() })
}

/// Runs `body` on `n` simulated ranks (hazards panic) and returns the world and each rank's result.
fn run<T: Send>(n: usize, body: impl Fn(&Rank) -> T + Sync) -> (World, Vec<T>) {
    run_in(world_with(n, HazardMode::Panic), n, body)
}

fn run_in<T: Send>(world: World, n: usize, body: impl Fn(&Rank) -> T + Sync) -> (World, Vec<T>) {
    let store = world.store();
    let results = world.run(n, |rank, device| body(&Rank { rank, size: n, device, store: Arc::clone(&store) }));
    (world, results)
}

fn triangle(n: usize) -> f32 {
    (1..=n).sum::<usize>() as f32
}

#[test]
fn s01_sync_form_is_the_async_call_then_wait() {
    let scenario = |sync: bool| {
        run(2, move |r| {
            let group = r.group("0", Options::builder());
            group.barrier_sync().unwrap();
            let buffer = r.filled((r.rank + 1) as f64, 256);
            r.sleep_current(SLEEP);
            let (work_done, host) = r.host_time(|| match sync {
                true => group.all_reduce_sync(&buffer, ReduceOp::Sum).map(|()| None),
                false => group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait().map(|()| Some(w))),
            });
            let work = work_done.expect("all_reduce");
            if let Some(work) = &work {
                assert!(!work.is_completed(), "the async form returns before the device finishes");
            }
            (host, r.read(&buffer))
        })
    };
    let (sync_world, sync) = scenario(true);
    let (async_world, asynchronous) = scenario(false);
    for ((sync_host, sync_values), (async_host, async_values)) in sync.iter().zip(&asynchronous) {
        assert_eq!(sync_host, async_host, "the sync form costs exactly the async call plus wait()");
        assert!(*sync_host < SLEEP / 100, "neither form blocks the host on the device: {sync_host:?}");
        assert_eq!(sync_values, async_values);
        assert!(sync_values.iter().all(|v| *v == triangle(2)));
    }
    assert_eq!(sync_world.kernel_log(0), async_world.kernel_log(0), "the same device work in the same order");
}

#[test]
fn s02_call_chain_runs_on_the_comm_stream_after_the_input_is_ready() {
    let (world, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 64);
        r.sleep_current(SLEEP);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        work.synchronize().unwrap();
        let done_at = r.device.now();
        (r.device.current_stream().id(), work.comm_stream().id(), done_at)
    });
    for (rank, (current, comm, done_at)) in results.into_iter().enumerate() {
        let log = world.kernel_log(rank);
        let sleep = log.iter().find(|k| k.kind == KernelKind::Sleep).expect("a sleep kernel");
        let comm_kernel = log.iter().find(|k| k.kind == KernelKind::Comm).expect("a comm kernel");
        assert_eq!(sleep.stream_id, current);
        assert_eq!(comm_kernel.stream_id, comm, "the op is enqueued on the group's comm stream");
        assert!(comm_kernel.start >= sleep.end, "the comm stream waited for the input-ready event");
        assert_eq!(done_at, comm_kernel.end, "the end event is recorded right after the op");
    }
}

#[test]
fn s03_communicators_are_created_lazily_and_reused() {
    let (_, counts) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let before = group.counters().comms_created;
        let buffer = r.filled(1.0, 8);
        let mut after = Vec::new();
        for _ in 0..3 {
            group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
            after.push(group.counters().comms_created);
        }
        let eager = r.group("1", Options::builder().eager_init(true));
        (before, after, eager.counters().comms_created)
    });
    for (before, after, eager) in counts {
        assert_eq!(before, 0, "creating a group creates no communicator");
        assert_eq!(after, vec![1, 1, 1], "the first op creates it, later ops reuse it");
        assert_eq!(eager, 1, "eager init creates the collective communicator with the group");
    }
}

#[test]
fn s04_cache_keys_are_the_device_sequence_and_the_sorted_pair() {
    fn check(key: CommKey, expected: &str) {
        assert_eq!(key.cache_key(), expected);
    }
    check(CommKey::Collective(vec![0]), "0");
    check(CommKey::Collective(vec![0, 1]), "0,1");
    check(CommKey::Collective(vec![1, 0]), "1,0");
    check(CommKey::SingleP2p { rank: 3, peer: 1 }, "1:3");
    check(CommKey::SingleP2p { rank: 1, peer: 3 }, "1:3");

    let (_, keys) = run(4, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(r.rank as f64, 4);
        match r.rank {
            1 => group.send(&buffer, 3).unwrap().wait().unwrap(),
            3 => group.recv(&buffer, 1).unwrap().wait().unwrap(),
            _ => {}
        }
        group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
        r.read(&buffer);
        group.comm_keys()
    });
    assert_eq!(keys[0], vec!["0"]);
    assert_eq!(keys[1], vec!["1", "1:3"], "device key of rank 1 is its device ordinal");
    assert_eq!(keys[3], vec!["1:3", "3"]);
}

#[test]
fn s05_groups_with_identical_membership_never_share_a_communicator() {
    let n = 4;
    let (_, rows) = run(n, |r| {
        ["0", "1", "2"]
            .iter()
            .map(|name| {
                let group = r.group(name, Options::builder().high_priority_stream(*name == "2"));
                let mut correct = 0;
                let mut after_first = 0;
                for op in 0..3 {
                    let buffer = r.filled((r.rank + 1) as f64, 32);
                    group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
                    correct += usize::from(r.read(&buffer).iter().all(|v| *v == triangle(n)));
                    if op == 0 {
                        after_first = group.counters().comms_created;
                    }
                }
                (group.counters().comms_created, group.counters().comms_created - after_first, correct)
            })
            .collect::<Vec<_>>()
    });
    let creations: u64 = rows.iter().flatten().map(|row| row.0).sum();
    let late: u64 = rows.iter().flatten().map(|row| row.1).sum();
    let correct: usize = rows.iter().flatten().map(|row| row.2).sum();
    assert_eq!(creations, 3 * n as u64);
    assert_eq!(late, 0, "no creation after the first op of each group");
    assert_eq!(correct, 9 * n);
}

#[test]
fn s06_single_p2p_uses_the_pair_key_and_does_not_advance_the_counter() {
    let (world, counters) = run(4, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled((r.rank + 1) as f64, 16);
        let before = group.next_comm_counter();
        // Only ranks 0 and 1 run a P2P op; if it advanced the counter, the collective below would read
        // different store keys on different ranks and never complete.
        match r.rank {
            0 => group.send(&buffer, 1).unwrap().wait().unwrap(),
            1 => group.recv(&buffer, 0).unwrap().wait().unwrap(),
            _ => {}
        }
        let after_p2p = group.next_comm_counter();
        let fresh = r.filled((r.rank + 1) as f64, 16);
        group.all_reduce_sync(&fresh, ReduceOp::Sum).unwrap();
        assert!(r.read(&fresh).iter().all(|v| *v == triangle(4)));
        (before, after_p2p, group.next_comm_counter())
    });
    for (before, after_p2p, after_collective) in counters {
        assert_eq!((before, after_p2p, after_collective), (0, 0, 1));
    }
    let mut keys = world.store().list_keys().unwrap();
    // The group-instance keys beside the unique ids are not unique-id keys.
    keys.retain(|key| !key.contains("pg_group_instance"));
    // The group's PrefixStore("0/") adds its own "/", as PyTorch's does: "0/" + "/" + key.
    assert!(keys.contains(&"0//0:1".to_owned()), "the P2P id went through the pair key: {keys:?}");
    assert!(keys.contains(&"0//0".to_owned()), "the collective id went through counter key 0: {keys:?}");
    assert_eq!(keys.len(), 2, "no other unique-id key: {keys:?}");
}

#[test]
fn s07_a_communicator_being_created_sits_in_the_initialisation_map() {
    let world = world_with(2, HazardMode::Panic);
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_by_ranks = Arc::clone(&seen);
    let never = std::sync::atomic::AtomicBool::new(false);
    run_in(world, 2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 4);
        if r.rank == 1 {
            // Rank 1 arrives late, so rank 0's communicator stays in the initialisation map for a while.
            r.device.sleep(Duration::from_secs(1), &never);
            group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
            return;
        }
        let observer = {
            let group = group.clone();
            let device = r.device.clone();
            let seen = Arc::clone(&seen_by_ranks);
            device.clone().spawn_host_thread(
                "observer",
                Box::new(move || {
                    device.sleep(Duration::from_millis(500), &std::sync::atomic::AtomicBool::new(false));
                    seen.lock().unwrap().push((group.initializing_keys(), group.comm_keys()));
                }),
            )
        }
        .unwrap();
        group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
        observer.join().unwrap();
        seen_by_ranks.lock().unwrap().push((group.initializing_keys(), group.comm_keys()));
    });
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0], (vec!["0".to_owned()], vec![]), "while creating: in the initialisation map only");
    assert_eq!(seen[1], (vec![], vec!["0".to_owned()]), "once ready: moved to the cache");
}

#[test]
fn s08_each_key_gets_a_dedicated_stream_from_the_pool_by_priority() {
    let env_high = |name: &str| (name == "TORCH_NCCL_HIGH_PRIORITY").then(|| "1".to_owned());
    let (_, streams) = run(2, |r| {
        let normal = r.group("0", Options::builder());
        let high = r.group("1", Options::builder().high_priority_stream(true));
        let from_env = {
            let store = Arc::new(pg_core::store::PrefixStore::new("2/", Arc::clone(&r.store)));
            let options = Options::builder().group_name("2".to_owned()).build_with_env_from(env_high).unwrap();
            ProcessGroup::new(store, r.rank, r.size, r.device.clone(), options).unwrap()
        };
        let buffer = r.filled(1.0, 4);
        for group in [&normal, &high, &from_env] {
            group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
        }
        let peer = 1 - r.rank;
        let p2p = match r.rank {
            0 => normal.send(&buffer, peer).unwrap(),
            _ => normal.recv(&buffer, peer).unwrap(),
        };
        p2p.wait().unwrap();
        let key = r.device.index().to_string();
        let stream = |g: &ProcessGroup<Mock>, k: &str| g.comm_stream(k).unwrap();
        (
            stream(&normal, &key),
            stream(&high, &key),
            stream(&from_env, &key),
            stream(&normal, "0:1"),
            r.device.current_stream(),
        )
    });
    for (normal, high, from_env, p2p, current) in streams {
        assert!(!normal.is_high_priority());
        assert!(high.is_high_priority() && from_env.is_high_priority(), "option and env pick the high pool");
        let all = [&normal, &high, &from_env, &p2p, &current];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b, "every key of every group has its own stream, none is the current stream");
            }
        }
    }
}

#[test]
fn s09_the_collective_waits_for_the_input_ready_event() {
    let (world, values) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled((r.rank + 1) as f64, 1024);
        r.sleep_current(SLEEP);
        group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
        r.read(&buffer)
    });
    for (rank, values) in values.iter().enumerate() {
        assert!(values.iter().all(|v| *v == triangle(2)), "the op read the inputs after they were written");
        let log = world.kernel_log(rank);
        let sleep_end = log.iter().find(|k| k.kind == KernelKind::Sleep).unwrap().end;
        let comm = log.iter().find(|k| k.kind == KernelKind::Comm).unwrap();
        assert!(comm.start >= sleep_end, "a long kernel on the current stream delays the collective");
    }
    assert!(world.hazards().is_empty());
}

/// Ops, each behind a long kernel on the current stream, with `events` input-ready events in turn: every
/// collective starts after the kernel enqueued just before it.
fn check_input_ready_ring(events: usize) {
    const OPS: usize = 7;
    let (world, _) = run(2, |r| {
        let group = r.group("0", Options::builder().input_ready_events(events));
        let buffer = r.filled(1.0, 1024);
        for _ in 0..OPS {
            r.sleep_current(SLEEP);
            drop(group.all_reduce(&buffer, ReduceOp::Sum).unwrap());
        }
        r.device.synchronize().unwrap();
    });
    for rank in 0..2 {
        let log = world.kernel_log(rank);
        let sleeps: Vec<_> = log.iter().filter(|k| k.kind == KernelKind::Sleep).collect();
        let comms: Vec<_> = log.iter().filter(|k| k.kind == KernelKind::Comm).collect();
        assert_eq!((sleeps.len(), comms.len()), (OPS, OPS));
        for (op, (sleep, comm)) in sleeps.iter().zip(&comms).enumerate() {
            assert!(comm.start >= sleep.end, "{events} events: op {op} started before its inputs were written");
        }
    }
    assert!(world.hazards().is_empty());
}

#[test]
fn s09_every_input_ready_event_count_keeps_the_order() {
    check_input_ready_ring(1);
    check_input_ready_ring(2);
    check_input_ready_ring(4);
    check_input_ready_ring(64);
}

#[test]
fn s10_the_end_event_is_recorded_right_after_the_op() {
    let (world, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 1 << 20);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let completed_before = work.is_completed();
        work.synchronize().unwrap();
        (completed_before, work.is_completed(), r.device.now())
    });
    for (rank, (before, after, synced_at)) in results.into_iter().enumerate() {
        let comm = world.kernel_log(rank).into_iter().find(|k| k.kind == KernelKind::Comm).unwrap();
        assert!(!before && after);
        // The host wakes when the op ends, plus the modelled host cost of the synchronize call itself.
        assert!(synced_at >= comm.end, "the end event cannot pass before the op ends");
        assert!(synced_at - comm.end <= Duration::from_micros(1), "nor later: {:?}", synced_at - comm.end);
    }
}

#[test]
fn s11_default_wait_orders_the_current_stream_and_returns_at_once() {
    let (world, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 1024);
        r.sleep_current(SLEEP);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let ((), host) = r.host_time(|| work.wait().unwrap());
        let completed = work.is_completed();
        // Work after wait() on the current stream is ordered after the op.
        r.device.fill(&buffer, 7.0, &r.device.current_stream()).unwrap();
        (host, completed, r.read(&buffer))
    });
    for (rank, (host, completed, values)) in results.into_iter().enumerate() {
        assert!(host < SLEEP / 100, "wait() did not block the host: {host:?}");
        assert!(!completed, "the Work is usually not complete after wait()");
        assert!(values.iter().all(|v| *v == 7.0));
        let log = world.kernel_log(rank);
        let comm_end = log.iter().find(|k| k.kind == KernelKind::Comm).unwrap().end;
        let later_fill = log.iter().rfind(|k| k.kind == KernelKind::Fill).unwrap();
        assert!(later_fill.start >= comm_end, "the current stream waited on the end event");
    }
    assert!(world.hazards().is_empty());
}

#[test]
fn s12_buffers_outlive_the_op_through_record_stream_or_the_stash() {
    for avoid_record_streams in [false, true] {
        let world = world_with(2, HazardMode::Record);
        let (world, _) = run_in(world, 2, |r| {
            let group = r.group("0", Options::builder().avoid_record_streams(avoid_record_streams));
            let input = r.filled(1.0, 4096);
            r.sleep_current(SLEEP);
            let work = group.all_reduce(&input, ReduceOp::Sum).unwrap();
            // The caller lets go of everything: only the lifetime guard stands between the memory and reuse.
            drop(work);
            drop(input);
            // A new allocation of the same size on the current stream, written at once.
            let reused = r.filled(2.0, 4096);
            r.read(&reused)
        });
        assert!(world.hazards().is_empty(), "mode avoid_record_streams={avoid_record_streams}: {:?}", world.hazards());
    }
    // Neither mode orders reads: reading the output on another stream without waiting is still a hazard.
    let world = world_with(2, HazardMode::Record);
    let (world, _) = run_in(world, 2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 64);
        let _work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let other = r.device.stream_from_pool(false).unwrap();
        r.device.copy_to_host(&buffer, &other).unwrap();
    });
    assert!(!world.hazards().is_empty(), "record_stream protects memory, it does not order a read");
}

#[test]
fn s13_work_start_time_is_host_time_and_bounds_the_timeout() {
    let (world, results) = run(2, |r| {
        let group = r.group("0", Options::builder().blocking_wait(true));
        let buffer = r.filled(1.0, 64);
        group.barrier_sync().unwrap();
        // Shorter than creating the communicator takes: set once it exists.
        group.set_timeout(Duration::from_millis(10));
        let event = r.device.create_event();
        let created_before_record = event.is_created();
        r.sleep_current(SLEEP);
        let enqueued_at = r.device.now();
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let error = work.wait().unwrap_err();
        (created_before_record, work.end_event_created(), work.start_time() - enqueued_at, error)
    });
    for (rank, (created_before_record, end_created, start_offset, error)) in results.into_iter().enumerate() {
        assert!(!created_before_record, "an event object is created at its first record");
        assert!(end_created);
        assert!(start_offset < Duration::from_micros(100), "the start time is the host's enqueue time");
        assert_eq!(error.kind(), ErrorKind::WorkTimeout, "{error}");
        // The timeout ran from the host start time: the op had not even started on the device.
        let comm = world.kernel_log(rank).into_iter().rfind(|k| k.kind == KernelKind::Comm);
        let msg = error.to_string();
        assert!(msg.contains("OpType=ALLREDUCE") && msg.contains("Timeout(ms)=10"), "{msg}");
        assert!(comm.is_none_or(|c| c.start >= SLEEP), "the op could not have started before the sleep ended");
    }
}

#[test]
fn s14_is_completed_is_the_end_event_or_an_exception() {
    let (_, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 64);
        r.sleep_current(SLEEP);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let after_enqueue = work.is_completed();
        let after_wait = {
            work.wait().unwrap();
            work.is_completed()
        };
        r.device.synchronize().unwrap();
        (after_enqueue, after_wait, work.is_completed(), work.exception().is_none())
    });
    for row in results {
        assert_eq!(row, (false, false, true, true), "host return is never completion");
    }
}

#[test]
fn completed_works_nobody_holds_are_reused_and_held_ones_never_are() {
    let (world, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let period = group.options().watchdog_period;
        let buffer = r.filled(1.0, 16);
        let held = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let future = group.all_reduce(&buffer, ReduceOp::Sum).unwrap().future();
        let batch = |group: &ProcessGroup<Mock>| {
            for _ in 0..20 {
                group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
            }
            r.device.synchronize().unwrap();
            // Two watchdog periods: every completed Work is retired.
            r.device.sleep(2 * period, &std::sync::atomic::AtomicBool::new(false));
        };
        batch(&group);
        let reused_before = group.counters().works_reused;
        batch(&group);
        let reused_after = group.counters().works_reused;
        let held_state = (held.seq(), held.op_type(), held.is_completed(), held.exception().is_none());
        (reused_before, reused_after, held_state, future.is_done(), r.read(&buffer)[0])
    });
    assert!(world.hazards().is_empty(), "{:?}", world.hazards());
    for (reused_before, reused_after, held_state, future_done, value) in results {
        // Every Work of the first batch is retired and unheld once it has settled, so each op of the second
        // batch finds one to reuse.
        assert!(reused_after >= reused_before + 20, "the second batch reused {}", reused_after - reused_before);
        assert_eq!(held_state, (1, pg_core::OpType::AllReduce, true, true), "a held Work keeps its own state");
        assert!(future_done);
        // 42 in-place sums over 2 ranks of an initial 1.0.
        assert_eq!(value, 2f32.powi(42));
    }
}

#[test]
fn s15_blocking_wait_polls_until_done_and_aborts_on_timeout() {
    let (_, results) = run(2, |r| {
        let group = r.group("0", Options::builder().blocking_wait(true));
        let buffer = r.filled(1.0, 64);
        group.barrier_sync().unwrap();
        r.sleep_current(SLEEP);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let (result, host) = r.host_time(|| work.wait());
        result.unwrap();
        (host, work.is_completed())
    });
    for (host, completed) in results {
        assert!(host >= SLEEP, "blocking wait holds the host until the op is done: {host:?}");
        assert!(host < SLEEP + Duration::from_millis(5));
        assert!(completed);
    }
    let (_, results) = run(2, |r| {
        let group = r.group("0", Options::builder().blocking_wait(true));
        let buffer = r.filled(1.0, 64);
        group.barrier_sync().unwrap();
        group.set_timeout(Duration::from_millis(5));
        r.sleep_current(SLEEP);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let error = work.wait().unwrap_err();
        let next = group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait());
        (error.kind(), next.map_err(|e| e.kind()))
    });
    for (kind, next) in results {
        assert_eq!(kind, ErrorKind::WorkTimeout);
        assert!(next.is_err(), "the communicator was aborted: later ops fail instead of hanging");
    }
}

#[test]
fn s16_barrier_synchronises_the_current_stream_not_the_device() {
    let (_, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        group.barrier_sync().unwrap();
        let other = r.device.stream_from_pool(false).unwrap();
        r.device.sleep_kernel(&other, SLEEP * 3).unwrap();
        r.sleep_current(SLEEP);
        let (result, host) = r.host_time(|| group.barrier_sync());
        result.unwrap();
        (host, other.query().unwrap())
    });
    for (host, other_done) in results {
        assert!(host >= SLEEP, "the host waited for its current stream: {host:?}");
        assert!(host < SLEEP * 3, "but not for the device's other streams: {host:?}");
        assert!(!other_done);
    }
}

#[test]
fn s17_future_is_done_at_once_and_its_wait_only_orders_the_stream() {
    let (world, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled((r.rank + 1) as f64, 256);
        r.sleep_current(SLEEP);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        let future = work.future();
        let done = future.is_done();
        let gpu_done = future.gpu_completed().unwrap();
        let (outputs, host) = r.host_time(|| future.wait().unwrap());
        let values = r.read(&outputs[0]);
        (done, gpu_done, host, work.is_completed(), values)
    });
    for (done, gpu_done, host, _, values) in results {
        assert!(done, "done right after enqueue");
        assert!(!gpu_done, "while the device has not finished");
        assert!(host < SLEEP / 100, "Future::wait does not block the host: {host:?}");
        assert!(values.iter().all(|v| *v == triangle(2)), "after Future::wait the current stream sees results");
    }
    assert!(world.hazards().is_empty());
}

#[test]
fn s18_seed_semantics_table_reproduces() {
    // The full table is `cargo xtask experiments`; here the four configurations on 2 ranks, one sample each.
    let (_, rows) = run(2, |r| {
        let nonblocking = r.group("0", Options::builder());
        let blocking = r.group("1", Options::builder().blocking_wait(true));
        nonblocking.barrier_sync().unwrap();
        blocking.barrier_sync().unwrap();
        let buffer = r.filled((r.rank + 1) as f64, 4 << 20);
        let mut rows = BTreeMap::new();
        for config in ["no_wait_device_sync", "future_wait_nonblocking", "work_wait_blocking", "work_wait_nonblocking"]
        {
            nonblocking.barrier_sync().unwrap();
            r.device.fill(&buffer, (r.rank + 1) as f64, &r.device.current_stream()).unwrap();
            r.sleep_current(SLEEP);
            let group = if config == "work_wait_blocking" { &blocking } else { &nonblocking };
            let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
            let future_done = work.future().is_done();
            let ((), action) = r.host_time(|| match config {
                "no_wait_device_sync" => {}
                "future_wait_nonblocking" => drop(work.future().wait().unwrap()),
                _ => work.wait().unwrap(),
            });
            let completed = work.is_completed();
            let ((), sync) = r.host_time(|| r.device.synchronize().unwrap());
            let correct = r.read(&buffer).iter().all(|v| *v == triangle(2));
            rows.insert(config, (action, completed, future_done, sync, correct));
        }
        rows
    });
    for rows in rows {
        for (config, (action, completed, future_done, sync, correct)) in rows {
            assert!(future_done && correct, "{config}");
            match config {
                "work_wait_blocking" => {
                    assert!(completed && action >= SLEEP, "{config}: {action:?}");
                    assert!(sync < SLEEP / 100, "{config}: the wait was paid in the host wait");
                }
                _ => {
                    assert!(!completed && action < SLEEP / 100, "{config}: {action:?}");
                    assert!(sync > SLEEP / 2, "{config}: the device sync pays for the sleep: {sync:?}");
                }
            }
        }
    }
}

#[test]
fn s19_default_wait_orders_only_the_current_stream() {
    let (_, results) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 1024);
        r.sleep_current(SLEEP);
        let work = group.all_reduce(&buffer, ReduceOp::Sum).unwrap();
        work.wait().unwrap();
        let free = r.device.stream_from_pool(false).unwrap();
        let marker = r.device.alloc(DType::F32, 1).unwrap();
        {
            let _on_free = StreamGuard::<Mock>::new(&r.device, &free);
            r.device.fill(&marker, 1.0, &free).unwrap();
        }
        free.synchronize().unwrap();
        !work.is_completed()
    });
    assert!(results.into_iter().all(|free_first| free_first), "an unrelated stream finished first");
}

#[test]
fn s20_comm_kernels_run_only_on_the_dedicated_stream() {
    let (world, streams) = run(2, |r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 64);
        r.sleep_current(SLEEP);
        for _ in 0..4 {
            group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
        }
        r.device.synchronize().unwrap();
        (r.device.current_stream().id(), group.comm_stream("0").or_else(|| group.comm_stream("1")).unwrap().id())
    });
    for (rank, (current, comm)) in streams.into_iter().enumerate() {
        assert_ne!(current, comm);
        let log = world.kernel_log(rank);
        let comm_kernels: Vec<_> = log.iter().filter(|k| k.kind == KernelKind::Comm).collect();
        assert_eq!(comm_kernels.len(), 4);
        assert!(comm_kernels.iter().all(|k| k.stream_id == comm), "never on the current stream");
        assert_eq!(log.iter().filter(|k| k.kind == KernelKind::Sleep && k.stream_id == current).count(), 1);
    }
}

/// A tracing subscriber that keeps the fields of "created communicator" events.
#[derive(Default, Clone)]
struct CreationLog(Arc<Mutex<Vec<BTreeMap<String, String>>>>);

struct FieldVisitor<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}").trim_matches('"').to_owned());
    }
}

impl tracing::Subscriber for CreationLog {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut FieldVisitor(&mut fields));
        if fields.get("message").is_some_and(|m| m == "created communicator") {
            self.0.lock().unwrap().push(fields);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[test]
fn s27_every_communicator_creation_is_logged_and_counted() {
    let log = CreationLog::default();
    let (_, counted) = run(2, |r| {
        tracing::subscriber::with_default(log.clone(), || {
            let mut created = 0;
            for name in ["0", "1"] {
                let group = r.group(name, Options::builder());
                let buffer = r.filled(1.0, 8);
                group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
                group.all_reduce_sync(&buffer, ReduceOp::Sum).unwrap();
                created += group.counters().comms_created;
            }
            created
        })
    });
    let events = log.0.lock().unwrap();
    assert_eq!(events.len() as u64, counted.iter().sum::<u64>());
    assert_eq!(events.len(), 4, "two groups x two ranks");
    for event in events.iter() {
        for field in ["group", "key", "rank"] {
            assert!(event.contains_key(field), "missing {field}: {event:?}");
        }
    }
    let mut seen: Vec<_> = events.iter().map(|e| (e["group"].clone(), e["rank"].clone(), e["key"].clone())).collect();
    seen.sort();
    assert_eq!(
        seen,
        [("0", "0", "0"), ("0", "1", "1"), ("1", "0", "0"), ("1", "1", "1")].map(|(g, r, k)| (
            g.to_owned(),
            r.to_owned(),
            k.to_owned()
        ))
    );
}

/// Runs `body` on 2 ranks with hazards recorded, and returns rank 0's hazard messages.
fn hazards_of(body: impl Fn(&Rank) + Sync) -> Vec<(pg_mock::HazardKind, String)> {
    let (world, _) = run_in(world_with(2, HazardMode::Record), 2, body);
    world.hazards().into_iter().filter(|h| h.device == 0).map(|h| (h.kind, h.message)).collect()
}

#[test]
fn mistake_reading_on_another_stream_after_wait_on_the_current_one_is_caught() {
    let hazards = hazards_of(|r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 256);
        group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
        let other = r.device.stream_from_pool(false).unwrap();
        r.device.copy_to_host(&buffer, &other).unwrap();
    });
    assert_eq!(hazards.len(), 1, "{hazards:#?}");
    let (kind, message) = &hazards[0];
    println!("caught: {message}");
    assert_eq!(*kind, pg_mock::HazardKind::ReadAfterWrite);
    assert!(message.contains("all_reduce") && message.contains("copy_to_host"), "{message}");
    // The same read on the stream that waited is fine.
    let clean = hazards_of(|r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 256);
        group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
        r.read(&buffer);
    });
    assert!(clean.is_empty(), "{clean:#?}");
}

#[test]
fn mistake_treating_future_done_as_gpu_completion_is_caught() {
    let hazards = hazards_of(|r| {
        let group = r.group("0", Options::builder());
        let buffer = r.filled(1.0, 256);
        r.sleep_current(SLEEP);
        let future = group.all_reduce(&buffer, ReduceOp::Sum).unwrap().future();
        assert!(future.is_done());
        // Wrong: done() is not device completion; reading the value on a fresh stream races the op.
        let reader = r.device.stream_from_pool(false).unwrap();
        r.device.copy_to_host(&future.value()[0], &reader).unwrap();
    });
    assert_eq!(hazards.len(), 1, "{hazards:#?}");
    let (kind, message) = &hazards[0];
    println!("caught: {message}");
    assert_eq!(*kind, pg_mock::HazardKind::ReadAfterWrite);
    assert!(message.contains("Future"), "the message names the likely mistake: {message}");
}

/// Runs `call` on rank 0 of a 2-rank group (rank 1 idles) and returns the error it gave.
fn invalid(call: impl Fn(&Rank, &ProcessGroup<Mock>) -> pg_core::Result<()> + Sync) -> pg_core::Error {
    let (_, errors) = run(2, |r| {
        let group = r.group("0", Options::builder());
        match r.rank {
            0 => Some(call(r, &group).expect_err("bad input must be an error")),
            _ => None,
        }
    });
    errors.into_iter().flatten().next().expect("rank 0's error")
}

#[test]
fn bad_arguments_are_typed_errors_naming_what_was_wrong() {
    fn check(call: impl Fn(&Rank, &ProcessGroup<Mock>) -> pg_core::Result<()> + Sync, words: &[&str]) {
        let error = invalid(call);
        assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}");
        let message = error.to_string();
        assert!(words.iter().all(|w| message.contains(w)), "{message:?} lacks one of {words:?}");
    }
    let f32s = |r: &Rank, n| r.device.alloc(DType::F32, n).unwrap();
    check(|r, g| g.all_gather(&f32s(r, 4), &f32s(r, 4)).map(drop), &["all_gather", "4 elements"]);
    check(|r, g| g.reduce_scatter(&f32s(r, 4), &f32s(r, 4), ReduceOp::Sum).map(drop), &["reduce_scatter"]);
    check(
        |r, g| g.all_gather(&f32s(r, 4), &r.device.alloc(DType::I32, 8).unwrap()).map(drop),
        &["dtype", "Float", "Int"],
    );
    check(|r, g| g.broadcast(&f32s(r, 4), 2).map(drop), &["root 2", "size 2"]);
    check(|r, g| g.send(&f32s(r, 4), 0).map(drop), &["itself"]);
    check(|r, g| g.recv(&f32s(r, 4), 5).map(drop), &["peer 5"]);
    check(|r, g| g.all_reduce(&f32s(r, 4), ReduceOp::BitAnd).map(drop), &["BAND"]);
    check(|r, g| g.all_reduce(&r.device.alloc(DType::Bool, 4).unwrap(), ReduceOp::Avg).map(drop), &["AVG", "bool"]);
    check(
        |r, _| {
            let store = Arc::clone(&r.store);
            ProcessGroup::<Mock>::new(store, 3, 2, r.device.clone(), Options::default()).map(drop)
        },
        &["rank 3", "size 2"],
    );
}
