//! `cargo xtask faults`: runs the fault matrix of issue 5 and prints
//! `scenario | expected | observed | detection latency | pass`.
//!
//! On the mock the scenarios are the very ones `cargo test` runs (`crates/pg-mock/tests/faults/matrix.rs`),
//! with scenario 7 at the full 50,000 unwaited ops; after the table, scenario 1's flight-recorder
//! dumps are analysed by `fr-analyze`.
//! With `--backend nccl`, scenarios 1, 3, 6, 8 and 9 run on two GPUs, one process per GPU over env://
//! ([`nccl`]); the GPU-less scenarios of the mock are not repeated there.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

#[path = "../../crates/pg-mock/tests/faults/matrix.rs"]
mod matrix;

const HELP: &str = "\
cargo xtask faults [--backend mock|nccl] [--json PATH] [--dumps DIR] [--only ID] [--unwaited-ops N]

Runs the fault matrix and prints scenario | expected | observed | detection latency | pass.
  --backend mock|nccl   the backend (default mock; nccl runs scenarios 1, 3, 6, 8, 9 on 2 GPUs)
  --json PATH           also write the rows as JSON
  --dumps DIR           where the scenarios' flight-recorder dumps go (default target/faults)
  --only ID             run one scenario (1, 1b, 2, ..., 9)
  --unwaited-ops N      ops per variant in scenario 7 (default 50000)
Latencies are virtual time on the mock, wall-clock time on GPUs. Exits non-zero when a scenario fails.
";

/// The task's entry point.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut backend = "mock".to_owned();
    let mut json_path = None;
    let mut dumps = PathBuf::from("target/faults");
    let mut only = None;
    let mut unwaited_ops = 50_000;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().cloned().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            "--backend" => backend = value("--backend")?,
            "--json" => json_path = Some(PathBuf::from(value("--json")?)),
            "--dumps" => dumps = PathBuf::from(value("--dumps")?),
            "--only" => only = Some(value("--only")?),
            "--unwaited-ops" => {
                unwaited_ops = value("--unwaited-ops")?.parse().map_err(|e| format!("--unwaited-ops: {e}"))?;
            }
            other => return Err(format!("unexpected argument '{other}'\n\n{HELP}")),
        }
    }
    match backend.as_str() {
        "mock" => {}
        "nccl" => {
            let (rows, failed) = nccl::run_all(only.as_deref(), &dumps)?;
            write_json(json_path.as_deref(), &backend, None, &rows)?;
            return match failed {
                0 => Ok(()),
                n => Err(format!("{n} scenario(s) failed")),
            };
        }
        other => return Err(format!("unknown backend '{other}' (mock or nccl)")),
    }
    let scenarios: Vec<matrix::Scenario> =
        matrix::scenarios().into_iter().filter(|s| only.as_deref().is_none_or(|id| id == s.id)).collect();
    if scenarios.is_empty() {
        return Err(format!("no scenario with id {only:?}"));
    }
    println!(
        "fault matrix on the mock (virtual time; timeout {:?}, watchdog period {:?})",
        matrix::TIMEOUT,
        matrix::PERIOD
    );
    println!("scenario | expected | observed | detection latency | pass");
    println!("--- | --- | --- | --- | ---");
    let mut rows = Vec::new();
    let mut failed = 0;
    for scenario in &scenarios {
        let dir = dumps.join(format!("scenario-{}", scenario.id));
        let started = Instant::now();
        let outcome = (scenario.run)(&matrix::Env { dir: dir.clone(), unwaited_ops });
        let wall = started.elapsed();
        let verdict = match (outcome.not_applicable, outcome.pass()) {
            (true, _) => "n/a",
            (false, true) => "pass",
            (false, false) => "FAIL",
        };
        failed += usize::from(verdict == "FAIL");
        println!(
            "{} {} | {} | {} | {} | {verdict}",
            scenario.id,
            scenario.name,
            scenario.expected,
            outcome.observed,
            outcome.latency.map_or_else(|| "-".to_owned(), show)
        );
        for failure in &outcome.failures {
            println!("    failed check: {failure}");
        }
        for detail in &outcome.details {
            println!("    {}", detail.replace('\n', "\n    "));
        }
        rows.push(json!({
            "id": scenario.id,
            "scenario": scenario.name,
            "expected": scenario.expected,
            "observed": outcome.observed,
            "detection_latency_ms": outcome.latency.map(|l| l.as_secs_f64() * 1e3),
            "pass": outcome.pass(),
            "not_applicable": outcome.not_applicable,
            "failures": outcome.failures,
            "wall_s": wall.as_secs_f64(),
        }));
    }
    analyse_scenario_1(&dumps.join("scenario-1"));
    write_json(json_path.as_deref(), &backend, Some(unwaited_ops), &rows)?;
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} scenario(s) failed")),
    }
}

/// Writes the rows as JSON to `path`, when given.
fn write_json(
    path: Option<&Path>,
    backend: &str,
    unwaited_ops: Option<usize>,
    rows: &[serde_json::Value],
) -> Result<(), String> {
    let Some(path) = path else { return Ok(()) };
    let doc = json!({ "backend": backend, "unwaited_ops": unwaited_ops, "rows": rows });
    let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    Ok(())
}

/// Prints what `fr-analyze` makes of scenario 1's dumps, when they are there.
fn analyse_scenario_1(dir: &Path) {
    let Ok(dumps) = crate::fr_analyze::read_dir(dir, "nccl_trace_rank_") else { return };
    if dumps.is_empty() {
        return;
    }
    println!("\nfr-analyze {} (scenario 1's flight-recorder dumps):", dir.display());
    for report in crate::fr_analyze::analyze(&dumps) {
        print!("{report}");
    }
}

fn show(latency: Duration) -> String {
    format!("{:.1} ms", latency.as_secs_f64() * 1e3)
}

/// The fault matrix on real GPUs: scenarios 1, 3, 6, 8 and 9 with two ranks, one process per GPU over env://.
///
/// Each scenario starts two rank processes of this executable (`__faults-rank ID OUT`) that rendezvous through
/// a TCP store on loopback, run the scenario with `ProcessGroup<pg_nccl::Nccl>`, and write what they saw as
/// JSON; the launcher judges it. Timeouts are short (5 s), latencies are wall-clock time.
pub mod nccl {
    use std::path::{Path, PathBuf};
    use std::process::{Child, Command};
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use pg_core::store::{PrefixStore, Store};
    use pg_core::{DType, Device as _, Error, ErrorType, Options, ProcessGroup, ReduceOp, Stream as _};
    use serde_json::{json, Value};

    /// The hidden subcommand a rank process runs.
    pub const RANK_TASK: &str = "__faults-rank";

    /// The per-Work timeout on GPUs.
    const TIMEOUT: Duration = Duration::from_secs(5);
    /// The watchdog period (PyTorch's default).
    const PERIOD: Duration = Duration::from_millis(100);
    /// How long the launcher lets a scenario's processes run.
    const JOB_TIMEOUT: Duration = Duration::from_secs(60);
    /// Elements of the 1 GiB all_reduce of scenario 8.
    const GIB_F32: usize = 1 << 28;

    /// The GPU scenarios: id, name, expected.
    pub const SCENARIOS: [(&str, &str, &str); 5] = [
        (
            "1",
            "a rank skips one collective",
            "rank 0: WorkTimeout within timeout + 2 periods; dumps; desync report names rank 1 at seq 4",
        ),
        (
            "3",
            "blocking wait on a hung op",
            "wait() returns WorkTimeout after the timeout; the communicator is aborted",
        ),
        ("6", "abort from a second thread", "the blocked waiter returns Aborted within 100 ms of the abort"),
        ("8", "rank SIGKILLed during a 1 GiB all_reduce", "the survivor errors within the timeout + 2 periods"),
        (
            "9",
            "new group on a fresh prefix after an error",
            "the old group keeps its error; the new group's all_reduce is correct",
        ),
    ];

    /// Runs every GPU scenario (or `only`); returns the rows and how many failed.
    pub fn run_all(only: Option<&str>, dumps: &Path) -> Result<(Vec<Value>, usize), String> {
        let gpus = pg_nccl::available().map_err(|e| format!("the nccl backend cannot run here: {e}"))?;
        if gpus < 2 {
            return Err(format!("the GPU fault matrix needs 2 GPUs; this machine has {gpus}"));
        }
        println!(
            "fault matrix on {gpus} GPUs, 2 ranks (wall-clock time; timeout {TIMEOUT:?}, watchdog period {PERIOD:?})"
        );
        println!("scenario | expected | observed | detection latency | pass");
        println!("--- | --- | --- | --- | ---");
        let mut rows = Vec::new();
        let mut failed = 0;
        for (id, name, expected) in SCENARIOS.iter().filter(|(id, _, _)| only.is_none_or(|o| o == *id)) {
            let dir = dumps.join(format!("nccl-scenario-{id}"));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let started = Instant::now();
            let (observed, latency, failures) = match launch(id, &dir) {
                Ok(ranks) => judge(id, &ranks),
                Err(e) => (format!("the run failed: {e}"), None, vec![e]),
            };
            let pass = failures.is_empty();
            failed += usize::from(!pass);
            let shown = latency.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1} ms"));
            println!("{id} {name} | {expected} | {observed} | {shown} | {}", if pass { "pass" } else { "FAIL" });
            for failure in &failures {
                println!("    failed check: {failure}");
            }
            if *id == "1" {
                if let Ok(dumps) = crate::fr_analyze::read_dir(&dir, "nccl_trace_rank_") {
                    for report in crate::fr_analyze::analyze(&dumps) {
                        print!("    fr-analyze: {report}");
                    }
                }
            }
            rows.push(json!({
                "id": id, "scenario": name, "expected": expected, "observed": observed,
                "detection_latency_ms": latency, "pass": pass, "failures": failures,
                "wall_s": started.elapsed().as_secs_f64(),
            }));
        }
        Ok((rows, failed))
    }

    /// Starts the two rank processes of scenario `id` and returns what each wrote (`None`: it wrote nothing).
    fn launch(id: &str, dir: &Path) -> Result<Vec<Option<Value>>, String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|e| format!("finding a free port: {e}"))?
            .port();
        let exe = std::env::current_exe().map_err(|e| format!("finding this executable: {e}"))?;
        let mut children: Vec<(usize, Child)> = Vec::new();
        for rank in 0..2 {
            let mut command = Command::new(&exe);
            command
                .args([RANK_TASK, id])
                .arg(out_path(dir, rank))
                .arg(dir)
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string());
            if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
                command.env("NCCL_NVLS_ENABLE", "0");
            }
            children.push((rank, command.spawn().map_err(|e| format!("starting rank {rank}: {e}"))?));
        }
        let started = Instant::now();
        let mut problems = Vec::new();
        while !children.is_empty() {
            let mut running = Vec::new();
            for (rank, mut child) in children {
                match child.try_wait() {
                    // Scenario 8's rank 1 kills itself; any other exit but success is a failure.
                    Ok(Some(status)) if status.success() || (id == "8" && rank == 1) => {}
                    Ok(Some(status)) => problems.push(format!("rank {rank} exited with {status}")),
                    Ok(None) if started.elapsed() > JOB_TIMEOUT => {
                        let _ = child.kill();
                        problems.push(format!("rank {rank} still running after {JOB_TIMEOUT:?}: killed (a hang)"));
                    }
                    Ok(None) => running.push((rank, child)),
                    Err(e) => problems.push(format!("rank {rank}: {e}")),
                }
            }
            children = running;
            // The launcher polls its children's exit; nothing here could be told about instead.
            std::thread::sleep(Duration::from_millis(20));
        }
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok((0..2)
            .map(|rank| std::fs::read_to_string(out_path(dir, rank)).ok().and_then(|t| serde_json::from_str(&t).ok()))
            .collect())
    }

    fn out_path(dir: &Path, rank: usize) -> PathBuf {
        dir.join(format!("rank{rank}.json"))
    }

    fn kind(value: &Value) -> &str {
        value.get("error").and_then(Value::as_str).unwrap_or("none")
    }

    fn ms(value: &Value, field: &str) -> Option<f64> {
        value.get(field).and_then(Value::as_f64)
    }

    /// Judges one scenario from what the ranks wrote: (observed, latency in ms, failed checks).
    fn judge(id: &str, ranks: &[Option<Value>]) -> (String, Option<f64>, Vec<String>) {
        let mut failures = Vec::new();
        let mut check = |ok: bool, what: String| {
            if !ok {
                failures.push(what);
            }
        };
        let null = Value::Null;
        let r0 = ranks[0].as_ref().unwrap_or(&null);
        let r1 = ranks[1].as_ref().unwrap_or(&null);
        let timeout_ms = TIMEOUT.as_secs_f64() * 1e3;
        let period_ms = PERIOD.as_secs_f64() * 1e3;
        let latency = ms(r0, "latency_ms");
        let observed = match id {
            "1" => {
                check(kind(r0) == "WorkTimeout", format!("rank 0: {}", kind(r0)));
                check(latency.is_some_and(|l| l <= timeout_ms + 2.0 * period_ms), format!("latency {latency:?}"));
                check(r0["lagging"] == json!([[1, 4]]), format!("rank 0's desync report: lagging {}", r0["lagging"]));
                check(
                    r0["dumped"] == true && r1["dumped"] == true,
                    format!("dumps: {} / {}", r0["dumped"], r1["dumped"]),
                );
                format!(
                    "rank 0: {}; desync lagging {}; dumps {}/{}",
                    kind(r0),
                    r0["lagging"],
                    r0["dumped"],
                    r1["dumped"]
                )
            }
            "3" => {
                check(kind(r0) == "WorkTimeout", format!("rank 0's wait(): {}", kind(r0)));
                check(
                    latency.is_some_and(|l| l >= timeout_ms && l <= timeout_ms + period_ms),
                    format!("returned after {latency:?} ms"),
                );
                check(r0["aborted_comms"] == 1, format!("aborted communicators: {}", r0["aborted_comms"]));
                format!("wait() -> {} ; communicators aborted: {}", kind(r0), r0["aborted_comms"])
            }
            "6" => {
                check(kind(r0) == "Aborted", format!("the waiter got {}", kind(r0)));
                check(latency.is_some_and(|l| l <= 100.0), format!("returned {latency:?} ms after the abort"));
                format!("the waiter returned {}", kind(r0))
            }
            "8" => {
                let error = kind(r0);
                check(matches!(error, "WorkTimeout" | "Communicator" | "Remote"), format!("the survivor got {error}"));
                check(latency.is_some_and(|l| l <= timeout_ms + 2.0 * period_ms), format!("latency {latency:?}"));
                check(ranks[1].is_none(), "the killed rank wrote a result".to_owned());
                format!("rank 1 killed; rank 0: {error} ({})", r0["message"].as_str().unwrap_or(""))
            }
            "9" => {
                check(kind(r0) == "WorkTimeout", format!("rank 0's old group: {}", kind(r0)));
                for (rank, r) in [(0, r0), (1, r1)] {
                    check(r["sum_ok"] == true, format!("rank {rank}: the new group's all_reduce gave {}", r["values"]));
                }
                format!("old group: {}; new group all_reduce correct: {}/{}", kind(r0), r0["sum_ok"], r1["sum_ok"])
            }
            other => format!("unknown scenario {other}"),
        };
        (observed, latency, failures)
    }

    // ===== the rank side =====

    /// `xtask __faults-rank ID OUT DIR`: one rank of a GPU scenario.
    pub fn rank_main(args: &[String]) -> Result<(), String> {
        let [id, out, dir] = args else {
            return Err(format!("usage: {RANK_TASK} ID OUT_JSON DUMP_DIR"));
        };
        let rendezvous =
            pg_core::store::rendezvous::env_rendezvous(Duration::from_secs(60)).map_err(|e| e.to_string())?;
        let local_rank = rendezvous.local_rank.unwrap_or(rendezvous.rank);
        let device = pg_nccl::Device::new(local_rank).map_err(|e| format!("device {local_rank}: {e}"))?;
        let out = PathBuf::from(out);
        let rank = Rank { rank: rendezvous.rank, device, store: rendezvous.store, dir: PathBuf::from(dir), out };
        match id.as_str() {
            "1" => rank.skip(),
            "3" => rank.blocking_wait(),
            "6" => rank.abort_from_another_thread(),
            "8" => rank.killed(),
            "9" => rank.new_group_after_error(),
            other => Err(format!("unknown scenario {other}")),
        }
        .map(drop)
    }

    struct Rank {
        rank: usize,
        device: pg_nccl::Device,
        store: Arc<dyn Store>,
        dir: PathBuf,
        out: PathBuf,
    }

    type Group = ProcessGroup<pg_nccl::Nccl>;

    fn never() -> AtomicBool {
        AtomicBool::new(false)
    }

    fn err(e: Error) -> String {
        e.to_string()
    }

    fn kind_of(error: Option<&Error>) -> Value {
        error.map_or(Value::Null, |e| json!(format!("{:?}", e.kind())))
    }

    impl Rank {
        /// Writes what this rank saw, while its groups are still alive: a drop that hangs cannot hide it.
        fn report(&self, value: Value) -> Result<Value, String> {
            std::fs::write(&self.out, value.to_string()).map_err(|e| format!("{}: {e}", self.out.display()))?;
            Ok(value)
        }

        fn options(&self) -> pg_core::OptionsBuilder {
            Options::builder()
                .timeout(TIMEOUT)
                .watchdog_period(PERIOD)
                .dump_path_prefix(format!("{}/nccl_trace_rank_", self.dir.display()))
        }

        fn group(&self, prefix: &str, options: Options) -> Result<Group, String> {
            let store: Arc<dyn Store> = Arc::new(PrefixStore::new(prefix, Arc::clone(&self.store)));
            ProcessGroup::new(store, self.rank, 2, self.device.clone(), options).map_err(err)
        }

        fn buffer(&self, numel: usize, value: f64) -> Result<pg_nccl::Buffer, String> {
            let buffer = self.device.alloc(DType::F32, numel).map_err(err)?;
            self.device.fill(&buffer, value, &self.device.current_stream()).map_err(err)?;
            Ok(buffer)
        }

        /// Sleeps in 10 ms steps until `done()` or `limit` passed.
        fn wait_until(&self, limit: Duration, mut done: impl FnMut() -> bool) -> bool {
            let deadline = self.device.now() + limit;
            while !done() {
                if self.device.now() >= deadline {
                    return false;
                }
                self.device.sleep(Duration::from_millis(10), &never());
            }
            true
        }

        fn warm_up(&self, pg: &Group, buffer: &pg_nccl::Buffer, ops: usize) -> Result<(), String> {
            for _ in 0..ops {
                pg.all_reduce(buffer, ReduceOp::Sum).and_then(|w| w.wait()).map_err(err)?;
            }
            self.device.current_stream().synchronize().map_err(err)
        }

        /// Scenario 1: rank 1 skips collective 5.
        fn skip(&self) -> Result<Value, String> {
            let pg = self.group("s1", self.options().desync_debug(true).build())?;
            let buffer = self.buffer(1 << 20, 1.0)?;
            self.warm_up(&pg, &buffer, 4)?;
            if self.rank == 1 {
                self.store.wait(&["s1-detected"], Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
                self.wait_until(Duration::from_secs(5), || pg.status().dumps_written > 0);
                // Rank 0 hosts the store: it waits for this before it exits.
                self.store.set("s1-rank1-done", b"1").map_err(|e| e.to_string())?;
                return self.report(json!({ "dumped": pg.status().dumps_written > 0 }));
            }
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(err)?;
            self.wait_until(3 * TIMEOUT, || pg.error_type() != ErrorType::Success);
            let status = pg.status();
            let latency = status.error_detected_at.map(|at| at.saturating_sub(work.start_time()).as_secs_f64() * 1e3);
            let lagging: Vec<(usize, Option<u64>)> = pg.desync_report().map(|r| r.lagging_ranks()).unwrap_or_default();
            self.store.set("s1-detected", b"1").map_err(|e| e.to_string())?;
            self.store.wait(&["s1-rank1-done"], Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
            self.report(json!({
                "error": kind_of(status.error.as_ref()), "latency_ms": latency, "lagging": lagging,
                "dumped": status.dumps_written > 0,
                "report": pg.desync_report().map(|r| r.to_string()),
            }))
        }

        /// Scenario 3: blocking wait on an op rank 1 never joins.
        fn blocking_wait(&self) -> Result<Value, String> {
            let pg = self.group("s3", self.options().blocking_wait(true).enable_watchdog(false).build())?;
            let buffer = self.buffer(1 << 20, 1.0)?;
            self.warm_up(&pg, &buffer, 2)?;
            if self.rank == 1 {
                self.store.wait(&["s3-done"], Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
                return self.report(json!({}));
            }
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(err)?;
            let result = work.wait();
            let after = self.device.now().saturating_sub(work.start_time());
            let aborted = pg.status().aborted_comms;
            self.store.set("s3-done", b"1").map_err(|e| e.to_string())?;
            self.report(json!({
                "error": kind_of(result.as_ref().err()), "latency_ms": after.as_secs_f64() * 1e3,
                "aborted_comms": aborted,
            }))
        }

        /// Scenario 6: a second thread aborts the group while rank 0 is blocked in wait().
        fn abort_from_another_thread(&self) -> Result<Value, String> {
            let options = self.options().timeout(Duration::from_secs(60)).blocking_wait(true).enable_watchdog(false);
            let pg = self.group("s6", options.build())?;
            let buffer = self.buffer(1 << 20, 1.0)?;
            self.warm_up(&pg, &buffer, 2)?;
            if self.rank == 1 {
                self.store.wait(&["s6-done"], Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
                return self.report(json!({}));
            }
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(err)?;
            let aborted_at = Arc::new(Mutex::new(None));
            let (pg2, device, at) = (pg.clone(), self.device.clone(), Arc::clone(&aborted_at));
            let aborter = self
                .device
                .spawn_host_thread(
                    "aborter",
                    Box::new(move || {
                        device.sleep(Duration::from_secs(1), &never());
                        *at.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(device.now());
                        pg2.abort("aborted from a second thread");
                    }),
                )
                .map_err(err)?;
            let result = work.wait();
            let returned = self.device.now();
            aborter.join().map_err(|_| "the aborter panicked".to_owned())?;
            let aborted_at = aborted_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner).unwrap_or(returned);
            self.store.set("s6-done", b"1").map_err(|e| e.to_string())?;
            self.report(json!({
                "error": kind_of(result.as_ref().err()),
                "latency_ms": returned.saturating_sub(aborted_at).as_secs_f64() * 1e3,
            }))
        }

        /// Scenario 8: rank 1 is SIGKILLed while rank 0's 1 GiB all_reduce waits for it.
        fn killed(&self) -> Result<Value, String> {
            let pg = self.group("s8", self.options().dump_on_timeout(false).build())?;
            let buffer = self.buffer(GIB_F32, 1.0)?;
            self.warm_up(&pg, &buffer, 1)?;
            if self.rank == 1 {
                // Rank 1's part waits behind 2 s of compute; it dies half a second into rank 0's all_reduce.
                self.device.sleep_kernel(&self.device.current_stream(), Duration::from_secs(2)).map_err(err)?;
                let _work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(err)?;
                self.device.sleep(Duration::from_millis(500), &never());
                let pid = std::process::id().to_string();
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
                // If kill is missing, abort: the process still dies without shutting anything down.
                std::process::abort();
            }
            let work = pg.all_reduce(&buffer, ReduceOp::Sum).map_err(err)?;
            self.wait_until(3 * TIMEOUT, || pg.error_type() != ErrorType::Success);
            let status = pg.status();
            let latency = status.error_detected_at.map(|at| at.saturating_sub(work.start_time()).as_secs_f64() * 1e3);
            self.report(json!({
                "error": kind_of(status.error.as_ref()), "latency_ms": latency,
                "message": status.error.as_ref().map(ToString::to_string),
            }))
        }

        /// Scenario 9: rank 1 skips an op, rank 0 times out; both go on with a new group on a fresh prefix.
        fn new_group_after_error(&self) -> Result<Value, String> {
            let first = self.group("s9-first", self.options().build())?;
            let buffer = self.buffer(1 << 20, 1.0)?;
            self.warm_up(&first, &buffer, 1)?;
            if self.rank == 0 {
                let _hung = first.all_reduce(&buffer, ReduceOp::Sum).map_err(err)?;
                self.wait_until(3 * TIMEOUT, || first.error().is_some());
                self.store.set("s9-failed", b"1").map_err(|e| e.to_string())?;
            } else {
                self.store.wait(&["s9-failed"], Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
            }
            let old = first.all_reduce(&buffer, ReduceOp::Sum).err();
            drop(first);
            let second = self.group("s9-second", self.options().build())?;
            let values = self.buffer(1 << 20, (self.rank + 1) as f64)?;
            second.all_reduce(&values, ReduceOp::Sum).and_then(|w| w.wait()).map_err(err)?;
            let bytes = self.device.copy_to_host(&values, &self.device.current_stream()).map_err(err)?;
            let read: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            let sum_ok = read.iter().all(|v| *v == 3.0);
            let value = self.report(json!({
                "error": kind_of(old.as_ref()), "sum_ok": sum_ok, "values": read.iter().take(4).collect::<Vec<_>>(),
            }))?;
            second.shutdown().map_err(err)?;
            Ok(value)
        }
    }
}
