//! Growing a simulated communicator (NCCL's `ncclCommGrow`, 2.29): every rank of a communicator calls
//! `Communicator::grow`, rank 0 with the id it got from `Communicator::grow_unique_id`, while each new rank joins
//! with `Device::join_grown` and that id. Once all have called, the grown communicator is a communicator of its own
//! that holds the old ranks under their numbers and the new ones after them, and moves data like any other; the
//! old one stays usable. A grow is matched across the old ranks by its number among the communicator's grows, and
//! the new ranks find it by the id.

use std::sync::Arc;

use pg_core::{CommConfig, Error, Result, UniqueId};

use crate::clock::{ns, Cond, GrowKey, Time, Wake};
use crate::communicator::MockCommunicator;
use crate::device::MockDevice;
use crate::state::{RankComm, State};

/// Who takes part in a grow: a rank of the communicator that grows, or a new rank on its device.
#[derive(Debug, Clone, Copy)]
enum Caller {
    Old(usize),
    New { rank: usize, device: usize },
}

impl State {
    /// Which ranks a grow still waits for, for reports.
    pub(crate) fn grow_status(&self, key: &GrowKey) -> String {
        let (group, n) = *key;
        let g = &self.comms.groups[group];
        let round = self.comms.grows.get(key);
        let size = round.and_then(|r| r.size).unwrap_or(g.size);
        let old: Vec<String> = (0..g.size)
            .filter(|rank| round.is_none_or(|r| !r.asked.contains(rank)))
            .map(|rank| rank.to_string())
            .collect();
        let new: Vec<String> = (g.size..size)
            .filter(|rank| round.is_none_or(|r| !r.joined.contains_key(rank)))
            .map(|rank| rank.to_string())
            .collect();
        format!(
            "grow {n} of communicator {} to {size} ranks waits for rank(s) [{}] to call it and new rank(s) [{}] to join",
            g.number,
            old.join(", "),
            new.join(", ")
        )
    }

    /// Records `caller`'s part of grow `key` to `size` ranks, at `time`; the last to call makes the grown
    /// communicator, at the latest caller's time.
    fn grow_part(&mut self, key: GrowKey, caller: Caller, size: usize, time: Time) -> Result<()> {
        let (group, n) = key;
        let old = self.comms.groups[group].size;
        let round = self.comms.grows.entry(key).or_default();
        match round.size {
            Some(asked) if asked != size => {
                return Err(Error::invalid(format!(
                    "grow {n} of a communicator of {old} ranks: this rank grows it to {size} ranks, but an earlier \
                     caller to {asked}"
                )))
            }
            _ => round.size = Some(size),
        }
        match caller {
            Caller::Old(rank) => {
                round.asked.insert(rank);
            }
            Caller::New { rank, device } => {
                if round.joined.insert(rank, device).is_some() {
                    return Err(Error::invalid(format!("join_grown: new rank {rank} already joined this grow")));
                }
            }
        }
        round.latest = round.latest.max(time);
        if round.asked.len() < old || round.joined.len() < size - old {
            return Ok(());
        }
        let (time, joined) = (round.latest, round.joined.clone());
        let id = self.comms.new_unique_id();
        let description = format!("{} grow {n} to {size}", self.comms.groups[group].description);
        let mut child = None;
        for rank in 0..size {
            let device = match rank < old {
                true => self.comms.groups[group].ranks[rank].device.unwrap_or(usize::MAX),
                false => joined[&rank],
            };
            child = Some(self.join_comm(&id, size, rank, device, time, &description)?.0);
        }
        let round = self.comms.grows.get_mut(&key).expect("inserted above");
        round.child = child;
        round.done = Some(time + ns(self.config.comm_init));
        self.comms.grow_ids.retain(|_, grow| *grow != key);
        Ok(())
    }
}

/// Refuses a grow of a communicator rank that was aborted, finalized or revoked.
fn refuse_dead(rc: &RankComm, what: &str) -> Result<()> {
    if let Some(reason) = &rc.aborted {
        return Err(Error::Aborted { reason: format!("{what} of an aborted communicator: {reason}") });
    }
    if rc.finalized {
        return Err(Error::Aborted { reason: format!("{what} of a finalized communicator") });
    }
    if let Some(reason) = &rc.revoked {
        return Err(Error::Revoked {
            reason: format!("{what} of a revoked communicator ({reason}): shrink it, then grow the shrunk one"),
        });
    }
    Ok(())
}

/// The grown size of a communicator of `size` ranks grown by `added`, if it is one.
fn grown_size(size: usize, added: usize) -> Result<usize> {
    if added == 0 {
        return Err(Error::invalid("grow: added is 0; a grow adds at least one rank"));
    }
    size.checked_add(added).filter(|&n| i32::try_from(n).is_ok()).ok_or_else(|| {
        Error::invalid(format!("grow: {size} + {added} ranks is more than a communicator can have (NCCL's int)"))
    })
}

impl MockCommunicator {
    /// `Ok` where the world grows communicators ([`crate::WorldConfig::native_grow`]), else the refusal of `call`.
    pub(crate) fn native_grow(&self, call: &str) -> Result<()> {
        self.inner.require_capability(pg_core::Capability::Grow, call)
    }

    /// [`pg_core::Communicator::grow_unique_id`]: a fresh id, registered for this communicator's next grow.
    pub(crate) fn grow_id(&self) -> Result<UniqueId> {
        let mut state = self.inner.lock();
        state.apply_scheduled_abort(self.group, self.rank);
        let rc = &state.comms.groups[self.group].ranks[self.rank];
        refuse_dead(rc, "grow_unique_id")?;
        let key = (self.group, rc.grows);
        if state.comms.grow_ids.values().any(|grow| *grow == key) {
            return Err(Error::invalid(
                "grow_unique_id: the id of this communicator's next grow was made already and is not used yet; one \
                 id serves one grow",
            ));
        }
        let id = state.comms.new_unique_id();
        state.comms.grow_ids.insert(id.clone(), key);
        Ok(UniqueId(id))
    }

    /// [`pg_core::Communicator::grow`].
    pub(crate) fn grow_to(&self, added: usize, id: Option<&UniqueId>, config: &CommConfig) -> Result<Self> {
        let tid = self.inner.require("grow");
        let size = grown_size(self.size, added)?;
        match (self.rank, id) {
            (0, None) => {
                return Err(Error::invalid("grow: rank 0 passes the id it got from grow_unique_id (it had none)"))
            }
            (rank, Some(_)) if rank != 0 => {
                return Err(Error::invalid(format!("grow: only rank 0 passes the grow's id, not rank {rank}")))
            }
            _ => {}
        }
        let mut state = self.inner.lock();
        state.apply_scheduled_abort(self.group, self.rank);
        let time = state.local(Some(tid));
        let rc = &state.comms.groups[self.group].ranks[self.rank];
        refuse_dead(rc, "grow")?;
        let key = (self.group, rc.grows);
        if state.comms.groups[self.group].slots.values().any(|slot| slot.parts.contains_key(&self.rank)) {
            return Err(Error::invalid("grow: the communicator has ops in flight; a communicator grows with none"));
        }
        if let Some(id) = id {
            if state.comms.grow_ids.get(&id.0) != Some(&key) {
                return Err(Error::invalid(
                    "grow: the id is not one grow_unique_id made for this communicator's next grow",
                ));
            }
        }
        state.grow_part(key, Caller::Old(self.rank), size, time)?;
        state.comms.groups[self.group].ranks[self.rank].grows += 1;
        let what = format!("growing communicator {} to {size} ranks (grow {})", state.comm_number(self.group), key.1);
        let deadline = config.timeout.map(|timeout| time.saturating_add(ns(timeout)));
        let (mut state, woke) = self.inner.park(state, tid, Cond::GrowDone(key), deadline, None, what);
        if woke == Wake::Deadline {
            // Not every rank came in time: this rank leaves the grow as NCCL does, by aborting the parent.
            let waiting = state.grow_status(&key);
            let time = state.local(Some(tid));
            state.abort_rank(self.group, self.rank, "a grow of this communicator timed out", time);
            self.inner.raise(state);
            return Err(Error::InitTimeout {
                cache_key: config.description.clone(),
                timeout: config.timeout.unwrap_or_default(),
                what: format!("{waiting}; the parent communicator was aborted"),
            });
        }
        let child = state.comms.grows.get(&key).and_then(|round| round.child);
        self.inner.raise(state);
        let group = child.ok_or_else(|| Error::Backend("grow: the grow ended without a communicator".to_owned()))?;
        Ok(Self { inner: Arc::clone(&self.inner), group, rank: self.rank, size, device: self.device })
    }
}

impl MockDevice {
    /// [`pg_core::Device::join_grown`].
    pub(crate) fn join_grow(
        &self,
        id: &UniqueId,
        size: usize,
        rank: usize,
        config: &CommConfig,
    ) -> Result<MockCommunicator> {
        let tid = self.inner.require("Device::join_grown");
        let mut state = self.inner.lock();
        let key = *state.comms.grow_ids.get(&id.0).ok_or_else(|| {
            Error::invalid("join_grown: the id is not one that grow_unique_id made for a grow still to come")
        })?;
        let old = state.comms.groups[key.0].size;
        if rank < old || rank >= size {
            return Err(Error::invalid(format!(
                "join_grown: new rank {rank} is outside {old}..{size}, the ranks a grow of a communicator of {old} to \
                 {size} adds"
            )));
        }
        let time = state.local(Some(tid));
        state.grow_part(key, Caller::New { rank, device: self.index }, size, time)?;
        let what = format!("joining communicator {} grown to {size} ranks as rank {rank}", state.comm_number(key.0));
        let deadline = config.timeout.map(|timeout| time.saturating_add(ns(timeout)));
        let (state, woke) = self.inner.park(state, tid, Cond::GrowDone(key), deadline, None, what);
        if woke == Wake::Deadline {
            let waiting = state.grow_status(&key);
            self.inner.raise(state);
            return Err(Error::InitTimeout {
                cache_key: config.description.clone(),
                timeout: config.timeout.unwrap_or_default(),
                what: waiting,
            });
        }
        let child = state.comms.grows.get(&key).and_then(|round| round.child);
        self.inner.raise(state);
        let group =
            child.ok_or_else(|| Error::Backend("join_grown: the grow ended without a communicator".to_owned()))?;
        Ok(MockCommunicator { inner: Arc::clone(&self.inner), group, rank, size, device: self.index })
    }
}
