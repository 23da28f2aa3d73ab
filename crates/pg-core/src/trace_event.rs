//! Chrome's trace-event JSON (what Perfetto and chrome://tracing open): the one writer every pg timeline goes
//! through, the mock's simulated streams, the flight-recorder dumps `cargo xtask fr-analyze --trace` lines up,
//! and a real run's ops under `PG_TRACE`.
//!
//! A trace is a list of events, each on a track: a process (`pid`) and a thread (`tid`) of it, named by metadata
//! events. Times go in as nanoseconds and come out as the format's microseconds. Slices (`ph: "X"`) have a start
//! and a duration, instants (`ph: "i"`) a time, and a flow (`ph: "s"` then `ph: "f"`) is an arrow from one
//! slice to another: each end is given at a slice's start on its track, where both viewers bind it.

use crate::json::{Object, Value};
use crate::json_object;

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

    fn push(&mut self, event: Object) {
        self.events.push(Value::Object(event));
    }

    /// Names process `pid`; `sort` orders the processes in the viewer.
    pub fn process(&mut self, pid: u64, name: &str, sort: i64) {
        self.push(
            json_object! {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": json_object! {"name": name}},
        );
        self.push(json_object! {
            "ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": json_object! {"sort_index": sort},
        });
    }

    /// Names a track; `sort` orders the tracks of its process in the viewer.
    pub fn thread(&mut self, track: Track, name: &str, sort: i64) {
        let (pid, tid) = (track.pid, track.tid);
        self.push(json_object! {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": json_object! {"name": name}});
        self.push(json_object! {
            "ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": json_object! {"sort_index": sort},
        });
    }

    /// A slice from `start_ns` to `end_ns` (an end before the start is taken as the start).
    pub fn slice(&mut self, track: Track, name: &str, cat: &str, start_ns: u64, end_ns: u64, args: Object) {
        self.push(json_object! {
            "ph": "X", "name": name, "cat": cat, "pid": track.pid, "tid": track.tid,
            "ts": micros(start_ns), "dur": micros(end_ns.saturating_sub(start_ns)), "args": args,
        });
    }

    /// An instant at `at_ns`, drawn on its track.
    pub fn instant(&mut self, track: Track, name: &str, cat: &str, at_ns: u64, args: Object) {
        self.push(json_object! {
            "ph": "i", "s": "t", "name": name, "cat": cat, "pid": track.pid, "tid": track.tid, "ts": micros(at_ns),
            "args": args,
        });
    }

    /// An instant at `at_ns` drawn across its whole process (a finding about a rank).
    pub fn process_instant(&mut self, track: Track, name: &str, cat: &str, at_ns: u64, args: Object) {
        self.push(json_object! {
            "ph": "i", "s": "p", "name": name, "cat": cat, "pid": track.pid, "tid": track.tid, "ts": micros(at_ns),
            "args": args,
        });
    }

    /// An arrow from the slice that starts at `from_ns` on `from` to the slice that starts at `to_ns` on `to`
    /// (both slices added with the same `cat`); returns the flow's id.
    pub fn flow(&mut self, name: &str, cat: &str, (from, from_ns): (Track, u64), (to, to_ns): (Track, u64)) -> u64 {
        self.next_flow += 1;
        let id = self.next_flow;
        self.push(json_object! {
            "ph": "s", "name": name, "cat": cat, "id": id, "pid": from.pid, "tid": from.tid, "ts": micros(from_ns),
        });
        self.push(json_object! {
            "ph": "f", "bp": "e", "name": name, "cat": cat, "id": id, "pid": to.pid, "tid": to.tid,
            "ts": micros(to_ns),
        });
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

    /// The events alone, in order (what a writer that lays out its own document around them takes).
    pub(crate) fn into_events(self) -> Vec<Value> {
        self.events
    }

    /// The JSON document: `{"traceEvents": [...], "displayTimeUnit": "ms"}`.
    pub fn into_json(self) -> Value {
        json_object! {"traceEvents": self.events, "displayTimeUnit": "ms"}.into()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The document as serde_json reads it back.
    fn read(trace: TraceEvents) -> serde_json::Value {
        serde_json::from_str(&trace.into_json().to_string()).expect("valid JSON")
    }

    #[test]
    fn events_carry_the_format_fields_in_microseconds() {
        let mut trace = TraceEvents::new();
        let stream = Track::new(1, 7);
        trace.process(1, "rank 1", 1);
        trace.thread(stream, "stream 7", 0);
        trace.slice(stream, "all_reduce", "kernel", 1_500, 4_000, json_object! {"bytes": 4});
        trace.instant(stream, "hazard", "hazard", 2_000, Object::new());
        let id = trace.flow("event", "kernel", (stream, 1_500), (Track::new(1, 8), 4_000));
        assert_eq!(id, 1);
        let doc = read(trace);
        let events = doc["traceEvents"].as_array().expect("traceEvents");
        assert_eq!(events.len(), 4 + 2 + 2);
        let slice = events.iter().find(|e| e["ph"] == "X").expect("a slice");
        assert_eq!((slice["ts"].as_f64(), slice["dur"].as_f64()), (Some(1.5), Some(2.5)));
        assert_eq!((slice["pid"].as_u64(), slice["tid"].as_u64()), (Some(1), Some(7)));
        let ends: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "s" || e["ph"] == "f").collect();
        assert_eq!(ends.len(), 2);
        assert!(ends.iter().all(|e| e["id"] == 1));
        assert_eq!(ends[1]["tid"], 8);
    }

    #[test]
    fn the_document_is_the_trace_event_format_field_for_field() {
        let mut trace = TraceEvents::with_first_flow_id(40);
        let (a, b) = (Track::new(2, 3), Track::new(2, 4));
        trace.process(2, "rank \"2\"", -1);
        trace.thread(a, "stream", 5);
        trace.slice(a, "op", "c", 1_000, 3_500, json_object! {"n": 1, "s": "x", "f": 0.25, "none": Value::Null});
        trace.instant(b, "mark", "h", 2_000, json_object! {"list": [1, 2]});
        trace.process_instant(b, "rank mark", "d", 7, Object::new());
        trace.flow("arrow", "c", (a, 1_000), (b, 2_000));
        let expected = json!({"traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "rank \"2\""}},
            {"ph": "M", "name": "process_sort_index", "pid": 2, "tid": 0, "args": {"sort_index": -1}},
            {"ph": "M", "name": "thread_name", "pid": 2, "tid": 3, "args": {"name": "stream"}},
            {"ph": "M", "name": "thread_sort_index", "pid": 2, "tid": 3, "args": {"sort_index": 5}},
            {"ph": "X", "name": "op", "cat": "c", "pid": 2, "tid": 3, "ts": 1.0, "dur": 2.5,
             "args": {"n": 1, "s": "x", "f": 0.25, "none": null}},
            {"ph": "i", "s": "t", "name": "mark", "cat": "h", "pid": 2, "tid": 4, "ts": 2.0, "args": {"list": [1, 2]}},
            {"ph": "i", "s": "p", "name": "rank mark", "cat": "d", "pid": 2, "tid": 4, "ts": 0.007, "args": {}},
            {"ph": "s", "name": "arrow", "cat": "c", "id": 41, "pid": 2, "tid": 3, "ts": 1.0},
            {"ph": "f", "bp": "e", "name": "arrow", "cat": "c", "id": 41, "pid": 2, "tid": 4, "ts": 2.0},
        ], "displayTimeUnit": "ms"});
        assert_eq!(read(trace), expected);
    }

    #[test]
    fn an_end_before_the_start_is_an_empty_slice() {
        let mut trace = TraceEvents::new();
        trace.slice(Track::new(0, 0), "x", "c", 10_000, 5_000, Object::new());
        assert_eq!(read(trace)["traceEvents"][0]["dur"].as_f64(), Some(0.0));
    }
}
