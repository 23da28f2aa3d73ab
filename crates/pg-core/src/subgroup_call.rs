//! One subgroup call (`new_group` or `split_by_color`) as this rank made it: the view it publishes under the
//! parent's store (`subgroup.{n}/{rank}`), and the check that every rank of the parent made the same call `n`
//! (see `subgroups.rs`, which makes the calls, and `process_group.rs`, which checks one before a subgroup's first
//! communicator is created).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_store::Store;

use crate::{Device, Error, Result};

/// How many ranks a call's description lists in full; a longer list is shortened and carries a digest.
const LISTED_RANKS: usize = 16;

/// One subgroup call as this rank made it, published under the parent's store for the other ranks to compare.
pub(crate) struct SubgroupCall {
    /// The parent's store, which holds every parent rank's view of the call under `subgroup.{call}/{rank}`.
    store: Arc<dyn Store>,
    /// The parent group's name, for errors.
    parent: String,
    /// This rank and the number of ranks, in the parent.
    rank: usize,
    size: usize,
    /// The call's number among the parent's subgroup calls.
    call: u64,
    /// What this rank called: `new_group(ranks [..])` or `split_by_color(..)`.
    view: String,
    /// Set once every rank's view was read and found to agree: later creations skip the check.
    checked: AtomicBool,
}

impl SubgroupCall {
    /// Publishes `view`, this rank's call number `call` of the parent group `parent` (this rank and the number of
    /// ranks in `place`), under the parent's `store`.
    pub(crate) fn publish(
        store: Arc<dyn Store>,
        parent: String,
        place: (usize, usize),
        call: u64,
        view: String,
    ) -> Result<Self> {
        let (rank, size) = place;
        let call = Self { store, parent, rank, size, call, view, checked: AtomicBool::new(false) };
        call.store.set(&call.key(rank), call.view.as_bytes())?;
        Ok(call)
    }

    /// The call's number among the parent's subgroup calls.
    pub(crate) fn number(&self) -> u64 {
        self.call
    }

    /// Whether every rank's view was found to agree with this one.
    pub(crate) fn is_checked(&self) -> bool {
        self.checked.load(Ordering::Acquire)
    }

    /// Records that every rank's view was read and agrees (`split_by_color` compares them itself).
    pub(crate) fn mark_checked(&self) {
        self.checked.store(true, Ordering::Release);
    }

    /// The store key (under the parent's store) of `rank`'s view.
    pub(crate) fn key(&self, rank: usize) -> String {
        format!("subgroup.{}/{rank}", self.call)
    }

    /// Every parent rank's view of this call, in rank order, waiting for them until `deadline` (the device's
    /// clock); a rank that has not published by then is an [`Error::InitTimeout`] from `timed_out`.
    pub(crate) fn views<D: Device>(
        &self,
        device: &D,
        deadline: Duration,
        timed_out: &dyn Fn(String) -> Error,
    ) -> Result<Vec<String>> {
        let keys: Vec<String> = (0..self.size).map(|rank| self.key(rank)).collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let remaining = deadline.saturating_sub(device.now());
        let store_timeout = store_bound(self.store.as_ref());
        match self.store.wait(&keys, Some(remaining.min(store_timeout))) {
            Ok(()) => {}
            Err(source) if source.is_timeout() && remaining <= store_timeout => {
                let mut missing = Vec::new();
                for (rank, key) in keys.iter().enumerate() {
                    if !self.store.check(&[key])? {
                        missing.push(rank.to_string());
                    }
                }
                return Err(timed_out(format!(
                    "rank(s) {} of group '{}' never made subgroup call {} (this rank's was {}): every rank must call \
                     new_group and split_by_color in the same order",
                    missing.join(", "),
                    self.parent,
                    self.call,
                    self.view
                )));
            }
            Err(source) => return Err(source.into()),
        }
        let values = self.store.multi_get(&keys)?;
        Ok(values.into_iter().map(|value| String::from_utf8_lossy(&value).into_owned()).collect())
    }

    /// Checks that every parent rank's view of this call is this rank's (once; later calls return at once).
    pub(crate) fn check<D: Device>(
        &self,
        device: &D,
        deadline: Duration,
        timed_out: &dyn Fn(String) -> Error,
    ) -> Result<()> {
        if self.checked.load(Ordering::Acquire) {
            return Ok(());
        }
        let views = self.views(device, deadline, timed_out)?;
        if let Some((peer, theirs)) = views.iter().enumerate().find(|(_, theirs)| **theirs != self.view) {
            return Err(self.mismatch(peer, theirs));
        }
        self.checked.store(true, Ordering::Release);
        Ok(())
    }

    /// The error of a rank `peer` whose view `theirs` differs from this rank's.
    pub(crate) fn mismatch(&self, peer: usize, theirs: &str) -> Error {
        Error::SubgroupMismatch {
            group: self.parent.clone(),
            call: self.call,
            rank: self.rank,
            mine: self.view.clone(),
            peer,
            theirs: theirs.to_owned(),
        }
    }
}

/// `ranks` as a call's description shows them: the list, or for a long one its ends, its length and a digest of
/// the whole list (64-bit FNV-1a), so that two different lists are told apart without publishing every rank.
pub(crate) fn ranks_text(ranks: &[usize]) -> String {
    if ranks.len() <= LISTED_RANKS {
        return format!("{ranks:?}");
    }
    let digest = ranks
        .iter()
        .flat_map(|&rank| (rank as u64).to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3));
    let show = |part: &[usize]| part.iter().map(usize::to_string).collect::<Vec<_>>().join(", ");
    let half = LISTED_RANKS / 2;
    format!(
        "[{}, ..., {}] ({} ranks, digest {digest:016x})",
        show(&ranks[..half]),
        show(&ranks[ranks.len() - half..]),
        ranks.len()
    )
}

/// The view `split_by_color` publishes for `color`.
pub(crate) fn split_view(color: Option<u32>) -> String {
    match color {
        Some(color) => format!("split_by_color(color {color})"),
        None => "split_by_color(no color)".to_owned(),
    }
}

/// The color in a view `split_by_color` published: `Some(None)` for no color, `None` for a view of another
/// call.
pub(crate) fn color_of(view: &str) -> Option<Option<u32>> {
    let inner = view.strip_prefix("split_by_color(")?.strip_suffix(')')?;
    match inner {
        "no color" => Some(None),
        _ => inner.strip_prefix("color ")?.parse().ok().map(Some),
    }
}

/// How long `store`'s own timeout lets a wait last: a store opened with a zero timeout ("no timeout", as
/// PyTorch's) bounds nothing, and the group's own deadline decides.
pub(crate) fn store_bound(store: &dyn Store) -> std::time::Duration {
    Some(store.timeout()).filter(|timeout| !timeout.is_zero()).unwrap_or(std::time::Duration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_list_is_shown_whole_and_a_long_one_by_its_ends_and_a_digest() {
        assert_eq!(ranks_text(&[0, 2, 4]), "[0, 2, 4]");
        let long: Vec<usize> = (0..40).collect();
        let text = ranks_text(&long);
        assert!(text.starts_with("[0, 1, 2, 3, 4, 5, 6, 7, ..., 32, 33,"), "{text}");
        assert!(text.contains("(40 ranks, digest "), "{text}");
        // A list that differs only inside the part not shown still reads differently.
        let mut other = long.clone();
        other[20] = 99;
        assert_ne!(ranks_text(&other), text);
    }

    #[test]
    fn a_split_view_gives_back_its_color_and_another_call_none() {
        assert_eq!(color_of(&split_view(Some(7))), Some(Some(7)));
        assert_eq!(color_of(&split_view(None)), Some(None));
        assert_eq!(color_of("new_group(ranks [0, 1])"), None);
        assert_eq!(color_of("split_by_color(color x)"), None);
    }
}
