//! The group's error state and progress, as the watchdog records them: the sticky [`ErrorType`], the first
//! error, the last started and completed sequence numbers, the desync report and whether the flight recorder
//! was dumped.

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::desync::DesyncReport;
use crate::locks::lock;
use crate::{Error, ErrorKind, OpType};

/// The group's sticky error state (PyTorch's `ErrorType`, read with `getError()`): the first error wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ErrorType {
    /// No error so far.
    #[default]
    Success,
    /// A Work timed out.
    Timeout,
    /// The communicator reported an error.
    CommError,
    /// A peer reported an error through the store, or the store saw a peer's liveness connection close.
    RemoteError,
    /// The watchdog stopped making progress (PyTorch kills the process here; this library reports it).
    HeartbeatTimeout,
}

impl ErrorType {
    fn of(error: &Error) -> Self {
        match error.kind() {
            ErrorKind::WorkTimeout => ErrorType::Timeout,
            ErrorKind::Remote | ErrorKind::RankDead => ErrorType::RemoteError,
            ErrorKind::HeartbeatTimeout => ErrorType::HeartbeatTimeout,
            _ => ErrorType::CommError,
        }
    }
}

/// What the watchdog knows about the group: its error state and how far its ops got.
#[derive(Debug, Clone, Default)]
pub struct GroupStatus {
    /// The sticky error state.
    pub error_type: ErrorType,
    /// The first error the watchdog (or heartbeat monitor) found.
    pub error: Option<Error>,
    /// The host time at which that error was found (the device clock, virtual on the simulated backend).
    pub error_detected_at: Option<Duration>,
    /// The sequence number of the last collective enqueued.
    pub last_enqueued_seq: Option<u64>,
    /// The last collective enqueued.
    pub last_enqueued_op: Option<OpType>,
    /// The sequence number of the last collective seen started (needs start events: desync debugging).
    pub last_started_seq: Option<u64>,
    /// The sequence number of the last collective seen completed.
    pub last_completed_seq: Option<u64>,
    /// The last collective seen completed.
    pub last_completed_op: Option<OpType>,
    /// Works the watchdog still tracks.
    pub in_flight: usize,
    /// Communicators of the group that are aborted.
    pub aborted_comms: usize,
    /// Watchdog passes so far (the heartbeat).
    pub watchdog_passes: u64,
    /// Flight-recorder dumps written to files.
    pub dumps_written: u64,
}

/// The mutable part of the error state.
#[derive(Default)]
struct Cell {
    status: GroupStatus,
    desync: Option<DesyncReport>,
    dumped: bool,
    next_coord_check: Duration,
}

/// The error state and progress of one group, behind one lock that no enqueue takes.
#[derive(Default)]
pub(crate) struct ErrorState {
    cell: Mutex<Cell>,
}

impl ErrorState {
    fn cell(&self) -> MutexGuard<'_, Cell> {
        lock(&self.cell)
    }

    /// The recorded part of the status (the caller fills in what other parts of the group know).
    pub(crate) fn snapshot(&self) -> GroupStatus {
        self.cell().status.clone()
    }

    /// The sticky error state.
    pub(crate) fn error_type(&self) -> ErrorType {
        self.cell().status.error_type
    }

    /// Records `error`, found at `now`, unless an error is there; returns whether it was the first.
    pub(crate) fn record_first(&self, error: &Error, now: Duration) -> bool {
        let mut cell = self.cell();
        let first = cell.status.error_type == ErrorType::Success;
        if first {
            cell.status.error_type = ErrorType::of(error);
            cell.status.error = Some(error.clone());
            cell.status.error_detected_at = Some(now);
        }
        first
    }

    /// The desync report written at the first timeout, if any.
    pub(crate) fn desync_report(&self) -> Option<DesyncReport> {
        self.cell().desync.clone()
    }

    /// Keeps `report` unless one is there.
    pub(crate) fn set_desync_report(&self, report: DesyncReport) {
        self.cell().desync.get_or_insert(report);
    }

    /// Marks the flight recorder as dumped; returns whether it was not before.
    pub(crate) fn mark_dumped(&self) -> bool {
        !std::mem::replace(&mut self.cell().dumped, true)
    }

    /// Whether the flight recorder was dumped.
    pub(crate) fn dumped(&self) -> bool {
        self.cell().dumped
    }

    /// Counts a dump written to a file.
    pub(crate) fn count_dump(&self) {
        self.cell().status.dumps_written += 1;
    }

    /// Whether a peer's dump request is to be looked for at `now` (then not again for `period`): never after
    /// this rank dumped.
    pub(crate) fn coord_check_due(&self, now: Duration, period: Duration) -> bool {
        let mut cell = self.cell();
        if cell.dumped || now < cell.next_coord_check {
            return false;
        }
        cell.next_coord_check = now + period;
        true
    }

    /// Notes collective `seq` as started; returns whether it is the newest so far.
    pub(crate) fn note_started(&self, seq: u64) -> bool {
        let mut cell = self.cell();
        let newer = cell.status.last_started_seq < Some(seq);
        if newer {
            cell.status.last_started_seq = Some(seq);
        }
        newer
    }

    /// Notes collective `seq` as completed (and as started, when it had a start event); returns whether it is
    /// the newest started and the newest completed so far.
    pub(crate) fn note_completed(&self, seq: u64, op: OpType, had_start: bool) -> (bool, bool) {
        let mut cell = self.cell();
        let status = &mut cell.status;
        let newer_start = had_start && status.last_started_seq < Some(seq);
        if newer_start {
            status.last_started_seq = Some(seq);
        }
        let newer_end = status.last_completed_seq < Some(seq);
        if newer_end {
            status.last_completed_seq = Some(seq);
            status.last_completed_op = Some(op);
        }
        (newer_start, newer_end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_seq_is_news_only_once_and_only_when_higher() {
        let state = ErrorState::default();
        assert!(state.note_started(2), "the first started op is the newest");
        assert!(!state.note_started(2), "the same op seen started again on a later pass is no news");
        assert!(!state.note_started(1), "an older op started later does not move the mark back");
        assert!(state.note_started(3));
        assert_eq!(state.snapshot().last_started_seq, Some(3));
    }

    #[test]
    fn a_completed_seq_is_news_only_once_and_only_when_higher() {
        let state = ErrorState::default();
        assert_eq!(state.note_completed(2, OpType::AllReduce, true), (true, true), "the first completion");
        assert_eq!(state.note_completed(2, OpType::AllReduce, true), (false, false), "the same op again");
        assert_eq!(state.note_completed(1, OpType::Broadcast, true), (false, false), "an older op");
        assert_eq!(state.note_completed(3, OpType::Broadcast, false), (false, true), "no start event: no start");
        let status = state.snapshot();
        assert_eq!(
            (status.last_started_seq, status.last_completed_seq, status.last_completed_op),
            (Some(2), Some(3), Some(OpType::Broadcast))
        );
    }

    #[test]
    fn the_dump_request_is_looked_for_once_per_period_and_never_after_a_dump() {
        let state = ErrorState::default();
        let period = Duration::from_secs(1);
        assert!(state.coord_check_due(Duration::ZERO, period), "the first look is due at once");
        assert!(!state.coord_check_due(Duration::from_millis(999), period), "looked again within the period");
        assert!(state.coord_check_due(period, period), "not due again once the period passed");
        assert!(!state.dumped());
        assert!(state.mark_dumped(), "the first dump");
        assert!(state.dumped(), "dumped() forgot the dump");
        assert!(!state.mark_dumped(), "a second dump is not the first");
        assert!(!state.coord_check_due(period * 10, period), "looked for a dump request after dumping");
    }
}
