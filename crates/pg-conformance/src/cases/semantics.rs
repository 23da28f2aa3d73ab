//! The stream, event, Work and cache semantics of the process group (S1-S20, S27), each a case named after
//! what it checks.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_core::store::PrefixStore;
use pg_core::{
    Buffer as _, CommKey, DType, Device as _, ErrorKind, Event as _, Options, ProcessGroup, ReduceOp, Stream as _,
    StreamGuard,
};

use super::{
    all_equal, at_once, case, clock_of, held_all_reduce, need, needs_hazards, needs_log, on_each_rank, triangle, SLEEP,
};
use crate::case::{pass, Case, Outcome};
use crate::check::{Check, Context};
use crate::harness::{Clock, Harness, HazardKind, KernelKind, KernelLaunch};
use crate::{ensure, ensure_eq};

pub(crate) fn cases<H: Harness>() -> Vec<Case<H>> {
    vec![
        case!(s01_sync_form_is_the_async_call_then_wait, 1),
        case!(s02_call_chain_runs_on_the_comm_stream_after_the_input_is_ready, 1),
        case!(s03_communicators_are_created_lazily_and_reused, 1),
        case!(s04_cache_keys_are_the_device_sequence_and_the_sorted_pair, 1),
        case!(s05_groups_with_identical_membership_never_share_a_communicator, 1),
        case!(s06_single_p2p_uses_the_pair_key_and_does_not_advance_the_counter, 2),
        case!(s07_a_communicator_being_created_sits_in_the_initialisation_map, 2),
        case!(s08_each_key_gets_a_dedicated_stream_from_the_pool_by_priority, 1),
        case!(s09_the_collective_waits_for_the_input_ready_event, 1),
        case!(s09_every_input_ready_event_count_keeps_the_order, 1),
        case!(s10_the_end_event_is_recorded_right_after_the_op, 1),
        case!(s11_default_wait_orders_the_current_stream_and_returns_at_once, 1),
        case!(s12_buffers_outlive_the_op_through_record_stream_or_the_stash, 1),
        case!(s13_work_start_time_is_host_time_and_bounds_the_timeout, 1),
        case!(s14_is_completed_is_the_end_event_or_an_exception, 1),
        case!(completed_works_nobody_holds_are_reused_and_held_ones_never_are, 1),
        case!(s15_blocking_wait_polls_until_done_and_aborts_on_timeout, 1),
        case!(s16_barrier_synchronises_the_current_stream_not_the_device, 1),
        case!(s17_future_is_done_at_once_and_its_wait_only_orders_the_stream, 1),
        case!(s18_the_four_wait_configurations_behave_as_documented, 1),
        case!(s19_default_wait_orders_only_the_current_stream, 1),
        case!(s20_comm_kernels_run_only_on_the_dedicated_stream, 1),
        case!(s27_every_communicator_creation_is_logged_and_counted, 1),
        case!(mistake_reading_on_another_stream_after_wait_on_the_current_one_is_caught, 1),
        case!(mistake_treating_future_done_as_gpu_completion_is_caught, 1),
        case!(bad_arguments_are_typed_errors_naming_what_was_wrong, 1),
    ]
}

fn span(k: &KernelLaunch) -> Check<(Duration, Duration)> {
    k.span.ok_or_else(|| format!("kernel {} has no device times", k.name))
}

fn first(log: &[KernelLaunch], kind: KernelKind) -> Check<&KernelLaunch> {
    log.iter().find(|k| k.kind == kind).ok_or_else(|| format!("no {kind:?} kernel in the log"))
}

fn log_of<B: pg_core::Backend>(caps: &Arc<dyn crate::Capabilities<B>>, rank: usize) -> Check<Vec<KernelLaunch>> {
    caps.kernel_log(rank).ok_or_else(|| "the world keeps no kernel log".to_owned())
}

fn s01_sync_form_is_the_async_call_then_wait<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    let scenario = |sync: bool| {
        h.run(n, move |r| -> Check<(Duration, Vec<f64>)> {
            let group = r.group("0", Options::builder())?;
            group.barrier_sync().ctx("barrier")?;
            let buffer = r.filled((r.rank + 1) as f64, 256)?;
            r.sleep_current(SLEEP)?;
            let (work, host) = r.host_time(|| match sync {
                true => group.all_reduce_sync(&buffer, ReduceOp::Sum).map(|()| None),
                false => group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait().map(|()| Some(w))),
            });
            if let Some(work) = work.ctx("all_reduce")? {
                ensure!(!work.is_completed(), "the async form returned after the device finished");
                let outputs: Vec<usize> = work.outputs().iter().map(|b| b.numel()).collect();
                ensure_eq!(outputs, vec![256], "the Work's outputs (their sizes)");
            }
            Ok((host, r.read(&buffer)?))
        })
    };
    let sync_ran = scenario(true)?;
    let async_ran = scenario(false)?;
    let sync_log = sync_ran.caps.kernel_log(0);
    let async_log = async_ran.caps.kernel_log(0);
    let sync = sync_ran.all_ok()?;
    let asynchronous = async_ran.all_ok()?;
    for ((rank, (sync_host, sync_values)), (_, (async_host, async_values))) in sync.iter().zip(&asynchronous) {
        if clock == Clock::Virtual {
            ensure_eq!(sync_host, async_host, "rank {rank}: the sync form costs exactly the async call plus wait()");
        }
        ensure!(*sync_host < at_once(clock), "rank {rank}: the sync form blocked the host for {sync_host:?}");
        ensure!(*async_host < at_once(clock), "rank {rank}: call + wait() blocked the host for {async_host:?}");
        ensure_eq!(sync_values, async_values, "rank {rank}: the two forms gave different results");
        all_equal(sync_values, triangle(n))?;
    }
    if clock == Clock::Virtual && sync.first().is_some_and(|(rank, _)| *rank == 0) {
        ensure_eq!(sync_log, async_log, "the same device work in the same order");
    }
    pass()
}

fn s02_call_chain_runs_on_the_comm_stream_after_the_input_is_ready<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_log(h, true));
    let clock = need!(clock_of(h));
    let ran = h.run(h.world_size(), |r| -> Check<(u64, u64, Duration)> {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 64)?;
        // The communicator exists before the sleep: its creation must not be what holds the op back.
        group.barrier_sync().ctx("barrier")?;
        r.sleep_current(SLEEP)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        work.synchronize().ctx("synchronize")?;
        let done_at = r.device.now();
        Ok((r.device.current_stream().id(), work.comm_stream().id(), done_at))
    })?;
    let caps = Arc::clone(&ran.caps);
    for (rank, (current, comm, done_at)) in ran.all_ok()? {
        let log = log_of(&caps, rank)?;
        let sleep = first(&log, KernelKind::Sleep)?;
        let comm_kernel = log.iter().rfind(|k| k.kind == KernelKind::Comm).ok_or("no comm kernel in the log")?;
        ensure_eq!(sleep.stream_id, current, "rank {rank}: the sleep ran on the current stream");
        ensure_eq!(comm_kernel.stream_id, comm, "rank {rank}: the op is enqueued on the group's comm stream");
        ensure!(span(comm_kernel)?.0 >= span(sleep)?.1, "rank {rank}: the comm stream did not wait for the input");
        // Host and device times are one clock only in the simulation (s10 bounds the wake-up on a wall clock).
        if clock == Clock::Virtual {
            ensure_eq!(done_at, span(comm_kernel)?.1, "rank {rank}: the end event is recorded right after the op");
        }
    }
    pass()
}

fn s03_communicators_are_created_lazily_and_reused<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let group = r.group("0", Options::builder())?;
        let before = group.counters().comms_created;
        let buffer = r.filled(1.0, 8)?;
        let mut after = Vec::new();
        for _ in 0..3 {
            group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
            after.push(group.counters().comms_created);
        }
        let eager = r.group("1", Options::builder().eager_init(true))?;
        ensure_eq!(before, 0, "creating a group creates no communicator");
        ensure_eq!(after, vec![1, 1, 1], "the first op creates it, later ops reuse it");
        ensure_eq!(eager.counters().comms_created, 1, "eager init creates the collective communicator with the group");
        Ok(())
    })
}

fn s04_cache_keys_are_the_device_sequence_and_the_sorted_pair<H: Harness>(h: &H) -> Check<Outcome> {
    for (key, expected) in [
        (CommKey::Collective(vec![0]), "0"),
        (CommKey::Collective(vec![0, 1]), "0,1"),
        (CommKey::Collective(vec![1, 0]), "1,0"),
        (CommKey::SingleP2p { rank: 3, peer: 1 }, "1:3"),
        (CommKey::SingleP2p { rank: 1, peer: 3 }, "1:3"),
    ] {
        ensure_eq!(key.cache_key(), expected, "cache key of {key:?}");
    }
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(r.rank as f64, 4)?;
        // The last rank sends to rank 0 (when there are two ranks or more): the pair key is sorted.
        let last = n - 1;
        match r.rank {
            rank if n > 1 && rank == last => group.send(&buffer, 0).and_then(|w| w.wait()).ctx("send")?,
            0 if n > 1 => group.recv(&buffer, last).and_then(|w| w.wait()).ctx("recv")?,
            _ => {}
        }
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        r.read(&buffer)?;
        let device = r.device.index().to_string();
        let mut expected = vec![device];
        if n > 1 && (r.rank == 0 || r.rank == last) {
            expected.push(format!("0:{last}"));
        }
        expected.sort();
        ensure_eq!(group.comm_keys(), expected, "rank {}: the collective key is the device ordinal", r.rank);
        Ok(())
    })
}

fn s05_groups_with_identical_membership_never_share_a_communicator<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let mut ids = Vec::new();
        for name in ["0", "1", "2"] {
            let group = r.group(name, Options::builder().high_priority_stream(name == "2"))?;
            // Each instance has its own process-wide id (the "PG ID" of logs and thread names).
            ensure!(!ids.contains(&group.local_id()), "group {name} reuses a local id of {ids:?}");
            ids.push(group.local_id());
            for op in 0..3 {
                let buffer = r.filled((r.rank + 1) as f64, 32)?;
                group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
                all_equal(&r.read(&buffer)?, triangle(n)).map_err(|e| format!("group {name}, op {op}: {e}"))?;
                ensure_eq!(group.counters().comms_created, 1, "group {name} after op {op}: its own communicator, once");
            }
        }
        Ok(())
    })
}

fn s06_single_p2p_uses_the_pair_key_and_does_not_advance_the_counter<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled((r.rank + 1) as f64, 16)?;
        let before = group.next_comm_counter();
        // Only ranks 0 and 1 run a P2P op; if it advanced the counter, the collective below would read
        // different store keys on different ranks and never complete.
        match r.rank {
            0 => group.send(&buffer, 1).and_then(|w| w.wait()).ctx("send")?,
            1 => group.recv(&buffer, 0).and_then(|w| w.wait()).ctx("recv")?,
            _ => {}
        }
        let after_p2p = group.next_comm_counter();
        let fresh = r.filled((r.rank + 1) as f64, 16)?;
        group.all_reduce_sync(&fresh, ReduceOp::Sum).ctx("all_reduce")?;
        all_equal(&r.read(&fresh)?, triangle(n))?;
        ensure_eq!((before, after_p2p, group.next_comm_counter()), (0, 0, 1), "the collective key counter");
        // The group's PrefixStore("0/") adds its own "/", as PyTorch's does: "0/" + "/" + key.
        if r.rank < 2 {
            ensure!(r.store.check(&["0//0:1"]).ctx("store")?, "the P2P id did not go through the pair key");
        }
        ensure!(r.store.check(&["0//0"]).ctx("store")?, "the collective id did not go through counter key 0");
        ensure!(!r.store.check(&["0//1"]).ctx("store")?, "a second collective key was written");
        Ok(())
    })
}

fn s07_a_communicator_being_created_sits_in_the_initialisation_map<H: Harness>(h: &H) -> Check<Outcome> {
    // Half-second margins: on a wall clock the observer looks long after the creation began and long before the
    // late ranks arrive.
    need!(clock_of(h));
    type Seen = (Vec<String>, Vec<String>);
    let ran = h.run(h.world_size(), |r| -> Check<Option<(Seen, Seen)>> {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 4)?;
        if r.rank != 0 {
            // The other ranks arrive late, so rank 0's communicator stays in the initialisation map a while.
            r.host_sleep(Duration::from_secs(1));
            group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
            return Ok(None);
        }
        let observer = {
            let (group, device) = (group.clone(), r.device.clone());
            r.spawn_host("observer", move || {
                device.sleep(Duration::from_millis(500), &std::sync::atomic::AtomicBool::new(false));
                (group.initializing_keys(), group.comm_keys())
            })?
        };
        group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let during = observer.finish(r)?;
        Ok(Some((during, (group.initializing_keys(), group.comm_keys()))))
    })?;
    for (_, seen) in ran.all_ok()? {
        if let Some((during, after)) = seen {
            ensure_eq!(during, (vec!["0".to_owned()], vec![]), "while creating: in the initialisation map only");
            ensure_eq!(after, (vec![], vec!["0".to_owned()]), "once ready: moved to the cache");
        }
    }
    pass()
}

fn s08_each_key_gets_a_dedicated_stream_from_the_pool_by_priority<H: Harness>(h: &H) -> Check<Outcome> {
    let env_high = |name: &str| (name == "TORCH_NCCL_HIGH_PRIORITY").then(|| "1".to_owned());
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let normal = r.group("0", Options::builder())?;
        let high = r.group("1", Options::builder().high_priority_stream(true))?;
        let from_env = {
            let store = Arc::new(PrefixStore::new("2/", Arc::clone(&r.store)));
            let options = Options::builder().group_name("2".to_owned()).build_with_env_from(env_high).ctx("env")?;
            r.keep(ProcessGroup::new(store, r.rank, r.size, r.device.clone(), options).ctx("group from env")?)
        };
        let buffer = r.filled(1.0, 4)?;
        for group in [&normal, &high, &from_env] {
            group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        }
        let key = r.device.index().to_string();
        let stream = |g: &ProcessGroup<H::B>, k: &str| g.comm_stream(k).ok_or_else(|| format!("no stream for {k}"));
        let mut all = vec![stream(&normal, &key)?, stream(&high, &key)?, stream(&from_env, &key)?];
        // A P2P pair key of the first two ranks gets a stream of its own too.
        if n > 1 && r.rank < 2 {
            let peer = 1 - r.rank;
            let p2p = match r.rank {
                0 => normal.send(&buffer, peer),
                _ => normal.recv(&buffer, peer),
            };
            p2p.and_then(|w| w.wait()).ctx("p2p")?;
            all.push(stream(&normal, "0:1")?);
        }
        ensure!(!all[0].is_high_priority(), "the default stream priority is normal");
        ensure!(all[1].is_high_priority(), "the option picks the high-priority pool");
        ensure!(all[2].is_high_priority(), "TORCH_NCCL_HIGH_PRIORITY picks the high-priority pool");
        all.push(r.device.current_stream());
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                ensure!(a != b, "every key of every group has its own stream, none is the current stream");
            }
        }
        Ok(())
    })
}

fn s09_the_collective_waits_for_the_input_ready_event<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(0.0, 1024)?;
        group.barrier_sync().ctx("barrier")?;
        // The inputs are written behind a long kernel: an op that did not wait would read the zeros.
        r.sleep_current(SLEEP)?;
        r.device.fill(&buffer, (r.rank + 1) as f64, &r.device.current_stream()).ctx("fill")?;
        group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).ctx("all_reduce")?;
        all_equal(&r.read(&buffer)?, triangle(n)).map_err(|e| format!("the op read its inputs too early: {e}"))
    })?;
    ran.no_hazards()?;
    let caps = Arc::clone(&ran.caps);
    for (rank, ()) in ran.all_ok()? {
        if let (true, Some(log)) = (h.offers().kernel_spans, caps.kernel_log(rank)) {
            let fill_end = span(log.iter().rfind(|k| k.kind == KernelKind::Fill).ok_or("no fill kernel")?)?.1;
            let comm = log.iter().rfind(|k| k.kind == KernelKind::Comm).ok_or("no comm kernel")?;
            ensure!(span(comm)?.0 >= fill_end, "rank {rank}: a long kernel on the current stream did not delay the op");
        }
    }
    pass()
}

fn s09_every_input_ready_event_count_keeps_the_order<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_log(h, true));
    const OPS: usize = 7;
    for events in [1, 2, 4, 64] {
        let ran = h.run(h.world_size(), |r| -> Check {
            let group = r.group("0", Options::builder().input_ready_events(events))?;
            let buffer = r.filled(1.0, 1024)?;
            for _ in 0..OPS {
                r.sleep_current(SLEEP)?;
                drop(group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?);
            }
            r.device.synchronize().ctx("synchronize")
        })?;
        ran.no_hazards()?;
        let caps = Arc::clone(&ran.caps);
        for (rank, ()) in ran.all_ok()? {
            let log = log_of(&caps, rank)?;
            let sleeps: Vec<_> = log.iter().filter(|k| k.kind == KernelKind::Sleep).collect();
            let comms: Vec<_> = log.iter().filter(|k| k.kind == KernelKind::Comm).collect();
            ensure_eq!((sleeps.len(), comms.len()), (OPS, OPS), "rank {rank}: sleeps and ops");
            for (op, (sleep, comm)) in sleeps.iter().zip(&comms).enumerate() {
                ensure!(
                    span(comm)?.0 >= span(sleep)?.1,
                    "{events} events, rank {rank}: op {op} started before its inputs were written"
                );
            }
        }
    }
    pass()
}

fn s10_the_end_event_is_recorded_right_after_the_op<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_log(h, true));
    let clock = need!(clock_of(h));
    let ran = h.run(h.world_size(), |r| -> Check<(Duration, Duration)> {
        let group = r.ready_group("0", Options::builder())?;
        let buffer = r.filled(1.0, 1 << 20)?;
        // On a wall clock the op is held back behind a sleep, so that "not yet completed" cannot race the device.
        let start = r.device.now();
        if clock == Clock::Wall {
            r.sleep_current(SLEEP)?;
        }
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        ensure!(!work.is_completed(), "completed right after the enqueue");
        work.synchronize().ctx("synchronize")?;
        let took = r.device.now() - start;
        ensure!(work.is_completed(), "not completed after its end event passed");
        Ok((r.device.now(), took))
    })?;
    let caps = Arc::clone(&ran.caps);
    for (rank, (synced_at, took)) in ran.all_ok()? {
        let log = log_of(&caps, rank)?;
        let comm = log.iter().rfind(|k| k.kind == KernelKind::Comm).ok_or("no comm kernel in the log")?;
        // A span is there only once both of the launch's timing events passed: the op had ended when the host woke.
        let end = span(comm)?.1;
        match clock {
            Clock::Virtual => {
                // The host wakes when the op ends, plus the modelled host cost of the synchronize call itself.
                ensure!(synced_at >= end, "rank {rank}: the end event passed before the op ended");
                ensure!(synced_at - end <= Duration::from_micros(1), "rank {rank}: nor later: {:?}", synced_at - end);
            }
            Clock::Wall => {
                // From before the sleep was enqueued until synchronize returned, the host saw the sleep and then the
                // op run, and not much more (device times count from the world's start, so the wait is measured
                // from the sleep's start; ranks sharing a GPU may wake late by a few time slices).
                let sleep = log.iter().rfind(|k| k.kind == KernelKind::Sleep).ok_or("no sleep kernel in the log")?;
                let device_wait = end.saturating_sub(span(sleep)?.0);
                ensure!(
                    took + Duration::from_millis(1) >= device_wait,
                    "rank {rank}: synchronize returned after {took:?}, before the op ended ({device_wait:?} of device \
                     work)"
                );
                ensure!(
                    took <= device_wait + Duration::from_millis(50),
                    "rank {rank}: synchronize returned {took:?} after the enqueue, long after the op ended \
                     ({device_wait:?} of device work)"
                );
            }
        }
    }
    pass()
}

fn s11_default_wait_orders_the_current_stream_and_returns_at_once<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let ran = h.run(h.world_size(), |r| -> Check {
        let buffer = r.filled(1.0, 1024)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        let (waited, host) = r.host_time(|| work.wait());
        waited.ctx("wait")?;
        ensure!(host < at_once(clock), "wait() blocked the host for {host:?}");
        ensure!(!work.is_completed(), "the Work completed during wait(): it must not have waited for the device");
        // Work after wait() on the current stream is ordered after the op.
        r.device.fill(&buffer, 7.0, &r.device.current_stream()).ctx("fill")?;
        all_equal(&r.read(&buffer)?, 7.0).map_err(|e| format!("the fill after wait() raced the op: {e}"))
    })?;
    ran.no_hazards()?;
    let caps = Arc::clone(&ran.caps);
    for (rank, ()) in ran.all_ok()? {
        if let (true, Some(log)) = (h.offers().kernel_spans, caps.kernel_log(rank)) {
            let comm_end = span(log.iter().rfind(|k| k.kind == KernelKind::Comm).ok_or("no comm kernel")?)?.1;
            let later_fill = log.iter().rfind(|k| k.kind == KernelKind::Fill).ok_or("no fill kernel")?;
            ensure!(span(later_fill)?.0 >= comm_end, "rank {rank}: the current stream did not wait on the end event");
        }
    }
    pass()
}

fn s12_buffers_outlive_the_op_through_record_stream_or_the_stash<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_hazards(h));
    let n = h.world_size();
    for avoid_record_streams in [false, true] {
        let ran = h.run(n, |r| -> Check {
            let group = r.group("0", Options::builder().avoid_record_streams(avoid_record_streams))?;
            let input = r.filled(1.0, 4096)?;
            r.sleep_current(SLEEP)?;
            let work = group.all_reduce(&input, ReduceOp::Sum).ctx("all_reduce")?;
            // The caller lets go of everything: only the lifetime guard stands between the memory and reuse.
            drop(work);
            drop(input);
            // A new allocation of the same size on the current stream, written at once.
            let reused = r.filled(2.0, 4096)?;
            all_equal(&r.read(&reused)?, 2.0)
        })?;
        ran.no_hazards().map_err(|e| format!("avoid_record_streams={avoid_record_streams}: {e}"))?;
        ran.all_ok()?;
    }
    // Neither mode orders reads: reading the output on another stream without waiting is still a hazard.
    let ran = h.run(n, |r| -> Check {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 64)?;
        let _work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let other = r.device.stream_from_pool(false).ctx("stream")?;
        r.device.copy_to_host(&buffer, &other).ctx("copy")?;
        Ok(())
    })?;
    let hazards = ran.caps.hazards().unwrap_or_default();
    ran.all_ok()?;
    ensure!(!hazards.is_empty(), "record_stream protects memory, it does not order a read: no hazard was reported");
    pass()
}

fn s13_work_start_time_is_host_time_and_bounds_the_timeout<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let ran = h.run(h.world_size(), |r| -> Check {
        let group = r.ready_group("0", Options::builder().blocking_wait(true).timeout(Duration::from_millis(10)))?;
        let buffer = r.filled(1.0, 64)?;
        let event = r.device.create_event();
        ensure!(!event.is_created(), "an event object is created at its first record, not before");
        r.sleep_current(SLEEP)?;
        let enqueued_at = r.device.now();
        let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let error = work.wait().err().ok_or("wait() returned Ok though the op could not finish in 10 ms")?;
        ensure!(work.end_event_created(), "the end event was recorded");
        let offset = work.start_time().checked_sub(enqueued_at).ok_or("the start time is before the call")?;
        let bound = match clock {
            Clock::Virtual => Duration::from_micros(100),
            Clock::Wall => Duration::from_millis(5),
        };
        ensure!(offset < bound, "the start time is the host's enqueue time, not {offset:?} later");
        ensure_eq!(error.kind(), ErrorKind::WorkTimeout, "{error}");
        let message = error.to_string();
        ensure!(message.contains("OpType=ALLREDUCE") && message.contains("Timeout(ms)=10"), "{message}");
        Ok(())
    })?;
    let caps = Arc::clone(&ran.caps);
    for (rank, ()) in ran.all_ok()? {
        // The timeout ran from the host start time: the op had not even started on the device.
        if let (true, Some(log)) = (h.offers().kernel_spans, caps.kernel_log(rank)) {
            if let Some(comm) = log.iter().rfind(|k| k.kind == KernelKind::Comm) {
                ensure!(span(comm)?.0 >= SLEEP, "rank {rank}: the op started before the sleep ended");
            }
        }
    }
    pass()
}

fn s14_is_completed_is_the_end_event_or_an_exception<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let buffer = r.filled(1.0, 64)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        let after_enqueue = work.is_completed();
        work.wait().ctx("wait")?;
        let after_wait = work.is_completed();
        r.device.synchronize().ctx("synchronize")?;
        let row = (after_enqueue, after_wait, work.is_completed(), work.exception().is_none());
        ensure_eq!(row, (false, false, true, true), "host return is never completion");
        Ok(())
    })
}

fn completed_works_nobody_holds_are_reused_and_held_ones_never_are<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let group = r.group("0", Options::builder())?;
        let period = group.options().watchdog_period;
        // f64, so that n^42 stays finite at any world size up to 2^24 ranks.
        let buffer = r.filled_as(DType::F64, 1.0, 16)?;
        let held = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
        let future = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?.future();
        let batch = || -> Check {
            for _ in 0..20 {
                group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
            }
            r.device.synchronize().ctx("synchronize")?;
            // Two watchdog periods: every completed Work is retired.
            r.host_sleep(2 * period);
            Ok(())
        };
        batch()?;
        let reused_before = group.counters().works_reused;
        batch()?;
        let reused = group.counters().works_reused - reused_before;
        // Every Work of the first batch is retired and unheld once it has settled, so each op of the second
        // batch finds one to reuse.
        ensure!(reused >= 20, "the second batch reused {reused} Works, not 20");
        let held_state = (held.seq(), held.op_type(), held.is_completed(), held.exception().is_none());
        ensure_eq!(held_state, (1, pg_core::OpType::AllReduce, true, true), "a held Work keeps its own state");
        ensure!(future.is_done(), "the held Future is done");
        // 42 in-place sums over n ranks of an initial 1.0.
        let want = (n as f64).powi(42);
        let got = r.read(&buffer)?[0];
        let close = (got - want).abs() <= want * 1e-5;
        ensure!(close, "the value is {got}, not {want}");
        Ok(())
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

fn s15_blocking_wait_polls_until_done_and_aborts_on_timeout<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let buffer = r.filled(1.0, 64)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder().blocking_wait(true), &buffer)?;
        let (result, host) = r.host_time(|| work.wait());
        result.ctx("wait")?;
        let (low, high) = match clock {
            Clock::Virtual => (SLEEP, SLEEP + Duration::from_millis(5)),
            Clock::Wall => (SLEEP / 2, SLEEP * 25),
        };
        ensure!(host >= low && host < high, "blocking wait held the host {host:?}, not until the op was done");
        ensure!(work.is_completed(), "not completed after a blocking wait");
        Ok(())
    })?;
    ran.all_ok()?;
    on_each_rank(h, n, |r| {
        let buffer = r.filled(1.0, 64)?;
        let (group, work) =
            held_all_reduce(r, "0", Options::builder().blocking_wait(true).timeout(Duration::from_millis(5)), &buffer)?;
        let error = work.wait().err().ok_or("wait() returned Ok before the op could finish")?;
        ensure_eq!(error.kind(), ErrorKind::WorkTimeout, "{error}");
        let next = group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait());
        ensure!(next.is_err(), "the communicator was aborted: a later op must fail instead of hanging");
        Ok(())
    })
}

fn s16_barrier_synchronises_the_current_stream_not_the_device<H: Harness>(h: &H) -> Check<Outcome> {
    need!(clock_of(h));
    on_each_rank(h, h.world_size(), |r| {
        let group = r.group("0", Options::builder())?;
        group.barrier_sync().ctx("barrier")?;
        let other = r.device.stream_from_pool(false).ctx("stream")?;
        // The other stream's kernel is far longer than the current one's: the barrier also waits for the slowest
        // rank's current stream, which on a shared machine may lag by a few time slices.
        r.device.sleep_kernel(&other, SLEEP * 10).ctx("sleep")?;
        r.sleep_current(SLEEP)?;
        let (result, host) = r.host_time(|| group.barrier_sync());
        result.ctx("barrier")?;
        ensure!(host >= SLEEP / 2, "the host did not wait for its current stream: {host:?}");
        ensure!(host < SLEEP * 8, "the host waited for the device's other streams: {host:?}");
        ensure!(!other.query().ctx("query")?, "the other stream finished: the barrier synchronised the device");
        Ok(())
    })
}

fn s17_future_is_done_at_once_and_its_wait_only_orders_the_stream<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    let ran = h.run(n, |r| -> Check {
        let buffer = r.filled((r.rank + 1) as f64, 256)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        let future = work.future();
        ensure!(future.is_done(), "the Future is not done right after the enqueue");
        ensure!(!future.gpu_completed().ctx("gpu_completed")?, "gpu_completed while the device is busy");
        let (outputs, host) = r.host_time(|| future.wait());
        let outputs = outputs.ctx("Future::wait")?;
        ensure!(host < at_once(clock), "Future::wait blocked the host for {host:?}");
        let values = r.read(outputs.first().ok_or("the Future has no value")?)?;
        all_equal(&values, triangle(n)).map_err(|e| format!("after Future::wait the current stream saw: {e}"))
    })?;
    ran.no_hazards()?;
    ran.all_ok()?;
    pass()
}

fn s18_the_four_wait_configurations_behave_as_documented<H: Harness>(h: &H) -> Check<Outcome> {
    let clock = need!(clock_of(h));
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let nonblocking = r.group("0", Options::builder())?;
        let blocking = r.group("1", Options::builder().blocking_wait(true))?;
        nonblocking.barrier_sync().ctx("barrier")?;
        blocking.barrier_sync().ctx("barrier")?;
        let buffer = r.filled((r.rank + 1) as f64, 4 << 20)?;
        for config in ["no_wait_device_sync", "future_wait_nonblocking", "work_wait_blocking", "work_wait_nonblocking"]
        {
            nonblocking.barrier_sync().ctx("barrier")?;
            r.device.fill(&buffer, (r.rank + 1) as f64, &r.device.current_stream()).ctx("fill")?;
            r.sleep_current(SLEEP)?;
            let group = if config == "work_wait_blocking" { &blocking } else { &nonblocking };
            let work = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
            ensure!(work.future().is_done(), "{config}: the Future is done at once");
            let (waited, action) = r.host_time(|| match config {
                "no_wait_device_sync" => Ok(()),
                "future_wait_nonblocking" => work.future().wait().map(drop),
                _ => work.wait(),
            });
            waited.ctx(config)?;
            let completed = work.is_completed();
            let (synced, sync) = r.host_time(|| r.device.synchronize());
            synced.ctx("synchronize")?;
            all_equal(&r.read(&buffer)?, triangle(n)).map_err(|e| format!("{config}: {e}"))?;
            match config {
                "work_wait_blocking" => {
                    ensure!(completed && action >= SLEEP / 2, "{config}: the wait held the host {action:?}");
                    ensure!(sync < at_once(clock), "{config}: the wait was not paid in the host wait: {sync:?}");
                }
                _ => {
                    ensure!(!completed && action < at_once(clock), "{config}: the action held the host {action:?}");
                    ensure!(sync > SLEEP / 2, "{config}: the device sync did not pay for the sleep: {sync:?}");
                }
            }
        }
        Ok(())
    })
}

fn s19_default_wait_orders_only_the_current_stream<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let buffer = r.filled(1.0, 1024)?;
        let (_group, work) = held_all_reduce(r, "0", Options::builder(), &buffer)?;
        work.wait().ctx("wait")?;
        let free = r.device.stream_from_pool(false).ctx("stream")?;
        let marker = r.device.alloc(DType::F32, 1).ctx("alloc")?;
        {
            let _on_free = StreamGuard::<H::B>::new(&r.device, &free);
            r.device.fill(&marker, 1.0, &free).ctx("fill")?;
        }
        free.synchronize().ctx("synchronize")?;
        ensure!(!work.is_completed(), "an unrelated stream was ordered after the op by wait()");
        Ok(())
    })
}

fn s20_comm_kernels_run_only_on_the_dedicated_stream<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_log(h, false));
    on_each_rank(h, h.world_size(), |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 64)?;
        group.barrier_sync().ctx("barrier")?;
        let current = r.device.current_stream().id();
        let comm = group.comm_stream(&r.device.index().to_string()).ok_or("no comm stream")?.id();
        ensure!(current != comm, "the comm stream is the current stream");
        let count = |stream: u64, kind: KernelKind| -> Check<usize> {
            let log = r.kernel_log().ok_or("no kernel log")?;
            Ok(log.iter().filter(|k| k.stream_id == stream && k.kind == kind).count())
        };
        let (comm_before, sleep_before) = (count(comm, KernelKind::Comm)?, count(current, KernelKind::Sleep)?);
        r.sleep_current(SLEEP)?;
        for _ in 0..4 {
            group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).ctx("all_reduce")?;
        }
        r.device.synchronize().ctx("synchronize")?;
        ensure_eq!(count(comm, KernelKind::Comm)? - comm_before, 4, "comm kernels on the comm stream");
        ensure_eq!(count(current, KernelKind::Comm)?, 0, "comm kernels on the current stream");
        ensure_eq!(count(current, KernelKind::Sleep)? - sleep_before, 1, "sleep kernels on the current stream");
        Ok(())
    })
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
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(fields);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

fn s27_every_communicator_creation_is_logged_and_counted<H: Harness>(h: &H) -> Check<Outcome> {
    on_each_rank(h, h.world_size(), |r| {
        let log = CreationLog::default();
        let created = tracing::subscriber::with_default(log.clone(), || -> Check<u64> {
            let mut created = 0;
            for name in ["0", "1"] {
                let group = r.group(name, Options::builder())?;
                let buffer = r.filled(1.0, 8)?;
                group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
                group.all_reduce_sync(&buffer, ReduceOp::Sum).ctx("all_reduce")?;
                created += group.counters().comms_created;
            }
            Ok(created)
        })?;
        let events = log.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        ensure_eq!(events.len() as u64, created, "logged against counted creations");
        ensure_eq!(events.len(), 2, "two groups, one communicator each");
        let key = r.device.index().to_string();
        let mut seen = Vec::new();
        for event in &events {
            let field = |name: &str| event.get(name).cloned().ok_or_else(|| format!("missing {name}: {event:?}"));
            seen.push((field("group")?, field("rank")?, field("key")?));
        }
        seen.sort();
        let rank = r.rank.to_string();
        let want = vec![("0".to_owned(), rank.clone(), key.clone()), ("1".to_owned(), rank, key)];
        ensure_eq!(seen, want, "(group, rank, key) of each creation");
        Ok(())
    })
}

/// Runs `body` on every rank and returns rank 0's hazards (kind, message).
fn hazards_of<H: Harness>(
    h: &H,
    body: impl Fn(&crate::Rank<H::B>) -> Check + Sync,
) -> Check<Vec<(HazardKind, String)>> {
    let ran = h.run(h.world_size(), body)?;
    let hazards = ran.caps.hazards().ok_or("no hazard detector")?;
    ran.all_ok()?;
    Ok(hazards.into_iter().filter(|h| h.rank == 0).map(|h| (h.kind, h.message)).collect())
}

fn mistake_reading_on_another_stream_after_wait_on_the_current_one_is_caught<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_hazards(h));
    let hazards = hazards_of(h, |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 256)?;
        group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).ctx("all_reduce")?;
        let other = r.device.stream_from_pool(false).ctx("stream")?;
        r.device.copy_to_host(&buffer, &other).ctx("copy")?;
        Ok(())
    })?;
    ensure_eq!(hazards.len(), 1, "hazards on rank 0: {hazards:?}");
    let (kind, message) = &hazards[0];
    ensure_eq!(*kind, HazardKind::ReadAfterWrite, "{message}");
    ensure!(message.contains("all_reduce") && message.contains("copy_to_host"), "{message}");
    // The same read on the stream that waited is fine.
    let clean = hazards_of(h, |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 256)?;
        group.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).ctx("all_reduce")?;
        r.read(&buffer).map(drop)
    })?;
    ensure!(clean.is_empty(), "a read on the stream that waited: {clean:?}");
    pass()
}

fn mistake_treating_future_done_as_gpu_completion_is_caught<H: Harness>(h: &H) -> Check<Outcome> {
    need!(needs_hazards(h));
    let hazards = hazards_of(h, |r| {
        let group = r.group("0", Options::builder())?;
        let buffer = r.filled(1.0, 256)?;
        r.sleep_current(SLEEP)?;
        let future = group.all_reduce(&buffer, ReduceOp::Sum).ctx("all_reduce")?.future();
        ensure!(future.is_done(), "the Future is done at once");
        // Wrong: done() is not device completion; reading the value on a fresh stream races the op.
        let reader = r.device.stream_from_pool(false).ctx("stream")?;
        r.device.copy_to_host(&future.value()[0], &reader).ctx("copy")?;
        Ok(())
    })?;
    ensure_eq!(hazards.len(), 1, "hazards on rank 0: {hazards:?}");
    let (kind, message) = &hazards[0];
    ensure_eq!(*kind, HazardKind::ReadAfterWrite, "{message}");
    ensure!(message.contains("Future"), "the message names the likely mistake: {message}");
    pass()
}

fn bad_arguments_are_typed_errors_naming_what_was_wrong<H: Harness>(h: &H) -> Check<Outcome> {
    let n = h.world_size();
    on_each_rank(h, n, |r| {
        let group = r.group("0", Options::builder())?;
        let f32s = |numel| r.device.alloc(DType::F32, numel).ctx("alloc");
        let check = |what: &str, result: pg_core::Result<()>, words: &[String]| -> Check {
            let error = match result {
                Ok(()) => return Err(format!("{what}: accepted")),
                Err(error) => error,
            };
            ensure_eq!(error.kind(), ErrorKind::InvalidArgument, "{what}: {error}");
            let message = error.to_string();
            ensure!(words.iter().all(|w| message.contains(w.as_str())), "{what}: {message:?} lacks one of {words:?}");
            Ok(())
        };
        let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        if n > 1 {
            check(
                "all_gather",
                group.all_gather(&f32s(4)?, &f32s(4)?).map(drop),
                &words(&["all_gather", "4 elements"]),
            )?;
            check(
                "reduce_scatter",
                group.reduce_scatter(&f32s(4)?, &f32s(4)?, ReduceOp::Sum).map(drop),
                &words(&["reduce_scatter"]),
            )?;
        }
        let ints = r.device.alloc(DType::I32, 4 * n).ctx("alloc")?;
        check("dtype", group.all_gather(&f32s(4)?, &ints).map(drop), &words(&["dtype", "Float", "Int"]))?;
        check("root", group.broadcast(&f32s(4)?, n).map(drop), &[format!("root {n}"), format!("size {n}")])?;
        if n > 1 {
            check("send to self", group.send(&f32s(4)?, r.rank).map(drop), &words(&["itself"]))?;
        }
        check("recv peer", group.recv(&f32s(4)?, n + 3).map(drop), &[format!("peer {}", n + 3)])?;
        check("BAND", group.all_reduce(&f32s(4)?, ReduceOp::BitAnd).map(drop), &words(&["BAND"]))?;
        let bools = r.device.alloc(DType::Bool, 4).ctx("alloc")?;
        check("AVG on bool", group.all_reduce(&bools, ReduceOp::Avg).map(drop), &words(&["AVG", "bool"]))?;
        let store = Arc::clone(&r.store);
        check(
            "rank out of range",
            ProcessGroup::<H::B>::new(store, n + 1, n, r.device.clone(), Options::default()).map(drop),
            &[format!("rank {}", n + 1), format!("size {n}")],
        )?;
        ensure_eq!(group.counters().ops_issued, 0, "a refused call enqueued something");
        Ok(())
    })
}
