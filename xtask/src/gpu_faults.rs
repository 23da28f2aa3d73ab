//! The fault matrix on real GPUs (scenarios 1, 3, 6, 8 and 9): a world of two or more ranks over env://
//! (ranks beyond the GPUs share them over NCCL's network transport), each scenario a function of the rank, with
//! short timeouts. The faulty rank of a scenario is the last one; every other rank reports what it saw.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pg_core::store::{PrefixStore, Store};
use pg_core::{Buffer as _, DType, Device as _, Error, ErrorKind, Options, OptionsBuilder, ProcessGroup, ReduceOp};
use pg_nccl::Nccl;
use serde::{Deserialize, Serialize};

/// The hidden subcommand a rank process runs.
pub const RANK_TASK: &str = "__faults-rank";

/// One row of the matrix, as one rank saw it.
pub type Row = pg_lab::results::faults::NcclFaultRow;

/// What the rank processes run.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Plan {
    scenarios: Vec<String>,
    world: usize,
    timeout_ms: u64,
    watchdog_ms: u64,
    dump_dir: String,
}

/// Runs scenarios 1, 3, 6 and 9 in one world of `world` processes, then 8 (which kills the last rank) in another.
pub fn run(dump_dir: &Path, world: usize) -> Result<Vec<Row>, String> {
    if world < 2 {
        return Err(format!("the fault matrix needs two or more ranks, not {world}"));
    }
    std::fs::create_dir_all(dump_dir).map_err(|e| format!("{}: {e}", dump_dir.display()))?;
    let dump_dir = std::fs::canonicalize(dump_dir).map_err(|e| e.to_string())?;
    let plan = |scenarios: &[&str]| Plan {
        scenarios: scenarios.iter().map(|s| (*s).to_owned()).collect(),
        world,
        timeout_ms: 2000,
        watchdog_ms: 100,
        dump_dir: dump_dir.display().to_string(),
    };
    let mut rows = Vec::new();
    for (scenarios, may_die) in [(&["1", "3", "6", "9"][..], &[][..]), (&["8"][..], &[world - 1][..])] {
        let payload = serde_json::to_string(&plan(scenarios)).map_err(|e| e.to_string())?;
        // A rank that crashes fails the scenario it was in, not the matrix: what it wrote before stays.
        for (rank, end) in super::gpu::launch_ranks(RANK_TASK, &payload, world, may_die)?.into_iter().enumerate() {
            let mine: Vec<Row> = match end.output.as_deref() {
                Some(text) if !text.is_empty() => {
                    serde_json::from_str(text).map_err(|e| format!("rank {rank}'s rows: {e}"))?
                }
                _ => Vec::new(),
            };
            if let Some(failure) = end.failure {
                let done: Vec<&str> = mine.iter().map(|row| row.scenario.as_str()).collect();
                let crashed_in = scenarios.iter().find(|s| !done.contains(s)).copied().unwrap_or("after the last");
                rows.push(Row {
                    scenario: crashed_in.to_owned(),
                    rank,
                    expected: "the rank ends normally".to_owned(),
                    observed: format!("{failure} (scenarios it finished: {done:?})"),
                    detection_ms: None,
                    pass: false,
                });
            }
            rows.extend(mine);
        }
    }
    Ok(rows)
}

/// `xtask __faults-rank OUT PLAN_JSON`: one rank of [`run`].
pub fn rank_main(args: &[String]) -> Result<(), String> {
    let [out, plan] = args else {
        return Err(format!("usage: {RANK_TASK} OUT_JSON PLAN_JSON"));
    };
    let plan: Plan = serde_json::from_str(plan).map_err(|e| format!("plan: {e}"))?;
    let (rendezvous, device) = super::gpu::join_job(Duration::from_secs(120))?;
    let rank = Rank { rank: rendezvous.rank, device, store: rendezvous.store, plan };
    let mut rows = Vec::new();
    for scenario in rank.plan.scenarios.clone() {
        // Each scenario starts as a program that recovered would: the failed group's buffers are gone, so the
        // device's failure record is cleared (the documented step before a new group).
        pg_core::Device::poison(&rank.device).clear();
        let row = match scenario.as_str() {
            "1" => rank.skipped_collective(),
            "3" => rank.blocking_wait_on_a_hung_op(),
            "6" => rank.abort_from_a_second_thread(),
            "8" => rank.peer_killed_during_a_large_all_reduce(),
            "9" => rank.new_group_after_an_error(),
            other => Err(format!("unknown scenario {other}")),
        };
        rows.push(row.unwrap_or_else(|why| Row {
            scenario: scenario.clone(),
            rank: rank.rank,
            expected: "the scenario runs".to_owned(),
            observed: format!("failed to run: {why}"),
            detection_ms: None,
            pass: false,
        }));
        // Written after every scenario, so a rank that dies later leaves what it saw.
        let json = serde_json::to_string(&rows).map_err(|e| e.to_string())?;
        std::fs::write(out, json).map_err(|e| format!("{out}: {e}"))?;
    }
    eprintln!("rank {}: every scenario written; exiting", rank.rank);
    Ok(())
}

struct Rank {
    rank: usize,
    device: pg_nccl::Device,
    store: Arc<dyn Store>,
    plan: Plan,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e4).round() / 10.0
}

fn describe(error: &Error) -> String {
    format!("{:?}: {error}", error.kind())
}

impl Rank {
    fn timeout(&self) -> Duration {
        Duration::from_millis(self.plan.timeout_ms)
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.plan.watchdog_ms)
    }

    /// The rank that causes each scenario's fault (it skips the op, or is killed): the last one.
    fn faulty(&self) -> usize {
        self.plan.world - 1
    }

    fn group(&self, name: &str, options: OptionsBuilder) -> Result<ProcessGroup<Nccl>, String> {
        let store = Arc::new(PrefixStore::new(format!("{name}/"), Arc::clone(&self.store)));
        let dumps = Path::new(&self.plan.dump_dir).join(format!("scenario-{name}"));
        std::fs::create_dir_all(&dumps).map_err(|e| format!("{}: {e}", dumps.display()))?;
        let options = options
            .timeout(self.timeout())
            .watchdog_period(self.period())
            .dump_path_prefix(format!("{}/nccl_trace_rank_", dumps.display()))
            .desync_debug(true)
            .group_name(name.to_owned())
            .build();
        ProcessGroup::new(store, self.rank, self.plan.world, self.device.clone(), options).map_err(|e| e.to_string())
    }

    fn filled(&self, value: f64, numel: usize) -> Result<pg_nccl::Buffer, String> {
        let buffer = self.device.alloc(DType::F32, numel).map_err(|e| e.to_string())?;
        self.device.fill(&buffer, value, &self.device.current_stream()).map_err(|e| e.to_string())?;
        Ok(buffer)
    }

    /// A warm-up op, so that communicator creation is not part of what is measured.
    fn warm_up(&self, group: &ProcessGroup<Nccl>) -> Result<(), String> {
        let buffer = self.filled(1.0, 1024)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
        self.device.synchronize().map_err(|e| e.to_string())
    }

    /// The faulty rank of a scenario: it skips the op and waits until rank 0 says it has seen the error.
    fn skip_until_detected(&self, group: &ProcessGroup<Nccl>, scenario: &str, expected: &str) -> Result<Row, String> {
        let key = format!("{scenario}/detected");
        let waited = self.store.wait(&[key.as_str()], Some(Duration::from_secs(60)));
        group.abort("the scenario is over");
        Ok(Row {
            scenario: scenario.to_owned(),
            rank: self.rank,
            expected: expected.to_owned(),
            observed: match waited {
                Ok(()) => "skipped the op (the faulty rank); the others reported their errors".to_owned(),
                Err(e) => format!("rank 0 never reported: {e}"),
            },
            detection_ms: None,
            pass: true,
        })
    }

    fn detected(&self, scenario: &str, group: &ProcessGroup<Nccl>) {
        let _ = self.store.set(&format!("{scenario}/detected"), b"1");
        group.abort("the scenario is over");
    }

    /// Polls (every 2 ms) until `found` returns something or `limit` passes.
    fn poll<T>(limit: Duration, found: impl Fn() -> Option<T>) -> (Option<T>, Duration) {
        let start = Instant::now();
        loop {
            if let Some(value) = found() {
                return (Some(value), start.elapsed());
            }
            if start.elapsed() > limit {
                return (None, start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn skipped_collective(&self) -> Result<Row, String> {
        let expected = "work-timeout error within timeout + 2 watchdog periods; flight recorder dumped; desync \
                        report names the last rank";
        let group = self.group("1", Options::builder())?;
        self.warm_up(&group)?;
        if self.rank == self.faulty() {
            return self.skip_until_detected(&group, "1", expected);
        }
        let buffer = self.filled(1.0, 1 << 20)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
        work.wait().map_err(|e| e.to_string())?;
        let (error, latency) = Self::poll(self.timeout() * 5, || work.exception());
        let dump = Path::new(&self.plan.dump_dir).join(format!("scenario-1/nccl_trace_rank_{}", self.rank));
        // The watchdog sets the error, then writes the dump: give the write a moment.
        let dumped = Self::poll(Duration::from_secs(2), || dump.exists().then_some(())).0.is_some();
        let report = group.desync_report();
        self.detected("1", &group);
        let bound = self.timeout() + self.period() * 2;
        let faulty = format!("rank: {}", self.faulty());
        let names_faulty = report.as_ref().is_some_and(|r| format!("{r:?}").contains(&faulty));
        let pass = error.as_ref().is_some_and(|e| e.kind() == ErrorKind::WorkTimeout)
            && latency <= bound + Duration::from_millis(20)
            && dumped;
        Ok(Row {
            scenario: "1".to_owned(),
            rank: self.rank,
            expected: expected.to_owned(),
            observed: format!(
                "{}; dump {}: {}; desync report: {}",
                error.as_ref().map_or("no error".to_owned(), describe),
                dump.display(),
                if dumped { "written" } else { "missing" },
                report.map_or("none".to_owned(), |r| format!("{r:?}"))
            ),
            detection_ms: Some(ms(latency)),
            pass: pass && names_faulty,
        })
    }

    fn blocking_wait_on_a_hung_op(&self) -> Result<Row, String> {
        let expected = "the caller gets the work-timeout error after the timeout; the communicator is aborted";
        let group = self.group("3", Options::builder().blocking_wait(true))?;
        self.warm_up(&group)?;
        if self.rank == self.faulty() {
            return self.skip_until_detected(&group, "3", expected);
        }
        let buffer = self.filled(1.0, 1 << 20)?;
        let start = Instant::now();
        let result = group.all_reduce(&buffer, ReduceOp::Sum).and_then(|work| work.wait());
        let latency = start.elapsed();
        let aborted = group.status().aborted_comms;
        self.detected("3", &group);
        let pass = matches!(&result, Err(e) if e.kind() == ErrorKind::WorkTimeout)
            && latency >= self.timeout()
            // The error comes after the timeout plus the communicator's abort, which NCCL takes a while over.
            && latency <= self.timeout() + Duration::from_secs(1)
            && aborted >= 1;
        Ok(Row {
            scenario: "3".to_owned(),
            rank: self.rank,
            expected: expected.to_owned(),
            observed: format!(
                "{}; aborted communicators: {aborted}",
                result.err().as_ref().map_or("returned Ok".to_owned(), describe)
            ),
            detection_ms: Some(ms(latency)),
            pass,
        })
    }

    fn abort_from_a_second_thread(&self) -> Result<Row, String> {
        let expected = "the blocked waiter returns the aborted error soon after abort()";
        let group = self.group("6", Options::builder().blocking_wait(true).timeout(Duration::from_secs(60)))?;
        self.warm_up(&group)?;
        if self.rank == self.faulty() {
            return self.skip_until_detected(&group, "6", expected);
        }
        let buffer = self.filled(1.0, 1 << 20)?;
        let work = group.all_reduce(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
        let aborted_at = Arc::new(Mutex::new(None));
        let aborter = {
            let (group, aborted_at) = (group.clone(), Arc::clone(&aborted_at));
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                *aborted_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Instant::now());
                group.abort("aborted by a second thread");
            })
        };
        let result = work.wait();
        let returned = Instant::now();
        let _ = aborter.join();
        let latency = aborted_at
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .map(|at| returned.saturating_duration_since(at));
        self.detected("6", &group);
        let pass = matches!(&result, Err(e) if e.kind() == ErrorKind::Aborted)
            && latency.is_some_and(|l| l <= Duration::from_secs(1));
        Ok(Row {
            scenario: "6".to_owned(),
            rank: self.rank,
            expected: expected.to_owned(),
            observed: result.err().as_ref().map_or("returned Ok".to_owned(), describe),
            detection_ms: latency.map(ms),
            pass,
        })
    }

    fn new_group_after_an_error(&self) -> Result<Row, String> {
        let group = self.group("9", Options::builder())?;
        let buffer = self.filled((self.rank + 1) as f64, 1 << 20)?;
        group.all_reduce_sync(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
        let bytes = self.device.copy_to_host(&buffer, &self.device.current_stream()).map_err(|e| e.to_string())?;
        let sum = (1..=self.plan.world).sum::<usize>() as f32;
        let correct = bytes.chunks_exact(4).all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) == sum);
        group.shutdown().map_err(|e| e.to_string())?;
        Ok(Row {
            scenario: "9".to_owned(),
            rank: self.rank,
            expected: "after the errors above, a new group on a fresh prefix gives a correct all_reduce".to_owned(),
            observed: format!("all_reduce of {} floats {}", buffer.numel(), if correct { "correct" } else { "WRONG" }),
            detection_ms: None,
            pass: correct,
        })
    }

    fn peer_killed_during_a_large_all_reduce(&self) -> Result<Row, String> {
        let expected = "the last rank is killed with SIGKILL during a 1 GiB all_reduce: every other rank errors \
                        within the timeout + 2 watchdog periods";
        let group = self.group("8", Options::builder())?;
        self.warm_up(&group)?;
        let buffer = self.filled(1.0, (1 << 30) / 4)?;
        self.device.synchronize().map_err(|e| e.to_string())?;
        if self.rank == self.faulty() {
            // The last rank joins the op late (behind a sleep kernel) and is killed while the others' kernels run.
            let current = self.device.current_stream();
            self.device.sleep_kernel(&current, Duration::from_millis(200)).map_err(|e| e.to_string())?;
            let _work = group.all_reduce(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
            std::thread::sleep(Duration::from_millis(50));
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill").args(["-9", &pid]).status();
            return Err("the last rank survived its own SIGKILL".to_owned());
        }
        let start = Instant::now();
        let work = group.all_reduce(&buffer, ReduceOp::Sum).map_err(|e| e.to_string())?;
        work.wait().map_err(|e| e.to_string())?;
        let (error, latency) = Self::poll(self.timeout() * 5, || work.exception().or_else(|| group.error()));
        let detected_after = start.elapsed();
        // Each step on stderr: a survivor that crashes in the teardown after a peer's death shows how far it got.
        eprintln!("rank {}: scenario 8: error seen after {detected_after:?}: {error:?}", self.rank);
        group.abort("the scenario is over");
        eprintln!("rank {}: scenario 8: group aborted", self.rank);
        drop(work);
        drop(group);
        drop(buffer);
        eprintln!("rank {}: scenario 8: group, Work and buffer dropped", self.rank);
        let bound = self.timeout() + self.period() * 2 + Duration::from_millis(20);
        Ok(Row {
            scenario: "8".to_owned(),
            rank: self.rank,
            expected: expected.to_owned(),
            observed: error.as_ref().map_or("no error".to_owned(), describe),
            detection_ms: Some(ms(latency)),
            pass: error.is_some() && detected_after <= bound && latency <= bound,
        })
    }
}
