//! The runner's output: the table (case, ranks, result, detail), the JSON
//! `{"backend", "world_size", "cases": [{"name", "result", "detail"}]}`, and the merge of the reports of
//! several rank processes into one.

use serde_json::{json, Value};

use crate::case::Outcome;
use crate::registry::CaseReport;

/// The table: one line per case, then the counts.
pub fn table(reports: &[CaseReport]) -> String {
    let width = reports.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let mut out = format!("{:<width$}  ranks  {:<14}  detail\n", "case", "result");
    for report in reports {
        let detail = report.outcome.detail().replace('\n', " ");
        out += &format!("{:<width$}  {:>5}  {:<14}  {detail}\n", report.name, report.min_ranks, report.outcome.word());
    }
    let (pass, fail, na) = counts(reports);
    out += &format!("{pass} passed, {fail} failed, {na} not applicable\n");
    out
}

/// (passed, failed, not applicable).
pub fn counts(reports: &[CaseReport]) -> (usize, usize, usize) {
    let count = |word| reports.iter().filter(|r| r.outcome.word() == word).count();
    (count("pass"), count("fail"), count("not_applicable"))
}

/// The JSON document of one run.
pub fn json(backend: &str, world_size: usize, reports: &[CaseReport]) -> Value {
    let cases: Vec<Value> = reports
        .iter()
        .map(|r| json!({ "name": r.name, "result": r.outcome.word(), "detail": r.outcome.detail() }))
        .collect();
    json!({ "backend": backend, "world_size": world_size, "cases": cases })
}

/// Reads back what [`json()`] wrote (the cases of one process), for [`merge`].
pub fn from_json(value: &Value) -> Result<Vec<CaseReport>, String> {
    let cases = value["cases"].as_array().ok_or("no \"cases\" array")?;
    cases
        .iter()
        .map(|case| {
            let name = case["name"].as_str().ok_or("a case without a name")?.to_owned();
            let detail = case["detail"].as_str().unwrap_or_default().to_owned();
            let outcome = match case["result"].as_str() {
                Some("pass") => Outcome::Pass,
                Some("fail") => Outcome::Fail(detail),
                Some("not_applicable") => Outcome::NotApplicable(detail),
                other => return Err(format!("case {name}: result {other:?}")),
            };
            let min_ranks = case["min_ranks"].as_u64().unwrap_or(1) as usize;
            Ok(CaseReport { name, min_ranks, outcome })
        })
        .collect()
}

/// One report per case from the reports of several rank processes (each ran every case for its rank): a case
/// fails if it failed on any rank (the detail names the ranks), is not applicable if it was so on every rank,
/// and passes only if it passed on every rank that ran it.
pub fn merge(per_rank: &[Vec<CaseReport>]) -> Vec<CaseReport> {
    let Some(first) = per_rank.first() else { return Vec::new() };
    first
        .iter()
        .enumerate()
        .map(|(i, base)| {
            let mine: Vec<(usize, Option<&CaseReport>)> =
                per_rank.iter().enumerate().map(|(rank, reports)| (rank, reports.get(i))).collect();
            let mut failures = Vec::new();
            let mut not_applicable = Vec::new();
            for (rank, report) in &mine {
                match report {
                    Some(r) if r.name != base.name => failures.push(format!("rank {rank}: ran {} here", r.name)),
                    Some(CaseReport { outcome: Outcome::Fail(d), .. }) => failures.push(format!("rank {rank}: {d}")),
                    Some(CaseReport { outcome: Outcome::NotApplicable(d), .. }) => not_applicable.push(d.clone()),
                    Some(_) => {}
                    None => failures.push(format!("rank {rank}: no result")),
                }
            }
            let outcome = if !failures.is_empty() {
                Outcome::Fail(failures.join("; "))
            } else if not_applicable.len() == mine.len() {
                Outcome::NotApplicable(not_applicable.swap_remove(0))
            } else if !not_applicable.is_empty() {
                Outcome::Fail(format!("not applicable on some ranks only: {}", not_applicable.join("; ")))
            } else {
                Outcome::Pass
            };
            CaseReport { name: base.name.clone(), min_ranks: base.min_ranks, outcome }
        })
        .collect()
}

/// Where the rank processes of a run that stalled, or ran out of time, stood when they were stopped, and where a
/// new set of them starts again: a launcher runs the suite's cases `names` (every rank the same list, in the same
/// order) from index `from`, and `finished[r]` holds the reports rank `r` had written when it was stopped, of
/// cases `from..`. A rank stopped in case `from + finished[r].len()`.
///
/// Returns the index the next processes start from and each rank's reports of cases `from` to it. The furthest
/// case any rank reached runs again on every rank (its ranks may only have waited there for the stuck ones),
/// and a rank behind it fails the case it was stuck in (`why`) and those it never reached; when every rank was
/// stopped in one case, that case fails on each and the next starts. `resume: false` (the run's time is out)
/// fails every case left on every rank instead, and starts nothing.
pub fn after_stop(
    names: &[&str],
    from: usize,
    mut finished: Vec<Vec<CaseReport>>,
    why: &str,
    resume: bool,
) -> (usize, Vec<Vec<CaseReport>>) {
    let at = |reports: &Vec<CaseReport>| (from + reports.len()).min(names.len());
    let furthest = finished.iter().map(at).max().unwrap_or(from);
    let restart = match (resume, finished.iter().all(|reports| at(reports) == furthest)) {
        (false, _) => names.len(),
        (true, true) => (furthest + 1).min(names.len()),
        (true, false) => furthest,
    };
    for reports in &mut finished {
        let stuck = at(reports);
        reports.truncate(restart.saturating_sub(from));
        for index in stuck..restart {
            let detail = match index == stuck {
                true => format!("stopped in this case on this rank: {why}"),
                false => format!("not run on this rank: it was stopped in case {} ({why})", names[stuck]),
            };
            reports.push(CaseReport { name: names[index].to_owned(), min_ranks: 1, outcome: Outcome::Fail(detail) });
        }
    }
    (restart, finished)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, outcome: Outcome) -> CaseReport {
        CaseReport { name: name.to_owned(), min_ranks: 1, outcome }
    }

    #[test]
    fn json_round_trips_and_merge_fails_a_case_that_failed_anywhere() {
        let rank0 = vec![
            report("a", Outcome::Pass),
            report("b", Outcome::Pass),
            report("c", Outcome::NotApplicable("no log".into())),
        ];
        let rank1 = vec![
            report("a", Outcome::Pass),
            report("b", Outcome::Fail("wrong sum".into())),
            report("c", Outcome::NotApplicable("no log".into())),
        ];
        let back = from_json(&json("mock", 2, &rank1)).unwrap();
        assert_eq!(
            back.iter().map(|r| &r.outcome).collect::<Vec<_>>(),
            rank1.iter().map(|r| &r.outcome).collect::<Vec<_>>()
        );
        let merged = merge(&[rank0, back]);
        assert_eq!(merged[0].outcome, Outcome::Pass);
        assert_eq!(merged[1].outcome, Outcome::Fail("rank 1: wrong sum".into()));
        assert_eq!(merged[2].outcome, Outcome::NotApplicable("no log".into()));
        assert_eq!(counts(&merged), (1, 1, 1));
        assert!(table(&merged).contains("1 passed, 1 failed, 1 not applicable"));
    }

    fn passed(names: &[&str]) -> Vec<CaseReport> {
        names.iter().map(|name| report(name, Outcome::Pass)).collect()
    }

    fn words(reports: &[CaseReport]) -> Vec<(&str, &str)> {
        reports.iter().map(|r| (r.name.as_str(), r.outcome.word())).collect()
    }

    #[test]
    fn a_stall_reruns_the_furthest_case_and_fails_the_cases_a_stuck_rank_never_reached() {
        let names = ["a", "b", "c", "d", "e"];
        // From case b: rank 0 stuck in b; rank 1 finished b and c and waits in d for rank 0.
        let (restart, segments) = after_stop(&names, 1, vec![vec![], passed(&["b", "c"])], "no progress", true);
        assert_eq!(restart, 3, "d runs again on every rank");
        assert_eq!(words(&segments[0]), [("b", "fail"), ("c", "fail")]);
        assert!(segments[0][0].outcome.detail().contains("stopped in this case on this rank: no progress"));
        assert!(segments[0][1].outcome.detail().contains("it was stopped in case b"));
        assert_eq!(words(&segments[1]), [("b", "pass"), ("c", "pass")]);
    }

    #[test]
    fn a_case_every_rank_is_stuck_in_fails_everywhere_and_the_next_one_starts() {
        let names = ["a", "b", "c"];
        let (restart, segments) = after_stop(&names, 0, vec![passed(&["a"]), passed(&["a"])], "no progress", true);
        assert_eq!(restart, 2);
        for segment in &segments {
            assert_eq!(words(segment), [("a", "pass"), ("b", "fail")]);
        }
        // Stuck in the last case: nothing is left to start.
        let (restart, segments) = after_stop(&names, 2, vec![vec![], vec![]], "no progress", true);
        assert_eq!(restart, 3);
        assert_eq!(words(&segments[1]), [("c", "fail")]);
    }

    #[test]
    fn out_of_time_fails_every_case_left_on_every_rank() {
        let names = ["a", "b", "c"];
        let (restart, segments) = after_stop(&names, 0, vec![passed(&["a"]), passed(&["a", "b"])], "timed out", false);
        assert_eq!(restart, 3);
        assert_eq!(words(&segments[0]), [("a", "pass"), ("b", "fail"), ("c", "fail")]);
        assert_eq!(words(&segments[1]), [("a", "pass"), ("b", "pass"), ("c", "fail")]);
        // Merged, the ranks' lists line up case by case.
        let merged = merge(&segments);
        assert_eq!(words(&merged), [("a", "pass"), ("b", "fail"), ("c", "fail")]);
    }
}
