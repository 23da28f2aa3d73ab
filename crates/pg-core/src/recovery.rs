//! Going on after a lost rank: the survivors agree on who they are through the store, then shrink the (revoked)
//! group to them, without restarting a process.
//!
//! **Agreement** ([`ProcessGroup::agree_survivors`]). Round `n` of a group (the n-th agreement its ranks make)
//! lives under the group's store at `recovery.{n}/`: each rank that calls sets `alive/{rank}`, and marks the ranks
//! it knows are dead at `dead/{rank}` (a group with `revoke_on_error` checks in when its watchdog finds the failure,
//! before the caller gets here). A rank waits until every rank of the group is either in or marked dead, or
//! until its timeout, then proposes the ranks it saw in (less those marked dead) with one `compare_set` of
//! `decision` from empty: the first proposal is the decision, every later caller reads it instead of writing its
//! own. So every rank acts on the one list in the store (no split brain); a rank that is not on it gets
//! [`Error::Excluded`] and must stay out of the shrink.
//!
//! **Shrink** ([`ProcessGroup::shrink`]). The survivors (every rank of the group but the excluded ones) call it
//! with the same excluded list; the new group holds them in their order, under the parent's store prefix
//! `shrink.x{excluded}.{n}` (n counting this rank's shrinks of the group with that list: an excluded rank takes
//! no part in a shrink, so a count of all shrinks would differ between ranks), its ranks mapped to the parent's
//! world ranks. Its collective
//! communicator is the parent's shrunk ([`crate::Communicator::shrink`], NCCL's `ncclCommShrink`), or, when the
//! parent has none or it was aborted (a revoke on an NCCL older than 2.28.7 aborts), or the list is empty (NCCL's
//! shrink needs a rank to exclude), a new one made by a rendezvous under that prefix.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pg_store::{PrefixStore, Store};

use crate::process_group::Kind;
use crate::shared::Membership;
use crate::{Backend, CommConfig, Communicator as _, Device as _, Error, ProcessGroup, Result, ShrinkMode};

/// What [`ProcessGroup::agree_survivors`] is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgreeOptions {
    /// How long this rank waits for the others to check in, from its call; a rank not in by then is out.
    pub timeout: Duration,
    /// Ranks of the group this rank knows are dead (a peer's `remote_error`, a heartbeat): reported to the
    /// others, never waited for, never on the list.
    pub dead: Vec<usize>,
    /// How often the store is read while waiting.
    pub poll: Duration,
}

impl Default for AgreeOptions {
    fn default() -> Self {
        Self { timeout: Duration::from_secs(10), dead: Vec::new(), poll: Duration::from_millis(10) }
    }
}

/// The survivors one agreement decided: the same on every rank that got it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Survivors {
    /// The agreement's round (from 0, counting the group's agreements).
    pub round: u64,
    /// The surviving ranks of the group, ascending.
    pub ranks: Vec<usize>,
    /// The ranks of the group that are out, ascending: what [`ProcessGroup::shrink`] excludes.
    pub excluded: Vec<usize>,
}

impl Survivors {
    /// `rank`'s rank in the group shrunk to the survivors, or `None` when it is out.
    pub fn new_rank(&self, rank: usize) -> Option<usize> {
        self.ranks.iter().position(|&survivor| survivor == rank)
    }
}

/// How [`ProcessGroup::shrink`] makes the new group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShrinkOptions {
    /// [`ShrinkMode::Abort`] (the default) when the excluded ranks are dead: the parent's ops in flight stop and
    /// the parent is unusable afterwards. [`ShrinkMode::Default`] keeps a healthy parent usable.
    pub mode: ShrinkMode,
    /// The new group's timeout, and the bound on the shrink itself (`None`: the parent's).
    pub timeout: Option<Duration>,
    /// The new group's name (`None`: `{parent}.shrink.x{excluded}.{n}`).
    pub group_name: Option<String>,
}

/// The prefix of a decision's value, so that no decision is the empty value `compare_set` starts from.
const DECISION_TAG: &str = "survivors:";

impl<B: Backend> ProcessGroup<B> {
    /// Agrees with the other live ranks on who survived a failure; every rank that is alive calls it (a revoked
    /// group's store still works). Returns the same [`Survivors`] on every rank that is on the list, and
    /// [`Error::Excluded`] on a rank that is not (it checked in after the list was decided, or another rank
    /// reported it dead). A rank waits at most `options.timeout` for the others; ranks reported dead are not
    /// waited for. Ranks in `options.dead` out of range, or this rank among them, are an
    /// [`Error::InvalidArgument`].
    pub fn agree_survivors(&self, options: &AgreeOptions) -> Result<Survivors> {
        let (rank, size) = (self.rank(), self.size());
        for &dead in &options.dead {
            if dead >= size {
                return Err(Error::invalid(format!(
                    "agree_survivors: dead rank {dead} is out of range for a group of size {size}"
                )));
            }
            if dead == rank {
                return Err(Error::invalid(format!("agree_survivors: rank {rank} reports itself dead")));
            }
        }
        let round = self.shared().recoveries.fetch_add(1, Ordering::Relaxed);
        let store = self.store().as_ref();
        let key = |what: &str, rank: usize| round_key(round, what, rank);
        let decision_key = format!("recovery.{round}/decision");
        for &dead in &options.dead {
            store.set(&key("dead", dead), b"1")?;
        }
        store.set(&key("alive", rank), b"1")?;
        let device = self.device();
        let deadline = device.now().saturating_add(options.timeout);
        let (mut alive, mut dead) = (BTreeSet::from([rank]), options.dead.iter().copied().collect::<BTreeSet<_>>());
        let never = AtomicBool::new(false);
        loop {
            if store.check(&[&decision_key])? {
                break;
            }
            let pending: Vec<usize> =
                (0..size).filter(|other| !alive.contains(other) && !dead.contains(other)).collect();
            for other in pending {
                if store.check(&[&key("dead", other)])? {
                    dead.insert(other);
                } else if store.check(&[&key("alive", other)])? {
                    alive.insert(other);
                }
            }
            let now = device.now();
            if alive.len() + dead.len() >= size || now >= deadline {
                break;
            }
            device.sleep(options.poll.min(deadline - now).max(Duration::from_nanos(1)), &never);
        }
        // A rank reported dead after it checked in is out too: the last reports count.
        let mut proposal = Vec::with_capacity(alive.len());
        for &survivor in &alive {
            if !dead.contains(&survivor) && !store.check(&[&key("dead", survivor)])? {
                proposal.push(survivor);
            }
        }
        let text = format!("{DECISION_TAG}{}", proposal.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
        let decided = store.compare_set(&decision_key, b"", text.as_bytes())?;
        let ranks = parse_decision(&decided, size).ok_or_else(|| {
            Error::invalid(format!(
                "agree_survivors: store key '{decision_key}' holds '{}', not a list of survivors: is another program \
                 using this store prefix?",
                String::from_utf8_lossy(&decided)
            ))
        })?;
        tracing::info!(target: "pg", pg_id = self.local_id(), group = %self.options().group_name, rank, round,
            survivors = ?ranks, "survivors agreed");
        if !ranks.contains(&rank) {
            return Err(Error::Excluded { group: self.options().group_name.clone(), round, rank, survivors: ranks });
        }
        let excluded = (0..size).filter(|r| !ranks.contains(r)).collect();
        Ok(Survivors { round, ranks, excluded })
    }

    /// The group of every rank of this one but `excluded` (ranks of this group), ranked in their order here, made
    /// from this group's communicator without restarting a process (NCCL's `ncclCommShrink`). Every rank that is
    /// not excluded calls it with the same list; an excluded rank must not. This group may be live or revoked.
    ///
    /// With [`ShrinkMode::Abort`] this group's ops in flight stop first and it is revoked: every later op fails
    /// with [`Error::Revoked`], and so does a second shrink of it. With [`ShrinkMode::Default`] it stays usable
    /// (an op of it still in flight is then an error, unless it was revoked).
    ///
    /// Refused by name: an excluded list with this rank, a rank out of range or twice, or every rank
    /// ([`Error::InvalidArgument`]); a group shut down or aborted ([`Error::Aborted`]); a group already shrunk with
    /// abort ([`Error::Revoked`]); a backend or NCCL without the call ([`Error::Unsupported`], naming the version).
    /// The new group's subgroups and meshes are made anew from it ([`crate::DeviceMesh::after_shrink`]).
    pub fn shrink(&self, excluded: &[usize], options: &ShrinkOptions) -> Result<ProcessGroup<B>> {
        let inner = Arc::clone(self.shared());
        let (rank, size) = (self.rank(), self.size());
        if inner.superseded.load(Ordering::SeqCst) {
            return Err(Error::Revoked {
                reason: format!(
                    "rank {rank}: shrink of group '{}', which was already shrunk with abort: shrink the group that \
                     shrink returned",
                    self.options().group_name
                ),
            });
        }
        if inner.is_shut_down() {
            return Err(Error::Aborted { reason: format!("rank {rank}: shrink of a group that was shut down") });
        }
        if let Some(error @ Error::Aborted { .. }) = self.error() {
            return Err(error);
        }
        let mut out = BTreeSet::new();
        for &gone in excluded {
            if gone >= size {
                return Err(Error::invalid(format!(
                    "shrink: excluded rank {gone} is out of range for a group of size {size}"
                )));
            }
            if gone == rank {
                return Err(Error::invalid(format!(
                    "shrink: rank {rank} is on its own excluded list; an excluded rank must not call shrink"
                )));
            }
            if !out.insert(gone) {
                return Err(Error::invalid(format!("shrink: excluded rank {gone} is listed twice")));
            }
        }
        let members: Vec<usize> = (0..size).filter(|r| !out.contains(r)).collect();
        let new_rank = members.iter().position(|&r| r == rank).expect("this rank is not excluded");
        let excluded: Vec<usize> = out.into_iter().collect();
        let number = {
            let mut shrinks = inner.shrinks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let counter = shrinks.entry(excluded.clone()).or_default();
            *counter += 1;
            *counter - 1
        };
        let name = shrink_name(&excluded, number);
        let mut group_options = self.options().clone();
        group_options.group_name =
            options.group_name.clone().unwrap_or_else(|| format!("{}.{name}", self.options().group_name));
        group_options.timeout = options.timeout.unwrap_or_else(|| inner.timeout());
        let global_ranks = members.iter().map(|&r| self.global_rank(r)).collect::<Result<Arc<[usize]>>>()?;
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(name, Arc::clone(self.store())));
        let aborting = options.mode == ShrinkMode::Abort;
        if aborting {
            let reason = format!(
                "rank {rank}: group '{}' was shrunk with abort (excluded ranks {excluded:?}) into group '{}'; use that group",
                self.options().group_name,
                group_options.group_name
            );
            inner.superseded.store(true, Ordering::SeqCst);
            inner.mark_revoked(&Error::Revoked { reason });
        }
        // NCCL's shrink needs a rank to exclude (as PyTorch's `shrink_group`): a shrink that excludes none makes
        // a new communicator of the same ranks by rendezvous, after revoking the parent's when aborting.
        let child = match self.collective().filter(|comm| !comm.is_aborted() && !excluded.is_empty()) {
            Some(parent) => {
                let config = CommConfig {
                    nonblocking: false,
                    description: format!("{}:{}", group_options.group_desc, group_options.group_name),
                    timeout: Some(group_options.timeout),
                };
                let shrunk = parent.shrink(&excluded, options.mode, &config);
                if aborting {
                    inner.finish_revoke();
                }
                match shrunk {
                    Ok(child) => Some(child),
                    Err(Error::InitTimeout { what, .. }) => {
                        return Err(Error::InitTimeout {
                            cache_key: self.collective_key().cache_key(),
                            timeout: group_options.timeout,
                            what,
                        })
                    }
                    Err(error) => return Err(error),
                }
            }
            None => {
                if aborting {
                    inner.revoke_comms(&format!("rank {rank}: shrunk with abort"));
                    inner.finish_revoke();
                }
                // Nothing to shrink: the survivors rendezvous for a new communicator under the new prefix.
                group_options.eager_init = true;
                None
            }
        };
        tracing::info!(target: "pg", pg_id = self.local_id(), group = %self.options().group_name, rank, new_rank,
            size = members.len(), ?excluded, shrunk = child.is_some(), "shrinking the group");
        let kind = Kind::Subgroup(Membership { global_ranks, call: None });
        ProcessGroup::build(store, (new_rank, members.len()), self.device().clone(), group_options, kind, child)
    }
}

/// The store key of `rank`'s `what` (`alive`, `dead`) in agreement round `round`.
fn round_key(round: u64, what: &str, rank: usize) -> String {
    format!("recovery.{round}/{what}/{rank}")
}

/// Checks this rank in to the group's next agreement as soon as its revoking watchdog found the failure, before
/// the revoke itself (which may wait on a dead peer's connections) and before the caller gets to
/// [`ProcessGroup::agree_survivors`]: ranks learn of a failure at different times (a dead rank's neighbours from
/// its sockets, the others through the store), and a live rank must not miss the others' window for being late.
pub(crate) fn check_in_early<B: Backend>(group: &crate::shared::Shared<B>) {
    let round = group.recoveries.load(Ordering::Relaxed);
    let key = round_key(round, "alive", group.rank);
    if let Some(Err(error)) = group.store_op(|store| store.set(&key, b"1")) {
        tracing::warn!(target: "pg", pg_id = group.local_id, %error, "could not check in to the agreement early");
    }
}

/// The name of the `number`-th shrink (from 0) of a group that excludes `excluded`: its store prefix and the
/// suffix of the new group's default name (`shrink.x1-3.0`, `shrink.none.0`). Every caller of a shrink made the
/// same earlier shrinks with the same list, so they agree on it without talking.
fn shrink_name(excluded: &[usize], number: u64) -> String {
    let list = match excluded.is_empty() {
        true => "none".to_owned(),
        false => format!("x{}", excluded.iter().map(usize::to_string).collect::<Vec<_>>().join("-")),
    };
    format!("shrink.{list}.{number}")
}

/// The survivors a decision's value lists, if it is one (ranks below `size`, ascending).
fn parse_decision(value: &[u8], size: usize) -> Option<Vec<usize>> {
    let text = std::str::from_utf8(value).ok()?.strip_prefix(DECISION_TAG)?;
    if text.is_empty() {
        return Some(Vec::new());
    }
    let ranks = text.split(',').map(|r| r.parse::<usize>().ok().filter(|&r| r < size)).collect::<Option<Vec<_>>>()?;
    ranks.windows(2).all(|pair| pair[0] < pair[1]).then_some(ranks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions_parse_only_as_ascending_ranks_in_range() {
        assert_eq!(parse_decision(b"survivors:0,1,3", 4), Some(vec![0, 1, 3]));
        assert_eq!(parse_decision(b"survivors:", 4), Some(vec![]));
        assert_eq!(parse_decision(b"survivors:0,4", 4), None);
        assert_eq!(parse_decision(b"survivors:1,0", 4), None);
        assert_eq!(parse_decision(b"0,1", 4), None);
        assert_eq!(parse_decision(b"survivors:a", 4), None);
    }

    #[test]
    fn shrinks_are_named_by_their_list_and_number() {
        assert_eq!(shrink_name(&[1, 3], 0), "shrink.x1-3.0");
        assert_eq!(shrink_name(&[], 2), "shrink.none.2");
    }

    #[test]
    fn a_rank_maps_to_its_place_among_the_survivors() {
        let survivors = Survivors { round: 0, ranks: vec![0, 2, 3], excluded: vec![1] };
        assert_eq!(survivors.new_rank(2), Some(1));
        assert_eq!(survivors.new_rank(1), None);
    }
}
