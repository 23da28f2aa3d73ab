//! `cargo xtask faults`: runs the fault matrix and prints
//! `scenario | expected | observed | detection latency | pass`.
//!
//! On the mock the scenarios are the very ones `cargo test` runs (`crates/pg-mock/tests/faults/matrix.rs`),
//! with scenario 7 at its full 50,000 unwaited ops; after the table, scenario 1's flight-recorder
//! dumps are analysed by `fr-analyze`.
//! `--backend nccl` runs the GPU half (scenarios 1, 3, 6, 8 and 9) at `--world-size N` (default 2), one process
//! per rank, ranks beyond the GPUs sharing them over NCCL's network transport (`gpu_faults.rs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::json;

#[path = "../../crates/pg-mock/tests/faults/matrix.rs"]
mod matrix;

const HELP: &str = "\
cargo xtask faults [--backend mock|nccl] [--world-size N] [--json PATH] [--dumps DIR] [--only ID] [--unwaited-ops N]

Runs the fault matrix and prints scenario | expected | observed | detection latency | pass.
  --backend mock|nccl   the backend (default mock; nccl runs scenarios 1, 3, 6, 8 and 9, one process per rank)
  --world-size N        ranks of the nccl run (default 2; rank r on GPU r % GPUs, ranks sharing a GPU over
                        NCCL's network transport); the last rank is the faulty one
  --json PATH           also write the rows as JSON
  --dumps DIR           where the scenarios' flight-recorder dumps go (default target/faults)
  --only ID             run one scenario (1, 1b, 2, ..., 9)
  --unwaited-ops N      ops per variant in scenario 7 (default 50000)
Latencies are virtual time on the mock. Exits non-zero when a scenario fails.
";

/// The task's entry point.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut backend = "mock".to_owned();
    let mut json_path = None;
    let mut dumps = PathBuf::from("target/faults");
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
        "nccl" => return run_nccl(&dumps, json_path.as_deref(), world),
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
    if let Some(path) = json_path {
        let doc = json!({
            "backend": backend,
            "timeout_ms": matrix::TIMEOUT.as_millis() as u64,
            "watchdog_period_ms": matrix::PERIOD.as_millis() as u64,
            "unwaited_ops": unwaited_ops,
            "rows": rows,
        });
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
        let doc = json!({ "backend": "nccl", "world_size": world, "layout": layout, "timeout_ms": 2000,
                          "watchdog_period_ms": 100, "rows": rows });
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
