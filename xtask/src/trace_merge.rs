//! `cargo xtask trace-merge DIR --out OUT.json`: joins the rank files a traced run wrote (`PG_TRACE=DIR`,
//! `DIR/rank{r}.json`) into one Chrome trace-event file, one process per rank on one clock, and says how well
//! the ranks line up: for each collective every rank ran, how far apart its device ends are across ranks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

const HELP: &str = "\
cargo xtask trace-merge DIR [--out OUT.json]

Joins the rank files of a traced run (PG_TRACE=DIR or Options::trace_dir: DIR/rank0.json, DIR/rank1.json, ...)
into one Chrome trace-event file (open it in Perfetto or chrome://tracing): one process per rank, for each
group a track of host enqueues and a track per communication stream with each op's device span, every time in
microseconds since the UNIX epoch. Prints per rank the ops with and without device times, and per group how far
apart the ranks' device ends of one collective are (the median and the largest over its collectives): a
collective ends at about one moment everywhere, so this is the alignment error plus the skew of the op itself.
  --out OUT.json   where the merged file goes (default DIR/merged.json)
";

/// The rank files in `dir` (`rank{r}.json`), by rank.
fn rank_files(dir: &Path) -> Result<Vec<(usize, PathBuf)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let rank = name.strip_prefix("rank").and_then(|n| n.strip_suffix(".json")).and_then(|n| n.parse().ok());
        if let Some(rank) = rank {
            files.push((rank, path));
        }
    }
    files.sort();
    Ok(files)
}

/// How far apart the ranks' device ends of each collective are, per group: (group, collectives every rank of the
/// merge ran, median spread us, largest spread us).
pub fn alignment(merged: &Value, ranks: usize) -> Vec<(String, usize, f64, f64)> {
    // (group, seq) -> device end per rank.
    let mut ends: BTreeMap<(String, u64), Vec<f64>> = BTreeMap::new();
    for event in merged["traceEvents"].as_array().into_iter().flatten() {
        let args = &event["args"];
        if event["ph"] != "X" || args["side"] != "device" || args["is_p2p"] != false {
            continue;
        }
        let (Some(group), Some(seq), Some(ts), Some(dur)) =
            (args["group"].as_str(), args["seq"].as_u64(), event["ts"].as_f64(), event["dur"].as_f64())
        else {
            continue;
        };
        ends.entry((group.to_owned(), seq)).or_default().push(ts + dur);
    }
    let mut spreads: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for ((group, _), times) in ends {
        if times.len() == ranks {
            let low = times.iter().copied().fold(f64::INFINITY, f64::min);
            let high = times.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            spreads.entry(group).or_default().push(high - low);
        }
    }
    spreads
        .into_iter()
        .map(|(group, mut values)| {
            values.sort_by(f64::total_cmp);
            let median = values[values.len() / 2];
            let largest = values.last().copied().unwrap_or(f64::NAN);
            (group, values.len(), median, largest)
        })
        .collect()
}

/// Merges the rank files of `dir` into `out`; returns the merged document.
pub fn merge_dir(dir: &Path, out: &Path) -> Result<Value, String> {
    let files = rank_files(dir)?;
    if files.is_empty() {
        return Err(format!("no rank files (rank{{r}}.json) in {}", dir.display()));
    }
    let mut documents = Vec::new();
    for (rank, path) in &files {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let document: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        for group in document["otherData"]["groups"].as_array().into_iter().flatten() {
            let (name, desc, uncertainty) = (&group["group"], &group["desc"], &group["reference_uncertainty_us"]);
            let (timed, untimed, dropped) = (&group["ops_timed"], &group["ops_untimed"], &group["ops_dropped"]);
            println!(
                "rank {rank}: group {name} ({desc}): {timed} ops with device times, {untimed} without, {dropped} \
                 dropped; reference known to {uncertainty} us"
            );
        }
        documents.push(document);
    }
    let merged = pg_conformance::traces::merge(&documents)?;
    for (group, count, median, largest) in alignment(&merged, files.len()) {
        println!(
            "group {group}: {count} collectives on all {} ranks; device ends apart by {median:.1} us (median), \
             {largest:.1} us (largest)",
            files.len()
        );
    }
    let text = serde_json::to_string(&merged).map_err(|e| e.to_string())?;
    std::fs::write(out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("wrote {} ({} ranks; open it in Perfetto or chrome://tracing)", out.display(), files.len());
    Ok(merged)
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut dir = None;
    let mut out = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(());
            }
            "--out" | "-o" => out = Some(PathBuf::from(args.next().ok_or("--out needs a file")?)),
            other if dir.is_none() && !other.starts_with('-') => dir = Some(PathBuf::from(other)),
            other => return Err(format!("unexpected argument '{other}'\n\n{HELP}")),
        }
    }
    let dir = dir.ok_or_else(|| format!("trace-merge needs a directory\n\n{HELP}"))?;
    let out = out.unwrap_or_else(|| dir.join("merged.json"));
    merge_dir(&dir, &out).map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pg_core::{DType, Device as _, Options, ProcessGroup, ReduceOp};
    use pg_mock::{Mock, World, WorldConfig};

    use super::*;

    #[test]
    fn the_rank_files_of_a_traced_mock_run_merge_into_one_aligned_trace() {
        let dir = std::env::temp_dir().join(format!("pg-xtask-trace-merge-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let world = World::new(WorldConfig::with_devices(3));
        let store = world.store();
        let traced = dir.clone();
        world.run(3, move |rank, device| {
            let options = Options::builder().trace_dir(Some(traced.clone())).build();
            let group = ProcessGroup::<Mock>::new(Arc::clone(&store), rank, 3, device.clone(), options).unwrap();
            let buffer = device.alloc(DType::F32, 256).unwrap();
            for _ in 0..4 {
                group.all_reduce(&buffer, ReduceOp::Sum).unwrap().wait().unwrap();
            }
            device.synchronize().unwrap();
            group.shutdown().unwrap();
        });
        // A file that is no rank's is left alone.
        std::fs::write(dir.join("notes.json"), "{}").unwrap();
        let out = dir.join("merged.json");
        let merged = merge_dir(&dir, &out).unwrap();
        let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        assert_eq!(written, merged);
        let events = merged["traceEvents"].as_array().unwrap();
        for event in events {
            for field in ["ph", "pid", "tid", "name"] {
                assert!(event.get(field).is_some(), "{field} missing in {event}");
            }
        }
        let processes: Vec<u64> =
            events.iter().filter(|e| e["name"] == "process_name").map(|e| e["pid"].as_u64().unwrap()).collect();
        assert_eq!(processes, [0, 1, 2], "every rank, once");
        let device_slices = events.iter().filter(|e| e["ph"] == "X" && e["args"]["side"] == "device").count();
        assert_eq!(device_slices, 3 * 4);
        // On the virtual clock every rank's all_reduce ends at one instant.
        assert_eq!(alignment(&merged, 3), [("0".to_owned(), 4, 0.0, 0.0)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_empty_directory_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("pg-xtask-trace-merge-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let error = merge_dir(&dir, &dir.join("out.json")).unwrap_err();
        assert!(error.contains("no rank files"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
