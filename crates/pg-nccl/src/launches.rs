//! The kernels this backend launched itself, per device (with the `testing` feature only): a bounded, lock-free
//! log of the newest 4,096 launches, read with [`for_device`] (the conformance harness's kernel log and the streams
//! experiment).
//!
//! The log is off until [`set_enabled`] turns it on (the conformance harness and the streams experiment do), so
//! that a binary built with `testing` for its benchmarks pays one relaxed load per launch and nothing more.
//! Logging is on every op's enqueue path, so it takes no lock: a launch claims a ticket and writes its slot
//! of a ring, seqlock-style (invalidate, write, publish). A reader skips a slot that is being rewritten, so a
//! read that races with 4,096 newer launches may miss entries; it never returns a torn one.
//!
//! Device times are a second switch ([`set_spans`]): each launch then records a timing event on its stream before
//! and after it (a lock and two event records per launch, for the conformance suite only), and [`since`] gives a
//! launch's span measured from a [`Mark`]. No span is taken for a launch inside an open NCCL group (its kernel
//! runs at the group's end) or on a stream being captured (the events would be graph nodes).

use std::cell::Cell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use pg_cuda::TimingEvent;

pub use pg_core::{KernelKind, KernelLaunch};

/// Entries kept per process.
pub const KEPT: usize = 4096;

/// The names a launch may carry; a name outside this list is logged as `"?"`.
const NAMES: [&str; 9] =
    ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "send", "recv", "fill", "sleep"];
const KINDS: [KernelKind; 4] = [KernelKind::Comm, KernelKind::Sleep, KernelKind::Fill, KernelKind::Copy];

/// One slot: the ticket that wrote it plus one (0: empty or being written) and the packed entry.
struct Slot {
    ticket: AtomicU64,
    entry: AtomicU64,
}

static NEXT: AtomicU64 = AtomicU64::new(0);
static ENABLED: AtomicBool = AtomicBool::new(false);
static SPANS_ON: AtomicBool = AtomicBool::new(false);
/// The timing events of the newest launches logged with spans on: (ticket, before, after), oldest first.
static SPANS: Mutex<VecDeque<(u64, TimingEvent, TimingEvent)>> = Mutex::new(VecDeque::new());

thread_local! {
    /// How many NCCL groups this thread has open (`ncclGroupStart` without its end).
    static GROUPS_OPEN: Cell<u32> = const { Cell::new(0) };
}
static RING: [Slot; KEPT] = [const { Slot { ticket: AtomicU64::new(0), entry: AtomicU64::new(0) } }; KEPT];

/// Packs (stream id: 40 bits, device: 8 bits, kind: 8 bits, name: 8 bits) into one word.
fn pack(device: usize, stream_id: u64, kind: KernelKind, name: &str) -> u64 {
    let name = NAMES.iter().position(|n| *n == name).unwrap_or(0xff) as u64;
    let kind = KINDS.iter().position(|k| *k == kind).unwrap_or(0) as u64;
    (stream_id & ((1 << 40) - 1)) << 24 | (device as u64 & 0xff) << 16 | kind << 8 | name
}

fn unpack(word: u64) -> (usize, KernelLaunch) {
    let name = NAMES.get((word & 0xff) as usize).copied().unwrap_or("?");
    let kind = KINDS[((word >> 8) & 0xff) as usize % KINDS.len()];
    let launch = KernelLaunch { stream_id: word >> 24, kind, name: name.to_owned(), span: None };
    (((word >> 16) & 0xff) as usize, launch)
}

/// Turns the log on or off for the whole process (it starts off); launches made while it is off are not logged.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether launches are being logged.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Turns device times on or off for the whole process (they start off); they are taken only while the log is on.
pub fn set_spans(on: bool) {
    SPANS_ON.store(on, Ordering::Relaxed);
}

/// Notes that this thread opened an NCCL group (launches inside it get no span).
pub(crate) fn group_opened() {
    GROUPS_OPEN.with(|open| open.set(open.get() + 1));
}

/// Notes that this thread closed an NCCL group.
pub(crate) fn group_closed() {
    GROUPS_OPEN.with(|open| open.set(open.get().saturating_sub(1)));
}

/// The timing event recorded before a launch, when its span is taken.
pub(crate) struct Before(Option<TimingEvent>);

/// Call right before a launch on `stream`: records the launch's first timing event when spans are on.
#[inline]
pub(crate) fn before(device: &pg_cuda::Device, stream: &pg_cuda::Stream) -> Before {
    if !enabled() || !SPANS_ON.load(Ordering::Relaxed) || GROUPS_OPEN.with(Cell::get) > 0 {
        return Before(None);
    }
    if stream.is_capturing().unwrap_or(true) {
        return Before(None);
    }
    Before(device.timing_event().ok().filter(|event| event.record(stream).is_ok()))
}

/// Logs a launch on `device`'s stream, if the log is on; `before` is what [`before`] gave for it.
#[inline]
pub(crate) fn log(
    device: &pg_cuda::Device,
    stream: &pg_cuda::Stream,
    kind: KernelKind,
    name: &'static str,
    before: Before,
) {
    if !enabled() {
        return;
    }
    let ticket = log_always(device.ordinal(), stream.id(), kind, name);
    let Some(start) = before.0 else { return };
    let Ok(end) = device.timing_event() else { return };
    if end.record(stream).is_ok() {
        let mut spans = SPANS.lock().unwrap_or_else(|e| e.into_inner());
        if spans.len() == KEPT {
            spans.pop_front();
        }
        // Threads may take tickets in one order and get here in another: keep the queue sorted by ticket.
        let at = spans.partition_point(|(t, _, _)| *t < ticket);
        spans.insert(at, (ticket, start, end));
    }
}

/// Logs a launch on device `device`'s stream `stream_id` without device times, if the log is on.
#[cfg(test)]
fn log_ids(device: usize, stream_id: u64, kind: KernelKind, name: &'static str) {
    if enabled() {
        log_always(device, stream_id, kind, name);
    }
}

fn log_always(device: usize, stream_id: u64, kind: KernelKind, name: &'static str) -> u64 {
    let ticket = NEXT.fetch_add(1, Ordering::Relaxed);
    let slot = &RING[(ticket % KEPT as u64) as usize];
    slot.ticket.store(0, Ordering::Release);
    slot.entry.store(pack(device, stream_id, kind, name), Ordering::Release);
    slot.ticket.store(ticket + 1, Ordering::Release);
    ticket
}

/// A point of the log: the launches after it, and device times measured from it ([`since`]).
pub struct Mark {
    ticket: u64,
    /// A timing event recorded on an idle stream when the mark was made (spans on only).
    base: Option<TimingEvent>,
}

impl std::fmt::Debug for Mark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mark").field("ticket", &self.ticket).field("timed", &self.base.is_some()).finish()
    }
}

/// Marks the log's present on `device`: [`since`] gives the launches after it, their device times (when spans
/// are on) from now.
pub fn mark(device: &pg_cuda::Device) -> Mark {
    let timed = enabled() && SPANS_ON.load(Ordering::Relaxed);
    let base = timed
        .then(|| {
            // An idle stream of its own: the event passes at once, so its time is the mark's.
            let stream = device.new_stream(false).ok()?;
            let event = device.timing_event().ok()?;
            event.record(&stream).ok()?;
            event.synchronize().ok()?;
            Some(event)
        })
        .flatten();
    Mark { ticket: NEXT.load(Ordering::Acquire), base }
}

/// The launches on the device of ordinal `device` logged after `mark`, oldest first, with their device times
/// from the mark where spans were on and both timing events have passed.
pub fn since(mark: &Mark, device: usize) -> Vec<KernelLaunch> {
    let mut launches = entries(device, mark.ticket);
    let Some(base) = &mark.base else { return launches.into_iter().map(|(_, l)| l).collect() };
    let spans = SPANS.lock().unwrap_or_else(|e| e.into_inner());
    for (ticket, launch) in &mut launches {
        let Ok(at) = spans.binary_search_by_key(ticket, |(t, _, _)| *t) else { continue };
        let (_, start, end) = &spans[at];
        launch.span = span_of(base, start, end);
    }
    launches.into_iter().map(|(_, l)| l).collect()
}

/// The span of a launch timed by `start` and `end`, from `base`; `None` while either has not passed.
fn span_of(base: &TimingEvent, start: &TimingEvent, end: &TimingEvent) -> Option<(Duration, Duration)> {
    if !start.query().ok()? || !end.query().ok()? {
        return None;
    }
    Some((start.elapsed_since(base).ok()?, end.elapsed_since(base).ok()?))
}

/// The logged launches on the device of ordinal `device`, oldest first.
pub fn for_device(device: usize) -> Vec<KernelLaunch> {
    entries(device, 0).into_iter().map(|(_, l)| l).collect()
}

/// (ticket, launch) of the logged launches on `device` from ticket `from` on, oldest first.
fn entries(device: usize, from: u64) -> Vec<(u64, KernelLaunch)> {
    let end = NEXT.load(Ordering::Acquire);
    let mut launches = Vec::new();
    for ticket in end.saturating_sub(KEPT as u64).max(from)..end {
        let slot = &RING[(ticket % KEPT as u64) as usize];
        if slot.ticket.load(Ordering::Acquire) != ticket + 1 {
            continue;
        }
        let word = slot.entry.load(Ordering::Acquire);
        if slot.ticket.load(Ordering::Acquire) != ticket + 1 {
            continue;
        }
        let (on, launch) = unpack(word);
        if on == device {
            launches.push((ticket, launch));
        }
    }
    launches
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring is process-wide: these tests take turns, so that one's 12,000 entries cannot evict another's.
    static RING_IN_USE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn entries_round_trip_and_stay_per_device_in_order() {
        let _turn = RING_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        set_enabled(true);
        // A device number no other test logs on.
        let device = 201;
        log_ids(device, 7, KernelKind::Comm, "all_reduce");
        log_ids(device, (1 << 40) - 1, KernelKind::Fill, "fill");
        log_ids(device + 1, 7, KernelKind::Sleep, "sleep");
        let mine = for_device(device);
        let found: Vec<(u64, KernelKind, &str)> = mine.iter().map(|l| (l.stream_id, l.kind, l.name.as_str())).collect();
        assert_eq!(found, [(7, KernelKind::Comm, "all_reduce"), ((1 << 40) - 1, KernelKind::Fill, "fill")]);
        assert_eq!(for_device(device + 1).len(), 1);
    }

    #[test]
    fn concurrent_writers_leave_no_torn_entry() {
        let _turn = RING_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        set_enabled(true);
        let device = 203;
        std::thread::scope(|scope| {
            for writer in 0..4u64 {
                scope.spawn(move || {
                    for i in 0..3000 {
                        // Every entry of a writer carries its own stream id and a name chosen by it.
                        let name = if writer % 2 == 0 { "send" } else { "recv" };
                        log_ids(device, 1000 + writer, KernelKind::Comm, name);
                        if i % 500 == 0 {
                            for launch in for_device(device) {
                                let expected = if (launch.stream_id - 1000) % 2 == 0 { "send" } else { "recv" };
                                assert_eq!(launch.name, expected, "a torn entry: {launch:?}");
                            }
                        }
                    }
                });
            }
        });
        assert!(for_device(device).len() <= KEPT);
    }

    #[test]
    fn launches_made_while_the_log_is_off_are_not_kept() {
        let _turn = RING_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
        let device = 205;
        set_enabled(false);
        log_ids(device, 9, KernelKind::Comm, "all_reduce");
        assert!(!enabled());
        set_enabled(true);
        log_ids(device, 10, KernelKind::Comm, "broadcast");
        let kept: Vec<u64> = for_device(device).iter().map(|l| l.stream_id).collect();
        assert_eq!(kept, [10], "only the launch made while the log was on is kept");
    }
}
