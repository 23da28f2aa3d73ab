//! The conformance task: every case of the suite on this rank, through the NCCL harness; the launcher merges
//! the ranks' reports (a case fails if it failed on any rank). Each rank writes its progress after every case, so
//! that a launcher that finds the ranks stalled can stop them, keep what they finished and start the rest again
//! ([`launch`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use pg_conformance::{report, CaseReport};
use pg_lab::conformance::NcclHarness;
use pg_lab::results::checks::{ConformanceResult, Outcome};
use serde_json::{json, Value};

use crate::{Rank, Settings};

/// How many times one run starts its ranks again after a stall.
const MAX_RESTARTS: usize = 4;

/// The environment variable that starts a rank at a case of the list (its index), for a restart.
const FROM_VAR: &str = "PG_CONFORMANCE_FROM";

/// The cases this run selects, in the suite's order: `PG_CONFORMANCE_ONLY` is a comma-separated list of name
/// parts, and a case runs when its name holds one (unset: every case).
fn selected() -> Vec<pg_conformance::Case<NcclHarness>> {
    let only = std::env::var("PG_CONFORMANCE_ONLY").unwrap_or_default();
    pg_conformance::cases::<NcclHarness>()
        .into_iter()
        .filter(|case| only.split(',').any(|part| case.name.contains(part)))
        .collect()
}

/// Where rank `rank` writes the reports of the cases it finished so far.
fn progress_file(out: &Path, rank: usize) -> PathBuf {
    out.join(format!("conformance-rank{rank}.progress.json"))
}

/// Runs the selected cases on this rank (from `PG_CONFORMANCE_FROM`, else the first) and returns the report of
/// this rank, in the suite's JSON form; after each case the reports so far are in the rank's progress file.
pub fn run(ctx: &Rank) -> Result<Value, String> {
    let harness = NcclHarness::new(ctx.rank, ctx.world, ctx.device.clone(), Arc::clone(&ctx.store));
    let from = match std::env::var(FROM_VAR) {
        Ok(text) => text.parse::<usize>().map_err(|e| format!("{FROM_VAR}={text}: {e}"))?,
        Err(_) => 0,
    };
    let versions: std::collections::BTreeMap<_, _> = pg_core::Device::versions(&ctx.device).into_iter().collect();
    let progress = progress_file(&ctx.settings.out, ctx.rank);
    let mut reports = Vec::new();
    for case in selected().into_iter().skip(from) {
        harness.begin_case(case.name);
        let started = Instant::now();
        let report = pg_conformance::run_case(&harness, &case);
        let took = started.elapsed().as_secs_f64();
        match &report.outcome {
            pg_conformance::Outcome::Fail(detail) => {
                eprintln!("rank {}: {} {} ({took:.1} s): {detail}", ctx.rank, report.name, report.outcome.word())
            }
            outcome => eprintln!("rank {}: {} {} ({took:.1} s)", ctx.rank, report.name, outcome.word()),
        }
        reports.push(report);
        let mut value = report::json("nccl", ctx.world, &reports);
        value["versions"] = json!(versions);
        crate::procs::write_atomically(&progress, &value)?;
    }
    Ok(report::json("nccl", ctx.world, &reports))
}

/// Runs the selected cases on `nproc` rank processes and returns each rank's report of all of them. When no rank
/// finishes a case for `settings.stall` (a hang in NCCL, or a rank that waits for one that hangs), the ranks'
/// stacks go to `OUT/stalls/`, the ranks are stopped, and a new set starts at the furthest case any rank reached
/// (up to [`MAX_RESTARTS`] times; [`report::after_stop`] says what fails). Past `settings.timeout` every case left
/// fails on every rank, and the report still holds what finished.
pub fn launch(settings: &Settings, nproc: usize) -> Result<Vec<Value>, String> {
    let names: Vec<&'static str> = selected().iter().map(|case| case.name).collect();
    let deadline = Instant::now() + settings.timeout;
    let progress: Vec<PathBuf> = (0..nproc).map(|rank| progress_file(&settings.out, rank)).collect();
    let mut segments: Vec<Vec<CaseReport>> = vec![Vec::new(); nproc];
    let mut versions = Value::Null;
    let (mut from, mut restarts) = (0, 0);
    while from < names.len() {
        for file in &progress {
            let _ = std::fs::remove_file(file);
        }
        let env = [(FROM_VAR, from.to_string())];
        let mut children = crate::procs::start_ranks(settings, "conformance", nproc, &env)?;
        let ended = crate::procs::wait_ranks(&mut children, deadline, Some((&progress, settings.stall)))?;
        let statuses = match ended {
            crate::procs::Ended::Exited(statuses) => statuses,
            stopped => {
                let resume = matches!(stopped, crate::procs::Ended::Stalled) && restarts < MAX_RESTARTS;
                let why = match stopped {
                    crate::procs::Ended::Stalled => {
                        format!("no rank finished a case for {} s", settings.stall.as_secs())
                    }
                    _ => format!("the run's time ran out ({} s, --timeout-s)", settings.timeout.as_secs()),
                };
                let dir = settings.out.join("stalls");
                let stacks: Vec<PathBuf> = (0..nproc)
                    .map(|rank| {
                        let done = read_progress(&progress[rank], &mut versions).len();
                        let case = names.get(from + done).copied().unwrap_or("end");
                        dir.join(format!("conformance-{case}-rank{rank}.txt"))
                    })
                    .collect();
                crate::procs::stop_all_with_stacks(&mut children, &stacks);
                println!("[conformance] {why}: stopped the ranks (stacks in {})", dir.display());
                // Read once every rank has stopped: what each finished before it did.
                let finished = progress.iter().map(|file| read_progress(file, &mut versions)).collect::<Vec<_>>();
                let (restart, stopped_at) = report::after_stop(&names, from, finished, &why, resume);
                for (segment, more) in segments.iter_mut().zip(stopped_at) {
                    segment.extend(more);
                }
                restarts += 1;
                from = restart;
                continue;
            }
        };
        for (rank, value) in crate::procs::collect_ranks(settings, "conformance", statuses)?.into_iter().enumerate() {
            segments[rank].extend(report::from_json(&value)?);
            versions = value["versions"].clone();
        }
        break;
    }
    Ok(rank_values(&segments, &versions))
}

/// The reports of ranks 0..`nproc` that another launcher started (torchrun): each rank's result file, or, for a
/// rank that left none (stopped, or still running when its launcher gave up), what its progress file holds, every
/// case it did not finish failing by name.
pub fn read_ranks(settings: &Settings, nproc: usize) -> Result<Vec<Value>, String> {
    let names: Vec<&'static str> = selected().iter().map(|case| case.name).collect();
    let mut versions = Value::Null;
    let mut finished = Vec::new();
    let mut unfinished = Vec::new();
    for rank in 0..nproc {
        let path = crate::rank_file(&settings.out, "conformance", rank);
        let done = std::fs::read_to_string(&path).ok().and_then(|text| serde_json::from_str::<Value>(&text).ok());
        match done {
            Some(value) if value["error"].is_null() => {
                versions = value["versions"].clone();
                finished.push(report::from_json(&value)?);
            }
            Some(value) => return Err(format!("rank {rank} failed: {}", value["error"])),
            None => {
                unfinished.push(rank);
                finished.push(read_progress(&progress_file(&settings.out, rank), &mut versions));
            }
        }
    }
    if !unfinished.is_empty() {
        let why = format!("rank(s) {unfinished:?} left no result, only their progress");
        println!("[conformance] {why}");
        finished = report::after_stop(&names, 0, finished, &why, false).1;
    }
    Ok(rank_values(&finished, &versions))
}

/// Each rank's reports as the JSON a rank process writes (the suite's form, with its rank and the versions).
fn rank_values(per_rank: &[Vec<CaseReport>], versions: &Value) -> Vec<Value> {
    let nproc = per_rank.len();
    let value = |(rank, reports): (usize, &Vec<CaseReport>)| {
        let mut value = report::json("nccl", nproc, reports);
        value["rank"] = json!(rank);
        value["versions"] = versions.clone();
        value
    };
    per_rank.iter().enumerate().map(value).collect()
}

/// The reports in a rank's progress file (none if it wrote none), noting the versions it names.
fn read_progress(file: &Path, versions: &mut Value) -> Vec<CaseReport> {
    let Some(value) = std::fs::read_to_string(file).ok().and_then(|text| serde_json::from_str::<Value>(&text).ok())
    else {
        return Vec::new();
    };
    if versions.is_null() {
        *versions = value["versions"].clone();
    }
    report::from_json(&value).unwrap_or_default()
}

/// Merges the ranks' reports into one: the table (markdown) and the merged result, and whether no case failed.
pub fn merge(ranks: &[Value]) -> Result<(bool, String, ConformanceResult), String> {
    let per_rank = ranks.iter().map(report::from_json).collect::<Result<Vec<_>, _>>()?;
    let mut merged = report::merge(&per_rank);
    // The ranks column is each case's minimum, from the registry.
    let cases = pg_conformance::cases::<NcclHarness>();
    for report in &mut merged {
        if let Some(case) = cases.iter().find(|c| c.name == report.name) {
            report.min_ranks = case.min_ranks;
        }
    }
    let (_, failed, _) = report::counts(&merged);
    let versions = match ranks.first().map(|r| &r["versions"]) {
        None | Some(Value::Null) => None,
        Some(v) => Some(serde_json::from_value(v.clone()).map_err(|e| format!("rank 0's versions: {e}"))?),
    };
    let result = ConformanceResult {
        backend: "nccl".to_owned(),
        cases: merged
            .iter()
            .map(|r| Outcome {
                detail: r.outcome.detail().to_owned(),
                name: r.name.clone(),
                result: r.outcome.word().to_owned(),
            })
            .collect(),
        versions,
        world_size: ranks.len() as u64,
        ..ConformanceResult::default()
    };
    let table = format!("\n```text\n{}```\n", report::table(&merged));
    Ok((failed == 0 && !merged.is_empty(), table, result))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The merged result names every case once with its merged outcome (a failure on any rank fails it), rank
    /// 0's versions and the world size, and keys of the suite's form.
    #[test]
    fn merge_fails_a_case_that_failed_on_any_rank_and_keeps_rank_0s_versions() {
        let rank = |second: &str, detail: &str, nccl: &str| {
            json!({ "backend": "nccl", "world_size": 2, "versions": { "nccl": nccl }, "cases": [
                { "name": "a", "result": "pass", "detail": "" },
                { "name": "b", "result": second, "detail": detail },
            ] })
        };
        let (ok, table, merged) = merge(&[rank("pass", "", "2.28.9"), rank("fail", "bad", "2.28.8")]).unwrap();
        assert!(!ok);
        assert!(table.contains("fail"), "{table}");
        let words: Vec<(&str, &str)> = merged.cases.iter().map(|c| (c.name.as_str(), c.result.as_str())).collect();
        assert_eq!(words, [("a", "pass"), ("b", "fail")]);
        assert!(merged.cases[1].detail.contains("bad"), "{:?}", merged.cases[1]);
        assert_eq!(merged.versions.as_ref().and_then(|v| v.get("nccl")).map(String::as_str), Some("2.28.9"));
        assert_eq!(merged.world_size, 2);
        let value = serde_json::to_value(&merged).unwrap();
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["backend", "cases", "versions", "world_size"]);
        assert!(merge(&[rank("pass", "", "2.28.9")]).unwrap().0);
    }
}
