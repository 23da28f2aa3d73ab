//! The desync report (S25): on a timeout, which ranks are behind and at which sequence number, read from the
//! trace keys every rank's watchdog keeps in the group's store.
//!
//! With desync debugging on (`TORCH_NCCL_DESYNC_DEBUG`), each rank's watchdog writes `NCCL_{rank}_trace_start`
//! when it sees a collective start and `NCCL_{rank}_trace_end` when it sees one complete.
//! The value is PyTorch's: the sequence number as a native-endian `u64`, the op name, and one zero byte.
//! The report compares every rank's keys with the sequence number of the op that timed out.

use std::fmt;

use pg_store::Store;

use crate::{OpType, Result};

/// The store key of a rank's last started collective.
pub(crate) fn trace_start_key(rank: usize) -> String {
    format!("NCCL_{rank}_trace_start")
}

/// The store key of a rank's last completed collective.
pub(crate) fn trace_end_key(rank: usize) -> String {
    format!("NCCL_{rank}_trace_end")
}

/// Encodes a trace value as PyTorch does.
pub(crate) fn encode_trace(seq: u64, op: OpType) -> Vec<u8> {
    let mut value = seq.to_ne_bytes().to_vec();
    value.extend_from_slice(op.torch_name().as_bytes());
    value.push(0);
    value
}

/// Decodes a trace value; `None` when it is malformed.
pub(crate) fn decode_trace(value: &[u8]) -> Option<(u64, String)> {
    let (seq, name) = value.split_first_chunk::<8>()?;
    let name = name.strip_suffix(&[0]).unwrap_or(name);
    Some((u64::from_ne_bytes(*seq), String::from_utf8_lossy(name).into_owned()))
}

/// One rank's trace keys: its last started and last completed collective, as (sequence number, op name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankTrace {
    /// The rank.
    pub rank: usize,
    /// The last collective the rank started, if its key was set.
    pub started: Option<(u64, String)>,
    /// The last collective the rank completed, if its key was set.
    pub completed: Option<(u64, String)>,
}

/// Where a rank stands relative to the op that timed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RankPosition {
    /// It never started any collective of this group (no trace key).
    Missing,
    /// It has not started the op that timed out: its last started collective has an earlier sequence number.
    Behind {
        /// Its last started sequence number.
        last_started: u64,
        /// Whether that one completed.
        completed_it: bool,
    },
    /// It started the op with the same sequence number but a different op name.
    Mismatch {
        /// The op it runs at that sequence number.
        op: String,
    },
    /// It is in the op that timed out and has not completed it.
    InOp,
    /// It completed the op that timed out (or went past it).
    Ahead {
        /// Its last started sequence number.
        last_started: u64,
    },
}

/// A desync report, as one rank computes it when one of its ops times out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesyncReport {
    /// The rank that wrote the report.
    pub rank: usize,
    /// The sequence number of the op that timed out.
    pub seq: u64,
    /// The op that timed out.
    pub op: String,
    /// Every rank's trace keys, in rank order.
    pub traces: Vec<RankTrace>,
}

impl DesyncReport {
    /// Reads every rank's trace keys from `store` (without waiting: a key not set is a rank not seen).
    pub(crate) fn retrieve(store: &dyn Store, rank: usize, size: usize, seq: u64, op: OpType) -> Result<Self> {
        let read = |key: String| -> Result<Option<(u64, String)>> {
            match store.check(&[&key])? {
                true => Ok(decode_trace(&store.get(&key)?)),
                false => Ok(None),
            }
        };
        let traces = (0..size)
            .map(|r| Ok(RankTrace { rank: r, started: read(trace_start_key(r))?, completed: read(trace_end_key(r))? }))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { rank, seq, op: op.torch_name().to_owned(), traces })
    }

    /// Where `trace`'s rank stands relative to the op that timed out.
    pub fn position(&self, trace: &RankTrace) -> RankPosition {
        let Some((started, started_op)) = &trace.started else { return RankPosition::Missing };
        let completed = trace.completed.as_ref().map(|(seq, _)| *seq);
        match started.cmp(&self.seq) {
            std::cmp::Ordering::Less => {
                RankPosition::Behind { last_started: *started, completed_it: completed == Some(*started) }
            }
            std::cmp::Ordering::Equal if *started_op != self.op => RankPosition::Mismatch { op: started_op.clone() },
            std::cmp::Ordering::Equal if completed < Some(self.seq) => RankPosition::InOp,
            _ => RankPosition::Ahead { last_started: *started },
        }
    }

    /// The ranks that never reached the op that timed out (missing or behind), with their last started
    /// sequence number: the likely cause of the timeout.
    pub fn lagging_ranks(&self) -> Vec<(usize, Option<u64>)> {
        self.traces
            .iter()
            .filter_map(|trace| match self.position(trace) {
                RankPosition::Missing => Some((trace.rank, None)),
                RankPosition::Behind { last_started, .. } => Some((trace.rank, Some(last_started))),
                _ => None,
            })
            .collect()
    }

    /// The ranks that run a different op at the timed-out sequence number.
    pub fn mismatched_ranks(&self) -> Vec<(usize, String)> {
        self.traces
            .iter()
            .filter_map(|trace| match self.position(trace) {
                RankPosition::Mismatch { op } => Some((trace.rank, op)),
                _ => None,
            })
            .collect()
    }
}

impl fmt::Display for DesyncReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "desync report of rank {} for collective seq {} ({}):", self.rank, self.seq, self.op)?;
        let lagging = self.lagging_ranks();
        let mismatched = self.mismatched_ranks();
        if lagging.is_empty() && mismatched.is_empty() {
            write!(f, " every rank started it; the ranks still in it are stuck inside the collective")?;
        }
        if !lagging.is_empty() {
            let ranks: Vec<String> = lagging.iter().map(|(r, _)| r.to_string()).collect();
            write!(f, " ranks [{}] are behind and never joined seq {}", ranks.join(", "), self.seq)?;
        }
        if !mismatched.is_empty() {
            let ranks: Vec<String> = mismatched.iter().map(|(r, op)| format!("{r} ({op})")).collect();
            write!(f, "; ranks [{}] run a different op at seq {}", ranks.join(", "), self.seq)?;
        }
        for trace in &self.traces {
            let position = match self.position(trace) {
                RankPosition::Missing => "never started a collective".to_owned(),
                RankPosition::Behind { last_started, completed_it: true } => {
                    format!("behind: completed seq {last_started}, has not started seq {}", self.seq)
                }
                RankPosition::Behind { last_started, completed_it: false } => {
                    format!("behind: stuck in seq {last_started}")
                }
                RankPosition::Mismatch { op } => format!("mismatch: runs {op} at seq {}", self.seq),
                RankPosition::InOp => format!("in seq {}, not completed", self.seq),
                RankPosition::Ahead { last_started } => format!("past it: last started seq {last_started}"),
            };
            write!(f, "\n  rank {}: {position}", trace.rank)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use pg_store::HashStore;

    use super::*;

    #[test]
    fn trace_values_round_trip() {
        let value = encode_trace(42, OpType::AllReduce);
        assert_eq!(value.len(), 8 + "ALLREDUCE".len() + 1);
        assert_eq!(value.last(), Some(&0));
        assert_eq!(decode_trace(&value), Some((42, "ALLREDUCE".to_owned())));
        assert_eq!(decode_trace(b"short"), None);
    }

    /// Writes each rank's (started, completed) sequence numbers, then reports from rank 0 on `seq`.
    fn check(ranks: &[(Option<u64>, Option<u64>)], seq: u64, lagging: &[(usize, Option<u64>)], text: &str) {
        let store: Arc<dyn Store> = Arc::new(HashStore::new());
        for (rank, (started, completed)) in ranks.iter().enumerate() {
            if let Some(s) = started {
                store.set(&trace_start_key(rank), &encode_trace(*s, OpType::AllReduce)).unwrap();
            }
            if let Some(c) = completed {
                store.set(&trace_end_key(rank), &encode_trace(*c, OpType::AllReduce)).unwrap();
            }
        }
        let report = DesyncReport::retrieve(store.as_ref(), 0, ranks.len(), seq, OpType::AllReduce).unwrap();
        assert_eq!(report.lagging_ranks(), lagging, "{report}");
        assert!(report.to_string().contains(text), "expected {text:?} in:\n{report}");
    }

    #[test]
    fn reports_name_the_lagging_ranks() {
        // One rank skipped seq 5: it completed seq 4 and never started 5.
        let skipped = [(Some(5), Some(4)), (Some(4), Some(4)), (Some(5), Some(4)), (Some(5), Some(4))];
        check(&skipped, 5, &[(1, Some(4))], "ranks [1] are behind and never joined seq 5");
        check(&skipped, 5, &[(1, Some(4))], "rank 1: behind: completed seq 4, has not started seq 5");
        // A rank that never ran a collective at all.
        check(&[(Some(1), None), (None, None)], 1, &[(1, None)], "rank 1: never started a collective");
        // A rank stuck inside an earlier collective.
        check(&[(Some(3), Some(2)), (Some(2), Some(1))], 3, &[(1, Some(2))], "rank 1: behind: stuck in seq 2");
        // Everyone is in the op: nobody lags, the collective itself is stuck.
        check(&[(Some(3), Some(2)), (Some(3), Some(2))], 3, &[], "stuck inside the collective");
        // A rank that went past it.
        check(&[(Some(3), Some(2)), (Some(4), Some(3))], 3, &[], "rank 1: past it: last started seq 4");
    }

    #[test]
    fn a_different_op_at_the_same_seq_is_a_mismatch() {
        let store = HashStore::new();
        store.set(&trace_start_key(0), &encode_trace(2, OpType::AllReduce)).unwrap();
        store.set(&trace_start_key(1), &encode_trace(2, OpType::Broadcast)).unwrap();
        let report = DesyncReport::retrieve(&store, 0, 2, 2, OpType::AllReduce).unwrap();
        assert_eq!(report.mismatched_ranks(), [(1, "BROADCAST".to_owned())]);
        assert!(report.to_string().contains("ranks [1 (BROADCAST)] run a different op at seq 2"), "{report}");
    }
}
