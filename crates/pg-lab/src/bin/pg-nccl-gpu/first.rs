//! Time to the first collective: a group made in a fresh process, then its first all_reduce, until that op has
//! finished on the device. Lazy (the first op creates the communicator) and eager (`Options::eager_init`, the
//! group's creation does, as PyTorch's `init_process_group(device_id=...)`).
//!
//! Each trial is a fresh set of rank processes (task `first-lazy` or `first-eager`), so every trial pays what a
//! program pays: NCCL's one-time setup in the process, the unique-id exchange, the communicator's creation and
//! connection, the first kernel. The clock starts once the ranks have met at a store barrier, after the store
//! and the device's context exist (as the PyTorch script does: its TCPStore and CUDA context come first), and stops
//! when the op's result is on the device (device synchronize). The slowest rank's time counts.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use pg_core::{DType, Options, ReduceOp};
use serde_json::{json, Value};

use crate::util::{all_equal, filled, group, read};
use crate::{Rank, Settings};

/// The two modes, as task names of one rank process.
pub const MODES: [(&str, bool); 2] = [("first-lazy", false), ("first-eager", true)];

fn e(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// One rank of one trial: meet the others, then make the group and run its first all_reduce.
pub fn run(ctx: &Rank, eager: bool) -> Result<Value, String> {
    let tiny = filled(ctx, DType::F32, 1, 1.0)?;
    pg_core::Device::synchronize(&ctx.device).map_err(e)?;
    // A store barrier: every rank's clock starts when the last one is ready, so that no rank times the others'
    // process start.
    if ctx.store.add("first-barrier/arrived", 1).map_err(e)? == ctx.world as i64 {
        ctx.store.set("first-barrier/go", b"1").map_err(e)?;
    }
    ctx.store.wait(&["first-barrier/go"], Some(Duration::from_secs(120))).map_err(e)?;
    let started = Instant::now();
    let pg = group(ctx, "first", Options::builder().eager_init(eager))?;
    let created = started.elapsed();
    pg.all_reduce_sync(&tiny, ReduceOp::Sum).map_err(e)?;
    pg_core::Device::synchronize(&ctx.device).map_err(e)?;
    let first = started.elapsed();
    all_equal(&read(ctx, &tiny)?, ctx.world as f64)?;
    pg.shutdown().map_err(e)?;
    Ok(json!({
        "task": if eager { "first-eager" } else { "first-lazy" },
        "eager": eager,
        "group_creation_ms": created.as_secs_f64() * 1e3,
        "first_collective_ms": first.as_secs_f64() * 1e3,
    }))
}

/// Runs `trials` fresh launches of each mode, alternating; returns one merged value per launch.
pub fn launch(
    settings: &Settings,
    nproc: usize,
    launch_task: impl Fn(&Settings, &str, usize) -> Result<Vec<Value>, String>,
) -> Result<Vec<Value>, String> {
    let mut launches = Vec::new();
    for _ in 0..settings.bench_trials {
        for (task, eager) in MODES {
            let ranks = launch_task(settings, task, nproc)?;
            launches.push(json!({ "eager": eager, "ranks": ranks }));
        }
    }
    Ok(launches)
}

/// The slowest rank's time to the first collective of each launch, in ms, per mode (lazy, eager).
pub fn times(launches: &[Value]) -> [Vec<f64>; 2] {
    let mut out = [Vec::new(), Vec::new()];
    for launch in launches {
        let slowest = launch["ranks"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|rank| rank["first_collective_ms"].as_f64().unwrap_or(f64::NAN))
            .fold(f64::NEG_INFINITY, f64::max);
        out[usize::from(launch["eager"] == json!(true))].push(slowest);
    }
    out
}

/// The markdown of the launches: medians per mode and every trial.
pub fn report(launches: &[Value]) -> (bool, String) {
    let [lazy, eager] = times(launches);
    let mut md = String::new();
    let _ = writeln!(md, "\n### Time to the first all_reduce (fresh processes, slowest rank, ms)\n");
    let _ = writeln!(md, "| mode | median | trials |");
    let _ = writeln!(md, "|---|---|---|");
    for (name, values) in [("lazy", &lazy), ("eager (eager_init)", &eager)] {
        let mut sorted = values.clone();
        let trials: Vec<String> = values.iter().map(|v| format!("{v:.1}")).collect();
        let _ = writeln!(md, "| {name} | {:.1} | {} |", crate::bench::median(&mut sorted), trials.join(", "));
    }
    let ok = !lazy.is_empty() && !eager.is_empty() && lazy.iter().chain(&eager).all(|v| v.is_finite());
    (ok, md)
}

/// pg's and PyTorch's first-collective medians side by side: `first` is `first.json`'s launches, `torch` the
/// PyTorch script's lines (`{"mode": "lazy"|"eager", "first_collective_ms": ...}`, the slowest rank's).
pub fn compare(first: &[Value], torch: &[Value]) -> Value {
    let [lazy, eager] = times(first);
    let torch_mode = |mode: &str| -> Vec<f64> {
        torch.iter().filter(|t| t["mode"] == mode).filter_map(|t| t["first_collective_ms"].as_f64()).collect()
    };
    let median = |mut values: Vec<f64>| (!values.is_empty()).then(|| crate::bench::median(&mut values));
    let side = |pg: Vec<f64>, torch: Vec<f64>| {
        let (pg_ms, torch_ms) = (median(pg.clone()), median(torch.clone()));
        let ratio = pg_ms.zip(torch_ms).map(|(p, t)| p / t);
        json!({
            "pg_ms": pg_ms, "torch_ms": torch_ms, "pg_over_torch": ratio,
            "within_0_8": ratio.map(|r| r <= 0.8), "pg_trials_ms": pg, "torch_trials_ms": torch,
        })
    };
    json!({ "lazy": side(lazy, torch_mode("lazy")), "eager": side(eager, torch_mode("eager")) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(eager: bool, ms: [f64; 2]) -> Value {
        json!({ "eager": eager, "ranks": [{ "first_collective_ms": ms[0] }, { "first_collective_ms": ms[1] }] })
    }

    #[test]
    fn each_launch_counts_its_slowest_rank_under_its_mode() {
        let launches = [launch(false, [900.0, 950.0]), launch(true, [700.0, 650.0]), launch(false, [1000.0, 10.0])];
        assert_eq!(times(&launches), [vec![950.0, 1000.0], vec![700.0]]);
    }

    #[test]
    fn compare_puts_pg_beside_torch_per_mode_with_the_target() {
        let first = [launch(false, [800.0, 790.0]), launch(true, [600.0, 610.0])];
        let torch = [
            json!({ "mode": "lazy", "first_collective_ms": 1000.0 }),
            json!({ "mode": "eager", "first_collective_ms": 700.0 }),
        ];
        let compared = compare(&first, &torch);
        assert_eq!(compared["lazy"]["pg_over_torch"], json!(0.8));
        assert_eq!(compared["lazy"]["within_0_8"], json!(true));
        assert_eq!(compared["eager"]["within_0_8"], json!(false), "610 / 700 is above 0.8");
        let no_torch = compare(&first, &[]);
        assert_eq!(no_torch["eager"]["pg_over_torch"], Value::Null);
        assert_eq!(no_torch["eager"]["pg_ms"], json!(610.0));
    }

    #[test]
    fn a_report_without_both_modes_fails() {
        assert!(!report(&[launch(false, [1.0, 2.0])]).0);
        assert!(report(&[launch(false, [1.0, 2.0]), launch(true, [1.0, 2.0])]).0);
    }
}
