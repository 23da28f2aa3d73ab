//! The kernels this backend launched itself, per device (with the `testing` feature only): a bounded, lock-free
//! log of the newest 4,096 launches, read with [`for_device`] (the conformance harness's kernel log and the streams
//! experiment).
//!
//! The log is off until [`set_enabled`] turns it on (the conformance harness and the streams experiment do), so
//! that a binary built with `testing` for its benchmarks pays one relaxed load per launch and nothing more.
//! Logging is on every op's enqueue path, so it takes no lock: a launch claims a ticket and writes its slot
//! of a ring, seqlock-style (invalidate, write, publish). A reader skips a slot that is being rewritten, so a
//! read that races with 4,096 newer launches may miss entries; it never returns a torn one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use pg_conformance::{KernelKind, KernelLaunch};

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

/// Logs a launch on `device`'s stream `stream_id`, if the log is on.
#[inline]
pub(crate) fn log(device: usize, stream_id: u64, kind: KernelKind, name: &'static str) {
    if enabled() {
        log_always(device, stream_id, kind, name);
    }
}

fn log_always(device: usize, stream_id: u64, kind: KernelKind, name: &'static str) {
    let ticket = NEXT.fetch_add(1, Ordering::Relaxed);
    let slot = &RING[(ticket % KEPT as u64) as usize];
    slot.ticket.store(0, Ordering::Release);
    slot.entry.store(pack(device, stream_id, kind, name), Ordering::Release);
    slot.ticket.store(ticket + 1, Ordering::Release);
}

/// The logged launches on the device of ordinal `device`, oldest first.
pub fn for_device(device: usize) -> Vec<KernelLaunch> {
    let end = NEXT.load(Ordering::Acquire);
    let mut launches = Vec::new();
    for ticket in end.saturating_sub(KEPT as u64)..end {
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
            launches.push(launch);
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
        log(device, 7, KernelKind::Comm, "all_reduce");
        log(device, (1 << 40) - 1, KernelKind::Fill, "fill");
        log(device + 1, 7, KernelKind::Sleep, "sleep");
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
                        log(device, 1000 + writer, KernelKind::Comm, name);
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
        log(device, 9, KernelKind::Comm, "all_reduce");
        assert!(!enabled());
        set_enabled(true);
        log(device, 10, KernelKind::Comm, "broadcast");
        let kept: Vec<u64> = for_device(device).iter().map(|l| l.stream_id).collect();
        assert_eq!(kept, [10], "only the launch made while the log was on is kept");
    }
}
