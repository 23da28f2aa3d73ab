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
//!
//! **Grow** ([`ProcessGroup::grow`], [`ProcessGroup::join_grown`]). Every member of a group calls `grow(added)`
//! and each new process calls `join_grown` with the world's store (the one the world group was made with), its
//! new rank and the new size. The members' grow `n` (counting the group's grows) lives under the group's store at
//! `grow.{n}/`, which is the grown group's store: rank 0 publishes the unique id of the grow there (`id`, from
//! [`crate::Communicator::grow_unique_id`], NCCL's `ncclCommGetUniqueId`) and, under the world's store, a ticket
//! for each new rank (where the grow lives, the new size, the grown group's name and world ranks), which a
//! process calling `join_grown` for that rank takes. Tickets for new rank `r` form a queue: a grow posts its ticket
//! at the next index of the counter `grow.join/{r}/posted` (key `grow.join/{r}/{index}`), and a new process claims
//! the next index of `grow.join/{r}/claimed` and waits for the ticket there, so grows of sibling groups that add the
//! same new rank at once each get a process of their own. A claim given up at the timeout, and a ticket of a grow
//! that failed, are voided in the store (one `compare_set`), so that neither leaves a gap in the pairing: a
//! grow that finds its index voided posts at the next, and a process that finds a voided ticket claims again.
//! Then every rank, old and new, checks in with the new
//! size it asks for (`member/{rank}`, `joiner/{rank}`) and compares it with everyone's before any communicator is
//! touched, so a rank that asks for another size makes every rank fail by name. Rank 0 chooses how the grown
//! communicator is made and says so at `path` before it checks in: `grow` where its device grows communicators
//! ([`crate::Capability::Grow`] in [`crate::Device::capabilities`]): the group's communicator grown ([`crate::Communicator::grow`], NCCL's
//! `ncclCommGrow`) on the members and joined ([`crate::Device::join_grown`]) on the new ranks; else `rendezvous`
//! (NCCL before 2.29): a new communicator of every rank, old and new, made by a rendezvous under `grow.{n}/` as a
//! group's first op makes one. Either way the members keep their ranks and the new ones take the next.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use pg_store::{PrefixStore, Store};

use crate::lifecycle::Call;
use crate::process_group::Kind;
use crate::shared::Membership;
use crate::{
    Backend, CommConfig, Communicator as _, Device as _, Error, Event as _, Options, ProcessGroup, Result, ShrinkMode,
    UniqueId,
};

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

/// How [`ProcessGroup::grow`] makes the grown group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrowOptions {
    /// The grown group's timeout, and the bound on the grow itself, the wait for the new ranks included (`None`:
    /// the group's).
    pub timeout: Option<Duration>,
    /// The grown group's name (`None`: `{group}.grow.{n}`); the new ranks take it from the members.
    pub group_name: Option<String>,
    /// The world ranks of the new ranks, in their order (`None`: the ranks after the group's largest world rank, so
    /// a group of world ranks 0, 1 and 2 grown by one gives the new rank world rank 3, the place of a rank it lost).
    pub world_ranks: Option<Vec<usize>>,
}

/// The prefix of a decision's value, so that no decision is the empty value `compare_set` starts from.
const DECISION_TAG: &str = "survivors:";

/// The first line of a grow's ticket for a new rank.
const TICKET_TAG: &str = "pg-grow-ticket";

/// What a voided place of the ticket queue holds (a claim given up, or the ticket of a grow that failed).
const VOID_TICKET: &[u8] = b"pg-grow-ticket-void";

impl<B: Backend> ProcessGroup<B> {
    /// Agrees with the other live ranks on who survived a failure; every rank that is alive calls it (a revoked
    /// group's store still works). Returns the same [`Survivors`] on every rank that is on the list, and
    /// [`Error::Excluded`] on a rank that is not (it checked in after the list was decided, or another rank
    /// reported it dead). A rank waits at most `options.timeout` for the others; ranks reported dead are not
    /// waited for. Ranks in `options.dead` out of range, or this rank among them, are an
    /// [`Error::InvalidArgument`].
    ///
    /// With [`Options::liveness`] a rank whose liveness connection closed is known dead from the store: nobody waits
    /// for it and it is not on the list, so the agreement ends as soon as every live rank is in; the timeout only
    /// bounds the wait for a rank that is neither in nor known dead (a live but late one, or a store without
    /// liveness). A store that stops answering meanwhile (hosted by a rank that died) is [`Error::StoreLost`].
    pub fn agree_survivors(&self, options: &AgreeOptions) -> Result<Survivors> {
        self.agree(options).map_err(|error| match error {
            Error::Store(source) if !source.is_timeout() => Error::StoreLost {
                group: self.options().group_name.clone(),
                during: "agree_survivors".to_owned(),
                source: Box::new(source),
            },
            other => other,
        })
    }

    fn agree(&self, options: &AgreeOptions) -> Result<Survivors> {
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
        self.shared().check(Call::Agree)?;
        let round = self.shared().rounds.next_agreement();
        let store = self.store().as_ref();
        let key = |what: &str, rank: usize| crate::failure::round_key(round, what, rank);
        let decision_key = format!("recovery.{round}/decision");
        let liveness = self.shared().store_link.has_liveness();
        // Dead: reported in this round, or (with liveness) its connection to the store closed.
        let is_dead = |other: usize| -> Result<bool> {
            Ok(store.check(&[&key("dead", other)])? || (liveness && crate::liveness::is_dead(store, other)?))
        };
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
                if is_dead(other)? {
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
            if !dead.contains(&survivor) && !is_dead(survivor)? {
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
    /// abort ([`Error::Revoked`]); a backend without [`crate::Capability::Shrink`] ([`Error::Unsupported`], naming
    /// it, before any store traffic).
    /// The new group's subgroups and meshes are made anew from it ([`crate::DeviceMesh::after_shrink`]).
    pub fn shrink(&self, excluded: &[usize], options: &ShrinkOptions) -> Result<ProcessGroup<B>> {
        let inner = Arc::clone(self.shared());
        let (rank, size) = (self.rank(), self.size());
        let aborting = options.mode == ShrinkMode::Abort;
        inner.check(if aborting { Call::ShrinkAbort } else { Call::Shrink })?;
        crate::backend::require(self.device(), crate::Capability::Shrink, "shrink")?;
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
        let number = inner.rounds.next_shrink(&excluded);
        let name = shrink_name(&excluded, number);
        let mut group_options = self.options().clone();
        group_options.group_name =
            options.group_name.clone().unwrap_or_else(|| format!("{}.{name}", self.options().group_name));
        group_options.timeout = options.timeout.unwrap_or_else(|| inner.timeout());
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(name, Arc::clone(self.store())));
        let global_ranks = members.iter().map(|&r| self.global_rank(r)).collect::<Result<Arc<[usize]>>>()?;
        if aborting {
            let reason = format!(
                "rank {rank}: group '{}' is being shrunk with abort (excluded ranks {excluded:?}) into group '{}'",
                self.options().group_name,
                group_options.group_name
            );
            let error = Error::Revoked { reason };
            inner.transition(Call::ShrinkAbort, Some(error.clone()))?;
            inner.fail_revoked_works(&error);
        }
        let shrunk = self.shrink_into(
            &inner,
            store,
            (new_rank, members.len()),
            &excluded,
            options,
            group_options.clone(),
            global_ranks,
        );
        if aborting {
            // The group is superseded by the shrunk one, or, where the shrink failed, left revoked and shrinkable
            // again (the survivors agree again and shrink with the right list).
            let ended = match &shrunk {
                Ok(_) => Call::ShrinkSucceeded,
                Err(_) => Call::ShrinkFailed,
            };
            let reason = format!(
                "rank {rank}: group '{}' was shrunk with abort (excluded ranks {excluded:?}) into group '{}'; use that group",
                self.options().group_name,
                group_options.group_name
            );
            let _ = inner.transition(ended, Some(Error::Revoked { reason }));
        }
        shrunk
    }

    /// The body of [`ProcessGroup::shrink`] once the call was checked and, for a shrink with abort, the group moved to
    /// shrinking: the path every caller agrees on, the new communicator, and the new group. With abort, the group's
    /// communicators are revoked (or shrunk with abort) whether it succeeds or not.
    #[allow(clippy::too_many_arguments)]
    fn shrink_into(
        &self,
        inner: &Arc<crate::shared::Shared<B>>,
        store: Arc<dyn Store>,
        (new_rank, new_size): (usize, usize),
        excluded: &[usize],
        options: &ShrinkOptions,
        mut group_options: Options,
        global_ranks: Arc<[usize]>,
    ) -> Result<ProcessGroup<B>> {
        let rank = self.rank();
        let aborting = options.mode == ShrinkMode::Abort;
        let revoke_rest = || {
            if aborting {
                inner.revoke_comms(&format!("rank {rank}: shrunk with abort"));
                inner.finish_revoke();
            }
        };
        // NCCL's shrink needs a rank to exclude (as PyTorch's `shrink_group`): a shrink that excludes none makes
        // a new communicator of the same ranks by rendezvous, after revoking the parent's when aborting. So does a
        // shrink where any caller's communicator was aborted or reported an asynchronous error (on NCCL the dead
        // rank's neighbours lose its connections, and `ncclCommShrink` of such a communicator fails, while the
        // others only revoked theirs): the callers agree on the path through the store.
        let failed = inner.lifecycle.comm_failed();
        let parent = self
            .collective()
            .filter(|comm| !failed && !comm.is_aborted() && comm.async_error().is_ok() && !excluded.is_empty());
        let every_caller_shrinks =
            match agree_on_shrink(store.as_ref(), new_rank, new_size, parent.is_some(), group_options.timeout) {
                Ok(every) => every,
                Err(error) => {
                    revoke_rest();
                    return Err(error);
                }
            };
        let child = match parent.filter(|_| every_caller_shrinks) {
            Some(parent) => {
                let config = CommConfig {
                    nonblocking: false,
                    description: format!("{}:{}", group_options.group_desc, group_options.group_name),
                    timeout: Some(group_options.timeout),
                };
                let shrunk = parent.shrink(excluded, options.mode, &config);
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
                revoke_rest();
                // Nothing to shrink: the survivors rendezvous for a new communicator under the new prefix.
                group_options.eager_init = true;
                None
            }
        };
        tracing::info!(target: "pg", pg_id = self.local_id(), group = %self.options().group_name, rank, new_rank,
            size = new_size, ?excluded, shrunk = child.is_some(), "shrinking the group");
        let kind = Kind::Subgroup(Membership { global_ranks, call: None, root: self.root_store() });
        ProcessGroup::build(store, (new_rank, new_size), self.device().clone(), group_options, kind, child)
    }
}

/// Whether every caller of a shrink (`size` of them, this one `rank` among them, under the shrink's store) can
/// shrink its communicator: each publishes whether it can, then reads everyone's, waiting at most `timeout`.
fn agree_on_shrink(store: &dyn Store, rank: usize, size: usize, can: bool, timeout: Duration) -> Result<bool> {
    let key = |r: usize| format!("shrink_path/{r}");
    store.set(&key(rank), if can { b"shrink" } else { b"rendezvous" })?;
    let mut every = can;
    for other in (0..size).filter(|&other| other != rank) {
        store.wait(&[&key(other)], Some(timeout))?;
        every &= store.get(&key(other))? == b"shrink";
    }
    Ok(every)
}

impl<B: Backend> ProcessGroup<B> {
    /// The group of this one's ranks and `added` new ones, which join from processes of their own with
    /// [`ProcessGroup::join_grown`]; made without restarting a process, from this group's communicator where the
    /// device grows communicators (NCCL's `ncclCommGrow`, 2.29), else by a rendezvous of every rank, old and new,
    /// for a new communicator (as rank 0 chooses; see the module's text). Every rank of this group calls it, in the
    /// same order as its other grows, with the same `added`; this group's ranks keep their numbers in the grown one
    /// and the new ranks take the next, their world ranks from `options.world_ranks`. This group stays usable.
    /// Subgroups and meshes of the grown group are made anew from it ([`crate::DeviceMesh::after_grow`]).
    ///
    /// Refused by name: `added` of 0, a size past NCCL's range, or world ranks that are not `added` new ones
    /// ([`Error::InvalidArgument`]); a group with ops that have not finished ([`Error::InvalidArgument`]: wait for
    /// them first); a group shut down or aborted ([`Error::Aborted`]); a revoked group, or one shrunk with abort
    /// ([`Error::Revoked`]: grow the shrunk group); ranks, old or new, that ask for different sizes
    /// ([`Error::InvalidArgument`] on every rank, naming both); new ranks that do not come within the timeout
    /// ([`Error::InitTimeout`], naming them).
    pub fn grow(&self, added: usize, options: &GrowOptions) -> Result<ProcessGroup<B>> {
        let inner = Arc::clone(self.shared());
        let (rank, size) = (self.rank(), self.size());
        let name = &self.options().group_name;
        inner.check(Call::Grow)?;
        if added == 0 {
            return Err(Error::invalid(format!("grow of group '{name}': added is 0; a grow adds at least one rank")));
        }
        let new_size = size.checked_add(added).filter(|&n| n <= i32::MAX as usize).ok_or_else(|| {
            Error::invalid(format!(
                "grow of group '{name}': {size} + {added} ranks is more than a communicator can have (NCCL's int)"
            ))
        })?;
        let running = inner.in_flight.snapshot().iter().filter(|work| !work.end_event.query().unwrap_or(true)).count();
        if running > 0 {
            return Err(Error::invalid(format!(
                "grow of group '{name}': {running} op(s) of the group have not finished; a communicator grows with \
                 nothing in flight: wait for them first"
            )));
        }
        let mut global_ranks = self.global_ranks();
        let new_world = match &options.world_ranks {
            Some(ranks) => {
                let mut seen = BTreeSet::new();
                if ranks.len() != added || ranks.iter().any(|r| global_ranks.contains(r) || !seen.insert(*r)) {
                    return Err(Error::invalid(format!(
                        "grow of group '{name}': world_ranks {ranks:?} are not {added} distinct world ranks outside \
                         the group's {global_ranks:?}"
                    )));
                }
                ranks.clone()
            }
            None => {
                let next = global_ranks.iter().max().map_or(0, |r| r + 1);
                (next..next + added).collect()
            }
        };
        global_ranks.extend(new_world);
        let number = inner.rounds.next_grow();
        let grow_name = format!("grow.{number}");
        let mut group_options = self.options().clone();
        group_options.group_name = options.group_name.clone().unwrap_or_else(|| format!("{name}.{grow_name}"));
        group_options.timeout = options.timeout.unwrap_or_else(|| inner.timeout());
        let timeout = group_options.timeout;
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(grow_name.clone(), Arc::clone(self.store())));
        let root = self.root_store();
        let mut tickets: Vec<(String, String)> = Vec::new();
        if rank == 0 {
            let path = match self.capabilities().grow {
                true => GrowPath::Grow,
                false => {
                    tracing::info!(target: "pg", group = %name, backend = B::NAME,
                        "no grow capability: the grown communicator is made by a rendezvous of every rank, old and new");
                    GrowPath::Rendezvous
                }
            };
            store.set(GROW_PATH_KEY, path.name().as_bytes())?;
            let ticket = Ticket {
                path: join_path(&self.store_path(), &grow_name),
                size: new_size,
                old: size,
                name: group_options.group_name.clone(),
                world: global_ranks.clone(),
            };
            let text = ticket.encode();
            for new_rank in size..new_size {
                tickets.push((post_ticket(root.as_ref(), new_rank, text.as_bytes())?, text.clone()));
            }
        }
        let cache_key = self.collective_key().cache_key();
        if let Err(error) =
            check_in(store.as_ref(), (rank, size, new_size), timeout, &group_options.group_name, &cache_key)
        {
            // No new process may take a ticket of a grow that did not happen: voided unless already taken.
            for (key, text) in &tickets {
                let _ = root.compare_set(key, text.as_bytes(), VOID_TICKET);
            }
            return Err(error);
        }
        let path = grow_path(store.as_ref(), &group_options.group_name, self.device())?;
        tracing::info!(target: "pg", pg_id = self.local_id(), group = %name, rank, size, new_size,
            grown = %group_options.group_name, ?path, "growing the group");
        let kind =
            Kind::Subgroup(Membership { global_ranks: global_ranks.into(), call: None, root: self.root_store() });
        if path == GrowPath::Rendezvous {
            group_options.eager_init = true;
            return ProcessGroup::build(store, (rank, new_size), self.device().clone(), group_options, kind, None);
        }
        let comm = match self.live_collective() {
            Some(comm) => comm,
            // The group has not made its communicator yet: every member makes it now, as a first op would.
            None => self.collective_comm()?,
        };
        // The id is made only now that every rank is in (NCCL makes one id per grow, and the next only once it is
        // used), and the new ranks wait for it, so the members start the grow first, as NCCL wants.
        let id = match rank {
            0 => {
                let id = comm.grow_unique_id()?;
                store.set("id", &id.0)?;
                Some(id)
            }
            _ => None,
        };
        let config = CommConfig {
            nonblocking: false,
            description: format!("{}:{}", group_options.group_desc, group_options.group_name),
            timeout: Some(timeout),
        };
        let child = comm.grow(added, id.as_ref(), &config).map_err(|error| match error {
            Error::InitTimeout { what, .. } => Error::InitTimeout { cache_key: cache_key.clone(), timeout, what },
            other => other,
        })?;
        ProcessGroup::build(store, (rank, new_size), self.device().clone(), group_options, kind, Some(child))
    }

    /// This process's rank `rank` of a group that its members grow to `size` with [`ProcessGroup::grow`]: waits
    /// for a grow that needs this rank, announced under `store` (the store the world group was made with, in the
    /// queue of tickets `grow.join/{rank}/`), takes it, and joins the grown communicator (NCCL's `ncclCommGrow`
    /// with no parent, or the rendezvous, as the members' rank 0 chose). Where several groups grow into this
    /// rank at once (sibling subgroups), each process calling for it takes the next grow's ticket, in the order the
    /// grows posted them. The group gets the members' name and world ranks; `options` gives the rest (its timeout
    /// bounds the wait for the grow and the join).
    ///
    /// Refused by name: a grow that rank 0 makes with `ncclCommGrow` on a device that cannot join one
    /// ([`Error::Unsupported`], naming the version); a rank out of range ([`Error::InvalidArgument`]); a grow to
    /// another size than `size` ([`Error::InvalidArgument`] on every rank, naming both); no grow that needs this
    /// rank within the timeout ([`Error::InitTimeout`]).
    pub fn join_grown(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        device: B::Device,
        options: Options,
    ) -> Result<ProcessGroup<B>> {
        if rank >= size {
            return Err(Error::invalid(format!("join_grown: rank {rank} is out of range for a group of size {size}")));
        }
        let timeout = options.timeout;
        let start = device.now();
        let (key, value) = loop {
            // The next place of the queue of tickets for this rank is this process's.
            let index = store.add(&ticket_counter(rank, "claimed"), 1)? - 1;
            let key = ticket_key(rank, index);
            let left = timeout.saturating_sub(device.now().saturating_sub(start));
            let value = match store.wait(&[&key], Some(left)) {
                Ok(()) => store.get(&key)?,
                Err(source) if source.is_timeout() => {
                    // Given up: the place is voided, so that a grow posting there later posts at the next one; a
                    // ticket posted meanwhile is taken all the same.
                    let value = store.compare_set(&key, b"", VOID_TICKET)?;
                    if value == VOID_TICKET {
                        return Err(Error::InitTimeout {
                            cache_key: format!("grow.join/{rank}"),
                            timeout,
                            what: format!(
                                "no group announced a grow that needs rank {rank} under store key '{key}': the \
                                 members may not have called grow, or grow to fewer ranks"
                            ),
                        });
                    }
                    value
                }
                Err(source) => return Err(source.into()),
            };
            if value == VOID_TICKET {
                // The ticket of a grow that failed: the next place.
                store.delete_key(&key)?;
                continue;
            }
            break (key, value);
        };
        let ticket = Ticket::decode(&value).ok_or_else(|| {
            Error::invalid(format!(
                "join_grown: store key '{key}' holds '{}', not a grow's ticket: is another program using this store?",
                String::from_utf8_lossy(&value)
            ))
        })?;
        // The ticket is this rank's: taken, so that a later grow needing this rank again publishes a fresh one.
        store.delete_key(&key)?;
        let grown: Arc<dyn Store> = Arc::new(PrefixStore::new(ticket.path.clone(), Arc::clone(&store)));
        let mut options = options;
        options.group_name = ticket.name.clone();
        let cache_key = format!("grow of '{}'", ticket.name);
        if ticket.size != size {
            // Checked in all the same, so that the members see the difference and fail by name too.
            grown.set(&format!("joiner/{rank}"), size.to_string().as_bytes())?;
            return Err(size_mismatch(&ticket.name, (rank, size), (0, ticket.size), "member"));
        }
        check_in(grown.as_ref(), (rank, ticket.old, size), timeout, &ticket.name, &cache_key)?;
        let kind =
            Kind::Subgroup(Membership { global_ranks: ticket.world.into(), call: None, root: Arc::clone(&store) });
        if grow_path(grown.as_ref(), &ticket.name, &device)? == GrowPath::Rendezvous {
            tracing::info!(target: "pg", group = %ticket.name, rank, size, "joining a grown group by rendezvous");
            options.eager_init = true;
            return ProcessGroup::build(grown, (rank, size), device, options, kind, None);
        }
        grown.wait(&["id"], Some(timeout)).map_err(|source| match source.is_timeout() {
            true => Error::InitTimeout {
                cache_key: cache_key.clone(),
                timeout,
                what: format!("rank 0 of group '{}' never published the grow's unique id", ticket.name),
            },
            false => source.into(),
        })?;
        let id = UniqueId(grown.get("id")?);
        let config = CommConfig {
            nonblocking: false,
            description: format!("{}:{}", options.group_desc, ticket.name),
            timeout: Some(timeout),
        };
        tracing::info!(target: "pg", group = %ticket.name, rank, size, "joining a grown group");
        let comm = device.join_grown(&id, size, rank, &config)?;
        ProcessGroup::build(grown, (rank, size), device, options, kind, Some(comm))
    }
}

/// What a new rank learns of the grow that needs it (its ticket, at `grow.join/{rank}/{index}` under the world's store).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ticket {
    /// The grown group's store, as a path of prefixes under the world's store.
    path: String,
    /// The grown group's size.
    size: usize,
    /// The size of the group that grows (the first new rank).
    old: usize,
    /// The grown group's name.
    name: String,
    /// The grown group's world ranks, in group-rank order.
    world: Vec<usize>,
}

impl Ticket {
    fn encode(&self) -> String {
        let world = self.world.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
        format!("{TICKET_TAG}\n{}\n{}\n{}\n{world}\n{}", self.path, self.size, self.old, self.name)
    }

    fn decode(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        let mut lines = text.splitn(6, '\n');
        (lines.next()? == TICKET_TAG).then_some(())?;
        let path = lines.next()?.to_owned();
        let size = lines.next()?.parse().ok()?;
        let old = lines.next()?.parse().ok()?;
        let world = lines.next()?.split(',').map(|r| r.parse().ok()).collect::<Option<Vec<usize>>>()?;
        let name = lines.next()?.to_owned();
        (old < size && world.len() == size).then_some(Self { path, size, old, name, world })
    }
}

/// The key under a grow's store where rank 0 says how the grown communicator is made ([`GrowPath::name`]).
const GROW_PATH_KEY: &str = "path";

/// How a grow makes its communicator, as rank 0 chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrowPath {
    /// The members grow their communicator and the new ranks join it ([`crate::Communicator::grow`]).
    Grow,
    /// Every rank, old and new, joins a new communicator made by a rendezvous (a device that cannot grow).
    Rendezvous,
}

impl GrowPath {
    fn name(self) -> &'static str {
        match self {
            GrowPath::Grow => "grow",
            GrowPath::Rendezvous => "rendezvous",
        }
    }
}

/// The path rank 0 chose for the grown group `name` (read under its `store` once every rank has checked in, so
/// rank 0 has written it); a rank told to grow whose `device` cannot is refused by name.
fn grow_path<D: crate::Device>(store: &dyn Store, name: &str, device: &D) -> Result<GrowPath> {
    let value = store.get(GROW_PATH_KEY)?;
    let path = [GrowPath::Grow, GrowPath::Rendezvous].into_iter().find(|path| path.name().as_bytes() == value);
    match path {
        Some(GrowPath::Grow) => {
            let call = format!("grow of group '{name}' (rank 0 grows the communicator; this rank joins it)");
            crate::backend::require(device, crate::Capability::Grow, &call).map(|()| GrowPath::Grow)
        }
        Some(GrowPath::Rendezvous) => Ok(GrowPath::Rendezvous),
        None => Err(Error::invalid(format!(
            "grow of group '{name}': store key '{GROW_PATH_KEY}' holds '{}', not a grow's path: is another program \
             using this store?",
            String::from_utf8_lossy(&value)
        ))),
    }
}

/// The world-store key of the ticket of new rank `rank`.
/// The place `index` of the queue of tickets for new rank `rank`, under the world's store.
fn ticket_key(rank: usize, index: i64) -> String {
    format!("grow.join/{rank}/{index}")
}

/// The counter of the places of the queue of tickets for new rank `rank` that grows posted (`posted`) or new
/// processes claimed (`claimed`).
fn ticket_counter(rank: usize, which: &str) -> String {
    format!("grow.join/{rank}/{which}")
}

/// Posts `ticket` at the next place of the queue of tickets for new rank `rank` that no new process has voided;
/// returns its key.
fn post_ticket(store: &dyn Store, rank: usize, ticket: &[u8]) -> Result<String> {
    loop {
        let key = ticket_key(rank, store.add(&ticket_counter(rank, "posted"), 1)? - 1);
        if store.compare_set(&key, b"", ticket)? == ticket {
            return Ok(key);
        }
    }
}

/// `path` (a path of store prefixes, empty for none) and then `name`.
fn join_path(path: &str, name: &str) -> String {
    match path.is_empty() {
        true => name.to_owned(),
        false => format!("{path}/{name}"),
    }
}

/// Checks rank `rank` of a grow from `old` to `size` ranks in under the grown group's `store` with the size it
/// asks for, then, for the members and then for the new ranks, waits for every one to check in (at most `timeout`
/// in all) and compares: a rank that asks for another size is an [`Error::InvalidArgument`] naming both (members
/// that disagree fail so without waiting for new ranks), one that never checks in an [`Error::InitTimeout`] naming
/// it.
fn check_in(
    store: &dyn Store,
    (rank, old, size): (usize, usize, usize),
    timeout: Duration,
    name: &str,
    cache_key: &str,
) -> Result<()> {
    let key = |r: usize| match r < old {
        true => format!("member/{r}"),
        false => format!("joiner/{r}"),
    };
    store.set(&key(rank), size.to_string().as_bytes())?;
    for ranks in [0..old, old..size] {
        let keys: Vec<String> = ranks.clone().map(key).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        if let Err(source) = store.wait(&refs, Some(timeout)) {
            if !source.is_timeout() {
                return Err(source.into());
            }
            let mut missing = Vec::new();
            for (r, key) in ranks.zip(&refs) {
                if !store.check(&[key])? {
                    missing.push(r);
                }
            }
            return Err(Error::InitTimeout {
                cache_key: cache_key.to_owned(),
                timeout,
                what: format!(
                    "grow of group '{name}' from {old} to {size} ranks: rank(s) {missing:?} never checked in (new \
                     ranks join with ProcessGroup::join_grown)"
                ),
            });
        }
        for (r, key) in ranks.zip(&keys) {
            let value = store.get(key)?;
            let theirs = std::str::from_utf8(&value).ok().and_then(|t| t.parse::<usize>().ok());
            if theirs != Some(size) {
                let role = if r < old { "member" } else { "new" };
                return Err(size_mismatch(name, (rank, size), (r, theirs.unwrap_or(0)), role));
            }
        }
    }
    Ok(())
}

/// The error of a grow whose ranks ask for different sizes: `mine` and `theirs` are (rank, size).
fn size_mismatch(name: &str, mine: (usize, usize), theirs: (usize, usize), role: &str) -> Error {
    Error::invalid(format!(
        "grow of group '{name}': rank {} grows the group to {} ranks, but {role} rank {} to {}; every rank, old and \
         new, must ask for the same size",
        mine.0, mine.1, theirs.0, theirs.1
    ))
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
    fn a_grow_ticket_reads_back_as_written_and_nothing_else_reads_as_one() {
        let ticket = Ticket {
            path: join_path("shrink.x3.0", "grow.0"),
            size: 4,
            old: 3,
            name: "0.shrink.x3.0.grow.0".to_owned(),
            world: vec![0, 1, 2, 3],
        };
        assert_eq!(ticket.path, "shrink.x3.0/grow.0");
        assert_eq!(Ticket::decode(ticket.encode().as_bytes()), Some(ticket.clone()));
        assert_eq!(join_path("", "grow.1"), "grow.1");
        assert_eq!(Ticket::decode(b"survivors:0,1"), None);
        let short = Ticket { world: vec![0, 1], ..ticket };
        assert_eq!(Ticket::decode(short.encode().as_bytes()), None, "world ranks for every rank");
    }

    #[test]
    fn a_rank_maps_to_its_place_among_the_survivors() {
        let survivors = Survivors { round: 0, ranks: vec![0, 2, 3], excluded: vec![1] };
        assert_eq!(survivors.new_rank(2), Some(1));
        assert_eq!(survivors.new_rank(1), None);
    }
}
