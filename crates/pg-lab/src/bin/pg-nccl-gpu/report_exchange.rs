//! The reports of the all-to-all and point-to-point benchmarks: each task's table, and the merge of the Rust
//! contestants (`bench-<op>.json`) with PyTorch's (`torch-<op>.json`) into `<op>.md` and `<op>.json`.

use std::fmt::Write as _;
use std::path::Path;

use pg_lab::bench_exchange::{input_splits, Split, SKEWED_DEFINITION};
use pg_lab::results::exchange::{ExchangeBench, ExchangeRank, ExchangeRankRow, TorchExchange};
use pg_lab::results::{ExchangeResult, ExchangeSize, Measure};
use serde_json::Value;

use crate::bench_exchange::busbw;

/// The two benchmarks: their task name, the op name in file names, and what one op is.
pub const OPS: [(&str, &str, &str); 2] = [
    ("bench-all-to-all", "all-to-all", "all_to_all_single"),
    ("bench-p2p", "p2p", "batch_isend_irecv ring (send to rank + 1, receive from rank - 1)"),
];

/// The op name (`all-to-all`, `p2p`) of a task, if it is one of these benchmarks.
pub fn op_of(task: &str) -> Option<&'static str> {
    OPS.iter().find(|(t, _, _)| *t == task).map(|(_, op, _)| *op)
}

fn describe(op: &str) -> &'static str {
    OPS.iter().find(|(_, o, _)| *o == op).map_or("?", |(_, _, what)| *what)
}

const BUSBW_ALL_TO_ALL: &str =
    "busbw = algbw * (n - 1) / n (nccl-tests' all-to-all); algbw = bytes each rank sends per op / time per op";
const BUSBW_P2P: &str = "busbw = algbw (nccl-tests' send/recv); algbw = bytes each rank sends per op / time per op";

/// A size in the tables' units (as the all_reduce report writes them; not imported, so that the two reports do
/// not name each other).
fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// One contestant at one (split, size): over the ranks, the slowest rank's medians.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub contestant: String,
    pub split: Option<String>,
    pub bytes: u64,
    pub time_us: f64,
    pub enqueue_us: f64,
    pub wait_us: Option<f64>,
}

impl Row {
    fn algbw(&self) -> f64 {
        self.bytes as f64 / (self.time_us * 1e-6) / 1e9
    }

    /// The row's figures as the merged result writes them (a figure that is not a number is `null`).
    fn measure(&self, op: &str, world: usize) -> Measure {
        let finite = |v: f64| Some(v).filter(|v| v.is_finite());
        Measure {
            algbw_gbps: finite(self.algbw()),
            busbw_gbps: finite(busbw(op, self.algbw(), world)),
            host_enqueue_us: finite(self.enqueue_us),
            time_us: finite(self.time_us),
            wait_us: self.wait_us.filter(|v| v.is_finite()),
        }
    }
}

/// The Rust contestants' rows, each the slowest rank's medians (ranks list their rows in the same order).
fn rust_rows(ranks: &[ExchangeRank]) -> Vec<Row> {
    let first = ranks.first().map(|r| r.rows.as_slice()).unwrap_or_default();
    first
        .iter()
        .enumerate()
        .map(|(index, row)| {
            let max = |get: &dyn Fn(&ExchangeRankRow) -> Option<f64>| {
                ranks.iter().map(|r| r.rows.get(index).and_then(get).unwrap_or(f64::NAN)).fold(f64::NAN, f64::max)
            };
            Row {
                contestant: row.contestant.clone(),
                split: row.split.clone(),
                bytes: row.bytes,
                time_us: max(&|r| r.time_us),
                enqueue_us: max(&|r| r.host_enqueue_us),
                wait_us: row.wait_us.map(|_| max(&|r| r.wait_us)),
            }
        })
        .collect()
}

/// PyTorch's rows (the script already took the slowest rank's figures).
fn torch_rows(torch: &TorchExchange) -> Vec<Row> {
    torch
        .rows
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|row| Row {
            contestant: "torch".into(),
            split: row.split,
            bytes: row.bytes,
            time_us: row.time_us.unwrap_or(f64::NAN),
            enqueue_us: row.host_enqueue_us.unwrap_or(f64::NAN),
            wait_us: row.wait_us,
        })
        .collect()
}

/// The table of a task's own results (`pg-nccl-gpu run --tasks bench-all-to-all`); passes when every rank
/// produced rows, or said why none apply.
pub fn task(task: &str, ranks: &[Value]) -> (bool, String) {
    let typed: Result<Vec<ExchangeRank>, String> = ranks
        .iter()
        .enumerate()
        .map(|(rank, r)| serde_json::from_value(r.clone()).map_err(|e| format!("rank {rank}: {e}")))
        .collect();
    table(task, ranks.len(), typed)
}

/// The task's table over its `world` ranks' results (`Err`: they do not read).
fn table(task: &str, world: usize, ranks: Result<Vec<ExchangeRank>, String>) -> (bool, String) {
    let op = op_of(task).unwrap_or("?");
    let mut md = String::new();
    let _ = writeln!(md, "\n### {op}: {}, {world} ranks (slowest rank's medians)\n", describe(op));
    if let Some(why) = ranks.as_ref().ok().and_then(|r| r.first()).and_then(|r| r.not_applicable.as_deref()) {
        let _ = writeln!(md, "{why}.");
        return (true, md);
    }
    let _ = writeln!(
        md,
        "| size | split | contestant | time/op us | algbw GB/s | busbw GB/s | host enqueue us/op | wait() us |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    let rows = match ranks {
        Ok(ranks) => rust_rows(&ranks),
        Err(error) => {
            let _ = writeln!(md, "\nThe ranks' rows do not read: {error}");
            return (false, md);
        }
    };
    for row in &rows {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} |",
            human(row.bytes),
            row.split.as_deref().unwrap_or("-"),
            row.contestant,
            row.time_us,
            row.algbw(),
            busbw(op, row.algbw(), world),
            row.enqueue_us,
            row.wait_us.map_or("-".into(), |w| format!("{w:.2}")),
        );
    }
    (!rows.is_empty(), md)
}

/// Checks that PyTorch's script cut the skewed splits as the Rust contestants do (its
/// `skewed_splits_check`: the input splits of every rank for some element count).
fn check_torch_splits(torch: &TorchExchange, world: usize) -> Result<(), String> {
    let Some(check) = &torch.skewed_splits_check else {
        return Err("torch results without skewed_splits_check: the script is not the one this merge knows".into());
    };
    let numel = check.numel;
    for rank in 0..world {
        let want = input_splits(Split::Skewed, numel as usize, world, rank);
        let got: Option<Vec<usize>> =
            check.input_splits.get(rank).map(|splits| splits.iter().map(|&s| s as usize).collect());
        if got.as_ref() != Some(&want) {
            return Err(format!(
                "PyTorch's skewed splits differ from the Rust contestants': rank {rank} of {world}, {numel} elements: \
                 torch {got:?}, Rust {want:?}"
            ));
        }
    }
    Ok(())
}

/// Joins `bench-<op>.json` (raw, pg) and `torch-<op>.json` (if present) in `dir` into `<op>.md` and
/// `<op>.json`; returns whether every contestant that ran has a row at every size.
pub fn merge(dir: &Path, op: &str, label: &str) -> Result<bool, String> {
    let task = OPS.iter().find(|(_, o, _)| *o == op).map(|(t, _, _)| *t).ok_or_else(|| format!("no benchmark {op}"))?;
    fn load<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> Result<Option<T>, String> {
        match std::fs::read_to_string(dir.join(name)) {
            Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| format!("{name}: {e}")),
            Err(_) => Ok(None),
        }
    }
    let bench: ExchangeBench = load(dir, &format!("{task}.json"))?
        .ok_or_else(|| format!("no {task}.json in {}: run {task} first", dir.display()))?;
    let torch: Option<TorchExchange> = load(dir, &format!("torch-{op}.json"))?;
    let ranks = &bench.ranks;
    let world = ranks.len();
    if world == 0 {
        return Err(format!("{task}.json holds no rank's results"));
    }
    if let Some(torch) = &torch {
        if torch.world_size != Some(world as u64) {
            let theirs = torch.world_size.map_or("null".to_owned(), |n| n.to_string());
            return Err(format!("torch-{op}.json is of world size {theirs} but {task}.json of {world}"));
        }
        if op == "all-to-all" && torch.not_applicable.is_none() {
            check_torch_splits(torch, world)?;
        }
    }
    let not_applicable = ranks[0].not_applicable.clone();
    let mut rows = rust_rows(ranks);
    if let Some(torch) = &torch {
        rows.extend(torch_rows(torch));
    }
    let mut keys: Vec<(Option<String>, u64)> = rows.iter().map(|r| (r.split.clone(), r.bytes)).collect();
    keys.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    keys.dedup();
    let find = |c: &str, key: &(Option<String>, u64)| {
        rows.iter().find(|r| r.contestant == c && r.split == key.0 && r.bytes == key.1)
    };
    let definition = if op == "all-to-all" { BUSBW_ALL_TO_ALL } else { BUSBW_P2P };

    let mut md = String::new();
    let _ = writeln!(md, "# {op}: raw NCCL loop vs pg's process group vs PyTorch\n");
    let _ = writeln!(md, "{label}\n");
    let _ = writeln!(md, "Rust: {}", serde_json::to_string(&bench.versions).map_err(|e| e.to_string())?);
    if let Some(torch) = &torch {
        let _ = writeln!(md, "\nPyTorch: {}", torch.versions);
    }
    let _ = writeln!(
        md,
        "\nOne op: {}; f32, {world} ranks. raw: `ncclSend`/`ncclRecv` per peer inside one \
         `ncclGroupStart`/`ncclGroupEnd` (zero-length chunks skipped); pg and torch use the synchronous form \
         (enqueue, then wait()). time/op from CUDA events over K back-to-back ops after a spin (median of trials, \
         slowest rank); host times are medians over every op (slowest rank). {definition}.",
        describe(op)
    );
    if op == "all-to-all" {
        let _ = writeln!(md, "\n{}", SKEWED_DEFINITION.replace('\n', " "));
    }
    if let Some(why) = &not_applicable {
        let _ = writeln!(md, "\n{why}: no figures.");
    } else if op == "all-to-all" && world == 1 {
        let _ = writeln!(md, "\nAt world size 1 each rank exchanges with itself only: busbw is 0 by definition.");
    }
    let mut summary = Vec::new();
    if not_applicable.is_none() {
        let _ = writeln!(md, "\n| size | split | raw us | pg us | torch us | raw algbw | pg algbw | torch algbw | raw busbw | pg busbw | torch busbw | raw enqueue us | pg enqueue us | pg wait us | torch enqueue us | torch wait us |");
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    }
    let f = |row: Option<&Row>, get: &dyn Fn(&Row) -> Option<f64>| {
        row.and_then(get).map(|v| format!("{v:.2}")).unwrap_or_else(|| "-".into())
    };
    let mut complete = true;
    for key in &keys {
        let (raw, pg, torch_row) = (find("raw", key), find("pg", key), find("torch", key));
        complete &= raw.is_some() && pg.is_some() && (torch.is_none() || torch_row.is_some());
        let algbw = |r: &Row| Some(r.algbw());
        let bus = |r: &Row| Some(busbw(op, r.algbw(), world));
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            human(key.1),
            key.0.as_deref().unwrap_or("-"),
            f(raw, &|r| Some(r.time_us)),
            f(pg, &|r| Some(r.time_us)),
            f(torch_row, &|r| Some(r.time_us)),
            f(raw, &algbw),
            f(pg, &algbw),
            f(torch_row, &algbw),
            f(raw, &bus),
            f(pg, &bus),
            f(torch_row, &bus),
            f(raw, &|r| Some(r.enqueue_us)),
            f(pg, &|r| Some(r.enqueue_us)),
            f(pg, &|r| r.wait_us),
            f(torch_row, &|r| Some(r.enqueue_us)),
            f(torch_row, &|r| r.wait_us),
        );
        summary.push(ExchangeSize {
            bytes: key.1,
            pg: pg.map(|r| r.measure(op, world)),
            pg_minus_raw_enqueue_us: raw.zip(pg).map(|(r, p)| p.enqueue_us - r.enqueue_us).filter(|v| v.is_finite()),
            pg_over_raw_time: raw.zip(pg).map(|(r, p)| p.time_us / r.time_us).filter(|v| v.is_finite()),
            raw: raw.map(|r| r.measure(op, world)),
            split: key.0.clone(),
            torch: torch_row.map(|r| r.measure(op, world)),
        });
    }
    if not_applicable.is_none() && keys.is_empty() {
        complete = false;
    }
    // The network profile's targets (ranks sharing a GPU over the socket transport): pg's device time per op
    // within 3% of raw's from 64 KiB up, pg's host enqueue within 1 us of raw's (median over sizes).
    let profile = ranks[0].profile.clone().unwrap_or_else(|| "nvlink".to_owned());
    let ratios: Vec<Option<f64>> = summary
        .iter()
        .filter(|s| s.bytes >= crate::profile::NETWORK_TARGET_FROM_BYTES)
        .map(|s| s.pg_over_raw_time)
        .collect();
    let worst_ratio = ratios.iter().flatten().copied().reduce(f64::max);
    let device_ok = !ratios.is_empty() && ratios.iter().all(|r| r.is_some_and(|r| r <= 1.03));
    let enqueue_median = {
        let mut diffs: Vec<f64> = summary.iter().filter_map(|s| s.pg_minus_raw_enqueue_us).collect();
        crate::bench::median(&mut diffs)
    };
    let enqueue_ok = enqueue_median <= 1.0;
    if profile == "network" && not_applicable.is_none() {
        let yes = |met: bool| if met { "yes" } else { "NO" };
        let _ = writeln!(
            md,
            "\nNetwork profile: every rank's NCCL traffic goes through the socket transport over loopback (not NVLink), and \
             the ranks' kernels time-slice the GPU. Targets: pg's device time per op within 3% of raw's from 64 KiB up \
             (worst pg/raw {}): {}; pg's host enqueue within 1 us of raw's (median over sizes and splits of the \
             difference, {enqueue_median:.2} us): {}.",
            worst_ratio.map_or("-".into(), |r| format!("{r:.3}")),
            yes(device_ok),
            yes(enqueue_ok)
        );
    }
    std::fs::write(dir.join(format!("{op}.md")), &md).map_err(|e| e.to_string())?;
    let merged = ExchangeResult {
        busbw_definition: definition.to_owned(),
        command: None,
        commit: None,
        device_time_within_3_percent_from_64kib: Some(device_ok),
        host_overhead_within_1_us: Some(enqueue_ok),
        label: label.to_owned(),
        machine: None,
        not_applicable,
        op: op.to_owned(),
        pg_minus_raw_enqueue_us_median: Some(enqueue_median).filter(|v| v.is_finite()),
        pg_over_raw_time_worst_from_64kib: worst_ratio,
        profile: Some(profile),
        rust_versions: bench.versions.clone(),
        self_send_refused: ranks[0].self_send_refused.clone(),
        sizes: summary,
        splits_definition: (op == "all-to-all").then(|| SKEWED_DEFINITION.replace('\n', " ")),
        torch_versions: torch.map(|t| t.versions),
        what: describe(op).to_owned(),
        world_size: world as u64,
    };
    std::fs::write(dir.join(format!("{op}.json")), serde_json::to_string_pretty(&merged).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    print!("{md}");
    Ok(complete)
}

#[cfg(test)]
mod tests {
    use pg_lab::bench_exchange::RING_NOT_APPLICABLE;
    use serde_json::json;

    use super::*;

    fn rank(rows: Value) -> Value {
        json!({ "rows": rows })
    }

    fn row(c: &str, split: &str, bytes: u64, time: f64, enqueue: f64) -> Value {
        json!({ "contestant": c, "split": split, "bytes": bytes, "time_us": time, "host_enqueue_us": enqueue,
                "wait_us": if c == "raw" { Value::Null } else { json!(0.5) } })
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("pg-merge-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn splits_check(world: usize) -> Value {
        let splits: Vec<Vec<usize>> = (0..world).map(|r| input_splits(Split::Skewed, 1000, world, r)).collect();
        json!({ "numel": 1000, "input_splits": splits })
    }

    /// Ranks whose results do not read fail the task's table, which still names the world and says why.
    #[test]
    fn ranks_that_do_not_read_fail_the_table() {
        let (ok, md) = task("bench-p2p", &[json!({ "rows": "not rows" }), json!({ "rows": [] })]);
        assert!(!ok);
        assert!(md.contains("2 ranks"), "{md}");
        assert!(md.contains("The ranks' rows do not read: rank 0:"), "{md}");
    }

    #[test]
    fn all_to_all_merge_takes_the_slowest_rank_and_the_all_to_all_busbw() {
        let dir = temp_dir("a2a");
        let bench = json!({ "world_size": 2, "versions": { "nccl": "2.28.9" }, "ranks": [
            rank(json!([row("raw", "equal", 1 << 20, 10.0, 5.0), row("pg", "equal", 1 << 20, 11.0, 6.0),
                        row("raw", "skewed", 1 << 20, 20.0, 5.0), row("pg", "skewed", 1 << 20, 21.0, 7.0)])),
            rank(json!([row("raw", "equal", 1 << 20, 12.0, 4.0), row("pg", "equal", 1 << 20, 13.0, 8.0),
                        row("raw", "skewed", 1 << 20, 19.0, 5.0), row("pg", "skewed", 1 << 20, 20.0, 6.0)])),
        ] });
        std::fs::write(dir.join("bench-all-to-all.json"), bench.to_string()).unwrap();
        let torch = json!({ "world_size": 2, "versions": { "torch": "2.11" }, "skewed_splits_check": splits_check(2),
            "rows": [{ "split": "equal", "bytes": 1 << 20, "time_us": 14.0, "host_enqueue_us": 30.0, "wait_us": 3.0 },
                     { "split": "skewed", "bytes": 1 << 20, "time_us": 25.0, "host_enqueue_us": 31.0, "wait_us": 3.0 }] });
        std::fs::write(dir.join("torch-all-to-all.json"), torch.to_string()).unwrap();
        assert!(merge(&dir, "all-to-all", "label").unwrap(), "every contestant at every size");
        let merged: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("all-to-all.json")).unwrap()).unwrap();
        let sizes = merged["sizes"].as_array().unwrap();
        assert_eq!(sizes.len(), 2);
        let equal = &sizes[0];
        assert_eq!(equal["split"], "equal");
        assert_eq!(equal["raw"]["time_us"], 12.0, "the slowest rank's time");
        assert_eq!(equal["pg"]["host_enqueue_us"], 8.0, "the slowest rank's host time");
        let algbw = (1u64 << 20) as f64 / 12e-6 / 1e9;
        assert_eq!(equal["raw"]["algbw_gbps"], algbw);
        assert_eq!(equal["raw"]["busbw_gbps"], algbw / 2.0, "(n-1)/n at n = 2");
        assert_eq!(equal["torch"]["time_us"], 14.0);
        assert_eq!(equal["pg_minus_raw_enqueue_us"], 3.0);
        let md = std::fs::read_to_string(dir.join("all-to-all.md")).unwrap();
        assert!(md.contains("w(a,b) = (a + b) % n + 1"), "the md defines the skewed splits");
        assert!(md.contains("| 1 MiB | skewed | 20.00 | 21.00 | 25.00 |"), "{md}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_torch_script_with_other_splits_is_refused() {
        let dir = temp_dir("splits");
        let bench = json!({ "ranks": [rank(json!([row("raw", "skewed", 1024, 1.0, 1.0), row("pg", "skewed", 1024, 1.0, 1.0)])),
                                      rank(json!([row("raw", "skewed", 1024, 1.0, 1.0), row("pg", "skewed", 1024, 1.0, 1.0)]))] });
        std::fs::write(dir.join("bench-all-to-all.json"), bench.to_string()).unwrap();
        let mut check = splits_check(2);
        check["input_splits"][1] = json!([500, 500]);
        let torch = json!({ "world_size": 2, "skewed_splits_check": check, "rows": [] });
        std::fs::write(dir.join("torch-all-to-all.json"), torch.to_string()).unwrap();
        let err = merge(&dir, "all-to-all", "").unwrap_err();
        assert!(err.contains("rank 1 of 2"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn p2p_at_world_one_says_not_applicable_and_gives_no_figures() {
        let dir = temp_dir("p2p1");
        let bench = json!({ "versions": {}, "ranks": [{ "rows": [], "not_applicable": RING_NOT_APPLICABLE,
                                                        "self_send_refused": "invalid argument: a Send to itself" }] });
        std::fs::write(dir.join("bench-p2p.json"), bench.to_string()).unwrap();
        let torch = json!({ "world_size": 1, "not_applicable": RING_NOT_APPLICABLE, "rows": [] });
        std::fs::write(dir.join("torch-p2p.json"), torch.to_string()).unwrap();
        assert!(merge(&dir, "p2p", "").unwrap(), "not applicable is no failure");
        let md = std::fs::read_to_string(dir.join("p2p.md")).unwrap();
        assert!(md.contains("not applicable at world size 1: a ring needs two ranks"), "{md}");
        assert!(!md.contains("| size |"), "no table of figures: {md}");
        let merged: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("p2p.json")).unwrap()).unwrap();
        assert_eq!(merged["not_applicable"], RING_NOT_APPLICABLE);
        assert_eq!(merged["sizes"], json!([]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn p2p_busbw_is_algbw_and_a_missing_contestant_fails_the_merge() {
        let dir = temp_dir("p2p2");
        let rows = json!([
            row("raw", "", 1 << 20, 10.0, 5.0),
            row("pg", "", 1 << 20, 10.0, 6.0),
            row("raw", "", 8 << 20, 50.0, 5.0)
        ]);
        let strip = |rows: Value| {
            Value::Array(
                rows.as_array()
                    .unwrap()
                    .iter()
                    .map(|r| {
                        let mut r = r.clone();
                        r.as_object_mut().unwrap().remove("split");
                        r
                    })
                    .collect(),
            )
        };
        let bench = json!({ "ranks": [rank(strip(rows.clone())), rank(strip(rows))] });
        std::fs::write(dir.join("bench-p2p.json"), bench.to_string()).unwrap();
        assert!(!merge(&dir, "p2p", "").unwrap(), "pg has no row at 8 MiB");
        let merged: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("p2p.json")).unwrap()).unwrap();
        let first = &merged["sizes"][0];
        assert_eq!(first["raw"]["busbw_gbps"], first["raw"]["algbw_gbps"]);
        assert!(first["split"].is_null());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn task_names_map_to_ops() {
        assert_eq!(op_of("bench-all-to-all"), Some("all-to-all"));
        assert_eq!(op_of("bench-p2p"), Some("p2p"));
        assert_eq!(op_of("bench"), None);
    }
}
