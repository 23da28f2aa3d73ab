//! Virtual time: nanosecond instants, the conditions a parked host thread waits for, and the auto-advance rule.
//!
//! A registered host thread lives at its local time, the global time plus the host costs it has run up since it
//! last blocked. A thread that blocks parks: it stores what it waits for as data in the world's state.
//! The global clock moves only when every registered thread is parked and none can proceed; it jumps to the
//! earliest time at which one can (tokio's paused clock with auto-advance, across threads), or to the start of a
//! matched collective, which runs only once the clock has reached it (so that a rank aborting before then keeps
//! it from running on every rank).

use std::time::Duration;

/// A virtual instant or span, in nanoseconds since the world was created.
pub(crate) type Time = u64;

/// Converts a duration to virtual nanoseconds, saturating.
pub(crate) fn ns(duration: Duration) -> Time {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Converts virtual nanoseconds to a duration.
pub(crate) fn dur(time: Time) -> Duration {
    Duration::from_nanos(time)
}

/// The time `bytes` take at `bandwidth` bytes per second (at least 1 ns, so that no operation is instantaneous).
pub(crate) fn transfer(bytes: usize, bandwidth: f64) -> Time {
    if bandwidth <= 0.0 || !bandwidth.is_finite() {
        return 1;
    }
    #[allow(clippy::cast_precision_loss)] // A reason: byte counts far below 2^52 are exact in f64.
    let seconds = bytes as f64 / bandwidth;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // A reason: a non-negative, rounded value.
    let nanos = (seconds * 1e9).round() as u64;
    nanos.max(1)
}

/// A readable virtual time, e.g. `52.062 ms`.
pub(crate) fn show(time: Time) -> String {
    match time {
        t if t < 1_000 => format!("{t} ns"),
        t if t < 1_000_000 => format!("{}.{:03} us", t / 1_000, t % 1_000),
        t if t < 1_000_000_000 => format!("{}.{:03} ms", t / 1_000_000, (t / 1_000) % 1_000),
        t => format!("{}.{:03} s", t / 1_000_000_000, (t / 1_000_000) % 1_000),
    }
}

/// Formats a duration as [`show`] does.
pub(crate) fn show_duration(d: Duration) -> String {
    show(ns(d))
}

/// One operation on one stream: the stream's global index and the operation's sequence number on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct OpRef {
    pub(crate) stream: usize,
    pub(crate) seq: u64,
}

/// What a parked host thread waits for.
#[derive(Debug, Clone)]
pub(crate) enum Cond {
    /// Every listed operation has finished (they are pinned while the thread waits).
    OpsDone(Vec<OpRef>),
    /// Every rank joined communicator group `0` and its init cost has passed.
    CommReady(usize),
    /// Every key is set in the simulated store.
    StoreKeys(Vec<String>),
    /// The store queue has an element.
    QueueNonEmpty(String),
    /// Every rank of communicator group `0` made its split number `1`, and the children's init cost has passed.
    SplitDone(usize, u64),
    /// Every rank of the shrink's parent that it does not exclude called it, and the child's init cost has passed.
    ShrinkDone(ShrinkKey),
    /// Every rank of the grow's communicator called it, every new rank joined, and the grown communicator's init
    /// cost has passed.
    GrowDone(GrowKey),
    /// Nothing: only the deadline (or an interrupt) ends the wait.
    Never,
    /// Thread `tid`'s store operation at virtual time `at` may run: the clock has reached `at` (no thread can
    /// act before it any more) and no other thread waits to run a store operation at an earlier time, or at the
    /// same time with a lower [`crate::state::ThreadState::order`]. So the store sees its operations in one
    /// order that virtual time alone decides, whatever order the host threads run in.
    StoreTurn { tid: usize, at: Time },
}

/// One shrink: the parent communicator group, its excluded ranks (ascending), and its number among the shrinks of
/// that group with that list. Callers that name different lists wait for different shrinks, as on NCCL.
pub(crate) type ShrinkKey = (usize, Vec<usize>, u64);

/// One grow: the communicator group that grows and its number among that group's grows.
pub(crate) type GrowKey = (usize, u64);

/// A parked thread's registered wait.
#[derive(Debug, Clone)]
pub(crate) struct Park {
    pub(crate) cond: Cond,
    /// The virtual time at which the wait gives up.
    pub(crate) deadline: Option<Time>,
    /// For an interruptible sleep: the interrupt epoch the thread saw when it last looked at its flag.
    pub(crate) interrupt_epoch: Option<u64>,
    /// What the thread is doing, for deadlock reports.
    pub(crate) what: String,
    /// When it parked (its local time then), for the trace.
    pub(crate) since: Time,
}

/// Why a parked thread woke.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// Its condition holds.
    Ready,
    /// Its deadline passed first.
    Deadline,
    /// Its interrupt flag was set.
    Interrupted,
}

/// What an attempt to advance the clock found.
#[derive(Debug)]
pub(crate) enum Advance {
    /// Some registered thread is running: time cannot move.
    Busy,
    /// Some parked thread can proceed at the current time.
    SomeoneReady,
    /// The clock moved forward.
    Advanced,
    /// Every thread is parked and none can ever proceed; the report says who waits for what.
    Deadlock(String),
    /// The next time at which a thread could proceed lies beyond the world's time limit.
    TimeLimit(String),
    /// Only process-group helpers are left, all parked, none waiting for the store or for device work that ends at
    /// a known time: time stands still until something wakes them (and no stall is reported meanwhile).
    Quiescent,
}
