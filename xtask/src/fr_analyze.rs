//! `cargo xtask fr-analyze DIR`: reads every rank's flight-recorder dump and reports, per group, the first
//! collective where the ranks disagree or a rank is missing.
//!
//! The dumps are the JSON files the process group writes to `{dump_path_prefix}{rank}` (PyTorch's
//! `_dump_nccl_trace_json` layout).
//! Collectives are lined up by their `collective_seq_id`; the first sequence number that not every rank of the
//! group recorded, or that the ranks recorded as different ops (name, sizes, dtypes), is the divergence.
//! When every rank agrees, the report names the first collective that did not complete everywhere.
//! Entries marked `captured: true` (ops enqueued under stream capture, which run only inside graph launches the
//! recorder does not see) are left out; dumps without the field read as before.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::path::Path;

use serde_json::Value;

const HELP: &str = "\
cargo xtask fr-analyze DIR [--prefix PREFIX] [--trace OUT.json]

Reads every flight-recorder dump in DIR (only the files whose names start with PREFIX, when given) and
reports, per process group, the first collective where the ranks disagree or a rank is missing.
  --trace OUT.json   also write the dumps as one Chrome trace-event file (open it in Perfetto or
                     chrome://tracing): a process per rank, a track per group, each op a slice from its
                     creation to its completion (or to the dump's last time), the first divergence an instant
                     event on the ranks it names
";

/// One collective as one rank recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// `profiling_name`, e.g. `nccl:all_reduce`.
    pub name: String,
    /// `input_sizes` and `input_dtypes`, as JSON text.
    pub shape: String,
    /// `state`: `scheduled`, `started` or `completed`.
    pub state: String,
}

/// One group as one rank recorded it.
#[derive(Debug, Clone, Default)]
struct RankGroup {
    ranks: Vec<usize>,
    desc: String,
    ops: BTreeMap<u64, Op>,
}

/// What the analysis found in one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// Ranks of the group without a dump.
    NoDump(Vec<usize>),
    /// At `seq`, `missing` ranks have no entry while `present` ranks ran `op`.
    Missing {
        /// The sequence number.
        seq: u64,
        /// What the other ranks ran.
        op: String,
        /// Ranks without the op, with their last recorded sequence number.
        missing: Vec<(usize, Option<u64>)>,
        /// Ranks with the op.
        present: Vec<usize>,
    },
    /// At `seq`, the ranks recorded different ops; each variant with its ranks.
    Mismatch {
        /// The sequence number.
        seq: u64,
        /// Each distinct op with the ranks that ran it.
        variants: Vec<(String, Vec<usize>)>,
    },
    /// Every rank agrees; `seq` is the first collective not completed on every rank.
    NotCompleted {
        /// The sequence number.
        seq: u64,
        /// The op.
        op: String,
        /// Each rank's state.
        states: Vec<(usize, String)>,
    },
    /// Every rank agrees and every recorded collective completed.
    Consistent {
        /// The last sequence number.
        last_seq: Option<u64>,
    },
}

/// The report of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupReport {
    /// The group's name.
    pub name: String,
    /// Its description.
    pub desc: String,
    /// Its ranks (from `pg_config`).
    pub ranks: Vec<usize>,
    /// The ranks a dump was found for.
    pub dumped: Vec<usize>,
    /// What was found, most important first.
    pub findings: Vec<Finding>,
}

impl fmt::Display for GroupReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "group {} ({}): ranks {:?}, dumps from ranks {:?}", self.name, self.desc, self.ranks, self.dumped)?;
        for finding in &self.findings {
            match finding {
                Finding::NoDump(ranks) => writeln!(f, "  ranks {ranks:?} wrote no dump")?,
                Finding::Missing { seq, op, missing, present } => {
                    let last: Vec<String> = missing
                        .iter()
                        .map(|(r, last)| match last {
                            Some(s) => format!("rank {r} last recorded seq {s}"),
                            None => format!("rank {r} recorded no collective"),
                        })
                        .collect();
                    writeln!(
                        f,
                        "  FIRST DIVERGENCE at collective seq {seq} ({op}): ranks {:?} never issued it ({}); ranks {present:?} did",
                        missing.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                        last.join(", ")
                    )?;
                }
                Finding::Mismatch { seq, variants } => {
                    let mut text = String::new();
                    for (op, ranks) in variants {
                        let _ = write!(text, "; {op} on ranks {ranks:?}");
                    }
                    writeln!(f, "  FIRST DIVERGENCE at collective seq {seq}: the ranks ran different ops{text}")?;
                }
                Finding::NotCompleted { seq, op, states } => {
                    let states: Vec<String> = states.iter().map(|(r, s)| format!("rank {r} {s}")).collect();
                    writeln!(
                        f,
                        "  every rank agrees; first collective not completed: seq {seq} ({op}): {}",
                        states.join(", ")
                    )?;
                }
                Finding::Consistent { last_seq } => {
                    writeln!(f, "  every rank agrees and completed every recorded collective (last seq {last_seq:?})")?;
                }
            }
        }
        Ok(())
    }
}

/// The rank a dump belongs to: its `rank` field, else the digits that end its file name.
pub fn rank_of(file: &str, dump: &Value) -> Option<usize> {
    if let Some(rank) = dump.get("rank").and_then(Value::as_u64) {
        return usize::try_from(rank).ok();
    }
    let digits: String = file.chars().rev().take_while(char::is_ascii_digit).collect();
    digits.chars().rev().collect::<String>().parse().ok()
}

fn parse_ranks(config: &Value) -> Vec<usize> {
    let ranks = match config.get("ranks") {
        Some(Value::String(text)) => serde_json::from_str::<Value>(text).unwrap_or(Value::Null),
        Some(other) => other.clone(),
        None => Value::Null,
    };
    ranks
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_u64).filter_map(|r| usize::try_from(r).ok()).collect())
        .unwrap_or_default()
}

/// Splits one dump into its groups.
fn groups_of(dump: &Value) -> BTreeMap<String, RankGroup> {
    let mut groups: BTreeMap<String, RankGroup> = BTreeMap::new();
    if let Some(config) = dump.get("pg_config").and_then(Value::as_object) {
        for (name, pg) in config {
            let group = groups.entry(name.clone()).or_default();
            group.ranks = parse_ranks(pg);
            group.desc = pg.get("desc").and_then(Value::as_str).unwrap_or_default().to_owned();
        }
    }
    for entry in dump.get("entries").and_then(Value::as_array).into_iter().flatten() {
        let flag = |field: &str| entry.get(field).and_then(Value::as_bool).unwrap_or(false);
        if flag("is_p2p") || flag("captured") {
            continue;
        }
        let name = entry.pointer("/process_group/0").and_then(Value::as_str).unwrap_or("?").to_owned();
        let Some(seq) = entry.get("collective_seq_id").and_then(Value::as_u64) else { continue };
        let text = |field: &str| entry.get(field).map(Value::to_string).unwrap_or_default();
        let op = Op {
            name: entry.get("profiling_name").and_then(Value::as_str).unwrap_or("?").to_owned(),
            shape: format!("{} {}", text("input_sizes"), text("input_dtypes")),
            state: entry.get("state").and_then(Value::as_str).unwrap_or("?").to_owned(),
        };
        groups.entry(name).or_default().ops.insert(seq, op);
    }
    groups
}

/// Analyses the dumps, given as (file name, parsed JSON).
pub fn analyze(dumps: &[(String, Value)]) -> Vec<GroupReport> {
    // group name -> rank -> what that rank recorded.
    let mut by_group: BTreeMap<String, BTreeMap<usize, RankGroup>> = BTreeMap::new();
    for (file, dump) in dumps {
        let Some(rank) = rank_of(file, dump) else { continue };
        for (name, group) in groups_of(dump) {
            by_group.entry(name).or_default().insert(rank, group);
        }
    }
    by_group.into_iter().map(|(name, ranks)| analyze_group(name, &ranks)).collect()
}

fn analyze_group(name: String, ranks: &BTreeMap<usize, RankGroup>) -> GroupReport {
    let mut members: BTreeSet<usize> = ranks.values().flat_map(|g| g.ranks.iter().copied()).collect();
    members.extend(ranks.keys());
    let dumped: Vec<usize> = ranks.keys().copied().collect();
    let desc = ranks.values().map(|g| g.desc.clone()).find(|d| !d.is_empty()).unwrap_or_default();
    let mut findings = Vec::new();
    let no_dump: Vec<usize> = members.iter().copied().filter(|r| !ranks.contains_key(r)).collect();
    if !no_dump.is_empty() {
        findings.push(Finding::NoDump(no_dump));
    }
    // The ring may have dropped old entries: only the window every non-empty rank still holds is compared.
    let start = ranks.values().filter_map(|g| g.ops.keys().next().copied()).max();
    let end = ranks.values().filter_map(|g| g.ops.keys().next_back().copied()).max();
    let (Some(start), Some(end)) = (start, end) else {
        findings.push(Finding::Consistent { last_seq: None });
        return GroupReport { name, desc, ranks: members.into_iter().collect(), dumped, findings };
    };
    let mut verdict = Finding::Consistent { last_seq: Some(end) };
    for seq in start..=end {
        let present: Vec<(usize, &Op)> = ranks.iter().filter_map(|(r, g)| g.ops.get(&seq).map(|op| (*r, op))).collect();
        if present.len() < ranks.len() {
            let missing = ranks
                .iter()
                .filter(|(_, g)| !g.ops.contains_key(&seq))
                .map(|(r, g)| (*r, g.ops.range(..seq).next_back().map(|(s, _)| *s)))
                .collect();
            let op = present.first().map(|(_, op)| op.name.clone()).unwrap_or_default();
            verdict = Finding::Missing { seq, op, missing, present: present.iter().map(|(r, _)| *r).collect() };
            break;
        }
        let mut variants: Vec<(String, Vec<usize>)> = Vec::new();
        for (rank, op) in &present {
            let key = format!("{} {}", op.name, op.shape);
            match variants.iter_mut().find(|(k, _)| *k == key) {
                Some((_, list)) => list.push(*rank),
                None => variants.push((key, vec![*rank])),
            }
        }
        if variants.len() > 1 {
            verdict = Finding::Mismatch { seq, variants };
            break;
        }
        if present.iter().any(|(_, op)| op.state != "completed") && !matches!(verdict, Finding::NotCompleted { .. }) {
            let states = present.iter().map(|(r, op)| (*r, op.state.clone())).collect();
            verdict = Finding::NotCompleted { seq, op: present[0].1.name.clone(), states };
        }
    }
    findings.push(verdict);
    GroupReport { name, desc, ranks: members.into_iter().collect(), dumped, findings }
}

/// Reads the dumps in `dir` whose file names start with `prefix`.
pub fn read_dir(dir: &Path, prefix: &str) -> Result<Vec<(String, Value)>, String> {
    let mut dumps = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut paths: Vec<_> = entries.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.is_file()).collect();
    paths.sort();
    for path in paths {
        let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !file.starts_with(prefix) || file.ends_with(".partial") {
            continue;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        match serde_json::from_str::<Value>(&text) {
            Ok(dump) if dump.get("entries").is_some() => dumps.push((file, dump)),
            _ => eprintln!("skipping {}: not a flight-recorder JSON dump", path.display()),
        }
    }
    Ok(dumps)
}

/// The task's entry point.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut dir = None;
    let mut prefix = String::new();
    let mut trace = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            "--prefix" | "-p" => prefix = args.next().ok_or("--prefix needs a value")?.clone(),
            "--trace" => trace = Some(args.next().ok_or("--trace needs a file")?.clone()),
            other if dir.is_none() && !other.starts_with('-') => dir = Some(other.to_owned()),
            other => return Err(format!("unexpected argument '{other}'\n\n{HELP}")),
        }
    }
    let dir = dir.ok_or_else(|| format!("fr-analyze needs a directory\n\n{HELP}"))?;
    let dumps = read_dir(Path::new(&dir), &prefix)?;
    if dumps.is_empty() {
        return Err(format!("no flight-recorder dumps in {dir}"));
    }
    println!("{} dumps read from {dir}", dumps.len());
    let reports = analyze(&dumps);
    for report in &reports {
        print!("{report}");
    }
    if let Some(path) = trace {
        let ranked: Vec<(usize, Value)> =
            dumps.iter().filter_map(|(file, dump)| rank_of(file, dump).map(|rank| (rank, dump.clone()))).collect();
        let text = crate::fr_trace::trace(&ranked, &reports).to_string();
        std::fs::write(&path, text).map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("wrote {path} (open it in Perfetto or chrome://tracing)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A dump of `rank` in a group of `size` whose collectives are (seq, name, state).
    fn dump(rank: usize, size: usize, ops: &[(u64, &str, &str)]) -> (String, Value) {
        let ranks: Vec<String> = (0..size).map(|r| r.to_string()).collect();
        let entries: Vec<Value> = ops
            .iter()
            .map(|(seq, name, state)| {
                json!({
                    "process_group": ["0", "default_pg"], "collective_seq_id": seq, "p2p_seq_id": 0,
                    "profiling_name": name, "input_sizes": [[4]], "input_dtypes": ["Float"],
                    "state": state, "is_p2p": false,
                })
            })
            .collect();
        let dump = json!({
            "version": "2.10",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": format!("[{}]", ranks.join(", "))}},
            "entries": entries,
        });
        (format!("nccl_trace_rank_{rank}"), dump)
    }

    fn check(dumps: &[(String, Value)], expected: &Finding, text: &str) {
        let reports = analyze(dumps);
        assert_eq!(reports.len(), 1);
        assert_eq!(reports[0].findings.last(), Some(expected), "{}", reports[0]);
        assert!(reports[0].to_string().contains(text), "expected {text:?} in:\n{}", reports[0]);
    }

    const AR: &str = "nccl:all_reduce";

    /// Dumps, the last finding expected, and a phrase the printed report must contain.
    type Case = (Vec<(String, Value)>, Finding, &'static str);

    #[test]
    fn a_rank_that_skipped_a_collective_is_the_first_divergence() {
        let done = [(1, AR, "completed"), (2, AR, "completed")];
        let stuck = [(1, AR, "completed"), (2, AR, "completed"), (3, AR, "started")];
        let dumps = [dump(0, 3, &stuck), dump(1, 3, &done), dump(2, 3, &stuck)];
        let expected = Finding::Missing { seq: 3, op: AR.into(), missing: vec![(1, Some(2))], present: vec![0, 2] };
        check(&dumps, &expected, "FIRST DIVERGENCE at collective seq 3 (nccl:all_reduce): ranks [1] never issued it");
    }

    #[test]
    fn findings_cover_mismatch_hang_missing_dumps_and_agreement() {
        let cases: Vec<Case> = vec![
            (
                vec![
                    dump(0, 2, &[(1, AR, "completed"), (2, AR, "scheduled")]),
                    dump(1, 2, &[(1, AR, "completed"), (2, "nccl:broadcast", "scheduled")]),
                ],
                Finding::Mismatch {
                    seq: 2,
                    variants: vec![
                        (format!("{AR} [[4]] [\"Float\"]"), vec![0]),
                        ("nccl:broadcast [[4]] [\"Float\"]".into(), vec![1]),
                    ],
                },
                "the ranks ran different ops",
            ),
            (
                vec![
                    dump(0, 2, &[(1, AR, "completed"), (2, AR, "started")]),
                    dump(1, 2, &[(1, AR, "completed"), (2, AR, "scheduled")]),
                ],
                Finding::NotCompleted {
                    seq: 2,
                    op: AR.into(),
                    states: vec![(0, "started".into()), (1, "scheduled".into())],
                },
                "first collective not completed: seq 2",
            ),
            (
                vec![dump(0, 2, &[(7, AR, "completed")]), dump(1, 2, &[(6, AR, "completed"), (7, AR, "completed")])],
                Finding::Consistent { last_seq: Some(7) },
                "completed every recorded collective",
            ),
            (
                vec![dump(0, 3, &[(1, AR, "completed")]), dump(2, 3, &[(1, AR, "completed")])],
                Finding::Consistent { last_seq: Some(1) },
                "ranks [1] wrote no dump",
            ),
            (
                vec![dump(0, 2, &[(1, AR, "started")]), dump(1, 2, &[])],
                Finding::Missing { seq: 1, op: AR.into(), missing: vec![(1, None)], present: vec![0] },
                "rank 1 recorded no collective",
            ),
        ];
        for (dumps, expected, text) in &cases {
            check(dumps, expected, text);
        }
    }

    /// Captured ops stay "scheduled" for ever (they run only in graph launches): they are no hang.
    #[test]
    fn captured_entries_are_left_out() {
        let mut ranks = vec![dump(0, 2, &[(1, AR, "completed"), (2, AR, "completed")]), dump(1, 2, &[])];
        ranks[1] = dump(1, 2, &[(1, AR, "scheduled"), (2, AR, "completed")]);
        for (_, dump) in &mut ranks {
            dump["entries"][0]["captured"] = json!(true);
        }
        check(&ranks, &Finding::Consistent { last_seq: Some(2) }, "completed every recorded collective");
        // The same dumps without the mark: rank 1's seq 1 is not completed.
        for (_, dump) in &mut ranks {
            dump["entries"][0].as_object_mut().map(|e| e.remove("captured"));
        }
        let states = vec![(0, "completed".into()), (1, "scheduled".into())];
        check(&ranks, &Finding::NotCompleted { seq: 1, op: AR.into(), states }, "first collective not completed");
    }

    #[test]
    fn the_rank_comes_from_the_field_or_the_file_name() {
        assert_eq!(rank_of("nccl_trace_rank_12", &json!({})), Some(12));
        assert_eq!(rank_of("whatever", &json!({"rank": 3})), Some(3));
        assert_eq!(rank_of("no_digits", &json!({})), None);
    }

    /// The dumps of list ops, batches and coalesced blocks run on the simulated backend read as one agreeing
    /// history; a rank whose list op had other sizes is the first divergence.
    #[test]
    fn list_ops_batches_and_coalesced_blocks_from_the_mock_are_read() {
        use std::sync::Arc;

        use pg_core::{DType, Device as _, Options, P2POp, ProcessGroup, ReduceOp};

        let world = pg_mock::World::new(pg_mock::WorldConfig { devices: 2, ..Default::default() });
        let store = world.store();
        let dumps = world.run(2, |rank, device| {
            let pg =
                ProcessGroup::<pg_mock::Mock>::new(Arc::clone(&store), rank, 2, device.clone(), Options::default())
                    .unwrap();
            let buffers: Vec<_> = (0..2).map(|_| device.alloc(DType::F32, 3).unwrap()).collect();
            let outputs: Vec<_> = (0..2).map(|_| device.alloc(DType::F32, 3).unwrap()).collect();
            pg.all_to_all(&outputs, &buffers).unwrap().wait().unwrap();
            pg.coalesced(|c| c.all_reduce(&buffers[0], ReduceOp::Sum)).unwrap().wait().unwrap();
            let peer = 1 - rank;
            let batch = [P2POp::send(&buffers[0], peer), P2POp::recv(&buffers[1], peer)];
            pg.batch_isend_irecv(&batch).unwrap().wait().unwrap();
            device.synchronize().unwrap();
            let dump: Value = serde_json::from_str(&pg.flight_recorder_json()).unwrap();
            (format!("nccl_trace_rank_{rank}"), dump)
        });
        let names: Vec<&str> =
            dumps[0].1["entries"].as_array().unwrap().iter().map(|e| e["profiling_name"].as_str().unwrap()).collect();
        assert_eq!(names, ["nccl:all_to_all", "nccl:coalesced", "nccl:batch_p2p"]);
        assert_eq!(dumps[0].1["entries"][0]["input_sizes"], json!([[3], [3]]));
        check(&dumps, &Finding::Consistent { last_seq: Some(3) }, "");
        let mut skewed = dumps.clone();
        skewed[1].1["entries"][0]["input_sizes"] = json!([[3], [4]]);
        let reports = analyze(&skewed);
        assert!(matches!(reports[0].findings.last(), Some(Finding::Mismatch { seq: 1, .. })), "{}", reports[0]);
    }
}
