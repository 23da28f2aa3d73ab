//! The cross-rank check of the chunk sizes of the ops whose sizes differ by rank ([`crate::Options::check_chunk_sizes`]):
//! each rank publishes the row of elements it sends to and expects from every rank under the group's store
//! (`chunks.{call}/{rank}`), reads every rank's row, and fails before anything is enqueued if any pair disagrees.
//!
//! NCCL cannot see such a mismatch: a rank that sends more than its peer expects, or expects more than its peer
//! sends, waits until the timeout, while its peer may complete with a truncated chunk and report success. Every rank
//! compares the whole matrix, so every rank fails together, naming the first pair that disagrees.

use std::sync::atomic::Ordering;

use crate::shared::Shared;
use crate::{Backend, Error, Result};

/// One rank's row as published: the element counts it sends to each rank, then those it expects from each.
fn encode(sends: &[usize], recvs: &[usize]) -> String {
    let join = |list: &[usize]| list.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    format!("{};{}", join(sends), join(recvs))
}

/// A published row, or `None` if it is malformed or not one count per rank.
fn decode(value: &[u8], size: usize) -> Option<(Vec<usize>, Vec<usize>)> {
    let text = std::str::from_utf8(value).ok()?;
    let (sends, recvs) = text.split_once(';')?;
    let list = |part: &str| -> Option<Vec<usize>> {
        let list: Vec<usize> = part.split(',').map(|n| n.parse().ok()).collect::<Option<_>>()?;
        (list.len() == size).then_some(list)
    };
    Some((list(sends)?, list(recvs)?))
}

/// Checks, when the group asks for it, that `sends` (elements this rank sends to each rank) and `recvs` (elements
/// it expects from each) agree with every other rank's, for the op `what`.
pub(crate) fn check<B: Backend>(shared: &Shared<B>, what: &str, sends: &[usize], recvs: &[usize]) -> Result<()> {
    if !shared.options.check_chunk_sizes {
        return Ok(());
    }
    let (rank, size) = (shared.rank, shared.size);
    let call = shared.chunk_checks.fetch_add(1, Ordering::AcqRel);
    let key = |call: u64, rank: usize| format!("chunks.{call}/{rank}");
    shared.store.set(&key(call, rank), encode(sends, recvs).as_bytes())?;
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
        let row = decode(value, size).ok_or_else(|| {
            Error::invalid(format!(
                "{what}: rank {peer}'s chunk sizes for checked op {call} are malformed: {:?}",
                String::from_utf8_lossy(value)
            ))
        })?;
        rows.push(row);
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
        let text = encode(&[1, 3], &[2, 2]);
        assert_eq!(text, "1,3;2,2");
        assert_eq!(decode(text.as_bytes(), 2), Some((vec![1, 3], vec![2, 2])));
        for bad in ["1,3;2", "1,3", "x,3;2,2", "1,3;2,2,2", ""] {
            assert_eq!(decode(bad.as_bytes(), 2), None, "{bad:?}");
        }
        assert_eq!(decode(&[0xff, 0xfe], 2), None);
    }
}
