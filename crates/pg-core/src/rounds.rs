//! The numbers a group gives the calls every rank must number alike (subgroup calls, chunk-size checks, survivor
//! agreements, shrinks by excluded list, grows): each names the call's store keys, so ranks that make the same calls
//! in the same order meet under the same keys without a message.

use crate::locks::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The next number of each kind of numbered call of one group.
#[derive(Default)]
pub(crate) struct Rounds {
    subgroups: AtomicU64,
    chunk_checks: AtomicU64,
    agreements: AtomicU64,
    /// A rank excluded from a shrink does not take part in it, so a shrink is numbered among the shrinks with its
    /// excluded list.
    shrinks: Mutex<HashMap<Vec<usize>, u64>>,
    grows: AtomicU64,
}

impl Rounds {
    /// The number of the next subgroup call (members and non-members of the subgroup alike take one).
    pub(crate) fn next_subgroup(&self) -> u64 {
        self.subgroups.fetch_add(1, Ordering::Relaxed)
    }

    /// The number of the next op whose chunk sizes are checked across ranks.
    pub(crate) fn next_chunk_check(&self) -> u64 {
        self.chunk_checks.fetch_add(1, Ordering::AcqRel)
    }

    /// The number of the next survivor agreement, taken.
    pub(crate) fn next_agreement(&self) -> u64 {
        self.agreements.fetch_add(1, Ordering::Relaxed)
    }

    /// The number the next survivor agreement will take (a rank checks in to it early, before it is called).
    pub(crate) fn coming_agreement(&self) -> u64 {
        self.agreements.load(Ordering::Relaxed)
    }

    /// The number of the next shrink with `excluded` among the shrinks with that list.
    pub(crate) fn next_shrink(&self, excluded: &[usize]) -> u64 {
        let mut shrinks = lock(&self.shrinks);
        let counter = shrinks.entry(excluded.to_vec()).or_default();
        *counter += 1;
        *counter - 1
    }

    /// The number of the next grow (every rank takes part in a grow).
    pub(crate) fn next_grow(&self) -> u64 {
        self.grows.fetch_add(1, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_counts_on_its_own_and_shrinks_count_by_excluded_list() {
        let rounds = Rounds::default();
        assert_eq!((rounds.next_subgroup(), rounds.next_subgroup()), (0, 1));
        assert_eq!(rounds.next_chunk_check(), 0);
        assert_eq!(rounds.coming_agreement(), 0);
        assert_eq!(rounds.next_agreement(), 0);
        assert_eq!(rounds.coming_agreement(), 1);
        assert_eq!((rounds.next_shrink(&[3]), rounds.next_shrink(&[2]), rounds.next_shrink(&[3])), (0, 0, 1));
        assert_eq!(rounds.next_grow(), 0);
    }
}
