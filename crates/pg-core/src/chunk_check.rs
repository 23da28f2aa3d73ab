//! The cross-rank check of the chunk sizes of the ops whose sizes differ by rank ([`crate::Options::check_chunk_sizes`]):
//! each rank publishes the row of elements it sends to and expects from every rank under the group's store
//! (`chunks.{call}/{rank}`), reads every rank's row, and fails before anything is enqueued if any pair disagrees.
//!
//! NCCL cannot see such a mismatch: a rank that sends more than its peer expects, or expects more than its peer
//! sends, waits until the timeout, while its peer may complete with a truncated chunk and report success. Every rank
//! compares the whole matrix, so every rank fails together, naming the first pair that disagrees.

use crate::shared::Shared;
use crate::{Backend, Error, Result};

/// The mark that starts the row of a rank that refused its op before the check (see [`refuse`]).
const REFUSED: char = '!';

/// One rank's row as published: the op, the element counts it sends to each rank, then those it expects from each.
fn encode(what: &str, sends: &[usize], recvs: &[usize]) -> String {
    let join = |list: &[usize]| list.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    format!("{what};{};{}", join(sends), join(recvs))
}

/// What a rank published for one checked op.
#[derive(Debug, PartialEq, Eq)]
enum Row {
    /// The op and its counts, one per rank on each side.
    Sizes { what: String, sends: Vec<usize>, recvs: Vec<usize> },
    /// The rank refused its op on its own arguments, for this reason.
    Refused { what: String, reason: String },
}

/// A published row, or `None` if it is malformed or not one count per rank.
fn decode(value: &[u8], size: usize) -> Option<Row> {
    let text = std::str::from_utf8(value).ok()?;
    if let Some(refused) = text.strip_prefix(REFUSED) {
        let (what, reason) = refused.split_once(';')?;
        return Some(Row::Refused { what: what.to_owned(), reason: reason.to_owned() });
    }
    let (what, text) = text.split_once(';')?;
    let (sends, recvs) = text.split_once(';')?;
    let list = |part: &str| -> Option<Vec<usize>> {
        let list: Vec<usize> = part.split(',').map(|n| n.parse().ok()).collect::<Option<_>>()?;
        (list.len() == size).then_some(list)
    };
    Some(Row::Sizes { what: what.to_owned(), sends: list(sends)?, recvs: list(recvs)? })
}

/// The store key of `rank`'s row of checked op `call`.
fn key(call: u64, rank: usize) -> String {
    format!("chunks.{call}/{rank}")
}

/// Takes this rank's turn in the check of an op it refused on its own arguments (`error`), when the group checks
/// chunk sizes: its row says so, so that the peers fail the same op naming the reason (instead of going ahead into
/// an op this rank never joins), and the ranks' checked ops stay in step. Nothing waits; a store failure is logged.
pub(crate) fn refuse<B: Backend>(shared: &Shared<B>, what: &str, error: &Error) {
    if !shared.options.check_chunk_sizes || shared.check(crate::lifecycle::Call::Op).is_err() {
        return;
    }
    let call = shared.rounds.next_chunk_check();
    let row = format!("{REFUSED}{what};{error}");
    if let Err(failure) = shared.store.set(&key(call, shared.rank), row.as_bytes()) {
        tracing::warn!(target: "pg", pg_id = shared.local_id, %failure, "could not publish a refused op's chunk sizes");
    }
}

/// Checks, when the group asks for it, that `sends` (elements this rank sends to each rank) and `recvs` (elements
/// it expects from each) agree with every other rank's, for the op `what`.
pub(crate) fn check<B: Backend>(shared: &Shared<B>, what: &str, sends: &[usize], recvs: &[usize]) -> Result<()> {
    if !shared.options.check_chunk_sizes {
        return Ok(());
    }
    // A group that can run no op fails the check at once with its error, instead of waiting for rows no rank sends.
    shared.check(crate::lifecycle::Call::Op)?;
    let (rank, size) = (shared.rank, shared.size);
    let call = shared.rounds.next_chunk_check();
    shared.store.set(&key(call, rank), encode(what, sends, recvs).as_bytes())?;
    // Every rank has read call - 2's rows before it published call - 1's, which this rank has read: its own row of
    // call - 2 is no longer needed.
    if let Some(old) = call.checked_sub(2) {
        shared.store.delete_key(&key(old, rank))?;
    }
    let keys: Vec<String> = (0..size).map(|r| key(call, r)).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let timeout = shared.timeout();
    if let Err(error) = shared.store.wait(&keys, Some(timeout)) {
        if !error.is_timeout() {
            return Err(error.into());
        }
        let missing: Vec<String> =
            (0..size).filter(|r| !shared.store.check(&[keys[*r]]).unwrap_or(false)).map(|r| r.to_string()).collect();
        return Err(Error::invalid(format!(
            "{what}: rank(s) {} published no chunk sizes for checked op {call} within {} ms: every rank must make \
             the same ops in the same order",
            missing.join(", "),
            timeout.as_millis()
        )));
    }
    let values = shared.store.multi_get(&keys)?;
    let mut rows = Vec::with_capacity(size);
    for (peer, value) in values.iter().enumerate() {
        let malformed = || {
            Error::invalid(format!(
                "{what}: rank {peer}'s chunk sizes for checked op {call} are malformed: {:?}",
                String::from_utf8_lossy(value)
            ))
        };
        match decode(value, size).ok_or_else(malformed)? {
            Row::Refused { what: theirs, reason } => {
                return Err(Error::invalid(format!(
                    "{what}: rank {peer} refused its part of checked op {call} ({theirs}) on its own arguments, so \
                     every rank fails it: {reason}"
                )))
            }
            Row::Sizes { what: theirs, .. } if theirs != what => {
                return Err(Error::invalid(format!(
                    "{what}: the ranks' checked ops are out of step: checked op {call} is {what} on rank {rank} but \
                     {theirs} on rank {peer}; every rank must make the same ops in the same order"
                )))
            }
            Row::Sizes { sends, recvs, .. } => rows.push((sends, recvs)),
        }
    }
    for (from, (sends, _)) in rows.iter().enumerate() {
        for (to, (_, recvs)) in rows.iter().enumerate() {
            if sends[to] != recvs[from] {
                return Err(Error::invalid(format!(
                    "{what}: chunk sizes disagree: rank {from} sends rank {to} {} elements but rank {to} expects {} \
                     from rank {from} (rank {from} sends {:?}; rank {to} expects {:?}; seen by rank {rank})",
                    sends[to], recvs[from], rows[from].0, rows[to].1
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_malformed_ones_are_refused() {
        let text = encode("all_to_all", &[1, 3], &[2, 2]);
        assert_eq!(text, "all_to_all;1,3;2,2");
        let row = Row::Sizes { what: "all_to_all".to_owned(), sends: vec![1, 3], recvs: vec![2, 2] };
        assert_eq!(decode(text.as_bytes(), 2), Some(row));
        let refused = Row::Refused { what: "all_to_all".to_owned(), reason: "bad; splits".to_owned() };
        assert_eq!(decode(b"!all_to_all;bad; splits", 2), Some(refused));
        for bad in ["a;1,3;2", "a;1,3", "a;x,3;2,2", "a;1,3;2,2,2", "1,3;2,2", "", "!no reason"] {
            assert_eq!(decode(bad.as_bytes(), 2), None, "{bad:?}");
        }
        assert_eq!(decode(&[0xff, 0xfe], 2), None);
    }
}
