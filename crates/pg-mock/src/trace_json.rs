//! A [`Trace`] as Chrome trace-event JSON (Perfetto, chrome://tracing), through pg-core's writer: a process per
//! device (rank), and in it a track per host thread (when it was blocked), per stream (what it ran; waits for
//! events drawn as arrows from the operation the event marked), and per communicator (each operation from the
//! host's issue to its end on the device); hazards are instants on the stream whose access found them.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use pg_core::json::{Object, Value};
use pg_core::json_object;
use pg_core::trace_event::{TraceEvents, Track};

use crate::clock::ns;
use crate::trace::{KernelKind, SpanKind, StreamSpan, Trace};

/// The first track number of the streams (host threads are numbered from 0).
const STREAM_TRACKS: u64 = 1_000_000;
/// The first track number of the communicators.
const COMM_TRACKS: u64 = 2_000_000;

/// The category of everything on a stream track: flows bind to slices of their own category.
const STREAM: &str = "stream";

impl Trace {
    /// The first track number free for tracks added beside the trace's own in [`Trace::chrome_events`] (host
    /// threads are numbered from 0, streams from 1,000,000, communicators from 2,000,000).
    pub const FREE_TRACKS: u64 = 3_000_000;

    /// Chrome's trace-event JSON of the trace (`{"traceEvents": [...]}`): write it to a file and open it in
    /// Perfetto (ui.perfetto.dev) or chrome://tracing.
    pub fn to_chrome_json(&self) -> Value {
        self.chrome_events().into_json()
    }

    /// The trace's events, for adding more tracks beside them (numbered from [`Trace::FREE_TRACKS`] on) before the
    /// JSON is taken.
    pub fn chrome_events(&self) -> TraceEvents {
        let mut out = TraceEvents::new();
        let now = ns(self.now);
        let host = self.devices as u64;
        for device in 0..self.devices {
            out.process(device as u64, &format!("rank {device} (simulated device {device})"), device as i64);
        }
        if self.threads.iter().any(|t| t.device.is_none()) {
            out.process(host, "host threads outside the ranks", host as i64);
        }
        let pid = |device: Option<usize>| device.map_or(host, |d| d as u64);

        // Host threads: only those that were ever blocked get a track.
        let blocked: BTreeSet<usize> = self.blocked.iter().map(|b| b.thread).collect();
        let mut thread_track = HashMap::new();
        for thread in self.threads.iter().filter(|t| blocked.contains(&t.thread)) {
            let track = Track::new(pid(thread.device), thread.thread as u64);
            out.thread(track, &format!("host: {} (blocked)", thread.name), thread.thread as i64);
            thread_track.insert(thread.thread, track);
        }
        for block in &self.blocked {
            let Some(track) = thread_track.get(&block.thread) else { continue };
            let end = block.end.map_or(now, ns);
            let args = json_object! {"what": &block.what, "unfinished": block.end.is_none()};
            out.slice(*track, &block.what, "host", ns(block.start), end, args);
        }

        // Streams, numbered in the world's order.
        let mut stream_track = HashMap::new();
        for (index, s) in self.streams.iter().enumerate() {
            let track = Track::new(s.device as u64, STREAM_TRACKS + index as u64);
            let kind = match (s.stream, s.high_priority) {
                (0, _) => " (default)",
                (_, true) => " (high priority)",
                _ => "",
            };
            out.thread(track, &format!("stream {}{kind}", s.stream), track.tid as i64);
            stream_track.insert((s.device, s.stream), track);
        }
        let track_of = |device: usize, stream: u64| stream_track.get(&(device, stream)).copied();
        for span in &self.spans {
            let Some(track) = track_of(span.device, span.stream) else { continue };
            let end = span.end.map_or(now, ns);
            out.slice(track, &span.name, STREAM, ns(span.start), end, span_args(span));
        }
        for wait in &self.waits {
            let (Some(from), Some(to)) =
                (track_of(wait.recorded_on.0, wait.recorded_on.1), track_of(wait.device, wait.stream))
            else {
                continue;
            };
            out.flow("event", STREAM, (from, ns(wait.marked.0)), (to, ns(wait.reached)));
        }
        for hazard in &self.hazards {
            let Some(track) = track_of(hazard.device, hazard.stream) else { continue };
            let args = json_object! {"kind": format!("{:?}", hazard.kind), "access": &hazard.access,
            "earlier access": &hazard.earlier, "report": &hazard.message};
            out.instant(track, &format!("hazard: {:?}", hazard.kind), "hazard", ns(hazard.at), args);
        }

        // Communicators: each operation from its issue to its end, laid out so that no two overlap on a track.
        let mut comm_ops: Vec<&StreamSpan> = self.spans.iter().filter(|s| s.comm.is_some()).collect();
        comm_ops.sort_by_key(|s| (s.device, s.comm.as_ref().map(|c| c.communicator), s.enqueued, s.start));
        let mut last_end: HashMap<Track, u64> = HashMap::new();
        for span in comm_ops {
            let Some(comm) = &span.comm else { continue };
            let track = Track::new(span.device as u64, COMM_TRACKS + comm.communicator);
            let end = span.end.map_or(now, ns);
            let previous = last_end.insert(track, end);
            if previous.is_none() {
                let desc = if comm.description.is_empty() { String::new() } else { format!(" ({})", comm.description) };
                out.thread(track, &format!("communicator {}{desc}", comm.communicator), track.tid as i64);
            }
            // An op issued while the one before was still running starts, on this track, where that one ended.
            let start = ns(span.enqueued).max(previous.unwrap_or(0)).min(end);
            let name = match (comm.collective, comm.message) {
                (Some(k), _) => format!("{} #{k}", span.name),
                (_, Some((src, dst, n))) => format!("{} #{n} {src}->{dst}", span.name),
                _ => span.name.clone(),
            };
            out.slice(track, &name, "comm", start, end, span_args(span));
        }
        out
    }
}

/// What a stream span's slice says about it.
fn span_args(span: &StreamSpan) -> Object {
    let kind = match span.kind {
        SpanKind::Wait => "wait for an event",
        SpanKind::Kernel(KernelKind::Comm) => "communication kernel",
        SpanKind::Kernel(KernelKind::Sleep) => "sleep kernel",
        SpanKind::Kernel(KernelKind::Fill) => "fill kernel",
        SpanKind::Kernel(KernelKind::Copy) => "copy",
    };
    let mut args = json_object! {
        "kind": kind, "stream": span.stream, "enqueued_us": micros(span.enqueued), "start_us": micros(span.start),
        "unfinished": span.end.is_none(),
    };
    if let Some(comm) = &span.comm {
        args.insert("communicator", comm.communicator);
        args.insert("communicator_desc", &comm.description);
        if let Some(k) = comm.collective {
            args.insert("collective", k);
        }
        if let Some((src, dst, n)) = comm.message {
            args.insert("message", json_object! {"from": src, "to": dst, "index": n});
        }
    }
    args
}

fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}
