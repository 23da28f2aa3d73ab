//! Chrome's trace-event JSON (what Perfetto and chrome://tracing open): the one writer every pg timeline goes
//! through, the mock's simulated streams, the flight-recorder dumps `cargo xtask fr-analyze --trace` lines up,
//! and a real run's ops under `PG_TRACE`.
//!
//! A trace is a list of events, each on a track: a process (`pid`) and a thread (`tid`) of it, named by metadata
//! events. Times go in as nanoseconds and come out as the format's microseconds. Slices (`ph: "X"`) have a start
//! and a duration, instants (`ph: "i"`) a time, and a flow (`ph: "s"` then `ph: "f"`) is an arrow from one
//! slice to another: each end is given at a slice's start on its track, where both viewers bind it.

use serde_json::{json, Value};

/// Where an event goes: a process and a thread of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Track {
    /// The process (a rank, a device).
    pub pid: u64,
    /// The thread (a stream, a host thread, a group).
    pub tid: u64,
}

impl Track {
    /// Thread `tid` of process `pid`.
    pub fn new(pid: u64, tid: u64) -> Self {
        Self { pid, tid }
    }
}

/// Nanoseconds to the format's microseconds.
fn micros(ns: u64) -> f64 {
    ns as f64 / 1000.0
}

/// A trace being built: add tracks and events, then take the JSON document.
#[derive(Debug, Clone, Default)]
pub struct TraceEvents {
    events: Vec<Value>,
    next_flow: u64,
}

impl TraceEvents {
    /// An empty trace.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty trace whose flows take ids after `first`: traces rendered apart and joined into one file keep
    /// their arrows apart by giving each its own range.
    pub fn with_first_flow_id(first: u64) -> Self {
        Self { events: Vec::new(), next_flow: first }
    }

    /// Names process `pid`; `sort` orders the processes in the viewer.
    pub fn process(&mut self, pid: u64, name: &str, sort: i64) {
        self.events.push(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}));
        self.events
            .push(json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}}));
    }

    /// Names a track; `sort` orders the tracks of its process in the viewer.
    pub fn thread(&mut self, track: Track, name: &str, sort: i64) {
        let (pid, tid) = (track.pid, track.tid);
        self.events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}));
        self.events.push(
            json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort}}),
        );
    }

    /// A slice from `start_ns` to `end_ns` (an end before the start is taken as the start).
    pub fn slice(&mut self, track: Track, name: &str, cat: &str, start_ns: u64, end_ns: u64, args: Value) {
        self.events.push(json!({
            "ph": "X", "name": name, "cat": cat, "pid": track.pid, "tid": track.tid,
            "ts": micros(start_ns), "dur": micros(end_ns.saturating_sub(start_ns)), "args": args,
        }));
    }

    /// An instant at `at_ns`, drawn on its track.
    pub fn instant(&mut self, track: Track, name: &str, cat: &str, at_ns: u64, args: Value) {
        self.events.push(json!({
            "ph": "i", "s": "t", "name": name, "cat": cat, "pid": track.pid, "tid": track.tid, "ts": micros(at_ns),
            "args": args,
        }));
    }

    /// An instant at `at_ns` drawn across its whole process (a finding about a rank).
    pub fn process_instant(&mut self, track: Track, name: &str, cat: &str, at_ns: u64, args: Value) {
        self.events.push(json!({
            "ph": "i", "s": "p", "name": name, "cat": cat, "pid": track.pid, "tid": track.tid, "ts": micros(at_ns),
            "args": args,
        }));
    }

    /// An arrow from the slice that starts at `from_ns` on `from` to the slice that starts at `to_ns` on `to`
    /// (both slices added with the same `cat`); returns the flow's id.
    pub fn flow(&mut self, name: &str, cat: &str, (from, from_ns): (Track, u64), (to, to_ns): (Track, u64)) -> u64 {
        self.next_flow += 1;
        let id = self.next_flow;
        self.events.push(json!({
            "ph": "s", "name": name, "cat": cat, "id": id, "pid": from.pid, "tid": from.tid, "ts": micros(from_ns),
        }));
        self.events.push(json!({
            "ph": "f", "bp": "e", "name": name, "cat": cat, "id": id, "pid": to.pid, "tid": to.tid,
            "ts": micros(to_ns),
        }));
        id
    }

    /// How many events (metadata included) the trace holds.
    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Whether the trace holds no event.
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// The JSON document: `{"traceEvents": [...], "displayTimeUnit": "ms"}`.
    pub fn into_json(self) -> Value {
        json!({"traceEvents": self.events, "displayTimeUnit": "ms"})
    }
}

/// Joins trace-event documents (each `{"traceEvents": [...]}`, such as the rank files of a `PG_TRACE`
/// directory) into one: every document's events in order, and each one's `otherData` in the list
/// `otherData.parts`. Fails when a document has no `traceEvents` list, or when two documents name the same process
/// (`process_name` of one `pid`): their tracks would land on top of each other.
pub fn merge(documents: &[Value]) -> Result<Value, String> {
    let mut events = Vec::new();
    let mut parts = Vec::new();
    let mut named: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    for (index, document) in documents.iter().enumerate() {
        let list = document
            .get("traceEvents")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("document {index} has no traceEvents list"))?;
        for event in list {
            if event["ph"] == "M" && event["name"] == "process_name" {
                let pid = event["pid"].as_u64().ok_or_else(|| format!("document {index}: a process without a pid"))?;
                if let Some(first) = named.insert(pid, index) {
                    if first != index {
                        return Err(format!("documents {first} and {index} both name process {pid}"));
                    }
                }
            }
        }
        events.extend(list.iter().cloned());
        parts.push(document.get("otherData").cloned().unwrap_or(Value::Null));
    }
    Ok(json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"parts": parts}}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_the_format_fields_in_microseconds() {
        let mut trace = TraceEvents::new();
        let stream = Track::new(1, 7);
        trace.process(1, "rank 1", 1);
        trace.thread(stream, "stream 7", 0);
        trace.slice(stream, "all_reduce", "kernel", 1_500, 4_000, json!({"bytes": 4}));
        trace.instant(stream, "hazard", "hazard", 2_000, json!({}));
        let id = trace.flow("event", "kernel", (stream, 1_500), (Track::new(1, 8), 4_000));
        assert_eq!(id, 1);
        let doc = trace.into_json();
        let events = doc["traceEvents"].as_array().expect("traceEvents");
        assert_eq!(events.len(), 4 + 2 + 2);
        let slice = events.iter().find(|e| e["ph"] == "X").expect("a slice");
        assert_eq!((slice["ts"].as_f64(), slice["dur"].as_f64()), (Some(1.5), Some(2.5)));
        assert_eq!((slice["pid"].as_u64(), slice["tid"].as_u64()), (Some(1), Some(7)));
        let ends: Vec<&Value> = events.iter().filter(|e| e["ph"] == "s" || e["ph"] == "f").collect();
        assert_eq!(ends.len(), 2);
        assert!(ends.iter().all(|e| e["id"] == 1));
        assert_eq!(ends[1]["tid"], 8);
    }

    #[test]
    fn merging_keeps_every_event_and_refuses_a_process_named_twice() {
        let rank = |pid: u64| {
            let mut trace = TraceEvents::new();
            trace.process(pid, &format!("rank {pid}"), pid as i64);
            trace.slice(Track::new(pid, 1), "op", "op", 1_000, 2_000, json!({}));
            let mut document = trace.into_json();
            document["otherData"] = json!({"rank": pid});
            document
        };
        let merged = merge(&[rank(0), rank(1)]).unwrap();
        assert_eq!(merged["traceEvents"].as_array().map(Vec::len), Some(2 * 3));
        assert_eq!(merged["otherData"]["parts"][1]["rank"], 1);
        assert!(merge(&[rank(0), rank(0)]).unwrap_err().contains("both name process 0"));
        assert!(merge(&[json!({})]).is_err());
    }

    #[test]
    fn an_end_before_the_start_is_an_empty_slice() {
        let mut trace = TraceEvents::new();
        trace.slice(Track::new(0, 0), "x", "c", 10_000, 5_000, json!({}));
        assert_eq!(trace.into_json()["traceEvents"][0]["dur"].as_f64(), Some(0.0));
    }
}
