//! `cargo xtask fr-analyze DIR --trace OUT.json`: the ranks' flight-recorder dumps as one Chrome trace-event
//! file (Perfetto, chrome://tracing): one process per rank, one track per group, each op a slice from its
//! creation (or the start the watchdog saw) to its completion, or to the last time the dump knows for an op that
//! never completed; the first divergence `fr-analyze` finds is an instant event on the ranks it names.

use std::collections::BTreeMap;

use pg_conformance::traces::from_serde;
use pg_core::json::Value as PgValue;
use pg_core::json_object;
use pg_core::trace_event::{TraceEvents, Track};
use serde_json::Value;

use crate::fr_analyze::{Finding, GroupReport};

/// The time fields of an entry, in nanoseconds, that a slice may start or end at.
const TIME_FIELDS: [&str; 3] = ["time_created_ns", "time_discovered_started_ns", "time_discovered_completed_ns"];

/// The trace of `dumps` (rank, parsed JSON), with `reports` (the analysis of the same dumps) marking the first
/// divergence of each group.
pub fn trace(dumps: &[(usize, Value)], reports: &[GroupReport]) -> PgValue {
    let mut events = TraceEvents::new();
    let ranks: Vec<usize> = dumps.iter().map(|(rank, _)| *rank).collect();
    for rank in &ranks {
        events.process(*rank as u64, &format!("rank {rank}"), *rank as i64);
    }
    add(&mut events, dumps, reports, 0);
    events.into_json()
}

/// Adds the ranks' dumps and findings to `events`: rank `r`'s group tracks go on process `r`, numbered from
/// `first_tid` on (so that they can sit beside other tracks of the same process); returns the next free number.
pub fn add(events: &mut TraceEvents, dumps: &[(usize, Value)], reports: &[GroupReport], first_tid: u64) -> u64 {
    // Every group any rank names gets one track number, the same on every rank.
    let mut tracks: BTreeMap<String, u64> = BTreeMap::new();
    for (_, dump) in dumps {
        for entry in entries(dump) {
            let next = first_tid + tracks.len() as u64;
            tracks.entry(group_of(entry)).or_insert(next);
        }
    }
    for report in reports {
        let next = first_tid + tracks.len() as u64;
        tracks.entry(report.name.clone()).or_insert(next);
    }
    for (rank, dump) in dumps {
        let pid = *rank as u64;
        for (group, tid) in &tracks {
            let desc = dump.pointer(&format!("/pg_config/{group}/desc")).and_then(Value::as_str).unwrap_or_default();
            let name = if desc.is_empty() { format!("group {group}") } else { format!("group {group} ({desc})") };
            events.thread(Track::new(pid, *tid), &name, *tid as i64);
        }
        // An op that never completed runs to the last time this rank's dump knows.
        let last = last_time(dump);
        for entry in entries(dump) {
            let time = |field: &str| entry.get(field).and_then(Value::as_u64);
            let Some(start) = time("time_created_ns").or_else(|| time("time_discovered_started_ns")) else { continue };
            let end = time("time_discovered_completed_ns").or(last).unwrap_or(start).max(start);
            let name = entry.get("profiling_name").and_then(Value::as_str).unwrap_or("?");
            let field = |f: &str| entry.get(f).map_or(PgValue::Null, from_serde);
            let args = json_object! {
                "state": field("state"), "collective_seq_id": field("collective_seq_id"),
                "p2p_seq_id": field("p2p_seq_id"), "input_sizes": field("input_sizes"),
                "input_dtypes": field("input_dtypes"), "output_sizes": field("output_sizes"),
                "output_dtypes": field("output_dtypes"), "completed": time("time_discovered_completed_ns").is_some(),
            };
            events.slice(Track::new(pid, tracks[&group_of(entry)]), name, "op", start, end, args);
        }
    }
    for report in reports {
        let tid = tracks[&report.name];
        for finding in &report.findings {
            for (rank, name, why) in divergence(finding) {
                let at = dumps.iter().find(|(r, _)| *r == rank).and_then(|(_, dump)| last_time(dump)).unwrap_or(0);
                let args = json_object! {"group": &report.name, "why": why};
                events.process_instant(Track::new(rank as u64, tid), &name, "divergence", at, args);
            }
        }
    }
    first_tid + tracks.len() as u64
}

/// The last time, in nanoseconds, that any entry of `dump` names.
fn last_time(dump: &Value) -> Option<u64> {
    entries(dump).flat_map(|e| TIME_FIELDS.iter().filter_map(|f| e.get(*f).and_then(Value::as_u64))).max()
}

/// The instant events of one finding: (rank, name, why), for the ranks the finding names.
fn divergence(finding: &Finding) -> Vec<(usize, String, String)> {
    match finding {
        Finding::Missing { seq, op, missing, present } => missing
            .iter()
            .map(|(rank, last)| {
                let last = last.map_or("nothing".to_owned(), |s| format!("seq {s}"));
                let why = format!("never issued {op} seq {seq} (last recorded {last}); ranks {present:?} did");
                (*rank, format!("FIRST DIVERGENCE: never issued seq {seq}"), why)
            })
            .collect(),
        Finding::Mismatch { seq, variants } => variants
            .iter()
            .flat_map(|(op, ranks)| {
                ranks
                    .iter()
                    .map(move |rank| (*rank, format!("FIRST DIVERGENCE: seq {seq} mismatch"), format!("ran {op}")))
            })
            .collect(),
        Finding::NotCompleted { seq, op, states } => states
            .iter()
            .filter(|(_, state)| state != "completed")
            .map(|(rank, state)| (*rank, format!("not completed: seq {seq}"), format!("{op} {state}")))
            .collect(),
        Finding::NoDump(_) | Finding::Consistent { .. } => Vec::new(),
    }
}

fn entries(dump: &Value) -> impl Iterator<Item = &Value> {
    dump.get("entries").and_then(Value::as_array).into_iter().flatten()
}

fn group_of(entry: &Value) -> String {
    entry.pointer("/process_group/0").and_then(Value::as_str).unwrap_or("?").to_owned()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Rank `rank`'s dump of a 4-rank group that ran all_reduces 1..=`last`, each created at `seq` ms and completed
    /// half a millisecond later, except `stuck` (started, never completed).
    fn dump(rank: usize, last: u64, stuck: Option<u64>) -> (usize, Value) {
        let entries: Vec<Value> = (1..=last)
            .map(|seq| {
                let created = seq * 1_000_000;
                let done = (Some(seq) != stuck).then_some(created + 500_000);
                json!({
                    "process_group": ["0", "default_pg"], "collective_seq_id": seq, "p2p_seq_id": 0,
                    "profiling_name": "nccl:all_reduce", "input_sizes": [[1024]], "input_dtypes": ["Float"],
                    "output_sizes": [[1024]], "output_dtypes": ["Float"], "is_p2p": false,
                    "state": if done.is_some() { "completed" } else { "started" },
                    "time_created_ns": created, "time_discovered_completed_ns": done,
                })
            })
            .collect();
        let dump = json!({
            "rank": rank,
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "entries": entries,
        });
        (rank, dump)
    }

    /// Fault-matrix scenario 1's shape: ranks 0, 2, 3 hang in seq 5, which rank 1 never issued.
    fn scenario_1() -> Value {
        let dumps = vec![dump(0, 5, Some(5)), dump(1, 4, None), dump(2, 5, Some(5)), dump(3, 5, Some(5))];
        let named: Vec<(String, Value)> =
            dumps.iter().map(|(rank, dump)| (format!("nccl_trace_rank_{rank}"), dump.clone())).collect();
        pg_conformance::traces::to_serde(&trace(&dumps, &crate::fr_analyze::analyze(&named)))
    }

    #[test]
    fn every_event_has_the_trace_event_fields() {
        let trace = scenario_1();
        let events = trace["traceEvents"].as_array().expect("traceEvents");
        assert!(!events.is_empty());
        for event in events {
            for field in ["ph", "pid", "tid", "name"] {
                assert!(event.get(field).is_some(), "{field} missing in {event}");
            }
            if event["ph"] != "M" {
                assert!(event["ts"].is_number(), "ts missing in {event}");
            }
        }
        let names: Vec<&str> =
            events.iter().filter(|e| e["name"] == "process_name").filter_map(|e| e["args"]["name"].as_str()).collect();
        assert_eq!(names, ["rank 0", "rank 1", "rank 2", "rank 3"]);
    }

    #[test]
    fn each_op_is_a_slice_and_a_hung_op_runs_to_the_end_of_the_dump() {
        let trace = scenario_1();
        let slices: Vec<&Value> = trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(slices.len(), 5 + 4 + 5 + 5, "one slice per entry");
        let seq = |rank: u64, seq: u64| {
            *slices.iter().find(|e| e["pid"] == rank && e["args"]["collective_seq_id"] == seq).expect("the slice")
        };
        assert_eq!(seq(0, 1)["ts"], 1000.0);
        assert_eq!(seq(0, 1)["dur"], 500.0);
        // Rank 0's seq 5 never completed: it lasts to the dump's last time, its own creation (5 ms).
        assert_eq!(seq(0, 5)["args"]["completed"], false);
        assert_eq!(seq(0, 5)["args"]["state"], "started");
    }

    #[test]
    fn the_first_divergence_marks_the_rank_that_never_issued_the_op() {
        let trace = scenario_1();
        let instants: Vec<&Value> =
            trace["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "i").collect();
        assert_eq!(instants.len(), 1, "{instants:?}");
        assert_eq!(instants[0]["pid"], 1);
        let name = instants[0]["name"].as_str().unwrap();
        assert!(name.contains("never issued seq 5"), "{name}");
        let why = instants[0]["args"]["why"].as_str().unwrap();
        assert!(why.contains("last recorded seq 4") && why.contains("[0, 2, 3]"), "{why}");
    }
}
