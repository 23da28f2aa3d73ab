//! Merges the ranks' results of a task, prints its tables, writes `<task>.json` and `<task>.md`.

use std::fmt::Write as _;

use std::collections::BTreeMap;

use pg_lab::results::bench::{BenchRank, BenchRankRow, BenchResult, TorchBench};
use pg_lab::results::checks::{InteropRank, InteropResult, Versions};
use pg_lab::results::exchange::ExchangeRank;
use pg_lab::results::experiments::ExperimentsRank;
use pg_lab::results::first::{FirstCollective, FirstResult, TorchFirst};
use pg_lab::results::{AllReduceResult, AllReduceSize, Measure, TaskRanks};
use serde_json::Value;

use crate::Settings;

/// Reports `task` from its ranks' results; returns whether every check passed.
pub fn task(settings: &Settings, task: &str, ranks: &[Value]) -> Result<bool, String> {
    if task == "conformance" {
        // The suite's own JSON schema: {"backend", "world_size", "cases": [{"name", "result", "detail"}]}.
        let (ok, markdown, mut merged) = crate::conformance::merge(ranks)?;
        print!("{markdown}");
        // The machine line: date, GPU, driver, how many ranks on how many GPUs, commit, libnccl.
        let label = std::env::var("PG_RUN_LABEL").unwrap_or_default();
        let markdown = format!("# Conformance on NCCL, {} rank(s)\n\n{label}\n{markdown}", ranks.len());
        merged.machine = Some(label);
        return write(settings, task, &merged, &markdown).map(|()| ok);
    }
    if task == "interop" {
        let typed = ranks
            .iter()
            .enumerate()
            .map(|(rank, r)| serde_json::from_value(r.clone()).map_err(|e| format!("interop rank {rank}: {e}")))
            .collect::<Result<Vec<InteropRank>, String>>()?;
        let (ok, markdown, checks) = crate::interop::merge(&typed);
        print!("{markdown}");
        let label = std::env::var("PG_RUN_LABEL").unwrap_or_default();
        let command = format!("pg-nccl-gpu run --tasks interop --nproc {}", ranks.len());
        let versions = typed.first().and_then(|r| r.versions.clone());
        let markdown = format!(
            "# Interop on NCCL, {} rank(s)\n\n{label}\n\n`{command}`; {}\n{markdown}",
            ranks.len(),
            serde_json::to_string(&versions).map_err(|e| e.to_string())?
        );
        let merged = InteropResult {
            backend: "nccl".to_owned(),
            checks,
            command,
            label,
            passed: ok,
            task: task.to_owned(),
            versions,
            world_size: ranks.len() as u64,
            ..InteropResult::default()
        };
        return write(settings, task, &merged, &markdown).map(|()| ok);
    }
    if task == "first" {
        // One value per launch (a fresh set of rank processes), each with its ranks' results.
        let launches = crate::first::launches(ranks)?;
        let (ok, markdown) = crate::first::report(&launches);
        print!("{markdown}");
        let first_ranks = launches.first().map(|l| l.ranks.as_slice()).unwrap_or_default();
        let merged = FirstResult {
            passed: ok,
            task: task.to_owned(),
            versions: first_ranks.first().and_then(|r| r.versions.clone()),
            world_size: first_ranks.len() as u64,
            launches,
        };
        return write(settings, task, &merged, &markdown).map(|()| ok);
    }
    let versions: Option<Versions> = match ranks.first().map(|r| &r["versions"]) {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::from_value(v.clone()).map_err(|e| format!("rank 0's versions: {e}"))?),
    };
    match task {
        "experiments" => {
            let typed: Vec<ExperimentsRank> = typed_ranks(task, ranks)?;
            let (ok, markdown) = experiments(&typed);
            finish(settings, task, ok, typed, versions, &markdown)
        }
        "bench" => {
            let typed: Vec<BenchRank> = typed_ranks(task, ranks)?;
            let (ok, markdown) = bench(&typed)?;
            finish(settings, task, ok, typed, versions, &markdown)
        }
        other if crate::report_exchange::op_of(other).is_some() => {
            let (ok, markdown) = crate::report_exchange::task(other, ranks);
            let typed: Vec<ExchangeRank> = typed_ranks(task, ranks)?;
            finish(settings, task, ok, typed, versions, &markdown)
        }
        other => Err(format!("no report for task {other}")),
    }
}

/// Every rank's result of `task` as an `R`.
fn typed_ranks<R: serde::de::DeserializeOwned>(task: &str, ranks: &[Value]) -> Result<Vec<R>, String> {
    ranks
        .iter()
        .enumerate()
        .map(|(rank, r)| serde_json::from_value(r.clone()).map_err(|e| format!("{task} rank {rank}: {e}")))
        .collect()
}

/// Prints the task's markdown and writes it with the merged result (every rank's own result); returns `passed`.
fn finish<R: serde::Serialize>(
    settings: &Settings,
    task: &str,
    passed: bool,
    ranks: Vec<R>,
    versions: Option<Versions>,
    markdown: &str,
) -> Result<bool, String> {
    print!("{markdown}");
    let world_size = ranks.len() as u64;
    let merged = TaskRanks { passed, ranks, task: task.to_owned(), versions, world_size };
    write(settings, task, &merged, markdown).map(|()| passed)
}

/// Writes `<task>.json` and `<task>.md` into the output directory.
fn write(settings: &Settings, task: &str, merged: &impl serde::Serialize, markdown: &str) -> Result<(), String> {
    write_pair(&settings.out, task, merged, markdown)
}

/// Writes `dir/<stem>.json` (pretty, with a final newline) and `dir/<stem>.md`.
pub fn write_pair(
    dir: &std::path::Path,
    stem: &str,
    merged: &impl serde::Serialize,
    markdown: &str,
) -> Result<(), String> {
    let json_path = dir.join(format!("{stem}.json"));
    std::fs::write(&json_path, serde_json::to_string_pretty(merged).map_err(|e| e.to_string())? + "\n")
        .map_err(|e| format!("{}: {e}", json_path.display()))?;
    let md_path = dir.join(format!("{stem}.md"));
    std::fs::write(&md_path, markdown).map_err(|e| format!("{}: {e}", md_path.display()))
}

/// The experiments' tables over the ranks, and whether every check of each held.
fn experiments(ranks: &[ExperimentsRank]) -> (bool, String) {
    let world = ranks.len() as u64;
    let sum = |f: &dyn Fn(&ExperimentsRank) -> u64| ranks.iter().map(f).sum::<u64>();
    let creations = sum(&|r| r.cache.comm_creations);
    let correct = sum(&|r| r.cache.correct_ops);
    let after_first = sum(&|r| r.cache.creations_after_first_op);
    let mut ok = creations == 3 * world && correct == 9 * world && after_first == 0;
    let mut md = String::new();
    let _ = writeln!(md, "\n### Experiment 1: communicator cache (3 groups of identical membership x {world} ranks)\n");
    let _ = writeln!(md, "| communicator creations | correct rank ops | creations after the first op per group |");
    let _ = writeln!(md, "|---|---|---|");
    let _ = writeln!(
        md,
        "| {creations} (expect {}) | {correct} (expect {}) | {after_first} (expect 0) |",
        3 * world,
        9 * world
    );

    let sleep_ms = ranks.first().and_then(|r| r.semantics.sleep_ms_nominal).unwrap_or(f64::NAN);
    let _ = writeln!(
        md,
        "\n### Experiment 2: completion semantics (80M-cycle sleep = {sleep_ms:.1} ms nominal, 16 MiB all_reduce)\n"
    );
    let _ = writeln!(md, "| config | host time of the action (per rank) | completed after action | Future.done() after enqueue | correct |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    let expected_completed = [0, 0, 1, 0];
    let rows = ranks.first().map(|r| r.semantics.rows.as_slice()).unwrap_or_default();
    for (index, row) in rows.iter().enumerate() {
        let mut times = Vec::new();
        let mut completed = Vec::new();
        let mut done = true;
        let mut right = true;
        for rank in ranks {
            let this = rank.semantics.rows.get(index).cloned().unwrap_or_default();
            let us = this.host_action_us.unwrap_or(f64::NAN);
            times.push(if us >= 1000.0 { format!("{:.1} ms", us / 1e3) } else { format!("{us:.1} us") });
            // A rank without this row counts as a wrong completion.
            let c = rank.semantics.rows.get(index).map_or(9, |r| r.completed_after_action);
            completed.push(c.to_string());
            ok &= c == expected_completed.get(index).copied().unwrap_or(9);
            done &= this.future_done_after_enqueue;
            right &= this.correct;
        }
        ok &= done && right;
        let _ =
            writeln!(md, "| {} | {} | {} | {} | {} |", row.config, times.join(", "), completed.join(", "), done, right);
    }

    let _ = writeln!(md, "\n### Experiment 3: streams\n");
    let _ = writeln!(md, "| rank | current stream | comm stream | comm kernel streams | on another stream |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (rank, value) in ranks.iter().enumerate() {
        let s = &value.streams;
        let other = s.comm_kernels_on_other_stream;
        ok &= other;
        let streams = s.comm_kernel_streams.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
        let _ = writeln!(md, "| {rank} | {} | {} | [{streams}] | {other} |", s.current_stream, s.comm_stream);
    }
    (ok, md)
}

/// The per-rank table of the `bench` task: every contestant at every size over the ranks.
fn bench(ranks: &[BenchRank]) -> Result<(bool, String), String> {
    let mut md = String::new();
    let world = ranks.len();
    let _ = writeln!(
        md,
        "\n### all_reduce, {world} ranks, f32 in place (time: slowest rank's median; host: slowest rank's median)\n"
    );
    let _ = writeln!(md, "| size | contestant | time/op us | GPU ahead | busbw GB/s | host enqueue us/op | wait() us | inside ncclAllReduce us | own host us | host kops/s |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
    let rows = ranks.first().map(|r| r.rows.as_slice()).unwrap_or_default();
    for (index, row) in rows.iter().enumerate() {
        let at = |r: &BenchRank| r.rows.get(index).cloned().unwrap_or_default();
        let max = |get: fn(&BenchRankRow) -> Option<f64>| {
            ranks.iter().map(|r| get(&at(r)).unwrap_or(f64::NAN)).fold(f64::NAN, f64::max)
        };
        let bytes = row.bytes;
        let time = slowest_device_time(ranks.iter().map(|r| at(r).time_us));
        let busbw = bytes as f64 / (time * 1e-6) / 1e9 * 2.0 * (world as f64 - 1.0) / world as f64;
        let optional = |get: fn(&BenchRankRow) -> Option<f64>| match get(row) {
            None => "-".to_owned(),
            Some(_) => format!("{:.2}", max(get)),
        };
        let trials_ahead: Vec<String> = ranks
            .iter()
            .map(|r| {
                let trials = at(r).gpu_ahead_trials;
                format!("{}/{}", trials.iter().filter(|ahead| **ahead).count(), trials.len())
            })
            .collect();
        let slowest_rate = ranks.iter().filter_map(|r| at(r).host_ops_per_s).reduce(f64::min);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {busbw:.1} | {:.2} | {} | {} | {} | {} |",
            human(bytes),
            row.contestant,
            device_cell(time),
            trials_ahead.join(", "),
            max(|r| r.host_enqueue_us),
            optional(|r| r.wait_us),
            optional(|r| r.nccl_call_us),
            optional(|r| r.own_host_us),
            slowest_rate.map(|v| format!("{:.1}", v / 1e3)).unwrap_or_else(|| "-".into()),
        );
    }
    for (rank, value) in ranks.iter().enumerate() {
        let costs = serde_json::to_string(&value.host_costs_us).map_err(|e| e.to_string())?;
        let _ = writeln!(md, "\nrank {rank} host cost of primitives (median us): {costs}");
    }
    // With PG_TIME_ENQUEUE=1: where each process-group contestant's enqueue time goes, step by step.
    for (rank, value) in ranks.iter().enumerate() {
        for row in &value.rows {
            let Some(steps) = &row.steps_us else { continue };
            let steps = serde_json::to_string(steps).map_err(|e| e.to_string())?;
            let _ = writeln!(md, "\nrank {rank} {} {} steps (median us): {steps}", human(row.bytes), row.contestant);
        }
    }
    Ok((!rows.is_empty(), md))
}

pub fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// One contestant at one size, over the ranks: the slowest rank's time and host medians.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub contestant: String,
    pub bytes: u64,
    pub time_us: f64,
    pub busbw_gbps: f64,
    pub enqueue_us: f64,
    pub wait_us: Option<f64>,
    /// Whether the GPU was ahead of the host in every trial on every rank (`None`: results that predate the check).
    pub gpu_ahead: Option<bool>,
    /// Back-to-back ops per second of host time, the slowest rank's.
    pub host_ops_per_s: Option<f64>,
}

/// The slowest rank's device time: NaN when any rank has none (no trial of it had the GPU ahead of the host, so
/// its events timed the host), else the largest.
fn slowest_device_time(values: impl IntoIterator<Item = Option<f64>>) -> f64 {
    values.into_iter().try_fold(f64::NEG_INFINITY, |max, value| value.map(|v| max.max(v))).unwrap_or(f64::NAN)
}

/// A device time for a table: `host-bound` when there is none.
fn device_cell(time_us: f64) -> String {
    match time_us.is_finite() {
        true => format!("{time_us:.2}"),
        false => "host-bound".to_owned(),
    }
}

/// The Rust contestants' rows over the ranks of `bench.json`: the slowest rank's figures per row.
fn rust_rows(bench: &BenchResult) -> Vec<BenchRow> {
    let ranks: Vec<&[BenchRankRow]> = bench.ranks.iter().map(|r| r.rows.as_slice()).collect();
    let world = ranks.len().max(1) as f64;
    let first = ranks.first().copied().unwrap_or_default();
    first
        .iter()
        .enumerate()
        .map(|(index, row)| {
            let at = |r: &&[BenchRankRow]| r.get(index).cloned().unwrap_or_default();
            let max = |get: &dyn Fn(&BenchRankRow) -> Option<f64>| {
                ranks.iter().map(|r| get(&at(r)).unwrap_or(f64::NAN)).fold(f64::NAN, f64::max)
            };
            let bytes = row.bytes;
            let time_us = slowest_device_time(ranks.iter().map(|r| at(r).time_us));
            let ahead: Vec<Option<bool>> = ranks.iter().map(|r| at(r).gpu_ahead).collect();
            let rates: Vec<Option<f64>> = ranks.iter().map(|r| at(r).host_ops_per_s).collect();
            BenchRow {
                contestant: row.contestant.clone(),
                bytes,
                time_us,
                busbw_gbps: bytes as f64 / (time_us * 1e-6) / 1e9 * 2.0 * (world - 1.0) / world,
                enqueue_us: max(&|r| r.host_enqueue_us),
                wait_us: row.wait_us.map(|_| max(&|r| r.wait_us)),
                gpu_ahead: ahead.into_iter().collect::<Option<Vec<bool>>>().map(|all| all.into_iter().all(|a| a)),
                host_ops_per_s: rates
                    .into_iter()
                    .collect::<Option<Vec<f64>>>()
                    .and_then(|all| all.into_iter().reduce(f64::min)),
            }
        })
        .collect()
}

/// The host enqueue time of `contestant` minus that of `baseline` on the same rank, at `bytes`: the worst rank's
/// difference (a paired comparison, unlike the slowest-rank medians, which may come from different ranks).
fn same_rank_difference(bench: &BenchResult, contestant: &str, baseline: &str, bytes: u64) -> Option<f64> {
    let enqueue = |rank: &BenchRank, who: &str| {
        rank.rows.iter().find(|row| row.contestant == who && row.bytes == bytes)?.host_enqueue_us
    };
    bench
        .ranks
        .iter()
        .map(|rank| Some(enqueue(rank, contestant)? - enqueue(rank, baseline)?))
        .collect::<Option<Vec<f64>>>()
        .and_then(|diffs| diffs.into_iter().reduce(f64::max))
}

/// PyTorch's rows, eager and (`torch.cuda.graph` around K all_reduces, replayed) graph.
fn torch_rows(torch: &TorchBench) -> Vec<BenchRow> {
    let eager = torch.rows.iter().flatten().map(|row| ("torch", row));
    let graph = torch.graph_rows.iter().flatten().map(|row| ("torch-graph", row));
    eager
        .chain(graph)
        .map(|(contestant, row)| BenchRow {
            contestant: contestant.into(),
            bytes: row.bytes,
            time_us: row.time_us.unwrap_or(f64::NAN),
            busbw_gbps: row.busbw_gbps.unwrap_or(f64::NAN),
            enqueue_us: row.host_enqueue_us.unwrap_or(f64::NAN),
            wait_us: row.wait_us,
            gpu_ahead: row.gpu_ahead,
            host_ops_per_s: row.host_ops_per_s,
        })
        .collect()
}

/// Joins `bench.json` (raw, pg) and `torch.json` (if present) in `dir` into `allreduce.md`/`allreduce.json`.
pub fn merge_bench(dir: &std::path::Path, label: &str) -> Result<bool, String> {
    let bench: BenchResult = match std::fs::read_to_string(dir.join("bench.json")) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| format!("bench.json: {e}"))?,
        Err(_) => return Err("no bench.json: run the bench task first".into()),
    };
    let torch: Option<TorchBench> = match std::fs::read_to_string(dir.join("torch.json")) {
        Ok(text) => Some(serde_json::from_str(&text).map_err(|e| format!("torch.json: {e}"))?),
        Err(_) => None,
    };
    let mut rows = rust_rows(&bench);
    if let Some(torch) = &torch {
        rows.extend(torch_rows(torch));
    }
    let mut sizes: Vec<u64> = rows.iter().map(|r| r.bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let find = |c: &str, b: u64| rows.iter().find(|r| r.contestant == c && r.bytes == b);
    let mut md = String::new();
    let _ = writeln!(md, "# all_reduce: raw NCCL loop vs pg's process group vs PyTorch\n");
    let _ = writeln!(md, "{label}\n");
    let _ = writeln!(md, "Rust: {}", serde_json::to_string(&bench.versions).map_err(|e| e.to_string())?);
    if let Some(torch) = &torch {
        let _ = writeln!(md, "\nPyTorch: {}", torch.versions);
    }
    let _ = writeln!(md, "\nf32, in place, {} ranks; time/op from CUDA events over K back-to-back ops after a spin (median of the trials in which the GPU was still spinning when the host had enqueued every op, slowest rank; `host-bound` when no trial was); host times are medians over every op (slowest rank); pg and torch use the synchronous form (enqueue, then wait()). GPU ahead: every trial of raw, pg, torch had the GPU ahead of the host. Host ops/s: K ops back to back with no spin, in thousands per second of host time (slowest rank). pg bookkeeping: pg's enqueue minus `raw-with-events`', rank by rank (the worst rank).\n", bench.world_size);
    let _ = writeln!(md, "| size | raw us | pg us | torch us | GPU ahead | raw busbw | pg busbw | torch busbw | pg/raw busbw | raw enqueue us | pg enqueue us | pg wait us | pg enqueue us (pool stream current) | torch enqueue us | torch wait us | pg bookkeeping us | raw kops/s | pg kops/s | torch kops/s |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut busbw_ok = true;
    let mut summary = Vec::new();
    let f = |row: Option<&BenchRow>, get: &dyn Fn(&BenchRow) -> Option<f64>| {
        row.and_then(get).map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
    };
    let kilo = |row: Option<&BenchRow>| {
        row.and_then(|r| r.host_ops_per_s).map(|v| format!("{:.1}", v / 1e3)).unwrap_or_else(|| "-".into())
    };
    let device = |row: Option<&BenchRow>| row.map(|r| device_cell(r.time_us)).unwrap_or_else(|| "-".into());
    let rust_names: Vec<String> = {
        let mut names: Vec<String> = Vec::new();
        for row in rows.iter().filter(|r| !r.contestant.starts_with("torch")) {
            if !names.contains(&row.contestant) {
                names.push(row.contestant.clone());
            }
        }
        names
    };
    for &bytes in &sizes {
        let (raw, pg, torch) = (find("raw", bytes), find("pg", bytes), find("torch", bytes));
        let pg_pool = find("pg-current-pool-stream", bytes);
        let ratio = match (raw, pg) {
            (Some(r), Some(p)) => Some(p.busbw_gbps / r.busbw_gbps),
            _ => None,
        };
        if bytes >= 64 << 20 {
            busbw_ok &= ratio.is_some_and(|r| r >= 0.98);
        }
        let overhead = match (raw, pg) {
            (Some(r), Some(p)) => Some(p.enqueue_us - r.enqueue_us),
            _ => None,
        };
        let ahead = |row: Option<&BenchRow>| match row.and_then(|r| r.gpu_ahead) {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        };
        let bookkeeping = same_rank_difference(&bench, "pg", "raw-with-events", bytes);
        let by_contestant = |get: &dyn Fn(&BenchRow) -> Option<f64>| -> BTreeMap<String, Option<f64>> {
            rust_names
                .iter()
                .filter_map(|name| find(name, bytes).map(|row| (name.clone(), get(row))))
                .chain(torch.map(|row| ("torch".to_owned(), get(row))))
                .collect()
        };
        let same_rank = |contestant: &str, baseline: &str| same_rank_difference(&bench, contestant, baseline, bytes);
        let of = |contestant: &str| find(contestant, bytes).map(measure);
        summary.push(AllReduceSize {
            bytes,
            device_time_us: by_contestant(&|r| Some(r.time_us).filter(|t| t.is_finite())),
            gpu_ahead: rust_names
                .iter()
                .filter_map(|name| find(name, bytes).map(|row| (name.clone(), row.gpu_ahead)))
                .chain(torch.map(|row| ("torch".to_owned(), row.gpu_ahead)))
                .collect(),
            host_ops_per_s: by_contestant(&|r| r.host_ops_per_s),
            pg: pg.map(measure),
            pg_current_pool_stream: pg_pool.map(measure),
            pg_graph: of("pg-graph"),
            pg_minus_pg_no_watchdog_no_fr_enqueue_us_same_rank: same_rank("pg", "pg-no-watchdog-no-fr"),
            pg_minus_raw_enqueue_us: overhead.filter(|v| v.is_finite()),
            pg_minus_raw_enqueue_us_same_rank: same_rank("pg", "raw"),
            pg_minus_raw_with_events_enqueue_us_same_rank: bookkeeping,
            pg_minus_raw_with_events_pg_stream_enqueue_us_same_rank: same_rank("pg", "raw-with-events-pg-stream"),
            pg_no_watchdog_no_fr: of("pg-no-watchdog-no-fr"),
            pg_one_input_event_minus_pg_enqueue_us_same_rank: same_rank("pg-one-input-event", "pg"),
            pg_over_raw_busbw: ratio.filter(|v| v.is_finite()),
            pg_over_raw_device_time: raw.zip(pg).map(|(r, p)| p.time_us / r.time_us).filter(|v| v.is_finite()),
            pg_traced: of("pg-traced"),
            pg_traced_minus_pg_enqueue_us_same_rank: same_rank("pg-traced", "pg"),
            raw: raw.map(measure),
            raw_graph: of("raw-graph"),
            raw_with_events: of("raw-with-events"),
            raw_with_events_minus_raw_enqueue_us_same_rank: same_rank("raw-with-events", "raw"),
            raw_with_events_minus_raw_with_event_ring_enqueue_us_same_rank: same_rank(
                "raw-with-events",
                "raw-with-event-ring",
            ),
            torch: torch.map(measure),
            torch_graph: of("torch-graph"),
        });
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {}, {}, {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            human(bytes),
            device(raw),
            device(pg),
            device(torch),
            ahead(raw),
            ahead(pg),
            ahead(torch),
            f(raw, &|r| Some(r.busbw_gbps)),
            f(pg, &|r| Some(r.busbw_gbps)),
            f(torch, &|r| Some(r.busbw_gbps)),
            ratio.map(|r| format!("{r:.3}")).unwrap_or_else(|| "-".into()),
            f(raw, &|r| Some(r.enqueue_us)),
            f(pg, &|r| Some(r.enqueue_us)),
            f(pg, &|r| r.wait_us),
            f(pg_pool, &|r| Some(r.enqueue_us)),
            f(torch, &|r| Some(r.enqueue_us)),
            f(torch, &|r| r.wait_us),
            bookkeeping.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into()),
            kilo(raw),
            kilo(pg),
            kilo(torch),
        );
    }
    // Every Rust contestant's device time, for the sizes where pg's device time was above the raw loop's.
    let small: Vec<u64> = sizes.iter().copied().filter(|&b| b <= 1 << 20).collect();
    if !small.is_empty() && rust_names.len() > 2 {
        let _ = writeln!(
            md,
            "\nDevice time per op (us) of every contestant up to 1 MiB (`host-bound`: no trial had the GPU ahead):\n"
        );
        let _ = writeln!(md, "| contestant | {} |", small.iter().map(|&b| human(b)).collect::<Vec<_>>().join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(small.len()));
        for name in rust_names.iter().map(String::as_str).chain(torch.is_some().then_some("torch")) {
            let cells: Vec<String> = small.iter().map(|&b| device(find(name, b))).collect();
            let _ = writeln!(md, "| {name} | {} |", cells.join(" | "));
        }
    }
    let median_of = |get: fn(&AllReduceSize) -> Option<f64>| {
        let mut values: Vec<f64> = summary.iter().filter_map(get).collect();
        pg_lab::results::median(&mut values)
    };
    let overhead = median_of(|s| s.pg_minus_raw_enqueue_us);
    let overhead_same_rank = median_of(|s| s.pg_minus_raw_enqueue_us_same_rank);
    let overhead_ok = overhead <= 2.0;
    let yes = |met: bool| if met { "yes" } else { "NO" };
    // The network profile (ranks sharing a GPU over NCCL's socket transport) has targets of its own: pg's device
    // time per op within 3% of the raw loop's from 64 KiB up, and its host enqueue within 1 us of raw's.
    let profile = bench.ranks.first().and_then(|r| r.profile.clone()).unwrap_or_else(|| "nvlink".to_owned());
    let network = network_targets(&summary, overhead_same_rank);
    let ok = match profile.as_str() {
        "network" => network.device_ok && network.enqueue_ok,
        _ => busbw_ok && overhead_ok,
    };
    if bench.world_size < 2 {
        let _ = writeln!(
            md,
            "\nA world of 1 communicates nothing (NCCL returns at once and launches no kernel), so busbw is 0 and \
             the targets below, set for 2 or more ranks, do not apply; the host times still show each \
             contestant's own cost."
        );
    }
    if profile == "network" {
        let _ = writeln!(
            md,
            "\nNetwork profile: every rank's NCCL traffic goes through the socket transport over loopback (not NVLink), and \
             the ranks' kernels time-slice the GPU, so an op costs milliseconds whatever its size. Targets: pg's device \
             time per op within 3% of raw's from 64 KiB up (worst pg/raw {}): {}; pg's host enqueue within 1 us of raw's, \
             rank by rank (median over sizes of the worst rank's difference, {overhead_same_rank:.2} us): {}.",
            network.worst_ratio.map_or("-".into(), |r| format!("{r:.3}")),
            yes(network.device_ok),
            yes(network.enqueue_ok)
        );
    }
    let _ = writeln!(md, "\npg busbw within 2% of raw at >= 64 MiB: {}.", yes(busbw_ok));
    let _ = writeln!(
        md,
        "pg host enqueue within 2 us of raw: {} (median over sizes of the difference: {overhead:.2} us).",
        yes(overhead_ok)
    );
    let _ = writeln!(
        md,
        "pg host enqueue within 2 us of raw, rank by rank (the worst rank's difference; median over sizes): {} ({overhead_same_rank:.2} us).",
        yes(overhead_same_rank <= 2.0)
    );
    let floor = median_of(|s| s.raw_with_events_minus_raw_enqueue_us_same_rank);
    if floor.is_finite() {
        let _ = writeln!(
            md,
            "\nWhere the difference goes (same-rank differences, worst rank, median over sizes): the driver calls of the input-ready \
             wait and the end event alone (`raw-with-events` - `raw`) {floor:.2} us; pg's own bookkeeping (`pg` - `raw-with-events`) {:.2} us, \
             of which the watchdog and flight recorder (`pg` - `pg-no-watchdog-no-fr`) {:.2} us.",
            median_of(|s| s.pg_minus_raw_with_events_enqueue_us_same_rank),
            median_of(|s| s.pg_minus_pg_no_watchdog_no_fr_enqueue_us_same_rank),
        );
    }
    let tracing = median_of(|s| s.pg_traced_minus_pg_enqueue_us_same_rank);
    if tracing.is_finite() {
        let _ = writeln!(
            md,
            "\nThe op timeline (`PG_TRACE`; contestant `pg-traced`, the default options with tracing on: a timing event \
             recorded before and after each launch, the host times around the call, one queue push) costs \
             `pg-traced` - `pg` = {tracing:.2} us of host enqueue per op (same run, rank by rank, worst rank, median \
             over sizes); with tracing off (`pg`) the enqueue path checks one `Option` and records nothing."
        );
    }
    for (rank, value) in bench.ranks.iter().enumerate() {
        if let Some(error) = &value.graph_error {
            let _ = writeln!(md, "\nRank {rank}: the Rust graph contestants failed: {error}");
        }
    }
    if let Some(error) = torch.as_ref().and_then(|t| t.graph_error.as_deref()) {
        let _ = writeln!(md, "\nThe PyTorch graph contestant failed: {error}");
    }
    // CUDA graphs: K all_reduces captured once, replayed.
    let graph_sizes: Vec<u64> = sizes
        .iter()
        .copied()
        .filter(|&b| ["raw-graph", "pg-graph", "torch-graph"].iter().any(|c| find(c, b).is_some()))
        .collect();
    if !graph_sizes.is_empty() {
        let _ = writeln!(
            md,
            "\nUnder CUDA graph replay (K all_reduces captured once, the graph launched after a spin): device time per \
             op (same GPU-ahead rule), and host cost per replayed op (the graph's launch / K); eager raw and pg beside \
             them.\n"
        );
        let _ = writeln!(md, "| size | raw graph us | pg graph us | torch graph us | raw us | pg us | raw graph host us | pg graph host us | torch graph host us | pg enqueue us |");
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|");
        for &bytes in &graph_sizes {
            let (rg, pgg, tg) = (find("raw-graph", bytes), find("pg-graph", bytes), find("torch-graph", bytes));
            let host =
                |row: Option<&BenchRow>| row.map(|r| format!("{:.3}", r.enqueue_us)).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                human(bytes),
                device(rg),
                device(pgg),
                device(tg),
                device(find("raw", bytes)),
                device(find("pg", bytes)),
                host(rg),
                host(pgg),
                host(tg),
                f(find("pg", bytes), &|r| Some(r.enqueue_us)),
            );
        }
    }
    let bookkeeping = median_of(|s| s.pg_minus_raw_with_events_enqueue_us_same_rank);
    if bookkeeping.is_finite() {
        let _ = writeln!(
            md,
            "\npg's own bookkeeping per op (`pg` - `raw-with-events`, rank by rank, worst rank, median over sizes): \
             {bookkeeping:.2} us (target 0.3 us): {}.",
            yes(bookkeeping <= 0.3)
        );
    }
    let bookkeeping_pg_stream = median_of(|s| s.pg_minus_raw_with_events_pg_stream_enqueue_us_same_rank);
    if bookkeeping_pg_stream.is_finite() {
        let _ = writeln!(
            md,
            "
The same against the same driver calls on pg's own communication stream (`pg` - \
             `raw-with-events-pg-stream`, rank by rank, worst rank, median over sizes): {bookkeeping_pg_stream:.2} us; \
             `raw-with-events-pg-stream` - `raw-with-events` {:.2} us is what the stream alone changes.",
            median_of(|s| {
                match (
                    s.pg_minus_raw_with_events_enqueue_us_same_rank,
                    s.pg_minus_raw_with_events_pg_stream_enqueue_us_same_rank,
                ) {
                    (Some(a), Some(b)) => Some(a - b),
                    _ => None,
                }
            }),
        );
    }
    let ring_saves = median_of(|s| s.pg_one_input_event_minus_pg_enqueue_us_same_rank);
    if ring_saves.is_finite() {
        let _ = writeln!(
            md,
            "\nWhat cycling through input-ready events saves (same-rank differences, the larger of the ranks, median \
             over sizes): in pg (`pg-one-input-event` - `pg`) {ring_saves:.2} us; in the raw loop \
             (`raw-with-events` - `raw-with-event-ring`) {:.2} us.",
            median_of(|s| s.raw_with_events_minus_raw_with_event_ring_enqueue_us_same_rank),
        );
    }
    // Time to the first collective (`first.json` from the `first` task, `torch-first.jsonl` from the PyTorch
    // script's `--first` runs), when measured.
    let first_collective = match std::fs::read_to_string(dir.join("first.json")) {
        Err(_) => None,
        Ok(text) => {
            let first: FirstResult = serde_json::from_str(&text).map_err(|e| format!("first.json: {e}"))?;
            let torch: Vec<TorchFirst> = std::fs::read_to_string(dir.join("torch-first.jsonl"))
                .unwrap_or_default()
                .lines()
                .filter_map(|line| serde_json::from_str(line).ok())
                .collect();
            Some(crate::first::compare(&first.launches, &torch))
        }
    };
    if let Some(first) = &first_collective {
        let _ = write!(md, "{}", first_collective_table(first));
    }
    std::fs::write(dir.join("allreduce.md"), &md).map_err(|e| e.to_string())?;
    let finite = |v: f64| Some(v).filter(|v| v.is_finite());
    let merged = AllReduceResult {
        busbw_within_2_percent_at_64mib_and_above: busbw_ok,
        command: None,
        commit: None,
        device_time_within_3_percent_from_64kib: Some(network.device_ok),
        first_collective,
        host_overhead_within_1_us_same_rank: Some(network.enqueue_ok),
        host_overhead_within_2_us: overhead_ok,
        host_overhead_within_2_us_same_rank: Some(overhead_same_rank <= 2.0),
        label: label.to_owned(),
        machine: None,
        pg_bookkeeping_us_same_rank_median: finite(bookkeeping),
        pg_bookkeeping_within_0_3_us: Some(bookkeeping <= 0.3),
        pg_bookkeeping_pg_stream_us_same_rank_median: finite(bookkeeping_pg_stream),
        pg_minus_raw_enqueue_us_median: finite(overhead),
        pg_minus_raw_enqueue_us_same_rank_median: finite(overhead_same_rank),
        pg_over_raw_device_time_worst_from_64kib: network.worst_ratio,
        profile: Some(profile),
        rust_versions: bench.versions.clone(),
        sizes: summary,
        targets_met: ok,
        torch_versions: torch.map(|t| t.versions),
        world_size: bench.world_size,
    };
    std::fs::write(dir.join("allreduce.json"), serde_json::to_string_pretty(&merged).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    print!("{md}");
    Ok(ok)
}

/// The network profile's targets over the merged sizes.
struct NetworkTargets {
    /// The largest pg/raw device time from 64 KiB up (`None`: no size there had both).
    worst_ratio: Option<f64>,
    /// Every size from 64 KiB up had both device times, pg's within 3% of raw's.
    device_ok: bool,
    /// The median over sizes of the same-rank enqueue difference is at most 1 us.
    enqueue_ok: bool,
}

fn network_targets(summary: &[AllReduceSize], enqueue_same_rank_median_us: f64) -> NetworkTargets {
    let from = summary.iter().filter(|s| s.bytes >= crate::profile::NETWORK_TARGET_FROM_BYTES);
    let ratios: Vec<Option<f64>> = from.map(|s| s.pg_over_raw_device_time).collect();
    let worst_ratio = ratios.iter().flatten().copied().reduce(f64::max);
    let device_ok = !ratios.is_empty() && ratios.iter().all(|r| r.is_some_and(|r| r <= 1.03));
    NetworkTargets { worst_ratio, device_ok, enqueue_ok: enqueue_same_rank_median_us <= 1.0 }
}

/// The table of the time to the first all_reduce, pg beside PyTorch per mode.
fn first_collective_table(first: &FirstCollective) -> String {
    let ms = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into());
    let mut md = String::new();
    let _ = writeln!(
        md,
        "\nTime to the first all_reduce, from before the group's creation to the op's completion on the device \
         (fresh processes, slowest rank, median of the trials; target pg <= 0.8x PyTorch):\n"
    );
    let _ = writeln!(md, "| init | pg ms | PyTorch ms | pg / PyTorch | within 0.8x |");
    let _ = writeln!(md, "|---|---|---|---|---|");
    for (side, name) in
        [(&first.lazy, "lazy (no device_id)"), (&first.eager, "eager (pg eager_init; PyTorch device_id=)")]
    {
        let _ = writeln!(
            md,
            "| {name} | {} | {} | {} | {} |",
            ms(side.pg_ms),
            ms(side.torch_ms),
            side.pg_over_torch.map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into()),
            match side.within_0_8 {
                Some(true) => "yes",
                Some(false) => "NO",
                None => "-",
            }
        );
    }
    md
}

/// A contestant's figures as the merged result writes them (a figure that is not a number is `null`).
fn measure(row: &BenchRow) -> Measure {
    let finite = |v: f64| Some(v).filter(|v| v.is_finite());
    Measure {
        algbw_gbps: None,
        busbw_gbps: finite(row.busbw_gbps),
        host_enqueue_us: finite(row.enqueue_us),
        time_us: finite(row.time_us),
        wait_us: row.wait_us.filter(|v| v.is_finite()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn rank(rows: Value) -> Value {
        json!({ "rows": rows, "versions": { "nccl": "2.28.9" } })
    }

    #[test]
    fn same_rank_differences_pair_each_rank_with_itself_and_keep_the_worst() {
        let enqueue = |c: &str, us: f64| json!({ "contestant": c, "bytes": 8, "host_enqueue_us": us });
        // Slowest-rank medians would give 13.0 - 12.0 = 1.0; rank by rank the differences are 3.0 and 1.0.
        let bench: BenchResult = serde_json::from_value(json!({ "world_size": 2, "ranks": [
            rank(json!([enqueue("raw", 9.0), enqueue("pg", 12.0)])),
            rank(json!([enqueue("raw", 12.0), enqueue("pg", 13.0)])),
        ] }))
        .unwrap();
        assert_eq!(same_rank_difference(&bench, "pg", "raw", 8), Some(3.0));
        assert_eq!(same_rank_difference(&bench, "pg", "raw", 64), None, "no such size");
        assert_eq!(same_rank_difference(&bench, "pg", "raw-with-events", 8), None, "a contestant missing");
    }

    #[test]
    fn merge_joins_contestants_and_checks_the_targets() {
        let dir = std::env::temp_dir().join(format!("pg-merge-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |c: &str, bytes: u64, time: f64, enqueue: f64| {
            json!({ "contestant": c, "bytes": bytes, "time_us": time, "host_enqueue_us": enqueue,
                    "wait_us": if c == "raw" { Value::Null } else { json!(0.8) } })
        };
        let rows = json!([
            row("raw", 8, 6.5, 9.5),
            row("pg", 8, 7.7, 11.0),
            row("raw", 64 << 20, 250.0, 11.0),
            row("pg", 64 << 20, 251.0, 12.5),
        ]);
        let bench = json!({ "world_size": 2, "versions": {}, "ranks": [rank(rows.clone()), rank(rows)] });
        std::fs::write(dir.join("bench.json"), bench.to_string()).unwrap();
        assert!(merge_bench(&dir, "test").unwrap(), "busbw within 2% and overhead 1.5 us meet the targets");
        let merged: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("allreduce.json")).unwrap()).unwrap();
        assert_eq!(merged["sizes"].as_array().unwrap().len(), 2);
        assert_eq!(merged["pg_minus_raw_enqueue_us_median"], json!(1.5));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_rank_without_a_device_time_makes_the_row_host_bound() {
        assert_eq!(slowest_device_time([Some(6.5), Some(7.0)]), 7.0);
        assert!(slowest_device_time([Some(6.5), None]).is_nan(), "one rank timed its host");
        assert_eq!(device_cell(f64::NAN), "host-bound");
        assert_eq!(device_cell(6.456), "6.46");
    }

    #[test]
    fn merge_reports_gpu_ahead_throughput_and_bookkeeping() {
        let dir = std::env::temp_dir().join(format!("pg-merge-ahead-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |c: &str, time: Option<f64>, enqueue: f64, ahead: bool| {
            json!({ "contestant": c, "bytes": 1024, "time_us": time, "host_enqueue_us": enqueue, "wait_us": null,
                    "gpu_ahead": ahead, "host_ops_per_s": 100_000.0 })
        };
        let rank0 = json!([
            row("raw", Some(6.5), 6.0, true),
            row("raw-with-events", Some(6.6), 7.0, true),
            row("pg", None, 7.25, false),
        ]);
        let rank1 = json!([
            row("raw", Some(6.4), 6.0, true),
            row("raw-with-events", Some(6.6), 7.0, true),
            row("pg", Some(7.9), 7.5, true),
        ]);
        let bench = json!({ "world_size": 2, "versions": {}, "ranks": [rank(rank0), rank(rank1)] });
        std::fs::write(dir.join("bench.json"), bench.to_string()).unwrap();
        merge_bench(&dir, "test").unwrap();
        let md = std::fs::read_to_string(dir.join("allreduce.md")).unwrap();
        let merged: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("allreduce.json")).unwrap()).unwrap();
        let size = &merged["sizes"][0];
        assert_eq!(size["device_time_us"]["pg"], Value::Null, "rank 0 timed its host: no device time");
        assert_eq!(size["device_time_us"]["raw"], json!(6.5));
        assert_eq!(size["gpu_ahead"]["pg"], json!(false));
        assert_eq!(size["host_ops_per_s"]["raw"], json!(100_000.0));
        assert_eq!(size["pg_minus_raw_with_events_enqueue_us_same_rank"], json!(0.5));
        assert_eq!(merged["pg_bookkeeping_within_0_3_us"], json!(false));
        assert!(md.contains("| 1 KiB | 6.50 | host-bound | - | yes, NO, - |"), "{md}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn merge_puts_the_graph_contestants_beside_eager_ones() {
        let dir = std::env::temp_dir().join(format!("pg-merge-graph-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |c: &str, time: f64, enqueue: f64| {
            json!({ "contestant": c, "bytes": 8, "time_us": time, "host_enqueue_us": enqueue, "wait_us": null,
                    "gpu_ahead": true, "host_ops_per_s": 1e5 })
        };
        let rows =
            json!([row("raw", 6.4, 6.0), row("pg", 7.0, 8.0), row("raw-graph", 5.1, 0.05), row("pg-graph", 5.2, 0.06)]);
        let bench = json!({ "world_size": 2, "versions": {}, "ranks": [rank(rows.clone()), rank(rows)] });
        std::fs::write(dir.join("bench.json"), bench.to_string()).unwrap();
        let torch =
            json!({ "versions": {}, "rows": [row("torch", 6.5, 25.0)], "graph_rows": [row("torch-graph", 5.3, 0.07)] });
        std::fs::write(dir.join("torch.json"), torch.to_string()).unwrap();
        merge_bench(&dir, "test").unwrap();
        let md = std::fs::read_to_string(dir.join("allreduce.md")).unwrap();
        assert!(md.contains("| 8 B | 5.10 | 5.20 | 5.30 | 6.40 | 7.00 | 0.050 | 0.060 | 0.070 | 8.00 |"), "{md}");
        let merged: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("allreduce.json")).unwrap()).unwrap();
        assert_eq!(merged["sizes"][0]["pg_graph"]["time_us"], json!(5.2));
        assert_eq!(merged["sizes"][0]["torch_graph"]["host_enqueue_us"], json!(0.07));
        assert_eq!(merged["sizes"][0]["torch"]["host_enqueue_us"], json!(25.0), "the eager torch row stays torch's");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_network_profile_checks_device_time_from_64_kib_and_enqueue_within_1_us() {
        let dir = std::env::temp_dir().join(format!("pg-merge-network-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let row = |c: &str, bytes: u64, time: f64, enqueue: f64| json!({ "contestant": c, "bytes": bytes, "time_us": time, "host_enqueue_us": enqueue, "wait_us": null });
        // At 8 B pg is 10% slower (below 64 KiB: no target); from 64 KiB up within 3%.
        let rows = |pg_16mib: f64| {
            json!([
                row("raw", 8, 4490.0, 9.0),
                row("pg", 8, 4939.0, 9.8),
                row("raw", 64 << 10, 4490.0, 9.0),
                row("pg", 64 << 10, 4500.0, 9.7),
                row("raw", 16 << 20, 20_000.0, 9.0),
                row("pg", 16 << 20, pg_16mib, 9.9),
            ])
        };
        let bench = |pg_16mib: f64| {
            let rank = json!({ "profile": "network", "rows": rows(pg_16mib), "versions": {} });
            json!({ "world_size": 2, "versions": {}, "ranks": [rank.clone(), rank] })
        };
        std::fs::write(dir.join("bench.json"), bench(20_400.0).to_string()).unwrap();
        assert!(merge_bench(&dir, "2 ranks on 1 GPU, network transport").unwrap());
        let merged: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("allreduce.json")).unwrap()).unwrap();
        assert_eq!(merged["profile"], json!("network"));
        assert_eq!(merged["device_time_within_3_percent_from_64kib"], json!(true));
        assert_eq!(merged["host_overhead_within_1_us_same_rank"], json!(true));
        assert_eq!(merged["pg_over_raw_device_time_worst_from_64kib"], json!(1.02));
        let md = std::fs::read_to_string(dir.join("allreduce.md")).unwrap();
        assert!(md.contains("not NVLink"), "{md}");

        std::fs::write(dir.join("bench.json"), bench(21_000.0).to_string()).unwrap();
        assert!(!merge_bench(&dir, "test").unwrap(), "5% slower at 16 MiB misses the target");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The first-collective table of every committed all_reduce result that has one, rendered from its JSON
    /// alone, is in the committed .md.
    #[test]
    fn the_committed_first_collective_tables_render_from_the_committed_json() {
        let mut seen = 0;
        for pg_lab::results::Committed { name, json, md } in pg_lab::results::committed("allreduce-") {
            let result: AllReduceResult = serde_json::from_str(&json).expect("an all_reduce result");
            let Some(first) = &result.first_collective else { continue };
            let table = first_collective_table(first);
            assert!(md.contains(&table), "{name}: the rendered table\n{table}\nis not in its .md");
            seen += 1;
        }
        assert!(seen > 0, "no committed all_reduce result with a first-collective time");
    }

    /// The experiments pass when every rank's cache, semantics and streams checks hold; one rank whose comm
    /// kernel ran on the current stream, or a missing semantics row, fails them, and the tables show the ranks.
    #[test]
    fn the_experiments_report_checks_every_rank() {
        use pg_lab::results::experiments::{CacheExperiment, SemanticsRow, StreamsExperiment};
        let rank = |on_other: bool, rows: usize| {
            let row = |c: u64| SemanticsRow {
                completed_after_action: c,
                config: format!("config {c}"),
                correct: true,
                future_done_after_enqueue: true,
                host_action_us: Some(1500.0),
            };
            let value = serde_json::to_value(ExperimentsRank {
                cache: CacheExperiment { comm_creations: 3, correct_ops: 9, ..CacheExperiment::default() },
                semantics: pg_lab::results::experiments::SemanticsExperiment {
                    rows: [0, 0, 1, 0].into_iter().take(rows).map(row).collect(),
                    sleep_ms_nominal: Some(40.4),
                    ..Default::default()
                },
                streams: StreamsExperiment {
                    comm_kernel_streams: vec![7, 7],
                    comm_kernels_on_other_stream: on_other,
                    comm_stream: 7,
                    current_stream: 0,
                },
                ..ExperimentsRank::default()
            })
            .unwrap();
            serde_json::from_value::<ExperimentsRank>(value).unwrap()
        };
        let (ok, md) = experiments(&[rank(true, 4), rank(true, 4)]);
        assert!(ok, "{md}");
        assert!(md.contains("| 6 (expect 6) | 18 (expect 18) | 0 (expect 0) |"), "{md}");
        assert!(md.contains("| config 1 | 1.5 ms, 1.5 ms | 1, 1 | true | true |"), "{md}");
        assert!(md.contains("| 1 | 0 | 7 | [7,7] | true |"), "{md}");
        assert!(!experiments(&[rank(true, 4), rank(false, 4)]).0, "rank 1's comm kernels ran on the current stream");
        assert!(!experiments(&[rank(true, 4), rank(true, 3)]).0, "rank 1 has no fourth semantics row");
    }

    /// The per-rank table takes the slowest rank's figures and shows each rank's trials ahead and host costs.
    #[test]
    fn the_bench_table_shows_the_slowest_rank() {
        let rank = |time: f64, enqueue: f64, ahead: Vec<bool>| BenchRank {
            host_costs_us: Some(pg_lab::results::bench::HostCosts { timer: 0.02, ..Default::default() }),
            rows: vec![BenchRankRow {
                bytes: 1 << 20,
                contestant: "pg".into(),
                gpu_ahead_trials: ahead,
                host_enqueue_us: Some(enqueue),
                host_ops_per_s: Some(enqueue * 1e4),
                time_us: Some(time),
                wait_us: Some(0.5),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (ok, md) = bench(&[rank(100.0, 8.0, vec![true, true]), rank(120.0, 7.0, vec![true, false])]).unwrap();
        assert!(ok);
        assert!(md.contains("| 1 MiB | pg | 120.00 | 2/2, 1/2 | 8.7 | 8.00 | 0.50 | - | - | 70.0 |"), "{md}");
        assert!(md.contains("rank 1 host cost of primitives (median us): {\"current_stream\":0.0,"), "{md}");
        assert!(!bench(&[]).unwrap().0, "no rows");
    }

    /// A rank's result as the launcher collects it (the task's result plus its rank, world size and versions)
    /// reads into its type and writes back the same, so the merged result keeps every rank's result whole.
    #[test]
    fn the_ranks_results_keep_every_key_through_their_types() {
        fn through<R: serde::de::DeserializeOwned + serde::Serialize>(task: &str, mut rank: Value) {
            rank["rank"] = json!(1);
            rank["world_size"] = json!(2);
            rank["versions"] = json!({ "nccl": "2.28.9" });
            let typed: Vec<R> = typed_ranks(task, std::slice::from_ref(&rank)).unwrap();
            assert_eq!(serde_json::to_value(&typed[0]).unwrap(), rank, "{task}");
        }
        let bench = BenchRank {
            host_costs_us: Some(Default::default()),
            profile: Some("nvlink".into()),
            rows: vec![BenchRankRow { contestant: "pg".into(), bytes: 8, ..Default::default() }],
            task: "bench".into(),
            trace: Some(pg_lab::results::bench::TraceSummary::Unread { error: "gone".into(), file: "f".into() }),
            ..Default::default()
        };
        through::<BenchRank>("bench", serde_json::to_value(bench).unwrap());
        let p2p = ExchangeRank {
            not_applicable: Some("no ring".into()),
            self_send_refused: Some("refused".into()),
            task: "bench-p2p".into(),
            ..Default::default()
        };
        through::<ExchangeRank>("bench-p2p", serde_json::to_value(p2p).unwrap());
        let experiments = ExperimentsRank { backend: "nccl".into(), task: "experiments".into(), ..Default::default() };
        through::<ExperimentsRank>("experiments", serde_json::to_value(experiments).unwrap());
    }

    #[test]
    fn sizes_read_well() {
        assert_eq!(human(8), "8 B");
        assert_eq!(human(64 << 10), "64 KiB");
        assert_eq!(human(1 << 30), "1 GiB");
    }
}
