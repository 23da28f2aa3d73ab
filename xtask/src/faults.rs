//! `cargo xtask faults`: runs the fault matrix and prints
//! `scenario | expected | observed | detection latency | pass`.
//!
//! On the mock the scenarios are the very ones `cargo test` runs (`pg_conformance::fault_matrix`),
//! with scenario 7 at its full 50,000 unwaited ops; after the table, scenario 1's flight-recorder
//! dumps are analysed by `fr-analyze`. `--trace DIR` writes each scenario's simulated timeline (`mock_trace.rs`).
//! `--backend nccl` runs the GPU half (scenarios 1, 3, 6, 8 and 9) at `--world-size N` (default 2), one process
//! per rank, ranks beyond the GPUs sharing them over NCCL's network transport (`gpu_faults.rs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use pg_lab::results::faults::{MockFaultRow, MockFaults, NcclFaults};

use pg_conformance::fault_matrix as matrix;

const HELP: &str = "\
cargo xtask faults [--backend mock|nccl] [--world-size N] [--json PATH] [--dumps DIR] [--trace DIR] [--only ID]
                   [--unwaited-ops N]

Runs the fault matrix and prints scenario | expected | observed | detection latency | pass.
  --backend mock|nccl   the backend (default mock; nccl runs scenarios 1, 3, 6, 8 and 9, one process per rank)
  --world-size N        ranks of the nccl run (default 2; rank r on GPU r % GPUs, ranks sharing a GPU over
                        NCCL's network transport); the last rank is the faulty one
  --json PATH           also write the rows as JSON
  --dumps DIR           where the scenarios' flight-recorder dumps go (default target/faults)
  --trace DIR           (mock) write each scenario's simulated timeline to DIR/scenario-ID.json (one file per
                        world, DIR/scenario-ID-VARIANT.json, where a scenario runs several), a Chrome trace-event
                        file for Perfetto or chrome://tracing; a scenario whose ranks dumped their flight
                        recorders also shows the dumps' ops and the first divergence fr-analyze finds
  --only ID             run one scenario (1, 1b, 2, ..., 9)
  --unwaited-ops N      ops per variant in scenario 7 (default 50000)
Latencies are virtual time on the mock. Exits non-zero when a scenario fails.
";

/// The task's entry point.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut backend = "mock".to_owned();
    let mut json_path = None;
    let mut dumps = PathBuf::from("target/faults");
    let mut trace = None;
    let mut only = None;
    let mut unwaited_ops = 50_000;
    let mut world = 2;
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
            "--trace" => trace = Some(PathBuf::from(value("--trace")?)),
            "--world-size" => world = value("--world-size")?.parse().map_err(|e| format!("--world-size: {e}"))?,
            "--only" => only = Some(value("--only")?),
            "--unwaited-ops" => {
                unwaited_ops = value("--unwaited-ops")?.parse().map_err(|e| format!("--unwaited-ops: {e}"))?;
            }
            other => return Err(format!("unexpected argument '{other}'\n\n{HELP}")),
        }
    }
    match backend.as_str() {
        "mock" => {}
        "nccl" if trace.is_some() => return Err("--trace is for the mock; on GPUs set PG_TRACE=DIR".to_owned()),
        "nccl" => return run_nccl(&dumps, json_path.as_deref(), world),
        other => return Err(format!("unknown backend '{other}' (mock or nccl)")),
    }
    let scenarios: Vec<matrix::Scenario> =
        matrix::scenarios().into_iter().filter(|s| only.as_deref().is_none_or(|id| id == s.id)).collect();
    if scenarios.is_empty() {
        return Err(format!("no scenario with id {only:?}"));
    }
    if let Some(dir) = &trace {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
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
        if let Some(out) = &trace {
            for path in write_traces(out, scenario.id, &outcome, &dir)? {
                println!("    wrote {}", path.display());
            }
        }
        rows.push(MockFaultRow {
            detection_latency_ms: outcome.latency.map(|l| l.as_secs_f64() * 1e3),
            expected: scenario.expected.to_owned(),
            failures: outcome.failures.clone(),
            id: scenario.id.to_owned(),
            not_applicable: outcome.not_applicable,
            observed: outcome.observed.clone(),
            pass: outcome.pass(),
            scenario: scenario.name.to_owned(),
            wall_s: wall.as_secs_f64(),
        });
    }
    analyse_scenario_1(&dumps.join("scenario-1"));
    if let Some(path) = json_path {
        let doc = MockFaults {
            backend: backend.clone(),
            rows,
            timeout_ms: matrix::TIMEOUT.as_millis() as u64,
            unwaited_ops: Some(unwaited_ops as u64),
            watchdog_period_ms: matrix::PERIOD.as_millis() as u64,
            ..MockFaults::default()
        };
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} scenario(s) failed")),
    }
}

/// The GPU half: scenarios 1, 3, 6, 8 and 9 at `world` ranks, one process per rank (`gpu_faults`).
fn run_nccl(dumps: &Path, json_path: Option<&Path>, world: usize) -> Result<(), String> {
    let rows = crate::gpu_faults::run(dumps, world)?;
    let gpus = pg_nccl::available().unwrap_or(0);
    let layout = pg_nccl::placement::describe(world, gpus);
    println!("fault matrix, {layout} (NCCL; timeout 2 s, watchdog period 100 ms; latencies in real time)");
    println!("scenario | rank | expected | observed | detection latency | pass");
    println!("--- | --- | --- | --- | --- | ---");
    for row in &rows {
        println!(
            "{} | {} | {} | {} | {} | {}",
            row.scenario,
            row.rank,
            row.expected,
            row.observed,
            row.detection_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms:.1} ms")),
            if row.pass { "pass" } else { "FAIL" }
        );
    }
    analyse_scenario_1(&dumps.join("scenario-1"));
    if let Some(path) = json_path {
        let doc = NcclFaults {
            backend: "nccl".to_owned(),
            layout: Some(layout),
            rows: rows.clone(),
            timeout_ms: 2000,
            watchdog_period_ms: 100,
            world_size: Some(world as u64),
            ..NcclFaults::default()
        };
        let text = serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    let failed = rows.iter().filter(|row| !row.pass).count();
    match failed {
        0 => Ok(()),
        n => Err(format!("{n} row(s) failed")),
    }
}

/// Writes the timelines of one scenario's worlds into `out`; a scenario of one world also shows the
/// flight-recorder dumps it left in `dumps`. Returns the files written.
fn write_traces(out: &Path, id: &str, outcome: &matrix::Outcome, dumps: &Path) -> Result<Vec<PathBuf>, String> {
    let mut written = Vec::new();
    for (label, trace) in &outcome.traces {
        let (path, json) = match outcome.traces.len() {
            1 => (out.join(format!("scenario-{id}.json")), crate::mock_trace::with_flight_recorder(trace, dumps)),
            _ => {
                let label: String = label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
                (out.join(format!("scenario-{id}-{label}.json")), trace.to_chrome_json())
            }
        };
        crate::mock_trace::write(&path, &json)?;
        written.push(path);
    }
    Ok(written)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_1_trace_marks_rank_1_as_the_one_that_never_issued_seq_5() {
        let base = std::env::temp_dir().join(format!("pg-xtask-faults-trace-{}", std::process::id()));
        let (dumps, out) = (base.join("scenario-1"), base.join("trace"));
        std::fs::create_dir_all(&out).unwrap();
        let scenario = matrix::scenarios().into_iter().find(|s| s.id == "1").unwrap();
        let outcome = (scenario.run)(&matrix::Env { dir: dumps.clone(), unwaited_ops: 0 });
        assert!(outcome.pass(), "{:?}", outcome.failures);
        let written = write_traces(&out, "1", &outcome, &dumps).unwrap();
        assert_eq!(written, [out.join("scenario-1.json")]);
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&written[0]).unwrap()).unwrap();
        let _ = std::fs::remove_dir_all(&base);
        let events = json["traceEvents"].as_array().unwrap();
        for event in events {
            for field in ["ph", "pid", "tid", "name"] {
                assert!(event.get(field).is_some(), "{field} missing in {event}");
            }
            assert!(event["ph"] == "M" || event["ts"].is_number(), "ts missing in {event}");
        }
        let marks: Vec<&serde_json::Value> =
            events.iter().filter(|e| e["ph"] == "i" && e["cat"] == "divergence").collect();
        assert_eq!(marks.len(), 1, "{marks:?}");
        assert_eq!(marks[0]["pid"], 1);
        assert!(marks[0]["name"].as_str().unwrap().contains("never issued seq 5"), "{}", marks[0]);
        // The flight recorder's op slices, on tracks of their own beside the streams: ranks 0, 2 and 3 issued
        // seq 5, rank 1 did not.
        let seq_5: Vec<u64> = events
            .iter()
            .filter(|e| e["ph"] == "X" && e["cat"] == "op" && e["args"]["collective_seq_id"] == 5)
            .map(|e| e["pid"].as_u64().unwrap())
            .collect();
        assert_eq!(seq_5, [0, 2, 3]);
        // The simulated side agrees: rank 1 issued the communicator's fifth collective only after the scenario,
        // once the others' had ended (aborted by their watchdogs).
        let fifth: Vec<&serde_json::Value> =
            events.iter().filter(|e| e["ph"] == "X" && e["cat"] == "comm" && e["name"] == "all_reduce #4").collect();
        let end = |e: &serde_json::Value| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap();
        let late = fifth.iter().find(|e| e["pid"] == 1).expect("rank 1's later call");
        let others: Vec<&&serde_json::Value> = fifth.iter().filter(|e| e["pid"] != 1).collect();
        assert_eq!(others.len(), 3);
        assert!(others.iter().all(|e| end(e) <= late["ts"].as_f64().unwrap()), "{fifth:?}");
    }
}
