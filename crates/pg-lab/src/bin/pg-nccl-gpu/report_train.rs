//! Merges the training example's runs beside PyTorch DDP into `train-mlp.{md,json}`: one run per side
//! ([`merge_train`]) or one pair per gradient-bucket layout ([`merge_train_layouts`]), over the typed runs and
//! results of `pg_lab::results::train`.

use std::fmt::Write as _;
use std::path::Path;

use pg_lab::results::train::{TrainLayout, TrainLayoutsResult, TrainResult, TrainRun, TrainSummary};

/// The steps left out of a median step time (the first ones create communicators and warm caches).
const WARMUP: usize = 5;

/// `dir/name` parsed as a `T`, or `None` when there is no such file.
fn load<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, String> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| format!("{name}: {e}")),
        Err(_) => Ok(None),
    }
}

/// A run's curve as (loss, ms) per step, NaN where a figure is missing.
fn curve(run: &TrainRun) -> Vec<(f64, f64)> {
    run.steps.iter().map(|s| (s.loss.unwrap_or(f64::NAN), s.ms.unwrap_or(f64::NAN))).collect()
}

/// `v` if it is a number.
fn finite(v: f64) -> Option<f64> {
    Some(v).filter(|v| v.is_finite())
}

/// The median of `values` (NaN when empty).
fn median(mut values: Vec<f64>) -> f64 {
    pg_lab::results::median(&mut values)
}

/// The largest relative gap between two loss curves, step by step (over the shorter one).
fn largest_gap(ours: &[(f64, f64)], theirs: &[(f64, f64)]) -> f64 {
    ours.iter().zip(theirs).map(|(a, b)| (a.0 - b.0).abs() / b.0.abs().max(f64::MIN_POSITIVE)).fold(0.0, f64::max)
}

/// Whether a curve has more than one step and its last loss is below its first.
fn falls(curve: &[(f64, f64)]) -> bool {
    curve.len() > 1 && curve[curve.len() - 1].0 < curve[0].0
}

/// Joins the training example's curve (`train-pg.json`, from `ddp_mlp --json`) and PyTorch DDP's
/// (`train-torch.json`, from `torch_ddp_mlp.py --json`) into `train-mlp.{md,json}`: step times (median after
/// the first `WARMUP` steps), losses, and the largest relative gap between the two loss curves (both start from
/// the same weights and data; their float sums run in other orders). Passes when each run's loss fell.
pub fn merge_train(dir: &Path, label: &str) -> Result<bool, String> {
    let pg: TrainRun = load(dir, "train-pg.json")?.ok_or("no train-pg.json: run the training example first")?;
    let torch: Option<TrainRun> = load(dir, "train-torch.json")?;
    let summary = |run: &TrainRun| {
        let s = curve(run);
        TrainSummary {
            backend: run.backend.clone(),
            first_loss: s.first().and_then(|r| finite(r.0)),
            last_loss: s.last().and_then(|r| finite(r.0)),
            median_step_ms: finite(median(s.iter().skip(WARMUP).map(|(_, ms)| *ms).collect())),
            steps: s.len() as u64,
            world_size: run.world_size,
        }
    };
    let ours = curve(&pg);
    let mut passed = falls(&ours);
    let mut rows = vec![summary(&pg)];
    let mut gap = None;
    if let Some(torch) = &torch {
        rows.push(summary(torch));
        let theirs = curve(torch);
        passed &= falls(&theirs);
        gap = Some(largest_gap(&ours, &theirs));
    }
    let merged = TrainResult {
        label: label.to_owned(),
        max_relative_loss_gap: gap,
        passed,
        pg,
        summary: rows,
        torch,
        ..TrainResult::default()
    };
    let md = train_markdown(&merged)?;
    crate::report::write_pair(dir, "train-mlp", &merged, &md)?;
    print!("{md}");
    Ok(passed)
}

/// The one-run form's markdown: the summaries, the gap and every tenth step of both curves.
fn train_markdown(result: &TrainResult) -> Result<String, String> {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Training example: a 2-layer MLP, data-parallel, pg (cuBLAS + PTX on cudarc memory) vs PyTorch DDP\n"
    );
    let _ = writeln!(md, "{}\n", result.label);
    let model = serde_json::to_string(&result.pg.model).map_err(|e| e.to_string())?;
    let _ = writeln!(md, "Model and data: {model}, global batch {}.\n", result.pg.global_batch);
    let _ = writeln!(md, "| run | ranks | steps | median step ms (after {WARMUP}) | first loss | last loss |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let nan = |v: Option<f64>| v.unwrap_or(f64::NAN);
    for row in &result.summary {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.3} | {:.6} | {:.6} |",
            row.backend,
            row.world_size,
            row.steps,
            nan(row.median_step_ms),
            nan(row.first_loss),
            nan(row.last_loss)
        );
    }
    match result.max_relative_loss_gap {
        Some(gap) => {
            let _ = writeln!(md, "\nLargest relative gap between the two loss curves (same weights and data, sums in other orders): {gap:.2e}.");
        }
        None => {
            let _ = writeln!(md, "\nNo PyTorch curve (train-torch.json) to compare with.");
        }
    }
    let _ = writeln!(md, "\n| step | pg loss | pg ms | torch loss | torch ms |\n|---|---|---|---|---|");
    let ours = curve(&result.pg);
    let theirs = result.torch.as_ref().map(curve).unwrap_or_default();
    for (step, (loss, ms)) in ours.iter().enumerate().filter(|(i, _)| i % 10 == 0 || *i + 1 == ours.len()) {
        let (tl, tm) =
            theirs.get(step).map_or(("-".into(), "-".into()), |(l, m)| (format!("{l:.6}"), format!("{m:.3}")));
        let _ = writeln!(md, "| {step} | {loss:.6} | {ms:.3} | {tl} | {tm} |");
    }
    Ok(md)
}

/// One layout's pair of runs in [`merge_train_layouts`]: how they compare and whether they met the targets.
fn train_layout(dir: &Path, buckets: usize) -> Result<TrainLayout, String> {
    let pg: Option<TrainRun> = load(dir, &format!("train-pg-b{buckets}.json"))?;
    let torch: Option<TrainRun> = load(dir, &format!("train-torch-b{buckets}.json"))?;
    let (ours, theirs) = (pg.as_ref().map(curve).unwrap_or_default(), torch.as_ref().map(curve).unwrap_or_default());
    let median_ms = |c: &[(f64, f64)]| (c.len() > WARMUP).then(|| median(c.iter().skip(WARMUP).map(|r| r.1).collect()));
    let gap = (!ours.is_empty() && ours.len() == theirs.len()).then(|| largest_gap(&ours, &theirs));
    let (pg_ms, torch_ms) = (median_ms(&ours), median_ms(&theirs));
    let curves_ok = gap.is_some_and(|g| g <= 1e-5);
    let losses_fell = falls(&ours) && falls(&theirs);
    let ends = |c: &[(f64, f64)]| [c.first().and_then(|r| finite(r.0)), c.last().and_then(|r| finite(r.0))];
    Ok(TrainLayout {
        buckets: buckets as u64,
        curves_within_1e_5: curves_ok,
        ddp_bucket_sizes: torch
            .as_ref()
            .and_then(|t| t.model.get("ddp_bucket_sizes"))
            .and_then(|v| v.as_str().map(str::to_owned)),
        losses_fell,
        max_relative_loss_gap: gap,
        passed: curves_ok && losses_fell,
        pg_first_last_loss: ends(&ours),
        pg_median_step_ms: pg_ms,
        pg_over_torch_step: pg_ms.zip(torch_ms).map(|(p, t)| p / t),
        pg_step_at_or_below_torch: pg_ms.zip(torch_ms).map(|(p, t)| p <= t),
        steps: ours.len() as u64,
        torch_first_last_loss: ends(&theirs),
        torch_median_step_ms: torch_ms,
        pg,
        torch,
    })
}

/// Joins the training example's runs beside PyTorch DDP for each bucket layout in `layouts`
/// (`train-pg-bK.json` and `train-torch-bK.json` in `dir`) into `train-mlp.{md,json}`: per layout the median step
/// (after the first 5 steps) of each side, their ratio, and the largest relative gap between the loss curves.
/// Passes when every layout's curves agree within 1e-5 and each loss fell; whether pg's median step is at or
/// below DDP's is reported, not required.
pub fn merge_train_layouts(dir: &Path, label: &str, layouts: &[usize]) -> Result<bool, String> {
    let rows = layouts.iter().map(|&k| train_layout(dir, k)).collect::<Result<Vec<_>, _>>()?;
    let passed = !rows.is_empty() && rows.iter().all(|r| r.passed);
    let merged = TrainLayoutsResult { label: label.to_owned(), layouts: rows, passed, ..TrainLayoutsResult::default() };
    let md = layouts_markdown(&merged)?;
    crate::report::write_pair(dir, "train-mlp", &merged, &md)?;
    print!("{md}");
    Ok(passed)
}

/// The per-layout form's markdown: a row per layout, then every tenth step of each layout's curves.
fn layouts_markdown(result: &TrainLayoutsResult) -> Result<String, String> {
    let opt = |v: Option<f64>, digits: usize| v.map_or("-".to_owned(), |v| format!("{v:.digits$}"));
    let yes = |v: Option<bool>| match v {
        Some(true) => "yes",
        Some(false) => "NO",
        None => "-",
    };
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# Training example beside PyTorch DDP: a 2-layer MLP, data-parallel, per gradient-bucket layout\n"
    );
    let _ = writeln!(md, "{}\n", result.label);
    if let Some(pg) = result.layouts.iter().find_map(|r| r.pg.as_ref()) {
        let model = serde_json::to_string(&pg.model).map_err(|e| e.to_string())?;
        let _ = writeln!(md, "Model and data: {model}, global batch {}.\n", pg.global_batch);
    }
    let _ = writeln!(
        md,
        "Same model, data, steps and bucket layout on both sides: two buckets = layer 2's gradients all-reduced while          layer 1's backward runs, then layer 1's (DDP: bucket cap = layer 2's gradient bytes); one bucket = every          gradient in one all_reduce after backward (DDP: bucket_cap_mb=25). Median step after the first 5 steps.
"
    );
    let _ = writeln!(md, "| buckets | steps | pg median step ms | DDP median step ms | pg / DDP | pg at or below DDP | max relative loss gap | within 1e-5 | DDP's bucket sizes |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    for row in &result.layouts {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            row.buckets,
            row.steps,
            opt(row.pg_median_step_ms, 3),
            opt(row.torch_median_step_ms, 3),
            opt(row.pg_over_torch_step, 3),
            yes(row.pg_step_at_or_below_torch),
            row.max_relative_loss_gap.map_or("-".to_owned(), |g| format!("{g:.2e}")),
            yes(Some(row.curves_within_1e_5)),
            serde_json::to_string(&row.ddp_bucket_sizes).map_err(|e| e.to_string())?,
        );
    }
    for row in &result.layouts {
        let _ = writeln!(
            md,
            "\n## {} bucket(s)\n\n| step | pg loss | pg ms | DDP loss | DDP ms |\n|---|---|---|---|---|",
            row.buckets
        );
        let steps = |run: &Option<TrainRun>| run.as_ref().map(|r| r.steps.clone()).unwrap_or_default();
        let (ours, theirs) = (steps(&row.pg), steps(&row.torch));
        for (step, r) in ours.iter().enumerate().filter(|(i, _)| i % 10 == 0 || *i + 1 == ours.len()) {
            let t = theirs.get(step);
            let _ = writeln!(
                md,
                "| {step} | {} | {} | {} | {} |",
                opt(r.loss, 6),
                opt(r.ms, 3),
                t.map_or("-".to_owned(), |t| opt(t.loss, 6)),
                t.map_or("-".to_owned(), |t| opt(t.ms, 3)),
            );
        }
    }
    Ok(md)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    #[test]
    fn the_layouts_merge_reports_gap_and_median_step_per_bucket_layout() {
        let dir = std::env::temp_dir().join(format!("pg-merge-train-layouts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |backend: &str, scale: f64, ms: f64| {
            let steps: Vec<Value> =
                (0..12).map(|s| json!({ "step": s, "loss": (1.0 - 0.05 * s as f64) * scale, "ms": ms })).collect();
            json!({ "backend": backend, "world_size": 2, "global_batch": 256, "model": {"buckets": 2}, "steps": steps })
        };
        for (k, torch_scale, torch_ms) in [(1, 1.0 + 2e-6, 10.0), (2, 1.0 + 5e-5, 8.0)] {
            std::fs::write(dir.join(format!("train-pg-b{k}.json")), run("nccl", 1.0, 9.0).to_string()).unwrap();
            std::fs::write(dir.join(format!("train-torch-b{k}.json")), run("torch", torch_scale, torch_ms).to_string())
                .unwrap();
        }
        assert!(!merge_train_layouts(&dir, "2 ranks on 1 GPU", &[1, 2]).unwrap(), "layout 2's gap is 5e-5");
        let merged: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("train-mlp.json")).unwrap()).unwrap();
        let one = &merged["layouts"][0];
        assert_eq!(one["curves_within_1e-5"], json!(true));
        assert_eq!(one["pg_step_at_or_below_torch"], json!(true));
        assert_eq!(one["pg_median_step_ms"], json!(9.0));
        assert_eq!(one["torch"]["model"], json!({ "buckets": 2 }), "each side's run is kept as written");
        let two = &merged["layouts"][1];
        assert_eq!(two["curves_within_1e-5"], json!(false));
        assert_eq!(two["pg_step_at_or_below_torch"], json!(false));
        let md = std::fs::read_to_string(dir.join("train-mlp.md")).unwrap();
        assert!(md.contains("| 1 | 12 | 9.000 | 10.000 | 0.900 | yes |"), "{md}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The markdown of every committed training result, rendered from its JSON alone, is what the committed .md
    /// holds below any header the committer added.
    #[test]
    fn the_committed_markdown_renders_from_the_committed_json() {
        let mut seen = 0;
        for pg_lab::results::Committed { name, json, md } in pg_lab::results::committed("train-mlp-") {
            let value: Value = serde_json::from_str(&json).expect("JSON");
            let rendered = match value.get("layouts") {
                Some(_) => layouts_markdown(&serde_json::from_value(value).expect("a per-layout result")),
                None => train_markdown(&serde_json::from_value(value).expect("a one-run result")),
            }
            .expect("markdown");
            // The committer may put a machine header above what the merge wrote; the rest is the merge's.
            let differs = md.lines().rev().zip(rendered.lines().rev()).position(|(a, b)| a != b);
            assert!(
                rendered.starts_with("# Training") && md.ends_with(&rendered),
                "{name}: the rendered markdown is not the end of the committed .md (line {differs:?} from the end)"
            );
            seen += 1;
        }
        assert!(seen > 0, "no committed training result");
    }
}
