//! The fault matrix on the simulated backend: each scenario injects one fault into a simulated
//! world, runs real process groups on it, and checks what the ranks observe and how fast.
//!
//! Used twice: by pg-mock's `tests/faults.rs` (one test per scenario, in `cargo test`) and by `cargo xtask faults`
//! (which prints the table `scenario | expected | observed | detection latency | pass`).
//! Everything runs in virtual time: a 1 s timeout costs no real second, the verdicts are the same on every run,
//! and the latencies too, to within microseconds (the watchdog's host costs depend on how its passes interleave).

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pg_core::{
    DType, Device as _, Error, ErrorHandling, ErrorKind, ErrorType, Options, ProcessGroup, ReduceOp, Stream as _,
};
use pg_mock::{Fault, HazardMode, Mock, MockBuffer, MockDevice, World, WorldConfig};
use pg_store::{PrefixStore, Store};

/// The per-Work timeout the scenarios run with.
pub const TIMEOUT: Duration = Duration::from_secs(1);
/// The watchdog period (PyTorch's default).
pub const PERIOD: Duration = Duration::from_millis(100);
/// The heartbeat timeout of the wedged-watchdog scenario.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// The store timeout of the store-down scenario.
pub const STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// One row of the matrix.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its number in the matrix (`1` .. `9`, `1b` for the propagation variant).
    pub id: &'static str,
    /// A short name.
    pub name: &'static str,
    /// What must happen.
    pub expected: &'static str,
    /// Runs it.
    pub run: fn(&Env) -> Outcome,
}

/// Where and how big a scenario runs.
#[derive(Debug, Clone)]
pub struct Env {
    /// A directory of its own for flight-recorder dumps (emptied first).
    pub dir: PathBuf,
    /// How many unwaited ops scenario 7 issues per variant (50,000 in `cargo xtask faults`).
    pub unwaited_ops: usize,
}

/// What a scenario observed.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// What happened, in a few words.
    pub observed: String,
    /// The detection latency, where the scenario has one (virtual time).
    pub latency: Option<Duration>,
    /// The checks that failed (empty: the scenario passed).
    pub failures: Vec<String>,
    /// Not applicable to this backend (the GPU-only scenario).
    pub not_applicable: bool,
    /// Evidence worth printing under the table (a desync report).
    pub details: Vec<String>,
    /// The timeline of each world the scenario ran, named when it ran several (`cargo xtask faults --trace`).
    pub traces: Vec<(String, pg_mock::Trace)>,
}

impl Outcome {
    /// Whether every check held.
    pub fn pass(&self) -> bool {
        self.failures.is_empty() && !self.not_applicable
    }

    fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.failures.push(what.into());
        }
    }
}

/// Every scenario, in the matrix's order.
pub fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            id: "1",
            name: "a rank skips one collective",
            expected: "others: WorkTimeout within timeout + 2 periods; FR dumped on every rank; desync report names the rank and seq",
            run: rank_skips_a_collective,
        },
        Scenario {
            id: "1b",
            name: "error propagation through the store",
            expected: "the skipping rank gets Remote{rank 0} through remote_error:{pg_uid} within 2 periods",
            run: error_propagates_through_the_store,
        },
        Scenario {
            id: "2",
            name: "async communicator error",
            expected: "CommError within one watchdog period; modes 1-3 abort, 1 and 3 tear down, 0 only records",
            run: async_communicator_error,
        },
        Scenario {
            id: "3",
            name: "blocking wait on a hung op",
            expected: "wait() returns WorkTimeout after the timeout; the communicator is aborted",
            run: blocking_wait_on_a_hung_op,
        },
        Scenario {
            id: "4",
            name: "store dies during rendezvous",
            expected: "a store error (or, waiting for the id, an init timeout) within the store timeout on every rank; no hang",
            run: store_dies_during_rendezvous,
        },
        Scenario {
            id: "5",
            name: "wedged watchdog",
            expected: "HeartbeatTimeout within 2 heartbeat timeouts; the group is torn down; drop does not hang",
            run: wedged_watchdog,
        },
        Scenario {
            id: "6",
            name: "abort from a second thread",
            expected: "the blocked waiter returns Aborted right after the abort (blocking wait and wait_timeout)",
            run: abort_from_a_second_thread,
        },
        Scenario {
            id: "7",
            name: "50,000 ops never waited",
            expected: "in-flight list, flight recorder, memory blocks and retained ops stay flat",
            run: unwaited_ops_stay_flat,
        },
        Scenario {
            id: "8",
            name: "rank SIGKILLed during a 1 GiB all_reduce",
            expected: "(GPU only) the others error within the timeout",
            run: |_: &Env| Outcome {
                observed: "not applicable on the mock: needs one process per GPU".into(),
                not_applicable: true,
                ..Outcome::default()
            },
        },
        Scenario {
            id: "9",
            name: "new group on a fresh prefix after an error",
            expected: "the old group keeps returning its error; the new group's all_reduce is correct",
            run: new_group_after_an_error,
        },
    ]
}

// ===== helpers =====

fn never() -> AtomicBool {
    AtomicBool::new(false)
}

/// Options shared by the scenarios: short timeout, dumps into `dir`.
fn options(dir: &Path) -> pg_core::OptionsBuilder {
    Options::builder().timeout(TIMEOUT).watchdog_period(PERIOD).dump_path_prefix(prefix(dir))
}

fn prefix(dir: &Path) -> String {
    format!("{}/nccl_trace_rank_", dir.display())
}

/// This rank's handle of a group under `name` in `store`.
pub fn group(
    store: &Arc<dyn Store>,
    name: &str,
    rank: usize,
    size: usize,
    device: &MockDevice,
    options: Options,
) -> ProcessGroup<Mock> {
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(name, Arc::clone(store)));
    ProcessGroup::new(store, rank, size, device.clone(), options).expect("creating a process group")
}

/// A buffer of `numel` elements set to `value` on the current stream.
pub fn filled(device: &MockDevice, numel: usize, value: f64) -> MockBuffer {
    let buffer = device.alloc(DType::F32, numel).expect("alloc");
    device.fill(&buffer, value, &device.current_stream()).expect("fill");
    buffer
}

fn read(device: &MockDevice, buffer: &MockBuffer) -> Vec<f64> {
    pg_mock::decode(DType::F32, &device.copy_to_host(buffer, &device.current_stream()).expect("copy_to_host"))
}

/// Sleeps in 1 ms steps of virtual time until `done()` or `limit` has passed; returns whether `done()`.
fn wait_until(device: &MockDevice, limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = device.now() + limit;
    while !done() {
        if device.now() >= deadline {
            return false;
        }
        device.sleep(Duration::from_millis(1), &never());
    }
    true
}

fn kind(error: &Option<Error>) -> Option<ErrorKind> {
    error.as_ref().map(Error::kind)
}

fn fresh_dir(dir: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("creating the dump directory");
    dir.to_owned()
}

// ===== 1: a rank skips one collective =====

/// What one rank saw in scenario 1.
#[derive(Debug, Clone)]
struct Skip {
    error: Option<Error>,
    error_type: ErrorType,
    latency: Option<Duration>,
    lagging: Vec<(usize, Option<u64>)>,
    report: Option<String>,
    dumped: bool,
    later_call: Option<ErrorKind>,
}

fn rank_skips_a_collective(env: &Env) -> Outcome {
    const SIZE: usize = 4;
    const SKIPPER: usize = 1;
    let dir = fresh_dir(&env.dir);
    let world = World::new(WorldConfig::with_devices(SIZE));
    let store = world.store();
    let opts = options(&dir).desync_debug(true).build();
    let ranks = world.run(SIZE, move |rank, device| {
        let pg = group(&store, "s1", rank, SIZE, &device, opts.clone());
        let buffer = filled(&device, 1024, 1.0);
        for _ in 0..4 {
            pg.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).expect("the first four all_reduces");
        }
        let mut latency = None;
        if rank == SKIPPER {
            // It skips collective 5 and waits until every other rank has detected the hang.
            store.wait(&["s1-detected-all"], Some(Duration::from_secs(60))).expect("the others detect the hang");
            wait_until(&device, Duration::from_secs(3), || pg.status().dumps_written > 0);
        } else {
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).expect("collective 5");
            wait_until(&device, TIMEOUT * 3, || pg.error_type() != ErrorType::Success);
            latency = pg.status().error_detected_at.map(|at| at.saturating_sub(work.start_time()));
            if store.add("s1-detected", 1).expect("store add") == (SIZE - 1) as i64 {
                store.set("s1-detected-all", b"1").expect("store set");
            }
        }
        let status = pg.status();
        Skip {
            error: status.error.clone(),
            error_type: status.error_type,
            latency,
            lagging: pg.desync_report().map(|r| r.lagging_ranks()).unwrap_or_default(),
            report: pg.desync_report().map(|r| r.to_string()),
            dumped: status.dumps_written > 0,
            later_call: pg.all_reduce(&buffer, ReduceOp::Sum).err().map(|e| e.kind()),
        }
    });
    let mut out = Outcome::default();
    let bound = TIMEOUT + 2 * PERIOD;
    for (rank, seen) in ranks.iter().enumerate() {
        out.check(seen.dumped, format!("rank {rank} wrote no flight-recorder dump"));
        if rank == SKIPPER {
            out.check(seen.error.is_none(), format!("the skipping rank has an error: {:?}", seen.error));
            continue;
        }
        out.check(kind(&seen.error) == Some(ErrorKind::WorkTimeout), format!("rank {rank}: error {:?}", seen.error));
        out.check(seen.error_type == ErrorType::Timeout, format!("rank {rank}: error type {:?}", seen.error_type));
        out.check(
            seen.latency.is_some_and(|l| l <= bound),
            format!("rank {rank}: latency {:?} > {bound:?}", seen.latency),
        );
        out.check(
            seen.lagging == [(SKIPPER, Some(4))],
            format!("rank {rank}: desync report lagging {:?}", seen.lagging),
        );
        out.check(
            seen.later_call == Some(ErrorKind::WorkTimeout),
            format!("rank {rank}: later call {:?}", seen.later_call),
        );
    }
    let dumps = check_dumps(&dir, SIZE, SKIPPER, 5, &mut out);
    out.traces.push((String::new(), world.trace()));
    out.latency = ranks.iter().filter_map(|s| s.latency).max();
    out.details.extend(ranks[0].report.clone());
    out.observed = format!(
        "ranks 0,2,3: {:?}; desync report: lagging {:?}; {dumps} dumps, rank {SKIPPER} lacks seq 5",
        ranks[0].error.as_ref().map(Error::kind),
        ranks[0].lagging
    );
    out
}

/// Checks the dumps in `dir`: one per rank; every rank but `skipper` recorded collective `seq`.
fn check_dumps(dir: &Path, size: usize, skipper: usize, seq: u64, out: &mut Outcome) -> usize {
    let mut found = 0;
    let needle = format!("\"collective_seq_id\": {seq},");
    for rank in 0..size {
        let path = PathBuf::from(format!("{}{rank}", prefix(dir)));
        let Ok(text) = std::fs::read_to_string(&path) else {
            out.failures.push(format!("no dump at {}", path.display()));
            continue;
        };
        found += 1;
        out.check(text.contains("\"version\": \"2.10\""), format!("{}: not a flight-recorder dump", path.display()));
        let has = text.contains(&needle);
        out.check(has == (rank != skipper), format!("rank {rank}: dump has seq {seq}: {has}"));
    }
    found
}

// ===== 1b: error propagation =====

fn error_propagates_through_the_store(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    let world = World::new(WorldConfig::with_devices(2));
    let store = world.store();
    let opts = options(&dir).propagate_error(true).build();
    let ranks = world.run(2, move |rank, device| {
        let pg = group(&store, "s1b", rank, 2, &device, opts.clone());
        let buffer = filled(&device, 16, 1.0);
        pg.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).expect("the first all_reduce");
        let work = (rank == 0).then(|| pg.all_reduce(&buffer, ReduceOp::Sum).expect("the collective rank 1 skips"));
        wait_until(&device, TIMEOUT * 3, || pg.error_type() != ErrorType::Success);
        let status = pg.status();
        let timed_out_at = work.map(|w| w.start_time() + TIMEOUT);
        (status.error, status.error_type, status.error_detected_at, timed_out_at)
    });
    let mut out = Outcome::default();
    out.traces.push((String::new(), world.trace()));
    let (e0, t0, _, timed_out_at) = &ranks[0];
    let (e1, t1, detected1, _) = &ranks[1];
    out.check(*t0 == ErrorType::Timeout, format!("rank 0: {t0:?}"));
    out.check(*t1 == ErrorType::RemoteError, format!("rank 1: {t1:?}"));
    out.check(matches!(e1, Some(Error::Remote { rank: 0 })), format!("rank 1: {e1:?}"));
    out.latency = detected1.zip(*timed_out_at).map(|(d, t)| d.saturating_sub(t));
    out.check(out.latency.is_some_and(|l| l <= 3 * PERIOD), format!("rank 1 learnt it after {:?}", out.latency));
    out.observed = format!("rank 0: {:?}; rank 1: {:?} ({t1:?})", kind(e0), e1.as_ref().map(ToString::to_string));
    out
}

// ===== 2: async communicator error =====

/// What the failing rank saw under one error-handling mode.
#[derive(Debug, Clone)]
struct CommFailure {
    error_type: ErrorType,
    work_error: Option<ErrorKind>,
    latency: Option<Duration>,
    torn_down: bool,
    aborted_comms: usize,
    later_call: Result<(), ErrorKind>,
}

fn comm_failure(dir: &Path, mode: ErrorHandling) -> (CommFailure, pg_mock::Trace) {
    const FAILING: usize = 1;
    let world = World::new(WorldConfig {
        faults: vec![Fault::AsyncError { rank: FAILING, after_ops: 3 }],
        ..WorldConfig::with_devices(2)
    });
    let store = world.store();
    let opts = options(dir).error_handling(mode).dump_on_timeout(false).build();
    let ranks = world.run(2, move |rank, device| {
        let pg = group(&store, "s2", rank, 2, &device, opts.clone());
        let buffer = filled(&device, 16, 1.0);
        let works: Vec<_> = (0..4).map(|_| pg.all_reduce(&buffer, ReduceOp::Sum).expect("all_reduce")).collect();
        // The failing rank's communicator reports its error from the end of op 3 on, so from when this returns.
        works[2].synchronize().expect("synchronize");
        let failed_at = device.now();
        let work = &works[3];
        wait_until(&device, TIMEOUT * 3, || pg.error_type() != ErrorType::Success);
        let status = pg.status();
        let seen = CommFailure {
            error_type: status.error_type,
            work_error: work.exception().map(|e| e.kind()),
            latency: status.error_detected_at.map(|at| at.saturating_sub(failed_at)),
            torn_down: pg.error().is_some(),
            aborted_comms: status.aborted_comms,
            later_call: pg.all_reduce(&buffer, ReduceOp::Sum).map(drop).map_err(|e| e.kind()),
        };
        pg.abort("end of scenario 2");
        seen
    });
    (ranks[FAILING].clone(), world.trace())
}

fn async_communicator_error(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    // mode, aborted communicators, torn down, the later call's result.
    let cases = [
        (ErrorHandling::NoHandling, 0, false, Ok(())),
        (ErrorHandling::TearDown, 1, true, Err(ErrorKind::Communicator)),
        (ErrorHandling::CleanUpOnly, 1, false, Err(ErrorKind::Aborted)),
        (ErrorHandling::SkipCleanUp, 1, true, Err(ErrorKind::Communicator)),
    ];
    let mut out = Outcome::default();
    let mut latencies = Vec::new();
    for (mode, aborted, torn_down, later) in cases {
        let (seen, trace) = comm_failure(&dir, mode);
        out.traces.push((format!("{mode:?}"), trace));
        out.check(seen.error_type == ErrorType::CommError, format!("{mode:?}: error type {:?}", seen.error_type));
        out.check(
            seen.work_error == Some(ErrorKind::Communicator),
            format!("{mode:?}: work error {:?}", seen.work_error),
        );
        // One period, plus the host time of the pass that finds it (a few microseconds of virtual time).
        let bound = PERIOD + Duration::from_millis(1);
        out.check(
            seen.latency.is_some_and(|l| l <= bound),
            format!("{mode:?}: latency {:?} > {bound:?}", seen.latency),
        );
        out.check(seen.aborted_comms == aborted, format!("{mode:?}: {} communicators aborted", seen.aborted_comms));
        out.check(seen.torn_down == torn_down, format!("{mode:?}: torn down = {}", seen.torn_down));
        out.check(seen.later_call == later, format!("{mode:?}: the later call gave {:?}", seen.later_call));
        latencies.extend(seen.latency);
    }
    out.latency = latencies.into_iter().max();
    out.observed =
        "CommError in every mode; mode 0 records only, 1 aborts + tears down, 2 aborts, 3 aborts + tears down".into();
    out
}

// ===== 3: blocking wait on a hung op =====

fn blocking_wait_on_a_hung_op(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    let world =
        World::new(WorldConfig { faults: vec![Fault::HangAt { rank: 0, op: 1 }], ..WorldConfig::with_devices(2) });
    let store = world.store();
    let opts = options(&dir).blocking_wait(true).enable_watchdog(false).build();
    let ranks = world.run(2, move |rank, device| {
        let pg = group(&store, "s3", rank, 2, &device, opts.clone());
        let buffer = filled(&device, 16, 1.0);
        pg.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).expect("op 0");
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).expect("op 1");
        let result = work.wait();
        let returned_after = device.now().saturating_sub(work.start_time());
        (result.err().map(|e| e.kind()), returned_after, pg.status().aborted_comms)
    });
    let mut out = Outcome::default();
    out.traces.push((String::new(), world.trace()));
    for (rank, (error, after, aborted)) in ranks.iter().enumerate() {
        out.check(*error == Some(ErrorKind::WorkTimeout), format!("rank {rank}: wait() gave {error:?}"));
        out.check(*after >= TIMEOUT && *after <= TIMEOUT + PERIOD, format!("rank {rank}: returned after {after:?}"));
        out.check(*aborted == 1, format!("rank {rank}: {aborted} communicators aborted"));
    }
    out.latency = ranks.iter().map(|r| r.1).max();
    out.observed = format!("wait() -> {:?}; communicator aborted on both ranks", ranks[0].0);
    out
}

// ===== 4: the store dies during rendezvous =====

fn store_dies_during_rendezvous(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    let world = World::new(WorldConfig::with_devices(2));
    let store = world.store();
    store.set_timeout(STORE_TIMEOUT);
    let opts = options(&dir).build();
    let ranks = world.run(2, move |rank, device| {
        let pg = group(&store, "s4", rank, 2, &device, opts.clone());
        let buffer = filled(&device, 16, 1.0);
        // Both groups exist (creating one counts it in the store) before the store dies.
        store.barrier("s4-created", 2, None).expect("store barrier");
        if rank == 0 {
            // The store server dies just as the first op starts its rendezvous.
            device.world().inject(Fault::StoreDown { fail_fast: false });
        }
        store.add("s4-ready", 0).ok();
        let start = device.now();
        let result = pg.all_reduce(&buffer, ReduceOp::Sum).map(drop);
        (result.err(), device.now().saturating_sub(start))
    });
    let mut out = Outcome::default();
    out.traces.push((String::new(), world.trace()));
    for (rank, (error, after)) in ranks.iter().enumerate() {
        // A rank waiting for the unique id gives up at the group's timeout when it is the shorter one.
        let store_error =
            matches!(kind(error), Some(ErrorKind::StoreNetwork | ErrorKind::StoreTimeout | ErrorKind::InitTimeout));
        out.check(store_error, format!("rank {rank}: {error:?}"));
        out.check(*after <= STORE_TIMEOUT + PERIOD, format!("rank {rank}: the error came after {after:?}"));
    }
    out.latency = ranks.iter().map(|r| r.1).max();
    out.observed = format!("{:?} on both ranks", kind(&ranks[0].0));
    out
}

// ===== 5: the watchdog is wedged =====

fn wedged_watchdog(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    let world = World::new(WorldConfig::with_devices(1));
    let store = world.store();
    let opts = options(&dir).heartbeat_timeout(HEARTBEAT).build();
    let ranks = world.run(1, move |rank, device| {
        let pg = group(&store, "s5", rank, 1, &device, opts.clone());
        let buffer = filled(&device, 16, 1.0);
        pg.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).expect("an all_reduce");
        let stalled_at = device.now();
        pg.inject_watchdog_stall(Duration::from_secs(3600));
        wait_until(&device, HEARTBEAT * 3, || pg.error().is_some());
        let status = pg.status();
        let later = pg.all_reduce(&buffer, ReduceOp::Sum).err().map(|e| e.kind());
        let latency = status.error_detected_at.map(|at| at.saturating_sub(stalled_at));
        (kind(&status.error), status.error_type, latency, later, status.dumps_written)
        // Dropping the group here must not wait for the wedged watchdog.
    });
    let (error, error_type, latency, later, dumps) = ranks[0];
    let mut out = Outcome { latency, ..Outcome::default() };
    out.traces.push((String::new(), world.trace()));
    out.check(error == Some(ErrorKind::HeartbeatTimeout), format!("error {error:?}"));
    out.check(error_type == ErrorType::HeartbeatTimeout, format!("error type {error_type:?}"));
    out.check(latency.is_some_and(|l| l <= 2 * HEARTBEAT + PERIOD), format!("latency {latency:?}"));
    out.check(later == Some(ErrorKind::HeartbeatTimeout), format!("the later call gave {later:?}"));
    out.check(dumps == 1, format!("{dumps} dumps"));
    out.observed = format!("{error:?}; later calls fail with it; flight recorder dumped");
    out
}

// ===== 6: abort from a second thread =====

fn abort_case(dir: &Path, blocking: bool) -> (Option<ErrorKind>, Option<Duration>, pg_mock::Trace) {
    let world =
        World::new(WorldConfig { faults: vec![Fault::HangAt { rank: 0, op: 1 }], ..WorldConfig::with_devices(2) });
    let store = world.store();
    let long = Duration::from_secs(60);
    let opts = options(dir).timeout(long).blocking_wait(blocking).enable_watchdog(!blocking).build();
    let ranks = world.run(2, move |rank, device| {
        let pg = group(&store, if blocking { "s6b" } else { "s6w" }, rank, 2, &device, opts.clone());
        let buffer = filled(&device, 16, 1.0);
        pg.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).expect("op 0");
        let work = pg.all_reduce(&buffer, ReduceOp::Sum).expect("op 1");
        let aborted_at = Arc::new(Mutex::new(None));
        let (pg2, device2, at) = (pg.clone(), device.clone(), Arc::clone(&aborted_at));
        let aborter = device
            .spawn_host_thread(
                "aborter",
                Box::new(move || {
                    device2.sleep(Duration::from_millis(500), &never());
                    *at.lock().unwrap() = Some(device2.now());
                    pg2.abort("aborted from a second thread");
                }),
            )
            .expect("spawn");
        let result = if blocking { work.wait() } else { work.wait_timeout(long) };
        let returned = device.now();
        aborter.join().expect("the aborter");
        let aborted_at = aborted_at.lock().unwrap().expect("abort time");
        (result.err().map(|e| e.kind()), Some(returned.saturating_sub(aborted_at)))
    });
    (ranks[0].0, ranks[0].1, world.trace())
}

fn abort_from_a_second_thread(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    let mut out = Outcome::default();
    let mut latencies = Vec::new();
    for (blocking, label) in [(true, "blocking wait"), (false, "wait_timeout with the watchdog")] {
        let (error, latency, trace) = abort_case(&dir, blocking);
        out.traces.push((if blocking { "blocking" } else { "watchdog" }.to_owned(), trace));
        out.check(error == Some(ErrorKind::Aborted), format!("{label}: the waiter got {error:?}"));
        out.check(
            latency.is_some_and(|l| l <= Duration::from_millis(2)),
            format!("{label}: returned {latency:?} after the abort"),
        );
        latencies.extend(latency);
    }
    out.latency = latencies.into_iter().max();
    out.observed = "the waiter returned Aborted in both modes".into();
    out
}

// ===== 7: 50,000 ops never waited =====

/// A snapshot of the bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Books {
    in_flight: usize,
    peak_in_flight: usize,
    memory_blocks: usize,
    retained_ops: usize,
}

/// Collectives per training step in scenario 7.
const OPS_PER_STEP: usize = 10;

/// The in-flight peak scenario 7 allows: the ops of two watchdog periods at one step (10 ops) per ms.
const PEAK_BOUND: usize = 2 * OPS_PER_STEP * 100;

/// What one rank saw in one run of scenario 7: a snapshot after each fifth of the ops, and the last completed
/// sequence number.
type UnwaitedRank = (Vec<Books>, Option<u64>);

/// One run of scenario 7; also returns how many hazards the world recorded, and its trace.
fn unwaited_run(dir: &Path, ops: usize, avoid_record_streams: bool) -> (Vec<UnwaitedRank>, usize, pg_mock::Trace) {
    // Record, so that the check below names the count rather than stopping at the first hazard.
    let world = World::new(WorldConfig { hazard_mode: HazardMode::Record, ..WorldConfig::with_devices(2) });
    let store = world.store();
    let opts = options(dir).avoid_record_streams(avoid_record_streams).build();
    let ranks = world.run(2, move |rank, device| {
        let pg = group(&store, "s7", rank, 2, &device, opts.clone());
        let world = device.world();
        let mut snapshots = Vec::new();
        let mut peak_in_flight = 0;
        for i in 1..=ops {
            // A fresh buffer per op, dropped at once: its memory comes back only if the bookkeeping lets it go.
            let buffer = filled(&device, 64, 1.0);
            let _unwaited = pg.all_reduce(&buffer, ReduceOp::Sum).expect("all_reduce");
            if i % OPS_PER_STEP == 0 {
                // The end of a training step: 1 ms of compute, and the host waits for its own compute stream,
                // never for the collectives.
                let compute = device.current_stream();
                device.sleep_kernel(&compute, Duration::from_millis(1)).expect("sleep kernel");
                compute.synchronize().expect("synchronize");
                peak_in_flight = peak_in_flight.max(pg.status().in_flight);
            }
            if i % (ops / 5).max(1) == 0 {
                device.sleep(2 * PERIOD, &never());
                snapshots.push(Books {
                    in_flight: pg.status().in_flight,
                    peak_in_flight: std::mem::take(&mut peak_in_flight),
                    memory_blocks: world.memory_blocks(),
                    retained_ops: world.retained_ops(),
                });
            }
        }
        (snapshots, pg.status().last_completed_seq)
    });
    (ranks, world.hazards().len(), world.trace())
}

fn unwaited_ops_stay_flat(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    let ops = env.unwaited_ops;
    let mut out = Outcome::default();
    let mut observed = vec![format!("{ops} ops per rank and variant")];
    for (avoid, label) in [(false, "record_stream"), (true, "avoid_record_streams")] {
        let (ranks, hazards, trace) = unwaited_run(&dir, ops, avoid);
        out.traces.push((label.to_owned(), trace));
        for (rank, (snapshots, last)) in ranks.iter().enumerate() {
            let end = snapshots[snapshots.len() - 1];
            let what = format!("{label}, rank {rank}: {snapshots:?}");
            // Settled: after two watchdog periods without new ops, nothing is tracked any more.
            out.check(snapshots.iter().all(|s| s.in_flight == 0), format!("in flight after settling; {what}"));
            // Flat: the in-flight list peaks at about one watchdog period of ops (a step of 10 ops lasts a little
            // over 1 ms: about 900 ops), and the allocator holds about that many blocks per rank, whatever the
            // number of ops; a leak would hold one block per op.
            let peak = snapshots.iter().map(|s| s.peak_in_flight).max().unwrap_or(0);
            out.check(peak <= PEAK_BOUND, format!("in-flight peak {peak} > {PEAK_BOUND}; {what}"));
            let blocks = snapshots.iter().map(|s| s.memory_blocks).max().unwrap_or(0);
            out.check(blocks <= 2 * PEAK_BOUND, format!("{blocks} memory blocks > {}; {what}", 2 * PEAK_BOUND));
            // The world keeps the stream ops that live events point at: those of in-flight Works and of the
            // completed Works a group keeps for reuse, each at most about one watchdog period of ops per rank.
            // A leak would keep one per op: 5,000 per rank and more.
            out.check(end.retained_ops <= 2 * PEAK_BOUND, format!("the world retains ops; {what}"));
            out.check(*last == Some(ops as u64), format!("{label}, rank {rank}: last completed {last:?}"));
        }
        let (snapshots, _) = &ranks[0];
        let (first, end) = (snapshots[0], snapshots[snapshots.len() - 1]);
        let mut text = format!(
            "{label}: first/last fifth: peak in flight {}/{}, memory blocks {}/{}, retained ops {}/{}, settled {}/{}",
            first.peak_in_flight,
            end.peak_in_flight,
            first.memory_blocks,
            end.memory_blocks,
            first.retained_ops,
            end.retained_ops,
            first.in_flight,
            end.in_flight
        );
        // No reuse hazard in either variant, over any number of ops. With the stash, the buffers are freed by
        // whichever thread lets go of them last: the watchdog once it saw the op complete, or the caller after the
        // watchdog released the stash (ordered after it by the buffer's reference count).
        out.check(hazards == 0, format!("{label}: {hazards} hazards recorded"));
        text.push_str(&format!(", hazards {hazards}"));
        observed.push(text);
    }
    out.observed = observed.join("; ");
    out
}

// ===== 9: a new group on a fresh prefix after an error =====

fn new_group_after_an_error(env: &Env) -> Outcome {
    let dir = fresh_dir(&env.dir);
    let world = World::new(WorldConfig::with_devices(2));
    let store = world.store();
    let opts = options(&dir).build();
    let ranks = world.run(2, move |rank, device| {
        let first = group(&store, "first", rank, 2, &device, opts.clone());
        let buffer = filled(&device, 4, 1.0);
        first.all_reduce(&buffer, ReduceOp::Sum).and_then(|w| w.wait()).expect("a first all_reduce");
        if rank == 0 {
            // Rank 1 skips this one: rank 0's watchdog times it out.
            let _hung = first.all_reduce(&buffer, ReduceOp::Sum).expect("the skipped all_reduce");
            wait_until(&device, TIMEOUT * 3, || first.error().is_some());
            store.set("s9-failed", b"1").expect("store set");
        } else {
            store.wait(&["s9-failed"], Some(Duration::from_secs(60))).expect("rank 0 fails");
        }
        let old_error = first.all_reduce(&buffer, ReduceOp::Sum).err().map(|e| e.kind());
        drop(first);
        // The failed group poisoned rank 0's device: its reads fail until the failure is acknowledged.
        device.poison().clear();
        let second = group(&store, "second", rank, 2, &device, opts.clone());
        let values = filled(&device, 4, (rank + 1) as f64);
        let result = second.all_reduce(&values, ReduceOp::Sum).and_then(|w| w.wait());
        let read = result.map(|()| read(&device, &values));
        second.shutdown().expect("shutdown");
        (old_error, read.map_err(|e| e.kind()))
    });
    let mut out = Outcome::default();
    out.traces.push((String::new(), world.trace()));
    out.check(ranks[0].0 == Some(ErrorKind::WorkTimeout), format!("rank 0's old group gave {:?}", ranks[0].0));
    for (rank, (_, read)) in ranks.iter().enumerate() {
        out.check(*read == Ok(vec![3.0; 4]), format!("rank {rank}: the new group's all_reduce gave {read:?}"));
    }
    out.observed = format!("old group: {:?}; new group: {:?}", ranks[0].0, ranks[0].1);
    out
}
