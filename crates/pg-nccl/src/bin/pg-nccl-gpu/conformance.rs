//! The conformance task: every case of the suite on this rank, through the NCCL harness; the launcher merges
//! the ranks' reports (a case fails if it failed on any rank).

use std::sync::Arc;

use pg_conformance::report;
use pg_nccl::conformance::NcclHarness;
use serde_json::Value;

use crate::Rank;

/// Runs every case on this rank and returns the report of this rank, in the suite's JSON form.
pub fn run(ctx: &Rank) -> Result<Value, String> {
    let harness = NcclHarness::new(ctx.rank, ctx.world, ctx.device.clone(), Arc::clone(&ctx.store));
    let only = std::env::var("PG_CONFORMANCE_ONLY").unwrap_or_default();
    let mut reports = Vec::new();
    for case in pg_conformance::cases::<NcclHarness>() {
        // PG_CONFORMANCE_ONLY: a comma-separated list of name parts; a case runs when its name holds one.
        if !only.split(',').any(|part| case.name.contains(part)) {
            continue;
        }
        harness.begin_case(case.name);
        let started = std::time::Instant::now();
        let report = pg_conformance::run_case(&harness, &case);
        let took = started.elapsed().as_secs_f64();
        match &report.outcome {
            pg_conformance::Outcome::Fail(detail) => {
                eprintln!("rank {}: {} {} ({took:.1} s): {detail}", ctx.rank, report.name, report.outcome.word())
            }
            outcome => eprintln!("rank {}: {} {} ({took:.1} s)", ctx.rank, report.name, outcome.word()),
        }
        reports.push(report);
    }
    Ok(report::json("nccl", ctx.world, &reports))
}

/// Merges the ranks' reports into one: the table (markdown) and the suite's JSON, and whether no case failed.
pub fn merge(ranks: &[Value]) -> Result<(bool, String, Value), String> {
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
    let mut json = report::json("nccl", ranks.len(), &merged);
    json["versions"] = ranks.first().map(|r| r["versions"].clone()).unwrap_or_default();
    let table = format!("\n```text\n{}```\n", report::table(&merged));
    Ok((failed == 0 && !merged.is_empty(), table, json))
}
