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
use pg_lab::results::first::{FirstCollective, FirstLaunch, FirstRank, FirstSide, TorchFirst};
use serde_json::Value;

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
    let rank = FirstRank {
        eager: Some(eager),
        first_collective_ms: Some(first.as_secs_f64() * 1e3),
        group_creation_ms: Some(created.as_secs_f64() * 1e3),
        task: Some(if eager { "first-eager" } else { "first-lazy" }.to_owned()),
        ..FirstRank::default()
    };
    serde_json::to_value(rank).map_err(e)
}

/// Runs `trials` fresh launches of each mode, alternating; returns one launch (its mode and ranks) per launch.
pub fn launch(
    settings: &Settings,
    nproc: usize,
    launch_task: impl Fn(&Settings, &str, usize) -> Result<Vec<Value>, String>,
) -> Result<Vec<Value>, String> {
    let mut launches = Vec::new();
    for _ in 0..settings.bench_trials {
        for (task, eager) in MODES {
            let ranks = launch_task(settings, task, nproc)?
                .into_iter()
                .map(|rank| serde_json::from_value::<FirstRank>(rank).map_err(|err| format!("{task}: {err}")))
                .collect::<Result<Vec<_>, _>>()?;
            launches.push(serde_json::to_value(FirstLaunch { eager, ranks }).map_err(e)?);
        }
    }
    Ok(launches)
}

/// The launches of the `first` task, typed.
pub fn launches(values: &[Value]) -> Result<Vec<FirstLaunch>, String> {
    values
        .iter()
        .enumerate()
        .map(|(i, v)| serde_json::from_value(v.clone()).map_err(|err| format!("launch {i}: {err}")))
        .collect()
}

/// The slowest rank's time to the first collective of each launch, in ms, per mode (lazy, eager): the largest
/// time among the ranks that have one, minus infinity for a launch where none has.
pub fn times(launches: &[FirstLaunch]) -> [Vec<f64>; 2] {
    let mut out = [Vec::new(), Vec::new()];
    for launch in launches {
        let slowest = launch
            .ranks
            .iter()
            .map(|rank| rank.first_collective_ms.unwrap_or(f64::NAN))
            .fold(f64::NEG_INFINITY, f64::max);
        out[usize::from(launch.eager)].push(slowest);
    }
    out
}

/// The markdown of the launches: medians per mode and every trial.
pub fn report(launches: &[FirstLaunch]) -> (bool, String) {
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
/// PyTorch script's lines (the slowest rank's time of each of its launches).
pub fn compare(first: &[FirstLaunch], torch: &[TorchFirst]) -> FirstCollective {
    let [lazy, eager] = times(first);
    let torch_mode = |mode: &str| -> Vec<f64> {
        torch.iter().filter(|t| t.mode == mode).filter_map(|t| t.first_collective_ms).collect()
    };
    let median = |mut values: Vec<f64>| (!values.is_empty()).then(|| crate::bench::median(&mut values));
    let side = |pg: Vec<f64>, torch: Vec<f64>| {
        let (pg_ms, torch_ms) = (median(pg.clone()), median(torch.clone()));
        let ratio = pg_ms.zip(torch_ms).map(|(p, t)| p / t);
        FirstSide {
            pg_ms: pg_ms.filter(|v| v.is_finite()),
            pg_over_torch: ratio.filter(|v| v.is_finite()),
            pg_trials_ms: pg.into_iter().map(|v| Some(v).filter(|v| v.is_finite())).collect(),
            torch_ms,
            torch_trials_ms: torch,
            within_0_8: ratio.map(|r| r <= 0.8),
        }
    };
    FirstCollective { eager: side(eager, torch_mode("eager")), lazy: side(lazy, torch_mode("lazy")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(eager: bool, ms: [f64; 2]) -> FirstLaunch {
        let rank = |ms: f64| FirstRank { first_collective_ms: Some(ms), ..FirstRank::default() };
        FirstLaunch { eager, ranks: vec![rank(ms[0]), rank(ms[1])] }
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
            TorchFirst { first_collective_ms: Some(1000.0), mode: "lazy".into() },
            TorchFirst { first_collective_ms: Some(700.0), mode: "eager".into() },
        ];
        let compared = compare(&first, &torch);
        assert_eq!(compared.lazy.pg_over_torch, Some(0.8));
        assert_eq!(compared.lazy.within_0_8, Some(true));
        assert_eq!(compared.eager.within_0_8, Some(false), "610 / 700 is above 0.8");
        let no_torch = compare(&first, &[]);
        assert_eq!(no_torch.eager.pg_over_torch, None);
        assert_eq!(no_torch.eager.pg_ms, Some(610.0));
        let written = serde_json::to_value(&no_torch).unwrap();
        assert_eq!(written["eager"]["torch_ms"], Value::Null, "an unmeasured side is written null");
        assert_eq!(written["lazy"]["pg_trials_ms"], serde_json::json!([800.0]));
    }

    #[test]
    fn a_report_without_both_modes_fails() {
        assert!(!report(&[launch(false, [1.0, 2.0])]).0);
        assert!(report(&[launch(false, [1.0, 2.0]), launch(true, [1.0, 2.0])]).0);
    }

    /// What the launcher gives back reads as launches again, a failed rank's result included.
    #[test]
    fn launches_read_back_what_the_launcher_writes() {
        let failed = FirstRank { error: Some("no GPU".into()), rank: Some(1), ..FirstRank::default() };
        let written = FirstLaunch { eager: true, ranks: vec![launch(true, [5.0, 6.0]).ranks[0].clone(), failed] };
        let value = serde_json::to_value(&written).unwrap();
        assert_eq!(value["ranks"][1], serde_json::json!({ "error": "no GPU", "rank": 1 }));
        assert_eq!(launches(&[value]).unwrap(), std::slice::from_ref(&written));
        assert_eq!(times(&[written])[1], [5.0], "the rank with a time is the launch's slowest");
        let none = FirstLaunch { eager: false, ranks: vec![FirstRank::default()] };
        assert_eq!(times(&[none])[0], [f64::NEG_INFINITY], "no rank has a time");
    }
}
